//! Mixed traffic through the whole chain with the Higress builds, and the books it is checked
//! against: the fault-injection suite (`harness/redis_faults.rs`) and the soak
//! (`src/bin/soak.rs`) drive the same code.
//!
//! The chain is `gateway.yaml`'s order with the Redis-backed builds: key-auth, model-router
//! (downstream role), pii-redaction, usage-accounting (every record appended to the Redis
//! stream ledger) and token-ratelimit (buckets leased from Redis, budgets reserved and
//! reconciled there), all five their Higress builds (`dist/higress/`) in the harness's
//! Higress mode. The test plays Envoy's router and the provider: once a
//! request reached the upstream whole, it answers with a JSON completion or an SSE stream of
//! several events (usage in the provider's own usage chunk); some clients go away mid-stream.
//! Many streams are open at once on every worker of every instance, interleaved at random
//! (seeded), and asynchronous work (Redis calls) happens when [`Traffic::step`] pumps.
//!
//! What a run produced is in [`Traffic::finished`]: one [`Outcome`] per request with
//! usage-accounting's record (what the access log prints); [`Books`] reads the budget
//! counters, reservations, replay markers and the ledger stream back from Redis.

use super::{FilterSpec, Fleet, Host, Stream};
use llm_gateway_shared::resp::{self, Limits, Reply, RespError};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The Redis service name both Higress builds are configured with.
pub const SERVICE: &str = "outbound|6379||redis.static";
/// The ledger's stream key.
pub const LEDGER: &str = "llm:usage";
/// token-ratelimit's `vm_id` (its shared data: buckets, journal).
pub const RATELIMIT_VM: &str = "token-ratelimit";
/// Virtual keys of `envoy-config/e2e-key-auth.json`: consumers `team-a` and `team-b`, both of
/// tenant `acme`.
pub const KEYS: [(&str, &str); 2] = [
    ("sk-e2e-team-a-4f1c9a7e2b", "team-a"),
    ("sk-e2e-team-b-8d03e61f5a", "team-b"),
];
/// Nano-USD per token of deployment `a` (model group `fast`'s first choice in the router
/// configuration of `workloads::router_config`): 150 000 and 600 000 micro-USD per 1M.
pub const PRICE_NANO: (u64, u64) = (150, 600);

/// `user-rpm`: requests per minute of one end user (`x-user-id`, [`Mix::user_percent`]).
pub const USER_RPM: u64 = 60;
/// `lease.emergency_percent` of [`ratelimit_config`].
pub const EMERGENCY_PERCENT: u64 = 5;

/// token-ratelimit's configuration for the runs: per-key request and token limits, a per-user
/// request limit, a tenant token budget and a money budget per consumer, both
/// `on_redis_failure: allow` (served and journaled while Redis is away). `clock: gateway` (the
/// harness's clock).
pub fn ratelimit_config(timeout_ms: u32, requests_per_minute: u64) -> Value {
    json!({
        "redis": {"service": SERVICE, "timeout_ms": timeout_ms},
        "clock": "gateway",
        "default_max_tokens": 256,
        "limits": [
            {"name": "key-rpm", "by": "key", "requests": requests_per_minute, "per": "minute"},
            {"name": "key-tpm", "by": "key", "tokens": 50_000_000u64, "per": "minute"},
            {"name": "user-rpm", "by": "user", "requests": USER_RPM, "per": "minute"}
        ],
        "budgets": [
            {"name": "tenant-day", "by": "tenant", "period": "day", "tokens": 4_000_000_000_000u64,
             "on_redis_failure": "allow"},
            {"name": "consumer-day", "by": "consumer", "period": "day", "money": "1000000.00",
             "currency": "USD", "on_redis_failure": "allow"}
        ],
        "lease": {"batch_percent": 5, "low_percent": 50, "sync_ms": 100,
                  "emergency_percent": EMERGENCY_PERCENT, "retry_ms": 1000},
        "journal_capacity": 100000
    })
}

