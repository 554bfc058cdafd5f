//! The harness suites, one module per plugin or concern: the compiled plugins (`dist/*.wasm`,
//! `dist/higress/*.wasm`) in the wasmtime proxy-wasm harness (`src/harness/`, Envoy or Higress
//! mode), with a real `redis-server` where a plugin talks to Redis; and the harness's own
//! semantics (`host_envoy`, `host_fleet`, `host_redis`). `tests/README.md` indexes the
//! modules (what each proves, its host, how long).

mod bundle;
mod chain;
mod cost;
mod fused;
mod host_envoy;
mod host_fleet;
mod host_redis;
mod key_auth;
mod key_auth_redis;
mod ratelimit;
mod ratelimit_fleet;
mod ratelimit_scripts;
mod ratelimit_tiers;
mod redis_faults;
mod reentry;
mod router_budget_fallback;
mod router_signals;
mod translation_fleet;
mod usage_genai;
mod usage_ledger;
mod usage_stream;
