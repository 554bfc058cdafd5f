//! The fused filter (plugins/bundle): the same core, the last stage of its chain.

use super::head::read_head;
use super::state::{log, nonce, State};
use crate::config::{parse_document, Config};
use crate::core::{Core, Head, Input};
use llm_gateway_shared::chain::{self, Direction, Step};
use llm_gateway_shared::host::{self, LogLevel, Sink};
use llm_gateway_shared::reentry::is_superseded;
use llm_gateway_shared::stage::Flow;
use std::rc::Rc;

/// This plugin configured from its section of the fused filter's configuration. Limits and
/// budgets are kept per instance in shared data; the Redis transports (Higress's calls,
/// webdis) are not run by the fused filter: a `redis` section is refused, and the separate
/// filters serve a fleet (`gateway-fleet.yaml`).
pub struct Fused(Rc<State>);

impl Fused {
    /// Parses the section; `None` (logged) if it is invalid or asks for Redis.
    pub fn configure(document: &[u8]) -> Option<Fused> {
        let rules = host::parse_config("token-ratelimit", document, parse_document)?;
        if rules.configs().any(|c| c.redis.is_some()) {
            log(
                LogLevel::Error,
                "the fused filter keeps limits and budgets per instance: `redis` is for the separate filters (gateway-fleet.yaml)",
            );
            return None;
        }
        let core = Core::new(rules, nonce(), false);
        Some(Fused(Rc::new(State::new(core, None))))
    }

    /// The stage of request `context` (the fused filter's context id).
    pub fn stage(&self, context: u32) -> FusedStage {
        let state = Rc::clone(&self.0);
        FusedStage { state, id: context }
    }
}

/// One request's token-ratelimit stage in the fused filter.
pub struct FusedStage {
    state: Rc<State>,
    id: u32,
}

impl Drop for FusedStage {
    fn drop(&mut self) {
        // the context goes: an admission never settled is settled now (on_done)
        let unsettled = self.state.core.borrow().unsettled(self.id);
        if unsettled {
            let mut x = chain::Exchange::default();
            self.run(&mut x, Input::Done { ctx: self.id });
        }
    }
}

impl FusedStage {
    /// Feeds `input` and carries the effects out against the exchange; the step's answer:
    /// `Continue` once the core let the request go on, `Stop` after a refusal, `Wait`
    /// otherwise (the core holds the request).
    fn run(&self, x: &mut chain::Exchange, input: Input) -> Step {
        // the host acts on the context it did (this stage switches to its request when a
        // property is read)
        let effective = self.state.effective.get();
        let own = Some(self.id);
        match self.state.drive(effective, own, input, &mut Sink::Fused(x)) {
            Flow::Continue | Flow::Whole => Step::Continue,
            Flow::Pause | Flow::Wait => Step::Wait,
            Flow::Refused => Step::Stop,
        }
    }
}

impl chain::Stage<chain::Exchange> for FusedStage {
    fn headers(&mut self, x: &mut chain::Exchange, direction: Direction, end: bool) -> Step {
        match direction {
            Direction::Request => {
                let (config, counts_ip) = {
                    let core = self.state.core.borrow();
                    let authority = x.request.text(":authority");
                    let selected = host::select_config(core.rules(), authority);
                    (
                        selected.and_then(|c| core.config_index(c)),
                        selected.is_some_and(Config::counts_ip),
                    )
                };
                let head = match config {
                    Some(_) => read_head(counts_ip, |name| {
                        x.request
                            .text(name)
                            .filter(|v| !v.is_empty())
                            .map(str::to_owned)
                    }),
                    None => Head::default(),
                };
                let ctx = self.id;
                let step = self.run(
                    x,
                    Input::RequestHeaders {
                        ctx,
                        config,
                        head,
                        end_of_stream: end,
                    },
                );
                // held until the end of the body (a request with a body)
                match step {
                    Step::Wait if !end => Step::Buffer,
                    other => other,
                }
            }
            Direction::Response => {
                let ctx = self.id;
                self.run(x, Input::ResponseHeaders { ctx });
                Step::Continue
            }
        }
    }

    fn data(&mut self, x: &mut chain::Exchange, direction: Direction, end: bool) -> Step {
        match direction {
            Direction::Request => {
                let ctx = self.id;
                let size = x.data.len();
                self.run(
                    x,
                    Input::RequestBody {
                        ctx,
                        size,
                        end_of_stream: end,
                    },
                )
            }
            Direction::Response => Step::Continue,
        }
    }

    fn log(&mut self, x: &mut chain::Exchange) {
        let ctx = self.id;
        let watches = self
            .state
            .core
            .try_borrow()
            .map_or(true, |c| c.watches_supersession(ctx));
        let superseded = watches && is_superseded(x.code_details(host::code_details));
        self.run(x, Input::Log { ctx, superseded });
    }
}
