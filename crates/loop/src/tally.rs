//! One host's counts of the interval in progress, before and within its tail: what a host
//! reports each interval.

use std::collections::HashMap;

use spillway_proto::v1;

use crate::interval::Interval;

use crate::sums::{BucketKey, Counts, TAIL_PARTS, squares_to_wire, tiers_to_wire};

/// One bucket's counts since the previous call, by its key: `offered`, `allowed`,
/// `shadow_dropped`, `tiers` (all zero: all the default tier) and `offered_squares` (0 for a
/// bucket counted in requests); the tally sets the rest.
pub type Counted<'a> = (&'a BucketKey, Counts);

/// One host's counts of the interval in progress, taken in two parts, before its last quarter
/// and within it, and turned into the report's counts when the interval ends: sans-IO, so the
/// link and the simulator's hosts report the same way.
///
/// Counts are scaled to a whole interval (and the tail to a whole quarter) from the time they
/// actually cover: a stream that opened 300 ms before a 1 s boundary counted only 300 ms, and a
/// tail mark that fired 20 ms late counted 230 ms of tail. With 1 s intervals, a host offering
/// 100 req/s until 12:00:00.500 and 1,000 req/s after reports 550 offered, 250 in the tail.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Per bucket since the start: `offered_tail` holds what was counted since the tail mark;
    /// and whether the bucket was counted in this interval. A bucket's entry outlives the
    /// interval while the bucket is counted, so a host's every report neither copies its names
    /// nor builds the map again; one not counted in an interval is dropped at its end.
    counts: HashMap<BucketKey, (Counts, bool), foldhash::fast::RandomState>,
    started_ms: u64,
    /// When the tail started, if it was marked in this interval.
    tail_from_ms: Option<u64>,
}

