//! key-auth configuration: raw serde form, then validation into [`KeyAuthConfig`].
//!
//! ```json
//! {
//!   "keys": [
//!     {"key_sha256": "<64 hex digits>", "consumer": "team-a", "tenant": "acme",
//!      "groups": ["fast", "smart"], "expires_at": "2027-01-01T00:00:00Z", "disabled": false,
//!      "id": "team-a-prod", "tier": "pro"}
//!   ],
//!   "key_sources": ["authorization", "x-api-key", "api-key"],
//!   "query_param": null,
//!   "allow": null,
//!   "global_auth": true,
//!   "reentry": true,
//!   "redis": {"service": "outbound|6379||redis.static", "prefix": "llm:key:",
//!             "cache_ttl_ms": 30000, "negative_ttl_ms": 30000},
//!   "_rules_": [{"_match_route_": ["billing"], "allow": ["team-a"]}]
//! }
//! ```
//! Only SHA-256 digests of keys ever appear in config (`scripts/hash-key` prints one).
//! With `redis` (the Higress build), a digest the config does not have is looked up in Redis:
//! one hash per digest whose fields are those of a config key ([`entry_from_hash`]).

use crate::rfc3339;
use llm_gateway_shared::config::{self, validate_name, ConfigError};
use llm_gateway_shared::json::push_hex;
use llm_gateway_shared::redis::{check_transport, RedisConfig, RedisFields, TransportName};
use llm_gateway_shared::rules::{RuleSet, Scope};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

/// Where a key is read from, in the configured order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `Authorization: Bearer <key>` (other schemes are not a key).
    Bearer,
    /// The whole value of a header (`x-api-key`, `api-key`).
    Header(String),
    /// A query parameter of `:path`, only when `query_param` is set.
    Query(String),
}

impl KeySource {
    /// The header this source reads (`authorization` for Bearer); `None` for the query.
    pub fn header_name(&self) -> Option<&str> {
        match self {
            KeySource::Bearer => Some("authorization"),
            KeySource::Header(name) => Some(name),
            KeySource::Query(_) => None,
        }
    }
}

/// One virtual key, found by the SHA-256 of its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEntry {
    /// Consumer the key authenticates as.
    pub consumer: String,
    /// Tenant of the consumer.
    pub tenant: String,
    /// The `x-llm-groups` value: the allowed model groups, comma-separated.
    pub groups: String,
    /// Unix seconds from which the key is refused.
    pub expires_at: Option<i64>,
    /// A disabled (revoked) key is refused.
    pub disabled: bool,
    /// The key's stable id: its configured `id`, else the first 16 hex digits of the digest.
    /// Names the key in headers, logs, limits and records; reveals nothing. Keys rotated under
    /// one `id` share it (and so their spend).
    pub key_id: String,
    /// The key's tier (`x-llm-tier`), if it has one.
    pub tier: Option<String>,
}

/// Keys by digest.
pub type KeyTable = HashMap<[u8; 32], KeyEntry>;

/// The validated configuration for one scope (global or one rule).
#[derive(Debug, Clone)]
pub struct KeyAuthConfig {
    /// Every key; shared between scopes that have the same `keys`.
    pub keys: Rc<KeyTable>,
    /// Where to look for the key, first hit wins.
    pub sources: Vec<KeySource>,
    /// If set, only these consumers may pass (403 for others).
    pub allow: Option<HashSet<String>>,
    /// False only for the global scope with `global_auth: false`: requests that match no rule
    /// pass unauthenticated (identity headers are still stripped).
    pub enforce: bool,
    /// The 401 message for a missing key, naming the configured sources.
    pub missing_message: String,
    /// Some key has `expires_at` (computed once here, not per request).
    any_expiry: bool,
    /// Issue and accept re-entry tickets (`crate::reentry`): the internal-redirect fallback of
    /// Higress and Envoy < 1.39 sends the request through the chain again without its key.
    pub reentry: bool,
    /// Keys the config does not have are looked up in Redis (the Higress build).
    pub store: Option<Rc<KeyStoreConfig>>,
}

impl KeyAuthConfig {
    /// True if some key expires, so a decision needs the current time.
    pub fn needs_clock(&self) -> bool {
        self.any_expiry || self.reentry || self.store.is_some()
    }
}

/// This build has Higress's Redis calls (the Higress build, cargo feature `higress`).
pub const REDIS_TRANSPORT: bool = cfg!(feature = "higress");

