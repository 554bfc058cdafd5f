//! The proxy-wasm adapter over [`crate::core`]: copies host data in, carries the core's
//! commands out. Every host call goes through `llm_gateway_shared::host`.
//!
//! The Envoy filter needs `allow_on_headers_stop_iteration: true` (headers are held until
//! the end of the body). Redis commands travel by Higress's Redis calls or over HTTP to
//! webdis ([`RedisTransport`]); only [`Host::send_redis`] and the two reply entry points know
//! which.

use crate::budget::{self, Identity};
use crate::config::{parse_document, RedisConfig, RedisTransport};
use crate::core::{Command, Core, Env, Head, Input, LogLevel as CoreLevel, Unanswered};
use llm_gateway_shared::headers;
use llm_gateway_shared::host::webdis::HttpRedis;
use llm_gateway_shared::host::{self, Buffer, HeaderMap, HostError, LogLevel, Metric};
use llm_gateway_shared::reentry::is_superseded;
use llm_gateway_shared::reject::Reject;
use llm_gateway_shared::resp;
use llm_gateway_shared::route_info::{
    Alternative, RouteInfo, BUDGET_FALLBACK_PROPERTY, PROPERTY as ROUTE_PROPERTY,
};
use llm_gateway_shared::usage_record::Record;
use llm_gateway_shared::webdis::WebdisError;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

const PLUGIN: &str = "token_ratelimit";
const METRIC_PREFIX: &str = "llm_gateway.ratelimit.";

// The standalone module's entry point; a module holding several plugins (`plugins/bundle`)
// turns the `standalone` feature off and creates this plugin's root context with
// [`root_context`].
#[cfg(feature = "standalone")]
proxy_wasm::main! {{
    proxy_wasm::set_root_context(root_context);
}}

/// A root context of this plugin (what the standalone module creates for every `root_id`).
pub fn root_context(_context_id: u32) -> Box<dyn RootContext> {
    Box::new(Root::default())
}

fn log(level: LogLevel, message: &str) {
    host::log(level, &format!("token-ratelimit: {message}"));
}

fn now_ms() -> u64 {
    host::now_nanos().unwrap_or_default() / 1_000_000
}

/// The core of one VM and what executing its commands needs.
struct State {
    core: RefCell<Core>,
    /// The webdis cluster, when Redis is reached over HTTP.
    http: Option<HttpRedis>,
    metrics: RefCell<HashMap<Cow<'static, str>, Option<Metric>>>,
    /// The context the host currently acts on (`None`: the root's own).
    effective: Cell<Option<u32>>,
}

impl State {
    /// Makes request `ctx` the one host calls act on; false if it is gone.
    fn enter(&self, ctx: u32) -> bool {
        if self.effective.get() == Some(ctx) {
            return true;
        }
        match host::set_effective_context(ctx) {
            Ok(()) => {
                self.effective.set(Some(ctx));
                true
            }
            Err(err) => {
                log(LogLevel::Debug, &format!("request {ctx} gone: {err}"));
                false
            }
        }
    }

    /// Feeds one event to the core and carries its commands out. `own` is the request whose
    /// stream callback this is; the action for that callback (`Pause` unless the core let it
    /// go on).
    fn run(&self, own: Option<u32>, input: Input) -> Action {
        self.run_in(own, own, input)
    }

    /// [`State::run`] from a callback that returns no action, in context `effective`
    /// (`None`: the root's): a request the core lets go on is resumed.
    fn run_in(&self, effective: Option<u32>, own: Option<u32>, input: Input) -> Action {
        self.effective.set(effective);
        let mut action = Action::Pause;
        self.core.borrow_mut().handle(now_ms(), input, self);
        loop {
            let command = self.core.borrow_mut().poll();
            let Some(command) = command else { break };
            // a command whose outcome the core needs (a body read or written) answers at once
            if let Some(answer) = self.execute(own, command, &mut action) {
                self.core.borrow_mut().handle(now_ms(), answer, self);
            }
        }
        action
    }

