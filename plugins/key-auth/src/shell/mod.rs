//! The proxy-wasm adapter: copies host data in, calls [`crate::auth::authenticate`], applies
//! the plan (to the host, or to the fused filter's exchange). Every host call goes through `llm_gateway_shared::host`; nothing here decides.

use crate::auth::{
    authenticate_with, Answered, DenyReason, Found, KeyLookup, NoStore, Outcome, Pass, Plan,
};
use crate::config::{parse_document, KeyAuthConfig};
use crate::reentry::{self, Secret};
use llm_gateway_shared::chain::{self, Direction, Step};
use llm_gateway_shared::host::{self, HeaderMap, HostError, LogLevel, Metric, Sink};
use llm_gateway_shared::redis::Answer;
use llm_gateway_shared::reject::Reject;
use llm_gateway_shared::rules::RuleSet;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use std::rc::Rc;

const PLUGIN: &str = "key_auth";

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

/// Counters: `wasmcustom.llm_gateway.key_auth.allowed` and
/// `wasmcustom.llm_gateway.key_auth.denied.<code>`.
struct Metrics {
    allowed: Option<Metric>,
    denied: [Option<Metric>; DenyReason::ALL.len()],
}

impl Metrics {
    fn define() -> Self {
        let counter = |name: &str| Metric::counter(name).ok();
        Metrics {
            allowed: counter("llm_gateway.key_auth.allowed"),
            denied: DenyReason::ALL
                .map(|r| counter(&format!("llm_gateway.key_auth.denied.{}", r.code()))),
        }
    }

    fn count(&self, outcome: &Outcome) {
        let metric = match outcome {
            Outcome::Allow { .. } => self.allowed,
            Outcome::Deny { reason, .. } => DenyReason::ALL
                .iter()
                .position(|r| r == reason)
                .and_then(|i| self.denied.get(i).copied().flatten()),
            Outcome::Skip | Outcome::Fetch { .. } => None,
        };
        if let Some(metric) = metric {
            let _ = metric.increment(1);
        }
    }
}

#[derive(Default)]
struct Root {
    state: Option<Rc<State>>,
}

struct State {
    rules: RuleSet<KeyAuthConfig>,
    metrics: Metrics,
    /// This VM's re-entry ticket secret.
    secret: Secret,
    /// Redis-held keys (the Higress build with `redis`).
    store: Option<store::Store>,
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

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let Some(rules) = host::load_config("key-auth", parse_document) else {
            return false;
        };
        let keys = rules.global().map_or(0, |c| c.keys.len());
        host::log(
            LogLevel::Info,
            &format!("key-auth: configured with {keys} keys"),
        );
        let store = rules
            .configs()
            .find_map(|c| c.store.clone())
            .map(store::Store::new);
        let state = Rc::new(State {
            rules,
            metrics: Metrics::define(),
            secret: random_secret(),
            store,
        });
        if !connect_store(&state) {
            return false;
        }
        self.state = Some(state);
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request {
            id: _context_id,
            state: self.state.clone(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Request {
    id: u32,
    state: Option<Rc<State>>,
}

impl Context for Request {
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

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(state) = self.state.clone() else {
            return refuse(&Reject::internal("key-auth is not configured"));
        };
        let headers = match host::headers(HeaderMap::RequestHeaders) {
            Ok(headers) => headers,
            Err(err) => {
                host::log(
                    LogLevel::Error,
                    &format!("key-auth: cannot read request headers: {err}"),
                );
                return refuse(&Reject::internal("cannot read the request"));
            }
        };
        let plan = match &state.store {
            Some(store) => {
                let plan = decide_with(&state, &headers, &mut store.lookup());
                match plan.outcome {
                    Outcome::Fetch { digest } => match store.fetch(self.id, digest, headers) {
                        Ok(()) => return Action::Pause,
                        Err(headers) => {
                            let mut failed = crate::auth::Answered {
                                digest,
                                found: Found::Unavailable,
                            };
                            decide_with(&state, &headers, &mut failed)
                        }
                    },
                    _ => plan,
                }
            }
            None => decide(&state, &headers),
        };
        match apply(plan, &mut Sink::Host) {
            Ok(()) => Action::Continue,
            Err(reject) => refuse(&reject),
        }
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

/// Connects Redis when the config has a key store, its answers deciding the requests that wait
/// for them: `false` (logged) refuses the configuration.
fn connect_store(state: &Rc<State>) -> bool {
    let Some(store) = &state.store else {
        return true;
    };
    let for_replies = Rc::clone(state);
    store.connect(move |token, reply| {
        if let Some(store) = &for_replies.store {
            answered(&for_replies, store, token, reply);
        }
    })
}

/// Redis answered call `token` (`reply`: the raw RESP, or why the call failed): the store caches
/// the answer, then every request waiting for it is decided and resumed (or refused).
fn answered(state: &State, store: &store::Store, token: u32, reply: Answer) {
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
        let mut answered = Answered {
            digest,
            found: found.clone(),
        };
        let mut plan = decide_with(state, &headers, &mut answered);
        if let Outcome::Fetch { .. } = plan.outcome {
            // another digest (a re-entry ticket's): not answered here, refuse cleanly
            let mut failed = Answered {
                digest,
                found: Found::Unavailable,
            };
            plan = decide_with(state, &headers, &mut failed);
        }
        let done = match apply(plan, &mut Sink::Host) {
            Ok(()) => host::resume_request(),
            Err(reject) => {
                refuse(&reject);
                Ok(())
            }
        };
        if let Err(err) = done {
            host::log(
                LogLevel::Warn,
                &format!("key-auth: cannot resume a request: {err}"),
            );
        }
    }
}

/// Authenticates the request whose headers are `headers` with the config's keys only; counts
/// the outcome.
fn decide(state: &State, headers: &[(String, Vec<u8>)]) -> Plan {
    decide_with(state, headers, &mut NoStore)
}

/// [`decide`] with a key store for digests the config does not have.
fn decide_with(state: &State, headers: &[(String, Vec<u8>)], store: &mut dyn KeyLookup) -> Plan {
    // every header is at hand: no need for the host to fetch `:authority` again
    let text = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, value)| std::str::from_utf8(value).ok())
            .unwrap_or_default()
    };
    let config = host::select_config(&state.rules, Some(text(":authority")));
    let now = if config.is_some_and(KeyAuthConfig::needs_clock) {
        match host::now_nanos() {
            Ok(nanos) => i64::try_from(nanos / 1_000_000_000).unwrap_or(i64::MAX),
            Err(_) => i64::MAX, // no clock: every expiring key counts as expired
        }
    } else {
        0 // no key expires: the time is not looked at
    };
    let pass = Pass {
        secret: &state.secret,
        envoy_request_id: text("x-request-id"),
    };
    let plan = authenticate_with(config, headers, now, Some(pass), store);
    state.metrics.count(&plan.outcome);
    plan
}

