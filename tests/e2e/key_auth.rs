//! key-auth end to end: the compiled plugin in a real Envoy 1.40 (`--concurrency 2`), in front
//! of the mock upstream, driven by a real HTTP client.
//!
//! Config: `envoy-config/e2e-key-auth.yaml` + `e2e-key-auth.json`. The keys below are test
//! fixtures; the config holds only their SHA-256 digests.

use llm_gateway_tests::envoy::Envoy;
use llm_gateway_tests::http::{self, Response};
use llm_gateway_tests::workspace;
use mock_upstream::{MockUpstream, RecordedRequest};
use serde_json::{json, Value};

const TEAM_A: &str = "sk-e2e-team-a-4f1c9a7e2b";
const TEAM_B: &str = "sk-e2e-team-b-8d03e61f5a";
const EXPIRED: &str = "sk-e2e-expired-71b2c4d9";
const DISABLED: &str = "sk-e2e-disabled-93ae0c55";
const UNKNOWN: &str = "sk-e2e-nobody-0000000000";

const TEAM_A_DIGEST: &str = "cd353ac551cfc8248f9b4637dc0fbe82ad29f2b20e23556ecf0794fc1e6a5242";

struct Gateway {
    upstream: MockUpstream,
    envoy: Envoy,
}

impl Gateway {
    async fn start() -> Gateway {
        Gateway::start_with_config(&key_auth_config())
            .await
            .unwrap()
    }

    async fn start_with_config(config: &Value) -> Result<Gateway, String> {
        let upstream = MockUpstream::start("127.0.0.1:0".parse().unwrap())
            .await
            .map_err(|e| e.to_string())?;
        let vars = template_vars(&upstream, config);
        let envoy = tokio::task::spawn_blocking(move || Envoy::start("e2e-key-auth.yaml", &vars))
            .await
            .map_err(|e| e.to_string())??;
        Ok(Gateway { upstream, envoy })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.envoy.url())
    }

    async fn chat(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        let mut request = http::post(self.url(path)).json(&json!({
            "model": "fast",
            "messages": [{"role": "user", "content": "Say hello"}]
        }));
        for (name, value) in headers {
            request = request.header(name, value);
        }
        request.send().await.unwrap()
    }

    /// The one request the upstream received since the last call.
    fn take_upstream_request(&self) -> RecordedRequest {
        let requests = self.upstream.requests();
        self.upstream.clear_requests();
        assert_eq!(requests.len(), 1, "upstream requests: {requests:?}");
        requests.into_iter().next().unwrap()
    }
}

