//! The proxy-wasm adapter: copies host data in, calls [`crate::plan`], [`crate::breaker`],
//! [`crate::body`] and [`crate::stream`], applies the results. Every host call goes through
//! `llm_gateway_shared::host`; nothing here decides.
//!
//! Two roles, one module (`"role"` in the config):
//! * **downstream** (the listener's HTTP filter): plans, rewrites `model` and the credential
//!   for the first choice, publishes the plan in filter state (`llm_try_<k>` = the cluster of
//!   attempt k+1, read by the route's matcher cluster specifier; `llm_route_plan` = the
//!   deployments; `llm_route` = [`RouteInfo`]), bounds the retries (`x-envoy-max-retries`),
//!   clears the route cache; for a group with `budget_fallback` also publishes the fallback
//!   group's plan (`llm_route_budget_fallback`, [`crate::budget_fallback`]); on the response
//!   follows a budget switch if token-ratelimit made one, adds `x-llm-*` headers and guards
//!   streams.
//! * **upstream** (each provider cluster's upstream HTTP filter, runs once per attempt):
//!   rewrites `model` and the credential for the attempt's deployment.
//!
//! Breaker outcomes are recorded by the downstream role when the response headers arrive:
//! every attempt before the last one was retried, so it failed; the last one's status decides.
//! (Envoy 1.40 calls no upstream-filter callback for an attempt whose connection failed, so the
//! upstream role could not see those.)

use crate::body::{is_context_length_error, is_count_tokens, is_routed_path, rewrite_model, Body};
use crate::breaker::{is_failure, State, Transition, Verdict};
use crate::budget_fallback::{alternative, plan_alternative, switched_plan};
use crate::config::{parse_document, Deployment, Provider, Role, RouterConfig};
use crate::ids::IdSource;
use crate::models::{self, Listing};
use crate::plan::{plan, route_info, Admission, Request as PlanRequest};
use crate::redirect::{Continuation, Fallback};
use crate::stream::{interrupted_event, StreamWatcher};
use llm_gateway_shared::headers;
use llm_gateway_shared::host::{self, Buffer, HeaderMap, HostError, LogLevel, Metric};
use llm_gateway_shared::reject::Reject;
use llm_gateway_shared::route_info::{
    try_property, ATTEMPT_PROPERTY, BUDGET_FALLBACK_HEADER, BUDGET_FALLBACK_PROPERTY,
    BUDGET_FALLBACK_TAKEN, MAX_RETRIES_HEADER as MAX_RETRIES, PLAN_PROPERTY,
    PROPERTY as ROUTE_PROPERTY,
};
use llm_gateway_shared::rules::RuleSet;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::rc::Rc;

const PLUGIN: &str = "model_router";
/// Response headers.
const ATTEMPTS: &str = "x-llm-attempts";
const ROUTE_VERSION: &str = "x-llm-route-version";
/// Envoy's attempt counter (route's virtual host: `include_request_attempt_count: true`).
const ATTEMPT_COUNT: &str = "x-envoy-attempt-count";
/// Set by the upstream role on a provider's context-length error; the route retries on it
/// (`retry_on: retriable-headers`), the downstream role removes it before the client.
const FALLBACK_HEADER: &str = "x-llm-fallback";
/// Largest error body the upstream role reads to classify a 400.
const MAX_ERROR_BODY: usize = 64 * 1024;
const CAS_ROUNDS: usize = 8;

// The standalone module's entry point; a module holding several plugins (`plugins/bundle`)
// turns the `standalone` feature off and creates this plugin's root context with
// [`root_context`].
#[cfg(feature = "standalone")]
proxy_wasm::main! {{
    proxy_wasm::set_root_context(root_context);
}}

/// A root context of this plugin (what the standalone module creates for every `root_id`).
pub fn root_context(_context_id: u32) -> Box<dyn RootContext> {
    Box::new(Root::default())
}

fn log(level: LogLevel, message: &str) {
    host::log(level, &format!("model-router: {message}"));
}

fn count(name: &str) {
    if let Ok(metric) = Metric::counter(&format!("llm_gateway.model_router.{name}")) {
        let _ = metric.increment(1);
    }
}

fn now_ms() -> u64 {
    host::now_nanos().map_or(0, |n| n / 1_000_000)
}

thread_local! {
    /// The listener role's configuration, for the upstream role of the same VM: the provider
    /// clusters' upstream filter and the listener's filter share `vm_id` and code, so Envoy runs
    /// them in one VM per worker, and the deployments are configured once, in the listener's
    /// document (the upstream role's own document needs only `"role": "upstream"`).
    static LISTENER_RULES: RefCell<Option<Rc<RuleSet<RouterConfig>>>> = const { RefCell::new(None) };
}

