//! key-auth's Redis-held keys: the Higress build (`dist/higress/key-auth.wasm`) in the
//! harness's Higress mode, two workers sharing one process's shared data, a real
//! `redis-server`, and keys made, disabled and rotated with `scripts/keys`. Time is the
//! harness's clock, moved by the test.

use llm_gateway_tests::harness::stream::header_value;
use llm_gateway_tests::harness::{Exchange, FilterSpec, Fleet, Host, Request, Response};
use llm_gateway_tests::redis::Redis;
use llm_gateway_tests::workspace;
use serde_json::{json, Value};
use std::time::Duration;

const SERVICE: &str = "outbound|6379||redis.static";
/// 2026-11-30T00:53:20Z.
const START_NANOS: u64 = 1_796_000_000_000_000_000;
const TTL_MS: u64 = 30_000;
const NEGATIVE_TTL_MS: u64 = 5_000;
const WORKERS: usize = 2;

fn config() -> Value {
    json!({
        "keys": [],
        "redis": {"service": SERVICE, "cache_ttl_ms": TTL_MS, "negative_ttl_ms": NEGATIVE_TTL_MS, "timeout_ms": 500},
    })
}

fn fleet_with(redis: &Redis, config: &Value) -> Fleet {
    let fleet = Fleet::builder()
        .host(Host::Higress)
        .workers(WORKERS)
        .filter(FilterSpec::higress("key-auth", config).unwrap())
        .redis(SERVICE, redis.addr())
        .build()
        .unwrap();
    fleet.clock().set_nanos(START_NANOS);
    fleet
}

/// Runs `scripts/keys` against `redis`; its stdout (the one-time key for create and rotate).
fn keys(redis: &Redis, args: &[&str]) -> String {
    let out = std::process::Command::new(workspace::root().join("scripts/keys"))
        .arg("--redis")
        .arg(redis.addr().to_string())
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "scripts/keys {args:?}: {stderr}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn send(fleet: &Fleet, worker: usize, key: &str) -> Exchange {
    let request = Request::post("/v1/chat/completions")
        .header("authorization", &format!("Bearer {key}"))
        .json(&json!({"model": "fast", "messages": [{"role": "user", "content": "hi"}]}));
    fleet
        .exchange(0, worker, &request, |_| {
            Response::json(&json!({"ok": true}))
        })
        .unwrap()
}

