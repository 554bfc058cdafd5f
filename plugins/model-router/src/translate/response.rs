//! JSON response bodies: Chat ⇄ Messages, by the table of the [module docs](super).

use super::{
    finish_reason, push_value, stop_reason, to_json, Malformed, ResponseParams, Usage, Wire,
};
use llm_gateway_shared::json::push_quoted;
use serde_json::{json, Value};

/// `body` (a 2xx JSON response of API `from`) as a response of API `to`. A response of the
/// client's own API comes back unchanged.
pub fn response(
    from: Wire,
    to: Wire,
    body: &[u8],
    params: &ResponseParams,
) -> Result<Vec<u8>, Malformed> {
    match (from, to) {
        (Wire::Messages, Wire::Chat) => messages_to_chat(&parse(body)?, params),
        (Wire::Chat, Wire::Messages) => chat_to_messages(&parse(body)?),
        (Wire::Chat, Wire::Chat) | (Wire::Messages, Wire::Messages) => Ok(body.to_vec()),
    }
}

fn parse(body: &[u8]) -> Result<Value, Malformed> {
    match serde_json::from_slice::<Value>(body) {
        Ok(value @ Value::Object(_)) => Ok(value),
        Ok(_) => Err(Malformed("the body is not a JSON object".into())),
        Err(e) => Err(Malformed(format!(
            "the body is not JSON (line {}, column {})",
            e.line(),
            e.column()
        ))),
    }
}

fn str_of<'v>(value: &'v Value, key: &str) -> &'v str {
    value.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// What an assistant answer holds, in either API.
struct Answer {
    text: String,
    /// (id, name, arguments as JSON text)
    calls: Vec<(String, String, String)>,
}

fn messages_to_chat(body: &Value, params: &ResponseParams) -> Result<Vec<u8>, Malformed> {
    let Some(Value::Array(blocks)) = body.get("content") else {
        return Err(Malformed("`content` is not an array".into()));
    };
    let mut answer = Answer {
        text: String::new(),
        calls: Vec::new(),
    };
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => answer.text.push_str(str_of(block, "text")),
            Some("tool_use") => {
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                answer.calls.push((
                    str_of(block, "id").to_string(),
                    str_of(block, "name").to_string(),
                    String::from_utf8(to_json(&input)).unwrap_or_default(),
                ));
            }
            // thinking, redacted_thinking, server tool blocks
            _ => {}
        }
    }
    let finish = finish_reason(body.get("stop_reason").and_then(Value::as_str));
    let usage = body
        .get("usage")
        .map(Usage::from_messages)
        .unwrap_or_default();

    let mut out = Vec::with_capacity(answer.text.len() + 256);
    out.extend_from_slice(b"{\"id\":");
    push_quoted(&mut out, str_of(body, "id"));
    out.extend_from_slice(b",\"object\":\"chat.completion\",\"created\":");
    super::push_number(&mut out, params.created);
    out.extend_from_slice(b",\"model\":");
    push_quoted(&mut out, str_of(body, "model"));
    out.extend_from_slice(
        b",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":",
    );
    if answer.text.is_empty() {
        out.extend_from_slice(b"null");
    } else {
        push_quoted(&mut out, &answer.text);
    }
    if !answer.calls.is_empty() {
        let calls: Vec<Value> = answer
            .calls
            .iter()
            .map(|(id, name, arguments)| {
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
            })
            .collect();
        out.extend_from_slice(b",\"tool_calls\":");
        push_value(&mut out, &Value::Array(calls));
    }
    out.extend_from_slice(b",\"refusal\":null},\"logprobs\":null,\"finish_reason\":");
    push_quoted(&mut out, finish);
    out.extend_from_slice(b"}],\"usage\":");
    usage.write_chat(&mut out);
    out.push(b'}');
    Ok(out)
}

