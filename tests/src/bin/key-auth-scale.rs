//! key-auth at scale in the wasmtime harness (the figures of plugins/key-auth/README.md,
//! "Many keys").
//!
//! 1. **Keys in config**: a config of `--keys` keys (default 100 000) next to one of 10: VM
//!    start + configure time (median of `--runs`), its fuel, the VM's linear memory after
//!    configure, and per request (an allowed key, an unknown key) fuel, host calls and wasm
//!    time.
//! 2. **Keys in Redis**: `--redis-keys` keys (default 1 000) in a real `redis-server`, the
//!    Higress build on 2 workers, `--requests` requests (default 100 000) whose keys follow a
//!    Zipf law (s = 1) plus 1 % wrong keys from a pool of 500, spread over `--minutes`
//!    simulated minutes (default 10): Redis calls per request and the cache hit rate with the
//!    default TTLs (30 s).
//!
//! 3. **Envoy** (`--envoy`): the plain build in a real Envoy 1.40 (`envoy-config/e2e-key-auth.yaml`,
//!    `--concurrency 2`) with 10 and with `--keys` keys: the process's resident memory (VmRSS)
//!    once it listens, and how long it took to start.
//!
//! Usage (after `scripts/build`): `cargo run --release -p llm-gateway-tests --bin
//! key-auth-scale -- [--envoy [--wasm-dir DIR]] [--keys N] [--redis-keys N] [--requests N] [--minutes N] [--runs N]`.

use llm_gateway_tests::harness::{cost, FilterSpec, Fleet, Host, Request, Response};
use llm_gateway_tests::redis::Redis;
use llm_gateway_tests::workspace::sha256_hex;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const SERVICE: &str = "outbound|6379||redis.static";

struct Options {
    keys: usize,
    redis_keys: usize,
    requests: usize,
    minutes: u64,
    runs: usize,
}

