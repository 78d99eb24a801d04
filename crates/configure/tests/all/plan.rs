//! Plans over histories made in memory: the bad inputs of issue 23 (gaps, no traffic, no
//! series, per-subject buckets, quotas), and the invariants whatever the history: no panic, no
//! limit of zero, every limit within its bounds.

use proptest::prelude::*;
use spillway_configure::plan::Clamp;
use spillway_configure::series::{DAY, MINUTE};
use spillway_configure::synthetic::{Shape, SyntheticSource};
use spillway_configure::{
    CapacityFile, CurrentBucket, CurrentLimits, Headroom, HistorySource, Params, PlanAction,
    PlanError, Point, PolicyKind, QuotaFile, SeriesKey, Settings, SourceError, Window, chart,
    report,
};

struct InMemory(Vec<(SeriesKey, Vec<Point>)>);

impl HistorySource for InMemory {
    fn next_series(
        &mut self,
        _: Window,
        points: &mut Vec<Point>,
    ) -> Result<Option<SeriesKey>, SourceError> {
        points.clear();
        if self.0.is_empty() {
            return Ok(None);
        }
        let (key, p) = self.0.remove(0);
        points.extend(p);
        Ok(Some(key))
    }
    fn describe(&self) -> String {
        "memory".into()
    }
}

const UNTIL: i64 = 1_767_225_600;

fn window() -> Window {
    Window::ending(UNTIL, 28 * DAY)
}

fn flat(rps: f64, keep: impl Fn(i64) -> bool) -> Vec<Point> {
    let w = window();
    (1..=w.minutes() as i64)
        .map(|i| Point {
            at: w.start + i * MINUTE,
            rps,
        })
        .filter(|p| keep(p.at))
        .collect()
}

fn bucket(service: &str, bucket: &str, limit: f64) -> CurrentBucket {
    CurrentBucket {
        service: service.into(),
        bucket: bucket.into(),
        pair: None,
        per_subject: None,
        limit_rps: limit,
        regional: None,
    }
}

