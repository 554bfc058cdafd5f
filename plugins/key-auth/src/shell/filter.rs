//! key-auth's own filter: one request's callbacks, and its resumption when Redis answered the
//! lookup it waited for — both through the one driver ([`carry`]).

use super::state::{carry, State};
use crate::auth::NoStore;
use crate::core::{Exchange, Flow, Refusal};
use llm_gateway_shared::host::{self, HeaderMap, LogLevel, Sink};
use llm_gateway_shared::redis::Answer;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::rc::Rc;

/// One request in key-auth's own filter.
pub(super) struct Filter {
    id: u32,
    state: Option<Rc<State>>,
}

impl Filter {
    /// Request `id` under `state` (`None`: not configured, every request refused).
    pub(super) fn new(id: u32, state: Option<Rc<State>>) -> Filter {
        Filter { id, state }
    }
}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let mut x = Exchange::default();
        let state = self.state.as_deref();
        let flow = match state {
            None => x.refuse(Refusal::NotConfigured),
            Some(state) => match host::headers(HeaderMap::RequestHeaders) {
                Err(err) => x.unreadable(&err.to_string()),
                Ok(headers) => match &state.store {
                    Some(store) => x.authenticate(&state.request(&headers), &mut store.lookup()),
                    None => x.authenticate(&state.request(&headers), &mut NoStore),
                },
            },
        };
        carry(state, self.id, &mut x, flow, &mut Sink::Host).action()
    }

    // Higress (ABI 0.2.100) delivers the body while the headers wait for Redis: hold it too,
    // or it would carry the headers past an undecided key. Without a key store (the plain
    // build has none) the SDK's default is this callback: not exported there.
    #[cfg(feature = "higress")]
    fn on_http_request_body(&mut self, _size: usize, _end_of_stream: bool) -> Action {
        match self.state.as_ref().and_then(|s| s.store.as_ref()) {
            Some(store) if store.is_parked(self.id) => Action::Pause,
            _ => Action::Continue,
        }
    }
}

impl Context for Filter {
    // Only a Redis key store (the Higress build) keeps per-request state; without it the SDK's
    // default is this callback, and the plain build does not export it (scripts/unused-callbacks).
    #[cfg(feature = "higress")]
    fn on_done(&mut self) -> bool {
        if let Some(store) = self.state.as_ref().and_then(|s| s.store.as_ref()) {
            store.forget(self.id);
        }
        true
    }
}

/// Redis answered call `token` (`reply`: the raw RESP, or why the call failed): the store caches
/// the answer, then every request waiting for it is decided again and resumed (or refused).
pub(super) fn resume(state: &State, token: u32, reply: Answer) {
    let Some(store) = &state.store else {
        return;
    };
    let Some((digest, found, contexts)) = store.answered(token, reply) else {
        return;
    };
    for ctx in contexts {
        let Some(headers) = store.unpark(ctx) else {
            continue; // the request went away
        };
        if host::set_effective_context(ctx).is_err() {
            continue;
        }
        let mut x = Exchange::default();
        let flow = x.resume(&state.request(&headers), digest, found.clone());
        if carry(Some(state), ctx, &mut x, flow, &mut Sink::Host) != Flow::Continue {
            continue; // refused: the driver sent the reply
        }
        if let Err(err) = host::resume_request() {
            let line = format!("key-auth: cannot resume a request: {err}");
            host::log(LogLevel::Warn, &line);
        }
    }
}
