//! The proxy-wasm adapter: reads bodies from the host, calls the pure core
//! ([`crate::request::redact_body`], [`crate::response`]), writes the results back. Every host
//! call goes through `llm_gateway_shared::host`; nothing here decides what is personal data.
//!
//! The placeholder map lives in the HTTP context and goes away with it — except when an
//! internal redirect supersedes the pass (`llm_gateway_shared::reentry`): `on_log` then
//! stashes it in the VM under `x-llm-request-id`, and the pass that re-enters with
//! `x-llm-reentry` takes it back ([`crate::request::redact_pass`]). Logs and metrics carry
//! rule names and counts, never a value.

use crate::config::{parse_document, BodyScope, Oversize, PiiConfig};
use crate::mask::{Action, PlaceholderMap};
use crate::request::{redact_pass, Api, Carried, Redaction};
use crate::response::{redact_output_body, restore_body, SseRestorer};
use llm_gateway_shared::headers;
use llm_gateway_shared::host::{self, Buffer, HeaderMap, LogLevel, Metric};
use llm_gateway_shared::reentry::{is_superseded, Pass, Stash};
use llm_gateway_shared::reject::{ErrorType, Reject};
use llm_gateway_shared::rules::RuleSet;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action as Next, ContextType};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

const PLUGIN: &str = "pii_redaction";

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

/// Counters (Envoy stats `wasmcustom.llm_gateway.pii.*`): matches and blocks per rule name,
/// and the outcomes of the size policy and of restoring.
struct Metrics {
    matches: HashMap<String, Metric>,
    output_matches: HashMap<String, Metric>,
    blocked: HashMap<String, Metric>,
    redacted: Option<Metric>,
    oversize_passed: Option<Metric>,
    oversize_rejected: Option<Metric>,
    invalid_json: Option<Metric>,
    restored: Option<Metric>,
    restore_skipped: Option<Metric>,
}

impl Metrics {
    fn define(rules: &RuleSet<Rc<PiiConfig>>) -> Self {
        let counter = |name: &str| Metric::counter(name).ok();
        let mut matches = HashMap::new();
        let mut blocked = HashMap::new();
        let mut output_matches = HashMap::new();
        for config in rules.configs() {
            for rule in config.output.iter().flat_map(|o| o.rules()) {
                if !output_matches.contains_key(&rule.name) {
                    let metric_name = rule.name.to_ascii_lowercase();
                    if let Some(m) =
                        counter(&format!("llm_gateway.pii.output_matches.{metric_name}"))
                    {
                        output_matches.insert(rule.name.clone(), m);
                    }
                }
            }
            for rule in config.redactor.rules() {
                let metric_name = rule.name.to_ascii_lowercase();
                let table = if rule.action == Action::Block {
                    &mut blocked
                } else {
                    &mut matches
                };
                if !table.contains_key(&rule.name) {
                    let kind = if rule.action == Action::Block {
                        "blocked"
                    } else {
                        "matches"
                    };
                    if let Some(m) = counter(&format!("llm_gateway.pii.{kind}.{metric_name}")) {
                        table.insert(rule.name.clone(), m);
                    }
                }
            }
        }
        Metrics {
            matches,
            output_matches,
            blocked,
            redacted: counter("llm_gateway.pii.requests_redacted"),
            oversize_passed: counter("llm_gateway.pii.oversize_passed"),
            oversize_rejected: counter("llm_gateway.pii.oversize_rejected"),
            invalid_json: counter("llm_gateway.pii.invalid_json"),
            restored: counter("llm_gateway.pii.responses_restored"),
            restore_skipped: counter("llm_gateway.pii.restore_skipped_encoded"),
        }
    }
}

fn bump(metric: Option<&Metric>, delta: u64) {
    if let Some(m) = metric {
        let _ = m.increment(i64::try_from(delta).unwrap_or(i64::MAX));
    }
}

#[derive(Default)]
struct Root {
    state: Option<Rc<State>>,
}

