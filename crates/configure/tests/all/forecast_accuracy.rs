//! Forecast accuracy on a held-out week: the forecast of each day's peak against the day's real
//! peak (its 0.99-quantile minute), as MAPE, on synthetic series with a daily and a weekly season
//! (and noise and spikes), with and without a trend. `historical`'s own prediction of a day's
//! peak is its quantile of the lookback, the same for every day.

use spillway_configure::History;
use spillway_configure::Window;
use spillway_configure::series::{DAY, Point, WEEK};
use spillway_configure::synthetic::Shape;

/// The day's peak as the test computes it: sort, type-7 quantile 0.99.
fn day_peak(minutes: &[f64]) -> f64 {
    let mut sorted = minutes.to_vec();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let h = (sorted.len() - 1) as f64 * 0.99;
    let lo = h.floor() as usize;
    sorted[lo] + (h - lo as f64) * (sorted[(lo + 1).min(sorted.len() - 1)] - sorted[lo])
}

/// (forecast MAPE, historical MAPE) over the held-out week after 28 days ending at `until`.
fn mapes(shape: &Shape, seed: u64, until: i64) -> (f64, f64) {
    let lookback = Window::ending(until, 28 * DAY);
    let mut points: Vec<Point> = Vec::new();
    shape.fill(seed, lookback, &mut points);
    let history = History::analyze(lookback, &points, 0.999, &mut Vec::new());
    let forecast = history.forecast.as_ref().expect("a forecast");
    let held_out = Window::ending(until + WEEK, WEEK);
    let mut week: Vec<Point> = Vec::new();
    shape.fill(seed, held_out, &mut week);
    let (mut f_err, mut h_err) = (0.0, 0.0);
    for day in 0..7 {
        let minutes: Vec<f64> = week[day * 1440..(day + 1) * 1440]
            .iter()
            .map(|p| p.rps)
            .collect();
        let actual = day_peak(&minutes);
        f_err += (forecast.days[day] - actual).abs() / actual;
        h_err += (history.quantile.unwrap() - actual).abs() / actual;
    }
    (f_err / 7.0, h_err / 7.0)
}

const UNTIL: i64 = 1_767_225_600; // 2026-01-01T00:00Z, a Thursday

#[test]
fn seasonal_series_peaks_are_forecast_within_ten_percent() {
    let shape = Shape {
        base: 300.0,
        daily: 0.5,
        weekend: 0.4,
        noise: 0.05,
        spike_chance: 0.2,
        spike_factor: 4.0,
        ..Shape::default()
    };
    let mut worst = 0.0f64;
    let mut sum = 0.0;
    for seed in 1..=5 {
        let (f, h) = mapes(&shape, seed, UNTIL + seed as i64 * 3 * DAY);
        eprintln!(
            "seasonal seed {seed}: forecast MAPE {:.2}%, historical {:.2}%",
            f * 100.0,
            h * 100.0
        );
        worst = worst.max(f);
        sum += f;
    }
    eprintln!(
        "seasonal: mean forecast MAPE {:.2}%, worst {:.2}%",
        sum / 5.0 * 100.0,
        worst * 100.0
    );
    assert!(worst < 0.10, "worst MAPE {worst}");
}

#[test]
fn on_a_trending_series_the_forecast_beats_historical() {
    let shape = Shape {
        base: 300.0,
        daily: 0.5,
        weekend: 0.4,
        trend_per_week: 0.1,
        origin: UNTIL - 28 * DAY,
        noise: 0.05,
        spike_chance: 0.2,
        spike_factor: 4.0,
    };
    for seed in 1..=5 {
        let (f, h) = mapes(&shape, seed, UNTIL);
        eprintln!(
            "trending seed {seed}: forecast MAPE {:.2}%, historical {:.2}%",
            f * 100.0,
            h * 100.0
        );
        assert!(f < h, "seed {seed}: forecast {f} vs historical {h}");
        assert!(f < 0.10, "seed {seed}: forecast {f}");
    }
}
