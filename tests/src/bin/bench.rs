//! `scripts/bench`: what the gateway costs on the request path, measured side by side in one
//! run on this machine (issues 9 and 19). Rows: A the mock upstream directly; B Envoy 1.40 with
//! the router only; C Envoy with the five-plugin chain of `envoy-config/gateway.yaml` (one
//! module per plugin); E the same chain from the bundle module when `dist/llm-gateway.wasm`
//! exists; F the fused one-filter build when `envoy-config/gateway-fused.yaml` exists; D the
//! LiteLLM proxy. Workloads: chat with a 2 KB and a 32 KB prompt, a 200-event stream echoing a
//! prompt with PII, at 1, 16 and 64 connections, in interleaved fixed-length windows
//! (medians). Then the translation phase (`--translation`, [`translation`]: the 2 KB chat and
//! the stream naming group `claude`, which model-router translates to Anthropic Messages and
//! back, next to the untranslated ones on rows C, E, F at c=16), perf's split, the ablation
//! rows (`--ablation`, [`ablation`]), a leak check through C (and E), the chain in the
//! wasmtime harness on the same workloads (the translated ones too), and the `harness-cost`
//! tables. Writes `target/bench/report.md` and prints it.
//!
//! Usage: `bench [--quick] [--window SECS] [--rounds N] [--connections 1,16,64]
//! [--leak-requests N] [--no-litellm] [--out FILE] [--compare DIR] [--perf | --no-perf]
//! [--ablation | --no-ablation] [--translation | --no-translation] [--harness]` (`--harness`:
//! only the chain in the wasmtime harness, no Envoy: the per-plugin fuel and host calls of the
//! report, deterministic, in seconds)
//! (`--compare DIR` adds a row C' running the chain with the `.wasm` files of DIR, to measure
//! a change against the current build in one run).
//!
//! `bench hostcost [--window SECS] [--rounds N] [--envoy 1.40,1.36] [--out FILE]`: Envoy's
//! cost per proxy-wasm callback and host call instead ([`hostcost`]), in Envoy 1.40 and 1.36.4;
//! `target/bench/report-hostcost.md`.

use llm_gateway_tests::bench::ablation::{self, RequestChange};
use llm_gateway_tests::bench::config::{self, Build};
use llm_gateway_tests::bench::litellm::{self, LiteLlm};
use llm_gateway_tests::bench::procs::{self, MockProcess};
use llm_gateway_tests::bench::report::{self, AblationRun, Module, Results, Vm, WorkerMemory};
use llm_gateway_tests::bench::translation::{self, Paired, TranslationRun};
use llm_gateway_tests::bench::wrk::{self, Workload, WORKLOADS};
use llm_gateway_tests::bench::{cost, hostcost, perf, Cell, LeakCheck, Row, Window};
use llm_gateway_tests::demo::DEMO_KEY;
use llm_gateway_tests::envoy::{Envoy, Options};
use llm_gateway_tests::workspace::{self, EnvoyVersion, TempDir};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

struct Args {
    quick: bool,
    window: u32,
    rounds: u32,
    connections: Vec<u32>,
    leak_requests: u64,
    litellm: bool,
    out: PathBuf,
    compare: Option<String>,
    perf: bool,
    harness: bool,
    ablation: bool,
    translation: bool,
}

