//! Tiers, group-scoped budgets and key rotation through the compiled chain key-auth →
//! usage-accounting → token-ratelimit in the wasmtime harness: the Higress builds
//! (`dist/higress/`, Higress mode) with limits and budgets in a real `redis-server`, and the
//! plain build (per instance in shared data).
//!
//! key-auth turns each key into `x-llm-key-id` (its `id`) and `x-llm-tier`; token-ratelimit
//! takes each limit's and budget's amount from the tier and counts by the id, so a rotated key
//! (a new digest with the same `id`) keeps what the old one spent.

use llm_gateway_tests::harness::{Exchange, FilterSpec, Fleet, Host, Request, Response};
use llm_gateway_tests::redis::Redis;
use serde_json::{json, Value};
use std::time::Duration;

const SERVICE: &str = "outbound|6379||redis.static";
/// The harness clock's start (see `redis_suite_start_nanos`): 00:53:20 UTC.
fn start_nanos() -> u64 {
    llm_gateway_tests::harness::redis_suite_start_nanos()
}

/// 06:00 UTC on the start's day, RFC 3339.
fn six_am() -> String {
    let ms = start_nanos() / 1_000_000;
    let day = token_ratelimit::budget::period(token_ratelimit::config::Period::Day, ms).0;
    format!("{day}T06:00:00Z")
}

const FREE: &str = "sk-tier-free-1a2b3c4d5e";
const PRO: &str = "sk-tier-pro-6f7a8b9c0d";
const OLD: &str = "sk-rot-old-11aa22bb33";
const NEW: &str = "sk-rot-new-44cc55dd66";

/// key-auth's keys: a free and a pro key, and a key `k1` rotated (the old digest valid until
/// 06:00 on the test's day, the new one with no end).
fn keys() -> Value {
    json!({"keys": [
        {"key_sha256": "d582d7f845c468f39ee9a604e51d4e9d9deb00ec6325b488aa8c47cb65ca1cbb",
         "consumer": "team-free", "tenant": "acme", "groups": ["*"], "id": "free-key", "tier": "free"},
        {"key_sha256": "5161381cb2d4db1a69c4a853f19d08003bba0b786a4442aa81bd1aca5684b35e",
         "consumer": "team-pro", "tenant": "acme", "groups": ["*"], "id": "pro-key", "tier": "pro"},
        {"key_sha256": "2912c1aa3535238e3fc851b890113bb8cf6aa65f74691fc49f3cde007c30bf41",
         "consumer": "team-a", "tenant": "acme", "groups": ["*"], "id": "k1",
         "expires_at": six_am()},
        {"key_sha256": "911abe44a75a167a8c7aa841f0424379143f53559846068d93bee08cf20399c2",
         "consumer": "team-a", "tenant": "acme", "groups": ["*"], "id": "k1"}
    ]})
}

/// key-auth → usage-accounting → token-ratelimit, Higress builds, limits and budgets in Redis.
fn higress_chain(limiter: &Value, redis: &Redis) -> Fleet {
    let fleet = Fleet::builder()
        .host(Host::Higress)
        .filter(FilterSpec::higress("key-auth", &keys()).unwrap())
        .filter(FilterSpec::higress("usage-accounting", &json!({})).unwrap())
        .filter(FilterSpec::higress("token-ratelimit", limiter).unwrap())
        .redis(SERVICE, redis.addr())
        .workers(2)
        .build()
        .unwrap();
    fleet.clock().set_nanos(start_nanos());
    fleet
}

/// The same chain, plain builds, everything per instance.
fn plain_chain(limiter: &Value) -> Fleet {
    let fleet = Fleet::builder()
        .filter(FilterSpec::plugin("key-auth", &keys()).unwrap())
        .filter(FilterSpec::plugin("usage-accounting", &json!({})).unwrap())
        .filter(
            FilterSpec::plugin("token-ratelimit", limiter)
                .unwrap()
                .allow_on_headers_stop_iteration(true),
        )
        .workers(2)
        .build()
        .unwrap();
    fleet.clock().set_nanos(start_nanos());
    fleet
}

fn with_redis(mut limiter: Value) -> Value {
    limiter["redis"] = json!({"service": SERVICE, "timeout_ms": 500});
    limiter["clock"] = json!("gateway");
    limiter
}

