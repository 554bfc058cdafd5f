//! The ablation rows of `scripts/bench` (issue 19): row C's chain with one thing taken away at
//! a time, so that each part's cost is a measured difference to C, and two plugins alone in
//! front of Envoy's router, so that their cost per streamed event is measured over B.
//!
//! - **a plugin replaced by a stand-in** ([`Ablation::StandIn`]): its filter (both filters
//!   for the model router: the listener's and every provider cluster's upstream one) loads
//!   `tests/fixture-plugins/passthrough` instead, with the same name and `root_id`, in a VM of
//!   its own. The stand-in continues at every callback; to keep the rest of the chain doing
//!   the same work it writes, once on the request headers, what the plugin would have written
//!   for the bench's request, as fixed values derived here from the chain's own configs
//!   ([`stand_in_config`]): key-auth's identity headers of the demo key; the router's headers,
//!   plan, attempt slots and route record (and a fresh `x-llm-request-id`), the route cache
//!   cleared, and on the upstream side the provider credential; usage-accounting's usage
//!   record (`wasm.llm_usage`, which token-ratelimit settles from and the access log prints).
//!   What it cannot write the request carries itself ([`Ablation::request`]): the router's
//!   model rewrite (the body names the deployment's model) and usage-accounting's
//!   `stream_options.include_usage` (so the provider still sends the usage chunk).
//!   pii-redaction and token-ratelimit write nothing a later filter reads: their stand-in
//!   writes nothing.
//! - **no access log**: the listener's `access_log` removed.
//! - **no plugin metrics**: Envoy's `stats_config.stats_matcher` rejects every stat named
//!   `wasmcustom.*` (all the plugins' metrics): the plugins still define and increment them
//!   (the host calls remain), Envoy stores nothing and extracts no tags. No plugin has a
//!   switch for its metrics; this is the Envoy-level cut.
//! - **Envoy's log level at warn** (`--log-level warn` instead of `info`): the plugins' info
//!   lines (`host::log` below warn) are not written.
//! - **alone**: row B's config (router only, the same access log) with one filter of
//!   gateway.yaml, unchanged, in front of the router.

use super::config::{self, for_each_wasm_filter, hcm, WasmFilter};
use llm_gateway_shared::price::{MicroPrice, Price};
use llm_gateway_shared::route_info::{self, RouteInfo};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The stand-in's file in the wasm folder.
pub const PASSTHROUGH_FILE: &str = "passthrough.wasm";
/// The stand-in's `vm_id` prefix (`passthrough-<root_id>`: a VM per replaced filter).
pub const PASSTHROUGH_VM_PREFIX: &str = "passthrough-";
/// The model group the bench's requests name.
pub const GROUP: &str = "fast";
/// The stats prefix of every plugin metric (Envoy names a wasm metric `wasmcustom.<name>`).
pub const PLUGIN_STATS_PREFIX: &str = "wasmcustom.";

/// One ablation row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ablation {
    /// Row C with the plugin of this `root_id` replaced by the stand-in.
    StandIn(&'static str),
    /// Row C without the access log.
    NoAccessLog,
    /// Row C with the plugins' metrics rejected by Envoy.
    NoPluginMetrics,
    /// Row C with Envoy's log level at warn.
    LogWarn,
    /// Row B with the filter of this `root_id` in front of the router.
    Alone(&'static str),
}

/// The ablation rows, in the report's order.
pub const ABLATIONS: [Ablation; 10] = [
    Ablation::StandIn("key-auth"),
    Ablation::StandIn("model-router"),
    Ablation::StandIn("pii-redaction"),
    Ablation::StandIn("usage-accounting"),
    Ablation::StandIn("token-ratelimit"),
    Ablation::NoAccessLog,
    Ablation::NoPluginMetrics,
    Ablation::LogWarn,
    Ablation::Alone("pii-redaction"),
    Ablation::Alone("usage-accounting"),
];

/// What a row's requests change (see [`Ablation::request`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestChange {
    /// The body's `model`.
    pub model: String,
    /// A stream asks for `stream_options.include_usage` itself.
    pub include_usage: bool,
}

