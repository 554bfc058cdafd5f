//! Translation between OpenAI Chat Completions and Anthropic Messages, both directions:
//! requests, JSON responses, SSE streams and errors.
//!
//! The router translates per attempt, from the API the body is in (the client's, or after a
//! first translation the first deployment's) to the API of the attempt's deployment, and the
//! response back. Nothing here reads the host: bytes in, bytes out, the clock passed in.
//!
//! * [`request`]: a request body of one API as the other API's request for a deployment
//!   ([`RequestParams`]: its model name, the `max_tokens` to send when the client set none).
//!   A field with no counterpart is dropped (and named in [`TranslatedRequest::dropped`], which
//!   the router reports in a response header) or refused with a 400 naming the field
//!   ([`Reject`]), never silently mangled.
//! * [`response`]: a whole JSON response (a 2xx body) of one API as the other's.
//! * [`error`]: a provider's error body as the client API's error body (same status).
//! * [`StreamTranslator`]: a provider's SSE stream as the client API's stream, fed in chunks
//!   split at any byte; the same output for every split.
//!
//! What it does not do: the Responses API, embeddings, token counting, audio, or anything that
//! needs a second request (uploading a file, fetching an image). A request of the same API as
//! the deployment only gets its `model` replaced.
//!
//! The rules, field by field in both directions (mapped, approximated, dropped — and named in
//! [`TranslatedRequest::dropped`] —, or refused with a 400 naming the field), are written out
//! in `docs/operator-guide.md`, § 4.5.1 "One API to every provider"; each one is a test here
//! (`tests.rs`, `stream/tests.rs`), and the round trips are property tests.

mod doc;
mod error;
mod request;
mod response;
mod stream;

pub use error::error;
pub use request::request;
pub use response::response;
pub use stream::{StreamTranslator, MAX_EVENT_BYTES};

use llm_gateway_shared::reject::{ErrorShape, Reject};
use serde_json::Value;

/// The two wire APIs the router translates between.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Wire {
    /// OpenAI Chat Completions (`POST /v1/chat/completions`; also Azure OpenAI, DeepSeek,
    /// Qwen/DashScope and other OpenAI-compatible providers).
    Chat,
    /// Anthropic Messages (`POST /v1/messages`).
    Messages,
}

impl Wire {
    /// The shape of this API's error bodies, for the gateway's own refusals.
    pub fn error_shape(self) -> ErrorShape {
        match self {
            Wire::Chat => ErrorShape::OpenAi,
            Wire::Messages => ErrorShape::Anthropic,
        }
    }

    /// "an OpenAI deployment" / "an Anthropic deployment", for messages.
    fn deployment(self) -> &'static str {
        match self {
            Wire::Chat => "an OpenAI deployment",
            Wire::Messages => "an Anthropic deployment",
        }
    }
}

/// What the request translation takes from the deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestParams<'a> {
    /// The deployment's model name, written into `model`.
    pub model: &'a str,
    /// Translating to Messages, which requires `max_tokens`: sent when the request has no
    /// `max_tokens` / `max_completion_tokens`.
    pub default_max_tokens: u64,
    /// Translating to Chat: the output cap goes into `max_completion_tokens` (OpenAI's
    /// current name, the only one its reasoning models take) when true, else `max_tokens`
    /// (Azure's older API versions and most OpenAI-compatible providers know only that one).
    pub max_completion_tokens: bool,
}

/// A translated request body, and what the response side must remember of the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranslatedRequest {
    /// The body for the deployment.
    pub body: Vec<u8>,
    /// What the client asked for.
    pub asked: Asked,
    /// Request fields that have no counterpart and were dropped, in body order: top-level
    /// names, or dotted paths for members of them (`stream_options.include_obfuscation`,
    /// `messages[].name`: `[]` for any element), each once.
    pub dropped: Vec<String>,
}

/// What the client asked for that shapes the answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Asked {
    /// `stream: true`.
    pub stream: bool,
    /// A Chat client's `stream_options.include_usage: true`: its stream ends with a usage
    /// chunk. (A Messages client always gets usage: translating to Chat asks for it.)
    pub include_usage: bool,
}

/// What the response translation needs besides the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseParams {
    /// Unix seconds: `created` of a Chat response or chunk (Messages has none).
    pub created: u64,
}

/// A response body that is not what its API sends (not JSON, not the success shape).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

impl Malformed {
    /// The 502 the client gets instead.
    pub fn reject(&self) -> Reject {
        Reject::new(
            502,
            llm_gateway_shared::reject::ErrorType::Api,
            "upstream_invalid_response",
            format!(
                "the provider's response could not be translated: {}",
                self.0
            ),
        )
    }
}

/// Token counts in Messages' terms, which say everything either API's usage says: Chat's
/// `prompt_tokens` is their sum of the three input counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Usage {
    input: u64,
    output: u64,
    cache_read: u64,
    cache_creation: u64,
}

