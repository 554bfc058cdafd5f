//! pii-redaction: personal data out of requests, originals back into responses.
//!
//! Scans the message text of OpenAI Chat Completions, Responses API and Anthropic Messages
//! requests (or, per rule, the whole raw body) with built-in detectors (e-mail, phone numbers
//! of any country, IBAN, national ids with their check digits — PRC, US, UK, FR, DE, JP —,
//! payment cards of every brand, IPv4/IPv6, common secrets, personal names from gazetteers and
//! context, postal addresses by their shape per locale) and user patterns and deny words. Each
//! rule masks with a stable per-request placeholder
//! (`[EMAIL_1]`), hashes (salted, truncated SHA-256), or blocks the request (400). Masked
//! values of `restore` rules are put back in the response — whole JSON bodies and SSE streams,
//! where a placeholder may be split across events and network chunks — and optional output
//! rules mask what the model itself produced.
//!
//! It keeps the per-request map in the HTTP context only, never logs a value (metrics count
//! matches per rule), and matches in linear time (hand-written scanners and `regex-lite`).
//! Decisions live in the pure modules below, tested natively; the proxy-wasm shell is
//! compiled only for `wasm32`.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod address;
#[cfg(not(target_arch = "wasm32"))]
#[doc(hidden)]
pub mod bench_data;
pub mod card;
pub mod config;
mod context;
pub mod core;
pub mod detect;
pub mod iban;
pub mod mask;
pub mod names;
pub mod national_id;
pub mod phone;
pub mod request;
pub mod response;
mod scan;

#[cfg(target_arch = "wasm32")]
mod shell;
#[cfg(target_arch = "wasm32")]
pub use shell::{root_context, Fused, FusedStage};
