//! What api.anthropic.com refuses in a Messages (or count_tokens) request: `400
//! invalid_request_error` with its `"<path>: <what>"` message (paths as Anthropic writes them:
//! `messages.1.content.0.tool_use.input`, a block's path naming its type).

use serde_json::{Map, Value};

use super::fields::{field, is_tool_name};
use crate::error::ApiError;

/// Which endpoint the body is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `POST /v1/messages`: `max_tokens` required.
    Messages,
    /// `POST /v1/messages/count_tokens`: no generation parameters.
    CountTokens,
}

const MESSAGES_FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "system",
    "tools",
    "tool_choice",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "metadata",
    "stream",
    "thinking",
    "service_tier",
];
const COUNT_TOKENS_FIELDS: &[&str] = &[
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
];

/// Content block types of a message.
const BLOCK_TYPES: &[&str] = &[
    "text",
    "image",
    "document",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
];
/// Content block types of a `tool_result`'s `content`.
const TOOL_RESULT_BLOCK_TYPES: &[&str] = &["text", "image", "document"];
const SYSTEM_BLOCK_TYPES: &[&str] = &["text"];
const IMAGE_MEDIA_TYPES: &[&str] = &["image/jpeg", "image/png", "image/gif", "image/webp"];

const REQUIRED: &str = "Field required";
const EXTRA: &str = "Extra inputs are not permitted";
const STRING: &str = "Input should be a valid string";
const OBJECT: &str = "Input should be a valid dictionary or object";
const LIST: &str = "Input should be a valid list";

fn refuse(path: &str, what: &str) -> ApiError {
    ApiError::bad_request(format!("{path}: {what}"), None, None)
}

/// Checks a Messages / count_tokens body (a JSON object).
pub(crate) fn check(req: &Value, endpoint: Endpoint) -> Result<(), ApiError> {
    let Value::Object(req) = req else {
        return Err(ApiError::bad_request(OBJECT.to_owned(), None, None));
    };
    match req.get("model") {
        None | Some(Value::Null) => return Err(refuse("model", REQUIRED)),
        Some(Value::String(_)) => {}
        Some(_) => return Err(refuse("model", STRING)),
    }
    if endpoint == Endpoint::Messages {
        match req.get("max_tokens") {
            None | Some(Value::Null) => return Err(refuse("max_tokens", REQUIRED)),
            Some(v) => match v.as_i64() {
                None => return Err(refuse("max_tokens", "Input should be a valid integer")),
                Some(n) if n < 1 => {
                    return Err(refuse(
                        "max_tokens",
                        "Input should be greater than or equal to 1",
                    ))
                }
                Some(_) => {}
            },
        }
    }
    let messages = match req.get("messages") {
        None | Some(Value::Null) => return Err(refuse("messages", REQUIRED)),
        Some(Value::Array(messages)) => messages,
        Some(_) => return Err(refuse("messages", LIST)),
    };
    if messages.is_empty() {
        return Err(refuse("messages", "at least one message is required"));
    }
    for (i, message) in messages.iter().enumerate() {
        check_message(i, message, i + 1 == messages.len())?;
    }
    check_tool_pairs(messages)?;
    if let Some(system) = field(req, "system") {
        check_system(system)?;
    }
    if let Some(tools) = field(req, "tools") {
        check_tools(tools)?;
    }
    if let Some(choice) = field(req, "tool_choice") {
        check_tool_choice(choice)?;
    }
    if let Some(stops) = field(req, "stop_sequences") {
        let Value::Array(stops) = stops else {
            return Err(refuse("stop_sequences", LIST));
        };
        if let Some(k) = stops.iter().position(|s| !s.is_string()) {
            return Err(refuse(&format!("stop_sequences.{k}"), STRING));
        }
    }
    check_number(req, "temperature", Some(1.0))?;
    check_number(req, "top_p", Some(1.0))?;
    if let Some(top_k) = field(req, "top_k") {
        match top_k.as_i64() {
            None => return Err(refuse("top_k", "Input should be a valid integer")),
            Some(k) if k < 0 => {
                return Err(refuse(
                    "top_k",
                    "Input should be greater than or equal to 0",
                ))
            }
            Some(_) => {}
        }
    }
    if let Some(metadata) = field(req, "metadata") {
        let Value::Object(metadata) = metadata else {
            return Err(refuse("metadata", OBJECT));
        };
        for (key, value) in metadata {
            if key != "user_id" {
                return Err(refuse(&format!("metadata.{key}"), EXTRA));
            }
            if !(value.is_string() || value.is_null()) {
                return Err(refuse("metadata.user_id", STRING));
            }
        }
    }
    if field(req, "stream").is_some_and(|s| !s.is_boolean()) {
        return Err(refuse("stream", "Input should be a valid boolean"));
    }
    if field(req, "thinking").is_some_and(|t| !t.is_object()) {
        return Err(refuse("thinking", OBJECT));
    }
    if let Some(tier) = field(req, "service_tier") {
        if !matches!(tier.as_str(), Some("auto" | "standard_only")) {
            return Err(refuse(
                "service_tier",
                "Input should be 'auto' or 'standard_only'",
            ));
        }
    }
    let allowed = match endpoint {
        Endpoint::Messages => MESSAGES_FIELDS,
        Endpoint::CountTokens => COUNT_TOKENS_FIELDS,
    };
    match req.keys().find(|key| !allowed.contains(&key.as_str())) {
        Some(key) => Err(refuse(key, EXTRA)),
        None => Ok(()),
    }
}

