//! The host's side of the control loop as a sans-IO state machine: when to count and report, what
//! an instruction set means for each control-plane bucket, the surge guard between instructions,
//! and the expiry that makes a host fail open.
//!
//! [`HostCore`] reads no clock and holds no limiter. Its owner passes the time and the counters'
//! totals in, and applies the [`HostStep`]s that come out to its limiters: the link of
//! `spillway-link` does it for an embedding client or a sidecar, the simulator for each simulated
//! host, so both run exactly this code. Two clocks come in: the limiters' own (monotonic
//! nanoseconds, what ratios and shares are set against) and the wall clock (Unix time, what
//! report intervals are aligned to); the simulator passes the same simulated time for both.

use std::collections::HashMap;
use std::time::Duration;

use spillway_core::algo::{
    AdaptiveTokenBucket, DropRatio, Kind, Ratio, Share, TierRatios, uniform,
};
use spillway_core::clock::{Nanos, nanos};
use spillway_core::config::{Config, StateStore};
use spillway_core::counters::Snapshot;
use spillway_core::criticality::{TIERS, shed_to};
use spillway_core::surge::{self, Instructed, SurgeGuard};
use spillway_proto::v1;

use crate::fence::Fence;
use crate::interval::Interval;
use crate::sums::{BucketKey, Counts, TAIL_PARTS};
use crate::tally::{Counted, Tally};

/// The time of an event on a host: its limiters' clock and the wall clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostTime {
    /// The limiters' clock (`spillway_core::clock`), in nanoseconds.
    pub clock: Nanos,
    /// Unix time in nanoseconds, which report intervals are aligned to.
    pub unix_ns: u64,
}

impl HostTime {
    /// Unix milliseconds.
    pub fn unix_ms(self) -> u64 {
        self.unix_ns / 1_000_000
    }
}

/// Who a host is, as its reports say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostId {
    pub host_id: String,
    pub region: String,
    pub zone: String,
}

/// What the owner of a [`HostCore`] applies to its limiters. `bucket` is a position in
/// [`HostCore::buckets`].
#[derive(Debug, Clone, PartialEq)]
pub enum HostStep {
    /// A drop-ratio bucket drops `ratio` of its requests until `ttl` from now, unless a newer
    /// instruction comes; after that it admits everything again. Each criticality tier
    /// drops its own ratio of `tiers`, the lowest first.
    DropRatio {
        bucket: usize,
        ratio: Ratio,
        tiers: TierRatios,
        ttl: Duration,
    },
    /// A drop-ratio bucket's own ratio between instructions (`spillway_core::surge`): drop
    /// `ratio` instead of the instruction's until `until` on the limiters' clock, then the
    /// instruction's again. Higher than the instruction's in a surge, lower once the host's load
    /// fell below what the instruction was computed from. Every tick of the guard and every
    /// instruction sends one.
    Surge {
        bucket: usize,
        ratio: Ratio,
        tiers: TierRatios,
        until: Nanos,
    },
    /// An adaptive token bucket refills at `share` of its limit.
    Share { bucket: usize, share: Share },
    /// An adaptive token bucket's share expired: it refills at its whole limit again, as a host
    /// alone would, until the control plane sends a new one.
    ShareExpired { bucket: usize },
    /// New rules as version `version`, the message as it came (of either shape: read it with
    /// [`crate::LinkRules::decode`] and run it with the host's own settings,
    /// [`crate::LinkRules::with_own`]): apply them, then call [`HostCore::rules_applied`] or
    /// [`HostCore::rules_refused`], which apply the rest of the instruction set that carried
    /// them.
    Rules { version: u64, rules: v1::Rules },
}

/// A bucket's limiter as a [`HostStep`] reaches it: the two algorithms the control plane steers.
#[derive(Debug, Clone, Copy)]
pub enum SteeredLimiter<'a> {
    DropRatio(&'a DropRatio),
    Adaptive(&'a AdaptiveTokenBucket),
}

/// What [`HostStep::apply_to`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepApplied {
    /// A drop-ratio instruction is in force until `expires` on the limiters' clock.
    Instruction { expires: Nanos },
    /// A surge ratio or an adaptive share is in force.
    Applied,
    /// The step is not for this kind of limiter (a bucket that counts locally now), or carries
    /// rules: nothing changed.
    Ignored,
}

