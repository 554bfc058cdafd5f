//! token-ratelimit end to end: the plain-Envoy build (`dist/token-ratelimit.wasm`, buckets
//! and budgets per instance in shared data) in a real Envoy 1.40 (`--concurrency 2`), chained
//! key-auth -> usage-accounting -> token-ratelimit in front of the mock upstream
//! (`envoy-config/e2e-ratelimit.yaml`). key-auth gives the identity (`x-llm-key-id`, ...), so
//! the limits and budgets below are kept per virtual key, and no client header is trusted.
//!
//! Settling happens in token-ratelimit's `on_log`, after usage-accounting's (chain order). The
//! tests wait for a request's access-log line before sending the next one: Envoy writes it
//! after every filter's `on_log` of that request ran, so the settlement is done by then.
//!
//! Bucket refill: the limits use long windows (hour, day), so what refills while a test runs
//! is a few tokens at most; assertions on `x-ratelimit-remaining-tokens` allow for that refill,
//! bounded by the time the test measured, and nothing more.

use llm_gateway_tests::envoy::{Envoy, Options};
use llm_gateway_tests::http::{self, Response};
use llm_gateway_tests::workspace::sha256_hex;
use mock_upstream::MockUpstream;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const KEY: &str = "sk-e2e-ratelimit-5b20f9";
const DAY_MS: u64 = 86_400_000;

struct Gateway {
    upstream: MockUpstream,
    envoy: Envoy,
}

fn key_auth_config() -> Value {
    json!({"keys": [
        {"key_sha256": sha256_hex(KEY.as_bytes()), "consumer": "team-rl", "tenant": "acme", "groups": ["*"]}
    ]})
}

fn one_line(v: &Value) -> String {
    v.to_string().replace('\'', "''")
}

impl Gateway {
    async fn start(ratelimit: Value) -> Gateway {
        let upstream = MockUpstream::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let vars = vec![
            ("MOCK_PORT", upstream.addr().port().to_string()),
            ("KEY_AUTH_CONFIG", one_line(&key_auth_config())),
            ("USAGE_CONFIG", one_line(&json!({}))),
            ("RATELIMIT_CONFIG", one_line(&ratelimit)),
        ];
        let options = Options {
            concurrency: 2,
            trace_wasm: false,
            ..Options::default()
        };
        let envoy = tokio::task::spawn_blocking(move || {
            Envoy::start_with("e2e-ratelimit.yaml", &vars, &options)
        })
        .await
        .unwrap()
        .unwrap();
        Gateway { upstream, envoy }
    }

    /// POSTs `body` (raw bytes) to `path` with the test key, tagged `tag` in the access log.
    async fn post_raw(
        &self,
        path: &str,
        tag: &str,
        body: &[u8],
        extra: &[(&str, &str)],
    ) -> Response {
        let mut request = http::post(format!("{}{path}", self.envoy.url()))
            .header("authorization", &format!("Bearer {KEY}"))
            .header("content-type", "application/json")
            .header("x-test-tag", tag)
            .body(body.to_vec());
        for (name, value) in extra {
            request = request.header(name, value);
        }
        request.send().await.unwrap()
    }

    async fn chat(&self, tag: &str, body: &Value, extra: &[(&str, &str)]) -> Response {
        self.post_raw(
            "/v1/chat/completions",
            tag,
            body.to_string().as_bytes(),
            extra,
        )
        .await
    }

    /// The access-log line of the request tagged `tag`: once it is there, every filter's
    /// `on_log` of that request ran (the reservation is settled).
    async fn logged(&self, tag: &str) -> Value {
        self.envoy
            .access_log_line("access.log", tag, |l| (l["tag"] == tag).then_some(l))
            .await
    }

