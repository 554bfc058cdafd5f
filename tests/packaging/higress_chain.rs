//! The chain exactly as `higress/*.yaml` configures it: the modules the WasmPlugins' `url`s
//! name (`dist/higress/<image>.wasm`, the images `scripts/package-oci` makes), in the order
//! their phases and priorities give, each with the document Higress would hand it
//! (`defaultConfig` + `_rules_`), Redis at the CRDs' service name — on the wasmtime harness in
//! its Higress mode, with Higress's Redis calls against a real `redis-server`. Every VM must
//! accept its configuration, and the demo key's request must go through all five.
//!
//! Higress mode as a WasmPlugin gets it: no `allow_on_headers_stop_iteration` (a WasmPlugin
//! has no field for it, and the harness refuses it in this mode); the filters that hold the
//! request headers until they read the body get it because their modules export
//! `proxy_abi_version_0_2_100`, for which Higress's host passes `Pause` through as a
//! `StopIteration` (docs/host-notes.md, "Higress mode"). The second test shows that this is
//! what makes the chain work: the plain `_0_2_1` router in the same mode never gets its body.
//! Still the harness, not a running Higress (none on the test machine).

use crate::common::*;
use llm_gateway_tests::demo::DEMO_KEY;
use llm_gateway_tests::harness::traffic::Books;
use llm_gateway_tests::harness::{
    Direction, FilterSpec, Fleet, Host, InternalRedirect, Property, Request, Response,
};
use llm_gateway_tests::redis::Redis;
use llm_gateway_tests::workspace::sha256_hex;
use serde_json::{json, Value};

/// The provider's chat completion, echoing the placeholder it was given (40 + 8 tokens).
fn completion() -> Response {
    Response::json(&json!({
        "object": "chat.completion",
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant",
                     "content": "I wrote to [EMAIL_1]."}}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 8}
    }))
}

/// The CRDs' chain in Higress mode: the Higress builds in CRD order with their documents,
/// Redis at the CRDs' service, the clock at now.
fn crd_fleet(placed: &[(usize, i64, String, Value)]) -> (Redis, Fleet) {
    let redis = Redis::start().unwrap();
    let mut services = Vec::new();
    let mut builder = Fleet::builder().host(Host::Higress);
    for (_, _, image, document) in placed {
        redis_services(document, &mut services);
        builder = builder.filter(FilterSpec::higress(image, document).unwrap());
    }
    let fleet = builder.redis(&services[0], redis.addr()).build().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    fleet.clock().set_nanos(now.as_nanos() as u64);
    (redis, fleet)
}

/// The Redis service names in the CRDs' configs (`redis.service`, `ledger.service`).
fn redis_services(document: &Value, out: &mut Vec<String>) {
    for key in ["redis", "ledger"] {
        if let Some(service) = document[key]["service"].as_str() {
            if !out.iter().any(|s| s == service) {
                out.push(service.to_string());
            }
        }
    }
}

/// The WasmPlugins in chain order (phase, then priority, higher first) as
/// (rank, priority, image, the document Higress hands the plugin).
fn placed() -> Vec<(usize, i64, String, Value)> {
    let mut placed: Vec<(usize, i64, String, Value)> = wasm_plugins()
        .iter()
        .map(|doc| {
            let spec = &doc.value["spec"];
            let rank = PHASES.iter().position(|p| spec["phase"] == *p).unwrap();
            let (image, _) = plugin_image(doc);
            let document = higress_plugin_config(spec).unwrap();
            (rank, spec["priority"].as_i64().unwrap(), image, document)
        })
        .collect();
    placed.sort_by_key(|(rank, priority, _, _)| (*rank, -priority));
    placed
}

/// The demo key's chat request on the CRDs' route (Higress's property `route_name`).
fn demo_request() -> Request {
    demo_chat(false)
}

fn demo_chat(stream: bool) -> Request {
    let mut request = Request::post("/v1/chat/completions")
        .header("authorization", &format!("Bearer {DEMO_KEY}"))
        .json(&json!({
            "model": "fast",
            "stream": stream,
            "messages": [{"role": "user", "content": "Write to alice@example.com about lunch"}]
        }));
    request.properties = vec![
        ("route_name".to_string(), Property::from("default/llm-api")),
        (
            "source.address".to_string(),
            Property::from("10.1.2.3:50000"),
        ),
    ];
    request
}

