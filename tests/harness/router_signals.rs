//! model-router's provider signals in the harness (the compiled module, two workers of one
//! instance, the harness's clock): the upstream role reads an attempt's 429 with
//! `retry-after`, cools the deployment down in the instance's shared data, and marks the
//! response for the route's retry when the group's `retry_on` has the status; the listener role
//! of the *other* worker plans around the cooling deployment until the clock passes the
//! deadline.

use llm_gateway_tests::harness::{FilterSpec, Fleet, Request, Response};
use serde_json::{json, Value};
use std::time::Duration;

fn router_config() -> Value {
    json!({
        "version": "sig1",
        "max_cooldown_ms": 10000,
        "deployments": [
            {"name": "a", "cluster": "c-a", "model": "gpt-a", "provider": "openai", "credential": "ka"},
            {"name": "b", "cluster": "c-b", "model": "gpt-b", "provider": "openai", "credential": "kb"}
        ],
        "groups": [
            {"name": "fast", "deployments": [{"deployment": "a"}, {"deployment": "b"}]},
            {"name": "strict", "deployments": [{"deployment": "a"}, {"deployment": "b"}],
             "retry_on": [500]}
        ]
    })
}

/// The listener role, then (last, as Envoy's router would run it) the upstream role, same
/// `vm_id`: one shared data per instance, two workers.
fn fleet() -> Fleet {
    let mut upstream = router_config();
    upstream["role"] = json!("upstream");
    Fleet::builder()
        .workers(2)
        .filter(
            FilterSpec::plugin("model-router", &router_config())
                .unwrap()
                .allow_on_headers_stop_iteration(true),
        )
        .filter(
            FilterSpec::plugin("model-router", &upstream)
                .unwrap()
                .root_id("model-router-upstream")
                .allow_on_headers_stop_iteration(true)
                .upstream_filter(true),
        )
        .build()
        .unwrap()
}

fn request(group: &str) -> Request {
    Request::post("/v1/chat/completions")
        .property("xds.route_name", "llm")
        .header("x-llm-groups", "*")
        .json(&json!({"model": group, "messages": [{"role": "user", "content": "hi"}]}))
}

/// The deployment the listener role chose for a request of `group` on `worker`, which the
/// provider answers with `answer`; and the exchange.
fn first_choice(
    fleet: &Fleet,
    worker: usize,
    group: &str,
    answer: Response,
) -> (String, llm_gateway_tests::harness::Exchange) {
    let ex = fleet
        .exchange(0, worker, &request(group), |_| answer)
        .unwrap();
    let chosen = ex
        .upstream_header("x-llm-deployment")
        .unwrap_or_else(|| panic!("not routed: {}", fleet.log_text()))
        .to_string();
    (chosen, ex)
}

fn ok() -> Response {
    Response::json(&json!({"object": "chat.completion", "model": "m"}))
}

#[test]
fn a_429_with_retry_after_cools_the_deployment_on_every_worker_until_the_deadline() {
    let fleet = fleet();
    let (chosen, ex) = first_choice(
        &fleet,
        0,
        "fast",
        Response::status(429).header("retry-after", "2"),
    );
    assert_eq!(chosen, "a");
    // the route would retry on the mark; the harness has no router: the client sees the 429,
    // without the mark (the listener role removes it)
    assert_eq!(ex.status(), 429);
    assert_eq!(ex.header("x-llm-fallback"), None);
    assert_eq!(
        fleet.metric(0, "llm_gateway.model_router.status_fallbacks.429"),
        Some(1)
    );
    assert_eq!(
        fleet.metric(0, "llm_gateway.model_router.cooldown.a"),
        Some(1)
    );
    // worker 1 plans around a for 2 s of the harness's clock
    let (chosen, _) = first_choice(&fleet, 1, "fast", ok());
    assert_eq!(chosen, "b");
    fleet.clock().advance(Duration::from_millis(1_900));
    let (chosen, _) = first_choice(&fleet, 1, "fast", ok());
    assert_eq!(chosen, "b");
    fleet.clock().advance(Duration::from_millis(100));
    let (chosen, _) = first_choice(&fleet, 1, "fast", ok());
    assert_eq!(chosen, "a", "the cooldown is over");
}

#[test]
fn a_long_signal_is_capped_and_a_group_marks_only_its_statuses() {
    let fleet = fleet();
    // an hour asked, max_cooldown_ms 10 s honoured
    first_choice(
        &fleet,
        0,
        "strict",
        Response::status(429).header("x-ratelimit-reset-requests", "1h0m0s"),
    );
    // `strict` retries only on 500: the 429 is not marked, but it still cools a down
    assert_eq!(
        fleet.metric(0, "llm_gateway.model_router.status_fallbacks.429"),
        None
    );
    fleet.clock().advance(Duration::from_millis(9_999));
    assert_eq!(first_choice(&fleet, 1, "fast", ok()).0, "b");
    fleet.clock().advance(Duration::from_millis(1));
    assert_eq!(first_choice(&fleet, 1, "fast", ok()).0, "a");
    // a 500 in `strict` is marked; a junk retry-after cools nothing
    first_choice(
        &fleet,
        0,
        "strict",
        Response::status(500).header("retry-after", "soon"),
    );
    assert_eq!(
        fleet.metric(0, "llm_gateway.model_router.status_fallbacks.500"),
        Some(1)
    );
    assert_eq!(
        fleet.metric(0, "llm_gateway.model_router.cooldown.a"),
        Some(1),
        "only the first signal cooled a down"
    );
    assert_eq!(first_choice(&fleet, 1, "fast", ok()).0, "a");
}
