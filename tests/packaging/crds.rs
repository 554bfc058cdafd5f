//! `higress/*.yaml`: every file parses; each WasmPlugin has what Higress needs; the phases and
//! priorities give the chain order; each plugin's own parser accepts its `defaultConfig` and
//! every `matchRules[].config` in the form Higress delivers them (and refuses a broken field);
//! the McpBridge declares every cluster the plugins name.

use crate::common::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;

#[test]
fn every_higress_file_parses_as_yaml() {
    for file in higress_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let docs = yaml_documents(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(!docs.is_empty(), "{}: no document", file.display());
        for (i, doc) in docs.iter().enumerate() {
            for field in ["apiVersion", "kind"] {
                assert!(
                    doc[field].as_str().is_some_and(|s| !s.is_empty()),
                    "{}#{i}: no {field}",
                    file.display()
                );
            }
            assert!(
                doc["metadata"]["name"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
                "{}#{i}: no metadata.name",
                file.display()
            );
        }
    }
    // multi-document streams count every document, and broken YAML is an error
    assert_eq!(yaml_documents("a: 1\n---\nb: 2\n").unwrap().len(), 2);
    assert!(yaml_documents("a: [1, 2\n").is_err());
    assert!(yaml_documents("a: 1\na: 2\n").is_err(), "duplicate keys");
}

#[test]
fn every_wasm_plugin_has_the_fields_higress_needs() {
    let mut modules = Vec::new();
    for doc in wasm_plugins() {
        let at = doc.at();
        let v = &doc.value;
        assert_eq!(v["apiVersion"], "extensions.higress.io/v1alpha1", "{at}");
        assert!(
            doc.name().starts_with("llm-"),
            "{at}: name {:?}",
            doc.name()
        );
        // Higress converts only the WasmPlugins of its own namespace
        assert_eq!(v["metadata"]["namespace"], "higress-system", "{at}");
        let spec = &v["spec"];
        plugin_image(&doc);
        let phase = spec["phase"].as_str().unwrap_or("");
        assert!(PHASES.contains(&phase), "{at}: phase {phase:?}");
        assert!(
            spec["priority"].is_i64(),
            "{at}: priority {}",
            spec["priority"]
        );
        let fail = spec["failStrategy"].as_str().unwrap_or("");
        assert!(
            ["FAIL_CLOSE", "FAIL_OPEN"].contains(&fail),
            "{at}: failStrategy {fail:?}"
        );
        assert!(
            spec["defaultConfig"]
                .as_object()
                .is_some_and(|m| !m.is_empty()),
            "{at}: no defaultConfig"
        );
        let rules = spec["matchRules"].as_array();
        assert!(
            rules.is_some_and(|r| !r.is_empty()),
            "{at}: no matchRules example"
        );
        for (i, rule) in rules.unwrap().iter().enumerate() {
            assert!(
                rule["config"].is_object(),
                "{at}: matchRules[{i}] has no config"
            );
        }
        modules.push(plugin_module(&doc));
    }
    modules.sort();
    let mut want: Vec<String> = CHAIN.iter().map(|m| m.to_string()).collect();
    want.sort();
    assert_eq!(modules, want, "one WasmPlugin per plugin");
}

#[test]
fn phases_and_priorities_give_the_chain_order() {
    let mut placed: Vec<(usize, i64, String)> = wasm_plugins()
        .iter()
        .map(|doc| {
            let spec = &doc.value["spec"];
            let phase = spec["phase"].as_str().unwrap_or("");
            let rank = PHASES.iter().position(|p| *p == phase).unwrap();
            (rank, spec["priority"].as_i64().unwrap(), plugin_module(doc))
        })
        .collect();
    // Higress/Istio: phases in order, within a phase the higher priority first
    placed.sort_by_key(|(rank, priority, _)| (*rank, -priority));
    for pair in placed.windows(2) {
        assert!(
            (pair[0].0, pair[0].1) != (pair[1].0, pair[1].1),
            "{} and {} share phase and priority: their order would depend on their names",
            pair[0].2,
            pair[1].2
        );
    }
    let order: Vec<&str> = placed.iter().map(|(_, _, m)| m.as_str()).collect();
    assert_eq!(order, CHAIN);
}

#[test]
fn every_config_is_accepted_by_the_plugins_own_parser() {
    for doc in wasm_plugins() {
        let spec = &doc.value["spec"];
        let document = higress_plugin_config(spec).unwrap_or_else(|e| panic!("{}: {e}", doc.at()));
        let module = plugin_module(&doc);
        let configs = parse_with_plugin(&module, &document)
            .unwrap_or_else(|e| panic!("{}: {module} refuses its config: {e}", doc.at()));
        let rules = spec["matchRules"].as_array().map_or(0, Vec::len);
        assert_eq!(configs, 1 + rules, "{}: global + one per rule", doc.at());
    }
}

/// The config a WasmPlugin's module gets after one change in its spec (a JSON pointer that
/// must exist).
fn refusal(module: &str, pointer: &str, value: Value) -> String {
    let doc = wasm_plugins()
        .into_iter()
        .find(|d| plugin_module(d) == module)
        .unwrap();
    let mut spec = doc.value["spec"].clone();
    *spec
        .pointer_mut(pointer)
        .unwrap_or_else(|| panic!("{module}: no {pointer} in its WasmPlugin")) = value;
    let document = higress_plugin_config(&spec).unwrap();
    match parse_with_plugin(module, &document) {
        Ok(_) => panic!("{module}: {pointer} broken, yet accepted"),
        Err(e) => e,
    }
}

/// One broken field per plugin in `defaultConfig` and in a `matchRules[].config`: the parser
/// refuses it, naming the field (exactly) and why, also for the fields the plugins read
/// through serde's derive (`allow`, `consumer_label`, `limits[].per`).
#[test]
fn a_broken_field_is_refused_with_its_name() {
    let cases = [
        (
            "key-auth",
            "/defaultConfig/keys/0/key_sha256",
            json!("not-a-digest"),
            "keys[0].key_sha256",
            "",
        ),
        (
            "key-auth",
            "/matchRules/0/config/allow",
            json!("demo"),
            "_rules_[0].allow",
            "expected a sequence",
        ),
        (
            "model-router",
            "/defaultConfig/max_attempts",
            json!(0),
            "max_attempts",
            "",
        ),
        (
            "model-router",
            "/matchRules/0/config/groups/0/deployments/0/deployment",
            json!("nowhere"),
            "_rules_[0].groups[0].deployments[0].deployment",
            "names no configured deployment",
        ),
        (
            "pii-redaction",
            "/defaultConfig/oversize",
            json!("sometimes"),
            "oversize",
            "",
        ),
        (
            "pii-redaction",
            "/matchRules/1/config/rules/0/detector",
            json!("horoscope"),
            "_rules_[1].rules[0].detector",
            "",
        ),
        (
            "usage-accounting",
            "/defaultConfig/ledger/max_len",
            json!(0),
            "ledger.max_len",
            "",
        ),
        (
            "usage-accounting",
            "/matchRules/0/config/consumer_label",
            json!("yes"),
            "_rules_[0].consumer_label",
            "expected a boolean",
        ),
        (
            "token-ratelimit",
            "/defaultConfig/redis/service",
            json!(""),
            "redis.service",
            "",
        ),
        (
            "token-ratelimit",
            "/matchRules/0/config/limits/0/per",
            json!("fortnight"),
            "_rules_[0].limits[0].per",
            "unknown variant `fortnight`",
        ),
    ];
    let mut wrong = Vec::new();
    for (module, pointer, value, field, reason) in cases {
        let err = refusal(module, pointer, value);
        if !err.starts_with(&format!("field `{field}`: ")) || !err.contains(reason) {
            wrong.push(format!(
                "{module} {pointer}: want field `{field}` ({reason:?}), got {err}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn match_rules_convert_as_higress_does() {
    let doc = wasm_plugins()
        .into_iter()
        .find(|d| plugin_module(d) == "key-auth")
        .unwrap();
    let spec = doc.value["spec"].clone();
    let with_rules = |rules: Value| {
        let mut s = spec.clone();
        s["matchRules"] = rules;
        s
    };

    // each matcher field becomes its `_match_*_` key
    let converted = higress_plugin_config(&with_rules(json!([
        {"ingress": ["default/a"], "config": {"allow": ["demo"]}},
        {"domain": ["*.example.com"], "config": {"allow": ["demo"]}},
        {"service": ["llm.default.svc.cluster.local:443"], "config": {"allow": ["demo"]}},
        {"ingress": ["default/off"], "configDisable": true, "config": {"allow": ["x"]}}
    ])))
    .unwrap();
    let rules = converted["_rules_"].as_array().unwrap();
    assert_eq!(rules.len(), 3, "the disabled rule is left out");
    assert_eq!(rules[0]["_match_route_"], json!(["default/a"]));
    assert_eq!(rules[1]["_match_domain_"], json!(["*.example.com"]));
    assert_eq!(
        rules[2]["_match_service_"],
        json!(["llm.default.svc.cluster.local:443"])
    );
    assert_eq!(parse_with_plugin("key-auth", &converted), Ok(4));

    // Higress refuses a rule without a matcher ...
    let err = higress_plugin_config(&with_rules(json!([{"config": {"allow": ["demo"]}}])));
    assert!(err.unwrap_err().contains("no match condition"));
    // ... and passes one with two, which the plugins refuse
    let two = higress_plugin_config(&with_rules(json!([
        {"ingress": ["default/a"], "domain": ["a.example.com"], "config": {}}
    ])))
    .unwrap();
    let err = parse_with_plugin("key-auth", &two).unwrap_err();
    assert!(
        err.contains("_rules_[0]") && err.contains("exactly one matcher"),
        "{err}"
    );

    // defaultConfigDisable: only the rules apply
    let mut only_rules = spec.clone();
    only_rules["defaultConfigDisable"] = json!(true);
    let converted = higress_plugin_config(&only_rules).unwrap();
    assert!(converted.get("keys").is_none());
    assert!(converted["_rules_"].is_array());
}

/// Every image is a plugin's Higress build (scripts/package-oci packages only
/// `dist/higress/<plugin>.wasm`, under the plugin's name); those that use Redis are configured
/// with it (their Higress builds are the `higress` feature builds, `packaging abi::`).
#[test]
fn every_plugin_pulls_its_higress_build_and_redis_users_configure_it() {
    let mut redis_users = 0;
    for doc in wasm_plugins() {
        let module = plugin_module(&doc);
        assert!(
            CHAIN.contains(&module.as_str()),
            "{}: image {module} is not one of the plugins {CHAIN:?}",
            doc.at()
        );
        let key = match module.as_str() {
            "token-ratelimit" => "redis",
            "usage-accounting" => "ledger",
            _ => continue,
        };
        let document = higress_plugin_config(&doc.value["spec"]).unwrap();
        assert!(document.get(key).is_some(), "{}: no {key}", doc.at());
        redis_users += 1;
    }
    assert_eq!(redis_users, 2);
}

/// `outbound|<port>||<name>.<type>` → (type, name, port).
fn registry_of(cluster: &str) -> Option<(String, String, u64)> {
    let rest = cluster.strip_prefix("outbound|")?;
    let (port, host) = rest.split_once("||")?;
    let (name, kind) = host.rsplit_once('.')?;
    Some((kind.to_string(), name.to_string(), port.parse().ok()?))
}

fn collect_clusters(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::String(s) if s.starts_with("outbound|") => {
            out.insert(s.clone());
        }
        Value::Array(items) => items.iter().for_each(|v| collect_clusters(v, out)),
        Value::Object(map) => map.values().for_each(|v| collect_clusters(v, out)),
        _ => {}
    }
}

#[test]
fn the_mcpbridge_declares_every_cluster_the_plugins_name() {
    let docs = higress_docs();
    let bridges: Vec<_> = docs.iter().filter(|d| d.kind() == "McpBridge").collect();
    assert_eq!(bridges.len(), 1, "one McpBridge");
    let bridge = &bridges[0].value;
    assert_eq!(bridge["apiVersion"], "networking.higress.io/v1");
    // Higress watches only the McpBridge `default` of its namespace
    assert_eq!(bridge["metadata"]["name"], "default");
    assert_eq!(bridge["metadata"]["namespace"], "higress-system");

    let mut registries = BTreeSet::new();
    for (i, r) in bridge["spec"]["registries"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        let kind = r["type"].as_str().unwrap_or("");
        let name = r["name"].as_str().unwrap_or("");
        let domain = r["domain"].as_str().unwrap_or("");
        let port = r["port"].as_u64().unwrap_or(0);
        assert!(
            !name.is_empty() && port > 0 && port < 65536,
            "registries[{i}]: {r}"
        );
        match kind {
            // static: ip:port, comma-separated
            "static" => {
                for ep in domain.split(',') {
                    let addr: Result<std::net::SocketAddr, _> = ep.parse();
                    assert!(addr.is_ok(), "registries[{i}]: {ep:?} is not ip:port");
                }
            }
            "dns" => assert!(
                domain.contains('.') && !domain.contains(':'),
                "registries[{i}]: {domain:?} is not a domain name"
            ),
            other => panic!("registries[{i}]: type {other:?} (static or dns here)"),
        }
        assert!(
            registries.insert((kind.to_string(), name.to_string(), port)),
            "registries[{i}] declared twice"
        );
    }
    // Redis both ways, as higress/README.md describes
    for kind in ["static", "dns"] {
        assert!(registries.contains(&(kind.to_string(), "redis".to_string(), 6379)));
    }

    let mut clusters = BTreeSet::new();
    for doc in wasm_plugins() {
        collect_clusters(&doc.value["spec"], &mut clusters);
    }
    // not vacuous: Redis of both Redis plugins and the router's providers are among them
    let plugins_redis = |module: &str, pointer: &str| {
        let doc = wasm_plugins()
            .into_iter()
            .find(|d| plugin_module(d) == module)
            .unwrap();
        doc.value["spec"]
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap()
            .to_string()
    };
    let ratelimit = plugins_redis("token-ratelimit", "/defaultConfig/redis/service");
    let ledger = plugins_redis("usage-accounting", "/defaultConfig/ledger/service");
    assert_eq!(ratelimit, ledger, "both Redis plugins use one Redis");
    assert!(clusters.contains(&ratelimit));
    assert!(clusters.len() >= 3, "{clusters:?}");
    for cluster in &clusters {
        let registry = registry_of(cluster)
            .unwrap_or_else(|| panic!("{cluster}: not outbound|port||name.type"));
        assert!(
            registries.contains(&registry),
            "{cluster}: no McpBridge registry {registry:?} (declared: {registries:?})"
        );
    }

    // the Ingress that makes Higress push the Redis clusters names declared registries
    let anchors: Vec<_> = docs
        .iter()
        .filter(|d| d.kind() == "Ingress")
        .filter_map(|d| d.value["metadata"]["annotations"]["higress.io/destination"].as_str())
        .collect();
    assert!(
        !anchors.is_empty(),
        "no Ingress with higress.io/destination"
    );
    let mut routed = BTreeSet::new();
    for line in anchors
        .iter()
        .flat_map(|a| a.lines())
        .filter(|l| !l.trim().is_empty())
    {
        // [weight%] host[:port] [subset]
        let addr = line
            .split_whitespace()
            .find(|w| !w.ends_with('%'))
            .unwrap_or_else(|| panic!("{line:?}: no address"));
        let (host, port) = addr.rsplit_once(':').unwrap();
        let (name, kind) = host.rsplit_once('.').unwrap();
        let registry = (kind.to_string(), name.to_string(), port.parse().unwrap());
        assert!(registries.contains(&registry), "{line:?}: no such registry");
        routed.insert(format!("outbound|{port}||{host}"));
    }
    assert!(
        routed.contains(&ratelimit),
        "the plugins' Redis cluster is not routed: {routed:?}"
    );
}

/// Every shipped route that strips the identity headers (envoy-config/*.yaml, higress/*.yaml)
/// strips all of them: a header key-auth sets (shared::headers::IDENTITY, e.g. the newer
/// `x-llm-tier`) must never reach a provider, and this list is kept by hand in each file.
#[test]
fn every_shipped_route_removes_every_identity_header() {
    fn lists<'a>(value: &'a Value, out: &mut Vec<&'a Vec<Value>>) {
        match value {
            Value::Object(map) => {
                for (key, inner) in map {
                    match inner {
                        Value::Array(items) if key == "request_headers_to_remove" => {
                            out.push(items)
                        }
                        _ => lists(inner, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| lists(v, out)),
            _ => {}
        }
    }
    let dir = llm_gateway_tests::workspace::root().join("envoy-config");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.extend(higress_files());
    let mut checked = 0;
    for file in files {
        let mut text = std::fs::read_to_string(&file).unwrap();
        // the Envoy templates' `${PORT}`-style placeholders, as the test suites fill them
        while let Some(start) = text.find("${") {
            let end = text[start..]
                .find('}')
                .map_or(text.len(), |e| start + e + 1);
            text.replace_range(start..end, "1");
        }
        let docs = yaml_documents(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let mut found = Vec::new();
        docs.iter().for_each(|doc| lists(doc, &mut found));
        for list in found {
            let names: BTreeSet<&str> = list.iter().filter_map(Value::as_str).collect();
            if !names.contains(llm_gateway_shared::headers::CONSUMER) {
                continue; // not a gateway route
            }
            for header in llm_gateway_shared::headers::IDENTITY {
                assert!(
                    names.contains(header),
                    "{}: {header} is not removed",
                    file.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} gateway routes found");
}

/// key-auth's CRD carries its Redis-held keys form commented out (config keys stay the
/// default); uncommented, that form is what the plugin's Higress build accepts.
#[test]
fn the_commented_redis_keys_form_of_key_auth_is_accepted() {
    let text =
        std::fs::read_to_string(llm_gateway_tests::workspace::root().join("higress/key-auth.yaml"))
            .unwrap();
    let uncommented: String = text
        .lines()
        .map(|line| match line.strip_prefix("    # ") {
            Some(rest) if rest.starts_with("redis:") || rest.starts_with("  ") => {
                format!("    {rest}\n")
            }
            _ => format!("{line}\n"),
        })
        .collect();
    assert_ne!(uncommented, format!("{text}\n"), "no commented redis form");
    let docs = crate::common::yaml_documents(&uncommented).unwrap();
    let spec = docs
        .iter()
        .find(|d| d["kind"] == "WasmPlugin")
        .map(|d| d["spec"].clone())
        .unwrap();
    let document = higress_plugin_config(&spec).unwrap();
    assert_eq!(
        document["redis"]["service"], "outbound|6379||redis.static",
        "{document}"
    );
    parse_with_plugin("key-auth", &document).unwrap();
}
