//! The proxy-wasm adapter over [`crate::core`]: copies host data in, carries the core's
//! commands out. Every host call goes through `llm_gateway_shared::host`.
//!
//! The Envoy filter needs `allow_on_headers_stop_iteration: true` (headers are held until
//! the end of the body). Redis commands travel by Higress's Redis calls or over HTTP to
//! webdis: only the shared client (`host::redis_client`) knows which.

use crate::budget::{self, Identity};
use crate::config::{parse_document, Config};
use crate::core::{Command, Core, Env, Head, Input};
use llm_gateway_shared::chain::{self, Direction, Step};
use llm_gateway_shared::headers;
use llm_gateway_shared::host::{
    self, redis_client, Buffer, HeaderMap, HostError, HostResult, LogLevel, Metric,
};
use llm_gateway_shared::redis::{RedisConfig, TransportName};
use llm_gateway_shared::reentry::is_superseded;
use llm_gateway_shared::reject::Reject;
use llm_gateway_shared::route_info::{
    Alternative, RoutePrices, BUDGET_FALLBACK_PROPERTY, PROPERTY as ROUTE_PROPERTY,
};
use llm_gateway_shared::usage_record::Charge;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use std::borrow::Cow;
use std::cell::{Cell, RefCell};
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
    host::time_nanos() / 1_000_000
}

/// The core of one VM and what executing its commands needs.
struct State {
    core: RefCell<Core>,
    /// The VM's Redis (the first scope's `redis`), connected at configure.
    redis: Option<RedisConfig>,
    metrics: RefCell<crate::fxhash::FxHashMap<Cow<'static, str>, Option<Metric>>>,
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
        let mut now = None; // the clock is read once, and only for an input that uses it
        let mut feed = |input: Input| {
            let uses_clock = self.core.borrow().uses_clock(&input);
            let now = match uses_clock {
                true => *now.get_or_insert_with(now_ms),
                false => 0,
            };
            self.core.borrow_mut().handle(now, input, self);
        };
        let mut action = Action::Pause;
        feed(input);
        loop {
            let command = self.core.borrow_mut().poll();
            let Some(command) = command else { break };
            // a command whose outcome the core needs (a body read or written) answers at once
            if let Some(answer) = self.execute(own, command, &mut action) {
                feed(answer);
            }
        }
        action
    }

    /// A host call on request `ctx`.
    fn at<T>(&self, ctx: u32, call: impl FnOnce() -> HostResult<T>) -> HostResult<T> {
        if self.enter(ctx) {
            call()
        } else {
            Err(HostError::NotFound)
        }
    }

    /// A host call on request `ctx` whose failure the core does not need: logged.
    fn on(&self, ctx: u32, level: LogLevel, what: &str, call: impl FnOnce() -> HostResult<()>) {
        if let Err(err) = self.at(ctx, call) {
            log(level, &format!("cannot {what}: {err}"));
        }
    }

    /// Carries one command out; the input it produces, if any.
    fn execute(&self, own: Option<u32>, command: Command, action: &mut Action) -> Option<Input> {
        use LogLevel::{Debug, Error, Warn};
        const REQUEST: HeaderMap = HeaderMap::RequestHeaders;
        match command {
            Command::Proceed { ctx } if own == Some(ctx) => *action = Action::Continue,
            Command::Proceed { ctx } => {
                self.on(ctx, Warn, "resume a request", host::resume_request)
            }
            Command::Refuse { ctx, reject } => self.on(ctx, Error, "send the local reply", || {
                host::send_reject(PLUGIN, &reject)
            }),
            Command::ReadBody { ctx, size } => {
                let body = self.at(ctx, || host::buffer(Buffer::RequestBody, 0, size));
                return Some(Input::Body { ctx, size, body });
            }
            Command::ReplaceBody {
                ctx,
                size,
                body,
                framed,
            } => {
                let result = self.at(ctx, || {
                    host::replace_framed_request_body(size, &body, framed)
                });
                return Some(Input::BodyReplaced { ctx, result });
            }
            Command::SetProperty { ctx, name, value } => self.on(ctx, Debug, "set", || {
                host::set_property(&[name.as_str()], &value)
            }),
            Command::SetRequestHeader { ctx, name, value } => self.on(ctx, Debug, name, || {
                host::set_header(REQUEST, name, value.as_bytes())
            }),
            Command::RemoveRequestHeader { ctx, name } => {
                self.on(ctx, Debug, name, || host::remove_header(REQUEST, name))
            }
            Command::RewriteModel { ctx, model } => {
                self.on(ctx, Warn, "rewrite the model (budget fallback)", || {
                    rewrite_model(&model)
                })
            }
            Command::ClearRouteCache { ctx } => {
                self.on(ctx, Debug, "clear the route cache", host::clear_route_cache)
            }
            Command::SetResponseHeader { ctx, name, value } => self.on(ctx, Debug, name, || {
                host::set_header(HeaderMap::ResponseHeaders, name, value.as_bytes())
            }),
            Command::Count { name, delta } => {
                if let Some(metric) = self.metric(name, Metric::counter) {
                    let _ = metric.increment(delta);
                }
            }
            Command::Gauge { name, value } => {
                if let Some(metric) = self.metric(Cow::Owned(format!("gauge:{name}")), |_| {
                    Metric::gauge(&format!("{METRIC_PREFIX}{name}"))
                }) {
                    let _ = metric.record(value);
                }
            }
            Command::Log { level, message } => log(level, &message),
        }
        None
    }

    /// A metric, defined on first use (`define` gets its full name).
    fn metric(
        &self,
        key: Cow<'static, str>,
        define: impl FnOnce(&str) -> HostResult<Metric>,
    ) -> Option<Metric> {
        let mut metrics = self.metrics.borrow_mut();
        let metric = metrics
            .entry(key)
            .or_insert_with_key(|key| define(&format!("{METRIC_PREFIX}{key}")).ok());
        *metric
    }
}

