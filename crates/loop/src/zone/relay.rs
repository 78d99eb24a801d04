//! Which hosts an answer to surge reports goes to.
//!
//! At fleet size some host's guard passes for a surge by chance at most ticks (about once in a
//! million ticks each, so 100,000 hosts at 20 ticks a second engage about twice a second), and
//! every engagement is answered to the whole region: after a step each of 100,000 simulated
//! hosts took about 20 answers a second, 541 B per host per second of control traffic, and
//! taking them was most of the simulator's run. Most answers barely change a host's ratio: the
//! estimate swaps one host's rate now into the last interval's sums. What they change is the
//! part an engaged guard holds its host to. So an answer that moves no bucket's ratio or share
//! by more than [`RELAY_MOVE`] from what the zone last relayed to every host goes only to the
//! hosts whose guard engaged in the open interval or the one before (a guard waits for the
//! instructions of the interval it engaged in and of the next); one that does goes to all.
//!
//! At 100,000 simulated hosts (`surge-15x`, 30 s, drop-ratio alone, seeds 1-6) the hosts took
//! 214-225 B a second each instead of 536-547, the run took 55-60 s instead of 78-96 s, and the
//! second after the first admitted 3.0-4.8% over the limit (mean 4.3%) against 3.6-4.7% (mean
//! 4.2%). Variants measured on the way:
//! - answers to the hosts whose surge report came since the last instructions to every host,
//!   moves of 1% held back: 8.7-10.5% (seeds 1-3). An engaged guard tightens its host's part
//!   with every answer, and a ratio that creeps up through the step's second (0.9320 to 0.9328)
//!   was 1% stale by its end;
//! - to the hosts engaged until two instructions of whole intervals came, as the guard counts
//!   (it lets go a few milliseconds earlier): 3.1-7.5% (mean 4.7%), enforced at 1.1 s on three
//!   seeds of six.

use spillway_core::algo::Ratio;
use spillway_proto::v1;

/// How far an answer to surge reports must move a bucket's admitted part (one minus its drop
/// ratio, for the bucket and each tier) or its share, relative to what every host was last
/// told, before it goes to every host: a quarter of a percent. A host left on the old ratio
/// admits at most that much more or less than the answer until the next instructions; at a
/// 15x step's 0.933 it is 0.00017 of ratio.
pub const RELAY_MOVE: f64 = 0.0025;

/// What the instructions last relayed to every host said, per bucket, in their order.
#[derive(Debug, Clone, Default)]
pub(super) struct Relayed {
    said: Vec<Said>,
}

#[derive(Debug, Clone)]
struct Said {
    service: String,
    bucket: String,
    drop_ratio: u64,
    tiers: Vec<u64>,
    share: Option<u64>,
}

impl Relayed {
    /// Remembers `buckets` as relayed to every host.
    pub fn set(&mut self, buckets: &[v1::BucketInstruction]) {
        self.said.truncate(buckets.len());
        for (at, b) in buckets.iter().enumerate() {
            match self.said.get_mut(at) {
                Some(said) => {
                    said.service.clone_from(&b.service);
                    said.bucket.clone_from(&b.bucket);
                    said.drop_ratio = b.drop_ratio;
                    said.tiers.clone_from(&b.tier_drop_ratio);
                    said.share = b.share;
                }
                None => self.said.push(Said {
                    service: b.service.clone(),
                    bucket: b.bucket.clone(),
                    drop_ratio: b.drop_ratio,
                    tiers: b.tier_drop_ratio.clone(),
                    share: b.share,
                }),
            }
        }
    }

    /// Whether `buckets` move some bucket clearly from what every host was last told, or name
    /// other buckets.
    pub fn moved_by(&self, buckets: &[v1::BucketInstruction]) -> bool {
        buckets.len() != self.said.len()
            || buckets.iter().zip(&self.said).any(|(b, said)| {
                b.bucket != said.bucket
                    || b.service != said.service
                    || admitted_moved(said.drop_ratio, b.drop_ratio)
                    || b.tier_drop_ratio.len() != said.tiers.len()
                    || b.tier_drop_ratio
                        .iter()
                        .zip(&said.tiers)
                        .any(|(&new, &old)| admitted_moved(old, new))
                    || match (said.share, b.share) {
                        (Some(old), Some(new)) => {
                            moved(Ratio::from_raw(old).as_f64(), Ratio::from_raw(new).as_f64())
                        }
                        (None, None) => false,
                        _ => true,
                    }
            })
    }
}

/// Whether the admitted part of drop ratio `new` is over [`RELAY_MOVE`] from `old`'s.
fn admitted_moved(old: u64, new: u64) -> bool {
    old != new
        && moved(
            1.0 - Ratio::from_raw(old).as_f64(),
            1.0 - Ratio::from_raw(new).as_f64(),
        )
}

/// Whether `new` is over [`RELAY_MOVE`] of `old` away from it (any change from nothing).
fn moved(old: f64, new: f64) -> bool {
    (new - old).abs() > RELAY_MOVE * old
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(name: &str, ratio: f64, share: Option<f64>) -> v1::BucketInstruction {
        v1::BucketInstruction {
            service: "api".into(),
            bucket: name.into(),
            drop_ratio: Ratio::from_f64(ratio).raw(),
            share: share.map(|s| Ratio::from_f64(s).raw()),
            ..Default::default()
        }
    }

    #[test]
    fn an_answer_moves_when_some_admitted_part_or_share_moves_over_a_quarter_percent() {
        let mut relayed = Relayed::default();
        assert!(
            relayed.moved_by(&[bucket("a", 0.0, None)]),
            "nothing relayed yet"
        );
        relayed.set(&[bucket("a", 0.9, None), bucket("b", 0.0, Some(0.5))]);
        // 0.1 admitted: 0.09976 and 0.10024 are within 0.25%, 0.09974 and 0.10026 are not.
        for (ratio, moves) in [
            (0.90024, false),
            (0.89976, false),
            (0.90026, true),
            (0.89974, true),
        ] {
            let answer = [bucket("a", ratio, None), bucket("b", 0.0, Some(0.5))];
            assert_eq!(relayed.moved_by(&answer), moves, "ratio {ratio}");
        }
        for (share, moves) in [(Some(0.501), false), (Some(0.5015), true), (None, true)] {
            let answer = [bucket("a", 0.9, None), bucket("b", 0.0, share)];
            assert_eq!(relayed.moved_by(&answer), moves, "share {share:?}");
        }
        // Other buckets, or a tier's ratio moved while the bucket's did not.
        assert!(relayed.moved_by(&[bucket("a", 0.9, None)]));
        assert!(relayed.moved_by(&[bucket("a", 0.9, None), bucket("c", 0.0, Some(0.5))]));
        let mut tiers = bucket("a", 0.9, None);
        tiers.tier_drop_ratio = vec![Ratio::from_f64(0.9).raw(); 4];
        assert!(relayed.moved_by(&[tiers.clone(), bucket("b", 0.0, Some(0.5))]));
        relayed.set(&[tiers.clone(), bucket("b", 0.0, Some(0.5))]);
        tiers.tier_drop_ratio[3] = Ratio::from_f64(1.0).raw();
        assert!(relayed.moved_by(&[tiers, bucket("b", 0.0, Some(0.5))]));
    }
}
