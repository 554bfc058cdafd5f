//! The one stage protocol between a plugin's core and its host, quinn-proto's shape: the
//! driver copies what the host said into the core's input and calls it with the time passed
//! in; the core never calls the host, it queues [`Effect`]s, which the one driver
//! (`host::stage::carry`, for a plugin's own filter and for its stage of the fused filter alike)
//! carries out in order. An effect the host refuses goes back to the core ([`Core::failed`]),
//! which decides what that means for the request.
//!
//! `M` names a core's metrics (the driver hands them to the plugin's metric table), `R` its
//! refusals, each of which says its HTTP response ([`Refusal::reject`]: the one mapping), and
//! `P` what only that plugin asks of the host (usage-accounting's publication of a record),
//! which the driver hands to the plugin.

use crate::level::Level;
use crate::reject::Reject;
use std::borrow::Cow;
use std::convert::Infallible;

/// A header, property or metric name: nearly always a constant, so no allocation.
pub type Name = Cow<'static, str>;

/// What the host callback does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Let the data (or headers) go on.
    Continue,
    /// Hold: the host buffers the body, or the headers wait for it.
    Pause,
    /// A local reply was asked for ([`Effect::Refuse`]); the request goes no further.
    Refused,
}

/// A header map an effect edits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Map {
    /// The request's headers.
    Request,
    /// The response's headers.
    Response,
}

/// A refusal of a core: its local reply.
pub trait Refusal {
    /// The status, error body and headers of the reply.
    fn reject(&self) -> Reject;
}

impl Refusal for Reject {
    fn reject(&self) -> Reject {
        self.clone()
    }
}

/// One thing a core asks of the host, in the order it must happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect<M, R = Reject, P = Infallible> {
    /// Remove a header (every value of it); the name a constant, or one the request carried
    /// (key-auth removes every client-supplied `x-llm-*`).
    RemoveHeader(Map, Name),
    /// Set a header, replacing every value (held headers only); the name, like
    /// [`Effect::RemoveHeader`]'s, costs no allocation when it is a constant.
    SetHeader(Map, Name, String),
    /// Replace the buffered request body of `size` bytes; `frame`: the headers were held and
    /// carry a `content-length`, which becomes the new length (otherwise the body is chunked
    /// or the length was removed already).
    ReplaceRequestBody {
        /// Bytes buffered now.
        size: usize,
        /// The new body.
        body: Vec<u8>,
        /// Set `content-length` to the new length.
        frame: bool,
    },
    /// Replace this callback's response data (`size` bytes) with `body`.
    ReplaceResponseBody {
        /// Bytes of this callback's data.
        size: usize,
        /// The new data.
        body: Vec<u8>,
    },
    /// Set filter state `name` (one path segment) to `value`. `shared`: later stages of the
    /// fused filter read it from the exchange instead of asking the host (only for a record no
    /// filter outside the fused one rewrites).
    SetProperty {
        /// The property's name.
        name: Name,
        /// Its value.
        value: Vec<u8>,
        /// Published to the fused filter's later stages.
        shared: bool,
    },
    /// Clear the route cache: the route is chosen again from what the request carries now
    /// (the fused filter clears it once, after it wrote the header edits).
    ClearRouteCache,
    /// Send the local reply and stop the request.
    Refuse(R),
    /// Add to a counter of the plugin's.
    Count(M, u64),
    /// Set a gauge of the plugin's.
    Gauge(M, u64),
    /// Write a log line (names and counts, never a key, a prompt or a personal value).
    Log(Level, String),
    /// What only this plugin asks of the host.
    Own(P),
}

/// A core the driver runs: it yields effects and hears of those the host refused.
pub trait Core {
    /// Its metrics.
    type Metric;
    /// Its refusals.
    type Refusal: Refusal;
    /// Its own effects.
    type Own;
    /// The next effect to carry out, if any.
    fn poll(&mut self) -> Option<Effect<Self::Metric, Self::Refusal, Self::Own>>;
    /// The host could not carry `effect` out (`error` says why, for the log); the flow the
    /// request takes now (effects the core queues in answer come from [`Core::poll`]).
    fn failed(
        &mut self,
        effect: Effect<Self::Metric, Self::Refusal, Self::Own>,
        error: String,
    ) -> Flow;
}
