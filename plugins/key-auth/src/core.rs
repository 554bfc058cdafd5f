//! The stage core: what key-auth does with one request, without a host (sans-I/O, in
//! quinn-proto's shape).
//!
//! It speaks the one stage protocol ([`llm_gateway_shared::stage`]): the shell copies the
//! request headers, the selected configuration and the time into a [`Request`] and hands it to
//! [`Exchange::authenticate`], which turns [`crate::auth`]'s [`Plan`] into an ordered queue of
//! [`Command`]s — the outcome's counter, the header removals, the `:path` without the key, the
//! identity, the re-entry restores and ticket, or the refusal — that the one driver
//! (`host::stage::carry`, for key-auth's own filter and its stage of the fused filter alike)
//! carries out. A command the host refuses comes back through [`stage::Core::failed`], which
//! decides as key-auth always has: a credential or internal header that cannot be removed, a
//! path or identity that cannot be written, stop the request with a 500 (a key never reaches a
//! provider, an identity is never half set); a ticket that cannot be published is logged.
//!
//! key-auth's own effect is the key store's [`Lookup`] (the Higress build with `redis`): a
//! digest neither the config nor the cache knows pauses the request until Redis answers
//! ([`Exchange::resume`]); a lookup that cannot be sent refuses it with the store's 503,
//! decided beforehand.

use crate::auth::{authenticate_with, Answered, DenyReason, Found, KeyLookup, Outcome, Pass, Plan};
use crate::config::KeyAuthConfig;
use crate::reentry::{self, Secret};
use llm_gateway_shared::level::Level;
use llm_gateway_shared::reject::Reject;
use llm_gateway_shared::stage::{self, Effect, Map};
use std::collections::VecDeque;

pub use llm_gateway_shared::stage::Flow;

/// Request headers as the host gives them (lowercase names, byte values).
pub type Headers = Vec<(String, Vec<u8>)>;

/// A counter of key-auth's ([`counters`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// An authenticated request.
    Allowed,
    /// A refused request, by reason.
    Denied(DenyReason),
}

/// Every counter and its stat name (without Envoy's `wasmcustom.`):
/// `llm_gateway.key_auth.allowed` and `llm_gateway.key_auth.denied.<code>`.
pub fn counters() -> Vec<(Metric, String)> {
    let mut all = vec![(Metric::Allowed, "llm_gateway.key_auth.allowed".to_string())];
    for reason in DenyReason::ALL {
        let name = format!("llm_gateway.key_auth.denied.{}", reason.code());
        all.push((Metric::Denied(reason), name));
    }
    all
}

/// Why key-auth sends a local reply instead of forwarding the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The plugin has no valid configuration.
    NotConfigured,
    /// The request headers could not be read.
    CannotRead,
    /// A header could not be removed, or the key could not be taken out of the path.
    CannotSanitize,
    /// An identity header could not be set.
    CannotSetIdentity,
    /// A re-entered request's first-pass headers could not be put back.
    CannotResume,
    /// The key store was not asked about the key that decides the request.
    NotLookedUp,
    /// The key was refused ([`Outcome::Deny`]'s reply).
    Denied(Reject),
}

impl stage::Refusal for Refusal {
    fn reject(&self) -> Reject {
        match self {
            Refusal::NotConfigured => Reject::internal("key-auth is not configured"),
            Refusal::CannotRead => Reject::internal("cannot read the request"),
            Refusal::CannotSanitize => Reject::internal("cannot sanitize the request"),
            Refusal::CannotSetIdentity => Reject::internal("cannot set the consumer identity"),
            Refusal::CannotResume => Reject::internal("cannot resume the request"),
            Refusal::NotLookedUp => Reject::internal("the key was not looked up"),
            Refusal::Denied(reject) => reject.clone(),
        }
    }
}

/// key-auth's own effect: ask the key store (Redis) about `digest`, the request paused until
/// it answers (its headers kept to decide again then).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// The presented key's (or the re-entry ticket's) SHA-256.
    pub digest: [u8; 32],
    /// The request headers, to decide again with the answer.
    pub headers: Headers,
}

/// What the host is asked to do.
pub type Command = Effect<Metric, Refusal, Lookup>;

