//! `scripts/bench hostcost` (issue 19): what Envoy's side of proxy-wasm costs, per callback and
//! per host call, measured in Envoy 1.40 and 1.36.4 (Higress 2.2.4's base), so every target of
//! issue 19 has a floor under it.
//!
//! The probe is `tests/fixture-plugins/hostcost` (`dist/hostcost.wasm`): a wasm filter that
//! makes `calls` host calls of one kind per request and continues everywhere else. Each
//! [`Probe`] row is a listener of row B's config (`envoy-config/bench-bare.yaml`: router only,
//! the same access log) with zero, one or five probe filters in front of the router, each in a
//! VM of its own; one Envoy per version holds every row's listener (`--concurrency 1`, pinned
//! to the proxy CPU; wrk and the mock upstream on the other). Rows run in interleaved windows
//! (round → Envoy version → row) at 16 connections (the paced stream, [`Load::Paced`], at 64),
//! with a pause between windows so Envoy's file flushes of one row's window (access log, log
//! lines) land in no other row's; figures are medians of the proxy's CPU per request over the
//! rounds (`/proc`).
//!
//! A call's cost is the difference of its row to the row with one continue-only probe
//! ([`NONE`]), over its calls; a streamed event's, the stream's whole-request CPU over bare
//! Envoy's (and over the continue-only probe's), over its events. The floor row does only
//! what any gateway filter with our features must do (`Call::Floor` of the probe); what it
//! costs over bare Envoy is what the fused filter cannot go below on this host.

use super::procs::{self, MockProcess};
use super::wrk::{self, Workload, WORKLOADS};
use super::{config, Window};
use crate::envoy::{Envoy, Options};
use crate::workspace::{self, EnvoyVersion, TempDir};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The probe's file in the wasm folder.
pub const FILE: &str = "hostcost.wasm";
/// wrk's connections for every row.
pub const CONNECTIONS: u32 = 16;
/// The row with one continue-only probe: every call row is measured over it.
pub const NONE: &str = "none";
/// Row B of the chat rows.
pub const BARE: &str = "bare";
/// Row B of the stream rows (16 connections).
pub const STREAM_BARE: &str = "stream bare";
/// The stream's continue-only probe.
pub const STREAM_NONE: &str = "stream none";
/// Calls per request of a call row.
pub const CALLS: u32 = 200;
/// Calls per request of the rows whose calls cost more (a log line written, a body read).
pub const FEW_CALLS: u32 = 20;
/// The pause between two windows (Envoy flushes its files every 100 ms).
const GAP: Duration = Duration::from_millis(150);

/// Which request a row gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Chat with a 2 KB prompt, a JSON answer.
    Chat,
    /// The bench's 200-event stream.
    Stream,
    /// The same stream paced by the mock, [`PACE_MS`] between events: each event is its own
    /// body frame, as from a provider generating tokens, so Envoy reads it and calls the filter
    /// once per event (unpaced, the mock writes the events at once and Envoy coalesces them).
    Paced,
}

/// The mock's pause between the paced stream's events (`x-mock-chunk-delay-ms`).
pub const PACE_MS: u32 = 1;
/// wrk's connections for the paced stream (each request takes ≥ 200 ms).
pub const PACED_CONNECTIONS: u32 = 64;
/// The shortest window of the paced stream: a request in flight at a window's end took CPU
/// but is not counted, so the window is long next to a request.
pub const PACED_WINDOW: u32 = 3;

impl Load {
    /// The bench's workload.
    pub fn workload(self) -> Workload {
        let pick = |streams: bool| {
            WORKLOADS
                .iter()
                .copied()
                .find(|w| w.streams() == streams && !w.translated)
                .unwrap_or(WORKLOADS[0])
        };
        match self {
            Load::Chat => pick(false),
            Load::Stream | Load::Paced => pick(true),
        }
    }

    /// Its request headers (the bench's, and the pace).
    pub fn headers(self) -> Vec<(String, String)> {
        let mut headers = self.workload().headers("hostcost", true);
        if self == Load::Paced {
            headers.push(("x-mock-chunk-delay-ms".into(), PACE_MS.to_string()));
        }
        headers
    }

    /// A wrk script sending its request.
    pub fn lua(self) -> String {
        let mut lua = self.workload().lua("fast", "hostcost", true);
        if self == Load::Paced {
            lua.push_str(&format!(
                "wrk.headers[\"x-mock-chunk-delay-ms\"] = \"{PACE_MS}\"\n"
            ));
        }
        lua
    }

    /// Its section title.
    pub fn title(self) -> String {
        let w = self.workload();
        match self {
            Load::Chat | Load::Stream => format!("{}, c={CONNECTIONS}", w.name),
            Load::Paced => format!(
                "{}, paced ({PACE_MS} ms between events, each its own body frame), c={PACED_CONNECTIONS}",
                w.name
            ),
        }
    }
}

/// What a row measures, for the cost model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Bare Envoy or continue-only probes: the callbacks.
    Base,
    /// A call that returns data to the VM (Envoy allocates it in the VM through its malloc).
    Returns,
    /// A call that returns nothing or an integer.
    Cheap,
    /// A call that writes.
    Write,
    /// `define_metric`.
    Define,
    /// A log line at info (written).
    Log,
    /// A request body row.
    Body,
    /// A stream row.
    Stream,
    /// The floor.
    Floor,
    /// A row of the chain's candidates: VMs, frames copied, metrics recorded.
    Chain,
}

/// One row.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    /// Its name (the row's key in the tables).
    pub name: &'static str,
    /// What it does.
    pub label: &'static str,
    /// The request.
    pub load: Load,
    /// The probe configurations, one filter each, in chain order (none: bare Envoy).
    pub filters: Vec<Value>,
    /// The row its per-unit figure is the difference to (`None`: no per-unit figure).
    pub reference: Option<&'static str>,
    /// What the difference is divided by: calls (or the events of a stream).
    pub units: u32,
    /// For the cost model.
    pub kind: Kind,
    /// wrk's connections.
    pub connections: u32,
    /// Its filters share one VM (one `vm_id`); otherwise each has a VM of its own.
    pub one_vm: bool,
}

fn probe(call: &str, calls: u32) -> Value {
    if calls == 1 {
        json!({ "call": call })
    } else {
        json!({ "call": call, "calls": calls })
    }
}

/// A row of one probe making `calls` calls of `call`, measured over [`NONE`].
fn call_row(name: &'static str, label: &'static str, calls: u32, kind: Kind) -> Probe {
    Probe {
        name,
        label,
        load: Load::Chat,
        filters: vec![probe(name, calls)],
        reference: Some(NONE),
        units: calls,
        kind,
        connections: CONNECTIONS,
        one_vm: false,
    }
}

