//! The harness's Envoy semantics, shown with the fixture plugin `redis-probe`: chain order,
//! cumulative bodies under `Pause`, headers frozen after `Continue`, `set_buffer_bytes`
//! appends, the buffer limit, chunk splits, filter state between filters, traps.

use llm_gateway_tests::harness::{Direction, FilterSpec, Fleet, Request, Response};
use serde_json::json;

fn probe(name: &str) -> FilterSpec {
    FilterSpec::plugin("redis-probe", &json!({ "name": name }))
        .unwrap()
        .vm_id(name)
}

fn body_request(body: &[u8], splits: &[usize]) -> Request {
    Request::post("/v1/chat/completions")
        .body(body)
        .split_at(splits)
}

#[test]
fn request_in_chain_order_response_in_reverse() {
    let fleet = Fleet::builder()
        .filter(probe("a"))
        .filter(probe("b"))
        .filter(probe("c"))
        .build()
        .unwrap();
    let ex = fleet
        .exchange(0, 0, &Request::get("/x"), |_| Response::status(200))
        .unwrap();
    assert_eq!(ex.upstream_header("x-probe-path"), Some("a,b,c"));
    assert_eq!(ex.header("x-probe-path"), Some("c,b,a"));
}

#[test]
fn a_paused_body_is_cumulative_at_every_split() {
    let body = b"0123456789abcdefghij";
    for splits in [
        vec![],
        vec![1],
        vec![5, 10, 15],
        (1..20).collect::<Vec<_>>(),
    ] {
        let fleet = Fleet::single(probe("a")).unwrap();
        let ex = fleet
            .exchange(0, 0, &body_request(body, &splits), |_| {
                Response::status(200)
            })
            .unwrap();
        let state = |k: &str| {
            String::from_utf8(ex.filter_state[&format!("wasm.probe.a.{k}")].clone()).unwrap()
        };
        // each callback paused until the end; the last one saw all 20 bytes at once
        assert_eq!(state("body_size"), "20", "{splits:?}");
        assert_eq!(
            state("body_callbacks"),
            (splits.len() + 1).to_string(),
            "{splits:?}"
        );
        // the upstream got the whole body once, with the append at the end
        let up = ex.upstream.unwrap();
        assert_eq!(up.body, b"0123456789abcdefghij|a", "{splits:?}");
    }
}

#[test]
fn headers_are_frozen_after_continue_unless_held() {
    // the probe continues its headers: a header change from a body callback is refused
    let fleet = Fleet::single(probe("a")).unwrap();
    let ex = fleet
        .exchange(0, 0, &body_request(b"{}", &[]), |_| Response::status(200))
        .unwrap();
    assert_eq!(ex.filter_state["wasm.probe.a.late_header"], b"BadArgument");
    assert_eq!(ex.upstream_header("x-probe-late"), None);
}

#[test]
fn stop_all_holds_the_body_until_resume() {
    // the shared-data route with x-probe-hold pauses the headers until an HTTP call
    // answers: under Envoy's default StopAllIterationAndWatermark the body waits at the
    // filter without body callbacks
    let fleet = Fleet::builder()
        .filter(probe("a"))
        .http_cluster("hold", |_| {
            llm_gateway_tests::harness::HttpCallOutcome::Failure
        })
        .build()
        .unwrap();
    let s = fleet.stream(0, 0).unwrap();
    s.send_request_headers(
        &[
            (":method", "POST"),
            (":path", "/shared/incr/k"),
            (":authority", "t"),
            ("x-probe-hold", "1"),
        ],
        false,
    )
    .unwrap();
    s.send_request_body(b"abc", false).unwrap();
    s.send_request_body(b"def", true).unwrap();
    assert_eq!(s.paused(), vec![(0, Direction::Request)]);
    let before: Vec<_> = s.costs().iter().map(|c| c.callback).collect();
    assert!(!before.contains(&"proxy_on_request_body"), "{before:?}");
    assert!(s.upstream().headers.is_none());
    // the hold call answers: the filter resumes; it now gets the whole body in one callback
    fleet.pump().unwrap();
    let up = s.upstream();
    assert!(up.end);
    assert_eq!(up.body, b"abcdef|a");
    let bodies = s
        .costs()
        .iter()
        .filter(|c| c.callback == "proxy_on_request_body")
        .count();
    assert_eq!(bodies, 1);
    s.finish().unwrap();
}

