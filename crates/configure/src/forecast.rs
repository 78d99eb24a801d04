//! The seasonal model behind the `forecast` policy: next week's daily peaks from the last weeks'.
//!
//! A day's peak (the 0.99-quantile of its minutes, see [`crate::history`]) is modelled as
//! `log peak(d) = c[weekday(d)] + b·d + e(d)`: a weekly season (one level per weekday, so a
//! quiet Sunday stays quiet), a trend (growth of `e^(7b) - 1` per week) and noise. The daily
//! season is where within a day the peak falls; taking each day's peak folds it away, and the
//! charts restore it from the history's median hour-of-week shape ([`crate::history`]). Fitted by
//! least squares, then once more without the days whose residual is beyond four robust standard
//! deviations (an incident or a holiday should not bend the trend).
//!
//! Why not a crate: Holt-Winters or MSTL (`augurs`) on the per-minute series would need a season
//! of 10,080 points and hundreds of kilobytes of state per series, and pull in a linear-algebra
//! stack; the question asked here (how high will next week's peaks be) needs 28 numbers per series
//! and eight parameters, solved in closed form in microseconds, which keeps 10,000 series cheap.

/// Below this many usable days a forecast is not attempted: two of every weekday.
pub const MIN_DAYS: usize = 14;

/// Next week's daily peaks.
#[derive(Debug, Clone, PartialEq)]
pub struct Forecast {
    /// The predicted peak of each of the seven days after the window, in order.
    pub days: [f64; 7],
    /// The standard deviation of the fit's residuals, in log space: the band of a predicted
    /// peak p is `p·e^(-2σ) .. p·e^(2σ)`.
    pub sigma: f64,
    /// Growth per week: 0.05 is +5% a week.
    pub trend_per_week: f64,
    /// How many days the fit used, and how many it set aside as outliers.
    pub used_days: usize,
    pub outlier_days: usize,
}

impl Forecast {
    /// The highest predicted peak of next week and its day (0..7 after the window).
    pub fn peak(&self) -> (usize, f64) {
        self.days
            .iter()
            .copied()
            .enumerate()
            .fold(
                (0, f64::MIN),
                |best, (i, p)| if p > best.1 { (i, p) } else { best },
            )
    }

    /// The band of a predicted value: two residual standard deviations either side.
    pub fn band(&self, value: f64) -> (f64, f64) {
        (
            value * (-2.0 * self.sigma).exp(),
            value * (2.0 * self.sigma).exp(),
        )
    }

    /// Fits the model to the peaks of whole days (`None`: a day without enough data) and
    /// predicts the seven days after them; `Err` says why it could not.
    pub fn fit(day_peaks: &[Option<f64>]) -> Result<Forecast, String> {
        let all: Vec<(usize, f64)> = day_peaks
            .iter()
            .enumerate()
            .filter_map(|(d, p)| p.filter(|p| *p > 0.0).map(|p| (d, p.ln())))
            .collect();
        let mut per_weekday = [0usize; 7];
        all.iter().for_each(|(d, _)| per_weekday[d % 7] += 1);
        if all.len() < MIN_DAYS || per_weekday.iter().any(|n| *n < 2) {
            return Err(format!(
                "a forecast needs at least two weeks of days with traffic (two of each weekday); \
                 {} of the lookback's {} days have enough",
                all.len(),
                day_peaks.len()
            ));
        }
        // Set aside the worst day while it is beyond four robust standard deviations (the
        // median absolute residual times 1.4826), one at a time: a 10x incident day also pulls
        // its weekday's level, so removing every day past the bound at once would remove its
        // innocent neighbours too.
        let mut used = all.clone();
        let mut model = solve(&used).ok_or("the forecast's equations are singular")?;
        for _ in 0..all.len() / 7 {
            let residuals: Vec<f64> = used.iter().map(|&(d, y)| y - model.at(d)).collect();
            let mut abs: Vec<f64> = residuals.iter().map(|r| r.abs()).collect();
            let robust_sd = 1.4826 * crate::stats::median(&mut abs).unwrap_or(0.0);
            let Some((worst, r)) = residuals
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
            else {
                break;
            };
            if r.abs() <= (4.0 * robust_sd).max(1e-9) {
                break;
            }
            let weekday = used[worst].0 % 7;
            if used.iter().filter(|(d, _)| d % 7 == weekday).count() <= 2 {
                break;
            }
            let mut fewer = used.clone();
            fewer.remove(worst);
            match solve(&fewer) {
                Some(better) => {
                    used = fewer;
                    model = better;
                }
                None => break,
            }
        }
        let sse: f64 = used.iter().map(|&(d, y)| (y - model.at(d)).powi(2)).sum();
        let sigma = (sse / (used.len() - 8).max(1) as f64).sqrt();
        let n = day_peaks.len();
        let days = std::array::from_fn(|i| model.at(n + i).exp());
        Ok(Forecast {
            days,
            sigma,
            trend_per_week: (7.0 * model.slope).exp() - 1.0,
            used_days: used.len(),
            outlier_days: all.len() - used.len(),
        })
    }
}

