//! What one host's report may count for in its zone's sums: a broken or compromised
//! proxy that reports absurd load, `offered = 1e9` for a bucket, must not make every proxy of the
//! fleet drop everything.
//!
//! The aggregator bounds each host's counts twice before it sums its zone:
//!
//! 1. **On its own** ([`check_report`]), as each report arrives: a host offers at most
//!    `control.plausibility.max_host_rps` (default 1,000,000/s; one sidecar serves about 63,000);
//!    what it allowed, shadow-dropped or offered in the interval's tail are parts of what it
//!    offered, so none is larger; and it speaks for one host.
//! 2. **Against its zone** ([`bound_peers`]), when the interval closes: a host's offered load to
//!    a bucket counts for at most `C = max(k x m, L)`, where `m` is the median offered load of
//!    the *other* hosts of the zone that offered to the bucket in the interval (a host that left
//!    within it is bounded but no peer: its last report covers part of the interval), `k` is
//!    `control.plausibility.peer_multiple` (default 4) and `L` is the bucket's limit over the
//!    interval; its tail counts for at most `max(k x m_tail, L / 4)` the same way.
//!
//! **The bound.** A single malicious host adds at most `C` to what the controller sees for the
//! bucket, so with honest load `R` (per second, over the bucket's scope) the drop ratio it can
//! cause is at most `1 - L / (R + max(L, k x m))`, with `m` the median honest host of its zone.
//! When the median honest host of its zone offers at most `L / k` (a zone of `k` or more hosts
//! sharing a fleet at its limit, or no honest host in its zone at all), that is
//! `1 - L / (R + L)`: at `R = L`, 1/2 instead of 0.9999999, and honest traffic always keeps at
//! least half of what it would get, `min(R, L) / 2`. In a smaller zone the median honest host
//! weighs more: two hosts at `R = L`, one malicious, give `k x m = 4 L` and a bound of 0.8.
//!
//! **Why the limit is the floor.** A host whose traffic is legitimately its own (a per-caller
//! bucket that lands on one proxy, a zone of one proxy) has no peers to compare with; counted at
//! the limit, with its own ratio raised as below, it admits exactly the limit.
//!
//! **A clamped host is held to what was counted.** The controller computes the scope's ratio `d`
//! from the clamped sums, so an honest host counted at `C` instead of its `X` would let through
//! `X (1 - d)`, more than its part. The aggregator therefore sends that host, for drop-ratio
//! buckets, `1 - (1 - d) x C / X` ([`Factors`]): it admits `C (1 - d)`, what the controller
//! planned for it, and the limit holds; the cost of a clamp falls on the clamped host's callers,
//! never on the fleet. A host lying about its load only raises its own ratio.

use std::collections::{BTreeMap, HashMap};

use spillway_core::algo::Kind;
use spillway_core::config::model::Plausibility;
use spillway_core::config::{Config, Control, Services};
use spillway_proto::v1;

use crate::interval::Interval;
use crate::rules::{DecodeRules, LinkRules};
use crate::sums::{BucketKey, KeyHasher, Sums, TAIL_PARTS};

/// Why a host's count was lowered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClampReason {
    /// Offered more than `max_host_rps`.
    HostCapacity,
    /// Allowed more than it offered.
    AllowedOverOffered,
    /// Shadow-dropped more than it offered.
    ShadowOverOffered,
    /// Offered more in the interval's last quarter than in the whole interval.
    TailOverOffered,
    /// Its own report said it counts for another number of hosts than one.
    HostCount,
    /// Offered more than `peer_multiple` times its zone's median host, and more than the limit.
    OverPeers,
    /// The same for the interval's tail.
    TailOverPeers,
}

impl ClampReason {
    pub const ALL: [ClampReason; 7] = [
        ClampReason::HostCapacity,
        ClampReason::AllowedOverOffered,
        ClampReason::ShadowOverOffered,
        ClampReason::TailOverOffered,
        ClampReason::HostCount,
        ClampReason::OverPeers,
        ClampReason::TailOverPeers,
    ];

