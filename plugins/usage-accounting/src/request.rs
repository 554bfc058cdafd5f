//! The request side: what the client asked for, and making a chat stream carry usage.
//!
//! OpenAI sends usage in a stream only when the request says
//! `stream_options: {"include_usage": true}`; it then adds one last chunk with an empty
//! `choices` and the `usage`. [`inspect`] reads the top level of the body with
//! [`shared::json`](llm_gateway_shared::json) (one validating pass, nothing nested is
//! allocated) and, for a streaming Chat Completions request without it, returns the body with
//! `include_usage: true` spliced in — every other byte as the client sent it.

use llm_gateway_shared::json::{self, Edits, Kind, Limits};
use llm_gateway_shared::request::Api;

/// What the request says about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestInfo {
    /// `stream: true`.
    pub stream: bool,
    /// The client itself asked for `include_usage` (then its usage chunk is never hidden).
    pub client_include_usage: bool,
    /// The gateway added `include_usage`: the usage-only chunk must be hidden from the client.
    pub injected_include_usage: bool,
    /// The `model` of the body (the deployment's model once the router rewrote it).
    pub model: Option<String>,
}

/// Reads a request body; returns what it says and, when `inject` is on and the gateway must
/// add `include_usage`, the new body. A body that is not a JSON object gives the defaults and
/// no new body (the upstream will refuse it; the gateway does not judge it here).
pub fn inspect(api: Api, body: &[u8], inject: bool) -> (RequestInfo, Option<Vec<u8>>) {
    let limits = Limits::default();
    let Ok(object) = json::scan_object(body, &limits) else {
        return (RequestInfo::default(), None);
    };
    let mut info = RequestInfo {
        stream: object.bool(body, "stream").ok().flatten().unwrap_or(false),
        model: object.str(body, "model").ok().flatten(),
        ..RequestInfo::default()
    };
    if api != Api::ChatCompletions || !info.stream {
        return (info, None);
    }
    let options = object.get("stream_options");
    let options_raw = options.and_then(|m| body.get(m.value.clone()));
    let new_options = match (options.map(|m| m.kind), options_raw) {
        (Some(Kind::Object), Some(raw)) => match json::scan_object(raw, &limits) {
            Ok(inner) => {
                if inner.bool(raw, "include_usage").ok().flatten() == Some(true) {
                    info.client_include_usage = true;
                    return (info, None);
                }
                let mut edits = Edits::new(raw, &inner);
                edits.set("include_usage", b"true".to_vec());
                edits.finish()
            }
            Err(_) => return (info, None),
        },
        // absent or null: the client did not ask
        (None, _) | (Some(Kind::Null), _) => br#"{"include_usage":true}"#.to_vec(),
        // any other type is the client's error; leave it for the upstream to refuse
        _ => return (info, None),
    };
    if !inject {
        return (info, None);
    }
    let mut edits = Edits::new(body, &object);
    edits.set("stream_options", new_options);
    info.injected_include_usage = true;
    (info, Some(edits.finish()))
}

/// The `model` of a request body, as [`inspect`] reads it (`None` if the body is not a JSON
/// object or its model not a string).
pub fn model(body: &[u8]) -> Option<String> {
    let object = json::scan_object(body, &Limits::default()).ok()?;
    object.str(body, "model").ok().flatten()
}

/// False only when `body` cannot hold a member `"stream": true`, whatever else it holds: then
/// [`inspect`] reads `stream: false` and changes nothing, and its validating scan (the bulk of
/// a request's cost, linear in the prompt) can wait until the model is needed.
///
/// A JSON `true` is never escaped, and a member's value follows its colon: each colon followed
/// by `true` (JSON whitespace between) is looked at. One that follows a string key whose raw
/// bytes are `stream`, or hold a backslash (an escaped key might read `stream`), or whose
/// quotes might be escaped, makes the answer true. Any other (inside a string, the value of
/// another key) cannot be `stream`'s value. One pass of byte searches; conservative: true
/// whenever unsure.
#[inline(never)]
pub fn may_stream(body: &[u8]) -> bool {
    let ws = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    let mut from = 0;
    // colons are rare in prose: look for the colons followed by `true`
    while let Some(found) = body.get(from..).and_then(|rest| find_byte(rest, b':')) {
        let colon = from + found;
        from = colon + 1;
        let after = body.get(from..).unwrap_or_default();
        let value = after.iter().position(|&b| !ws(b)).unwrap_or(after.len());
        if after.get(value..value + 4) != Some(b"true") {
            continue;
        }
        let head = body.get(..colon).unwrap_or_default();
        let Some(close) = head.iter().rposition(|&b| !ws(b)) else {
            continue;
        };
        if head.get(close) != Some(&b'"') {
            continue;
        }
        let Some(open) = head
            .get(..close)
            .and_then(|h| h.iter().rposition(|&b| b == b'"'))
        else {
            return true;
        };
        let key = head.get(open + 1..close).unwrap_or_default();
        let escaped_quote = |i: usize| i > 0 && head.get(i - 1) == Some(&b'\\');
        if key == b"stream" || key.contains(&b'\\') || escaped_quote(open) || escaped_quote(close) {
            return true;
        }
    }
    false
}

