//! token-ratelimit configuration: raw serde form, then validation into [`Config`].
//!
//! ```json
//! {
//!   "default_max_tokens": 1024,
//!   "limits": [
//!     {"name": "key-tpm", "by": ["key"], "tokens": 100000, "per": "minute"},
//!     {"name": "tenant-smart-rpm", "by": ["tenant", "model_group"], "requests": 600,
//!      "per": "minute", "model_groups": ["smart"]},
//!     {"name": "ip-rps", "by": ["ip"], "requests": 20, "per": "second"}
//!   ],
//!   "budgets": [
//!     {"name": "tenant-month", "by": "tenant", "period": "month", "tokens": 50000000},
//!     {"name": "user-day", "by": "user", "period": "day", "money": "25.00",
//!      "currency": "USD", "on_redis_failure": "allow", "warn_at": [80, 95]}
//!   ],
//!   "redis": {"service": "outbound|6379||redis.static", "timeout_ms": 50},
//!   // or, on any proxy-wasm host, over HTTP to webdis:
//!   // "redis": {"transport": "http", "cluster": "webdis", "auth": "gateway:secret"},
//!   "lease": {"batch_percent": 5, "sync_ms": 100, "emergency_percent": 10},
//!   "clock": "redis",
//!   "reservation_ttl_ms": 3600000,
//!   "journal_capacity": 1024,
//!   "prompt_margin_percent": 10,
//!   "prices": {"gpt-4o-mini": {"currency": "USD", "input": 150000, "output": 600000}},
//!   "tokenizer_sample_bytes": 8192,
//!   "usage_filter_state": "llm_usage",
//!   "reentry": true
//! }
//! ```
//! Every field is described in the README. Limits are soft (buckets per instance, leased from
//! Redis); budgets are hard (reserved atomically in Redis; per instance without `redis`).
//! Redis is reached through Higress's Redis calls (`transport: "higress"`, the Higress build)
//! or over HTTP through a webdis cluster (`transport: "http"`, every build).

use llm_gateway_shared::config::{self, validate_name, ConfigError};
use llm_gateway_shared::price::{MicroPrice, Price};
use llm_gateway_shared::redis::{check_transport, RedisFields, TransportName};
use llm_gateway_shared::rules::RuleSet;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap};

/// The Redis connection, validated as key-auth's and usage-accounting's are: service or
/// webdis cluster, transport, credentials, timeout.
pub use llm_gateway_shared::redis::{RedisConfig, RedisTransport};

/// The most limits and budgets in one scope (each costs work on every request).
pub const MAX_LIMITS: usize = 32;
/// The most budgets in one scope (one Redis call checks them all).
pub const MAX_BUDGETS: usize = 8;
/// The most tiers one limit or budget names.
pub const MAX_TIERS: usize = 32;

/// This build has Higress's Redis calls (the Higress build). Every build has the HTTP transport.
pub const REDIS_TRANSPORT: bool = cfg!(feature = "higress");

/// What a limit or a budget is counted per.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// The virtual key (`x-llm-key-id`, set by key-auth).
    Key,
    /// The consumer (`x-llm-consumer`).
    Consumer,
    /// The tenant (`x-llm-tenant`).
    Tenant,
    /// The model group (`x-llm-model-group`, set by the model router).
    ModelGroup,
    /// The client address (Envoy's `source.address`, port removed).
    Ip,
    /// The end user (request header `x-user-id`, an ordinary client input: use it only below
    /// a consumer or tenant budget).
    User,
}

impl Dimension {
    /// Name in keys, metrics and errors.
    pub fn as_str(self) -> &'static str {
        match self {
            Dimension::Key => "key",
            Dimension::Consumer => "consumer",
            Dimension::Tenant => "tenant",
            Dimension::ModelGroup => "model_group",
            Dimension::Ip => "ip",
            Dimension::User => "user",
        }
    }
}

/// What a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// One per request.
    Requests,
    /// Estimated prompt tokens + the output cap, settled to the real total.
    Tokens,
}

/// A soft rate limit: a token bucket of `amount` per `window_ms`, full at first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// Name in errors, headers, metrics and Redis keys.
    pub name: String,
    /// What the bucket is kept per (all of them: one bucket per combination).
    pub by: Vec<Dimension>,
    /// Requests or tokens.
    pub unit: Unit,
    /// Capacity and refill per window for a request without a tier or of a tier not in
    /// `tiers`.
    pub amount: u64,
    /// Capacity and refill per window by tier (`x-llm-tier`).
    pub tiers: BTreeMap<String, u64>,
    /// The window, milliseconds.
    pub window_ms: u64,
    /// Model groups the limit applies to (empty: all).
    pub model_groups: Vec<String>,
}

impl Limit {
    /// True if the limit applies to a request of `group`.
    pub fn applies_to(&self, group: Option<&str>) -> bool {
        applies_to(&self.model_groups, group)
    }

    /// The amount for a request of `tier`: its tier's, else the limit's own.
    pub fn amount_for(&self, tier: Option<&str>) -> u64 {
        amount_for(self.amount, &self.tiers, tier)
    }

    /// True if `amount` is one this limit can have (its own or a tier's).
    pub fn has_amount(&self, amount: u64) -> bool {
        self.amount == amount || self.tiers.values().any(|a| *a == amount)
    }
}

fn applies_to(model_groups: &[String], group: Option<&str>) -> bool {
    model_groups.is_empty() || group.is_some_and(|g| model_groups.iter().any(|m| m == g))
}

