//! The proxy-wasm adapter: copies what the host says into the stage core ([`crate::core`]) and
//! carries its commands out, the same for the plugin's own filter and its stage of the fused
//! filter (`llm_gateway_shared::host::filter`). Every host call goes through
//! `llm_gateway_shared::host`; nothing here decides what is personal data, what is refused or
//! what is restored.
//!
//! The placeholder map lives in the core's exchange and goes away with the HTTP context —
//! except when an internal redirect supersedes the pass (`llm_gateway_shared::reentry`): the
//! core then stashes it in the worker under `x-llm-request-id`, and the pass that re-enters
//! with `x-llm-reentry` takes it back. Logs and metrics carry rule names and counts, never a
//! value.

use crate::config::{parse_document, PiiConfig};
use crate::core::{counters, Counter, Exchange, Flow, Input, Worker};
use llm_gateway_shared::chain::Direction;
use llm_gateway_shared::config::ConfigError;
use llm_gateway_shared::host::filter::{self, Filter, Turn};
use llm_gateway_shared::host::{self, stage, HostResult, LogLevel, Metric, Sink};
use llm_gateway_shared::reentry::is_superseded;
use llm_gateway_shared::rules::RuleSet;
use proxy_wasm::traits::RootContext;
use std::cell::RefCell;
use std::collections::HashMap;
use std::convert::Infallible;
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
pub fn root_context(context_id: u32) -> Box<dyn RootContext> {
    filter::root_context::<Pii>(context_id)
}

/// This plugin configured from its section of the fused filter's configuration.
pub type Fused = filter::Fused<Pii>;
/// One request's pii-redaction stage in the fused filter.
pub type FusedStage = filter::FusedStage<Pii>;

/// The plugin, as the host registers it.
pub struct Pii;

/// What every request of a configuration shares: its rules, counters and the worker's stash.
pub struct State {
    rules: RuleSet<Rc<PiiConfig>>,
    /// The counters ([`crate::core::counters`]), defined once per configuration.
    metrics: HashMap<Counter, Metric>,
    worker: RefCell<Worker>,
}

impl Filter for Pii {
    const NAME: &'static str = "pii-redaction";
    type Config = RuleSet<Rc<PiiConfig>>;
    type State = State;
    type Stage = Request;

    fn parse(document: &[u8]) -> Result<Self::Config, ConfigError> {
        parse_document(document)
    }

    fn state(rules: Self::Config, fused: bool) -> Option<State> {
        if !fused {
            let count = rules.global().map_or(0, |c| c.redactor.rules().len());
            let line = format!("pii-redaction: configured with {count} rules");
            host::log(LogLevel::Info, &line);
        }
        let configs: Vec<&PiiConfig> = rules.configs().map(|c| c.as_ref()).collect();
        let metrics = counters(configs)
            .into_iter()
            .filter_map(|(counter, name)| Some((counter, Metric::counter(&name).ok()?)))
            .collect();
        Some(State {
            rules,
            metrics,
            worker: RefCell::default(),
        })
    }

    fn stage(state: Option<&Rc<State>>) -> Request {
        Request {
            state: state.cloned(),
            exchange: Exchange::default(),
        }
    }
}

/// One request's stage.
pub struct Request {
    /// `None`: the plugin has no valid configuration (its own filter refuses every request).
    state: Option<Rc<State>>,
    exchange: Exchange,
}

/// What the driver asks of this plugin: its counters (it has no effects of its own).
struct Effects<'a>(Option<&'a State>);

impl stage::Plugin<Exchange> for Effects<'_> {
    fn count(&self, counter: &Counter, delta: u64) {
        if let Some(metric) = self.0.and_then(|state| state.metrics.get(counter)) {
            let _ = metric.increment(i64::try_from(delta).unwrap_or(i64::MAX));
        }
    }

    fn own(&self, effect: &Infallible, _: &mut Sink<'_>) -> HostResult<()> {
        match *effect {}
    }
}

