//! The gateway's journey in the wasmtime harness, shared by the suites that prove another
//! build does what the five standalone modules do (`harness bundle::`, `harness fused::`): the
//! wasm filters of `envoy-config/gateway.yaml`, a mock provider, the journey of `e2e chain::`
//! (a stream with an e-mail address, one without usage, a non-streaming chat, the refusals),
//! and everything the chain did to each exchange, as JSON.

use crate::bundle;
use crate::demo::{DEMO_KEY, FAST_ONLY_KEY};
use crate::harness::stream::Headers;
use crate::harness::{Exchange, FilterSpec, Fleet, Request, Response, Upstream};
use crate::workspace;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use yaml_rust2::{Yaml, YamlLoader};

/// The e-mail address the journey's messages carry.
pub const EMAIL: &str = "jane.doe@example.com";

/// A wasm filter of gateway.yaml.
#[derive(Debug)]
pub struct GatewayFilter {
    pub name: String,
    pub root_id: String,
    pub vm_id: String,
    /// The module's name in dist/ (`key-auth` for `${WASM_DIR}/key-auth.wasm`).
    pub module: String,
    pub config: Value,
    pub allow_stop: bool,
}

fn wasm_filter(filter: &Yaml) -> Option<GatewayFilter> {
    let config = &filter["typed_config"]["config"];
    let vm = &config["vm_config"];
    let file = vm["code"]["local"]["filename"].as_str()?;
    let module = file
        .strip_prefix("@wasm/")?
        .strip_suffix(".wasm")?
        .to_string();
    let text = config["configuration"]["value"].as_str()?;
    Some(GatewayFilter {
        name: config["name"].as_str()?.to_string(),
        root_id: config["root_id"].as_str()?.to_string(),
        vm_id: vm["vm_id"].as_str()?.to_string(),
        module,
        config: serde_json::from_str(text).unwrap(),
        allow_stop: config["allow_on_headers_stop_iteration"]
            .as_bool()
            .unwrap_or(false),
    })
}

/// The listener's wasm filters of gateway.yaml in chain order, then the first provider
/// cluster's upstream filter (the model router's upstream role).
pub fn gateway_filters() -> Vec<GatewayFilter> {
    let path = workspace::envoy_config(crate::demo::CONFIG);
    let template = std::fs::read_to_string(&path).unwrap();
    // `${…}` inside a YAML flow mapping does not parse: placeholders first
    let mut vars = crate::demo::vars(1, 1, 1, 1);
    vars.push(("WASM_DIR", "@wasm".into()));
    vars.push(("LOG_DIR", "/tmp".into()));
    let text = workspace::render(&template, &vars).unwrap();
    let docs = YamlLoader::load_from_str(&text).unwrap();
    let resources = &docs[0]["static_resources"];
    let listener = &resources["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
    let upstream = &resources["clusters"][0]["typed_extension_protocol_options"]
        ["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"];
    let mut filters: Vec<GatewayFilter> = listener["http_filters"]
        .as_vec()
        .unwrap()
        .iter()
        .filter_map(wasm_filter)
        .collect();
    filters.extend(
        upstream["http_filters"]
            .as_vec()
            .unwrap()
            .iter()
            .filter_map(wasm_filter),
    );
    // Envoy runs the clusters' upstream filter in the listener router's VM (same vm_id and
    // module), where the upstream role finds the deployments of the listener's document; the
    // harness runs each filter in a VM of its own, so it hands the upstream role that document
    let router = filters
        .iter()
        .find(|f| f.root_id == "model-router")
        .map(|f| f.config.clone())
        .unwrap();
    for filter in filters
        .iter_mut()
        .filter(|f| f.root_id == "model-router-upstream")
    {
        if filter.config.get("deployments").is_none() {
            let mut document = router.clone();
            document["role"] = json!("upstream");
            filter.config = document;
        }
    }
    let roots: Vec<&str> = filters.iter().map(|f| f.root_id.as_str()).collect();
    assert_eq!(
        roots,
        [
            "key-auth",
            "model-router",
            "pii-redaction",
            "usage-accounting",
            "token-ratelimit",
            "model-router-upstream"
        ],
        "gateway.yaml's chain changed: update this suite"
    );
    filters
}

/// How the chain is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// One module per plugin, as gateway.yaml runs it.
    Separate,
    /// Every filter from the bundle module, as gateway-bundle.yaml runs it.
    Bundle,
    /// The five listener filters as one fused filter, as gateway-fused.yaml runs it.
    Fused,
}

