//! One emulated host: the [`HostLimiters`] a real client plugs into its link, with a fluid load
//! instead of requests. Each loaded bucket is offered its share of the fleet's rate times the
//! shape's multiple, and admits `offered x (1 - ratio)` at the drop ratio its limiter holds,
//! which the link sets from the control plane's instructions and the host core's surge guard
//! exactly as it sets a sidecar's. Counting a fluid rather than deciding requests keeps ten
//! thousand hosts in one process cheap, so what the run measures is the control plane.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use spillway_core::algo::DropRatio;
use spillway_core::clock::{Clock, Nanos, SystemClock};
use spillway_core::config::Config;
use spillway_core::counters::Snapshot;
use spillway_link::HostLimiters;
use spillway_loop::{BucketKey, DecodeRules, HostStep, LinkRules, SteeredLimiter};
use spillway_proto::v1;

use crate::shape::LoadShape;

/// What every host of the fleet shares: the clock (zero at the start of the run) and the shape.
#[derive(Debug, Clone, Copy)]
pub struct Common {
    pub clock: SystemClock,
    pub shape: LoadShape,
}

/// One bucket of a host: its base rate, what it offered and admitted so far (fractions of a
/// request included), since when, and its limiter.
struct Load {
    rate: f64,
    offered: f64,
    admitted: f64,
    since: Nanos,
    limiter: DropRatio,
}

impl Load {
    /// Integrates offered and admitted load up to `now` at the ratio in force at the start of
    /// the stretch (the link touches the limiter every 50 ms, so stretches are short).
    fn advance(&mut self, now: Nanos, shape: &LoadShape) {
        if now <= self.since {
            return;
        }
        let offered = self.rate * shape.integral(secs(self.since), secs(now));
        let ratio = self.limiter.current(self.since).map_or(0.0, |r| r.as_f64());
        self.offered += offered;
        self.admitted += offered * (1.0 - ratio);
        self.since = now;
    }

    /// Its counters: whole requests only, as real counters hold.
    fn snapshot(&self) -> Snapshot {
        let allowed = self.admitted.floor() as u64;
        Snapshot {
            allowed,
            dropped: (self.offered.floor() as u64).saturating_sub(allowed),
            ..Snapshot::default()
        }
    }
}

fn secs(t: Nanos) -> f64 {
    t as f64 / 1e9
}

struct State {
    config: Arc<Config>,
    rules_version: u64,
    loads: Loads,
    /// Every loaded bucket (of `rates`) has a load.
    rated: bool,
}

/// Each bucket's load. The link asks for them a few hundred times a second per host (every
/// bucket's counters at each guard tick, then a step per bucket), and hashing two strings per
/// call, as a map did, was a quarter of the emulator's CPU. The link says which rules its core
/// runs and the position of each bucket in it, which is the same for the same rules, so each
/// position is looked up by key once and remembered: the link's calls then find their load with
/// no key compared (a compare reads two strings of the core's, out of cache by the next tick: a
/// sixth of the CPU once the hashing was gone). A key asked otherwise (a single bucket's
/// counters) is found by a scan of the few loads.
#[derive(Default)]
struct Loads {
    entries: Vec<(BucketKey, Load)>,
    /// The rules the link's core runs (held, so no other rules can come at their address) and,
    /// for the positions learnt so far from the first, the entry of the bucket at each.
    placed: Option<(Arc<Config>, Vec<usize>)>,
}

impl Loads {
    /// Where `key`'s load is, if it has one.
    fn position(&self, key: &BucketKey) -> Option<usize> {
        self.entries.iter().position(|(k, _)| k == key)
    }

    /// The entry of `key`'s load, made by `new` the first time (the key is cloned only then).
    fn entry(&mut self, key: &BucketKey, new: impl FnOnce() -> Load) -> usize {
        self.position(key).unwrap_or_else(|| {
            self.entries.push((key.clone(), new()));
            self.entries.len() - 1
        })
    }

    /// `key`'s load, made by `new` the first time.
    fn get_or_insert(&mut self, key: &BucketKey, new: impl FnOnce() -> Load) -> &mut Load {
        let at = self.entry(key, new);
        &mut self.entries[at].1
    }

