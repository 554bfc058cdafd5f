//! One request/response exchange from the plugin's point of view: a pure state machine the
//! shell feeds with what the host reports, with the clock passed in. It decides what to do
//! with the request body, how to treat the response, and builds the record exactly once.

use crate::config::UsageConfig;
use crate::pricing;
use crate::record::{clean_attribution, Attempt, Record, UsageFields, UsageSource};
use crate::request::{self, RequestInfo};
use crate::stream::{Forward, ResponseStream};
use llm_gateway_shared::headers;
use llm_gateway_shared::price::Price;
use llm_gateway_shared::request::Api;
use llm_gateway_shared::route_info::RouteInfo;
use llm_gateway_shared::tokens::{count_tokens, estimate_prompt_tokens, Encoding};
use llm_gateway_shared::usage::{self, Usage};
use std::cell::OnceCell;

/// Who and what a request is for, from the request headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attribution {
    /// `x-llm-request-id`, else `x-request-id`, else the host's request id.
    pub request_id: String,
    /// `x-llm-consumer`.
    pub consumer: Option<String>,
    /// `x-llm-tenant`.
    pub tenant: Option<String>,
    /// `x-llm-key-id` (key-auth: the key's id, kept across rotation).
    pub key_id: Option<String>,
    /// `x-llm-tier` (key-auth).
    pub tier: Option<String>,
    /// `x-project`.
    pub project: Option<String>,
    /// `x-agent`.
    pub agent: Option<String>,
    /// `x-run-id`.
    pub run_id: Option<String>,
    /// `x-llm-model-group`.
    pub model_group: Option<String>,
    /// `x-llm-deployment`.
    pub deployment: Option<String>,
}

/// The request headers [`Attribution::from_headers`] reads, in the order of its slots.
const ATTRIBUTION_HEADERS: [&str; 11] = [
    headers::REQUEST_ID,
    "x-request-id",
    headers::CONSUMER,
    headers::TENANT,
    headers::KEY_ID,
    headers::TIER,
    "x-project",
    "x-agent",
    "x-run-id",
    headers::MODEL_GROUP,
    headers::DEPLOYMENT,
];

impl Attribution {
    /// Reads the request headers (names lowercase, as Envoy gives them).
    /// `host_request_id` is asked only when neither request-id header is there.
    pub fn from_headers<'a>(
        pairs: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
        host_request_id: impl FnOnce() -> Option<String>,
    ) -> Self {
        // One pass over the headers: the first value of each name (as a search per name
        // would find it), cleaned only when it is read.
        let mut found: [Option<&[u8]>; ATTRIBUTION_HEADERS.len()] =
            [None; ATTRIBUTION_HEADERS.len()];
        for (name, value) in pairs {
            // every name sought starts with `x-`: most headers are passed over at once
            if !name.starts_with(b"x-") {
                continue;
            }
            if let Some(slot) = ATTRIBUTION_HEADERS
                .iter()
                .position(|n| n.as_bytes() == name)
                .and_then(|i| found.get_mut(i))
            {
                slot.get_or_insert(value);
            }
        }
        let get = |i: usize| found.get(i).copied().flatten().and_then(clean_attribution);
        Attribution {
            request_id: get(0)
                .or_else(|| get(1))
                .or_else(host_request_id)
                .unwrap_or_default(),
            consumer: get(2),
            tenant: get(3),
            key_id: get(4),
            tier: get(5),
            project: get(6),
            agent: get(7),
            run_id: get(8),
            model_group: get(9),
            deployment: get(10),
        }
    }
}

/// A member of the router's record ([`RouteInfo`], its filter state `wasm.llm_route`) as this
/// plugin reads it: an empty one counts as absent, and the `x-llm-*` headers are used then.
pub(crate) fn present(member: &str) -> Option<&str> {
    (!member.is_empty()).then_some(member)
}

/// The version a record names for the router's price when it publishes none.
const UNVERSIONED: &str = "unversioned";

/// The attempts the router reports for a response of `status`: none when it made one (the
/// record then lists the one attempt this plugin saw), else the deployment of each (`tried`)
/// and which one answered (`deployment`, with `status`), at most 64. The earlier ones failed
/// (Envoy retries only failures); the router does not publish the status Envoy saw for them,
/// so theirs is 0.
pub fn router_attempts(route: &RouteInfo, status: u16) -> Vec<Attempt> {
    let count = route.attempts.clamp(1, 64);
    let mut attempts: Vec<Attempt> = (1..count)
        .map(|n| Attempt {
            deployment: route.tried.get(n as usize - 1).cloned(),
            status: 0,
        })
        .collect();
    if count > 1 {
        attempts.push(Attempt {
            deployment: present(&route.deployment).map(str::to_string),
            status,
        });
    }
    attempts
}

/// The API the client called, when the router translated the request and this plugin reads
/// another one (the first attempt's deployment's); `None` when they are the same. A name that
/// is no API's counts as absent: the record's `api` and the metric labels take only the APIs'
/// names.
pub fn client_api(route: &RouteInfo) -> Option<Api> {
    route.client_api.as_deref().and_then(Api::from_name)
}

/// The API the answering deployment speaks, for a body in `body_api` (the API of the path
/// this plugin saw) answered by a deployment of `provider` (the router's; `None` without the
/// router).
///
/// An Anthropic deployment speaks Messages; any other provider the router knows speaks the
/// OpenAI APIs, so a Messages body it answered was translated for it (on Envoy 1.40 a later
/// attempt of a plan mixing providers: its upstream filter translates the body into Chat
/// Completions and the answer back into Messages); every other body it answers natively.
/// Without the router, or for a provider it does not know, the body's own API.
pub fn provider_api(provider: Option<&str>, body_api: Api) -> Api {
    match provider {
        Some("anthropic") => Api::AnthropicMessages,
        Some("openai" | "openai-compatible" | "azure") if body_api == Api::AnthropicMessages => {
            Api::ChatCompletions
        }
        _ => body_api,
    }
}

