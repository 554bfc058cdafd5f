//! The bundle (`dist/llm-gateway.wasm`, `plugins/bundle`) in the harness: loaded once per root
//! id of `envoy-config/gateway.yaml`, with gateway.yaml's filter configs, it does what the five
//! standalone modules do — byte for byte at the upstream and the client, in filter state, in
//! shared data and in metrics — on the journey of `e2e chain::` (a stream with an e-mail
//! address, one without usage, a non-streaming chat, the refusals). A root id it does not
//! know fails the configuration, naming the id and the known ones.
//!
//! The model router's upstream filter (a cluster filter in Envoy) runs here as the last filter
//! of the chain: it sees the request after the listener's filters, the response first.

use llm_gateway_tests::bundle;
use llm_gateway_tests::demo::DEMO_KEY;
use llm_gateway_tests::harness::{FilterSpec, Fleet};
use llm_gateway_tests::journey::{chain, gateway_filters, journey, metrics, shared_data, EMAIL};
use llm_gateway_tests::workspace;
use serde_json::{json, Value};

#[test]
fn the_bundle_does_what_the_five_modules_do_on_the_gateway_journey() {
    let separate = chain(false);
    let bundled = chain(true);
    let expected = journey(&separate);
    let got = journey(&bundled);
    for (i, (want, have)) in expected.iter().zip(&got).enumerate() {
        assert_eq!(
            have,
            want,
            "step {i}: the bundle differs\nbundle: {}\nfive modules: {}",
            serde_json::to_string_pretty(have).unwrap(),
            serde_json::to_string_pretty(want).unwrap()
        );
    }
    assert_eq!(got.len(), 6);

    // What the journey is (so that equal does not mean equally broken): the address masked
    // for the provider and restored for the client, the provider's model and credential,
    // usage from the provider or estimated, the record, the refusals.
    let stream = &got[0];
    let sent = stream["upstream"]["body"].as_str().unwrap();
    assert!(
        sent.contains("[EMAIL_1]") && !sent.contains(EMAIL),
        "{sent}"
    );
    assert!(sent.contains(r#""model":"gpt-4o-mini""#), "{sent}");
    let up_headers = stream["upstream"]["headers"].to_string();
    assert!(
        up_headers.contains(r#"["authorization","Bearer sk-demo-openai-provider-credential"]"#),
        "{up_headers}"
    );
    assert!(!up_headers.contains(DEMO_KEY), "{up_headers}");
    let received = stream["downstream"]["body"].as_str().unwrap();
    assert!(!received.contains("[EMAIL_"), "{received}");
    assert!(received.ends_with("data: [DONE]\n\n"), "{received}");
    let record: Value =
        serde_json::from_str(stream["filter_state"]["wasm.llm_usage"].as_str().unwrap()).unwrap();
    assert_eq!(record["consumer"], "demo", "{record}");
    assert_eq!(record["deployment"], "openai-mini", "{record}");
    assert_eq!(record["usage_source"], "upstream", "{record}");
    assert_eq!(record["usage"]["prompt_tokens"], 40, "{record}");
    assert_eq!(record["request_id"], "<request-id>", "{record}");
    let estimated: Value =
        serde_json::from_str(got[1]["filter_state"]["wasm.llm_usage"].as_str().unwrap()).unwrap();
    assert_eq!(estimated["usage_source"], "estimated", "{estimated}");
    let whole = got[2]["downstream"]["headers"].to_string();
    assert!(whole.contains("x-llm-cost"), "{whole}");
    for (step, status, code) in [
        (3, 401, "missing_api_key"),
        (4, 403, "model_not_allowed"),
        (5, 404, "model_not_found"),
    ] {
        let reply = &got[step]["local_reply"];
        assert_eq!(reply["status"], status, "step {step}: {reply}");
        assert!(
            reply["body"].as_str().unwrap().contains(code),
            "step {step}: {reply}"
        );
        assert!(
            got[step]["upstream"].is_null(),
            "step {step} reached the provider"
        );
    }

    // The state the journey left: the router's breakers and token-ratelimit's buckets and
    // budgets in one vm_id hold what they held in two (no key of one plugin meets another's),
    // and every metric counts the same.
    let vm_ids: std::collections::BTreeSet<String> =
        gateway_filters().into_iter().map(|f| f.vm_id).collect();
    let vm_ids: Vec<&str> = vm_ids.iter().map(String::as_str).collect();
    let left = shared_data(&separate, &vm_ids);
    assert!(
        left.keys().any(|k| k.starts_with("llm_router:breaker:")),
        "{left:?}"
    );
    assert!(left.keys().any(|k| k.starts_with("trl:")), "{left:?}");
    assert_eq!(shared_data(&bundled, &[bundle::VM_ID]), left);
    let counted = metrics(&separate);
    assert!(
        counted
            .iter()
            .any(|m| m.starts_with("llm_gateway.key_auth.allowed ")),
        "{counted:?}"
    );
    assert_eq!(metrics(&bundled), counted);
}

#[test]
fn a_root_id_the_bundle_does_not_know_fails_the_configuration() {
    for root_id in ["pii", ""] {
        let spec = FilterSpec::plugin(bundle::MODULE, &json!({}))
            .unwrap()
            .root_id(root_id)
            .vm_id(bundle::VM_ID);
        let Err(err) = Fleet::single(spec) else {
            panic!("root_id {root_id:?} configured");
        };
        assert!(err.contains("proxy_on_configure returned false"), "{err}");
        assert!(
            err.contains(&format!("unknown root_id {root_id:?}")),
            "{err}"
        );
        for known in [
            "key-auth",
            "model-router",
            "model-router-upstream",
            "pii-redaction",
            "usage-accounting",
            "token-ratelimit",
        ] {
            assert!(err.contains(known), "{known} in {err}");
        }
    }
}

#[test]
fn the_bundle_imports_nothing_plain_envoy_lacks_and_has_one_entry_point() {
    let module = llm_gateway_tests::harness::engine::module(
        &workspace::plugin_wasm(bundle::MODULE).unwrap(),
    )
    .unwrap();
    let imports = llm_gateway_tests::harness::engine::imports(&module);
    assert!(
        !imports.iter().any(|i| i.contains("redis")),
        "Higress's Redis calls in the plain-Envoy bundle: {imports:?}"
    );
    let exports = llm_gateway_tests::harness::engine::exports(&module);
    for export in [
        "_initialize",
        "proxy_abi_version_0_2_1",
        "proxy_on_context_create",
    ] {
        assert_eq!(
            exports.iter().filter(|e| *e == export).count(),
            1,
            "{export}: {exports:?}"
        );
    }
}
