//! What api.openai.com (and Azure OpenAI, which validates the same body) refuses in a Chat
//! Completions or embeddings request: `400 invalid_request_error` with OpenAI's message,
//! `param` naming the field and `code` as OpenAI sets it (`null`, `invalid_value`,
//! `invalid_type`, `missing_required_parameter`, …).

use serde_json::{Map, Value};

use super::fields::{field, is_tool_name};
use crate::error::ApiError;

/// Every top-level field Chat Completions takes.
const CHAT_FIELDS: &[&str] = &[
    "model",
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "function_call",
    "stream",
    "stream_options",
    "stop",
    "temperature",
    "top_p",
    "n",
    "max_tokens",
    "max_completion_tokens",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "seed",
    "user",
    "metadata",
    "response_format",
    "service_tier",
    "store",
    "reasoning_effort",
    "prompt_cache_key",
    "safety_identifier",
    "verbosity",
    "modalities",
    "audio",
    "prediction",
    "web_search_options",
];

const EMBEDDINGS_FIELDS: &[&str] = &["model", "input", "encoding_format", "dimensions", "user"];

const ROLES: &[&str] = &[
    "system",
    "assistant",
    "user",
    "function",
    "tool",
    "developer",
];

/// What a field must be (`null` is always taken as absent).
#[derive(Clone, Copy)]
enum Kind {
    Bool,
    Str,
    Object,
    Array,
    /// An integer in `min..=max`.
    Int(i64, i64),
    /// A number in `min..=max`.
    Num(f64, f64),
}

/// The fields checked by type (and range) alone.
const CHAT_SCALARS: &[(&str, Kind)] = &[
    ("stream", Kind::Bool),
    ("temperature", Kind::Num(0.0, 2.0)),
    ("top_p", Kind::Num(0.0, 1.0)),
    ("n", Kind::Int(1, 128)),
    ("max_tokens", Kind::Int(1, i64::MAX)),
    ("max_completion_tokens", Kind::Int(1, i64::MAX)),
    ("frequency_penalty", Kind::Num(-2.0, 2.0)),
    ("presence_penalty", Kind::Num(-2.0, 2.0)),
    ("logit_bias", Kind::Object),
    ("logprobs", Kind::Bool),
    ("top_logprobs", Kind::Int(0, 20)),
    ("seed", Kind::Int(i64::MIN, i64::MAX)),
    ("user", Kind::Str),
    ("metadata", Kind::Object),
    ("parallel_tool_calls", Kind::Bool),
    ("service_tier", Kind::Str),
    ("store", Kind::Bool),
    ("reasoning_effort", Kind::Str),
    ("prompt_cache_key", Kind::Str),
    ("safety_identifier", Kind::Str),
    ("verbosity", Kind::Str),
    ("modalities", Kind::Array),
    ("audio", Kind::Object),
    ("prediction", Kind::Object),
    ("web_search_options", Kind::Object),
    ("functions", Kind::Array),
];

fn unrecognized(field: &str) -> ApiError {
    ApiError::bad_request(
        format!("Unrecognized request argument supplied: {field}"),
        Some(field),
        None,
    )
}

fn missing(param: &str) -> ApiError {
    ApiError::bad_request(
        format!("Missing required parameter: '{param}'."),
        Some(param),
        Some("missing_required_parameter"),
    )
}

fn invalid_type(param: &str, expected: &str, got: &Value) -> ApiError {
    ApiError::bad_request(
        format!(
            "Invalid type for '{param}': expected {expected}, but got {} instead.",
            type_name(got)
        ),
        Some(param),
        Some("invalid_type"),
    )
}

fn invalid_value(param: &str, got: &str, supported: &[&str]) -> ApiError {
    ApiError::bad_request(
        format!(
            "Invalid value: '{got}'. Supported values are: {}.",
            one_of(supported)
        ),
        Some(param),
        Some("invalid_value"),
    )
}

/// `'a'`, `'a' and 'b'`, `'a', 'b', and 'c'` (OpenAI's lists).
fn one_of(values: &[&str]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("'{v}'")).collect();
    match quoted.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [a, b] => format!("{a} and {b}"),
        [init @ .., last] => format!("{}, and {last}", init.join(", ")),
    }
}