/// What a pass superseded by an internal redirect hands to the pass that re-enters the chain
/// for the same logical request (`llm_gateway_shared::reentry`). The re-entering pass may
/// get the first pass's edited body (upstream Envoy re-sends it), which already carries the
/// injected `stream_options.include_usage`: only this says the client did not ask for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Carried {
    /// When the logical request started (the record's `ts_ms`; its duration counts from it).
    pub started_ms: u64,
    /// The gateway, not the client, asked for usage in the stream: the usage-only chunk
    /// stays hidden from the client.
    pub injected_include_usage: bool,
}

/// True for a status after which Envoy's `custom_response` may redirect the request to its
/// next deployment (a provider's 429 or 5xx, Envoy's own 503): the pass may yet turn out
/// superseded, which only its `on_log` says, so its record waits for `on_log`.
pub fn may_be_superseded(status: u16) -> bool {
    status == 429 || (500..=599).contains(&status)
}

/// How the shell handles the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseMode {
    /// Not ours to look at (unknown API): pass it through.
    PassThrough,
    /// SSE: feed chunks to [`Exchange::on_response_chunk`] as they come.
    Stream,
    /// JSON: buffer it and give the whole body to [`Exchange::on_response_body`];
    /// `hold_headers`: keep the headers until then, to add the cost headers.
    Buffer {
        /// Keep the response headers until the body is complete.
        hold_headers: bool,
    },
}

/// A JSON response is kept whole up to this size (and its headers held for the cost headers
/// only if its `content-length` is at most this); past it only its tail is kept.
pub const KEEP_WHOLE: usize = 1 << 20;
/// How much of the end of a larger body is kept (the `usage` member is at the end).
pub const KEEP_TAIL: usize = 64 << 10;

/// A JSON body collected as it passes: whole while small, then only its tail.
#[derive(Debug, Default)]
struct BodyTail {
    bytes: Vec<u8>,
    truncated: bool,
}

impl BodyTail {
    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        let bound = if self.truncated {
            2 * KEEP_TAIL
        } else {
            KEEP_WHOLE
        };
        if self.bytes.len() > bound {
            let cut = self.bytes.len() - KEEP_TAIL;
            self.bytes.drain(..cut);
            self.truncated = true;
        }
    }
}

#[derive(Debug)]
enum Response {
    None,
    /// A JSON response passing through, not held.
    Collecting(BodyTail),
    Stream(Box<ResponseStream>),
    Body {
        usage: Option<Usage>,
        model: Option<String>,
        text_tokens: u64,
        complete: bool,
    },
}

/// One exchange.
#[derive(Debug)]
pub struct Exchange {
    api: Api,
    attribution: Attribution,
    started_ms: u64,
    request: RequestInfo,
    /// The body was not inspected: it cannot say `"stream": true` ([`request::may_stream`]),
    /// so nothing in it changes the request, and `request` holds what such a body says
    /// (no stream, no `include_usage`) but its model, read from the kept body only if the
    /// record needs it ([`Exchange::request_model`]).
    deferred: bool,
    /// The model of a deferred body, once read.
    deferred_model: OnceCell<Option<String>>,
    /// Kept to estimate the prompt if no usage comes; dropped once usage arrived.
    request_body: Option<Vec<u8>>,
    /// `content-length` of the request, when it had one.
    request_length: Option<u64>,
    /// Bytes of a request body too large to keep (only its size is known).
    request_bytes: u64,
    status: u16,
    response: Response,
    first_output_ms: Option<u64>,
    finished: bool,
    /// Left by a superseded pass of the same request.
    carried: Option<Carried>,
}

impl Exchange {
    /// Starts an exchange for a request to `path`; `None` if the path is no API this plugin
    /// accounts (the shell then leaves the request alone).
    pub fn start(path: &str, attribution: Attribution, now_ms: u64) -> Option<Exchange> {
        let api = Api::from_path(path)?;
        Some(Exchange {
            api,
            attribution,
            started_ms: now_ms,
            request: RequestInfo::default(),
            deferred: false,
            deferred_model: OnceCell::new(),
            request_body: None,
            request_length: None,
            request_bytes: 0,
            status: 0,
            response: Response::None,
            first_output_ms: None,
            finished: false,
            carried: None,
        })
    }

    /// What a superseded pass hands to the next one.
    pub fn carried(&self) -> Carried {
        Carried {
            started_ms: self.started_ms,
            injected_include_usage: self.request.injected_include_usage,
        }
    }

    /// This pass re-enters the chain: it continues what `carried` started (call before the
    /// request body).
    pub fn adopt(&mut self, carried: Carried) {
        self.started_ms = carried.started_ms;
        self.carried = Some(carried);
    }

    /// After the request was read: a re-entering pass whose body already carries the
    /// `include_usage` the gateway injected in the first pass treats it as injected.
    fn apply_carried(&mut self) {
        if self.carried.is_some_and(|c| c.injected_include_usage) {
            self.request.injected_include_usage = true;
            self.request.client_include_usage = false;
        }
    }

    /// The API of the request.
    pub fn api(&self) -> Api {
        self.api
    }

    /// The body may be rewritten (so `content-length` must go while the headers are held).
    pub fn may_rewrite_body(&self, config: &UsageConfig) -> bool {
        config.inject_include_usage
            && self.api == Api::ChatCompletions
            && self.request_length.is_none_or(|n| n <= KEEP_WHOLE as u64)
    }

    /// The request's `content-length`. A chat request larger than [`KEEP_WHOLE`] is not held
    /// to inject `include_usage` (it would meet Envoy's buffer limit); its stream is counted
    /// by the gateway if the client did not ask for usage.
    pub fn set_request_length(&mut self, length: Option<u64>) {
        self.request_length = length;
    }

    /// The request headers announced a `content-length` ([`Self::set_request_length`]).
    pub fn framed(&self) -> bool {
        self.request_length.is_some()
    }

    /// A chunk of a request body that is not held: kept whole up to [`KEEP_WHOLE`] bytes,
    /// past that only counted.
    pub fn on_request_data(&mut self, chunk: &[u8]) {
        self.request_bytes = self.request_bytes.saturating_add(chunk.len() as u64);
        if self.request_bytes > KEEP_WHOLE as u64 {
            self.request_body = None;
            return;
        }
        self.request_body
            .get_or_insert_with(Vec::new)
            .extend_from_slice(chunk);
    }

