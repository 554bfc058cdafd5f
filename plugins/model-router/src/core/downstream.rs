//! The downstream role (the listener's HTTP filter): plans, rewrites `model` and the
//! credential for the first choice, publishes the plan in filter state (`llm_try_<k>` = the
//! cluster of attempt k+1, read by the route's matcher cluster specifier; `llm_route_plan` =
//! the deployments; `llm_route` = the route info), bounds the retries (`x-envoy-max-retries`),
//! clears the route cache; for a group with `budget_fallback` also publishes the fallback
//! group's plan ([`crate::budget_fallback`]); on the response follows a budget switch if
//! token-ratelimit made one, adds `x-llm-*` headers, records the attempts in their breakers
//! and guards streams.
//!
//! Breaker outcomes are recorded when the response headers arrive: every attempt before the
//! last one was retried, so it failed; the last one's status decides. (Envoy 1.40 calls no
//! upstream-filter callback for an attempt whose connection failed, so the upstream role could
//! not see those.) With the redirect fallback each pass records its own attempt at `on_log`.

use super::breakers::admit_without_probe;
use super::protocol::{
    header_string, property_string, select, Effect, Input, Level, Map, Next, OnFailure, Own,
    ReadError, View,
};
use super::translation::ResponseTranslation;
use super::{Core, Store};
use crate::body::{is_routed_path, Body};
use crate::breaker::is_failure;
use crate::budget_fallback::{alternative, plan_alternative, switched_plan};
use crate::config::{Deployment, Provider, RouterConfig};
use crate::models::{self, Listing};
use crate::plan::{plan, route_info, Admission, Plan, Request as PlanRequest};
use crate::redirect::{Client, Continuation, Fallback};
use crate::signals::is_cooldown_status;
use crate::stream::{interrupted_event, StreamWatcher};
use crate::translate::{self, Asked, RequestParams, Wire};
use crate::wire::{endpoint_wire, wire_endpoint, wire_name, Service, CREDENTIAL_HEADERS};
use llm_gateway_shared::headers;
use llm_gateway_shared::reject::{ErrorType, Reject};
use llm_gateway_shared::request::{Api, Endpoint, RequestHead};
use llm_gateway_shared::route_info::{
    try_property, RouteInfo, ATTEMPT_PROPERTY, BUDGET_FALLBACK_HEADER, BUDGET_FALLBACK_PROPERTY,
    BUDGET_FALLBACK_TAKEN, MAX_RETRIES_HEADER, PLAN_PROPERTY, PROPERTY as ROUTE_PROPERTY,
};
use llm_gateway_shared::rules::RuleSet;
use std::rc::Rc;

/// Response headers.
pub const ATTEMPTS: &str = "x-llm-attempts";
/// The route version the request was routed by.
pub const ROUTE_VERSION: &str = "x-llm-route-version";
/// Envoy's attempt counter (route's virtual host: `include_request_attempt_count: true`).
pub const ATTEMPT_COUNT: &str = "x-envoy-attempt-count";
/// Set by the upstream role on a provider's context-length error; the route retries on it
/// (`retry_on: retriable-headers`), the downstream role removes it before the client.
pub const FALLBACK_HEADER: &str = "x-llm-fallback";
/// The header naming the Anthropic API version, and the value sent when the client sent none.
pub const ANTHROPIC_VERSION: &str = "anthropic-version";
/// Sent when an Anthropic deployment gets a request without `anthropic-version`.
pub const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";
/// Anthropic's request headers, which another provider does not get.
pub const ANTHROPIC_HEADERS: [&str; 2] = [ANTHROPIC_VERSION, "anthropic-beta"];
/// Response header listing the request fields a translation dropped (no counterpart in the
/// deployment's API), comma-separated.
pub const DROPPED_HEADER: &str = "x-llm-translation-dropped";
/// On the gateway's own answer to `/v1/messages/count_tokens`: `estimated`.
pub const COUNT_HEADER: &str = "x-llm-token-count";

/// A request of the downstream role.
#[derive(Default)]
pub(super) struct Exchange {
    /// `:path`, kept from the headers when it is one the router handles.
    path: Option<String>,
    pub(super) routed: Option<Routed>,
    watcher: Option<StreamWatcher>,
    /// The response on its way into the client's API.
    response: Option<ResponseTranslation>,
}

pub(super) struct Routed {
    /// Position of the selected config in `rules.configs()`.
    config_index: usize,
    /// The plan: the group and its deployments in attempt order (after a budget switch, the
    /// fallback group's, read back on the response).
    group: String,
    deployments: Vec<usize>,
    /// An alternative was published in `llm_route_budget_fallback`: a later filter may switch.
    alternative_published: bool,
    /// The group a budget switched the request to (seen on the response).
    switched_to: Option<String>,
    request_id: String,
    /// The client speaks Anthropic Messages (`/v1/messages`): its error event is Anthropic's.
    anthropic_api: bool,
    /// The rules the request was routed by (a reconfiguration does not change them).
    rules: Rc<RuleSet<RouterConfig>>,
    /// `"fallback": "redirect"`: the attempt this pass makes (1 on the first pass); the
    /// attempt number does not come from Envoy's retries then.
    pass: Option<Pass>,
    /// The client speaks another API than the body the later filters see: the response is
    /// translated back.
    translation: Option<Translation>,
}

