//! The Envoy configs `scripts/bench` runs, derived at run time so they cannot drift from what
//! ships:
//!
//! - row C (and E, C'): `envoy-config/gateway.yaml` itself — its listener, route, local
//!   replies, access log, the five filters with their configurations, the three provider
//!   clusters with the model router's upstream filter — with every provider cluster pointed at
//!   the one mock upstream, the listener on a kernel-chosen port, and only token-ratelimit's
//!   limit and budget amounts raised ([`RAISED`]) so that no bench request is refused (they are
//!   still evaluated on every request);
//! - row B: `envoy-config/bench-bare.yaml` (the router only) with gateway.yaml's access log, so
//!   B and C write the same access log line per request.
//!
//! Both come out as JSON (valid YAML) templates that still hold `${WASM_DIR}` and `${LOG_DIR}`,
//! rendered by [`crate::envoy::Envoy`]. The unit tests check that the derived chain differs
//! from gateway.yaml in exactly the named places.

use serde_json::{json, Value};
use yaml_rust2::{Yaml, YamlLoader};

/// What the bench changes in token-ratelimit's configuration: every limit's `requests` and
/// `tokens`, every budget's `tokens` and `money` (only those a limit or budget has).
pub const RAISED: &[&str] = &[
    "limits[].requests",
    "limits[].tokens",
    "budgets[].tokens",
    "budgets[].money",
];
/// The raised request and token amounts (per window / period).
pub const RAISED_AMOUNT: u64 = 1_000_000_000_000;
/// The raised money amount.
pub const RAISED_MONEY: &str = "1000000.00";

/// The `vm_id` and module of the bundle build (row E): one VM per worker for all five filters.
pub const BUNDLE_VM_ID: &str = "llm-gateway";
/// The bundle's file in the wasm folder.
pub const BUNDLE_FILE: &str = "llm-gateway.wasm";

/// How row C's chain loads its plugins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// One module (and VM) per plugin, `${WASM_DIR}/<plugin>.wasm`, as gateway.yaml has it.
    PerPlugin,
    /// Every filter in one VM of the bundle module, each keeping its `root_id`.
    Bundle,
}

/// One wasm filter of a config, as Envoy runs it.
#[derive(Debug, Clone, PartialEq)]
pub struct WasmFilter {
    /// The filter's name.
    pub name: String,
    /// `root_id`.
    pub root_id: String,
    /// `vm_id`.
    pub vm_id: String,
    /// The module's file name (`key-auth.wasm`), without the folder.
    pub file: String,
    /// The plugin configuration (parsed JSON).
    pub config: Value,
    /// `allow_on_headers_stop_iteration`.
    pub allow_on_headers_stop_iteration: bool,
    /// A cluster's upstream filter (the model router's upstream role), not a listener's.
    pub upstream: bool,
}

/// Parses a YAML document (aliases resolved) into JSON.
pub fn yaml_to_json(text: &str) -> crate::Result<Value> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| format!("YAML: {e}"))?;
    let doc = docs.first().ok_or("YAML: no document")?;
    convert(doc)
}

fn convert(yaml: &Yaml) -> crate::Result<Value> {
    Ok(match yaml {
        Yaml::Real(text) => text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number)
            .ok_or(format!("YAML: bad number {text}"))?,
        Yaml::Integer(i) => json!(i),
        Yaml::String(s) => json!(s),
        Yaml::Boolean(b) => json!(b),
        Yaml::Array(items) => Value::Array(items.iter().map(convert).collect::<Result<_, _>>()?),
        Yaml::Hash(map) => {
            let mut out = serde_json::Map::new();
            for (key, value) in map {
                let key = match key {
                    Yaml::String(s) => s.clone(),
                    Yaml::Integer(i) => i.to_string(),
                    Yaml::Boolean(b) => b.to_string(),
                    other => return Err(format!("YAML: unsupported key {other:?}")),
                };
                out.insert(key, convert(value)?);
            }
            Value::Object(out)
        }
        Yaml::Null => Value::Null,
        Yaml::Alias(_) | Yaml::BadValue => return Err("YAML: unresolved alias".into()),
    })
}

