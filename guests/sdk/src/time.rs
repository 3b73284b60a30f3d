//! Timestamps as RFC 3339 text (no dependency on a date crate).

/// Days since 1970-01-01 -> (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Unix nanoseconds as `2024-05-01T12:34:56.789012345Z`.
pub fn rfc3339_nanos(unix_ns: u64) -> String {
    let secs = (unix_ns / 1_000_000_000) as i64;
    let nanos = unix_ns % 1_000_000_000;
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let t = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        t / 3600,
        t / 60 % 60,
        t % 60
    )
}

/// Unix seconds as `2024-05-01T12:34:56Z`.
pub fn rfc3339_secs(unix_secs: u64) -> String {
    let s = rfc3339_nanos(unix_secs.saturating_mul(1_000_000_000));
    format!("{}Z", &s[..19])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(rfc3339_secs(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_secs(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_secs(1_709_251_199), "2024-02-29T23:59:59Z");
        assert_eq!(
            rfc3339_nanos(1_700_000_000_123_456_789),
            "2023-11-14T22:13:20.123456789Z"
        );
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(rfc3339_secs(4_102_444_800), "2100-01-01T00:00:00Z");
    }
}
