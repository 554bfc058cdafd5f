//! A model group that mixes providers, with the redirect fallback (Higress 2.2.4, Envoy
//! 1.36): the whole chain — key-auth, model-router (listener role, `"fallback": "redirect"`),
//! pii-redaction, usage-accounting, token-ratelimit — compiled, with a real `redis-server`.
//!
//! Group `mixed` is `claude` (Anthropic) then `gpt` (OpenAI), `mixed-reverse` the other way
//! round, and the two deployments have different prices. An OpenAI Chat client of `mixed`
//! reaches Claude in Anthropic's API (translated by the router, `/v1/messages`, `x-api-key`),
//! gets a 429, and the redirect re-runs the chain: the second pass goes to `gpt` in OpenAI's
//! API (`/v1/chat/completions`, Bearer), and the client gets an OpenAI answer. An Anthropic
//! client of `mixed-reverse` the other way round (gpt 503, Claude answers). For each: one
//! usage record for the logical request (both attempts, the answering deployment's price, the
//! client's API and the provider's), the budgets in Redis charged exactly that record (drift
//! 0), nothing left reserved, and — many such requests interleaved on a fleet against budgets
//! that run out — no overshoot.
//!
//! The redirect is played as each host does it (`harness::redirect`): **upstream Envoy**
//! (`envoy-config/gateway-1.36.yaml`: custom_response innermost, so no plugin sees the failed
//! response; the new stream gets `GET` and the body the first pass's filters left — translated,
//! masked) and **Higress** (`higress/route-envoyfilter.yaml`: custom_response first, so every
//! plugin sees the failure; `use_original_request_uri` and `use_original_request_body`: the
//! client's original body, at the path Higress's redirect builds from the first pass's map).
//!
//! Every scenario runs over both Redis transports, as `harness ratelimit_fleet::` does: Higress's
//! Redis calls (the Higress builds in the harness's Higress mode) and HTTP to a real webdis
//! (the plain builds on the harness's Envoy host); the fleet runs must give the same figures
//! both ways. Every figure is printed (`--nocapture` to see them).

use llm_gateway_shared::price::{MicroPrice, Price};
use llm_gateway_shared::usage_record::Record;
use llm_gateway_tests::harness::http_call::loopback;
use llm_gateway_tests::harness::stream::{header_value, Headers};
use llm_gateway_tests::harness::traffic::Rng;
use llm_gateway_tests::harness::{
    FilterSpec, Fleet, Host, InternalRedirect, Response, Stream, Upstream,
};
use llm_gateway_tests::redis::Redis;
use llm_gateway_tests::webdis::{Webdis, AUTH};
use llm_gateway_tests::workspace::sha256_hex;
use serde_json::{json, Value};
use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::rc::Rc;
use token_ratelimit::budget::nano;
use token_ratelimit::config::parse_money;

const SERVICE: &str = "outbound|6379||redis.static";
const WEBDIS: &str = "webdis";
const VM_ID: &str = "token-ratelimit";
const CLIENT_KEY: &str = "sk-llmgw-translation-fleet-client";
const CLAUDE_KEY: &str = "sk-ant-provider-claude";
const GPT_KEY: &str = "sk-provider-gpt";
const PREAMBLE: &str =
    "Text in square brackets such as [EMAIL_1] stands for redacted data: repeat it exactly.";
const CLIENT_SYSTEM: &str = "You are terse.";
const EMAIL: &str = "bob@example.com";
/// What every answer says (the provider echoes the placeholder it was sent), split across two
/// events upstream.
const ANSWER: [&str; 2] = ["Sent to [EMA", "IL_1]."];
const RESTORED: &str = "Sent to bob@example.com.";
const DEFAULT_MAX_TOKENS: u64 = 1024;
const MARGIN_PERCENT: u8 = 10;

// ---------------------------------------------------------------------------------------
// The deployments

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dep {
    Claude,
    Gpt,
}

impl Dep {
    fn name(self) -> &'static str {
        match self {
            Dep::Claude => "claude",
            Dep::Gpt => "gpt",
        }
    }

    fn model(self) -> &'static str {
        match self {
            Dep::Claude => "claude-sonnet-4-5",
            Dep::Gpt => "gpt-4o-mini",
        }
    }

    /// Its price in the router's form (micro-units per 1M tokens).
    fn price(self) -> MicroPrice {
        let (input, output) = match self {
            Dep::Claude => (3_000_000, 15_000_000),
            Dep::Gpt => (150_000, 600_000),
        };
        MicroPrice {
            currency: "USD".into(),
            input,
            output,
            cached_input: None,
        }
    }

    /// The API it speaks, as the usage record names it.
    fn api(self) -> &'static str {
        match self {
            Dep::Claude => "messages",
            Dep::Gpt => "chat.completions",
        }
    }

    fn other(self) -> Dep {
        match self {
            Dep::Claude => Dep::Gpt,
            Dep::Gpt => Dep::Claude,
        }
    }

    /// Its refusal of the first attempt: Anthropic's 429, OpenAI's 503, each in its shape.
    fn failure(self) -> Response {
        match self {
            Dep::Claude => Response::status(429)
                .header("content-type", "application/json")
                .body(
                    br#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#,
                ),
            Dep::Gpt => Response::status(503)
                .header("content-type", "application/json")
                .body(br#"{"error":{"message":"overloaded","type":"server_error","param":null,"code":null}}"#),
        }
    }

    fn failure_status(self) -> u16 {
        match self {
            Dep::Claude => 429,
            Dep::Gpt => 503,
        }
    }
}

/// The element-wise maximum of the two prices: what a money budget reserves at.
fn ceiling() -> MicroPrice {
    let (c, g) = (Dep::Claude.price(), Dep::Gpt.price());
    MicroPrice {
        currency: "USD".into(),
        input: c.input.max(g.input),
        output: c.output.max(g.output),
        cached_input: None,
    }
}

/// What usage-accounting charges: micro-units per 1M tokens → nano-units, rounded up once.
fn price_of(price: &MicroPrice, prompt: u64, completion: u64) -> u64 {
    let micro = u128::from(prompt) * u128::from(price.input)
        + u128::from(completion) * u128::from(price.output);
    u64::try_from(micro.div_ceil(1000)).unwrap()
}

fn router_config() -> Value {
    let deployment = |d: Dep, cluster: &str, provider: &str, credential: &str| {
        let p = d.price();
        json!({"name": d.name(), "cluster": cluster, "model": d.model(), "provider": provider,
               "credential": credential, "price": {"input": p.input, "output": p.output},
               "price_version": "tf-1"})
    };
    json!({
        "version": "tf-1",
        "fallback": "redirect",
        "deployments": [
            deployment(Dep::Claude, "anthropic", "anthropic", CLAUDE_KEY),
            deployment(Dep::Gpt, "openai", "openai", GPT_KEY)
        ],
        "groups": [
            {"name": "mixed", "deployments": [{"deployment": "claude"}, {"deployment": "gpt"}]},
            {"name": "mixed-reverse", "deployments": [{"deployment": "gpt"}, {"deployment": "claude"}]}
        ],
        // the fleet's first attempts fail often on purpose: no breaker may take a deployment
        // out of the plans (each request must follow its group's order)
        "breaker": {"consecutive_failures": 0, "failure_rate_percent": 0}
    })
}

