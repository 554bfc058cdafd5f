//! The real Envoy (1.40, or 1.36.4: [`Options::version`]), started from a config template on
//! kernel-chosen loopback ports.
//!
//! A template from `envoy-config/` uses `${NAME}` placeholders; `Envoy::start` adds
//! `${WASM_DIR}` (the built plugins) and `${LOG_DIR}` (this instance's log folder) to the
//! caller's values. Listeners and the admin API bind port 0; the fixture learns the real
//! ports from the admin API once Envoy reports `LIVE`.

use crate::workspace::{self, render, EnvoyVersion, TempDir};
use crate::Result;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long Envoy may take to load the wasm modules and become `LIVE`.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How to run Envoy.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--concurrency`: worker threads, one wasm VM each.
    pub concurrency: u32,
    /// `--component-log-level wasm:trace`: every host call in the log (tests read it; it
    /// costs far more than the plugins themselves, so benchmarks turn it off).
    pub trace_wasm: bool,
    /// Which Envoy: [`EnvoyVersion::from_env`] unless the test names one.
    pub version: EnvoyVersion,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            concurrency: 2,
            trace_wasm: true,
            version: EnvoyVersion::from_env(),
        }
    }
}

/// A running Envoy; stopped (SIGTERM, then SIGKILL) on drop.
#[derive(Debug)]
pub struct Envoy {
    child: Child,
    version: EnvoyVersion,
    dir: TempDir,
    admin: SocketAddr,
    listeners: Vec<(String, SocketAddr)>,
}

impl Envoy {
    /// Renders `envoy-config/<template>` with `vars` and starts Envoy with `--concurrency 2`,
    /// logging every wasm host call (`wasm:trace`) so tests can read what plugins did.
    pub fn start(template: &str, vars: &[(&str, String)]) -> Result<Envoy> {
        Envoy::start_with(template, vars, &Options::default())
    }

    /// Like [`Envoy::start`] with chosen [`Options`].
    pub fn start_with(template: &str, vars: &[(&str, String)], options: &Options) -> Result<Envoy> {
        Envoy::start_with_log_level(template, vars, options, "info")
    }

    /// Like [`Envoy::start_with`] with Envoy's `--log-level` (`info` there; `scripts/bench`
    /// measures a chain at `warn`).
    pub fn start_with_log_level(
        template: &str,
        vars: &[(&str, String)],
        options: &Options,
        log_level: &str,
    ) -> Result<Envoy> {
        let dir = TempDir::new("envoy")?;
        let config = Envoy::render(template, vars, &dir)?;
        let config_path = dir.path().join("envoy.yaml");
        std::fs::write(&config_path, config).map_err(|e| e.to_string())?;
        let admin_path = dir.path().join("admin-address");
        let stderr =
            std::fs::File::create(dir.path().join("stderr.log")).map_err(|e| e.to_string())?;

        let child = Command::new(workspace::envoy_bin(options.version)?)
            .arg("-c")
            .arg(&config_path)
            .args(["--concurrency", &options.concurrency.to_string()])
            .arg("--disable-hot-restart")
            .arg("--admin-address-path")
            .arg(&admin_path)
            .args(["--log-level", log_level])
            .args(if options.trace_wasm {
                &["--component-log-level", "wasm:trace"][..]
            } else {
                &[]
            })
            // access logs reach their files within 100 ms instead of Envoy's default 10 s
            .args(["--file-flush-interval-msec", "100"])
            .arg("--log-path")
            .arg(dir.path().join("envoy.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot start envoy: {e}"))?;

        let mut envoy = Envoy {
            child,
            version: options.version,
            dir,
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            listeners: Vec::new(),
        };
        envoy.wait_live(&admin_path)?;
        Ok(envoy)
    }

    /// Renders a template the way [`Envoy::start`] would, into `dir`'s log folder.
    fn render(template: &str, vars: &[(&str, String)], dir: &TempDir) -> Result<String> {
        let path = workspace::envoy_config(template);
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        // the caller's values first: a caller may point WASM_DIR at another build
        let mut all: Vec<(&str, String)> = vars.to_vec();
        all.push(("WASM_DIR", workspace::wasm_dir().display().to_string()));
        all.push(("LOG_DIR", dir.path().display().to_string()));
        render(&text, &all)
    }

    /// Checks a template with `envoy --mode validate` (the plugins are loaded and configured)
    /// in the Envoy of [`EnvoyVersion::from_env`].
    pub fn validate(template: &str, vars: &[(&str, String)]) -> Result<()> {
        Envoy::validate_on(EnvoyVersion::from_env(), template, vars)
    }

    /// [`Envoy::validate`] in the Envoy of `version`.
    pub fn validate_on(
        version: EnvoyVersion,
        template: &str,
        vars: &[(&str, String)],
    ) -> Result<()> {
        let dir = TempDir::new("envoy-validate")?;
        let config = Envoy::render(template, vars, &dir)?;
        let config_path = dir.path().join("envoy.yaml");
        std::fs::write(&config_path, config).map_err(|e| e.to_string())?;
        let out = Command::new(workspace::envoy_bin(version)?)
            .args([
                "--mode",
                "validate",
                "--disable-hot-restart",
                "-l",
                "warn",
                "-c",
            ])
            .arg(&config_path)
            .output()
            .map_err(|e| format!("cannot run envoy: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "envoy --mode validate {template} failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    fn wait_live(&mut self, admin_path: &PathBuf) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                return Err(format!(
                    "envoy exited ({status}) while starting:\n{}",
                    self.logs()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "envoy not LIVE after {START_TIMEOUT:?}:\n{}",
                    self.logs()
                ));
            }
            if self.admin.port() == 0 {
                if let Ok(text) = std::fs::read_to_string(admin_path) {
                    if let Ok(addr) = text.trim().parse() {
                        self.admin = addr;
                    }
                }
            }
            if self.admin.port() != 0
                && self
                    .admin_get("/ready")
                    .is_ok_and(|body| body.trim() == "LIVE")
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let listeners: serde_json::Value =
            serde_json::from_str(&self.admin_get("/listeners?format=json")?)
                .map_err(|e| format!("admin /listeners: {e}"))?;
        for status in listeners["listener_statuses"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let name = status["name"].as_str().unwrap_or_default().to_string();
            let socket = &status["local_address"]["socket_address"];
            let ip = socket["address"].as_str().unwrap_or("127.0.0.1");
            let port = socket["port_value"].as_u64().unwrap_or(0);
            let addr = format!("{ip}:{port}")
                .parse()
                .map_err(|e| format!("listener {name}: {e}"))?;
            self.listeners.push((name, addr));
        }
        if self.listeners.is_empty() {
            return Err(format!("envoy has no listeners:\n{}", self.logs()));
        }
        Ok(())
    }

    /// Address of the listener called `name`.
    pub fn listener(&self, name: &str) -> Result<SocketAddr> {
        self.listeners
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, addr)| *addr)
            .ok_or_else(|| format!("no listener {name:?}; have {:?}", self.listeners))
    }

    /// `http://addr` of the first listener.
    pub fn url(&self) -> String {
        self.listeners
            .first()
            .map(|(_, addr)| format!("http://{addr}"))
            .unwrap_or_default()
    }

    /// The admin API address.
    pub fn admin(&self) -> SocketAddr {
        self.admin
    }

    /// The folder holding this instance's config and logs.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The first JSON line of the access log `file` (in [`Envoy::dir`]) for which `pick`
    /// returns something, waiting up to 15 s for Envoy's periodic flush; panics (with Envoy's
    /// logs) when none comes.
    pub async fn access_log_line<T>(
        &self,
        file: &str,
        what: &str,
        pick: impl Fn(serde_json::Value) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let text = std::fs::read_to_string(self.dir().join(file)).unwrap_or_default();
            if let Some(found) = text
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find_map(&pick)
            {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "no access-log line for {what}:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// GET on the admin API; the body of a 200 answer.
    pub fn admin_get(&self, path: &str) -> Result<String> {
        let mut stream = TcpStream::connect_timeout(&self.admin, Duration::from_secs(2))
            .map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"
        )
        .map_err(|e| e.to_string())?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or("admin answer without a head")?;
        if !head.starts_with("HTTP/1.1 200") {
            return Err(format!(
                "admin {path}: {}",
                head.lines().next().unwrap_or_default()
            ));
        }
        if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(body)
        } else {
            Ok(body.to_string())
        }
    }

    /// The value of a stat (`wasmcustom.llm_gateway.key_auth.allowed`), `None` if undefined.
    pub fn stat(&self, name: &str) -> Result<Option<u64>> {
        let body = self.admin_get(&format!("/stats?filter=^{}$", name.replace('.', "\\.")))?;
        Ok(body
            .lines()
            .filter_map(|line| line.split_once(": "))
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.trim().parse().ok()))
    }

    /// Everything Envoy wrote: its log, stderr, and any `*.log` the config writes to `${LOG_DIR}`.
    pub fn logs(&self) -> String {
        let mut all = String::new();
        if let Ok(entries) = std::fs::read_dir(self.dir.path()) {
            let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
            files.sort();
            for file in files
                .iter()
                .filter(|f| f.extension().is_some_and(|x| x == "log"))
            {
                if let Ok(text) = std::fs::read_to_string(file) {
                    all.push_str(&format!("==> {} <==\n{text}\n", file.display()));
                }
            }
        }
        all
    }

    /// Which Envoy this is.
    pub fn version(&self) -> EnvoyVersion {
        self.version
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True while the process runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        stop(&mut self.child);
        if std::thread::panicking() {
            eprintln!("--- envoy logs ---\n{}", self.logs());
        }
    }
}

/// Decodes an HTTP/1.1 chunked body.
fn dechunk(mut body: &str) -> Result<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").ok_or("truncated chunk size")?;
        let size =
            usize::from_str_radix(size.trim(), 16).map_err(|e| format!("chunk size: {e}"))?;
        if size == 0 {
            return Ok(out);
        }
        out.push_str(rest.get(..size).ok_or("truncated chunk")?);
        body = rest.get(size + 2..).ok_or("truncated chunk end")?;
    }
}

/// SIGTERM, wait up to 5 s, then SIGKILL.
#[allow(unsafe_code)]
pub(crate) fn stop(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: sends a signal to our own child process; no memory is involved.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}