/// A request whose client speaks another API than the body this filter passes on.
pub(super) struct Translation {
    /// The client's API.
    client: Wire,
    /// The body's (the first attempt's deployment's, or this redirect pass's).
    body: Wire,
    /// What the client asked for.
    asked: Asked,
    /// Request fields without a counterpart that were dropped.
    dropped: Vec<String>,
    /// When the request was routed (Unix seconds): `created` of a translated Chat answer.
    created: u64,
}

/// A pass of the redirect fallback.
struct Pass {
    attempt: u32,
    /// The response status this pass saw, for the breaker at `on_log`.
    status: Option<u16>,
}

/// Envoy's number of the current attempt (1 for the first try): its `x-envoy-attempt-count`
/// while the request still has it, else the number the upstream role mirrored into filter
/// state (`llm_attempt`) before removing the header for the provider.
pub fn attempt_number(view: &dyn View) -> u32 {
    header_string(view, ATTEMPT_COUNT)
        .or_else(|| property_string(view, &[ATTEMPT_PROPERTY]))
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(1)
        .max(1)
}

/// [`attempt_number`] with the request's headers already read (`headers`: every pair).
pub fn attempt_number_in(headers: &RequestHead, view: &dyn View) -> u32 {
    headers
        .headers()
        .find(|(name, _)| name.eq_ignore_ascii_case(ATTEMPT_COUNT.as_bytes()))
        .and_then(|(_, value)| String::from_utf8(value.to_vec()).ok())
        .or_else(|| property_string(view, &[ATTEMPT_PROPERTY]))
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(1)
        .max(1)
}

/// True if Envoy's router made this response: the upstream's answer (`via_upstream`) or the
/// router's own reply when the attempts failed (`upstream_reset_before_response_started{…}`,
/// `upstream_per_try_timeout`, …). A filter's local reply has its own details
/// (`<plugin>.<code>`). A host that does not say counts as the router.
pub fn answered_by_router(view: &dyn View) -> bool {
    match property_string(view, &["response", "code_details"]) {
        Some(details) => details == "via_upstream" || details.starts_with("upstream_"),
        None => true,
    }
}

impl Core {
    pub(super) fn handle_downstream(
        &mut self,
        context: u32,
        input: Input,
        view: &dyn View,
        store: &dyn Store,
    ) -> Next {
        match input {
            Input::RequestHeaders { end_of_stream } => {
                self.request_headers(context, end_of_stream, view)
            }
            Input::RequestBody {
                size,
                end_of_stream,
            } => self.request_body(context, size, end_of_stream, view, store),
            Input::ResponseHeaders { end_of_stream } => {
                self.response_headers(context, end_of_stream, view, store)
            }
            Input::ResponseBody {
                size,
                end_of_stream,
            } => self.response_body(context, size, end_of_stream, view),
            Input::Log => {
                self.done(context, view, store);
                Next::Continue
            }
        }
    }

    fn request_headers(&mut self, context: u32, end_of_stream: bool, view: &dyn View) -> Next {
        let path = header_string(view, ":path").unwrap_or_default();
        let method = header_string(view, ":method").unwrap_or_default();
        if let Some(listing) = models::listing(&method, &path) {
            return self.answer_models(&listing, view);
        }
        let Some(rules) = self.rules.clone() else {
            return Next::Continue;
        };
        if !is_routed_path(&path) || select(&rules, view).is_none() {
            return Next::Continue;
        }
        self.downstream.entry(context).or_default().path = Some(path);
        if end_of_stream {
            return self.refuse(Reject::bad_request(
                "invalid_request_body",
                "the request needs a JSON body with a `model`",
            ));
        }
        // Hold the headers until the body decides the route (Envoy:
        // `allow_on_headers_stop_iteration: true` keeps body callbacks coming).
        Next::Pause
    }

    /// Answers `GET /v1/models[/{id}]` itself ([`models::answer`]): no provider, no later
    /// filter sees it.
    fn answer_models(&mut self, listing: &Listing, view: &dyn View) -> Next {
        let Some(rules) = self.rules.clone() else {
            return Next::Continue;
        };
        let Some((_, config)) = select(&rules, view) else {
            return Next::Continue;
        };
        let allowed = header_string(view, headers::GROUPS);
        match models::answer(config, listing, allowed.as_deref(), self.configured_at) {
            Ok(body) => {
                self.count("models_answered");
                self.push(
                    Effect::Own(Own::Reply {
                        status: 200,
                        details: "model_router.models".to_string(),
                        headers: vec![("content-type".to_string(), "application/json".to_string())],
                        body,
                    }),
                    OnFailure::Log(Level::Error, "cannot send the model list"),
                );
                Next::Pause
            }
            Err(reject) => self.refuse(reject),
        }
    }