impl Args {
    fn parse() -> Result<Args, String> {
        let raw: Vec<String> = std::env::args().skip(1).collect();
        let quick = raw.iter().any(|a| a == "--quick");
        let mut args = Args {
            quick,
            window: if quick { 1 } else { 2 },
            rounds: if quick { 1 } else { 3 },
            connections: if quick { vec![1, 16] } else { vec![1, 16, 64] },
            leak_requests: if quick { 1_000 } else { 100_000 },
            litellm: !quick,
            out: workspace::root().join(if quick {
                "target/bench/report-quick.md"
            } else {
                "target/bench/report.md"
            }),
            compare: None,
            perf: !quick,
            harness: false,
            ablation: !quick,
            translation: !quick,
        };
        let mut it = raw.into_iter();
        while let Some(arg) = it.next() {
            let mut value = || it.next().ok_or(format!("{arg} needs a value"));
            match arg.as_str() {
                "--quick" => {}
                "--window" => {
                    args.window = value()?.parse().map_err(|e| format!("--window: {e}"))?
                }
                "--rounds" => {
                    args.rounds = value()?.parse().map_err(|e| format!("--rounds: {e}"))?
                }
                "--connections" => {
                    args.connections = value()?
                        .split(',')
                        .map(|c| c.trim().parse::<u32>())
                        .collect::<Result<_, _>>()
                        .map_err(|e| format!("--connections: {e}"))?
                }
                "--leak-requests" => {
                    args.leak_requests = value()?
                        .parse()
                        .map_err(|e| format!("--leak-requests: {e}"))?
                }
                "--no-litellm" => args.litellm = false,
                "--perf" => args.perf = true,
                "--no-perf" => args.perf = false,
                "--harness" => args.harness = true,
                "--ablation" => args.ablation = true,
                "--no-ablation" => args.ablation = false,
                "--translation" => args.translation = true,
                "--no-translation" => args.translation = false,
                "--out" => args.out = value()?.into(),
                "--compare" => args.compare = Some(value()?),
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        if args.window == 0 || args.rounds == 0 || args.connections.is_empty() {
            return Err("--window, --rounds and --connections must be positive".into());
        }
        Ok(args)
    }
}

fn main() {
    let started = Instant::now();
    match run(started) {
        Ok(()) => println!("bench: elapsed {:.0} s", started.elapsed().as_secs_f64()),
        Err(err) => {
            eprintln!("bench failed: {err}");
            std::process::exit(1);
        }
    }
}

/// A proxy (or the mock) under load.
struct Target {
    row: Row,
    url: String,
    /// The process whose CPU and RSS count (`None` for row A).
    pid: Option<u32>,
    /// One wrk script per workload.
    scripts: Vec<PathBuf>,
    /// What its requests change from the workloads' (an ablation row's stand-in).
    change: RequestChange,
}

impl Target {
    /// The key, whether the mock's knobs go through, and the body's model for workload `w`
    /// (a translated workload's names the translation group on every row).
    fn request(&self, w: &Workload) -> (&'static str, bool, String) {
        match self.row {
            Row::LiteLlm if w.streams() => {
                (litellm::MASTER_KEY, false, litellm::STREAM_MODEL.into())
            }
            Row::LiteLlm => (litellm::MASTER_KEY, false, "fast".into()),
            _ => (DEMO_KEY, true, w.model(&self.change.model).to_string()),
        }
    }

    /// A target of `row` at `url` with one script per workload in `dir`.
    fn new(
        row: Row,
        url: String,
        pid: Option<u32>,
        change: RequestChange,
        workloads: &[Workload],
        dir: &Path,
    ) -> Result<Target, String> {
        let mut target = Target {
            row,
            url,
            pid,
            scripts: Vec::new(),
            change,
        };
        for (i, w) in workloads.iter().enumerate() {
            let (key, knob, model) = target.request(w);
            let path = dir.join(format!("{}-{i}.lua", row.file_stem()));
            std::fs::write(
                &path,
                w.lua_for(&model, key, knob, target.change.include_usage),
            )
            .map_err(|e| e.to_string())?;
            target.scripts.push(path);
        }
        Ok(target)
    }
}

/// The requests as the workloads have them.
fn unchanged() -> RequestChange {
    RequestChange {
        model: "fast".into(),
        include_usage: false,
    }
}

fn run(started: Instant) -> Result<(), String> {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    if raw.first().is_some_and(|a| a == "hostcost") {
        let args = hostcost::Args::parse(raw.get(1..).unwrap_or_default())?;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let text = hostcost::run(&args, &exe.with_file_name("mock-upstream"))?;
        println!("{text}");
        println!("written to {}", args.out.display());
        return Ok(());
    }
    let args = Args::parse()?;
    let dir = TempDir::new("bench")?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mock = MockProcess::start(&exe.with_file_name("mock-upstream"))?;
    let workloads: Vec<Workload> = WORKLOADS.to_vec();
    // the main tables' workloads: the translated ones run in the translation phase only
    let main: Vec<usize> = (0..workloads.len())
        .filter(|&w| !workloads[w].translated)
        .collect();
    let mut results = Results {
        quick: args.quick,
        workloads: workloads.clone(),
        connections: args.connections.clone(),
        ..Results::default()
    };
    if args.harness {
        return harness_only(&args, &mut results, &mock, &workloads, started);
    }
    let load_start = load_average();

    // the proxies: each runs for the whole benchmark (an idle one costs nothing)
    let bare = start_envoy(&dir, "bare.yaml", &config::bare(mock.port)?, &[])?;
    let chain_config = config::chain(mock.port, Build::PerPlugin)?;
    let chain = start_envoy(&dir, "chain.yaml", &chain_config, &[])?;
    let compare = match &args.compare {
        Some(wasm_dir) => Some(start_envoy(
            &dir,
            "compare.yaml",
            &chain_config,
            &[("WASM_DIR", wasm_dir.clone())],
        )?),
        None => None,
    };
    let bundle_path = workspace::wasm_dir().join(config::BUNDLE_FILE);
    let bundle = if bundle_path.is_file() {
        start_envoy(
            &dir,
            "bundle.yaml",
            &config::chain(mock.port, Build::Bundle)?,
            &[],
        )
        .map_err(|e| format!("the bundle did not start: {}", first_lines(&e, 6)))
    } else {
        Err(format!(
            "bundle not built ({} is missing)",
            bundle_path.display()
        ))
    };
    let fused = match config::fused(mock.port) {
        Ok(Some(fused_config)) => start_envoy(&dir, "fused.yaml", &fused_config, &[])
            .map_err(|e| format!("the fused build did not start: {}", first_lines(&e, 6))),
        Ok(None) => Err(format!(
            "not built (envoy-config/{} is missing)",
            config::FUSED_TEMPLATE
        )),
        Err(e) => Err(format!("its config: {e}")),
    };
    let litellm = if args.litellm {
        litellm::install(&workspace::root().join("target/bench/litellm-install.log"))
            .and_then(|()| LiteLlm::start(&mock.url(), dir.path()))
    } else {
        Err("skipped (--quick or --no-litellm)".into())
    };

    let mut targets = Vec::new();
    let mut add = |row: Row, url: String, pid: Option<u32>| -> Result<(), String> {
        targets.push(Target::new(
            row,
            url,
            pid,
            unchanged(),
            &workloads,
            dir.path(),
        )?);
        Ok(())
    };
    add(Row::Mock, mock.url(), None)?;
    add(Row::Bare, bare.url(), Some(bare.pid()))?;
    add(Row::Chain, chain.url(), Some(chain.pid()))?;
    results.rows = vec![
        (Row::Mock, Ok(())),
        (Row::Bare, Ok(())),
        (Row::Chain, Ok(())),
    ];
    if let Some(envoy) = &compare {
        add(Row::Compare, envoy.url(), Some(envoy.pid()))?;
        results.rows.push((Row::Compare, Ok(())));
    }
    match &bundle {
        Ok(envoy) => {
            add(Row::Bundle, envoy.url(), Some(envoy.pid()))?;
            results.rows.push((Row::Bundle, Ok(())));
        }
        Err(why) => results.rows.push((Row::Bundle, Err(why.clone()))),
    }
    match &fused {
        Ok(envoy) => {
            add(Row::Fused, envoy.url(), Some(envoy.pid()))?;
            results.rows.push((Row::Fused, Ok(())));
        }
        Err(why) => results.rows.push((Row::Fused, Err(why.clone()))),
    }
    match &litellm {
        Ok(proxy) => {
            add(Row::LiteLlm, proxy.url(), Some(proxy.pid()))?;
            results.rows.push((Row::LiteLlm, Ok(())));
        }
        Err(why) => results.rows.push((Row::LiteLlm, Err(why.clone()))),
    }

    // every row answers every workload as it should before any load (the stream: all its
    // events, so `x-mock-chunks` survived the proxy); a broken optional row is dropped
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut dropped = Vec::new();
    for t in &targets {
        for w in main.iter().filter_map(|&w| workloads.get(w)) {
            if let Err(e) = probe(&rt, t, w) {
                if matches!(t.row, Row::Mock | Row::Bare | Row::Chain) {
                    return Err(format!("row {}: {e}", t.row.letter()));
                }
                dropped.push((t.row, e));
                break;
            }
        }
    }
    for (row, why) in dropped {
        targets.retain(|t| t.row != row);
        for (r, status) in &mut results.rows {
            if *r == row {
                *status = Err(format!("its probe request failed: {why}"));
            }
        }
    }

    // warm-up: connections, V8 tiers, the tokenizers, caches
    for t in &targets {
        for script in main.iter().filter_map(|&w| t.scripts.get(w)) {
            wrk::run(&t.url, script, 1, 16)?;
            settle(t)?;
        }
    }
    // interleaved windows: a slow minute on this shared machine hits every row alike
    let mut windows: Vec<(Row, usize, u32, Vec<Window>)> = Vec::new();
    for round in 0..args.rounds {
        eprintln!(
            "round {}/{} ({:.0} s so far)",
            round + 1,
            args.rounds,
            started.elapsed().as_secs_f64()
        );
        for &w in &main {
            for &c in &args.connections {
                for t in &targets {
                    let secs = match window_for(t.row, w, c, args.window, &windows) {
                        Ok(secs) => secs,
                        Err(why) => {
                            if round == 0 {
                                results.skipped.push((t.row, w, c, why));
                            }
                            continue;
                        }
                    };
                    let window = measure(t, w, secs, c)?;
                    match windows
                        .iter_mut()
                        .find(|(r, ww, cc, _)| *r == t.row && *ww == w && *cc == c)
                    {
                        Some((_, _, _, list)) => list.push(window),
                        None => windows.push((t.row, w, c, vec![window])),
                    }
                }
            }
        }
    }
    results.cells = windows
        .iter()
        .map(|(row, w, c, list)| Cell::of(*row, *w, *c, list))
        .collect();

    // the translated workloads next to their untranslated counterparts, rows C, E, F at c=16
    results.translation = Some(if args.translation {
        let deployments = config::wasm_filters(&chain_config).and_then(|filters| {
            let router = filters
                .iter()
                .find(|f| f.root_id == "model-router" && !f.upstream)
                .ok_or("gateway.yaml has no model-router filter")?;
            translation::anthropic_deployments(&router.config, wrk::TRANSLATION_GROUP)
        });
        Ok(translation_run(
            &args,
            &rt,
            &targets,
            &workloads,
            &deployments,
            started,
        ))
    } else {
        Err("not run (`--quick` or `--no-translation`; `--translation` runs it)".into())
    });

    // where each Envoy row's CPU goes, under the first workload and the stream at 16 connections
    if args.perf {
        eprintln!("perf");
        let secs = args.window.max(5);
        results.profiles = Some(profiles(&targets, secs, 0, ""));
        if let Some(stream) = workloads.iter().position(|w| w.streams() && !w.translated) {
            results.stream_profiles = Some(profiles(&targets, secs, stream, "-stream"));
        }
    }

    // the ablation rows: C with one part taken away, B with one plugin, at c=16
    if args.ablation {
        results.ablation = Some(ablation_run(
            &args,
            &dir,
            &rt,
            &targets,
            &chain_config,
            &config::bare(mock.port)?,
            &workloads,
            started,
        ));
    }

    // leak check through the chain (and the bundle), bare Envoy as the control
    let every = (args.leak_requests / 10).max(1);
    for t in targets
        .iter()
        .filter(|t| matches!(t.row, Row::Bare | Row::Chain | Row::Bundle))
    {
        eprintln!("leak check, row {}", t.row.letter());
        results.leaks.push(leak_check(
            t,
            &main,
            &results.cells,
            args.leak_requests,
            every,
        )?);
    }
    results.header = header(&args, load_start);
    drop(targets);
    drop(litellm);
    drop(fused);
    drop(bundle);
    drop(compare);
    drop(chain);
    drop(bare);

    // per worker: fresh B and C at one and two workers after the same load
    if !args.quick {
        eprintln!("memory per worker");
        results.workers = Some(worker_memory(&dir, &mock, &chain_config, &workloads));
    }

    // the harness: the chain on the same workloads, then harness-cost's tables
    eprintln!("the chain in the wasmtime harness");
    let filters = config::wasm_filters(&chain_config)?;
    let runs = if args.quick { 2 } else { 20 };
    let chain_cost = cost::measure(&filters, &workloads, DEMO_KEY, &mock.url(), runs);
    let harness_text = if args.quick {
        None
    } else {
        eprintln!("harness-cost");
        Some(harness_cost(&exe.with_file_name("harness-cost")))
    };
    let vm_rows = harness_text
        .as_ref()
        .and_then(|r| r.as_ref().ok())
        .map(|(_, text)| report::parse_vm_tables(text))
        .unwrap_or_default();
    push_vms(&mut results, &filters, &chain_cost, &vm_rows);
    results.chain_cost = Some(chain_cost);
    results.fused_cost = fused_cost(&mock, &workloads, runs);
    results.harness_tables = harness_text.map(|r| r.map(|(path, _)| path));
    results.modules = modules()?;
    results.elapsed_s = started.elapsed().as_secs_f64();

    let text = results.render();
    println!("{text}");
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
    }
    std::fs::write(&args.out, &text).map_err(|e| e.to_string())?;
    println!("written to {}", args.out.display());
    Ok(())
}

/// `--harness`: the chain of row C in the wasmtime harness on the bench's workloads, and the
/// modules; nothing in Envoy.
fn harness_only(
    args: &Args,
    results: &mut Results,
    mock: &MockProcess,
    workloads: &[Workload],
    started: Instant,
) -> Result<(), String> {
    // scripts/profile-wasm asks for more runs, so perf samples the plugins' code, not the compile
    let runs = std::env::var("BENCH_HARNESS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let chain_config = config::chain(mock.port, Build::PerPlugin)?;
    let filters = config::wasm_filters(&chain_config)?;
    let chain_cost = cost::measure(&filters, workloads, DEMO_KEY, &mock.url(), runs);
    push_vms(results, &filters, &chain_cost, &[]);
    results.chain_cost = Some(chain_cost);
    results.fused_cost = fused_cost(mock, workloads, runs);
    results.modules = modules()?;
    results.elapsed_s = started.elapsed().as_secs_f64();
    let text = results.render_harness_only();
    println!("{text}");
    let out = args.out.with_file_name("report-harness.md");
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
    }
    std::fs::write(&out, &text).map_err(|e| e.to_string())?;
    println!("written to {}", out.display());
    Ok(())
}

/// Row F's filters (the fused filter, the router's upstream filter) in the harness on the
/// same workloads; `None` when the fused config does not ship.
fn fused_cost(
    mock: &MockProcess,
    workloads: &[Workload],
    runs: u64,
) -> Option<Result<cost::ChainCost, String>> {
    let config = match config::fused(mock.port) {
        Ok(Some(config)) => config,
        Ok(None) => return None,
        Err(why) => return Some(Err(why)),
    };
    eprintln!("the fused filter in the wasmtime harness");
    Some(
        config::wasm_filters(&config)
            .and_then(|filters| cost::measure(&filters, workloads, DEMO_KEY, &mock.url(), runs)),
    )
}

/// One VM row per filter of the chain: start and configure figures from `harness-cost`'s
/// tables (`vm_rows`, `(root_id, start, memory)`), memory after warm-up from the chain's run.
fn push_vms(
    results: &mut Results,
    filters: &[config::WasmFilter],
    chain_cost: &Result<cost::ChainCost, String>,
    vm_rows: &[(String, String, String)],
) {
    for f in filters {
        let (start, configured) = vm_rows
            .iter()
            .find(|(root, _, _)| *root == f.root_id)
            .map(|(_, s, m)| (Some(s.clone()), Some(m.clone())))
            .unwrap_or_default();
        let warm_bytes = chain_cost.as_ref().ok().and_then(|c| {
            c.memory
                .iter()
                .find(|(root, _)| *root == f.root_id)
                .map(|(_, b)| *b)
        });
        results.vms.push(Vm {
            root_id: f.root_id.clone(),
            module: f.file.clone(),
            start,
            configured,
            warm_bytes,
        });
    }
}

fn first_lines(text: &str, n: usize) -> String {
    text.lines().take(n).collect::<Vec<_>>().join(" / ")
}

/// Envoy with one worker from a derived config, pinned to the proxies' CPU.
fn start_envoy(
    dir: &TempDir,
    name: &str,
    config: &serde_json::Value,
    vars: &[(&str, String)],
) -> Result<Envoy, String> {
    start_envoy_with(dir, name, config, vars, 1)
}

/// Envoy with `workers` workers from a derived config, pinned to the proxies' CPU.
fn start_envoy_with(
    dir: &TempDir,
    name: &str,
    config: &serde_json::Value,
    vars: &[(&str, String)],
    workers: u32,
) -> Result<Envoy, String> {
    start_envoy_at(dir, name, config, vars, workers, "info")
}

/// [`start_envoy_with`] at Envoy log level `log_level`.
fn start_envoy_at(
    dir: &TempDir,
    name: &str,
    config: &serde_json::Value,
    vars: &[(&str, String)],
    workers: u32,
    log_level: &str,
) -> Result<Envoy, String> {
    let path = dir.path().join(name);
    let text = serde_json::to_string_pretty(config).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| e.to_string())?;
    let options = Options {
        concurrency: workers,
        trace_wasm: false,
        ..Options::default()
    };
    let template = path.to_str().ok_or("temp path is not UTF-8")?;
    let envoy = Envoy::start_with_log_level(template, vars, &options, log_level)?;
    if !procs::pin(envoy.pid(), procs::PROXY_CPU) {
        eprintln!("(taskset failed: Envoy {name} is not pinned)");
    }
    Ok(envoy)
}

