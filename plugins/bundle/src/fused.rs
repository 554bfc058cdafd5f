//! The fused filter: the five plugins' stages in one HTTP filter context (root id
//! `llm-gateway`), driven by [`llm_gateway_shared::chain::Engine`].
//!
//! Per request the host is asked once for the request headers, once for the whole request
//! body, once for the response headers and once per response chunk; every stage reads and
//! edits that one copy ([`chain::Exchange`]), and the edits go back to the host once: header
//! edits when the headers continue, the body when it was changed (its `content-length` kept
//! true). Envoy calls one filter per callback instead of five.

use crate::fused_config::{self, SECTIONS};
use llm_gateway_shared::chain::{self, Direction, Engine, Outcome, Stage};
use llm_gateway_shared::host::{self, Buffer, HeaderMap, LogLevel};
use llm_gateway_shared::reject::Reject;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use std::rc::Rc;

const PLUGIN: &str = "llm_gateway";

/// The plugins configured from their sections (absent: the stage is off).
#[derive(Default)]
struct Plugins {
    key_auth: Option<key_auth::Fused>,
    model_router: Option<model_router::Fused>,
    pii_redaction: Option<pii_redaction::Fused>,
    usage_accounting: Option<usage_accounting::Fused>,
    token_ratelimit: Option<token_ratelimit::Fused>,
}

impl Plugins {
    /// One request's stages, in chain order.
    fn stages(&self, context_id: u32) -> Vec<Box<dyn Stage<chain::Exchange>>> {
        let mut stages: Vec<Box<dyn Stage<chain::Exchange>>> = Vec::with_capacity(SECTIONS.len());
        if let Some(p) = &self.key_auth {
            stages.push(Box::new(p.stage()));
        }
        if let Some(p) = &self.model_router {
            stages.push(Box::new(p.stage(context_id)));
        }
        if let Some(p) = &self.pii_redaction {
            stages.push(Box::new(p.stage()));
        }
        if let Some(p) = &self.usage_accounting {
            stages.push(Box::new(p.stage()));
        }
        if let Some(p) = &self.token_ratelimit {
            stages.push(Box::new(p.stage(context_id)));
        }
        stages
    }
}

