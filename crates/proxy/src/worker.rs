//! The serving threads: each runs a worker on a runtime of its own, which serves the
//! connections dealt to it (HTTP/1.1 and h2c) and drains them on shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};

use crate::answer;
use crate::downstream::Downstream;
use crate::error::ProxyError;
use crate::forward::{Upstream, UpstreamLink};
use crate::forwarded::Peer;
use crate::handle::{Requests, handle};
use crate::limits::Open;
use crate::options::{DRAIN_GRACE, MIN_MAX_HEAD, ProxyOptions};
use crate::pause::{Answers, Pause};
use crate::shared::Shared;

/// A connection accepted, on its way to a worker, counted open until it ends.
pub(crate) struct Accepted {
    pub(crate) stream: std::net::TcpStream,
    pub(crate) peer: SocketAddr,
    pub(crate) open: Open,
}

/// What one worker's connections share: the engine and counters of the whole proxy, and the
/// worker's own HTTP/2 upstream pool, so its requests never wait on another thread's (HTTP/1.1
/// requests go over their downstream connection's own upstream connection, [`UpstreamLink`]).
pub(crate) struct Worker {
    requests: Arc<Requests>,
    header_timeout: Duration,
    idle_timeout: Duration,
    /// [`ProxyOptions::max_head`], at least hyper's minimum buffer.
    max_head: usize,
    /// The whole answer to a head over `max_head` ([`answer::head_too_large`]), made once.
    too_large: Arc<[u8]>,
}

impl Worker {
    pub(crate) fn new(
        shared: Arc<Shared>,
        options: &ProxyOptions,
    ) -> Result<Arc<Self>, ProxyError> {
        Ok(Arc::new(Self {
            requests: Arc::new(Requests {
                shared,
                upstream: Upstream::new(
                    &options.upstream,
                    options.upstream_timeout,
                    options.body_timeout,
                )?,
                forwarded: options.forwarded,
                cut: watch::Sender::new(false),
            }),
            header_timeout: options.header_timeout,
            idle_timeout: options.idle_timeout,
            max_head: options.max_head.max(MIN_MAX_HEAD),
            too_large: answer::head_too_large(options.max_head.max(MIN_MAX_HEAD)).into(),
        }))
    }

    /// Serves the connections dealt to this worker until the acceptor stops, then lets the
    /// requests in flight finish, up to the drain timeout.
    pub(crate) async fn serve(
        self: Arc<Self>,
        mut connections: mpsc::UnboundedReceiver<Accepted>,
        drain_timeout: Duration,
    ) {
        let graceful = GracefulShutdown::new();
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // The connection's socket keeps the header and idle timeouts ([`Pause`]).
        builder.http1().header_read_timeout(None);
        // The request head cap: hyper answers a longer HTTP/1.1 head (its read buffer full before
        // the head ends, or more than 100 fields) with a bodiless 431 that the socket replaces
        // with a problem document ([`Downstream`]); h2 answers a longer header list with a 431
        // of its own (HEADERS only: an HTTP/2 library answer cannot carry a body). hyper's
        // defaults were about 400 KiB and 16 KiB.
        builder.http1().max_buf_size(self.max_head);
        // A client that sends its request and then shuts its side (`shutdown(SHUT_WR)`, as
        // `nc -N` and some load balancers do) still gets its answer.
        builder.http1().half_close(true);
        builder
            .http2()
            .max_header_list_size(u32::try_from(self.max_head).unwrap_or(u32::MAX));
        while let Some(Accepted { stream, peer, open }) = connections.recv().await {
            let stream = match TcpStream::from_std(stream) {
                Ok(stream) => stream,
                Err(err) => {
                    tracing::warn!("cannot serve an accepted connection: {err}");
                    continue;
                }
            };
            // Formatted once per connection, so identity by `peer` and the forwarding fields of a
            // request that came with none cost nothing per request.
            let peer = Arc::new(Peer::new(peer.ip()));
            let requests = self.requests.clone();
            let link = Arc::new(UpstreamLink::default());
            let answers = Arc::new(Answers::default());
            let downstream = Downstream {
                io: TokioIo::new(stream),
                answers: answers.clone(),
                pause: Pause::new(self.header_timeout, self.idle_timeout),
                too_large: self.too_large.clone(),
                refusing: None,
            };
            let service = service_fn(move |request| {
                let answering = answers.begin();
                handle(
                    requests.clone(),
                    peer.clone(),
                    link.clone(),
                    answering,
                    request,
                )
            });
            let connection = builder.serve_connection_with_upgrades(downstream, service);
            let connection = graceful.watch(connection.into_owned());
            tokio::spawn(async move {
                if let Err(err) = connection.await {
                    tracing::debug!("connection ended with an error: {err}");
                }
                drop(open);
            });
        }
        let drained = graceful.shutdown();
        tokio::pin!(drained);
        tokio::select! {
            _ = &mut drained => {
                tracing::info!("all requests in flight finished");
                return;
            }
            _ = tokio::time::sleep(drain_timeout) => {}
        }
        // The deadline: answer what still waits on the upstream, give the answers a moment to
        // leave, then close what is left.
        let before = self.requests.shared.drain_cut.load(Ordering::Relaxed);
        self.requests.cut.send_replace(true);
        let finished = tokio::time::timeout(DRAIN_GRACE, &mut drained)
            .await
            .is_ok();
        let cut = self.requests.shared.drain_cut.load(Ordering::Relaxed) - before;
        tracing::warn!(
            answered_503 = cut,
            drain_timeout = ?drain_timeout,
            "drain timeout passed: requests still waiting on the upstream were answered 503{}",
            if finished {
                ""
            } else {
                "; closing the connections still open (responses still streaming, long-lived streams)"
            }
        );
    }
}

/// The serving threads: each runs its worker on a single-threaded runtime, reports when its
/// drain is over, and keeps its runtime turning until every worker is done, since a task of one
/// runtime (the Redis connection's, made by whichever worker first needed it) may serve another.
#[derive(Default)]
pub(crate) struct Workers {
    drained: Vec<oneshot::Receiver<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    release: Option<watch::Sender<()>>,
}

impl Workers {
    pub(crate) fn spawn(
        &mut self,
        index: usize,
        worker: Arc<Worker>,
        connections: mpsc::UnboundedReceiver<Accepted>,
        drain_timeout: Duration,
    ) -> Result<(), ProxyError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(ProxyError::Workers)?;
        let (drained, drained_rx) = oneshot::channel();
        let mut released = self
            .release
            .get_or_insert_with(|| watch::channel(()).0)
            .subscribe();
        let thread = std::thread::Builder::new()
            .name(format!("spillway-worker-{index}"))
            .spawn(move || {
                runtime.block_on(async move {
                    worker.serve(connections, drain_timeout).await;
                    let _ = drained.send(());
                    let _ = released.changed().await;
                });
            })
            .map_err(ProxyError::Workers)?;
        self.drained.push(drained_rx);
        self.threads.push(thread);
        Ok(())
    }

    /// Waits for every worker to drain, then lets the threads end and joins them.
    pub(crate) async fn join(self) {
        for drained in self.drained {
            let _ = drained.await;
        }
        if let Some(release) = self.release {
            let _ = release.send(());
        }
        let threads = self.threads;
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
    }
}
