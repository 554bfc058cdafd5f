//! RFC 3339 timestamps to Unix seconds, for `expires_at`.
//!
//! `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`, `T`/`t`/space and `Z`/`z` accepted; fractions are
//! truncated; a leap second (`:60`) counts as `:59`. Calendar days are checked (no 31 April,
//! 29 February only in leap years). Dates are converted with Howard Hinnant's
//! `days_from_civil`, so no time zone database and no host clock are involved.

/// Seconds since 1970-01-01T00:00:00Z, or why the text is not an RFC 3339 timestamp.
pub fn parse_unix_seconds(text: &str) -> Result<i64, &'static str> {
    let b = text.as_bytes();
    if b.len() < 20 {
        return Err("too short for YYYY-MM-DDTHH:MM:SSZ");
    }
    let year = digits(b, 0, 4)?;
    let month = digits(b, 5, 2)?;
    let day = digits(b, 8, 2)?;
    let hour = digits(b, 11, 2)?;
    let minute = digits(b, 14, 2)?;
    let second = digits(b, 17, 2)?;
    if b.get(4) != Some(&b'-') || b.get(7) != Some(&b'-') {
        return Err("date must be YYYY-MM-DD");
    }
    if !matches!(b.get(10), Some(b'T' | b't' | b' ')) {
        return Err("date and time must be separated by `T`");
    }
    if b.get(13) != Some(&b':') || b.get(16) != Some(&b':') {
        return Err("time must be HH:MM:SS");
    }
    if !(1..=12).contains(&month) {
        return Err("month out of range");
    }
    if day < 1 || day > days_in_month(year, month) {
        return Err("day out of range for the month");
    }
    if hour > 23 || minute > 59 || second > 60 {
        return Err("time out of range");
    }

    let mut pos = 19;
    if b.get(pos) == Some(&b'.') {
        pos += 1;
        let start = pos;
        while b.get(pos).is_some_and(u8::is_ascii_digit) {
            pos += 1;
        }
        if pos == start {
            return Err("fraction needs at least one digit");
        }
    }
    let offset_secs = match b.get(pos) {
        Some(b'Z' | b'z') if pos + 1 == b.len() => 0,
        Some(sign @ (b'+' | b'-')) if pos + 6 == b.len() => {
            let oh = digits(b, pos + 1, 2)?;
            let om = digits(b, pos + 4, 2)?;
            if b.get(pos + 3) != Some(&b':') || oh > 23 || om > 59 {
                return Err("offset must be ±HH:MM");
            }
            let offset = i64::from(oh * 3600 + om * 60);
            if *sign == b'-' {
                -offset
            } else {
                offset
            }
        }
        _ => return Err("must end with `Z` or an offset ±HH:MM"),
    };

    let days = days_from_civil(i64::from(year), month, day);
    let secs_of_day = i64::from(hour * 3600 + minute * 60 + second.min(59));
    Ok(days * 86_400 + secs_of_day - offset_secs)
}

fn digits(b: &[u8], at: usize, len: usize) -> Result<u32, &'static str> {
    let slice = b.get(at..at + len).ok_or("truncated")?;
    slice.iter().try_fold(0u32, |acc, &c| {
        if c.is_ascii_digit() {
            Ok(acc * 10 + u32::from(c - b'0'))
        } else {
            Err("expected a digit")
        }
    })
}

fn is_leap(year: u32) -> bool {
    (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400)
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        let cases = [
            ("1970-01-01T00:00:00Z", 0),
            ("2000-02-29T12:00:00Z", 951_825_600),
            ("2026-11-30T02:22:25Z", 1_796_005_345),
            ("2026-11-30T02:22:25.999z", 1_796_005_345),
            ("2026-11-30t10:22:25+08:00", 1_796_005_345),
            ("2026-11-29 21:22:25-05:00", 1_796_005_345),
            ("2016-12-31T23:59:60Z", 1_483_228_799),
            ("1969-12-31T23:59:59Z", -1),
        ];
        for (text, want) in cases {
            assert_eq!(parse_unix_seconds(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn refusals() {
        for text in [
            "",
            "2026-11-30",
            "2026-11-30T02:22:25",
            "2026-13-01T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2026-11-30T24:00:00Z",
            "2026-11-30T02:22:25+0800",
            "2026-11-30T02:22:25.Z",
            "2026/11/30T02:22:25Z",
            "2026-11-30T02:22:25Zjunk",
            "２０２６-11-30T02:22:25Z",
            "tomorrow at noon!!!!",
        ] {
            assert!(parse_unix_seconds(text).is_err(), "accepted {text:?}");
        }
    }

    /// The inverse of `days_from_civil`, only to check it.
    fn civil_from_days(z: i64) -> (i64, u32, u32) {
        let z = z + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        (yoe + era * 400 + i64::from(m <= 2), m, d)
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn formatted_instants_round_trip(secs in -2_000_000_000i64..10_000_000_000i64) {
                let days = secs.div_euclid(86_400);
                let rem = secs.rem_euclid(86_400);
                let (y, m, d) = civil_from_days(days);
                prop_assume!((0..=9999).contains(&y));
                let text = format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60);
                prop_assert_eq!(parse_unix_seconds(&text), Ok(secs));
            }

            #[test]
            fn never_panics(text in ".{0,40}") {
                let _ = parse_unix_seconds(&text);
            }
        }
    }
}