/// A chat request with `key`: 400 characters of prompt (104 tokens, 123 reserved with the
/// margin) and a cap of 300, so 423 tokens reserved; the answer uses 104 + 50.
fn chat(id: &str, key: &str) -> Request {
    Request::post("/v1/chat/completions")
        .header("authorization", &format!("Bearer {key}"))
        .header("x-llm-request-id", id)
        .json(&json!({
            "model": "claude-test",
            "max_tokens": 300,
            "messages": [{"role": "user", "content": "a".repeat(400)}]
        }))
}

fn answer() -> Response {
    Response::json(&json!({
        "object": "chat.completion",
        "model": "claude-test",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 104, "completion_tokens": 50, "total_tokens": 154}
    }))
}

fn send(fleet: &Fleet, worker: usize, id: &str, key: &str) -> Exchange {
    let ex = fleet
        .exchange(0, worker, &chat(id, key), |_| answer())
        .unwrap();
    // the sync worker's tick: top-ups and anything journaled
    fleet.tick().unwrap();
    fleet.pump().unwrap();
    ex
}

fn error_code(ex: &Exchange) -> Value {
    ex.json()["error"]["code"].clone()
}

/// Requests of `key` served in a row before the first refusal (at most `max`), and the
/// refusal's status.
fn served_before_refusal(fleet: &Fleet, prefix: &str, key: &str, max: usize) -> (usize, u16) {
    for i in 0..max {
        let ex = send(fleet, i % 2, &format!("{prefix}-{i}"), key);
        if ex.status() != 200 {
            return (i, ex.status());
        }
    }
    (max, 200)
}

/// The integer a Redis `GET` of the one key matching `pattern` returns.
fn redis_int(redis: &Redis, pattern: &str) -> i64 {
    let keys = redis.command(&["KEYS", pattern]).unwrap();
    let lines: Vec<&str> = keys.lines().collect();
    assert_eq!(lines.first(), Some(&"*1"), "one key for {pattern}: {keys}");
    let key = lines[2];
    let reply = redis.command(&["GET", key]).unwrap();
    reply.lines().nth(1).unwrap().parse().unwrap()
}

#[test]
fn in_redis_a_limit_and_a_budget_take_the_amount_of_the_keys_tier() {
    let redis = Redis::start().unwrap();
    let fleet = higress_chain(
        &with_redis(json!({
            "limits": [{"name": "key-rpm", "by": "key", "requests": 3, "per": "minute",
                        "tiers": {"free": 2, "pro": 6}}],
            "budgets": [{"name": "key-day", "by": "key", "period": "day", "tokens": 100000,
                         "tiers": {"free": 1000}}]
        })),
        &redis,
    );
    // free: 2 a minute
    let (served, status) = served_before_refusal(&fleet, "f", FREE, 10);
    assert_eq!((served, status), (2, 429), "{}", fleet.log_text());
    let ex = send(&fleet, 0, "f-x", FREE);
    assert_eq!(ex.header("x-ratelimit-limit-requests"), Some("2"));
    // pro: 6 a minute, its own headers
    let ex = send(&fleet, 0, "p-0", PRO);
    assert_eq!(ex.status(), 200, "{}", ex.text());
    assert_eq!(ex.header("x-ratelimit-limit-requests"), Some("6"));
    let (served, status) = served_before_refusal(&fleet, "p", PRO, 10);
    assert_eq!((served, status), (5, 429));
    // a minute later, free's budget of 1000 tokens a day: 154 spent a request, 423 reserved,
    // so its 2 earlier requests and 2 more fit (4 x 154 + 423 > 1000 refuses the fifth)
    fleet.clock().advance(Duration::from_secs(61));
    for i in 0..2 {
        assert_eq!(send(&fleet, i, &format!("f2-{i}"), FREE).status(), 200);
        fleet.clock().advance(Duration::from_secs(31));
    }
    let ex = send(&fleet, 0, "f2-x", FREE);
    assert_eq!(ex.status(), 402, "{}", ex.text());
    assert_eq!(error_code(&ex), "budget_exceeded");
    assert_eq!(
        redis_int(&redis, "llm:*:bud:key-day:key:free-key:*"),
        4 * 154
    );
    // pro's budget is the default 100000: pro, having spent more, is still served
    fleet.clock().advance(Duration::from_secs(61));
    assert_eq!(send(&fleet, 0, "p2", PRO).status(), 200);
    assert_eq!(
        redis_int(&redis, "llm:*:bud:key-day:key:pro-key:*"),
        7 * 154
    );
    let records = records(&fleet);
    assert!(records
        .iter()
        .any(|r| r["key_id"] == "pro-key" && r["tier"] == "pro"));
    assert!(records
        .iter()
        .any(|r| r["key_id"] == "free-key" && r["tier"] == "free"));
}

