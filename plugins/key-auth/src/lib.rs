//! key-auth: virtual keys in, consumer identity out.
//!
//! The first filter of the chain. It reads the client's virtual key (`Authorization: Bearer`,
//! `x-api-key`, `api-key`, or a query parameter when enabled), looks up its SHA-256 in the
//! config, and refuses missing, unknown, expired and disabled keys with 401 (403 for a
//! consumer not on the route's allow list). Before anything else it removes every
//! client-supplied `x-llm-*` and `x-mse-consumer` header, so identity cannot be spoofed; on
//! success it sets `x-llm-consumer`, `x-mse-consumer`, `x-llm-tenant`, `x-llm-groups` and
//! `x-llm-key-id`, and removes the client's credential so it never reaches a provider.
//!
//! The Higress build (cargo feature `higress`) can also take keys from Redis (`redis`): a
//! digest the config does not have is read from its Redis hash once, kept in a bounded
//! shared-data cache ([`cache`]) for a TTL, and decided like a config key.
//!
//! It does not know about models, budgets or bodies, and never logs a key or a full digest.
//! Decisions live in [`auth`] and [`config`] (pure, tested natively), and [`core`] speaks the
//! one stage protocol (`llm_gateway_shared::stage`): the plan becomes the ordered effects the
//! shared driver carries out, and a refused effect's meaning is decided there too. The
//! proxy-wasm shell is compiled only for `wasm32`.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod auth;
pub mod cache;
pub mod config;
pub mod core;
pub mod pending;
pub mod reentry;
pub mod rfc3339;

#[cfg(target_arch = "wasm32")]
mod shell;
#[cfg(target_arch = "wasm32")]
pub use shell::{root_context, Fused, FusedStage};