struct State {
    rules: RuleSet<Rc<PiiConfig>>,
    metrics: Metrics,
    /// Maps of superseded passes, waiting for their re-entering pass (never logged).
    stash: RefCell<Stash<Carried>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let Some(rules) = host::load_config("pii-redaction", parse_document) else {
            return false;
        };
        let count = rules.global().map_or(0, |c| c.redactor.rules().len());
        host::log(
            LogLevel::Info,
            &format!("pii-redaction: configured with {count} rules"),
        );
        let metrics = Metrics::define(&rules);
        self.state = Some(Rc::new(State {
            rules,
            metrics,
            stash: RefCell::default(),
        }));
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request {
            state: self.state.clone(),
            config: None,
            api: Api::Other,
            scan: false,
            map: PlaceholderMap::default(),
            counted: HashMap::new(),
            response: Response::Pass,
            logical_id: None,
            carried: None,
            forwarded: None,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

enum Response {
    /// Nothing to restore (or cannot: encoded body).
    Pass,
    /// A JSON body, restored whole at its end.
    Json,
    /// An SSE stream, restored chunk by chunk.
    Sse(Box<SseRestorer>),
}

struct Request {
    state: Option<Rc<State>>,
    config: Option<Rc<PiiConfig>>,
    api: Api,
    /// The request body is read and redacted.
    scan: bool,
    map: PlaceholderMap,
    /// Matches per rule name counted on the request side (the rest are output matches).
    counted: HashMap<String, u64>,
    response: Response,
    /// `x-llm-request-id`: where `on_log` stashes the map if the pass is superseded.
    logical_id: Option<String>,
    /// The fingerprint the superseded pass forwarded (this pass re-entered).
    carried: Option<u64>,
    /// The fingerprint of what this pass forwards.
    forwarded: Option<u64>,
}

impl Context for Request {}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Next {
        let Some(state) = self.state.clone() else {
            return refuse(&Reject::internal("pii-redaction is not configured"));
        };
        let Some(config) = host::select_config(&state.rules, None).cloned() else {
            return Next::Continue;
        };
        self.config = Some(Rc::clone(&config));
        let header = |name: &str| {
            host::header(HeaderMap::RequestHeaders, name)
                .ok()
                .flatten()
                .and_then(|v| String::from_utf8(v).ok())
        };
        self.adopt(
            &state,
            &config,
            header(headers::REQUEST_ID),
            header(headers::REENTRY).is_some(),
        );
        if end_of_stream {
            return Next::Continue; // no body
        }
        self.api = Api::from_path(&header(":path").unwrap_or_default());
        if config.scope == BodyScope::Messages {
            // multipart uploads and other non-JSON bodies carry no chat messages
            let content_type = header("content-type").unwrap_or_default();
            if !content_type.is_empty() && !content_type.to_ascii_lowercase().contains("json") {
                return Next::Continue;
            }
        }
        let declared = header("content-length").and_then(|v| v.trim().parse::<usize>().ok());
        if declared.is_some_and(|len| len > config.max_body_bytes) {
            return self.oversize(&state, &config);
        }
        // A compressed answer could not be restored.
        let restores = config.output.is_some()
            || config
                .redactor
                .rules()
                .iter()
                .any(|r| r.action == Action::Mask { restore: true });
        let mut remove = Vec::with_capacity(2);
        if restores {
            remove.push("accept-encoding");
        }
        // The body may be rewritten. Held headers get the new length later; headers that go
        // on now must not announce the old one.
        if !config.hold_headers {
            remove.push("content-length");
        }
        for name in remove {
            if let Err(err) = host::remove_header(HeaderMap::RequestHeaders, name) {
                host::log(
                    LogLevel::Error,
                    &format!("pii-redaction: cannot remove {name}: {err}"),
                );
                return refuse(&Reject::internal("cannot prepare the request"));
            }
        }
        self.scan = true;
        if config.hold_headers {
            Next::Pause
        } else {
            Next::Continue
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Next {
        if !self.scan {
            return Next::Continue;
        }
        let (Some(state), Some(config)) = (self.state.clone(), self.config.clone()) else {
            return Next::Continue;
        };
        if body_size > config.max_body_bytes {
            self.scan = false;
            return self.oversize(&state, &config);
        }
        if !end_of_stream {
            return Next::Pause; // buffer until the whole body is here
        }
        self.scan = false;
        let body = match host::buffer(Buffer::RequestBody, 0, body_size) {
            Ok(body) => body,
            Err(err) => {
                host::log(
                    LogLevel::Error,
                    &format!("pii-redaction: cannot read the request body: {err}"),
                );
                return refuse(&Reject::internal("cannot read the request"));
            }
        };
        // a re-entering pass's map already counted the first pass's matches
        let before: HashMap<String, u64> = self
            .map
            .counts()
            .map(|(name, count)| (name.to_owned(), count))
            .collect();
        let (outcome, forwarded) =
            redact_pass(&config, self.api, &body, &mut self.map, self.carried);
        self.forwarded = forwarded;
        for (name, count) in self.map.counts() {
            let new = count.saturating_sub(before.get(name).copied().unwrap_or(0));
            bump(state.metrics.matches.get(name), new);
            self.counted.insert(name.to_owned(), count);
        }
        match outcome {
            Redaction::Unchanged => Next::Continue,
            Redaction::Rewritten(new_body) => {
                bump(state.metrics.redacted.as_ref(), 1);
                // held headers get the new length; otherwise `content-length` is gone already
                let replaced = if config.hold_headers {
                    host::replace_request_body(body_size, &new_body)
                } else {
                    host::set_buffer(Buffer::RequestBody, 0, body_size, &new_body)
                };
                match replaced {
                    Ok(()) => Next::Continue,
                    Err(err) => {
                        // never forward what could not be redacted
                        host::log(
                            LogLevel::Error,
                            &format!("pii-redaction: cannot replace the request body: {err}"),
                        );
                        refuse(&Reject::internal("cannot redact the request"))
                    }
                }
            }
            Redaction::Blocked(blocked) => {
                bump(state.metrics.blocked.get(&blocked.rule), 1);
                host::log(
                    LogLevel::Info,
                    &format!("pii-redaction: blocked by rule {}", blocked.rule),
                );
                refuse(&Reject::bad_request(
                    format!("pii_blocked_{}", blocked.rule.to_ascii_lowercase()),
                    format!(
                        "the request contains data that rule {} does not allow to be sent",
                        blocked.rule
                    ),
                ))
            }
            Redaction::Invalid(err) => {
                bump(state.metrics.invalid_json.as_ref(), 1);
                refuse(&Reject::bad_request(
                    "invalid_json",
                    format!("the request body is not valid JSON: {err}"),
                ))
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Next {
        let output = self.config.as_ref().and_then(|c| c.output.clone());
        if end_of_stream || !(self.map.has_restorable() || output.is_some()) {
            return Next::Continue;
        }
        let header = |name: &str| {
            host::header(HeaderMap::ResponseHeaders, name)
                .ok()
                .flatten()
                .map(|v| String::from_utf8_lossy(&v).to_ascii_lowercase())
        };
        if header("content-encoding").is_some_and(|e| e.trim() != "identity") {
            if let Some(state) = &self.state {
                bump(state.metrics.restore_skipped.as_ref(), 1);
            }
            return Next::Continue;
        }
        let content_type = header("content-type").unwrap_or_default();
        self.response = if content_type.contains("text/event-stream") {
            Response::Sse(Box::new(SseRestorer::with_output(output)))
        } else if content_type.contains("json") {
            Response::Json
        } else {
            return Next::Continue;
        };
        if let Err(err) = host::remove_header(HeaderMap::ResponseHeaders, "content-length") {
            host::log(
                LogLevel::Warn,
                &format!("pii-redaction: cannot remove content-length, not restoring: {err}"),
            );
            self.response = Response::Pass;
        }
        Next::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Next {
        match &mut self.response {
            Response::Pass => Next::Continue,
            Response::Json => {
                if !end_of_stream {
                    return Next::Pause;
                }
                let Ok(body) = host::buffer(Buffer::ResponseBody, 0, body_size) else {
                    return Next::Continue;
                };
                let output = self.config.as_ref().and_then(|c| c.output.as_ref());
                let redacted =
                    output.and_then(|output| redact_output_body(output, &mut self.map, &body));
                let restored = match restore_body(&self.map, redacted.as_deref().unwrap_or(&body)) {
                    Some(restored) => Some(restored),
                    None => redacted,
                };
                if let Some(restored) = restored {
                    if host::set_buffer(Buffer::ResponseBody, 0, body_size, &restored).is_ok() {
                        if let Some(state) = &self.state {
                            bump(state.metrics.restored.as_ref(), 1);
                        }
                    }
                }
                self.count_output();
                Next::Continue
            }
            Response::Sse(restorer) => {
                let chunk = if body_size == 0 {
                    Vec::new()
                } else {
                    match host::buffer(Buffer::ResponseBody, 0, body_size) {
                        Ok(chunk) => chunk,
                        Err(_) => return Next::Continue,
                    }
                };
                let mut out = restorer.push(&mut self.map, &chunk);
                if end_of_stream {
                    out.extend(restorer.finish(&mut self.map));
                    if let Some(state) = &self.state {
                        bump(state.metrics.restored.as_ref(), 1);
                    }
                    self.count_output();
                }
                if out != chunk {
                    if let Err(err) = host::set_buffer(Buffer::ResponseBody, 0, body_size, &out) {
                        host::log(
                            LogLevel::Warn,
                            &format!("pii-redaction: cannot rewrite a stream chunk: {err}"),
                        );
                    }
                }
                Next::Continue
            }
        }
    }

    fn on_log(&mut self) {
        let details = host::property_string(&["response", "code_details"])
            .ok()
            .flatten();
        if !is_superseded(details.as_deref()) {
            return;
        }
        let (Some(state), Some(id)) = (&self.state, self.logical_id.as_deref()) else {
            return;
        };
        let carried = Carried {
            map: std::mem::take(&mut self.map),
            forwarded: self.forwarded,
        };
        let _ = state.stash.borrow_mut().put(id, carried, now_ms());
    }
}

fn now_ms() -> u64 {
    host::now_nanos().map_or(0, |n| n / 1_000_000)
}

impl Request {
    /// Where this pass starts: afresh, or — re-entering after an internal redirect — from
    /// the map the superseded pass stashed.
    fn adopt(&mut self, state: &State, config: &PiiConfig, id: Option<String>, reentry: bool) {
        let id = id.filter(|id| !id.is_empty());
        let adopted =
            state
                .stash
                .borrow_mut()
                .adopt(reentry, id.as_deref().unwrap_or_default(), now_ms());
        self.logical_id = id;
        match adopted {
            Pass::Reentry(carried) => {
                self.map = match config.scope {
                    BodyScope::RawBody => carried.map.carried_over(),
                    BodyScope::Messages => carried.map,
                };
                self.carried = carried.forwarded;
            }
            Pass::Lost => host::log(
                LogLevel::Warn,
                "pii-redaction: re-entered request without a stashed map: masked afresh",
            ),
            Pass::First => {}
        }
    }

    /// Counts the matches of output rules (those not counted on the request side).
    fn count_output(&self) {
        let Some(state) = &self.state else { return };
        for (name, count) in self.map.counts() {
            let before = self.counted.get(name).copied().unwrap_or(0);
            bump(
                state.metrics.output_matches.get(name),
                count.saturating_sub(before),
            );
        }
    }

    /// The size policy for a body above `max_body_bytes`.
    fn oversize(&mut self, state: &State, config: &PiiConfig) -> Next {
        match config.oversize {
            Oversize::Reject => {
                bump(state.metrics.oversize_rejected.as_ref(), 1);
                refuse(&Reject::new(
                    413,
                    ErrorType::InvalidRequest,
                    "request_too_large",
                    format!(
                        "the request body is larger than {} bytes, the most the gateway scans for personal data",
                        config.max_body_bytes
                    ),
                ))
            }
            Oversize::Pass => {
                bump(state.metrics.oversize_passed.as_ref(), 1);
                host::log(
                    LogLevel::Warn,
                    "pii-redaction: body above max_body_bytes forwarded unscanned (oversize: pass)",
                );
                Next::Continue
            }
        }
    }
}

/// Sends the local reply and stops the filter chain.
fn refuse(reject: &Reject) -> Next {
    if let Err(err) = host::send_reject(PLUGIN, reject) {
        host::log(
            LogLevel::Error,
            &format!("pii-redaction: cannot send the local reply: {err}"),
        );
    }
    Next::Pause
}
