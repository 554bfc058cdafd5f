//! The demo gateway: Envoy 1.40 with the whole chain (`envoy-config/gateway.yaml`: key-auth,
//! model-router, pii-redaction, usage-accounting, token-ratelimit) in front of three mock
//! providers (`openai`, `azure`, `anthropic`), all on loopback. `scripts/run` starts it through
//! the `demo-gateway` binary and prints [`Demo::walkthrough`]; the full-chain suites drive the
//! same code.
//!
//! The plain-Envoy builds keep rate limits and budgets per Envoy instance in shared data and
//! the usage ledger in the access log, so the demo needs no Redis (the Higress builds use it).

use crate::envoy::{Envoy, Options};
use crate::workspace::{EnvoyVersion, TempDir};
use crate::Result;
use mock_upstream::{Flavor, MockUpstream};
use std::net::SocketAddr;

/// The demo's virtual key: consumer `demo`, tenant `demo`, groups `fast`, `smart`, `claude`.
/// Published on purpose: `envoy-config/gateway.yaml` holds its SHA-256.
pub const DEMO_KEY: &str = "sk-llmgw-demo-key-not-a-secret";
/// A key of consumer `intern` (tenant `demo`) that may use the `fast` group only.
pub const FAST_ONLY_KEY: &str = "sk-llmgw-demo-fast-only-not-a-secret";
/// The Envoy bootstrap the demo runs (in `envoy-config/`).
pub const CONFIG: &str = "gateway.yaml";
/// The bootstrap for Envoy 1.36–1.38 (and the shape Higress 2.2.4 needs): the fallback is the
/// internal redirect.
pub const CONFIG_136: &str = "gateway-1.36.yaml";

/// The bootstrap the demo's Envoy takes in Envoy `version`: [`CONFIG_136`] in 1.36.4; the fused
/// build's (`gateway-fused.yaml`, [`crate::fused::CONFIG`]) under `LLM_GATEWAY_FORM=fused`
/// (set from outside, as `scripts/test` does; never by a test); else [`CONFIG`].
pub fn config_for(version: EnvoyVersion) -> &'static str {
    if version == EnvoyVersion::V136 {
        CONFIG_136
    } else if std::env::var("LLM_GATEWAY_FORM").is_ok_and(|form| form == "fused") {
        crate::fused::CONFIG
    } else {
        CONFIG
    }
}

/// [`config_for`] the Envoy of [`EnvoyVersion::from_env`].
pub fn config() -> &'static str {
    config_for(EnvoyVersion::from_env())
}

/// The fake provider credentials of `gateway.yaml`'s router config: what each mock provider
/// must receive, and what no client may ever see.
pub const OPENAI_CREDENTIAL: &str = "sk-demo-openai-provider-credential";
/// See [`OPENAI_CREDENTIAL`].
pub const AZURE_CREDENTIAL: &str = "demo-azure-provider-credential";
/// See [`OPENAI_CREDENTIAL`].
pub const ANTHROPIC_CREDENTIAL: &str = "sk-ant-demo-provider-credential";

/// A running demo; everything stops on drop.
#[derive(Debug)]
pub struct Demo {
    /// The Envoy gateway.
    pub envoy: Envoy,
    /// Cluster `openai`: deployments `openai-mini` (group `fast`), `openai-4o` (`smart`). Plays
    /// OpenAI ([`Flavor::Openai`]): a request in another provider's shape is refused as
    /// api.openai.com refuses it.
    pub openai: MockUpstream,
    /// Cluster `azure`: deployments `azure-mini`, `azure-4o` (the fallbacks). Plays Azure
    /// OpenAI ([`Flavor::Azure`]): `/openai/deployments/{deployment}/…?api-version=` and
    /// `api-key`, nothing else.
    pub azure: MockUpstream,
    /// Cluster `anthropic`: deployment `claude` (groups `claude` and `code`, `/v1/messages`). Plays
    /// Anthropic ([`Flavor::Anthropic`]): `x-api-key`, `anthropic-version` and Anthropic's
    /// Messages schema, refused in Anthropic's shape otherwise.
    pub anthropic: MockUpstream,
}

