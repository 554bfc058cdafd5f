//! The dashboard and the alerts against a real Prometheus scraping a real Envoy 1.40.
//!
//! One gateway of `envoy-config/gateway-fleet.yaml` (limits, budgets and the ledger in Redis
//! through webdis) in front of the three mock providers, with two changes: the tenant budget
//! is 0.10 USD instead of 100 (so its warn_at levels and its 402 come within a few requests)
//! and a third key of tenant `drain` spends it. Prometheus scrapes Envoy's admin
//! `/stats/prometheus` every second and evaluates `observability/alerts.yaml` every second,
//! with one mechanical change: every `for:` is `0s`, so an alert fires at the first
//! evaluation its expression holds (the expressions themselves are untouched).
//!
//! The traffic: answered chats and streams of every group and an Anthropic message, e-mail
//! addresses (PII), requests without a valid key (401), a group the key may not use (403), a
//! user past its requests per minute (429), a user past its daily tokens (402), a provider
//! failing one model (fallback to the next deployment, then its breaker opens), a group whose
//! every deployment fails (breakers open, then 503 deployments_unavailable), a tenant spending
//! its budget (warn_at, then 402), slow first tokens, and Redis going away (failures, the
//! journal). Then: every panel query of `observability/grafana-dashboard.json`
//! (read from the file) returns data, the token and cost counters equal the sums of the usage
//! records in the access log, every rule evaluates without error, and the alerts this traffic
//! must fire are firing.

use llm_gateway_tests::demo::{DEMO_KEY, FAST_ONLY_KEY, FLEET_CONFIG};
use llm_gateway_tests::envoy::{Envoy, Options};
use llm_gateway_tests::http::{self, Response};
use llm_gateway_tests::prometheus::Prometheus;
use llm_gateway_tests::redis::Redis;
use llm_gateway_tests::webdis::{self, Webdis};
use llm_gateway_tests::workspace::{self, sha256_hex};
use mock_upstream::{Flavor, MockUpstream};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// The key of tenant `drain`, added to the key-auth config of the test's variant.
const DRAIN_KEY: &str = "sk-obs-drain-tenant-not-a-secret";

/// The alerts of `observability/alerts.yaml` the traffic must fire: all of them
/// (`LlmGatewayLedgerErrors` from the appends that fail once Redis and webdis are stopped).
const FIRING: [&str; 9] = [
    "LlmGatewayBudgetWarning",
    "LlmGatewayBudgetExhausted",
    "LlmGatewayBreakerOpen",
    "LlmGatewayModelGroupDown",
    "LlmGatewayRefusalRateHigh",
    "LlmGatewayTimeToFirstTokenHigh",
    "LlmGatewayRedisUnreachable",
    "LlmGatewayJournalGrowing",
    "LlmGatewayLedgerErrors",
];

fn read(path: &str) -> String {
    let path = workspace::root().join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn dashboard() -> Value {
    serde_json::from_str(&read("observability/grafana-dashboard.json")).unwrap()
}

/// Every panel of the dashboard (rows' nested panels included).
fn panels(dashboard: &Value) -> Vec<Value> {
    let mut all = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        all.push(panel.clone());
        if let Some(nested) = panel["panels"].as_array() {
            all.extend(nested.iter().cloned());
        }
    }
    all
}

/// A panel query as Prometheus runs it: Grafana's variables replaced by what "All" and the
/// defaults give (`$tenant`, `$model_group`: `.*`; `$monthly_budget`: its default).
fn substitute(expr: &str, dashboard: &Value) -> String {
    let budget = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "monthly_budget")
        .and_then(|v| v["query"].as_str())
        .unwrap()
        .to_string();
    expr.replace("$__rate_interval", "1m")
        .replace("$__range", "1h")
        .replace("$tenant", ".*")
        .replace("$model_group", ".*")
        .replace("$monthly_budget", &budget)
}

