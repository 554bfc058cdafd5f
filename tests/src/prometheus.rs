//! A real Prometheus (Debian package `prometheus`, installed by `scripts/setup`) on a free
//! loopback port, with its configuration and storage in a temporary folder, scraping Envoy
//! admin endpoints' `/stats/prometheus` every second and evaluating a rules file every second.
//! Stopped on drop.

use crate::workspace::TempDir;
use crate::Result;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running Prometheus.
#[derive(Debug)]
pub struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: TempDir,
}

/// `prometheus.yml` scraping `targets` (`host:port` of Envoy admin endpoints) at
/// `/stats/prometheus` every `interval`, with `rules` (a file name, relative to the config's
/// folder) as its only rule file. `scripts/run` prints the same shape.
pub fn scrape_config(targets: &[String], interval: &str, rules: Option<&str>) -> String {
    let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    let mut config = format!(
        "global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n\
         scrape_configs:\n- job_name: llm-gateway\n  metrics_path: /stats/prometheus\n\
         \x20 static_configs:\n  - targets: [{}]\n",
        targets.join(", ")
    );
    if let Some(rules) = rules {
        config.push_str(&format!("rule_files:\n- {rules}\n"));
    }
    config
}

/// What `scripts/run` prints about monitoring the gateways whose admin addresses are `admins`:
/// the Prometheus scrape config and how to import the dashboard.
pub fn monitoring_note(admins: &[String]) -> String {
    format!(
        "\nMonitoring: Prometheus scrapes each gateway's admin endpoint (prometheus.yml):\n\n{}\n\
         Grafana: Dashboards -> New -> Import -> upload observability/grafana-dashboard.json, then pick\n\
         the Prometheus data source in its \"Prometheus\" variable. Panels and alerts:\n\
         docs/operator-guide.md, \"Dashboard and alerts\".\n",
        scrape_config(admins, "15s", Some("observability/alerts.yaml"))
    )
}

/// `%XX`-encodes everything but unreserved characters (a query string value).
pub fn url_encode(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

impl Prometheus {
    /// Starts `prometheus` scraping `targets` every second, with `rules` (the text of a
    /// rules file) evaluated every second; waits until it is ready and has scraped every
    /// target once.
    pub async fn start(targets: &[String], rules: &str) -> Result<Prometheus> {
        let dir = TempDir::new("prometheus")?;
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
        };
        write("rules.yaml", rules)?;
        write(
            "prometheus.yml",
            &scrape_config(targets, "1s", Some("rules.yaml")),
        )?;
        let port = crate::redis::free_port()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let log = std::fs::File::create(dir.path().join("prometheus.log"))
            .map_err(|e| format!("prometheus.log: {e}"))?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| {
                format!("prometheus (apt-get install prometheus, or scripts/setup): {e}")
            })?;
        let mut prometheus = Prometheus { child, addr, dir };
        prometheus.wait_ready(targets.len()).await?;
        Ok(prometheus)
    }

    async fn wait_ready(&mut self, targets: usize) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("prometheus exited: {status}\n{}", self.log()));
            }
            if let Ok(up) = self.query("up").await {
                let scraped = up
                    .as_array()
                    .map_or(0, |v| v.iter().filter(|s| s["value"][1] == "1").count());
                if scraped == targets {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "prometheus did not scrape its targets\n{}",
                    self.log()
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `http://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The folder holding its config, rules, storage and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// GET `/api/v1/<path>`: `data` of a `success` answer, else the error.
    pub async fn api(&self, path: &str) -> Result<Value> {
        let response = crate::http::get(format!("{}/api/v1/{path}", self.url()))
            .send()
            .await?;
        let body = response.json()?;
        if body["status"] != "success" {
            return Err(format!("{path}: {body}"));
        }
        Ok(body["data"].clone())
    }

    /// An instant query's result vector (`data.result`).
    pub async fn query(&self, expr: &str) -> Result<Value> {
        let data = self
            .api(&format!("query?query={}", url_encode(expr)))
            .await?;
        Ok(data["result"].clone())
    }

    /// The value of a query whose result is one sample (`sum(...)`), `None` when empty.
    pub async fn scalar(&self, expr: &str) -> Result<Option<f64>> {
        let result = self.query(expr).await?;
        Ok(result
            .as_array()
            .and_then(|v| v.first())
            .and_then(|s| s["value"][1].as_str())
            .and_then(|v| v.parse().ok()))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        crate::envoy::stop(&mut self.child);
    }
}
