//! model-router: model groups in, provider deployments out.
//!
//! Clients put a model *group* (`fast`, `smart`) in the body's `model`. The router checks it
//! against the groups the key may use (`x-llm-groups`, 404 / 403), plans the deployments to
//! try (canary split by a stable hash of the user or consumer, circuit breakers in shared
//! data, context windows), rewrites `model` to the first deployment's real model name, injects
//! its credential, publishes the plan in filter state for the route's cluster matcher, and
//! clears the route cache. The same module, configured with `"role": "upstream"` as the
//! clusters' upstream HTTP filter, runs once per attempt: it rewrites `model` and the
//! credential for that attempt's deployment and feeds the breaker. After the first response
//! byte a failure cannot be retried: a streamed response that ends without its terminator gets
//! an in-band SSE error event instead of `[DONE]`.
//!
//! One API to every provider: a client of OpenAI Chat Completions may be served by an
//! Anthropic deployment and a client of Anthropic Messages by an OpenAI, Azure OpenAI or
//! OpenAI-compatible one; the router translates the request per attempt and the answer (JSON,
//! stream or error) back ([`translate`], pure; which deployment serves which endpoint, at which
//! path, with which credential header: [`wire`]). A group may mix providers and fall back
//! across them.
//!
//! It answers `GET /v1/models` and `GET /v1/models/{id}` itself: the groups the key may use,
//! in OpenAI's list shape ([`models`]), never sent to a provider. `POST
//! /v1/messages/count_tokens` is routed like a model call, to the group's Anthropic
//! deployments only (a group without one gets the router's own estimate).
//!
//! Decisions live in [`core`] (both roles as a sans-I/O state machine: events in, effects out,
//! clock and shared data behind traits) over [`config`], [`plan`], [`models`], [`breaker`],
//! [`budget_fallback`], [`redirect`], [`body`], [`stream`], [`wire`] and [`translate`], all
//! compiled and tested natively;
//! the proxy-wasm shell, compiled only for `wasm32`, copies host data in and carries the
//! effects out. It never logs a credential, a key or a prompt.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod body;
pub mod breaker;
pub mod budget_fallback;
pub mod config;
pub mod core;
pub mod ids;
pub mod models;
pub mod plan;
pub mod redirect;
pub mod signals;
pub mod stream;
pub mod translate;
pub mod wire;

#[cfg(target_arch = "wasm32")]
mod shell;
#[cfg(target_arch = "wasm32")]
pub use shell::{root_context, Fused, FusedStage};
