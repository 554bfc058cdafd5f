//! The proxy-wasm adapter: copies host data into the stage core ([`crate::core`]) and carries
//! its commands out: header and body edits, the record published to filter state, the log,
//! the metrics and the ledger (Higress's Redis calls or webdis). Every host call goes through
//! `llm_gateway_shared::host`; nothing here decides.

use crate::config::{parse_shared, UsageConfig};
use crate::core::{Flow, Input, Lookup, Publish, Stage, Worker};
use crate::metrics::{
    translated_name, values, Kind, LabelHash, Labels, MAX_LABEL_SETS, MAX_TRANSLATIONS, SERIES,
};
use crate::record::Record;
use llm_gateway_shared::chain::{self, Direction, Step};
use llm_gateway_shared::host::{self, Buffer, HeaderMap, HostError, LogLevel, Metric, Sink};
use llm_gateway_shared::reentry::is_superseded;
use llm_gateway_shared::request::RequestHead;
use llm_gateway_shared::route_info::{self, RouteInfo};
use llm_gateway_shared::rules::RuleSet;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::convert::Infallible;
use std::rc::Rc;

/// The plugin's name in local replies' details (usage-accounting sends none).
const PLUGIN: &str = "usage_accounting";

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
    rules: RuleSet<Rc<UsageConfig>>,
    /// The metrics of each label set seen so far in this VM ([`SERIES`] order).
    series: RefCell<HashMap<Labels, [Option<Metric>; SERIES.len()], LabelHash>>,
    /// The `llm_gateway.usage.translated.*` counters defined so far in this VM, by name.
    translations: RefCell<Vec<(String, Option<Metric>)>>,
    /// `llm_gateway.usage.ledger_errors`: ledger appends that failed.
    ledger_errors: Option<Metric>,
    /// The shared queue through which requests hand their webdis appends to the root context
    /// (`None`: no HTTP ledger, or the host has no queue: requests send them themselves).
    ledger_queue: Option<u32>,
    /// What superseded passes left for their re-entering pass (the core's per-worker state).
    worker: RefCell<Worker>,
}

