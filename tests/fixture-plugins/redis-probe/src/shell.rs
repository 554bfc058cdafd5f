//! The proxy-wasm shell of the fixture.

use crate::{route, Config, Route};
use llm_gateway_shared::host::redis::{
    on_redis_call_response, redis_call, redis_init, redis_reply, RedisResponse,
};
use llm_gateway_shared::host::{self, Buffer, HeaderMap, HostError, LogLevel, Metric};
use llm_gateway_shared::pending::Pending;
use llm_gateway_shared::reject::{ErrorType, Reject};
use llm_gateway_shared::resp::{self, Reply};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use std::cell::RefCell;
use std::rc::Rc;

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| Box::new(Root::default()));
}}

#[derive(Default)]
struct Metrics {
    ticks: Option<Metric>,
    last_tick: Option<Metric>,
    queue_items: Option<Metric>,
    body_size: Option<Metric>,
}

#[derive(Default)]
struct Shared {
    config: Config,
    metrics: Metrics,
    queue: Option<u32>,
    redis: Pending<()>,
    holds: Pending<HeldIncrement>,
}

#[derive(Debug, Clone)]
struct HeldIncrement {
    key: String,
    value: u64,
    cas: u32,
}

#[derive(Default)]
struct Root {
    shared: Rc<RefCell<Shared>>,
}

impl Context for Root {
    fn on_http_call_response(&mut self, _token: u32, _: usize, _: usize, _: usize) {}
}