    /// Answers `POST /v1/messages/count_tokens` for a group with no Anthropic deployment to
    /// ask: the gateway's own estimate of the prompt (`ceil(chars / 4)` per text plus the
    /// chat format's per-message overhead, as token-ratelimit counts it), labelled
    /// `x-llm-token-count: estimated`. Like the model list, no later filter sees it.
    fn answer_count_tokens(&mut self, bytes: &[u8]) {
        let tokens = serde_json::from_slice::<serde_json::Value>(bytes)
            .map(|body| {
                llm_gateway_shared::tokens::estimate_prompt_tokens(
                    Api::AnthropicMessages,
                    &body,
                    llm_gateway_shared::tokens::Encoding::Chars,
                )
            })
            .unwrap_or(0);
        let mut body = String::from("{\"input_tokens\":");
        llm_gateway_shared::json::push_u64(&mut body, tokens);
        body.push('}');
        self.count("count_tokens_estimated");
        self.push(
            Effect::Own(Own::Reply {
                status: 200,
                details: "model_router.count_tokens_estimated".to_string(),
                headers: vec![
                    ("content-type".to_string(), "application/json".to_string()),
                    (COUNT_HEADER.to_string(), "estimated".to_string()),
                ],
                body: body.into_bytes(),
            }),
            OnFailure::Log(Level::Error, "cannot send the token count"),
        );
    }

    fn request_body(
        &mut self,
        context: u32,
        size: usize,
        end_of_stream: bool,
        view: &dyn View,
        store: &dyn Store,
    ) -> Next {
        let Some(exchange) = self.downstream.get(&context) else {
            return Next::Continue;
        };
        if exchange.path.is_none() || exchange.routed.is_some() {
            return Next::Continue;
        }
        if !end_of_stream {
            return Next::Pause;
        }
        match self.route(context, size, view, store) {
            Ok(flow) => flow,
            Err(reject) => self.refuse_routing(reject),
        }
    }

    /// Refuses a request the router could not route (a 5xx is logged: it is the gateway's).
    pub(super) fn refuse_routing(&mut self, reject: Reject) -> Next {
        if reject.status >= 500 {
            self.log(Level::Warn, format!("refused: {}", reject.code));
        }
        self.refuse(reject)
    }

    /// Replaces the provider credential headers with the deployment's, and the
    /// provider-specific headers: `anthropic-version` for an Anthropic deployment (when the
    /// client sent none); for another provider, Anthropic's headers a client sent are removed.
    /// A header the request does not have is not removed (the map is read once per callback).
    pub(super) fn set_credential(
        &mut self,
        deployment: &Deployment,
        view: &dyn View,
        on_failure: OnFailure,
    ) -> Result<(), ReadError> {
        let own = deployment
            .credential
            .as_ref()
            .map(|_| deployment.credential_header());
        // The header set below replaces every value the client sent (the host's replace is a
        // remove and an add): only the others are removed, and only when present.
        for header in CREDENTIAL_HEADERS {
            if Some(header) != own && view.request_header(header)?.is_some() {
                self.remove_header(Map::Request, header, on_failure);
            }
        }
        if deployment.provider == Provider::Anthropic {
            // Anthropic refuses a request without its API version; most SDKs send one
            if view.request_header(ANTHROPIC_VERSION)?.is_none() {
                self.set_header(
                    Map::Request,
                    ANTHROPIC_VERSION,
                    DEFAULT_ANTHROPIC_VERSION,
                    on_failure,
                );
            }
        } else {
            for header in ANTHROPIC_HEADERS {
                if view.request_header(header)?.is_some() {
                    self.remove_header(Map::Request, header, on_failure);
                }
            }
        }
        if let (Some(header), Some(credential)) = (own, &deployment.credential) {
            self.set_header(
                Map::Request,
                header,
                deployment.credential_value(credential),
                on_failure,
            );
        }
        Ok(())
    }