// ---------------------------------------------------------------------------------------
// The gateway: the chain over a transport

/// How token-ratelimit reaches Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// Higress's Redis calls (the Higress builds, the harness's Higress mode).
    Higress,
    /// `dispatch_http_call` to a real webdis (the plain builds, the harness's Envoy host).
    Http,
}

/// How the host's redirect re-runs the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavour {
    /// Upstream Envoy 1.36 (`gateway-1.36.yaml`): custom_response innermost, the first pass's
    /// edited body re-sent, the method turned into `GET`.
    UpstreamEnvoy,
    /// Higress 2.2.4 (`route-envoyfilter.yaml`): custom_response first in the chain,
    /// `use_original_request_uri`, `use_original_request_body`.
    Higress,
}

impl Flavour {
    fn policy(self) -> InternalRedirect {
        let policy = InternalRedirect::llm_gateway(2);
        match self {
            Flavour::UpstreamEnvoy => policy,
            Flavour::Higress => policy.with_original_request_uri(),
        }
    }
}

struct Limits {
    money_nano: u64,
    tokens: u64,
}

fn ratelimit_config(transport: Transport, limits: &Limits) -> Value {
    let redis = match transport {
        Transport::Higress => json!({"service": SERVICE, "timeout_ms": 200}),
        Transport::Http => {
            json!({"transport": "http", "cluster": WEBDIS, "auth": AUTH, "timeout_ms": 200})
        }
    };
    json!({
        "redis": redis,
        "clock": "gateway",
        "default_max_tokens": DEFAULT_MAX_TOKENS,
        "budgets": [
            {"name": "tenant-money", "by": "tenant", "period": "day",
             "money": token_ratelimit::decide::decimal(limits.money_nano), "currency": "USD",
             "on_redis_failure": "reject"},
            {"name": "tenant-tokens", "by": "tenant", "period": "day", "tokens": limits.tokens,
             "on_redis_failure": "reject"}
        ]
    })
}

struct Gateway {
    fleet: Fleet,
    transport: Transport,
    flavour: Flavour,
    policy: InternalRedirect,
    http_calls: Rc<Cell<u64>>,
    _webdis: Option<Webdis>,
}

impl std::ops::Deref for Gateway {
    type Target = Fleet;
    fn deref(&self) -> &Fleet {
        &self.fleet
    }
}

impl Gateway {
    fn start(
        transport: Transport,
        flavour: Flavour,
        limits: &Limits,
        redis: &Redis,
        (instances, workers): (usize, usize),
    ) -> Gateway {
        let keys = json!({"keys": [{"key_sha256": sha256_hex(CLIENT_KEY.as_bytes()),
            "consumer": "alice", "tenant": "acme", "id": "alice",
            "groups": ["mixed", "mixed-reverse"]}]});
        let pii = json!({"rules": [{"detector": "email"}], "preamble": PREAMBLE});
        let usage = json!({"log_records": true});
        let limiter = ratelimit_config(transport, limits);
        let http_calls = Rc::new(Cell::new(0u64));
        let (fleet, webdis) = match transport {
            Transport::Higress => {
                let fleet = Fleet::builder()
                    .host(Host::Higress)
                    .filter(FilterSpec::higress("key-auth", &keys).unwrap())
                    .filter(FilterSpec::higress("model-router", &router_config()).unwrap())
                    .filter(FilterSpec::higress("pii-redaction", &pii).unwrap())
                    .filter(FilterSpec::higress("usage-accounting", &usage).unwrap())
                    .filter(FilterSpec::higress("token-ratelimit", &limiter).unwrap())
                    .redis(SERVICE, redis.addr())
                    .instances(instances)
                    .workers(workers)
                    .build()
                    .unwrap();
                (fleet, None)
            }
            Transport::Http => {
                let webdis = Webdis::start(redis.addr()).unwrap();
                let mut forward = loopback(webdis.addr());
                let counter = http_calls.clone();
                let held = |name: &str, config: &Value| {
                    FilterSpec::plugin(name, config)
                        .unwrap()
                        .allow_on_headers_stop_iteration(true)
                };
                let fleet = Fleet::builder()
                    .filter(FilterSpec::plugin("key-auth", &keys).unwrap())
                    .filter(held("model-router", &router_config()))
                    .filter(held("pii-redaction", &pii))
                    .filter(held("usage-accounting", &usage))
                    .filter(held("token-ratelimit", &limiter))
                    .http_cluster(WEBDIS, move |request| {
                        counter.set(counter.get() + 1);
                        forward(request)
                    })
                    .instances(instances)
                    .workers(workers)
                    .build()
                    .unwrap();
                (fleet, Some(webdis))
            }
        };
        fleet
            .clock()
            .set_nanos(llm_gateway_tests::harness::redis_suite_start_nanos());
        Gateway {
            fleet,
            transport,
            flavour,
            policy: flavour.policy(),
            http_calls,
            _webdis: webdis,
        }
    }

    /// Carries out the waiting work; over HTTP also the tick that sends the settlements
    /// waiting in the outboxes (what the next tick does on Envoy).
    fn pump_and_flush(&self) {
        self.fleet.pump().unwrap();
        if self.transport == Transport::Http {
            self.fleet.tick().unwrap();
            self.fleet.pump().unwrap();
        }
    }

    /// Redis commands sent so far (Redis calls, or HTTP calls to webdis).
    fn redis_calls(&self) -> u64 {
        match self.transport {
            Transport::Higress => self.fleet.redis().calls(),
            Transport::Http => self.http_calls.get(),
        }
    }

    /// The first pass of `req` on its worker: headers and body sent (not pumped).
    fn open(&self, req: &Req) -> Stream {
        let stream = self.fleet.stream(req.instance, req.worker).unwrap();
        stream
            .send_request_headers_raw(req.headers(), false)
            .unwrap();
        stream.send_request_body(&req.body(), true).unwrap();
        stream
    }

