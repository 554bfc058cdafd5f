//! Reading `higress/*.yaml` for the packaging suites: YAML (multi-document) to JSON values,
//! the WasmPlugin → plugin-config conversion Higress does, and each plugin's own parser.

use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use yaml_rust2::{Yaml, YamlLoader};

/// The chain order of docs/architecture.md, by module.
pub const CHAIN: [&str; 5] = [
    "key-auth",
    "model-router",
    "pii-redaction",
    "usage-accounting",
    "token-ratelimit",
];

/// The phases of a WasmPlugin, in the order Higress (Istio) places them in the filter chain.
pub const PHASES: [&str; 4] = ["AUTHN", "AUTHZ", "STATS", "UNSPECIFIED_PHASE"];

/// One YAML document of a file.
#[derive(Debug, Clone)]
pub struct Doc {
    pub file: PathBuf,
    pub index: usize,
    pub value: Value,
}

impl Doc {
    pub fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or("")
    }

    pub fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or("")
    }

    /// `file#index` for messages.
    pub fn at(&self) -> String {
        format!("{}#{}", self.file.display(), self.index)
    }
}

/// The `higress/*.yaml` files, sorted.
pub fn higress_files() -> Vec<PathBuf> {
    let dir = llm_gateway_tests::workspace::root().join("higress");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no YAML in {}", dir.display());
    files
}

/// Every document of every `higress/*.yaml` file.
pub fn higress_docs() -> Vec<Doc> {
    higress_files()
        .iter()
        .flat_map(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            let values =
                yaml_documents(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            values.into_iter().enumerate().map(|(index, value)| Doc {
                file: file.clone(),
                index,
                value,
            })
        })
        .collect()
}

/// The documents of a YAML stream as JSON values (empty documents skipped).
pub fn yaml_documents(text: &str) -> Result<Vec<Value>, String> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| e.to_string())?;
    docs.iter()
        .filter(|d| !matches!(d, Yaml::Null))
        .map(|d| to_json(d, "$"))
        .collect()
}

/// Converts a YAML node the way Kubernetes would store it as JSON: string keys only, no
/// aliases. Integers stay integers; Higress carries config numbers as protobuf doubles, so an
/// integer beyond 2^53 would not survive: refused here.
fn to_json(node: &Yaml, path: &str) -> Result<Value, String> {
    Ok(match node {
        Yaml::Null => Value::Null,
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Integer(i) => {
            if i.unsigned_abs() > 1 << 53 {
                return Err(format!("{path}: {i} does not survive a protobuf double"));
            }
            Value::from(*i)
        }
        Yaml::Real(r) => {
            let f: f64 = r.parse().map_err(|_| format!("{path}: bad number {r}"))?;
            serde_json::Number::from_f64(f)
                .map(Value::Number)
                .ok_or_else(|| format!("{path}: {r} is not a JSON number"))?
        }
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| to_json(item, &format!("{path}[{i}]")))
                .collect::<Result<_, _>>()?,
        ),
        Yaml::Hash(map) => {
            let mut out = Map::new();
            for (k, v) in map {
                let Yaml::String(key) = k else {
                    return Err(format!("{path}: non-string key {k:?}"));
                };
                out.insert(key.clone(), to_json(v, &format!("{path}.{key}"))?);
            }
            Value::Object(out)
        }
        Yaml::Alias(_) | Yaml::BadValue => return Err(format!("{path}: alias or bad value")),
    })
}

/// The WasmPlugins of `higress/`.
pub fn wasm_plugins() -> Vec<Doc> {
    let plugins: Vec<Doc> = higress_docs()
        .into_iter()
        .filter(|d| d.kind() == "WasmPlugin")
        .collect();
    assert!(!plugins.is_empty(), "no WasmPlugin in higress/");
    plugins
}

/// `oci://host/path/<name>:<tag>` → (`name`, `tag`).
pub fn image_of(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("oci://")?;
    let (path, tag) = rest.rsplit_once(':')?;
    let name = path.rsplit_once('/')?.1;
    (!name.is_empty() && !tag.is_empty() && !tag.contains('/')).then_some((name, tag))
}

/// The image a WasmPlugin pulls, (`name`, `tag`); panics with the document's place if its
/// `spec.url` is not an `oci://` reference with a tag.
pub fn plugin_image(doc: &Doc) -> (String, String) {
    let url = doc.value["spec"]["url"].as_str().unwrap_or("");
    let (name, tag) = image_of(url)
        .unwrap_or_else(|| panic!("{}: url {url:?} is not oci://…/name:tag", doc.at()));
    (name.to_string(), tag.to_string())
}

