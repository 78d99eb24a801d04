//! The engine's event queue: events in the order of their instant, ties in the order they were
//! scheduled, delivered a tick at a time.
//!
//! A binary heap of every event in flight did the same, but at 100,000 hosts a report interval's
//! boundary puts 100,000 reports in it at once, and a zone's instructions 11,000 messages, one
//! per host: each pop walked 17 levels of a heap far larger than the cache. Here an event waits
//! in the list of the tick that delivers it, unsorted; a tick's list is sorted once when its
//! turn comes. Events scheduled while a tick is delivered, for an instant within it (a zone's
//! instructions relayed to its hosts), are sorted in a run of their own when there are many of
//! them, or go to a small heap; the next event is the earliest of the runs and the heap, so the
//! order is the one heap's exactly.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};

use spillway_core::clock::Nanos;

/// An event and when it is due; `order` breaks ties in scheduling order.
struct Scheduled<E> {
    at: Nanos,
    order: u64,
    event: E,
}

impl<E> PartialEq for Scheduled<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl<E> Eq for Scheduled<E> {}
impl<E> PartialOrd for Scheduled<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Scheduled<E> {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: the earliest is the greatest, so a heap pops it first and a list sorted in
        // ascending order holds it last.
        (other.at, other.order).cmp(&(self.at, self.order))
    }
}

/// Events scheduled together within a tick, from which on they are sorted as a run rather than
/// pushed on the heap one by one.
const RUN: usize = 64;

/// Events by delivery tick: a tick of `tick_ns` starting at `start` delivers everything due at
/// or before its instant.
pub struct Queue<E> {
    start: Nanos,
    tick_ns: Nanos,
    /// Events of later ticks, by the first tick at or after their instant.
    later: BTreeMap<u64, Vec<Scheduled<E>>>,
    /// The tick being delivered, in runs sorted earliest last.
    runs: Vec<Vec<Scheduled<E>>>,
    /// Events scheduled since the last [`Queue::next`], due within the tick.
    fresh: Vec<Scheduled<E>>,
    /// Due within the tick, scheduled a few at a time.
    soon: BinaryHeap<Scheduled<E>>,
    /// The instant of the tick being delivered, or last delivered.
    delivering: Nanos,
    order: u64,
}

impl<E> Queue<E> {
    /// A queue of ticks of `tick_ns` from `start`.
    pub fn new(start: Nanos, tick_ns: Nanos) -> Self {
        Self {
            start,
            tick_ns,
            later: BTreeMap::new(),
            runs: Vec::new(),
            fresh: Vec::new(),
            soon: BinaryHeap::new(),
            delivering: start,
            order: 0,
        }
    }

    /// Schedules `event` at `at`.
    pub fn schedule(&mut self, at: Nanos, event: E) {
        self.order += 1;
        let scheduled = Scheduled {
            at,
            order: self.order,
            event,
        };
        if at <= self.delivering {
            self.fresh.push(scheduled);
        } else {
            let tick = (at - self.start).div_ceil(self.tick_ns);
            self.later.entry(tick).or_default().push(scheduled);
        }
    }

    /// Starts delivering the tick at `now`: everything due at or before it, earliest first,
    /// through [`Queue::next`].
    pub fn start_tick(&mut self, now: Nanos) {
        self.delivering = now;
        let tick = now.saturating_sub(self.start) / self.tick_ns;
        let mut due = Vec::new();
        while let Some(entry) = self.later.first_entry() {
            if *entry.key() > tick {
                break;
            }
            let events = entry.remove();
            if due.is_empty() {
                due = events;
            } else {
                due.extend(events);
            }
        }
        self.add_run(due);
    }

    fn add_run(&mut self, mut run: Vec<Scheduled<E>>) {
        if !run.is_empty() {
            run.sort_unstable();
            self.runs.push(run);
        }
    }

    /// The next event of the tick being delivered, with its instant.
    pub fn next(&mut self) -> Option<(Nanos, E)> {
        if self.fresh.len() >= RUN {
            let fresh = std::mem::take(&mut self.fresh);
            self.add_run(fresh);
        } else {
            self.soon.extend(self.fresh.drain(..));
        }
        // The run whose earliest is the earliest of all runs.
        let run =
            (0..self.runs.len()).max_by(|&a, &b| self.runs[a].last().cmp(&self.runs[b].last()));
        let from_run = match (run.and_then(|r| self.runs[r].last()), self.soon.peek()) {
            (None, None) => return None,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(due), Some(soon)) => due > soon,
        };
        let next = if let (true, Some(r)) = (from_run, run) {
            let next = self.runs[r].pop();
            if self.runs[r].is_empty() {
                self.runs.swap_remove(r);
            }
            next
        } else {
            self.soon.pop()
        }?;
        Some((next.at, next.event))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_in_order_of_instant_then_of_scheduling_also_when_scheduled_during_a_tick() {
        let mut q = Queue::new(1_000, 10);
        for (at, name) in [
            (1_015, "c"),
            (1_005, "a"),
            (1_015, "d"),
            (1_010, "b"),
            (1_031, "z"),
        ] {
            q.schedule(at, name);
        }
        q.start_tick(1_010);
        assert_eq!(q.next(), Some((1_005, "a")));
        // Scheduled while the tick is delivered: within it, before the rest of the tick.
        q.schedule(1_007, "a2");
        q.schedule(1_010, "b2");
        q.schedule(1_012, "c0");
        assert_eq!(q.next(), Some((1_007, "a2")));
        assert_eq!(q.next(), Some((1_010, "b")));
        assert_eq!(q.next(), Some((1_010, "b2")));
        assert_eq!(q.next(), None);
        q.start_tick(1_020);
        let names: Vec<_> = std::iter::from_fn(|| q.next()).map(|(_, n)| n).collect();
        assert_eq!(names, ["c0", "c", "d"]);
        q.start_tick(1_030);
        assert_eq!(q.next(), None);
        q.start_tick(1_040);
        assert_eq!(q.next(), Some((1_031, "z")));
    }

    #[test]
    fn it_delivers_what_a_heap_of_every_event_delivers() {
        let mut rng = fastrand::Rng::with_seed(3);
        let mut q = Queue::new(0, 10);
        let mut heap = BinaryHeap::new();
        let mut order = 0;
        // Each event is its order of scheduling, in both.
        let mut schedule = |q: &mut Queue<u64>, heap: &mut BinaryHeap<Scheduled<u64>>, at| {
            order += 1;
            heap.push(Scheduled {
                at,
                order,
                event: order,
            });
            q.schedule(at, order);
        };
        for now in (0..2_000).step_by(10) {
            for _ in 0..rng.usize(0..20) {
                schedule(&mut q, &mut heap, now + 1 + rng.u64(0..60));
            }
            q.start_tick(now);
            let mut spawned = 0;
            while let Some((at, event)) = q.next() {
                let top = heap.pop().unwrap();
                assert!(top.at <= now);
                assert_eq!((at, event), (top.at, top.event));
                // Now and then an event schedules another within the tick, or later; now and
                // then a hundred, as a zone relays its instructions.
                let more = match rng.u8(..) {
                    _ if spawned > 500 => 0,
                    0..4 => 100,
                    4..40 => 1,
                    _ => 0,
                };
                spawned += more;
                for _ in 0..more {
                    schedule(&mut q, &mut heap, at + rng.u64(0..15));
                }
            }
            assert!(heap.peek().is_none_or(|e| e.at > now));
        }
    }
}