    /// The load of `key`, the bucket at `position` in the link's core for `rules`: looked up
    /// by key the first time, found by its position from then on.
    fn at_position(
        &mut self,
        rules: &Arc<Config>,
        position: usize,
        key: &BucketKey,
        new: impl FnOnce() -> Load,
    ) -> &mut Load {
        if !matches!(&self.placed, Some((held, _)) if Arc::ptr_eq(held, rules)) {
            self.placed = Some((rules.clone(), Vec::new()));
        }
        let known = self
            .placed
            .as_ref()
            .and_then(|(_, placed)| placed.get(position).copied());
        let at = match known {
            Some(at) => {
                debug_assert_eq!(&self.entries[at].0, key, "position {position}");
                at
            }
            None => {
                let at = self.entry(key, new);
                if let Some((_, placed)) = &mut self.placed {
                    if placed.contains(&at) {
                        // Learnt at another position for the same rules: the caller's order
                        // is not the core's after all, so learn them all again.
                        placed.clear();
                    } else if placed.len() == position {
                        placed.push(at);
                    }
                }
                at
            }
        };
        &mut self.entries[at].1
    }
}

/// One emulated host (see the module's documentation).
pub struct EmulatedHost {
    common: Common,
    /// The base rate of each loaded bucket on this host, in the host core's order.
    rates: Arc<Vec<(BucketKey, f64)>>,
    state: Mutex<State>,
}

/// What a host offered and admitted so far over its loaded buckets.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    pub offered: f64,
    pub admitted: f64,
}

impl EmulatedHost {
    /// A host running `config` until the control plane sends rules, offering each bucket of
    /// `rates` its base rate (requests per second, before the shape's multiple).
    pub fn new(common: Common, config: Arc<Config>, rates: Arc<Vec<(BucketKey, f64)>>) -> Self {
        Self {
            common,
            rates,
            state: Mutex::new(State {
                config,
                rules_version: 0,
                loads: Loads::default(),
                rated: false,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new load of `key`, from `now`.
    fn new_load(&self, key: &BucketKey, now: Nanos) -> Load {
        Load {
            rate: self
                .rates
                .iter()
                .find(|(k, _)| k == key)
                .map_or(0.0, |&(_, rate)| rate),
            offered: 0.0,
            admitted: 0.0,
            since: now,
            // No request is decided here, only the ratio read: no drop schedule to keep.
            limiter: DropRatio::with_coin(Duration::from_secs(1)),
        }
    }

    /// `key`'s load, integrated up to `now`.
    fn load<'a>(&self, state: &'a mut State, key: &BucketKey, now: Nanos) -> &'a mut Load {
        let load = state.loads.get_or_insert(key, || self.new_load(key, now));
        load.advance(now, &self.common.shape);
        load
    }

    /// The load of `key`, at `position` in the link's core for `rules`, integrated up to `now`.
    fn load_at<'a>(
        &self,
        state: &'a mut State,
        rules: &Arc<Config>,
        position: usize,
        key: &BucketKey,
        now: Nanos,
    ) -> &'a mut Load {
        let load = state
            .loads
            .at_position(rules, position, key, || self.new_load(key, now));
        load.advance(now, &self.common.shape);
        load
    }

    /// Offered and admitted so far, over the loaded buckets, integrated up to now.
    pub fn totals(&self) -> Totals {
        let now = self.common.clock.now();
        let mut state = self.lock();
        if !state.rated {
            for (key, _) in self.rates.iter() {
                self.load(&mut state, key, now);
            }
            state.rated = true;
        }
        // Every loaded bucket has its load now, and the others are offered nothing (a rate of
        // 0): the sum over all loads is the sum over the loaded buckets, with no key looked up.
        let mut totals = Totals::default();
        for (_, load) in &mut state.loads.entries {
            load.advance(now, &self.common.shape);
            totals.offered += load.offered;
            totals.admitted += load.admitted;
        }
        totals
    }

    /// The rules version it runs (0: its own file still).
    pub fn rules_version(&self) -> u64 {
        self.lock().rules_version
    }
}

impl HostLimiters for EmulatedHost {
    fn now(&self) -> Nanos {
        self.common.clock.now()
    }

    fn config(&self) -> Arc<Config> {
        self.lock().config.clone()
    }

    /// Compared in place: every host starts with the fleet's one `Arc` of the rules, and
    /// cloning it at each turn of every link had two threads writing its count.
    fn config_if_changed(&self, held: &Arc<Config>) -> Option<Arc<Config>> {
        let state = self.lock();
        (!Arc::ptr_eq(&state.config, held)).then(|| state.config.clone())
    }