    /// Carries one command out; the input it produces, if any.
    fn execute(&self, own: Option<u32>, command: Command, action: &mut Action) -> Option<Input> {
        match command {
            Command::Proceed { ctx } if own == Some(ctx) => *action = Action::Continue,
            Command::Proceed { ctx } => {
                if self.enter(ctx) {
                    if let Err(err) = host::resume_request() {
                        log(LogLevel::Warn, &format!("cannot resume a request: {err}"));
                    }
                }
            }
            Command::Refuse { ctx, reject } => {
                if own == Some(ctx) || self.enter(ctx) {
                    refuse(&reject);
                }
            }
            Command::ReadBody { ctx, size } => {
                let body = if self.enter(ctx) {
                    host::buffer(Buffer::RequestBody, 0, size)
                } else {
                    Err(HostError::NotFound)
                };
                return Some(Input::Body { ctx, size, body });
            }
            Command::ReplaceBody { ctx, size, body } => {
                let result = if self.enter(ctx) {
                    host::replace_request_body(size, &body)
                } else {
                    Err(HostError::NotFound)
                };
                return Some(Input::BodyReplaced { ctx, result });
            }
            Command::SetProperty { ctx, name, value } => {
                if self.enter(ctx) {
                    let _ = host::set_property(&[name.as_str()], &value);
                }
            }
            Command::SetRequestHeader { ctx, name, value } => {
                if self.enter(ctx) {
                    let _ = host::set_header(HeaderMap::RequestHeaders, name, value.as_bytes());
                }
            }
            Command::RemoveRequestHeader { ctx, name } => {
                if self.enter(ctx) {
                    let _ = host::remove_header(HeaderMap::RequestHeaders, name);
                }
            }
            Command::RewriteModel { ctx, model } => {
                if self.enter(ctx) {
                    if let Err(err) = rewrite_model(&model) {
                        log(
                            LogLevel::Warn,
                            &format!("budget fallback: cannot rewrite the model: {err}"),
                        );
                    }
                }
            }
            Command::ClearRouteCache { ctx } => {
                if self.enter(ctx) {
                    let _ = host::clear_route_cache();
                }
            }
            Command::SetResponseHeader { ctx, name, value } => {
                if self.enter(ctx) {
                    let _ = host::set_header(HeaderMap::ResponseHeaders, name, value.as_bytes());
                }
            }
            Command::Count { name, delta } => {
                let mut metrics = self.metrics.borrow_mut();
                let metric = metrics.entry(name).or_insert_with_key(|name| {
                    Metric::counter(&format!("{METRIC_PREFIX}{name}")).ok()
                });
                if let Some(metric) = metric {
                    let _ = metric.increment(delta);
                }
            }
            Command::Gauge { name, value } => {
                let mut metrics = self.metrics.borrow_mut();
                let metric = metrics
                    .entry(Cow::Owned(format!("gauge:{name}")))
                    .or_insert_with(|| Metric::gauge(&format!("{METRIC_PREFIX}{name}")).ok());
                if let Some(metric) = metric {
                    let _ = metric.record(value);
                }
            }
            Command::Log { level, message } => {
                let level = match level {
                    CoreLevel::Info => LogLevel::Info,
                    CoreLevel::Warn => LogLevel::Warn,
                    CoreLevel::Error => LogLevel::Error,
                };
                log(level, &message);
            }
        }
        None
    }
}

impl Env for State {
    fn shared_get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), HostError> {
        host::shared_data(key)
    }

    fn shared_set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), HostError> {
        host::set_shared_data(key, value, cas)
    }

    fn send_redis(&self, service: &str, args: &[Cow<'_, [u8]>]) -> Result<u32, HostError> {
        match &self.http {
            Some(http) => host::webdis::send(http, args),
            None => redis_call(service, &resp::encode_command(args)),
        }
    }

    fn route_info(&self, ctx: u32) -> Option<RouteInfo> {
        self.enter(ctx).then_some(())?;
        let bytes = host::property(&[ROUTE_PROPERTY]).ok().flatten()?;
        RouteInfo::from_json(&bytes)
    }

    fn alternative(&self, ctx: u32) -> Option<Alternative> {
        self.enter(ctx).then_some(())?;
        let bytes = host::property(&[BUDGET_FALLBACK_PROPERTY]).ok().flatten()?;
        Alternative::from_json(&bytes)
    }

    fn usage_record(&self, ctx: u32, property: &str) -> Option<Record> {
        self.enter(ctx).then_some(())?;
        let bytes = host::property(&[property]).ok().flatten()?;
        Record::from_json(&bytes)
    }
}

