//! `scripts/bench`: what the gateway costs on the request path, measured side by side in one
//! run on this machine. Rows: A the mock upstream directly, B bare Envoy (router only),
//! C Envoy with key-auth (the chain as it exists); `wrk` load, non-streaming chat with a
//! ~2 KB prompt, Envoy on CPU 0 with `--concurrency 1`, wrk and the mock upstream on CPU 1.
//!
//! Usage: `bench [--window SECS] [--rounds N] [--connections N] [--out FILE] [--compare DIR]`
//! (`--compare DIR` adds a row C' running the same chain with the `.wasm` files of DIR, to
//! measure a change against the current build in one run).

use llm_gateway_tests::envoy::{Envoy, Options};
use llm_gateway_tests::workspace::{self, TempDir};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const TEAM_A: &str = "sk-e2e-team-a-4f1c9a7e2b";

/// One measurement window.
#[derive(Clone)]
struct Sample {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    /// Envoy's CPU time (user + system, all threads) per request; `None` for row A.
    envoy_cpu_us: Option<f64>,
}

/// A row: medians over its windows.
struct Row {
    name: &'static str,
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    envoy_cpu_us: Option<f64>,
}

impl Row {
    fn median(name: &'static str, samples: &[Sample]) -> Row {
        let median = |f: &dyn Fn(&Sample) -> Option<f64>| -> Option<f64> {
            let mut values: Vec<f64> = samples.iter().filter_map(f).collect();
            values.sort_by(f64::total_cmp);
            values.get(values.len() / 2).copied()
        };
        Row {
            name,
            rps: median(&|s| Some(s.rps)).unwrap_or(0.0),
            p50_us: median(&|s| Some(s.p50_us)).unwrap_or(0.0),
            p99_us: median(&|s| Some(s.p99_us)).unwrap_or(0.0),
            envoy_cpu_us: median(&|s| s.envoy_cpu_us),
        }
    }
}

fn main() {
    if let Err(err) = run() {
        eprintln!("bench failed: {err}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let mut window = 4u32;
    let mut rounds = 5u32;
    let mut connections = 16u32;
    let mut out = workspace::root().join("target/bench/report.md");
    let mut compare: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--window" => window = value()?.parse().map_err(|e| format!("--window: {e}"))?,
            "--rounds" => rounds = value()?.parse().map_err(|e| format!("--rounds: {e}"))?,
            "--connections" => {
                connections = value()?
                    .parse()
                    .map_err(|e| format!("--connections: {e}"))?
            }
            "--out" => out = value()?.into(),
            "--compare" => compare = Some(value()?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }

    let dir = TempDir::new("bench")?;
    let mock = MockProcess::start()?;
    let lua = dir.path().join("post.lua");
    std::fs::write(&lua, wrk_script()).map_err(|e| e.to_string())?;

    let key_auth_config = std::fs::read_to_string(workspace::envoy_config("e2e-key-auth.json"))
        .map_err(|e| e.to_string())?;
    let key_auth_config: serde_json::Value =
        serde_json::from_str(&key_auth_config).map_err(|e| e.to_string())?;
    let mock_port = mock.port.to_string();

    // Both Envoys run for the whole benchmark (an idle one costs nothing) and the rows are
    // measured in interleaved windows, so a slow minute on this shared machine hits every
    // row alike; each row reports the median of its windows.
    let bare = pinned_envoy("bench-bare.yaml", &[("MOCK_PORT", mock_port.clone())])?;
    let chain_vars = |wasm_dir: Option<&str>| {
        let mut vars = vec![
            ("MOCK_PORT", mock_port.clone()),
            (
                "KEY_AUTH_CONFIG",
                key_auth_config.to_string().replace('\'', "''"),
            ),
        ];
        if let Some(dir) = wasm_dir {
            vars.push(("WASM_DIR", dir.to_string()));
        }
        vars
    };
    let chain = pinned_envoy("bench-chain.yaml", &chain_vars(None))?;
    let mut targets: Vec<(&'static str, String, Option<u32>)> = vec![
        (
            "A  mock upstream directly",
            format!("http://127.0.0.1:{}", mock.port),
            None,
        ),
        ("B  Envoy 1.40, router only", bare.url(), Some(bare.pid())),
        ("C  Envoy + key-auth", chain.url(), Some(chain.pid())),
    ];
    // --compare DIR: one more row, the same chain built from DIR/*.wasm (A/B of a change)
    let other = match &compare {
        Some(dir) => Some(pinned_envoy("bench-chain.yaml", &chain_vars(Some(dir)))?),
        None => None,
    };
    if let Some(other) = &other {
        targets.push((
            "C' Envoy + chain from --compare",
            other.url(),
            Some(other.pid()),
        ));
    }
    for (_, url, _) in &targets {
        wrk(url, &lua, 2, connections)?; // warm-up: connections, VM tiers, caches
    }
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); targets.len()];
    for round in 0..rounds {
        eprintln!("round {}/{rounds}", round + 1);
        for ((_, url, pid), into) in targets.iter().zip(samples.iter_mut()) {
            into.push(measure(url, &lua, window, connections, *pid)?);
        }
    }
    let rows: Vec<Row> = targets
        .iter()
        .zip(&samples)
        .map(|((name, _, _), samples)| Row::median(name, samples))
        .collect();

    let report = render(&rows, window, rounds, connections);
    println!("{report}");
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
    }
    std::fs::write(&out, &report).map_err(|e| e.to_string())?;
    println!("written to {}", out.display());
    Ok(())
}