/// The first `needle` in `hay`, 32 bytes at a time (a prompt is mostly bytes that are not the
/// one sought): four words tested together, the block searched byte by byte only when one of
/// them holds the needle. Never inlined: it runs once per request, and inlined it would
/// only grow its callers.
#[inline(never)]
fn find_byte(hay: &[u8], needle: u8) -> Option<usize> {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);
    let pattern = ONES * u64::from(needle);
    // a zero byte in `x` (a byte equal to the needle) sets its high bit in `zero(x) & HIGHS`
    let zero = |x: u64| x.wrapping_sub(ONES) & !x;
    let word = |block: &[u8], at: usize| {
        block
            .get(at..at + 8)
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            .map_or(0, |w| u64::from_le_bytes(w) ^ pattern)
    };
    let mut blocks = hay.chunks_exact(32);
    let mut at = 0;
    for block in blocks.by_ref() {
        let any = zero(word(block, 0))
            | zero(word(block, 8))
            | zero(word(block, 16))
            | zero(word(block, 24));
        if any & HIGHS != 0 {
            if let Some(i) = block.iter().position(|&b| b == needle) {
                return Some(at + i);
            }
        }
        at += 32;
    }
    blocks
        .remainder()
        .iter()
        .position(|&b| b == needle)
        .map(|i| at + i)
}

