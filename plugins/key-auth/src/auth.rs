//! The decision: from the request headers, the config and the time to an edit plan.
//!
//! [`authenticate`] is pure. The stage core ([`crate::core`]) calls it with the request headers
//! the shell copied out of the host and turns the returned [`Plan`] into the stage protocol's
//! effects: remove headers, then either refuse with the plan's [`Reject`] or set the identity
//! headers and let the request through.

use crate::config::{KeyAuthConfig, KeyEntry, KeySource};
use crate::reentry::{self, Secret};
use llm_gateway_shared::headers;
use llm_gateway_shared::reject::Reject;
use sha2::{Digest, Sha256};
use std::borrow::Cow;

/// Keys longer than this are refused without hashing them.
const MAX_KEY_LEN: usize = 1024;

/// Why a request was refused. The code is the OpenAI error `code` and the metric suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenyReason {
    /// No key in any configured place.
    Missing,
    /// A key no config entry has.
    Unknown,
    /// A known key past its `expires_at`.
    Expired,
    /// A known key with `disabled: true`.
    Disabled,
    /// A valid key whose consumer is not on this route's allow list.
    NotAllowed,
    /// The key is neither in the config nor in the cache, and Redis did not answer.
    StoreUnavailable,
}

impl DenyReason {
    /// Every reason, for defining one metric each.
    pub const ALL: [DenyReason; 6] = [
        DenyReason::Missing,
        DenyReason::Unknown,
        DenyReason::Expired,
        DenyReason::Disabled,
        DenyReason::NotAllowed,
        DenyReason::StoreUnavailable,
    ];

    /// The error code.
    pub fn code(self) -> &'static str {
        match self {
            DenyReason::Missing => "missing_api_key",
            DenyReason::Unknown => "invalid_api_key",
            DenyReason::Expired => "expired_api_key",
            DenyReason::Disabled => "disabled_api_key",
            DenyReason::NotAllowed => "consumer_not_allowed",
            DenyReason::StoreUnavailable => "key_store_unavailable",
        }
    }
}

/// What the key store (Redis and its cache) says about a digest the config does not have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A key with this entry.
    Entry(KeyEntry),
    /// No such key.
    Unknown,
    /// Not known yet: ask Redis, then decide again with its answer.
    Fetch,
    /// Redis did not answer.
    Unavailable,
}

/// Looks digests up beyond the config: the shell's cache and Redis, or nothing.
pub trait KeyLookup {
    /// What is known about `digest` now.
    fn find(&mut self, digest: &[u8; 32]) -> Found;
}

/// No key store: a digest the config does not have is unknown.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoStore;

impl KeyLookup for NoStore {
    fn find(&mut self, _digest: &[u8; 32]) -> Found {
        Found::Unknown
    }
}

/// The store's answer for one digest (Redis's reply, just read): what deciding again uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answered {
    /// The digest asked about.
    pub digest: [u8; 32],
    /// Redis's answer.
    pub found: Found,
}

impl KeyLookup for Answered {
    fn find(&mut self, digest: &[u8; 32]) -> Found {
        if *digest == self.digest {
            self.found.clone()
        } else {
            Found::Fetch
        }
    }
}

/// What happens to the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The key is not in the config and not cached: nothing is edited yet; ask the key store
    /// for `digest`, then decide again ([`authenticate_with`] with an [`Answered`]).
    Fetch {
        /// The presented key's SHA-256.
        digest: [u8; 32],
    },
    /// No config applies here (a rules-only config with no matching rule, or
    /// `global_auth: false` outside the rules): forward without authenticating.
    Skip,
    /// Authenticated: set these identity headers.
    Allow {
        /// `(name, value)` for each header of [`headers::IDENTITY`].
        identity: Vec<(&'static str, String)>,
        /// The key's non-secret id (for the log line).
        key_id: String,
    },
    /// Refused with this local reply.
    Deny {
        /// Why.
        reason: DenyReason,
        /// The reply.
        reject: Reject,
        /// The presented key's id (digest prefix), if a key was presented.
        key_id: Option<String>,
    },
}

/// The edits to make, in order: remove `remove`, rewrite `:path` if `path` is set, then act on
/// `outcome`; when it allows, also set `restore` and publish `ticket`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Header names to remove: every client-supplied internal header, and (when a config
    /// applies) every configured credential header present, so no key reaches a provider.
    pub remove: Vec<String>,
    /// The new `:path` without the key query parameter, when one was present.
    pub path: Option<String>,
    /// What happens next.
    pub outcome: Outcome,
    /// Headers to set after the identity: on a verified re-entry, the first pass's `:method`
    /// and `:authority` (the redirect changed them) and [`headers::REENTRY`].
    pub restore: Vec<(&'static str, String)>,
    /// The re-entry ticket to publish in filter state ([`reentry::PROPERTY`]).
    pub ticket: Option<String>,
}

/// What re-entry needs from the host: the VM's secret and Envoy's `x-request-id`.
#[derive(Debug, Clone, Copy)]
pub struct Pass<'a> {
    /// The VM's ticket secret.
    pub secret: &'a Secret,
    /// Envoy's `x-request-id` of this stream (the same on a redirected one).
    pub envoy_request_id: &'a str,
}