/// `alerts.yaml` with every `for:` set to `0s` (the test cannot wait minutes).
fn rules_without_for(alerts: &str) -> String {
    alerts
        .lines()
        .map(|line| match line.split_once("for: ") {
            Some((indent, _)) if indent.trim().is_empty() => format!("{indent}for: 0s"),
            _ => line.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_dashboard_is_well_formed() {
    let dashboard = dashboard();
    assert!(dashboard["title"].is_string() && dashboard["uid"].is_string());
    assert!(dashboard["schemaVersion"].as_u64().unwrap() >= 36);
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    let mut ids = BTreeSet::new();
    let mut queries = 0;
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().unwrap_or_default().to_string();
        assert!(!title.is_empty(), "a panel without a title: {panel}");
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "duplicate id: {title}"
        );
        let grid = &panel["gridPos"];
        for field in ["h", "w", "x", "y"] {
            assert!(grid[field].is_u64(), "{title}: gridPos.{field}");
        }
        assert!(
            grid["x"].as_u64().unwrap() + grid["w"].as_u64().unwrap() <= 24,
            "{title}"
        );
        if panel["type"] == "row" {
            continue;
        }
        assert!(panel["description"].is_string(), "{title}: description");
        assert_eq!(panel["datasource"]["type"], "prometheus", "{title}");
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no target");
        let mut ref_ids = BTreeSet::new();
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            assert!(!expr.is_empty(), "{title}");
            assert!(ref_ids.insert(target["refId"].as_str().unwrap()), "{title}");
            // every variable a query uses is defined (or one of Grafana's own)
            for (i, _) in expr.match_indices('$') {
                let name: String = expr[i + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    name.starts_with("__") || variables.contains(&name.as_str()),
                    "{title}: ${name}"
                );
            }
            queries += 1;
        }
    }
    assert!(queries >= 20, "{queries} queries");
}

/// `observability/check-dashboard.py`: the file against the dashboard types of Grafana's
/// grafana-foundation-sdk (pinned into `.venv` by `scripts/setup`).
#[test]
fn the_dashboard_fits_grafanas_dashboard_schema() {
    let root = workspace::root();
    let out = std::process::Command::new(root.join(".venv/bin/python"))
        .arg(root.join("observability/check-dashboard.py"))
        .output()
        .expect(".venv/bin/python (scripts/setup)");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("20 panels, every field known to the dashboard schema"),
        "{text}"
    );
}

#[test]
fn promtool_accepts_the_alert_rules() {
    let out = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(workspace::root().join("observability/alerts.yaml"))
        .output()
        .expect("promtool (apt-get install prometheus, or scripts/setup)");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("SUCCESS: 9 rules found"), "{text}");
    // the test's transformation keeps every rule and changes only the `for:` lines
    let alerts = read("observability/alerts.yaml");
    let derived = rules_without_for(&alerts);
    assert_eq!(alerts.lines().count(), derived.lines().count());
    let changed: Vec<(&str, &str)> = alerts
        .lines()
        .zip(derived.lines())
        .filter(|(a, b)| a != b)
        .collect();
    assert!(!changed.is_empty());
    assert!(changed
        .iter()
        .all(|(a, b)| a.trim_start().starts_with("for: ") && b.trim_start() == "for: 0s"));
}

struct Gateway {
    envoy: Envoy,
    redis: Redis,
    webdis: Webdis,
    openai: MockUpstream,
    _azure: MockUpstream,
    _anthropic: MockUpstream,
}

