//! The `prometheus:URL` source: the Prometheus HTTP API's `query_range` at a step of 60 s, one
//! series at a time and each in chunks of the lookback, so neither side holds more than one
//! chunk of one series.
//!
//! First one instant query finds the series (`group by (service, bucket, caller, procedure)` of
//! the query over a 10-minute subquery of the lookback: a series that lived only between two of
//! its steps is missed); then each series is fetched with a query that selects it alone: the
//! default query with label matchers, a `--query` through `and on(...)` with a vector of its
//! labels.

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufReader;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use ureq::Agent;
use ureq::tls::{RootCerts, TlsConfig, TlsProvider};

use crate::series::{
    HistorySource, MINUTE, Point, SeriesKey, SeriesTarget, SourceError, Trial, Window,
};

/// the configurator's default: offered load per bucket (every decision summed).
pub const DEFAULT_METRIC: &str = "spillway_requests_total";
/// Every decision but `candidate_dropped`, which counts again requests that were decided
///: what was offered.
pub const OFFERED: &str = "decision!=\"candidate_dropped\"";

/// Prometheus refuses a range query of more than 11,000 points per series.
const MAX_POINTS: i64 = 11_000;

/// The discovery subquery's resolution.
const DISCOVERY_STEP: i64 = 600;

/// The largest answer read: a week of one series is about 300 kB.
const MAX_BODY: u64 = 256 * 1024 * 1024;

/// What is asked of Prometheus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    /// `sum by (service, bucket) (rate(spillway_requests_total{decision!="candidate_dropped"}[1m]))`.
    Default,
    /// A PromQL expression whose series carry `service` and `bucket`, or `service`, `caller`
    /// and `procedure`.
    Custom(String),
}

impl Query {
    /// The expression as a user would write it.
    pub fn text(&self) -> String {
        match self {
            Query::Default => {
                format!("sum by (service, bucket) (rate({DEFAULT_METRIC}{{{OFFERED}}}[1m]))")
            }
            Query::Custom(q) => q.clone(),
        }
    }
}

pub struct PrometheusSource {
    base: String,
    agent: Agent,
    query: Query,
    /// Seconds of history per range query.
    chunk: i64,
    keys: Option<std::vec::IntoIter<SeriesKey>>,
}