/// Decides on a request. `headers` are the request headers as the host gives them
/// (lowercase names, byte values, pseudo-headers included); `now` is Unix seconds.
pub fn authenticate(
    config: Option<&KeyAuthConfig>,
    headers: &[(String, Vec<u8>)],
    now: i64,
) -> Plan {
    authenticate_pass(config, headers, now, None)
}

/// [`authenticate`] with re-entry tickets (`crate::reentry`): a request carrying a ticket this
/// VM issued for it is the gateway's own redirect and passes without its key; an allowed
/// request gets a ticket to publish. A ticket that does not verify is a client's header like
/// any other `x-llm-*`: removed, and the key is asked for.
pub fn authenticate_pass(
    config: Option<&KeyAuthConfig>,
    headers: &[(String, Vec<u8>)],
    now: i64,
    pass: Option<Pass<'_>>,
) -> Plan {
    authenticate_with(config, headers, now, pass, &mut NoStore)
}

/// [`authenticate_pass`] with a key store: a digest the config does not have is looked up in
/// `store` when the config has `redis` (the config wins over Redis for a digest in both).
pub fn authenticate_with(
    config: Option<&KeyAuthConfig>,
    headers: &[(String, Vec<u8>)],
    now: i64,
    pass: Option<Pass<'_>>,
    store: &mut dyn KeyLookup,
) -> Plan {
    let mut remove: Vec<String> = Vec::new();
    for (name, _) in headers {
        if headers::is_internal(name) && !remove.iter().any(|r| r.eq_ignore_ascii_case(name)) {
            remove.push(name.clone());
        }
    }

    let Some(config) = config.filter(|c| c.enforce) else {
        return Plan {
            remove,
            path: None,
            outcome: Outcome::Skip,
            restore: Vec::new(),
            ticket: None,
        };
    };
    let pass = pass.filter(|_| config.reentry);

    if let Some(plan) = pass.and_then(|p| reenter(config, headers, now, p, &remove, store)) {
        return plan;
    }

    let mut path = None;
    let mut presented: Option<Vec<u8>> = None;
    for source in &config.sources {
        match source {
            KeySource::Bearer | KeySource::Header(_) => {
                let name = source.header_name().unwrap_or_default();
                let mut values = headers
                    .iter()
                    .filter(|(n, _)| n.eq_ignore_ascii_case(name))
                    .peekable();
                if values.peek().is_some() && !remove.iter().any(|r| r == name) {
                    remove.push(name.to_string());
                }
                if presented.is_none() {
                    presented = values.find_map(|(_, value)| match source {
                        KeySource::Bearer => bearer_token(value),
                        _ => non_empty(value.trim_ascii()),
                    });
                }
            }
            KeySource::Query(param) => {
                let Some((_, raw_path)) = headers.iter().find(|(n, _)| n == ":path") else {
                    continue;
                };
                let Ok(raw_path) = std::str::from_utf8(raw_path) else {
                    continue;
                };
                if let Some((value, stripped)) = take_query_param(raw_path, param) {
                    path = Some(stripped);
                    if presented.is_none() {
                        presented = non_empty(&value);
                    }
                }
            }
        }
    }

    let (outcome, digest) = decide(config, presented.as_deref(), now, store);
    let ticket = match (&outcome, pass, digest) {
        (Outcome::Allow { .. }, Some(pass), Some(digest)) => issue(headers, now, pass, &digest),
        _ => None,
    };
    Plan {
        remove,
        path,
        outcome,
        restore: Vec::new(),
        ticket,
    }
}

fn header_text<'h>(headers: &'h [(String, Vec<u8>)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| std::str::from_utf8(v).ok())
}

/// A ticket for this request, allowed with the key `digest`.
fn issue(
    headers: &[(String, Vec<u8>)],
    now: i64,
    pass: Pass<'_>,
    digest: &[u8; 32],
) -> Option<String> {
    pass.secret.issue(
        digest,
        now,
        header_text(headers, ":method")?,
        header_text(headers, ":authority")?,
        pass.envoy_request_id,
    )
}