fn amount_for(default: u64, tiers: &BTreeMap<String, u64>, tier: Option<&str>) -> u64 {
    tier.and_then(|t| tiers.get(t)).copied().unwrap_or(default)
}

/// How a budget's period resets (UTC calendar).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    /// Every hour.
    Hour,
    /// Every day.
    Day,
    /// Every calendar month.
    Month,
    /// Never.
    Total,
}

/// What a budget counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetUnit {
    /// Prompt + completion tokens.
    Tokens,
    /// Nano-units (10⁻⁹) of a currency, priced with the deployment's price.
    Money {
        /// ISO 4217 code; the deployment's price must be in it.
        currency: String,
    },
}

/// What to do with a budget when Redis cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnRedisFailure {
    /// Refuse the request (503).
    Reject,
    /// Serve it, journal the charge in shared data and replay it once Redis is back.
    Allow,
}

/// A hard budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    /// Name in errors, headers, metrics and Redis keys.
    pub name: String,
    /// The level: whose budget it is.
    pub by: Dimension,
    /// When it resets.
    pub period: Period,
    /// Tokens or money.
    pub unit: BudgetUnit,
    /// The amount per period (tokens, or nano-units) for a request without a tier or of a
    /// tier not in `tiers`.
    pub amount: u64,
    /// The amount per period by tier (`x-llm-tier`), in the same unit.
    pub tiers: BTreeMap<String, u64>,
    /// Model groups whose requests the budget counts (empty: all).
    pub model_groups: Vec<String>,
    /// Redis unreachable.
    pub on_redis_failure: OnRedisFailure,
    /// Soft thresholds, percent of the amount, ascending: crossing one raises a metric and
    /// the response header `x-llm-budget-warning`.
    pub warn_at: Vec<u8>,
}

impl Budget {
    /// True if the budget counts a request of `group`.
    pub fn applies_to(&self, group: Option<&str>) -> bool {
        applies_to(&self.model_groups, group)
    }

    /// The amount for a request of `tier`: its tier's, else the budget's own.
    pub fn amount_for(&self, tier: Option<&str>) -> u64 {
        amount_for(self.amount, &self.tiers, tier)
    }
}

/// Where "now" comes from for the central buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Clock {
    /// Redis `TIME` (one clock for the fleet; the default).
    Redis,
    /// The gateway's clock, passed to the scripts (instances' clocks must agree).
    Gateway,
}

/// Leasing from Redis and failing open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    /// A lease asks for this percent of a limit's amount (at least one request's cost).
    pub batch_percent: u8,
    /// The sync worker tops a bucket up when it falls below this percent of a batch.
    pub low_percent: u8,
    /// Tick period of the sync worker.
    pub sync_ms: u32,
    /// Redis unreachable: after the leased tokens are spent, each instance admits up to this
    /// percent of each limit on its own (capacity and refill rate).
    pub emergency_percent: u8,
    /// How long Redis stays marked down after a failed call before it is tried again.
    pub retry_ms: u32,
}

/// The validated configuration for one scope.
#[derive(Debug, Clone)]
pub struct Config {
    /// Injected as the output cap when the client sent none.
    pub default_max_tokens: u64,
    /// Soft limits.
    pub limits: Vec<Limit>,
    /// Hard budgets, checked together.
    pub budgets: Vec<Budget>,
    /// Redis (Higress build); none: everything per instance in shared data.
    pub redis: Option<RedisConfig>,
    /// Leasing.
    pub lease: LeaseConfig,
    /// Clock of the central buckets.
    pub clock: Clock,
    /// A reservation not reconciled within this time expires in Redis, still charged.
    pub reservation_ttl_ms: u64,
    /// Budget operations kept in shared data while Redis is down (more: refused).
    pub journal_capacity: usize,
    /// Largest request body inspected.
    pub max_body_bytes: usize,
    /// Reservations raise the prompt estimate by this percent (a provider may count a few
    /// more tokens than the gateway's tokenizer).
    pub prompt_margin_percent: u8,
    /// Prices for money budgets when the model router publishes none (chains without the
    /// router), by model group or model name.
    pub prices: crate::fxhash::FxHashMap<String, Price>,
    /// The tokenizer counts at most this much of a prompt's text; the rest is counted at the
    /// rate it measured (0: count everything).
    pub tokenizer_sample_bytes: usize,
    /// Where usage-accounting publishes its record: `wasm.<usage_filter_state>`; the same
    /// name as usage-accounting's `filter_state`.
    pub usage_filter_state: String,
    /// Watch for an internal redirect superseding the pass (`response.code_details` read at
    /// `on_log`; a superseded pass settles nothing and stashes its admission for the next):
    /// the fallback of Higress and `envoy-config/gateway-1.36.yaml`. `false` where the
    /// fallback is the router's retries (`envoy-config/gateway.yaml`): every pass is final
    /// there, and the read is saved.
    pub reentry: bool,
}

impl Config {
    /// The price of a request for money budgets: the router's (its ceiling over the plan,
    /// else the deployment's), else this table's by model group, then by model name.
    pub fn price_for(
        &self,
        router: Option<&Price>,
        model_group: Option<&str>,
        model: Option<&str>,
    ) -> Option<Price> {
        router.cloned().or_else(|| {
            [model_group, model]
                .into_iter()
                .flatten()
                .find_map(|k| self.prices.get(k).cloned())
        })
    }
}