impl PrometheusSource {
    /// A source for the Prometheus at `base` (`http://host:9090`, or with a path prefix).
    /// `chunk` is how much of the lookback one range query asks for (at most 11,000 minutes).
    pub fn new(base: &str, query: Query, chunk: Duration) -> Result<Self, SourceError> {
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(SourceError::Usage(format!(
                "prometheus:{base}: write the URL of a Prometheus, like prometheus:http://127.0.0.1:9090"
            )));
        }
        let tls = TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .root_certs(RootCerts::PlatformVerifier)
            .build();
        let agent: Agent = Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_global(Some(Duration::from_secs(120)))
            .tls_config(tls)
            .build()
            .into();
        let chunk = (chunk.as_secs() as i64 / MINUTE * MINUTE).clamp(MINUTE, MAX_POINTS * MINUTE);
        Ok(PrometheusSource {
            base: base.trim_end_matches('/').to_owned(),
            agent,
            query,
            chunk,
            keys: None,
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn call(&self, path: &str, params: &[(&str, String)]) -> Result<Data, SourceError> {
        let url = self.url(path);
        let mut request = self.agent.get(&url);
        for (key, value) in params {
            request = request.query(*key, value);
        }
        let response = request.call().map_err(|err| SourceError::Unreachable {
            what: "Prometheus",
            url: self.base.clone(),
            detail: err.to_string(),
        })?;
        let status = response.status().as_u16();
        let reader = BufReader::new(
            response
                .into_body()
                .into_with_config()
                .limit(MAX_BODY)
                .reader(),
        );
        let answer: Result<Answer, _> = serde_json::from_reader(reader);
        match answer {
            Ok(Answer {
                status: ok,
                data: Some(data),
                ..
            }) if ok == "success" && (200..300).contains(&status) => Ok(data),
            Ok(answer) => Err(SourceError::Status {
                what: "Prometheus",
                url: self.base.clone(),
                status,
                detail: format!(
                    "{}{}",
                    answer
                        .error_type
                        .map_or(String::new(), |t| format!("{t}: ")),
                    answer
                        .error
                        .unwrap_or_else(|| "no data in the answer".to_owned())
                ),
            }),
            Err(err) => Err(SourceError::Body {
                what: "Prometheus",
                url: url.clone(),
                detail: format!(
                    "status {status}, not the JSON of the Prometheus HTTP API ({err}); is this a \
                     Prometheus?"
                ),
            }),
        }
    }

    /// The expression whose series are the ones to plan, before any aggregation.
    fn base_expression(&self) -> String {
        match &self.query {
            Query::Default => format!("{DEFAULT_METRIC}{{{OFFERED}}}"),
            Query::Custom(q) => format!("({q})"),
        }
    }

    fn discover(&self, window: Window) -> Result<Vec<SeriesKey>, SourceError> {
        let lookback = window.end - window.start;
        let expr = format!(
            "group by (service, bucket, caller, procedure) (last_over_time({}[{lookback}s:{DISCOVERY_STEP}s]))",
            self.base_expression()
        );
        let data = self.call(
            "/api/v1/query",
            &[("query", expr), ("time", window.end.to_string())],
        )?;
        let mut keys = BTreeSet::new();
        for series in data.result.as_slice() {
            keys.insert(key_of(&series.metric, &self.query)?);
        }
        Ok(keys.into_iter().collect())
    }

    /// The expression that gives `key`'s series alone.
    fn series_expression(&self, key: &SeriesKey) -> String {
        let labels: Vec<(&str, &str)> = match &key.target {
            SeriesTarget::Bucket(bucket) => vec![("service", &key.service), ("bucket", bucket)],
            SeriesTarget::Pair { caller, procedure } => vec![
                ("service", &key.service),
                ("caller", caller),
                ("procedure", procedure),
            ],
        };
        let names: Vec<&str> = labels.iter().map(|(n, _)| *n).collect();
        let by = names.join(", ");
        match &self.query {
            Query::Default => {
                let matchers: Vec<String> = labels
                    .iter()
                    .map(|(n, v)| format!("{n}=\"{}\"", escape(v)))
                    .chain([OFFERED.to_owned()])
                    .collect();
                format!(
                    "sum by ({by}) (rate({DEFAULT_METRIC}{{{}}}[1m]))",
                    matchers.join(",")
                )
            }
            Query::Custom(q) => {
                let mut vector = "vector(1)".to_owned();
                for (name, value) in &labels {
                    // label_replace expands `$1` in its replacement: a literal `$` is `$$`.
                    vector = format!(
                        "label_replace({vector}, \"{name}\", \"{}\", \"\", \"\")",
                        escape(&value.replace('$', "$$"))
                    );
                }
                format!("sum by ({by}) (({q}) and on ({by}) {vector})")
            }
        }
    }
}

/// A PromQL string literal's content.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn key_of(labels: &BTreeMap<String, String>, query: &Query) -> Result<SeriesKey, SourceError> {
    let get = |name: &str| labels.get(name).filter(|v| !v.is_empty());
    let service = get("service");
    let pair = matches!(query, Query::Custom(_))
        .then(|| get("caller").zip(get("procedure")))
        .flatten();
    match (service, pair, get("bucket")) {
        (Some(service), Some((caller, procedure)), _) => {
            Ok(SeriesKey::pair(service, caller, procedure))
        }
        (Some(service), None, Some(bucket)) => Ok(SeriesKey::bucket(service, bucket)),
        _ => {
            let found: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            Err(SourceError::Labels(format!(
                "the query {} gives a series with {}: a proposal needs the labels service and \
                 bucket, or service, caller and procedure (for example sum by (service, bucket) \
                 (...))",
                query.text(),
                if found.is_empty() {
                    "none of the labels service, bucket, caller and procedure".to_owned()
                } else {
                    format!("only {{{}}}", found.join(", "))
                }
            )))
        }
    }
}

impl HistorySource for PrometheusSource {
    fn next_series(
        &mut self,
        window: Window,
        points: &mut Vec<Point>,
    ) -> Result<Option<SeriesKey>, SourceError> {
        points.clear();
        if self.keys.is_none() {
            self.keys = Some(self.discover(window)?.into_iter());
        }
        let Some(key) = self.keys.as_mut().and_then(Iterator::next) else {
            return Ok(None);
        };
        let expr = self.series_expression(&key);
        let mut from = window.start + MINUTE;
        while from <= window.end {
            let to = (from + self.chunk - MINUTE).min(window.end);
            let data = self.call(
                "/api/v1/query_range",
                &[
                    ("query", expr.clone()),
                    ("start", from.to_string()),
                    ("end", to.to_string()),
                    ("step", MINUTE.to_string()),
                ],
            )?;
            for series in data.result.as_slice() {
                for (at, value) in series.values.as_deref().unwrap_or_default() {
                    // A value Prometheus could not compute (NaN, Inf) is a gap.
                    if let Ok(rps) = value.parse::<f64>()
                        && rps.is_finite()
                    {
                        points.push(Point {
                            at: at.round() as i64,
                            rps,
                        });
                    }
                }
            }
            from = to + MINUTE;
        }
        Ok(Some(key))
    }

