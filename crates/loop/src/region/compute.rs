//! Computing an interval's answer: every bucket's drop ratio (and adaptive token bucket shares)
//! from the zones' and peers' sums, split per zone and per criticality tier, and sent down.

use super::shared::{Common, SharedInstructions};
use super::*;

/// One interval's instructions: what every zone gets alike, one per computed bucket in the
/// rules' order, and by zone the buckets whose instruction is its own (zone-scoped buckets,
/// adaptive shares), by their place among the common ones.
#[derive(Debug)]
pub(super) struct PerZone {
    common: Arc<Common>,
    zones: BTreeMap<String, Vec<(u32, v1::BucketInstruction)>>,
}

impl RegionCore {
    /// One [`RegionStep::Send`] per aggregator with its zone's part of `per_zone`, the rules to
    /// aggregators that have not had them. Of a zone with several aggregators, each is given
    /// the part of the zone's adaptive shares its own part of `parts` offered (an aggregator
    /// splits what it is given among its own hosts). With [`RegionCore::share_instructions`],
    /// a [`RegionStep::SendShared`] instead, whose common buckets every zone shares.
    pub(super) fn instruct(
        &mut self,
        steps: &mut Vec<RegionStep>,
        sequence: u64,
        mut per_zone: PerZone,
        parts: &Parts,
        now_ms: u64,
        sent: Sent,
    ) {
        let mut members: HashMap<&str, u32> = HashMap::new();
        for zone in self.zones.values() {
            *members.entry(zone.name.as_str()).or_default() += 1;
        }
        // Per aggregator: how many of its zone's share its instructions, and whether it is the
        // last of them (which takes the zone's instructions rather than a copy).
        let mut left = members.clone();
        let shares: Vec<(u32, bool)> = self
            .zones
            .values()
            .map(|zone| {
                let name = zone.name.as_str();
                let count = left.get_mut(name).map_or(1, |n| {
                    *n -= 1;
                    *n
                });
                (members.get(name).copied().unwrap_or(1), count == 0)
            })
            .collect();
        let zone_sums = shares
            .iter()
            .any(|&(shared, _)| shared > 1)
            .then(|| by_zone(parts));
        let rules = &self.rules;
        let table = &self.table;
        let ttl_ms =
            u64::try_from(rules.config.control.instruction_ttl.as_millis()).unwrap_or(u64::MAX);
        let interval_ms = Interval::new(rules.config.control.report_interval).ms();
        let common = per_zone.common.clone();
        // The rules as data, never the source's text: one message for every zone that has not
        // had them.
        let mut message = None;
        for ((&member, zone), &(shared, last)) in self.zones.iter_mut().zip(&shares) {
            let send_rules = zone.sent_rules != rules.version;
            if send_rules {
                zone.sent_rules = rules.version;
            }
            let mine = if last {
                per_zone.zones.remove(&zone.name)
            } else {
                per_zone.zones.get(&zone.name).cloned()
            };
            let own = parts.get(&member).map(|(_, sums)| sums);
            let whole = zone_sums.as_ref().and_then(|z| z.get(&zone.name));
            let takes_ids = zone.told.takes_ids();
            // Each bucket as this stream gets it: the common instruction unless its own, named
            // or with its part of a shared zone's share.
            let mut adjusted = Vec::new();
            if let Some(mine) = &mine {
                let mut mine = mine.iter().peekable();
                for (at, b) in (0u32..).zip(common.buckets()) {
                    let theirs = mine.next_if(|(place, _)| *place == at).map(|(_, b)| b);
                    let b = theirs.unwrap_or(b);
                    // Built by number (`bucket_instruction`): named the first time on this
                    // stream, and every time to an aggregator that does not take numbers.
                    let named = b.id != 0 && (!takes_ids || zone.told.names_due(b.id));
                    let split = shared > 1 && b.share.is_some();
                    if theirs.is_none() && !named && !split {
                        continue;
                    }
                    let mut b = b.clone();
                    if let Some(index) = b.id.checked_sub(1) {
                        if named {
                            let key = table.key(index);
                            b.service.clone_from(&key.service);
                            b.bucket.clone_from(&key.bucket);
                        }
                        if !takes_ids {
                            // As an aggregator older than the numbers knows instructions.
                            b.id = 0;
                        }
                        if let Some(share) = b.share.filter(|_| split) {
                            let whole = whole.map_or(0, |s| s.offered(index));
                            let part = match own {
                                Some(own) if whole > 0 => own.offered(index) as f64 / whole as f64,
                                _ => 1.0 / f64::from(shared),
                            };
                            b.share =
                                Some(Ratio::from_f64(Ratio::from_raw(share).as_f64() * part).raw());
                        }
                    }
                    adjusted.push((at, b));
                }
            }
            let instructions = SharedInstructions::new(
                v1::ZoneInstructions {
                    instructions: Some(v1::Instructions {
                        issued_at_ms: now_ms,
                        ttl_ms,
                        interval_ms,
                        sequence,
                        buckets: Vec::new(),
                        rules_version: rules.version,
                        rules: None,
                        provisional: sent != Sent::Computed,
                        from_rates_now: sent == Sent::FromRatesNow,
                        epoch: self.epoch,
                    }),
                    bucket_ids: true,
                },
                send_rules.then(|| {
                    message
                        .get_or_insert_with(|| Arc::new(rules.message()))
                        .clone()
                }),
                mine.is_some().then(|| common.clone()),
                adjusted,
            );
            steps.push(if self.shares_instructions {
                RegionStep::SendShared {
                    member,
                    instructions,
                }
            } else {
                RegionStep::Send {
                    member,
                    instructions: instructions.to_message(),
                }
            });
        }
        self.computed += u64::from(sent == Sent::Computed);
    }

