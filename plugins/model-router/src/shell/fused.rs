//! The fused filter (plugins/bundle): the same core, one stage of its chain.

use super::view::FusedView;
use super::*;
use crate::config::Role;
use llm_gateway_shared::chain::{self, Direction, Step};

/// This plugin configured from its section of the fused filter's configuration (the listener
/// role; the provider clusters' upstream filter stays a filter of its own, in the same VM,
/// where it finds these rules).
pub struct Fused(Rc<RefCell<Core>>);

impl Fused {
    /// Parses the section; `None` (logged) if it is invalid or not the listener role.
    pub fn configure(document: &[u8]) -> Option<Fused> {
        let rules = host::parse_config("model-router", document, parse_document)?;
        let seed = RandomState::new().hash_one(host::time_nanos());
        let core = Rc::new(RefCell::new(Core::new(seed, LISTENER.with(Rc::clone))));
        core.try_borrow_mut()
            .ok()?
            .configure(host::time_nanos(), rules, &HostStore);
        carry(&core, 0, Next::Continue, &mut Sink::Host);
        let downstream = core
            .try_borrow()
            .is_ok_and(|c| c.role() == Role::Downstream);
        if !downstream {
            log(
                LogLevel::Error,
                "the fused filter takes the listener role; the upstream role is the clusters' filter",
            );
            return None;
        }
        Some(Fused(core))
    }

    /// The stage of request `context` (the fused filter's context id).
    pub fn stage(&self, context: u32) -> FusedStage {
        FusedStage {
            core: Rc::clone(&self.0),
            id: context,
            skip_response_body: false,
        }
    }
}

/// One request's model-router stage in the fused filter.
pub struct FusedStage {
    core: Rc<RefCell<Core>>,
    id: u32,
    skip_response_body: bool,
}

impl Drop for FusedStage {
    fn drop(&mut self) {
        if let Ok(mut core) = self.core.try_borrow_mut() {
            core.forget(self.id);
        }
    }
}

impl FusedStage {
    /// Feeds `input`, carries out the effects against the exchange; the flow and whether a
    /// local reply went out.
    fn run(&mut self, x: &mut chain::Exchange, input: Input) -> (Flow, bool) {
        let next = match self.core.try_borrow_mut() {
            Ok(mut core) => core.handle(self.id, input, &FusedView(x), &HostStore),
            Err(_) => {
                log(LogLevel::Error, "re-entered while busy: request refused");
                return (Flow::Pause, true);
            }
        };
        let carried = carry(&self.core, self.id, next, &mut Sink::Fused(x));
        self.skip_response_body |= carried.skip_response_body && !carried.replied;
        (carried.flow, carried.replied)
    }

    /// The step of a callback's flow.
    fn step(&mut self, x: &mut chain::Exchange, input: Input, end: bool) -> Step {
        match self.run(x, input) {
            (_, true) => Step::Stop,
            // the router reads the body's `model` before the headers may go on
            (Flow::Pause | Flow::Wait | Flow::Refused, false) if !end => Step::Buffer,
            (Flow::Pause | Flow::Wait | Flow::Refused, false) => Step::Stop,
            (Flow::Continue | Flow::Whole, _) => Step::Continue,
        }
    }
}

impl chain::Stage<chain::Exchange> for FusedStage {
    fn headers(&mut self, x: &mut chain::Exchange, direction: Direction, end: bool) -> Step {
        let input = match direction {
            Direction::Request => Input::RequestHeaders { end_of_stream: end },
            Direction::Response => Input::ResponseHeaders { end_of_stream: end },
        };
        self.step(x, input, end)
    }

    fn data(&mut self, x: &mut chain::Exchange, direction: Direction, end: bool) -> Step {
        if direction == Direction::Response && self.skip_response_body {
            return Step::Continue;
        }
        let size = x.data.len();
        let input = match direction {
            Direction::Request => Input::RequestBody {
                size,
                end_of_stream: end,
            },
            Direction::Response => Input::ResponseBody {
                size,
                end_of_stream: end,
            },
        };
        self.step(x, input, end)
    }

    fn log(&mut self, x: &mut chain::Exchange) {
        let _flow = self.run(x, Input::Log); // on_log returns nothing
    }
}