/// RSS of fresh B and C at `--concurrency` 1 and 2, each after every workload for 2 s at 16
/// connections.
fn worker_memory(
    dir: &TempDir,
    mock: &MockProcess,
    chain_config: &serde_json::Value,
    workloads: &[Workload],
) -> Result<WorkerMemory, String> {
    let bare_config = config::bare(mock.port)?;
    let mut rss = Vec::new();
    for (name, config) in [("bare", &bare_config), ("chain", chain_config)] {
        for workers in [1, 2] {
            let file = format!("{name}-{workers}w.yaml");
            let envoy = start_envoy_with(dir, &file, config, &[], workers)?;
            for (i, w) in workloads.iter().enumerate().filter(|(_, w)| !w.translated) {
                let script = dir.path().join(format!("mem-{i}.lua"));
                std::fs::write(&script, w.lua("fast", DEMO_KEY, true))
                    .map_err(|e| e.to_string())?;
                wrk::run(&envoy.url(), &script, 2, 16)?;
            }
            rss.push(procs::rss_bytes(envoy.pid())?);
        }
    }
    match rss[..] {
        [bare_1, bare_2, chain_1, chain_2] => Ok(WorkerMemory {
            bare_1,
            bare_2,
            chain_1,
            chain_2,
        }),
        _ => Err("missing RSS samples".into()),
    }
}

