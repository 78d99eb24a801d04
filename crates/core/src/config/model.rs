//! The configuration file as written: every key of the configuration file as a serde type, with its default.
//!
//! These types are what `yaml_serde` reads and what the JSON Schema is generated from, so the
//! schema describes exactly what the loader accepts. Checks that need more than one key (a store
//! that does not fit the algorithm, duplicate bucket names, ...) live in `validate`, which turns a
//! [`ConfigFile`] into a [`super::Config`].

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::time::Duration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::value::MapAccessDeserializer;
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

use super::secret::redact_url;
use crate::limit::{DURATION_PATTERN, Limit, format_duration, parse_duration};

/// Service and bucket names: they become metric labels and the `x-spillway-bucket` header.
pub const NAME_PATTERN: &str = r"^[A-Za-z0-9][A-Za-z0-9._-]*$";

/// The limiter algorithm of a bucket (`drop-ratio` by default): the core's own [`Kind`], so the
/// file and the algorithms can never disagree on a name.
///
/// [`Kind`]: crate::algo::Kind
pub use crate::algo::Kind as Algorithm;
/// Whether drops are real: `enforce` (the default) or `shadow`.
pub use crate::decision::Mode;

mod cost;
mod duration;
mod identity;
mod redis;
pub use self::cost::{Cost, CostHeader, CostResponse, HITS_ADDEND, ResponseSource};
pub use self::duration::DurationText;
pub(crate) use self::duration::{duration_text, option_duration_text};
pub(crate) use self::identity::is_header_name;
pub use self::identity::{DEFAULT_XFF_TRUSTED_HOPS, IdentitySources, Source, Sources};
pub use self::redis::{RedisFile, SentinelFile};

/// The whole file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Spillway configuration")]
pub struct ConfigFile {
    /// The file format's version; this build reads `1`.
    #[schemars(range(min = 1, max = 1))]
    pub version: u32,
    /// Where request attributes come from.
    #[serde(default)]
    pub identity: IdentitySources,
    /// The control loop's timing.
    #[serde(default)]
    pub control: Control,
    /// The protected (destination) services, by name, each with its buckets.
    #[serde(default)]
    pub services: Services,
    /// The Redis that `store: redis` buckets count in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisFile>,
}

/// The whole file as written: the sections the rules are made of ([`ConfigFile`], which the
/// control plane and the rules store carry) and those that stay with the process that reads
/// the file (`concurrency`). What `spillway schema` describes.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Spillway configuration")]
pub struct DocumentFile {
    /// The file format's version; this build reads `1`.
    #[schemars(range(min = 1, max = 1))]
    pub version: u32,
    /// Where request attributes come from.
    #[serde(default)]
    pub identity: IdentitySources,
    /// The control loop's timing.
    #[serde(default)]
    pub control: Control,
    /// The protected (destination) services, by name, each with its buckets.
    #[serde(default)]
    pub services: Services,
    /// The Redis that `store: redis` buckets count in.
    #[serde(default)]
    pub redis: Option<RedisFile>,
    /// An adaptive limit on the requests in flight to the proxy's upstream; none
    /// when absent.
    #[serde(default)]
    pub concurrency: Option<ConcurrencyFile>,
    /// How the proxy treats what it forwards (HTTP/1.1 upgrades).
    #[serde(default)]
    pub proxy: Option<ProxyFile>,
}

impl DocumentFile {
    /// The rules' sections, and the sections that stay with the process (`concurrency`,
    /// `proxy`) apart.
    pub fn split(self) -> (ConfigFile, Option<ConcurrencyFile>, Option<ProxyFile>) {
        let rules = ConfigFile {
            version: self.version,
            identity: self.identity,
            control: self.control,
            services: self.services,
            redis: self.redis,
        };
        (rules, self.concurrency, self.proxy)
    }
}

/// `proxy: { upgrades: [websocket] }`: what the proxy forwards beyond plain requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProxyFile {
    /// The protocols an HTTP/1.1 request may upgrade to through the proxy (the tokens of its
    /// `upgrade` field, compared without case). Default `[websocket]`; `[]` forwards no upgrade.
    /// Any other upgrade is removed and the request forwarded as a plain one. A protocol that
    /// carries HTTP requests (`h2c`, `h2`, `http`) is refused: its requests would pass the
    /// limiter undecided inside the tunnel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("items" = { "type": "string", "pattern": "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$" }))]
    pub upgrades: Option<Vec<String>>,
}