    /// The first pass's deployment fails (`failing`) and the host's redirect re-runs the
    /// chain: the first stream ends as superseded, the second starts on the same worker with
    /// what this host gives it (not pumped). Returns the second pass.
    fn fail_and_redirect(&self, req: &Req, first: &Stream, failing: Dep) -> Stream {
        let response = failing.failure();
        let status = match self.flavour {
            Flavour::UpstreamEnvoy => failing.failure_status(),
            Flavour::Higress => {
                // custom_response is first in the chain: it decides once every plugin let the
                // response headers through (the router holds a JSON answer it translates
                // until its end)
                first
                    .send_response_headers_raw(response.headers.clone(), false)
                    .unwrap();
                first.send_response_body(&response.chunks[0], true).unwrap();
                let down = first.downstream();
                let headers = down.headers.expect("the failure reached custom_response");
                header_value(&headers, ":status").unwrap().parse().unwrap()
            }
        };
        assert_eq!(
            status,
            failing.failure_status(),
            "the status the policy sees"
        );
        let state = |key: &str| first.filter_state(key);
        assert!(
            self.policy.fires(status, state),
            "the redirect fires while the plan has a later deployment\n{}",
            self.fleet.log_text()
        );
        let edited = first.request_headers().unwrap();
        let mut headers = self.policy.next_headers(&edited, state);
        let body = match self.flavour {
            Flavour::UpstreamEnvoy => {
                for (name, value) in headers.iter_mut() {
                    if name == ":method" {
                        *value = b"GET".to_vec();
                    }
                }
                first.upstream().body
            }
            Flavour::Higress => req.body(),
        };
        first.set_property("response.code_details", "internal_redirect");
        first.finish().unwrap();
        let second = self.fleet.stream(req.instance, req.worker).unwrap();
        second.send_request_headers_raw(headers, false).unwrap();
        second.send_request_body(&body, true).unwrap();
        second
    }
}

// ---------------------------------------------------------------------------------------
// Requests

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClientApi {
    /// OpenAI Chat Completions, group `mixed` (claude, then gpt).
    Chat,
    /// Anthropic Messages, group `mixed-reverse` (gpt, then claude).
    Messages,
}

impl ClientApi {
    fn first(self) -> Dep {
        match self {
            ClientApi::Chat => Dep::Claude,
            ClientApi::Messages => Dep::Gpt,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ClientApi::Chat => "chat.completions",
            ClientApi::Messages => "messages",
        }
    }
}

/// One logical request: what the client sends, what the providers answer.
#[derive(Debug, Clone)]
struct Req {
    id: String,
    api: ClientApi,
    stream: bool,
    /// Chat only: `stream_options.include_usage`.
    include_usage: bool,
    /// The first deployment fails (429 / 503) and the second answers.
    fallback: bool,
    /// Filler characters after the prompt's sentence.
    filler: usize,
    max_tokens: u64,
    /// What the answering provider reports.
    prompt_tokens: u64,
    completion_tokens: u64,
    instance: usize,
    worker: usize,
}

impl Req {
    fn answering(&self) -> Dep {
        if self.fallback {
            self.api.first().other()
        } else {
            self.api.first()
        }
    }

    fn prompt_text(&self) -> String {
        format!(
            "Write to {EMAIL} please. {}",
            "lorem ".repeat(self.filler / 6)
        )
    }

    fn body_json(&self) -> Value {
        match self.api {
            ClientApi::Chat => {
                let mut body = json!({
                    "model": "mixed",
                    "max_completion_tokens": self.max_tokens,
                    "messages": [
                        {"role": "system", "content": CLIENT_SYSTEM},
                        {"role": "user", "content": self.prompt_text()}
                    ]
                });
                if self.stream {
                    body["stream"] = json!(true);
                    if self.include_usage {
                        body["stream_options"] = json!({"include_usage": true});
                    }
                }
                body
            }
            ClientApi::Messages => {
                let mut body = json!({
                    "model": "mixed-reverse",
                    "max_tokens": self.max_tokens,
                    "system": CLIENT_SYSTEM,
                    "messages": [{"role": "user", "content": [
                        {"type": "text", "text": self.prompt_text()}
                    ]}]
                });
                if self.stream {
                    body["stream"] = json!(true);
                }
                body
            }
        }
    }

    fn body(&self) -> Vec<u8> {
        self.body_json().to_string().into_bytes()
    }

    fn path(&self) -> &'static str {
        match self.api {
            ClientApi::Chat => "/v1/chat/completions",
            ClientApi::Messages => "/v1/messages",
        }
    }

    /// The client's request headers, its key where its SDK puts it.
    fn headers(&self) -> Headers {
        let len = self.body().len().to_string();
        let bearer = format!("Bearer {CLIENT_KEY}");
        let mut pairs: Vec<(&str, &str)> = vec![
            (":method", "POST"),
            (":path", self.path()),
            (":authority", "gateway.test"),
            (":scheme", "http"),
            ("content-type", "application/json"),
            ("content-length", len.as_str()),
            ("x-request-id", self.id.as_str()),
        ];
        match self.api {
            ClientApi::Chat => pairs.push(("authorization", bearer.as_str())),
            ClientApi::Messages => {
                pairs.push(("x-api-key", CLIENT_KEY));
                pairs.push(("anthropic-version", "2023-06-01"));
            }
        }
        llm_gateway_tests::harness::stream::headers_from(&pairs)
    }

    /// A rough figure of what it reserves (its own body, at the price ceiling): for sizing the
    /// budgets only.
    fn rough_reservation(&self) -> (u64, u64) {
        let cost = token_ratelimit::cost::inspect(
            self.path(),
            &self.body(),
            DEFAULT_MAX_TOKENS,
            MARGIN_PERCENT,
            8192,
        )
        .unwrap();
        let price = Price::from(ceiling());
        (
            nano(cost.prompt, price.input) + nano(cost.output_cap, price.output),
            cost.tokens(),
        )
    }

    /// What the answering deployment's usage costs.
    fn actual(&self) -> (u64, u64) {
        (
            price_of(
                &self.answering().price(),
                self.prompt_tokens,
                self.completion_tokens,
            ),
            self.prompt_tokens + self.completion_tokens,
        )
    }
}

// ---------------------------------------------------------------------------------------
// The providers

fn header<'a>(up: &'a Upstream, name: &str) -> Option<&'a str> {
    header_value(up.headers.as_ref()?, name)
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