    /// The total tokens usage-accounting recorded for `tag` (what token-ratelimit settles to),
    /// once the request is settled.
    async fn settled_total(&self, tag: &str) -> u64 {
        let line = self.logged(tag).await;
        let record: Value = serde_json::from_str(line["usage"].as_str().unwrap_or_default())
            .unwrap_or_else(|e| panic!("no usage record for {tag} ({e}): {line}"));
        record["usage"]["total_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("{record}"))
    }

    /// The body the mock upstream received last.
    fn last_upstream_body(&self) -> Value {
        self.upstream
            .requests()
            .last()
            .expect("the upstream got a request")
            .json()
            .expect("a JSON body")
    }
}

fn chat_body(stream: bool, cap: Option<(&str, Value)>) -> Value {
    let mut body = json!({
        "model": "gpt-4o-mini",
        "stream": stream,
        "messages": [{"role": "user", "content": "Say hello to the rate limiter"}]
    });
    if let Some((field, value)) = cap {
        body[field] = value;
    }
    body
}

fn header_u64(response: &Response, name: &str) -> u64 {
    response
        .header(name)
        .unwrap_or_else(|| panic!("no {name}: {response:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("{name} is not a number ({e}): {response:?}"))
}

fn remaining_tokens(response: &Response) -> u64 {
    header_u64(response, "x-ratelimit-remaining-tokens")
}

/// Whole tokens a bucket of `amount` per `window_ms` can refill in `elapsed` (rounded up, plus
/// one for the floor of `x-ratelimit-remaining-*`).
fn refill_bound(amount: u64, window_ms: u64, elapsed: Duration) -> u64 {
    let ms = u64::try_from(elapsed.as_millis()).unwrap() + 1;
    (ms * amount).div_ceil(window_ms) + 1
}

/// A limit of `amount` tokens per day per key, and nothing else.
fn daily_tokens(amount: u64, default_max_tokens: u64) -> Value {
    json!({
        "default_max_tokens": default_max_tokens,
        "limits": [{"name": "key-tpd", "by": "key", "tokens": amount, "per": "day"}]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_output_cap_is_injected_when_missing_and_the_clients_own_is_kept() {
    let gw = Gateway::start(daily_tokens(1_000_000, 300)).await;

    // no cap: the configured default reaches the provider, content-length follows the body
    let response = gw.chat("cap-1", &chat_body(false, None), &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    let recorded = gw.upstream.requests().last().cloned().unwrap();
    let sent = recorded.json().unwrap();
    assert_eq!(sent["max_completion_tokens"], 300, "{sent}");
    assert!(sent.get("max_tokens").is_none(), "{sent}");
    assert_eq!(sent["messages"], chat_body(false, None)["messages"]);
    // usage-accounting (earlier in the chain) drops content-length, so the body goes chunked;
    // had it stayed, token-ratelimit would have set it to the rewritten length
    match recorded.header("content-length") {
        Some(length) => assert_eq!(length, recorded.body.len().to_string()),
        None => assert_eq!(
            recorded.header("transfer-encoding"),
            Some("chunked"),
            "{:?}",
            recorded.headers
        ),
    }
    assert_eq!(header_u64(&response, "x-ratelimit-limit-tokens"), 1_000_000);
    let remaining = remaining_tokens(&response);
    assert!(
        remaining <= 1_000_000 - 300,
        "the reservation covers the injected cap: {remaining}"
    );

    // the client's own caps are kept as they are (and the provider honours them)
    for (i, field) in ["max_tokens", "max_completion_tokens"].iter().enumerate() {
        let response = gw
            .chat(
                &format!("cap-own-{i}"),
                &chat_body(false, Some((field, json!(5)))),
                &[],
            )
            .await;
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.json().unwrap()["usage"]["completion_tokens"], 5);
        let sent = gw.last_upstream_body();
        assert_eq!(sent[*field], 5, "{sent}");
        assert_eq!(
            sent.as_object().unwrap().len(),
            4,
            "nothing added to {sent}"
        );
    }

    // a stream without a cap gets it too, so does Anthropic's max_tokens
    let response = gw.chat("cap-stream", &chat_body(true, None), &[]).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert!(response.text().contains("[DONE]"));
    assert_eq!(gw.last_upstream_body()["max_completion_tokens"], 300);
    let anthropic =
        json!({"model": "claude-test", "messages": [{"role": "user", "content": "hi"}]});
    let response = gw
        .post_raw(
            "/v1/messages",
            "cap-anthropic",
            anthropic.to_string().as_bytes(),
            &[],
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(gw.last_upstream_body()["max_tokens"], 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_used_up_limit_answers_429_with_retry_after_and_rate_headers() {
    let gw = Gateway::start(json!({
        "limits": [
            {"name": "key-tph", "by": "key", "tokens": 1000, "per": "hour"},
            {"name": "key-rph", "by": "key", "requests": 3, "per": "hour"}
        ]
    }))
    .await;
    let started = Instant::now();
    let big = chat_body(false, Some(("max_tokens", json!(400))));
    let chunks = [("x-mock-chunks", "400")];

    let first = gw.chat("rl-1", &big, &chunks).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(header_u64(&first, "x-ratelimit-limit-tokens"), 1000);
    assert_eq!(header_u64(&first, "x-ratelimit-limit-requests"), 3);
    assert_eq!(header_u64(&first, "x-ratelimit-remaining-requests"), 2);
    let reserved = 1000 - remaining_tokens(&first);
    assert!(reserved > 400, "prompt estimate + cap: {reserved}");
    let actual_1 = gw.settled_total("rl-1").await;

    let second = gw.chat("rl-2", &big, &chunks).await;
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(header_u64(&second, "x-ratelimit-remaining-requests"), 1);
    let remaining_2 = remaining_tokens(&second);
    let actual_2 = gw.settled_total("rl-2").await;

    // now fewer tokens are left than the same request reserves
    let third = gw.chat("rl-3", &big, &chunks).await;
    assert_eq!(third.status, 429, "{}", third.text());
    let error = &third.json().unwrap()["error"];
    assert_eq!(error["type"], "rate_limit_error", "{error}");
    assert_eq!(error["code"], "rate_limit_exceeded", "{error}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("`key-tph`") && message.contains("1000 tokens per hour"),
        "{message}"
    );
    assert_eq!(header_u64(&third, "x-ratelimit-limit-tokens"), 1000);
    assert_eq!(header_u64(&third, "x-ratelimit-remaining-tokens"), 0);
    let retry_ms = header_u64(&third, "retry-after-ms");
    assert_eq!(header_u64(&third, "retry-after"), retry_ms.div_ceil(1000));
    // after the second request settled the bucket held remaining_2 + reserved - actual_2
    // (+ refill): the request waits for the missing actual_2 - remaining_2 tokens at
    // 1000 per hour = 3600 ms each
    let missing = actual_2 - remaining_2;
    let refill = refill_bound(1000, 3_600_000, started.elapsed());
    assert!(
        retry_ms <= missing * 3600 && retry_ms >= missing.saturating_sub(refill) * 3600,
        "retry-after-ms {retry_ms}, missing {missing} tokens (actual {actual_1}, {actual_2})"
    );
    assert!(gw.upstream.requests().len() == 2, "the 429 never went up");

    // a small request still fits the tokens, and uses the last request of the hour
    let small = chat_body(false, Some(("max_tokens", json!(10))));
    let fourth = gw.chat("rl-4", &small, &[]).await;
    assert_eq!(fourth.status, 200, "{}", fourth.text());
    assert_eq!(header_u64(&fourth, "x-ratelimit-remaining-requests"), 0);
    gw.logged("rl-4").await;
    let fifth = gw.chat("rl-5", &small, &[]).await;
    assert_eq!(fifth.status, 429, "{}", fifth.text());
    assert!(
        fifth.json().unwrap()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`key-rph`"),
        "{}",
        fifth.text()
    );
    assert_eq!(header_u64(&fifth, "x-ratelimit-limit-requests"), 3);
    assert_eq!(header_u64(&fifth, "x-ratelimit-remaining-requests"), 0);
    assert!(header_u64(&fifth, "retry-after") >= 1);
}

/// Two identical requests in a row: the second one's remaining tokens show that the first one
/// gave back its unused reservation (reserved - actual), and nothing else.
async fn assert_refunded(gw: &Gateway, body: &Value, tags: (&str, &str), knobs: &[(&str, &str)]) {
    let started = Instant::now();
    let first = gw.chat(tags.0, body, knobs).await;
    let status = if knobs.is_empty() { 200 } else { 500 };
    assert_eq!(first.status, status, "{}", first.text());
    let remaining_1 = remaining_tokens(&first);
    let actual = gw.settled_total(tags.0).await;
    if status != 200 {
        assert_eq!(actual, 0, "an error answer uses nothing");
    }
    let second = gw.chat(tags.1, body, &[]).await;
    assert_eq!(second.status, 200, "{}", second.text());
    let remaining_2 = remaining_tokens(&second);
    gw.logged(tags.1).await;
    let refill = refill_bound(20_000, DAY_MS, started.elapsed());
    // without a refund it would be remaining_1 - reserved (reserved > 2000 here)
    assert!(
        remaining_2 >= remaining_1 - actual && remaining_2 <= remaining_1 - actual + refill,
        "{tags:?}: remaining {remaining_1} then {remaining_2}, actual {actual}, refill <= {refill}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settling_from_real_usage_refunds_the_unused_reservation() {
    let gw = Gateway::start(daily_tokens(20_000, 2000)).await;

    // non-streaming: the cap of 2000 is reserved, 8 completion tokens are used
    assert_refunded(&gw, &chat_body(false, None), ("json-1", "json-2"), &[]).await;
    // streaming (usage-accounting asks the provider for its usage chunk)
    assert_refunded(&gw, &chat_body(true, None), ("sse-1", "sse-2"), &[]).await;
    let sent = gw.last_upstream_body();
    assert_eq!(sent["stream_options"], json!({"include_usage": true}));
    // the client's own cap: reserved and refunded the same way
    assert_refunded(
        &gw,
        &chat_body(true, Some(("max_tokens", json!(3000)))),
        ("own-1", "own-2"),
        &[],
    )
    .await;
    // the provider fails: no usage, the whole reservation comes back
    let failing = [("x-mock-status", "500")];
    assert_refunded(&gw, &chat_body(false, None), ("err-1", "err-2"), &failing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_budget_answers_402_and_a_request_that_fits_is_served() {
    let gw = Gateway::start(json!({
        "default_max_tokens": 500,
        // the limit only shows what a request reserves
        "limits": [{"name": "key-tpd", "by": "key", "tokens": 1_000_000, "per": "day"}],
        "budgets": [{"name": "key-day", "by": "key", "period": "day", "tokens": 1200,
                     "warn_at": [50, 80]}]
    }))
    .await;
    let started = Instant::now();
    let body = chat_body(false, None);
    let chunks = [("x-mock-chunks", "500")];

    let first = gw.chat("bud-1", &body, &chunks).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let reserved = 1_000_000 - remaining_tokens(&first);
    assert!(first.header("x-llm-budget-warning").is_none());
    let actual_1 = gw.settled_total("bud-1").await;
    assert!(
        actual_1 > 500 && actual_1 <= reserved,
        "{actual_1} {reserved}"
    );

    // the second reservation takes the spend past 80 %
    let second = gw.chat("bud-2", &body, &chunks).await;
    assert_eq!(second.status, 200, "{}", second.text());
    assert_eq!(second.header("x-llm-budget-warning"), Some("key-day=80"));
    let actual_2 = gw.settled_total("bud-2").await;
    let left = 1200 - actual_1 - actual_2;
    assert!(left < reserved, "{left} {reserved}");

    let third = gw.chat("bud-3", &body, &chunks).await;
    assert_eq!(third.status, 402, "{}", third.text());
    assert_eq!(third.header("x-llm-budget"), Some("key-day"));
    let error = &third.json().unwrap()["error"];
    assert_eq!(error["type"], "insufficient_quota", "{error}");
    assert_eq!(error["code"], "budget_exceeded", "{error}");
    assert_eq!(
        error["message"],
        format!(
            "budget `key-day` (key level) cannot cover this request: {reserved} tokens reserved, {left} left"
        )
    );
    assert_eq!(gw.upstream.requests().len(), 2, "the 402 never went up");
    gw.logged("bud-3").await;

    // a request whose reservation fits what is left is served
    let small = chat_body(false, Some(("max_tokens", json!(50))));
    let fourth = gw.chat("bud-4", &small, &[]).await;
    assert_eq!(fourth.status, 200, "{}", fourth.text());
    // the refused request gave its rate-limit tokens back: only bud-1 and bud-2's actual
    // usage and bud-4's reservation are taken (give or take the refill)
    let reserved_4 = reserved - 500 + 50;
    let expected = 1_000_000 - actual_1 - actual_2 - reserved_4;
    let remaining_4 = remaining_tokens(&fourth);
    let refill = refill_bound(1_000_000, DAY_MS, started.elapsed());
    assert!(
        remaining_4 >= expected && remaining_4 <= expected + refill,
        "{remaining_4} vs {expected}, refill <= {refill}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_are_400s_naming_the_field_and_the_worker_still_serves() {
    let gw = Gateway::start(daily_tokens(1_000_000, 300)).await;
    let cases: [(&str, Vec<u8>, &str, &str); 4] = [
        (
            "bad-json",
            b"{\"model\": \"gpt-4o-mini\", ".to_vec(),
            "invalid_json",
            "",
        ),
        ("bad-array", b"[1, 2]".to_vec(), "invalid_json", ""),
        (
            "bad-negative",
            chat_body(false, Some(("max_tokens", json!(-1))))
                .to_string()
                .into_bytes(),
            "invalid_value",
            "`max_tokens`",
        ),
        (
            "bad-string",
            chat_body(false, Some(("max_completion_tokens", json!("10"))))
                .to_string()
                .into_bytes(),
            "invalid_value",
            "`max_completion_tokens`",
        ),
    ];
    for (tag, body, code, field) in &cases {
        let response = gw.post_raw("/v1/chat/completions", tag, body, &[]).await;
        assert_eq!(response.status, 400, "{tag}: {}", response.text());
        let error = &response.json().unwrap()["error"];
        assert_eq!(error["type"], "invalid_request_error", "{tag}: {error}");
        assert_eq!(error["code"], *code, "{tag}: {error}");
        assert!(
            error["message"].as_str().unwrap().contains(field),
            "{tag}: {error}"
        );
    }
    assert!(
        gw.upstream.requests().is_empty(),
        "no bad body went upstream"
    );
    // the workers still serve, and the refused requests took nothing from the bucket
    let mut remaining = Vec::new();
    for i in 0..4 {
        let tag = format!("good-{i}");
        let response = gw.chat(&tag, &chat_body(false, None), &[]).await;
        assert_eq!(response.status, 200, "{}", response.text());
        remaining.push(remaining_tokens(&response));
        gw.logged(&tag).await;
    }
    let first_reserved = 1_000_000 - remaining[0];
    assert!(
        first_reserved < 400,
        "only the good request's reservation: {first_reserved}"
    );
    assert!(
        gw.envoy.logs().matches("panicked").count() == 0,
        "{}",
        gw.envoy.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_stream_has_its_reservation_settled() {
    let gw = Gateway::start(daily_tokens(20_000, 2000)).await;
    let started = Instant::now();
    let body = chat_body(true, None).to_string();
    let addr = gw.envoy.url().trim_start_matches("http://").to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
         authorization: Bearer {KEY}\r\ncontent-length: {}\r\nx-test-tag: gone-1\r\n\
         x-mock-chunks: 200\r\nx-mock-chunk-delay-ms: 20\r\n\r\n{body}",
        body.len()
    );
    let seen = llm_gateway_tests::http::hang_up_after(&addr, &request, "tok2 ").await;
    let head = seen.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let remaining_1: u64 = head
        .lines()
        .find_map(|l| l.strip_prefix("x-ratelimit-remaining-tokens: "))
        .unwrap_or_else(|| panic!("no remaining header: {head}"))
        .trim()
        .parse()
        .unwrap();
    let reserved = 20_000 - remaining_1;
    assert!(reserved > 2000, "{reserved}");

    // usage-accounting estimates what was streamed; token-ratelimit settles to it
    let line = gw.logged("gone-1").await;
    let record: Value = serde_json::from_str(line["usage"].as_str().unwrap()).unwrap();
    assert_eq!(record["complete"], false, "{record}");
    let actual = record["usage"]["total_tokens"].as_u64().unwrap();
    assert!(
        actual < reserved && record["usage"]["completion_tokens"].as_u64().unwrap() < 200,
        "{record}"
    );

    // the next identical request (same reservation) sees the refund
    let next = gw.chat("gone-2", &chat_body(true, None), &[]).await;
    assert_eq!(next.status, 200, "{}", next.text());
    let remaining_2 = remaining_tokens(&next);
    let refill = refill_bound(20_000, DAY_MS, started.elapsed());
    assert!(
        remaining_2 >= remaining_1 - actual && remaining_2 <= remaining_1 - actual + refill,
        "remaining {remaining_1} then {remaining_2}, actual {actual}, refill <= {refill}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plain_envoy_build_refuses_a_redis_config() {
    let vars = |config: Value| {
        vec![
            ("MOCK_PORT", "9".to_string()),
            ("KEY_AUTH_CONFIG", one_line(&key_auth_config())),
            ("USAGE_CONFIG", one_line(&json!({}))),
            ("RATELIMIT_CONFIG", one_line(&config)),
        ]
    };
    let good = vars(daily_tokens(1000, 100));
    tokio::task::spawn_blocking(move || Envoy::validate("e2e-ratelimit.yaml", &good))
        .await
        .unwrap()
        .unwrap();
    let mut with_redis = daily_tokens(1000, 100);
    with_redis["redis"] = json!({"service": "outbound|6379||redis.static"});
    let bad = vars(with_redis);
    let err = tokio::task::spawn_blocking(move || Envoy::validate("e2e-ratelimit.yaml", &bad))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        err.contains("token-ratelimit: invalid configuration: `redis`"),
        "{err}"
    );
}