    /// Plans the request and queues its writes, each of which refuses the request if it fails.
    fn route(
        &mut self,
        context: u32,
        size: usize,
        view: &dyn View,
        store: &dyn Store,
    ) -> Result<Next, Reject> {
        let Some(rules) = self.rules.clone() else {
            return Err(Reject::internal("model-router is not configured"));
        };
        let Some((config_index, config)) = select(&rules, view) else {
            return Ok(Next::Continue);
        };
        let bytes = view
            .request_body(size)
            .map_err(|_| Reject::internal("cannot read the request body"))?;
        let body = Body::parse(&bytes)?;
        let redirect = config.fallback == Fallback::Redirect;
        if redirect && header_string(view, headers::REENTRY).is_some() {
            if let Some(continuation) = view
                .request_header(headers::ROUTE_NEXT)
                .ok()
                .flatten()
                .and_then(|v| Continuation::parse(&v))
            {
                return self
                    .reroute(
                        context,
                        (&rules, config_index, config),
                        size,
                        &body,
                        continuation,
                        view,
                    )
                    .map(|()| Next::Continue);
            }
        }
        let path = self
            .downstream
            .get(&context)
            .and_then(|e| e.path.clone())
            .unwrap_or_default();
        let allowed = header_string(view, headers::GROUPS);
        let subject = header_string(view, "x-user-id")
            .filter(|s| !s.is_empty())
            .or_else(|| header_string(view, headers::CONSUMER));
        let endpoint = Endpoint::from_path(&path);
        let request = PlanRequest {
            model: &body.model,
            allowed_groups: allowed.as_deref(),
            subject: subject.as_deref(),
            estimated_tokens: body.estimated_tokens(),
            endpoint,
        };
        // one clock read for the breakers (ms) and the request id (ns)
        let now_nanos = view.now_nanos();
        let now = now_nanos / 1_000_000;
        let planned = plan(config, &request, |index| {
            match config.deployments.get(index) {
                Some(deployment) => self.admit(config, deployment, now, store),
                None => Admission::Skip(0),
            }
        });
        let plan = match planned {
            Err(reject)
                if endpoint == Some(Endpoint::CountTokens)
                    && reject.code == crate::plan::UNSUPPORTED_ENDPOINT =>
            {
                // no Anthropic deployment to count: the gateway's own estimate
                self.answer_count_tokens(&bytes);
                return Ok(Next::Pause);
            }
            planned => planned?,
        };
        let first = plan
            .deployments
            .first()
            .and_then(|i| config.deployments.get(*i))
            .ok_or_else(|| Reject::internal("empty plan"))?;

        let must = OnFailure::Refuse;
        let internal = |_| Reject::internal("cannot route the request");
        // The first attempt's deployment decides the API the body goes on in: the filters
        // after this one read that, and each later attempt's upstream role translates from it.
        let (rewritten, translation) = match endpoint.and_then(|e| first.serves(e)) {
            Some(Service::Translated(from, to)) => {
                let translated =
                    translate::request(from, to, &bytes, &request_params(config, first))?;
                self.count(["translated.", wire_name(from), ".", wire_name(to)].concat());
                let translation = Translation {
                    client: from,
                    body: to,
                    asked: translated.asked,
                    dropped: translated.dropped,
                    created: now_nanos / 1_000_000_000,
                };
                (translated.body, Some(translation))
            }
            _ => (body.with_model(&first.model), None),
        };
        if let Some(endpoint) = endpoint {
            if let Some(new_path) = first.path(endpoint, &path) {
                if redirect {
                    // where Higress's redirect finds the client's path again (it re-sends the
                    // client's body): crate::redirect::ORIGINAL_PATH_HEADER
                    self.set_header(
                        Map::Request,
                        crate::redirect::ORIGINAL_PATH_HEADER,
                        path.as_str(),
                        must,
                    );
                }
                self.set_header(Map::Request, ":path", new_path, must);
            }
        }
        let length = rewritten.len();
        // Read before the body is written (one header map per callback, no read of its own):
        // the writes are carried out after this callback's reads.
        let framed = view
            .request_header("content-length")
            .map_err(|_| Reject::internal("cannot read the request headers"))?
            .is_some();
        self.push(
            Effect::ReplaceRequestBody {
                size,
                body: rewritten,
                frame: false,
            },
            must,
        );
        // A body sent with `content-length` keeps it true. On a redirect host no upstream role
        // frames the body: the provider gets the length of what it receives, whatever the
        // client sent (the later filters keep it true).
        if framed || redirect {
            self.push(Effect::Own(Own::SetRequestLength(length)), must);
        }
        if plan.deployments.len() == 1 || redirect {
            self.set_credential(first, view, must).map_err(internal)?;
        } else {
            // Several deployments: each attempt's credential is the upstream role's job. Were
            // it set here, a cluster without the upstream filter would forward the first
            // provider's key to the second provider; this way it gets none (a 401 that shows
            // the misconfiguration).
            for header in CREDENTIAL_HEADERS {
                if view.request_header(header).map_err(internal)?.is_some() {
                    self.remove_header(Map::Request, header, must);
                }
            }
        }
        // never the client's: see crate::ids
        let request_id = self.ids.next_id(now_nanos);
        let request_headers = [
            (headers::MODEL_GROUP, plan.group.as_str()),
            (headers::DEPLOYMENT, first.name.as_str()),
            (headers::CLUSTER, first.cluster.as_str()),
            (headers::REQUEST_ID, request_id.as_str()),
        ];
        for (name, value) in request_headers {
            self.set_header(Map::Request, name, value, must);
        }
        let names: Vec<&str> = plan
            .deployments
            .iter()
            .filter_map(|i| config.deployments.get(*i))
            .map(|d| d.name.as_str())
            .collect();
        if redirect {
            let client = match &translation {
                Some(t) => Some(Client {
                    wire: t.client,
                    asked: t.asked,
                }),
                None => client_of(endpoint, &body),
            };
            self.publish_continuation(1, &plan.group, &request_id, &names, client);
        } else {
            // the slot of the first resolution; each attempt's upstream role writes its own
            // number
            self.set_property(ATTEMPT_PROPERTY, b"0".to_vec(), must);
            self.set_header(
                Map::Request,
                MAX_RETRIES_HEADER,
                plan.deployments.len().saturating_sub(1).to_string(),
                must,
            );
            for (slot, index) in plan.deployments.iter().enumerate() {
                if let Some(deployment) = config.deployments.get(*index) {
                    self.set_property(
                        try_property(slot),
                        deployment.cluster.as_bytes().to_vec(),
                        must,
                    );
                }
            }
            self.set_property(PLAN_PROPERTY, names.join(",").into_bytes(), must);
        }
        // Attempt 1 goes to `first`: published as tried already, so a first attempt's answer
        // finds the route info final (neither role writes it again).
        let info = route_info(
            config,
            &plan.group,
            &plan.deployments,
            first,
            &request_id,
            1,
            vec![first.name.clone()],
        );
        let info = with_client_api(info, translation.as_ref());
        self.set_property(ROUTE_PROPERTY, info.to_json(), must);
        let alternative_published =
            self.publish_alternative(config, &request, &plan.group, &request_id, now, store);
        self.push(Effect::ClearRouteCache, must);
        self.count(["version.", config.version.as_str(), ".requests"].concat());
        let routed = Routed {
            group: plan.group,
            deployments: plan.deployments,
            alternative_published,
            request_id,
            pass: redirect.then_some(Pass {
                attempt: 1,
                status: None,
            }),
            translation,
            ..routed_base(&rules, config_index, endpoint)
        };
        self.downstream.entry(context).or_default().routed = Some(routed);
        Ok(Next::Continue)
    }