/// Envoy with one worker, pinned to CPU 0.
fn pinned_envoy(template: &str, vars: &[(&str, String)]) -> Result<Envoy, String> {
    let options = Options {
        concurrency: 1,
        trace_wasm: false,
    };
    let envoy = Envoy::start_with(template, vars, &options)?;
    let pid = envoy.pid().to_string();
    let status = Command::new("taskset")
        .args(["-a", "-p", "-c", "0", &pid])
        .stdout(Stdio::null())
        .status();
    if !status.is_ok_and(|s| s.success()) {
        eprintln!("(taskset failed: Envoy is not pinned)");
    }
    Ok(envoy)
}

struct MockProcess {
    child: Child,
    port: u16,
}

impl MockProcess {
    fn start() -> Result<MockProcess, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let bin = exe.with_file_name("mock-upstream");
        let mut child = Command::new("taskset")
            .args(["-c", "1"])
            .arg(&bin)
            .args(["--listen", "127.0.0.1:0", "--threads", "1"])
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or(format!("unexpected mock-upstream output {line:?}"))?;
        Ok(MockProcess { child, port })
    }
}

impl Drop for MockProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A chat request with a ~2 KB prompt and the test key.
fn wrk_script() -> String {
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(45);
    let body =
        serde_json::json!({"model": "fast", "messages": [{"role": "user", "content": prompt}]})
            .to_string();
    format!(
        "wrk.method = \"POST\"\nwrk.path = \"/v1/chat/completions\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.headers[\"Authorization\"] = \"Bearer {TEAM_A}\"\nwrk.body = [[{body}]]\n"
    )
}

/// CPU time of a process so far (user + system, all threads), in microseconds.
fn cpu_us(pid: u32) -> Result<f64, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| e.to_string())?;
    // fields after the parenthesised command name: state is field 3, utime 14, stime 15
    let rest = stat
        .rsplit_once(") ")
        .map(|(_, r)| r)
        .ok_or("bad /proc stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<f64, String> {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or(format!("bad /proc stat field {i}"))
    };
    // SAFETY: sysconf has no preconditions.
    #[allow(unsafe_code)]
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((ticks(11)? + ticks(12)?) * 1_000_000.0 / hz)
}

