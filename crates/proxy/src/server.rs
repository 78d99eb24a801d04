//! The listeners: accept connections (HTTP/1.1 and h2c on one port), decide each request, answer
//! or forward it, and drain the connections in flight on shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Either, Full};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use spillway_client::control::{ControlOptions, ControlPlane, LinkStatus};
use spillway_client::{Client, DEFAULT_POLL, Step, watch_file};
use spillway_core::concurrency::{Gate, UPDATE_EVERY};
use spillway_core::decision::Decision;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::answer::{self, Refusal, Refusals};
use crate::error::ProxyError;
use crate::forward::{ForwardError, Forwarded, Relay, Upstream, UpstreamLink};
use crate::limits::{Connections, Open, RefusalLog};
use crate::pause::{Answering, Answers, Pause};
use crate::request_id::{self, REQUEST_ID, RequestIds};
use crate::upgrade::{Ask, upgrade_asked};

/// The body of every response: the upstream's, streamed, or one of ours (`Either` rather than a
/// boxed body, so forwarding allocates no box per response), with its request counted as being
/// answered until it has been sent whole ([`Answers`]).
pub(crate) struct Body {
    inner: Either<Relay, Full<Bytes>>,
    _answering: Answering,
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = <Either<Relay, Full<Bytes>> as hyper::body::Body>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What `spillway proxy` is started with.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    /// The YAML rules, watched and reloaded when they change.
    pub config: PathBuf,
    pub listen: SocketAddr,
    /// `http://HOST:PORT`.
    pub upstream: String,
    /// Where `/healthz`, `/readyz` and `/metrics` are served.
    pub admin: Option<SocketAddr>,
    /// How the admin listener is protected (TLS, token); the default leaves it open.
    pub admin_auth: spillway_net::admin::AdminAuth,
    /// How often the file is checked for changes.
    pub reload_every: Duration,
    /// How long shutdown waits for requests in flight (`--drain-timeout`, default 30 s). At the
    /// deadline a request still waiting on the upstream is answered `503` with
    /// `connection: close` (gRPC: `UNAVAILABLE`), logged and counted
    /// (`spillway_drain_cut_total`); a response still streaming, or a long-lived stream, gets
    /// [`DRAIN_GRACE`] more to finish before its connection is closed.
    pub drain_timeout: Duration,
    /// The control plane to report to and take instructions and rules from; with it the file is
    /// only the rules to start with when the state directory has none.
    pub control: Option<ControlOptions>,
    /// Whether a standalone proxy re-reads its file when it changes. Off when something else
    /// feeds [`Proxy::client`] its rules (the rules service's store, for `--database`), so the
    /// file cannot overwrite them.
    pub watch_file: bool,
    /// How many threads serve the connections, each running a single-threaded runtime of its own
    /// with its own upstream connections, as nginx runs one worker process per core: a
    /// connection, its requests and their upstream exchanges stay on one thread, with no work
    /// stealing, no cross-thread wakeup and no shared pool between them. Accepted connections
    /// are dealt to the threads in turn. 0 (the default) serves on the runtime [`Proxy::start`]
    /// is called on, which suits a proxy embedded in a larger program (tests, the demo).
    pub workers: usize,
    /// How long the upstream may hold a request it has received whole (its body sent) before
    /// the proxy gives up on it and answers 504 (gRPC: `UNAVAILABLE`). `None` waits as long as
    /// the client does. Default 60 s, nginx's `proxy_read_timeout`.
    pub upstream_timeout: Option<Duration>,
    /// How long a new HTTP/1.1 connection may take to send its first request's head, and any
    /// request's head may take once it has begun, before the connection is closed: a client that
    /// opens connections and trickles bytes into them cannot hold them forever. Default 30 s.
    pub header_timeout: Duration,
    /// How long a kept-alive HTTP/1.1 connection may stay idle after an answer before it is
    /// closed, and an HTTP/2 connection may go with no open stream (from its preface, or its
    /// last stream's end). Default 75 s, nginx's `keepalive_timeout`.
    pub idle_timeout: Duration,
    /// How long a request body may make no progress (no byte arrives) before the request is cut:
    /// answered `408` when no answer has begun, its upstream exchange abandoned. `None` waits as
    /// long as the client does. Default 60 s, nginx's `client_body_timeout`.
    pub body_timeout: Option<Duration>,
    /// How many downstream connections may be open at once; beyond it a new connection is
    /// accepted and closed at once, logged (at most once per 10 s) and counted
    /// (`spillway_connections_refused_total`). `None` (the default) derives it from the file
    /// descriptor limit in force at start ([`crate::default_max_connections`]).
    pub max_connections: Option<usize>,
    /// The largest request head: the request line and header fields of HTTP/1.1, the header
    /// list of HTTP/2 (RFC 9113's size: names, values and 32 bytes per field). Beyond it the
    /// request is answered `431`. Default 64 KiB; at least 8 KiB.
    pub max_head: usize,
    /// Which forwarding fields the upstream gets with this hop appended (`--forwarded`).
    pub forwarded: ForwardedFields,
}

