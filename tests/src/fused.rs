//! The fused build: the five filters' stages in one filter context (root id `llm-gateway` of
//! `dist/llm-gateway.wasm`, `plugins/bundle/src/fused.rs`). [`config_from_gateway`] derives
//! `envoy-config/gateway-fused.yaml` from `envoy-config/gateway.yaml`, so the two never drift
//! apart (`e2e fused::` checks the committed file against it): the five listener filters become
//! one whose configuration holds each filter's configuration, unchanged, under the plugin's
//! section name, and the router's upstream filter loads the same module in the same `vm_id`.

use crate::bundle::{MODULE, VM_ID};

/// The fused build's Envoy bootstrap (in `envoy-config/`).
pub const CONFIG: &str = "gateway-fused.yaml";
/// The fused filter's root id.
pub const ROOT_ID: &str = "llm-gateway";

/// gateway.yaml's listener filters the fused filter replaces, in chain order, with their
/// section names.
pub const SECTIONS: [(&str, &str); 5] = [
    ("key-auth", "key_auth"),
    ("model-router", "model_router"),
    ("pii-redaction", "pii_redaction"),
    ("usage-accounting", "usage_accounting"),
    ("token-ratelimit", "token_ratelimit"),
];

const HEADER: &str = "\
# GENERATED from gateway.yaml by tests/src/fused.rs (config_from_gateway); do not edit here.
# e2e fused:: fails when the two disagree; to rewrite this file after changing gateway.yaml:
#   LLM_GATEWAY_BLESS=1 cargo test -p llm-gateway-tests --test e2e -- fused::
#
# The same gateway with the five filters fused into one (dist/llm-gateway.wasm, root_id
# llm-gateway): one filter context runs the plugins' stages in chain order, with one read of the
# headers, one of the body and one per response chunk, and one write back; Envoy calls one wasm
# filter per callback instead of five. Its configuration holds each plugin's configuration,
# unchanged, under the plugin's name. The router's upstream filter (each provider cluster) loads
# the same module in the same vm_id. Plain Envoy only. Unlike gateway.yaml, where
# usage-accounting alone fails open, the one filter fails closed.
#
";

