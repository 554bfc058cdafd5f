//! Redis-held keys on the host: one `HGETALL` per digest missing from the cache
//! ([`super::cache`]; requests of one worker waiting for the same digest share the call), and
//! the requests that wait for a reply parked until it comes ([`crate::pending`]).
//!
//! What is decided is pure ([`crate::pending`], [`crate::cache`], [`crate::core`]); this file
//! moves bytes between them and the host, Redis's through the shared client
//! (`host::redis_client`). The waiting requests are resumed by the filter (`filter::resume`)
//! with the answer and the headers this store kept.

use super::cache::{self, bump, log, CacheLookup};
use crate::auth::Found;
use crate::cache::{Cached, Ttl};
use crate::config::KeyStoreConfig;
use crate::core::{Headers, Lookup};
use crate::pending::{Join, Pending};
use llm_gateway_shared::host::{redis_client, HostError, HostResult, LogLevel, Metric};
use llm_gateway_shared::redis::Answer;
use std::cell::RefCell;
use std::rc::Rc;

/// One worker's view of the key store.
pub(super) struct Store {
    config: Rc<KeyStoreConfig>,
    buckets: u32,
    pending: RefCell<Pending>,
    hits: Option<Metric>,
    lookups: Option<Metric>,
    errors: Option<Metric>,
}

impl Store {
    pub(super) fn new(config: Rc<KeyStoreConfig>) -> Store {
        let counter = |name: &str| Metric::counter(name).ok();
        Store {
            buckets: crate::cache::bucket_count(config.cache_entries),
            config,
            pending: RefCell::default(),
            hits: counter("llm_gateway.key_auth.cache.hit"),
            lookups: counter("llm_gateway.key_auth.redis.lookup"),
            errors: counter("llm_gateway.key_auth.redis.error"),
        }
    }

    /// Connects Redis; every answer goes to `on_reply(token, reply)`. `false` (logged) refuses
    /// the configuration.
    pub(super) fn connect(&self, on_reply: impl FnMut(u32, Answer) + 'static) -> bool {
        match redis_client::connect([&self.config.redis], on_reply) {
            Ok(()) => true,
            Err(why) => {
                log(LogLevel::Error, &why);
                false
            }
        }
    }

    fn ttl(&self) -> Ttl {
        Ttl {
            entry_ms: self.config.cache_ttl_ms,
            unknown_ms: self.config.negative_ttl_ms,
        }
    }

    /// The cache, as a [`crate::auth::KeyLookup`] for one decision.
    pub(super) fn lookup(&self) -> CacheLookup {
        CacheLookup::new(self.buckets, self.ttl(), self.hits)
    }

    /// True while request `ctx` waits for Redis.
    #[cfg_attr(not(feature = "higress"), allow(dead_code))] // no store without Redis calls
    pub(super) fn is_parked(&self, ctx: u32) -> bool {
        self.pending.borrow().is_parked(ctx)
    }

    /// Request `ctx` is gone.
    #[cfg_attr(not(feature = "higress"), allow(dead_code))]
    pub(super) fn forget(&self, ctx: u32) {
        self.pending.borrow_mut().forget(ctx);
    }

    /// The core's [`Lookup`] for request `ctx`: parks it until Redis answers, joining a lookup
    /// in flight or sending one. An error (logged here) when none could be sent.
    pub(super) fn fetch(&self, ctx: u32, lookup: &Lookup) -> HostResult<()> {
        let digest = lookup.digest;
        let mut pending = self.pending.borrow_mut();
        let headers = match pending.join(ctx, digest, lookup.headers.clone()) {
            Join::Joined => return Ok(()),
            Join::Send(headers) => headers,
            Join::Full(_) => {
                log(LogLevel::Warn, "too many Redis lookups in flight");
                return Err(HostError::Empty);
            }
        };
        let key = self.config.redis_key(&digest);
        let command = [b"HGETALL".as_slice(), key.as_bytes()];
        match redis_client::send(&self.config.redis, &command) {
            Ok(token) => {
                bump(self.lookups);
                pending.sent(token, ctx, digest, headers);
                Ok(())
            }
            Err(err) => {
                bump(self.errors);
                let id = crate::auth::digest_prefix(&digest);
                let line = format!("cannot send the Redis lookup of key_id={id}: {err}");
                log(LogLevel::Warn, &line);
                Err(err)
            }
        }
    }

    /// Redis answered call `token` (`reply`: the raw RESP, or why the call failed): caches the
    /// answer and gives it back with the requests that wait for it (their headers stay parked
    /// until [`Store::unpark`]); `None` for a call this store did not send.
    pub(super) fn answered(
        &self,
        token: u32,
        reply: Answer,
    ) -> Option<([u8; 32], Found, Vec<u32>)> {
        let (digest, contexts) = self.pending.borrow_mut().answered(token)?;
        let reply = reply.as_deref().map_err(|failure| failure.why.as_str());
        let (found, line) = crate::cache::found_from_reply(&digest, reply);
        if let Some(line) = line {
            log(LogLevel::Warn, &line);
        }
        let (buckets, ttl) = (self.buckets, self.ttl());
        match &found {
            Found::Entry(entry) => {
                cache::remember(buckets, ttl, &digest, Cached::Entry(entry.clone()))
            }
            Found::Unknown => cache::remember(buckets, ttl, &digest, Cached::Unknown),
            Found::Unavailable | Found::Fetch => bump(self.errors),
        }
        Some((digest, found, contexts))
    }

    /// The headers of request `ctx`, which waited for Redis; `None` if it went away.
    pub(super) fn unpark(&self, ctx: u32) -> Option<Headers> {
        self.pending.borrow_mut().unpark(ctx)
    }
}