/// The fields that tell the upstream who its client was (`--forwarded`): each has this hop's
/// peer appended to what was received, and says the client spoke `http` to the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardedFields {
    /// `x-forwarded-for` and `x-forwarded-proto` (the default: what most upstreams read).
    #[default]
    XForwarded,
    /// RFC 7239's `forwarded: for=...;proto=http`.
    Rfc7239,
    /// Both.
    Both,
    /// Neither: the received fields go on unchanged.
    Off,
}

impl ProxyOptions {
    pub fn new(config: PathBuf, listen: SocketAddr, upstream: String) -> Self {
        Self {
            config,
            listen,
            upstream,
            admin: None,
            admin_auth: Default::default(),
            reload_every: DEFAULT_POLL,
            drain_timeout: Duration::from_secs(30),
            control: None,
            watch_file: true,
            workers: 0,
            upstream_timeout: Some(Duration::from_secs(60)),
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(75),
            body_timeout: Some(Duration::from_secs(60)),
            max_connections: None,
            max_head: DEFAULT_MAX_HEAD,
            forwarded: ForwardedFields::XForwarded,
        }
    }
}

/// The default [`ProxyOptions::max_head`]: 64 KiB.
pub const DEFAULT_MAX_HEAD: usize = 64 * 1024;

/// The smallest request head cap: hyper's smallest read buffer.
const MIN_MAX_HEAD: usize = 8 * 1024;

/// How long connections may still take, after the drain deadline, to deliver the answers given
/// at the deadline before they are closed.
pub const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// What every connection of every worker shares.
pub(crate) struct Shared {
    pub(crate) client: Arc<Client>,
    pub(crate) upstream_errors: AtomicU64,
    /// Requests answered by the proxy for a fault of the client's
    /// (`spillway_requests_refused_total{reason}`).
    pub(crate) refusals: Refusals,
    /// Upgrades (WebSockets) tunnelled to the upstream (`spillway_upgrades_total`).
    pub(crate) upgrades: AtomicU64,
    /// The same by the buckets their handshakes matched, by service and bucket name
    /// (`spillway_bucket_upgrades_total`). Locked once per tunnel opened, never per request.
    pub(crate) bucket_upgrades: std::sync::Mutex<std::collections::BTreeMap<(String, String), u64>>,
    /// Upgrades removed from requests forwarded as plain ones: a protocol `proxy.upgrades` does
    /// not allow, or a WebSocket handshake without its key
    /// (`spillway_upgrades_refused_total{reason="protocol"}`).
    pub(crate) upgrades_removed: AtomicU64,
    /// Upstream `101`s that were not the handshake asked for, answered 502
    /// (`spillway_upgrades_refused_total{reason="handshake"}`).
    pub(crate) upgrades_bad_switch: AtomicU64,
    /// Requests answered 503 because the drain deadline passed while they waited on the
    /// upstream (`spillway_drain_cut_total`).
    pub(crate) drain_cut: AtomicU64,
    /// Where new request ids come from.
    pub(crate) request_ids: RequestIds,
    /// The control-plane link's state, when linked.
    pub(crate) link: Option<Arc<LinkStatus>>,
    /// The open downstream connections and their cap (`spillway_connections`,
    /// `spillway_connections_refused_total`).
    pub(crate) connections: Arc<Connections>,
    /// The in-flight limit on the upstream; off without a `concurrency` section.
    pub(crate) concurrency: Arc<Gate>,
}