impl HostStep {
    /// Applies this step to its bucket's `limiter` at `now` on the limiters' clock: a drop ratio
    /// (by tier) until its ttl, a surge ratio until its end, an adaptive share, or the whole
    /// limit again once the share expired. The one place a step reaches a limiter: the client's
    /// link and the simulator both call it.
    pub fn apply_to(&self, limiter: SteeredLimiter<'_>, now: Nanos) -> StepApplied {
        match (limiter, self) {
            (
                SteeredLimiter::DropRatio(d),
                HostStep::DropRatio {
                    ratio, tiers, ttl, ..
                },
            ) => {
                let expires = now.saturating_add(nanos(*ttl));
                d.set_tiers(*ratio, tiers, expires);
                StepApplied::Instruction { expires }
            }
            (
                SteeredLimiter::DropRatio(d),
                HostStep::Surge {
                    ratio,
                    tiers,
                    until,
                    ..
                },
            ) => {
                d.set_surge_tiers(*ratio, tiers, *until);
                StepApplied::Applied
            }
            (SteeredLimiter::Adaptive(a), HostStep::Share { share, .. }) => {
                a.set_share(now, *share);
                StepApplied::Applied
            }
            (SteeredLimiter::Adaptive(a), HostStep::ShareExpired { .. }) => {
                a.set_share(now, Ratio::ONE);
                StepApplied::Applied
            }
            _ => StepApplied::Ignored,
        }
    }
}

/// One control-plane bucket as the host core tracks it.
#[derive(Debug)]
struct Bucket {
    key: BucketKey,
    kind: Kind,
    limit_rps: f64,
    /// Totals at the previous report or tail mark.
    reported: Snapshot,
    guard: SurgeGuard,
    /// The offered total at the guard's last tick, and when that tick was.
    guard_offered: u64,
    guard_at: Option<Nanos>,
    /// When an adaptive share stops holding, on the limiters' clock.
    share_until: Option<Nanos>,
    /// The last instruction's ratio and its tiers: the guard's ratio, when it is the same, drops
    /// by the instruction's tiers (split by the whole scope's load).
    instructed: (Ratio, TierRatios),
    /// The host's own recent load per tier, decayed by a quarter per guard tick, and the tiers'
    /// totals at the last tick: a guard's ratio of its own is split by it.
    mix: [u64; TIERS],
    guard_tiers: [u64; TIERS],
    /// What one request stands for in the bucket's counts (1; a token budget's counts are
    /// tokens, [`HostCore::set_units`]): the surge guard divides its counts and rates by it.
    unit: f64,
}

impl Bucket {
    fn new(key: BucketKey, kind: Kind, limit_rps: f64) -> Self {
        Self {
            key,
            kind,
            limit_rps,
            reported: Snapshot::default(),
            guard: SurgeGuard::new(),
            guard_offered: 0,
            guard_at: None,
            share_until: None,
            instructed: (Ratio::ZERO, uniform(Ratio::ZERO)),
            mix: [0; TIERS],
            guard_tiers: [0; TIERS],
            unit: 1.0,
        }
    }

    /// The step of a guard tick at `now` of bucket `bucket` (this one) that left `ratio`: it
    /// holds until two ticks later, unless the next tick replaces it.
    fn guard_step(&self, bucket: usize, ratio: Ratio, now: Nanos) -> HostStep {
        HostStep::Surge {
            bucket,
            ratio,
            tiers: self.guard_tiers(ratio),
            until: now.saturating_add(2 * surge::TICK_NS),
        }
    }