/// A bodiless request straight through the stream API, for the many-request test:
/// `Fleet::exchange` collects every callback's cost so far on each call, which grows with
/// the test. The local reply's status and `error.code`, or 0 and "" if it went upstream.
fn status_of(fleet: &Fleet, worker: usize, key: &str) -> (u16, String) {
    let stream = fleet.stream(0, worker).unwrap();
    stream
        .send_request_headers(
            &[
                (":method", "GET"),
                (":path", "/v1/models"),
                (":authority", "gw"),
                ("x-api-key", key),
            ],
            true,
        )
        .unwrap();
    fleet.pump().unwrap();
    let outcome = match stream.local_reply() {
        Some(reply) => {
            let body: Value = serde_json::from_slice(&reply.body).unwrap();
            let code = body["error"]["code"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (reply.status, code)
        }
        None => (0, String::new()),
    };
    stream.finish().unwrap();
    outcome
}

fn assert_refused(ex: &Exchange, status: u16, code: &str) {
    assert_eq!(ex.status(), status, "{}", ex.text());
    assert_eq!(ex.json()["error"]["code"], code, "{}", ex.text());
    assert!(
        ex.upstream.is_none(),
        "a refused request reached the upstream"
    );
}

fn advance_ms(fleet: &Fleet, ms: u64) {
    fleet.clock().advance(Duration::from_millis(ms));
}

#[test]
fn a_key_from_scripts_keys_passes_on_every_worker_and_its_disable_reaches_them_within_the_ttl() {
    let redis = Redis::start().unwrap();
    let fleet = fleet_with(&redis, &config());
    let key = keys(
        &redis,
        &[
            "create",
            "--consumer",
            "team-a",
            "--tenant",
            "acme",
            "--groups",
            "fast,smart",
            "--tier",
            "pro",
            "--id",
            "team-a-prod",
        ],
    );
    assert!(key.starts_with("sk-llmgw-") && key.len() == 41, "{key}");
    // Redis holds the digest, never the key; `list` names the key by id and digest prefix
    let digest = workspace::sha256_hex(key.as_bytes());
    let stored = redis
        .command(&["HGET", &format!("llm:key:{digest}"), "consumer"])
        .unwrap();
    assert_eq!(stored, "$6\r\nteam-a\r\n");
    let listed = keys(&redis, &["list"]);
    assert!(
        listed.contains("team-a-prod") && listed.contains(&digest[..16]),
        "{listed}"
    );
    assert!(
        !listed.contains(&key) && !listed.contains(&digest),
        "{listed}"
    );

    // The first request waits for Redis: its headers and its body (Higress delivers the body
    // while the headers are held) go nowhere until the reply.
    let stream = fleet.stream(0, 0).unwrap();
    stream
        .send_request_headers(
            &[
                (":method", "POST"),
                (":path", "/v1/chat/completions"),
                (":authority", "gw"),
                ("authorization", &format!("Bearer {key}")),
                ("content-type", "application/json"),
            ],
            false,
        )
        .unwrap();
    stream
        .send_request_body(b"{\"model\":\"fast\"}", true)
        .unwrap();
    assert!(
        stream.upstream().headers.is_none(),
        "went on before Redis answered"
    );
    assert!(stream.upstream().body.is_empty());
    assert_eq!(fleet.pending(), 1);
    fleet.pump().unwrap();
    let up = stream.upstream();
    let headers = up.headers.as_ref().expect("resumed after the reply");
    assert_eq!(header_value(headers, "x-llm-consumer"), Some("team-a"));
    assert_eq!(header_value(headers, "x-llm-tenant"), Some("acme"));
    assert_eq!(header_value(headers, "x-llm-groups"), Some("fast,smart"));
    assert_eq!(header_value(headers, "x-llm-tier"), Some("pro"));
    assert_eq!(header_value(headers, "x-llm-key-id"), Some("team-a-prod"));
    assert_eq!(
        header_value(headers, "authorization"),
        None,
        "the key went upstream"
    );
    assert_eq!(up.body, b"{\"model\":\"fast\"}");
    stream.finish().unwrap();
    assert_eq!(fleet.redis().calls(), 1);

    // the other worker reads the shared cache: no second lookup
    for worker in 0..WORKERS {
        let ex = send(&fleet, worker, &key);
        assert_eq!(ex.status(), 200, "{}", ex.text());
        assert_eq!(ex.upstream_header("x-llm-consumer"), Some("team-a"));
    }
    assert_eq!(fleet.redis().calls(), 1);

    // Disabled in Redis. Within the TTL a cached allow still passes (documented): a disable
    // takes effect within cache_ttl_ms, not at once.
    let out = keys(&redis, &["disable", "team-a-prod"]);
    assert!(out.starts_with("disabled id=team-a-prod"), "{out}");
    advance_ms(&fleet, TTL_MS - 1_000);
    for worker in 0..WORKERS {
        assert_eq!(send(&fleet, worker, &key).status(), 200);
    }
    // past the TTL every worker refuses it, after one lookup between them
    advance_ms(&fleet, 1_000);
    for worker in 0..WORKERS {
        assert_refused(&send(&fleet, worker, &key), 401, "disabled_api_key");
    }
    assert_eq!(fleet.redis().calls(), 2);
    assert!(!fleet.log_text().contains(&key), "a key in the log");

    // rotate: a new key with the same id and fields passes; the old one stays disabled
    let new_key = keys(&redis, &["rotate", "team-a-prod", "--grace", "1h"]);
    assert_ne!(new_key, key);
    let ex = send(&fleet, 1, &new_key);
    assert_eq!(ex.status(), 200, "{}", ex.text());
    assert_eq!(ex.upstream_header("x-llm-key-id"), Some("team-a-prod"));
    assert_eq!(ex.upstream_header("x-llm-tier"), Some("pro"));
}

#[test]
fn ten_thousand_wrong_keys_cost_one_lookup_each_per_negative_ttl() {
    const WRONG: usize = 10_000;
    let redis = Redis::start().unwrap();
    let fleet = fleet_with(&redis, &config());
    let wrong: Vec<String> = (0..WRONG).map(|i| format!("sk-wrong-{i:08}")).collect();
    // every key once, alternating workers, then every key again on the other worker: within
    // the negative TTL (the clock does not move), only the first sight asks Redis
    let refused = (401, "invalid_api_key".to_string());
    for round in 0..2 {
        for (i, key) in wrong.iter().enumerate() {
            assert_eq!(status_of(&fleet, (i + round) % WORKERS, key), refused);
        }
    }
    assert_eq!(fleet.redis().calls(), WRONG as u64);
    assert_eq!(
        fleet.metric_sum("llm_gateway.key_auth.redis.lookup"),
        WRONG as u64
    );
    assert_eq!(
        fleet.metric_sum("llm_gateway.key_auth.cache.hit"),
        WRONG as u64
    );
    // after the negative TTL a wrong key is asked about again, once
    advance_ms(&fleet, NEGATIVE_TTL_MS);
    for key in wrong.iter().take(100) {
        for worker in 0..WORKERS {
            assert_eq!(status_of(&fleet, worker, key), refused);
        }
    }
    assert_eq!(fleet.redis().calls(), WRONG as u64 + 100);
    // and the shared cache stayed bounded: buckets of the default 262 144 slots at most
    let buckets = fleet.services(0).shared_data.keys("key-auth");
    assert!(buckets.len() <= 65_536, "{}", buckets.len());
    assert!(!fleet.log_text().contains("sk-wrong-"), "a key in the log");
}

#[test]
fn concurrent_requests_for_one_key_on_a_worker_share_one_lookup() {
    let redis = Redis::start().unwrap();
    let fleet = fleet_with(&redis, &config());
    let key = keys(&redis, &["create", "--consumer", "bot", "--groups", "*"]);
    let streams: Vec<_> = (0..3)
        .map(|_| {
            let s = fleet.stream(0, 0).unwrap();
            s.send_request_headers(
                &[
                    (":method", "GET"),
                    (":path", "/v1/models"),
                    (":authority", "gw"),
                    ("x-api-key", &key),
                ],
                true,
            )
            .unwrap();
            s
        })
        .collect();
    assert_eq!(fleet.pending(), 1, "one lookup for three waiting requests");
    fleet.pump().unwrap();
    for s in &streams {
        let up = s.upstream();
        let headers = up.headers.as_ref().expect("resumed");
        assert_eq!(header_value(headers, "x-llm-consumer"), Some("bot"));
        assert_eq!(header_value(headers, "x-llm-groups"), Some("*"));
    }
    assert_eq!(fleet.redis().calls(), 1);
}

#[test]
fn redis_down_refuses_unknown_keys_with_503_and_cached_ones_still_pass() {
    let mut redis = Redis::start().unwrap();
    let fleet = fleet_with(&redis, &config());
    let cached = keys(&redis, &["create", "--consumer", "team-a"]);
    let uncached = keys(&redis, &["create", "--consumer", "team-b"]);
    assert_eq!(send(&fleet, 0, &cached).status(), 200);

    redis.stop();
    let ex = send(&fleet, 1, &uncached);
    assert_refused(&ex, 503, "key_store_unavailable");
    assert_eq!(ex.header("retry-after"), Some("1"));
    // a failure is not cached: the next request asks again (and fails again)
    assert_refused(&send(&fleet, 0, &uncached), 503, "key_store_unavailable");
    // a key read within the TTL keeps working while Redis is away
    assert_eq!(send(&fleet, 1, &cached).status(), 200);
    assert!(
        fleet.log_text().contains("failed: call failed"),
        "{}",
        fleet.log_text()
    );

    redis.restart().unwrap();
    // a fresh Redis (no persistence) has no keys: the uncached key is now unknown
    assert_refused(&send(&fleet, 0, &uncached), 401, "invalid_api_key");
}

#[test]
fn a_malformed_hash_is_an_invalid_key_with_a_log_line_naming_the_field() {
    let redis = Redis::start().unwrap();
    let fleet = fleet_with(&redis, &config());
    let digest = |key: &str| workspace::sha256_hex(key.as_bytes());
    let cases = [
        (
            "sk-bad-consumer",
            vec!["consumer", "bad name", "groups", "fast"],
            "`consumer`",
        ),
        (
            "sk-no-consumer",
            vec!["tenant", "acme", "groups", "fast"],
            "`consumer`: missing",
        ),
        (
            "sk-bad-expiry",
            vec!["consumer", "c", "expires_at", "next week"],
            "`expires_at`",
        ),
        (
            "sk-bad-disabled",
            vec!["consumer", "c", "disabled", "maybe"],
            "`disabled`",
        ),
        (
            "sk-bad-group",
            vec!["consumer", "c", "groups", "a b"],
            "`groups[0]`",
        ),
    ];
    for (key, fields, named) in &cases {
        let name = format!("llm:key:{}", digest(key));
        let mut args = vec!["HSET", name.as_str()];
        args.extend(fields.iter().copied());
        redis.command(&args).unwrap();
        assert_refused(&send(&fleet, 0, key), 401, "invalid_api_key");
        let log = fleet.log_text();
        assert!(log.contains(named), "{key}: {log}");
        assert!(!log.contains(key), "the key in the log");
    }
    // a bad hash is cached like an unknown key: no second lookup within the negative TTL
    let calls = fleet.redis().calls();
    assert_refused(&send(&fleet, 1, "sk-bad-consumer"), 401, "invalid_api_key");
    assert_eq!(fleet.redis().calls(), calls);
    // not a hash at all: Redis refuses HGETALL; fail closed, not cached
    let name = format!("llm:key:{}", digest("sk-a-string"));
    redis.command(&["SET", &name, "x"]).unwrap();
    assert_refused(
        &send(&fleet, 0, "sk-a-string"),
        503,
        "key_store_unavailable",
    );
    assert!(fleet.log_text().contains("WRONGTYPE"));
}

#[test]
fn a_config_key_wins_over_redis_and_costs_no_lookup() {
    let redis = Redis::start().unwrap();
    let key = "sk-config-and-redis";
    let digest = workspace::sha256_hex(key.as_bytes());
    redis
        .command(&[
            "HSET",
            &format!("llm:key:{digest}"),
            "consumer",
            "from-redis",
        ])
        .unwrap();
    let mut config = config();
    config["keys"] = json!([{"key_sha256": digest, "consumer": "from-config", "groups": ["*"]}]);
    let fleet = fleet_with(&redis, &config);
    let ex = send(&fleet, 0, key);
    assert_eq!(ex.upstream_header("x-llm-consumer"), Some("from-config"));
    assert_eq!(fleet.redis().calls(), 0);
    // a missing key never asks Redis
    let ex = fleet
        .exchange(0, 0, &Request::get("/v1/models"), |_| Response::status(200))
        .unwrap();
    assert_refused(&ex, 401, "missing_api_key");
    assert_eq!(fleet.redis().calls(), 0);
}

#[test]
fn a_silent_or_slow_redis_times_out_into_503_and_recovers() {
    use llm_gateway_tests::harness::{Fault, FaultProxy};
    let redis = Redis::start().unwrap();
    let proxy = FaultProxy::start(redis.addr()).unwrap();
    let mut config = config();
    config["redis"]["timeout_ms"] = json!(300);
    let fleet = Fleet::builder()
        .host(Host::Higress)
        .filter(FilterSpec::higress("key-auth", &config).unwrap())
        .redis(SERVICE, proxy.addr())
        .build()
        .unwrap();
    fleet.clock().set_nanos(START_NANOS);
    let key = keys(&redis, &["create", "--consumer", "team-a"]);
    for fault in [Fault::Blackhole, Fault::Delay(Duration::from_millis(1_000))] {
        proxy.set(fault);
        assert_refused(&send(&fleet, 0, &key), 503, "key_store_unavailable");
    }
    // nothing was cached by the failures: once Redis answers in time the key passes
    proxy.set(Fault::Pass);
    let ex = send(&fleet, 0, &key);
    assert_eq!(ex.status(), 200, "{}", ex.text());
    assert_eq!(ex.upstream_header("x-llm-consumer"), Some("team-a"));
}
