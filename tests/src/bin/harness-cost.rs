//! Cost of the compiled plugins in the wasmtime harness: wasm fuel, host calls and bytes
//! across the boundary per request / per event, wall-clock throughput of the wasm run, VM
//! start + configure time and linear memory per VM (a deterministic complement to
//! `scripts/bench`, which measures time in a real Envoy).
//!
//! Usage (after `scripts/build`; build this binary with `--release` for the times):
//! `harness-cost [--plugin key-auth|model-router|pii-redaction|usage-accounting|token-ratelimit|all] [--requests N]
//! [--runs N] [--fuel off]`. Prints markdown tables. Fuel is deterministic; times are medians
//! over `--runs` and vary with the machine's load. `--fuel off` turns wasmtime's fuel metering
//! off (fuel columns then read 0) to time the plugins without its overhead.
//!
//! Workloads: `llm_gateway_tests::workloads` (each plugin's e2e configuration).

use llm_gateway_tests::harness::{
    cost, engine, CallCost, FilterSpec, Fleet, Host, Request, Response,
};
use llm_gateway_tests::workloads as w;
use std::time::{Duration, Instant};

struct Options {
    plugins: Vec<String>,
    requests: u64,
    runs: usize,
}

fn main() -> Result<(), String> {
    let mut opts = Options {
        plugins: Vec::new(),
        requests: 200,
        runs: 7,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--requests" => opts.requests = value()?.parse().map_err(|_| "--requests N")?,
            "--runs" => opts.runs = value()?.parse().map_err(|_| "--runs N")?,
            "--plugin" => opts.plugins.push(value()?),
            "--fuel" => match value()?.as_str() {
                "off" => engine::disable_fuel_metering()?,
                "on" => {}
                other => return Err(format!("--fuel on|off, not {other}")),
            },
            other => return Err(format!("unknown argument {other}")),
        }
    }
    opts.runs = opts.runs.max(1);
    if opts.plugins.is_empty() || opts.plugins.iter().any(|p| p == "all") {
        opts.plugins = [
            "key-auth",
            "model-router",
            "pii-redaction",
            "usage-accounting",
            "token-ratelimit",
        ]
        .map(String::from)
        .to_vec();
    }
    if !engine::fuel_metering() {
        println!("_Fuel metering off: fuel columns read 0; times are without its overhead._\n");
    }
    for plugin in &opts.plugins {
        match plugin.as_str() {
            "key-auth" => key_auth(&opts)?,
            "model-router" => model_router(&opts)?,
            "pii-redaction" => pii_redaction(&opts)?,
            "usage-accounting" => usage_accounting(&opts)?,
            "token-ratelimit" => token_ratelimit(&opts)?,
            other => return Err(format!("no cost workload for plugin {other}")),
        }
    }
    Ok(())
}

/// Median of samples.
fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn wall(costs: &[CallCost], keep: impl Fn(&CallCost) -> bool) -> Duration {
    costs.iter().filter(|c| keep(c)).map(|c| c.wall).sum()
}

fn mb_per_s(bytes: usize, time: Duration) -> f64 {
    bytes as f64 / time.as_secs_f64().max(1e-12) / 1e6
}

/// Module size, VM start + configure time (median of `runs`), fuel of the start, linear
/// memory after configure: one table row.
fn vm_row(spec: &FilterSpec, runs: usize) -> Result<String, String> {
    let size = std::fs::metadata(&spec.path)
        .map_err(|e| format!("{}: {e}", spec.path.display()))?
        .len();
    Fleet::single(spec.clone())?; // compiles (or loads) the module once
    let mut times = Vec::new();
    let mut fuel = 0;
    let mut memory = 0;
    for _ in 0..runs.max(5) {
        let started = Instant::now();
        let fleet = Fleet::single(spec.clone())?;
        times.push(started.elapsed());
        fuel = cost::Totals::of(&fleet.costs()).fuel;
        memory = fleet.memory_bytes(0, 0, 0)?;
    }
    Ok(format!(
        "| {} | {} | {:.0} KiB | {:.2} ms | {} | {} KiB |\n",
        spec.name,
        spec.root_id,
        size as f64 / 1024.0,
        median(times).as_secs_f64() * 1e3,
        fuel,
        memory / 1024,
    ))
}

fn vm_table(specs: &[FilterSpec], runs: usize) -> Result<String, String> {
    let mut out = String::from(
        "| plugin | root_id | module | VM start + configure (median) | fuel | linear memory after configure |\n|---|---|---:|---:|---:|---:|\n",
    );
    for spec in specs {
        out.push_str(&vm_row(spec, runs)?);
    }
    Ok(out)
}

