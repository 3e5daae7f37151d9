//! Times and durations, for people (tables) and for programs (JSON).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A duration for people, rounded down: `42 s`, `3 min`, `2 h`, `4 d`;
/// under a second `250 ms`.
pub fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 if !d.is_zero() => format!("{} ms", d.as_millis()),
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

/// A configured duration, exact: in the largest unit that divides it
/// (`1 h`, `7 d`, `90 s`, `500 ms`), `0` for zero.
pub fn span(d: Duration) -> String {
    if d.is_zero() {
        return "0".to_owned();
    }
    let us = d.as_micros();
    const UNITS: [(u128, &str); 6] = [
        (86_400_000_000, "d"),
        (3_600_000_000, "h"),
        (60_000_000, "min"),
        (1_000_000, "s"),
        (1_000, "ms"),
        (1, "µs"),
    ];
    for (size, name) in UNITS {
        if us.is_multiple_of(size) {
            return format!("{} {name}", us / size);
        }
    }
    format!("{us} µs")
}

/// How far `t` lies from `now`: `in 25 s`, `3 min ago`, `now`.
pub fn relative(t: SystemTime, now: SystemTime) -> String {
    match t.duration_since(now) {
        Ok(ahead) if ahead.as_secs() > 0 => format!("in {}", age(ahead)),
        Ok(_) => "now".to_owned(),
        Err(behind) if behind.duration().as_secs() > 0 => format!("{} ago", age(behind.duration())),
        Err(_) => "now".to_owned(),
    }
}

/// RFC 3339 in UTC with microseconds, as PostgreSQL keeps them:
/// `2024-05-01T12:00:00.250000Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let micros: i128 = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i128::try_from(d.as_micros()).unwrap_or(i128::MAX),
        Err(e) => -i128::try_from(e.duration().as_micros()).unwrap_or(i128::MAX),
    };
    let secs = micros.div_euclid(1_000_000);
    let sub = micros.rem_euclid(1_000_000);
    let (days, of_day) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (of_day / 3600, of_day % 3600 / 60, of_day % 60);
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}.{sub:06}Z")
}

/// Year, month, day of the proleptic Gregorian calendar for days since
/// 1970-01-01 (H. Hinnant's `civil_from_days`): no date crate for one
/// formatting function.
fn civil_from_days(days: i128) -> (i128, i128, i128) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i128::from(m <= 2);
    (y, m, d)
}

/// A duration as fractional seconds for JSON.
pub fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        assert_eq!(age(Duration::from_secs(90)), "90 s");
        assert_eq!(age(Duration::from_secs(600)), "10 min");
        assert_eq!(age(Duration::from_secs(3 * 86_400)), "3 d");
        assert_eq!(age(Duration::from_millis(250)), "250 ms");
        assert_eq!(age(Duration::ZERO), "0 s");
        assert_eq!(span(Duration::from_secs(3600)), "1 h");
        assert_eq!(span(Duration::from_secs(7 * 86_400)), "7 d");
        assert_eq!(span(Duration::from_secs(90)), "90 s");
        assert_eq!(span(Duration::from_millis(1500)), "1500 ms");
        assert_eq!(span(Duration::ZERO), "0");
    }

    #[test]
    fn times_in_rfc3339() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000000Z");
        let t = UNIX_EPOCH + Duration::from_micros(1_700_000_000_250_000);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20.250000Z");
        let before = UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(rfc3339(before), "1969-12-31T23:59:59.000000Z");
        let now = UNIX_EPOCH + Duration::from_secs(1000);
        assert_eq!(relative(now + Duration::from_secs(25), now), "in 25 s");
        assert_eq!(relative(now - Duration::from_secs(180), now), "3 min ago");
        assert_eq!(relative(now, now), "now");
    }
}
