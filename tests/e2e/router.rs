//! model-router end to end: key-auth -> model-router in a real Envoy 1.40 (`--concurrency 2`),
//! one mock upstream per provider cluster, real HTTP clients.
//!
//! Config: `envoy-config/e2e-router.yaml`. The fallback mechanism it exercises (matcher cluster
//! specifier on the router's filter state + `refresh_cluster_on_retry` + the module as each
//! cluster's upstream filter) is described in `docs/router-fallback.md`.

use llm_gateway_tests::envoy::{Envoy, Options};
use llm_gateway_tests::http::{self, Response};
use llm_gateway_tests::workloads;
use llm_gateway_tests::workspace::sha256_hex;
use mock_upstream::{MockUpstream, RecordedRequest};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// May use `fast`, `smart` and `canary`.
const KEY_ALL: &str = "sk-e2e-router-all-5b1e0c";
/// May use `fast` only.
const KEY_FAST: &str = "sk-e2e-router-fast-9d2a71";
const COOLDOWN_MS: u64 = 3_000;

struct Gateway {
    /// Deployment `a` (openai, cluster dep-a).
    a: MockUpstream,
    /// Deployment `b` (anthropic, cluster dep-b).
    b: MockUpstream,
    /// Deployment `c` (openai-compatible, cluster dep-c).
    c: MockUpstream,
    envoy: Envoy,
}

fn key_auth_config() -> Value {
    json!({"keys": [
        {"key_sha256": sha256_hex(KEY_ALL.as_bytes()), "consumer": "team-all", "groups": ["fast", "smart", "canary", "long", "pair", "strict"]},
        {"key_sha256": sha256_hex(KEY_FAST.as_bytes()), "consumer": "team-fast", "groups": ["fast"]},
    ]})
}

/// The workloads' router config plus group `pair`: two deployments of one provider, on one
/// cluster (dep-a), a larger model falling back to a smaller one; and group `strict`, `fast`'s
/// deployments moving on only on a 429 (`retry_on`).
fn router_config() -> Value {
    let mut config = workloads::router_config_with_cooldown(COOLDOWN_MS);
    if let Some(deployments) = config["deployments"].as_array_mut() {
        deployments.push(
            json!({"name": "big", "cluster": "dep-a", "model": "model-big",
            "provider": "openai", "credential": "cred-big"}),
        );
    }
    if let Some(groups) = config["groups"].as_array_mut() {
        groups.push(
            json!({"name": "pair", "deployments": [{"deployment": "big"}, {"deployment": "a"}]}),
        );
        groups.push(json!({"name": "strict", "retry_on": [429],
            "deployments": [{"deployment": "a"}, {"deployment": "b"}]}));
    }
    config
}

/// A port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

impl Gateway {
    async fn start() -> Gateway {
        let addr = "127.0.0.1:0".parse().unwrap();
        let a = MockUpstream::start(addr).await.unwrap();
        let b = MockUpstream::start(addr).await.unwrap();
        let c = MockUpstream::start(addr).await.unwrap();
        let router = router_config();
        let mut upstream = router.clone();
        upstream["role"] = json!("upstream");
        let one_line = |v: &Value| v.to_string().replace('\'', "''");
        let vars = vec![
            ("MOCK_A_PORT", a.addr().port().to_string()),
            ("MOCK_B_PORT", b.addr().port().to_string()),
            ("MOCK_C_PORT", c.addr().port().to_string()),
            ("DEAD_PORT", closed_port().to_string()),
            ("KEY_AUTH_CONFIG", one_line(&key_auth_config())),
            ("ROUTER_CONFIG", one_line(&router)),
            ("ROUTER_UPSTREAM_CONFIG", one_line(&upstream)),
        ];
        let options = Options {
            concurrency: 2,
            trace_wasm: false,
            ..Options::default()
        };
        let envoy = tokio::task::spawn_blocking(move || {
            Envoy::start_with("e2e-router.yaml", &vars, &options)
        })
        .await
        .unwrap()
        .unwrap();
        Gateway { a, b, c, envoy }
    }

    async fn chat(&self, key: &str, body: Value, headers: &[(&str, &str)]) -> Response {
        let mut request = http::post(format!("{}/v1/chat/completions", self.envoy.url()))
            .header("authorization", &format!("Bearer {key}"))
            .json(&body);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        request.send().await.unwrap()
    }