/// An optional number in `0..=max`.
fn check_number(req: &Map<String, Value>, name: &str, max: Option<f64>) -> Result<(), ApiError> {
    let Some(value) = field(req, name) else {
        return Ok(());
    };
    let Some(x) = value.as_f64() else {
        return Err(refuse(name, "Input should be a valid number"));
    };
    if x < 0.0 {
        return Err(refuse(name, "Input should be greater than or equal to 0"));
    }
    match max {
        Some(max) if x > max => Err(refuse(
            name,
            &format!("Input should be less than or equal to {max}"),
        )),
        _ => Ok(()),
    }
}

fn check_message(i: usize, message: &Value, last: bool) -> Result<(), ApiError> {
    let path = format!("messages.{i}");
    let Value::Object(message) = message else {
        return Err(refuse(&path, OBJECT));
    };
    let role = match message.get("role") {
        None | Some(Value::Null) => return Err(refuse(&format!("{path}.role"), REQUIRED)),
        Some(Value::String(role)) if role == "user" || role == "assistant" => role.as_str(),
        Some(_) => {
            return Err(refuse(
                &format!("{path}.role"),
                "Input should be 'user' or 'assistant'",
            ))
        }
    };
    let empty = match message.get("content") {
        None | Some(Value::Null) => return Err(refuse(&format!("{path}.content"), REQUIRED)),
        Some(Value::String(text)) => text.is_empty(),
        Some(Value::Array(blocks)) => {
            for (j, block) in blocks.iter().enumerate() {
                check_block(&format!("{path}.content.{j}"), block, BLOCK_TYPES)?;
            }
            blocks.is_empty()
        }
        Some(_) => {
            return Err(refuse(
                &format!("{path}.content"),
                "Input should be a valid string or a list of content blocks",
            ))
        }
    };
    if empty && !(last && role == "assistant") {
        return Err(refuse(
            &path,
            "all messages must have non-empty content except for the optional final assistant message",
        ));
    }
    match message.keys().find(|k| *k != "role" && *k != "content") {
        Some(key) => Err(refuse(&format!("{path}.{key}"), EXTRA)),
        None => Ok(()),
    }
}

