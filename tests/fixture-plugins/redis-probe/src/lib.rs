//! redis-probe: a fixture plugin for the wasmtime harness's self-tests, not a product.
//!
//! By request path:
//! - `/redis/incr/<key>`, `/redis/get/<key>`: one Redis call through Higress's
//!   `proxy_redis_call`; the request pauses and resumes with request header
//!   `x-probe-value` (the integer reply, or `null`); a failed call answers 503
//!   `redis_unavailable`, an error reply 502 `redis_error`;
//! - `/shared/incr/<key>`: increments a shared-data counter with CAS, retrying on
//!   `CasMismatch`; with `x-probe-hold: 1` it reads, then waits for an HTTP call to cluster
//!   `hold` before writing (so a test can interleave another VM); resumes with
//!   `x-probe-value` and `x-probe-cas-retries`;
//! - anything else: passes; bodies are held until the end (each body callback pauses) and
//!   then described in filter state `probe.<name>.body_size` / `.body_callbacks`, and
//!   `|<name>` is appended to the body;
//! - `/hold-headers`: pauses in the headers callback, changes a request header from the
//!   body callbacks, releases everything at the end of the body;
//! - `/trap`: panics (the harness must report the trap with this plugin's log);
//! - bodies: with request header `x-probe-replace`, the body is replaced by its value; a
//!   write in the middle of the body is tried and its verdict kept in filter state;
//! - `/hold-response`: pauses the response headers for good (only a limit ends it);
//! - `/late-reply`: tries a local reply after the response headers went downstream;
//! - with `tick_ms`, ticks count a metric and feed a shared queue;
//! - every filter appends its `name` (config) to request header `x-probe-path` and response
//!   header `x-probe-path`, showing the order filters ran in.
//!
//! Config: `{"name": "a", "redis_service": "outbound|6379||redis.static", "timeout_ms": 200}`.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

/// The configuration.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Name shown in `x-probe-path` and filter state.
    #[serde(default)]
    pub name: String,
    /// Redis service; none: Redis routes answer 503.
    #[serde(default)]
    pub redis_service: Option<String>,
    /// Redis timeout.
    #[serde(default = "default_timeout")]
    pub timeout_ms: u32,
    /// Tick period; each tick counts `redis_probe.ticks`, sets gauge
    /// `redis_probe.last_tick_secs` and enqueues an item on shared queue `probe`, whose
    /// owner counts `redis_probe.queue_items`.
    #[serde(default)]
    pub tick_ms: u32,
}

fn default_timeout() -> u32 {
    200
}

/// What a request path asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// A Redis command on a key.
    Redis {
        /// `INCR` or `GET`.
        command: &'static str,
        /// The key.
        key: String,
    },
    /// A shared-data counter.
    Shared {
        /// The key.
        key: String,
    },
    /// Pause in the headers callback and release the headers from the last body callback
    /// (works only with `allow_on_headers_stop_iteration`, else the request hangs).
    HoldHeaders,
    /// Panic (a trap), to show how the harness reports one.
    Trap,
    /// Pass through, probing bodies.
    Other,
}

/// Parses the path.
pub fn route(path: &str) -> Route {
    let path = path.split('?').next().unwrap_or_default();
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(3, '/').collect();
    match parts.as_slice() {
        ["redis", "incr", key] if !key.is_empty() => Route::Redis {
            command: "INCR",
            key: (*key).to_string(),
        },
        ["redis", "get", key] if !key.is_empty() => Route::Redis {
            command: "GET",
            key: (*key).to_string(),
        },
        ["shared", "incr", key] if !key.is_empty() => Route::Shared {
            key: (*key).to_string(),
        },
        ["hold-headers"] => Route::HoldHeaders,
        ["trap"] => Route::Trap,
        _ => Route::Other,
    }
}

#[cfg(target_arch = "wasm32")]
mod shell;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            route("/redis/incr/a:b"),
            Route::Redis {
                command: "INCR",
                key: "a:b".into()
            }
        );
        assert_eq!(
            route("/shared/incr/k?x=1"),
            Route::Shared { key: "k".into() }
        );
        assert_eq!(route("/redis/incr/"), Route::Other);
        assert_eq!(route("/v1/chat"), Route::Other);
    }
}
