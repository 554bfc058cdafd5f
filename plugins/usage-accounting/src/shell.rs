//! The proxy-wasm adapter: copies host data in, feeds [`crate::exchange::Exchange`], applies
//! what it returns, publishes the record. Every host call goes through
//! `llm_gateway_shared::host`; nothing here decides.
//!
//! After an internal redirect (`llm_gateway_shared::reentry`) the superseded pass publishes
//! nothing: its record of a 429/5xx waits for `on_log`, which stashes what the re-entering
//! pass needs ([`Carried`]) instead; that pass publishes the one record of the request.

use crate::config::{parse_document, UsageConfig};
use crate::exchange::{
    may_be_superseded, Attribution, Carried, Exchange, ResponseMode, RouteInfo, ROUTER_PROPERTY,
};
use crate::metrics::{label_suffix, values, Kind, MAX_LABEL_SETS, SERIES};
use crate::record::Record;
use crate::stream::Forward;
use llm_gateway_shared::headers;
use llm_gateway_shared::host::{self, Buffer, HeaderMap, LogLevel, Metric};
use llm_gateway_shared::reentry::{is_superseded, Pass, Stash};
use llm_gateway_shared::rules::RuleSet;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

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

#[derive(Default)]
struct Root {
    state: Option<Rc<State>>,
}

struct State {
    rules: RuleSet<UsageConfig>,
    /// The metrics of each label set seen so far in this VM ([`SERIES`] order).
    series: RefCell<HashMap<String, [Option<Metric>; SERIES.len()]>>,
    /// `llm_gateway.usage.ledger_errors`: ledger appends that failed (Higress build).
    #[cfg_attr(not(feature = "higress"), allow(dead_code))]
    ledger_errors: Option<Metric>,
    /// What superseded passes left for their re-entering pass, by logical request id.
    stash: RefCell<Stash<Carried>>,
}

