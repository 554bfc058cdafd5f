//! A real chain in the harness: key-auth then pii-redaction (both compiled), the request body
//! and a streamed response fed at every chunk size from 1 byte up — what a real Envoy shows
//! only for the splits the network happens to make.

use llm_gateway_tests::harness::{FilterSpec, Fleet, Request, Response, Upstream};
use llm_gateway_tests::workspace;
use serde_json::{json, Value};

const TEAM_A: &str = "sk-e2e-team-a-4f1c9a7e2b";
const EMAIL: &str = "alice.wong@example.com";
const PHONE: &str = "13800138000";

fn prompt() -> String {
    format!("Mail {EMAIL} or call {PHONE}. Thanks {EMAIL}!")
}

fn chain() -> Fleet {
    let key_auth: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace::envoy_config("e2e-key-auth.json")).unwrap(),
    )
    .unwrap();
    let pii = json!({
        "rules": [{"detector": "email"}, {"detector": "phone_cn"}],
        "hash_salt": "harness-salt",
        "hold_headers": true
    });
    Fleet::builder()
        .filter(FilterSpec::plugin("key-auth", &key_auth).unwrap())
        .filter(
            FilterSpec::plugin("pii-redaction", &pii)
                .unwrap()
                .allow_on_headers_stop_iteration(true),
        )
        .build()
        .unwrap()
}

/// The upstream: echoes the last user message it received as an OpenAI stream of
/// 3-character deltas.
fn echo_stream(up: &Upstream, split: usize) -> Response {
    let body: Value = serde_json::from_slice(&up.body).unwrap();
    let text = body["messages"][0]["content"].as_str().unwrap().to_string();
    let mut sse = String::new();
    let chars: Vec<char> = text.chars().collect();
    for piece in chars.chunks(3) {
        let delta: String = piece.iter().collect();
        let event = json!({"object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": delta}}]});
        sse.push_str(&format!("data: {event}\n\n"));
    }
    sse.push_str("data: [DONE]\n\n");
    let offsets: Vec<usize> = (split..sse.len()).step_by(split).collect();
    Response::status(200)
        .header("content-type", "text/event-stream")
        .body(sse.as_bytes())
        .split_at(&offsets)
}

fn streamed_text(body: &[u8]) -> String {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

#[test]
fn placeholders_upstream_and_originals_back_at_every_split() {
    let fleet = chain();
    let body = json!({"model": "fast", "stream": true,
        "messages": [{"role": "user", "content": prompt()}]});
    let raw = body.to_string();
    for split in [1, 2, 3, 5, 8, 13, 64, 4096] {
        let offsets: Vec<usize> = (split..raw.len()).step_by(split).collect();
        let request = Request::post("/v1/chat/completions")
            .property("xds.route_name", "default")
            .header("x-api-key", TEAM_A)
            .json(&body)
            .split_at(&offsets);
        let mut seen = None;
        let ex = fleet
            .exchange(0, 0, &request, |up| {
                seen = Some(up.clone());
                echo_stream(up, split)
            })
            .unwrap_or_else(|e| panic!("split {split}: {e}"));
        let up = seen.unwrap();
        let sent = String::from_utf8_lossy(&up.body).into_owned();
        assert!(
            !sent.contains(EMAIL) && !sent.contains(PHONE),
            "split {split}: {sent}"
        );
        assert!(
            sent.contains("[EMAIL_1]") && sent.contains("[PHONE_1]"),
            "split {split}: {sent}"
        );
        // key-auth ran first: the identity reached the upstream, the key did not
        let headers = up.headers.as_ref().unwrap();
        let header = |n: &str| llm_gateway_tests::harness::stream::header_value(headers, n);
        assert_eq!(header("x-llm-consumer"), Some("team-a"));
        assert_eq!(header("x-api-key"), None);
        // held headers carry the redacted length
        assert_eq!(
            header("content-length"),
            Some(up.body.len().to_string().as_str())
        );
        assert_eq!(ex.status(), 200);
        assert_eq!(
            streamed_text(&ex.downstream.body),
            prompt(),
            "split {split}"
        );
    }
    // the cost of the chain per plugin, over all those requests
    let costs = fleet.costs();
    let plugins = llm_gateway_tests::harness::cost::by_plugin(&costs);
    assert_eq!(plugins.len(), 2, "{plugins:?}");
    assert!(plugins.iter().all(|(_, t)| t.fuel > 0 && t.host_calls > 0));
}

#[test]
fn key_auth_then_model_router_routes_on_the_body_and_clears_the_route_cache() {
    let key_auth: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace::envoy_config("e2e-key-auth.json")).unwrap(),
    )
    .unwrap();
    let router = json!({
        "version": "h1",
        "deployments": [
            {"name": "a", "cluster": "dep-a", "model": "model-a", "provider": "openai", "credential": "cred-a"},
            {"name": "b", "cluster": "dep-b", "model": "model-b", "provider": "openai", "credential": "cred-b"}
        ],
        "groups": [
            {"name": "fast", "deployments": [{"deployment": "a"}, {"deployment": "b"}]},
            {"name": "smart", "deployments": [{"deployment": "b"}]}
        ]
    });
    let fleet = Fleet::builder()
        .filter(FilterSpec::plugin("key-auth", &key_auth).unwrap())
        .filter(
            FilterSpec::plugin("model-router", &router)
                .unwrap()
                .allow_on_headers_stop_iteration(true),
        )
        .build()
        .unwrap();
    let body = json!({"model": "fast", "messages": [{"role": "user", "content": "hi"}]});
    let raw = body.to_string();
    for split in [1, 7, 4096] {
        let offsets: Vec<usize> = (split..raw.len()).step_by(split).collect();
        let request = Request::post("/v1/chat/completions")
            .property("xds.route_name", "default")
            .header("x-api-key", TEAM_A)
            .json(&body)
            .split_at(&offsets);
        let ex = fleet
            .exchange(0, 0, &request, |_| {
                Response::json(&json!({"object": "chat.completion", "choices": []}))
            })
            .unwrap_or_else(|e| panic!("split {split}: {e}"));
        assert_eq!(ex.status(), 200, "split {split}: {}", ex.text());
        // the router read the group from the body, picked the first deployment, rewrote the
        // model, published the plan in filter state and asked Envoy to route again
        assert_eq!(ex.upstream_header("x-llm-model-group"), Some("fast"));
        assert_eq!(ex.upstream_header("x-llm-deployment"), Some("a"));
        assert_eq!(ex.upstream_header("x-llm-cluster"), Some("dep-a"));
        let sent: Value = serde_json::from_slice(&ex.upstream.as_ref().unwrap().body).unwrap();
        assert_eq!(sent["model"], "model-a", "split {split}");
        assert_eq!(
            ex.filter_state.get("wasm.llm_try_0").map(Vec::as_slice),
            Some(&b"dep-a"[..])
        );
        assert_eq!(
            ex.filter_state.get("wasm.llm_try_1").map(Vec::as_slice),
            Some(&b"dep-b"[..])
        );
        assert_eq!(
            ex.route_cache_cleared,
            vec![0, 1],
            "only the router cleared it, once"
        );
    }
}