    /// The tiers of the guard's ratio `ratio`: the instruction's when it is the instruction's
    /// ratio; else the instruction's tiers moved ([`shed_to`]) so that the host admits the part
    /// of its own recent load the guard's ratio keeps, relative to what the instruction kept.
    /// A host whose load eases thus spares the tiers the instruction spares, and a host of only
    /// critical traffic, which the instruction spared, drops critical requests only for a surge
    /// of its own.
    fn guard_tiers(&self, ratio: Ratio) -> TierRatios {
        let (instructed, tiers) = self.instructed;
        if ratio == instructed || tiers == uniform(instructed) {
            return if ratio == instructed {
                tiers
            } else {
                uniform(ratio)
            };
        }
        // The guard holds the host to `1 - ratio` of its load where the instruction let
        // `1 - instructed` through; the host's own tiers let `1 - own` of its load through.
        let base = tiers.map(Ratio::as_f64);
        let total: f64 = self.mix.iter().map(|&n| n as f64).sum();
        let own = if total > 0.0 {
            base.iter()
                .zip(&self.mix)
                .map(|(r, &n)| r * n as f64)
                .sum::<f64>()
                / total
        } else {
            instructed.as_f64()
        };
        let kept = 1.0 - instructed.as_f64();
        let target = if kept > 0.0 {
            1.0 - (1.0 - ratio.as_f64()) * (1.0 - own) / kept
        } else {
            ratio.as_f64()
        };
        shed_to(target, &base, &self.mix).map(Ratio::from_f64)
    }
}

/// Up to this many control-plane buckets, an instruction finds its bucket by comparing names.
const LINEAR_BUCKETS: usize = 8;

/// Buckets whose limit the control plane computes from everyone's counts.
fn on_control_plane(kind: Kind, store: StateStore) -> bool {
    matches!(kind, Kind::DropRatio | Kind::AdaptiveTokenBucket) && store == StateStore::ControlPlane
}

/// A host's control loop: events and time in, [`HostStep`]s and reports out.
///
/// Reports: every interval, at the wall-clock boundary, the counts since the previous report,
/// with the part that arrived in the interval's last quarter ([`Tally`]). The owner asks
/// [`HostCore::deadline`] when to call [`HostCore::on_deadline`] next. With 1 s intervals the
/// deadlines are 12:00:00.750 (the tail starts) and 12:00:01.000 (the report of the second).
///
/// Surge guard: [`HostCore::guard_tick`] every 50 ms counts what each drop-ratio bucket was
/// offered since the last tick, and holds the host to its part of the limit when its own load
/// jumps between two instructions (`control.surge_guard`, on by default).
///
/// Fail-open: drop ratios carry their TTL to the limiter; adaptive shares expire through
/// [`HostCore::expire_shares`], which puts the bucket back on its whole limit.
#[derive(Debug)]
pub struct HostCore {
    id: HostId,
    rules_version: u64,
    /// The report interval of the rules in force; the controller's, once it spoke.
    interval: Interval,
    surge_guard: bool,
    buckets: Vec<Bucket>,
    /// Each bucket's position by service, then bucket name: an instruction names its bucket by
    /// both, and finds it without building a key.
    index: HashMap<String, HashMap<String, usize>>,
    tally: Tally,
    /// The interval the next report is about, and whether its tail is still to be marked.
    due: u64,
    tail_due: bool,
    /// Instructions that came with new rules, held until the owner applied them.
    pending: Option<v1::Instructions>,
    /// When instructions last arrived, Unix milliseconds (0: never).
    last_instructions_ms: u64,
    /// The controller epoch whose instructions this host follows.
    fence: Fence,
}

impl HostCore {
    /// The core of host `id`, running `config` as rules version `rules_version` (0: its own file).
    pub fn new(id: HostId, config: &Config, rules_version: u64) -> Self {
        let mut core = Self {
            id,
            rules_version,
            interval: Interval::new(config.control.report_interval),
            surge_guard: config.control.surge_guard,
            buckets: Vec::new(),
            index: HashMap::new(),
            tally: Tally::default(),
            due: 0,
            tail_due: false,
            pending: None,
            last_instructions_ms: 0,
            fence: Fence::default(),
        };
        core.set_rules(config);
        core
    }

    /// The control-plane buckets, in the order of the rules; steps name them by position, and
    /// the owner passes their totals in the same order.
    pub fn buckets(&self) -> impl ExactSizeIterator<Item = &BucketKey> {
        self.buckets.iter().map(|b| &b.key)
    }

    /// The bucket at position `bucket`.
    pub fn bucket(&self, bucket: usize) -> &BucketKey {
        &self.buckets[bucket].key
    }