/// Where Redis-held keys are and how long a worker trusts what it read: the shared Redis
/// connection ([`RedisConfig`], whose fields read through: `store.service`) and key-auth's own
/// members around it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyStoreConfig {
    /// The Higress Redis service, credentials and timeout.
    pub redis: RedisConfig,
    /// A key's hash is `<prefix><digest hex>`.
    pub prefix: String,
    /// How long a key read from Redis is used without asking again: a key disabled or
    /// changed in Redis is seen by every worker within this time.
    pub cache_ttl_ms: u64,
    /// How long "no such key" is remembered: a wrong key asks Redis once per this time.
    pub negative_ttl_ms: u64,
    /// The most digests the shared cache holds (in buckets of [`crate::cache::BUCKET_WAYS`]).
    pub cache_entries: u32,
}

impl std::ops::Deref for KeyStoreConfig {
    type Target = RedisConfig;

    fn deref(&self) -> &RedisConfig {
        &self.redis
    }
}

impl KeyStoreConfig {
    /// The Redis key of a digest's hash.
    pub fn redis_key(&self, digest: &[u8; 32]) -> String {
        let mut key = String::with_capacity(self.prefix.len() + 64);
        key.push_str(&self.prefix);
        push_hex(&mut key, digest);
        key
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default = "default_sources")]
    key_sources: Vec<String>,
    #[serde(default)]
    query_param: Option<String>,
    #[serde(default)]
    allow: Option<Vec<String>>,
    #[serde(default = "config::default_true")]
    global_auth: bool,
    #[serde(default = "config::default_true")]
    reentry: bool,
    #[serde(default)]
    redis: Option<RawStore>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    #[serde(default)]
    service: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default = "default_timeout")]
    timeout_ms: u32,
    #[serde(default = "default_prefix")]
    prefix: String,
    #[serde(default = "default_ttl")]
    cache_ttl_ms: u64,
    #[serde(default)]
    negative_ttl_ms: Option<u64>,
    #[serde(default = "default_cache_entries")]
    cache_entries: u32,
}

fn default_timeout() -> u32 {
    200
}
fn default_prefix() -> String {
    "llm:key:".into()
}
fn default_ttl() -> u64 {
    30_000
}
fn default_cache_entries() -> u32 {
    262_144
}

fn parse_store(raw: RawStore) -> Result<KeyStoreConfig, ConfigError> {
    // Higress's Redis calls only: requests of a worker share one lookup, and a webdis answer
    // would go to the request that sent it alone, and be lost with it
    check_transport(
        "redis",
        TransportName::Higress,
        REDIS_TRANSPORT,
        "Redis-held keys need the Higress build (dist/higress/key-auth.wasm); plain Envoy keeps keys in `keys`",
    )?;
    let redis = RedisConfig::parse(
        "redis",
        RedisFields {
            transport: TransportName::Higress,
            service: raw.service,
            username: raw.username,
            password: raw.password,
            timeout_ms: raw.timeout_ms,
            ..RedisFields::default()
        },
    )?;
    if raw.prefix.len() > 128 || raw.prefix.bytes().any(|b| !b.is_ascii_graphic()) {
        return Err(ConfigError::new(
            "redis.prefix",
            "must be at most 128 printable ASCII characters without spaces",
        ));
    }
    let negative_ttl_ms = raw.negative_ttl_ms.unwrap_or(raw.cache_ttl_ms);
    for (field, ttl) in [
        ("redis.cache_ttl_ms", raw.cache_ttl_ms),
        ("redis.negative_ttl_ms", negative_ttl_ms),
    ] {
        if ttl == 0 || ttl > 86_400_000 {
            return Err(ConfigError::new(
                field,
                "must be between 1 and 86400000 (a day)",
            ));
        }
    }
    if !(64..=16_777_216).contains(&raw.cache_entries) {
        return Err(ConfigError::new(
            "redis.cache_entries",
            "must be between 64 and 16777216",
        ));
    }
    Ok(KeyStoreConfig {
        redis,
        prefix: raw.prefix,
        cache_ttl_ms: raw.cache_ttl_ms,
        negative_ttl_ms,
        cache_entries: raw.cache_entries,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    key_sha256: String,
    consumer: String,
    #[serde(default = "default_tenant")]
    tenant: String,
    groups: Vec<String>,
    #[serde(default)]
    expires_at: Option<String>,
    #[serde(default)]
    disabled: bool,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    tier: Option<String>,
}

fn default_sources() -> Vec<String> {
    vec!["authorization".into(), "x-api-key".into(), "api-key".into()]
}

fn default_tenant() -> String {
    "default".into()
}

/// Parses a whole configuration document (plain JSON or Higress form).
pub fn parse_document(document: &[u8]) -> Result<RuleSet<KeyAuthConfig>, ConfigError> {
    // Top-level `keys` are read straight from the bytes into keys, never into a JSON tree: at
    // 100 000 keys the tree and its copies were most of a VM's memory (README, "Many keys").
    // The rest of the document (small) then goes the usual way, with `keys: null` standing
    // for the table built here. A document that does not read this way (a bad key, not an
    // object) goes the usual way whole, for the usual errors.
    if let Ok(Streamed {
        keys: Some(StreamedTable(table)),
        mut rest,
    }) = serde_json::from_slice::<Streamed>(document)
    {
        let streamed = Rc::new(table);
        rest.insert("keys".into(), Value::Null);
        let rest = serde_json::to_vec(&Value::Object(rest))
            .map_err(|e| ConfigError::new("", e.to_string()))?;
        let mut built = None;
        return RuleSet::parse(&rest, |fields, scope| {
            parse_scope(fields, scope, &mut built, &streamed)
        });
    }
    // Rules inherit the global `keys`; build the table once and share it when a scope's
    // `keys` are the same JSON value.
    let mut built: Option<(Value, Rc<KeyTable>)> = None;
    let none = Rc::new(KeyTable::new());
    RuleSet::parse(document, |fields, scope| {
        parse_scope(fields, scope, &mut built, &none)
    })
}

/// The document's top-level `keys`, read without a JSON tree, and everything else.
#[derive(Deserialize)]
struct Streamed {
    #[serde(default)]
    keys: Option<StreamedTable>,
    #[serde(flatten)]
    rest: Map<String, Value>,
}

/// A key table built one key at a time as the array is read: no key is held longer than its
/// own validation. Any key the config would refuse fails the read (its message is not the
/// config's: [`parse_document`] then reads the document the usual way, whose error names the
/// field).
struct StreamedTable(KeyTable);

impl<'de> Deserialize<'de> for StreamedTable {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(TableVisitor)
    }
}

struct TableVisitor;

impl<'de> serde::de::Visitor<'de> for TableVisitor {
    type Value = StreamedTable;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an array of keys")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> Result<StreamedTable, A::Error> {
        use serde::de::Error;
        let mut table = KeyTable::with_capacity(seq.size_hint().unwrap_or(0));
        // id -> (consumer, tenant) of its first key
        let mut ids: HashMap<String, (String, String)> = HashMap::new();
        let refused = || A::Error::custom("a key the config refuses");
        while let Some(key) = seq.next_element::<RawKey>()? {
            let digest = parse_digest(&key.key_sha256).map_err(|_| refused())?;
            let entry = validate_key(&key, &digest, &|field: &str| field.to_string())
                .map_err(|_| refused())?;
            if let Some(id) = key.id {
                match ids.get(&id) {
                    Some(first) if (&first.0, &first.1) != (&key.consumer, &key.tenant) => {
                        return Err(refused())
                    }
                    Some(_) => {}
                    None => {
                        ids.insert(id, (key.consumer, key.tenant));
                    }
                }
            }
            if table.insert(digest, entry).is_some() {
                return Err(refused()); // a duplicate digest
            }
        }
        Ok(StreamedTable(table))
    }
}

