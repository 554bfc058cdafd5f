//! The key store's lookups in flight on one worker (the Higress build with `redis`): which
//! Redis call asks for which digest, which requests wait for each digest (requests of one
//! worker waiting for the same digest share the call), and the headers each waiting request
//! is decided with when the answer comes. Host-free: the shell (`shell/store.rs`) sends the
//! calls and resumes the requests.

use crate::core::Headers;
use std::collections::HashMap;

/// Most lookups in flight on one worker; more are refused (503) rather than queued.
pub const MAX_IN_FLIGHT: usize = 1024;

/// What happens to a request that needs a digest looked up ([`Pending::join`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Join {
    /// A lookup of the digest is in flight: the request waits for it (parked).
    Joined,
    /// No lookup of it is in flight: send one, then [`Pending::sent`].
    Send(Headers),
    /// Too many lookups are in flight: none is sent.
    Full(Headers),
}

/// One worker's lookups in flight and the requests parked on them.
#[derive(Debug, Default)]
pub struct Pending {
    /// Redis call token -> the digest it asks for.
    calls: HashMap<u32, [u8; 32]>,
    /// Digest -> the requests waiting for it.
    waiting: HashMap<[u8; 32], Vec<u32>>,
    /// Request -> its headers, while it waits.
    parked: HashMap<u32, Headers>,
}

impl Pending {
    /// Request `ctx` needs `digest`: joins a lookup in flight, or gives its headers back with
    /// whether one may be sent.
    pub fn join(&mut self, ctx: u32, digest: [u8; 32], headers: Headers) -> Join {
        if let Some(contexts) = self.waiting.get_mut(&digest) {
            contexts.push(ctx);
            self.parked.insert(ctx, headers);
            return Join::Joined;
        }
        if self.calls.len() >= MAX_IN_FLIGHT {
            return Join::Full(headers);
        }
        Join::Send(headers)
    }

    /// Call `token` was sent for `digest`: request `ctx` waits for it.
    pub fn sent(&mut self, token: u32, ctx: u32, digest: [u8; 32], headers: Headers) {
        self.calls.insert(token, digest);
        self.waiting.insert(digest, vec![ctx]);
        self.parked.insert(ctx, headers);
    }

    /// Call `token` was answered: its digest and the requests that wait for it (their headers
    /// stay parked until [`Pending::unpark`]); `None` for a call not sent here.
    pub fn answered(&mut self, token: u32) -> Option<([u8; 32], Vec<u32>)> {
        let digest = self.calls.remove(&token)?;
        let contexts = self.waiting.remove(&digest).unwrap_or_default();
        Some((digest, contexts))
    }

    /// The headers of request `ctx`, which waited; `None` if it went away.
    pub fn unpark(&mut self, ctx: u32) -> Option<Headers> {
        self.parked.remove(&ctx)
    }

    /// True while request `ctx` waits.
    pub fn is_parked(&self, ctx: u32) -> bool {
        self.parked.contains_key(&ctx)
    }

    /// Request `ctx` is gone (its answer, when it comes, resumes nothing).
    pub fn forget(&mut self, ctx: u32) {
        self.parked.remove(&ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(tag: &str) -> Headers {
        vec![("x-request-id".to_string(), tag.as_bytes().to_vec())]
    }

    #[test]
    fn requests_for_one_digest_share_one_call() {
        let mut pending = Pending::default();
        let Join::Send(h1) = pending.join(1, [1; 32], headers("1")) else {
            panic!("the first request sends")
        };
        pending.sent(100, 1, [1; 32], h1);
        assert_eq!(pending.join(2, [1; 32], headers("2")), Join::Joined);
        assert!(matches!(
            pending.join(3, [2; 32], headers("3")),
            Join::Send(_)
        ));
        assert!(pending.is_parked(1) && pending.is_parked(2) && !pending.is_parked(3));
        assert_eq!(pending.answered(999), None);
        assert_eq!(pending.answered(100), Some(([1; 32], vec![1, 2])));
        assert_eq!(pending.answered(100), None, "answered once");
        // the headers stay parked until each request is resumed
        assert_eq!(pending.unpark(2), Some(headers("2")));
        assert_eq!(pending.unpark(2), None);
        assert!(pending.is_parked(1));
        // a digest answered is asked again by the next request
        assert!(matches!(
            pending.join(4, [1; 32], headers("4")),
            Join::Send(_)
        ));
    }

    #[test]
    fn a_request_gone_resumes_nothing() {
        let mut pending = Pending::default();
        pending.sent(7, 1, [1; 32], headers("1"));
        pending.forget(1);
        assert!(!pending.is_parked(1));
        assert_eq!(pending.answered(7), Some(([1; 32], vec![1])));
        assert_eq!(pending.unpark(1), None);
    }

    #[test]
    fn lookups_in_flight_are_bounded() {
        let mut pending = Pending::default();
        for token in 0..MAX_IN_FLIGHT as u32 {
            let digest = [0, 0, (token >> 8) as u8, token as u8].repeat(8);
            let digest: [u8; 32] = digest.try_into().unwrap();
            pending.sent(token, token, digest, headers("x"));
        }
        assert_eq!(
            pending.join(5000, [9; 32], headers("y")),
            Join::Full(headers("y"))
        );
        // one in flight already: joining needs no new call
        let digest: [u8; 32] = [0, 0, 0, 1].repeat(8).try_into().unwrap();
        assert_eq!(pending.join(5001, digest, headers("z")), Join::Joined);
        pending.answered(0);
        assert!(matches!(
            pending.join(5002, [9; 32], headers("y")),
            Join::Send(_)
        ));
    }
}
