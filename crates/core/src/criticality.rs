//! A request's criticality: the four tiers of Google's SRE practice, lowest last.
//!
//! Where traffic must be shed, the lowest tiers go first: the concurrency gate
//! ([`crate::concurrency::Gate`]) sheds by tier, and a drop-ratio bucket's one ratio becomes a
//! ratio per tier ([`shed_lowest_first`]) so that its admitted total is the same while the
//! lowest tiers absorb the drops.

use std::fmt;

/// How much a request matters when there is not room for all of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Criticality {
    /// Never shed while anything else is admitted.
    CriticalPlus,
    /// The default: what a user waits for.
    #[default]
    Critical,
    /// Work that can be retried later at some cost.
    SheddablePlus,
    /// Prefetches, batch work: the first to go.
    Sheddable,
}

impl Criticality {
    /// Every tier, highest first: the order of metric series and of their array slots.
    pub const ALL: [Criticality; 4] = [
        Criticality::CriticalPlus,
        Criticality::Critical,
        Criticality::SheddablePlus,
        Criticality::Sheddable,
    ];

    /// The name in headers, configuration and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Criticality::CriticalPlus => "critical_plus",
            Criticality::Critical => "critical",
            Criticality::SheddablePlus => "sheddable_plus",
            Criticality::Sheddable => "sheddable",
        }
    }

    /// The tier named `name` (as [`Criticality::name`] writes it).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The tier a request header names: [`Criticality::name`] in any case, so gRPC's and
    /// Google's upper-case `CRITICAL_PLUS` reads as `critical_plus`; surrounding spaces are
    /// ignored. Anything else is `None`.
    pub fn from_header(value: &str) -> Option<Self> {
        let value = value.trim_matches([' ', '\t']);
        Self::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(value))
    }

    /// Its slot in per-tier arrays, in the order of [`Criticality::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// How many tiers there are: the length of per-tier arrays.
pub const TIERS: usize = Criticality::ALL.len();

/// Splits a bucket's drop ratio `ratio` into one ratio per tier (in [`Criticality::ALL`] order)
/// that drops the same share of `offered` (the load per tier the ratio was computed from), the
/// lowest tiers first: `sheddable` up to all of it before `sheddable_plus` loses anything, and
/// so on up. Only the tiers' proportions matter, so counts clamped as a whole keep their split.
///
/// `None` when the load is all in one tier (or there is none): then every tier drops `ratio`, as
/// a bucket without tiers does. A tier that offered nothing drops as the nearest tier above it
/// that did (nothing, above the highest), so traffic of a tier that appears between two
/// instructions never costs a tier it outranks anything: the next instruction, which counts
/// it, gives it its rank's share.
///
/// Worked example: 1.5x the limit, a ratio of 1/3, of which 40% `sheddable` and 60% `critical`:
/// the third to drop is 5/6 of the sheddable traffic, and `critical` drops nothing:
/// `[0, 0, 0, 5/6]`.
pub fn shed_lowest_first(ratio: f64, offered: &[u64; TIERS]) -> Option<[f64; TIERS]> {
    if offered.iter().filter(|&&n| n > 0).count() <= 1 {
        return None;
    }
    let total: f64 = offered.iter().map(|&n| n as f64).sum();
    let ratio = if ratio.is_nan() {
        0.0
    } else {
        ratio.clamp(0.0, 1.0)
    };
    // What is left to drop, as a share of the whole load.
    let mut owed = ratio;
    let mut tiers = [0.0; TIERS];
    for i in (0..TIERS).rev() {
        let share = offered[i] as f64 / total;
        if share == 0.0 {
            continue;
        } else if owed >= share {
            tiers[i] = 1.0;
            owed -= share;
            // Rounding must not leave a higher tier a drop of one in a billion.
            if owed < 1e-12 {
                owed = 0.0;
            }
        } else {
            tiers[i] = owed / share;
            owed = 0.0;
        }
    }
    let mut above = 0.0;
    for (ratio, &n) in tiers.iter_mut().zip(offered) {
        if n == 0 {
            *ratio = above;
        } else {
            above = *ratio;
        }
    }
    Some(tiers)
}