/// One measured scenario: `runs` exchanges of the same request on one warm VM.
struct Scenario {
    label: String,
    /// Bytes of the body the throughput is about.
    bytes: usize,
    /// The costs of each exchange.
    exchanges: Vec<Vec<CallCost>>,
    /// Linear memory of the measured plugin's VM afterwards.
    memory: u64,
}

impl Scenario {
    fn of_plugin(&self, plugin: &str) -> Vec<CallCost> {
        self.exchanges
            .iter()
            .flatten()
            .filter(|c| c.plugin == plugin)
            .cloned()
            .collect()
    }

    fn per_exchange(&self) -> u64 {
        self.exchanges.len() as u64
    }

    /// Median over exchanges of the wall time of the callbacks `keep` selects.
    fn median_wall(&self, keep: impl Fn(&CallCost) -> bool + Copy) -> Duration {
        median(self.exchanges.iter().map(|e| wall(e, keep)).collect())
    }
}

/// Runs `request` `warm + runs` times through `fleet`, answering with `respond`; keeps the
/// last `runs`.
fn run(
    label: &str,
    bytes: usize,
    fleet: &Fleet,
    filter: usize,
    request: &Request,
    respond: impl Fn(&llm_gateway_tests::harness::Upstream) -> Response,
    runs: usize,
) -> Result<Scenario, String> {
    fleet.exchange(0, 0, request, &respond)?; // warm-up: first-request probing, allocations
    let mut exchanges = Vec::new();
    for _ in 0..runs {
        let ex = fleet.exchange(0, 0, request, &respond)?;
        if ex.local_reply.is_some() {
            return Err(format!("{label}: refused: {}", ex.text()));
        }
        exchanges.push(ex.cost);
    }
    Ok(Scenario {
        label: label.to_string(),
        bytes,
        exchanges,
        memory: fleet.memory_bytes(0, 0, filter)?,
    })
}

/// Summary rows: per request, the plugin's fuel, host calls, bytes, fuel per KiB of body,
/// median wall time of the callbacks `timed` selects and the throughput it gives.
fn summary(
    plugin: &str,
    scenarios: &[Scenario],
    timed: impl Fn(&CallCost) -> bool + Copy,
) -> String {
    let mut out = String::from(
        "| workload | body | fuel/request | fuel/KiB | host calls/request | bytes in/request | bytes out/request | wasm time (median) | wasm MB/s | linear memory after |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for s in scenarios {
        let costs = s.of_plugin(plugin);
        let n = s.per_exchange().max(1);
        let t = cost::Totals::of(&costs);
        let time = s.median_wall(|c| c.plugin == plugin && timed(c));
        out.push_str(&format!(
            "| {} | {:.1} KiB | {} | {} | {:.1} | {} | {} | {:.1} µs | {:.0} | {} KiB |\n",
            s.label,
            s.bytes as f64 / 1024.0,
            t.fuel / n,
            t.fuel / n * 1024 / s.bytes.max(1) as u64,
            t.host_calls as f64 / n as f64,
            t.bytes_in / n,
            t.bytes_out / n,
            time.as_secs_f64() * 1e6,
            mb_per_s(s.bytes, time),
            s.memory / 1024,
        ));
    }
    out
}

fn key_auth(opts: &Options) -> Result<(), String> {
    println!("# key-auth\n");
    println!("{}", vm_table(&[w::key_auth()?], opts.runs)?);
    let body = serde_json::json!({"model": "fast", "messages": [{"role": "user", "content": "x".repeat(2000)}]});
    for (label, key) in [
        ("allowed (x-api-key of team-a)", w::TEAM_A_KEY),
        ("refused (unknown key)", "sk-e2e-nobody-0000000000"),
    ] {
        let fleet = Fleet::single(w::key_auth()?)?;
        let request = Request::post("/v1/chat/completions")
            .property("xds.route_name", "default")
            .property("xds.cluster_name", "mock")
            .header("x-api-key", key)
            .json(&body);
        // one warm-up request (first-request property probing), not counted
        fleet.exchange(0, 0, &request, |_| Response::status(200))?;
        let mut costs = Vec::new();
        let mut times = Vec::new();
        for _ in 0..opts.requests {
            let ex = fleet.exchange(0, 0, &request, |_| {
                Response::json(&serde_json::json!({"object": "chat.completion"}))
            })?;
            times.push(wall(&ex.cost, |_| true));
            costs.extend(ex.cost);
        }
        println!(
            "## key-auth, {label}, {} requests (units: per request)\n",
            opts.requests
        );
        println!("{}", cost::table(&costs, opts.requests));
        println!(
            "wasm time per request (median, all callbacks): {:.1} µs; linear memory after: {} KiB\n",
            median(times).as_secs_f64() * 1e6,
            fleet.memory_bytes(0, 0, 0)? / 1024
        );
    }
    Ok(())
}

