//! The fused filter (plugins/bundle): the same state and core, the first stage of its chain.

use super::state::{carry, State};
use crate::auth::NoStore;
use crate::config::parse_document;
use crate::core::{Exchange, Flow};
use llm_gateway_shared::chain::{self, Direction, Step};
use llm_gateway_shared::host::{self, Sink};
use std::rc::Rc;

/// This plugin configured from its section of the fused filter's configuration.
pub struct Fused(Rc<State>);

impl Fused {
    /// Parses the section; `None` (logged) if it is invalid.
    pub fn configure(document: &[u8]) -> Option<Fused> {
        let rules = host::parse_config("key-auth", document, parse_document)?;
        // no key store: the fused filter is the plain build's
        Some(Fused(Rc::new(State::new(rules, None))))
    }

    /// The stage of one request.
    pub fn stage(&self) -> FusedStage {
        FusedStage(Rc::clone(&self.0))
    }
}

/// One request's key-auth stage in the fused filter: authenticates at the request headers.
pub struct FusedStage(Rc<State>);

impl chain::Stage<chain::Exchange> for FusedStage {
    fn headers(&mut self, x: &mut chain::Exchange, direction: Direction, _end: bool) -> Step {
        if direction == Direction::Response {
            return Step::Continue;
        }
        let state = &self.0;
        let mut core = Exchange::default();
        let flow = core.authenticate(&state.request(x.request.pairs()), &mut NoStore);
        // no key store here: no lookup, and no context for one
        match carry(Some(state), 0, &mut core, flow, &mut Sink::Fused(x)) {
            Flow::Continue | Flow::Whole => Step::Continue,
            Flow::Pause | Flow::Wait | Flow::Refused => Step::Stop,
        }
    }

    fn data(&mut self, _x: &mut chain::Exchange, _direction: Direction, _end: bool) -> Step {
        Step::Continue
    }

    fn log(&mut self, _x: &mut chain::Exchange) {}
}
