//! Anthropic Messages.

use serde_json::Value;

use super::openai::tokens_len;
use super::{
    array, content_chars, content_text, last_user_text, message_tokens, model, opt_bool, opt_u64,
    text_tokens, tool, ApiError, Ctx, Reply,
};
use crate::json::{str_lit, w, Completion, Sse};

const TEXT: &[&str] = &["text"];

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`, N the prompt-token formula of
/// `POST /v1/messages` over the same `messages` and `system` (or the `x-mock-prompt-tokens`
/// knob).
pub(crate) fn count_tokens(req: &Value, ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    model(req)?;
    let messages = array(req, "messages")?;
    let system = system_tokens(req)?;
    let input = ctx
        .knobs
        .prompt_tokens
        .unwrap_or_else(|| conversation_tokens(messages).saturating_add(system));
    Ok(Reply::Json(format!(r#"{{"input_tokens":{input}}}"#)))
}

/// The prompt count of `messages`: each message `ceil(text chars / 4) + 4`, its text the text
/// blocks and the text of its `tool_result` blocks' content (so a tool's result counts as the
/// OpenAI `tool` message it translates); at least 1.
fn conversation_tokens(messages: &[Value]) -> u64 {
    messages
        .iter()
        .map(|m| {
            let content = m.get("content");
            let chars = tool_results(content)
                .filter_map(|r| r.get("content"))
                .map(|c| content_chars(c, TEXT))
                .fold(
                    content.map_or(0, |c| content_chars(c, TEXT)),
                    usize::saturating_add,
                );
            text_tokens(chars).saturating_add(4)
        })
        .fold(0u64, u64::saturating_add)
        .max(1)
}

/// The `tool_result` blocks of a message's content.
fn tool_results(content: Option<&Value>) -> impl Iterator<Item = &Value> {
    content
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
}

/// The names of the request's tools.
fn tool_names(req: &Value) -> impl Iterator<Item = &str> {
    req.get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| t.get("name")?.as_str())
}

/// The tokens of `system` (a string or text blocks), counted as one more message; 0 without.
fn system_tokens(req: &Value) -> Result<u64, ApiError> {
    match req.get("system") {
        None | Some(Value::Null) => Ok(0),
        Some(system @ (Value::String(_) | Value::Array(_))) => {
            Ok(message_tokens(Some(system), TEXT))
        }
        Some(_) => Err(ApiError::invalid(
            "'system' must be a string or an array of blocks",
            Some("system"),
        )),
    }
}

/// `POST /v1/messages`
pub(crate) fn messages(req: &Value, ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let model = str_lit(model(req)?);
    let messages = array(req, "messages")?;
    let system = system_tokens(req)?;
    let stream = opt_bool(req, "stream", "stream")?;
    let cap = opt_u64(req, "max_tokens")?;

    let knobs = ctx.knobs;
    let prompt = knobs
        .prompt_tokens
        .unwrap_or_else(|| conversation_tokens(messages).saturating_add(system));
    let cache_read = knobs.cache_read_tokens.unwrap_or(0);
    // the last turn a user's tool results: the model answers them in text, echoing them
    let last = messages
        .last()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("user"));
    let answers_tool = tool_results(last.and_then(|m| m.get("content")))
        .next()
        .is_some();
    let text = if answers_tool {
        tool_results(last.and_then(|m| m.get("content")))
            .filter_map(|r| r.get("content"))
            .map(|c| content_text(c, TEXT))
            .collect()
    } else {
        last_user_text(messages, TEXT)
    };
    let call = tool::requested(
        knobs.tool_call.as_deref(),
        tool_names(req),
        answers_tool,
        &text,
    )?;
    let completion = Completion::new(knobs.echo, &text);
    let (n, capped) = match &call {
        Some(call) => (call.tokens(), false),
        None => completion.count(knobs, cap),
    };
    let stop = match (&call, capped) {
        (Some(_), _) => "tool_use",
        (None, true) => "max_tokens",
        (None, false) => "end_turn",
    };
    let usage = |output: u64| {
        (!knobs.no_usage).then(|| {
            format!(
                r#"{{"input_tokens":{prompt},"output_tokens":{output},"cache_creation_input_tokens":0,"cache_read_input_tokens":{cache_read}}}"#
            )
        })
    };
    let id = ctx.id;

    if !stream {
        let mut b = String::with_capacity(384 + model.len() + tokens_len(n));
        w!(
            b,
            r#"{{"id":"msg_mock_{id}","type":"message","role":"assistant","model":{model},"content":["#
        );
        match &call {
            Some(call) => w!(
                b,
                r#"{{"type":"tool_use","id":"toolu_mock_{id}","name":{},"input":{}}}"#,
                call.name,
                call.arguments
            ),
            None => {
                b.push_str(r#"{"type":"text","text":""#);
                completion.push_all(&mut b, n);
                b.push_str(r#""}"#);
            }
        }
        w!(b, r#"],"stop_reason":"{stop}","stop_sequence":null"#);
        if let Some(usage) = usage(n) {
            w!(b, r#","usage":{usage}"#);
        }
        b.push('}');
        return Ok(Reply::Json(b));
    }

    let mut sse = Sse::new(n.saturating_add(6));
    sse.event(Some("message_start"), |b| {
        w!(
            b,
            r#"{{"type":"message_start","message":{{"id":"msg_mock_{id}","type":"message","role":"assistant","model":{model},"content":[],"stop_reason":null,"stop_sequence":null"#
        );
        if let Some(usage) = usage(1) {
            w!(b, r#","usage":{usage}"#);
        }
        b.push_str("}}");
    });
    sse.event(Some("content_block_start"), |b| match &call {
        Some(call) => w!(
            b,
            r#"{{"type":"content_block_start","index":0,"content_block":{{"type":"tool_use","id":"toolu_mock_{id}","name":{},"input":{{}}}}}}"#,
            call.name
        ),
        None => b.push_str(
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
    });
    sse.event(Some("ping"), |b| b.push_str(r#"{"type":"ping"}"#));
    for i in 0..n {
        sse.event(Some("content_block_delta"), |b| match &call {
            Some(call) => {
                let piece = usize::try_from(i)
                    .ok()
                    .and_then(|i| call.pieces().get(i))
                    .map_or("", String::as_str);
                w!(
                    b,
                    r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"input_json_delta","partial_json":{}}}}}"#,
                    str_lit(piece)
                );
            }
            None => {
                b.push_str(
                    r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":""#,
                );
                completion.push(b, i);
                b.push_str(r#""}}"#);
            }
        });
    }
    sse.event(Some("content_block_stop"), |b| {
        b.push_str(r#"{"type":"content_block_stop","index":0}"#);
    });
    sse.event(Some("message_delta"), |b| {
        w!(
            b,
            r#"{{"type":"message_delta","delta":{{"stop_reason":"{stop}","stop_sequence":null}}"#
        );
        if !knobs.no_usage {
            w!(b, r#","usage":{{"output_tokens":{n}}}"#);
        }
        b.push('}');
    });
    sse.event(Some("message_stop"), |b| {
        b.push_str(r#"{"type":"message_stop"}"#);
    });
    Ok(Reply::Sse(sse))
}
