//! The fused filter: the five plugins' stages in one HTTP filter context (root id
//! `llm-gateway`), driven by [`llm_gateway_shared::chain::Engine`].
//!
//! Per request the host is asked once for the request headers, once for the whole request
//! body, once for the response headers and once per response chunk; every stage reads and
//! edits that one copy ([`chain::Exchange`]), and the edits go back to the host once: header
//! edits when the headers continue, the body when it was changed (its `content-length` kept
//! true). Envoy calls one filter per callback instead of five.

use crate::fused_config::{self, SECTIONS};
use llm_gateway_shared::chain::{self, Stage};
use llm_gateway_shared::host;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use request::Fused;
use std::rc::Rc;

mod request;
mod write;

/// The plugins configured from their sections (absent: the stage is off).
#[derive(Default)]
struct Plugins {
    key_auth: Option<key_auth::Fused>,
    model_router: Option<model_router::Fused>,
    pii_redaction: Option<pii_redaction::Fused>,
    usage_accounting: Option<usage_accounting::Fused>,
    token_ratelimit: Option<token_ratelimit::Fused>,
}

impl Plugins {
    /// One request's stages, in chain order.
    fn stages(&self, context_id: u32) -> Vec<Box<dyn Stage<chain::Exchange>>> {
        let mut stages: Vec<Box<dyn Stage<chain::Exchange>>> = Vec::with_capacity(SECTIONS.len());
        if let Some(p) = &self.key_auth {
            stages.push(Box::new(p.stage()));
        }
        if let Some(p) = &self.model_router {
            stages.push(Box::new(p.stage(context_id)));
        }
        if let Some(p) = &self.pii_redaction {
            stages.push(Box::new(p.stage()));
        }
        if let Some(p) = &self.usage_accounting {
            stages.push(Box::new(p.stage()));
        }
        if let Some(p) = &self.token_ratelimit {
            stages.push(Box::new(p.stage(context_id)));
        }
        stages
    }
}

/// The root context of the fused filter.
#[derive(Default)]
pub struct Root {
    plugins: Option<Rc<Plugins>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let Some(sections) = host::load_config("llm-gateway", fused_config::parse) else {
            return false;
        };
        let mut plugins = Plugins::default();
        if let Some(document) = sections.get("key_auth") {
            let Some(p) = key_auth::Fused::configure(document) else {
                return false;
            };
            plugins.key_auth = Some(p);
        }
        if let Some(document) = sections.get("model_router") {
            let Some(p) = model_router::Fused::configure(document) else {
                return false;
            };
            plugins.model_router = Some(p);
        }
        if let Some(document) = sections.get("pii_redaction") {
            let Some(p) = pii_redaction::Fused::configure(document) else {
                return false;
            };
            plugins.pii_redaction = Some(p);
        }
        if let Some(document) = sections.get("usage_accounting") {
            let Some(p) = usage_accounting::Fused::configure(document) else {
                return false;
            };
            plugins.usage_accounting = Some(p);
        }
        if let Some(document) = sections.get("token_ratelimit") {
            let Some(p) = token_ratelimit::Fused::configure(document) else {
                return false;
            };
            plugins.token_ratelimit = Some(p);
        }
        self.plugins = Some(Rc::new(plugins));
        true
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let stages = self
            .plugins
            .as_ref()
            .map(|p| p.stages(context_id))
            .unwrap_or_default();
        Some(Box::new(Fused::new(stages, self.plugins.is_some())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