fn chat_to_messages(body: &Value) -> Result<Vec<u8>, Malformed> {
    let Some(Value::Array(choices)) = body.get("choices") else {
        return Err(Malformed("`choices` is not an array".into()));
    };
    let choice = choices
        .iter()
        .find(|c| c.get("index").and_then(Value::as_u64) == Some(0))
        .or_else(|| choices.first())
        .ok_or_else(|| Malformed("`choices` is empty".into()))?;
    let message = choice.get("message").unwrap_or(&Value::Null);
    let mut text = match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts.iter().map(|p| str_of(p, "text")).collect(),
        _ => String::new(),
    };
    if text.is_empty() {
        text = str_of(message, "refusal").to_string();
    }
    let mut content = Vec::new();
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    if let Some(Value::Array(calls)) = message.get("tool_calls") {
        for call in calls {
            let function = call.get("function").unwrap_or(&Value::Null);
            let input = match serde_json::from_str::<Value>(str_of(function, "arguments")) {
                Ok(input @ Value::Object(_)) => input,
                _ => json!({}),
            };
            content.push(json!({
                "type": "tool_use",
                "id": str_of(call, "id"),
                "name": str_of(function, "name"),
                "input": input,
            }));
        }
    }
    let stop = stop_reason(choice.get("finish_reason").and_then(Value::as_str));
    let usage = body.get("usage").map(Usage::from_chat).unwrap_or_default();

    let mut out = Vec::with_capacity(text.len() + 256);
    out.extend_from_slice(b"{\"id\":");
    push_quoted(&mut out, str_of(body, "id"));
    out.extend_from_slice(b",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
    push_quoted(&mut out, str_of(body, "model"));
    out.extend_from_slice(b",\"content\":");
    push_value(&mut out, &Value::Array(content));
    out.extend_from_slice(b",\"stop_reason\":");
    push_quoted(&mut out, stop);
    out.extend_from_slice(b",\"stop_sequence\":null,\"usage\":");
    usage.write_messages(&mut out);
    out.push(b'}');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const PARAMS: ResponseParams = ResponseParams {
        created: 1_700_000_000,
    };

    fn translate(from: Wire, to: Wire, body: &Value) -> Value {
        let out = response(from, to, &serde_json::to_vec(body).unwrap(), &PARAMS).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn a_messages_answer_becomes_a_chat_completion() {
        let body = json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "Hello"},
                {"type": "text", "text": ", world"},
                {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"q": "a\"b", "n": 1}}
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 100,
                      "cache_creation_input_tokens": 7}
        });
        assert_eq!(
            translate(Wire::Messages, Wire::Chat, &body),
            json!({
                "id": "msg_1", "object": "chat.completion", "created": 1_700_000_000u64,
                "model": "claude-x",
                "choices": [{"index": 0, "message": {
                    "role": "assistant", "content": "Hello, world",
                    "tool_calls": [{"id": "toolu_1", "type": "function",
                                    "function": {"name": "get", "arguments": "{\"n\":1,\"q\":\"a\\\"b\"}"}}],
                    "refusal": null
                }, "logprobs": null, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 117, "completion_tokens": 5, "total_tokens": 122,
                          "prompt_tokens_details": {"cached_tokens": 100, "cache_creation_tokens": 7}}
            })
        );
    }

    #[test]
    fn stop_reasons_map_to_finish_reasons() {
        for (stop, finish) in [
            (json!("end_turn"), "stop"),
            (json!("stop_sequence"), "stop"),
            (json!("max_tokens"), "length"),
            (json!("model_context_window_exceeded"), "length"),
            (json!("tool_use"), "tool_calls"),
            (json!("refusal"), "content_filter"),
            (json!("pause_turn"), "stop"),
            (json!(null), "stop"),
            (json!("something_new"), "stop"),
        ] {
            let body = json!({"id": "m", "model": "c", "content": [], "stop_reason": stop,
                              "usage": {"input_tokens": 1, "output_tokens": 2}});
            let out = translate(Wire::Messages, Wire::Chat, &body);
            assert_eq!(out["choices"][0]["finish_reason"], finish, "{stop}");
            // no text: content null; no cache creation: no such member
            assert_eq!(out["choices"][0]["message"]["content"], Value::Null);
            assert_eq!(
                out["usage"],
                json!({"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3,
                       "prompt_tokens_details": {"cached_tokens": 0}})
            );
        }
    }

    #[test]
    fn a_chat_completion_becomes_a_messages_answer() {
        let body = json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-x",
            "choices": [
                {"index": 1, "message": {"role": "assistant", "content": "other choice"}, "finish_reason": "stop"},
                {"index": 0, "message": {"role": "assistant", "content": "Hi",
                 "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":[1]}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "not json"}}
                 ]}, "finish_reason": "tool_calls"}
            ],
            "usage": {"prompt_tokens": 120, "completion_tokens": 9, "total_tokens": 129,
                      "prompt_tokens_details": {"cached_tokens": 100, "cache_creation_tokens": 5}}
        });
        assert_eq!(
            translate(Wire::Chat, Wire::Messages, &body),
            json!({
                "id": "chatcmpl-1", "type": "message", "role": "assistant", "model": "gpt-x",
                "content": [
                    {"type": "text", "text": "Hi"},
                    {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": [1]}},
                    {"type": "tool_use", "id": "call_2", "name": "g", "input": {}}
                ],
                "stop_reason": "tool_use", "stop_sequence": null,
                "usage": {"input_tokens": 15, "output_tokens": 9, "cache_read_input_tokens": 100,
                          "cache_creation_input_tokens": 5}
            })
        );
    }

    #[test]
    fn finish_reasons_map_to_stop_reasons() {
        for (finish, stop) in [
            (json!("stop"), "end_turn"),
            (json!("length"), "max_tokens"),
            (json!("tool_calls"), "tool_use"),
            (json!("function_call"), "tool_use"),
            (json!("content_filter"), "refusal"),
            (json!(null), "end_turn"),
        ] {
            let body = json!({"id": "c", "model": "m", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": finish}]});
            let out = translate(Wire::Chat, Wire::Messages, &body);
            assert_eq!(out["stop_reason"], stop, "{finish}");
            // empty text: no block; no usage: zeros
            assert_eq!(out["content"], json!([]));
            assert_eq!(
                out["usage"],
                json!({"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0,
                       "cache_creation_input_tokens": 0})
            );
        }
    }

    #[test]
    fn deepseek_cache_hits_and_refusals() {
        let body = json!({"id": "c", "model": "deepseek-chat", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": null, "refusal": "I can't."},
             "finish_reason": "content_filter"}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 3, "prompt_cache_hit_tokens": 32,
                      "prompt_cache_miss_tokens": 18}});
        let out = translate(Wire::Chat, Wire::Messages, &body);
        assert_eq!(
            out["content"],
            json!([{"type": "text", "text": "I can't."}])
        );
        assert_eq!(out["stop_reason"], "refusal");
        assert_eq!(out["usage"]["input_tokens"], 18);
        assert_eq!(out["usage"]["cache_read_input_tokens"], 32);
    }

    #[test]
    fn the_same_api_passes_unchanged_and_bad_bodies_are_malformed() {
        for api in [Wire::Chat, Wire::Messages] {
            assert_eq!(
                response(api, api, b"anything", &PARAMS).unwrap(),
                b"anything"
            );
        }
        for (from, to, body) in [
            (Wire::Messages, Wire::Chat, &b"not json"[..]),
            (Wire::Messages, Wire::Chat, b"[1]"),
            (Wire::Messages, Wire::Chat, b"{\"content\":\"x\"}"),
            (Wire::Chat, Wire::Messages, b""),
            (Wire::Chat, Wire::Messages, b"{\"choices\":{}}"),
            (Wire::Chat, Wire::Messages, b"{\"choices\":[]}"),
        ] {
            let err = response(from, to, body, &PARAMS).unwrap_err();
            assert_eq!(err.reject().status, 502, "{body:?}");
        }
    }
}