/// How OpenAI names a JSON value's type in its messages.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a decimal",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn check_kind(name: &str, value: &Value, kind: Kind) -> Result<(), ApiError> {
    let expected = match kind {
        Kind::Bool if value.is_boolean() => return Ok(()),
        Kind::Str if value.is_string() => return Ok(()),
        Kind::Object if value.is_object() => return Ok(()),
        Kind::Array if value.is_array() => return Ok(()),
        Kind::Int(min, max) => match value.as_i64() {
            Some(x) if x > max => {
                return Err(ApiError::bad_request(
                    format!("Invalid '{name}': integer above maximum value. Expected a value <= {max}, but got {x} instead."),
                    Some(name),
                    Some("integer_above_max_value"),
                ))
            }
            Some(x) if x < min => {
                return Err(ApiError::bad_request(
                    format!("Invalid '{name}': integer below minimum value. Expected a value >= {min}, but got {x} instead."),
                    Some(name),
                    Some("integer_below_min_value"),
                ))
            }
            Some(_) => return Ok(()),
            None => "an integer",
        },
        Kind::Num(min, max) => match value.as_f64() {
            Some(x) if x > max => {
                return Err(ApiError::bad_request(
                    format!("Invalid '{name}': decimal above maximum value. Expected a value <= {max}, but got {value} instead."),
                    Some(name),
                    Some("decimal_above_max_value"),
                ))
            }
            Some(x) if x < min => {
                return Err(ApiError::bad_request(
                    format!("Invalid '{name}': decimal below minimum value. Expected a value >= {min}, but got {value} instead."),
                    Some(name),
                    Some("decimal_below_min_value"),
                ))
            }
            Some(_) => return Ok(()),
            None => "a decimal",
        },
        Kind::Bool => "a boolean",
        Kind::Str => "a string",
        Kind::Object => "an object",
        Kind::Array => "an array",
    };
    Err(invalid_type(name, expected, value))
}

/// A Chat Completions body (a JSON object); `model_required` is false on Azure, where the
/// deployment in the path names the model.
pub(crate) fn check_chat(req: &Value, model_required: bool) -> Result<(), ApiError> {
    let Value::Object(req) = req else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object".to_owned(),
            None,
            None,
        ));
    };
    if let Some(key) = req.keys().find(|k| !CHAT_FIELDS.contains(&k.as_str())) {
        return Err(unrecognized(key));
    }
    check_model(req, model_required)?;
    let messages = match req.get("messages") {
        None | Some(Value::Null) => return Err(missing("messages")),
        Some(Value::Array(messages)) => messages,
        Some(other) => return Err(invalid_type("messages", "an array", other)),
    };
    if messages.is_empty() {
        return Err(ApiError::bad_request(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.".to_owned(),
            Some("messages"),
            Some("empty_array"),
        ));
    }
    for (i, message) in messages.iter().enumerate() {
        check_message(i, message)?;
    }
    check_tool_answers(messages)?;
    for (name, kind) in CHAT_SCALARS {
        if let Some(value) = field(req, name) {
            check_kind(name, value, *kind)?;
        }
    }
    let tools = match field(req, "tools") {
        Some(tools) => Some(check_tools(tools)?),
        None => None,
    };
    if let Some(choice) = field(req, "tool_choice") {
        check_tool_choice(choice)?;
        if tools.is_none() {
            return Err(ApiError::bad_request(
                "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.".to_owned(),
                Some("tool_choice"),
                None,
            ));
        }
    }
    if field(req, "parallel_tool_calls").is_some() && tools.is_none() {
        return Err(ApiError::bad_request(
            "Invalid value for 'parallel_tool_calls': 'parallel_tool_calls' is only allowed when 'tools' are specified.".to_owned(),
            Some("parallel_tool_calls"),
            None,
        ));
    }
    if let Some(call) = field(req, "function_call") {
        if !(call.is_string() || call.is_object()) {
            return Err(invalid_type(
                "function_call",
                "one of a string or an object",
                call,
            ));
        }
    }
    if let Some(stop) = field(req, "stop") {
        match stop {
            Value::String(_) => {}
            Value::Array(stops) => {
                if stops.len() > 4 {
                    return Err(ApiError::bad_request(
                        format!("Invalid 'stop': array too long. Expected an array with maximum length 4, but got an array with length {} instead.", stops.len()),
                        Some("stop"),
                        Some("array_above_max_length"),
                    ));
                }
                if let Some((k, s)) = stops.iter().enumerate().find(|(_, s)| !s.is_string()) {
                    return Err(invalid_type(&format!("stop[{k}]"), "a string", s));
                }
            }
            other => {
                return Err(invalid_type(
                    "stop",
                    "one of a string or an array of strings",
                    other,
                ))
            }
        }
    }
    if let Some(options) = field(req, "stream_options") {
        let Value::Object(options) = options else {
            return Err(invalid_type("stream_options", "an object", options));
        };
        if let Some(key) = options
            .keys()
            .find(|k| *k != "include_usage" && *k != "include_obfuscation")
        {
            return Err(unrecognized(&format!("stream_options.{key}")));
        }
        for key in ["include_usage", "include_obfuscation"] {
            if let Some(value) = field(options, key) {
                check_kind(&format!("stream_options.{key}"), value, Kind::Bool)?;
            }
        }
        if field(req, "stream") != Some(&Value::Bool(true)) {
            return Err(ApiError::bad_request(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled."
                    .to_owned(),
                Some("stream_options"),
                None,
            ));
        }
    }
    if let Some(format) = field(req, "response_format") {
        let Value::Object(format) = format else {
            return Err(invalid_type("response_format", "an object", format));
        };
        const FORMATS: &[&str] = &["text", "json_object", "json_schema"];
        match format.get("type") {
            None | Some(Value::Null) => return Err(missing("response_format.type")),
            Some(Value::String(t)) if FORMATS.contains(&t.as_str()) => {}
            Some(Value::String(t)) => {
                return Err(invalid_value("response_format.type", t, FORMATS))
            }
            Some(other) => return Err(invalid_type("response_format.type", "a string", other)),
        }
    }
    Ok(())
}

