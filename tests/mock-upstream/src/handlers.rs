//! The API handlers, and what they share: request field access, error bodies, token counts.

mod anthropic;
mod openai;
mod tool;

pub(crate) use anthropic::{count_tokens, messages};
pub(crate) use openai::{chat, embeddings, responses};

use serde_json::Value;

pub(crate) use crate::error::ApiError;
use crate::json::Sse;
use crate::knobs::Knobs;

/// What a handler learned from the server.
pub(crate) struct Ctx<'a> {
    pub(crate) knobs: &'a Knobs,
    /// Per-server counter, for the answer ids.
    pub(crate) id: u64,
    /// Unix seconds.
    pub(crate) created: u64,
    /// Azure: the deployment named by the path, the answer's `model` when the body has none.
    pub(crate) deployment: Option<&'a str>,
}

/// A successful answer, before the pacing / cutting knobs are applied.
pub(crate) enum Reply {
    /// `200`, `application/json`.
    Json(String),
    /// `200`, `text/event-stream`.
    Sse(Sse),
}

/// The required string `model`.
pub(crate) fn model(req: &Value) -> Result<&str, ApiError> {
    match req.get("model") {
        Some(Value::String(model)) => Ok(model),
        None | Some(Value::Null) => Err(ApiError::invalid(
            "you must provide a model parameter",
            Some("model"),
        )),
        Some(_) => Err(ApiError::invalid("'model' must be a string", Some("model"))),
    }
}

/// The answer's `model`: the body's, else (Azure) the deployment's name; the body's must be a
/// string.
pub(crate) fn model_or_deployment<'v>(
    req: &'v Value,
    deployment: Option<&'v str>,
) -> Result<&'v str, ApiError> {
    match (req.get("model"), deployment) {
        (None | Some(Value::Null), Some(deployment)) => Ok(deployment),
        _ => model(req),
    }
}

/// A required array field.
pub(crate) fn array<'v>(req: &'v Value, field: &str) -> Result<&'v [Value], ApiError> {
    match req.get(field) {
        Some(Value::Array(items)) => Ok(items),
        None | Some(Value::Null) => Err(ApiError::invalid(
            &format!("missing required parameter: '{field}'"),
            Some(field),
        )),
        Some(_) => Err(ApiError::invalid(
            &format!("'{field}' must be an array"),
            Some(field),
        )),
    }
}

/// An optional boolean field (absent or null: false).
pub(crate) fn opt_bool(obj: &Value, field: &str, param: &str) -> Result<bool, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid(
            &format!("'{param}' must be a boolean"),
            Some(param),
        )),
    }
}

/// An optional non-negative integer field (absent or null: none).
pub(crate) fn opt_u64(obj: &Value, field: &str) -> Result<Option<u64>, ApiError> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            ApiError::invalid(
                &format!("'{field}' must be a non-negative integer"),
                Some(field),
            )
        }),
    }
}

/// `ceil(chars / 4)`.
pub(crate) fn text_tokens(chars: usize) -> u64 {
    u64::try_from(chars.div_ceil(4)).unwrap_or(u64::MAX)
}

/// Number of characters of the text in a message `content`: a string, or an array of parts of
/// which those whose `type` is one of `text_types` count their `text` (bare strings count too).
pub(crate) fn content_chars(content: &Value, text_types: &[&str]) -> usize {
    match content {
        Value::String(s) => s.chars().count(),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match part {
                Value::String(s) => s.chars().count(),
                Value::Object(o) => {
                    let is_text = o
                        .get("type")
                        .and_then(Value::as_str)
                        .is_some_and(|t| text_types.contains(&t));
                    match o.get("text") {
                        Some(Value::String(s)) if is_text => s.chars().count(),
                        _ => 0,
                    }
                }
                _ => 0,
            })
            .sum(),
        _ => 0,
    }
}

/// The text of a message `content` (a string, or the concatenated text parts).
pub(crate) fn content_text(content: &Value, text_types: &[&str]) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|part| match part {
                Value::String(s) => Some(s.as_str()),
                Value::Object(o) => {
                    let is_text = o
                        .get("type")
                        .and_then(Value::as_str)
                        .is_some_and(|t| text_types.contains(&t));
                    o.get("text").and_then(Value::as_str).filter(|_| is_text)
                }
                _ => None,
            })
            .collect(),
        _ => String::new(),
    }
}

/// The text of the last message whose `role` is `user` (empty if none): what `x-mock-echo`
/// answers with.
pub(crate) fn last_user_text(messages: &[Value], text_types: &[&str]) -> String {
    messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .and_then(|m| m.get("content"))
        .map(|c| content_text(c, text_types))
        .unwrap_or_default()
}

/// Tokens of one message: `ceil(text chars / 4) + 4`.
pub(crate) fn message_tokens(content: Option<&Value>, text_types: &[&str]) -> u64 {
    text_tokens(content.map_or(0, |c| content_chars(c, text_types))).saturating_add(4)
}

/// The prompt count of a conversation: the sum of its messages' tokens (each message's
/// `content`), at least 1.
pub(crate) fn conversation_tokens<'v>(
    contents: impl IntoIterator<Item = Option<&'v Value>>,
    text_types: &[&str],
) -> u64 {
    contents
        .into_iter()
        .map(|c| message_tokens(c, text_types))
        .fold(0u64, u64::saturating_add)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prompt_formula() {
        // "hello" = 5 chars -> 2 + 4; parts: "abcd" + "efghi" = 9 chars -> 3 + 4 (image ignored);
        // no content -> 0 + 4.
        let messages = json!([
            {"role": "user", "content": "hello"},
            {"role": "user", "content": [
                {"type": "text", "text": "abcd"},
                {"type": "image_url", "image_url": {"url": "data:..."}},
                {"type": "text", "text": "efghi"}
            ]},
            {"role": "assistant", "tool_calls": []}
        ]);
        let messages = messages.as_array().expect("array");
        let total = conversation_tokens(messages.iter().map(|m| m.get("content")), &["text"]);
        assert_eq!(total, 6 + 7 + 4);
        assert_eq!(conversation_tokens([], &["text"]), 1);
        // Unicode scalar values, not bytes: 4 chars, 12 bytes.
        assert_eq!(message_tokens(Some(&json!("漢字漢字")), &["text"]), 1 + 4);
        assert_eq!(message_tokens(Some(&json!("")), &["text"]), 4);
    }
}
