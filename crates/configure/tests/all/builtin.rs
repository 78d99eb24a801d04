//! The built-in source (`builtin:DATABASE_URL`) over a real SQLite file and a private
//! PostgreSQL: history written as two regions' controllers write it comes back as per-minute
//! rates with the regions summed, silent minutes as zeros and unheard ones as gaps, and a plan
//! rests on it.

use spillway_configure::builtin::BuiltinSource;
use spillway_configure::{
    CurrentBucket, CurrentLimits, HistorySource, Params, PlanAction, Point, SeriesKey, Settings,
    Window, plan,
};
use spillway_loop::{HistoryBatch, HistoryRow};
use spillway_rules::Store;
use spillway_testkit::Postgres;

/// Minute 28,000,000 (about 2023): a multiple of an hour.
const T0: i64 = 28_000_020 * 60;

fn row(bucket: &str, offered: u64, shadow: u64) -> HistoryRow {
    HistoryRow {
        service: "api".into(),
        bucket: bucket.into(),
        offered,
        admitted: offered - shadow,
        shadow_dropped: shadow,
        candidate_dropped: 0,
    }
}

/// Region a: seconds of minutes 0 and 1 (30 of the first, 60 of the second) at 10/s for
/// `all`; region b: all of minute 0 at 5/s and minute 2 with no traffic for `all`; `quiet` only
/// in minute 0 of region a. Minute 3 is not heard from at all.
fn write(url: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = Store::connect(url).await.unwrap();
        let second = |s: i64| (T0 * 1000 + s * 1000) as u64;
        for s in 30..120 {
            let mut rows = vec![row("all", 10, if s >= 60 { 2 } else { 0 })];
            if s < 60 {
                rows.push(row("quiet", 1, 0));
            }
            let batch = HistoryBatch {
                start_ms: second(s),
                seconds: 1.0,
                rows,
            };
            store.write_history("a", &batch).await.unwrap();
        }
        let minute = |m: i64, rows| HistoryBatch {
            start_ms: second(m * 60),
            seconds: 60.0,
            rows,
        };
        store
            .write_history("b", &minute(0, vec![row("all", 300, 0)]))
            .await
            .unwrap();
        store.write_history("b", &minute(2, vec![])).await.unwrap();
        store.close().await;
    });
}

fn window() -> Window {
    Window {
        start: T0,
        end: T0 + 4 * 60,
    }
}

fn series_are_minutes_with_regions_summed(url: &str) {
    write(url);
    let mut source = BuiltinSource::open(url).unwrap();
    let mut points = Vec::new();
    let key = source.next_series(window(), &mut points).unwrap();
    assert_eq!(key, Some(SeriesKey::bucket("api", "all")));
    let minute = |m: i64| T0 + (m + 1) * 60;
    assert_eq!(
        points,
        vec![
            // a: 300 over its 30 s (10/s); b: 300 over 60 s (5/s).
            Point {
                at: minute(0),
                rps: 15.0
            },
            Point {
                at: minute(1),
                rps: 10.0
            },
            // b was heard from and `all` had nothing: zero, not a gap. Minute 3: a gap.
            Point {
                at: minute(2),
                rps: 0.0
            },
        ]
    );
    let key = source.next_series(window(), &mut points).unwrap();
    assert_eq!(key, Some(SeriesKey::bucket("api", "quiet")));
    assert_eq!(
        points[0],
        Point {
            at: minute(0),
            rps: 1.0
        }
    );
    assert_eq!(points[1].rps, 0.0);
    assert_eq!(source.next_series(window(), &mut points).unwrap(), None);

    // Minute 1 of region a: 600 offered, 120 a shadow bucket would have dropped.
    let totals = source
        .totals("api", "all", (T0 + 60) * 1000, (T0 + 120) * 1000)
        .unwrap();
    assert_eq!((totals.offered, totals.shadow_dropped), (600, 120));
    assert!(source.describe().contains("rules store"));
}