/// A running proxy.
pub struct Proxy {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// The serving threads, when [`ProxyOptions::workers`] asked for them.
    workers: Workers,
    /// The file watcher, standalone only.
    watcher: Option<JoinHandle<()>>,
    control: Option<ControlPlane>,
}

impl Proxy {
    /// Loads the rules, binds the listeners and starts serving: on the current tokio runtime, or
    /// on [`ProxyOptions::workers`] threads of their own.
    pub async fn start(options: ProxyOptions) -> Result<Self, ProxyError> {
        // Checked once here, so a worker's own `Upstream::new` cannot fail.
        Upstream::new(&options.upstream, options.upstream_timeout, None)?;
        let (client, control) = crate::control::start(&options)?;
        let bind = |addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|source| ProxyError::Bind { addr, source })
        };
        let listener = bind(options.listen).await?;
        let admin = match options.admin {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let addr = listener.local_addr().map_err(|source| ProxyError::Bind {
            addr: options.listen,
            source,
        })?;
        let admin_addr = admin.as_ref().and_then(|l| l.local_addr().ok());
        let shared = Arc::new(Shared {
            client: client.clone(),
            upstream_errors: AtomicU64::new(0),
            refusals: Refusals::default(),
            upgrades: AtomicU64::new(0),
            bucket_upgrades: Default::default(),
            upgrades_removed: AtomicU64::new(0),
            upgrades_bad_switch: AtomicU64::new(0),
            connections: Connections::new(options.max_connections.unwrap_or_else(|| {
                crate::limits::default_max_connections(crate::limits::fd_soft_limit())
            })),
            drain_cut: AtomicU64::new(0),
            request_ids: RequestIds::default(),
            link: control.as_ref().map(ControlPlane::status),
            concurrency: Gate::new(client.rules().config().concurrency, Duration::ZERO),
        });
        let (stop, stopped) = watch::channel(false);
        let mut tasks = Vec::new();
        let mut workers = Workers::default();
        let mut inboxes = Vec::new();
        if options.workers == 0 {
            let (inbox, connections) = mpsc::unbounded_channel();
            inboxes.push(inbox);
            let worker = Worker::new(shared.clone(), &options)?;
            tasks.push(tokio::spawn(
                worker.serve(connections, options.drain_timeout),
            ));
        } else {
            for index in 0..options.workers {
                let (inbox, connections) = mpsc::unbounded_channel();
                inboxes.push(inbox);
                let worker = Worker::new(shared.clone(), &options)?;
                workers.spawn(index, worker, connections, options.drain_timeout)?;
            }
        }
        tasks.push(tokio::spawn(follow_concurrency(
            shared.clone(),
            stopped.clone(),
        )));
        tasks.push(tokio::spawn(accept(
            listener,
            inboxes,
            shared.connections.clone(),
            stopped.clone(),
        )));
        if let Some(admin) = admin {
            tasks.push(tokio::spawn(spillway_net::admin::serve(
                admin,
                Arc::new(crate::admin::ProxyView(shared.clone())),
                stopped,
                options.admin_auth.clone(),
            )));
        }
        let watcher = (control.is_none() && options.watch_file)
            .then(|| watch_file(client, options.config.clone(), options.reload_every));
        tracing::info!(%addr, admin = ?admin_addr, upstream = %options.upstream, workers = options.workers, max_connections = shared.connections.max(), "proxy listening");
        Ok(Self {
            addr,
            admin_addr,
            shared,
            stop,
            tasks,
            workers,
            watcher,
            control,
        })
    }

    /// The address requests are accepted on (the real port when started on port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The engine, for instructions and readings.
    pub fn client(&self) -> &Arc<Client> {
        &self.shared.client
    }

    /// The control-plane link's state (connected, rules version), when linked.
    pub fn link_status(&self) -> Option<Arc<LinkStatus>> {
        self.shared.link.clone()
    }

    /// Stops accepting, lets the requests in flight finish (up to the drain timeout), sends the
    /// last report when linked, and returns.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        if let Some(watcher) = self.watcher {
            watcher.abort();
        }
        for task in self.tasks {
            let _ = task.await;
        }
        self.workers.join().await;
        if let Some(control) = self.control {
            control.shutdown().await;
        }
    }
}

