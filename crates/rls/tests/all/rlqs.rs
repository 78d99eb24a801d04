//! RLQS end to end over real gRPC on loopback: a controller and a zone's aggregator serving
//! `StreamRateLimitQuotas`, and simulated Envoy instances (Envoy's own messages from
//! `envoy-types`) that report usage as Envoy does and enforce the assignments they receive.
//!
//! Each test waits, with a deadline of tens of intervals, for its outcome, and asserts how many
//! intervals it took where the issue names a bound, so a busy machine makes a test slower but
//! not wrong.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spillway_control::{Aggregator, AggregatorOptions, Controller, ControllerOptions};
use spillway_loop::RulesSnapshot;
use spillway_rls::rlqs::pb;
use spillway_rls::{Rlqs, RlsServer, serve_rlqs};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

/// The loop's report interval in these tests, and the simulated Envoys' reporting interval.
const INTERVAL: Duration = Duration::from_millis(500);

fn rules(limit: u64, with_search: bool) -> String {
    let search = if with_search {
        "      - name: search\n        match: { descriptor: { domain: edge, entries: [ {key: route, value: search} ] } }\n        limit: 40/s\n        algorithm: fixed-window\n"
    } else {
        ""
    };
    format!(
        "version: 1\ncontrol:\n  report_interval: 500ms\n  instruction_ttl: 3s\nservices:\n  edge:\n    buckets:\n      - name: checkout\n        match: {{ descriptor: {{ domain: edge, entries: [ {{key: route, value: checkout}} ] }} }}\n        limit: {limit}/s\n{search}"
    )
}

fn snapshot(version: u64, yaml: &str) -> Arc<RulesSnapshot> {
    Arc::new(RulesSnapshot::parse(version, yaml, "rules.yaml").unwrap())
}

struct Zone {
    controller: Controller,
    aggregator: Aggregator,
    rlqs: RlsServer,
    url: String,
    rules: watch::Sender<Arc<RulesSnapshot>>,
}

impl Zone {
    async fn start(yaml: &str) -> Zone {
        let (rules, rx) = watch::channel(snapshot(1, yaml));
        let controller = Controller::start(ControllerOptions::new(any_port(), "r1", rx))
            .await
            .unwrap();
        let mut options = AggregatorOptions::new(
            any_port(),
            "r1",
            "z1",
            format!("http://{}", controller.local_addr()),
        );
        options.backoff =
            spillway_link::Backoff::new(Duration::from_millis(50), Duration::from_millis(200));
        let aggregator = Aggregator::start(options).await.unwrap();
        let (listener, addr) = spillway_net::bind(any_port()).await.unwrap();
        let rlqs = serve_rlqs(listener, Rlqs::new(aggregator.local_clients()), None);
        Zone {
            controller,
            aggregator,
            rlqs,
            url: format!("http://{addr}"),
            rules,
        }
    }

    async fn shutdown(self) {
        self.rlqs.shutdown().await;
        self.aggregator.shutdown().await;
        self.controller.shutdown().await;
    }
}

fn any_port() -> std::net::SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn bucket_id(route: &str) -> pb::BucketId {
    pb::BucketId {
        bucket: HashMap::from([("route".to_owned(), route.to_owned())]),
    }
}

/// What an Envoy instance was told for one bucket id.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Told {
    Allow,
    Deny,
    /// Tokens a second.
    Rate(f64),
    Abandoned,
}

fn read_action(action: &pb::BucketAction) -> (String, Told, Option<i64>) {
    let route = action.bucket_id.as_ref().unwrap().bucket["route"].clone();
    match action.bucket_action.as_ref().unwrap() {
        pb::bucket_action::BucketAction::AbandonAction(_) => (route, Told::Abandoned, None),
        pb::bucket_action::BucketAction::QuotaAssignmentAction(a) => {
            let ttl = a.assignment_time_to_live.unwrap();
            assert_eq!(ttl.nanos, 0, "TTLs are whole seconds");
            let t = match a
                .rate_limit_strategy
                .as_ref()
                .unwrap()
                .strategy
                .as_ref()
                .unwrap()
            {
                pb::Strategy::BlanketRule(0) => Told::Allow,
                pb::Strategy::BlanketRule(_) => Told::Deny,
                pb::Strategy::TokenBucket(tb) => {
                    let fill = tb.fill_interval.unwrap();
                    assert_eq!(fill.nanos, 0, "fill intervals are whole seconds");
                    let per_fill = tb.tokens_per_fill.unwrap().value;
                    assert_eq!(tb.max_tokens, per_fill);
                    Told::Rate(f64::from(per_fill) / fill.seconds as f64)
                }
                other => panic!("unexpected strategy {other:?}"),
            };
            (route, t, Some(ttl.seconds))
        }
    }
}