impl State {
    fn record_metrics(&self, record: &Record, config: &UsageConfig) {
        let mut labels = label_suffix(record, config.consumer_label);
        let mut series = self.series.borrow_mut();
        if series.len() >= MAX_LABEL_SETS && !series.contains_key(&labels) {
            labels = ".tenant._other.model_group._other.deployment._other".into();
        }
        let metrics = series.entry(labels).or_insert_with_key(|labels| {
            SERIES.map(|(base, kind)| {
                let name = format!("{base}{labels}");
                match kind {
                    Kind::Counter => Metric::counter(&name),
                    Kind::Histogram => Metric::histogram(&name),
                }
                .ok()
            })
        });
        for ((metric, (_, kind)), value) in metrics.iter().zip(SERIES).zip(values(record)) {
            let (Some(metric), Some(value)) = (metric, value) else {
                continue;
            };
            let _ = match kind {
                Kind::Counter => metric.increment(i64::try_from(value).unwrap_or(i64::MAX)),
                Kind::Histogram => metric.record(value),
            };
        }
    }
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let Some(rules) = host::load_config("usage-accounting", parse_document) else {
            return false;
        };
        let prices = rules.global().map_or(0, |c| c.prices.len());
        host::log(
            LogLevel::Info,
            &format!("usage-accounting: configured with {prices} prices"),
        );
        let ledger_errors = Metric::counter("llm_gateway.usage.ledger_errors").ok();
        if !ledger::init(&rules, ledger_errors) {
            return false;
        }
        self.state = Some(Rc::new(State {
            rules,
            series: RefCell::new(HashMap::new()),
            ledger_errors,
            stash: RefCell::default(),
        }));
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request {
            state: self.state.clone(),
            active: None,
            ended: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Active {
    exchange: Exchange,
    config: UsageConfig,
    mode: ResponseMode,
    /// The router's state, read once the response is known (the router writes it again at
    /// response headers).
    route: Option<RouteInfo>,
    /// `x-llm-request-id`: the key of this request's stash entry after a redirect.
    logical_id: Option<String>,
}

impl Active {
    fn route(&mut self) -> RouteInfo {
        let status = self.exchange.status();
        self.route.get_or_insert_with(|| route_info(status)).clone()
    }
}

struct Request {
    state: Option<Rc<State>>,
    active: Option<Active>,
    /// The response reached its end, but its record waits for `on_log` (a 429/5xx: the
    /// pass may be superseded).
    ended: bool,
}

fn now_ms() -> u64 {
    host::now_nanos().map_or(0, |n| n / 1_000_000)
}

fn header_text(pairs: &[(String, Vec<u8>)], name: &str) -> String {
    pairs
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| std::str::from_utf8(v).ok())
        .unwrap_or_default()
        .to_string()
}

/// The router's view of the request: its filter state `wasm.llm_route` when it runs in the
/// chain (deployment that answered, attempts, price); otherwise the `x-llm-deployment` /
/// `x-llm-model-group` headers (in [`Attribution`]) and the plugin's own price table.
fn route_info(status: u16) -> RouteInfo {
    host::property(&[ROUTER_PROPERTY])
        .ok()
        .flatten()
        .and_then(|bytes| RouteInfo::from_router_json(&bytes, status))
        .unwrap_or_default()
}

impl Context for Request {
    fn on_http_call_response(
        &mut self,
        _token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        // the only calls this plugin makes are ledger appends over HTTP
        if let Some(state) = &self.state {
            ledger::http_reply(body_size, state.ledger_errors);
        }
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(state) = self.state.clone() else {
            return Action::Continue;
        };
        let Ok(pairs) = host::headers(HeaderMap::RequestHeaders) else {
            return Action::Continue;
        };
        let authority = header_text(&pairs, ":authority");
        let Some(config) = host::select_config(&state.rules, Some(&authority)) else {
            return Action::Continue;
        };
        if header_text(&pairs, ":method") != "POST" {
            return Action::Continue; // listing or fetching stored objects generates nothing
        }
        let path = header_text(&pairs, ":path");
        let attribution = Attribution::from_headers(&pairs, || {
            host::property_string(&["request", "id"]).ok().flatten()
        });
        let now = now_ms();
        let Some(mut exchange) = Exchange::start(&path, attribution, now) else {
            return Action::Continue;
        };
        let logical_id = Some(header_text(&pairs, headers::REQUEST_ID)).filter(|v| !v.is_empty());
        let reentry = pairs.iter().any(|(n, _)| n == headers::REENTRY);
        let adopted =
            state
                .stash
                .borrow_mut()
                .adopt(reentry, logical_id.as_deref().unwrap_or_default(), now);
        match adopted {
            Pass::Reentry(carried) => exchange.adopt(carried),
            Pass::Lost => host::log(
                LogLevel::Warn,
                "usage-accounting: re-entered request without stashed state: accounted as a new one",
            ),
            Pass::First => {}
        }
        exchange.set_request_length(header_text(&pairs, "content-length").trim().parse().ok());
        // The usage is read from the response: ask the provider for it uncompressed (Envoy's
        // compressor filter may compress it again for the client).
        let _ = host::remove_header(HeaderMap::RequestHeaders, "accept-encoding");
        let mut hold = false;
        if exchange.may_rewrite_body(config) && !end_of_stream {
            // The body may grow by `stream_options`: held headers get its new length when it
            // is known; headers that go on now must not announce the old one.
            if config.hold_headers {
                hold = true;
            } else if let Err(err) =
                host::remove_header(HeaderMap::RequestHeaders, "content-length")
            {
                host::log(
                    LogLevel::Warn,
                    &format!("usage-accounting: cannot remove content-length: {err}"),
                );
            }
        }
        self.active = Some(Active {
            exchange,
            config: config.clone(),
            mode: ResponseMode::PassThrough,
            route: None,
            logical_id,
        });
        if hold {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(active) = &mut self.active else {
            return Action::Continue;
        };
        if !active.exchange.may_rewrite_body(&active.config) {
            // nothing to change: the body passes as it comes, the plugin keeps a bounded copy
            if let Ok(chunk) = host::buffer(Buffer::RequestBody, 0, body_size) {
                active.exchange.on_request_data(&chunk);
            }
            if end_of_stream {
                active.exchange.on_request_end();
            }
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause; // Envoy buffers; read the whole body once, at the end
        }
        let Ok(body) = host::buffer(Buffer::RequestBody, 0, body_size) else {
            return Action::Continue;
        };
        if let Some(new_body) = active.exchange.on_request_body(&active.config, &body) {
            // held headers get the new length (without `hold_headers` there is none to fix)
            if let Err(err) = host::replace_request_body(body_size, &new_body) {
                host::log(
                    LogLevel::Warn,
                    &format!("usage-accounting: cannot inject include_usage: {err}"),
                );
            }
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(active) = &mut self.active else {
            return Action::Continue;
        };
        let status = host::header(HeaderMap::ResponseHeaders, ":status")
            .ok()
            .flatten()
            .and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u16>().ok())
            .unwrap_or(0);
        let content_type = host::header(HeaderMap::ResponseHeaders, "content-type")
            .ok()
            .flatten()
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_default();
        let content_length = host::header(HeaderMap::ResponseHeaders, "content-length")
            .ok()
            .flatten()
            .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse::<u64>().ok());
        let encoded = host::header(HeaderMap::ResponseHeaders, "content-encoding")
            .ok()
            .flatten()
            .is_some_and(|v| !v.is_empty() && !v.eq_ignore_ascii_case(b"identity"));
        // a compressed answer cannot be read: it passes through and the record is estimated
        let content_type = if encoded { String::new() } else { content_type };
        let mode = active.exchange.on_response_headers(
            &active.config,
            status,
            &content_type,
            content_length,
        );
        active.mode = mode;
        match mode {
            ResponseMode::Stream if active.exchange.injected_include_usage() => {
                // chunks may shrink (the hidden usage chunk)
                let _ = host::remove_header(HeaderMap::ResponseHeaders, "content-length");
                Action::Continue
            }
            ResponseMode::Buffer { hold_headers: true } if !end_of_stream => Action::Pause,
            _ => Action::Continue,
        }
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(active) = &mut self.active else {
            return Action::Continue;
        };
        match active.mode {
            ResponseMode::PassThrough => {
                if end_of_stream {
                    self.response_ended();
                }
                Action::Continue
            }
            ResponseMode::Stream => {
                let Ok(chunk) = host::buffer(Buffer::ResponseBody, 0, body_size) else {
                    return Action::Continue;
                };
                // the clock only matters for the first output (time to first token)
                let now = if active.exchange.awaits_first_output() {
                    now_ms()
                } else {
                    0
                };
                let forward = active
                    .exchange
                    .on_response_chunk(&chunk, end_of_stream, now);
                if let Forward::Replace(bytes) = forward {
                    if let Err(err) = host::set_buffer(Buffer::ResponseBody, 0, body_size, &bytes) {
                        host::log(
                            LogLevel::Warn,
                            &format!("usage-accounting: cannot rewrite a stream chunk: {err}"),
                        );
                    }
                }
                if end_of_stream {
                    self.response_ended();
                }
                Action::Continue
            }
            ResponseMode::Buffer { hold_headers: true } => {
                if !end_of_stream {
                    return Action::Pause; // Envoy buffers; the headers wait for the cost
                }
                let body = host::buffer(Buffer::ResponseBody, 0, body_size).unwrap_or_default();
                let route = active.route();
                let added = active
                    .exchange
                    .on_response_body(&active.config, &route, &body, true);
                for (name, value) in &added {
                    let _ = host::set_header(HeaderMap::ResponseHeaders, name, value.as_bytes());
                }
                self.response_ended();
                Action::Continue
            }
            ResponseMode::Buffer {
                hold_headers: false,
            } => {
                // passes on as it comes; the plugin keeps a bounded copy to read the usage
                if let Ok(chunk) = host::buffer(Buffer::ResponseBody, 0, body_size) {
                    active.exchange.on_response_data(&chunk);
                }
                if end_of_stream {
                    let route = active.route();
                    active
                        .exchange
                        .on_response_end(&active.config, &route, true);
                    self.response_ended();
                }
                Action::Continue
            }
        }
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        // With trailers the last body callback does not say end_of_stream: end here.
        let Some(active) = &mut self.active else {
            return Action::Continue;
        };
        match active.mode {
            ResponseMode::Stream => {
                // a well-formed stream ends with a blank line, so nothing is held back here
                let _ = active.exchange.on_response_chunk(&[], true, now_ms());
            }
            ResponseMode::Buffer { hold_headers: true } if !active.exchange.is_finished() => {
                let body = host::buffer(Buffer::ResponseBody, 0, usize::MAX).unwrap_or_default();
                let route = active.route();
                let added = active
                    .exchange
                    .on_response_body(&active.config, &route, &body, true);
                for (name, value) in &added {
                    let _ = host::set_header(HeaderMap::ResponseHeaders, name, value.as_bytes());
                }
            }
            ResponseMode::Buffer {
                hold_headers: false,
            } => {
                let route = active.route();
                active
                    .exchange
                    .on_response_end(&active.config, &route, true);
            }
            _ => {}
        }
        self.response_ended();
        Action::Continue
    }

