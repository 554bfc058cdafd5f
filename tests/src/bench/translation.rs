//! The translation phase of `scripts/bench` (issue 42): what model-router's translation
//! between OpenAI Chat Completions and Anthropic Messages costs. Each translated workload
//! ([`Workload::translated`]) sends its untranslated counterpart's request naming group
//! `claude` (gateway.yaml's Anthropic deployment), so the router translates the request into
//! Messages (`/v1/messages`) and the mock's Anthropic answer, JSON or SSE, back into Chat.
//! Rows C, E and F run each pair at one connection count, the translated window right next to
//! its untranslated one in every round; the figure is the median over the rounds of the
//! paired differences of Envoy CPU per request (per streamed event: divided by the stream's
//! events), set against the targets. Row B has no router: it would send the chat as
//! it is, so it has nothing to translate. The harness part sets the chain's fuel and host
//! calls per request of each translated workload against its counterpart's.
//!
//! What it does not do: measure anything itself (`bench.rs` runs the windows) or compare
//! untranslated requests with an earlier build (that is `--compare DIR`).

use super::cost::ChainCost;
use super::wrk::Workload;
use super::{Cell, Row};
use serde_json::Value;
use std::fmt::Write;

/// Issue 42: translation adds at most this much Envoy CPU per 2 KB chat request (µs).
pub const CHAT_TARGET_US: f64 = 25.0;
/// Issue 42: translation adds at most this much Envoy CPU per streamed event (µs).
pub const EVENT_TARGET_US: f64 = 1.0;
/// The rows that translate (the ones with the router).
pub const ROWS: [Row; 3] = [Row::Chain, Row::Bundle, Row::Fused];
/// The fewest rounds of the phase: a difference of a few per cent of a request's CPU needs
/// more windows than the main tables' three.
pub const MIN_ROUNDS: u32 = 5;

/// `(untranslated, translated)` index pairs of `workloads`, in the translated ones' order.
pub fn pairs(workloads: &[Workload]) -> Vec<(usize, usize)> {
    workloads
        .iter()
        .enumerate()
        .filter_map(|(t, w)| Some((w.counterpart(workloads)?, t)))
        .collect()
}

/// The deployments of model group `group` in a model-router configuration (its `groups` and
/// `deployments`), all of provider `anthropic`: the ones that may serve a translated request
/// (its `x-llm-deployment`). An error when the group is missing, has none, or names another
/// provider's deployment: the translated workloads would not all be translated.
pub fn anthropic_deployments(router: &Value, group: &str) -> crate::Result<Vec<String>> {
    let names: Vec<String> = router["groups"]
        .as_array()
        .and_then(|groups| groups.iter().find(|g| g["name"] == group))
        .and_then(|g| g["deployments"].as_array())
        .map(|list| {
            list.iter()
                .filter_map(|d| d["deployment"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        return Err(format!("model-router has no deployment in group `{group}`"));
    }
    for name in &names {
        let provider = router["deployments"]
            .as_array()
            .and_then(|all| all.iter().find(|d| d["name"] == name.as_str()))
            .and_then(|d| d["provider"].as_str())
            .unwrap_or_default();
        if provider != "anthropic" {
            return Err(format!(
                "group `{group}`'s deployment `{name}` is of provider {provider:?}, not anthropic"
            ));
        }
    }
    Ok(names)
}

/// The median of `values` (the upper one of an even count, as [`Cell::of`] takes it).
fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// One row's rounds on one pair: translated minus untranslated Envoy CPU per request, each
/// from the two windows of one round.
#[derive(Debug, Clone, PartialEq)]
pub struct Paired {
    /// Row.
    pub row: Row,
    /// `(untranslated, translated)` workload indexes.
    pub pair: (usize, usize),
    /// Per round with both windows measured, µs.
    pub added_us: Vec<f64>,
}

/// The translation phase: rows C, E, F on every pair.
#[derive(Debug, Clone, Default)]
pub struct TranslationRun {
    /// Each row: measured, or why not (a failed probe of a translated request).
    pub rows: Vec<(Row, Result<(), String>)>,
    /// `(untranslated, translated)` workload indexes.
    pub pairs: Vec<(usize, usize)>,
    /// Medians of each row × workload's windows (at [`TranslationRun::connections`]).
    pub cells: Vec<Cell>,
    /// The paired differences.
    pub paired: Vec<Paired>,
    /// wrk connections.
    pub connections: u32,
    /// Rounds run.
    pub rounds: u32,
    /// Window length, seconds.
    pub window: u32,
    /// Wall-clock time of the phase, seconds.
    pub elapsed_s: f64,
}

/// A row's translation figure on one pair, against its target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figure {
    /// Added Envoy CPU per request (median of the paired rounds), µs.
    pub per_request: f64,
    /// Smallest and largest of the rounds' differences, µs per request.
    pub range: (f64, f64),
    /// A stream's events (0: a chat).
    pub events: u32,
    /// What the target is measured in: per request for a chat, per event for a stream, µs.
    pub measured: f64,
    /// The target, in the same unit.
    pub target: f64,
}

impl Figure {
    /// Within the target.
    pub fn met(&self) -> bool {
        self.measured <= self.target
    }
}

impl TranslationRun {
    /// The cell of `row` on workload `w`, if some request completed in it.
    pub fn cell(&self, row: Row, w: usize) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.row == row && c.workload == w && c.requests > 0.0)
    }

    /// `row`'s figure on `pair` (`events`: the translated workload's), if a round measured
    /// both windows.
    pub fn figure(&self, row: Row, pair: (usize, usize), events: u32) -> Option<Figure> {
        let paired = self
            .paired
            .iter()
            .find(|p| p.row == row && p.pair == pair)?;
        let per_request = median(&paired.added_us)?;
        let lo = paired
            .added_us
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min);
        let hi = paired
            .added_us
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let (measured, target) = if events > 0 {
            (per_request / f64::from(events), EVENT_TARGET_US)
        } else {
            (per_request, CHAT_TARGET_US)
        };
        Some(Figure {
            per_request,
            range: (lo, hi),
            events,
            measured,
            target,
        })
    }
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "**not met**"
    }
}

