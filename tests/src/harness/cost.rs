//! Cost accounting: for every callback into a plugin, the host calls it made, the bytes that
//! crossed the boundary each way, and the wasm fuel it burnt (wasmtime's instruction-ish unit:
//! comparable between runs and builds of the same plugin, unlike wall-clock time), and its
//! wall-clock time for throughput figures.

/// Counters of the callback running now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Host functions called.
    pub host_calls: u64,
    /// Bytes the host copied into the VM (headers, bodies, properties it returned).
    pub bytes_in: u64,
    /// Bytes the host read out of the VM (arguments: names, values, bodies it was given).
    pub bytes_out: u64,
}

/// The cost of one callback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallCost {
    /// Order of the callback in the process (costs sort by it).
    pub seq: u64,
    /// Plugin name.
    pub plugin: String,
    /// Gateway instance index.
    pub instance: usize,
    /// Worker index.
    pub worker: usize,
    /// Chain index of the filter.
    pub filter: usize,
    /// The export called (`proxy_on_request_headers`, ...).
    pub callback: &'static str,
    /// The fleet-wide stream id, for HTTP-context callbacks.
    pub stream: Option<u64>,
    /// Fuel consumed (0 when the engine's fuel metering is off, see
    /// [`super::engine::disable_fuel_metering`]).
    pub fuel: u64,
    /// Host calls, bytes in and out.
    pub counters: Counters,
    /// Wall-clock time of the call, host functions included. A figure to report, never to
    /// assert on: it depends on the machine and its load.
    pub wall: std::time::Duration,
}

/// The next callback sequence number.
pub(crate) fn next_seq() -> u64 {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Totals over some callbacks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Callbacks.
    pub callbacks: u64,
    /// Fuel.
    pub fuel: u64,
    /// Host calls.
    pub host_calls: u64,
    /// Bytes into the VMs.
    pub bytes_in: u64,
    /// Bytes out of the VMs.
    pub bytes_out: u64,
}

impl Totals {
    /// Sums `costs`.
    pub fn of<'a>(costs: impl IntoIterator<Item = &'a CallCost>) -> Totals {
        costs.into_iter().fold(Totals::default(), |mut t, c| {
            t.callbacks += 1;
            t.fuel += c.fuel;
            t.host_calls += c.counters.host_calls;
            t.bytes_in += c.counters.bytes_in;
            t.bytes_out += c.counters.bytes_out;
            t
        })
    }
}

/// Totals per plugin, in first-seen order.
pub fn by_plugin(costs: &[CallCost]) -> Vec<(String, Totals)> {
    let mut out: Vec<(String, Totals)> = Vec::new();
    for c in costs {
        let i = match out.iter().position(|(p, _)| *p == c.plugin) {
            Some(i) => i,
            None => {
                out.push((c.plugin.clone(), Totals::default()));
                out.len() - 1
            }
        };
        let t = Totals::of([c]);
        let entry = &mut out[i].1;
        entry.callbacks += t.callbacks;
        entry.fuel += t.fuel;
        entry.host_calls += t.host_calls;
        entry.bytes_in += t.bytes_in;
        entry.bytes_out += t.bytes_out;
    }
    out
}

/// A markdown table of `costs` per plugin and callback: calls, and per call the mean fuel,
/// host calls, bytes in and bytes out. `per` divides the totals column (requests, say).
pub fn table(costs: &[CallCost], per: u64) -> String {
    let mut rows: Vec<(String, &'static str, Totals)> = Vec::new();
    for c in costs {
        let i = match rows
            .iter()
            .position(|(p, cb, _)| *p == c.plugin && *cb == c.callback)
        {
            Some(i) => i,
            None => {
                rows.push((c.plugin.clone(), c.callback, Totals::default()));
                rows.len() - 1
            }
        };
        let t = &mut rows[i].2;
        t.callbacks += 1;
        t.fuel += c.fuel;
        t.host_calls += c.counters.host_calls;
        t.bytes_in += c.counters.bytes_in;
        t.bytes_out += c.counters.bytes_out;
    }
    let per = per.max(1);
    let mut out = String::from(
        "| plugin | callback | calls | fuel/call | host calls/call | bytes in/call | bytes out/call | fuel per unit |\n|---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for (plugin, callback, t) in &rows {
        let n = t.callbacks.max(1);
        out.push_str(&format!(
            "| {plugin} | {callback} | {} | {} | {:.1} | {:.1} | {:.1} | {} |\n",
            t.callbacks,
            t.fuel / n,
            t.host_calls as f64 / n as f64,
            t.bytes_in as f64 / n as f64,
            t.bytes_out as f64 / n as f64,
            t.fuel / per,
        ));
    }
    let all = Totals::of(costs);
    out.push_str(&format!(
        "| **all** | | {} | | {:.1} per unit | {:.1} per unit | {:.1} per unit | {} |\n",
        all.callbacks,
        all.host_calls as f64 / per as f64,
        all.bytes_in as f64 / per as f64,
        all.bytes_out as f64 / per as f64,
        all.fuel / per,
    ));
    out
}
