//! The pii-redaction config the corpus is scored with: the JSON value of a gateway YAML's
//! pii-redaction filter (`envoy-config/gateway.yaml` by default), or a JSON document.
//!
//! Rules naming a detector this build does not have are dropped and listed, so one config
//! (tools/pii-bench/all-detectors.json) serves every branch.

use pii_redaction::config::{parse_document, PiiConfig};
use pii_redaction::detect::Builtin;
use std::rc::Rc;

/// A config ready to score with.
#[derive(Debug)]
pub struct Loaded {
    pub config: Rc<PiiConfig>,
    /// Detector ids of its rules, in order.
    pub detectors: Vec<String>,
    /// Detector ids the config names that this build lacks (their rules dropped).
    pub missing: Vec<String>,
}

/// The block scalar after `value: |` of the filter whose `root_id` is `root_id`, its
/// indentation removed; `None` if there is none.
pub fn yaml_filter_value(yaml: &str, root_id: &str) -> Option<String> {
    let mut lines = yaml.lines();
    lines
        .by_ref()
        .find(|l| l.trim() == format!("root_id: {root_id}"))?;
    let header = lines.by_ref().find(|l| {
        let t = l.trim_start();
        t.starts_with("value: |") || t.starts_with("value: >")
    })?;
    let outer = indent(header);
    let mut body: Vec<&str> = Vec::new();
    for line in lines {
        if !line.trim().is_empty() && indent(line) <= outer {
            break;
        }
        body.push(line);
    }
    let inner = body
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| indent(l))
        .min()?;
    Some(
        body.iter()
            .map(|l| l.get(inner..).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// Drops the rules (and output rules) whose detector this build does not have; returns the
/// document left and the ids dropped.
pub fn drop_unknown_detectors(
    mut doc: serde_json::Value,
) -> (serde_json::Value, Vec<String>, Vec<String>) {
    let mut missing = Vec::new();
    let mut detectors = Vec::new();
    for key in ["rules", "output_rules"] {
        if let Some(rules) = doc.get_mut(key).and_then(|r| r.as_array_mut()) {
            rules.retain(|rule| match rule.get("detector").and_then(|d| d.as_str()) {
                Some(id) if Builtin::from_id(id).is_none() => {
                    missing.push(id.to_owned());
                    false
                }
                Some(id) => {
                    if key == "rules" {
                        detectors.push(id.to_owned());
                    }
                    true
                }
                None => true,
            });
        }
    }
    (doc, detectors, missing)
}

/// Loads `path`: a `.yaml`/`.yml` gateway config (its pii-redaction filter) or a JSON document.
pub fn load(path: &str) -> Result<Loaded, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let json = if path.ends_with(".yaml") || path.ends_with(".yml") {
        yaml_filter_value(&text, "pii-redaction")
            .ok_or_else(|| format!("{path}: no pii-redaction filter with a `value: |` config"))?
    } else {
        text
    };
    let doc: serde_json::Value =
        serde_json::from_str(&json).map_err(|e| format!("{path}: the config is not JSON: {e}"))?;
    let (doc, detectors, missing) = drop_unknown_detectors(doc);
    let rules = parse_document(doc.to_string().as_bytes()).map_err(|e| format!("{path}: {e}"))?;
    let config = rules
        .global()
        .cloned()
        .ok_or_else(|| format!("{path}: no global config"))?;
    let detectors = if doc.get("rules").is_none() {
        Builtin::ALL.iter().map(|b| b.id().to_owned()).collect()
    } else {
        detectors
    };
    Ok(Loaded {
        config,
        detectors,
        missing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = "\
          - name: other
                root_id: key-auth
                configuration:
                  value: |
                    {\"x\": 1}
          - name: pii-redaction
                root_id: pii-redaction
                configuration:
                  \"@type\": type.googleapis.com/google.protobuf.StringValue
                  value: |
                    {
                      \"rules\": [{\"detector\": \"email\"}, {\"detector\": \"phone_xx\"}]
                    }
          - name: usage-accounting
";

    #[test]
    fn the_filter_value_is_read_from_the_yaml() {
        let value = yaml_filter_value(YAML, "pii-redaction").unwrap();
        assert_eq!(
            value,
            "{\n  \"rules\": [{\"detector\": \"email\"}, {\"detector\": \"phone_xx\"}]\n}"
        );
        assert_eq!(yaml_filter_value(YAML, "nope"), None);
    }

    #[test]
    fn unknown_detectors_are_dropped_and_listed() {
        let doc = serde_json::from_str(&yaml_filter_value(YAML, "pii-redaction").unwrap()).unwrap();
        let (doc, detectors, missing) = drop_unknown_detectors(doc);
        assert_eq!(doc["rules"].as_array().unwrap().len(), 1);
        assert_eq!(detectors, ["email"]);
        assert_eq!(missing, ["phone_xx"]);
    }

    #[test]
    fn the_shipped_gateway_config_loads() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../envoy-config/gateway.yaml"
        );
        let loaded = load(path).unwrap();
        assert!(loaded.detectors.iter().any(|d| d == "email"));
        assert!(loaded.missing.is_empty(), "{:?}", loaded.missing);
    }
}
