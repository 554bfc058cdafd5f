//! One request in the fused filter: the host's callbacks drive the engine over the stages, and
//! the stages' edits go back to the host once ([`super::write`]).

use llm_gateway_shared::chain::{self, Direction, Engine, Stage};
use llm_gateway_shared::host::{self, Buffer, HeaderMap, LogLevel};
use llm_gateway_shared::reject::Reject;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

pub(super) const PLUGIN: &str = "llm_gateway";

/// One request in the fused filter.
pub(super) struct Fused {
    engine: Engine,
    stages: Vec<Box<dyn Stage<chain::Exchange>>>,
    pub(super) x: chain::Exchange,
    configured: bool,
    /// Bytes of the host's body buffer when the current data was read.
    pub(super) size: usize,
    /// The host holds the request headers (their callback paused, nothing has continued them
    /// since).
    pub(super) request_held: bool,
    /// The same for the response headers.
    pub(super) response_held: bool,
}

impl Context for Fused {}

pub(super) fn maps(direction: Direction) -> (HeaderMap, Buffer) {
    match direction {
        Direction::Request => (HeaderMap::RequestHeaders, Buffer::RequestBody),
        Direction::Response => (HeaderMap::ResponseHeaders, Buffer::ResponseBody),
    }
}

impl Fused {
    pub(super) fn new(stages: Vec<Box<dyn Stage<chain::Exchange>>>, configured: bool) -> Self {
        Fused {
            engine: Engine::new(stages.len()),
            stages,
            x: chain::Exchange::default(),
            configured,
            size: 0,
            request_held: false,
            response_held: false,
        }
    }

    fn headers(&mut self, direction: Direction, end_of_stream: bool) -> Action {
        self.x.next_callback();
        if !self.configured {
            host::refuse(PLUGIN, &Reject::internal("llm-gateway is not configured"));
            return Action::Pause;
        }
        let (map, _) = maps(direction);
        let pairs = match host::headers(map) {
            Ok(pairs) => pairs,
            Err(err) => {
                host::log(
                    LogLevel::Error,
                    &format!("llm-gateway: cannot read the headers: {err}"),
                );
                host::refuse(PLUGIN, &Reject::internal("cannot read the request"));
                return Action::Pause;
            }
        };
        let headers = chain::Headers::new(pairs);
        // the data of the other direction is not this one's (a local reply's response comes
        // while the request's edited body was never written)
        self.x.data.clear();
        self.x.data_changed = false;
        match direction {
            Direction::Request => self.x.request = headers,
            Direction::Response => self.x.response = headers,
        }
        let outcome = self
            .engine
            .headers(&mut self.stages, &mut self.x, direction, end_of_stream);
        self.set_held(direction, true);
        self.finish(direction, outcome)
    }

    fn data(&mut self, direction: Direction, size: usize, end_of_stream: bool) -> Action {
        self.x.next_callback();
        if self.engine.wants_data(direction, end_of_stream) {
            let (_, buffer) = maps(direction);
            match host::buffer(buffer, 0, size) {
                Ok(data) => self.x.data = data,
                Err(err) => {
                    host::log(
                        LogLevel::Error,
                        &format!("llm-gateway: cannot read the body: {err}"),
                    );
                    if direction == Direction::Request {
                        host::refuse(PLUGIN, &Reject::internal("cannot read the request"));
                        return Action::Pause;
                    }
                    return Action::Continue; // a response passes as it is
                }
            }
            self.x.data_changed = false;
            self.size = size;
        }
        let outcome = self
            .engine
            .data(&mut self.stages, &mut self.x, direction, end_of_stream);
        self.finish(direction, outcome)
    }
}

impl HttpContext for Fused {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.headers(Direction::Request, end_of_stream)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.data(Direction::Request, body_size, end_of_stream)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.headers(Direction::Response, end_of_stream)
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.data(Direction::Response, body_size, end_of_stream)
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        self.x.next_callback();
        // the body ended without end_of_stream: its end is now (a held body is whole, a
        // stream's last chunk was taken already)
        let held = self.engine.wants_data(Direction::Response, true)
            && !self.engine.headers_done(Direction::Response);
        self.x.data = if held {
            host::buffer(Buffer::ResponseBody, 0, usize::MAX).unwrap_or_default()
        } else {
            Vec::new()
        };
        self.x.data_changed = false;
        self.size = self.x.data.len();
        let outcome = self
            .engine
            .data(&mut self.stages, &mut self.x, Direction::Response, true);
        self.finish(Direction::Response, outcome)
    }

    fn on_log(&mut self) {
        self.x.next_callback();
        self.engine.log(&mut self.stages, &mut self.x);
    }
}
