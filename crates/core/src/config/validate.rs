//! The checks that need more than one key, and the validated model they produce.
//!
//! Everything here runs after serde has read a [`ConfigFile`]; each failure is placed with the
//! document's [`Positions`] so the message still reads `FILE:LINE:COLUMN: what is wrong`.

use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::time::Duration;

use super::model::{
    Algorithm, BucketFile, ConfigFile, Control, Cost, DescriptorFile, FailurePolicy,
    IdentitySources, MIN_PEER_MULTIPLE, MatchFile, Mode, RedisFile, Scope, SentinelFile, Services,
    Source, Sources, StateStore, is_header_name,
};
use super::positions::{Located, Position, Positions, child, item};
use super::secret::{redact_url, url_has_password};
use crate::descriptor::{DescriptorSpec, EntrySpec, EntryValue};
use crate::limit::{Limit, format_duration};
use crate::pattern::{MatchSpec, Pattern, Subject, SubjectKind, SubjectValue};

pub use super::model::NAME_PATTERN;

/// The buffer of unused tokens: 10 s by default, at most 20 s.
pub const DEFAULT_BURST_WINDOW: Duration = Duration::from_secs(10);
pub const MAX_BURST_WINDOW: Duration = Duration::from_secs(20);

/// A validated configuration: every default filled in, every cross-key rule checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub version: u32,
    pub identity: IdentitySources,
    pub control: Control,
    /// In file order.
    pub services: Vec<Service>,
    pub redis: Option<Redis>,
    /// The proxy's in-flight limit on its upstream, when the file has one. It stays
    /// with the process that read the file: the rules a control plane sends carry none.
    pub concurrency: Option<crate::concurrency::ConcurrencySettings>,
    /// The proxy's own settings (`proxy:`); like `concurrency` they stay with the process that
    /// read the file.
    pub proxy: ProxySettings,
}

/// The `proxy:` section, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxySettings {
    /// The protocols an HTTP/1.1 upgrade may name to be forwarded as one, in lower case.
    pub upgrades: Vec<String>,
}

impl Default for ProxySettings {
    fn default() -> Self {
        Self {
            upgrades: vec!["websocket".to_owned()],
        }
    }
}

impl ProxySettings {
    /// Whether `protocol` (a token of an `upgrade` field, `name` or `name/version`) names an
    /// allowed protocol.
    pub fn allows_upgrade(&self, protocol: &[u8]) -> bool {
        let name = protocol
            .split(|&b| b == b'/')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        self.upgrades
            .iter()
            .any(|allowed| allowed.as_bytes().eq_ignore_ascii_case(name))
    }
}

/// Upgrade protocols that carry HTTP requests: inside their tunnel every request would pass the
/// limiter undecided, so `proxy.upgrades` may not name them.
const REQUEST_CARRYING_UPGRADES: [&str; 3] = ["h2c", "h2", "http"];

/// A `proxy:` section: `upgrades` are tokens, none of them a protocol that carries requests.
pub(crate) fn proxy(
    file: super::ProxyFile,
    positions: &Positions,
) -> Result<ProxySettings, Located> {
    let check = Checker { positions };
    let Some(upgrades) = file.upgrades else {
        return Ok(ProxySettings::default());
    };
    let mut allowed = Vec::with_capacity(upgrades.len());
    for (i, token) in upgrades.into_iter().enumerate() {
        let path = format!("proxy.upgrades[{i}]");
        let is_tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if token.is_empty() || !token.bytes().all(is_tchar) {
            return Err(check.at_value(
                &path,
                format!("{token:?} is not a protocol name: write it as an `upgrade` field names it, like websocket"),
            ));
        }
        let lower = token.to_ascii_lowercase();
        if REQUEST_CARRYING_UPGRADES.contains(&lower.as_str()) {
            return Err(check.at_value(
                &path,
                format!("{token} cannot be an allowed upgrade: its connection carries HTTP requests, which would pass the limiter undecided; remove it (HTTP/2 clients speak to the proxy directly, and each of their requests is decided)"),
            ));
        }
        if !allowed.contains(&lower) {
            allowed.push(lower);
        }
    }
    Ok(ProxySettings { upgrades: allowed })
}

impl Config {
    /// All buckets with their service, in file order.
    pub fn buckets(&self) -> impl Iterator<Item = (&Service, &Bucket)> {
        self.services
            .iter()
            .flat_map(|s| s.buckets.iter().map(move |b| (s, b)))
    }

    pub fn service(&self, name: &str) -> Option<&Service> {
        self.services.iter().find(|s| s.name == name)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Service {
    pub name: String,
    pub buckets: Vec<Bucket>,
}

/// A validated bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    pub name: String,
    /// What the compiled matcher needs. Empty for a descriptor bucket, which HTTP requests never
    /// match.
    pub match_spec: MatchSpec,
    /// `Some` for a descriptor bucket: it answers Envoy's RLS requests only.
    pub descriptor: Option<DescriptorSpec>,
    pub limit: Limit,
    /// `Some` exactly for algorithms with a burst; defaults to the limit's count, so a
    /// token bucket of 5000/s holds 5000 tokens.
    pub burst: Option<NonZeroU64>,
    /// `Some` exactly for adaptive-token-bucket; defaults to 10 s.
    pub burst_window: Option<Duration>,
    pub scope: Scope,
    pub mode: Mode,
    pub algorithm: Algorithm,
    pub store: StateStore,
    pub cost: Cost,
    pub on_store_failure: FailurePolicy,
    /// Hot-key batching: `Some(N)` (2 to 1000) only for `store: redis` token buckets.
    pub batch: Option<u64>,
    /// The limit on trial beside `limit`, if the bucket has one. The service also
    /// holds the candidate's twin right after this bucket (see [`CANDIDATE_SUFFIX`]).
    pub candidate: Option<Candidate>,
    /// The limits of single regions (`scope: region` only), by region name, sorted.
    pub region_limits: Vec<(String, Limit)>,
}

/// A validated `candidate`.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub limit: Limit,
    /// When its trial began, Unix milliseconds.
    pub since_ms: i64,
    /// The limits of single regions on trial, by region name, sorted.
    pub region_limits: Vec<(String, Limit)>,
}

