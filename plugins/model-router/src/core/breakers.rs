//! The breakers in shared data: one [`State`] per deployment under
//! `llm_router:breaker:<name>`, updated with compare-and-swap so every worker of an instance
//! agrees. The decisions are [`crate::breaker`]'s; this is the accounting around them (CAS
//! rounds, fail-open, who claims the probe), over a [`Store`].
//!
//! Next to each breaker, a provider's cooldown (`llm_router:cooldown:<name>`: the Unix ms until
//! which the deployment asked to be left alone, [`crate::signals`]): admission skips a cooling
//! deployment as it skips an open breaker. A cooldown only ever grows (the later deadline of
//! the stored one and a new one wins), capped by `max_cooldown_ms`.

use super::{Core, Level};
use crate::breaker::{State, Transition, Verdict};
use crate::config::{Deployment, RouterConfig};
use crate::plan::Admission;
use llm_gateway_shared::rules::RuleSet;

/// A deployment name as the last segment of a breaker metric (`breaker.open.<d>`): characters
/// other than `[A-Za-z0-9_-]` (a name may hold `.:@/`) become `_`, so the `stats_tags` regex
/// that labels it `deployment` (`[^.]+` up to the end) takes the whole name.
pub fn metric_segment(deployment: &str) -> String {
    deployment
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Compare-and-swap rounds before giving up.
pub const CAS_ROUNDS: usize = 8;

/// Why a shared-data call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    /// The value changed since it was read: read again.
    CasMismatch,
    /// Anything else (no shared data on this host).
    Unavailable,
}

/// Cross-worker shared data with compare-and-swap (Envoy's shared data).
pub trait Store {
    /// The value and its CAS token; `(None, 0)` if the key does not exist.
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), StoreError>;
    /// Writes if the CAS token still matches (0: unconditionally).
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError>;
}

/// The shared-data key of a deployment's breaker.
pub fn key(deployment: &str) -> String {
    ["llm_router:breaker:", deployment].concat()
}

/// The shared-data key of a deployment's provider cooldown.
pub fn cooldown_key(deployment: &str) -> String {
    ["llm_router:cooldown:", deployment].concat()
}

