//! A plugin's one registration with the host. A plugin names its configuration, its state, its
//! core (a [`Stage`] of the one protocol) and what only it does with the host ([`Filter`]);
//! this module makes of it both the plugin's own filter ([`root_context`]: the proxy-wasm root
//! and HTTP contexts) and its stage of the fused filter ([`Fused`], [`FusedStage`]), which
//! read the data the core wants through a [`Sink`] (the host, or the fused filter's copy), feed
//! it the one [`Input`] vocabulary and carry its effects out with the one driver
//! ([`stage::carry`]). What differs between the two hosts — whether a callback's data is the
//! current chunk or the whole body, how a hold is said — is decided here, once.

use super::{
    code_details, header_view, load_config, log, parse_config, property, stage, Buffer, HeaderMap,
    HostResult, LogLevel, Sink,
};
use crate::chain::{self, Direction, Step};
use crate::config::ConfigError;
use crate::reentry::is_superseded;
use crate::request::RequestHead;
use crate::stage::{Core, Env, Flow, Input, Read, ResponseHead, Stage};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use std::borrow::Cow;
use std::cell::RefCell;
use std::rc::Rc;

impl Flow {
    /// The answer of the plugin's own filter's callback.
    pub fn action(self) -> Action {
        match self {
            Flow::Continue | Flow::Whole => Action::Continue,
            Flow::Pause | Flow::Wait | Flow::Refused => Action::Pause,
        }
    }

    /// The answer of the fused filter's step (a data step that holds takes the whole body).
    pub fn step(self) -> Step {
        match self {
            Flow::Continue => Step::Continue,
            Flow::Whole | Flow::Pause => Step::Buffer,
            Flow::Wait => Step::Wait,
            Flow::Refused => Step::Stop,
        }
    }
}

type CoreOf<F> = <F as Filter>::Core;
type MetricOf<F> = <CoreOf<F> as Core>::Metric;
type OwnOf<F> = <CoreOf<F> as Core>::Own;

