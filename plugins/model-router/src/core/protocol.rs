//! What the core and its driver say to each other: the events fed in ([`Input`], the host's
//! data read through a [`View`]), the effects drained out (the shared [`Effect`]s, each with
//! what its failure means, [`OnFailure`]) and what a callback returns ([`Next`]); with the reads of
//! the current request that both roles share ([`select`] of the config, headers and
//! properties as text). Below [`Core`](super::Core) and the roles that implement it
//! (`downstream`, `upstream`, `translation`, `breakers`), which all use it.

use crate::config::RouterConfig;
use llm_gateway_shared::reject::Reject;
use llm_gateway_shared::request::RequestHead;
use llm_gateway_shared::rules::{MatchInput, RuleSet};
use llm_gateway_shared::stage::{self, Flow};

pub use llm_gateway_shared::level::Level;
pub use llm_gateway_shared::stage::{Map, Name};

/// A host read failed (as opposed to "the value is absent").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadError;

/// The current request as the host shows it; every method is one read.
pub trait View {
    /// A request header; `Ok(None)` if absent.
    fn request_header(&self, name: &str) -> Result<Option<Vec<u8>>, ReadError>;
    /// Every request header (name, value).
    fn request_headers(&self) -> Result<RequestHead, ReadError>;
    /// A response header.
    fn response_header(&self, name: &str) -> Option<Vec<u8>>;
    /// A property (filter state or an Envoy attribute), raw.
    fn property(&self, path: &[&str]) -> Option<Vec<u8>>;
    /// The first `size` bytes of the request body.
    fn request_body(&self, size: usize) -> Result<Vec<u8>, ReadError>;
    /// The first `size` bytes of the response body (the current chunk).
    fn response_body(&self, size: usize) -> Option<Vec<u8>>;
    /// Lends the first `size` bytes of the response body (the current chunk) to `f`, which is
    /// not called if they cannot be read: a driver that holds them in memory (the fused
    /// filter) lends them without a copy, once per streamed event.
    fn with_response_body(&self, size: usize, f: &mut dyn FnMut(&[u8])) {
        if let Some(body) = self.response_body(size) {
            f(&body);
        }
    }
    /// Property `route_name` (read only when a rule matches on it).
    fn route_name(&self) -> String;
    /// Property `cluster_name` (read only when a rule matches on it).
    fn cluster_name(&self) -> String;
    /// The host's clock (Unix nanoseconds), read only when a decision needs the time (the
    /// breakers, a request id): reading it on every callback would cost a host call per
    /// streamed event.
    fn now_nanos(&self) -> u64;
}

/// A request header as text (absent, unreadable and non-UTF-8 alike: `None`).
pub(crate) fn header_string(view: &dyn View, name: &str) -> Option<String> {
    view.request_header(name)
        .ok()
        .flatten()
        .and_then(|v| String::from_utf8(v).ok())
}

pub(crate) fn property_string(view: &dyn View, path: &[&str]) -> Option<String> {
    view.property(path).and_then(|v| String::from_utf8(v).ok())
}

/// One event of a request, host data read through the [`View`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// `on_http_request_headers`.
    RequestHeaders {
        /// The request has no body.
        end_of_stream: bool,
    },
    /// `on_http_request_body`: `size` bytes buffered so far.
    RequestBody {
        /// Bytes buffered.
        size: usize,
        /// The body is complete.
        end_of_stream: bool,
    },
    /// `on_http_response_headers`.
    ResponseHeaders {
        /// The response has no body.
        end_of_stream: bool,
    },
    /// `on_http_response_body`: the current chunk is `size` bytes.
    ResponseBody {
        /// Bytes of this chunk.
        size: usize,
        /// The last chunk.
        end_of_stream: bool,
    },
    /// `on_log`: the stream is done.
    Log,
}

/// What the core answers a callback: the shared [`Flow`](llm_gateway_shared::stage::Flow)'s
/// continue and pause, and one the router alone needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Let the headers or body go on.
    Continue,
    /// Hold them (more body to come, or a local reply was sent).
    Pause,
    /// Let them go on; and the core would ignore every later response-body event of this
    /// request (no stream to guard, no error body to classify), so the driver need not feed
    /// them (it still feeds [`Input::Log`]). Saves a lookup per streamed event.
    ContinueSkipResponseBody,
}

impl Next {
    /// The shared flow the driver carries (skipping the response body is the shell's to
    /// remember).
    pub fn flow(self) -> Flow {
        match self {
            Next::Continue | Next::ContinueSkipResponseBody => Flow::Continue,
            Next::Pause => Flow::Pause,
        }
    }
}

/// One thing for the driver to do: the shared vocabulary, counters and gauges named by their
/// suffix (`llm_gateway.model_router.<name>`), refusals as OpenAI-shaped errors
/// (`host::send_reject`), and what only the router asks ([`Own`]).
pub type Effect = stage::Effect<Name, Reject, Own>;

/// What only the router asks of the host (its shell's `Plugin::own` carries it out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Own {
    /// `content-length: <n>` and no `transfer-encoding` (`host::set_request_length`). The
    /// fused filter frames a body with a `content-length` itself after every stage's edits;
    /// there only a request without one (a redirect pass: Envoy removed it) is framed here.
    SetRequestLength(usize),
    /// Append bytes to the current response chunk (`at` bytes long).
    AppendResponseBody {
        /// The chunk's size: the bytes go after it.
        at: usize,
        /// What to append.
        bytes: Vec<u8>,
    },
    /// Send a local reply that is not an error (the model list, a token count).
    Reply {
        /// Status.
        status: u16,
        /// Response code details.
        details: String,
        /// Headers.
        headers: Vec<(String, String)>,
        /// Body.
        body: Vec<u8>,
    },
}

/// What the core does when an effect fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// Nothing (metrics).
    Ignore,
    /// Log `<what>: <error>` at this level; the request goes on.
    Log(Level, &'static str),
    /// Routing cannot be half done: the rest of the batch is dropped and the request refused
    /// (500 `cannot route the request`).
    Refuse,
    /// The model rewrite of an attempt failed: the provider gets the client's body, so its
    /// length stays this; logged.
    KeepLength(usize),
}

/// The config of `rules` this request matches, as `host::select_config` picks it: the route
/// name, `:authority` and cluster name read only when some rule matches on them.
pub(crate) fn select<'a>(
    rules: &'a RuleSet<RouterConfig>,
    view: &dyn View,
) -> Option<(usize, &'a RouterConfig)> {
    let needs = rules.needs();
    let route = if needs.route {
        view.route_name()
    } else {
        String::new()
    };
    let cluster = if needs.cluster {
        view.cluster_name()
    } else {
        String::new()
    };
    let authority = if needs.authority {
        header_string(view, ":authority").unwrap_or_default()
    } else {
        String::new()
    };
    let config = rules.select(&MatchInput {
        route: &route,
        authority: &authority,
        cluster: &cluster,
    })?;
    let index = rules.configs().position(|c| std::ptr::eq(c, config))?;
    Some((index, config))
}
