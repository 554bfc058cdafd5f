//! The proxy-wasm adapter: copies host data in, calls [`crate::auth::authenticate`], applies
//! the plan. Every host call goes through `llm_gateway_shared::host`; nothing here decides.

use crate::auth::{authenticate_pass, DenyReason, Outcome, Pass, Plan};
use crate::config::{parse_document, KeyAuthConfig};
use crate::reentry::{self, Secret};
use llm_gateway_shared::host::{self, HeaderMap, LogLevel, Metric};
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
            Outcome::Skip => None,
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
        self.state = Some(Rc::new(State {
            rules,
            metrics: Metrics::define(),
            secret: random_secret(),
        }));
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Request {
            state: self.state.clone(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Request {
    state: Option<Rc<State>>,
}

impl Context for Request {}

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
        // every header is at hand: no need for the host to fetch `:authority` again
        let authority = headers
            .iter()
            .find(|(name, _)| name == ":authority")
            .and_then(|(_, value)| std::str::from_utf8(value).ok())
            .unwrap_or_default();
        let config = host::select_config(&state.rules, Some(authority));
        let now = if config.is_some_and(KeyAuthConfig::needs_clock) {
            match host::now_nanos() {
                Ok(nanos) => i64::try_from(nanos / 1_000_000_000).unwrap_or(i64::MAX),
                Err(_) => i64::MAX, // no clock: every expiring key counts as expired
            }
        } else {
            0 // no key expires: the time is not looked at
        };
        let envoy_request_id = headers
            .iter()
            .find(|(name, _)| name == "x-request-id")
            .and_then(|(_, value)| std::str::from_utf8(value).ok())
            .unwrap_or_default();
        let pass = Pass {
            secret: &state.secret,
            envoy_request_id,
        };
        let plan = authenticate_pass(config, &headers, now, Some(pass));
        state.metrics.count(&plan.outcome);
        apply(plan)
    }
}

fn apply(plan: Plan) -> Action {
    for name in &plan.remove {
        if let Err(err) = host::remove_header(HeaderMap::RequestHeaders, name) {
            // An internal header we cannot remove could carry a spoofed identity: fail closed.
            host::log(
                LogLevel::Error,
                &format!("key-auth: cannot remove header {name}: {err}"),
            );
            return refuse(&Reject::internal("cannot sanitize the request"));
        }
    }
    if let Some(path) = &plan.path {
        if let Err(err) = host::set_header(HeaderMap::RequestHeaders, ":path", path.as_bytes()) {
            host::log(
                LogLevel::Error,
                &format!("key-auth: cannot strip the key from the path: {err}"),
            );
            return refuse(&Reject::internal("cannot sanitize the request"));
        }
    }
    match plan.outcome {
        Outcome::Skip => Action::Continue,
        Outcome::Allow { identity, .. } => {
            // Every internal header was removed above, so adding cannot leave a second value.
            for (name, value) in &identity {
                if let Err(err) =
                    host::add_header(HeaderMap::RequestHeaders, name, value.as_bytes())
                {
                    host::log(
                        LogLevel::Error,
                        &format!("key-auth: cannot set {name}: {err}"),
                    );
                    return refuse(&Reject::internal("cannot set the consumer identity"));
                }
            }
            for (name, value) in &plan.restore {
                if let Err(err) =
                    host::set_header(HeaderMap::RequestHeaders, name, value.as_bytes())
                {
                    host::log(
                        LogLevel::Error,
                        &format!("key-auth: cannot restore {name} of a re-entered request: {err}"),
                    );
                    return refuse(&Reject::internal("cannot resume the request"));
                }
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
            Action::Continue
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
            refuse(&reject)
        }
    }
}

/// Sends the local reply and stops the filter chain.
fn refuse(reject: &Reject) -> Action {
    if let Err(err) = host::send_reject(PLUGIN, reject) {
        host::log(
            LogLevel::Error,
            &format!("key-auth: cannot send the local reply: {err}"),
        );
    }
    Action::Pause
}