    fn on_log(&mut self) {
        let details = host::property_string(&["response", "code_details"])
            .ok()
            .flatten();
        if is_superseded(details.as_deref()) {
            self.hand_over();
            return;
        }
        // A response that never reached its end (cut stream, client gone) is recorded now,
        // and so is a failure that waited to see whether it was superseded.
        self.publish(self.ended);
    }
}

impl Request {
    /// The response reached its end: publish, unless its status may yet be superseded by an
    /// internal redirect (then `on_log` decides).
    fn response_ended(&mut self) {
        let wait = self
            .active
            .as_ref()
            .is_some_and(|a| may_be_superseded(a.exchange.status()));
        if wait {
            self.ended = true;
        } else {
            self.publish(true);
        }
    }

    /// A superseded pass: no record, no metrics; the next pass gets what it needs.
    fn hand_over(&mut self) {
        let (Some(state), Some(active)) = (self.state.as_ref(), self.active.as_ref()) else {
            return;
        };
        let Some(id) = active.logical_id.as_deref() else {
            return; // no logical id: nothing could find it
        };
        let _ = state
            .stash
            .borrow_mut()
            .put(id, active.exchange.carried(), now_ms());
    }

    /// Builds the record once and publishes it: filter state, log line, metrics.
    fn publish(&mut self, complete: bool) {
        let (Some(state), Some(active)) = (self.state.clone(), self.active.as_mut()) else {
            return;
        };
        let route = active.route();
        let Some(record) = active
            .exchange
            .finish(&active.config, &route, complete, now_ms())
        else {
            return;
        };
        let json = record.to_json();
        if let Err(err) =
            host::set_property(&[active.config.filter_state.as_str()], json.as_bytes())
        {
            host::log(
                LogLevel::Warn,
                &format!("usage-accounting: cannot set filter state: {err}"),
            );
        }
        if active.config.log_records {
            host::log(LogLevel::Info, &format!("usage_record: {json}"));
        }
        state.record_metrics(&record, &active.config);
        if let Some(config) = &active.config.ledger {
            ledger::append(config, &json, state.ledger_errors);
        }
    }
}

/// The Redis stream ledger: one `XADD … MAXLEN ~` per record, fire and forget (nothing waits
/// for the reply; a failure is counted and logged). Through Higress's Redis calls (Higress
/// build) or over HTTP to webdis. Over HTTP the SDK hands the answer to the request's context,
/// and drops it if that context has finished: an append sent from `on_log` is still carried
/// out (the host makes the call on the root context), but its failure is then not counted.
mod ledger {
    use crate::config::UsageConfig;
    use crate::ledger::{xadd_args, LedgerConfig, LedgerTransport};
    use llm_gateway_shared::host::webdis::{self, HttpRedis};
    use llm_gateway_shared::host::{self, LogLevel, Metric};
    use llm_gateway_shared::resp::{self, Limits};
    use llm_gateway_shared::rules::RuleSet;