impl Env for State {
    fn shared_get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), HostError> {
        host::shared_data(key)
    }

    fn shared_set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), HostError> {
        host::set_shared_data(key, value, cas)
    }

    /// Sends to the VM's Redis, the one connected at configure (the first scope's `redis`):
    /// `service` names it unless a rule has a `redis` of its own, which gets no connection.
    fn send_redis(&self, _service: &str, args: &[Cow<'_, [u8]>]) -> Result<u32, HostError> {
        match &self.redis {
            Some(redis) => redis_client::send(redis, args),
            None => Err(HostError::Unimplemented),
        }
    }

    fn route_info(&self, ctx: u32) -> Option<RoutePrices> {
        self.property(ctx, ROUTE_PROPERTY, RoutePrices::from_json)
    }

    fn alternative(&self, ctx: u32) -> Option<Alternative> {
        self.property(ctx, BUDGET_FALLBACK_PROPERTY, Alternative::from_json)
    }

    fn usage_record(&self, ctx: u32, property: &str) -> Option<Charge> {
        self.property(ctx, property, Charge::from_json)
    }
}

impl State {
    /// A JSON record another filter published for request `ctx`.
    fn property<T>(&self, ctx: u32, name: &str, parse: fn(&[u8]) -> Option<T>) -> Option<T> {
        let bytes = self.at(ctx, || host::property(&[name])).ok().flatten()?;
        parse(&bytes)
    }
}

/// Rewrites the held request body's `model` (the headers are still held, so
/// `content-length` can follow).
fn rewrite_model(model: &str) -> Result<(), HostError> {
    let body = host::buffer(Buffer::RequestBody, 0, usize::MAX)?;
    match with_model(&body, model) {
        Some(rewritten) => host::replace_request_body(body.len(), &rewritten),
        None => Ok(()), // inspected before; nothing sensible to rewrite
    }
}

/// `body` with its top-level `model` set to `model`; `None` if it is no JSON object.
fn with_model(body: &[u8], model: &str) -> Option<Vec<u8>> {
    use llm_gateway_shared::json::{self, Edits, Limits};
    let object = json::scan_object(body, &Limits::default()).ok()?;
    let mut edits = Edits::new(body, &object);
    edits.set("model", json::quote(model).into_bytes());
    Some(edits.finish())
}

