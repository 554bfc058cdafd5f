//! The data of one VM's wasmtime `Store`: what the host functions read and write while the
//! plugin runs. Everything a host call wants the outside world to do (resume a stream, send a
//! local reply, call out over HTTP or Redis) is recorded as an [`Effect`] and carried out by
//! the driver after the callback returned, as Envoy defers it too.

use super::cost::Counters;
use super::redis::RedisBridge;
use super::services::{Clock, InstanceServices, QueueOwner};
use super::stream::{Direction, Headers, StreamData};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use wasmtime_wasi::p1::WasiP1Ctx;

/// One `proxy_log` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// 0 trace .. 5 critical.
    pub level: u32,
    /// The text (lossy UTF-8).
    pub message: String,
}

/// Where a VM sits in the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VmLocation {
    /// Gateway instance index.
    pub instance: usize,
    /// Worker index in the instance.
    pub worker: usize,
    /// Filter index in the chain (one VM per filter per worker).
    pub filter: usize,
}

/// What a context id stands for inside one VM.
#[derive(Debug, Clone)]
pub enum ContextKind {
    /// The root context.
    Root,
    /// An HTTP context: its stream and its filter's chain index.
    Http {
        /// The stream's data.
        data: Arc<Mutex<StreamData>>,
        /// Chain index of the filter.
        filter: usize,
        /// The fleet-wide stream id.
        stream: u64,
    },
}

/// An HTTP call a plugin dispatched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCallRequest {
    /// The cluster (`upstream` argument).
    pub cluster: String,
    /// Headers, `:method`, `:path`, `:authority` included.
    pub headers: Headers,
    /// Body.
    pub body: Vec<u8>,
    /// Trailers.
    pub trailers: Headers,
    /// Timeout in milliseconds.
    pub timeout_ms: u32,
}

/// The answer to an HTTP call, or its failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpCallOutcome {
    /// A response: headers (`:status` included), body, trailers.
    Response {
        /// Headers.
        headers: Headers,
        /// Body.
        body: Vec<u8>,
        /// Trailers.
        trailers: Headers,
    },
    /// Timeout, reset or connect failure: Envoy calls back with no headers, body or trailers.
    Failure,
}

/// Something a host call asked for that happens after the callback returns.
#[derive(Debug, Clone)]
pub enum Effect {
    /// `proxy_continue_stream` for the stream of `context`.
    Continue {
        /// Context id in the VM.
        context: u32,
        /// Which direction.
        direction: Direction,
    },
    /// `proxy_close_stream`.
    Close {
        /// Context id in the VM.
        context: u32,
    },
    /// `proxy_send_local_response` (the reply itself waits in the stream's data).
    LocalReply {
        /// Context id in the VM.
        context: u32,
    },
    /// `proxy_http_call`.
    HttpCall {
        /// The context that dispatched it (the answer goes there).
        context: u32,
        /// Token returned to the plugin.
        token: u32,
        /// The request.
        request: HttpCallRequest,
    },
    /// Higress `proxy_redis_call`.
    RedisCall {
        /// Token returned to the plugin.
        token: u32,
        /// Service name.
        service: String,
        /// The RESP query.
        query: Vec<u8>,
        /// Timeout of the service's `proxy_redis_init`.
        timeout_ms: u32,
    },
    /// `proxy_enqueue_shared_queue`: notify the owner.
    QueueReady {
        /// The owner to call `proxy_on_queue_ready` on.
        owner: QueueOwner,
        /// The queue.
        queue: u32,
    },
}

/// The store data of one VM.
pub struct HostState {
    /// WASI preview 1 (stdout/stderr captured, clock from the fleet).
    pub wasi: WasiP1Ctx,
    /// Plugin name (file stem of the .wasm).
    pub plugin: String,
    /// `vm_id`: shared data and queues are per `vm_id`.
    pub vm_id: String,
    /// `root_id` of the filter (property `plugin_root_id`, in the root context too).
    pub root_id: String,
    /// Where it sits.
    pub location: VmLocation,
    /// The instance's services.
    pub services: Arc<InstanceServices>,
    /// The fleet's clock.
    pub clock: Clock,
    /// The Redis services of the fleet.
    pub redis: Arc<RedisBridge>,
    /// Redis services this VM initialized, with their timeouts.
    pub redis_services: HashMap<String, u32>,
    /// Clusters `proxy_http_call` may address.
    pub http_clusters: Arc<Mutex<HashSet<String>>>,
    /// Level `proxy_get_log_level` reports.
    pub log_level: u32,
    /// Lines logged.
    pub logs: Vec<LogLine>,
    /// Known contexts.
    pub contexts: HashMap<u32, ContextKind>,
    /// The root context id.
    pub root_context: u32,
    /// The context host calls address now.
    pub effective: u32,
    /// Plugin configuration (buffer type 7).
    pub plugin_config: Vec<u8>,
    /// VM configuration (buffer type 6).
    pub vm_config: Vec<u8>,
    /// The HTTP call response being delivered (buffer 4, maps 6/7).
    pub http_call_response: Option<(Headers, Vec<u8>, Headers)>,
    /// The Redis reply being delivered (buffer 9).
    pub redis_response: Option<Vec<u8>>,
    /// The tick period, 0 for none.
    pub tick_period_ms: u32,
    /// Next token for HTTP and Redis calls.
    pub next_token: u32,
    /// Effects waiting for the driver.
    pub effects: Vec<Effect>,
    /// Cost of the callback running now.
    pub counters: Counters,
}

impl HostState {
    /// A new call token.
    pub fn token(&mut self) -> u32 {
        self.next_token = self.next_token.wrapping_add(1).max(1);
        self.next_token
    }

    /// The stream and filter of the effective context, if it is an HTTP context.
    pub fn http_context(&self) -> Option<(Arc<Mutex<StreamData>>, usize)> {
        match self.contexts.get(&self.effective)? {
            ContextKind::Http { data, filter, .. } => Some((data.clone(), *filter)),
            ContextKind::Root => None,
        }
    }

    /// The log lines as text, one per line, with levels.
    pub fn log_text(&self) -> String {
        self.logs
            .iter()
            .map(|l| format!("[{}] {}\n", level_name(l.level), l.message))
            .collect()
    }
}

/// The name of a log level.
pub fn level_name(level: u32) -> &'static str {
    match level {
        0 => "trace",
        1 => "debug",
        2 => "info",
        3 => "warn",
        4 => "error",
        _ => "critical",
    }
}