/// The deployment `name` as the upstream role resolves it: its own document first (the older
/// form repeats the deployments there), else the listener role's of this VM.
fn resolve_deployment(own: Option<&RuleSet<RouterConfig>>, name: &str) -> Option<Deployment> {
    let find = |rules: &RuleSet<RouterConfig>| {
        rules
            .configs()
            .find_map(|c| c.deployment(name).map(|(_, d)| d.clone()))
    };
    own.and_then(find)
        .or_else(|| LISTENER_RULES.with(|cell| cell.try_borrow().ok()?.as_deref().and_then(find)))
}

struct Root {
    rules: Option<Rc<RuleSet<RouterConfig>>>,
    ids: Rc<RefCell<IdSource>>,
    /// When the configuration was loaded (Unix seconds): `created` of the model objects.
    configured_at: u64,
}

impl Default for Root {
    fn default() -> Self {
        // std seeds RandomState from the host's randomness (WASI `random_get`)
        let seed = RandomState::new().hash_one(host::now_nanos().unwrap_or_default());
        Root {
            rules: None,
            ids: Rc::new(RefCell::new(IdSource::new(seed))),
            configured_at: 0,
        }
    }
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let Some(rules) = host::load_config("model-router", parse_document) else {
            return false;
        };
        if let Some(c) = rules.global() {
            log(
                LogLevel::Info,
                &format!(
                    "configured ({:?}) version {} with {} deployments and {} groups",
                    c.role,
                    c.version,
                    c.deployments.len(),
                    c.groups.len()
                ),
            );
        }
        seed_breakers(&rules);
        let rules = Rc::new(rules);
        if rules.configs().any(|c| c.role == Role::Downstream) {
            LISTENER_RULES.with(|cell| {
                if let Ok(mut slot) = cell.try_borrow_mut() {
                    *slot = Some(Rc::clone(&rules));
                }
            });
        }
        self.rules = Some(rules);
        self.configured_at = host::now_nanos().map_or(0, |n| n / 1_000_000_000);
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let rules = self.rules.clone();
        let role = rules
            .as_ref()
            .and_then(|r| r.configs().next().map(|c| c.role))
            .unwrap_or_default();
        match role {
            Role::Downstream => Some(Box::new(Downstream {
                rules,
                ids: Rc::clone(&self.ids),
                configured_at: self.configured_at,
                path: None,
                routed: None,
                watcher: None,
            })),
            Role::Upstream => Some(Box::new(Upstream {
                rules,
                attempt: None,
            })),
        }
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

// ---------------------------------------------------------------------------------------
// Breaker state in shared data

fn breaker_key(deployment: &str) -> String {
    format!("llm_router:breaker:{deployment}")
}

/// Creates every deployment's breaker entry that does not exist yet. proxy-wasm has no
/// create-if-absent: a first write is unconditional (CAS 0), so doing it here, before traffic,
/// leaves every later update a real compare-and-swap.
fn seed_breakers(rules: &RuleSet<RouterConfig>) {
    for config in rules.configs() {
        for deployment in &config.deployments {
            let key = breaker_key(&deployment.name);
            if let Ok((None, _)) = host::shared_data(&key) {
                let _ = host::set_shared_data(&key, &State::default().encode(), 0);
            }
        }
    }
}

/// Asks the deployment's breaker; claims the probe with CAS when it is this request's turn.
fn admit(config: &RouterConfig, deployment: &Deployment, now: u64) -> Admission {
    let key = breaker_key(&deployment.name);
    for _ in 0..CAS_ROUNDS {
        let Ok((value, cas)) = host::shared_data(&key) else {
            return Admission::Admit; // no shared data: fail open
        };
        let state = value.as_deref().map(State::decode).unwrap_or_default();
        match state.admit(&config.breaker, now) {
            Verdict::Admit(None) => return Admission::Admit,
            Verdict::Skip(ms) => return Admission::Skip(ms),
            Verdict::Admit(Some(probing)) => {
                match host::set_shared_data(&key, &probing.encode(), cas) {
                    Ok(()) => {
                        log(
                            LogLevel::Info,
                            &format!("breaker half-open: probing deployment {}", deployment.name),
                        );
                        count(&format!("breaker.probe.{}", deployment.name));
                        return Admission::Admit;
                    }
                    Err(HostError::CasMismatch) => continue,
                    Err(_) => return Admission::Admit,
                }
            }
        }
    }
    Admission::Skip(config.breaker.cooldown_ms) // lost every race: someone else probes
}

/// Asks the deployment's breaker without claiming a probe (for a budget fallback's plan, which
/// the request will most likely not take): a breaker due for a probe skips it.
fn admit_without_probe(config: &RouterConfig, deployment: &Deployment, now: u64) -> Admission {
    let Ok((value, _)) = host::shared_data(&breaker_key(&deployment.name)) else {
        return Admission::Admit; // no shared data: fail open
    };
    let state = value.as_deref().map(State::decode).unwrap_or_default();
    match state.admit(&config.breaker, now) {
        Verdict::Admit(None) => Admission::Admit,
        Verdict::Admit(Some(_)) => Admission::Skip(0),
        Verdict::Skip(ms) => Admission::Skip(ms),
    }
}

/// Records an attempt's outcome in the deployment's breaker.
fn record(config: &RouterConfig, deployment: &str, failed: bool, now: u64) {
    let key = breaker_key(deployment);
    for _ in 0..CAS_ROUNDS {
        let Ok((value, cas)) = host::shared_data(&key) else {
            return;
        };
        let state = value.as_deref().map(State::decode).unwrap_or_default();
        let (next, transition) = state.record(&config.breaker, failed, now);
        if next == state {
            return;
        }
        match host::set_shared_data(&key, &next.encode(), cas) {
            Ok(()) => {
                match transition {
                    Transition::Opened => {
                        log(
                            LogLevel::Warn,
                            &format!(
                                "breaker opened: deployment {deployment} skipped for {} ms",
                                config.breaker.cooldown_ms
                            ),
                        );
                        count(&format!("breaker.opened.{deployment}"));
                    }
                    Transition::Recovered => {
                        log(
                            LogLevel::Info,
                            &format!("breaker closed: deployment {deployment} recovered"),
                        );
                        count(&format!("breaker.recovered.{deployment}"));
                    }
                    Transition::Probing | Transition::None => {}
                }
                return;
            }
            Err(HostError::CasMismatch) => continue,
            Err(_) => return,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Shared helpers

fn header_string(map: HeaderMap, name: &str) -> Option<String> {
    host::header(map, name)
        .ok()
        .flatten()
        .and_then(|v| String::from_utf8(v).ok())
}

/// Replaces the provider credential headers with the deployment's.
/// The header naming the Anthropic API version, and the value sent when the client sent none.
const ANTHROPIC_VERSION: &str = "anthropic-version";
const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";

fn set_credential(deployment: &Deployment) -> Result<(), HostError> {
    host::remove_header(HeaderMap::RequestHeaders, "authorization")?;
    host::remove_header(HeaderMap::RequestHeaders, "x-api-key")?;
    let Some(credential) = &deployment.credential else {
        return Ok(());
    };
    match deployment.provider {
        Provider::Anthropic => {
            // Anthropic refuses a request without its API version; most SDKs send one
            if host::header(HeaderMap::RequestHeaders, ANTHROPIC_VERSION)?.is_none() {
                host::set_header(
                    HeaderMap::RequestHeaders,
                    ANTHROPIC_VERSION,
                    DEFAULT_ANTHROPIC_VERSION.as_bytes(),
                )?;
            }
            host::set_header(
                HeaderMap::RequestHeaders,
                "x-api-key",
                credential.as_bytes(),
            )
        }
        Provider::Openai | Provider::OpenaiCompatible => host::set_header(
            HeaderMap::RequestHeaders,
            "authorization",
            format!("Bearer {credential}").as_bytes(),
        ),
    }
}

fn refuse(reject: &Reject) -> Action {
    count(&format!("rejected.{}", reject.code));
    if let Err(err) = host::send_reject(PLUGIN, reject) {
        log(
            LogLevel::Error,
            &format!("cannot send the local reply: {err}"),
        );
    }
    Action::Pause
}

/// True if Envoy's router made this response: the upstream's answer (`via_upstream`) or the
/// router's own reply when the attempts failed (`upstream_reset_before_response_started{…}`,
/// `upstream_per_try_timeout`, …). A filter's local reply has its own details
/// (`<plugin>.<code>`). A host that does not say counts as the router (as before).
fn answered_by_router() -> bool {
    match host::property_string(&["response", "code_details"]) {
        Ok(Some(details)) => details == "via_upstream" || details.starts_with("upstream_"),
        _ => true,
    }
}

/// Envoy's number of the current attempt (1 for the first try): its `x-envoy-attempt-count`
/// while the request still has it, else the number the upstream role mirrored into filter
/// state (`llm_attempt`) before removing the header for the provider.
fn attempt_number() -> u32 {
    header_string(HeaderMap::RequestHeaders, ATTEMPT_COUNT)
        .or_else(|| host::property_string(&[ATTEMPT_PROPERTY]).ok().flatten())
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or(1)
        .max(1)
}

/// Removes every `x-envoy-*` request header (Envoy's internals: attempt count, timeouts, a
/// client's external address...): a provider gets none of them unless its deployment says
/// `forward_envoy_headers`. Header changes of an upstream filter persist into the next
/// attempt; Envoy stamps the attempt count again for each one.
fn remove_envoy_headers() -> Result<(), HostError> {
    for (name, _) in host::headers(HeaderMap::RequestHeaders)? {
        if name.starts_with("x-envoy-") {
            host::remove_header(HeaderMap::RequestHeaders, &name)?;
        }
    }
    Ok(())
}

fn strip_envoy_headers() {
    if let Err(err) = remove_envoy_headers() {
        log(
            LogLevel::Error,
            &format!("cannot remove the x-envoy-* headers: {err}"),
        );
    }
}

// ---------------------------------------------------------------------------------------
// Downstream role

struct Routed {
    /// Position of the selected config in `config.configs()`.
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
    config: Rc<RuleSet<RouterConfig>>,
    /// `"fallback": "redirect"`: the attempt this pass makes (1 on the first pass); the
    /// attempt number does not come from Envoy's retries then.
    pass: Option<Pass>,
}

/// A pass of the redirect fallback.
struct Pass {
    attempt: u32,
    /// The response status this pass saw, for the breaker at `on_log`.
    status: Option<u16>,
}

struct Downstream {
    rules: Option<Rc<RuleSet<RouterConfig>>>,
    ids: Rc<RefCell<IdSource>>,
    /// `created` of the model objects ([`models::answer`]).
    configured_at: u64,
    /// `:path`, kept from the headers when it is one the router handles.
    path: Option<String>,
    routed: Option<Routed>,
    watcher: Option<StreamWatcher>,
}

impl Context for Downstream {}

impl Downstream {
    fn config(&self) -> Option<&RouterConfig> {
        let rules = self.rules.as_ref()?;
        host::select_config(rules, None)
    }

    /// What every routed request records besides its plan: the config it was routed by, and
    /// whether the client speaks Anthropic Messages.
    fn routed_base(&self, rules: &Rc<RuleSet<RouterConfig>>, config: &RouterConfig) -> Routed {
        Routed {
            config_index: rules
                .configs()
                .position(|c| std::ptr::eq(c, config))
                .unwrap_or(0),
            group: String::new(),
            deployments: Vec::new(),
            alternative_published: false,
            switched_to: None,
            request_id: String::new(),
            anthropic_api: self
                .path
                .as_deref()
                .is_some_and(|p| p.starts_with("/v1/messages")),
            config: Rc::clone(rules),
            pass: None,
        }
    }

    /// Guards a 200 event stream: it gets an error event if it ends without its terminator.
    fn watch_stream(&mut self, status: Option<u16>) -> Action {
        let event_stream = header_string(HeaderMap::ResponseHeaders, "content-type")
            .is_some_and(|ct| ct.to_ascii_lowercase().starts_with("text/event-stream"));
        if event_stream && status == Some(200) {
            // the body will change length if it needs the error event
            let _ = host::remove_header(HeaderMap::ResponseHeaders, "content-length");
            self.watcher = Some(StreamWatcher::default());
        }
        Action::Continue
    }

    /// Answers `GET /v1/models[/{id}]` itself ([`models::answer`]): no provider, no later
    /// filter sees it.
    fn answer_models(&self, listing: &Listing) -> Action {
        let Some(config) = self.config() else {
            return Action::Continue;
        };
        let allowed = header_string(HeaderMap::RequestHeaders, headers::GROUPS);
        match models::answer(config, listing, allowed.as_deref(), self.configured_at) {
            Ok(body) => {
                count("models_answered");
                let sent = host::send_local_response(
                    200,
                    "model_router.models",
                    &[("content-type", "application/json")],
                    &body,
                );
                if let Err(err) = sent {
                    log(
                        LogLevel::Error,
                        &format!("cannot send the model list: {err}"),
                    );
                }
                Action::Pause
            }
            Err(reject) => refuse(&reject),
        }
    }

    fn route(&mut self, size: usize) -> Result<(), Reject> {
        let Some(rules) = self.rules.clone() else {
            return Err(Reject::internal("model-router is not configured"));
        };
        let Some(config) = host::select_config(&rules, None) else {
            return Ok(());
        };
        let bytes = host::buffer(Buffer::RequestBody, 0, size)
            .map_err(|_| Reject::internal("cannot read the request body"))?;
        let body = Body::parse(&bytes)?;
        let redirect = config.fallback == Fallback::Redirect;
        if redirect && header_string(HeaderMap::RequestHeaders, headers::REENTRY).is_some() {
            if let Some(continuation) = host::header(HeaderMap::RequestHeaders, headers::ROUTE_NEXT)
                .ok()
                .flatten()
                .and_then(|v| Continuation::parse(&v))
            {
                return self.reroute(&rules, config, size, &body, continuation);
            }
        }
        let allowed = header_string(HeaderMap::RequestHeaders, headers::GROUPS);
        let subject = header_string(HeaderMap::RequestHeaders, "x-user-id")
            .filter(|s| !s.is_empty())
            .or_else(|| header_string(HeaderMap::RequestHeaders, headers::CONSUMER));
        let request = PlanRequest {
            model: &body.model,
            allowed_groups: allowed.as_deref(),
            subject: subject.as_deref(),
            estimated_tokens: body.estimated_tokens(),
            anthropic_only: self.path.as_deref().is_some_and(is_count_tokens),
        };
        // one clock read for the breakers (ms) and the request id (ns)
        let now_nanos = host::now_nanos().unwrap_or_default();
        let now = now_nanos / 1_000_000;
        let plan = plan(config, &request, |index| {
            match config.deployments.get(index) {
                Some(deployment) => admit(config, deployment, now),
                None => Admission::Skip(0),
            }
        })?;
        let first = plan
            .deployments
            .first()
            .and_then(|i| config.deployments.get(*i))
            .ok_or_else(|| Reject::internal("empty plan"))?;

        let internal = |_| Reject::internal("cannot route the request");
        let rewritten = body.with_model(&first.model);
        host::replace_request_body(size, &rewritten).map_err(internal)?;
        if redirect {
            // no upstream role frames the body on this host: the provider gets the length of
            // what it receives, whatever the client sent (the later filters keep it true)
            host::set_request_length(rewritten.len()).map_err(internal)?;
        }
        if plan.deployments.len() == 1 || redirect {
            set_credential(first).map_err(internal)?;
        } else {
            // Several deployments: each attempt's credential is the upstream role's job. Were
            // it set here, a cluster without the upstream filter would forward the first
            // provider's key to the second provider; this way it gets none (a 401 that shows
            // the misconfiguration).
            host::remove_header(HeaderMap::RequestHeaders, "authorization").map_err(internal)?;
            host::remove_header(HeaderMap::RequestHeaders, "x-api-key").map_err(internal)?;
        }
        // never the client's: see crate::ids
        let request_id = self
            .ids
            .try_borrow_mut()
            .map(|mut ids| ids.next_id(now_nanos))
            .unwrap_or_default();
        let set = |name: &str, value: &str| {
            host::set_header(HeaderMap::RequestHeaders, name, value.as_bytes()).map_err(internal)
        };
        set(headers::MODEL_GROUP, &plan.group)?;
        set(headers::DEPLOYMENT, &first.name)?;
        set(headers::CLUSTER, &first.cluster)?;
        set(headers::REQUEST_ID, &request_id)?;
        let names: Vec<&str> = plan
            .deployments
            .iter()
            .filter_map(|i| config.deployments.get(*i))
            .map(|d| d.name.as_str())
            .collect();
        if redirect {
            publish_continuation(1, &plan.group, &request_id, &names).map_err(internal)?;
        } else {
            // the slot of the first resolution; each attempt's upstream role writes its own
            // number
            host::set_property(&[ATTEMPT_PROPERTY], b"0").map_err(internal)?;
            set(
                MAX_RETRIES,
                &(plan.deployments.len().saturating_sub(1)).to_string(),
            )?;
            for (slot, index) in plan.deployments.iter().enumerate() {
                if let Some(deployment) = config.deployments.get(*index) {
                    host::set_property(&[&try_property(slot)], deployment.cluster.as_bytes())
                        .map_err(internal)?;
                }
            }
            host::set_property(&[PLAN_PROPERTY], names.join(",").as_bytes()).map_err(internal)?;
        }
        let info = route_info(
            config,
            &plan.group,
            &plan.deployments,
            first,
            &request_id,
            1,
            Vec::new(),
        );
        host::set_property(&[ROUTE_PROPERTY], &info.to_json()).map_err(internal)?;
        let alternative_published =
            publish_alternative(config, &request, &plan.group, &request_id, now);
        host::clear_route_cache().map_err(internal)?;

        count(&format!("version.{}.requests", config.version));
        self.routed = Some(Routed {
            group: plan.group,
            deployments: plan.deployments,
            alternative_published,
            switched_to: None,
            request_id,
            pass: redirect.then_some(Pass {
                attempt: 1,
                status: None,
            }),
            ..self.routed_base(&rules, config)
        });
        Ok(())
    }

    /// A pass that re-enters the chain (redirect fallback): attempt `continuation.attempt` of
    /// the plan the first pass made, with that deployment's model and credential, the same
    /// logical request id, and the continuation for the pass after it.
    fn reroute(
        &mut self,
        rules: &Rc<RuleSet<RouterConfig>>,
        config: &RouterConfig,
        size: usize,
        body: &Body,
        continuation: Continuation,
    ) -> Result<(), Reject> {
        let lost = || {
            Reject::new(
                503,
                llm_gateway_shared::reject::ErrorType::Api,
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
        let internal = |_| Reject::internal("cannot route the request");
        let rewritten = body.with_model(&chosen.model);
        host::replace_request_body(size, &rewritten).map_err(internal)?;
        // upstream Envoy's redirect removed content-length; no upstream role frames the body
        host::set_request_length(rewritten.len()).map_err(internal)?;
        set_credential(chosen).map_err(internal)?;
        host::remove_header(HeaderMap::RequestHeaders, headers::ROUTE_NEXT).map_err(internal)?;
        let set = |name: &str, value: &str| {
            host::set_header(HeaderMap::RequestHeaders, name, value.as_bytes()).map_err(internal)
        };
        set(headers::MODEL_GROUP, &continuation.group)?;
        set(headers::DEPLOYMENT, &chosen.name)?;
        set(headers::CLUSTER, &chosen.cluster)?;
        set(headers::REQUEST_ID, &continuation.request_id)?;
        let names: Vec<&str> = continuation.plan.iter().map(String::as_str).collect();
        publish_continuation(
            attempt,
            &continuation.group,
            &continuation.request_id,
            &names,
        )
        .map_err(internal)?;
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
        host::set_property(&[ROUTE_PROPERTY], &info.to_json()).map_err(internal)?;
        host::clear_route_cache().map_err(internal)?;
        count("fallbacks");
        log(
            LogLevel::Info,
            &format!(
                "fallback: attempt {attempt} of group {} to deployment {}",
                continuation.group, chosen.name
            ),
        );
        self.routed = Some(Routed {
            group: continuation.group,
            deployments,
            request_id: continuation.request_id,
            pass: Some(Pass {
                attempt,
                status: None,
            }),
            ..self.routed_base(rules, config)
        });
        Ok(())
    }
}

/// Writes the continuation of the pass after attempt `attempt` (`wasm.llm_route_next`), when
/// the plan has a later deployment. Without it the redirect policy does not fire, and the
/// error of the last deployment goes to the client.
fn publish_continuation(
    attempt: u32,
    group: &str,
    request_id: &str,
    names: &[&str],
) -> Result<(), HostError> {
    match Continuation::after(attempt, group, request_id, names) {
        Some(next) => host::set_property(&[crate::redirect::PROPERTY], next.encode().as_bytes()),
        None => Ok(()),
    }
}

/// Plans the group's budget fallback, if it has one, and publishes it for token-ratelimit
/// (`llm_route_budget_fallback`). True if published. Failing to publish only loses the
/// fallback (the budget then refuses as usual): the request goes on.
fn publish_alternative(
    config: &RouterConfig,
    request: &PlanRequest<'_>,
    group: &str,
    request_id: &str,
    now: u64,
) -> bool {
    if config.budget_fallback(group).is_none() {
        return false;
    }
    let planned = plan_alternative(config, request, group, |index| {
        match config.deployments.get(index) {
            Some(deployment) => admit_without_probe(config, deployment, now),
            None => Admission::Skip(0),
        }
    });
    let Some(alt) = planned.and_then(|p| alternative(config, &p, request_id)) else {
        return false;
    };
    match host::set_property(&[BUDGET_FALLBACK_PROPERTY], &alt.to_json()) {
        Ok(()) => true,
        Err(err) => {
            log(
                LogLevel::Error,
                &format!("cannot publish the budget fallback: {err}"),
            );
            false
        }
    }
}

/// After a budget switch (token-ratelimit set `llm_budget_fallback` and rewrote the plan),
/// the plan the attempts followed: the group switched to and the deployments of
/// `llm_route_plan`. `None`: no switch (or one the router cannot read back: it keeps its own).
fn read_switch(config: &RouterConfig) -> Option<(String, crate::plan::Plan)> {
    let taken = host::property_string(&[BUDGET_FALLBACK_TAKEN])
        .ok()
        .flatten()
        .filter(|t| !t.is_empty())?;
    let names = host::property_string(&[PLAN_PROPERTY])
        .ok()
        .flatten()
        .unwrap_or_default();
    let plan = switched_plan(config, &taken, &names);
    if plan.is_none() {
        log(
            LogLevel::Warn,
            "a budget fallback was taken but its plan names no configured group or deployment; reporting the original plan",
        );
    }
    plan.map(|p| (taken, p))
}

impl HttpContext for Downstream {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let path = header_string(HeaderMap::RequestHeaders, ":path").unwrap_or_default();
        let method = header_string(HeaderMap::RequestHeaders, ":method").unwrap_or_default();
        if let Some(listing) = models::listing(&method, &path) {
            return self.answer_models(&listing);
        }
        if !is_routed_path(&path) || self.config().is_none() {
            return Action::Continue;
        }
        self.path = Some(path);
        if end_of_stream {
            return refuse(&Reject::bad_request(
                "invalid_request_body",
                "the request needs a JSON body with a `model`",
            ));
        }
        // Hold the headers until the body decides the route (Envoy:
        // `allow_on_headers_stop_iteration: true` keeps body callbacks coming).
        Action::Pause
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if self.path.is_none() || self.routed.is_some() {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        match self.route(size) {
            Ok(()) => Action::Continue,
            Err(reject) => {
                if reject.status >= 500 {
                    log(LogLevel::Warn, &format!("refused: {}", reject.code));
                }
                refuse(&reject)
            }
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(routed) = self.routed.as_mut() else {
            return Action::Continue;
        };
        let Some(config) = routed.config.configs().nth(routed.config_index) else {
            return Action::Continue;
        };
        if routed.alternative_published && routed.switched_to.is_none() {
            // From here on (breakers, headers, route info, `tried`) the switched plan is
            // the one the attempts followed.
            if let Some((taken, switched)) = read_switch(config) {
                routed.group = switched.group;
                routed.deployments = switched.deployments;
                routed.switched_to = Some(taken);
                count("budget_fallbacks");
            }
        }
        let attempts = routed
            .pass
            .as_ref()
            .map_or_else(attempt_number, |p| p.attempt);
        let index = usize::try_from(attempts - 1).unwrap_or(0);
        let served = routed
            .deployments
            .get(index)
            .or(routed.deployments.last())
            .and_then(|i| config.deployments.get(*i));
        let status = header_string(HeaderMap::ResponseHeaders, ":status")
            .and_then(|s| s.parse::<u16>().ok());
        let add = |name: &str, value: &str| {
            let _ = host::set_header(HeaderMap::ResponseHeaders, name, value.as_bytes());
        };
        let _ = host::remove_header(HeaderMap::ResponseHeaders, FALLBACK_HEADER);
        add(headers::MODEL_GROUP, &routed.group);
        add(ATTEMPTS, &attempts.to_string());
        add(ROUTE_VERSION, &config.version);
        if let Some(group) = &routed.switched_to {
            add(BUDGET_FALLBACK_HEADER, group);
        }
        if let Some(deployment) = served {
            add(headers::DEPLOYMENT, &deployment.name);
            // Attempt k went to the plan's k-th deployment (the route's slot k-1).
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
            let _ = host::set_property(&[ROUTE_PROPERTY], &info.to_json());
            count(&format!("served.{}.{}", routed.group, deployment.name));
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
                count("fallbacks.answered");
            }
            return self.watch_stream(status);
        }
        let now = now_ms();
        let answered_by_router = answered_by_router();
        for (n, index) in routed.deployments.iter().enumerate() {
            let Some(deployment) = config.deployments.get(*index) else {
                continue;
            };
            if !answered_by_router {
                break;
            }
            if n + 1 < attempts as usize {
                record(config, &deployment.name, true, now);
            } else if n + 1 == attempts as usize {
                record(config, &deployment.name, is_failure(status), now);
            }
        }
        if attempts > 1 {
            count("fallbacks");
        }
        self.watch_stream(status)
    }

    fn on_log(&mut self) {
        let Some(routed) = self.routed.as_ref() else {
            return;
        };
        let (Some(pass), Some(config)) = (
            routed.pass.as_ref(),
            routed.config.configs().nth(routed.config_index),
        ) else {
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
        let details = host::property_string(&["response", "code_details"])
            .ok()
            .flatten();
        let now = now_ms();
        if llm_gateway_shared::reentry::is_superseded(details.as_deref()) {
            // the redirect policy fires only on a failure (429, 5xx, a connect failure)
            record(config, &deployment.name, true, now);
        } else if answered_by_router() {
            let status = pass.status.or_else(|| {
                host::property(&["response", "code"])
                    .ok()
                    .flatten()
                    .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
                    .and_then(|b| u16::try_from(u64::from_le_bytes(b)).ok())
            });
            record(config, &deployment.name, is_failure(status), now);
        }
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        let Some(watcher) = self.watcher.as_mut() else {
            return Action::Continue;
        };
        if size > 0 {
            if let Ok(chunk) = host::buffer(Buffer::ResponseBody, 0, size) {
                watcher.push(&chunk);
            }
        }
        if watcher.finished() {
            // the terminator went by: nothing later can cut this stream short
            self.watcher = None;
            return Action::Continue;
        }
        if end_of_stream {
            let anthropic = self.routed.as_ref().is_some_and(|r| r.anthropic_api);
            let event = interrupted_event(anthropic);
            if let Err(err) = host::set_buffer(Buffer::ResponseBody, size, 0, &event) {
                log(
                    LogLevel::Error,
                    &format!("cannot append the stream error event: {err}"),
                );
            }
            log(
                LogLevel::Warn,
                "stream ended without its terminator: error event sent",
            );
            count("stream_interrupted");
            self.watcher = None;
        }
        Action::Continue
    }
}

// ---------------------------------------------------------------------------------------
// Upstream role

struct Attempt {
    /// The attempt's deployment (resolved once: [`resolve_deployment`]).
    deployment: Deployment,
    /// Envoy's attempt number (1 for the first try) and the plan's deployment names.
    number: u32,
    plan: String,
    /// A later deployment exists: a context-length 400 may move there.
    has_next: bool,
    /// The response is a 400 held until its body says whether it is a context-length error.
    inspecting: bool,
}

struct Upstream {
    rules: Option<Rc<RuleSet<RouterConfig>>>,
    attempt: Option<Attempt>,
}

impl Context for Upstream {}

impl Upstream {
    fn deployment(&self) -> Option<&Deployment> {
        self.attempt.as_ref().map(|a| &a.deployment)
    }

    /// Publishes this attempt as the one that answered (`plan::answered_by`); a later attempt
    /// that answers publishes itself in turn.
    fn publish_answer(&self) {
        let (Some(attempt), Some(deployment)) = (self.attempt.as_ref(), self.deployment()) else {
            return;
        };
        let Some(info) = host::property(&[ROUTE_PROPERTY])
            .ok()
            .flatten()
            .and_then(|bytes| llm_gateway_shared::route_info::RouteInfo::from_json(&bytes))
        else {
            return;
        };
        let info = crate::plan::answered_by(info, deployment, &attempt.plan, attempt.number);
        if let Err(err) = host::set_property(&[ROUTE_PROPERTY], &info.to_json()) {
            log(
                LogLevel::Warn,
                &format!("cannot publish the answering deployment: {err}"),
            );
        }
    }
}

impl HttpContext for Upstream {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if self.rules.is_none() {
            return Action::Continue;
        }
        let Ok(Some(plan)) = host::property_string(&[PLAN_PROPERTY]) else {
            strip_envoy_headers(); // not a routed request: no deployment to opt in
            return Action::Continue;
        };
        let attempt = attempt_number();
        // The route's matcher picks the next attempt's slot from this number (a retry re-runs
        // it before Envoy stamps the next count): filter state, because the header is removed.
        if let Err(err) = host::set_property(&[ATTEMPT_PROPERTY], attempt.to_string().as_bytes()) {
            log(
                LogLevel::Error,
                &format!("cannot publish the attempt number: {err}"),
            );
        }
        // The attempt number, not the cluster, says which deployment this is: two
        // deployments of a group may share a cluster (one provider, two models).
        let name = plan
            .split(',')
            .nth(usize::try_from(attempt - 1).unwrap_or(usize::MAX))
            .unwrap_or_default();
        let Some(deployment) = resolve_deployment(self.rules.as_deref(), name) else {
            // Never forward it unchanged (the group's name as model, no credential): the
            // listener planned a deployment this role cannot resolve.
            log(
                LogLevel::Error,
                &format!("attempt {attempt}: deployment `{name}` is not configured here; refused"),
            );
            return refuse(&Reject::internal(format!(
                "the gateway's model router cannot resolve deployment `{name}` for attempt {attempt}"
            )));
        };
        if !deployment.forward_envoy_headers {
            strip_envoy_headers();
        }
        if let Err(err) = set_credential(&deployment) {
            log(
                LogLevel::Error,
                &format!("cannot set the credential: {err}"),
            );
        }
        let has_next = plan.split(',').count() > usize::try_from(attempt).unwrap_or(usize::MAX);
        self.attempt = Some(Attempt {
            deployment,
            number: attempt,
            plan: plan.clone(),
            has_next,
            inspecting: false,
        });
        if end_of_stream {
            Action::Continue
        } else {
            Action::Pause // hold the headers: the body's length may change
        }
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        let Some(deployment) = self.deployment() else {
            return Action::Continue;
        };
        if !end_of_stream {
            return Action::Pause;
        }
        let model = deployment.model.clone();
        // The whole body is here and the headers are held: the provider gets the length of
        // what it receives (rewritten or not), never a chunked body.
        let mut length = size;
        if let Ok(bytes) = host::buffer(Buffer::RequestBody, 0, size) {
            if let Some(rewritten) = rewrite_model(&bytes, &model) {
                match host::set_buffer(Buffer::RequestBody, 0, size, &rewritten) {
                    Ok(()) => length = rewritten.len(),
                    Err(err) => log(LogLevel::Error, &format!("cannot rewrite the model: {err}")),
                }
            }
        }
        if let Err(err) = host::set_request_length(length) {
            log(
                LogLevel::Error,
                &format!("cannot set the content-length: {err}"),
            );
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.publish_answer();
        let Some(attempt) = self.attempt.as_mut() else {
            return Action::Continue;
        };
        let status = header_string(HeaderMap::ResponseHeaders, ":status");
        if status.as_deref() == Some("400") && attempt.has_next && !end_of_stream {
            // hold the headers until the body tells whether it is a context-length error
            attempt.inspecting = true;
            return Action::Pause;
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        let Some(attempt) = self.attempt.as_mut() else {
            return Action::Continue;
        };
        if !attempt.inspecting {
            return Action::Continue;
        }
        if !end_of_stream && size < MAX_ERROR_BODY {
            return Action::Pause;
        }
        attempt.inspecting = false;
        let body =
            host::buffer(Buffer::ResponseBody, 0, size.min(MAX_ERROR_BODY)).unwrap_or_default();
        if is_context_length_error(&body) {
            if let Err(err) = host::set_header(
                HeaderMap::ResponseHeaders,
                FALLBACK_HEADER,
                b"context_length_exceeded",
            ) {
                log(
                    LogLevel::Error,
                    &format!("cannot mark a context-length error: {err}"),
                );
            }
            count("context_length_fallbacks");
        }
        Action::Continue
    }
}
