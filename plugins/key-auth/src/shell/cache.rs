//! The key store's shared-data cache on the host: read at each decision ([`CacheLookup`]),
//! written when Redis answers ([`remember`]). Its buckets and entries are pure
//! ([`crate::cache`]).

use crate::auth::{Found, KeyLookup};
use crate::cache::{self, Cached, Slot, Ttl};
use llm_gateway_shared::host::{self, LogLevel, Metric};

/// The shared-data cache for one decision: a fresh slot answers, anything else is a fetch.
pub(super) struct CacheLookup {
    buckets: u32,
    ttl: Ttl,
    /// `llm_gateway.key_auth.cache.hit`.
    hits: Option<Metric>,
}

impl CacheLookup {
    /// The cache of `buckets` buckets whose slots live `ttl`.
    pub(super) fn new(buckets: u32, ttl: Ttl, hits: Option<Metric>) -> CacheLookup {
        CacheLookup { buckets, ttl, hits }
    }
}

impl KeyLookup for CacheLookup {
    fn find(&mut self, digest: &[u8; 32]) -> Found {
        let key = cache::bucket_key(digest, self.buckets);
        let bucket = match host::shared_data(&key) {
            Ok((Some(bucket), _)) => bucket,
            Ok((None, _)) => return Found::Fetch,
            Err(err) => {
                log(LogLevel::Warn, &format!("cannot read the key cache: {err}"));
                return Found::Fetch;
            }
        };
        match cache::find(&bucket, digest, now_ms(), self.ttl) {
            Some(Cached::Entry(entry)) => {
                bump(self.hits);
                Found::Entry(entry)
            }
            Some(Cached::Unknown) => {
                bump(self.hits);
                Found::Unknown
            }
            None => Found::Fetch,
        }
    }
}

/// Writes what Redis said about `digest` into its bucket (of `buckets`, slots living `ttl`).
pub(super) fn remember(buckets: u32, ttl: Ttl, digest: &[u8; 32], value: Cached) {
    let now = now_ms();
    let slot = Slot {
        digest: *digest,
        fetched_ms: now,
        value,
    };
    let key = cache::bucket_key(digest, buckets);
    let written = host::update_shared_data(&key, b"", |bucket| {
        (Some(cache::insert(bucket, slot.clone(), now, ttl)), ())
    });
    if let Err(err) = written {
        // not cached: the next request asks Redis again; nothing else goes wrong
        let line = format!("cannot write the key cache: {err}");
        log(LogLevel::Warn, &line);
    }
}

/// Adds one to `metric`, if it was defined.
pub(super) fn bump(metric: Option<Metric>) {
    if let Some(metric) = metric {
        let _ = metric.increment(1);
    }
}

/// A line of key-auth's log.
pub(super) fn log(level: LogLevel, message: &str) {
    host::log(level, &format!("key-auth: {message}"));
}

fn now_ms() -> u64 {
    host::time_nanos() / 1_000_000
}