/// `value` as a count: a non-negative integer, else 0 (a provider's usage is reported, not
/// checked; a bad number must not fail the answer).
fn count(value: Option<&Value>) -> u64 {
    value.and_then(Value::as_u64).unwrap_or(0)
}

impl Usage {
    /// A Messages `usage` object.
    fn from_messages(usage: &Value) -> Usage {
        Usage {
            input: count(usage.get("input_tokens")),
            output: count(usage.get("output_tokens")),
            cache_read: count(usage.get("cache_read_input_tokens")),
            cache_creation: count(usage.get("cache_creation_input_tokens")),
        }
    }

    /// Updates with the members a Messages `usage` object has (a `message_delta` repeats some
    /// of `message_start`'s counts, cumulatively): replaced, never added.
    fn update_from_messages(&mut self, usage: &Value) {
        let fields: [(&str, &mut u64); 4] = [
            ("input_tokens", &mut self.input),
            ("output_tokens", &mut self.output),
            ("cache_read_input_tokens", &mut self.cache_read),
            ("cache_creation_input_tokens", &mut self.cache_creation),
        ];
        for (name, slot) in fields {
            if let Some(n) = usage.get(name).and_then(Value::as_u64) {
                *slot = n;
            }
        }
    }

    /// A Chat `usage` object: the cached part of the prompt from
    /// `prompt_tokens_details.cached_tokens` or DeepSeek's `prompt_cache_hit_tokens`, the
    /// cache writes from the gateway's own `prompt_tokens_details.cache_creation_tokens`.
    fn from_chat(usage: &Value) -> Usage {
        let details = usage.get("prompt_tokens_details");
        let cache_read = details
            .and_then(|d| d.get("cached_tokens"))
            .and_then(Value::as_u64)
            .unwrap_or_else(|| count(usage.get("prompt_cache_hit_tokens")));
        let cache_creation = count(details.and_then(|d| d.get("cache_creation_tokens")));
        let prompt = count(usage.get("prompt_tokens"));
        Usage {
            input: prompt
                .saturating_sub(cache_read)
                .saturating_sub(cache_creation),
            output: count(usage.get("completion_tokens")),
            cache_read,
            cache_creation,
        }
    }

    fn prompt(&self) -> u64 {
        self.input
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_creation)
    }

    /// Appends the Chat `usage` object.
    fn write_chat(&self, out: &mut Vec<u8>) {
        let prompt = self.prompt();
        out.extend_from_slice(b"{\"prompt_tokens\":");
        push_number(out, prompt);
        out.extend_from_slice(b",\"completion_tokens\":");
        push_number(out, self.output);
        out.extend_from_slice(b",\"total_tokens\":");
        push_number(out, prompt.saturating_add(self.output));
        out.extend_from_slice(b",\"prompt_tokens_details\":{\"cached_tokens\":");
        push_number(out, self.cache_read);
        if self.cache_creation > 0 {
            out.extend_from_slice(b",\"cache_creation_tokens\":");
            push_number(out, self.cache_creation);
        }
        out.extend_from_slice(b"}}");
    }

    /// Appends the Messages `usage` object.
    fn write_messages(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"input_tokens\":");
        push_number(out, self.input);
        out.extend_from_slice(b",\"output_tokens\":");
        push_number(out, self.output);
        out.extend_from_slice(b",\"cache_read_input_tokens\":");
        push_number(out, self.cache_read);
        out.extend_from_slice(b",\"cache_creation_input_tokens\":");
        push_number(out, self.cache_creation);
        out.push(b'}');
    }
}

/// Appends `n` in decimal.
fn push_number(out: &mut Vec<u8>, n: u64) {
    let mut digits = String::new();
    llm_gateway_shared::json::push_u64(&mut digits, n);
    out.extend_from_slice(digits.as_bytes());
}

/// Appends `value` as compact JSON. Writing a `Value` into a `Vec` cannot fail (its keys are
/// strings, the sink never errs); were it to, `null` stands in so the output stays JSON.
fn push_value(out: &mut Vec<u8>, value: &Value) {
    let start = out.len();
    if serde_json::to_writer(&mut *out, value).is_err() {
        out.truncate(start);
        out.extend_from_slice(b"null");
    }
}

/// `value` as compact JSON text.
fn to_json(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    push_value(&mut out, value);
    out
}

/// Messages `stop_reason` → Chat `finish_reason`.
fn finish_reason(stop_reason: Option<&str>) -> &'static str {
    match stop_reason {
        Some("max_tokens" | "model_context_window_exceeded") => "length",
        Some("tool_use") => "tool_calls",
        Some("refusal") => "content_filter",
        _ => "stop",
    }
}

/// Chat `finish_reason` → Messages `stop_reason`.
fn stop_reason(finish_reason: Option<&str>) -> &'static str {
    match finish_reason {
        Some("length") => "max_tokens",
        Some("tool_calls" | "function_call") => "tool_use",
        Some("content_filter") => "refusal",
        _ => "end_turn",
    }
}

#[cfg(test)]
mod tests;
