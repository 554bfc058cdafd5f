//! The proxy-wasm registration: the plugin's configuration, state and core
//! (`llm_gateway_shared::host::filter`, which feeds the core the host's data and carries its
//! effects out, for the plugin's own filter and its stage of the fused filter alike), and what
//! only it asks of the host: publishing a record (filter state, log line, metrics, the ledger
//! through Higress's Redis calls or webdis: [`ledger`]). Nothing here decides.

use crate::config::{parse_shared, UsageConfig};
use crate::core::{Publish, Stage, Worker};
use llm_gateway_shared::config::ConfigError;
use llm_gateway_shared::host::filter::{self, Filter};
use llm_gateway_shared::host::{self, HostResult, Sink};
use llm_gateway_shared::request::RequestHead;
use llm_gateway_shared::rules::RuleSet;
use proxy_wasm::traits::RootContext;
use std::cell::RefCell;
use std::convert::Infallible;
use std::rc::Rc;

mod ledger;
mod state;
use state::State;

// The standalone module's entry point; a module holding several plugins (`plugins/bundle`)
// turns the `standalone` feature off and creates this plugin's root context with
// [`root_context`].
#[cfg(feature = "standalone")]
proxy_wasm::main! {{
    proxy_wasm::set_root_context(root_context);
}}

/// A root context of this plugin (what the standalone module creates for every `root_id`).
pub fn root_context(context_id: u32) -> Box<dyn RootContext> {
    filter::root_context::<Usage>(context_id)
}

/// This plugin configured from its section of the fused filter's configuration (a ledger
/// only over HTTP to webdis: the fused filter is for plain Envoy).
pub type Fused = filter::Fused<Usage>;
/// One request's usage-accounting stage in the fused filter.
pub type FusedStage = filter::FusedStage<Usage>;

/// The plugin, as the host registers it.
pub struct Usage;

impl Filter for Usage {
    const NAME: &'static str = "usage-accounting";
    /// usage-accounting sends no local reply.
    const PLUGIN: &'static str = "usage_accounting";
    type Document = RuleSet<Rc<UsageConfig>>;
    type State = State;
    type Core = Stage;

    fn parse(document: &[u8]) -> Result<Self::Document, ConfigError> {
        parse_shared(document)
    }

    fn state(rules: Self::Document, fused: bool) -> Option<State> {
        State::new(rules, fused)
    }

    fn core(_: Option<&State>) -> Stage {
        Stage::default()
    }

    fn select(state: &State, head: &RequestHead) -> Option<Rc<UsageConfig>> {
        host::select_config(&state.rules, Some(&head.authority)).cloned()
    }

    fn worker(state: &State) -> &RefCell<Worker> {
        &state.worker
    }

    fn count(_: &State, never: &Infallible, _: u64) {
        match *never {}
    }

    fn own(state: &State, publish: &Publish, sink: &mut Sink<'_>) -> HostResult<()> {
        state.publish(publish, sink)
    }

    fn queue_ready(state: &State, queue: u32) {
        state.queue_ready(queue);
    }

    /// The webdis answers to ledger appends (the root's, sent for the requests by
    /// `on_queue_ready`, and a request's own).
    fn http_call_response(state: &State, body_size: usize) {
        state.ledger_reply(body_size);
    }
}