impl Tally {
    /// Counting starts afresh at `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self {
            started_ms: now_ms,
            ..Self::default()
        }
    }

    /// When the tail of interval `sequence` starts: its last quarter.
    pub fn tail_start(interval: Interval, sequence: u64) -> u64 {
        interval.end_of(sequence) - interval.ms() / TAIL_PARTS
    }

    /// Whether the tail was marked in the interval in progress.
    pub fn tail_marked(&self) -> bool {
        self.tail_from_ms.is_some()
    }

    /// The counts since the previous call (`counted`) end before the tail, which starts now.
    pub fn mark_tail<'a>(&mut self, counted: impl IntoIterator<Item = Counted<'a>>, now_ms: u64) {
        self.unmark_tail();
        self.add(counted);
        self.tail_from_ms = Some(now_ms);
    }

    /// Forgets when the tail started (the interval changed length, or the report is cut short):
    /// the next report carries no tail unless the tail is marked again.
    pub fn unmark_tail(&mut self) {
        for (c, _) in self.counts.values_mut() {
            c.offered_tail = 0;
        }
        self.tail_from_ms = None;
    }

    /// Ends the interval at `now_ms` with the counts since the previous call, returns the
    /// report's counts (sorted by bucket) and starts counting the next interval.
    pub fn close<'a>(
        &mut self,
        counted: impl IntoIterator<Item = Counted<'a>>,
        now_ms: u64,
        interval: Interval,
    ) -> Vec<v1::BucketCounts> {
        self.add(counted);
        let elapsed = now_ms.saturating_sub(self.started_ms).max(1) as f64;
        let tail_scale = self.tail_from_ms.map(|from| {
            interval.ms() as f64 / TAIL_PARTS as f64 / now_ms.saturating_sub(from).max(1) as f64
        });
        self.drain(now_ms, interval.ms() as f64 / elapsed, tail_scale)
    }

    /// Ends the interval at `now_ms` for good, the host stopping: the counts as counted, not
    /// scaled to a whole interval, because the host offers nothing more in it (its load goes
    /// elsewhere, where it is counted); the tail as counted too, 0 when it had not begun. A
    /// host offering 450 req/s that stops halfway through a 1 s interval reports 225.
    pub fn close_final<'a>(
        &mut self,
        counted: impl IntoIterator<Item = Counted<'a>>,
        now_ms: u64,
    ) -> Vec<v1::BucketCounts> {
        self.add(counted);
        self.drain(now_ms, 1.0, Some(1.0))
    }

    /// The counts times `scale` (the tail times `tail_scale`, none without), sorted by bucket;
    /// counting starts afresh at `now_ms`.
    fn drain(&mut self, now_ms: u64, scale: f64, tail_scale: Option<f64>) -> Vec<v1::BucketCounts> {
        let scaled = |n: u64| (n as f64 * scale).round() as u64;
        let mut counts: Vec<(&BucketKey, Counts)> = self
            .counts
            .iter()
            .filter(|(_, (_, counted))| *counted)
            .map(|(key, (c, _))| (key, *c))
            .collect();
        counts.sort_by(|a, b| a.0.cmp(b.0));
        let report = counts
            .into_iter()
            .map(|(key, c)| v1::BucketCounts {
                tier_offered: tiers_to_wire(&c).into_iter().map(scaled).collect(),
                service: key.service.clone(),
                bucket: key.bucket.clone(),
                offered: scaled(c.offered),
                allowed: scaled(c.allowed),
                shadow_dropped: scaled(c.shadow_dropped),
                offered_tail: tail_scale.map(|k| (c.offered_tail as f64 * k).round() as u64),
                offered_squares: squares_to_wire(&Counts {
                    offered: scaled(c.offered),
                    offered_squares: scaled(c.offered_squares),
                    ..Counts::default()
                }),
                hosts: None,
                id: 0,
            })
            .collect();
        // Counting starts afresh: the buckets counted keep their entries, emptied.
        self.counts.retain(|_, (c, counted)| {
            *c = Counts::default();
            std::mem::take(counted)
        });
        self.started_ms = now_ms;
        self.tail_from_ms = None;
        report
    }

    fn add<'a>(&mut self, counted: impl IntoIterator<Item = Counted<'a>>) {
        let in_tail = self.tail_from_ms.is_some();
        for (key, c) in counted {
            let counts = Counts {
                offered_tail: if in_tail { c.offered } else { 0 },
                hosts: 0,
                ..c
            };
            match self.counts.get_mut(key) {
                Some((sum, counted)) => {
                    *sum += counts;
                    *counted = true;
                }
                None => {
                    let mut sum = Counts::default();
                    sum += counts;
                    self.counts.insert(key.clone(), (sum, true));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static KEY: std::sync::LazyLock<BucketKey> =
        std::sync::LazyLock::new(|| BucketKey::new("api", "a"));

    fn counted(offered: u64) -> [Counted<'static>; 1] {
        [(
            &KEY,
            Counts {
                offered,
                allowed: offered / 2,
                ..Counts::default()
            },
        )]
    }

    #[test]
    fn a_report_carries_its_tail_scaled_to_a_quarter() {
        let interval = Interval::from_ms(1000);
        assert_eq!(Tally::tail_start(interval, 7), 7_750);
        // 100 req/s until 7.500 s, then 1,000 req/s; the tail mark fires 10 ms late.
        let mut tally = Tally::new(7_000);
        tally.mark_tail(counted(50 + 250 + 10), 7_760);
        assert!(tally.tail_marked());
        let report = tally.close(counted(240), 8_000, interval);
        assert_eq!(report.len(), 1);
        assert_eq!(report[0].offered, 550);
        assert_eq!(report[0].allowed, 275);
        assert_eq!(report[0].offered_tail, Some(250));
        // The next interval starts counting at 8.000 s, with no tail until it is marked.
        assert!(!tally.tail_marked());
        let report = tally.close(counted(1_000), 9_000, interval);
        assert_eq!(report[0].offered, 1_000);
        assert_eq!(report[0].offered_tail, None);
    }

    #[test]
    fn a_stream_opened_late_scales_its_counts_and_an_unmarked_tail_is_unknown() {
        let interval = Interval::from_ms(1000);
        // Opened at 7.700 s, before the tail, and marked on time.
        let mut tally = Tally::new(7_700);
        tally.mark_tail(counted(50), 7_750);
        let report = tally.close(counted(250), 8_000, interval);
        assert_eq!(report[0].offered, 1_000);
        assert_eq!(report[0].offered_tail, Some(250));
        // Opened at 7.900 s, within the tail: the tail is unknown.
        let mut tally = Tally::new(7_900);
        let report = tally.close(counted(100), 8_000, interval);
        assert_eq!(report[0].offered, 1_000);
        assert_eq!(report[0].offered_tail, None);
        // Unmarked (the interval changed), the tail folds back into the whole.
        let mut tally = Tally::new(7_000);
        tally.mark_tail(counted(750), 7_750);
        tally.unmark_tail();
        let report = tally.close(counted(250), 8_000, interval);
        assert_eq!(report[0].offered, 1_000);
        assert_eq!(report[0].offered_tail, None);
    }

    #[test]
    fn a_last_report_counts_what_was_counted_unscaled() {
        // 450 req/s; the host stops at 7.500 s, before the tail: 225, no tail.
        let mut tally = Tally::new(7_000);
        let report = tally.close_final(counted(225), 7_500);
        assert_eq!((report[0].offered, report[0].allowed), (225, 112));
        assert_eq!(report[0].offered_tail, Some(0));
        // Stopping at 7.900 s, within the tail: the tail as counted, 150 ms of it.
        let mut tally = Tally::new(7_000);
        tally.mark_tail(counted(750), 7_750);
        let report = tally.close_final(counted(150), 7_900);
        assert_eq!(report[0].offered, 900);
        assert_eq!(report[0].offered_tail, Some(150));
    }
}
