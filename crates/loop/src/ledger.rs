//! The traffic history a controller keeps for the configurator (the configurator's `builtin:` source): its
//! own region's offered, admitted, shadow-dropped and candidate-dropped counts per bucket (a
//! candidate's twin counts as its bucket's `candidate_dropped`, never as a bucket of its own), summed from the zone
//! reports it already takes into slots of a resolution (`--history-resolution`), and handed out
//! as a [`HistoryBatch`] once a slot is over, for a writer off the control loop to store.
//!
//! Zone reports carry only this region's hosts, so a global bucket's rows are this region's part
//! of its load; the reader sums regions. A slot also records how long the region was heard from
//! in it (`seconds`), so a bucket without a row in a slot that was heard from had no traffic,
//! and a slot never heard from is a gap. Worked example at a resolution of 1 s and 250 ms
//! intervals: four reports of 25 offered each land in one slot as 100 offered over 1 s, 100/s.
//!
//! Bounded: at most [`MAX_OPEN_SLOTS`] slots wait to close (the oldest is handed out early when
//! more open, as late reports would be), and a slot holds at most [`MAX_BUCKETS`] buckets.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use spillway_core::config::candidate_of;
use spillway_proto::v1;

pub use spillway_core::history::{HistoryBatch, HistoryRow};

/// Slots waiting for their reports; with reports about one interval late, two or three are open.
pub const MAX_OPEN_SLOTS: usize = 16;
/// Buckets counted in one slot; the rules hold far fewer control-plane buckets.
pub const MAX_BUCKETS: usize = 100_000;
/// How long after its end a slot waits for late reports before it is handed out. A report later
/// still opens the slot again and is handed out on its own, to be added to what was stored.
pub const LATE_MS: u64 = 2_000;
/// Reports about intervals this far before the clock are not history any more.
const TOO_OLD_MS: u64 = 10 * 60_000;

type Fast = foldhash::fast::RandomState;

#[derive(Debug, Default)]
struct Slot {
    width_ms: u64,
    /// Offered, admitted, shadow-dropped, candidate-dropped; by service, then bucket, so a
    /// report's entry is found by its own names, without a key built per entry.
    counts: HashMap<String, HashMap<String, [u64; 4], Fast>, Fast>,
    /// Buckets held in `counts`.
    buckets: usize,
}

/// The slots of one region's history as reports fill them; see the module's documentation.
#[derive(Debug)]
pub struct Ledger {
    resolution_ms: u64,
    slots: BTreeMap<u64, Slot>,
    /// Slots pushed out of `slots` by newer ones, handed out at the next `take_closed`.
    early: Vec<HistoryBatch>,
    /// Buckets left out of a full slot, and reports too old or ahead of the clock.
    refused: u64,
}

impl Ledger {
    /// Slots of `resolution` (at least 1 s); intervals longer than it make slots of their length.
    pub fn new(resolution: Duration) -> Self {
        let resolution_ms = u64::try_from(resolution.as_millis())
            .unwrap_or(u64::MAX)
            .max(1000);
        Self {
            resolution_ms,
            slots: BTreeMap::new(),
            early: Vec::new(),
            refused: 0,
        }
    }

    pub fn resolution_ms(&self) -> u64 {
        self.resolution_ms
    }

    /// Reports and buckets left out so far (too old, ahead of the clock, or a full slot).
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Adds one zone report's counts to the slot its interval starts in.
    pub fn on_zone_report(&mut self, report: &v1::ZoneReport, now_ms: u64) {
        self.on_zone_report_named(report, now_ms, |b| {
            Some((b.service.as_str(), b.bucket.as_str()))
        });
    }