/// What reached deployment `dep` on a pass of `req`: its API at its path, its credential and
/// no other, the real model, the client's cap, the client's system prompt and pii-redaction's
/// preamble each once, the address masked. Returns the body.
fn assert_provider_request(up: &Upstream, dep: Dep, req: &Req, log: impl Fn() -> String) -> Value {
    assert!(
        up.end,
        "the request reached {} whole\n{}",
        dep.name(),
        log()
    );
    let body: Value = serde_json::from_slice(&up.body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&up.body)));
    let text = body.to_string();
    let what = format!("{} of {:?} got {text}", dep.name(), req.api);
    assert_eq!(header(up, ":method"), Some("POST"), "{what}");
    assert_eq!(body["model"], dep.model(), "{what}");
    assert_eq!(count(&text, EMAIL), 0, "{what}");
    assert!(text.contains("[EMAIL_1]"), "{what}");
    assert_eq!(
        count(&text, CLIENT_SYSTEM),
        1,
        "the client's system prompt once: {what}"
    );
    assert_eq!(count(&text, PREAMBLE), 1, "the preamble once: {what}");
    assert_eq!(
        body["stream"].as_bool().unwrap_or(false),
        req.stream,
        "{what}"
    );
    let roles: Vec<&str> = body["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("messages: {what}"))
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    match dep {
        Dep::Claude => {
            assert_eq!(header(up, ":path"), Some("/v1/messages"), "{what}");
            assert_eq!(header(up, "x-api-key"), Some(CLAUDE_KEY), "{what}");
            assert_eq!(header(up, "authorization"), None, "{what}");
            assert!(header(up, "anthropic-version").is_some(), "{what}");
            assert_eq!(body["max_tokens"], req.max_tokens, "{what}");
            for openai_only in ["stream_options", "max_completion_tokens", "n", "user"] {
                assert!(body.get(openai_only).is_none(), "{openai_only}: {what}");
            }
            assert!(
                roles.iter().all(|r| *r == "user" || *r == "assistant"),
                "{what}"
            );
            let system = body["system"].to_string();
            assert!(
                system.contains(CLIENT_SYSTEM) && system.contains(PREAMBLE),
                "{what}"
            );
        }
        Dep::Gpt => {
            assert_eq!(header(up, ":path"), Some("/v1/chat/completions"), "{what}");
            let bearer = format!("Bearer {GPT_KEY}");
            assert_eq!(header(up, "authorization"), Some(bearer.as_str()), "{what}");
            assert_eq!(header(up, "x-api-key"), None, "{what}");
            assert_eq!(header(up, "anthropic-version"), None, "{what}");
            assert!(body.get("system").is_none(), "{what}");
            assert_eq!(body["max_completion_tokens"], req.max_tokens, "{what}");
            assert!(
                roles
                    .iter()
                    .all(|r| matches!(*r, "system" | "developer" | "user" | "assistant")),
                "{what}"
            );
            assert_eq!(roles.last(), Some(&"user"), "{what}");
            if req.stream {
                // usage-accounting makes every stream carry usage
                assert_eq!(body["stream_options"]["include_usage"], true, "{what}");
            }
        }
    }
    body
}

/// What `dep` answers (200), in its API, streamed or not as it was asked.
fn answer(dep: Dep, req: &Req, sent: &Value) -> Response {
    let (p, c) = (req.prompt_tokens, req.completion_tokens);
    match (dep, req.stream) {
        (Dep::Gpt, false) => Response::json(&json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": dep.model(),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER.concat()},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
        })),
        (Dep::Claude, false) => Response::json(&json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": dep.model(),
            "content": [{"type": "text", "text": ANSWER.concat()}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": p, "output_tokens": c}
        })),
        (Dep::Gpt, true) => {
            let chunk = |delta: Value, finish: Value| {
                format!(
                    "data: {}\n\n",
                    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                           "model": dep.model(),
                           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
                )
            };
            let mut events = vec![
                chunk(json!({"role": "assistant", "content": ""}), Value::Null),
                chunk(json!({"content": ANSWER[0]}), Value::Null),
                chunk(json!({"content": ANSWER[1]}), Value::Null),
                chunk(json!({}), json!("stop")),
            ];
            // OpenAI sends the usage chunk only to a request that asks for it
            if sent["stream_options"]["include_usage"] == true {
                events.push(format!(
                    "data: {}\n\n",
                    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                           "model": dep.model(), "choices": [],
                           "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}})
                ));
            }
            events.push("data: [DONE]\n\n".into());
            sse(events)
        }
        (Dep::Claude, true) => {
            let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
            let delta = |text: &str| {
                event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "text_delta", "text": text}}),
                )
            };
            sse(vec![
                event(
                    "message_start",
                    json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                        "role": "assistant", "model": dep.model(), "content": [],
                        "stop_reason": null, "stop_sequence": null,
                        "usage": {"input_tokens": p, "output_tokens": 1}}}),
                ),
                event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": 0,
                           "content_block": {"type": "text", "text": ""}}),
                ),
                event("ping", json!({"type": "ping"})),
                delta(ANSWER[0]),
                delta(ANSWER[1]),
                event(
                    "content_block_stop",
                    json!({"type": "content_block_stop", "index": 0}),
                ),
                event(
                    "message_delta",
                    json!({"type": "message_delta",
                           "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                           "usage": {"output_tokens": c}}),
                ),
                event("message_stop", json!({"type": "message_stop"})),
            ])
        }
    }
}

/// An event stream, one event per body chunk.
fn sse(events: Vec<String>) -> Response {
    Response {
        headers: vec![
            (":status".into(), b"200".to_vec()),
            ("content-type".into(), b"text/event-stream".to_vec()),
        ],
        chunks: events.into_iter().map(String::into_bytes).collect(),
    }
}

// ---------------------------------------------------------------------------------------
// The client

/// The `data:` payloads of an event stream, with their `event:` names (if any).
fn events(body: &[u8]) -> Vec<(Option<String>, String)> {
    let text = String::from_utf8_lossy(body);
    let mut out = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let mut name = None;
        let mut data = String::new();
        for line in block.lines() {
            if let Some(n) = line.strip_prefix("event:") {
                name = Some(n.trim().to_string());
            } else if let Some(d) = line.strip_prefix("data:") {
                data.push_str(d.trim_start());
            }
        }
        out.push((name, data));
    }
    out
}