/// usage-accounting's configuration: the ledger on [`SERVICE`], prices from the router.
pub fn usage_config(timeout_ms: u32) -> Value {
    json!({"ledger": {"service": SERVICE, "stream": LEDGER, "timeout_ms": timeout_ms}})
}

/// The chain on `instances` × `workers`, Redis at `redis` (a real server, or a fault proxy in
/// front of one).
pub fn fleet(
    redis: SocketAddr,
    instances: usize,
    workers: usize,
    ratelimit: &Value,
    usage: &Value,
) -> crate::Result<Fleet> {
    let fleet = Fleet::builder()
        .host(Host::Higress)
        .filter(crate::workloads::key_auth()?.into_higress()?)
        .filter(crate::workloads::router_downstream()?.into_higress()?)
        .filter(crate::workloads::pii()?.into_higress()?)
        .filter(FilterSpec::higress("usage-accounting", usage)?.root_id("usage-accounting"))
        .filter(FilterSpec::higress("token-ratelimit", ratelimit)?.root_id("token-ratelimit"))
        .redis(SERVICE, redis)
        .instances(instances)
        .workers(workers)
        .build()?;
    Ok(fleet)
}

// ---------------------------------------------------------------------------------------
// Seeded randomness

/// SplitMix64: the same trace on every run of a seed.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// Uniform in `0..len` (`len` > 0).
    pub fn index(&mut self, len: usize) -> usize {
        (self.next_u64() % len.max(1) as u64) as usize
    }

    /// True with `percent` % probability.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
}

// ---------------------------------------------------------------------------------------
// Traffic

/// The shape of the traffic.
#[derive(Debug, Clone)]
pub struct Mix {
    /// Streams open at once, at most.
    pub max_live: usize,
    /// Requests started per step, at most (when below `max_live`).
    pub starts_per_step: usize,
    /// Response events sent per step, at most.
    pub events_per_step: usize,
    /// Percent of requests that stream (SSE).
    pub stream_percent: u64,
    /// Percent of streaming requests whose client goes away mid-stream.
    pub abort_percent: u64,
    /// Percent of requests that carry an e-mail address (pii-redaction masks it).
    pub pii_percent: u64,
    /// Requests go to this consumer only (index into [`KEYS`]); `None`: either.
    pub only_key: Option<usize>,
    /// Percent of requests that carry `x-user-id: <user>` (the `user-rpm` limit applies to
    /// them only).
    pub user_percent: u64,
    /// The end user of those requests.
    pub user: String,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            max_live: 24,
            starts_per_step: 3,
            events_per_step: 6,
            stream_percent: 70,
            abort_percent: 15,
            pii_percent: 20,
            only_key: None,
            user_percent: 0,
            user: "burst".into(),
        }
    }
}

/// One finished request.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Sequence number of the request in the run.
    pub seq: u64,
    /// The consumer whose key it used.
    pub consumer: String,
    /// Where it ran.
    pub instance: usize,
    /// Where it ran.
    pub worker: usize,
    /// The client asked for SSE.
    pub stream: bool,
    /// It carried `x-user-id` (the `user-rpm` limit applied).
    pub user: bool,
    /// The status the client got (200, or the local reply's).
    pub status: u16,
    /// The error code of a local reply.
    pub code: Option<String>,
    /// It went upstream.
    pub admitted: bool,
    /// The client went away before the end.
    pub aborted: bool,
    /// The response reached the client whole (or the local reply did).
    pub complete_for_client: bool,
    /// [`Traffic::phase`] when it was admitted or refused.
    pub admitted_in: u32,
    /// [`Traffic::phase`] when it ended (its record was appended then).
    pub finished_in: u32,
    /// usage-accounting's record (filter state `wasm.llm_usage`, what the access log prints).
    pub record: Option<Value>,
}

impl Outcome {
    /// The record's request id.
    pub fn request_id(&self) -> Option<&str> {
        self.record.as_ref()?["request_id"].as_str()
    }

    /// The record's total tokens (0 without a record).
    pub fn total_tokens(&self) -> u64 {
        self.record
            .as_ref()
            .and_then(|r| r["usage"]["total_tokens"].as_u64())
            .unwrap_or(0)
    }