/// A scope's own `keys`, read from its JSON value.
#[derive(Deserialize)]
struct KeysOnly {
    keys: Vec<RawKey>,
}

/// One scope's config. `streamed`: the table of a `keys: null` (the top-level keys read by
/// [`parse_document`]), or of a scope without `keys`.
fn parse_scope(
    fields: &Map<String, Value>,
    scope: Scope,
    built: &mut Option<(Value, Rc<KeyTable>)>,
    streamed: &Rc<KeyTable>,
) -> Result<KeyAuthConfig, ConfigError> {
    let others: Map<String, Value> = fields
        .iter()
        .filter(|(name, _)| *name != "keys")
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let raw: RawConfig = config::from_value("", Value::Object(others))?;

    let keys = match fields.get("keys") {
        None | Some(Value::Null) => Rc::clone(streamed),
        Some(value) => match built {
            Some((seen, table)) if seen == value => Rc::clone(table),
            _ => {
                let own: KeysOnly = config::from_value(
                    "",
                    Value::Object(Map::from_iter([("keys".to_string(), value.clone())])),
                )?;
                let table = Rc::new(key_table(&own.keys)?);
                *built = Some((value.clone(), Rc::clone(&table)));
                table
            }
        },
    };

    let sources = key_sources(&raw.key_sources, raw.query_param.as_deref())?;
    let store = match raw.redis {
        None => None,
        Some(raw) => Some(Rc::new(parse_store(raw)?)),
    };
    let allow = match raw.allow {
        None => None,
        Some(names) => Some(allow_list(&names, &keys, store.is_some())?),
    };
    let missing_message = missing_message(&sources);
    let any_expiry = keys.values().any(|k| k.expires_at.is_some());
    Ok(KeyAuthConfig {
        any_expiry,
        keys,
        sources,
        allow,
        enforce: match scope {
            Scope::Global => raw.global_auth,
            Scope::Rule(_) => true,
        },
        missing_message,
        reentry: raw.reentry,
        store,
    })
}

