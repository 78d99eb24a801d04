//! The proxy as a whole: [`Proxy::start`] loads the rules, binds the listeners and starts the
//! serving threads; the acceptor deals connections to them; [`Proxy::shutdown`] drains them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use spillway_client::control::{ControlPlane, LinkStatus};
use spillway_client::{Client, watch_file};
use spillway_core::concurrency::{Gate, UPDATE_EVERY};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::answer::Refusals;
use crate::error::ProxyError;
use crate::forward::Upstream;
use crate::limits::{Connections, RefusalLog};
use crate::options::ProxyOptions;
use crate::request_id::RequestIds;
use crate::shared::Shared;
use crate::worker::{Accepted, Worker, Workers};

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
