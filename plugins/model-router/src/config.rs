//! The router's configuration: deployments, model groups, breaker and attempt bounds.
//!
//! Read in two steps like every plugin here: serde into [`RawConfig`] (defaults in one place),
//! then [`RouterConfig::try_from_raw`] validates names, references and numbers and builds the
//! lookup tables. Errors name the field; a credential is never echoed.

use crate::redirect::Fallback;
use llm_gateway_shared::config::{self, validate_name, ConfigError};
use llm_gateway_shared::price::{MicroPrice, Price};
use llm_gateway_shared::route_info::TRY_SLOTS;
use llm_gateway_shared::rules::{RuleSet, Scope};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::HashMap;

/// Largest `max_attempts` (one per filter-state slot `llm_try_<k>` the route's matcher reads).
pub const MAX_ATTEMPTS: usize = TRY_SLOTS;

/// The provider's API: which wire API it speaks, where, and how it wants its credential
/// ([`crate::wire`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Provider {
    /// OpenAI: `Authorization: Bearer <credential>`, `/v1/...`.
    Openai,
    /// Anthropic Messages: `x-api-key: <credential>` (plus `anthropic-version: 2023-06-01` when
    /// the client sent none), `/v1/messages`.
    Anthropic,
    /// An OpenAI-compatible API (DeepSeek, Qwen/DashScope, vLLM, ...): `Authorization: Bearer
    /// <credential>`, `<path_prefix>/v1/...`.
    OpenaiCompatible,
    /// Azure OpenAI: `api-key: <credential>`,
    /// `/openai/deployments/<azure_deployment>/chat/completions?api-version=<api_version>`.
    Azure,
}

impl Provider {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Openai => "openai",
            Provider::Anthropic => "anthropic",
            Provider::OpenaiCompatible => "openai-compatible",
            Provider::Azure => "azure",
        }
    }
}

/// Which filter instance this configuration drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The HTTP filter of the listener: group resolution, ACL, plan, first choice.
    #[default]
    Downstream,
    /// The cluster's upstream HTTP filter: runs once per attempt, rewrites `model` and the
    /// credential for that attempt's deployment and records its outcome for the breaker.
    Upstream,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDeployment {
    name: String,
    cluster: String,
    model: String,
    provider: Provider,
    #[serde(default)]
    credential: Option<String>,
    #[serde(default)]
    context_window: Option<u64>,
    #[serde(default)]
    price: Option<MicroPrice>,
    #[serde(default)]
    price_version: Option<String>,
    #[serde(default)]
    forward_envoy_headers: bool,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    azure_deployment: Option<String>,
    #[serde(default)]
    path_prefix: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    deployment: String,
    #[serde(default)]
    weight: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    name: String,
    deployments: Vec<RawTarget>,
    #[serde(default)]
    budget_fallback: Option<String>,
    #[serde(default)]
    retry_on: Option<Vec<u16>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct RawBreaker {
    consecutive_failures: Option<u32>,
    window: Option<u32>,
    failure_rate_percent: Option<u32>,
    min_calls: Option<u32>,
    cooldown_ms: Option<u64>,
}

/// The raw form (top level is not `deny_unknown_fields`: Higress adds `_rules_` keys, which
/// [`RuleSet`] strips before this sees the object).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    role: Role,
    #[serde(default)]
    version: Option<String>,
    #[serde(default = "default_max_attempts")]
    max_attempts: usize,
    #[serde(default = "config::default_true")]
    enforce_groups: bool,
    #[serde(default)]
    deployments: Vec<RawDeployment>,
    #[serde(default)]
    groups: Vec<RawGroup>,
    #[serde(default)]
    breaker: RawBreaker,
    #[serde(default)]
    fallback: Fallback,
    #[serde(default = "default_max_cooldown_ms")]
    max_cooldown_ms: u64,
    #[serde(default = "default_max_tokens")]
    default_max_tokens: u64,
}

fn default_max_attempts() -> usize {
    3
}

