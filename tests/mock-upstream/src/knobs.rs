//! The `x-mock-*` request headers that steer an answer.

use std::time::Duration;

use hyper::header::HeaderMap;
use hyper::StatusCode;

pub(crate) const STATUS: &str = "x-mock-status";
pub(crate) const DELAY_MS: &str = "x-mock-delay-ms";
pub(crate) const CHUNK_DELAY_MS: &str = "x-mock-chunk-delay-ms";
pub(crate) const CHUNKS: &str = "x-mock-chunks";
pub(crate) const CUT_AFTER: &str = "x-mock-cut-after";
pub(crate) const END_AFTER: &str = "x-mock-end-after";
pub(crate) const ERROR_CODE: &str = "x-mock-error-code";
pub(crate) const STATUS_MODEL: &str = "x-mock-status-model";
pub(crate) const RETRY_AFTER: &str = "x-mock-retry-after";
pub(crate) const NO_USAGE: &str = "x-mock-no-usage";
pub(crate) const USAGE_IN_FINAL_CHUNK: &str = "x-mock-usage-in-final-chunk";
pub(crate) const PROMPT_TOKENS: &str = "x-mock-prompt-tokens";
pub(crate) const CACHE_READ_TOKENS: &str = "x-mock-cache-read-tokens";
pub(crate) const ECHO: &str = "x-mock-echo";
pub(crate) const GARBAGE: &str = "x-mock-garbage";
pub(crate) const CUT_RST: &str = "x-mock-cut-rst";
pub(crate) const TOOL_CALL: &str = "x-mock-tool-call";
pub(crate) const USAGE_STYLE: &str = "x-mock-usage-style";

/// How a chat answer's `usage` reports cached prompt tokens (`x-mock-usage-style`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UsageStyle {
    /// `prompt_tokens_details.cached_tokens` (with `x-mock-cache-read-tokens`).
    #[default]
    Openai,
    /// DeepSeek's `prompt_cache_hit_tokens` / `prompt_cache_miss_tokens`.
    Deepseek,
}

/// What `x-mock-garbage` puts into a stream after its first event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Garbage {
    /// A line that is not SSE (an HTML error page's first line), then a blank line.
    Text,
    /// A `data:` event whose JSON is cut off.
    Json,
    /// A `data:` event whose JSON string holds bytes that are not UTF-8.
    Utf8,
    /// A `data:` line that never ends: `x` bytes without a newline until the client leaves
    /// (the rest of the stream never comes).
    Endless,
}

/// Default number of completion tokens.
pub(crate) const DEFAULT_CHUNKS: u64 = 8;
/// Largest `x-mock-chunks`.
pub(crate) const MAX_CHUNKS: u64 = 100_000;
/// Largest delay knob value (one hour).
pub(crate) const MAX_DELAY_MS: u64 = 3_600_000;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Knobs {
    pub(crate) status: Option<StatusCode>,
    pub(crate) delay: Option<Duration>,
    pub(crate) chunk_delay: Option<Duration>,
    pub(crate) chunks: Option<u64>,
    pub(crate) cut_after: Option<u64>,
    pub(crate) end_after: Option<u64>,
    pub(crate) error_code: Option<String>,
    pub(crate) status_model: Option<String>,
    pub(crate) retry_after: Option<String>,
    pub(crate) no_usage: bool,
    pub(crate) usage_in_final_chunk: bool,
    pub(crate) prompt_tokens: Option<u64>,
    pub(crate) cache_read_tokens: Option<u64>,
    pub(crate) echo: bool,
    pub(crate) garbage: Option<Garbage>,
    pub(crate) cut_rst: bool,
    /// `x-mock-tool-call`: the tool to call.
    pub(crate) tool_call: Option<String>,
    pub(crate) usage_style: UsageStyle,
}

/// A knob header with a value it cannot take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KnobError {
    pub(crate) knob: &'static str,
    pub(crate) expected: &'static str,
}

