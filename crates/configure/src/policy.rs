//! The policies behind one trait: `historical`, `forecast` and `fixed`. A policy reads a
//! series' history and says what the limit should rest on; the headroom, the clamps and the
//! rounding are the same for every policy and live here once ([`finish`]).

use serde::Serialize;

use crate::history::History;
pub use crate::settings::PolicyKind;
use crate::settings::{CapacityFile, DEFAULT_HEADROOM, Headroom, Params, QuotaFile};
use crate::stats::round_up_3;
use crate::time;

/// The lowest limit ever proposed: one request a minute. A policy that finds no traffic keeps
/// the current limit instead of proposing zero.
pub const MIN_LIMIT_RPS: f64 = 1.0 / 60.0;

/// `--headroom auto` stays within these bounds.
pub const AUTO_HEADROOM_MIN: f64 = 0.1;
pub const AUTO_HEADROOM_MAX: f64 = 1.0;

/// Which bound moved a proposal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Clamp {
    /// Cut to (1 + C) times the current limit.
    MaxChangeUp,
    /// Raised to the current limit over (1 + C).
    MaxChangeDown,
    Floor,
    Ceiling,
    /// Raised to one request a minute.
    Minimum,
}

impl Clamp {
    pub fn name(self) -> &'static str {
        match self {
            Clamp::MaxChangeUp => "max-change-up",
            Clamp::MaxChangeDown => "max-change-down",
            Clamp::Floor => "floor",
            Clamp::Ceiling => "ceiling",
            Clamp::Minimum => "minimum",
        }
    }
}

/// What a proposal rests on; every field is optional and left out of JSON when not known.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Evidence {
    /// Minutes with a value, and their share of the lookback.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub points: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coverage: Option<f64>,
    /// The highest minute and when it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_rps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantile: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantile_rps: Option<f64>,
    /// Next week's highest predicted daily peak, its day, its band and the weekly trend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forecast_peak_rps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forecast_peak_day: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forecast_band_rps: Option<[f64; 2]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forecast_trend_per_week: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forecast_outlier_days: Option<usize>,
    /// Why there is no forecast.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forecast_note: Option<String>,
    /// The rate the policy rested on, before headroom.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_rps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headroom: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headroom_basis: Option<String>,
    /// Base times (1 + headroom), rounded up, before the clamps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unclamped_rps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clamp: Option<Clamp>,
    /// The planned capacity (`--capacity-file`) that raised or lowered the forecast peak: its
    /// multiplier, the day and the file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_multiplier: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_day: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota_rps: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quota_file: Option<String>,
    /// Why the limit is kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl PolicyKind {
    /// The policy that proposes for this kind.
    pub fn policy(self) -> &'static dyn Policy {
        match self {
            PolicyKind::Historical => &Historical,
            PolicyKind::Forecast => &ForecastPolicy,
            PolicyKind::Fixed => &FixedPolicy,
        }
    }
}

/// What a policy is given for one bucket.
pub struct Input<'a> {
    pub service: &'a str,
    pub bucket: &'a str,
    /// `None` for a bucket that no series of the source is about.
    pub history: Option<&'a History>,
    pub current: Option<f64>,
    pub params: &'a Params,
    pub quotas: Option<&'a QuotaFile>,
    /// `forecast`'s planned capacity.
    pub capacity: Option<&'a CapacityFile>,
    /// Below this share of the lookback's minutes a history is too gappy to rest a limit on.
    pub min_coverage: f64,
}

/// What a policy found.
#[derive(Debug, Clone, PartialEq)]
pub enum Suggestion {
    /// A rate (requests/s) to put the headroom on and clamp.
    Base { rps: f64, headroom: f64 },
    /// A limit to take as it is: a contract is not clamped.
    Exact { rps: f64 },
    /// Nothing to rest a limit on: the current limit stays, and this is why.
    Keep { reason: String },
}

/// A strategy of limits: new ones implement this and get a [`PolicyKind`].
pub trait Policy: Sync {
    fn kind(&self) -> PolicyKind;

