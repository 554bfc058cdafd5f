//! Fallback through Envoy's internal redirect: one logical request, several passes through
//! the chain (`/work/research/reentry-contract.md`, issue 17).
//!
//! A provider failure makes `custom_response` recreate the stream: every filter runs again in
//! new HTTP contexts of the same VMs, on the same worker. The pass that failed is
//! *superseded*: in its `on_log` the property `response.code_details` is
//! [`SUPERSEDED_DETAILS`], and that pass finalises nothing (no record, no settlement, no
//! refund). It hands what the next pass needs to a per-VM [`Stash`] keyed by the logical
//! request id (`x-llm-request-id`); the next pass, which carries `x-llm-reentry`
//! ([`crate::headers::REENTRY`], set only by key-auth after verifying the re-entry), takes it
//! back ([`Stash::adopt`]).
//!
//! What is not here: the host. The stash is a plain value with the clock passed in; each
//! plugin keeps one per VM (wasm is single-threaded) and decides what to put in it.

use std::collections::VecDeque;

/// `response.code_details` of a pass superseded by an internal redirect.
pub const SUPERSEDED_DETAILS: &str = "internal_redirect";

/// How long a stashed entry waits for its next pass. Envoy runs the superseded pass's
/// `on_log` right before the new stream's first callback, so the wait is short; an entry
/// that outlives this was never taken (the redirect was refused, the client left).
pub const DEFAULT_TTL_MS: u64 = 120_000;

/// Entries a VM keeps at most (the oldest goes first).
pub const DEFAULT_CAPACITY: usize = 1024;

/// True if a pass with this `response.code_details` was superseded by an internal redirect.
pub fn is_superseded(code_details: Option<&str>) -> bool {
    code_details == Some(SUPERSEDED_DETAILS)
}

/// What a pass starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pass<T> {
    /// The first pass of a request (no `x-llm-reentry`).
    First,
    /// A re-entering pass and what the superseded pass left for it.
    Reentry(T),
    /// A re-entering pass that found nothing (the VM restarted, the entry expired or was
    /// evicted): it goes on as a first pass, and the plugin logs one warning.
    Lost,
}

/// Values left by superseded passes, keyed by the logical request id: bounded in count
/// (the oldest is evicted) and in age (an expired entry is never taken; it leaves at the next
/// [`put`](Stash::put) or [`expire`](Stash::expire)). Every value put leaves exactly once:
/// taken, or handed back by `put`/`expire`, so a plugin can finalise what nobody took.
/// Never panics.
#[derive(Debug, Clone)]
pub struct Stash<T> {
    /// (request id, stashed at ms, value), oldest first.
    entries: VecDeque<(String, u64, T)>,
    capacity: usize,
    ttl_ms: u64,
}

impl<T> Default for Stash<T> {
    /// [`DEFAULT_CAPACITY`] entries of at most [`DEFAULT_TTL_MS`].
    fn default() -> Self {
        Stash::new(DEFAULT_CAPACITY, DEFAULT_TTL_MS)
    }
}

impl<T> Stash<T> {
    /// A stash of at most `capacity` entries (at least 1) that live `ttl_ms`.
    pub fn new(capacity: usize, ttl_ms: u64) -> Self {
        Stash {
            entries: VecDeque::new(),
            capacity: capacity.max(1),
            ttl_ms,
        }
    }

    /// Entries held now (expired ones included until the next use).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Stashes `value` for request `id` at `now_ms`, replacing what that id had; evicts the
    /// oldest entry when full. Returns what left the stash (expired, evicted or replaced
    /// entries), for a plugin that must finalise them. An empty id is not stashed (nothing
    /// could take it): the value comes back too.
    pub fn put(&mut self, id: &str, value: T, now_ms: u64) -> Vec<T> {
        let mut dropped = self.expire(now_ms);
        if id.is_empty() {
            dropped.push(value);
            return dropped;
        }
        if let Some(at) = self.entries.iter().position(|(key, _, _)| key == id) {
            dropped.extend(self.entries.remove(at).map(|(_, _, v)| v));
        }
        while self.entries.len() >= self.capacity {
            dropped.extend(self.entries.pop_front().map(|(_, _, v)| v));
        }
        self.entries.push_back((id.to_owned(), now_ms, value));
        dropped
    }

