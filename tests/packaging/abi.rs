//! The two ABI builds of every plugin (`scripts/build`, `tools/wasm-abi`), read from the
//! compiled modules: the plain `dist/<plugin>.wasm` (and the bundle) declare only
//! `proxy_abi_version_0_2_1` (upstream Envoy), the Higress `dist/higress/<plugin>.wasm` only
//! `proxy_abi_version_0_2_100` (Higress passes a headers `Pause` through as `StopIteration`
//! for it alone); a renamed module is valid and differs from its plain build in that export
//! only; the Redis imports are in the three `higress`-feature builds and in no plain one. And
//! the harness's two hosts hold modules and filters to the same rules as the real ones.

use crate::common::CHAIN;
use llm_gateway_tests::harness::{Abi, FilterSpec, Fleet, Host};
use llm_gateway_tests::workspace;
use serde_json::json;
use std::path::Path;
use wasmparser::{Parser, Payload};

/// What a module declares: its exports (name, kind) and imports (module.name), in order,
/// and its sections other than the export section as (id, bytes).
struct Module {
    exports: Vec<(String, wasmparser::ExternalKind)>,
    imports: Vec<String>,
    other_sections: Vec<(u8, Vec<u8>)>,
}

impl Module {
    fn abi_exports(&self) -> Vec<&str> {
        self.exports
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| n.starts_with("proxy_abi_version_"))
            .collect()
    }
}

fn read(path: &Path) -> Module {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    wasmparser::Validator::new()
        .validate_all(&bytes)
        .unwrap_or_else(|e| panic!("{}: not a valid module: {e}", path.display()));
    let mut module = Module {
        exports: Vec::new(),
        imports: Vec::new(),
        other_sections: Vec::new(),
    };
    for payload in Parser::new(0).parse_all(&bytes) {
        let payload = payload.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        match &payload {
            Payload::ExportSection(reader) => {
                for export in reader.clone() {
                    let export = export.unwrap();
                    module.exports.push((export.name.to_string(), export.kind));
                }
                continue;
            }
            Payload::ImportSection(reader) => {
                for import in reader.clone().into_imports() {
                    let import = import.unwrap();
                    module
                        .imports
                        .push(format!("{}.{}", import.module, import.name));
                }
            }
            _ => {}
        }
        if let Some((id, range)) = payload.as_section() {
            module.other_sections.push((id, bytes[range].to_vec()));
        }
    }
    module
}

fn key_auth_config() -> serde_json::Value {
    json!({"keys": [{"key_sha256": workspace::sha256_hex(b"sk-test"), "consumer": "team-a",
               "groups": ["fast"]}]})
}

fn plain(plugin: &str) -> Module {
    read(&workspace::plugin_wasm(plugin).unwrap_or_else(|e| panic!("{e}")))
}

fn higress(plugin: &str) -> Module {
    read(&workspace::higress_wasm(plugin).unwrap_or_else(|e| panic!("{e}")))
}

#[test]
fn plain_builds_declare_only_0_2_1_and_higress_builds_only_0_2_100() {
    for plugin in CHAIN {
        assert_eq!(
            plain(plugin).abi_exports(),
            ["proxy_abi_version_0_2_1"],
            "dist/{plugin}.wasm"
        );
        let module = higress(plugin);
        assert_eq!(
            module.abi_exports(),
            ["proxy_abi_version_0_2_100"],
            "dist/higress/{plugin}.wasm"
        );
        // a function export, as the host looks for (cpp-host getAbiVersion)
        assert!(
            module
                .exports
                .iter()
                .any(|(n, k)| n == "proxy_abi_version_0_2_100"
                    && *k == wasmparser::ExternalKind::Func)
        );
    }
    // the bundle is for plain Envoy only
    assert_eq!(
        plain("llm-gateway").abi_exports(),
        ["proxy_abi_version_0_2_1"]
    );
    assert!(workspace::higress_wasm("llm-gateway").is_err());
    assert!(workspace::higress_wasm("bundle").is_err());
}

