//! usage-accounting: what each request used and cost, for every API, streams included.
//!
//! The last filter of the chain (the first to see the response). For streaming Chat
//! Completions it injects `stream_options.include_usage: true` and hides the extra usage-only
//! chunk from a client that had not asked for it; it frames SSE across arbitrary chunk splits
//! and reads usage from OpenAI Chat Completions, the Responses API, Anthropic Messages and
//! embeddings ([`llm_gateway_shared::usage`]); without usage from the upstream it counts with a
//! tokenizer ([`llm_gateway_shared::tokens`]) and says `usage_source: "estimated"`. It prices
//! the usage in integer nano-units with a versioned price table ([`pricing`]) and publishes one
//! attribution record per request ([`record`]): Envoy filter state `wasm.<filter_state>` for
//! the access log and later filters, a JSON log line, Prometheus metrics ([`metrics`]), and
//! `x-llm-cost` / usage headers on non-streaming responses.
//!
//! It never rejects a request and never logs a prompt or a completion. Decisions live in the
//! pure modules ([`exchange`] ties them together); the proxy-wasm shell is compiled only for
//! `wasm32`.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod chunk;
pub mod config;
pub mod core;
pub mod exchange;
pub mod ledger;
pub mod metrics;
pub mod pricing;
pub mod record;
pub mod report;
pub mod request;
pub mod stream;

#[cfg(target_arch = "wasm32")]
mod shell;
#[cfg(target_arch = "wasm32")]
pub use shell::{root_context, Fused, FusedStage};