impl Ablation {
    /// Its name in the tables.
    pub fn letter(self) -> &'static str {
        match self {
            Ablation::StandIn("key-auth") => "C−ka",
            Ablation::StandIn("model-router") => "C−mr",
            Ablation::StandIn("pii-redaction") => "C−pii",
            Ablation::StandIn("usage-accounting") => "C−ua",
            Ablation::StandIn("token-ratelimit") => "C−trl",
            Ablation::StandIn(_) => "C−?",
            Ablation::NoAccessLog => "C−log",
            Ablation::NoPluginMetrics => "C−met",
            Ablation::LogWarn => "C−info",
            Ablation::Alone("pii-redaction") => "B+pii",
            Ablation::Alone("usage-accounting") => "B+ua",
            Ablation::Alone(_) => "B+?",
        }
    }

    /// What it is.
    pub fn label(self) -> &'static str {
        match self {
            Ablation::StandIn("key-auth") => "C, key-auth replaced by the stand-in (writes the demo key's identity headers)",
            Ablation::StandIn("model-router") => "C, model-router (both roles) replaced by the stand-in (writes the route of group `fast`; the body names the deployment's model)",
            Ablation::StandIn("pii-redaction") => "C, pii-redaction replaced by the stand-in (writes nothing)",
            Ablation::StandIn("usage-accounting") => "C, usage-accounting replaced by the stand-in (writes a usage record; a stream asks for include_usage itself)",
            Ablation::StandIn("token-ratelimit") => "C, token-ratelimit replaced by the stand-in (writes nothing)",
            Ablation::StandIn(_) => "C, a plugin replaced by the stand-in",
            Ablation::NoAccessLog => "C without the access log",
            Ablation::NoPluginMetrics => "C with the plugins' metrics off (Envoy's stats_matcher rejects `wasmcustom.*`)",
            Ablation::LogWarn => "C with Envoy's log level at warn (not info)",
            Ablation::Alone("pii-redaction") => "B + pii-redaction alone in front of the router",
            Ablation::Alone("usage-accounting") => "B + usage-accounting alone in front of the router",
            Ablation::Alone(_) => "B + one plugin alone",
        }
    }

    /// Envoy's `--log-level` for the row.
    pub fn log_level(self) -> &'static str {
        if self == Ablation::LogWarn {
            "warn"
        } else {
            "info"
        }
    }

    /// The row it is measured against: C, or B for a plugin alone.
    pub fn is_alone(self) -> bool {
        matches!(self, Ablation::Alone(_))
    }

    /// What the row's requests change, from `chain` (row C's config): the model-router stand-in
    /// gets the body the router would have forwarded (the first deployment's model of group
    /// [`GROUP`]); the usage-accounting stand-in's stream asks for the usage chunk itself.
    pub fn request(self, chain: &Value) -> crate::Result<RequestChange> {
        let model = match self {
            Ablation::StandIn("model-router") => plan(&config::wasm_filters(chain)?)?.model,
            _ => GROUP.to_string(),
        };
        Ok(RequestChange {
            model,
            include_usage: self == Ablation::StandIn("usage-accounting"),
        })
    }

    /// The row's Envoy config, from `chain` (row C's, [`config::chain`]) and `bare` (row B's,
    /// [`config::bare`]). Placeholders left: `${WASM_DIR}`, `${LOG_DIR}`.
    pub fn config(self, chain: &Value, bare: &Value) -> crate::Result<Value> {
        let mut out = chain.clone();
        match self {
            Ablation::StandIn(root) => {
                let filters = config::wasm_filters(chain)?;
                let mut replaced = 0;
                for_each_wasm_filter(&mut out, &mut |filter, upstream| {
                    let wasm = &mut filter["typed_config"]["config"];
                    let root_id = wasm["root_id"].as_str().unwrap_or_default().to_string();
                    if root_id != root && root_id != format!("{root}-upstream") {
                        return Ok(());
                    }
                    let standin = stand_in_config(root, upstream, &filters)?;
                    wasm["vm_config"]["vm_id"] = json!(format!("{PASSTHROUGH_VM_PREFIX}{root_id}"));
                    wasm["vm_config"]["code"] =
                        json!({"local": {"filename": format!("${{WASM_DIR}}/{PASSTHROUGH_FILE}")}});
                    wasm["configuration"]["value"] = json!(standin.to_string());
                    replaced += 1;
                    Ok(())
                })?;
                if replaced == 0 {
                    return Err(format!("the chain has no filter {root} to replace"));
                }
            }
            Ablation::NoAccessLog => {
                hcm(&mut out)?
                    .as_object_mut()
                    .and_then(|hcm| hcm.remove("access_log"))
                    .ok_or("the chain has no access_log")?;
            }
            Ablation::NoPluginMetrics => {
                let stats = out
                    .get_mut("stats_config")
                    .and_then(Value::as_object_mut)
                    .ok_or("the chain has no stats_config")?;
                if stats.contains_key("stats_matcher") {
                    return Err("the chain has a stats_matcher already".into());
                }
                stats.insert(
                    "stats_matcher".into(),
                    json!({"exclusion_list": {"patterns": [{"prefix": PLUGIN_STATS_PREFIX}]}}),
                );
            }
            Ablation::LogWarn => {}
            Ablation::Alone(root) => {
                let mut found = None;
                for_each_wasm_filter(&mut out, &mut |filter, upstream| {
                    if !upstream && filter["typed_config"]["config"]["root_id"] == root {
                        found = Some(filter.clone());
                    }
                    Ok(())
                })?;
                let filter = found.ok_or_else(|| format!("the chain has no filter {root}"))?;
                out = bare.clone();
                let filters = hcm(&mut out)?["http_filters"]
                    .as_array_mut()
                    .ok_or("row B has no http_filters")?;
                let router = filters.len().saturating_sub(1);
                filters.insert(router, filter);
            }
        }
        Ok(out)
    }
}

