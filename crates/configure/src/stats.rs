//! Small statistics the policies share: quantiles, spreads, rounding.

/// The `q`-quantile of `values` by linear interpolation between the closest ranks (Hyndman and
/// Fan's type 7, numpy's and R's default): with 40,320 minutes and q = 0.999 the rank is
/// 40,279.68 (counting from 1), so the result lies between the 42nd and the 41st highest minute
/// and the 40 highest are passed over. Reorders `values`; `None` when empty. `q` is clamped to
/// [0, 1].
pub fn quantile(values: &mut [f64], q: f64) -> Option<f64> {
    let n = values.len();
    if n == 0 {
        return None;
    }
    let h = (n - 1) as f64 * q.clamp(0.0, 1.0);
    let lo = (h.floor() as usize).min(n - 1);
    let (_, at, above) = values.select_nth_unstable_by(lo, f64::total_cmp);
    let low = *at;
    let frac = h - lo as f64;
    if frac == 0.0 || above.is_empty() {
        return Some(low);
    }
    let high = above.iter().copied().fold(f64::INFINITY, f64::min);
    Some(low + frac * (high - low))
}

/// The median of `values` (reordered); `None` when empty.
pub fn median(values: &mut [f64]) -> Option<f64> {
    quantile(values, 0.5)
}

/// Mean and sample standard deviation; `None` for fewer than two values.
pub fn mean_sd(values: &[f64]) -> Option<(f64, f64)> {
    let n = values.len();
    if n < 2 {
        return None;
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    Some((mean, var.sqrt()))
}

/// `value` rounded up to three significant digits, so a proposal reads like a limit someone would
/// write (1234.5 becomes 1240, 0.01234 becomes 0.0124) and is never below what was computed.
pub fn round_up_3(value: f64) -> f64 {
    if !value.is_finite() || value <= 0.0 {
        return value;
    }
    let scale = 10f64.powi(2 - value.log10().floor() as i32);
    let scaled = value * scale;
    // Values already at three digits stay, despite the float error of the scaling.
    let rounded = if (scaled - scaled.round()).abs() < 1e-9 * scaled {
        scaled.round()
    } else {
        scaled.ceil()
    };
    rounded / scale
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn worked_examples() {
        let mut v = vec![1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&mut v, 0.5), Some(2.5));
        assert_eq!(quantile(&mut v, 1.0), Some(4.0));
        assert_eq!(quantile(&mut v, 0.0), Some(1.0));
        assert_eq!(quantile(&mut [], 0.5), None);
        assert_eq!(round_up_3(1234.5), 1240.0);
        assert_eq!(round_up_3(1230.0), 1230.0);
        assert_eq!(round_up_3(0.012_341), 0.0124);
        assert_eq!(round_up_3(7.0), 7.0);
    }

    proptest! {
        /// The interpolated quantile lies between the sorted neighbours of its rank.
        #[test]
        fn quantile_matches_sorting(mut v in proptest::collection::vec(0.0f64..1e6, 1..200), q in 0.0f64..=1.0) {
            let mut sorted = v.clone();
            sorted.sort_by(f64::total_cmp);
            let got = quantile(&mut v, q).unwrap();
            let h = (sorted.len() - 1) as f64 * q;
            let lo = sorted[h.floor() as usize];
            let hi = sorted[(h.ceil() as usize).min(sorted.len() - 1)];
            prop_assert!(got >= lo - 1e-9 && got <= hi + 1e-9);
        }

        /// Rounding up never lowers a value and changes it by less than 1%.
        #[test]
        fn round_up_is_close_and_above(x in 1e-6f64..1e9) {
            let r = round_up_3(x);
            prop_assert!(r >= x * (1.0 - 1e-12));
            prop_assert!(r <= x * 1.01 + 1e-12);
        }
    }
}
