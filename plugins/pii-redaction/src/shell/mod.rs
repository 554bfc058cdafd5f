//! The proxy-wasm adapter: copies what the host says into the stage core ([`crate::core`]) and
//! carries its commands out. Every host call goes through `llm_gateway_shared::host`; nothing
//! here decides what is personal data, what is refused or what is restored.
//!
//! The placeholder map lives in the core's exchange and goes away with the HTTP context —
//! except when an internal redirect supersedes the pass (`llm_gateway_shared::reentry`): the
//! core then stashes it in the worker under `x-llm-request-id`, and the pass that re-enters
//! with `x-llm-reentry` takes it back. Logs and metrics carry rule names and counts, never a
//! value.

use crate::config::{parse_document, PiiConfig};
use crate::core::{counters, Counter, Exchange, Flow, Input, Worker};
use llm_gateway_shared::chain::{self, Direction, Step};
use llm_gateway_shared::host::{
    self, stage, Buffer, HeaderMap, HostResult, LogLevel, Metric, Sink,
};
use llm_gateway_shared::reentry::is_superseded;
use llm_gateway_shared::request::RequestHead;
use llm_gateway_shared::rules::RuleSet;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action as Next, ContextType};
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
pub fn root_context(_context_id: u32) -> Box<dyn RootContext> {
    Box::new(Root::default())
}

/// The counters ([`crate::core::counters`]), defined once per configuration.
struct Metrics(HashMap<Counter, Metric>);

impl Metrics {
    fn define(rules: &RuleSet<Rc<PiiConfig>>) -> Self {
        let configs: Vec<&PiiConfig> = rules.configs().map(|c| c.as_ref()).collect();
        Metrics(
            counters(configs)
                .into_iter()
                .filter_map(|(counter, name)| Some((counter, Metric::counter(&name).ok()?)))
                .collect(),
        )
    }

    fn count(&self, counter: &Counter, delta: u64) {
        if let Some(metric) = self.0.get(counter) {
            let _ = metric.increment(i64::try_from(delta).unwrap_or(i64::MAX));
        }
    }
}

#[derive(Default)]
struct Root {
    state: Option<Rc<State>>,
}

struct State {
    rules: RuleSet<Rc<PiiConfig>>,
    metrics: Metrics,
    worker: RefCell<Worker>,
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
            worker: RefCell::default(),
        }));
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request {
            state: self.state.clone(),
            exchange: Exchange::default(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Request {
    state: Option<Rc<State>>,
    exchange: Exchange,
}

impl Context for Request {}

/// Hands `input` to the core, then the one driver carries out its commands; the flow.
fn drive(
    state: Option<&State>,
    exchange: &mut Exchange,
    input: Input<'_>,
    target: &mut Sink<'_>,
) -> Flow {
    // only the request headers and the log read the clock (the stash's expiry): the other
    // callbacks, one per streamed event, save the host call
    let now = if input.reads_clock() {
        target.now_nanos() / 1_000_000
    } else {
        0
    };
    let flow = match state {
        Some(state) => exchange.handle(&mut state.worker.borrow_mut(), now, input),
        None => exchange.handle(&mut Worker::default(), now, input),
    };
    stage::carry(exchange, flow, target, PLUGIN, &Effects(state))
}

/// What the driver asks of this plugin: its counters (it has no effects of its own).
struct Effects<'a>(Option<&'a State>);

impl stage::Plugin<Exchange> for Effects<'_> {
    fn count(&self, counter: &Counter, delta: u64) {
        if let Some(state) = self.0 {
            state.metrics.count(counter, delta);
        }
    }

    fn own(&self, effect: &Infallible, _: &mut Sink<'_>) -> HostResult<()> {
        match *effect {}
    }
}

impl Request {
    /// Hands `input` to the core and carries out its commands; the callback's action.
    fn run(&mut self, input: Input<'_>) -> Next {
        match drive(
            self.state.as_deref(),
            &mut self.exchange,
            input,
            &mut Sink::Host,
        ) {
            Flow::Continue => Next::Continue,
            Flow::Pause | Flow::Refused => Next::Pause,
        }
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Next {
        let Some(state) = self.state.clone() else {
            return self.run(Input::RequestHeaders {
                configured: false,
                config: None,
                head: &Default::default(),
                end_of_stream,
            });
        };
        // unreadable headers read as absent ones: the body is still scanned
        let head = host::request_head().unwrap_or_default();
        let Some(config) = host::select_config(&state.rules, Some(&head.authority)).cloned() else {
            return Next::Continue;
        };
        self.run(Input::RequestHeaders {
            configured: true,
            config: Some(config),
            head: &head,
            end_of_stream,
        })
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Next {
        if !self.exchange.wants_request_body(body_size, end_of_stream) {
            return self.run(Input::RequestBody {
                size: body_size,
                end_of_stream,
                body: None,
            });
        }
        match host::buffer(Buffer::RequestBody, 0, body_size) {
            Ok(body) => self.run(Input::RequestBody {
                size: body_size,
                end_of_stream,
                body: Some(&body),
            }),
            Err(err) => {
                host::log(
                    LogLevel::Error,
                    &format!("pii-redaction: cannot read the request body: {err}"),
                );
                self.run(Input::RequestBodyUnreadable)
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Next {
        let header = |name: &str| {
            host::header(HeaderMap::ResponseHeaders, name)
                .ok()
                .flatten()
                .map(|v| String::from_utf8_lossy(&v).into_owned())
        };
        if end_of_stream || !self.exchange.may_restore() {
            return Next::Continue;
        }
        let encoding = header("content-encoding");
        let content_type = header("content-type");
        self.run(Input::ResponseHeaders {
            content_encoding: encoding.as_deref(),
            content_type: content_type.as_deref(),
            end_of_stream,
        })
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Next {
        if !self.exchange.wants_response_body(end_of_stream) {
            return self.run(Input::ResponseBody {
                end_of_stream,
                chunk: None,
            });
        }
        let chunk = if body_size == 0 {
            Vec::new()
        } else {
            match host::buffer(Buffer::ResponseBody, 0, body_size) {
                Ok(chunk) => chunk,
                // unreadable data passes as it is (nothing of the request is in it)
                Err(_) => return Next::Continue,
            }
        };
        self.run(Input::ResponseBody {
            end_of_stream,
            chunk: Some(&chunk),
        })
    }

    fn on_log(&mut self) {
        if !self.exchange.stashes_when_superseded() {
            return;
        }
        let details = host::property_string(&["response", "code_details"])
            .ok()
            .flatten();
        self.run(Input::Log {
            superseded: is_superseded(details.as_deref()),
        });
    }
}

mod fused;
pub use fused::{Fused, FusedStage};