/// What the client got is an answer in its own API: the text restored, the usage where that
/// API carries it (a Chat stream's usage chunk only if the client asked for it).
fn assert_client_answer(status: u16, body: &[u8], req: &Req, log: impl Fn() -> String) {
    let shown = String::from_utf8_lossy(body).into_owned();
    assert_eq!(status, 200, "{shown}\n{}", log());
    assert!(!shown.contains("[EMAIL_"), "{shown}");
    let (p, c) = (req.prompt_tokens, req.completion_tokens);
    match (req.api, req.stream) {
        (ClientApi::Chat, false) => {
            let answer: Value = serde_json::from_slice(body).unwrap();
            assert_eq!(answer["object"], "chat.completion", "{shown}");
            assert_eq!(
                answer["choices"][0]["message"]["content"], RESTORED,
                "{shown}"
            );
            assert_eq!(answer["usage"]["prompt_tokens"], p, "{shown}");
            assert_eq!(answer["usage"]["completion_tokens"], c, "{shown}");
        }
        (ClientApi::Messages, false) => {
            let answer: Value = serde_json::from_slice(body).unwrap();
            assert_eq!(answer["type"], "message", "{shown}");
            assert_eq!(answer["content"][0]["text"], RESTORED, "{shown}");
            assert_eq!(answer["usage"]["input_tokens"], p, "{shown}");
            assert_eq!(answer["usage"]["output_tokens"], c, "{shown}");
        }
        (ClientApi::Chat, true) => {
            let events = events(body);
            assert_eq!(
                events.last().map(|(_, d)| d.as_str()),
                Some("[DONE]"),
                "{shown}"
            );
            let chunks: Vec<Value> = events[..events.len() - 1]
                .iter()
                .map(|(name, data)| {
                    assert_eq!(name, &None, "{shown}");
                    serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {shown}"))
                })
                .collect();
            assert!(
                chunks
                    .iter()
                    .all(|c| c["object"] == "chat.completion.chunk"),
                "{shown}"
            );
            let text: String = chunks
                .iter()
                .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
                .collect();
            assert_eq!(text, RESTORED, "{shown}");
            let usage: Vec<&Value> = chunks
                .iter()
                .filter(|c| c["usage"].is_object())
                .map(|c| &c["usage"])
                .collect();
            if req.include_usage {
                assert_eq!(usage.len(), 1, "one usage chunk: {shown}");
                assert_eq!(usage[0]["prompt_tokens"], p, "{shown}");
                assert_eq!(usage[0]["completion_tokens"], c, "{shown}");
            } else {
                assert!(usage.is_empty(), "no usage asked for: {shown}");
            }
        }
        (ClientApi::Messages, true) => {
            let events = events(body);
            let names: Vec<&str> = events
                .iter()
                .map(|(n, _)| n.as_deref().unwrap_or(""))
                .collect();
            assert_eq!(names.first(), Some(&"message_start"), "{shown}");
            assert_eq!(names.last(), Some(&"message_stop"), "{shown}");
            let data: Vec<Value> = events
                .iter()
                .map(|(_, d)| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {shown}")))
                .collect();
            for ((name, _), value) in events.iter().zip(&data) {
                assert_eq!(value["type"].as_str(), name.as_deref(), "{shown}");
            }
            let text: String = data
                .iter()
                .filter(|d| d["type"] == "content_block_delta")
                .filter_map(|d| d["delta"]["text"].as_str())
                .collect();
            assert_eq!(text, RESTORED, "{shown}");
            let delta = data
                .iter()
                .find(|d| d["type"] == "message_delta")
                .unwrap_or_else(|| panic!("a message_delta: {shown}"));
            assert_eq!(delta["usage"]["output_tokens"], c, "{shown}");
            // message_delta's counts are cumulative (they replace message_start's): a stream
            // translated from OpenAI's learns the prompt's only from its final usage chunk
            let input = match &delta["usage"]["input_tokens"] {
                Value::Null => &data[0]["message"]["usage"]["input_tokens"],
                input => input,
            };
            assert_eq!(*input, p, "{shown}");
        }
    }
}

/// The record of a logical request: one, naming both attempts when it fell back, priced at the
/// deployment that answered, with the client's API and the provider's.
fn assert_record(record: &Record, req: &Req) {
    let answering = req.answering();
    let what = format!("{record:?}");
    assert_eq!(record.status, 200, "{what}");
    assert!(record.complete, "{what}");
    assert_eq!(
        record.deployment.as_deref(),
        Some(answering.name()),
        "{what}"
    );
    assert_eq!(
        record.model_group.as_deref(),
        Some(match req.api {
            ClientApi::Chat => "mixed",
            ClientApi::Messages => "mixed-reverse",
        }),
        "{what}"
    );
    assert_eq!(record.api, req.api.name(), "{what}");
    assert_eq!(
        record.provider_api.as_deref(),
        Some(answering.api()),
        "{what}"
    );
    assert_eq!(record.tenant.as_deref(), Some("acme"), "{what}");
    let attempts: Vec<Option<&str>> = record
        .attempts
        .iter()
        .map(|a| a.deployment.as_deref())
        .collect();
    if req.fallback {
        assert_eq!(
            attempts,
            [Some(req.api.first().name()), Some(answering.name())],
            "{what}"
        );
        assert_eq!(record.attempts[1].status, 200, "{what}");
    } else {
        assert_eq!(attempts, [Some(answering.name())], "{what}");
    }
    assert_eq!(record.usage.prompt_tokens, req.prompt_tokens, "{what}");
    assert_eq!(
        record.usage.completion_tokens, req.completion_tokens,
        "{what}"
    );
    let (money, tokens) = req.actual();
    assert_eq!(record.usage.total_tokens, tokens, "{what}");
    assert_eq!(record.cost_nano, Some(money), "{what}");
    assert_eq!(record.currency.as_deref(), Some("USD"), "{what}");
}

/// A local reply, readable.
fn shown_reply(stream: &Stream) -> String {
    stream.local_reply().map_or_else(String::new, |r| {
        format!(
            "local reply {} {}: {}",
            r.status,
            r.details,
            String::from_utf8_lossy(&r.body)
        )
    })
}

fn record_of(stream: &Stream) -> Record {
    let bytes = stream
        .filter_state("wasm.llm_usage")
        .expect("usage-accounting published no record");
    Record::from_json(&bytes).expect("a usage record")
}

/// The records usage-accounting logged (`log_records`), in order.
fn logged_records(fleet: &Fleet) -> Vec<Record> {
    fleet
        .log_text()
        .lines()
        .filter_map(|l| l.split_once("usage_record: "))
        .map(|(_, json)| Record::from_json(json.as_bytes()).expect("a logged record"))
        .collect()
}

// ---------------------------------------------------------------------------------------
// Redis

/// The UTC day (`YYYY-MM-DD`, as budget keys spell it) of the harness clock's start.
fn start_day() -> String {
    let ms = llm_gateway_tests::harness::redis_suite_start_nanos() / 1_000_000;
    token_ratelimit::budget::period(token_ratelimit::config::Period::Day, ms).0
}

fn money_key() -> String {
    format!(
        "llm:{{t:acme}}:bud:tenant-money:tenant:acme:{}",
        start_day()
    )
}

fn tokens_key() -> String {
    format!(
        "llm:{{t:acme}}:bud:tenant-tokens:tenant:acme:{}",
        start_day()
    )
}

fn redis_int(redis: &Redis, key: &str) -> i64 {
    let reply = redis.command(&["GET", key]).unwrap();
    if reply.starts_with("$-1") {
        return 0;
    }
    reply.lines().nth(1).unwrap().parse().unwrap()
}

/// Reservations not reconciled (tombstones of cancelled ones, `n` = 0, do not count).
fn reservations_left(redis: &Redis) -> usize {
    let keys = redis.command(&["KEYS", "llm:*:res:*"]).unwrap();
    keys.lines()
        .filter(|l| l.starts_with("llm:"))
        .filter(|key| redis.command(&["HGET", key, "n"]).unwrap() != "$1\r\n0\r\n")
        .count()
}

fn journal_depth(fleet: &Fleet) -> usize {
    (0..fleet.instances())
        .map(|i| {
            fleet
                .services(i)
                .shared_data
                .get(VM_ID, "trl:journal")
                .map_or(0, |(v, _)| {
                    token_ratelimit::budget::Journal::decode(&v).entries.len()
                })
        })
        .sum()
}

// ---------------------------------------------------------------------------------------
// One logical request at a time

/// The scenario of one request with the first deployment failing, on one transport and one
/// host flavour; every step pumped.
fn one_fallback(transport: Transport, flavour: Flavour, req: &Req) {
    let label = format!(
        "{transport:?}/{flavour:?}/{:?} stream={} usage={}",
        req.api, req.stream, req.include_usage
    );
    let redis = Redis::start().unwrap();
    let limits = Limits {
        money_nano: 1_000_000_000,
        tokens: 1_000_000,
    };
    let gw = Gateway::start(transport, flavour, &limits, &redis, (1, 1));
    let log = || format!("[{label}]\n{}", gw.log_text());
    let calls = gw.redis_calls();

    let first = gw.open(req);
    gw.pump_and_flush();
    assert!(
        first.local_reply().is_none(),
        "{}\n{}",
        shown_reply(&first),
        log()
    );
    let failing = req.api.first();
    assert_provider_request(&first.upstream(), failing, req, log);
    assert!(
        first.filter_state("wasm.llm_route_next").is_some(),
        "{}",
        log()
    );

    let second = gw.fail_and_redirect(req, &first, failing);
    gw.pump_and_flush();
    assert!(
        logged_records(&gw).is_empty(),
        "a superseded pass records nothing [{label}]"
    );
    let answering = failing.other();
    assert!(
        second.local_reply().is_none(),
        "{}\n{}",
        shown_reply(&second),
        log()
    );
    let sent = assert_provider_request(&second.upstream(), answering, req, log);
    assert!(
        second.filter_state("wasm.llm_route_next").is_none(),
        "the plan ends here"
    );

    let response = answer(answering, req, &sent);
    let last = response.chunks.len() - 1;
    second
        .send_response_headers_raw(response.headers, false)
        .unwrap();
    for (i, chunk) in response.chunks.iter().enumerate() {
        second.send_response_body(chunk, i == last).unwrap();
    }
    let down = second.downstream();
    assert!(down.end, "the answer reached the client\n{}", log());
    let status: u16 = header_value(down.headers.as_ref().unwrap(), ":status")
        .unwrap()
        .parse()
        .unwrap();
    assert_client_answer(status, &down.body, req, log);
    let response_header =
        |name: &str| header_value(down.headers.as_ref().unwrap(), name).map(str::to_owned);
    assert_eq!(
        response_header("x-llm-deployment").as_deref(),
        Some(answering.name())
    );
    assert_eq!(response_header("x-llm-attempts").as_deref(), Some("2"));
    second.finish().unwrap();
    gw.pump_and_flush();

    // one record, for the logical request
    let record = record_of(&second);
    assert_record(&record, req);
    let logged = logged_records(&gw);
    assert_eq!(logged.len(), 1, "[{label}] {logged:?}");
    assert_eq!(logged[0].request_id, record.request_id);

    // one admission, settled once from the record
    let metric = |name: &str| gw.metric_sum(&format!("llm_gateway.ratelimit.{name}"));
    assert_eq!(metric("admitted"), 1, "{}", log());
    assert_eq!(metric("reentry_adopted"), 1, "{}", log());
    assert_eq!(metric("reentry_lost"), 0, "{}", log());
    let (money, tokens) = req.actual();
    let spent = (
        redis_int(&redis, &money_key()),
        redis_int(&redis, &tokens_key()),
    );
    assert_eq!(
        spent,
        (money as i64, tokens as i64),
        "drift [{label}]\n{}",
        log()
    );
    assert_eq!(reservations_left(&redis), 0, "[{label}]");
    assert_eq!(journal_depth(&gw), 0, "[{label}]");
    assert!(!gw.log_text().contains(EMAIL), "no PII logged [{label}]");
    eprintln!(
        "translation-fleet one[{label}]: {} -> {} ({} {}), record {} nano / {} tokens, Redis spent {} nano / {} tokens (drift 0), {} Redis calls",
        failing.name(),
        answering.name(),
        record.api,
        record.provider_api.as_deref().unwrap_or("-"),
        money,
        tokens,
        spent.0,
        spent.1,
        gw.redis_calls() - calls,
    );
}

fn single(api: ClientApi, stream: bool, include_usage: bool) -> Req {
    Req {
        id: format!("one-{api:?}-{stream}-{include_usage}"),
        api,
        stream,
        include_usage,
        fallback: true,
        filler: 120,
        max_tokens: 300,
        prompt_tokens: 57,
        completion_tokens: 9,
        instance: 0,
        worker: 0,
    }
}

fn both_ways(req: &Req) {
    for transport in [Transport::Higress, Transport::Http] {
        for flavour in [Flavour::UpstreamEnvoy, Flavour::Higress] {
            one_fallback(transport, flavour, req);
        }
    }
}

#[test]
fn chat_client_streaming_with_usage_falls_back_from_claude_to_gpt() {
    both_ways(&single(ClientApi::Chat, true, true));
}

#[test]
fn chat_client_streaming_without_usage_gets_no_usage_chunk() {
    both_ways(&single(ClientApi::Chat, true, false));
}

#[test]
fn chat_client_json_falls_back_from_claude_to_gpt() {
    both_ways(&single(ClientApi::Chat, false, false));
}

#[test]
fn messages_client_streaming_falls_back_from_gpt_to_claude() {
    both_ways(&single(ClientApi::Messages, true, false));
}

#[test]
fn messages_client_json_falls_back_from_gpt_to_claude() {
    both_ways(&single(ClientApi::Messages, false, false));
}

// ---------------------------------------------------------------------------------------
// A fleet against budgets that run out

const INSTANCES: usize = 2;
const WORKERS: usize = 2;

impl Req {
    fn random(rng: &mut Rng, id: String) -> Req {
        let api = if rng.chance(50) {
            ClientApi::Chat
        } else {
            ClientApi::Messages
        };
        let stream = rng.chance(70);
        let filler = rng.range(40, 3000) as usize;
        let max_tokens = rng.range(16, DEFAULT_MAX_TOKENS);
        let completion_tokens = if rng.chance(20) {
            max_tokens
        } else {
            rng.range(1, max_tokens)
        };
        Req {
            id,
            api,
            stream,
            include_usage: stream && api == ClientApi::Chat && rng.chance(50),
            fallback: rng.chance(40),
            filler,
            max_tokens,
            prompt_tokens: filler as u64 / 4 + rng.range(20, 60),
            completion_tokens,
            instance: rng.index(INSTANCES),
            worker: rng.index(WORKERS),
        }
    }
}

/// Which budget runs out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Binding {
    Money,
    Tokens,
}

