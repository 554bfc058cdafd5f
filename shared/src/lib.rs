//! The pure core every llm-gateway plugin uses.
//!
//! What is here: the plugin configuration format of both hosts (plain Envoy JSON and Higress's
//! global config + `_rules_`) with one rule matcher ([`rules`]), validation errors that name the
//! field ([`config`]), OpenAI-shaped error responses ([`reject`]), the internal header names of
//! the filter contract ([`headers`]), prices and costs in integer units ([`price`]), reading and editing the top level of JSON bodies without a
//! full parse ([`json`]), the hand-over between the passes of a request re-entering the
//! chain after an internal redirect ([`reentry`]), server-sent events framed across chunk
//! splits ([`sse`]), the Redis connection every Redis user configures ([`redis`]), Redis
//! commands carried over HTTP to webdis ([`webdis`]), and —
//! compiled only for `wasm32` — a safe layer over the proxy-wasm host calls ([`host`]) that
//! turns every non-OK host status into an error value.
//!
//! What is not here: anything that decides for one plugin only. Modules take plain values and
//! return plain values; the clock and randomness come in as arguments, so everything but
//! [`host`] is tested natively with `cargo test` and compiled to wasm with `wasm-bindgen-test`.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod chain;
pub mod clock;
pub mod config;
pub mod fxhash;
pub mod hash;
pub mod headers;
pub mod json;
pub mod level;
pub mod pending;
pub mod price;
pub mod redis;
pub mod reentry;
pub mod reject;
pub mod request;
pub mod resp;
pub mod route_info;
pub mod rules;
pub mod sse;
pub mod stage;
pub mod tokens;
pub mod usage;
pub mod usage_record;
pub mod webdis;
pub mod wire;

// wasm32-wasip1 only (the proxy-wasm target): `host` links the SDK for its dispatcher, whose
// exports import the host's functions, which the wasm-bindgen test runner (wasm32-unknown-
// unknown, Node) cannot provide.
#[cfg(all(target_arch = "wasm32", target_os = "wasi"))]
pub mod host;