fn key_auth_config() -> Value {
    let path = workspace::envoy_config("e2e-key-auth.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn template_vars(upstream: &MockUpstream, config: &Value) -> Vec<(&'static str, String)> {
    vec![
        ("MOCK_PORT", upstream.addr().port().to_string()),
        // one line of JSON inside a single-quoted YAML scalar
        ("KEY_AUTH_CONFIG", config.to_string().replace('\'', "''")),
    ]
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valid_key_passes_with_identity_and_without_the_credential() {
    let gw = Gateway::start().await;
    let bearer = format!("Bearer {TEAM_A}");
    for (name, value) in [
        ("authorization", bearer.as_str()),
        ("x-api-key", TEAM_A),
        ("api-key", TEAM_A),
    ] {
        let response = gw.chat("/v1/chat/completions", &[(name, value)]).await;
        assert_eq!(response.status, 200, "{name}: {}", response.text());
        let body = response.json().unwrap();
        assert_eq!(body["object"], "chat.completion", "{body}");
        assert!(body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .starts_with("tok0"));

        let seen = gw.take_upstream_request();
        assert_eq!(seen.header("x-llm-consumer"), Some("team-a"), "{name}");
        assert_eq!(seen.header("x-mse-consumer"), Some("team-a"));
        assert_eq!(seen.header("x-llm-tenant"), Some("acme"));
        assert_eq!(seen.header("x-llm-groups"), Some("fast,smart"));
        assert_eq!(seen.header("x-llm-key-id"), Some(&TEAM_A_DIGEST[..16]));
        for credential in ["authorization", "x-api-key", "api-key"] {
            assert_eq!(
                seen.header(credential),
                None,
                "{credential} reached the upstream"
            );
        }
        let raw = format!("{:?}{}", seen.headers, String::from_utf8_lossy(&seen.body));
        assert!(!raw.contains(TEAM_A), "the key reached the upstream");
        assert_eq!(seen.json().unwrap()["model"], "fast", "body untouched");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_identity_headers_are_replaced() {
    let gw = Gateway::start().await;
    let response = gw
        .chat(
            "/v1/chat/completions",
            &[
                ("x-api-key", TEAM_B),
                ("x-llm-consumer", "admin"),
                ("X-LLM-Groups", "*"),
                ("x-mse-consumer", "admin"),
                ("x-llm-tenant", "other-tenant"),
                ("x-llm-budget-exempt", "true"),
            ],
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text());
    let seen = gw.take_upstream_request();
    let values = |name: &str| -> Vec<&str> {
        seen.headers
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    assert_eq!(values("x-llm-consumer"), vec!["team-b"]);
    assert_eq!(values("x-mse-consumer"), vec!["team-b"]);
    assert_eq!(values("x-llm-groups"), vec!["fast"]);
    assert_eq!(values("x-llm-tenant"), vec!["acme"]);
    assert!(
        values("x-llm-budget-exempt").is_empty(),
        "unknown internal header kept"
    );

    // Refused requests never reach the upstream, spoofed or not.
    let response = gw
        .chat("/v1/chat/completions", &[("x-llm-consumer", "team-a")])
        .await;
    http::assert_openai_error(&response, 401, "missing_api_key");
    assert!(gw.upstream.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_get_401_with_openai_errors() {
    let gw = Gateway::start().await;
    let unknown = format!("Bearer {UNKNOWN}");
    let cases: [(&[(&str, &str)], &str); 6] = [
        (&[], "missing_api_key"),
        (
            &[("authorization", "Basic dXNlcjpwYXNz")],
            "missing_api_key",
        ),
        (&[("authorization", unknown.as_str())], "invalid_api_key"),
        (&[("x-api-key", EXPIRED)], "expired_api_key"),
        (&[("api-key", DISABLED)], "disabled_api_key"),
        (&[("x-api-key", "")], "missing_api_key"),
    ];
    for (headers, code) in cases {
        let response = gw.chat("/v1/chat/completions", headers).await;
        http::assert_openai_error(&response, 401, code);
        let challenge = response.header("www-authenticate").unwrap_or_default();
        assert!(
            challenge.starts_with("Bearer realm=\"llm-gateway\""),
            "{code}: {challenge:?}"
        );
        assert_eq!(
            challenge.contains("invalid_token"),
            code != "missing_api_key",
            "{code}"
        );
        assert_eq!(
            response.json().unwrap()["error"]["type"],
            "authentication_error"
        );
        for (_, value) in headers {
            if value.len() > 10 {
                assert!(!response.text().contains(value), "the key was echoed");
            }
        }
    }
    assert!(
        gw.upstream.requests().is_empty(),
        "a refused request reached the upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_listed_route_answers_403_to_other_consumers() {
    let gw = Gateway::start().await;
    let response = gw
        .chat("/billing/chat/completions", &[("x-api-key", TEAM_B)])
        .await;
    http::assert_openai_error(&response, 403, "consumer_not_allowed");
    assert_eq!(
        response.json().unwrap()["error"]["type"],
        "permission_error"
    );
    assert!(gw.upstream.requests().is_empty());

    let response = gw
        .chat("/billing/chat/completions", &[("x-api-key", TEAM_A)])
        .await;
    assert_eq!(response.status, 200, "{}", response.text());
    let seen = gw.take_upstream_request();
    assert_eq!(seen.path, "/v1/chat/completions");
    assert_eq!(seen.header("x-llm-consumer"), Some("team-a"));

    // The allow list belongs to the billing route only: team-b passes elsewhere.
    let response = gw
        .chat("/v1/chat/completions", &[("x-api-key", TEAM_B)])
        .await;
    assert_eq!(response.status, 200, "{}", response.text());
    // And bad keys on the allow-listed route still get 401, not 403.
    http::assert_openai_error(
        &gw.chat("/billing/chat/completions", &[("x-api-key", UNKNOWN)])
            .await,
        401,
        "invalid_api_key",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_lists_by_domain_and_by_service() {
    let gw = Gateway::start().await;
    // `_match_domain_: ["*.restricted.example"]`, any letter case, port ignored.
    for (host, key, status) in [
        ("api.restricted.example", TEAM_A, 403),
        ("API.Restricted.Example:8443", TEAM_A, 403),
        ("api.restricted.example", TEAM_B, 200),
        ("restricted.example", TEAM_A, 200),
    ] {
        let response = gw
            .chat(
                "/v1/chat/completions",
                &[("host", host), ("x-api-key", key)],
            )
            .await;
        assert_eq!(response.status, status, "{host}: {}", response.text());
    }
    // `_match_service_: ["mock-reports"]`: the cluster the route picked (property
    // `xds.cluster_name` in plain Envoy).
    http::assert_openai_error(
        &gw.chat("/reports/chat/completions", &[("x-api-key", TEAM_A)])
            .await,
        403,
        "consumer_not_allowed",
    );
    assert_eq!(
        gw.chat("/reports/chat/completions", &[("x-api-key", TEAM_B)])
            .await
            .status,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_never_contain_a_key_and_metrics_count_outcomes() {
    let gw = Gateway::start().await;
    let bearer = format!("Bearer {TEAM_A}");
    assert_eq!(
        gw.chat("/v1/chat/completions", &[("authorization", &bearer)])
            .await
            .status,
        200
    );
    assert_eq!(
        gw.chat("/v1/chat/completions", &[("x-api-key", TEAM_B)])
            .await
            .status,
        200
    );
    assert_eq!(
        gw.chat("/v1/chat/completions", &[("x-api-key", UNKNOWN)])
            .await
            .status,
        401
    );
    assert_eq!(
        gw.chat("/v1/chat/completions", &[("x-api-key", UNKNOWN)])
            .await
            .status,
        401
    );
    assert_eq!(
        gw.chat("/v1/chat/completions", &[("x-api-key", EXPIRED)])
            .await
            .status,
        401
    );
    assert_eq!(
        gw.chat("/v1/chat/completions", &[("x-api-key", DISABLED)])
            .await
            .status,
        401
    );
    assert_eq!(gw.chat("/v1/chat/completions", &[]).await.status, 401);
    assert_eq!(
        gw.chat("/billing/chat/completions", &[("x-api-key", TEAM_B)])
            .await
            .status,
        403
    );

    let stat = |suffix: &str| {
        gw.envoy
            .stat(&format!("wasmcustom.llm_gateway.key_auth.{suffix}"))
            .unwrap()
            .unwrap_or_else(|| panic!("stat {suffix} undefined"))
    };
    assert_eq!(stat("allowed"), 2);
    assert_eq!(stat("denied.invalid_api_key"), 2);
    assert_eq!(stat("denied.expired_api_key"), 1);
    assert_eq!(stat("denied.disabled_api_key"), 1);
    assert_eq!(stat("denied.missing_api_key"), 1);
    assert_eq!(stat("denied.consumer_not_allowed"), 1);

    // The access log is flushed on a timer; wait until it holds all 8 requests.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let mut logs = gw.envoy.logs();
    while logs.matches("\"status\":").count() < 8 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        logs = gw.envoy.logs();
    }
    // The logs are really captured: denial lines and access-log lines are there ...
    assert!(
        logs.contains("key-auth: denied invalid_api_key key_id="),
        "{logs}"
    );
    assert!(logs.contains("key-auth: configured with 4 keys"), "{logs}");
    assert!(logs.contains("\"consumer\":\"team-a\""), "{logs}");
    assert!(logs.contains("key_auth.consumer_not_allowed"), "{logs}");
    // ... and no key, nor a full digest, is in them.
    for secret in [TEAM_A, TEAM_B, UNKNOWN, EXPIRED, DISABLED, TEAM_A_DIGEST] {
        assert!(
            !logs.contains(secret),
            "{secret} found in the logs:\n{logs}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_validates_the_config_and_refuses_a_bad_one() {
    let upstream = MockUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let good = template_vars(&upstream, &key_auth_config());
    tokio::task::spawn_blocking(move || Envoy::validate("e2e-key-auth.yaml", &good))
        .await
        .unwrap()
        .unwrap();

    // A raw key pasted where the digest belongs: on_configure refuses, Envoy does not start,
    // the log names the field and does not repeat the key.
    let mut bad = key_auth_config();
    bad["keys"][0]["key_sha256"] = json!(TEAM_A);
    let Err(err) = Gateway::start_with_config(&bad).await else {
        panic!("envoy started with a raw key in key_sha256");
    };
    assert!(err.contains("`keys[0].key_sha256`"), "{err}");
    assert!(!err.contains(TEAM_A), "the log repeats the raw key:\n{err}");
}
