//! A compromised proxy against the real cores on simulated time: honest `HostCore`s
//! and one host that reports absurd counts, one `ZoneCore`, one `RegionCore`, messages handed
//! over at once. The drop ratio every honest host applies must stay within the bound of
//! `spillway_loop::plausible`, `1 - L / (R + max(L, k x m))`, at every simulated millisecond;
//! and an honest fleet with one legitimately busy host must still hold its limit.

use std::time::Duration;

use spillway_core::algo::{DropRatio, Ratio};
use spillway_core::config::{self, Config};
use spillway_core::counters::Snapshot;
use spillway_core::surge;
use spillway_loop::{
    BucketKey, ClampReason, HostCore, HostId, HostStep, HostTime, Interval, RegionCore, RegionStep,
    RulesSnapshot, ZoneCore, ZoneStep,
};
use spillway_proto::v1;

/// Unix ms at the start: a whole second.
const START_MS: u64 = 1_700_000_000_000;
const NS_PER_MS: u64 = 1_000_000;
const L: f64 = 1000.0;
/// `control.plausibility.peer_multiple`'s default.
const K: f64 = 4.0;

fn yaml(interval_ms: u64) -> String {
    format!(
        "version: 1\ncontrol:\n  report_interval: {interval_ms}ms\n  instruction_ttl: {}ms\nservices:\n  api:\n    buckets:\n      - {{ name: all, limit: 1000/s, scope: region }}\n",
        interval_ms * 5
    )
}

/// What the malicious host puts in its report of each interval, from the interval's length.
type Lie = fn(u64) -> v1::BucketCounts;

fn counts(offered: u64, allowed: u64, tail: Option<u64>, hosts: Option<u64>) -> v1::BucketCounts {
    v1::BucketCounts {
        service: "api".into(),
        bucket: "all".into(),
        offered,
        allowed,
        shadow_dropped: 0,
        offered_tail: tail,
        offered_squares: None,
        hosts,
        tier_offered: Vec::new(),
        id: 0,
    }
}

/// The attack: `offered = 1e9`, all of it allowed, all of it in the tail.
fn absurd(_: u64) -> v1::BucketCounts {
    counts(1_000_000_000, 1_000_000_000, Some(1_000_000_000), None)
}

/// Plausible offered load, but a tail and an allowed count far over it, and a claim to speak
/// for a million hosts.
fn inconsistent(interval_ms: u64) -> v1::BucketCounts {
    let offered = 100 * interval_ms / 1000;
    counts(offered, 1_000_000_000, Some(1_000_000_000), Some(1_000_000))
}

/// An honest client: a constant rate, admitted at the ratio its limiter holds.
struct Honest {
    core: HostCore,
    rate: f64,
    offered: f64,
    admitted: f64,
    limiter: DropRatio,
}

impl Honest {
    fn totals(&self) -> Vec<Snapshot> {
        let allowed = self.admitted.floor() as u64;
        vec![Snapshot {
            allowed,
            dropped: (self.offered.floor() as u64).saturating_sub(allowed),
            ..Snapshot::default()
        }]
    }

    fn ratio(&self, now_ms: u64) -> f64 {
        self.limiter
            .current(now_ms * NS_PER_MS)
            .map_or(0.0, Ratio::as_f64)
    }

    fn apply(&mut self, steps: Vec<HostStep>) {
        for step in steps {
            match step {
                HostStep::DropRatio { ratio, ttl, .. } => {
                    let now = self.core.last_instructions_ms() * NS_PER_MS;
                    self.limiter.set_for(ratio, now, ttl);
                }
                HostStep::Surge { ratio, until, .. } => self.limiter.set_surge(ratio, until),
                _ => {}
            }
        }
    }
}

fn time(now_ms: u64) -> HostTime {
    HostTime {
        clock: now_ms * NS_PER_MS,
        unix_ns: now_ms * NS_PER_MS,
    }
}

/// One zone of honest hosts at `rates` (per second) and, when `lie` is given, one more host that
/// reports it every interval; its region's controller. Every host runs the controller's rules
/// (version 1) from the start.
struct Zone {
    now_ms: u64,
    interval: Interval,
    hosts: Vec<Honest>,
    lie: Option<Lie>,
    liar_due: u64,
    zone: ZoneCore,
    region: RegionCore,
}