#[test]
fn over_the_buffer_limit_the_request_gets_413_and_a_started_response_a_reset() {
    let fleet = Fleet::builder()
        .filter(probe("a"))
        .buffer_limit(16)
        .build()
        .unwrap();
    let ex = fleet
        .exchange(0, 0, &body_request(&[b'x'; 40], &[10, 20, 30]), |_| {
            Response::status(200)
        })
        .unwrap();
    assert_eq!(ex.status(), 413, "{}", ex.text());
    assert_eq!(
        ex.local_reply.as_ref().unwrap().details,
        "request_payload_too_large"
    );
    assert_eq!(ex.local_reply.as_ref().unwrap().filter, None);

    let ex = fleet
        .exchange(0, 0, &Request::get("/x"), |_| {
            Response::status(200)
                .body(&[b'y'; 40])
                .split_at(&[10, 20, 30])
        })
        .unwrap();
    // the probe let the response headers go downstream before it buffered the body: too
    // late for a 500, Envoy resets the stream
    assert_eq!(ex.status(), 200);
    assert!(ex.downstream.reset);
    assert!(ex.local_reply.is_none());
}

#[test]
fn a_local_reply_passes_only_filters_that_saw_the_request() {
    // a refuses (no Redis service configured: 503 before any call); b and c never run,
    // their contexts are never created, so the reply passes a only (Envoy 1.36+ skips wasm
    // filters whose context does not exist). The reverse order over several filters is in
    // harness key_auth::two_key_auth_filters_a_refusal_short_circuits_the_second.
    let fleet = Fleet::builder()
        .filter(probe("a"))
        .filter(probe("b"))
        .filter(probe("c"))
        .build()
        .unwrap();
    let ex = fleet
        .exchange(0, 0, &Request::get("/redis/incr/k"), |_| {
            Response::status(200)
        })
        .unwrap();
    assert_eq!(ex.status(), 503);
    assert_eq!(ex.local_reply.as_ref().unwrap().filter, Some(0));
    assert_eq!(ex.header("x-probe-path"), Some("a"));
    // b and c get a context only for proxy_on_log (Envoy 1.40 does the same)
    let later: Vec<_> = ex
        .cost
        .iter()
        .filter(|c| c.filter != 0)
        .map(|c| c.callback)
        .collect();
    assert!(
        later.iter().all(|cb| [
            "proxy_on_context_create",
            "proxy_on_log",
            "proxy_on_done",
            "proxy_on_delete"
        ]
        .contains(cb)),
        "{later:?}"
    );
}

#[test]
fn filter_state_set_by_one_filter_is_visible_to_the_next() {
    let fleet = Fleet::builder()
        .filter(probe("a"))
        .filter(probe("b"))
        .build()
        .unwrap();
    let ex = fleet
        .exchange(0, 0, &body_request(b"hello", &[2]), |_| {
            Response::status(200)
        })
        .unwrap();
    // both wrote their own keys into the same request's filter state
    assert_eq!(ex.filter_state["wasm.probe.a.body_size"], b"5");
    // b saw a's append: 5 bytes + "|a"
    assert_eq!(ex.filter_state["wasm.probe.b.body_size"], b"7");
    assert_eq!(ex.upstream.unwrap().body, b"hello|a|b");
}

#[test]
fn an_unknown_import_fails_at_instantiation_with_its_name() {
    // a module importing a function the harness does not define
    let dir = llm_gateway_tests::workspace::TempDir::new("harness-import").unwrap();
    let path = dir.path().join("bad.wasm");
    // (module (import "env" "proxy_does_not_exist" (func)) (memory (export "memory") 1)
    //         (func (export "proxy_abi_version_0_2_1")))
    let wasm: &[u8] = &[
        0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version
        0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // type: () -> ()
        0x02, 0x1c, 0x01, 0x03, b'e', b'n', b'v', 0x14, b'p', b'r', b'o', b'x', b'y', b'_', b'd',
        b'o', b'e', b's', b'_', b'n', b'o', b't', b'_', b'e', b'x', b'i', b's', b't', 0x00, 0x00,
        0x03, 0x02, 0x01, 0x00, // func section: one func of type 0
        0x05, 0x03, 0x01, 0x00, 0x01, // memory 1
        0x07, 0x24, 0x02, 0x06, b'm', b'e', b'm', b'o', b'r', b'y', 0x02, 0x00, 0x17, b'p', b'r',
        b'o', b'x', b'y', b'_', b'a', b'b', b'i', b'_', b'v', b'e', b'r', b's', b'i', b'o', b'n',
        b'_', b'0', b'_', b'2', b'_', b'1', 0x00, 0x01, // exports
        0x0a, 0x04, 0x01, 0x02, 0x00, 0x0b, // code: empty body
    ];
    std::fs::write(&path, wasm).unwrap();
    let spec = FilterSpec {
        path,
        ..probe("bad")
    };
    let err = Fleet::single(spec).err().unwrap();
    assert!(err.contains("proxy_does_not_exist"), "{err}");
}

