//! `scripts/bench` (the `bench` binary): the gateway's cost on the request path, measured side
//! by side in one run. [`config`] derives the Envoy configs from gateway.yaml, [`wrk`] drives
//! the load, [`procs`] reads CPU and memory from `/proc`, [`litellm`] runs the LiteLLM proxy,
//! [`cost`] runs the chain in the wasmtime harness, [`perf`] splits a proxy's CPU by DSO,
//! [`report`] writes the markdown, [`translation`] holds the translation phase's figures and
//! section (issue 42). [`hostcost`] is `scripts/bench hostcost`: Envoy's cost per proxy-wasm
//! callback and host call.

pub mod ablation;
pub mod config;
pub mod cost;
pub mod hostcost;
pub mod litellm;
pub mod perf;
pub mod procs;
pub mod report;
pub mod translation;
pub mod wrk;

/// A row of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Row {
    /// F: the fused one-filter build (`envoy-config/gateway-fused.yaml`, when it exists).
    Fused,
    /// An ablation row (`--ablation`): C with one part taken away, or B with one plugin.
    Ablation(ablation::Ablation),
    /// A: the mock upstream directly.
    Mock,
    /// B: Envoy, router only.
    Bare,
    /// C: Envoy with the five-plugin chain, one module per plugin.
    Chain,
    /// C': the chain with the modules of `--compare DIR`.
    Compare,
    /// E: the chain with the bundle module.
    Bundle,
    /// D: the LiteLLM proxy.
    LiteLlm,
}

impl Row {
    /// Its letter in the tables.
    pub fn letter(self) -> &'static str {
        match self {
            Row::Mock => "A",
            Row::Bare => "B",
            Row::Chain => "C",
            Row::Compare => "C'",
            Row::Bundle => "E",
            Row::LiteLlm => "D",
            Row::Fused => "F",
            Row::Ablation(a) => a.letter(),
        }
    }

    /// Its letter as a file name part (ASCII).
    pub fn file_stem(self) -> String {
        self.letter()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect()
    }

    /// What it is.
    pub fn label(self) -> &'static str {
        match self {
            Row::Mock => "mock upstream directly",
            Row::Bare => "Envoy 1.40, router only",
            Row::Chain => "Envoy + five-plugin chain (one module per plugin)",
            Row::Compare => "Envoy + chain, modules of --compare DIR",
            Row::Bundle => "Envoy + five-plugin chain, bundle module (one VM per worker)",
            Row::LiteLlm => "LiteLLM proxy, one worker",
            Row::Fused => "Envoy + the fused one-filter build (envoy-config/gateway-fused.yaml)",
            Row::Ablation(a) => a.label(),
        }
    }

    /// An Envoy row.
    pub fn is_envoy(self) -> bool {
        matches!(
            self,
            Row::Bare | Row::Chain | Row::Compare | Row::Bundle | Row::Fused | Row::Ablation(_)
        )
    }
}

/// One measurement window with the proxy's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Window {
    /// wrk's figures.
    pub sample: wrk::Sample,
    /// The proxy's CPU time per request (µs), `None` for row A.
    pub cpu_us: Option<f64>,
    /// The proxy's RSS after the window (bytes), `None` for row A.
    pub rss: Option<u64>,
}

/// A row × workload × concurrency cell: medians over its windows.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// Row.
    pub row: Row,
    /// Index into the workloads.
    pub workload: usize,
    /// wrk connections.
    pub connections: u32,
    /// Median requests/s.
    pub rps: f64,
    /// Median p50, µs.
    pub p50_us: f64,
    /// Median p99, µs.
    pub p99_us: f64,
    /// Median proxy CPU per request, µs.
    pub cpu_us: Option<f64>,
    /// RSS after the last window.
    pub rss: Option<u64>,
    /// Errors (non-2xx + socket) over all windows.
    pub errors: u64,
    /// Requests over all windows.
    pub requests: f64,
}

impl Cell {
    /// Medians of `windows` (none: zeros).
    pub fn of(row: Row, workload: usize, connections: u32, windows: &[Window]) -> Cell {
        fn median(mut v: Vec<f64>) -> Option<f64> {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied()
        }
        // a window in which no request completed has no latency to give
        let done: Vec<&Window> = windows.iter().filter(|w| w.sample.requests > 0.0).collect();
        let m =
            |f: &dyn Fn(&Window) -> Option<f64>| median(done.iter().filter_map(|w| f(w)).collect());
        Cell {
            row,
            workload,
            connections,
            rps: median(windows.iter().map(|w| w.sample.rps).collect()).unwrap_or(0.0),
            p50_us: m(&|w| Some(w.sample.p50_us)).unwrap_or(0.0),
            p99_us: m(&|w| Some(w.sample.p99_us)).unwrap_or(0.0),
            cpu_us: m(&|w| w.cpu_us),
            rss: windows.last().and_then(|w| w.rss),
            errors: windows.iter().map(|w| w.sample.errors).sum(),
            requests: windows.iter().map(|w| w.sample.requests).sum(),
        }
    }
}

/// The leak check of one row: RSS before and after each batch of about [`LeakCheck::every`]
/// requests.
#[derive(Debug, Clone, PartialEq)]
pub struct LeakCheck {
    /// Row.
    pub row: Row,
    /// Requests aimed at per batch (a batch is a wrk window sized by the row's measured rate).
    pub every: u64,
    /// RSS before the first batch, then after each batch (bytes).
    pub rss: Vec<u64>,
    /// Requests sent so far at each RSS sample (0 first).
    pub at: Vec<f64>,
    /// Errors over the whole check.
    pub errors: u64,
    /// Requests sent (wrk's count).
    pub requests: f64,
}

impl LeakCheck {
    /// RSS at the start.
    pub fn start(&self) -> u64 {
        self.rss.first().copied().unwrap_or(0)
    }
    /// RSS at the end.
    pub fn end(&self) -> u64 {
        self.rss.last().copied().unwrap_or(0)
    }
    /// Largest RSS seen minus the start.
    pub fn max_growth(&self) -> i64 {
        self.rss.iter().max().copied().unwrap_or(0) as i64 - self.start() as i64
    }
    /// End minus the first batch's sample (the allocator's first-touch growth left out).
    pub fn growth_after_first_batch(&self) -> i64 {
        self.end() as i64 - self.rss.get(1).copied().unwrap_or(self.start()) as i64
    }
}