    /// One interval's instructions per zone from the zones' sums and the live peers' sums: a
    /// smoothed drop ratio per bucket and scope, and each zone's share of the scope's load
    /// for adaptive token buckets; and the view they give, by index. With `commit`, the
    /// smoothing state and the view move on; without, they are left as they were (for
    /// instructions that estimate: [`RegionCore::provisional`], [`RegionCore::answer_surges`]).
    ///
    /// The ratio's target comes from the scope's offered load, or from its tail when that shows
    /// a surge that started within the interval ([`crate::sums::Counts::offered_for_rise`]): the first
    /// instruction after the surge already carries its whole ratio, one interval earlier than
    /// the offered count alone would give it. Shares and the offered load sent down stay the
    /// interval's own.
    ///
    /// Region-wide figures are worked out once per bucket, then each zone's instructions in
    /// one pass over the buckets beside its own sums (both in index order).
    pub(super) fn compute(
        &mut self,
        zone_sums: &ZoneSums,
        peers: &IndexedSums,
        interval: Interval,
        commit: bool,
    ) -> (PerZone, Vec<Option<BucketView>>) {
        let secs = interval.secs();
        let table = &self.table;
        let buckets = table.len();
        let mut region = vec![Counts::default(); buckets];
        for sums in zone_sums.values() {
            for &(index, counts) in sums.iter() {
                region[index as usize] += counts;
            }
        }
        // Region-scoped and global buckets: one ratio for every zone.
        let mut scoped: Vec<Option<Scoped>> = vec![None; buckets];
        let mut views: Vec<Option<BucketView>> = vec![None; buckets];
        let mut computed = 0;
        for (index, _, spec) in table.iter() {
            if !spec.computed() {
                continue;
            }
            computed += 1;
            let i = index as usize;
            if spec.scope == Scope::Zone {
                views[i] = Some(BucketView {
                    limit_rps: spec.limit,
                    observed_rps: 0.0,
                    drop_ratio: 0.0,
                    admitted_rps: 0.0,
                });
                continue;
            }
            let mut counts = region[i];
            if spec.scope == Scope::Global {
                counts += peers.counts(index);
            }
            let scope = counts.offered as f64 / secs;
            let rise = counts.offered_for_rise() as f64 / secs;
            // `count`: the arrivals the target was computed from (a token budget's answers, not
            // its tokens), so a clear fall is taken at once (`Smoother::update_counted`).
            let mut smoother = self.smoothers[i];
            let ratio = smooth(&mut smoother, target_drop(spec.limit, rise), &counts);
            if commit {
                self.smoothers[i] = smoother;
            }
            scoped[i] = Some(Scoped {
                counts,
                scope,
                ratio,
                tiers: tier_drop_ratios(ratio, &counts),
            });
            views[i] = Some(BucketView {
                limit_rps: spec.limit,
                observed_rps: scope,
                drop_ratio: ratio,
                admitted_rps: counts.allowed as f64 / secs,
            });
        }
        // What every zone gets alike: a region-scoped or global bucket's instruction, but for
        // an adaptive one's share. The others (`special`) are each zone's own.
        let mut common = Vec::with_capacity(computed);
        let mut special: Vec<(u32, Index)> = Vec::new();
        for (index, _, spec) in table.iter() {
            if !spec.computed() {
                continue;
            }
            let at = common.len() as u32;
            let adaptive = spec.kind == Kind::AdaptiveTokenBucket;
            match &scoped[index as usize] {
                Some(s) if !adaptive => common.push(bucket_instruction(
                    index,
                    false,
                    s.ratio,
                    0.0,
                    &s.counts,
                    s.scope,
                    || s.tiers.clone(),
                )),
                _ => {
                    special.push((at, index));
                    common.push(v1::BucketInstruction {
                        id: index + 1,
                        ..Default::default()
                    });
                }
            }
        }
        let zones_count = zone_sums.len().max(1) as f64;
        let mut zones = BTreeMap::new();
        for (zone, sums) in zone_sums {
            let mut instructions = Vec::with_capacity(special.len());
            let own = sums.as_slice();
            let mut at = 0;
            for &(place, index) in &special {
                let spec = table.spec(index);
                let i = index as usize;
                while own.get(at).is_some_and(|&(j, _)| j < index) {
                    at += 1;
                }
                let mine = match own.get(at) {
                    Some(&(j, counts)) if j == index => counts,
                    _ => Counts::default(),
                };
                let adaptive = spec.kind == Kind::AdaptiveTokenBucket;
                let instruction = match &scoped[i] {
                    Some(s) => {
                        let share = if s.scope > 0.0 {
                            mine.offered as f64 / secs / s.scope
                        } else {
                            1.0 / zones_count
                        };
                        bucket_instruction(
                            index,
                            adaptive,
                            s.ratio,
                            share,
                            &s.counts,
                            s.scope,
                            || s.tiers.clone(),
                        )
                    }
                    None => {
                        // Zone-scoped: this zone's own ratio.
                        let offered = mine.offered as f64 / secs;
                        let rise = mine.offered_for_rise() as f64 / secs;
                        let target = target_drop(spec.limit, rise);
                        let ratio = match self.zone_smoothers.get_mut(zone.as_str()) {
                            Some(by_bucket) if commit => {
                                smooth(by_bucket.entry(index).or_default(), target, &mine)
                            }
                            Some(by_bucket) => {
                                let mut s = by_bucket.get(&index).copied().unwrap_or_default();
                                smooth(&mut s, target, &mine)
                            }
                            None => {
                                let mut s = Smoother::default();
                                let ratio = smooth(&mut s, target, &mine);
                                if commit {
                                    self.zone_smoothers
                                        .entry(zone.clone())
                                        .or_default()
                                        .insert(index, s);
                                }
                                ratio
                            }
                        };
                        if let Some(view) = &mut views[i] {
                            view.observed_rps += offered;
                            view.admitted_rps += mine.allowed as f64 / secs;
                            view.drop_ratio = view.drop_ratio.max(ratio);
                        }
                        bucket_instruction(index, adaptive, ratio, 1.0, &mine, offered, || {
                            tier_drop_ratios(ratio, &mine)
                        })
                    }
                };
                instructions.push((place, instruction));
            }
            zones.insert(zone.clone(), instructions);
        }
        let per_zone = PerZone {
            common: Arc::new(Common::new(common)),
            zones,
        };
        if commit {
            // Zones that left take their smoothing state with them (buckets that left the rules
            // did when the rules changed).
            self.zone_smoothers
                .retain(|zone, _| zone_sums.contains_key(zone));
            self.publish(&views, computed);
            self.views.clone_from(&views);
        }
        (per_zone, views)
    }

