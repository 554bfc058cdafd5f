//! model-router's budget fallback in the harness (the compiled module): the router publishes
//! the fallback group's plan (`llm_route_budget_fallback`); the test plays token-ratelimit,
//! the filter that switches a request its budget refuses, by writing exactly what
//! `Alternative::switch_writes` says between the request and the response; then the router's
//! response path must follow the switched plan: headers, route info, `tried`, breakers.
//! A second test runs the router's upstream role on an attempt of the switched plan.

use llm_gateway_shared::price::MicroPrice;
use llm_gateway_shared::route_info::{Alternative, RouteInfo, SwitchWrites};
use llm_gateway_tests::harness::{FilterSpec, Fleet, Request, Stream};
use serde_json::{json, Value};

fn router_config() -> Value {
    json!({
        "version": "bf1",
        "max_attempts": 3,
        // one failure opens a breaker: the test sees which deployment a 503 was charged to
        "breaker": {"consecutive_failures": 1, "window": 10, "failure_rate_percent": 0,
                    "min_calls": 1, "cooldown_ms": 60000},
        "deployments": [
            {"name": "big", "cluster": "c-big", "model": "gpt-big", "provider": "openai",
             "credential": "cred-big", "price": {"input": 5000000, "output": 15000000}},
            {"name": "big2", "cluster": "c-big2", "model": "claude-big", "provider": "anthropic",
             "credential": "cred-big2", "price": {"input": 3000000, "output": 20000000}},
            {"name": "mini", "cluster": "c-mini", "model": "gpt-mini", "provider": "openai",
             "credential": "cred-mini", "price": {"input": 150000, "output": 600000}},
            {"name": "nano", "cluster": "c-nano", "model": "claude-nano", "provider": "anthropic",
             "credential": "cred-nano", "price": {"input": 100000, "output": 800000}}
        ],
        "groups": [
            {"name": "smart", "deployments": [{"deployment": "big"}, {"deployment": "big2"}],
             "budget_fallback": "cheap"},
            {"name": "cheap", "deployments": [{"deployment": "mini"}, {"deployment": "nano"}]},
            {"name": "solo", "deployments": [{"deployment": "big"}], "budget_fallback": "cheap"}
        ]
    })
}

fn downstream() -> Fleet {
    Fleet::single(
        FilterSpec::plugin("model-router", &router_config())
            .unwrap()
            .allow_on_headers_stop_iteration(true),
    )
    .unwrap()
}

fn body(group: &str) -> Value {
    json!({"model": group, "messages": [{"role": "user", "content": "hi"}]})
}

/// Sends the request through the router (no key-auth: `x-llm-groups` as key-auth sets it).
fn send_request(fleet: &Fleet, group: &str, allowed: &str) -> Stream {
    let stream = fleet.stream(0, 0).unwrap();
    let raw = body(group).to_string();
    stream.set_property("xds.route_name", "llm");
    stream
        .send_request_headers(
            &[
                (":method", "POST"),
                (":path", "/v1/chat/completions"),
                (":authority", "gateway.test"),
                ("content-type", "application/json"),
                ("content-length", &raw.len().to_string()),
                ("x-llm-groups", allowed),
            ],
            false,
        )
        .unwrap();
    fleet.pump().unwrap();
    stream.send_request_body(raw.as_bytes(), true).unwrap();
    fleet.pump().unwrap();
    assert!(
        stream.local_reply().is_none(),
        "{:?}\n{}",
        stream.local_reply(),
        fleet.log_text()
    );
    assert!(stream.upstream().end, "{}", fleet.log_text());
    stream
}

/// What token-ratelimit does when it switches (filter state; headers and body are the
/// upstream's business and are not read back by the router's response path).
fn play_the_switch(stream: &Stream, writes: &SwitchWrites) {
    for (property, value) in &writes.properties {
        stream.set_property(property, String::from_utf8(value.clone()).unwrap());
    }
}