/// Every row, in the report's order (a row's reference comes before it).
pub fn probes() -> Vec<Probe> {
    let events = Load::Stream.workload().events;
    let mut rows = vec![
        Probe {
            name: BARE,
            label: "bare Envoy (router only, the bench's access log)",
            load: Load::Chat,
            filters: Vec::new(),
            reference: None,
            units: 1,
            kind: Kind::Base,
            connections: CONNECTIONS,
            one_vm: false,
        },
        Probe {
            name: NONE,
            label: "one probe that only continues (every callback, no host call)",
            load: Load::Chat,
            filters: vec![probe("none", 1)],
            reference: Some(BARE),
            units: 1,
            kind: Kind::Base,
            connections: CONNECTIONS,
            one_vm: false,
        },
    ];
    use Kind::{Cheap, Define, Log, Returns, Write};
    for (name, label, calls, kind) in [
        (
            "get_header",
            "get_header of a present request header (content-type)",
            CALLS,
            Returns,
        ),
        (
            "get_header_absent",
            "get_header of an absent request header",
            CALLS,
            Cheap,
        ),
        (
            "get_header_pairs",
            "get_header_map_pairs of the request headers (6 pairs)",
            CALLS,
            Returns,
        ),
        (
            "get_property_set",
            "get_property of a filter state this filter set (wasm.hostcost)",
            CALLS,
            Returns,
        ),
        (
            "get_property_absent",
            "get_property of an absent filter state",
            CALLS,
            Cheap,
        ),
        (
            "get_attribute",
            "get_property of the request attribute source.address",
            CALLS,
            Returns,
        ),
        (
            "get_shared_data",
            "get_shared_data of a present key (16 bytes)",
            CALLS,
            Returns,
        ),
        (
            "get_shared_data_absent",
            "get_shared_data of an absent key",
            CALLS,
            Cheap,
        ),
        (
            "remove_header",
            "remove_header of an absent request header",
            CALLS,
            Cheap,
        ),
        (
            "increment_metric",
            "increment_metric of a counter",
            CALLS,
            Cheap,
        ),
        (
            "log_debug",
            "log at debug (below Envoy's level: dropped)",
            CALLS,
            Cheap,
        ),
        ("current_time", "get_current_time_nanoseconds", CALLS, Cheap),
        (
            "replace_header",
            "replace_header of a request header (16-byte value)",
            CALLS,
            Write,
        ),
        (
            "set_property",
            "set_property of a filter state (16 bytes)",
            CALLS,
            Write,
        ),
        (
            "set_shared_data",
            "set_shared_data of a key (16 bytes, no CAS)",
            CALLS,
            Write,
        ),
        (
            "clear_route_cache",
            "call_foreign_function(clear_route_cache)",
            CALLS,
            Write,
        ),
        (
            "define_metric",
            "define_metric of a counter already defined (uncached)",
            CALLS,
            Define,
        ),
        (
            "log_info",
            "log at info (the line is written to Envoy's log)",
            FEW_CALLS,
            Log,
        ),
        (
            "record_histogram",
            "record_metric of a histogram (defined once, at configure)",
            CALLS,
            Kind::Chain,
        ),
    ] {
        rows.push(call_row(name, label, calls, kind));
    }
    rows.extend([
        Probe {
            name: "read_body ×1",
            label: "the request body buffered to its end and read once (over the continue-only probe)",
            load: Load::Chat,
            filters: vec![probe("read_body", 1)],
            reference: Some(NONE),
            units: 1,
            kind: Kind::Body,
            connections: CONNECTIONS,
            one_vm: false,
        },
        Probe {
            name: "read_body",
            label: "the buffered request body (2 KB) read 20 times (per read, over one read)",
            load: Load::Chat,
            filters: vec![probe("read_body", FEW_CALLS)],
            reference: Some("read_body ×1"),
            units: FEW_CALLS - 1,
            kind: Kind::Returns,
            connections: CONNECTIONS,
            one_vm: false,
        },
        Probe {
            name: "replace_body",
            label: "the buffered request body read once, then replaced with itself 20 times (per replace)",
            load: Load::Chat,
            filters: vec![probe("replace_body", FEW_CALLS)],
            reference: Some("read_body ×1"),
            units: FEW_CALLS,
            kind: Kind::Write,
            connections: CONNECTIONS,
            one_vm: false,
        },
        Probe {
            name: "floor",
            label: "the floor: what a gateway filter must do per chat request (see below)",
            load: Load::Chat,
            filters: vec![probe("floor", 1)],
            reference: Some(BARE),
            units: 1,
            kind: Kind::Floor,
            connections: CONNECTIONS,
            one_vm: false,
        },
    ]);
    rows.extend(chain_rows(Load::Chat, 1));
    rows.extend(stream_rows(Load::Stream, events));
    rows.extend(chain_rows(Load::Stream, events));
    rows.extend(stream_rows(Load::Paced, events));
    rows
}

/// Filters in the chain rows.
pub const CHAIN: usize = 5;
/// The chain rows' names, chat then unpaced stream: five continue-only probes each in its own
/// VM, the five in one VM, five probes replacing each response chunk with itself (own VMs,
/// then one VM), one probe recording usage-accounting's metrics at the end of each request.
pub const CHAIN_ROWS: [[&str; 5]; 2] = [
    [
        "none ×5",
        "none ×5 one VM",
        "replace ×5",
        "replace ×5 one VM",
        "metrics",
    ],
    [
        "stream none ×5",
        "stream none ×5 one VM",
        "stream replace ×5",
        "stream replace ×5 one VM",
        "stream metrics",
    ],
];

/// The rows isolating what the chain of six filters costs beyond the plugins' code (issue 19):
/// (a) the number of VMs, (b) each filter copying each response frame into its VM and back,
/// (c) the plugins' metrics. Chat rows are measured over the row they differ from, per filter;
/// stream rows over bare Envoy per event (their contrasts are in the cost model).
fn chain_rows(load: Load, events: u32) -> Vec<Probe> {
    let chat = load == Load::Chat;
    let names = CHAIN_ROWS[usize::from(!chat)];
    let (bare, none) = if chat {
        (BARE, NONE)
    } else {
        (STREAM_BARE, STREAM_NONE)
    };
    let row = |which: usize,
               label: &'static str,
               filters: Vec<Value>,
               one_vm: bool,
               reference: &'static str,
               units: u32| Probe {
        name: names[which],
        label,
        load,
        filters,
        reference: Some(if chat { reference } else { bare }),
        units: if chat { units } else { events },
        kind: if chat && which == 0 {
            Kind::Base
        } else {
            Kind::Chain
        },
        connections: CONNECTIONS,
        one_vm,
    };
    let five = CHAIN as u32;
    vec![
        row(
            0,
            "five continue-only probes, each in its own VM (per filter)",
            vec![probe("none", 1); CHAIN],
            false,
            bare,
            five,
        ),
        row(
            1,
            "five continue-only probes sharing one VM (one vm_id; per filter)",
            vec![probe("none", 1); CHAIN],
            true,
            bare,
            five,
        ),
        row(
            2,
            "five probes each reading each response chunk and replacing it with itself, own VMs (per filter, over five continue-only)",
            vec![probe("replace_chunk", 1); CHAIN],
            false,
            names[0],
            five,
        ),
        row(
            3,
            "the same five sharing one VM (per filter, over five continue-only in one VM)",
            vec![probe("replace_chunk", 1); CHAIN],
            true,
            names[1],
            five,
        ),
        row(
            4,
            "one probe recording 7 histograms and 5 counters at the end of each request (per request)",
            vec![probe("metrics", 1)],
            false,
            none,
            1,
        ),
    ]
}

