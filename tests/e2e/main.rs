//! The end-to-end suites, one module per plugin or concern: the compiled plugins in a real
//! Envoy (1.40; `envoy_136` on 1.36.4) with real processes around them — the mock providers,
//! `redis-server`, webdis, Prometheus, the official `openai` and `anthropic` SDKs, the repo's
//! scripts. `tests/README.md` indexes the modules (what each proves, its host, how long).
//!
//! One process runs them all, two tests at a time: a test names the Envoy it needs
//! (`envoy::Options::version`, `Demo::start_on`), and `LLM_GATEWAY_ENVOY=1.36` /
//! `LLM_GATEWAY_FORM=fused`, set from outside, rerun the suites that follow the default on
//! another Envoy or build (`scripts/test`: `-- chain:: demo:: …`).

mod bundle;
mod chain;
mod demo;
mod envoy_136;
mod fleet;
mod fused;
mod harness_local_reply;
mod hash_key;
mod hostile;
mod key_auth;
mod observability;
mod openai_client;
mod pii;
mod ratelimit;
mod ratelimit_tiers;
mod router;
mod translation;
mod upstream_faults;
mod usage;
mod usage_routed;