impl Config {
    /// True if the request needs no body inspection at all.
    pub fn is_empty(&self) -> bool {
        self.limits.is_empty() && self.budgets.is_empty()
    }

    /// True if some limit counts per client address (`by: ip`; budgets never do): only then
    /// does a request's `source.address` matter.
    pub fn counts_ip(&self) -> bool {
        self.limits.iter().any(|l| l.by.contains(&Dimension::Ip))
    }

    /// True if some limit or budget counts tokens or money (so the body must be read).
    pub fn counts_tokens(&self) -> bool {
        self.limits.iter().any(|l| l.unit == Unit::Tokens) || !self.budgets.is_empty()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default = "default_max_tokens")]
    default_max_tokens: u64,
    #[serde(default)]
    limits: Vec<RawLimit>,
    #[serde(default)]
    budgets: Vec<RawBudget>,
    #[serde(default)]
    redis: Option<RawRedis>,
    #[serde(default)]
    lease: RawLease,
    #[serde(default = "default_clock")]
    clock: Clock,
    #[serde(default = "default_reservation_ttl")]
    reservation_ttl_ms: u64,
    #[serde(default = "default_journal_capacity")]
    journal_capacity: usize,
    #[serde(default = "default_max_body")]
    max_body_bytes: usize,
    #[serde(default = "default_margin")]
    prompt_margin_percent: u8,
    #[serde(default)]
    prices: crate::fxhash::FxHashMap<String, MicroPrice>,
    #[serde(default = "default_sample")]
    tokenizer_sample_bytes: usize,
    #[serde(default = "default_usage_filter_state")]
    usage_filter_state: String,
    #[serde(default = "config::default_true")]
    reentry: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    name: String,
    by: OneOrMany,
    #[serde(default)]
    requests: Option<u64>,
    #[serde(default)]
    tokens: Option<u64>,
    per: Window,
    #[serde(default)]
    model_groups: Vec<String>,
    #[serde(default)]
    tiers: BTreeMap<String, u64>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(Dimension),
    Many(Vec<Dimension>),
}

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum Window {
    Second,
    Minute,
    Hour,
    Day,
}

