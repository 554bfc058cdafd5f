//! The router's sans-I/O core: every decision of both roles, with no host call.
//!
//! Shaped like quinn-proto's `Connection`: the driver (the proxy-wasm shell, or a
//! fused filter running several plugins' cores) feeds one event at a time into
//! [`Core::handle`] (the host's data, the clock included, behind a [`View`]), then drains [`Core::poll`] and carries out
//! each [`Effect`] in order: set or remove a header, replace the body, publish filter state,
//! clear the route cache, refuse, answer locally, count a metric, log a line. An effect whose
//! failure changes the outcome names what the core does then ([`OnFailure`]); the driver hands
//! the failure back with [`Core::failed`], which may change the callback's [`Flow`].
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
//! A driver's loop for one callback (the shell's `Exchange::run` and `drain`):
//!
//! ```text
//! let mut flow = core.handle(context, input, &view, &store);
//! while let Some(Effect { command, on_failure }) = core.poll() {
//!     if let Err(err) = carry_out(command) {
//!         flow = core.failed(context, on_failure, &err).unwrap_or(flow);
//!     }
//! }
//! // Flow::ContinueSkipResponseBody: continue, and feed no more response-body events
//! ```
//!
//! The core is not borrowed while an effect runs (a local reply re-enters the response
//! callbacks of the same request).

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
use llm_gateway_shared::rules::RuleSet;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;

pub use breakers::{Store, StoreError};
pub use protocol::{Command, Effect, Flow, Input, Level, Map, Name, OnFailure, ReadError, View};

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
    queue: VecDeque<Effect>,
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
    ) -> Flow {
        match self.role {
            Role::Downstream => self.handle_downstream(context, input, view, store),
            Role::Upstream => self.handle_upstream(context, input, view, store),
        }
    }

    /// The next effect, in order.
    pub fn poll(&mut self) -> Option<Effect> {
        self.queue.pop_front()
    }

    /// The driver could not carry out `effect` (`error` says why). Returns the flow the
    /// callback must return instead, if the failure changes it.
    pub fn failed(&mut self, context: u32, on_failure: OnFailure, error: &str) -> Option<Flow> {
        match on_failure {
            OnFailure::Ignore => None,
            OnFailure::Log(level, what) => {
                self.queue.push_front(Effect {
                    command: Command::Log(level, format!("{what}: {error}")),
                    on_failure: OnFailure::Ignore,
                });
                None
            }
            OnFailure::KeepLength(size) => {
                for effect in &mut self.queue {
                    if let Command::SetRequestLength(length) = &mut effect.command {
                        *length = size;
                    }
                }
                self.queue.push_front(Effect {
                    command: Command::Log(
                        Level::Error,
                        format!("cannot rewrite the model: {error}"),
                    ),
                    on_failure: OnFailure::Ignore,
                });
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

    fn push(&mut self, command: Command, on_failure: OnFailure) {
        self.queue.push_back(Effect {
            command,
            on_failure,
        });
    }

    fn log(&mut self, level: Level, message: String) {
        self.push(Command::Log(level, message), OnFailure::Ignore);
    }

    fn count(&mut self, name: impl Into<Name>) {
        self.push(Command::Count(name.into()), OnFailure::Ignore);
    }

    fn gauge(&mut self, name: impl Into<Name>, value: u64) {
        self.push(Command::Gauge(name.into(), value), OnFailure::Ignore);
    }

    /// Refuses with `reject`: counted, sent, the callback pauses.
    fn refuse(&mut self, reject: Reject) -> Flow {
        self.count(format!("rejected.{}", reject.code));
        self.push(
            Command::Refuse(reject),
            OnFailure::Log(Level::Error, "cannot send the local reply"),
        );
        Flow::Pause
    }

    fn set_header(
        &mut self,
        map: Map,
        name: impl Into<Name>,
        value: impl Into<Vec<u8>>,
        on_failure: OnFailure,
    ) {
        self.push(
            Command::SetHeader {
                map,
                name: name.into(),
                value: value.into(),
            },
            on_failure,
        );
    }

    fn remove_header(&mut self, map: Map, name: impl Into<Name>, on_failure: OnFailure) {
        self.push(
            Command::RemoveHeader {
                map,
                name: name.into(),
            },
            on_failure,
        );
    }

    fn set_property(&mut self, name: impl Into<Name>, value: Vec<u8>, on_failure: OnFailure) {
        self.push(
            Command::SetProperty {
                name: name.into(),
                value,
            },
            on_failure,
        );
    }
}