fn key_table(raw: &[RawKey]) -> Result<KeyTable, ConfigError> {
    let mut table = KeyTable::with_capacity(raw.len());
    let mut first_index: HashMap<[u8; 32], usize> = HashMap::with_capacity(raw.len());
    // id -> the first key with it: keys rotated under one id are one identity.
    let mut ids: HashMap<&str, (usize, &RawKey)> = HashMap::new();
    for (i, key) in raw.iter().enumerate() {
        let at = |field: &str| format!("keys[{i}].{field}");
        let digest = parse_digest(&key.key_sha256)
            .map_err(|reason| ConfigError::new(at("key_sha256"), reason))?;
        let entry = validate_key(key, &digest, &at)?;
        if let Some(previous) = first_index.insert(digest, i) {
            return Err(ConfigError::new(
                at("key_sha256"),
                format!("duplicate digest: keys[{previous}] has the same one"),
            ));
        }
        if let Some(id) = &key.id {
            match ids.get(id.as_str()) {
                Some((j, first))
                    if (&first.consumer, &first.tenant) != (&key.consumer, &key.tenant) =>
                {
                    return Err(ConfigError::new(
                        at("id"),
                        format!("keys[{j}] has this id with another consumer or tenant: keys sharing an id are one key rotated, so they must agree"),
                    ));
                }
                Some(_) => {}
                None => {
                    ids.insert(id, (i, key));
                }
            }
        }
        table.insert(digest, entry);
    }
    Ok(table)
}

/// One key's fields checked and turned into its entry; `at(field)` names a field in errors.
/// The one validation of a key, whether it comes from the config or from Redis.
fn validate_key(
    key: &RawKey,
    digest: &[u8; 32],
    at: &dyn Fn(&str) -> String,
) -> Result<KeyEntry, ConfigError> {
    validate_name(&at("consumer"), &key.consumer)?;
    validate_name(&at("tenant"), &key.tenant)?;
    for (g, group) in key.groups.iter().enumerate() {
        if group != "*" {
            validate_name(&format!("{}[{g}]", at("groups")), group)?;
        }
    }
    let expires_at = match &key.expires_at {
        None => None,
        Some(text) => Some(rfc3339::parse_unix_seconds(text).map_err(|reason| {
            ConfigError::new(
                at("expires_at"),
                format!("not an RFC 3339 timestamp: {reason}"),
            )
        })?),
    };
    if let Some(tier) = &key.tier {
        validate_name(&at("tier"), tier)?;
    }
    if let Some(id) = &key.id {
        validate_name(&at("id"), id)?;
    }
    Ok(KeyEntry {
        consumer: key.consumer.clone(),
        tenant: key.tenant.clone(),
        groups: key.groups.join(","),
        expires_at,
        disabled: key.disabled,
        key_id: match &key.id {
            Some(id) => id.clone(),
            None => {
                let mut prefix = String::with_capacity(16);
                push_hex(&mut prefix, digest.get(..8).unwrap_or_default());
                prefix
            }
        },
        tier: key.tier.clone(),
    })
}

/// A key's entry from the fields of its Redis hash (`HGETALL`: field, value, field, value…):
/// `consumer` (required), `tenant` (default `default`), `groups` (comma-separated, `*` any,
/// empty none), `tier`, `id`, `disabled` (`1`/`true`/`0`/`false`), `expires_at` (RFC 3339).
/// Other fields (`created_at`, …) are ignored. `Ok(None)`: no such hash. A field that fails
/// the config's validation is an error naming it (the value is never quoted).
pub fn entry_from_hash(
    digest: &[u8; 32],
    fields: &[(Vec<u8>, Vec<u8>)],
) -> Result<Option<KeyEntry>, ConfigError> {
    if fields.is_empty() {
        return Ok(None);
    }
    let text = |name: &str, value: &[u8]| -> Result<String, ConfigError> {
        String::from_utf8(value.to_vec()).map_err(|_| ConfigError::new(name, "not UTF-8"))
    };
    let mut consumer = None;
    let mut key = RawKey {
        key_sha256: String::new(),
        consumer: String::new(),
        tenant: default_tenant(),
        groups: Vec::new(),
        expires_at: None,
        disabled: false,
        id: None,
        tier: None,
    };
    for (name, value) in fields {
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        match name {
            "consumer" => consumer = Some(text(name, value)?),
            "tenant" => key.tenant = text(name, value)?,
            "groups" => {
                let groups = text(name, value)?;
                key.groups = groups
                    .split(',')
                    .filter(|g| !g.is_empty())
                    .map(str::to_string)
                    .collect();
            }
            "tier" if !value.is_empty() => key.tier = Some(text(name, value)?),
            "id" if !value.is_empty() => key.id = Some(text(name, value)?),
            "expires_at" if !value.is_empty() => key.expires_at = Some(text(name, value)?),
            "disabled" => {
                key.disabled = match value.as_slice() {
                    b"1" | b"true" => true,
                    b"0" | b"false" | b"" => false,
                    _ => return Err(ConfigError::new("disabled", "must be 1, true, 0 or false")),
                }
            }
            _ => {}
        }
    }
    key.consumer = consumer.ok_or_else(|| ConfigError::new("consumer", "missing"))?;
    validate_key(&key, digest, &|field: &str| field.to_string()).map(Some)
}