/// Every [`UPDATE_EVERY`], off the hot path: applies the `concurrency` section of the rules in
/// force (a reload may have changed it) and lets the algorithm close its window.
async fn follow_concurrency(shared: Arc<Shared>, mut stopped: watch::Receiver<bool>) {
    let start = std::time::Instant::now();
    let mut tick = tokio::time::interval(UPDATE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped.wait_for(|stop| *stop) => return,
        }
        let now = start.elapsed();
        let settings = shared.client.rules().config().concurrency;
        shared.concurrency.configure(settings, now);
        shared.concurrency.update(now);
    }
}

/// Accepts connections until told to stop, dealing them to the workers in turn. Stopping drops
/// the listener, so new connections are refused, and the workers' inboxes, so each worker drains.
///
/// A connection beyond the cap is accepted and closed at once rather than left in the listen
/// backlog: its client learns at once (a load balancer retries elsewhere) instead of waiting for
/// a connection that may never be served, and the backlog stays free for when connections close.
async fn accept(
    listener: TcpListener,
    inboxes: Vec<mpsc::UnboundedSender<Accepted>>,
    connections: Arc<Connections>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut next = 0;
    let mut refusals = RefusalLog::default();
    while let Some((stream, peer)) = spillway_net::accept_or_stop(&listener, &mut stopped).await {
        let Some(open) = connections.admit() else {
            drop(stream);
            refusals.refused(&connections);
            continue;
        };
        let _ = stream.set_nodelay(true);
        // Off this runtime's reactor, onto the worker's.
        let Ok(stream) = stream.into_std() else {
            continue;
        };
        if inboxes[next].send(Accepted { stream, peer, open }).is_err() {
            tracing::warn!("a worker has stopped; connection refused");
        }
        next = (next + 1) % inboxes.len();
    }
}

/// A connection accepted, on its way to a worker, counted open until it ends.
struct Accepted {
    stream: std::net::TcpStream,
    peer: SocketAddr,
    open: Open,
}

/// What one worker's connections share: the engine and counters of the whole proxy, and the
/// worker's own HTTP/2 upstream pool, so its requests never wait on another thread's (HTTP/1.1
/// requests go over their downstream connection's own upstream connection, [`UpstreamLink`]).
struct Worker {
    shared: Arc<Shared>,
    upstream: Upstream,
    header_timeout: Duration,
    idle_timeout: Duration,
    /// [`ProxyOptions::max_head`], at least hyper's minimum buffer.
    max_head: usize,
    forwarded: ForwardedFields,
    /// The whole answer to a head over `max_head` ([`answer::head_too_large`]), made once.
    too_large: Arc<[u8]>,
    /// Turns true at the drain deadline: requests still waiting on the upstream are answered.
    cut: watch::Sender<bool>,
}

impl Worker {
    fn new(shared: Arc<Shared>, options: &ProxyOptions) -> Result<Arc<Self>, ProxyError> {
        Ok(Arc::new(Self {
            shared,
            upstream: Upstream::new(
                &options.upstream,
                options.upstream_timeout,
                options.body_timeout,
            )?,
            header_timeout: options.header_timeout,
            idle_timeout: options.idle_timeout,
            max_head: options.max_head.max(MIN_MAX_HEAD),
            forwarded: options.forwarded,
            too_large: answer::head_too_large(options.max_head.max(MIN_MAX_HEAD)).into(),
            cut: watch::Sender::new(false),
        }))
    }

