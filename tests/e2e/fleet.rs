//! A fleet end to end: two real Envoy processes (`--concurrency 2` each, plain-Envoy builds of
//! the chain key-auth -> usage-accounting -> token-ratelimit, `envoy-config/e2e-fleet.yaml`)
//! share one budget, one rate limit and one usage ledger in one real `redis-server`, reached
//! over HTTP through one real `webdis` (`redis: {"transport": "http"}`, the ACL of
//! `envoy-config/webdis.json`). A fault proxy between webdis and Redis stands for "Redis
//! down"; stopping webdis for "webdis down".
//!
//! Figures are printed (`--nocapture`): what was admitted and refused on each instance, what
//! the budget key holds against the sum of the usage records (drift), reservations left,
//! journal entries appended and replayed, and ledger entries against usage records.

use llm_gateway_tests::envoy::{Envoy, Options};
use llm_gateway_tests::harness::{Fault, FaultProxy};
use llm_gateway_tests::http::{self, Response};
use llm_gateway_tests::redis::Redis;
use llm_gateway_tests::webdis::{Webdis, AUTH};
use llm_gateway_tests::workspace::sha256_hex;
use mock_upstream::MockUpstream;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEY: &str = "sk-e2e-fleet-77c1d2";
const STREAM: &str = "llm:usage";
const MAX_TOKENS: u64 = 256;

struct Fleet {
    redis: Redis,
    proxy: FaultProxy,
    webdis: std::sync::Mutex<Webdis>,
    _upstream: MockUpstream,
    envoys: Vec<Envoy>,
}

fn one_line(v: &Value) -> String {
    v.to_string().replace('\'', "''")
}

fn redis_config() -> Value {
    json!({"transport": "http", "cluster": "webdis", "auth": AUTH, "timeout_ms": 1000})
}

fn ledger_config() -> Value {
    json!({"ledger": {"transport": "http", "cluster": "webdis", "auth": AUTH, "stream": STREAM}})
}

impl Fleet {
    async fn start(ratelimit: Value) -> Fleet {
        let redis = Redis::start().unwrap();
        let proxy = FaultProxy::start(redis.addr()).unwrap();
        let webdis = Webdis::start(proxy.addr()).unwrap();
        let upstream = MockUpstream::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let key_auth = json!({"keys": [
            {"key_sha256": sha256_hex(KEY.as_bytes()), "consumer": "team-fleet", "tenant": "acme", "groups": ["*"]}
        ]});
        let vars = vec![
            ("MOCK_PORT", upstream.addr().port().to_string()),
            ("WEBDIS_PORT", webdis.addr().port().to_string()),
            ("KEY_AUTH_CONFIG", one_line(&key_auth)),
            ("USAGE_CONFIG", one_line(&ledger_config())),
            ("RATELIMIT_CONFIG", one_line(&ratelimit)),
        ];
        let envoys = tokio::task::spawn_blocking(move || {
            let options = Options {
                concurrency: 2,
                trace_wasm: false,
                ..Options::default()
            };
            (0..2)
                .map(|_| Envoy::start_with("e2e-fleet.yaml", &vars, &options).unwrap())
                .collect::<Vec<_>>()
        })
        .await
        .unwrap();
        Fleet {
            redis,
            proxy,
            webdis: std::sync::Mutex::new(webdis),
            _upstream: upstream,
            envoys,
        }
    }

    /// A streaming chat on instance `instance`: `chunks` completion tokens, `delay_ms` between
    /// events.
    async fn chat(&self, instance: usize, tag: &str, chunks: u64, delay_ms: u64) -> Response {
        let body = json!({
            "model": "gpt-4o-mini",
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": format!("fleet request {tag}: say something")}]
        });
        http::post(format!(
            "{}/v1/chat/completions",
            self.envoys[instance].url()
        ))
        .header("authorization", &format!("Bearer {KEY}"))
        .header("content-type", "application/json")
        .header("x-test-tag", tag)
        .header("x-mock-chunks", &chunks.to_string())
        .header("x-mock-chunk-delay-ms", &delay_ms.to_string())
        .body(body.to_string().into_bytes())
        .send()
        .await
        .unwrap()
    }

    /// The access-log line of `tag` on `instance` (every filter's `on_log` ran).
    async fn logged(&self, instance: usize, tag: &str) -> Value {
        self.envoys[instance]
            .access_log_line("access.log", tag, |l| (l["tag"] == tag).then_some(l))
            .await
    }

