//! `scripts/soak`: the whole chain under a sustained, bounded load for a while (10 minutes by
//! default), on loopback, two parts side by side for the same duration:
//!
//! * **Envoy**: the real Envoy 1.40 with `envoy-config/gateway.yaml` (the plain builds of the
//!   five plugins), its rate limits raised so that nothing is refused, its budgets active (the
//!   tenant's 100 USD a month as shipped, 10M tokens per end user a day), in front of the
//!   demo's mock providers. Requests at a fixed rate from four end users of two virtual keys:
//!   chat completions streamed and not (some paced event by event), `smart` and `fast`,
//!   Anthropic messages, some with personal data. Envoy's RSS is sampled all along. At the end
//!   each budget is probed: a request uses all but a little of what the records say is left
//!   (the mock reports that many prompt tokens), then one it cannot cover gets a 402 saying
//!   what is left — which must be the amount minus exactly the usage in the access log's
//!   records (drift 0).
//! * **Redis**: the same chain with the Higress builds (usage-accounting's Redis stream ledger,
//!   token-ratelimit's leases and budgets in Redis) in the wasmtime harness
//!   (`harness::traffic`), 2 instances × 2 workers, against a real `redis-server`, its clock
//!   the wall clock, stepped at a fixed rate (client aborts included). At the end the budget
//!   counters in Redis, the ledger stream and the records must agree (drift 0), nothing left
//!   reserved or journaled.
//!
//! Exit status 1 when a request failed (beyond the injected client aborts), a drift is not 0,
//! or Envoy's RSS grew past the bound between the end of the warm-up and the end.
//!
//! Usage: `soak [--minutes M] [--rate R] [--harness-steps S] [--rss-growth-mib N]`
//! (defaults 10, 20 requests/s, 10 steps/s, 32 MiB).

use llm_gateway_tests::demo::{Demo, DEMO_KEY, FAST_ONLY_KEY};
use llm_gateway_tests::harness::traffic::{self, Books, Mix, Traffic};
use llm_gateway_tests::http::{self, sse_events};
use llm_gateway_tests::redis::Redis;
use llm_gateway_tests::workspace;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
struct Args {
    minutes: f64,
    rate: f64,
    harness_steps: f64,
    rss_growth_mib: u64,
}

const USAGE: &str = "usage: soak [--minutes M] [--rate R] [--harness-steps S] [--rss-growth-mib N]";

fn args() -> Result<Args, String> {
    let mut out = Args {
        minutes: 10.0,
        rate: 20.0,
        harness_steps: 10.0,
        rss_growth_mib: 32,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| -> Result<f64, String> {
            let v = it.next().ok_or(format!("{name} needs a value"))?;
            v.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or(format!("{name}: not a non-negative number: {v:?}"))
        };
        match arg.as_str() {
            "--minutes" => out.minutes = value("--minutes")?,
            "--rate" => out.rate = value("--rate")?.max(0.1),
            "--harness-steps" => out.harness_steps = value("--harness-steps")?.max(0.1),
            "--rss-growth-mib" => out.rss_growth_mib = value("--rss-growth-mib")? as u64,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}; {USAGE}")),
        }
    }
    Ok(out)
}

