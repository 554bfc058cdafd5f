//! Error bodies: Chat ⇄ Messages.
//!
//! A provider's error can be anything: its API's error JSON, another API's (a proxy in
//! front of it), `{"message"}` / `{"detail"}`, an HTML page, nothing. The client's SDK needs
//! its own API's shape to raise the right exception, so [`error`] always writes that shape:
//!
//! * OpenAI: `{"error":{"message","type","param":null,"code"}}`;
//! * Anthropic: `{"type":"error","error":{"type","message"}}`.
//!
//! The message is the provider's when it gave one (plain text trimmed, at most 512 bytes),
//! else one naming the status. The type is the provider's when the client API knows it (the
//! two APIs share `invalid_request_error`, `authentication_error`, `permission_error` and
//! `rate_limit_error`), with OpenAI's `insufficient_quota` ⇄ Anthropic's `billing_error`;
//! otherwise it follows the status:
//!
//! | status | Anthropic `type` | OpenAI `type` (`code`) |
//! |---|---|---|
//! | 400, 422 | `invalid_request_error` | `invalid_request_error` |
//! | 401 | `authentication_error` | `authentication_error` (`invalid_api_key`) |
//! | 402 | `billing_error` | `invalid_request_error` |
//! | 403 | `permission_error` | `permission_error` |
//! | 404 | `not_found_error` | `invalid_request_error` |
//! | 413 | `request_too_large` | `invalid_request_error` |
//! | 429 | `rate_limit_error` | `rate_limit_error` (`rate_limit_exceeded`) |
//! | 500, other 5xx | `api_error` | `server_error` |
//! | 529 | `overloaded_error` | `server_error` (`overloaded`) |
//! | other 4xx | `invalid_request_error` | `invalid_request_error` |
//!
//! An OpenAI `code` the provider sent is kept. A body already in the client API's shape,
//! from a deployment of that API, passes unchanged.

use super::Wire;
use llm_gateway_shared::json::push_quoted;
use llm_gateway_shared::reject::anthropic_error_body;
use serde_json::Value;

/// A provider's error body (API `from`, HTTP `status`) as the error body of API `to`; the
/// status stays.
pub fn error(from: Wire, to: Wire, status: u16, body: &[u8]) -> Vec<u8> {
    let found = Found::read(body);
    if from == to && found.shape == Some(to) {
        return body.to_vec();
    }
    let message = found
        .message
        .clone()
        .unwrap_or_else(|| format!("the provider answered HTTP {status} without a message"));
    match to {
        Wire::Chat => {
            let (kind, code) = openai_type(status, found.kind.as_deref(), found.code.as_deref());
            let mut out = Vec::with_capacity(message.len() + 96);
            out.extend_from_slice(b"{\"error\":{\"message\":");
            push_quoted(&mut out, &message);
            out.extend_from_slice(b",\"type\":");
            push_quoted(&mut out, &kind);
            out.extend_from_slice(b",\"param\":null,\"code\":");
            push_code(&mut out, code.as_deref());
            out.extend_from_slice(b"}}");
            out
        }
        Wire::Messages => {
            let kind = anthropic_type(status, found.kind.as_deref(), found.code.as_deref());
            anthropic_error_body(&kind, &message)
        }
    }
}

fn push_code(out: &mut Vec<u8>, code: Option<&str>) {
    match code {
        Some(code) => push_quoted(out, code),
        None => out.extend_from_slice(b"null"),
    }
}

/// The in-stream error event of OpenAI's API for an Anthropic stream's `error` event data
/// (`{"type":"error","error":{"type","message"}}`), the status guessed from the type.
pub(super) fn openai_stream_error(data: &Value, out: &mut Vec<u8>) {
    let found = Found::from_value(data);
    let status = status_of(found.kind.as_deref());
    let (kind, code) = openai_type(status, found.kind.as_deref(), found.code.as_deref());
    let message = found
        .message
        .unwrap_or_else(|| "the provider's stream failed".to_string());
    out.extend_from_slice(b"data: {\"error\":{\"message\":");
    push_quoted(out, &message);
    out.extend_from_slice(b",\"type\":");
    push_quoted(out, &kind);
    out.extend_from_slice(b",\"code\":");
    push_code(out, code.as_deref());
    out.extend_from_slice(b"}}\n\n");
}

