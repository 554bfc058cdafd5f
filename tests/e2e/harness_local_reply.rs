//! What the wasmtime harness assumes about local replies, checked in the real Envoy 1.40:
//! a local reply from filter k passes the response callbacks of the wasm filters that saw the
//! request (their context exists), and no others; `proxy_on_log` runs on every filter (a
//! context is created for it if need be) before `proxy_on_done`.
//!
//! Two key-auth filters in separate VMs (`envoy-config/e2e-harness-local-reply.yaml`); the
//! second sees no key at all (the first removed it), so it refuses whatever the first let
//! pass. Envoy runs with `wasm:trace`, which logs every callback.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_reply_passes_only_the_filters_that_saw_the_request() {
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
        ("KEY_AUTH_CONFIG", config.to_string().replace('\'', "''")),
        ("STRICT_CONFIG", strict.to_string().replace('\'', "''")),
    ];
    let options = Options {
        concurrency: 1,
        trace_wasm: true,
    };
    let envoy = tokio::task::spawn_blocking(move || {
        Envoy::start_with("e2e-harness-local-reply.yaml", &vars, &options)
    })
    .await
    .unwrap()
    .unwrap();
    let chat = |key: &'static str| {
        let url = format!("{}/v1/chat/completions", envoy.url());
        async move {
            http::post(url)
                .header("x-api-key", key)
                .json(&json!({"model": "fast", "messages": []}))
                .send()
                .await
                .unwrap()
        }
    };
    // Envoy writes its log on a timer: wait until `n` requests are in the access log.
    let settled = |n: usize| {
        let envoy = &envoy;
        async move {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
            loop {
                let logs = envoy.logs();
                let done = count(&logs, "proxy_on_delete") >= n
                    && logs.matches("\"status\":").count() >= n;
                if done || std::time::Instant::now() > deadline {
                    return logs;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    };

    // the first filter refuses: the second gets no request or response callback; its
    // context is created only for proxy_on_log, which comes before proxy_on_done
    assert_eq!(chat(UNKNOWN).await.status, 401);
    let logs = settled(1).await;
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
    assert_eq!(chat(TEAM_B).await.status, 401);
    let logs = settled(2).await;
    assert_eq!(count(&logs, "proxy_on_request_headers"), 3, "{logs}");
    assert_eq!(count(&logs, "proxy_on_response_headers"), 3, "{logs}");
    assert_eq!(http_contexts(&logs), 4, "{logs}");
}
