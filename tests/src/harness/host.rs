//! Which gateway the harness plays: upstream Envoy (1.35+, the default) or Higress 2.2.4 (its
//! Envoy 1.36 fork with `higress-group/proxy-wasm-cpp-host`). They differ, for these plugins,
//! in four things, all decided when a fleet is built:
//!
//! - **The ABI a module may declare.** The host reads the first `proxy_abi_version_*` function
//!   export it knows (cpp-host `src/bytecode_util.cc`, `getAbiVersion`, in export order) and
//!   refuses a module without one: "Missing or unknown Proxy-Wasm ABI version"
//!   (`src/wasm.cc`, `load()`). Envoy knows `_0_1_0`, `_0_2_0`, `_0_2_1`; Higress also
//!   `_0_2_100`. (The harness implements the 0.2.x ABI only, so `_0_1_0` is refused here.)
//! - **What `Pause` (1) from `proxy_on_request_headers` / `proxy_on_response_headers`
//!   means.** Envoy: `StopAllIterationAndWatermark` (no body callbacks until the filter
//!   resumes) unless the filter sets `allow_on_headers_stop_iteration`, then a plain
//!   `StopIteration`. Higress: a WasmPlugin cannot set that flag; its cpp-host
//!   (`src/context.cc`, `convertVmCallResultToFilterHeadersStatus`) turns 1 into
//!   `StopAllIterationAndWatermark` for the 0.1/0.2 ABIs and passes it through as
//!   `StopIteration` for `_0_2_100`, in both directions
//!   (higress-group/proxy-wasm-cpp-host@913c1b02; docs/host-notes.md, "Higress mode").
//! - **Upstream (cluster) filters**: a WasmPlugin makes listener filters only (Istio's
//!   translation), so Higress mode refuses a [`FilterSpec::upstream_filter`].
//! - **Redis**: Higress's `proxy_redis_init` / `proxy_redis_call` are linked in both modes. A
//!   real Envoy refuses a module importing them ("missing import"); the harness does not,
//!   because its own probe fixture (`tests/fixture-plugins/redis-probe`) imports them and is
//!   also the module of the Envoy-semantics suite; the plain plugin builds are checked not to
//!   import them (`harness key_auth::`, `packaging abi::`).

use super::filter::FilterSpec;

/// The gateway whose wasm host the harness models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Host {
    /// Upstream Envoy 1.35+ (verified against 1.40).
    #[default]
    Envoy,
    /// Higress 2.2.4: Envoy 1.36 with Higress's proxy-wasm host.
    Higress,
}

/// A module's proxy-wasm ABI, from its `proxy_abi_version_*` export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abi {
    /// `proxy_abi_version_0_2_0`.
    V0_2_0,
    /// `proxy_abi_version_0_2_1` (the stock Rust SDK, the plain builds in `dist/`).
    V0_2_1,
    /// `proxy_abi_version_0_2_100` (Higress's SDKs, the builds in `dist/higress/`).
    V0_2_100,
}

impl Abi {
    /// The export that declares it.
    pub fn export(self) -> &'static str {
        match self {
            Abi::V0_2_0 => "proxy_abi_version_0_2_0",
            Abi::V0_2_1 => "proxy_abi_version_0_2_1",
            Abi::V0_2_100 => "proxy_abi_version_0_2_100",
        }
    }
}

impl Host {
    /// The ABI versions this host knows, as exports.
    fn known(self) -> &'static [&'static str] {
        match self {
            Host::Envoy => &[
                "proxy_abi_version_0_1_0",
                "proxy_abi_version_0_2_0",
                "proxy_abi_version_0_2_1",
            ],
            Host::Higress => &[
                "proxy_abi_version_0_1_0",
                "proxy_abi_version_0_2_0",
                "proxy_abi_version_0_2_1",
                "proxy_abi_version_0_2_100",
            ],
        }
    }

    /// The ABI of a module with these exports (in export order), as the host picks it: the
    /// first export it knows; none is the host's refusal.
    pub fn abi(self, plugin: &str, exports: &[String]) -> crate::Result<Abi> {
        let found = exports.iter().find(|e| self.known().contains(&e.as_str()));
        match found.map(String::as_str) {
            Some("proxy_abi_version_0_2_0") => Ok(Abi::V0_2_0),
            Some("proxy_abi_version_0_2_1") => Ok(Abi::V0_2_1),
            Some("proxy_abi_version_0_2_100") => Ok(Abi::V0_2_100),
            Some(other) => Err(format!(
                "{plugin}: {other}: the harness implements the 0.2.x ABI only"
            )),
            None => Err(format!(
                "{plugin}: Missing or unknown Proxy-Wasm ABI version ({self:?} knows {}; \
                 the module exports {})",
                self.known().join(", "),
                abi_exports(exports)
            )),
        }
    }

    /// Refuses a filter this host cannot be configured with.
    pub fn check(self, spec: &FilterSpec) -> crate::Result<()> {
        match self {
            Host::Envoy => Ok(()),
            Host::Higress if spec.allow_on_headers_stop_iteration => Err(format!(
                "{}: allow_on_headers_stop_iteration cannot be set on Higress (a WasmPlugin \
                 has no field for it; build the module with ABI 0_2_100 instead)",
                spec.name
            )),
            Host::Higress if spec.upstream_filter => Err(format!(
                "{}: an upstream (cluster) filter cannot be made by a WasmPlugin on Higress",
                spec.name
            )),
            Host::Higress => Ok(()),
        }
    }

    /// True when `Pause` (1) from a headers callback is a plain `StopIteration` (body
    /// callbacks still come); false when it is `StopAllIterationAndWatermark`.
    pub fn headers_pause_is_stop_iteration(self, spec: &FilterSpec, abi: Abi) -> bool {
        match self {
            Host::Envoy => spec.allow_on_headers_stop_iteration,
            Host::Higress => abi == Abi::V0_2_100,
        }
    }
}

fn abi_exports(exports: &[String]) -> String {
    let found: Vec<&str> = exports
        .iter()
        .map(String::as_str)
        .filter(|e| e.starts_with("proxy_abi_version_"))
        .collect();
    if found.is_empty() {
        "none".to_string()
    } else {
        found.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn each_host_reads_the_first_abi_export_it_knows() {
        let plain = names(&["memory", "proxy_abi_version_0_2_1", "proxy_on_tick"]);
        let higress = names(&["proxy_abi_version_0_2_100"]);
        let both = names(&["proxy_abi_version_0_2_100", "proxy_abi_version_0_2_1"]);
        assert_eq!(Host::Envoy.abi("p", &plain), Ok(Abi::V0_2_1));
        assert_eq!(Host::Higress.abi("p", &plain), Ok(Abi::V0_2_1));
        assert_eq!(Host::Higress.abi("p", &higress), Ok(Abi::V0_2_100));
        let refused = Host::Envoy.abi("p", &higress).unwrap_err();
        assert!(
            refused.contains("Missing or unknown Proxy-Wasm ABI version"),
            "{refused}"
        );
        assert_eq!(Host::Envoy.abi("p", &both), Ok(Abi::V0_2_1));
        assert_eq!(Host::Higress.abi("p", &both), Ok(Abi::V0_2_100));
        assert!(Host::Higress.abi("p", &names(&["memory"])).is_err());
    }
}