/// A content block at `path` whose type must be one of `types`.
fn check_block(path: &str, block: &Value, types: &[&str]) -> Result<(), ApiError> {
    let Value::Object(block) = block else {
        return Err(refuse(path, OBJECT));
    };
    let kind = match block.get("type") {
        None | Some(Value::Null) => return Err(refuse(&format!("{path}.type"), REQUIRED)),
        Some(Value::String(kind)) => kind.as_str(),
        Some(_) => return Err(refuse(&format!("{path}.type"), STRING)),
    };
    if !types.contains(&kind) {
        return Err(refuse(path, &tag_mismatch(kind, types)));
    }
    let (required, optional): (&[&str], &[&str]) = match kind {
        "text" => (&["text"], &["cache_control", "citations"]),
        "image" => (&["source"], &["cache_control"]),
        "document" => (
            &["source"],
            &["cache_control", "title", "context", "citations"],
        ),
        "tool_use" => (&["id", "name", "input"], &["cache_control"]),
        "tool_result" => (&["tool_use_id"], &["content", "is_error", "cache_control"]),
        "thinking" => (&["thinking", "signature"], &[]),
        "redacted_thinking" => (&["data"], &[]),
        _ => (&[], &[]),
    };
    // a block's path names its type, as Anthropic's tagged unions do
    let at = |name: &str| format!("{path}.{kind}.{name}");
    if let Some(missing) = required.iter().find(|f| field(block, f).is_none()) {
        return Err(refuse(&at(missing), REQUIRED));
    }
    if let Some(extra) = block.keys().find(|k| {
        *k != "type" && !required.contains(&k.as_str()) && !optional.contains(&k.as_str())
    }) {
        return Err(refuse(&at(extra), EXTRA));
    }
    let string = |name: &str| match block.get(name) {
        Some(Value::String(_)) => Ok(()),
        _ => Err(refuse(&at(name), STRING)),
    };
    match kind {
        "text" => {
            string("text")?;
            if block
                .get("text")
                .and_then(Value::as_str)
                .is_some_and(|t| t.trim().is_empty())
            {
                return Err(refuse(path, "text content blocks must be non-empty"));
            }
        }
        "image" => check_image_source(&at("source"), block.get("source"))?,
        "document" => match block.get("source") {
            Some(Value::Object(source)) if source.get("type").is_some_and(Value::is_string) => {}
            _ => return Err(refuse(&at("source"), OBJECT)),
        },
        "tool_use" => {
            string("id")?;
            string("name")?;
            if !block.get("input").is_some_and(Value::is_object) {
                return Err(refuse(&at("input"), "Input should be a valid dictionary"));
            }
        }
        "tool_result" => {
            string("tool_use_id")?;
            match field(block, "content") {
                None | Some(Value::String(_)) => {}
                Some(Value::Array(parts)) => {
                    for (k, part) in parts.iter().enumerate() {
                        check_block(
                            &format!("{}.{k}", at("content")),
                            part,
                            TOOL_RESULT_BLOCK_TYPES,
                        )?;
                    }
                }
                Some(_) => {
                    return Err(refuse(
                        &at("content"),
                        "Input should be a valid string or a list of content blocks",
                    ))
                }
            }
            if field(block, "is_error").is_some_and(|e| !e.is_boolean()) {
                return Err(refuse(&at("is_error"), "Input should be a valid boolean"));
            }
        }
        "thinking" => {
            string("thinking")?;
            string("signature")?;
        }
        "redacted_thinking" => string("data")?,
        _ => {}
    }
    Ok(())
}