/// The output cap sent to an Anthropic deployment (which requires one) for a request that
/// sets none, unless the deployment or the configuration says otherwise.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

fn default_max_tokens() -> u64 {
    DEFAULT_MAX_TOKENS
}

/// Longest provider cooldown (`retry-after` & co.) the router honours by default.
pub const DEFAULT_MAX_COOLDOWN_MS: u64 = 60_000;

fn default_max_cooldown_ms() -> u64 {
    DEFAULT_MAX_COOLDOWN_MS
}

/// A provider deployment: one model at one provider, reached through one upstream cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment {
    /// Unique name (`x-llm-deployment`).
    pub name: String,
    /// The Envoy / Higress cluster that reaches the provider.
    pub cluster: String,
    /// The provider's model name that replaces the group name in `model`.
    pub model: String,
    /// The provider's API kind (decides the credential header).
    pub provider: Provider,
    /// The provider credential; `None` when the cluster injects its own.
    pub credential: Option<String>,
    /// Prompt + output tokens the model accepts; `None`: unknown, never skipped for size.
    pub context_window: Option<u64>,
    /// Price of the deployment (published for usage-accounting and token-ratelimit).
    pub price: Option<Price>,
    /// Version of that price.
    pub price_version: Option<String>,
    /// The provider gets Envoy's `x-envoy-*` request headers (attempt count, timeouts...);
    /// `false` (the default): the upstream role removes them, a provider learns nothing of
    /// the gateway's internals.
    pub forward_envoy_headers: bool,
    /// The output cap sent when a request translated to Anthropic Messages has none (the
    /// configuration's `default_max_tokens` when the deployment sets none).
    pub max_tokens: u64,
    /// Azure: the `api-version` query parameter (required there, refused elsewhere).
    pub api_version: Option<String>,
    /// Azure: the deployment name in the path (default: `model`).
    pub azure_deployment: Option<String>,
    /// Before `/v1/...` in the provider's path (`/compatible-mode` for DashScope); empty: none.
    pub path_prefix: String,
}

/// One member of a group: a deployment and its share of first choices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Index into [`RouterConfig::deployments`].
    pub deployment: usize,
    /// Share of first choices (0: fallback only).
    pub weight: u32,
}

/// A model group: the name clients use, its deployments in fallback order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The name clients put in `model`.
    pub name: String,
    /// Deployments in fallback order.
    pub targets: Vec<Target>,
    /// Sum of the weights (0: the first target is always the first choice).
    pub total_weight: u64,
    /// Index into [`RouterConfig::groups`] of the group a hard budget may switch a request
    /// to (`budget_fallback`); never the group itself. Followed one hop only: the fallback
    /// group's own `budget_fallback` is not used for requests switched to it.
    pub budget_fallback: Option<usize>,
    /// The response statuses that move a request to the next deployment (`retry_on`).
    pub retry_on: RetryOn,
}

/// The provider response statuses on which a group's request moves to its next deployment
/// (besides resets, connect failures and a context-length 400, which always do).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RetryOn {
    /// 429 and every 5xx (no `retry_on` configured).
    #[default]
    RateLimitedAndServerErrors,
    /// Exactly these statuses (each in 400..=599).
    Statuses(Vec<u16>),
}

impl RetryOn {
    /// Does a response with `status` move the request on?
    pub fn matches(&self, status: u16) -> bool {
        match self {
            RetryOn::RateLimitedAndServerErrors => status == 429 || (500..=599).contains(&status),
            RetryOn::Statuses(list) => list.contains(&status),
        }
    }
}