    /// Connects every distinct Higress ledger service of the configuration (once per VM) and
    /// registers the reply handler. False if the host refuses a service.
    pub(super) fn init(rules: &RuleSet<UsageConfig>, errors: Option<Metric>) -> bool {
        let higress: Vec<&LedgerConfig> = rules
            .configs()
            .filter_map(|c| c.ledger.as_ref())
            .filter(|l| l.transport == LedgerTransport::Higress)
            .collect();
        if higress.is_empty() {
            return true;
        }
        init_higress(&higress, errors)
    }

    #[cfg(feature = "higress")]
    fn init_higress(configs: &[&LedgerConfig], errors: Option<Metric>) -> bool {
        use llm_gateway_shared::host::redis::{on_redis_call_response, redis_init, redis_reply};
        let mut done: Vec<&str> = Vec::new();
        for config in configs {
            if done.contains(&config.service.as_str()) {
                continue;
            }
            done.push(&config.service);
            let user = config.username.as_deref().unwrap_or_default();
            let password = config.password.as_deref().unwrap_or_default();
            if let Err(err) = redis_init(&config.service, user, password, config.timeout_ms) {
                host::log(
                    LogLevel::Error,
                    &format!(
                        "usage-accounting: ledger: cannot connect Redis service {}: {err}",
                        config.service
                    ),
                );
                return false;
            }
        }
        on_redis_call_response(move |response| {
            let reply = if response.answered() {
                Ok(redis_reply(response.size).unwrap_or_default())
            } else {
                Err(format!("call failed (status {})", response.status))
            };
            check(reply, errors);
        });
        true
    }

