//! A provider's "come back later": how long a deployment that answered 429 or 503 asks to be
//! left alone, read from its response headers.
//!
//! The signals, in the order they are trusted:
//! * `retry-after` (RFC 9110 §10.2.3): delay-seconds (`2`) or an HTTP-date
//!   (`Sun, 06 Nov 1994 08:49:37 GMT`, IMF-fixdate only; the obsolete forms are ignored);
//! * OpenAI's `x-ratelimit-reset-requests` / `x-ratelimit-reset-tokens`: a Go-style duration
//!   (`1s`, `6m0s`, `20ms`, `1h2m3.5s`) until that limit's window resets;
//! * Anthropic's `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-reset`: an
//!   RFC 3339 time (`2026-12-01T22:50:27Z`, fractions and offsets allowed).
//!
//! Of the per-limit resets, the ones whose `…-remaining-…` header says 0 are the limits that
//! were hit: the longest of those wins; if none says so, the shortest reset (the provider
//! refused, but did not say which limit: the earliest time anything frees up).
//!
//! Parsing is defensive: junk, negative and absurd values (more than [`MAX_SIGNAL_MS`]) are
//! ignored, never a panic. The caller caps what is left at its configured maximum.

/// Longest delay a signal may name before it is treated as junk (a day).
pub const MAX_SIGNAL_MS: u64 = 24 * 3600 * 1000;

/// OpenAI's per-limit reset headers and their remaining-count headers.
const OPENAI: [(&str, &str); 2] = [
    (
        "x-ratelimit-reset-requests",
        "x-ratelimit-remaining-requests",
    ),
    ("x-ratelimit-reset-tokens", "x-ratelimit-remaining-tokens"),
];

/// Anthropic's per-limit reset headers and their remaining-count headers.
const ANTHROPIC: [(&str, &str); 4] = [
    (
        "anthropic-ratelimit-requests-reset",
        "anthropic-ratelimit-requests-remaining",
    ),
    (
        "anthropic-ratelimit-tokens-reset",
        "anthropic-ratelimit-tokens-remaining",
    ),
    (
        "anthropic-ratelimit-input-tokens-reset",
        "anthropic-ratelimit-input-tokens-remaining",
    ),
    (
        "anthropic-ratelimit-output-tokens-reset",
        "anthropic-ratelimit-output-tokens-remaining",
    ),
];

/// Does a response with this status ask the router to cool its deployment down (when it
/// carries a signal)? 429 (rate limited) and 503 (overloaded): the statuses with which
/// RFC 9110 pairs `retry-after` and the providers send their rate-limit resets. A 500 or 502
/// with a `retry-after` says nothing about when the deployment recovers.
pub fn is_cooldown_status(status: u16) -> bool {
    status == 429 || status == 503
}

/// How long (ms from `now_ms`, Unix milliseconds) the response's headers ask the client to
/// wait; `None` when they name no usable delay. `header` reads one response header.
pub fn reset_after_ms(header: &dyn Fn(&str) -> Option<String>, now_ms: u64) -> Option<u64> {
    if let Some(ms) = header("retry-after").and_then(|v| parse_retry_after(&v, now_ms)) {
        return Some(ms);
    }
    let mut hit: Option<u64> = None;
    let mut any: Option<u64> = None;
    let mut consider = |reset: Option<u64>, remaining: Option<String>| {
        let Some(ms) = reset else {
            return;
        };
        any = Some(any.map_or(ms, |a| a.min(ms)));
        if remaining.is_some_and(|r| r.trim() == "0") {
            hit = Some(hit.map_or(ms, |h| h.max(ms)));
        }
    };
    for (reset, remaining) in OPENAI {
        consider(
            header(reset).and_then(|v| parse_duration(&v)),
            header(remaining),
        );
    }
    for (reset, remaining) in ANTHROPIC {
        let ms = header(reset)
            .and_then(|v| parse_rfc3339_ms(&v))
            .and_then(|at| until(at, now_ms));
        consider(ms, header(remaining));
    }
    hit.or(any)
}

/// `retry-after`: delay-seconds or an IMF-fixdate, as ms from `now_ms`.
pub fn parse_retry_after(value: &str, now_ms: u64) -> Option<u64> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        let seconds: u64 = value.parse().ok()?;
        return seconds.checked_mul(1000).filter(|ms| *ms <= MAX_SIGNAL_MS);
    }
    until(parse_http_date_ms(value)?, now_ms)
}

/// A time `at_ms` as a delay from `now_ms` (0 if past); `None` if absurdly far.
fn until(at_ms: u64, now_ms: u64) -> Option<u64> {
    Some(at_ms.saturating_sub(now_ms)).filter(|ms| *ms <= MAX_SIGNAL_MS)
}

