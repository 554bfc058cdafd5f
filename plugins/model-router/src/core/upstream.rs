//! The upstream role (each provider cluster's upstream HTTP filter, once per attempt):
//! rewrites `model` and the credential for the attempt's deployment, frames the body's
//! length, publishes the answering deployment, and marks a response the route retries on the
//! next deployment (`x-llm-fallback`): a status in the group's `retry_on` (429 and 5xx by
//! default) or a provider's context-length 400. A 429 or 503 that says when to come back
//! (`retry-after` & co., [`crate::signals`]) cools the deployment down in shared data.

use super::downstream::{attempt_number, attempt_number_in, FALLBACK_HEADER};
use super::protocol::{
    property_string, Effect, Input, Level, Map, Next, OnFailure, Own, ReadError, View,
};
use super::translation::ResponseTranslation;
use super::{Core, Store};
use crate::body::{is_context_length_error, rewrite_model};
use crate::config::{Deployment, RetryOn, RouterConfig};
use crate::plan::answered_by;
use crate::signals::{is_cooldown_status, reset_after_ms};
use crate::translate::{self, Asked, RequestParams, Wire};
use crate::wire::{wire_name, Service};
use llm_gateway_shared::reject::Reject;
use llm_gateway_shared::request::Endpoint;
use llm_gateway_shared::request::RequestHead;
use llm_gateway_shared::route_info::{
    RouteInfo, ATTEMPT_PROPERTY, PLAN_PROPERTY, PROPERTY as ROUTE_PROPERTY,
};
use llm_gateway_shared::rules::RuleSet;

/// Largest error body the upstream role reads to classify a 400.
pub const MAX_ERROR_BODY: usize = 64 * 1024;

/// One attempt of the upstream role.
pub(super) struct Attempt {
    /// The attempt's deployment (resolved once: [`Core::resolve_deployment`]).
    deployment: Deployment,
    /// Envoy's attempt number (1 for the first try) and the plan's deployment names.
    number: u32,
    plan: String,
    /// A later deployment exists: a context-length 400 may move there.
    has_next: bool,
    /// The request as this attempt's headers came already says `content-length: <n>` and
    /// has no `transfer-encoding` (known from the headers read to strip `x-envoy-*`): an
    /// unchanged body of n bytes needs no framing written.
    framed: Option<usize>,
    /// The response is a 400 held until its body says whether it is a context-length error.
    inspecting: bool,
    /// The deployment speaks another API than the body: the body is translated from the first
    /// into the second, and the response back.
    translation: Option<(Wire, Wire, Asked)>,
    /// The response on its way back into the body's API.
    response: Option<ResponseTranslation>,
}

/// Filter state with the path of the body as the listener's filters passed it on, written by
/// the first attempt that changes `:path` (an upstream filter's header changes persist into
/// the next attempt, its body changes do not: a later attempt reads the body's API here).
pub const BODY_PATH_PROPERTY: &str = "llm_route_body_path";

impl Core {
    pub(super) fn handle_upstream(
        &mut self,
        context: u32,
        input: Input,
        view: &dyn View,
        store: &dyn Store,
    ) -> Next {
        match input {
            Input::RequestHeaders { end_of_stream } => {
                self.attempt_headers(context, end_of_stream, view)
            }
            Input::RequestBody {
                size,
                end_of_stream,
            } => self.attempt_body(context, size, end_of_stream, view),
            Input::ResponseHeaders { end_of_stream } => {
                self.attempt_response(context, end_of_stream, view, store)
            }
            Input::ResponseBody {
                size,
                end_of_stream,
            } => self.attempt_response_body(context, size, end_of_stream, view),
            Input::Log => Next::Continue,
        }
    }