/// One request as the shell read it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The configuration the request selects (`None`: nothing applies, skip).
    pub config: Option<&'a KeyAuthConfig>,
    /// The request headers.
    pub headers: &'a [(String, Vec<u8>)],
    /// Unix seconds ([`seconds`]).
    pub now: i64,
    /// This VM's re-entry ticket secret.
    pub secret: &'a Secret,
}

impl Request<'_> {
    fn decide(&self, store: &mut dyn KeyLookup) -> Plan {
        let pass = Pass {
            secret: self.secret,
            envoy_request_id: header(self.headers, "x-request-id"),
        };
        authenticate_with(self.config, self.headers, self.now, Some(pass), store)
    }
}

/// The value of header `name` (the first, exact name) as text; empty if absent or not UTF-8.
pub fn header<'h>(headers: &'h [(String, Vec<u8>)], name: &str) -> &'h str {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, value)| std::str::from_utf8(value).ok())
        .unwrap_or_default()
}

/// The time a decision under `config` uses, in Unix seconds: the host's clock (`read`, in
/// nanoseconds; asked only when a key may expire, a ticket be checked or a cached entry age),
/// and when it cannot be read, the end of time — every expiring key counts as expired (the
/// rule fails closed). `0` when nothing looks at the time.
pub fn seconds(config: Option<&KeyAuthConfig>, read: impl FnOnce() -> Option<u64>) -> i64 {
    if !config.is_some_and(KeyAuthConfig::needs_clock) {
        return 0;
    }
    match read() {
        Some(nanos) => i64::try_from(nanos / 1_000_000_000).unwrap_or(i64::MAX),
        None => i64::MAX,
    }
}

/// One request's key-auth state: the commands waiting for the driver.
#[derive(Debug, Default)]
pub struct Exchange {
    commands: VecDeque<Command>,
    /// The decision if the pending [`Lookup`] cannot be sent (the store unavailable).
    fallback: Option<Plan>,
    /// Headers a verified re-entry puts back (their failure is [`Refusal::CannotResume`]).
    restore: Vec<&'static str>,
}

impl stage::Core for Exchange {
    type Metric = Metric;
    type Refusal = Refusal;
    type Own = Lookup;

    fn poll(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    fn failed(&mut self, command: Command, error: String) -> Flow {
        Exchange::failed(self, command, error)
    }
}

impl Exchange {
    /// Decides on `request` with the config's keys and `store` (the cache; [`crate::auth::NoStore`]
    /// without Redis). A key only Redis may know pauses the request on a [`Lookup`].
    pub fn authenticate(&mut self, request: &Request<'_>, store: &mut dyn KeyLookup) -> Flow {
        let plan = request.decide(store);
        if let Outcome::Fetch { digest } = plan.outcome {
            // decided now, carried out if the lookup cannot be sent
            let mut unavailable = Answered {
                digest,
                found: Found::Unavailable,
            };
            self.fallback = Some(request.decide(&mut unavailable));
            self.push(Effect::Own(Lookup {
                digest,
                headers: request.headers.to_vec(),
            }));
            return Flow::Pause;
        }
        self.plan(plan)
    }

    /// Decides again on a request that waited for the store, which said `found` about
    /// `digest`. A decision that needs yet another digest (a ticket that expired meanwhile,
    /// say) is not looked up again: refused.
    pub fn resume(&mut self, request: &Request<'_>, digest: [u8; 32], found: Found) -> Flow {
        let mut answered = Answered { digest, found };
        let mut plan = request.decide(&mut answered);
        if let Outcome::Fetch { .. } = plan.outcome {
            let mut failed = Answered {
                digest,
                found: Found::Unavailable,
            };
            plan = request.decide(&mut failed);
        }
        self.plan(plan)
    }

    /// Refuses the request without deciding (no configuration).
    pub fn refuse(&mut self, refusal: Refusal) -> Flow {
        self.push(Effect::Refuse(refusal));
        Flow::Refused
    }

    /// The request headers could not be read (`error` says why): refused.
    pub fn unreadable(&mut self, error: &str) -> Flow {
        self.log(
            Level::Error,
            format!("key-auth: cannot read request headers: {error}"),
        );
        self.refuse(Refusal::CannotRead)
    }

    fn push(&mut self, command: Command) {
        self.commands.push_back(command);
    }

    fn log(&mut self, level: Level, line: String) {
        self.push(Effect::Log(level, line));
    }

