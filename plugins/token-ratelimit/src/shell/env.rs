//! What the core reaches synchronously ([`Env`]): shared data, Redis, the records other
//! filters published for a request.

use super::State;
use crate::core::Env;
use llm_gateway_shared::chain;
use llm_gateway_shared::host::{self, redis_client, HostError, Sink};
use llm_gateway_shared::route_info::{
    Alternative, RoutePrices, BUDGET_FALLBACK_PROPERTY, PROPERTY as ROUTE_PROPERTY,
};
use llm_gateway_shared::usage_record::Charge;
use std::borrow::Cow;

/// The core's host. In the fused filter, the records the stages before this one published in
/// this request (the budget fallback, the usage record) are read from the exchange
/// ([`chain::Exchange::published`]), not asked of the host again. The route info is always
/// read from the host: the clusters' filter rewrites it.
pub(super) struct HostEnv<'a> {
    state: &'a State,
    /// The fused filter's request and its exchange.
    fused: Option<(u32, &'a chain::Exchange)>,
}

impl<'a> HostEnv<'a> {
    pub(super) fn new(state: &'a State, own: Option<u32>, sink: &'a Sink) -> HostEnv<'a> {
        let fused = match (own, sink) {
            (Some(own), Sink::Fused(x)) => Some((own, &**x)),
            _ => None,
        };
        HostEnv { state, fused }
    }

    /// A JSON record another filter published for request `ctx`, read from the host.
    fn property<T>(&self, ctx: u32, name: &str, parse: fn(&[u8]) -> Option<T>) -> Option<T> {
        let bytes = self
            .state
            .at(ctx, || host::property(&[name]))
            .ok()
            .flatten()?;
        parse(&bytes)
    }

    /// A record a stage of the fused filter published for this request, else the host's.
    fn published<T>(&self, ctx: u32, name: &str, parse: fn(&[u8]) -> Option<T>) -> Option<T> {
        let published = self.fused.filter(|(own, _)| *own == ctx);
        match published.and_then(|(_, x)| x.published(name)) {
            Some(bytes) => parse(bytes),
            None => self.property(ctx, name, parse),
        }
    }
}

impl Env for HostEnv<'_> {
    fn shared_get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), HostError> {
        host::shared_data(key)
    }

    fn shared_set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), HostError> {
        host::set_shared_data(key, value, cas)
    }

    /// Sends to the VM's Redis, the one connected at configure (the first scope's `redis`):
    /// `service` names it unless a rule has a `redis` of its own, which gets no connection.
    fn send_redis(&self, _service: &str, args: &[Cow<'_, [u8]>]) -> Result<u32, HostError> {
        match &self.state.redis {
            Some(redis) => redis_client::send(redis, args),
            None => Err(HostError::Unimplemented),
        }
    }

    fn route_info(&self, ctx: u32) -> Option<RoutePrices> {
        self.property(ctx, ROUTE_PROPERTY, RoutePrices::from_json)
    }

    fn alternative(&self, ctx: u32) -> Option<Alternative> {
        self.published(ctx, BUDGET_FALLBACK_PROPERTY, Alternative::from_json)
    }

    fn usage_record(&self, ctx: u32, property: &str) -> Option<Charge> {
        self.published(ctx, property, Charge::from_json)
    }
}