/// Circuit-breaker thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Opens after this many failures in a row (0: never by count).
    pub consecutive_failures: u32,
    /// Size of the sliding window of recent calls (at most 64).
    pub window: u32,
    /// Opens when failures in the window reach this percentage (0: never by rate).
    pub failure_rate_percent: u32,
    /// The rate rule needs at least this many calls in the window.
    pub min_calls: u32,
    /// How long an open breaker skips the deployment before one probe goes through.
    pub cooldown_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            consecutive_failures: 5,
            window: 20,
            failure_rate_percent: 50,
            min_calls: 10,
            cooldown_ms: 30_000,
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouterConfig {
    /// Which filter instance this is.
    pub role: Role,
    /// Config version, reported in `x-llm-route-version` and metrics.
    pub version: String,
    /// Upper bound of attempts per request (first try included).
    pub max_attempts: usize,
    /// Refuse (403) a request without `x-llm-groups`.
    pub enforce_groups: bool,
    /// Every deployment.
    pub deployments: Vec<Deployment>,
    /// Every group.
    pub groups: Vec<Group>,
    /// Breaker thresholds.
    pub breaker: BreakerConfig,
    /// How a request moves to the next deployment (`crate::redirect`).
    pub fallback: Fallback,
    /// Longest provider cooldown honoured (ms; 0: provider signals are ignored).
    pub max_cooldown_ms: u64,
    /// The output cap sent to an Anthropic deployment for a request that sets none (a
    /// deployment's own `max_tokens` wins).
    pub default_max_tokens: u64,
    group_index: HashMap<String, usize>,
    deployment_index: HashMap<String, usize>,
}

impl RouterConfig {
    /// The group named `name`.
    pub fn group(&self, name: &str) -> Option<&Group> {
        self.group_index.get(name).and_then(|i| self.groups.get(*i))
    }

    /// The group `group`'s budget fallback group, if it has one.
    pub fn budget_fallback(&self, group: &str) -> Option<&Group> {
        let index = self.group(group)?.budget_fallback?;
        self.groups.get(index)
    }

    /// The deployment named `name` and its index.
    pub fn deployment(&self, name: &str) -> Option<(usize, &Deployment)> {
        let index = *self.deployment_index.get(name)?;
        self.deployments.get(index).map(|d| (index, d))
    }