/// A simulated Envoy instance: offers `rps` requests a second to each of its routes, admits what
/// its assignment admits (everything before one arrives), and reports usage every interval.
struct Envoy {
    told: Arc<Mutex<HashMap<String, Told>>>,
    /// Every action for each route, in the order they came: an answer that lasts one interval
    /// (an abandon, before the bucket is reported again) is seen however late the test looks.
    history: Arc<Mutex<HashMap<String, Vec<Told>>>>,
    ttls: Arc<Mutex<Vec<i64>>>,
    error: Arc<Mutex<Option<tonic::Status>>>,
    sent: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Envoy {
    async fn start(url: &str, domain: &str, routes: &[&str], rps: f64) -> Envoy {
        let mut client = pb::RateLimitQuotaServiceClient::connect(url.to_owned())
            .await
            .unwrap();
        let (tx, rx) = mpsc::channel(4);
        let told: Arc<Mutex<HashMap<String, Told>>> = Default::default();
        let history: Arc<Mutex<HashMap<String, Vec<Told>>>> = Default::default();
        let ttls: Arc<Mutex<Vec<i64>>> = Default::default();
        let error: Arc<Mutex<Option<tonic::Status>>> = Default::default();
        let domain = domain.to_owned();
        let routes: Vec<String> = routes.iter().map(|r| (*r).to_owned()).collect();
        let sent: Arc<std::sync::atomic::AtomicU64> = Default::default();
        let (t, l, e, n) = (told.clone(), ttls.clone(), error.clone(), sent.clone());
        let h = history.clone();
        let task = tokio::spawn(async move {
            let first = usage(&domain, &routes, &t.lock().unwrap(), rps, INTERVAL);
            tx.send(first).await.unwrap();
            let mut inbound = match client
                .stream_rate_limit_quotas(ReceiverStream::new(rx))
                .await
            {
                Ok(r) => r.into_inner(),
                Err(status) => {
                    *e.lock().unwrap() = Some(status);
                    return;
                }
            };
            let mut every = tokio::time::interval(INTERVAL);
            every.tick().await;
            loop {
                tokio::select! {
                    _ = every.tick() => {
                        let report = usage(&domain, &routes, &t.lock().unwrap(), rps, INTERVAL);
                        if tx.send(report).await.is_err() {
                            return;
                        }
                        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    message = inbound.message() => match message {
                        Ok(Some(response)) => {
                            for action in &response.bucket_action {
                                let (route, told, ttl) = read_action(action);
                                h.lock().unwrap().entry(route.clone()).or_default().push(told);
                                t.lock().unwrap().insert(route, told);
                                l.lock().unwrap().extend(ttl);
                            }
                        }
                        Ok(None) => return,
                        Err(status) => {
                            *e.lock().unwrap() = Some(status);
                            return;
                        }
                    },
                }
            }
        });
        Envoy {
            told,
            history,
            ttls,
            error,
            sent,
            task,
        }
    }

    /// Usage reports sent after the first.
    fn reports(&self) -> u64 {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn told(&self, route: &str) -> Option<Told> {
        self.told.lock().unwrap().get(route).copied()
    }

    /// Whether `route` was told `first` and, at some time after it, `then`.
    fn was_told_then(&self, route: &str, first: Told, then: Option<Told>) -> bool {
        let history = self.history.lock().unwrap();
        let Some(seen) = history.get(route) else {
            return false;
        };
        let Some(at) = seen.iter().position(|t| *t == first) else {
            return false;
        };
        then.is_none_or(|then| seen[at + 1..].contains(&then))
    }

    fn stop(self) {
        self.task.abort();
    }
}

/// One usage report: each route's requests over `elapsed`, allowed as its assignment allows.
fn usage(
    domain: &str,
    routes: &[String],
    told: &HashMap<String, Told>,
    rps: f64,
    elapsed: Duration,
) -> pb::RateLimitQuotaUsageReports {
    let offered = (rps * elapsed.as_secs_f64()).round() as u64;
    pb::RateLimitQuotaUsageReports {
        domain: domain.to_owned(),
        bucket_quota_usages: routes
            .iter()
            .map(|route| {
                let allowed = match told.get(route) {
                    None | Some(Told::Allow) | Some(Told::Abandoned) => offered,
                    Some(Told::Deny) => 0,
                    Some(Told::Rate(r)) => offered.min((r * elapsed.as_secs_f64()).round() as u64),
                };
                pb::BucketQuotaUsage {
                    bucket_id: Some(bucket_id(route)),
                    time_elapsed: Some(envoy_types::pb::google::protobuf::Duration {
                        seconds: elapsed.as_secs() as i64,
                        nanos: elapsed.subsec_nanos() as i32,
                    }),
                    num_requests_allowed: allowed,
                    num_requests_denied: offered - allowed,
                }
            })
            .collect(),
    }
}

async fn wait_for(what: &str, deadline: Duration, mut ok: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

fn summed(envoys: &[Envoy], route: &str) -> Option<f64> {
    envoys
        .iter()
        .map(|e| match e.told(route)? {
            Told::Rate(r) => Some(r),
            _ => None,
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_envoys_over_the_limit_are_assigned_rates_that_sum_to_the_limit_within_three_intervals()
 {
    let zone = Zone::start(&rules(150, false)).await;
    // The aggregator's link to its controller, and the rules with it.
    wait_for(
        "the aggregator links to its controller",
        Duration::from_secs(20),
        || zone.aggregator.connected(),
    )
    .await;
    let mut envoys = Vec::new();
    for _ in 0..3 {
        envoys.push(Envoy::start(&zone.url, "edge", &["checkout", "unknown"], 100.0).await);
    }
    // Every new bucket id is answered as soon as the zone has rules (ALLOW_ALL before the first
    // instruction).
    wait_for(
        "each Envoy's bucket ids are answered",
        Duration::from_secs(10),
        || {
            envoys
                .iter()
                .all(|e| e.told("checkout").is_some() && e.told("unknown").is_some())
        },
    )
    .await;
    let reports = envoys[0].reports();
    let took = wait_for(
        "the three assignments sum to the limit of 150/s",
        Duration::from_secs(30),
        || summed(&envoys, "checkout").is_some_and(|s| (s - 150.0).abs() <= 0.05 * 150.0),
    )
    .await;
    // Counted in the Envoys' own report intervals (one usage report each), so a loaded machine
    // that stretches the intervals does not change the count: three, and one for a report that
    // was on its way when the count started.
    let intervals = envoys[0].reports() - reports;
    eprintln!("converged {took:?} after the first answers, {intervals} report intervals");
    assert!(
        intervals <= 4,
        "converged after {intervals} report intervals"
    );
    // A descriptor no bucket matches is allowed, as RLS answers OK for it.
    for e in &envoys {
        assert_eq!(e.told("unknown"), Some(Told::Allow));
        // Three report intervals as whole seconds, at least 2: 2 s at the rules' 500 ms (3 s
        // at the 1 s an instance assumes until its zone's controller has spoken).
        let ttls = e.ttls.lock().unwrap();
        assert!(ttls.iter().all(|&t| t == 2 || t == 3), "{ttls:?}");
        assert_eq!(ttls.last(), Some(&2), "{ttls:?}");
    }
    // It holds: still the limit after a few more intervals, with the Envoys' own reports.
    tokio::time::sleep(4 * INTERVAL).await;
    let s = summed(&envoys, "checkout").unwrap();
    assert!((s - 150.0).abs() <= 0.05 * 150.0, "summed {s}");
    for e in envoys {
        e.stop();
    }
    zone.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_removed_from_the_rules_is_abandoned_and_a_reconnected_envoy_is_assigned_again() {
    let zone = Zone::start(&rules(60, true)).await;
    wait_for(
        "the aggregator links to its controller",
        Duration::from_secs(20),
        || zone.aggregator.connected(),
    )
    .await;
    let envoy = Envoy::start(&zone.url, "edge", &["checkout", "search"], 100.0).await;
    // search is a local fixed window of 40/s: a token bucket at its own limit per instance.
    wait_for("search gets its limit", Duration::from_secs(10), || {
        envoy.told("search") == Some(Told::Rate(40.0))
    })
    .await;
    wait_for(
        "checkout gets 60 of its 100/s",
        Duration::from_secs(30),
        || {
            envoy
                .told("checkout")
                .is_some_and(|t| matches!(t, Told::Rate(r) if (r - 60.0).abs() <= 3.0))
        },
    )
    .await;
    // The rules lose search: Envoy is told to abandon it.
    zone.rules.send(snapshot(2, &rules(60, false))).unwrap();
    wait_for("search is abandoned", Duration::from_secs(20), || {
        envoy.was_told_then("search", Told::Abandoned, None)
    })
    .await;
    // Envoy reports the abandoned bucket again as new: now it matches nothing, ALLOW_ALL.
    wait_for(
        "search, reported again, is allowed",
        Duration::from_secs(10),
        || envoy.was_told_then("search", Told::Abandoned, Some(Told::Allow)),
    )
    .await;
    assert_eq!(envoy.told("search"), Some(Told::Allow));
    // A reconnected Envoy (a new stream) is assigned again within a few intervals.
    envoy.stop();
    let again = Envoy::start(&zone.url, "edge", &["checkout"], 100.0).await;
    wait_for(
        "the reconnected Envoy gets 60 of its 100/s",
        Duration::from_secs(30),
        || {
            again
                .told("checkout")
                .is_some_and(|t| matches!(t, Told::Rate(r) if (r - 60.0).abs() <= 3.0))
        },
    )
    .await;
    again.stop();
    zone.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_usage_reports_end_the_stream_with_invalid_argument() {
    let zone = Zone::start(&rules(60, false)).await;
    let good = usage(
        "edge",
        &["checkout".to_owned()],
        &HashMap::new(),
        10.0,
        INTERVAL,
    );
    let mut empty_domain = good.clone();
    empty_domain.domain.clear();
    let mut no_usage = good.clone();
    no_usage.bucket_quota_usages.clear();
    let mut no_id = good.clone();
    no_id.bucket_quota_usages[0].bucket_id = Some(pb::BucketId::default());
    let mut empty_value = good.clone();
    empty_value.bucket_quota_usages[0].bucket_id = Some(pb::BucketId {
        bucket: HashMap::from([("route".to_owned(), String::new())]),
    });
    let mut no_time = good.clone();
    no_time.bucket_quota_usages[0].time_elapsed = None;
    let mut zero_time = good.clone();
    zero_time.bucket_quota_usages[0].time_elapsed =
        Some(envoy_types::pb::google::protobuf::Duration::default());
    let cases = [
        (empty_domain, "domain is empty"),
        (no_usage, "no bucket_quota_usages"),
        (no_id, "no bucket_id"),
        (empty_value, "empty key or value"),
        (no_time, "time_elapsed"),
        (zero_time, "time_elapsed"),
    ];
    for (report, says) in cases {
        let mut client = pb::RateLimitQuotaServiceClient::connect(zone.url.clone())
            .await
            .unwrap();
        let (tx, rx) = mpsc::channel(2);
        tx.send(report).await.unwrap();
        let mut inbound = client
            .stream_rate_limit_quotas(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        let status = tokio::time::timeout(Duration::from_secs(10), inbound.message())
            .await
            .expect("an answer")
            .expect_err("the stream fails");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains(says),
            "{:?} should say {says:?}",
            status.message()
        );
    }
    // A domain that changes within a stream.
    let mut client = pb::RateLimitQuotaServiceClient::connect(zone.url.clone())
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(2);
    tx.send(good.clone()).await.unwrap();
    let mut other = good.clone();
    other.domain = "other".into();
    tx.send(other).await.unwrap();
    let mut inbound = client
        .stream_rate_limit_quotas(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let status = loop {
        match tokio::time::timeout(Duration::from_secs(10), inbound.message())
            .await
            .expect("an answer")
        {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without an error"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("one stream, one domain"),
        "{status:?}"
    );
    // The server still serves after all of it.
    let envoy = Envoy::start(&zone.url, "edge", &["checkout"], 10.0).await;
    wait_for("a good stream is answered", Duration::from_secs(10), || {
        envoy.told("checkout").is_some()
    })
    .await;
    assert!(envoy.error.lock().unwrap().is_none());
    envoy.stop();
    zone.shutdown().await;
}
