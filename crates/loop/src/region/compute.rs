//! Computing an interval's answer: every bucket's drop ratio (and adaptive token bucket shares)
//! from the zones' and peers' sums, split per zone and per criticality tier, and sent down.

use super::*;

impl RegionCore {
    /// One [`RegionStep::Send`] per aggregator with its zone's part of `per_zone`, the rules to
    /// aggregators that have not had them. Of a zone with several aggregators, each is given
    /// the part of the zone's adaptive shares its own part of `parts` offered (an aggregator
    /// splits what it is given among its own hosts).
    pub(super) fn instruct(
        &mut self,
        steps: &mut Vec<RegionStep>,
        sequence: u64,
        per_zone: HashMap<String, Vec<v1::BucketInstruction>>,
        parts: &Parts,
        now_ms: u64,
        sent: Sent,
    ) {
        let mut members: HashMap<String, u32> = HashMap::new();
        for zone in self.zones.values() {
            *members.entry(zone.name.clone()).or_default() += 1;
        }
        let zone_sums = by_zone(parts);
        let rules = &self.rules;
        let ttl_ms =
            u64::try_from(rules.config.control.instruction_ttl.as_millis()).unwrap_or(u64::MAX);
        let interval_ms = Interval::new(rules.config.control.report_interval).ms();
        for (&member, zone) in &mut self.zones {
            let send_rules = zone.sent_rules != rules.version;
            if send_rules {
                zone.sent_rules = rules.version;
            }
            let mut buckets = per_zone.get(&zone.name).cloned().unwrap_or_default();
            let shared = members.get(&zone.name).copied().unwrap_or(1);
            if shared > 1 {
                let own = parts.get(&member).map(|(_, sums)| sums);
                for b in &mut buckets {
                    let Some(share) = b.share else { continue };
                    let key = BucketKey::new(&b.service, &b.bucket);
                    let whole = zone_sums.get(&zone.name).map_or(0, |s| s.offered(&key));
                    let part = match own {
                        Some(own) if whole > 0 => own.offered(&key) as f64 / whole as f64,
                        _ => 1.0 / f64::from(shared),
                    };
                    b.share = Some(Ratio::from_f64(Ratio::from_raw(share).as_f64() * part).raw());
                }
            }
            steps.push(RegionStep::Send {
                member,
                instructions: v1::ZoneInstructions {
                    instructions: Some(v1::Instructions {
                        issued_at_ms: now_ms,
                        ttl_ms,
                        interval_ms,
                        sequence,
                        buckets,
                        rules_version: rules.version,
                        // The rules as data, never the source's text.
                        rules: send_rules.then(|| rules.message()),
                        provisional: sent != Sent::Computed,
                        from_rates_now: sent == Sent::FromRatesNow,
                        epoch: self.epoch,
                    }),
                },
            });
        }
        self.computed += u64::from(sent == Sent::Computed);
    }

    /// One interval's instructions per zone from the zones' sums and the live peers' sums: a
    /// smoothed drop ratio per bucket and scope, and each zone's share of the scope's load
    /// for adaptive token buckets.
    ///
    /// The ratio's target comes from the scope's offered load, or from its tail when that shows
    /// a surge that started within the interval ([`crate::sums::Counts::offered_for_rise`]): the first
    /// instruction after the surge already carries its whole ratio, one interval earlier than
    /// the offered count alone would give it. Shares and the offered load sent down stay the
    /// interval's own.
    pub(super) fn compute(
        &mut self,
        config: &Config,
        zone_sums: &HashMap<String, Sums>,
        peers: &Sums,
        interval: Interval,
    ) -> HashMap<String, Vec<v1::BucketInstruction>> {
        let secs = interval.secs();
        let mut region = Sums::default();
        for sums in zone_sums.values() {
            region.add(sums);
        }
        let mut per_zone: HashMap<String, Vec<v1::BucketInstruction>> = HashMap::new();
        let mut view = HashMap::new();
        let mut live_keys = HashSet::new();
        for (service, bucket) in config.buckets() {
            if !matches!(
                bucket.algorithm,
                Kind::DropRatio | Kind::AdaptiveTokenBucket
            ) {
                continue;
            }
            let key = BucketKey::new(&service.name, &bucket.name);
            // A region-scoped bucket may have a limit of this region's own.
            let limit = bucket.limit_in(&self.region).per_second();
            let adaptive = bucket.algorithm == Kind::AdaptiveTokenBucket;
            // `tiers`: the scope's load per criticality tier, which the ratio is split by so the
            // lowest tiers absorb it first.
            let mut instruction =
                |zone: &str, ratio: f64, share: f64, scope: &Counts, scope_offered: f64| {
                    per_zone
                        .entry(zone.to_owned())
                        .or_default()
                        .push(v1::BucketInstruction {
                            service: key.service.clone(),
                            bucket: key.bucket.clone(),
                            drop_ratio: if adaptive {
                                0
                            } else {
                                Ratio::from_f64(ratio).raw()
                            },
                            share: adaptive.then(|| Ratio::from_f64(share).raw()),
                            scope_offered_rps: scope_offered,
                            scope_hosts: scope.hosts,
                            tier_drop_ratio: if adaptive {
                                Vec::new()
                            } else {
                                tier_drop_ratios(ratio, scope)
                            },
                        });
                };
            // `count`: the requests the target was computed from, so a clear fall is taken at
            // once (`Smoother::update_counted`).
            let mut smoother = |zone: Option<&str>, target: f64, count: u64| {
                live_keys.insert((key.clone(), zone.map(str::to_owned)));
                self.smoothers
                    .entry((key.clone(), zone.map(str::to_owned)))
                    .or_default()
                    .update_counted(target, count as f64)
            };
            let zones_count = zone_sums.len().max(1) as f64;
            match bucket.scope {
                Scope::Zone => {
                    let mut observed = 0.0;
                    let mut admitted = 0.0;
                    let mut highest: f64 = 0.0;
                    for (zone, sums) in zone_sums {
                        let counts = sums.counts(&key);
                        let offered = counts.offered as f64 / secs;
                        admitted += counts.allowed as f64 / secs;
                        let rise = counts.offered_for_rise() as f64 / secs;
                        let ratio = smoother(Some(zone), target_drop(limit, rise), counts.offered);
                        instruction(zone, ratio, 1.0, &counts, offered);
                        observed += offered;
                        highest = highest.max(ratio);
                    }
                    view.insert(
                        key.clone(),
                        BucketView {
                            limit_rps: limit,
                            observed_rps: observed,
                            drop_ratio: highest,
                            admitted_rps: admitted,
                        },
                    );
                }
                Scope::Region | Scope::Global => {
                    let mut counts = region.counts(&key);
                    if bucket.scope == Scope::Global {
                        counts += peers.counts(&key);
                    }
                    let scope = counts.offered as f64 / secs;
                    let rise = counts.offered_for_rise() as f64 / secs;
                    let ratio = smoother(None, target_drop(limit, rise), counts.offered);
                    for (zone, sums) in zone_sums {
                        let share = if scope > 0.0 {
                            sums.offered(&key) as f64 / secs / scope
                        } else {
                            1.0 / zones_count
                        };
                        instruction(zone, ratio, share, &counts, scope);
                    }
                    view.insert(
                        key.clone(),
                        BucketView {
                            limit_rps: limit,
                            observed_rps: scope,
                            drop_ratio: ratio,
                            admitted_rps: counts.allowed as f64 / secs,
                        },
                    );
                }
            }
        }
        // Buckets that left the rules take their smoothing state with them.
        self.smoothers.retain(|k, _| live_keys.contains(k));
        self.view = view;
        per_zone
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
