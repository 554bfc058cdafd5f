//! The proxy-wasm adapter: feeds each callback into the [`Core`]; the one driver of the stage
//! protocol (`host::stage::carry`) carries out the effects it yields, in order, on the host
//! or the fused filter's exchange. Nothing here decides: a failed effect goes back to the
//! core, which says what changes.
//!
//! One core per root context (one role: `"role"` in the config); its HTTP contexts share it
//! and are told apart by their context id.

use crate::config::parse_document;
use crate::core::{Core, Input, ListenerRules, Next};
use effects::carry;
use llm_gateway_shared::host::{self, LogLevel, Sink};
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
        carried.flow.action()
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

mod effects;
mod fused;
mod view;
pub use fused::{Fused, FusedStage};
