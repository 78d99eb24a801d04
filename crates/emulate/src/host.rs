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
}

/// Each bucket's load, in the order they were first asked for. The link asks for them a few
/// hundred times a second per host (every bucket's counters at each guard tick, then a step per
/// bucket), always in its core's order, so the key asked next is nearly always the one after
/// the last: `next` guesses it and one key compare confirms the guess. Hashing two strings per
/// call, as a map did, was a quarter of the emulator's CPU. Any other order (new rules, a
/// bucket never asked before) still finds its load, by a scan.
#[derive(Default)]
struct Loads {
    entries: Vec<(BucketKey, Load)>,
    next: usize,
}

impl Loads {
    /// Where `key`'s load is, if it has one; the guess moves to the entry after it.
    fn position(&mut self, key: &BucketKey) -> Option<usize> {
        let guess = if self.next < self.entries.len() {
            self.next
        } else {
            0
        };
        let at = match self.entries.get(guess) {
            Some((k, _)) if k == key => guess,
            _ => self.entries.iter().position(|(k, _)| k == key)?,
        };
        self.next = at + 1;
        Some(at)
    }

    /// `key`'s load, made by `new` the first time (the key is cloned only then).
    fn get_or_insert(&mut self, key: &BucketKey, new: impl FnOnce() -> Load) -> &mut Load {
        let at = match self.position(key) {
            Some(at) => at,
            None => {
                self.entries.push((key.clone(), new()));
                self.next = self.entries.len();
                self.entries.len() - 1
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
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `key`'s load, integrated up to `now`.
    fn load<'a>(&self, state: &'a mut State, key: &BucketKey, now: Nanos) -> &'a mut Load {
        let load = state.loads.get_or_insert(key, || Load {
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
        });
        load.advance(now, &self.common.shape);
        load
    }

    /// Offered and admitted so far, over the loaded buckets, integrated up to now.
    pub fn totals(&self) -> Totals {
        let now = self.common.clock.now();
        let mut state = self.lock();
        let mut totals = Totals::default();
        for (key, _) in self.rates.iter() {
            let load = self.load(&mut state, key, now);
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

    fn counters(&self, key: &BucketKey) -> Snapshot {
        let now = self.common.clock.now();
        let mut state = self.lock();
        self.load(&mut state, key, now).snapshot()
    }

    /// Every bucket's counters at one instant, under one lock: the link reads them all at each
    /// guard tick, and one clock reading for all of them is cheaper than one each.
    fn counters_into(
        &self,
        buckets: &mut dyn Iterator<Item = &BucketKey>,
        into: &mut Vec<Snapshot>,
    ) {
        let now = self.common.clock.now();
        let mut state = self.lock();
        into.clear();
        into.extend(buckets.map(|key| self.load(&mut state, key, now).snapshot()));
    }

    fn apply(&self, key: &BucketKey, step: &HostStep) {
        let now = self.common.clock.now();
        let mut state = self.lock();
        let load = self.load(&mut state, key, now);
        step.apply_to(SteeredLimiter::DropRatio(&load.limiter), now);
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
        host.counters_into(&mut [&key, &other].into_iter(), &mut all);
        assert_eq!(all.len(), 2);
        assert!(all[0].offered() >= later.offered(), "{all:?}");
        assert_eq!(all[1], Snapshot::default());
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
        // In order, twice round (the guess wraps), then reversed, then skipping about, then a
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
}