    /// The controller epoch followed, and the instructions dropped for an older one.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// The rules version this host runs, as it reports it.
    pub fn rules_version(&self) -> u64 {
        self.rules_version
    }

    /// The report interval in force.
    pub fn interval(&self) -> Interval {
        self.interval
    }

    /// When instructions last arrived, Unix milliseconds (0: never).
    pub fn last_instructions_ms(&self) -> u64 {
        self.last_instructions_ms
    }

    /// The owner's rules changed (a reload of its own file, or rules the control plane sent):
    /// the buckets are those of `config` from now on. A bucket that stays keeps its counting and
    /// its guard; one recreated by the owner starts its counters at zero, which the next report
    /// notices.
    pub fn set_rules(&mut self, config: &Config) {
        let mut old: HashMap<BucketKey, Bucket> =
            self.buckets.drain(..).map(|b| (b.key.clone(), b)).collect();
        self.index.clear();
        for (service, bucket) in config.buckets() {
            if !on_control_plane(bucket.algorithm, bucket.store) {
                continue;
            }
            let key = BucketKey::new(&service.name, &bucket.name);
            let limit = bucket.limit_in(&self.id.region).per_second();
            let mut kept = old
                .remove(&key)
                .filter(|b| b.kind == bucket.algorithm)
                .unwrap_or_else(|| Bucket::new(key.clone(), bucket.algorithm, limit));
            kept.limit_rps = limit;
            self.index
                .entry(key.service.clone())
                .or_default()
                .insert(key.bucket.clone(), self.buckets.len());
            self.buckets.push(kept);
        }
        self.surge_guard = config.control.surge_guard;
        if !self.surge_guard {
            for b in &mut self.buckets {
                b.guard = SurgeGuard::new();
                b.guard_at = None;
            }
        }
    }

    /// A stream to the aggregator opened at `now`: counting starts afresh (what was counted while
    /// disconnected is no rate of any one interval), and the first report is of the interval in
    /// progress. `totals` are the buckets' counters, in [`HostCore::buckets`] order.
    pub fn start(&mut self, now: HostTime, totals: &[Snapshot]) {
        counted(&mut self.buckets, totals).for_each(drop);
        let now_ms = now.unix_ms();
        self.tally = Tally::new(now_ms);
        self.schedule(now_ms);
    }

    /// A report of nothing, of the interval before the one in progress, for the owner to send
    /// the moment a stream opens after [`HostCore::start`]: it names the host to an
    /// aggregator that has not heard of it (one it moved to), which then waits for its report
    /// of the interval in progress instead of closing that interval without it a few
    /// milliseconds before it comes. It counts nothing: the interval it names was reported
    /// (or lost) where the host was before.
    pub fn hello(&self) -> v1::Report {
        v1::Report {
            sequence: self.due.saturating_sub(1),
            ..self.report_of(Vec::new())
        }
    }

    /// When [`HostCore::on_deadline`] is due next, Unix milliseconds.
    pub fn deadline(&self) -> u64 {
        if self.tail_due {
            Tally::tail_start(self.interval, self.due)
        } else {
            self.interval.end_of(self.due)
        }
    }

    /// The deadline passed: at the start of the tail, marks it (a mark that comes far too late, a
    /// stalled runtime, would scale a few milliseconds up to a quarter: no tail this interval
    /// then); at the end of the interval, returns its report.
    pub fn on_deadline(&mut self, now: HostTime, totals: &[Snapshot]) -> Option<v1::Report> {
        let now_ms = now.unix_ms();
        if self.tail_due {
            self.tail_due = false;
            let late = self.interval.ms() / TAIL_PARTS / 2;
            if now_ms < Tally::tail_start(self.interval, self.due) + late {
                self.tally
                    .mark_tail(counted(&mut self.buckets, totals), now_ms);
            }
            return None;
        }
        let report = self.report(now_ms, totals);
        self.due = (self.due + 1).max(self.interval.sequence_at(now_ms));
        self.tail_due = now_ms < Tally::tail_start(self.interval, self.due);
        Some(report)
    }

