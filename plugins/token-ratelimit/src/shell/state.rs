//! The core of one VM and the host calls that act on one of its requests.

use crate::core::Core;
use llm_gateway_shared::host::{self, HostError, HostResult, LogLevel, Metric};
use llm_gateway_shared::redis::RedisConfig;
use std::cell::{Cell, RefCell};

pub(super) const PLUGIN: &str = "token_ratelimit";
pub(super) const METRIC_PREFIX: &str = "llm_gateway.ratelimit.";

pub(super) fn log(level: LogLevel, message: &str) {
    host::log(level, &format!("token-ratelimit: {message}"));
}

/// The core of one VM and what carrying its effects out needs.
pub(super) struct State {
    pub(super) core: RefCell<Core>,
    /// The VM's Redis (the first scope's `redis`), connected at configure.
    pub(super) redis: Option<RedisConfig>,
    metrics: RefCell<crate::fxhash::FxHashMap<String, Option<Metric>>>,
    /// The context the host currently acts on (`None`: the root's own).
    pub(super) effective: Cell<Option<u32>>,
}

impl State {
    pub(super) fn new(core: Core, redis: Option<RedisConfig>) -> State {
        let (metrics, effective) = (RefCell::default(), Cell::new(None));
        let core = RefCell::new(core);
        State {
            core,
            redis,
            metrics,
            effective,
        }
    }

    /// Makes request `ctx` the one host calls act on; false if it is gone.
    pub(super) fn enter(&self, ctx: u32) -> bool {
        if self.effective.get() == Some(ctx) {
            return true;
        }
        let entered = host::set_effective_context(ctx);
        if let Err(err) = &entered {
            log(LogLevel::Debug, &format!("request {ctx} gone: {err}"));
        }
        self.effective
            .set(entered.map_or(self.effective.get(), |()| Some(ctx)));
        entered.is_ok()
    }

    /// A host call on request `ctx`.
    pub(super) fn at<T>(&self, ctx: u32, call: impl FnOnce() -> HostResult<T>) -> HostResult<T> {
        match self.enter(ctx) {
            true => call(),
            false => Err(HostError::NotFound),
        }
    }

    /// A metric, defined on first use (`define` gets its full name).
    pub(super) fn metric(
        &self,
        key: &str,
        define: impl FnOnce(&str) -> HostResult<Metric>,
    ) -> Option<Metric> {
        let mut metrics = self.metrics.borrow_mut();
        if let Some(metric) = metrics.get(key) {
            return *metric;
        }
        let metric = define(&format!("{METRIC_PREFIX}{key}")).ok();
        metrics.insert(key.to_owned(), metric);
        metric
    }
}

/// This VM's id in the sync election (random per VM).
pub(super) fn nonce() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(host::time_nanos())
}