fn hold_headers(allow: bool) -> (Fleet, llm_gateway_tests::harness::Stream) {
    let fleet = Fleet::single(probe("a").allow_on_headers_stop_iteration(allow)).unwrap();
    let s = fleet.stream(0, 0).unwrap();
    s.send_request_headers(
        &[
            (":method", "POST"),
            (":path", "/hold-headers"),
            (":authority", "t"),
        ],
        false,
    )
    .unwrap();
    s.send_request_body(b"ab", false).unwrap();
    s.send_request_body(b"cd", true).unwrap();
    (fleet, s)
}

#[test]
fn allow_on_headers_stop_iteration_delivers_the_body_to_a_filter_holding_headers() {
    let (_fleet, s) = hold_headers(true);
    // body callbacks arrived while the headers were held, and could still change them
    assert_eq!(
        s.filter_state("wasm.probe.a.late_header").as_deref(),
        Some(&b"ok"[..])
    );
    assert_eq!(
        s.filter_state("wasm.probe.a.body_callbacks").as_deref(),
        Some(&b"2"[..])
    );
    let up = s.upstream();
    assert!(up.end);
    assert_eq!(up.body, b"abcd|a");
    let headers = up.headers.unwrap();
    assert_eq!(
        llm_gateway_tests::harness::stream::header_value(&headers, "x-probe-late"),
        Some("1")
    );
    s.finish().unwrap();
}

#[test]
fn without_it_pausing_the_headers_withholds_the_body_for_good() {
    // Envoy's default StopAllIterationAndWatermark: no body callback ever comes, and a
    // plugin that waits for the body to release the headers hangs the request
    let (_fleet, s) = hold_headers(false);
    assert!(s
        .costs()
        .iter()
        .all(|c| c.callback != "proxy_on_request_body"));
    assert!(s.upstream().headers.is_none());
    assert_eq!(s.paused(), vec![(0, Direction::Request)]);
    s.finish().unwrap();
}

#[test]
fn a_trap_fails_with_the_plugin_log_and_the_vm_stays_failed() {
    let fleet = Fleet::single(probe("a")).unwrap();
    let err = fleet
        .exchange(0, 0, &Request::get("/trap"), |_| Response::status(200))
        .err()
        .unwrap();
    assert!(err.contains("trapped in proxy_on_request_headers"), "{err}");
    assert!(err.contains("redis-probe: about to trap"), "{err}");
    assert!(err.contains("trap requested"), "{err}");
    // like Envoy, a VM that trapped serves no more requests
    let err = fleet
        .exchange(0, 0, &Request::get("/x"), |_| Response::status(200))
        .err()
        .unwrap();
    assert!(err.contains("VM failed earlier"), "{err}");
}

#[test]
fn ticks_metrics_and_queues() {
    let fleet = Fleet::builder()
        .filter(FilterSpec::plugin("redis-probe", &json!({"name": "a", "tick_ms": 1000})).unwrap())
        .workers(3)
        .build()
        .unwrap();
    // one tick per worker VM, like Envoy
    assert_eq!(fleet.tick().unwrap(), 3);
    fleet.clock().advance(std::time::Duration::from_secs(5));
    assert_eq!(fleet.tick().unwrap(), 3);
    assert_eq!(
        fleet.metric(0, "redis_probe.ticks"),
        Some(6),
        "one stat for all workers"
    );
    assert_eq!(
        fleet.metric(0, "redis_probe.last_tick_secs"),
        Some(fleet.clock().now_secs())
    );
    // every tick enqueued one item; the queue's owner (the last VM to register it) got
    // notified when pumped
    assert_eq!(fleet.pending(), 6);
    fleet.pump().unwrap();
    assert_eq!(fleet.metric(0, "redis_probe.queue_items"), Some(6));
    // a histogram records samples
    fleet
        .exchange(0, 1, &body_request(b"12345", &[2]), |_| {
            Response::status(200)
        })
        .unwrap();
    assert_eq!(
        fleet.services(0).metrics.samples("redis_probe.body_size"),
        Some(vec![5])
    );
}