/// The stream rows of `load`: bare Envoy, the continue-only probe, a read of each chunk, a
/// read and a replace of each chunk, the floor.
fn stream_rows(load: Load, events: u32) -> Vec<Probe> {
    let connections = if load == Load::Paced {
        PACED_CONNECTIONS
    } else {
        CONNECTIONS
    };
    let row = |name: &'static str, label: &'static str, filters: Vec<Value>, kind: Kind| Probe {
        name,
        label,
        load,
        filters,
        reference: (name != stream_name(load, 0)).then(|| stream_name(load, 0)),
        units: events,
        kind,
        connections,
        one_vm: false,
    };
    vec![
        row(
            stream_name(load, 0),
            "bare Envoy, the stream",
            Vec::new(),
            Kind::Base,
        ),
        row(
            stream_name(load, 1),
            "one probe that only continues, every chunk included",
            vec![probe("none", 1)],
            Kind::Stream,
        ),
        row(
            stream_name(load, 2),
            "one probe reading each response chunk once",
            vec![probe("read_chunk", 1)],
            Kind::Stream,
        ),
        row(
            stream_name(load, 3),
            "one probe reading each response chunk and replacing it with itself",
            vec![probe("replace_chunk", 1)],
            Kind::Stream,
        ),
        row(
            stream_name(load, 4),
            "the floor on the stream (its request part, then each chunk read once)",
            vec![probe("floor", 1)],
            Kind::Floor,
        ),
    ]
}

/// The stream rows' names: `stream bare`, `stream none`, `stream read`, `stream replace`,
/// `stream floor`; `paced …` for the paced stream.
pub fn stream_name(load: Load, which: usize) -> &'static str {
    const AT_16: [&str; 5] = [
        STREAM_BARE,
        STREAM_NONE,
        "stream read",
        "stream replace",
        "stream floor",
    ];
    const PACED: [&str; 5] = [
        "paced bare",
        "paced none",
        "paced read",
        "paced replace",
        "paced floor",
    ];
    let names = if load == Load::Paced { PACED } else { AT_16 };
    names.get(which).copied().unwrap_or(STREAM_BARE)
}

/// The listener of row `index`.
pub fn listener_name(index: usize) -> String {
    format!("hostcost-{index}")
}

/// One Envoy config holding every row of `rows`: row B's listener once per row (named
/// [`listener_name`]), each with the row's probe filters in front of the router, each filter
/// in a VM of its own, or all of a [`Probe::one_vm`] row's in one (Envoy shares a VM between
/// filters of the same `vm_id`, code, runtime and VM configuration, each filter a root context
/// of its own). Placeholders left: `${WASM_DIR}`, `${LOG_DIR}`.
pub fn envoy_config(bare: &Value, rows: &[Probe]) -> crate::Result<Value> {
    let listener = bare
        .pointer("/static_resources/listeners/0")
        .cloned()
        .ok_or("row B has no listener")?;
    let mut listeners = Vec::new();
    for (index, row) in rows.iter().enumerate() {
        let mut l = listener.clone();
        l["name"] = json!(listener_name(index));
        let filters = l
            .pointer_mut("/filter_chains/0/filters/0/typed_config/http_filters")
            .and_then(Value::as_array_mut)
            .ok_or("row B's listener has no http_filters")?;
        let router = filters.len().saturating_sub(1);
        for (k, probe) in row.filters.iter().enumerate() {
            let name = format!("hostcost-{index}-{k}");
            let vm_id = if row.one_vm {
                format!("hostcost-{index}")
            } else {
                name.clone()
            };
            filters.insert(
                router + k,
                json!({
                    "name": name,
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
                        "config": {
                            "name": name,
                            "root_id": "hostcost",
                            "fail_open": false,
                            // the floor holds the request headers until the body has arrived
                            "allow_on_headers_stop_iteration": true,
                            "vm_config": {
                                "vm_id": vm_id,
                                "runtime": "envoy.wasm.runtime.v8",
                                "code": {"local": {"filename": format!("${{WASM_DIR}}/{FILE}")}},
                            },
                            "configuration": {
                                "@type": "type.googleapis.com/google.protobuf.StringValue",
                                "value": probe.to_string(),
                            },
                        },
                    },
                }),
            );
        }
        listeners.push(l);
    }
    let mut out = bare.clone();
    *out.pointer_mut("/static_resources/listeners")
        .ok_or("row B has no listeners")? = Value::Array(listeners);
    Ok(out)
}

/// The distinct `vm_id`s of the config [`envoy_config`] writes for `rows`.
pub fn distinct_vms(rows: &[Probe]) -> usize {
    rows.iter()
        .map(|r| {
            if r.one_vm {
                r.filters.len().min(1)
            } else {
                r.filters.len()
            }
        })
        .sum()
}

/// The mode's options.
#[derive(Debug, Clone, PartialEq)]
pub struct Args {
    /// Seconds per window.
    pub window: u32,
    /// Rounds (windows per row and version).
    pub rounds: u32,
    /// Versions.
    pub versions: Vec<EnvoyVersion>,
    /// The report.
    pub out: PathBuf,
}

impl Args {
    /// `hostcost [--window SECS] [--rounds N] [--envoy 1.40,1.36] [--out FILE]`.
    pub fn parse(raw: &[String]) -> crate::Result<Args> {
        let mut args = Args {
            window: 1,
            rounds: 3,
            versions: vec![EnvoyVersion::V140, EnvoyVersion::V136],
            out: workspace::root().join("target/bench/report-hostcost.md"),
        };
        let mut it = raw.iter();
        while let Some(arg) = it.next() {
            let mut value = || it.next().ok_or(format!("{arg} needs a value"));
            match arg.as_str() {
                "--window" => {
                    args.window = value()?.parse().map_err(|e| format!("--window: {e}"))?
                }
                "--rounds" => {
                    args.rounds = value()?.parse().map_err(|e| format!("--rounds: {e}"))?
                }
                "--envoy" => {
                    args.versions = value()?
                        .split(',')
                        .map(|v| EnvoyVersion::parse(v).map_err(|e| format!("--envoy: {e}")))
                        .collect::<crate::Result<_>>()?
                }
                "--out" => args.out = value()?.into(),
                other => return Err(format!("hostcost: unknown argument {other:?}")),
            }
        }
        if args.window == 0 || args.rounds == 0 || args.versions.is_empty() {
            return Err("--window, --rounds and --envoy must not be empty or zero".into());
        }
        Ok(args)
    }
}

/// A row's windows in one version.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    /// Proxy CPU per request, µs, one per window.
    pub cpu_us: Vec<f64>,
    /// Requests per second, one per window.
    pub rps: Vec<f64>,
    /// Errors over all windows.
    pub errors: u64,
}

impl Series {
    fn push(&mut self, w: &Window) {
        if let Some(cpu) = w.cpu_us {
            self.cpu_us.push(cpu);
        }
        self.rps.push(w.sample.rps);
        self.errors += w.sample.errors;
    }

    /// The median CPU per request.
    pub fn cpu(&self) -> Option<f64> {
        median(&self.cpu_us)
    }
}

/// The median of `values` (the upper one of an even count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// What one version measured.
#[derive(Debug, Clone, PartialEq)]
pub struct VersionRun {
    /// The version.
    pub version: EnvoyVersion,
    /// `envoy --version`'s build id.
    pub build: String,
    /// Per row (in [`probes`] order), its windows; `Err` when the row could not run.
    pub series: Vec<crate::Result<Series>>,
    /// Lines of the probe's failure warnings in Envoy's log (calls that failed).
    pub failures: Vec<String>,
    /// Envoy's gauge of live V8 VMs once every listener answered
    /// (`wasm.envoy.wasm.runtime.v8.active`).
    pub vms: Option<u64>,
}