/// A stored cooldown deadline (Unix ms); junk reads as none.
fn decode_cooldown(bytes: &[u8]) -> u64 {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

/// The deployment's provider cooldown: `Skip(remaining ms)` while it lasts. No shared data:
/// none (fail open).
fn cooling(deployment: &str, now_ms: u64, store: &dyn Store) -> Option<Admission> {
    let Ok((Some(value), _)) = store.get(&cooldown_key(deployment)) else {
        return None;
    };
    let until = decode_cooldown(&value);
    (until > now_ms).then(|| Admission::Skip(until - now_ms))
}

/// Creates every deployment's breaker entry that does not exist yet. proxy-wasm has no
/// create-if-absent: a first write is unconditional (CAS 0), so doing it at configuration,
/// before traffic, leaves every later update a real compare-and-swap.
pub fn seed(rules: &RuleSet<RouterConfig>, store: &dyn Store) {
    for config in rules.configs() {
        for deployment in &config.deployments {
            let key = key(&deployment.name);
            if let Ok((None, _)) = store.get(&key) {
                // a failed seed leaves the first update unconditional: still correct
                let _ = store.set(&key, &State::default().encode(), 0);
            }
            let key = cooldown_key(&deployment.name);
            if let Ok((None, _)) = store.get(&key) {
                let _ = store.set(&key, b"0", 0);
            }
        }
    }
}

impl Core {
    /// Asks the deployment's breaker; claims the probe with CAS when it is this request's
    /// turn. No shared data: admitted (fail open). Lost every race: skipped (someone else
    /// probes).
    pub(crate) fn admit(
        &mut self,
        config: &RouterConfig,
        deployment: &Deployment,
        now_ms: u64,
        store: &dyn Store,
    ) -> Admission {
        if let Some(skip) = cooling(&deployment.name, now_ms, store) {
            return skip;
        }
        let key = key(&deployment.name);
        for _ in 0..CAS_ROUNDS {
            let Ok((value, cas)) = store.get(&key) else {
                return Admission::Admit;
            };
            let state = value.as_deref().map(State::decode).unwrap_or_default();
            match state.admit(&config.breaker, now_ms) {
                Verdict::Admit(None) => return Admission::Admit,
                Verdict::Skip(ms) => return Admission::Skip(ms),
                Verdict::Admit(Some(probing)) => match store.set(&key, &probing.encode(), cas) {
                    Ok(()) => {
                        self.log(
                            Level::Info,
                            format!("breaker half-open: probing deployment {}", deployment.name),
                        );
                        self.count(format!(
                            "breaker.probe.{}",
                            metric_segment(&deployment.name)
                        ));
                        return Admission::Admit;
                    }
                    Err(StoreError::CasMismatch) => continue,
                    Err(StoreError::Unavailable) => return Admission::Admit,
                },
            }
        }
        Admission::Skip(config.breaker.cooldown_ms)
    }

    /// Records an attempt's outcome in the deployment's breaker; an unchanged state is not
    /// written.
    pub(crate) fn record(
        &mut self,
        config: &RouterConfig,
        deployment: &str,
        failed: bool,
        now_ms: u64,
        store: &dyn Store,
    ) {
        let key = key(deployment);
        for _ in 0..CAS_ROUNDS {
            let Ok((value, cas)) = store.get(&key) else {
                return;
            };
            let state = value.as_deref().map(State::decode).unwrap_or_default();
            let (next, transition) = state.record(&config.breaker, failed, now_ms);
            if next == state {
                return;
            }
            match store.set(&key, &next.encode(), cas) {
                Ok(()) => {
                    match transition {
                        Transition::Opened => {
                            self.log(
                                Level::Warn,
                                format!(
                                    "breaker opened: deployment {deployment} skipped for {} ms",
                                    config.breaker.cooldown_ms
                                ),
                            );
                            let segment = metric_segment(deployment);
                            self.count(format!("breaker.opened.{segment}"));
                            self.gauge(format!("breaker.open.{segment}"), 1);
                        }
                        Transition::Recovered => {
                            self.log(
                                Level::Info,
                                format!("breaker closed: deployment {deployment} recovered"),
                            );
                            let segment = metric_segment(deployment);
                            self.count(format!("breaker.recovered.{segment}"));
                            self.gauge(format!("breaker.open.{segment}"), 0);
                        }
                        Transition::Probing | Transition::None => {}
                    }
                    return;
                }
                Err(StoreError::CasMismatch) => continue,
                Err(StoreError::Unavailable) => return,
            }
        }
    }
}

impl Core {
    /// Cools `deployment` down for `ms` from `now_ms` (capped at `max_cooldown_ms`):
    /// stores the later of its current deadline and the new one. Returns the deadline stored
    /// (`None`: nothing changed, or no shared data).
    pub(crate) fn cool_down(
        &mut self,
        max_cooldown_ms: u64,
        deployment: &str,
        ms: u64,
        now_ms: u64,
        store: &dyn Store,
    ) -> Option<u64> {
        let ms = ms.min(max_cooldown_ms);
        if ms == 0 {
            return None;
        }
        let until = now_ms.saturating_add(ms);
        let key = cooldown_key(deployment);
        for _ in 0..CAS_ROUNDS {
            let Ok((value, cas)) = store.get(&key) else {
                return None;
            };
            if value.as_deref().map(decode_cooldown).unwrap_or(0) >= until {
                return None;
            }
            match store.set(&key, until.to_string().as_bytes(), cas) {
                Ok(()) => {
                    self.log(
                        Level::Info,
                        format!("deployment {deployment} cooling down for {ms} ms as its provider asked"),
                    );
                    self.count(format!("cooldown.{}", metric_segment(deployment)));
                    return Some(until);
                }
                Err(StoreError::CasMismatch) => continue,
                Err(StoreError::Unavailable) => return None,
            }
        }
        None
    }
}

/// Asks the deployment's breaker without claiming a probe (for a budget fallback's plan,
/// which the request will most likely not take): a breaker due for a probe skips it.
pub fn admit_without_probe(
    config: &RouterConfig,
    deployment: &Deployment,
    now_ms: u64,
    store: &dyn Store,
) -> Admission {
    if let Some(skip) = cooling(&deployment.name, now_ms, store) {
        return skip;
    }
    let Ok((value, _)) = store.get(&key(&deployment.name)) else {
        return Admission::Admit; // no shared data: fail open
    };
    let state = value.as_deref().map(State::decode).unwrap_or_default();
    match state.admit(&config.breaker, now_ms) {
        Verdict::Admit(None) => Admission::Admit,
        Verdict::Admit(Some(_)) => Admission::Skip(0),
        Verdict::Skip(ms) => Admission::Skip(ms),
    }
}