#[test]
fn the_crds_configure_the_compiled_chain_and_a_request_goes_through() {
    let placed = placed();

    let redis = Redis::start().unwrap();
    let mut services = Vec::new();
    let mut builder = Fleet::builder().host(Host::Higress);
    for (_, _, image, document) in &placed {
        redis_services(document, &mut services);
        builder = builder.filter(FilterSpec::higress(image, document).unwrap());
    }
    assert_eq!(services.len(), 1, "one Redis for the chain: {services:?}");
    builder = builder.redis(&services[0], redis.addr());
    let fleet = builder
        .build()
        .unwrap_or_else(|e| panic!("a VM refused its CRD config: {e}"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    fleet.clock().set_nanos(now.as_nanos() as u64);

    // the key of key-auth.yaml's digest is the demo key
    let key_auth = &placed[0].3;
    assert_eq!(
        key_auth["keys"][0]["key_sha256"],
        sha256_hex(DEMO_KEY.as_bytes())
    );

    let request = demo_request();

    let mut upstream_body = String::new();
    let mut upstream_auth = None;
    let ex = fleet
        .exchange(0, 0, &request, |up| {
            upstream_body = String::from_utf8_lossy(&up.body).into_owned();
            upstream_auth = up.headers.as_ref().and_then(|h| {
                h.iter()
                    .find(|(n, _)| n == "authorization")
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            });
            completion()
        })
        .unwrap();
    let log = fleet.log_text();
    assert_eq!(ex.status(), 200, "{}\n{log}", ex.text());

    // key-auth → router: the real model and the deployment's credential, never the key
    let sent: Value = serde_json::from_str(&upstream_body).unwrap();
    assert_eq!(sent["model"], "gpt-4o-mini", "{upstream_body}");
    assert_eq!(upstream_auth.as_deref(), Some("Bearer sk-replace-me"));
    assert!(!upstream_body.contains(DEMO_KEY));
    // pii-redaction: a placeholder upstream, the address back for the client
    assert!(
        !upstream_body.contains("alice@example.com"),
        "{upstream_body}"
    );
    assert!(upstream_body.contains("[EMAIL_1]"), "{upstream_body}");
    assert!(
        ex.text().contains("I wrote to alice@example.com."),
        "{}",
        ex.text()
    );
    assert_eq!(ex.header("x-llm-deployment"), Some("openai-mini"));
    // token-ratelimit answered with its headers
    assert!(
        ex.header("x-ratelimit-limit-tokens").is_some(),
        "{:?}",
        ex.downstream.headers
    );

    // usage-accounting: the record, and (after the Redis replies) the ledger entry
    let record: Value =
        serde_json::from_slice(ex.filter_state.get("wasm.llm_usage").unwrap()).unwrap();
    assert_eq!(record["tenant"], "demo", "{record}");
    assert_eq!(record["deployment"], "openai-mini", "{record}");
    fleet.pump().unwrap();
    let stream = placed
        .iter()
        .find_map(|(_, _, _, d)| d["ledger"]["stream"].as_str())
        .unwrap();
    assert_eq!(redis.command(&["XLEN", stream]).unwrap(), ":1\r\n", "{log}");
    // token-ratelimit: its buckets and budgets live in that Redis
    let keys = redis.command(&["DBSIZE"]).unwrap();
    let keys: u64 = keys.trim_start_matches(':').trim().parse().unwrap();
    assert!(
        keys >= 2,
        "token-ratelimit wrote nothing to Redis ({keys} keys)"
    );

    // a wrong key on that route: 401 before anything reaches a provider
    let mut wrong = Request::post("/v1/chat/completions")
        .header("authorization", "Bearer sk-wrong")
        .json(&json!({"model": "fast", "messages": []}));
    wrong.properties = vec![("route_name".to_string(), Property::from("default/llm-api"))];
    let ex = fleet
        .exchange(0, 0, &wrong, |_| Response::status(200))
        .unwrap();
    assert_eq!(ex.status(), 401);
    assert!(ex.upstream.is_none());
}

/// Why the Higress builds exist: in Higress mode (no `allow_on_headers_stop_iteration`) the
/// router of `model-router.yaml`, which holds the request headers until it has read `model`
/// from the body, never gets the body as the plain `_0_2_1` build — its `Pause` is
/// `StopAllIterationAndWatermark`, the request hangs — and gets it as the `_0_2_100` build.
#[test]
fn on_higress_only_the_0_2_100_router_gets_the_body_it_paused_for() {
    let placed = placed();
    let document = |image: &str| {
        placed
            .iter()
            .find(|(_, _, i, _)| i == image)
            .map(|(_, _, _, d)| d.clone())
            .unwrap()
    };
    let (key_auth, router) = (document("key-auth"), document("model-router"));
    let chain = |router: FilterSpec| {
        Fleet::builder()
            .host(Host::Higress)
            .filter(FilterSpec::higress("key-auth", &key_auth).unwrap())
            .filter(router)
            .build()
            .unwrap()
    };

    // the plain build: headers paused at the router, the body never delivered to it
    let plain = chain(FilterSpec::plugin("model-router", &router).unwrap());
    let request = demo_request();
    let stream = plain.stream(0, 0).unwrap();
    for (path, value) in &request.properties {
        stream.set_property(path, value.clone());
    }
    stream
        .send_request_headers_raw(request.headers.clone(), false)
        .unwrap();
    stream.send_request_body(&request.chunks[0], true).unwrap();
    plain.pump().unwrap();
    let callbacks: Vec<&str> = stream
        .costs()
        .iter()
        .filter(|c| c.filter == 1)
        .map(|c| c.callback)
        .collect();
    assert!(
        callbacks.contains(&"proxy_on_request_headers")
            && !callbacks.contains(&"proxy_on_request_body"),
        "{callbacks:?}"
    );
    assert_eq!(stream.paused(), [(1, Direction::Request)]);
    assert_eq!(
        stream.upstream().headers,
        None,
        "nothing reached the upstream"
    );
    // exchange() reports it as a hang
    let err = plain
        .exchange(0, 0, &demo_request(), |_| Response::status(200))
        .unwrap_err();
    assert!(
        err.contains("never reached the upstream completely"),
        "{err}"
    );

    // the Higress build: the body arrives, the router picks the deployment
    let spec = FilterSpec::higress("model-router", &router).unwrap();
    let higress = chain(spec);
    let ex = higress
        .exchange(0, 0, &demo_request(), |up| {
            let sent: Value = serde_json::from_slice(&up.body).unwrap();
            assert_eq!(sent["model"], "gpt-4o-mini");
            Response::json(&json!({"object": "chat.completion", "choices": []}))
        })
        .unwrap();
    assert_eq!(ex.status(), 200, "{}", higress.log_text());
    assert_eq!(ex.header("x-llm-deployment"), Some("openai-mini"));
}

/// Higress's AI-route fallback (`custom_response` redirect, a new stream through the whole
/// chain; `harness::redirect`) on the CRDs' chain: the provider answers 503, and the request
/// re-enters every plugin with the headers as the first pass left them, the original body and
/// `x-higress-fallback-from`. Higress's console policy alone does not carry key-auth's ticket:
/// key-auth refuses the second pass (401), because the Authorization it sees is the provider
/// credential model-router wrote in the first. `higress/route-envoyfilter.yaml`'s policy does
/// (the next test).
#[test]
fn a_fallback_redirect_re_enters_the_chain_as_a_new_stream() {
    let placed = placed();
    let (_redis, fleet) = crd_fleet(&placed);

    let policy = InternalRedirect::higress_fallback("ai-route-llm.internal")
        .header_from_filter_state("x-test-first-route", "wasm.llm_route");
    let request = demo_request();
    let mut answered = 0;
    let passes = fleet
        .exchange_with_redirect(0, 0, &request, &policy, |_| {
            answered += 1;
            Response::status(503).body(b"overloaded")
        })
        .unwrap();
    assert_eq!(
        passes.len(),
        2,
        "one redirect: the second pass never reached a provider"
    );
    assert_eq!(answered, 1);
    let (first, second) = (&passes[0], &passes[1]);

    // the first pass reached the provider; its 503 went to the redirect, not to the client
    assert_eq!(first.status(), 503);
    assert!(first.downstream.body.is_empty() && !first.downstream.end);
    let route = first.filter_state.get("wasm.llm_route").unwrap();

    // the second pass: the headers as the first pass's filters left them, no
    // content-length, the policy's headers; the original body; a new stream whose filter
    // state starts empty
    let header = |name: &str| {
        second
            .request_headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        header("x-higress-fallback-from").as_deref(),
        Some(b"ai-route-llm.internal".as_slice())
    );
    assert_eq!(header("x-test-first-route").as_ref(), Some(route));
    assert_eq!(
        header("x-llm-deployment").as_deref(),
        Some(b"openai-mini".as_slice())
    );
    assert_eq!(header("content-length"), None);
    assert_eq!(second.request_body, request.chunks.concat());
    assert!(!second.filter_state.contains_key("wasm.llm_route"));

    // ... where key-auth finds the provider credential instead of the virtual key
    assert_eq!(
        header("authorization").as_deref(),
        Some(b"Bearer sk-replace-me".as_slice())
    );
    assert_eq!(second.status(), 401);
    let reply = second.local_reply.as_ref().unwrap();
    assert_eq!(reply.details, "key_auth.invalid_api_key");
    assert!(second.upstream.is_none());
}

/// The fallback as `higress/route-envoyfilter.yaml` configures it, on the CRDs' chain in
/// Higress mode: the first deployment answers 429, custom_response re-runs the chain with
/// key-auth's ticket and the router's continuation, and the second pass reaches the second
/// deployment of the plan with its model and credential; the client gets that answer with its
/// address restored. The replaced pass finalises nothing: one usage record in the Redis
/// ledger, for the deployment that answered, with both attempts.
#[test]
fn the_fallback_redirect_reaches_the_next_deployment() {
    fallback_through_the_redirect(false);
}

/// The same with a stream: the second deployment's answer streams back, the address restored
/// across the events, the usage taken from the stream's usage chunk.
#[test]
fn a_streamed_fallback_redirect_reaches_the_next_deployment() {
    fallback_through_the_redirect(true);
}

fn fallback_through_the_redirect(stream: bool) {
    let placed = placed();
    let (redis, fleet) = crd_fleet(&placed);

    let policy = InternalRedirect::llm_gateway(2);
    let mut seen: Vec<(Value, Option<String>)> = Vec::new();
    let mut paths: Vec<Option<String>> = Vec::new();
    let passes = fleet
        .exchange_with_redirect(0, 0, &demo_chat(stream), &policy, |up| {
            let body: Value = serde_json::from_slice(&up.body).unwrap();
            // each provider's credential header: a Bearer token (OpenAI), `api-key` (Azure)
            let auth = up.headers.as_ref().and_then(|h| {
                h.iter()
                    .find(|(n, _)| n == "authorization" || n == "api-key")
                    .map(|(n, v)| format!("{n}: {}", String::from_utf8_lossy(v)))
            });
            paths.push(up.headers.as_ref().and_then(|h| {
                h.iter()
                    .find(|(n, _)| n == ":path")
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            }));
            seen.push((body, auth));
            if seen.len() == 1 {
                Response::status(429).body(b"slow down")
            } else if stream {
                let chunk = |delta: Value| {
                    format!(
                        "data: {}\n\n",
                        json!({"object": "chat.completion.chunk", "model": "gpt-4o-mini",
                               "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
                    )
                };
                let sse = [
                    chunk(json!({"role": "assistant", "content": "I wrote to [EMA"})),
                    chunk(json!({"content": "IL_1]."})),
                    format!(
                        "data: {}\n\ndata: [DONE]\n\n",
                        json!({"object": "chat.completion.chunk", "model": "gpt-4o-mini",
                               "choices": [],
                               "usage": {"prompt_tokens": 40, "completion_tokens": 8}})
                    ),
                ]
                .concat();
                let ends: Vec<usize> = (9..sse.len()).step_by(9).collect();
                Response::status(200)
                    .header("content-type", "text/event-stream")
                    .body(sse.as_bytes())
                    .split_at(&ends)
            } else {
                completion()
            }
        })
        .unwrap();
    let log = fleet.log_text();
    assert_eq!(passes.len(), 2, "{log}");
    let answer = &passes[1];
    assert_eq!(answer.status(), 200, "{}\n{log}", answer.text());
    assert_eq!(answer.header("x-llm-deployment"), Some("azure-mini"));
    assert_eq!(answer.header("x-llm-attempts"), Some("2"));
    let text = if stream {
        // the deltas, joined: the address spans two events upstream
        answer
            .text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter_map(|e| {
                e["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect::<String>()
    } else {
        answer.text()
    };
    assert!(text.contains("I wrote to alice@example.com."), "{text}");

    // each deployment: its own credential, the real model, a placeholder for the address
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0].1.as_deref(),
        Some("authorization: Bearer sk-replace-me")
    );
    // azure-mini is an Azure OpenAI deployment (higress/model-router.yaml): its `api-key`
    assert_eq!(seen[1].1.as_deref(), Some("api-key: azure-replace-me"));
    assert_eq!(paths[0].as_deref(), Some("/v1/chat/completions"));
    assert_eq!(
        paths[1].as_deref(),
        Some("/openai/deployments/gpt-4o-mini/chat/completions?api-version=2024-10-21")
    );
    for (body, _) in &seen {
        assert_eq!(body["model"], "gpt-4o-mini", "{body}");
        let text = body.to_string();
        assert!(
            !text.contains("alice@example.com") && text.contains("[EMAIL_1]"),
            "{text}"
        );
    }

    // no second pass past the plan: the ticket and the continuation went with the first
    let first = &passes[0];
    assert!(first.filter_state.contains_key("wasm.llm_route_next"));
    assert!(!answer.filter_state.contains_key("wasm.llm_route_next"));

    // one record, for the deployment that answered, in the ledger once
    let record: Value =
        serde_json::from_slice(answer.filter_state.get("wasm.llm_usage").unwrap()).unwrap();
    assert_eq!(record["deployment"], "azure-mini", "{record}");
    assert_eq!(
        record["attempts"].as_array().map(Vec::len),
        Some(2),
        "{record}"
    );
    assert!(
        !first.filter_state.contains_key("wasm.llm_usage"),
        "the replaced pass recorded"
    );
    fleet.pump().unwrap();
    let stream = placed
        .iter()
        .find_map(|(_, _, _, d)| d["ledger"]["stream"].as_str())
        .unwrap();
    assert_eq!(redis.command(&["XLEN", stream]).unwrap(), ":1\r\n", "{log}");

    // one settlement from that record: every budget charged exactly its usage (drift 0),
    // nothing left reserved by the replaced pass
    let books = Books::read(redis.addr()).unwrap();
    assert_eq!(
        books.reservations, 0,
        "reservations left behind: {:?}",
        books.budgets
    );
    let spent = |budget: &str| -> i64 {
        books
            .budgets
            .iter()
            .filter(|(key, _)| key.contains(&format!(":bud:{budget}:")))
            .map(|(_, spent)| *spent)
            .sum()
    };
    let tokens = record["usage"]["total_tokens"].as_i64().unwrap();
    assert_eq!(spent("consumer-day"), tokens, "{:?}", books.budgets);
    assert_eq!(
        spent("tenant-month"),
        record["cost_nano"].as_i64().unwrap(),
        "{:?}",
        books.budgets
    );
}

/// Higress keeps one Redis client per worker per cluster, shared by every plugin that names
/// it: two plugins initialising it with different credentials or databases reset each other's
/// connection (higress/README.md, "Redis"). The CRDs' Redis plugins name one cluster (its
/// database in the name, `?db=N`) with the same username and password.
#[test]
fn the_redis_plugins_share_one_cluster_with_the_same_credentials() {
    let placed = placed();
    let mut clients: Vec<(String, Value, Value)> = Vec::new();
    for (_, _, image, document) in &placed {
        for key in ["redis", "ledger"] {
            let redis = &document[key];
            if let Some(service) = redis["service"].as_str() {
                clients.push((
                    format!("{image}.{key}"),
                    json!(service),
                    json!([redis["username"], redis["password"]]),
                ));
            }
        }
    }
    assert_eq!(
        clients.len(),
        2,
        "token-ratelimit's redis and usage-accounting's ledger: {clients:?}"
    );
    let (first, rest) = clients.split_first().unwrap();
    for other in rest {
        assert_eq!(
            (&other.1, &other.2),
            (&first.1, &first.2),
            "{} vs {}",
            other.0,
            first.0
        );
    }
}