impl VersionRun {
    /// The median CPU of the row called `name`.
    pub fn cpu(&self, rows: &[Probe], name: &str) -> Option<f64> {
        let i = rows.iter().position(|r| r.name == name)?;
        self.series.get(i)?.as_ref().ok()?.cpu()
    }

    /// A stream row's CPU over the continue-only probe's at its connections, per event
    /// (`None` for bare Envoy and the continue-only probe themselves).
    pub fn over_stream_none(&self, rows: &[Probe], row: &Probe) -> Option<f64> {
        let none = stream_name(row.load, 1);
        if row.load == Load::Chat || row.reference.is_none() || row.name == none {
            return None;
        }
        Some((self.cpu(rows, row.name)? - self.cpu(rows, none)?) / f64::from(row.units.max(1)))
    }

    /// The row's per-unit figure: (its CPU − its reference's) / its units.
    pub fn per_unit(&self, rows: &[Probe], row: &Probe) -> Option<f64> {
        let reference = self.cpu(rows, row.reference?)?;
        Some((self.cpu(rows, row.name)? - reference) / f64::from(row.units.max(1)))
    }
}

/// The summary of one version's rows: µs of Envoy CPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CostModel {
    /// One continue-only filter over bare Envoy, per request.
    pub filter: Option<f64>,
    /// Per filter of five continue-only filters.
    pub filter_of_five: Option<f64>,
    /// Median and range of the calls that return data.
    pub returns: Option<(f64, f64, f64)>,
    /// Median and range of the cheap calls.
    pub cheap: Option<(f64, f64, f64)>,
    /// Median and range of the writes.
    pub writes: Option<(f64, f64, f64)>,
    /// `define_metric`.
    pub define: Option<f64>,
    /// A log line at info.
    pub log_line: Option<f64>,
    /// The request body buffered and read once, over the continue-only filter.
    pub body_once: Option<f64>,
    /// Per event, unpaced then paced: the continue-only filter over bare Envoy.
    pub event_continue: [Option<f64>; 2],
    /// Per event: a read of each chunk over the continue-only filter.
    pub event_read: [Option<f64>; 2],
    /// Per event: a read and a replace of each chunk over the continue-only filter.
    pub event_replace: [Option<f64>; 2],
    /// The floor over bare Envoy, per chat request.
    pub floor: Option<f64>,
    /// The floor over bare Envoy, per streamed event (the whole stream request over its
    /// events), unpaced then paced.
    pub floor_event: [Option<f64>; 2],
    /// Per filter of five continue-only filters sharing one VM.
    pub filter_of_five_one_vm: Option<f64>,
    /// Per extra VM, per request, chat then unpaced stream: five continue-only filters in
    /// five VMs over the five in one VM, / 4.
    pub extra_vm: [Option<f64>; 2],
    /// Per filter reading and replacing each response chunk (five such over five
    /// continue-only, / 5), per chat request then per streamed event; own VMs.
    pub frame_filter: [Option<f64>; 2],
    /// The same, the five filters in one VM.
    pub frame_filter_one_vm: [Option<f64>; 2],
    /// 7 histograms and 5 counters recorded once per request, over one continue-only filter,
    /// per chat request then per stream request.
    pub metrics_request: [Option<f64>; 2],
    /// Per histogram record (`record_metric`).
    pub histogram_record: Option<f64>,
}

fn spread(values: &[f64]) -> Option<(f64, f64, f64)> {
    let m = median(values)?;
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((m, lo, hi))
}

impl CostModel {
    /// From one version's rows.
    pub fn of(run: &VersionRun, rows: &[Probe]) -> CostModel {
        let per = |name: &str| {
            rows.iter()
                .find(|r| r.name == name)
                .and_then(|r| run.per_unit(rows, r))
        };
        let kinds = |kind: Kind| -> Vec<f64> {
            rows.iter()
                .filter(|r| r.kind == kind && r.load == Load::Chat)
                .filter_map(|r| run.per_unit(rows, r))
                .collect()
        };
        let over_none = |name: &str| {
            let row = rows.iter().find(|r| r.name == name)?;
            run.over_stream_none(rows, row)
        };
        let cpu = |name: &str| run.cpu(rows, name);
        // a chain row of the unpaced stream over another, per filter per event
        let stream_contrast = |row: usize, over: usize| {
            let names = CHAIN_ROWS[1];
            let events = rows.iter().find(|r| r.name == names[row])?.units;
            Some((cpu(names[row])? - cpu(names[over])?) / CHAIN as f64 / f64::from(events.max(1)))
        };
        let both = |which: usize, f: &dyn Fn(&str) -> Option<f64>| {
            [
                f(stream_name(Load::Stream, which)),
                f(stream_name(Load::Paced, which)),
            ]
        };
        CostModel {
            filter: per(NONE),
            filter_of_five: per("none ×5"),
            returns: spread(&kinds(Kind::Returns)),
            cheap: spread(&kinds(Kind::Cheap)),
            writes: spread(&kinds(Kind::Write)),
            define: per("define_metric"),
            log_line: per("log_info"),
            body_once: per("read_body ×1"),
            event_continue: both(1, &per),
            event_read: both(2, &over_none),
            event_replace: both(3, &over_none),
            floor: per("floor"),
            floor_event: both(4, &per),
            filter_of_five_one_vm: per(CHAIN_ROWS[0][1]),
            extra_vm: CHAIN_ROWS.map(|names| {
                let (five, one) = cpu(names[0]).zip(cpu(names[1]))?;
                Some((five - one) / (CHAIN - 1) as f64)
            }),
            frame_filter: [per(CHAIN_ROWS[0][2]), stream_contrast(2, 0)],
            frame_filter_one_vm: [per(CHAIN_ROWS[0][3]), stream_contrast(3, 1)],
            metrics_request: [
                per(CHAIN_ROWS[0][4]),
                cpu(CHAIN_ROWS[1][4])
                    .zip(cpu(STREAM_NONE))
                    .map(|(m, n)| m - n),
            ],
            histogram_record: per("record_histogram"),
        }
    }
}

fn num(v: Option<f64>) -> String {
    v.map_or_else(|| "–".into(), |v| format!("{v:.2}"))
}

fn pair(v: [Option<f64>; 2]) -> String {
    format!("{} / {}", num(v[0]), num(v[1]))
}

fn range(v: Option<(f64, f64, f64)>) -> String {
    v.map_or_else(
        || "–".into(),
        |(m, lo, hi)| format!("{m:.2} ({lo:.2}–{hi:.2})"),
    )
}

