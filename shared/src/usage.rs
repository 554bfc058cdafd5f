//! Token usage as the upstream reports it, for every API the gateway speaks.
//!
//! One normalized [`Usage`] for all APIs: `prompt_tokens` is **all** input tokens, cached and
//! cache-written ones included, and `completion_tokens` is all output tokens, reasoning
//! included; `cached_prompt_tokens`, `cache_write_tokens` and `reasoning_tokens` are parts of
//! those totals. OpenAI already counts that way; Anthropic reports `input_tokens` *without* the
//! cache reads and writes, so its three numbers are added up here (and only here).
//!
//! What is read:
//!
//! | API | non-streaming | streaming |
//! |---|---|---|
//! | Chat Completions | `usage` | `usage` of any chunk (the usage-only chunk, or the final chunk with `choices`); last one wins |
//! | Responses | `usage` | `response.usage` of `response.completed` / `response.incomplete` / `response.failed` |
//! | Anthropic Messages | `usage` | `message_start` (input and cache tokens), `message_delta` (output; input again on newer API versions); each field replaced, never added |
//! | Embeddings | `usage` | — |
//!
//! Cached prompt fields: `prompt_tokens_details.cached_tokens` (OpenAI chat),
//! `input_tokens_details.cached_tokens` (Responses), `prompt_cache_hit_tokens` (DeepSeek),
//! `cache_read_input_tokens` / `cache_creation_input_tokens` (Anthropic). Reasoning:
//! `completion_tokens_details.reasoning_tokens`, `output_tokens_details.reasoning_tokens`.
//!
//! The stream side is a state machine over SSE events ([`StreamUsage::on_event`]): each event's
//! data is parsed once, on its own — work proportional to the event, never to the body. It also
//! reports what a filter needs to decide about the event (a usage-only chunk it may hide; the
//! streamed text it may count when the upstream sends no usage).

use crate::request::Api;
use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;

/// Token counts of one request, normalized across APIs (see the module doc).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// All input tokens, cached and cache-written included.
    pub prompt_tokens: u64,
    /// All output tokens, reasoning included.
    pub completion_tokens: u64,
    /// Input tokens read from the provider's prompt cache (part of `prompt_tokens`).
    pub cached_prompt_tokens: u64,
    /// Input tokens written to the prompt cache (Anthropic; part of `prompt_tokens`).
    pub cache_write_tokens: u64,
    /// Reasoning tokens (part of `completion_tokens`).
    pub reasoning_tokens: u64,
}

impl Usage {
    /// `prompt_tokens + completion_tokens`.
    pub fn total_tokens(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }

    /// Input tokens billed at the full input price: neither read from nor written to a cache.
    pub fn uncached_prompt_tokens(&self) -> u64 {
        self.prompt_tokens
            .saturating_sub(self.cached_prompt_tokens)
            .saturating_sub(self.cache_write_tokens)
    }

    /// The usage object of an OpenAI-style API (Chat Completions, Responses, embeddings).
    /// `None` if `value` is not an object with at least one token count.
    pub fn from_openai(value: &Value) -> Option<Usage> {
        let object = value.as_object()?;
        let prompt = uint(value, &["prompt_tokens"]).or_else(|| uint(value, &["input_tokens"]));
        let completion =
            uint(value, &["completion_tokens"]).or_else(|| uint(value, &["output_tokens"]));
        if prompt.is_none() && completion.is_none() && !object.contains_key("total_tokens") {
            return None;
        }
        let cached = uint(value, &["prompt_tokens_details", "cached_tokens"])
            .or_else(|| uint(value, &["input_tokens_details", "cached_tokens"]))
            .or_else(|| uint(value, &["prompt_cache_hit_tokens"]))
            .unwrap_or(0);
        let reasoning = uint(value, &["completion_tokens_details", "reasoning_tokens"])
            .or_else(|| uint(value, &["output_tokens_details", "reasoning_tokens"]))
            .unwrap_or(0);
        let prompt = prompt.unwrap_or(0);
        Some(Usage {
            prompt_tokens: prompt,
            completion_tokens: completion.unwrap_or(0),
            cached_prompt_tokens: cached.min(prompt),
            cache_write_tokens: 0,
            reasoning_tokens: reasoning,
        })
    }