/// A plugin: its configuration, its state, its core, and what only it does with the host.
pub trait Filter: 'static {
    /// Its name in logs and configuration errors (`pii-redaction`).
    const NAME: &'static str;
    /// Its name in local replies' details (`pii_redaction`).
    const PLUGIN: &'static str;
    /// Its parsed configuration document.
    type Document;
    /// What its requests share: the configuration and the worker's state built from it.
    type State: 'static;
    /// The core of one request.
    type Core: Stage + 'static;
    /// Parses a configuration document (the plugin's own filter's, or the fused filter's
    /// section: the same document).
    fn parse(document: &[u8]) -> Result<Self::Document, ConfigError>;
    /// Builds the state (`fused`: for the fused filter); `None` if it cannot be (logged).
    fn state(document: Self::Document, fused: bool) -> Option<Self::State>;
    /// The core of one request; `state` is `None` when the plugin has no valid configuration
    /// (its own filter still gets requests then).
    fn core(state: Option<&Self::State>) -> Self::Core;
    /// The configuration the request's route selects.
    fn select(state: &Self::State, head: &RequestHead) -> Option<<Self::Core as Stage>::Config>;
    /// The worker's state the cores share.
    fn worker(state: &Self::State) -> &RefCell<<Self::Core as Stage>::Worker>;
    /// Adds `delta` to counter `metric`.
    fn count(state: &Self::State, metric: &MetricOf<Self>, delta: u64);
    /// Sets gauge `metric`; a plugin whose core sets no gauge has nothing to do.
    fn gauge(state: &Self::State, metric: &MetricOf<Self>, value: u64) {
        let _ = (state, metric, value);
    }
    /// Carries out one of the plugin's own effects.
    fn own(state: &Self::State, effect: &OwnOf<Self>, sink: &mut Sink<'_>) -> HostResult<()>;
    /// The host's shared queue `queue` has data (the plugin's own filter's root context).
    fn queue_ready(state: &Self::State, queue: u32) {
        let _ = (state, queue);
    }
    /// The answer to an HTTP call the plugin sent (`body_size` bytes).
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
        let Some(document) = load_config(F::NAME, F::parse) else {
            return false;
        };
        self.state = F::state(document, false).map(Rc::new);
        self.state.is_some()
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        if let Some(state) = &self.state {
            F::queue_ready(state, queue_id);
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request::<F>::new(self.state.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// One request's stage of `F`, the same in its own filter and in the fused filter: reads
/// what the core wants through the [`Sink`], hands it the [`Input`], and carries its effects
/// out with the one driver.
struct Request<F: Filter> {
    /// `None`: the plugin has no valid configuration.
    state: Option<Rc<F::State>>,
    core: F::Core,
}

impl<F: Filter> Request<F> {
    fn new(state: Option<Rc<F::State>>) -> Self {
        let core = F::core(state.as_deref());
        Request { state, core }
    }

    fn run(&mut self, sink: &mut Sink<'_>, input: Input<'_, ConfigOf<F>>) -> Flow {
        let state = self.state.as_deref();
        let flow = match state {
            Some(state) => {
                let worker = &mut F::worker(state).borrow_mut();
                self.core.handle(worker, sink, input)
            }
            None => self.core.handle(&mut Default::default(), sink, input),
        };
        stage::carry(&mut self.core, flow, sink, F::PLUGIN, &Effects::<F>(state))
    }

    fn request_headers(&mut self, sink: &mut Sink<'_>, end_of_stream: bool) -> Flow {
        // unreadable headers read as absent ones
        let head = sink.request_head().unwrap_or_default();
        let config = self
            .state
            .as_deref()
            .and_then(|state| F::select(state, &head));
        let input = Input::RequestHeaders {
            config,
            head: &head,
            end_of_stream,
        };
        self.run(sink, input)
    }

    fn request_body(&mut self, sink: &mut Sink<'_>, size: usize, end_of_stream: bool) -> Flow {
        if !self.core.wants(Read::RequestBody {
            size,
            end_of_stream,
        }) {
            let body = None;
            return self.run(
                sink,
                Input::RequestBody {
                    size,
                    end_of_stream,
                    body,
                },
            );
        }
        sink.with_body(Direction::Request, size, |body, sink| match body {
            Ok(body) => {
                let body = Some(body);
                self.run(
                    sink,
                    Input::RequestBody {
                        size,
                        end_of_stream,
                        body,
                    },
                )
            }
            Err(err) => {
                let line = format!("{}: cannot read the request body: {err}", F::NAME);
                log(LogLevel::Error, &line);
                self.run(
                    sink,
                    Input::RequestBodyUnreadable {
                        size,
                        end_of_stream,
                    },
                )
            }
        })
    }

    fn response_headers(&mut self, sink: &mut Sink<'_>, end_of_stream: bool) -> Flow {
        if !self.core.wants(Read::ResponseHeaders { end_of_stream }) {
            return Flow::Continue;
        }
        let head = sink.response_head();
        self.run(
            sink,
            Input::ResponseHeaders {
                head: &head,
                end_of_stream,
            },
        )
    }

    fn response_body(&mut self, sink: &mut Sink<'_>, size: usize, end_of_stream: bool) -> Flow {
        if !self.core.wants(Read::ResponseBody { end_of_stream }) {
            let body = None;
            return self.run(
                sink,
                Input::ResponseBody {
                    size,
                    end_of_stream,
                    body,
                },
            );
        }
        sink.with_body(Direction::Response, size, |body, sink| {
            // unreadable data passes as it is
            let body = body.ok();
            self.run(
                sink,
                Input::ResponseBody {
                    size,
                    end_of_stream,
                    body,
                },
            )
        })
    }

    fn response_trailers(&mut self, sink: &mut Sink<'_>) -> Flow {
        if !self.core.wants(Read::BodyAtTrailers) {
            return self.run(sink, Input::ResponseTrailers { body: None });
        }
        sink.with_body(Direction::Response, usize::MAX, |body, sink| {
            self.run(sink, Input::ResponseTrailers { body: body.ok() })
        })
    }

    fn log(&mut self, sink: &mut Sink<'_>) {
        if !self.core.wants(Read::Log) {
            return;
        }
        let superseded =
            self.core.wants(Read::Supersession) && is_superseded(sink.code_details().as_deref());
        self.run(sink, Input::Log { superseded });
    }
}

type ConfigOf<F> = <CoreOf<F> as Stage>::Config;

/// What the driver asks of the plugin: its metrics and its own effects.
struct Effects<'a, F: Filter>(Option<&'a F::State>);

impl<F: Filter> stage::Plugin<F::Core> for Effects<'_, F> {
    fn count(&self, metric: &MetricOf<F>, delta: u64) {
        if let Some(state) = self.0 {
            F::count(state, metric, delta);
        }
    }

    fn gauge(&self, metric: &MetricOf<F>, value: u64) {
        if let Some(state) = self.0 {
            F::gauge(state, metric, value);
        }
    }

    fn own(&self, effect: &OwnOf<F>, sink: &mut Sink<'_>) -> HostResult<()> {
        match self.0 {
            Some(state) => F::own(state, effect, sink),
            None => Ok(()),
        }
    }
}

impl<F: Filter> Context for Request<F> {
    fn on_http_call_response(&mut self, _: u32, _: usize, body_size: usize, _: usize) {
        if let Some(state) = &self.state {
            F::http_call_response(state, body_size);
        }
    }
}

impl<F: Filter> HttpContext for Request<F> {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.request_headers(&mut Sink::Host, end_of_stream)
            .action()
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.request_body(&mut Sink::Host, body_size, end_of_stream)
            .action()
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.response_headers(&mut Sink::Host, end_of_stream)
            .action()
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.response_body(&mut Sink::Host, body_size, end_of_stream)
            .action()
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        self.response_trailers(&mut Sink::Host).action()
    }

    fn on_log(&mut self) {
        self.log(&mut Sink::Host);
    }
}

