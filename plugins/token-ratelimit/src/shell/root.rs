//! The plugin's own filter: its root context (configuration, Redis replies, the tick).

use super::request::Limiter;
use super::state::{log, nonce, State};
use crate::config::parse_document;
use crate::core::{Core, Input};
use llm_gateway_shared::host::{self, redis_client, LogLevel, Sink};
use llm_gateway_shared::redis::TransportName;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::rc::Rc;

// The standalone module's entry point; a module holding several plugins (`plugins/bundle`)
// turns the `standalone` feature off and creates this plugin's root context with
// [`root_context`].
#[cfg(feature = "standalone")]
proxy_wasm::main! {{
    proxy_wasm::set_root_context(root_context);
}}

/// A root context of this plugin (what the standalone module creates for every `root_id`).
pub fn root_context(_context_id: u32) -> Box<dyn RootContext> {
    Box::new(Root::default())
}

#[derive(Default)]
struct Root {
    state: Option<Rc<State>>,
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        if let Some(state) = &self.state {
            let reply = redis_client::http_reply(body_size);
            state.drive(None, None, Input::Reply { token, reply }, &mut Sink::Host);
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let Some(rules) = host::load_config("token-ratelimit", parse_document) else {
            return false;
        };
        let redis = rules.configs().find_map(|c| c.redis.clone());
        let period = rules
            .configs()
            .find(|c| c.redis.is_some())
            .map_or(100, |c| c.lease.sync_ms);
        let http = redis
            .as_ref()
            .is_some_and(|r| r.transport.name() == TransportName::Http);
        let state = Rc::new(State::new(Core::new(rules, nonce(), http), redis));
        if let Some(redis) = &state.redis {
            let for_replies = Rc::clone(&state);
            let on_reply = move |token, reply| {
                let input = Input::Reply { token, reply };
                for_replies.drive(None, None, input, &mut Sink::Host);
            };
            if let Err(why) = redis_client::connect([redis], on_reply) {
                log(LogLevel::Error, &why);
                return false;
            }
            if let Err(err) = host::set_tick_period_ms(period) {
                // without ticks no lease is topped up and no journal replayed
                let line = format!("cannot set the tick period: {err}");
                log(LogLevel::Error, &line);
            }
        }
        self.state = Some(state);
        true
    }

    fn on_tick(&mut self) {
        if let Some(state) = &self.state {
            state.drive(None, None, Input::Tick, &mut Sink::Host);
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let state = self.state.clone();
        Some(Box::new(Limiter::new(context_id, state)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
