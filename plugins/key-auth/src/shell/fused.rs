//! The fused filter (plugins/bundle): the same state, the first stage of its chain.

use super::*;

/// This plugin configured from its section of the fused filter's configuration.
pub struct Fused(Rc<State>);

impl Fused {
    /// Parses the section; `None` (logged) if it is invalid.
    pub fn configure(document: &[u8]) -> Option<Fused> {
        let rules = host::parse_config("key-auth", document, parse_document)?;
        Some(Fused(Rc::new(State {
            rules,
            metrics: Metrics::define(),
            secret: random_secret(),
            store: None,
        })))
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
        let plan = decide(&self.0, x.request.pairs());
        match apply(plan, &mut Sink::Fused(x)) {
            Ok(()) => Step::Continue,
            Err(reject) => {
                refuse(&reject);
                Step::Stop
            }
        }
    }

    fn data(&mut self, _x: &mut chain::Exchange, _direction: Direction, _end: bool) -> Step {
        Step::Continue
    }

    fn log(&mut self, _x: &mut chain::Exchange) {}
}
