//! The bundle build in a real Envoy 1.40: `envoy-config/gateway-bundle.yaml` is
//! `gateway.yaml` with every filter (and the router's upstream filter) loading
//! `dist/llm-gateway.wasm` in one `vm_id`.
//!
//! - the committed file is exactly what `tests/src/bundle.rs` derives from `gateway.yaml`;
//! - the user's journey of `e2e chain::` (a stream with an e-mail address, masked for the
//!   provider and restored for the client, the usage record in the access log, the refusals)
//!   holds through the bundle;
//! - Envoy runs one wasm VM per worker for it, where `gateway.yaml` runs five;
//! - a filter whose `root_id` names no plugin of the bundle makes Envoy refuse the config, and
//!   the log says which root id and which ones exist.

use llm_gateway_tests::bundle::{config_from_gateway, CONFIG};
use llm_gateway_tests::demo::{Demo, DEMO_KEY, FAST_ONLY_KEY, OPENAI_CREDENTIAL};
use llm_gateway_tests::envoy::Envoy;
use llm_gateway_tests::http::{self, sse_events, Response};
use llm_gateway_tests::workspace;
use serde_json::{json, Value};

const EMAIL: &str = "jane.doe@example.com";
/// gateway.yaml's `--concurrency` in the demo fixture.
const WORKERS: u64 = 2;