fn main() -> ExitCode {
    let args = match args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let duration = Duration::from_secs_f64(args.minutes * 60.0);
    println!(
        "soak: {:.1} min; Envoy part at {} requests/s, Redis part at {} harness steps/s",
        args.minutes, args.rate, args.harness_steps
    );
    let steps = args.harness_steps;
    let redis_part = std::thread::spawn(move || redis_part(duration, steps));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    let envoy = runtime.block_on(envoy_part(duration, &args));
    let redis = redis_part
        .join()
        .unwrap_or_else(|_| Err("the Redis part panicked".into()));
    let mut ok = true;
    println!("\n== Envoy part: real Envoy 1.40, envoy-config/gateway.yaml (limits raised, budgets on), plain builds, mock providers");
    match envoy {
        Ok(report) => {
            println!("{}", report.text);
            ok &= report.ok;
        }
        Err(e) => {
            println!("FAILED: {e}");
            ok = false;
        }
    }
    println!("\n== Redis part: wasmtime harness, Higress builds (token-ratelimit, usage-accounting ledger), real redis-server, 2 instances x 2 workers");
    match redis {
        Ok(report) => {
            println!("{}", report.text);
            ok &= report.ok;
        }
        Err(e) => {
            println!("FAILED: {e}");
            ok = false;
        }
    }
    println!("\nsoak: {}", if ok { "PASS" } else { "FAIL" });
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

struct Report {
    text: String,
    ok: bool,
}

// ---------------------------------------------------------------------------------------
// Envoy part

/// End users: (x-user-id, virtual key, may use `smart` and `claude`).
const USERS: [(&str, &str, bool); 4] = [
    ("soak-a", DEMO_KEY, true),
    ("soak-b", DEMO_KEY, true),
    ("soak-c", DEMO_KEY, true),
    ("soak-d", FAST_ONLY_KEY, false),
];
/// `user-day` of the variant, tokens.
const USER_DAY: u64 = 10_000_000;
/// `tenant-month` as shipped, nano-USD (100 USD).
const TENANT_MONTH_NANO: u64 = 100_000_000_000;
/// `openai-mini`'s input price, nano-USD per token.
const OPENAI_MINI_INPUT_NANO: u64 = 150;
/// What the probes leave of a budget before they ask for more than that (tokens; nano-USD):
/// below what one probe reserves (100 000 output tokens, at most 0.066 USD at `fast`'s price
/// ceiling), above any drift worth measuring.
const LEAVE_TOKENS: u64 = 50_000;
const LEAVE_NANO: u64 = 30_000_000;

/// gateway.yaml with its rate limits raised (nothing refused) and the per-user token budget
/// raised to 10M a day; budgets active (the tenant's 100 USD a month as shipped).
fn variant() -> Result<std::path::PathBuf, String> {
    let shipped = std::fs::read_to_string(workspace::envoy_config("gateway.yaml"))
        .map_err(|e| format!("gateway.yaml: {e}"))?;
    let mut text = shipped.clone();
    for (from, to) in [
        (
            r#""key-tpm", "by": "key", "tokens": 1000000,"#,
            r#""key-tpm", "by": "key", "tokens": 1000000000000,"#,
        ),
        (
            r#""key-rpm", "by": "key", "requests": 600,"#,
            r#""key-rpm", "by": "key", "requests": 100000000,"#,
        ),
        (
            r#""user-rpm", "by": "user", "requests": 10,"#,
            r#""user-rpm", "by": "user", "requests": 100000000,"#,
        ),
        (
            r#""user-day", "by": "user", "period": "day", "tokens": 20000"#,
            r#""user-day", "by": "user", "period": "day", "tokens": 10000000"#,
        ),
    ] {
        if shipped.matches(from).count() != 1 {
            return Err(format!("gateway.yaml changed: {from} is not there once"));
        }
        text = text.replace(from, to);
    }
    let path = std::env::temp_dir().join(format!("llm-gateway-soak-{}.yaml", std::process::id()));
    std::fs::write(&path, text).map_err(|e| e.to_string())?;
    Ok(path)
}

/// One request of the Envoy part, as the client saw it.
#[derive(Debug, Clone)]
struct Sent {
    user: &'static str,
    kind: &'static str,
    request_id: Option<String>,
    /// None: fine; Some: what went wrong.
    error: Option<String>,
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

async fn one_request(url: String, n: u64, seed: u64) -> Sent {
    let mut rng = traffic::Rng(seed);
    let (user, key, wide) = USERS[rng.index(USERS.len())];
    let roll = rng.range(0, 99);
    let kind = match roll {
        0..=54 => "fast-stream",
        55..=79 => "fast-json",
        80..=91 if wide => "smart-stream",
        92..=99 if wide => "claude-stream",
        _ => "fast-stream",
    };
    let words = rng.range(5, 300) as usize;
    let mut content = format!("Request {n}:");
    for i in 0..words {
        content.push_str([" the", " budget", " stream", " answer", " token"][i % 5]);
    }
    if rng.chance(20) {
        content.push_str(" mail jane.doe@example.com");
    }
    let chunks = rng.range(1, 48).to_string();
    let paced = rng.chance(30);
    let (path, body) = match kind {
        "claude-stream" => (
            "/v1/messages",
            json!({"model": "claude", "max_tokens": 256, "stream": true,
                   "messages": [{"role": "user", "content": content}]}),
        ),
        _ => (
            "/v1/chat/completions",
            json!({"model": if kind.starts_with("smart") { "smart" } else { "fast" },
                   "stream": kind.ends_with("stream"),
                   "messages": [{"role": "user", "content": content}]}),
        ),
    };
    let mut request = http::post(format!("{url}{path}"))
        .header("x-user-id", user)
        .header("x-mock-chunks", &chunks)
        .json(&body);
    request = if path == "/v1/messages" {
        request
            .header("x-api-key", key)
            .header("anthropic-version", "2023-06-01")
    } else {
        request.header("authorization", &format!("Bearer {key}"))
    };
    if paced {
        request = request.header("x-mock-chunk-delay-ms", "20");
    }
    let mut sent = Sent {
        user,
        kind,
        request_id: None,
        error: None,
    };
    let response = match request.send().await {
        Ok(r) => r,
        Err(e) => {
            sent.error = Some(format!("transport: {e}"));
            return sent;
        }
    };
    sent.request_id = response.header("x-request-id").map(str::to_owned);
    if response.status != 200 {
        sent.error = Some(format!("status {}: {}", response.status, response.text()));
        return sent;
    }
    if kind.ends_with("stream") {
        let events = sse_events(&response.text());
        let ended = match kind {
            "claude-stream" => events
                .last()
                .is_some_and(|e| e.0.as_deref() == Some("message_stop")),
            _ => events.last().is_some_and(|e| e.1 == json!("[DONE]")),
        };
        if !ended {
            sent.error = Some(format!("stream without its end: {}", response.text()));
        }
    } else if response.json().is_err() {
        sent.error = Some(format!("not JSON: {}", response.text()));
    }
    sent
}

/// `… 1034 tokens reserved, 176 left` / `… 0.5 USD reserved, 3.25 USD left` → what is left
/// (tokens, or nano-units).
fn left_in(message: &str, money: bool) -> Option<u64> {
    let before = message.rsplit_once(" left")?.0;
    let number = before
        .strip_suffix(" USD")
        .unwrap_or(before)
        .rsplit(' ')
        .next()?;
    if !money {
        return number.parse().ok();
    }
    let (units, frac) = number.split_once('.').unwrap_or((number, ""));
    if frac.len() > 9 {
        return None;
    }
    let units: u64 = units.parse().ok()?;
    let frac: u64 = format!("{frac:0<9}").parse().ok()?;
    Some(units * 1_000_000_000 + frac)
}

async fn chat_request(
    url: &str,
    user: &str,
    key: &str,
    max_tokens: u64,
    knobs: &[(&str, String)],
) -> Result<http::Response, String> {
    let mut request = http::post(format!("{url}/v1/chat/completions"))
        .header("authorization", &format!("Bearer {key}"))
        .header("x-user-id", user)
        .json(&json!({"model": "fast", "max_tokens": max_tokens,
                      "messages": [{"role": "user", "content": "How much is left?"}]}));
    for (name, value) in knobs {
        request = request.header(name, value);
    }
    request.send().await
}

/// A request that uses `prompt_tokens` (the provider says so): it takes a budget down to
/// where a probe can see what is left. Its request id.
async fn burn(url: &str, user: &str, key: &str, prompt_tokens: u64) -> Result<String, String> {
    let response = chat_request(
        url,
        user,
        key,
        1,
        &[
            ("x-mock-prompt-tokens", prompt_tokens.to_string()),
            ("x-mock-chunks", "1".into()),
        ],
    )
    .await?;
    if response.status != 200 {
        return Err(format!(
            "burn for {user}: {} {}",
            response.status,
            response.text()
        ));
    }
    response
        .header("x-request-id")
        .map(str::to_owned)
        .ok_or_else(|| "burn: no x-request-id".into())
}

/// A request no budget of `user` can cover (100 000 output tokens): its 402's message.
async fn probe(url: &str, user: &str, key: &str) -> Result<String, String> {
    let response = chat_request(url, user, key, 100_000, &[]).await?;
    if response.status != 402 {
        return Err(format!(
            "probe for {user}: status {} {}",
            response.status,
            response.text()
        ));
    }
    Ok(response.json()?["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// The records (usage-accounting's, from the access log) of `ids`, waiting up to 30 s for
/// Envoy to write them.
async fn records_of(demo: &Demo, ids: &[String]) -> HashMap<String, Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(demo.access_log()).unwrap_or_default();
        let wanted: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
        let found: HashMap<String, Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|line| {
                let id = line["request_id"].as_str()?;
                wanted.contains(id).then_some(())?;
                let record = serde_json::from_str(line["usage"].as_str()?).ok()?;
                Some((id.to_string(), record))
            })
            .collect();
        if found.len() == wanted.len() || Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn tokens_of(record: &Value) -> u64 {
    record["usage"]["total_tokens"].as_u64().unwrap_or(0)
}

fn cost_of(record: &Value) -> u64 {
    record["cost_nano"].as_u64().unwrap_or(0)
}

async fn envoy_part(duration: Duration, args: &Args) -> Result<Report, String> {
    let path = variant()?;
    let demo = Demo::start_with(0, path.to_str().unwrap_or_default()).await;
    let _ = std::fs::remove_file(&path);
    let demo = demo?;
    let url = demo.url();
    let pid = demo.envoy.pid();
    let started = Instant::now();
    let warm_up = (duration / 5).min(Duration::from_secs(60));

    // RSS, every 5 s
    let samples: Arc<Mutex<Vec<(f64, u64)>>> = Arc::new(Mutex::new(vec![(0.0, rss_kib(pid))]));
    let sampler = {
        let samples = Arc::clone(&samples);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                if let Ok(mut s) = samples.lock() {
                    s.push((started.elapsed().as_secs_f64(), rss_kib(pid)));
                }
            }
        })
    };

    // requests at a fixed rate, each on its own connection
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / args.rate));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tasks = Vec::new();
    let mut n = 0u64;
    let mut rss_after_warm_up = None;
    while started.elapsed() < duration {
        ticker.tick().await;
        if rss_after_warm_up.is_none() && started.elapsed() >= warm_up {
            rss_after_warm_up = Some(rss_kib(pid));
        }
        tasks.push(tokio::spawn(one_request(url.clone(), n, 0x50a4 + n)));
        n += 1;
    }
    let mut sent = Vec::with_capacity(tasks.len());
    for task in tasks {
        sent.push(task.await.map_err(|e| e.to_string())?);
    }
    let rss_end = rss_kib(pid);
    sampler.abort();
    let samples = samples.lock().map(|s| s.clone()).unwrap_or_default();
    let rss_start = rss_after_warm_up.unwrap_or(rss_end);
    let rss_max = samples.iter().map(|s| s.1).max().unwrap_or(0).max(rss_end);

    // every request's record, from the access log
    let ids: HashMap<String, &'static str> = sent
        .iter()
        .filter_map(|s| Some((s.request_id.clone()?, s.user)))
        .collect();
    let all: Vec<String> = ids.keys().cloned().collect();
    let mut records = records_of(&demo, &all).await;
    let missing = ids.len() - records.len();

    // The budgets, probed. A probe's 402 says what is left; to make a budget small enough for
    // a probe, a request first uses what the records say is spent but for a little (the
    // provider reports that many prompt tokens). What is left must then be the amount minus
    // exactly every record of that budget, the burn's included.
    let mut text = String::new();
    let mut ok = true;
    let mut budget_lines = Vec::new();
    for (user, key, _) in USERS {
        let spent: u64 = records
            .iter()
            .filter(|(id, _)| ids.get(id.as_str()) == Some(&user))
            .map(|(_, r)| tokens_of(r))
            .sum();
        let id = burn(
            &url,
            user,
            key,
            USER_DAY.saturating_sub(spent + LEAVE_TOKENS),
        )
        .await?;
        let burn_record = records_of(&demo, std::slice::from_ref(&id)).await;
        let burned = burn_record.get(&id).map_or(0, tokens_of);
        records.extend(burn_record);
        let message = probe(&url, user, key).await?;
        let expected = USER_DAY as i64 - (spent + burned) as i64;
        let left = left_in(&message, false);
        let drift = left.map(|l| expected - l as i64);
        ok &= drift == Some(0) && message.contains("user-day");
        budget_lines.push(format!(
            "  user-day {user}: {spent} tokens in the soak's records (+{burned} burned), the 402 says {} left of {USER_DAY}: drift {}",
            left.map_or("?".into(), |l| l.to_string()),
            drift.map_or("?".into(), |d| d.to_string())
        ));
    }
    // the tenant's money, every record so far (the burns included)
    let cost: u64 = records.values().map(cost_of).sum();
    let prompt = TENANT_MONTH_NANO.saturating_sub(cost + LEAVE_NANO) / OPENAI_MINI_INPUT_NANO;
    let id = burn(&url, "soak-a", DEMO_KEY, prompt).await?;
    let burned = records_of(&demo, std::slice::from_ref(&id)).await;
    let burned = burned.get(&id).map_or(0, cost_of);
    let message = probe(&url, "soak-a", DEMO_KEY).await?;
    let left = left_in(&message, true);
    let expected = TENANT_MONTH_NANO as i64 - (cost + burned) as i64;
    let drift = left.map(|l| expected - l as i64);
    ok &= drift == Some(0) && message.contains("tenant-month");
    budget_lines.push(format!(
        "  tenant-month demo: {:.9} USD in the records (+{:.9} burned), the 402 says {} USD left of 100: drift {} nano-USD",
        cost as f64 / 1e9,
        burned as f64 / 1e9,
        left.map_or("?".into(), |l| format!("{:.9}", l as f64 / 1e9)),
        drift.map_or("?".into(), |d| d.to_string())
    ));

    let errors: Vec<&Sent> = sent.iter().filter(|s| s.error.is_some()).collect();
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &sent {
        *kinds.entry(s.kind).or_default() += 1;
    }
    let growth = rss_end as i64 - rss_start as i64;
    let rss_ok = growth <= (args.rss_growth_mib * 1024) as i64;
    ok &= errors.is_empty() && missing == 0 && rss_ok;
    let logs = demo.envoy.logs();
    let trapped = ["panicked", "Uncaught", "RuntimeError"]
        .iter()
        .any(|needle| logs.contains(needle));
    ok &= !trapped;

    text.push_str(&format!(
        "  requests: {} in {:.0} s ({:.1}/s), {kinds:?}\n",
        sent.len(),
        duration.as_secs_f64(),
        sent.len() as f64 / duration.as_secs_f64().max(0.001)
    ));
    text.push_str(&format!(
        "  errors: {} (nothing injected); records missing from the access log: {missing}; wasm trap in Envoy's log: {}\n",
        errors.len(),
        if trapped { "yes" } else { "no" }
    ));
    for e in errors.iter().take(5) {
        text.push_str(&format!(
            "    {} {}: {}\n",
            e.user,
            e.kind,
            e.error
                .as_deref()
                .unwrap_or_default()
                .chars()
                .take(300)
                .collect::<String>()
        ));
    }
    text.push_str(&format!(
        "  Envoy RSS: {} MiB at start, {} MiB after the warm-up ({} s), {} MiB at the end, {} MiB max; growth after the warm-up {:+} MiB (bound {} MiB): {}\n",
        samples.first().map_or(0, |s| s.1) / 1024,
        rss_start / 1024,
        warm_up.as_secs(),
        rss_end / 1024,
        rss_max / 1024,
        growth / 1024,
        args.rss_growth_mib,
        if rss_ok { "ok" } else { "TOO MUCH" }
    ));
    let sampled: Vec<String> = samples
        .iter()
        .step_by((samples.len() / 12).max(1))
        .map(|(t, kib)| format!("{t:.0}s:{}", kib / 1024))
        .collect();
    text.push_str(&format!("  RSS samples (MiB): {}\n", sampled.join(" ")));
    text.push_str("  budgets (plain build, shared data) vs the access log's records:\n");
    for line in budget_lines {
        text.push_str(&line);
        text.push('\n');
    }
    Ok(Report { text, ok })
}

