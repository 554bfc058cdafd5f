//! What the one driver (`host::stage::carry`) asks of this plugin: its metrics and its own
//! effects ([`Own`]), on the host or the fused filter's exchange alike.

use crate::core::{Core, Name, Next, Own, Stage, PLUGIN};
use llm_gateway_shared::host::stage::{self, Plugin};
use llm_gateway_shared::host::{self, Buffer, HostResult, Metric, Sink};
use llm_gateway_shared::stage::Flow;
use std::cell::RefCell;

/// What the one driver did with a callback's effects.
pub(super) struct Carried {
    /// The callback's flow.
    pub(super) flow: Flow,
    /// A local reply went out (or was asked for).
    pub(super) replied: bool,
    /// The core ignores the rest of the response body ([`Next::ContinueSkipResponseBody`]).
    pub(super) skip_response_body: bool,
}

/// Carries out the effects the core queued for request `context` on `sink`, `next` being
/// what it answered the callback.
pub(super) fn carry(
    core: &RefCell<Core>,
    context: u32,
    next: Next,
    sink: &mut Sink<'_>,
) -> Carried {
    let mut effects = Stage::new(core, context);
    let flow = stage::carry(&mut effects, next.flow(), sink, PLUGIN, &Router);
    Carried {
        flow,
        replied: effects.replied(),
        skip_response_body: next == Next::ContinueSkipResponseBody && flow == Flow::Continue,
    }
}

/// What the driver asks of this plugin: its metrics (`llm_gateway.model_router.<name>`) and
/// its own effects.
struct Router;

impl Plugin<Stage<'_>> for Router {
    fn count(&self, name: &Name, delta: u64) {
        if let Ok(metric) = Metric::counter(&format!("llm_gateway.model_router.{name}")) {
            let _ = metric.increment(i64::try_from(delta).unwrap_or(i64::MAX));
        }
    }

    fn gauge(&self, name: &Name, value: u64) {
        if let Ok(metric) = Metric::gauge(&format!("llm_gateway.model_router.{name}")) {
            let _ = metric.record(value);
        }
    }

    fn own(&self, effect: &Own, sink: &mut Sink<'_>) -> HostResult<()> {
        match (effect, sink) {
            (Own::SetRequestLength(length), Sink::Host) => host::set_request_length(*length),
            (Own::SetRequestLength(length), Sink::Fused(x)) => {
                // A body framed by content-length gets its final length when the fused filter
                // frames it after every stage's edits (bundle `fused::frame`); only a request
                // without one (a redirect pass: Envoy removed it) is framed here.
                if x.request.get("content-length").is_none() {
                    x.request
                        .set("content-length", length.to_string().as_bytes());
                    x.request.remove("transfer-encoding");
                }
                Ok(())
            }
            (Own::AppendResponseBody { at, bytes }, Sink::Host) => {
                host::set_buffer(Buffer::ResponseBody, *at, 0, bytes)
            }
            (Own::AppendResponseBody { bytes, .. }, Sink::Fused(x)) => {
                let mut data = std::mem::take(&mut x.data);
                data.extend_from_slice(bytes);
                x.replace_data(data);
                Ok(())
            }
            (
                Own::Reply {
                    status,
                    details,
                    headers,
                    body,
                },
                _,
            ) => {
                let headers: Vec<(&str, &str)> = headers
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str()))
                    .collect();
                host::send_local_response(*status, details, &headers, body)
            }
        }
    }
}