/// An image block's `source`: base64 (`media_type`, `data`), url (`url`) or file (`file_id`).
fn check_image_source(path: &str, source: Option<&Value>) -> Result<(), ApiError> {
    let Some(Value::Object(source)) = source else {
        return Err(refuse(path, OBJECT));
    };
    const SOURCES: &[&str] = &["base64", "url", "file"];
    let kind = match source.get("type") {
        None | Some(Value::Null) => return Err(refuse(&format!("{path}.type"), REQUIRED)),
        Some(Value::String(kind)) if SOURCES.contains(&kind.as_str()) => kind.as_str(),
        Some(Value::String(kind)) => return Err(refuse(path, &tag_mismatch(kind, SOURCES))),
        Some(_) => return Err(refuse(&format!("{path}.type"), STRING)),
    };
    let required: &[&str] = match kind {
        "base64" => &["media_type", "data"],
        "url" => &["url"],
        _ => &["file_id"],
    };
    let at = |name: &str| format!("{path}.{kind}.{name}");
    for name in required {
        match source.get(*name) {
            None | Some(Value::Null) => return Err(refuse(&at(name), REQUIRED)),
            Some(Value::String(_)) => {}
            Some(_) => return Err(refuse(&at(name), STRING)),
        }
    }
    if kind == "base64"
        && !source
            .get("media_type")
            .and_then(Value::as_str)
            .is_some_and(|m| IMAGE_MEDIA_TYPES.contains(&m))
    {
        return Err(refuse(
            &at("media_type"),
            "Input should be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp'",
        ));
    }
    match source
        .keys()
        .find(|k| *k != "type" && !required.contains(&k.as_str()))
    {
        Some(extra) => Err(refuse(&at(extra), EXTRA)),
        None => Ok(()),
    }
}

/// Pydantic's message for a tagged union whose tag is none of `expected`.
fn tag_mismatch(found: &str, expected: &[&str]) -> String {
    let expected: Vec<String> = expected.iter().map(|t| format!("'{t}'")).collect();
    format!(
        "Input tag '{found}' found using 'type' does not match any of the expected tags: {}",
        expected.join(", ")
    )
}

/// `system`: a string or text blocks.
fn check_system(system: &Value) -> Result<(), ApiError> {
    match system {
        Value::String(_) => Ok(()),
        Value::Array(blocks) => blocks.iter().enumerate().try_for_each(|(k, block)| {
            check_block(&format!("system.{k}"), block, SYSTEM_BLOCK_TYPES)
        }),
        _ => Err(refuse(
            "system",
            "Input should be a valid string or a list of text blocks",
        )),
    }
}

/// `tools`: custom tools `{name, input_schema, description?}` (`type` absent or `custom`), or
/// server tools, whose `type` is versioned (`web_search_20250305`).
fn check_tools(tools: &Value) -> Result<(), ApiError> {
    let Value::Array(tools) = tools else {
        return Err(refuse("tools", LIST));
    };
    for (k, tool) in tools.iter().enumerate() {
        let path = format!("tools.{k}");
        let Value::Object(tool) = tool else {
            return Err(refuse(&path, OBJECT));
        };
        match field(tool, "type") {
            None => {}
            Some(Value::String(kind)) if kind == "custom" => {}
            Some(Value::String(kind)) if is_server_tool(kind) => continue,
            Some(Value::String(kind)) => {
                return Err(refuse(
                    &path,
                    &tag_mismatch(
                        kind,
                        &[
                            "custom",
                            "bash_20250124",
                            "text_editor_20250728",
                            "web_search_20250305",
                            "…",
                        ],
                    ),
                ))
            }
            Some(_) => return Err(refuse(&format!("{path}.type"), STRING)),
        }
        let at = |name: &str| format!("{path}.custom.{name}");
        match field(tool, "name") {
            None => return Err(refuse(&at("name"), REQUIRED)),
            Some(Value::String(name)) if is_tool_name(name, 128) => {}
            Some(Value::String(_)) => {
                return Err(refuse(
                    &at("name"),
                    "String should match pattern '^[a-zA-Z0-9_-]{1,128}$'",
                ))
            }
            Some(_) => return Err(refuse(&at("name"), STRING)),
        }
        match field(tool, "input_schema") {
            None => return Err(refuse(&at("input_schema"), REQUIRED)),
            Some(Value::Object(_)) => {}
            Some(_) => return Err(refuse(&at("input_schema"), OBJECT)),
        }
        if field(tool, "description").is_some_and(|d| !d.is_string()) {
            return Err(refuse(&at("description"), STRING));
        }
        const FIELDS: &[&str] = &[
            "type",
            "name",
            "input_schema",
            "description",
            "cache_control",
        ];
        if let Some(extra) = tool.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(refuse(&at(extra), EXTRA));
        }
    }
    Ok(())
}