    /// A pass that re-enters the chain (redirect fallback): attempt `continuation.attempt` of
    /// the plan the first pass made, with that deployment's model and credential, the same
    /// logical request id, and the continuation for the pass after it.
    fn reroute(
        &mut self,
        context: u32,
        (rules, config_index, config): (&Rc<RuleSet<RouterConfig>>, usize, &RouterConfig),
        size: usize,
        body: &Body,
        continuation: Continuation,
        view: &dyn View,
    ) -> Result<(), Reject> {
        let lost = || {
            Reject::new(
                503,
                ErrorType::Api,
                "fallback_unavailable",
                "the deployments planned for this request are no longer configured",
            )
        };
        let deployments: Vec<usize> = continuation
            .plan
            .iter()
            .map(|name| config.deployment(name).map(|(index, _)| index))
            .collect::<Option<_>>()
            .ok_or_else(lost)?;
        let chosen = continuation
            .deployment()
            .and_then(|name| config.deployment(name))
            .map(|(_, d)| d)
            .ok_or_else(lost)?;
        let attempt = continuation.attempt;
        let must = OnFailure::Refuse;
        // This pass's body is in the API its path says: the client's (Higress's
        // `use_original_request_body`, at the client's path that `use_original_request_uri`
        // takes from the first pass's `x-envoy-original-path`; or no earlier pass
        // translated), or the one the pass before translated it into (upstream Envoy re-sends
        // the edited body to the edited path). The client's API and asks travel in the
        // continuation.
        let path = self
            .downstream
            .get(&context)
            .and_then(|e| e.path.clone())
            .unwrap_or_default();
        let endpoint = Endpoint::from_path(&path);
        let client = continuation.client.or_else(|| client_of(endpoint, body));
        let (rewritten, translation) = match endpoint.and_then(|e| chosen.serves(e)) {
            Some(Service::Translated(from, to)) => {
                let translated =
                    translate::request(from, to, body.bytes(), &request_params(config, chosen))?;
                self.count(["translated.", wire_name(from), ".", wire_name(to)].concat());
                let mut bytes = translated.body;
                if let Some(client) = client.filter(|c| c.wire == Wire::Chat && to == Wire::Chat) {
                    // back in the client's API: usage chunks only if it asked for them
                    bytes = crate::body::with_include_usage(&bytes, client.asked.include_usage);
                }
                (bytes, Some(translated.dropped))
            }
            _ => (body.with_model(&chosen.model), None),
        };
        let translation = match (client, translation) {
            (Some(client), dropped) if client.wire != chosen.wire() => Some(Translation {
                client: client.wire,
                body: chosen.wire(),
                asked: client.asked,
                dropped: dropped.unwrap_or_default(),
                created: view.now_nanos() / 1_000_000_000,
            }),
            _ => None,
        };
        if let Some(endpoint) = endpoint {
            if let Some(new_path) = chosen.path(endpoint, &path) {
                self.set_header(Map::Request, ":path", new_path, must);
            }
        }
        let length = rewritten.len();
        self.push(
            Effect::ReplaceRequestBody {
                size,
                body: rewritten,
                frame: false,
            },
            must,
        );
        // upstream Envoy's redirect removed content-length; no upstream role frames the body
        self.push(Effect::Own(Own::SetRequestLength(length)), must);
        self.set_credential(chosen, view, must)
            .map_err(|_| Reject::internal("cannot route the request"))?;
        self.remove_header(Map::Request, headers::ROUTE_NEXT, must);
        let request_headers = [
            (headers::MODEL_GROUP, continuation.group.as_str()),
            (headers::DEPLOYMENT, chosen.name.as_str()),
            (headers::CLUSTER, chosen.cluster.as_str()),
            (headers::REQUEST_ID, continuation.request_id.as_str()),
        ];
        for (name, value) in request_headers {
            self.set_header(Map::Request, name, value, must);
        }
        let names: Vec<&str> = continuation.plan.iter().map(String::as_str).collect();
        self.publish_continuation(
            attempt,
            &continuation.group,
            &continuation.request_id,
            &names,
            client,
        );
        let tried = names
            .iter()
            .take(usize::try_from(attempt).unwrap_or(usize::MAX))
            .map(|n| n.to_string())
            .collect();
        let info = route_info(
            config,
            &continuation.group,
            &deployments,
            chosen,
            &continuation.request_id,
            attempt,
            tried,
        );
        let info = with_client_api(info, translation.as_ref());
        self.set_property(ROUTE_PROPERTY, info.to_json(), must);
        self.push(Effect::ClearRouteCache, must);
        self.count("fallbacks");
        self.log(
            Level::Info,
            format!(
                "fallback: attempt {attempt} of group {} to deployment {}",
                continuation.group, chosen.name
            ),
        );
        let routed = Routed {
            group: continuation.group,
            deployments,
            request_id: continuation.request_id,
            pass: Some(Pass {
                attempt,
                status: None,
            }),
            translation,
            ..routed_base(
                rules,
                config_index,
                client.map(|c| wire_endpoint(c.wire)).or(endpoint),
            )
        };
        self.downstream.entry(context).or_default().routed = Some(routed);
        Ok(())
    }