/// The root context of the fused filter.
#[derive(Default)]
pub struct Root {
    plugins: Option<Rc<Plugins>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let Some(sections) = host::load_config("llm-gateway", fused_config::parse) else {
            return false;
        };
        let mut plugins = Plugins::default();
        if let Some(document) = sections.get("key_auth") {
            let Some(p) = key_auth::Fused::configure(document) else {
                return false;
            };
            plugins.key_auth = Some(p);
        }
        if let Some(document) = sections.get("model_router") {
            let Some(p) = model_router::Fused::configure(document) else {
                return false;
            };
            plugins.model_router = Some(p);
        }
        if let Some(document) = sections.get("pii_redaction") {
            let Some(p) = pii_redaction::Fused::configure(document) else {
                return false;
            };
            plugins.pii_redaction = Some(p);
        }
        if let Some(document) = sections.get("usage_accounting") {
            let Some(p) = usage_accounting::Fused::configure(document) else {
                return false;
            };
            plugins.usage_accounting = Some(p);
        }
        if let Some(document) = sections.get("token_ratelimit") {
            let Some(p) = token_ratelimit::Fused::configure(document) else {
                return false;
            };
            plugins.token_ratelimit = Some(p);
        }
        self.plugins = Some(Rc::new(plugins));
        true
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let stages = self
            .plugins
            .as_ref()
            .map(|p| p.stages(context_id))
            .unwrap_or_default();
        Some(Box::new(Fused {
            engine: Engine::new(stages.len()),
            stages,
            x: chain::Exchange::default(),
            configured: self.plugins.is_some(),
            size: 0,
            request_held: false,
            response_held: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// One request in the fused filter.
struct Fused {
    engine: Engine,
    stages: Vec<Box<dyn Stage<chain::Exchange>>>,
    x: chain::Exchange,
    configured: bool,
    /// Bytes of the host's body buffer when the current data was read.
    size: usize,
    /// The host holds the request headers (their callback paused, nothing has continued them
    /// since).
    request_held: bool,
    /// The same for the response headers.
    response_held: bool,
}

impl Context for Fused {}

fn maps(direction: Direction) -> (HeaderMap, Buffer) {
    match direction {
        Direction::Request => (HeaderMap::RequestHeaders, Buffer::RequestBody),
        Direction::Response => (HeaderMap::ResponseHeaders, Buffer::ResponseBody),
    }
}

impl Fused {
    fn held(&self, direction: Direction) -> bool {
        match direction {
            Direction::Request => self.request_held,
            Direction::Response => self.response_held,
        }
    }

    fn set_held(&mut self, direction: Direction, held: bool) {
        match direction {
            Direction::Request => self.request_held = held,
            Direction::Response => self.response_held = held,
        }
    }

    /// What the callback returns for the engine's `outcome`; on `Continue` the stages' edits
    /// are written to the host first.
    fn finish(&mut self, direction: Direction, outcome: Outcome) -> Action {
        let action = match outcome {
            Outcome::Continue => match self.write(direction) {
                Ok(()) => Action::Continue,
                Err(reject) => {
                    host::refuse(PLUGIN, &reject);
                    Action::Pause
                }
            },
            Outcome::Pause | Outcome::Stop => Action::Pause,
        };
        if action == Action::Continue {
            self.set_held(direction, false);
        }
        action
    }

    /// Writes the header edits and the changed data of `direction`.
    fn write(&mut self, direction: Direction) -> Result<(), Reject> {
        let (map, buffer) = maps(direction);
        // a new request body while the headers are held: its `content-length` follows (when
        // the request has one), written with the other header edits
        if self.x.data_changed && direction == Direction::Request && self.held(direction) {
            frame(&mut self.x.request, self.x.data.len());
        }
        let headers = match direction {
            Direction::Request => &mut self.x.request,
            Direction::Response => &mut self.x.response,
        };
        if headers.edited() {
            let edits = headers.take_edits();
            let written = if edits.cheaper_as_one_map(headers.pairs().len()) {
                host::set_headers(map, headers.pairs()).map_err(|err| ("(all)".to_string(), err))
            } else {
                host::write_edits(map, &edits)
            };
            if let Err((name, err)) = written {
                host::log(
                    LogLevel::Error,
                    &format!("llm-gateway: cannot write header {name}: {err}"),
                );
                return Err(Reject::internal("cannot prepare the request"));
            }
        }
        if self.x.clear_route_cache {
            // after the headers the route depends on are written
            self.x.clear_route_cache = false;
            if let Err(err) = host::clear_route_cache() {
                host::log(
                    LogLevel::Error,
                    &format!("llm-gateway: cannot clear the route cache: {err}"),
                );
                return Err(Reject::internal("cannot route the request"));
            }
        }
        if self.x.data_changed {
            self.x.data_changed = false;
            if let Err(err) = host::set_buffer(buffer, 0, self.size, &self.x.data) {
                host::log(
                    LogLevel::Error,
                    &format!("llm-gateway: cannot replace the body: {err}"),
                );
                // never forward what a stage could not change (unredacted data)
                return Err(Reject::internal("cannot rewrite the body"));
            }
        }
        Ok(())
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

/// Frames a new request body of `length` bytes, as `host::replace_request_body` does: a
/// request with `content-length` gets the new length and no `transfer-encoding`. Known from
/// the headers held, so nothing is read from the host and a header already right is not
/// written.
fn frame(request: &mut chain::Headers, length: usize) {
    if request.get("content-length").is_some() {
        request.set("content-length", length.to_string().as_bytes());
        request.remove("transfer-encoding");
    }
}
