//! usage-accounting in the wasmtime harness: the Higress build
//! (`dist/higress/usage-accounting.wasm`, in the harness's Higress mode) appends each record to a real Redis stream through Higress's Redis ABI, and
//! `scripts/usage-report --redis` reads it back; the plain build's cost per SSE event in wasm
//! fuel.

use llm_gateway_tests::harness::http_call::loopback;
use llm_gateway_tests::harness::{FilterSpec, Fleet, Host, Request, Response};
use llm_gateway_tests::redis::Redis;
use llm_gateway_tests::webdis::{Webdis, AUTH};
use serde_json::{json, Value};
use std::cell::Cell;
use std::rc::Rc;

const SERVICE: &str = "outbound|6379||redis.static";

fn config(ledger: bool) -> Value {
    let mut config = json!({
        "price_version": "2026-11",
        "prices": {"east": {"input": "0.30", "cached_input": "0.006", "output": "1.20"}}
    });
    if ledger {
        config["ledger"] = json!({"service": SERVICE, "stream": "llm:usage", "max_len": 1000});
    }
    config
}

fn chat(id: &str, stream: bool) -> Request {
    Request::post("/v1/chat/completions")
        .header("x-llm-request-id", id)
        .header("x-llm-tenant", "acme")
        .header("x-llm-deployment", "east")
        .header("x-llm-model-group", "fast")
        .header("x-project", "search")
        .json(&json!({
            "model": "gpt-4o-mini",
            "stream": stream,
            "messages": [{"role": "user", "content": "Say hello"}]
        }))
}

fn answer() -> Response {
    Response::json(&json!({
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 100,
                  "prompt_tokens_details": {"cached_tokens": 600}}
    }))
}

#[test]
fn every_record_is_appended_to_the_redis_stream() {
    let redis = Redis::start().unwrap();
    let fleet = Fleet::builder()
        .host(Host::Higress)
        .filter(FilterSpec::higress("usage-accounting", &config(true)).unwrap())
        .redis(SERVICE, redis.addr())
        .workers(2)
        .build()
        .unwrap();
    // the gateway's clock and Redis's agree, as in production (entry ids are Redis's clock)
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    fleet.clock().set_nanos(now.as_nanos() as u64);
    let mut ts_ms = 0;
    for (i, worker) in [0, 1, 0].into_iter().enumerate() {
        let ex = fleet
            .exchange(0, worker, &chat(&format!("ledger-{i}"), false), |_| {
                answer()
            })
            .unwrap();
        assert_eq!(ex.status(), 200);
        let record: Value =
            serde_json::from_slice(ex.filter_state.get("wasm.llm_usage").unwrap()).unwrap();
        assert_eq!(record["cost_nano"], 243_600, "{record}");
        ts_ms = record["ts_ms"].as_u64().unwrap();
    }
    // the appends do not hold any request: their replies come after
    fleet.pump().unwrap();
    assert_eq!(fleet.metric_sum("llm_gateway.usage.ledger_errors"), 0);

    assert_eq!(redis.command(&["XLEN", "llm:usage"]).unwrap(), ":3\r\n");
    // scripts/usage-report reads the stream back
    // the month of the records, on the harness's clock
    let month = {
        let m = usage_accounting::report::Month::containing(ts_ms);
        format!("{}-{:02}", m.year, m.month)
    };
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_usage-report"))
        .args([
            "--csv",
            "--month",
            &month,
            "--redis",
            &redis.addr().to_string(),
        ])
        .output()
        .unwrap();
    let csv = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        csv.lines().nth(1),
        Some("acme,search,fast,3,0,3000,1800,300,0.600,0.0007308,USD"),
        "{csv}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_failing_redis_is_counted_and_never_fails_the_request() {
    let redis = Redis::start().unwrap();
    let fleet = Fleet::builder()
        .host(Host::Higress)
        .filter(FilterSpec::higress("usage-accounting", &config(true)).unwrap())
        .redis(SERVICE, redis.addr())
        .build()
        .unwrap();
    // a key of the wrong type: every XADD is a RESP error
    redis
        .command(&["SET", "llm:usage", "not a stream"])
        .unwrap();
    let ex = fleet
        .exchange(0, 0, &chat("bad-1", false), |_| answer())
        .unwrap();
    assert_eq!(ex.status(), 200);
    fleet.pump().unwrap();
    assert_eq!(fleet.metric_sum("llm_gateway.usage.ledger_errors"), 1);
    assert!(
        fleet.log_text().contains("ledger append failed"),
        "{}",
        fleet.log_text()
    );
}

