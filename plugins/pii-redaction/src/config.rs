//! pii-redaction configuration: raw serde form, then validation into [`PiiConfig`]
//! (patterns compiled here, once per VM).
//!
//! ```json
//! {
//!   "rules": [
//!     {"detector": "email"},
//!     {"detector": "id_cn", "action": "mask", "restore": true},
//!     {"detector": "card", "action": "hash"},
//!     {"detector": "private_key", "action": "block"},
//!     {"name": "EMPLOYEE", "pattern": "E-[0-9]{6}"},
//!     {"name": "CODENAME", "words": ["Project Falcon"], "action": "block"}
//!   ],
//!   "output_rules": [{"detector": "ipv4"}],
//!   "hash_salt": "change-me",
//!   "scope": "messages",
//!   "max_body_bytes": 1048576,
//!   "oversize": "reject",
//!   "preamble": "Keep tokens like [EMAIL_1] exactly as written.",
//!   "hold_headers": false,
//!   "reentry": true
//! }
//! ```
//! Without `rules`, every built-in detector masks and restores.

use crate::detect::{deny_words_pattern, Builtin, Detector};
use crate::mask::{Action, Redactor, Rule, MAX_NAME_LEN};
use llm_gateway_shared::config::{self, ConfigError};
use llm_gateway_shared::rules::{RuleSet, Scope};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::rc::Rc;

/// Which part of a request body is scanned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyScope {
    /// Message text of the OpenAI, Responses and Anthropic APIs (JSON bodies).
    Messages,
    /// The whole body as text, whatever the path or format.
    RawBody,
}

/// What happens to a body larger than `max_body_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Oversize {
    /// 413 `request_too_large`.
    Reject,
    /// Forwarded unscanned, counted in `llm_gateway.pii.oversize_passed`.
    Pass,
}

/// The validated configuration of one scope.
#[derive(Debug, Clone)]
pub struct PiiConfig {
    /// Compiled rules.
    pub redactor: Redactor,
    /// What is scanned.
    pub scope: BodyScope,
    /// Largest body scanned.
    pub max_body_bytes: usize,
    /// Policy above it.
    pub oversize: Oversize,
    /// Instruction added to the request when something was masked.
    pub preamble: Option<String>,
    /// Output rules: personal data the model produced is masked (never restored) or hashed in
    /// responses.
    pub output: Option<Redactor>,
    /// Hold the request headers until the body is redacted (`Pause` from the headers
    /// callback). Needs Envoy's `allow_on_headers_stop_iteration: true` on the filter, else
    /// Envoy never delivers the body to the plugin.
    pub hold_headers: bool,
    /// Watch for an internal redirect superseding the pass (`response.code_details` read at
    /// `on_log`; the placeholder map stashed for the next pass; the message texts fingerprinted
    /// to tell a re-sent body from the forwarded one): the fallback of Higress and
    /// `envoy-config/gateway-1.36.yaml`. `false` where the fallback is the router's retries
    /// (`envoy-config/gateway.yaml`): nothing re-enters the chain there, and the read is
    /// saved.
    pub reentry: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    rules: Option<Vec<RawRule>>,
    #[serde(default)]
    hash_salt: Option<String>,
    #[serde(default = "default_scope")]
    scope: String,
    #[serde(default = "default_max_body")]
    max_body_bytes: u64,
    #[serde(default = "default_oversize")]
    oversize: String,
    #[serde(default)]
    preamble: Option<String>,
    #[serde(default)]
    hold_headers: bool,
    #[serde(default = "config::default_true")]
    reentry: bool,
    #[serde(default)]
    output_rules: Option<Vec<RawRule>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    detector: Option<String>,
    #[serde(default)]
    pattern: Option<String>,
    #[serde(default)]
    words: Option<Vec<String>>,
    #[serde(default = "default_action")]
    action: String,
    #[serde(default)]
    restore: Option<bool>,
}