/// A logical request in flight.
struct Live {
    req: usize,
    stream: Stream,
    /// The pass under way (1, or 2 after the redirect).
    pass: u8,
    admitted: bool,
    /// The answering pass's response, and how much of it was sent (0: nothing yet).
    response: Option<Response>,
    sent: usize,
    /// The second pass started in this batch: its request is checked after the pump.
    check_second: bool,
}

enum Op {
    Reserve { req: usize },
    Settle { req: usize },
}

#[derive(Debug, Default)]
struct Run {
    requests: usize,
    admitted: usize,
    refused: usize,
    fallbacks: usize,
    /// Answers translated for the client (the answering deployment speaks another API).
    translated: usize,
    records: usize,
    money_budget: u64,
    tokens_budget: u64,
    money_spent: i64,
    tokens_spent: i64,
    money_actual: u64,
    tokens_actual: u64,
    max_in_flight: usize,
    redis_calls: u64,
}

impl Run {
    fn figures(&self) -> [i64; 11] {
        [
            self.requests as i64,
            self.admitted as i64,
            self.refused as i64,
            self.fallbacks as i64,
            self.translated as i64,
            self.records as i64,
            self.money_budget as i64,
            self.tokens_budget as i64,
            self.money_spent,
            self.tokens_spent,
            self.money_actual as i64,
        ]
    }
}