    /// The record's cost in nano-USD (0 without one).
    pub fn cost_nano(&self) -> u64 {
        self.record
            .as_ref()
            .and_then(|r| r["cost_nano"].as_u64())
            .unwrap_or(0)
    }
}

struct Live {
    seq: u64,
    consumer: String,
    stream: Stream,
    instance: usize,
    worker: usize,
    sse: bool,
    user: bool,
    cap: u64,
    /// Response pieces, sent one per event (the last with end of stream).
    events: Vec<Vec<u8>>,
    /// Pieces sent (0: not even the headers).
    sent: usize,
    abort_after: Option<usize>,
    admitted_in: u32,
}

/// Mixed traffic on a fleet.
pub struct Traffic {
    fleet: Fleet,
    rng: Rng,
    mix: Mix,
    live: Vec<Live>,
    /// Started, not yet admitted or refused (after the next pump they are).
    arriving: Vec<Live>,
    next: u64,
    /// Requests that ended, in order.
    pub finished: Vec<Outcome>,
    /// A label the caller moves between phases of a run (outcomes carry it).
    pub phase: u32,
    since_tick_ms: u64,
    sync_ms: u64,
}

impl Traffic {
    /// Traffic on `fleet`, seeded.
    pub fn new(fleet: Fleet, seed: u64, mix: Mix) -> Traffic {
        Traffic {
            fleet,
            rng: Rng(seed),
            mix,
            live: Vec::new(),
            arriving: Vec::new(),
            next: 0,
            finished: Vec::new(),
            phase: 0,
            since_tick_ms: 0,
            sync_ms: 100,
        }
    }

    /// The fleet.
    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    /// The mix.
    pub fn mix(&self) -> &Mix {
        &self.mix
    }

    /// Changes the mix.
    pub fn set_mix(&mut self, mix: Mix) {
        self.mix = mix;
    }

    /// Streams open (admitted, response not ended).
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// Requests started so far.
    pub fn started(&self) -> u64 {
        self.next
    }

    /// Moves the clock by `ms` and fires the ticks (token-ratelimit's sync worker: top-ups,
    /// journal replay) of every `sync_ms` crossed, pumping after each.
    pub fn advance(&mut self, ms: u64) -> crate::Result<()> {
        let mut left = ms;
        while left > 0 {
            let to_tick = self.sync_ms - self.since_tick_ms;
            let by = left.min(to_tick);
            self.fleet.clock().advance(Duration::from_millis(by));
            self.since_tick_ms += by;
            left -= by;
            if self.since_tick_ms >= self.sync_ms {
                self.since_tick_ms = 0;
                self.fleet.tick()?;
                self.fleet.pump()?;
            }
        }
        Ok(())
    }

    /// One step: up to `starts_per_step` new requests and `events_per_step` response events
    /// (or client aborts) on random open streams, then the waiting work is pumped and the new
    /// requests are sorted into admitted and refused.
    pub fn step(&mut self) -> crate::Result<()> {
        let starts = self.rng.index(self.mix.starts_per_step + 1);
        for _ in 0..starts {
            if self.live.len() + self.arriving.len() >= self.mix.max_live {
                break;
            }
            self.start()?;
        }
        let events = self.rng.index(self.mix.events_per_step + 1);
        for _ in 0..events {
            if self.live.is_empty() {
                break;
            }
            let pick = self.rng.index(self.live.len());
            self.advance_stream(pick)?;
        }
        self.fleet.pump()?;
        self.sort_arrivals()
    }

    /// Starts one request now, pumps, and sorts it (admitted or refused).
    pub fn start_one(&mut self) -> crate::Result<()> {
        self.start()?;
        self.fleet.pump()?;
        self.sort_arrivals()
    }

    /// Runs every open stream to its end (no new requests; aborts still happen).
    pub fn drain(&mut self) -> crate::Result<()> {
        while !self.live.is_empty() || !self.arriving.is_empty() {
            for i in (0..self.live.len()).rev() {
                self.advance_stream(i)?;
            }
            self.fleet.pump()?;
            self.sort_arrivals()?;
        }
        Ok(())
    }

