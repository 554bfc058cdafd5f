//! The proxy-wasm adapter: feeds each callback into the [`Core`]; the one driver of the stage
//! protocol (`host::stage::carry`) carries out the effects it yields, in order, on the host
//! or the fused filter's exchange. Nothing here decides: a failed effect goes back to the
//! core, which says what changes.
//!
//! One core per root context (one role: `"role"` in the config); its HTTP contexts share it
//! and are told apart by their context id.

use crate::config::parse_document;
use crate::core::{Core, Input, ListenerRules, Map, Name, Next, Own, Stage, PLUGIN};
use llm_gateway_shared::host::stage::{self, Plugin};
use llm_gateway_shared::host::{self, Buffer, HeaderMap, HostResult, LogLevel, Metric, Sink};
use llm_gateway_shared::stage::Flow;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::rc::Rc;
use view::{HostStore, HostView};

// The standalone module's entry point; a module holding several plugins (`plugins/bundle`)
// turns the `standalone` feature off and creates this plugin's root context with
// [`root_context`].
#[cfg(feature = "standalone")]
proxy_wasm::main! {{
    proxy_wasm::set_root_context(root_context);
}}

thread_local! {
    /// The listener role's rules, for the upstream role of the same VM ([`ListenerRules`]).
    static LISTENER: ListenerRules = Rc::new(RefCell::new(None));
}

/// A root context of this plugin (what the standalone module creates for every `root_id`).
pub fn root_context(_context_id: u32) -> Box<dyn RootContext> {
    // std seeds RandomState from the host's randomness (WASI `random_get`)
    let seed = RandomState::new().hash_one(host::time_nanos());
    let listener = LISTENER.with(Rc::clone);
    Box::new(Root {
        core: Rc::new(RefCell::new(Core::new(seed, listener))),
    })
}

fn log(level: LogLevel, message: &str) {
    host::log(level, &format!("model-router: {message}"));
}

struct Root {
    core: Rc<RefCell<Core>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let Some(rules) = host::load_config("model-router", parse_document) else {
            return false;
        };
        let now = host::time_nanos();
        match self.core.try_borrow_mut() {
            Ok(mut core) => core.configure(now, rules, &HostStore),
            Err(_) => return false,
        }
        carry(&self.core, 0, Next::Continue, &mut Sink::Host);
        true
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Exchange {
            core: Rc::clone(&self.core),
            id: context_id,
            skip_response_body: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// What the one driver did with a callback's effects.
struct Carried {
    /// The callback's flow.
    flow: Flow,
    /// A local reply went out (or was asked for).
    replied: bool,
    /// The core ignores the rest of the response body ([`Next::ContinueSkipResponseBody`]).
    skip_response_body: bool,
}

/// Carries out the effects the core queued for request `context` on `sink`, `next` being
/// what it answered the callback.
fn carry(core: &RefCell<Core>, context: u32, next: Next, sink: &mut Sink<'_>) -> Carried {
    let mut effects = Stage::new(core, context);
    let flow = stage::carry(&mut effects, next.flow(), sink, PLUGIN, &Router);
    Carried {
        flow,
        replied: effects.replied(),
        skip_response_body: next == Next::ContinueSkipResponseBody && flow == Flow::Continue,
    }
}

/// What the driver asks of this plugin: its metrics (`llm_gateway.model_router.<name>`) and
/// its own effects.
struct Router;

impl Plugin<Stage<'_>> for Router {
    fn count(&self, name: &Name, delta: u64) {
        if let Ok(metric) = Metric::counter(&format!("llm_gateway.model_router.{name}")) {
            let _ = metric.increment(i64::try_from(delta).unwrap_or(i64::MAX));
        }
    }

    fn gauge(&self, name: &Name, value: u64) {
        if let Ok(metric) = Metric::gauge(&format!("llm_gateway.model_router.{name}")) {
            let _ = metric.record(value);
        }
    }

    fn own(&self, effect: &Own, sink: &mut Sink<'_>) -> HostResult<()> {
        match (effect, sink) {
            (Own::RemoveHeader(map, name), sink) => {
                let map = match map {
                    Map::Request => HeaderMap::RequestHeaders,
                    Map::Response => HeaderMap::ResponseHeaders,
                };
                sink.remove_header(map, name)
            }
            (Own::SetRequestLength(length), Sink::Host) => host::set_request_length(*length),
            (Own::SetRequestLength(length), Sink::Fused(x)) => {
                // A body framed by content-length gets its final length when the fused filter
                // frames it after every stage's edits (bundle `fused::frame`); only a request
                // without one (a redirect pass: Envoy removed it) is framed here.
                if x.request.get("content-length").is_none() {
                    x.request
                        .set("content-length", length.to_string().as_bytes());
                    x.request.remove("transfer-encoding");
                }
                Ok(())
            }
            (Own::AppendResponseBody { at, bytes }, Sink::Host) => {
                host::set_buffer(Buffer::ResponseBody, *at, 0, bytes)
            }
            (Own::AppendResponseBody { bytes, .. }, Sink::Fused(x)) => {
                let mut data = std::mem::take(&mut x.data);
                data.extend_from_slice(bytes);
                x.replace_data(data);
                Ok(())
            }
            (
                Own::Reply {
                    status,
                    details,
                    headers,
                    body,
                },
                _,
            ) => {
                let headers: Vec<(&str, &str)> = headers
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str()))
                    .collect();
                host::send_local_response(*status, details, &headers, body)
            }
        }
    }
}

/// One request (either role).
struct Exchange {
    core: Rc<RefCell<Core>>,
    id: u32,
    /// The core said it would ignore the rest of the response body ([`Next`]).
    skip_response_body: bool,
}

impl Exchange {
    fn run(&mut self, input: Input) -> Action {
        let view = HostView::new(&input);
        let next = match self.core.try_borrow_mut() {
            Ok(mut core) => core.handle(self.id, input, &view, &HostStore),
            Err(_) => {
                log(
                    LogLevel::Error,
                    "re-entered while busy: request passed as is",
                );
                return Action::Continue;
            }
        };
        let carried = carry(&self.core, self.id, next, &mut Sink::Host);
        self.skip_response_body |= carried.skip_response_body;
        match carried.flow {
            Flow::Continue => Action::Continue,
            Flow::Pause | Flow::Refused => Action::Pause,
        }
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        if let Ok(mut core) = self.core.try_borrow_mut() {
            core.forget(self.id);
        }
    }
}

impl Context for Exchange {}

impl HttpContext for Exchange {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.run(Input::RequestHeaders { end_of_stream })
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        self.run(Input::RequestBody {
            size,
            end_of_stream,
        })
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.run(Input::ResponseHeaders { end_of_stream })
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if self.skip_response_body {
            return Action::Continue;
        }
        self.run(Input::ResponseBody {
            size,
            end_of_stream,
        })
    }

    fn on_log(&mut self) {
        let _flow = self.run(Input::Log); // on_log returns nothing
    }
}

mod fused;
mod view;
pub use fused::{Fused, FusedStage};