    /// The last report, of what was counted since the one before, cut short at `now`: the host
    /// is stopping, so its last requests are counted, as counted ([`Tally::close_final`]): a
    /// report cut short is otherwise scaled up to a whole interval, which would count the rest
    /// of the interval twice, here and at the hosts its load moves to.
    pub fn flush(&mut self, now: HostTime, totals: &[Snapshot]) -> v1::Report {
        let buckets = self
            .tally
            .close_final(counted(&mut self.buckets, totals), now.unix_ms());
        self.report_of(buckets)
    }

    /// An instruction set from the aggregator. When it carries rules this host does not run, the
    /// only step is [`HostStep::Rules`], and the rest waits for [`HostCore::rules_applied`] or
    /// [`HostCore::rules_refused`]: the instructions may name buckets that only the new rules
    /// have. Instructions of an older controller epoch than the newest seen within its TTL give
    /// no step at all ([`Fence`]).
    pub fn on_instructions(
        &mut self,
        now: HostTime,
        instructions: v1::Instructions,
    ) -> Vec<HostStep> {
        if instructions
            .rules
            .as_ref()
            .is_some_and(|rules| rules.version != self.rules_version)
        {
            let mut steps = Vec::new();
            self.on_shared_instructions(now, &instructions, &mut steps);
            return steps;
        }
        let mut steps = Vec::with_capacity(2 * instructions.buckets.len());
        self.on_shared_instructions(now, &instructions, &mut steps);
        steps
    }

    /// [`HostCore::on_instructions`] of an instruction set this host shares with others (the
    /// simulator hands one to every host of a zone), its steps added to `steps`: nothing is
    /// copied unless it carries rules to hold.
    pub fn on_shared_instructions(
        &mut self,
        now: HostTime,
        instructions: &v1::Instructions,
        steps: &mut Vec<HostStep>,
    ) {
        if !self
            .fence
            .admit(instructions.epoch, instructions.ttl_ms, now.unix_ms())
        {
            return;
        }
        if let Some(rules) = &instructions.rules
            && rules.version != self.rules_version
        {
            steps.push(HostStep::Rules {
                version: rules.version,
                rules: rules.clone(),
            });
            self.pending = Some(instructions.clone());
            return;
        }
        self.instruct(now, instructions, steps);
    }

    /// The owner applied the rules of [`HostStep::Rules`] as `config`: the host runs them, and
    /// the instructions that came with them apply now.
    pub fn rules_applied(&mut self, now: HostTime, version: u64, config: &Config) -> Vec<HostStep> {
        self.rules_version = version;
        self.set_rules(config);
        let mut steps = Vec::new();
        if let Some(instructions) = self.pending.take() {
            self.instruct(now, &instructions, &mut steps);
        }
        steps
    }

    /// The owner refused the rules of [`HostStep::Rules`] (they do not validate here): the host
    /// keeps its rules and reports the old version, which the controller shows; the instructions
    /// that came with them apply to the buckets it has.
    pub fn rules_refused(&mut self, now: HostTime) -> Vec<HostStep> {
        let mut steps = Vec::new();
        if let Some(instructions) = self.pending.take() {
            self.instruct(now, &instructions, &mut steps);
        }
        steps
    }

    /// One tick of every drop-ratio bucket's surge guard, every [`surge::TICK_NS`]: counts what
    /// each was offered since the last tick (scaled to one tick when the tick came late) and
    /// installs the guard's ratio until two ticks from now, so a stalled owner cannot leave one
    /// behind (the instruction's applies again). The first tick only starts counting.
    pub fn guard_tick(&mut self, now: Nanos, totals: &[Snapshot]) -> Vec<HostStep> {
        let mut steps = Vec::new();
        self.guard_tick_into(now, totals, &mut steps);
        steps
    }

