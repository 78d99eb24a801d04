//! Peers that fell silent: a partition between regions, or a region lost. This controller
//! cannot tell the two apart, but it can see where the silent peers' load went: when the load
//! it still sees (its own region's and the peers it still hears) rose by as much, the silent
//! region's load failed over to it and is counted already; when it did not, the silent regions
//! still carry it, and counting it keeps each side of a partition at its part of the limit
//! instead of the whole limit.

use super::*;

/// For how many intervals a silent peer's last sums are held (60 s at 1 s reports): past it, a
/// peer that stayed silent counts for nothing and each side of a partition enforces the whole
/// limit on its own load.
pub const PARTITION_HOLD: u64 = 60;

/// How many standard deviations of a steady load's Poisson noise (`sqrt(G)` in requests of an
/// interval, `sqrt(sum c^2)` for a token budget's tokens) the load still seen may fall short of
/// `G` and still be taken as all of it: 3. Without it a region lost and failed over was held
/// by the noise (when the survivors' count came out a little under `G`, the difference), and
/// region-loss admitted 3% under its limit in some seconds. The price: a partition whose
/// silent side offers no more than three deviations of the global count per interval (95/s of
/// 1,000/s at 1 s reports, 950/s of 100,000/s) is not held, and each side enforces the whole
/// limit.
pub const HOLD_NOISE: f64 = 3.0;

impl RegionCore {
    /// What the `silent` peers (none of their sums of the interval or the two before, their
    /// last within [`PARTITION_HOLD`]) count for, given `own` (this region's global sums of the
    /// interval) and `counted` (the peers still heard, as counted).
    ///
    /// From the last interval every silent peer sent, `since`: the global load counted then,
    /// `G`, and the silent peers' part of it, `S`. What this controller still sees now, `V`,
    /// was `G - S` then. The global load is taken as `max(V, min(G, V + S))`, or `V` when it is
    /// within [`HOLD_NOISE`] deviations of `G`: while `V` holds still the silent peers count as
    /// they were (`V + S`: a partition, each side holding the other's load); a rise of `V` is
    /// taken as their load come over (a region lost, its callers failed over), up to all of it;
    /// a fall of `V` is this side's own. Worked
    /// example: three regions offering 150/s each against 300/s, one cut off: the two still
    /// together see 300/s and hold 150/s for the third, the third sees 150/s and holds 300/s
    /// for the others, and each drops a third: 300/s admitted in all, as before the partition.
    /// Were the third region lost and its 150/s failed over, the two would see 450/s and hold
    /// nothing.
    pub(super) fn held(
        &self,
        silent: &[&Peer],
        own: &IndexedSums,
        counted: &IndexedSums,
    ) -> IndexedSums {
        let Some(since) = silent
            .iter()
            .filter_map(|p| p.sums.last_key_value().map(|(&s, _)| s))
            .min()
        else {
            return IndexedSums::default();
        };
        // Not computed here (this controller started later): nothing to hold against.
        let Some(then) = self.totals.get(&since) else {
            return IndexedSums::default();
        };
        let mut gone = IndexedSums::default();
        for peer in silent {
            if let Some((_, sums)) = peer
                .sums
                .range(..=since)
                .next_back()
                .or_else(|| peer.sums.last_key_value())
            {
                gone.add(sums);
            }
        }
        let mut seen = own.clone();
        seen.add(counted);
        let mut held = IndexedSums::default();
        for &(key, counts) in gone.iter() {
            let s = counts.offered as f64;
            if s <= 0.0 {
                continue;
            }
            let (v, before) = (seen.offered(key) as f64, then.counts(key));
            let g = before.offered as f64;
            // Within the noise of the count before: all of it is seen (a region's load failed
            // over, give or take a steady load's own noise), nothing to hold. A token budget's
            // noise is that of its answers' sizes (`Counts::squares`).
            let global = if g - v <= HOLD_NOISE * (before.squares() as f64).sqrt() {
                v
            } else {
                v.max(g.min(v + s))
            };
            let part = (global - v) / s;
            if part > 0.0 {
                held.push(key, counts.scaled(part));
            }
        }
        held
    }

    /// Keeps interval `sequence`'s global sums as counted (`own` and `peers`), and forgets those
    /// no peer's silence could still be held against.
    pub(super) fn record_total(&mut self, sequence: u64, own: IndexedSums, peers: &IndexedSums) {
        let mut total = own;
        total.add(peers);
        self.totals.insert(sequence, total);
        let floor = self
            .peers
            .values()
            .filter_map(|p| p.sums.last_key_value().map(|(&s, _)| s))
            .filter(|&last| last + PARTITION_HOLD >= sequence)
            .fold(sequence.saturating_sub(2), u64::min);
        self.totals.retain(|&s, _| s >= floor);
    }
}