/// Rewrites the held request body's `model` (the headers are still held, so
/// `content-length` can follow).
fn rewrite_model(model: &str) -> Result<(), HostError> {
    use llm_gateway_shared::json::{self, Edits, Limits};
    let body = host::buffer(Buffer::RequestBody, 0, usize::MAX)?;
    let Ok(object) = json::scan_object(&body, &Limits::default()) else {
        return Ok(()); // inspected before; nothing sensible to rewrite
    };
    let mut edits = Edits::new(&body, &object);
    edits.set("model", json::quote(model).into_bytes());
    let rewritten = edits.finish();
    host::replace_request_body(body.len(), &rewritten)
}

fn refuse(reject: &Reject) {
    if let Err(err) = host::send_reject(PLUGIN, reject) {
        log(
            LogLevel::Error,
            &format!("cannot send the local reply: {err}"),
        );
    }
}

fn header_text(name: &str) -> Option<String> {
    host::header(HeaderMap::RequestHeaders, name)
        .ok()
        .flatten()
        .and_then(|v| String::from_utf8(v).ok())
        .filter(|v| !v.is_empty())
}

#[cfg(feature = "higress")]
fn redis_call(service: &str, query: &[u8]) -> Result<u32, HostError> {
    host::redis::redis_call(service, query)
}

#[cfg(not(feature = "higress"))]
fn redis_call(_service: &str, _query: &[u8]) -> Result<u32, HostError> {
    Err(HostError::Unimplemented)
}

/// A webdis answer (HTTP transport), in whichever context the SDK delivers it.
fn on_http_reply(state: &State, effective: Option<u32>, token: u32, body_size: usize) {
    let reply = host::webdis::reply(body_size).map_err(|err| Unanswered {
        forbidden: err == WebdisError::Forbidden,
        why: err.to_string(),
    });
    state.run_in(effective, None, Input::Reply { token, reply });
}

// ---------------------------------------------------------------------------------------
// Root context

#[derive(Default)]
struct Root {
    state: Option<Rc<State>>,
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        if let Some(state) = &self.state {
            on_http_reply(state, None, token, body_size);
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let Some(rules) = host::load_config("token-ratelimit", parse_document) else {
            return false;
        };
        let redis = rules.configs().find_map(|c| c.redis.clone());
        let period = rules
            .configs()
            .find(|c| c.redis.is_some())
            .map_or(100, |c| c.lease.sync_ms);
        let nonce = {
            use std::hash::BuildHasher;
            std::collections::hash_map::RandomState::new()
                .hash_one(host::now_nanos().unwrap_or_default())
        };
        let http = http_redis(redis.as_ref());
        let state = Rc::new(State {
            core: RefCell::new(Core::new(rules, nonce, http.is_some())),
            http,
            metrics: RefCell::default(),
            effective: Cell::new(None),
        });
        if let Some(redis) = redis {
            if !init_redis(&state, &redis) {
                return false;
            }
            if let Err(err) = host::set_tick_period_ms(period) {
                // without ticks no lease is topped up and no journal replayed
                log(
                    LogLevel::Error,
                    &format!("cannot set the tick period: {err}"),
                );
            }
        }
        self.state = Some(state);
        true
    }