    fn start(&mut self) -> crate::Result<()> {
        let seq = self.next;
        self.next += 1;
        let instance = self.rng.index(self.fleet.instances());
        let worker = self.rng.index(self.fleet.workers());
        let key = self
            .mix
            .only_key
            .unwrap_or_else(|| self.rng.index(KEYS.len()));
        let (api_key, consumer) = KEYS[key.min(KEYS.len() - 1)];
        let sse = self.rng.chance(self.mix.stream_percent);
        let cap = self.rng.range(16, 256);
        let words = self.rng.range(8, 400) as usize;
        let mut text = String::new();
        for i in 0..words {
            text.push_str(WORDS[self.rng.index(WORDS.len())]);
            text.push(' ');
            if i == words / 2 && self.rng.chance(self.mix.pii_percent) {
                text.push_str("write to jane.doe@example.com ");
            }
        }
        let body = json!({
            "model": "fast",
            "stream": sse,
            "max_tokens": cap,
            "messages": [{"role": "user", "content": text}]
        })
        .to_string();
        let stream = self.fleet.stream(instance, worker)?;
        stream.set_property("xds.route_name", "llm");
        let len = body.len().to_string();
        let mut headers = vec![
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            (":authority", "gateway.test"),
            (":scheme", "http"),
            ("content-type", "application/json"),
            ("content-length", len.as_str()),
            ("x-api-key", api_key),
        ];
        let user = self.mix.user.clone();
        let with_user = self.rng.chance(self.mix.user_percent);
        if with_user {
            headers.push(("x-user-id", user.as_str()));
        }
        stream.send_request_headers(&headers, false)?;
        stream.send_request_body(body.as_bytes(), true)?;
        self.arriving.push(Live {
            seq,
            consumer: consumer.to_string(),
            stream,
            instance,
            worker,
            sse,
            user: with_user,
            cap,
            events: Vec::new(),
            sent: 0,
            abort_after: None,
            admitted_in: self.phase,
        });
        Ok(())
    }

    fn sort_arrivals(&mut self) -> crate::Result<()> {
        for mut live in std::mem::take(&mut self.arriving) {
            live.admitted_in = self.phase;
            if let Some(reply) = live.stream.local_reply() {
                let code = serde_json::from_slice::<Value>(&reply.body)
                    .ok()
                    .and_then(|v| v["error"]["code"].as_str().map(str::to_owned));
                live.stream.finish()?;
                let complete = live.stream.downstream().end;
                self.finished.push(Outcome {
                    seq: live.seq,
                    consumer: live.consumer,
                    instance: live.instance,
                    worker: live.worker,
                    stream: live.sse,
                    user: live.user,
                    status: reply.status,
                    code,
                    admitted: false,
                    aborted: false,
                    complete_for_client: complete,
                    admitted_in: self.phase,
                    finished_in: self.phase,
                    record: record_of(&live.stream),
                });
                continue;
            }
            let up = live.stream.upstream();
            if !up.end {
                return Err(format!(
                    "request {} neither refused nor forwarded; paused at {:?}\n{}",
                    live.seq,
                    live.stream.paused(),
                    self.fleet.log_text()
                ));
            }
            live.events = self.answer(&up.body, live.sse, live.cap);
            if live.sse && self.rng.chance(self.mix.abort_percent) {
                live.abort_after = Some(self.rng.index(live.events.len()));
            }
            self.live.push(live);
        }
        Ok(())
    }

