//! The one driver of the stage protocol ([`crate::stage`]): carries a core's effects out
//! against the host — a separate filter's ([`Sink::Host`]) or the fused filter's exchange
//! ([`Sink::Fused`]) — and hands the refused ones back to the core.

use super::{log, send_reject, HeaderMap, HostResult, Sink};
use crate::stage::{Core, Effect, Flow, Map, Refusal};

/// What a plugin does itself for the driver: its metrics and its own effects.
pub trait Plugin<C: Core + ?Sized> {
    /// Adds `delta` to `metric`.
    fn count(&self, metric: &C::Metric, delta: u64);
    /// Sets gauge `metric` to `value`; a plugin whose core sets no gauge has nothing to do.
    fn gauge(&self, metric: &C::Metric, value: u64) {
        let _ = (metric, value);
    }
    /// Carries out one of the plugin's own effects.
    fn own(&self, effect: &C::Own, sink: &mut Sink<'_>) -> HostResult<()>;
}

/// Carries out every effect `core` has queued, in order; `flow` is what the core answered the
/// callback's input. An effect the host refuses goes back to the core, and a flow other than
/// `Continue` it answers then replaces `flow`. `plugin` names the plugin in refusals' details
/// and carries out what only it knows.
pub fn carry<C: Core>(
    core: &mut C,
    mut flow: Flow,
    sink: &mut Sink<'_>,
    name: &str,
    plugin: &impl Plugin<C>,
) -> Flow {
    while let Some(effect) = core.poll() {
        let effect = match (effect, &mut *sink) {
            // the fused filter takes a new body as it is: no copy per streamed event
            (
                Effect::ReplaceRequestBody { body, .. } | Effect::ReplaceResponseBody { body, .. },
                Sink::Fused(x),
            ) => {
                x.replace_data(body);
                continue;
            }
            (effect, _) => effect,
        };
        if let Err(err) = apply::<C>(&effect, sink, name, plugin) {
            let after = core.failed(effect, err.to_string());
            if after != Flow::Continue {
                flow = after;
            }
        }
    }
    flow
}

type EffectOf<C> = Effect<<C as Core>::Metric, <C as Core>::Refusal, <C as Core>::Own>;

fn apply<C: Core>(
    effect: &EffectOf<C>,
    sink: &mut Sink<'_>,
    name: &str,
    plugin: &impl Plugin<C>,
) -> HostResult<()> {
    match effect {
        Effect::RemoveHeader(map, header) => sink.remove_header(header_map(*map), header),
        Effect::SetHeader(map, header, value) => {
            sink.set_header(header_map(*map), header, value.as_bytes())
        }
        Effect::ReplaceRequestBody { size, body, frame } => {
            sink.replace_request_body(*size, body, *frame)
        }
        Effect::ReplaceResponseBody { size, body } => sink.replace_response_body(*size, body),
        Effect::SetProperty {
            name,
            value,
            shared,
        } => sink.set_property(name, value, *shared),
        Effect::ClearRouteCache => sink.clear_route_cache(),
        Effect::Refuse(refusal) => send_reject(name, &refusal.reject()),
        Effect::Count(metric, delta) => {
            plugin.count(metric, *delta);
            Ok(())
        }
        Effect::Gauge(metric, value) => {
            plugin.gauge(metric, *value);
            Ok(())
        }
        Effect::Log(level, line) => {
            log(*level, line);
            Ok(())
        }
        Effect::Own(own) => plugin.own(own, sink),
    }
}

fn header_map(map: Map) -> HeaderMap {
    match map {
        Map::Request => HeaderMap::RequestHeaders,
        Map::Response => HeaderMap::ResponseHeaders,
    }
}