/// `concurrency: { algorithm: gradient, min_limit: 4, max_limit: 1000, initial_limit: 20 }`, or
/// `concurrency: { algorithm: fixed, limit: 100 }`: how many requests the proxy lets be in flight
/// to its upstream at once; one more is answered `503` (gRPC `RESOURCE_EXHAUSTED`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConcurrencyFile {
    /// `gradient` (the default: the limit follows the ratio of the long-term to the short-term
    /// round trip), `vegas` (keeps the estimated queue at the upstream small) or `fixed`.
    #[serde(default = "default_concurrency_algorithm")]
    pub algorithm: ConcurrencyAlgorithm,
    /// For `fixed` only, and required there: the requests in flight at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub limit: Option<u32>,
    /// The adaptive limit never goes below this. Default 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub min_limit: Option<u32>,
    /// The adaptive limit never goes above this. Default 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_limit: Option<u32>,
    /// Where the adaptive limit starts. Default 20 (within the bounds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub initial_limit: Option<u32>,
}

/// The algorithm of a `concurrency:` section.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ConcurrencyAlgorithm {
    Gradient,
    Vegas,
    Fixed,
}

fn default_concurrency_algorithm() -> ConcurrencyAlgorithm {
    ConcurrencyAlgorithm::Gradient
}

impl From<ConcurrencyAlgorithm> for crate::concurrency::AlgorithmName {
    fn from(a: ConcurrencyAlgorithm) -> Self {
        match a {
            ConcurrencyAlgorithm::Gradient => Self::Gradient,
            ConcurrencyAlgorithm::Vegas => Self::Vegas,
            ConcurrencyAlgorithm::Fixed => Self::Fixed,
        }
    }
}

/// The control loop's timing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Control {
    /// How often each client reports its per-bucket rates. Default `1s`.
    #[serde(with = "duration_text")]
    #[schemars(with = "DurationText")]
    pub report_interval: Duration,
    /// Instructions older than this are ignored and the client fails open. Default `5s`.
    #[serde(with = "duration_text")]
    #[schemars(with = "DurationText")]
    pub instruction_ttl: Duration,
    /// Whether each client corrects a surge of its own between two instructions, holding itself
    /// to its part of a drop-ratio bucket's limit (see `spillway_core::surge`). Default
    /// `true`. With `false` a surge waits for the control plane's next instruction, and a lone
    /// host's burst that fits under the limit is never dropped meanwhile.
    pub surge_guard: bool,
    /// How much one proxy's report may count for in its zone's sums, so that a broken or
    /// compromised proxy that reports absurd load cannot make every proxy drop everything.
    pub plausibility: Plausibility,
}

impl Default for Control {
    fn default() -> Self {
        Control {
            report_interval: Duration::from_secs(1),
            instruction_ttl: Duration::from_secs(5),
            surge_guard: true,
            plausibility: Plausibility::default(),
        }
    }
}

/// The bounds an aggregator puts on each proxy's report before it sums its zone (the controller
/// sends them down with the rules). A proxy whose load is counted lower than it reported is told
/// a higher drop ratio of its own, so it is held to what was counted and the limit still holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Plausibility {
    /// A proxy's offered load to a bucket counts for at most this many times the median of the
    /// other proxies of its zone that offered to the same bucket in the same interval, and never
    /// less than the bucket's whole limit. Default `4`: in a zone of four or more proxies, one
    /// proxy alone can at most double the load the controller sees for a fleet at its limit
    /// (a drop ratio of 1/2, not 0.9999999). At least `2`.
    #[schemars(range(min = 2))]
    pub peer_multiple: u32,
    /// The most requests per second one proxy can serve: offered load over it is counted as
    /// this. Default `1000000` (a sidecar serves about 63,000 requests per second).
    #[schemars(range(min = 1))]
    pub max_host_rps: u64,
}

/// The smallest `control.plausibility.peer_multiple`.
pub const MIN_PEER_MULTIPLE: u32 = 2;

impl Default for Plausibility {
    fn default() -> Self {
        Plausibility {
            peer_multiple: 4,
            max_host_rps: 1_000_000,
        }
    }
}

/// The services in file order, so `spillway check` prints them as written.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Services(pub Vec<(String, ServiceFile)>);

impl Serialize for Services {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(name, service)| (name, service)))
    }
}

impl<'de> Deserialize<'de> for Services {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ServicesVisitor;
        impl<'de> de::Visitor<'de> for ServicesVisitor {
            type Value = Services;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping of service names to services")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Services, A::Error> {
                let mut services = Vec::new();
                while let Some((name, service)) = map.next_entry::<String, ServiceFile>()? {
                    services.push((name, service));
                }
                Ok(Services(services))
            }
        }
        deserializer.deserialize_map(ServicesVisitor)
    }
}