fn check_model(req: &Map<String, Value>, required: bool) -> Result<(), ApiError> {
    match req.get("model") {
        None | Some(Value::Null) if required => Err(ApiError::bad_request(
            "you must provide a model parameter".to_owned(),
            None,
            None,
        )),
        None | Some(Value::Null) | Some(Value::String(_)) => Ok(()),
        Some(other) => Err(invalid_type("model", "a string", other)),
    }
}

/// One message of `messages`.
fn check_message(i: usize, message: &Value) -> Result<(), ApiError> {
    let path = format!("messages[{i}]");
    let Value::Object(message) = message else {
        return Err(invalid_type(&path, "an object", message));
    };
    let role = match message.get("role") {
        None | Some(Value::Null) => return Err(missing(&format!("{path}.role"))),
        Some(Value::String(role)) if ROLES.contains(&role.as_str()) => role.as_str(),
        Some(Value::String(role)) => {
            return Err(invalid_value(&format!("{path}.role"), role, ROLES))
        }
        Some(other) => return Err(invalid_type(&format!("{path}.role"), "a string", other)),
    };
    let calls = field(message, "tool_calls").is_some() || field(message, "function_call").is_some();
    let parts: &[&str] = match role {
        "user" => &["text", "image_url", "input_audio", "file"],
        "assistant" => &["text", "refusal"],
        _ => &["text"],
    };
    match message.get("content") {
        // an assistant message that calls tools needs no content
        None | Some(Value::Null) if role == "assistant" && calls => {}
        None => return Err(missing(&format!("{path}.content"))),
        Some(Value::String(_)) => {}
        Some(Value::Array(items)) if role != "function" => {
            for (j, part) in items.iter().enumerate() {
                check_part(&format!("{path}.content[{j}]"), part, parts)?;
            }
        }
        Some(other) => {
            return Err(invalid_type(
                &format!("{path}.content"),
                "one of a string or array of objects",
                other,
            ))
        }
    }
    if let Some(name) = field(message, "name") {
        check_kind(&format!("{path}.name"), name, Kind::Str)?;
    } else if role == "function" {
        return Err(missing(&format!("{path}.name")));
    }
    if role == "tool" {
        match message.get("tool_call_id") {
            None | Some(Value::Null) => return Err(missing(&format!("{path}.tool_call_id"))),
            Some(Value::String(_)) => {}
            Some(other) => {
                return Err(invalid_type(
                    &format!("{path}.tool_call_id"),
                    "a string",
                    other,
                ))
            }
        }
    }
    if let Some(calls) = field(message, "tool_calls") {
        if role != "assistant" {
            return Err(ApiError::bad_request(
                format!("Invalid parameter: only messages with role 'assistant' can have 'tool_calls' ('{path}.tool_calls')."),
                Some(&format!("{path}.tool_calls")),
                None,
            ));
        }
        let Value::Array(calls) = calls else {
            return Err(invalid_type(
                &format!("{path}.tool_calls"),
                "an array",
                calls,
            ));
        };
        for (k, call) in calls.iter().enumerate() {
            check_tool_call(&format!("{path}.tool_calls[{k}]"), call)?;
        }
    }
    Ok(())
}

