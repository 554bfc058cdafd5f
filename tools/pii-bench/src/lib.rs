//! `scripts/bench pii`: pii-redaction's detectors measured on a labelled corpus, natively.
//!
//! The corpus (tools/pii-bench/generate.py: Faker values in six locales inside sentences,
//! and negative text that must stay untouched) goes record by record through the plugin's
//! own request path (`redact_body` on a Chat Completions body) with a pii-redaction config;
//! [`score`] counts recall per type and locale, precision per placeholder name and the
//! negative corpus left untouched; [`report`] writes the Markdown table with the targets.
//! A benchmark, not a test: it reports, it does not fail on a missed target.

pub mod config;
pub mod report;
pub mod score;