    fn counters(&self, key: &BucketKey) -> Snapshot {
        let now = self.common.clock.now();
        let mut state = self.lock();
        self.load(&mut state, key, now).snapshot()
    }

    /// Every bucket's counters at one instant, under one lock: the link reads them all at each
    /// guard tick, and one clock reading for all of them is cheaper than one each.
    fn counters_into(
        &self,
        rules: &Arc<Config>,
        buckets: &mut dyn Iterator<Item = &BucketKey>,
        into: &mut Vec<Snapshot>,
    ) {
        let now = self.common.clock.now();
        let mut state = self.lock();
        into.clear();
        into.extend(
            buckets
                .enumerate()
                .map(|(at, key)| self.load_at(&mut state, rules, at, key, now).snapshot()),
        );
    }

    fn apply(&self, key: &BucketKey, step: &HostStep) {
        let now = self.common.clock.now();
        let mut state = self.lock();
        let load = self.load(&mut state, key, now);
        step.apply_to(SteeredLimiter::DropRatio(&load.limiter), now);
    }

    /// A turn's steps (a surge step per bucket at every guard tick) at one instant, under one
    /// lock, as the counters are read.
    fn apply_steps(
        &self,
        rules: &Arc<Config>,
        steps: &mut dyn Iterator<Item = (usize, &BucketKey, &HostStep)>,
    ) {
        let now = self.common.clock.now();
        let mut state = self.lock();
        for (at, key, step) in steps {
            let load = self.load_at(&mut state, rules, at, key, now);
            step.apply_to(SteeredLimiter::DropRatio(&load.limiter), now);
        }
    }

