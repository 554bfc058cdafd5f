//! One filter of a chain as a test describes it: which plugin (`dist/*.wasm`), with which
//! configuration, how Envoy runs it. Plain data, below the host modes that check it
//! ([`super::host`]) and the VMs that run it ([`super::vm`]).

use std::path::PathBuf;

/// One filter of a chain: which plugin, with which configuration, how Envoy runs it.
#[derive(Debug, Clone)]
pub struct FilterSpec {
    /// Plugin name (for logs, metrics of cost, property `plugin_name`).
    pub name: String,
    /// The `.wasm` file.
    pub path: PathBuf,
    /// The plugin configuration (`proxy_on_configure`, buffer 7).
    pub config: Vec<u8>,
    /// The VM configuration (`proxy_on_vm_start`, buffer 6).
    pub vm_config: Vec<u8>,
    /// `root_id`.
    pub root_id: String,
    /// `vm_id` (shared data and queues are per `vm_id`); defaults to the plugin name.
    pub vm_id: String,
    /// Envoy 1.35+ `allow_on_headers_stop_iteration`: `Pause` from a headers callback is a
    /// plain `StopIteration` (body still delivered) instead of `StopAllIterationAndWatermark`.
    /// Envoy mode only: Higress mode refuses it ([`Host::check`](super::Host::check)).
    pub allow_on_headers_stop_iteration: bool,
    /// The filter stands for an upstream (cluster) HTTP filter placed after the listener
    /// filters (the harness has no router: the test places it last). Envoy mode only.
    pub upstream_filter: bool,
}

impl FilterSpec {
    /// The built plugin `dist/<name>.wasm` with a JSON configuration.
    pub fn plugin(name: &str, config: &serde_json::Value) -> crate::Result<FilterSpec> {
        Ok(FilterSpec {
            path: crate::workspace::plugin_wasm(name)?,
            ..FilterSpec::plugin_at(name, config)
        })
    }

    /// The plugin's Higress build `dist/higress/<name>.wasm` (ABI `0_2_100`; the Redis
    /// builds of token-ratelimit and usage-accounting) with a JSON configuration; for a fleet
    /// in [`Host::Higress`](super::Host::Higress) mode.
    pub fn higress(name: &str, config: &serde_json::Value) -> crate::Result<FilterSpec> {
        Ok(FilterSpec {
            path: crate::workspace::higress_wasm(name)?,
            ..FilterSpec::plugin_at(name, config)
        })
    }

    fn plugin_at(name: &str, config: &serde_json::Value) -> FilterSpec {
        FilterSpec {
            name: name.to_string(),
            path: PathBuf::new(),
            config: config.to_string().into_bytes(),
            vm_config: Vec::new(),
            root_id: String::new(),
            vm_id: name.to_string(),
            allow_on_headers_stop_iteration: false,
            upstream_filter: false,
        }
    }

    /// The same filter with the plugin's Higress build (`dist/higress/<name>.wasm`) and
    /// without `allow_on_headers_stop_iteration`, which a WasmPlugin cannot set: what a
    /// [`FilterSpec::plugin`] becomes on a fleet in [`Host::Higress`](super::Host::Higress) mode.
    pub fn into_higress(self) -> crate::Result<FilterSpec> {
        Ok(FilterSpec {
            path: crate::workspace::higress_wasm(&self.name)?,
            allow_on_headers_stop_iteration: false,
            ..self
        })
    }

    /// Marks the filter as an upstream (cluster) filter (refused in Higress mode).
    pub fn upstream_filter(mut self, upstream: bool) -> Self {
        self.upstream_filter = upstream;
        self
    }

    /// Sets `allow_on_headers_stop_iteration`.
    pub fn allow_on_headers_stop_iteration(mut self, allow: bool) -> Self {
        self.allow_on_headers_stop_iteration = allow;
        self
    }

    /// Sets the `root_id` (property `plugin_root_id`).
    pub fn root_id(mut self, root_id: &str) -> Self {
        self.root_id = root_id.to_string();
        self
    }

    /// Sets the VM configuration (`proxy_on_vm_start`, buffer 6).
    pub fn vm_config(mut self, vm_config: &[u8]) -> Self {
        self.vm_config = vm_config.to_vec();
        self
    }

    /// Sets the `vm_id`.
    pub fn vm_id(mut self, vm_id: &str) -> Self {
        self.vm_id = vm_id.to_string();
        self
    }
}
