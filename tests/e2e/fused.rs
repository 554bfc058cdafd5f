//! The fused build in a real Envoy 1.40: `envoy-config/gateway-fused.yaml` is `gateway.yaml`
//! with its five listener filters fused into one (`dist/llm-gateway.wasm`, root id
//! `llm-gateway`) and the router's upstream filter in the same module and `vm_id`.
//!
//! - the committed file is exactly what `tests/src/fused.rs` derives from `gateway.yaml`, and
//!   each section of the fused filter's configuration is its filter's configuration there;
//! - Envoy validates it and runs one wasm VM per worker;
//! - the user's whole journey of `e2e chain::` runs against it in CI
//!   (`LLM_GATEWAY_FORM=fused cargo test --test e2e -- chain::`, scripts/test).

use llm_gateway_tests::fused::{config_from_gateway, fused_configuration, CONFIG, SECTIONS};
use llm_gateway_tests::workspace;

fn read(name: &str) -> String {
    let path = workspace::envoy_config(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn gateway_fused_yaml_is_gateway_yaml_fused() {
    let gateway = read(llm_gateway_tests::demo::CONFIG);
    let derived = config_from_gateway(&gateway).unwrap();
    if std::env::var_os("LLM_GATEWAY_BLESS").is_some() {
        std::fs::write(workspace::envoy_config(CONFIG), &derived).unwrap();
    }
    let committed = read(CONFIG);
    if committed != derived {
        let line = committed
            .lines()
            .zip(derived.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(derived.lines().count()));
        panic!(
            "envoy-config/{CONFIG} is not gateway.yaml fused (first difference at line {}); \
             rewrite it with LLM_GATEWAY_BLESS=1 cargo test -p llm-gateway-tests --test e2e -- fused::",
            line + 1
        );
    }
    // every section is its filter's document in gateway.yaml, value for value
    let sections = fused_configuration(&committed).unwrap();
    let bundle = read(llm_gateway_tests::bundle::CONFIG);
    for (filter, section) in SECTIONS {
        let marker = format!("          - name: {filter}\n");
        let at = bundle.find(&marker).unwrap();
        let value_at = at + bundle[at..].find("value: |\n").unwrap() + "value: |\n".len();
        let text: String = bundle[value_at..]
            .lines()
            .take_while(|l| l.starts_with("                    "))
            .collect::<Vec<_>>()
            .join("\n");
        let own: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(sections[section], own, "{section}");
    }
}