    /// Takes the value stashed for `id`, once; `None` if there is none or it expired (an
    /// expired entry stays for [`expire`](Self::expire) to hand out).
    pub fn take(&mut self, id: &str, now_ms: u64) -> Option<T> {
        let ttl = self.ttl_ms;
        let at = self
            .entries
            .iter()
            .position(|(key, at, _)| key == id && now_ms.saturating_sub(*at) <= ttl)?;
        self.entries.remove(at).map(|(_, _, value)| value)
    }

    /// Where a pass starts: [`Pass::First`] without `x-llm-reentry`, else what the stash
    /// holds for `id` ([`Pass::Reentry`], taken) or [`Pass::Lost`].
    pub fn adopt(&mut self, reentry: bool, id: &str, now_ms: u64) -> Pass<T> {
        if !reentry {
            return Pass::First;
        }
        match self.take(id, now_ms) {
            Some(value) => Pass::Reentry(value),
            None => Pass::Lost,
        }
    }

    /// Removes and returns the entries older than the TTL (a clock that went back keeps
    /// them).
    pub fn expire(&mut self, now_ms: u64) -> Vec<T> {
        let ttl = self.ttl_ms;
        let mut expired = Vec::new();
        let mut kept = VecDeque::with_capacity(self.entries.len());
        for (key, at, value) in self.entries.drain(..) {
            if now_ms.saturating_sub(at) <= ttl {
                kept.push_back((key, at, value));
            } else {
                expired.push(value);
            }
        }
        self.entries = kept;
        expired
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn only_internal_redirect_supersedes() {
        assert!(is_superseded(Some("internal_redirect")));
        for other in [
            None,
            Some("via_upstream"),
            Some(""),
            Some("internal_redirect_failed"),
            Some("Internal_Redirect"),
        ] {
            assert!(!is_superseded(other), "{other:?}");
        }
    }

    #[test]
    fn take_after_put_returns_it_once() {
        let mut stash = Stash::new(4, 1_000);
        stash.put("r1", 7, 10);
        assert_eq!(stash.take("r2", 11), None);
        assert_eq!(stash.take("r1", 11), Some(7));
        assert_eq!(stash.take("r1", 12), None);
        assert!(stash.is_empty());
    }

    #[test]
    fn a_second_put_replaces() {
        let mut stash = Stash::new(4, 1_000);
        assert!(stash.put("r1", 1, 0).is_empty());
        assert_eq!(
            stash.put("r1", 2, 5),
            vec![1],
            "the replaced value comes back"
        );
        assert_eq!(stash.len(), 1);
        assert_eq!(stash.take("r1", 6), Some(2));
    }

    #[test]
    fn expired_entries_are_dropped() {
        let mut stash = Stash::new(4, 100);
        stash.put("old", 1, 0);
        stash.put("new", 2, 50);
        assert_eq!(stash.take("old", 101), None);
        assert_eq!(
            stash.expire(101),
            vec![1],
            "expired entries are handed out once"
        );
        assert_eq!(stash.len(), 1);
        assert_eq!(
            stash.take("new", 150),
            Some(2),
            "exactly the TTL still counts"
        );
        // a put hands out what expired meanwhile
        stash.put("a", 4, 200);
        assert_eq!(stash.put("b", 5, 301), vec![4]);
        // a clock that went back expires nothing
        assert!(stash.put("r", 3, 1_000).contains(&5));
        assert_eq!(stash.take("r", 500), Some(3));
    }

    #[test]
    fn the_oldest_is_evicted_when_full() {
        let mut stash = Stash::new(2, 1_000);
        stash.put("a", 1, 0);
        stash.put("b", 2, 1);
        assert_eq!(
            stash.put("c", 3, 2),
            vec![1],
            "the evicted value comes back"
        );
        assert_eq!(stash.len(), 2);
        assert_eq!(stash.take("a", 3), None);
        assert_eq!(stash.take("b", 3), Some(2));
        assert_eq!(stash.take("c", 3), Some(3));
    }

    #[test]
    fn empty_ids_and_zero_capacity() {
        let mut stash = Stash::new(0, 1_000);
        assert_eq!(stash.put("", 1, 0), vec![1]);
        assert!(stash.is_empty());
        stash.put("a", 1, 0);
        stash.put("b", 2, 0);
        assert_eq!(stash.len(), 1, "capacity is at least one");
        assert_eq!(stash.take("b", 0), Some(2));
    }

    #[test]
    fn adopt_says_where_a_pass_starts() {
        let mut stash = Stash::new(4, 1_000);
        stash.put("r", 9, 0);
        assert_eq!(stash.adopt(false, "r", 1), Pass::First);
        assert_eq!(stash.len(), 1, "a first pass takes nothing");
        assert_eq!(stash.adopt(true, "r", 1), Pass::Reentry(9));
        assert_eq!(stash.adopt(true, "r", 1), Pass::Lost);
        assert_eq!(stash.adopt(true, "other", 1), Pass::Lost);
    }

    #[cfg(not(target_arch = "wasm32"))]
    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Put(u8, u32),
            Take(u8),
            Wait(u16),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (0u8..12, any::<u32>()).prop_map(|(k, v)| Op::Put(k, v)),
                (0u8..12).prop_map(Op::Take),
                any::<u16>().prop_map(Op::Wait),
            ]
        }

        proptest! {
            /// Never more than `capacity` entries; a value comes back at most once, only for
            /// its own id, only if it was the last put for that id, and never after the TTL.
            #[test]
            fn bounded_and_taken_once(
                capacity in 1usize..6,
                ttl in 0u64..5_000,
                ops in proptest::collection::vec(op(), 0..200),
            ) {
                let mut stash = Stash::new(capacity, ttl);
                // model: id -> (value, stashed at, puts before it), the latest put
                let mut latest: std::collections::HashMap<String, (u32, u64, usize)> =
                    std::collections::HashMap::new();
                let mut now = 0u64;
                let mut puts = 0usize;
                // values handed back by put / take / expire: each value leaves exactly once
                let mut out = 0usize;
                for op in ops {
                    match op {
                        Op::Put(k, v) => {
                            let id = format!("r{k}");
                            let dropped = stash.put(&id, v, now);
                            out += dropped.len();
                            latest.insert(id, (v, now, puts));
                            puts += 1;
                        }
                        Op::Take(k) => {
                            let id = format!("r{k}");
                            let got = stash.take(&id, now);
                            out += usize::from(got.is_some());
                            let expected = latest.remove(&id);
                            if let Some(value) = got {
                                let (v, at, _) = expected.unwrap();
                                prop_assert_eq!(value, v);
                                prop_assert!(now - at <= ttl);
                            } else if let Some((_, at, before)) = expected {
                                // absent: expired, or evicted by at least `capacity` later puts
                                prop_assert!(now - at > ttl || puts - before > capacity);
                            }
                            prop_assert_eq!(stash.take(&id, now), None);
                        }
                        Op::Wait(ms) => now += u64::from(ms),
                    }
                    prop_assert!(stash.len() <= capacity);
                }
                out += stash.expire(u64::MAX).len();
                prop_assert!(stash.is_empty());
                prop_assert_eq!(out, puts, "every value put leaves the stash once");
            }

            /// With room for every id and no time passing, every put is taken back.
            #[test]
            fn nothing_lost_within_capacity(values in proptest::collection::vec(any::<u32>(), 0..16)) {
                let mut stash = Stash::new(16, 10);
                for (i, v) in values.iter().enumerate() {
                    stash.put(&format!("r{i}"), *v, 5);
                }
                for (i, v) in values.iter().enumerate() {
                    prop_assert_eq!(stash.take(&format!("r{i}"), 15), Some(*v));
                }
                prop_assert!(stash.is_empty());
            }
        }
    }
}