impl Request {
    /// Hands `input` to the core, then the one driver carries out its commands; the flow.
    fn run(&mut self, sink: &mut Sink<'_>, input: Input<'_>) -> Flow {
        // only the request headers and the log read the clock (the stash's expiry): the other
        // callbacks, one per streamed event, save the host call
        let now = if input.reads_clock() {
            sink.now_nanos() / 1_000_000
        } else {
            0
        };
        let state = self.state.as_deref();
        let flow = match state {
            Some(state) => self
                .exchange
                .handle(&mut state.worker.borrow_mut(), now, input),
            None => self.exchange.handle(&mut Worker::default(), now, input),
        };
        stage::carry(&mut self.exchange, flow, sink, PLUGIN, &Effects(state))
    }
}

impl filter::Stage for Request {
    fn request_headers(&mut self, sink: &mut Sink<'_>, end_of_stream: bool) -> Turn {
        let Some(state) = self.state.clone() else {
            let head = Default::default();
            let input = Input::RequestHeaders {
                configured: false,
                config: None,
                head: &head,
                end_of_stream,
            };
            return self.run(sink, input).into();
        };
        // unreadable headers read as absent ones: the body is still scanned
        let head = sink.request_head().unwrap_or_default();
        let Some(config) = host::select_config(&state.rules, Some(&head.authority)).cloned() else {
            return Turn::Continue;
        };
        let input = Input::RequestHeaders {
            configured: true,
            config: Some(config),
            head: &head,
            end_of_stream,
        };
        match self.run(sink, input) {
            // the body is scanned whole
            Flow::Continue if self.exchange.scans_request_body() => Turn::Whole,
            flow => flow.into(),
        }
    }

    fn request_body(&mut self, sink: &mut Sink<'_>, size: usize, end_of_stream: bool) -> Turn {
        if !self.exchange.wants_request_body(size, end_of_stream) {
            let input = Input::RequestBody {
                size,
                end_of_stream,
                body: None,
            };
            return self.run(sink, input).into();
        }
        sink.with_body(Direction::Request, size, |body, sink| match body {
            Ok(body) => {
                let input = Input::RequestBody {
                    size,
                    end_of_stream,
                    body: Some(body),
                };
                self.run(sink, input)
            }
            Err(err) => {
                let line = format!("pii-redaction: cannot read the request body: {err}");
                host::log(LogLevel::Error, &line);
                self.run(sink, Input::RequestBodyUnreadable)
            }
        })
        .into()
    }

    fn response_headers(&mut self, sink: &mut Sink<'_>, end_of_stream: bool) -> Turn {
        if end_of_stream || !self.exchange.may_restore() {
            return Turn::Continue;
        }
        let headers = sink.response_headers();
        let encoding = headers.text("content-encoding").map(|v| v.into_owned());
        let content_type = headers.text("content-type").map(|v| v.into_owned());
        let input = Input::ResponseHeaders {
            content_encoding: encoding.as_deref(),
            content_type: content_type.as_deref(),
            end_of_stream,
        };
        match self.run(sink, input) {
            // a JSON answer is restored whole
            Flow::Continue if self.exchange.restores_whole_response() => Turn::Whole,
            flow => flow.into(),
        }
    }

    fn response_body(&mut self, sink: &mut Sink<'_>, size: usize, end_of_stream: bool) -> Turn {
        if !self.exchange.wants_response_body(end_of_stream) {
            let input = Input::ResponseBody {
                end_of_stream,
                chunk: None,
            };
            return self.run(sink, input).into();
        }
        sink.with_body(Direction::Response, size, |chunk, sink| match chunk {
            Ok(chunk) => {
                let input = Input::ResponseBody {
                    end_of_stream,
                    chunk: Some(chunk),
                };
                self.run(sink, input)
            }
            // unreadable data passes as it is (nothing of the request is in it)
            Err(_) => Flow::Continue,
        })
        .into()
    }

    fn log(&mut self, sink: &mut Sink<'_>) {
        if !self.exchange.stashes_when_superseded() {
            return;
        }
        let superseded = is_superseded(sink.code_details().as_deref());
        self.run(sink, Input::Log { superseded });
    }
}