    /// Writes the continuation of the pass after attempt `attempt` (`wasm.llm_route_next`),
    /// when the plan has a later deployment. Without it the redirect policy does not fire, and
    /// the error of the last deployment goes to the client.
    fn publish_continuation(
        &mut self,
        attempt: u32,
        group: &str,
        request_id: &str,
        names: &[&str],
        client: Option<Client>,
    ) {
        if let Some(mut next) = Continuation::after(attempt, group, request_id, names) {
            next.client = client;
            self.set_property(
                crate::redirect::PROPERTY,
                next.encode().into_bytes(),
                OnFailure::Refuse,
            );
        }
    }

    /// Plans the group's budget fallback, if it has one, and queues its publication for
    /// token-ratelimit (`llm_route_budget_fallback`). True if queued. Failing to publish only
    /// loses the fallback (logged; no switch can then happen, and the budget refuses as
    /// usual): the request goes on.
    fn publish_alternative(
        &mut self,
        config: &RouterConfig,
        request: &PlanRequest<'_>,
        group: &str,
        request_id: &str,
        now: u64,
        store: &dyn Store,
    ) -> bool {
        if config.budget_fallback(group).is_none() {
            return false;
        }
        let planned = plan_alternative(config, request, group, |index| {
            match config.deployments.get(index) {
                Some(deployment) => admit_without_probe(config, deployment, now, store),
                None => Admission::Skip(0),
            }
        });
        let Some(alt) = planned.and_then(|p| alternative(config, &p, request_id)) else {
            return false;
        };
        self.set_property(
            BUDGET_FALLBACK_PROPERTY,
            alt.to_json(),
            OnFailure::Log(Level::Error, "cannot publish the budget fallback"),
        );
        true
    }

    fn response_headers(
        &mut self,
        context: u32,
        end_of_stream: bool,
        view: &dyn View,
        store: &dyn Store,
    ) -> Next {
        let Some(mut routed) = self
            .downstream
            .get_mut(&context)
            .and_then(|e| e.routed.take())
        else {
            return Next::ContinueSkipResponseBody;
        };
        let rules = Rc::clone(&routed.rules);
        let flow = match rules.configs().nth(routed.config_index) {
            Some(config) => self.answer(&mut routed, config, view, store),
            None => None,
        };
        let status = flow.flatten();
        // The client speaks another API than the answer's: translated back, unless a filter
        // of this gateway answered itself (its reply is the gateway's, not a provider's).
        let mut translation = routed
            .translation
            .as_ref()
            .filter(|_| {
                // only an error can be a gateway filter's own reply (none answers a routed
                // request with a success): a success needs no property read to tell
                flow.is_some() && (status.is_some_and(|s| s < 400) || answered_by_router(view))
            })
            .map(|t| {
                if !t.dropped.is_empty() {
                    self.set_header(
                        Map::Response,
                        DROPPED_HEADER,
                        t.dropped.join(","),
                        OnFailure::Log(Level::Warn, "cannot change a response header"),
                    );
                }
                ResponseTranslation::new(t.body, t.client, t.asked, t.created)
            });
        let Some(exchange) = self.downstream.get_mut(&context) else {
            return Next::ContinueSkipResponseBody;
        };
        exchange.routed = Some(routed);
        if let Some(mut tr) = translation.take() {
            let flow = self.translate_response_headers(&mut tr, status, end_of_stream, view);
            if flow == Next::Continue && !tr.active() {
                return Next::ContinueSkipResponseBody;
            }
            if let Some(exchange) = self.downstream.get_mut(&context) {
                exchange.response = Some(tr);
            }
            return flow;
        }
        match flow {
            Some(status) if self.watch_stream(context, status, view) => Next::Continue,
            _ => Next::ContinueSkipResponseBody,
        }
    }

