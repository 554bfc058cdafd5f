//! A circuit breaker per deployment, as a value that lives in shared data.
//!
//! A deployment that fails `consecutive_failures` times in a row, or `failure_rate_percent`
//! of the last `window` calls (with at least `min_calls`), is *open*: plans skip it for
//! `cooldown_ms`. After the cooldown one request is let through as the probe (*half-open*);
//! its success closes the breaker, its failure opens it for another cooldown. A probe that
//! never reports (its worker died) is replaced after another cooldown.
//!
//! The state is a few numbers encoded as text ([`State::encode`]); the shell keeps one per
//! deployment in shared data and updates it with compare-and-swap, so every worker of an
//! instance agrees. Time comes in as `now_ms`.

use crate::config::BreakerConfig;

/// Where a breaker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Requests flow.
    Closed,
    /// Skipped until `until_ms`.
    Open {
        /// End of the cooldown.
        until_ms: u64,
    },
    /// One probe is in flight; others skip until it reports or `deadline_ms` passes.
    HalfOpen {
        /// When a lost probe is given up.
        deadline_ms: u64,
    },
}

/// One deployment's breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// Open, closed or probing.
    pub phase: Phase,
    /// Failures in a row.
    pub consecutive: u32,
    /// Recent outcomes, newest in bit 0; 1 = failure.
    pub window_bits: u64,
    /// How many of the bits are filled.
    pub window_len: u32,
}

impl Default for State {
    fn default() -> Self {
        State {
            phase: Phase::Closed,
            consecutive: 0,
            window_bits: 0,
            window_len: 0,
        }
    }
}

/// What a change did, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Nothing visible changed.
    None,
    /// Closed (or half-open) -> open.
    Opened,
    /// Open -> half-open: this request is the probe.
    Probing,
    /// Half-open -> closed: the probe succeeded.
    Recovered,
}

/// The answer to "may a request try this deployment now?".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Yes; `Some(state)` must be stored first (the request became the probe).
    Admit(Option<State>),
    /// No, for about this many more milliseconds.
    Skip(u64),
}

impl State {
    /// May a request try the deployment at `now_ms`?
    pub fn admit(&self, config: &BreakerConfig, now_ms: u64) -> Verdict {
        match self.phase {
            Phase::Closed => Verdict::Admit(None),
            Phase::Open { until_ms }
            | Phase::HalfOpen {
                deadline_ms: until_ms,
            } => {
                if now_ms >= until_ms {
                    Verdict::Admit(Some(State {
                        phase: Phase::HalfOpen {
                            deadline_ms: now_ms.saturating_add(config.cooldown_ms),
                        },
                        ..*self
                    }))
                } else {
                    Verdict::Skip(until_ms - now_ms)
                }
            }
        }
    }

    /// The state after an attempt finished (`failed`: 429, 5xx, reset, timeout, connect
    /// failure).
    pub fn record(&self, config: &BreakerConfig, failed: bool, now_ms: u64) -> (State, Transition) {
        let mask = if config.window >= 64 {
            u64::MAX
        } else {
            (1u64 << config.window) - 1
        };
        let mut next = *self;
        next.window_bits = ((self.window_bits << 1) | u64::from(failed)) & mask;
        next.window_len = (self.window_len + 1).min(config.window);
        next.consecutive = if failed {
            self.consecutive.saturating_add(1)
        } else {
            0
        };
        let open = State {
            phase: Phase::Open {
                until_ms: now_ms.saturating_add(config.cooldown_ms),
            },
            ..next
        };
        match (self.phase, failed) {
            (Phase::HalfOpen { .. }, false) => (State::default(), Transition::Recovered),
            (Phase::HalfOpen { .. }, true) => (open, Transition::Opened),
            // stragglers admitted before the breaker opened change nothing
            (Phase::Open { .. }, _) => (*self, Transition::None),
            (Phase::Closed, false) => (next, Transition::None),
            (Phase::Closed, true) => {
                let by_count = config.consecutive_failures > 0
                    && next.consecutive >= config.consecutive_failures;
                let failures = (next.window_bits & mask).count_ones();
                let by_rate = config.failure_rate_percent > 0
                    && next.window_len >= config.min_calls.max(1)
                    && u64::from(failures) * 100
                        >= u64::from(config.failure_rate_percent) * u64::from(next.window_len);
                if by_count || by_rate {
                    (open, Transition::Opened)
                } else {
                    (next, Transition::None)
                }
            }
        }
    }

    /// Text form for shared data: `phase time consecutive bits len`.
    pub fn encode(&self) -> Vec<u8> {
        let (phase, time) = match self.phase {
            Phase::Closed => ('c', 0),
            Phase::Open { until_ms } => ('o', until_ms),
            Phase::HalfOpen { deadline_ms } => ('h', deadline_ms),
        };
        format!(
            "{phase} {time} {} {:x} {}",
            self.consecutive, self.window_bits, self.window_len
        )
        .into_bytes()
    }

    /// Reads [`State::encode`]'s form; anything else is a fresh breaker.
    pub fn decode(bytes: &[u8]) -> State {
        Self::try_decode(bytes).unwrap_or_default()
    }