    /// Validates the raw form.
    fn try_from_raw(raw: RawConfig) -> Result<RouterConfig, ConfigError> {
        if raw.max_attempts == 0 || raw.max_attempts > MAX_ATTEMPTS {
            return Err(ConfigError::new(
                "max_attempts",
                format!("must be in 1..={MAX_ATTEMPTS}"),
            ));
        }
        let version = raw.version.unwrap_or_else(|| "unversioned".to_string());
        validate_name("version", &version)?;
        if raw.default_max_tokens == 0 {
            return Err(ConfigError::new("default_max_tokens", "must be positive"));
        }

        let mut deployments = Vec::with_capacity(raw.deployments.len());
        let mut deployment_index = HashMap::new();
        for (i, d) in raw.deployments.into_iter().enumerate() {
            let at = |field: &str| format!("deployments[{i}].{field}");
            validate_name(&at("name"), &d.name)?;
            validate_cluster(&at("cluster"), &d.cluster)?;
            if d.model.is_empty() || d.model.len() > 256 || d.model.chars().any(char::is_control) {
                return Err(ConfigError::new(
                    at("model"),
                    "must be 1 to 256 characters without control characters",
                ));
            }
            if let Some(credential) = &d.credential {
                let header_safe = credential
                    .bytes()
                    .all(|b| b.is_ascii_graphic() || b == b' ');
                if credential.is_empty() || !header_safe {
                    // never echo the value
                    return Err(ConfigError::new(
                        at("credential"),
                        "must be non-empty printable ASCII (value not shown)",
                    ));
                }
            }
            if d.context_window == Some(0) {
                return Err(ConfigError::new(at("context_window"), "must be positive"));
            }
            if let Some(v) = &d.price_version {
                validate_name(&at("price_version"), v)?;
            }
            let price = d.price.map(Price::from);
            if let Some(price) = &price {
                price.validate().map_err(|e| e.within(&at("price")))?;
            }
            if d.max_tokens == Some(0) {
                return Err(ConfigError::new(at("max_tokens"), "must be positive"));
            }
            match (d.provider, &d.api_version) {
                (Provider::Azure, None) => {
                    return Err(ConfigError::new(
                        at("api_version"),
                        "required for an Azure deployment (e.g. \"2024-10-21\")",
                    ))
                }
                (Provider::Azure, Some(v)) => validate_path_part(&at("api_version"), v)?,
                (_, Some(_)) => {
                    return Err(ConfigError::new(
                        at("api_version"),
                        "only an Azure deployment takes one",
                    ))
                }
                (_, None) => {}
            }
            match (d.provider, &d.azure_deployment) {
                (Provider::Azure, Some(name)) => validate_path_part(&at("azure_deployment"), name)?,
                (_, Some(_)) => {
                    return Err(ConfigError::new(
                        at("azure_deployment"),
                        "only an Azure deployment takes one",
                    ))
                }
                _ => {}
            }
            if d.provider == Provider::Azure {
                // the deployment name in the path defaults to the model's
                validate_path_part(
                    &at("model"),
                    d.azure_deployment.as_ref().unwrap_or(&d.model),
                )?;
            }
            let path_prefix = match d.path_prefix {
                None => String::new(),
                Some(_) if d.provider == Provider::Azure => {
                    return Err(ConfigError::new(
                        at("path_prefix"),
                        "an Azure deployment's path is Azure's (/openai/deployments/...)",
                    ))
                }
                Some(prefix) => {
                    validate_path_prefix(&at("path_prefix"), &prefix)?;
                    prefix.trim_end_matches('/').to_string()
                }
            };
            if deployment_index.insert(d.name.clone(), i).is_some() {
                return Err(ConfigError::new(at("name"), "duplicate deployment name"));
            }
            deployments.push(Deployment {
                name: d.name,
                cluster: d.cluster,
                model: d.model,
                provider: d.provider,
                credential: d.credential,
                context_window: d.context_window,
                price,
                price_version: d.price_version,
                forward_envoy_headers: d.forward_envoy_headers,
                max_tokens: d.max_tokens.unwrap_or(raw.default_max_tokens),
                api_version: d.api_version,
                azure_deployment: d.azure_deployment,
                path_prefix,
            });
        }

        let mut groups = Vec::with_capacity(raw.groups.len());
        let mut fallbacks = Vec::with_capacity(raw.groups.len());
        let mut group_index = HashMap::new();
        for (i, g) in raw.groups.into_iter().enumerate() {
            let at = |field: &str| format!("groups[{i}].{field}");
            validate_name(&at("name"), &g.name)?;
            if g.name == "*" {
                return Err(ConfigError::new(at("name"), "`*` is reserved"));
            }
            if g.deployments.is_empty() {
                return Err(ConfigError::new(at("deployments"), "must not be empty"));
            }
            // Two deployments may share a cluster (`gpt-4o` -> `gpt-4o-mini` at one provider):
            // the attempt number, not the cluster, says which deployment an attempt is.
            let mut targets = Vec::with_capacity(g.deployments.len());
            for (j, t) in g.deployments.iter().enumerate() {
                let field = format!("deployments[{j}].deployment");
                let Some(&index) = deployment_index.get(&t.deployment) else {
                    return Err(ConfigError::new(
                        at(&field),
                        "names no configured deployment",
                    ));
                };
                if targets.iter().any(|x: &Target| x.deployment == index) {
                    return Err(ConfigError::new(at(&field), "deployment listed twice"));
                }
                targets.push(Target {
                    deployment: index,
                    weight: t.weight.unwrap_or(0),
                });
            }
            let total_weight = targets.iter().map(|t| u64::from(t.weight)).sum();
            if group_index.insert(g.name.clone(), i).is_some() {
                return Err(ConfigError::new(at("name"), "duplicate group name"));
            }
            let retry_on = match g.retry_on {
                None => RetryOn::default(),
                Some(list) => {
                    if list.is_empty() || list.len() > 200 {
                        return Err(ConfigError::new(
                            at("retry_on"),
                            "must list 1 to 200 statuses",
                        ));
                    }
                    if let Some(bad) = list.iter().find(|s| !(400..=599).contains(*s)) {
                        return Err(ConfigError::new(
                            at("retry_on"),
                            format!("status {bad} is not in 400..=599"),
                        ));
                    }
                    if raw.fallback == Fallback::Redirect {
                        return Err(ConfigError::new(
                            at("retry_on"),
                            "needs \"fallback\": \"retry\" (with the redirect, the custom_response policy's status matcher decides)",
                        ));
                    }
                    RetryOn::Statuses(list)
                }
            };
            groups.push(Group {
                name: g.name,
                targets,
                total_weight,
                budget_fallback: None,
                retry_on,
            });
            fallbacks.push(g.budget_fallback);
        }
        // after every group is known: a fallback may name a group defined later
        for (i, (group, fallback)) in groups.iter_mut().zip(fallbacks).enumerate() {
            let Some(fallback) = fallback else {
                continue;
            };
            let field = format!("groups[{i}].budget_fallback");
            let Some(&index) = group_index.get(&fallback) else {
                return Err(ConfigError::new(field, "names no configured group"));
            };
            if index == i {
                return Err(ConfigError::new(field, "must name another group"));
            }
            group.budget_fallback = Some(index);
        }

        let b = raw.breaker;
        let defaults = BreakerConfig::default();
        let breaker = BreakerConfig {
            consecutive_failures: b
                .consecutive_failures
                .unwrap_or(defaults.consecutive_failures),
            window: b.window.unwrap_or(defaults.window),
            failure_rate_percent: b
                .failure_rate_percent
                .unwrap_or(defaults.failure_rate_percent),
            min_calls: b.min_calls.unwrap_or(defaults.min_calls),
            cooldown_ms: b.cooldown_ms.unwrap_or(defaults.cooldown_ms),
        };
        if breaker.window == 0 || breaker.window > 64 {
            return Err(ConfigError::new("breaker.window", "must be in 1..=64"));
        }
        if breaker.failure_rate_percent > 100 {
            return Err(ConfigError::new(
                "breaker.failure_rate_percent",
                "must be in 0..=100",
            ));
        }
        if breaker.min_calls > breaker.window {
            return Err(ConfigError::new(
                "breaker.min_calls",
                "must not exceed breaker.window",
            ));
        }
        if breaker.cooldown_ms == 0 {
            return Err(ConfigError::new("breaker.cooldown_ms", "must be positive"));
        }
        if raw.max_cooldown_ms > crate::signals::MAX_SIGNAL_MS {
            return Err(ConfigError::new(
                "max_cooldown_ms",
                format!("must be at most {}", crate::signals::MAX_SIGNAL_MS),
            ));
        }

        crate::redirect::validate(
            raw.fallback,
            groups.iter().any(|g| g.budget_fallback.is_some()),
        )?;

        Ok(RouterConfig {
            default_max_tokens: raw.default_max_tokens,
            fallback: raw.fallback,
            max_cooldown_ms: raw.max_cooldown_ms,
            role: raw.role,
            version,
            max_attempts: raw.max_attempts,
            enforce_groups: raw.enforce_groups,
            deployments,
            groups,
            breaker,
            group_index,
            deployment_index,
        })
    }
}