#[test]
fn the_higress_build_of_a_plugin_without_redis_differs_only_in_the_abi_export() {
    for plugin in ["model-router", "pii-redaction"] {
        let (plain, higress) = (plain(plugin), higress(plugin));
        let renamed: Vec<_> = plain
            .exports
            .iter()
            .map(|(n, k)| match n.as_str() {
                "proxy_abi_version_0_2_1" => ("proxy_abi_version_0_2_100".to_string(), *k),
                _ => (n.clone(), *k),
            })
            .collect();
        assert_eq!(higress.exports, renamed, "{plugin}: exports");
        assert!(
            higress.other_sections == plain.other_sections,
            "{plugin}: a section other than the exports differs"
        );
    }
}

#[test]
fn redis_imports_are_in_the_higress_feature_builds_only() {
    let redis = |m: &Module| m.imports.iter().any(|i| i == "env.proxy_redis_call");
    for plugin in CHAIN {
        assert!(!redis(&plain(plugin)), "dist/{plugin}.wasm imports Redis");
    }
    assert!(!redis(&plain("llm-gateway")));
    for plugin in ["key-auth", "token-ratelimit", "usage-accounting"] {
        assert!(
            redis(&higress(plugin)),
            "dist/higress/{plugin}.wasm is not the `higress` feature build"
        );
    }
    for plugin in ["model-router", "pii-redaction"] {
        assert!(!redis(&higress(plugin)), "{plugin}");
    }
}

#[test]
fn the_harness_hosts_accept_the_abi_their_real_counterparts_accept() {
    let config = key_auth_config();
    let envoy_refusal = Fleet::single(FilterSpec::higress("key-auth", &config).unwrap())
        .err()
        .expect("Envoy mode loaded a module exporting only proxy_abi_version_0_2_100");
    assert!(
        envoy_refusal.contains("Missing or unknown Proxy-Wasm ABI version"),
        "{envoy_refusal}"
    );
    for (spec, abi) in [
        (
            FilterSpec::plugin("key-auth", &config).unwrap(),
            Abi::V0_2_1,
        ),
        (
            FilterSpec::higress("key-auth", &config).unwrap(),
            Abi::V0_2_100,
        ),
    ] {
        let fleet = Fleet::builder()
            .host(Host::Higress)
            .filter(spec)
            .build()
            .unwrap();
        assert_eq!(fleet.abi(0), Some(abi));
    }
    let plain = Fleet::single(FilterSpec::plugin("key-auth", &config).unwrap()).unwrap();
    assert_eq!(plain.abi(0), Some(Abi::V0_2_1));
}

#[test]
fn higress_mode_refuses_what_a_wasm_plugin_cannot_configure() {
    let config = key_auth_config();
    let higress = |spec: FilterSpec| Fleet::builder().host(Host::Higress).filter(spec).build();
    let spec = || FilterSpec::higress("key-auth", &config).unwrap();
    let err = higress(spec().allow_on_headers_stop_iteration(true))
        .err()
        .unwrap();
    assert!(err.contains("allow_on_headers_stop_iteration"), "{err}");
    let err = higress(spec().upstream_filter(true)).err().unwrap();
    assert!(err.contains("upstream (cluster) filter"), "{err}");
    // the same filters in Envoy mode
    let envoy = |spec: FilterSpec| Fleet::builder().filter(spec).build();
    let plain = || FilterSpec::plugin("key-auth", &config).unwrap();
    envoy(plain().allow_on_headers_stop_iteration(true)).unwrap();
    envoy(plain().upstream_filter(true)).unwrap();
    higress(spec()).unwrap();
}

/// The stream callbacks a module may leave out (`tools/wasm-abi` `DROPPABLE`), each with the
/// SDK trait method a plugin implements to handle it.
const STREAM_CALLBACKS: [(&str, &str); 8] = [
    ("proxy_on_request_headers", "on_http_request_headers"),
    ("proxy_on_request_body", "on_http_request_body"),
    ("proxy_on_request_trailers", "on_http_request_trailers"),
    ("proxy_on_response_headers", "on_http_response_headers"),
    ("proxy_on_response_body", "on_http_response_body"),
    ("proxy_on_response_trailers", "on_http_response_trailers"),
    ("proxy_on_log", "on_log"),
    ("proxy_on_done", "on_done"),
];

