//! A rule: one bucket of the configuration file plus its `service`, validated by
//! spillway-core so that the rules service and the YAML file accept exactly the same buckets.

use std::time::Duration;

use serde_json::{Map, Value, json};
use spillway_core::config::{self, BucketFile, Config, ConfigFile};
use spillway_core::limit::{format_duration, parse_duration};

pub use spillway_core::rule::Rule;

/// Why a rule or a configuration was refused; the message is core's own when core refused it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("{0}")]
    Invalid(String),
}

/// Keys an answer adds to a rule; a client may send them back (GET, edit, PUT) and they are
/// ignored, since the service owns them.
const READ_ONLY: [&str; 6] = [
    "id",
    "version",
    "created_by",
    "created_at",
    "updated_at",
    "expires_at",
];

/// A single rule cannot carry the `redis` section, but core requires one for `store: redis`;
/// the consumers (controller, proxy) bring their own.
const PLACEHOLDER_REDIS: &str = "redis://127.0.0.1:6379";

/// The most bytes a `reason` may hold, wherever it is sent: a paragraph and a link or two. The
/// audit log keeps every reason for good, so it is bounded.
pub const MAX_REASON_BYTES: usize = 4096;

/// What the service stores at most, beyond what core checks of a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The longest `ttl` an incident override may have (`rules serve --max-override-ttl`).
    pub max_override_ttl: Duration,
}

impl Default for Bounds {
    /// A week: an override outliving its incident by more than that should be a rule.
    fn default() -> Self {
        Bounds {
            max_override_ttl: Duration::from_secs(7 * 86_400),
        }
    }
}

impl Bounds {
    /// Refuses an override whose `ttl` is longer than the maximum.
    pub fn check(&self, input: &RuleInput) -> Result<(), RuleError> {
        match input.ttl {
            Some(ttl) if ttl > self.max_override_ttl => Err(invalid(format!(
                "ttl {} is longer than the maximum of {} this service allows \
                 (rules serve --max-override-ttl); an override that long should be a permanent rule",
                format_duration(ttl),
                format_duration(self.max_override_ttl)
            ))),
            _ => Ok(()),
        }
    }
}

/// Refuses a `reason` longer than [`MAX_REASON_BYTES`] or holding a NUL (which PostgreSQL cannot
/// store, so it is refused on both stores alike), saying where it came from.
pub fn check_reason(reason: Option<&str>, place: &str) -> Result<(), String> {
    match reason {
        Some(text) if text.len() > MAX_REASON_BYTES => Err(format!(
            "{place} is {} bytes long; at most {MAX_REASON_BYTES} are kept, so shorten it or link to \
             the incident instead",
            text.len()
        )),
        Some(text) if text.contains('\0') => Err(format!(
            "{place} contains the NUL character (U+0000), which cannot be stored"
        )),
        _ => Ok(()),
    }
}

/// A rule as a client sends it, checked by core.
#[derive(Debug, Clone)]
pub struct RuleInput {
    pub service: String,
    pub bucket: BucketFile,
    /// An incident override expires by itself after this long.
    pub ttl: Option<Duration>,
    /// Why the change was made; kept in the audit log and, for an override, on the rule.
    pub reason: Option<String>,
    /// What the per-subject quota columns hold.
    pub key: RuleKey,
}

/// The per-subject quota columns derived from the validated bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleKey {
    pub subject_scope: &'static str,
    pub subject_value: String,
    pub api: String,
    pub algorithm: &'static str,
    pub max_requests: i64,
    pub window_seconds: f64,
    pub burst_size: Option<i64>,
    pub scope: &'static str,
    pub mode: &'static str,
    pub store: &'static str,
    pub on_store_failure: &'static str,
}

fn invalid(message: impl Into<String>) -> RuleError {
    RuleError::Invalid(message.into())
}

/// PostgreSQL cannot store U+0000 in text, so it is refused on both stores alike.
fn check_no_nul(value: &Value) -> Result<(), RuleError> {
    let bad = match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => return items.iter().try_for_each(check_no_nul),
        Value::Object(map) => {
            for (key, value) in map {
                if key.contains('\0') {
                    return Err(invalid("text may not contain the NUL character (U+0000)"));
                }
                check_no_nul(value)?;
            }
            false
        }
        _ => false,
    };
    if bad {
        return Err(invalid("text may not contain the NUL character (U+0000)"));
    }
    Ok(())
}

/// JSON has one kind of number, so `5.0` is the whole number 5; the YAML loader that validates
/// a rule would read it as a float and refuse it where a count is due. Writes such numbers as
/// whole numbers, and says whether there was one.
pub fn whole_numbers(value: &mut Value) -> bool {
    match value {
        Value::Number(n) if !n.is_i64() && !n.is_u64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            // 2^64 itself is past u64::MAX; every float below it converts exactly.
            let whole = if f.fract() != 0.0 {
                None
            } else if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
                Some(json!(f as u64))
            } else if (-9_223_372_036_854_775_808.0..0.0).contains(&f) {
                Some(json!(f as i64))
            } else {
                None
            };
            match whole {
                Some(whole) => {
                    *value = whole;
                    true
                }
                None => false,
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |seen, v| whole_numbers(v) | seen),
        Value::Object(map) => map
            .values_mut()
            .fold(false, |seen, v| whole_numbers(v) | seen),
        _ => false,
    }
}

fn take_string(map: &mut Map<String, Value>, key: &str) -> Result<Option<String>, RuleError> {
    match map.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(invalid(format!("`{key}` must be a string, not {other}"))),
    }
}