    /// The response of a routed request: follows a budget switch, adds the `x-llm-*` headers,
    /// publishes the final route info, feeds the breakers. The response status, for the
    /// stream guard.
    fn answer(
        &mut self,
        routed: &mut Routed,
        config: &RouterConfig,
        view: &dyn View,
        store: &dyn Store,
    ) -> Option<Option<u16>> {
        if routed.alternative_published && routed.switched_to.is_none() {
            // From here on (breakers, headers, route info, `tried`) the switched plan is
            // the one the attempts followed.
            if let Some((taken, switched)) = self.read_switch(config, view) {
                routed.group = switched.group;
                routed.deployments = switched.deployments;
                routed.switched_to = Some(taken);
                self.count("budget_fallbacks");
            }
        }
        let attempts = routed
            .pass
            .as_ref()
            .map_or_else(|| attempt_number(view), |p| p.attempt);
        let index = usize::try_from(attempts - 1).unwrap_or(0);
        let served = routed
            .deployments
            .get(index)
            .or(routed.deployments.last())
            .and_then(|i| config.deployments.get(*i));
        let status = view
            .response_header(":status")
            .and_then(|s| String::from_utf8(s).ok())
            .and_then(|s| s.parse::<u16>().ok());
        let note = OnFailure::Log(Level::Warn, "cannot change a response header");
        self.remove_header(Map::Response, FALLBACK_HEADER, note);
        self.set_header(
            Map::Response,
            headers::MODEL_GROUP,
            routed.group.as_str(),
            note,
        );
        self.set_header(Map::Response, ATTEMPTS, attempts.to_string(), note);
        self.set_header(Map::Response, ROUTE_VERSION, config.version.as_str(), note);
        if let Some(group) = &routed.switched_to {
            self.set_header(Map::Response, BUDGET_FALLBACK_HEADER, group.as_str(), note);
        }
        if let Some(deployment) = served {
            self.set_header(
                Map::Response,
                headers::DEPLOYMENT,
                deployment.name.as_str(),
                note,
            );
            // The plan's first attempt answered: what the request published is final. Otherwise
            // attempt k went to the plan's k-th deployment (the route's slot k-1).
            if attempts > 1 || routed.switched_to.is_some() {
                let tried = routed
                    .deployments
                    .iter()
                    .take(attempts as usize)
                    .filter_map(|i| config.deployments.get(*i))
                    .map(|d| d.name.clone())
                    .collect();
                let info = route_info(
                    config,
                    &routed.group,
                    &routed.deployments,
                    deployment,
                    &routed.request_id,
                    attempts,
                    tried,
                );
                let info = with_client_api(info, routed.translation.as_ref());
                self.set_property(
                    ROUTE_PROPERTY,
                    info.to_json(),
                    OnFailure::Log(Level::Warn, "cannot publish the route info"),
                );
            }
            self.count(
                [
                    "served.",
                    routed.group.as_str(),
                    ".",
                    deployment.name.as_str(),
                ]
                .concat(),
            );
        }
        // Every attempt before the last was retried, and Envoy retries only failures (429,
        // 5xx, reset, timeout, connect failure): they all count against their breakers. A
        // local reply of a later filter (token-ratelimit's 429 or 503, ...) reached no
        // deployment and says nothing about one: counted, one client at its own rate limit
        // opened the breakers of the whole group for everyone.
        if let Some(pass) = routed.pass.as_mut() {
            // redirect fallback: the breaker learns this pass's outcome at on_log, where a
            // superseded pass is told from the one that answers
            pass.status = status;
            if attempts > 1 {
                self.count("fallbacks.answered");
            }
            // the pass's own deployment answered: its reset signals cool it down (a pass the
            // redirect superseded never reaches this filter)
            if let (Some(deployment), true) = (
                served,
                status.is_some_and(is_cooldown_status) && answered_by_router(view),
            ) {
                let name = deployment.name.clone();
                self.cool_down_on_signal(&name, config.max_cooldown_ms, view, store);
            }
            return Some(status);
        }
        let now = view.now_nanos() / 1_000_000;
        let answered_by_router = answered_by_router(view);
        for (n, index) in routed.deployments.iter().enumerate() {
            let Some(deployment) = config.deployments.get(*index) else {
                continue;
            };
            if !answered_by_router {
                break;
            }
            if n + 1 < attempts as usize {
                self.record(config, &deployment.name, true, now, store);
            } else if n + 1 == attempts as usize {
                self.record(config, &deployment.name, is_failure(status), now, store);
            }
        }
        if attempts > 1 {
            self.count("fallbacks");
        }
        Some(status)
    }

    /// After a budget switch (token-ratelimit set `llm_budget_fallback` and rewrote the plan),
    /// the plan the attempts followed: the group switched to and the deployments of
    /// `llm_route_plan`. `None`: no switch (or one the router cannot read back: it keeps its
    /// own).
    fn read_switch(&mut self, config: &RouterConfig, view: &dyn View) -> Option<(String, Plan)> {
        let taken = property_string(view, &[BUDGET_FALLBACK_TAKEN]).filter(|t| !t.is_empty())?;
        let names = property_string(view, &[PLAN_PROPERTY]).unwrap_or_default();
        let plan = switched_plan(config, &taken, &names);
        if plan.is_none() {
            self.log(
                Level::Warn,
                "a budget fallback was taken but its plan names no configured group or deployment; reporting the original plan".to_string(),
            );
        }
        plan.map(|p| (taken, p))
    }