    /// [`HostCore::guard_tick`], its steps added to `steps`: an owner ticking many hosts (the
    /// simulator, 100,000 of them every 50 ms) reuses one buffer.
    pub fn guard_tick_into(&mut self, now: Nanos, totals: &[Snapshot], steps: &mut Vec<HostStep>) {
        if !self.surge_guard {
            return;
        }
        for (i, (b, total)) in self.buckets.iter_mut().zip(totals).enumerate() {
            if b.kind != Kind::DropRatio {
                continue;
            }
            let offered = total.offered();
            let tiers = total.offered_by_tier();
            for ((mix, &now), was) in b.mix.iter_mut().zip(&tiers).zip(b.guard_tiers) {
                *mix = *mix - *mix / 4 + now.saturating_sub(was);
            }
            b.guard_tiers = tiers;
            if let Some(at) = b.guard_at
                && offered >= b.guard_offered
                && now > at
            {
                let count = (offered - b.guard_offered) as f64 * surge::TICK_NS as f64
                    / (now - at) as f64
                    / b.unit;
                let ratio = b.guard.tick(count.round() as u64, now);
                steps.push(b.guard_step(i, ratio, now));
            }
            b.guard_offered = offered;
            b.guard_at = Some(now);
        }
    }

    /// `n` guard ticks at `first`, `first + surge::TICK_NS`, ..., each of them quiet
    /// ([`HostCore::guard_quiet`] held before the first, with the buckets at `totals` since): the
    /// steps of the last, added to `steps`, and the state that `n` calls of
    /// [`HostCore::guard_tick_into`] leave. A quiet tick counts nothing, so it only ages each
    /// bucket's mix and its guard's window ([`SurgeGuard::tick_zeros`]); an owner that lets idle
    /// hosts fall behind (the simulator) catches one up in one call, not one per tick.
    pub fn guard_quiet_ticks_into(
        &mut self,
        first: Nanos,
        n: u64,
        totals: &[Snapshot],
        steps: &mut Vec<HostStep>,
    ) {
        if !self.surge_guard || n == 0 {
            return;
        }
        let last = first.saturating_add((n - 1).saturating_mul(surge::TICK_NS));
        for (i, (b, total)) in self.buckets.iter_mut().zip(totals).enumerate() {
            if b.kind != Kind::DropRatio {
                continue;
            }
            let offered = total.offered();
            debug_assert!(
                b.guard_at.is_none() || offered == b.guard_offered,
                "a quiet tick counts nothing"
            );
            // As `guard_tick_into` ages it: the first tick adds what came since the last, the
            // others nothing.
            let tiers = total.offered_by_tier();
            for ((mix, &now), was) in b.mix.iter_mut().zip(&tiers).zip(b.guard_tiers) {
                *mix = *mix - *mix / 4 + now.saturating_sub(was);
                for _ in 1..n {
                    if *mix == 0 {
                        break;
                    }
                    *mix -= *mix / 4;
                }
            }
            b.guard_tiers = tiers;
            // The first tick of a guard that never ticked only marks where it starts.
            let (from, count) = match b.guard_at {
                Some(_) => (first, n),
                None => (first.saturating_add(surge::TICK_NS), n - 1),
            };
            if count > 0 {
                let ratio = b.guard.tick_zeros(from, surge::TICK_NS, count);
                steps.push(b.guard_step(i, ratio, last));
            }
            b.guard_offered = offered;
            b.guard_at = Some(last);
        }
    }

    /// Whether the next [`HostCore::guard_tick`], with the buckets at `totals`, cannot engage any
    /// guard: every drop-ratio bucket was offered nothing since the guard's last tick, and that
    /// tick counted nothing. The guard tests the count of its window, the last two ticks, against
    /// a bar of at least [`surge::MARGIN`] requests, so a window of 0 never engages it, and no
    /// surge report can follow, unless a guard engaged since the last one was taken (an
    /// instruction's new part of the limit did it between ticks): then the next tick's report
    /// says so, and the tick is not quiet. The tick still changes the guard's state (its counts,
    /// its ratio): an owner with many idle hosts (the simulator) may run it later, with the same
    /// instants and totals, before anything reads the host again.
    pub fn guard_quiet(&self, totals: &[Snapshot]) -> bool {
        if !self.surge_guard {
            return true;
        }
        self.buckets
            .iter()
            .zip(totals)
            .filter(|(b, _)| b.kind == Kind::DropRatio)
            .all(|(b, total)| {
                b.guard_at.is_none()
                    || (total.offered() == b.guard_offered
                        && b.guard.last_tick_rps() == 0.0
                        && !b.guard.engaged_unreported())
            })
    }