    /// Writes `views` into [`RegionCore::view`] in place (the same buckets interval after
    /// interval: no key is built), dropping buckets that are no longer computed.
    fn publish(&mut self, views: &[Option<BucketView>], computed: usize) {
        for (index, key, _) in self.table.iter() {
            let Some(view) = views[index as usize] else {
                continue;
            };
            match self.view.get_mut(key) {
                Some(old) => *old = view,
                None => {
                    self.view.insert(key.clone(), view);
                }
            }
        }
        if self.view.len() > computed {
            let table = &self.table;
            self.view.retain(|key, _| {
                table
                    .find(&key.service, &key.bucket)
                    .is_some_and(|i| views[i as usize].is_some())
            });
        }
    }
}

/// What a region-scoped or global bucket's instructions carry in every zone.
#[derive(Debug, Clone)]
struct Scoped {
    counts: Counts,
    /// Offered load over the scope, per second.
    scope: f64,
    ratio: f64,
    tiers: Vec<u64>,
}

/// One bucket's instruction: `ratio` (none for an adaptive bucket, which gets `share`), and the
/// scope's load (`scope`, `scope_offered`) it came from. `tiers` gives the ratio per criticality
/// tier, asked for only when the bucket drops by ratio.
///
/// The bucket goes by its number on the zone streams, its index plus one, without its names:
/// [`RegionCore::instruct`] names it to each stream that needs them, so a stream that has them
/// costs no `String` per bucket and interval.
fn bucket_instruction(
    index: Index,
    adaptive: bool,
    ratio: f64,
    share: f64,
    scope: &Counts,
    scope_offered: f64,
    tiers: impl FnOnce() -> Vec<u64>,
) -> v1::BucketInstruction {
    v1::BucketInstruction {
        service: String::new(),
        bucket: String::new(),
        id: index + 1,
        drop_ratio: if adaptive {
            0
        } else {
            Ratio::from_f64(ratio).raw()
        },
        share: adaptive.then(|| Ratio::from_f64(share).raw()),
        scope_offered_rps: scope_offered,
        scope_hosts: scope.hosts,
        tier_drop_ratio: if adaptive { Vec::new() } else { tiers() },
    }
}

