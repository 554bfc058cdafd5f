//! token-ratelimit in the wasmtime harness, chained after usage-accounting (whose record it
//! settles from): the plain build (buckets and budgets per instance in shared data) and the
//! Higress build (leases and budgets in a real `redis-server`; `dist/higress/`, in the
//! harness's Higress mode, where the ABI 0_2_100 build holds the request headers without
//! `allow_on_headers_stop_iteration`).

use llm_gateway_tests::harness::{FilterSpec, Fleet, FleetBuilder, Host, Request, Response};
use llm_gateway_tests::redis::Redis;
use serde_json::{json, Value};

const SERVICE: &str = "outbound|6379||redis.static";

fn usage() -> FilterSpec {
    FilterSpec::plugin("usage-accounting", &json!({})).unwrap()
}

fn limiter(config: &Value) -> FilterSpec {
    FilterSpec::plugin("token-ratelimit", config)
        .unwrap()
        .allow_on_headers_stop_iteration(true)
}

/// usage-accounting → token-ratelimit, their Higress builds, in Higress mode.
fn higress_chain(config: &Value) -> FleetBuilder {
    Fleet::builder()
        .host(Host::Higress)
        .filter(FilterSpec::higress("usage-accounting", &json!({})).unwrap())
        .filter(FilterSpec::higress("token-ratelimit", config).unwrap())
}

fn plain_fleet(config: &Value, workers: usize) -> Fleet {
    Fleet::builder()
        .filter(usage())
        .filter(limiter(config))
        .workers(workers)
        .build()
        .unwrap()
}

fn redis_fleet(config: &Value, redis: &Redis, instances: usize, workers: usize) -> Fleet {
    let fleet = higress_chain(config)
        .redis(SERVICE, redis.addr())
        .instances(instances)
        .workers(workers)
        .build()
        .unwrap();
    fleet
        .clock()
        .set_nanos(llm_gateway_tests::harness::redis_suite_start_nanos());
    fleet
}

/// A chat request of `chars` characters of prompt (chars/4 tokens + 4: the model is not an
/// OpenAI family, so the gateway and the mock count alike) and `max_tokens`.
fn chat(id: &str, consumer: &str, chars: usize, max_tokens: Option<u64>) -> Request {
    let mut body = json!({
        "model": "claude-test",
        "messages": [{"role": "user", "content": "a".repeat(chars)}]
    });
    if let Some(max) = max_tokens {
        body["max_tokens"] = json!(max);
    }
    Request::post("/v1/chat/completions")
        .header("x-llm-request-id", id)
        .header("x-llm-consumer", consumer)
        .header("x-llm-tenant", "acme")
        .header("x-llm-key-id", consumer)
        .json(&body)
}

fn answer(prompt: u64, completion: u64) -> Response {
    Response::json(&json!({
        "object": "chat.completion",
        "model": "claude-test",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    }))
}

fn body_of(ex: &llm_gateway_tests::harness::Exchange) -> Value {
    serde_json::from_slice(&ex.upstream.as_ref().unwrap().body).unwrap()
}