impl Knobs {
    pub(crate) fn from_headers(headers: &HeaderMap) -> Result<Knobs, KnobError> {
        let status = int(
            headers,
            STATUS,
            200,
            599,
            "an HTTP status code in 200..=599",
        )?
        .map(|code| {
            u16::try_from(code)
                .ok()
                .and_then(|c| StatusCode::from_u16(c).ok())
                .ok_or(KnobError {
                    knob: STATUS,
                    expected: "an HTTP status code in 200..=599",
                })
        })
        .transpose()?;
        let ms = |knob| {
            int(
                headers,
                knob,
                0,
                MAX_DELAY_MS,
                "milliseconds in 0..=3600000",
            )
            .map(|v| v.map(Duration::from_millis))
        };
        Ok(Knobs {
            status,
            delay: ms(DELAY_MS)?,
            chunk_delay: ms(CHUNK_DELAY_MS)?,
            chunks: int(headers, CHUNKS, 0, MAX_CHUNKS, "an integer in 0..=100000")?,
            cut_after: int(headers, CUT_AFTER, 0, u64::MAX, "a non-negative integer")?,
            end_after: int(headers, END_AFTER, 0, u64::MAX, "a non-negative integer")?,
            error_code: text(headers, ERROR_CODE, "a visible ASCII error code")?
                .filter(|code| !code.is_empty())
                .map(str::to_owned),
            status_model: text(headers, STATUS_MODEL, "a visible ASCII model name")?
                .filter(|model| !model.is_empty())
                .map(str::to_owned),
            retry_after: text(headers, RETRY_AFTER, "a visible ASCII retry-after value")?
                .filter(|value| !value.is_empty())
                .map(str::to_owned),
            no_usage: flag(headers, NO_USAGE)?,
            usage_in_final_chunk: flag(headers, USAGE_IN_FINAL_CHUNK)?,
            prompt_tokens: int(
                headers,
                PROMPT_TOKENS,
                0,
                u64::MAX,
                "a non-negative integer",
            )?,
            cache_read_tokens: int(
                headers,
                CACHE_READ_TOKENS,
                0,
                u64::MAX,
                "a non-negative integer",
            )?,
            echo: flag(headers, ECHO)?,
            garbage: garbage(headers)?,
            cut_rst: flag(headers, CUT_RST)?,
            tool_call: text(headers, TOOL_CALL, "a visible ASCII tool name")?
                .filter(|name| !name.is_empty())
                .map(str::to_owned),
            usage_style: usage_style(headers)?,
        })
    }

    /// Number of completion tokens to produce under the request's cap, and whether the cap
    /// cut them short.
    pub(crate) fn completion(&self, cap: Option<u64>) -> (u64, bool) {
        let wanted = self.chunks.unwrap_or(DEFAULT_CHUNKS);
        match cap {
            Some(cap) if cap < wanted => (cap, true),
            _ => (wanted, false),
        }
    }
}

fn text<'h>(
    headers: &'h HeaderMap,
    knob: &'static str,
    expected: &'static str,
) -> Result<Option<&'h str>, KnobError> {
    match headers.get(knob) {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map(|v| Some(v.trim()))
            .map_err(|_| KnobError { knob, expected }),
    }
}

fn int(
    headers: &HeaderMap,
    knob: &'static str,
    min: u64,
    max: u64,
    expected: &'static str,
) -> Result<Option<u64>, KnobError> {
    let Some(value) = text(headers, knob, expected)? else {
        return Ok(None);
    };
    match value.parse::<u64>() {
        Ok(v) if (min..=max).contains(&v) && value.bytes().all(|b| b.is_ascii_digit()) => {
            Ok(Some(v))
        }
        _ => Err(KnobError { knob, expected }),
    }
}

fn garbage(headers: &HeaderMap) -> Result<Option<Garbage>, KnobError> {
    const EXPECTED: &str = "text, json, utf8 or endless";
    let Some(value) = text(headers, GARBAGE, EXPECTED)? else {
        return Ok(None);
    };
    match value.to_ascii_lowercase().as_str() {
        "text" => Ok(Some(Garbage::Text)),
        "json" => Ok(Some(Garbage::Json)),
        "utf8" => Ok(Some(Garbage::Utf8)),
        "endless" => Ok(Some(Garbage::Endless)),
        _ => Err(KnobError {
            knob: GARBAGE,
            expected: EXPECTED,
        }),
    }
}

