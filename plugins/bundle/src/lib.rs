//! llm-gateway-bundle: the five filters of the chain in one module, for plain Envoy.
//!
//! Envoy runs one VM per `vm_id` and module per worker thread. With the five standalone
//! modules that is five VMs per worker, two of them holding the tokenizer's ranks; with this
//! module and one `vm_id` for every filter it is one VM per worker, one copy of the code and of
//! the ranks, and one `o200k_base` built per worker instead of two.
//!
//! Each filter names its plugin with its `root_id` ([`roots::ROOT_IDS`]): the root-context
//! factory reads the root id of the context being created (property `plugin_root_id`) and
//! hands out that plugin's root context, exactly the one its standalone module creates. An
//! unknown root id gets a root context whose configuration fails with a log line naming the id
//! and the known ones, so Envoy refuses the filter.
//!
//! The Higress builds (Higress's Redis calls) are not bundled: see the README.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod fused_config;
pub mod roots;

#[cfg(target_arch = "wasm32")]
mod fused;
#[cfg(target_arch = "wasm32")]
mod shell;