fn model_router(opts: &Options) -> Result<(), String> {
    println!("# model-router\n");
    println!(
        "{}",
        vm_table(&[w::router_downstream()?, w::router_upstream()?], opts.runs)?
    );
    let mut scenarios = Vec::new();
    let mut tables = Vec::new();
    for (size, label) in [(4 * 1024, "4 KB"), (256 * 1024, "256 KB")] {
        let body = w::chat_body(size);
        // downstream: key-auth sets x-llm-groups, the router plans and rewrites `model`
        let fleet = Fleet::builder()
            .filter(w::key_auth()?)
            .filter(w::router_downstream()?)
            .build()?;
        let s = run(
            &format!("downstream, {label} chat"),
            body.len(),
            &fleet,
            1,
            &w::router_request(&body),
            |_| w::chat_completion(),
            opts.runs,
        )?;
        let all: Vec<CallCost> = s.exchanges.iter().flatten().cloned().collect();
        tables.push((s.label.clone(), cost::table(&all, s.per_exchange())));
        scenarios.push(s);
        // upstream: attempt 1 of plan a,b: rewrite `model` for deployment a, its credential
        let fleet = Fleet::single(w::router_upstream()?)?;
        let s = run(
            &format!("upstream, {label} chat"),
            body.len(),
            &fleet,
            0,
            &w::router_attempt_request(&body),
            |_| w::chat_completion(),
            opts.runs,
        )?;
        let all: Vec<CallCost> = s.exchanges.iter().flatten().cloned().collect();
        tables.push((s.label.clone(), cost::table(&all, s.per_exchange())));
        scenarios.push(s);
    }
    println!(
        "## model-router per request (bodies in {} KiB chunks; wasm time: the router's request callbacks)\n",
        w::CHUNK / 1024
    );
    println!(
        "{}",
        summary("model-router", &scenarios, |c| c
            .callback
            .contains("request"))
    );
    for (label, table) in tables {
        println!("### {label}, per callback (units: per request)\n\n{table}");
    }
    Ok(())
}

fn pii_redaction(opts: &Options) -> Result<(), String> {
    println!("# pii-redaction\n");
    println!("{}", vm_table(&[w::pii()?], opts.runs)?);
    let mut scenarios = Vec::new();
    for (size, label) in [(8 * 1024, "8 KB"), (256 * 1024, "256 KB")] {
        for with_pii in [true, false] {
            let fleet = Fleet::single(w::pii()?)?;
            let text = w::prose(size, with_pii);
            let request = w::pii_request(&text, false);
            let bytes = request.chunks.iter().map(Vec::len).sum();
            let kind = if with_pii { "with PII" } else { "no PII" };
            scenarios.push(run(
                &format!("request scan, {label} prompt, {kind}"),
                bytes,
                &fleet,
                0,
                &request,
                |_| w::chat_completion(),
                opts.runs,
            )?);
        }
    }
    println!(
        "## pii-redaction request scan, every built-in detector (bodies in {} KiB chunks; fuel, calls, bytes: the whole exchange; wasm time: request callbacks)\n",
        w::CHUNK / 1024
    );
    println!(
        "{}",
        summary("pii-redaction", &scenarios, |c| c
            .callback
            .contains("request"))
    );

    // the stream: the masked 8 KB prompt echoed back as 2 000 events, 1 KB network chunks
    let events: u64 = 2000;
    let fleet = Fleet::single(w::pii()?)?;
    let request = w::pii_request(&w::prose(8 * 1024, true), true);
    let mut masked = String::new();
    let mut stream_bytes = 0;
    let respond = |up: &llm_gateway_tests::harness::Upstream| {
        let text = w::sent_user_text(&up.body).unwrap_or_default();
        w::echo_stream(&text, events as usize, 1024)
    };
    fleet.exchange(0, 0, &request, |up| {
        masked = w::sent_user_text(&up.body).unwrap_or_default();
        let r = respond(up);
        stream_bytes = r.chunks.iter().map(Vec::len).sum();
        r
    })?;
    if !masked.contains("[EMAIL_1]") {
        return Err("the streamed prompt was not masked".into());
    }
    let s = run(
        "stream",
        stream_bytes,
        &fleet,
        0,
        &request,
        respond,
        opts.runs,
    )?;
    let body_cb = |c: &CallCost| c.callback == "proxy_on_response_body";
    let costs: Vec<CallCost> = s.of_plugin("pii-redaction");
    let n = s.per_exchange().max(1);
    let response = cost::Totals::of(costs.iter().filter(|c| body_cb(c)));
    let time = s.median_wall(body_cb);
    println!("## pii-redaction streamed response with restore: {events} events, 1 KiB chunks\n");
    println!("| stream | chunks | fuel/event | fuel/chunk | host calls/event | bytes in/event | bytes out/event | wasm time (median) | µs/event | wasm MB/s | linear memory after |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {:.1} KiB | {} | {} | {} | {:.2} | {:.0} | {:.0} | {:.2} ms | {:.2} | {:.0} | {} KiB |\n",
        stream_bytes as f64 / 1024.0,
        response.callbacks / n,
        response.fuel / n / events,
        response.fuel / response.callbacks.max(1),
        response.host_calls as f64 / (n * events) as f64,
        response.bytes_in as f64 / (n * events) as f64,
        response.bytes_out as f64 / (n * events) as f64,
        time.as_secs_f64() * 1e3,
        time.as_secs_f64() * 1e6 / events as f64,
        mb_per_s(stream_bytes, time),
        s.memory / 1024,
    );
    println!(
        "### stream, per callback (units: per stream)\n\n{}",
        cost::table(&costs, n)
    );
    Ok(())
}

