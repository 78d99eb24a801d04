//! Limits: `N/s`, `N/min`, `N/h`, `N/d` and `N per 30s`, parsed into a count over a period.
//!
//! A limit is a whole number of requests (or cost units) over a period, so `100 per 60s` keeps
//! its exact meaning for a sliding window of 60 s while the control plane reads it as a rate:
//! `100 per 60s` is 1.67 requests a second, `5000/s` is 5000. Durations (`250ms`, `30s`, `2m`, `1h`,
//! `1d`) share one syntax with the rest of the configuration and are parsed here too.

use std::borrow::Cow;
use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;
use std::time::Duration;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

use crate::algo::{ParamError, Rate};

/// A count over a period; both at least one (one request, one millisecond).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    pub count: NonZeroU64,
    pub period: Duration,
}

/// What the syntax says a limit looks like, for error messages.
const LIMIT_SYNTAX: &str =
    "write a count over a period, like 5000/s, 300/min, 1000/h, 10000/d or \"100 per 30s\"";

/// What the syntax says a duration looks like, for error messages.
const DURATION_SYNTAX: &str = "write a whole number and a unit, like 250ms, 1s, 2m, 1h or 1d";

/// Why a limit was rejected; the message says what would be right.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("limit \"{text}\": {problem}")]
pub struct LimitError {
    pub text: String,
    pub problem: LimitProblem,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitProblem {
    #[error("{LIMIT_SYNTAX}")]
    Syntax,
    #[error("the count must be at least 1")]
    Zero,
    #[error("the count must be at least 1, not negative")]
    Negative,
    #[error(
        "the count must be a whole number; for a fraction, stretch the period (0.5/s is \"1 per 2s\")"
    )]
    Fraction,
    #[error("the count {0:?} is not a number; {LIMIT_SYNTAX}")]
    NotANumber(String),
    #[error("the count is too large (at most {max})", max = u64::MAX)]
    TooLarge,
    #[error("unknown unit \"{0}\" after `/`; use s, min, h or d (or \"N per 30s\" for any period)")]
    UnknownUnit(String),
    #[error("{0}")]
    Period(DurationProblem),
    /// Parsed, but no algorithm can run it (for example more than one request per nanosecond).
    #[error("{0}")]
    Rate(ParamError),
}

impl Limit {
    pub fn new(count: NonZeroU64, period: Duration) -> Self {
        Limit { count, period }
    }

    /// The rate the control plane compares offered load with: `100 per 60s` is 1.666... per second.
    pub fn per_second(&self) -> f64 {
        self.count.get() as f64 / self.period.as_secs_f64()
    }

    pub fn parse(text: &str) -> Result<Self, LimitError> {
        let fail = |problem| LimitError {
            text: text.to_owned(),
            problem,
        };
        let trimmed = text.trim();
        let (count, period) = if let Some((count, unit)) = trimmed.split_once('/') {
            let period = match unit.trim() {
                "s" => Duration::from_secs(1),
                "min" => Duration::from_secs(60),
                "h" => Duration::from_secs(3600),
                "d" => Duration::from_secs(86_400),
                "" => return Err(fail(LimitProblem::Syntax)),
                other => return Err(fail(LimitProblem::UnknownUnit(other.to_owned()))),
            };
            (count, period)
        } else if let Some((count, period)) = trimmed.split_once(" per ") {
            let period =
                parse_duration(period).map_err(|e| fail(LimitProblem::Period(e.problem)))?;
            (count, period)
        } else {
            return Err(fail(LimitProblem::Syntax));
        };
        let count = parse_count(count.trim()).map_err(fail)?;
        let limit = Limit { count, period };
        limit.rate().map_err(|e| fail(LimitProblem::Rate(e)))?;
        Ok(limit)
    }

    /// The algorithms' view of this limit. Never fails for a limit that [`Limit::parse`]
    /// accepted; a limit built by hand with [`Limit::new`] may be out of the algorithms' range.
    pub fn rate(&self) -> Result<Rate, ParamError> {
        Rate::new(self.count.get(), self.period)
    }
}

/// A whole number of at least one, with a precise reason when it is not.
fn parse_count(text: &str) -> Result<NonZeroU64, LimitProblem> {
    if text.is_empty() {
        return Err(LimitProblem::Syntax);
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return match text.parse::<u64>() {
            Ok(n) => NonZeroU64::new(n).ok_or(LimitProblem::Zero),
            Err(_) => Err(LimitProblem::TooLarge),
        };
    }
    match text.parse::<f64>() {
        Ok(n) if n.is_finite() && n < 0.0 => Err(LimitProblem::Negative),
        Ok(0.0) => Err(LimitProblem::Zero),
        Ok(n) if n.is_finite() => Err(LimitProblem::Fraction),
        _ => Err(LimitProblem::NotANumber(text.to_owned())),
    }
}

impl FromStr for Limit {
    type Err = LimitError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Limit::parse(text)
    }
}