/// The report's "Translation" section: the Envoy table of `run` (or why there is none) and
/// the harness's fuel and host calls of `chain` and `fused` on the pairs.
pub fn render(
    o: &mut String,
    run: Result<&TranslationRun, &str>,
    workloads: &[Workload],
    chain: &Option<Result<ChainCost, String>>,
    fused: &Option<Result<ChainCost, String>>,
) {
    let _ = writeln!(
        o,
        "## Translation (issue 42): an OpenAI client served by the Anthropic deployment\n"
    );
    match run {
        Ok(run) => render_envoy(o, run, workloads),
        Err(why) => {
            let _ = writeln!(o, "In Envoy: not measured: {why}.\n");
        }
    }
    render_harness(o, chain, fused);
}

fn render_envoy(o: &mut String, run: &TranslationRun, workloads: &[Workload]) {
    let name = |w: usize| workloads.get(w).map_or("-", |x| x.name);
    let _ = writeln!(
        o,
        "Each translated workload is its untranslated counterpart's request naming group `claude` (gateway.yaml: one deployment, provider `anthropic`): model-router translates the Chat Completions request into Anthropic Messages (`/v1/messages`; the mock answers it in Anthropic's shape, JSON or SSE) and the answer back into Chat, checked before the load (status 200, `x-llm-deployment: claude`, a Chat answer; the stream's 200 content events with the client's text restored). Rows C, E and F only: row B has no router and would send the chat as it is, to the mock's `/v1/chat/completions` (its figures are the untranslated ones'); A and D likewise. c={}, {} round(s) of one {}-second window per row and workload, each translated window right next to its untranslated one (the order swapped every other round); *added* is the median over the rounds of (translated − untranslated) Envoy CPU per request of the same round, the range the rounds' smallest and largest; per event: a stream's added CPU over its events (request translation included). Targets: ≤ {CHAT_TARGET_US} µs per 2 KB chat, ≤ {EVENT_TARGET_US} µs per streamed event. {:.0} s.\n",
        run.connections, run.rounds, run.window, run.elapsed_s
    );
    for (row, status) in &run.rows {
        if let Err(why) = status {
            let _ = writeln!(o, "- **{}**: **not measured**: {why}", row.letter());
        }
    }
    if run.rows.iter().any(|(_, s)| s.is_err()) {
        o.push('\n');
    }
    let _ = writeln!(
        o,
        "| row | workload | CPU/request untranslated | translated | added per request (range) | added per event | target | | req/s untranslated → translated | errors |\n|---|---|---:|---:|---:|---:|---|---|---:|---:|"
    );
    for &(row, _) in run.rows.iter().filter(|(_, s)| s.is_ok()) {
        for &(u, t) in &run.pairs {
            let events = workloads.get(t).map_or(0, |w| w.events);
            let (cu, ct) = (run.cell(row, u), run.cell(row, t));
            let cpu = |c: Option<&Cell>| {
                c.and_then(|c| c.cpu_us)
                    .map_or("-".into(), |v| format!("{v:.1} µs"))
            };
            let figure = run.figure(row, (u, t), events);
            let errors: u64 = run
                .cells
                .iter()
                .filter(|c| c.row == row && (c.workload == u || c.workload == t))
                .map(|c| c.errors)
                .sum();
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                row.letter(),
                name(t),
                cpu(cu),
                cpu(ct),
                figure.map_or("-".into(), |f| format!(
                    "{:+.1} µs ({:+.0} … {:+.0})",
                    f.per_request, f.range.0, f.range.1
                )),
                match figure {
                    Some(f) if events > 0 => format!("{:+.2} µs", f.measured),
                    _ => "-".into(),
                },
                if events > 0 {
                    format!("≤ {EVENT_TARGET_US} µs per event")
                } else {
                    format!("≤ {CHAT_TARGET_US} µs per request")
                },
                figure.map_or("not measured", |f| verdict(f.met())),
                match (cu, ct) {
                    (Some(a), Some(b)) => format!("{:.0} → {:.0}", a.rps, b.rps),
                    _ => "-".into(),
                },
                if errors == 0 {
                    "0".into()
                } else {
                    format!("**{errors}**")
                },
            );
        }
    }
    o.push('\n');
    // the stream's added CPU net of its request side (the chat pair of the same prompt size)
    let mut net = Vec::new();
    for &(row, _) in run.rows.iter().filter(|(_, s)| s.is_ok()) {
        for &(su, st) in &run.pairs {
            let Some(stream) = workloads.get(st).filter(|w| w.streams()) else {
                continue;
            };
            let chat_pair = run.pairs.iter().copied().find(|&(_, ct)| {
                workloads
                    .get(ct)
                    .is_some_and(|w| !w.streams() && w.prompt_bytes == stream.prompt_bytes)
            });
            let (Some(s), Some(c)) = (
                run.figure(row, (su, st), stream.events),
                chat_pair.and_then(|p| run.figure(row, p, 0)),
            ) else {
                continue;
            };
            net.push(format!(
                "{} {:+.2} µs",
                row.letter(),
                (s.per_request - c.per_request) / f64::from(stream.events.max(1))
            ));
        }
    }
    if !net.is_empty() {
        let _ = writeln!(
            o,
            "Per streamed event net of the request's translation ((added per stream − added per chat) / events): {}.\n",
            net.join(", ")
        );
    }
}