impl fmt::Display for Criticality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Moves per-tier ratios `base` (an instruction's split) to a total drop share of `ratio` over
/// a load divided as `offered`: a host's own ratio between instructions ([`crate::surge`]) in
/// tiers. Less than `base` drops: every tier's ratio scaled down alike, so a tier `base` spares
/// stays spared. More: the extra from the lowest tiers' admitted traffic first. With no load
/// seen, `base` scaled to `ratio` by its own mean.
///
/// Worked example: the instruction drops `[0, 0, 0, 5/6]` of the fleet; a host whose load is all
/// `critical` surges and must drop 0.2 of its own: it has only critical traffic to drop, so
/// `[0, 0.2, 0, 5/6]`. When its load falls and its own ratio is 0.1 where the bucket's is 1/3,
/// `[0, 0, 0, 0.25]`.
pub fn shed_to(ratio: f64, base: &[f64; TIERS], offered: &[u64; TIERS]) -> [f64; TIERS] {
    let ratio = if ratio.is_nan() {
        0.0
    } else {
        ratio.clamp(0.0, 1.0)
    };
    let total: f64 = offered.iter().map(|&n| n as f64).sum();
    let mix: [f64; TIERS] = if total > 0.0 {
        offered.map(|n| n as f64 / total)
    } else {
        [1.0 / TIERS as f64; TIERS]
    };
    let dropped: f64 = base.iter().zip(&mix).map(|(r, m)| r * m).sum();
    if ratio <= dropped {
        let scale = if dropped > 0.0 { ratio / dropped } else { 0.0 };
        return base.map(|r| r * scale);
    }
    let mut owed = ratio - dropped;
    let mut tiers = *base;
    for i in (0..TIERS).rev() {
        let admitted = mix[i] * (1.0 - tiers[i]);
        if owed <= 0.0 || admitted <= 0.0 {
            continue;
        }
        let extra = owed.min(admitted);
        tiers[i] += extra / mix[i];
        owed -= extra;
        if owed < 1e-12 {
            owed = 0.0;
        }
    }
    tiers.map(|r| r.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_slots_follow_the_order() {
        for (i, c) in Criticality::ALL.into_iter().enumerate() {
            assert_eq!(Criticality::from_name(c.name()), Some(c));
            assert_eq!(c.index(), i);
        }
        assert_eq!(Criticality::default(), Criticality::Critical);
        assert_eq!(Criticality::from_name("CRITICAL"), None);
        assert_eq!(
            Criticality::from_header(" CRITICAL_PLUS"),
            Some(Criticality::CriticalPlus)
        );
        assert_eq!(
            Criticality::from_header("Sheddable"),
            Some(Criticality::Sheddable)
        );
        assert_eq!(Criticality::from_header("urgent"), None);
        assert_eq!(Criticality::from_header(""), None);
    }

    fn close(a: [f64; TIERS], b: [f64; TIERS]) -> bool {
        a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    #[test]
    fn the_lowest_tiers_absorb_the_drops_first() {
        // The worked example: 1.5x the limit, 40% sheddable.
        let tiers = shed_lowest_first(1.0 / 3.0, &[0, 600, 0, 400]).unwrap();
        assert!(close(tiers, [0.0, 0.0, 0.0, 5.0 / 6.0]), "{tiers:?}");
        // More to drop than sheddable holds: sheddable all, then critical's part; the absent
        // sheddable_plus drops as critical does.
        let tiers = shed_lowest_first(0.5, &[0, 600, 0, 400]).unwrap();
        assert!(close(tiers, [0.0, 1.0 / 6.0, 1.0 / 6.0, 1.0]), "{tiers:?}");
        // Every tier present: sheddable, then sheddable_plus, then a part of critical.
        let tiers = shed_lowest_first(0.6, &[100, 400, 250, 250]).unwrap();
        assert!(close(tiers, [0.0, 0.25, 1.0, 1.0]), "{tiers:?}");
        // Nothing to drop: nothing dropped, absent tiers included.
        let tiers = shed_lowest_first(0.0, &[0, 600, 0, 400]).unwrap();
        assert!(close(tiers, [0.0; TIERS]), "{tiers:?}");
        // One tier, or none: the ratio applies as it is.
        assert_eq!(shed_lowest_first(0.4, &[0, 1_000, 0, 0]), None);
        assert_eq!(shed_lowest_first(0.4, &[0; TIERS]), None);
    }

    #[test]
    fn a_hosts_own_ratio_keeps_the_instructions_order() {
        let base = [0.0, 0.0, 0.0, 5.0 / 6.0];
        // The worked examples: a critical-only host surging, then one whose load fell.
        let tiers = shed_to(0.2, &base, &[0, 1_000, 0, 0]);
        assert!(close(tiers, [0.0, 0.2, 0.0, 5.0 / 6.0]), "{tiers:?}");
        let tiers = shed_to(0.1, &base, &[0, 600, 0, 400]);
        assert!(close(tiers, [0.0, 0.0, 0.0, 0.25]), "{tiers:?}");
        // Its own ratio equal to what the instruction drops of its load: the instruction's.
        let tiers = shed_to(1.0 / 3.0, &base, &[0, 600, 0, 400]);
        assert!(close(tiers, base), "{tiers:?}");
        // More: sheddable to all of it, then critical.
        let tiers = shed_to(0.5, &base, &[0, 600, 0, 400]);
        assert!(close(tiers, [0.0, 1.0 / 6.0, 0.0, 1.0]), "{tiers:?}");
        // For any load, the host's own ratio is what its tiers drop of it.
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..10_000 {
            let offered: [u64; TIERS] = std::array::from_fn(|_| rng.u64(0..1_000));
            let base: [f64; TIERS] = std::array::from_fn(|_| rng.f64());
            let ratio = rng.f64();
            let tiers = shed_to(ratio, &base, &offered);
            let total: f64 = offered.iter().map(|&n| n as f64).sum();
            if total == 0.0 {
                continue;
            }
            let dropped: f64 = tiers.iter().zip(offered).map(|(r, n)| r * n as f64).sum();
            assert!(
                (dropped / total - ratio).abs() < 1e-6,
                "{offered:?} {base:?} {ratio} {tiers:?}"
            );
        }
    }

    #[test]
    fn the_split_drops_what_the_ratio_drops() {
        // For any load and ratio the tiers drop the same total, never a higher tier before a
        // lower one has lost all of its traffic.
        let mut rng = fastrand::Rng::with_seed(22);
        for _ in 0..10_000 {
            let offered: [u64; TIERS] =
                std::array::from_fn(|_| if rng.bool() { rng.u64(0..10_000) } else { 0 });
            let ratio = rng.f64();
            let Some(tiers) = shed_lowest_first(ratio, &offered) else {
                assert!(offered.iter().filter(|&&n| n > 0).count() <= 1);
                continue;
            };
            let total: f64 = offered.iter().map(|&n| n as f64).sum();
            let dropped: f64 = tiers.iter().zip(offered).map(|(r, n)| r * n as f64).sum();
            assert!(
                (dropped - ratio * total).abs() < 1e-6 * total,
                "{offered:?} {ratio}"
            );
            for i in 0..TIERS - 1 {
                assert!(
                    tiers[i] <= tiers[i + 1] + 1e-12,
                    "{offered:?} {ratio} {tiers:?}"
                );
                if tiers[i] > 0.0 && offered[i] > 0 {
                    // Every tier below one that drops, that offered anything, is dropped whole.
                    assert!(
                        (i + 1..TIERS).all(|j| offered[j] == 0 || tiers[j] == 1.0),
                        "{offered:?} {ratio} {tiers:?}"
                    );
                }
            }
        }
    }
}