/// The shortest form that parses back to the same limit: `5000/s`, `300/min`, `100 per 30s`.
impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.period.as_millis() {
            1_000 => Some("s"),
            60_000 => Some("min"),
            3_600_000 => Some("h"),
            86_400_000 => Some("d"),
            _ => None,
        };
        match unit {
            Some(unit) => write!(f, "{}/{unit}", self.count),
            None => write!(f, "{} per {}", self.count, format_duration(self.period)),
        }
    }
}

impl Serialize for Limit {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Limit {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LimitVisitor;

        // The error is raised inside the visitor on purpose: YAML deserializers attach the
        // position of the value being visited, so the message points at the limit itself.
        impl de::Visitor<'_> for LimitVisitor {
            type Value = Limit;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a limit like 5000/s or \"100 per 30s\"")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Limit, E> {
                Limit::parse(text).map_err(E::custom)
            }

            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Limit, E> {
                Err(E::custom(format_args!(
                    "limit {n} has no period; write {n}/s, {n}/min, {n}/h, {n}/d or \"{n} per 30s\""
                )))
            }

            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Limit, E> {
                Err(E::custom(format_args!(
                    "limit {n}: the count must be at least 1, and a limit needs a period, like 100/s"
                )))
            }

            fn visit_f64<E: de::Error>(self, n: f64) -> Result<Limit, E> {
                Err(E::custom(format_args!(
                    "limit {n}: the count must be a whole number over a period, like 100/s or \"1 per 2s\""
                )))
            }
        }

        deserializer.deserialize_any(LimitVisitor)
    }
}

/// Documents exactly the accepted syntax, so editors reject `0/s` and `100/m` before the loader.
impl JsonSchema for Limit {
    fn schema_name() -> Cow<'static, str> {
        "Limit".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "description": "A count (at least 1) over a period: N/s, N/min, N/h, N/d, or \"N per <duration>\" with a duration like 500ms, 30s, 2m, 1h or 1d.",
            "pattern": LIMIT_PATTERN,
            "examples": ["5000/s", "300/min", "100 per 60s"]
        })
    }
}

/// The regular expression of [`Limit`]'s JSON Schema.
pub const LIMIT_PATTERN: &str =
    r"^\s*0*[1-9][0-9]*\s*(/\s*(s|min|h|d)|\s+per\s+0*[1-9][0-9]*\s*(ms|s|m|min|h|d))\s*$";

/// The regular expression of a duration's JSON Schema.
pub const DURATION_PATTERN: &str = r"^\s*0*[1-9][0-9]*\s*(ms|s|m|min|h|d)\s*$";

/// Why a duration was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("duration \"{text}\": {problem}")]
pub struct DurationError {
    pub text: String,
    pub problem: DurationProblem,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationProblem {
    #[error("{DURATION_SYNTAX}")]
    Syntax,
    #[error("\"{0}\" has no unit; {DURATION_SYNTAX}")]
    NoUnit(String),
    #[error("unknown unit \"{0}\"; use ms, s, m (minutes), h or d")]
    UnknownUnit(String),
    #[error("the period must be at least 1ms")]
    Zero,
    #[error("a duration is a whole number of its unit; write 1500ms rather than 1.5s")]
    Fraction,
    #[error("a duration cannot be negative")]
    Negative,
    #[error("the duration is too long")]
    TooLarge,
}

/// Parses `250ms`, `1s`, `2m` (or `2min`), `1h` and `1d`; zero is rejected, since every duration
/// in the configuration is a period or an interval.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let fail = |problem| DurationError {
        text: text.to_owned(),
        problem,
    };
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits_end);
    let unit = unit.trim();
    if number.is_empty() {
        return Err(fail(match trimmed.chars().next() {
            Some('-') => DurationProblem::Negative,
            _ => DurationProblem::Syntax,
        }));
    }
    if unit.starts_with(['.', ',']) {
        return Err(fail(DurationProblem::Fraction));
    }
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "" => return Err(fail(DurationProblem::NoUnit(trimmed.to_owned()))),
        other => return Err(fail(DurationProblem::UnknownUnit(other.to_owned()))),
    };
    let number: u64 = number
        .parse()
        .map_err(|_| fail(DurationProblem::TooLarge))?;
    let millis = number
        .checked_mul(millis_per_unit)
        .ok_or_else(|| fail(DurationProblem::TooLarge))?;
    if millis == 0 {
        return Err(fail(DurationProblem::Zero));
    }
    Ok(Duration::from_millis(millis))
}