fn usage_style(headers: &HeaderMap) -> Result<UsageStyle, KnobError> {
    const EXPECTED: &str = "openai or deepseek";
    let Some(value) = text(headers, USAGE_STYLE, EXPECTED)? else {
        return Ok(UsageStyle::Openai);
    };
    match value.to_ascii_lowercase().as_str() {
        "openai" => Ok(UsageStyle::Openai),
        "deepseek" => Ok(UsageStyle::Deepseek),
        _ => Err(KnobError {
            knob: USAGE_STYLE,
            expected: EXPECTED,
        }),
    }
}

fn flag(headers: &HeaderMap, knob: &'static str) -> Result<bool, KnobError> {
    const EXPECTED: &str = "1/true/yes/on or 0/false/no/off";
    let Some(value) = text(headers, knob, EXPECTED)? else {
        return Ok(false);
    };
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(KnobError {
            knob,
            expected: EXPECTED,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn parse(pairs: &[(&'static str, &str)]) -> Result<Knobs, KnobError> {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, HeaderValue::from_str(value).expect("header value"));
        }
        Knobs::from_headers(&headers)
    }

    #[test]
    fn defaults() {
        assert_eq!(parse(&[]), Ok(Knobs::default()));
        assert_eq!(Knobs::default().completion(None), (8, false));
    }

    #[test]
    fn all_knobs() {
        let k = parse(&[
            (STATUS, "429"),
            (DELAY_MS, "5"),
            (CHUNK_DELAY_MS, " 7 "),
            (CHUNKS, "100000"),
            (CUT_AFTER, "0"),
            (NO_USAGE, "true"),
            (USAGE_IN_FINAL_CHUNK, "1"),
            (PROMPT_TOKENS, "12"),
            (CACHE_READ_TOKENS, "3"),
            (ECHO, "on"),
            (GARBAGE, "Endless"),
            (CUT_RST, "1"),
            (TOOL_CALL, "get_weather"),
            (USAGE_STYLE, "DeepSeek"),
        ])
        .expect("valid knobs");
        assert_eq!(k.tool_call.as_deref(), Some("get_weather"));
        assert_eq!(k.usage_style, UsageStyle::Deepseek);
        assert_eq!(k.garbage, Some(Garbage::Endless));
        assert!(k.cut_rst);
        assert_eq!(k.status, Some(StatusCode::TOO_MANY_REQUESTS));
        assert_eq!(k.delay, Some(Duration::from_millis(5)));
        assert_eq!(k.chunk_delay, Some(Duration::from_millis(7)));
        assert_eq!(k.chunks, Some(100_000));
        assert_eq!(k.cut_after, Some(0));
        assert!(k.no_usage && k.usage_in_final_chunk);
        assert_eq!(k.prompt_tokens, Some(12));
        assert_eq!(k.cache_read_tokens, Some(3));
        assert!(k.echo);
    }

    #[test]
    fn bad_values_name_the_knob() {
        for (knob, value) in [
            (STATUS, "99"),
            (STATUS, "600"),
            (STATUS, "abc"),
            (DELAY_MS, "-1"),
            (DELAY_MS, "3600001"),
            (CHUNK_DELAY_MS, "1.5"),
            (CHUNKS, "100001"),
            (CHUNKS, "+3"),
            (CUT_AFTER, ""),
            (NO_USAGE, "maybe"),
            (USAGE_IN_FINAL_CHUNK, "2"),
            (PROMPT_TOKENS, "99999999999999999999999"),
            (CACHE_READ_TOKENS, "x"),
            (ECHO, "2"),
            (GARBAGE, "binary"),
            (GARBAGE, ""),
            (CUT_RST, "rst"),
            (USAGE_STYLE, "anthropic"),
        ] {
            let err = parse(&[(knob, value)]).expect_err(value);
            assert_eq!(err.knob, knob, "{knob}: {value}");
        }
    }

    #[test]
    fn completion_cap() {
        let k = Knobs {
            chunks: Some(5),
            ..Knobs::default()
        };
        assert_eq!(k.completion(Some(3)), (3, true));
        assert_eq!(k.completion(Some(5)), (5, false));
        assert_eq!(k.completion(Some(0)), (0, true));
        assert_eq!(k.completion(None), (5, false));
    }
}