/// A Go-style duration (`1s`, `6m0s`, `20ms`, `1.5s`, `1h2m`), as ms (rounded up).
pub fn parse_duration(value: &str) -> Option<u64> {
    let mut rest = value.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total_us: u64 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_len);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let unit_us: u64 = match unit {
            "h" => 3_600_000_000,
            "m" => 60_000_000,
            "s" => 1_000_000,
            "ms" => 1_000,
            "us" | "µs" => 1,
            _ => return None,
        };
        total_us = total_us.checked_add(decimal_times(number, unit_us)?)?;
        rest = tail;
    }
    let ms = total_us.div_ceil(1000);
    (ms <= MAX_SIGNAL_MS).then_some(ms)
}

/// `number` (digits, at most one `.`) times `unit`, truncated to an integer.
fn decimal_times(number: &str, unit: u64) -> Option<u64> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    if !whole.bytes().all(|b| b.is_ascii_digit()) || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut value = whole.checked_mul(unit)?;
    let mut scale = unit;
    for digit in fraction.bytes().take(9) {
        scale /= 10;
        value = value.checked_add(u64::from(digit - b'0').checked_mul(scale)?)?;
    }
    Some(value)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> Option<i64> {
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some(era * 146_097 + doe - 719_468)
}

/// Unix ms of a date and time of day; `None` before 1970 or out of range.
fn unix_ms(year: i64, month: u32, day: u32, h: u32, m: u32, s: u32, offset_s: i64) -> Option<u64> {
    if h > 23 || m > 59 || s > 60 {
        return None;
    }
    let days = days_from_civil(year, month, day)?;
    let seconds = days
        .checked_mul(86_400)?
        .checked_add(i64::from(h * 3600 + m * 60 + s))?
        .checked_sub(offset_s)?;
    u64::try_from(seconds).ok()?.checked_mul(1000)
}

fn number<T: std::str::FromStr>(text: &str, len: usize) -> Option<T> {
    (text.len() == len && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse().ok())
        .flatten()
}

/// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) as Unix ms.
pub fn parse_http_date_ms(value: &str) -> Option<u64> {
    let (_weekday, rest) = value.trim().split_once(", ")?;
    let mut parts = rest.split(' ');
    let day: u32 = number(parts.next()?, 2)?;
    let month = match parts.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year: i64 = number(parts.next()?, 4)?;
    let mut time = parts.next()?.split(':');
    let h = number(time.next()?, 2)?;
    let m = number(time.next()?, 2)?;
    let s = number(time.next()?, 2)?;
    if time.next().is_some() || parts.next()? != "GMT" || parts.next().is_some() {
        return None;
    }
    unix_ms(year, month, day, h, m, s, 0)
}

