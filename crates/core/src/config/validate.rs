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
    Algorithm, BucketFile, ConfigFile, Control, Cost, CostResponse, DescriptorFile, FailurePolicy,
    HITS_ADDEND, IdentitySources, MIN_PEER_MULTIPLE, MatchFile, Mode, RedisFile, ResponseSource,
    Scope, SentinelFile, Services, Source, Sources, StateStore, is_header_name,
};
use super::positions::{Located, Position, Positions, child, item};
use super::secret::{redact_url, url_has_password};
use crate::descriptor::{DescriptorSpec, EntrySpec, EntryValue};
use crate::limit::{Limit, format_duration};
use crate::pattern::{MatchSpec, Pattern, Subject, SubjectKind, SubjectValue};

pub use super::model::NAME_PATTERN;

mod bucket;
mod matching;
mod redis;
mod sections;
use self::bucket::check_bucket;
use self::matching::{describe_api, describe_subject, rule_key};
use self::redis::check_redis;
use self::sections::{check_bucket_count, check_identity, check_plausibility, list_headers};
pub(crate) use self::sections::{concurrency, proxy};

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

    /// Units the bucket holds when full: its burst, else its limit's count.
    pub fn holds(&self) -> u64 {
        self.burst.unwrap_or(self.limit.count).get()
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