    /// The deployment `name` as the upstream role resolves it: its own document first (the
    /// older form repeats the deployments there), else the listener role's of this VM.
    pub fn resolve_deployment(&self, name: &str) -> Option<Deployment> {
        let find = |rules: &RuleSet<RouterConfig>| {
            rules
                .configs()
                .find_map(|c| c.deployment(name).map(|(_, d)| d.clone()))
        };
        self.rules
            .as_deref()
            .and_then(find)
            .or_else(|| self.listener.try_borrow().ok()?.as_deref().and_then(find))
    }

    /// Removes every `x-envoy-*` request header (Envoy's internals: attempt count, timeouts, a
    /// client's external address...): a provider gets none of them unless its deployment says
    /// `forward_envoy_headers`. Header changes of an upstream filter persist into the next
    /// attempt; Envoy stamps the attempt count again for each one.
    /// Returns the headers it was given (as they were before), if they could be read.
    fn strip_envoy_headers(
        &mut self,
        headers: Result<RequestHead, ReadError>,
    ) -> Option<RequestHead> {
        let on_failure = OnFailure::Log(Level::Error, "cannot remove the x-envoy-* headers");
        match headers {
            Ok(all) => {
                for (name, _) in all.headers() {
                    if name.starts_with(b"x-envoy-") {
                        let name = String::from_utf8_lossy(name).into_owned();
                        self.remove_header(Map::Request, name, on_failure);
                    }
                }
                Some(all)
            }
            Err(_) => {
                self.log(
                    Level::Error,
                    "cannot remove the x-envoy-* headers: cannot read the headers".to_string(),
                );
                None
            }
        }
    }

    /// Drops the request-header removals queued since `from` of headers `read` (the
    /// attempt's headers, read in this callback) does not have: nothing to remove.
    fn skip_absent_removals(&mut self, from: usize, read: &RequestHead) {
        let mut index = 0;
        self.queue.retain(|effect| {
            index += 1;
            match effect {
                (Effect::RemoveHeader(Map::Request, name), _) if index > from => read.has(name),
                _ => true,
            }
        });
    }

    fn attempt_headers(&mut self, context: u32, end_of_stream: bool, view: &dyn View) -> Next {
        if self.rules.is_none() {
            return Next::Continue;
        }
        let Some(plan) = property_string(view, &[PLAN_PROPERTY]) else {
            // not a routed request: no deployment to opt in
            self.strip_envoy_headers(view.request_headers());
            return Next::Continue;
        };
        // One read of the request headers gives the attempt number and the x-envoy-* headers
        // to strip (a header read alone costs the host as much as a small map).
        let headers = view.request_headers();
        let attempt = match &headers {
            Ok(headers) => attempt_number_in(headers, view),
            Err(_) => attempt_number(view),
        };
        // The route's matcher picks the next attempt's slot from this number (a retry re-runs
        // it before Envoy stamps the next count): filter state, because the header is removed.
        self.set_property(
            ATTEMPT_PROPERTY,
            attempt.to_string().into_bytes(),
            OnFailure::Log(Level::Error, "cannot publish the attempt number"),
        );
        // The attempt number, not the cluster, says which deployment this is: two
        // deployments of a group may share a cluster (one provider, two models).
        let name = plan
            .split(',')
            .nth(usize::try_from(attempt - 1).unwrap_or(usize::MAX))
            .unwrap_or_default();
        let Some(deployment) = self.resolve_deployment(name) else {
            // Never forward it unchanged (the group's name as model, no credential): the
            // listener planned a deployment this role cannot resolve.
            self.log(
                Level::Error,
                format!("attempt {attempt}: deployment `{name}` is not configured here; refused"),
            );
            return self.refuse(Reject::internal(format!(
                "the gateway's model router cannot resolve deployment `{name}` for attempt {attempt}"
            )));
        };
        // The body's API: from the path the listener's filters passed on. A later attempt
        // finds that path in filter state if an earlier one changed `:path`.
        let current_path = headers.as_ref().map(|h| h.path.clone()).unwrap_or_default();
        let body_path = if attempt > 1 {
            property_string(view, &[BODY_PATH_PROPERTY])
        } else {
            None
        };
        let endpoint = Endpoint::from_path(body_path.as_deref().unwrap_or(&current_path));
        let translation = match endpoint.and_then(|e| deployment.serves(e)) {
            Some(Service::Translated(from, to)) => Some((from, to, Asked::default())),
            _ => None,
        };
        let new_path = endpoint.and_then(|e| deployment.path(e, &current_path));
        if let Some(new_path) = new_path {
            if body_path.is_none() {
                self.set_property(
                    BODY_PATH_PROPERTY,
                    current_path.into_bytes(),
                    OnFailure::Log(Level::Error, "cannot keep the body's path"),
                );
            }
            self.set_header(
                Map::Request,
                ":path",
                new_path,
                OnFailure::Log(Level::Error, "cannot set the attempt's path"),
            );
        }
        let read = if deployment.forward_envoy_headers {
            None
        } else {
            self.strip_envoy_headers(headers)
        };
        let credential = OnFailure::Log(Level::Error, "cannot set the credential");
        let queued = self.queue.len();
        if self.set_credential(&deployment, view, credential).is_err() {
            self.log(
                Level::Error,
                "cannot set the credential: cannot read anthropic-version".to_string(),
            );
        }
        let framed = read.as_ref().and_then(|read| {
            // the other provider's credential header, when the request has none, is not
            // removed
            self.skip_absent_removals(queued, read);
            framed_length(read)
        });
        let has_next = plan.split(',').count() > usize::try_from(attempt).unwrap_or(usize::MAX);
        self.upstream.insert(
            context,
            Attempt {
                deployment,
                number: attempt,
                plan,
                has_next,
                inspecting: false,
                framed,
                translation,
                response: None,
            },
        );
        if end_of_stream {
            Next::Continue
        } else {
            Next::Pause // hold the headers: the body's length may change
        }
    }