#[test]
fn set_buffer_bytes_replaces_at_zero_appends_at_the_end_and_refuses_the_middle() {
    let fleet = Fleet::single(probe("a")).unwrap();
    let request = body_request(b"original", &[3]).header("x-probe-replace", "new!");
    let ex = fleet
        .exchange(0, 0, &request, |_| Response::status(200))
        .unwrap();
    assert_eq!(ex.filter_state["wasm.probe.a.replace"], b"ok");
    assert_eq!(ex.filter_state["wasm.probe.a.mid_write"], b"BadArgument");
    assert_eq!(ex.upstream.unwrap().body, b"new!|a");
}

#[test]
fn a_local_reply_is_refused_once_the_response_headers_went_downstream() {
    let fleet = Fleet::single(probe("a")).unwrap();
    let ex = fleet
        .exchange(0, 0, &Request::get("/late-reply"), |_| {
            Response::status(200).body(b"upstream body").split_at(&[4])
        })
        .unwrap();
    assert_eq!(ex.filter_state["wasm.probe.a.late_reply"], b"BadArgument");
    assert_eq!(ex.status(), 200);
    assert_eq!(ex.downstream.body, b"upstream body");
    assert!(ex.local_reply.is_none());
}

#[test]
fn a_response_held_at_its_headers_gets_500_over_the_limit() {
    // headers held with allow_on_headers_stop_iteration: the body callbacks come and buffer
    // (StopIterationAndBuffer), the headers have not gone downstream: 500
    let fleet = Fleet::builder()
        .filter(probe("a").allow_on_headers_stop_iteration(true))
        .buffer_limit(16)
        .build()
        .unwrap();
    let ex = fleet
        .exchange(0, 0, &Request::get("/hold-response"), |_| {
            Response::status(200)
                .body(&[b'z'; 40])
                .split_at(&[10, 20, 30])
        })
        .unwrap();
    assert_eq!(ex.status(), 500, "{}", ex.text());
    assert_eq!(
        ex.local_reply.as_ref().unwrap().details,
        "response_payload_too_large"
    );
    assert_eq!(ex.text(), "Internal Server Error");

    // without it (StopAllIterationAndWatermark) Envoy applies backpressure instead: no error,
    // the response just waits behind the held headers
    let fleet = Fleet::builder()
        .filter(probe("a"))
        .buffer_limit(16)
        .build()
        .unwrap();
    let s = fleet.stream(0, 0).unwrap();
    s.send_request_headers(
        &[
            (":method", "GET"),
            (":path", "/hold-response"),
            (":authority", "t"),
        ],
        true,
    )
    .unwrap();
    s.send_response_headers(&[(":status", "200")], false)
        .unwrap();
    s.send_response_body(&[b'z'; 40], true).unwrap();
    assert!(s.local_reply().is_none());
    assert!(s.downstream().headers.is_none());
    assert_eq!(s.paused(), vec![(0, Direction::Response)]);
    s.finish().unwrap();
}

#[test]
fn an_empty_end_of_stream_callback_sees_the_cumulative_body() {
    // what Envoy 1.40 does with an HTTP/1 request body: the data, then (size, eos) again
    // with no new bytes (proxy_on_request_body(2, 104, 0), then (2, 104, 1) in its trace)
    let fleet = Fleet::single(probe("a")).unwrap();
    let request = body_request(b"0123456789", &[]).then_empty_end();
    let ex = fleet
        .exchange(0, 0, &request, |_| {
            Response::status(200).body(b"ok").then_empty_end()
        })
        .unwrap();
    let body_callbacks = ex
        .cost
        .iter()
        .filter(|c| c.callback == "proxy_on_request_body")
        .count();
    assert_eq!(body_callbacks, 2);
    assert_eq!(ex.filter_state["wasm.probe.a.body_size"], b"10");
    assert_eq!(ex.filter_state["wasm.probe.a.body_callbacks"], b"2");
    assert_eq!(ex.upstream.unwrap().body, b"0123456789|a");
    assert_eq!(ex.downstream.body, b"ok");
}
