//! Row D: the LiteLLM proxy, installed into its own venv (`.venv-litellm`, PyPI
//! `litellm[proxy]` at [`VERSION`]) and run with `tests/bench/litellm.yaml`: one worker, no
//! database, a master key, pinned to the proxies' CPU. Every failure is a sentence for the
//! report (the other rows still run).

use super::procs;
use crate::workspace;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The pinned LiteLLM release (not 1.82.7 / 1.82.8, the compromised ones; the issue's
/// reference figures were measured with this one).
pub const VERSION: &str = "1.108.7";
/// The proxy's master key (the clients' bearer token).
pub const MASTER_KEY: &str = "sk-bench-litellm-master-key";
/// The model group of the streaming workload (adds `x-mock-chunks: 200`).
pub const STREAM_MODEL: &str = "fast-sse200";
/// How long LiteLLM may take to answer its liveness probe.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// The venv.
pub fn venv() -> PathBuf {
    workspace::root().join(".venv-litellm")
}

fn installed_version() -> Option<String> {
    let out = Command::new(venv().join("bin/python"))
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('litellm'))",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Installs `litellm[proxy]==VERSION` into [`venv`] unless it is there; the installer's
/// last lines on failure.
pub fn install(log: &std::path::Path) -> crate::Result<()> {
    if installed_version().as_deref() == Some(VERSION) {
        return Ok(());
    }
    let tail = |out: &std::process::Output| {
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let _ = std::fs::write(log, &text);
        let lines: Vec<&str> = text.lines().rev().take(3).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" / ")
    };
    if !venv().join("bin/pip").is_file() {
        let out = Command::new("python3")
            .args(["-m", "venv"])
            .arg(venv())
            .output()
            .map_err(|e| format!("python3 -m venv: {e}"))?;
        if !out.status.success() {
            return Err(format!("python3 -m venv failed: {}", tail(&out)));
        }
    }
    eprintln!(
        "installing litellm[proxy]=={VERSION} into {}",
        venv().display()
    );
    let out = Command::new(venv().join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .arg(format!("litellm[proxy]=={VERSION}"))
        .output()
        .map_err(|e| format!("pip: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "pip install litellm[proxy]=={VERSION} failed: {} (full log: {})",
            tail(&out),
            log.display()
        ));
    }
    match installed_version() {
        Some(v) if v == VERSION => Ok(()),
        other => Err(format!(
            "after pip install, litellm's version is {other:?}, not {VERSION}"
        )),
    }
}

/// A running LiteLLM proxy; killed (with its children) on drop.
pub struct LiteLlm {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl LiteLlm {
    /// Starts the proxy in front of `mock_url`, pinned to [`procs::PROXY_CPU`], and waits for
    /// its liveness probe.
    pub fn start(mock_url: &str, dir: &std::path::Path) -> crate::Result<LiteLlm> {
        let template = workspace::root().join("tests/bench/litellm.yaml");
        let text = std::fs::read_to_string(&template)
            .map_err(|e| format!("{}: {e}", template.display()))?;
        let config = workspace::render(
            &text,
            &[
                ("MOCK_URL", mock_url.to_string()),
                ("MASTER_KEY", MASTER_KEY.to_string()),
            ],
        )?;
        let config_path = dir.join("litellm.yaml");
        std::fs::write(&config_path, config).map_err(|e| e.to_string())?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let log = dir.join("litellm.log");
        let out = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new("taskset")
            .args(["-c", procs::PROXY_CPU])
            .arg(venv().join("bin/litellm"))
            .arg("--config")
            .arg(&config_path)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--num_workers", "1"])
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            .env("LITELLM_LOG", "ERROR")
            .env("LITELLM_TELEMETRY", "False")
            .env("NO_DOCS", "True")
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start litellm: {e}"))?;
        let mut proxy = LiteLlm { child, port, log };
        proxy.wait_live()?;
        Ok(proxy)
    }

    fn wait_live(&mut self) -> crate::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "litellm exited ({status}) while starting: {}",
                    self.log_tail()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "litellm not live after {START_TIMEOUT:?}: {}",
                    self.log_tail()
                ));
            }
            if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                use std::io::{Read, Write};
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let probe =
                    "GET /health/liveliness HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
                let mut answer = String::new();
                if stream.write_all(probe.as_bytes()).is_ok()
                    && stream.read_to_string(&mut answer).is_ok()
                    && answer.starts_with("HTTP/1.1 200")
                {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().rev().take(5).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" / ")
    }

    /// `http://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The pid (of `taskset`'s exec: the litellm process itself).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for LiteLlm {
    fn drop(&mut self) {
        // its children first (a uvicorn worker, if any), then the proxy
        let children: Vec<String> = procs::tree(self.child.id())
            .into_iter()
            .skip(1)
            .map(|p| p.to_string())
            .collect();
        if !children.is_empty() {
            let _ = Command::new("kill").arg("-9").args(&children).status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