/// A cluster name: what [`validate_name`] allows plus `|` (Higress names clusters
/// `outbound|443||api.openai.com.dns`), up to 256 characters.
fn validate_cluster(field: &str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() || value.len() > 256 {
        return Err(ConfigError::new(field, "must be 1 to 256 characters"));
    }
    if let Some(bad) = value.chars().find(|c| {
        !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '@' | '/' | '|'))
    }) {
        return Err(ConfigError::new(
            field,
            format!("character {bad:?} not allowed (use letters, digits and -_.:@/|)"),
        ));
    }
    Ok(())
}

/// A value that goes into a provider's path or query as it is: 1 to 128 of letters, digits
/// and `-_.` (an Azure deployment name, an API version).
fn validate_path_part(field: &str, value: &str) -> Result<(), ConfigError> {
    let fits = !value.is_empty()
        && value.len() <= 128
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if fits {
        Ok(())
    } else {
        Err(ConfigError::new(
            field,
            "must be 1 to 128 of letters, digits and -_. (it goes into the provider's path)",
        ))
    }
}

/// A path prefix: `/` then segments of letters, digits and `-_.~`, separated by `/`, at most
/// 128 bytes; no query, no `..`.
fn validate_path_prefix(field: &str, value: &str) -> Result<(), ConfigError> {
    let trimmed = value.trim_end_matches('/');
    let fits = value.starts_with('/')
        && value.len() <= 128
        && trimmed.split('/').skip(1).all(|s| {
            !s.is_empty()
                && s != "."
                && s != ".."
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~'))
        });
    if fits {
        Ok(())
    } else {
        Err(ConfigError::new(
            field,
            "must be a path like /compatible-mode: segments of letters, digits and -_.~, no query",
        ))
    }
}

