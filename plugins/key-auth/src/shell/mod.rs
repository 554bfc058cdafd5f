//! The proxy-wasm adapter: copies the request headers, the selected configuration and the time
//! into the stage core ([`crate::core`]), and the one driver (`host::stage::carry`) carries its
//! commands out — in key-auth's own filter ([`filter`]), in the fused one ([`fused`]), and when
//! Redis answers a request that waited for it. Every host call goes through
//! `llm_gateway_shared::host`; nothing here decides.

use crate::config::parse_document;
use llm_gateway_shared::host::{self, LogLevel};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use state::State;
use std::rc::Rc;
use store::Store;

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

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let Some(rules) = host::load_config("key-auth", parse_document) else {
            return false;
        };
        let keys = rules.global().map_or(0, |c| c.keys.len());
        let line = format!("key-auth: configured with {keys} keys");
        host::log(LogLevel::Info, &line);
        let store = rules.configs().find_map(|c| c.store.clone());
        let state = Rc::new(State::new(rules, store.map(Store::new)));
        if !connect(&state) {
            return false;
        }
        self.state = Some(state);
        true
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(filter::Filter::new(
            context_id,
            self.state.clone(),
        )))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Connects Redis when the config has a key store, its answers resuming the requests that wait
/// for them ([`filter::resume`]): `false` (logged) refuses the configuration.
fn connect(state: &Rc<State>) -> bool {
    let Some(store) = &state.store else {
        return true;
    };
    let for_replies = Rc::clone(state);
    store.connect(move |token, reply| filter::resume(&for_replies, token, reply))
}

mod cache;
mod filter;
mod fused;
mod state;
mod store;
pub use fused::{Fused, FusedStage};