/// One step of the walkthrough `scripts/run` prints: a shell command and what it shows.
#[derive(Debug, Clone)]
pub struct Step {
    /// What the step demonstrates.
    pub title: &'static str,
    /// A ready-to-paste shell command (curl, or one of the repo's scripts).
    pub command: String,
    /// What to look for in its output.
    pub look_for: &'static str,
}

/// The variables `gateway.yaml` needs besides `${WASM_DIR}` and `${LOG_DIR}`.
pub fn vars(
    gateway_port: u16,
    openai: u16,
    azure: u16,
    anthropic: u16,
) -> Vec<(&'static str, String)> {
    vec![
        ("GATEWAY_PORT", gateway_port.to_string()),
        ("OPENAI_PORT", openai.to_string()),
        ("AZURE_PORT", azure.to_string()),
        ("ANTHROPIC_PORT", anthropic.to_string()),
    ]
}

/// A mock provider that serves its own API only and validates requests as that provider does
/// ([`Flavor`]): a request the gateway sent in the wrong shape fails as it would in production.
async fn mock(flavor: Flavor) -> Result<MockUpstream> {
    let addr: SocketAddr = "127.0.0.1:0".parse().map_err(|_| "bad address")?;
    MockUpstream::start_flavor(addr, flavor)
        .await
        .map_err(|e| format!("mock upstream: {e}"))
}

impl Demo {
    /// Starts everything in the Envoy of [`EnvoyVersion::from_env`]; the gateway listens on
    /// `127.0.0.1:port` (0: any free port).
    pub async fn start(port: u16) -> Result<Demo> {
        Demo::start_on(EnvoyVersion::from_env(), port).await
    }

    /// [`Demo::start`] in Envoy `version`, with its bootstrap ([`config_for`]).
    pub async fn start_on(version: EnvoyVersion, port: u16) -> Result<Demo> {
        Demo::launch(version, port, config_for(version)).await
    }

    /// [`Demo::start`] with another bootstrap: a name in `envoy-config/` or an absolute path
    /// (a test's variant of `gateway.yaml`).
    pub async fn start_with(port: u16, config: &str) -> Result<Demo> {
        Demo::launch(EnvoyVersion::from_env(), port, config).await
    }

    async fn launch(version: EnvoyVersion, port: u16, config: &str) -> Result<Demo> {
        let (openai, azure, anthropic) = (
            mock(Flavor::Openai).await?,
            mock(Flavor::Azure).await?,
            mock(Flavor::Anthropic).await?,
        );
        let vars = vars(
            port,
            openai.addr().port(),
            azure.addr().port(),
            anthropic.addr().port(),
        );
        let options = Options {
            concurrency: 2,
            trace_wasm: false,
            version,
        };
        let config = config.to_string();
        let envoy =
            tokio::task::spawn_blocking(move || Envoy::start_with(&config, &vars, &options))
                .await
                .map_err(|e| e.to_string())??;
        Ok(Demo {
            envoy,
            openai,
            azure,
            anthropic,
        })
    }

    /// The demo with `gateway.yaml` as shipped but for `changes`, each `(from, to)` a text
    /// replacement whose `from` must occur exactly once: a setting shortened or shrunk so a
    /// test sees its effect quickly. Panics (a test fixture) when a `from` does not occur once.
    /// In the Envoy of [`EnvoyVersion::from_env`].
    pub async fn start_variant(changes: &[(&str, &str)]) -> Result<Demo> {
        Demo::start_variant_on(EnvoyVersion::from_env(), changes).await
    }

