//! What a plan is asked for: the policy and its parameters per service (flags are the
//! defaults, `--policy-file` overrides them per service) and the quotas of the `fixed` policy.
//! Bad values are refused where they are read, with the file, line and column.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

/// Which policy proposes the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    Historical,
    Forecast,
    Fixed,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 3] = [
        PolicyKind::Historical,
        PolicyKind::Forecast,
        PolicyKind::Fixed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Historical => "historical",
            PolicyKind::Forecast => "forecast",
            PolicyKind::Fixed => "fixed",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PolicyKind {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.name() == text)
            .ok_or_else(|| format!("policy \"{text}\": use historical, forecast or fixed"))
    }
}

/// How much above the evidence a limit goes: a fixed share, or one derived from the history's
/// own volatility (`auto`, the buffer tuned to the series; see [`crate::policy`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Headroom {
    Fixed(f64),
    Auto,
}

/// The parameters of one service's proposals; the configurator's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub policy: PolicyKind,
    /// The quantile of the lookback's minutes that `historical` starts from (0 < q <= 1).
    pub quantile: f64,
    pub headroom: Headroom,
    /// A proposal stays within [current / (1 + C), current × (1 + C)] (C >= 0).
    pub max_change: f64,
    /// Never below this (requests/s); by default current / (1 + C).
    pub floor: Option<f64>,
    /// Never above this (requests/s).
    pub ceiling: Option<f64>,
}

pub const DEFAULT_QUANTILE: f64 = 0.999;
pub const DEFAULT_HEADROOM: f64 = 0.25;
pub const DEFAULT_MAX_CHANGE: f64 = 1.0;

impl Default for Params {
    fn default() -> Self {
        Params {
            policy: PolicyKind::Historical,
            quantile: DEFAULT_QUANTILE,
            headroom: Headroom::Fixed(DEFAULT_HEADROOM),
            max_change: DEFAULT_MAX_CHANGE,
            floor: None,
            ceiling: None,
        }
    }
}

impl Params {
    /// The checks no single value can make: a floor above the ceiling.
    pub fn check(&self) -> Result<(), String> {
        check_quantile(self.quantile)?;
        if let Headroom::Fixed(h) = self.headroom {
            check_headroom(h)?;
        }
        check_max_change(self.max_change)?;
        for (name, value) in [("floor", self.floor), ("ceiling", self.ceiling)] {
            if let Some(v) = value {
                check_limit(name, v)?;
            }
        }
        if let (Some(floor), Some(ceiling)) = (self.floor, self.ceiling)
            && floor > ceiling
        {
            return Err(format!(
                "the floor {floor} is above the ceiling {ceiling}: a limit cannot be both"
            ));
        }
        Ok(())
    }
}

pub fn check_quantile(q: f64) -> Result<f64, String> {
    if q > 0.0 && q <= 1.0 {
        Ok(q)
    } else {
        Err(format!(
            "quantile {q}: write a number above 0 and at most 1, like 0.999"
        ))
    }
}

pub fn check_headroom(h: f64) -> Result<f64, String> {
    if (0.0..=10.0).contains(&h) {
        Ok(h)
    } else {
        Err(format!(
            "headroom {h}: write a share from 0 to 10 (0.25 is 25% above the evidence), or auto"
        ))
    }
}

pub fn check_max_change(c: f64) -> Result<f64, String> {
    if (0.0..=100.0).contains(&c) {
        Ok(c)
    } else {
        Err(format!(
            "max-change {c}: write a share from 0 to 100 (1.0 lets a limit double or halve per cycle)"
        ))
    }
}

pub fn check_limit(name: &str, v: f64) -> Result<f64, String> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(format!(
            "{name} {v}: write a rate above zero in requests per second"
        ))
    }
}

impl FromStr for Headroom {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text.trim() == "auto" {
            return Ok(Headroom::Auto);
        }
        let value: f64 = text.trim().parse().map_err(|_| {
            format!(
                "headroom \"{text}\": write a share like 0.25 (25% above the evidence), or auto"
            )
        })?;
        check_headroom(value).map(Headroom::Fixed)
    }
}