    /// The `reason` label of `spillway_control_plane_clamped_total`.
    pub fn label(self) -> &'static str {
        match self {
            ClampReason::HostCapacity => "host_capacity",
            ClampReason::AllowedOverOffered => "allowed_over_offered",
            ClampReason::ShadowOverOffered => "shadow_over_offered",
            ClampReason::TailOverOffered => "tail_over_offered",
            ClampReason::HostCount => "host_count",
            ClampReason::OverPeers => "over_peers",
            ClampReason::TailOverPeers => "tail_over_peers",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// One count of one host lowered: what it reported and what was counted instead, per interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountClamp {
    pub host: String,
    pub bucket: BucketKey,
    pub reason: ClampReason,
    pub reported: u64,
    pub counted: u64,
}

/// Clamps so far, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClampCounts([u64; ClampReason::ALL.len()]);

impl ClampCounts {
    pub fn add(&mut self, reason: ClampReason) {
        self.0[reason.index()] += 1;
    }

    pub fn get(&self, reason: ClampReason) -> u64 {
        self.0[reason.index()]
    }

    /// Every reason with its count, in [`ClampReason::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (ClampReason, u64)> + '_ {
        ClampReason::ALL.into_iter().map(|r| (r, self.get(r)))
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// The bounds in force: the controller's `control.plausibility` and its buckets' limits, or the
/// defaults and no limits before its rules came.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlausibleBounds {
    /// Whether these are the controller's (rules came) rather than the defaults.
    known: bool,
    plausibility: Plausibility,
    /// Limits of the buckets the control plane computes, per second.
    limits: HashMap<BucketKey, f64>,
}

impl PlausibleBounds {
    /// The bounds of a validated configuration.
    pub fn from_config(config: &Config) -> Self {
        let limits = config
            .buckets()
            .filter(|(_, b)| computed(b.algorithm))
            .map(|(s, b)| (BucketKey::new(&s.name, &b.name), b.limit.per_second()))
            .collect();
        Self {
            known: true,
            plausibility: config.control.plausibility.clone(),
            limits,
        }
    }

    /// The bounds of a configuration's `control` and `services` as written.
    pub fn from_file(control: &Control, services: &Services) -> Self {
        let limits = services
            .0
            .iter()
            .flat_map(|(name, s)| s.buckets.iter().map(move |b| (name, b)))
            .filter(|(_, b)| computed(b.algorithm))
            .map(|(s, b)| (BucketKey::new(s, &b.name), b.limit.per_second()))
            .collect();
        Self {
            known: true,
            plausibility: control.plausibility.clone(),
            limits,
        }
    }

    /// The bounds of rules as they come down from the controller (its `control` and its
    /// buckets' limits); `None` when they do not read, and then the bounds in force stay.
    pub fn from_rules(rules: &v1::Rules) -> Option<Self> {
        let rules = LinkRules::decode(rules).ok()?;
        Some(Self::from_file(&rules.control, &rules.services))
    }

    pub fn plausibility(&self) -> &Plausibility {
        &self.plausibility
    }

    /// The limit of `bucket` per second, when the rules name it.
    pub fn limit_rps(&self, bucket: &BucketKey) -> Option<f64> {
        self.limits.get(bucket).copied()
    }