/// The fused filter that replaces the five listener filters; `{SECTIONS}` is the JSON.
const FILTER: &str = "\
          # 1-5. the whole chain in one filter: key-auth -> model-router -> pii-redaction ->
          #    usage-accounting -> token-ratelimit, each configured by its section exactly as its
          #    own filter is in gateway.yaml (plugins/bundle/src/fused_config.rs)
          - name: llm-gateway
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: llm-gateway
                root_id: llm-gateway
                fail_open: false
                allow_on_headers_stop_iteration: true
                vm_config:
                  vm_id: llm-gateway
                  runtime: envoy.wasm.runtime.v8
                  code: { local: { filename: \"${WASM_DIR}/llm-gateway.wasm\" } }
                configuration:
                  \"@type\": type.googleapis.com/google.protobuf.StringValue
                  value: |
{SECTIONS}";

/// Indentation of a configuration's JSON under `value: |`.
const VALUE_INDENT: &str = "                    ";

/// The configuration text (`value: |` block, indentation removed) of the listener filter
/// named `name` in `text`, and the byte range of the whole filter (from its comment line, if
/// one is right above it, to the next filter).
fn filter_block(text: &str, name: &str) -> crate::Result<(String, std::ops::Range<usize>)> {
    let marker = format!("          - name: {name}\n");
    let start = text
        .find(&marker)
        .ok_or_else(|| format!("gateway.yaml has no listener filter `{name}`"))?;
    // the filter's comment lines right above it belong to it
    let mut from = start;
    while let Some(line_start) = text
        .get(..from.saturating_sub(1))
        .and_then(|t| t.rfind('\n'))
    {
        let line = text.get(line_start + 1..from).unwrap_or_default();
        if line.trim_start().starts_with('#') && line.starts_with("          ") {
            from = line_start + 1;
        } else {
            break;
        }
    }
    let after = start + marker.len();
    // the next line at the filters' indentation: the next filter or its comment
    let end = text
        .get(after..)
        .and_then(|rest| {
            let next = |pattern: &str| rest.find(pattern);
            match (next("\n          - name: "), next("\n          # ")) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        })
        .map(|i| after + i + 1)
        .ok_or_else(|| format!("the filter `{name}` has no end"))?;
    let block = text.get(start..end).unwrap_or_default();
    let value_at = block
        .find("value: |\n")
        .ok_or_else(|| format!("the filter `{name}` has no `value: |` configuration"))?;
    let value: Vec<&str> = block
        .get(value_at + "value: |\n".len()..)
        .unwrap_or_default()
        .lines()
        .take_while(|l| l.starts_with(VALUE_INDENT) || l.trim().is_empty())
        .map(|l| l.strip_prefix(VALUE_INDENT).unwrap_or(l.trim()))
        .collect();
    Ok((value.join("\n").trim_end().to_string(), from..end))
}

/// `gateway.yaml` with its five listener wasm filters fused into one and the router's upstream
/// filter in the fused module's VM, under a header that says so. Errs when `gateway.yaml` is
/// not the chain [`SECTIONS`] describes.
pub fn config_from_gateway(gateway: &str) -> crate::Result<String> {
    let mut sections = Vec::new();
    let mut ranges = Vec::new();
    for (filter, section) in SECTIONS {
        let (value, range) = filter_block(gateway, filter)?;
        // each section is its plugin's document, as the filter received it
        serde_json::from_str::<serde_json::Value>(&value)
            .map_err(|e| format!("the configuration of `{filter}` is not JSON: {e}"))?;
        let nested = value.replace('\n', "\n  ");
        sections.push(format!("  \"{section}\": {nested}"));
        ranges.push(range);
    }
    if ranges.windows(2).any(|w| w[0].end != w[1].start) {
        return Err("gateway.yaml's five wasm filters are not next to each other".into());
    }
    let json = format!("{{\n{}\n}}", sections.join(",\n"));
    let indented: String = json
        .lines()
        .map(|l| format!("{VALUE_INDENT}{l}\n"))
        .collect();
    let filter = FILTER.replace("{SECTIONS}", &indented);
    let (Some(first), Some(last)) = (ranges.first(), ranges.last()) else {
        return Err("no filters".into());
    };
    let mut text = String::with_capacity(gateway.len());
    text.push_str(gateway.get(..first.start).unwrap_or_default());
    text.push_str(&filter);
    text.push_str(gateway.get(last.end..).unwrap_or_default());
    // the router's upstream filter: the fused module's VM, which holds the listener's routes
    for (from, to) in [
        (
            "vm_id: model-router\n".to_string(),
            format!("vm_id: {VM_ID}\n"),
        ),
        (
            "filename: \"${WASM_DIR}/model-router.wasm\"".to_string(),
            format!("filename: \"${{WASM_DIR}}/{MODULE}.wasm\""),
        ),
    ] {
        let found = text.matches(&from).count();
        if found != 1 {
            return Err(format!(
                "gateway.yaml has {found} times `{}` outside the listener's filters, expected 1 (the upstream filter)",
                from.trim_end()
            ));
        }
        text = text.replace(&from, &to);
    }
    if text.matches("vm_id: ").count() != text.matches(&format!("vm_id: {VM_ID}\n")).count() {
        return Err("gateway.yaml has a wasm filter the fused config does not replace".into());
    }
    Ok(format!("{HEADER}{text}"))
}

/// The fused filter's configuration in `fused` (the derived bootstrap): its JSON.
pub fn fused_configuration(fused: &str) -> crate::Result<serde_json::Value> {
    let (value, _) = filter_block(fused, ROOT_ID)?;
    serde_json::from_str(&value).map_err(|e| format!("not JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(name: &str, value: &str) -> String {
        format!(
            "          # {name}'s comment\n          - name: {name}\n            typed_config:\n              config:\n                vm_config:\n                  vm_id: {name}\n                  code: {{ local: {{ filename: \"${{WASM_DIR}}/{name}.wasm\" }} }}\n                configuration:\n                  value: |\n{VALUE_INDENT}{value}\n"
        )
    }

    fn gateway() -> String {
        let mut text = String::from("          http_filters:\n          - name: envoy.filters.http.header_mutation\n            typed_config: {}\n");
        for (name, _) in SECTIONS {
            text.push_str(&filter(name, &format!("{{\"of\": \"{name}\"}}")));
        }
        text.push_str(
            "          - name: envoy.filters.http.router\n            typed_config: {}\n",
        );
        text.push_str("clusters:\n  upstream:\n    vm_id: model-router\n    code: { local: { filename: \"${WASM_DIR}/model-router.wasm\" } }\n");
        text
    }

    #[test]
    fn the_five_filters_become_one_with_their_configurations_as_sections() {
        let fused = config_from_gateway(&gateway()).unwrap();
        assert!(fused.starts_with(HEADER));
        assert_eq!(fused.matches("          - name: ").count(), 3, "{fused}");
        let config = fused_configuration(&fused).unwrap();
        for (filter, section) in SECTIONS {
            assert_eq!(config[section]["of"], filter, "{config}");
            assert!(!fused.contains(&format!("# {filter}'s comment")), "{fused}");
        }
        assert!(fused.contains("vm_id: llm-gateway\n    code: { local: { filename: \"${WASM_DIR}/llm-gateway.wasm\" } }"), "{fused}");
        assert!(!fused.contains("model-router.wasm"), "{fused}");
        // the filters around the five stay where they were
        let mutation = fused.find("header_mutation").unwrap();
        let one = fused.find("- name: llm-gateway").unwrap();
        let router = fused.find("envoy.filters.http.router").unwrap();
        assert!(mutation < one && one < router);
    }

    #[test]
    fn a_chain_it_does_not_know_is_an_error() {
        let without = gateway().replace("- name: pii-redaction", "- name: pii");
        let err = config_from_gateway(&without).unwrap_err();
        assert!(err.contains("pii-redaction"), "{err}");
        let broken = gateway().replace("{\"of\": \"usage-accounting\"}", "{nope");
        let err = config_from_gateway(&broken).unwrap_err();
        assert!(err.contains("usage-accounting"), "{err}");
        let twice = format!("{}  other:\n    vm_id: model-router\n", gateway());
        let err = config_from_gateway(&twice).unwrap_err();
        assert!(err.contains("vm_id: model-router"), "{err}");
    }
}