fn default_scope() -> String {
    "messages".into()
}
fn default_max_body() -> u64 {
    1024 * 1024
}
fn default_oversize() -> String {
    "reject".into()
}
fn default_action() -> String {
    "mask".into()
}

/// Largest `max_body_bytes` accepted (a VM's memory never shrinks after a huge body).
pub const MAX_BODY_LIMIT: u64 = 64 * 1024 * 1024;
/// Largest user pattern (regex-lite compiles in time linear in it, but keep configs sane).
const MAX_PATTERN_LEN: usize = 4096;

/// Parses a whole configuration document (plain JSON or Higress form). Each scope's config
/// is shared (`Rc`) so a request keeps it without copying compiled patterns.
pub fn parse_document(document: &[u8]) -> Result<RuleSet<Rc<PiiConfig>>, ConfigError> {
    RuleSet::parse(document, |fields, scope| {
        parse_scope(fields, scope).map(Rc::new)
    })
}

fn parse_scope(fields: &Map<String, Value>, _scope: Scope) -> Result<PiiConfig, ConfigError> {
    let raw: RawConfig = config::from_value("", Value::Object(fields.clone()))?;
    let rules = match &raw.rules {
        None => Builtin::ALL
            .into_iter()
            .map(|b| Rule {
                name: b.default_name().to_owned(),
                detector: Detector::Builtin(b),
                action: Action::Mask { restore: true },
            })
            .collect(),
        Some(raw_rules) => raw_rules
            .iter()
            .enumerate()
            .map(|(i, r)| rule(r).map_err(|e| e.within(&format!("rules[{i}]"))))
            .collect::<Result<Vec<_>, _>>()?,
    };
    let output = match &raw.output_rules {
        None => None,
        Some(raw_rules) => Some(
            raw_rules
                .iter()
                .enumerate()
                .map(|(i, r)| output_rule(r).map_err(|e| e.within(&format!("output_rules[{i}]"))))
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    let hashes = rules
        .iter()
        .chain(output.iter().flatten())
        .any(|r| r.action == Action::Hash);
    let salt = raw.hash_salt.unwrap_or_default();
    if hashes && salt.len() < 8 {
        return Err(ConfigError::new(
            "hash_salt",
            "a rule hashes: set hash_salt to at least 8 characters",
        ));
    }
    let scope = match raw.scope.as_str() {
        "messages" => BodyScope::Messages,
        "raw_body" => BodyScope::RawBody,
        _ => {
            return Err(ConfigError::new(
                "scope",
                "must be \"messages\" or \"raw_body\"",
            ))
        }
    };
    if raw.max_body_bytes == 0 || raw.max_body_bytes > MAX_BODY_LIMIT {
        return Err(ConfigError::new(
            "max_body_bytes",
            format!("must be in 1..={MAX_BODY_LIMIT}"),
        ));
    }
    let oversize = match raw.oversize.as_str() {
        "reject" => Oversize::Reject,
        "pass" => Oversize::Pass,
        _ => {
            return Err(ConfigError::new(
                "oversize",
                "must be \"reject\" or \"pass\"",
            ))
        }
    };
    Ok(PiiConfig {
        output: output
            .filter(|rules| !rules.is_empty())
            .map(|rules| Redactor::new(rules, salt.clone())),
        redactor: Redactor::new(rules, salt),
        scope,
        max_body_bytes: usize::try_from(raw.max_body_bytes).unwrap_or(usize::MAX),
        oversize,
        preamble: raw.preamble.filter(|p| !p.is_empty()),
        hold_headers: raw.hold_headers,
        reentry: raw.reentry,
    })
}

fn rule(raw: &RawRule) -> Result<Rule, ConfigError> {
    let kinds = [
        raw.detector.is_some(),
        raw.pattern.is_some(),
        raw.words.is_some(),
    ];
    if kinds.iter().filter(|k| **k).count() != 1 {
        return Err(ConfigError::new(
            "",
            "set exactly one of detector, pattern, words",
        ));
    }
    let (detector, default_name) = if let Some(id) = &raw.detector {
        let builtin = Builtin::from_id(id).ok_or_else(|| {
            let known: Vec<&str> = Builtin::ALL.iter().map(|b| b.id()).collect();
            ConfigError::new(
                "detector",
                format!("unknown; use one of {}", known.join(", ")),
            )
        })?;
        (Detector::Builtin(builtin), Some(builtin.default_name()))
    } else if let Some(pattern) = &raw.pattern {
        if pattern.is_empty() || pattern.len() > MAX_PATTERN_LEN {
            return Err(ConfigError::new(
                "pattern",
                format!("must be 1 to {MAX_PATTERN_LEN} bytes"),
            ));
        }
        let re = regex_lite::Regex::new(pattern)
            .map_err(|e| ConfigError::new("pattern", format!("not a valid regex: {e}")))?;
        if re.is_match("") {
            return Err(ConfigError::new("pattern", "must not match empty text"));
        }
        (Detector::Regex(re), None)
    } else {
        let words = raw.words.as_deref().unwrap_or_default();
        if words.is_empty() || words.iter().any(String::is_empty) {
            return Err(ConfigError::new(
                "words",
                "must be a non-empty list of non-empty words",
            ));
        }
        let re = regex_lite::Regex::new(&deny_words_pattern(words))
            .map_err(|e| ConfigError::new("words", format!("cannot compile: {e}")))?;
        (Detector::Regex(re), None)
    };
    let name = match (&raw.name, default_name) {
        (Some(name), _) => name.clone(),
        (None, Some(name)) => name.to_owned(),
        (None, None) => {
            return Err(ConfigError::new(
                "name",
                "required for a pattern or words rule",
            ))
        }
    };
    validate_rule_name(&name)?;
    let action = match (raw.action.as_str(), raw.restore) {
        ("mask", restore) => Action::Mask {
            restore: restore.unwrap_or(true),
        },
        ("hash", None) => Action::Hash,
        ("block", None) => Action::Block,
        ("hash" | "block", Some(_)) => {
            return Err(ConfigError::new(
                "restore",
                "applies only to the mask action",
            ))
        }
        _ => {
            return Err(ConfigError::new(
                "action",
                "must be \"mask\", \"hash\" or \"block\"",
            ))
        }
    };
    Ok(Rule {
        name,
        detector,
        action,
    })
}

/// An output rule: `mask` (never restored) or `hash`; `block` cannot apply to an answer
/// already on its way.
fn output_rule(raw: &RawRule) -> Result<Rule, ConfigError> {
    if raw.action == "block" {
        return Err(ConfigError::new(
            "action",
            "output rules can \"mask\" or \"hash\", not block",
        ));
    }
    if raw.restore == Some(true) {
        return Err(ConfigError::new("restore", "output rules never restore"));
    }
    let mut rule = rule(&RawRule {
        restore: None,
        name: raw.name.clone(),
        detector: raw.detector.clone(),
        pattern: raw.pattern.clone(),
        words: raw.words.clone(),
        action: raw.action.clone(),
    })?;
    if let Action::Mask { .. } = rule.action {
        rule.action = Action::Mask { restore: false };
    }
    Ok(rule)
}

fn validate_rule_name(name: &str) -> Result<(), ConfigError> {
    let ok = name.len() <= MAX_NAME_LEN
        && name.bytes().next().is_some_and(|c| c.is_ascii_uppercase())
        && name
            .bytes()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            "name",
            format!("must be 1 to {MAX_NAME_LEN} of A-Z, 0-9, _ starting with a letter"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(doc: &str) -> Result<Rc<PiiConfig>, ConfigError> {
        parse_document(doc.as_bytes()).map(|set| set.global().cloned().unwrap())
    }

    #[test]
    fn defaults_enable_every_builtin() {
        let c = parse("{}").unwrap();
        assert_eq!(c.redactor.rules().len(), Builtin::ALL.len());
        assert_eq!(c.scope, BodyScope::Messages);
        assert_eq!(c.max_body_bytes, 1 << 20);
        assert_eq!(c.oversize, Oversize::Reject);
        assert!(c
            .redactor
            .rules()
            .iter()
            .all(|r| r.action == Action::Mask { restore: true }));
    }

    #[test]
    fn full_config() {
        let c = parse(
            r#"{"rules":[{"detector":"email","restore":false},{"detector":"card","action":"hash"},
            {"name":"EMP","pattern":"E-[0-9]{6}"},{"name":"CODE","words":["falcon"],"action":"block"}],
            "hash_salt":"12345678","scope":"raw_body","max_body_bytes":10,"oversize":"pass","preamble":"keep"}"#,
        )
        .unwrap();
        let names: Vec<_> = c.redactor.rules().iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["EMAIL", "CARD", "EMP", "CODE"]);
        assert_eq!(
            c.redactor.rules()[0].action,
            Action::Mask { restore: false }
        );
        assert_eq!(c.scope, BodyScope::RawBody);
        assert_eq!(c.oversize, Oversize::Pass);
        assert_eq!(c.preamble.as_deref(), Some("keep"));
        assert!(c.output.is_none());
        let c = parse(r#"{"output_rules":[{"detector":"email"},{"detector":"card","action":"hash"}],"hash_salt":"12345678"}"#).unwrap();
        let output = c.output.as_ref().unwrap();
        assert_eq!(output.rules()[0].action, Action::Mask { restore: false });
        assert_eq!(output.rules()[1].action, Action::Hash);
    }

    #[test]
    fn errors_name_the_field() {
        for (doc, field) in [
            (r#"{"rules":[{"detector":"nope"}]}"#, "rules[0].detector"),
            (r#"{"rules":[{}]}"#, "rules[0]"),
            (
                r#"{"rules":[{"detector":"email","pattern":"x"}]}"#,
                "rules[0]",
            ),
            (r#"{"rules":[{"pattern":"x"}]}"#, "rules[0].name"),
            (
                r#"{"rules":[{"name":"X","pattern":"("}]}"#,
                "rules[0].pattern",
            ),
            (
                r#"{"rules":[{"name":"X","pattern":"a*"}]}"#,
                "rules[0].pattern",
            ),
            (r#"{"rules":[{"name":"x","pattern":"a"}]}"#, "rules[0].name"),
            (r#"{"rules":[{"name":"X","words":[]}]}"#, "rules[0].words"),
            (
                r#"{"rules":[{"detector":"email","action":"drop"}]}"#,
                "rules[0].action",
            ),
            (
                r#"{"rules":[{"detector":"email","action":"hash","restore":true}]}"#,
                "rules[0].restore",
            ),
            (
                r#"{"rules":[{"detector":"email","action":"hash"}]}"#,
                "hash_salt",
            ),
            (r#"{"scope":"all"}"#, "scope"),
            (r#"{"max_body_bytes":0}"#, "max_body_bytes"),
            (r#"{"oversize":"drop"}"#, "oversize"),
            (
                r#"{"output_rules":[{"detector":"email","action":"block"}]}"#,
                "output_rules[0].action",
            ),
            (
                r#"{"output_rules":[{"detector":"email","restore":true}]}"#,
                "output_rules[0].restore",
            ),
            (
                r#"{"output_rules":[{"detector":"card","action":"hash"}]}"#,
                "hash_salt",
            ),
        ] {
            let err = parse(doc).unwrap_err();
            assert_eq!(err.field(), field, "{doc}: {err}");
        }
        let err = parse(r#"{"bogus":1}"#).unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }

    #[test]
    fn salt_never_in_errors() {
        let err = parse(r#"{"hash_salt":"s3cret-salt-value","scope":1}"#).unwrap_err();
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }
}