    /// Applies an Anthropic usage object: each field present replaces the one seen before
    /// (`message_start` then `message_delta` of one stream report the same input twice on
    /// newer API versions; adding would double count).
    fn apply_anthropic(&mut self, parts: &mut AnthropicParts, value: &Value) -> bool {
        let mut any = false;
        for (field, slot) in [
            ("input_tokens", &mut parts.input),
            ("cache_read_input_tokens", &mut parts.cache_read),
            ("cache_creation_input_tokens", &mut parts.cache_write),
            ("output_tokens", &mut parts.output),
        ] {
            if let Some(n) = uint(value, &[field]) {
                *slot = n;
                any = true;
            }
        }
        if any {
            *self = parts.usage();
        }
        any
    }

    /// The usage object of a non-streaming Anthropic Messages response.
    pub fn from_anthropic(value: &Value) -> Option<Usage> {
        let mut usage = Usage::default();
        let mut parts = AnthropicParts::default();
        usage.apply_anthropic(&mut parts, value).then_some(usage)
    }
}

/// Anthropic's separate counters, kept so a later event can replace one of them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct AnthropicParts {
    input: u64,
    cache_read: u64,
    cache_write: u64,
    output: u64,
}

impl AnthropicParts {
    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self
                .input
                .saturating_add(self.cache_read)
                .saturating_add(self.cache_write),
            completion_tokens: self.output,
            cached_prompt_tokens: self.cache_read,
            cache_write_tokens: self.cache_write,
            reasoning_tokens: 0,
        }
    }
}

fn uint(value: &Value, path: &[&str]) -> Option<u64> {
    let mut at = value;
    for key in path {
        at = at.get(key)?;
    }
    at.as_u64()
}

/// Usage and model of a whole (non-streaming) response body; `None` without usage.
pub fn from_response_body(api: Api, body: &[u8]) -> Option<(Usage, Option<String>)> {
    /// Only the two members needed; the bulk (`choices`, `data`, `content`) is skipped
    /// without building a tree.
    #[derive(Deserialize)]
    struct Body<'a> {
        #[serde(borrow, default)]
        model: Option<Cow<'a, str>>,
        #[serde(default)]
        usage: Option<Value>,
    }
    let parsed: Body<'_> = match serde_json::from_slice(body) {
        Ok(parsed) => parsed,
        // a `model` of another type must not lose the usage
        Err(_) => match serde_json::from_slice::<Value>(body).ok()? {
            Value::Object(mut members) => Body {
                model: None,
                usage: members.remove("usage"),
            },
            _ => return None,
        },
    };
    let usage = parsed.usage?;
    let usage = match api {
        Api::AnthropicMessages => Usage::from_anthropic(&usage),
        Api::ChatCompletions | Api::Responses | Api::Embeddings => Usage::from_openai(&usage),
    }?;
    Some((usage, parsed.model.map(Cow::into_owned)))
}

/// Usage from the **end** of a response body too large to keep whole (a big embeddings
/// answer): the last `"usage"` member in `tail` whose value parses as a usage object. Every
/// API puts `usage` after the bulky part (`choices`, `data`, `content`, `output`).
pub fn from_body_tail(api: Api, tail: &[u8]) -> Option<Usage> {
    const KEY: &[u8] = b"\"usage\"";
    let mut end = tail.len();
    while let Some(at) = tail
        .get(..end)
        .and_then(|head| head.windows(KEY.len()).rposition(|w| w == KEY))
    {
        end = at;
        let rest = tail.get(at + KEY.len()..).unwrap_or_default();
        let rest = rest.trim_ascii_start();
        let Some(rest) = rest.strip_prefix(b":") else {
            continue;
        };
        let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<Value>();
        if let Some(Ok(value)) = values.next() {
            let usage = match api {
                Api::AnthropicMessages => Usage::from_anthropic(&value),
                _ => Usage::from_openai(&value),
            };
            if usage.is_some() {
                return usage;
            }
        }
    }
    None
}

/// What one SSE event turned out to be, for the filter that forwards it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EventInfo {
    /// A Chat Completions chunk with `usage` and an empty `choices`: the extra chunk
    /// `include_usage` adds, which a client that did not ask for it must not see.
    pub usage_only: bool,
    /// The event carried usage.
    pub has_usage: bool,
    /// Generated text in this event (content, reasoning, tool-call arguments), for counting
    /// when no usage arrives. Empty for events without output.
    pub text: String,
}