#[test]
fn bad_histories_keep_with_a_reason() {
    let w = window();
    let source = vec![
        (
            SeriesKey::bucket("api", "gappy"),
            flat(10.0, |at| (at - w.start) % DAY < 6 * 3600),
        ),
        (SeriesKey::bucket("api", "silent"), flat(0.0, |_| true)),
        (SeriesKey::bucket("api", "nan"), flat(f64::NAN, |_| true)),
        (SeriesKey::bucket("api", "users"), flat(500.0, |_| true)),
        (SeriesKey::bucket("api", "new-silent"), flat(0.0, |_| true)),
    ];
    let mut users = bucket("api", "users", 5.0);
    users.per_subject = Some("user".into());
    let current = CurrentLimits {
        buckets: vec![
            bucket("api", "gappy", 40.0),
            bucket("api", "silent", 7.0),
            bucket("api", "nan", 9.0),
            users,
        ],
    };
    let plan = spillway_configure::plan(
        &mut InMemory(source),
        w,
        &Settings::new(Params::default()),
        &current,
        |_, _| {},
    )
    .unwrap();
    let get = |b: &str| plan.proposals.iter().find(|p| p.bucket == b).unwrap();
    let reason = |b: &str| get(b).evidence.reason.clone().unwrap();
    assert!(
        reason("gappy").contains("covers 25% of the lookback's minutes (gaps)"),
        "{}",
        reason("gappy")
    );
    assert!(
        reason("silent").contains("no traffic"),
        "{}",
        reason("silent")
    );
    assert!(reason("nan").contains("covers 0%"), "{}", reason("nan"));
    assert!(
        reason("users").contains("a limit per user"),
        "{}",
        reason("users")
    );
    for b in ["gappy", "silent", "nan", "users"] {
        assert_eq!(get(b).action, PlanAction::Keep, "{b}");
        assert_eq!(get(b).proposed_limit_rps, get(b).current_limit_rps, "{b}");
    }
    // A new bucket without traffic gets no limit at all, never zero.
    assert_eq!(get("new-silent").action, PlanAction::Keep);
    assert_eq!(get("new-silent").proposed_limit_rps, None);
    // Its JSON: null limits, the reason in the evidence.
    let json = report::json(&plan);
    let silent = json["proposals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["bucket"] == "new-silent")
        .unwrap();
    assert!(silent["proposed_limit_rps"].is_null() && silent["current_limit_rps"].is_null());
    assert_eq!(silent["action"], "keep");
}

#[test]
fn no_series_at_all_is_an_error() {
    let err = spillway_configure::plan(
        &mut InMemory(vec![]),
        window(),
        &Settings::new(Params::default()),
        &CurrentLimits::default(),
        |_, _| {},
    )
    .unwrap_err();
    assert!(matches!(err, PlanError::Empty(..)), "{err}");
}

#[test]
fn fixed_quotas_create_update_and_keep() {
    let quotas = QuotaFile::parse(
        "quotas:\n  - {service: api, bucket: a, limit: 100/s}\n  - {service: api, bucket: fresh, limit: 3}\n  - {service: api, bucket: c, limit: \"100 per 30s\"}\n  - {service: api, bucket: users, limit: 7}\n",
        "q.yaml",
    )
    .unwrap();
    let mut settings = Settings::new(Params {
        policy: PolicyKind::Fixed,
        ..Params::default()
    });
    settings.quotas = Some(quotas);
    let mut users = bucket("api", "users", 5.0);
    users.per_subject = Some("user".into());
    let current = CurrentLimits {
        buckets: vec![
            bucket("api", "a", 10.0),
            bucket("api", "b", 10.0),
            bucket("api", "c", 100.0 / 30.0),
            users,
        ],
    };
    // No history is needed for contracts; a tenfold change is not clamped.
    let plan = spillway_configure::plan(
        &mut InMemory(vec![]),
        window(),
        &settings,
        &current,
        |_, _| {},
    )
    .unwrap();
    let get = |b: &str| plan.proposals.iter().find(|p| p.bucket == b).unwrap();
    assert_eq!(
        (get("a").action, get("a").proposed_limit_rps),
        (PlanAction::Update, Some(100.0))
    );
    assert_eq!(get("a").evidence.clamp, None);
    assert_eq!(
        (get("fresh").action, get("fresh").proposed_limit_rps),
        (PlanAction::Create, Some(3.0))
    );
    // A quota that is already the limit is kept: a contract is not rounded (3.333... is not
    // 3.34).
    assert_eq!(
        (get("c").action, get("c").proposed_limit_rps),
        (PlanAction::Keep, Some(100.0 / 30.0))
    );
    // A quota for a bucket with a limit per user is that limit.
    assert_eq!(
        (get("users").action, get("users").proposed_limit_rps),
        (PlanAction::Update, Some(7.0))
    );
    assert_eq!(get("b").action, PlanAction::Keep);
    assert!(
        get("b")
            .evidence
            .reason
            .as_deref()
            .unwrap()
            .contains("no quota for api/b in q.yaml")
    );
}

#[test]
fn pairs_get_new_buckets_and_existing_pairs_their_own() {
    let source = vec![
        (SeriesKey::pair("api", "gw", "/a"), flat(10.0, |_| true)),
        (SeriesKey::pair("api", "gw", "/b"), flat(10.0, |_| true)),
        (SeriesKey::pair("api", "gw", "-a"), flat(10.0, |_| true)),
    ];
    let mut existing = bucket("api", "orders", 8.0);
    existing.pair = Some(("gw".into(), "/a".into()));
    let taken = bucket("api", "gw-b", 8.0);
    let current = CurrentLimits {
        buckets: vec![existing, taken],
    };
    let plan = spillway_configure::plan(
        &mut InMemory(source),
        window(),
        &Settings::new(Params::default()),
        &current,
        |_, _| {},
    )
    .unwrap();
    let names: Vec<(&str, PlanAction)> = plan
        .proposals
        .iter()
        .map(|p| (p.bucket.as_str(), p.action))
        .collect();
    assert_eq!(
        names,
        [
            ("orders", PlanAction::Update),
            ("gw-b-2", PlanAction::Create),
            ("gw-a", PlanAction::Create),
            ("gw-b", PlanAction::Keep)
        ]
    );
    assert_eq!(plan.proposals[0].proposed_limit_rps, Some(12.5));
}

#[test]
fn auto_headroom_follows_the_spread_of_daily_peaks() {
    let calm = Shape {
        noise: 0.01,
        spike_chance: 0.0,
        weekend: 0.0,
        ..Shape::default()
    };
    let restless = Shape {
        weekend: 0.5,
        ..Shape::default()
    };
    let source = SyntheticSource::with_series(
        vec![
            (SeriesKey::bucket("a", "calm"), calm),
            (SeriesKey::bucket("a", "restless"), restless),
        ],
        1,
    );
    let settings = Settings::new(Params {
        headroom: Headroom::Auto,
        ..Params::default()
    });
    let plan = spillway_configure::plan(
        &mut { source },
        window(),
        &settings,
        &CurrentLimits::default(),
        |_, _| {},
    )
    .unwrap();
    let calm = &plan.proposals[0].evidence;
    let restless = &plan.proposals[1].evidence;
    assert_eq!(calm.headroom, Some(0.1), "{calm:?}");
    assert!(restless.headroom.unwrap() > 0.5, "{restless:?}");
    assert!(
        restless
            .headroom_basis
            .as_deref()
            .unwrap()
            .starts_with("auto: twice the daily peaks'")
    );
}

/// A planned-capacity file multiplies the forecast of the days it covers: a sale at three
/// times on one day of next week makes that day's forecast the peak, and a file about another
/// service or another week changes nothing.
#[test]
fn a_planned_capacity_multiplies_the_forecast_of_its_days() {
    let calm = Shape {
        noise: 0.01,
        spike_chance: 0.0,
        weekend: 0.0,
        ..Shape::default()
    };
    let planned = |capacity: Option<&str>| {
        let source =
            SyntheticSource::with_series(vec![(SeriesKey::bucket("a", "calm"), calm.clone())], 1);
        let mut settings = Settings::new(Params {
            policy: PolicyKind::Forecast,
            ..Params::default()
        });
        settings.capacity =
            capacity.map(|text| CapacityFile::parse(text, "capacity.yaml").unwrap());
        let plan = spillway_configure::plan(
            &mut { source },
            window(),
            &settings,
            &CurrentLimits::default(),
            |_, _| {},
        )
        .unwrap();
        plan.proposals[0].clone()
    };
    let plain = planned(None);
    let base = plain.evidence.base_rps.expect("a forecast peak");
    assert_eq!(plain.evidence.capacity_multiplier, None);
    // UNTIL is 2026-01-01, a Thursday: next week's third day is Saturday 2026-01-03.
    let sale = planned(Some(
        "capacity:\n  - {service: a, from: 2026-01-03, until: 2026-01-03, multiplier: 3}\n",
    ));
    let e = &sale.evidence;
    assert_eq!(e.capacity_multiplier, Some(3.0), "{e:?}");
    assert_eq!(e.capacity_day.as_deref(), Some("Sat 2026-01-03"));
    let tripled = e.base_rps.unwrap();
    assert!(
        tripled > 2.7 * base && tripled < 3.3 * base,
        "{tripled} against {base}"
    );
    assert!(report::evidence_line(&sale).contains("planned capacity x3 on Sat 2026-01-03"));
    for other in [
        "capacity:\n  - {service: b, from: 2026-01-03, until: 2026-01-03, multiplier: 3}\n",
        "capacity:\n  - {from: 2026-02-01, until: 2026-02-07, multiplier: 3}\n",
    ] {
        let p = planned(Some(other));
        assert_eq!(p.evidence.base_rps, Some(base), "{other}");
        assert_eq!(p.evidence.capacity_multiplier, None);
    }
}

#[test]
fn bad_capacity_files_say_where_and_what() {
    for (text, says) in [
        (
            "capacity:\n  - {from: 2026-01-03, until: 2026-01-01, multiplier: 2}\n",
            "capacity[0]: until 2026-01-01 is before from 2026-01-03",
        ),
        (
            "capacity:\n  - {from: 2026-01-03, until: 2026-01-04, multiplier: 0}\n",
            "capacity[0]: multiplier 0: write how many times",
        ),
        (
            "capacity:\n  - {from: soon, until: 2026-01-04, multiplier: 2}\n",
            "capacity[0]: from: time \"soon\"",
        ),
        (
            "capacity:\n  - {from: 2026-01-03, until: 2026-01-04, factor: 2}\n",
            "unknown field `factor`",
        ),
    ] {
        let err = CapacityFile::parse(text, "capacity.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains(says), "{err}");
        assert!(err.contains("capacity.yaml"), "{err}");
    }
}

#[test]
fn table_and_chart_explain_a_proposal() {
    let source = SyntheticSource::with_series(
        vec![(SeriesKey::bucket("api", "gw-a"), Shape::default())],
        3,
    );
    let current = CurrentLimits {
        buckets: vec![bucket("api", "gw-a", 90.0)],
    };
    let mut svg = String::new();
    let plan = spillway_configure::plan(
        &mut { source },
        window(),
        &Settings::new(Params::default()),
        &current,
        |p, h| {
            svg = chart::svg(p, h).unwrap();
        },
    )
    .unwrap();
    let table = report::table(&plan);
    assert!(table.contains("SERVICE  BUCKET"), "{table}");
    let line = table.lines().find(|l| l.starts_with("api")).unwrap();
    assert!(
        line.contains("update") && line.contains("historical"),
        "{line}"
    );
    assert!(
        line.contains("peak ") && line.contains("q0.999") && line.contains("forecast "),
        "{line}"
    );
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(
        svg.contains("proposed ") && svg.contains("current 90.0"),
        "chart lacks the limits"
    );
    assert_eq!(chart::file_name(&plan.proposals[0]), "api__gw-a.svg");
}

fn arbitrary_series() -> impl Strategy<Value = Vec<Point>> {
    let w = window();
    (
        0.0f64..5000.0,
        0.0f64..1.0,
        proptest::collection::vec(
            (
                0usize..40_320,
                prop_oneof![Just(f64::NAN), Just(-1.0), Just(f64::INFINITY), 0.0f64..1e6],
            ),
            0..50,
        ),
        0usize..40_320,
        1usize..40_320,
    )
        .prop_map(move |(level, swing, oddities, gap_from, gap_len)| {
            let mut points: Vec<Point> = (1..=w.minutes() as i64)
                .map(|i| Point {
                    at: w.start + i * MINUTE,
                    rps: level * (1.0 + swing * ((i as f64) / 300.0).sin()),
                })
                .collect();
            for (i, v) in oddities {
                points[i].rps = v;
            }
            points.drain(gap_from..(gap_from + gap_len).min(points.len()));
            points
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever the history and the parameters: no panic, no limit of zero or below one
    /// request a minute, every limit finite, a keep keeps, and clamps hold.
    #[test]
    fn plans_never_propose_zero(
        series in arbitrary_series(),
        current in proptest::option::of(0.1f64..1e5),
        policy in prop_oneof![Just(PolicyKind::Historical), Just(PolicyKind::Forecast)],
        max_change in 0.0f64..3.0,
        auto in any::<bool>(),
    ) {
        let params = Params {
            policy,
            max_change,
            headroom: if auto { Headroom::Auto } else { Headroom::Fixed(0.25) },
            ..Params::default()
        };
        let current_limits = CurrentLimits { buckets: current.map(|c| bucket("s", "b", c)).into_iter().collect() };
        let plan = spillway_configure::plan(
            &mut InMemory(vec![(SeriesKey::bucket("s", "b"), series)]),
            window(),
            &Settings::new(params),
            &current_limits,
            |p, h| { let _ = chart::svg(p, h); },
        ).unwrap();
        prop_assert_eq!(plan.proposals.len(), 1);
        let p = &plan.proposals[0];
        if let Some(limit) = p.proposed_limit_rps {
            prop_assert!(limit.is_finite() && limit >= 1.0 / 60.0, "{:?}", p);
        }
        if p.action == PlanAction::Keep {
            prop_assert_eq!(p.proposed_limit_rps, p.current_limit_rps);
        }
        if let (Some(cur), Some(new)) = (current, p.proposed_limit_rps) && new > 1.0 / 60.0 {
            prop_assert!(new <= cur * (1.0 + max_change) * (1.0 + 1e-12), "{:?}", p);
            prop_assert!(new >= cur / (1.0 + max_change) * (1.0 - 1e-12), "{:?}", p);
        }
        if p.evidence.clamp == Some(Clamp::MaxChangeUp) {
            prop_assert!(p.evidence.unclamped_rps.unwrap() > p.proposed_limit_rps.unwrap());
        }
        let _ = report::table(&plan);
    }
}