    fn apply_rules(
        &self,
        version: u64,
        rules: &v1::Rules,
    ) -> Result<Arc<Config>, Box<dyn std::error::Error + Send + Sync>> {
        let mut state = self.lock();
        let config = Arc::new(LinkRules::decode(rules)?.with_own(&state.config, "control-plane")?);
        state.config = config.clone();
        state.rules_version = version;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_core::algo::Ratio;
    use spillway_core::config;

    fn host(rate: f64) -> (EmulatedHost, BucketKey) {
        let yaml = "version: 1\nservices:\n  api:\n    buckets:\n      - { name: b0, limit: 100/s, scope: global }\n";
        let key = BucketKey::new("api", "b0");
        let rates = Arc::new(vec![(key.clone(), rate)]);
        let common = Common {
            clock: SystemClock::new(),
            shape: LoadShape::default(),
        };
        let config = Arc::new(config::load_str(yaml, "rules.yaml").unwrap());
        (EmulatedHost::new(common, config, rates), key)
    }

    #[test]
    fn a_host_admits_what_its_limiter_keeps() {
        let (host, key) = host(1000.0);
        let first = host.counters(&key);
        host.apply(
            &key,
            &HostStep::DropRatio {
                bucket: 0,
                ratio: Ratio::from_f64(0.75),
                tiers: spillway_core::algo::uniform(Ratio::from_f64(0.75)),
                ttl: Duration::from_secs(60),
            },
        );
        std::thread::sleep(Duration::from_millis(200));
        let later = host.counters(&key) - first;
        // About 200 offered (1,000/s for at least 200 ms), a quarter of them admitted.
        assert!(later.offered() >= 190, "{later:?}");
        let admitted = later.allowed as f64 / later.offered() as f64;
        assert!((admitted - 0.25).abs() < 0.02, "{later:?}");
        let totals = host.totals();
        assert!(totals.offered >= later.offered() as f64, "{totals:?}");
        // Read all at once, a bucket it does not load among them: the same counts, and zeros.
        let other = BucketKey::new("api", "b1");
        let mut all = vec![Snapshot::default(); 5];
        let rules = host.config();
        host.counters_into(&rules, &mut [&key, &other].into_iter(), &mut all);
        assert_eq!(all.len(), 2);
        assert!(all[0].offered() >= later.offered(), "{all:?}");
        assert_eq!(all[1], Snapshot::default());
    }

    #[test]
    fn a_turn_of_steps_reaches_each_bucket_and_rules_are_compared_in_place() {
        let (host, key) = host(1000.0);
        let other = BucketKey::new("api", "b1");
        let step = |ratio: f64| HostStep::DropRatio {
            bucket: 0,
            ratio: Ratio::from_f64(ratio),
            tiers: spillway_core::algo::uniform(Ratio::from_f64(ratio)),
            ttl: Duration::from_secs(60),
        };
        let (three_quarters, half) = (step(0.75), step(0.5));
        let rules = host.config();
        host.apply_steps(
            &rules,
            &mut [(0, &key, &three_quarters), (1, &other, &half)].into_iter(),
        );
        let now = host.now();
        let mut state = host.lock();
        for (key, ratio) in [(&key, 0.75), (&other, 0.5)] {
            let load = state
                .loads
                .get_or_insert(key, || panic!("{key:?} has no load"));
            assert_eq!(load.limiter.current(now), Some(Ratio::from_f64(ratio)));
        }
        let held = state.config.clone();
        drop(state);
        assert!(host.config_if_changed(&held).is_none());
        let other_rules = Arc::new((*held).clone());
        assert!(Arc::ptr_eq(
            &host.config_if_changed(&other_rules).unwrap(),
            &held
        ));
    }

    fn load(rate: f64) -> Load {
        Load {
            rate,
            offered: 0.0,
            admitted: 0.0,
            since: 0,
            limiter: DropRatio::with_coin(Duration::from_secs(1)),
        }
    }

    #[test]
    fn a_load_is_found_by_its_key_in_any_order() {
        let keys: Vec<BucketKey> = (0..5)
            .map(|i| BucketKey::new("api", format!("b{i}")))
            .collect();
        let mut loads = Loads::default();
        // The first asks make the loads; each keeps the rate it was made with.
        for (i, key) in keys.iter().enumerate() {
            loads.get_or_insert(key, || load(i as f64));
        }
        let rate = |loads: &mut Loads, key: &BucketKey| {
            loads
                .get_or_insert(key, || panic!("{key:?} has a load already"))
                .rate
        };
        // In order, twice round, then reversed, then skipping about, then a
        // key of another service with the same bucket name, which is a load of its own.
        for i in (0..5)
            .chain(0..5)
            .chain((0..5).rev())
            .chain([3, 0, 4, 4, 1])
        {
            assert_eq!(rate(&mut loads, &keys[i]), i as f64);
        }
        let other = BucketKey::new("web", "b2");
        assert_eq!(loads.get_or_insert(&other, || load(9.0)).rate, 9.0);
        assert_eq!(rate(&mut loads, &keys[2]), 2.0);
        assert_eq!(rate(&mut loads, &other), 9.0);
        assert_eq!(loads.entries.len(), 6);
        assert_eq!(loads.position(&BucketKey::new("api", "b9")), None);
    }

    #[test]
    fn a_load_is_found_by_its_position_for_the_same_rules_only() {
        let yaml = "version: 1\nservices:\n  api:\n    buckets:\n      - { name: b0, limit: 100/s, scope: global }\n";
        let config = config::load_str(yaml, "rules.yaml").unwrap();
        let (first, second) = (Arc::new(config.clone()), Arc::new(config));
        let keys: Vec<BucketKey> = (0..3)
            .map(|i| BucketKey::new("api", format!("b{i}")))
            .collect();
        let mut loads = Loads::default();
        let mut rate = |rules: &Arc<Config>, at: usize, key: &BucketKey| {
            loads
                .at_position(rules, at, key, || load(key.bucket[1..].parse().unwrap()))
                .rate
        };
        // Positions learnt under the first rules, then found by position alone.
        for round in 0..3 {
            for (at, key) in keys.iter().enumerate() {
                assert_eq!(rate(&first, at, key), at as f64, "round {round}");
            }
        }
        // Other rules put the buckets in another order: each still gets its own load.
        let order = [2, 0, 1];
        for round in 0..3 {
            for (at, &i) in order.iter().enumerate() {
                assert_eq!(rate(&second, at, &keys[i]), i as f64, "round {round}");
            }
        }
        // And the first rules again, relearnt.
        for (at, key) in keys.iter().enumerate() {
            assert_eq!(rate(&first, at, key), at as f64);
        }
        // A caller whose order is not the core's (a bucket placed at 0 asked for at 2) is
        // placed again rather than given another bucket's load.
        let third = Arc::new((*second).clone());
        assert_eq!(rate(&third, 0, &keys[1]), 1.0);
        assert_eq!(rate(&third, 1, &keys[2]), 2.0);
        assert_eq!(rate(&third, 2, &keys[1]), 1.0);
        for (at, &i) in [0, 1, 2].iter().enumerate() {
            assert_eq!(rate(&third, at, &keys[i]), i as f64);
        }
        assert_eq!(loads.entries.len(), 3);
    }
}
