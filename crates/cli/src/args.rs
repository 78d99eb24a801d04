//! The command line, declared with clap.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};
use spillway_rules::Role;

use crate::duration::duration;

/// Spillway: global rate limiting for fleets of microservices.
#[derive(Debug, Parser)]
#[command(name = "spillway", version, about, propagate_version = true)]
pub struct Cli {
    /// Log line format on stderr; the filter comes from RUST_LOG (default `info`).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Send tracing spans (a span per rules service request, one per control interval) to an
    /// OpenTelemetry collector at this OTLP/gRPC URL, e.g. http://127.0.0.1:4317. Off without
    /// it; `OTEL_SERVICE_NAME` overrides the service name (`spillway-COMMAND`).
    #[arg(
        long,
        global = true,
        env = "OTEL_EXPORTER_OTLP_ENDPOINT",
        value_name = "URL"
    )]
    pub otlp_endpoint: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Everything in one process on embedded defaults: a 15x surge against a limited bucket,
    /// a live view, a summary and a chart.
    Demo(DemoArgs),
    /// A single-node deployment in one process: controller, aggregator, proxy, rules service and
    /// their admin endpoints.
    Up(UpArgs),
    /// The sidecar: a reverse proxy that decides every request in-process.
    Proxy(ProxyArgs),
    /// The zone aggregator: sums its clients' reports.
    Aggregator(AggregatorArgs),
    /// The regional controller: computes drop ratios and coordinates with peer regions.
    Controller(ControllerArgs),
    /// The rules service and its admin client.
    Rules {
        #[command(subcommand)]
        command: RulesCommand,
    },
    /// Validate a configuration file and print its compiled buckets.
    Check {
        /// The configuration file.
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Print the JSON Schema of the configuration file.
    Schema,
    /// Convert another rate limiter's configuration into Spillway's.
    Import {
        #[command(subcommand)]
        command: crate::commands::import::ImportCommand,
    },
    /// The fleet simulator: the real decision and control code in simulated time.
    Sim(SimArgs),
    /// A fleet of emulated hosts in one process, each a real host core on its own link stream
    /// to a real aggregator, offering load by a shape; prints a JSON summary.
    Emulate(EmulateArgs),
    /// Envoy's rate limit service (RLS v3) without the proxy: a drop-in for envoyproxy/ratelimit
    /// behind Envoy or Istio, decided by the same engine as the sidecar.
    Rls(RlsArgs),
    /// The Rate Limit Configurator: limits proposed from traffic history.
    Configure {
        #[command(subcommand)]
        command: crate::commands::configure_command::ConfigureCommand,
    },
    /// A development PKI for mutual TLS on the control plane.
    Certs {
        #[command(subcommand)]
        command: CertsCommand,
    },
}