    /// Guards a 200 event stream: it gets an error event if it ends without its terminator.
    /// True if guarded.
    fn watch_stream(&mut self, context: u32, status: Option<u16>, view: &dyn View) -> bool {
        let event_stream = view
            .response_header("content-type")
            .and_then(|v| String::from_utf8(v).ok())
            .is_some_and(|ct| ct.to_ascii_lowercase().starts_with("text/event-stream"));
        if event_stream && status == Some(200) {
            // the body will change length if it needs the error event
            self.remove_header(
                Map::Response,
                "content-length",
                OnFailure::Log(Level::Warn, "cannot remove the content-length"),
            );
            if let Some(exchange) = self.downstream.get_mut(&context) {
                exchange.watcher = Some(StreamWatcher::default());
                return true;
            }
        }
        false
    }

    fn response_body(
        &mut self,
        context: u32,
        size: usize,
        end_of_stream: bool,
        view: &dyn View,
    ) -> Next {
        let Some(exchange) = self.downstream.get_mut(&context) else {
            return Next::ContinueSkipResponseBody;
        };
        if let Some(mut tr) = exchange.response.take() {
            let flow = self.translate_response_body(&mut tr, size, end_of_stream, view);
            if let Some(exchange) = self.downstream.get_mut(&context) {
                exchange.response = Some(tr);
            }
            return flow;
        }
        let anthropic = exchange.routed.as_ref().is_some_and(|r| r.anthropic_api);
        let Some(watcher) = exchange.watcher.as_mut() else {
            return Next::ContinueSkipResponseBody;
        };
        if size > 0 {
            view.with_response_body(size, &mut |chunk| watcher.push(chunk));
        }
        if watcher.finished() {
            // the terminator went by: nothing later can cut this stream short
            exchange.watcher = None;
            return Next::ContinueSkipResponseBody;
        }
        if end_of_stream {
            exchange.watcher = None;
            self.push(
                Effect::Own(Own::AppendResponseBody {
                    at: size,
                    bytes: interrupted_event(anthropic),
                }),
                OnFailure::Log(Level::Error, "cannot append the stream error event"),
            );
            self.log(
                Level::Warn,
                "stream ended without its terminator: error event sent".to_string(),
            );
            self.count("stream_interrupted");
            return Next::ContinueSkipResponseBody;
        }
        Next::Continue
    }

    /// `on_log` of a redirect pass: its attempt's outcome goes to the breaker — a pass the
    /// redirect superseded failed; the one that answered is judged by its status.
    fn done(&mut self, context: u32, view: &dyn View, store: &dyn Store) {
        let Some(routed) = self
            .downstream
            .get(&context)
            .and_then(|e| e.routed.as_ref())
        else {
            return;
        };
        let Some(pass) = routed.pass.as_ref() else {
            return;
        };
        let rules = Rc::clone(&routed.rules);
        let Some(config) = rules.configs().nth(routed.config_index) else {
            return;
        };
        let index = usize::try_from(pass.attempt.saturating_sub(1)).unwrap_or(usize::MAX);
        let Some(deployment) = routed
            .deployments
            .get(index)
            .and_then(|i| config.deployments.get(*i))
        else {
            return;
        };
        let pass_status = pass.status;
        let now = view.now_nanos() / 1_000_000;
        let details = property_string(view, &["response", "code_details"]);
        if llm_gateway_shared::reentry::is_superseded(details.as_deref()) {
            // the redirect policy fires only on a failure (429, 5xx, a connect failure)
            self.record(config, &deployment.name, true, now, store);
        } else if answered_by_router(view) {
            let status = pass_status.or_else(|| {
                view.property(&["response", "code"])
                    .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
                    .and_then(|b| u16::try_from(u64::from_le_bytes(b)).ok())
            });
            self.record(config, &deployment.name, is_failure(status), now, store);
        }
    }
}

/// What every routed request records besides its plan: the config it was routed by, and
/// whether the client speaks Anthropic Messages (its `endpoint`).
fn routed_base(
    rules: &Rc<RuleSet<RouterConfig>>,
    config_index: usize,
    endpoint: Option<Endpoint>,
) -> Routed {
    Routed {
        config_index,
        group: String::new(),
        deployments: Vec::new(),
        alternative_published: false,
        switched_to: None,
        request_id: String::new(),
        anthropic_api: endpoint == Some(Endpoint::Api(Api::AnthropicMessages)),
        rules: Rc::clone(rules),
        pass: None,
        translation: None,
    }
}

/// The client of a request whose body is in the API of `endpoint` (no earlier translation),
/// when that API is one the router translates.
fn client_of(endpoint: Option<Endpoint>, body: &Body) -> Option<Client> {
    let wire = endpoint_wire(endpoint?)?;
    Some(Client {
        wire,
        asked: body.asked(),
    })
}

/// The route info of a request whose client speaks another API than its body: it names the
/// client's (usage-accounting records both).
fn with_client_api(mut info: RouteInfo, translation: Option<&Translation>) -> RouteInfo {
    info.client_api = translation.map(|t| wire_name(t.client).to_string());
    info
}

/// What the request translation takes from deployment `d`.
fn request_params<'a>(config: &RouterConfig, d: &'a Deployment) -> RequestParams<'a> {
    let _ = config; // the deployment's cap already has the configuration's default in it
    RequestParams {
        model: &d.model,
        default_max_tokens: d.max_tokens,
        max_completion_tokens: d.takes_max_completion_tokens(),
    }
}
