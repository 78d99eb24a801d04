//! UTC calendar times without a date library: the days-from-civil algorithms of Howard
//! Hinnant's "chrono-Compatible Low-Level Date Algorithms", RFC 3339 text as the rules service
//! writes it (`2026-11-29T17:04:11.123Z`), and the times flags and files accept.

const DAY_MILLIS: i64 = 86_400_000;

/// Days since 1970-01-01 of a proleptic Gregorian date.
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let month = i64::from(month);
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The (year, month, day) of a count of days since 1970-01-01.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
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

/// Reads `--until`: Unix seconds, or a UTC time `YYYY-MM-DDTHH:MM[:SS]Z` (or a bare date).
pub fn parse_time(text: &str) -> Result<i64, String> {
    let text = text.trim();
    let wrong = || {
        format!(
            "time \"{text}\": write Unix seconds (1735689600) or a UTC time like \
             2025-01-01T00:00:00Z or 2025-01-01"
        )
    };
    if let Ok(secs) = text.parse::<i64>() {
        return Ok(secs);
    }
    let (date, clock) = match text.split_once('T') {
        Some((date, clock)) => (date, Some(clock.strip_suffix('Z').ok_or_else(wrong)?)),
        None => (text, None),
    };
    let mut parts = date.splitn(3, '-');
    let mut field = |max: u32| -> Result<u32, String> {
        let value: u32 = parts
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(wrong)?;
        if value > max { Err(wrong()) } else { Ok(value) }
    };
    let year = field(9999)?;
    let month = field(12)?;
    let day = field(31)?;
    if month == 0 || day == 0 {
        return Err(wrong());
    }
    let mut secs = days_from_civil(i64::from(year), month, day) * 86_400;
    if let Some(clock) = clock {
        let fields: Vec<&str> = clock.split(':').collect();
        if !(2..=3).contains(&fields.len()) {
            return Err(wrong());
        }
        let limits = [23, 59, 59];
        let scale = [3600, 60, 1];
        for (i, part) in fields.iter().enumerate() {
            let value: i64 = part.parse().map_err(|_| wrong())?;
            if !(0..=limits[i]).contains(&value) {
                return Err(wrong());
            }
            secs += value * scale[i];
        }
    }
    Ok(secs)
}

/// Reads a time as the rules service writes it, `2026-01-01T12:00:00.250Z` (the fraction
/// optional), into Unix milliseconds.
pub fn parse_millis(text: &str) -> Result<i64, String> {
    let text = text.trim();
    let (whole, millis) = match text.strip_suffix('Z').and_then(|t| t.split_once('.')) {
        Some((whole, fraction)) => {
            let digits = format!("{fraction:0<3}");
            let millis: i64 = digits
                .get(..3)
                .and_then(|d| d.parse().ok())
                .ok_or_else(|| {
                    format!("time \"{text}\": the fraction of a second is not digits")
                })?;
            (format!("{whole}Z"), millis)
        }
        None => (text.to_owned(), 0),
    };
    Ok(parse_time(&whole)? * 1000 + millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(civil_from_days(11_017), (2000, 3, 1));
        assert_eq!(parse_time("2025-01-01T01:01Z"), Ok(1_735_689_600 + 3_660));
        assert_eq!(parse_time("2025-01-01"), Ok(1_735_689_600));
        assert_eq!(parse_time("1735689600"), Ok(1_735_689_600));
        assert!(parse_time("2025-13-01").is_err());
        assert!(parse_time("yesterday").is_err());
        assert_eq!(format_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_millis(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(format_millis(1_795_971_851_123), "2026-11-29T17:04:11.123Z");
    }

    #[test]
    fn round_trip_over_centuries() {
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        for millis in [0, 1_795_971_851_123, 951_782_400_999] {
            assert_eq!(parse_millis(&format_millis(millis)), Ok(millis));
        }
    }

    #[test]
    fn the_rules_services_times_read() {
        assert_eq!(
            parse_millis("2026-01-01T00:00:01.250Z"),
            Ok(1_767_225_601_250)
        );
        assert_eq!(parse_millis("2026-01-01T00:00:01Z"), Ok(1_767_225_601_000));
        assert!(parse_millis("2026-01-01T00:00:01.x5Z").is_err());
    }
}