/// Mutual TLS on the control plane and server TLS on the admin port.
#[derive(Debug, Clone, Args)]
pub struct TlsArgs {
    /// This process's certificate chain (PEM, leaf first); its URI SAN is its identity,
    /// `spiffe://TRUST/spillway/ROLE/...`. Re-read when it changes.
    #[arg(long, value_name = "FILE", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The CA that every peer's certificate must chain to (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    /// The trust domain of the identities.
    #[arg(long, value_name = "DOMAIN", default_value = spillway_tls::DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,
    /// Listen in plaintext on addresses that are not loopback (no TLS flags): anyone who can
    /// reach the port can report load or read the admin API. For trusted networks only.
    #[arg(long, conflicts_with = "tls_cert")]
    pub insecure_plaintext: bool,
}

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Make a development CA: DIR/ca.pem and DIR/ca.key.
    Init {
        /// Where the CA goes.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// The trust domain its leaves' identities live under.
        #[arg(long, value_name = "DOMAIN", default_value = spillway_tls::DEFAULT_TRUST_DOMAIN)]
        trust_domain: String,
        /// Replace a CA already there.
        #[arg(long)]
        force: bool,
    },
    /// Issue a leaf from the CA: OUT/cert.pem, OUT/key.pem and OUT/ca.pem.
    Issue {
        /// The CA's folder (from `certs init`).
        #[arg(long, value_name = "DIR")]
        ca: PathBuf,
        /// Whose certificate: `server` has no Spillway identity (the rules service, an admin
        /// port).
        #[arg(long, value_enum)]
        role: CertRole,
        /// The region (proxy, aggregator, controller).
        #[arg(long)]
        region: Option<String>,
        /// The zone (proxy, aggregator).
        #[arg(long)]
        zone: Option<String>,
        /// The host id (proxy).
        #[arg(long)]
        host: Option<String>,
        /// A DNS name or IP address to add besides localhost and 127.0.0.1 (repeatable).
        #[arg(long = "name", value_name = "NAME")]
        names: Vec<String>,
        /// How long the leaf is valid, in days.
        #[arg(long, default_value_t = 90)]
        days: i64,
        /// Issue this many proxy leaves at once, one per host `PREFIX-0` ... `PREFIX-(N-1)`,
        /// each into OUT/HOST/ (what `spillway emulate --tls-dir OUT` reads).
        #[arg(long, value_name = "N", conflicts_with = "host")]
        hosts: Option<std::num::NonZeroUsize>,
        /// The host ids' prefix with --hosts.
        #[arg(long, value_name = "PREFIX", default_value = "emu", requires = "hosts")]
        host_prefix: String,
        /// Where the leaf goes (with --hosts, the folder of one folder per host).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Replace a leaf already there (a rotation: running processes pick it up).
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CertRole {
    Proxy,
    Aggregator,
    Controller,
    Server,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How long the demo runs, in seconds.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Write the chart (spillway-demo.svg) here instead of the system's temporary folder.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The report interval of the demo's control loop, in milliseconds.
    #[arg(long, default_value_t = 250)]
    pub report_interval_ms: u64,
    /// Start the surge this far into a report interval, from 0 (at its start) to 1; by
    /// default it starts a quarter into the run, wherever in its interval that falls.
    #[arg(long, value_name = "PHASE")]
    pub surge_phase: Option<f64>,
    /// What the demo runs: `surge` (the control loop under a 15x surge) or `tokens` (token
    /// budgets per API key charged when each response of a fake LLM API ends).
    #[arg(long, value_enum, default_value_t = DemoScenario::Surge)]
    pub scenario: DemoScenario,
    /// tokens: the sidecars in front of the fake LLM API.
    #[arg(long, default_value_t = 2)]
    pub sidecars: usize,
    /// tokens: the API keys, each with its own budget.
    #[arg(long, default_value_t = 3)]
    pub keys: usize,
    /// tokens: each key's budget, tokens a second (and its burst).
    #[arg(long, default_value_t = 5_000)]
    pub budget: u64,
    /// tokens: each key offers this many times its budget.
    #[arg(long, default_value_t = 2.0)]
    pub offered: f64,
    /// tokens: the share of requests that ask for a streamed (SSE) answer, 0 to 1.
    #[arg(long, default_value_t = 0.5)]
    pub streamed: f64,
    /// tokens: keep the budgets in this Redis (`store: redis`, shared by the sidecars) instead of
    /// in each sidecar.
    #[arg(long, value_name = "URL")]
    pub redis_url: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DemoScenario {
    Surge,
    Tokens,
}

#[derive(Debug, Args)]
pub struct UpArgs {
    /// The configuration file: it seeds the rules store at start and gives the control section.
    #[arg(short, long)]
    pub config: PathBuf,
    /// Where the SQLite rules store and the sidecar's last good rules live.
    #[arg(long, default_value = "spillway-state")]
    pub state_dir: PathBuf,
    /// A rules store to use instead of the state directory's SQLite file
    /// (`postgres://...` or `sqlite://PATH`).
    #[arg(long)]
    pub database: Option<String>,
    /// Where the sidecar forwards the requests it admits.
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub upstream: String,
    /// The sidecar's listener.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// The sidecar's /healthz, /readyz and /metrics.
    #[arg(long, default_value = "127.0.0.1:9901")]
    pub admin: SocketAddr,
    /// The rules service's REST API.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub rules_listen: SocketAddr,
    /// The controller's gRPC listener.
    #[arg(long, default_value = "127.0.0.1:7001")]
    pub controller_listen: SocketAddr,
    /// The controller's /healthz, /readyz, /metrics and /v1/hosts.
    #[arg(long, default_value = "127.0.0.1:9902")]
    pub controller_admin: SocketAddr,
    /// The aggregator's gRPC listener.
    #[arg(long, default_value = "127.0.0.1:7101")]
    pub aggregator_listen: SocketAddr,
    /// The aggregator's /healthz, /readyz and /metrics.
    #[arg(long, default_value = "127.0.0.1:9903")]
    pub aggregator_admin: SocketAddr,
    /// Serve the rules API and the control plane in plaintext on addresses that are not
    /// loopback (admin ports stay loopback only). For trusted networks only.
    #[arg(long)]
    pub insecure_plaintext: bool,
    /// Write this region's traffic history (offered, admitted and shadow-dropped requests per
    /// bucket) into the rules store at this resolution, for `spillway configure --source
    /// builtin:DATABASE_URL`: `1m`, or seconds that divide a minute (`10s`, `1s`).
    #[arg(long, default_value = "1m", value_parser = parse_history_resolution)]
    pub history_resolution: std::time::Duration,
    /// How long that history is kept.
    #[arg(long, default_value = "35d", value_parser = duration)]
    pub history_retention: std::time::Duration,
    /// On SIGTERM, how long requests and streams in flight get to finish before what is left is
    /// cut (`30s`, `2m`); keep it below Kubernetes' terminationGracePeriodSeconds.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub drain_timeout: std::time::Duration,
}

/// How a host (`spillway proxy`, `spillway rls`) joins its zone's control plane.
#[derive(Debug, Clone, Args)]
pub struct LinkArgs {
    /// The zone's aggregator (`http://`, or `https://` with the TLS flags); without it the
    /// process runs standalone from its file. Repeat it for each aggregator of the zone: the
    /// host starts at one picked by its host id and moves to the next when its stream is lost,
    /// refused or silent for three report intervals, without sending the new one an interval
    /// the old one had.
    #[arg(long = "aggregator", value_name = "URL", action = clap::ArgAction::Append)]
    pub aggregators: Vec<String>,
    /// This host's region (default: its certificate's).
    #[arg(long)]
    pub region: Option<String>,
    /// This host's zone (default: its certificate's).
    #[arg(long)]
    pub zone: Option<String>,
    /// This host's id in reports (default: its certificate's, else the hostname and the listen
    /// port).
    #[arg(long)]
    pub host_id: Option<String>,
    /// Keep the last good rules from the control plane here, so a restart enforces them
    /// before the control plane answers.
    #[arg(long, requires = "aggregators")]
    pub state_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// The configuration file.
    #[arg(short, long)]
    pub config: PathBuf,
    /// Address to accept requests on.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Where allowed requests go, for example `http://127.0.0.1:8080`.
    #[arg(long)]
    pub upstream: String,
    #[command(flatten)]
    pub link: LinkArgs,
    /// Follow the rules service's store (`sqlite://PATH` or `postgres://...`): its services
    /// replace the file's services of the same name as each change is announced. Standalone only:
    /// linked, the controller follows the store.
    #[arg(long)]
    pub database: Option<String>,
    /// Serve /healthz, /readyz and /metrics here.
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// The bearer token of the admin port's /v1/* (required when it is not loopback).
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub grpc: GrpcArgs,
    /// On SIGTERM, how long requests and streams in flight get to finish before what is left is
    /// cut (`30s`, `2m`); keep it below Kubernetes' terminationGracePeriodSeconds.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub drain_timeout: std::time::Duration,
    /// How long the upstream may keep a request it has received whole unanswered before the
    /// client gets a 504 (`500ms`, `60s`, `2m`; `off` waits as long as the client does).
    #[arg(long, default_value = "60s", value_parser = parse_timeout)]
    pub upstream_timeout: Timeout,
    /// How long a new connection may take to send its first request's head, and any request's
    /// head may take once begun, before the connection is closed (`10s`, `30s`, `2m`).
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub header_timeout: std::time::Duration,
    /// How long a kept-alive connection may stay idle after an answer before it is closed, and an
    /// HTTP/2 connection may have no open stream (`75s`, `5m`; raise it for gRPC channels that
    /// sit idle longer and should not reconnect). HTTP/2 connections have no header timeout.
    #[arg(long, default_value = "75s", value_parser = duration)]
    pub idle_timeout: std::time::Duration,
    /// How long a request body may make no progress (no byte arriving) before the request is
    /// answered 408 and its upstream exchange abandoned (`30s`, `60s`; `off` waits as long as the
    /// client does), like nginx's client_body_timeout.
    #[arg(long, default_value = "60s", value_parser = parse_timeout)]
    pub body_timeout: Timeout,
    /// How many client connections may be open at once; beyond it a new one is accepted and
    /// closed at once, logged and counted. Default: (S - min(256, S/2)) / 2 for a soft file
    /// descriptor limit S (raised to the hard limit at start), since each client connection may
    /// hold an upstream one: 384 for S = 1024, 524160 for S = 1048576.
    #[arg(long)]
    pub max_connections: Option<std::num::NonZeroUsize>,
    /// Which fields tell the upstream who its client was, each with this hop's peer appended:
    /// x-forwarded (x-forwarded-for and x-forwarded-proto), rfc7239 (forwarded:
    /// for=...;proto=http), both, or off (the received fields go on unchanged).
    #[arg(long, value_enum, default_value = "x-forwarded")]
    pub forwarded: ForwardedArg,
    /// Also serve Envoy's rate limit service (RLS v3, `ShouldRateLimit`) here, decided by this
    /// proxy's own engine from the file's descriptor buckets (docs/envoy.md). Plaintext h2c on
    /// loopback, for an Envoy beside the proxy; elsewhere mutual TLS with --tls-cert, --tls-key
    /// and --tls-ca, or --insecure-plaintext.
    #[arg(long, value_name = "ADDR")]
    pub rls_listen: Option<SocketAddr>,
    /// Add RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset to every RLS answer with a
    /// limit (envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED).
    #[arg(long, requires = "rls_listen")]
    pub rls_response_headers: bool,
    /// Answer RLS calls only from clients whose certificate has a URI SAN matching PATTERN
    /// (repeatable; `*` within a path segment, `**` across them), for example
    /// `spiffe://cluster.local/ns/*/sa/istio-ingressgateway`; others get PERMISSION_DENIED.
    /// Needs --tls-cert, --tls-key and --tls-ca (mutual TLS).
    #[arg(long, value_name = "PATTERN", requires_all = ["rls_listen", "tls_cert"])]
    pub allow_client_san: Vec<String>,
}

#[derive(Debug, Args)]
pub struct RlsArgs {
    /// The configuration file: its descriptor buckets answer Envoy; reloaded when it changes
    /// (standalone), or the rules the control plane sends (with --aggregator).
    #[arg(short, long)]
    pub config: PathBuf,
    /// Address to serve `ShouldRateLimit` on (gRPC). Plaintext on loopback, for an Envoy beside
    /// the process; elsewhere mutual TLS with --tls-cert, --tls-key and --tls-ca, or
    /// --insecure-plaintext.
    #[arg(long)]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub link: LinkArgs,
    /// Serve /healthz, /readyz and /metrics here.
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// The bearer token of the admin port's /v1/* (required when it is not loopback).
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub grpc: GrpcArgs,
    /// Add RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset to every answer with a
    /// limit (envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED).
    #[arg(long)]
    pub response_headers: bool,
    /// Answer only clients whose certificate has a URI SAN matching PATTERN (repeatable; `*`
    /// within a path segment, `**` across them); others get PERMISSION_DENIED.
    #[arg(long, value_name = "PATTERN", requires = "tls_cert")]
    pub allow_client_san: Vec<String>,
}

/// The bounds of the process's gRPC listeners (RLS, RLQS, the control plane's), as the proxy's
/// own listener has them; the defaults are far above what Envoy or a Spillway fleet uses
/// (docs/operations.md).
#[derive(Debug, Clone, Args)]
pub struct GrpcArgs {
    /// How many connections each gRPC listener may have open at once; beyond it a new one is
    /// accepted and closed at once, and logged.
    #[arg(long, value_name = "N", default_value = "10000")]
    pub grpc_max_connections: std::num::NonZeroUsize,
    /// How many calls one gRPC connection may have open at once, advertised as HTTP/2's
    /// SETTINGS_MAX_CONCURRENT_STREAMS; a stream beyond is refused (REFUSED_STREAM).
    #[arg(long, value_name = "N", default_value = "1024")]
    pub grpc_max_streams: std::num::NonZeroU32,
    /// How long an RLS call may take to arrive and be answered before it is answered
    /// DEADLINE_EXCEEDED.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_positive_duration)]
    pub grpc_request_timeout: std::time::Duration,
    /// How long a gRPC connection may have no open call before it is closed (GOAWAY); on
    /// streaming listeners (RLQS, the control plane), also how long a stream may take to send its
    /// first message, and a begun message to arrive whole.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_positive_duration)]
    pub grpc_idle_timeout: std::time::Duration,
    /// How long a gRPC connection may send nothing before it is pinged; one that does not answer
    /// the ping within 20 s is closed.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_positive_duration)]
    pub grpc_keepalive: std::time::Duration,
}

impl GrpcArgs {
    pub fn limits(&self) -> spillway_control::GrpcLimits {
        spillway_control::GrpcLimits {
            max_connections: self.grpc_max_connections.get(),
            max_streams: self.grpc_max_streams.get(),
            request_timeout: self.grpc_request_timeout,
            idle_timeout: self.grpc_idle_timeout,
            keepalive: self.grpc_keepalive,
        }
    }
}

/// A duration above zero.
fn parse_positive_duration(text: &str) -> Result<std::time::Duration, String> {
    let duration = duration(text)?;
    if duration.is_zero() {
        return Err(format!("{text}: give a duration above zero, like 5s"));
    }
    Ok(duration)
}

/// `--forwarded`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ForwardedArg {
    XForwarded,
    Rfc7239,
    Both,
    Off,
}

/// A history resolution: a minute, or whole seconds that divide one, so every slot falls in one
/// minute of the configurator's per-minute history.
fn parse_history_resolution(text: &str) -> Result<std::time::Duration, String> {
    let duration = duration(text)?;
    let ms = duration.as_millis();
    if ms == 0 || ms % 1000 != 0 || 60_000 % ms != 0 {
        return Err(format!(
            "{text}: write 1m or whole seconds that divide a minute (1s, 5s, 10s, 30s)"
        ));
    }
    Ok(duration)
}

/// A timeout, or none (`off`).
#[derive(Debug, Clone, Copy)]
pub struct Timeout(pub Option<std::time::Duration>);

fn parse_timeout(text: &str) -> Result<Timeout, String> {
    if text.trim() == "off" {
        return Ok(Timeout(None));
    }
    spillway_core::limit::parse_duration(text)
        .map(|duration| Timeout(Some(duration)))
        .map_err(|err| format!("{err}, or off"))
}

#[derive(Debug, Args)]
pub struct AggregatorArgs {
    /// Address to accept client streams on (loopback only without TLS or
    /// --insecure-plaintext).
    #[arg(long)]
    pub listen: SocketAddr,
    /// This aggregator's region (default: its certificate's).
    #[arg(long)]
    pub region: Option<String>,
    /// This aggregator's zone (default: its certificate's).
    #[arg(long)]
    pub zone: Option<String>,
    /// The region's controller (`https://` with TLS, `http://` without). Repeat it for each
    /// controller of the region (a leader and its standbys, in any order): the link moves to
    /// the next one when it loses one, and a standby points it to the leader.
    #[arg(long = "controller", required = true)]
    pub controllers: Vec<String>,
    /// Serve /healthz, /readyz and /metrics here.
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// The bearer token of the admin port's /v1/* (required when it is not loopback).
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub grpc: GrpcArgs,
    /// On SIGTERM, how long requests and streams in flight get to finish before what is left is
    /// cut (`30s`, `2m`); keep it below Kubernetes' terminationGracePeriodSeconds.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub drain_timeout: std::time::Duration,
    /// Also serve Envoy's Rate Limit Quota Service (RLQS v3, `StreamRateLimitQuotas`) here:
    /// each Envoy instance becomes a client of this zone, its usage reports offered load and
    /// its assignments the buckets' drop ratios (docs/envoy.md). Plaintext h2c on loopback;
    /// elsewhere mutual TLS with --tls-cert, --tls-key and --tls-ca, or --insecure-plaintext.
    #[arg(long, value_name = "ADDR")]
    pub rlqs_listen: Option<SocketAddr>,
    /// Accept RLQS streams only from clients whose certificate has a URI SAN matching PATTERN
    /// (repeatable; `*` within a path segment, `**` across them), for example
    /// `spiffe://cluster.local/ns/*/sa/istio-ingressgateway`; others get PERMISSION_DENIED.
    #[arg(long, value_name = "PATTERN", requires_all = ["rlqs_listen", "tls_cert"])]
    pub allow_client_san: Vec<String>,
    /// RLQS streams one host may hold open at once; more get RESOURCE_EXHAUSTED. A host is a
    /// client certificate's identity with TLS, else one connection.
    #[arg(long, value_name = "N", default_value = "16")]
    pub rlqs_max_streams_per_host: std::num::NonZeroUsize,
    /// RLQS bucket ids one host may hold, all its streams together (a stream holds at most
    /// 10,000); more get RESOURCE_EXHAUSTED.
    #[arg(long, value_name = "N", default_value = "10000")]
    pub rlqs_max_buckets_per_host: std::num::NonZeroUsize,
    /// RLQS bucket ids every host of this aggregator may hold together; more get
    /// RESOURCE_EXHAUSTED.
    #[arg(long, value_name = "N", default_value = "50000")]
    pub rlqs_max_buckets: std::num::NonZeroUsize,
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("source").required(true).args(["config", "database"]))]
pub struct ControllerArgs {
    /// Address to accept aggregator and peer streams on (loopback only without TLS or
    /// --insecure-plaintext).
    #[arg(long)]
    pub listen: SocketAddr,
    /// This controller's region (default: its certificate's).
    #[arg(long)]
    pub region: Option<String>,
    /// Another region's controller (repeat for each).
    #[arg(long = "peer")]
    pub peers: Vec<String>,
    /// The rules come from this file, watched for changes.
    #[arg(short, long)]
    pub config: Option<PathBuf>,
    /// The rules come from the rules service's store (`sqlite://PATH` or `postgres://...`).
    #[arg(long)]
    pub database: Option<String>,
    /// With --database: write this region's traffic history (offered, admitted and
    /// shadow-dropped requests per bucket) into the rules store at this resolution, for
    /// `spillway configure --source builtin:DATABASE_URL`: `1m`, or seconds that divide a minute
    /// (`10s`, `1s`).
    #[arg(long, default_value = "1m", value_parser = parse_history_resolution)]
    pub history_resolution: std::time::Duration,
    /// How long that history is kept.
    #[arg(long, default_value = "35d", value_parser = duration)]
    pub history_retention: std::time::Duration,
    /// Hold the region's controller lease in this store (`postgres://...`, the rules service's
    /// database, or `sqlite:PATH` on one machine): one controller of the region leads, the
    /// others stand by (following the rules and the peers' sums, refusing aggregators with the
    /// leader's address) and take over when its lease lapses. Without it this controller
    /// always leads.
    #[arg(long, value_name = "URL")]
    pub lease_store: Option<String>,
    /// How long the lease lasts without a renewal: a dead leader's standby takes over within
    /// it and a quarter more (default: three report intervals of the rules at start).
    #[arg(long, value_parser = duration, requires = "lease_store")]
    pub lease_ttl: Option<std::time::Duration>,
    /// With --lease-store: the URL aggregators dial to reach this controller, which standbys
    /// hand them (default: http://LISTEN, or https:// with TLS; give it when --listen is
    /// 0.0.0.0 or behind a NAT).
    #[arg(long, value_name = "URL", requires = "lease_store")]
    pub advertise: Option<String>,
    /// Serve /healthz, /readyz, /metrics, /v1/* and the dashboard here.
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// The bearer token of the admin port's /v1/* and dashboard (required when it is not
    /// loopback).
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub grpc: GrpcArgs,
    /// On SIGTERM, how long requests and streams in flight get to finish before what is left is
    /// cut (`30s`, `2m`); keep it below Kubernetes' terminationGracePeriodSeconds.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub drain_timeout: std::time::Duration,
}

