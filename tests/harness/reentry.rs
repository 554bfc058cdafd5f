//! Fallback through Envoy's internal redirect (issue 17 part 3), simulated in the harness:
//! pii-redaction, usage-accounting and token-ratelimit (compiled) see a first pass whose
//! `on_log` reads `response.code_details = internal_redirect` (the superseded pass), then a
//! second stream on the same VMs with `x-llm-reentry` and the same `x-llm-request-id` (what
//! key-auth sets on a verified re-entry). One logical request: one admission, one usage
//! record, one settlement with no drift, the same placeholders, restored in the response.
//!
//! Two flavours of the host: upstream Envoy (custom_response innermost: the plugins never see
//! the superseded pass's response, and the re-sent body is the first pass's edited one) and
//! Higress (custom_response outermost: the plugins see the failed 429 first, and the re-sent
//! body is the client's original).

use llm_gateway_tests::harness::{Exchange, FilterSpec, Fleet, Host, Request, Response, Upstream};
use llm_gateway_tests::redis::Redis;
use serde_json::{json, Value};

const SERVICE: &str = "outbound|6379||redis.static";
const PREAMBLE: &str = "Keep tokens like [EMAIL_1] exactly as written.";
/// What the mock provider reports: prompt and completion tokens.
const USED: (u64, u64) = (40, 6);

/// pii-redaction, usage-accounting and token-ratelimit: the plain builds in Envoy mode, or
/// (with `redis`) the Higress builds in Higress mode with their Redis.
fn fleet(limiter: &Value, redis: Option<&Redis>) -> Fleet {
    let pii = json!({"rules": [{"detector": "email"}], "preamble": PREAMBLE});
    let usage = json!({"log_records": true});
    fleet_of(&pii, &usage, limiter, redis)
}

/// [`fleet`] with these three configs.
fn fleet_of(pii: &Value, usage: &Value, limiter: &Value, redis: Option<&Redis>) -> Fleet {
    let builder = match redis {
        None => Fleet::builder()
            .filter(FilterSpec::plugin("pii-redaction", pii).unwrap())
            .filter(FilterSpec::plugin("usage-accounting", usage).unwrap())
            .filter(
                FilterSpec::plugin("token-ratelimit", limiter)
                    .unwrap()
                    .allow_on_headers_stop_iteration(true),
            ),
        Some(redis) => Fleet::builder()
            .host(Host::Higress)
            .filter(FilterSpec::higress("pii-redaction", pii).unwrap())
            .filter(FilterSpec::higress("usage-accounting", usage).unwrap())
            .filter(FilterSpec::higress("token-ratelimit", limiter).unwrap())
            .redis(SERVICE, redis.addr()),
    };
    let fleet = builder.build().unwrap();
    fleet
        .clock()
        .set_nanos(llm_gateway_tests::harness::redis_suite_start_nanos());
    fleet
}

fn client_body() -> Value {
    json!({
        "model": "claude-test",
        "stream": true,
        "messages": [{"role": "user", "content": "Write to bob@example.com please"}]
    })
}

/// A pass of the logical request `id`: the identity headers key-auth sets, `x-llm-reentry`
/// on a re-entering pass, and `body`.
fn pass(id: &str, reentry: bool, body: &[u8]) -> Request {
    let mut request = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .header("x-llm-request-id", id)
        .header("x-llm-consumer", "alice")
        .header("x-llm-tenant", "acme")
        .header("x-llm-key-id", "alice");
    if reentry {
        request = request.header("x-llm-reentry", "1");
    }
    request.body(body)
}

