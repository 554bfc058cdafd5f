//! The demo gateway: Envoy with the plugin chain as far as it exists, a real Redis, and the
//! mock upstream, on loopback. `scripts/run` starts it through the `demo-gateway` binary; an
//! end-to-end test drives the same code.

use crate::envoy::Envoy;
use crate::redis::Redis;
use crate::Result;
use mock_upstream::MockUpstream;

/// The demo's virtual key. Published on purpose: `envoy-config/demo.yaml` holds its SHA-256.
pub const DEMO_KEY: &str = "sk-llmgw-demo-key-not-a-secret";

/// A running demo; everything stops on drop.
#[derive(Debug)]
pub struct Demo {
    /// The Envoy gateway.
    pub envoy: Envoy,
    /// Redis (used by the rate-limit and budget plugins once they are in the chain).
    pub redis: Redis,
    /// The mock LLM upstream.
    pub upstream: MockUpstream,
}

impl Demo {
    /// Starts everything; the gateway listens on `127.0.0.1:port` (0: any free port).
    pub async fn start(port: u16) -> Result<Demo> {
        let upstream = MockUpstream::start("127.0.0.1:0".parse().map_err(|_| "bad address")?)
            .await
            .map_err(|e| format!("mock upstream: {e}"))?;
        let vars = vec![
            ("GATEWAY_PORT", port.to_string()),
            ("MOCK_PORT", upstream.addr().port().to_string()),
        ];
        let (envoy, redis) = tokio::task::spawn_blocking(move || -> Result<(Envoy, Redis)> {
            let redis = Redis::start()?;
            let envoy = Envoy::start("demo.yaml", &vars)?;
            Ok((envoy, redis))
        })
        .await
        .map_err(|e| e.to_string())??;
        Ok(Demo {
            envoy,
            redis,
            upstream,
        })
    }

    /// `http://127.0.0.1:port` of the gateway.
    pub fn url(&self) -> String {
        self.envoy.url()
    }

    /// The ready-to-paste curl, with the demo key or without it.
    pub fn curl(&self, with_key: bool) -> String {
        let auth = if with_key {
            format!(" \\\n  -H 'Authorization: Bearer {DEMO_KEY}'")
        } else {
            String::new()
        };
        format!(
            "curl -s {}/v1/chat/completions{auth} \\\n  -H 'Content-Type: application/json' \\\n  -d '{{\"model\":\"fast\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'",
            self.url()
        )
    }

    /// What `scripts/run` prints once everything is up.
    pub fn banner(&self) -> String {
        format!(
            "llm-gateway demo is up\n\
             \x20 gateway   {} (Envoy 1.40, chain: key-auth)\n\
             \x20 upstream  http://{} (mock OpenAI / Anthropic)\n\
             \x20 redis     {}\n\
             \x20 admin     http://{} (stats: /stats?filter=llm_gateway)\n\
             \x20 logs      {}\n\n\
             Try it (answers with a mock completion):\n\n{}\n\n\
             The same request without the key is refused with 401:\n\n{}\n\n\
             Ctrl-C stops everything.",
            self.url(),
            self.upstream.addr(),
            self.redis.addr(),
            self.envoy.admin(),
            self.envoy.dir().display(),
            self.curl(true),
            self.curl(false),
        )
    }
}