/// `envoy-config/gateway.yaml` as JSON (placeholders left in).
pub fn gateway() -> crate::Result<Value> {
    read_yaml("gateway.yaml")
}

/// A config template of `envoy-config/` as JSON (see [`read_yaml`]).
pub fn template(name: &str) -> crate::Result<Value> {
    read_yaml(name)
}

/// Reads a config template: its port placeholders (`${..._PORT}`, not valid YAML in a flow
/// mapping) become 0 before parsing (the bench sets every port itself); `${WASM_DIR}` and
/// `${LOG_DIR}` stay; any other placeholder is an error.
fn read_yaml(name: &str) -> crate::Result<Value> {
    let path = crate::workspace::envoy_config(name);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut vars: Vec<(String, String)> = Vec::new();
    for name in placeholders_in(&text) {
        let value = match name.as_str() {
            "WASM_DIR" | "LOG_DIR" => format!("${{{name}}}"),
            port if port.ends_with("_PORT") => "0".to_string(),
            other => {
                return Err(format!(
                    "{}: unexpected placeholder ${{{other}}}",
                    path.display()
                ))
            }
        };
        vars.push((name, value));
    }
    let vars: Vec<(&str, String)> = vars.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
    let text = crate::workspace::render(&text, &vars)?;
    yaml_to_json(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The listener's HTTP connection manager config.
pub(crate) fn hcm(config: &mut Value) -> crate::Result<&mut Value> {
    config
        .pointer_mut("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config")
        .ok_or_else(|| "no http_connection_manager in the first listener".to_string())
}

/// Row B: `envoy-config/bench-bare.yaml` with gateway.yaml's access log, its cluster on
/// `mock_port`. Placeholders left: `${LOG_DIR}`.
pub fn bare(mock_port: u16) -> crate::Result<Value> {
    let mut gateway = gateway()?;
    let access_log = hcm(&mut gateway)?
        .get("access_log")
        .cloned()
        .ok_or("gateway.yaml has no access_log")?;
    let mut bare = read_yaml("bench-bare.yaml")?;
    hcm(&mut bare)?["access_log"] = access_log;
    point_clusters_at(&mut bare, mock_port)?;
    Ok(bare)
}

/// Row C (or E with [`Build::Bundle`]): gateway.yaml with its providers on `mock_port`, the
/// listener on port 0 and token-ratelimit's amounts raised. Placeholders left: `${WASM_DIR}`,
/// `${LOG_DIR}`.
pub fn chain(mock_port: u16, build: Build) -> crate::Result<Value> {
    chain_from(gateway()?, mock_port, build)
}

/// [`chain`] from a parsed gateway config.
pub fn chain_from(mut config: Value, mock_port: u16, build: Build) -> crate::Result<Value> {
    for listener in array_mut(&mut config, "/static_resources/listeners")? {
        listener["address"]["socket_address"]["port_value"] = json!(0);
    }
    point_clusters_at(&mut config, mock_port)?;
    let mut raised = false;
    for_each_wasm_filter(&mut config, &mut |filter, _upstream| {
        let wasm = &mut filter["typed_config"]["config"];
        if wasm["root_id"] == "token-ratelimit" {
            let mut plugin = plugin_config(wasm)?;
            raise_limits(&mut plugin);
            wasm["configuration"]["value"] = json!(plugin.to_string());
            raised = true;
        }
        if build == Build::Bundle {
            wasm["vm_config"]["vm_id"] = json!(BUNDLE_VM_ID);
            wasm["vm_config"]["code"] =
                json!({"local": {"filename": format!("${{WASM_DIR}}/{BUNDLE_FILE}")}});
        }
        Ok(())
    })?;
    if !raised {
        return Err("gateway.yaml has no token-ratelimit filter".into());
    }
    Ok(config)
}

/// The fused build's config template (issue 19): the lead's one-filter chain. Row F is measured
/// when it exists.
pub const FUSED_TEMPLATE: &str = "gateway-fused.yaml";

/// Row F: `envoy-config/gateway-fused.yaml`, derived as row C is from gateway.yaml (the listener
/// on port 0, every provider cluster on `mock_port`) with every token-ratelimit amount raised
/// wherever it sits in a wasm filter's configuration ([`raise_limits_anywhere`]: the fused
/// filter may hold the plugins' configs in one document). `Ok(None)` when there is no such
/// template; an error when it has no limit or budget to raise (its requests would be refused).
pub fn fused(mock_port: u16) -> crate::Result<Option<Value>> {
    if !crate::workspace::envoy_config(FUSED_TEMPLATE).is_file() {
        return Ok(None);
    }
    fused_from(read_yaml(FUSED_TEMPLATE)?, mock_port).map(Some)
}

/// [`fused`] from a parsed config.
pub fn fused_from(mut config: Value, mock_port: u16) -> crate::Result<Value> {
    for listener in array_mut(&mut config, "/static_resources/listeners")? {
        listener["address"]["socket_address"]["port_value"] = json!(0);
    }
    point_clusters_at(&mut config, mock_port)?;
    let mut raised = 0;
    for_each_wasm_filter(&mut config, &mut |filter, _upstream| {
        let wasm = &mut filter["typed_config"]["config"];
        let Ok(mut plugin) = plugin_config(wasm) else {
            return Ok(()); // no JSON configuration: nothing to raise
        };
        let n = raise_limits_anywhere(&mut plugin);
        if n > 0 {
            wasm["configuration"]["value"] = json!(plugin.to_string());
            raised += n;
        }
        Ok(())
    })?;
    if raised == 0 {
        return Err(format!(
            "{FUSED_TEMPLATE}: no token-ratelimit limits or budgets found to raise"
        ));
    }
    Ok(config)
}

/// [`raise_limits`] on every object of `config` (at any depth) that has `limits` or `budgets`
/// arrays; how many such objects there were.
pub fn raise_limits_anywhere(config: &mut Value) -> usize {
    let mut n = 0;
    if let Some(object) = config.as_object() {
        if ["limits", "budgets"]
            .iter()
            .any(|k| object.get(*k).is_some_and(Value::is_array))
        {
            raise_limits(config);
            n += 1;
        }
    }
    match config {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                if key != "limits" && key != "budgets" {
                    n += raise_limits_anywhere(value);
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                n += raise_limits_anywhere(item);
            }
        }
        _ => {}
    }
    n
}

/// Raises every amount [`RAISED`] names.
pub fn raise_limits(config: &mut Value) {
    for key in ["limits", "budgets"] {
        for item in config[key].as_array_mut().into_iter().flatten() {
            for field in ["requests", "tokens"] {
                if item.get(field).is_some() {
                    item[field] = json!(RAISED_AMOUNT);
                }
            }
            if item.get("money").is_some() {
                item["money"] = json!(RAISED_MONEY);
            }
        }
    }
}

/// Every wasm filter of `config` (listener, then each cluster's upstream filters; a filter
/// repeated on several clusters through a YAML alias is listed once).
pub fn wasm_filters(config: &Value) -> crate::Result<Vec<WasmFilter>> {
    let mut config = config.clone();
    let mut out: Vec<WasmFilter> = Vec::new();
    for_each_wasm_filter(&mut config, &mut |filter, upstream| {
        let wasm = &filter["typed_config"]["config"];
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let file = text(&wasm["vm_config"]["code"]["local"]["filename"]);
        let found = WasmFilter {
            name: text(&filter["name"]),
            root_id: text(&wasm["root_id"]),
            vm_id: text(&wasm["vm_config"]["vm_id"]),
            file: file.rsplit('/').next().unwrap_or_default().to_string(),
            config: plugin_config(wasm)?,
            allow_on_headers_stop_iteration: wasm["allow_on_headers_stop_iteration"]
                .as_bool()
                .unwrap_or(false),
            upstream,
        };
        if !out.contains(&found) {
            out.push(found);
        }
        Ok(())
    })?;
    share_router_document(&mut out);
    Ok(out)
}

/// Envoy runs a filter with the listener router's `vm_id` and module in the listener router's
/// VM, where the model router's upstream role finds the deployments of the listener's
/// document (its own is just `{"role": "upstream"}`). The harness runs each filter in a VM of
/// its own: such an upstream role gets the listener's document with its role instead (in the
/// fused build, the fused filter's `model_router` section).
fn share_router_document(filters: &mut [WasmFilter]) {
    // the router's document: the filter's own, or the fused filter's `model_router` section
    let router_document = |config: &Value| {
        [config, &config["model_router"]]
            .into_iter()
            .find(|doc| doc.get("deployments").is_some())
            .cloned()
    };
    let listener = filters
        .iter()
        .filter(|f| !f.upstream)
        .find_map(|f| Some((f.vm_id.clone(), router_document(&f.config)?)));
    let Some((vm_id, document)) = listener else {
        return;
    };
    for filter in filters.iter_mut() {
        if filter.upstream && filter.vm_id == vm_id && filter.config.get("deployments").is_none() {
            let mut shared = document.clone();
            shared["role"] = filter.config["role"].clone();
            filter.config = shared;
        }
    }
}

/// The plugin configuration of a `envoy.extensions.wasm.v3.PluginConfig` (a JSON string).
pub(crate) fn plugin_config(wasm: &Value) -> crate::Result<Value> {
    let text = wasm["configuration"]["value"]
        .as_str()
        .ok_or_else(|| format!("filter {}: no configuration string", wasm["name"]))?;
    serde_json::from_str(text).map_err(|e| format!("filter {}: configuration: {e}", wasm["name"]))
}

pub(crate) fn array_mut<'a>(
    config: &'a mut Value,
    pointer: &str,
) -> crate::Result<&'a mut Vec<Value>> {
    config
        .pointer_mut(pointer)
        .and_then(Value::as_array_mut)
        .ok_or_else(|| format!("no {pointer}"))
}

