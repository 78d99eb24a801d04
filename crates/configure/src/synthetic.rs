//! An in-process history source for benchmarks, tests and trying the configurator without a
//! Prometheus: per-minute traffic with a daily and a weekly season, a trend, noise and spikes,
//! the same for the same seed whatever window is asked (a held-out week continues the history).
//! The generated series of [`SyntheticSource::new`] are the exception in one respect: their trend
//! counts from the start of the lookback asked (see [`SyntheticSource::generated`]).

use std::f64::consts::TAU;

use crate::series::{DAY, HistorySource, MINUTE, Point, SeriesKey, SourceError, WEEK, Window};

/// The traffic of one synthetic series.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// The mean rate (requests/s) at `origin`.
    pub base: f64,
    /// The daily swing as a share of the base: 0.5 goes from 0.5x at 02:00 to 1.5x at 14:00 UTC.
    pub daily: f64,
    /// How much quieter Saturday and Sunday are: 0.4 is 40% below the week days.
    pub weekend: f64,
    /// Linear growth per week, as a share of the base: 0.05 adds 5% of it every week.
    pub trend_per_week: f64,
    /// When the trend starts counting (Unix seconds).
    pub origin: i64,
    /// Multiplicative noise per minute: its standard deviation as a share (0.05).
    pub noise: f64,
    /// The chance that a day has one spike, of `spike_factor` times the rate for 1 to 5 minutes.
    pub spike_chance: f64,
    pub spike_factor: f64,
}

impl Default for Shape {
    fn default() -> Self {
        Shape {
            base: 100.0,
            daily: 0.5,
            weekend: 0.4,
            trend_per_week: 0.0,
            origin: 0,
            noise: 0.05,
            spike_chance: 0.1,
            spike_factor: 4.0,
        }
    }
}

impl Shape {
    /// The rate without noise or spikes at the minute ending `at`.
    pub fn smooth(&self, at: i64) -> f64 {
        let day_secs = (at - MINUTE / 2).rem_euclid(DAY) as f64;
        let daily = 1.0 + self.daily * (TAU * (day_secs / DAY as f64 - 14.0 / 24.0)).cos();
        // 1970-01-01 was a Thursday: day 2 of the week from it is Saturday, 3 Sunday.
        let weekday = (at - MINUTE / 2).div_euclid(DAY).rem_euclid(7);
        let weekly = if weekday == 2 || weekday == 3 {
            1.0 - self.weekend
        } else {
            1.0
        };
        let trend = 1.0 + self.trend_per_week * (at - self.origin) as f64 / WEEK as f64;
        (self.base * daily * weekly * trend).max(0.0)
    }

    /// Appends the minutes ending in `window` to `out`; `seed` makes the series its own.
    pub fn fill(&self, seed: u64, window: Window, out: &mut Vec<Point>) {
        let first_day = (window.start + MINUTE).div_euclid(DAY);
        let last_day = window.end.div_euclid(DAY);
        for day in first_day..=last_day {
            let mut rng = fastrand::Rng::with_seed(
                seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    ^ (day as u64).wrapping_mul(0xD1B5_4A32_D192_ED03),
            );
            let spike =
                (rng.f64() < self.spike_chance).then(|| (rng.i64(0..1440 - 5), rng.i64(1..=5)));
            let from = (day * DAY + MINUTE).max(window.start + MINUTE);
            let to = ((day + 1) * DAY).min(window.end);
            // The noise of every minute of the day is drawn, in or out of the window, so a
            // minute's value does not depend on the window asked.
            for minute in 0..1440i64 {
                let at = day * DAY + (minute + 1) * MINUTE;
                let gauss = (rng.f64() + rng.f64() + rng.f64() + rng.f64() - 2.0) * 3f64.sqrt();
                if at < from || at > to {
                    continue;
                }
                let mut rps = self.smooth(at) * (1.0 + self.noise * gauss);
                if let Some((start, len)) = spike
                    && (start..start + len).contains(&minute)
                {
                    rps *= self.spike_factor;
                }
                out.push(Point {
                    at,
                    rps: rps.max(0.0),
                });
            }
        }
    }
}

