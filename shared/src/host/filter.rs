//! A plugin's one registration with the host. A plugin writes its stage of a request once
//! ([`Stage`]: each callback reads what it needs through a [`Sink`] and answers a [`Turn`]),
//! and names its configuration and state ([`Filter`]); this module makes of it both the
//! plugin's own filter ([`root_context`]: the proxy-wasm root and HTTP contexts) and its stage
//! of the fused filter ([`Fused`], [`FusedStage`]). What differs between the two hosts — whether
//! a callback's data is the current chunk or the whole body, how a hold is said — is decided
//! here, once.

use super::{code_details, load_config, parse_config, Buffer, HeaderMap, HostResult, Sink};
use crate::chain::{self, Direction, Step};
use crate::config::ConfigError;
use crate::request::RequestHead;
use crate::wire::EncodedHeaders;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use std::borrow::Cow;
use std::rc::Rc;

/// What a stage's callback answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Go on.
    Continue,
    /// (A header callback's answer.) Go on in the plugin's own filter, whose body callbacks
    /// hold the body themselves; in the fused filter, hold: the stage takes the body whole.
    Whole,
    /// Hold (the headers, or the body until it is whole).
    Pause,
    /// An asynchronous call is out: hold until the plugin resumes the request.
    Wait,
    /// A local reply was sent: the request goes no further.
    Refused,
}

impl From<crate::stage::Flow> for Turn {
    fn from(flow: crate::stage::Flow) -> Turn {
        match flow {
            crate::stage::Flow::Continue => Turn::Continue,
            crate::stage::Flow::Pause => Turn::Pause,
            crate::stage::Flow::Refused => Turn::Refused,
        }
    }
}

impl Turn {
    /// The answer of the plugin's own filter's callback.
    pub fn action(self) -> Action {
        match self {
            Turn::Continue | Turn::Whole => Action::Continue,
            Turn::Pause | Turn::Wait | Turn::Refused => Action::Pause,
        }
    }

    /// The answer of the fused filter's step (a data step that holds takes the whole body).
    pub fn step(self) -> Step {
        match self {
            Turn::Continue => Step::Continue,
            Turn::Whole | Turn::Pause => Step::Buffer,
            Turn::Wait => Step::Wait,
            Turn::Refused => Step::Stop,
        }
    }
}