impl State {
    fn record_metrics(&self, record: &Record, provider: Option<&str>, config: &UsageConfig) {
        let mut labels = Labels::of(record, provider, config.consumer_label);
        let mut series = self.series.borrow_mut();
        if series.len() >= MAX_LABEL_SETS && !series.contains_key(&labels) {
            labels = Labels::other(config.consumer_label);
        }
        let metrics = series.entry(labels).or_insert_with_key(|labels| {
            SERIES.map(|(base, kind, scope)| {
                let name = labels.name(base, scope);
                match kind {
                    Kind::Counter => Metric::counter(&name),
                    Kind::Histogram => Metric::histogram(&name),
                }
                .ok()
            })
        });
        for ((metric, (_, kind, _)), value) in metrics.iter().zip(SERIES).zip(values(record)) {
            let (Some(metric), Some(value)) = (metric, value) else {
                continue;
            };
            let _ = match kind {
                Kind::Counter => metric.increment(i64::try_from(value).unwrap_or(i64::MAX)),
                Kind::Histogram => metric.record(value),
            };
        }
        // only a translated record gets here: an untranslated one costs no host call more
        if let Some(name) = translated_name(record) {
            let mut translations = self.translations.borrow_mut();
            let metric = match translations.iter().position(|(n, _)| *n == name) {
                Some(at) => translations.get(at).and_then(|(_, metric)| *metric),
                None if translations.len() < MAX_TRANSLATIONS => {
                    let metric = Metric::counter(&name).ok();
                    translations.push((name, metric));
                    metric
                }
                None => None,
            };
            if let Some(metric) = metric {
                let _ = metric.increment(1);
            }
        }
    }
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        _token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        // the ledger appends the root sent for the requests (`on_queue_ready`)
        if let Some(state) = &self.state {
            ledger::http_reply(body_size, state.ledger_errors);
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let Some(rules) = host::load_config("usage-accounting", parse_shared) else {
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
        let ledger_queue = ledger::register_queue(&rules);
        self.state = Some(Rc::new(State {
            rules,
            series: RefCell::new(HashMap::default()),
            translations: RefCell::default(),
            ledger_errors,
            ledger_queue,
            worker: RefCell::default(),
        }));
        true
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        if let Some(state) = &self.state {
            if state.ledger_queue == Some(queue_id) {
                ledger::drain_queue(queue_id, &state.rules, state.ledger_errors);
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request {
            state: self.state.clone(),
            stage: Stage::default(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Request {
    state: Option<Rc<State>>,
    stage: Stage,
}

fn now_ms() -> u64 {
    host::time_nanos() / 1_000_000
}

/// The host values the core reads only when it needs them; in the fused filter, the clock is
/// read once per callback for all stages ([`host::clock`]).
struct Host<'a>(Option<&'a chain::Exchange>);

impl<'a> Host<'a> {
    fn of(target: &'a Sink<'_>) -> Host<'a> {
        match target {
            Sink::Host => Host(None),
            Sink::Fused(x) => Host(Some(&**x)),
        }
    }
}

impl Lookup for Host<'_> {
    fn now_ms(&mut self) -> u64 {
        match self.0 {
            Some(x) => host::clock(x) / 1_000_000,
            None => now_ms(),
        }
    }

    /// The router's view of the request: its filter state `wasm.llm_route` when it runs in
    /// the chain (deployment that answered, attempts, price); otherwise `None` (the
    /// `x-llm-deployment` / `x-llm-model-group` headers and the plugin's own price table).
    fn route(&mut self) -> Option<RouteInfo> {
        // always from the host: the clusters' filter rewrites it once an attempt answers
        host::property(&[route_info::PROPERTY])
            .ok()
            .flatten()
            .and_then(|bytes| RouteInfo::from_json(&bytes))
    }

    fn host_request_id(&mut self) -> Option<String> {
        host::property_string(&["request", "id"]).ok().flatten()
    }
}

/// Hands `input` to the core, then the one driver carries out its commands; the core's flow.
fn drive(state: &State, stage: &mut Stage, input: Input<'_>, target: &mut Sink<'_>) -> Flow {
    let flow = stage.handle(&mut state.worker.borrow_mut(), &mut Host::of(target), input);
    host::stage::carry(stage, flow, target, PLUGIN, state)
}

impl Request {
    /// Hands `input` to the core and carries out its commands; the callback's action.
    fn run(&mut self, input: Input<'_>) -> Action {
        let Some(state) = self.state.clone() else {
            return Action::Continue;
        };
        match drive(&state, &mut self.stage, input, &mut Sink::Host) {
            Flow::Continue => Action::Continue,
            Flow::Pause | Flow::Refused => Action::Pause,
        }
    }
}

/// What only usage-accounting asks of the host: publishing a record.
impl host::stage::Plugin<Stage> for State {
    fn count(&self, never: &Infallible, _: u64) {
        match *never {}
    }

    fn own(&self, publish: &Publish, target: &mut Sink<'_>) -> Result<(), HostError> {
        let Publish {
            record,
            json,
            config,
            provider,
        } = publish;
        let published = host::set_property(&[config.filter_state.as_str()], json.as_bytes());
        if let (Ok(()), Sink::Fused(x)) = (&published, &mut *target) {
            // a later stage (token-ratelimit's settlement) reads it from here
            x.publish(&config.filter_state, json.as_bytes());
        }
        if config.log_records {
            let mut line = String::with_capacity(json.len() + 14);
            line.push_str("usage_record: ");
            line.push_str(json);
            host::log(LogLevel::Info, &line);
        }
        self.record_metrics(record, provider.as_deref(), config);
        if let Some(ledger) = &config.ledger {
            ledger::submit(
                ledger,
                config,
                json,
                &self.rules,
                self.ledger_queue,
                self.ledger_errors,
            );
        }
        published
    }
}

fn header_bytes(name: &str) -> Option<Vec<u8>> {
    host::header(HeaderMap::ResponseHeaders, name)
        .ok()
        .flatten()
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
        let Ok(head) = host::request_head() else {
            return Action::Continue;
        };
        let config = host::select_config(&state.rules, Some(&head.authority)).cloned();
        self.run(Input::RequestHeaders {
            config,
            head: &head,
            end_of_stream,
        })
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.stage.is_active() {
            return Action::Continue;
        }
        let body = if self.stage.wants_request_body(end_of_stream) {
            host::buffer(Buffer::RequestBody, 0, body_size).ok()
        } else {
            None
        };
        self.run(Input::RequestBody {
            size: body_size,
            end_of_stream,
            body: body.as_deref(),
        })
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if !self.stage.is_active() {
            return Action::Continue;
        }
        // read as bytes: only `content-type` is text the core looks at (lossy, as before;
        // borrowed when it is UTF-8). The status is parsed untrimmed, as it always was.
        // Four names, most present: one read of the whole map (one read per name if it fails).
        let view = host::header_view(HeaderMap::ResponseHeaders).ok();
        let header = |name: &str| -> Option<Cow<'_, [u8]>> {
            match &view {
                Some(view) => view.get(name).map(Cow::Borrowed),
                None => header_bytes(name).map(Cow::Owned),
            }
        };
        let status =
            header(":status").and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u16>().ok());
        let content_type = header("content-type").unwrap_or_default();
        let content_type = String::from_utf8_lossy(&content_type);
        let content_length = header("content-length")
            .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse().ok());
        let encoded = header("content-encoding")
            .is_some_and(|v| !v.is_empty() && !v.eq_ignore_ascii_case(b"identity"));
        self.run(Input::ResponseHeaders {
            status: status.unwrap_or(0),
            content_type: &content_type,
            content_length,
            encoded,
            end_of_stream,
        })
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !self.stage.is_active() {
            return Action::Continue;
        }
        let body = if self.stage.wants_response_body(end_of_stream) {
            host::buffer(Buffer::ResponseBody, 0, body_size).ok()
        } else {
            None
        };
        self.run(Input::ResponseBody {
            size: body_size,
            end_of_stream,
            body: body.as_deref(),
        })
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        if !self.stage.is_active() {
            return Action::Continue;
        }
        let body = if self.stage.wants_body_at_trailers() {
            host::buffer(Buffer::ResponseBody, 0, usize::MAX).ok()
        } else {
            None
        };
        self.run(Input::ResponseTrailers {
            body: body.as_deref(),
        })
    }

    fn on_log(&mut self) {
        if !self.stage.is_active() {
            return;
        }
        let superseded = self.stage.watches_supersession()
            && is_superseded(
                host::property_string(&["response", "code_details"])
                    .ok()
                    .flatten()
                    .as_deref(),
            );
        self.run(Input::Log { superseded });
    }
}

mod fused;
mod ledger;
pub use fused::{Fused, FusedStage};
