//! What the wasmtime harness assumes about local replies, checked in the real Envoy 1.40:
//! a local reply from filter k passes the response callbacks of the wasm filters that saw the
//! request (their context exists), and no others; `proxy_on_log` runs on every filter (a
//! context is created for it if need be) before `proxy_on_done`.
//!
//! Two key-auth filters in separate VMs (`envoy-config/e2e-harness-local-reply.yaml`); the
//! second sees no key at all (the first removed it), so it refuses whatever the first let
//! pass. Envoy runs with `wasm:trace`, which logs every callback. They run from the bundle
//! (`dist/llm-gateway.wasm`, root_id `key-auth`), which exports every callback; the
//! standalone `dist/key-auth.wasm` leaves out those key-auth does not handle
//! (`scripts/unused-callbacks`), and the last test checks that Envoy then never enters its VM
//! for them.

use llm_gateway_tests::envoy::{Envoy, Options};
use llm_gateway_tests::http;
use llm_gateway_tests::workspace;
use mock_upstream::MockUpstream;
use serde_json::{json, Value};

const TEAM_B: &str = "sk-e2e-team-b-8d03e61f5a";
const UNKNOWN: &str = "sk-e2e-nobody-0000000000";

fn count(logs: &str, callback: &str) -> usize {
    logs.lines()
        .filter(|l| l.contains(&format!("[host->vm] {callback}(")))
        .count()
}

/// HTTP contexts created (`proxy_on_context_create(id, root)` with a non-zero root).
fn http_contexts(logs: &str) -> usize {
    logs.lines()
        .filter(|l| l.contains("[host->vm] proxy_on_context_create(") && !l.ends_with(", 0)"))
        .count()
}

/// The mock and an Envoy whose two key-auth filters load `module` (in `dist/`).
async fn start(module: &str) -> (MockUpstream, Envoy) {
    let upstream = MockUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace::envoy_config("e2e-key-auth.json")).unwrap(),
    )
    .unwrap();
    let strict = json!({
        "keys": config["keys"],
        "_rules_": [{ "_match_route_": ["default"], "allow": ["team-a"] }]
    });
    let vars = vec![
        ("MOCK_PORT", upstream.addr().port().to_string()),
        ("MODULE", module.to_string()),
        ("KEY_AUTH_CONFIG", config.to_string().replace('\'', "''")),
        ("STRICT_CONFIG", strict.to_string().replace('\'', "''")),
    ];
    let options = Options {
        concurrency: 1,
        trace_wasm: true,
        ..Options::default()
    };
    let envoy = tokio::task::spawn_blocking(move || {
        Envoy::start_with("e2e-harness-local-reply.yaml", &vars, &options)
    })
    .await
    .unwrap()
    .unwrap();
    (upstream, envoy)
}

/// Posts a chat request with `key` to `envoy`.
async fn chat(envoy: &Envoy, key: &str) -> http::Response {
    let url = format!("{}/v1/chat/completions", envoy.url());
    http::post(url)
        .header("x-api-key", key)
        .json(&json!({"model": "fast", "messages": []}))
        .send()
        .await
        .unwrap()
}

/// Envoy writes its log on a timer: the log once `n` requests are in the access log and their
/// contexts deleted (or after 15 s).
async fn settled(envoy: &Envoy, n: usize, deletes: usize) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let logs = envoy.logs();
        let done =
            count(&logs, "proxy_on_delete") >= deletes && logs.matches("\"status\":").count() >= n;
        if done || std::time::Instant::now() > deadline {
            return logs;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_reply_passes_only_the_filters_that_saw_the_request() {
    let (_upstream, envoy) = start("llm-gateway.wasm").await;

    // the first filter refuses: the second gets no request or response callback; its
    // context is created only for proxy_on_log, which comes before proxy_on_done
    assert_eq!(chat(&envoy, UNKNOWN).await.status, 401);
    let logs = settled(&envoy, 1, 2).await;
    assert_eq!(count(&logs, "proxy_on_request_headers"), 1, "{logs}");
    assert_eq!(count(&logs, "proxy_on_response_headers"), 1, "{logs}");
    assert_eq!(http_contexts(&logs), 2, "{logs}");
    assert_eq!(count(&logs, "proxy_on_log"), 2, "{logs}");
    let first_done = logs.find("[host->vm] proxy_on_done(").unwrap();
    let last_log = logs.rfind("[host->vm] proxy_on_log(").unwrap();
    assert!(
        last_log < first_done,
        "proxy_on_log after proxy_on_done:\n{logs}"
    );

    // the second refuses: both saw the request, both see the local reply
    assert_eq!(chat(&envoy, TEAM_B).await.status, 401);
    let logs = settled(&envoy, 2, 4).await;
    assert_eq!(count(&logs, "proxy_on_request_headers"), 3, "{logs}");
    assert_eq!(count(&logs, "proxy_on_response_headers"), 3, "{logs}");
    assert_eq!(http_contexts(&logs), 4, "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_skips_the_callbacks_key_auth_wasm_does_not_export() {
    let (_upstream, envoy) = start("key-auth.wasm").await;
    // the second refuses: both saw the request and would see the local reply's response,
    // proxy_on_log and proxy_on_done (as the bundle's do above); key-auth.wasm exports none of
    // them (proxy_on_done and proxy_on_request_body only its Higress build does, for its Redis
    // key store), and Envoy enters neither VM for them
    let response = chat(&envoy, TEAM_B).await;
    assert_eq!(response.status, 401);
    let body: Value = serde_json::from_slice(&response.body).unwrap();
    assert_eq!(body["error"]["code"], "missing_api_key", "{body}");
    let logs = settled(&envoy, 1, 2).await;
    assert_eq!(count(&logs, "proxy_on_request_headers"), 2, "{logs}");
    assert_eq!(http_contexts(&logs), 2, "{logs}");
    for skipped in [
        "proxy_on_response_headers",
        "proxy_on_response_body",
        "proxy_on_log",
        "proxy_on_done",
    ] {
        assert_eq!(count(&logs, skipped), 0, "{skipped}:\n{logs}");
    }
    // the contexts are still created and deleted
    assert_eq!(count(&logs, "proxy_on_delete"), 2, "{logs}");
}
