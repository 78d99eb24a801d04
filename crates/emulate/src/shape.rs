//! The load the fleet offers over time: a constant rate per bucket, optionally multiplied by a
//! step at a moment of the run (`--step 15@10s`: fifteen times the rate from the tenth second).

use std::fmt;
use std::time::Duration;

/// A step of the offered load: from `at` into the run, `factor` times the base rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadStep {
    pub factor: f64,
    pub at: Duration,
}

/// A step written wrong, with what would be right.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "\"{text}\" is not a step: {why}; write FACTOR@SECONDS, like 15@10s (15 times the rate from the tenth second)"
)]
pub struct LoadStepError {
    pub text: String,
    pub why: String,
}

impl LoadStep {
    /// Reads `FACTOR@SECONDS`, the seconds with or without an `s`: `15@10s`, `0.5@30`.
    pub fn parse(text: &str) -> Result<LoadStep, LoadStepError> {
        let bad = |why: &str| LoadStepError {
            text: text.to_owned(),
            why: why.to_owned(),
        };
        let (factor, at) = text.split_once('@').ok_or_else(|| bad("no '@'"))?;
        let factor: f64 = factor
            .trim()
            .parse()
            .map_err(|_| bad("the factor is not a number"))?;
        if !(factor.is_finite() && factor >= 0.0) {
            return Err(bad("the factor must be a finite number of at least 0"));
        }
        let at = at.trim();
        let at: f64 = at
            .strip_suffix('s')
            .unwrap_or(at)
            .parse()
            .map_err(|_| bad("the moment is not a number of seconds"))?;
        if !(at.is_finite() && at >= 0.0) {
            return Err(bad(
                "the moment must be a finite number of seconds of at least 0",
            ));
        }
        Ok(LoadStep {
            factor,
            at: Duration::from_secs_f64(at),
        })
    }
}

impl fmt::Display for LoadStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}s", self.factor, self.at.as_secs_f64())
    }
}

/// How the offered load moves: the multiple of the base rate at each moment of the run.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LoadShape {
    pub step: Option<LoadStep>,
}

impl LoadShape {
    /// The multiple of the base rate `t` seconds into the run.
    pub fn factor(&self, t: f64) -> f64 {
        match self.step {
            Some(step) if t >= step.at.as_secs_f64() => step.factor,
            _ => 1.0,
        }
    }

    /// The integral of the multiple from `t0` to `t1` seconds into the run: the base rate times
    /// this is what one source offered between them.
    pub fn integral(&self, t0: f64, t1: f64) -> f64 {
        if t1 <= t0 {
            return 0.0;
        }
        match self.step {
            None => t1 - t0,
            Some(step) => {
                let at = step.at.as_secs_f64();
                let before = (at.min(t1) - t0).max(0.0);
                let after = (t1 - at.max(t0)).max(0.0);
                before + after * step.factor
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_reads_factor_at_seconds_and_says_how_to_write_one() {
        let step = LoadStep::parse("15@10s").unwrap();
        assert_eq!(step.factor, 15.0);
        assert_eq!(step.at, Duration::from_secs(10));
        assert_eq!(
            LoadStep::parse("0.5@2.5").unwrap().at,
            Duration::from_millis(2500)
        );
        for wrong in ["15", "x@10s", "15@ten", "-1@3s", "inf@3s", "2@-1s"] {
            let err = LoadStep::parse(wrong).unwrap_err().to_string();
            assert!(err.contains("FACTOR@SECONDS"), "{wrong}: {err}");
        }
    }

    #[test]
    fn the_integral_splits_at_the_step() {
        let flat = LoadShape::default();
        assert_eq!(flat.integral(1.0, 3.0), 2.0);
        let shape = LoadShape {
            step: Some(LoadStep::parse("15@10s").unwrap()),
        };
        assert_eq!(shape.factor(9.99), 1.0);
        assert_eq!(shape.factor(10.0), 15.0);
        // One second before the step and half a second after: 1 + 0.5 x 15.
        assert_eq!(shape.integral(9.0, 10.5), 8.5);
        assert_eq!(shape.integral(11.0, 12.0), 15.0);
        assert_eq!(shape.integral(3.0, 2.0), 0.0);
    }
}
