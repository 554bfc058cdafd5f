//! The one driver of the stage protocol ([`crate::stage`]): carries a core's effects out
//! against the host — a separate filter's ([`Sink::Host`]) or the fused filter's exchange
//! ([`Sink::Fused`]) — and hands the refused ones back to the core.

use super::{log, send_reject, HeaderMap, HostResult, Sink};
use crate::stage::{Core, Effect, Flow, Map, Refusal};

/// Carries out every effect `core` has queued, in order; `flow` is what the core answered the
/// callback's input. An effect the host refuses goes back to the core, and a flow other than
/// `Continue` it answers then replaces `flow`. `count` adds to the plugin's metric.
pub fn carry<C: Core>(
    core: &mut C,
    mut flow: Flow,
    sink: &mut Sink<'_>,
    plugin: &str,
    count: impl Fn(&C::Metric, u64),
) -> Flow {
    while let Some(effect) = core.poll() {
        if let Err(err) = apply(&effect, sink, plugin, &count) {
            let after = core.failed(effect, err.to_string());
            if after != Flow::Continue {
                flow = after;
            }
        }
    }
    flow
}

fn apply<M, R: Refusal>(
    effect: &Effect<M, R>,
    sink: &mut Sink<'_>,
    plugin: &str,
    count: &impl Fn(&M, u64),
) -> HostResult<()> {
    match effect {
        Effect::RemoveHeader(map, name) => sink.remove_header(header_map(*map), name),
        Effect::ReplaceRequestBody { size, body, frame } => {
            sink.replace_request_body(*size, body, *frame)
        }
        Effect::ReplaceResponseBody { size, body } => sink.replace_response_body(*size, body),
        Effect::Refuse(refusal) => send_reject(plugin, &refusal.reject()),
        Effect::Count(metric, delta) => {
            count(metric, *delta);
            Ok(())
        }
        Effect::Log(level, line) => {
            log(*level, line);
            Ok(())
        }
    }
}

fn header_map(map: Map) -> HeaderMap {
    match map {
        Map::Request => HeaderMap::RequestHeaders,
        Map::Response => HeaderMap::ResponseHeaders,
    }
}