/// The text a non-streaming response generated (for counting when it carries no usage).
pub fn response_text(api: Api, body: &[u8]) -> String {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return String::new();
    };
    let mut text = String::new();
    let mut push = |v: Option<&serde_json::Value>| {
        if let Some(s) = v.and_then(serde_json::Value::as_str) {
            text.push_str(s);
        }
    };
    let items = |key: &str| {
        value
            .get(key)
            .and_then(serde_json::Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    match api {
        Api::ChatCompletions => {
            for choice in items("choices") {
                push(choice.get("message").and_then(|m| m.get("content")));
            }
        }
        Api::AnthropicMessages => {
            for block in items("content") {
                push(block.get("text"));
            }
        }
        Api::Responses => {
            for item in items("output") {
                for part in item
                    .get("content")
                    .and_then(serde_json::Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    push(part.get("text"));
                }
            }
        }
        Api::Embeddings => {}
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn run(body: Value) -> (RequestInfo, Option<Value>) {
        let bytes = body.to_string().into_bytes();
        let (info, new) = inspect(Api::ChatCompletions, &bytes, true);
        (info, new.map(|b| serde_json::from_slice(&b).unwrap()))
    }

    #[test]
    fn injects_into_a_stream_without_options() {
        let (info, body) = run(json!({"model": "m", "stream": true, "messages": []}));
        assert!(info.stream && info.injected_include_usage && !info.client_include_usage);
        assert_eq!(info.model.as_deref(), Some("m"));
        assert_eq!(
            body.unwrap(),
            json!({"model": "m", "stream": true, "messages": [], "stream_options": {"include_usage": true}})
        );
    }

    #[test]
    fn keeps_other_stream_options_and_overrides_false() {
        let (info, body) =
            run(json!({"stream": true, "stream_options": {"include_usage": false, "x": 1}}));
        assert!(info.injected_include_usage);
        assert_eq!(
            body.unwrap()["stream_options"],
            json!({"include_usage": true, "x": 1})
        );
        let (info, body) = run(json!({"stream": true, "stream_options": null}));
        assert!(info.injected_include_usage);
        assert_eq!(
            body.unwrap()["stream_options"],
            json!({"include_usage": true})
        );
    }

    #[test]
    fn leaves_alone_what_needs_nothing() {
        let (info, body) = run(json!({"stream": true, "stream_options": {"include_usage": true}}));
        assert!(info.client_include_usage && !info.injected_include_usage && body.is_none());
        let (info, body) = run(json!({"stream": false}));
        assert!(!info.stream && body.is_none());
        let (_, body) = run(json!({"stream": true, "stream_options": "x"}));
        assert!(body.is_none());
        let (info, body) = inspect(Api::ChatCompletions, b"{not json", true);
        assert_eq!((info, body), (RequestInfo::default(), None));
        let (info, body) = inspect(Api::AnthropicMessages, br#"{"stream":true}"#, true);
        assert!(info.stream && body.is_none());
        let (info, body) = inspect(Api::ChatCompletions, br#"{"stream":true}"#, false);
        assert!(!info.injected_include_usage && body.is_none());
    }

    #[test]
    fn nested_bytes_are_untouched() {
        let body = br#"{"stream":true,"messages":[{"role":"user","content":"a  \u00e9"}]}"#;
        let (_, new) = inspect(Api::ChatCompletions, body, true);
        let new = String::from_utf8(new.unwrap()).unwrap();
        assert!(new.contains(r#""content":"a  \u00e9""#), "{new}");
    }

    #[test]
    fn find_byte_finds_the_first() {
        // three 32-byte blocks and every remainder; bytes next to the needle's value (`;`,
        // `9`) and 0x01 (a borrow in the word test) around it
        for len in 0..100 {
            for at in 0..=len {
                let mut hay: Vec<u8> = (0..len).map(|i| [b'a', b';', b'9', 0x01][i % 4]).collect();
                if at < len {
                    hay[at] = b':';
                    if at + 9 < len {
                        hay[at + 9] = b':';
                    }
                }
                hay.iter_mut().take(at).for_each(|b| *b = 0xba);
                let expected = hay.iter().position(|&b| b == b':');
                assert_eq!(find_byte(&hay, b':'), expected, "{len} {at}");
            }
        }
    }

    #[test]
    fn may_stream_is_false_only_without_stream_true() {
        for body in [
            &br#"{"model":"m","stream":true}"#[..],
            br#"{"stream" :	true}"#,
            br#"{"s\u0074ream":true}"#,
            br#"{"a":"x\"stream\": true"}"#,
            br#"{"tools":[{"stream":true}]}"#,
            br#"{"stream":true,"stream":false}"#,
        ] {
            assert!(may_stream(body), "{}", String::from_utf8_lossy(body));
        }
        for body in [
            &br#"{"model":"m","messages":[{"role":"user","content":"it is true: true"}]}"#[..],
            br#"{"stream":false,"logprobs":true,"n":1}"#,
            br#"{"streams":true}"#,
            b"true",
            b"",
        ] {
            assert!(!may_stream(body), "{}", String::from_utf8_lossy(body));
            let (info, new) = inspect(Api::ChatCompletions, body, true);
            assert!(!info.stream && new.is_none());
            assert_eq!(info.model, model(body));
        }
    }

    #[test]
    fn response_text_of_each_api() {
        let chat = br#"{"choices":[{"message":{"content":"hi there"}}]}"#;
        assert_eq!(response_text(Api::ChatCompletions, chat), "hi there");
        let anthropic = br#"{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}"#;
        assert_eq!(response_text(Api::AnthropicMessages, anthropic), "ab");
        let responses = br#"{"output":[{"content":[{"type":"output_text","text":"x"}]}]}"#;
        assert_eq!(response_text(Api::Responses, responses), "x");
        assert_eq!(response_text(Api::ChatCompletions, b"{"), "");
    }

    proptest::proptest! {
        #[test]
        fn any_body_is_safe_and_injection_only_adds_the_option(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let (_, new) = inspect(Api::ChatCompletions, &body, true);
            if let Some(new) = new {
                let before: Value = serde_json::from_slice(&body).unwrap();
                let mut after: Value = serde_json::from_slice(&new).unwrap();
                proptest::prop_assert_eq!(after["stream_options"]["include_usage"].clone(), json!(true));
                after.as_object_mut().unwrap().remove("stream_options");
                let mut before = before;
                before.as_object_mut().unwrap().remove("stream_options");
                proptest::prop_assert_eq!(after, before);
            }
        }

        /// Whenever the scan is deferred, the full inspection would have read no stream and
        /// changed nothing, and the model read later is the one it reads.
        #[test]
        fn a_deferred_body_is_one_inspect_leaves_alone(
            parts in proptest::collection::vec(proptest::sample::select(vec![
                "{", "}", "[", "]", ":", ",", " ", "\"stream\"", "\"model\"", "\"m\"", "true",
                "false", "null", "\"s\\u0074ream\"", "\"stream_options\"", "\"include_usage\"",
                "\"x\\\"\"", "1",
            ]), 0..24),
        ) {
            let body = parts.concat();
            if !may_stream(body.as_bytes()) {
                for api in [Api::ChatCompletions, Api::AnthropicMessages] {
                    let (info, new) = inspect(api, body.as_bytes(), true);
                    proptest::prop_assert!(!info.stream && new.is_none(), "{}", body);
                    proptest::prop_assert_eq!(info.model, model(body.as_bytes()));
                }
            }
        }

        #[test]
        fn streaming_chat_bodies_always_get_the_option(content in ".{0,40}", extra in proptest::option::of(0u32..5)) {
            let mut body = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": content}]});
            if let Some(n) = extra {
                body["stream_options"] = json!({"x": n});
            }
            let (info, new) = inspect(Api::ChatCompletions, body.to_string().as_bytes(), true);
            proptest::prop_assert!(info.injected_include_usage);
            let new: Value = serde_json::from_slice(&new.unwrap()).unwrap();
            proptest::prop_assert_eq!(new["stream_options"]["include_usage"].clone(), json!(true));
            proptest::prop_assert_eq!(&new["messages"], &body["messages"]);
        }
    }
}