/// Fuel, host calls and callbacks per request of every filter of `cost` on `w`.
fn totals(cost: &ChainCost, w: &Workload) -> Option<(u64, f64, f64)> {
    let found = cost.workloads.iter().find(|x| x.workload == *w)?;
    Some(found.plugins.iter().fold((0, 0.0, 0.0), |acc, p| {
        (
            acc.0 + p.fuel(),
            acc.1 + p.host_calls(),
            acc.2 + p.callbacks(),
        )
    }))
}

fn render_harness(
    o: &mut String,
    chain: &Option<Result<ChainCost, String>>,
    fused: &Option<Result<ChainCost, String>>,
) {
    let mut lines = Vec::new();
    for (what, cost) in [
        ("C (row C's chain; E runs the same code)", chain),
        ("F (the fused filter)", fused),
    ] {
        let cost = match cost {
            Some(Ok(cost)) => cost,
            Some(Err(why)) => {
                lines.push(format!("| {what} | not measured: {why} | | | | | | |"));
                continue;
            }
            None => continue,
        };
        let workloads: Vec<Workload> = cost.workloads.iter().map(|w| w.workload).collect();
        for (u, t) in pairs(&workloads) {
            let (Some(wu), Some(wt)) = (workloads.get(u), workloads.get(t)) else {
                continue;
            };
            let (Some(a), Some(b)) = (totals(cost, wu), totals(cost, wt)) else {
                continue;
            };
            let added = b.0 as f64 - a.0 as f64;
            lines.push(format!(
                "| {what} | {} | {} | {} | {:+.0} | {} | {:+.1} | {:+.1} |",
                wt.name,
                a.0,
                b.0,
                added,
                if wt.events > 0 {
                    format!("{:+.0}", added / f64::from(wt.events))
                } else {
                    "-".into()
                },
                b.1 - a.1,
                b.2 - a.2,
            ));
        }
    }
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "In the wasmtime harness (deterministic; every filter of the row, the router's upstream filter included; the per-plugin figures are in the harness tables below), per request:\n\n| filters | workload | fuel untranslated | fuel translated | fuel added | fuel added per event | host calls added | callbacks added |\n|---|---|---:|---:|---:|---:|---:|---:|\n{}\n",
        lines.join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::super::cost::{PluginCost, WorkloadCost};
    use super::super::wrk::WORKLOADS;
    use super::*;
    use crate::harness::Totals;

    fn cell(row: Row, workload: usize, cpu: f64) -> Cell {
        Cell {
            row,
            workload,
            connections: 16,
            rps: 1_000_000.0 / cpu,
            p50_us: 1000.0,
            p99_us: 2000.0,
            cpu_us: Some(cpu),
            rss: None,
            errors: 0,
            requests: 1000.0,
        }
    }

    /// C adds `chat` µs per chat and `stream` µs per stream request (rounds around it), E
    /// failed its probe, F adds 30 and 150.
    fn run(chat: f64, stream: f64) -> TranslationRun {
        let pairs = pairs(&WORKLOADS);
        let (chat_pair, stream_pair) = (pairs[0], pairs[1]);
        let mut r = TranslationRun {
            rows: vec![
                (Row::Chain, Ok(())),
                (Row::Bundle, Err("its probe request failed: 502".into())),
                (Row::Fused, Ok(())),
            ],
            pairs: pairs.clone(),
            connections: 16,
            rounds: 5,
            window: 2,
            elapsed_s: 60.0,
            ..TranslationRun::default()
        };
        for (row, c, s) in [(Row::Chain, chat, stream), (Row::Fused, 30.0, 150.0)] {
            r.cells.extend([
                cell(row, chat_pair.0, 300.0),
                cell(row, chat_pair.1, 300.0 + c),
                cell(row, stream_pair.0, 450.0),
                cell(row, stream_pair.1, 450.0 + s),
            ]);
            r.paired.push(Paired {
                row,
                pair: chat_pair,
                added_us: vec![c + 9.0, c - 3.0, c, c + 1.0, c - 20.0],
            });
            r.paired.push(Paired {
                row,
                pair: stream_pair,
                added_us: vec![s, s + 50.0, s - 40.0],
            });
        }
        r
    }

    #[test]
    fn the_translation_group_is_served_by_gateway_yamls_anthropic_deployment_alone() {
        use crate::bench::config::{self, Build};
        let chain = config::chain(45678, Build::PerPlugin).unwrap();
        let filters = config::wasm_filters(&chain).unwrap();
        let router = filters
            .iter()
            .find(|f| f.root_id == "model-router" && !f.upstream)
            .unwrap();
        let group = crate::bench::wrk::TRANSLATION_GROUP;
        assert_eq!(
            anthropic_deployments(&router.config, group).unwrap(),
            ["claude"]
        );
        // `fast`, the untranslated workloads' group, is OpenAI's: no translation there
        let fast = anthropic_deployments(&router.config, "fast").unwrap_err();
        assert!(fast.contains("not anthropic"), "{fast}");
        assert!(anthropic_deployments(&router.config, "nope").is_err());
    }

    #[test]
    fn pairs_the_translated_workloads_with_their_counterparts() {
        let pairs = pairs(&WORKLOADS);
        assert_eq!(pairs, [(0, 3), (2, 4)]);
        for (u, t) in pairs {
            assert!(!WORKLOADS[u].translated && WORKLOADS[t].translated);
        }
    }

    #[test]
    fn figures_are_the_median_of_the_paired_rounds_against_the_targets() {
        let r = run(20.0, 180.0);
        let (chat, stream) = (r.pairs[0], r.pairs[1]);
        let f = r.figure(Row::Chain, chat, 0).unwrap();
        assert_eq!(f.per_request, 20.0);
        assert_eq!(f.range, (0.0, 29.0));
        assert!(f.met());
        let s = r.figure(Row::Chain, stream, 200).unwrap();
        assert_eq!(s.per_request, 180.0);
        assert_eq!(s.measured, 0.9);
        assert!(s.met());
        assert!(!r.figure(Row::Fused, chat, 0).unwrap().met(), "30 > 25 µs");
        assert!(r.figure(Row::Fused, stream, 200).unwrap().met());
        assert!(r.figure(Row::Bundle, chat, 0).is_none());

        let r = run(26.0, 201.0);
        assert!(!r.figure(Row::Chain, r.pairs[0], 0).unwrap().met());
        assert!(!r.figure(Row::Chain, r.pairs[1], 200).unwrap().met());
    }

    #[test]
    fn the_section_states_each_row_against_the_targets() {
        let mut o = String::new();
        render(&mut o, Ok(&run(20.0, 180.0)), &WORKLOADS, &None, &None);
        assert!(o.contains("## Translation (issue 42)"), "{o}");
        assert!(
            o.contains("| C | chat 2 KB translated | 300.0 µs | 320.0 µs | +20.0 µs (+0 … +29) | - | ≤ 25 µs per request | met |"),
            "{o}"
        );
        assert!(
            o.contains("| C | stream 200 events translated | 450.0 µs | 630.0 µs | +180.0 µs (+140 … +230) | +0.90 µs | ≤ 1 µs per event | met |"),
            "{o}"
        );
        assert!(
            o.contains("| F | chat 2 KB translated | 300.0 µs | 330.0 µs | +30.0 µs (+10 … +39) | - | ≤ 25 µs per request | **not met** |"),
            "{o}"
        );
        assert!(
            o.contains("- **E**: **not measured**: its probe request failed: 502"),
            "{o}"
        );
        assert!(!o.contains("| E |"), "{o}");
        assert!(o.contains("row B has no router"), "{o}");
        // (180 − 20) / 200, (150 − 30) / 200
        assert!(o.contains("C +0.80 µs, F +0.60 µs"), "{o}");

        let mut o = String::new();
        render(&mut o, Err("--no-translation"), &WORKLOADS, &None, &None);
        assert!(o.contains("not measured: --no-translation"), "{o}");
    }

    #[test]
    fn the_harness_part_sets_fuel_and_host_calls_against_the_counterpart() {
        let plugin = |root: &str, fuel: u64, host_calls: u64| PluginCost {
            root_id: root.into(),
            totals: Totals {
                fuel: fuel * 10,
                host_calls: host_calls * 10,
                callbacks: 30,
                ..Totals::default()
            },
            requests: 10,
        };
        let workload = |w: usize, router: u64, calls: u64| WorkloadCost {
            workload: WORKLOADS[w],
            plugins: vec![
                plugin("key-auth", 1_000, 5),
                plugin("model-router", router, calls),
            ],
        };
        let cost = ChainCost {
            workloads: vec![
                workload(0, 50_000, 20),
                workload(2, 400_000, 30),
                workload(3, 90_000, 21),
                workload(4, 800_000, 30),
            ],
            memory: Vec::new(),
        };
        let mut o = String::new();
        render(
            &mut o,
            Err("--no-translation"),
            &WORKLOADS,
            &Some(Ok(cost)),
            &Some(Err("its config: missing".into())),
        );
        assert!(
            o.contains("| C (row C's chain; E runs the same code) | chat 2 KB translated | 51000 | 91000 | +40000 | - | +1.0 | +0.0 |"),
            "{o}"
        );
        assert!(
            o.contains("| stream 200 events translated | 401000 | 801000 | +400000 | +2000 | +0.0 | +0.0 |"),
            "{o}"
        );
        assert!(
            o.contains("| F (the fused filter) | not measured: its config: missing |"),
            "{o}"
        );
    }
}