fn answer(fleet: &Fleet, stream: &Stream, status: &str) {
    stream
        .send_response_headers(
            &[(":status", status), ("content-type", "application/json")],
            false,
        )
        .unwrap();
    fleet.pump().unwrap();
    stream.send_response_body(b"{}", true).unwrap();
    fleet.pump().unwrap();
}

fn response_header(stream: &Stream, name: &str) -> Option<String> {
    let down = stream.downstream();
    llm_gateway_tests::harness::stream::header_value(down.headers.as_ref()?, name)
        .map(str::to_string)
}

fn route(stream: &Stream) -> RouteInfo {
    RouteInfo::from_json(&stream.filter_state("wasm.llm_route").unwrap()).unwrap()
}

fn alternative(stream: &Stream) -> Option<Alternative> {
    stream
        .filter_state("wasm.llm_route_budget_fallback")
        .map(|bytes| Alternative::from_json(&bytes).expect("a consistent alternative"))
}

#[test]
fn the_response_path_follows_a_budget_switch() {
    let fleet = downstream();

    // 1. the router publishes the fallback group's plan next to its own
    let stream = send_request(&fleet, "smart", "smart,cheap");
    let first = route(&stream);
    assert_eq!(
        (first.model_group.as_str(), first.deployment.as_str()),
        ("smart", "big")
    );
    // prices in the router's form (micro-units per 1M tokens), as its configuration has them
    let ceiling = MicroPrice::from(first.price_ceiling.as_ref().unwrap());
    assert_eq!((ceiling.input, ceiling.output), (5_000_000, 20_000_000));
    let alt = alternative(&stream).unwrap();
    assert_eq!(alt.group(), "cheap");
    assert_eq!(alt.deployments, ["mini", "nano"]);
    assert_eq!(alt.clusters, ["c-mini", "c-nano"]);
    assert_eq!(
        alt.route.request_id, first.request_id,
        "one logical request"
    );
    assert_eq!(alt.route.model, "gpt-mini");
    let alt_ceiling = MicroPrice::from(alt.route.price_ceiling.as_ref().unwrap());
    assert_eq!((alt_ceiling.input, alt_ceiling.output), (150_000, 800_000));

    // 2. the budget refuses smart and switches to cheap; the first attempt (mini) fails
    play_the_switch(&stream, &alt.switch_writes());
    answer(&fleet, &stream, "503");
    assert_eq!(
        response_header(&stream, "x-llm-budget-fallback").as_deref(),
        Some("cheap")
    );
    assert_eq!(
        response_header(&stream, "x-llm-model-group").as_deref(),
        Some("cheap")
    );
    assert_eq!(
        response_header(&stream, "x-llm-deployment").as_deref(),
        Some("mini")
    );
    let served = route(&stream);
    assert_eq!(served.model_group, "cheap");
    assert_eq!(served.deployment, "mini");
    assert_eq!(served.tried, ["mini"]);
    assert_eq!(served.request_id, first.request_id);
    assert_eq!(
        served.price_ceiling, alt.route.price_ceiling,
        "kept on the response"
    );
    stream.finish().unwrap();
    assert_eq!(
        fleet.metric(0, "llm_gateway.model_router.budget_fallbacks"),
        Some(1)
    );
    assert_eq!(
        fleet.metric(0, "llm_gateway.model_router.served.cheap.mini"),
        Some(1)
    );

    // 3. the 503 was charged to mini's breaker, not big's: the next request still goes to
    //    big first, and its alternative now skips mini
    let stream = send_request(&fleet, "smart", "smart,cheap");
    assert_eq!(route(&stream).deployment, "big");
    let alt = alternative(&stream).unwrap();
    assert_eq!(alt.deployments, ["nano"]);
    assert_eq!(alt.route.model, "claude-nano");

    // 4. no switch: the router's own plan, no budget header
    answer(&fleet, &stream, "200");
    assert_eq!(response_header(&stream, "x-llm-budget-fallback"), None);
    assert_eq!(
        response_header(&stream, "x-llm-model-group").as_deref(),
        Some("smart")
    );
    assert_eq!(route(&stream).tried, ["big"]);
    stream.finish().unwrap();
    assert_eq!(
        fleet.metric(0, "llm_gateway.model_router.budget_fallbacks"),
        Some(1)
    );
}