#[test]
fn in_redis_a_rotated_key_keeps_the_spend_and_the_old_key_works_until_it_expires() {
    let redis = Redis::start().unwrap();
    // 1000 tokens for the key id, whatever its digest
    let fleet = higress_chain(
        &with_redis(json!({
            "budgets": [{"name": "key-total", "by": "key", "period": "total", "tokens": 1000}]
        })),
        &redis,
    );
    // the old key spends 2 x 154
    for i in 0..2 {
        let ex = send(&fleet, i, &format!("old-{i}"), OLD);
        assert_eq!(ex.status(), 200, "{}\n{}", ex.text(), fleet.log_text());
        assert_eq!(ex.upstream_header("x-llm-key-id"), Some("k1"));
    }
    // the new digest is the same key: it spends from the same 1000
    let ex = send(&fleet, 0, "new-0", NEW);
    assert_eq!(ex.status(), 200, "{}", ex.text());
    assert_eq!(ex.upstream_header("x-llm-key-id"), Some("k1"));
    assert_eq!(redis_int(&redis, "llm:*:bud:key-total:key:k1:*"), 3 * 154);
    // before its expires_at the old key still works, and still spends from the same budget
    let ex = send(&fleet, 1, "old-2", OLD);
    assert_eq!(ex.status(), 200, "{}", ex.text());
    assert_eq!(redis_int(&redis, "llm:*:bud:key-total:key:k1:*"), 4 * 154);
    // 4 x 154 + 423 > 1000: the new key is refused, the spend carried over (a fresh budget
    // would have served it)
    let ex = send(&fleet, 0, "new-1", NEW);
    assert_eq!(ex.status(), 402, "{}", ex.text());
    assert_eq!(error_code(&ex), "budget_exceeded");
    // past 06:00 the old key is refused by key-auth
    fleet.clock().advance(Duration::from_secs(6 * 3600));
    let ex = send(&fleet, 0, "old-3", OLD);
    assert_eq!(ex.status(), 401, "{}", ex.text());
    assert_eq!(error_code(&ex), "expired_api_key");
    // and nothing of the key's was reserved for it, nothing left behind
    assert_eq!(redis_int(&redis, "llm:*:bud:key-total:key:k1:*"), 4 * 154);
    let reservations = redis.command(&["KEYS", "llm:*:res:*"]).unwrap();
    assert_eq!(reservations, "*0\r\n");
    // the usage records name the key by its id, whichever digest was used
    let records = records(&fleet);
    let served: Vec<&Value> = records.iter().filter(|r| r["status"] == 200).collect();
    assert_eq!(served.len(), 4, "{records:?}");
    assert!(served
        .iter()
        .all(|r| r["key_id"] == "k1" && r["tier"].is_null()));
}

fn records(fleet: &Fleet) -> Vec<Value> {
    fleet
        .log_text()
        .lines()
        .filter_map(|l| l.split_once("usage_record: "))
        .map(|(_, json)| serde_json::from_str(json).unwrap())
        .collect()
}