/// The `error` event of Anthropic's API for an OpenAI stream's error chunk
/// (`{"error":{"message","type","code"}}`).
pub(super) fn anthropic_stream_error(data: &Value, out: &mut Vec<u8>) {
    let found = Found::from_value(data);
    let status = status_of(found.kind.as_deref().or(found.code.as_deref()));
    let kind = anthropic_type(status, found.kind.as_deref(), found.code.as_deref());
    let message = found
        .message
        .unwrap_or_else(|| "the provider's stream failed".to_string());
    out.extend_from_slice(b"event: error\ndata: ");
    out.extend_from_slice(&anthropic_error_body(&kind, &message));
    out.extend_from_slice(b"\n\n");
}

/// What an error body says, whatever its shape.
#[derive(Debug, Default)]
struct Found {
    message: Option<String>,
    kind: Option<String>,
    code: Option<String>,
    /// The API whose error shape the body has exactly.
    shape: Option<Wire>,
}

/// Longest plain-text body kept as the message.
const MAX_TEXT_MESSAGE: usize = 512;

impl Found {
    fn read(body: &[u8]) -> Found {
        match serde_json::from_slice::<Value>(body) {
            Ok(value @ Value::Object(_)) => Found::from_value(&value),
            Ok(_) => Found::default(),
            Err(_) => Found {
                message: plain_text(body),
                ..Found::default()
            },
        }
    }

    fn from_value(value: &Value) -> Found {
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
        match value.get("error") {
            Some(error @ Value::Object(_)) => {
                let message = text(error.get("message"));
                let kind = text(error.get("type"));
                let code = match error.get("code") {
                    Some(Value::String(code)) => Some(code.clone()),
                    Some(Value::Number(code)) => Some(code.to_string()),
                    _ => None,
                };
                // both shapes have `error.message` and `error.type`; Anthropic's says
                // `"type":"error"` at the top
                let shape = if message.is_none() || kind.is_none() {
                    None
                } else if value.get("type").and_then(Value::as_str) == Some("error") {
                    Some(Wire::Messages)
                } else {
                    Some(Wire::Chat)
                };
                Found {
                    message,
                    kind,
                    code,
                    shape,
                }
            }
            Some(Value::String(message)) => Found {
                message: Some(message.clone()),
                ..Found::default()
            },
            _ => Found {
                message: text(value.get("message")).or_else(|| text(value.get("detail"))),
                ..Found::default()
            },
        }
    }
}

/// A plain-text body as a message: trimmed, at most [`MAX_TEXT_MESSAGE`] bytes (cut at a
/// character boundary); `None` when nothing is left.
fn plain_text(body: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let mut end = text.len().min(MAX_TEXT_MESSAGE);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let text = text.get(..end).unwrap_or_default().trim_end();
    (!text.is_empty()).then(|| text.to_string())
}

const OPENAI_TYPES: [&str; 6] = [
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "rate_limit_error",
    "insufficient_quota",
    "server_error",
];

const ANTHROPIC_TYPES: [&str; 10] = [
    "invalid_request_error",
    "authentication_error",
    "billing_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "api_error",
    "overloaded_error",
    "timeout_error",
];

fn is_quota(kind: Option<&str>, code: Option<&str>) -> bool {
    matches!(kind, Some("insufficient_quota" | "billing_error"))
        || code == Some("insufficient_quota")
}

/// OpenAI's `type` and `code` for an error.
fn openai_type(status: u16, kind: Option<&str>, code: Option<&str>) -> (String, Option<String>) {
    if is_quota(kind, code) {
        return (
            "insufficient_quota".into(),
            Some("insufficient_quota".into()),
        );
    }
    let by_status = match status {
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    };
    let kind = kind
        .filter(|k| OPENAI_TYPES.contains(k))
        .unwrap_or(by_status);
    let code = code.map(str::to_string).or_else(|| {
        match status {
            401 => Some("invalid_api_key"),
            429 => Some("rate_limit_exceeded"),
            529 => Some("overloaded"),
            _ => None,
        }
        .map(str::to_string)
    });
    (kind.to_string(), code)
}