    /// Queues the plan's edits in order: the outcome's counter, the removals, the path, then
    /// the identity, the restores and the ticket — or the refusal.
    fn plan(&mut self, plan: Plan) -> Flow {
        // one allocation for the queue: the counter, the edits, a log line and the refusal
        let identity = match &plan.outcome {
            Outcome::Allow { identity, .. } => identity.len(),
            _ => 0,
        };
        let edits = plan.remove.len() + identity + plan.restore.len();
        self.commands.reserve(edits + 4);
        match &plan.outcome {
            Outcome::Allow { .. } => self.push(Effect::Count(Metric::Allowed, 1)),
            Outcome::Deny { reason, .. } => self.push(Effect::Count(Metric::Denied(*reason), 1)),
            Outcome::Skip | Outcome::Fetch { .. } => {}
        }
        for name in plan.remove {
            self.push(Effect::RemoveHeader(Map::Request, name.into()));
        }
        if let Some(path) = plan.path {
            self.push(Effect::SetHeader(Map::Request, ":path".into(), path));
        }
        match plan.outcome {
            Outcome::Skip => Flow::Continue,
            Outcome::Fetch { .. } => self.refuse(Refusal::NotLookedUp),
            Outcome::Allow { identity, .. } => {
                // every internal header was removed above: setting leaves one value each
                for (name, value) in identity {
                    self.push(Effect::SetHeader(Map::Request, name.into(), value));
                }
                for (name, value) in plan.restore {
                    self.restore.push(name);
                    self.push(Effect::SetHeader(Map::Request, name.into(), value));
                }
                if let Some(ticket) = plan.ticket {
                    self.push(Effect::SetProperty {
                        name: reentry::PROPERTY.into(),
                        value: ticket.into_bytes(),
                        shared: false,
                    });
                }
                Flow::Continue
            }
            Outcome::Deny {
                reason,
                reject,
                key_id,
            } => {
                let key_id = key_id.as_deref().unwrap_or("-");
                let line = format!("key-auth: denied {} key_id={key_id}", reason.code());
                self.log(Level::Info, line);
                self.refuse(Refusal::Denied(reject))
            }
        }
    }

    /// Stops the request: what was still to do is dropped, `line` logged, `refusal` sent.
    fn stop(&mut self, line: String, refusal: Refusal) -> Flow {
        self.commands.clear();
        self.log(Level::Error, line);
        self.refuse(refusal)
    }

    fn failed(&mut self, command: Command, error: String) -> Flow {
        match command {
            // an internal header left could carry a spoofed identity, a credential the key
            Effect::RemoveHeader(_, name) => self.stop(
                format!("key-auth: cannot remove header {name}: {error}"),
                Refusal::CannotSanitize,
            ),
            Effect::SetHeader(_, name, _) if name == ":path" => self.stop(
                format!("key-auth: cannot strip the key from the path: {error}"),
                Refusal::CannotSanitize,
            ),
            Effect::SetHeader(_, name, _) if self.restore.iter().any(|r| *r == name) => self.stop(
                format!("key-auth: cannot restore {name} of a re-entered request: {error}"),
                Refusal::CannotResume,
            ),
            Effect::SetHeader(_, name, _) => self.stop(
                format!("key-auth: cannot set {name}: {error}"),
                Refusal::CannotSetIdentity,
            ),
            Effect::SetProperty { .. } => {
                // Without it a redirected request would be refused (no key): worth a log
                // line, not worth failing this request, which may never be redirected.
                self.log(
                    Level::Warn,
                    format!("key-auth: cannot publish the re-entry ticket: {error}"),
                );
                Flow::Continue
            }
            Effect::Refuse(_) => {
                self.log(
                    Level::Error,
                    format!("key_auth: cannot send the local reply: {error}"),
                );
                Flow::Refused
            }
            // the store said why (logged); the request is decided as if it were down
            Effect::Own(Lookup { .. }) => match self.fallback.take() {
                Some(plan) => self.plan(plan),
                None => self.refuse(Refusal::NotLookedUp),
            },
            // key-auth replaces no body, keeps the route, and its counters and log lines
            // cannot fail
            Effect::ReplaceRequestBody { .. }
            | Effect::ReplaceResponseBody { .. }
            | Effect::ClearRouteCache
            | Effect::Count(..)
            | Effect::Gauge(..)
            | Effect::Log(..) => Flow::Continue,
        }
    }
}

#[cfg(test)]
mod tests;
