//! Parsing and printing of the units people type: durations (`200ms`, `1.5s`) and CPU lists
//! (`0-3,8`). Errors say what was expected.

/// Parse a duration with a unit suffix (`ns`, `us`, `ms`, `s`, `m`, `h`) into nanoseconds.
/// A bare number is seconds, as in `perf stat -I`-less tools like `sleep`.
pub fn parse_duration_ns(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale: f64 = match unit {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "" | "s" => 1e9,
        "m" => 60e9,
        "h" => 3600e9,
        _ => return Err(format!("invalid duration '{text}': unknown unit '{unit}' (use ns, us, ms, s, m or h)")),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration '{text}': expected a number followed by a unit, e.g. '200ms'"))?;
    let ns = value * scale;
    if !ns.is_finite() || ns < 0.0 || ns > u64::MAX as f64 {
        return Err(format!("invalid duration '{text}': out of range"));
    }
    // In range: checked against u64::MAX just above.
    #[allow(clippy::cast_possible_truncation)]
    Ok(ns.round() as u64)
}

/// A duration in whole nanoseconds, saturating at u64::MAX (584 years).
pub fn duration_ns(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A duration as people write it (`1.5s`, `200ms`), as [`format_duration_ns`] does.
pub fn format_duration(d: std::time::Duration) -> String {
    format_duration_ns(duration_ns(d))
}

/// A count or duration measured as f64, as u64: NaN and negatives become 0, values beyond
/// u64::MAX become u64::MAX (which is what `as` does; this names the intent).
#[allow(clippy::cast_possible_truncation)]
pub fn saturating_u64(x: f64) -> u64 {
    x as u64
}

/// Print nanoseconds with the largest unit that keeps an integer (`200ms`, `1500us`).
pub fn format_duration_ns(ns: u64) -> String {
    for (unit, scale) in
        [("h", 3_600_000_000_000), ("m", 60_000_000_000), ("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)]
    {
        if ns >= scale && ns % scale == 0 {
            return format!("{}{unit}", ns / scale);
        }
    }
    format!("{ns}ns")
}

/// `text` safe to print on a terminal: control characters (escape sequences, carriage
/// returns, NULs from a damaged file or a hostile process name) written as `\u{1b}` escapes.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Parse a CPU list such as `0-3,8,10-11` into CPU numbers, in the order given.
pub fn parse_cpu_list(text: &str) -> Result<Vec<u32>, String> {
    let bad = |why: &str| format!("invalid CPU list '{text}': {why} (expected e.g. '0', '0-3' or '0,2-3')");
    let mut cpus = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(bad("empty element"));
        }
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo, hi),
            None => (part, part),
        };
        let lo: u32 = lo.trim().parse().map_err(|_| bad(&format!("'{part}' is not a CPU number or range")))?;
        let hi: u32 = hi.trim().parse().map_err(|_| bad(&format!("'{part}' is not a CPU number or range")))?;
        if hi < lo {
            return Err(bad(&format!("range '{part}' runs backwards")));
        }
        if hi - lo > 4096 {
            return Err(bad(&format!("range '{part}' is too large")));
        }
        cpus.extend(lo..=hi);
    }
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(printable("vm-1"), "vm-1");
        assert_eq!(printable("a\u{1b}[2Jb\r"), "a\\u{1b}[2Jb\\r");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ns("200ms"), Ok(200_000_000));
        assert_eq!(parse_duration_ns("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_duration_ns("3"), Ok(3_000_000_000));
        assert_eq!(parse_duration_ns("250us"), Ok(250_000));
        assert!(parse_duration_ns("5 parsecs").is_err());
        assert!(parse_duration_ns("ms").is_err());
        assert_eq!(format_duration_ns(200_000_000), "200ms");
        assert_eq!(format_duration_ns(1_500_000), "1500us");
        assert_eq!(format_duration_ns(7), "7ns");
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-2,5"), Ok(vec![0, 1, 2, 5]));
        assert_eq!(parse_cpu_list("1"), Ok(vec![1]));
        assert!(parse_cpu_list("3-1").unwrap_err().contains("backwards"));
        assert!(parse_cpu_list("a").unwrap_err().contains("invalid CPU list 'a'"));
        assert!(parse_cpu_list("1,,2").is_err());
    }
}

/// The UTC calendar day (`YYYY-MM-DD`) of a Unix time in seconds (the proleptic Gregorian
/// calendar, by the days-from-civil inversion).
pub fn utc_date(unix_s: u64) -> String {
    let days = unix_s / 86_400;
    // Shift the epoch to 0000-03-01 so that leap days end each 400-year era's years.
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod date_tests {
    use super::utc_date;

    #[test]
    fn utc_dates_across_leap_years_and_centuries() {
        assert_eq!(utc_date(0), "1970-01-01");
        assert_eq!(utc_date(951_782_400), "2000-02-29");
        assert_eq!(utc_date(1_709_164_800), "2024-02-29");
        assert_eq!(utc_date(1_795_564_799), "2026-11-24");
        assert_eq!(utc_date(1_795_564_800), "2026-11-25");
        assert_eq!(utc_date(4_107_542_400), "2100-03-01");
    }
}