    /// The most one host can offer in one `interval`.
    pub fn max_host_offered(&self, interval: Interval) -> u64 {
        per_interval(self.plausibility.max_host_rps as f64, interval)
    }
}

/// Buckets whose limit the control plane computes from the hosts' counts.
fn computed(kind: Kind) -> bool {
    matches!(kind, Kind::DropRatio | Kind::AdaptiveTokenBucket)
}

/// A rate per second as a count per interval, rounded up and saturating.
fn per_interval(rps: f64, interval: Interval) -> u64 {
    let n = (rps * interval.secs()).ceil();
    if n >= u64::MAX as f64 {
        u64::MAX
    } else {
        n as u64
    }
}

/// Bounds one host's own counts of one interval in place (step 1 of the module docs), calling
/// `clamped(bucket, reason, reported, counted)` for each count lowered.
pub fn check_report(
    sums: &mut Sums,
    bounds: &PlausibleBounds,
    interval: Interval,
    mut clamped: impl FnMut(&BucketKey, ClampReason, u64, u64),
) {
    let most = bounds.max_host_offered(interval);
    for (key, c) in &mut sums.0 {
        let mut lower = |value: &mut u64, bound: u64, reason| {
            if *value > bound {
                clamped(key, reason, *value, bound);
                *value = bound;
            }
        };
        // A sum of costs over n requests has `sum c^2 <= (sum c)^2`: at least one arrival.
        c.offered_squares = c.offered_squares.min(c.offered.saturating_mul(c.offered));
        let mut offered = c.offered;
        lower(&mut offered, most, ClampReason::HostCapacity);
        c.lower_offered(offered);
        lower(&mut c.allowed, offered, ClampReason::AllowedOverOffered);
        lower(
            &mut c.shadow_dropped,
            offered,
            ClampReason::ShadowOverOffered,
        );
        lower(&mut c.offered_tail, offered, ClampReason::TailOverOffered);
        let one = u64::from(offered > 0);
        if c.hosts != one {
            clamped(key, ClampReason::HostCount, c.hosts, one);
            c.hosts = one;
        }
        c.fit_tiers();
    }
}

/// For each host clamped against its peers, per bucket, the part of its load that was counted
/// (`counted / reported`, under 1): what [`Factors::hold`] holds it to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Factors(HashMap<String, Vec<(BucketKey, f64)>>);

impl Factors {
    /// Whether no host was clamped.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Notes that `counted` of `host`'s load to `bucket` was counted.
    pub(crate) fn insert(&mut self, host: String, bucket: BucketKey, counted: f64) {
        self.0.entry(host).or_default().push((bucket, counted));
    }

    /// Whether `host` was clamped in any bucket.
    pub fn holds(&self, host: &str) -> bool {
        self.0.contains_key(host)
    }

    /// The part of `host`'s load to `bucket` that was counted (1 when it was not clamped).
    pub fn counted(&self, host: &str, bucket: &BucketKey) -> f64 {
        self.0
            .get(host)
            .and_then(|b| b.iter().find(|(k, _)| k == bucket))
            .map_or(1.0, |(_, f)| *f)
    }

    /// The drop ratio that holds `host` to what was counted of its load to `bucket`, when the
    /// scope's ratio is `ratio`: `1 - (1 - ratio) x counted / reported`. A host counted at 1,000
    /// of the 4,000 it reported, under a ratio of 0.2, drops 0.8: it admits 800, what the
    /// controller planned for the 1,000 it counted.
    pub fn hold(&self, host: &str, bucket: &BucketKey, ratio: f64) -> f64 {
        let part = self.counted(host, bucket);
        if part >= 1.0 {
            ratio
        } else {
            1.0 - (1.0 - ratio.clamp(0.0, 1.0)) * part
        }
    }