/// The plan for a request carrying a valid ticket: the identity of the key the first pass
/// authenticated (checked again: disabled, expired, allowed), every credential header removed
/// (the first pass's router put a provider's there), the stale internal headers removed but
/// those the redirect policy carries, `:method` and `:authority` put back, and a new ticket for
/// a further redirect. `None` when the request has no ticket that verifies.
fn reenter(
    config: &KeyAuthConfig,
    headers: &[(String, Vec<u8>)],
    now: i64,
    pass: Pass<'_>,
    internal: &[String],
    store: &mut dyn KeyLookup,
) -> Option<Plan> {
    let (_, ticket) = headers.iter().find(|(n, _)| n == reentry::HEADER)?;
    let claims = pass.secret.verify(ticket, now, pass.envoy_request_id)?;
    let found;
    let entry = match config.keys.get(&claims.digest) {
        Some(entry) => entry,
        None if config.store.is_some() => {
            found = store.find(&claims.digest);
            match &found {
                Found::Entry(entry) => entry,
                Found::Fetch => {
                    return Some(Plan {
                        remove: Vec::new(),
                        path: None,
                        outcome: Outcome::Fetch {
                            digest: claims.digest,
                        },
                        restore: Vec::new(),
                        ticket: None,
                    })
                }
                Found::Unavailable => {
                    let outcome = unavailable(Some(digest_prefix(&claims.digest)));
                    return Some(Plan {
                        remove: internal.to_vec(),
                        path: None,
                        outcome,
                        restore: Vec::new(),
                        ticket: None,
                    });
                }
                Found::Unknown => return None,
            }
        }
        None => return None,
    };
    let mut remove: Vec<String> = internal
        .iter()
        .filter(|name| !headers::REENTRY_CARRIED.contains(&name.as_str()))
        .cloned()
        .collect();
    for source in &config.sources {
        if let Some(name) = source.header_name() {
            if headers.iter().any(|(n, _)| n == name) && !remove.iter().any(|r| r == name) {
                remove.push(name.to_string());
            }
        }
    }
    let outcome = decide_entry(config, entry, now);
    let mut restore = Vec::new();
    if let Outcome::Allow { .. } = outcome {
        for (name, value) in [
            (":method", &claims.method),
            (":authority", &claims.authority),
        ] {
            if header_text(headers, name) != Some(value.as_str()) {
                restore.push((name, value.clone()));
            }
        }
        restore.push((headers::REENTRY, "1".to_string()));
    }
    let ticket = match outcome {
        Outcome::Allow { .. } => pass.secret.issue(
            &claims.digest,
            now,
            &claims.method,
            &claims.authority,
            pass.envoy_request_id,
        ),
        _ => None,
    };
    Some(Plan {
        remove,
        path: None,
        outcome,
        restore,
        ticket,
    })
}

/// The outcome for a presented key, with the digest of the key it allows.
fn decide(
    config: &KeyAuthConfig,
    presented: Option<&[u8]>,
    now: i64,
    store: &mut dyn KeyLookup,
) -> (Outcome, Option<[u8; 32]>) {
    let Some(key) = presented else {
        return (
            deny(
                DenyReason::Missing,
                config.missing_message.clone().into(),
                None,
            ),
            None,
        );
    };
    if key.len() > MAX_KEY_LEN {
        let outcome = deny(
            DenyReason::Unknown,
            Cow::Borrowed("Incorrect API key provided."),
            None,
        );
        return (outcome, None);
    }
    let digest: [u8; 32] = Sha256::digest(key).into();
    if let Some(entry) = config.keys.get(&digest) {
        return (decide_entry(config, entry, now), Some(digest));
    }
    let found = match config.store {
        Some(_) => store.find(&digest),
        None => Found::Unknown,
    };
    let key_id = || Some(digest_prefix(&digest));
    match found {
        Found::Entry(entry) => (decide_entry(config, &entry, now), Some(digest)),
        Found::Fetch => (Outcome::Fetch { digest }, None),
        Found::Unavailable => (unavailable(key_id()), None),
        Found::Unknown => {
            let outcome = deny(
                DenyReason::Unknown,
                Cow::Borrowed("Incorrect API key provided."),
                key_id(),
            );
            (outcome, None)
        }
    }
}

fn unavailable(key_id: Option<String>) -> Outcome {
    deny(
        DenyReason::StoreUnavailable,
        Cow::Borrowed("The key store cannot be reached; try again shortly."),
        key_id,
    )
}

/// The outcome for a known key.
fn decide_entry(config: &KeyAuthConfig, entry: &KeyEntry, now: i64) -> Outcome {
    let key_id = || Some(entry.key_id.clone());
    if entry.disabled {
        return deny(
            DenyReason::Disabled,
            Cow::Borrowed("This API key has been disabled."),
            key_id(),
        );
    }
    if entry.expires_at.is_some_and(|at| now >= at) {
        return deny(
            DenyReason::Expired,
            Cow::Borrowed("This API key has expired."),
            key_id(),
        );
    }
    if let Some(allow) = &config.allow {
        if !allow.contains(&entry.consumer) {
            return deny(
                DenyReason::NotAllowed,
                format!(
                    "Consumer `{}` is not allowed on this route.",
                    entry.consumer
                )
                .into(),
                key_id(),
            );
        }
    }
    Outcome::Allow {
        identity: identity_headers(entry),
        key_id: entry.key_id.clone(),
    }
}

/// `message`: a constant costs no allocation, in the refusal or in its copy for the reply.
fn deny(reason: DenyReason, message: Cow<'static, str>, key_id: Option<String>) -> Outcome {
    let reject = match reason {
        DenyReason::NotAllowed => Reject::forbidden(reason.code(), message),
        DenyReason::StoreUnavailable => Reject::new(
            503,
            llm_gateway_shared::reject::ErrorType::Api,
            reason.code(),
            message,
        )
        .with_header("retry-after", "1"),
        DenyReason::Missing => Reject::unauthorized(reason.code(), message, false),
        _ => Reject::unauthorized(reason.code(), message, true),
    };
    Outcome::Deny {
        reason,
        reject,
        key_id,
    }
}

