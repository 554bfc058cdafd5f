//! usage-accounting configuration: raw serde form, then validation into [`UsageConfig`].
//!
//! ```json
//! {
//!   "currency": "USD",
//!   "price_version": "2026-11-01",
//!   "prices": {
//!     "azure-east-gpt-4o-mini": {"input": "0.15", "cached_input": "0.075", "output": "0.60"},
//!     "claude-sonnet": {"input": "3", "cached_input": "0.30", "cache_write": "3.75", "output": "15"}
//!   },
//!   "default_price": null,
//!   "inject_include_usage": true,
//!   "cost_headers": false,
//!   "hold_headers": false,
//!   "log_records": true,
//!   "reentry": true,
//!   "consumer_label": false,
//!   "filter_state": "llm_usage",
//!   "max_event_bytes": 1048576
//! }
//! ```
//! Price keys are deployment names (`x-llm-deployment`, or the router's filter state), else
//! model groups, else the model the upstream names. See the README for every field.

use crate::ledger::{parse_ledger, LedgerConfig};
use crate::pricing::{parse_price, VersionedPrice};
use llm_gateway_shared::config::{self, validate_name, ConfigError};
use llm_gateway_shared::price::{NanoPerMillion, Price};
use llm_gateway_shared::redis::check_transport;
use llm_gateway_shared::rules::RuleSet;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::rc::Rc;

/// The validated configuration for one scope.
#[derive(Debug, Clone)]
pub struct UsageConfig {
    /// Prices by deployment, model group or model name.
    pub prices: HashMap<String, VersionedPrice>,
    /// Price for anything not in `prices`.
    pub default_price: Option<VersionedPrice>,
    /// Inject `stream_options.include_usage: true` into streaming chat requests.
    pub inject_include_usage: bool,
    /// Add `x-llm-cost` and usage headers to non-streaming responses. Holds the response
    /// headers until the body is read: the Envoy filter needs
    /// `allow_on_headers_stop_iteration: true`, or the body never reaches the plugin.
    pub cost_headers: bool,
    /// Hold the request headers of a request whose body may be rewritten (`include_usage`)
    /// until the body is read, so that `content-length` can follow the new body. `false`: the
    /// headers go on and `content-length` is removed (Envoy frames the body chunked). Needs
    /// `allow_on_headers_stop_iteration: true` on the Envoy filter, as `cost_headers` does.
    pub hold_headers: bool,
    /// Write one JSON log line per record.
    pub log_records: bool,
    /// Watch for an internal redirect superseding the pass (`response.code_details` read at
    /// `on_log`; a superseded pass records nothing and stashes its state for the next): the
    /// fallback of Higress and `envoy-config/gateway-1.36.yaml`. `false` where the fallback is
    /// the router's retries (`envoy-config/gateway.yaml`): every pass is final there, and the
    /// read is saved.
    pub reentry: bool,
    /// Label metrics with the consumer too (cardinality: one series per consumer).
    pub consumer_label: bool,
    /// Filter state name: the record is published as `wasm.<filter_state>`.
    pub filter_state: String,
    /// Largest SSE event kept whole; a longer one passes through uninspected.
    pub max_event_bytes: usize,
    /// The Redis stream ledger (Higress's Redis calls, or webdis over HTTP).
    pub ledger: Option<LedgerConfig>,
}

impl UsageConfig {
    /// The price for a request: first the deployment's, then the model group's, then the
    /// model's, then the default.
    pub fn price_for(
        &self,
        deployment: Option<&str>,
        model_group: Option<&str>,
        model: Option<&str>,
    ) -> Option<&VersionedPrice> {
        [deployment, model_group, model]
            .into_iter()
            .flatten()
            .find_map(|key| self.prices.get(key))
            .or(self.default_price.as_ref())
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default = "default_currency")]
    currency: String,
    #[serde(default)]
    price_version: Option<String>,
    #[serde(default)]
    prices: Map<String, Value>,
    #[serde(default)]
    default_price: Option<Value>,
    #[serde(default = "config::default_true")]
    inject_include_usage: bool,
    #[serde(default)]
    cost_headers: bool,
    #[serde(default)]
    hold_headers: bool,
    #[serde(default = "config::default_true")]
    log_records: bool,
    #[serde(default = "config::default_true")]
    reentry: bool,
    #[serde(default)]
    consumer_label: bool,
    #[serde(default = "default_filter_state")]
    filter_state: String,
    #[serde(default = "default_max_event_bytes")]
    max_event_bytes: usize,
    #[serde(default)]
    ledger: Option<Value>,
}

fn default_currency() -> String {
    "USD".into()
}
fn default_filter_state() -> String {
    llm_gateway_shared::usage_record::PROPERTY.into()
}
fn default_max_event_bytes() -> usize {
    1024 * 1024
}