/// The ablation rows (`--ablation`), at 16 connections on the first chat workload and the
/// stream: each row's Envoy started now (a row that does not start or answer is reported, not
/// fatal), then B, C (and E, F) and the rows in interleaved windows, `--rounds` of them.
#[allow(clippy::too_many_arguments)]
fn ablation_run(
    args: &Args,
    dir: &TempDir,
    rt: &tokio::runtime::Runtime,
    main: &[Target],
    chain_config: &serde_json::Value,
    bare_config: &serde_json::Value,
    workloads: &[Workload],
    started: Instant,
) -> AblationRun {
    const C: u32 = 16;
    let phase = Instant::now();
    let chat = workloads
        .iter()
        .position(|w| !w.streams() && !w.translated)
        .unwrap_or(0);
    let stream = workloads.iter().position(|w| w.streams() && !w.translated);
    let measured: Vec<usize> = std::iter::once(chat).chain(stream).collect();
    let mut run = AblationRun {
        connections: C,
        workloads: measured.clone(),
        ..AblationRun::default()
    };
    let mut envoys = Vec::new();
    let mut targets: Vec<Target> = Vec::new();
    for a in ablation::ABLATIONS {
        let row = Row::Ablation(a);
        eprintln!("ablation: starting {}", row.letter());
        let started_row = (|| -> Result<(Envoy, Target), String> {
            let config = a.config(chain_config, bare_config)?;
            let change = a.request(chain_config)?;
            let envoy = start_envoy_at(
                dir,
                &format!("ablation-{}.yaml", row.file_stem()),
                &config,
                &[],
                1,
                a.log_level(),
            )
            .map_err(|e| format!("did not start: {}", first_lines(&e, 6)))?;
            let target = Target::new(
                row,
                envoy.url(),
                Some(envoy.pid()),
                change,
                workloads,
                dir.path(),
            )?;
            for &w in &measured {
                if let Some(workload) = workloads.get(w) {
                    probe(rt, &target, workload)
                        .map_err(|e| format!("its probe request failed: {e}"))?;
                }
            }
            Ok((envoy, target))
        })();
        match started_row {
            Ok((envoy, target)) => {
                envoys.push(envoy);
                targets.push(target);
                run.rows.push((row, Ok(())));
            }
            Err(why) => {
                eprintln!("ablation: row {}: {why}", row.letter());
                run.rows.push((row, Err(why)));
            }
        }
    }
    let references: Vec<&Target> = main
        .iter()
        .filter(|t| matches!(t.row, Row::Bare | Row::Chain | Row::Bundle | Row::Fused))
        .collect();
    let all: Vec<&Target> = references.iter().copied().chain(targets.iter()).collect();
    for t in &targets {
        for &w in &measured {
            if let Some(script) = t.scripts.get(w) {
                if let Err(e) = wrk::run(&t.url, script, 1, C) {
                    eprintln!("ablation: warm-up of {}: {e}", t.row.letter());
                }
            }
        }
    }
    let mut windows: Vec<(Row, usize, Vec<Window>)> = Vec::new();
    for round in 0..args.rounds {
        eprintln!(
            "ablation round {}/{} ({:.0} s so far)",
            round + 1,
            args.rounds,
            started.elapsed().as_secs_f64()
        );
        for &w in &measured {
            for t in &all {
                match measure(t, w, args.window, C) {
                    Ok(window) => match windows
                        .iter_mut()
                        .find(|(r, ww, _)| *r == t.row && *ww == w)
                    {
                        Some((_, _, list)) => list.push(window),
                        None => windows.push((t.row, w, vec![window])),
                    },
                    Err(e) => eprintln!("ablation: {} on workload {w}: {e}", t.row.letter()),
                }
            }
        }
    }
    run.cells = windows
        .iter()
        .map(|(row, w, list)| Cell::of(*row, *w, C, list))
        .collect();
    drop(targets);
    drop(envoys);
    run.elapsed_s = phase.elapsed().as_secs_f64();
    run
}