/// The chain as gateway.yaml runs it (`bundled`: as gateway-bundle.yaml runs it).
pub fn chain(bundled: bool) -> Fleet {
    chain_of(
        if bundled {
            Form::Bundle
        } else {
            Form::Separate
        },
        &[],
    )
}

/// The chain in `form`, without the listener filters whose root ids are in `without`.
pub fn chain_of(form: Form, without: &[&str]) -> Fleet {
    let mut builder = Fleet::builder();
    let filters: Vec<GatewayFilter> = gateway_filters()
        .into_iter()
        .filter(|f| !without.contains(&f.root_id.as_str()))
        .collect();
    if form == Form::Fused {
        // the listener's filters in one, each configuration under its section
        let mut sections = serde_json::Map::new();
        for filter in filters
            .iter()
            .filter(|f| f.root_id != "model-router-upstream")
        {
            let section = filter.root_id.replace('-', "_");
            sections.insert(section, filter.config.clone());
        }
        let spec = FilterSpec::plugin(bundle::MODULE, &Value::Object(sections))
            .unwrap()
            .root_id(crate::fused::ROOT_ID)
            .vm_id(bundle::VM_ID)
            .allow_on_headers_stop_iteration(true);
        builder = builder.filter(spec);
    }
    for filter in filters {
        if form == Form::Fused && filter.root_id != "model-router-upstream" {
            continue;
        }
        let module = match form {
            Form::Separate => filter.module.as_str(),
            Form::Bundle | Form::Fused => bundle::MODULE,
        };
        let vm_id = match form {
            Form::Separate => filter.vm_id.as_str(),
            Form::Bundle | Form::Fused => bundle::VM_ID,
        };
        let mut spec = FilterSpec::plugin(module, &filter.config)
            .unwrap()
            .root_id(&filter.root_id)
            .vm_id(vm_id)
            .allow_on_headers_stop_iteration(filter.allow_stop);
        spec.name = filter.name;
        builder = builder.filter(spec);
    }
    builder.build().unwrap()
}

/// The mock provider's answer with `x-mock-echo`: the last user message it received, as a
/// stream of 4-character deltas (with the usage chunk if the body asked for one, unless
/// `usage` is false) cut into 7-byte pieces, or as one chat completion.
pub fn provider(up: &Upstream, usage: bool) -> Response {
    let body: Value = serde_json::from_slice(&up.body).unwrap();
    let said = body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string();
    let model = body["model"].as_str().unwrap_or_default();
    let chars: Vec<char> = said.chars().collect();
    let pieces: Vec<String> = chars.chunks(4).map(|c| c.iter().collect()).collect();
    let usage_json = json!({"prompt_tokens": 40, "completion_tokens": pieces.len(),
        "total_tokens": 40 + pieces.len()});
    if body["stream"] != true {
        let mut answer = json!({"id": "chatcmpl-1", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": said},
                         "finish_reason": "stop"}]});
        if usage {
            answer["usage"] = usage_json;
        }
        let length = answer.to_string().len().to_string();
        return Response::json(&answer).header("content-length", &length);
    }
    let mut sse = String::new();
    for piece in &pieces {
        let event = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": model,
            "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": null}]});
        sse.push_str(&format!("data: {event}\n\n"));
    }
    if usage && body["stream_options"]["include_usage"] == true {
        let event = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": model,
            "choices": [], "usage": usage_json});
        sse.push_str(&format!("data: {event}\n\n"));
    }
    sse.push_str("data: [DONE]\n\n");
    let offsets: Vec<usize> = (7..sse.len()).step_by(7).collect();
    Response::status(200)
        .header("content-type", "text/event-stream")
        .body(sse.as_bytes())
        .split_at(&offsets)
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn headers_json(headers: Option<&Headers>) -> Value {
    headers
        .map(|h| {
            h.iter()
                .map(|(n, v)| json!([n, text(v)]))
                .collect::<Vec<_>>()
        })
        .into()
}