/// Parses a whole configuration document (plain JSON or Higress form).
pub fn parse_document(document: &[u8]) -> Result<RuleSet<UsageConfig>, ConfigError> {
    RuleSet::parse(document, |fields, _scope| parse_scope(fields))
}

/// [`parse_document`] with each configuration shared (requests hold it without a copy).
pub fn parse_shared(document: &[u8]) -> Result<RuleSet<Rc<UsageConfig>>, ConfigError> {
    RuleSet::parse(document, |fields, _scope| parse_scope(fields).map(Rc::new))
}

fn parse_scope(fields: &Map<String, Value>) -> Result<UsageConfig, ConfigError> {
    let raw: RawConfig = config::from_value("", Value::Object(fields.clone()))?;
    validate_name("currency", &raw.currency)?;
    if let Some(version) = &raw.price_version {
        validate_name("price_version", version)?;
    }
    let defaults = EntryDefaults {
        version: raw.price_version.as_deref(),
        currency: &raw.currency,
    };
    let mut prices = HashMap::with_capacity(raw.prices.len());
    for (key, value) in &raw.prices {
        let field = format!("prices.{key}");
        validate_name(&field, key)?;
        prices.insert(key.clone(), parse_price_entry(&field, value, &defaults)?);
    }
    let default_price = match &raw.default_price {
        None | Some(Value::Null) => None,
        Some(value) => Some(parse_price_entry("default_price", value, &defaults)?),
    };
    if raw.filter_state.is_empty()
        || !raw
            .filter_state
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(ConfigError::new(
            "filter_state",
            "must be a non-empty name of letters, digits, _ and -",
        ));
    }
    if !(1024..=64 * 1024 * 1024).contains(&raw.max_event_bytes) {
        return Err(ConfigError::new(
            "max_event_bytes",
            "must be between 1024 and 67108864",
        ));
    }
    let ledger = match &raw.ledger {
        None | Some(Value::Null) => None,
        Some(value) => {
            let ledger = parse_ledger(value)?;
            check_transport(
                "ledger",
                ledger.transport.name(),
                crate::ledger::TRANSPORT,
                "use `\"transport\": \"http\"` with a webdis cluster, the Higress build (dist/higress/usage-accounting.wasm), or the access log",
            )?;
            Some(ledger)
        }
    };
    Ok(UsageConfig {
        ledger,
        prices,
        default_price,
        inject_include_usage: raw.inject_include_usage,
        cost_headers: raw.cost_headers,
        hold_headers: raw.hold_headers,
        log_records: raw.log_records,
        reentry: raw.reentry,
        consumer_label: raw.consumer_label,
        filter_state: raw.filter_state,
        max_event_bytes: raw.max_event_bytes,
    })
}

struct EntryDefaults<'a> {
    version: Option<&'a str>,
    currency: &'a str,
}

