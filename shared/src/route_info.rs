//! What the model router publishes about the deployment that serves a request.
//!
//! Prices belong to deployments: the router's deployment config carries each deployment's
//! price and `price_version`, and the router publishes them with the deployment and the model
//! group in Envoy filter state, where token-ratelimit (money budgets) and usage-accounting
//! (cost) read them. The router writes it twice: when it forwards the request (the first
//! choice, which is what a pre-deduct must price), and again when the response headers arrive
//! (the deployment that actually answered, after any fallback).
//!
//! * property: [`PROPERTY`] (`llm_route`); a filter reads it with
//!   `get_property(["llm_route"])`, Envoy keeps it as filter state `wasm.llm_route`, and an
//!   access log prints it with `%FILTER_STATE(wasm.llm_route:PLAIN)%`;
//! * value: one JSON object, [`RouteInfo`], e.g.
//!   `{"request_id":"…","model_group":"fast","deployment":"openai-mini","model":"gpt-4o-mini",
//!   "provider":"openai","price":{"currency":"USD","input":150000,"output":600000},
//!   "price_version":"2026-01","route_version":"v7","attempts":1}`.
//!
//! Prices are integers: micro-units of `currency` per one million tokens (so `150000` is
//! $0.15 per 1M tokens). Absent members are omitted.

use crate::config::ConfigError;
use serde::{Deserialize, Serialize};

/// The property name (filter state `wasm.llm_route`).
pub const PROPERTY: &str = "llm_route";

/// A deployment's price: micro-units of `currency` per one million tokens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// ISO 4217 code; default `USD`.
    #[serde(default = "usd")]
    pub currency: String,
    /// Prompt (input) tokens.
    pub input: u64,
    /// Completion (output) tokens, reasoning included.
    pub output: u64,
    /// Prompt tokens served from the provider's cache; absent: priced as `input`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<u64>,
}

fn usd() -> String {
    "USD".to_string()
}

impl Price {
    /// Checks the currency code.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.currency.len() != 3 || !self.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(ConfigError::new(
                "currency",
                "must be a three-letter ISO 4217 code",
            ));
        }
        Ok(())
    }
}

/// The published record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteInfo {
    /// The logical request id (`x-llm-request-id`), the same on every attempt.
    pub request_id: String,
    /// The group the client named.
    pub model_group: String,
    /// The deployment (first choice before the response; the one that answered after).
    pub deployment: String,
    /// The provider's model name sent upstream.
    pub model: String,
    /// `openai`, `anthropic` or `openai-compatible`.
    pub provider: String,
    /// The deployment's price, if configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
    /// The price's version, if configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_version: Option<String>,
    /// The router configuration's `version`.
    pub route_version: String,
    /// Attempts made so far (1 before the response; the final count after).
    pub attempts: u32,
    /// The deployment of every attempt, in order (the last is `deployment`); published by the
    /// router with the response, empty before it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tried: Vec<String>,
}

impl RouteInfo {
    /// The JSON bytes to publish.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads a published record; `None` if it is not one.
    pub fn from_json(bytes: &[u8]) -> Option<RouteInfo> {
        serde_json::from_slice(bytes).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn round_trips_and_omits_absent_members() {
        let info = RouteInfo {
            request_id: "r1".into(),
            model_group: "fast".into(),
            deployment: "openai-mini".into(),
            model: "gpt-4o-mini".into(),
            provider: "openai".into(),
            price: None,
            price_version: None,
            route_version: "v7".into(),
            attempts: 1,
            tried: Vec::new(),
        };
        let json = String::from_utf8(info.to_json()).unwrap();
        assert!(!json.contains("price"), "{json}");
        assert_eq!(RouteInfo::from_json(json.as_bytes()), Some(info));
    }

    #[test]
    fn price_defaults_to_usd_and_checks_the_code() {
        let price: Price = serde_json::from_str(r#"{"input":1,"output":2}"#).unwrap();
        assert_eq!(price.currency, "USD");
        assert!(price.validate().is_ok());
        let bad: Price =
            serde_json::from_str(r#"{"currency":"usd","input":1,"output":2}"#).unwrap();
        assert_eq!(bad.validate().unwrap_err().field(), "currency");
    }
}
