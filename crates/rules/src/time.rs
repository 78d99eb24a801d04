//! Wall-clock time as Unix milliseconds, RFC 3339 text for answers, and UTC day boundaries for
//! the daily modification budget.

use std::time::{SystemTime, UNIX_EPOCH};

pub use spillway_core::time::format_millis;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reaches_midnight() {
        let noon = day_start(1_795_971_851_123) + DAY_MILLIS / 2;
        assert_eq!(seconds_to_next_day(noon), 43_200);
        assert_eq!(seconds_to_next_day(day_start(noon) + DAY_MILLIS - 1), 1);
    }
}