/// Calls `f` on every wasm HTTP filter: the listener's, then the clusters' upstream ones
/// (`upstream: true`).
pub(crate) fn for_each_wasm_filter(
    config: &mut Value,
    f: &mut dyn FnMut(&mut Value, bool) -> crate::Result<()>,
) -> crate::Result<()> {
    let is_wasm = |filter: &Value| {
        filter["typed_config"]["@type"]
            .as_str()
            .is_some_and(|t| t.ends_with("filters.http.wasm.v3.Wasm"))
    };
    for filter in array_mut(hcm(config)?, "/http_filters")? {
        if is_wasm(filter) {
            f(filter, false)?;
        }
    }
    for cluster in array_mut(config, "/static_resources/clusters")? {
        let filters = cluster
            .pointer_mut("/typed_extension_protocol_options/envoy.extensions.upstreams.http.v3.HttpProtocolOptions/http_filters")
            .and_then(Value::as_array_mut);
        for filter in filters.into_iter().flatten() {
            if is_wasm(filter) {
                f(filter, true)?;
            }
        }
    }
    Ok(())
}

/// Points every endpoint of every cluster at `127.0.0.1:port`.
pub(crate) fn point_clusters_at(config: &mut Value, port: u16) -> crate::Result<()> {
    for cluster in array_mut(config, "/static_resources/clusters")? {
        for locality in cluster["load_assignment"]["endpoints"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            for endpoint in locality["lb_endpoints"]
                .as_array_mut()
                .into_iter()
                .flatten()
            {
                endpoint["endpoint"]["address"]["socket_address"] =
                    json!({"address": "127.0.0.1", "port_value": port});
            }
        }
    }
    Ok(())
}