#[derive(Debug, Subcommand)]
pub enum RulesCommand {
    /// Run the rules service: HTTPS with --tls-cert/--tls-key, else plaintext HTTP on a loopback
    /// address (or anywhere with --insecure-plaintext).
    Serve {
        /// Address to serve the REST API on. Without --tls-cert/--tls-key it must be loopback
        /// (127.0.0.1, ::1; 0.0.0.0 is every interface), unless --insecure-plaintext.
        #[arg(long)]
        listen: SocketAddr,
        /// Serve HTTPS with this certificate chain (PEM, leaf first; it needs a DNS or IP SAN
        /// for every name clients dial). Re-read when it changes: the next connection uses the
        /// new certificate, no restart.
        #[arg(long, value_name = "FILE", requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// The private key of --tls-cert (PEM), re-read with it.
        #[arg(long, value_name = "FILE", requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Serve plaintext HTTP on a non-loopback address: bearer tokens then cross the network
        /// readable by anyone on the path. Not with --tls-cert/--tls-key.
        #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
        insecure_plaintext: bool,
        /// `sqlite://PATH` (embedded) or `postgres://...`.
        #[arg(long, default_value = "sqlite://spillway-rules.db")]
        database: String,
        /// Modifications each admin may make per UTC day.
        #[arg(long, env = "SPILLWAY_RULES_ADMIN_BUDGET", default_value_t = 10)]
        admin_budget: u32,
        /// Modifications each service account (automation such as the configurator) may make per
        /// UTC day; it applies whole files, so it gets more.
        #[arg(long, env = "SPILLWAY_RULES_SERVICE_BUDGET", default_value_t = 1000)]
        service_budget: u32,
        /// The longest `ttl` an incident override may have, like `7d` or `12h`.
        #[arg(
            long,
            env = "SPILLWAY_RULES_MAX_OVERRIDE_TTL",
            default_value = "7d",
            value_parser = duration
        )]
        max_override_ttl: Duration,
        /// On SIGTERM, how long requests in flight get to finish before their connections are
        /// closed (`30s`, `2m`); keep it below Kubernetes' terminationGracePeriodSeconds.
        #[arg(long, default_value = "30s", value_parser = duration)]
        drain_timeout: Duration,
    },
    /// Apply a whole configuration declaratively (one modification).
    Apply {
        #[command(flatten)]
        client: RulesClientArgs,
        /// The YAML or JSON configuration to apply.
        #[arg(short, long)]
        file: PathBuf,
        /// Show the diff without changing anything.
        #[arg(long)]
        dry_run: bool,
    },
    /// List the rules.
    List {
        #[command(flatten)]
        client: RulesClientArgs,
        /// Only the rules of this service.
        #[arg(long)]
        service: Option<String>,
    },
    /// Show one rule.
    Get {
        #[command(flatten)]
        client: RulesClientArgs,
        /// The rule's id (UUID).
        id: String,
    },
    /// Delete one rule.
    Delete {
        #[command(flatten)]
        client: RulesClientArgs,
        /// The rule's id (UUID).
        id: String,
    },
    /// Show the audit log: who changed what, when; newest first.
    History {
        #[command(flatten)]
        client: RulesClientArgs,
        /// At most this many entries (1 to 1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Only entries older than this rules version: the next page after the last one shown.
        #[arg(long)]
        before: Option<i64>,
    },
    /// Manage users directly in the store.
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
    /// Manage the service's users (admin only).
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Manage bearer tokens (admin only).
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// List the users, their roles and how many working tokens each holds.
    List {
        #[command(flatten)]
        client: RulesClientArgs,
    },
    /// Create a user and print its first token once.
    Create {
        #[command(flatten)]
        client: RulesClientArgs,
        /// The user's name.
        name: String,
        /// The user's role.
        #[arg(
            long,
            default_value_t = Role::Viewer,
            value_parser = PossibleValuesParser::new(Role::ALL.map(Role::name))
                .try_map(|name| name.parse::<Role>()),
        )]
        role: Role,
        /// The token expires after this long, like `30d` or `12h`; without it, never.
        #[arg(long, value_parser = duration)]
        expires: Option<Duration>,
    },
    /// Change a user's role; every instance of the service applies it within a second.
    Update {
        #[command(flatten)]
        client: RulesClientArgs,
        /// The user's name.
        name: String,
        /// The new role.
        #[arg(
            long,
            value_parser = PossibleValuesParser::new(Role::ALL.map(Role::name))
                .try_map(|name| name.parse::<Role>()),
        )]
        role: Role,
    },
    /// Delete a user and its tokens; every instance refuses them within a second.
    Delete {
        #[command(flatten)]
        client: RulesClientArgs,
        /// The user's name.
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Make a new token and print it once.
    Create {
        #[command(flatten)]
        client: RulesClientArgs,
        /// Whose token (default: your own).
        #[arg(long)]
        user: Option<String>,
        /// It expires after this long, like `30d` or `12h`; without it, never.
        #[arg(long, value_parser = duration)]
        expires: Option<Duration>,
    },
    /// List tokens (never their secrets): id, user, state, expiry, last use.
    List {
        #[command(flatten)]
        client: RulesClientArgs,
        /// Only this user's tokens.
        #[arg(long)]
        user: Option<String>,
    },
    /// Revoke a token for good; every instance refuses it within a second.
    Revoke {
        #[command(flatten)]
        client: RulesClientArgs,
        /// The token's id: the 32 hex digits after `spw_`.
        id: String,
    },
    /// Give a token a new secret and print it once; the old secret stops working everywhere
    /// within a second.
    Rotate {
        #[command(flatten)]
        client: RulesClientArgs,
        /// The token's id: the 32 hex digits after `spw_`.
        id: String,
        /// The new secret expires after this long; without it, as long as the old one was given.
        #[arg(long, value_parser = duration)]
        expires: Option<Duration>,
    },
}

