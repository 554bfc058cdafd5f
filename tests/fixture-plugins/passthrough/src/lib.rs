//! passthrough: the stand-in `scripts/bench` puts in place of one plugin of the chain (the
//! ablation rows, `tests/src/bench/config.rs`), not a product.
//!
//! Its HTTP context continues at every callback. In `on_http_request_headers` it may write,
//! once, what the plugin it stands in for would have written, so the rest of the chain does the
//! same work as behind that plugin: fixed request headers removed and set, fixed filter state
//! set (`wasm.<name>`), a fresh request id in one header, the route cache cleared (when the
//! filter state it sets steers the route's cluster). With an empty configuration (`{}` or
//! none) it makes no host call at all.
//!
//! Config: `{"remove_request_headers": ["authorization"],
//! "request_headers": [["x-llm-consumer", "demo"]], "properties": [["llm_try_0", "openai"]],
//! "request_id_header": "x-llm-request-id", "clear_route_cache": true}` (every member
//! optional).
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

#[cfg(target_arch = "wasm32")]
mod shell;

/// The configuration: what to write on the request headers.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Request headers removed first.
    #[serde(default)]
    pub remove_request_headers: Vec<String>,
    /// Request headers set (replacing any value), in order.
    #[serde(default)]
    pub request_headers: Vec<(String, String)>,
    /// Filter state set, `(property, value)`, in order.
    #[serde(default)]
    pub properties: Vec<(String, String)>,
    /// A request header set to a fresh id per request ([`request_id`]).
    #[serde(default)]
    pub request_id_header: Option<String>,
    /// Clear the route cache after the writes.
    #[serde(default)]
    pub clear_route_cache: bool,
}

impl Config {
    /// Parses a configuration; an empty document is the empty configuration.
    pub fn parse(document: &[u8]) -> Result<Config, String> {
        if document.iter().all(u8::is_ascii_whitespace) {
            return Ok(Config::default());
        }
        serde_json::from_slice(document).map_err(|e| format!("bad configuration: {e}"))
    }

    /// Writes nothing: every callback is a bare `Continue`.
    pub fn is_noop(&self) -> bool {
        self.remove_request_headers.is_empty()
            && self.request_headers.is_empty()
            && self.properties.is_empty()
            && self.request_id_header.is_none()
            && !self.clear_route_cache
    }
}

/// The id of the `n`-th request of a VM started at `start_nanos`: 32 hex digits, distinct per
/// request of a VM (and, in practice, across VMs).
pub fn request_id(start_nanos: u64, n: u64) -> String {
    format!("{start_nanos:016x}{n:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_configuration_writes_nothing() {
        for document in [&b""[..], b"  \n", b"{}"] {
            let config = Config::parse(document).unwrap();
            assert_eq!(config, Config::default());
            assert!(config.is_noop());
        }
    }

    #[test]
    fn a_full_configuration_is_read_in_order() {
        let config = Config::parse(
            br#"{"remove_request_headers": ["authorization"],
                "request_headers": [["x-llm-consumer", "demo"], ["x-llm-tenant", "demo"]],
                "properties": [["llm_try_0", "openai"]],
                "request_id_header": "x-llm-request-id", "clear_route_cache": true}"#,
        )
        .unwrap();
        assert!(!config.is_noop());
        assert_eq!(config.remove_request_headers, ["authorization"]);
        assert_eq!(
            config.request_headers,
            [
                ("x-llm-consumer".to_string(), "demo".to_string()),
                ("x-llm-tenant".to_string(), "demo".to_string())
            ]
        );
        assert_eq!(
            config.properties,
            [("llm_try_0".to_string(), "openai".to_string())]
        );
        assert_eq!(
            config.request_id_header.as_deref(),
            Some("x-llm-request-id")
        );
        assert!(config.clear_route_cache);
        // one member alone is enough to make it write
        assert!(!Config::parse(br#"{"clear_route_cache": true}"#)
            .unwrap()
            .is_noop());
    }

    #[test]
    fn a_bad_configuration_is_refused() {
        for document in [
            &br#"{"request_header": []}"#[..],
            br#"{"request_headers": [["only-a-name"]]}"#,
            br#"{"properties": {"a": "b"}}"#,
            b"not json",
        ] {
            assert!(Config::parse(document).is_err(), "{document:?}");
        }
    }

    #[test]
    fn request_ids_differ_per_request() {
        let a = request_id(0x1234, 0);
        let b = request_id(0x1234, 1);
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert_eq!(b, "00000000000012340000000000000001");
    }
}
