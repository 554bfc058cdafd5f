//! `mock-upstream`: a small, fast, deterministic mock of the OpenAI and Anthropic HTTP APIs.
//!
//! It is a test fixture for the gateway: the end-to-end suites start it in-process
//! ([`MockUpstream::start`]), the demo launcher and the benchmarks run the `mock-upstream`
//! binary (`mock-upstream [--listen 127.0.0.1:8080] [--threads N] [--log]`, which prints
//! `mock-upstream listening on http://ADDR` once bound).
//!
//! # What it does
//!
//! Plain HTTP/1.1 (keep-alive, `TCP_NODELAY`) on one TCP listener, serving:
//!
//! | Route | Answer |
//! |---|---|
//! | `GET /health` | `200 ok` (text/plain) |
//! | `POST /v1/chat/completions` | OpenAI Chat Completions, JSON or SSE (`stream: true`, `stream_options.include_usage`) |
//! | `POST /v1/messages` | Anthropic Messages, JSON or SSE (`message_start` … `message_stop`) |
//! | `POST /v1/messages/count_tokens` | Anthropic token counting: `{"input_tokens": N}`, N by the prompt-token formula |
//! | `POST /v1/responses` | OpenAI Responses, JSON or SSE (`response.created`, `response.output_text.delta`…, `response.completed`) |
//! | `POST /v1/embeddings` | OpenAI embeddings, 8 small deterministic floats per input |
//! | anything else | `404` with `{"error":{"message":..,"type":"invalid_request_error","code":"not_found"}}` |
//!
//! The completion is always `N` "tokens" `tok0 tok1 … tok{N-1} ` (each token is the word
//! `tok{i}` followed by one space), where `N` is the `x-mock-chunks` knob (default 8) capped by
//! the request's `max_tokens` / `max_completion_tokens` (chat), `max_tokens` (Anthropic) or
//! `max_output_tokens` (Responses). When the cap cuts the completion short the finish reason is
//! `length` / `max_tokens` (and the Responses API reports `status: "incomplete"` with
//! `incomplete_details.reason = "max_output_tokens"`, streaming a final `response.incomplete`
//! event instead of `response.completed`, as OpenAI does), otherwise `stop` / `end_turn` /
//! `completed`. The completion token count is exactly `N`. In a stream every token is one
//! delta event.
//!
//! Every request (including 404s and health checks) is recorded, see
//! [`MockUpstream::requests`] (the last 10 000 are kept).
//!
//! # Prompt-token formula
//!
//! The prompt (input) token count is deterministic:
//!
//! ```text
//! prompt_tokens = max(1, Σ over messages of (ceil(text_chars(message) / 4) + 4))
//! ```
//!
//! where `text_chars` is the number of Unicode scalar values (`str::chars`) of all the text
//! content of the message: the `content` string, or the sum of the `text` fields of the text
//! parts of a `content` array (parts of type `text`; for the Responses API also `input_text`
//! and `output_text`). Non-text parts (images, tool calls, …) count nothing, a message without
//! text still counts 4.
//!
//! * Chat Completions: the messages are `messages`.
//! * Anthropic Messages: `messages`, plus `system` (string or text blocks) counted as one more
//!   message when present — so the same conversation counts the same in both APIs.
//! * Responses: `input` as a string is one message; as an array each item is one message
//!   (its `content` string or parts); `instructions`, when present, is one more message.
//! * Embeddings: `Σ ceil(chars / 4)` over the input strings (a pre-tokenized input counts its
//!   length), minimum 1; there is no per-message overhead.
//!
//! The `x-mock-prompt-tokens: N` knob replaces the computed count.
//!
//! # Knobs (request headers, all optional)
//!
//! An invalid value gives a `400` whose error message names the knob (and `error.param` is
//! the header name).
//!
//! * `x-mock-status: NNN` (200..=599) — answer that status with the body
//!   `{"error":{"message":"mock status NNN","type":"mock_error","code":"mock_NNN"}}`. Applied
//!   after `x-mock-delay-ms`, before the body is validated.
//! * `x-mock-retry-after: VALUE` — with `x-mock-status`: the error carries `retry-after: VALUE`
//!   (none without this knob: a provider's signal cools its deployment down in the router).
//! * `x-mock-error-code: CODE` — with `x-mock-status`: `CODE` instead of `mock_NNN` in
//!   `error.code` (e.g. `context_length_exceeded`).
//! * `x-mock-status-model: MODEL` — with `x-mock-status`: the status only for a request whose
//!   `model` is `MODEL`; other models are answered as usual (one provider, one model failing).
//! * `x-mock-delay-ms: N` — wait N ms (at most 3 600 000) before sending the response head.
//! * `x-mock-chunk-delay-ms: N` — streaming: wait N ms between SSE events; each event is then
//!   its own body frame (network write).
//! * `x-mock-chunks: N` (0..=100 000) — number of completion tokens (default 8).
//! * `x-mock-cut-after: N` — streaming: send only the first N SSE events, then abort the
//!   connection (no terminating chunk, so the client sees an incomplete body; if N is at least
//!   the number of events every event is sent and the connection is still aborted).
//!   Non-streaming: the head announces the full `content-length`, the first half of the body is
//!   sent, then the connection is aborted (N is ignored).
//! * `x-mock-end-after: N` — streaming: send only the first N SSE events, then end the body
//!   cleanly (terminating chunk): a stream that looks complete to the transport but lacks its
//!   terminator (`[DONE]`, `message_stop`). `x-mock-cut-after` wins when both are set.
//! * `x-mock-cut-rst: 1` — with `x-mock-cut-after`: the connection is aborted with a TCP
//!   reset (`SO_LINGER` 0) instead of a FIN.
//! * `x-mock-garbage: KIND` — streaming: after the first SSE event, `text` puts a line that
//!   is not SSE (an HTML error page's first line), `json` a `data:` event with JSON cut off,
//!   `utf8` a `data:` event whose string holds bytes that are not UTF-8; the rest of the stream
//!   follows. `endless` puts a `data:` line that never ends instead: `x` bytes, 64 KiB per
//!   frame, until the client goes away (nothing after it is sent).
//! * `x-mock-no-usage: 1` — never send a usage object (streaming or not, all APIs; the
//!   Responses API sends `"usage": null`).
//! * `x-mock-usage-in-final-chunk: 1` — chat streaming: put `usage` into the chunk carrying
//!   `finish_reason` and send no separate usage chunk (whatever `include_usage` says).
//! * `x-mock-prompt-tokens: N` — use N as the prompt/input token count.
//! * `x-mock-cache-read-tokens: N` — Anthropic: `cache_read_input_tokens` (`input_tokens` stays
//!   the prompt count, as Anthropic reports uncached input separately); Responses:
//!   `input_tokens_details.cached_tokens`; chat: adds `prompt_tokens_details.cached_tokens`.
//!
//! * `x-mock-echo: 1` — the completion is the text of the last `user` message (chat and
//!   Anthropic: `messages`; Responses: `input` as a string, or its last `user` item) instead of
//!   the `tok{i}` tokens, cut into pieces of 3 characters: one piece per "token" (delta event in
//!   a stream), so a word spans several events. The completion token count is the number of
//!   pieces; the caps apply to it as to tokens.
//!
//! Boolean knobs accept `1`/`true`/`yes`/`on` and `0`/`false`/`no`/`off`.
//!
//! # Errors
//!
//! A body that is not a JSON object, a missing or non-string `model`, a missing `messages`
//! array (chat, Anthropic) or `input` (Responses, embeddings), or a field of the wrong type
//! (`stream`, `max_tokens`, …) gives `400` with
//! `{"error":{"message":..,"type":"invalid_request_error","param":..,"code":"invalid_request"}}`.
//! Bodies are read fully, up to 64 MiB; a larger one gets `413` (`code: "request_too_large"`).
//! All error bodies are OpenAI-shaped, on every route. Nothing in the server panics on input.
//!
//! # What it does not do
//!
//! No TLS, no HTTP/2, no authentication (API keys are recorded, never checked), no real
//! tokenizer or model, no tool / function calling, no `n > 1`, no logprobs, no base64
//! embeddings, no Anthropic-shaped error bodies, no rate limiting of its own. Streams are
//! built in full before the first byte is sent (the knobs only pace and cut them).
//!
//! # Performance
//!
//! Responses are written straight into one buffer (no JSON tree for the answers); without
//! `x-mock-chunk-delay-ms` / `x-mock-cut-after` a whole stream goes out as a single body frame
//! and no task is spawned per request. Recording is a mutex-protected ring buffer push.