/// The report: the header lines, one table per version, the cost model side by side.
pub fn render(header: &[String], rows: &[Probe], runs: &[VersionRun]) -> String {
    let mut md = String::from("# Envoy's cost per proxy-wasm callback and host call\n\n");
    md.push_str("`scripts/bench hostcost` (tests/src/bench/hostcost.rs, the probe tests/fixture-plugins/hostcost).\n\n");
    for line in header {
        md.push_str(&format!("- {line}\n"));
    }
    let models: Vec<CostModel> = runs.iter().map(|r| CostModel::of(r, rows)).collect();
    md.push_str(
        "\n## Cost model (µs of Envoy CPU; medians, a range is the spread of the kinds)\n\n| | ",
    );
    md.push_str(
        &runs
            .iter()
            .map(|r| format!("Envoy {} ({})", r.version.name(), r.build))
            .collect::<Vec<_>>()
            .join(" | "),
    );
    md.push_str(" |\n|---|");
    md.push_str(&"---|".repeat(runs.len()));
    md.push('\n');
    type Pick = fn(&CostModel) -> String;
    let lines: [(&str, Pick); 19] = [
        ("one filter's callbacks, per request (one continue-only filter over bare Envoy)", |m| num(m.filter)),
        ("per filter, of five continue-only filters", |m| num(m.filter_of_five)),
        ("per call returning data (get_header, header pairs, get_property, get_shared_data, a body read)", |m| range(m.returns)),
        ("per cheap call (absent header/property/key, remove_header, increment_metric, log below the level, time)", |m| range(m.cheap)),
        ("per write (replace_header, set_property, set_shared_data, clear_route_cache, a body replace)", |m| range(m.writes)),
        ("per define_metric (uncached)", |m| num(m.define)),
        ("per log line at info", |m| num(m.log_line)),
        ("request body buffered to its end and read once, per request", |m| num(m.body_once)),
        ("per streamed event, unpaced c=16 / paced: a continue-only filter (over bare Envoy)", |m| pair(m.event_continue)),
        ("per streamed event, unpaced c=16 / paced: + reading the chunk", |m| pair(m.event_read)),
        ("per streamed event, unpaced c=16 / paced: + reading and replacing the chunk", |m| pair(m.event_replace)),
        ("**the floor, per chat 2 KB request** (over bare Envoy)", |m| num(m.floor)),
        ("**the floor, per streamed event, unpaced c=16 / paced** (the stream over bare Envoy, / events)", |m| pair(m.floor_event)),
        ("per filter, of five continue-only filters sharing one VM", |m| num(m.filter_of_five_one_vm)),
        ("**per extra VM**, per chat request / per stream request (five continue-only filters in five VMs − in one VM, / 4)", |m| pair(m.extra_vm)),
        ("**per filter touching each response frame**, per chat request / per streamed event (five probes reading and replacing each chunk − five continue-only, / 5; own VMs)", |m| pair(m.frame_filter)),
        ("the same, the five in one VM, per chat request / per streamed event", |m| pair(m.frame_filter_one_vm)),
        ("**7 histograms + 5 counters recorded once per request**, per chat request / per stream request (over one continue-only filter)", |m| pair(m.metrics_request)),
        ("**per histogram record** (record_metric of a histogram defined once)", |m| num(m.histogram_record)),
    ];
    for (label, pick) in lines {
        md.push_str(&format!("| {label} |"));
        for m in &models {
            md.push_str(&format!(" {} |", pick(m)));
        }
        md.push('\n');
    }
    md.push_str("\nThe floor: one filter that reads the request's header pairs once, holds the headers until the body has arrived, reads the body once, writes 5 request headers, sets one filter state and clears the route cache once; reads the response's header pairs once and increments one counter; reads a JSON response body once at its end, a stream's every chunk once. No logic: what any gateway filter with key auth, routing on the body, PII masking, usage accounting and rate limiting needs of the host per request.\n");
    for run in runs {
        md.push_str(&format!(
            "\n## Envoy {} ({})\n\n",
            run.version.name(),
            run.build
        ));
        for load in [Load::Chat, Load::Stream, Load::Paced] {
            md.push_str(&format!("### {}\n\n", load.title()));
            if load == Load::Chat {
                md.push_str("| row | what | filters × calls | Envoy CPU µs/request | min–max | req/s | over | Δ µs | µs per unit |\n|---|---|---|---|---|---|---|---|---|\n");
            } else {
                md.push_str("| row | what | Envoy CPU µs/request | min–max | req/s | µs per event over bare | µs per event over the continue-only probe |\n|---|---|---|---|---|---|---|\n");
            }
            for (row, series) in rows.iter().zip(&run.series).filter(|(r, _)| r.load == load) {
                let series = match series {
                    Ok(s) => s,
                    Err(why) => {
                        md.push_str(&format!(
                            "| {} | {} | not run: {why} |\n",
                            row.name, row.label
                        ));
                        continue;
                    }
                };
                let cpu = series.cpu();
                let (lo, hi) =
                    spread(&series.cpu_us).map_or((None, None), |(_, l, h)| (Some(l), Some(h)));
                let rps = median(&series.rps).map_or_else(|| "–".into(), |v| format!("{v:.0}"));
                let errors = if series.errors > 0 {
                    format!(" ({} errors)", series.errors)
                } else {
                    String::new()
                };
                let minmax = format!("{}–{}", num(lo), num(hi));
                if load == Load::Chat {
                    let calls = row
                        .filters
                        .first()
                        .and_then(|f| f["calls"].as_u64())
                        .unwrap_or(1);
                    let shape = if row.filters.is_empty() {
                        "–".to_string()
                    } else {
                        format!("{} × {calls}", row.filters.len())
                    };
                    let delta = row.reference.and_then(|r| Some(cpu? - run.cpu(rows, r)?));
                    md.push_str(&format!(
                        "| {} | {} | {shape} | {}{errors} | {minmax} | {rps} | {} | {} | {} |\n",
                        row.name,
                        row.label,
                        num(cpu),
                        row.reference.unwrap_or("–"),
                        num(delta),
                        row.reference.map_or("–".into(), |_| format!(
                            "{} /{}",
                            num(run.per_unit(rows, row)),
                            row.units
                        )),
                    ));
                } else {
                    let over_none = run.over_stream_none(rows, row);
                    md.push_str(&format!(
                        "| {} | {} | {}{errors} | {minmax} | {rps} | {} | {} |\n",
                        row.name,
                        row.label,
                        num(cpu),
                        num(run.per_unit(rows, row)),
                        num(over_none),
                    ));
                }
            }
            md.push('\n');
        }
        md.push_str(&format!(
            "V8 VMs live in this Envoy (`wasm.envoy.wasm.runtime.v8.active`, once every listener answered): {}; the config has {} distinct vm_id(s).\n\n",
            run.vms.map_or_else(|| "–".into(), |v| v.to_string()),
            distinct_vms(rows)
        ));
        if run.failures.is_empty() {
            md.push_str("No host call of the probe failed (Envoy's log has no `hostcost: … failed` line).\n");
        } else {
            md.push_str(&format!(
                "**{} warning line(s) of failed host calls in Envoy's log**, the first: `{}`\n",
                run.failures.len(),
                run.failures.first().map(String::as_str).unwrap_or_default()
            ));
        }
    }
    md
}