    fn describe(&self) -> String {
        format!("Prometheus at {} (query {})", self.base, self.query.text())
    }

    /// From Spillway's own counter whatever the query: `increase` over the window of every
    /// decision but `candidate_dropped` (offered) and of `shadow_dropped` or
    /// `candidate_dropped`, at the window's end.
    fn seen(
        &mut self,
        service: &str,
        bucket: &str,
        trial: Trial,
        from_ms: i64,
        until_ms: i64,
    ) -> Result<Option<(f64, f64)>, SourceError> {
        let range = ((until_ms - from_ms) / 1000).max(1);
        let at = (until_ms / 1000).to_string();
        let selector = format!(
            "service=\"{}\",bucket=\"{}\"",
            escape(service),
            escape(bucket)
        );
        let total = |extra: &str| -> Result<f64, SourceError> {
            let query =
                format!("sum(increase(spillway_requests_total{{{selector}{extra}}}[{range}s]))");
            let data = self.call("/api/v1/query", &[("query", query), ("time", at.clone())])?;
            Ok(data
                .result
                .as_slice()
                .iter()
                .filter_map(|s| s.value.as_ref()?.1.parse::<f64>().ok())
                .filter(|v| v.is_finite())
                .sum())
        };
        let offered = total(&format!(",{OFFERED}"))?;
        let would_drop = total(match trial {
            Trial::Shadow => ",decision=\"shadow_dropped\"",
            Trial::Candidate => ",decision=\"candidate_dropped\"",
        })?;
        Ok(Some((offered, would_drop)))
    }
}

#[derive(Deserialize)]
struct Answer {
    status: String,
    data: Option<Data>,
    #[serde(rename = "errorType")]
    error_type: Option<String>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct Data {
    result: Results,
}

/// A vector or a matrix: the same series, with `value` or `values`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Results {
    Series(Vec<Series>),
    Other(serde::de::IgnoredAny),
}

impl Results {
    fn as_slice(&self) -> &[Series] {
        match self {
            Results::Series(s) => s,
            Results::Other(_) => &[],
        }
    }
}

#[derive(Deserialize)]
struct Series {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    values: Option<Vec<(f64, String)>>,
    /// An instant query's one value.
    value: Option<(f64, String)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(query: Query) -> PrometheusSource {
        PrometheusSource::new("http://127.0.0.1:9", query, Duration::from_secs(7 * 86_400)).unwrap()
    }

    #[test]
    fn expressions_select_one_series() {
        let default = source(Query::Default);
        assert_eq!(
            default.series_expression(&SeriesKey::bucket("api", "a\"b")),
            "sum by (service, bucket) (rate(spillway_requests_total{service=\"api\",bucket=\"a\\\"b\",decision!=\"candidate_dropped\"}[1m]))"
        );
        let custom = source(Query::Custom(
            "sum by (service, caller, procedure) (rate(x[1m]))".into(),
        ));
        assert_eq!(
            custom.series_expression(&SeriesKey::pair("api", "gw", "/a$1")),
            "sum by (service, caller, procedure) ((sum by (service, caller, procedure) (rate(x[1m]))) and on (service, caller, procedure) \
             label_replace(label_replace(label_replace(vector(1), \"service\", \"api\", \"\", \"\"), \"caller\", \"gw\", \"\", \"\"), \"procedure\", \"/a$$1\", \"\", \"\"))"
        );
    }

    #[test]
    fn labels_decide_the_target() {
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let custom = Query::Custom("q".into());
        assert_eq!(
            key_of(
                &labels(&[("service", "a"), ("caller", "c"), ("procedure", "/p")]),
                &custom
            )
            .unwrap(),
            SeriesKey::pair("a", "c", "/p")
        );
        assert_eq!(
            key_of(
                &labels(&[("service", "a"), ("bucket", "b")]),
                &Query::Default
            )
            .unwrap(),
            SeriesKey::bucket("a", "b")
        );
        let err = key_of(&labels(&[("caller", "c")]), &custom)
            .unwrap_err()
            .to_string();
        assert!(err.contains("only {caller=\"c\"}"), "{err}");
        let err = key_of(&labels(&[]), &custom).unwrap_err().to_string();
        assert!(err.contains("none of the labels"), "{err}");
    }

    #[test]
    fn a_closed_port_is_unreachable() {
        let mut s = source(Query::Default);
        let err = s
            .next_series(Window::ending(86_400 * 30, 86_400), &mut Vec::new())
            .unwrap_err();
        assert!(matches!(err, SourceError::Unreachable { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("cannot reach Prometheus at http://127.0.0.1:9"),
            "{err}"
        );
    }
}