    fn on_tick(&mut self) {
        if let Some(state) = &self.state {
            state.run(None, Input::Tick);
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Limiter {
            id: context_id,
            state: self.state.clone(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// The webdis cluster of an HTTP transport.
fn http_redis(redis: Option<&RedisConfig>) -> Option<HttpRedis> {
    let redis = redis?;
    match &redis.transport {
        RedisTransport::Http { authorization } => Some(HttpRedis {
            cluster: redis.service.clone(),
            authorization: authorization.clone(),
            timeout_ms: redis.timeout_ms,
        }),
        RedisTransport::Higress => None,
    }
}

fn init_redis(state: &Rc<State>, redis: &RedisConfig) -> bool {
    match redis.transport {
        // nothing to connect: each call is an HTTP request to the cluster
        RedisTransport::Http { .. } => true,
        RedisTransport::Higress => init_higress_redis(state, redis),
    }
}

#[cfg(feature = "higress")]
fn init_higress_redis(state: &Rc<State>, redis: &RedisConfig) -> bool {
    use llm_gateway_shared::host::redis::{on_redis_call_response, redis_init, redis_reply};
    let user = redis.username.as_deref().unwrap_or_default();
    let password = redis.password.as_deref().unwrap_or_default();
    if let Err(err) = redis_init(&redis.service, user, password, redis.timeout_ms) {
        log(
            LogLevel::Error,
            &format!("cannot connect Redis service {}: {err}", redis.service),
        );
        return false;
    }
    let for_replies = Rc::clone(state);
    on_redis_call_response(move |response| {
        let reply = if response.answered() {
            redis_reply(response.size).map_err(|err| Unanswered {
                why: format!("reply not read: {err}"),
                forbidden: false,
            })
        } else {
            Err(Unanswered {
                why: format!("call failed (status {})", response.status),
                forbidden: false,
            })
        };
        let token = response.token;
        for_replies.run(None, Input::Reply { token, reply });
    });
    true
}

#[cfg(not(feature = "higress"))]
fn init_higress_redis(_state: &Rc<State>, _redis: &RedisConfig) -> bool {
    false // refused by the config parser already
}

// ---------------------------------------------------------------------------------------
// HTTP context

struct Limiter {
    id: u32,
    state: Option<Rc<State>>,
}

impl Context for Limiter {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        if let Some(state) = &self.state {
            on_http_reply(state, Some(self.id), token, body_size);
        }
    }

    fn on_done(&mut self) -> bool {
        // Envoy runs on_log before on_done; a request still known here was never settled
        // (a host that skipped on_log): the core settles it rather than leak it.
        if let Some(state) = &self.state {
            state.run(Some(self.id), Input::Done { ctx: self.id });
        }
        true
    }
}

impl HttpContext for Limiter {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(state) = self.state.clone() else {
            refuse(&Reject::internal("token-ratelimit is not configured"));
            return Action::Pause;
        };
        let config = {
            let core = state.core.borrow();
            let rules = core.rules();
            host::select_config(rules, None).and_then(|config| {
                if config.is_empty() {
                    return None;
                }
                Some(
                    rules
                        .configs()
                        .position(|c| std::ptr::eq(c, config))
                        .unwrap_or(0),
                )
            })
        };
        let head = match config {
            Some(_) => read_head(),
            None => Head::default(),
        };
        let ctx = self.id;
        state.run(
            Some(ctx),
            Input::RequestHeaders {
                ctx,
                config,
                head,
                end_of_stream,
            },
        )
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        let Some(state) = &self.state else {
            return Action::Continue;
        };
        let ctx = self.id;
        state.run(
            Some(ctx),
            Input::RequestBody {
                ctx,
                size,
                end_of_stream,
            },
        )
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Some(state) = &self.state {
            state.run(Some(self.id), Input::ResponseHeaders { ctx: self.id });
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        if let Some(state) = &self.state {
            let details = host::property_string(&["response", "code_details"])
                .ok()
                .flatten();
            let superseded = is_superseded(details.as_deref());
            state.run(
                Some(self.id),
                Input::Log {
                    ctx: self.id,
                    superseded,
                },
            );
        }
    }
}

/// The request headers the core reads.
fn read_head() -> Head {
    let ip = host::property_string(&["source", "address"])
        .ok()
        .flatten()
        .map(|a| budget::strip_port(&a).to_string());
    let identity = Identity {
        key: header_text(headers::KEY_ID),
        consumer: header_text(headers::CONSUMER),
        tenant: header_text(headers::TENANT),
        model_group: header_text(headers::MODEL_GROUP),
        ip,
        user: header_text("x-user-id"),
    };
    let logical_id = header_text(headers::REQUEST_ID);
    let stream_id = match logical_id {
        Some(_) => None,
        None => host::property_string(&["request", "id"]).ok().flatten(),
    };
    Head {
        identity,
        logical_id,
        stream_id,
        path: header_text(":path").unwrap_or_default(),
        reentry: header_text(headers::REENTRY).is_some(),
    }
}