#[derive(Debug, Args)]
pub struct RulesClientArgs {
    /// The rules service: `https://HOST:PORT` (its certificate must chain to --ca, or else to
    /// the system's root CAs, and name HOST), or `http://` for a server on loopback.
    #[arg(long, default_value = "http://127.0.0.1:7070")]
    pub server: String,
    /// Bearer token.
    #[arg(long, env = "SPILLWAY_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The CA (PEM) that an https:// server's certificate must chain to, in place of the
    /// system's root CAs.
    #[arg(long, value_name = "FILE", env = "SPILLWAY_CA")]
    pub ca: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Create a user in the store and print its token once.
    Create {
        /// The user's name.
        name: String,
        /// The user's role.
        // The store's own `Role`: clap offers its names (help, suggestions) and its `FromStr`
        // turns the one given into the value.
        #[arg(
            long,
            default_value_t = Role::Admin,
            value_parser = PossibleValuesParser::new(Role::ALL.map(Role::name))
                .try_map(|name| name.parse::<Role>()),
        )]
        role: Role,
        /// `sqlite://PATH` or `postgres://...`.
        #[arg(long)]
        database: String,
        /// The token expires after this long, like `30d`; without it, never.
        #[arg(long, value_parser = duration)]
        expires: Option<Duration>,
    },
}