    /// The end of a request body that was not held.
    pub fn on_request_end(&mut self) {
        if let Some(body) = &self.request_body {
            if !request::may_stream(body) {
                self.deferred = true;
                return;
            }
            let (info, _) = request::inspect(self.api, body, false);
            self.request = info;
            self.apply_carried();
        }
    }

    /// The whole request body; returns the body to send instead, if it changes.
    ///
    /// A body that cannot say `"stream": true` changes nothing (only a stream gets
    /// `include_usage`): its validating scan is deferred until its model is needed, which it
    /// is not when the answer names its model (the usual case).
    pub fn on_request_body(&mut self, config: &UsageConfig, body: &[u8]) -> Option<Vec<u8>> {
        self.request_body = Some(body.to_vec());
        if !request::may_stream(body) {
            self.deferred = true;
            return None;
        }
        let (info, new_body) = request::inspect(self.api, body, config.inject_include_usage);
        self.request = info;
        self.apply_carried();
        new_body
    }

    /// What the request said about itself.
    pub fn request(&self) -> RequestInfo {
        RequestInfo {
            model: self.request_model().map(str::to_owned),
            ..self.request.clone()
        }
    }

    /// The gateway added `include_usage` to the request.
    pub fn injected_include_usage(&self) -> bool {
        self.request.injected_include_usage
    }

    /// The request's model (read from a deferred body the first time it is asked for).
    pub fn request_model(&self) -> Option<&str> {
        if !self.deferred {
            return self.request.model.as_deref();
        }
        self.deferred_model
            .get_or_init(|| self.request_body.as_deref().and_then(request::model))
            .as_deref()
    }

    /// Response headers arrived.
    pub fn on_response_headers(
        &mut self,
        config: &UsageConfig,
        status: u16,
        content_type: &str,
        content_length: Option<u64>,
    ) -> ResponseMode {
        self.status = status;
        // compared without case (no lowercase copy)
        let media = content_type.split(';').next().unwrap_or_default().trim();
        let json_suffix = media
            .len()
            .checked_sub(5)
            .and_then(|at| media.as_bytes().get(at..))
            .is_some_and(|tail| tail.eq_ignore_ascii_case(b"+json"));
        if media.eq_ignore_ascii_case("text/event-stream") {
            let model = self.request_model().unwrap_or_default();
            self.response = Response::Stream(Box::new(ResponseStream::new(
                self.api,
                self.request.injected_include_usage,
                Encoding::for_model(model),
                config.max_event_bytes,
            )));
            ResponseMode::Stream
        } else if media.eq_ignore_ascii_case("application/json") || json_suffix {
            let hold_headers = config.cost_headers
                && (200..300).contains(&status)
                && content_length.is_some_and(|n| n <= KEEP_WHOLE as u64);
            if !hold_headers {
                self.response = Response::Collecting(BodyTail::default());
            }
            ResponseMode::Buffer { hold_headers }
        } else {
            ResponseMode::PassThrough
        }
    }

    /// True until a stream's first output arrived: only then does
    /// [`Exchange::on_response_chunk`] read its `now_ms` (the shell spares the clock's host
    /// call on every later chunk).
    pub fn awaits_first_output(&self) -> bool {
        self.first_output_ms.is_none()
    }

    /// A chunk of a streamed response; `now_ms` is read only while
    /// [`Exchange::awaits_first_output`].
    pub fn on_response_chunk(&mut self, chunk: &[u8], end_of_stream: bool, now_ms: u64) -> Forward {
        let Response::Stream(stream) = &mut self.response else {
            return Forward::Unchanged;
        };
        let mut pushed = stream.push(chunk);
        if end_of_stream {
            let end = stream.finish();
            pushed.first_output |= end.first_output;
            pushed.forward = match (pushed.forward, end.forward) {
                (Forward::Unchanged, Forward::Unchanged) => Forward::Unchanged,
                (Forward::Unchanged, Forward::Replace(tail)) => {
                    Forward::Replace([chunk, tail.as_slice()].concat())
                }
                (Forward::Replace(mut head), Forward::Replace(tail)) => {
                    head.extend_from_slice(&tail);
                    Forward::Replace(head)
                }
                (Forward::Replace(head), Forward::Unchanged) => Forward::Replace(head),
            };
        }
        if pushed.first_output && self.first_output_ms.is_none() {
            self.first_output_ms = Some(now_ms);
        }
        if stream.usage_is_complete() {
            self.request_body = None;
        }
        pushed.forward
    }

    /// A chunk of a JSON response that is not held: kept (whole while small, else its tail),
    /// and passed on unchanged.
    pub fn on_response_data(&mut self, chunk: &[u8]) {
        if let Response::Collecting(body) = &mut self.response {
            body.push(chunk);
        }
    }

    /// The end of a JSON response that was not held (or the log of one that never ended).
    pub fn on_response_end(
        &mut self,
        config: &UsageConfig,
        route: Option<&RouteInfo>,
        complete: bool,
    ) {
        let Response::Collecting(body) = std::mem::replace(&mut self.response, Response::None)
        else {
            return;
        };
        if body.truncated {
            self.response = Response::Body {
                usage: usage::from_body_tail(self.api, &body.bytes),
                model: None,
                text_tokens: 0,
                complete,
            };
        } else {
            let _ = self.on_response_body(config, route, &body.bytes, complete);
        }
    }

    /// The whole body of a buffered (JSON) response; `complete` false if it was cut; `route`
    /// as for [`Exchange::finish`]. Returns the headers to add when they are still held.
    pub fn on_response_body(
        &mut self,
        config: &UsageConfig,
        route: Option<&RouteInfo>,
        body: &[u8],
        complete: bool,
    ) -> Vec<(String, String)> {
        let found = usage::from_response_body(self.api, body);
        let (usage, model) = match found {
            Some((usage, model)) => (Some(usage), model),
            None => (None, None),
        };
        let text_tokens = if usage.is_none() {
            let model = self.request_model().unwrap_or_default();
            count_tokens(
                Encoding::for_model(model),
                &request::response_text(self.api, body),
            )
        } else {
            0
        };
        self.response = Response::Body {
            usage,
            model,
            text_tokens,
            complete,
        };
        if !config.cost_headers {
            return Vec::new();
        }
        let (usage, source) = self.final_usage();
        let mut out = vec![
            (
                "x-llm-prompt-tokens".to_string(),
                usage.prompt_tokens.to_string(),
            ),
            (
                "x-llm-completion-tokens".to_string(),
                usage.completion_tokens.to_string(),
            ),
            (
                "x-llm-cached-tokens".to_string(),
                usage.cached_prompt_tokens.to_string(),
            ),
            (
                "x-llm-usage-source".to_string(),
                match source {
                    UsageSource::Upstream => "upstream",
                    UsageSource::Estimated => "estimated",
                }
                .to_string(),
            ),
        ];
        if let Some((price, version)) = self.price(config, route) {
            let cost = pricing::cost(price, version, &usage);
            out.push(("x-llm-cost".to_string(), {
                let mut value = pricing::format_nano(cost.nano);
                value.push(' ');
                value.push_str(&cost.currency);
                value
            }));
            out.push(("x-llm-price-version".to_string(), cost.version));
        }
        out
    }