impl Zone {
    fn start(interval_ms: u64, rates: &[f64], lie: Option<Lie>) -> Zone {
        let text = yaml(interval_ms);
        let config: Config = config::load_str(&text, "rules.yaml").unwrap();
        let rules = std::sync::Arc::new(RulesSnapshot::parse(1, &text, "rules.yaml").unwrap());
        let interval = Interval::from_ms(interval_ms);
        let mut zone = ZoneCore::new("r1", "z1", START_MS);
        zone.upstream_opened();
        let mut region = RegionCore::new("r1", rules, START_MS);
        region.join(0, "z1");
        let hosts = rates
            .iter()
            .enumerate()
            .map(|(i, &rate)| {
                let id = format!("h{i}");
                let mut core = HostCore::new(
                    HostId {
                        host_id: id.clone(),
                        region: "r1".into(),
                        zone: "z1".into(),
                    },
                    &config,
                    1,
                );
                core.start(time(START_MS), &[Snapshot::default()]);
                zone.join(&id, i as u64);
                Honest {
                    core,
                    rate,
                    offered: 0.0,
                    admitted: 0.0,
                    limiter: DropRatio::new(Duration::from_secs(1)),
                }
            })
            .collect();
        if lie.is_some() {
            zone.join("liar", 99);
        }
        Zone {
            now_ms: START_MS,
            interval,
            hosts,
            lie,
            liar_due: interval.sequence_at(START_MS),
            zone,
            region,
        }
    }

    /// Delivers a zone's steps at once, and the controller's answers to them.
    fn zone_steps(&mut self, steps: Vec<ZoneStep>) {
        for step in steps {
            match step {
                ZoneStep::Forward(report) => {
                    let steps = self.region.on_zone_report(0, report, self.now_ms);
                    self.region_steps(steps);
                }
                ZoneStep::Send { host, instructions } => {
                    if let Some(i) = host.strip_prefix('h').and_then(|i| i.parse::<usize>().ok()) {
                        let h = &mut self.hosts[i];
                        let steps = h.core.on_instructions(time(self.now_ms), instructions);
                        h.apply(steps);
                    }
                }
            }
        }
    }

    fn region_steps(&mut self, steps: Vec<RegionStep>) {
        for step in steps {
            if let RegionStep::Send { instructions, .. } = step {
                let steps = self.zone.on_instructions(self.now_ms, instructions);
                self.zone_steps(steps);
            }
        }
    }

    /// One millisecond.
    fn step(&mut self) {
        let now = self.now_ms;
        for i in 0..self.hosts.len() {
            let h = &mut self.hosts[i];
            if now >= h.core.deadline() {
                let totals = h.totals();
                if let Some(report) = h.core.on_deadline(time(now), &totals) {
                    let steps = self.zone.on_report(now, i as u64, report);
                    self.zone_steps(steps);
                }
            }
        }
        if let Some(lie) = self.lie
            && now >= self.interval.end_of(self.liar_due)
        {
            let report = v1::Report {
                surge: false,
                host_id: "liar".into(),
                zone: "z1".into(),
                region: "r1".into(),
                rules_version: 1,
                sequence: self.liar_due,
                interval_ms: self.interval.ms(),
                buckets: vec![lie(self.interval.ms())],
            };
            self.liar_due += 1;
            let steps = self.zone.on_report(now, 99, report);
            self.zone_steps(steps);
        }
        if (now - START_MS).is_multiple_of(surge::TICK_NS / NS_PER_MS) {
            for h in &mut self.hosts {
                let totals = h.totals();
                let steps = h.core.guard_tick(now * NS_PER_MS, &totals);
                h.apply(steps);
            }
        }
        if now.is_multiple_of(10) {
            let steps = self.zone.poll(now);
            self.zone_steps(steps);
            let steps = self.region.poll(now);
            self.region_steps(steps);
        }
        self.now_ms += 1;
        let now = self.now_ms;
        for h in &mut self.hosts {
            let ratio = h.ratio(now);
            h.offered += h.rate / 1000.0;
            h.admitted += h.rate / 1000.0 * (1.0 - ratio);
        }
    }