// ---------------------------------------------------------------------------------------
// Redis part

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn redis_used_memory(redis: &Redis) -> u64 {
    redis
        .command(&["INFO", "memory"])
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("used_memory:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

fn redis_part(duration: Duration, steps_per_second: f64) -> Result<Report, String> {
    llm_gateway_tests::harness::engine::disable_fuel_metering()?;
    let redis = Redis::start()?;
    let fleet = traffic::fleet(
        redis.addr(),
        2,
        2,
        &traffic::ratelimit_config(100, 100_000_000),
        &traffic::usage_config(500),
    )?;
    fleet.clock().set_nanos(now_nanos());
    let mut traffic = Traffic::new(fleet, 0x50a4, Mix::default());
    let started = Instant::now();
    let period = Duration::from_secs_f64(1.0 / steps_per_second);
    let warm_up = (duration / 5).min(Duration::from_secs(60));
    let mut memory_start: Option<Vec<u64>> = None;
    let mut redis_memory_start = 0;
    let mut next = started;
    while started.elapsed() < duration {
        traffic.step()?;
        // the gateway's clock is the wall clock (ticks fire as it passes)
        let now = now_nanos();
        let clock = traffic.fleet().clock().now_nanos();
        if now > clock {
            traffic.advance((now - clock) / 1_000_000)?;
        }
        if memory_start.is_none() && started.elapsed() >= warm_up {
            memory_start = Some(vm_memory(&traffic)?);
            redis_memory_start = redis_used_memory(&redis);
        }
        next += period;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        } else {
            next = Instant::now();
        }
    }
    traffic.drain()?;
    traffic.advance(1_500)?;
    let journal = |t: &Traffic| -> usize {
        (0..t.fleet().instances())
            .map(|i| traffic::journal_entries(t.fleet(), i).len())
            .sum()
    };
    for _ in 0..100 {
        if journal(&traffic) == 0 {
            break;
        }
        traffic.advance(100)?;
    }
    let memory_end = vm_memory(&traffic)?;
    let memory_start = memory_start.unwrap_or_else(|| memory_end.clone());
    let redis_memory_end = redis_used_memory(&redis);

    let books = Books::read(redis.addr())?;
    let outcomes = &traffic.finished;
    let admitted: Vec<_> = outcomes.iter().filter(|o| o.admitted).collect();
    let record_tokens: u64 = admitted.iter().map(|o| o.total_tokens()).sum();
    let record_cost: u64 = admitted.iter().map(|o| o.cost_nano()).sum();
    let budget_tokens: i64 = books
        .budgets
        .iter()
        .filter(|(k, _)| k.contains(":bud:tenant-day:"))
        .map(|(_, v)| v)
        .sum();
    let budget_cost: i64 = books
        .budgets
        .iter()
        .filter(|(k, _)| k.contains(":bud:consumer-day:"))
        .map(|(_, v)| v)
        .sum();
    let ledger_tokens: u64 = books
        .ledger
        .iter()
        .map(|(_, r)| r["usage"]["total_tokens"].as_u64().unwrap_or(0))
        .sum();
    let by_id: HashMap<&str, &Value> = outcomes
        .iter()
        .filter_map(|o| Some((o.request_id()?, o.record.as_ref()?)))
        .collect();
    let ledger_mismatches = books
        .ledger
        .iter()
        .filter(|(id, r)| by_id.get(id.as_str()) != Some(&r))
        .count();
    let mut unique = std::collections::HashSet::new();
    let duplicates = books
        .ledger
        .iter()
        .filter(|(id, _)| !unique.insert(id.clone()))
        .count();
    let aborted = outcomes.iter().filter(|o| o.aborted).count();
    let errors: Vec<_> = outcomes
        .iter()
        .filter(|o| {
            o.status != 200
                || o.record.is_none()
                || (!o.aborted
                    && (!o.complete_for_client
                        || o.record.as_ref().is_some_and(|r| r["complete"] != true)))
        })
        .collect();
    let ledger_errors = traffic
        .fleet()
        .metric_sum("llm_gateway.usage.ledger_errors");
    let redis_failures = traffic
        .fleet()
        .metric_sum("llm_gateway.ratelimit.redis_failures");
    let drift_tokens = budget_tokens - record_tokens as i64;
    let drift_cost = budget_cost - record_cost as i64;
    let drift_ledger = ledger_tokens as i64 - record_tokens as i64;
    let ok = errors.is_empty()
        && drift_tokens == 0
        && drift_cost == 0
        && drift_ledger == 0
        && books.ledger.len() == outcomes.len()
        && ledger_mismatches == 0
        && duplicates == 0
        && books.reservations == 0
        && journal(&traffic) == 0;
    let growth: Vec<i64> = memory_end
        .iter()
        .zip(&memory_start)
        .map(|(e, s)| *e as i64 - *s as i64)
        .collect();
    let mut text = String::new();
    text.push_str(&format!(
        "  requests: {} in {:.0} s ({:.1}/s), {} streamed, {aborted} client aborts (injected)\n",
        outcomes.len(),
        duration.as_secs_f64(),
        outcomes.len() as f64 / duration.as_secs_f64().max(0.001),
        outcomes.iter().filter(|o| o.stream).count(),
    ));
    text.push_str(&format!(
        "  errors: {} (beyond the aborts); Redis call failures {redis_failures}, ledger append failures {ledger_errors}\n",
        errors.len()
    ));
    for e in errors.iter().take(5) {
        text.push_str(&format!(
            "    request {}: status {} {:?} complete_for_client {}\n",
            e.seq, e.status, e.code, e.complete_for_client
        ));
    }
    text.push_str(&format!(
        "  tokens: Redis budget keys (tenant-day) {budget_tokens}, ledger stream {ledger_tokens} ({} entries, {duplicates} duplicates, {ledger_mismatches} differing from their record), records {record_tokens}: drift budget {drift_tokens}, ledger {drift_ledger}\n",
        books.ledger.len()
    ));
    text.push_str(&format!(
        "  money: Redis budget keys (consumer-day) {budget_cost} nano-USD, records {record_cost}: drift {drift_cost}\n"
    ));
    text.push_str(&format!(
        "  left behind: {} reservations, {} journal entries\n",
        books.reservations,
        journal(&traffic)
    ));
    text.push_str(&format!(
        "  wasm linear memory per VM after the warm-up -> end: {:.1} -> {:.1} MiB in all (largest growth of one VM {} KiB); redis used_memory {:.1} -> {:.1} MiB (the ledger stream grows by design)\n",
        memory_start.iter().sum::<u64>() as f64 / 1048576.0,
        memory_end.iter().sum::<u64>() as f64 / 1048576.0,
        growth.iter().max().copied().unwrap_or(0) / 1024,
        redis_memory_start as f64 / 1048576.0,
        redis_memory_end as f64 / 1048576.0,
    ));
    Ok(Report { text, ok })
}

/// Linear memory of every VM of the fleet, bytes.
fn vm_memory(traffic: &Traffic) -> Result<Vec<u64>, String> {
    let fleet = traffic.fleet();
    let mut out = Vec::new();
    for i in 0..fleet.instances() {
        for w in 0..fleet.workers() {
            for f in 0..5 {
                out.push(fleet.memory_bytes(i, w, f)?);
            }
        }
    }
    Ok(out)
}