    fn attempt_body(
        &mut self,
        context: u32,
        size: usize,
        end_of_stream: bool,
        view: &dyn View,
    ) -> Next {
        let Some(attempt) = self.upstream.get(&context) else {
            return Next::Continue;
        };
        if !end_of_stream {
            return Next::Pause;
        }
        // The whole body is here and the headers are held: the provider gets the length of
        // what it receives (rewritten or not), never a chunked body.
        if let Some((from, to, _)) = attempt.translation {
            return self.translate_attempt(context, from, to, size, view);
        }
        let rewritten = view
            .request_body(size)
            .ok()
            .and_then(|bytes| rewrite_model(&bytes, &attempt.deployment.model));
        let mut length = size;
        let unchanged = rewritten.is_none() && attempt.framed == Some(size);
        if let Some(body) = rewritten {
            length = body.len();
            self.push(
                Effect::ReplaceRequestBody {
                    size,
                    body,
                    frame: false,
                },
                OnFailure::KeepLength(size),
            );
        }
        if !unchanged {
            self.push(
                Effect::Own(Own::SetRequestLength(length)),
                OnFailure::Log(Level::Error, "cannot set the content-length"),
            );
        }
        Next::Continue
    }

    /// The body of an attempt whose deployment speaks another API (`to`) than the body
    /// (`from`): translated for it. A body that cannot be is refused (400 naming the field),
    /// as the listener role refuses one for its first deployment.
    fn translate_attempt(
        &mut self,
        context: u32,
        from: Wire,
        to: Wire,
        size: usize,
        view: &dyn View,
    ) -> Next {
        let Some(attempt) = self.upstream.get(&context) else {
            return Next::Continue;
        };
        let params = RequestParams {
            model: &attempt.deployment.model,
            default_max_tokens: attempt.deployment.max_tokens,
            max_completion_tokens: attempt.deployment.takes_max_completion_tokens(),
        };
        let translated = match view.request_body(size) {
            Ok(bytes) => translate::request(from, to, &bytes, &params),
            Err(_) => Err(Reject::internal("cannot read the request body")),
        };
        let translated = match translated {
            Ok(translated) => translated,
            Err(reject) => {
                self.upstream.remove(&context);
                return self.refuse(reject);
            }
        };
        if let Some(attempt) = self.upstream.get_mut(&context) {
            attempt.translation = Some((from, to, translated.asked));
        }
        self.count(["translated.", wire_name(from), ".", wire_name(to)].concat());
        let length = translated.body.len();
        self.push(
            Effect::ReplaceRequestBody {
                size,
                body: translated.body,
                frame: false,
            },
            OnFailure::Refuse,
        );
        self.push(
            Effect::Own(Own::SetRequestLength(length)),
            OnFailure::Log(Level::Error, "cannot set the content-length"),
        );
        Next::Continue
    }

