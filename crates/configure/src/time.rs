//! UTC calendar times for evidence and charts, on spillway-core's calendar.

pub use spillway_core::time::{civil_from_days, days_from_civil, parse_millis, parse_time};

const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];

/// The weekday of a Unix time (1970-01-01 was a Thursday).
pub fn weekday(at: i64) -> &'static str {
    WEEKDAYS[at.div_euclid(86_400).rem_euclid(7) as usize]
}

/// `2025-03-04T14:05Z`: minutes are the configurator's resolution.
pub fn format_minute(at: i64) -> String {
    let (year, month, day) = civil_from_days(at.div_euclid(86_400));
    let secs = at.rem_euclid(86_400);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60
    )
}

/// `2025-03-04`.
pub fn format_date(at: i64) -> String {
    let (year, month, day) = civil_from_days(at.div_euclid(86_400));
    format!("{year:04}-{month:02}-{day:02}")
}

/// A span of milliseconds as the flags write durations: `24h`, `90s`, `1500ms`.
pub fn format_duration_ms(ms: i64) -> String {
    for (unit_ms, unit) in [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1000, "s"),
    ] {
        if ms >= unit_ms && ms % unit_ms == 0 {
            return format!("{}{unit}", ms / unit_ms);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evidence_times_and_durations_read() {
        assert_eq!(format_minute(1_735_689_600 + 3_660), "2025-01-01T01:01Z");
        assert_eq!(format_date(1_735_689_600), "2025-01-01");
        assert_eq!(weekday(1_735_689_600), "Wed");
        assert_eq!(format_duration_ms(86_400_000), "1d");
        assert_eq!(format_duration_ms(90_000), "90s");
        assert_eq!(format_duration_ms(1500), "1500ms");
    }
}