    /// What the provider answers: usage counted from what it received (prompt: a token per 4
    /// bytes of body; completion: up to the cap).
    fn answer(&mut self, body: &[u8], sse: bool, cap: u64) -> Vec<Vec<u8>> {
        let prompt = (body.len() as u64).div_ceil(4);
        let completion = if self.rng.chance(20) {
            cap
        } else {
            self.rng.range(1, cap)
        };
        let usage = json!({"prompt_tokens": prompt, "completion_tokens": completion,
                           "total_tokens": prompt + completion});
        if !sse {
            let body = json!({
                "id": "chatcmpl-t", "object": "chat.completion", "model": "model-a",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"},
                             "finish_reason": "stop"}],
                "usage": usage
            });
            return vec![body.to_string().into_bytes()];
        }
        let pieces = self.rng.range(2, 6).min(completion);
        let mut left = completion;
        let mut out = Vec::new();
        for p in 0..pieces {
            let tokens = if p + 1 == pieces {
                left
            } else {
                self.rng.range(0, left / (pieces - p))
            };
            left -= tokens;
            let chunk = json!({"id": "chatcmpl-t", "object": "chat.completion.chunk",
                "model": "model-a", "choices": [{"index": 0,
                "delta": {"content": "abc ".repeat(tokens as usize)}, "finish_reason": null}],
                "usage": null});
            out.push(format!("data: {chunk}\n\n").into_bytes());
        }
        let last = json!({"id": "chatcmpl-t", "object": "chat.completion.chunk",
            "model": "model-a", "choices": [], "usage": usage});
        out.push(format!("data: {last}\n\ndata: [DONE]\n\n").into_bytes());
        out
    }

    fn advance_stream(&mut self, index: usize) -> crate::Result<()> {
        let Some(live) = self.live.get_mut(index) else {
            return Ok(());
        };
        if live.abort_after == Some(live.sent) {
            // the client goes away: Envoy resets the stream, on_log runs
            let live = self.live.swap_remove(index);
            live.stream.finish()?;
            self.finished.push(Outcome {
                seq: live.seq,
                consumer: live.consumer,
                instance: live.instance,
                worker: live.worker,
                stream: live.sse,
                user: live.user,
                status: 200,
                code: None,
                admitted: true,
                aborted: true,
                complete_for_client: false,
                admitted_in: live.admitted_in,
                finished_in: self.phase,
                record: record_of(&live.stream),
            });
            return Ok(());
        }
        if live.sent == 0 {
            let content_type = if live.sse {
                "text/event-stream"
            } else {
                "application/json"
            };
            live.stream.send_response_headers(
                &[(":status", "200"), ("content-type", content_type)],
                false,
            )?;
            live.sent = 1;
            return Ok(());
        }
        let last = live.sent == live.events.len();
        let piece = live.events.get(live.sent - 1).cloned().unwrap_or_default();
        live.stream.send_response_body(&piece, last)?;
        live.sent += 1;
        if last {
            let live = self.live.swap_remove(index);
            let down = live.stream.downstream();
            live.stream.finish()?;
            let status = down
                .headers
                .as_ref()
                .and_then(|h| super::stream::header_value(h, ":status"))
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            self.finished.push(Outcome {
                seq: live.seq,
                consumer: live.consumer,
                instance: live.instance,
                worker: live.worker,
                stream: live.sse,
                user: live.user,
                status,
                code: None,
                admitted: true,
                aborted: false,
                complete_for_client: down.end,
                admitted_in: live.admitted_in,
                finished_in: self.phase,
                record: record_of(&live.stream),
            });
        }
        Ok(())
    }
}

fn record_of(stream: &Stream) -> Option<Value> {
    let bytes = stream.filter_state("wasm.llm_usage")?;
    serde_json::from_slice(&bytes).ok()
}

const WORDS: [&str; 16] = [
    "the", "gateway", "streams", "tokens", "budget", "reserve", "settle", "ledger", "replay",
    "journal", "window", "lease", "batch", "model", "answer", "question",
];

// ---------------------------------------------------------------------------------------
// The books in Redis

/// Sends one command to Redis directly (not through the harness) and reads one whole reply.
pub fn redis_query(addr: SocketAddr, args: &[&str]) -> crate::Result<Reply> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("redis {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(&resp::encode_command(args))
        .map_err(|e| e.to_string())?;
    let limits = Limits {
        max_depth: 8,
        max_elements: 1 << 20,
        max_bulk: 1 << 24,
    };
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        match resp::decode_prefix(&buf, &limits) {
            Ok((reply, _)) => return Ok(reply),
            Err(RespError::Incomplete) => {}
            Err(e) => return Err(format!("redis reply: {e:?}")),
        }
        let n = stream.read(&mut chunk).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("redis closed the connection".into());
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
}

