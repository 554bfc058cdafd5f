//! The workloads the cost figures are measured on, shared by the `harness-cost` binary and
//! the `harness cost::` suite: each plugin's e2e configuration, chat bodies of a given size, and
//! a long SSE stream. Requests are cut into [`CHUNK`]-byte body chunks.

use crate::harness::{FilterSpec, Request, Response};
use pii_redaction::bench_data::PARAGRAPH;
use serde_json::{json, Value};

/// Body chunk size of the requests (bodies reach a filter in pieces, not whole).
pub const CHUNK: usize = 16 * 1024;

/// The virtual key of `team-a` in `envoy-config/e2e-key-auth.json` (groups `fast`, `smart`).
pub const TEAM_A_KEY: &str = "sk-e2e-team-a-4f1c9a7e2b";

/// Offsets that cut `len` bytes into `chunk`-byte pieces.
pub fn offsets(len: usize, chunk: usize) -> Vec<usize> {
    (chunk..len).step_by(chunk.max(1)).collect()
}

/// key-auth with `envoy-config/e2e-key-auth.json`.
pub fn key_auth() -> crate::Result<FilterSpec> {
    let path = crate::workspace::envoy_config("e2e-key-auth.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let config: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    Ok(FilterSpec::plugin("key-auth", &config)?.root_id("key-auth"))
}

/// A chat conversation of `bytes` bytes of JSON (at least ~150): alternating user and
/// assistant messages of ~1 KB of prose each, model group `fast`.
pub fn chat_body(bytes: usize) -> Vec<u8> {
    let message = |i: usize, content: &str| {
        let role = if i.is_multiple_of(2) {
            "user"
        } else {
            "assistant"
        };
        json!({"role": role, "content": content})
    };
    let body = |messages: &[Value]| {
        json!({"model": "fast", "max_tokens": 256, "messages": messages})
            .to_string()
            .into_bytes()
    };
    let full = PARAGRAPH.repeat(4);
    let mut messages = vec![json!({"role": "system", "content": "You are a careful assistant."})];
    // whole messages while they fit, then one cut to the remaining length
    loop {
        let i = messages.len();
        messages.push(message(i, &full));
        if body(&messages).len() > bytes {
            messages.pop();
            let room = bytes.saturating_sub(body(&messages).len() + 34);
            messages.push(message(i, &full[..room.min(full.len())]));
            return body(&messages);
        }
    }
}

/// The model-router configuration of the e2e suite with a 1 s breaker cooldown (what the cost
/// figures are measured on): see [`router_config_with_cooldown`].
pub fn router_config() -> Value {
    router_config_with_cooldown(1000)
}

/// The model-router configuration of the e2e suite (`tests/e2e/router.rs`, rendered into
/// `envoy-config/e2e-router.yaml`): five deployments, four groups, the breaker on with a
/// cooldown of `cooldown_ms`.
pub fn router_config_with_cooldown(cooldown_ms: u64) -> Value {
    json!({
        "version": "e2e-v3",
        "max_attempts": 3,
        "breaker": {"consecutive_failures": 2, "window": 10, "failure_rate_percent": 0,
                    "min_calls": 1, "cooldown_ms": cooldown_ms},
        "deployments": [
            {"name": "a", "cluster": "dep-a", "model": "model-a", "provider": "openai",
             "credential": "cred-a", "price": {"input": 150000, "output": 600000}, "price_version": "p1"},
            {"name": "b", "cluster": "dep-b", "model": "model-b", "provider": "anthropic",
             "credential": "cred-b", "price": {"currency": "EUR", "input": 3000000, "output": 15000000},
             "price_version": "p2"},
            {"name": "c", "cluster": "dep-c", "model": "model-c", "provider": "openai-compatible",
             "credential": "cred-c"},
            {"name": "dead", "cluster": "dep-dead", "model": "model-dead", "provider": "openai",
             "credential": "cred-dead"},
            {"name": "small", "cluster": "dep-a", "model": "model-small", "provider": "openai",
             "credential": "cred-a", "context_window": 1000}
        ],
        "groups": [
            {"name": "fast", "deployments": [{"deployment": "a"}, {"deployment": "b"}]},
            {"name": "smart", "deployments": [{"deployment": "dead"}, {"deployment": "c"}]},
            {"name": "canary", "deployments": [{"deployment": "a", "weight": 70}, {"deployment": "c", "weight": 30}]},
            {"name": "long", "deployments": [{"deployment": "small"}, {"deployment": "c"}]}
        ]
    })
}

/// The router's listener filter (`role: downstream`), as Envoy runs it.
pub fn router_downstream() -> crate::Result<FilterSpec> {
    Ok(FilterSpec::plugin("model-router", &router_config())?
        .root_id("model-router")
        .allow_on_headers_stop_iteration(true))
}

/// The router's upstream filter (`role: upstream`), as each provider cluster runs it.
pub fn router_upstream() -> crate::Result<FilterSpec> {
    let mut config = router_config();
    config["role"] = json!("upstream");
    Ok(FilterSpec::plugin("model-router", &config)?
        .root_id("model-router-upstream")
        .allow_on_headers_stop_iteration(true)
        .upstream_filter(true))
}

/// A chat request with the virtual key of `team-a`, for key-auth → model-router.
pub fn router_request(body: &[u8]) -> Request {
    Request::post("/v1/chat/completions")
        .property("xds.route_name", "llm")
        .header("x-api-key", TEAM_A_KEY)
        .header("content-type", "application/json")
        .body(body)
        .split_at(&offsets(body.len(), CHUNK))
}

/// The same request as the upstream filter of attempt 1 sees it: the plan `a,b` in filter
/// state, Envoy's attempt count, the router's headers.
pub fn router_attempt_request(body: &[u8]) -> Request {
    Request::post("/v1/chat/completions")
        .property("llm_route_plan", "a,b")
        .header("x-envoy-attempt-count", "1")
        .header("x-llm-model-group", "fast")
        .header("x-llm-deployment", "a")
        .header("content-type", "application/json")
        .body(body)
        .split_at(&offsets(body.len(), CHUNK))
}

/// A provider's small chat completion.
pub fn chat_completion() -> Response {
    Response::json(
        &json!({"id": "chatcmpl-1", "object": "chat.completion", "model": "model-a",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Done."},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 2, "total_tokens": 1002}}),
    )
}

/// pii-redaction with every built-in detector (the default rules: mask + restore), holding
/// the headers as `envoy-config/e2e-pii.yaml` does.
pub fn pii() -> crate::Result<FilterSpec> {
    Ok(
        FilterSpec::plugin("pii-redaction", &json!({"hold_headers": true}))?
            .root_id("pii-redaction")
            .allow_on_headers_stop_iteration(true),
    )
}

/// Prose of about `bytes` bytes; with `with_pii` an e-mail, a phone, an ID, a card and an IP
/// address every ~700 bytes: the input of `cargo bench -p pii-redaction`, from that crate.
pub use pii_redaction::bench_data::prose;

/// A chat request whose user message is `text` (the pii bench's body).
pub fn pii_request(text: &str, stream: bool) -> Request {
    let body = json!({"model": "fast", "stream": stream, "messages": [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": text}
    ]})
    .to_string()
    .into_bytes();
    Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(&body)
        .split_at(&offsets(body.len(), CHUNK))
}

/// An OpenAI chat stream of `events` chunks echoing `text` (what the provider saw, with its
/// placeholders) in 3-character deltas, cycling, then `[DONE]`; cut into `chunk`-byte pieces.
pub fn echo_stream(text: &str, events: usize, chunk: usize) -> Response {
    let chars: Vec<char> = text.chars().collect();
    let mut sse = Vec::new();
    for piece in chars.chunks(3).cycle().take(events) {
        let piece: String = piece.iter().collect();
        let data = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
            "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"content": piece},
            "logprobs": null, "finish_reason": null}]});
        sse.extend(llm_gateway_shared::sse::encode(None, &data.to_string()));
    }
    sse.extend_from_slice(b"data: [DONE]\n\n");
    Response::status(200)
        .header("content-type", "text/event-stream")
        .body(&sse)
        .split_at(&offsets(sse.len(), chunk))
}