    /// The usage record of a logged request, if usage-accounting published one.
    async fn record(&self, instance: usize, tag: &str) -> Option<Value> {
        let line = self.logged(instance, tag).await;
        serde_json::from_str(line["usage"].as_str().unwrap_or_default()).ok()
    }

    fn redis_int(&self, command: &[&str]) -> i64 {
        let reply = self.redis.command(command).unwrap();
        if let Some(n) = reply.strip_prefix(':') {
            return n.trim().parse().unwrap();
        }
        if reply.starts_with("$-1") {
            return 0;
        }
        reply.lines().nth(1).unwrap().parse().unwrap()
    }

    /// What the budget holds (its one key: one tenant, one day).
    fn spent(&self) -> i64 {
        let keys = self
            .redis
            .command(&["KEYS", "llm:*:bud:tenant-day:*"])
            .unwrap();
        let keys: Vec<&str> = keys.lines().filter(|l| l.starts_with("llm:")).collect();
        assert!(keys.len() <= 1, "one budget key: {keys:?}");
        keys.first().map_or(0, |key| self.redis_int(&["GET", key]))
    }

    /// Reservations not reconciled (tombstones of cancelled ones, `n` = 0, do not count).
    fn reservations_left(&self) -> usize {
        let keys = self.redis.command(&["KEYS", "llm:*:res:*"]).unwrap();
        keys.lines()
            .filter(|l| l.starts_with("llm:"))
            .filter(|key| self.redis.command(&["HGET", key, "n"]).unwrap() != "$1\r\n0\r\n")
            .count()
    }

    /// A token-ratelimit counter summed over both instances.
    fn metric(&self, name: &str) -> u64 {
        self.envoys
            .iter()
            .map(|e| {
                e.stat(&format!("wasmcustom.llm_gateway.ratelimit.{name}"))
                    .unwrap()
                    .unwrap_or(0)
            })
            .sum()
    }