fn main() -> Result<(), String> {
    let mut opts = Options {
        keys: 100_000,
        redis_keys: 1_000,
        requests: 100_000,
        minutes: 10,
        runs: 3,
    };
    let mut args = std::env::args().skip(1).peekable();
    let mut envoy = false;
    let mut wasm_dir = None;
    while let Some(arg) = args.next() {
        if arg == "--envoy" {
            envoy = true;
            continue;
        }
        if arg == "--wasm-dir" {
            wasm_dir = Some(args.next().ok_or("--wasm-dir DIR")?);
            continue;
        }
        let value = args.next().ok_or(format!("{arg} needs a value"))?;
        let n: usize = value.parse().map_err(|_| format!("{arg} N"))?;
        match arg.as_str() {
            "--keys" => opts.keys = n,
            "--redis-keys" => opts.redis_keys = n.max(1),
            "--requests" => opts.requests = n,
            "--minutes" => opts.minutes = n as u64,
            "--runs" => opts.runs = n.max(1),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if envoy {
        return envoy_rss(&opts, wasm_dir);
    }
    config_keys(&opts)?;
    redis_keys(&opts)
}

/// `wasm_dir`: where `key-auth.wasm` is (default `dist/`; another build to compare).
fn envoy_rss(opts: &Options, wasm_dir: Option<String>) -> Result<(), String> {
    use llm_gateway_tests::envoy::Envoy;
    println!("## Envoy 1.40, --concurrency 2\n");
    println!("| keys | start until listening | VmRSS |");
    println!("|---:|---:|---:|");
    for n in [10, opts.keys] {
        let mut vars = vec![
            ("MOCK_PORT", "9".to_string()),
            ("KEY_AUTH_CONFIG", config(n).to_string().replace('\'', "''")),
        ];
        if let Some(dir) = &wasm_dir {
            vars.push(("WASM_DIR", dir.clone()));
        }
        let started = Instant::now();
        let envoy = Envoy::start("e2e-key-auth.yaml", &vars)?;
        let took = started.elapsed();
        std::thread::sleep(Duration::from_secs(2));
        let status = std::fs::read_to_string(format!("/proc/{}/status", envoy.pid()))
            .map_err(|e| e.to_string())?;
        let rss = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .unwrap_or("?")
            .trim()
            .to_string();
        println!("| {n} | {:.1} s | {rss} |", took.as_secs_f64());
    }
    Ok(())
}

fn key(i: usize) -> String {
    format!("sk-scale-{i:08}")
}

/// A config of `n` keys: 1 000 consumers in 50 tenants, two groups each.
fn config(n: usize) -> Value {
    let keys: Vec<Value> = (0..n)
        .map(|i| {
            json!({"key_sha256": sha256_hex(key(i).as_bytes()), "consumer": format!("consumer-{}", i % 1000),
                   "tenant": format!("tenant-{}", i % 50), "groups": ["fast", "smart"]})
        })
        .collect();
    json!({ "keys": keys })
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn config_keys(opts: &Options) -> Result<(), String> {
    println!("## Keys in config\n");
    println!("| keys | config bytes | VM start + configure (median) | configure fuel | linear memory after configure | allowed: fuel / host calls / wasm time per request | unknown key: fuel / host calls / wasm time | linear memory after 200 requests |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in [10, opts.keys] {
        let config = config(n);
        let bytes = config.to_string().len();
        let spec = FilterSpec::plugin("key-auth", &config)?;
        Fleet::single(spec.clone())?; // the module compiled once
        let mut times = Vec::new();
        let mut fuel = 0;
        let mut memory = 0;
        for _ in 0..opts.runs {
            let started = Instant::now();
            let fleet = Fleet::single(spec.clone())?;
            times.push(started.elapsed());
            fuel = cost::Totals::of(&fleet.costs()).fuel;
            memory = fleet.memory_bytes(0, 0, 0)?;
        }
        let fleet = Fleet::single(spec)?;
        let mut per_request = Vec::new();
        for presented in [key(n - 1), "sk-scale-unknown".to_string()] {
            let request = Request::get("/v1/models").header("x-api-key", &presented);
            fleet.exchange(0, 0, &request, |_| Response::status(200))?; // warm-up
            let mut costs = Vec::new();
            let mut walls = Vec::new();
            for _ in 0..100 {
                let ex = fleet.exchange(0, 0, &request, |_| Response::status(200))?;
                walls.push(ex.cost.iter().map(|c| c.wall).sum::<Duration>());
                costs.extend(ex.cost);
            }
            let totals = cost::Totals::of(&costs);
            per_request.push(format!(
                "{} / {} / {:.0} µs",
                totals.fuel / 100,
                totals.host_calls / 100,
                median(walls).as_secs_f64() * 1e6
            ));
        }
        println!(
            "| {n} | {bytes} | {:.1} ms | {fuel} | {} KiB | {} | {} | {} KiB |",
            median(times).as_secs_f64() * 1e3,
            memory / 1024,
            per_request.first().cloned().unwrap_or_default(),
            per_request.get(1).cloned().unwrap_or_default(),
            fleet.memory_bytes(0, 0, 0)? / 1024,
        );
    }
    println!();
    Ok(())
}

/// SplitMix64: the same trace on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn redis_keys(opts: &Options) -> Result<(), String> {
    let redis = Redis::start()?;
    for i in 0..opts.redis_keys {
        let name = format!("llm:key:{}", sha256_hex(key(i).as_bytes()));
        let consumer = format!("consumer-{i}");
        redis.command(&[
            "HSET",
            &name,
            "consumer",
            &consumer,
            "tenant",
            "acme",
            "groups",
            "fast,smart",
        ])?;
    }
    let config = json!({"redis": {"service": SERVICE, "timeout_ms": 1000}});
    let fleet = Fleet::builder()
        .host(Host::Higress)
        .workers(2)
        .filter(FilterSpec::higress("key-auth", &config)?)
        .redis(SERVICE, redis.addr())
        .build()?;
    fleet.clock().set_nanos(1_796_000_000_000_000_000);
    // Zipf (s = 1) over the keys: cumulative weights 1/1 + 1/2 + …
    let weights: Vec<f64> = (1..=opts.redis_keys).map(|r| 1.0 / r as f64).collect();
    let total: f64 = weights.iter().sum();
    let mut cumulative = Vec::with_capacity(weights.len());
    let mut sum = 0.0;
    for w in weights {
        sum += w / total;
        cumulative.push(sum);
    }
    let mut rng = Rng(7);
    let step = Duration::from_nanos(opts.minutes * 60_000_000_000 / opts.requests.max(1) as u64);
    let (mut allowed, mut refused) = (0u64, 0u64);
    let started = Instant::now();
    for i in 0..opts.requests {
        let presented = if rng.next().is_multiple_of(100) {
            format!("sk-wrong-{}", rng.next() % 500)
        } else {
            let u = rng.unit();
            key(cumulative
                .partition_point(|c| *c < u)
                .min(opts.redis_keys - 1))
        };
        // the stream API: `Fleet::exchange` gathers every cost so far on each call
        let stream = fleet.stream(0, i % 2)?;
        stream.send_request_headers(
            &[
                (":method", "GET"),
                (":path", "/v1/models"),
                (":authority", "gw"),
                ("x-api-key", &presented),
            ],
            true,
        )?;
        fleet.pump()?;
        match stream.local_reply().map(|r| r.status) {
            None => allowed += 1,
            Some(401) => refused += 1,
            Some(other) => return Err(format!("status {other}")),
        }
        stream.finish()?;
        fleet.clock().advance(step);
    }
    let calls = fleet.redis().calls();
    let hits = fleet.metric_sum("llm_gateway.key_auth.cache.hit");
    let lookups = fleet.metric_sum("llm_gateway.key_auth.redis.lookup");
    println!("## Keys in Redis\n");
    println!(
        "{} keys in Redis, {} requests over {} simulated minutes on 2 workers (Zipf s = 1, 1 % wrong keys from a pool of 500), cache_ttl_ms = negative_ttl_ms = 30 000: {allowed} allowed, {refused} refused.\n",
        opts.redis_keys, opts.requests, opts.minutes
    );
    println!("| Redis calls | calls per request | cache hits | cache hit rate | lookups (metric) | harness wall time |");
    println!("|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {calls} | {:.4} | {hits} | {:.2} % | {lookups} | {:.0} s |",
        calls as f64 / opts.requests.max(1) as f64,
        100.0 * hits as f64 / (hits + lookups).max(1) as f64,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
