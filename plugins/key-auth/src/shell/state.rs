//! What every request of one configuration shares — the rules, the counters, the re-entry
//! secret, the key store — and the one driver over the core's commands for a request.

use super::store::Store;
use crate::config::KeyAuthConfig;
use crate::core::{self, counters, Exchange, Flow, Lookup, Metric, Request};
use crate::reentry::Secret;
use llm_gateway_shared::host::{self, stage, HostError, HostResult, Sink};
use llm_gateway_shared::rules::RuleSet;

const PLUGIN: &str = "key_auth";

/// One configuration's state.
pub(super) struct State {
    rules: RuleSet<KeyAuthConfig>,
    /// The counters ([`crate::core::counters`]).
    metrics: Vec<(Metric, host::Metric)>,
    /// This VM's re-entry ticket secret.
    secret: Secret,
    /// Redis-held keys (the Higress build with `redis`).
    pub(super) store: Option<Store>,
}

impl State {
    /// The state of `rules`, its counters defined and a secret drawn.
    pub(super) fn new(rules: RuleSet<KeyAuthConfig>, store: Option<Store>) -> State {
        let metrics = counters()
            .into_iter()
            .filter_map(|(metric, name)| Some((metric, host::Metric::counter(&name).ok()?)))
            .collect();
        State {
            rules,
            metrics,
            secret: random_secret(),
            store,
        }
    }

    /// What the core needs of a request whose headers are `headers` (every header is at hand:
    /// the host is not asked for `:authority` again).
    pub(super) fn request<'a>(&'a self, headers: &'a [(String, Vec<u8>)]) -> Request<'a> {
        let config = host::select_config(&self.rules, Some(core::header(headers, ":authority")));
        Request {
            config,
            headers,
            // the expiry's clock, which fails closed: the host's own reading, not the last good
            now: core::seconds(config, || host::now_nanos().ok()),
            secret: &self.secret,
        }
    }
}

/// 32 bytes from the host's randomness: std seeds `RandomState` from WASI `random_get`, once
/// per VM, with 128 random bits that every hasher's keys derive from.
fn random_secret() -> Secret {
    use std::hash::BuildHasher;
    let state = std::collections::hash_map::RandomState::new();
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&state.hash_one(i).to_le_bytes());
    }
    Secret::new(bytes)
}

/// What the driver asks of this plugin for request `ctx`: its counters and its key store.
struct Effects<'a> {
    state: Option<&'a State>,
    ctx: u32,
}

impl stage::Plugin<Exchange> for Effects<'_> {
    fn count(&self, metric: &Metric, delta: u64) {
        let known = self.state.iter().flat_map(|s| &s.metrics);
        if let Some((_, counter)) = known.into_iter().find(|(m, _)| m == metric) {
            let _ = counter.increment(i64::try_from(delta).unwrap_or(i64::MAX));
        }
    }

    fn own(&self, lookup: &Lookup, _: &mut Sink<'_>) -> HostResult<()> {
        match self.state.and_then(|s| s.store.as_ref()) {
            Some(store) => store.fetch(self.ctx, lookup),
            None => Err(HostError::Unimplemented),
        }
    }
}

/// The one driver over the core's commands for request `ctx` (`state`: `None` when the plugin
/// is not configured); the flow.
pub(super) fn carry(
    state: Option<&State>,
    ctx: u32,
    x: &mut Exchange,
    flow: Flow,
    sink: &mut Sink<'_>,
) -> Flow {
    stage::carry(x, flow, sink, PLUGIN, &Effects { state, ctx })
}
