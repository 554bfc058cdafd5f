//! The proxy-wasm shell of the stand-in: every callback continues; the request headers
//! callback makes the configured writes (a failed write is logged: the bench's probe request
//! then fails, which names the row).

use crate::{request_id, Config};
use llm_gateway_shared::host::{self, Buffer, HeaderMap, LogLevel};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use std::cell::Cell;
use std::rc::Rc;

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| Box::new(Root::default()));
}}

#[derive(Default)]
struct Root {
    config: Rc<Config>,
    start_nanos: u64,
    requests: Rc<Cell<u64>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let document = match host::buffer(Buffer::PluginConfiguration, 0, usize::MAX) {
            Ok(document) => document,
            Err(err) => {
                host::log(
                    LogLevel::Error,
                    &format!("passthrough: cannot read configuration: {err}"),
                );
                return false;
            }
        };
        match Config::parse(&document) {
            Ok(config) => {
                self.config = Rc::new(config);
                self.start_nanos = host::now_nanos().unwrap_or_default();
                true
            }
            Err(err) => {
                host::log(LogLevel::Error, &format!("passthrough: {err}"));
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Http {
            config: Rc::clone(&self.config),
            start_nanos: self.start_nanos,
            requests: Rc::clone(&self.requests),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Http {
    config: Rc<Config>,
    start_nanos: u64,
    requests: Rc<Cell<u64>>,
}

impl Context for Http {}

fn failed(what: &str, name: &str, err: host::HostError) {
    host::log(
        LogLevel::Error,
        &format!("passthrough: {what} {name}: {err}"),
    );
}

impl HttpContext for Http {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        let config = &self.config;
        if config.is_noop() {
            return Action::Continue;
        }
        for name in &config.remove_request_headers {
            if let Err(err) = host::remove_header(HeaderMap::RequestHeaders, name) {
                failed("remove header", name, err);
            }
        }
        for (name, value) in &config.request_headers {
            if let Err(err) = host::set_header(HeaderMap::RequestHeaders, name, value.as_bytes()) {
                failed("set header", name, err);
            }
        }
        if let Some(name) = &config.request_id_header {
            let n = self.requests.get();
            self.requests.set(n.wrapping_add(1));
            let id = request_id(self.start_nanos, n);
            if let Err(err) = host::set_header(HeaderMap::RequestHeaders, name, id.as_bytes()) {
                failed("set header", name, err);
            }
        }
        for (name, value) in &config.properties {
            if let Err(err) = host::set_property(&[name.as_str()], value.as_bytes()) {
                failed("set property", name, err);
            }
        }
        if config.clear_route_cache {
            if let Err(err) = host::clear_route_cache() {
                failed("clear route cache", "", err);
            }
        }
        Action::Continue
    }
}
