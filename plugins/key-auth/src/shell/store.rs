//! Redis-held keys on the host: the shared-data cache read at each request, one `HGETALL`
//! per digest missing from it (requests of one worker waiting for the same digest share the
//! call), and the requests that wait for a reply parked until it comes.
//!
//! What is decided is pure ([`crate::cache`], [`crate::auth`]); this file moves bytes between
//! them and the host, Redis's through the shared client (`host::redis_client`). The shell decides and resumes the waiting requests when their answer
//! comes: this file hands it the answer and their parked headers, and needs nothing of it.

use crate::auth::{Found, KeyLookup};
use crate::cache::{self, Cached, Slot, Ttl};
use crate::config::KeyStoreConfig;
use llm_gateway_shared::host::{self, redis_client, LogLevel, Metric};
use llm_gateway_shared::redis::Answer;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Most lookups in flight on one worker; more are refused (503) rather than queued.
const MAX_IN_FLIGHT: usize = 1024;

type Headers = Vec<(String, Vec<u8>)>;

/// One worker's view of the key store.
pub(super) struct Store {
    config: Rc<KeyStoreConfig>,
    buckets: u32,
    /// Redis call token -> the digest it asks for.
    calls: RefCell<HashMap<u32, [u8; 32]>>,
    /// Digest -> the requests waiting for it.
    waiting: RefCell<HashMap<[u8; 32], Vec<u32>>>,
    /// Request -> its headers, while it waits.
    parked: RefCell<HashMap<u32, Headers>>,
    hits: Option<Metric>,
    lookups: Option<Metric>,
    errors: Option<Metric>,
}

impl Store {
    pub(super) fn new(config: Rc<KeyStoreConfig>) -> Store {
        let counter = |name: &str| Metric::counter(name).ok();
        Store {
            buckets: cache::bucket_count(config.cache_entries),
            config,
            calls: RefCell::default(),
            waiting: RefCell::default(),
            parked: RefCell::default(),
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

    /// The cache, as a [`KeyLookup`] for one decision.
    pub(super) fn lookup(&self) -> CacheLookup<'_> {
        CacheLookup { store: self }
    }

    /// True while request `ctx` waits for Redis.
    #[cfg_attr(not(feature = "higress"), allow(dead_code))] // no store without Redis calls
    pub(super) fn is_parked(&self, ctx: u32) -> bool {
        self.parked.borrow().contains_key(&ctx)
    }

    /// Request `ctx` is gone.
    #[cfg_attr(not(feature = "higress"), allow(dead_code))]
    pub(super) fn forget(&self, ctx: u32) {
        self.parked.borrow_mut().remove(&ctx);
    }

    /// Parks request `ctx` until Redis answers for `digest`: joins a lookup in flight or
    /// sends one. `Err` gives the headers back when no lookup could be sent.
    pub(super) fn fetch(
        &self,
        ctx: u32,
        digest: [u8; 32],
        headers: Headers,
    ) -> Result<(), Headers> {
        let mut waiting = self.waiting.borrow_mut();
        if let Some(contexts) = waiting.get_mut(&digest) {
            contexts.push(ctx);
            self.parked.borrow_mut().insert(ctx, headers);
            return Ok(());
        }
        if self.calls.borrow().len() >= MAX_IN_FLIGHT {
            log(LogLevel::Warn, "too many Redis lookups in flight");
            return Err(headers);
        }
        let key = self.config.redis_key(&digest);
        let command = [b"HGETALL".as_slice(), key.as_bytes()];
        match redis_client::send(&self.config.redis, &command) {
            Ok(token) => {
                bump(self.lookups);
                self.calls.borrow_mut().insert(token, digest);
                waiting.insert(digest, vec![ctx]);
                self.parked.borrow_mut().insert(ctx, headers);
                Ok(())
            }
            Err(err) => {
                bump(self.errors);
                let id = crate::auth::digest_prefix(&digest);
                log(
                    LogLevel::Warn,
                    &format!("cannot send the Redis lookup of key_id={id}: {err}"),
                );
                Err(headers)
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
        let digest = self.calls.borrow_mut().remove(&token)?;
        let contexts = self
            .waiting
            .borrow_mut()
            .remove(&digest)
            .unwrap_or_default();
        let reply = reply.as_deref().map_err(|failure| failure.why.as_str());
        let (found, line) = cache::found_from_reply(&digest, reply);
        if let Some(line) = line {
            log(LogLevel::Warn, &line);
        }
        match &found {
            Found::Entry(entry) => self.remember(&digest, Cached::Entry(entry.clone())),
            Found::Unknown => self.remember(&digest, Cached::Unknown),
            Found::Unavailable | Found::Fetch => bump(self.errors),
        }
        Some((digest, found, contexts))
    }

    /// The headers of request `ctx`, which waited for Redis; `None` if it went away.
    pub(super) fn unpark(&self, ctx: u32) -> Option<Headers> {
        self.parked.borrow_mut().remove(&ctx)
    }

    /// Writes what Redis said about `digest` into its bucket.
    fn remember(&self, digest: &[u8; 32], value: Cached) {
        let now = now_ms();
        let slot = Slot {
            digest: *digest,
            fetched_ms: now,
            value,
        };
        let key = cache::bucket_key(digest, self.buckets);
        let ttl = self.ttl();
        let written = host::update_shared_data(&key, b"", |bucket| {
            (Some(cache::insert(bucket, slot.clone(), now, ttl)), ())
        });
        if let Err(err) = written {
            // not cached: the next request asks Redis again; nothing else goes wrong
            log(
                LogLevel::Warn,
                &format!("cannot write the key cache: {err}"),
            );
        }
    }
}

/// The shared-data cache for one decision: a fresh slot answers, anything else is a fetch.
pub(super) struct CacheLookup<'a> {
    store: &'a Store,
}

impl KeyLookup for CacheLookup<'_> {
    fn find(&mut self, digest: &[u8; 32]) -> Found {
        let key = cache::bucket_key(digest, self.store.buckets);
        let bucket = match host::shared_data(&key) {
            Ok((Some(bucket), _)) => bucket,
            Ok((None, _)) => return Found::Fetch,
            Err(err) => {
                log(LogLevel::Warn, &format!("cannot read the key cache: {err}"));
                return Found::Fetch;
            }
        };
        match cache::find(&bucket, digest, now_ms(), self.store.ttl()) {
            Some(Cached::Entry(entry)) => {
                bump(self.store.hits);
                Found::Entry(entry)
            }
            Some(Cached::Unknown) => {
                bump(self.store.hits);
                Found::Unknown
            }
            None => Found::Fetch,
        }
    }
}

fn bump(metric: Option<Metric>) {
    if let Some(metric) = metric {
        let _ = metric.increment(1);
    }
}

fn log(level: LogLevel, message: &str) {
    host::log(level, &format!("key-auth: {message}"));
}

fn now_ms() -> u64 {
    host::time_nanos() / 1_000_000
}