    /// Reads the input, notes what it used in `evidence`, and suggests.
    fn suggest(&self, input: &Input<'_>, evidence: &mut Evidence) -> Suggestion;
}

/// The history, if it is there and whole enough to rest a limit on.
fn usable<'a>(input: &Input<'a>) -> Result<&'a History, Suggestion> {
    let Some(history) = input.history else {
        return Err(Suggestion::Keep {
            reason: "no history: the source has no series for this bucket over the lookback"
                .to_owned(),
        });
    };
    if history.coverage < input.min_coverage {
        return Err(Suggestion::Keep {
            reason: format!(
                "the history covers {:.0}% of the lookback's minutes (gaps); at least {:.0}% are \
                 needed",
                history.coverage * 100.0,
                input.min_coverage * 100.0
            ),
        });
    }
    Ok(history)
}

fn no_traffic() -> Suggestion {
    Suggestion::Keep {
        reason: "no traffic in the lookback: a limit of zero would refuse everything".to_owned(),
    }
}

/// `historical`: the Q-quantile of the lookback's per-minute rates.
pub struct Historical;

impl Policy for Historical {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Historical
    }

    fn suggest(&self, input: &Input<'_>, evidence: &mut Evidence) -> Suggestion {
        let history = match usable(input) {
            Ok(history) => history,
            Err(keep) => return keep,
        };
        let Some(q) = history.quantile.filter(|q| *q > 0.0) else {
            return no_traffic();
        };
        let headroom = match input.params.headroom {
            Headroom::Fixed(h) => h,
            Headroom::Auto => match history.daily_peak_cv() {
                Some(cv) => {
                    let h = (2.0 * cv).clamp(AUTO_HEADROOM_MIN, AUTO_HEADROOM_MAX);
                    evidence.headroom_basis = Some(format!(
                        "auto: twice the daily peaks' coefficient of variation ({cv:.3}), within \
                         [{AUTO_HEADROOM_MIN}, {AUTO_HEADROOM_MAX}]"
                    ));
                    h
                }
                None => {
                    evidence.headroom_basis = Some(format!(
                        "auto: fewer than two days with a peak, so the default {DEFAULT_HEADROOM}"
                    ));
                    DEFAULT_HEADROOM
                }
            },
        };
        Suggestion::Base { rps: q, headroom }
    }
}

/// `forecast`: next week's highest predicted daily peak ([`crate::forecast`]).
pub struct ForecastPolicy;

impl Policy for ForecastPolicy {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Forecast
    }

    fn suggest(&self, input: &Input<'_>, evidence: &mut Evidence) -> Suggestion {
        let history = match usable(input) {
            Ok(history) => history,
            Err(keep) => return keep,
        };
        let forecast = match &history.forecast {
            Ok(forecast) => forecast,
            Err(reason) => {
                return Suggestion::Keep {
                    reason: reason.clone(),
                };
            }
        };
        let (_, mut peak) = forecast.peak();
        if peak <= 0.0 || !peak.is_finite() {
            return no_traffic();
        }
        if let Some(capacity) = input.capacity {
            // Each day of next week times its planned multiplier; the highest of them.
            let (day, planned, multiplier) = forecast
                .days
                .iter()
                .enumerate()
                .map(|(i, &p)| {
                    let at = history.window.day_start(history.window.days() + i);
                    let m = capacity.multiplier(input.service, at);
                    (at, p * m, m)
                })
                .fold(
                    (0, f64::MIN, 1.0),
                    |best, d| if d.1 > best.1 { d } else { best },
                );
            if multiplier != 1.0 && planned.is_finite() && planned > 0.0 {
                peak = planned;
                evidence.capacity_multiplier = Some(multiplier);
                evidence.capacity_day =
                    Some(format!("{} {}", time::weekday(day), time::format_date(day)));
                evidence.capacity_file = Some(capacity.file.clone());
            }
        }
        let headroom = match input.params.headroom {
            Headroom::Fixed(h) => h,
            Headroom::Auto => {
                // Two residual standard deviations above the prediction, as a share.
                let h = ((2.0 * forecast.sigma).exp() - 1.0).clamp(0.05, AUTO_HEADROOM_MAX);
                evidence.headroom_basis = Some(format!(
                    "auto: the forecast's band, e^(2σ) - 1 for residuals of σ = {:.3}, within \
                     [0.05, {AUTO_HEADROOM_MAX}]",
                    forecast.sigma
                ));
                h
            }
        };
        Suggestion::Base {
            rps: peak,
            headroom,
        }
    }
}