fn header_text(name: &str) -> Option<String> {
    host::header(HeaderMap::RequestHeaders, name)
        .ok()
        .flatten()
        .and_then(|v| String::from_utf8(v).ok())
        .filter(|v| !v.is_empty())
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
            let reply = redis_client::http_reply(body_size);
            state.run_in(None, None, Input::Reply { token, reply });
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
            std::collections::hash_map::RandomState::new().hash_one(host::time_nanos())
        };
        let http = redis
            .as_ref()
            .is_some_and(|r| r.transport.name() == TransportName::Http);
        let state = Rc::new(State {
            core: RefCell::new(Core::new(rules, nonce, http)),
            redis,
            metrics: RefCell::default(),
            effective: Cell::new(None),
        });
        if let Some(redis) = &state.redis {
            let for_replies = Rc::clone(&state);
            let on_reply = move |token, reply| {
                for_replies.run(None, Input::Reply { token, reply });
            };
            if let Err(why) = redis_client::connect([redis], on_reply) {
                log(LogLevel::Error, &why);
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

// ---------------------------------------------------------------------------------------
// HTTP context

struct Limiter {
    id: u32,
    state: Option<Rc<State>>,
}

impl Context for Limiter {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        if let Some(state) = &self.state {
            let reply = redis_client::http_reply(body_size);
            state.run_in(Some(self.id), None, Input::Reply { token, reply });
        }
    }

    fn on_done(&mut self) -> bool {
        // Envoy runs on_log before on_done; a request still known here was never settled
        // (a host that skipped on_log): the core settles it rather than leak it.
        let unsettled = self
            .state
            .as_ref()
            .is_some_and(|s| s.core.borrow().unsettled(self.id));
        if unsettled {
            self.run(Input::Done { ctx: self.id });
        }
        true
    }
}

impl Limiter {
    /// Feeds an event of this request to the core; the action for its callback.
    fn run(&self, input: Input) -> Action {
        match &self.state {
            Some(state) => state.run(Some(self.id), input),
            None => Action::Continue,
        }
    }
}

impl HttpContext for Limiter {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(state) = &self.state else {
            host::refuse(
                PLUGIN,
                &Reject::internal("token-ratelimit is not configured"),
            );
            return Action::Pause;
        };
        let (config, counts_ip) = {
            let core = state.core.borrow();
            let selected = host::select_config(core.rules(), None);
            (
                selected.and_then(|c| core.config_index(c)),
                selected.is_some_and(Config::counts_ip),
            )
        };
        let head = config
            .map(|_| read_request_head(counts_ip))
            .unwrap_or_default();
        let ctx = self.id;
        self.run(Input::RequestHeaders {
            ctx,
            config,
            head,
            end_of_stream,
        })
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        let ctx = self.id;
        self.run(Input::RequestBody {
            ctx,
            size,
            end_of_stream,
        })
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        self.run(Input::ResponseHeaders { ctx: self.id });
        Action::Continue
    }

    fn on_log(&mut self) {
        if let Some(state) = &self.state {
            let watches = state.core.borrow().watches_supersession(self.id);
            let superseded = watches && {
                let details = host::property_string(&["response", "code_details"]);
                is_superseded(details.ok().flatten().as_deref())
            };
            self.run(Input::Log {
                ctx: self.id,
                superseded,
            });
        }
    }
}

/// The request headers the core reads, from one read of the whole map (about ten names,
/// most of them present); one read per name if that fails. `counts_ip`: some limit counts
/// per client address (else `source.address` is not read).
fn read_request_head(counts_ip: bool) -> Head {
    match host::header_view(HeaderMap::RequestHeaders) {
        Ok(headers) => read_head(counts_ip, |name| {
            headers
                .text(name)
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        }),
        Err(_) => read_head(counts_ip, header_text),
    }
}

/// The request headers the core reads; the client address only if `counts_ip` (only a limit
/// by `ip` keys on it).
fn read_head(counts_ip: bool, header: impl Fn(&str) -> Option<String>) -> Head {
    let ip = counts_ip
        .then(|| host::property_string(&["source", "address"]).ok().flatten())
        .flatten()
        .map(|a| budget::strip_port(&a).to_string());
    let identity = Identity {
        key: header(headers::KEY_ID),
        consumer: header(headers::CONSUMER),
        tenant: header(headers::TENANT),
        model_group: header(headers::MODEL_GROUP),
        ip,
        user: header("x-user-id"),
        tier: header(headers::TIER),
    };
    let logical_id = header(headers::REQUEST_ID);
    let stream_id = match logical_id {
        Some(_) => None,
        None => host::property_string(&["request", "id"]).ok().flatten(),
    };
    Head {
        identity,
        logical_id,
        stream_id,
        path: header(":path").unwrap_or_default(),
        reentry: header(headers::REENTRY).is_some(),
        framed: header("content-length").is_some(),
    }
}

mod fused;
pub use fused::{Fused, FusedStage};