fn read(name: &str) -> String {
    let path = workspace::envoy_config(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn gateway_bundle_yaml_is_gateway_yaml_with_the_bundle() {
    let derived = config_from_gateway(&read(llm_gateway_tests::demo::CONFIG)).unwrap();
    if std::env::var_os("LLM_GATEWAY_BLESS").is_some() {
        std::fs::write(workspace::envoy_config(CONFIG), &derived).unwrap();
    }
    let committed = read(CONFIG);
    if committed != derived {
        let line = committed
            .lines()
            .zip(derived.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(derived.lines().count()));
        panic!(
            "envoy-config/{CONFIG} is not gateway.yaml with the bundle (first difference at line {}); \
             rewrite it with LLM_GATEWAY_BLESS=1 cargo test -p llm-gateway-tests --test e2e -- bundle::",
            line + 1
        );
    }
}

async fn post(demo: &Demo, headers: &[(&str, &str)], body: &Value) -> Response {
    let mut request = http::post(format!("{}/v1/chat/completions", demo.url())).json(body);
    for (name, value) in headers {
        request = request.header(name, value);
    }
    request.send().await.unwrap()
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

/// The usage record of `response` (by its `x-request-id`).
async fn record_of(demo: &Demo, response: &Response) -> Value {
    let id = response
        .header("x-request-id")
        .unwrap_or_else(|| panic!("no x-request-id: {:?}", response.headers));
    demo.usage_record(id).await.0
}

/// What a client and a provider see of one streamed chat, and the record, without what
/// differs from run to run (ids, timestamps, durations).
async fn streamed_chat(demo: &Demo, user: &str, extra: &[(&str, &str)]) -> Value {
    let key = bearer(DEMO_KEY);
    let mut headers = vec![
        ("authorization", key.as_str()),
        ("x-user-id", user),
        ("x-mock-echo", "1"),
        ("x-mock-prompt-tokens", "40"),
    ];
    headers.extend_from_slice(extra);
    let content = format!("Please write to {EMAIL} about the launch");
    let body = json!({"model": "fast", "stream": true,
        "messages": [{"role": "user", "content": content}]});
    demo.openai.clear_requests();
    let response = post(demo, &headers, &body).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let events = sse_events(&response.text());
    let text: String = events
        .iter()
        .filter_map(|(_, e)| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    let last = events.last().map(|e| e.1.clone());
    let usage_events = events.iter().filter(|(_, e)| !e["usage"].is_null()).count();
    let llm_headers: Vec<(String, String)> = response
        .headers
        .iter()
        .filter(|(name, _)| name.starts_with("x-llm-") || name.starts_with("x-ratelimit-"))
        .cloned()
        .collect();
    let seen = demo.openai.requests();
    assert_eq!(seen.len(), 1, "one request reaches the provider");
    let provider_body = seen[0].json().unwrap();
    let provider_auth = seen[0].header("authorization").map(str::to_owned);
    let record = record_of(demo, &response).await;
    let stable = |field: &str| record[field].clone();
    json!({
        "status": response.status,
        "content_type": response.header("content-type"),
        "text": text,
        "last_event": last,
        "usage_events": usage_events,
        "headers": llm_headers,
        "provider_body": provider_body,
        "provider_auth": provider_auth,
        "record": {
            "consumer": stable("consumer"), "tenant": stable("tenant"),
            "model_group": stable("model_group"), "deployment": stable("deployment"),
            "model": stable("model"), "api": stable("api"), "stream": stable("stream"),
            "complete": stable("complete"), "usage_source": stable("usage_source"),
            "usage": stable("usage"), "cost_nano": stable("cost_nano"),
            "currency": stable("currency"), "price_version": stable("price_version"),
        },
    })
}

/// The refusals of the journey: status and error body of each.
async fn refusals(demo: &Demo) -> Value {
    let hello = json!({"model": "fast", "messages": [{"role": "user", "content": "Hello!"}]});
    let smart = json!({"model": "smart", "messages": [{"role": "user", "content": "Hello!"}]});
    let intern = bearer(FAST_ONLY_KEY);
    let missing = post(demo, &[], &hello).await;
    let not_allowed = post(demo, &[("authorization", &intern)], &smart).await;
    http::assert_openai_error(&missing, 401, "missing_api_key");
    http::assert_openai_error(&not_allowed, 403, "model_not_allowed");
    json!([
        [missing.status, missing.json().unwrap()],
        [not_allowed.status, not_allowed.json().unwrap()],
    ])
}

/// Envoy's gauge of live V8 VMs (wasm VMs of the `envoy.wasm.runtime.v8` runtime).
fn active_vms(demo: &Demo) -> u64 {
    demo.envoy
        .stat("wasm.envoy.wasm.runtime.v8.active")
        .unwrap()
        .unwrap_or_else(|| panic!("no wasm.envoy.wasm.runtime.v8.active stat"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_in_one_module_behaves_like_five_with_one_vm_per_worker() {
    let (bundle, separate) = tokio::join!(Demo::start_with(0, CONFIG), Demo::start(0));
    let (bundle, separate) = (bundle.unwrap(), separate.unwrap());

    // The journey of e2e chain:: through the bundle: the address masked for the provider and
    // restored in the stream, the provider's credential and model, the usage record.
    let with_usage = streamed_chat(&bundle, "alice", &[]).await;
    assert_eq!(with_usage["content_type"], "text/event-stream");
    let text = with_usage["text"].as_str().unwrap();
    assert!(text.contains(EMAIL) && !text.contains("[EMAIL_"), "{text}");
    assert_eq!(with_usage["last_event"], "[DONE]");
    assert_eq!(
        with_usage["usage_events"], 0,
        "usage hidden from the client"
    );
    let provider = &with_usage["provider_body"];
    assert_eq!(provider["model"], "gpt-4o-mini", "{provider}");
    let sent = provider["messages"].to_string();
    assert!(
        sent.contains("[EMAIL_1]") && !sent.contains(EMAIL),
        "{sent}"
    );
    assert_eq!(provider["stream_options"]["include_usage"], true);
    let cap = provider
        .get("max_tokens")
        .or_else(|| provider.get("max_completion_tokens"));
    assert_eq!(cap, Some(&json!(1024)), "token-ratelimit's cap: {provider}");
    assert_eq!(
        with_usage["provider_auth"],
        bearer(OPENAI_CREDENTIAL).as_str()
    );
    let headers = with_usage["headers"].to_string();
    for expected in [
        r#"["x-llm-model-group","fast"]"#,
        r#"["x-llm-deployment","openai-mini"]"#,
        r#"["x-llm-attempts","1"]"#,
    ] {
        assert!(headers.contains(expected), "{expected} in {headers}");
    }
    let record = &with_usage["record"];
    assert_eq!(record["consumer"], "demo", "{record}");
    assert_eq!(record["usage_source"], "upstream", "{record}");
    assert_eq!(record["usage"]["prompt_tokens"], 40, "{record}");
    assert!(
        record["cost_nano"].as_u64().is_some_and(|c| c > 0),
        "{record}"
    );

    // Without usage from the provider, usage-accounting counts with the tokenizer — in the
    // bundle the same one token-ratelimit built.
    let estimated = streamed_chat(&bundle, "bob", &[("x-mock-no-usage", "1")]).await;
    assert_eq!(estimated["record"]["usage_source"], "estimated");
    let refused = refusals(&bundle).await;

    // The same requests through the five modules give the same answers, provider requests
    // and records.
    assert_eq!(streamed_chat(&separate, "alice", &[]).await, with_usage);
    assert_eq!(
        streamed_chat(&separate, "bob", &[("x-mock-no-usage", "1")]).await,
        estimated
    );
    assert_eq!(refusals(&separate).await, refused);

    // One V8 VM per worker for the bundle, one per module per worker for the five; plus, per
    // module, the two on the main thread (its own and the one that checked the config).
    let per_module = WORKERS + 2;
    assert_eq!(active_vms(&bundle), per_module);
    assert_eq!(active_vms(&separate), 5 * per_module);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_id_that_names_no_plugin_is_refused_with_the_known_ones() {
    let shipped = read(CONFIG);
    let from = "root_id: pii-redaction\n";
    assert_eq!(shipped.matches(from).count(), 1);
    let text = shipped.replace(from, "root_id: pii\n");
    let dir = workspace::TempDir::new("bundle-root-id").unwrap();
    let path = dir.path().join("gateway-bundle-bad-root-id.yaml");
    std::fs::write(&path, text).unwrap();
    let vars = llm_gateway_tests::demo::vars(0, 1, 1, 1);
    let path = path.to_str().unwrap().to_string();
    let err = tokio::task::spawn_blocking(move || Envoy::validate(&path, &vars))
        .await
        .unwrap()
        .expect_err("envoy accepted a filter whose root_id names no plugin");
    assert!(err.contains(r#"unknown root_id "pii""#), "{err}");
    for known in [
        "key-auth",
        "model-router",
        "model-router-upstream",
        "pii-redaction",
        "usage-accounting",
        "token-ratelimit",
    ] {
        assert!(err.contains(known), "{known} in {err}");
    }
}