/// `fixed`: the bucket's quota from the quota file, as it is.
pub struct FixedPolicy;

impl Policy for FixedPolicy {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Fixed
    }

    fn suggest(&self, input: &Input<'_>, evidence: &mut Evidence) -> Suggestion {
        let Some(quotas) = input.quotas else {
            return Suggestion::Keep {
                reason: "the fixed policy needs --quota-file".to_owned(),
            };
        };
        match quotas.get(input.service, input.bucket) {
            Some(quota) => {
                evidence.quota_rps = Some(quota.limit_rps);
                evidence.quota_file = Some(quotas.file.clone());
                Suggestion::Exact {
                    rps: quota.limit_rps,
                }
            }
            None => Suggestion::Keep {
                reason: format!(
                    "no quota for {}/{} in {}",
                    input.service, input.bucket, quotas.file
                ),
            },
        }
    }
}

/// Headroom, rounding and clamps: the base times (1 + H), rounded up to three significant
/// digits, then within [current / (1 + C), current × (1 + C)] (no such bound for a new bucket),
/// then at least the floor (default current / (1 + C)) and at most the ceiling, and never below
/// [`MIN_LIMIT_RPS`]. A quota ([`Suggestion::Exact`]) is neither rounded nor clamped, only
/// kept at least [`MIN_LIMIT_RPS`]. Returns the proposed limit, `None` for a keep without a
/// current limit.
pub fn finish(
    suggestion: &Suggestion,
    current: Option<f64>,
    params: &Params,
    evidence: &mut Evidence,
) -> Option<f64> {
    // A contract is taken as it is, unrounded: "100 per 30s" is 3.333... requests/s, and
    // rounding it to 3.34 would propose an update of a bucket that already has the quota.
    let (mut value, clamped) = match *suggestion {
        Suggestion::Keep { ref reason } => {
            evidence.reason = Some(reason.clone());
            return current;
        }
        Suggestion::Exact { rps } => (rps, false),
        Suggestion::Base { rps, headroom } => {
            evidence.base_rps = Some(rps);
            evidence.headroom = Some(headroom);
            (round_up_3(rps * (1.0 + headroom)), true)
        }
    };
    if clamped {
        evidence.unclamped_rps = Some(value);
        let c = params.max_change;
        if let Some(current) = current {
            if value > current * (1.0 + c) {
                value = current * (1.0 + c);
                evidence.clamp = Some(Clamp::MaxChangeUp);
            } else if value < current / (1.0 + c) {
                value = current / (1.0 + c);
                evidence.clamp = Some(Clamp::MaxChangeDown);
            }
        }
        if let Some(floor) = params.floor.or(current.map(|cur| cur / (1.0 + c)))
            && value < floor
        {
            value = floor;
            evidence.clamp = Some(Clamp::Floor);
        }
        if let Some(ceiling) = params.ceiling
            && value > ceiling
        {
            value = ceiling;
            evidence.clamp = Some(Clamp::Ceiling);
        }
    }
    if value < MIN_LIMIT_RPS {
        value = MIN_LIMIT_RPS;
        evidence.clamp = Some(Clamp::Minimum);
    }
    Some(value)
}