fn identity_headers(entry: &KeyEntry) -> Vec<(&'static str, String)> {
    let mut out = vec![
        (headers::CONSUMER, entry.consumer.clone()),
        (headers::HIGRESS_CONSUMER, entry.consumer.clone()),
        (headers::TENANT, entry.tenant.clone()),
        (headers::GROUPS, entry.groups.clone()),
        (headers::KEY_ID, entry.key_id.clone()),
    ];
    if let Some(tier) = &entry.tier {
        out.push((headers::TIER, tier.clone()));
    }
    out
}

/// The first 16 hex digits of a digest: how a key is named in logs.
pub fn digest_prefix(digest: &[u8; 32]) -> String {
    let mut out = String::with_capacity(16);
    for b in digest.iter().take(8) {
        for nibble in [b >> 4, b & 0xf] {
            out.push(char::from_digit(u32::from(nibble), 16).unwrap_or('0'));
        }
    }
    out
}

fn non_empty(value: &[u8]) -> Option<Vec<u8>> {
    (!value.is_empty()).then(|| value.to_vec())
}

/// The token of `Bearer <token>` (scheme in any case); `None` for other schemes.
fn bearer_token(value: &[u8]) -> Option<Vec<u8>> {
    let value = value.trim_ascii();
    let scheme = value.get(..7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    non_empty(value.get(7..)?.trim_ascii())
}

/// Finds `param` in the query of `path`; returns its percent-decoded value and the path with
/// every occurrence of the parameter removed.
fn take_query_param(path: &str, param: &str) -> Option<(Vec<u8>, String)> {
    let (base, query) = path.split_once('?')?;
    let mut found = None;
    let mut kept: Vec<&str> = Vec::new();
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name == param {
            if found.is_none() {
                found = Some(percent_decode(value));
            }
        } else {
            kept.push(pair);
        }
    }
    let value = found?;
    let stripped = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Some((value, stripped))
}

