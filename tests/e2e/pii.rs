//! pii-redaction end to end: the compiled plugin in a real Envoy 1.40 (`--concurrency 2`), in
//! front of the mock upstream, driven by a real HTTP client.
//!
//! The mock's `x-mock-echo` knob answers with the last user message — the text the upstream
//! received, so with placeholders — cut into 3-character deltas; with
//! `x-mock-chunk-delay-ms` every event is its own network write. So a placeholder reaches the
//! plugin split across events and across body chunks, and the client must still read the
//! original values.
//!
//! Config: `envoy-config/e2e-pii.yaml` with the JSON below.

use llm_gateway_tests::envoy::Envoy;
use llm_gateway_tests::http::{self, sse_events, Response};
use mock_upstream::{MockUpstream, RecordedRequest};
use serde_json::{json, Value};

const EMAIL: &str = "alice.wong@example.com";
const PHONE: &str = "13800138000";
const ID: &str = "11010519491231002X";
const MAX_BODY: usize = 256 * 1024;

fn prompt() -> String {
    format!("Write to {EMAIL} or call {PHONE}; my ID is {ID}. Thanks {EMAIL}!")
}

fn masked_prompt() -> &'static str {
    "Write to [EMAIL_1] or call [PHONE_1]; my ID is [ID_1]. Thanks [EMAIL_1]!"
}

fn config() -> Value {
    json!({
        "rules": [
            {"detector": "email"},
            {"detector": "phone_cn"},
            {"detector": "id_cn"},
            {"detector": "card", "action": "hash"},
            {"detector": "private_key", "action": "block"},
            {"name": "CODENAME", "words": ["Project Falcon"], "action": "block"}
        ],
        "output_rules": [{"detector": "ipv4"}],
        "hash_salt": "e2e-salt-0123",
        "max_body_bytes": MAX_BODY,
        "oversize": "reject",
        "hold_headers": true,
        "_rules_": [
            {"_match_route_": ["pass-oversize"], "oversize": "pass"},
            {"_match_route_": ["nohold"], "hold_headers": false}
        ]
    })
}

struct Gateway {
    upstream: MockUpstream,
    envoy: Envoy,
}

impl Gateway {
    async fn start() -> Gateway {
        let upstream = MockUpstream::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let vars = vec![
            ("MOCK_PORT", upstream.addr().port().to_string()),
            ("PII_CONFIG", config().to_string().replace('\'', "''")),
        ];
        let envoy = tokio::task::spawn_blocking(move || Envoy::start("e2e-pii.yaml", &vars))
            .await
            .unwrap()
            .unwrap();
        Gateway { upstream, envoy }
    }

    async fn post(&self, path: &str, headers: &[(&str, &str)], body: &Value) -> Response {
        let mut request = http::post(format!("{}{path}", self.envoy.url())).json(body);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        request.send().await.unwrap()
    }

    /// Every request the upstream received since the last call.
    fn take_upstream_requests(&self) -> Vec<RecordedRequest> {
        let requests = self.upstream.requests();
        self.upstream.clear_requests();
        requests
    }

    fn take_upstream_request(&self) -> RecordedRequest {
        let requests = self.take_upstream_requests();
        assert_eq!(requests.len(), 1, "upstream requests: {requests:?}");
        requests.into_iter().next().unwrap()
    }

    fn stat(&self, name: &str) -> u64 {
        self.envoy
            .stat(&format!("wasmcustom.llm_gateway.pii.{name}"))
            .unwrap()
            .unwrap_or(0)
    }
}