impl JsonSchema for Services {
    fn schema_name() -> Cow<'static, str> {
        "Services".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "object",
            "description": "The protected (destination) services by name.",
            "propertyNames": { "pattern": NAME_PATTERN },
            "additionalProperties": generator.subschema_for::<ServiceFile>()
        })
    }
}

/// One protected service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServiceFile {
    /// Its buckets; a request may match several and is dropped if any enforcing one drops it.
    pub buckets: Vec<BucketFile>,
}

/// One bucket as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BucketFile {
    /// Unique within its service; letters, digits, `.`, `_` and `-`.
    #[schemars(regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"))]
    pub name: String,
    /// Which requests count against the bucket; every key optional.
    #[serde(default, rename = "match")]
    pub match_: MatchFile,
    pub limit: Limit,
    /// How far above the steady rate a burst may go, in requests (token-bucket, leaky-bucket,
    /// gcra). Defaults to the limit's count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<NonZeroU64>,
    /// How long unused tokens are kept to absorb bursts (adaptive-token-bucket only):
    /// default `10s`, at most `20s`.
    #[serde(
        default,
        with = "option_duration_text",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<DurationText>")]
    pub burst_window: Option<Duration>,
    #[serde(default)]
    pub scope: Scope,
    #[serde(default)]
    pub mode: Mode,
    #[serde(default)]
    pub algorithm: Algorithm,
    /// Defaults to `control-plane` for drop-ratio and adaptive-token-bucket, else `local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<StateStore>,
    #[serde(default)]
    pub cost: Cost,
    /// Defaults to `closed` for `store: redis`, else `open`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_store_failure: Option<FailurePolicy>,
    /// Hot-key batching, for `store: redis` token buckets: each proxy takes up to this many
    /// tokens per Redis call and spends them locally (as many as about 100 ms of the key's
    /// traffic on that proxy, so a quiet key still takes one at a time). Fewer Redis calls, at
    /// the price of up to `batch - 1` tokens held per proxy and key. Default: no batching, one
    /// exact call per request.
    #[serde(
        default,
        deserialize_with = "batch_size",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 2, max = 1000))]
    pub batch: Option<u64>,
    /// Limits of single regions for a `scope: region` bucket: in region R the
    /// bucket's limit is `region_limits.R`, in any other region `limit`. Each region's
    /// controller enforces its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region_limits: Option<BTreeMap<String, Limit>>,
    /// A limit on trial beside `limit`: the proxies evaluate it in shadow and count
    /// the requests it would have dropped as `decision="candidate_dropped"`, while `limit` stays
    /// in force; promoting it replaces `limit` in one change. `spillway configure` sets and
    /// promotes candidates. Only for an enforcing bucket that matches HTTP requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate: Option<CandidateFile>,
}

/// `candidate: { limit: 800/s, since: 2026-12-03T07:00:00Z }`: the limit on trial and when its
/// trial began.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CandidateFile {
    /// Written like the bucket's `limit`; the bucket's period need not be kept.
    pub limit: Limit,
    /// When the trial began, a UTC time like `2026-12-03T07:00:00Z` (a fraction of a second
    /// may follow the seconds): its validation window starts here.
    #[schemars(regex(pattern = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d+)?)?Z$"))]
    pub since: String,
    /// The limits of single regions on trial, for a bucket of `scope: region`: promoting the
    /// candidate makes them the bucket's `region_limits`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region_limits: Option<BTreeMap<String, Limit>>,
}

/// The largest `batch`: a proxy may hold up to `batch - 1` of a key's tokens, which it can admit
/// above the limit in a later window, so the bound grows with it.
pub const MAX_BATCH: u64 = 1_000;

