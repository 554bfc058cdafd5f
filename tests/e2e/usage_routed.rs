//! usage-accounting behind model-router in a real Envoy 1.40: the record takes the router's
//! logical request id, the deployment that answered, its price (over the plugin's own table)
//! and the number of attempts from `wasm.llm_route`; streams through the router still have
//! their usage chunk hidden.
//!
//! Config: `envoy-config/e2e-usage-chain.yaml` (the router's e2e config plus this plugin).

use llm_gateway_tests::envoy::{Envoy, Options};
use llm_gateway_tests::http::{self, Response};
use llm_gateway_tests::workspace::sha256_hex;
use mock_upstream::MockUpstream;
use serde_json::{json, Value};

const KEY: &str = "sk-e2e-usage-chain-7c41d2";

struct Gateway {
    a: MockUpstream,
    _b: MockUpstream,
    _c: MockUpstream,
    envoy: Envoy,
}

fn router_config() -> Value {
    json!({
        "version": "chain-v1",
        "max_attempts": 3,
        "breaker": {"consecutive_failures": 100, "window": 10, "failure_rate_percent": 0,
                    "min_calls": 10, "cooldown_ms": 1000},
        "deployments": [
            {"name": "a", "cluster": "dep-a", "model": "gpt-4o-mini", "provider": "openai",
             "credential": "cred-a", "price": {"input": 150000, "output": 600000}, "price_version": "p1"},
            {"name": "b", "cluster": "dep-b", "model": "model-b", "provider": "openai-compatible",
             "credential": "cred-b", "price": {"currency": "EUR", "input": 3000000, "output": 15000000},
             "price_version": "p2"},
            {"name": "c", "cluster": "dep-c", "model": "model-c", "provider": "openai-compatible",
             "credential": "cred-c"},
            {"name": "dead", "cluster": "dep-dead", "model": "model-dead", "provider": "openai",
             "credential": "cred-dead"}
        ],
        "groups": [
            {"name": "fast", "deployments": [{"deployment": "a"}, {"deployment": "b"}]}
        ]
    })
}

impl Gateway {
    async fn start() -> Gateway {
        let addr = "127.0.0.1:0".parse().unwrap();
        let a = MockUpstream::start(addr).await.unwrap();
        let b = MockUpstream::start(addr).await.unwrap();
        let c = MockUpstream::start(addr).await.unwrap();
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead_port = dead.local_addr().unwrap().port();
        drop(dead);
        let router = router_config();
        let mut upstream = router.clone();
        upstream["role"] = json!("upstream");
        // the plugin's own table disagrees with the router on purpose: the router's price wins
        let usage = json!({
            "price_version": "own",
            "prices": {"a": {"input": "1", "output": "1"}, "b": {"input": "1", "output": "1"}}
        });
        let keys = json!({"keys": [
            {"key_sha256": sha256_hex(KEY.as_bytes()), "consumer": "team-chain", "tenant": "acme", "groups": ["fast"]}
        ]});
        let one_line = |v: &Value| v.to_string().replace('\'', "''");
        let vars = vec![
            ("MOCK_A_PORT", a.addr().port().to_string()),
            ("MOCK_B_PORT", b.addr().port().to_string()),
            ("MOCK_C_PORT", c.addr().port().to_string()),
            ("DEAD_PORT", dead_port.to_string()),
            ("KEY_AUTH_CONFIG", one_line(&keys)),
            ("ROUTER_CONFIG", one_line(&router)),
            ("ROUTER_UPSTREAM_CONFIG", one_line(&upstream)),
            ("USAGE_CONFIG", one_line(&usage)),
        ];
        let options = Options {
            concurrency: 2,
            trace_wasm: false,
            ..Options::default()
        };
        let envoy = tokio::task::spawn_blocking(move || {
            Envoy::start_with("e2e-usage-chain.yaml", &vars, &options)
        })
        .await
        .unwrap()
        .unwrap();
        Gateway {
            a,
            _b: b,
            _c: c,
            envoy,
        }
    }

    async fn ask(&self, stream: bool, run_id: &str) -> Response {
        http::post(format!("{}/v1/chat/completions", self.envoy.url()))
            .header("authorization", &format!("Bearer {KEY}"))
            .header("x-run-id", run_id)
            .json(&json!({
                "model": "fast",
                "stream": stream,
                "messages": [{"role": "user", "content": "Say hello"}]
            }))
            .send()
            .await
            .unwrap()
    }

    /// The record of the downstream access-log line of the request tagged `run_id`.
    async fn record(&self, run_id: &str) -> Value {
        self.envoy
            .access_log_line("access.log", run_id, |l| {
                let usage = l["usage"].as_str()?;
                serde_json::from_str::<Value>(usage)
                    .ok()
                    .filter(|r| r["run_id"] == run_id)
            })
            .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_takes_the_routers_deployment_price_and_attempts() {
    let gw = Gateway::start().await;

    // first choice answers: its price (0.15 / 0.60 per million, "p1"), one attempt
    let response = gw.ask(false, "chain-1").await;
    assert_eq!(response.status, 200, "{}", response.text());
    let usage = &response.json().unwrap()["usage"];
    let (prompt, completion) = (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["completion_tokens"].as_u64().unwrap(),
    );
    let record = gw.record("chain-1").await;
    assert_eq!(record["deployment"], "a", "{record}");
    assert_eq!(record["model_group"], "fast");
    assert_eq!(record["consumer"], "team-chain");
    assert_eq!(record["tenant"], "acme");
    assert_eq!(record["price_version"], "p1");
    assert_eq!(record["currency"], "USD");
    assert_eq!(
        record["cost_nano"],
        (prompt * 150_000_000 + completion * 600_000_000 + 500_000) / 1_000_000,
        "{record}"
    );
    assert_eq!(
        record["attempts"],
        json!([{"deployment": "a", "status": 200}])
    );
    let id = record["request_id"].as_str().unwrap();
    assert!(
        id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
        "the router's logical id: {id}"
    );

    // the first choice answers 429: the record is the second deployment's, in its currency
    gw.a.set_default_knobs(&[("x-mock-status", "429")]);
    let response = gw.ask(false, "chain-2").await;
    assert_eq!(response.status, 200, "{}", response.text());
    let record = gw.record("chain-2").await;
    assert_eq!(record["deployment"], "b", "{record}");
    assert_eq!(record["price_version"], "p2");
    assert_eq!(record["currency"], "EUR");
    assert_eq!(
        record["cost_nano"],
        (prompt * 3_000_000_000 + completion * 15_000_000_000 + 500_000) / 1_000_000,
        "{record}"
    );
    assert_eq!(
        record["attempts"],
        json!([{"deployment": "a", "status": 0}, {"deployment": "b", "status": 200}])
    );
    gw.a.set_default_knobs(&[]);

    // a stream through the router: include_usage injected, the usage chunk hidden
    let response = gw.ask(true, "chain-3").await;
    assert_eq!(response.status, 200);
    let text = response.text();
    assert!(text.contains("[DONE]"), "{text}");
    assert!(
        !text.contains("\"choices\":[]"),
        "usage chunk reached the client: {text}"
    );
    let sent = gw.a.requests().last().unwrap().json().unwrap();
    assert_eq!(sent["stream_options"], json!({"include_usage": true}));
    assert_eq!(sent["model"], "gpt-4o-mini", "the router's rewrite kept");
    let record = gw.record("chain-3").await;
    assert_eq!(record["usage_source"], "upstream", "{record}");
    assert_eq!(record["usage"]["completion_tokens"], completion);
    assert_eq!(record["stream"], true);
}