/// The user message the upstream received (`messages[1].content`).
pub fn sent_user_text(body: &[u8]) -> crate::Result<String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    v["messages"][1]["content"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| "no messages[1].content in the upstream body".to_string())
}

/// The usage-accounting configuration of the e2e suite (`tests/e2e/usage.rs`, rendered into
/// `envoy-config/e2e-usage.yaml`): two prices, cost headers on.
pub fn usage_config() -> Value {
    json!({
        "price_version": "2026-11",
        "currency": "USD",
        "prices": {
            "east": {"input": "0.30", "cached_input": "0.006", "output": "1.20"},
            "claude-east": {"input": "3", "cached_input": "0.30", "cache_write": "3.75", "output": "15"}
        },
        "cost_headers": true
    })
}

/// usage-accounting with [`usage_config`], as `envoy-config/e2e-usage.yaml` runs it.
pub fn usage() -> crate::Result<FilterSpec> {
    Ok(FilterSpec::plugin("usage-accounting", &usage_config())?
        .root_id("usage-accounting")
        .allow_on_headers_stop_iteration(true))
}

/// A streaming chat request routed to deployment `east` (model `gpt-4o-mini`, so an estimate
/// uses tiktoken's `o200k_base`), without `include_usage`: the plugin adds it.
pub fn usage_request(id: &str) -> Request {
    Request::post("/v1/chat/completions")
        .header("x-llm-request-id", id)
        .header("x-llm-tenant", "acme")
        .header("x-llm-deployment", "east")
        .header("x-llm-model-group", "fast")
        .json(&json!({"model": "gpt-4o-mini", "stream": true,
            "messages": [{"role": "user", "content": PARAGRAPH}]}))
}

