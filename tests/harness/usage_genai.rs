//! usage-accounting's OpenTelemetry GenAI metrics in the harness (the compiled module): the
//! names it defines carry the attributes, the provider comes from the router's route info,
//! and the samples are the record's values.

use llm_gateway_shared::route_info::RouteInfo;
use llm_gateway_tests::harness::{Fleet, Request, Response};
use llm_gateway_tests::workloads;
use serde_json::{json, Value};

fn route_info() -> String {
    let info = RouteInfo {
        request_id: "g-1".into(),
        model_group: "smart".into(),
        deployment: "claude-east".into(),
        model: "claude-sonnet-4".into(),
        provider: "anthropic".into(),
        price: None,
        price_version: None,
        route_version: "v1".into(),
        attempts: 1,
        tried: Vec::new(),
        price_ceiling: None,
        client_api: None,
    };
    String::from_utf8(info.to_json()).unwrap()
}

#[test]
fn genai_series_carry_the_attributes_and_the_records_values() {
    let fleet = Fleet::single(workloads::usage().unwrap()).unwrap();
    let request = Request::post("/v1/messages")
        .header("x-llm-request-id", "g-1")
        .header("x-llm-tenant", "acme")
        .header("x-llm-model-group", "smart")
        .header("x-llm-deployment", "claude-east")
        .property("llm_route", route_info())
        .json(&json!({"model": "claude-sonnet-4", "max_tokens": 50,
            "messages": [{"role": "user", "content": "Say hello"}]}));
    let ex = fleet
        .exchange(0, 0, &request, |_| {
            Response::json(&json!({
                "type": "message", "role": "assistant", "model": "claude-sonnet-4-5-20250929",
                "content": [{"type": "text", "text": "hi"}],
                "usage": {"input_tokens": 120, "output_tokens": 7}
            }))
        })
        .unwrap();
    assert_eq!(ex.status(), 200);
    let record: Value =
        serde_json::from_slice(ex.filter_state.get("wasm.llm_usage").unwrap()).unwrap();
    assert_eq!(record["model"], "claude-sonnet-4-5-20250929", "{record}");
    let route = ".tenant.acme.model_group.smart.deployment.claude-east";
    let gen_ai = ".gen_ai_operation_name.chat.gen_ai_provider_name.anthropic\
                  .gen_ai_request_model.smart.gen_ai_response_model.claude-sonnet-4-5-20250929";
    let samples = |base: &str| {
        fleet
            .services(0)
            .metrics
            .samples(&format!("{base}{route}{gen_ai}"))
            .unwrap_or_else(|| {
                panic!(
                    "{base} not defined; names: {:?}",
                    fleet.services(0).metrics.names()
                )
            })
    };
    assert_eq!(
        samples("gen_ai.client.token.usage.gen_ai_token_type.input"),
        [120]
    );
    assert_eq!(
        samples("gen_ai.client.token.usage.gen_ai_token_type.output"),
        [7]
    );
    assert_eq!(
        samples("gen_ai.client.operation.duration_milliseconds"),
        [record["duration_ms"].as_u64().unwrap()]
    );
    // not a stream: no first token, so neither time to it nor per token after it
    assert_eq!(
        samples("gen_ai.server.time_to_first_token_milliseconds"),
        Vec::<u64>::new()
    );
    assert_eq!(
        samples("gen_ai.server.time_per_output_token_microseconds"),
        Vec::<u64>::new()
    );
    // the route-labelled series are unchanged
    assert_eq!(
        fleet.metric(
            0,
            &format!("llm_gateway.usage.tokens.token_type.input{route}")
        ),
        Some(120)
    );
}