/// Usage of one streamed response, event by event.
#[derive(Debug, Clone)]
pub struct StreamUsage {
    api: Api,
    usage: Option<Usage>,
    /// The usage seen is the whole response's (Anthropic: `message_delta` came).
    complete: bool,
    anthropic: AnthropicParts,
    model: Option<String>,
}

impl StreamUsage {
    /// A fresh stream of `api`.
    pub fn new(api: Api) -> Self {
        StreamUsage {
            api,
            usage: None,
            complete: false,
            anthropic: AnthropicParts::default(),
            model: None,
        }
    }

    /// The usage seen so far (the final one once the stream ended); `None` if none arrived.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// True once the usage covers the whole response: OpenAI-style APIs send it once, at the
    /// end; Anthropic sends the input in `message_start` and the output only in
    /// `message_delta`, so a stream cut between them has the input but not the output.
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// The model the upstream named, if it did.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// Takes one event: its `event:` name and its data (`data:` lines joined by `\n`).
    /// Unparseable data and `[DONE]` are ignored.
    pub fn on_event(&mut self, event: Option<&str>, data: &str) -> EventInfo {
        let mut info = EventInfo::default();
        let data = data.trim();
        if data.is_empty() || data == "[DONE]" {
            return info;
        }
        // Typed and borrowing: unknown members are skipped without building a tree, the
        // strings of a delta are borrowed unless they hold escapes.
        let parsed = match serde_json::from_str::<WireEvent<'_>>(data) {
            Ok(parsed) => parsed,
            // A member of an unexpected type (say a numeric `content`) must not lose the
            // usage of the event: read only the usage-bearing members, loosely. Without
            // `choices` such a chunk is never taken for a usage-only one (never hidden).
            Err(_) => match serde_json::from_str::<Value>(data) {
                Ok(Value::Object(mut members)) => WireEvent {
                    kind: members
                        .get("type")
                        .and_then(Value::as_str)
                        .map(|kind| Cow::Owned(kind.to_owned())),
                    model: None,
                    choices: None,
                    usage: members.remove("usage"),
                    delta: None,
                    message: members.remove("message"),
                    response: members.remove("response"),
                },
                _ => return info,
            },
        };
        if self.model.is_none() {
            let model = parsed.model.as_deref().or_else(|| {
                let nested = parsed.message.as_ref().or(parsed.response.as_ref());
                nested.and_then(|m| m.get("model")).and_then(Value::as_str)
            });
            self.model = model.map(str::to_owned);
        }
        match self.api {
            Api::ChatCompletions => self.on_chat_chunk(parsed, &mut info),
            Api::Responses => self.on_responses_event(event, parsed, &mut info),
            Api::AnthropicMessages => self.on_anthropic_event(event, parsed, &mut info),
            Api::Embeddings => {
                if let Some(usage) = parsed.usage.as_ref().and_then(Usage::from_openai) {
                    self.usage = Some(usage);
                    self.complete = true;
                    info.has_usage = true;
                }
            }
        }
        info
    }

    fn on_chat_chunk(&mut self, chunk: WireEvent<'_>, info: &mut EventInfo) {
        if let Some(usage) = chunk.usage.as_ref().and_then(Usage::from_openai) {
            self.usage = Some(usage);
            self.complete = true;
            info.has_usage = true;
            info.usage_only = chunk.choices.as_ref().is_some_and(Vec::is_empty);
        }
        for choice in chunk.choices.iter().flatten() {
            let Some(delta) = &choice.delta else {
                continue;
            };
            for text in [&delta.content, &delta.reasoning_content, &delta.refusal]
                .into_iter()
                .flatten()
            {
                info.text.push_str(text);
            }
            for call in delta.tool_calls.iter().flatten() {
                if let Some(arguments) = call.function.as_ref().and_then(|f| f.arguments.as_ref()) {
                    info.text.push_str(arguments);
                }
            }
        }
    }

    fn on_responses_event(
        &mut self,
        event: Option<&str>,
        parsed: WireEvent<'_>,
        info: &mut EventInfo,
    ) {
        let kind = parsed.kind.as_deref().or(event).unwrap_or_default();
        match kind {
            "response.completed" | "response.incomplete" | "response.failed" => {
                if let Some(usage) = parsed
                    .response
                    .as_ref()
                    .and_then(|r| r.get("usage"))
                    .and_then(Usage::from_openai)
                {
                    self.usage = Some(usage);
                    self.complete = true;
                    info.has_usage = true;
                }
            }
            "response.output_text.delta"
            | "response.reasoning_text.delta"
            | "response.reasoning_summary_text.delta"
            | "response.refusal.delta"
            | "response.function_call_arguments.delta" => {
                if let Some(Value::String(text)) = &parsed.delta {
                    info.text.push_str(text);
                }
            }
            _ => {}
        }
    }

    fn on_anthropic_event(
        &mut self,
        event: Option<&str>,
        parsed: WireEvent<'_>,
        info: &mut EventInfo,
    ) {
        let kind = parsed.kind.as_deref().or(event).unwrap_or_default();
        let usage = match kind {
            "message_start" => parsed.message.as_ref().and_then(|m| m.get("usage")),
            "message_delta" => parsed.usage.as_ref(),
            "content_block_delta" => {
                if let Some(delta) = &parsed.delta {
                    for field in ["text", "thinking", "partial_json"] {
                        if let Some(text) = delta.get(field).and_then(Value::as_str) {
                            info.text.push_str(text);
                        }
                    }
                }
                None
            }
            _ => None,
        };
        if let Some(usage) = usage {
            let mut current = self.usage.unwrap_or_default();
            if current.apply_anthropic(&mut self.anthropic, usage) {
                self.usage = Some(current);
                self.complete |= kind == "message_delta";
                info.has_usage = true;
            }
        }
    }
}