#[test]
fn in_redis_a_budget_scoped_to_a_group_counts_only_that_groups_requests() {
    let redis = Redis::start().unwrap();
    // no key-auth (it strips client x-llm-* headers): the group comes as the router would set
    // it
    let fleet = Fleet::builder()
        .host(Host::Higress)
        .filter(FilterSpec::higress("usage-accounting", &json!({})).unwrap())
        .filter(
            FilterSpec::higress(
                "token-ratelimit",
                &with_redis(json!({
                    "budgets": [{"name": "smart-day", "by": "tenant", "period": "day",
                                 "tokens": 1000, "model_groups": ["smart"]}]
                })),
            )
            .unwrap(),
        )
        .redis(SERVICE, redis.addr())
        .build()
        .unwrap();
    fleet.clock().set_nanos(start_nanos());
    let in_group = |id: &str, group: &str| {
        let request = chat(id, PRO)
            .header("x-llm-tenant", "acme")
            .header("x-llm-model-group", group);
        let ex = fleet.exchange(0, 0, &request, |_| answer()).unwrap();
        fleet.pump().unwrap();
        ex
    };
    // fast: nothing reserved, nothing settled, however many
    for i in 0..8 {
        assert_eq!(in_group(&format!("fast-{i}"), "fast").status(), 200);
    }
    let keys = redis.command(&["KEYS", "llm:*:bud:*"]).unwrap();
    assert_eq!(keys, "*0\r\n", "no level of the smart budget for fast");
    // smart: counted, refused past 1000
    let mut served = 0;
    while in_group(&format!("smart-{served}"), "smart").status() == 200 {
        served += 1;
        assert!(served < 10);
    }
    assert_eq!(served, 4, "{}", fleet.log_text());
    assert_eq!(
        redis_int(&redis, "llm:*:bud:smart-day:tenant:acme:*"),
        4 * 154
    );
    // fast still goes on
    assert_eq!(in_group("fast-x", "fast").status(), 200);
}

#[test]
fn per_instance_tiers_and_rotation_in_the_plain_build() {
    let fleet = plain_chain(&json!({
        "limits": [{"name": "key-rpm", "by": "key", "requests": 3, "per": "minute",
                    "tiers": {"free": 1, "pro": 5}}],
        "budgets": [{"name": "key-total", "by": "key", "period": "total", "tokens": 1000,
                     "tiers": {"pro": 100000}}]
    }));
    let (served, status) = served_before_refusal(&fleet, "f", FREE, 10);
    assert_eq!((served, status), (1, 429), "{}", fleet.log_text());
    let (served, status) = served_before_refusal(&fleet, "p", PRO, 10);
    assert_eq!((served, status), (5, 429));
    // rotation: the old key then the new one, a minute apart (the limit, 3 a minute, stays
    // out of the way); 4 x 154 + 423 > 1000 refuses the fifth, whichever digest
    for (i, key) in [OLD, NEW, OLD, NEW].into_iter().enumerate() {
        let ex = send(&fleet, i % 2, &format!("rot-{i}"), key);
        assert_eq!(ex.status(), 200, "{i}: {}", ex.text());
        fleet.clock().advance(Duration::from_secs(61));
    }
    let ex = send(&fleet, 0, "rot-x", NEW);
    assert_eq!(ex.status(), 402, "{}", ex.text());
}