/// A source of synthetic series: `count` of them, keyed `svc-N/bucket-M`, each of its own shape
/// (bases from 20 to 5,000 requests/s, some trending), or the list given.
pub struct SyntheticSource {
    series: Vec<(SeriesKey, Shape)>,
    generated: Option<usize>,
    seed: u64,
    next: usize,
}

impl SyntheticSource {
    /// `count` generated series; none of them is in memory before it is asked for.
    pub fn new(count: usize, seed: u64) -> Self {
        SyntheticSource {
            series: Vec::new(),
            generated: Some(count),
            seed,
            next: 0,
        }
    }

    /// The series given, in order.
    pub fn with_series(series: Vec<(SeriesKey, Shape)>, seed: u64) -> Self {
        SyntheticSource {
            series,
            generated: None,
            seed,
            next: 0,
        }
    }

    /// The `index`th generated series' key and shape over `window`. Every fourth series grows
    /// by 5% of its base a week, counted from the window's start: a trend counted from a fixed
    /// origin would have a series made in 2026 at thousands of weeks of growth, 150 times its
    /// base and growing by a few hundredths of a percent a week.
    pub fn generated(index: usize, window: Window) -> (SeriesKey, Shape) {
        let key = SeriesKey::bucket(&format!("svc-{}", index / 100), &format!("bucket-{index}"));
        let mix = (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        let shape = Shape {
            base: 20.0 * 250f64.powf((mix % 1000) as f64 / 1000.0),
            daily: 0.2 + 0.6 * ((mix / 1000) % 10) as f64 / 10.0,
            weekend: 0.5 * ((mix / 10_000) % 5) as f64 / 5.0,
            trend_per_week: if index.is_multiple_of(4) { 0.05 } else { 0.0 },
            origin: window.start,
            ..Shape::default()
        };
        (key, shape)
    }
}

impl HistorySource for SyntheticSource {
    fn next_series(
        &mut self,
        window: Window,
        points: &mut Vec<Point>,
    ) -> Result<Option<SeriesKey>, SourceError> {
        points.clear();
        let index = self.next;
        let (key, shape) = match self.generated {
            Some(count) if index < count => Self::generated(index, window),
            Some(_) => return Ok(None),
            None => match self.series.get(index) {
                Some(series) => series.clone(),
                None => return Ok(None),
            },
        };
        self.next += 1;
        shape.fill(self.seed ^ index as u64, window, points);
        Ok(Some(key))
    }

    fn describe(&self) -> String {
        format!("the synthetic source (seed {})", self.seed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minute_is_the_same_in_any_window() {
        let shape = Shape::default();
        let long = Window::ending(40 * DAY, 10 * DAY);
        let short = Window::ending(35 * DAY + 7 * 3600, 2 * DAY);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        shape.fill(7, long, &mut a);
        shape.fill(7, short, &mut b);
        assert_eq!(a.len(), long.minutes());
        assert_eq!(b.len(), short.minutes());
        let found = a.iter().find(|p| p.at == b[100].at).unwrap();
        assert_eq!(found.rps, b[100].rps);
    }

    /// Generated series are within their stated bases, and the trending ones grow by 5% of the
    /// base a week from the start of any window: +4.3% from the fourth week to the fifth.
    #[test]
    fn generated_series_trend_from_the_window_start() {
        for until in [1_767_225_600, 2_000_000_040] {
            let window = Window::ending(until, 28 * DAY);
            for index in 0..40 {
                let (_, shape) = SyntheticSource::generated(index, window);
                assert!((20.0..5000.0).contains(&shape.base), "{shape:?}");
                let growth = shape.smooth(window.end) / shape.smooth(window.end - WEEK);
                let want = if index % 4 == 0 { 1.20 / 1.15 } else { 1.0 };
                assert!((growth - want).abs() < 1e-9, "{index}: {growth} vs {want}");
            }
        }
    }

    #[test]
    fn the_daily_peak_is_in_the_afternoon() {
        let shape = Shape {
            noise: 0.0,
            spike_chance: 0.0,
            ..Shape::default()
        };
        let mut points = Vec::new();
        shape.fill(1, Window::ending(5 * DAY, DAY), &mut points);
        let peak = points
            .iter()
            .max_by(|a, b| a.rps.total_cmp(&b.rps))
            .unwrap();
        assert_eq!(peak.at.rem_euclid(DAY) / 3600, 14);
    }
}