/// Runs the mode: every row in both versions; writes the report to `args.out`, returns it.
pub fn run(args: &Args, mock_bin: &Path) -> crate::Result<String> {
    let started = Instant::now();
    let wasm = workspace::wasm_dir().join(FILE);
    if !wasm.is_file() {
        return Err(format!("{} is missing: run scripts/build", wasm.display()));
    }
    let load_start = load_average();
    let mock = MockProcess::start(mock_bin)?;
    let dir = TempDir::new("hostcost")?;
    let rows = probes();
    let config = envoy_config(&config::bare(mock.port)?, &rows)?;
    let path = dir.path().join("hostcost.json");
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&config).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let template = path.to_str().ok_or("temp path is not UTF-8")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;

    // one Envoy per version, every row a listener of it
    struct Running {
        version: EnvoyVersion,
        build: String,
        vms: Option<u64>,
        envoy: Envoy,
        urls: Vec<crate::Result<String>>,
        series: Vec<Series>,
    }
    let mut running = Vec::new();
    for &version in &args.versions {
        let build = envoy_build(version);
        eprintln!("hostcost: starting Envoy {} ({build})", version.name());
        let options = Options {
            concurrency: 1,
            trace_wasm: false,
            version,
        };
        let envoy = Envoy::start_with_log_level(template, &[], &options, "info")
            .map_err(|e| format!("Envoy {}: {e}", version.name()))?;
        if !procs::pin(envoy.pid(), procs::PROXY_CPU) {
            eprintln!("(taskset failed: Envoy {} is not pinned)", version.name());
        }
        let mut urls = Vec::new();
        for (index, row) in rows.iter().enumerate() {
            let url = envoy
                .listener(&listener_name(index))
                .map(|a| format!("http://{a}"))
                .and_then(|url| {
                    check(&rt, &url, row.load)?;
                    Ok(url)
                });
            if let Err(why) = &url {
                eprintln!(
                    "hostcost: Envoy {}, row {}: {why}",
                    version.name(),
                    row.name
                );
            }
            urls.push(url);
        }
        let vms = envoy
            .stat("wasm.envoy.wasm.runtime.v8.active")
            .ok()
            .flatten();
        running.push(Running {
            version,
            build,
            vms,
            envoy,
            urls,
            series: vec![Series::default(); rows.len()],
        });
    }

    let scripts: Vec<PathBuf> = [Load::Chat, Load::Stream, Load::Paced]
        .iter()
        .map(|load| {
            let path = dir.path().join(format!("{load:?}.lua"));
            std::fs::write(&path, load.lua()).map_err(|e| e.to_string())?;
            Ok(path)
        })
        .collect::<crate::Result<_>>()?;
    let script = |load: Load| match load {
        Load::Chat => &scripts[0],
        Load::Stream => &scripts[1],
        Load::Paced => &scripts[2],
    };

    // warm-up (V8's tiers, connections), then the interleaved windows
    for r in &running {
        for (row, url) in rows.iter().zip(&r.urls) {
            if let Ok(url) = url {
                wrk::run(url, script(row.load), 1, row.connections)?;
            }
        }
    }
    for round in 0..args.rounds {
        eprintln!(
            "hostcost: round {}/{} ({:.0} s so far)",
            round + 1,
            args.rounds,
            started.elapsed().as_secs_f64()
        );
        for r in &mut running {
            let pid = r.envoy.pid();
            for (i, row) in rows.iter().enumerate() {
                let Some(Ok(url)) = r.urls.get(i) else {
                    continue;
                };
                std::thread::sleep(GAP);
                let before = procs::cpu_us(pid)?;
                let secs = if row.load == Load::Paced {
                    args.window.max(PACED_WINDOW)
                } else {
                    args.window
                };
                let sample = wrk::run(url, script(row.load), secs, row.connections)?;
                let after = procs::cpu_us(pid)?;
                let window = Window {
                    sample,
                    cpu_us: Some((after - before) / counted(row, sample.requests)),
                    rss: None,
                };
                if let Some(s) = r.series.get_mut(i) {
                    s.push(&window);
                }
            }
        }
    }
    let load_end = load_average();

    let runs: Vec<VersionRun> = running
        .into_iter()
        .map(|r| VersionRun {
            version: r.version,
            build: r.build,
            failures: failures(&r.envoy),
            vms: r.vms,
            series: r
                .urls
                .into_iter()
                .zip(r.series)
                .map(|(url, s)| url.map(|_| s))
                .collect(),
        })
        .collect();
    let header = vec![
        format!("machine: {}, {} cores; load average (1/5/15 min) {load_start} at the start, {load_end} at the end (other work on the machine adds noise: the windows are interleaved, round → version → row, so it hits every row alike; the min–max columns show the spread)", cpu_model(), std::thread::available_parallelism().map_or(0, |n| n.get())),
        format!("one Envoy per version, `--concurrency 1`, log level info, pinned to CPU {}; every row a listener of row B's config (router only, the bench's access log) with its probe filters in front of the router, each in a VM of its own (V8) but in the rows marked one VM; wrk (one thread, {CONNECTIONS} connections) and the mock upstream on CPU {}", procs::PROXY_CPU, procs::LOAD_CPU),
        format!("{} round(s) of one {}-second window per row and version, {} ms apart; figures are medians over the rounds of Envoy's CPU (user + system, /proc) per request; 1 s of warm-up per row first; {:.0} s in all", args.rounds, args.window, GAP.as_millis(), started.elapsed().as_secs_f64()),
        "requests: the bench's chat 2 KB (JSON answer) and its 200-event stream (the mock echoes the prompt's last message 3 characters per event)".into(),
        "µs per unit: (row − the row in `over`) / the row's calls; a call row's probe makes its calls in the request headers callback, so the difference is the calls alone. Stream rows: (row − bare) / events, and over the continue-only probe".into(),
        format!("the chain's candidates (issue 19: why each filter of the six-filter chain costs more than its code), on chat and on the unpaced stream: {CHAIN} continue-only probes each in its own VM against the {CHAIN} sharing one VM (one vm_id: Envoy shares a VM between filters of the same vm_id, code and VM configuration), {CHAIN} probes each reading each response chunk and replacing it with itself against {CHAIN} continue-only, one probe recording 7 histograms and 5 counters (usage-accounting's count, defined once per VM) in on_log against one continue-only probe"),
        format!("the stream twice: as the bench sends it (the mock writes all 200 events at once; at c={CONNECTIONS} Envoy reads them in a few frames, so a filter sees a few body callbacks, not 200), and paced by the mock ({PACE_MS} ms between events, `x-mock-chunk-delay-ms`: each event its own frame and body callback, as from a provider generating tokens) at c={PACED_CONNECTIONS} in windows of at least {PACED_WINDOW} s; a paced request takes a few hundred ms, so its CPU per request counts the requests in flight at the window's end as half done (wrk does not count them)"),
    ];
    let text = render(&header, &rows, &runs);
    if let Some(parent) = args.out.parent() {
        std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
    }
    std::fs::write(&args.out, &text).map_err(|e| e.to_string())?;
    Ok(text)
}

/// The requests a window's CPU paid for: wrk's completed ones and, for the paced stream, half a
/// request per connection (each connection has one in flight at the window's end, on average
/// half done; its CPU is in the window, it is not in wrk's count). A chat or unpaced request
/// takes milliseconds: its in-flight share of a window is negligible.
pub fn counted(row: &Probe, completed: f64) -> f64 {
    let in_flight = if row.load == Load::Paced {
        f64::from(row.connections) / 2.0
    } else {
        0.0
    };
    (completed + in_flight).max(1.0)
}

/// One request of `w` at `url`: 200, and for the stream all its events.
fn check(rt: &tokio::runtime::Runtime, url: &str, load: Load) -> crate::Result<()> {
    let w = load.workload();
    let mut request = crate::http::post(format!("{url}/v1/chat/completions")).body(w.body("fast"));
    for (name, value) in load.headers() {
        request = request.header(&name, &value);
    }
    let answer = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), request.send())
            .await
            .map_err(|_| "no answer within 30 s".to_string())?
    })?;
    if answer.status != 200 {
        return Err(format!("{}: answered {}", w.name, answer.status));
    }
    if w.streams() {
        let text = answer.text();
        let events = crate::http::sse_events(&text)
            .iter()
            .filter(|(_, v)| v["choices"][0]["delta"]["content"].is_string())
            .count();
        if events < w.events as usize {
            return Err(format!("{}: {events} events, not {}", w.name, w.events));
        }
    }
    Ok(())
}