/// A server tool's type: a name, `_`, an 8-digit date (`web_search_20250305`).
fn is_server_tool(kind: &str) -> bool {
    kind.rsplit_once('_').is_some_and(|(name, date)| {
        !name.is_empty() && date.len() == 8 && date.bytes().all(|b| b.is_ascii_digit())
    })
}

/// `tool_choice`: `{type: auto | any | none | tool (+ name)}`.
fn check_tool_choice(choice: &Value) -> Result<(), ApiError> {
    let Value::Object(choice) = choice else {
        return Err(refuse("tool_choice", OBJECT));
    };
    const TYPES: &[&str] = &["auto", "any", "tool", "none"];
    let kind = match choice.get("type") {
        None | Some(Value::Null) => return Err(refuse("tool_choice.type", REQUIRED)),
        Some(Value::String(kind)) if TYPES.contains(&kind.as_str()) => kind.as_str(),
        Some(Value::String(kind)) => return Err(refuse("tool_choice", &tag_mismatch(kind, TYPES))),
        Some(_) => return Err(refuse("tool_choice.type", STRING)),
    };
    let at = |name: &str| format!("tool_choice.{kind}.{name}");
    if kind == "tool" {
        match field(choice, "name") {
            None => return Err(refuse(&at("name"), REQUIRED)),
            Some(Value::String(_)) => {}
            Some(_) => return Err(refuse(&at("name"), STRING)),
        }
    }
    let allowed: &[&str] = match kind {
        "tool" => &["type", "name", "disable_parallel_tool_use"],
        "none" => &["type"],
        _ => &["type", "disable_parallel_tool_use"],
    };
    if let Some(extra) = choice.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(refuse(&at(extra), EXTRA));
    }
    if field(choice, "disable_parallel_tool_use").is_some_and(|d| !d.is_boolean()) {
        return Err(refuse(
            &at("disable_parallel_tool_use"),
            "Input should be a valid boolean",
        ));
    }
    Ok(())
}

/// The ids of a message's blocks of `kind` (`tool_use`: `id`; `tool_result`: `tool_use_id`),
/// with their indexes.
fn block_ids<'v>(message: &'v Value, kind: &str, id_field: &str) -> Vec<(usize, &'v str)> {
    let Some(Value::Array(blocks)) = message.get("content") else {
        return Vec::new();
    };
    blocks
        .iter()
        .enumerate()
        .filter(|(_, b)| b.get("type").and_then(Value::as_str) == Some(kind))
        .filter_map(|(j, b)| b.get(id_field).and_then(Value::as_str).map(|id| (j, id)))
        .collect()
}