/// The plain build's ledger over HTTP to a real webdis in front of a real Redis, two workers.
/// Requests hand their appends to the root context through a shared queue, so that webdis's
/// answer, which comes after the request has ended, is still read: a failed append is counted.
#[test]
fn over_webdis_the_root_sends_the_appends_and_counts_a_failed_one() {
    let redis = Redis::start().unwrap();
    let webdis = Webdis::start(redis.addr()).unwrap();
    let mut config = config(false);
    config["ledger"] = json!({"transport": "http", "cluster": "webdis", "auth": AUTH,
                              "stream": "llm:usage", "max_len": 1000});
    let calls = Rc::new(Cell::new(0u32));
    let counted = calls.clone();
    let mut forward = loopback(webdis.addr());
    let fleet = Fleet::builder()
        .filter(FilterSpec::plugin("usage-accounting", &config).unwrap())
        .http_cluster("webdis", move |request| {
            counted.set(counted.get() + 1);
            forward(request)
        })
        .workers(2)
        .build()
        .unwrap();
    for (i, worker) in [0, 1].into_iter().enumerate() {
        let ex = fleet
            .exchange(0, worker, &chat(&format!("webdis-{i}"), false), |_| {
                answer()
            })
            .unwrap();
        assert_eq!(ex.status(), 200);
    }
    fleet.pump().unwrap();
    assert_eq!(calls.get(), 2, "one append per record");
    assert_eq!(redis.command(&["XLEN", "llm:usage"]).unwrap(), ":2\r\n");
    assert_eq!(fleet.metric_sum("llm_gateway.usage.ledger_errors"), 0);

    // a key of the wrong type: the XADD is a RESP error, answered after the request ended
    redis.command(&["DEL", "llm:usage"]).unwrap();
    redis
        .command(&["SET", "llm:usage", "not a stream"])
        .unwrap();
    let ex = fleet
        .exchange(0, 1, &chat("webdis-bad", false), |_| answer())
        .unwrap();
    assert_eq!(ex.status(), 200, "a ledger failure never fails the request");
    fleet.pump().unwrap();
    assert_eq!(calls.get(), 3);
    assert_eq!(fleet.metric_sum("llm_gateway.usage.ledger_errors"), 1);
    let log = fleet.log_text();
    assert!(log.contains("ledger append failed"), "{log}");
    assert!(!log.contains("Say hello"), "the prompt is never logged");
}

#[test]
fn cost_per_sse_event_in_fuel() {
    // a 2 000-event stream, one event per body callback, through the plain build
    let fleet =
        Fleet::single(FilterSpec::plugin("usage-accounting", &config(false)).unwrap()).unwrap();
    let mut body = String::new();
    let mut offsets = Vec::new();
    for i in 0..1_998 {
        body.push_str(&format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-4o-mini\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}},\"finish_reason\":null}}],\"usage\":null}}\n\n"
        ));
        offsets.push(body.len());
    }
    body.push_str("data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":1998}}\n\n");
    offsets.push(body.len());
    body.push_str("data: [DONE]\n\n");
    let ex = fleet
        .exchange(0, 0, &chat("fuel-1", true), |_| {
            Response::status(200)
                .header("content-type", "text/event-stream")
                .body(body.as_bytes())
                .split_at(&offsets)
        })
        .unwrap();
    // the client did not ask for usage: the usage chunk is hidden
    let text = ex.text();
    assert!(
        !text.contains("\"choices\":[]"),
        "usage chunk reached the client"
    );
    assert!(text.ends_with("data: [DONE]\n\n"));
    let record: Value =
        serde_json::from_slice(ex.filter_state.get("wasm.llm_usage").unwrap()).unwrap();
    assert_eq!(record["usage"]["completion_tokens"], 1998, "{record}");
    let body_calls: Vec<_> = ex
        .cost
        .iter()
        .filter(|c| c.callback == "proxy_on_response_body")
        .collect();
    assert_eq!(body_calls.len(), 2_000);
    let fuel: u64 = body_calls.iter().map(|c| c.fuel).sum();
    let mut per_call: Vec<u64> = body_calls.iter().map(|c| c.fuel).collect();
    per_call.sort_unstable();
    // figures for the report; the test asserts only that they were measured
    println!(
        "usage-accounting fuel per SSE event (one event per body callback, hiding on): mean {}, median {}, max {}",
        fuel / 2_000,
        per_call[per_call.len() / 2],
        per_call[per_call.len() - 1]
    );
    assert!(fuel > 0);
}