/// Everything the chain did to one exchange, as JSON.
pub fn summary(ex: &Exchange) -> Value {
    let filter_state: BTreeMap<&String, String> =
        ex.filter_state.iter().map(|(k, v)| (k, text(v))).collect();
    json!({
        "upstream": ex.upstream.as_ref().map(|up| json!({
            "headers": headers_json(up.headers.as_ref()),
            "body": text(&up.body),
        })),
        "downstream": {
            "headers": headers_json(ex.downstream.headers.as_ref()),
            "body": text(&ex.downstream.body),
        },
        "local_reply": ex.local_reply.as_ref().map(|r| json!({
            "filter": r.filter, "status": r.status, "details": r.details,
            "headers": headers_json(Some(&r.headers)), "body": text(&r.body),
        })),
        "filter_state": filter_state,
        "route_cache_cleared": ex.route_cache_cleared,
    })
}

/// The journey, one exchange after the other on one worker; each exchange's summary with the
/// router's request id (random per VM) replaced by `<request-id>`, and key-auth's re-entry
/// ticket (a MAC under a per-VM secret) by `<reentry-ticket>`.
pub fn journey(fleet: &Fleet) -> Vec<Value> {
    let key = format!("Bearer {DEMO_KEY}");
    let intern = format!("Bearer {FAST_ONLY_KEY}");
    let mail = format!("Please write to {EMAIL} about the launch");
    let chat = |content: &str, stream: bool| json!({"model": "fast", "stream": stream, "messages": [{"role": "user", "content": content}]});
    let post = |auth: Option<&str>, user: &str, body: &Value| {
        let mut request = Request::post("/v1/chat/completions").header("x-user-id", user);
        if let Some(auth) = auth {
            request = request.header("authorization", auth);
        }
        let raw = body.to_string();
        let offsets: Vec<usize> = (64..raw.len()).step_by(64).collect();
        request.json(body).split_at(&offsets)
    };
    let steps: Vec<(Request, bool)> = vec![
        (post(Some(&key), "alice", &chat(&mail, true)), true),
        (post(Some(&key), "bob", &chat(&mail, true)), false),
        (post(Some(&key), "alice", &chat(&mail, false)), true),
        (post(None, "alice", &chat("Hello!", false)), true),
        (
            post(
                Some(&intern),
                "carol",
                &json!({"model": "smart", "messages": [{"role": "user", "content": "Hello!"}]}),
            ),
            true,
        ),
        (
            post(
                Some(&key),
                "alice",
                &json!({"model": "gpt-5", "messages": [{"role": "user", "content": "Hello!"}]}),
            ),
            true,
        ),
    ];
    steps
        .iter()
        .enumerate()
        .map(|(i, (request, usage))| {
            let ex = fleet
                .exchange(0, 0, request, |up| provider(up, *usage))
                .unwrap_or_else(|e| panic!("step {i}: {e}"));
            // the first three steps are model calls of valid keys: they reach the provider
            assert_eq!(ex.upstream.is_some(), i < 3, "step {i}: {}", ex.text());
            let mut text = summary(&ex).to_string();
            if let Some(id) = ex.upstream_header("x-llm-request-id") {
                assert!(!id.is_empty());
                text = text.replace(id, "<request-id>");
            }
            // key-auth's re-entry ticket: a MAC under a per-VM random secret
            if let Some(ticket) = ex.filter_state.get("wasm.llm_reentry") {
                let ticket = String::from_utf8_lossy(ticket).into_owned();
                assert!(ticket.starts_with("v1|"), "{ticket}");
                text = text.replace(&ticket, "<reentry-ticket>");
            }
            serde_json::from_str(&text).unwrap()
        })
        .collect()
}

/// Shared data of every vm_id of the chain, key -> value (CAS tokens left out).
pub fn shared_data(fleet: &Fleet, vm_ids: &[&str]) -> BTreeMap<String, String> {
    let data = &fleet.services(0).shared_data;
    let mut all = BTreeMap::new();
    for vm_id in vm_ids {
        for key in data.keys(vm_id) {
            let (value, _) = data.get(vm_id, &key).unwrap();
            assert!(
                all.insert(key.clone(), format!("{value:?}")).is_none(),
                "{key} in two vm_ids"
            );
        }
    }
    all
}

/// Every metric: name, kind, value, histogram samples.
pub fn metrics(fleet: &Fleet) -> Vec<String> {
    let metrics = &fleet.services(0).metrics;
    let mut all: Vec<String> = metrics
        .names()
        .into_iter()
        .map(|(name, kind)| {
            format!(
                "{name} {kind:?} {:?} {:?}",
                metrics.value(&name),
                metrics.samples(&name)
            )
        })
        .collect();
    all.sort();
    all
}
