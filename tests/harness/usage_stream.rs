//! The compiled usage-accounting module in the wasmtime harness, a stream split at every byte
//! offset: the client always gets the same bytes (the usage-only chunk hidden, nothing else
//! changed) and the record always has the upstream's numbers.

use llm_gateway_tests::harness::{FilterSpec, Fleet, Request, Response};
use serde_json::{json, Value};

fn stream_body() -> (String, String) {
    let mut body = String::new();
    for i in 0..4 {
        body.push_str(&format!(
            "data: {{\"model\":\"gpt-4o-mini\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}}}}],\"usage\":null}}\r\n\r\n"
        ));
    }
    let usage_chunk = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":4,\"prompt_tokens_details\":{\"cached_tokens\":3}}}\r\n\r\n";
    let expected_client = format!("{body}data: [DONE]\r\n\r\n");
    body.push_str(usage_chunk);
    body.push_str("data: [DONE]\r\n\r\n");
    (body, expected_client)
}

#[test]
fn every_split_gives_the_same_client_bytes_and_usage() {
    let fleet = Fleet::single(
        FilterSpec::plugin(
            "usage-accounting",
            &json!({"price_version": "v", "prices": {"east": {"input": "0.30", "cached_input": "0.006", "output": "1.20"}}}),
        )
        .unwrap(),
    )
    .unwrap();
    let (body, expected_client) = stream_body();
    let request = Request::post("/v1/chat/completions")
        .header("x-llm-deployment", "east")
        .json(&json!({"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": "hi"}]}));
    for cut in 0..=body.len() {
        let ex = fleet
            .exchange(0, 0, &request, |upstream| {
                // the gateway asked for usage on the client's behalf
                let sent: Value = serde_json::from_slice(&upstream.body).unwrap();
                assert_eq!(sent["stream_options"]["include_usage"], true);
                Response::status(200)
                    .header("content-type", "text/event-stream")
                    .body(body.as_bytes())
                    .split_at(&[cut])
            })
            .unwrap();
        assert_eq!(ex.text(), expected_client, "cut at {cut}");
        let record: Value =
            serde_json::from_slice(ex.filter_state.get("wasm.llm_usage").unwrap()).unwrap();
        assert_eq!(record["usage"]["prompt_tokens"], 11, "cut at {cut}");
        assert_eq!(record["usage"]["completion_tokens"], 4);
        assert_eq!(record["usage"]["cached_prompt_tokens"], 3);
        assert_eq!(record["usage_source"], "upstream");
        // 8 × 0.30 + 3 × 0.006 + 4 × 1.20 per million, rounded once
        assert_eq!(record["cost_nano"], 7_218);
    }
}