/// Each `tool_result` answers a `tool_use` of the message just before it, and each `tool_use`
/// followed by a message is answered there.
fn check_tool_pairs(messages: &[Value]) -> Result<(), ApiError> {
    for (i, message) in messages.iter().enumerate() {
        let results = block_ids(message, "tool_result", "tool_use_id");
        if !results.is_empty() {
            let uses = i
                .checked_sub(1)
                .and_then(|p| messages.get(p))
                .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
                .map(|m| block_ids(m, "tool_use", "id"))
                .unwrap_or_default();
            if let Some((j, id)) = results
                .iter()
                .find(|(_, id)| !uses.iter().any(|(_, u)| u == id))
            {
                return Err(refuse(
                    &format!("messages.{i}.content.{j}"),
                    &format!(
                        "unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                    ),
                ));
            }
        }
        if message.get("role").and_then(Value::as_str) != Some("assistant") {
            continue;
        }
        let Some(next) = messages.get(i + 1) else {
            continue;
        };
        let answered = block_ids(next, "tool_result", "tool_use_id");
        let missing: Vec<&str> = block_ids(message, "tool_use", "id")
            .into_iter()
            .map(|(_, id)| id)
            .filter(|id| !answered.iter().any(|(_, a)| a == id))
            .collect();
        if !missing.is_empty() {
            return Err(refuse(
                &format!("messages.{i}"),
                &format!(
                    "`tool_use` ids were found without `tool_result` blocks immediately after: {}. Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
                    missing.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message_of(extra: Value) -> Value {
        let mut body = json!({
            "model": "claude", "max_tokens": 16,
            "messages": [{"role": "user", "content": "hi"}]
        });
        if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
            body.extend(extra);
        }
        body
    }

    fn refusal(body: &Value) -> String {
        check(body, Endpoint::Messages)
            .expect_err("refused")
            .message
    }

    #[test]
    fn accepts_a_full_request() {
        let body = message_of(json!({
            "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "weather?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
                    {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
                ]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "sunny"}], "is_error": false}
                ]},
                {"role": "assistant", "content": ""}
            ],
            "tools": [
                {"name": "get_weather", "description": "d", "input_schema": {"type": "object"}},
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
            ],
            "tool_choice": {"type": "tool", "name": "get_weather"},
            "stop_sequences": ["\n\nHuman:"], "temperature": 1, "top_p": 0.9, "top_k": 5,
            "metadata": {"user_id": "u"}, "stream": true,
            "thinking": {"type": "enabled", "budget_tokens": 1024}, "service_tier": "auto"
        }));
        assert_eq!(
            check(&body, Endpoint::Messages).map_err(|e| e.message),
            Ok(())
        );
    }

    #[test]
    fn refusals_name_the_field() {
        let cases: Vec<(Value, &str)> = vec![
            (json!({"max_tokens": null}), "max_tokens: Field required"),
            (json!({"max_tokens": 0}), "max_tokens: Input should be greater than or equal to 1"),
            (json!({"max_tokens": "8"}), "max_tokens: Input should be a valid integer"),
            (json!({"model": 3}), "model: Input should be a valid string"),
            (json!({"messages": []}), "messages: at least one message is required"),
            (json!({"messages": [{"role": "system", "content": "x"}]}), "messages.0.role: Input should be 'user' or 'assistant'"),
            (json!({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "x"}]}), "messages.1.role: Input should be 'user' or 'assistant'"),
            (json!({"messages": [{"role": "user"}]}), "messages.0.content: Field required"),
            (json!({"messages": [{"role": "user", "content": ""}]}), "messages.0: all messages must have non-empty content except for the optional final assistant message"),
            (json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
             "messages.0.content.0: Input tag 'image_url' found using 'type' does not match any of the expected tags: 'text', 'image', 'document', 'tool_use', 'tool_result', 'thinking', 'redacted_thinking'"),
            (json!({"messages": [{"role": "user", "content": [{"text": "x"}]}]}), "messages.0.content.0.type: Field required"),
            (json!({"messages": [{"role": "user", "content": [{"type": "text"}]}]}), "messages.0.content.0.text.text: Field required"),
            (json!({"messages": [{"role": "user", "content": [{"type": "text", "text": " "}]}]}), "messages.0.content.0: text content blocks must be non-empty"),
            (json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "x"}}]}]}),
             "messages.0.content.0.image.source.base64.media_type: Input should be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp'"),
            (json!({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": "{}"}]}]}),
             "messages.1.content.0.tool_use.input: Input should be a valid dictionary"),
            (json!({"messages": [{"role": "user", "content": "x", "name": "bob"}]}), "messages.0.name: Extra inputs are not permitted"),
            (json!({"temperature": 1.5}), "temperature: Input should be less than or equal to 1"),
            (json!({"temperature": "hot"}), "temperature: Input should be a valid number"),
            (json!({"metadata": {"session": "s"}}), "metadata.session: Extra inputs are not permitted"),
            (json!({"stop_sequences": "STOP"}), "stop_sequences: Input should be a valid list"),
            (json!({"tool_choice": "auto"}), "tool_choice: Input should be a valid dictionary or object"),
            (json!({"tool_choice": {"type": "required"}}), "tool_choice: Input tag 'required' found using 'type' does not match any of the expected tags: 'auto', 'any', 'tool', 'none'"),
            (json!({"tool_choice": {"type": "tool"}}), "tool_choice.tool.name: Field required"),
            (json!({"tools": [{"type": "function", "function": {"name": "f"}}]}), "tools.0: Input tag 'function' found using 'type' does not match any of the expected tags: 'custom', 'bash_20250124', 'text_editor_20250728', 'web_search_20250305', '…'"),
            (json!({"tools": [{"name": "f", "parameters": {}}]}), "tools.0.custom.input_schema: Field required"),
            (json!({"system": [{"type": "image", "source": {}}]}), "system.0: Input tag 'image' found using 'type' does not match any of the expected tags: 'text'"),
        ];
        for (extra, message) in cases {
            assert_eq!(refusal(&message_of(extra.clone())), message, "{extra}");
        }
        for field in [
            "stream_options",
            "n",
            "max_completion_tokens",
            "response_format",
            "tool_calls",
            "frequency_penalty",
            "user",
            "seed",
        ] {
            let mut body = message_of(json!({}));
            if let Some(obj) = body.as_object_mut() {
                obj.insert(field.to_owned(), json!(1));
            }
            assert_eq!(
                refusal(&body),
                format!("{field}: Extra inputs are not permitted")
            );
        }
    }

    #[test]
    fn count_tokens_takes_no_generation_parameters() {
        let body = json!({"model": "claude", "messages": [{"role": "user", "content": "hi"}]});
        assert!(check(&body, Endpoint::CountTokens).is_ok());
        let body = message_of(json!({}));
        assert_eq!(
            check(&body, Endpoint::CountTokens).map_err(|e| e.message),
            Err("max_tokens: Extra inputs are not permitted".to_owned())
        );
    }

    #[test]
    fn tool_results_answer_the_previous_tool_uses() {
        let turn = |uses: &[&str], results: &[&str]| {
            let uses: Vec<Value> = uses
                .iter()
                .map(|id| json!({"type": "tool_use", "id": id, "name": "f", "input": {}}))
                .collect();
            let mut results: Vec<Value> = results
                .iter()
                .map(|id| json!({"type": "tool_result", "tool_use_id": id, "content": "ok"}))
                .collect();
            results.push(json!({"type": "text", "text": "go on"}));
            message_of(json!({"messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": uses},
                {"role": "user", "content": results}
            ]}))
        };
        assert!(check(&turn(&["a", "b"], &["a", "b"]), Endpoint::Messages).is_ok());
        assert_eq!(
            refusal(&turn(&["a"], &["a", "z"])),
            "messages.2.content.1: unexpected `tool_use_id` found in `tool_result` blocks: z. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
        );
        assert_eq!(
            refusal(&turn(&["a", "b"], &["a"])),
            "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: b. Each `tool_use` block must have a corresponding `tool_result` block in the next message."
        );
        // a tool_result with no assistant turn before it
        let body = message_of(json!({"messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a"}]}
        ]}));
        assert!(refusal(&body).starts_with("messages.0.content.0: unexpected `tool_use_id`"));
        // a tool_use as the last turn is fine (nothing follows it yet)
        assert!(check(&turn(&["a"], &["a"]), Endpoint::Messages).is_ok());
    }

    #[test]
    fn server_tool_types() {
        assert!(is_server_tool("web_search_20250305"));
        assert!(!is_server_tool("function"));
        assert!(!is_server_tool("_20250305"));
        assert!(!is_server_tool("web_search_2025"));
        assert!(is_tool_name("get-weather_2", 128));
        assert!(!is_tool_name("get weather", 128));
        assert!(!is_tool_name("", 128));
    }
}
