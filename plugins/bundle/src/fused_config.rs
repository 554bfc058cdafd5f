//! The fused filter's configuration: one JSON object whose members are the five plugins'
//! configurations, unchanged, each under its plugin's name.
//!
//! ```json
//! {
//!   "key_auth":         { "keys": [ ... ] },
//!   "model_router":     { "groups": { ... }, "deployments": [ ... ] },
//!   "pii_redaction":    { "rules": [ ... ] },
//!   "usage_accounting": { "filter_state": "llm_usage" },
//!   "token_ratelimit":  { "limits": [ ... ] }
//! }
//! ```
//!
//! A section that is absent turns its stage off (the chain without it, like leaving its
//! filter out of Envoy's chain); at least one must be there. Each section is handed to its
//! plugin's own parser, which checks it exactly as its own filter would.

use llm_gateway_shared::config::ConfigError;
use serde_json::{Map, Value};

/// The plugins of the chain, in chain order, by their section names.
pub const SECTIONS: [&str; 5] = [
    "key_auth",
    "model_router",
    "pii_redaction",
    "usage_accounting",
    "token_ratelimit",
];

/// Each plugin's configuration document (`None`: the stage is off), in [`SECTIONS`] order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sections {
    /// The documents, serialized as each plugin's filter would receive them.
    pub documents: [Option<Vec<u8>>; SECTIONS.len()],
}

impl Sections {
    /// The document of `section` (one of [`SECTIONS`]).
    pub fn get(&self, section: &str) -> Option<&[u8]> {
        let index = SECTIONS.iter().position(|s| *s == section)?;
        self.documents.get(index)?.as_deref()
    }
}

/// Splits the fused filter's configuration into its sections.
pub fn parse(document: &[u8]) -> Result<Sections, ConfigError> {
    let value: Value = serde_json::from_slice(document).map_err(|e| {
        ConfigError::new(
            "",
            format!("the fused filter's configuration is not JSON: {e}"),
        )
    })?;
    let Value::Object(object) = value else {
        return Err(ConfigError::new(
            "",
            "the fused filter's configuration must be a JSON object",
        ));
    };
    parse_object(object)
}

fn parse_object(object: Map<String, Value>) -> Result<Sections, ConfigError> {
    let mut sections = Sections::default();
    for (name, value) in object {
        let Some(index) = SECTIONS.iter().position(|s| *s == name) else {
            return Err(ConfigError::new(
                name.as_str(),
                format!("unknown section; the sections are {}", SECTIONS.join(", ")),
            ));
        };
        if !value.is_object() {
            return Err(ConfigError::new(
                name.as_str(),
                "a section is its plugin's configuration: a JSON object",
            ));
        }
        let bytes = serde_json::to_vec(&value)
            .map_err(|e| ConfigError::new(name.as_str(), format!("cannot be serialized: {e}")))?;
        if let Some(slot) = sections.documents.get_mut(index) {
            *slot = Some(bytes);
        }
    }
    if sections.documents.iter().all(Option::is_none) {
        return Err(ConfigError::new(
            "",
            format!(
                "the fused filter needs at least one section of {}",
                SECTIONS.join(", ")
            ),
        ));
    }
    Ok(sections)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_section_is_its_plugins_document_unchanged() {
        let sections = parse(
            br#"{"key_auth":{"keys":[{"name":"a"}]},"token_ratelimit":{"limits":[]},"pii_redaction":{}}"#,
        )
        .unwrap();
        assert_eq!(
            sections.get("key_auth"),
            Some(&br#"{"keys":[{"name":"a"}]}"#[..])
        );
        assert_eq!(sections.get("pii_redaction"), Some(&b"{}"[..]));
        assert_eq!(
            sections.get("token_ratelimit"),
            Some(&br#"{"limits":[]}"#[..])
        );
        assert_eq!(sections.get("model_router"), None);
        assert_eq!(sections.get("usage_accounting"), None);
        assert_eq!(sections.get("nope"), None);
    }

    #[test]
    fn bad_documents_name_the_section() {
        for (document, field, why) in [
            (&b"[1]"[..], "", "must be a JSON object"),
            (b"{", "", "not JSON"),
            (b"{}", "", "at least one section"),
            (br#"{"pii":{}}"#, "pii", "unknown section"),
            (br#"{"key_auth":[]}"#, "key_auth", "a JSON object"),
        ] {
            let err = parse(document).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
            if !field.is_empty() {
                assert!(err.contains(field), "{err}");
            }
        }
    }
}
