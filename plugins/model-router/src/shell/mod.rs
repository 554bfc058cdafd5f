//! The proxy-wasm adapter: feeds each callback into the [`Core`] and carries out the
//! [`Effect`]s it yields, in order, through `llm_gateway_shared::host`. Nothing here decides:
//! a failed effect goes back to the core ([`Core::failed`]), which says what changes.
//!
//! One core per root context (one role: `"role"` in the config); its HTTP contexts share it
//! and are told apart by their context id.

use crate::config::parse_document;
use crate::config::Role;
use crate::core::{
    Command, Core, Effect, Flow, Input, ListenerRules, Map, ReadError, Store, StoreError, View,
    PLUGIN,
};
use llm_gateway_shared::chain::{self, Direction, Step};
use llm_gateway_shared::host::{self, Buffer, HeaderMap, HostError, LogLevel, Metric};
use llm_gateway_shared::request::RequestHead;
use llm_gateway_shared::wire::EncodedHeaders;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use std::cell::{OnceCell, RefCell};
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::rc::Rc;

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
        drain(&self.core, 0, Flow::Continue);
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
    /// The core said it would ignore the rest of the response body ([`Flow`]).
    skip_response_body: bool,
}

impl Exchange {
    fn run(&mut self, input: Input) -> Action {
        let view = HostView::new(&input);
        let flow = match self.core.try_borrow_mut() {
            Ok(mut core) => core.handle(self.id, input, &view, &HostStore),
            Err(_) => {
                log(
                    LogLevel::Error,
                    "re-entered while busy: request passed as is",
                );
                return Action::Continue;
            }
        };
        match drain(&self.core, self.id, flow) {
            Flow::Continue => Action::Continue,
            Flow::Pause => Action::Pause,
            Flow::ContinueSkipResponseBody => {
                self.skip_response_body = true;
                Action::Continue
            }
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

/// Carries out the core's effects in order; a failure goes back to the core, which may change
/// the flow. The core is not borrowed while an effect runs: a local reply re-enters this
/// plugin's response callbacks.
fn drain(core: &RefCell<Core>, context: u32, mut flow: Flow) -> Flow {
    loop {
        let Some(Effect {
            command,
            on_failure,
        }) = core.try_borrow_mut().ok().and_then(|mut c| c.poll())
        else {
            return flow;
        };
        if let Err(err) = execute(command) {
            let changed = core
                .try_borrow_mut()
                .ok()
                .and_then(|mut c| c.failed(context, on_failure, &err.to_string()));
            if let Some(changed) = changed {
                flow = changed;
            }
        }
    }
}

fn execute(command: Command) -> Result<(), HostError> {
    match command {
        Command::SetHeader { map, name, value } => host::set_header(header_map(map), &name, &value),
        Command::RemoveHeader { map, name } => host::remove_header(header_map(map), &name),
        Command::SetRequestBody { size, body } => {
            host::set_buffer(Buffer::RequestBody, 0, size, &body)
        }
        Command::SetRequestLength(length) => host::set_request_length(length),
        Command::SetProperty { name, value } => host::set_property(&[&name], &value),
        Command::ClearRouteCache => host::clear_route_cache(),
        Command::AppendResponseBody { at, bytes } => {
            host::set_buffer(Buffer::ResponseBody, at, 0, &bytes)
        }
        Command::ReplaceResponseBody { size, body } => {
            host::set_buffer(Buffer::ResponseBody, 0, size, &body)
        }
        Command::Reply {
            status,
            details,
            headers,
            body,
        } => {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_str()))
                .collect();
            host::send_local_response(status, &details, &headers, &body)
        }
        Command::Refuse(reject) => host::send_reject(PLUGIN, &reject),
        Command::Count(name) => {
            Metric::counter(&format!("llm_gateway.model_router.{name}"))?.increment(1)
        }
        Command::Gauge(name, value) => {
            Metric::gauge(&format!("llm_gateway.model_router.{name}"))?.record(value)
        }
        Command::Log(level, message) => {
            log(level, &message);
            Ok(())
        }
    }
}

fn header_map(map: Map) -> HeaderMap {
    match map {
        Map::Request => HeaderMap::RequestHeaders,
        Map::Response => HeaderMap::ResponseHeaders,
    }
}

/// The current request through the host, for one callback. In a request callback the first
/// read of a request header takes the whole map in one host call and the callback's later
/// reads are answered from it: each value the host returns is an allocation it makes in the
/// VM, so a header read alone costs it about as much as a small map, and the router reads
/// several there (path, method, authority; the caller's groups and subject and the body's
/// framing). The core's writes are carried out after its callback returns, so within one
/// callback the map is what a read of its own would return. Response callbacks read one or
/// two headers (and a request header that is mostly absent, which costs the host little):
/// one call per read there.
struct HostView {
    /// Request headers are read as one map.
    whole_request: bool,
    request: OnceCell<Option<EncodedHeaders>>,
}

impl HostView {
    fn new(input: &Input) -> HostView {
        HostView {
            whole_request: matches!(
                input,
                Input::RequestHeaders { .. } | Input::RequestBody { .. }
            ),
            request: OnceCell::new(),
        }
    }
}

impl View for HostView {
    fn request_header(&self, name: &str) -> Result<Option<Vec<u8>>, ReadError> {
        if !self.whole_request {
            return host::header(HeaderMap::RequestHeaders, name).map_err(|_| ReadError);
        }
        let map = self
            .request
            .get_or_init(|| host::header_view(HeaderMap::RequestHeaders).ok())
            .as_ref()
            .ok_or(ReadError)?;
        Ok(map.get(name).map(<[u8]>::to_vec))
    }

    fn request_headers(&self) -> Result<RequestHead, ReadError> {
        match self.request.get() {
            Some(Some(map)) => Ok(RequestHead::encoded(map.clone())),
            _ => host::request_head().map_err(|_| ReadError),
        }
    }

    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        host::header(HeaderMap::ResponseHeaders, name)
            .ok()
            .flatten()
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        host::property(path).ok().flatten()
    }

    fn request_body(&self, size: usize) -> Result<Vec<u8>, ReadError> {
        host::buffer(Buffer::RequestBody, 0, size).map_err(|_| ReadError)
    }

    fn response_body(&self, size: usize) -> Option<Vec<u8>> {
        host::buffer(Buffer::ResponseBody, 0, size).ok()
    }

    fn route_name(&self) -> String {
        host::route_name()
    }

    fn cluster_name(&self) -> String {
        host::cluster_name()
    }

    fn now_nanos(&self) -> u64 {
        host::time_nanos()
    }
}

/// Envoy's shared data.
struct HostStore;

impl Store for HostStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), StoreError> {
        host::shared_data(key).map_err(|_| StoreError::Unavailable)
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        host::set_shared_data(key, value, cas).map_err(|err| match err {
            HostError::CasMismatch => StoreError::CasMismatch,
            _ => StoreError::Unavailable,
        })
    }
}

mod fused;
pub use fused::{Fused, FusedStage};
