//! OpenAI: Chat Completions, Responses, embeddings.

use serde_json::Value;

use super::{
    array, content_text, conversation_tokens, last_user_text, message_tokens, model,
    model_or_deployment, opt_bool, opt_u64, text_tokens, tool, ApiError, Ctx, Reply,
};
use crate::json::{str_lit, w, Completion, Sse};
use crate::knobs::{Knobs, UsageStyle};

const CHAT_TEXT: &[&str] = &["text"];
const RESPONSES_TEXT: &[&str] = &["input_text", "output_text", "text"];

/// `POST /v1/chat/completions` (and Azure's chat completions of a deployment)
pub(crate) fn chat(req: &Value, ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let model = str_lit(model_or_deployment(req, ctx.deployment)?);
    let messages = array(req, "messages")?;
    let stream = opt_bool(req, "stream", "stream")?;
    let include_usage = match req.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(options @ Value::Object(_)) => {
            opt_bool(options, "include_usage", "stream_options.include_usage")?
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "'stream_options' must be an object",
                Some("stream_options"),
            ))
        }
    };
    let cap = match opt_u64(req, "max_completion_tokens")? {
        Some(cap) => Some(cap),
        None => opt_u64(req, "max_tokens")?,
    };

    let knobs = ctx.knobs;
    let prompt = knobs.prompt_tokens.unwrap_or_else(|| {
        conversation_tokens(messages.iter().map(|m| m.get("content")), CHAT_TEXT)
    });
    // the last message a tool's result: the model answers it in text, echoing the result
    let tool_result = messages
        .last()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("tool"));
    let text = match tool_result {
        Some(result) => result
            .get("content")
            .map(|c| content_text(c, CHAT_TEXT))
            .unwrap_or_default(),
        None => last_user_text(messages, CHAT_TEXT),
    };
    let call = tool::requested(
        knobs.tool_call.as_deref(),
        tool_names(req),
        tool_result.is_some(),
        &text,
    )?;
    let completion = Completion::new(knobs.echo, &text);
    let (n, capped) = match &call {
        Some(call) => (call.tokens(), false),
        None => completion.count(knobs, cap),
    };
    let finish = match (&call, capped) {
        (Some(_), _) => "tool_calls",
        (None, true) => "length",
        (None, false) => "stop",
    };
    let usage = (!knobs.no_usage).then(|| chat_usage(knobs, prompt, n));
    let (id, created) = (ctx.id, ctx.created);

    if !stream {
        let mut b = String::with_capacity(320 + model.len() + tokens_len(n));
        w!(
            b,
            r#"{{"id":"chatcmpl-mock-{id}","object":"chat.completion","created":{created},"model":{model},"choices":[{{"index":0,"message":{{"role":"assistant","content":"#
        );
        match &call {
            Some(call) => w!(
                b,
                r#"null,"tool_calls":[{{"id":"call_mock_{id}","type":"function","function":{{"name":{},"arguments":{}}}}}]"#,
                call.name,
                str_lit(&call.arguments)
            ),
            None => {
                b.push('"');
                completion.push_all(&mut b, n);
                b.push('"');
            }
        }
        w!(b, r#"}},"logprobs":null,"finish_reason":"{finish}"}}]"#);
        if let Some(usage) = &usage {
            w!(b, r#","usage":{usage}"#);
        }
        b.push('}');
        return Ok(Reply::Json(b));
    }

    let head = format!(
        r#"{{"id":"chatcmpl-mock-{id}","object":"chat.completion.chunk","created":{created},"model":{model},"choices":"#
    );
    // OpenAI puts `"usage":null` on every chunk but the usage one when include_usage is set.
    let tail = if include_usage && usage.is_some() {
        r#","usage":null}"#
    } else {
        "}"
    };
    let mut sse = Sse::new(n.saturating_add(4));
    sse.event(None, |b| {
        b.push_str(&head);
        match &call {
            Some(call) => w!(
                b,
                r#"[{{"index":0,"delta":{{"role":"assistant","content":null,"tool_calls":[{{"index":0,"id":"call_mock_{id}","type":"function","function":{{"name":{},"arguments":""}}}}]}},"logprobs":null,"finish_reason":null}}]"#,
                call.name
            ),
            None => b.push_str(r#"[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]"#),
        }
        b.push_str(tail);
    });
    for i in 0..n {
        sse.event(None, |b| {
            b.push_str(&head);
            match &call {
                Some(call) => {
                    let piece = usize::try_from(i)
                        .ok()
                        .and_then(|i| call.pieces().get(i))
                        .map_or("", String::as_str);
                    w!(
                        b,
                        r#"[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"function":{{"arguments":{}}}}}]}},"logprobs":null,"finish_reason":null}}]"#,
                        str_lit(piece)
                    );
                }
                None => {
                    b.push_str(r#"[{"index":0,"delta":{"content":""#);
                    completion.push(b, i);
                    b.push_str(r#""},"logprobs":null,"finish_reason":null}]"#);
                }
            }
            b.push_str(tail);
        });
    }
    let usage_in_final = knobs.usage_in_final_chunk;
    sse.event(None, |b| {
        b.push_str(&head);
        w!(
            b,
            r#"[{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":"{finish}"}}]"#
        );
        match &usage {
            Some(usage) if usage_in_final => w!(b, r#","usage":{usage}}}"#),
            _ => b.push_str(tail),
        }
    });
    if let Some(usage) = usage.as_ref().filter(|_| include_usage && !usage_in_final) {
        sse.event(None, |b| {
            b.push_str(&head);
            w!(b, r#"[],"usage":{usage}}}"#);
        });
    }
    sse.event(None, |b| b.push_str("[DONE]"));
    Ok(Reply::Sse(sse))
}

/// A chat answer's `usage` object: cached prompt tokens as `prompt_tokens_details`, or
/// (`x-mock-usage-style: deepseek`) as DeepSeek's hit / miss counts.
fn chat_usage(knobs: &Knobs, prompt: u64, completion: u64) -> String {
    let mut u = String::with_capacity(128);
    w!(
        u,
        r#"{{"prompt_tokens":{prompt},"completion_tokens":{completion},"total_tokens":{}"#,
        prompt.saturating_add(completion)
    );
    match knobs.usage_style {
        UsageStyle::Openai => {
            if let Some(cached) = knobs.cache_read_tokens {
                w!(
                    u,
                    r#","prompt_tokens_details":{{"cached_tokens":{cached}}}"#
                );
            }
        }
        UsageStyle::Deepseek => {
            let hit = knobs.cache_read_tokens.unwrap_or(0);
            w!(
                u,
                r#","prompt_cache_hit_tokens":{hit},"prompt_cache_miss_tokens":{}"#,
                prompt.saturating_sub(hit)
            );
        }
    }
    u.push('}');
    u
}

/// The names of a chat request's function tools.
fn tool_names(req: &Value) -> impl Iterator<Item = &str> {
    req.get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| t.get("function")?.get("name")?.as_str())
}

/// `POST /v1/responses`
pub(crate) fn responses(req: &Value, ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let model = str_lit(model(req)?);
    let input_tokens = match req.get("input") {
        Some(text @ Value::String(_)) => message_tokens(Some(text), RESPONSES_TEXT),
        Some(Value::Array(items)) => {
            conversation_tokens(items.iter().map(|i| i.get("content")), RESPONSES_TEXT)
        }
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(
                "missing required parameter: 'input'",
                Some("input"),
            ))
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "'input' must be a string or an array",
                Some("input"),
            ))
        }
    };
    let instructions = match req.get("instructions") {
        None | Some(Value::Null) => 0,
        Some(text @ Value::String(_)) => message_tokens(Some(text), RESPONSES_TEXT),
        Some(_) => {
            return Err(ApiError::invalid(
                "'instructions' must be a string",
                Some("instructions"),
            ))
        }
    };
    let stream = opt_bool(req, "stream", "stream")?;
    let cap = opt_u64(req, "max_output_tokens")?;

    let knobs = ctx.knobs;
    let user_text = match req.get("input") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(items)) => last_user_text(items, RESPONSES_TEXT),
        _ => String::new(),
    };
    let completion = Completion::new(knobs.echo, &user_text);
    let prompt = knobs
        .prompt_tokens
        .unwrap_or_else(|| input_tokens.saturating_add(instructions).max(1));
    let (n, capped) = completion.count(knobs, cap);
    let usage = if knobs.no_usage {
        "null".to_owned()
    } else {
        format!(
            r#"{{"input_tokens":{prompt},"input_tokens_details":{{"cached_tokens":{}}},"output_tokens":{n},"output_tokens_details":{{"reasoning_tokens":0}},"total_tokens":{}}}"#,
            knobs.cache_read_tokens.unwrap_or(0),
            prompt.saturating_add(n)
        )
    };
    let id = ctx.id;
    let created = ctx.created;
    // The response object; `done`: the final one (with output and usage), else in progress.
    let response = |b: &mut String, done: bool| {
        let status = match (done, capped) {
            (false, _) => "in_progress",
            (true, false) => "completed",
            (true, true) => "incomplete",
        };
        w!(
            b,
            r#"{{"id":"resp_mock_{id}","object":"response","created_at":{created},"status":"{status}","model":{model},"output":["#
        );
        if done {
            w!(
                b,
                r#"{{"type":"message","id":"msg_mock_{id}","status":"{}","role":"assistant","content":[{{"type":"output_text","text":""#,
                if capped { "incomplete" } else { "completed" }
            );
            completion.push_all(b, n);
            b.push_str(r#"","annotations":[]}]}"#);
        }
        b.push_str(r#"],"incomplete_details":"#);
        b.push_str(if done && capped {
            r#"{"reason":"max_output_tokens"}"#
        } else {
            "null"
        });
        b.push_str(r#","usage":"#);
        b.push_str(if done { &usage } else { "null" });
        b.push('}');
    };

    if !stream {
        let mut b = String::with_capacity(448 + model.len() + tokens_len(n));
        response(&mut b, true);
        return Ok(Reply::Json(b));
    }

    let mut sse = Sse::new(n.saturating_add(2));
    sse.event(Some("response.created"), |b| {
        b.push_str(r#"{"type":"response.created","sequence_number":0,"response":"#);
        response(b, false);
        b.push('}');
    });
    for i in 0..n {
        sse.event(Some("response.output_text.delta"), |b| {
            w!(
                b,
                r#"{{"type":"response.output_text.delta","sequence_number":{},"item_id":"msg_mock_{id}","output_index":0,"content_index":0,"delta":""#,
                i + 1
            );
            completion.push(b, i);
            b.push_str(r#""}"#);
        });
    }
    let last = if capped {
        "response.incomplete"
    } else {
        "response.completed"
    };
    sse.event(Some(last), |b| {
        w!(
            b,
            r#"{{"type":"{last}","sequence_number":{},"response":"#,
            n.saturating_add(1)
        );
        response(b, true);
        b.push('}');
    });
    Ok(Reply::Sse(sse))
}

/// `POST /v1/embeddings` (and Azure's embeddings of a deployment)
pub(crate) fn embeddings(req: &Value, ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let model = str_lit(model_or_deployment(req, ctx.deployment)?);
    let bad_input = || {
        ApiError::invalid(
            "'input' must be a string, an array of strings, or token arrays",
            Some("input"),
        )
    };
    // The token count of each input.
    let inputs: Vec<u64> = match req.get("input") {
        Some(Value::String(s)) => vec![text_tokens(s.chars().count())],
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid(
                "'input' must not be empty",
                Some("input"),
            ))
        }
        // One pre-tokenized input.
        Some(Value::Array(items)) if items.iter().all(Value::is_u64) => vec![items.len() as u64],
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(text_tokens(s.chars().count())),
                Value::Array(tokens) if tokens.iter().all(Value::is_u64) => Ok(tokens.len() as u64),
                _ => Err(bad_input()),
            })
            .collect::<Result<_, _>>()?,
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(
                "missing required parameter: 'input'",
                Some("input"),
            ))
        }
        Some(_) => return Err(bad_input()),
    };
    let prompt = ctx
        .knobs
        .prompt_tokens
        .unwrap_or_else(|| inputs.iter().fold(0u64, |a, &t| a.saturating_add(t)).max(1));

    let mut b = String::with_capacity(128 + inputs.len() * 128);
    b.push_str(r#"{"object":"list","data":["#);
    for (index, &tokens) in inputs.iter().enumerate() {
        if index > 0 {
            b.push(',');
        }
        w!(b, r#"{{"object":"embedding","index":{index},"embedding":["#);
        for j in 0..8u64 {
            if j > 0 {
                b.push(',');
            }
            // Small, deterministic, different per input and per dimension.
            let seed = (index as u64)
                .wrapping_mul(31)
                .wrapping_add(j.wrapping_mul(7))
                .wrapping_add(tokens);
            w!(b, "{:.4}", ((seed % 97) as f64 / 97.0 - 0.5) / 10.0);
        }
        b.push_str("]}");
    }
    w!(b, r#"],"model":{model}"#);
    if !ctx.knobs.no_usage {
        w!(
            b,
            r#","usage":{{"prompt_tokens":{prompt},"total_tokens":{prompt}}}"#
        );
    }
    b.push('}');
    Ok(Reply::Json(b))
}

/// Room for `n` tokens of text.
pub(crate) fn tokens_len(n: u64) -> usize {
    usize::try_from(n).unwrap_or(0).saturating_mul(8)
}