/// A content part whose type must be one of `types`.
fn check_part(path: &str, part: &Value, types: &[&str]) -> Result<(), ApiError> {
    let Value::Object(part) = part else {
        return Err(invalid_type(path, "an object", part));
    };
    let kind = match part.get("type") {
        None | Some(Value::Null) => return Err(missing(&format!("{path}.type"))),
        Some(Value::String(kind)) if types.contains(&kind.as_str()) => kind.as_str(),
        Some(Value::String(kind)) => {
            return Err(invalid_value(&format!("{path}.type"), kind, types))
        }
        Some(other) => return Err(invalid_type(&format!("{path}.type"), "a string", other)),
    };
    let required = |name: &str, kind: Kind| -> Result<(), ApiError> {
        match field(part, name) {
            None => Err(missing(&format!("{path}.{name}"))),
            Some(value) => check_kind(&format!("{path}.{name}"), value, kind),
        }
    };
    match kind {
        "text" => required("text", Kind::Str),
        "refusal" => required("refusal", Kind::Str),
        "image_url" => {
            required("image_url", Kind::Object)?;
            match part.get("image_url").and_then(|i| i.get("url")) {
                None | Some(Value::Null) => Err(missing(&format!("{path}.image_url.url"))),
                Some(url) => check_kind(&format!("{path}.image_url.url"), url, Kind::Str),
            }
        }
        "input_audio" => {
            required("input_audio", Kind::Object)?;
            for name in ["data", "format"] {
                match part.get("input_audio").and_then(|a| a.get(name)) {
                    None | Some(Value::Null) => {
                        return Err(missing(&format!("{path}.input_audio.{name}")))
                    }
                    Some(v) => check_kind(&format!("{path}.input_audio.{name}"), v, Kind::Str)?,
                }
            }
            Ok(())
        }
        "file" => required("file", Kind::Object),
        _ => Ok(()),
    }
}

/// An assistant's tool call: `{id, type: "function", function: {name, arguments: string}}`.
fn check_tool_call(path: &str, call: &Value) -> Result<(), ApiError> {
    let Value::Object(call) = call else {
        return Err(invalid_type(path, "an object", call));
    };
    let string = |obj: &Map<String, Value>, name: &str, at: &str| match obj.get(name) {
        None | Some(Value::Null) => Err(missing(at)),
        Some(Value::String(_)) => Ok(()),
        Some(other) => Err(invalid_type(at, "a string", other)),
    };
    string(call, "id", &format!("{path}.id"))?;
    match call.get("type") {
        None | Some(Value::Null) => return Err(missing(&format!("{path}.type"))),
        Some(Value::String(t)) if t == "function" => {}
        Some(Value::String(t)) => {
            return Err(invalid_value(&format!("{path}.type"), t, &["function"]))
        }
        Some(other) => return Err(invalid_type(&format!("{path}.type"), "a string", other)),
    }
    let function = match call.get("function") {
        None | Some(Value::Null) => return Err(missing(&format!("{path}.function"))),
        Some(Value::Object(function)) => function,
        Some(other) => {
            return Err(invalid_type(
                &format!("{path}.function"),
                "an object",
                other,
            ))
        }
    };
    string(function, "name", &format!("{path}.function.name"))?;
    string(function, "arguments", &format!("{path}.function.arguments"))
}