    /// Hosts with a clamp, with their buckets.
    pub fn hosts(&self) -> impl Iterator<Item = (&String, &Vec<(BucketKey, f64)>)> {
        self.0.iter()
    }
}

/// The median of `sorted` without its element at `skip`, if any: 0 when nothing is left.
fn median_without(sorted: &[u64], skip: Option<usize>) -> f64 {
    let n = sorted.len().saturating_sub(usize::from(skip.is_some()));
    if n == 0 {
        return 0.0;
    }
    let at = |j: usize| {
        sorted[if skip.is_some_and(|s| j >= s) {
            j + 1
        } else {
            j
        }] as f64
    };
    if n % 2 == 1 {
        at(n / 2)
    } else {
        (at(n / 2 - 1) + at(n / 2)) / 2.0
    }
}

/// Bounds the hosts of one closed interval against each other in place (step 2 of the module
/// docs), calling `clamped(host, bucket, reason, reported, counted)` for each count lowered, and
/// returns what part of each clamped host's load was counted.
///
/// Before the controller's rules came (an aggregator's first interval is summed before its first
/// instructions bring them), a bucket's limit is unknown: a host is bounded by its peers alone,
/// `k x m`, only its count is lowered and no factor is returned, since holding an honest host
/// that is merely four times its zone's median to such a count could drop it under a limit the
/// zone does not even reach; a host with no peer is left as it is. Once the rules came, a bucket
/// they do not name is left as it is (the controller computes nothing for it).
///
/// Only hosts for which `peer` is true are the others' peers: a host that left within the
/// interval is bounded like any, but its last report covers only part of the interval (and no
/// tail when it left before the tail), so it is no measure of what a host offers.
pub fn bound_peers(
    hosts: &mut BTreeMap<String, Sums>,
    bounds: &PlausibleBounds,
    interval: Interval,
    mut clamped: impl FnMut(&str, &BucketKey, ClampReason, u64, u64),
    peer: impl Fn(&str) -> bool,
) -> Factors {
    let mut list: Vec<(String, Sums)> = std::mem::take(hosts).into_iter().collect();
    let held = bound_peers_by(
        &mut list,
        bounds,
        interval,
        |h: &String, key, reason, from, to| clamped(h, key, reason, from, to),
        |h: &String| peer(h),
    );
    *hosts = list.into_iter().collect();
    let mut factors = Factors::default();
    for (host, key, counted) in held {
        factors.insert(host, key, counted);
    }
    factors
}

/// A host's offered counts of a bucket, as [`bound_peers_by`] compares them with its peers'.
#[derive(Debug, Clone, Copy)]
struct Offered {
    offered: u64,
    offered_tail: u64,
}

/// [`bound_peers`] over hosts known by any key `K` (an aggregator's host slots), in the order
/// given: returns, for each clamped host and bucket, the part of its load that was counted.
pub fn bound_peers_by<K: Clone>(
    hosts: &mut [(K, Sums)],
    bounds: &PlausibleBounds,
    interval: Interval,
    mut clamped: impl FnMut(&K, &BucketKey, ClampReason, u64, u64),
    peer: impl Fn(&K) -> bool,
) -> Vec<(K, BucketKey, f64)> {
    let k = f64::from(bounds.plausibility.peer_multiple);
    // Per bucket, the hosts that offered to it, by their position in `hosts`, with what they
    // offered over the interval and in its tail (all that is compared: 24 bytes a host, not the
    // whole counts).
    let mut buckets: HashMap<&BucketKey, Vec<(usize, Offered)>, KeyHasher> = HashMap::default();
    for (at, (_, sums)) in hosts.iter().enumerate() {
        for (key, c) in &sums.0 {
            if c.offered > 0 {
                buckets
                    .entry(key)
                    .or_insert_with(|| Vec::with_capacity(hosts.len() - at))
                    .push((
                        at,
                        Offered {
                            offered: c.offered,
                            offered_tail: c.offered_tail,
                        },
                    ));
            }
        }
    }
    // Per host, the counts to lower: (host, bucket, offered, tail).
    let mut lowered: Vec<(usize, BucketKey, u64, u64)> = Vec::new();
    let mut factors = Vec::new();
    for (key, offered_by) in buckets {
        let limit = bounds.limit_rps(key);
        let early = limit.is_none() && !bounds.known;
        let peers = || {
            offered_by
                .iter()
                .filter(|(h, _)| peer(&hosts[*h].0))
                .map(|(_, c)| c)
        };
        let mut offered: Vec<u64> = peers().map(|c| c.offered).collect();
        let mut tails: Vec<u64> = peers().map(|c| c.offered_tail).collect();
        if !(limit.is_some() || early && offered.len() >= 2) {
            continue;
        }
        let floor = limit.map_or(0.0, |l| per_interval(l, interval) as f64);
        offered.sort_unstable();
        tails.sort_unstable();
        for &(at, c) in &offered_by {
            let host = &hosts[at].0;
            // Its own place in each order, when it is among the peers: any index holding its
            // value leaves the same others.
            let own = peer(host);
            let at_offered = own.then(|| offered.partition_point(|&v| v < c.offered));
            let at_tail = own.then(|| tails.partition_point(|&v| v < c.offered_tail));
            let most = (k * median_without(&offered, at_offered)).max(floor);
            let most_tail = (k * median_without(&tails, at_tail)).max(floor / TAIL_PARTS as f64);
            let over = c.offered as f64 > most;
            let over_tail = c.offered_tail as f64 > most_tail;
            if !(over || over_tail) {
                continue;
            }
            let offered_now = if over { most.ceil() as u64 } else { c.offered };
            let tail_now = if over_tail {
                most_tail.ceil() as u64
            } else {
                c.offered_tail
            }
            .min(offered_now);
            if over {
                clamped(host, key, ClampReason::OverPeers, c.offered, offered_now);
            }
            if over_tail {
                clamped(
                    host,
                    key,
                    ClampReason::TailOverPeers,
                    c.offered_tail,
                    tail_now,
                );
            }
            let part = |now: u64, was: u64| {
                if was > 0 {
                    now as f64 / was as f64
                } else {
                    1.0
                }
            };
            let counted = part(offered_now, c.offered).min(part(tail_now, c.offered_tail));
            if !early {
                factors.push((host.clone(), key.clone(), counted));
            }
            lowered.push((at, key.clone(), offered_now, tail_now));
        }
    }
    for (at, key, offered, tail) in lowered {
        if let Some(c) = hosts[at].1.0.get_mut(&key) {
            c.lower_offered(offered);
            c.offered_tail = tail;
            c.allowed = c.allowed.min(offered);
            c.shadow_dropped = c.shadow_dropped.min(offered);
            c.fit_tiers();
        }
    }
    factors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sums::Counts;
    use spillway_core::criticality::TIERS;

    fn counts(offered: u64, tail: u64) -> Counts {
        Counts {
            offered,
            offered_tail: tail,
            allowed: offered,
            shadow_dropped: 0,
            hosts: 1,
            tiers: [0; TIERS],
            offered_squares: 0,
        }
    }

    /// The bounds of rules with the bucket at `limit_rps`, or before any rules came.
    fn bounds(limit_rps: Option<f64>) -> PlausibleBounds {
        let mut b = PlausibleBounds::default();
        if let Some(l) = limit_rps {
            b.known = true;
            b.limits.insert(BucketKey::new("api", "all"), l);
        }
        b
    }

    fn zone(loads: &[(u64, u64)]) -> BTreeMap<String, Sums> {
        loads
            .iter()
            .enumerate()
            .map(|(i, &(o, t))| {
                let sums = Sums(HashMap::from_iter([(
                    BucketKey::new("api", "all"),
                    counts(o, t),
                )]));
                (format!("h{i}"), sums)
            })
            .collect()
    }

    /// A clamp as the tests see it: host, reason, reported, counted.
    type Seen = (String, ClampReason, u64, u64);

    /// Bounds hosts of (offered, tail) against each other: what each counts for, the clamps
    /// and the factors.
    fn run(loads: &[(u64, u64)], limit: Option<f64>) -> (Vec<u64>, Vec<Seen>, Factors) {
        let mut hosts = zone(loads);
        let mut seen = Vec::new();
        let factors = bound_peers(
            &mut hosts,
            &bounds(limit),
            Interval::from_ms(1000),
            |h, _, r, from, to| seen.push((h.to_owned(), r, from, to)),
            |_| true,
        );
        seen.sort();
        let key = BucketKey::new("api", "all");
        let offered = hosts.values().map(|s| s.offered(&key)).collect();
        (offered, seen, factors)
    }

    #[test]
    fn the_median_of_the_others_leaves_out_the_host_itself() {
        assert_eq!(median_without(&[1, 2, 3], Some(2)), 1.5);
        assert_eq!(median_without(&[1, 2, 3], Some(0)), 2.5);
        assert_eq!(median_without(&[1, 2, 3, 9], Some(3)), 2.0);
        assert_eq!(median_without(&[5], Some(0)), 0.0);
        assert_eq!(median_without(&[5, 7], Some(1)), 5.0);
        // A host that is no peer is measured against all of them.
        assert_eq!(median_without(&[1, 2, 3], None), 2.0);
        assert_eq!(median_without(&[], None), 0.0);
    }

    #[test]
    fn a_host_that_left_is_bounded_but_no_peer() {
        // Two hosts at 525 offered, 150 in the tail, and one that left halfway with 225 and no
        // tail; limit 200/s. As a peer its empty tail would bound the others' tails to 4 x 0,
        // at most the floor of 50, and hold each of them to a third of its share.
        let loads = [("a", 525, 150), ("b", 525, 150), ("gone", 225, 0)];
        let mut hosts: BTreeMap<String, Sums> = loads
            .iter()
            .map(|&(h, o, t)| {
                let mut sums = Sums::default();
                sums.0.insert(BucketKey::new("api", "all"), counts(o, t));
                (h.to_owned(), sums)
            })
            .collect();
        let mut seen = Vec::new();
        let factors = bound_peers(
            &mut hosts,
            &bounds(Some(200.0)),
            Interval::from_ms(1000),
            |h, _, r, _, _| seen.push((h.to_owned(), r)),
            |h| h != "gone",
        );
        assert!(seen.is_empty(), "{seen:?}");
        assert!(factors.is_empty());
        // Bounded all the same: a host that left with a count far over its peers is clamped.
        hosts
            .get_mut("gone")
            .unwrap()
            .0
            .insert(BucketKey::new("api", "all"), counts(90_000, 0));
        bound_peers(
            &mut hosts,
            &bounds(Some(200.0)),
            Interval::from_ms(1000),
            |h, _, r, _, _| seen.push((h.to_owned(), r)),
            |h| h != "gone",
        );
        assert_eq!(seen, [("gone".to_owned(), ClampReason::OverPeers)]);
    }

    #[test]
    fn one_absurd_host_counts_for_the_limit_and_is_held_to_it() {
        // Four hosts at 200/s (tails 50), one at 1e9, limit 1,000/s: k x m = 800, under the
        // limit, so the liar counts for 1,000.
        let loads = [
            (200, 50),
            (200, 50),
            (1_000_000_000, 250_000_000),
            (200, 50),
            (200, 50),
        ];
        let (offered, seen, factors) = run(&loads, Some(1000.0));
        assert_eq!(offered, [200, 200, 1000, 200, 200]);
        assert_eq!(
            seen,
            [
                ("h2".into(), ClampReason::OverPeers, 1_000_000_000, 1000),
                ("h2".into(), ClampReason::TailOverPeers, 250_000_000, 250),
            ]
        );
        let key = BucketKey::new("api", "all");
        assert!((factors.counted("h2", &key) - 1e-6).abs() < 1e-12);
        assert_eq!(factors.hold("h0", &key, 0.5), 0.5);
        // Under a scope ratio of 0.5, the liar is told to drop all but a millionth of a half.
        assert!(factors.hold("h2", &key, 0.5) > 0.999_999);
    }

    #[test]
    fn an_even_fleet_a_lone_host_and_a_busy_host_under_the_limit_are_left_alone() {
        // Even, and uneven within k x the median.
        assert!(run(&[(300, 75); 6], Some(1000.0)).1.is_empty());
        assert!(
            run(&[(100, 25), (390, 97), (120, 30)], Some(100.0))
                .1
                .is_empty()
        );
        // A host bursting 50x while the fleet is under the limit: over k x m, not over L.
        assert!(
            run(&[(60, 15), (3060, 765), (55, 14), (70, 17)], Some(10_000.0))
                .1
                .is_empty()
        );
        // Alone, at up to its limit; and alone with no limit known.
        assert!(run(&[(900, 225)], Some(1000.0)).1.is_empty());
        assert!(run(&[(5_000_000, 1_250_000)], None).1.is_empty());
    }

    #[test]
    fn a_lone_host_over_its_limit_counts_for_the_limit() {
        // A per-caller bucket on one host at 3x its limit: counted at L, held to L.
        let (offered, seen, factors) = run(&[(3000, 750)], Some(1000.0));
        assert_eq!(offered, [1000]);
        assert_eq!(seen.len(), 2);
        let key = BucketKey::new("api", "all");
        // The controller sees L: ratio 0. The host drops 2/3 and admits L.
        assert!((factors.hold("h0", &key, 0.0) - 2.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn before_the_rules_came_peers_alone_bound_a_count_and_nobody_is_held() {
        let (offered, seen, factors) = run(&[(100, 25), (1_000_000, 250_000), (120, 30)], None);
        // The others' median is 110: k x m = 440.
        assert_eq!(offered, [100, 440, 120]);
        assert_eq!(
            seen[0],
            ("h1".into(), ClampReason::OverPeers, 1_000_000, 440)
        );
        assert!(factors.is_empty());
        // Once the rules came, a bucket they do not name is left alone.
        let mut hosts = zone(&[(100, 25), (1_000_000, 250_000), (120, 30)]);
        let mut other = bounds(Some(1000.0));
        other.limits.clear();
        bound_peers(
            &mut hosts,
            &other,
            Interval::from_ms(1000),
            |_, _, _, _, _| panic!("clamped"),
            |_| true,
        );
    }

    #[test]
    fn a_tail_alone_over_its_peers_is_bounded_and_counted() {
        // Offered like its peers, but a tail of the whole limit, four times: 4 x 1,000 = 4,000/s
        // at the interval's end, against peers at 50 and L = 1,000.
        let (offered, seen, factors) = run(&[(200, 50), (1000, 1000), (200, 50)], Some(1000.0));
        assert_eq!(offered, [200, 1000, 200]);
        assert_eq!(seen, [("h1".into(), ClampReason::TailOverPeers, 1000, 250)]);
        let key = BucketKey::new("api", "all");
        assert_eq!(factors.counted("h1", &key), 0.25);
    }

    #[test]
    fn a_report_is_bounded_on_its_own() {
        let key = BucketKey::new("api", "all");
        let mut sums = Sums(HashMap::from_iter([(
            key.clone(),
            Counts {
                offered: 5_000_000,
                offered_tail: 9_000_000,
                allowed: 7_000_000,
                shadow_dropped: 6_000_000,
                hosts: 40,
                tiers: [0; TIERS],
                offered_squares: 0,
            },
        )]));
        let mut seen = Vec::new();
        check_report(
            &mut sums,
            &PlausibleBounds::default(),
            Interval::from_ms(500),
            |_, r, from, to| seen.push((r, from, to)),
        );
        // 1,000,000/s over 500 ms.
        assert_eq!(
            sums.counts(&key),
            Counts {
                offered: 500_000,
                offered_tail: 500_000,
                allowed: 500_000,
                shadow_dropped: 500_000,
                hosts: 1,
                tiers: [0; TIERS],
                // Each unit one arrival, as before the clamp.
                offered_squares: 500_000,
            }
        );
        assert_eq!(
            seen,
            [
                (ClampReason::HostCapacity, 5_000_000, 500_000),
                (ClampReason::AllowedOverOffered, 7_000_000, 500_000),
                (ClampReason::ShadowOverOffered, 6_000_000, 500_000),
                (ClampReason::TailOverOffered, 9_000_000, 500_000),
                (ClampReason::HostCount, 40, 1),
            ]
        );
        // An honest report passes untouched.
        let honest = Sums(HashMap::from_iter([(key.clone(), counts(100, 25))]));
        let mut same = honest.clone();
        check_report(
            &mut same,
            &PlausibleBounds::default(),
            Interval::from_ms(1000),
            |_, _, _, _| panic!("clamped"),
        );
        assert_eq!(same, honest);
    }
}
