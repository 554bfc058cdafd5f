//! The Redis stream ledger (Higress builds): one `XADD` per record, capped.
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

/// This build can append to Redis: the Higress build (cargo feature `higress`, which turns on
/// `shared::host::redis`). In a plain-Envoy build a configured `ledger` is refused rather than
/// silently dropped.
pub const TRANSPORT: bool = cfg!(feature = "higress");
use serde::Deserialize;
use serde_json::Value;

/// Where the ledger goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerConfig {
    /// Higress Redis service name, e.g. `outbound|6379||redis.static`.
    pub service: String,
    /// Stream key.
    pub stream: String,
    /// Approximate cap on the stream's length.
    pub max_len: u64,
    /// Redis call timeout.
    pub timeout_ms: u32,
    /// Redis ACL user, if any.
    pub username: Option<String>,
    /// Redis password, if any (never logged).
    pub password: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLedger {
    service: String,
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

/// Parses the `ledger` member.
pub fn parse_ledger(value: &Value) -> Result<LedgerConfig, ConfigError> {
    let raw: RawLedger = llm_gateway_shared::config::from_value("ledger", value.clone())?;
    if raw.service.is_empty() {
        return Err(ConfigError::new("ledger.service", "must not be empty"));
    }
    if raw.stream.is_empty() || raw.stream.len() > 256 {
        return Err(ConfigError::new(
            "ledger.stream",
            "must be 1 to 256 characters",
        ));
    }
    if raw.max_len == 0 {
        return Err(ConfigError::new("ledger.max_len", "must be at least 1"));
    }
    if !(1..=60_000).contains(&raw.timeout_ms) {
        return Err(ConfigError::new(
            "ledger.timeout_ms",
            "must be between 1 and 60000",
        ));
    }
    Ok(LedgerConfig {
        service: raw.service,
        stream: raw.stream,
        max_len: raw.max_len,
        timeout_ms: raw.timeout_ms,
        username: raw.username,
        password: raw.password,
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
    fn errors_name_the_field_and_hide_the_password() {
        for (value, field) in [
            (json!({"service": ""}), "ledger.service"),
            (json!({"service": "s", "max_len": 0}), "ledger.max_len"),
            (
                json!({"service": "s", "timeout_ms": 0}),
                "ledger.timeout_ms",
            ),
            (json!({"service": "s", "stream": ""}), "ledger.stream"),
            (json!({"stream": "x"}), "ledger"),
        ] {
            assert_eq!(parse_ledger(&value).unwrap_err().field(), field, "{value}");
        }
        let err = parse_ledger(&json!({"service": "s", "password": 5})).unwrap_err();
        assert_eq!(err.field(), "ledger.password");
        let err = parse_ledger(&json!({"service": "s", "max_len": "hunter2"})).unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
}