/// `log peak(d) = level[d % 7] + slope·(d - centre)`.
struct Model {
    level: [f64; 7],
    slope: f64,
    centre: f64,
}

impl Model {
    fn at(&self, day: usize) -> f64 {
        self.level[day % 7] + self.slope * (day as f64 - self.centre)
    }
}

/// Least squares by the normal equations: eight unknowns (slope, seven levels), so a small
/// Gaussian elimination with partial pivoting. The day index is centred for conditioning.
fn solve(days: &[(usize, f64)]) -> Option<Model> {
    let centre = days.iter().map(|(d, _)| *d as f64).sum::<f64>() / days.len() as f64;
    let mut a = [[0.0f64; 9]; 8];
    for &(d, y) in days {
        let mut x = [0.0f64; 8];
        x[0] = d as f64 - centre;
        x[1 + d % 7] = 1.0;
        for i in 0..8 {
            for j in 0..8 {
                a[i][j] += x[i] * x[j];
            }
            a[i][8] += x[i] * y;
        }
    }
    for col in 0..8 {
        let pivot = (col..8).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, pivot);
        let pivot_row = a[col];
        for (row, values) in a.iter_mut().enumerate() {
            if row != col {
                let factor = values[col] / pivot_row[col];
                for (value, p) in values.iter_mut().zip(pivot_row).skip(col) {
                    *value -= factor * p;
                }
            }
        }
    }
    let x: [f64; 8] = std::array::from_fn(|i| a[i][8] / a[i][i]);
    Some(Model {
        slope: x[0],
        level: std::array::from_fn(|i| x[1 + i]),
        centre,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A noiseless weekly pattern with 2% growth a week is recovered exactly.
    #[test]
    fn recovers_a_trend_and_a_week() {
        let week = [1.0, 1.1, 1.2, 1.15, 1.05, 0.6, 0.5];
        let growth = 1.02f64.powf(1.0 / 7.0);
        let peaks: Vec<Option<f64>> = (0..28)
            .map(|d| Some(1000.0 * week[d % 7] * growth.powi(d as i32)))
            .collect();
        let f = Forecast::fit(&peaks).unwrap();
        for (i, p) in f.days.iter().enumerate() {
            let d = 28 + i;
            let want = 1000.0 * week[d % 7] * growth.powi(d as i32);
            assert!((p / want - 1.0).abs() < 1e-9, "day {d}: {p} vs {want}");
        }
        assert!((f.trend_per_week - 0.02).abs() < 1e-9);
        assert!(f.sigma < 1e-9);
    }

    /// One incident day (10x) is set aside and does not move the forecast.
    #[test]
    fn an_incident_day_is_an_outlier() {
        let mut peaks: Vec<Option<f64>> = (0..28)
            .map(|d| Some(100.0 * (1.0 + 0.01 * ((d * 7919) % 13) as f64)))
            .collect();
        peaks[20] = Some(1000.0);
        let f = Forecast::fit(&peaks).unwrap();
        assert_eq!(f.outlier_days, 1);
        assert!(f.peak().1 < 120.0, "{:?}", f);
    }

    #[test]
    fn too_few_days_is_a_reason() {
        let peaks: Vec<Option<f64>> = (0..28).map(|d| (d < 10).then_some(5.0)).collect();
        let err = Forecast::fit(&peaks).unwrap_err();
        assert!(err.contains("10 of the lookback's 28 days"), "{err}");
    }
}