/// The evidence every policy shares: what the history says, whatever the policy.
pub fn describe_history(history: &History, evidence: &mut Evidence) {
    evidence.points = Some(history.points);
    evidence.coverage = Some(history.coverage);
    if let Some(peak) = history.peak {
        evidence.peak_rps = Some(peak.rps);
        evidence.peak_at = Some(time::format_minute(peak.at));
    }
    evidence.quantile = Some(history.q);
    evidence.quantile_rps = history.quantile;
    match &history.forecast {
        Ok(forecast) => {
            let (day, peak) = forecast.peak();
            let at = history.window.day_start(history.window.days() + day);
            evidence.forecast_peak_rps = Some(peak);
            evidence.forecast_peak_day =
                Some(format!("{} {}", time::weekday(at), time::format_date(at)));
            let (low, high) = forecast.band(peak);
            evidence.forecast_band_rps = Some([low, high]);
            evidence.forecast_trend_per_week = Some(forecast.trend_per_week);
            evidence.forecast_outlier_days = Some(forecast.outlier_days);
        }
        Err(reason) => evidence.forecast_note = Some(reason.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn params(max_change: f64, floor: Option<f64>, ceiling: Option<f64>) -> Params {
        Params {
            max_change,
            floor,
            ceiling,
            ..Params::default()
        }
    }

    /// The documented worked numbers: a quantile of 800 with 25% headroom is 1000; against a
    /// current 400 and C = 1 it is clamped to 800; against 3000 it is raised to 1500.
    #[test]
    fn worked_clamps() {
        let s = Suggestion::Base {
            rps: 800.0,
            headroom: 0.25,
        };
        let p = params(1.0, None, None);
        let mut e = Evidence::default();
        assert_eq!(finish(&s, None, &p, &mut e), Some(1000.0));
        assert_eq!(e.clamp, None);
        let mut e = Evidence::default();
        assert_eq!(finish(&s, Some(400.0), &p, &mut e), Some(800.0));
        assert_eq!(e.clamp, Some(Clamp::MaxChangeUp));
        let mut e = Evidence::default();
        assert_eq!(finish(&s, Some(3000.0), &p, &mut e), Some(1500.0));
        assert_eq!(e.clamp, Some(Clamp::MaxChangeDown));
        let mut e = Evidence::default();
        assert_eq!(
            finish(&s, None, &params(1.0, Some(2000.0), None), &mut e),
            Some(2000.0)
        );
        assert_eq!(e.clamp, Some(Clamp::Floor));
        let mut e = Evidence::default();
        assert_eq!(
            finish(&s, None, &params(1.0, None, Some(900.0)), &mut e),
            Some(900.0)
        );
        assert_eq!(e.clamp, Some(Clamp::Ceiling));
        let keep = Suggestion::Keep {
            reason: "why".into(),
        };
        let mut e = Evidence::default();
        assert_eq!(finish(&keep, None, &p, &mut e), None);
        assert_eq!(finish(&keep, Some(5.0), &p, &mut e), Some(5.0));
    }

    proptest! {
        /// Whatever the evidence, a proposal is above zero, within the max-change band of the
        /// current limit unless a floor or ceiling overrides it, and within [floor, ceiling].
        #[test]
        fn proposals_stay_in_bounds(
            base in 0.0f64..1e7,
            headroom in 0.0f64..3.0,
            current in proptest::option::of(0.01f64..1e7),
            c in 0.0f64..5.0,
            floor in proptest::option::of(0.01f64..1e5),
            span in proptest::option::of(0.0f64..1e6),
        ) {
            let ceiling = floor.zip(span).map(|(f, s)| f + s);
            let p = params(c, floor, ceiling);
            let mut e = Evidence::default();
            let got = finish(&Suggestion::Base { rps: base, headroom }, current, &p, &mut e).unwrap();
            prop_assert!(got > 0.0 && got.is_finite());
            prop_assert!(got >= MIN_LIMIT_RPS);
            if let Some(ceiling) = ceiling { prop_assert!(got <= ceiling.max(MIN_LIMIT_RPS) * (1.0 + 1e-12)); }
            if let (Some(floor), None) = (floor, ceiling) { prop_assert!(got >= floor * (1.0 - 1e-12)); }
            if let (Some(cur), None, None) = (current, floor, ceiling) {
                prop_assert!(got <= cur * (1.0 + c) * (1.0 + 1e-12) || got == MIN_LIMIT_RPS);
                prop_assert!(got >= cur / (1.0 + c) * (1.0 - 1e-12));
            }
            if current.is_none() && floor.is_none() && ceiling.is_none() {
                // A new bucket gets the evidence plus headroom, rounded up by less than 1%.
                let want = (base * (1.0 + headroom)).max(MIN_LIMIT_RPS);
                prop_assert!(got >= want * (1.0 - 1e-12) && got <= want * 1.01 + 1e-12);
            }
        }
    }
}
