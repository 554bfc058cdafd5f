//! token-ratelimit: token rate limits and budgets (issue 6). See `TRL-DESIGN.md`.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod scripts;
