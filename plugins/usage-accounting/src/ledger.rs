//! The Redis stream ledger: one `XADD` per record, capped, sent through Higress's Redis calls
//! (`transport: "higress"`, the Higress build) or over HTTP to a webdis cluster
//! (`transport: "http"`, every build: `{"transport": "http", "cluster": "webdis",
//! "auth": "user:password"}`).
//!
//! ```text
//! XADD <stream> MAXLEN ~ <max_len> * record <record JSON>
//! ```
//! `MAXLEN ~` lets Redis trim lazily, by whole macro-nodes, so the cap costs nothing per call;
//! the stream keeps at least `max_len` entries. The entry id is the Redis clock, so `XRANGE`
//! by time works (`scripts/usage-report --redis` reads it that way, month by month). The key
//! has no hash tag: one stream is one key, on one Redis Cluster slot.
//!
//! The append is fire-and-forget from `on_log` (or the end of the response): the request is
//! never held for it, and a failed call is counted (`llm_gateway.usage.ledger_errors`) and
//! logged, the record still being in the access log and the log line.

use llm_gateway_shared::config::ConfigError;
use llm_gateway_shared::redis::{RedisConfig, RedisFields, TransportName};
use serde::Deserialize;
use serde_json::Value;

// the tests name the ledger's transport as its own
#[cfg(test)]
use llm_gateway_shared::redis::RedisTransport as LedgerTransport;

/// This build has Higress's Redis calls (cargo feature `higress`, which turns on
/// `shared::host::redis`). Without them a `ledger` over the Higress transport is refused
/// rather than silently dropped; the HTTP transport works in every build.
pub const TRANSPORT: bool = cfg!(feature = "higress");

/// Where the ledger goes: the shared Redis connection ([`RedisConfig`], whose fields read
/// through: `ledger.service`, `ledger.transport`) and the stream around it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerConfig {
    /// Service or webdis cluster, transport, credentials, timeout.
    pub redis: RedisConfig,
    /// Stream key.
    pub stream: String,
    /// Approximate cap on the stream's length.
    pub max_len: u64,
}

impl std::ops::Deref for LedgerConfig {
    type Target = RedisConfig;

    fn deref(&self) -> &RedisConfig {
        &self.redis
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLedger {
    #[serde(default)]
    transport: TransportName,
    #[serde(default)]
    service: Option<String>,
    #[serde(default)]
    cluster: Option<String>,
    #[serde(default)]
    auth: Option<String>,
    #[serde(default = "default_stream")]
    stream: String,
    #[serde(default = "default_max_len")]
    max_len: u64,
    #[serde(default = "default_timeout")]
    timeout_ms: u32,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

fn default_stream() -> String {
    "llm:usage".into()
}
fn default_max_len() -> u64 {
    1_000_000
}
fn default_timeout() -> u32 {
    500
}

/// Parses the `ledger` member (whether this build has its transport is the configuration's
/// check, `crate::config`).
pub fn parse_ledger(value: &Value) -> Result<LedgerConfig, ConfigError> {
    let raw: RawLedger = llm_gateway_shared::config::from_value("ledger", value.clone())?;
    let redis = RedisConfig::parse(
        "ledger",
        RedisFields {
            transport: raw.transport,
            service: raw.service,
            cluster: raw.cluster,
            auth: raw.auth,
            username: raw.username,
            password: raw.password,
            timeout_ms: raw.timeout_ms,
        },
    )?;
    if raw.stream.is_empty() || raw.stream.len() > 256 {
        return Err(ConfigError::new(
            "ledger.stream",
            "must be 1 to 256 characters",
        ));
    }
    if raw.max_len == 0 {
        return Err(ConfigError::new("ledger.max_len", "must be at least 1"));
    }
    Ok(LedgerConfig {
        redis,
        stream: raw.stream,
        max_len: raw.max_len,
    })
}

/// The arguments of the `XADD` that appends `record_json`.
pub fn xadd_args(config: &LedgerConfig, record_json: &str) -> Vec<Vec<u8>> {
    vec![
        b"XADD".to_vec(),
        config.stream.as_bytes().to_vec(),
        b"MAXLEN".to_vec(),
        b"~".to_vec(),
        config.max_len.to_string().into_bytes(),
        b"*".to_vec(),
        b"record".to_vec(),
        record_json.as_bytes().to_vec(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_and_command() {
        let c = parse_ledger(&json!({"service": "outbound|6379||redis.static"})).unwrap();
        assert_eq!(
            (c.stream.as_str(), c.max_len, c.timeout_ms),
            ("llm:usage", 1_000_000, 500)
        );
        let args = xadd_args(&c, "{}");
        let text: Vec<String> = args
            .iter()
            .map(|a| String::from_utf8(a.clone()).unwrap())
            .collect();
        assert_eq!(
            text,
            [
                "XADD",
                "llm:usage",
                "MAXLEN",
                "~",
                "1000000",
                "*",
                "record",
                "{}"
            ]
        );
    }

    #[test]
    fn over_http_to_webdis() {
        let c =
            parse_ledger(&json!({"transport": "http", "cluster": "webdis", "auth": "gw:s3cret"}))
                .unwrap();
        assert_eq!(c.service, "webdis");
        assert_eq!(
            c.transport,
            LedgerTransport::Http {
                authorization: Some("Basic Z3c6czNjcmV0".into())
            }
        );
        for (value, field) in [
            (json!({"transport": "http"}), "ledger.cluster"),
            (
                json!({"transport": "http", "cluster": "w", "auth": "pw"}),
                "ledger.auth",
            ),
            (
                json!({"transport": "http", "cluster": "w", "service": "s"}),
                "ledger.transport",
            ),
            (json!({"service": "s", "cluster": "w"}), "ledger.transport"),
            (
                json!({"transport": "tcp", "cluster": "w"}),
                "ledger.transport",
            ),
        ] {
            let err = parse_ledger(&value).unwrap_err();
            assert_eq!(err.field(), field, "{value}");
            assert!(!err.to_string().contains("pw"), "{err}");
        }
    }

    #[test]
    fn errors_name_the_field_and_hide_the_password() {
        for (value, field) in [
            (json!({"service": ""}), "ledger.service"),
            (json!({"service": "s", "max_len": 0}), "ledger.max_len"),
            (
                json!({"service": "s", "timeout_ms": 0}),
                "ledger.timeout_ms",
            ),
            (json!({"service": "s", "stream": ""}), "ledger.stream"),
            (json!({"stream": "x"}), "ledger.service"),
        ] {
            assert_eq!(parse_ledger(&value).unwrap_err().field(), field, "{value}");
        }
        let err = parse_ledger(&json!({"service": "s", "password": 5})).unwrap_err();
        assert_eq!(err.field(), "ledger.password");
        let err = parse_ledger(&json!({"service": "s", "max_len": "hunter2"})).unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
}