fn usage_accounting(opts: &Options) -> Result<(), String> {
    println!("# usage-accounting\n");
    println!("{}", vm_table(&[w::usage()?], opts.runs)?);
    let events: u64 = 2000;
    println!("## usage-accounting, a {events}-event chat stream with usage (the plugin added `include_usage` and hides the usage chunk)\n");
    println!("| delivery | chunks | fuel/event | host calls/event | bytes in/event | bytes out/event | wasm time (median) | µs/event | wasm MB/s | linear memory after |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut tables = Vec::new();
    for (chunk, label) in [(0, "one event per callback"), (1024, "1 KiB chunks")] {
        let fleet = Fleet::single(w::usage()?)?;
        let respond = |_: &llm_gateway_tests::harness::Upstream| {
            w::usage_stream(events as usize, true, chunk)
        };
        let bytes = respond(&Default::default())
            .chunks
            .iter()
            .map(Vec::len)
            .sum();
        let s = run(
            label,
            bytes,
            &fleet,
            0,
            &w::usage_request("cost-1"),
            respond,
            opts.runs,
        )?;
        let body_cb = |c: &CallCost| c.callback == "proxy_on_response_body";
        let costs = s.of_plugin("usage-accounting");
        let n = s.per_exchange().max(1);
        let body = cost::Totals::of(costs.iter().filter(|c| body_cb(c)));
        let time = s.median_wall(body_cb);
        println!(
            "| {label} | {} | {} | {:.2} | {:.0} | {:.0} | {:.2} ms | {:.2} | {:.0} | {} KiB |",
            body.callbacks / n,
            body.fuel / n / events,
            body.host_calls as f64 / (n * events) as f64,
            body.bytes_in as f64 / (n * events) as f64,
            body.bytes_out as f64 / (n * events) as f64,
            time.as_secs_f64() * 1e3,
            time.as_secs_f64() * 1e6 / events as f64,
            mb_per_s(bytes, time),
            s.memory / 1024,
        );
        tables.push((label, cost::table(&costs, n)));
    }
    println!();

    // the tokenizer: built once per VM, by the first request that must estimate
    let fleet = Fleet::single(w::usage()?)?;
    let configured = fleet.memory_bytes(0, 0, 0)?;
    let mut rows = vec![("after configure".to_string(), configured, None)];
    let with_usage = |_: &llm_gateway_tests::harness::Upstream| w::usage_stream(100, true, 1024);
    let without = |_: &llm_gateway_tests::harness::Upstream| w::usage_stream(100, false, 1024);
    for i in 0..3 {
        fleet.exchange(0, 0, &w::usage_request(&format!("warm-{i}")), with_usage)?;
    }
    rows.push((
        "after 3 streams with usage (no tokenizer)".into(),
        fleet.memory_bytes(0, 0, 0)?,
        None,
    ));
    for i in 1..=3 {
        let ex = fleet.exchange(0, 0, &w::usage_request(&format!("est-{i}")), without)?;
        let record: serde_json::Value = ex
            .filter_state
            .get("wasm.llm_usage")
            .and_then(|r| serde_json::from_slice(r).ok())
            .ok_or("no usage record")?;
        if record["usage_source"] != "estimated" {
            return Err(format!("not estimated: {record}"));
        }
        rows.push((
            format!("after estimated stream {i} (o200k_base)"),
            fleet.memory_bytes(0, 0, 0)?,
            Some((cost::Totals::of(&ex.cost).fuel, wall(&ex.cost, |_| true))),
        ));
    }
    println!(
        "## usage-accounting, the tokenizer in one VM (100-event streams, model gpt-4o-mini)\n"
    );
    println!("| VM state | linear memory | fuel of that request | wasm time of that request |\n|---|---:|---:|---:|");
    for (label, memory, request) in rows {
        let (fuel, time) = match request {
            Some((fuel, time)) => (
                fuel.to_string(),
                format!("{:.1} ms", time.as_secs_f64() * 1e3),
            ),
            None => ("".into(), "".into()),
        };
        println!(
            "| {label} | {:.1} MiB | {fuel} | {time} |",
            memory as f64 / (1 << 20) as f64
        );
    }
    println!();
    for (label, table) in tables {
        println!("### stream, {label}, per callback (units: per stream)\n\n{table}");
    }
    Ok(())
}

fn token_ratelimit(opts: &Options) -> Result<(), String> {
    println!("# token-ratelimit\n");
    println!("{}", vm_table(&[w::ratelimit(false)?], opts.runs)?);
    let redis = llm_gateway_tests::redis::Redis::start()?;
    let mut plain = Vec::new();
    let mut higress = Vec::new();
    let mut calls = Vec::new();
    let cases = [
        (false, 4 * 1024, "gpt-4o-mini"),
        (false, 256 * 1024, "gpt-4o-mini"),
        (false, 256 * 1024, "claude-sonnet"),
        (true, 4 * 1024, "gpt-4o-mini"),
        (true, 256 * 1024, "gpt-4o-mini"),
    ];
    for (redis_build, size, model) in cases {
        let builder = if redis_build {
            Fleet::builder()
                .host(Host::Higress)
                .filter(w::usage()?.into_higress()?)
                .redis(w::RATELIMIT_REDIS, redis.addr())
        } else {
            Fleet::builder().filter(w::usage()?)
        };
        let builder = builder.filter(w::ratelimit(redis_build)?);
        let fleet = builder.build()?;
        fleet.clock().set_nanos(1_796_000_000_000_000_000);
        let request = w::ratelimit_request("cost-1", size, model);
        let bytes = request.chunks.iter().map(Vec::len).sum();
        let build = if redis_build {
            "Higress build, Redis"
        } else {
            "plain build, shared data"
        };
        let label = format!("{build}, {} KB chat, {model}", size / 1024);
        let before = fleet.redis().calls();
        let s = run(
            &label,
            bytes,
            &fleet,
            1,
            &request,
            |_| w::chat_completion(),
            opts.runs,
        )?;
        fleet.pump()?;
        let per = (fleet.redis().calls() - before) as f64 / (opts.runs + 1) as f64;
        calls.push((label, per));
        if redis_build {
            higress.push(s);
        } else {
            plain.push(s);
        }
    }
    println!("## token-ratelimit per request (admitted, settled; wasm time: all of its callbacks; gpt-4o-mini is counted with o200k_base, claude-sonnet with chars/4)\n");
    println!("{}", summary("token-ratelimit", &plain, |_| true));
    println!(
        "{}",
        summary("token-ratelimit (Higress build)", &higress, |_| true)
    );
    for s in plain.iter().chain(&higress) {
        let costs: Vec<CallCost> = s.exchanges.iter().flatten().cloned().collect();
        println!(
            "### {}, per callback (units: per request)\n\n{}",
            s.label,
            cost::table(&costs, s.per_exchange())
        );
    }
    println!("| workload | Redis calls/request |\n|---|---:|");
    for (label, per) in calls {
        println!("| {label} | {per:.2} |");
    }
    println!();
    Ok(())
}