    fn try_decode(bytes: &[u8]) -> Option<State> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut parts = text.split(' ');
        let phase = parts.next()?;
        let time: u64 = parts.next()?.parse().ok()?;
        let consecutive = parts.next()?.parse().ok()?;
        let window_bits = u64::from_str_radix(parts.next()?, 16).ok()?;
        let window_len = parts.next()?.parse().ok()?;
        let phase = match phase {
            "c" => Phase::Closed,
            "o" => Phase::Open { until_ms: time },
            "h" => Phase::HalfOpen { deadline_ms: time },
            _ => return None,
        };
        Some(State {
            phase,
            consecutive,
            window_bits,
            window_len,
        })
    }
}

/// Is this attempt outcome a failure for the breaker (and a reason to fall back)?
/// `None`: no response at all (reset, timeout, connect failure).
pub fn is_failure(status: Option<u16>) -> bool {
    match status {
        None => true,
        Some(status) => status == 429 || status >= 500,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BreakerConfig {
        BreakerConfig {
            consecutive_failures: 3,
            window: 10,
            failure_rate_percent: 50,
            min_calls: 6,
            cooldown_ms: 1_000,
        }
    }

    fn run(state: State, outcomes: &[bool], now: u64) -> (State, Vec<Transition>) {
        let mut s = state;
        let mut transitions = Vec::new();
        for failed in outcomes {
            let (next, t) = s.record(&config(), *failed, now);
            s = next;
            transitions.push(t);
        }
        (s, transitions)
    }

    #[test]
    fn opens_after_n_failures_in_a_row() {
        let (s, t) = run(State::default(), &[true, true], 0);
        assert_eq!(s.phase, Phase::Closed);
        assert_eq!(t, [Transition::None, Transition::None]);
        let (s, t) = s.record(&config(), true, 5);
        assert_eq!(t, Transition::Opened);
        assert_eq!(s.phase, Phase::Open { until_ms: 1_005 });
        // a success in between resets the count
        let (s, _) = run(State::default(), &[true, true, false, true, true], 0);
        assert_eq!(s.phase, Phase::Closed);
    }

    #[test]
    fn opens_on_the_failure_rate_of_the_window() {
        // alternate: never 3 in a row, but 50 % of 6 calls
        let (s, t) = run(
            State::default(),
            &[true, false, true, false, true, false],
            0,
        );
        assert_eq!(
            t.last(),
            Some(&Transition::None),
            "the last call was a success"
        );
        assert_eq!(s.phase, Phase::Closed);
        let (s, t) = s.record(&config(), true, 0);
        assert_eq!(t, Transition::Opened, "4 of 7 failed");
        assert!(matches!(s.phase, Phase::Open { .. }));
        // fewer than min_calls: no rate decision
        let (s, _) = run(State::default(), &[true, false, true], 0);
        assert_eq!(s.phase, Phase::Closed);
    }

    #[test]
    fn open_skips_then_lets_one_probe_through_after_the_cooldown() {
        let (open, _) = run(State::default(), &[true, true, true], 100);
        assert_eq!(open.admit(&config(), 600), Verdict::Skip(500));
        let Verdict::Admit(Some(probing)) = open.admit(&config(), 1_100) else {
            panic!("the probe is admitted after the cooldown");
        };
        assert_eq!(probing.phase, Phase::HalfOpen { deadline_ms: 2_100 });
        // others skip while the probe is out
        assert_eq!(probing.admit(&config(), 1_200), Verdict::Skip(900));
        // the probe succeeds: closed, counters reset
        let (closed, t) = probing.record(&config(), false, 1_300);
        assert_eq!(t, Transition::Recovered);
        assert_eq!(closed, State::default());
        assert_eq!(closed.admit(&config(), 1_300), Verdict::Admit(None));
    }

    #[test]
    fn a_failed_probe_opens_again_and_a_lost_probe_is_replaced() {
        let (open, _) = run(State::default(), &[true, true, true], 0);
        let Verdict::Admit(Some(probing)) = open.admit(&config(), 1_000) else {
            panic!()
        };
        let (reopened, t) = probing.record(&config(), true, 1_500);
        assert_eq!(t, Transition::Opened);
        assert_eq!(reopened.phase, Phase::Open { until_ms: 2_500 });
        // lost probe: after its deadline another request probes
        assert!(matches!(
            probing.admit(&config(), 2_000),
            Verdict::Admit(Some(_))
        ));
    }

    #[test]
    fn stragglers_do_not_move_an_open_breaker() {
        let (open, _) = run(State::default(), &[true, true, true], 0);
        assert_eq!(open.record(&config(), false, 10), (open, Transition::None));
        assert_eq!(open.record(&config(), true, 10), (open, Transition::None));
    }

    #[test]
    fn encodes_and_decodes() {
        let (s, _) = run(State::default(), &[true, false, true, true, true], 42);
        assert_eq!(State::decode(&s.encode()), s);
        let half = State {
            phase: Phase::HalfOpen {
                deadline_ms: u64::MAX,
            },
            ..State::default()
        };
        assert_eq!(State::decode(&half.encode()), half);
        for junk in [&b""[..], b"x 1 2 3 4", b"c 1 2", b"c a b c d", b"\xff"] {
            assert_eq!(State::decode(junk), State::default());
        }
    }

    #[test]
    fn failures_are_429_5xx_and_no_response() {
        for (status, failed) in [
            (None, true),
            (Some(429), true),
            (Some(500), true),
            (Some(503), true),
            (Some(200), false),
            (Some(400), false),
            (Some(401), false),
            (Some(404), false),
        ] {
            assert_eq!(is_failure(status), failed, "{status:?}");
        }
    }
}
