//! Wall-clock time as Unix milliseconds, RFC 3339 text for answers, and UTC day boundaries for
//! the daily modification budget (S3).

use std::time::{SystemTime, UNIX_EPOCH};

const DAY_MILLIS: i64 = 86_400_000;

pub fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Midnight UTC that starts the day holding `millis`.
pub fn day_start(millis: i64) -> i64 {
    millis.div_euclid(DAY_MILLIS) * DAY_MILLIS
}

/// Whole seconds until the next UTC midnight, at least 1: the `retry-after` of a spent budget.
pub fn seconds_to_next_day(millis: i64) -> u64 {
    let left = day_start(millis) + DAY_MILLIS - millis;
    u64::try_from((left + 999) / 1000).unwrap_or(1).max(1)
}

/// `2026-11-29T17:04:11.123Z`.
pub fn format_millis(millis: i64) -> String {
    let days = millis.div_euclid(DAY_MILLIS);
    let rest = millis.rem_euclid(DAY_MILLIS);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3_600_000,
        rest / 60_000 % 60,
        rest / 1000 % 60,
        rest % 1000
    )
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian calendar).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_millis(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(format_millis(1_795_971_851_123), "2026-11-29T17:04:11.123Z");
    }

    #[test]
    fn retry_after_reaches_midnight() {
        let noon = day_start(1_795_971_851_123) + DAY_MILLIS / 2;
        assert_eq!(seconds_to_next_day(noon), 43_200);
        assert_eq!(seconds_to_next_day(day_start(noon) + DAY_MILLIS - 1), 1);
    }
}