#[test]
fn injects_the_output_cap_and_refuses_past_the_token_limit_with_retry_after() {
    let config = json!({
        "default_max_tokens": 100,
        "limits": [{"name": "key-tpm", "by": "key", "tokens": 1000, "per": "minute"}]
    });
    let fleet = plain_fleet(&config, 1);
    // 400 chars = 100 tokens + 4, +10 % margin + 8 slack = 123; + cap 100 = 223 reserved
    let ex = fleet
        .exchange(0, 0, &chat("r1", "alice", 400, None), |_| answer(104, 100))
        .unwrap();
    assert_eq!(ex.status(), 200, "{}", fleet.log_text());
    assert_eq!(body_of(&ex)["max_completion_tokens"], 100);
    assert_eq!(ex.header("x-ratelimit-limit-tokens"), Some("1000"));
    // reserved 223, used 204: 19 back
    let remaining: u64 = ex
        .header("x-ratelimit-remaining-tokens")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(remaining, 1000 - 223);
    let mut admitted = 1;
    loop {
        let ex = fleet
            .exchange(
                0,
                0,
                &chat(&format!("r{admitted}x"), "alice", 400, None),
                |_| answer(104, 100),
            )
            .unwrap();
        if ex.status() == 429 {
            let reply = ex.local_reply.as_ref().unwrap();
            let error: Value = serde_json::from_slice(&reply.body).unwrap();
            assert_eq!(error["error"]["code"], "rate_limit_exceeded");
            assert!(error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("key-tpm"));
            let retry: u64 = ex.header("retry-after").unwrap().parse().unwrap();
            assert!((1..=60).contains(&retry), "{retry}");
            break;
        }
        assert_eq!(ex.status(), 200);
        admitted += 1;
        assert!(admitted < 10, "never limited");
    }
    // 1000 tokens a minute, each request really used 204 (the settle gave the rest back):
    // the fourth request still fits (3 x 204 + 223 = 835), the fifth does not.
    assert_eq!(admitted, 4, "{}", fleet.log_text());
    // another key has its own bucket
    let ex = fleet
        .exchange(0, 0, &chat("b1", "bob", 400, None), |_| answer(104, 100))
        .unwrap();
    assert_eq!(ex.status(), 200);
    // a minute later alice is served again
    fleet.clock().advance(std::time::Duration::from_secs(60));
    let ex = fleet
        .exchange(0, 0, &chat("r-late", "alice", 400, None), |_| {
            answer(104, 100)
        })
        .unwrap();
    assert_eq!(ex.status(), 200);
}

