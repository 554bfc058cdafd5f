//! Processes under measurement: CPU time and RSS from `/proc` (a process and its descendants),
//! CPU pinning, and the mock upstream's binary.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The CPU the proxies (Envoy, LiteLLM) run on.
pub const PROXY_CPU: &str = "0";
/// The CPU of the load generator and the mock upstream.
pub const LOAD_CPU: &str = "1";

/// `pid` and its descendants (from `/proc/*/stat`'s parent field).
pub fn tree(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some(parent) = stat_fields(child).and_then(|f| f.get(1)?.parse().ok()) {
                parents.push((child, parent));
            }
        }
    }
    let mut out = vec![pid];
    let mut i = 0;
    while let Some(&p) = out.get(i) {
        for (child, parent) in &parents {
            if *parent == p && !out.contains(child) {
                out.push(*child);
            }
        }
        i += 1;
    }
    out
}

/// The fields of `/proc/<pid>/stat` after the command name: state is index 0, ppid 1,
/// utime 11, stime 12.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(") ")?.1;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// CPU time (user + system, all threads) of `pid` and its descendants so far, in µs.
pub fn cpu_us(pid: u32) -> crate::Result<f64> {
    // SAFETY: sysconf has no preconditions.
    #[allow(unsafe_code)]
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let mut ticks = 0.0;
    for p in tree(pid) {
        let Some(fields) = stat_fields(p) else {
            continue; // exited meanwhile
        };
        let field = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
        ticks += field(11).ok_or("bad /proc stat")? + field(12).ok_or("bad /proc stat")?;
    }
    Ok(ticks * 1_000_000.0 / hz)
}

/// Resident set size of `pid` and its descendants, in bytes.
pub fn rss_bytes(pid: u32) -> crate::Result<u64> {
    let mut total = 0;
    for p in tree(pid) {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{p}/status")) else {
            continue;
        };
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        total += kib * 1024;
    }
    Ok(total)
}

/// Pins every thread of `pid` (and its descendants) to `cpu`; false when taskset failed.
pub fn pin(pid: u32, cpu: &str) -> bool {
    tree(pid).iter().all(|p| {
        Command::new("taskset")
            .args(["-a", "-p", "-c", cpu, &p.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// The `mock-upstream` binary (next to the running executable), one thread, on [`LOAD_CPU`].
pub struct MockProcess {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl MockProcess {
    /// Starts `bin` and waits for its `listening on` line.
    pub fn start(bin: &Path) -> crate::Result<MockProcess> {
        let mut child = Command::new("taskset")
            .args(["-c", LOAD_CPU])
            .arg(bin)
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

    /// `http://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for MockProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_and_rss() {
        let me = std::process::id();
        assert!(tree(me).contains(&me));
        let spin = std::time::Instant::now();
        while spin.elapsed() < std::time::Duration::from_millis(30) {}
        assert!(cpu_us(me).unwrap() > 0.0);
        assert!(rss_bytes(me).unwrap() > 1 << 20);
    }
}