/// Reads `batch`, checking its range inside the visitor so that errors carry the value's position.
fn batch_size<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    struct BatchVisitor;
    impl de::Visitor<'_> for BatchVisitor {
        type Value = Option<u64>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "a whole number of tokens from 2 to {MAX_BATCH}, like 10")
        }
        fn visit_u64<E: de::Error>(self, n: u64) -> Result<Option<u64>, E> {
            match n {
                0 | 1 => Err(E::custom(format_args!(
                    "batch {n} is no batching: every decision is already one exact Redis call; leave batch out for that, or take 2 to {MAX_BATCH} tokens per call, like 10"
                ))),
                2..=MAX_BATCH => Ok(Some(n)),
                _ => Err(E::custom(format_args!(
                    "batch {n} is too large: each proxy may hold up to batch - 1 tokens and admit them above the limit, so batch is at most {MAX_BATCH}; 10 already cuts Redis calls by 90%"
                ))),
            }
        }
        fn visit_i64<E: de::Error>(self, n: i64) -> Result<Option<u64>, E> {
            match u64::try_from(n) {
                Ok(n) => self.visit_u64(n),
                Err(_) => Err(E::custom(format_args!(
                    "batch {n}: write how many tokens a proxy takes per Redis call, from 2 to {MAX_BATCH}, like 10"
                ))),
            }
        }
        fn visit_str<E: de::Error>(self, text: &str) -> Result<Option<u64>, E> {
            Err(E::custom(format_args!(
                "batch \"{text}\" is not a number: write the most tokens a proxy takes per Redis call, from 2 to {MAX_BATCH}, like 10 (a quiet key still takes one at a time)"
            )))
        }
    }
    deserializer.deserialize_any(BatchVisitor)
}

/// A bucket's `match`: exact values or globs with `*`; at most one subject key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MatchFile {
    /// The calling service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caller: Option<String>,
    /// The procedure (gRPC method) or HTTP path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub procedure: Option<String>,
    /// A subject; `"*"` gives each user a bucket of their own (in store local or redis: a
    /// control-plane bucket holds one limit for its scope and refuses it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub org: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// An Envoy rate-limit descriptor: the bucket answers Envoy's RLS requests of this
    /// domain whose descriptor it is the most specific match for, and no HTTP request. Takes no
    /// other key of `match`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub descriptor: Option<DescriptorFile>,
}

/// `descriptor: { domain: rl, entries: [ {key: foo}, {key: bar, value: banned} ] }`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DescriptorFile {
    /// The RLS request's `domain`.
    pub domain: String,
    /// The descriptor's entries, in order; a request descriptor matches with as many entries.
    pub entries: Vec<DescriptorEntryFile>,
    /// `limit` (the default: the bucket's limit decides), `unlimited` (OK, never counted),
    /// `allow` (OK with no limit) or `over-limit` (always over; the limit gives only its unit).
    #[serde(default, skip_serializing_if = "is_limit_answer")]
    pub answer: DescriptorAnswer,
    /// Buckets of this service that this one replaces when a request matches both.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaces: Vec<String>,
}

pub use crate::descriptor::Answer as DescriptorAnswer;

fn is_limit_answer(answer: &DescriptorAnswer) -> bool {
    *answer == DescriptorAnswer::Limit
}

/// One entry: a key, and a value that is exact, ends in `*` (a prefix), or is left out (any
/// value, each counted apart; a control-plane bucket, one count for its scope, needs the exact
/// value).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DescriptorEntryFile {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// Where a bucket's limit holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    #[default]
    Global,
    Region,
    Zone,
}

/// Where a bucket's state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
// `spillway schema` keeps the `Store` definition name it has always printed.
#[schemars(rename = "Store")]
pub enum StateStore {
    /// In the proxy's memory: the limit holds per proxy instance.
    Local,
    /// In Redis, exactly, one Lua call per decision.
    Redis,
    /// Counted by the control plane from the clients' reports.
    ControlPlane,
}

/// What a bucket does when its store cannot answer (closed behind a breaker for Redis, open for the control plane).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum FailurePolicy {
    /// Let the traffic through.
    Open,
    /// Drop it (behind the Redis circuit breaker).
    Closed,
}

impl Algorithm {
    /// Drop-ratio and the adaptive token bucket need the global view that only the control
    /// plane has; the exact algorithms count locally or in Redis.
    pub fn stores(self) -> &'static [StateStore] {
        match self {
            Algorithm::DropRatio | Algorithm::AdaptiveTokenBucket => &[StateStore::ControlPlane],
            _ => &[StateStore::Local, StateStore::Redis],
        }
    }

    pub fn default_store(self) -> StateStore {
        self.stores()[0]
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl StateStore {
    pub fn name(self) -> &'static str {
        match self {
            StateStore::Local => "local",
            StateStore::Redis => "redis",
            StateStore::ControlPlane => "control-plane",
        }
    }
}

impl fmt::Display for StateStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::Global => "global",
            Scope::Region => "region",
            Scope::Zone => "zone",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FailurePolicy {
    pub fn name(self) -> &'static str {
        match self {
            FailurePolicy::Open => "open",
            FailurePolicy::Closed => "closed",
        }
    }
}

impl fmt::Display for FailurePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