    /// What one request stands for in each bucket's counts, in [`HostCore::buckets`] order: 1
    /// for a bucket counted in requests; for a token budget, whose counts are tokens, the
    /// tokens of a typical request (its owner's `E[cost^2] / E[cost]`). The surge guard tests a
    /// tick's count against the spread of a Poisson count of requests; a count of tokens divided
    /// by this unit has that spread, so the guard holds the host to its part of the limit in
    /// tokens without taking the spread of request sizes for a surge. Kept until set again.
    pub fn set_units(&mut self, units: &[f64]) {
        for (b, &unit) in self.buckets.iter_mut().zip(units) {
            b.unit = if unit.is_finite() && unit >= 1.0 {
                unit
            } else {
                1.0
            };
        }
    }

    /// The earliest instant a share expires, when any is held: [`HostCore::expire_shares`] has
    /// nothing to do before it.
    pub fn shares_expire_at(&self) -> Option<Nanos> {
        self.buckets.iter().filter_map(|b| b.share_until).min()
    }

    /// Puts adaptive buckets whose share expired at `now` back on their whole limit, as a host
    /// alone would (fail-open).
    pub fn expire_shares(&mut self, now: Nanos) -> Vec<HostStep> {
        let mut steps = Vec::new();
        for (i, b) in self.buckets.iter_mut().enumerate() {
            if b.share_until.is_some_and(|until| now >= until) {
                b.share_until = None;
                steps.push(HostStep::ShareExpired { bucket: i });
            }
        }
        steps
    }

    fn instruct(
        &mut self,
        now: HostTime,
        instructions: &v1::Instructions,
        steps: &mut Vec<HostStep>,
    ) {
        let ttl = Duration::from_millis(instructions.ttl_ms);
        let interval_end_ms =
            Interval::from_ms(instructions.interval_ms).end_of(instructions.sequence);
        let interval_ns = nanos(self.interval.duration());
        for b in &instructions.buckets {
            let Some(i) = self.position(&b.service, &b.bucket) else {
                continue;
            };
            let bucket = &mut self.buckets[i];
            match bucket.kind {
                Kind::DropRatio => {
                    let ratio = Ratio::from_raw(b.drop_ratio);
                    // Anything but four values: every tier drops the bucket's ratio.
                    let tiers = <[u64; TIERS]>::try_from(b.tier_drop_ratio.as_slice())
                        .map_or(uniform(ratio), |raw| raw.map(Ratio::from_raw));
                    bucket.instructed = (ratio, tiers);
                    steps.push(HostStep::DropRatio {
                        bucket: i,
                        ratio,
                        tiers,
                        ttl,
                    });
                    if self.surge_guard {
                        bucket.guard.instruct(
                            Instructed {
                                ratio: ratio.as_f64(),
                                limit_rps: bucket.limit_rps / bucket.unit,
                                scope_offered_rps: b.scope_offered_rps / bucket.unit,
                                scope_hosts: b.scope_hosts,
                                interval_ns,
                                interval_ended_ago_ns: now
                                    .unix_ns
                                    .saturating_sub(interval_end_ms.saturating_mul(1_000_000)),
                                expires_at: now.clock.saturating_add(nanos(ttl)),
                                provisional: instructions.provisional,
                                from_rates_now: instructions.from_rates_now,
                            },
                            now.clock,
                        );
                        // The guard's ratio replaces the instruction's in the limiter: the one
                        // it installed at its last tick was for the old instruction.
                        let ratio = bucket.guard.current(now.clock);
                        steps.push(HostStep::Surge {
                            bucket: i,
                            ratio,
                            tiers: bucket.guard_tiers(ratio),
                            until: now.clock.saturating_add(2 * surge::TICK_NS),
                        });
                    }
                }
                _ => {
                    if let Some(share) = b.share {
                        steps.push(HostStep::Share {
                            bucket: i,
                            share: Ratio::from_raw(share),
                        });
                        bucket.share_until = Some(now.clock.saturating_add(nanos(ttl)));
                    }
                }
            }
        }
        if instructions.interval_ms > 0 {
            let interval = Interval::from_ms(instructions.interval_ms);
            if interval != self.interval {
                self.interval = interval;
                self.tally.unmark_tail();
                self.schedule(now.unix_ms());
            }
        }
        self.last_instructions_ms = now.unix_ms();
    }