/// An RFC 3339 date-time (`2026-12-01T22:50:27Z`, `…27.5+01:00`) as Unix ms (fraction
/// truncated to ms).
pub fn parse_rfc3339_ms(value: &str) -> Option<u64> {
    let value = value.trim();
    let (date, time) = value.split_once(['T', 't', ' '])?;
    let mut d = date.split('-');
    let year: i64 = number(d.next()?, 4)?;
    let month = number(d.next()?, 2)?;
    let day = number(d.next()?, 2)?;
    if d.next().is_some() {
        return None;
    }
    let (clock, offset_s) = if let Some(clock) = time.strip_suffix(['Z', 'z']) {
        (clock, 0)
    } else {
        let at = time.rfind(['+', '-'])?;
        let (clock, offset) = time.split_at(at);
        let sign = if offset.starts_with('-') { -1 } else { 1 };
        let (oh, om) = offset.get(1..)?.split_once(':')?;
        let oh: i64 = number(oh, 2)?;
        let om: i64 = number(om, 2)?;
        (clock, sign * (oh * 3600 + om * 60))
    };
    let (hms, fraction) = clock.split_once('.').unwrap_or((clock, ""));
    let mut t = hms.split(':');
    let h = number(t.next()?, 2)?;
    let m = number(t.next()?, 2)?;
    let s = number(t.next()?, 2)?;
    if t.next().is_some() {
        return None;
    }
    let ms = if fraction.is_empty() {
        0
    } else {
        decimal_times(&format!("0.{fraction}"), 1000)?
    };
    unix_ms(year, month, day, h, m, s, offset_s)?.checked_add(ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: u64 = 1_764_629_427_000; // 2025-12-01T22:50:27Z

    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn retry_after_in_seconds_or_as_a_date() {
        assert_eq!(parse_retry_after("2", NOW), Some(2_000));
        assert_eq!(parse_retry_after(" 0 ", NOW), Some(0));
        assert_eq!(
            parse_retry_after("Mon, 01 Dec 2025 22:50:30 GMT", NOW),
            Some(3_000)
        );
        // a date in the past: no wait
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", NOW),
            Some(0)
        );
        for junk in [
            "",
            "-1",
            "1.5",
            "soon",
            "99999999999999999999",
            "86401",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 25:49:37 GMT",
            "Mon, 01 Dec 2099 22:50:30 GMT", // absurdly far
        ] {
            assert_eq!(parse_retry_after(junk, NOW), None, "{junk:?}");
        }
    }

    #[test]
    fn openai_durations() {
        for (text, ms) in [
            ("1s", 1_000),
            ("6m0s", 360_000),
            ("20ms", 20),
            ("1.5s", 1_500),
            ("1h2m3s", 3_723_000),
            ("0s", 0),
            ("500us", 1),
            (".5s", 500),
        ] {
            assert_eq!(parse_duration(text), Some(ms), "{text}");
        }
        for junk in [
            "",
            "s",
            "1",
            "1x",
            "-1s",
            "1..2s",
            "1s2",
            "25h",
            "99999999999999h",
        ] {
            assert_eq!(parse_duration(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn rfc3339_times() {
        assert_eq!(parse_rfc3339_ms("2025-12-01T22:50:27Z"), Some(NOW));
        assert_eq!(
            parse_rfc3339_ms("2025-12-01T22:50:27.250Z"),
            Some(NOW + 250)
        );
        assert_eq!(parse_rfc3339_ms("2025-12-01T23:50:27+01:00"), Some(NOW));
        assert_eq!(parse_rfc3339_ms("2025-12-01T21:50:27-01:00"), Some(NOW));
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_ms("2000-02-29T00:00:00Z"),
            Some(951_782_400_000)
        );
        for junk in [
            "",
            "2025-12-01",
            "2025-13-01T00:00:00Z",
            "2025-12-01T24:00:00Z",
            "1969-12-31T23:59:59Z",
            "2025-12-01T22:50:27",
            "2025-12-01T22:50:27+0100",
            "20251201T225027Z",
        ] {
            assert_eq!(parse_rfc3339_ms(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn retry_after_wins_then_the_limit_that_was_hit() {
        let h = [("retry-after", "2"), ("x-ratelimit-reset-requests", "20s")];
        assert_eq!(reset_after_ms(&headers(&h), NOW), Some(2_000));
        // OpenAI: the tokens limit was hit (remaining 0): its reset, not the requests'
        let h = [
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-remaining-requests", "57"),
            ("x-ratelimit-reset-tokens", "6m0s"),
            ("x-ratelimit-remaining-tokens", "0"),
        ];
        assert_eq!(reset_after_ms(&headers(&h), NOW), Some(360_000));
        // no remaining counts: the earliest reset
        let h = [
            ("x-ratelimit-reset-requests", "3s"),
            ("x-ratelimit-reset-tokens", "20ms"),
        ];
        assert_eq!(reset_after_ms(&headers(&h), NOW), Some(20));
        // Anthropic
        let h = [
            (
                "anthropic-ratelimit-input-tokens-reset",
                "2025-12-01T22:50:31Z",
            ),
            ("anthropic-ratelimit-input-tokens-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2025-12-01T22:50:28Z"),
            ("anthropic-ratelimit-requests-remaining", "10"),
        ];
        assert_eq!(reset_after_ms(&headers(&h), NOW), Some(4_000));
        // junk retry-after: the other signals still count
        let h = [("retry-after", "soon"), ("x-ratelimit-reset-tokens", "2s")];
        assert_eq!(reset_after_ms(&headers(&h), NOW), Some(2_000));
        assert_eq!(reset_after_ms(&headers(&[]), NOW), None);
        assert_eq!(
            reset_after_ms(&headers(&[("x-ratelimit-reset-tokens", "junk")]), NOW),
            None
        );
    }

    #[test]
    fn cooldown_statuses_are_429_and_503() {
        for (status, yes) in [
            (429, true),
            (503, true),
            (500, false),
            (502, false),
            (200, false),
        ] {
            assert_eq!(is_cooldown_status(status), yes, "{status}");
        }
    }

    proptest! {
        #[test]
        fn parsers_never_panic_and_stay_bounded(text in ".{0,40}", now in any::<u64>()) {
            for ms in [
                parse_retry_after(&text, now),
                parse_duration(&text),
                parse_http_date_ms(&text).and_then(|at| until(at, now)),
                parse_rfc3339_ms(&text).and_then(|at| until(at, now)),
            ]
            .into_iter()
            .flatten()
            {
                prop_assert!(ms <= MAX_SIGNAL_MS);
            }
        }

        #[test]
        fn durations_round_trip(h in 0u64..24, m in 0u64..60, s in 0u64..60, ms in 0u64..1000) {
            let text = format!("{h}h{m}m{s}s{ms}ms");
            prop_assert_eq!(parse_duration(&text), Some(((h * 60 + m) * 60 + s) * 1000 + ms));
        }
    }
}