/// The answering provider: echoes the placeholder it was sent, then the usage chunk the
/// gateway asked for.
fn stream_answer(up: &Upstream) -> Response {
    let sent: Value = serde_json::from_slice(&up.body).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
    let (prompt, completion) = USED;
    let sse = format!(
        "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
        json!({"model": "claude-test", "choices": [{"index": 0, "delta": {"content": "Sent to [EMAIL_1]."}}]}),
        json!({"model": "claude-test", "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}),
    );
    Response::status(200)
        .header("content-type", "text/event-stream")
        .body(sse.as_bytes())
}

/// A superseded pass as upstream Envoy runs it: the request goes through the chain, the
/// provider fails, and the plugins see only `on_log` (with `internal_redirect`). Returns the
/// body that reached the provider.
fn superseded_on_upstream_envoy(fleet: &Fleet, id: &str) -> Vec<u8> {
    let request = pass(id, false, &serde_json::to_vec(&client_body()).unwrap());
    let stream = fleet.stream(0, 0).unwrap();
    stream.set_property("response.code_details", "internal_redirect");
    stream
        .send_request_headers_raw(request.headers.clone(), false)
        .unwrap();
    fleet.pump().unwrap();
    for (i, chunk) in request.chunks.iter().enumerate() {
        stream
            .send_request_body(chunk, i + 1 == request.chunks.len())
            .unwrap();
        fleet.pump().unwrap();
    }
    let up = stream.upstream();
    assert!(
        up.end,
        "the first pass reached the provider\n{}",
        fleet.log_text()
    );
    stream.finish().unwrap();
    fleet.pump().unwrap();
    up.body
}

/// A superseded pass as Higress runs it: the plugins see the provider's 429 before `on_log`.
fn superseded_on_higress(fleet: &Fleet, id: &str) -> Vec<u8> {
    let request = pass(id, false, &serde_json::to_vec(&client_body()).unwrap())
        .property("response.code_details", "internal_redirect");
    let ex = fleet
        .exchange(0, 0, &request, |_| {
            Response::status(429)
                .header("content-type", "application/json")
                .body(br#"{"error":{"message":"slow down","type":"rate_limit_error"}}"#)
        })
        .unwrap();
    assert_eq!(ex.status(), 429);
    fleet.pump().unwrap();
    ex.upstream.unwrap().body
}

fn records(fleet: &Fleet) -> Vec<Value> {
    fleet
        .log_text()
        .lines()
        .filter_map(|l| l.split_once("usage_record: "))
        .map(|(_, json)| serde_json::from_str(json).unwrap())
        .collect()
}

/// What the client got, and that the response was restored and the usage chunk hidden.
fn assert_client_saw_its_own_text(ex: &Exchange) {
    assert_eq!(ex.status(), 200);
    let text = ex.text();
    assert!(text.contains("Sent to bob@example.com."), "{text}");
    assert!(!text.contains("[EMAIL_"), "{text}");
    assert!(
        !text.contains("usage"),
        "the client did not ask for usage: {text}"
    );
}

fn assert_first_pass_edits(first: &[u8]) {
    let sent: Value = serde_json::from_slice(first).unwrap();
    assert_eq!(sent["messages"][0]["content"], PREAMBLE);
    assert_eq!(sent["messages"][1]["content"], "Write to [EMAIL_1] please");
    assert_eq!(sent["max_completion_tokens"], 100);
    assert_eq!(sent["stream_options"]["include_usage"], true);
}

fn budget_spent(fleet: &Fleet) -> u64 {
    let data = &fleet.services(0).shared_data;
    let key = data
        .keys("token-ratelimit")
        .into_iter()
        .find(|k| k.starts_with("trl:bud:"))
        .expect("a budget level");
    let (value, _) = data.get("token-ratelimit", &key).unwrap();
    u64::from_le_bytes(value[..8].try_into().unwrap())
}

fn plain_limits() -> Value {
    json!({
        "default_max_tokens": 100,
        "limits": [{"name": "key-rpm", "by": "key", "requests": 10, "per": "minute"},
                   {"name": "key-tpm", "by": "key", "tokens": 10000, "per": "minute"}],
        "budgets": [{"name": "tenant-day", "by": "tenant", "period": "day", "tokens": 100000}]
    })
}

fn remaining(ex: &Exchange, header: &str) -> u64 {
    ex.header(header).unwrap().parse().unwrap()
}

#[test]
fn upstream_envoy_one_admission_one_record_one_settlement_same_placeholders() {
    let fleet = fleet(&plain_limits(), None);
    let first = superseded_on_upstream_envoy(&fleet, "L1");
    assert_first_pass_edits(&first);
    assert!(
        records(&fleet).is_empty(),
        "a superseded pass publishes nothing"
    );

    // upstream Envoy re-sends the edited body; nothing is masked, added or injected again
    let ex = fleet
        .exchange(0, 0, &pass("L1", true, &first), stream_answer)
        .unwrap();
    assert_eq!(ex.upstream.as_ref().unwrap().body, first);
    assert_client_saw_its_own_text(&ex);
    // the rate headers of the one admission: one request, prompt estimate + cap
    assert_eq!(remaining(&ex, "x-ratelimit-remaining-requests"), 9);

    let recs = records(&fleet);
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(recs[0]["request_id"], "L1");
    assert_eq!(recs[0]["usage"]["total_tokens"], USED.0 + USED.1);
    let metric = |name: &str| fleet.metric_sum(&format!("llm_gateway.ratelimit.{name}"));
    assert_eq!(metric("admitted"), 1);
    assert_eq!(metric("reentry_carried"), 1);
    assert_eq!(metric("reentry_adopted"), 1);
    assert_eq!(metric("reentry_lost"), 0);
    // settled once, from the record: the budget holds exactly what was used
    assert_eq!(budget_spent(&fleet), USED.0 + USED.1);

    // and the buckets were settled once: the next request sees one request and the used
    // tokens taken, not two admissions
    let next = fleet
        .exchange(
            0,
            0,
            &pass("L2", false, &serde_json::to_vec(&client_body()).unwrap()),
            stream_answer,
        )
        .unwrap();
    assert_eq!(remaining(&next, "x-ratelimit-remaining-requests"), 8);
    assert!(
        !fleet.log_text().contains("bob@example.com"),
        "no PII logged"
    );
}

/// `"reentry": false` (gateway.yaml, whose fallback is the router's retries): no plugin asks
/// whether its pass was superseded, so a pass that was (a host that does redirect after all)
/// is final in each: usage-accounting records it, token-ratelimit settles it and stashes
/// nothing, pii-redaction stashes no map. The test above, with the default, records nothing
/// and carries the admission over.
#[test]
fn without_reentry_a_superseded_pass_is_final_in_every_plugin() {
    let off = |mut config: Value| {
        config["reentry"] = json!(false);
        config
    };
    let pii = off(json!({"rules": [{"detector": "email"}], "preamble": PREAMBLE}));
    let usage = off(json!({"log_records": true}));
    let fleet = fleet_of(&pii, &usage, &off(plain_limits()), None);
    let first = superseded_on_upstream_envoy(&fleet, "L1");
    assert_first_pass_edits(&first);
    let recs = records(&fleet);
    assert_eq!(recs.len(), 1, "recorded as final: {recs:?}");
    assert_eq!(recs[0]["request_id"], "L1");
    let metric = |name: &str| fleet.metric_sum(&format!("llm_gateway.ratelimit.{name}"));
    assert_eq!(metric("admitted"), 1);
    assert_eq!(metric("reentry_carried"), 0, "nothing stashed");
    // a second pass of L1 finds nothing carried over: a fresh admission
    let ex = fleet
        .exchange(0, 0, &pass("L1", true, &first), stream_answer)
        .unwrap();
    assert_eq!(ex.status(), 200, "{}", ex.text());
    assert_eq!(metric("reentry_adopted"), 0);
    assert_eq!(metric("admitted"), 2);
}

#[test]
fn higress_sees_the_failure_and_resends_the_original_body() {
    let fleet = fleet(&plain_limits(), None);
    let first = superseded_on_higress(&fleet, "H1");
    assert_first_pass_edits(&first);
    assert!(
        records(&fleet).is_empty(),
        "the 429 of a superseded pass is not recorded"
    );

    let original = serde_json::to_vec(&client_body()).unwrap();
    let ex = fleet
        .exchange(0, 0, &pass("H1", true, &original), stream_answer)
        .unwrap();
    // the original is masked with the same placeholders, one preamble, the same cap
    assert_eq!(ex.upstream.as_ref().unwrap().body, first);
    assert_client_saw_its_own_text(&ex);
    assert_eq!(records(&fleet).len(), 1);
    assert_eq!(fleet.metric_sum("llm_gateway.ratelimit.admitted"), 1);
    assert_eq!(budget_spent(&fleet), USED.0 + USED.1);
}

#[test]
fn a_reentry_without_a_stash_is_a_fresh_request_with_one_warning() {
    let fleet = fleet(&plain_limits(), None);
    let original = serde_json::to_vec(&client_body()).unwrap();
    let ex = fleet
        .exchange(0, 0, &pass("unknown", true, &original), stream_answer)
        .unwrap();
    assert_client_saw_its_own_text(&ex);
    assert_eq!(fleet.metric_sum("llm_gateway.ratelimit.admitted"), 1);
    assert_eq!(fleet.metric_sum("llm_gateway.ratelimit.reentry_lost"), 1);
    assert_eq!(budget_spent(&fleet), USED.0 + USED.1);
    let logs = fleet.log_text();
    let warnings: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("[warn") && l.contains("re-entered"))
        .collect();
    assert_eq!(warnings.len(), 3, "one per plugin:\n{logs}");
    assert!(!logs.contains("bob@example.com"));
}

/// The Higress build: one `RESERVE` and one `RECONCILE` in a real Redis for the logical
/// request, the budget charged exactly what was used, no reservation left behind.
#[test]
fn redis_budgets_reserve_and_reconcile_once_across_the_redirect() {
    let redis = Redis::start().unwrap();
    let config = json!({
        "redis": {"service": SERVICE, "timeout_ms": 200},
        "clock": "gateway",
        "default_max_tokens": 100,
        "budgets": [{"name": "tenant-day", "by": "tenant", "period": "day", "tokens": 1000000}]
    });
    let fleet = fleet(&config, Some(&redis));
    let calls = fleet.redis().calls();
    let first = superseded_on_upstream_envoy(&fleet, "R1");
    assert_first_pass_edits(&first);
    let ex = fleet
        .exchange(0, 0, &pass("R1", true, &first), stream_answer)
        .unwrap();
    fleet.pump().unwrap();
    assert_client_saw_its_own_text(&ex);
    assert_eq!(
        fleet.redis().calls() - calls,
        2,
        "one RESERVE, one RECONCILE\n{}",
        fleet.log_text()
    );
    let reply = redis
        .command(&[
            "GET",
            &format!("llm:{{t:acme}}:bud:tenant-day:tenant:acme:{}", start_day()),
        ])
        .unwrap();
    let spent: u64 = reply.lines().nth(1).unwrap().parse().unwrap();
    assert_eq!(spent, USED.0 + USED.1);
    assert_eq!(redis.command(&["KEYS", "llm:*:res:*"]).unwrap(), "*0\r\n");
    assert_eq!(records(&fleet).len(), 1);
}

/// A budget fallback taken in the superseded pass is kept: the re-entering pass writes the
/// switch again (the reservation was priced for the cheaper group) and the budget is charged
/// once, at the cheap price. The router's state is given as properties of the first pass (the
/// router of this branch draws a new `x-llm-request-id` on every pass; keeping it on a verified
/// re-entry is its part of the contract); the re-entering pass gets no route from it.
#[test]
fn a_budget_fallback_of_the_superseded_pass_is_kept() {
    let route = |group: &str, deployment: &str, model: &str, input: u64, output: u64| {
        json!({"request_id": "BF1", "model_group": group, "deployment": deployment,
               "model": model, "provider": "openai", "route_version": "bf", "attempts": 1,
               "price": {"input": input, "output": output},
               "price_ceiling": {"input": input, "output": output}})
    };
    let smart = route("smart", "big", "big-model", 5_000_000, 15_000_000);
    let alternative = json!({
        "route": route("cheap", "mini", "mini-model", 150_000, 600_000),
        "deployments": ["mini"],
        "clusters": ["c-mini"]
    });
    // smart reserves ≈ $0.0206, cheap ≈ $0.0008; the budget is one cent
    let config = json!({
        "budgets": [{"name": "tenant-day", "by": "tenant", "period": "day", "money": "0.01"}]
    });
    let fleet = Fleet::builder()
        .filter(FilterSpec::plugin("usage-accounting", &json!({"log_records": true})).unwrap())
        .filter(
            FilterSpec::plugin("token-ratelimit", &config)
                .unwrap()
                .allow_on_headers_stop_iteration(true),
        )
        .build()
        .unwrap();
    let request = |reentry: bool| {
        let r = Request::post("/v1/chat/completions")
            .header("x-llm-request-id", "BF1")
            .header("x-llm-tenant", "acme")
            .header("x-llm-model-group", "smart")
            .header(if reentry { "x-llm-reentry" } else { "x-first" }, "1");
        let r = if reentry {
            r
        } else {
            r.property("response.code_details", "internal_redirect")
                .property("llm_route", smart.to_string())
                .property("llm_route_budget_fallback", alternative.to_string())
        };
        r.json(&json!({"model": "big-model", "max_tokens": 1000,
                       "messages": [{"role": "user", "content": "a".repeat(4000)}]}))
    };
    let model_sent = |up: &Upstream| {
        let body: Value = serde_json::from_slice(&up.body).unwrap();
        body["model"].as_str().unwrap().to_string()
    };
    let ex = fleet
        .exchange(0, 0, &request(false), |up| {
            assert_eq!(model_sent(up), "mini-model");
            Response::status(503)
        })
        .unwrap();
    assert_eq!(ex.status(), 503, "{}", fleet.log_text());
    let ex = fleet
        .exchange(0, 0, &request(true), |up| {
            assert_eq!(model_sent(up), "mini-model", "switched again");
            let headers = up.headers.as_ref().unwrap();
            assert_eq!(
                llm_gateway_tests::harness::stream::header_value(headers, "x-llm-model-group"),
                Some("cheap")
            );
            Response::json(&json!({
                "object": "chat.completion", "model": "mini-model",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1004, "completion_tokens": 200, "total_tokens": 1204}
            }))
        })
        .unwrap();
    assert_eq!(ex.status(), 200, "{}", fleet.log_text());
    assert_eq!(
        ex.filter_state
            .get("wasm.llm_budget_fallback")
            .map(Vec::as_slice),
        Some(&b"cheap"[..])
    );
    let metric = |name: &str| fleet.metric_sum(&format!("llm_gateway.ratelimit.{name}"));
    assert_eq!(metric("budget_fallback"), 1);
    assert_eq!(metric("reentry_switch_rewritten"), 1);
    assert_eq!(metric("admitted"), 1);
    // charged once, at the cheap price: 1004 × 0.15 + 200 × 0.60 (µ$/token ×1000 = nano)
    assert_eq!(budget_spent(&fleet), 1004 * 150 + 200 * 600);
    assert_eq!(records(&fleet).len(), 1);
}

/// The UTC day (`YYYY-MM-DD`, as budget keys spell it) of the harness clock's start.
fn start_day() -> String {
    let ms = llm_gateway_tests::harness::redis_suite_start_nanos() / 1_000_000;
    token_ratelimit::budget::period(token_ratelimit::config::Period::Day, ms).0
}