/// One request's stage of a plugin, the same for its own filter and the fused filter.
pub trait Stage {
    /// The request headers arrived (`end`: no body follows).
    fn request_headers(&mut self, sink: &mut Sink<'_>, end: bool) -> Turn;
    /// Request body data: `size` bytes (the buffered body in the plugin's own filter, which
    /// grows while it holds; the whole body in the fused filter once the stage held).
    fn request_body(&mut self, sink: &mut Sink<'_>, size: usize, end: bool) -> Turn;
    /// The response headers arrived.
    fn response_headers(&mut self, sink: &mut Sink<'_>, end: bool) -> Turn;
    /// Response body data: `size` bytes of this callback's chunk (or of the held body).
    fn response_body(&mut self, sink: &mut Sink<'_>, size: usize, end: bool) -> Turn;
    /// The response trailers arrived (the body ended without `end`); only the plugin's own
    /// filter sees them.
    fn response_trailers(&mut self, sink: &mut Sink<'_>) -> Turn {
        let _ = sink;
        Turn::Continue
    }
    /// The request is over.
    fn log(&mut self, sink: &mut Sink<'_>);
    /// The answer to an HTTP call this request's context sent (`body_size` bytes).
    fn http_call_response(&mut self, body_size: usize) {
        let _ = body_size;
    }
}

/// A plugin: its configuration, its state and the stage it makes of each request.
pub trait Filter: 'static {
    /// Its name in logs and configuration errors (`pii-redaction`).
    const NAME: &'static str;
    /// Its parsed configuration.
    type Config;
    /// What its requests share: the configuration and the worker's state built from it.
    type State: 'static;
    /// One request's stage.
    type Stage: Stage + 'static;
    /// Parses a configuration document (the plugin's own filter's, or the fused filter's
    /// section: the same document).
    fn parse(document: &[u8]) -> Result<Self::Config, ConfigError>;
    /// Builds the state (`fused`: for the fused filter); `None` if it cannot be (logged).
    fn state(config: Self::Config, fused: bool) -> Option<Self::State>;
    /// The stage of one request; `state` is `None` when the plugin has no valid
    /// configuration (its own filter still gets requests then).
    fn stage(state: Option<&Rc<Self::State>>) -> Self::Stage;
    /// The host's shared queue `queue` has data (the plugin's own filter's root context).
    fn queue_ready(state: &Self::State, queue: u32) {
        let _ = (state, queue);
    }
    /// The answer to an HTTP call the root context sent (`body_size` bytes).
    fn http_call_response(state: &Self::State, body_size: usize) {
        let _ = (state, body_size);
    }
}

/// The root context of `F`'s own filter (what its standalone module creates for every
/// `root_id`).
pub fn root_context<F: Filter>(_context_id: u32) -> Box<dyn RootContext> {
    Box::new(Root::<F> { state: None })
}

struct Root<F: Filter> {
    state: Option<Rc<F::State>>,
}

impl<F: Filter> Context for Root<F> {
    fn on_http_call_response(&mut self, _: u32, _: usize, body_size: usize, _: usize) {
        if let Some(state) = &self.state {
            F::http_call_response(state, body_size);
        }
    }
}

impl<F: Filter> RootContext for Root<F> {
    fn on_configure(&mut self, _size: usize) -> bool {
        let Some(config) = load_config(F::NAME, F::parse) else {
            return false;
        };
        self.state = F::state(config, false).map(Rc::new);
        self.state.is_some()
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        if let Some(state) = &self.state {
            F::queue_ready(state, queue_id);
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request::<F>(F::stage(self.state.as_ref()))))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Request<F: Filter>(F::Stage);

impl<F: Filter> Context for Request<F> {
    fn on_http_call_response(&mut self, _: u32, _: usize, body_size: usize, _: usize) {
        self.0.http_call_response(body_size);
    }
}

impl<F: Filter> HttpContext for Request<F> {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.0
            .request_headers(&mut Sink::Host, end_of_stream)
            .action()
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.0
            .request_body(&mut Sink::Host, body_size, end_of_stream)
            .action()
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.0
            .response_headers(&mut Sink::Host, end_of_stream)
            .action()
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.0
            .response_body(&mut Sink::Host, body_size, end_of_stream)
            .action()
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        self.0.response_trailers(&mut Sink::Host).action()
    }

    fn on_log(&mut self) {
        self.0.log(&mut Sink::Host);
    }
}

/// `F` configured from its section of the fused filter's configuration.
pub struct Fused<F: Filter>(Rc<F::State>);

impl<F: Filter> Fused<F> {
    /// Parses the section; `None` (logged) if it is invalid.
    pub fn configure(document: &[u8]) -> Option<Self> {
        let config = parse_config(F::NAME, document, F::parse)?;
        F::state(config, true).map(|state| Fused(Rc::new(state)))
    }

    /// The stage of one request.
    pub fn stage(&self) -> FusedStage<F> {
        FusedStage(F::stage(Some(&self.0)))
    }
}

/// One request's stage of `F` in the fused filter.
pub struct FusedStage<F: Filter>(F::Stage);

impl<F: Filter> chain::Stage<chain::Exchange> for FusedStage<F> {
    fn headers(&mut self, x: &mut chain::Exchange, direction: Direction, end: bool) -> Step {
        let sink = &mut Sink::Fused(x);
        match direction {
            Direction::Request => self.0.request_headers(sink, end),
            Direction::Response => self.0.response_headers(sink, end),
        }
        .step()
    }

    fn data(&mut self, x: &mut chain::Exchange, direction: Direction, end: bool) -> Step {
        let size = x.data.len();
        let sink = &mut Sink::Fused(x);
        match direction {
            Direction::Request => self.0.request_body(sink, size, end),
            Direction::Response => self.0.response_body(sink, size, end),
        }
        .step()
    }

    fn log(&mut self, x: &mut chain::Exchange) {
        self.0.log(&mut Sink::Fused(x));
    }
}

/// The response headers as a stage reads them: the host's map read once, or the fused
/// filter's copy.
pub enum ResponseHeaders<'a> {
    /// Read from the host in one call (`None`: the read failed; each name is then asked
    /// alone).
    Host(Option<EncodedHeaders>),
    /// The fused filter's copy.
    Fused(&'a chain::Headers),
}

impl ResponseHeaders<'_> {
    /// A header's value (the first, if repeated).
    pub fn get(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        match self {
            ResponseHeaders::Host(Some(view)) => view.get(name).map(Cow::Borrowed),
            ResponseHeaders::Host(None) => super::header(HeaderMap::ResponseHeaders, name)
                .ok()
                .flatten()
                .map(Cow::Owned),
            ResponseHeaders::Fused(headers) => headers.get(name).map(Cow::Borrowed),
        }
    }

    /// A header's value as text (absent and non-UTF-8 alike: `None`).
    pub fn text(&self, name: &str) -> Option<Cow<'_, str>> {
        match self.get(name)? {
            Cow::Borrowed(bytes) => std::str::from_utf8(bytes).ok().map(Cow::Borrowed),
            Cow::Owned(bytes) => String::from_utf8(bytes).ok().map(Cow::Owned),
        }
    }
}

impl Sink<'_> {
    /// The request headers as the view every stage shares (the host's, read in one call; the
    /// fused filter's copy).
    pub fn request_head(&self) -> HostResult<RequestHead> {
        match self {
            Sink::Host => super::request_head(),
            Sink::Fused(x) => Ok(RequestHead::shared(x.request.shared())),
        }
    }

    /// The response headers.
    pub fn response_headers(&self) -> ResponseHeaders<'_> {
        match self {
            Sink::Host => {
                ResponseHeaders::Host(super::header_view(HeaderMap::ResponseHeaders).ok())
            }
            Sink::Fused(x) => ResponseHeaders::Fused(&x.response),
        }
    }

    /// Lends `f` this callback's body data of `direction` (`size` bytes: the host is asked for
    /// them; the fused filter lends its copy without one) and a sink to carry effects with.
    pub fn with_body<R>(
        &mut self,
        direction: Direction,
        size: usize,
        f: impl FnOnce(HostResult<&[u8]>, &mut Sink<'_>) -> R,
    ) -> R {
        match self {
            Sink::Host => {
                let buffer = match direction {
                    Direction::Request => Buffer::RequestBody,
                    Direction::Response => Buffer::ResponseBody,
                };
                if size == 0 {
                    return f(Ok(&[]), &mut Sink::Host);
                }
                let body = super::buffer(buffer, 0, size);
                f(body.as_deref().map_err(|e| *e), &mut Sink::Host)
            }
            Sink::Fused(x) => x.with_data(|data, x| f(Ok(data), &mut Sink::Fused(x))),
        }
    }

    /// The response's code details (read once per request in the fused filter): what tells an
    /// internal redirect that superseded this pass.
    pub fn code_details(&mut self) -> Option<Cow<'_, str>> {
        match self {
            Sink::Host => code_details().map(Cow::Owned),
            Sink::Fused(x) => x.code_details(code_details).map(Cow::Borrowed),
        }
    }
}