/// The module a WasmPlugin runs: its image name, the plugin whose Higress build
/// (`dist/higress/<name>.wasm`) scripts/package-oci packages under that name.
pub fn plugin_module(doc: &Doc) -> String {
    plugin_image(doc).0
}

/// The JSON document Higress hands the plugin for a WasmPlugin spec: `defaultConfig`'s fields
/// at the top (unless `defaultConfigDisable`) and one `_rules_` entry per `matchRules[]` item
/// (skipped when `configDisable`), its `config` plus `_match_route_` for `ingress`,
/// `_match_service_` for `service` and `_match_domain_` for `domain` — every one the item
/// has; an item with none is refused. As in alibaba/higress
/// pkg/ingress/config/ingress_config.go (`convertIstioWasmPlugin`).
pub fn higress_plugin_config(spec: &Value) -> Result<Value, String> {
    let disabled = |v: &Value| v.as_bool().unwrap_or(false);
    let mut top = match &spec["defaultConfig"] {
        Value::Object(m) if !disabled(&spec["defaultConfigDisable"]) => m.clone(),
        Value::Null | Value::Object(_) => Map::new(),
        other => return Err(format!("defaultConfig must be an object, got {other}")),
    };
    let mut rules = Vec::new();
    for (i, rule) in spec["matchRules"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        if disabled(&rule["configDisable"]) {
            continue;
        }
        let mut entry = match &rule["config"] {
            Value::Object(m) => m.clone(),
            Value::Null => Map::new(),
            other => {
                return Err(format!(
                    "matchRules[{i}].config must be an object, got {other}"
                ))
            }
        };
        let mut matched = false;
        for (field, key) in [
            ("ingress", "_match_route_"),
            ("service", "_match_service_"),
            ("domain", "_match_domain_"),
        ] {
            match &rule[field] {
                Value::Null => {}
                Value::Array(items) if items.is_empty() => {}
                Value::Array(items) => {
                    entry.insert(key.to_string(), Value::Array(items.clone()));
                    matched = true;
                }
                other => {
                    return Err(format!(
                        "matchRules[{i}].{field} must be a list, got {other}"
                    ))
                }
            }
        }
        if !matched {
            return Err(format!(
                "matchRules[{i}]: invalid match rule has no match condition"
            ));
        }
        rules.push(Value::Object(entry));
    }
    if !rules.is_empty() {
        top.insert("_rules_".to_string(), Value::Array(rules));
    }
    Ok(Value::Object(top))
}

/// Parses `document` with `module`'s own config parser; on success the number of configs it
/// built (the global one, if any, plus one per rule); on refusal the parser's error.
pub fn parse_with_plugin(module: &str, document: &Value) -> Result<usize, String> {
    let bytes = document.to_string();
    let bytes = bytes.as_bytes();
    let count = match module {
        "key-auth" => key_auth::config::parse_document(bytes).map(|s| s.configs().count()),
        "model-router" => model_router::config::parse_document(bytes).map(|s| s.configs().count()),
        "pii-redaction" => {
            pii_redaction::config::parse_document(bytes).map(|s| s.configs().count())
        }
        "usage-accounting" => {
            usage_accounting::config::parse_document(bytes).map(|s| s.configs().count())
        }
        "token-ratelimit" => {
            token_ratelimit::config::parse_document(bytes).map(|s| s.configs().count())
        }
        other => return Err(format!("no parser for module {other:?}")),
    };
    count.map_err(|e| format!("field `{}`: {}", e.field(), e.reason()))
}

/// Where `scripts/package-oci` lives.
pub fn package_oci_script() -> PathBuf {
    llm_gateway_tests::workspace::root().join("scripts/package-oci")
}

/// Runs `scripts/package-oci --dist <dist> --out <out>`; its stdout.
pub fn run_package_oci(dist: &Path, out: &Path) -> String {
    let output = std::process::Command::new(package_oci_script())
        .arg("--dist")
        .arg(dist)
        .arg("--out")
        .arg(out)
        .env_remove("SOURCE_DATE_EPOCH")
        .output()
        .expect("run scripts/package-oci");
    assert!(
        output.status.success(),
        "scripts/package-oci failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}
