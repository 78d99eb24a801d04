//! One pass over a series that gives every policy and chart what it reads: the lookback's
//! quantile and highest minute, each whole day's peak, each hour's highest minute, and the
//! forecast fitted to the days.

use crate::forecast::Forecast;
use crate::series::{Point, Window};
use crate::stats;

/// A day's peak is this quantile of its minutes: the 15 highest minutes of a whole day are
/// passed over, so a spike of a few minutes does not count as the day's peak.
pub const DAY_PEAK_QUANTILE: f64 = 0.99;

/// A day with fewer than this share of its minutes has no peak (a gap, not a quiet day).
pub const MIN_DAY_COVERAGE: f64 = 0.5;

const MINUTES_PER_DAY: usize = 1440;

/// What is known of one series over the lookback.
#[derive(Debug, Clone)]
pub struct History {
    pub window: Window,
    /// Minutes with a value.
    pub points: usize,
    /// `points` over the minutes of the window.
    pub coverage: f64,
    /// The highest minute (the earliest of equals).
    pub peak: Option<Point>,
    /// The quantile asked for and its value over every minute of the lookback.
    pub q: f64,
    pub quantile: Option<f64>,
    /// Per whole day, oldest first: its [`DAY_PEAK_QUANTILE`], or `None` for a gap.
    pub day_peaks: Vec<Option<f64>>,
    /// Per whole hour, oldest first: its highest minute, NaN without one.
    pub hourly_max: Vec<f64>,
    /// Next week's daily peaks, or why there is no forecast.
    pub forecast: Result<Forecast, String>,
    /// Per hour of the week (day of the window mod 7, then hour), the median over the weeks of
    /// that hour's highest minute over its day's peak: the daily season, for the charts. Empty
    /// without a forecast.
    pub hour_shape: Vec<f64>,
}

impl History {
    /// Reads `points` (in time order; those outside the window, negative or not finite are
    /// passed over) with `scratch` as working space.
    pub fn analyze(window: Window, points: &[Point], q: f64, scratch: &mut Vec<f64>) -> History {
        scratch.clear();
        let mut peak: Option<Point> = None;
        let mut day_peaks = vec![None; window.days()];
        let mut hourly_max = vec![f64::NAN; window.hours()];
        let mut day_minutes: Vec<f64> = Vec::with_capacity(MINUTES_PER_DAY);
        let mut current_day: Option<usize> = None;
        let mut close_day = |day: Option<usize>, minutes: &mut Vec<f64>| {
            if let Some(day) = day
                && minutes.len() as f64 >= MINUTES_PER_DAY as f64 * MIN_DAY_COVERAGE
            {
                day_peaks[day] = stats::quantile(minutes, DAY_PEAK_QUANTILE);
            }
            minutes.clear();
        };
        for point in points {
            if !window.contains(point.at) || !point.rps.is_finite() || point.rps < 0.0 {
                continue;
            }
            scratch.push(point.rps);
            if peak.is_none_or(|p| point.rps > p.rps) {
                peak = Some(*point);
            }
            if let Some(hour) = window.hour_of(point.at) {
                let slot = &mut hourly_max[hour];
                if slot.is_nan() || point.rps > *slot {
                    *slot = point.rps;
                }
            }
            let day = window.day_of(point.at);
            if day != current_day {
                close_day(current_day, &mut day_minutes);
                current_day = day;
            }
            if day.is_some() {
                day_minutes.push(point.rps);
            }
        }
        close_day(current_day, &mut day_minutes);
        let points = scratch.len();
        let quantile = stats::quantile(scratch, q);
        let forecast = Forecast::fit(&day_peaks);
        let hour_shape = match &forecast {
            Ok(_) => hour_shape(&hourly_max, &day_peaks),
            Err(_) => Vec::new(),
        };
        History {
            window,
            points,
            coverage: points as f64 / window.minutes().max(1) as f64,
            peak,
            q,
            quantile,
            day_peaks,
            hourly_max,
            forecast,
            hour_shape,
        }
    }

    /// The spread of the daily peaks: their coefficient of variation (standard deviation over
    /// mean), what `--headroom auto` reads for `historical`. `None` below two days.
    pub fn daily_peak_cv(&self) -> Option<f64> {
        let peaks: Vec<f64> = self.day_peaks.iter().flatten().copied().collect();
        let (mean, sd) = stats::mean_sd(&peaks)?;
        (mean > 0.0).then_some(sd / mean)
    }

    /// The forecast's picture of hour `hour` after the window (0 = the first hour after it):
    /// the predicted peak of its day times the hour's share of the day's peak.
    pub fn forecast_hour(&self, hour: usize) -> Option<f64> {
        let forecast = self.forecast.as_ref().ok()?;
        let day = hour / 24;
        let peak = *forecast.days.get(day)?;
        let how = ((self.window.days() + day) % 7) * 24 + hour % 24;
        let shape = *self.hour_shape.get(how)?;
        shape.is_finite().then_some(peak * shape)
    }
}

fn hour_shape(hourly_max: &[f64], day_peaks: &[Option<f64>]) -> Vec<f64> {
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); 168];
    for (hour, max) in hourly_max.iter().enumerate() {
        let day = hour / 24;
        if let (true, Some(Some(peak))) = (max.is_finite(), day_peaks.get(day))
            && *peak > 0.0
        {
            ratios[(day % 7) * 24 + hour % 24].push(max / peak);
        }
    }
    ratios
        .iter_mut()
        .map(|r| stats::median(r).unwrap_or(f64::NAN))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::series::{DAY, MINUTE};

    #[test]
    fn days_and_hours_count_back_from_the_end() {
        let window = Window::ending(30 * DAY + 600, 28 * DAY);
        // Every minute at 1 rps, and one spike of 50 at the last minute.
        let mut points: Vec<Point> = (1..=window.minutes() as i64)
            .map(|i| Point {
                at: window.start + i * MINUTE,
                rps: 1.0,
            })
            .collect();
        points.last_mut().unwrap().rps = 50.0;
        let h = History::analyze(window, &points, 0.999, &mut Vec::new());
        assert_eq!(h.points, 28 * 1440);
        assert_eq!(h.coverage, 1.0);
        assert_eq!(h.peak.unwrap().at, window.end);
        assert_eq!(h.quantile, Some(1.0));
        assert_eq!(h.day_peaks, vec![Some(1.0); 28]);
        assert_eq!(h.hourly_max.len(), 28 * 24);
        assert_eq!(h.hourly_max[28 * 24 - 1], 50.0);
        assert!(h.forecast.is_ok());
    }

    #[test]
    fn gaps_leave_days_without_a_peak() {
        let window = Window::ending(28 * DAY, 28 * DAY);
        // Only the first 10 hours of each day.
        let points: Vec<Point> = (1..=window.minutes() as i64)
            .map(|i| Point {
                at: window.start + i * MINUTE,
                rps: 3.0,
            })
            .filter(|p| (p.at - window.start - 1).rem_euclid(DAY) < 10 * 3600)
            .collect();
        let h = History::analyze(window, &points, 0.999, &mut Vec::new());
        assert!(h.day_peaks.iter().all(Option::is_none));
        assert!(h.forecast.is_err());
        assert!((h.coverage - 10.0 / 24.0).abs() < 1e-9);
    }
}
