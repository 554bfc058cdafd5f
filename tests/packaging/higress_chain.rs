//! The chain exactly as `higress/*.yaml` configures it: the modules the WasmPlugins' `url`s
//! name (`dist/<image>.wasm`, the `-higress` builds included), in the order their phases and
//! priorities give, each with the document Higress would hand it (`defaultConfig` +
//! `_rules_`), Redis at the CRDs' service name — on the wasmtime harness, with Higress's Redis
//! calls against a real `redis-server`. Every VM must accept its configuration, and the demo
//! key's request must go through all five.
//!
//! Not Higress itself: the harness models Envoy. It delivers the request body to a filter
//! that holds the request headers only with `allow_on_headers_stop_iteration`, which a
//! WasmPlugin cannot set; the filters get it here (see the CRDs' comments on how Higress's own
//! body-reading plugins hold headers — not verified on a running Higress).

mod common;

use common::*;
use llm_gateway_tests::demo::DEMO_KEY;
use llm_gateway_tests::harness::{FilterSpec, Fleet, Property, Request, Response};
use llm_gateway_tests::redis::Redis;
use llm_gateway_tests::workspace::sha256_hex;
use serde_json::{json, Value};

/// The Redis service names in the CRDs' configs (`redis.service`, `ledger.service`).
fn redis_services(document: &Value, out: &mut Vec<String>) {
    for key in ["redis", "ledger"] {
        if let Some(service) = document[key]["service"].as_str() {
            if !out.iter().any(|s| s == service) {
                out.push(service.to_string());
            }
        }
    }
}

#[test]
fn the_crds_configure_the_compiled_chain_and_a_request_goes_through() {
    let mut placed: Vec<(usize, i64, String, Value)> = wasm_plugins()
        .iter()
        .map(|doc| {
            let spec = &doc.value["spec"];
            let rank = PHASES.iter().position(|p| spec["phase"] == *p).unwrap();
            let (image, _) = plugin_image(doc);
            let document = higress_plugin_config(spec).unwrap();
            (rank, spec["priority"].as_i64().unwrap(), image, document)
        })
        .collect();
    placed.sort_by_key(|(rank, priority, _, _)| (*rank, -priority));

    let redis = Redis::start().unwrap();
    let mut services = Vec::new();
    let mut builder = Fleet::builder();
    for (_, _, image, document) in &placed {
        redis_services(document, &mut services);
        builder = builder.filter(
            FilterSpec::plugin(image, document)
                .unwrap()
                .allow_on_headers_stop_iteration(true),
        );
    }
    assert_eq!(services.len(), 1, "one Redis for the chain: {services:?}");
    builder = builder.redis(&services[0], redis.addr());
    let fleet = builder
        .build()
        .unwrap_or_else(|e| panic!("a VM refused its CRD config: {e}"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    fleet.clock().set_nanos(now.as_nanos() as u64);

    // the key of key-auth.yaml's digest is the demo key
    let key_auth = &placed[0].3;
    assert_eq!(
        key_auth["keys"][0]["key_sha256"],
        sha256_hex(DEMO_KEY.as_bytes())
    );

    let mut request = Request::post("/v1/chat/completions")
        .header("authorization", &format!("Bearer {DEMO_KEY}"))
        .json(&json!({
            "model": "fast",
            "messages": [{"role": "user", "content": "Write to alice@example.com about lunch"}]
        }));
    // the Ingress key-auth's matchRules name (Higress's property `route_name`)
    request.properties = vec![
        ("route_name".to_string(), Property::from("default/llm-api")),
        (
            "source.address".to_string(),
            Property::from("10.1.2.3:50000"),
        ),
    ];

    let mut upstream_body = String::new();
    let mut upstream_auth = None;
    let ex = fleet
        .exchange(0, 0, &request, |up| {
            upstream_body = String::from_utf8_lossy(&up.body).into_owned();
            upstream_auth = up.headers.as_ref().and_then(|h| {
                h.iter()
                    .find(|(n, _)| n == "authorization")
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            });
            Response::json(&json!({
                "object": "chat.completion",
                "model": "gpt-4o-mini",
                "choices": [{"index": 0, "message": {"role": "assistant",
                             "content": "I wrote to [EMAIL_1]."}}],
                "usage": {"prompt_tokens": 40, "completion_tokens": 8}
            }))
        })
        .unwrap();
    let log = fleet.log_text();
    assert_eq!(ex.status(), 200, "{}\n{log}", ex.text());

    // key-auth → router: the real model and the deployment's credential, never the key
    let sent: Value = serde_json::from_str(&upstream_body).unwrap();
    assert_eq!(sent["model"], "gpt-4o-mini", "{upstream_body}");
    assert_eq!(upstream_auth.as_deref(), Some("Bearer sk-replace-me"));
    assert!(!upstream_body.contains(DEMO_KEY));
    // pii-redaction: a placeholder upstream, the address back for the client
    assert!(
        !upstream_body.contains("alice@example.com"),
        "{upstream_body}"
    );
    assert!(upstream_body.contains("[EMAIL_1]"), "{upstream_body}");
    assert!(
        ex.text().contains("I wrote to alice@example.com."),
        "{}",
        ex.text()
    );
    assert_eq!(ex.header("x-llm-deployment"), Some("openai-mini"));
    // token-ratelimit answered with its headers
    assert!(
        ex.header("x-ratelimit-limit-tokens").is_some(),
        "{:?}",
        ex.downstream.headers
    );

    // usage-accounting: the record, and (after the Redis replies) the ledger entry
    let record: Value =
        serde_json::from_slice(ex.filter_state.get("wasm.llm_usage").unwrap()).unwrap();
    assert_eq!(record["tenant"], "demo", "{record}");
    assert_eq!(record["deployment"], "openai-mini", "{record}");
    fleet.pump().unwrap();
    let stream = placed
        .iter()
        .find_map(|(_, _, _, d)| d["ledger"]["stream"].as_str())
        .unwrap();
    assert_eq!(redis.command(&["XLEN", stream]).unwrap(), ":1\r\n", "{log}");
    // token-ratelimit: its buckets and budgets live in that Redis
    let keys = redis.command(&["DBSIZE"]).unwrap();
    let keys: u64 = keys.trim_start_matches(':').trim().parse().unwrap();
    assert!(
        keys >= 2,
        "token-ratelimit wrote nothing to Redis ({keys} keys)"
    );

    // a wrong key on that route: 401 before anything reaches a provider
    let mut wrong = Request::post("/v1/chat/completions")
        .header("authorization", "Bearer sk-wrong")
        .json(&json!({"model": "fast", "messages": []}));
    wrong.properties = vec![("route_name".to_string(), Property::from("default/llm-api"))];
    let ex = fleet
        .exchange(0, 0, &wrong, |_| Response::status(200))
        .unwrap();
    assert_eq!(ex.status(), 401);
    assert!(ex.upstream.is_none());
}