/// 64 hex digits (any case) -> 32 bytes.
fn parse_digest(hex: &str) -> Result<[u8; 32], &'static str> {
    if hex.len() != 64 {
        return Err("must be the 64 hex digits of a SHA-256 (see scripts/hash-key), never a key");
    }
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
        let [hi, lo] = pair else {
            return Err("must be 64 hex digits");
        };
        *byte = (hex_value(*hi)? << 4) | hex_value(*lo)?;
    }
    Ok(out)
}

fn hex_value(c: u8) -> Result<u8, &'static str> {
    match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        b'A'..=b'F' => Ok(c - b'A' + 10),
        _ => Err("must be 64 hex digits"),
    }
}

fn key_sources(names: &[String], query_param: Option<&str>) -> Result<Vec<KeySource>, ConfigError> {
    let mut sources = Vec::with_capacity(names.len() + 1);
    for (i, name) in names.iter().enumerate() {
        let field = format!("key_sources[{i}]");
        if !is_header_token(name) {
            return Err(ConfigError::new(field, "must be a header name"));
        }
        let lower = name.to_ascii_lowercase();
        if llm_gateway_shared::headers::is_internal(&lower) || lower.starts_with(':') {
            return Err(ConfigError::new(
                field,
                "cannot read a key from an internal or pseudo header",
            ));
        }
        let source = if lower == "authorization" {
            KeySource::Bearer
        } else {
            KeySource::Header(lower)
        };
        if sources.contains(&source) {
            return Err(ConfigError::new(field, "listed twice"));
        }
        sources.push(source);
    }
    if let Some(param) = query_param {
        if param.is_empty()
            || !param
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            return Err(ConfigError::new(
                "query_param",
                "must be a plain parameter name (letters, digits, -_.)",
            ));
        }
        sources.push(KeySource::Query(param.to_string()));
    }
    if sources.is_empty() {
        return Err(ConfigError::new(
            "key_sources",
            "must name at least one place to read the key from",
        ));
    }
    Ok(sources)
}

fn is_header_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The `allow` list. Without Redis every name must belong to a configured key (a typo would
/// lock a route); with Redis a consumer may have keys only there, so a name is only checked.
fn allow_list(
    names: &[String],
    keys: &KeyTable,
    redis: bool,
) -> Result<HashSet<String>, ConfigError> {
    let known: HashSet<&str> = keys.values().map(|k| k.consumer.as_str()).collect();
    let mut allow = HashSet::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        validate_name(&format!("allow[{i}]"), name)?;
        if !redis && !known.contains(name.as_str()) {
            return Err(ConfigError::new(
                format!("allow[{i}]"),
                format!("no key belongs to consumer {name:?}"),
            ));
        }
        allow.insert(name.clone());
    }
    Ok(allow)
}