    /// Publishes this attempt as the one that answered ([`answered_by`]); a later attempt
    /// that answers publishes itself in turn. Returns the request's model group.
    fn publish_answer(&mut self, context: u32, view: &dyn View) -> Option<String> {
        let attempt = self.upstream.get(&context)?;
        let info = view
            .property(&[ROUTE_PROPERTY])
            .and_then(|bytes| RouteInfo::from_json(&bytes))?;
        let info = answered_by(info, &attempt.deployment, &attempt.plan, attempt.number);
        self.set_property(
            ROUTE_PROPERTY,
            info.to_json(),
            OnFailure::Log(Level::Warn, "cannot publish the answering deployment"),
        );
        Some(info.model_group)
    }

    /// For an error `status` of `deployment` in `group`: whether the group's `retry_on` has
    /// it, and the router's `max_cooldown_ms`; from the configuration that has both the group
    /// and the deployment (this role's document, else the listener's). Neither found: the
    /// defaults.
    fn group_policy(&self, group: Option<&str>, deployment: &str, status: u16) -> (bool, u64) {
        let find = |rules: &RuleSet<RouterConfig>| {
            rules.configs().find_map(|c| {
                c.deployment(deployment)?;
                let g = c.group(group?)?;
                Some((g.retry_on.matches(status), c.max_cooldown_ms))
            })
        };
        self.rules
            .as_deref()
            .and_then(find)
            .or_else(|| self.listener.try_borrow().ok()?.as_deref().and_then(find))
            .unwrap_or((
                RetryOn::default().matches(status),
                crate::config::DEFAULT_MAX_COOLDOWN_MS,
            ))
    }

    fn attempt_response(
        &mut self,
        context: u32,
        end_of_stream: bool,
        view: &dyn View,
        store: &dyn Store,
    ) -> Next {
        let status = view
            .response_header(":status")
            .and_then(|s| std::str::from_utf8(&s).ok()?.parse::<u16>().ok());
        // The first attempt's success changes nothing the route info says: the listener role
        // published it for the plan's first deployment, which attempt 1 is, with attempt 1 as
        // tried. Only a retry's answer or an error is published here, before a listener filter
        // holding the response reads it.
        let first_success = status.is_some_and(|s| s < 400)
            && self.upstream.get(&context).is_some_and(|a| a.number == 1);
        let group = if first_success {
            None
        } else {
            self.publish_answer(context, view)
        };
        let Some(attempt) = self.upstream.get(&context) else {
            return Next::ContinueSkipResponseBody;
        };
        let Some(status) = status.filter(|s| *s >= 400) else {
            // a success: nothing to mark or cool; translated back if the API differs
            return self
                .translate_answer(context, status, end_of_stream, view)
                .unwrap_or(Next::ContinueSkipResponseBody);
        };
        let has_next = attempt.has_next;
        let (retriable, max_cooldown_ms) =
            self.group_policy(group.as_deref(), &attempt.deployment.name, status);
        if is_cooldown_status(status) {
            let name = attempt.deployment.name.clone();
            self.cool_down_on_signal(&name, max_cooldown_ms, view, store);
        }
        if retriable && has_next {
            self.set_header(
                Map::Response,
                FALLBACK_HEADER,
                format!("status_{status}"),
                OnFailure::Log(Level::Error, "cannot mark a retriable status"),
            );
            self.count(format!("status_fallbacks.{status}"));
            return Next::ContinueSkipResponseBody;
        }
        let inspect = status == 400 && has_next && !end_of_stream;
        if inspect {
            // hold the headers until the body tells whether it is a context-length error
            if let Some(attempt) = self.upstream.get_mut(&context) {
                attempt.inspecting = true;
            }
        }
        match self.translate_answer(context, Some(status), end_of_stream, view) {
            Some(flow) if inspect => {
                let _ = flow; // the error body is held either way
                Next::Pause
            }
            Some(flow) => flow,
            None if inspect => Next::Pause,
            None => Next::ContinueSkipResponseBody,
        }
    }

