//! One span per control interval (`control.interval`), for a collector that takes
//! OpenTelemetry traces: it opens when the first report of interval `sequence` arrives and
//! closes when that interval leaves this process: at a controller when its instructions go to
//! the zones, at an aggregator when the zone's sums go up to the controller (or, without one,
//! when its instructions go to the hosts). Its length is therefore how long the interval spent
//! here, waiting for late reports included.
//!
//! Without a subscriber interested in spans (no `--otlp-endpoint`) a span is disabled when
//! created, and none is kept.

use std::collections::BTreeMap;

use tracing::Span;

/// The most intervals kept open: one whose reports never led anywhere (its upstream gone) is
/// closed, marked `spillway.outcome = "dropped"`, when this many newer ones are open.
const OPEN_AT_MOST: usize = 4;

/// Where the spans are made: which role, and the region or zone it serves.
pub(crate) struct IntervalSpans {
    role: &'static str,
    region: String,
    zone: Option<String>,
    open: BTreeMap<u64, Open>,
    /// The newest interval that left.
    left: u64,
}

struct Open {
    span: Span,
    reports: u64,
}

impl IntervalSpans {
    pub(crate) fn controller(region: &str) -> Self {
        Self {
            role: "controller",
            region: region.to_owned(),
            zone: None,
            open: BTreeMap::new(),
            left: 0,
        }
    }

    pub(crate) fn aggregator(region: &str, zone: &str) -> Self {
        Self {
            role: "aggregator",
            region: region.to_owned(),
            zone: Some(zone.to_owned()),
            open: BTreeMap::new(),
            left: 0,
        }
    }

    /// A report of interval `sequence` came in; the first one opens the interval's span.
    pub(crate) fn on_report(&mut self, sequence: u64) {
        if let Some(open) = self.open.get_mut(&sequence) {
            open.reports += 1;
            return;
        }
        // An interval that already left, reported late: nothing to add to.
        if sequence <= self.left {
            return;
        }
        let span = tracing::info_span!(
            parent: None,
            "control.interval",
            otel.kind = "internal",
            spillway.role = self.role,
            spillway.region = %self.region,
            spillway.zone = self.zone.as_deref(),
            spillway.sequence = sequence,
            spillway.reports = tracing::field::Empty,
            spillway.sent_to = tracing::field::Empty,
            spillway.buckets = tracing::field::Empty,
            spillway.unsent = tracing::field::Empty,
            spillway.outcome = tracing::field::Empty,
        );
        if span.is_disabled() {
            return;
        }
        self.open.insert(sequence, Open { span, reports: 1 });
        while self.open.len() > OPEN_AT_MOST {
            if let Some((_, old)) = self.open.pop_first() {
                old.span.record("spillway.reports", old.reports);
                old.span.record("spillway.outcome", "dropped");
            }
        }
    }

    /// Interval `sequence` left this process: to `sent_to` zones, hosts or a controller, with
    /// `buckets` buckets, `unsent` of the receivers too slow to take it. Closes its span and any
    /// older one still open.
    pub(crate) fn on_left(&mut self, sequence: u64, sent_to: u64, buckets: u64, unsent: u64) {
        self.left = self.left.max(sequence);
        while let Some(entry) = self.open.first_entry() {
            if *entry.key() > sequence {
                break;
            }
            let (seen, open) = entry.remove_entry();
            open.span.record("spillway.reports", open.reports);
            if seen == sequence {
                open.span.record("spillway.sent_to", sent_to);
                open.span.record("spillway.buckets", buckets);
                open.span.record("spillway.unsent", unsent);
                open.span.record("spillway.outcome", "sent");
            } else {
                open.span.record("spillway.outcome", "dropped");
            }
        }
    }

    /// Intervals whose span is open.
    #[cfg(test)]
    fn open(&self) -> Vec<u64> {
        self.open.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spans are made only for a subscriber that takes them.
    fn with_spans(test: impl FnOnce()) {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_writer(std::io::sink)
            .finish();
        tracing::subscriber::with_default(subscriber, test);
    }

    #[test]
    fn without_a_subscriber_nothing_is_kept() {
        let mut spans = IntervalSpans::controller("eu");
        spans.on_report(7);
        assert!(spans.open().is_empty());
    }

    #[test]
    fn an_interval_is_open_from_its_first_report_until_it_leaves() {
        with_spans(|| {
            let mut spans = IntervalSpans::aggregator("eu", "a");
            spans.on_report(7);
            spans.on_report(7);
            spans.on_report(8);
            assert_eq!(spans.open(), vec![7, 8]);
            spans.on_left(7, 2, 3, 0);
            assert_eq!(spans.open(), vec![8]);
            // Leaving 10 closes 8 too, which never left.
            spans.on_report(10);
            spans.on_left(10, 1, 1, 0);
            assert!(spans.open().is_empty());
            // A report of an interval that left is late: it opens nothing.
            spans.on_report(9);
            assert!(spans.open().is_empty());
        });
    }

    #[test]
    fn at_most_four_intervals_stay_open() {
        with_spans(|| {
            let mut spans = IntervalSpans::controller("eu");
            for sequence in 1..=6 {
                spans.on_report(sequence);
            }
            assert_eq!(spans.open(), vec![3, 4, 5, 6]);
        });
    }
}
