//! The decision: from the request headers, the config and the time to an edit plan.
//!
//! [`authenticate`] is pure. The shell copies the request headers out of the host, calls it,
//! and applies the returned [`Plan`]: remove headers, then either refuse with the plan's
//! [`Reject`] or set the identity headers and let the request through.

use crate::config::{KeyAuthConfig, KeyEntry, KeySource};
use llm_gateway_shared::headers;
use llm_gateway_shared::reject::Reject;
use sha2::{Digest, Sha256};

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
}

impl DenyReason {
    /// Every reason, for defining one metric each.
    pub const ALL: [DenyReason; 5] = [
        DenyReason::Missing,
        DenyReason::Unknown,
        DenyReason::Expired,
        DenyReason::Disabled,
        DenyReason::NotAllowed,
    ];

    /// The error code.
    pub fn code(self) -> &'static str {
        match self {
            DenyReason::Missing => "missing_api_key",
            DenyReason::Unknown => "invalid_api_key",
            DenyReason::Expired => "expired_api_key",
            DenyReason::Disabled => "disabled_api_key",
            DenyReason::NotAllowed => "consumer_not_allowed",
        }
    }
}

/// What happens to the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
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
/// `outcome`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Header names to remove: every client-supplied internal header, and (when a config
    /// applies) every configured credential header present, so no key reaches a provider.
    pub remove: Vec<String>,
    /// The new `:path` without the key query parameter, when one was present.
    pub path: Option<String>,
    /// What happens next.
    pub outcome: Outcome,
}

/// Decides on a request. `headers` are the request headers as the host gives them
/// (lowercase names, byte values, pseudo-headers included); `now` is Unix seconds.
pub fn authenticate(
    config: Option<&KeyAuthConfig>,
    headers: &[(String, Vec<u8>)],
    now: i64,
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
        };
    };

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

    let outcome = decide(config, presented.as_deref(), now);
    Plan {
        remove,
        path,
        outcome,
    }
}

fn decide(config: &KeyAuthConfig, presented: Option<&[u8]>, now: i64) -> Outcome {
    let Some(key) = presented else {
        return deny(DenyReason::Missing, config.missing_message.clone(), None);
    };
    if key.len() > MAX_KEY_LEN {
        return deny(
            DenyReason::Unknown,
            "Incorrect API key provided.".into(),
            None,
        );
    }
    let digest: [u8; 32] = Sha256::digest(key).into();
    let Some(entry) = config.keys.get(&digest) else {
        let key_id = digest_prefix(&digest);
        return deny(
            DenyReason::Unknown,
            "Incorrect API key provided.".into(),
            Some(key_id),
        );
    };
    let key_id = || Some(entry.key_id.clone());
    if entry.disabled {
        return deny(
            DenyReason::Disabled,
            "This API key has been disabled.".into(),
            key_id(),
        );
    }
    if entry.expires_at.is_some_and(|at| now >= at) {
        return deny(
            DenyReason::Expired,
            "This API key has expired.".into(),
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
                ),
                key_id(),
            );
        }
    }
    Outcome::Allow {
        identity: identity_headers(entry),
        key_id: entry.key_id.clone(),
    }
}

fn deny(reason: DenyReason, message: String, key_id: Option<String>) -> Outcome {
    let reject = match reason {
        DenyReason::NotAllowed => Reject::forbidden(reason.code(), message),
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
    vec![
        (headers::CONSUMER, entry.consumer.clone()),
        (headers::HIGRESS_CONSUMER, entry.consumer.clone()),
        (headers::TENANT, entry.tenant.clone()),
        (headers::GROUPS, entry.groups.clone()),
        (headers::KEY_ID, entry.key_id.clone()),
    ]
}

/// The first 16 hex digits of a digest: how a key is named in logs.
fn digest_prefix(digest: &[u8; 32]) -> String {
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
mod tests {
    use super::*;
    use crate::config::parse_document;
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
}