    /// Starts translating the response of an attempt whose deployment speaks another API than
    /// the body, back into the body's; `None` when there is nothing to translate.
    fn translate_answer(
        &mut self,
        context: u32,
        status: Option<u16>,
        end_of_stream: bool,
        view: &dyn View,
    ) -> Option<Next> {
        let (from, to, asked) = self.upstream.get(&context)?.translation?;
        let created = view.now_nanos() / 1_000_000_000;
        let mut tr = ResponseTranslation::new(to, from, asked, created);
        let flow = self.translate_response_headers(&mut tr, status, end_of_stream, view);
        if !tr.active() {
            return None;
        }
        if let Some(attempt) = self.upstream.get_mut(&context) {
            attempt.response = Some(tr);
        }
        Some(flow)
    }

    /// Reads the response's reset signals and cools deployment `name` down for that long.
    pub(super) fn cool_down_on_signal(
        &mut self,
        name: &str,
        max_cooldown_ms: u64,
        view: &dyn View,
        store: &dyn Store,
    ) {
        let now = view.now_nanos() / 1_000_000;
        let header = |h: &str| {
            view.response_header(h)
                .and_then(|v| String::from_utf8(v).ok())
        };
        if let Some(ms) = reset_after_ms(&header, now) {
            self.cool_down(max_cooldown_ms, name, ms, now, store);
        }
    }

    fn attempt_response_body(
        &mut self,
        context: u32,
        size: usize,
        end_of_stream: bool,
        view: &dyn View,
    ) -> Next {
        let Some(attempt) = self.upstream.get_mut(&context) else {
            return Next::ContinueSkipResponseBody;
        };
        if attempt.inspecting {
            if !end_of_stream && size < MAX_ERROR_BODY {
                return Next::Pause;
            }
            attempt.inspecting = false;
            let body = view
                .response_body(size.min(MAX_ERROR_BODY))
                .unwrap_or_default();
            if is_context_length_error(&body) {
                // the next deployment takes the request: this answer is never translated
                attempt.response = None;
                self.set_header(
                    Map::Response,
                    FALLBACK_HEADER,
                    "context_length_exceeded",
                    OnFailure::Log(Level::Error, "cannot mark a context-length error"),
                );
                self.count("context_length_fallbacks");
            }
        }
        let Some(mut tr) = self
            .upstream
            .get_mut(&context)
            .and_then(|a| a.response.take())
        else {
            return Next::ContinueSkipResponseBody;
        };
        let flow = self.translate_response_body(&mut tr, size, end_of_stream, view);
        if let Some(attempt) = self.upstream.get_mut(&context) {
            attempt.response = Some(tr);
        }
        flow
    }
}

/// The `content-length` of request headers `read` that frame their body by it alone (no
/// `transfer-encoding`), as a number; `None` otherwise.
fn framed_length(read: &RequestHead) -> Option<usize> {
    if read.has("transfer-encoding") {
        return None;
    }
    let text = std::str::from_utf8(read.get("content-length")?).ok()?;
    // only the digits `set_request_length` would write: then writing them changes nothing
    let canonical = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text.len() == 1 || !text.starts_with('0'));
    if !canonical {
        return None;
    }
    text.parse().ok()
}