/// The members of a stream event any API may carry; everything else is skipped unread.
#[derive(Deserialize)]
struct WireEvent<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    choices: Option<Vec<WireChoice<'a>>>,
    #[serde(default)]
    usage: Option<Value>,
    #[serde(default)]
    delta: Option<Value>,
    #[serde(default)]
    message: Option<Value>,
    #[serde(default)]
    response: Option<Value>,
}

#[derive(Deserialize)]
struct WireChoice<'a> {
    #[serde(borrow, default)]
    delta: Option<WireDelta<'a>>,
}

#[derive(Deserialize)]
struct WireDelta<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    refusal: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<WireToolCall<'a>>>,
}

#[derive(Deserialize)]
struct WireToolCall<'a> {
    #[serde(borrow, default)]
    function: Option<WireFunction<'a>>,
}

#[derive(Deserialize)]
struct WireFunction<'a> {
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn usage(prompt: u64, completion: u64, cached: u64, write: u64, reasoning: u64) -> Usage {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            cached_prompt_tokens: cached,
            cache_write_tokens: write,
            reasoning_tokens: reasoning,
        }
    }

    #[test]
    fn non_streaming_bodies_of_every_api() {
        let chat = br#"{"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":100,"total_tokens":1100,"prompt_tokens_details":{"cached_tokens":600},"completion_tokens_details":{"reasoning_tokens":40}}}"#;
        assert_eq!(
            from_response_body(Api::ChatCompletions, chat),
            Some((usage(1000, 100, 600, 0, 40), Some("gpt-4o-mini".into())))
        );
        let deepseek = br#"{"usage":{"prompt_tokens":50,"completion_tokens":5,"prompt_cache_hit_tokens":20,"prompt_cache_miss_tokens":30}}"#;
        assert_eq!(
            from_response_body(Api::ChatCompletions, deepseek).map(|u| u.0),
            Some(usage(50, 5, 20, 0, 0))
        );
        let responses = br#"{"model":"o4","usage":{"input_tokens":30,"input_tokens_details":{"cached_tokens":10},"output_tokens":9,"output_tokens_details":{"reasoning_tokens":3},"total_tokens":39}}"#;
        assert_eq!(
            from_response_body(Api::Responses, responses).map(|u| u.0),
            Some(usage(30, 9, 10, 0, 3))
        );
        let anthropic = br#"{"model":"claude","usage":{"input_tokens":12,"cache_read_input_tokens":100,"cache_creation_input_tokens":50,"output_tokens":7}}"#;
        assert_eq!(
            from_response_body(Api::AnthropicMessages, anthropic).map(|u| u.0),
            Some(usage(162, 7, 100, 50, 0))
        );
        let embeddings = br#"{"data":[],"usage":{"prompt_tokens":8,"total_tokens":8}}"#;
        assert_eq!(
            from_response_body(Api::Embeddings, embeddings).map(|u| u.0),
            Some(usage(8, 0, 0, 0, 0))
        );
        assert_eq!(
            from_response_body(Api::ChatCompletions, br#"{"usage":null}"#),
            None
        );
        assert_eq!(from_response_body(Api::ChatCompletions, b"not json"), None);
        assert_eq!(
            from_response_body(
                Api::ChatCompletions,
                br#"{"model":7,"usage":{"prompt_tokens":2,"completion_tokens":1}}"#
            ),
            Some((usage(2, 1, 0, 0, 0), None))
        );
    }

    #[test]
    fn usage_from_the_tail_of_a_big_body() {
        let body = br#"{"object":"list","data":[{"embedding":[0.1,0.2],"usage":"not this"}],"model":"e","usage":{"prompt_tokens":8,"total_tokens":8}}"#;
        let last = body.windows(7).rposition(|w| w == b"\"usage\"").unwrap();
        for cut in 0..body.len() {
            let tail = &body[cut..];
            let expected = (cut <= last).then_some(usage(8, 0, 0, 0, 0));
            assert_eq!(from_body_tail(Api::Embeddings, tail), expected, "cut {cut}");
        }
        let anthropic =
            br#"..."text":"\"usage\": no"}],"usage":{"input_tokens":3,"output_tokens":2}}"#;
        assert_eq!(
            from_body_tail(Api::AnthropicMessages, anthropic),
            Some(usage(3, 2, 0, 0, 0))
        );
        assert_eq!(from_body_tail(Api::ChatCompletions, b"\"usage\":"), None);
    }

    #[test]
    fn chat_stream_usage_only_chunk_and_usage_with_choices() {
        let mut s = StreamUsage::new(Api::ChatCompletions);
        let info = s.on_event(
            None,
            r#"{"model":"m","choices":[{"index":0,"delta":{"content":"hi "}}],"usage":null}"#,
        );
        assert_eq!(info.text, "hi ");
        assert!(!info.has_usage);
        let info = s.on_event(
            None,
            r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#,
        );
        assert!(info.usage_only && info.has_usage);
        assert_eq!(s.usage(), Some(usage(5, 2, 0, 0, 0)));
        assert_eq!(s.model(), Some("m"));
        assert_eq!(s.on_event(None, "[DONE]"), EventInfo::default());

        // usage in the final chunk that also has choices: counted, never usage-only
        let mut s = StreamUsage::new(Api::ChatCompletions);
        let info = s.on_event(
            None,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2}}"#,
        );
        assert!(info.has_usage && !info.usage_only);
        assert_eq!(s.usage(), Some(usage(5, 2, 0, 0, 0)));
    }

    #[test]
    fn anthropic_stream_never_double_counts() {
        let mut s = StreamUsage::new(Api::AnthropicMessages);
        s.on_event(
            Some("message_start"),
            r#"{"type":"message_start","message":{"model":"claude","usage":{"input_tokens":12,"cache_read_input_tokens":100,"cache_creation_input_tokens":0,"output_tokens":1}}}"#,
        );
        assert!(
            !s.is_complete(),
            "the output is not known before message_delta"
        );
        let info = s.on_event(
            Some("content_block_delta"),
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"tok0 "}}"#,
        );
        assert_eq!(info.text, "tok0 ");
        // newer API versions repeat the input counts in message_delta: replaced, not added
        s.on_event(
            Some("message_delta"),
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":12,"cache_read_input_tokens":100,"output_tokens":8}}"#,
        );
        assert_eq!(s.usage(), Some(usage(112, 8, 100, 0, 0)));
        assert!(s.is_complete());
        assert_eq!(s.model(), Some("claude"));
    }

    #[test]
    fn responses_stream_reads_completed() {
        let mut s = StreamUsage::new(Api::Responses);
        let info = s.on_event(
            Some("response.output_text.delta"),
            r#"{"type":"response.output_text.delta","delta":"tok0 "}"#,
        );
        assert_eq!(info.text, "tok0 ");
        assert_eq!(s.usage(), None);
        s.on_event(
            Some("response.completed"),
            r#"{"type":"response.completed","response":{"model":"gpt","usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":4},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":1},"total_tokens":12}}}"#,
        );
        assert_eq!(s.usage(), Some(usage(9, 3, 4, 0, 1)));
        assert_eq!(s.model(), Some("gpt"));
    }

    #[test]
    fn garbage_events_are_ignored() {
        for api in [
            Api::ChatCompletions,
            Api::Responses,
            Api::AnthropicMessages,
            Api::Embeddings,
        ] {
            let mut s = StreamUsage::new(api);
            for data in [
                "",
                "{",
                "[1,2]",
                "null",
                r#"{"usage":"x"}"#,
                r#"{"type":7}"#,
            ] {
                assert!(!s.on_event(Some("message_start"), data).has_usage, "{data}");
            }
            assert_eq!(s.usage(), None);
        }
    }

    #[test]
    fn odd_member_types_never_lose_the_usage() {
        let mut s = StreamUsage::new(Api::ChatCompletions);
        let info = s.on_event(
            None,
            r#"{"choices":[{"delta":{"content":5}}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#,
        );
        assert!(info.has_usage && !info.usage_only);
        assert_eq!(s.usage(), Some(usage(3, 1, 0, 0, 0)));
        let mut s = StreamUsage::new(Api::AnthropicMessages);
        s.on_event(
            None,
            r#"{"type":"message_start","model":7,"message":{"usage":{"input_tokens":4}}}"#,
        );
        assert_eq!(s.usage(), Some(usage(4, 0, 0, 0, 0)));
    }

    #[test]
    fn escaped_delta_text_is_decoded() {
        let mut s = StreamUsage::new(Api::ChatCompletions);
        let info = s.on_event(None, r#"{"choices":[{"delta":{"content":"a\"b\u00e9"}}]}"#);
        assert_eq!(info.text, "a\"b\u{e9}");
    }

    #[test]
    fn cached_never_exceeds_prompt() {
        let u = Usage::from_openai(
            &serde_json::json!({"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 9}}),
        );
        assert_eq!(u.map(|u| u.cached_prompt_tokens), Some(5));
    }

    #[cfg(not(target_arch = "wasm32"))]
    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn any_event_data_is_safe(event in proptest::option::of("[a-z_.]{0,30}"), data in ".{0,300}") {
                for api in [Api::ChatCompletions, Api::Responses, Api::AnthropicMessages, Api::Embeddings] {
                    let mut s = StreamUsage::new(api);
                    let info = s.on_event(event.as_deref(), &data);
                    prop_assert!(!info.usage_only || info.has_usage);
                }
            }

            #[test]
            fn reported_numbers_come_back_exactly(prompt in 0u64..1 << 40, completion in 0u64..1 << 40, cached in 0u64..1 << 40, reasoning in 0u64..1 << 40) {
                let cached = cached.min(prompt);
                let chat = format!(r#"{{"choices":[],"usage":{{"prompt_tokens":{prompt},"completion_tokens":{completion},"prompt_tokens_details":{{"cached_tokens":{cached}}},"completion_tokens_details":{{"reasoning_tokens":{reasoning}}}}}}}"#);
                let mut s = StreamUsage::new(Api::ChatCompletions);
                s.on_event(None, &chat);
                let expected = Usage { prompt_tokens: prompt, completion_tokens: completion, cached_prompt_tokens: cached, cache_write_tokens: 0, reasoning_tokens: reasoning };
                prop_assert_eq!(s.usage(), Some(expected));
                prop_assert_eq!(from_response_body(Api::ChatCompletions, chat.as_bytes()).map(|u| u.0), Some(expected));
                let start = format!(r#"{{"type":"message_start","message":{{"usage":{{"input_tokens":{prompt},"cache_read_input_tokens":{cached},"output_tokens":1}}}}}}"#);
                let delta = format!(r#"{{"type":"message_delta","usage":{{"output_tokens":{completion}}}}}"#);
                let mut s = StreamUsage::new(Api::AnthropicMessages);
                s.on_event(Some("message_start"), &start);
                s.on_event(Some("message_delta"), &delta);
                let anthropic = Usage { prompt_tokens: prompt + cached, completion_tokens: completion, cached_prompt_tokens: cached, cache_write_tokens: 0, reasoning_tokens: 0 };
                prop_assert_eq!(s.usage(), Some(anthropic));
            }
        }
    }
}