/// One request of `w` through `t`: 200, and for a stream all its events; the answer.
fn probe(
    rt: &tokio::runtime::Runtime,
    t: &Target,
    w: &Workload,
) -> Result<llm_gateway_tests::http::Response, String> {
    let (key, knob, model) = t.request(w);
    let mut request = llm_gateway_tests::http::post(format!("{}/v1/chat/completions", t.url))
        .body(w.body_for(&model, t.change.include_usage));
    for (name, value) in w.headers(key, knob) {
        request = request.header(&name, &value);
    }
    let answer = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(60), request.send())
            .await
            .map_err(|_| "no answer within 60 s".to_string())?
    })?;
    let text = answer.text();
    if answer.status != 200 {
        return Err(format!(
            "{}: answered {}: {}",
            w.name,
            answer.status,
            first_lines(&text, 3)
        ));
    }
    if w.streams() {
        let events = llm_gateway_tests::http::sse_events(&text);
        let deltas: Vec<&str> = events
            .iter()
            .filter_map(|(_, v)| v["choices"][0]["delta"]["content"].as_str())
            .collect();
        if deltas.len() < w.events as usize {
            return Err(format!(
                "{}: {} content events, not {} (x-mock-chunks / x-mock-echo lost?)",
                w.name,
                deltas.len(),
                w.events
            ));
        }
        // the echoed prompt comes back as the client sent it: PII masked on the way in (where
        // pii-redaction runs) is restored in the stream
        if w.echo && knob && deltas.concat() != w.echo_message() {
            return Err(format!(
                "{}: the streamed text is not the prompt the client sent (PII not restored?)",
                w.name
            ));
        }
    }
    Ok(answer)
}