    /// The highest ratio any honest host applies now.
    fn highest_ratio(&self) -> f64 {
        self.hosts
            .iter()
            .map(|h| h.ratio(self.now_ms))
            .fold(0.0, f64::max)
    }

    /// What the honest hosts admit now, per second.
    fn admitted_rps(&self) -> f64 {
        self.hosts
            .iter()
            .map(|h| h.rate * (1.0 - h.ratio(self.now_ms)))
            .sum()
    }

    /// The drop ratio the controller computed for the bucket.
    fn computed(&self) -> f64 {
        self.region
            .view()
            .get(&BucketKey::new("api", "all"))
            .map_or(0.0, |v| v.drop_ratio)
    }
}

/// The bound of `spillway_loop::plausible` for honest rates `rates` in the liar's own zone.
fn bound(rates: &[f64]) -> f64 {
    let mut sorted = rates.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let m = if n == 0 {
        0.0
    } else if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    let r: f64 = rates.iter().sum();
    1.0 - L / (r + L.max(K * m))
}

/// The same, for the honest hosts' counts as they report them: a client counts whole requests,
/// so 20 a 200 ms interval reads 21 in some intervals; the bound holds for what was reported.
fn bound_as_counted(rates: &[f64], interval_ms: u64) -> f64 {
    let per_interval = |r: f64| r * interval_ms as f64 / 1000.0;
    let counted: Vec<f64> = rates
        .iter()
        .map(|&r| (per_interval(r) + 1.0) / per_interval(r) * r)
        .collect();
    bound(&counted)
}

/// Runs `zone` for `seconds` of simulated time, checking every millisecond that no honest host
/// drops more than `most`; returns the highest ratio seen.
fn run_within(zone: &mut Zone, seconds: u64, most: f64) -> f64 {
    let mut highest: f64 = 0.0;
    for _ in 0..seconds * 1000 {
        zone.step();
        let now = zone.highest_ratio();
        assert!(
            now <= most + 1e-6,
            "an honest host drops {now:.4} at {} ms, over the bound {most:.4}",
            zone.now_ms - START_MS
        );
        highest = highest.max(now);
    }
    highest
}

#[test]
fn one_host_reporting_a_billion_cannot_make_the_fleet_drop_more_than_the_bound() {
    // Eight honest hosts at 100/s, 800/s under a limit of 1,000/s: nothing should drop. The liar
    // counts for the limit (k x m = 400 is less), so the controller sees 1,800/s: 0.444.
    let rates = [100.0; 8];
    let most = bound(&rates);
    assert!((most - (1.0 - 1000.0 / 1800.0)).abs() < 1e-9);
    for interval_ms in [200, 1000] {
        let mut zone = Zone::start(interval_ms, &rates, Some(absurd));
        let highest = run_within(&mut zone, 10, bound_as_counted(&rates, interval_ms));
        eprintln!("{interval_ms} ms intervals: highest honest ratio {highest:.4}, bound {most:.4}");
        // The bound is reached, not undercut by luck: the liar still counts for the limit.
        assert!(highest > most - 0.02, "{highest}");
        // Honest traffic keeps at least half of what it would get: min(R, L) / 2 = 400/s.
        assert!(
            zone.admitted_rps() >= 400.0 - 1.0,
            "{}",
            zone.admitted_rps()
        );
        let clamped = zone.zone.clamped();
        let intervals = 10_000 / interval_ms;
        assert!(
            clamped.get(ClampReason::OverPeers) >= intervals - 2,
            "{clamped:?}"
        );
        assert!(clamped.get(ClampReason::TailOverPeers) >= intervals - 2);
        // 1e9 per 200 ms is 5e9/s, over the 1e6/s one host can serve.
        assert!(clamped.get(ClampReason::HostCapacity) >= intervals - 2);
        // One notice, for the liar, at the start (no honest host was clamped); the next is due
        // only after ten seconds.
        let notices = zone.zone.take_notices();
        assert_eq!(notices.len(), 1, "{notices:?}");
        assert_eq!(notices[0].clamp.host, "liar");
    }
}

