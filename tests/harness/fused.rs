//! The fused filter (root id `llm-gateway` of `dist/llm-gateway.wasm`, `plugins/bundle`) in the
//! harness: the five listener filters of `envoy-config/gateway.yaml` as one filter whose
//! configuration holds theirs under the plugins' section names, and the router's upstream
//! filter after it. On the journey of `e2e chain::` it does what the five standalone modules do —
//! byte for byte at the upstream and the client, in filter state, in shared data and in
//! metrics — while Envoy calls one filter per callback instead of five.

use llm_gateway_tests::bench::config::{template, wasm_filters};
use llm_gateway_tests::harness::{FilterSpec, Fleet, Request, Response};
use llm_gateway_tests::journey::{chain_of, journey, metrics, shared_data, Form, EMAIL};
use llm_gateway_tests::{bundle, demo};
use serde_json::{json, Value};

/// The journey's summaries, with what necessarily differs between the forms left out: which
/// filter sent a local reply (one filter here, the refusing plugin's there) and how often each
/// filter cleared the route cache (counted per filter).
fn comparable(summaries: Vec<Value>) -> Vec<Value> {
    summaries
        .into_iter()
        .map(|mut s| {
            if let Some(reply) = s["local_reply"].as_object_mut() {
                reply.remove("filter");
            }
            if let Some(object) = s.as_object_mut() {
                object.remove("route_cache_cleared");
            }
            s
        })
        .collect()
}

fn the_fused_filter_does_what_the_modules_do(without: &[&str]) {
    let separate = chain_of(Form::Separate, without);
    let fused = chain_of(Form::Fused, without);
    let expected = comparable(journey(&separate));
    let got = comparable(journey(&fused));
    assert_eq!(got.len(), 6);
    for (i, (want, have)) in expected.iter().zip(&got).enumerate() {
        assert_eq!(
            have,
            want,
            "step {i}: the fused filter differs\nfused: {}\nseparate: {}",
            serde_json::to_string_pretty(have).unwrap(),
            serde_json::to_string_pretty(want).unwrap()
        );
    }
    // what the journey is, so that equal does not mean equally broken
    let sent = got[0]["upstream"]["body"].as_str().unwrap();
    assert!(
        sent.contains("[EMAIL_1]") && !sent.contains(EMAIL),
        "{sent}"
    );
    let received = got[0]["downstream"]["body"].as_str().unwrap();
    assert!(
        received.contains(EMAIL) && received.ends_with("data: [DONE]\n\n"),
        "{received}"
    );
    let record: Value =
        serde_json::from_str(got[0]["filter_state"]["wasm.llm_usage"].as_str().unwrap()).unwrap();
    assert_eq!(record["deployment"], "openai-mini", "{record}");
    for (step, status) in [(3, 401), (4, 403), (5, 404)] {
        assert_eq!(got[step]["local_reply"]["status"], status, "step {step}");
    }
    // the state left and every metric
    let vm_ids: std::collections::BTreeSet<String> = llm_gateway_tests::journey::gateway_filters()
        .into_iter()
        .map(|f| f.vm_id)
        .collect();
    let vm_ids: Vec<&str> = vm_ids.iter().map(String::as_str).collect();
    assert_eq!(
        shared_data(&fused, &[bundle::VM_ID]),
        shared_data(&separate, &vm_ids)
    );
    assert_eq!(metrics(&fused), metrics(&separate));
}

#[test]
fn the_fused_filter_does_what_the_five_modules_do_on_the_gateway_journey() {
    the_fused_filter_does_what_the_modules_do(&[]);
}

#[test]
fn without_a_section_its_stage_is_off_as_without_its_filter() {
    the_fused_filter_does_what_the_modules_do(&["token-ratelimit"]);
}

#[test]
fn a_fused_configuration_with_an_unknown_section_fails() {
    let spec = FilterSpec::plugin(bundle::MODULE, &json!({"pii": {}}))
        .unwrap()
        .root_id("llm-gateway")
        .vm_id(bundle::VM_ID);
    let Err(err) = Fleet::single(spec) else {
        panic!("configured");
    };
    assert!(err.contains("proxy_on_configure returned false"), "{err}");
    assert!(err.contains("unknown section"), "{err}");
}

/// gateway.yaml's usage record goes to filter state, which its access log prints; usage-accounting
/// (`"log_records": false`) writes no second copy as a log line, in either form, while the
/// record is published on every model call of the journey.
#[test]
fn gateway_yaml_logs_no_usage_record_line() {
    for form in [Form::Separate, Form::Fused] {
        let fleet = chain_of(form, &[]);
        let steps = journey(&fleet);
        for step in steps.iter().take(3) {
            assert!(
                step["filter_state"].get("wasm.llm_usage").is_some(),
                "{form:?}: {step}"
            );
        }
        // the listener filters: five VMs, or the fused one
        let filters = if form == Form::Fused { 1 } else { 5 };
        for filter in 0..filters {
            let logs = fleet.logs(0, 0, filter);
            assert!(
                logs.iter().all(|l| !l.message.contains("usage_record:")),
                "{form:?} filter {filter}: {logs:?}"
            );
        }
    }
}

/// gateway.yaml's fallback is the router's retries, so its key-auth (`"reentry": false`)
/// publishes no re-entry ticket, in either form, on any step of the journey; gateway-1.36.yaml's,
/// whose redirect re-enters the chain with the ticket, publishes one for an allowed request.
#[test]
fn only_the_redirect_gateway_publishes_re_entry_tickets() {
    for form in [Form::Separate, Form::Fused] {
        for (i, step) in journey(&chain_of(form, &[])).iter().enumerate() {
            let state = step["filter_state"].as_object().expect("filter state");
            assert!(
                state.contains_key("wasm.llm_route") || i >= 3,
                "{form:?} step {i}"
            );
            assert!(
                !state.contains_key("wasm.llm_reentry"),
                "{form:?} step {i}: {state:?}"
            );
        }
    }
    let old = wasm_filters(&template(demo::CONFIG_136).unwrap()).unwrap();
    let key_auth = old.iter().find(|f| f.root_id == "key-auth").unwrap();
    assert_eq!(key_auth.config.get("reentry"), None, "on by default");
    let fleet = Fleet::single(
        FilterSpec::plugin("key-auth", &key_auth.config)
            .unwrap()
            .root_id("key-auth"),
    )
    .unwrap();
    let request = Request::post("/v1/chat/completions")
        .header("authorization", &format!("Bearer {}", demo::DEMO_KEY))
        .header("x-request-id", "rid-1")
        .body(br#"{"model":"fast","messages":[]}"#);
    let ex = fleet
        .exchange(0, 0, &request, |_| Response::status(200).body(b"{}"))
        .unwrap();
    assert_eq!(ex.status(), 200, "{}", ex.text());
    let ticket = ex.filter_state.get("wasm.llm_reentry").expect("a ticket");
    assert!(ticket.starts_with(b"v1|"), "{ticket:?}");
}
