//! key-auth in the wasmtime harness: the compiled `dist/key-auth.wasm`, Envoy's semantics,
//! the same cases as the real-Envoy suite (`tests/e2e/key_auth.rs`), plus what only the
//! harness shows (cost per request, two workers, chains).

use llm_gateway_tests::harness::{Exchange, FilterSpec, Fleet, Request, Response};
use llm_gateway_tests::workloads as w;
use llm_gateway_tests::workspace;
use serde_json::{json, Value};

const TEAM_A: &str = "sk-e2e-team-a-4f1c9a7e2b";
const TEAM_B: &str = "sk-e2e-team-b-8d03e61f5a";
const EXPIRED: &str = "sk-e2e-expired-71b2c4d9";
const DISABLED: &str = "sk-e2e-disabled-93ae0c55";
const UNKNOWN: &str = "sk-e2e-nobody-0000000000";

const TEAM_A_DIGEST: &str = "cd353ac551cfc8248f9b4637dc0fbe82ad29f2b20e23556ecf0794fc1e6a5242";

fn config() -> Value {
    let path = workspace::envoy_config("e2e-key-auth.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn gateway() -> Fleet {
    Fleet::single(FilterSpec::plugin("key-auth", &config()).unwrap()).unwrap()
}

/// The chat request of the e2e suite, with the route and cluster Envoy's
/// `e2e-key-auth.yaml` would pick for the path.
fn chat(path: &str, headers: &[(&str, &str)]) -> Request {
    let (route, cluster) = match path {
        p if p.starts_with("/billing/") => ("billing", "mock"),
        p if p.starts_with("/reports/") => ("reports", "mock-reports"),
        _ => ("default", "mock"),
    };
    let mut request = Request::post(path)
        .property("xds.route_name", route)
        .property("xds.cluster_name", cluster)
        .json(&json!({"model": "fast", "messages": [{"role": "user", "content": "Say hello"}]}));
    for (name, value) in headers {
        request = request.header(name, value);
    }
    request
}

fn upstream_ok() -> impl FnOnce(&llm_gateway_tests::harness::Upstream) -> Response {
    |_| Response::json(&json!({"object": "chat.completion", "choices": []}))
}

fn send(gw: &Fleet, path: &str, headers: &[(&str, &str)]) -> Exchange {
    gw.exchange(0, 0, &chat(path, headers), upstream_ok())
        .unwrap()
}

fn assert_error(ex: &Exchange, status: u16, code: &str) {
    assert_eq!(ex.status(), status, "{}", ex.text());
    let body = ex.json();
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
    assert!(body["error"]["type"].is_string(), "{body}");
    assert_eq!(ex.header("content-type"), Some("application/json"));
    assert!(
        ex.upstream.is_none(),
        "a refused request reached the upstream"
    );
}

#[test]
fn valid_key_passes_with_identity_and_without_the_credential() {
    let gw = gateway();
    let bearer = format!("Bearer {TEAM_A}");
    for (name, value) in [
        ("authorization", bearer.as_str()),
        ("x-api-key", TEAM_A),
        ("api-key", TEAM_A),
    ] {
        let ex = send(&gw, "/v1/chat/completions", &[(name, value)]);
        assert_eq!(ex.status(), 200, "{name}: {}", ex.text());
        assert_eq!(
            ex.upstream_header("x-llm-consumer"),
            Some("team-a"),
            "{name}"
        );
        assert_eq!(ex.upstream_header("x-mse-consumer"), Some("team-a"));
        assert_eq!(ex.upstream_header("x-llm-tenant"), Some("acme"));
        assert_eq!(ex.upstream_header("x-llm-groups"), Some("fast,smart"));
        assert_eq!(
            ex.upstream_header("x-llm-key-id"),
            Some(&TEAM_A_DIGEST[..16])
        );
        for credential in ["authorization", "x-api-key", "api-key"] {
            assert_eq!(
                ex.upstream_header(credential),
                None,
                "{credential} reached the upstream"
            );
        }
        let up = ex.upstream.as_ref().unwrap();
        let raw = format!("{:?}{}", up.headers, String::from_utf8_lossy(&up.body));
        assert!(!raw.contains(TEAM_A), "the key reached the upstream");
        let body: Value = serde_json::from_slice(&up.body).unwrap();
        assert_eq!(body["model"], "fast", "body untouched");
    }
}

#[test]
fn spoofed_identity_headers_are_replaced() {
    let gw = gateway();
    let ex = send(
        &gw,
        "/v1/chat/completions",
        &[
            ("x-api-key", TEAM_B),
            ("x-llm-consumer", "admin"),
            ("X-LLM-Groups", "*"),
            ("x-mse-consumer", "admin"),
            ("x-llm-tenant", "other-tenant"),
            ("x-llm-budget-exempt", "true"),
        ],
    );
    assert_eq!(ex.status(), 200, "{}", ex.text());
    assert_eq!(ex.upstream_headers("x-llm-consumer"), vec!["team-b"]);
    assert_eq!(ex.upstream_headers("x-mse-consumer"), vec!["team-b"]);
    assert_eq!(ex.upstream_headers("x-llm-groups"), vec!["fast"]);
    assert_eq!(ex.upstream_headers("x-llm-tenant"), vec!["acme"]);
    assert!(ex.upstream_headers("x-llm-budget-exempt").is_empty());

    let ex = send(&gw, "/v1/chat/completions", &[("x-llm-consumer", "team-a")]);
    assert_error(&ex, 401, "missing_api_key");
}

#[test]
fn bad_keys_get_401_with_openai_errors() {
    let gw = gateway();
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
        let ex = send(&gw, "/v1/chat/completions", headers);
        assert_error(&ex, 401, code);
        let challenge = ex.header("www-authenticate").unwrap_or_default();
        assert!(
            challenge.starts_with("Bearer realm=\"llm-gateway\""),
            "{code}: {challenge:?}"
        );
        assert_eq!(
            challenge.contains("invalid_token"),
            code != "missing_api_key",
            "{code}"
        );
        assert_eq!(ex.json()["error"]["type"], "authentication_error");
        assert_eq!(
            ex.local_reply.as_ref().map(|r| r.details.as_str()),
            Some(format!("key_auth.{code}").as_str())
        );
        for (_, value) in headers {
            if value.len() > 10 {
                assert!(!ex.text().contains(value), "the key was echoed");
            }
        }
    }
}