impl<'de> Deserialize<'de> for Headroom {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Headroom;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a share like 0.25, or auto")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Headroom, E> {
                check_headroom(v).map(Headroom::Fixed).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Headroom, E> {
                self.visit_f64(v as f64)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Headroom, E> {
                self.visit_f64(v as f64)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Headroom, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A positive rate in requests per second: a number (`250`, `0.5`) or a limit as the
/// configuration file writes it (`"250/s"`, `"9000/min"`, `"100 per 30s"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanRate(pub f64);

impl<'de> Deserialize<'de> for PlanRate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = PlanRate;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a rate in requests per second (250) or a limit like \"250/s\"")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<PlanRate, E> {
                check_limit("rate", v).map(PlanRate).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PlanRate, E> {
                self.visit_f64(v as f64)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PlanRate, E> {
                self.visit_f64(v as f64)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<PlanRate, E> {
                spillway_core::limit::Limit::parse(v)
                    .map(|l| PlanRate(l.per_second()))
                    .map_err(E::custom)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A quantile read from a file, checked as it is read.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(try_from = "f64")]
struct Quantile(f64);

impl TryFrom<f64> for Quantile {
    type Error = String;
    fn try_from(q: f64) -> Result<Self, String> {
        check_quantile(q).map(Quantile)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(try_from = "f64")]
struct MaxChange(f64);

impl TryFrom<f64> for MaxChange {
    type Error = String;
    fn try_from(c: f64) -> Result<Self, String> {
        check_max_change(c).map(MaxChange)
    }
}

/// A file's error at a place in it: `FILE:LINE:COLUMN: what is wrong`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {message}", .at.map_or(String::new(), |(l, c)| format!(":{l}:{c}")))]
pub struct FileError {
    pub file: String,
    pub at: Option<(usize, usize)>,
    pub message: String,
}

fn yaml_error(file: &str, err: &yaml_serde::Error) -> FileError {
    FileError {
        file: file.to_owned(),
        at: err.location().map(|l| (l.line(), l.column())),
        // The location is said once, in front.
        message: {
            let text = err.to_string();
            match text.rsplit_once(" at line ") {
                Some((head, _)) => head.to_owned(),
                None => text,
            }
        },
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceEntry {
    policy: Option<PolicyKind>,
    quantile: Option<Quantile>,
    headroom: Option<Headroom>,
    max_change: Option<MaxChange>,
    floor: Option<PlanRate>,
    ceiling: Option<PlanRate>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFileText {
    services: BTreeMap<String, ServiceEntry>,
}

/// `--policy-file`: `services: {NAME: {policy: forecast, headroom: 0.3}}`; what a service
/// does not say comes from the flags.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PolicyFile {
    pub services: BTreeMap<String, Params>,
}

impl PolicyFile {
    /// Reads the file's text over `defaults`; `file` names it in errors.
    pub fn parse(text: &str, file: &str, defaults: &Params) -> Result<PolicyFile, FileError> {
        let parsed: PolicyFileText =
            yaml_serde::from_str(text).map_err(|e| yaml_error(file, &e))?;
        let mut services = BTreeMap::new();
        for (name, entry) in parsed.services {
            let params = Params {
                policy: entry.policy.unwrap_or(defaults.policy),
                quantile: entry.quantile.map_or(defaults.quantile, |q| q.0),
                headroom: entry.headroom.unwrap_or(defaults.headroom),
                max_change: entry.max_change.map_or(defaults.max_change, |c| c.0),
                floor: entry.floor.map(|r| r.0).or(defaults.floor),
                ceiling: entry.ceiling.map(|r| r.0).or(defaults.ceiling),
            };
            params.check().map_err(|message| FileError {
                file: file.to_owned(),
                at: None,
                message: format!("services.{name}: {message}"),
            })?;
            services.insert(name, params);
        }
        Ok(PolicyFile { services })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaEntry {
    service: String,
    bucket: String,
    limit: PlanRate,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaFileText {
    quotas: Vec<QuotaEntry>,
}

/// One contract quota of the `fixed` policy.
#[derive(Debug, Clone, PartialEq)]
pub struct ContractQuota {
    pub service: String,
    pub bucket: String,
    pub limit_rps: f64,
}

/// `--quota-file`: `quotas: [{service, bucket, limit}]`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QuotaFile {
    pub file: String,
    pub quotas: Vec<ContractQuota>,
}

impl QuotaFile {
    pub fn parse(text: &str, file: &str) -> Result<QuotaFile, FileError> {
        let parsed: QuotaFileText = yaml_serde::from_str(text).map_err(|e| yaml_error(file, &e))?;
        let mut seen = std::collections::BTreeSet::new();
        let mut quotas = Vec::with_capacity(parsed.quotas.len());
        for (i, entry) in parsed.quotas.into_iter().enumerate() {
            if !seen.insert((entry.service.clone(), entry.bucket.clone())) {
                return Err(FileError {
                    file: file.to_owned(),
                    at: None,
                    message: format!(
                        "quotas[{i}]: a second quota for {}/{}: give each bucket one",
                        entry.service, entry.bucket
                    ),
                });
            }
            quotas.push(ContractQuota {
                service: entry.service,
                bucket: entry.bucket,
                limit_rps: entry.limit.0,
            });
        }
        Ok(QuotaFile {
            file: file.to_owned(),
            quotas,
        })
    }

    pub fn get(&self, service: &str, bucket: &str) -> Option<&ContractQuota> {
        self.quotas
            .iter()
            .find(|q| q.service == service && q.bucket == bucket)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CapacityEntry {
    #[serde(default)]
    service: Option<String>,
    from: String,
    until: String,
    multiplier: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CapacityFileText {
    capacity: Vec<CapacityEntry>,
}

/// One planned change of capacity: every day from `from_day` to `until_day` (Unix days, both
/// included), `service`'s (or every service's) traffic is expected at `multiplier` times what
/// the history says.
#[derive(Debug, Clone, PartialEq)]
pub struct Capacity {
    pub service: Option<String>,
    pub from_day: i64,
    pub until_day: i64,
    pub multiplier: f64,
}

/// The largest multiplier a planned-capacity file may give: a forecast of 100 times the
/// history is a new service, not a season.
pub const MAX_CAPACITY_MULTIPLIER: f64 = 100.0;

/// `--capacity-file`, for `forecast`: `capacity: [{service?, from, until, multiplier}]`, dates
/// like `2026-12-24` (a planned launch, a sale, a holiday: what the history cannot know).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CapacityFile {
    pub file: String,
    pub entries: Vec<Capacity>,
}

impl CapacityFile {
    pub fn parse(text: &str, file: &str) -> Result<CapacityFile, FileError> {
        let parsed: CapacityFileText =
            yaml_serde::from_str(text).map_err(|e| yaml_error(file, &e))?;
        let wrong = |i: usize, message: String| FileError {
            file: file.to_owned(),
            at: None,
            message: format!("capacity[{i}]: {message}"),
        };
        let mut entries = Vec::with_capacity(parsed.capacity.len());
        for (i, entry) in parsed.capacity.into_iter().enumerate() {
            let day = |key: &str, text: &str| {
                crate::time::parse_time(text)
                    .map(|secs| secs.div_euclid(86_400))
                    .map_err(|e| wrong(i, format!("{key}: {e}")))
            };
            let from_day = day("from", &entry.from)?;
            let until_day = day("until", &entry.until)?;
            if until_day < from_day {
                return Err(wrong(
                    i,
                    format!(
                        "until {} is before from {}: both days are included, so write the last \
                         day after the first",
                        entry.until, entry.from
                    ),
                ));
            }
            if !(entry.multiplier > 0.0 && entry.multiplier <= MAX_CAPACITY_MULTIPLIER) {
                return Err(wrong(
                    i,
                    format!(
                        "multiplier {}: write how many times the usual traffic is expected, \
                         above 0 and at most {MAX_CAPACITY_MULTIPLIER}, like 1.5",
                        entry.multiplier
                    ),
                ));
            }
            entries.push(Capacity {
                service: entry.service,
                from_day,
                until_day,
                multiplier: entry.multiplier,
            });
        }
        Ok(CapacityFile {
            file: file.to_owned(),
            entries,
        })
    }

    /// The multiplier of `service` on the day holding `at` (Unix seconds): the largest of the
    /// entries that cover it, 1 without one.
    pub fn multiplier(&self, service: &str, at: i64) -> f64 {
        let day = at.div_euclid(86_400);
        self.entries
            .iter()
            .filter(|c| c.service.as_deref().is_none_or(|s| s == service))
            .filter(|c| (c.from_day..=c.until_day).contains(&day))
            .map(|c| c.multiplier)
            .reduce(f64::max)
            .unwrap_or(1.0)
    }
}

/// Everything a plan is asked for besides the history and the current limits.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The flags' parameters: services the policy file does not name.
    pub defaults: Params,
    pub policy_file: PolicyFile,
    pub quotas: Option<QuotaFile>,
    /// `forecast`'s planned capacity (`--capacity-file`).
    pub capacity: Option<CapacityFile>,
    /// Below this share of the lookback's minutes a series gets `keep` (gaps).
    pub min_coverage: f64,
}

/// By default half of the lookback's minutes must have a value.
pub const DEFAULT_MIN_COVERAGE: f64 = 0.5;

impl Settings {
    pub fn new(defaults: Params) -> Self {
        Settings {
            defaults,
            policy_file: PolicyFile::default(),
            quotas: None,
            capacity: None,
            min_coverage: DEFAULT_MIN_COVERAGE,
        }
    }

    pub fn params(&self, service: &str) -> &Params {
        self.policy_file
            .services
            .get(service)
            .unwrap_or(&self.defaults)
    }

    /// Whether some service's policy is `fixed`, which needs a quota file.
    pub fn uses(&self, kind: PolicyKind) -> bool {
        self.defaults.policy == kind || self.policy_file.services.values().any(|p| p.policy == kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_file_over_the_flags() {
        let text = "services:\n  api:\n    policy: forecast\n    headroom: 0.3\n  web:\n    headroom: auto\n    floor: 10/s\n";
        let file = PolicyFile::parse(text, "p.yaml", &Params::default()).unwrap();
        let api = &file.services["api"];
        assert_eq!(api.policy, PolicyKind::Forecast);
        assert_eq!(api.headroom, Headroom::Fixed(0.3));
        assert_eq!(api.quantile, DEFAULT_QUANTILE);
        let web = &file.services["web"];
        assert_eq!(web.headroom, Headroom::Auto);
        assert_eq!(web.floor, Some(10.0));
    }

    #[test]
    fn bad_policy_files_say_where() {
        let cases = [
            (
                "services:\n  api:\n    polcy: forecast\n",
                "p.yaml:3:5: services.api: unknown field `polcy`",
            ),
            (
                "services:\n  api:\n    quantile: 1.5\n",
                "p.yaml:3:5: services.api: quantile 1.5",
            ),
            (
                "services:\n  api:\n    policy: guess\n",
                "p.yaml:3:13: services.api.policy: unknown variant `guess`",
            ),
            (
                "services:\n  api:\n    floor: 9\n    ceiling: 3\n",
                "p.yaml: services.api: the floor 9 is above the ceiling 3",
            ),
        ];
        for (text, want) in cases {
            let err = PolicyFile::parse(text, "p.yaml", &Params::default())
                .unwrap_err()
                .to_string();
            assert!(err.starts_with(want), "{err}\n  wanted {want}");
        }
    }

    #[test]
    fn quota_files() {
        let ok = "quotas:\n  - {service: api, bucket: gw, limit: 250}\n  - {service: api, bucket: b, limit: 600/min}\n";
        let q = QuotaFile::parse(ok, "q.yaml").unwrap();
        assert_eq!(q.get("api", "gw").unwrap().limit_rps, 250.0);
        assert_eq!(q.get("api", "b").unwrap().limit_rps, 10.0);
        let cases = [
            (
                "quotas:\n  - {service: api, bucket: gw, limit: 0}\n",
                "q.yaml:2:",
            ),
            ("quotas:\n  - {service: api, bucket: gw}\n", "q.yaml:2:"),
            (
                "quotas:\n  - {service: api, bucket: gw, limit: fast}\n",
                "q.yaml:2:",
            ),
            ("quotas: {api: 3}\n", "q.yaml:1:"),
            (
                "quotas:\n  - {service: a, bucket: b, limit: 1}\n  - {service: a, bucket: b, limit: 2}\n",
                "q.yaml: quotas[1]: a second quota",
            ),
        ];
        for (text, want) in cases {
            let err = QuotaFile::parse(text, "q.yaml").unwrap_err().to_string();
            assert!(err.starts_with(want), "{err}\n  wanted {want}");
        }
    }
}