    /// Serves the connections dealt to this worker until the acceptor stops, then lets the
    /// requests in flight finish, up to the drain timeout.
    async fn serve(
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
            let worker = self.clone();
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
                    worker.clone(),
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
        let before = self.shared.drain_cut.load(Ordering::Relaxed);
        self.cut.send_replace(true);
        let finished = tokio::time::timeout(DRAIN_GRACE, &mut drained)
            .await
            .is_ok();
        let cut = self.shared.drain_cut.load(Ordering::Relaxed) - before;
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

/// A downstream connection's socket, which keeps the connection's header and idle timeouts
/// whenever the server has to wait to read from it ([`Pause`]), and writes the proxy's `431`
/// problem document in place of hyper's own bodiless one.
struct Downstream {
    io: TokioIo<TcpStream>,
    answers: Arc<Answers>,
    pause: Pause,
    /// The answer to a head over the cap ([`answer::head_too_large`]).
    too_large: Arc<[u8]>,
    /// How much of `too_large` has been written, once hyper began its own 431.
    refusing: Option<usize>,
}

impl Downstream {
    /// Writes the proxy's `431` in place of hyper's: when hyper begins its own answer to a head
    /// it refused for its size (`first` is the start of what it writes), or has begun it, the
    /// problem document is written instead and hyper's `total` bytes taken as written. `None`:
    /// an ordinary write.
    fn refuse(
        &mut self,
        cx: &mut Context<'_>,
        first: &[u8],
        total: usize,
    ) -> Option<Poll<std::io::Result<usize>>> {
        if self.refusing.is_none() {
            if !self.pause.wrote(&self.answers, first) {
                return None;
            }
            self.refusing = Some(0);
        }
        let sent = self.refusing.as_mut()?;
        while *sent < self.too_large.len() {
            match hyper::rt::Write::poll_write(Pin::new(&mut self.io), cx, &self.too_large[*sent..])
            {
                Poll::Ready(Ok(0)) => {
                    return Some(Poll::Ready(Err(std::io::ErrorKind::WriteZero.into())));
                }
                Poll::Ready(Ok(n)) => *sent += n,
                Poll::Ready(Err(err)) => return Some(Poll::Ready(Err(err))),
                Poll::Pending => return Some(Poll::Pending),
            }
        }
        Some(Poll::Ready(Ok(total)))
    }
}

impl hyper::rt::Read for Downstream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Pending => {
                // Waiting for the next request (or the rest of this one): the wait may have run
                // too long.
                match this.pause.waiting(&this.answers, cx) {
                    Some(timed_out) => Poll::Ready(Err(timed_out)),
                    None => Poll::Pending,
                }
            }
            Poll::Ready(Ok(())) => {
                this.pause.arrived(&this.answers);
                Poll::Ready(Ok(()))
            }
            failed => failed,
        }
    }
}

impl hyper::rt::Write for Downstream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if let Some(refused) = this.refuse(cx, buf, buf.len()) {
            return refused;
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &b[..]);
        let total = bufs.iter().map(|b| b.len()).sum();
        if let Some(refused) = this.refuse(cx, first, total) {
            return refused;
        }
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let flushed = Pin::new(&mut this.io).poll_flush(cx);
        this.pause.flushed(&this.answers, cx);
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The serving threads: each runs its worker on a single-threaded runtime, reports when its
/// drain is over, and keeps its runtime turning until every worker is done, since a task of one
/// runtime (the Redis connection's, made by whichever worker first needed it) may serve another.
#[derive(Default)]
struct Workers {
    drained: Vec<oneshot::Receiver<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    release: Option<watch::Sender<()>>,
}

