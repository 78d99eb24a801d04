//! What `spillway proxy` is started with ([`ProxyOptions`]), and the bounds that go with it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use spillway_client::DEFAULT_POLL;
use spillway_client::control::ControlOptions;

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
    /// feeds [`crate::Proxy::client`] its rules (the rules service's store, for `--database`),
    /// so the file cannot overwrite them.
    pub watch_file: bool,
    /// How many threads serve the connections, each running a single-threaded runtime of its own
    /// with its own upstream connections, as nginx runs one worker process per core: a
    /// connection, its requests and their upstream exchanges stay on one thread, with no work
    /// stealing, no cross-thread wakeup and no shared pool between them. Accepted connections
    /// are dealt to the threads in turn. 0 (the default) serves on the runtime
    /// [`crate::Proxy::start`] is called on, which suits a proxy embedded in a larger program
    /// (tests, the demo).
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
pub(crate) const MIN_MAX_HEAD: usize = 8 * 1024;

/// How long connections may still take, after the drain deadline, to deliver the answers given
/// at the deadline before they are closed.
pub const DRAIN_GRACE: Duration = Duration::from_secs(1);
