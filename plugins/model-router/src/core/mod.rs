//! The router's sans-I/O core: every decision of both roles, with no host call.
//!
//! Shaped like quinn-proto's `Connection`: the driver (the proxy-wasm shell, or a
//! fused filter running several plugins' cores) feeds one event at a time into
//! [`Core::handle`] (the host's data, the clock included, behind a [`View`]), then the one
//! driver of the shared stage protocol (`llm_gateway_shared::host::stage::carry`) drains
//! [`Core::poll`] through a [`Stage`] and carries out each [`Effect`] in order: set or remove
//! a header, replace the body, publish filter state, clear the route cache, refuse, answer
//! locally, count a metric, log a line. An effect whose failure changes the outcome names
//! what the core does then ([`OnFailure`]); the driver hands the failure back
//! ([`Core::failed`]), which may change the callback's flow.
//!
//! Host data comes in two ways (the clock too: [`View::now_nanos`]):
//! * through a [`View`] of the current request (headers, properties, bodies), read only when
//!   a decision needs it — what the router reads depends on its own state (a budget switch to
//!   follow, a redirect pass, a 400 to classify), and reading everything up front would cost
//!   host calls on every request. The native tests implement it over maps;
//! * through a [`Store`], the cross-worker shared data with compare-and-swap where the
//!   breakers live ([`breakers`]); the tests use an in-memory one that can inject CAS
//!   mismatches.
//!
//! One core serves every request of a root context: per-request state is keyed by the HTTP
//! context id, and [`Core::forget`] drops it when the context goes.
//!
//! A driver's loop for one callback (the shell's `Exchange::run`):
//!
//! ```text
//! let next = core.handle(context, input, &view, &store);
//! let mut stage = Stage::new(&core, context);
//! let flow = stage::carry(&mut stage, next.flow(), sink, PLUGIN, &plugin);
//! // Next::ContinueSkipResponseBody and the flow still Continue: feed no more response-body
//! // events
//! ```
//!
//! The core is not borrowed while an effect runs (a local reply re-enters the response
//! callbacks of the same request): [`Stage`] borrows it for each poll and failure only.

pub mod breakers;
mod downstream;
mod protocol;
mod translation;
mod upstream;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod translation_tests;

use crate::config::{Role, RouterConfig};
use crate::ids::IdSource;
use llm_gateway_shared::reject::Reject;
use llm_gateway_shared::route_info::BUDGET_FALLBACK_PROPERTY;
use llm_gateway_shared::rules::RuleSet;
use llm_gateway_shared::stage::{self, Flow};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;

pub use breakers::{Store, StoreError};
pub use protocol::{Effect, Input, Level, Map, Name, Next, OnFailure, Own, ReadError, View};

/// The plugin's name in local-reply details (`model_router.<code>`).
pub const PLUGIN: &str = "model_router";

/// Where the listener role's rules are visible to the upstream role of the same VM (the
/// provider clusters' upstream filter and the listener's filter share `vm_id` and code, so
/// Envoy runs them in one VM per worker; the deployments are configured once, in the
/// listener's document).
pub type ListenerRules = Rc<RefCell<Option<Rc<RuleSet<RouterConfig>>>>>;

/// Hashes a context id with one multiplication (std's SipHash costs more than the rest of a
/// streamed event's callback). Context ids come from the host, not from a client: nothing to
/// defend against flooding.
#[derive(Debug, Default, Clone, Copy)]
pub struct ContextIdHasher(u64);

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for ContextIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*byte)).wrapping_mul(GOLDEN);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(GOLDEN);
    }
}

/// Per-request state by context id.
pub(crate) type ByContext<V> = HashMap<u32, V, BuildHasherDefault<ContextIdHasher>>;