#[test]
fn allow_listed_route_answers_403_to_other_consumers() {
    let gw = gateway();
    let ex = send(&gw, "/billing/chat/completions", &[("x-api-key", TEAM_B)]);
    assert_error(&ex, 403, "consumer_not_allowed");
    assert_eq!(ex.json()["error"]["type"], "permission_error");

    let ex = send(&gw, "/billing/chat/completions", &[("x-api-key", TEAM_A)]);
    assert_eq!(ex.status(), 200, "{}", ex.text());
    assert_eq!(ex.upstream_header("x-llm-consumer"), Some("team-a"));

    let ex = send(&gw, "/v1/chat/completions", &[("x-api-key", TEAM_B)]);
    assert_eq!(ex.status(), 200, "{}", ex.text());
    let ex = send(&gw, "/billing/chat/completions", &[("x-api-key", UNKNOWN)]);
    assert_error(&ex, 401, "invalid_api_key");
}

#[test]
fn allow_lists_by_domain_and_by_service() {
    let gw = gateway();
    for (host, key, status) in [
        ("api.restricted.example", TEAM_A, 403),
        ("API.Restricted.Example:8443", TEAM_A, 403),
        ("api.restricted.example", TEAM_B, 200),
        ("restricted.example", TEAM_A, 200),
    ] {
        let ex = send(
            &gw,
            "/v1/chat/completions",
            &[("host", host), ("x-api-key", key)],
        );
        assert_eq!(ex.status(), status, "{host}: {}", ex.text());
    }
    assert_error(
        &send(&gw, "/reports/chat/completions", &[("x-api-key", TEAM_A)]),
        403,
        "consumer_not_allowed",
    );
    assert_eq!(
        send(&gw, "/reports/chat/completions", &[("x-api-key", TEAM_B)]).status(),
        200
    );
}