fn percent_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let decoded = match b {
            b'%' => bytes
                .get(i + 1..i + 3)
                .and_then(|hex| std::str::from_utf8(hex).ok())
                .and_then(|hex| u8::from_str_radix(hex, 16).ok()),
            _ => None,
        };
        match decoded {
            Some(v) => {
                out.push(v);
                i += 3;
            }
            None => {
                out.push(if b == b'+' { b' ' } else { b });
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::parse_document;
    use crate::reentry::{self, Secret};
    use llm_gateway_shared::rules::{MatchInput, RuleSet};

    const KEY_A: &str = "sk-test-team-a-0123456789";
    const KEY_B: &str = "sk-test-team-b-disabled";
    const KEY_C: &str = "sk-test-team-c-expired";
    const NOW: i64 = 1_796_005_345; // 2026-11-30T02:22:25Z

    fn sha(key: &str) -> String {
        Sha256::digest(key.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn config(extra: &str) -> RuleSet<KeyAuthConfig> {
        let doc = format!(
            r#"{{"keys":[
                {{"key_sha256":"{}","consumer":"team-a","tenant":"acme","groups":["fast","smart"]}},
                {{"key_sha256":"{}","consumer":"team-b","groups":["fast"],"disabled":true}},
                {{"key_sha256":"{}","consumer":"team-c","groups":["*"],"expires_at":"2026-11-30T02:22:25Z"}}
              ]{extra}}}"#,
            sha(KEY_A),
            sha(KEY_B),
            sha(KEY_C)
        );
        parse_document(doc.as_bytes()).unwrap()
    }

    fn req(pairs: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    fn run(set: &RuleSet<KeyAuthConfig>, route: &str, pairs: &[(&str, &str)]) -> Plan {
        let cfg = set.select(&MatchInput {
            route,
            ..MatchInput::default()
        });
        authenticate(cfg, &req(pairs), NOW)
    }

    fn code(plan: &Plan) -> Option<&'static str> {
        match &plan.outcome {
            Outcome::Deny { reason, .. } => Some(reason.code()),
            _ => None,
        }
    }

    /// `set`'s global config with a Redis key store (the Higress transport).
    pub(crate) fn with_store(set: &RuleSet<KeyAuthConfig>) -> KeyAuthConfig {
        let mut cfg = set.global().unwrap().clone();
        cfg.store = Some(std::rc::Rc::new(crate::config::KeyStoreConfig {
            redis: llm_gateway_shared::redis::RedisConfig {
                service: "redis".into(),
                transport: llm_gateway_shared::redis::RedisTransport::Higress,
                username: None,
                password: None,
                timeout_ms: 100,
            },
            prefix: "llm:key:".into(),
            cache_ttl_ms: 30_000,
            negative_ttl_ms: 30_000,
            cache_entries: 1024,
        }));
        cfg
    }

    /// A store that answers every digest the same and counts the questions.
    struct Fixed(Found, usize);

    impl KeyLookup for Fixed {
        fn find(&mut self, _digest: &[u8; 32]) -> Found {
            self.1 += 1;
            self.0.clone()
        }
    }

    #[test]
    fn a_digest_beyond_the_config_is_fetched_then_decided_by_the_answer() {
        let cfg = with_store(&config(""));
        let headers = req(&[
            ("authorization", "Bearer sk-only-in-redis"),
            ("x-llm-tenant", "spoof"),
        ]);
        let digest: [u8; 32] = Sha256::digest(b"sk-only-in-redis").into();
        // not cached: fetch, and nothing is edited yet
        let mut fetch = Fixed(Found::Fetch, 0);
        let plan = authenticate_with(Some(&cfg), &headers, NOW, None, &mut fetch);
        assert_eq!(plan.outcome, Outcome::Fetch { digest });
        // Redis's answer: an entry is decided like a config key (disabled, expired, allowed)
        let entry = KeyEntry {
            consumer: "team-r".into(),
            tenant: "acme".into(),
            groups: "fast".into(),
            expires_at: None,
            disabled: false,
            key_id: "team-r-1".into(),
            tier: Some("pro".into()),
        };
        let mut answered = Answered {
            digest,
            found: Found::Entry(entry.clone()),
        };
        let plan = authenticate_with(Some(&cfg), &headers, NOW, None, &mut answered);
        let Outcome::Allow { identity, key_id } = &plan.outcome else {
            panic!("{:?}", plan.outcome);
        };
        assert_eq!(key_id, "team-r-1");
        assert!(identity.contains(&(headers::TIER, "pro".into())));
        assert!(plan.remove.contains(&"x-llm-tenant".to_string()));
        assert!(plan.remove.contains(&"authorization".to_string()));
        for (entry, expected) in [
            (
                KeyEntry {
                    disabled: true,
                    ..entry.clone()
                },
                "disabled_api_key",
            ),
            (
                KeyEntry {
                    expires_at: Some(NOW),
                    ..entry.clone()
                },
                "expired_api_key",
            ),
        ] {
            let mut answered = Answered {
                digest,
                found: Found::Entry(entry),
            };
            let plan = authenticate_with(Some(&cfg), &headers, NOW, None, &mut answered);
            assert_eq!(code(&plan), Some(expected));
        }
        let mut unknown = Answered {
            digest,
            found: Found::Unknown,
        };
        let plan = authenticate_with(Some(&cfg), &headers, NOW, None, &mut unknown);
        assert_eq!(code(&plan), Some("invalid_api_key"));
        let mut down = Answered {
            digest,
            found: Found::Unavailable,
        };
        let plan = authenticate_with(Some(&cfg), &headers, NOW, None, &mut down);
        assert_eq!(code(&plan), Some("key_store_unavailable"));
        let Outcome::Deny { reject, key_id, .. } = &plan.outcome else {
            unreachable!()
        };
        assert_eq!(reject.status, 503);
        assert_eq!(key_id.as_deref(), Some(&sha("sk-only-in-redis")[..16]));
    }

    #[test]
    fn the_config_wins_and_a_config_without_redis_never_asks_the_store() {
        let set = config("");
        let cfg = with_store(&set);
        let bearer = format!("Bearer {KEY_A}");
        let mut store = Fixed(Found::Unavailable, 0);
        let plan = authenticate_with(
            Some(&cfg),
            &req(&[("authorization", &bearer)]),
            NOW,
            None,
            &mut store,
        );
        assert!(
            matches!(plan.outcome, Outcome::Allow { .. }),
            "{:?}",
            plan.outcome
        );
        assert_eq!(store.1, 0);
        // a missing key asks nothing either
        let plan = authenticate_with(Some(&cfg), &req(&[]), NOW, None, &mut store);
        assert_eq!(code(&plan), Some("missing_api_key"));
        assert_eq!(store.1, 0);
        // without `redis` an unknown digest is unknown, whatever a store would say
        let plain = set.global().unwrap();
        let headers = req(&[("authorization", "Bearer sk-nope")]);
        let plan = authenticate_with(Some(plain), &headers, NOW, None, &mut store);
        assert_eq!(code(&plan), Some("invalid_api_key"));
        assert_eq!(store.1, 0);
    }

    #[test]
    fn valid_key_from_each_source() {
        let set = config("");
        let bearer = format!("Bearer {KEY_A}");
        let lower = format!("bearer   {KEY_A} ");
        for pairs in [
            vec![("authorization", bearer.as_str())],
            vec![("authorization", lower.as_str())],
            vec![("x-api-key", KEY_A)],
            vec![("api-key", KEY_A)],
            vec![
                ("authorization", "Basic Zm9vOmJhcg=="),
                ("x-api-key", KEY_A),
            ],
        ] {
            let plan = run(&set, "", &pairs);
            let Outcome::Allow { identity, key_id } = &plan.outcome else {
                panic!("{pairs:?}: {:?}", plan.outcome);
            };
            assert_eq!(key_id, &sha(KEY_A)[..16]);
            assert_eq!(
                identity,
                &vec![
                    ("x-llm-consumer", "team-a".to_string()),
                    ("x-mse-consumer", "team-a".to_string()),
                    ("x-llm-tenant", "acme".to_string()),
                    ("x-llm-groups", "fast,smart".to_string()),
                    ("x-llm-key-id", sha(KEY_A)[..16].to_string()),
                ]
            );
            // every credential header present is removed
            for (name, _) in &pairs {
                assert!(
                    plan.remove.contains(&name.to_string()),
                    "{name} not removed"
                );
            }
        }
    }

    #[test]
    fn refusals() {
        let set = config("");
        type Case<'a> = (Vec<(&'a str, &'a str)>, &'a str, u16);
        let cases: Vec<Case> = vec![
            (vec![], "missing_api_key", 401),
            (vec![("authorization", "Bearer ")], "missing_api_key", 401),
            (vec![("authorization", "Basic abc")], "missing_api_key", 401),
            (vec![("x-api-key", "  ")], "missing_api_key", 401),
            (vec![("x-api-key", "sk-nope")], "invalid_api_key", 401),
            (vec![("x-api-key", KEY_B)], "disabled_api_key", 401),
            (vec![("x-api-key", KEY_C)], "expired_api_key", 401),
        ];
        for (pairs, want, status) in cases {
            let plan = run(&set, "", &pairs);
            assert_eq!(code(&plan), Some(want), "{pairs:?}");
            let Outcome::Deny { reject, key_id, .. } = &plan.outcome else {
                unreachable!()
            };
            assert_eq!(reject.status, status);
            assert!(reject.headers.iter().any(|(n, _)| *n == "www-authenticate"));
            let body = String::from_utf8(reject.body()).unwrap();
            for (_, value) in &pairs {
                if value.len() > 8 {
                    assert!(!body.contains(value), "body echoes the key: {body}");
                }
            }
            assert_eq!(key_id.is_some(), want != "missing_api_key", "{pairs:?}");
            if let (Some(id), Some((_, presented))) = (key_id, pairs.first()) {
                assert_eq!(id, &sha(presented.trim())[..16], "{pairs:?}");
            }
        }
    }

    #[test]
    fn expiry_is_exclusive_of_the_instant() {
        let set = config("");
        let cfg = set.global();
        let pairs = req(&[("x-api-key", KEY_C)]);
        assert!(matches!(
            authenticate(cfg, &pairs, NOW - 1).outcome,
            Outcome::Allow { .. }
        ));
        assert!(matches!(
            authenticate(cfg, &pairs, NOW).outcome,
            Outcome::Deny {
                reason: DenyReason::Expired,
                ..
            }
        ));
    }

    #[test]
    fn a_key_with_an_id_and_a_tier_names_both_and_a_spoofed_tier_goes() {
        let doc = format!(
            r#"{{"keys":[{{"key_sha256":"{}","consumer":"team-a","groups":["*"],"id":"team-a-prod","tier":"pro"}}]}}"#,
            sha(KEY_A)
        );
        let set = parse_document(doc.as_bytes()).unwrap();
        let plan = run(
            &set,
            "",
            &[("x-llm-tier", "enterprise"), ("x-api-key", KEY_A)],
        );
        assert!(
            plan.remove.iter().any(|h| h == "x-llm-tier"),
            "{:?}",
            plan.remove
        );
        let Outcome::Allow { identity, key_id } = &plan.outcome else {
            panic!("{:?}", plan.outcome);
        };
        assert_eq!(key_id, "team-a-prod");
        assert!(identity.contains(&("x-llm-key-id", "team-a-prod".to_string())));
        assert!(identity.contains(&("x-llm-tier", "pro".to_string())));
        // a key without a tier sets no tier header
        let plan = run(&config(""), "", &[("x-api-key", KEY_A)]);
        let Outcome::Allow { identity, .. } = &plan.outcome else {
            panic!("{:?}", plan.outcome);
        };
        assert!(identity.iter().all(|(name, _)| *name != "x-llm-tier"));
    }

    #[test]
    fn spoofed_internal_headers_are_always_removed() {
        let set = config(
            r#","global_auth":false,"_rules_":[{"_match_route_":["secure"],"allow":["team-a"]}]"#,
        );
        let spoof = [
            ("x-llm-consumer", "admin"),
            ("x-llm-groups", "*"),
            ("x-mse-consumer", "admin"),
            ("x-llm-whatever", "1"),
            ("x-llm-consumer", "second"),
        ];
        // not enforced: skipped, but spoofed headers still go, credentials stay
        let mut pairs = spoof.to_vec();
        pairs.push(("authorization", "Bearer something-for-upstream"));
        let plan = run(&set, "open", &pairs);
        assert_eq!(plan.outcome, Outcome::Skip);
        assert_eq!(
            plan.remove,
            vec![
                "x-llm-consumer",
                "x-llm-groups",
                "x-mse-consumer",
                "x-llm-whatever"
            ]
        );
        // enforced: removed as well, then replaced by the real identity
        let auth = format!("Bearer {KEY_A}");
        let mut pairs = spoof.to_vec();
        pairs.push(("authorization", &auth));
        let plan = run(&set, "secure", &pairs);
        assert!(matches!(plan.outcome, Outcome::Allow { .. }));
        assert!(plan.remove.contains(&"x-llm-consumer".to_string()));
        assert!(plan.remove.contains(&"authorization".to_string()));
    }

    #[test]
    fn allow_list_per_route() {
        let set = config(
            r#","_rules_":[{"_match_route_":["billing"],"allow":["team-a"]},{"_match_route_":["ops"],"allow":["team-c"]}]"#,
        );
        let a = [("x-api-key", KEY_A)];
        assert!(matches!(
            run(&set, "billing", &a).outcome,
            Outcome::Allow { .. }
        ));
        assert!(matches!(
            run(&set, "other", &a).outcome,
            Outcome::Allow { .. }
        ));
        let plan = run(&set, "ops", &a);
        assert_eq!(code(&plan), Some("consumer_not_allowed"));
        let Outcome::Deny { reject, .. } = plan.outcome else {
            unreachable!()
        };
        assert_eq!(reject.status, 403);
        assert!(reject.headers.is_empty());
        // authentication failures still answer 401 on allow-listed routes
        assert_eq!(code(&run(&set, "ops", &[])), Some("missing_api_key"));
    }

    #[test]
    fn query_param_only_when_enabled() {
        let path = format!(
            "/v1/chat/completions?a=1&key={}&b=2",
            KEY_A.replace('-', "%2D")
        );
        let pairs = [(":path", path.as_str())];
        assert_eq!(code(&run(&config(""), "", &pairs)), Some("missing_api_key"));
        let plan = run(&config(r#","query_param":"key""#), "", &pairs);
        assert!(
            matches!(plan.outcome, Outcome::Allow { .. }),
            "{:?}",
            plan.outcome
        );
        assert_eq!(plan.path.as_deref(), Some("/v1/chat/completions?a=1&b=2"));
        // an unknown key in the query is still stripped from the path
        let plan = run(
            &config(r#","query_param":"key""#),
            "",
            &[(":path", "/v1/models?key=nope")],
        );
        assert_eq!(code(&plan), Some("invalid_api_key"));
        assert_eq!(plan.path.as_deref(), Some("/v1/models"));
    }

    #[test]
    fn header_key_wins_over_query_key_but_both_are_stripped() {
        let set = config(r#","query_param":"key""#);
        let path = "/v1/x?key=sk-nope";
        let plan = run(&set, "", &[(":path", path), ("x-api-key", KEY_A)]);
        assert!(matches!(plan.outcome, Outcome::Allow { .. }));
        assert_eq!(plan.path.as_deref(), Some("/v1/x"));
    }

    #[test]
    fn first_configured_source_wins() {
        let set = config(r#","key_sources":["api-key","authorization"]"#);
        let plan = run(
            &set,
            "",
            &[("authorization", "Bearer sk-nope"), ("api-key", KEY_A)],
        );
        assert!(matches!(plan.outcome, Outcome::Allow { .. }));
        // x-api-key is not configured: neither read nor removed
        let plan = run(&set, "", &[("x-api-key", KEY_A)]);
        assert_eq!(code(&plan), Some("missing_api_key"));
        assert!(plan.remove.is_empty());
    }

    #[test]
    fn non_utf8_and_huge_keys_are_refused_not_panicked() {
        let set = config("");
        let cfg = set.global();
        let mut pairs = vec![("x-api-key".to_string(), vec![0xff, 0xfe, b'k'])];
        assert_eq!(
            code(&authenticate(cfg, &pairs, NOW)),
            Some("invalid_api_key")
        );
        pairs[0].1 = vec![b'k'; 100_000];
        assert_eq!(
            code(&authenticate(cfg, &pairs, NOW)),
            Some("invalid_api_key")
        );
    }

    #[test]
    fn no_config_skips() {
        let plan = authenticate(None, &req(&[("x-llm-tenant", "x")]), NOW);
        assert_eq!(plan.outcome, Outcome::Skip);
        assert_eq!(plan.remove, vec!["x-llm-tenant"]);
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Db%zz%4"), b"a-b%zz%4");
        assert_eq!(percent_decode("a+b"), b"a b");
        assert_eq!(percent_decode("%"), b"%");
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any header set, any path: a plan, never a panic; an Allow only for the real key.
            #[test]
            fn total_and_only_real_keys_pass(
                pairs in proptest::collection::vec(("[a-z:-]{1,16}", proptest::collection::vec(any::<u8>(), 0..64)), 0..8)
            ) {
                let set = config(r#","query_param":"key""#);
                let plan = authenticate(set.global(), &pairs, NOW);
                if let Outcome::Allow { .. } = plan.outcome {
                    prop_assert!(false, "allowed random headers: {:?}", pairs);
                }
                for (name, _) in &pairs {
                    if headers::is_internal(name) {
                        prop_assert!(plan.remove.contains(name));
                    }
                }
            }
        }
    }

    // ---- re-entry (the internal-redirect fallback) ----

    fn first_pass(set: &RuleSet<KeyAuthConfig>, secret: &Secret, rid: &str) -> Plan {
        let bearer = format!("Bearer {KEY_A}");
        let pairs = req(&[
            (":method", "POST"),
            (":authority", "gw.example"),
            ("authorization", &bearer),
            ("x-request-id", rid),
        ]);
        let pass = Pass {
            secret,
            envoy_request_id: rid,
        };
        authenticate_pass(set.global(), &pairs, NOW, Some(pass))
    }

    /// The second pass as the redirect delivers it: the first pass's headers as edited (key
    /// gone, the provider's credential set by the router), method turned into GET, authority
    /// replaced, plus what the redirect policy adds.
    fn second_pass(set: &RuleSet<KeyAuthConfig>, secret: &Secret, rid: &str, ticket: &str) -> Plan {
        let pairs = req(&[
            (":method", "GET"),
            (":authority", "llm-gateway"),
            ("authorization", "Bearer sk-provider-credential"),
            ("x-request-id", rid),
            ("x-llm-deployment", "stale"),
            (headers::ROUTE_NEXT, "2|fast|id|a,b"),
            (reentry::HEADER, ticket),
        ]);
        let pass = Pass {
            secret,
            envoy_request_id: rid,
        };
        authenticate_pass(set.global(), &pairs, NOW + 1, Some(pass))
    }

    #[test]
    fn a_redirected_request_passes_on_the_ticket_of_its_first_pass() {
        let set = config("");
        let secret = Secret::new([9; 32]);
        let first = first_pass(&set, &secret, "rid-1");
        assert!(matches!(first.outcome, Outcome::Allow { .. }));
        let ticket = first.ticket.clone().expect("a ticket is issued");

        let second = second_pass(&set, &secret, "rid-1", &ticket);
        let Outcome::Allow { identity, .. } = &second.outcome else {
            panic!("{:?}", second.outcome);
        };
        assert!(identity.contains(&(headers::CONSUMER, "team-a".to_string())));
        // the provider credential, the ticket and the stale header go; the continuation stays
        for name in ["authorization", reentry::HEADER, "x-llm-deployment"] {
            assert!(
                second.remove.iter().any(|r| r == name),
                "{name}: {:?}",
                second.remove
            );
        }
        assert!(!second.remove.iter().any(|r| r == headers::ROUTE_NEXT));
        assert_eq!(
            second.restore,
            vec![
                (":method", "POST".to_string()),
                (":authority", "gw.example".to_string()),
                (headers::REENTRY, "1".to_string()),
            ]
        );
        // a further redirect gets a ticket of its own
        let third = second_pass(&set, &secret, "rid-1", second.ticket.as_deref().unwrap());
        assert!(matches!(third.outcome, Outcome::Allow { .. }));
    }

    #[test]
    fn a_ticket_a_client_sends_is_removed_and_the_key_asked_for() {
        let set = config("");
        let secret = Secret::new([9; 32]);
        let ticket = first_pass(&set, &secret, "rid-1").ticket.unwrap();
        // another request (Envoy gave it another x-request-id), a forged ticket, another VM
        for (rid, ticket, secret) in [
            ("rid-2", ticket.clone(), secret.clone()),
            ("rid-1", format!("{ticket}0"), secret.clone()),
            ("rid-1", ticket.clone(), Secret::new([8; 32])),
        ] {
            let plan = second_pass(&set, &secret, rid, &ticket);
            // the provider's credential is no virtual key: refused, no identity, no restore
            assert_eq!(code(&plan), Some("invalid_api_key"), "{rid} {ticket}");
            assert!(plan.restore.is_empty());
            assert!(plan.remove.iter().any(|r| r == reentry::HEADER));
            assert!(plan.remove.iter().any(|r| r == headers::ROUTE_NEXT));
        }
        // a client's copy beside its real key: authenticated as a new request, copy removed
        let bearer = format!("Bearer {KEY_A}");
        let pairs = req(&[
            (":method", "POST"),
            (":authority", "gw.example"),
            ("authorization", &bearer),
            (reentry::HEADER, &ticket),
            (headers::ROUTE_NEXT, "2|fast|id|a,b"),
        ]);
        let pass = Pass {
            secret: &secret,
            envoy_request_id: "rid-3",
        };
        let plan = authenticate_pass(set.global(), &pairs, NOW, Some(pass));
        assert!(matches!(plan.outcome, Outcome::Allow { .. }));
        assert!(plan.restore.is_empty());
        for name in [reentry::HEADER, headers::ROUTE_NEXT] {
            assert!(plan.remove.iter().any(|r| r == name), "{name}");
        }
    }

    #[test]
    fn re_entry_checks_the_key_again_and_can_be_turned_off() {
        let secret = Secret::new([9; 32]);
        let set = config("");
        let ticket = first_pass(&set, &secret, "rid").ticket.unwrap();
        // the key disabled by a new config with the same secret: refused on the second pass
        let disabled = parse_document(
            format!(
                r#"{{"keys":[{{"key_sha256":"{}","consumer":"team-a","groups":["fast"],"disabled":true}}]}}"#,
                sha(KEY_A)
            )
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(
            code(&second_pass(&disabled, &secret, "rid", &ticket)),
            Some("disabled_api_key")
        );
        // `"reentry": false`: no ticket issued, none accepted
        let off = config(r#","reentry":false"#);
        assert_eq!(first_pass(&off, &secret, "rid").ticket, None);
        assert_eq!(
            code(&second_pass(&off, &secret, "rid", &ticket)),
            Some("invalid_api_key")
        );
    }
}