/// The router of one root context (one role).
pub struct Core {
    rules: Option<Rc<RuleSet<RouterConfig>>>,
    role: Role,
    /// When the configuration was loaded (Unix seconds): `created` of the model objects.
    configured_at: u64,
    ids: IdSource,
    listener: ListenerRules,
    downstream: ByContext<downstream::Exchange>,
    upstream: ByContext<upstream::Attempt>,
    queue: VecDeque<(Effect, OnFailure)>,
    /// What the failure of the effect [`Core::poll`] returned last means (the driver reports a
    /// failure right after the poll).
    on_failure: OnFailure,
}

impl Core {
    /// A core with no configuration yet; `seed` (host randomness) seeds the request ids,
    /// `listener` is the VM's slot for the listener role's rules.
    pub fn new(seed: u64, listener: ListenerRules) -> Self {
        Core {
            rules: None,
            role: Role::default(),
            configured_at: 0,
            ids: IdSource::new(seed),
            listener,
            downstream: ByContext::default(),
            upstream: ByContext::default(),
            queue: VecDeque::new(),
            on_failure: OnFailure::Ignore,
        }
    }

    /// Takes a parsed configuration at `now_nanos`: logs it, seeds every deployment's breaker
    /// that does not exist yet, and (listener role) shares it with the VM's upstream role.
    pub fn configure(&mut self, now_nanos: u64, rules: RuleSet<RouterConfig>, store: &dyn Store) {
        if let Some(c) = rules.global() {
            self.log(
                Level::Info,
                format!(
                    "configured ({:?}) version {} with {} deployments and {} groups",
                    c.role,
                    c.version,
                    c.deployments.len(),
                    c.groups.len()
                ),
            );
        }
        breakers::seed(&rules, store);
        let rules = Rc::new(rules);
        self.role = rules.configs().next().map(|c| c.role).unwrap_or_default();
        if rules.configs().any(|c| c.role == Role::Downstream) {
            if let Ok(mut slot) = self.listener.try_borrow_mut() {
                *slot = Some(Rc::clone(&rules));
            }
        }
        self.rules = Some(rules);
        self.configured_at = now_nanos / 1_000_000_000;
    }

    /// The role of the configuration (downstream before one is loaded).
    pub fn role(&self) -> Role {
        self.role
    }

    /// Feeds one event of request `context`; returns what the callback returns once the
    /// driver has carried out everything [`Core::poll`] yields.
    pub fn handle(
        &mut self,
        context: u32,
        input: Input,
        view: &dyn View,
        store: &dyn Store,
    ) -> Next {
        match self.role {
            Role::Downstream => self.handle_downstream(context, input, view, store),
            Role::Upstream => self.handle_upstream(context, input, view, store),
        }
    }

    /// The next effect, in order.
    pub fn poll(&mut self) -> Option<Effect> {
        let (effect, on_failure) = self.queue.pop_front()?;
        self.on_failure = on_failure;
        Some(effect)
    }

    /// The driver could not carry out `effect`, the one [`Core::poll`] returned last, for
    /// request `context` (`error` says why). Returns what the callback must return instead,
    /// if the failure changes it.
    pub fn failed(&mut self, context: u32, effect: Effect, error: &str) -> Option<Next> {
        let _ = effect; // what its failure means was queued with it
        match std::mem::replace(&mut self.on_failure, OnFailure::Ignore) {
            OnFailure::Ignore => None,
            OnFailure::Log(level, what) => {
                self.queue.push_front((
                    Effect::Log(level, tagged(format!("{what}: {error}"))),
                    OnFailure::Ignore,
                ));
                None
            }
            OnFailure::KeepLength(size) => {
                for (effect, _) in &mut self.queue {
                    if let Effect::Own(Own::SetRequestLength(length)) = effect {
                        *length = size;
                    }
                }
                self.queue.push_front((
                    Effect::Log(
                        Level::Error,
                        tagged(format!("cannot rewrite the model: {error}")),
                    ),
                    OnFailure::Ignore,
                ));
                None
            }
            OnFailure::Refuse => {
                self.queue.clear();
                if let Some(exchange) = self.downstream.get_mut(&context) {
                    exchange.routed = None;
                }
                Some(self.refuse_routing(Reject::internal("cannot route the request")))
            }
        }
    }