/// The first resolution of the router for group [`GROUP`]: the deployments of the plan, in
/// attempt order (the router's config objects), and the first one's model.
struct Plan {
    deployments: Vec<Value>,
    model: String,
    document: Value,
}

fn plan(filters: &[WasmFilter]) -> crate::Result<Plan> {
    let router = filters
        .iter()
        .find(|f| !f.upstream && f.root_id == "model-router")
        .ok_or("the chain has no model-router")?;
    let document = router.config.clone();
    let group = document["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|g| g["name"] == GROUP)
        .ok_or_else(|| format!("the router has no group {GROUP}"))?;
    let mut deployments = Vec::new();
    for member in group["deployments"].as_array().into_iter().flatten() {
        let deployment = document["deployments"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["name"] == member["deployment"])
            .ok_or_else(|| format!("group {GROUP}: no deployment {}", member["deployment"]))?;
        deployments.push(deployment.clone());
    }
    let model = deployments
        .first()
        .and_then(|d| d["model"].as_str())
        .ok_or_else(|| format!("group {GROUP} has no deployment"))?
        .to_string();
    Ok(Plan {
        deployments,
        model,
        document,
    })
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// The demo key's entry of key-auth's config and its SHA-256 (hex).
fn demo_identity(filters: &[WasmFilter]) -> crate::Result<(Value, String)> {
    let key_auth = filters
        .iter()
        .find(|f| f.root_id == "key-auth")
        .ok_or("the chain has no key-auth")?;
    let hash: String = Sha256::digest(crate::demo::DEMO_KEY.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let entry = key_auth.config["keys"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|k| k["key_sha256"] == hash.as_str())
        .ok_or("key-auth's config has no entry for the demo key")?;
    Ok((entry.clone(), hash))
}

/// The stand-in's configuration for the filter of plugin `root` (its `upstream` filter for the
/// router's upstream role): what that plugin writes for the bench's request, see the module
/// comment.
pub fn stand_in_config(root: &str, upstream: bool, filters: &[WasmFilter]) -> crate::Result<Value> {
    Ok(match (root, upstream) {
        ("key-auth", _) => {
            let (entry, hash) = demo_identity(filters)?;
            let groups: Vec<String> = entry["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .map(text)
                .collect();
            json!({
                "remove_request_headers": ["authorization"],
                "request_headers": [
                    ["x-llm-consumer", text(&entry["consumer"])],
                    ["x-llm-tenant", text(&entry["tenant"])],
                    ["x-llm-groups", groups.join(",")],
                    ["x-llm-key-id", hash.get(..16).unwrap_or_default()],
                ],
            })
        }
        ("model-router", false) => {
            let plan = plan(filters)?;
            let first = plan.deployments.first().ok_or("empty plan")?;
            let price = |d: &Value| -> Option<Price> {
                serde_json::from_value::<MicroPrice>(d["price"].clone())
                    .ok()
                    .map(Price::from)
            };
            let prices: Vec<Option<Price>> = plan.deployments.iter().map(price).collect();
            let info = RouteInfo {
                request_id: "bench-stand-in".into(),
                model_group: GROUP.into(),
                deployment: text(&first["name"]),
                model: plan.model.clone(),
                provider: text(&first["provider"]),
                price: price(first),
                price_version: first["price_version"].as_str().map(str::to_string),
                route_version: text(&plan.document["version"]),
                attempts: 1,
                tried: Vec::new(),
                price_ceiling: Price::ceiling(prices.iter().map(Option::as_ref)),
                client_api: None,
            };
            let names: Vec<String> = plan.deployments.iter().map(|d| text(&d["name"])).collect();
            let mut properties = vec![json!([route_info::ATTEMPT_PROPERTY, "0"])];
            for (k, d) in plan.deployments.iter().enumerate() {
                properties.push(json!([route_info::try_property(k), text(&d["cluster"])]));
            }
            properties.push(json!([route_info::PLAN_PROPERTY, names.join(",")]));
            properties.push(json!([
                route_info::PROPERTY,
                String::from_utf8_lossy(&info.to_json())
            ]));
            json!({
                "remove_request_headers": ["authorization", "x-api-key"],
                "request_headers": [
                    ["x-llm-model-group", GROUP],
                    ["x-llm-deployment", text(&first["name"])],
                    ["x-llm-cluster", text(&first["cluster"])],
                    [route_info::MAX_RETRIES_HEADER, names.len().saturating_sub(1).to_string()],
                ],
                "request_id_header": "x-llm-request-id",
                "properties": properties,
                "clear_route_cache": true,
            })
        }
        ("model-router", true) => {
            let plan = plan(filters)?;
            let first = plan.deployments.first().ok_or("empty plan")?;
            json!({
                "remove_request_headers": ["x-envoy-attempt-count"],
                "request_headers": [["authorization", format!("Bearer {}", text(&first["credential"]))]],
                "properties": [[route_info::ATTEMPT_PROPERTY, "1"]],
            })
        }
        ("usage-accounting", _) => {
            let (entry, _) = demo_identity(filters)?;
            let plan = plan(filters)?;
            let first = plan.deployments.first().ok_or("empty plan")?;
            let record = json!({
                "request_id": "bench-stand-in", "ts_ms": 1_764_480_000_000u64,
                "consumer": entry["consumer"], "tenant": entry["tenant"],
                "project": null, "agent": null, "run_id": null,
                "model_group": GROUP, "deployment": first["name"], "model": plan.model,
                "api": "chat.completions", "stream": false, "status": 200, "complete": true,
                "attempts": [{"deployment": first["name"], "status": 200}],
                "usage_source": "upstream",
                "usage": {"prompt_tokens": 500, "completion_tokens": 200, "cached_prompt_tokens": 0,
                          "cache_write_tokens": 0, "reasoning_tokens": 0, "total_tokens": 700},
                "cost_nano": 195_000, "currency": "USD",
                "price_version": first["price_version"], "ttft_ms": 1, "duration_ms": 2
            });
            json!({"properties": [[llm_gateway_shared::usage_record::PROPERTY, record.to_string()]]})
        }
        _ => json!({}),
    })
}

/// The added CPU per streamed event: the whole request's proxy CPU over the reference row's
/// (`cpu_us − reference_cpu_us`) divided by the events of the stream.
pub fn per_event_us(cpu_us: f64, reference_cpu_us: f64, events: u32) -> f64 {
    (cpu_us - reference_cpu_us) / f64::from(events.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::config::{bare, chain, Build};

    const MOCK: u16 = 45678;

    fn configs() -> (Value, Value) {
        (chain(MOCK, Build::PerPlugin).unwrap(), bare(MOCK).unwrap())
    }

    /// `config` with every wasm filter's module, VM and configuration blanked.
    fn without_wasm(config: &Value) -> Value {
        let mut config = config.clone();
        for_each_wasm_filter(&mut config, &mut |f, _| {
            let wasm = &mut f["typed_config"]["config"];
            wasm["vm_config"]["vm_id"] = json!("");
            wasm["vm_config"]["code"] = json!("");
            wasm["configuration"]["value"] = json!("");
            Ok(())
        })
        .unwrap();
        config
    }

    #[test]
    fn a_stand_in_replaces_exactly_its_plugins_filters() {
        let (chain, bare) = configs();
        let shipped = config::wasm_filters(&chain).unwrap();
        for root in [
            "key-auth",
            "model-router",
            "pii-redaction",
            "usage-accounting",
            "token-ratelimit",
        ] {
            let row = Ablation::StandIn(root).config(&chain, &bare).unwrap();
            // nothing but the wasm filters' modules and configurations changed
            assert_eq!(without_wasm(&row), without_wasm(&chain), "{root}");
            let filters = config::wasm_filters(&row).unwrap();
            assert_eq!(filters.len(), shipped.len());
            let mut replaced = 0;
            for (s, f) in shipped.iter().zip(&filters) {
                assert_eq!(
                    (&s.name, &s.root_id, s.upstream),
                    (&f.name, &f.root_id, f.upstream)
                );
                let mine = s.root_id == root || s.root_id == format!("{root}-upstream");
                if mine {
                    replaced += 1;
                    assert_eq!(f.file, PASSTHROUGH_FILE);
                    assert_eq!(f.vm_id, format!("{PASSTHROUGH_VM_PREFIX}{}", s.root_id));
                    assert_eq!(
                        f.config,
                        stand_in_config(root, s.upstream, &shipped).unwrap()
                    );
                } else {
                    assert_eq!(s, f, "{root}: {} changed", s.root_id);
                }
            }
            // the router has two filters (listener and upstream role), the others one
            assert_eq!(
                replaced,
                if root == "model-router" { 2 } else { 1 },
                "{root}"
            );
        }
        assert!(Ablation::StandIn("nope").config(&chain, &bare).is_err());
    }

    #[test]
    fn the_stand_ins_write_what_their_plugins_would() {
        let (chain, _) = configs();
        let filters = config::wasm_filters(&chain).unwrap();
        let key_auth = stand_in_config("key-auth", false, &filters).unwrap();
        assert_eq!(
            key_auth["request_headers"],
            json!([
                ["x-llm-consumer", "demo"],
                ["x-llm-tenant", "demo"],
                ["x-llm-groups", "fast,smart,claude,code"],
                ["x-llm-key-id", "4ab4d281142e669c"]
            ])
        );
        let router = stand_in_config("model-router", false, &filters).unwrap();
        let props: Vec<(String, String)> =
            serde_json::from_value(router["properties"].clone()).unwrap();
        let prop = |name: &str| {
            props
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(prop("llm_attempt").as_deref(), Some("0"));
        assert_eq!(prop("llm_try_0").as_deref(), Some("openai"));
        assert_eq!(prop("llm_try_1").as_deref(), Some("azure"));
        assert_eq!(
            prop("llm_route_plan").as_deref(),
            Some("openai-mini,azure-mini")
        );
        let info = RouteInfo::from_json(prop("llm_route").unwrap().as_bytes()).unwrap();
        assert_eq!(
            (info.deployment.as_str(), info.model.as_str()),
            ("openai-mini", "gpt-4o-mini")
        );
        // in the router's form (micro-units per 1M tokens), as its configuration has them
        assert_eq!(MicroPrice::from(&info.price.unwrap()).input, 150_000);
        assert_eq!(
            MicroPrice::from(&info.price_ceiling.unwrap()).input,
            165_000,
            "the plan's highest price"
        );
        assert_eq!(router["request_id_header"], "x-llm-request-id");
        assert_eq!(router["clear_route_cache"], true);
        let upstream = stand_in_config("model-router", true, &filters).unwrap();
        assert_eq!(
            upstream["request_headers"],
            json!([["authorization", "Bearer sk-demo-openai-provider-credential"]])
        );
        let usage = stand_in_config("usage-accounting", false, &filters).unwrap();
        let record = usage["properties"][0][1].as_str().unwrap();
        let record = llm_gateway_shared::usage_record::Record::from_json(record.as_bytes())
            .expect("token-ratelimit reads the stand-in's record");
        assert_eq!(record.deployment.as_deref(), Some("openai-mini"));
        for quiet in ["pii-redaction", "token-ratelimit"] {
            assert_eq!(stand_in_config(quiet, false, &filters).unwrap(), json!({}));
        }
        // the requests carry what the stand-ins cannot write
        let router_row = Ablation::StandIn("model-router").request(&chain).unwrap();
        assert_eq!(
            (router_row.model.as_str(), router_row.include_usage),
            ("gpt-4o-mini", false)
        );
        let usage_row = Ablation::StandIn("usage-accounting")
            .request(&chain)
            .unwrap();
        assert_eq!(
            (usage_row.model.as_str(), usage_row.include_usage),
            ("fast", true)
        );
        assert_eq!(Ablation::NoAccessLog.request(&chain).unwrap().model, "fast");
    }

    #[test]
    fn the_envoy_level_cuts_change_only_their_part() {
        let (chain, bare) = configs();
        let mut c = chain.clone();
        let mut no_log = Ablation::NoAccessLog.config(&chain, &bare).unwrap();
        assert!(hcm(&mut no_log).unwrap().get("access_log").is_none());
        hcm(&mut c)
            .unwrap()
            .as_object_mut()
            .unwrap()
            .remove("access_log");
        assert_eq!(no_log, c);

        let no_metrics = Ablation::NoPluginMetrics.config(&chain, &bare).unwrap();
        assert_eq!(
            no_metrics["stats_config"]["stats_matcher"],
            json!({"exclusion_list": {"patterns": [{"prefix": "wasmcustom."}]}})
        );
        let mut back = no_metrics.clone();
        back["stats_config"]
            .as_object_mut()
            .unwrap()
            .remove("stats_matcher");
        assert_eq!(back, chain);

        assert_eq!(Ablation::LogWarn.config(&chain, &bare).unwrap(), chain);
        assert_eq!(Ablation::LogWarn.log_level(), "warn");
        assert_eq!(Ablation::NoAccessLog.log_level(), "info");
    }

    #[test]
    fn a_plugin_alone_is_bare_envoy_with_its_filter_before_the_router() {
        let (chain, bare) = configs();
        let shipped = config::wasm_filters(&chain).unwrap();
        for root in ["pii-redaction", "usage-accounting"] {
            let mut row = Ablation::Alone(root).config(&chain, &bare).unwrap();
            let filters = config::wasm_filters(&row).unwrap();
            assert_eq!(filters.len(), 1, "{root}");
            let shipped = shipped.iter().find(|f| f.root_id == root).unwrap();
            assert_eq!(&filters[0], shipped);
            let http = hcm(&mut row).unwrap()["http_filters"]
                .as_array()
                .unwrap()
                .clone();
            assert_eq!(http.len(), 2);
            assert_eq!(http[1]["name"], "envoy.filters.http.router");
            // the rest is row B
            let mut without = row.clone();
            hcm(&mut without).unwrap()["http_filters"]
                .as_array_mut()
                .unwrap()
                .remove(0);
            assert_eq!(without, bare);
            assert!(Ablation::Alone(root).is_alone());
        }
    }

    #[test]
    fn the_rows_have_distinct_names() {
        let mut letters: Vec<&str> = ABLATIONS.iter().map(|a| a.letter()).collect();
        assert!(!letters.iter().any(|l| l.contains('?')));
        letters.sort();
        letters.dedup();
        assert_eq!(letters.len(), ABLATIONS.len());
    }

    #[test]
    fn per_event_cost_is_the_added_cpu_over_the_events() {
        assert_eq!(per_event_us(1_400.0, 600.0, 200), 4.0);
        assert_eq!(per_event_us(600.0, 700.0, 200), -0.5);
        assert_eq!(per_event_us(10.0, 0.0, 0), 10.0, "no division by zero");
    }

    /// pii-redaction's rules in the chain the bench runs.
    fn chain_pii_rules(
    ) -> llm_gateway_shared::rules::RuleSet<std::rc::Rc<pii_redaction::config::PiiConfig>> {
        let (chain, _) = configs();
        let filters = config::wasm_filters(&chain).unwrap();
        let pii = filters
            .iter()
            .find(|f| f.root_id == "pii-redaction")
            .unwrap();
        let rules =
            pii_redaction::config::parse_document(pii.config.to_string().as_bytes()).unwrap();
        rules
    }

    #[test]
    fn the_pii_chat_is_masked_by_the_chains_pii_redaction() {
        use llm_gateway_shared::request::Api;
        use pii_redaction::request::{redact_body, Redaction};
        let rules = chain_pii_rules();
        let chats: Vec<_> = crate::bench::wrk::WORKLOADS
            .iter()
            .filter(|w| !w.streams())
            .collect();
        assert!(chats.iter().any(|w| w.pii), "a chat with personal data");
        for chat in chats {
            let body = chat.body("fast");
            assert!(body.len() <= chat.prompt_bytes + 200, "{}", chat.name);
            let mut map = Default::default();
            let redaction = redact_body(
                rules.global().unwrap(),
                Some(Api::ChatCompletions),
                body.as_bytes(),
                &mut map,
            );
            match redaction {
                Redaction::Rewritten(sent) => {
                    assert!(chat.pii, "{} has no personal data", chat.name);
                    let sent = String::from_utf8(sent).unwrap();
                    assert!(sent.contains("[EMAIL_1]") && sent.contains("[PHONE_1]"));
                    assert!(!sent.contains("jo@ab.com") && !sent.contains("017012345"));
                }
                Redaction::Unchanged => assert!(!chat.pii, "{} is not masked", chat.name),
                _ => panic!("{} is forwarded", chat.name),
            }
        }
    }

    #[test]
    fn the_streamed_prompt_keeps_its_length_through_pii_redaction() {
        use llm_gateway_shared::request::Api;
        use pii_redaction::request::{redact_body, Redaction};
        let rules = chain_pii_rules();
        let stream = crate::bench::wrk::WORKLOADS
            .iter()
            .find(|w| w.echo)
            .unwrap();
        let mut map = Default::default();
        let Redaction::Rewritten(body) = redact_body(
            rules.global().unwrap(),
            Some(Api::ChatCompletions),
            stream.body("fast").as_bytes(),
            &mut map,
        ) else {
            panic!("the stream's prompt has personal data to mask");
        };
        let body: Value = serde_json::from_slice(&body).unwrap();
        let sent = body["messages"].as_array().unwrap().last().unwrap()["content"]
            .as_str()
            .unwrap()
            .to_string();
        let original = stream.echo_message();
        assert!(
            sent.contains("[EMAIL_1]") && sent.contains("[PHONE_1]"),
            "{sent}"
        );
        assert!(!sent.contains("jo@ab.com") && !sent.contains("017012345"));
        // as many 3-character events echoed through the chain as through bare Envoy
        assert_eq!(sent.chars().count(), original.chars().count());
    }
}