#[test]
fn no_alternative_for_a_consumer_without_the_fallback_group_nor_a_group_without_one() {
    let fleet = downstream();
    let stream = send_request(&fleet, "smart", "smart");
    assert!(alternative(&stream).is_none());
    // a switch nobody was offered is not followed
    stream.set_property("llm_budget_fallback", "cheap");
    stream.set_property("llm_route_plan", "mini");
    answer(&fleet, &stream, "200");
    assert_eq!(response_header(&stream, "x-llm-budget-fallback"), None);
    assert_eq!(route(&stream).model_group, "smart");
    stream.finish().unwrap();

    let stream = send_request(&fleet, "cheap", "*");
    assert!(
        alternative(&stream).is_none(),
        "cheap has no budget_fallback"
    );
    stream.finish().unwrap();

    // a one-deployment group (credential set by the downstream role) has one too
    let stream = send_request(&fleet, "solo", "*");
    assert_eq!(
        stream
            .request_headers()
            .as_ref()
            .and_then(|h| llm_gateway_tests::harness::stream::header_value(h, "authorization"))
            .map(str::to_string)
            .as_deref(),
        Some("Bearer cred-big")
    );
    let writes = alternative(&stream).unwrap().switch_writes();
    assert!(writes.remove_headers.contains(&"authorization"));
    stream.finish().unwrap();
}

/// The router's upstream role on attempt 2 of the switched plan: the deployment, model and
/// credential of the alternative's second deployment, and no trace of the first plan's key.
#[test]
fn the_upstream_role_follows_the_switched_plan() {
    let mut config = router_config();
    config["role"] = json!("upstream");
    let fleet = Fleet::single(
        FilterSpec::plugin("model-router", &config)
            .unwrap()
            .root_id("model-router-upstream")
            .allow_on_headers_stop_iteration(true)
            .upstream_filter(true),
    )
    .unwrap();
    let downstream = downstream();
    let stream = send_request(&downstream, "solo", "*");
    let writes = alternative(&stream).unwrap().switch_writes();
    stream.finish().unwrap();

    let mut request = Request::post("/v1/chat/completions")
        .header("x-envoy-attempt-count", "2")
        // left by the first plan's credential had the switching filter not removed it: the
        // upstream role replaces it either way
        .header("authorization", "Bearer cred-big")
        .json(&body("gpt-mini"));
    for (property, value) in &writes.properties {
        request = request.property(property, String::from_utf8(value.clone()).unwrap());
    }
    // claude-nano is an Anthropic deployment: the chat body is translated for it, and its
    // Anthropic answer back into the body's API (Chat)
    let ex = fleet
        .exchange(0, 0, &request, |_| {
            llm_gateway_tests::harness::Response::json(&json!({
                "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-nano",
                "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                "usage": {"input_tokens": 3, "output_tokens": 1}}))
        })
        .unwrap();
    assert_eq!(ex.status(), 200);
    assert_eq!(ex.upstream_header("x-api-key"), Some("cred-nano"));
    assert_eq!(ex.upstream_header("authorization"), None);
    assert_eq!(ex.upstream_header(":path"), Some("/v1/messages"));
    let sent: Value = serde_json::from_slice(&ex.upstream.as_ref().unwrap().body).unwrap();
    assert_eq!(sent["model"], "claude-nano");
    assert!(sent["max_tokens"].as_u64().is_some_and(|n| n > 0), "{sent}");
    let answer = ex.json();
    assert_eq!(answer["object"], "chat.completion", "{answer}");
    assert_eq!(answer["choices"][0]["message"]["content"], "hi", "{answer}");
}