/// [`probe`] of a translated workload: also served by one of `deployments` (the translation
/// group's Anthropic ones) and answered in Chat's shape.
fn probe_translated(
    rt: &tokio::runtime::Runtime,
    t: &Target,
    w: &Workload,
    deployments: &[String],
) -> Result<(), String> {
    let answer = probe(rt, t, w)?;
    let deployment = answer.header("x-llm-deployment").unwrap_or_default();
    if !deployments.iter().any(|d| d == deployment) {
        return Err(format!(
            "{}: served by deployment {deployment:?}, not {} (not translated)",
            w.name,
            deployments.join(" or ")
        ));
    }
    if !w.streams() && !answer.json()?["choices"][0]["message"]["content"].is_string() {
        return Err(format!(
            "{}: not a Chat Completions answer: {}",
            w.name,
            first_lines(&answer.text(), 3)
        ));
    }
    Ok(())
}

/// The translation phase (issue 42): rows C, E and F on each (untranslated, translated)
/// workload pair at 16 connections, each row's translated window right next to its
/// untranslated one (the order swapped every other round), at least
/// [`translation::MIN_ROUNDS`] rounds. A row whose translated requests fail their probe is
/// reported, not measured.
fn translation_run(
    args: &Args,
    rt: &tokio::runtime::Runtime,
    targets: &[Target],
    workloads: &[Workload],
    deployments: &Result<Vec<String>, String>,
    started: Instant,
) -> TranslationRun {
    const C: u32 = 16;
    let phase = Instant::now();
    let rounds = if args.quick {
        args.rounds
    } else {
        args.rounds.max(translation::MIN_ROUNDS)
    };
    let mut run = TranslationRun {
        pairs: translation::pairs(workloads),
        connections: C,
        rounds,
        window: args.window,
        ..TranslationRun::default()
    };
    let mut measured: Vec<&Target> = Vec::new();
    for t in targets
        .iter()
        .filter(|t| translation::ROWS.contains(&t.row))
    {
        let checked = deployments.as_ref().map_err(Clone::clone).and_then(|d| {
            run.pairs
                .iter()
                .try_for_each(|&(_, tw)| match workloads.get(tw) {
                    Some(w) => probe_translated(rt, t, w, d),
                    None => Err("no such workload".into()),
                })
        });
        match checked {
            Ok(()) => {
                measured.push(t);
                run.rows.push((t.row, Ok(())));
            }
            Err(why) => {
                eprintln!("translation: row {}: {why}", t.row.letter());
                run.rows
                    .push((t.row, Err(format!("its probe request failed: {why}"))));
            }
        }
    }
    for t in &measured {
        for &(_, tw) in &run.pairs {
            if let Some(script) = t.scripts.get(tw) {
                if let Err(e) = wrk::run(&t.url, script, 1, C) {
                    eprintln!("translation: warm-up of {}: {e}", t.row.letter());
                }
            }
        }
    }
    let pairs = run.pairs.clone();
    let mut windows: Vec<(Row, usize, Vec<Window>)> = Vec::new();
    for round in 0..rounds {
        eprintln!(
            "translation round {}/{rounds} ({:.0} s so far)",
            round + 1,
            started.elapsed().as_secs_f64()
        );
        for &(u, tw) in &pairs {
            for t in &measured {
                let order = if round % 2 == 0 { [u, tw] } else { [tw, u] };
                let mut cpu = [None, None];
                for w in order {
                    match measure(t, w, args.window, C) {
                        Ok(window) => {
                            cpu[usize::from(w == tw)] = window.cpu_us;
                            match windows
                                .iter_mut()
                                .find(|(r, ww, _)| *r == t.row && *ww == w)
                            {
                                Some((_, _, list)) => list.push(window),
                                None => windows.push((t.row, w, vec![window])),
                            }
                        }
                        Err(e) => eprintln!("translation: {} on workload {w}: {e}", t.row.letter()),
                    }
                }
                let [Some(untranslated), Some(translated)] = cpu else {
                    continue;
                };
                match run
                    .paired
                    .iter_mut()
                    .find(|p| p.row == t.row && p.pair == (u, tw))
                {
                    Some(p) => p.added_us.push(translated - untranslated),
                    None => run.paired.push(Paired {
                        row: t.row,
                        pair: (u, tw),
                        added_us: vec![translated - untranslated],
                    }),
                }
            }
        }
    }
    run.cells = windows
        .iter()
        .map(|(row, w, list)| Cell::of(*row, *w, C, list))
        .collect();
    run.elapsed_s = phase.elapsed().as_secs_f64();
    run
}