    #[cfg(not(feature = "higress"))]
    fn init_higress(_configs: &[&LedgerConfig], _errors: Option<Metric>) -> bool {
        false // refused by the config parser already
    }

    /// Counts and logs a failed append (an error reply included).
    fn check(reply: Result<Vec<u8>, String>, errors: Option<Metric>) {
        let failed = match reply {
            Ok(reply) => match resp::decode(&reply, &Limits::default()) {
                Ok(reply) => reply.error().map(str::to_owned),
                Err(err) => Some(err.to_string()),
            },
            Err(why) => Some(why),
        };
        if let Some(why) = failed {
            if let Some(metric) = errors {
                let _ = metric.increment(1);
            }
            host::log(
                LogLevel::Warn,
                &format!("usage-accounting: ledger append failed: {why}"),
            );
        }
    }

    /// A webdis answer to an append.
    pub(super) fn http_reply(body_size: usize, errors: Option<Metric>) {
        check(webdis::reply(body_size).map_err(|e| e.to_string()), errors);
    }

    /// Sends the `XADD` of one record.
    pub(super) fn append(config: &LedgerConfig, record_json: &str, errors: Option<Metric>) {
        let args = xadd_args(config, record_json);
        let sent = match &config.transport {
            LedgerTransport::Http { authorization } => {
                let to = HttpRedis {
                    cluster: config.service.clone(),
                    authorization: authorization.clone(),
                    timeout_ms: config.timeout_ms,
                };
                webdis::send(&to, &args).map(|_| ())
            }
            LedgerTransport::Higress => send_higress(&config.service, &resp::encode_command(&args)),
        };
        if let Err(err) = sent {
            if let Some(metric) = errors {
                let _ = metric.increment(1);
            }
            host::log(
                LogLevel::Warn,
                &format!("usage-accounting: ledger append not sent: {err}"),
            );
        }
    }

    #[cfg(feature = "higress")]
    fn send_higress(service: &str, query: &[u8]) -> Result<(), host::HostError> {
        llm_gateway_shared::host::redis::redis_call(service, query).map(|_| ())
    }

    #[cfg(not(feature = "higress"))]
    fn send_higress(_service: &str, _query: &[u8]) -> Result<(), host::HostError> {
        Err(host::HostError::Unimplemented)
    }
}
