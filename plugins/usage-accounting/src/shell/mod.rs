//! The proxy-wasm adapter: copies host data into the stage core ([`crate::core`]) and carries
//! its commands out, the same for the plugin's own filter and its stage of the fused filter
//! (`llm_gateway_shared::host::filter`): header and body edits, the record published to filter
//! state, the log, the metrics and the ledger (Higress's Redis calls or webdis,
//! [`ledger`]). Every host call goes through `llm_gateway_shared::host`; nothing here decides.

use crate::config::{parse_shared, UsageConfig};
use crate::core::{Flow, Input, Lookup, Stage};
use llm_gateway_shared::chain::{self, Direction};
use llm_gateway_shared::config::ConfigError;
use llm_gateway_shared::host::filter::{self, Filter, Turn};
use llm_gateway_shared::host::{self, Sink};
use llm_gateway_shared::reentry::is_superseded;
use llm_gateway_shared::route_info::{self, RouteInfo};
use llm_gateway_shared::rules::RuleSet;
use proxy_wasm::traits::RootContext;
use std::rc::Rc;

mod ledger;
mod state;
use state::State;

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
pub fn root_context(context_id: u32) -> Box<dyn RootContext> {
    filter::root_context::<Usage>(context_id)
}

/// This plugin configured from its section of the fused filter's configuration (a ledger
/// only over HTTP to webdis: the fused filter is for plain Envoy).
pub type Fused = filter::Fused<Usage>;
/// One request's usage-accounting stage in the fused filter.
pub type FusedStage = filter::FusedStage<Usage>;

/// The plugin, as the host registers it.
pub struct Usage;

impl Filter for Usage {
    const NAME: &'static str = "usage-accounting";
    type Config = RuleSet<Rc<UsageConfig>>;
    type State = State;
    type Stage = Request;

    fn parse(document: &[u8]) -> Result<Self::Config, ConfigError> {
        parse_shared(document)
    }

    fn state(rules: Self::Config, fused: bool) -> Option<State> {
        State::new(rules, fused)
    }

    fn stage(state: Option<&Rc<State>>) -> Request {
        Request {
            state: state.cloned(),
            stage: Stage::default(),
        }
    }

    fn queue_ready(state: &State, queue: u32) {
        state.queue_ready(queue);
    }

    fn http_call_response(state: &State, body_size: usize) {
        // the ledger appends the root sent for the requests (`on_queue_ready`)
        state.ledger_reply(body_size);
    }
}

/// One request's stage (`state` is `None` without a valid configuration: nothing is done).
pub struct Request {
    state: Option<Rc<State>>,
    stage: Stage,
}

/// The host values the core reads only when it needs them; in the fused filter, the clock is
/// read once per callback for all stages ([`host::clock`]).
struct Host<'a>(Option<&'a chain::Exchange>);

impl Lookup for Host<'_> {
    fn now_ms(&mut self) -> u64 {
        match self.0 {
            Some(x) => host::clock(x) / 1_000_000,
            None => host::time_nanos() / 1_000_000,
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

impl Request {
    /// Hands `input` to the core, then the one driver carries out its commands; the flow.
    fn run(&mut self, sink: &mut Sink<'_>, input: Input<'_>) -> Flow {
        let Some(state) = &self.state else {
            return Flow::Continue;
        };
        let mut lookup = Host(match sink {
            Sink::Host => None,
            Sink::Fused(x) => Some(&**x),
        });
        let flow = self
            .stage
            .handle(&mut state.worker.borrow_mut(), &mut lookup, input);
        host::stage::carry(&mut self.stage, flow, sink, PLUGIN, &**state)
    }

    /// Body data of `direction`, read only if the core wants it.
    fn body(&mut self, sink: &mut Sink<'_>, direction: Direction, size: usize, end: bool) -> Turn {
        if !self.stage.is_active() {
            return Turn::Continue;
        }
        fn input(direction: Direction, size: usize, end: bool, body: Option<&[u8]>) -> Input<'_> {
            match direction {
                Direction::Request => Input::RequestBody {
                    size,
                    end_of_stream: end,
                    body,
                },
                Direction::Response => Input::ResponseBody {
                    size,
                    end_of_stream: end,
                    body,
                },
            }
        }
        let wants = match direction {
            Direction::Request => self.stage.wants_request_body(end),
            Direction::Response => self.stage.wants_response_body(end),
        };
        if !wants {
            return self.run(sink, input(direction, size, end, None)).into();
        }
        sink.with_body(direction, size, |body, sink| {
            self.run(sink, input(direction, size, end, body.ok()))
        })
        .into()
    }
}

impl filter::Stage for Request {
    fn request_headers(&mut self, sink: &mut Sink<'_>, end_of_stream: bool) -> Turn {
        let Some(state) = self.state.clone() else {
            return Turn::Continue;
        };
        let Ok(head) = sink.request_head() else {
            return Turn::Continue;
        };
        let config = host::select_config(&state.rules, Some(&head.authority)).cloned();
        let input = Input::RequestHeaders {
            config,
            head: &head,
            end_of_stream,
        };
        match self.run(sink, input) {
            // a body that may get `include_usage` is read whole
            Flow::Continue if self.stage.holds_request_body() => Turn::Whole,
            flow => flow.into(),
        }
    }

    fn request_body(&mut self, sink: &mut Sink<'_>, size: usize, end: bool) -> Turn {
        self.body(sink, Direction::Request, size, end)
    }

    fn response_headers(&mut self, sink: &mut Sink<'_>, end_of_stream: bool) -> Turn {
        if !self.stage.is_active() {
            return Turn::Continue;
        }
        // Four names, most present: one read of the whole map (one read per name if it fails).
        // Only `content-type` is text the core looks at (lossy); the status is parsed
        // untrimmed.
        let headers = sink.response_headers();
        let status = headers.text(":status").and_then(|v| v.parse::<u16>().ok());
        let content_type = headers.get("content-type").unwrap_or_default();
        let content_type = String::from_utf8_lossy(&content_type).into_owned();
        let content_length = headers
            .text("content-length")
            .and_then(|v| v.trim().parse().ok());
        let encoded = headers
            .get("content-encoding")
            .is_some_and(|v| !v.is_empty() && !v.eq_ignore_ascii_case(b"identity"));
        let input = Input::ResponseHeaders {
            status: status.unwrap_or(0),
            content_type: &content_type,
            content_length,
            encoded,
            end_of_stream,
        };
        self.run(sink, input).into()
    }

    fn response_body(&mut self, sink: &mut Sink<'_>, size: usize, end: bool) -> Turn {
        self.body(sink, Direction::Response, size, end)
    }

    fn response_trailers(&mut self, sink: &mut Sink<'_>) -> Turn {
        if !self.stage.is_active() {
            return Turn::Continue;
        }
        if !self.stage.wants_body_at_trailers() {
            return self
                .run(sink, Input::ResponseTrailers { body: None })
                .into();
        }
        sink.with_body(Direction::Response, usize::MAX, |body, sink| {
            self.run(sink, Input::ResponseTrailers { body: body.ok() })
        })
        .into()
    }

    fn log(&mut self, sink: &mut Sink<'_>) {
        if !self.stage.is_active() {
            return;
        }
        let superseded =
            self.stage.watches_supersession() && is_superseded(sink.code_details().as_deref());
        self.run(sink, Input::Log { superseded });
    }

    fn http_call_response(&mut self, body_size: usize) {
        // the only calls this plugin makes are ledger appends over HTTP
        if let Some(state) = &self.state {
            state.ledger_reply(body_size);
        }
    }
}