/// Every `${NAME}` placeholder left in a config.
pub fn placeholders(config: &Value) -> Vec<String> {
    placeholders_in(&config.to_string())
}

fn placeholders_in(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else { break };
        let name = after[..end].to_string();
        if !out.contains(&name) {
            out.push(name);
        }
        rest = &after[end + 1..];
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOCK: u16 = 45678;

    /// Removes what [`RAISED`] names from a token-ratelimit config.
    fn without_raised(mut config: Value) -> Value {
        for key in ["limits", "budgets"] {
            for item in config[key].as_array_mut().into_iter().flatten() {
                if let Some(item) = item.as_object_mut() {
                    for field in ["requests", "tokens", "money"] {
                        item.remove(field);
                    }
                }
            }
        }
        config
    }

    #[test]
    fn the_chain_is_gateway_yaml_with_only_the_named_amounts_raised() {
        let gateway = gateway().unwrap();
        let chain = chain(MOCK, Build::PerPlugin).unwrap();
        let shipped = wasm_filters(&gateway).unwrap();
        let benched = wasm_filters(&chain).unwrap();
        let roots: Vec<&str> = benched.iter().map(|f| f.root_id.as_str()).collect();
        assert_eq!(
            roots,
            [
                "key-auth",
                "model-router",
                "pii-redaction",
                "usage-accounting",
                "token-ratelimit",
                "model-router-upstream"
            ]
        );
        assert_eq!(shipped.len(), benched.len());
        for (s, b) in shipped.iter().zip(&benched) {
            if s.root_id == "token-ratelimit" {
                assert_ne!(s.config, b.config, "the limits were raised");
                assert_eq!(
                    without_raised(s.config.clone()),
                    without_raised(b.config.clone())
                );
                for key in ["limits", "budgets"] {
                    let items = b.config[key].as_array().unwrap();
                    assert!(!items.is_empty(), "{key}");
                    for item in items {
                        for field in ["requests", "tokens"] {
                            if let Some(v) = item.get(field) {
                                assert_eq!(v, &json!(RAISED_AMOUNT));
                            }
                        }
                        if let Some(v) = item.get("money") {
                            assert_eq!(v, RAISED_MONEY);
                        }
                    }
                }
            } else {
                assert_eq!(s, b);
            }
        }
        // everything but the wasm filters' configs, the ports and the raised amounts is the same
        let mut left = gateway.clone();
        let mut right = chain.clone();
        for config in [&mut left, &mut right] {
            for_each_wasm_filter(config, &mut |f, _| {
                f["typed_config"]["config"]["configuration"]["value"] = json!("");
                Ok(())
            })
            .unwrap();
            for listener in array_mut(config, "/static_resources/listeners").unwrap() {
                listener["address"]["socket_address"]["port_value"] = json!(0);
            }
            point_clusters_at(config, MOCK).unwrap();
        }
        assert_eq!(left, right);
        assert_eq!(placeholders(&chain), ["LOG_DIR", "WASM_DIR"]);
        assert!(chain
            .to_string()
            .contains(&format!("\"port_value\":{MOCK}")));
    }

    #[test]
    fn every_provider_cluster_points_at_the_mock() {
        let chain = chain(MOCK, Build::PerPlugin).unwrap();
        let clusters = chain["static_resources"]["clusters"].as_array().unwrap();
        let names: Vec<&str> = clusters.iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(names, ["openai", "azure", "anthropic"]);
        for cluster in clusters {
            let socket = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
                ["address"]["socket_address"];
            assert_eq!(socket["port_value"], MOCK, "{}", cluster["name"]);
            // the YAML alias was resolved: each cluster keeps the upstream filter
            let upstream = cluster.pointer("/typed_extension_protocol_options/envoy.extensions.upstreams.http.v3.HttpProtocolOptions/http_filters/0/name");
            assert_eq!(upstream, Some(&json!("model-router-upstream")));
        }
    }

    #[test]
    fn the_bundle_keeps_every_root_id_in_one_vm() {
        let plain = wasm_filters(&chain(MOCK, Build::PerPlugin).unwrap()).unwrap();
        let bundle = wasm_filters(&chain(MOCK, Build::Bundle).unwrap()).unwrap();
        assert_eq!(plain.len(), bundle.len());
        for (p, b) in plain.iter().zip(&bundle) {
            assert_eq!(b.vm_id, BUNDLE_VM_ID);
            assert_eq!(b.file, BUNDLE_FILE);
            assert_eq!(
                (&p.name, &p.root_id, &p.config, p.upstream),
                (&b.name, &b.root_id, &b.config, b.upstream)
            );
        }
    }

    #[test]
    fn bare_has_only_the_router_and_the_gateway_access_log() {
        let mut gateway = gateway().unwrap();
        let mut bare = bare(MOCK).unwrap();
        assert_eq!(
            hcm(&mut bare).unwrap()["access_log"],
            hcm(&mut gateway).unwrap()["access_log"]
        );
        let filters = hcm(&mut bare).unwrap()["http_filters"].as_array().unwrap();
        assert_eq!(filters.len(), 1);
        assert_eq!(filters[0]["name"], "envoy.filters.http.router");
        assert_eq!(placeholders(&bare), ["LOG_DIR"]);
        assert!(bare.to_string().contains(&format!("\"port_value\":{MOCK}")));
    }

    #[test]
    fn the_fused_row_is_derived_like_the_chain() {
        // a stand-in for gateway-fused.yaml: gateway.yaml with the ratelimit config nested
        let mut config = gateway().unwrap();
        for_each_wasm_filter(&mut config, &mut |f, _| {
            let wasm = &mut f["typed_config"]["config"];
            if wasm["root_id"] == "token-ratelimit" {
                let inner = plugin_config(wasm)?;
                wasm["configuration"]["value"] =
                    json!(json!({"stages": {"token-ratelimit": inner}}).to_string());
            }
            Ok(())
        })
        .unwrap();
        let derived = fused_from(config, MOCK).unwrap();
        let filters = wasm_filters(&derived).unwrap();
        let trl = filters
            .iter()
            .find(|f| f.root_id == "token-ratelimit")
            .unwrap();
        let inner = &trl.config["stages"]["token-ratelimit"];
        assert_eq!(inner["limits"][0]["tokens"], json!(RAISED_AMOUNT));
        assert_eq!(inner["budgets"][0]["money"], json!(RAISED_MONEY));
        assert_eq!(
            inner["limits"][0]["per"], "minute",
            "only the amounts change"
        );
        assert!(derived
            .to_string()
            .contains(&format!("\"port_value\":{MOCK}")));
        // a config with nothing to raise is refused
        let bare = read_yaml("bench-bare.yaml").unwrap();
        assert!(fused_from(bare, MOCK).is_err());
        // not built yet: no row F (when the lead adds the file, this is what turns it on)
        assert_eq!(
            fused(MOCK).unwrap().is_some(),
            crate::workspace::envoy_config(FUSED_TEMPLATE).is_file()
        );
    }

    #[test]
    fn yaml_aliases_and_scalars_convert() {
        let v = yaml_to_json("a: &x {b: 1, c: [true, '0', 1.5]}\nd: *x\n\"0\": ~\n").unwrap();
        assert_eq!(v["d"], json!({"b": 1, "c": [true, "0", 1.5]}));
        assert_eq!(v["a"], v["d"]);
        assert_eq!(v["0"], Value::Null);
        assert!(yaml_to_json("a: [1, 2").is_err());
    }
}