// Shared queues have no wrapper in `shared::host` (no product plugin uses them); the fixture
// calls the SDK's hostcalls, which return errors for every status Envoy gives queues.
fn queue_ready(shared: &Rc<RefCell<Shared>>, queue: u32) {
    let mut items = 0;
    while let Ok(Some(_)) = proxy_wasm::hostcalls::dequeue_shared_queue(queue) {
        items += 1;
    }
    if let Some(m) = shared.borrow().metrics.queue_items {
        let _ = m.increment(items);
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let raw = host::buffer(Buffer::PluginConfiguration, 0, usize::MAX).unwrap_or_default();
        let config: Config = match serde_json::from_slice(&raw) {
            Ok(c) => c,
            Err(e) => {
                host::log(LogLevel::Error, &format!("redis-probe: bad config: {e}"));
                return false;
            }
        };
        if let Some(service) = &config.redis_service {
            if let Err(e) = redis_init(service, "", "", config.timeout_ms) {
                host::log(LogLevel::Error, &format!("redis-probe: redis_init: {e}"));
                return false;
            }
        }
        if config.tick_ms > 0 {
            let _ = host::set_tick_period_ms(config.tick_ms);
        }
        let mut shared = self.shared.borrow_mut();
        shared.metrics = Metrics {
            ticks: Metric::counter("redis_probe.ticks").ok(),
            last_tick: Metric::gauge("redis_probe.last_tick_secs").ok(),
            queue_items: Metric::counter("redis_probe.queue_items").ok(),
            body_size: Metric::histogram("redis_probe.body_size").ok(),
        };
        shared.queue = proxy_wasm::hostcalls::register_shared_queue("probe").ok();
        shared.config = config;
        drop(shared);
        let for_replies = self.shared.clone();
        on_redis_call_response(move |response| on_redis_reply(&for_replies, response));
        true
    }

    fn on_tick(&mut self) {
        let shared = self.shared.borrow();
        if let Some(m) = shared.metrics.ticks {
            let _ = m.increment(1);
        }
        if let (Some(m), Ok(now)) = (shared.metrics.last_tick, host::now_nanos()) {
            let _ = m.record(now / 1_000_000_000);
        }
        if let Some(queue) = shared.queue {
            let _ = proxy_wasm::hostcalls::enqueue_shared_queue(queue, Some(b"tick"));
        }
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        queue_ready(&self.shared, queue_id);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request {
            id: context_id,
            shared: self.shared.clone(),
            body_callbacks: 0,
            path: String::new(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// The Redis reply handler: resumes the request that waits for `token`.
fn on_redis_reply(shared: &Rc<RefCell<Shared>>, response: RedisResponse) {
    let Some(waiting) = shared.borrow_mut().redis.take(response.token) else {
        host::log(LogLevel::Warn, "redis-probe: reply for an unknown token");
        return;
    };
    if host::set_effective_context(waiting.context_id).is_err() {
        return; // the request went away
    }
    if !response.answered() {
        host::log(
            LogLevel::Warn,
            &format!("redis-probe: redis call failed, status {}", response.status),
        );
        refuse(&Reject::new(
            503,
            ErrorType::Api,
            "redis_unavailable",
            "the store is unavailable",
        ));
        return;
    }
    let reply = redis_reply(response.size)
        .ok()
        .and_then(|bytes| resp::decode(&bytes, &resp::Limits::default()).ok());
    let value = match reply {
        Some(Reply::Error(_)) | None => {
            refuse(&Reject::new(
                502,
                ErrorType::Api,
                "redis_error",
                "the store answered with an error",
            ));
            return;
        }
        Some(r) if r.is_null() => "null".to_string(),
        Some(r) => r
            .integer()
            .map_or_else(|| "?".to_string(), |i| i.to_string()),
    };
    let _ = host::set_header(HeaderMap::RequestHeaders, "x-probe-value", value.as_bytes());
    let _ = host::resume_request();
}

struct Request {
    id: u32,
    shared: Rc<RefCell<Shared>>,
    body_callbacks: u32,
    path: String,
}

impl Context for Request {
    fn on_done(&mut self) -> bool {
        let mut shared = self.shared.borrow_mut();
        shared.redis.forget_context(self.id);
        shared.holds.forget_context(self.id);
        true
    }

    fn on_http_call_response(&mut self, token: u32, _: usize, _: usize, _: usize) {
        let held = self.shared.borrow_mut().holds.take(token);
        let Some(held) = held else { return };
        let HeldIncrement { key, value, cas } = held.state;
        match increment(&key, Some((value, cas))) {
            Ok((value, retries)) => {
                set_increment_headers(value, retries);
                let _ = host::resume_request();
            }
            Err(e) => refuse(&Reject::internal(format!("shared data: {e}"))),
        }
    }
}

/// Increments `key` with CAS, starting from an earlier read if given; returns the new value
/// and how many CAS mismatches it retried.
fn increment(key: &str, first: Option<(u64, u32)>) -> Result<(u64, u32), HostError> {
    let mut retries = 0;
    let mut read = first;
    loop {
        let (value, cas) = match read.take() {
            Some(r) => r,
            None => current(key)?,
        };
        let next = value.saturating_add(1);
        match host::set_shared_data(key, next.to_string().as_bytes(), cas) {
            Ok(()) => return Ok((next, retries)),
            Err(HostError::CasMismatch) if retries < 16 => retries += 1,
            Err(e) => return Err(e),
        }
    }
}

fn current(key: &str) -> Result<(u64, u32), HostError> {
    let (value, cas) = host::shared_data(key)?;
    let value = value
        .and_then(|v| String::from_utf8(v).ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Ok((value, cas))
}

fn set_increment_headers(value: u64, retries: u32) {
    let _ = host::set_header(
        HeaderMap::RequestHeaders,
        "x-probe-value",
        value.to_string().as_bytes(),
    );
    let _ = host::set_header(
        HeaderMap::RequestHeaders,
        "x-probe-cas-retries",
        retries.to_string().as_bytes(),
    );
}

#[allow(clippy::panic)]
fn trap() -> Action {
    host::log(LogLevel::Info, "redis-probe: about to trap");
    panic!("redis-probe: trap requested")
}

fn verdict(result: Result<(), HostError>) -> String {
    match result {
        Ok(()) => "ok".to_string(),
        Err(e) => e.to_string(),
    }
}

fn refuse(reject: &Reject) {
    let _ = host::send_reject("redis_probe", reject);
}

fn append_path(map: HeaderMap, name: &str) {
    let current = host::header(map, "x-probe-path")
        .ok()
        .flatten()
        .unwrap_or_default();
    let mut next = current;
    if !next.is_empty() {
        next.push(b',');
    }
    next.extend_from_slice(name.as_bytes());
    let _ = host::set_header(map, "x-probe-path", &next);
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _: usize, _: bool) -> Action {
        let name = self.shared.borrow().config.name.clone();
        append_path(HeaderMap::RequestHeaders, &name);
        let path = host::header(HeaderMap::RequestHeaders, ":path")
            .ok()
            .flatten()
            .and_then(|p| String::from_utf8(p).ok())
            .unwrap_or_default();
        self.path.clone_from(&path);
        match route(&path) {
            Route::Other => Action::Continue,
            // released by `Continue` from the last body callback
            Route::HoldHeaders => Action::Pause,
            Route::Trap => trap(),
            Route::Redis { command, key } => {
                let service = self.shared.borrow().config.redis_service.clone();
                let Some(service) = service else {
                    refuse(&Reject::new(
                        503,
                        ErrorType::Api,
                        "redis_unavailable",
                        "no redis",
                    ));
                    return Action::Pause;
                };
                let query = resp::encode_command(&[command, key.as_str()]);
                match redis_call(&service, &query) {
                    Ok(token) => {
                        if self
                            .shared
                            .borrow_mut()
                            .redis
                            .insert(token, self.id, ())
                            .is_err()
                        {
                            refuse(&Reject::internal("too many redis calls in flight"));
                        }
                        Action::Pause
                    }
                    Err(e) => {
                        host::log(LogLevel::Warn, &format!("redis-probe: redis_call: {e}"));
                        refuse(&Reject::new(
                            503,
                            ErrorType::Api,
                            "redis_unavailable",
                            "redis call refused",
                        ));
                        Action::Pause
                    }
                }
            }
            Route::Shared { key } => {
                let hold = host::header(HeaderMap::RequestHeaders, "x-probe-hold")
                    .ok()
                    .flatten()
                    .is_some_and(|v| v == b"1");
                if hold {
                    let (value, cas) = match current(&key) {
                        Ok(read) => read,
                        Err(e) => {
                            refuse(&Reject::internal(format!("shared data: {e}")));
                            return Action::Pause;
                        }
                    };
                    let headers = [
                        (":method", "GET"),
                        (":path", "/hold"),
                        (":authority", "hold"),
                    ];
                    match host::dispatch_http_call("hold", &headers, &[], 1000) {
                        Ok(token) => {
                            let held = HeldIncrement { key, value, cas };
                            let _ = self.shared.borrow_mut().holds.insert(token, self.id, held);
                        }
                        Err(e) => refuse(&Reject::internal(format!("hold call: {e}"))),
                    }
                    return Action::Pause;
                }
                match increment(&key, None) {
                    Ok((value, retries)) => {
                        set_increment_headers(value, retries);
                        Action::Continue
                    }
                    Err(e) => {
                        refuse(&Reject::internal(format!("shared data: {e}")));
                        Action::Pause
                    }
                }
            }
        }
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        self.body_callbacks += 1;
        let name = self.shared.borrow().config.name.clone();
        // a header change after Continue must be refused (Envoy); record what the host said
        let late = verdict(host::set_header(
            HeaderMap::RequestHeaders,
            "x-probe-late",
            b"1",
        ));
        let _ = host::set_property(&["probe", &name, "late_header"], late.as_bytes());
        if !end_of_stream {
            return Action::Pause;
        }
        let body = host::buffer(Buffer::RequestBody, 0, size).unwrap_or_default();
        if let Some(m) = self.shared.borrow().metrics.body_size {
            let _ = m.record(body.len() as u64);
        }
        let _ = host::set_property(
            &["probe", &name, "body_size"],
            body.len().to_string().as_bytes(),
        );
        let _ = host::set_property(
            &["probe", &name, "body_callbacks"],
            self.body_callbacks.to_string().as_bytes(),
        );
        let mut len = body.len();
        if let Ok(Some(replacement)) = host::header(HeaderMap::RequestHeaders, "x-probe-replace") {
            // start 0 with the whole size: replace
            let replaced = verdict(host::set_buffer(Buffer::RequestBody, 0, len, &replacement));
            let _ = host::set_property(&["probe", &name, "replace"], replaced.as_bytes());
            len = replacement.len();
        }
        // neither at 0 nor at the end: Envoy refuses
        if len > 1 {
            let middle = verdict(host::set_buffer(Buffer::RequestBody, 1, 0, b"x"));
            let _ = host::set_property(&["probe", &name, "mid_write"], middle.as_bytes());
        }
        let suffix = format!("|{name}");
        let _ = host::set_buffer(Buffer::RequestBody, len, 0, suffix.as_bytes());
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        let name = self.shared.borrow().config.name.clone();
        append_path(HeaderMap::ResponseHeaders, &name);
        if self.path == "/hold-response" {
            return Action::Pause; // never resumed: only the buffer limit ends it
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, _size: usize, end_of_stream: bool) -> Action {
        if end_of_stream && self.path == "/late-reply" {
            // the response headers went downstream already: Envoy refuses
            let name = self.shared.borrow().config.name.clone();
            let sent = host::send_local_response(418, "probe.late", &[], b"late");
            let _ = host::set_property(&["probe", &name, "late_reply"], verdict(sent).as_bytes());
        }
        if end_of_stream {
            Action::Continue
        } else {
            Action::Pause
        }
    }
}
