//! The proxy-wasm registration: the plugin's configuration, state and core
//! (`llm_gateway_shared::host::filter`, which feeds the core the host's data and carries its
//! effects out, for the plugin's own filter and its stage of the fused filter alike), and its
//! counters. Nothing here decides what is personal data, what is refused or what is restored.
//!
//! The placeholder map lives in the core's exchange and goes away with the HTTP context —
//! except when an internal redirect supersedes the pass (`llm_gateway_shared::reentry`): the
//! core then stashes it in the worker under `x-llm-request-id`, and the pass that re-enters
//! with `x-llm-reentry` takes it back. Logs and metrics carry rule names and counts, never a
//! value.

use crate::config::{parse_document, PiiConfig};
use crate::core::{counters, Counter, Exchange, Worker};
use llm_gateway_shared::config::ConfigError;
use llm_gateway_shared::host::filter::{self, Filter};
use llm_gateway_shared::host::{self, HostResult, LogLevel, Metric, Sink};
use llm_gateway_shared::request::RequestHead;
use llm_gateway_shared::rules::RuleSet;
use proxy_wasm::traits::RootContext;
use std::cell::RefCell;
use std::collections::HashMap;
use std::convert::Infallible;
use std::rc::Rc;

// The standalone module's entry point; a module holding several plugins (`plugins/bundle`)
// turns the `standalone` feature off and creates this plugin's root context with
// [`root_context`].
#[cfg(feature = "standalone")]
proxy_wasm::main! {{
    proxy_wasm::set_root_context(root_context);
}}

/// A root context of this plugin (what the standalone module creates for every `root_id`).
pub fn root_context(context_id: u32) -> Box<dyn RootContext> {
    filter::root_context::<Pii>(context_id)
}

/// This plugin configured from its section of the fused filter's configuration.
pub type Fused = filter::Fused<Pii>;
/// One request's pii-redaction stage in the fused filter.
pub type FusedStage = filter::FusedStage<Pii>;

/// The plugin, as the host registers it.
pub struct Pii;

/// What every request of a configuration shares: its rules, counters and the worker's stash.
pub struct State {
    rules: RuleSet<Rc<PiiConfig>>,
    /// The counters ([`crate::core::counters`]), defined once per configuration.
    metrics: HashMap<Counter, Metric>,
    worker: RefCell<Worker>,
}

impl Filter for Pii {
    const NAME: &'static str = "pii-redaction";
    const PLUGIN: &'static str = "pii_redaction";
    type Document = RuleSet<Rc<PiiConfig>>;
    type State = State;
    type Core = Exchange;

    fn parse(document: &[u8]) -> Result<Self::Document, ConfigError> {
        parse_document(document)
    }

    fn state(rules: Self::Document, fused: bool) -> Option<State> {
        if !fused {
            let count = rules.global().map_or(0, |c| c.redactor.rules().len());
            let line = format!("pii-redaction: configured with {count} rules");
            host::log(LogLevel::Info, &line);
        }
        let configs: Vec<&PiiConfig> = rules.configs().map(|c| c.as_ref()).collect();
        let metrics = counters(configs)
            .into_iter()
            .filter_map(|(counter, name)| Some((counter, Metric::counter(&name).ok()?)))
            .collect();
        Some(State {
            rules,
            metrics,
            worker: RefCell::default(),
        })
    }

    /// Without a valid configuration the plugin's own filter refuses every request: it never
    /// lets one pass unscanned.
    fn core(state: Option<&State>) -> Exchange {
        match state {
            Some(_) => Exchange::default(),
            None => Exchange::unconfigured(),
        }
    }

    fn select(state: &State, head: &RequestHead) -> Option<Rc<PiiConfig>> {
        host::select_config(&state.rules, Some(&head.authority)).cloned()
    }

    fn worker(state: &State) -> &RefCell<Worker> {
        &state.worker
    }

    fn count(state: &State, counter: &Counter, delta: u64) {
        if let Some(metric) = state.metrics.get(counter) {
            let _ = metric.increment(i64::try_from(delta).unwrap_or(i64::MAX));
        }
    }

    fn own(_: &State, effect: &Infallible, _: &mut Sink<'_>) -> HostResult<()> {
        match *effect {}
    }
}