/// The window length for a cell: `window`, except for LiteLLM under concurrency, whose
/// requests can take longer than a window (it runs them one CPU-bound step at a time): from its
/// c=1 p50 on the workload (measured earlier in the same round), a request at `c` takes about
/// `c` times that; the window stretches to twice that up to 20 s, beyond which the cell is not
/// run (and says why).
fn window_for(
    row: Row,
    w: usize,
    c: u32,
    window: u32,
    windows: &[(Row, usize, u32, Vec<Window>)],
) -> Result<u32, String> {
    if row != Row::LiteLlm || c <= 1 {
        return Ok(window);
    }
    let Some(p50_us) = windows
        .iter()
        .find(|(r, ww, cc, _)| *r == row && *ww == w && *cc == 1)
        .map(|(_, _, _, list)| Cell::of(row, w, 1, list))
        .filter(|cell| cell.requests > 0.0)
        .map(|cell| cell.p50_us)
    else {
        return Ok(window);
    };
    let estimate = f64::from(c) * p50_us / 1e6;
    if 2.0 * estimate <= f64::from(window) {
        Ok(window)
    } else if 2.0 * estimate <= 20.0 {
        Ok((2.0 * estimate).ceil() as u32)
    } else {
        Err(format!(
            "not run: a request would take ≈ {estimate:.0} s (LiteLLM's c=1 p50 × {c})"
        ))
    }
}

/// One window of `t` on workload `w` with `c` connections.
fn measure(t: &Target, w: usize, secs: u32, c: u32) -> Result<Window, String> {
    let script = t.scripts.get(w).ok_or("no script")?;
    let cpu_before = t.pid.map(procs::cpu_us).transpose()?;
    let sample = wrk::run(&t.url, script, secs, c)?;
    let cpu_after = t.pid.map(procs::cpu_us).transpose()?;
    settle(t)?;
    Ok(Window {
        sample,
        cpu_us: cpu_before
            .zip(cpu_after)
            .map(|(b, a)| (a - b) / sample.requests.max(1.0)),
        rss: t.pid.map(procs::rss_bytes).transpose()?,
    })
}

/// Waits (up to 20 s) until a LiteLLM row is idle again: requests wrk gave up on at the end
/// of a window may still be running, and would take CPU from the next row's window.
fn settle(t: &Target) -> Result<(), String> {
    let (Row::LiteLlm, Some(pid)) = (t.row, t.pid) else {
        return Ok(());
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = procs::cpu_us(pid)?;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        let now = procs::cpu_us(pid)?;
        if now - last < 25_000.0 {
            break; // < 10 % of a CPU
        }
        last = now;
    }
    Ok(())
}

/// `requests` through `t` at 16 connections in batches of about `every` (the workloads of
/// indexes `workloads` in turn; wrk cannot stop at a count, so a batch is a window as long as
/// the workload's rate needs: the row's c=16 cell first, then the rate its last batch ran at),
/// RSS before and after each batch.
fn leak_check(
    t: &Target,
    workloads: &[usize],
    cells: &[Cell],
    requests: u64,
    every: u64,
) -> Result<LeakCheck, String> {
    let pid = t.pid.ok_or("the leak check needs a process")?;
    let mut rates: Vec<f64> = workloads
        .iter()
        .map(|&w| {
            cells
                .iter()
                .find(|c| c.row == t.row && c.workload == w && c.connections == 16)
                .map_or(0.0, |c| c.rps)
        })
        .collect();
    let mut check = LeakCheck {
        row: t.row,
        every,
        rss: vec![procs::rss_bytes(pid)?],
        at: vec![0.0],
        errors: 0,
        requests: 0.0,
    };
    let mut batch = 0;
    while check.requests < requests as f64 {
        let i = batch % workloads.len().max(1);
        let script = workloads
            .get(i)
            .and_then(|&w| t.scripts.get(w))
            .ok_or("no script")?;
        let rate = rates.get(i).copied().unwrap_or(0.0);
        let left = (requests as f64 - check.requests).min(every as f64);
        let secs = if rate > 0.0 {
            (left / rate).round().clamp(1.0, 120.0) as u32
        } else {
            2
        };
        let sample = wrk::run(&t.url, script, secs, 16)?;
        if sample.requests == 0.0 {
            return Err(format!(
                "leak check, row {}: no request completed",
                t.row.letter()
            ));
        }
        if let Some(r) = rates.get_mut(i) {
            *r = sample.rps;
        }
        check.requests += sample.requests;
        check.errors += sample.errors;
        check.rss.push(procs::rss_bytes(pid)?);
        check.at.push(check.requests);
        batch += 1;
    }
    Ok(check)
}

/// perf's split of each Envoy row's CPU while wrk drives workload `w` at 16 connections for
/// `secs` seconds (data kept in `target/bench/perf-<row><suffix>.data`).
fn profiles(
    targets: &[Target],
    secs: u32,
    w: usize,
    suffix: &str,
) -> Result<perf::RowProfiles, String> {
    perf::available()?;
    let dir = workspace::root().join("target/bench");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(targets
        .iter()
        .filter(|t| t.row.is_envoy())
        .filter_map(|t| Some((t, t.pid?, t.scripts.get(w)?)))
        .map(|(t, pid, script)| {
            let data = dir.join(format!("perf-{}{suffix}.data", t.row.file_stem()));
            let profile = perf::record(pid, secs, &data, || wrk::run(&t.url, script, secs, 16))
                .map(|(profile, sample)| perf::Profile {
                    requests: sample.requests,
                    ..profile
                });
            (t.row, profile)
        })
        .collect())
}