#[test]
fn logs_never_contain_a_key_and_metrics_count_outcomes() {
    let gw = gateway();
    let bearer = format!("Bearer {TEAM_A}");
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], u16);
    let cases: [Case; 8] = [
        ("/v1/chat/completions", &[("authorization", &bearer)], 200),
        ("/v1/chat/completions", &[("x-api-key", TEAM_B)], 200),
        ("/v1/chat/completions", &[("x-api-key", UNKNOWN)], 401),
        ("/v1/chat/completions", &[("x-api-key", UNKNOWN)], 401),
        ("/v1/chat/completions", &[("x-api-key", EXPIRED)], 401),
        ("/v1/chat/completions", &[("x-api-key", DISABLED)], 401),
        ("/v1/chat/completions", &[], 401),
        ("/billing/chat/completions", &[("x-api-key", TEAM_B)], 403),
    ];
    for (path, headers, status) in cases {
        assert_eq!(
            send(&gw, path, headers).status(),
            status,
            "{path} {headers:?}"
        );
    }
    let stat = |suffix: &str| {
        gw.metric(0, &format!("llm_gateway.key_auth.{suffix}"))
            .unwrap_or_else(|| panic!("metric {suffix} undefined"))
    };
    assert_eq!(stat("allowed"), 2);
    assert_eq!(stat("denied.invalid_api_key"), 2);
    assert_eq!(stat("denied.expired_api_key"), 1);
    assert_eq!(stat("denied.disabled_api_key"), 1);
    assert_eq!(stat("denied.missing_api_key"), 1);
    assert_eq!(stat("denied.consumer_not_allowed"), 1);

    let logs = gw.log_text();
    assert!(
        logs.contains("key-auth: denied invalid_api_key key_id="),
        "{logs}"
    );
    assert!(logs.contains("key-auth: configured with 4 keys"), "{logs}");
    for secret in [TEAM_A, TEAM_B, UNKNOWN, EXPIRED, DISABLED, TEAM_A_DIGEST] {
        assert!(
            !logs.contains(secret),
            "{secret} found in the logs:\n{logs}"
        );
    }
}

#[test]
fn a_bad_config_is_refused_naming_the_field_without_the_key() {
    let mut bad = config();
    bad["keys"][0]["key_sha256"] = json!(TEAM_A);
    let Err(err) = Fleet::single(FilterSpec::plugin("key-auth", &bad).unwrap()) else {
        panic!("key-auth accepted a raw key in key_sha256");
    };
    assert!(err.contains("proxy_on_configure returned false"), "{err}");
    assert!(err.contains("`keys[0].key_sha256`"), "{err}");
    assert!(!err.contains(TEAM_A), "the log repeats the raw key:\n{err}");
}

#[test]
fn expiry_follows_the_fleet_clock() {
    // the "expired" key expired 2020-01-01: move the clock back before that
    let gw = gateway();
    assert_error(
        &send(&gw, "/v1/chat/completions", &[("x-api-key", EXPIRED)]),
        401,
        "expired_api_key",
    );
    gw.clock().set_nanos(1_546_300_800 * 1_000_000_000); // 2019-01-01
    let ex = send(&gw, "/v1/chat/completions", &[("x-api-key", EXPIRED)]);
    assert_eq!(ex.status(), 200, "{}", ex.text());
    assert_eq!(ex.upstream_header("x-llm-consumer"), Some("team-expired"));
}

#[test]
fn cost_per_request_is_measured_and_stable() {
    let gw = gateway();
    // The first request of a VM also probes which property names the host knows
    // (`route_name`, then `xds.route_name`): two host calls more than later requests.
    let warmup = send(&gw, "/v1/chat/completions", &[("x-api-key", TEAM_A)]);
    let first = send(&gw, "/v1/chat/completions", &[("x-api-key", TEAM_A)]);
    let second = send(&gw, "/v1/chat/completions", &[("x-api-key", TEAM_A)]);
    let w = llm_gateway_tests::harness::Totals::of(&warmup.cost);
    let (a, b) = (
        llm_gateway_tests::harness::Totals::of(&first.cost),
        llm_gateway_tests::harness::Totals::of(&second.cost),
    );
    // context create, request headers, delete (key-auth.wasm does not export the body and
    // response callbacks, proxy_on_log and proxy_on_done: scripts/unused-callbacks)
    assert_eq!(a.callbacks, 3, "{a:?}");
    assert!(
        a.fuel > 0 && a.host_calls > 0 && a.bytes_in > 0 && a.bytes_out > 0,
        "{a:?}"
    );
    // the same request costs the same host calls and bytes (fuel may differ by allocator state)
    assert_eq!(
        (a.host_calls, a.bytes_in, a.bytes_out),
        (b.host_calls, b.bytes_in, b.bytes_out)
    );
    assert_eq!(w.host_calls, a.host_calls + 2, "{w:?} {a:?}");
    let headers = first
        .cost
        .iter()
        .find(|c| c.callback == "proxy_on_request_headers")
        .unwrap();
    assert!(headers.counters.host_calls >= 5, "{headers:?}");
}

/// Two key-auth filters in separate VMs, both from `module` (`key-auth.wasm`, or the bundle
/// with root_id `key-auth`); the second requires team-a everywhere (rule-free allow list via
/// a route rule).
fn two_key_auth_filters(module: &str) -> Fleet {
    let strict = json!({
        "keys": config()["keys"],
        "_rules_": [{ "_match_route_": ["default"], "allow": ["team-a"] }]
    });
    Fleet::builder()
        .filter(
            FilterSpec::plugin(module, &config())
                .unwrap()
                .root_id("key-auth"),
        )
        .filter(
            FilterSpec::plugin(module, &strict)
                .unwrap()
                .root_id("key-auth")
                .vm_id("strict"),
        )
        .build()
        .unwrap()
}