    /// The position of bucket `bucket` of `service`, if the host has it. A few buckets are
    /// compared by name, which costs less than hashing both names (a simulated fleet's hosts
    /// take several instructions a second each); more are found through the index.
    fn position(&self, service: &str, bucket: &str) -> Option<usize> {
        if self.buckets.len() <= LINEAR_BUCKETS {
            return self
                .buckets
                .iter()
                .position(|b| b.key.bucket == bucket && b.key.service == service);
        }
        self.index
            .get(service)
            .and_then(|buckets| buckets.get(bucket))
            .copied()
    }

    /// The first report due from `now_ms` on: the interval in progress, with its tail marked only
    /// when counting started before the tail did.
    fn schedule(&mut self, now_ms: u64) {
        self.due = self.interval.sequence_at(now_ms);
        self.tail_due = now_ms < Tally::tail_start(self.interval, self.due);
    }

    fn report(&mut self, now_ms: u64, totals: &[Snapshot]) -> v1::Report {
        let buckets = self
            .tally
            .close(counted(&mut self.buckets, totals), now_ms, self.interval);
        self.report_of(buckets)
    }

    /// The report of the interval due with `buckets`.
    fn report_of(&self, buckets: Vec<v1::BucketCounts>) -> v1::Report {
        v1::Report {
            host_id: self.id.host_id.clone(),
            zone: self.id.zone.clone(),
            region: self.id.region.clone(),
            rules_version: self.rules_version,
            sequence: self.due,
            interval_ms: self.interval.ms(),
            buckets,
            surge: false,
        }
    }

    /// A surge report, when a bucket's surge guard engaged since the last call: each such
    /// bucket's rate over the guard's last tick, as counts of one interval (`v1::Report`
    /// `surge`). The aggregator answers it, through the controller, with instructions computed
    /// from the hosts' rates now, so a host whose burst fits the scope's headroom is let go
    /// within milliseconds instead of being held to its part until the interval's report
    /// counted the burst.
    pub fn take_surge_report(&mut self) -> Option<v1::Report> {
        let secs = self.interval.secs();
        let buckets: Vec<v1::BucketCounts> = self
            .buckets
            .iter_mut()
            .filter_map(|b| {
                if !b.guard.take_engaged() {
                    return None;
                }
                let offered = (b.guard.last_tick_rps() * b.unit * secs).round() as u64;
                Some(v1::BucketCounts {
                    service: b.key.service.clone(),
                    bucket: b.key.bucket.clone(),
                    offered,
                    allowed: offered,
                    shadow_dropped: 0,
                    offered_tail: Some(offered / TAIL_PARTS),
                    // A token budget's requests stand for `unit` tokens each (`set_units`).
                    offered_squares: (b.unit > 1.0).then_some((offered as f64 * b.unit) as u64),
                    hosts: None,
                    tier_offered: Vec::new(),
                    id: 0,
                })
            })
            .collect();
        (!buckets.is_empty()).then(|| v1::Report {
            surge: true,
            ..self.report_of(buckets)
        })
    }
}

/// Each bucket's counts since the previous call, by its key. A bucket whose totals went down
/// was recreated by a reload: its counters started at zero again.
fn counted<'a>(
    buckets: &'a mut [Bucket],
    totals: &'a [Snapshot],
) -> impl Iterator<Item = Counted<'a>> + 'a {
    buckets.iter_mut().zip(totals).map(|(b, &now)| {
        let before = if b.reported.offered() <= now.offered() {
            b.reported
        } else {
            Snapshot::default()
        };
        b.reported = now;
        let b: &'a Bucket = b;
        let delta = now - before;
        let counts = Counts {
            offered: delta.offered(),
            allowed: delta.allowed,
            shadow_dropped: delta.shadow_dropped,
            tiers: delta.offered_by_tier(),
            offered_squares: delta.squares,
            ..Counts::default()
        };
        (&b.key, counts)
    })
}

#[cfg(test)]
mod tests;