#[test]
fn counts_that_contradict_each_other_are_cut_to_the_offered_load() {
    // The liar offers a plausible 100/s but claims a tail and an allowed count of 1e9 and to
    // speak for a million hosts. Its tail is cut to its offered count, so at most the tail
    // says 4 x 100/s of it; the ratio stays within the bound (here it stays at 0: the liar's
    // 4 x 20 in a 200 ms tail is not a clear enough rise over the fleet's 900/s).
    let rates = [100.0; 8];
    let mut zone = Zone::start(200, &rates, Some(inconsistent));
    let highest = run_within(&mut zone, 10, bound_as_counted(&rates, 200));
    eprintln!("highest honest ratio {highest:.4}");
    let clamped = zone.zone.clamped();
    for reason in [
        ClampReason::TailOverOffered,
        ClampReason::AllowedOverOffered,
        ClampReason::HostCount,
    ] {
        assert!(clamped.get(reason) >= 48, "{reason:?}: {clamped:?}");
    }
    // The controller counts the liar as one host among nine.
    let view = zone.region.view()[&BucketKey::new("api", "all")];
    assert!((view.observed_rps - 900.0).abs() < 30.0, "{view:?}");
}

#[test]
fn in_a_zone_of_two_the_liar_weighs_k_times_its_one_peer() {
    // One honest host at 500/s: k x m = 2,000 is over L, so the liar counts for 2,000/s and
    // the bound is 1 - 1,000 / 2,500 = 0.6.
    let rates = [500.0];
    let most = bound(&rates);
    assert!((most - 0.6).abs() < 1e-9);
    let mut zone = Zone::start(200, &rates, Some(absurd));
    let highest = run_within(&mut zone, 10, bound_as_counted(&rates, 200));
    assert!(highest > most - 0.02, "{highest}");
}

#[test]
fn an_honest_zone_with_one_busy_host_still_holds_its_limit() {
    // Eight hosts at 100/s and one at 3,000/s: 3,800/s against 1,000/s. The busy host counts
    // for the limit (k x m = 400 is less), the controller computes 1 - 1,000 / 1,800 = 0.444
    // for the scope, and the busy host is held to what was counted: it drops
    // 1 - 0.556 x 1,000 / 3,000 = 0.815. Together they admit the limit.
    let mut rates = vec![100.0; 8];
    rates.push(3000.0);
    let mut zone = Zone::start(200, &rates, None);
    for _ in 0..5_000 {
        zone.step();
    }
    let mut low = f64::MAX;
    let mut high: f64 = 0.0;
    for _ in 0..5_000 {
        zone.step();
        low = low.min(zone.admitted_rps());
        high = high.max(zone.admitted_rps());
    }
    eprintln!(
        "admitted {low:.0} to {high:.0}/s; scope ratio {:.3}",
        zone.computed()
    );
    assert!(high <= 1.03 * L && low >= 0.97 * L, "{low} to {high}");
    assert!((zone.computed() - (1.0 - 1000.0 / 1800.0)).abs() < 0.02);
    let busy = zone.hosts[8].ratio(zone.now_ms);
    assert!((busy - 0.815).abs() < 0.02, "{busy}");
    assert!(zone.zone.clamped().get(ClampReason::OverPeers) > 0);
}

#[test]
fn a_lone_host_over_its_limit_is_held_to_the_limit() {
    // A zone of one host at 3x the limit (a caller whose traffic all lands on one proxy): it
    // counts for L, the controller computes 0, and the host drops 2/3 by itself.
    let mut zone = Zone::start(200, &[3000.0], None);
    for _ in 0..5_000 {
        zone.step();
    }
    assert!(
        (zone.admitted_rps() - L).abs() < 0.03 * L,
        "{}",
        zone.admitted_rps()
    );
    assert_eq!(zone.computed(), 0.0);
}

#[test]
fn an_uneven_honest_zone_under_its_limit_is_not_clamped() {
    // Loads within k x the median of each other, and one host bursting 30x while the zone stays
    // under the limit: nothing is clamped and nothing dropped.
    let rates = [50.0, 80.0, 20.0, 120.0, 60.0, 600.0];
    let mut zone = Zone::start(200, &rates, None);
    for _ in 0..5_000 {
        zone.step();
        assert_eq!(zone.highest_ratio(), 0.0);
    }
    assert_eq!(zone.zone.clamped().total(), 0);
}
