//! The whole chain end to end: `envoy-config/gateway.yaml` as shipped (key-auth, model-router,
//! pii-redaction, usage-accounting, token-ratelimit) in a real Envoy 1.40 with `--concurrency
//! 2`, the three mock providers of the demo (`tests/src/demo.rs`) and real HTTP clients.
//!
//! The user's journey: a virtual key with the `fast` group streams a chat request with an
//! e-mail address in it; the provider sees a placeholder, the real model name and the provider
//! credential, never the virtual key; the client gets its address back in the stream and the
//! `x-llm-*` headers; the usage is in the access log and in the ledger read from it; the budget
//! was reserved and then reconciled to the real usage. Then the refusals (401, 403, 404, 429,
//! 402), fallback on a provider's 429, and Anthropic's `/v1/messages` through the same chain;
//! the model list the gateway answers itself, and Claude Code's token counting, which reaches
//! the Anthropic deployment and is counted as a request but charged nothing.

use llm_gateway_tests::demo::{
    Demo, ANTHROPIC_CREDENTIAL, AZURE_CREDENTIAL, DEMO_KEY, FAST_ONLY_KEY, OPENAI_CREDENTIAL,
};
use llm_gateway_tests::http::{self, sse_events, Response};
use llm_gateway_tests::workspace::EnvoyVersion;
use mock_upstream::RecordedRequest;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const EMAIL: &str = "jane.doe@example.com";
/// `user-day` in gateway.yaml: tokens per `x-user-id` per day.
const USER_DAY_TOKENS: u64 = 20_000;
/// `user-rpm` in gateway.yaml: requests per `x-user-id` per minute.
const USER_RPM: usize = 10;
/// Prices of gateway.yaml, nano-USD per token (micro-USD per 1M tokens ÷ 1000).
const OPENAI_MINI_NANO: (u64, u64) = (150, 600);
const AZURE_MINI_NANO: (u64, u64) = (165, 660);
const CLAUDE_NANO: (u64, u64) = (3_000, 15_000);