/// The callbacks filter `filter` saw.
fn callbacks(ex: &Exchange, filter: usize) -> Vec<&'static str> {
    ex.cost
        .iter()
        .filter(|c| c.filter == filter)
        .map(|c| c.callback)
        .collect()
}

#[test]
fn two_key_auth_filters_a_refusal_short_circuits_the_second() {
    // the bundle's module exports every callback (key-auth.wasm's are below)
    let gw = two_key_auth_filters(llm_gateway_tests::bundle::MODULE);
    // first filter refuses: the second never sees the request, and only the first's
    // context exists, so only it sees the local reply's response callbacks
    let ex = send(&gw, "/v1/chat/completions", &[("x-api-key", UNKNOWN)]);
    assert_error(&ex, 401, "invalid_api_key");
    assert_eq!(ex.local_reply.as_ref().unwrap().filter, Some(0));
    // Envoy 1.40 creates the second filter's context only to call proxy_on_log
    assert_eq!(
        callbacks(&ex, 1),
        [
            "proxy_on_context_create",
            "proxy_on_log",
            "proxy_on_done",
            "proxy_on_delete"
        ]
    );
    assert!(
        callbacks(&ex, 0).contains(&"proxy_on_response_headers"),
        "{:?}",
        callbacks(&ex, 0)
    );
    // The first filter strips the key, so the second sees no key at all.
    let ex = send(&gw, "/v1/chat/completions", &[("x-api-key", TEAM_B)]);
    assert_error(&ex, 401, "missing_api_key");
    assert_eq!(ex.local_reply.as_ref().unwrap().filter, Some(1));
    // both saw the request, so both see the local reply, the second first
    let order: Vec<_> = ex
        .cost
        .iter()
        .filter(|c| c.callback == "proxy_on_response_headers")
        .map(|c| c.filter)
        .collect();
    assert_eq!(order, vec![1, 0]);
}

#[test]
fn the_host_skips_the_callbacks_key_auth_wasm_does_not_export() {
    // the same exchanges with key-auth.wasm (scripts/unused-callbacks): the same answers, and
    // neither VM is entered for a body or response callback, proxy_on_log or proxy_on_done
    // (Envoy 1.40 alike: e2e harness_local_reply::)
    let gw = two_key_auth_filters("key-auth");
    let ex = send(&gw, "/v1/chat/completions", &[("x-api-key", UNKNOWN)]);
    assert_error(&ex, 401, "invalid_api_key");
    assert_eq!(
        callbacks(&ex, 1),
        ["proxy_on_context_create", "proxy_on_delete"]
    );
    let ex = send(&gw, "/v1/chat/completions", &[("x-api-key", TEAM_B)]);
    assert_error(&ex, 401, "missing_api_key");
    assert_eq!(ex.local_reply.as_ref().unwrap().filter, Some(1));
    for filter in [0, 1] {
        let seen = callbacks(&ex, filter);
        assert!(seen.contains(&"proxy_on_request_headers"), "{seen:?}");
        for skipped in [
            "proxy_on_request_body",
            "proxy_on_response_headers",
            "proxy_on_response_body",
            "proxy_on_log",
            "proxy_on_done",
        ] {
            assert!(!seen.contains(&skipped), "{filter}: {seen:?}");
        }
    }
    // a request both let pass: the body goes by without entering either VM (the bundle's
    // key-auth would be called for each chunk)
    let gw = Fleet::single(w::key_auth().unwrap()).unwrap();
    let body = w::chat_body(2 * 1024);
    let ex = gw
        .exchange(0, 0, &w::router_request(&body), |_| w::chat_completion())
        .unwrap();
    assert_eq!(ex.status(), 200, "{}", ex.text());
    assert_eq!(
        callbacks(&ex, 0),
        [
            "proxy_on_context_create",
            "proxy_on_request_headers",
            "proxy_on_delete"
        ]
    );
}

#[test]
fn the_plain_envoy_build_imports_no_higress_redis_call() {
    // plain Envoy refuses a module importing proxy_redis_*; the harness would accept it
    let path = workspace::plugin_wasm("key-auth").unwrap();
    let module = llm_gateway_tests::harness::engine::module(&path).unwrap();
    let imports = llm_gateway_tests::harness::engine::imports(&module);
    assert!(imports.iter().all(|i| !i.contains("redis")), "{imports:?}");
    assert!(imports.contains(&"env::proxy_get_header_map_pairs".to_string()));
}