/// `{"input", "cached_input", "cache_write", "output", "reasoning", "price_version", "currency"}`;
/// `input` and `output` required.
fn parse_price_entry(
    field: &str,
    value: &Value,
    defaults: &EntryDefaults<'_>,
) -> Result<VersionedPrice, ConfigError> {
    let Value::Object(entry) = value else {
        return Err(ConfigError::new(field, "must be an object"));
    };
    const KNOWN: [&str; 7] = [
        "input",
        "cached_input",
        "cache_write",
        "output",
        "reasoning",
        "price_version",
        "currency",
    ];
    if let Some(unknown) = entry.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(ConfigError::new(
            format!("{field}.{unknown}"),
            format!("unknown field (expected one of {})", KNOWN.join(", ")),
        ));
    }
    let amount = |name: &str| -> Result<Option<NanoPerMillion>, ConfigError> {
        match entry.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => parse_price(v)
                .map(Some)
                .map_err(|reason| ConfigError::new(format!("{field}.{name}"), reason)),
        }
    };
    let required = |name: &str| -> Result<NanoPerMillion, ConfigError> {
        amount(name)?.ok_or_else(|| ConfigError::new(format!("{field}.{name}"), "is required"))
    };
    let input = required("input")?;
    let output = required("output")?;
    let text = |name: &str| -> Result<Option<String>, ConfigError> {
        match entry.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => {
                let path = format!("{field}.{name}");
                validate_name(&path, s)?;
                Ok(Some(s.clone()))
            }
            Some(_) => Err(ConfigError::new(
                format!("{field}.{name}"),
                "must be a string",
            )),
        }
    };
    let version = match (text("price_version")?, defaults.version) {
        (Some(v), _) => v,
        (None, Some(v)) => v.to_string(),
        (None, None) => {
            return Err(ConfigError::new(
                format!("{field}.price_version"),
                "is required when the top-level `price_version` is not set",
            ))
        }
    };
    Ok(VersionedPrice {
        price: Price {
            input,
            cached_input: amount("cached_input")?,
            cache_write: amount("cache_write")?,
            output,
            reasoning: amount("reasoning")?,
            currency: text("currency")?.unwrap_or_else(|| defaults.currency.to_string()),
        },
        version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: Value) -> Result<UsageConfig, ConfigError> {
        let rules = parse_document(value.to_string().as_bytes())?;
        Ok(rules.global().unwrap().clone())
    }

    #[test]
    fn defaults() {
        let c = parse(json!({})).unwrap();
        assert!(c.inject_include_usage && c.log_records && c.reentry);
        assert!(!parse(json!({"reentry": false})).unwrap().reentry);
        assert!(!c.consumer_label && !c.cost_headers && !c.hold_headers);
        assert!(parse(json!({"hold_headers": true})).unwrap().hold_headers);
        assert_eq!(c.filter_state, "llm_usage");
        assert!(c.price_for(Some("x"), None, None).is_none());
    }

    #[test]
    fn prices_lookup_order_and_defaults() {
        let c = parse(json!({
            "price_version": "2026-11",
            "prices": {
                "east": {"input": "0.30", "cached_input": "0.006", "output": "1.20"},
                "fast": {"input": 1, "output": 2, "price_version": "old", "currency": "EUR"}
            },
            "default_price": {"input": "9", "output": "9"}
        }))
        .unwrap();
        let east = c.price_for(Some("east"), Some("fast"), None).unwrap();
        assert_eq!(east.version, "2026-11");
        let east = &east.price;
        assert_eq!(east.input, 300_000_000);
        assert_eq!(east.cached_input, Some(6_000_000));
        // unset: cache writes at the input price, reasoning at the output price
        assert_eq!((east.cache_write, east.reasoning), (None, None));
        assert_eq!(east.effective_cache_write(), 300_000_000);
        assert_eq!(east.effective_reasoning(), 1_200_000_000);
        assert_eq!(east.currency, "USD");
        let fast = c.price_for(Some("west"), Some("fast"), None).unwrap();
        assert_eq!(
            (fast.version.as_str(), fast.price.currency.as_str()),
            ("old", "EUR")
        );
        assert_eq!(
            c.price_for(None, None, Some("m")).unwrap().price.input,
            9_000_000_000
        );
    }

    #[test]
    fn higress_rules_lay_over_the_global_config() {
        // the shape higress/usage-accounting.yaml becomes
        let doc = json!({
            "price_version": "2026-11",
            "prices": {"openai-mini": {"input": "0.15", "cached_input": "0.075", "output": "0.60"}},
            "consumer_label": false,
            "_rules_": [{"_match_route_": ["default/llm-batch"], "consumer_label": true}]
        });
        let rules = parse_document(doc.to_string().as_bytes()).unwrap();
        assert!(!rules.global().unwrap().consumer_label);
        let batch = rules
            .select(&llm_gateway_shared::rules::MatchInput {
                route: "default/llm-batch",
                ..Default::default()
            })
            .unwrap();
        assert!(batch.consumer_label);
        assert_eq!(batch.prices["openai-mini"].price.input, 150_000_000);
    }

    #[test]
    fn the_ledger_needs_the_higress_build() {
        let result = parse(json!({"ledger": {"service": "outbound|6379||redis.static"}}));
        if crate::ledger::TRANSPORT {
            assert_eq!(result.unwrap().ledger.unwrap().stream, "llm:usage");
        } else {
            let err = result.unwrap_err();
            assert_eq!(err.field(), "ledger");
            assert!(err.reason().contains("Higress"), "{err}");
        }
        assert!(parse(json!({"ledger": null})).unwrap().ledger.is_none());
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                json!({"prices": {"a": {"input": "1", "output": "1"}}}),
                "prices.a.price_version",
            ),
            (
                json!({"price_version": "v", "prices": {"a": {"input": "1"}}}),
                "prices.a.output",
            ),
            (
                json!({"price_version": "v", "prices": {"a": {"input": "-1", "output": "1"}}}),
                "prices.a.input",
            ),
            (
                json!({"price_version": "v", "prices": {"a": {"input": "1", "output": "1", "x": 1}}}),
                "prices.a.x",
            ),
            (
                json!({"price_version": "v", "prices": {"a b": {"input": "1", "output": "1"}}}),
                "prices.a b",
            ),
            (json!({"filter_state": "a.b"}), "filter_state"),
            (json!({"max_event_bytes": 10}), "max_event_bytes"),
            (
                json!({"price_version": "v", "default_price": 3}),
                "default_price",
            ),
        ];
        for (config, field) in cases {
            let err = parse(config.clone()).unwrap_err();
            assert_eq!(err.field(), field, "{config}: {err}");
        }
        let err = parse(json!({"bogus": 1})).unwrap_err();
        assert!(err.reason().contains("bogus"), "{err}");
    }
}
