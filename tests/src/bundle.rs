//! The bundle build (`plugins/bundle`, `dist/llm-gateway.wasm`): the five filters in one module,
//! each selected by its `root_id`, all in one `vm_id`. [`config_from_gateway`] derives
//! `envoy-config/gateway-bundle.yaml` from `envoy-config/gateway.yaml`, so the two never drift
//! apart (`e2e bundle::` checks the committed file against it).

/// The bundle's module in `dist/` (without `.wasm`).
pub const MODULE: &str = "llm-gateway";
/// The one `vm_id` every filter of the bundle config shares.
pub const VM_ID: &str = "llm-gateway";
/// The bundle's Envoy bootstrap (in `envoy-config/`).
pub const CONFIG: &str = "gateway-bundle.yaml";
/// The standalone modules the bundle replaces, with how many filters of `gateway.yaml` load
/// each (the model router twice: the listener's filter and the clusters' upstream filter,
/// written once under a YAML anchor).
pub const MODULES: [(&str, usize); 5] = [
    ("key-auth", 1),
    ("model-router", 2),
    ("pii-redaction", 1),
    ("usage-accounting", 1),
    ("token-ratelimit", 1),
];

const HEADER: &str = "\
# GENERATED from gateway.yaml by tests/src/bundle.rs (config_from_gateway); do not edit here.
# e2e bundle:: fails when the two disagree; to rewrite this file after changing gateway.yaml:
#   LLM_GATEWAY_BLESS=1 cargo test -p llm-gateway-tests --test e2e -- bundle::
#
# The same gateway with every filter in one module, dist/llm-gateway.wasm (plugins/bundle), and
# one vm_id, llm-gateway: Envoy runs one wasm VM per worker thread instead of five, with one copy
# of the code and of the tokenizer. Each filter's root_id picks its plugin (key-auth,
# model-router, model-router-upstream, pii-redaction, usage-accounting, token-ratelimit);
# an unknown root_id fails the filter's configuration. Plain Envoy only: the Higress builds
# (Redis) are not bundled.
#
";

/// `gateway.yaml` with every filter in the bundle: each standalone module's `vm_id` and
/// `filename` replaced by the bundle's, under a header that says so. Errs when `gateway.yaml`
/// does not load each module exactly as [`MODULES`] says (the transformation would be wrong).
pub fn config_from_gateway(gateway: &str) -> crate::Result<String> {
    let mut text = gateway.to_string();
    for (module, filters) in MODULES {
        for (from, to) in [
            (format!("vm_id: {module}\n"), format!("vm_id: {VM_ID}\n")),
            (
                format!("filename: \"${{WASM_DIR}}/{module}.wasm\""),
                format!("filename: \"${{WASM_DIR}}/{MODULE}.wasm\""),
            ),
        ] {
            let found = text.matches(&from).count();
            if found != filters {
                return Err(format!(
                    "gateway.yaml has {found} times `{}`, expected {filters}",
                    from.trim_end()
                ));
            }
            text = text.replace(&from, &to);
        }
    }
    // a module the bundle does not hold would keep its own VM: not this config's promise
    let vm_ids = text.matches("vm_id: ").count();
    if vm_ids != text.matches(&format!("vm_id: {VM_ID}\n")).count() {
        return Err("gateway.yaml has a vm_id the bundle does not replace".into());
    }
    Ok(format!("{HEADER}{text}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_and_vm_id_becomes_the_bundle() {
        let gateway = "\
a:\n  vm_id: key-auth\n  code: { local: { filename: \"${WASM_DIR}/key-auth.wasm\" } }\n\
b:\n  vm_id: model-router\n  code: { local: { filename: \"${WASM_DIR}/model-router.wasm\" } }\n\
c:\n  vm_id: pii-redaction\n  code: { local: { filename: \"${WASM_DIR}/pii-redaction.wasm\" } }\n\
d:\n  vm_id: usage-accounting\n  code: { local: { filename: \"${WASM_DIR}/usage-accounting.wasm\" } }\n\
e:\n  vm_id: token-ratelimit\n  code: { local: { filename: \"${WASM_DIR}/token-ratelimit.wasm\" } }\n\
f:\n  vm_id: model-router\n  code: { local: { filename: \"${WASM_DIR}/model-router.wasm\" } }\n";
        let bundle = config_from_gateway(gateway).unwrap();
        assert!(bundle.starts_with(HEADER));
        assert_eq!(bundle.matches("vm_id: llm-gateway\n").count(), 6);
        assert_eq!(
            bundle
                .matches("filename: \"${WASM_DIR}/llm-gateway.wasm\"")
                .count(),
            6
        );
        for (module, _) in MODULES {
            assert!(!bundle.contains(&format!("/{module}.wasm")), "{module}");
        }
    }

    #[test]
    fn a_chain_it_does_not_know_is_an_error() {
        let err = config_from_gateway("vm_id: key-auth\n").unwrap_err();
        assert!(err.contains("filename"), "{err}");
        let err = config_from_gateway("").unwrap_err();
        assert!(err.contains("vm_id: key-auth"), "{err}");
    }
}