impl Window {
    fn ms(self) -> u64 {
        match self {
            Window::Second => 1_000,
            Window::Minute => 60_000,
            Window::Hour => 3_600_000,
            Window::Day => 86_400_000,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBudget {
    name: String,
    by: Dimension,
    period: Period,
    #[serde(default)]
    tokens: Option<u64>,
    #[serde(default)]
    money: Option<String>,
    #[serde(default)]
    currency: Option<String>,
    #[serde(default)]
    tiers: BTreeMap<String, RawAmount>,
    #[serde(default)]
    model_groups: Vec<String>,
    #[serde(default = "default_on_failure")]
    on_redis_failure: OnRedisFailure,
    #[serde(default)]
    warn_at: Vec<u8>,
}

/// A tier's budget amount: tokens (a number) or money (a decimal string, as `money`).
#[derive(Deserialize)]
#[serde(untagged)]
enum RawAmount {
    Tokens(u64),
    Money(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRedis {
    #[serde(default)]
    transport: TransportName,
    #[serde(default)]
    service: Option<String>,
    #[serde(default)]
    cluster: Option<String>,
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default = "default_timeout")]
    timeout_ms: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLease {
    #[serde(default = "default_batch_percent")]
    batch_percent: u8,
    #[serde(default = "default_low_percent")]
    low_percent: u8,
    #[serde(default = "default_sync_ms")]
    sync_ms: u32,
    #[serde(default = "default_emergency_percent")]
    emergency_percent: u8,
    #[serde(default = "default_retry_ms")]
    retry_ms: u32,
}

impl Default for RawLease {
    fn default() -> Self {
        RawLease {
            batch_percent: default_batch_percent(),
            low_percent: default_low_percent(),
            sync_ms: default_sync_ms(),
            emergency_percent: default_emergency_percent(),
            retry_ms: default_retry_ms(),
        }
    }
}

fn default_max_tokens() -> u64 {
    4096
}
fn default_clock() -> Clock {
    Clock::Redis
}
fn default_reservation_ttl() -> u64 {
    3_600_000
}
fn default_journal_capacity() -> usize {
    1024
}
fn default_max_body() -> usize {
    8 << 20
}
fn default_usage_filter_state() -> String {
    llm_gateway_shared::usage_record::PROPERTY.to_string()
}
fn default_sample() -> usize {
    8192
}
fn default_margin() -> u8 {
    10
}
fn default_on_failure() -> OnRedisFailure {
    OnRedisFailure::Reject
}
fn parse_redis(r: RawRedis) -> Result<RedisConfig, ConfigError> {
    check_transport(
        "redis",
        r.transport,
        REDIS_TRANSPORT,
        "use `\"transport\": \"http\"` with a webdis cluster, the Higress build (dist/higress/token-ratelimit.wasm), or remove `redis` to keep limits and budgets per instance",
    )?;
    RedisConfig::parse(
        "redis",
        RedisFields {
            transport: r.transport,
            service: r.service,
            cluster: r.cluster,
            auth: r.auth,
            username: r.username,
            password: r.password,
            timeout_ms: r.timeout_ms,
        },
    )
}

fn default_timeout() -> u32 {
    100
}
fn default_batch_percent() -> u8 {
    5
}
fn default_low_percent() -> u8 {
    50
}
fn default_sync_ms() -> u32 {
    100
}
fn default_emergency_percent() -> u8 {
    10
}
fn default_retry_ms() -> u32 {
    1_000
}

/// Parses the plugin's configuration document (plain or Higress `_rules_` form).
///
/// A limit or budget name is its identity: its buckets, Redis keys and metrics are named by
/// it. Scopes may each list a limit, but one name must mean the same limit everywhere (else
/// two routes with different numbers would share one bucket).
pub fn parse_document(document: &[u8]) -> Result<RuleSet<Config>, ConfigError> {
    let rules = RuleSet::parse(document, |fields, _scope| parse_scope(fields))?;
    let mut limits: HashMap<&str, &Limit> = HashMap::new();
    let mut budgets: HashMap<&str, &Budget> = HashMap::new();
    for config in rules.configs() {
        for limit in &config.limits {
            let seen = limits.entry(&limit.name).or_insert(limit);
            if (
                &seen.by,
                seen.unit,
                seen.amount,
                &seen.tiers,
                seen.window_ms,
            ) != (
                &limit.by,
                limit.unit,
                limit.amount,
                &limit.tiers,
                limit.window_ms,
            ) {
                return Err(ConfigError::new(
                    format!("limits.{}", limit.name),
                    "one name, one limit: a name used in several scopes must have the same by, unit, amount, tiers and per (use another name)",
                ));
            }
        }
        for budget in &config.budgets {
            let seen = budgets.entry(&budget.name).or_insert(budget);
            if (seen.by, seen.period, &seen.unit, seen.amount, &seen.tiers)
                != (
                    budget.by,
                    budget.period,
                    &budget.unit,
                    budget.amount,
                    &budget.tiers,
                )
            {
                return Err(ConfigError::new(
                    format!("budgets.{}", budget.name),
                    "one name, one budget: a name used in several scopes must have the same by, period, unit, amount and tiers (use another name)",
                ));
            }
        }
    }
    Ok(rules)
}

/// Tier names are `x-llm-tier` values (key-auth's `tier`): checked as key-auth checks them.
fn validate_tiers<'a>(names: impl ExactSizeIterator<Item = &'a String>) -> Result<(), ConfigError> {
    if names.len() > MAX_TIERS {
        return Err(ConfigError::new(
            "tiers",
            format!("at most {MAX_TIERS} tiers"),
        ));
    }
    for name in names {
        validate_name(&format!("tiers.{name}"), name)?;
    }
    Ok(())
}

/// Names of limits and budgets are parts of keys: letters, digits, `-`, `_`, `.`.
fn validate_key_name(value: &str) -> Result<(), ConfigError> {
    validate_name("name", value)?;
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(ConfigError::new(
            "name",
            format!("character {bad:?} not allowed (use letters, digits and -_.)"),
        ));
    }
    Ok(())
}

fn parse_scope(fields: &Map<String, Value>) -> Result<Config, ConfigError> {
    let raw: RawConfig = config::from_value("", Value::Object(fields.clone()))?;
    if raw.default_max_tokens == 0 || raw.default_max_tokens > 10_000_000 {
        return Err(ConfigError::new(
            "default_max_tokens",
            "must be between 1 and 10000000",
        ));
    }
    if raw.limits.len() > MAX_LIMITS {
        return Err(ConfigError::new(
            "limits",
            format!("at most {MAX_LIMITS} limits"),
        ));
    }
    if raw.budgets.len() > MAX_BUDGETS {
        return Err(ConfigError::new(
            "budgets",
            format!("at most {MAX_BUDGETS} budgets"),
        ));
    }
    let mut limits = Vec::with_capacity(raw.limits.len());
    for (i, limit) in raw.limits.into_iter().enumerate() {
        let limit = parse_limit(limit).map_err(|e| e.within(&format!("limits[{i}]")))?;
        if limits.iter().any(|l: &Limit| l.name == limit.name) {
            return Err(ConfigError::new(
                format!("limits[{i}].name"),
                "names must be unique",
            ));
        }
        limits.push(limit);
    }
    let mut budgets = Vec::with_capacity(raw.budgets.len());
    for (i, budget) in raw.budgets.into_iter().enumerate() {
        let budget = parse_budget(budget).map_err(|e| e.within(&format!("budgets[{i}]")))?;
        if budgets.iter().any(|b: &Budget| b.name == budget.name) {
            return Err(ConfigError::new(
                format!("budgets[{i}].name"),
                "names must be unique",
            ));
        }
        budgets.push(budget);
    }
    if raw.usage_filter_state.is_empty()
        || !raw
            .usage_filter_state
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(ConfigError::new(
            "usage_filter_state",
            "must be a non-empty name of letters, digits, _ and - (usage-accounting's `filter_state`)",
        ));
    }
    let redis = match raw.redis {
        None => None,
        Some(r) => Some(parse_redis(r)?),
    };
    let lease = parse_lease(&raw.lease)?;
    if raw.reservation_ttl_ms < 1_000 || raw.reservation_ttl_ms > 7 * 86_400_000 {
        return Err(ConfigError::new(
            "reservation_ttl_ms",
            "must be between 1000 and 604800000 (7 days)",
        ));
    }
    if raw.journal_capacity == 0 || raw.journal_capacity > 100_000 {
        return Err(ConfigError::new(
            "journal_capacity",
            "must be between 1 and 100000",
        ));
    }
    if raw.prompt_margin_percent > 100 {
        return Err(ConfigError::new(
            "prompt_margin_percent",
            "must be between 0 and 100",
        ));
    }
    let mut prices = crate::fxhash::FxHashMap::default();
    for (name, price) in raw.prices {
        validate_name(&format!("prices.{name}"), &name)?;
        let price = Price::from(price);
        price
            .validate()
            .map_err(|e| e.within(&format!("prices.{name}")))?;
        prices.insert(name, price);
    }
    if raw.max_body_bytes == 0 {
        return Err(ConfigError::new("max_body_bytes", "must be positive"));
    }
    Ok(Config {
        default_max_tokens: raw.default_max_tokens,
        limits,
        budgets,
        redis,
        lease,
        clock: raw.clock,
        reservation_ttl_ms: raw.reservation_ttl_ms,
        journal_capacity: raw.journal_capacity,
        max_body_bytes: raw.max_body_bytes,
        prompt_margin_percent: raw.prompt_margin_percent,
        prices,
        tokenizer_sample_bytes: match raw.tokenizer_sample_bytes {
            0 => usize::MAX,
            n => n,
        },
        usage_filter_state: raw.usage_filter_state,
        reentry: raw.reentry,
    })
}

fn parse_limit(raw: RawLimit) -> Result<Limit, ConfigError> {
    validate_key_name(&raw.name)?;
    let mut by = match raw.by {
        OneOrMany::One(d) => vec![d],
        OneOrMany::Many(v) => v,
    };
    if by.is_empty() || by.len() > 4 {
        return Err(ConfigError::new("by", "must name 1 to 4 dimensions"));
    }
    by.sort();
    by.dedup();
    let (unit, amount) = match (raw.requests, raw.tokens) {
        (Some(n), None) => (Unit::Requests, n),
        (None, Some(n)) => (Unit::Tokens, n),
        _ => {
            return Err(ConfigError::new(
                "requests",
                "exactly one of `requests` and `tokens` is required",
            ))
        }
    };
    let in_range = |field: &str, amount: u64| {
        if amount == 0 || amount > 1 << 40 {
            Err(ConfigError::new(field, "must be between 1 and 2^40"))
        } else {
            Ok(())
        }
    };
    in_range(
        if unit == Unit::Requests {
            "requests"
        } else {
            "tokens"
        },
        amount,
    )?;
    validate_tiers(raw.tiers.keys())?;
    for (tier, amount) in &raw.tiers {
        in_range(&format!("tiers.{tier}"), *amount)?;
    }
    for (i, group) in raw.model_groups.iter().enumerate() {
        validate_name(&format!("model_groups[{i}]"), group)?;
    }
    Ok(Limit {
        name: raw.name,
        by,
        unit,
        amount,
        tiers: raw.tiers,
        window_ms: raw.per.ms(),
        model_groups: raw.model_groups,
    })
}

fn parse_budget(raw: RawBudget) -> Result<Budget, ConfigError> {
    validate_key_name(&raw.name)?;
    if matches!(raw.by, Dimension::Ip | Dimension::ModelGroup) {
        return Err(ConfigError::new(
            "by",
            "a budget belongs to a tenant, consumer, key or user",
        ));
    }
    let (unit, amount) = match (raw.tokens, raw.money, raw.currency) {
        (Some(n), None, None) => (BudgetUnit::Tokens, n),
        (None, Some(money), currency) => {
            let currency = currency.unwrap_or_else(|| "USD".to_string());
            if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(ConfigError::new(
                    "currency",
                    "must be a three-letter ISO 4217 code",
                ));
            }
            let nano = parse_money(&money).ok_or_else(|| {
                ConfigError::new(
                    "money",
                    "must be a decimal amount such as \"25\" or \"0.50\" (at most 9 decimals)",
                )
            })?;
            (BudgetUnit::Money { currency }, nano)
        }
        (Some(_), _, _) | (None, None, Some(_)) | (None, None, None) => {
            return Err(ConfigError::new(
                "tokens",
                "exactly one of `tokens` and `money` is required (`currency` goes with `money`)",
            ))
        }
    };
    let in_range = |field: &str, amount: u64| {
        if amount == 0 || amount > 1 << 52 {
            Err(ConfigError::new(
                field,
                "must be positive and below 2^52 (Redis scripts count in doubles)",
            ))
        } else {
            Ok(())
        }
    };
    in_range(
        if unit == BudgetUnit::Tokens {
            "tokens"
        } else {
            "money"
        },
        amount,
    )?;
    validate_tiers(raw.tiers.keys())?;
    let mut tiers = BTreeMap::new();
    for (tier, raw_amount) in raw.tiers {
        let field = format!("tiers.{tier}");
        let amount = match (&unit, raw_amount) {
            (BudgetUnit::Tokens, RawAmount::Tokens(n)) => n,
            (BudgetUnit::Money { .. }, RawAmount::Money(text)) => {
                parse_money(&text).ok_or_else(|| {
                    ConfigError::new(
                        &field,
                        "must be a decimal amount such as \"25\" or \"0.50\" (at most 9 decimals), as `money`",
                    )
                })?
            }
            (BudgetUnit::Tokens, RawAmount::Money(_)) => {
                return Err(ConfigError::new(
                    &field,
                    "a tokens budget's tiers are numbers of tokens",
                ))
            }
            (BudgetUnit::Money { .. }, RawAmount::Tokens(_)) => {
                return Err(ConfigError::new(
                    &field,
                    "a money budget's tiers are decimal strings such as \"25.00\", as `money`",
                ))
            }
        };
        in_range(&field, amount)?;
        tiers.insert(tier, amount);
    }
    for (i, group) in raw.model_groups.iter().enumerate() {
        validate_name(&format!("model_groups[{i}]"), group)?;
    }
    let mut warn_at = raw.warn_at;
    if warn_at.iter().any(|p| *p == 0 || *p >= 100) {
        return Err(ConfigError::new("warn_at", "percentages must be 1 to 99"));
    }
    warn_at.sort_unstable();
    warn_at.dedup();
    Ok(Budget {
        name: raw.name,
        by: raw.by,
        period: raw.period,
        unit,
        amount,
        tiers,
        model_groups: raw.model_groups,
        on_redis_failure: raw.on_redis_failure,
        warn_at,
    })
}