#[test]
fn a_hard_budget_reserves_settles_exactly_and_refuses_with_402() {
    let config = json!({
        "budgets": [{"name": "tenant-day", "by": "tenant", "period": "day", "tokens": 1000}]
    });
    let fleet = plain_fleet(&config, 2);
    // reserve 123 + 300 = 423; use 104 + 50
    let mut served = 0u64;
    for i in 0..20 {
        let ex = fleet
            .exchange(
                0,
                i % 2,
                &chat(&format!("b{i}"), "alice", 400, Some(300)),
                |_| answer(104, 50),
            )
            .unwrap();
        match ex.status() {
            200 => served += 1,
            402 => {
                let error: Value =
                    serde_json::from_slice(&ex.local_reply.as_ref().unwrap().body).unwrap();
                assert_eq!(error["error"]["type"], "insufficient_quota");
                assert!(error["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("tenant-day"));
                break;
            }
            other => panic!("status {other}\n{}", fleet.log_text()),
        }
    }
    // spent 154 per request: after n requests, another fits while 154 n + 423 <= 1000
    assert_eq!(served, 4);
    let spent = fleet
        .services(0)
        .shared_data
        .keys("token-ratelimit")
        .into_iter()
        .find(|k| k.starts_with("trl:bud:"))
        .and_then(|k| fleet.services(0).shared_data.get("token-ratelimit", &k))
        .map(|(v, _)| u64::from_le_bytes(v[..8].try_into().unwrap()))
        .unwrap();
    assert_eq!(spent, 4 * 154);
}

#[test]
fn leases_from_redis_in_batches_and_settles_budgets_there_exactly_once() {
    let redis = Redis::start().unwrap();
    let config = json!({
        "redis": {"service": SERVICE, "timeout_ms": 200},
        "clock": "gateway",
        "limits": [{"name": "tenant-tpm", "by": "tenant", "tokens": 100000, "per": "minute"}],
        "budgets": [{"name": "tenant-day", "by": "tenant", "period": "day", "tokens": 1000000}],
        "lease": {"batch_percent": 10}
    });
    let fleet = redis_fleet(&config, &redis, 1, 2);
    let calls_before = fleet.redis().calls();
    for i in 0..30 {
        let ex = fleet
            .exchange(
                0,
                i % 2,
                &chat(&format!("l{i}"), "alice", 400, Some(100)),
                |_| answer(104, 20),
            )
            .unwrap();
        assert_eq!(ex.status(), 200, "{}", fleet.log_text());
        fleet.tick().unwrap();
        fleet.pump().unwrap();
    }
    let calls = fleet.redis().calls() - calls_before;
    // 30 reserves + 30 reconciles, and a handful of leases (batch 10 000 tokens, 223 each)
    let leases = calls - 60;
    assert!(leases <= 3, "{leases} lease calls\n{}", fleet.log_text());
    let spent: i64 = redis
        .command(&["GET", &budget_key()])
        .unwrap()
        .trim_start_matches('$')
        .lines()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(spent, 30 * 124);
    let reservations = redis.command(&["KEYS", "llm:*:res:*"]).unwrap();
    assert_eq!(reservations, "*0\r\n", "no reservation left behind");
}

fn budget_key() -> String {
    format!("llm:{{t:acme}}:bud:tenant-day:tenant:acme:{}", start_day())
}

/// The UTC day (`YYYY-MM-DD`, as budget keys spell it) of the harness clock's start.
fn start_day() -> String {
    let ms = llm_gateway_tests::harness::redis_suite_start_nanos() / 1_000_000;
    token_ratelimit::budget::period(token_ratelimit::config::Period::Day, ms).0
}

// ---------------------------------------------------------------------------------------
// Redis failures

use llm_gateway_tests::harness::{Fault, FaultProxy};
use std::time::Duration;

fn redis_int(redis: &Redis, key: &str) -> i64 {
    let reply = redis.command(&["GET", key]).unwrap();
    if reply.starts_with("$-1") {
        return 0;
    }
    reply.lines().nth(1).unwrap().parse().unwrap()
}

fn proxied_fleet(config: &Value, proxy: &FaultProxy) -> Fleet {
    let fleet = higress_chain(config)
        .redis(SERVICE, proxy.addr())
        .workers(2)
        .build()
        .unwrap();
    fleet
        .clock()
        .set_nanos(llm_gateway_tests::harness::redis_suite_start_nanos());
    fleet
}

fn redis_config(extra: Value) -> Value {
    let mut config = json!({
        "redis": {"service": SERVICE, "timeout_ms": 200},
        "clock": "gateway",
        "lease": {"batch_percent": 10, "emergency_percent": 10, "retry_ms": 1000}
    });
    for (k, v) in extra.as_object().unwrap() {
        config[k] = v.clone();
    }
    config
}

#[test]
fn redis_down_serves_the_lease_then_the_emergency_share_then_recovers() {
    let redis = Redis::start().unwrap();
    let proxy = FaultProxy::start(redis.addr()).unwrap();
    let config = redis_config(json!({
        "limits": [{"name": "tenant-tpm", "by": "tenant", "tokens": 10000, "per": "minute"}]
    }));
    let fleet = proxied_fleet(&config, &proxy);
    let send = |i: usize| {
        fleet
            .exchange(
                0,
                i % 2,
                &chat(&format!("e{i}"), "alice", 400, Some(100)),
                |_| answer(104, 100),
            )
            .unwrap()
    };
    assert_eq!(send(0).status(), 200, "{}", fleet.log_text());
    let remaining: u64 = send(1)
        .header("x-ratelimit-remaining-tokens")
        .unwrap()
        .parse()
        .unwrap();
    proxy.set(Fault::Refuse);
    // each request reserves 223 tokens and really uses 204
    let mut admitted = 0u64;
    for i in 2..200 {
        let ex = send(i);
        if ex.status() == 429 {
            break;
        }
        assert_eq!(ex.status(), 200, "{}", fleet.log_text());
        admitted += 1;
    }
    // what was leased, then 10 % of the limit, and no more (the clock stands still)
    let bound = (remaining + 1000) / 204 + 1;
    assert!(admitted >= 1000 / 223, "{admitted}");
    assert!(admitted <= bound, "{admitted} > {bound}");
    assert!(fleet.metric_sum("llm_gateway.ratelimit.emergency_admits.tenant-tpm") > 0);
    assert_eq!(fleet.metric_sum("llm_gateway.ratelimit.redis_down"), 1);
    assert!(
        fleet.log_text().contains("unreachable"),
        "{}",
        fleet.log_text()
    );
    // Redis is back: after retry_ms the buckets lease again
    proxy.set(Fault::Pass);
    fleet.clock().advance(Duration::from_millis(1500));
    let ex = send(500);
    assert_eq!(ex.status(), 200, "{}", fleet.log_text());
    assert_eq!(fleet.metric_sum("llm_gateway.ratelimit.redis_recovered"), 1);
}

#[test]
fn budgets_without_redis_reject_or_journal_and_replay_exactly_once() {
    let redis = Redis::start().unwrap();
    let proxy = FaultProxy::start(redis.addr()).unwrap();
    let config = redis_config(json!({
        "budgets": [
            {"name": "tenant-day", "by": "tenant", "period": "day", "tokens": 1000000, "on_redis_failure": "allow"},
            {"name": "key-day", "by": "key", "period": "day", "tokens": 1000000, "on_redis_failure": "reject"}
        ]
    }));
    let fleet = proxied_fleet(&config, &proxy);
    let tenant_key = &budget_key();
    let send = |id: &str, key: &str| {
        let request = chat(id, "alice", 400, Some(100)).header("x-llm-key-id", key);
        fleet.exchange(0, 0, &request, |_| answer(104, 20)).unwrap()
    };
    assert_eq!(send("ok-1", "k1").status(), 200);
    fleet.pump().unwrap(); // the reconcile sent from on_log
    assert_eq!(redis_int(&redis, tenant_key), 124);

    // down: a request under a `reject` budget gets 503; one only under `allow` budgets is
    // served and journaled
    proxy.set(Fault::Refuse);
    let ex = send("down-1", "k1");
    assert_eq!(ex.status(), 503, "{}", fleet.log_text());
    let error: Value = serde_json::from_slice(&ex.local_reply.as_ref().unwrap().body).unwrap();
    assert_eq!(error["error"]["code"], "budget_unavailable");
    let no_key = Request::post("/v1/chat/completions")
        .header("x-llm-request-id", "down-2")
        .header("x-llm-tenant", "acme")
        .json(&json!({"model": "claude-test", "max_tokens": 100,
                      "messages": [{"role": "user", "content": "a".repeat(400)}]}));
    for id in ["down-2", "down-3"] {
        let mut request = no_key.clone();
        request.headers.retain(|(n, _)| n != "x-llm-request-id");
        let request = request.header("x-llm-request-id", id);
        let ex = fleet.exchange(0, 1, &request, |_| answer(104, 20)).unwrap();
        assert_eq!(ex.status(), 200, "{}", fleet.log_text());
    }
    assert_eq!(
        fleet.metric_sum("llm_gateway.ratelimit.budget_fail_open"),
        2
    );
    fleet.tick().unwrap();
    fleet.pump().unwrap();
    assert_eq!(redis_int(&redis, tenant_key), 124, "nothing reached Redis");

    // back: the sync worker replays the journal; replaying twice charges once
    proxy.set(Fault::Pass);
    fleet.clock().advance(Duration::from_millis(1500));
    for _ in 0..3 {
        fleet.tick().unwrap();
        fleet.pump().unwrap();
    }
    assert_eq!(redis_int(&redis, tenant_key), 3 * 124);
    // the two charges, and the CANCEL of the RESERVE that went unanswered when Redis went
    // away (it may have run: a tombstone now stands in its place)
    assert_eq!(
        fleet.metric_sum("llm_gateway.ratelimit.journal_replayed"),
        3
    );
    assert_eq!(
        fleet.metric_sum("llm_gateway.ratelimit.reserve_unanswered"),
        1
    );
    let reservations = redis.command(&["KEYS", "llm:*:res:*"]).unwrap();
    assert_eq!(reservations, "*1\r\n$23\r\nllm:{t:acme}:res:down-1\r\n");
    assert_eq!(
        redis
            .command(&["HGET", "llm:{t:acme}:res:down-1", "n"])
            .unwrap(),
        "$1\r\n0\r\n",
        "a tombstone"
    );
}

#[test]
fn a_reconcile_that_cannot_reach_redis_is_replayed_and_nothing_is_left_behind() {
    let redis = Redis::start().unwrap();
    let proxy = FaultProxy::start(redis.addr()).unwrap();
    let config = redis_config(json!({
        "budgets": [{"name": "tenant-day", "by": "tenant", "period": "day", "tokens": 1000000}]
    }));
    let fleet = proxied_fleet(&config, &proxy);
    let tenant_key = &budget_key();
    let stream = fleet.stream(0, 0).unwrap();
    let request = chat("cut-1", "alice", 400, Some(100));
    stream
        .send_request_headers_raw(request.headers.clone(), false)
        .unwrap();
    stream.send_request_body(&request.chunks[0], true).unwrap();
    fleet.pump().unwrap();
    assert!(stream.upstream().end, "{}", fleet.log_text());
    // reserved: 123 + 100
    assert_eq!(redis_int(&redis, tenant_key), 223);
    proxy.set(Fault::Refuse);
    let response = answer(104, 20);
    stream
        .send_response_headers_raw(response.headers.clone(), false)
        .unwrap();
    stream
        .send_response_body(&response.chunks[0], true)
        .unwrap();
    stream.finish().unwrap();
    fleet.pump().unwrap();
    assert_eq!(
        fleet.metric_sum("llm_gateway.ratelimit.journal_appended"),
        1
    );
    proxy.set(Fault::Pass);
    fleet.clock().advance(Duration::from_millis(1500));
    fleet.tick().unwrap();
    fleet.pump().unwrap();
    assert_eq!(redis_int(&redis, tenant_key), 124);
    assert_eq!(redis.command(&["KEYS", "llm:*:res:*"]).unwrap(), "*0\r\n");
}

#[test]
fn a_client_gone_while_the_reservation_is_in_flight_gets_it_all_back() {
    let redis = Redis::start().unwrap();
    let config = redis_config(json!({
        "budgets": [{"name": "tenant-day", "by": "tenant", "period": "day", "tokens": 1000000}]
    }));
    let fleet = redis_fleet(&config, &redis, 1, 1);
    let tenant_key = &budget_key();
    let stream = fleet.stream(0, 0).unwrap();
    let request = chat("gone-1", "alice", 400, Some(100));
    stream
        .send_request_headers_raw(request.headers.clone(), false)
        .unwrap();
    stream.send_request_body(&request.chunks[0], true).unwrap();
    // the RESERVE is sent but not answered yet; the client goes away
    assert!(!stream.upstream().end);
    stream.finish().unwrap();
    fleet.pump().unwrap();
    fleet.pump().unwrap();
    assert_eq!(redis_int(&redis, tenant_key), 0);
    assert_eq!(redis.command(&["KEYS", "llm:*:res:*"]).unwrap(), "*0\r\n");
}

#[test]
fn a_flushed_script_cache_is_reloaded() {
    let redis = Redis::start().unwrap();
    let config = redis_config(json!({
        "limits": [{"name": "tenant-tpm", "by": "tenant", "tokens": 100000, "per": "minute"}],
        "budgets": [{"name": "tenant-day", "by": "tenant", "period": "day", "tokens": 1000000}]
    }));
    let fleet = redis_fleet(&config, &redis, 1, 1);
    let tenant_key = &budget_key();
    for i in 0..4 {
        if i == 2 {
            redis.command(&["SCRIPT", "FLUSH"]).unwrap();
        }
        let ex = fleet
            .exchange(
                0,
                0,
                &chat(&format!("f{i}"), "alice", 400, Some(100)),
                |_| answer(104, 20),
            )
            .unwrap();
        assert_eq!(ex.status(), 200, "{}", fleet.log_text());
        fleet.pump().unwrap();
    }
    assert_eq!(redis_int(&redis, tenant_key), 4 * 124);
    assert_eq!(fleet.metric_sum("llm_gateway.ratelimit.redis_errors"), 0);
}

// ---------------------------------------------------------------------------------------
// Budget fallback, with the model router in front

fn router() -> FilterSpec {
    FilterSpec::plugin(
        "model-router",
        &json!({
            "version": "bf",
            "deployments": [
                {"name": "big", "cluster": "c-big", "model": "big-model", "provider": "openai",
                 "credential": "cred-big", "price": {"input": 5000000, "output": 15000000}},
                {"name": "mini", "cluster": "c-mini", "model": "mini-model", "provider": "openai",
                 "credential": "cred-mini", "price": {"input": 150000, "output": 600000}}
            ],
            "groups": [
                {"name": "smart", "deployments": [{"deployment": "big"}], "budget_fallback": "cheap"},
                {"name": "cheap", "deployments": [{"deployment": "mini"}]}
            ]
        }),
    )
    .unwrap()
    .allow_on_headers_stop_iteration(true)
}

fn group_request(id: &str, group: &str) -> Request {
    Request::post("/v1/chat/completions")
        .header("x-llm-request-id", id)
        .header("x-llm-tenant", "acme")
        .header("x-llm-groups", "smart,cheap")
        .property("xds.route_name", "llm")
        .json(&json!({"model": group, "max_tokens": 1000,
                      "messages": [{"role": "user", "content": "a".repeat(4000)}]}))
}

/// A money budget that cannot pay for `smart` but can for `cheap`: the request is switched
/// to `cheap` (the router's published alternative), the provider sees the cheaper model, the
/// client is told in `x-llm-budget-fallback`, and the budget is charged the cheap price.
#[test]
fn a_budget_that_cannot_pay_for_the_group_switches_to_its_budget_fallback() {
    // 1000 prompt tokens + 4 (+10 % + 8) and 1000 output: smart reserves ≈ $0.0206,
    // cheap ≈ $0.0008; the budget is one cent
    let config = json!({
        "budgets": [{"name": "tenant-day", "by": "tenant", "period": "day", "money": "0.01"}]
    });
    let fleet = Fleet::builder()
        .filter(router())
        .filter(usage())
        .filter(limiter(&config))
        .build()
        .unwrap();
    let ex = fleet
        .exchange(0, 0, &group_request("bf-1", "smart"), |up| {
            let body: Value = serde_json::from_slice(&up.body).unwrap();
            assert_eq!(body["model"], "mini-model");
            let headers = up.headers.as_ref().unwrap();
            assert_eq!(
                llm_gateway_tests::harness::stream::header_value(headers, "authorization"),
                None,
                "the first plan's credential is gone"
            );
            assert_eq!(
                llm_gateway_tests::harness::stream::header_value(headers, "x-llm-model-group"),
                Some("cheap")
            );
            answer(1004, 200)
        })
        .unwrap();
    assert_eq!(ex.status(), 200, "{}", fleet.log_text());
    assert_eq!(ex.header("x-llm-budget-fallback"), Some("cheap"));
    assert_eq!(fleet.metric_sum("llm_gateway.ratelimit.budget_fallback"), 1);
    // charged at the cheap price: 1004 × 0.15 + 200 × 0.60 (µ$/token ×1000 = nano)
    let spent = fleet
        .services(0)
        .shared_data
        .keys("token-ratelimit")
        .into_iter()
        .find(|k| k.starts_with("trl:bud:"))
        .and_then(|k| fleet.services(0).shared_data.get("token-ratelimit", &k))
        .map(|(v, _)| u64::from_le_bytes(v[..8].try_into().unwrap()))
        .unwrap();
    assert_eq!(spent, 1004 * 150 + 200 * 600);
    // `cheap` has no fallback: once the budget cannot cover it, 402
    let mut served = 1u64;
    let refused = loop {
        let ex = fleet
            .exchange(
                0,
                0,
                &group_request(&format!("bf-{served}"), "cheap"),
                |_| answer(1004, 200),
            )
            .unwrap();
        if ex.status() != 200 {
            break ex;
        }
        served += 1;
        assert!(served < 100, "never refused");
    };
    assert_eq!(refused.status(), 402, "{}", fleet.log_text());
    assert_eq!(refused.header("x-llm-budget-fallback"), None);
    // each cheap request spends 270 600 nano; the last one reserved 766 950
    let per_request = 1004 * 150 + 200 * 600;
    assert!(served * per_request <= 10_000_000);
    assert!(served * per_request + (1004 * 110 / 100 + 1 + 8) * 150 + 1000 * 600 > 10_000_000);
}

/// Without the router, a money budget prices requests with the plugin's own `prices` table
/// (by model) and is charged the actual usage at that price.
#[test]
fn a_money_budget_without_the_router_uses_its_price_table() {
    let config = json!({
        "prices": {"claude-test": {"input": 150000, "output": 600000}},
        "budgets": [{"name": "tenant-day", "by": "tenant", "period": "day", "money": "0.001"}]
    });
    let fleet = plain_fleet(&config, 1);
    let mut served = 0u64;
    let status = loop {
        let ex = fleet
            .exchange(
                0,
                0,
                &chat(&format!("m{served}"), "alice", 400, Some(100)),
                |_| answer(104, 20),
            )
            .unwrap();
        if ex.status() != 200 {
            break ex.status();
        }
        served += 1;
        assert!(served < 100);
    };
    assert_eq!(status, 402);
    // reserve 123 × 0.15 + 100 × 0.60 µ$ = 78 450 nano; charged 104 × 0.15 + 20 × 0.60 =
    // 27 600 nano: the 35th no longer fits in 1 000 000
    assert_eq!(served, 34);
    // a model without a price cannot be reserved against a money budget
    let mut request = chat("unpriced", "alice", 400, Some(100));
    request.chunks[0] = serde_json::to_vec(&json!({"model": "other", "max_tokens": 1,
        "messages": [{"role": "user", "content": "hi"}]}))
    .unwrap();
    request.headers.retain(|(n, _)| n != "content-length");
    let ex = fleet.exchange(0, 0, &request, |_| answer(1, 1)).unwrap();
    assert_eq!(ex.status(), 500);
    let error: Value = serde_json::from_slice(&ex.local_reply.as_ref().unwrap().body).unwrap();
    assert_eq!(error["error"]["code"], "budget_unpriced");
}

/// A Redis that answers with an error (a key of the wrong type) fails that call only: the
/// request goes on in emergency mode for its buckets, and under `on_redis_failure` for its
/// budgets; nothing loops, nothing hangs.
#[test]
fn script_errors_fail_the_call_not_the_worker() {
    let redis = Redis::start().unwrap();
    let config = redis_config(json!({
        "limits": [{"name": "tenant-tpm", "by": "tenant", "tokens": 100000, "per": "minute"}],
        "budgets": [{"name": "tenant-day", "by": "tenant", "period": "day", "tokens": 1000000}]
    }));
    let fleet = redis_fleet(&config, &redis, 1, 1);
    redis
        .command(&["SET", "llm:{rl:tenant-tpm:acme}", "not a hash"])
        .unwrap();
    let calls = fleet.redis().calls();
    let ex = fleet
        .exchange(0, 0, &chat("w1", "alice", 400, Some(100)), |_| {
            answer(104, 20)
        })
        .unwrap();
    // the lease failed: emergency share; the budget reserve went through
    assert_eq!(ex.status(), 200, "{}", fleet.log_text());
    assert!(fleet.metric_sum("llm_gateway.ratelimit.emergency_admits.tenant-tpm") >= 1);
    assert!(fleet.redis().calls() - calls <= 3, "no retry loop");
    let budget = &budget_key();
    redis.command(&["DEL", budget]).unwrap();
    redis.command(&["LPUSH", budget, "x"]).unwrap();
    let ex = fleet
        .exchange(0, 0, &chat("w2", "alice", 400, Some(100)), |_| {
            answer(104, 20)
        })
        .unwrap();
    assert_eq!(ex.status(), 503, "{}", fleet.log_text());
    assert!(fleet.metric_sum("llm_gateway.ratelimit.redis_errors") >= 2);
    // and the worker still serves
    redis
        .command(&["DEL", budget, "llm:{rl:tenant-tpm:acme}"])
        .unwrap();
    let ex = fleet
        .exchange(0, 0, &chat("w3", "alice", 400, Some(100)), |_| {
            answer(104, 20)
        })
        .unwrap();
    assert_eq!(ex.status(), 200, "{}", fleet.log_text());
}

/// Limits per client address: each address has its own bucket; addresses live in a bounded
/// set of shared-data slots, and an address that lands in a slot in use shares that bucket
/// (still limited, never handed a fresh one) until the slot has been idle for a window.
#[test]
fn client_addresses_get_their_own_bucket_in_bounded_slots() {
    use token_ratelimit::budget::{bucket_keys, Identity};
    use token_ratelimit::config::parse_document;
    let config = json!({
        "limits": [{"name": "ip-rpm", "by": "ip", "requests": 3, "per": "minute"}]
    });
    let limit = parse_document(config.to_string().as_bytes())
        .unwrap()
        .global()
        .unwrap()
        .limits[0]
        .clone();
    let slot = |ip: &str| {
        let id = Identity {
            ip: Some(ip.to_string()),
            ..Identity::default()
        };
        bucket_keys(&limit, &id).unwrap().local
    };
    // two addresses that share a slot, and one that does not
    let a = "10.0.0.1".to_string();
    let c = (2..200_000u32)
        .map(|i| format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
        .find(|ip| slot(ip) == slot(&a))
        .expect("a colliding address");
    let b = "10.0.0.2";
    assert_ne!(slot(b), slot(&a));

    let fleet = plain_fleet(&config, 1);
    let from = |ip: &str, id: &str| {
        fleet
            .exchange(
                0,
                0,
                &chat(id, "alice", 40, Some(10)).property("source.address", format!("{ip}:40000")),
                |_| answer(14, 10),
            )
            .unwrap()
            .status()
    };
    for i in 0..3 {
        assert_eq!(from(&a, &format!("a{i}")), 200);
    }
    assert_eq!(from(&a, "a3"), 429);
    assert_eq!(from(b, "b0"), 200, "another address, another bucket");
    assert_eq!(from(&c, "c0"), 429, "a slot in use is shared, not reset");
    // a window later the slot is idle: the newcomer takes it afresh
    fleet.clock().advance(Duration::from_secs(60));
    for i in 0..3 {
        assert_eq!(from(&c, &format!("c{}", i + 1)), 200);
    }
    assert_eq!(from(&c, "c9"), 429);
    let keys = fleet.services(0).shared_data.keys("token-ratelimit");
    assert!(
        keys.iter().all(|k| !k.contains("10.0.0")),
        "addresses never become keys: {keys:?}"
    );
}

/// A client at its own rate limit gets token-ratelimit's 429, a local reply that passes the
/// router's response path: it reached no deployment, so it must not count against one's
/// breaker (counted, one end user over its limit opened the breakers of the group for every
/// client: `e2e upstream_faults::` shows it in Envoy 1.40 with gateway.yaml).
#[test]
fn local_refusals_do_not_open_the_routers_breakers() {
    let router_config = json!({
        "version": "br",
        "breaker": {"consecutive_failures": 2, "cooldown_ms": 60000},
        "deployments": [
            {"name": "big", "cluster": "c-big", "model": "big-model", "provider": "openai",
             "credential": "cred-big"}
        ],
        "groups": [{"name": "smart", "deployments": [{"deployment": "big"}]}]
    });
    let config = json!({
        "limits": [{"name": "user-rpm", "by": "user", "requests": 1, "per": "minute"}]
    });
    let fleet = Fleet::builder()
        .filter(
            FilterSpec::plugin("model-router", &router_config)
                .unwrap()
                .allow_on_headers_stop_iteration(true),
        )
        .filter(usage())
        .filter(limiter(&config))
        .build()
        .unwrap();
    let send = |id: &str, user: &str| {
        let request = group_request(id, "smart").header("x-user-id", user);
        fleet
            .exchange(0, 0, &request, |_| answer(1004, 20))
            .unwrap()
    };
    assert_eq!(send("f-0", "flood").status(), 200, "{}", fleet.log_text());
    for i in 1..6 {
        assert_eq!(send(&format!("f-{i}"), "flood").status(), 429);
    }
    assert_eq!(
        fleet.metric_sum("llm_gateway.model_router.breaker.opened.big"),
        0,
        "{}",
        fleet.log_text()
    );
    let ex = send("other-1", "someone-else");
    assert_eq!(ex.status(), 200, "{}", fleet.log_text());
    assert_eq!(ex.header("x-llm-deployment"), Some("big"));
    // the provider's own 429s still count: two in a row open the breaker
    for i in 0..2 {
        let request =
            group_request(&format!("p-{i}"), "smart").header("x-user-id", &format!("u{i}"));
        let ex = fleet
            .exchange(0, 0, &request, |_| Response::status(429))
            .unwrap();
        assert_eq!(ex.status(), 429);
    }
    assert_eq!(
        fleet.metric_sum("llm_gateway.model_router.breaker.opened.big"),
        1
    );
}