    /// [`Ledger::on_zone_report`] for a report whose entries may name their buckets by number:
    /// `names` gives each entry's service and bucket (`None`: an entry to leave out,
    /// `RegionCore::bucket_names`).
    pub fn on_zone_report_named<'a>(
        &mut self,
        report: &'a v1::ZoneReport,
        now_ms: u64,
        names: impl Fn(&'a v1::BucketCounts) -> Option<(&'a str, &'a str)>,
    ) {
        let interval_ms = report.interval_ms.max(1);
        let start = report.sequence.saturating_mul(interval_ms);
        if start.saturating_add(TOO_OLD_MS) < now_ms || start > now_ms.saturating_add(interval_ms) {
            self.refused += 1;
            return;
        }
        let width = self.resolution_ms.max(interval_ms);
        let slot_start = start - start % width;
        let slot = self.slots.entry(slot_start).or_default();
        slot.width_ms = slot.width_ms.max(width);
        for b in &report.buckets {
            let Some((service, bucket)) = names(b) else {
                self.refused += 1;
                continue;
            };
            let (bucket, add) = match candidate_of(bucket) {
                Some(parent) => (parent, [0, 0, 0, b.shadow_dropped]),
                None => (bucket, [b.offered, b.allowed, b.shadow_dropped, 0]),
            };
            let full = slot.buckets >= MAX_BUCKETS;
            let counts = slot
                .counts
                .get_mut(service)
                .and_then(|service| service.get_mut(bucket));
            match counts {
                Some(c) => {
                    for (count, n) in c.iter_mut().zip(add) {
                        *count = count.saturating_add(n);
                    }
                }
                None if full => self.refused += 1,
                None => {
                    slot.counts
                        .entry(service.to_owned())
                        .or_default()
                        .insert(bucket.to_owned(), add);
                    slot.buckets += 1;
                }
            }
        }
        while self.slots.len() > MAX_OPEN_SLOTS {
            // Handed out at the next `take_closed`, whatever its age.
            let Some((start, slot)) = self.slots.pop_first() else {
                break;
            };
            if self.early.len() >= MAX_OPEN_SLOTS {
                // Nobody takes them: the oldest is lost rather than memory grown.
                self.early.remove(0);
                self.refused += 1;
            }
            self.early.push(batch_of(start, slot));
        }
    }

    /// The slots over by `now_ms` (and [`LATE_MS`] after), oldest first.
    pub fn take_closed(&mut self, now_ms: u64) -> Vec<HistoryBatch> {
        let mut out = std::mem::take(&mut self.early);
        while let Some((&start, slot)) = self.slots.first_key_value() {
            if start + slot.width_ms + LATE_MS > now_ms {
                break;
            }
            if let Some((start, slot)) = self.slots.pop_first() {
                out.push(batch_of(start, slot));
            }
        }
        out
    }
}

