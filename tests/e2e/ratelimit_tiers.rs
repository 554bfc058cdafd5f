//! Tiers and key rotation end to end: key-auth -> usage-accounting -> token-ratelimit (plain
//! builds, per instance) in a real Envoy 1.40 (`envoy-config/e2e-ratelimit.yaml`,
//! `--concurrency 2`) in front of the mock upstream.
//!
//! key-auth's keys carry an `id` and a `tier`; token-ratelimit takes the limit's amount from
//! the tier (`x-llm-tier`) and counts `by: key` by the id (`x-llm-key-id`), so a rotated key —
//! a new digest with the old key's id, both in the config — spends from the same budget.

use llm_gateway_tests::envoy::{Envoy, Options};
use llm_gateway_tests::http::{self, Response};
use llm_gateway_tests::workspace::sha256_hex;
use mock_upstream::MockUpstream;
use serde_json::{json, Value};

const FREE: &str = "sk-e2e-tier-free-3c9d1a";
const PRO: &str = "sk-e2e-tier-pro-7e2b5f";
const OLD: &str = "sk-e2e-rotate-old-0a4c8e";
const NEW: &str = "sk-e2e-rotate-new-9f1d3b";

struct Gateway {
    _upstream: MockUpstream,
    envoy: Envoy,
}

fn key(secret: &str, consumer: &str, extra: Value) -> Value {
    let mut key = json!({"key_sha256": sha256_hex(secret.as_bytes()), "consumer": consumer,
                         "tenant": "acme", "groups": ["*"]});
    for (k, v) in extra.as_object().unwrap() {
        key[k] = v.clone();
    }
    key
}

fn one_line(v: &Value) -> String {
    v.to_string().replace('\'', "''")
}

async fn start() -> Gateway {
    let upstream = MockUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let keys = json!({"keys": [
        key(FREE, "team-free", json!({"id": "free-key", "tier": "free"})),
        key(PRO, "team-pro", json!({"id": "pro-key", "tier": "pro"})),
        // the rotation: the old digest until a date far ahead, the new one with the same id
        key(OLD, "team-a", json!({"id": "k1", "expires_at": "2999-01-01T00:00:00Z"})),
        key(NEW, "team-a", json!({"id": "k1"})),
    ]});
    let ratelimit = json!({
        "default_max_tokens": 500,
        "limits": [{"name": "key-rph", "by": "key", "requests": 10, "per": "hour",
                    "tiers": {"free": 1, "pro": 3}}],
        "budgets": [{"name": "key-total", "by": "key", "period": "total", "tokens": 1200}]
    });
    let vars = vec![
        ("MOCK_PORT", upstream.addr().port().to_string()),
        ("KEY_AUTH_CONFIG", one_line(&keys)),
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
    Gateway {
        _upstream: upstream,
        envoy,
    }
}

impl Gateway {
    /// A chat request with `key`, tagged `tag` in the access log; the mock answers with
    /// `completion` tokens.
    async fn chat(&self, key: &str, tag: &str, completion: u64) -> Response {
        let body = json!({
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": "Say hello to the tiers"}]
        });
        http::post(format!("{}/v1/chat/completions", self.envoy.url()))
            .header("authorization", &format!("Bearer {key}"))
            .header("content-type", "application/json")
            .header("x-test-tag", tag)
            .header("x-mock-chunks", &completion.to_string())
            .body(body.to_string().into_bytes())
            .send()
            .await
            .unwrap()
    }

    /// The usage record of the request tagged `tag`, once every filter's `on_log` of it ran
    /// (its reservation is settled then).
    async fn record(&self, tag: &str) -> Value {
        let line = self
            .envoy
            .access_log_line("access.log", tag, |l| (l["tag"] == tag).then_some(l))
            .await;
        serde_json::from_str(line["usage"].as_str().unwrap_or_default())
            .unwrap_or_else(|e| panic!("no usage record for {tag} ({e}): {line}"))
    }
}

fn error_code(response: &Response) -> Value {
    response.json().unwrap()["error"]["code"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_key_is_refused_after_its_tiers_amount_and_a_pro_key_gets_its_own() {
    let gw = start().await;
    let first = gw.chat(FREE, "free-1", 1).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("x-ratelimit-limit-requests"), Some("1"));
    gw.record("free-1").await;
    let second = gw.chat(FREE, "free-2", 1).await;
    assert_eq!(second.status, 429, "{}", second.text());
    assert_eq!(error_code(&second), "rate_limit_exceeded");
    assert_eq!(second.header("x-ratelimit-limit-requests"), Some("1"));
    assert!(
        second.text().contains("1 requests per hour"),
        "{}",
        second.text()
    );
    // pro: three an hour under the same limit
    for i in 0..3 {
        let tag = format!("pro-{i}");
        let ok = gw.chat(PRO, &tag, 1).await;
        assert_eq!(ok.status, 200, "{tag}: {}", ok.text());
        assert_eq!(ok.header("x-ratelimit-limit-requests"), Some("3"));
        let record = gw.record(&tag).await;
        assert_eq!(
            (&record["key_id"], &record["tier"]),
            (&json!("pro-key"), &json!("pro"))
        );
    }
    let fourth = gw.chat(PRO, "pro-3", 1).await;
    assert_eq!(fourth.status, 429, "{}", fourth.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_and_the_new_digest_of_a_rotated_key_share_one_budget() {
    let gw = start().await;
    // each request reserves about 525 tokens (prompt, margin, the cap of 500) and uses about
    // 515 (500 completion tokens): 1200 covers two, not three
    let first = gw.chat(OLD, "old-1", 500).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let spent_1 = gw.record("old-1").await;
    assert_eq!(spent_1["key_id"], "k1", "{spent_1}");
    let spent_1 = spent_1["usage"]["total_tokens"].as_u64().unwrap();
    assert!(spent_1 > 500, "{spent_1}");

    let second = gw.chat(NEW, "new-1", 500).await;
    assert_eq!(second.status, 200, "{}", second.text());
    let record = gw.record("new-1").await;
    assert_eq!(record["key_id"], "k1", "{record}");

    // a fresh budget would cover this one (about 515 + 525 < 1200): the spend carried over
    let third = gw.chat(NEW, "new-2", 500).await;
    assert_eq!(third.status, 402, "{}", third.text());
    assert_eq!(error_code(&third), "budget_exceeded");
    assert_eq!(third.header("x-llm-budget"), Some("key-total"));
    // and the old key, still valid, is refused by the same budget
    let fourth = gw.chat(OLD, "old-2", 500).await;
    assert_eq!(fourth.status, 402, "{}", fourth.text());
}
