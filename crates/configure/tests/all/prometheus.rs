//! The Prometheus adapter against a real Prometheus (Debian's `prometheus` and `promtool`),
//! loaded with four weeks of synthetic history through `promtool tsdb create-blocks-from
//! openmetrics`: a daily and a weekly season, a trend, noise and spikes. The expected limits are
//! computed here, from the history the test wrote, with a quantile and a rounding of its own.
//!
//! Skips (with a message) when the binaries are missing, unless SPILLWAY_REQUIRE_PROMETHEUS is
//! set: then a missing binary fails the test.

use std::collections::BTreeMap;
use std::f64::consts::TAU;
use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use spillway_configure::plan::Clamp;
use spillway_configure::prometheus::{PrometheusSource, Query};
use spillway_configure::{
    CurrentBucket, CurrentLimits, HistorySource, Params, PlanAction, PlanError, Point, PolicyKind,
    SeriesKey, Settings, SourceError, Trial, Window,
};

const MINUTE: i64 = 60;
const DAY: i64 = 86_400;

/// Both binaries, or `None` when the test should skip.
fn binaries() -> Option<(PathBuf, PathBuf)> {
    let found = |name| {
        spillway_testkit::tools::on_path(
            name,
            "Debian's prometheus package",
            "SPILLWAY_REQUIRE_PROMETHEUS",
        )
    };
    Some((found("prometheus")?, found("promtool")?))
}

/// The test's own history: the rate (requests/s) of each minute ending at `at`.
#[derive(Clone, Copy)]
struct Truth {
    base: f64,
    daily: f64,
    weekend: f64,
    trend_per_week: f64,
    noise: f64,
    /// Spikes: every `spike_every` days, 3 minutes at `spike_factor` times the rate.
    spike_every: i64,
    spike_factor: f64,
    seed: u64,
}