fn batch_of(start_ms: u64, slot: Slot) -> HistoryBatch {
    let mut rows: Vec<HistoryRow> = slot
        .counts
        .into_iter()
        .flat_map(|(service, buckets)| {
            buckets.into_iter().map(
                move |(bucket, [offered, admitted, shadow_dropped, candidate_dropped])| {
                    HistoryRow {
                        service: service.clone(),
                        bucket,
                        offered,
                        admitted,
                        shadow_dropped,
                        candidate_dropped,
                    }
                },
            )
        })
        .collect();
    rows.sort_by(|a, b| (&a.service, &a.bucket).cmp(&(&b.service, &b.bucket)));
    HistoryBatch {
        start_ms,
        seconds: slot.width_ms as f64 / 1000.0,
        rows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(sequence: u64, interval_ms: u64, counts: &[(&str, u64, u64, u64)]) -> v1::ZoneReport {
        v1::ZoneReport {
            zone: "z1".into(),
            region: "r1".into(),
            sequence,
            interval_ms,
            buckets: counts
                .iter()
                .map(|&(bucket, offered, allowed, shadow)| v1::BucketCounts {
                    service: "api".into(),
                    bucket: bucket.into(),
                    offered,
                    allowed,
                    shadow_dropped: shadow,
                    offered_tail: None,
                    offered_squares: None,
                    hosts: Some(1),
                    tier_offered: Vec::new(),
                    id: 0,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn four_quarter_second_reports_of_two_zones_make_one_second_of_history() {
        let mut ledger = Ledger::new(Duration::from_secs(1));
        // Intervals 400..404 of 250 ms: 100.0 s to 101.0 s, two zones each.
        for seq in 400..404 {
            ledger.on_zone_report(&report(seq, 250, &[("all", 25, 20, 5)]), seq * 250 + 260);
            ledger.on_zone_report(
                &report(seq, 250, &[("all", 5, 5, 0), ("b", 1, 1, 0)]),
                seq * 250 + 270,
            );
        }
        assert!(
            ledger.take_closed(101_500).is_empty(),
            "waits for late reports"
        );
        let batches = ledger.take_closed(103_000);
        assert_eq!(batches.len(), 1);
        let batch = &batches[0];
        assert_eq!((batch.start_ms, batch.seconds), (100_000, 1.0));
        assert_eq!(batch.rows.len(), 2);
        assert_eq!(batch.rows[0].bucket, "all");
        assert_eq!(
            (
                batch.rows[0].offered,
                batch.rows[0].admitted,
                batch.rows[0].shadow_dropped
            ),
            (120, 100, 20)
        );
        assert_eq!(batch.rows[1].offered, 4);
        assert!(ledger.take_closed(200_000).is_empty(), "handed out once");
    }

    #[test]
    fn a_candidates_twin_is_its_buckets_candidate_dropped_and_no_row_of_its_own() {
        let mut ledger = Ledger::new(Duration::from_secs(1));
        for seq in 400..404 {
            ledger.on_zone_report(
                &report(
                    seq,
                    250,
                    &[("all~candidate", 30, 24, 6), ("all", 30, 30, 0)],
                ),
                seq * 250 + 260,
            );
        }
        let batches = ledger.take_closed(103_000);
        let rows = &batches[0].rows;
        assert_eq!(rows.len(), 1, "{rows:?}");
        let row = &rows[0];
        assert_eq!(row.bucket, "all");
        assert_eq!(
            (
                row.offered,
                row.admitted,
                row.shadow_dropped,
                row.candidate_dropped
            ),
            (120, 120, 0, 24)
        );
    }

    #[test]
    fn a_resolution_of_a_minute_sums_a_minute_and_intervals_longer_than_it_widen_slots() {
        let mut ledger = Ledger::new(Duration::from_secs(60));
        for seq in 120..180 {
            ledger.on_zone_report(&report(seq, 1000, &[("all", 10, 10, 0)]), seq * 1000 + 1010);
        }
        let batches = ledger.take_closed(183_000);
        assert_eq!(batches.len(), 1);
        assert_eq!((batches[0].start_ms, batches[0].seconds), (120_000, 60.0));
        assert_eq!(batches[0].rows[0].offered, 600);

        let mut ledger = Ledger::new(Duration::from_secs(1));
        ledger.on_zone_report(&report(50, 2000, &[("all", 10, 10, 0)]), 102_010);
        let batches = ledger.take_closed(110_000);
        assert_eq!((batches[0].start_ms, batches[0].seconds), (100_000, 2.0));
    }

    #[test]
    fn stale_and_future_reports_are_refused_and_open_slots_are_bounded() {
        let mut ledger = Ledger::new(Duration::from_secs(1));
        let now = 10_000_000;
        ledger.on_zone_report(&report(100, 1000, &[("all", 1, 1, 0)]), now);
        ledger.on_zone_report(&report(now / 1000 + 5, 1000, &[("all", 1, 1, 0)]), now);
        assert_eq!(ledger.refused(), 2);
        assert!(ledger.take_closed(now + 60_000).is_empty());
        // Reports for more seconds than may wait: the oldest are handed out early, none lost.
        let first = now / 1000 - 100;
        for seq in first..first + 30 {
            ledger.on_zone_report(&report(seq, 1000, &[("all", 1, 1, 0)]), now);
        }
        let early = ledger.take_closed(0);
        assert_eq!(early.len(), 30 - MAX_OPEN_SLOTS);
        assert_eq!(early[0].start_ms, first * 1000);
        let rest = ledger.take_closed(now + 10_000);
        assert_eq!(rest.len(), MAX_OPEN_SLOTS);
        let total: u64 = early.iter().chain(&rest).map(|b| b.rows[0].offered).sum();
        assert_eq!(total, 30);
    }
}