/// The upstream body carries placeholders only: no original value anywhere in it.
fn assert_placeholders_only(seen: &RecordedRequest) {
    let body = String::from_utf8_lossy(&seen.body);
    for original in [EMAIL, PHONE, ID] {
        assert!(
            !body.contains(original),
            "{original} reached the upstream: {body}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_upstream_sees_placeholders_and_client_gets_originals() {
    let gw = Gateway::start().await;
    let body = json!({"model": "m", "messages": [
        {"role": "system", "content": "You help."},
        {"role": "user", "name": EMAIL, "content": [{"type": "text", "text": prompt()},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}
    ]});

    // not streaming
    let response = gw
        .post("/v1/chat/completions", &[("x-mock-echo", "1")], &body)
        .await;
    assert_eq!(response.status, 200, "{}", response.text());
    let seen = gw.take_upstream_request();
    assert_placeholders_only(&seen);
    let sent = seen.json().expect("upstream body is JSON");
    assert_eq!(sent["messages"][1]["content"][0]["text"], masked_prompt());
    // the participant's name is scanned like the text: the same value, the same placeholder
    assert_eq!(sent["messages"][1]["name"], "[EMAIL_1]");
    assert_eq!(
        sent["messages"][1]["content"][1],
        body["messages"][1]["content"][1]
    );
    assert_eq!(sent["messages"][0], body["messages"][0]);
    assert_eq!(
        seen.header("content-length"),
        Some(seen.body.len().to_string().as_str()),
        "held headers carry the redacted length"
    );
    let answer = response.json().unwrap();
    assert_eq!(answer["choices"][0]["message"]["content"], prompt());

    // headers not held: they go upstream without a length, the body follows redacted
    let response = gw
        .post("/nohold/chat/completions", &[("x-mock-echo", "1")], &body)
        .await;
    assert_eq!(response.status, 200, "{}", response.text());
    let seen = gw.take_upstream_request();
    assert_placeholders_only(&seen);
    assert_eq!(seen.header("content-length"), None);
    assert_eq!(seen.header("transfer-encoding"), Some("chunked"));
    assert_eq!(
        response.json().unwrap()["choices"][0]["message"]["content"],
        prompt()
    );

    // streaming: one event per write, placeholders cut across events
    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let response = gw
        .post(
            "/v1/chat/completions",
            &[("x-mock-echo", "1"), ("x-mock-chunk-delay-ms", "1")],
            &streaming,
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_placeholders_only(&gw.take_upstream_request());
    let events = sse_events(&response.text());
    assert_eq!(events.last().unwrap().1, json!("[DONE]"));
    let text: String = events
        .iter()
        .filter_map(|(_, v)| v["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, prompt());
    // the finish chunk comes after all the text
    let finish = events
        .iter()
        .position(|(_, v)| v["choices"][0]["finish_reason"] == "stop")
        .unwrap();
    assert!(events[finish + 1..]
        .iter()
        .all(|(_, v)| v["choices"][0]["delta"]["content"].is_null()));

    // the events reached the plugin in many body callbacks (one write each), so placeholders
    // were cut across network chunks, not only across events. Envoy writes its log on a
    // timer: wait for the lines.
    let partial_callbacks = |logs: &str| {
        logs.lines()
            .filter(|l| l.contains("[host->vm] proxy_on_response_body(") && l.ends_with(", 0)"))
            .count()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let mut logs = gw.envoy.logs();
    while (partial_callbacks(&logs) < 20 || logs.matches("\"status\":").count() < 2)
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        logs = gw.envoy.logs();
    }
    assert!(
        partial_callbacks(&logs) >= 20,
        "{}",
        partial_callbacks(&logs)
    );

    assert!(gw.stat("matches.email") >= 4, "two per request");
    assert!(gw.stat("matches.id") >= 2);
    assert!(gw.stat("responses_restored") >= 2);
    // values never reach Envoy's log (wasm:trace logs every host call) nor the access log
    assert!(logs.contains("proxy_on_request_body"), "the log was read");
    for original in [EMAIL, PHONE, ID] {
        assert!(!logs.contains(original), "{original} in the Envoy log");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_and_responses_streams_are_restored() {
    let gw = Gateway::start().await;
    let headers = [("x-mock-echo", "1"), ("x-mock-chunk-delay-ms", "1")];

    let body = json!({"model": "m", "max_tokens": 500, "stream": true,
        "system": format!("The user is {EMAIL}."),
        "messages": [{"role": "user", "content": [{"type": "text", "text": prompt()}]}]});
    let response = gw.post("/v1/messages", &headers, &body).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let seen = gw.take_upstream_request();
    assert_placeholders_only(&seen);
    assert_eq!(seen.json().unwrap()["system"], "The user is [EMAIL_1].");
    let events = sse_events(&response.text());
    let text: String = events
        .iter()
        .filter(|(name, _)| name.as_deref() == Some("content_block_delta"))
        .filter_map(|(_, v)| v["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, prompt());
    assert_eq!(events.last().unwrap().0.as_deref(), Some("message_stop"));

    let body = json!({"model": "m", "stream": true, "input": prompt()});
    let response = gw.post("/v1/responses", &headers, &body).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let seen = gw.take_upstream_request();
    assert_placeholders_only(&seen);
    assert_eq!(seen.json().unwrap()["input"], masked_prompt());
    let events = sse_events(&response.text());
    let text: String = events
        .iter()
        .filter(|(name, _)| name.as_deref() == Some("response.output_text.delta"))
        .filter_map(|(_, v)| v["delta"].as_str())
        .collect();
    assert_eq!(text, prompt());
    let completed = &events.last().unwrap().1;
    assert_eq!(
        completed["response"]["output"][0]["content"][0]["text"],
        prompt()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_rules_mask_what_the_model_says() {
    let gw = Gateway::start().await;
    // ipv4 is only an output rule: the upstream sees the address, the client does not get it
    // back from the model
    let text = format!("Server 10.20.30.40 belongs to {EMAIL}.");
    let body = json!({"model": "m", "messages": [{"role": "user", "content": text}]});
    let response = gw
        .post("/v1/chat/completions", &[("x-mock-echo", "1")], &body)
        .await;
    assert_eq!(response.status, 200, "{}", response.text());
    let sent = gw.take_upstream_request().json().unwrap();
    assert_eq!(
        sent["messages"][0]["content"],
        "Server 10.20.30.40 belongs to [EMAIL_1]."
    );
    assert_eq!(
        response.json().unwrap()["choices"][0]["message"]["content"],
        format!("Server [IP_1] belongs to {EMAIL}.")
    );

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let response = gw
        .post(
            "/v1/chat/completions",
            &[("x-mock-echo", "1"), ("x-mock-chunk-delay-ms", "1")],
            &streaming,
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text());
    gw.take_upstream_request();
    let text: String = sse_events(&response.text())
        .iter()
        .filter_map(|(_, v)| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(text, format!("Server [IP_1] belongs to {EMAIL}."));
    assert_eq!(gw.stat("output_matches.ip"), 2);
    assert_eq!(gw.stat("matches.email"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_rules_answer_400_naming_the_rule_and_hash_is_not_restored() {
    let gw = Gateway::start().await;
    let body = json!({"model": "m", "messages": [
        {"role": "user", "content": format!("{EMAIL}: status of project falcon?")}]});
    let response = gw.post("/v1/chat/completions", &[], &body).await;
    assert_eq!(response.status, 400, "{}", response.text());
    let error = response.json().unwrap();
    assert_eq!(error["error"]["code"], "pii_blocked_codename", "{error}");
    assert_eq!(error["error"]["type"], "invalid_request_error");
    assert!(!response.text().contains(EMAIL));
    assert!(!response.text().to_lowercase().contains("falcon"));
    assert!(gw.take_upstream_requests().is_empty());
    assert_eq!(gw.stat("blocked.codename"), 1);

    // headers not held: they reached the upstream, but the stream was reset before any body
    let response = gw.post("/nohold/chat/completions", &[], &body).await;
    assert_eq!(response.status, 400, "{}", response.text());
    for seen in gw.take_upstream_requests() {
        assert!(seen.body.is_empty(), "{seen:?}");
    }

    let pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\n-----END PRIVATE KEY-----";
    let body = json!({"model": "m", "messages": [{"role": "user", "content": pem}]});
    let response = gw.post("/v1/chat/completions", &[], &body).await;
    assert_eq!(response.status, 400);
    assert_eq!(
        response.json().unwrap()["error"]["code"],
        "pii_blocked_private_key"
    );

    // hash: a stable token upstream, and (not reversible) the token comes back as is
    let card = "4111 1111 1111 1111";
    let body =
        json!({"model": "m", "messages": [{"role": "user", "content": format!("card {card}")}]});
    let response = gw
        .post("/v1/chat/completions", &[("x-mock-echo", "1")], &body)
        .await;
    assert_eq!(response.status, 200, "{}", response.text());
    let sent = gw.take_upstream_request().json().unwrap();
    let token = sent["messages"][0]["content"].as_str().unwrap().to_owned();
    assert!(
        token.starts_with("card <CARD:") && !token.contains(card),
        "{token}"
    );
    assert_eq!(
        response.json().unwrap()["choices"][0]["message"]["content"],
        token
    );

    // not JSON in messages scope: refused, not forwarded unscanned
    let response = http::post(format!("{}/v1/chat/completions", gw.envoy.url()))
        .header("content-type", "application/json")
        .body(format!("{{\"messages\": \"{EMAIL}"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status, 400);
    assert_eq!(response.json().unwrap()["error"]["code"], "invalid_json");
    let leaked = gw.take_upstream_requests();
    assert!(leaked.is_empty(), "{leaked:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_megabyte_body_follows_the_size_policy() {
    let gw = Gateway::start().await;
    let filler = "lorem ipsum ".repeat(1024 * 1024 / 12);
    let body = json!({"model": "m", "messages": [
        {"role": "user", "content": format!("{EMAIL} {filler}")}]});
    assert!(body.to_string().len() >= 1024 * 1024);

    // global config: reject with 413, nothing forwarded
    let response = gw.post("/v1/chat/completions", &[], &body).await;
    assert_eq!(response.status, 413, "{}", response.text());
    assert_eq!(
        response.json().unwrap()["error"]["code"],
        "request_too_large"
    );
    let leaked = gw.take_upstream_requests();
    assert!(leaked.is_empty(), "{leaked:?}");
    assert_eq!(gw.stat("oversize_rejected"), 1);

    // the /pass/ route's rule: forwarded unscanned, counted
    let response = gw.post("/pass/chat/completions", &[], &body).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let seen = gw.take_upstream_request();
    assert_eq!(seen.body.len(), body.to_string().len());
    assert!(String::from_utf8_lossy(&seen.body).contains(EMAIL));
    assert_eq!(gw.stat("oversize_passed"), 1);

    // just under the limit: scanned
    let filler = "x".repeat(MAX_BODY - 200);
    let body = json!({"model": "m", "messages": [
        {"role": "user", "content": format!("{EMAIL} {filler}")}]});
    let response = gw.post("/v1/chat/completions", &[], &body).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_placeholders_only(&gw.take_upstream_request());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_validates_the_config_and_refuses_a_bad_one() {
    let vars = |config: Value| {
        vec![
            ("MOCK_PORT", "9".to_string()),
            ("PII_CONFIG", config.to_string().replace('\'', "''")),
        ]
    };
    tokio::task::spawn_blocking(move || {
        Envoy::validate("e2e-pii.yaml", &vars(config())).unwrap();
        let bad = json!({"rules": [{"name": "X", "pattern": "("}]});
        let err = Envoy::validate("e2e-pii.yaml", &vars(bad)).unwrap_err();
        assert!(err.contains("rules[0].pattern"), "{err}");
    })
    .await
    .unwrap();
}
