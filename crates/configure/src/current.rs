//! The limits in force, from a configuration file or the rules service's rules, reduced to what
//! a plan compares with: per bucket, its rate and whether it is one exact (caller, procedure).

use spillway_core::config::{Config, Scope};
use spillway_core::pattern::{MatchSpec, Pattern, SubjectValue};
use spillway_core::rule::Rule;

/// One bucket in force.
#[derive(Debug, Clone, PartialEq)]
pub struct CurrentBucket {
    pub service: String,
    pub bucket: String,
    /// Set when the bucket matches exactly one caller and one procedure (and no subject): the
    /// bucket a (caller, procedure) series of a `--query` is about.
    pub pair: Option<(String, String)>,
    /// `Some(kind)` for a bucket with a limit per subject value (`user: "*"`): its limit is per
    /// user, its history the bucket's total, so no policy compares the two.
    pub per_subject: Option<String>,
    pub limit_rps: f64,
    /// `Some` for a bucket of `scope: region`, with the limits of single regions it has
    /// (`region_limits`, as rates): what `--per-region` proposes limits of.
    pub regional: Option<Vec<(String, f64)>>,
}

impl CurrentBucket {
    /// The bucket's limit in `region`, as a rate.
    pub fn limit_in(&self, region: &str) -> f64 {
        self.regional
            .iter()
            .flatten()
            .find(|(r, _)| r == region)
            .map_or(self.limit_rps, |(_, l)| *l)
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct CurrentLimits {
    pub buckets: Vec<CurrentBucket>,
}

fn pair_of(spec: &MatchSpec) -> Option<(String, String)> {
    match (&spec.caller, &spec.procedure, &spec.subject) {
        (Some(Pattern::Exact(c)), Some(Pattern::Exact(p)), None) => {
            Some((c.to_string(), p.to_string()))
        }
        _ => None,
    }
}

impl CurrentLimits {
    /// The buckets of a validated configuration file.
    pub fn from_config(config: &Config) -> Self {
        let buckets = config
            .buckets()
            .filter(|(_, bucket)| !bucket.is_candidate())
            .map(|(service, bucket)| CurrentBucket {
                service: service.name.clone(),
                bucket: bucket.name.clone(),
                pair: pair_of(&bucket.match_spec),
                per_subject: bucket
                    .match_spec
                    .subject
                    .as_ref()
                    .filter(|s| s.value == SubjectValue::Each)
                    .map(|s| s.kind.key().to_owned()),
                limit_rps: bucket.limit.per_second(),
                regional: (bucket.scope == Scope::Region).then(|| {
                    bucket
                        .region_limits
                        .iter()
                        .map(|(r, l)| (r.clone(), l.per_second()))
                        .collect()
                }),
            })
            .collect();
        CurrentLimits { buckets }
    }

    /// The rules of `GET /v1/rules`. Incident overrides (rules with `expires_at`) are
    /// temporary and left out: a plan is about the standing limits.
    pub fn from_rules(rules: &[Rule]) -> Self {
        let buckets = rules
            .iter()
            .filter(|rule| !rule.is_override())
            .map(|rule| {
                let bucket = &rule.bucket;
                let matching = &bucket.match_;
                let exact = |p: &Option<String>| p.clone().filter(|t| !t.contains('*'));
                let subjects = [
                    ("user", &matching.user),
                    ("org", &matching.org),
                    ("api_key", &matching.api_key),
                    ("ip", &matching.ip),
                ];
                let only_pair = matching.descriptor.is_none()
                    && subjects.iter().all(|(_, value)| value.is_none());
                let pair = match (exact(&matching.caller), exact(&matching.procedure)) {
                    (Some(c), Some(p)) if only_pair => Some((c, p)),
                    _ => None,
                };
                CurrentBucket {
                    service: rule.service.clone(),
                    bucket: bucket.name.clone(),
                    pair,
                    per_subject: subjects
                        .iter()
                        .find(|(_, value)| value.as_deref() == Some("*"))
                        .map(|(key, _)| (*key).to_owned()),
                    limit_rps: bucket.limit.per_second(),
                    regional: (bucket.scope == Scope::Region).then(|| {
                        bucket
                            .region_limits
                            .iter()
                            .flatten()
                            .map(|(r, l)| (r.clone(), l.per_second()))
                            .collect()
                    }),
                }
            })
            .collect();
        CurrentLimits { buckets }
    }

    pub fn get(&self, service: &str, bucket: &str) -> Option<&CurrentBucket> {
        self.buckets
            .iter()
            .find(|b| b.service == service && b.bucket == bucket)
    }

    /// The bucket of exactly this (caller, procedure) in `service`.
    pub fn find_pair(
        &self,
        service: &str,
        caller: &str,
        procedure: &str,
    ) -> Option<&CurrentBucket> {
        self.buckets.iter().find(|b| {
            b.service == service
                && b.pair
                    .as_ref()
                    .is_some_and(|(c, p)| c == caller && p == procedure)
        })
    }
}

/// The name of a new bucket for a (caller, procedure) pair: `gw-v1-orders` for `gw` and
/// `/v1/orders`, in the characters bucket names allow.
pub fn pair_bucket_name(caller: &str, procedure: &str) -> String {
    let mut name = String::with_capacity(caller.len() + procedure.len() + 1);
    for c in format!("{caller}-{procedure}").chars() {
        let c = if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
            c
        } else {
            '-'
        };
        if !(c == '-' && name.ends_with('-')) {
            name.push(c);
        }
    }
    let name = name
        .trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
        .trim_end_matches('-');
    if name.is_empty() {
        "pair".to_owned()
    } else {
        name.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pair_names() {
        assert_eq!(pair_bucket_name("gw", "/v1/orders"), "gw-v1-orders");
        assert_eq!(pair_bucket_name("-", "/"), "pair");
        assert_eq!(pair_bucket_name("web.app", "GET /a b"), "web.app-GET-a-b");
    }

    #[test]
    fn from_config_and_rules() {
        let yaml = "version: 1\nservices:\n  api:\n    buckets:\n      - name: gw-a\n        match: {caller: gw, procedure: /a}\n        limit: 600/min\n      - name: users\n        match: {user: \"*\"}\n        limit: 5/s\n        algorithm: token-bucket\n";
        let config = spillway_core::config::load_str(yaml, "c.yaml").unwrap();
        let c = CurrentLimits::from_config(&config);
        assert_eq!(c.get("api", "gw-a").unwrap().limit_rps, 10.0);
        assert!(c.find_pair("api", "gw", "/a").is_some());
        assert_eq!(
            c.get("api", "users").unwrap().per_subject.as_deref(),
            Some("user")
        );
        let owned = r#""version": 1, "created_by": "a", "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z""#;
        let rules: Vec<Rule> = serde_json::from_str(&format!(
            r#"[
            {{"id": "1", "service": "api", "name": "gw-a", "match": {{"caller": "gw", "procedure": "/a"}}, "limit": "100/s", {owned}}},
            {{"id": "2", "service": "api", "name": "users", "match": {{"user": "*"}}, "limit": "5/s", {owned}}},
            {{"id": "3", "service": "api", "name": "tmp", "match": {{}}, "limit": "1/s", "expires_at": "2030-01-01T00:00:00Z", {owned}}}
        ]"#
        ))
        .unwrap();
        let r = CurrentLimits::from_rules(&rules);
        assert_eq!(r.buckets.len(), 2);
        assert_eq!(r.find_pair("api", "gw", "/a").unwrap().limit_rps, 100.0);
        assert_eq!(
            r.get("api", "users").unwrap().per_subject.as_deref(),
            Some("user")
        );
        assert!(r.get("api", "users").unwrap().pair.is_none());
    }
}