    fn model(&self) -> Option<&str> {
        let upstream = match &self.response {
            Response::Stream(stream) => stream.model(),
            Response::Body { model, .. } => model.as_deref(),
            Response::None | Response::Collecting(_) => None,
        };
        upstream.or_else(|| self.request_model())
    }

    /// The price of the request and the version of its list: the router's, else this
    /// plugin's table's for the deployment, the model group or the model.
    fn price<'c>(
        &self,
        config: &'c UsageConfig,
        route: Option<&'c RouteInfo>,
    ) -> Option<(&'c Price, &'c str)> {
        if let Some((price, route)) = route.and_then(|r| Some((r.price.as_ref()?, r))) {
            return Some((price, route.price_version.as_deref().unwrap_or(UNVERSIONED)));
        }
        let a = &self.attribution;
        config
            .price_for(
                route
                    .and_then(|r| present(&r.deployment))
                    .or(a.deployment.as_deref()),
                route
                    .and_then(|r| present(&r.model_group))
                    .or(a.model_group.as_deref()),
                self.model(),
            )
            .map(|listed| (&listed.price, listed.version.as_str()))
    }

    fn estimated_prompt(&self) -> u64 {
        let Some(body) = &self.request_body else {
            // too large to keep: a quarter of its bytes
            return self.request_bytes.div_ceil(4);
        };
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
            return 0;
        };
        let model = self.request_model().unwrap_or_default();
        estimate_prompt_tokens(self.api, &value, Encoding::for_model(model))
    }

    /// The usage to record and where it comes from.
    fn final_usage(&mut self) -> (Usage, UsageSource) {
        let (upstream, complete) = match &self.response {
            Response::Stream(stream) => (stream.usage(), stream.usage_is_complete()),
            Response::Body { usage, .. } => (*usage, true),
            Response::None | Response::Collecting(_) => (None, false),
        };
        if let (Some(usage), true) = (upstream, complete) {
            return (usage, UsageSource::Upstream);
        }
        if self.status >= 400 {
            // An error answer bills nothing, and says so by sending no usage.
            return (Usage::default(), UsageSource::Upstream);
        }
        // Only now, with no usage from the upstream, is the text counted (and the tokenizer
        // built, the first time in this VM).
        let completion = match &self.response {
            Response::Stream(stream) => stream.streamed_tokens(),
            Response::Body { text_tokens, .. } => *text_tokens,
            Response::None | Response::Collecting(_) => 0,
        };
        let usage = match upstream {
            // Anthropic cut between message_start and message_delta: the input (and cache)
            // counts are the provider's, the output is counted here
            Some(partial) => Usage {
                completion_tokens: partial.completion_tokens.max(completion),
                ..partial
            },
            None => Usage {
                prompt_tokens: self.estimated_prompt(),
                completion_tokens: completion,
                ..Usage::default()
            },
        };
        (usage, UsageSource::Estimated)
    }

    /// The response status seen so far (0: none yet).
    pub fn status(&self) -> u16 {
        self.status
    }

    /// True once [`Exchange::finish`] built the record.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Builds the record, once: `None` if it was built already. `route`: what the router
    /// published about the request (`None` without the router: the `x-llm-*` headers and this
    /// plugin's price table are read). `complete` says whether the response reached its end
    /// (false: cut or aborted).
    pub fn finish(
        &mut self,
        config: &UsageConfig,
        route: Option<&RouteInfo>,
        complete: bool,
        now_ms: u64,
    ) -> Option<Record> {
        if self.finished {
            return None;
        }
        self.finished = true;
        if matches!(self.response, Response::Collecting(_)) {
            self.on_response_end(config, route, false);
        }
        let complete = complete
            && match &self.response {
                Response::Body { complete, .. } => *complete,
                _ => true,
            };
        let (usage, usage_source) = self.final_usage();
        let price = self.price(config, route);
        let cost = price.map(|(price, version)| pricing::cost(price, version, &usage));
        let routed = |member: fn(&RouteInfo) -> &str| {
            route.and_then(|r| present(member(r))).map(str::to_string)
        };
        let a = &self.attribution;
        let deployment = routed(|r| &r.deployment).or_else(|| a.deployment.clone());
        let mut attempts = route
            .map(|r| router_attempts(r, self.status))
            .unwrap_or_default();
        if attempts.is_empty() {
            attempts.push(Attempt {
                deployment: deployment.clone(),
                status: self.status,
            });
        }
        let client_api = route.and_then(client_api);
        let provider = route.and_then(|r| present(&r.provider));
        let record = Record {
            request_id: routed(|r| &r.request_id).unwrap_or_else(|| a.request_id.clone()),
            ts_ms: self.started_ms,
            consumer: a.consumer.clone(),
            tenant: a.tenant.clone(),
            key_id: a.key_id.clone(),
            tier: a.tier.clone(),
            project: a.project.clone(),
            agent: a.agent.clone(),
            run_id: a.run_id.clone(),
            model_group: routed(|r| &r.model_group).or_else(|| a.model_group.clone()),
            deployment,
            model: self.model().map(str::to_owned),
            // usage is read in the body's API (the answer this plugin sees is in it); the
            // labels name the client's and the deployment's
            api: client_api.unwrap_or(self.api).name().to_string(),
            provider_api: Some(provider_api(provider, self.api).name().to_string()),
            stream: matches!(self.response, Response::Stream(_)) || self.request.stream,
            status: self.status,
            complete,
            attempts,
            usage_source,
            usage: UsageFields::from(usage),
            cost_nano: cost.as_ref().map(|c| c.nano),
            currency: cost.as_ref().map(|c| c.currency.clone()),
            price_version: cost.map(|c| c.version),
            ttft_ms: self
                .first_output_ms
                .map(|t| t.saturating_sub(self.started_ms)),
            duration_ms: now_ms.saturating_sub(self.started_ms),
        };
        self.request_body = None;
        Some(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_document;
    use serde_json::json;

    fn config(extra: serde_json::Value) -> UsageConfig {
        let mut doc = json!({
            "price_version": "2026-11",
            "cost_headers": true,
            "prices": {"east": {"input": "0.30", "cached_input": "0.006", "output": "1.20"}}
        });
        if let (Some(d), Some(e)) = (doc.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                d.insert(k.clone(), v.clone());
            }
        }
        parse_document(doc.to_string().as_bytes())
            .unwrap()
            .global()
            .unwrap()
            .clone()
    }

    fn headers<'a>(pairs: &[(&'a str, &'a str)]) -> Vec<(&'a [u8], &'a [u8])> {
        pairs
            .iter()
            .map(|(n, v)| (n.as_bytes(), v.as_bytes()))
            .collect()
    }

    fn attribution() -> Attribution {
        Attribution::from_headers(
            headers(&[
                ("x-llm-consumer", "team-a"),
                ("x-llm-tenant", "acme"),
                ("x-llm-key-id", "team-a-prod"),
                ("x-llm-tier", "pro"),
                ("x-project", "search"),
                ("x-agent", "planner"),
                ("x-run-id", "run-7"),
                ("x-llm-model-group", "fast"),
                ("x-llm-deployment", "east"),
                ("x-request-id", "req-1"),
            ]),
            || Some("host-id".into()),
        )
    }

    /// The router's record of a request that went to `deployment` after `attempts` attempts
    /// (`tried` in order), every other member empty or absent.
    fn routed(deployment: &str, attempts: u32, tried: &[&str]) -> RouteInfo {
        RouteInfo {
            request_id: String::new(),
            model_group: String::new(),
            deployment: deployment.into(),
            model: String::new(),
            provider: String::new(),
            price: None,
            price_version: None,
            route_version: String::new(),
            attempts,
            tried: tried.iter().map(|name| name.to_string()).collect(),
            price_ceiling: None,
            client_api: None,
        }
    }

    #[test]
    fn attribution_headers_all_start_with_x_dash() {
        // from_headers passes over any other header at once
        for name in ATTRIBUTION_HEADERS {
            assert!(name.starts_with("x-"), "{name}");
        }
    }

    #[test]
    fn attribution_takes_the_first_value_of_each_header() {
        let pairs = headers(&[
            ("content-type", "application/json"),
            ("x-llm-tenant", "\r\n"),
            ("x-llm-tenant", "second"),
            ("x-request-id", "rid"),
            ("x-run-id", "r1"),
            ("x-run-id", "r2"),
        ]);
        let a = Attribution::from_headers(pairs, || Some("host".into()));
        // a first value that cleans to nothing is not replaced by a later one
        assert_eq!(a.tenant, None);
        assert_eq!(a.request_id, "rid");
        assert_eq!(a.run_id.as_deref(), Some("r1"));
        assert_eq!(a.consumer, None);
    }

    #[test]
    fn non_streaming_known_case_with_headers() {
        let config = config(json!({}));
        let route: Option<&RouteInfo> = None;
        let mut ex = Exchange::start("/v1/chat/completions", attribution(), 1_000).unwrap();
        assert!(ex
            .on_request_body(&config, br#"{"model":"gpt-4o","messages":[]}"#)
            .is_none());
        assert_eq!(
            ex.on_response_headers(&config, 200, "application/json", Some(300)),
            ResponseMode::Buffer { hold_headers: true }
        );
        let body = br#"{"model":"gpt-4o-2024","choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":100,"prompt_tokens_details":{"cached_tokens":600}}}"#;
        let added = ex.on_response_body(&config, route, body, true);
        assert!(
            added.contains(&("x-llm-cost".into(), "0.0002436 USD".into())),
            "{added:?}"
        );
        assert!(added.contains(&("x-llm-price-version".into(), "2026-11".into())));
        let record = ex.finish(&config, route, true, 1_500).unwrap();
        assert_eq!(record.cost_nano, Some(243_600));
        assert_eq!(record.usage.cached_prompt_tokens, 600);
        assert_eq!(record.usage_source, UsageSource::Upstream);
        assert_eq!(record.request_id, "req-1");
        assert_eq!(record.project.as_deref(), Some("search"));
        assert_eq!(record.key_id.as_deref(), Some("team-a-prod"));
        assert_eq!(record.tier.as_deref(), Some("pro"));
        assert_eq!(record.model.as_deref(), Some("gpt-4o-2024"));
        assert_eq!(record.duration_ms, 500);
        assert_eq!(
            record.attempts,
            vec![Attempt {
                deployment: Some("east".into()),
                status: 200
            }]
        );
        assert!(
            ex.finish(&config, route, true, 2_000).is_none(),
            "one record only"
        );
    }

    #[test]
    fn cut_stream_is_estimated() {
        let config = config(json!({}));
        let route: Option<&RouteInfo> = None;
        let mut ex = Exchange::start("/v1/chat/completions", attribution(), 0).unwrap();
        let new = ex
            .on_request_body(
                &config,
                br#"{"model":"claude-x","stream":true,"messages":[{"role":"user","content":"Say hello"}]}"#,
            )
            .unwrap();
        assert!(String::from_utf8(new).unwrap().contains("include_usage"));
        assert_eq!(
            ex.on_response_headers(&config, 200, "text/event-stream; charset=utf-8", None),
            ResponseMode::Stream
        );
        ex.on_response_chunk(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"abcdefgh\"}}]}\n\ndata: {\"cho",
            false,
            40,
        );
        let record = ex.finish(&config, route, false, 90).unwrap();
        assert_eq!(record.usage_source, UsageSource::Estimated);
        assert_eq!(record.usage.prompt_tokens, 3 + 4);
        assert_eq!(record.usage.completion_tokens, 2);
        assert_eq!(record.ttft_ms, Some(40));
        assert!(!record.complete && record.stream);
        // 7 × 0.30 + 2 × 1.20 per million = 4.5 micro-units
        assert_eq!(record.cost_nano, Some(4_500));
    }

    /// The usage chunk of a stream: empty choices, only `usage`.
    const USAGE_CHUNK: &[u8] = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n";

    /// Streams `chunk` then `[DONE]` through a fresh response of `ex`; returns what the
    /// client gets.
    fn stream_to_client(ex: &mut Exchange, config: &UsageConfig) -> Vec<u8> {
        assert_eq!(
            ex.on_response_headers(config, 200, "text/event-stream", None),
            ResponseMode::Stream
        );
        let mut out = Vec::new();
        let content = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
        for (chunk, end) in [
            (&content[..], false),
            (USAGE_CHUNK, false),
            (b"data: [DONE]\n\n", true),
        ] {
            match ex.on_response_chunk(chunk, end, 10) {
                Forward::Unchanged => out.extend_from_slice(chunk),
                Forward::Replace(bytes) => out.extend_from_slice(&bytes),
            }
        }
        out
    }

    /// Upstream Envoy re-sends the first pass's edited body: it carries the injected
    /// `include_usage`, but the client never asked for usage, so the usage chunk stays hidden;
    /// the record starts at the first pass.
    #[test]
    fn a_reentering_pass_keeps_the_usage_chunk_hidden_from_a_client_that_did_not_ask() {
        let config = config(json!({}));
        let route: Option<&RouteInfo> = None;
        let client = br#"{"model":"m","stream":true,"messages":[]}"#;
        let mut first = Exchange::start("/v1/chat/completions", attribution(), 1_000).unwrap();
        let edited = first.on_request_body(&config, client).unwrap();
        assert!(first.injected_include_usage());
        let carried = first.carried();
        assert_eq!(
            carried,
            Carried {
                started_ms: 1_000,
                injected_include_usage: true
            }
        );

        for body in [edited.as_slice(), client.as_slice()] {
            let mut again = Exchange::start("/v1/chat/completions", attribution(), 5_000).unwrap();
            again.adopt(carried);
            let _ = again.on_request_body(&config, body);
            assert!(again.injected_include_usage());
            assert!(!again.request().client_include_usage);
            let out = stream_to_client(&mut again, &config);
            assert!(
                !String::from_utf8_lossy(&out).contains("usage"),
                "{}",
                String::from_utf8_lossy(&out)
            );
            let record = again.finish(&config, route, true, 6_000).unwrap();
            assert_eq!(record.usage.total_tokens, 7);
            assert_eq!(record.ts_ms, 1_000, "the logical request's start");
            assert_eq!(record.duration_ms, 5_000);
        }

        // without the carried state the same edited body looks like the client's own ask
        let mut fresh = Exchange::start("/v1/chat/completions", attribution(), 5_000).unwrap();
        let _ = fresh.on_request_body(&config, &edited);
        assert!(!fresh.injected_include_usage());
        let out = stream_to_client(&mut fresh, &config);
        assert!(String::from_utf8_lossy(&out).contains("usage"));
    }

    /// A client that asked for usage itself keeps seeing it on the re-entering pass.
    #[test]
    fn a_reentering_pass_shows_usage_to_a_client_that_asked() {
        let config = config(json!({}));
        let client =
            br#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#;
        let mut first = Exchange::start("/v1/chat/completions", attribution(), 0).unwrap();
        assert!(first.on_request_body(&config, client).is_none());
        let carried = first.carried();
        assert!(!carried.injected_include_usage);
        let mut again = Exchange::start("/v1/chat/completions", attribution(), 0).unwrap();
        again.adopt(carried);
        let _ = again.on_request_body(&config, client);
        assert!(again.request().client_include_usage);
        let out = stream_to_client(&mut again, &config);
        assert!(String::from_utf8_lossy(&out).contains("usage"));
    }

    #[test]
    fn only_retryable_failures_may_be_superseded() {
        for status in [429, 500, 502, 503, 504, 599] {
            assert!(may_be_superseded(status), "{status}");
        }
        for status in [0, 200, 204, 400, 401, 403, 404, 413, 600] {
            assert!(!may_be_superseded(status), "{status}");
        }
    }

    #[test]
    fn router_price_and_attempts_win() {
        let config = config(json!({}));
        let route = RouteInfo {
            price: config
                .price_for(Some("east"), None, None)
                .map(|listed| listed.price.clone()),
            ..routed("west", 2, &["east", "west"])
        };
        let route = Some(&route);
        let mut ex = Exchange::start("/v1/embeddings", attribution(), 0).unwrap();
        ex.on_request_body(&config, br#"{"input":"abcd"}"#);
        ex.on_response_headers(&config, 200, "application/json", Some(100));
        ex.on_response_body(
            &config,
            route,
            br#"{"usage":{"prompt_tokens":1000000,"total_tokens":1000000}}"#,
            true,
        );
        let record = ex.finish(&config, route, true, 2).unwrap();
        assert_eq!(record.deployment.as_deref(), Some("west"));
        assert_eq!(
            record.attempts,
            [
                Attempt {
                    deployment: Some("east".into()),
                    status: 0
                },
                Attempt {
                    deployment: Some("west".into()),
                    status: 200
                }
            ]
        );
        assert_eq!(record.cost_nano, Some(300_000_000));
        assert_eq!(record.price_version.as_deref(), Some("unversioned"));
    }

    #[test]
    fn error_answers_bill_nothing_and_unknown_paths_are_ignored() {
        let config = config(json!({}));
        let route: Option<&RouteInfo> = None;
        let mut ex = Exchange::start("/v1/messages", attribution(), 0).unwrap();
        ex.on_request_body(&config, br#"{"messages":[{"role":"user","content":"x"}]}"#);
        assert_eq!(
            ex.on_response_headers(&config, 429, "application/json", None),
            ResponseMode::Buffer {
                hold_headers: false
            }
        );
        ex.on_response_body(&config, route, br#"{"error":{}}"#, true);
        let record = ex.finish(&config, route, true, 2).unwrap();
        assert_eq!(record.usage, UsageFields::default());
        assert_eq!(record.status, 429);
        assert!(Exchange::start("/v1/models", attribution(), 0).is_none());
    }

    #[test]
    fn anthropic_cut_before_message_delta_keeps_the_providers_input() {
        let config = config(json!({}));
        let route: Option<&RouteInfo> = None;
        let mut ex = Exchange::start("/v1/messages", attribution(), 0).unwrap();
        ex.on_request_body(
            &config,
            br#"{"model":"claude-x","stream":true,"messages":[{"role":"user","content":"Say hello"}]}"#,
        );
        ex.on_response_headers(&config, 200, "text/event-stream", None);
        ex.on_response_chunk(
            b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12,\"cache_read_input_tokens\":1000,\"output_tokens\":1}}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"abcdefghijkl\"}}\n\n",
            false,
            3,
        );
        let record = ex.finish(&config, route, false, 9).unwrap();
        assert_eq!(record.usage_source, UsageSource::Estimated);
        assert_eq!(
            record.usage.prompt_tokens, 1012,
            "the provider's input, not an estimate"
        );
        assert_eq!(record.usage.cached_prompt_tokens, 1000);
        assert_eq!(
            record.usage.completion_tokens, 3,
            "12 chars counted, not message_start's 1"
        );
    }

    #[test]
    fn router_state_gives_deployment_price_and_attempts() {
        let json = br#"{"request_id":"r","model_group":"fast","deployment":"west","model":"gpt-4o-mini","provider":"openai","price":{"currency":"USD","input":300000,"output":1200000,"cached_input":6000},"price_version":"2026-01","route_version":"v7","attempts":2,"tried":["east","west"]}"#;
        let route = RouteInfo::from_json(json).unwrap();
        let attempts = router_attempts(&route, 200);
        assert_eq!(attempts.len(), 2);
        assert_eq!(attempts[0].deployment.as_deref(), Some("east"));
        assert_eq!(attempts[0].status, 0);
        assert_eq!(attempts[1].deployment.as_deref(), Some("west"));
        assert_eq!(attempts[1].status, 200);
        let price = route.price.clone().unwrap();
        assert_eq!(
            (price.input, price.cached_input, price.output),
            (300_000_000, Some(6_000_000), 1_200_000_000)
        );
        let config = config(json!({"prices": {}}));
        let mut ex = Exchange::start("/v1/chat/completions", attribution(), 0).unwrap();
        ex.on_response_headers(&config, 200, "application/json", Some(100));
        ex.on_response_body(&config, Some(&route), br#"{"usage":{"prompt_tokens":1000,"completion_tokens":100,"prompt_tokens_details":{"cached_tokens":600}}}"#, true);
        let record = ex.finish(&config, Some(&route), true, 2).unwrap();
        assert_eq!(record.cost_nano, Some(243_600));
        assert_eq!(record.price_version.as_deref(), Some("2026-01"));
        assert_eq!(record.model_group.as_deref(), Some("fast"));
        assert_eq!(record.request_id, "r");
        assert_eq!(record.deployment.as_deref(), Some("west"));
        assert_eq!(record.attempts, attempts);
        // one attempt: the router lists none, the record the one this plugin saw
        let single = routed("east", 1, &["east"]);
        assert!(router_attempts(&single, 200).is_empty());
        // an attempt count past what the router writes is bounded, a missing name is none
        let many = routed("", u32::MAX, &["a"]);
        let attempts = router_attempts(&many, 502);
        assert_eq!(attempts.len(), 64);
        assert_eq!(attempts[0].deployment.as_deref(), Some("a"));
        assert!(attempts[1..].iter().all(|a| a.deployment.is_none()));
        assert_eq!(attempts[63].status, 502);
    }

    #[test]
    fn empty_router_members_give_way_to_the_headers() {
        let config = config(json!({}));
        let route = routed("", 1, &[]);
        let mut ex = Exchange::start("/v1/embeddings", attribution(), 0).unwrap();
        ex.on_response_headers(&config, 200, "application/json", Some(100));
        ex.on_response_body(
            &config,
            Some(&route),
            br#"{"usage":{"prompt_tokens":1000000,"total_tokens":1000000}}"#,
            true,
        );
        let record = ex.finish(&config, Some(&route), true, 2).unwrap();
        let headers_only = {
            let mut ex = Exchange::start("/v1/embeddings", attribution(), 0).unwrap();
            ex.on_response_headers(&config, 200, "application/json", Some(100));
            ex.on_response_body(
                &config,
                None,
                br#"{"usage":{"prompt_tokens":1000000,"total_tokens":1000000}}"#,
                true,
            );
            ex.finish(&config, None, true, 2).unwrap()
        };
        assert_eq!(record, headers_only);
        assert_eq!(record.deployment.as_deref(), Some("east"));
        assert_eq!(record.cost_nano, Some(300_000_000));
    }

    #[test]
    fn the_deployment_speaks_messages_if_anthropic_else_the_openai_apis() {
        use Api::{AnthropicMessages as Messages, ChatCompletions as Chat, Embeddings, Responses};
        for (provider, body_api, expected) in [
            // an Anthropic deployment: Messages, natively or translated from Chat Completions
            (Some("anthropic"), Messages, Messages),
            (Some("anthropic"), Chat, Messages),
            // another provider: a Messages body was translated into Chat Completions for it
            (Some("openai"), Messages, Chat),
            (Some("openai-compatible"), Messages, Chat),
            (Some("azure"), Messages, Chat),
            // and any other body it answers as it is
            (Some("openai"), Chat, Chat),
            (Some("openai"), Responses, Responses),
            (Some("openai-compatible"), Embeddings, Embeddings),
            (Some("azure"), Chat, Chat),
            // a provider the router does not know, or no router: the body's API
            (Some("bedrock"), Messages, Messages),
            (Some("bedrock"), Chat, Chat),
            (None, Messages, Messages),
            (None, Chat, Chat),
            (None, Responses, Responses),
            (None, Embeddings, Embeddings),
        ] {
            assert_eq!(
                provider_api(provider, body_api),
                expected,
                "{provider:?} {body_api:?}"
            );
        }
    }

    #[test]
    fn router_state_gives_the_clients_api_when_it_translated() {
        let with = |member: &str| {
            let json = format!(
                r#"{{"request_id":"r","model_group":"fast","deployment":"claude","model":"m","provider":"anthropic","route_version":"v","attempts":1{member}}}"#
            );
            client_api(&RouteInfo::from_json(json.as_bytes()).unwrap())
        };
        assert_eq!(
            with(r#","client_api":"chat.completions""#),
            Some(Api::ChatCompletions)
        );
        assert_eq!(
            with(r#","client_api":"messages""#),
            Some(Api::AnthropicMessages)
        );
        assert_eq!(with(""), None);
        assert_eq!(with(r#","client_api":null"#), None);
        // a name that is no API's is not recorded
        assert_eq!(with(r#","client_api":"chat""#), None);
    }

    #[test]
    fn big_json_bodies_pass_through_and_keep_their_usage() {
        let config = config(json!({}));
        let route: Option<&RouteInfo> = None;
        let mut ex = Exchange::start("/v1/embeddings", attribution(), 0).unwrap();
        ex.on_request_body(
            &config,
            br#"{"model":"text-embedding-3-small","input":"x"}"#,
        );
        // no content-length, or too large: the headers are not held
        assert_eq!(
            ex.on_response_headers(&config, 200, "application/json", Some(5 << 20)),
            ResponseMode::Buffer {
                hold_headers: false
            }
        );
        let vector = format!("[{}0.5]", "0.123456,".repeat(100_000));
        let body = format!(
            r#"{{"object":"list","data":[{{"embedding":{vector}}},{{"embedding":{vector}}}],"model":"e","usage":{{"prompt_tokens":1000000,"total_tokens":1000000}}}}"#
        );
        assert!(body.len() > KEEP_WHOLE + KEEP_TAIL);
        for chunk in body.as_bytes().chunks(16 * 1024) {
            ex.on_response_data(chunk);
        }
        ex.on_response_end(&config, route, true);
        let record = ex.finish(&config, route, true, 1).unwrap();
        assert_eq!(record.usage.prompt_tokens, 1_000_000);
        assert_eq!(record.usage_source, UsageSource::Upstream);
        assert_eq!(record.cost_nano, Some(300_000_000));
        assert!(record.complete);

        // a small one cut before its end: estimated from the request, marked incomplete
        let mut ex = Exchange::start("/v1/chat/completions", attribution(), 0).unwrap();
        ex.on_request_body(
            &config,
            br#"{"model":"x","messages":[{"role":"user","content":"abcd"}]}"#,
        );
        ex.on_response_headers(&config, 200, "application/json", None);
        ex.on_response_data(br#"{"choices":[{"message":{"content":"hel"#);
        let record = ex.finish(&config, route, false, 1).unwrap();
        assert_eq!(record.usage_source, UsageSource::Estimated);
        assert_eq!(record.usage.prompt_tokens, 1 + 4);
        assert!(!record.complete);
    }

    #[test]
    fn large_requests_are_not_held_and_estimated_from_their_size() {
        let config = config(json!({}));
        let route: Option<&RouteInfo> = None;
        let mut ex = Exchange::start("/v1/chat/completions", attribution(), 0).unwrap();
        assert!(ex.may_rewrite_body(&config));
        ex.set_request_length(Some(3 << 20));
        assert!(!ex.may_rewrite_body(&config));
        let chunk = vec![b' '; 1 << 20];
        for _ in 0..3 {
            ex.on_request_data(&chunk);
        }
        ex.on_request_end();
        ex.on_response_headers(&config, 200, "text/event-stream", None);
        ex.on_response_chunk(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"abcd\"}}]}\n\n",
            true,
            1,
        );
        let record = ex.finish(&config, route, true, 2).unwrap();
        assert_eq!(record.usage.prompt_tokens, (3 << 20) / 4);
        assert_eq!(record.usage.completion_tokens, 1);

        // a small one passing unheld is inspected at its end
        let mut ex = Exchange::start("/v1/messages", attribution(), 0).unwrap();
        ex.on_request_data(br#"{"model":"claude","stream":tr"#);
        ex.on_request_data(br#"ue,"messages":[{"role":"user","content":"abcd"}]}"#);
        ex.on_request_end();
        assert!(ex.request().stream);
        assert_eq!(ex.request().model.as_deref(), Some("claude"));
    }

    #[test]
    fn a_body_that_cannot_stream_is_scanned_only_if_its_model_is_needed() {
        let config = config(json!({}));
        let route: Option<&RouteInfo> = None;
        let body =
            br#"{"model":"gpt-4o","stream":false,"messages":[{"role":"user","content":"abcd"}]}"#;
        for (answer, scanned) in [
            (
                &br#"{"model":"gpt-4o-2024","usage":{"prompt_tokens":10,"completion_tokens":2}}"#[..],
                false,
            ),
            (
                br#"{"usage":{"prompt_tokens":10,"completion_tokens":2}}"#,
                true,
            ),
        ] {
            let mut ex = Exchange::start("/v1/chat/completions", attribution(), 0).unwrap();
            assert!(ex.on_request_body(&config, body).is_none());
            assert!(ex.deferred && !ex.injected_include_usage());
            ex.on_response_headers(&config, 200, "application/json", Some(100));
            ex.on_response_body(&config, route, answer, true);
            let record = ex.finish(&config, route, true, 1).unwrap();
            assert_eq!(ex.deferred_model.get().is_some(), scanned);
            let expected = if scanned { "gpt-4o" } else { "gpt-4o-2024" };
            assert_eq!(record.model.as_deref(), Some(expected));
            assert!(!record.stream);
        }
        // a streaming answer reads the model (its tokenizer) when the headers come
        let mut ex = Exchange::start("/v1/chat/completions", attribution(), 0).unwrap();
        ex.on_request_body(&config, body);
        ex.on_response_headers(&config, 200, "text/event-stream", None);
        assert_eq!(ex.request_model(), Some("gpt-4o"));
        assert_eq!(ex.request().model.as_deref(), Some("gpt-4o"));
    }

    #[test]
    fn request_id_falls_back_to_the_host() {
        let a = Attribution::from_headers(headers(&[]), || Some("h".into()));
        assert_eq!(a.request_id, "h");
        assert_eq!(a.tenant, None);
    }
}