    async fn ask(&self, group: &str, headers: &[(&str, &str)]) -> Response {
        self.chat(
            KEY_ALL,
            json!({"model": group, "messages": [{"role": "user", "content": "Say hello"}]}),
            headers,
        )
        .await
    }

    fn take(mock: &MockUpstream) -> Vec<RecordedRequest> {
        let requests = mock.requests();
        mock.clear_requests();
        requests
    }

    /// Envoy's logs once they contain every one of `needles` (files are flushed every 100 ms).
    async fn logs_with(&self, needles: &[&str]) -> String {
        for _ in 0..50 {
            let logs = self.envoy.logs();
            if needles.iter().all(|n| logs.contains(n)) {
                return logs;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("logs never showed {needles:?}:\n{}", self.envoy.logs());
    }

    fn stat(&self, name: &str) -> u64 {
        self.envoy
            .stat(&format!("wasmcustom.llm_gateway.model_router.{name}"))
            .unwrap()
            .unwrap_or(0)
    }
}

/// What every provider request must look like: the deployment's model and credential, none of
/// the gateway's internal headers, never the client's key.
fn assert_provider_request(request: &RecordedRequest, model: &str, credential: (&str, &str)) {
    assert_eq!(request.json().unwrap()["model"], model, "{request:?}");
    assert_eq!(
        request.header(credential.0),
        Some(credential.1),
        "{request:?}"
    );
    let other = if credential.0 == "authorization" {
        "x-api-key"
    } else {
        "authorization"
    };
    assert_eq!(request.header(other), None, "{request:?}");
    if credential.0 == "x-api-key" {
        // the clients here send no API version: Anthropic's is added with the credential
        assert_eq!(request.header("anthropic-version"), Some("2023-06-01"));
    }
    for (name, value) in &request.headers {
        assert!(
            !name.starts_with("x-llm-"),
            "internal header {name} reached the provider"
        );
        // Envoy's internals and the client's address (issue 18)
        assert!(
            !name.starts_with("x-envoy-") && !name.starts_with("x-forwarded-"),
            "{name} reached the provider"
        );
        assert!(
            !value.contains("sk-e2e-router"),
            "the client's key reached the provider"
        );
    }
    assert_eq!(
        request.header("content-length"),
        Some(request.body.len().to_string().as_str()),
        "content-length fixed after the rewrite"
    );
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_by_group_and_refuses_unknown_forbidden_and_bad_requests() {
    let gw = Gateway::start().await;

    let response = gw.ask("fast", &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-llm-deployment"), Some("a"));
    assert_eq!(response.header("x-llm-model-group"), Some("fast"));
    assert_eq!(response.header("x-llm-attempts"), Some("1"));
    assert_eq!(response.header("x-llm-route-version"), Some("e2e-v3"));
    assert_eq!(response.json().unwrap()["model"], "model-a");
    let seen = Gateway::take(&gw.a);
    assert_eq!(seen.len(), 1);
    assert_provider_request(&seen[0], "model-a", ("authorization", "Bearer cred-a"));
    // the nested messages arrive byte for byte
    assert_eq!(
        seen[0].json().unwrap()["messages"],
        json!([{"role": "user", "content": "Say hello"}])
    );

    // /v1/messages is routed too (here the client's key comes in x-api-key)
    let messages = http::post(format!("{}/v1/messages", gw.envoy.url()))
        .header("x-api-key", KEY_ALL)
        .json(&json!({"model": "smart", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(messages.status, 200, "{}", messages.text());
    assert_eq!(messages.header("x-llm-deployment"), Some("c"));

    http::assert_openai_error(&gw.ask("gpt-9", &[]).await, 404, "model_not_found");
    let forbidden = gw
        .chat(KEY_FAST, json!({"model": "smart", "messages": []}), &[])
        .await;
    http::assert_openai_error(&forbidden, 403, "model_not_allowed");
    let not_json = http::post(format!("{}/v1/chat/completions", gw.envoy.url()))
        .header("authorization", &format!("Bearer {KEY_ALL}"))
        .body("model=fast")
        .send()
        .await
        .unwrap();
    http::assert_openai_error(&not_json, 400, "invalid_request_body");
    let no_model = gw.chat(KEY_ALL, json!({"messages": []}), &[]).await;
    http::assert_openai_error(&no_model, 400, "missing_model");
    assert!(Gateway::take(&gw.a).is_empty() && Gateway::take(&gw.b).is_empty());
    assert_eq!(gw.stat("rejected.model_not_found"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn falls_back_on_429_and_503_with_the_next_model_and_credential() {
    let gw = Gateway::start().await;
    let mut last_id = String::new();
    for status in ["429", "503"] {
        gw.a.set_default_knobs(&[("x-mock-status", status)]);
        let response = gw.ask("fast", &[]).await;
        assert_eq!(response.status, 200, "{status}: {}", response.text());
        assert_eq!(response.header("x-llm-deployment"), Some("b"), "{status}");
        assert_eq!(response.header("x-llm-attempts"), Some("2"), "{status}");

        let first = Gateway::take(&gw.a);
        let second = Gateway::take(&gw.b);
        assert_eq!((first.len(), second.len()), (1, 1), "{status}");
        assert_provider_request(&first[0], "model-a", ("authorization", "Bearer cred-a"));
        assert_provider_request(&second[0], "model-b", ("x-api-key", "cred-b"));
        // one logical request: the same id on both attempts
        let id = first[0].header("x-request-id").unwrap();
        assert_eq!(second[0].header("x-request-id"), Some(id));
        last_id = id.to_string();
        // Envoy's attempt count picked the deployments and stayed in the gateway
        assert_eq!(first[0].header("x-envoy-attempt-count"), None);
        assert_eq!(second[0].header("x-envoy-attempt-count"), None);
    }
    assert_eq!(gw.stat("fallbacks"), 2);

    // The published route info names the deployment that answered. Its logical request id
    // is the router's own (never a client header), one per downstream request: both
    // attempts of this request ran under it.
    let needle = format!("\"request_id\":\"{last_id}\"");
    let mut entries: Vec<Value> = Vec::new();
    for _ in 0..50 {
        entries = gw
            .envoy
            .logs()
            .lines()
            .filter(|l| l.contains(&needle))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if entries.len() == 3 {
            break; // two attempts and the downstream line (files flush every 100 ms)
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let attempts = entries.iter().filter(|e| e["kind"] == "attempt").count();
    assert_eq!(attempts, 2, "{entries:?}");
    let downstream = entries.iter().find(|e| e["kind"] == "downstream").unwrap();
    let info: Value = serde_json::from_str(downstream["route_info"].as_str().unwrap()).unwrap();
    assert_eq!(info["deployment"], "b");
    assert_eq!(info["model"], "model-b");
    assert_eq!(info["provider"], "anthropic");
    assert_eq!(info["model_group"], "fast");
    assert_eq!(info["attempts"], 2);
    assert_eq!(info["tried"], serde_json::json!(["a", "b"]));
    assert_eq!(info["route_version"], "e2e-v3");
    let id = info["request_id"].as_str().unwrap();
    assert!(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );

    // a client cannot choose it: the same x-request-id twice gives two logical ids; and the
    // served deployment's price is published with it
    gw.a.set_default_knobs(&[]);
    for _ in 0..2 {
        gw.ask("fast", &[("x-request-id", "client-chosen-id")])
            .await;
    }
    let mut infos = Vec::new();
    for _ in 0..50 {
        infos = gw
            .envoy
            .logs()
            .lines()
            .filter(|l| l.contains("\"kind\":\"downstream\"") && l.contains("client-chosen-id"))
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|e| serde_json::from_str::<Value>(e["route_info"].as_str().unwrap()).unwrap())
            .collect();
        if infos.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(infos.len(), 2, "{infos:?}");
    assert_ne!(infos[0]["request_id"], infos[1]["request_id"]);
    assert_ne!(infos[0]["request_id"], "client-chosen-id");
    // a's breaker may still be open (two failures above): whoever served, its own price
    for info in &infos {
        let (price, version) = match info["deployment"].as_str() {
            Some("a") => (
                json!({"currency": "USD", "input": 150000, "output": 600000}),
                "p1",
            ),
            Some("b") => (
                json!({"currency": "EUR", "input": 3000000, "output": 15000000}),
                "p2",
            ),
            other => panic!("served by {other:?}"),
        };
        assert_eq!(info["price"], price);
        assert_eq!(info["price_version"], version);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_deployments_on_one_cluster_fall_back_by_attempt() {
    let gw = Gateway::start().await;
    // the provider behind dep-a refuses model-big only
    gw.a.set_default_knobs(&[
        ("x-mock-status", "429"),
        ("x-mock-status-model", "model-big"),
    ]);
    for round in 0..2 {
        let response = gw.ask("pair", &[]).await;
        assert_eq!(response.status, 200, "{round}: {}", response.text());
        assert_eq!(response.header("x-llm-deployment"), Some("a"), "{round}");
        assert_eq!(response.header("x-llm-attempts"), Some("2"), "{round}");
        // both attempts at the one cluster, each with its deployment's model and credential
        let seen = Gateway::take(&gw.a);
        assert_eq!(seen.len(), 2, "{round}");
        assert_provider_request(&seen[0], "model-big", ("authorization", "Bearer cred-big"));
        assert_provider_request(&seen[1], "model-a", ("authorization", "Bearer cred-a"));
    }
    assert!(Gateway::take(&gw.b).is_empty() && Gateway::take(&gw.c).is_empty());
    // The breaker counted by attempt, not by cluster: big failed twice (consecutive_failures
    // 2: open), a, on the same cluster, answered and stays closed, so it serves first now.
    assert_eq!(gw.stat("breaker.opened.big"), 1);
    assert_eq!(gw.stat("breaker.opened.a"), 0);
    let response = gw.ask("pair", &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-llm-deployment"), Some("a"));
    assert_eq!(response.header("x-llm-attempts"), Some("1"));
    let seen = Gateway::take(&gw.a);
    assert_eq!(seen.len(), 1);
    assert_provider_request(&seen[0], "model-a", ("authorization", "Bearer cred-a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn falls_back_on_connect_failure() {
    let gw = Gateway::start().await;
    let response = gw.ask("smart", &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-llm-deployment"), Some("c"));
    assert_eq!(response.header("x-llm-attempts"), Some("2"));
    let seen = Gateway::take(&gw.c);
    assert_eq!(seen.len(), 1);
    assert_provider_request(&seen[0], "model-c", ("authorization", "Bearer cred-c"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn falls_back_when_an_attempt_times_out() {
    let gw = Gateway::start().await;
    // the route's per_try_timeout is 1 s
    gw.a.set_default_knobs(&[("x-mock-delay-ms", "3000")]);
    let response = gw.ask("fast", &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-llm-deployment"), Some("b"));
    assert_eq!(response.header("x-llm-attempts"), Some("2"));
    let second = Gateway::take(&gw.b);
    assert_eq!(second.len(), 1);
    assert_provider_request(&second[0], "model-b", ("x-api-key", "cred-b"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_falls_back_on_client_errors() {
    let gw = Gateway::start().await;
    for status in ["400", "401", "404", "422"] {
        gw.a.set_default_knobs(&[("x-mock-status", status)]);
        let response = gw.ask("fast", &[]).await;
        assert_eq!(response.status.to_string(), status, "{}", response.text());
        assert_eq!(response.header("x-llm-attempts"), Some("1"));
        assert_eq!(response.header("x-llm-deployment"), Some("a"));
        assert_eq!(Gateway::take(&gw.a).len(), 1);
        assert!(Gateway::take(&gw.b).is_empty(), "{status}: no fallback");
    }
    assert_eq!(gw.stat("fallbacks"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_length_moves_to_a_larger_deployment() {
    let gw = Gateway::start().await;
    // estimated too large for `small` (1000 tokens): planned straight to c
    let response = gw
        .chat(
            KEY_ALL,
            json!({"model": "long", "max_tokens": 5000, "messages": [{"role": "user", "content": "hi"}]}),
            &[],
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-llm-deployment"), Some("c"));
    assert_eq!(response.header("x-llm-attempts"), Some("1"));
    assert!(Gateway::take(&gw.a).is_empty());
    assert_eq!(Gateway::take(&gw.c).len(), 1);
    // small enough: small serves it
    let response = gw.ask("long", &[]).await;
    assert_eq!(response.header("x-llm-deployment"), Some("small"));

    // the provider says the prompt is too long: the next deployment gets it
    Gateway::take(&gw.a);
    gw.a.set_default_knobs(&[
        ("x-mock-status", "400"),
        ("x-mock-error-code", "context_length_exceeded"),
    ]);
    let response = gw.ask("fast", &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-llm-deployment"), Some("b"));
    assert_eq!(response.header("x-llm-attempts"), Some("2"));
    assert_eq!(
        response.header("x-llm-fallback"),
        None,
        "internal header removed"
    );
    let second = Gateway::take(&gw.b);
    assert_eq!(second.len(), 1);
    assert_provider_request(&second[0], "model-b", ("x-api-key", "cred-b"));
    assert_eq!(gw.stat("context_length_fallbacks"), 1);

    // the last deployment's context-length error reaches the client as it is
    gw.b.set_default_knobs(&[
        ("x-mock-status", "400"),
        ("x-mock-error-code", "context_length_exceeded"),
    ]);
    let response = gw.ask("fast", &[]).await;
    http::assert_openai_error(&response, 400, "context_length_exceeded");
    assert_eq!(response.header("x-llm-attempts"), Some("2"));
}

/// Sends a streaming chat request on a raw connection and returns every byte Envoy sent and
/// whether the chunked body ended cleanly (terminating chunk).
async fn raw_stream(gw: &Gateway, knob: &str) -> (String, bool) {
    let body =
        json!({"model": "fast", "stream": true, "messages": [{"role": "user", "content": "hi"}]})
            .to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {KEY_ALL}\r\n\
         content-type: application/json\r\n{knob}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = TcpStream::connect(gw.envoy.listener("gateway").unwrap())
        .await
        .unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "Envoy closed the connection");
    let text = String::from_utf8_lossy(&out).into_owned();
    let clean = text.ends_with("\r\n0\r\n\r\n");
    (text, clean)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_after_the_first_chunk_never_looks_complete() {
    let gw = Gateway::start().await;

    // The provider ends the stream cleanly but early (no [DONE]): the client gets the chunks,
    // then the in-band error event, and no [DONE].
    let (text, clean) = raw_stream(&gw, "x-mock-end-after: 1").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(clean, "the body ends properly: {text}");
    assert_eq!(text.matches("chat.completion.chunk").count(), 1, "{text}");
    assert!(
        text.contains("\"code\":\"upstream_stream_interrupted\""),
        "{text}"
    );
    assert!(!text.contains("[DONE]"), "{text}");
    assert_eq!(gw.stat("stream_interrupted"), 1);

    // The provider's connection dies after the first chunk: Envoy resets the client's stream
    // (no terminating chunk), which no client reads as a complete answer. No filter callback
    // runs after an upstream reset, so no event can be added (docs/router-fallback.md).
    let (text, clean) = raw_stream(&gw, "x-mock-cut-after: 1").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert_eq!(text.matches("chat.completion.chunk").count(), 1, "{text}");
    assert!(
        !clean,
        "a cut stream must not end like a complete one: {text}"
    );
    assert!(!text.contains("[DONE]"), "{text}");
    // after the first byte there is no fallback
    assert!(Gateway::take(&gw.b).is_empty());

    // a complete stream is untouched
    let (text, clean) = raw_stream(&gw, "x-mock-chunks: 2").await;
    assert!(
        clean && text.contains("data: [DONE]") && !text.contains("upstream_stream_interrupted")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_skips_a_failing_deployment_and_recovers_after_the_cooldown() {
    let gw = Gateway::start().await;
    gw.a.set_default_knobs(&[("x-mock-status", "503")]);
    // two failures in a row open a's breaker (each request still succeeds through b)
    for _ in 0..2 {
        let response = gw.ask("fast", &[]).await;
        assert_eq!(response.header("x-llm-attempts"), Some("2"));
    }
    assert_eq!(Gateway::take(&gw.a).len(), 2);
    assert_eq!(gw.stat("breaker.opened.a"), 1);

    // open: a is skipped, b answers at the first attempt
    for _ in 0..3 {
        let response = gw.ask("fast", &[]).await;
        assert_eq!(response.status, 200);
        assert_eq!(response.header("x-llm-deployment"), Some("b"));
        assert_eq!(response.header("x-llm-attempts"), Some("1"));
    }
    assert!(
        Gateway::take(&gw.a).is_empty(),
        "an open breaker sends nothing to a"
    );

    // a recovers; after the cooldown one probe goes to a and closes the breaker
    gw.a.set_default_knobs(&[]);
    tokio::time::sleep(Duration::from_millis(COOLDOWN_MS + 200)).await;
    let probe = gw.ask("fast", &[]).await;
    assert_eq!(probe.header("x-llm-deployment"), Some("a"));
    assert_eq!(probe.header("x-llm-attempts"), Some("1"));
    assert_eq!(gw.stat("breaker.recovered.a"), 1);
    for _ in 0..3 {
        assert_eq!(
            gw.ask("fast", &[]).await.header("x-llm-deployment"),
            Some("a")
        );
    }
    let logs = gw
        .logs_with(&[
            "breaker opened: deployment a",
            "breaker half-open: probing deployment a",
            "breaker closed: deployment a recovered",
        ])
        .await;
    assert!(!logs.contains("cred-a"), "no credential in the logs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_split_holds_on_1000_requests_and_users_stay_on_their_side() {
    let gw = Gateway::start().await;
    let n = 1000;
    let mut served_by_a = 0;
    let mut sides = std::collections::HashMap::new();
    for batch in 0..(n / 20) {
        let responses = futures_join(&gw, batch * 20, 20).await;
        for (user, response) in responses {
            assert_eq!(response.status, 200, "{}", response.text());
            let deployment = response.header("x-llm-deployment").unwrap().to_string();
            if deployment == "a" {
                served_by_a += 1;
            }
            sides.insert(user, deployment);
        }
    }
    let share = f64::from(served_by_a) / f64::from(n);
    assert!(
        (share - 0.70).abs() <= 0.05,
        "deployment a served {share:.3}, want 0.70 ± 0.05"
    );
    assert_eq!(gw.a.requests().len() + gw.c.requests().len(), n as usize);

    // a user stays on one side
    for user in (0..50).map(|i| format!("user-{i}")) {
        let again = gw.ask("canary", &[("x-user-id", &user)]).await;
        assert_eq!(
            again.header("x-llm-deployment"),
            sides.get(&user).map(String::as_str)
        );
    }
    assert!(gw.stat("version.e2e-v3.requests") >= n as u64);
    let distinct: HashSet<&String> = sides.values().collect();
    assert_eq!(distinct.len(), 2);
}

async fn futures_join(gw: &Gateway, start: u32, count: u32) -> Vec<(String, Response)> {
    let mut handles = Vec::new();
    for i in start..start + count {
        let user = format!("user-{i}");
        let request = http::post(format!("{}/v1/chat/completions", gw.envoy.url()))
            .header("authorization", &format!("Bearer {KEY_ALL}"))
            .header("x-user-id", &user)
            .json(&json!({"model": "canary", "messages": [{"role": "user", "content": "hi"}]}));
        handles.push(tokio::spawn(async move {
            (user, request.send().await.unwrap())
        }));
    }
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

#[test]
fn envoy_validates_the_router_config() {
    let router = router_config();
    let mut upstream = router.clone();
    upstream["role"] = json!("upstream");
    let vars = vec![
        ("MOCK_A_PORT", "1".to_string()),
        ("MOCK_B_PORT", "2".to_string()),
        ("MOCK_C_PORT", "3".to_string()),
        ("DEAD_PORT", "4".to_string()),
        ("KEY_AUTH_CONFIG", key_auth_config().to_string()),
        ("ROUTER_CONFIG", router.to_string()),
        ("ROUTER_UPSTREAM_CONFIG", upstream.to_string()),
    ];
    Envoy::validate("e2e-router.yaml", &vars).unwrap();
    let mut bad = router_config();
    bad["groups"][0]["deployments"][0]["deployment"] = json!("nope");
    let mut bad_vars = vars.clone();
    bad_vars[5] = ("ROUTER_CONFIG", bad.to_string());
    assert!(Envoy::validate("e2e-router.yaml", &bad_vars).is_err());
}

/// Issue 18: the deployments are configured once, in the listener's model-router; the upstream
/// role of `gateway.yaml` reads them from the VM the two share. One that cannot (here: given a
/// VM of its own) refuses the attempt with a 500 that names the deployment — the request never
/// reaches a provider with the group's name as model and no credential.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_role_that_cannot_resolve_its_deployment_refuses_it() {
    let shared = "root_id: model-router-upstream\n              fail_open: false\n              allow_on_headers_stop_iteration: true\n              vm_config:\n                vm_id: model-router\n";
    let alone = shared.replace("vm_id: model-router\n", "vm_id: model-router-alone\n");
    let demo = llm_gateway_tests::demo::Demo::start_variant(&[(shared, alone.as_str())])
        .await
        .unwrap();
    let body = json!({"model": "fast", "messages": [{"role": "user", "content": "Hello!"}]});
    let response = http::post(format!("{}/v1/chat/completions", demo.url()))
        .header(
            "authorization",
            &format!("Bearer {}", llm_gateway_tests::demo::DEMO_KEY),
        )
        .json(&body)
        .send()
        .await
        .unwrap();
    let error = http::assert_openai_error(&response, 500, "gateway_internal_error");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("`openai-mini`"), "{message}");
    assert!(demo.openai.requests().is_empty() && demo.azure.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_429_with_retry_after_cools_its_deployment_down_on_every_worker() {
    let gw = Gateway::start().await;
    // a answers this one request 429 with `retry-after: 2` (b, which gets the same client
    // headers, answers: the status is for model-a only)
    let before = std::time::Instant::now();
    let response = gw
        .ask(
            "fast",
            &[
                ("x-mock-status", "429"),
                ("x-mock-status-model", "model-a"),
                ("x-mock-retry-after", "2"),
            ],
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-llm-deployment"), Some("b"));
    assert_eq!(response.header("x-llm-attempts"), Some("2"));
    assert_eq!(
        response.header("x-llm-fallback"),
        None,
        "the mark stays inside"
    );
    assert_eq!(gw.stat("cooldown.a"), 1);
    assert_eq!(gw.stat("status_fallbacks.429"), 1);
    assert_eq!(Gateway::take(&gw.a).len(), 1);
    Gateway::take(&gw.b);

    // while it cools (< 1.5 s since the 429, on whichever of the 2 workers): b only, first try
    let mut cooled = 0;
    while before.elapsed() < Duration::from_millis(1_500) {
        let response = gw.ask("fast", &[]).await;
        let elapsed = before.elapsed();
        assert_eq!(response.status, 200, "{}", response.text());
        if elapsed < Duration::from_millis(1_500) {
            assert_eq!(
                response.header("x-llm-deployment"),
                Some("b"),
                "{elapsed:?} after the 429"
            );
            assert_eq!(response.header("x-llm-attempts"), Some("1"));
            cooled += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(cooled >= 2, "{cooled} requests while a cooled down");
    assert!(
        Gateway::take(&gw.a).is_empty(),
        "a got nothing while cooling"
    );

    // then back to a, within 6 s of the 429 (and never before the 2 s it asked for)
    let back = loop {
        let response = gw.ask("fast", &[]).await;
        assert_eq!(response.status, 200, "{}", response.text());
        if response.header("x-llm-deployment") == Some("a") {
            break before.elapsed();
        }
        assert!(
            before.elapsed() < Duration::from_secs(6),
            "a not back after {:?}",
            before.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        back >= Duration::from_millis(1_900),
        "a back after {back:?}"
    );
    // a cooldown is not a breaker: a's breaker saw one failure and stays closed
    assert_eq!(gw.stat("breaker.opened.a"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_retry_on_decides_whether_a_500_moves_on() {
    let gw = Gateway::start().await;
    let fail_a = [("x-mock-status", "500"), ("x-mock-status-model", "model-a")];
    // `strict` moves on only on a 429: a's 500 reaches the client
    let response = gw.ask("strict", &fail_a).await;
    http::assert_openai_error(&response, 500, "mock_500");
    assert_eq!(response.header("x-llm-deployment"), Some("a"));
    assert_eq!(response.header("x-llm-attempts"), Some("1"));
    assert_eq!(response.header("x-llm-fallback"), None);
    assert!(Gateway::take(&gw.b).is_empty(), "b was never tried");
    // `fast` (no retry_on: 429 and 5xx) moves on to b
    let response = gw.ask("fast", &fail_a).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-llm-deployment"), Some("b"));
    assert_eq!(response.header("x-llm-attempts"), Some("2"));
    assert_eq!(gw.stat("status_fallbacks.500"), 1);
    assert_eq!(
        (Gateway::take(&gw.a).len(), Gateway::take(&gw.b).len()),
        (2, 1)
    );
    // and `strict` still moves on on a 429 (a's breaker is open now: two failures, so the
    // plan may start at b; either way b answers)
    let response = gw
        .ask(
            "strict",
            &[("x-mock-status", "429"), ("x-mock-status-model", "model-a")],
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-llm-deployment"), Some("b"));
}
