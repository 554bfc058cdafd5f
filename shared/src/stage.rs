//! The one stage protocol between a plugin's core and its host, quinn-proto's shape: the
//! driver copies what the host said into the core's [`Input`] (one vocabulary for every core:
//! [`Stage::handle`]) and asks the core which data it wants read first ([`Stage::wants`]); the
//! core never calls the host, it queues [`Effect`]s, which the one driver
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
use crate::request::RequestHead;
use std::borrow::Cow;
use std::convert::Infallible;

/// A header, property or metric name: nearly always a constant, so no allocation.
pub type Name = Cow<'static, str>;

/// What the host callback does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Let the data (or headers) go on.
    Continue,
    /// (A header callback's answer.) Let the headers go on in the plugin's own filter, whose
    /// body callbacks hold the body themselves; in the fused filter, hold them: the stage
    /// takes the body whole, in one step.
    Whole,
    /// Hold: the host buffers the body, or the headers wait for it.
    Pause,
    /// An asynchronous call is out: hold until the plugin resumes the request.
    Wait,
    /// A local reply was asked for ([`Effect::Refuse`]); the request goes no further.
    Refused,
}

/// The response headers every core reads, read once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResponseHead {
    /// `:status`; 0 if absent or not a number.
    pub status: u16,
    /// `content-type` (lossy UTF-8), if present.
    pub content_type: Option<String>,
    /// `content-encoding` (lossy UTF-8), if present.
    pub content_encoding: Option<String>,
    /// `content-length`, when it is a number.
    pub content_length: Option<u64>,
}

impl ResponseHead {
    /// The head from a header lookup (`get`: a header's first value).
    pub fn read<'a, V: AsRef<[u8]> + 'a>(get: impl Fn(&str) -> Option<V>) -> ResponseHead {
        let text = |name: &str| get(name).map(|v| String::from_utf8_lossy(v.as_ref()).into_owned());
        ResponseHead {
            // parsed untrimmed, as a status is sent
            status: get(":status")
                .and_then(|v| std::str::from_utf8(v.as_ref()).ok()?.parse().ok())
                .unwrap_or(0),
            content_type: text("content-type"),
            content_encoding: text("content-encoding"),
            content_length: get("content-length")
                .and_then(|v| std::str::from_utf8(v.as_ref()).ok()?.trim().parse().ok()),
        }
    }

    /// A `content-encoding` other than `identity`: the body cannot be read as sent.
    pub fn encoded(&self) -> bool {
        self.content_encoding
            .as_deref()
            .is_some_and(|v| !v.is_empty() && !v.eq_ignore_ascii_case("identity"))
    }
}

/// One event of a request, with the host's data copied in: what every core takes. `C` is the
/// core's configuration, selected by the request's route.
#[derive(Debug)]
pub enum Input<'a, C> {
    /// The request headers; `config`: the configuration the route selects (`None`: the
    /// plugin has none for it, or no valid configuration at all).
    RequestHeaders {
        /// The selected configuration.
        config: Option<C>,
        /// The headers.
        head: &'a RequestHead,
        /// No body follows.
        end_of_stream: bool,
    },
    /// Request body data: `size` bytes (buffered so far, in the plugin's own filter while it
    /// holds); `body` is the data when [`Stage::wants`] asked for it, `None` otherwise.
    RequestBody {
        /// Bytes of the body.
        size: usize,
        /// The body is complete.
        end_of_stream: bool,
        /// The data, if asked for.
        body: Option<&'a [u8]>,
    },
    /// The request body [`Stage::wants`] asked for could not be read (the driver logged why).
    RequestBodyUnreadable {
        /// Bytes of the body.
        size: usize,
        /// The body is complete.
        end_of_stream: bool,
    },
    /// The response headers ([`Stage::wants`] them).
    ResponseHeaders {
        /// The headers.
        head: &'a ResponseHead,
        /// No body follows.
        end_of_stream: bool,
    },
    /// Response body data: this callback's chunk (or the held body), `body` as for the
    /// request (`None` also when it could not be read: the data then passes as it is).
    ResponseBody {
        /// Bytes of the chunk.
        size: usize,
        /// The last chunk.
        end_of_stream: bool,
        /// The data, if asked for.
        body: Option<&'a [u8]>,
    },
    /// The response trailers came (the body ended without `end_of_stream`); `body`: the
    /// buffered body when [`Stage::wants`] [`Read::BodyAtTrailers`].
    ResponseTrailers {
        /// The buffered body, if asked for.
        body: Option<&'a [u8]>,
    },
    /// The request is over; `superseded`: an internal redirect replaced this pass
    /// ([`Read::Supersession`] asked).
    Log {
        /// Superseded by an internal redirect.
        superseded: bool,
    },
}