mod body;
mod handlers;
mod json;
mod knobs;
mod server;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// How many requests [`MockUpstream::requests`] keeps (the oldest are dropped first).
pub const MAX_RECORDED_REQUESTS: usize = 10_000;

/// Largest request body accepted (64 MiB); larger ones get `413`.
pub const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// A running mock server on the current tokio runtime.
///
/// Dropping it stops the server: the listener is closed and the connections that are still
/// open are dropped (a response in flight is cut).
pub struct MockUpstream {
    addr: SocketAddr,
    state: Arc<server::State>,
    accept: JoinHandle<()>,
}

impl MockUpstream {
    /// Binds `addr` (use `127.0.0.1:0` for an ephemeral port) and serves on the current tokio
    /// runtime (`tokio::spawn`). Returns once listening.
    pub async fn start(addr: SocketAddr) -> std::io::Result<MockUpstream> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(server::State::new(true, false));
        let accept = tokio::spawn(server::accept_loop(listener, Arc::clone(&state)));
        Ok(MockUpstream {
            addr,
            state,
            accept,
        })
    }

    /// The bound address (with the real port when started on port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far, in arrival order (at most the last
    /// [`MAX_RECORDED_REQUESTS`]). A request is recorded once its body has been read, before
    /// the response is produced.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.recorded().iter().cloned().collect()
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        self.state.recorded().clear();
    }

    /// Knob headers (`x-mock-*`, see the crate docs) this instance applies to every request
    /// that does not carry the same knob itself, replacing earlier defaults; `&[]` clears
    /// them. Gives one instance its own behaviour — "this provider answers 429" — when several
    /// mocks sit behind one gateway. Recorded requests keep the headers as received.
    ///
    /// # Panics
    /// On a name or value that is not a valid header (a test bug).
    pub fn set_default_knobs(&self, knobs: &[(&str, &str)]) {
        let mut map = hyper::header::HeaderMap::new();
        for (name, value) in knobs {
            let name = hyper::header::HeaderName::from_bytes(name.as_bytes())
                .unwrap_or_else(|_| panic!("invalid header name {name:?}"));
            let value = hyper::header::HeaderValue::from_str(value)
                .unwrap_or_else(|_| panic!("invalid header value {value:?}"));
            map.insert(name, value);
        }
        self.state.set_default_knobs(map);
    }
}