/// `"… 12.5 USD reserved, 3 USD left"` or `"… 1234 tokens reserved, 56 left"` → (needed,
/// remaining) in the budget's unit; the message in either API's error shape.
fn parse_refusal(body: &[u8], money: bool) -> (u64, u64) {
    let error: Value = serde_json::from_slice(body).unwrap();
    let message = error["error"]["message"].as_str().unwrap().to_string();
    let tail = message.rsplit(": ").next().unwrap();
    let needed = tail.split_whitespace().next().unwrap();
    let remaining = tail
        .split(", ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    let parse = |s: &str| {
        if money {
            parse_money(s).unwrap()
        } else {
            s.parse().unwrap()
        }
    };
    (parse(needed), parse(remaining))
}

fn fleet_run(transport: Transport, flavour: Flavour, binding: Binding, seed: u64) -> Run {
    let n = 48;
    let mut rng = Rng(seed);
    let mut reqs: Vec<Req> = (0..n)
        .map(|i| Req::random(&mut rng, format!("f{seed}-{i}")))
        .collect();
    // budgets about half of the requests fit in when they all arrive together
    let (rough_money, rough_tokens) = reqs
        .iter()
        .map(Req::rough_reservation)
        .fold((0, 0), |(m, t), (rm, rt)| (m + rm, t + rt));
    let limits = match binding {
        Binding::Money => Limits {
            money_nano: rough_money / 2,
            tokens: rough_tokens * 10,
        },
        Binding::Tokens => Limits {
            money_nano: rough_money * 10,
            tokens: rough_tokens / 2,
        },
    };
    let redis = Redis::start().unwrap();
    let gw = Gateway::start(transport, flavour, &limits, &redis, (INSTANCES, WORKERS));
    let log = || gw.log_text();
    let calls_before = gw.redis_calls();
    let mut run = Run {
        requests: n,
        money_budget: limits.money_nano,
        tokens_budget: limits.tokens,
        ..Run::default()
    };

    // the test's ledger of both budget keys: reservations of admitted requests not yet
    // settled at their amount, settled ones at the record's
    let (mut money_model, mut tokens_model) = (0i64, 0i64);
    let mut reserved: HashMap<usize, (u64, u64)> = HashMap::new();
    let mut actual_of: HashMap<usize, (u64, u64)> = HashMap::new();
    let mut ops: VecDeque<Op> = VecDeque::new();
    let mut live: Vec<Live> = Vec::new();
    let mut record_ids: HashSet<String> = HashSet::new();
    let mut next = 0usize;
    let burst = n * 3 / 4;

    while next < n || !live.is_empty() {
        let batch = if next < burst {
            1 + rng.index(6)
        } else {
            1 + rng.index(3)
        };
        for _ in 0..batch {
            let streaming: Vec<usize> = (0..live.len()).filter(|&i| live[i].admitted).collect();
            let start = next < n && (next < burst || streaming.is_empty() || rng.chance(30));
            if start {
                let i = next;
                next += 1;
                live.push(Live {
                    req: i,
                    stream: gw.open(&reqs[i]),
                    pass: 1,
                    admitted: false,
                    response: None,
                    sent: 0,
                    check_second: false,
                });
                ops.push_back(Op::Reserve { req: i });
                continue;
            }
            let Some(&pick) = streaming.get(rng.index(streaming.len().max(1))) else {
                break;
            };
            let l = &mut live[pick];
            let r = &reqs[l.req];
            if r.fallback && l.pass == 1 {
                l.stream = gw.fail_and_redirect(r, &l.stream, r.api.first());
                l.pass = 2;
                l.check_second = true;
                run.fallbacks += 1;
                continue;
            }
            if l.check_second {
                // its request is checked after this batch's pump first
                continue;
            }
            let response = l
                .response
                .as_ref()
                .expect("the answer is chosen once the request arrived");
            if l.sent == 0 {
                l.stream
                    .send_response_headers_raw(response.headers.clone(), false)
                    .unwrap();
                l.sent = 1;
                continue;
            }
            let last = l.sent == response.chunks.len();
            l.stream
                .send_response_body(&response.chunks[l.sent - 1], last)
                .unwrap();
            l.sent += 1;
            if !last {
                continue;
            }
            let down = l.stream.downstream();
            assert!(down.end, "the response reached the client\n{}", log());
            let status: u16 = header_value(down.headers.as_ref().unwrap(), ":status")
                .unwrap()
                .parse()
                .unwrap();
            assert_client_answer(status, &down.body, r, log);
            l.stream.finish().unwrap();
            let record = record_of(&l.stream);
            assert_record(&record, r);
            if r.answering().api() != r.api.name() {
                run.translated += 1;
            }
            actual_of.insert(l.req, r.actual());
            ops.push_back(Op::Settle { req: l.req });
            live.swap_remove(pick);
            // the settlement goes to Redis now, after the reservations before it and before
            // the ones after it, over either transport (over HTTP it leaves from the tick)
            gw.pump_and_flush();
        }
        gw.pump_and_flush();

        // what the pumped operations did, in the order Redis saw them
        while let Some(op) = ops.pop_front() {
            match op {
                Op::Reserve { req } => {
                    let pos = live.iter().position(|l| l.req == req).unwrap();
                    let l = &mut live[pos];
                    if let Some(reply) = l.stream.local_reply() {
                        assert_eq!(reply.status, 402, "{:?}\n{}", reply, log());
                        let money = binding == Binding::Money;
                        let (needed, remaining) = parse_refusal(&reply.body, money);
                        let (budget, model) = if money {
                            (limits.money_nano as i64, money_model)
                        } else {
                            (limits.tokens as i64, tokens_model)
                        };
                        assert_eq!(
                            remaining as i64,
                            (budget - model).max(0),
                            "remaining reported\n{}",
                            log()
                        );
                        assert!(
                            needed as i64 > budget - model,
                            "refused while the budget could cover it"
                        );
                        assert!(
                            l.stream.upstream().headers.is_none(),
                            "nothing reached a provider"
                        );
                        l.stream.finish().unwrap();
                        // refused: one record too, of no usage
                        let record = record_of(&l.stream);
                        assert_eq!(record.status, 402, "{record:?}");
                        assert_eq!(record.usage.total_tokens, 0, "{record:?}");
                        assert!(record_ids.insert(record.request_id.clone()));
                        run.refused += 1;
                        live.swap_remove(pos);
                    } else {
                        let up = l.stream.upstream();
                        let path = header(&up, ":path").unwrap().to_string();
                        // the provider counts the prompt as the gateway estimates it (a
                        // provider that reports more than was reserved overspends any budget)
                        reqs[req].prompt_tokens = token_ratelimit::cost::inspect(
                            &path,
                            &up.body,
                            DEFAULT_MAX_TOKENS,
                            0,
                            8192,
                        )
                        .unwrap()
                        .prompt;
                        let r = &reqs[req];
                        let first = r.api.first();
                        let sent = assert_provider_request(&up, first, r, log);
                        let cost = token_ratelimit::cost::inspect(
                            &path,
                            &up.body,
                            DEFAULT_MAX_TOKENS,
                            MARGIN_PERCENT,
                            8192,
                        )
                        .unwrap();
                        let price = Price::from(ceiling());
                        let amount = (
                            nano(cost.prompt, price.input) + nano(cost.output_cap, price.output),
                            cost.tokens(),
                        );
                        money_model += amount.0 as i64;
                        tokens_model += amount.1 as i64;
                        reserved.insert(req, amount);
                        l.admitted = true;
                        if !r.fallback {
                            l.response = Some(answer(first, r, &sent));
                        }
                        run.admitted += 1;
                    }
                }
                Op::Settle { req } => {
                    let (rm, rt) = reserved[&req];
                    let (am, at) = actual_of[&req];
                    money_model += am as i64 - rm as i64;
                    tokens_model += at as i64 - rt as i64;
                }
            }
        }
        // the second passes started in this batch: no new reservation, the other provider
        for l in live.iter_mut().filter(|l| l.check_second) {
            let r = &reqs[l.req];
            assert!(
                l.stream.local_reply().is_none(),
                "{}\n{}",
                shown_reply(&l.stream),
                log()
            );
            let answering = r.api.first().other();
            let sent = assert_provider_request(&l.stream.upstream(), answering, r, log);
            l.response = Some(answer(answering, r, &sent));
            l.check_second = false;
        }
        run.max_in_flight = run
            .max_in_flight
            .max(live.iter().filter(|l| l.admitted).count());
        assert_eq!(
            (
                redis_int(&redis, &money_key()),
                redis_int(&redis, &tokens_key())
            ),
            (money_model, tokens_model),
            "the budgets in Redis and the test's ledger\n{}",
            log()
        );
        assert!(money_model <= limits.money_nano as i64, "money overshoot");
        assert!(tokens_model <= limits.tokens as i64, "token overshoot");
    }
    gw.pump_and_flush();
    assert_eq!(journal_depth(&gw), 0);
    assert_eq!(reservations_left(&redis), 0, "no reservation left behind");
    run.money_spent = redis_int(&redis, &money_key());
    run.tokens_spent = redis_int(&redis, &tokens_key());
    run.money_actual = reserved.keys().map(|r| actual_of[r].0).sum();
    run.tokens_actual = reserved.keys().map(|r| actual_of[r].1).sum();
    run.redis_calls = gw.redis_calls() - calls_before;
    // one record per logical request, and no other
    let logged = logged_records(&gw);
    run.records = logged.len();
    let ids: HashSet<&str> = logged.iter().map(|r| r.request_id.as_str()).collect();
    assert_eq!(ids.len(), logged.len(), "a request recorded twice");
    assert_eq!(logged.len(), n, "one record per logical request");
    let answered: u64 = logged.iter().filter_map(|r| r.cost_nano).sum();
    assert_eq!(answered, run.money_actual, "the records' costs");
    assert!(!gw.log_text().contains(EMAIL), "no PII logged");
    run
}

