//! Every plugin's configuration parser, plain JSON and Higress's `_rules_` form
//! (`shared::rules::RuleSet` + each plugin's validation), and rule selection.
//!
//! Input: `plugin selector, match selector, document`. Checked:
//! - parsing either succeeds or names a field, without panicking, however the document is
//!   broken (user regexes of pii-redaction are compiled here too);
//! - an error never echoes a credential: a string at `credential`, `password`, `key_sha256`
//!   or `hash_salt` is not in the message (unless the same text is also a key or a value
//!   elsewhere in the document, which an error may name, or the message holds that text
//!   anyway: the same document with the secret replaced by a marker gives a message without
//!   the marker — the fuzzer once wrote an error message itself into `key_sha256`);
//! - a parsed rule set selects a config for any request facts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_gateway_fuzz::Input;
use llm_gateway_shared::config::ConfigError;
use llm_gateway_shared::rules::{MatchInput, MatchNeeds, RuleSet};
use serde_json::Value;

const SECRET_FIELDS: [&str; 4] = ["credential", "password", "key_sha256", "hash_salt"];

const ROUTES: [&str; 3] = ["", "default/llm-batch", "llm-chat"];
const AUTHORITIES: [&str; 4] = ["", "api.example.com:443", "[::1]:8080", "WWW.Example.COM"];
const CLUSTERS: [&str; 3] = ["", "outbound|443||api.openai.com", "openai"];

/// Strings at secret fields, and every other key and string, of a document.
fn strings(
    value: &Value,
    under: Option<&str>,
    secrets: &mut Vec<String>,
    others: &mut Vec<String>,
) {
    match value {
        Value::String(s) => match under {
            Some(field) if SECRET_FIELDS.contains(&field) => secrets.push(s.clone()),
            _ => others.push(s.clone()),
        },
        Value::Array(items) => items
            .iter()
            .for_each(|v| strings(v, under, secrets, others)),
        Value::Object(members) => {
            for (key, v) in members {
                others.push(key.clone());
                strings(v, Some(key), secrets, others);
            }
        }
        _ => {}
    }
}

/// Replaces every string equal to `secret` at a secret field with `marker`.
fn mark(value: &mut Value, under: Option<&str>, secret: &str, marker: &str) {
    match value {
        Value::String(s) if s == secret && under.is_some_and(|f| SECRET_FIELDS.contains(&f)) => {
            *s = marker.to_string();
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|v| mark(v, under, secret, marker)),
        Value::Object(members) => {
            for (key, v) in members.iter_mut() {
                mark(v, Some(key.as_str()), secret, marker);
            }
        }
        _ => {}
    }
}

fn check_error(document: &[u8], error: &ConfigError, reparse: &dyn Fn(&[u8]) -> Option<String>) {
    let message = error.to_string();
    let Ok(value) = serde_json::from_slice::<Value>(document) else {
        return;
    };
    let (mut secrets, mut others) = (Vec::new(), Vec::new());
    strings(&value, None, &mut secrets, &mut others);
    for secret in secrets.iter().filter(|s| s.len() >= 12) {
        if others.iter().any(|o| o.contains(secret.as_str())) || !message.contains(secret.as_str())
        {
            continue;
        }
        // the message holds the secret's text: echoed, or there anyway?
        const MARKER: &str = "SECRET-MARKER-7f3a9c";
        let mut marked = value.clone();
        mark(&mut marked, None, secret, MARKER);
        let again = serde_json::to_vec(&marked).ok().and_then(|d| reparse(&d));
        assert!(
            !again.is_some_and(|m| m.contains(MARKER)),
            "a config error echoes a credential: {message}"
        );
    }
}

fn select<C>(rules: &RuleSet<C>, pick: u8) -> bool {
    let needs: MatchNeeds = rules.needs();
    let input = MatchInput {
        route: ROUTES[usize::from(pick) % ROUTES.len()],
        authority: AUTHORITIES[usize::from(pick >> 2) % AUTHORITIES.len()],
        cluster: CLUSTERS[usize::from(pick >> 4) % CLUSTERS.len()],
    };
    let _ = (
        needs.route,
        needs.authority,
        needs.cluster,
        rules.configs().count(),
    );
    rules.select(&input).is_some()
}

fn outcome<C>(document: &[u8], pick: u8, parse: impl Fn(&[u8]) -> Result<RuleSet<C>, ConfigError>) {
    match parse(document) {
        Ok(rules) => {
            let selected = select(&rules, pick);
            if rules.global().is_some() {
                assert!(selected, "a global config but nothing selected");
            }
        }
        Err(error) => check_error(document, &error, &|d| parse(d).err().map(|e| e.to_string())),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let plugin = input.byte();
    let pick = input.byte();
    let document = input.rest();
    match plugin % 6 {
        0 => outcome(document, pick, key_auth::config::parse_document),
        1 => outcome(document, pick, model_router::config::parse_document),
        2 => outcome(document, pick, pii_redaction::config::parse_document),
        3 => outcome(document, pick, token_ratelimit::config::parse_document),
        4 => outcome(document, pick, usage_accounting::config::parse_document),
        // the rule layer alone, with a plugin that takes any object
        _ => outcome(document, pick, |d| {
            RuleSet::parse(d, |fields, scope| Ok((fields.len(), scope)))
        }),
    }
});