/// What the driver reads for the next input only if the core wants it (each read is a host
/// call, some once per streamed event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// The request body's data (`size` bytes).
    RequestBody {
        /// Bytes of the body.
        size: usize,
        /// The body is complete.
        end_of_stream: bool,
    },
    /// The response headers (otherwise the core is not called for them).
    ResponseHeaders {
        /// No body follows.
        end_of_stream: bool,
    },
    /// The response chunk's data.
    ResponseBody {
        /// The last chunk.
        end_of_stream: bool,
    },
    /// The buffered response body when the trailers come.
    BodyAtTrailers,
    /// The log event (otherwise the core is not called for it).
    Log,
    /// Whether an internal redirect superseded the pass (the response's code details).
    Supersession,
}

/// What a core may ask of the host while it handles an input: the time and the request's
/// properties, read only when needed.
pub trait Env {
    /// Milliseconds since the Unix epoch (the gateway's clock rule: `crate::clock`).
    fn now_ms(&mut self) -> u64;
    /// A property of the request (filter state or an Envoy attribute), raw; `None` if absent
    /// or unreadable.
    fn property(&mut self, path: &[&str]) -> Option<Vec<u8>>;
}

/// A core fed the one [`Input`] vocabulary.
pub trait Stage: Core {
    /// Its configuration, as a route selects it.
    type Config;
    /// What its requests on one worker share.
    type Worker: Default;
    /// Takes one event; the effects it produced wait in [`Core::poll`].
    fn handle(
        &mut self,
        worker: &mut Self::Worker,
        env: &mut dyn Env,
        input: Input<'_, Self::Config>,
    ) -> Flow;
    /// Whether the driver reads `read` for the next input.
    fn wants(&self, read: Read) -> bool;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn head(pairs: &[(&str, &[u8])]) -> ResponseHead {
        ResponseHead::read(|name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v))
    }

    #[test]
    fn the_response_head_reads_what_cores_look_at() {
        let h = head(&[
            (":status", b"200"),
            ("content-type", b"text/event-stream"),
            ("content-length", b" 42 "),
        ]);
        assert_eq!(h.status, 200);
        assert_eq!(h.content_type.as_deref(), Some("text/event-stream"));
        assert_eq!(h.content_length, Some(42));
        assert_eq!(h.content_encoding, None);
        assert!(!h.encoded());
    }

    #[test]
    fn a_bad_status_or_length_reads_as_absent_and_text_is_lossy() {
        let h = head(&[
            (":status", b" 200"),
            ("content-length", b"many"),
            ("content-type", b"application/json\xff"),
        ]);
        assert_eq!(h.status, 0, "a status is parsed untrimmed");
        assert_eq!(h.content_length, None);
        assert_eq!(h.content_type.as_deref(), Some("application/json\u{fffd}"));
        assert_eq!(head(&[]), ResponseHead::default());
    }

    #[test]
    fn only_a_real_content_encoding_makes_the_body_unreadable() {
        assert!(head(&[("content-encoding", b"gzip")]).encoded());
        assert!(!head(&[("content-encoding", b"IDENTITY")]).encoded());
        assert!(!head(&[("content-encoding", b"")]).encoded());
    }
}