/// `ratio` split per criticality tier by the tiers of `counts`, for the wire: none when every
/// tier drops `ratio` ([`shed_lowest_first`]).
pub fn tier_drop_ratios(ratio: f64, counts: &Counts) -> Vec<u64> {
    shed_lowest_first(ratio, &counts.tier_offered())
        .map(|tiers| tiers.iter().map(|&r| Ratio::from_f64(r).raw()).collect())
        .unwrap_or_default()
}

/// What an instruction set is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sent {
    /// A closed interval and the peers' sums of it.
    Computed,
    /// A closed interval and an estimate of the peers' sums ([`RegionCore::provisional`]).
    Provisional,
    /// The zones' estimates of the open interval ([`RegionCore::answer_surges`]).
    FromRatesNow,
}

/// The region's sums of its global buckets only: what peers need, and all they get.
pub fn global_sums(config: &Config, zones: &HashMap<String, Sums>) -> Sums {
    let mut region = Sums::default();
    for sums in zones.values() {
        region.add(sums);
    }
    let global: HashSet<BucketKey> = config
        .buckets()
        .filter(|(_, b)| b.scope == Scope::Global)
        .map(|(s, b)| BucketKey::new(&s.name, &b.name))
        .collect();
    region.0.retain(|k, _| global.contains(k));
    region
}

/// The smoothed ratio for `target`, computed from `counts`: a count of requests takes every
/// rise at once (`Smoother::update_counted`); a sum of costs (a token budget's tokens, whose
/// reports carry their squares) eases a rise within its noise as it eases a fall
/// (`Smoother::update_weighed`). Both judge noise by the arrivals the count stands for.
fn smooth(smoother: &mut Smoother, target: f64, counts: &Counts) -> f64 {
    if counts.squares() > counts.offered {
        smoother.update_weighed(target, counts.arrivals())
    } else {
        smoother.update_counted(target, counts.arrivals())
    }
}
