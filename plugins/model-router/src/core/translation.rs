//! A response on its way from one wire API to another: the downstream role's (from the API
//! the later filters saw — the first attempt's deployment's — to the client's), and the
//! upstream role's for an attempt whose deployment speaks another API than the body it got
//! (from that deployment's API back to the body's, so the listener's filters see one API in
//! both directions).
//!
//! A JSON body (a success or an error) is held whole, headers included, and replaced once:
//! its `content-length` is then the translated body's, and a body that cannot be translated
//! becomes a 502 in the client's API. An event stream is translated chunk by chunk
//! ([`StreamTranslator`]): its `content-length` is removed at the headers.

use super::protocol::{Effect, Level, Map, Next, OnFailure, View};
use super::Core;
use crate::translate::{self, Asked, ResponseParams, StreamTranslator, Wire};

/// Largest JSON response held for translation; a larger one becomes a 502 (a chat answer is
/// far smaller; Envoy's buffer limit usually refuses it first).
pub const MAX_JSON_RESPONSE: usize = 32 * 1024 * 1024;

/// One response's translation.
pub(super) struct ResponseTranslation {
    from: Wire,
    to: Wire,
    asked: Asked,
    /// Unix seconds: `created` of a Chat answer (the request's time: no clock read here).
    created: u64,
    state: State,
}

enum State {
    /// Before the response headers.
    Waiting,
    /// A JSON (or other non-stream) body, held whole: its status, and whether its
    /// `content-type` says JSON already.
    Holding(u16, bool),
    /// An event stream.
    Streaming(Box<StreamTranslator>),
    /// Nothing to translate (a gateway filter's own reply, a body-less response, done).
    Done,
}

impl ResponseTranslation {
    /// A response of API `from` for a client (or body) of API `to`, to a request made at
    /// `created` (Unix seconds).
    pub(super) fn new(from: Wire, to: Wire, asked: Asked, created: u64) -> Self {
        ResponseTranslation {
            from,
            to,
            asked,
            created,
            state: State::Waiting,
        }
    }

    /// True while body events remain to be translated.
    pub(super) fn active(&self) -> bool {
        matches!(self.state, State::Holding(..) | State::Streaming(_))
    }
}

/// Whether a `content-type` value starts with `prefix` (ASCII case ignored).
fn starts_with(content_type: Option<&[u8]>, prefix: &[u8]) -> bool {
    content_type.is_some_and(|v| {
        v.get(..prefix.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(prefix))
    })
}

impl Core {
    /// The response headers of a translated response: a stream is translated as it comes, a
    /// body is held whole (`Next::Pause`). `Continue` when nothing is to be translated.
    /// `status`: the response's, read by the caller.
    pub(super) fn translate_response_headers(
        &mut self,
        tr: &mut ResponseTranslation,
        status: Option<u16>,
        end_of_stream: bool,
        view: &dyn View,
    ) -> Next {
        let status = status.unwrap_or(0);
        if end_of_stream || status == 0 {
            tr.state = State::Done;
            return Next::Continue;
        }
        let content_type = view.response_header("content-type");
        if status == 200 && starts_with(content_type.as_deref(), b"text/event-stream") {
            let params = ResponseParams {
                created: tr.created,
            };
            tr.state = State::Streaming(Box::new(StreamTranslator::new(
                tr.from, tr.to, tr.asked, params,
            )));
            self.remove_header(
                Map::Response,
                "content-length",
                OnFailure::Log(Level::Warn, "cannot remove the content-length"),
            );
            return Next::Continue;
        }
        let json = starts_with(content_type.as_deref(), b"application/json");
        tr.state = State::Holding(status, json);
        Next::Pause
    }

    /// A response body chunk of a translated response (`size` bytes: the chunk, or the whole
    /// body held so far).
    pub(super) fn translate_response_body(
        &mut self,
        tr: &mut ResponseTranslation,
        size: usize,
        end_of_stream: bool,
        view: &dyn View,
    ) -> Next {
        match &mut tr.state {
            State::Waiting | State::Done => Next::Continue,
            State::Streaming(stream) => {
                let mut out = Vec::with_capacity(size + size / 2 + 64);
                if size > 0 {
                    view.with_response_body(size, &mut |chunk| stream.push(chunk, &mut out));
                }
                if end_of_stream {
                    let complete = stream.finished();
                    stream.finish(&mut out);
                    if !complete {
                        self.count("stream_interrupted");
                        self.log(
                            Level::Warn,
                            "stream ended without its terminator: error event sent".to_string(),
                        );
                    }
                }
                let skipped = stream.skipped();
                if end_of_stream {
                    tr.state = State::Done;
                    if skipped > 0 {
                        self.count("translation.skipped_events");
                    }
                }
                self.push(
                    Effect::ReplaceResponseBody { size, body: out },
                    OnFailure::Log(Level::Error, "cannot replace the translated stream chunk"),
                );
                Next::Continue
            }
            State::Holding(status, json) => {
                let (status, json) = (*status, *json);
                if !end_of_stream && size <= MAX_JSON_RESPONSE {
                    return Next::Pause;
                }
                tr.state = State::Done;
                let translated = if size > MAX_JSON_RESPONSE {
                    Err(translate::Malformed(format!(
                        "the response is larger than {MAX_JSON_RESPONSE} bytes"
                    )))
                } else {
                    let body = view.response_body(size).unwrap_or_default();
                    if status < 400 {
                        let params = ResponseParams {
                            created: tr.created,
                        };
                        translate::response(tr.from, tr.to, &body, &params)
                    } else {
                        Ok(translate::error(tr.from, tr.to, status, &body))
                    }
                };
                let body = match translated {
                    Ok(body) => body,
                    Err(malformed) => {
                        self.count("translation.malformed_responses");
                        self.log(
                            Level::Warn,
                            format!(
                                "a provider response could not be translated: {}",
                                malformed.0
                            ),
                        );
                        let reject = malformed.reject();
                        self.set_header(
                            Map::Response,
                            ":status",
                            reject.status.to_string(),
                            OnFailure::Log(Level::Error, "cannot set the status"),
                        );
                        reject.body_in(tr.to.error_shape())
                    }
                };
                let note = OnFailure::Log(Level::Error, "cannot frame the translated response");
                self.set_header(
                    Map::Response,
                    "content-length",
                    body.len().to_string(),
                    note,
                );
                self.remove_header(Map::Response, "transfer-encoding", note);
                if !json {
                    self.set_header(Map::Response, "content-type", "application/json", note);
                }
                self.push(
                    Effect::ReplaceResponseBody { size, body },
                    OnFailure::Log(Level::Error, "cannot replace the translated response"),
                );
                Next::Continue
            }
        }
    }
}