/// What Redis holds for the runs' budgets and ledger.
#[derive(Debug, Clone, Default)]
pub struct Books {
    /// Spent per budget key (`llm:{t:acme}:bud:…`).
    pub budgets: HashMap<String, i64>,
    /// Reservations not reconciled (`llm:*:res:*` with levels).
    pub reservations: usize,
    /// Tombstones of cancelled reservations (`llm:*:res:*` with `n` = 0).
    pub tombstones: usize,
    /// Replay markers of journaled charges (`llm:*:done:*`).
    pub markers: usize,
    /// The ledger: request id → record, in stream order.
    pub ledger: Vec<(String, Value)>,
}

impl Books {
    /// Reads them (KEYS and XRANGE: fine for a test's Redis).
    pub fn read(addr: SocketAddr) -> crate::Result<Books> {
        let keys = |pattern: &str| -> crate::Result<Vec<String>> {
            match redis_query(addr, &["KEYS", pattern])? {
                Reply::Array(Some(items)) => Ok(items
                    .iter()
                    .filter_map(|i| i.bytes().map(|b| String::from_utf8_lossy(b).into_owned()))
                    .collect()),
                other => Err(format!("KEYS {pattern}: {other:?}")),
            }
        };
        let mut books = Books::default();
        for key in keys("llm:*:bud:*")? {
            let value = redis_query(addr, &["GET", &key])?;
            let spent = value
                .bytes()
                .and_then(|b| std::str::from_utf8(b).ok())
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("GET {key}: {value:?}"))?;
            books.budgets.insert(key, spent);
        }
        for key in keys("llm:*:res:*")? {
            match redis_query(addr, &["HGET", &key, "n"])?.bytes() {
                Some(b"0") => books.tombstones += 1,
                _ => books.reservations += 1,
            }
        }
        books.markers = keys("llm:*:done:*")?.len();
        let entries = match redis_query(addr, &["XRANGE", LEDGER, "-", "+"])? {
            Reply::Array(Some(entries)) => entries,
            Reply::Array(None) => Vec::new(),
            other => return Err(format!("XRANGE: {other:?}")),
        };
        for entry in entries {
            let Reply::Array(Some(parts)) = entry else {
                return Err("XRANGE: an entry that is not an array".into());
            };
            let Some(Reply::Array(Some(fields))) = parts.get(1) else {
                return Err("XRANGE: an entry without fields".into());
            };
            let record = fields
                .get(1)
                .and_then(Reply::bytes)
                .and_then(|b| serde_json::from_slice::<Value>(b).ok())
                .ok_or("XRANGE: an entry without a record")?;
            let id = record["request_id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            books.ledger.push((id, record));
        }
        Ok(books)
    }

    /// Spent on a budget key (0 when absent).
    pub fn spent(&self, key: &str) -> i64 {
        self.budgets.get(key).copied().unwrap_or(0)
    }
}

/// The tenant budget's key on `day` (`2026-11-30`).
pub fn tenant_key(day: &str) -> String {
    format!("llm:{{t:acme}}:bud:tenant-day:tenant:acme:{day}")
}

/// A consumer money budget's key on `day`.
pub fn consumer_key(consumer: &str, day: &str) -> String {
    format!("llm:{{t:acme}}:bud:consumer-day:consumer:{consumer}:{day}")
}

/// Journal entries waiting in an instance's shared data (JSON `{"entries": [...]}`).
pub fn journal_entries(fleet: &Fleet, instance: usize) -> Vec<Value> {
    fleet
        .services(instance)
        .shared_data
        .get(RATELIMIT_VM, "trl:journal")
        .and_then(|(v, _)| serde_json::from_slice::<Value>(&v).ok())
        .and_then(|j| j["entries"].as_array().cloned())
        .unwrap_or_default()
}
