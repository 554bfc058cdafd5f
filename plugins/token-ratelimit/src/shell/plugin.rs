//! What the one driver asks of the plugin itself: its metrics and its own effects ([`Own`]).

use super::state::{State, METRIC_PREFIX};
use crate::core::{Metric as Name, Own};
use llm_gateway_shared::host::stage::Plugin;
use llm_gateway_shared::host::{self, Buffer, HostError, HostResult, Metric, Sink};
use llm_gateway_shared::stage::Core;

/// The metrics (`llm_gateway.ratelimit.<name>`) and token-ratelimit's own effects.
impl<C: Core<Metric = Name, Own = Own>> Plugin<C> for State {
    fn count(&self, name: &Name, delta: u64) {
        if let Some(metric) = self.metric(name, Metric::counter) {
            let _ = metric.increment(i64::try_from(delta).unwrap_or(i64::MAX));
        }
    }

    fn gauge(&self, name: &Name, value: u64) {
        let define = |_: &str| Metric::gauge(&format!("{METRIC_PREFIX}{name}"));
        if let Some(metric) = self.metric(&format!("gauge:{name}"), define) {
            let _ = metric.record(value);
        }
    }

    fn own(&self, own: &Own, sink: &mut Sink) -> HostResult<()> {
        match (own, sink) {
            (Own::Resume, Sink::Host) => host::resume_request(),
            // the stage's own request: its flow (the carrier)
            (Own::Resume, Sink::Fused(_)) => Ok(()),
            (Own::RewriteModel(model), Sink::Host) => rewrite_model(model),
            (Own::RewriteModel(model), Sink::Fused(x)) => {
                if let Some(rewritten) = with_model(&x.data, model) {
                    x.replace_data(rewritten);
                }
                Ok(())
            }
        }
    }
}

/// Rewrites the held request body's `model` (the headers are still held, so
/// `content-length` can follow).
fn rewrite_model(model: &str) -> Result<(), HostError> {
    let body = host::buffer(Buffer::RequestBody, 0, usize::MAX)?;
    match with_model(&body, model) {
        Some(rewritten) => host::replace_request_body(body.len(), &rewritten),
        None => Ok(()), // inspected before; nothing sensible to rewrite
    }
}

/// `body` with its top-level `model` set to `model`; `None` if it is no JSON object.
fn with_model(body: &[u8], model: &str) -> Option<Vec<u8>> {
    use llm_gateway_shared::json::{self, Edits, Limits};
    let object = json::scan_object(body, &Limits::default()).ok()?;
    let mut edits = Edits::new(body, &object);
    edits.set("model", json::quote(model).into_bytes());
    Some(edits.finish())
}