fn report(name: &str, run: &Run) {
    eprintln!(
        "translation-fleet budget[{name}]: {} requests on {INSTANCES}x{WORKERS}, admitted {}, refused 402 {}, cross-provider fallbacks {}, translated answers {}, records {}, max streaming at once {}; money: budget {} nano, spent {} (overshoot {}), Σrecords {} (drift {}); tokens: budget {}, spent {} (overshoot {}), Σrecords {} (drift {}); {} Redis calls",
        run.requests,
        run.admitted,
        run.refused,
        run.fallbacks,
        run.translated,
        run.records,
        run.max_in_flight,
        run.money_budget,
        run.money_spent,
        (run.money_spent - run.money_budget as i64).max(0),
        run.money_actual,
        run.money_spent - run.money_actual as i64,
        run.tokens_budget,
        run.tokens_spent,
        (run.tokens_spent - run.tokens_budget as i64).max(0),
        run.tokens_actual,
        run.tokens_spent - run.tokens_actual as i64,
        run.redis_calls,
    );
}

fn check(run: &Run) {
    assert!(
        run.money_spent <= run.money_budget as i64,
        "money overshoot"
    );
    assert!(
        run.tokens_spent <= run.tokens_budget as i64,
        "token overshoot"
    );
    assert_eq!(run.money_spent, run.money_actual as i64, "money drift");
    assert_eq!(run.tokens_spent, run.tokens_actual as i64, "token drift");
    assert_eq!(run.records, run.requests);
    // not vacuous: both sides of the budget, both directions of fallback, translated answers
    assert!(run.admitted * 4 >= run.requests, "too few admitted");
    assert!(run.refused > 0, "nothing refused");
    assert!(run.fallbacks > 0, "no fallback");
    assert!(run.translated > 0, "no translated answer");
}

fn fleet_both_ways(flavour: Flavour, binding: Binding, seed: u64) {
    let name = format!("{flavour:?}, {binding:?} runs out, seed {seed}");
    let abi = fleet_run(Transport::Higress, flavour, binding, seed);
    report(&name, &abi);
    check(&abi);
    let http = fleet_run(Transport::Http, flavour, binding, seed);
    report(&format!("{name}, over http"), &http);
    check(&http);
    assert_eq!(
        abi.figures(),
        http.figures(),
        "the HTTP transport gives the Redis ABI's figures"
    );
}

#[test]
fn fleet_money_budget_upstream_envoy_redirect() {
    fleet_both_ways(Flavour::UpstreamEnvoy, Binding::Money, 1);
}

#[test]
fn fleet_money_budget_higress_redirect() {
    fleet_both_ways(Flavour::Higress, Binding::Money, 2);
}

#[test]
fn fleet_token_budget_upstream_envoy_redirect() {
    fleet_both_ways(Flavour::UpstreamEnvoy, Binding::Tokens, 3);
}

#[test]
fn fleet_token_budget_higress_redirect() {
    fleet_both_ways(Flavour::Higress, Binding::Tokens, 4);
}
