//! The breakers in shared data: one [`State`] per deployment under
//! `llm_router:breaker:<name>`, updated with compare-and-swap so every worker of an instance
//! agrees. The decisions are [`crate::breaker`]'s; this is the accounting around them (CAS
//! rounds, fail-open, who claims the probe), over a [`Store`].
//!
//! The same value holds the deployment's provider cooldown (the Unix ms until which the
//! deployment asked to be left alone, [`crate::signals`]; see [`Entry`]): admission skips a
//! cooling deployment as it skips an open breaker. A cooldown only ever grows (the later
//! deadline of the stored one and a new one wins), capped by `max_cooldown_ms`. One value, not
//! two keys: admitting a deployment reads shared data once (every request admits each
//! deployment of its plan, and each read costs the host an allocation in the VM).

use super::protocol::Level;
use super::Core;
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

/// What a breaker key holds: the breaker's state and the provider's cooldown deadline, as
/// [`State::encode`]'s form with the deadline as one more field when there is one
/// (`c 0 0 0 0 1767225600000`). [`State::decode`] reads the state of either form.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Entry {
    /// The breaker.
    pub state: State,
    /// Unix ms until which the provider asked to be left alone; 0: never asked.
    pub cooldown_until_ms: u64,
}

impl Entry {
    /// The entry of a stored value (`None`: no value yet); junk reads as a fresh breaker, and
    /// a deadline that is no number as none.
    pub fn decode(value: Option<&[u8]>) -> Entry {
        let Some(bytes) = value else {
            return Entry::default();
        };
        let cooldown_until_ms = bytes
            .split(|&b| b == b' ')
            .nth(5)
            .and_then(|t| std::str::from_utf8(t).ok())
            .and_then(|t| t.parse().ok())
            .unwrap_or(0);
        Entry {
            state: State::decode(bytes),
            cooldown_until_ms,
        }
    }

    /// The stored form.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = self.state.encode();
        if self.cooldown_until_ms > 0 {
            bytes.extend_from_slice(format!(" {}", self.cooldown_until_ms).as_bytes());
        }
        bytes
    }

    /// The provider's cooldown: `Skip(remaining ms)` while it lasts.
    fn cooling(&self, now_ms: u64) -> Option<Admission> {
        let until = self.cooldown_until_ms;
        (until > now_ms).then(|| Admission::Skip(until - now_ms))
    }
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
                let _ = store.set(&key, &Entry::default().encode(), 0);
            }
        }
    }
}

impl Core {
    /// Skips a cooling deployment, else asks its breaker; claims the probe with CAS when it
    /// is this request's turn. No shared data: admitted (fail open). Lost every race: skipped
    /// (someone else probes).
    pub(crate) fn admit(
        &mut self,
        config: &RouterConfig,
        deployment: &Deployment,
        now_ms: u64,
        store: &dyn Store,
    ) -> Admission {
        let key = key(&deployment.name);
        for _ in 0..CAS_ROUNDS {
            let Ok((value, cas)) = store.get(&key) else {
                return Admission::Admit;
            };
            let entry = Entry::decode(value.as_deref());
            if let Some(skip) = entry.cooling(now_ms) {
                return skip;
            }
            match entry.state.admit(&config.breaker, now_ms) {
                Verdict::Admit(None) => return Admission::Admit,
                Verdict::Skip(ms) => return Admission::Skip(ms),
                Verdict::Admit(Some(probing)) => match store.set(
                    &key,
                    &Entry {
                        state: probing,
                        ..entry
                    }
                    .encode(),
                    cas,
                ) {
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
            let entry = Entry::decode(value.as_deref());
            let (next, transition) = entry.state.record(&config.breaker, failed, now_ms);
            if next == entry.state {
                return;
            }
            // the cooldown stays as it is
            let next = Entry {
                state: next,
                ..entry
            };
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
        let key = key(deployment);
        for _ in 0..CAS_ROUNDS {
            let Ok((value, cas)) = store.get(&key) else {
                return None;
            };
            let entry = Entry::decode(value.as_deref());
            if entry.cooldown_until_ms >= until {
                return None;
            }
            // the breaker stays as it is
            let next = Entry {
                cooldown_until_ms: until,
                ..entry
            };
            match store.set(&key, &next.encode(), cas) {
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
    let Ok((value, _)) = store.get(&key(&deployment.name)) else {
        return Admission::Admit; // no shared data: fail open
    };
    let entry = Entry::decode(value.as_deref());
    if let Some(skip) = entry.cooling(now_ms) {
        return skip;
    }
    match entry.state.admit(&config.breaker, now_ms) {
        Verdict::Admit(None) => Admission::Admit,
        Verdict::Admit(Some(_)) => Admission::Skip(0),
        Verdict::Skip(ms) => Admission::Skip(ms),
    }
}
