//! The harness's Higress Redis bridge against a real `redis-server`, through the fixture
//! plugin `redis-probe` (`proxy_redis_call`, reply at the root context, buffer type 9, resume
//! of the paused request).

use llm_gateway_tests::harness::{
    Exchange, Fault, FaultProxy, FilterSpec, Fleet, Request, Response,
};
use llm_gateway_tests::redis::Redis;
use serde_json::json;
use std::time::Duration;

const SERVICE: &str = "outbound|6379||redis.static";

fn probe(timeout_ms: u32) -> FilterSpec {
    FilterSpec::plugin(
        "redis-probe",
        &json!({"name": "p", "redis_service": SERVICE, "timeout_ms": timeout_ms}),
    )
    .unwrap()
}

fn get(fleet: &Fleet, path: &str) -> Exchange {
    fleet
        .exchange(0, 0, &Request::get(path), |_| Response::status(204))
        .unwrap()
}

#[test]
fn a_request_pauses_for_redis_and_resumes_with_the_reply() {
    let redis = Redis::start().unwrap();
    let fleet = Fleet::builder()
        .filter(probe(500))
        .redis(SERVICE, redis.addr())
        .build()
        .unwrap();
    let stream = fleet.stream(0, 0).unwrap();
    stream
        .send_request_headers(
            &[
                (":method", "GET"),
                (":path", "/redis/incr/hits"),
                (":authority", "t"),
            ],
            true,
        )
        .unwrap();
    // paused until the test pumps: nothing reached the upstream, one call waits
    assert!(stream.upstream().headers.is_none());
    assert_eq!(fleet.pending(), 1);
    assert_eq!(fleet.pump().unwrap(), 1);
    let up = stream.upstream();
    assert!(up.end);
    let value = llm_gateway_tests::harness::stream::header_value(
        up.headers.as_ref().unwrap(),
        "x-probe-value",
    );
    assert_eq!(value, Some("1"));
    stream.finish().unwrap();

    for expected in ["2", "3"] {
        let ex = get(&fleet, "/redis/incr/hits");
        assert_eq!(ex.upstream_header("x-probe-value"), Some(expected));
    }
    // the plugin's view and Redis's agree
    assert_eq!(redis.command(&["GET", "hits"]).unwrap(), "$1\r\n3\r\n");
    let ex = get(&fleet, "/redis/get/missing");
    assert_eq!(ex.upstream_header("x-probe-value"), Some("null"));
    // a RESP error reply is a 502 from the plugin
    redis.command(&["SET", "text", "abc"]).unwrap();
    let ex = get(&fleet, "/redis/incr/text");
    assert_eq!(ex.status(), 502, "{}", ex.text());
    assert_eq!(ex.json()["error"]["code"], "redis_error");
    // the Redis round trips are in the cost of the root context, not of the requests
    let replies = fleet
        .costs()
        .into_iter()
        .filter(|c| c.callback == "proxy_on_redis_call_response")
        .count();
    assert_eq!(replies, 5);
}

#[test]
fn concurrent_requests_are_answered_in_call_order() {
    let redis = Redis::start().unwrap();
    let fleet = Fleet::builder()
        .filter(probe(500))
        .redis(SERVICE, redis.addr())
        .build()
        .unwrap();
    let streams: Vec<_> = (0..3)
        .map(|_| {
            let s = fleet.stream(0, 0).unwrap();
            s.send_request_headers(
                &[
                    (":method", "GET"),
                    (":path", "/redis/incr/n"),
                    (":authority", "t"),
                ],
                true,
            )
            .unwrap();
            s
        })
        .collect();
    assert_eq!(fleet.pending(), 3);
    // answer only the first: the others stay paused
    assert!(fleet.pump_one().unwrap());
    assert!(streams[0].upstream().end);
    assert!(streams[1].upstream().headers.is_none());
    fleet.pump().unwrap();
    let values: Vec<String> = streams
        .iter()
        .map(|s| {
            let up = s.upstream();
            llm_gateway_tests::harness::stream::header_value(
                up.headers.as_ref().unwrap(),
                "x-probe-value",
            )
            .unwrap()
            .to_string()
        })
        .collect();
    assert_eq!(values, ["1", "2", "3"]);
}

#[test]
fn redis_stopped_gives_a_defined_error_and_a_restart_heals() {
    let mut redis = Redis::start().unwrap();
    let fleet = Fleet::builder()
        .filter(probe(300))
        .redis(SERVICE, redis.addr())
        .build()
        .unwrap();
    assert_eq!(
        get(&fleet, "/redis/incr/c").upstream_header("x-probe-value"),
        Some("1")
    );

    redis.stop();
    let ex = get(&fleet, "/redis/incr/c");
    assert_eq!(ex.status(), 503, "{}", ex.text());
    assert_eq!(ex.json()["error"]["code"], "redis_unavailable");
    assert!(ex.upstream.is_none());
    assert!(fleet.log_text().contains("redis call failed, status 1"));

    redis.restart().unwrap();
    // a fresh, empty Redis (no persistence): the counter starts again
    let ex = get(&fleet, "/redis/incr/c");
    assert_eq!(ex.status(), 204, "{}", ex.text());
    assert_eq!(ex.upstream_header("x-probe-value"), Some("1"));
}

#[test]
fn slow_or_silent_redis_times_out_and_recovers() {
    let redis = Redis::start().unwrap();
    let proxy = FaultProxy::start(redis.addr()).unwrap();
    let fleet = Fleet::builder()
        .filter(probe(400))
        .redis(SERVICE, proxy.addr())
        .build()
        .unwrap();
    assert_eq!(
        get(&fleet, "/redis/incr/s").upstream_header("x-probe-value"),
        Some("1")
    );

    // slower than the plugin's timeout: a failed call
    proxy.set(Fault::Delay(Duration::from_millis(1200)));
    assert_eq!(get(&fleet, "/redis/incr/s").status(), 503);
    // silent: same
    proxy.set(Fault::Blackhole);
    assert_eq!(get(&fleet, "/redis/incr/s").status(), 503);
    // refused: same
    proxy.set(Fault::Refuse);
    assert_eq!(get(&fleet, "/redis/incr/s").status(), 503);
    // a little slow but within the timeout: fine
    proxy.set(Fault::Delay(Duration::from_millis(10)));
    let ex = get(&fleet, "/redis/incr/s");
    assert_eq!(ex.status(), 204, "{}", ex.text());
    // Each of the three failed INCRs may or may not have reached Redis (the proxy can be
    // in the middle of forwarding a delayed chunk when the fault changes; on a loaded machine
    // that happens), but none twice: the counter is the first call, at most three failed ones
    // and this one.
    let value: u32 = ex
        .upstream_header("x-probe-value")
        .unwrap()
        .parse()
        .unwrap();
    assert!((2..=5).contains(&value), "{value}");
}

#[test]
fn an_unknown_service_is_refused_at_configure() {
    let redis = Redis::start().unwrap();
    let err = Fleet::builder()
        .filter(probe(100))
        .redis("outbound|6379||other", redis.addr())
        .build()
        .err()
        .unwrap();
    assert!(err.contains("redis_init: BadArgument"), "{err}");
}