impl Truth {
    fn rate(&self, at: i64, origin: i64) -> f64 {
        let minute = at / MINUTE;
        let day_frac = (at - 30).rem_euclid(DAY) as f64 / DAY as f64;
        let daily = 1.0 + self.daily * (TAU * (day_frac - 0.6)).cos();
        let weekday = (at - 30).div_euclid(DAY).rem_euclid(7);
        let weekly = if weekday == 2 || weekday == 3 {
            1.0 - self.weekend
        } else {
            1.0
        };
        let trend = 1.0 + self.trend_per_week * (at - origin) as f64 / (7 * DAY) as f64;
        // A hash of the minute as noise: uniform in [-1, 1].
        let h = (minute as u64 ^ self.seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let u = ((h >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0;
        let mut rate = self.base * daily * weekly * trend * (1.0 + self.noise * u);
        let day = (at - 30).div_euclid(DAY);
        let in_day = (at - 30).rem_euclid(DAY) / MINUTE;
        if self.spike_every > 0 && day % self.spike_every == 0 && (600..603).contains(&in_day) {
            rate *= self.spike_factor;
        }
        // Whole requests per 30 s sample keep the counters exact in floating point.
        (rate * 30.0).round() / 30.0
    }
}

struct Fixture {
    url: String,
    window: Window,
    truths: BTreeMap<&'static str, (Truth, Vec<f64>)>,
    _prometheus: Guard,
    _dir: tempfile::TempDir,
}

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

const SERIES: [(&str, &str, &str); 4] = [
    // (name in the test, labels, family)
    (
        "seasonal",
        r#"service="api",bucket="seasonal""#,
        "spillway_requests",
    ),
    (
        "trending",
        r#"service="api",bucket="trending""#,
        "spillway_requests",
    ),
    (
        "spiky",
        r#"service="web",bucket="spiky""#,
        "spillway_requests",
    ),
    (
        "pair",
        r#"service="api",caller="gw",procedure="/v1/orders""#,
        "gateway_requests",
    ),
];

fn truth_of(name: &str) -> Truth {
    let base = Truth {
        base: 200.0,
        daily: 0.5,
        weekend: 0.4,
        trend_per_week: 0.0,
        noise: 0.05,
        spike_every: 9,
        spike_factor: 3.0,
        seed: 1,
    };
    match name {
        "seasonal" => base,
        "trending" => Truth {
            base: 120.0,
            trend_per_week: 0.1,
            seed: 2,
            ..base
        },
        "spiky" => Truth {
            base: 40.0,
            spike_every: 3,
            spike_factor: 10.0,
            seed: 3,
            ..base
        },
        _ => Truth {
            base: 75.0,
            daily: 0.3,
            seed: 4,
            ..base
        },
    }
}

/// Writes the OpenMetrics text: counters sampled every 30 s, each minute's increase that
/// minute's rate times 60, so `rate(...[1m])` at the end of a minute is that minute's rate.
/// The seasonal bucket is split over three decisions (a tenth of it shadow-dropped), with a
/// candidate that would have dropped 4% of it counted again as `candidate_dropped`, and the pair
/// over two hosts, so the queries' sums are exercised: a query that counted the candidate's
/// drops as offered load would propose limits 4% higher than the test's own.
fn write_openmetrics(
    path: &Path,
    window: Window,
    truths: &BTreeMap<&'static str, (Truth, Vec<f64>)>,
) {
    let mut out = String::with_capacity(40 << 20);
    for family in ["spillway_requests", "gateway_requests"] {
        let _ = writeln!(out, "# TYPE {family} counter");
        for (name, labels, fam) in SERIES {
            if fam != family {
                continue;
            }
            let rates = &truths[name].1;
            let parts: &[(&str, f64)] = match name {
                "seasonal" => &[
                    (r#",decision="allowed""#, 0.65),
                    (r#",decision="dropped""#, 0.25),
                    (r#",decision="shadow_dropped""#, 0.10),
                    (r#",decision="candidate_dropped""#, 0.04),
                ],
                "pair" => &[(r#",instance="h1""#, 0.5), (r#",instance="h2""#, 0.5)],
                _ => &[(r#",decision="allowed""#, 1.0)],
            };
            for (extra, share) in parts {
                let mut counter = 1000.0;
                let _ = writeln!(
                    out,
                    "{family}_total{{{labels}{extra}}} {counter} {}",
                    window.start
                );
                for (i, rate) in rates.iter().enumerate() {
                    let end = window.start + (i as i64 + 1) * MINUTE;
                    for half in [30, 0] {
                        counter += rate * share * 30.0;
                        let _ = writeln!(
                            out,
                            "{family}_total{{{labels}{extra}}} {counter} {}",
                            end - half
                        );
                    }
                }
            }
        }
    }
    out.push_str("# EOF\n");
    std::fs::write(path, out).expect("write the OpenMetrics file");
}

/// One test, one Prometheus: nextest runs every test in a process of its own, and making the
/// blocks takes seconds, so the checks share the fixture as steps of one test.
#[test]
fn against_a_real_prometheus() {
    let Some(f) = start() else { return };
    type Step = fn(&Fixture);
    let steps: [(&str, Step); 7] = [
        (
            "the written history comes back",
            prometheus_gives_back_the_written_history,
        ),
        ("historical limits", historical_limits_match_the_history),
        (
            "forecast",
            forecast_over_prometheus_is_the_forecast_of_the_history,
        ),
        (
            "a bucket per pair",
            a_query_by_caller_and_procedure_proposes_a_bucket_per_pair,
        ),
        ("bad queries", bad_queries_are_clear_errors),
        (
            "gaps",
            a_lookback_mostly_before_the_history_keeps_with_the_reason,
        ),
        (
            "a validation window's counts",
            a_validation_window_counts_offered_and_shadow_dropped_requests,
        ),
    ];
    for (name, step) in steps {
        let began = Instant::now();
        step(&f);
        eprintln!("{name}: ok in {:.1}s", began.elapsed().as_secs_f64());
    }
}

fn start() -> Option<Fixture> {
    let (prometheus, promtool) = binaries()?;
    let dir = tempfile::tempdir().expect("a temporary folder");
    // Four weeks ending a few hours ago, on a whole hour: blocks, not the head, hold them.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let end = (now / 3600 - 3) * 3600;
    let window = Window::ending(end, 28 * DAY);
    let mut truths = BTreeMap::new();
    for (name, _, _) in SERIES {
        let truth = truth_of(name);
        let rates: Vec<f64> = (1..=window.minutes() as i64)
            .map(|i| truth.rate(window.start + i * MINUTE, window.start))
            .collect();
        truths.insert(name, (truth, rates));
    }
    let input = dir.path().join("history.om");
    write_openmetrics(&input, window, &truths);
    let data = dir.path().join("data");
    let began = Instant::now();
    let status = Command::new(&promtool)
        .args([
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--max-block-duration=24h",
        ])
        .arg(&input)
        .arg(&data)
        .stdout(Stdio::null())
        .status()
        .expect("run promtool");
    assert!(
        status.success(),
        "promtool tsdb create-blocks-from openmetrics failed"
    );
    eprintln!(
        "promtool made the blocks in {:.1}s",
        began.elapsed().as_secs_f64()
    );
    let config = dir.path().join("prometheus.yml");
    std::fs::write(&config, "global:\n  scrape_interval: 1h\n").unwrap();
    let port = free_port();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let child = Command::new(&prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", data.display()))
        .arg("--storage.tsdb.retention.time=3650d")
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start prometheus");
    let guard = Guard(child);
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let ready = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            && ureq_ready(&format!("{url}/-/ready"));
        if ready {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "prometheus did not get ready; its log: {}",
            std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Some(Fixture {
        url,
        window,
        truths,
        _prometheus: guard,
        _dir: dir,
    })
}

/// `GET url` answers 200: a bare HTTP/1.0 request, no client library needed.
fn ureq_ready(url: &str) -> bool {
    use std::io::{Read, Write};
    let rest = url.trim_start_matches("http://");
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let Ok(mut stream) = std::net::TcpStream::connect(host) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(stream, "GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200")
}

/// Type-7 quantile, by sorting: the test's own.
fn quantile_by_sorting(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let h = (sorted.len() - 1) as f64 * q;
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
}

/// Up to three significant digits, by text: the test's own.
fn three_digits_up(value: f64) -> f64 {
    let exponent = value.log10().floor() as i32;
    let unit = 10f64.powi(exponent - 2);
    let units = value / unit;
    let whole = if (units - units.round()).abs() < 1e-6 {
        units.round()
    } else {
        units.ceil()
    };
    format!("{:.6e}", whole * unit).parse().unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1.0)
}

fn current(buckets: &[(&str, &str, f64)]) -> CurrentLimits {
    CurrentLimits {
        buckets: buckets
            .iter()
            .map(|(s, b, l)| CurrentBucket {
                service: s.to_string(),
                bucket: b.to_string(),
                pair: None,
                per_subject: None,
                limit_rps: *l,
                regional: None,
            })
            .collect(),
    }
}

/// The adapter hands back exactly the history that was written, minute for minute.
fn prometheus_gives_back_the_written_history(f: &Fixture) {
    let mut source =
        PrometheusSource::new(&f.url, Query::Default, Duration::from_secs(3 * DAY as u64)).unwrap();
    let mut points = Vec::new();
    let mut seen = Vec::new();
    while let Some(key) = source.next_series(f.window, &mut points).unwrap() {
        let name = match &key {
            k if *k == SeriesKey::bucket("api", "seasonal") => "seasonal",
            k if *k == SeriesKey::bucket("api", "trending") => "trending",
            k if *k == SeriesKey::bucket("web", "spiky") => "spiky",
            other => panic!("unexpected series {other}"),
        };
        let rates = &f.truths[name].1;
        assert_eq!(points.len(), rates.len(), "{name}: every minute of 28 days");
        for (i, (p, r)) in points.iter().zip(rates).enumerate() {
            assert_eq!(p.at, f.window.start + (i as i64 + 1) * MINUTE);
            assert!(close(p.rps, *r), "{name} minute {i}: {} vs {r}", p.rps);
        }
        seen.push(name);
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
}

/// `historical` over the default query: the test's own quantile, headroom and clamps.
fn historical_limits_match_the_history(f: &Fixture) {
    let mut source =
        PrometheusSource::new(&f.url, Query::Default, Duration::from_secs(7 * DAY as u64)).unwrap();
    // seasonal: new; trending: current 100 (the proposal would more than double it); spiky:
    // current 60.
    let current = current(&[
        ("api", "trending", 100.0),
        ("web", "spiky", 60.0),
        ("api", "idle", 50.0),
    ]);
    let settings = Settings::new(Params::default());
    let plan =
        spillway_configure::plan(&mut source, f.window, &settings, &current, |_, _| {}).unwrap();
    let by = |bucket: &str| plan.proposals.iter().find(|p| p.bucket == bucket).unwrap();

    let expect = |name: &str| three_digits_up(quantile_by_sorting(&f.truths[name].1, 0.999) * 1.25);
    let seasonal = by("seasonal");
    assert_eq!(seasonal.action, PlanAction::Create);
    assert!(
        close(seasonal.proposed_limit_rps.unwrap(), expect("seasonal")),
        "{seasonal:?}"
    );
    assert_eq!(seasonal.current_limit_rps, None);

    let trending = by("trending");
    assert!(expect("trending") > 200.0);
    assert_eq!(trending.action, PlanAction::Update);
    assert_eq!(trending.proposed_limit_rps, Some(200.0));
    assert_eq!(trending.evidence.clamp, Some(Clamp::MaxChangeUp));
    assert!(close(
        trending.evidence.unclamped_rps.unwrap(),
        expect("trending")
    ));

    // The spikes (10x for 3 minutes every third day: 30 minutes) stay above the quantile.
    let spiky = by("spiky");
    let rates = &f.truths["spiky"].1;
    let max = rates.iter().copied().fold(0.0, f64::max);
    assert!(close(spiky.evidence.peak_rps.unwrap(), max));
    assert!(
        spiky.evidence.quantile_rps.unwrap() < max / 3.0,
        "{spiky:?}"
    );
    assert!(close(spiky.proposed_limit_rps.unwrap(), expect("spiky")));
    assert_eq!(spiky.action, PlanAction::Update);

    // A bucket in force that no series is about is kept, with the reason.
    let idle = by("idle");
    assert_eq!(idle.action, PlanAction::Keep);
    assert_eq!(idle.proposed_limit_rps, Some(50.0));
    assert!(
        idle.evidence
            .reason
            .as_deref()
            .unwrap()
            .starts_with("no history")
    );
}

/// The source in memory that the forecast over Prometheus is compared with.
struct InMemory(Vec<(SeriesKey, Vec<Point>)>);

impl HistorySource for InMemory {
    fn next_series(
        &mut self,
        _: Window,
        points: &mut Vec<Point>,
    ) -> Result<Option<SeriesKey>, SourceError> {
        points.clear();
        Ok(self.0.pop().map(|(key, p)| {
            points.extend(p);
            key
        }))
    }
    fn describe(&self) -> String {
        "memory".into()
    }
}

/// `forecast` over Prometheus gives what it gives over the same history in memory, and on the
/// trending bucket it proposes above `historical`'s base.
fn forecast_over_prometheus_is_the_forecast_of_the_history(f: &Fixture) {
    let settings = Settings::new(Params {
        policy: PolicyKind::Forecast,
        ..Params::default()
    });
    let mut source =
        PrometheusSource::new(&f.url, Query::Default, Duration::from_secs(7 * DAY as u64)).unwrap();
    let over_prometheus = spillway_configure::plan(
        &mut source,
        f.window,
        &settings,
        &CurrentLimits::default(),
        |_, _| {},
    )
    .unwrap();
    let in_memory: Vec<(SeriesKey, Vec<Point>)> =
        [("seasonal", "api"), ("trending", "api"), ("spiky", "web")]
            .into_iter()
            .map(|(name, service)| {
                let points = f.truths[name]
                    .1
                    .iter()
                    .enumerate()
                    .map(|(i, r)| Point {
                        at: f.window.start + (i as i64 + 1) * MINUTE,
                        rps: *r,
                    })
                    .collect();
                (SeriesKey::bucket(service, name), points)
            })
            .collect();
    let from_memory = spillway_configure::plan(
        &mut InMemory(in_memory),
        f.window,
        &settings,
        &CurrentLimits::default(),
        |_, _| {},
    )
    .unwrap();
    for p in &over_prometheus.proposals {
        let m = from_memory
            .proposals
            .iter()
            .find(|m| m.bucket == p.bucket)
            .unwrap();
        assert!(
            close(p.proposed_limit_rps.unwrap(), m.proposed_limit_rps.unwrap()),
            "{p:?}\n{m:?}"
        );
        assert_eq!(p.action, PlanAction::Create);
    }
    let trending = over_prometheus
        .proposals
        .iter()
        .find(|p| p.bucket == "trending")
        .unwrap();
    let hist_base = quantile_by_sorting(&f.truths["trending"].1, 0.999);
    assert!(
        trending.evidence.forecast_trend_per_week.unwrap() > 0.03,
        "{trending:?}"
    );
    assert!(
        trending.evidence.base_rps.unwrap() > hist_base * 0.98,
        "{trending:?} vs {hist_base}"
    );
}

/// A `--query` by caller and procedure proposes a new bucket per pair, summed over hosts.
fn a_query_by_caller_and_procedure_proposes_a_bucket_per_pair(f: &Fixture) {
    let query = Query::Custom(
        "sum by (service, caller, procedure) (rate(gateway_requests_total[1m]))".into(),
    );
    let mut source =
        PrometheusSource::new(&f.url, query, Duration::from_secs(7 * DAY as u64)).unwrap();
    let settings = Settings::new(Params::default());
    let plan = spillway_configure::plan(
        &mut source,
        f.window,
        &settings,
        &CurrentLimits::default(),
        |_, _| {},
    )
    .unwrap();
    assert_eq!(plan.proposals.len(), 1, "{:?}", plan.proposals);
    let p = &plan.proposals[0];
    assert_eq!(
        (p.service.as_str(), p.bucket.as_str()),
        ("api", "gw-v1-orders")
    );
    assert_eq!(p.caller.as_deref(), Some("gw"));
    assert_eq!(p.procedure.as_deref(), Some("/v1/orders"));
    let want = three_digits_up(quantile_by_sorting(&f.truths["pair"].1, 0.999) * 1.25);
    assert!(
        close(p.proposed_limit_rps.unwrap(), want),
        "{p:?} vs {want}"
    );
    assert_eq!(p.evidence.points, Some(28 * 1440));
}

/// Bad input: wrong labels, an empty result, a query Prometheus refuses, a closed port.
fn bad_queries_are_clear_errors(f: &Fixture) {
    let settings = Settings::new(Params::default());
    let run = |query: Query| {
        let mut source =
            PrometheusSource::new(&f.url, query, Duration::from_secs(7 * DAY as u64)).unwrap();
        spillway_configure::plan(
            &mut source,
            f.window,
            &settings,
            &CurrentLimits::default(),
            |_, _| {},
        )
    };
    let wrong = run(Query::Custom(
        "sum by (instance) (rate(gateway_requests_total[1m]))".into(),
    ))
    .unwrap_err();
    assert!(
        matches!(wrong, PlanError::Source(SourceError::Labels(_))),
        "{wrong}"
    );
    assert!(
        wrong
            .to_string()
            .contains("a proposal needs the labels service and bucket"),
        "{wrong}"
    );

    let empty = run(Query::Custom(
        "sum by (service, bucket) (rate(nothing_here_total[1m]))".into(),
    ))
    .unwrap_err();
    assert!(matches!(empty, PlanError::Empty(..)), "{empty}");
    assert!(
        empty
            .to_string()
            .contains("returned no series over the lookback"),
        "{empty}"
    );

    let refused = run(Query::Custom("sum by (service, bucket) (rate(".into())).unwrap_err();
    assert!(
        matches!(
            refused,
            PlanError::Source(SourceError::Status { status: 400, .. })
        ),
        "{refused}"
    );
    assert!(refused.to_string().contains("bad_data"), "{refused}");

    let port = free_port();
    let mut closed = PrometheusSource::new(
        &format!("http://127.0.0.1:{port}"),
        Query::Default,
        Duration::from_secs(DAY as u64),
    )
    .unwrap();
    let err = spillway_configure::plan(
        &mut closed,
        f.window,
        &settings,
        &CurrentLimits::default(),
        |_, _| {},
    )
    .unwrap_err();
    assert!(
        err.to_string().starts_with(&format!(
            "cannot reach Prometheus at http://127.0.0.1:{port}"
        )),
        "{err}"
    );
}

/// A lookback that reaches before the history began: the gaps are reported, not planned on.
fn a_lookback_mostly_before_the_history_keeps_with_the_reason(f: &Fixture) {
    let window = Window::ending(f.window.start + 10 * DAY, 28 * DAY);
    let mut source =
        PrometheusSource::new(&f.url, Query::Default, Duration::from_secs(7 * DAY as u64)).unwrap();
    let current = current(&[("api", "seasonal", 300.0)]);
    let settings = Settings::new(Params::default());
    let plan =
        spillway_configure::plan(&mut source, window, &settings, &current, |_, _| {}).unwrap();
    let p = plan
        .proposals
        .iter()
        .find(|p| p.bucket == "seasonal")
        .unwrap();
    assert_eq!(p.action, PlanAction::Keep);
    assert_eq!(p.proposed_limit_rps, Some(300.0));
    assert!(
        p.evidence.reason.as_deref().unwrap().contains("(gaps)"),
        "{p:?}"
    );
}

/// What `apply` asks of a shadow bucket's window and of a candidate's: its offered requests
/// (every decision but `candidate_dropped`), the tenth of them shadow-dropped and the 4% its
/// candidate would have dropped, against the sum of the written rates.
fn a_validation_window_counts_offered_and_shadow_dropped_requests(f: &Fixture) {
    let mut source =
        PrometheusSource::new(&f.url, Query::Default, Duration::from_secs(7 * 86_400)).unwrap();
    let rates = &f.truths["seasonal"].1;
    // Six hours ending two days before the history's end, on minute ends.
    let until = f.window.end - 2 * 86_400;
    let from = until - 6 * 3600;
    let first = ((from - f.window.start) / MINUTE) as usize;
    let last = ((until - f.window.start) / MINUTE) as usize;
    let expected: f64 = rates[first..last].iter().map(|r| r * 60.0).sum();
    let (offered, shadow) = source
        .seen("api", "seasonal", Trial::Shadow, from * 1000, until * 1000)
        .unwrap()
        .expect("Prometheus says");
    assert!(
        (offered - expected).abs() < 0.01 * expected,
        "offered {offered} vs {expected}"
    );
    assert!(
        (shadow - 0.1 * expected).abs() < 0.01 * expected,
        "shadow {shadow} vs {}",
        0.1 * expected
    );
    let (offered_too, candidate) = source
        .seen(
            "api",
            "seasonal",
            Trial::Candidate,
            from * 1000,
            until * 1000,
        )
        .unwrap()
        .expect("Prometheus says");
    assert_eq!(offered_too, offered);
    assert!(
        (candidate - 0.04 * expected).abs() < 0.01 * expected,
        "candidate {candidate} vs {}",
        0.04 * expected
    );
    let (none, _) = source
        .seen("api", "nothing", Trial::Shadow, from * 1000, until * 1000)
        .unwrap()
        .unwrap();
    assert_eq!(none, 0.0, "no series: no traffic");
}