/// An OpenAI chat stream of `events` events in all: content deltas, then (with `usage`) the
/// usage-only chunk the plugin asked for, then `[DONE]`. Cut into `chunk`-byte pieces, or
/// one event per piece with `chunk == 0`.
pub fn usage_stream(events: usize, usage: bool, chunk: usize) -> Response {
    let mut sse = String::new();
    let mut ends = Vec::new();
    let deltas = events.saturating_sub(1 + usize::from(usage));
    for i in 0..deltas {
        sse.push_str(&format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-4o-mini\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}},\"finish_reason\":null}}],\"usage\":null}}\n\n"
        ));
        ends.push(sse.len());
    }
    if usage {
        sse.push_str(&format!("data: {{\"id\":\"c\",\"choices\":[],\"usage\":{{\"prompt_tokens\":60,\"completion_tokens\":{deltas}}}}}\n\n"));
        ends.push(sse.len());
    }
    sse.push_str("data: [DONE]\n\n");
    let cuts = if chunk == 0 {
        ends
    } else {
        offsets(sse.len(), chunk)
    };
    Response::status(200)
        .header("content-type", "text/event-stream")
        .body(sse.as_bytes())
        .split_at(&cuts)
}

/// token-ratelimit's cost workload: a per-key token limit and a tenant budget, both far
/// from their amounts (the hot path: every request admitted, settled from the record).
/// `redis`: the Higress build (`dist/higress/`, for a fleet in Higress mode) against service
/// [`RATELIMIT_REDIS`], with `clock: gateway`.
pub fn ratelimit(redis: bool) -> crate::Result<FilterSpec> {
    let mut config = json!({
        "limits": [{"name": "key-tpm", "by": "key", "tokens": 1_000_000_000u64, "per": "minute"}],
        "budgets": [{"name": "tenant-day", "by": "tenant", "period": "day", "tokens": 1_000_000_000_000u64}]
    });
    if redis {
        config["redis"] = json!({"service": RATELIMIT_REDIS, "timeout_ms": 500});
        config["clock"] = json!("gateway");
        return Ok(FilterSpec::higress("token-ratelimit", &config)?.root_id("token-ratelimit"));
    }
    Ok(FilterSpec::plugin("token-ratelimit", &config)?
        .root_id("token-ratelimit")
        .allow_on_headers_stop_iteration(true))
}

/// The Redis service name of [`ratelimit`].
pub const RATELIMIT_REDIS: &str = "outbound|6379||redis.static";

/// A chat request for [`ratelimit`]: `bytes` of conversation for `model` (`gpt-4o-mini` is
/// counted with tiktoken's `o200k_base`, a non-OpenAI model with chars/4), no `max_tokens`
/// (the plugin injects it).
pub fn ratelimit_request(id: &str, bytes: usize, model: &str) -> Request {
    let mut body: Value = serde_json::from_slice(&chat_body(bytes)).unwrap_or_default();
    body["model"] = json!(model);
    if let Some(object) = body.as_object_mut() {
        object.remove("max_tokens");
    }
    Request::post("/v1/chat/completions")
        .header("x-llm-request-id", id)
        .header("x-llm-tenant", "acme")
        .header("x-llm-key-id", "k-0001")
        .header("x-llm-consumer", "team-a")
        .json(&body)
}