/// Each `tool` message answers a call of the assistant message just before the run of tool
/// messages it is in; each call of an assistant message followed by another message is
/// answered before it.
fn check_tool_answers(messages: &[Value]) -> Result<(), ApiError> {
    // the assistant message the current run of tool messages answers: its index and the ids
    // of its calls not answered yet
    let mut open: Option<(usize, Vec<&str>, Vec<&str>)> = None;
    for (i, message) in messages.iter().enumerate() {
        let role = message.get("role").and_then(Value::as_str).unwrap_or("");
        if role == "tool" {
            let Some((_, ids, pending)) = open.as_mut() else {
                return Err(ApiError::bad_request(
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.".to_owned(),
                    Some(&format!("messages.[{i}].role")),
                    None,
                ));
            };
            let id = message
                .get("tool_call_id")
                .and_then(Value::as_str)
                .unwrap_or("");
            if !ids.contains(&id) {
                return Err(ApiError::bad_request(
                    format!("Invalid parameter: 'tool_call_id' of '{id}' not found in 'tool_calls' of previous message."),
                    Some(&format!("messages.[{i}].tool_call_id")),
                    None,
                ));
            }
            pending.retain(|p| *p != id);
            continue;
        }
        if let Some((k, _, pending)) = open.take() {
            if !pending.is_empty() {
                return Err(ApiError::bad_request(
                    format!("An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}", pending.join(", ")),
                    Some(&format!("messages.[{k}].role")),
                    None,
                ));
            }
        }
        if role == "assistant" {
            if let Some(Value::Array(calls)) = message.get("tool_calls") {
                let ids: Vec<&str> = calls
                    .iter()
                    .filter_map(|c| c.get("id").and_then(Value::as_str))
                    .collect();
                if !ids.is_empty() {
                    open = Some((i, ids.clone(), ids));
                }
            }
        }
    }
    Ok(())
}

/// `tools`: `[{type: "function", function: {name, description?, parameters?, strict?}}]`;
/// returns their count.
fn check_tools(tools: &Value) -> Result<usize, ApiError> {
    let Value::Array(tools) = tools else {
        return Err(invalid_type("tools", "an array", tools));
    };
    for (k, tool) in tools.iter().enumerate() {
        let path = format!("tools[{k}]");
        let Value::Object(tool) = tool else {
            return Err(invalid_type(&path, "an object", tool));
        };
        match tool.get("type") {
            None | Some(Value::Null) => return Err(missing(&format!("{path}.type"))),
            Some(Value::String(t)) if t == "function" => {}
            Some(Value::String(t)) if t == "custom" => continue,
            Some(Value::String(t)) => {
                return Err(invalid_value(
                    &format!("{path}.type"),
                    t,
                    &["function", "custom"],
                ))
            }
            Some(other) => return Err(invalid_type(&format!("{path}.type"), "a string", other)),
        }
        let function = match tool.get("function") {
            None | Some(Value::Null) => return Err(missing(&format!("{path}.function"))),
            Some(Value::Object(function)) => function,
            Some(other) => {
                return Err(invalid_type(
                    &format!("{path}.function"),
                    "an object",
                    other,
                ))
            }
        };
        match function.get("name") {
            None | Some(Value::Null) => return Err(missing(&format!("{path}.function.name"))),
            Some(Value::String(name)) if is_tool_name(name, 64) => {}
            Some(Value::String(_)) => {
                return Err(ApiError::bad_request(
                    format!("Invalid '{path}.function.name': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'."),
                    Some(&format!("{path}.function.name")),
                    Some("invalid_value"),
                ))
            }
            Some(other) => return Err(invalid_type(&format!("{path}.function.name"), "a string", other)),
        }
        for (name, kind) in [
            ("description", Kind::Str),
            ("parameters", Kind::Object),
            ("strict", Kind::Bool),
        ] {
            if let Some(value) = field(function, name) {
                check_kind(&format!("{path}.function.{name}"), value, kind)?;
            }
        }
    }
    Ok(tools.len())
}

/// `tool_choice`: `none` | `auto` | `required` | `{type: "function", function: {name}}`.
fn check_tool_choice(choice: &Value) -> Result<(), ApiError> {
    const MODES: &[&str] = &["none", "auto", "required"];
    const TYPES: &[&str] = &["function", "allowed_tools", "custom"];
    match choice {
        Value::String(mode) if MODES.contains(&mode.as_str()) => Ok(()),
        Value::String(mode) => Err(invalid_value("tool_choice", mode, MODES)),
        Value::Object(choice) => match choice.get("type") {
            None | Some(Value::Null) => Err(missing("tool_choice.type")),
            Some(Value::String(t)) if t == "function" => {
                match choice.get("function").and_then(|f| f.get("name")) {
                    None | Some(Value::Null) => Err(missing("tool_choice.function.name")),
                    Some(name) => check_kind("tool_choice.function.name", name, Kind::Str),
                }
            }
            Some(Value::String(t)) if TYPES.contains(&t.as_str()) => Ok(()),
            Some(Value::String(t)) => Err(invalid_value("tool_choice.type", t, TYPES)),
            Some(other) => Err(invalid_type("tool_choice.type", "a string", other)),
        },
        other => Err(invalid_type(
            "tool_choice",
            "one of a string or an object",
            other,
        )),
    }
}