/// Runs `harness-cost` (all plugins, 3 runs per figure); its output goes to
/// `target/bench/harness-cost.md`. The path and the text.
fn harness_cost(bin: &Path) -> Result<(String, String), String> {
    let out = Command::new(bin)
        .args(["--runs", "3", "--requests", "50"])
        .output()
        .map_err(|e| format!("{}: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "harness-cost failed: {}",
            first_lines(&String::from_utf8_lossy(&out.stderr), 5)
        ));
    }
    let path = workspace::root().join("target/bench/harness-cost.md");
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
    }
    std::fs::write(&path, &text).map_err(|e| e.to_string())?;
    let shown = path
        .strip_prefix(workspace::root())
        .unwrap_or(&path)
        .display()
        .to_string();
    Ok((shown, text))
}

/// The plugin modules of `dist/` (fixtures left out) and whether each holds the tokenizer
/// (its crate's default features enable `tokenizer`; the bundle holds the plugins that do).
fn modules() -> Result<Vec<Module>, String> {
    let root = workspace::root();
    let mut out = Vec::new();
    let dir = workspace::wasm_dir();
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let (Some(stem), Some("wasm")) = (
            path.file_stem().and_then(|s| s.to_str()),
            path.extension().and_then(|s| s.to_str()),
        ) else {
            continue;
        };
        if root.join("tests/fixture-plugins").join(stem).is_dir() {
            continue;
        }
        let tokenizer = stem == config::BUNDLE_FILE.trim_end_matches(".wasm") || {
            std::fs::read_to_string(root.join("plugins").join(stem).join("Cargo.toml")).is_ok_and(
                |toml| {
                    toml.lines()
                        .any(|l| l.starts_with("default") && l.contains("\"tokenizer\""))
                },
            )
        };
        let bytes = entry.metadata().map_err(|e| e.to_string())?.len();
        out.push(Module {
            file: format!("{stem}.wasm"),
            bytes,
            tokenizer,
        });
    }
    out.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(out)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn header(args: &Args, load_start: String) -> Vec<String> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let envoy = workspace::envoy_bin(EnvoyVersion::from_env())
        .ok()
        .and_then(|bin| Command::new(bin).arg("--version").output().ok())
        .map(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.split_whitespace()
                .find(|w| {
                    w.contains('/') && w.chars().next().is_some_and(|c| c.is_ascii_hexdigit())
                })
                .map(str::to_string)
                .unwrap_or_else(|| text.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let connections: Vec<String> = args.connections.iter().map(u32::to_string).collect();
    vec![
        format!("machine: {cpu}, {cores} cores; load average (1/5/15 min) {load_start} at the start, {} at the end of the load (other work on the machine skews the figures; the windows are interleaved so it skews every row alike)", load_average()),
        format!("Envoy {envoy}, `--concurrency 1`, pinned to CPU {}; LiteLLM pinned to the same CPU (the proxy's CPU); wrk (one thread) and the mock upstream (one thread) on CPU {}", procs::PROXY_CPU, procs::LOAD_CPU),
        format!("load: wrk -t1 --latency at {} connections; {} round(s) of one {}-second window per row, workload and connection count, interleaved (round → workload → connections → row); figures are medians over the rounds; 1 s of warm-up per row and workload first", connections.join(", "), args.rounds, args.window),
        "C: `envoy-config/gateway.yaml` as shipped (key-auth → model-router → pii-redaction → usage-accounting → token-ratelimit, model-router-upstream on every provider cluster, its routes, retries and local replies), every provider cluster pointed at the one mock, and only token-ratelimit's amounts raised (limits' requests/tokens, budgets' tokens/money) so no request is refused; they are still evaluated on every request. Derived at run time (tests/src/bench/config.rs); E is the same with every filter in one `llm-gateway` VM of `dist/llm-gateway.wasm`".into(),
        "B: `envoy-config/bench-bare.yaml` (router only). Access log: B and C (and E) write the same line per request, gateway.yaml's JSON file access log, flushed every 100 ms".into(),
        format!("requests: the demo key (consumer demo, group `fast` → the mock's `/v1/chat/completions`), chat 2 KB: one user message, an e-mail address and a phone number (which pii-redaction masks) in front of prose; chat 32 KB: prose without personal data; the stream: prose in a system message and a 600-character user message with an e-mail address and a phone number (as long as their placeholders) that the mock echoes back 3 characters per event (`x-mock-echo`: 200 events through every row, checked before the load, with the client's text restored where pii-redaction masked it); D: LiteLLM {} (PyPI `litellm[proxy]`, `.venv-litellm`), one worker, no database, a master key, `tests/bench/litellm.yaml` (model group `fast` → openai/gpt-4o-mini at the mock's `/v1`; its stream group sets `x-mock-chunks` itself, LiteLLM does not forward client headers)", litellm::VERSION),
        format!("LiteLLM under concurrency: a request takes about c × its c=1 latency, longer than a {}-second window for the stream; its windows stretch to twice that (up to 20 s), and a cell that would need more is not run (the table says so)", args.window),
        "per event: the stream's whole-request proxy CPU over B's, divided by its 200 events (the issue-19 figure); `(row−B) p50 / event` is latency, for comparison with issue 9's".into(),
        if args.translation {
            "translated workloads (issue 42): the 2 KB chat and the stream naming group `claude` (the Anthropic deployment: model-router translates Chat ⇄ Messages), in the translation phase only: rows C, E, F at c=16 next to the untranslated ones (its section); not in the per-workload tables, the perf split, the ablation or the leak check".to_string()
        } else {
            "translated workloads (issue 42): not run (`--quick` or `--no-translation`)".to_string()
        },
        format!("leak check: {} requests through C (and E) at 16 connections, RSS sampled every {}; B gets the same as the control", args.leak_requests, (args.leak_requests / 10).max(1)),
    ]
}
