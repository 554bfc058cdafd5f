//! Configuration errors that name the field and the reason.
//!
//! Plugins read their JSON in two steps: serde into a raw form (defaults in one place), then a
//! validating conversion into the real config. Both steps report a [`ConfigError`]; the shell
//! logs it in `on_configure` and returns `false`, so Envoy and Higress refuse the config
//! instead of running with half of it.

use std::fmt;

/// `true`: the serde default of a switch that is on unless the config turns it off
/// (`#[serde(default = "config::default_true")]`).
pub fn default_true() -> bool {
    true
}

/// A configuration the plugin refuses, with the JSON path of the offending field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    field: String,
    reason: String,
}

impl ConfigError {
    /// `field` is a JSON path such as `keys[3].expires_at`; empty for the document itself.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The same error seen from an enclosing object: `within("_rules_[1]")` turns the field
    /// `allow` into `_rules_[1].allow`.
    #[must_use]
    pub fn within(mut self, prefix: &str) -> Self {
        self.field = if self.field.is_empty() {
            prefix.to_string()
        } else if self.field.starts_with('[') {
            format!("{prefix}{}", self.field)
        } else {
            format!("{prefix}.{}", self.field)
        };
        self
    }

    /// The JSON path of the field at fault (empty: the whole document).
    pub fn field(&self) -> &str {
        &self.field
    }

    /// Why the field was refused.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// Turns a serde error on the raw form into a config error. serde_json names the
    /// unknown or missing field in its message; the path is the caller's prefix.
    pub fn from_serde(prefix: &str, err: &serde_json::Error) -> Self {
        // serde_json appends " at line L column C" which means nothing for a config that
        // arrived as a parsed value; keep the message only.
        let message = err.to_string();
        let reason = match message.find(" at line ") {
            Some(cut) => message.get(..cut).unwrap_or(&message).to_string(),
            None => message,
        };
        ConfigError::new(prefix, redact_string_literal(&reason))
    }
}

/// Deserializes a config object (or part of one, at `prefix`) into `T`; an error names the
/// field that failed (`prefix.limits[1].per`), as serde's own errors do not.
pub fn from_value<T: serde::de::DeserializeOwned>(
    prefix: &str,
    value: serde_json::Value,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = err.path().to_string();
        let field = match (prefix.is_empty(), path.as_str()) {
            (_, ".") => prefix.to_string(),
            (true, _) => path,
            (false, _) => format!("{prefix}.{path}"),
        };
        ConfigError::from_serde(&field, err.inner())
    })
}

/// serde quotes the offending string (`invalid type: string "sk-live-…", expected a
/// boolean`); a key pasted into the wrong field must not reach the log, so the literal goes.
fn redact_string_literal(reason: &str) -> String {
    for lead in ["invalid type: string \"", "invalid value: string \""] {
        if let Some(rest) = reason.strip_prefix(lead) {
            if let Some(end) = rest.rfind("\", expected") {
                let tail = rest.get(end + 1..).unwrap_or_default();
                let kind = lead.trim_end_matches('"').trim_end();
                return format!("{kind} (value not shown){tail}");
            }
        }
    }
    reason.to_string()
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "invalid configuration: {}", self.reason)
        } else {
            write!(
                f,
                "invalid configuration: `{}`: {}",
                self.field, self.reason
            )
        }
    }
}

impl std::error::Error for ConfigError {}

/// A name that is safe to copy into an HTTP header value and a log line: ASCII letters,
/// digits and `-_.:@/`, 1 to 128 characters. Consumer, tenant and group names must be this.
pub fn validate_name(field: &str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() {
        return Err(ConfigError::new(field, "must not be empty"));
    }
    if value.len() > 128 {
        return Err(ConfigError::new(field, "must be at most 128 characters"));
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '@' | '/')))
    {
        return Err(ConfigError::new(
            field,
            format!("character {bad:?} not allowed (use letters, digits and -_.:@/)"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn within_builds_json_paths() {
        let err = ConfigError::new("expires_at", "bad date");
        assert_eq!(err.clone().within("keys[2]").field(), "keys[2].expires_at");
        assert_eq!(
            ConfigError::new("[0]", "x").within("allow").field(),
            "allow[0]"
        );
        assert_eq!(
            ConfigError::new("", "x").within("_rules_[1]").field(),
            "_rules_[1]"
        );
        assert_eq!(
            err.within("keys[2]").to_string(),
            "invalid configuration: `keys[2].expires_at`: bad date"
        );
    }

    #[test]
    fn from_value_names_the_failing_field_and_hides_strings() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Limit {
            per: u32,
        }
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Doc {
            limits: Vec<Limit>,
            on: bool,
        }
        let cases = [
            (
                json!({"limits": [{"per": 1}, {"per": "sk-secret"}], "on": true}),
                "",
                "limits[1].per",
            ),
            (json!({"limits": [], "on": "yes"}), "", "on"),
            (json!({"limits": [], "on": 1}), "ledger", "ledger.on"),
            (json!({"limits": []}), "ledger", "ledger"),
        ];
        for (value, prefix, field) in cases {
            let err = from_value::<Doc>(prefix, value.clone()).unwrap_err();
            assert_eq!(err.field(), field, "{value}");
            assert!(!err.to_string().contains("sk-secret"), "{err}");
        }
    }

    #[test]
    fn from_serde_drops_position() {
        let err = serde_json::from_str::<u32>("\"x\"").unwrap_err();
        let cfg = ConfigError::from_serde("limit", &err);
        assert_eq!(cfg.field(), "limit");
        assert!(!cfg.reason().contains("line"), "{}", cfg.reason());
        assert!(cfg.reason().contains("invalid type"), "{}", cfg.reason());
    }

    #[test]
    fn from_serde_never_repeats_a_string_value() {
        let err = serde_json::from_str::<bool>("\"sk-live-secret\"").unwrap_err();
        let cfg = ConfigError::from_serde("disabled", &err);
        assert!(!cfg.reason().contains("sk-live-secret"), "{}", cfg.reason());
        assert!(
            cfg.reason().contains("expected a boolean"),
            "{}",
            cfg.reason()
        );
    }

    #[test]
    fn names_are_header_safe() {
        for good in ["team-a", "acme.corp", "svc:billing", "a@b", "x/y", "A_1"] {
            assert!(validate_name("n", good).is_ok(), "{good}");
        }
        for bad in ["", "a b", "a,b", "a\r\nx: y", "é", &"x".repeat(129)] {
            let err = validate_name("consumer", bad).unwrap_err();
            assert_eq!(err.field(), "consumer");
        }
    }
}