    /// [`Demo::start_variant`] in Envoy `version`, of its bootstrap ([`config_for`]).
    pub async fn start_variant_on(version: EnvoyVersion, changes: &[(&str, &str)]) -> Result<Demo> {
        let name = config_for(version);
        let shipped = std::fs::read_to_string(crate::workspace::envoy_config(name))
            .map_err(|e| format!("{name}: {e}"))?;
        let mut text = shipped.clone();
        for (from, to) in changes {
            assert_eq!(shipped.matches(from).count(), 1, "{from} in {name}");
            text = text.replace(from, to);
        }
        // a folder of this test's own: tests of one process may start the same variant at once
        let dir = TempDir::new("variant")?;
        let path = dir.path().join(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        Demo::launch(version, 0, &path.to_string_lossy()).await
    }

    /// The usage record usage-accounting wrote into the access-log line of the request whose
    /// `x-request-id` is `request_id`, and that whole line (waits for the log to be flushed).
    pub async fn usage_record(&self, request_id: &str) -> (serde_json::Value, serde_json::Value) {
        self.envoy
            .access_log_line("access.log", request_id, |line| {
                if line["request_id"] != request_id {
                    return None;
                }
                let record = serde_json::from_str(line["usage"].as_str()?).ok()?;
                Some((record, line))
            })
            .await
    }

    /// `http://127.0.0.1:port` of the gateway.
    pub fn url(&self) -> String {
        self.envoy.url()
    }

    /// The access log: one JSON line per request, with usage-accounting's record in `usage`.
    pub fn access_log(&self) -> std::path::PathBuf {
        self.envoy.dir().join("access.log")
    }

    /// The mock provider behind a cluster name of `gateway.yaml`.
    pub fn provider(&self, cluster: &str) -> Option<&MockUpstream> {
        match cluster {
            "openai" => Some(&self.openai),
            "azure" => Some(&self.azure),
            "anthropic" => Some(&self.anthropic),
            _ => None,
        }
    }

    /// One line per request the mock providers received since the last call (the requests are
    /// then forgotten): what a provider sees of a request after the gateway. `demo-gateway`
    /// prints them as they come.
    pub fn drain_provider_lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (cluster, mock) in [
            ("openai", &self.openai),
            ("azure", &self.azure),
            ("anthropic", &self.anthropic),
        ] {
            let seen = mock.requests();
            mock.clear_requests();
            lines.extend(seen.iter().map(|r| provider_line(cluster, r)));
        }
        lines
    }

    /// The commands `scripts/run` prints, in order; `e2e demo::` runs every one of them.
    pub fn walkthrough(&self) -> Vec<Step> {
        let url = self.url();
        let chat = format!("curl -s {url}/v1/chat/completions");
        let json = "-H 'Content-Type: application/json'";
        let key = format!("-H 'Authorization: Bearer {DEMO_KEY}'");
        vec![
            Step {
                title: "Stream a chat completion: model group `fast` -> gpt-4o-mini at the `openai` deployment",
                command: format!(
                    "{chat} -N {key} {json} \\\n  -d '{{\"model\":\"fast\",\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'"
                ),
                look_for: "SSE chunks (data: {...}) ending with data: [DONE]",
            },
            Step {
                title: "An OpenAI client reaches Claude: the openai SDK's request for group `claude` -> claude-sonnet-4-5 at the `anthropic` deployment, translated both ways",
                command: format!(
                    "{chat} {key} {json} \\\n  -d '{{\"model\":\"claude\",\"messages\":[{{\"role\":\"system\",\"content\":\"Be brief.\"}},{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'"
                ),
                look_for: "an OpenAI chat.completion (choices, usage); the provider line shows POST /v1/messages with Anthropic's x-api-key",
            },
            Step {
                title: "The same request without a key is refused",
                command: format!(
                    "{chat} {json} \\\n  -d '{{\"model\":\"fast\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'"
                ),
                look_for: "401, an OpenAI-shaped error with \"code\":\"missing_api_key\"",
            },
            Step {
                title: "Personal data is masked for the provider and restored for you (x-mock-echo: the mock answers with what it received)",
                command: format!(
                    "{chat} {key} {json} -H 'x-mock-echo: 1' \\\n  -d '{{\"model\":\"fast\",\"messages\":[{{\"role\":\"user\",\"content\":\"Mail me at jane.doe@example.com\"}}]}}'"
                ),
                look_for: "your address in the answer; the provider line below this walkthrough shows [EMAIL_1]",
            },
            Step {
                title: "A key allowed only `fast` asks for `smart`",
                command: format!(
                    "{chat} -H 'Authorization: Bearer {FAST_ONLY_KEY}' {json} \\\n  -d '{{\"model\":\"smart\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'"
                ),
                look_for: "403, \"code\":\"model_not_allowed\"",
            },
            Step {
                title: "The models that key may use (the gateway's own answer, as `client.models.list()` reads it)",
                command: format!(
                    "curl -s {url}/v1/models -H 'Authorization: Bearer {FAST_ONLY_KEY}'"
                ),
                look_for: "{\"object\":\"list\",\"data\":[{\"id\":\"fast\",...}]}: `fast` alone",
            },
            Step {
                title: "Metrics (Envoy stats; Prometheus format at /stats/prometheus)",
                command: format!("curl -s 'http://{}/stats?filter=llm_gateway'", self.envoy.admin()),
                look_for: "wasmcustom.llm_gateway.* counters: keys allowed, routes, tokens, cost, limits",
            },
            Step {
                title: "Usage and spend per tenant / model group, from the access log (the plain-Envoy ledger)",
                command: format!("scripts/usage-report {}", self.access_log().display()),
                look_for: "a row for tenant demo with its tokens and cost",
            },
        ]
    }