fn a_plan_rests_on_the_builtin_history(url: &str) {
    write(url);
    let mut source = BuiltinSource::open(url).unwrap();
    let current = CurrentLimits {
        buckets: vec![CurrentBucket {
            service: "api".into(),
            bucket: "all".into(),
            pair: None,
            per_subject: None,
            limit_rps: 100.0,
            regional: None,
        }],
    };
    let mut settings = Settings::new(Params {
        quantile: 1.0,
        ..Params::default()
    });
    settings.min_coverage = 0.0;
    let plan = plan(&mut source, window(), &settings, &current, |_, _| {}).unwrap();
    let all = plan
        .proposals
        .iter()
        .find(|p| p.bucket == "all")
        .expect("a proposal for api/all");
    // The highest minute, 15/s, with 25% headroom: 18.75, rounded up to three digits; within
    // the max-change band [50, 200] of 100/s, so raised to 50.
    assert_eq!(all.evidence.peak_rps, Some(15.0));
    assert_eq!(all.proposed_limit_rps, Some(50.0));
    assert_eq!(all.action, PlanAction::Update);
    let quiet = plan.proposals.iter().find(|p| p.bucket == "quiet").unwrap();
    assert_eq!(quiet.action, PlanAction::Create);
    assert_eq!(quiet.proposed_limit_rps, Some(1.25));
}

#[test]
fn sqlite_series_are_minutes_with_regions_summed() {
    let dir = tempfile::tempdir().unwrap();
    series_are_minutes_with_regions_summed(&format!(
        "sqlite://{}",
        dir.path().join("rules.db").display()
    ));
}

#[test]
fn postgres_series_are_minutes_with_regions_summed() {
    let pg = Postgres::start().expect("private PostgreSQL");
    series_are_minutes_with_regions_summed(&pg.url());
}

#[test]
fn sqlite_a_plan_rests_on_the_builtin_history() {
    let dir = tempfile::tempdir().unwrap();
    a_plan_rests_on_the_builtin_history(&format!(
        "sqlite://{}",
        dir.path().join("rules.db").display()
    ));
}

#[test]
fn a_bad_url_is_a_usage_error_and_an_unreachable_store_says_where() {
    match BuiltinSource::open("mysql://db/rules") {
        Err(spillway_configure::SourceError::Usage(message)) => {
            assert!(message.contains("builtin:sqlite://PATH"), "{message}")
        }
        other => panic!("{:?}", other.err()),
    }
    match BuiltinSource::open("postgres://spw:secret@127.0.0.1:1/rules") {
        Err(err @ spillway_configure::SourceError::Unreachable { .. }) => {
            let message = err.to_string();
            assert!(message.contains("127.0.0.1:1"), "{message}");
            assert!(!message.contains("secret"), "{message}");
        }
        other => panic!("{:?}", other.err()),
    }
}

/// `--per-region`: a region-scoped bucket gets one series and one proposal per region, each
/// from that region's own history and against that region's limit; other buckets stay summed.
#[test]
fn a_per_region_plan_proposes_each_regions_limit_from_its_own_history() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("rules.db").display());
    write(&url);
    let mut source = BuiltinSource::open(&url).unwrap();
    source
        .per_region(&[("api".to_owned(), "all".to_owned())])
        .unwrap();
    let current = CurrentLimits {
        buckets: vec![CurrentBucket {
            service: "api".into(),
            bucket: "all".into(),
            pair: None,
            per_subject: None,
            limit_rps: 100.0,
            regional: Some(vec![("b".into(), 4.0)]),
        }],
    };
    let mut settings = Settings::new(Params {
        quantile: 1.0,
        ..Params::default()
    });
    settings.min_coverage = 0.0;
    let plan = plan(&mut source, window(), &settings, &current, |_, _| {}).unwrap();
    let of = |region: Option<&str>| {
        plan.proposals
            .iter()
            .find(|p| p.bucket == "all" && p.region.as_deref() == region)
    };
    // Region a: 10/s at its peak, +25% is 12.5, raised to 50 by the band of its 100/s.
    let a = of(Some("a")).expect("region a's proposal");
    assert_eq!(a.evidence.peak_rps, Some(10.0));
    assert_eq!(a.current_limit_rps, Some(100.0));
    assert_eq!(a.proposed_limit_rps, Some(50.0));
    // Region b: 5/s at its peak against its own 4/s: 6.25, within [2, 8].
    let b = of(Some("b")).expect("region b's proposal");
    assert_eq!(b.evidence.peak_rps, Some(5.0));
    assert_eq!(b.current_limit_rps, Some(4.0));
    assert_eq!(b.proposed_limit_rps, Some(6.25));
    assert!(of(None).is_none(), "no summed proposal beside the regions'");
    let quiet = plan.proposals.iter().find(|p| p.bucket == "quiet").unwrap();
    assert_eq!(quiet.region, None, "a bucket not split stays summed");
}