fn wrk(url: &str, lua: &std::path::Path, secs: u32, connections: u32) -> Result<String, String> {
    let output = Command::new("taskset")
        .args(["-c", "1", "wrk", "-t1", "--latency"])
        .arg(format!("-c{connections}"))
        .arg(format!("-d{secs}s"))
        .arg("-s")
        .arg(lua)
        .arg(url)
        .output()
        .map_err(|e| format!("wrk: {e} (apt-get install wrk)"))?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() || text.contains("Non-2xx") || text.contains("Socket errors") {
        return Err(format!("wrk against {url} failed or saw errors:\n{text}"));
    }
    Ok(text)
}

fn measure(
    url: &str,
    lua: &std::path::Path,
    secs: u32,
    connections: u32,
    envoy_pid: Option<u32>,
) -> Result<Sample, String> {
    let cpu_before = envoy_pid.map(cpu_us).transpose()?;
    let text = wrk(url, lua, secs, connections)?;
    let cpu_after = envoy_pid.map(cpu_us).transpose()?;
    let requests: f64 = text
        .lines()
        .find_map(|l| l.trim().split_once(" requests in "))
        .and_then(|(n, _)| n.trim().parse().ok())
        .ok_or(format!("no request count in wrk output:\n{text}"))?;
    let rps = text
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or(format!("no Requests/sec in wrk output:\n{text}"))?;
    let percentile = |p: &str| -> Result<f64, String> {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(p))
            .map(|v| parse_latency_us(v.trim()))
            .ok_or(format!("no {p} latency in wrk output"))?
    };
    Ok(Sample {
        rps,
        p50_us: percentile("50%")?,
        p99_us: percentile("99%")?,
        envoy_cpu_us: cpu_before.zip(cpu_after).map(|(b, a)| (a - b) / requests),
    })
}

/// wrk prints `812.00us`, `1.23ms`, `2.00s`.
fn parse_latency_us(text: &str) -> Result<f64, String> {
    let (number, scale) = if let Some(v) = text.strip_suffix("us") {
        (v, 1.0)
    } else if let Some(v) = text.strip_suffix("ms") {
        (v, 1_000.0)
    } else if let Some(v) = text.strip_suffix('s') {
        (v, 1_000_000.0)
    } else {
        return Err(format!("latency {text:?}"));
    };
    number
        .parse::<f64>()
        .map(|n| n * scale)
        .map_err(|e| format!("latency {text:?}: {e}"))
}

fn render(rows: &[Row], window: u32, rounds: u32, connections: u32) -> String {
    let mut out = format!(
        "# llm-gateway bench\n\nnon-streaming chat, ~2 KB prompt, wrk -t1 -c{connections}; medians of {rounds} interleaved {window}-second windows per row; Envoy --concurrency 1 on CPU 0, wrk and mock upstream on CPU 1\n\n| row | req/s | p50 | p99 | p50 added over A | Envoy CPU per request |\n|---|---:|---:|---:|---:|---:|\n"
    );
    let base = rows.first().map_or(0.0, |r| r.p50_us);
    for row in rows {
        out.push_str(&format!(
            "| {} | {:.0} | {:.0} µs | {:.0} µs | {:.0} µs | {} |\n",
            row.name,
            row.rps,
            row.p50_us,
            row.p99_us,
            row.p50_us - base,
            row.envoy_cpu_us
                .map_or("-".to_string(), |us| format!("{us:.1} µs")),
        ));
    }
    if let (Some(b), Some(c)) = (rows.get(1), rows.get(2)) {
        out.push_str(&format!(
            "\nC/B throughput: {:.1} %; the chain adds {:.0} µs at p50 and {:.1} µs of Envoy CPU per request over bare Envoy\n",
            100.0 * c.rps / b.rps,
            c.p50_us - b.p50_us,
            c.envoy_cpu_us.zip(b.envoy_cpu_us).map_or(0.0, |(c, b)| c - b),
        ));
    }
    out
}