    /// Drops the state of request `context` (its HTTP context is gone).
    pub fn forget(&mut self, context: u32) {
        self.downstream.remove(&context);
        self.upstream.remove(&context);
    }

    /// Requests with state (for tests and leak checks).
    pub fn requests(&self) -> usize {
        self.downstream.len() + self.upstream.len()
    }

    // -- effects ---------------------------------------------------------------------------

    fn push(&mut self, effect: Effect, on_failure: OnFailure) {
        self.queue.push_back((effect, on_failure));
    }

    fn log(&mut self, level: Level, message: String) {
        self.push(Effect::Log(level, tagged(message)), OnFailure::Ignore);
    }

    fn count(&mut self, name: impl Into<Name>) {
        self.push(Effect::Count(name.into(), 1), OnFailure::Ignore);
    }

    fn gauge(&mut self, name: impl Into<Name>, value: u64) {
        self.push(Effect::Gauge(name.into(), value), OnFailure::Ignore);
    }

    /// Refuses with `reject`: counted, sent, the callback pauses.
    fn refuse(&mut self, reject: Reject) -> Next {
        self.count(format!("rejected.{}", reject.code));
        self.push(
            Effect::Refuse(reject),
            OnFailure::Log(Level::Error, "cannot send the local reply"),
        );
        Next::Pause
    }

    fn set_header(
        &mut self,
        map: Map,
        name: impl Into<Name>,
        value: impl Into<String>,
        on_failure: OnFailure,
    ) {
        self.push(
            Effect::SetHeader(map, name.into(), value.into()),
            on_failure,
        );
    }

    fn remove_header(&mut self, map: Map, name: impl Into<Name>, on_failure: OnFailure) {
        self.push(Effect::RemoveHeader(map, name.into()), on_failure);
    }

    /// Filter state `wasm.<name>`; the budget fallback is published to the fused filter's
    /// later stages too (token-ratelimit's stage reads it there; not the route info nor the
    /// attempt number: the clusters' filter rewrites both).
    fn set_property(&mut self, name: impl Into<Name>, value: Vec<u8>, on_failure: OnFailure) {
        let name: Name = name.into();
        let shared = name == BUDGET_FALLBACK_PROPERTY;
        self.push(
            Effect::SetProperty {
                name,
                value,
                shared,
            },
            on_failure,
        );
    }
}

/// A log line of this plugin.
fn tagged(message: String) -> String {
    format!("model-router: {message}")
}

/// One request's side of a [`Core`] for the one driver of the stage protocol: the core is
/// borrowed for each poll and each failure only (a local reply re-enters the callbacks of the
/// same request while it is sent).
pub struct Stage<'a> {
    core: &'a RefCell<Core>,
    context: u32,
    replied: bool,
}

impl<'a> Stage<'a> {
    /// The effects of request `context`.
    pub fn new(core: &'a RefCell<Core>, context: u32) -> Self {
        Stage {
            core,
            context,
            replied: false,
        }
    }

    /// A local reply (a refusal or an answer) was polled: the request goes no further.
    pub fn replied(&self) -> bool {
        self.replied
    }
}

impl stage::Core for Stage<'_> {
    type Metric = Name;
    type Refusal = Reject;
    type Own = Own;

    fn poll(&mut self) -> Option<Effect> {
        let effect = self.core.try_borrow_mut().ok()?.poll()?;
        self.replied |= matches!(effect, Effect::Refuse(_) | Effect::Own(Own::Reply { .. }));
        Some(effect)
    }

    fn failed(&mut self, effect: Effect, error: String) -> Flow {
        let changed = match self.core.try_borrow_mut() {
            Ok(mut core) => core.failed(self.context, effect, &error),
            Err(_) => None,
        };
        changed.map_or(Flow::Continue, Next::flow)
    }
}