/// The probe's warnings of failed calls in Envoy's log.
fn failures(envoy: &Envoy) -> Vec<String> {
    let text = std::fs::read_to_string(envoy.dir().join("envoy.log")).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains("hostcost: ") && !l.contains("a line at info"))
        .map(str::to_string)
        .collect()
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// `envoy --version`'s build id (`<commit>/<version>/…`).
fn envoy_build(version: EnvoyVersion) -> String {
    workspace::envoy_bin(version)
        .ok()
        .and_then(|bin| Command::new(bin).arg("--version").output().ok())
        .map(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.split_whitespace()
                .find(|w| {
                    w.contains('/') && w.chars().next().is_some_and(|c| c.is_ascii_hexdigit())
                })
                .and_then(|w| w.split('/').nth(1))
                .map(str::to_string)
                .unwrap_or_else(|| text.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Vec<Probe> {
        probes()
    }

    #[test]
    fn every_probe_configuration_is_one_the_probe_accepts() {
        for row in rows() {
            for f in &row.filters {
                let parsed = hostcost::Config::parse(f.to_string().as_bytes())
                    .unwrap_or_else(|e| panic!("{}: {e}", row.name));
                assert_eq!(
                    u64::from(parsed.calls),
                    f["calls"].as_u64().unwrap_or(1),
                    "{}",
                    row.name
                );
            }
        }
    }

    #[test]
    fn rows_are_distinct_and_their_references_come_first() {
        let rows = rows();
        let mut names: Vec<&str> = rows.iter().map(|r| r.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), rows.len());
        for (i, row) in rows.iter().enumerate() {
            if let Some(reference) = row.reference {
                let at = rows.iter().position(|r| r.name == reference).unwrap();
                assert!(at < i, "{}: {reference} comes later", row.name);
                assert_eq!(rows[at].load, row.load, "{}: same request", row.name);
            }
            assert!(row.units > 0);
        }
        // a call row makes exactly the calls it divides by
        for row in rows.iter().filter(|r| r.reference == Some(NONE)) {
            assert_eq!(row.filters.len(), 1, "{}", row.name);
            assert_eq!(
                row.filters[0]["calls"].as_u64().unwrap_or(1),
                u64::from(row.units),
                "{}",
                row.name
            );
        }
        let stream = rows.iter().find(|r| r.name == "stream read").unwrap();
        assert_eq!(stream.units, 200, "per event");
        assert!(rows
            .iter()
            .any(|r| r.name == "floor" && r.load == Load::Chat));
        for load in [Load::Stream, Load::Paced] {
            let at: Vec<&Probe> = rows
                .iter()
                .filter(|r| r.load == load && !CHAIN_ROWS[1].contains(&r.name))
                .collect();
            assert_eq!(at.len(), 5, "{load:?}");
            for (i, r) in at.iter().enumerate() {
                assert_eq!(r.name, stream_name(load, i));
                assert_eq!(
                    r.reference,
                    (i > 0).then(|| stream_name(load, 0)),
                    "{}",
                    r.name
                );
                let c = if load == Load::Paced {
                    PACED_CONNECTIONS
                } else {
                    CONNECTIONS
                };
                assert_eq!(r.connections, c);
            }
        }
        // the chain rows: chat and the unpaced stream, five filters in five VMs or one
        for (names, load) in CHAIN_ROWS.iter().zip([Load::Chat, Load::Stream]) {
            let chain: Vec<&Probe> = names
                .iter()
                .map(|n| rows.iter().find(|r| r.name == *n).unwrap())
                .collect();
            for r in &chain {
                assert_eq!(r.load, load, "{}", r.name);
                assert_eq!(r.connections, CONNECTIONS, "{}", r.name);
            }
            let calls = |r: &Probe| -> Vec<String> {
                r.filters.iter().map(|f| f["call"].to_string()).collect()
            };
            assert_eq!(calls(chain[0]), vec!["\"none\""; CHAIN]);
            assert_eq!(calls(chain[1]), calls(chain[0]));
            assert_eq!(calls(chain[2]), vec!["\"replace_chunk\""; CHAIN]);
            assert_eq!(calls(chain[3]), calls(chain[2]));
            assert_eq!(calls(chain[4]), vec!["\"metrics\""]);
            let vms: Vec<bool> = chain.iter().map(|r| r.one_vm).collect();
            assert_eq!(vms, [false, true, false, true, false]);
            if load == Load::Chat {
                // each over the row it differs from in one thing, per filter
                let over: Vec<_> = chain.iter().map(|r| r.reference.unwrap()).collect();
                assert_eq!(over, [BARE, BARE, names[0], names[1], NONE]);
                let units: Vec<u32> = chain.iter().map(|r| r.units).collect();
                assert_eq!(units, [5, 5, 5, 5, 1]);
            } else {
                assert!(chain
                    .iter()
                    .all(|r| r.reference == Some(STREAM_BARE) && r.units == 200));
            }
        }
        assert_eq!(
            rows.iter().filter(|r| r.one_vm).count(),
            4,
            "only the chain's one-VM rows share a VM"
        );
        let histogram = rows.iter().find(|r| r.name == "record_histogram").unwrap();
        assert_eq!(histogram.filters[0]["calls"], CALLS);
        assert!(Load::Paced
            .lua()
            .contains("wrk.headers[\"x-mock-chunk-delay-ms\"] = \"1\""));
        assert!(Load::Paced.lua().contains("x-mock-echo"));
        assert!(!Load::Stream.lua().contains("x-mock-chunk-delay-ms"));
        assert!(Load::Paced
            .headers()
            .contains(&("x-mock-chunk-delay-ms".into(), "1".into())));
        assert!(rows
            .iter()
            .filter(|r| r.load == Load::Chat)
            .all(|r| r.connections == CONNECTIONS));
    }

    #[test]
    fn the_envoy_config_has_a_listener_per_row_with_its_filters_before_the_router() {
        let bare = config::bare(45678).unwrap();
        let rows = rows();
        let out = envoy_config(&bare, &rows).unwrap();
        let listeners = out["static_resources"]["listeners"].as_array().unwrap();
        assert_eq!(listeners.len(), rows.len());
        let mut vm_ids = Vec::new();
        for (i, (l, row)) in listeners.iter().zip(&rows).enumerate() {
            let first = vm_ids.len();
            assert_eq!(l["name"], listener_name(i));
            let filters = l
                .pointer("/filter_chains/0/filters/0/typed_config/http_filters")
                .unwrap()
                .as_array()
                .unwrap();
            assert_eq!(filters.len(), row.filters.len() + 1, "{}", row.name);
            assert_eq!(filters.last().unwrap()["name"], "envoy.filters.http.router");
            for (f, probe) in filters.iter().zip(&row.filters) {
                let wasm = &f["typed_config"]["config"];
                assert_eq!(wasm["configuration"]["value"], probe.to_string());
                assert_eq!(
                    wasm["vm_config"]["code"]["local"]["filename"],
                    "${WASM_DIR}/hostcost.wasm"
                );
                vm_ids.push(wasm["vm_config"]["vm_id"].as_str().unwrap().to_string());
                // one code, one runtime, no VM configuration: the vm_id alone decides
                assert_eq!(wasm["vm_config"]["runtime"], "envoy.wasm.runtime.v8");
                assert!(wasm["vm_config"].get("configuration").is_none());
                assert_eq!(wasm["root_id"], "hostcost");
            }
            let mut own = vm_ids[first..].to_vec();
            own.sort();
            own.dedup();
            let expected = if row.one_vm { 1 } else { row.filters.len() };
            assert_eq!(own.len(), expected, "{}: its VMs", row.name);
            // the rest of the listener is row B's
            let mut back = l.clone();
            back["name"] = bare["static_resources"]["listeners"][0]["name"].clone();
            back.pointer_mut("/filter_chains/0/filters/0/typed_config/http_filters")
                .unwrap()
                .as_array_mut()
                .unwrap()
                .retain(|f| f["name"] == "envoy.filters.http.router");
            assert_eq!(back, bare["static_resources"]["listeners"][0]);
        }
        vm_ids.sort();
        vm_ids.dedup();
        assert_eq!(
            vm_ids.len(),
            distinct_vms(&rows),
            "no VM shared across rows"
        );
        assert!(distinct_vms(&rows) < rows.iter().map(|r| r.filters.len()).sum::<usize>());
        assert_eq!(
            out["static_resources"]["clusters"],
            bare["static_resources"]["clusters"]
        );
    }

    fn run_with(cpu: &[(&str, f64)]) -> VersionRun {
        let rows = rows();
        VersionRun {
            version: EnvoyVersion::V140,
            build: "1.40.0".into(),
            series: rows
                .iter()
                .map(|r| {
                    cpu.iter()
                        .find(|(n, _)| *n == r.name)
                        .map(|(_, c)| Series {
                            cpu_us: vec![*c, c + 10.0, c - 10.0],
                            rps: vec![1000.0],
                            errors: 0,
                        })
                        .ok_or_else(|| "not run".to_string())
                })
                .collect(),
            failures: Vec::new(),
            vms: Some(7),
        }
    }

    #[test]
    fn per_unit_figures_are_differences_over_the_calls() {
        let rows = rows();
        let run = run_with(&[
            (BARE, 300.0),
            (NONE, 312.0),
            ("none ×5", 355.0),
            ("get_header", 712.0),
            ("get_header_absent", 372.0),
            ("replace_header", 512.0),
            ("log_info", 412.0),
            ("read_body ×1", 320.0),
            ("read_body", 358.0),
            ("floor", 350.0),
            (STREAM_BARE, 1000.0),
            (STREAM_NONE, 1400.0),
            ("stream read", 1800.0),
            ("stream floor", 1900.0),
            ("paced bare", 500.0),
            ("paced none", 1500.0),
            ("paced read", 2100.0),
            ("none ×5 one VM", 340.0),
            ("replace ×5", 380.0),
            ("replace ×5 one VM", 350.0),
            ("metrics", 332.0),
            ("record_histogram", 352.0),
            ("stream none ×5", 3000.0),
            ("stream none ×5 one VM", 2600.0),
            ("stream replace ×5", 5000.0),
            ("stream replace ×5 one VM", 4600.0),
            ("stream metrics", 1430.0),
        ]);
        let per = |name: &str| run.per_unit(&rows, rows.iter().find(|r| r.name == name).unwrap());
        assert_eq!(per(NONE), Some(12.0));
        assert_eq!(per("none ×5"), Some(11.0));
        assert_eq!(per("get_header"), Some(2.0));
        assert_eq!(per("get_header_absent"), Some(0.3));
        assert_eq!(per("log_info"), Some(5.0));
        assert_eq!(
            per("read_body"),
            Some(2.0),
            "over one read, per further read"
        );
        assert_eq!(per("stream read"), Some(4.0), "per event over bare");
        assert_eq!(per(BARE), None, "no reference");
        assert_eq!(per("set_property"), None, "a row not run has no figure");
        let model = CostModel::of(&run, &rows);
        assert_eq!(model.filter, Some(12.0));
        assert_eq!(model.filter_of_five, Some(11.0));
        assert_eq!(model.log_line, Some(5.0));
        assert_eq!(model.event_continue, [Some(2.0), Some(5.0)]);
        assert_eq!(
            model.event_read,
            [Some(2.0), Some(3.0)],
            "over the continue-only probe"
        );
        assert_eq!(model.event_replace, [None, None]);
        assert_eq!(model.floor, Some(50.0));
        assert_eq!(model.floor_event, [Some(4.5), None]);
        assert_eq!(model.filter_of_five_one_vm, Some(8.0));
        assert_eq!(per("replace ×5"), Some(5.0), "over five continue-only");
        assert_eq!(per("replace ×5 one VM"), Some(2.0), "over five in one VM");
        assert_eq!(per("stream metrics"), Some(2.15), "per event over bare");
        assert_eq!(model.extra_vm, [Some(3.75), Some(100.0)]);
        assert_eq!(model.frame_filter, [Some(5.0), Some(2.0)]);
        assert_eq!(model.frame_filter_one_vm, [Some(2.0), Some(2.0)]);
        assert_eq!(model.metrics_request, [Some(20.0), Some(30.0)]);
        assert_eq!(model.histogram_record, Some(0.2));
        let (m, lo, hi) = model.returns.unwrap();
        assert_eq!((m, lo, hi), (2.0, 2.0, 2.0));
        assert_eq!(model.cheap.map(|c| c.0), Some(0.3));
        assert_eq!(model.writes.map(|c| c.0), Some(1.0));
        let text = render(&["a header line".into()], &rows, &[run]);
        assert!(text.contains("- a header line"));
        assert!(text.contains("| get_header | "));
        assert!(text.contains("| 2.00 /200 |"), "{text}");
        assert!(text.contains("not run: not run"));
        assert!(text.contains("No host call of the probe failed"));
        assert!(text.contains("| **per extra VM**"));
        assert!(text.contains(" 3.75 / 100.00 |"), "{text}");
        assert!(text.contains(
            "| **per histogram record** (record_metric of a histogram defined once) | 0.20 |"
        ));
        assert!(text.contains("v8.active`, once every listener answered): 7;"));
    }

    #[test]
    fn a_paced_window_counts_its_requests_in_flight() {
        let rows = rows();
        let paced = rows.iter().find(|r| r.name == "paced read").unwrap();
        let chat = rows.iter().find(|r| r.name == "get_header").unwrap();
        assert_eq!(
            counted(paced, 300.0),
            300.0 + f64::from(PACED_CONNECTIONS) / 2.0
        );
        assert_eq!(counted(chat, 300.0), 300.0);
        assert_eq!(counted(chat, 0.0), 1.0, "no division by zero");
    }

    #[test]
    fn medians_take_the_middle_window() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(3.0));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn arguments_default_to_both_versions() {
        let args = Args::parse(&[]).unwrap();
        assert_eq!(args.versions, [EnvoyVersion::V140, EnvoyVersion::V136]);
        assert_eq!((args.window, args.rounds), (1, 3));
        let args = Args::parse(&[
            "--rounds".into(),
            "9".into(),
            "--envoy".into(),
            "1.36".into(),
        ])
        .unwrap();
        assert_eq!(
            (args.rounds, args.versions.as_slice()),
            (9, &[EnvoyVersion::V136][..])
        );
        assert!(Args::parse(&["--envoy".into(), "1.2".into()]).is_err());
        assert!(Args::parse(&["--rounds".into(), "0".into()]).is_err());
        assert!(Args::parse(&["--bogus".into()]).is_err());
    }
}