/// `scripts/unused-callbacks`: plugin → the callbacks dropped from its modules.
fn unused_callbacks() -> Vec<(String, Vec<String>)> {
    let path = workspace::root().join("scripts/unused-callbacks");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut words = l.split_whitespace().map(str::to_string);
            let plugin = words.next().unwrap();
            (plugin, words.collect())
        })
        .collect()
}

/// Every `.rs` file under `dir`, concatenated.
fn sources(dir: &Path) -> String {
    let mut out = String::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.push_str(&sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
    out
}

#[test]
fn the_callbacks_a_plugin_leaves_at_the_default_are_dropped_from_both_builds() {
    let listed = unused_callbacks();
    assert_eq!(
        listed.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>(),
        CHAIN,
        "scripts/unused-callbacks names each plugin of the chain once, in chain order"
    );
    for (plugin, listed) in &listed {
        // a dropped callback is one the plugin's code does not handle: the host's answer for a
        // missing export (Continue; true for on_done) is then what the SDK's default returned.
        // One marked `:plain` is handled only in the plugin's Higress feature build.
        let code = sources(&workspace::root().join("plugins").join(plugin).join("src"));
        let manifest = workspace::root()
            .join("plugins")
            .join(plugin)
            .join("Cargo.toml");
        let has_higress_build = std::fs::read_to_string(&manifest)
            .unwrap()
            .lines()
            .any(|l| l.starts_with("higress = "));
        let mut dropped = Vec::new();
        let mut plain_only = Vec::new();
        for entry in listed {
            let (name, only_plain) = match entry.strip_suffix(":plain") {
                Some(name) => (name, true),
                None => (entry.as_str(), false),
            };
            let (_, method) = STREAM_CALLBACKS
                .iter()
                .find(|(n, _)| *n == name)
                .unwrap_or_else(|| panic!("{plugin}: {name} is not a stream callback"));
            let definition = format!("fn {method}(");
            if only_plain {
                assert!(has_higress_build, "{plugin} has no Higress feature build");
                // each definition of the method sits right under the cfg that keeps it out of
                // the plain build
                let guarded = code.match_indices(&definition).all(|(at, _)| {
                    let before = code.get(..at).unwrap_or_default();
                    before
                        .trim_end()
                        .lines()
                        .rev()
                        .take(1)
                        .any(|l| l.trim() == "#[cfg(feature = \"higress\")]")
                });
                assert!(
                    code.contains(&definition) && guarded,
                    "{plugin}: {name}:plain needs {method} under #[cfg(feature = \"higress\")]"
                );
                plain_only.push(name);
            } else {
                assert!(
                    !code.contains(&definition),
                    "{plugin} implements {method}: scripts/unused-callbacks must not drop {name}"
                );
                dropped.push(name);
            }
        }
        for (module, build) in [(plain(plugin), "plain"), (higress(plugin), "higress")] {
            let exported = |name: &str| module.exports.iter().any(|(n, _)| n == name);
            for (name, method) in STREAM_CALLBACKS {
                let implemented = code.contains(&format!("fn {method}("));
                let gone =
                    dropped.contains(&name) || (build == "plain" && plain_only.contains(&name));
                if gone {
                    assert!(!exported(name), "{plugin} ({build}) still exports {name}");
                } else {
                    assert!(exported(name), "{plugin} ({build}) lost {name}");
                }
                // what the plugin implements (in this build) is always there
                assert!(
                    !implemented || gone || exported(name),
                    "{plugin} ({build}): {name}"
                );
            }
            for needed in [
                "proxy_on_context_create",
                "proxy_on_delete",
                "proxy_on_memory_allocate",
            ] {
                assert!(exported(needed), "{plugin} lost {needed}");
            }
        }
    }
    // the bundle serves every plugin: it keeps them all
    let bundle = plain("llm-gateway");
    for (name, _) in STREAM_CALLBACKS {
        assert!(bundle.exports.iter().any(|(n, _)| n == name), "{name}");
    }
}