/// Checks a rule sent as JSON: `service`, the bucket keys of a configuration file, and optionally `ttl` (an
/// incident override, which then needs a `reason`) and `reason`.
pub fn parse_rule(body: Value) -> Result<RuleInput, RuleError> {
    let Value::Object(mut map) = body else {
        return Err(invalid(
            "a rule is a JSON object: a bucket of the configuration file plus its `service`",
        ));
    };
    check_no_nul(&Value::Object(map.clone()))?;
    for key in READ_ONLY {
        map.remove(key);
    }
    for value in map.values_mut() {
        whole_numbers(value);
    }
    let service = take_string(&mut map, "service")?
        .ok_or_else(|| invalid("a rule needs its `service`, the protected service it limits"))?;
    let ttl = take_string(&mut map, "ttl")?
        .map(|text| parse_duration(&text).map_err(|e| invalid(format!("ttl: {e}"))))
        .transpose()?;
    let reason = take_string(&mut map, "reason")?;
    check_reason(reason.as_deref(), "`reason`").map_err(invalid)?;
    if ttl.is_some() && reason.as_deref().is_none_or(|r| r.trim().is_empty()) {
        return Err(invalid(
            "an incident override (a rule with a `ttl`) needs a `reason` for the audit log",
        ));
    }
    let bucket = Value::Object(map);
    let config = validate(&[(service.clone(), vec![bucket.clone()])])?;
    let compiled = &config.services[0].buckets[0];
    let bucket: BucketFile = serde_json::from_value(bucket).map_err(|e| invalid(e.to_string()))?;
    Ok(RuleInput {
        service,
        key: key_of(compiled),
        bucket,
        ttl,
        reason,
    })
}

/// The per-subject quota columns of a validated bucket. A rule's subject is its match's subject key, or
/// `caller` when it has none; an absent caller or procedure is `*`, as core reads it.
pub fn key_of(bucket: &config::Bucket) -> RuleKey {
    let spec = &bucket.match_spec;
    let (subject_scope, subject_value) = match &spec.subject {
        Some(subject) => (subject.kind.key(), subject.value.as_str().to_owned()),
        None => (
            "caller",
            spec.caller.as_ref().map_or("*", |p| p.as_str()).to_owned(),
        ),
    };
    RuleKey {
        subject_scope,
        subject_value,
        api: spec
            .procedure
            .as_ref()
            .map_or("*", |p| p.as_str())
            .to_owned(),
        algorithm: bucket.algorithm.name(),
        max_requests: i64::try_from(bucket.limit.count.get()).unwrap_or(i64::MAX),
        window_seconds: bucket.limit.period.as_secs_f64(),
        burst_size: bucket
            .burst
            .map(|b| i64::try_from(b.get()).unwrap_or(i64::MAX)),
        scope: bucket.scope.name(),
        mode: bucket.mode.name(),
        store: bucket.store.name(),
        on_store_failure: bucket.on_store_failure.name(),
    }
}

/// Runs core's loader over buckets grouped by service, as if they were one file.
pub fn validate(services: &[(String, Vec<Value>)]) -> Result<Config, RuleError> {
    let mut map = Map::new();
    for (service, buckets) in services {
        map.insert(service.clone(), json!({ "buckets": buckets }));
    }
    let text = json!({
        "version": 1,
        "services": map,
        "redis": { "url": PLACEHOLDER_REDIS },
    })
    .to_string();
    let mut config =
        config::load_str(&yaml_printable(&text), "rule").map_err(|e| invalid(e.message()))?;
    config.redis = None;
    Ok(config)
}

/// JSON text is YAML, except that YAML forbids or folds some characters that JSON leaves raw in
/// its strings (DEL, the C1 controls, NEL, U+2028, U+FFFE, ...). Every character past ASCII can
/// only occur inside a string here, so each is written as a YAML escape, which means the same.
pub(crate) fn yaml_printable(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        let code = u32::from(c);
        match code {
            0..0x7f => out.push(c),
            0x7f..=0xffff => out.push_str(&format!("\\u{code:04x}")),
            _ => out.push_str(&format!("\\U{code:08x}")),
        }
    }
    out
}

/// A whole configuration for `POST /v1/rules:apply`, YAML or JSON, checked exactly as
/// `spillway check` checks a file; errors carry `apply:LINE:COLUMN`.
pub fn parse_config(text: &str) -> Result<Vec<(String, BucketFile)>, RuleError> {
    if text.contains('\0') {
        return Err(invalid("text may not contain the NUL character (U+0000)"));
    }
    config::load_str(text, "apply").map_err(|e| invalid(e.to_string()))?;
    let file: ConfigFile = yaml_serde::from_str(text).map_err(|e| invalid(e.to_string()))?;
    Ok(file
        .services
        .0
        .into_iter()
        .flat_map(|(service, s)| s.buckets.into_iter().map(move |b| (service.clone(), b)))
        .collect())
}

/// The validated input of a bucket that came from a configuration file.
pub fn input_of(service: String, bucket: BucketFile) -> Result<RuleInput, RuleError> {
    let value = serde_json::to_value(&bucket).map_err(|e| invalid(e.to_string()))?;
    let config = validate(&[(service.clone(), vec![value])])?;
    Ok(RuleInput {
        key: key_of(&config.services[0].buckets[0]),
        service,
        bucket,
        ttl: None,
        reason: None,
    })
}