impl Workers {
    fn spawn(
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
    async fn join(self) {
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

/// What is wrong with a request's `Host`, if anything: two of them (which would the upstream
/// route by?), or none on HTTP/1.1, which requires it (RFC 9112 §3.2).
fn host_fault(request: &Request<Incoming>) -> Option<&'static str> {
    let mut hosts = request.headers().get_all(http::header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (_, Some(_)) => Some("the request has more than one Host header"),
        (None, None) if request.version() == http::Version::HTTP_11 => {
            Some("an HTTP/1.1 request needs a Host header")
        }
        _ => None,
    }
}

/// The transfer coding of an HTTP/1.1 request's body when it is not `chunked` alone: the proxy
/// forwards bodies by their framing, and a coding under the chunks (`gzip, chunked`) would reach
/// the upstream unannounced. hyper has already refused a coding list that does not end in
/// `chunked` (RFC 9112 §6.3), so what is left here is a list with more than `chunked` in it.
fn coding_fault(request: &Request<Incoming>) -> Option<String> {
    let mut codings = request
        .headers()
        .get_all(http::header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|coding| !coding.is_empty());
    let first = codings.next()?;
    if first.eq_ignore_ascii_case(b"chunked") && codings.next().is_none() {
        return None;
    }
    let all: Vec<String> = request
        .headers()
        .get_all(http::header::TRANSFER_ENCODING)
        .iter()
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
        .collect();
    Some(all.join(", "))
}

/// A downstream connection's peer, formatted once per connection.
struct Peer {
    ip: Box<str>,
    /// The `x-forwarded-for` of a request that came with none: the peer alone.
    xff: http::HeaderValue,
    /// The `forwarded` of a request that came with none.
    rfc7239: http::HeaderValue,
}

impl Peer {
    fn new(ip: std::net::IpAddr) -> Self {
        let text = ip.to_string();
        // RFC 7239 §6: an IPv6 address is bracketed, and then quoted.
        let element = if ip.is_ipv6() {
            format!("for=\"[{text}]\";proto=http")
        } else {
            format!("for={text};proto=http")
        };
        // An address's text is always a valid field value.
        let value = |text: &str| {
            http::HeaderValue::from_str(text).unwrap_or(http::HeaderValue::from_static("unknown"))
        };
        Self {
            xff: value(&text),
            rfc7239: value(&element),
            ip: text.into(),
        }
    }
}

/// The forwarding fields the upstream gets (`--forwarded`): `x-forwarded-for` as received
/// (several lines one list) with this hop's peer appended, as the edge's rules count it, and
/// `x-forwarded-proto: http` (the proxy's listener speaks plaintext) unless a hop before it said
/// otherwise; or RFC 7239's `forwarded` with `for=PEER;proto=http` appended; or both, or neither.
/// A request that came with none of a field gets the connection's own value, made once.
fn forwarded(headers: &mut http::HeaderMap, peer: &Peer, fields: ForwardedFields) {
    const XFF: http::HeaderName = http::HeaderName::from_static("x-forwarded-for");
    const XFP: http::HeaderName = http::HeaderName::from_static("x-forwarded-proto");
    let (x, rfc) = match fields {
        ForwardedFields::XForwarded => (true, false),
        ForwardedFields::Rfc7239 => (false, true),
        ForwardedFields::Both => (true, true),
        ForwardedFields::Off => return,
    };
    if x {
        append(headers, XFF, &peer.xff);
        if !headers.contains_key(&XFP) {
            headers.insert(XFP, http::HeaderValue::from_static("http"));
        }
    }
    if rfc {
        append(headers, http::header::FORWARDED, &peer.rfc7239);
    }
}

/// Sets `name` to the list received in it (every line, in order, empty ones skipped) with
/// `element` appended.
fn append(headers: &mut http::HeaderMap, name: http::HeaderName, element: &http::HeaderValue) {
    let mut received = headers
        .get_all(&name)
        .iter()
        .map(|value| value.as_bytes().trim_ascii())
        .filter(|value| !value.is_empty())
        .peekable();
    if received.peek().is_none() {
        headers.insert(name, element.clone());
        return;
    }
    let mut list = Vec::with_capacity(64);
    for value in received {
        list.extend_from_slice(value);
        list.extend_from_slice(b", ");
    }
    list.extend_from_slice(element.as_bytes());
    if let Ok(value) = http::HeaderValue::from_maybe_shared(Bytes::from(list)) {
        headers.insert(name, value);
    }
}

async fn handle(
    worker: Arc<Worker>,
    peer: Arc<Peer>,
    link: Arc<UpstreamLink>,
    answering: Answering,
    mut request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let shared = &worker.shared;
    let id = shared.request_ids.of(request.headers_mut());
    let counted = |answering, inner| Body {
        inner,
        _answering: answering,
    };
    // The proxy's own answers name the request, so a client can quote it.
    let own = |answering, mut response: Response<Full<Bytes>>| {
        response.headers_mut().insert(REQUEST_ID, id.clone());
        Ok(response.map(|body| counted(answering, Either::Right(body))))
    };
    let grpc = answer::is_grpc(request.headers());
    let refused = |answering, refusal, response| {
        shared.refusals.count(refusal);
        own(answering, response)
    };
    if let Some(detail) = host_fault(&request) {
        return refused(answering, Refusal::BadHost, answer::bad_host(detail));
    }
    // A request with a transfer coding has a body; most have none, and skip the lookup.
    if !hyper::body::Body::is_end_stream(request.body())
        && let Some(coding) = coding_fault(&request)
    {
        return refused(
            answering,
            Refusal::UnsupportedCoding,
            answer::unsupported_coding(&coding),
        );
    }
    let rules = shared.client.rules();
    // One lookup for a request without an `upgrade` field.
    let upgrade = match upgrade_asked(&request, &rules.config().proxy) {
        Ask::None => None,
        Ask::Removed => {
            shared.upgrades_removed.fetch_add(1, Ordering::Relaxed);
            None
        }
        Ask::Allowed(upgrade) => Some(upgrade),
    };
    // The buckets an upgrade's handshake matches, named for counting its tunnel by bucket.
    let mut upgrade_buckets = Vec::new();
    let (step, tier) = {
        // The normalised path lives here, on the stack, only until the decision has begun.
        let mut buffer = spillway_client::PathBuffer::new();
        let attrs = match rules.identity().attrs(
            request.uri().path(),
            request.headers(),
            Some(&peer.ip),
            &mut buffer,
        ) {
            Ok(attrs) => attrs,
            // Decided on one copy of a header and served with both: refused before deciding.
            Err(bad) => {
                return refused(
                    answering,
                    Refusal::BadIdentity,
                    answer::bad_identity(&bad, grpc),
                );
            }
        };
        if upgrade.is_some() {
            rules.matching(&attrs, |bucket| {
                upgrade_buckets.push((bucket.service().to_owned(), bucket.name().to_owned()));
            });
        }
        (
            rules.begin(shared.client.now(), &attrs, request.headers()),
            attrs.criticality,
        )
    };
    // Only requests that match a `store: redis` bucket wait here, for one Redis call each.
    let decision = match step {
        Step::Done(decision) => decision,
        Step::Redis(pending) => rules.finish(pending).await,
    };
    if let Decision::Drop {
        bucket,
        retry_after,
    } = decision
        && let Some(bucket) = rules.bucket(bucket)
    {
        return own(answering, answer::dropped(bucket, retry_after, grpc));
    }
    // What a hop behind the proxy sees is the tier applied, not an untrusted claim.
    rules
        .identity()
        .rewrite_criticality(request.headers_mut(), tier);
    drop(rules);
    let permit = match shared.concurrency.try_acquire(tier) {
        Ok(permit) => permit,
        Err(rejected) => return own(answering, answer::overloaded(&rejected, grpc)),
    };
    forwarded(request.headers_mut(), &peer, worker.forwarded);
    let sent = std::time::Instant::now();
    let mut cut = worker.cut.subscribe();
    let forwarded = tokio::select! {
        biased;
        // A span only when debug lines are on: the forwarding's own lines then name the request.
        forwarded = worker
            .upstream
            .forward(request, &link, grpc, upgrade)
            .instrument(tracing::debug_span!("request", request_id = request_id::text(&id))) => forwarded,
        _ = cut.wait_for(|cut| *cut) => {
            shared.drain_cut.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                request_id = request_id::text(&id),
                "a request still waiting on the upstream at the drain deadline was answered 503"
            );
            return own(answering, answer::draining(grpc));
        }
    };
    // The round trip to the response's head is the algorithm's sample; a refusal of the
    // client's fault or an upgrade says nothing about the upstream's load and only frees its place.
    let response = match forwarded {
        Ok(Forwarded::Answer(response)) => {
            permit.completed(sent.elapsed());
            response.map(Either::Left)
        }
        Ok(Forwarded::Refused(refusal, response)) => {
            drop(permit);
            shared.refusals.count(refusal);
            response.map(Either::Left)
        }
        Ok(Forwarded::Tunnel(response, tunnel)) => {
            drop(permit);
            shared.upgrades.fetch_add(1, Ordering::Relaxed);
            if !upgrade_buckets.is_empty()
                && let Ok(mut counts) = shared.bucket_upgrades.lock()
            {
                for bucket in upgrade_buckets {
                    *counts.entry(bucket).or_default() += 1;
                }
            }
            let open = answering.another();
            let span = tracing::debug_span!("request", request_id = request_id::text(&id));
            tokio::spawn(async move {
                // The drain deadline ends a tunnel like any request still open then.
                tokio::select! {
                    ended = tunnel.run() => match ended {
                        Ok((up, down)) => tracing::debug!("an upgraded connection ended: {up} bytes up, {down} down"),
                        Err(err) => tracing::debug!("an upgraded connection ended: {err}"),
                    },
                    _ = cut.wait_for(|cut| *cut) => {
                        tracing::debug!("an upgraded connection was closed at the drain deadline");
                    }
                }
                drop(open);
            }.instrument(span));
            response.map(Either::Left)
        }
        Err(err @ ForwardError::Handshake(_)) => {
            // Not a sample of the upstream's load: it answered, with the wrong handshake.
            drop(permit);
            shared.upgrades_bad_switch.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                request_id = request_id::text(&id),
                "an upgrade was refused: {err}; answered 502 and the connections closed"
            );
            let mut answer = answer::upstream_failed(&err, grpc);
            answer.headers_mut().insert(REQUEST_ID, id.clone());
            // Whatever the client sends next was meant for the tunnel: it is not read.
            answer.headers_mut().insert(
                http::header::CONNECTION,
                http::HeaderValue::from_static("close"),
            );
            answer.map(Either::Right)
        }
        Err(err) => {
            permit.failed();
            shared.upstream_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                request_id = request_id::text(&id),
                "upstream request failed: {err}"
            );
            let mut answer = match err {
                ForwardError::Timeout(_) => answer::upstream_timed_out(&err, grpc),
                _ => answer::upstream_failed(&err, grpc),
            };
            answer.headers_mut().insert(REQUEST_ID, id.clone());
            answer.map(Either::Right)
        }
    };
    Ok(response.map(|body| counted(answering, body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarding_fields_append_the_peer_and_quote_ipv6() {
        let v4 = Peer::new("192.0.2.1".parse().unwrap());
        let v6 = Peer::new("2001:db8::1".parse().unwrap());
        assert_eq!(v6.rfc7239, "for=\"[2001:db8::1]\";proto=http");
        let mut headers = http::HeaderMap::new();
        forwarded(&mut headers, &v4, ForwardedFields::Both);
        assert_eq!(headers["x-forwarded-for"], "192.0.2.1");
        assert_eq!(headers["x-forwarded-proto"], "http");
        assert_eq!(headers["forwarded"], "for=192.0.2.1;proto=http");
        let mut headers = http::HeaderMap::new();
        headers.append("x-forwarded-for", "203.0.113.7".parse().unwrap());
        headers.append("x-forwarded-for", " ".parse().unwrap());
        headers.append("x-forwarded-for", "10.0.0.5".parse().unwrap());
        forwarded(&mut headers, &v6, ForwardedFields::XForwarded);
        assert_eq!(
            headers["x-forwarded-for"], "203.0.113.7, 10.0.0.5, 2001:db8::1",
            "several lines one list, an empty one skipped"
        );
        assert!(headers.get("forwarded").is_none());
    }
}