/// The model router in front with `smart`'s budget fallback `cheap`, and a money budget on
/// `smart` only: a smart request it cannot pay for is switched to `cheap`, which that budget
/// does not count — nothing is reserved or charged to it for the switched request.
#[test]
fn the_budget_fallback_leaves_a_budget_scoped_to_the_refused_group() {
    let router = FilterSpec::plugin(
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
    .allow_on_headers_stop_iteration(true);
    // smart reserves ≈ $0.0206 (1004 + 10 % + 8 prompt tokens at $5/M, 1000 output at $15/M)
    // and spends $0.00802 (1004 at $5/M, 200 at $15/M): the smart budget of 5 cents pays
    // for four, then cannot
    let limiter = json!({
        "budgets": [{"name": "smart-day", "by": "tenant", "period": "day", "money": "0.05",
                     "model_groups": ["smart"]}]
    });
    let fleet = Fleet::builder()
        .filter(router)
        .filter(FilterSpec::plugin("usage-accounting", &json!({})).unwrap())
        .filter(
            FilterSpec::plugin("token-ratelimit", &limiter)
                .unwrap()
                .allow_on_headers_stop_iteration(true),
        )
        .build()
        .unwrap();
    let request = |id: &str, group: &str| {
        Request::post("/v1/chat/completions")
            .header("x-llm-request-id", id)
            .header("x-llm-tenant", "acme")
            .header("x-llm-groups", "smart,cheap")
            .property("xds.route_name", "llm")
            .json(&json!({"model": group, "max_tokens": 1000,
                          "messages": [{"role": "user", "content": "a".repeat(4000)}]}))
    };
    let usage = |prompt: u64, completion: u64| {
        Response::json(&json!({
            "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion}
        }))
    };
    let spent = |fleet: &Fleet| -> Vec<u64> {
        let data = &fleet.services(0).shared_data;
        data.keys("token-ratelimit")
            .into_iter()
            .filter(|k| k.starts_with("trl:bud:"))
            .filter_map(|k| data.get("token-ratelimit", &k))
            .map(|(v, _)| u64::from_le_bytes(v[..8].try_into().unwrap()))
            .collect()
    };
    let per_smart = 1004 * 5000 + 200 * 15000;
    let mut at_smart = 0u64;
    let switched = loop {
        let ex = fleet
            .exchange(0, 0, &request(&format!("s-{at_smart}"), "smart"), |up| {
                let body: Value = serde_json::from_slice(&up.body).unwrap();
                assert!(body["model"] == "big-model" || body["model"] == "mini-model");
                usage(1004, 200)
            })
            .unwrap();
        assert_eq!(ex.status(), 200, "{}", fleet.log_text());
        if ex.header("x-llm-budget-fallback").is_some() {
            break ex;
        }
        at_smart += 1;
        assert!(at_smart < 10, "never switched");
    };
    assert_eq!(at_smart, 4);
    assert_eq!(switched.header("x-llm-budget-fallback"), Some("cheap"));
    assert_eq!(fleet.metric_sum("llm_gateway.ratelimit.budget_fallback"), 1);
    // the switched request is cheap's: the smart budget holds the four smart ones only
    assert_eq!(spent(&fleet), vec![4 * per_smart]);
    // cheap requests, asked for directly, are not counted by it either: never refused
    for i in 0..5 {
        let ex = fleet
            .exchange(0, 0, &request(&format!("c-{i}"), "cheap"), |_| {
                usage(1004, 200)
            })
            .unwrap();
        assert_eq!(ex.status(), 200);
    }
    assert_eq!(spent(&fleet), vec![4 * per_smart]);
}

/// A tier is one map lookup per limit and budget: a request under limits with 32 tiers each
/// burns about the fuel of one under the same limits without tiers (deterministic fuel,
/// never time).
#[test]
fn tiers_cost_a_lookup_not_a_scan() {
    use llm_gateway_tests::harness::cost::Totals;
    let tiers: serde_json::Map<String, Value> = (0..32)
        .map(|i| (format!("t{i}"), json!(1_000_000 + i)))
        .collect();
    let limiter = |with_tiers: bool| {
        let mut config = json!({
            "limits": [
                {"name": "key-rpm", "by": "key", "requests": 1_000_000, "per": "minute"},
                {"name": "key-tpm", "by": "key", "tokens": 100_000_000, "per": "minute"}
            ],
            "budgets": [{"name": "key-day", "by": "key", "period": "day", "tokens": 100_000_000}]
        });
        if with_tiers {
            for limit in config["limits"].as_array_mut().unwrap() {
                limit["tiers"] = Value::Object(tiers.clone());
            }
            config["budgets"][0]["tiers"] = Value::Object(tiers.clone());
        }
        config
    };
    let mut fuel = Vec::new();
    for with_tiers in [false, true] {
        let fleet = plain_chain(&limiter(with_tiers));
        // the second request of each: the tokenizer and buckets are warm
        send(&fleet, 0, "warm", PRO);
        let ex = send(&fleet, 0, "measured", PRO);
        assert_eq!(ex.status(), 200, "{}", ex.text());
        let totals = Totals::of(ex.cost.iter().filter(|c| c.plugin == "token-ratelimit"));
        fuel.push(totals.fuel);
    }
    let (plain, tiered) = (fuel[0] as f64, fuel[1] as f64);
    println!("trl-tiers fuel per request: without tiers {plain}, with 32 tiers per limit and budget {tiered}");
    assert!(tiered < plain * 1.05, "{plain} vs {tiered}");
}