#[derive(Debug, Args)]
pub struct SimArgs {
    /// The scenario: surge-15x, overload-1.5x, many-callers, host-burst, control-plane-down,
    /// region-loss, criticality, sidecar-leaves, controller-failover, tokens (a token budget,
    /// drop-ratio only), or `all` of them.
    #[arg(long)]
    pub scenario: String,
    /// Seed of the simulation; the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write CSV and SVG charts here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Algorithms to compare (default: all of them that run the scenario).
    #[arg(long = "algorithm")]
    pub algorithms: Vec<String>,
    /// Simulated seconds to run (default: the scenario's own length).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Hosts to split the scenario's load over (default: the scenario's own fleet); every
    /// scenario but sidecar-leaves, the demo's four sidecars, takes one.
    #[arg(long)]
    pub hosts: Option<usize>,
    /// Drop-ratio hosts wait for the control plane instead of correcting a surge of their own
    /// between instructions (`control.surge_guard: false`).
    #[arg(long)]
    pub no_surge_guard: bool,
}

#[derive(Debug, Args)]
pub struct EmulateArgs {
    /// The hosts' rules until the control plane sends its own: the controller's file.
    #[arg(short, long)]
    pub config: PathBuf,
    /// How many hosts, each with its own link stream (and a file descriptor).
    #[arg(long)]
    pub hosts: std::num::NonZeroUsize,
    /// Offer load to the first B control-plane buckets of the rules (default: all of them).
    #[arg(long, value_name = "B")]
    pub buckets: Option<usize>,
    /// The zone's aggregator (`http://`, or `https://` with --tls-dir). Repeat it for each
    /// aggregator of the zone: each host starts at one picked by its id and moves to the next
    /// when its stream is lost, as a sidecar does.
    #[arg(long = "aggregator", value_name = "URL", required = true, action = clap::ArgAction::Append)]
    pub aggregators: Vec<String>,
    /// The hosts' region.
    #[arg(long)]
    pub region: String,
    /// The hosts' zone.
    #[arg(long)]
    pub zone: String,
    /// Host ids are PREFIX-0, PREFIX-1, ...
    #[arg(long, value_name = "PREFIX", default_value = "emu")]
    pub host_prefix: String,
    /// How long the run lasts, in seconds.
    #[arg(long, default_value_t = 60.0)]
    pub seconds: f64,
    /// The fleet's offered rate per bucket, requests per second (default: 1.5 times each
    /// bucket's limit), spread evenly over the hosts.
    #[arg(long, value_name = "R")]
    pub rate: Option<f64>,
    /// Multiply the offered rate by FACTOR from SECONDS into the run, like 15@10s.
    #[arg(long, value_name = "FACTOR@SECONDS", value_parser = parse_step)]
    pub step: Option<spillway_emulate::LoadStep>,
    /// Mutual TLS with a certificate per host: DIR/HOST/cert.pem, key.pem and ca.pem, as
    /// `spillway certs issue --role proxy --hosts N --out DIR` writes them.
    #[arg(long, value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
    /// The trust domain of the identities.
    #[arg(long, value_name = "DOMAIN", default_value = spillway_tls::DEFAULT_TRUST_DOMAIN)]
    pub trust_domain: String,
}

fn parse_step(text: &str) -> Result<spillway_emulate::LoadStep, String> {
    spillway_emulate::LoadStep::parse(text).map_err(|e| e.to_string())
}
