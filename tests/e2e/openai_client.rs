//! The gateway driven by a real client: the official `openai` Python SDK (the version
//! `scripts/setup` pins into `.venv`) runs `tests/openai/journey.py` against the whole chain in
//! Envoy 1.40 (`envoy-config/gateway.yaml`, the demo gateway with its mock providers):
//! `chat.completions.create` with and without streaming, `models.list` and `models.retrieve`
//! (each key's groups), and the SDK's typed errors for 401, 403, 404, 429 and 402. The script checks what the SDK sees; this test checks the script passed,
//! then holds its observations against what the providers received and the access log.

use llm_gateway_tests::demo::{
    Demo, ANTHROPIC_CREDENTIAL, AZURE_CREDENTIAL, DEMO_KEY, FAST_ONLY_KEY, OPENAI_CREDENTIAL,
};
use llm_gateway_tests::workspace;
use mock_upstream::RecordedRequest;
use serde_json::{json, Value};
use std::collections::BTreeSet;

const EMAIL: &str = "jane.doe@example.com";
/// The journey's requests that carry the e-mail address (`x-run-id`).
const PII_STEPS: [&str; 4] = ["non-stream", "non-stream-raw", "stream", "stream-usage"];

/// The `openai` version `scripts/setup` installs.
fn pinned_sdk_version() -> String {
    let setup = std::fs::read_to_string(workspace::root().join("scripts/setup")).unwrap();
    setup
        .lines()
        .find_map(|l| l.strip_prefix("openai_version="))
        .expect("scripts/setup pins openai_version=")
        .trim()
        .to_string()
}

/// Runs the journey; its observations.
async fn run_journey(gateway: String) -> Value {
    let root = workspace::root();
    let python = root.join(".venv/bin/python");
    let script = root.join("tests/openai/journey.py");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&python)
            .arg(&script)
            .args(["--gateway", &gateway, "--key", DEMO_KEY])
            .args(["--fast-only-key", FAST_ONLY_KEY])
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .output()
            .map_err(|e| format!("{}: {e} (run scripts/setup)", python.display()))
    })
    .await
    .unwrap()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "journey.py failed ({}):\n--- stderr\n{stderr}\n--- stdout\n{stdout}",
        out.status
    );
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("journey.py printed no JSON ({e}):\n{stdout}\n{stderr}"))
}

fn run_id(headers: &[Value]) -> Option<String> {
    headers
        .iter()
        .find_map(|h| (h[0].as_str()? == "x-run-id").then(|| h[1].as_str().map(str::to_string))?)
}

