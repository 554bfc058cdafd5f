//! The plugin's own filter: one HTTP context per request.

use super::head::read_request_head;
use super::state::{State, PLUGIN};
use crate::config::Config;
use crate::core::Input;
use llm_gateway_shared::host::{self, redis_client, Sink};
use llm_gateway_shared::reentry::is_superseded;
use llm_gateway_shared::reject::Reject;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::rc::Rc;

/// One request's context.
pub(super) struct Limiter {
    id: u32,
    state: Option<Rc<State>>,
}

impl Context for Limiter {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        if let Some(state) = &self.state {
            let reply = redis_client::http_reply(body_size);
            let input = Input::Reply { token, reply };
            state.drive(Some(self.id), None, input, &mut Sink::Host);
        }
    }

    fn on_done(&mut self) -> bool {
        // Envoy runs on_log before on_done; a request still known here was never settled
        // (a host that skipped on_log): the core settles it rather than leak it.
        let state = self.state.as_ref();
        if state.is_some_and(|s| s.core.borrow().unsettled(self.id)) {
            self.run(Input::Done { ctx: self.id });
        }
        true
    }
}

impl Limiter {
    pub(super) fn new(id: u32, state: Option<Rc<State>>) -> Limiter {
        Limiter { id, state }
    }

    /// Feeds an event of this request to the core; the action for its callback.
    fn run(&self, input: Input) -> Action {
        let Some(state) = &self.state else {
            return Action::Continue;
        };
        state
            .drive(Some(self.id), Some(self.id), input, &mut Sink::Host)
            .action()
    }
}

impl HttpContext for Limiter {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(state) = &self.state else {
            let reject = Reject::internal("token-ratelimit is not configured");
            host::refuse(PLUGIN, &reject);
            return Action::Pause;
        };
        let (config, counts_ip) = {
            let core = state.core.borrow();
            let selected = host::select_config(core.rules(), None);
            let config = selected.and_then(|c| core.config_index(c));
            (config, selected.is_some_and(Config::counts_ip))
        };
        let head = config.map(|_| read_request_head(counts_ip));
        let (ctx, head) = (self.id, head.unwrap_or_default());
        let input = Input::RequestHeaders {
            ctx,
            config,
            head,
            end_of_stream,
        };
        self.run(input)
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        let ctx = self.id;
        self.run(Input::RequestBody {
            ctx,
            size,
            end_of_stream,
        })
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        self.run(Input::ResponseHeaders { ctx: self.id });
        Action::Continue
    }

    fn on_log(&mut self) {
        if let Some(state) = &self.state {
            let watches = state.core.borrow().watches_supersession(self.id);
            let superseded = watches && is_superseded(host::code_details().as_deref());
            let ctx = self.id;
            self.run(Input::Log { ctx, superseded });
        }
    }
}