    /// Waits until `done` holds (settlements leave from the next tick, replays after the
    /// retry time), at most 15 s.
    async fn until(&self, what: &str, done: impl Fn(&Fleet) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "{what}: never\n{}",
                self.envoys[0].logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Outcome of a batch of concurrent requests.
#[derive(Debug, Default)]
struct Outcome {
    /// (instance, tag) of each 200.
    admitted: Vec<(usize, String)>,
    refused: usize,
    unavailable: usize,
    per_instance: [usize; 2],
}

/// Sends `tags` concurrently, alternating the instances; `chunks(i)` tokens each.
async fn burst(
    fleet: &Arc<Fleet>,
    tags: Vec<String>,
    chunks: impl Fn(usize) -> u64,
    delay_ms: u64,
) -> Outcome {
    let tasks: Vec<_> = tags
        .into_iter()
        .enumerate()
        .map(|(i, tag)| {
            let fleet = fleet.clone();
            let n = chunks(i);
            tokio::spawn(async move {
                let instance = i % 2;
                let response = fleet.chat(instance, &tag, n, delay_ms).await;
                (instance, tag, response)
            })
        })
        .collect();
    let mut out = Outcome::default();
    for task in tasks {
        let (instance, tag, response) = task.await.unwrap();
        match response.status {
            200 => {
                assert!(response.text().contains("[DONE]"), "{}", response.text());
                out.per_instance[instance] += 1;
                out.admitted.push((instance, tag));
            }
            402 => out.refused += 1,
            503 => out.unavailable += 1,
            other => panic!("{tag}: status {other}: {}", response.text()),
        }
    }
    out
}

/// Σ total tokens of the usage records of `admitted`.
async fn actual(fleet: &Fleet, admitted: &[(usize, String)]) -> i64 {
    let mut sum = 0;
    for (instance, tag) in admitted {
        let record = fleet
            .record(*instance, tag)
            .await
            .unwrap_or_else(|| panic!("{tag}: no usage record"));
        sum += record["usage"]["total_tokens"].as_i64().unwrap();
    }
    sum
}

fn budget(tokens: u64, on_failure: &str) -> Value {
    json!({
        "redis": redis_config(),
        "budgets": [{"name": "tenant-day", "by": "tenant", "period": "day", "tokens": tokens,
                     "on_redis_failure": on_failure}]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_share_one_budget_and_one_ledger_through_webdis() {
    // ~270 tokens reserved a request (prompt + the 256 cap), 15..=215 used: 200 requests
    // offer about three times the budget at once
    const BUDGET: u64 = 30_000;
    let fleet = Arc::new(Fleet::start(budget(BUDGET, "reject")).await);
    // one request on each instance first: its VMs and connections warm, the scripts cached
    let warm = burst(&fleet, vec!["w0".into(), "w1".into()], |_| 10, 0).await;
    assert_eq!(warm.per_instance, [1, 1]);
    let tags: Vec<String> = (0..200).map(|i| format!("b{i}")).collect();
    let started = Instant::now();
    let out = burst(&fleet, tags.clone(), |i| 15 + (i as u64 * 37) % 200, 5).await;
    let mut admitted = warm.admitted.clone();
    admitted.extend(out.admitted.iter().cloned());
    let elapsed = started.elapsed();
    // every request logged (settled in on_log), then the settlements landed (next tick)
    for (i, tag) in tags.iter().enumerate() {
        fleet.logged(i % 2, tag).await;
    }
    fleet
        .until("no reservation left", |f| f.reservations_left() == 0)
        .await;
    let actual = actual(&fleet, &admitted).await;
    fleet.until("drift 0", |f| f.spent() == actual).await;
    let spent = fleet.spent();
    // every usage record in the stream, once
    let mut records = 0;
    let warm_tags = ["w0".to_string(), "w1".to_string()];
    let all = tags.iter().chain(warm_tags.iter());
    for (i, tag) in all.enumerate() {
        if fleet.record(i % 2, tag).await.is_some() {
            records += 1;
        }
    }
    fleet
        .until("every record in the ledger", |f| {
            f.redis_int(&["XLEN", STREAM]) >= records
        })
        .await;
    let ledger = fleet.redis_int(&["XLEN", STREAM]);
    eprintln!(
        "fleet budget: 200 concurrent streams over 2 Envoys x 2 workers in {:.1} s, budget {BUDGET}, admitted {} ({} + {}), refused 402 {}, 503 {}; spent {spent} (overshoot {}), Σactual {actual} (drift {}), reservations left {}, usage records {records}, ledger entries {ledger}, Redis calls {}",
        elapsed.as_secs_f64(),
        out.admitted.len(),
        out.per_instance[0],
        out.per_instance[1],
        out.refused,
        out.unavailable,
        (spent - BUDGET as i64).max(0),
        spent - actual,
        fleet.reservations_left(),
        fleet.metric("redis_calls.reserve") + fleet.metric("redis_calls.reconcile"),
    );
    assert!(spent <= BUDGET as i64, "overshoot: {spent} > {BUDGET}");
    assert_eq!(spent, actual, "drift");
    assert_eq!(fleet.reservations_left(), 0);
    assert_eq!(
        ledger, records,
        "every usage record lands in the stream once"
    );
    // not vacuous: both sides of the budget, on both instances
    assert!(
        out.refused > 0 && out.per_instance.iter().all(|&n| n > 0),
        "{out:?}"
    );
    assert_eq!(
        out.unavailable,
        0,
        "{}",
        fleet
            .envoys
            .iter()
            .map(|e| e.logs())
            .collect::<Vec<_>>()
            .join("\n")
            .lines()
            .filter(|l| l.contains("token-ratelimit") || l.contains("usage-accounting"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // the budget is the fleet's, not each instance's: together they stayed under one budget
    // that each alone would have been allowed to fill
    assert_eq!(out.admitted.len() + out.refused, 200);
}

/// Streams admitted before an outage end while it lasts: their settlements are journaled and
/// replayed exactly once when Redis (or webdis) is back; requests that arrive during it follow
/// `on_redis_failure`.
async fn outage(kind: &str, on_failure: &str) {
    const BUDGET: u64 = 1_000_000;
    let fleet = Arc::new(Fleet::start(budget(BUDGET, on_failure)).await);
    // before: settles normally
    let before = burst(
        &fleet,
        (0..20).map(|i| format!("pre{i}")).collect(),
        |_| 20,
        0,
    )
    .await;
    assert_eq!(before.admitted.len(), 20);
    // long streams (~1.5 s), admitted, then the outage
    let long_fleet = fleet.clone();
    let long = tokio::spawn(async move {
        burst(
            &long_fleet,
            (0..10).map(|i| format!("long{i}")).collect(),
            |_| 60,
            25,
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    match kind {
        "redis" => fleet.proxy.set(Fault::Refuse),
        _ => fleet.webdis.lock().unwrap().stop(),
    }
    let during = burst(
        &fleet,
        (0..10).map(|i| format!("during{i}")).collect(),
        |_| 20,
        0,
    )
    .await;
    let long = long.await.unwrap();
    assert_eq!(long.admitted.len(), 10, "admitted before the outage");
    for (instance, tag) in &long.admitted {
        fleet.logged(*instance, tag).await;
    }
    // a settlement is journaled when its RECONCILE fails, which may come a Redis timeout after
    // the request's log line: wait for all ten before Redis comes back
    fleet
        .until("the long streams' settlements journaled", |f| {
            f.metric("journal_appended") >= 10
        })
        .await;
    let appended = fleet.metric("journal_appended");
    // back
    match kind {
        "redis" => fleet.proxy.set(Fault::Pass),
        _ => fleet.webdis.lock().unwrap().restart().unwrap(),
    }
    let mut admitted = before.admitted.clone();
    admitted.extend(long.admitted.iter().cloned());
    admitted.extend(during.admitted.iter().cloned());
    let actual = actual(&fleet, &admitted).await;
    fleet
        .until("journal replayed", |f| f.spent() == actual)
        .await;
    fleet
        .until("no reservation left", |f| f.reservations_left() == 0)
        .await;
    fleet
        .until("journal drained", |f| {
            f.metric("journal_replayed") >= f.metric("journal_appended")
        })
        .await;
    // settled twice would show here: a replay is a no-op the second time
    tokio::time::sleep(Duration::from_millis(500)).await;
    let spent = fleet.spent();
    let replayed = fleet.metric("journal_replayed");
    eprintln!(
        "fleet outage[{kind} down, on_redis_failure {on_failure}]: during it {} served, {} refused 503; journal appended {} (during the outage {appended}), replayed {replayed}; spent {spent}, Σactual {actual} (drift {}), reservations left {}",
        during.admitted.len(),
        during.unavailable,
        fleet.metric("journal_appended"),
        spent - actual,
        fleet.reservations_left(),
    );
    assert_eq!(spent, actual, "drift after the replay");
    assert_eq!(fleet.reservations_left(), 0);
    assert!(
        appended >= 10,
        "the long streams' settlements were journaled"
    );
    assert_eq!(
        replayed,
        fleet.metric("journal_appended"),
        "replayed once each"
    );
    match on_failure {
        "reject" => assert_eq!(
            (during.admitted.len(), during.unavailable),
            (0, 10),
            "on_redis_failure reject: 503 while Redis is away"
        ),
        _ => assert_eq!(
            (during.admitted.len(), during.unavailable),
            (10, 0),
            "on_redis_failure allow: served and journaled"
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_mid_run_rejects_then_replays_the_journal_once() {
    outage("redis", "reject").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webdis_down_mid_run_serves_then_replays_the_journal_once() {
    outage("webdis", "allow").await;
}

/// 1 M tokens a minute, as a per-second limit (16 667 tokens/s: a minute-long window would
/// need a minute to drain its first burst before anything steady could be measured), offered
/// at twice its rate over both instances, open loop, for six one-second windows. Each request
/// asks for 256 tokens at most and uses exactly its prompt (the mock's formula) plus 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tpm_limit_offered_twice_its_rate_over_both_instances_admits_at_most_105_percent() {
    const PER_SECOND: u64 = 1_000_000 / 60;
    const WINDOWS: u64 = 6;
    const CHUNKS: u64 = 200;
    let fleet = Arc::new(
        Fleet::start(json!({
            "redis": redis_config(),
            "limits": [{"name": "tenant-tps", "by": "tenant", "tokens": PER_SECOND, "per": "second"}],
            "lease": {"batch_percent": 10, "sync_ms": 100}
        }))
        .await,
    );
    let warm = burst(&fleet, vec!["w0".into(), "w1".into()], |_| 1, 0).await;
    assert_eq!(warm.per_instance, [1, 1]);
    // a request's real use: the mock's prompt formula (ceil(chars / 4) + 4) plus its tokens
    let used = |tag: &str| -> u64 {
        let chars = format!("fleet request {tag}: say something")
            .chars()
            .count() as u64;
        chars.div_ceil(4) + 4 + CHUNKS
    };
    let per_request = used("r000");
    let interval = Duration::from_secs_f64(per_request as f64 / (2.0 * PER_SECOND as f64));
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let mut tasks = Vec::new();
    let mut i = 0u64;
    loop {
        let at = start + interval.mul_f64(i as f64);
        if at >= start + Duration::from_secs(WINDOWS) {
            break;
        }
        let fleet = fleet.clone();
        let tag = format!("r{i:03}");
        let window = (at - start).as_secs();
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let response = fleet.chat((i % 2) as usize, &tag, CHUNKS, 0).await;
            (window, tag, response.status)
        }));
        i += 1;
    }
    let mut offered = vec![0u64; WINDOWS as usize];
    let mut admitted = vec![0u64; WINDOWS as usize];
    let (mut refused, mut other) = (0, 0);
    for task in tasks {
        let (window, tag, status) = task.await.unwrap();
        let w = window as usize;
        offered[w] += used(&tag);
        match status {
            200 => admitted[w] += used(&tag),
            429 => refused += 1,
            _ => other += 1,
        }
    }
    for w in 0..WINDOWS as usize {
        eprintln!(
            "fleet rate window {w} ({}): limit {PER_SECOND} tokens/s (1 M TPM), offered {} ({:.0} %), admitted {} ({:.1} %)",
            if w == 0 { "cold start" } else { "steady" },
            offered[w],
            offered[w] as f64 * 100.0 / PER_SECOND as f64,
            admitted[w],
            admitted[w] as f64 * 100.0 / PER_SECOND as f64,
        );
    }
    let steady: u64 = admitted.iter().skip(1).sum();
    let steady_limit = PER_SECOND * (WINDOWS - 1);
    eprintln!(
        "fleet rate steady windows: admitted {steady} of {steady_limit} ({:.1} %), {refused} refused 429, {other} other; Redis calls (leases) {}",
        steady as f64 * 100.0 / steady_limit as f64,
        fleet.metric("redis_calls.lease"),
    );
    assert_eq!(other, 0, "only 200 and 429");
    assert!(
        steady * 100 <= steady_limit * 105,
        "admitted {steady} in the steady windows, limit {steady_limit}"
    );
    // not vacuous: offered twice the limit, most of the limit is served
    assert!(steady * 100 >= steady_limit * 80, "admitted only {steady}");
    assert!(refused > 0);
}

/// `envoy-config/gateway-fleet.yaml` as `scripts/run --fleet` starts it (two gateways, the
/// whole chain, one webdis, one Redis): a request through each gateway lands in the same
/// budget keys and the same ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_demo_gateways_share_their_budgets_and_ledger() {
    use llm_gateway_tests::demo::{FleetDemo, DEMO_KEY, FLEET_LEDGER};
    let fleet = FleetDemo::start(0).await.unwrap();
    let body = json!({"model": "fast", "messages": [{"role": "user", "content": "hello fleet"}]});
    for gateway in &fleet.gateways {
        let response = http::post(format!("{}/v1/chat/completions", gateway.url()))
            .header("authorization", &format!("Bearer {DEMO_KEY}"))
            .header("content-type", "application/json")
            .body(body.to_string().into_bytes())
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status,
            200,
            "{}\n{}",
            response.text(),
            gateway
                .logs()
                .lines()
                .filter(|l| l.contains("token-ratelimit:"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ledger = fleet.redis.command(&["XLEN", FLEET_LEDGER]).unwrap();
        let keys = fleet
            .redis
            .command(&["KEYS", "llm:*:bud:tenant-month:*"])
            .unwrap();
        let key = keys.lines().find(|l| l.starts_with("llm:"));
        let spent = key.map(|k| fleet.redis.command(&["GET", k]).unwrap());
        // both requests in the one month budget of tenant `demo`, and in the ledger
        if ledger == ":2\r\n" && spent.as_deref().is_some_and(|s| !s.starts_with("$-1")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ledger {ledger:?}, budget keys {keys:?}\n{}",
            fleet.gateways[0].logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(fleet.banner().contains(&fleet.gateways[1].url()));

    // A failed append is counted although webdis answers after the request has ended: the
    // request hands its append to the root context (a shared queue), which gets the answer.
    // The stream's key of the wrong type makes every XADD a RESP error.
    let errors = || {
        fleet.gateways[0]
            .stat("wasmcustom.llm_gateway.usage.ledger_errors")
            .unwrap()
            .unwrap_or(0)
    };
    assert_eq!(errors(), 0);
    fleet.redis.command(&["DEL", FLEET_LEDGER]).unwrap();
    fleet
        .redis
        .command(&["SET", FLEET_LEDGER, "not a stream"])
        .unwrap();
    let response = http::post(format!("{}/v1/chat/completions", fleet.gateways[0].url()))
        .header("authorization", &format!("Bearer {DEMO_KEY}"))
        .header("content-type", "application/json")
        .body(body.to_string().into_bytes())
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status, 200,
        "a ledger failure never fails the request"
    );
    // the counter moves with the answer; Envoy writes its log file a moment later
    let deadline = Instant::now() + Duration::from_secs(10);
    while errors() < 1 || !fleet.gateways[0].logs().contains("ledger append failed") {
        assert!(
            Instant::now() < deadline,
            "the failed append was never counted and logged (count {})\n{}",
            errors(),
            fleet.gateways[0].logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(errors(), 1);
}
