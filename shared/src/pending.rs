//! Calls in flight: token -> the HTTP context that waits for the answer, and what it needs
//! to resume. Host callbacks for Redis replies (and HTTP call responses dispatched from a
//! root context) arrive with a token; the plugin looks the waiting context up here, makes it
//! effective and resumes it.
//!
//! Bounded: a table full of calls that never came back refuses new ones instead of growing,
//! and a finished context's entries can be dropped ([`Pending::forget_context`]).

use std::collections::BTreeMap;

/// What one call waits with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting<T> {
    /// The HTTP context to resume.
    pub context_id: u32,
    /// What the plugin needs to resume it.
    pub state: T,
}

/// The table is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "too many calls in flight")
    }
}

/// Token -> waiting context.
#[derive(Debug, Clone)]
pub struct Pending<T> {
    calls: BTreeMap<u32, Waiting<T>>,
    capacity: usize,
}

impl<T> Default for Pending<T> {
    /// A table for 1024 calls in flight.
    fn default() -> Self {
        Pending::new(1024)
    }
}

impl<T> Pending<T> {
    /// A table for at most `capacity` calls in flight.
    pub fn new(capacity: usize) -> Self {
        Pending {
            calls: BTreeMap::new(),
            capacity,
        }
    }

    /// Remembers a call. A token already present is replaced (the host reuses a token only
    /// after answering it).
    pub fn insert(&mut self, token: u32, context_id: u32, state: T) -> Result<(), Full> {
        if self.calls.len() >= self.capacity && !self.calls.contains_key(&token) {
            return Err(Full);
        }
        self.calls.insert(token, Waiting { context_id, state });
        Ok(())
    }

    /// Takes the call a reply answers; `None` for an unknown (or forgotten) token.
    pub fn take(&mut self, token: u32) -> Option<Waiting<T>> {
        self.calls.remove(&token)
    }

    /// Drops every call of a context that went away; returns how many.
    pub fn forget_context(&mut self, context_id: u32) -> usize {
        let before = self.calls.len();
        self.calls.retain(|_, w| w.context_id != context_id);
        before - self.calls.len()
    }

    /// Takes every call of a context that went away (their answers will not reach it), in
    /// token order, for the caller to fail them.
    pub fn take_context(&mut self, context_id: u32) -> Vec<(u32, T)> {
        let tokens: Vec<u32> = self
            .calls
            .iter()
            .filter(|(_, w)| w.context_id == context_id)
            .map(|(t, _)| *t)
            .collect();
        tokens
            .into_iter()
            .filter_map(|t| self.calls.remove(&t).map(|w| (t, w.state)))
            .collect()
    }

    /// Calls in flight.
    pub fn len(&self) -> usize {
        self.calls.len()
    }

    /// True if no call is in flight.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn takes_what_was_inserted_once() {
        let mut p = Pending::new(4);
        p.insert(7, 2, "a").unwrap();
        p.insert(8, 3, "b").unwrap();
        assert_eq!(
            p.take(7),
            Some(Waiting {
                context_id: 2,
                state: "a"
            })
        );
        assert_eq!(p.take(7), None);
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn takes_the_calls_of_one_context() {
        let mut p = Pending::new(8);
        p.insert(3, 1, "a").unwrap();
        p.insert(4, 2, "b").unwrap();
        p.insert(5, 1, "c").unwrap();
        assert_eq!(p.take_context(1), vec![(3, "a"), (5, "c")]);
        assert_eq!(p.take_context(1), Vec::new());
        assert_eq!(p.len(), 1);
        assert!(p.take(4).is_some());
    }

    #[test]
    fn is_bounded_and_forgets_contexts() {
        let mut p = Pending::new(2);
        p.insert(1, 10, ()).unwrap();
        p.insert(2, 10, ()).unwrap();
        assert_eq!(p.insert(3, 11, ()), Err(Full));
        // replacing a present token is fine when full
        p.insert(2, 12, ()).unwrap();
        assert_eq!(p.forget_context(10), 1);
        assert_eq!(p.forget_context(10), 0);
        p.insert(3, 11, ()).unwrap();
        assert_eq!(p.len(), 2);
        assert!(!p.is_empty());
    }
}
