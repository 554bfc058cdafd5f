//! Fleet simulation: worker VMs of one instance share shared data (CAS conflicts between
//! them resolve by retry), instances keep separate shared data, every VM talks to one Redis.

use llm_gateway_tests::harness::stream::header_value;
use llm_gateway_tests::harness::{FilterSpec, Fleet, HttpCallOutcome, Stream};
use llm_gateway_tests::redis::Redis;
use serde_json::json;

const SERVICE: &str = "outbound|6379||redis.static";

fn fleet(redis: &Redis) -> Fleet {
    Fleet::builder()
        .filter(
            FilterSpec::plugin(
                "redis-probe",
                &json!({"name": "p", "redis_service": SERVICE, "timeout_ms": 500}),
            )
            .unwrap(),
        )
        .instances(2)
        .workers(4)
        .redis(SERVICE, redis.addr())
        .http_cluster("hold", |_| HttpCallOutcome::Response {
            headers: vec![(":status".into(), b"200".to_vec())],
            body: Vec::new(),
            trailers: Vec::new(),
        })
        .build()
        .unwrap()
}

fn start(fleet: &Fleet, instance: usize, worker: usize, path: &str, hold: bool) -> Stream {
    let s = fleet.stream(instance, worker).unwrap();
    let mut headers = vec![(":method", "GET"), (":path", path), (":authority", "t")];
    if hold {
        headers.push(("x-probe-hold", "1"));
    }
    s.send_request_headers(&headers, true).unwrap();
    s
}

fn upstream_header(s: &Stream, name: &str) -> Option<String> {
    let up = s.upstream();
    header_value(up.headers.as_ref()?, name).map(str::to_string)
}

#[test]
fn four_workers_times_two_instances_share_redis_and_not_shared_data() {
    let redis = Redis::start().unwrap();
    let fleet = fleet(&redis);
    assert_eq!((fleet.instances(), fleet.workers()), (2, 4));
    // one request per VM, all in flight at once, interleaved
    let mut streams = Vec::new();
    for worker in 0..4 {
        for instance in 0..2 {
            streams.push(start(&fleet, instance, worker, "/redis/incr/fleet", false));
            streams.push(start(&fleet, instance, worker, "/shared/incr/local", false));
        }
    }
    assert_eq!(fleet.pending(), 8, "one Redis call per Redis request");
    fleet.pump().unwrap();
    let mut redis_values: Vec<u32> = streams
        .iter()
        .step_by(2)
        .map(|s| {
            upstream_header(s, "x-probe-value")
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    redis_values.sort();
    assert_eq!(
        redis_values,
        (1..=8).collect::<Vec<_>>(),
        "one Redis for all 8 VMs"
    );
    // shared data: 4 increments per instance, each instance its own store
    for instance in 0..2 {
        let stored = fleet
            .services(instance)
            .shared_data
            .get("redis-probe", "local");
        assert_eq!(
            stored.map(|(v, _)| v),
            Some(b"4".to_vec()),
            "instance {instance}"
        );
    }
    for s in &streams {
        s.finish().unwrap();
    }
}

#[test]
fn a_cas_conflict_between_two_workers_is_resolved_by_retry() {
    let redis = Redis::start().unwrap();
    let fleet = fleet(&redis);
    // The key must exist first: a CAS of 0 (what a read of a missing key gives) means
    // "unconditional" to Envoy, so two first writers would both win.
    let seed = start(&fleet, 0, 2, "/shared/incr/cas", false);
    assert_eq!(
        upstream_header(&seed, "x-probe-value").as_deref(),
        Some("1")
    );
    // worker 0 reads the counter (1, cas) and waits for its hold call ...
    let slow = start(&fleet, 0, 0, "/shared/incr/cas", true);
    assert_eq!(fleet.pending(), 1);
    // ... worker 1 of the same instance increments meanwhile (no conflict for it) ...
    let fast = start(&fleet, 0, 1, "/shared/incr/cas", false);
    assert_eq!(
        upstream_header(&fast, "x-probe-value").as_deref(),
        Some("2")
    );
    assert_eq!(
        upstream_header(&fast, "x-probe-cas-retries").as_deref(),
        Some("0")
    );
    // ... and a worker of the other instance does not touch this instance's store
    let other = start(&fleet, 1, 0, "/shared/incr/cas", false);
    assert_eq!(
        upstream_header(&other, "x-probe-value").as_deref(),
        Some("1")
    );
    // worker 0 resumes: its CAS is stale, the host says CasMismatch, it re-reads and wins
    fleet.pump().unwrap();
    assert_eq!(
        upstream_header(&slow, "x-probe-value").as_deref(),
        Some("3")
    );
    assert_eq!(
        upstream_header(&slow, "x-probe-cas-retries").as_deref(),
        Some("1")
    );
    let stored = fleet.services(0).shared_data.get("redis-probe", "cas");
    assert_eq!(stored.map(|(v, _)| v), Some(b"3".to_vec()));
    seed.finish().unwrap();
    for s in [slow, fast, other] {
        s.finish().unwrap();
    }
}

#[test]
fn an_http_call_can_reach_a_real_loopback_server() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let upstream = runtime
        .block_on(mock_upstream::MockUpstream::start(
            "127.0.0.1:0".parse().unwrap(),
        ))
        .unwrap();
    let fleet = Fleet::builder()
        .filter(FilterSpec::plugin("redis-probe", &json!({"name": "p"})).unwrap())
        .http_cluster(
            "hold",
            llm_gateway_tests::harness::http_call::loopback(upstream.addr()),
        )
        .build()
        .unwrap();
    let s = start(&fleet, 0, 0, "/shared/incr/k", true);
    fleet.pump().unwrap();
    // the plugin resumed after the real server answered
    assert_eq!(upstream_header(&s, "x-probe-value").as_deref(), Some("1"));
    let seen = upstream.requests();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].path, "/hold");
    s.finish().unwrap();
}