async fn start_gateway() -> Gateway {
    let redis = Redis::start().unwrap();
    let webdis = Webdis::start(redis.addr()).unwrap();
    let addr = "127.0.0.1:0".parse().unwrap();
    // each provider plays its own API (gateway.yaml's deployments speak each one's)
    let openai = MockUpstream::start_flavor(addr, Flavor::Openai)
        .await
        .unwrap();
    let azure = MockUpstream::start_flavor(addr, Flavor::Azure)
        .await
        .unwrap();
    let anthropic = MockUpstream::start_flavor(addr, Flavor::Anthropic)
        .await
        .unwrap();
    let shipped = read(&format!("envoy-config/{FLEET_CONFIG}"));
    let drain_key = format!(
        r#""consumer": "intern", "tenant": "demo", "groups": ["fast"], "tier": "free"}},
                        {{"key_sha256": "{}", "consumer": "drain", "tenant": "drain", "groups": ["smart"]}}"#,
        sha256_hex(DRAIN_KEY.as_bytes())
    );
    let mut text = shipped.clone();
    for (from, to) in [
        (
            r#""consumer": "intern", "tenant": "demo", "groups": ["fast"], "tier": "free"}"#,
            drain_key.as_str(),
        ),
        (r#""money": "100.00""#, r#""money": "0.10""#),
    ] {
        assert_eq!(shipped.matches(from).count(), 1, "{from} in {FLEET_CONFIG}");
        text = text.replace(from, to);
    }
    let path = std::env::temp_dir().join(format!(
        "llm-gateway-observability-{}.yaml",
        std::process::id()
    ));
    std::fs::write(&path, text).unwrap();
    let vars = vec![
        ("GATEWAY_PORT", "0".to_string()),
        ("OPENAI_PORT", openai.addr().port().to_string()),
        ("AZURE_PORT", azure.addr().port().to_string()),
        ("ANTHROPIC_PORT", anthropic.addr().port().to_string()),
        ("WEBDIS_PORT", webdis.addr().port().to_string()),
        ("WEBDIS_AUTH", webdis::AUTH.to_string()),
    ];
    let options = Options {
        concurrency: 2,
        trace_wasm: false,
        ..Options::default()
    };
    let config = path.to_string_lossy().to_string();
    let envoy = tokio::task::spawn_blocking(move || Envoy::start_with(&config, &vars, &options))
        .await
        .unwrap()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    Gateway {
        envoy,
        redis,
        webdis,
        openai,
        _azure: azure,
        _anthropic: anthropic,
    }
}

impl Gateway {
    async fn chat(&self, key: Option<&str>, headers: &[(&str, &str)], body: Value) -> Response {
        let mut request = http::post(format!("{}/v1/chat/completions", self.envoy.url()));
        if let Some(key) = key {
            request = request.header("authorization", &format!("Bearer {key}"));
        }
        for (name, value) in headers {
            request = request.header(name, value);
        }
        request.json(&body).send().await.unwrap()
    }

    /// The usage records of the access log (every answered request has one).
    fn records(&self) -> Vec<Value> {
        std::fs::read_to_string(self.envoy.dir().join("access.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|l| serde_json::from_str::<Value>(l["usage"].as_str()?).ok())
            .collect()
    }
}

fn chat_body(group: &str, stream: bool, text: &str) -> Value {
    json!({"model": group, "stream": stream, "max_tokens": 32,
           "messages": [{"role": "user", "content": text}]})
}

/// Long enough for Prometheus (scraping every second) to see a counter before it moves again:
/// an alert on `increase()` needs a counter's second value (a counter the plugins define on
/// first use appears with its first increment already in).
async fn scrape_pause() {
    tokio::time::sleep(Duration::from_millis(2500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scraping_envoy_sees_every_panel_and_fires_the_alerts() {
    let mut gateway = start_gateway().await;
    let admin = gateway.envoy.admin().to_string();
    let rules = rules_without_for(&read("observability/alerts.yaml"));
    let prometheus = Prometheus::start(&[admin], &rules).await.unwrap();

    // Slow first tokens, all along: Anthropic message streams of group `claude` whose provider
    // waits 12.5 s before answering (the TTFT alert's threshold is 10 s, and Envoy's
    // histograms count a value up to ~10 % above a bucket's bound in that bucket; a time to first token
    // is recorded for streams only).
    let url = gateway.envoy.url();
    let slow: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                http::post(format!("{url}/v1/messages"))
                    .header("x-api-key", DEMO_KEY)
                    .header("anthropic-version", "2023-06-01")
                    .header("x-mock-delay-ms", "12500")
                    .json(&json!({"model": "claude", "max_tokens": 16, "stream": true,
                                  "messages": [{"role": "user", "content": "Take your time"}]}))
                    .send()
                    .await
                    .unwrap()
            })
        })
        .collect();

    // answered traffic: chats and streams of `fast` and `smart`
    for group in ["fast", "smart"] {
        for stream in [false, false, true, true] {
            let r = gateway
                .chat(Some(DEMO_KEY), &[], chat_body(group, stream, "Hello there"))
                .await;
            assert_eq!(r.status, 200, "{group}: {}", r.text());
        }
    }
    // personal data: masked for the provider, counted per rule
    for _ in 0..2 {
        let r = gateway
            .chat(
                Some(DEMO_KEY),
                &[("x-mock-echo", "1")],
                chat_body("fast", false, "Write to jane.doe@example.com"),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    // 401: no key, an unknown key
    for i in 0..40 {
        let key = (i % 4 == 0).then_some("sk-not-a-key-of-this-gateway");
        let r = gateway.chat(key, &[], chat_body("fast", false, "Hi")).await;
        assert_eq!(r.status, 401, "{}", r.text());
    }
    // 403: a group the key may not use
    let r = gateway
        .chat(Some(FAST_ONLY_KEY), &[], chat_body("smart", false, "Hi"))
        .await;
    http::assert_openai_error(&r, 403, "model_not_allowed");
    // 429: user-rpm (10 requests a minute per user)
    let burst = [("x-user-id", "burst")];
    let mut limited = 0;
    for _ in 0..11 {
        let r = gateway
            .chat(Some(DEMO_KEY), &burst, chat_body("fast", false, "Hi"))
            .await;
        limited += usize::from(r.status == 429);
    }
    assert_eq!(limited, 1);
    scrape_pause().await;
    let r = gateway
        .chat(Some(DEMO_KEY), &burst, chat_body("fast", false, "Hi"))
        .await;
    http::assert_openai_error(&r, 429, "rate_limit_exceeded");
    // 402: more tokens than carol's day (user-day, 20 000 tokens)
    let carol = [("x-user-id", "carol")];
    let big = json!({"model": "fast", "max_tokens": 25000,
                     "messages": [{"role": "user", "content": "Hi"}]});
    let r = gateway.chat(Some(DEMO_KEY), &carol, big.clone()).await;
    http::assert_openai_error(&r, 402, "budget_exceeded");

    // fallback: openai fails gpt-4o-mini; `fast` moves to azure-mini; after 5 failures in a
    // row openai-mini's breaker opens
    gateway.openai.set_default_knobs(&[
        ("x-mock-status", "503"),
        ("x-mock-status-model", "gpt-4o-mini"),
    ]);
    for _ in 0..6 {
        let r = gateway
            .chat(Some(DEMO_KEY), &[], chat_body("fast", false, "Hello"))
            .await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-llm-deployment"), Some("azure-mini"));
    }
    gateway.openai.set_default_knobs(&[]);

    // a provider's 429 with retry-after: openai-4o is cooled down for that long (the request
    // falls back to azure-4o), counted per deployment
    gateway
        .openai
        .set_default_knobs(&[("x-mock-status", "429"), ("x-mock-retry-after", "1")]);
    let r = gateway
        .chat(Some(DEMO_KEY), &[], chat_body("smart", false, "Hello"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-llm-deployment"), Some("azure-4o"));
    gateway.openai.set_default_knobs(&[]);

    // a tenant spends its budget (0.10 USD): ~0.01 USD a request (1 000 output tokens of
    // gpt-4o), warn_at 80 then 402
    let spend = [("x-mock-chunks", "1000")];
    let drain = json!({"model": "smart", "max_tokens": 1000,
                       "messages": [{"role": "user", "content": "Tell me everything"}]});
    let mut refused = 0;
    for _ in 0..20 {
        let r = gateway.chat(Some(DRAIN_KEY), &spend, drain.clone()).await;
        if r.status == 402 {
            refused += 1;
            if refused == 2 {
                break;
            }
        } else {
            assert_eq!(r.status, 200, "{}", r.text());
        }
        scrape_pause().await;
    }
    assert_eq!(refused, 2, "the drain tenant's budget never refused");
    let r = gateway.chat(Some(DEMO_KEY), &carol, big).await;
    http::assert_openai_error(&r, 402, "budget_exceeded");

    // every deployment of `smart` fails: both breakers open, then 503 deployments_unavailable
    let failing = [("x-mock-status", "503")];
    for _ in 0..5 {
        let r = gateway
            .chat(Some(DEMO_KEY), &failing, chat_body("smart", false, "Hello"))
            .await;
        assert_eq!(r.status, 503, "{}", r.text());
    }
    for _ in 0..2 {
        let r = gateway
            .chat(Some(DEMO_KEY), &[], chat_body("smart", false, "Hello"))
            .await;
        http::assert_openai_error(&r, 503, "deployments_unavailable");
        scrape_pause().await;
    }

    for handle in slow {
        let r = handle.await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }

    // Redis goes away (webdis, the gateway's way to it, too): budget calls fail (refused 503
    // budget_unavailable), settlements of the requests under way queue in the journal
    gateway.redis.stop();
    gateway.webdis.stop();
    for _ in 0..3 {
        let _ = gateway
            .chat(Some(DEMO_KEY), &[], chat_body("fast", false, "Hello"))
            .await;
        scrape_pause().await;
    }

    // The token and cost counters equal the sums of the usage records (the access log).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let records = gateway.records();
        let sum = |f: &dyn Fn(&Value) -> u64| records.iter().map(f).sum::<u64>() as f64;
        let want = [
            (
                "sum(llm_gateway_usage_tokens{token_type=\"input\"})",
                sum(&|r| r["usage"]["prompt_tokens"].as_u64().unwrap_or(0)),
            ),
            (
                "sum(llm_gateway_usage_tokens{token_type=\"output\"})",
                sum(&|r| r["usage"]["completion_tokens"].as_u64().unwrap_or(0)),
            ),
            (
                "sum(llm_gateway_usage_cost_nano)",
                sum(&|r| r["cost_nano"].as_u64().unwrap_or(0)),
            ),
            ("sum(llm_gateway_usage_requests)", records.len() as f64),
        ];
        let mut got = Vec::new();
        for (expr, _) in &want {
            got.push(prometheus.scalar(expr).await.unwrap());
        }
        let matches = want.iter().zip(&got).all(|((_, w), g)| *g == Some(*w));
        if matches && records.len() > 30 {
            println!("observability: {} usage records; {:?}", records.len(), want);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the metrics never matched the records: want {want:?}, Prometheus has {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The labels the stats_tags spell out of the names: refusal codes, PII rules, budgets.
    for (expr, want) in [
        (
            "sum(llm_gateway_key_auth_denied{code=\"missing_api_key\"})",
            30.0,
        ),
        (
            "sum(llm_gateway_key_auth_denied{code=\"invalid_api_key\"})",
            10.0,
        ),
        ("sum(llm_gateway_pii_matches{rule=\"email\"})", 2.0),
        (
            "sum(llm_gateway_model_router_rejected{code=\"model_not_allowed\"})",
            1.0,
        ),
        (
            "sum(llm_gateway_ratelimit_rate_limited{limit=\"user-rpm\"})",
            2.0,
        ),
        (
            "sum(llm_gateway_model_router_cooldown{deployment=\"openai-4o\"})",
            1.0,
        ),
        (
            "sum(llm_gateway_ratelimit_budget_exceeded{budget=\"user-day\"})",
            2.0,
        ),
    ] {
        assert_eq!(prometheus.scalar(expr).await.unwrap(), Some(want), "{expr}");
    }

    // Every panel query of the dashboard returns data.
    let dashboard = dashboard();
    let mut empty = Vec::new();
    let mut queries = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    for panel in panels(&dashboard) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = substitute(target["expr"].as_str().unwrap(), &dashboard);
            queries += 1;
            loop {
                let result = prometheus
                    .query(&expr)
                    .await
                    .unwrap_or_else(|e| panic!("{}: {expr}: {e}", panel["title"]));
                if result.as_array().is_some_and(|r| !r.is_empty()) {
                    break;
                }
                if Instant::now() > deadline {
                    empty.push(format!("{}: {expr}", panel["title"]));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    if !empty.is_empty() {
        let names = prometheus
            .query("count by (__name__) ({__name__=~\"llm_gateway.*|gen_ai.*\"})")
            .await
            .unwrap();
        let names: Vec<&str> = names
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s["metric"]["__name__"].as_str())
            .collect();
        panic!(
            "queries without data:\n{}\nthe gateway's metrics: {names:?}",
            empty.join("\n")
        );
    }
    // the variables' queries too
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["query"]["query"].as_str() {
            let metric = query
                .strip_prefix("label_values(")
                .and_then(|q| q.split_once(", "))
                .map(|(m, l)| (m.to_string(), l.trim_end_matches(')').to_string()))
                .unwrap();
            let values = prometheus
                .api(&format!("label/{}/values", metric.1))
                .await
                .unwrap();
            assert!(values.as_array().is_some_and(|v| !v.is_empty()), "{query}");
        }
    }

    // Every rule evaluates without error, and the traffic's alerts fire.
    let deadline = Instant::now() + Duration::from_secs(60);
    let firing = loop {
        let groups = prometheus.api("rules").await.unwrap();
        let mut count = 0;
        for group in groups["groups"].as_array().unwrap() {
            for rule in group["rules"].as_array().unwrap() {
                count += 1;
                assert_eq!(rule["health"], "ok", "{rule}");
            }
        }
        assert_eq!(count, 9);
        let alerts = prometheus.api("alerts").await.unwrap();
        let firing: BTreeSet<String> = alerts["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["state"] == "firing")
            .map(|a| a["labels"]["alertname"].as_str().unwrap().to_string())
            .collect();
        if FIRING.iter().all(|a| firing.contains(*a)) {
            break alerts;
        }
        assert!(
            Instant::now() < deadline,
            "firing: {firing:?}, want {FIRING:?}\nalerts: {alerts}\nprometheus log:\n{}",
            prometheus.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // the alerts name what fired
    let labels = |name: &str| -> Vec<Value> {
        firing["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["labels"]["alertname"] == name && a["state"] == "firing")
            .map(|a| a["labels"].clone())
            .collect()
    };
    let breakers: BTreeSet<String> = labels("LlmGatewayBreakerOpen")
        .iter()
        .map(|l| l["deployment"].as_str().unwrap().to_string())
        .collect();
    assert!(
        ["openai-mini", "openai-4o", "azure-4o"]
            .iter()
            .all(|d| breakers.contains(*d)),
        "{breakers:?}"
    );
    assert!(labels("LlmGatewayBudgetWarning")
        .iter()
        .any(|l| l["budget"] == "tenant-month" && l["percent"] == "80"));
    let exhausted: BTreeSet<String> = labels("LlmGatewayBudgetExhausted")
        .iter()
        .map(|l| l["budget"].as_str().unwrap().to_string())
        .collect();
    assert!(
        exhausted.contains("tenant-month") && exhausted.contains("user-day"),
        "{exhausted:?}"
    );
    assert!(labels("LlmGatewayTimeToFirstTokenHigh")
        .iter()
        .any(|l| l["model_group"] == "claude"));
    println!("observability: {queries} dashboard queries answered; firing: {FIRING:?}");
}