/// `F` configured from its section of the fused filter's configuration.
pub struct Fused<F: Filter>(Rc<F::State>);

impl<F: Filter> Fused<F> {
    /// Parses the section; `None` (logged) if it is invalid.
    pub fn configure(document: &[u8]) -> Option<Self> {
        let document = parse_config(F::NAME, document, F::parse)?;
        F::state(document, true).map(|state| Fused(Rc::new(state)))
    }

    /// The stage of one request.
    pub fn stage(&self) -> FusedStage<F> {
        FusedStage(Request::new(Some(Rc::clone(&self.0))))
    }
}

/// One request's stage of `F` in the fused filter.
pub struct FusedStage<F: Filter>(Request<F>);

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

impl Env for Sink<'_> {
    fn now_ms(&mut self) -> u64 {
        self.now_nanos() / 1_000_000
    }

    fn property(&mut self, path: &[&str]) -> Option<Vec<u8>> {
        property(path).ok().flatten()
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

    /// The response headers every core reads: the host's map read in one call (one call per
    /// name if that fails), or the fused filter's copy.
    pub fn response_head(&self) -> ResponseHead {
        match self {
            Sink::Host => match header_view(HeaderMap::ResponseHeaders) {
                Ok(view) => ResponseHead::read(|name| view.get(name)),
                Err(_) => ResponseHead::read(|name| {
                    super::header(HeaderMap::ResponseHeaders, name)
                        .ok()
                        .flatten()
                }),
            },
            Sink::Fused(x) => ResponseHead::read(|name| x.response.get(name)),
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
                if size == 0 {
                    return f(Ok(&[]), &mut Sink::Host);
                }
                let buffer = match direction {
                    Direction::Request => Buffer::RequestBody,
                    Direction::Response => Buffer::ResponseBody,
                };
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