fn check_provider_request(request: &RecordedRequest) {
    let seen = format!("{request:?}");
    assert_eq!(request.method, "POST", "{seen}");
    assert_eq!(request.path, "/v1/chat/completions", "{seen}");
    let body = request.json().unwrap_or_else(|| panic!("{seen}"));
    assert_eq!(body["model"], "gpt-4o-mini", "{seen}");
    assert_eq!(
        request.header("authorization"),
        Some(format!("Bearer {OPENAI_CREDENTIAL}").as_str()),
        "{seen}"
    );
    for (name, value) in &request.headers {
        assert!(
            !name.starts_with("x-llm-") && name != "x-user-id",
            "internal header {name} reached the provider: {seen}"
        );
        assert!(
            !value.contains(DEMO_KEY) && !value.contains(FAST_ONLY_KEY),
            "a virtual key reached the provider in {name}: {seen}"
        );
    }
    let raw = String::from_utf8_lossy(&request.body);
    assert!(!raw.contains(EMAIL) && !raw.contains(DEMO_KEY), "{seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_drives_the_whole_chain() {
    let demo = Demo::start(0).await.unwrap();
    let obs = run_journey(demo.url()).await;

    // the SDK the script ran is the one scripts/setup pins
    assert_eq!(obs["sdk_version"], pinned_sdk_version().as_str());
    let message = obs["message"].as_str().unwrap();
    assert!(message.contains(EMAIL));

    // What the client received: every exchange, headers and the body bytes it read.
    let exchanges = obs["exchanges"].as_array().unwrap();
    let mut admitted = BTreeSet::new();
    let mut statuses = Vec::new();
    for exchange in exchanges {
        let shown = exchange.to_string();
        let received = format!("{} {}", exchange["headers"], exchange["body"]);
        for secret in [OPENAI_CREDENTIAL, AZURE_CREDENTIAL, ANTHROPIC_CREDENTIAL] {
            assert!(
                !received.contains(secret),
                "a provider credential reached the client: {shown}"
            );
        }
        assert!(
            !received.contains("[EMAIL_"),
            "a placeholder reached the client: {shown}"
        );
        let id = run_id(exchange["request_headers"].as_array().unwrap()).unwrap();
        let status = exchange["status"].as_u64().unwrap();
        statuses.push((id.clone(), status));
        if id.starts_with("models-") {
            // the gateway's own answer: GET, never a provider (checked below)
            assert_eq!(exchange["method"], "GET", "{shown}");
            continue;
        }
        if status == 200 {
            assert!(admitted.insert(id), "{shown}");
        }
    }
    let refused: Vec<_> = statuses.iter().filter(|(_, s)| *s != 200).collect();
    assert_eq!(
        refused,
        [
            &("models-retrieve-smart".to_string(), 404),
            &("wrong-key".to_string(), 401),
            &("not-allowed".to_string(), 403),
            &("rpm-11".to_string(), 429),
            &("over-budget".to_string(), 402),
        ],
        "{statuses:?}"
    );

    // What the providers received: each admitted request once, at the `fast` group's first
    // deployment, with the provider credential and a placeholder for the e-mail address;
    // nothing of the refused ones.
    let requests = demo.openai.requests();
    assert!(demo.azure.requests().is_empty());
    assert!(demo.anthropic.requests().is_empty());
    let mut at_provider = BTreeSet::new();
    for request in &requests {
        check_provider_request(request);
        let id = request.header("x-run-id").unwrap().to_string();
        let body = request.json().unwrap();
        if PII_STEPS.contains(&id.as_str()) {
            let said = body["messages"]
                .as_array()
                .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
                .and_then(|m| m["content"].as_str())
                .unwrap();
            assert_eq!(said, message.replace(EMAIL, "[EMAIL_1]"), "{request:?}");
        }
        if id.starts_with("stream") {
            // the client of "stream" did not ask for usage: usage-accounting asked for it
            assert_eq!(body["stream"], true, "{request:?}");
            assert_eq!(body["stream_options"]["include_usage"], true, "{request:?}");
        }
        assert!(at_provider.insert(id), "sent twice: {request:?}");
    }
    assert_eq!(at_provider, admitted);
    assert!(PII_STEPS.iter().all(|s| admitted.contains(*s)));
    assert_eq!(
        admitted.iter().filter(|id| id.starts_with("rpm-")).count(),
        11, // rpm-1 ..= rpm-10 and rpm-other
        "{admitted:?}"
    );

    // The usage records in the access log match what the SDK reported, including the stream
    // whose client never saw a usage chunk.
    let record = |id: &'static str| {
        demo.envoy.access_log_line("access.log", id, move |line| {
            let record: Value = serde_json::from_str(line["usage"].as_str()?).ok()?;
            (record["run_id"] == id).then_some(record)
        })
    };
    let non_stream = record("non-stream").await;
    let stream = record("stream").await;
    let stream_usage = record("stream-usage").await;
    let client_usage = &obs["non_stream"]["usage"];
    for (record, stream_flag) in [(&non_stream, false), (&stream, true), (&stream_usage, true)] {
        assert_eq!(record["consumer"], "demo", "{record}");
        assert_eq!(record["tenant"], "demo", "{record}");
        assert_eq!(record["model_group"], "fast", "{record}");
        assert_eq!(record["deployment"], "openai-mini", "{record}");
        assert_eq!(record["model"], "gpt-4o-mini", "{record}");
        assert_eq!(record["stream"], stream_flag, "{record}");
        assert_eq!(record["status"], 200, "{record}");
        assert_eq!(record["complete"], true, "{record}");
        assert_eq!(record["usage_source"], "upstream", "{record}");
        // the same prompt and the same echoed answer: the same counts in all three
        for field in ["prompt_tokens", "completion_tokens", "total_tokens"] {
            assert_eq!(
                record["usage"][field], client_usage[field],
                "{field}: {record}"
            );
        }
    }
    assert_eq!(obs["stream_usage"]["usage"], *client_usage);
    assert_eq!(obs["stream"]["usage"], Value::Null);
    let cost = non_stream["cost_nano"].as_u64().unwrap();
    assert!(cost > 0, "{non_stream}");
    let header_cost = obs["non_stream"]["raw_headers"]["x-llm-cost"]
        .as_str()
        .unwrap();
    assert!(header_cost.ends_with(" USD"), "{header_cost}");

    // The model list: each key's groups, answered by the gateway (no provider saw a
    // `models-` request: every provider request was checked above to be a chat completion of
    // an admitted step).
    let models = &obs["models"];
    assert_eq!(
        models["list"],
        json!(["fast", "smart", "claude", "code"]),
        "{models}"
    );
    assert_eq!(models["list_fast_only"], json!(["fast"]), "{models}");
    assert_eq!(models["retrieved"]["id"], "fast", "{models}");
    assert_eq!(models["retrieved"]["owned_by"], "llm-gateway", "{models}");
    assert_eq!(models["hidden"]["class"], "NotFoundError", "{models}");
    assert_eq!(models["hidden"]["code"], "model_not_found", "{models}");
    let listed = statuses
        .iter()
        .filter(|(id, _)| id.starts_with("models-"))
        .count();
    assert_eq!(listed, 4, "{statuses:?}");

    // The typed errors, as the SDK classified them.
    let errors = &obs["errors"];
    for (name, class, status, code) in [
        ("auth", "AuthenticationError", 401, "invalid_api_key"),
        (
            "permission",
            "PermissionDeniedError",
            403,
            "model_not_allowed",
        ),
        ("rate_limit", "RateLimitError", 429, "rate_limit_exceeded"),
        ("budget", "APIStatusError", 402, "budget_exceeded"),
    ] {
        let e = &errors[name];
        assert_eq!(e["class"], class, "{e}");
        assert_eq!(e["status"], status, "{e}");
        assert_eq!(e["code"], code, "{e}");
        assert_eq!(e["body"]["code"], code, "{e}");
    }
    assert!(errors["rate_limit"]["headers"]["retry-after"].is_string());
    assert_eq!(errors["budget"]["headers"]["x-llm-budget"], "user-day");
}
