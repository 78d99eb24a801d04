//! A few minutes of one bucket's figures for the dashboard's charts, in a ring of fixed size.
//!
//! The controller computes a bucket once per report interval; the ring keeps one slot per second
//! (or per interval, when intervals are longer), each slot the mean of the intervals computed in
//! it. With 300 slots that is five minutes at intervals of a second or less: at 250 ms intervals a
//! slot averages four of them, and the ring never holds more than 300 slots whatever the interval.

use std::collections::VecDeque;

/// Slots kept per bucket: five minutes of one-second slots.
pub(super) const SLOTS: usize = 300;

/// The shortest slot: intervals shorter than this are averaged into one slot.
pub(super) const MIN_SLOT_MS: u64 = 1000;

/// One computed interval of a bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Sample {
    pub limit_rps: f64,
    pub offered_rps: f64,
    pub admitted_rps: f64,
    pub drop_ratio: f64,
    /// Requests refused, per second: offered less admitted less the virtual drops.
    pub real_drop_rps: f64,
    /// Requests a shadow bucket would have refused (and forwarded), per second.
    pub shadow_drop_rps: f64,
}

impl Sample {
    fn add(&mut self, other: &Sample) {
        self.limit_rps += other.limit_rps;
        self.offered_rps += other.offered_rps;
        self.admitted_rps += other.admitted_rps;
        self.drop_ratio += other.drop_ratio;
        self.real_drop_rps += other.real_drop_rps;
        self.shadow_drop_rps += other.shadow_drop_rps;
    }

    fn scaled(&self, by: f64) -> Sample {
        Sample {
            limit_rps: self.limit_rps * by,
            offered_rps: self.offered_rps * by,
            admitted_rps: self.admitted_rps * by,
            drop_ratio: self.drop_ratio * by,
            real_drop_rps: self.real_drop_rps * by,
            shadow_drop_rps: self.shadow_drop_rps * by,
        }
    }
}

/// The sum of the samples that fell into one slot.
#[derive(Debug, Clone, Copy)]
struct Slot {
    /// Where the slot starts, Unix milliseconds.
    start_ms: u64,
    samples: u32,
    sum: Sample,
}

/// A bucket's recent figures: the last interval as computed, and the slots of the last minutes.
#[derive(Debug, Clone)]
pub(super) struct History {
    latest: Sample,
    slots: VecDeque<Slot>,
}

impl History {
    pub(super) fn new() -> Self {
        Self {
            latest: Sample::default(),
            slots: VecDeque::with_capacity(SLOTS),
        }
    }

    /// The interval that ended at `at_ms`, of `interval_ms`, computed as `sample`.
    pub(super) fn push(&mut self, at_ms: u64, interval_ms: u64, sample: Sample) {
        self.latest = sample;
        let width = interval_ms.max(MIN_SLOT_MS);
        let start_ms = at_ms - at_ms % width;
        match self.slots.back_mut() {
            Some(last) if last.start_ms == start_ms => {
                last.samples += 1;
                last.sum.add(&sample);
            }
            // The clock went back (or intervals changed length): start again rather than draw
            // a line backwards.
            Some(last) if last.start_ms > start_ms => {
                self.slots.clear();
                self.slots.push_back(Slot {
                    start_ms,
                    samples: 1,
                    sum: sample,
                });
            }
            _ => {
                if self.slots.len() == SLOTS {
                    self.slots.pop_front();
                }
                self.slots.push_back(Slot {
                    start_ms,
                    samples: 1,
                    sum: sample,
                });
            }
        }
    }

    /// The last interval as computed.
    pub(super) fn latest(&self) -> Sample {
        self.latest
    }

    /// Each slot's start and the mean of its samples, oldest first.
    pub(super) fn points(&self) -> impl ExactSizeIterator<Item = (u64, Sample)> + '_ {
        self.slots
            .iter()
            .map(|s| (s.start_ms, s.sum.scaled(1.0 / f64::from(s.samples))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offered(rps: f64) -> Sample {
        Sample {
            offered_rps: rps,
            ..Sample::default()
        }
    }

    #[test]
    fn intervals_of_a_quarter_second_are_averaged_into_one_slot_per_second() {
        let mut history = History::new();
        // Four 250 ms intervals of 100, 200, 300 and 400/s, then the next second's first.
        for (i, rps) in [100.0, 200.0, 300.0, 400.0, 50.0].into_iter().enumerate() {
            history.push(10_250 + 250 * i as u64, 250, offered(rps));
        }
        let points: Vec<(u64, Sample)> = history.points().collect();
        // 10.25, 10.5 and 10.75 fall into the slot of second 10; 11.0 and 11.25 into 11's.
        assert_eq!(points.len(), 2);
        assert_eq!(points[0].0, 10_000);
        assert_eq!(points[0].1.offered_rps, 200.0);
        assert_eq!(points[1].0, 11_000);
        assert_eq!(points[1].1.offered_rps, 225.0);
        assert_eq!(history.latest().offered_rps, 50.0);
    }

    #[test]
    fn the_ring_keeps_five_minutes_and_no_more() {
        let mut history = History::new();
        for second in 0..1000u64 {
            history.push(second * 1000, 1000, offered(second as f64));
        }
        let points: Vec<(u64, Sample)> = history.points().collect();
        assert_eq!(points.len(), SLOTS);
        assert_eq!(
            points[0].0, 700_000,
            "the oldest kept is 300 s before the last"
        );
        assert_eq!(points[SLOTS - 1].1.offered_rps, 999.0);
    }

    #[test]
    fn intervals_longer_than_a_second_get_a_slot_each() {
        let mut history = History::new();
        for i in 0..3u64 {
            history.push(5_000 * (i + 1), 5_000, offered(10.0));
        }
        let starts: Vec<u64> = history.points().map(|(t, _)| t).collect();
        assert_eq!(starts, [5_000, 10_000, 15_000]);
    }

    #[test]
    fn a_clock_that_goes_back_starts_the_ring_again() {
        let mut history = History::new();
        history.push(20_000, 1000, offered(1.0));
        history.push(21_000, 1000, offered(2.0));
        history.push(5_000, 1000, offered(3.0));
        let points: Vec<(u64, Sample)> = history.points().collect();
        assert_eq!(points.len(), 1);
        assert_eq!(points[0], (5_000, offered(3.0)));
    }
}
