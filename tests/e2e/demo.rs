//! `scripts/run`'s gateway answers its printed curl with a mock completion, and the same curl
//! without the key with 401 (the demo code, in a real Envoy, with a real Redis).

use llm_gateway_tests::demo::{Demo, DEMO_KEY};
use llm_gateway_tests::http;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_answers_the_printed_curl() {
    let demo = Demo::start(0).await.unwrap();
    let banner = demo.banner();
    assert!(
        banner.contains(&demo.curl(true)) && banner.contains(DEMO_KEY),
        "{banner}"
    );

    let body = json!({"model": "fast", "messages": [{"role": "user", "content": "Hello!"}]});
    let url = format!("{}/v1/chat/completions", demo.url());
    let response = http::post(&url)
        .header("authorization", &format!("Bearer {DEMO_KEY}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
    let completion = response.json().unwrap();
    assert_eq!(completion["object"], "chat.completion");
    assert!(completion["usage"]["total_tokens"].as_u64().unwrap() > 0);

    // Production shape: the identity headers stop at the gateway, as does the key.
    let seen = demo.upstream.requests();
    assert_eq!(seen.len(), 1);
    for name in [
        "x-llm-consumer",
        "x-llm-tenant",
        "x-llm-groups",
        "x-llm-key-id",
        "x-mse-consumer",
        "authorization",
    ] {
        assert_eq!(seen[0].header(name), None, "{name} reached the upstream");
    }

    let response = http::post(&url).json(&body).send().await.unwrap();
    assert_eq!(response.status, 401);
    assert_eq!(response.json().unwrap()["error"]["code"], "missing_api_key");

    // Redis is really there for the plugins that will use it.
    assert_eq!(demo.redis.command(&["PING"]).unwrap(), "+PONG\r\n");
}

/// The shipped config files all pass `envoy --mode validate` (plugins loaded and configured).
#[test]
fn demo_config_validates() {
    llm_gateway_tests::envoy::Envoy::validate(
        "demo.yaml",
        &[("GATEWAY_PORT", "0".into()), ("MOCK_PORT", "9".into())],
    )
    .unwrap();
}
