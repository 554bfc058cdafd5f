//! The proxy-wasm adapter over [`crate::core`]: copies host data in, and the one driver
//! (`host::stage::carry`) carries the core's effects out, each on the request it addresses.
//! Every host call goes through `llm_gateway_shared::host`; nothing here decides.
//!
//! The Envoy filter needs `allow_on_headers_stop_iteration: true` (headers are held until
//! the end of the body). Redis commands travel by Higress's Redis calls or over HTTP to
//! webdis: only the shared client (`host::redis_client`) knows which.

use crate::core::{Await, Effect, Input, Metric as Name, Own};
use llm_gateway_shared::host::{self, Buffer, HostError, LogLevel, Sink};
use llm_gateway_shared::reject::Reject;
use llm_gateway_shared::stage::{self, Flow};

mod env;
mod fused;
mod head;
mod plugin;
mod request;
mod root;
mod state;
use env::HostEnv;
pub use fused::{Fused, FusedStage};
pub use root::root_context;
use state::{log, State, PLUGIN};

impl State {
    /// Feeds `input` to the core, carries its effects out to `sink` and answers what the core
    /// waits for, in context `effective` (`None`: the root's). `own` is the request whose
    /// callback this is: the flow returned is its (`Pause` unless the core let it go on).
    fn drive(
        &self,
        effective: Option<u32>,
        own: Option<u32>,
        input: Input,
        sink: &mut Sink,
    ) -> Flow {
        self.effective.set(effective);
        let fused = matches!(sink, Sink::Fused(_));
        let mut carrier = Carrier {
            state: self,
            own,
            fused,
            ctx: 0,
            flow: Flow::Pause,
        };
        let mut now = None; // the clock is read once, and only for an input that uses it
        let mut next = Some(input);
        while let Some(input) = next.take() {
            let now = match self.core.borrow().uses_clock(&input) {
                true => *now.get_or_insert_with(|| sink.now_nanos() / 1_000_000),
                false => 0,
            };
            let env = HostEnv::new(self, own, sink);
            self.core.borrow_mut().handle(now, input, &env);
            host::stage::carry(&mut carrier, Flow::Pause, sink, PLUGIN, self);
            let awaited = self.core.borrow_mut().take_await();
            next = awaited.map(|awaited| self.answer(awaited, own, sink));
        }
        carrier.flow
    }

    /// The input that answers what the core waited for.
    fn answer(&self, awaited: Await, own: Option<u32>, sink: &Sink) -> Input {
        match (awaited, sink) {
            (Await::Body { ctx, size }, Sink::Host) => {
                let body = self.at(ctx, || host::buffer(Buffer::RequestBody, 0, size));
                Input::Body { ctx, size, body }
            }
            (Await::Body { ctx, size }, Sink::Fused(x)) => {
                let body = match own == Some(ctx) {
                    true => Ok(x.data.get(..size).unwrap_or(&x.data).to_vec()),
                    false => Err(HostError::NotFound),
                };
                Input::Body { ctx, size, body }
            }
            (Await::Written { ctx }, _) => Input::BodyReplaced {
                ctx,
                result: Ok(()),
            },
        }
    }
}

/// The core as the one driver sees it: each effect is made to act on the request it
/// addresses (the effective context is switched when a Redis reply or a tick decides for a
/// paused request), and the flow of the callback's own request is kept.
struct Carrier<'a> {
    state: &'a State,
    own: Option<u32>,
    fused: bool,
    /// The request the last effect polled addresses.
    ctx: u32,
    flow: Flow,
}

impl stage::Core for Carrier<'_> {
    type Metric = Name;
    type Refusal = Reject;
    type Own = Own;

    fn poll(&mut self) -> Option<Effect> {
        loop {
            let (ctx, effect) = self.state.core.borrow_mut().poll()?;
            self.ctx = ctx;
            let here = self.own == Some(ctx);
            match effect {
                Effect::Count(..) | Effect::Gauge(..) | Effect::Log(..) => return Some(effect),
                Effect::Own(Own::Resume) if here => self.flow = Flow::Continue,
                // the fused filter acts on its own request only; the effective context may
                // have moved to another request since this callback began
                effect if (self.fused && here) || (!self.fused && self.state.enter(ctx)) => {
                    if here && matches!(effect, Effect::Refuse(_)) {
                        self.flow = Flow::Refused;
                    }
                    return Some(effect);
                }
                effect => {
                    if self.fused {
                        // without Redis the core answers every request in its own callbacks
                        let own = self.own.unwrap_or_default();
                        let line = format!("fused: an effect for request {ctx} from request {own}");
                        log(LogLevel::Error, &line);
                    }
                    let gone = HostError::NotFound.to_string();
                    self.state.core.borrow_mut().failed(ctx, effect, gone);
                }
            }
        }
    }

    fn failed(&mut self, effect: Effect, error: String) -> Flow {
        self.state.core.borrow_mut().failed(self.ctx, effect, error);
        Flow::Continue
    }
}
