//! What the model router publishes about the deployment that serves a request.
//!
//! Prices belong to deployments: the router's deployment config carries each deployment's
//! price and `price_version`, and the router publishes them with the deployment and the model
//! group in Envoy filter state, where token-ratelimit (money budgets) and usage-accounting
//! (cost) read them. The router writes it twice: when it forwards the request (the first
//! choice), and again when the response headers arrive (the deployment that actually
//! answered, after any fallback). Both carry `price_ceiling`, the element-wise maximum price
//! of every deployment the request may try: that, not the first choice's `price`, is what a
//! pre-deduct must price, since a fallback may go to a dearer deployment.
//!
//! * property: [`PROPERTY`] (`llm_route`); a filter reads it with
//!   `get_property(["llm_route"])`, Envoy keeps it as filter state `wasm.llm_route`, and an
//!   access log prints it with `%FILTER_STATE(wasm.llm_route:PLAIN)%`;
//! * value: one JSON object, [`RouteInfo`], e.g.
//!   `{"request_id":"…","model_group":"fast","deployment":"openai-mini","model":"gpt-4o-mini",
//!   "provider":"openai","price":{"currency":"USD","input":150000,"output":600000},
//!   "price_version":"2026-01","route_version":"v7","attempts":1,
//!   "price_ceiling":{"currency":"USD","input":150000,"output":600000}}`.
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

    /// What a cached prompt token costs: `cached_input`, else `input`.
    pub fn effective_cached_input(&self) -> u64 {
        self.cached_input.unwrap_or(self.input)
    }

    /// The element-wise maximum of `prices` (input, output, cached input): a price no
    /// deployment among them exceeds in any member. `None` if there is no price, any is `None`
    /// (an unpriced deployment has no ceiling), or the currencies differ.
    ///
    /// `cached_input` is the maximum of each price's effective cached price; it stays `None`
    /// (priced as `input`) only when every price leaves it so.
    pub fn ceiling<'a>(prices: impl IntoIterator<Item = Option<&'a Price>>) -> Option<Price> {
        let mut ceiling: Option<Price> = None;
        for price in prices {
            let price = price?;
            ceiling = Some(match ceiling {
                None => price.clone(),
                Some(c) => {
                    if c.currency != price.currency {
                        return None;
                    }
                    let cached_input = match (c.cached_input, price.cached_input) {
                        (None, None) => None,
                        _ => Some(
                            c.effective_cached_input()
                                .max(price.effective_cached_input()),
                        ),
                    };
                    Price {
                        currency: c.currency,
                        input: c.input.max(price.input),
                        output: c.output.max(price.output),
                        cached_input,
                    }
                }
            });
        }
        ceiling
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
    /// [`Price::ceiling`] of every deployment in the plan (all the attempts the request may
    /// take): what a money budget must reserve so that no fallback can overspend it. Absent
    /// if a deployment of the plan has no price or the currencies differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_ceiling: Option<Price>,
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
            price_ceiling: None,
        };
        let json = String::from_utf8(info.to_json()).unwrap();
        assert!(!json.contains("price"), "{json}");
        assert_eq!(RouteInfo::from_json(json.as_bytes()), Some(info.clone()));

        let ceiling = Some(price("USD", 1, 2, None));
        let priced = RouteInfo {
            price_ceiling: ceiling.clone(),
            ..info
        };
        let json = String::from_utf8(priced.to_json()).unwrap();
        assert!(
            json.contains(r#""price_ceiling":{"currency":"USD","input":1,"output":2}"#),
            "{json}"
        );
        assert_eq!(RouteInfo::from_json(json.as_bytes()), Some(priced));
    }

    fn price(currency: &str, input: u64, output: u64, cached_input: Option<u64>) -> Price {
        Price {
            currency: currency.into(),
            input,
            output,
            cached_input,
        }
    }

    #[test]
    fn the_ceiling_is_the_element_wise_maximum() {
        let a = price("USD", 150, 600, Some(75));
        let b = price("USD", 100, 900, None);
        let c = price("USD", 120, 500, Some(10));
        // b's cached tokens cost its input price (100): the ceiling's cached price is 100
        assert_eq!(
            Price::ceiling([Some(&a), Some(&b), Some(&c)]),
            Some(price("USD", 150, 900, Some(100)))
        );
        assert_eq!(Price::ceiling([Some(&b)]), Some(b.clone()));
        assert_eq!(
            Price::ceiling([Some(&b), Some(&price("USD", 1, 1, None))]),
            Some(price("USD", 100, 900, None)),
            "no cached price anywhere stays absent"
        );
        // the order does not matter
        assert_eq!(
            Price::ceiling([Some(&c), Some(&b), Some(&a)]),
            Price::ceiling([Some(&a), Some(&b), Some(&c)])
        );
        // never below any member
        let ceiling = Price::ceiling([Some(&a), Some(&b), Some(&c)]).unwrap();
        for p in [&a, &b, &c] {
            assert!(ceiling.input >= p.input && ceiling.output >= p.output);
            assert!(ceiling.effective_cached_input() >= p.effective_cached_input());
        }
    }

    #[test]
    fn no_ceiling_without_a_price_for_every_deployment_in_one_currency() {
        let a = price("USD", 150, 600, None);
        assert_eq!(Price::ceiling([]), None);
        assert_eq!(Price::ceiling([Some(&a), None]), None);
        assert_eq!(Price::ceiling([None, Some(&a)]), None);
        assert_eq!(
            Price::ceiling([Some(&a), Some(&price("EUR", 1, 1, None))]),
            None
        );
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
