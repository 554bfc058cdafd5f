//! The proxy-wasm adapter: the module's only entry point. The root-context factory reads the
//! root id of the context being created and hands out the plugin's own root context; every
//! later callback of that context and of its HTTP contexts is the plugin's, unchanged.

use crate::roots::{self, Plugin};
use llm_gateway_shared::host::{self, LogLevel};
use llm_gateway_shared::reject::Reject;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};

proxy_wasm::main! {{
    proxy_wasm::set_root_context(root_context);
}}

/// Envoy calls `proxy_on_context_create(id, 0)` for each filter config's root context with
/// that context current, so `plugin_root_id` is the filter's `root_id` (docs/host-notes.md).
fn root_context(context_id: u32) -> Box<dyn RootContext> {
    let root_id = host::plugin_root_id().ok().flatten();
    match root_id.as_deref().and_then(roots::plugin) {
        Some(Plugin::KeyAuth) => key_auth::root_context(context_id),
        Some(Plugin::ModelRouter) => model_router::root_context(context_id),
        Some(Plugin::PiiRedaction) => pii_redaction::root_context(context_id),
        Some(Plugin::UsageAccounting) => usage_accounting::root_context(context_id),
        Some(Plugin::TokenRatelimit) => token_ratelimit::root_context(context_id),
        Some(Plugin::Fused) => Box::<crate::fused::Root>::default(),
        None => Box::new(Unknown { root_id }),
    }
}

/// The root context of a root id the bundle does not know: its configuration fails (Envoy
/// refuses the filter), and should a host create HTTP contexts anyway they refuse requests.
struct Unknown {
    root_id: Option<String>,
}

impl Context for Unknown {}

impl RootContext for Unknown {
    fn on_configure(&mut self, _size: usize) -> bool {
        host::log(
            LogLevel::Error,
            &roots::unknown_root_id(self.root_id.as_deref()),
        );
        false
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Refuse))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// Fails closed: a filter the bundle could not serve never lets a request through.
struct Refuse;

impl Context for Refuse {}

impl HttpContext for Refuse {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let reject = Reject::internal("this filter's root_id names no plugin of the bundle");
        host::refuse("llm_gateway_bundle", &reject);
        Action::Pause
    }
}