fn parse_lease(raw: &RawLease) -> Result<LeaseConfig, ConfigError> {
    let percent = |field: &str, value: u8, min: u8| {
        if value < min || value > 100 {
            Err(ConfigError::new(
                format!("lease.{field}"),
                format!("must be between {min} and 100"),
            ))
        } else {
            Ok(value)
        }
    };
    Ok(LeaseConfig {
        batch_percent: percent("batch_percent", raw.batch_percent, 1)?,
        low_percent: percent("low_percent", raw.low_percent, 0)?,
        sync_ms: if (10..=60_000).contains(&raw.sync_ms) {
            raw.sync_ms
        } else {
            return Err(ConfigError::new(
                "lease.sync_ms",
                "must be between 10 and 60000",
            ));
        },
        emergency_percent: percent("emergency_percent", raw.emergency_percent, 0)?,
        retry_ms: if (10..=600_000).contains(&raw.retry_ms) {
            raw.retry_ms
        } else {
            return Err(ConfigError::new(
                "lease.retry_ms",
                "must be between 10 and 600000",
            ));
        },
    })
}

/// `"25"`, `"0.50"`, `"1234.000000001"` → nano-units; `None` for anything else.
pub fn parse_money(text: &str) -> Option<u64> {
    let (whole, fraction) = match text.split_once('.') {
        Some((w, f)) => (w, f),
        None => (text, ""),
    };
    if whole.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || fraction.len() > 9
        || !fraction.bytes().all(|b| b.is_ascii_digit())
        || (text.contains('.') && fraction.is_empty())
    {
        return None;
    }
    let whole: u64 = whole.parse().ok()?;
    let mut nano: u64 = 0;
    for (i, digit) in fraction.bytes().enumerate() {
        let exp = 8u32.checked_sub(u32::try_from(i).ok()?)?;
        nano += u64::from(digit - b'0') * 10u64.pow(exp);
    }
    whole.checked_mul(1_000_000_000)?.checked_add(nano)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Config, ConfigError> {
        let rules = parse_document(json.as_bytes())?;
        Ok(rules.global().expect("global config").clone())
    }

    #[test]
    fn defaults() {
        let c = parse("{}").unwrap();
        assert_eq!(c.default_max_tokens, 4096);
        assert!(c.is_empty());
        assert_eq!(c.clock, Clock::Redis);
        assert_eq!(c.lease.batch_percent, 5);
        assert!(c.redis.is_none());
    }

    #[test]
    fn limits_and_budgets() {
        let c = parse(
            r#"{"limits":[{"name":"k","by":"key","tokens":1000,"per":"minute"},
                {"name":"t","by":["tenant","model_group","tenant"],"requests":5,"per":"second","model_groups":["smart"]}],
               "budgets":[{"name":"m","by":"tenant","period":"month","tokens":100},
                {"name":"d","by":"user","period":"day","money":"2.5","warn_at":[95,80]}]}"#,
        )
        .unwrap();
        assert_eq!(c.limits[0].unit, Unit::Tokens);
        assert_eq!(c.limits[0].window_ms, 60_000);
        assert_eq!(
            c.limits[1].by,
            vec![Dimension::Tenant, Dimension::ModelGroup]
        );
        assert!(c.limits[1].applies_to(Some("smart")));
        assert!(!c.limits[1].applies_to(Some("fast")));
        assert!(!c.limits[1].applies_to(None));
        assert!(c.limits[0].applies_to(None));
        assert_eq!(c.budgets[1].amount, 2_500_000_000);
        assert_eq!(
            c.budgets[1].unit,
            BudgetUnit::Money {
                currency: "USD".into()
            }
        );
        assert_eq!(c.budgets[1].warn_at, vec![80, 95]);
        assert!(c.counts_tokens());
    }

    #[test]
    fn only_a_limit_by_ip_counts_the_client_address() {
        let config = |doc: &str| {
            let rules = parse_document(doc.as_bytes()).expect("valid");
            let first = rules.configs().next().expect("one config").clone();
            first
        };
        let by_key = r#"{"limits":[{"name":"k","by":"key","requests":1,"per":"minute"}],
            "budgets":[{"name":"b","by":"user","period":"day","tokens":1}]}"#;
        assert!(!config(by_key).counts_ip());
        let by_ip = r#"{"limits":[{"name":"k","by":"key","requests":1,"per":"minute"},
            {"name":"i","by":["tenant","ip"],"requests":1,"per":"minute"}]}"#;
        assert!(config(by_ip).counts_ip());
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                r#"{"limits":[{"name":"k","by":"key","per":"minute"}]}"#,
                "limits[0].requests",
            ),
            (
                r#"{"limits":[{"name":"k","by":"key","tokens":0,"per":"minute"}]}"#,
                "limits[0].tokens",
            ),
            (
                r#"{"limits":[{"name":"k","by":[],"tokens":1,"per":"minute"}]}"#,
                "limits[0].by",
            ),
            (
                r#"{"limits":[{"name":"k","by":"key","tokens":1,"per":"minute"},{"name":"k","by":"ip","tokens":1,"per":"minute"}]}"#,
                "limits[1].name",
            ),
            (
                r#"{"budgets":[{"name":"b","by":"ip","period":"day","tokens":1}]}"#,
                "budgets[0].by",
            ),
            (
                r#"{"budgets":[{"name":"b","by":"key","period":"day","money":"1.2.3"}]}"#,
                "budgets[0].money",
            ),
            (
                r#"{"budgets":[{"name":"b","by":"key","period":"day","money":"1","currency":"usd"}]}"#,
                "budgets[0].currency",
            ),
            (
                r#"{"budgets":[{"name":"b","by":"key","period":"day","tokens":1,"warn_at":[100]}]}"#,
                "budgets[0].warn_at",
            ),
            (r#"{"default_max_tokens":0}"#, "default_max_tokens"),
            (r#"{"lease":{"batch_percent":0}}"#, "lease.batch_percent"),
            (r#"{"lease":{"sync_ms":1}}"#, "lease.sync_ms"),
            (r#"{"journal_capacity":0}"#, "journal_capacity"),
            (r#"{"prompt_margin_percent":101}"#, "prompt_margin_percent"),
            (
                r#"{"usage_filter_state":"llm.usage"}"#,
                "usage_filter_state",
            ),
            (r#"{"usage_filter_state":""}"#, "usage_filter_state"),
            (
                r#"{"limits":[{"name":"a:b","by":"key","tokens":1,"per":"minute"}]}"#,
                "limits[0].name",
            ),
            (
                r#"{"budgets":[{"name":"a/b","by":"key","period":"day","tokens":1}]}"#,
                "budgets[0].name",
            ),
            (
                r#"{"limits":[{"name":"k","by":"key","tokens":1,"per":"minute"}],
                 "_rules_":[{"_match_route_":["r"],"limits":[{"name":"k","by":"key","tokens":2,"per":"minute"}]}]}"#,
                "limits.k",
            ),
            (
                r#"{"budgets":[{"name":"b","by":"key","period":"day","tokens":1}],
                 "_rules_":[{"_match_route_":["r"],"budgets":[{"name":"b","by":"key","period":"month","tokens":1}]}]}"#,
                "budgets.b",
            ),
        ];
        for (json, field) in cases {
            let err = parse(json).unwrap_err();
            assert_eq!(err.field(), field, "{json}: {err}");
        }
    }

    #[test]
    fn tiers_and_group_scoped_budgets() {
        let c = parse(
            r#"{"limits":[{"name":"rpm","by":"key","requests":10,"per":"minute",
                           "tiers":{"free":10,"pro":600}}],
               "budgets":[{"name":"day","by":"key","period":"day","tokens":50000,
                           "tiers":{"free":50000,"pro":2000000}},
                          {"name":"smart","by":"tenant","period":"month","money":"100",
                           "tiers":{"pro":"2500.50"},"model_groups":["smart"]}]}"#,
        )
        .unwrap();
        let rpm = &c.limits[0];
        assert_eq!(rpm.amount_for(Some("pro")), 600);
        assert_eq!(rpm.amount_for(Some("free")), 10);
        assert_eq!(
            rpm.amount_for(Some("gold")),
            10,
            "unknown tier: the default"
        );
        assert_eq!(rpm.amount_for(None), 10);
        assert!(rpm.has_amount(600) && !rpm.has_amount(11));
        assert_eq!(c.budgets[0].amount_for(Some("pro")), 2_000_000);
        let smart = &c.budgets[1];
        assert_eq!(smart.amount_for(Some("pro")), 2_500_500_000_000);
        assert_eq!(smart.amount_for(Some("free")), 100_000_000_000);
        assert!(smart.applies_to(Some("smart")));
        assert!(!smart.applies_to(Some("fast")));
        assert!(!smart.applies_to(None));
        assert!(c.budgets[0].applies_to(Some("fast")));
    }

    #[test]
    fn tier_errors_name_the_tier() {
        let cases = [
            (
                r#"{"limits":[{"name":"k","by":"key","requests":1,"per":"minute","tiers":{"free":0}}]}"#,
                "limits[0].tiers.free",
            ),
            (
                r#"{"limits":[{"name":"k","by":"key","requests":1,"per":"minute","tiers":{"pro plan":5}}]}"#,
                "limits[0].tiers.pro plan",
            ),
            (
                r#"{"budgets":[{"name":"b","by":"key","period":"day","tokens":1,"tiers":{"pro":"5"}}]}"#,
                "budgets[0].tiers.pro",
            ),
            (
                r#"{"budgets":[{"name":"b","by":"key","period":"day","money":"1","tiers":{"pro":5}}]}"#,
                "budgets[0].tiers.pro",
            ),
            (
                r#"{"budgets":[{"name":"b","by":"key","period":"day","money":"1","tiers":{"pro":"5.x"}}]}"#,
                "budgets[0].tiers.pro",
            ),
            (
                r#"{"budgets":[{"name":"b","by":"key","period":"day","tokens":1,"model_groups":[""]}]}"#,
                "budgets[0].model_groups[0]",
            ),
            (
                r#"{"limits":[{"name":"k","by":"key","tokens":1,"per":"minute","tiers":{"free":1}}],
                 "_rules_":[{"_match_route_":["r"],"limits":[{"name":"k","by":"key","tokens":1,"per":"minute","tiers":{"free":2}}]}]}"#,
                "limits.k",
            ),
            (
                r#"{"budgets":[{"name":"b","by":"key","period":"day","tokens":1}],
                 "_rules_":[{"_match_route_":["r"],"budgets":[{"name":"b","by":"key","period":"day","tokens":1,"tiers":{"pro":9}}]}]}"#,
                "budgets.b",
            ),
        ];
        for (json, field) in cases {
            let err = parse(json).unwrap_err();
            assert_eq!(err.field(), field, "{json}: {err}");
        }
        let many: Vec<String> = (0..=MAX_TIERS).map(|i| format!(r#""t{i}":1"#)).collect();
        let json = format!(
            r#"{{"limits":[{{"name":"k","by":"key","requests":1,"per":"minute","tiers":{{{}}}}}]}}"#,
            many.join(",")
        );
        assert_eq!(parse(&json).unwrap_err().field(), "limits[0].tiers");
    }

    #[test]
    fn redis_over_http_in_every_build() {
        let c = parse(r#"{"redis":{"transport":"http","cluster":"webdis","auth":"gw:s3cret"}}"#)
            .unwrap();
        let redis = c.redis.unwrap();
        assert_eq!(redis.service, "webdis");
        assert_eq!(redis.timeout_ms, 100);
        assert_eq!(
            redis.transport,
            RedisTransport::Http {
                authorization: Some("Basic Z3c6czNjcmV0".into())
            }
        );
        let c = parse(r#"{"redis":{"transport":"http","cluster":"webdis"}}"#).unwrap();
        assert_eq!(
            c.redis.unwrap().transport,
            RedisTransport::Http {
                authorization: None
            }
        );
        for (json, field) in [
            (r#"{"redis":{"transport":"http"}}"#, "redis.cluster"),
            (
                r#"{"redis":{"transport":"http","cluster":""}}"#,
                "redis.cluster",
            ),
            (
                r#"{"redis":{"transport":"http","cluster":"w","auth":"nocolon"}}"#,
                "redis.auth",
            ),
            (
                r#"{"redis":{"transport":"http","cluster":"w","auth":":pw"}}"#,
                "redis.auth",
            ),
            (
                r#"{"redis":{"transport":"http","cluster":"w","service":"s"}}"#,
                "redis.transport",
            ),
            (
                r#"{"redis":{"transport":"http","cluster":"w","password":"p"}}"#,
                "redis.transport",
            ),
            (
                r#"{"redis":{"transport":"http","cluster":"w","timeout_ms":0}}"#,
                "redis.timeout_ms",
            ),
            (
                r#"{"redis":{"transport":"tcp","cluster":"w"}}"#,
                "redis.transport",
            ),
        ] {
            let err = parse(json).unwrap_err();
            assert_eq!(err.field(), field, "{json}: {err}");
            assert!(!err.to_string().contains("pw"), "{err}");
        }
    }

    #[test]
    fn redis_only_in_the_higress_build() {
        let result = parse(r#"{"redis":{"service":"outbound|6379||redis.static"}}"#);
        if REDIS_TRANSPORT {
            assert_eq!(result.unwrap().redis.unwrap().timeout_ms, 100);
        } else {
            assert_eq!(result.unwrap_err().field(), "redis");
        }
    }

    #[test]
    fn prices_back_up_the_router() {
        let c = parse(r#"{"prices":{"fast":{"input":1,"output":2},"m":{"input":3,"output":4}}}"#)
            .unwrap();
        let router = Price::from(MicroPrice {
            currency: "USD".into(),
            input: 9,
            output: 9,
            cached_input: None,
        });
        // micro-units per million tokens in the configuration, nano-units in a Price
        assert_eq!(
            c.price_for(Some(&router), Some("fast"), None)
                .unwrap()
                .input,
            9_000
        );
        assert_eq!(
            c.price_for(None, Some("fast"), Some("m")).unwrap().input,
            1_000
        );
        assert_eq!(
            c.price_for(None, Some("x"), Some("m")).unwrap().input,
            3_000
        );
        assert!(c.price_for(None, None, None).is_none());
        assert_eq!(
            parse(r#"{"prices":{"m":{"currency":"usd","input":1,"output":2}}}"#)
                .unwrap_err()
                .field(),
            "prices.m.currency"
        );
    }

    #[test]
    fn money() {
        assert_eq!(parse_money("25"), Some(25_000_000_000));
        assert_eq!(parse_money("0.50"), Some(500_000_000));
        assert_eq!(parse_money("1.000000001"), Some(1_000_000_001));
        for bad in [
            "",
            ".5",
            "5.",
            "1.0000000001",
            "-1",
            "1e3",
            "x",
            "18446744073709551615",
        ] {
            assert_eq!(parse_money(bad), None, "{bad}");
        }
    }

    #[test]
    fn higress_rules_form() {
        let rules = parse_document(
            br#"{"limits":[{"name":"k","by":"key","tokens":10,"per":"second"}],
                 "_rules_":[{"_match_route_":["r1"],"limits":[]}]}"#,
        )
        .unwrap();
        assert_eq!(rules.configs().count(), 2);
    }
}