/// Parses a configuration document (plain JSON or Higress's global config + `_rules_`).
pub fn parse_document(document: &[u8]) -> Result<RuleSet<RouterConfig>, ConfigError> {
    RuleSet::parse(document, parse_scope)
}

fn parse_scope(fields: &Map<String, Value>, _scope: Scope) -> Result<RouterConfig, ConfigError> {
    let raw: RawConfig = config::from_value("", Value::Object(fields.clone()))?;
    RouterConfig::try_from_raw(raw)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const EXAMPLE: &str = r#"{
        "version": "v7",
        "deployments": [
            {"name": "openai-mini", "cluster": "openai", "model": "gpt-4o-mini", "provider": "openai",
             "credential": "sk-openai", "context_window": 128000,
             "price": {"input": 150000, "output": 600000}, "price_version": "2026-01"},
            {"name": "azure-mini", "cluster": "azure", "model": "gpt-4o-mini-2024", "provider": "openai-compatible",
             "credential": "az-key", "context_window": 8000},
            {"name": "claude", "cluster": "anthropic", "model": "claude-sonnet-4", "provider": "anthropic",
             "credential": "sk-ant", "context_window": 200000}
        ],
        "groups": [
            {"name": "fast", "deployments": [{"deployment": "openai-mini"}, {"deployment": "azure-mini"}]},
            {"name": "smart", "deployments": [{"deployment": "claude", "weight": 90}, {"deployment": "openai-mini", "weight": 10}]}
        ]
    }"#;

    pub(crate) fn example() -> RouterConfig {
        parse_document(EXAMPLE.as_bytes())
            .unwrap()
            .global()
            .unwrap()
            .clone()
    }

    fn error(doc: &str) -> ConfigError {
        parse_document(doc.as_bytes()).unwrap_err()
    }

    #[test]
    fn parses_the_example() {
        let config = example();
        assert_eq!(config.version, "v7");
        assert_eq!(config.max_attempts, 3);
        assert_eq!(config.role, Role::Downstream);
        let fast = config.group("fast").unwrap();
        assert_eq!(fast.targets.len(), 2);
        assert_eq!(fast.total_weight, 0);
        assert_eq!(config.group("smart").unwrap().total_weight, 100);
        let (index, claude) = config.deployment("claude").unwrap();
        assert_eq!(index, 2);
        assert_eq!(claude.provider, Provider::Anthropic);
        assert_eq!(config.breaker, BreakerConfig::default());
    }

    #[test]
    fn refuses_bad_references_and_numbers_naming_the_field() {
        let cases = [
            (
                r#"{"groups":[{"name":"g","deployments":[{"deployment":"nope"}]}]}"#,
                "groups[0].deployments[0].deployment",
            ),
            (r#"{"max_attempts":0}"#, "max_attempts"),
            (r#"{"max_attempts":9}"#, "max_attempts"),
            (r#"{"breaker":{"window":65}}"#, "breaker.window"),
            (
                r#"{"breaker":{"window":5,"min_calls":6}}"#,
                "breaker.min_calls",
            ),
            (r#"{"breaker":{"cooldown_ms":0}}"#, "breaker.cooldown_ms"),
            (
                r#"{"groups":[{"name":"g","deployments":[]}]}"#,
                "groups[0].deployments",
            ),
            (
                r#"{"deployments":[{"name":"a b","cluster":"c","model":"m","provider":"openai"}]}"#,
                "deployments[0].name",
            ),
            (
                r#"{"deployments":[{"name":"a","cluster":"c","model":"m","provider":"openai","context_window":0}]}"#,
                "deployments[0].context_window",
            ),
        ];
        for (doc, field) in cases {
            assert_eq!(error(doc).field(), field, "{doc}");
        }
    }

    #[test]
    fn a_budget_fallback_names_another_configured_group() {
        let doc = |fast: &str, smart: &str| {
            format!(
                r#"{{"deployments":[
                    {{"name":"a","cluster":"ca","model":"m","provider":"openai"}},
                    {{"name":"b","cluster":"cb","model":"n","provider":"openai"}}],
                   "groups":[{{"name":"fast","deployments":[{{"deployment":"a"}}]{fast}}},
                             {{"name":"smart","deployments":[{{"deployment":"b"}}]{smart}}}]}}"#
            )
        };
        // a group defined later, and (one hop each) back again
        let set = parse_document(
            doc(
                r#","budget_fallback":"smart""#,
                r#","budget_fallback":"fast""#,
            )
            .as_bytes(),
        )
        .unwrap();
        let config = set.global().unwrap();
        assert_eq!(config.group("fast").unwrap().budget_fallback, Some(1));
        assert_eq!(config.budget_fallback("fast").unwrap().name, "smart");
        assert_eq!(config.budget_fallback("smart").unwrap().name, "fast");
        let set = parse_document(doc("", r#","budget_fallback":"fast""#).as_bytes()).unwrap();
        assert!(set.global().unwrap().budget_fallback("fast").is_none());
        assert!(set.global().unwrap().budget_fallback("nope").is_none());

        let err = error(&doc(r#","budget_fallback":"nope""#, ""));
        assert_eq!(err.field(), "groups[0].budget_fallback");
        assert!(err.reason().contains("no configured group"), "{err}");
        let err = error(&doc("", r#","budget_fallback":"smart""#));
        assert_eq!(err.field(), "groups[1].budget_fallback");
        assert!(err.reason().contains("another group"), "{err}");
        assert!(parse_document(doc(r#","budget_fallback":7"#, "").as_bytes()).is_err());
    }

    #[test]
    fn two_deployments_of_a_group_may_share_a_cluster() {
        // the most common fallback: a larger model to a smaller one at the same provider
        let doc = r#"{"deployments":[
            {"name":"4o","cluster":"openai","model":"gpt-4o","provider":"openai"},
            {"name":"mini","cluster":"openai","model":"gpt-4o-mini","provider":"openai"}],
            "groups":[{"name":"g","deployments":[{"deployment":"4o"},{"deployment":"mini"}]}]}"#;
        let set = parse_document(doc.as_bytes()).unwrap();
        let config = set.global().unwrap();
        let targets: Vec<usize> = config
            .group("g")
            .unwrap()
            .targets
            .iter()
            .map(|t| t.deployment)
            .collect();
        assert_eq!(targets, [0, 1]);
        // one deployment listed twice is still refused
        let twice = doc.replace(r#"{"deployment":"mini"}"#, r#"{"deployment":"4o"}"#);
        assert_eq!(error(&twice).field(), "groups[0].deployments[1].deployment");
    }

    #[test]
    fn envoy_headers_reach_a_provider_only_when_its_deployment_says_so() {
        let config = example();
        assert!(config.deployments.iter().all(|d| !d.forward_envoy_headers));
        let doc = r#"{"deployments":[{"name":"a","cluster":"c","model":"m","provider":"openai",
            "forward_envoy_headers":true}]}"#;
        let set = parse_document(doc.as_bytes()).unwrap();
        assert!(set.global().unwrap().deployments[0].forward_envoy_headers);
    }

    #[test]
    fn a_bad_credential_is_never_echoed() {
        let doc = "{\"deployments\":[{\"name\":\"a\",\"cluster\":\"c\",\"model\":\"m\",\"provider\":\"openai\",\"credential\":\"sk-secret\\n\"}]}";
        let err = error(doc);
        assert_eq!(err.field(), "deployments[0].credential");
        assert!(!err.to_string().contains("sk-secret"));
    }

    #[test]
    fn higress_cluster_names_are_accepted() {
        let doc = r#"{"deployments":[{"name":"a","cluster":"outbound|443||api.openai.com.dns","model":"m","provider":"openai"}]}"#;
        assert!(parse_document(doc.as_bytes()).is_ok());
        let doc =
            r#"{"deployments":[{"name":"a","cluster":"x y","model":"m","provider":"openai"}]}"#;
        assert_eq!(error(doc).field(), "deployments[0].cluster");
    }

    #[test]
    fn retry_on_is_a_list_of_error_statuses_for_the_retry_fallback() {
        let doc = |retry_on: &str, fallback: &str| {
            format!(
                r#"{{"fallback":"{fallback}","deployments":[{{"name":"a","cluster":"c","model":"m","provider":"openai"}}],
                   "groups":[{{"name":"g","deployments":[{{"deployment":"a"}}]{retry_on}}}]}}"#
            )
        };
        let set = parse_document(doc("", "retry").as_bytes()).unwrap();
        let g = set.global().unwrap().group("g").unwrap().clone();
        assert_eq!(g.retry_on, RetryOn::RateLimitedAndServerErrors);
        for (status, yes) in [
            (429, true),
            (500, true),
            (599, true),
            (400, false),
            (404, false),
        ] {
            assert_eq!(g.retry_on.matches(status), yes, "{status}");
        }
        let set = parse_document(doc(r#","retry_on":[429,500]"#, "retry").as_bytes()).unwrap();
        let g = set.global().unwrap().group("g").unwrap().clone();
        assert!(g.retry_on.matches(500) && g.retry_on.matches(429));
        assert!(!g.retry_on.matches(503) && !g.retry_on.matches(502));
        for bad in [
            r#","retry_on":[]"#,
            r#","retry_on":[200]"#,
            r#","retry_on":[600]"#,
        ] {
            assert_eq!(
                error(&doc(bad, "retry")).field(),
                "groups[0].retry_on",
                "{bad}"
            );
        }
        let err = error(&doc(r#","retry_on":[500]"#, "redirect"));
        assert_eq!(err.field(), "groups[0].retry_on");
        assert!(err.reason().contains("retry"), "{err}");
        assert!(parse_document(doc(r#","retry_on":["500"]"#, "retry").as_bytes()).is_err());
    }

    #[test]
    fn max_cooldown_defaults_to_a_minute_and_is_bounded() {
        assert_eq!(example().max_cooldown_ms, DEFAULT_MAX_COOLDOWN_MS);
        let set = parse_document(br#"{"max_cooldown_ms":0}"#).unwrap();
        assert_eq!(set.global().unwrap().max_cooldown_ms, 0);
        assert_eq!(
            error(r#"{"max_cooldown_ms":86400001}"#).field(),
            "max_cooldown_ms"
        );
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = error(
            r#"{"deployments":[{"name":"a","cluster":"c","model":"m","provider":"openai","credentail":"x"}]}"#,
        );
        assert!(err.reason().contains("credentail"), "{err}");
        assert!(error(r#"{"provider":"x"}"#).reason().contains("provider"));
    }

    #[test]
    fn the_upstream_role_needs_no_deployments_of_its_own() {
        // one source of truth: the listener's document has them (same VM), the upstream
        // role's may be just its role
        let rules = parse_document(br#"{"role": "upstream"}"#).unwrap();
        let config = rules.global().unwrap();
        assert_eq!(config.role, Role::Upstream);
        assert!(config.deployments.is_empty() && config.groups.is_empty());
    }
}