    /// What `scripts/run` prints once everything is up.
    pub fn banner(&self) -> String {
        let mut out = format!(
            "llm-gateway demo is up\n\
             \x20 gateway    {} (Envoy {}; chain: key-auth -> model-router -> pii-redaction -> usage-accounting -> token-ratelimit)\n\
             \x20 providers  openai http://{}  azure http://{}  anthropic http://{} (mock LLM upstreams)\n\
             \x20 admin      http://{}\n\
             \x20 config     envoy-config/{} (rendered: {})\n\
             \x20 logs       {}\n\
             \x20 keys       {DEMO_KEY} (groups fast, smart, claude, code)\n\
             \x20            {FAST_ONLY_KEY} (group fast)\n",
            self.url(),
            self.envoy.version().name(),
            self.openai.addr(),
            self.azure.addr(),
            self.anthropic.addr(),
            self.envoy.admin(),
            config_for(self.envoy.version()),
            self.envoy.dir().join("envoy.yaml").display(),
            self.envoy.dir().display(),
        );
        for (i, step) in self.walkthrough().iter().enumerate() {
            out.push_str(&format!(
                "\n{}. {}\n\n{}\n\n   -> {}\n",
                i + 1,
                step.title,
                step.command,
                step.look_for
            ));
        }
        out.push_str(&crate::prometheus::monitoring_note(&[self
            .envoy
            .admin()
            .to_string()]));
        out.push_str(
            "\nAnthropic clients use the same gateway: POST /v1/messages with `x-api-key`, any group (an OpenAI deployment gets it translated).\n\
             Each request a provider receives is printed below. Ctrl-C stops everything.\n",
        );
        out
    }
}

/// `[openai] POST /v1/chat/completions model=gpt-4o-mini credential=Bearer sk-demo-… last user
/// message: "…"`: the demo shows the provider's view (a fixture's output, not the gateway's
/// logs: the gateway never logs prompts).
fn provider_line(cluster: &str, request: &mock_upstream::RecordedRequest) -> String {
    let body = request.json().unwrap_or_default();
    let model = body["model"].as_str().unwrap_or("?");
    let credential = request
        .header("authorization")
        .or_else(|| request.header("x-api-key"))
        .or_else(|| request.header("api-key"))
        .map_or("none".to_string(), |c| {
            let shown: String = c.chars().take(16).collect();
            format!("{shown}…")
        });
    let said = body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .map(|m| match &m["content"] {
            serde_json::Value::String(text) => text.clone(),
            other => other.to_string(),
        })
        .unwrap_or_default();
    format!(
        "[{cluster}] {} {} model={model} credential={credential} last user message: {said:?}",
        request.method, request.path
    )
}

/// The fleet bootstrap (`scripts/run --fleet`): [`CONFIG`] with limits, budgets and the usage
/// ledger in Redis over HTTP through webdis.
pub const FLEET_CONFIG: &str = "gateway-fleet.yaml";

/// The Redis stream of the usage ledger in [`FLEET_CONFIG`] (usage-accounting's default).
pub const FLEET_LEDGER: &str = "llm:usage";

