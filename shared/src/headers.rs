//! The internal header names of the filter contract, in one place.
//!
//! Filters run in separate VMs and talk through request headers. Every `x-llm-*` header is
//! trusted only because key-auth removes all client-supplied ones (and `x-mse-consumer`,
//! Higress's consumer header) before anything reads them; the Envoy route configuration
//! removes them again before the request reaches a provider. Names are lowercase, as Envoy
//! hands them to wasm.

/// Prefix of every internal header; a client-supplied header with it is removed by key-auth.
pub const INTERNAL_PREFIX: &str = "x-llm-";

/// Consumer name of the authenticated virtual key (set by key-auth).
pub const CONSUMER: &str = "x-llm-consumer";
/// Tenant the consumer belongs to (set by key-auth).
pub const TENANT: &str = "x-llm-tenant";
/// Model groups the key may use, comma-separated; `*` means any (set by key-auth).
pub const GROUPS: &str = "x-llm-groups";
/// Stable, non-secret id of the virtual key: the key's configured `id`, else the first 16 hex
/// digits of its SHA-256 (set by key-auth; per-key limits, budgets, metrics and the usage record
/// use it, so a key rotated under the same `id` keeps its spend).
pub const KEY_ID: &str = "x-llm-key-id";
/// Tier of the virtual key (`free`, `pro`, …), present only when the key has one (set by
/// key-auth; limits and budgets take their amount from it).
pub const TIER: &str = "x-llm-tier";
/// Model group the client named (set by model-router).
pub const MODEL_GROUP: &str = "x-llm-model-group";
/// Deployment chosen for this attempt (set by model-router).
pub const DEPLOYMENT: &str = "x-llm-deployment";
/// Upstream cluster the route sends the request to (set by model-router).
pub const CLUSTER: &str = "x-llm-cluster";
/// Logical request id that survives fallbacks and retries (reservations are keyed by it).
pub const REQUEST_ID: &str = "x-llm-request-id";
/// Present on a pass that re-enters the chain for the same logical request (the
/// internal-redirect fallback of Higress and Envoy < 1.39): key-auth sets it after verifying
/// the gateway's ticket, and removes any other copy. Absent on a request's first pass. See
/// [`crate::reentry`].
pub const REENTRY: &str = "x-llm-reentry";
/// The model router's continuation on a re-entered pass (`<attempt>|<group>|<request id>|<plan>`),
/// copied by the redirect policy from the first pass's filter state `wasm.llm_route_next`.
pub const ROUTE_NEXT: &str = "x-llm-route-next";
/// The internal headers a verified re-entry keeps (the redirect policy added them; every other
/// `x-llm-*` header of the re-entered stream is stale and removed).
pub const REENTRY_CARRIED: [&str; 1] = [ROUTE_NEXT];

/// Higress's consumer header, read by Higress's own plugins; set by key-auth, and stripped
/// from clients because Higress's key-auth only adds it.
pub const HIGRESS_CONSUMER: &str = "x-mse-consumer";

/// Every header key-auth sets for downstream filters, in the order it sets them ([`TIER`] only
/// for a key that has one).
pub const IDENTITY: [&str; 6] = [CONSUMER, HIGRESS_CONSUMER, TENANT, GROUPS, KEY_ID, TIER];

/// True for a header a client must never be able to set: `x-llm-*` and `x-mse-consumer`,
/// in any letter case.
pub fn is_internal(name: &str) -> bool {
    let bytes = name.as_bytes();
    let prefix = INTERNAL_PREFIX.as_bytes();
    (bytes.len() >= prefix.len()
        && bytes
            .iter()
            .zip(prefix)
            .all(|(a, b)| a.eq_ignore_ascii_case(b)))
        || name.eq_ignore_ascii_case(HIGRESS_CONSUMER)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn internal_headers_in_any_case() {
        for name in [
            "x-llm-consumer",
            "X-LLM-Consumer",
            "x-llm-",
            "x-llm-anything-new",
            "x-mse-consumer",
            "X-Mse-Consumer",
        ] {
            assert!(is_internal(name), "{name}");
        }
        for name in [
            "x-llm",
            "x-llmconsumer",
            "authorization",
            "x-mse-consumers",
            "xx-llm-a",
            "",
        ] {
            assert!(!is_internal(name), "{name}");
        }
    }

    #[test]
    fn identity_headers_are_all_internal() {
        for name in IDENTITY {
            assert!(is_internal(name), "{name}");
            assert_eq!(name, name.to_ascii_lowercase());
        }
    }
}