/// The largest whole unit: 90 s is `90s`, 120 s is `2m`, 1.5 s is `1500ms`.
pub fn format_duration(duration: Duration) -> String {
    let millis = duration.as_millis();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if millis >= size && millis.is_multiple_of(size) {
            return format!("{}{unit}", millis / size);
        }
    }
    format!("{millis}ms")
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_accepted_limit_converts_into_a_rate() {
        let limit: Limit = "5000/s".parse().unwrap();
        let rate = limit.rate().unwrap();
        assert_eq!(
            (rate.count(), rate.period()),
            (5000, Duration::from_secs(1))
        );
        let limit: Limit = "100 per 30s".parse().unwrap();
        assert_eq!(limit.rate().unwrap().period(), Duration::from_secs(30));
    }

    #[test]
    fn a_limit_beyond_one_request_per_nanosecond_is_refused() {
        let err = "2000000000/s".parse::<Limit>().unwrap_err();
        assert!(
            err.to_string()
                .contains("more than one request per nanosecond"),
            "{err}"
        );
    }

    use super::*;

    fn limit(text: &str) -> Limit {
        Limit::parse(text).unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
    }

    fn problem(text: &str) -> LimitProblem {
        Limit::parse(text).expect_err(text).problem
    }

    #[test]
    fn slash_units_give_their_periods() {
        assert_eq!(limit("5000/s").period, Duration::from_secs(1));
        assert_eq!(limit("300/min").period, Duration::from_secs(60));
        assert_eq!(limit("1000/h").period, Duration::from_secs(3600));
        assert_eq!(limit("10000/d").period, Duration::from_secs(86_400));
        assert_eq!(limit("5000/s").count.get(), 5000);
        assert_eq!(limit(" 7 / s ").count.get(), 7);
    }

    #[test]
    fn per_takes_any_duration() {
        let l = limit("100 per 30s");
        assert_eq!((l.count.get(), l.period), (100, Duration::from_secs(30)));
        assert_eq!(limit("3 per 500ms").period, Duration::from_millis(500));
        assert_eq!(limit("10 per 2m").period, Duration::from_secs(120));
        assert_eq!(limit("10 per 2min").period, Duration::from_secs(120));
        assert_eq!(limit("1 per 1d").period, Duration::from_secs(86_400));
    }

    #[test]
    fn per_second_is_count_over_period() {
        assert_eq!(limit("5000/s").per_second(), 5000.0);
        assert_eq!(limit("300/min").per_second(), 5.0);
        assert_eq!(limit("3 per 500ms").per_second(), 6.0);
        assert!((limit("100 per 60s").per_second() - 1.666_666).abs() < 1e-5);
    }

    #[test]
    fn zero_negative_fractional_and_huge_counts_are_rejected() {
        assert_eq!(problem("0/s"), LimitProblem::Zero);
        assert_eq!(problem("0 per 10s"), LimitProblem::Zero);
        assert_eq!(problem("-5/s"), LimitProblem::Negative);
        assert_eq!(problem("0.5/s"), LimitProblem::Fraction);
        assert_eq!(problem("99999999999999999999/s"), LimitProblem::TooLarge);
        assert_eq!(problem("lots/s"), LimitProblem::NotANumber("lots".into()));
        assert_eq!(
            Limit::parse("0/s").unwrap_err().to_string(),
            "limit \"0/s\": the count must be at least 1"
        );
    }

    #[test]
    fn unparsable_limits_say_what_would_be_right() {
        assert_eq!(problem("5000"), LimitProblem::Syntax);
        assert_eq!(problem("/s"), LimitProblem::Syntax);
        assert_eq!(problem("5/"), LimitProblem::Syntax);
        assert_eq!(problem("5/m"), LimitProblem::UnknownUnit("m".into()));
        assert_eq!(
            problem("5 per 0s"),
            LimitProblem::Period(DurationProblem::Zero)
        );
        assert_eq!(
            problem("5 per 10"),
            LimitProblem::Period(DurationProblem::NoUnit("10".into()))
        );
        let message = Limit::parse("5000").unwrap_err().to_string();
        assert!(message.contains("5000/s"), "{message}");
    }

    #[test]
    fn display_round_trips() {
        for text in [
            "5000/s",
            "300/min",
            "2/h",
            "9/d",
            "100 per 30s",
            "3 per 500ms",
            "1 per 2m",
        ] {
            assert_eq!(limit(text).to_string(), text);
            assert_eq!(limit(&limit(text).to_string()), limit(text));
        }
        assert_eq!(limit("10 per 60s").to_string(), "10/min");
    }

    #[test]
    fn durations_parse_every_unit_and_reject_nonsense() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("1d").unwrap(), Duration::from_secs(86_400));
        let problem = |t: &str| parse_duration(t).unwrap_err().problem;
        assert_eq!(problem("0s"), DurationProblem::Zero);
        assert_eq!(problem("1.5s"), DurationProblem::Fraction);
        assert_eq!(problem("-1s"), DurationProblem::Negative);
        assert_eq!(problem("5"), DurationProblem::NoUnit("5".into()));
        assert_eq!(
            problem("5 fortnights"),
            DurationProblem::UnknownUnit("fortnights".into())
        );
        assert_eq!(problem("s"), DurationProblem::Syntax);
        assert_eq!(problem("99999999999999999999d"), DurationProblem::TooLarge);
        assert_eq!(problem("999999999999999999d"), DurationProblem::TooLarge);
    }

    #[test]
    fn durations_format_in_their_largest_whole_unit() {
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_secs(120)), "2m");
        assert_eq!(format_duration(Duration::from_secs(7200)), "2h");
    }
}