fn missing_message(sources: &[KeySource]) -> String {
    let places: Vec<String> = sources
        .iter()
        .map(|s| match s {
            KeySource::Bearer => "`Authorization: Bearer <key>`".to_string(),
            KeySource::Header(h) => format!("`{h}`"),
            KeySource::Query(q) => format!("the `{q}` query parameter"),
        })
        .collect();
    format!("Missing API key. Send your key in {}.", places.join(" or "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use llm_gateway_shared::rules::MatchInput;

    const DIGEST_A: &str = "8e5bfa1d0c9f10a09b3b7b0f2d8f6e0e5b3d3b6d9f8d1f6a9e1c2b3a4d5e6f70";

    fn doc(extra: &str) -> String {
        format!(
            r#"{{"keys":[{{"key_sha256":"{DIGEST_A}","consumer":"team-a","tenant":"acme","groups":["fast","smart"]}},
                        {{"key_sha256":"{}","consumer":"team-b","groups":["*"],"expires_at":"2027-01-01T00:00:00Z","disabled":true}}]{extra}}}"#,
            "B".repeat(64)
        )
    }

    #[test]
    fn full_config() {
        let set = parse_document(
            doc(r#","key_sources":["Authorization","x-api-key"],"query_param":"key""#).as_bytes(),
        )
        .unwrap();
        let cfg = set.global().unwrap();
        assert_eq!(cfg.keys.len(), 2);
        assert_eq!(
            cfg.sources,
            vec![
                KeySource::Bearer,
                KeySource::Header("x-api-key".into()),
                KeySource::Query("key".into())
            ]
        );
        let a = cfg.keys.get(&parse_digest(DIGEST_A).unwrap()).unwrap();
        assert_eq!(a.groups, "fast,smart");
        assert_eq!(a.tenant, "acme");
        assert_eq!(a.key_id, "8e5bfa1d0c9f10a0");
        let b = cfg.keys.get(&[0xbb; 32]).unwrap();
        assert_eq!(b.tenant, "default");
        assert_eq!(b.expires_at, Some(1_798_761_600));
        assert!(b.disabled);
        assert_eq!(b.key_id, "bbbbbbbbbbbbbbbb");
        assert!(cfg.enforce);
        assert!(cfg.needs_clock());
        assert!(cfg.missing_message.contains("the `key` query parameter"));
    }

    #[test]
    fn an_id_and_a_tier_name_the_key_and_rotated_keys_share_the_id() {
        let doc = format!(
            r#"{{"keys":[{{"key_sha256":"{DIGEST_A}","consumer":"team-a","groups":["*"],"id":"team-a-prod","tier":"pro","expires_at":"2027-01-01T00:00:00Z"}},
                        {{"key_sha256":"{}","consumer":"team-a","groups":["*"],"id":"team-a-prod","tier":"pro"}}]}}"#,
            "B".repeat(64)
        );
        let set = parse_document(doc.as_bytes()).unwrap();
        let cfg = set.global().unwrap();
        let old = cfg.keys.get(&parse_digest(DIGEST_A).unwrap()).unwrap();
        let new = cfg.keys.get(&[0xbb; 32]).unwrap();
        assert_eq!(
            (old.key_id.as_str(), new.key_id.as_str()),
            ("team-a-prod", "team-a-prod")
        );
        assert_eq!(old.tier.as_deref(), Some("pro"));
        // a key without an id keeps the digest prefix, without a tier has none
        let plain = parse_document(doc_plain().as_bytes()).unwrap();
        let a = plain
            .global()
            .unwrap()
            .keys
            .get(&parse_digest(DIGEST_A).unwrap())
            .cloned()
            .unwrap();
        assert_eq!((a.key_id.as_str(), a.tier), ("8e5bfa1d0c9f10a0", None));
    }

    fn doc_plain() -> String {
        doc("")
    }

    #[test]
    fn one_id_for_two_identities_or_a_bad_tier_is_refused() {
        let clash = format!(
            r#"{{"keys":[{{"key_sha256":"{DIGEST_A}","consumer":"team-a","groups":["*"],"id":"k1"}},
                        {{"key_sha256":"{}","consumer":"team-b","groups":["*"],"id":"k1"}}]}}"#,
            "B".repeat(64)
        );
        let err = parse_document(clash.as_bytes()).unwrap_err().to_string();
        assert!(
            err.contains("keys[1].id") && err.contains("keys[0]"),
            "{err}"
        );
        let bad_tier = format!(
            r#"{{"keys":[{{"key_sha256":"{DIGEST_A}","consumer":"team-a","groups":["*"],"tier":"pro plan"}}]}}"#
        );
        let err = parse_document(bad_tier.as_bytes()).unwrap_err().to_string();
        assert!(err.contains("keys[0].tier"), "{err}");
        let bad_id = format!(
            r#"{{"keys":[{{"key_sha256":"{DIGEST_A}","consumer":"team-a","groups":["*"],"id":"team a"}}]}}"#
        );
        let err = parse_document(bad_id.as_bytes()).unwrap_err().to_string();
        assert!(err.contains("keys[0].id"), "{err}");
    }

    fn fields(pairs: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs
            .iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn a_redis_hash_becomes_the_entry_a_config_key_would() {
        let digest = parse_digest(DIGEST_A).unwrap();
        let entry = entry_from_hash(
            &digest,
            &fields(&[
                ("consumer", "team-a"),
                ("tenant", "acme"),
                ("groups", "fast,smart"),
                ("tier", "pro"),
                ("id", "team-a-prod"),
                ("disabled", "1"),
                ("expires_at", "2027-01-01T00:00:00Z"),
                ("created_at", "2026-12-01T00:00:00Z"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            entry,
            KeyEntry {
                consumer: "team-a".into(),
                tenant: "acme".into(),
                groups: "fast,smart".into(),
                expires_at: Some(1_798_761_600),
                disabled: true,
                key_id: "team-a-prod".into(),
                tier: Some("pro".into()),
            }
        );
        // defaults: tenant, no groups, digest-prefix id, enabled, no tier
        let minimal = entry_from_hash(&digest, &fields(&[("consumer", "c")]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                minimal.tenant.as_str(),
                minimal.groups.as_str(),
                minimal.key_id.as_str()
            ),
            ("default", "", "8e5bfa1d0c9f10a0")
        );
        assert!(!minimal.disabled && minimal.tier.is_none());
        assert_eq!(entry_from_hash(&digest, &[]).unwrap(), None);
        for (pairs, field) in [
            (vec![("tenant", "t")], "consumer"),
            (vec![("consumer", "a b")], "consumer"),
            (vec![("consumer", "c"), ("groups", "ok,a b")], "groups[1]"),
            (vec![("consumer", "c"), ("disabled", "yes")], "disabled"),
            (
                vec![("consumer", "c"), ("expires_at", "soon")],
                "expires_at",
            ),
            (vec![("consumer", "c"), ("tier", "x y")], "tier"),
            (vec![("consumer", "c"), ("id", "x,y")], "id"),
        ] {
            let err = entry_from_hash(&digest, &fields(&pairs)).unwrap_err();
            assert_eq!(err.field(), field, "{pairs:?}: {err}");
        }
        let bad_utf8 = vec![(b"consumer".to_vec(), vec![0xff, 0xfe])];
        assert_eq!(
            entry_from_hash(&digest, &bad_utf8).unwrap_err().field(),
            "consumer"
        );
    }

    #[test]
    fn the_redis_section_is_for_the_higress_build_and_is_checked() {
        let result = parse_document(br#"{"redis":{"service":"outbound|6379||redis.static"}}"#);
        if !REDIS_TRANSPORT {
            let err = result.unwrap_err();
            assert_eq!(err.field(), "redis");
            assert!(err.reason().contains("Higress build"), "{err}");
            return;
        }
        let set = result.unwrap();
        let store = set.global().unwrap().store.clone().unwrap();
        assert_eq!(
            (
                store.prefix.as_str(),
                store.cache_ttl_ms,
                store.negative_ttl_ms,
                store.timeout_ms
            ),
            ("llm:key:", 30_000, 30_000, 200)
        );
        assert!(set.global().unwrap().needs_clock());
        assert_eq!(
            store.redis_key(&[0xab; 32]),
            format!("llm:key:{}", "ab".repeat(32))
        );
        // with Redis, `allow` may name consumers whose keys live only there
        parse_document(br#"{"redis":{"service":"s"},"allow":["only-in-redis"]}"#).unwrap();
        for (doc, field) in [
            (r#"{"redis":{}}"#, "redis.service"),
            (
                r#"{"redis":{"service":"s","timeout_ms":0}}"#,
                "redis.timeout_ms",
            ),
            (
                r#"{"redis":{"service":"s","cache_ttl_ms":0}}"#,
                "redis.cache_ttl_ms",
            ),
            (
                r#"{"redis":{"service":"s","negative_ttl_ms":0}}"#,
                "redis.negative_ttl_ms",
            ),
            (
                r#"{"redis":{"service":"s","prefix":"a b"}}"#,
                "redis.prefix",
            ),
            (
                r#"{"redis":{"service":"s","cache_entries":1}}"#,
                "redis.cache_entries",
            ),
            (r#"{"redis":{"service":"s","allow":[]}}"#, "redis"),
        ] {
            let err = parse_document(doc.as_bytes()).unwrap_err();
            assert!(err.field().starts_with(field), "{doc}: {err}");
        }
    }

    #[test]
    fn top_level_keys_read_without_a_tree_and_a_rule_with_its_own_keys_gets_them() {
        let doc = doc(&format!(
            r#","_rules_":[{{"_match_route_":["own"],"keys":[{{"key_sha256":"{}","consumer":"team-x","groups":["*"]}}]}},
                           {{"_match_route_":["inherit"],"allow":["team-a"]}}]"#,
            "C".repeat(64)
        ));
        let set = parse_document(doc.as_bytes()).unwrap();
        let global = set.global().unwrap();
        assert_eq!(global.keys.len(), 2);
        let select = |route| {
            set.select(&MatchInput {
                route,
                ..MatchInput::default()
            })
            .unwrap()
        };
        let own = select("own");
        assert_eq!(own.keys.len(), 1);
        assert_eq!(own.keys.get(&[0xcc; 32]).unwrap().consumer, "team-x");
        assert!(Rc::ptr_eq(&select("inherit").keys, &global.keys));
        // the same document read the slow way (its `keys` not first-class) gives the same keys
        let slow = parse_document(
            doc.replacen(r#""keys""#, r#""keys":[],"keys""#, 1)
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(*slow.global().unwrap().keys, *global.keys);
    }

    #[test]
    fn defaults() {
        let set = parse_document(b"{}").unwrap();
        let cfg = set.global().unwrap();
        assert!(cfg.keys.is_empty());
        assert_eq!(
            cfg.sources,
            vec![
                KeySource::Bearer,
                KeySource::Header("x-api-key".into()),
                KeySource::Header("api-key".into())
            ]
        );
        assert!(cfg.allow.is_none());
        // re-entry tickets are on by default, and they expire
        assert!(cfg.reentry);
        assert!(cfg.needs_clock());
    }

    #[test]
    fn rules_share_the_key_table_and_always_enforce() {
        let set = parse_document(
            doc(r#","global_auth":false,"_rules_":[{"_match_route_":["billing"],"allow":["team-a"]},{"_match_route_":["x"]}]"#)
                .as_bytes(),
        )
        .unwrap();
        let global = set.global().unwrap();
        assert!(!global.enforce);
        let rule = set
            .select(&MatchInput {
                route: "billing",
                ..MatchInput::default()
            })
            .unwrap();
        assert!(rule.enforce);
        assert!(Rc::ptr_eq(&global.keys, &rule.keys));
        assert_eq!(rule.allow.as_ref().unwrap().len(), 1);
        assert!(set.configs().all(|c| Rc::ptr_eq(&c.keys, &global.keys)));
    }

    #[test]
    fn refusals_name_the_field() {
        let k = |fields: &str| {
            format!(
                r#"{{"keys":[{{"key_sha256":"{DIGEST_A}","consumer":"c","groups":[]{fields}}}]}}"#
            )
        };
        let cases: Vec<(String, &str, &str)> = vec![
            (
                r#"{"keys":[{"key_sha256":"sk-live-abc","consumer":"c","groups":[]}]}"#.into(),
                "keys[0].key_sha256",
                "never a key",
            ),
            (
                format!(
                    r#"{{"keys":[{{"key_sha256":"{}","consumer":"c","groups":[]}}]}}"#,
                    "g".repeat(64)
                ),
                "keys[0].key_sha256",
                "hex",
            ),
            (
                format!(
                    r#"{{"keys":[{{"key_sha256":"{}","consumer":"c","groups":[]}}]}}"#,
                    "é".repeat(32)
                ),
                "keys[0].key_sha256",
                "hex",
            ),
            (
                format!(
                    r#"{{"keys":[{{"key_sha256":"{DIGEST_A}","consumer":"c","groups":[]}},{{"key_sha256":"{}","consumer":"d","groups":[]}}]}}"#,
                    DIGEST_A.to_uppercase()
                ),
                "keys[1].key_sha256",
                "duplicate digest: keys[0]",
            ),
            (
                k(r#","expires_at":"next week""#),
                "keys[0].expires_at",
                "RFC 3339",
            ),
            (k(r#","tenant":"a b""#), "keys[0].tenant", "not allowed"),
            (k(r#","colour":"red""#), "", "unknown field `colour`"),
            (
                format!(
                    r#"{{"keys":[{{"key_sha256":"{DIGEST_A}","consumer":"bad,name","groups":[]}}]}}"#
                ),
                "keys[0].consumer",
                "not allowed",
            ),
            (
                format!(
                    r#"{{"keys":[{{"key_sha256":"{DIGEST_A}","consumer":"c","groups":["a,b"]}}]}}"#
                ),
                "keys[0].groups[0]",
                "not allowed",
            ),
            (
                format!(r#"{{"keys":[{{"key_sha256":"{DIGEST_A}","consumer":"c"}}]}}"#),
                "",
                "missing field `groups`",
            ),
            (
                r#"{"key_sources":[]}"#.into(),
                "key_sources",
                "at least one",
            ),
            (
                r#"{"key_sources":["x-llm-consumer"]}"#.into(),
                "key_sources[0]",
                "internal",
            ),
            (
                r#"{"key_sources":["bad header"]}"#.into(),
                "key_sources[0]",
                "header name",
            ),
            (
                r#"{"key_sources":["api-key","API-KEY"]}"#.into(),
                "key_sources[1]",
                "twice",
            ),
            (
                r#"{"query_param":"a&b"}"#.into(),
                "query_param",
                "plain parameter",
            ),
            (
                format!(
                    r#"{{"keys":[{{"key_sha256":"{DIGEST_A}","consumer":"c","groups":[]}}],"allow":["nobody"]}}"#
                ),
                "allow[0]",
                "no key belongs",
            ),
            (
                format!(
                    r#"{{"keys":[{{"key_sha256":"{DIGEST_A}","consumer":"c","groups":[]}}],"_rules_":[{{"_match_route_":["r"],"allow":["c","zed"]}}]}}"#
                ),
                "_rules_[0].allow[1]",
                "no key belongs",
            ),
        ];
        for (document, field, reason) in cases {
            match parse_document(document.as_bytes()) {
                Ok(_) => panic!("accepted {document}"),
                Err(err) => {
                    assert!(
                        err.field().starts_with(field),
                        "{document}: field {:?}",
                        err.field()
                    );
                    assert!(
                        err.reason().contains(reason),
                        "{document}: reason {:?}",
                        err.reason()
                    );
                }
            }
        }
    }
}