/// An embeddings body: no unknown field, `model` (`model_required`), `input` (checked by the
/// handler).
pub(crate) fn check_embeddings(req: &Value, model_required: bool) -> Result<(), ApiError> {
    let Value::Object(req) = req else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object".to_owned(),
            None,
            None,
        ));
    };
    if let Some(key) = req
        .keys()
        .find(|k| !EMBEDDINGS_FIELDS.contains(&k.as_str()))
    {
        return Err(unrecognized(key));
    }
    check_model(req, model_required)?;
    if let Some(dimensions) = field(req, "dimensions") {
        check_kind("dimensions", dimensions, Kind::Int(1, i64::MAX))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat_of(extra: Value) -> Value {
        let mut body = json!({"model": "gpt", "messages": [{"role": "user", "content": "hi"}]});
        if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
            body.extend(extra);
        }
        body
    }

    /// (message, param, code) of the refusal.
    fn refusal(body: &Value) -> (String, Option<String>, Option<String>) {
        let e = check_chat(body, true).expect_err("refused");
        (e.message, e.param, e.code)
    }

    #[test]
    fn accepts_a_full_request() {
        let body = chat_of(json!({
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "system", "content": [{"type": "text", "text": "really"}]},
                {"role": "user", "content": [
                    {"type": "text", "text": "weather?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO", "detail": "low"}},
                    {"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}}
                ], "name": "bob"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "c2", "content": "noon"},
                {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]},
                {"role": "assistant", "content": "Sunny at noon."},
                {"role": "user", "content": "thanks"}
            ],
            "tools": [
                {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}, "strict": true}},
                {"type": "function", "function": {"name": "get_time", "description": "now"}}
            ],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": true, "stream": true,
            "stream_options": {"include_usage": true, "include_obfuscation": false},
            "stop": ["a", "b", "c", "d"], "temperature": 2, "top_p": 1, "n": 1,
            "max_tokens": 10, "max_completion_tokens": 10, "user": "u", "metadata": {"k": "v"},
            "seed": -3, "logprobs": true, "top_logprobs": 2,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x"}},
            "frequency_penalty": -2, "presence_penalty": 0.5, "logit_bias": {"50256": -100},
            "service_tier": "auto", "store": false, "reasoning_effort": "low",
            "prompt_cache_key": "k", "safety_identifier": "s", "verbosity": "low",
            "modalities": ["text"], "prediction": {"type": "content", "content": "x"},
            "web_search_options": {}
        }));
        assert_eq!(check_chat(&body, true).map_err(|e| e.message), Ok(()));
    }

    #[test]
    fn anthropic_fields_are_unrecognized() {
        for field in [
            "system",
            "stop_sequences",
            "top_k",
            "thinking",
            "anthropic_version",
            "bogus",
        ] {
            let mut body = chat_of(json!({}));
            if let Some(obj) = body.as_object_mut() {
                obj.insert(field.to_owned(), json!("x"));
            }
            assert_eq!(
                refusal(&body),
                (
                    format!("Unrecognized request argument supplied: {field}"),
                    Some(field.to_owned()),
                    None
                )
            );
        }
    }

    #[test]
    fn refusals_name_the_param() {
        let p = |s: &str| Some(s.to_owned());
        let cases: Vec<(Value, &str, Option<String>, Option<String>)> = vec![
            (json!({"messages": []}), "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.", p("messages"), p("empty_array")),
            (json!({"messages": null}), "Missing required parameter: 'messages'.", p("messages"), p("missing_required_parameter")),
            (json!({"model": null}), "you must provide a model parameter", None, None),
            (json!({"messages": [{"role": "human", "content": "x"}]}),
             "Invalid value: 'human'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'.", p("messages[0].role"), p("invalid_value")),
            (json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
             "Invalid value: 'image'. Supported values are: 'text', 'image_url', 'input_audio', and 'file'.", p("messages[0].content[0].type"), p("invalid_value")),
            (json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]}),
             "Invalid value: 'tool_result'. Supported values are: 'text', 'image_url', 'input_audio', and 'file'.", p("messages[0].content[0].type"), p("invalid_value")),
            (json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]}),
             "Invalid value: 'tool_use'. Supported values are: 'text' and 'refusal'.", p("messages[0].content[0].type"), p("invalid_value")),
            (json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]}),
             "Invalid type for 'messages[0].content[0].image_url': expected an object, but got a string instead.", p("messages[0].content[0].image_url"), p("invalid_type")),
            (json!({"messages": [{"role": "user", "content": null}]}),
             "Invalid type for 'messages[0].content': expected one of a string or array of objects, but got null instead.", p("messages[0].content"), p("invalid_type")),
            (json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}]}),
             "Invalid type for 'messages[0].tool_calls[0].function.arguments': expected a string, but got an object instead.", p("messages[0].tool_calls[0].function.arguments"), p("invalid_type")),
            (json!({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "42"}]}),
             "Missing required parameter: 'messages[1].tool_call_id'.", p("messages[1].tool_call_id"), p("missing_required_parameter")),
            (json!({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c", "content": "42"}]}),
             "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.", p("messages.[1].role"), None),
            (json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "d", "content": "42"}]}),
             "Invalid parameter: 'tool_call_id' of 'd' not found in 'tool_calls' of previous message.", p("messages.[1].tool_call_id"), None),
            (json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "user", "content": "x"}]}),
             "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: c", p("messages.[0].role"), None),
            (json!({"temperature": 2.5}), "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 2.5 instead.", p("temperature"), p("decimal_above_max_value")),
            (json!({"temperature": "1"}), "Invalid type for 'temperature': expected a decimal, but got a string instead.", p("temperature"), p("invalid_type")),
            (json!({"stop": ["a", "b", "c", "d", "e"]}), "Invalid 'stop': array too long. Expected an array with maximum length 4, but got an array with length 5 instead.", p("stop"), p("array_above_max_length")),
            (json!({"stream_options": {"include_usage": true}}), "The 'stream_options' parameter is only allowed when 'stream' is enabled.", p("stream_options"), None),
            (json!({"stream": false, "stream_options": {"include_usage": true}}), "The 'stream_options' parameter is only allowed when 'stream' is enabled.", p("stream_options"), None),
            (json!({"tool_choice": "auto"}), "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.", p("tool_choice"), None),
            (json!({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "any"}),
             "Invalid value: 'any'. Supported values are: 'none', 'auto', and 'required'.", p("tool_choice"), p("invalid_value")),
            (json!({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "tool", "name": "f"}}),
             "Invalid value: 'tool'. Supported values are: 'function', 'allowed_tools', and 'custom'.", p("tool_choice.type"), p("invalid_value")),
            (json!({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "auto"}}),
             "Invalid value: 'auto'. Supported values are: 'function', 'allowed_tools', and 'custom'.", p("tool_choice.type"), p("invalid_value")),
            (json!({"tools": [{"name": "f", "input_schema": {}}]}), "Missing required parameter: 'tools[0].type'.", p("tools[0].type"), p("missing_required_parameter")),
            (json!({"tools": [{"type": "function", "function": {"name": "get weather"}}]}),
             "Invalid 'tools[0].function.name': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.", p("tools[0].function.name"), p("invalid_value")),
            (json!({"n": 0}), "Invalid 'n': integer below minimum value. Expected a value >= 1, but got 0 instead.", p("n"), p("integer_below_min_value")),
            (json!({"response_format": {"type": "xml"}}), "Invalid value: 'xml'. Supported values are: 'text', 'json_object', and 'json_schema'.", p("response_format.type"), p("invalid_value")),
        ];
        for (extra, message, param, code) in cases {
            assert_eq!(
                refusal(&chat_of(extra.clone())),
                (message.to_owned(), param, code),
                "{extra}"
            );
        }
    }

    #[test]
    fn azure_needs_no_model() {
        let body = json!({"messages": [{"role": "user", "content": "hi"}]});
        assert!(check_chat(&body, false).is_ok());
        assert!(check_chat(&body, true).is_err());
        assert!(check_embeddings(&json!({"input": "x"}), false).is_ok());
        assert_eq!(
            check_embeddings(&json!({"model": "e", "input": "x", "extra": 1}), true)
                .map_err(|e| e.message),
            Err("Unrecognized request argument supplied: extra".to_owned())
        );
    }

    #[test]
    fn lists_read_like_openai() {
        assert_eq!(one_of(&["a"]), "'a'");
        assert_eq!(one_of(&["a", "b"]), "'a' and 'b'");
        assert_eq!(one_of(&["a", "b", "c"]), "'a', 'b', and 'c'");
    }
}