/// Carries the plan out; the refusal to send if the request must not go on.
fn apply(plan: Plan, target: &mut Sink<'_>) -> Result<(), Reject> {
    const REQUEST: HeaderMap = HeaderMap::RequestHeaders;
    let fail = |what: &str, err: HostError, reply: &'static str| {
        host::log(LogLevel::Error, &format!("key-auth: {what}: {err}"));
        Reject::internal(reply)
    };
    for name in &plan.remove {
        // An internal header we cannot remove could carry a spoofed identity: fail closed.
        target.remove_header(REQUEST, name).map_err(|err| {
            fail(
                &format!("cannot remove header {name}"),
                err,
                "cannot sanitize the request",
            )
        })?;
    }
    if let Some(path) = &plan.path {
        target
            .set_header(REQUEST, ":path", path.as_bytes())
            .map_err(|err| {
                fail(
                    "cannot strip the key from the path",
                    err,
                    "cannot sanitize the request",
                )
            })?;
    }
    match plan.outcome {
        Outcome::Skip => Ok(()),
        Outcome::Fetch { .. } => Err(Reject::internal("the key was not looked up")),
        Outcome::Allow { identity, .. } => {
            // Every internal header was removed above, so adding cannot leave a second value.
            for (name, value) in &identity {
                target
                    .add_header(REQUEST, name, value.as_bytes())
                    .map_err(|err| {
                        fail(
                            &format!("cannot set {name}"),
                            err,
                            "cannot set the consumer identity",
                        )
                    })?;
            }
            for (name, value) in &plan.restore {
                target
                    .set_header(REQUEST, name, value.as_bytes())
                    .map_err(|err| {
                        fail(
                            &format!("cannot restore {name} of a re-entered request"),
                            err,
                            "cannot resume the request",
                        )
                    })?;
            }
            if let Some(ticket) = &plan.ticket {
                // Without it a redirected request would be refused (no key): worth a log line,
                // not worth failing this request, which may never be redirected.
                if let Err(err) = host::set_property(&[reentry::PROPERTY], ticket.as_bytes()) {
                    host::log(
                        LogLevel::Warn,
                        &format!("key-auth: cannot publish the re-entry ticket: {err}"),
                    );
                }
            }
            Ok(())
        }
        Outcome::Deny {
            reason,
            reject,
            key_id,
        } => {
            host::log(
                LogLevel::Info,
                &format!(
                    "key-auth: denied {} key_id={}",
                    reason.code(),
                    key_id.as_deref().unwrap_or("-")
                ),
            );
            Err(reject)
        }
    }
}

/// Sends the local reply and stops the filter chain.
fn refuse(reject: &Reject) -> Action {
    host::refuse(PLUGIN, reject);
    Action::Pause
}

mod fused;
mod store;
pub use fused::{Fused, FusedStage};