/// A running fleet demo: two gateways ([`FLEET_CONFIG`]) sharing one Redis through one webdis,
/// in front of the same mock providers; everything stops on drop.
#[derive(Debug)]
pub struct FleetDemo {
    /// The gateways; the first listens on the requested port, the second on the next free one.
    pub gateways: Vec<Envoy>,
    /// The Redis that holds the fleet's buckets, budgets and ledger.
    pub redis: crate::redis::Redis,
    /// webdis in front of it (the ACL of `envoy-config/webdis.json`).
    pub webdis: crate::webdis::Webdis,
    /// The mock providers (clusters `openai`, `azure`, `anthropic`), flavored as [`Demo`]'s.
    pub providers: [MockUpstream; 3],
}

impl FleetDemo {
    /// Starts Redis, webdis, the mock providers and two gateways; the first on
    /// `127.0.0.1:port` (0: any free port).
    pub async fn start(port: u16) -> Result<FleetDemo> {
        let redis = crate::redis::Redis::start()?;
        let webdis = crate::webdis::Webdis::start(redis.addr())?;
        let providers = [
            mock(Flavor::Openai).await?,
            mock(Flavor::Azure).await?,
            mock(Flavor::Anthropic).await?,
        ];
        let options = Options {
            concurrency: 2,
            trace_wasm: false,
            ..Options::default()
        };
        let second = crate::redis::free_port()?;
        let mut gateways = Vec::new();
        for gateway_port in [port, second] {
            let mut vars = vars(
                gateway_port,
                providers[0].addr().port(),
                providers[1].addr().port(),
                providers[2].addr().port(),
            );
            vars.push(("WEBDIS_PORT", webdis.addr().port().to_string()));
            vars.push(("WEBDIS_AUTH", crate::webdis::AUTH.to_string()));
            let options = options.clone();
            let envoy = tokio::task::spawn_blocking(move || {
                Envoy::start_with(FLEET_CONFIG, &vars, &options)
            })
            .await
            .map_err(|e| e.to_string())??;
            gateways.push(envoy);
        }
        Ok(FleetDemo {
            gateways,
            redis,
            webdis,
            providers,
        })
    }

    /// What `scripts/run --fleet` prints.
    pub fn banner(&self) -> String {
        let mut out = format!(
            "llm-gateway fleet demo is up: two gateways, one budget\n\
             \x20 gateway 1  {}\n\
             \x20 gateway 2  {}\n\
             \x20 webdis     http://{} (Redis over HTTP; envoy-config/webdis.json)\n\
             \x20 redis      {}\n\
             \x20 config     envoy-config/{FLEET_CONFIG}\n\
             \x20 key        {DEMO_KEY}\n",
            self.gateways[0].url(),
            self.gateways[1].url(),
            self.webdis.addr(),
            self.redis.addr(),
        );
        let body = r#"{"model":"fast","messages":[{"role":"user","content":"hello fleet"}]}"#;
        for (i, gateway) in self.gateways.iter().enumerate() {
            out.push_str(&format!(
                "\n{}. a request through gateway {}:\n\ncurl -s {}/v1/chat/completions -H 'authorization: Bearer {DEMO_KEY}' -H 'content-type: application/json' -d '{body}' -D - -o /dev/null | grep -i x-llm-cost\n",
                i + 1,
                i + 1,
                gateway.url(),
            ));
        }
        out.push_str(&format!(
            "\n3. one budget for the fleet: what both gateways spent, in Redis (nano-USD, then tokens):\n\n\
             for k in $(redis-cli -p {port} --scan --pattern 'llm:*:bud:*'); do echo \"$k $(redis-cli -p {port} GET $k)\"; done\n\
             \n4. the usage ledger, one entry per request of either gateway:\n\n\
             redis-cli -p {port} XLEN {FLEET_LEDGER}\n",
            port = self.redis.addr().port()
        ));
        let admins: Vec<String> = self
            .gateways
            .iter()
            .map(|g| g.admin().to_string())
            .collect();
        out.push_str(&crate::prometheus::monitoring_note(&admins));
        out.push_str("\nCtrl-C stops everything.\n");
        out
    }
}