/// A bucket with a candidate is followed in its service by its twin: the same bucket in shadow
/// at the candidate's limit, named the bucket's name and this suffix. A name with `~` is no
/// name a file may write, so a twin never collides with a bucket; the control plane steers it
/// like any bucket, and the proxies count its virtual drops as the bucket's
/// `candidate_dropped` requests, never as a decision of its own.
pub const CANDIDATE_SUFFIX: &str = "~candidate";

/// The bucket whose candidate `bucket` (a bucket's name) is the twin of, if it is one.
pub fn candidate_of(bucket: &str) -> Option<&str> {
    bucket.strip_suffix(CANDIDATE_SUFFIX)
}

impl Bucket {
    /// The bucket's limit in `region`: its `region_limits` entry, else `limit`.
    pub fn limit_in(&self, region: &str) -> Limit {
        self.region_limits
            .iter()
            .find(|(r, _)| r == region)
            .map_or(self.limit, |(_, l)| *l)
    }

    /// Whether this is a candidate's twin ([`CANDIDATE_SUFFIX`]).
    pub fn is_candidate(&self) -> bool {
        candidate_of(&self.name).is_some()
    }

    /// The twin that tries `candidate` beside this bucket.
    fn candidate_twin(&self, candidate: &Candidate, burst: Option<NonZeroU64>) -> Bucket {
        let mut twin = self.clone();
        twin.name = format!("{}{CANDIDATE_SUFFIX}", self.name);
        twin.limit = candidate.limit;
        twin.region_limits = candidate.region_limits.clone();
        twin.burst = self
            .algorithm
            .takes_burst()
            .then(|| burst.unwrap_or(candidate.limit.count));
        twin.mode = Mode::Shadow;
        twin.candidate = None;
        twin
    }
}

/// A validated `redis` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redis {
    pub target: RedisTarget,
    pub timeout: Duration,
    /// Where the password is kept, read by the process that connects (`redis.password_file`).
    pub password_file: Option<PathBuf>,
}

/// Where Redis is. Its `Debug` shows URLs with their password as `***`.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    Single { url: String },
    Sentinel { master: String, nodes: Vec<String> },
    Cluster { nodes: Vec<String> },
}

impl fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redacted = |nodes: &[String]| -> Vec<String> {
            nodes.iter().map(|n| redact_url(n).into_owned()).collect()
        };
        match self {
            RedisTarget::Single { url } => f
                .debug_struct("Single")
                .field("url", &redact_url(url))
                .finish(),
            RedisTarget::Sentinel { master, nodes } => f
                .debug_struct("Sentinel")
                .field("master", master)
                .field("nodes", &redacted(nodes))
                .finish(),
            RedisTarget::Cluster { nodes } => f
                .debug_struct("Cluster")
                .field("nodes", &redacted(nodes))
                .finish(),
        }
    }
}

impl From<&Redis> for RedisFile {
    /// The section as a file would write it: how a host puts its own `redis` back beside rules
    /// it received, which never carry one.
    fn from(redis: &Redis) -> Self {
        let (url, sentinel, cluster) = match &redis.target {
            RedisTarget::Single { url } => (Some(url.clone()), None, None),
            RedisTarget::Sentinel { master, nodes } => (
                None,
                Some(SentinelFile {
                    master: master.clone(),
                    nodes: nodes.clone(),
                }),
                None,
            ),
            RedisTarget::Cluster { nodes } => (None, None, Some(nodes.clone())),
        };
        RedisFile {
            url,
            sentinel,
            cluster,
            timeout: redis.timeout,
            password_file: redis.password_file.clone(),
        }
    }
}

/// `on_store_failure` when the file says nothing: Redis fails closed behind its circuit
/// breaker; everything else fails open, as the control plane must.
pub fn default_failure_policy(store: StateStore) -> FailurePolicy {
    match store {
        StateStore::Redis => FailurePolicy::Closed,
        StateStore::Local | StateStore::ControlPlane => FailurePolicy::Open,
    }
}

struct Checker<'a> {
    positions: &'a Positions,
}

impl Checker<'_> {
    fn at_value(&self, path: &str, message: impl Into<String>) -> Located {
        Located {
            position: self.positions.value(path),
            message: message.into(),
        }
    }

    fn at_key(&self, path: &str, message: impl Into<String>) -> Located {
        Located {
            position: self.positions.key(path),
            message: message.into(),
        }
    }
}

pub(crate) fn is_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