impl Drop for MockUpstream {
    fn drop(&mut self) {
        // The accept task owns the shutdown sender: aborting it closes the listener and tells
        // every connection task to drop its connection.
        self.accept.abort();
    }
}

impl std::fmt::Debug for MockUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockUpstream")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// One request as the mock received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// `GET`, `POST`, …
    pub method: String,
    /// Path and query, as received (`/v1/chat/completions?x=1`).
    pub path: String,
    /// Header names are lowercase; values are decoded as lossy UTF-8. In received order.
    pub headers: Vec<(String, String)>,
    /// The full request body.
    pub body: Bytes,
}

impl RecordedRequest {
    /// The value of the first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON, if it is JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// Serves forever on an already-bound listener, on the current tokio runtime (used by the
/// binary). Requests are not recorded; with `log`, one line per request goes to stderr
/// (`METHOD PATH -> STATUS`) along with accept errors.
///
/// Accept errors (for example running out of file descriptors) are logged (with `log`) and
/// retried, so this never returns `Ok`; it returns an error at once if the listener is
/// unusable (its local address cannot be read).
pub async fn serve(listener: TcpListener, log: bool) -> std::io::Result<()> {
    // Fail early on a listener that is not usable at all.
    listener.local_addr()?;
    let state = Arc::new(server::State::new(false, log));
    server::accept_loop(listener, state).await;
    Ok(())
}

pub(crate) struct Recorder {
    requests: Mutex<VecDeque<RecordedRequest>>,
}

impl Recorder {
    fn new() -> Recorder {
        Recorder {
            requests: Mutex::new(VecDeque::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<RecordedRequest>> {
        // A panic while holding this lock cannot leave the deque inconsistent: ignore poison.
        self.requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn push(&self, request: RecordedRequest) {
        let mut requests = self.lock();
        if requests.len() >= MAX_RECORDED_REQUESTS {
            requests.pop_front();
        }
        requests.push_back(request);
    }
}