/// Anthropic's `type` for an error.
fn anthropic_type(status: u16, kind: Option<&str>, code: Option<&str>) -> String {
    if is_quota(kind, code) {
        return "billing_error".into();
    }
    if let Some(kind) = kind.filter(|k| ANTHROPIC_TYPES.contains(k)) {
        return kind.to_string();
    }
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
    .to_string()
}

/// The status an in-stream error of this type would have had (a stream's status was 200).
fn status_of(kind: Option<&str>) -> u16 {
    match kind {
        Some("invalid_request_error") => 400,
        Some("authentication_error" | "invalid_api_key") => 401,
        Some("billing_error") => 402,
        Some("permission_error") => 403,
        Some("not_found_error") => 404,
        Some("request_too_large") => 413,
        Some("rate_limit_error" | "rate_limit_exceeded" | "insufficient_quota") => 429,
        Some("timeout_error") => 504,
        Some("overloaded_error" | "overloaded") => 529,
        _ => 500,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parsed(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    fn openai(message: &str, kind: &str, code: Option<&str>) -> Value {
        json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
    }

    fn anthropic(kind: &str, message: &str) -> Value {
        json!({"type": "error", "error": {"type": kind, "message": message}})
    }

    #[test]
    fn anthropic_errors_become_openai_errors_by_status() {
        for (status, kind, expected_type, expected_code) in [
            (400, "invalid_request_error", "invalid_request_error", None),
            (
                401,
                "authentication_error",
                "authentication_error",
                Some("invalid_api_key"),
            ),
            (
                402,
                "billing_error",
                "insufficient_quota",
                Some("insufficient_quota"),
            ),
            (403, "permission_error", "permission_error", None),
            (404, "not_found_error", "invalid_request_error", None),
            (413, "request_too_large", "invalid_request_error", None),
            (422, "something_else", "invalid_request_error", None),
            (
                429,
                "rate_limit_error",
                "rate_limit_error",
                Some("rate_limit_exceeded"),
            ),
            (500, "api_error", "server_error", None),
            (503, "api_error", "server_error", None),
            (529, "overloaded_error", "server_error", Some("overloaded")),
            (418, "teapot", "invalid_request_error", None),
        ] {
            let body = serde_json::to_vec(&anthropic(kind, "why")).unwrap();
            let out = error(Wire::Messages, Wire::Chat, status, &body);
            assert_eq!(
                parsed(&out),
                openai("why", expected_type, expected_code),
                "{status} {kind}"
            );
        }
    }

    #[test]
    fn openai_errors_become_anthropic_errors_by_status() {
        for (status, kind, code, expected) in [
            (400, "invalid_request_error", None, "invalid_request_error"),
            (
                401,
                "invalid_request_error",
                Some("invalid_api_key"),
                "invalid_request_error",
            ),
            (401, "unknown", None, "authentication_error"),
            (402, "x", None, "billing_error"),
            (403, "x", None, "permission_error"),
            (404, "x", Some("model_not_found"), "not_found_error"),
            (413, "x", None, "request_too_large"),
            (
                429,
                "rate_limit_error",
                Some("rate_limit_exceeded"),
                "rate_limit_error",
            ),
            (
                429,
                "insufficient_quota",
                Some("insufficient_quota"),
                "billing_error",
            ),
            (429, "x", Some("insufficient_quota"), "billing_error"),
            (500, "server_error", None, "api_error"),
            (502, "server_error", None, "api_error"),
            (529, "server_error", None, "overloaded_error"),
            (409, "x", None, "invalid_request_error"),
        ] {
            let body = serde_json::to_vec(&openai("why", kind, code)).unwrap();
            let out = error(Wire::Chat, Wire::Messages, status, &body);
            assert_eq!(parsed(&out), anthropic(expected, "why"), "{status} {kind}");
        }
    }

    #[test]
    fn provider_codes_are_kept() {
        let body = serde_json::to_vec(&openai(
            "m",
            "invalid_request_error",
            Some("context_length_exceeded"),
        ))
        .unwrap();
        // the same API, other shape: normalized, code kept
        let out = error(Wire::Messages, Wire::Chat, 400, &body);
        assert_eq!(parsed(&out)["error"]["code"], "context_length_exceeded");
        let numeric = br#"{"error":{"message":"m","type":"x","code":1234}}"#;
        let out = error(Wire::Messages, Wire::Chat, 400, numeric);
        assert_eq!(parsed(&out)["error"]["code"], "1234");
    }

    #[test]
    fn any_body_gives_a_valid_error() {
        for (body, message) in [
            (&b""[..], "the provider answered HTTP 503 without a message"),
            (b"   ", "the provider answered HTTP 503 without a message"),
            (b"upstream connect error\n", "upstream connect error"),
            (b"[1,2]", "the provider answered HTTP 503 without a message"),
            (b"{\"message\":\"Throttled\"}", "Throttled"),
            (b"{\"detail\":\"Not here\"}", "Not here"),
            (b"{\"error\":\"plain string\"}", "plain string"),
            (
                b"{\"code\":\"InvalidParameter\",\"message\":\"qwen says\",\"request_id\":\"r\"}",
                "qwen says",
            ),
            (b"\xff\xfe binary", "\u{fffd}\u{fffd} binary"),
        ] {
            let out = error(Wire::Chat, Wire::Messages, 503, body);
            assert_eq!(parsed(&out), anthropic("api_error", message), "{body:?}");
            let out = error(Wire::Messages, Wire::Chat, 503, body);
            assert_eq!(
                parsed(&out),
                openai(message, "server_error", None),
                "{body:?}"
            );
        }
    }

    #[test]
    fn a_long_text_body_is_cut_at_a_character_boundary() {
        let body = "é".repeat(400); // 800 bytes
        let out = error(Wire::Chat, Wire::Messages, 500, body.as_bytes());
        let message = parsed(&out)["error"]["message"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(message, "é".repeat(256));
    }

    #[test]
    fn a_body_already_in_the_client_shape_passes_unchanged() {
        let anthropic_body = br#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}"#;
        assert_eq!(
            error(Wire::Messages, Wire::Messages, 529, anthropic_body),
            anthropic_body
        );
        let openai_body = br#"{"error":{"message":"m","type":"invalid_request_error","param":"messages","code":null}}"#;
        assert_eq!(error(Wire::Chat, Wire::Chat, 400, openai_body), openai_body);
        // the same API but not its shape: normalized
        let out = error(Wire::Messages, Wire::Messages, 400, openai_body);
        assert_eq!(parsed(&out), anthropic("invalid_request_error", "m"));
        let out = error(Wire::Chat, Wire::Chat, 500, b"oops");
        assert_eq!(parsed(&out), openai("oops", "server_error", None));
        // without a type it is not quite the shape: the type is added by status
        let out = error(
            Wire::Chat,
            Wire::Chat,
            429,
            br#"{"error":{"message":"slow"}}"#,
        );
        assert_eq!(
            parsed(&out),
            openai("slow", "rate_limit_error", Some("rate_limit_exceeded"))
        );
    }

    #[test]
    fn stream_errors_are_mapped_by_type() {
        let mut out = Vec::new();
        openai_stream_error(&anthropic("overloaded_error", "Overloaded"), &mut out);
        assert_eq!(
            out,
            b"data: {\"error\":{\"message\":\"Overloaded\",\"type\":\"server_error\",\"code\":\"overloaded\"}}\n\n"
        );
        out.clear();
        openai_stream_error(&json!({"type": "error"}), &mut out);
        assert_eq!(
            out,
            b"data: {\"error\":{\"message\":\"the provider's stream failed\",\"type\":\"server_error\",\"code\":null}}\n\n"
        );
        for (data, kind) in [
            (
                json!({"error": {"message": "slow down", "type": "rate_limit_error"}}),
                "rate_limit_error",
            ),
            (
                json!({"error": {"message": "slow down", "type": null, "code": "insufficient_quota"}}),
                "billing_error",
            ),
            (
                json!({"error": {"message": "slow down", "type": "server_error"}}),
                "api_error",
            ),
            (json!({"error": {"message": "slow down"}}), "api_error"),
        ] {
            out.clear();
            anthropic_stream_error(&data, &mut out);
            let text = String::from_utf8(out.clone()).unwrap();
            let json_text = text
                .strip_prefix("event: error\ndata: ")
                .unwrap()
                .strip_suffix("\n\n")
                .unwrap();
            assert_eq!(
                parsed(json_text.as_bytes()),
                anthropic(kind, "slow down"),
                "{data}"
            );
        }
    }
}