pub(crate) fn validate(file: ConfigFile, positions: &Positions) -> Result<Config, Located> {
    let check = Checker { positions };
    if file.version != 1 {
        return Err(check.at_value(
            "version",
            format!(
                "unsupported version {}; this build reads `version: 1`",
                file.version
            ),
        ));
    }
    check_identity(&check, &file.identity)?;
    let mut file = file;
    file.identity.list_headers = list_headers(&check, &file.identity.list_headers)?;
    if file.control.instruction_ttl <= file.control.report_interval {
        return Err(check.at_value(
            "control.instruction_ttl",
            format!(
                "instruction_ttl ({}) must be longer than report_interval ({}), or instructions expire before the next ones arrive; a few intervals is usual, like {}",
                format_duration(file.control.instruction_ttl),
                format_duration(file.control.report_interval),
                format_duration(file.control.report_interval * 5),
            ),
        ));
    }
    check_plausibility(&check, &file.control)?;
    check_bucket_count(&check, &file.services)?;
    let mut services = Vec::with_capacity(file.services.0.len());
    // Descriptor buckets by their descriptor, across services: a domain's descriptor has one.
    let mut descriptors: HashMap<String, (String, String, usize)> = HashMap::new();
    for (name, service) in file.services.0 {
        let path = child("services", &name);
        if !is_name(&name) {
            return Err(check.at_key(
                &path,
                format!(
                    "service name \"{name}\": use letters, digits, '.', '_' and '-', starting with a letter or digit"
                ),
            ));
        }
        let buckets_path = child(&path, "buckets");
        let mut buckets: Vec<Bucket> = Vec::with_capacity(service.buckets.len());
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut pending_replaces: Vec<(usize, String)> = Vec::new();
        // A rule's key: its index in the file, and in `buckets` (which holds candidates' twins).
        let mut rules: HashMap<(&'static str, String, String), (usize, usize)> = HashMap::new();
        for (index, bucket) in service.buckets.into_iter().enumerate() {
            let replaces_path = child(
                &child(&child(&item(&buckets_path, index), "match"), "descriptor"),
                "replaces",
            );
            let bucket_path = item(&buckets_path, index);
            let (bucket, twin) = check_bucket(&check, &bucket_path, bucket, file.redis.is_some())?;
            let name_path = child(&bucket_path, "name");
            if let Some(&first) = names.get(&bucket.name) {
                let first_at = positions.value(&child(&item(&buckets_path, first), "name"));
                return Err(check.at_value(
                    &name_path,
                    format!(
                        "duplicate bucket name \"{}\" in service \"{name}\" (first at line {}); bucket names are unique within a service",
                        bucket.name, first_at.line
                    ),
                ));
            }
            names.insert(bucket.name.clone(), index);
            if let Some(spec) = &bucket.descriptor {
                let key = spec.to_string();
                let at = check.positions.key(&child(&bucket_path, "match"));
                if let Some((other_service, other, line)) = descriptors.get(&key) {
                    return Err(Located {
                        position: at,
                        message: format!(
                            "bucket \"{}\" matches the same descriptor ({key}) as bucket \"{other}\" of service \"{other_service}\" (line {line}); one descriptor has one bucket, so merge them or add an entry to one",
                            bucket.name
                        ),
                    });
                }
                descriptors.insert(key, (name.clone(), bucket.name.clone(), at.line));
                pending_replaces.push((buckets.len(), replaces_path));
                buckets.push(bucket);
                continue;
            }
            let rule = rule_key(&bucket.match_spec);
            if let Some(&(first, at)) = rules.get(&rule) {
                let other = &buckets[at];
                let first_at = positions.value(&item(&buckets_path, first));
                return Err(check.at_key(
                    &child(&bucket_path, "match"),
                    format!(
                        "bucket \"{}\" conflicts with bucket \"{}\" (line {}): both limit {} on {}; a service has one rule per (subject, subject value, api), so merge them or make one match narrower",
                        bucket.name,
                        other.name,
                        first_at.line,
                        describe_subject(rule.0, &rule.1),
                        describe_api(&rule.2),
                    ),
                ));
            }
            rules.insert(rule, (index, buckets.len()));
            buckets.push(bucket);
            // Right after its bucket, out of the one-rule-per-key check: it is the same rule.
            buckets.extend(twin);
        }
        for (index, path) in pending_replaces {
            let bucket = &buckets[index];
            let Some(spec) = &bucket.descriptor else {
                continue;
            };
            for (i, replaced) in spec.replaces.iter().enumerate() {
                let target = buckets.iter().find(|b| *b.name == **replaced);
                let problem = match target {
                    None => Some(format!(
                        "bucket \"{}\" replaces \"{replaced}\", which is no bucket of service \"{name}\"; name a descriptor bucket of the same service",
                        bucket.name
                    )),
                    Some(t) if t.name == bucket.name => Some(format!(
                        "bucket \"{}\" replaces itself; name another descriptor bucket of service \"{name}\"",
                        bucket.name
                    )),
                    Some(t) if t.descriptor.is_none() => Some(format!(
                        "bucket \"{replaced}\" matches HTTP requests, not Envoy descriptors, so no descriptor bucket can replace it"
                    )),
                    Some(_) => None,
                };
                if let Some(message) = problem {
                    return Err(check.at_value(&item(&path, i), message));
                }
            }
        }
        services.push(Service { name, buckets });
    }
    let redis = file
        .redis
        .map(|redis| check_redis(&check, redis))
        .transpose()?;
    Ok(Config {
        version: file.version,
        identity: file.identity,
        control: file.control,
        services,
        redis,
        concurrency: None,
        proxy: ProxySettings::default(),
    })
}

/// A `concurrency:` section: `fixed` takes `limit` and nothing else, the adaptive algorithms
/// `min_limit <= initial_limit <= max_limit` and no `limit`; no limit is 0.
pub(crate) fn concurrency(
    file: super::ConcurrencyFile,
    positions: &Positions,
) -> Result<crate::concurrency::ConcurrencySettings, Located> {
    use crate::concurrency::{
        AlgorithmName, ConcurrencySettings, DEFAULT_INITIAL_LIMIT, DEFAULT_MAX_LIMIT,
        DEFAULT_MIN_LIMIT, LIMIT_CEILING,
    };
    let check = Checker { positions };
    let algorithm = AlgorithmName::from(file.algorithm);
    for (key, value) in [
        ("limit", file.limit),
        ("min_limit", file.min_limit),
        ("max_limit", file.max_limit),
        ("initial_limit", file.initial_limit),
    ] {
        let path = format!("concurrency.{key}");
        match value {
            Some(0) => {
                return Err(check.at_value(
                    &path,
                    format!("{key} 0 admits no request at all; the least is 1 in flight"),
                ));
            }
            Some(n) if n > LIMIT_CEILING => {
                return Err(check.at_value(
                    &path,
                    format!("{key} {n} is more than {LIMIT_CEILING} requests in flight; leave the section out for no limit"),
                ));
            }
            _ => {}
        }
    }
    if algorithm == AlgorithmName::Fixed {
        let Some(limit) = file.limit else {
            return Err(check.at_key(
                "concurrency",
                "algorithm fixed needs `limit`, the requests in flight to the upstream at most, like `limit: 100`; or pick gradient or vegas, which find it",
            ));
        };
        for (key, value) in [
            ("min_limit", file.min_limit),
            ("max_limit", file.max_limit),
            ("initial_limit", file.initial_limit),
        ] {
            if value.is_some() {
                return Err(check.at_key(
                    &format!("concurrency.{key}"),
                    format!("a fixed limit does not move, so it takes no {key}; write only `limit`, or pick gradient or vegas"),
                ));
            }
        }
        return Ok(ConcurrencySettings::fixed(limit));
    }
    if file.limit.is_some() {
        return Err(check.at_key(
            "concurrency.limit",
            format!("`limit` is for algorithm fixed; {algorithm} moves its limit between min_limit and max_limit, starting at initial_limit"),
        ));
    }
    let min = file.min_limit.unwrap_or(DEFAULT_MIN_LIMIT);
    let max = file.max_limit.unwrap_or(DEFAULT_MAX_LIMIT.max(min));
    if min > max {
        let at = if file.max_limit.is_some() {
            "concurrency.max_limit"
        } else {
            "concurrency.min_limit"
        };
        return Err(check.at_value(
            at,
            format!("min_limit ({min}) is above max_limit ({max}); the limit moves between them, so min_limit <= max_limit"),
        ));
    }
    let initial = match file.initial_limit {
        Some(n) if !(min..=max).contains(&n) => {
            return Err(check.at_value(
                "concurrency.initial_limit",
                format!("initial_limit {n} is outside [{min}, {max}] (min_limit, max_limit); start the limit between them"),
            ));
        }
        Some(n) => n,
        None => DEFAULT_INITIAL_LIMIT.clamp(min, max),
    };
    Ok(ConcurrencySettings {
        algorithm,
        min_limit: min,
        max_limit: max,
        initial_limit: initial,
    })
}

/// `control.plausibility`: a multiple under 2 would count a proxy at no more than the median one
/// of its zone, so half of an honest zone could never be counted whole; no proxy serves 0
/// requests a second.
/// Refuses more than [`MAX_BUCKETS`](super::MAX_BUCKETS) buckets, at the first one over.
fn check_bucket_count(check: &Checker<'_>, services: &Services) -> Result<(), Located> {
    let mut seen = 0;
    for (name, service) in &services.0 {
        let count = service.buckets.len();
        if seen + count > super::MAX_BUCKETS {
            let index = super::MAX_BUCKETS - seen;
            let path = item(&child(&child("services", name), "buckets"), index);
            return Err(check.at_value(
                &path,
                format!(
                    "bucket {} of the configuration is over the limit of {} buckets; one bucket \
                     with a subject of \"*\" (`user: \"*\"`) gives every distinct value a quota \
                     of its own",
                    super::MAX_BUCKETS + 1,
                    super::MAX_BUCKETS
                ),
            ));
        }
        seen += count;
    }
    Ok(())
}

fn check_plausibility(check: &Checker<'_>, control: &Control) -> Result<(), Located> {
    let p = &control.plausibility;
    if p.peer_multiple < MIN_PEER_MULTIPLE {
        return Err(check.at_value(
            "control.plausibility.peer_multiple",
            format!(
                "peer_multiple {} is too small: any proxy busier than the median one of its zone would be counted short once it offers more than the limit; use {MIN_PEER_MULTIPLE} or more (the default is 4)",
                p.peer_multiple
            ),
        ));
    }
    if p.max_host_rps == 0 {
        return Err(check.at_value(
            "control.plausibility.max_host_rps",
            "max_host_rps 0 would count every proxy's load as nothing; give the most requests per second one proxy can serve (the default is 1000000)",
        ));
    }
    Ok(())
}

fn check_identity(check: &Checker<'_>, identity: &IdentitySources) -> Result<(), Located> {
    let defaults = IdentitySources::default();
    let keys: [(&str, &Sources, &Sources); 7] = [
        ("caller", &identity.caller, &defaults.caller),
        ("procedure", &identity.procedure, &defaults.procedure),
        ("user", &identity.user, &defaults.user),
        ("org", &identity.org, &defaults.org),
        ("api_key", &identity.api_key, &defaults.api_key),
        ("ip", &identity.ip, &defaults.ip),
        ("criticality", &identity.criticality, &defaults.criticality),
    ];
    for (key, sources, default) in keys {
        for source in &sources.0 {
            let misplaced = match source {
                Source::Path => key != "procedure",
                Source::Peer => key != "ip",
                Source::Header(_) => false,
            };
            if misplaced {
                let fits = if *source == Source::Path {
                    "procedure"
                } else {
                    "ip"
                };
                return Err(check.at_value(
                    &child("identity", key),
                    format!(
                        "`{source}` only fits `{fits}`; read {key} from a header instead, like {default} (the default)"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// `identity.list_headers`: header names, in lower case, once each; not `x-forwarded-for`,
/// whose list is counted from the right past the trusted hops.
fn list_headers(check: &Checker<'_>, names: &[String]) -> Result<Vec<String>, Located> {
    let mut lists = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let path = format!("identity.list_headers[{i}]");
        let is_tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(check.at_value(
                &path,
                format!("{name:?} is not a header name; write the name alone, like x-groups"),
            ));
        }
        let lower = name.to_ascii_lowercase();
        if lower == "x-forwarded-for" {
            return Err(check.at_value(
                &path,
                "x-forwarded-for is always a list, counted from the right past `xff_trusted_hops`; leave it out",
            ));
        }
        if !lists.contains(&lower) {
            lists.push(lower);
        }
    }
    Ok(lists)
}

/// A bucket, and its candidate's twin when it has a candidate.
fn check_bucket(
    check: &Checker<'_>,
    path: &str,
    bucket: BucketFile,
    has_redis: bool,
) -> Result<(Bucket, Option<Bucket>), Located> {
    if !is_name(&bucket.name) {
        return Err(check.at_value(
            &child(path, "name"),
            format!(
                "bucket name \"{}\": use letters, digits, '.', '_' and '-', starting with a letter or digit (it becomes a metric label and a response header)",
                bucket.name
            ),
        ));
    }
    let match_spec = check_match(check, &child(path, "match"), &bucket.match_)?;
    let descriptor = bucket
        .match_
        .descriptor
        .as_ref()
        .map(|d| check_descriptor(check, &child(&child(path, "match"), "descriptor"), d))
        .transpose()?;
    let algorithm = bucket.algorithm;
    let written = |key: &str| check.positions.contains(&child(path, key));
    let algorithm_name = if written("algorithm") {
        format!("algorithm {algorithm}")
    } else {
        format!("algorithm {algorithm} (the default)")
    };
    if bucket.burst.is_some() && !algorithm.takes_burst() {
        return Err(check.at_key(
            &child(path, "burst"),
            format!(
                "{algorithm_name} has no burst; burst applies to token-bucket, leaky-bucket and gcra"
            ),
        ));
    }
    if let Some(window) = bucket.burst_window {
        if algorithm != Algorithm::AdaptiveTokenBucket {
            return Err(check.at_key(
                &child(path, "burst_window"),
                format!(
                    "{algorithm_name} has no burst_window; it applies to adaptive-token-bucket"
                ),
            ));
        }
        if window > MAX_BURST_WINDOW {
            return Err(check.at_value(
                &child(path, "burst_window"),
                format!(
                    "burst_window {} is too long; unused tokens are kept for at most 20s",
                    format_duration(window)
                ),
            ));
        }
    }
    let store = bucket.store.unwrap_or(algorithm.default_store());
    if !algorithm.stores().contains(&store) {
        let advice = match algorithm {
            Algorithm::DropRatio | Algorithm::AdaptiveTokenBucket => {
                "it needs store: control-plane (or leave store out); for an exact count in Redis or in the proxy, pick an algorithm like token-bucket or sliding-window-log"
            }
            _ => {
                "it counts exactly, in the proxy (store: local) or in Redis (store: redis); for a limit computed by the control plane, use algorithm drop-ratio"
            }
        };
        return Err(check.at_value(
            &child(path, "store"),
            format!("store {store} does not fit {algorithm_name}: {advice}"),
        ));
    }
    if store == StateStore::Redis && !has_redis {
        return Err(check.at_value(
            &child(path, "store"),
            "store: redis needs a top-level `redis` section, like `redis: { url: redis://127.0.0.1:6379 }`",
        ));
    }
    if let Some(batch) = bucket.batch {
        check_batch(check, path, &bucket, batch, store, &algorithm_name)?;
    }
    // The rules the control plane sends down write every default out (`cost: 1`), so only a
    // cost other than the default is refused.
    if descriptor.is_some() && written("cost") && bucket.cost != Cost::default() {
        return Err(check.at_key(
            &child(path, "cost"),
            "a descriptor bucket's cost is the hits_addend of Envoy's request (1 when it sends none); leave `cost` out",
        ));
    }
    if let Cost::Header(cost) = &bucket.cost
        && !is_header_name(&cost.header)
    {
        return Err(check.at_value(
            &child(&child(path, "cost"), "header"),
            format!(
                "\"{}\" is not a valid header name; use letters, digits and '-', like x-cost",
                cost.header
            ),
        ));
    }
    let region_limits = check_region_limits(
        check,
        &child(path, "region_limits"),
        (bucket.scope, store),
        bucket.region_limits.as_ref(),
    )?;
    let candidate = bucket
        .candidate
        .as_ref()
        .map(|c| {
            check_candidate(
                check,
                &child(path, "candidate"),
                &bucket,
                (descriptor.is_some(), store),
                c,
            )
        })
        .transpose()?;
    let cost = match bucket.cost {
        Cost::Header(mut cost) => {
            cost.header.make_ascii_lowercase();
            Cost::Header(cost)
        }
        fixed => fixed,
    };
    let checked = Bucket {
        name: bucket.name,
        match_spec,
        descriptor,
        limit: bucket.limit,
        burst: algorithm
            .takes_burst()
            .then(|| bucket.burst.unwrap_or(bucket.limit.count)),
        burst_window: (algorithm == Algorithm::AdaptiveTokenBucket)
            .then(|| bucket.burst_window.unwrap_or(DEFAULT_BURST_WINDOW)),
        scope: bucket.scope,
        mode: bucket.mode,
        algorithm,
        store,
        cost,
        on_store_failure: bucket
            .on_store_failure
            .unwrap_or(default_failure_policy(store)),
        batch: bucket.batch,
        candidate: candidate.clone(),
        region_limits,
    };
    let twin = candidate
        .as_ref()
        .map(|c| checked.candidate_twin(c, bucket.burst));
    Ok((checked, twin))
}

/// A candidate is tried beside an enforcing HTTP bucket: a shadow bucket's limit changes in
/// place, and a descriptor has one bucket.
fn check_candidate(
    check: &Checker<'_>,
    path: &str,
    bucket: &BucketFile,
    (is_descriptor, store): (bool, StateStore),
    candidate: &super::model::CandidateFile,
) -> Result<Candidate, Located> {
    if bucket.mode == Mode::Shadow {
        return Err(check.at_key(
            path,
            "a shadow bucket drops nothing, so its limit can change in place; a candidate is tried beside a bucket that enforces",
        ));
    }
    if is_descriptor {
        return Err(check.at_key(
            path,
            "a descriptor bucket cannot take a candidate: Envoy's descriptor has one bucket; change its limit instead",
        ));
    }
    let since_ms = crate::time::parse_millis(&candidate.since).map_err(|e| {
        check.at_value(
            &child(path, "since"),
            format!("since: {e}; write when the trial began, like 2026-12-03T07:00:00Z"),
        )
    })?;
    let region_limits = check_region_limits(
        check,
        &child(path, "region_limits"),
        (bucket.scope, store),
        candidate.region_limits.as_ref(),
    )?;
    Ok(Candidate {
        limit: candidate.limit,
        since_ms,
        region_limits,
    })
}

/// `region_limits` only on a `scope: region` bucket that each region's controller counts (a
/// global or zone limit is one for every region, and a proxy's own count has no region),
/// keyed by region names.
fn check_region_limits(
    check: &Checker<'_>,
    path: &str,
    (scope, store): (Scope, StateStore),
    limits: Option<&std::collections::BTreeMap<String, Limit>>,
) -> Result<Vec<(String, Limit)>, Located> {
    let Some(limits) = limits else {
        return Ok(Vec::new());
    };
    if store != StateStore::ControlPlane {
        return Err(check.at_key(
            path,
            format!(
                "region_limits are enforced by each region's controller, for a bucket of store: control-plane (drop-ratio, adaptive-token-bucket); a store: {store} bucket counts one limit, so leave region_limits out"
            ),
        ));
    }
    if scope != Scope::Region {
        return Err(check.at_key(
            path,
            format!(
                "region_limits are limits of single regions, for a bucket of scope: region; a {scope} bucket has one limit, so write scope: region or leave region_limits out"
            ),
        ));
    }
    for region in limits.keys() {
        if !is_name(region) {
            return Err(check.at_key(
                &child(path, region),
                format!(
                    "region \"{region}\": name a region as the controllers' --region does, with letters, digits, '.', '_' and '-'"
                ),
            ));
        }
    }
    Ok(limits.iter().map(|(r, l)| (r.clone(), *l)).collect())
}

/// `batch` takes a Redis token bucket's tokens ahead and spends them later, which only fits a
/// store shared through Redis and an algorithm whose state is a count of tokens.
fn check_batch(
    check: &Checker<'_>,
    path: &str,
    bucket: &BucketFile,
    batch: u64,
    store: StateStore,
    algorithm_name: &str,
) -> Result<(), Located> {
    let at = child(path, "batch");
    if store != StateStore::Redis {
        let written = if check.positions.contains(&child(path, "store")) {
            format!("store {store}")
        } else {
            format!("store {store} (the default)")
        };
        return Err(check.at_key(
            &at,
            format!(
                "batch applies to store: redis, where it cuts Redis calls; this bucket has {written}, which makes no Redis calls to batch"
            ),
        ));
    }
    if bucket.algorithm != Algorithm::TokenBucket {
        return Err(check.at_key(
            &at,
            format!(
                "{algorithm_name} cannot batch; batch takes tokens ahead and spends them later, which only algorithm token-bucket allows (a log or a window count is exact only in Redis)"
            ),
        ));
    }
    let capacity = bucket.burst.unwrap_or(bucket.limit.count).get();
    if batch > capacity {
        let held = if bucket.burst.is_some() {
            format!("its burst of {capacity}")
        } else {
            format!("{capacity} (its burst, which defaults to the limit's count)")
        };
        return Err(check.at_value(
            &at,
            format!(
                "batch {batch} is more than the bucket holds, {held}: one proxy would take the whole bucket at once; use a batch of at most {capacity}, or leave batch out"
            ),
        ));
    }
    Ok(())
}

fn check_match(check: &Checker<'_>, path: &str, spec: &MatchFile) -> Result<MatchSpec, Located> {
    if spec.descriptor.is_some() {
        let others = [
            ("caller", spec.caller.is_some()),
            ("procedure", spec.procedure.is_some()),
            ("user", spec.user.is_some()),
            ("org", spec.org.is_some()),
            ("api_key", spec.api_key.is_some()),
            ("ip", spec.ip.is_some()),
        ];
        if let Some((key, _)) = others.iter().find(|(_, present)| *present) {
            return Err(check.at_key(
                &child(path, key),
                format!(
                    "a descriptor bucket matches Envoy descriptors, never HTTP requests, so it takes no `{key}`; put the attribute in the descriptor's entries (as Envoy's rate limit actions send it), or make an HTTP bucket of its own"
                ),
            ));
        }
        return Ok(MatchSpec::default());
    }
    let keyed: [(&str, &Option<String>); 6] = [
        ("caller", &spec.caller),
        ("procedure", &spec.procedure),
        ("user", &spec.user),
        ("org", &spec.org),
        ("api_key", &spec.api_key),
        ("ip", &spec.ip),
    ];
    for (key, value) in keyed {
        if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
            return Err(check.at_value(
                &child(path, key),
                format!(
                    "`{key}` is empty, which no request matches; leave the key out to match any {key}, or write \"*\""
                ),
            ));
        }
    }
    let mut subject: Option<(SubjectKind, &str)> = None;
    let subjects = [
        (SubjectKind::User, &spec.user),
        (SubjectKind::Org, &spec.org),
        (SubjectKind::ApiKey, &spec.api_key),
        (SubjectKind::Ip, &spec.ip),
    ];
    // Report the subject written second in the file, whatever the struct's order.
    let mut written: Vec<(Position, SubjectKind, &str)> = subjects
        .iter()
        .filter_map(|(kind, value)| {
            let value = value.as_deref()?;
            Some((check.positions.key(&child(path, kind.key())), *kind, value))
        })
        .collect();
    written.sort_by_key(|(position, ..)| *position);
    for (position, kind, value) in written {
        if let Some((first, _)) = subject {
            return Err(Located {
                position,
                message: format!(
                    "a match names at most one subject (user, org, api_key or ip), and this one already names `{first}`; make a bucket per subject"
                ),
            });
        }
        subject = Some((kind, value));
    }
    Ok(MatchSpec {
        caller: spec.caller.as_deref().map(Pattern::new),
        procedure: spec.procedure.as_deref().map(Pattern::new),
        subject: subject.map(|(kind, value)| Subject {
            kind,
            value: SubjectValue::new(value),
        }),
    })
}

fn check_descriptor(
    check: &Checker<'_>,
    path: &str,
    descriptor: &DescriptorFile,
) -> Result<DescriptorSpec, Located> {
    if descriptor.domain.trim().is_empty() {
        return Err(check.at_value(
            &child(path, "domain"),
            "the descriptor's domain is empty; write the domain Envoy's rate limit filter sends, like `domain: rl`",
        ));
    }
    let entries_path = child(path, "entries");
    if descriptor.entries.is_empty() {
        return Err(check.at_value(
            &entries_path,
            "a descriptor needs at least one entry, like `entries: [ {key: remote_address} ]`",
        ));
    }
    let mut entries = Vec::with_capacity(descriptor.entries.len());
    for (i, entry) in descriptor.entries.iter().enumerate() {
        let entry_path = item(&entries_path, i);
        if entry.key.is_empty() {
            return Err(check.at_value(
                &child(&entry_path, "key"),
                "the entry's key is empty; write the key Envoy sends, like `key: remote_address`",
            ));
        }
        if entry.key == crate::descriptor::CRITICALITY_KEY {
            return Err(check.at_value(
                &child(&entry_path, "key"),
                "the key `criticality` names a request's tier and is never matched: a descriptor that carries it is matched without it, so leave it out of the bucket's entries",
            ));
        }
        if let Some(value) = &entry.value {
            let at = child(&entry_path, "value");
            if value.is_empty() {
                return Err(check.at_value(
                    &at,
                    "the entry's value is empty; leave `value` out to match any value (each counted apart)",
                ));
            }
            if value.trim_end_matches('*').contains('*') || value.ends_with("**") {
                return Err(check.at_value(
                    &at,
                    format!(
                        "value \"{value}\": a `*` may only end a value (a prefix, like \"shady*\"), as in envoyproxy/ratelimit"
                    ),
                ));
            }
        }
        entries.push(EntrySpec {
            key: entry.key.as_str().into(),
            value: EntryValue::new(entry.value.as_deref()),
        });
    }
    for (i, name) in descriptor.replaces.iter().enumerate() {
        if !is_name(name) {
            return Err(check.at_value(
                &item(&child(path, "replaces"), i),
                format!("\"{name}\" is no bucket name; name a descriptor bucket of this service"),
            ));
        }
    }
    Ok(DescriptorSpec {
        domain: descriptor.domain.as_str().into(),
        entries: entries.into(),
        answer: descriptor.answer,
        replaces: descriptor
            .replaces
            .iter()
            .map(|n| n.as_str().into())
            .collect(),
    })
}

/// S2's unique key: (subject, subject value, api). A rule without a subject key is about its
/// caller; an absent caller or procedure is the same as `*`.
fn rule_key(spec: &MatchSpec) -> (&'static str, String, String) {
    let (subject, value) = match &spec.subject {
        Some(s) => (s.kind.key(), s.value.as_str().to_owned()),
        None => (
            "caller",
            spec.caller.as_ref().map_or("*", Pattern::as_str).to_owned(),
        ),
    };
    let api = spec
        .procedure
        .as_ref()
        .map_or("*", Pattern::as_str)
        .to_owned();
    (subject, value, api)
}

fn describe_subject(subject: &str, value: &str) -> String {
    match (subject, value) {
        ("caller", "*") => "every caller".to_owned(),
        (_, "*") => format!("each {subject}"),
        _ => format!("{subject} \"{value}\""),
    }
}

fn describe_api(api: &str) -> String {
    if api == "*" {
        "every procedure".to_owned()
    } else {
        format!("procedure \"{api}\"")
    }
}

const REDIS_TARGETS: &str = "`url`, `sentinel` or `cluster`";

fn check_redis_url(check: &Checker<'_>, path: &str, url: &str) -> Result<(), Located> {
    let rest = ["redis://", "rediss://", "redis+unix://", "unix://"]
        .iter()
        .find_map(|scheme| url.strip_prefix(scheme));
    match rest {
        Some(rest) if !rest.trim().is_empty() => Ok(()),
        Some(_) => Err(check.at_value(
            path,
            format!(
                "redis address \"{}\" has no host; write redis://HOST:PORT",
                redact_url(url)
            ),
        )),
        None => Err(check.at_value(
            path,
            format!(
                "redis address \"{}\" must start with redis:// or rediss:// (TLS), like redis://127.0.0.1:6379",
                redact_url(url)
            ),
        )),
    }
}

/// `password_file` names a file, and the password is not also written in a URL (which one would
/// win would be a guess).
fn check_password_file(check: &Checker<'_>, redis: &RedisFile) -> Result<(), Located> {
    let Some(file) = &redis.password_file else {
        return Ok(());
    };
    if file.as_os_str().is_empty() || file.to_str().is_some_and(|f| f.trim().is_empty()) {
        return Err(check.at_value(
            "redis.password_file",
            "password_file is empty; name the file that holds the Redis password, like /run/secrets/redis-password",
        ));
    }
    let urls = redis
        .url
        .iter()
        .map(|url| ("redis.url".to_owned(), url))
        .chain(
            redis
                .cluster
                .iter()
                .flatten()
                .enumerate()
                .map(|(i, url)| (item("redis.cluster", i), url)),
        );
    for (path, url) in urls {
        if url_has_password(url) {
            return Err(check.at_value(
                &path,
                format!(
                    "redis address \"{}\" carries a password and redis.password_file is set; keep the password in the file only and write the address without it",
                    redact_url(url)
                ),
            ));
        }
    }
    Ok(())
}

fn check_redis(check: &Checker<'_>, redis: RedisFile) -> Result<Redis, Located> {
    check_password_file(check, &redis)?;
    let password_file = redis.password_file.clone();
    let given: Vec<&str> = [
        ("url", redis.url.is_some()),
        ("sentinel", redis.sentinel.is_some()),
        ("cluster", redis.cluster.is_some()),
    ]
    .into_iter()
    .filter_map(|(key, present)| present.then_some(key))
    .collect();
    if given.is_empty() {
        return Err(check.at_key(
            "redis",
            format!("redis needs one of {REDIS_TARGETS}, like `url: redis://127.0.0.1:6379`"),
        ));
    }
    if given.len() > 1 {
        let mut keys: Vec<(Position, &str)> = given
            .iter()
            .map(|key| (check.positions.key(&child("redis", key)), *key))
            .collect();
        keys.sort();
        return Err(Located {
            position: keys[1].0,
            message: format!(
                "redis takes one of {REDIS_TARGETS}, not both `{}` and `{}`",
                keys[0].1, keys[1].1
            ),
        });
    }
    let target = if let Some(url) = redis.url {
        check_redis_url(check, "redis.url", &url)?;
        RedisTarget::Single { url }
    } else if let Some(sentinel) = redis.sentinel {
        if sentinel.master.trim().is_empty() {
            return Err(check.at_value(
                "redis.sentinel.master",
                "the sentinel master's name is empty; write the name the sentinels monitor, like mymaster",
            ));
        }
        if sentinel.nodes.is_empty() {
            return Err(check.at_value(
                "redis.sentinel.nodes",
                "sentinel needs at least one node, like redis://127.0.0.1:26379",
            ));
        }
        for (i, node) in sentinel.nodes.iter().enumerate() {
            check_redis_url(check, &item("redis.sentinel.nodes", i), node)?;
        }
        RedisTarget::Sentinel {
            master: sentinel.master,
            nodes: sentinel.nodes,
        }
    } else {
        let nodes = redis.cluster.unwrap_or_default();
        if nodes.is_empty() {
            return Err(check.at_value(
                "redis.cluster",
                "cluster needs at least one node, like [redis://127.0.0.1:7000]",
            ));
        }
        for (i, node) in nodes.iter().enumerate() {
            check_redis_url(check, &item("redis.cluster", i), node)?;
        }
        RedisTarget::Cluster { nodes }
    };
    Ok(Redis {
        target,
        timeout: redis.timeout,
        password_file,
    })
}