async fn post(demo: &Demo, path: &str, headers: &[(&str, &str)], body: &Value) -> Response {
    let mut request = http::post(format!("{}{path}", demo.url())).json(body);
    for (name, value) in headers {
        request = request.header(name, value);
    }
    request.send().await.unwrap()
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

fn chat(content: &str, stream: bool) -> Value {
    json!({"model": "fast", "stream": stream, "messages": [{"role": "user", "content": content}]})
}
/// Everything a client received, head and body, as one text: for "never reaches the client".
fn everything(response: &Response) -> String {
    let mut all = String::new();
    for (name, value) in &response.headers {
        all.push_str(&format!("{name}: {value}\n"));
    }
    all.push_str(&response.text());
    all
}

/// What a provider must (and must not) receive: its own credential in its own header, the
/// deployment's model name, no virtual key, no gateway-internal header, no end-user id.
fn assert_provider_view(seen: &RecordedRequest, model: &str, credential: (&str, &str)) -> Value {
    let body = seen.json().unwrap();
    assert_eq!(body["model"], model, "{body}");
    assert_eq!(
        seen.header(credential.0),
        Some(credential.1),
        "{:?}",
        seen.headers
    );
    for (name, value) in &seen.headers {
        assert!(
            !value.contains(DEMO_KEY) && !value.contains(FAST_ONLY_KEY),
            "{name} carries the virtual key"
        );
        assert!(!name.starts_with("x-llm-"), "{name} reached the provider");
        assert_ne!(name, "x-mse-consumer");
        assert_ne!(name, "x-user-id");
    }
    let text = String::from_utf8_lossy(&seen.body);
    assert!(
        !text.contains(EMAIL),
        "the provider saw the address: {text}"
    );
    assert_private_and_framed(seen);
    body
}

/// Issue 18: a provider gets neither the client's address nor Envoy's internals (no
/// `x-forwarded-*`, `forwarded`, `x-envoy-*`), and the body the chain buffered whole arrives
/// with a `content-length` equal to its size, never chunked. Envoy's `x-request-id` (a random
/// id, no personal data) is kept: the one id an operator and a provider's support can share.
fn assert_private_and_framed(seen: &RecordedRequest) {
    for (name, _) in &seen.headers {
        assert!(
            !name.starts_with("x-envoy-")
                && !name.starts_with("x-forwarded-")
                && name != "forwarded"
                && name != "x-real-ip",
            "{name} reached the provider: {:?}",
            seen.headers
        );
    }
    assert_eq!(
        seen.header("transfer-encoding"),
        None,
        "chunked: {:?}",
        seen.headers
    );
    assert_eq!(
        seen.header("content-length"),
        Some(seen.body.len().to_string().as_str()),
        "{:?}",
        seen.headers
    );
    assert!(seen.header("x-request-id").is_some(), "{:?}", seen.headers);
}

/// The usage record of `response` (by its `x-request-id`).
async fn record_of(demo: &Demo, response: &Response) -> Value {
    let id = response
        .header("x-request-id")
        .unwrap_or_else(|| panic!("no x-request-id: {:?}", response.headers));
    demo.usage_record(id).await.0
}

/// The access-log line of `response` (by its `x-request-id`) carries no usage record.
async fn assert_no_usage_record(demo: &Demo, response: &Response, what: &str) {
    let id = response.header("x-request-id").unwrap().to_string();
    let usage = demo
        .envoy
        .access_log_line("access.log", what, |line| {
            (line["request_id"] == id.as_str()).then(|| line["usage"].clone())
        })
        .await;
    assert!(
        !usage.as_str().unwrap_or("-").contains("prompt_tokens"),
        "{what}: {usage}"
    );
}

fn tokens(record: &Value) -> (u64, u64) {
    (
        record["usage"]["prompt_tokens"].as_u64().unwrap(),
        record["usage"]["completion_tokens"].as_u64().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_request_with_an_email_through_the_whole_chain() {
    let demo = Demo::start(0).await.unwrap();
    let key = bearer(DEMO_KEY);
    let headers = [
        ("authorization", key.as_str()),
        ("x-user-id", "alice"),
        ("x-mock-echo", "1"),
        ("x-mock-prompt-tokens", "40"),
    ];
    let content = format!("Please write to {EMAIL} about the launch");
    let response = post(
        &demo,
        "/v1/chat/completions",
        &headers,
        &chat(&content, true),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("content-type"), Some("text/event-stream"));

    // The client: its own address back in the stream, no placeholder, and no usage chunk (it
    // did not ask for one; usage-accounting asked the provider and hides it).
    let events = sse_events(&response.text());
    assert_eq!(
        events.last().map(|e| &e.1),
        Some(&json!("[DONE]")),
        "{events:?}"
    );
    let text: String = events
        .iter()
        .filter_map(|(_, e)| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(text.contains(EMAIL) && !text.contains("[EMAIL_"), "{text}");
    for (_, event) in &events[..events.len() - 1] {
        assert!(
            event["usage"].is_null(),
            "usage reached a client that did not ask: {event}"
        );
        assert!(
            event["choices"].as_array().is_some_and(|c| !c.is_empty()),
            "{event}"
        );
    }
    // The x-llm-* response headers, the rate headers, and nothing secret.
    for (name, value) in [
        ("x-llm-model-group", "fast"),
        ("x-llm-deployment", "openai-mini"),
        ("x-llm-attempts", "1"),
        ("x-llm-route-version", "demo-2026-11-30"),
    ] {
        assert_eq!(
            response.header(name),
            Some(value),
            "{name}: {:?}",
            response.headers
        );
    }
    assert!(
        response.header("x-ratelimit-remaining-tokens").is_some(),
        "{:?}",
        response.headers
    );
    assert!(response.header("x-ratelimit-remaining-requests").is_some());
    let all = everything(&response);
    assert!(
        !all.contains(OPENAI_CREDENTIAL) && !all.contains(DEMO_KEY),
        "{all}"
    );

    // The provider: the placeholder, the real model name, its credential, never the key; a
    // streaming request that asks for usage; the output cap token-ratelimit reserved for.
    let seen = demo.openai.requests();
    assert_eq!(seen.len(), 1);
    let body = assert_provider_view(
        &seen[0],
        "gpt-4o-mini",
        ("authorization", &bearer(OPENAI_CREDENTIAL)),
    );
    let user = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .unwrap();
    assert_eq!(
        user["content"], "Please write to [EMAIL_1] about the launch",
        "{body}"
    );
    assert_eq!(
        body["messages"][0]["role"], "system",
        "the preamble: {body}"
    );
    assert_eq!(body["stream_options"]["include_usage"], true, "{body}");
    let cap = body
        .get("max_tokens")
        .or_else(|| body.get("max_completion_tokens"));
    assert_eq!(cap, Some(&json!(1024)), "{body}");
    assert!(demo.azure.requests().is_empty() && demo.anthropic.requests().is_empty());

    // The usage record in the access log: identity, route, the provider's usage, exact cost.
    let record = record_of(&demo, &response).await;
    for (field, value) in [
        ("consumer", "demo"),
        ("tenant", "demo"),
        ("model_group", "fast"),
        ("deployment", "openai-mini"),
        ("model", "gpt-4o-mini"),
        ("api", "chat.completions"),
        ("usage_source", "upstream"),
        ("currency", "USD"),
        ("price_version", "2026-11"),
    ] {
        assert_eq!(record[field], value, "{field}: {record}");
    }
    assert_eq!(record["stream"], true);
    assert_eq!(record["complete"], true);
    let (prompt, completion) = tokens(&record);
    assert_eq!(prompt, 40, "{record}");
    assert!(completion > 0, "{record}");
    assert_eq!(
        record["cost_nano"],
        prompt * OPENAI_MINI_NANO.0 + completion * OPENAI_MINI_NANO.1,
        "{record}"
    );

    // The metrics, with the labels gateway.yaml's stats_tags spell out of the names.
    let prometheus = demo.envoy.admin_get("/stats/prometheus").unwrap();
    let tokens_line = prometheus
        .lines()
        .find(|l| l.starts_with("llm_gateway_usage_tokens{") && l.contains("token_type=\"input\""))
        .unwrap_or_else(|| panic!("no usage token counter:\n{prometheus}"));
    for label in [
        "tenant=\"demo\"",
        "model_group=\"fast\"",
        "deployment=\"openai-mini\"",
    ] {
        assert!(tokens_line.contains(label), "{label} in {tokens_line}");
    }
    assert!(tokens_line.ends_with(" 40"), "{tokens_line}");

    // The ledger: scripts/usage-report over the access log sums the same record.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_usage-report"))
        .args(["--csv"])
        .arg(demo.access_log())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // tenant,project,model_group,requests,estimated,prompt_tokens,cached_prompt_tokens,
    // completion_tokens,cache_hit_rate,cost,currency
    let row: Vec<&str> = report
        .lines()
        .find(|l| l.starts_with("demo,") && l.contains(",fast,"))
        .unwrap_or_else(|| panic!("no row for tenant demo, group fast:\n{report}"))
        .split(',')
        .collect();
    assert_eq!(row[3], "1", "{report}");
    assert_eq!(
        (
            row[5].parse::<u64>().unwrap(),
            row[7].parse::<u64>().unwrap()
        ),
        (prompt, completion),
        "{report}"
    );
    let cost_nano = prompt * OPENAI_MINI_NANO.0 + completion * OPENAI_MINI_NANO.1;
    assert_eq!(row[9], format!("{}", cost_nano as f64 / 1e9), "{report}");

    // The budget: reserved on the way in (prompt estimate + the 1024 cap), reconciled on the
    // way out to the real usage. A second request from alice that cannot fit is refused, and
    // the 402 says what is left: exactly the budget minus the first request's real tokens.
    let big = json!({"model": "fast", "max_tokens": 30000, "messages": [{"role": "user", "content": "Hi"}]});
    let refused = post(&demo, "/v1/chat/completions", &headers, &big).await;
    let error = http::assert_openai_error(&refused, 402, "budget_exceeded");
    assert_eq!(refused.header("x-llm-budget"), Some("user-day"));
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("user-day"), "{message}");
    assert_eq!(
        http::tokens_left_in(message),
        USER_DAY_TOKENS - prompt - completion,
        "{message}"
    );
    assert_eq!(
        demo.openai.requests().len(),
        1,
        "a refused request reached the provider"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_name_their_reason_and_reach_no_provider() {
    let demo = Demo::start(0).await.unwrap();
    let hello = chat("Hello!", false);
    let path = "/v1/chat/completions";

    // 401: no key, a wrong key
    http::assert_openai_error(
        &post(&demo, path, &[], &hello).await,
        401,
        "missing_api_key",
    );
    let wrong = bearer("sk-llmgw-not-a-key");
    http::assert_openai_error(
        &post(&demo, path, &[("authorization", &wrong)], &hello).await,
        401,
        "invalid_api_key",
    );

    // 403: a group the key may not use, also when the client claims it may
    let intern = bearer(FAST_ONLY_KEY);
    let smart = json!({"model": "smart", "messages": [{"role": "user", "content": "Hello!"}]});
    for spoof in [
        vec![],
        vec![("x-llm-groups", "smart"), ("x-llm-consumer", "demo")],
    ] {
        let mut headers = vec![("authorization", intern.as_str())];
        headers.extend(spoof);
        http::assert_openai_error(
            &post(&demo, path, &headers, &smart).await,
            403,
            "model_not_allowed",
        );
    }
    // 404: no such group
    let key = bearer(DEMO_KEY);
    let unknown = json!({"model": "gpt-5", "messages": [{"role": "user", "content": "Hello!"}]});
    http::assert_openai_error(
        &post(&demo, path, &[("authorization", &key)], &unknown).await,
        404,
        "model_not_found",
    );
    assert!(demo.openai.requests().is_empty() && demo.azure.requests().is_empty());

    // 404: what no provider serves, after authentication; a query string does not matter
    let files = http::get(format!("{}/v1/files", demo.url()))
        .header("authorization", &key)
        .send()
        .await
        .unwrap();
    http::assert_openai_error(&files, 404, "unknown_url");
    assert_eq!(files.header("content-type"), Some("application/json"));
    let legacy = json!({"model": "fast", "prompt": "Hello"});
    let completions = post(
        &demo,
        "/v1/completions",
        &[("authorization", &key)],
        &legacy,
    )
    .await;
    http::assert_openai_error(&completions, 404, "unknown_url");
    // the router answers only GET on /v1/models
    http::assert_openai_error(
        &post(&demo, "/v1/models", &[("authorization", &key)], &legacy).await,
        404,
        "unknown_url",
    );
    http::assert_openai_error(
        &post(&demo, "/v1/models", &[], &legacy).await,
        401,
        "missing_api_key",
    );
    let with_query = post(
        &demo,
        "/v1/chat/completions?trace=1",
        &[("authorization", &key)],
        &hello,
    )
    .await;
    assert_eq!(with_query.status, 200, "{}", with_query.text());
    assert_eq!(demo.openai.requests().len(), 1);
    demo.openai.clear_requests();

    // 429: `user-rpm` lets bob send 10 requests a minute; the 11th waits. The bucket refills
    // one request every 6 s: on a slow machine a refill may land meanwhile and let one more
    // through, never more than the time passed allows.
    let bob = [("authorization", key.as_str()), ("x-user-id", "bob")];
    let started = std::time::Instant::now();
    let mut passed = 0;
    let limited = loop {
        let response = post(&demo, path, &bob, &hello).await;
        if response.status != 200 || passed >= 3 * USER_RPM {
            break response;
        }
        passed += 1;
    };
    let refills = started.elapsed().as_secs() as usize / (60 / USER_RPM);
    assert!(
        (USER_RPM..=USER_RPM + refills).contains(&passed),
        "{passed} passed in {:?}",
        started.elapsed()
    );
    let error = http::assert_openai_error(&limited, 429, "rate_limit_exceeded");
    assert_eq!(error["error"]["type"], "rate_limit_error");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("user-rpm"),
        "{error}"
    );
    let retry_after: u64 = limited.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after), "retry-after {retry_after}");
    assert!(limited.header("retry-after-ms").is_some());
    assert_eq!(limited.header("x-ratelimit-remaining-requests"), Some("0"));
    // another user of the same key is not limited by bob's bucket
    let carl = [("authorization", key.as_str()), ("x-user-id", "carl")];
    assert_eq!(post(&demo, path, &carl, &hello).await.status, 200);

    // 402: a request larger than carol's daily budget
    let carol = [("authorization", key.as_str()), ("x-user-id", "carol")];
    let big = json!({"model": "fast", "max_tokens": 25000, "messages": [{"role": "user", "content": "Hi"}]});
    let refused = post(&demo, path, &carol, &big).await;
    http::assert_openai_error(&refused, 402, "budget_exceeded");
    assert_eq!(refused.header("x-llm-budget"), Some("user-day"));

    // the refusals in the metrics, labelled with the limit and the budget (stats_tags)
    let prometheus = demo.envoy.admin_get("/stats/prometheus").unwrap();
    for line in [
        "llm_gateway_ratelimit_rate_limited{limit=\"user-rpm\"} 1",
        "llm_gateway_ratelimit_budget_exceeded{budget=\"user-day\"} 1",
    ] {
        assert!(
            prometheus.lines().any(|l| l == line),
            "no {line}:\n{prometheus}"
        );
    }

    // only the admitted requests reached a provider
    assert_eq!(demo.openai.requests().len(), passed + 1);
    assert!(demo.azure.requests().is_empty() && demo.anthropic.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_429_falls_back_to_the_next_deployment() {
    let demo = Demo::start(0).await.unwrap();
    demo.openai.set_default_knobs(&[("x-mock-status", "429")]);
    let key = bearer(DEMO_KEY);
    let headers = [("authorization", key.as_str()), ("x-mock-echo", "1")];
    for stream in [false, true] {
        let content = format!("Forward this to {EMAIL}");
        let response = post(
            &demo,
            "/v1/chat/completions",
            &headers,
            &chat(&content, stream),
        )
        .await;
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.header("x-llm-deployment"), Some("azure-mini"));
        assert_eq!(response.header("x-llm-attempts"), Some("2"));
        let text = if stream {
            sse_events(&response.text())
                .iter()
                .filter_map(|(_, e)| {
                    e["choices"][0]["delta"]["content"]
                        .as_str()
                        .map(str::to_owned)
                })
                .collect::<String>()
        } else {
            response.json().unwrap()["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        assert!(text.contains(EMAIL), "{text}");
        let all = everything(&response);
        assert!(
            !all.contains(OPENAI_CREDENTIAL) && !all.contains(AZURE_CREDENTIAL),
            "{all}"
        );

        // each deployment got its own model name and credential, and only the placeholder
        let first = demo.openai.requests();
        let second = demo.azure.requests();
        assert_eq!((first.len(), second.len()), (1, 1));
        assert_provider_view(
            &first[0],
            "gpt-4o-mini",
            ("authorization", &bearer(OPENAI_CREDENTIAL)),
        );
        // Azure OpenAI as Azure serves it: its deployment path, `api-version`, `api-key`
        assert_provider_view(&second[0], "gpt-4o-mini", ("api-key", AZURE_CREDENTIAL));
        assert_eq!(
            second[0].path,
            "/openai/deployments/gpt-4o-mini/chat/completions?api-version=2024-10-21"
        );
        assert_eq!(second[0].header("authorization"), None);
        demo.openai.clear_requests();
        demo.azure.clear_requests();

        // one record for the logical request: both attempts (a retried attempt's response is
        // discarded below the listener's filters: its status is unknown, 0), charged at the
        // price of the deployment that answered
        let record = record_of(&demo, &response).await;
        assert_eq!(record["deployment"], "azure-mini", "{record}");
        assert_eq!(
            record["attempts"],
            json!([{"deployment": "openai-mini", "status": 0}, {"deployment": "azure-mini", "status": 200}]),
            "{record}"
        );
        let (prompt, completion) = tokens(&record);
        assert_eq!(
            record["cost_nano"],
            prompt * AZURE_MINI_NANO.0 + completion * AZURE_MINI_NANO.1
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attempt_reaches_its_provider_private_and_with_a_true_content_length() {
    let key = bearer(DEMO_KEY);
    let headers = [
        ("authorization", key.as_str()),
        // a client-supplied address must not travel either
        ("x-forwarded-for", "203.0.113.7"),
        ("x-mock-echo", "1"),
    ];
    let mut demo = None;
    for status in ["429", "503"] {
        // a fresh gateway per status: four failures each stay under openai-mini's breaker
        let demo = demo.insert(Demo::start(0).await.unwrap());
        demo.openai.set_default_knobs(&[("x-mock-status", status)]);
        for stream in [false, true] {
            for content in ["Say hello".to_string(), format!("Forward this to {EMAIL}")] {
                let case = format!("{status} stream={stream} {content:?}");
                let response = post(
                    demo,
                    "/v1/chat/completions",
                    &headers,
                    &chat(&content, stream),
                )
                .await;
                assert_eq!(response.status, 200, "{case}: {}", response.text());
                assert_eq!(response.header("x-llm-attempts"), Some("2"), "{case}");
                let first = demo.openai.requests();
                let second = demo.azure.requests();
                demo.openai.clear_requests();
                demo.azure.clear_requests();
                assert_eq!((first.len(), second.len()), (1, 1), "{case}");
                for seen in [&first[0], &second[0]] {
                    assert_private_and_framed(seen);
                    let body = seen.json().unwrap();
                    assert_eq!(body["model"], "gpt-4o-mini", "{case}");
                    // the PII edit and usage-accounting's stream_options grew the body
                    assert_eq!(body["stream"], stream, "{case}");
                    assert!(
                        !String::from_utf8_lossy(&seen.body).contains(EMAIL),
                        "{case}"
                    );
                }
                // the attempts got the same bytes (only model and credential may differ; the
                // model is the same here)
                assert_eq!(first[0].body, second[0].body, "{case}");
            }
        }
    }
    // one attempt, Anthropic's API: the same
    let demo = demo.unwrap();
    let body = json!({"model": "claude", "max_tokens": 50,
        "messages": [{"role": "user", "content": format!("Mail {EMAIL}")}]});
    let response = post(
        &demo,
        "/v1/messages",
        &[("x-api-key", DEMO_KEY), ("x-forwarded-for", "203.0.113.7")],
        &body,
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text());
    let seen = demo.anthropic.requests();
    assert_eq!(seen.len(), 1);
    assert_private_and_framed(&seen[0]);
    // the operator keeps the client's address: the peer Envoy saw, in the access log
    let id = response.header("x-request-id").unwrap();
    let (_, line) = demo.usage_record(id).await;
    assert_eq!(line["client"], "127.0.0.1", "{line}");

    // a client that sends its body chunked: the chain buffered it whole, so the provider
    // still gets a content-length
    demo.openai.set_default_knobs(&[]);
    demo.openai.clear_requests();
    let body = chat(&format!("Mail {EMAIL}"), true).to_string();
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\nauthorization: {key}\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n\
         {:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    let address = demo.url().trim_start_matches("http://").to_string();
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    socket.write_all(raw.as_bytes()).await.unwrap();
    let mut received = Vec::new();
    socket.read_to_end(&mut received).await.unwrap();
    let answer = String::from_utf8_lossy(&received);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let seen = demo.openai.requests();
    assert_eq!(seen.len(), 1);
    assert_private_and_framed(&seen[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_messages_through_the_same_chain() {
    let demo = Demo::start(0).await.unwrap();
    let body = json!({
        "model": "claude", "max_tokens": 200, "stream": true,
        "system": "You are terse.",
        "messages": [{"role": "user", "content": format!("Reach me at {EMAIL}")}]
    });
    let headers = [
        ("x-api-key", DEMO_KEY),
        ("anthropic-version", "2023-01-01"),
        ("x-mock-echo", "1"),
    ];
    let response = post(&demo, "/v1/messages", &headers, &body).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let events = sse_events(&response.text());
    assert_eq!(
        events.last().and_then(|e| e.0.as_deref()),
        Some("message_stop"),
        "{events:?}"
    );
    let text: String = events
        .iter()
        .filter(|(name, _)| name.as_deref() == Some("content_block_delta"))
        .filter_map(|(_, e)| e["delta"]["text"].as_str())
        .collect();
    assert!(text.contains(EMAIL) && !text.contains("[EMAIL_"), "{text}");
    assert_eq!(response.header("x-llm-deployment"), Some("claude"));
    assert_eq!(response.header("x-llm-model-group"), Some("claude"));
    let all = everything(&response);
    assert!(
        !all.contains(ANTHROPIC_CREDENTIAL) && !all.contains(DEMO_KEY),
        "{all}"
    );

    let seen = demo.anthropic.requests();
    assert_eq!(seen.len(), 1);
    let sent = assert_provider_view(
        &seen[0],
        "claude-sonnet-4-5",
        ("x-api-key", ANTHROPIC_CREDENTIAL),
    );
    assert_eq!(seen[0].header("authorization"), None);
    assert_eq!(
        seen[0].header("anthropic-version"),
        Some("2023-01-01"),
        "the client's version kept"
    );
    assert_eq!(
        sent["messages"][0]["content"], "Reach me at [EMAIL_1]",
        "{sent}"
    );
    assert_eq!(
        sent["max_tokens"], 200,
        "the client's own cap is kept: {sent}"
    );
    assert!(demo.openai.requests().is_empty() && demo.azure.requests().is_empty());

    let record = record_of(&demo, &response).await;
    assert_eq!(record["api"], "messages", "{record}");
    assert_eq!(record["consumer"], "demo");
    assert_eq!(record["usage_source"], "upstream", "{record}");
    let (prompt, completion) = tokens(&record);
    assert!(prompt > 0 && completion > 0, "{record}");
    assert_eq!(
        record["cost_nano"],
        prompt * CLAUDE_NANO.0 + completion * CLAUDE_NANO.1
    );
}

async fn get(demo: &Demo, path: &str, key: &str, user: &str) -> Response {
    http::get(format!("{}{path}", demo.url()))
        .header("authorization", &bearer(key))
        .header("x-user-id", user)
        .send()
        .await
        .unwrap()
}

fn model_ids(response: &Response) -> Vec<String> {
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("content-type"), Some("application/json"));
    let list = response.json().unwrap();
    assert_eq!(list["object"], "list", "{list}");
    let data = list["data"].as_array().unwrap();
    for model in data {
        assert_eq!(model["object"], "model", "{model}");
        assert_eq!(model["owned_by"], "llm-gateway", "{model}");
        assert!(
            model["created"].as_u64().unwrap() > 1_700_000_000,
            "{model}"
        );
    }
    data.iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect()
}

/// `x-ratelimit-remaining-requests` of a response (the tightest request limit).
fn remaining_requests(response: &Response) -> u64 {
    response
        .header("x-ratelimit-remaining-requests")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no remaining requests: {:?}", response.headers))
}

/// `GET /v1/models` is the gateway's own answer: the groups of the key, never a provider, no
/// rate-limit unit, no usage record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_list_is_the_keys_groups_answered_by_the_gateway() {
    let demo = Demo::start(0).await.unwrap();
    let user = "lister";
    let hello = |step: &str| json!({"model": "fast", "max_tokens": 4, "messages": [{"role": "user", "content": step}]});
    let chat = |step: &'static str| {
        let body = hello(step);
        let demo = &demo;
        async move {
            let auth = bearer(FAST_ONLY_KEY);
            post(
                demo,
                "/v1/chat/completions",
                &[("authorization", &auth), ("x-user-id", user)],
                &body,
            )
            .await
        }
    };
    let first = chat("before").await;
    assert_eq!(first.status, 200, "{}", first.text());
    let before = remaining_requests(&first);

    assert_eq!(
        model_ids(&get(&demo, "/v1/models", DEMO_KEY, user).await),
        ["fast", "smart", "claude", "code"]
    );
    let intern = get(&demo, "/v1/models?limit=10", FAST_ONLY_KEY, user).await;
    assert_eq!(model_ids(&intern), ["fast"]);
    let all = everything(&intern);
    assert!(!all.contains("smart") && !all.contains("claude"), "{all}");

    let fast = get(&demo, "/v1/models/fast", FAST_ONLY_KEY, user).await;
    assert_eq!(fast.status, 200, "{}", fast.text());
    let model = fast.json().unwrap();
    assert_eq!(
        (model["id"].as_str(), model["object"].as_str()),
        (Some("fast"), Some("model"))
    );
    // a group the key may not use and one that does not exist: the same 404
    for id in ["smart", "gpt-5"] {
        let missing = get(&demo, &format!("/v1/models/{id}"), FAST_ONLY_KEY, user).await;
        http::assert_openai_error(&missing, 404, "model_not_found");
    }
    let smart = get(&demo, "/v1/models/smart", DEMO_KEY, user).await;
    assert_eq!(smart.json().unwrap()["id"], "smart", "{}", smart.text());
    // authentication still comes first
    let anonymous = http::get(format!("{}/v1/models", demo.url()))
        .send()
        .await
        .unwrap();
    http::assert_openai_error(&anonymous, 401, "missing_api_key");

    // no provider saw any of it, and it took no request unit: the next model call of the same
    // key and user finds the limit one request lower than the first left it
    assert_eq!(demo.openai.requests().len(), 1);
    assert!(demo.azure.requests().is_empty() && demo.anthropic.requests().is_empty());
    let second = chat("after").await;
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(remaining_requests(&second), before - 1);
    assert!(fast.header("x-ratelimit-remaining-requests").is_none());
    // and no usage record: the access-log line of the list has none
    assert_no_usage_record(&demo, &fast, "the model list").await;
}

/// Claude Code's `POST /v1/messages/count_tokens`: routed to the group's Anthropic deployment
/// with its model and credential, the count answered; a request for the rate limits, but no
/// tokens, no budget, no usage record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_codes_token_count_reaches_anthropic_and_is_not_charged() {
    let demo = Demo::start(0).await.unwrap();
    let user = "counter";
    // Claude Code's shape: x-api-key, anthropic-version and -beta, a system prompt in blocks,
    // tools, no max_tokens
    let count = json!({
        "model": "claude",
        "system": [{"type": "text", "text": "You are Claude Code."}],
        "messages": [{"role": "user", "content": format!("Mail {EMAIL} the diff")}],
        "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]
    });
    let headers = [
        ("x-api-key", DEMO_KEY),
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", "token-counting-2024-11-01"),
        ("x-user-id", user),
    ];
    // the day's budget left for this user, from a refusal (which charges nothing)
    let over = json!({"model": "claude", "max_tokens": USER_DAY_TOKENS + 1,
                      "messages": [{"role": "user", "content": "hi"}]});
    let left = |response: Response| {
        let error = http::assert_openai_error(&response, 402, "budget_exceeded");
        http::tokens_left_in(error["error"]["message"].as_str().unwrap())
    };

    let counted = post(
        &demo,
        "/v1/messages/count_tokens?beta=true",
        &headers,
        &count,
    )
    .await;
    assert_eq!(counted.status, 200, "{}", counted.text());
    // the mock's formula over what it received: the system prompt (20 chars: 5 + 4) and the
    // masked message ("Mail [EMAIL_1] the diff", 23 chars: 6 + 4)
    assert_eq!(counted.json().unwrap(), json!({"input_tokens": 19}));
    assert_eq!(counted.header("x-llm-deployment"), Some("claude"));
    let all = everything(&counted);
    assert!(
        !all.contains(ANTHROPIC_CREDENTIAL) && !all.contains(DEMO_KEY),
        "{all}"
    );

    let seen = demo.anthropic.requests();
    assert_eq!(seen.len(), 1);
    // the path and query as Claude Code sent them
    assert_eq!(
        seen[0].path, "/v1/messages/count_tokens?beta=true",
        "{:?}",
        seen[0]
    );
    let sent = assert_provider_view(
        &seen[0],
        "claude-sonnet-4-5",
        ("x-api-key", ANTHROPIC_CREDENTIAL),
    );
    assert_eq!(seen[0].header("authorization"), None);
    assert_eq!(
        seen[0].header("anthropic-beta"),
        Some("token-counting-2024-11-01")
    );
    assert_eq!(
        sent["max_tokens"],
        Value::Null,
        "no output cap injected: {sent}"
    );
    assert!(
        sent["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("[EMAIL_1]"),
        "{sent}"
    );
    assert!(demo.openai.requests().is_empty() && demo.azure.requests().is_empty());

    // counted as one request of the user's 10 a minute ...
    assert_eq!(remaining_requests(&counted), (USER_RPM - 1) as u64);
    let again = post(&demo, "/v1/messages/count_tokens", &headers, &count).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(remaining_requests(&again), (USER_RPM - 2) as u64);
    // ... but no budget: the user's day still has all its tokens
    assert_eq!(
        left(post(&demo, "/v1/messages", &headers, &over).await),
        USER_DAY_TOKENS
    );
    // and no usage record, nor a settlement that missed one
    assert_no_usage_record(&demo, &counted, "the token count").await;
    assert_eq!(
        demo.envoy
            .stat("wasmcustom.llm_gateway.ratelimit.settled_without_usage")
            .unwrap()
            .unwrap_or(0),
        0
    );

    // a group without an Anthropic deployment: the gateway's own estimate, labelled as one,
    // and no provider asked ("hi": ceil(2 / 4) + the message overhead of 4, the mock's formula)
    let fast = json!({"model": "fast", "messages": [{"role": "user", "content": "hi"}]});
    let estimated = post(&demo, "/v1/messages/count_tokens", &headers, &fast).await;
    assert_eq!(estimated.status, 200, "{}", estimated.text());
    assert_eq!(estimated.json().unwrap(), json!({"input_tokens": 5}));
    assert_eq!(estimated.header("x-llm-token-count"), Some("estimated"));
    assert_eq!(demo.anthropic.requests().len(), 2);
    assert!(demo.openai.requests().is_empty());
    assert!(demo.azure.requests().is_empty());
}

/// The route's timeouts bound silence, not length: `gateway.yaml` with its per-attempt timeout
/// (60 s) and idle timeout (120 s) shortened to 1 s and 2 s. A stream longer than both, whose events
/// come every 300 ms, completes; a provider silent for longer than the idle timeout mid-stream
/// is cut, and what it streamed so far is still recorded and charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_bound_silence_not_the_length_of_a_stream() {
    let demo = Demo::start_variant(&[
        ("per_try_timeout: 60s", "per_try_timeout: 1s"),
        ("idle_timeout: 120s", "idle_timeout: 2s"),
    ])
    .await
    .unwrap();
    let key = bearer(DEMO_KEY);

    let long = [
        ("authorization", key.as_str()),
        ("x-mock-chunks", "10"),
        ("x-mock-chunk-delay-ms", "300"),
    ];
    let started = std::time::Instant::now();
    let response = post(
        &demo,
        "/v1/chat/completions",
        &long,
        &chat("Tell me a story", true),
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert!(
        started.elapsed() > std::time::Duration::from_secs(2),
        "the stream outlasted both timeouts"
    );
    let events = sse_events(&response.text());
    assert_eq!(
        events.last().map(|e| &e.1),
        Some(&json!("[DONE]")),
        "{events:?}"
    );
    let record = record_of(&demo, &response).await;
    assert_eq!(record["complete"], true, "{record}");

    // The provider sends its first event, then nothing for 4 s: Envoy's idle timeout ends
    // the attempt after the first byte went out, so there is no fallback; it resets the
    // client's stream (HTTP/1.1: the connection closes before the last chunk, so the client
    // knows the stream is incomplete; no [DONE]).
    let body = chat("Tell me a story", true).to_string();
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\nauthorization: {key}\r\n\
         x-mock-chunks: 4\r\nx-mock-chunk-delay-ms: 4000\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    let address = demo.url().trim_start_matches("http://").to_string();
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    socket.write_all(raw.as_bytes()).await.unwrap();
    let mut received = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        socket.read_to_end(&mut received),
    )
    .await;
    assert!(read.is_ok(), "the silent stream was not cut");
    let received = String::from_utf8_lossy(&received);
    assert!(received.starts_with("HTTP/1.1 200"), "{received}");
    assert!(
        received.contains("chat.completion.chunk"),
        "no first event: {received}"
    );
    assert!(
        !received.contains("[DONE]") && !received.ends_with("0\r\n\r\n"),
        "{received}"
    );
    let id = received
        .lines()
        .find_map(|l| l.strip_prefix("x-request-id: "))
        .unwrap()
        .trim()
        .to_string();
    let record: Value = demo
        .envoy
        .access_log_line("access.log", &id, |line| {
            if line["request_id"] != id.as_str() {
                return None;
            }
            serde_json::from_str(line["usage"].as_str()?).ok()
        })
        .await;
    // incomplete, and charged what was streamed (estimated: the provider sent no usage): the
    // prompt, and no output (the first event only opened the assistant's message)
    assert_eq!(record["complete"], false, "{record}");
    assert_eq!(record["usage_source"], "estimated", "{record}");
    let (prompt, completion) = tokens(&record);
    assert!(prompt > 0 && completion == 0, "{record}");
    assert_eq!(
        record["cost_nano"],
        prompt * OPENAI_MINI_NANO.0 + completion * OPENAI_MINI_NANO.1
    );
}

/// Budget fallback in the real chain: `gateway.yaml` with the tenant's monthly money budget
/// cut to 0.011 USD. A `smart` request reserves at the price ceiling of its plan (gpt-4o at
/// openai or azure: ≈ 0.0113 USD for the 1024-token cap) and does not fit; at `fast`'s ceiling
/// (≈ 0.0007 USD) it does, so token-ratelimit switches it to the group's `budget_fallback`:
/// the provider gets `fast`'s model at `fast`'s deployment, and the record is charged there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_too_small_for_smart_switches_to_fast() {
    let demo = Demo::start_variant(&[("\"money\": \"100.00\"", "\"money\": \"0.011\"")])
        .await
        .unwrap();
    let key = bearer(DEMO_KEY);
    let smart =
        json!({"model": "smart", "messages": [{"role": "user", "content": "Summarise the plan"}]});

    let response = post(
        &demo,
        "/v1/chat/completions",
        &[("authorization", &key)],
        &smart,
    )
    .await;
    if demo.envoy.version() == EnvoyVersion::V136 {
        // gateway-1.36.yaml's `smart` has no budget_fallback (not available with the redirect
        // fallback yet): the budget refuses, and no provider is asked
        http::assert_openai_error(&response, 402, "budget_exceeded");
        assert!(demo.openai.requests().is_empty() && demo.azure.requests().is_empty());
        return;
    }
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-llm-budget-fallback"), Some("fast"));
    assert_eq!(response.header("x-llm-model-group"), Some("fast"));
    assert_eq!(response.header("x-llm-deployment"), Some("openai-mini"));
    assert_eq!(response.json().unwrap()["model"], "gpt-4o-mini");
    let seen = demo.openai.requests();
    assert_eq!(seen.len(), 1);
    assert_provider_view(
        &seen[0],
        "gpt-4o-mini",
        ("authorization", &bearer(OPENAI_CREDENTIAL)),
    );
    assert!(demo.azure.requests().is_empty());

    let record = record_of(&demo, &response).await;
    assert_eq!(record["model_group"], "fast", "{record}");
    assert_eq!(record["deployment"], "openai-mini", "{record}");
    let (prompt, completion) = tokens(&record);
    assert_eq!(
        record["cost_nano"],
        prompt * OPENAI_MINI_NANO.0 + completion * OPENAI_MINI_NANO.1
    );
    let stat = demo
        .envoy
        .stat("wasmcustom.llm_gateway.ratelimit.budget_fallback")
        .unwrap();
    assert_eq!(stat, Some(1));

    // a `fast` request is not switched (nothing cheaper to switch to) and still fits
    let fast = chat("Hello!", false);
    let response = post(
        &demo,
        "/v1/chat/completions",
        &[("authorization", &key)],
        &fast,
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-llm-budget-fallback"), None);
}

/// Envoy's own error replies reach clients OpenAI-shaped too (gateway.yaml's
/// `local_reply_config`): a body over the buffer limit, and a plan whose every deployment is
/// unreachable. The plugins' replies keep their own codes (the other tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_own_errors_are_openai_shaped() {
    let Demo {
        envoy,
        openai,
        azure,
        anthropic,
    } = Demo::start(0).await.unwrap();
    let url = format!("{}/v1/chat/completions", envoy.url());
    let key = bearer(DEMO_KEY);

    // 11 MiB: over the listener's 10 MiB buffer, refused by Envoy before any plugin answers
    let content = "a".repeat(11 << 20);
    let huge = chat(&content, false);
    let response = http::post(&url)
        .header("authorization", &key)
        .json(&huge)
        .send()
        .await
        .unwrap();
    assert_eq!(response.header("content-type"), Some("application/json"));
    let body = http::assert_openai_error(&response, 413, "request_too_large");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(openai.requests().is_empty());

    // both deployments of `fast` gone: Envoy's 503 after the last attempt, as JSON
    drop(openai);
    drop(azure);
    let response = http::post(&url)
        .header("authorization", &key)
        .json(&chat("Hello!", false))
        .send()
        .await
        .unwrap();
    assert_eq!(response.header("content-type"), Some("application/json"));
    let body = http::assert_openai_error(&response, 503, "gateway_error");
    assert_eq!(body["error"]["type"], "api_error");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("connection_failure"), "{message}");
    assert!(anthropic.requests().is_empty());
}
