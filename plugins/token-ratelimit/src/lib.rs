//! token-ratelimit: soft rate limits and hard budgets for LLM traffic, reserved on the way in
//! and reconciled exactly once on the way out.
//!
//! * **Soft limits** (requests or tokens per second / minute / hour / day, per key,
//!   consumer, tenant, model group, client address, user): each gateway instance keeps its
//!   buckets in Envoy shared data ([`bucket`]); in the Higress build it leases capacity from
//!   central buckets in Redis in batches, so the hot path makes no Redis call while the local
//!   bucket has capacity.
//! * **Hard budgets** (tokens or money per hour / day / month, per tenant, consumer, key,
//!   user): reserved with one atomic Redis call over every level, reconciled once from the
//!   usage record that usage-accounting publishes ([`budget`]).
//!
//! The cost of a request ([`cost`]) is its estimated prompt tokens plus its output cap; the
//! plugin injects the configured `max_tokens` when the client sent none, so the provider
//! enforces the cap the reservation assumed. Decisions live in the pure modules and the
//! state machine in the sans-I/O [`core`] (natively tested with a fake clock and a fake
//! shared-data store); the proxy-wasm shell, compiled only for `wasm32`, copies host data in
//! and carries the core's effects out with the shared driver.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod bucket;
pub mod budget;
pub mod config;
pub mod core;
pub mod cost;
pub mod counts;
pub mod decide;
pub mod fxhash;
pub mod reentry;
pub mod scripts;
pub mod settle;

#[cfg(target_arch = "wasm32")]
mod shell;
#[cfg(target_arch = "wasm32")]
pub use shell::{root_context, Fused, FusedStage};
