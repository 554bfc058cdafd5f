//! The core driven natively: a fake request ([`FakeView`]) that applies the effects the way
//! the host would, a fake shared-data store with CAS and injected mismatches, a fake clock.

use super::breakers::{key, CAS_ROUNDS};
use super::*;
use crate::breaker::{Phase, State};
use crate::config::parse_document;
use llm_gateway_shared::request::RequestHead;
use llm_gateway_shared::route_info::{Alternative, RouteInfo};
use std::cell::Cell;

pub(super) const DOC: &str = r#"{
    "version": "v1",
    "breaker": {"consecutive_failures": 2, "failure_rate_percent": 0, "cooldown_ms": 1000},
    "deployments": [
        {"name": "a", "cluster": "c-a", "model": "gpt-a", "provider": "openai", "credential": "ka"},
        {"name": "b", "cluster": "c-b", "model": "gpt-b", "provider": "openai", "credential": "kb"},
        {"name": "claude", "cluster": "c-claude", "model": "claude-x", "provider": "anthropic",
         "credential": "kc"},
        {"name": "mini", "cluster": "c-mini", "model": "gpt-mini", "provider": "openai",
         "credential": "km"}
    ],
    "groups": [
        {"name": "fast", "deployments": [{"deployment": "a"}, {"deployment": "b"}]},
        {"name": "solo", "deployments": [{"deployment": "a"}]},
        {"name": "sonnet", "deployments": [{"deployment": "claude"}]},
        {"name": "smart", "deployments": [{"deployment": "b"}], "budget_fallback": "cheap"},
        {"name": "cheap", "deployments": [{"deployment": "mini"}]}
    ]
}"#;

pub(super) const CHAT: &str = r#"{"model":"fast","messages":[{"role":"user","content":"hi"}]}"#;

// ---------------------------------------------------------------------------------------
// Fakes

#[derive(Default)]
pub(super) struct FakeView {
    pub(super) request: RefCell<Vec<(String, Vec<u8>)>>,
    pub(super) response: RefCell<Vec<(String, Vec<u8>)>>,
    properties: RefCell<HashMap<String, Vec<u8>>>,
    pub(super) request_body: RefCell<Vec<u8>>,
    pub(super) response_body: RefCell<Vec<u8>>,
    now_nanos: Cell<u64>,
    /// Response-body reads (one host call each).
    body_reads: Cell<usize>,
    clock_reads: Cell<usize>,
}

fn find(map: &[(String, Vec<u8>)], name: &str) -> Option<Vec<u8>> {
    map.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
}

fn put(map: &mut Vec<(String, Vec<u8>)>, name: &str, value: &[u8]) {
    map.retain(|(n, _)| n != name);
    map.push((name.to_string(), value.to_vec()));
}

impl View for FakeView {
    fn request_header(&self, name: &str) -> Result<Option<Vec<u8>>, ReadError> {
        Ok(find(&self.request.borrow(), name))
    }
    fn request_headers(&self) -> Result<RequestHead, ReadError> {
        Ok(RequestHead::new(self.request.borrow().clone()))
    }
    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        find(&self.response.borrow(), name)
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        self.properties.borrow().get(&path.join(".")).cloned()
    }
    fn request_body(&self, size: usize) -> Result<Vec<u8>, ReadError> {
        let body = self.request_body.borrow();
        Ok(body
            .get(..size.min(body.len()))
            .unwrap_or_default()
            .to_vec())
    }
    fn response_body(&self, size: usize) -> Option<Vec<u8>> {
        self.body_reads.set(self.body_reads.get() + 1);
        let body = self.response_body.borrow();
        Some(
            body.get(..size.min(body.len()))
                .unwrap_or_default()
                .to_vec(),
        )
    }
    fn route_name(&self) -> String {
        String::new()
    }
    fn cluster_name(&self) -> String {
        String::new()
    }
    fn now_nanos(&self) -> u64 {
        self.clock_reads.set(self.clock_reads.get() + 1);
        self.now_nanos.get()
    }
}

impl FakeView {
    pub(super) fn request(path: &str, headers: &[(&str, &str)], body: &str) -> Self {
        let view = FakeView::default();
        {
            let mut request = view.request.borrow_mut();
            put(&mut request, ":path", path.as_bytes());
            put(&mut request, ":method", b"POST");
            for (name, value) in headers {
                put(&mut request, name, value.as_bytes());
            }
        }
        *view.request_body.borrow_mut() = body.as_bytes().to_vec();
        view
    }
    pub(super) fn set_ms(&self, ms: u64) {
        self.now_nanos.set(ms * 1_000_000);
    }
    pub(super) fn header(&self, name: &str) -> Option<String> {
        find(&self.request.borrow(), name).and_then(|v| String::from_utf8(v).ok())
    }
    pub(super) fn response_header_text(&self, name: &str) -> Option<String> {
        find(&self.response.borrow(), name).and_then(|v| String::from_utf8(v).ok())
    }
    pub(super) fn prop(&self, name: &str) -> Option<String> {
        self.properties
            .borrow()
            .get(name)
            .and_then(|v| String::from_utf8(v.clone()).ok())
    }
    pub(super) fn set_prop(&self, name: &str, value: &[u8]) {
        self.properties
            .borrow_mut()
            .insert(name.to_string(), value.to_vec());
    }
    pub(super) fn respond(&self, status: &str, headers: &[(&str, &str)]) {
        let mut response = self.response.borrow_mut();
        response.clear();
        put(&mut response, ":status", status.as_bytes());
        for (name, value) in headers {
            put(&mut response, name, value.as_bytes());
        }
    }
    pub(super) fn route(&self) -> RouteInfo {
        RouteInfo::from_json(&self.properties.borrow()["llm_route"]).expect("llm_route")
    }

    fn remove(&self, map: Map, name: &str) {
        match map {
            Map::Request => self.request.borrow_mut().retain(|(n, _)| n != name),
            Map::Response => self.response.borrow_mut().retain(|(n, _)| n != name),
        }
    }

    /// What the host does with an effect.
    pub(super) fn apply(&self, effect: &Effect) {
        match effect {
            Effect::SetHeader(map, name, value) => match map {
                Map::Request => put(&mut self.request.borrow_mut(), name, value.as_bytes()),
                Map::Response => put(&mut self.response.borrow_mut(), name, value.as_bytes()),
            },
            Effect::RemoveHeader(map, name) => self.remove(*map, name),
            Effect::ReplaceRequestBody { body, .. } => {
                *self.request_body.borrow_mut() = body.clone()
            }
            Effect::Own(Own::SetRequestLength(n)) => {
                // as host::set_request_length
                let mut request = self.request.borrow_mut();
                put(&mut request, "content-length", n.to_string().as_bytes());
                request.retain(|(name, _)| name != "transfer-encoding");
            }
            Effect::SetProperty { name, value, .. } => self.set_prop(name, value),
            Effect::ReplaceResponseBody { body, .. } => {
                *self.response_body.borrow_mut() = body.clone()
            }
            _ => {}
        }
    }
}

/// Shared data with CAS tokens; `mismatches` CAS writes fail before one succeeds;
/// `unavailable` fails every call.
#[derive(Default)]
pub(super) struct FakeStore {
    data: RefCell<HashMap<String, (Vec<u8>, u32)>>,
    mismatches: Cell<usize>,
    unavailable: Cell<bool>,
    writes: Cell<usize>,
}

impl Store for FakeStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), StoreError> {
        if self.unavailable.get() {
            return Err(StoreError::Unavailable);
        }
        Ok(match self.data.borrow().get(key) {
            Some((value, cas)) => (Some(value.clone()), *cas),
            None => (None, 0),
        })
    }
    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        if self.unavailable.get() {
            return Err(StoreError::Unavailable);
        }
        if self.mismatches.get() > 0 {
            self.mismatches.set(self.mismatches.get() - 1);
            // another worker wrote in between
            if let Some((_, token)) = self.data.borrow_mut().get_mut(key) {
                *token += 1;
            }
            return Err(StoreError::CasMismatch);
        }
        let mut data = self.data.borrow_mut();
        let current = data.get(key).map_or(0, |(_, token)| *token);
        if cas != 0 && cas != current {
            return Err(StoreError::CasMismatch);
        }
        data.insert(key.to_string(), (value.to_vec(), current + 1));
        self.writes.set(self.writes.get() + 1);
        Ok(())
    }
}

impl FakeStore {
    fn breaker(&self, deployment: &str) -> State {
        self.data
            .borrow()
            .get(&key(deployment))
            .map(|(v, _)| State::decode(v))
            .unwrap_or_default()
    }
}

/// A core, its store, and a way to run one callback.
pub(super) struct Rig {
    pub(super) core: Core,
    store: FakeStore,
    pub(super) listener: ListenerRules,
}

impl Rig {
    pub(super) fn new(doc: &str) -> Self {
        let listener: ListenerRules = Rc::new(RefCell::new(None));
        let mut rig = Rig {
            core: Core::new(7, Rc::clone(&listener)),
            store: FakeStore::default(),
            listener,
        };
        rig.configure(doc);
        rig
    }

    fn configure(&mut self, doc: &str) {
        let rules = parse_document(doc.as_bytes()).expect("valid config");
        self.core.configure(3_000_000_000, rules, &self.store);
        while self.core.poll().is_some() {}
    }

    /// Runs `input`, carrying the effects out on `view` (`fail` picks the ones the host
    /// refuses); returns the flow and the commands in order.
    pub(super) fn run_failing(
        &mut self,
        view: &FakeView,
        context: u32,
        input: Input,
        fail: impl Fn(&Effect) -> bool,
    ) -> (Next, Vec<Effect>) {
        let mut flow = self.core.handle(context, input, view, &self.store);
        let mut done = Vec::new();
        while let Some(effect) = self.core.poll() {
            if fail(&effect) {
                if let Some(changed) = self.core.failed(context, effect, "refused") {
                    flow = changed;
                }
                continue;
            }
            view.apply(&effect);
            done.push(effect);
        }
        (flow, done)
    }

    pub(super) fn run(
        &mut self,
        view: &FakeView,
        context: u32,
        input: Input,
    ) -> (Next, Vec<Effect>) {
        self.run_failing(view, context, input, |_| false)
    }

    /// Headers then the whole body of a request.
    pub(super) fn send(&mut self, view: &FakeView, context: u32) -> (Next, Vec<Effect>) {
        let (flow, _) = self.run(
            view,
            context,
            Input::RequestHeaders {
                end_of_stream: false,
            },
        );
        assert_eq!(flow, Next::Pause, "a routed request holds its headers");
        let size = view.request_body.borrow().len();
        self.run(
            view,
            context,
            Input::RequestBody {
                size,
                end_of_stream: true,
            },
        )
    }

    fn response(&mut self, view: &FakeView, context: u32) -> Vec<Effect> {
        let (flow, commands) = self.run(
            view,
            context,
            Input::ResponseHeaders {
                end_of_stream: false,
            },
        );
        assert_ne!(flow, Next::Pause);
        // the body events are wanted exactly when a stream is guarded
        let guarded = view
            .response_header_text("content-type")
            .is_some_and(|ct| ct.starts_with("text/event-stream"))
            && view.response_header_text(":status").as_deref() == Some("200")
            && self
                .core
                .downstream
                .get(&context)
                .is_some_and(|e| e.routed.is_some());
        assert_eq!(flow == Next::Continue, guarded, "{flow:?}");
        commands
    }
}

pub(super) fn counted(commands: &[Effect], name: &str) -> bool {
    commands
        .iter()
        .any(|c| matches!(c, Effect::Count(n, 1) if n == name))
}

fn gauged(commands: &[Effect], name: &str, value: u64) -> bool {
    commands
        .iter()
        .any(|c| matches!(c, Effect::Gauge(n, v) if n == name && *v == value))
}

pub(super) fn refusal(commands: &[Effect]) -> Option<&Reject> {
    commands.iter().find_map(|c| match c {
        Effect::Refuse(r) => Some(r),
        _ => None,
    })
}

pub(super) fn logged(commands: &[Effect], level: Level, text: &str) -> bool {
    commands
        .iter()
        .any(|c| matches!(c, Effect::Log(l, m) if *l == level && m.contains(text)))
}

pub(super) fn body_model(view: &FakeView) -> String {
    let body: serde_json::Value =
        serde_json::from_slice(&view.request_body.borrow()).expect("json body");
    body["model"].as_str().unwrap_or_default().to_string()
}

pub(super) fn chat(group: &str) -> String {
    CHAT.replace("fast", group)
}

// ---------------------------------------------------------------------------------------
// Downstream: the request

#[test]
fn a_request_of_a_group_is_planned_rewritten_and_published_for_the_retries() {
    let mut rig = Rig::new(DOC);
    let view = FakeView::request(
        "/v1/chat/completions",
        &[("x-llm-groups", "*"), ("authorization", "Bearer client")],
        CHAT,
    );
    let (flow, commands) = rig.send(&view, 1);
    assert_eq!(flow, Next::Continue);
    assert_eq!(body_model(&view), "gpt-a");
    // two deployments: no credential at all here (each attempt's is the upstream role's)
    assert_eq!(view.header("authorization"), None);
    assert_eq!(view.header("x-api-key"), None);
    assert_eq!(view.header("x-llm-model-group").as_deref(), Some("fast"));
    assert_eq!(view.header("x-llm-deployment").as_deref(), Some("a"));
    assert_eq!(view.header("x-llm-cluster").as_deref(), Some("c-a"));
    assert_eq!(view.header("x-envoy-max-retries").as_deref(), Some("1"));
    let id = view.header("x-llm-request-id").expect("a request id");
    assert_eq!(id.len(), 32);
    assert_eq!(view.prop("llm_attempt").as_deref(), Some("0"));
    assert_eq!(view.prop("llm_try_0").as_deref(), Some("c-a"));
    assert_eq!(view.prop("llm_try_1").as_deref(), Some("c-b"));
    assert_eq!(view.prop("llm_route_plan").as_deref(), Some("a,b"));
    assert_eq!(
        view.prop("llm_route_next"),
        None,
        "no redirect continuation"
    );
    let info = view.route();
    assert_eq!(
        (info.model_group.as_str(), info.deployment.as_str()),
        ("fast", "a")
    );
    assert_eq!((info.attempts, info.request_id.as_str()), (1, id.as_str()));
    // the route cache is cleared after every write the matcher reads
    let clear = commands
        .iter()
        .position(|c| *c == Effect::ClearRouteCache)
        .expect("route cache cleared");
    let last_property = commands
        .iter()
        .rposition(|c| matches!(c, Effect::SetProperty { .. }))
        .unwrap();
    assert!(clear > last_property);
    assert!(counted(&commands, "version.v1.requests"));
    // the body was read once, the clock once (breakers and the id)
    assert_eq!(view.clock_reads.get(), 1);
}

#[test]
fn the_rewritten_body_keeps_a_content_length_true_and_a_chunked_one_chunked() {
    let mut rig = Rig::new(DOC);
    // sent with a length the rewrite changes: the new length, from the headers already read
    let view = FakeView::request(
        "/v1/chat/completions",
        &[("x-llm-groups", "*"), ("content-length", "999")],
        CHAT,
    );
    let (_, commands) = rig.send(&view, 1);
    let length = view.request_body.borrow().len();
    assert_ne!(length, CHAT.len(), "the model was rewritten");
    assert_eq!(view.header("content-length"), Some(length.to_string()));
    assert!(commands.contains(&Effect::Own(Own::SetRequestLength(length))));
    // sent chunked (no content-length): none is added
    let view = FakeView::request(
        "/v1/chat/completions",
        &[("x-llm-groups", "*"), ("transfer-encoding", "chunked")],
        CHAT,
    );
    let (_, commands) = rig.send(&view, 2);
    assert_eq!(body_model(&view), "gpt-a");
    assert_eq!(view.header("content-length"), None);
    assert_eq!(view.header("transfer-encoding").as_deref(), Some("chunked"));
    assert!(!commands
        .iter()
        .any(|c| matches!(c, Effect::Own(Own::SetRequestLength(_)))));
}

#[test]
fn request_ids_are_the_routers_own_and_differ_per_request() {
    let mut rig = Rig::new(DOC);
    let first = FakeView::request(
        "/v1/chat/completions",
        &[("x-llm-groups", "*"), ("x-llm-request-id", "chosen")],
        CHAT,
    );
    rig.send(&first, 1);
    let second = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    rig.send(&second, 2);
    let (a, b) = (
        first.header("x-llm-request-id"),
        second.header("x-llm-request-id"),
    );
    assert_ne!(a.as_deref(), Some("chosen"));
    assert_ne!(a, b);
}

#[test]
fn a_single_deployment_gets_its_credential_in_the_providers_form() {
    let mut rig = Rig::new(DOC);
    let view = FakeView::request(
        "/v1/chat/completions",
        &[("x-llm-groups", "*"), ("authorization", "Bearer client")],
        &chat("solo"),
    );
    rig.send(&view, 1);
    assert_eq!(view.header("authorization").as_deref(), Some("Bearer ka"));
    assert_eq!(view.header("x-envoy-max-retries").as_deref(), Some("0"));
    // Anthropic: x-api-key, and the API version when the client sent none
    let view = FakeView::request(
        "/v1/messages",
        &[("x-llm-groups", "*"), ("x-api-key", "client")],
        &chat("sonnet"),
    );
    rig.send(&view, 2);
    assert_eq!(view.header("x-api-key").as_deref(), Some("kc"));
    assert_eq!(view.header("authorization"), None);
    assert_eq!(
        view.header("anthropic-version").as_deref(),
        Some("2023-06-01")
    );
    let view = FakeView::request(
        "/v1/messages",
        &[("x-llm-groups", "*"), ("anthropic-version", "2024-01-01")],
        &chat("sonnet"),
    );
    rig.send(&view, 3);
    assert_eq!(
        view.header("anthropic-version").as_deref(),
        Some("2024-01-01")
    );
}

#[test]
fn count_tokens_plans_only_anthropic_deployments() {
    let mut rig = Rig::new(DOC);
    // group fast has no Anthropic deployment to ask: the gateway answers with its estimate
    // ("hi": ceil(2 / 4) + the message's overhead of 4), labelled as one
    let view = FakeView::request("/v1/messages/count_tokens", &[("x-llm-groups", "*")], CHAT);
    let (flow, commands) = rig.send(&view, 1);
    assert_eq!(flow, Next::Pause);
    assert!(refusal(&commands).is_none());
    let reply = commands.iter().find_map(|c| match c {
        Effect::Own(Own::Reply {
            status,
            headers,
            body,
            ..
        }) => Some((
            *status,
            headers.clone(),
            String::from_utf8(body.clone()).unwrap(),
        )),
        _ => None,
    });
    let (status, headers, body) = reply.expect("a local answer");
    assert_eq!((status, body.as_str()), (200, r#"{"input_tokens":5}"#));
    assert!(headers.contains(&("x-llm-token-count".to_string(), "estimated".to_string())));
    assert_eq!(view.header("x-llm-deployment"), None, "no provider asked");
    assert!(counted(&commands, "count_tokens_estimated"));
    // a group the key may not use is refused first, as any model call
    let view = FakeView::request(
        "/v1/messages/count_tokens",
        &[("x-llm-groups", "solo")],
        CHAT,
    );
    let (_, commands) = rig.send(&view, 3);
    assert_eq!(refusal(&commands).map(|r| r.status), Some(403));
    let view = FakeView::request(
        "/v1/messages/count_tokens",
        &[("x-llm-groups", "*")],
        &chat("sonnet"),
    );
    let (flow, _) = rig.send(&view, 2);
    assert_eq!(flow, Next::Continue);
    assert_eq!(view.header("x-llm-deployment").as_deref(), Some("claude"));
}

#[test]
fn other_paths_pass_untouched_and_keep_no_state() {
    let mut rig = Rig::new(DOC);
    let view = FakeView::request("/healthz", &[], "");
    let (flow, commands) = rig.run(
        &view,
        1,
        Input::RequestHeaders {
            end_of_stream: true,
        },
    );
    assert_eq!((flow, commands.len()), (Next::Continue, 0));
    let (flow, commands) = rig.run(
        &view,
        1,
        Input::ResponseHeaders {
            end_of_stream: true,
        },
    );
    assert_eq!((flow, commands.len()), (Next::ContinueSkipResponseBody, 0));
    assert_eq!(rig.core.requests(), 0);
}

#[test]
fn unconfigured_the_router_passes_everything() {
    let mut core = Core::new(1, Rc::new(RefCell::new(None)));
    let view = FakeView::request("/v1/chat/completions", &[], CHAT);
    let store = FakeStore::default();
    let flow = core.handle(
        1,
        Input::RequestHeaders {
            end_of_stream: false,
        },
        &view,
        &store,
    );
    assert_eq!(flow, Next::Continue);
    assert!(core.poll().is_none());
}

#[test]
fn a_routed_request_without_a_body_is_refused_400() {
    let mut rig = Rig::new(DOC);
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], "");
    let (flow, commands) = rig.run(
        &view,
        1,
        Input::RequestHeaders {
            end_of_stream: true,
        },
    );
    assert_eq!(flow, Next::Pause);
    let reject = refusal(&commands).expect("refused");
    assert_eq!(
        (reject.status, reject.code.as_ref()),
        (400, "invalid_request_body")
    );
    assert!(counted(&commands, "rejected.invalid_request_body"));
}

#[test]
fn the_body_is_held_until_it_is_complete() {
    let mut rig = Rig::new(DOC);
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    rig.run(
        &view,
        1,
        Input::RequestHeaders {
            end_of_stream: false,
        },
    );
    let (flow, commands) = rig.run(
        &view,
        1,
        Input::RequestBody {
            size: 10,
            end_of_stream: false,
        },
    );
    assert_eq!((flow, commands.len()), (Next::Pause, 0));
    let (flow, _) = rig.run(
        &view,
        1,
        Input::RequestBody {
            size: CHAT.len(),
            end_of_stream: true,
        },
    );
    assert_eq!(flow, Next::Continue);
    // routed once: a later body callback changes nothing
    let (flow, commands) = rig.run(
        &view,
        1,
        Input::RequestBody {
            size: CHAT.len(),
            end_of_stream: true,
        },
    );
    assert_eq!((flow, commands.len()), (Next::Continue, 0));
}

#[test]
fn unknown_or_forbidden_groups_and_bad_bodies_are_refused() {
    let mut rig = Rig::new(DOC);
    for (groups, body, status, code) in [
        ("*", chat("nope"), 404, "model_not_found"),
        ("solo", chat("fast"), 403, "model_not_allowed"),
        ("*", "not json".to_string(), 400, "invalid_request_body"),
    ] {
        let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", groups)], &body);
        let (flow, commands) = rig.send(&view, 1);
        assert_eq!(flow, Next::Pause, "{body}");
        let reject = refusal(&commands).expect("refused");
        assert_eq!(
            (reject.status, reject.code.as_ref()),
            (status, code),
            "{body}"
        );
        assert_eq!(*view.request_body.borrow(), body.as_bytes(), "untouched");
        rig.core.forget(1);
    }
}

#[test]
fn a_failed_routing_write_refuses_500_and_drops_the_rest() {
    let mut rig = Rig::new(DOC);
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    rig.run(
        &view,
        1,
        Input::RequestHeaders {
            end_of_stream: false,
        },
    );
    let (flow, commands) = rig.run_failing(
        &view,
        1,
        Input::RequestBody {
            size: CHAT.len(),
            end_of_stream: true,
        },
        |c| matches!(c, Effect::SetProperty { name, .. } if name == "llm_route_plan"),
    );
    assert_eq!(flow, Next::Pause);
    let reject = refusal(&commands).expect("refused");
    assert_eq!(
        (reject.status, reject.code.as_ref()),
        (500, "gateway_internal_error")
    );
    assert!(logged(
        &commands,
        Level::Warn,
        "refused: gateway_internal_error"
    ));
    assert!(
        !commands.contains(&Effect::ClearRouteCache),
        "the rest was dropped"
    );
    assert!(!counted(&commands, "version.v1.requests"));
    // the local reply's response is not the routed request's
    view.respond("500", &[]);
    let commands = rig.response(&view, 1);
    assert!(commands.is_empty());
}

#[test]
fn a_failed_local_reply_is_logged() {
    let mut rig = Rig::new(DOC);
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], &chat("x"));
    rig.run(
        &view,
        1,
        Input::RequestHeaders {
            end_of_stream: false,
        },
    );
    let (flow, commands) = rig.run_failing(
        &view,
        1,
        Input::RequestBody {
            size: CHAT.len(),
            end_of_stream: true,
        },
        |c| matches!(c, Effect::Refuse(_)),
    );
    assert_eq!(flow, Next::Pause);
    assert!(logged(
        &commands,
        Level::Error,
        "cannot send the local reply: refused"
    ));
}

// ---------------------------------------------------------------------------------------
// Downstream: /v1/models

#[test]
fn the_model_list_is_answered_locally_with_the_groups_the_key_may_use() {
    let mut rig = Rig::new(DOC);
    let view = FakeView::request("/v1/models", &[("x-llm-groups", "fast, solo")], "");
    put(&mut view.request.borrow_mut(), ":method", b"GET");
    let (flow, commands) = rig.run(
        &view,
        1,
        Input::RequestHeaders {
            end_of_stream: true,
        },
    );
    assert_eq!(flow, Next::Pause);
    let Some(Effect::Own(Own::Reply {
        status,
        details,
        body,
        ..
    })) = commands
        .iter()
        .find(|c| matches!(c, Effect::Own(Own::Reply { .. })))
    else {
        panic!("a local reply: {commands:?}");
    };
    assert_eq!((*status, details.as_str()), (200, "model_router.models"));
    let list: serde_json::Value = serde_json::from_slice(body).unwrap();
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["fast", "solo"]);
    assert_eq!(list["data"][0]["created"], 3, "configured at 3 s");
    assert!(counted(&commands, "models_answered"));
    // a group the key may not use: the same 404 as one that does not exist
    put(&mut view.request.borrow_mut(), ":path", b"/v1/models/smart");
    let (flow, commands) = rig.run(
        &view,
        2,
        Input::RequestHeaders {
            end_of_stream: true,
        },
    );
    assert_eq!(flow, Next::Pause);
    assert_eq!(refusal(&commands).map(|r| r.status), Some(404));
}

// ---------------------------------------------------------------------------------------
// Downstream: the response and the breakers

#[test]
fn the_response_names_the_attempts_and_the_retried_ones_feed_their_breakers() {
    let mut rig = Rig::new(DOC);
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    rig.send(&view, 1);
    // Envoy retried once: attempt 2 answered
    put(
        &mut view.request.borrow_mut(),
        "x-envoy-attempt-count",
        b"2",
    );
    view.respond("200", &[("x-llm-fallback", "context_length_exceeded")]);
    view.set_prop("response.code_details", b"via_upstream");
    let commands = rig.response(&view, 1);
    assert_eq!(
        view.response_header_text("x-llm-attempts").as_deref(),
        Some("2")
    );
    assert_eq!(
        view.response_header_text("x-llm-deployment").as_deref(),
        Some("b")
    );
    assert_eq!(
        view.response_header_text("x-llm-model-group").as_deref(),
        Some("fast")
    );
    assert_eq!(
        view.response_header_text("x-llm-route-version").as_deref(),
        Some("v1")
    );
    assert_eq!(
        view.response_header_text("x-llm-fallback"),
        None,
        "never to the client"
    );
    let info = view.route();
    assert_eq!((info.deployment.as_str(), info.attempts), ("b", 2));
    assert_eq!(info.tried, ["a", "b"]);
    assert!(counted(&commands, "fallbacks"));
    assert!(counted(&commands, "served.fast.b"));
    // a failed (it was retried), b succeeded
    assert_eq!(rig.store.breaker("a").consecutive, 1);
    assert_eq!(rig.store.breaker("b").consecutive, 0);
}

/// The route info published at the request names attempt 1 as tried: when the first attempt
/// answers (a success or an error, no budget switch) it is the final one and the listener role
/// does not write it again; after a retry it publishes the answering attempt.
#[test]
fn a_first_attempts_answer_leaves_the_published_route_info_final() {
    let writes_route = |commands: &[Effect]| {
        commands
            .iter()
            .any(|c| matches!(c, Effect::SetProperty { name, .. } if name.as_ref() == "llm_route"))
    };
    for (attempt, status) in [(None, "200"), (None, "500"), (Some("2"), "200")] {
        let mut rig = Rig::new(DOC);
        let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
        let (_, commands) = rig.send(&view, 1);
        assert!(writes_route(&commands));
        let info = view.route();
        assert_eq!((info.deployment.as_str(), info.attempts), ("a", 1));
        assert_eq!(info.tried, ["a"]);
        if let Some(n) = attempt {
            view.set_prop("llm_attempt", n.as_bytes());
        }
        view.respond(status, &[]);
        let commands = rig.response(&view, 1);
        let info = view.route();
        if attempt.is_none() {
            assert!(!writes_route(&commands), "{status}");
            assert_eq!((info.deployment.as_str(), info.attempts), ("a", 1));
            assert_eq!(info.tried, ["a"]);
            assert!(counted(&commands, "served.fast.a"));
        } else {
            assert!(writes_route(&commands), "{status}");
            assert_eq!((info.deployment.as_str(), info.attempts), ("b", 2));
            assert_eq!(info.tried, ["a", "b"]);
        }
    }
}

#[test]
fn the_attempt_number_falls_back_to_the_mirrored_filter_state() {
    let mut rig = Rig::new(DOC);
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    rig.send(&view, 1);
    view.set_prop("llm_attempt", b"2");
    view.respond("503", &[]);
    rig.response(&view, 1);
    assert_eq!(
        view.response_header_text("x-llm-attempts").as_deref(),
        Some("2")
    );
    // both failed: a retried, b answered 503
    assert_eq!(rig.store.breaker("a").consecutive, 1);
    assert_eq!(rig.store.breaker("b").consecutive, 1);
    // junk counts as the first attempt
    for junk in [&b"0"[..], b"x", b"-3"] {
        let view = FakeView::default();
        view.set_prop("llm_attempt", junk);
        assert_eq!(super::downstream::attempt_number(&view), 1);
    }
}

#[test]
fn a_local_reply_of_a_later_filter_feeds_no_breaker() {
    let mut rig = Rig::new(DOC);
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    rig.send(&view, 1);
    let writes = rig.store.writes.get();
    view.respond("429", &[]);
    view.set_prop("response.code_details", b"token_ratelimit.rate_limited");
    rig.response(&view, 1);
    assert_eq!(rig.store.writes.get(), writes);
    assert_eq!(rig.store.breaker("a"), State::default());
    // Envoy's own reply after failed attempts counts
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    rig.send(&view, 2);
    view.respond("503", &[]);
    view.set_prop(
        "response.code_details",
        b"upstream_reset_before_response_started{connection_failure}",
    );
    rig.response(&view, 2);
    assert_eq!(rig.store.breaker("a").consecutive, 1);
}

#[test]
fn a_breaker_opens_skips_its_deployment_then_lets_one_probe_through() {
    let mut rig = Rig::new(DOC);
    let mut context = 0;
    let mut request = |rig: &mut Rig, ms: u64, status: &str| {
        context += 1;
        let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
        view.set_ms(ms);
        let (_, mut commands) = rig.send(&view, context);
        let first = view.header("x-llm-deployment");
        view.respond(status, &[]);
        commands.extend(rig.response(&view, context));
        (first, commands)
    };
    let (first, _) = request(&mut rig, 0, "503");
    assert_eq!(first.as_deref(), Some("a"));
    let (_, commands) = request(&mut rig, 10, "500");
    assert!(logged(
        &commands,
        Level::Warn,
        "breaker opened: deployment a skipped for 1000 ms"
    ));
    assert!(counted(&commands, "breaker.opened.a"));
    // the breaker state gauge the dashboard and the `breaker open` alert read
    assert!(gauged(&commands, "breaker.open.a", 1));
    assert_eq!(
        rig.store.breaker("a").phase,
        Phase::Open { until_ms: 1_010 }
    );
    // open: the plan starts at b
    let (first, _) = request(&mut rig, 500, "200");
    assert_eq!(first.as_deref(), Some("b"));
    // after the cooldown one request probes a...
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    view.set_ms(1_100);
    let (_, commands) = rig.send(&view, 100);
    assert_eq!(view.header("x-llm-deployment").as_deref(), Some("a"));
    assert!(counted(&commands, "breaker.probe.a"));
    assert!(logged(&commands, Level::Info, "probing deployment a"));
    // ...while another skips it
    let other = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    other.set_ms(1_200);
    rig.send(&other, 101);
    assert_eq!(other.header("x-llm-deployment").as_deref(), Some("b"));
    // the probe succeeds: closed again
    view.respond("200", &[]);
    let commands = rig.response(&view, 100);
    assert!(counted(&commands, "breaker.recovered.a"));
    assert!(gauged(&commands, "breaker.open.a", 0));
    assert_eq!(rig.store.breaker("a"), State::default());
}

#[test]
fn breaker_writes_retry_a_cas_mismatch_and_give_up_after_the_last_round() {
    let mut rig = Rig::new(DOC);
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    rig.send(&view, 1);
    view.respond("503", &[]);
    rig.store.mismatches.set(CAS_ROUNDS - 1);
    rig.response(&view, 1);
    assert_eq!(rig.store.breaker("a").consecutive, 1, "the last round wins");
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    rig.send(&view, 2);
    view.respond("503", &[]);
    rig.store.mismatches.set(CAS_ROUNDS);
    rig.response(&view, 2);
    assert_eq!(
        rig.store.breaker("a").consecutive,
        1,
        "every round lost: not recorded"
    );
}

#[test]
fn a_probe_lost_in_every_cas_round_is_skipped() {
    let mut rig = Rig::new(DOC);
    let open = State {
        phase: Phase::Open { until_ms: 100 },
        ..State::default()
    };
    rig.store.set(&key("a"), &open.encode(), 0).unwrap();
    rig.store.mismatches.set(CAS_ROUNDS);
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    view.set_ms(200);
    let (_, commands) = rig.send(&view, 1);
    assert_eq!(view.header("x-llm-deployment").as_deref(), Some("b"));
    assert!(!counted(&commands, "breaker.probe.a"));
}

#[test]
fn without_shared_data_every_breaker_admits() {
    let mut rig = Rig::new(DOC);
    let open = State {
        phase: Phase::Open { until_ms: u64::MAX },
        ..State::default()
    };
    rig.store.set(&key("a"), &open.encode(), 0).unwrap();
    rig.store.unavailable.set(true);
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    let (flow, _) = rig.send(&view, 1);
    assert_eq!(flow, Next::Continue);
    assert_eq!(view.header("x-llm-deployment").as_deref(), Some("a"));
    view.respond("503", &[]);
    rig.response(&view, 1); // recording fails quietly
}

#[test]
fn configuration_seeds_only_the_breakers_that_do_not_exist() {
    let store = FakeStore::default();
    let open = State {
        phase: Phase::Open { until_ms: 5 },
        ..State::default()
    };
    store.set(&key("b"), &open.encode(), 0).unwrap();
    let mut core = Core::new(1, Rc::new(RefCell::new(None)));
    core.configure(0, parse_document(DOC.as_bytes()).unwrap(), &store);
    assert_eq!(store.breaker("b"), open, "kept");
    for name in ["a", "claude", "mini"] {
        assert!(
            store.data.borrow().contains_key(&key(name)),
            "{name} seeded"
        );
    }
    let Some(Effect::Log(Level::Info, line)) = core.poll() else {
        panic!("the configuration is logged");
    };
    assert!(
        line.contains("version v1 with 4 deployments and 5 groups"),
        "{line}"
    );
}

// ---------------------------------------------------------------------------------------
// Downstream: streams

const SSE: (&str, &str) = ("content-type", "text/event-stream; charset=utf-8");

fn stream(rig: &mut Rig, view: &FakeView, context: u32, chunks: &[&str]) -> Vec<Effect> {
    let mut all = Vec::new();
    for (n, chunk) in chunks.iter().enumerate() {
        *view.response_body.borrow_mut() = chunk.as_bytes().to_vec();
        let (flow, commands) = rig.run(
            view,
            context,
            Input::ResponseBody {
                size: chunk.len(),
                end_of_stream: n + 1 == chunks.len(),
            },
        );
        assert_ne!(flow, Next::Pause);
        all.extend(commands);
        if flow == Next::ContinueSkipResponseBody {
            // what the shell does: no more body events
            break;
        }
    }
    all
}

#[test]
fn a_stream_cut_before_its_terminator_gets_an_error_event() {
    let mut rig = Rig::new(DOC);
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    rig.send(&view, 1);
    view.respond("200", &[SSE, ("content-length", "99")]);
    rig.response(&view, 1);
    assert_eq!(view.response_header_text("content-length"), None);
    let commands = stream(
        &mut rig,
        &view,
        1,
        &["data: {\"x\":1}\n\n", "data: {\"x\":2}\n\n", ""],
    );
    let Some(Effect::Own(Own::AppendResponseBody { at, bytes })) = commands
        .iter()
        .find(|c| matches!(c, Effect::Own(Own::AppendResponseBody { .. })))
    else {
        panic!("an error event: {commands:?}");
    };
    assert_eq!(
        (*at, bytes.clone()),
        (0, crate::stream::interrupted_event(false))
    );
    assert!(counted(&commands, "stream_interrupted"));
    assert!(logged(&commands, Level::Warn, "without its terminator"));
}

#[test]
fn an_anthropic_client_gets_anthropics_error_event() {
    let mut rig = Rig::new(DOC);
    let view = FakeView::request("/v1/messages", &[("x-llm-groups", "*")], &chat("sonnet"));
    rig.send(&view, 1);
    view.respond("200", &[SSE]);
    rig.response(&view, 1);
    let commands = stream(&mut rig, &view, 1, &["event: ping\ndata: {}\n\n"]);
    assert!(commands.contains(&Effect::Own(Own::AppendResponseBody {
        at: "event: ping\ndata: {}\n\n".len(),
        bytes: crate::stream::interrupted_event(true),
    })));
}

#[test]
fn a_finished_stream_is_not_read_any_further() {
    let mut rig = Rig::new(DOC);
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    rig.send(&view, 1);
    view.respond("200", &[SSE]);
    rig.response(&view, 1);
    let commands = stream(
        &mut rig,
        &view,
        1,
        &["data: {\"x\":1}\n\ndata: [DO", "NE]\n\n", "trailing", ""],
    );
    assert!(commands.is_empty(), "{commands:?}");
    assert_eq!(view.body_reads.get(), 2, "no read after the terminator");
}

#[test]
fn only_a_200_event_stream_is_guarded() {
    let mut rig = Rig::new(DOC);
    for (context, (status, headers)) in [
        ("429", vec![SSE]),
        ("200", vec![("content-type", "application/json")]),
    ]
    .into_iter()
    .enumerate()
    {
        let context = context as u32 + 1;
        let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
        rig.send(&view, context);
        view.respond(status, &headers);
        rig.response(&view, context);
        let commands = stream(&mut rig, &view, context, &["data: {}\n\n", ""]);
        assert!(commands.is_empty(), "{status}");
        assert_eq!(view.body_reads.get(), 0, "{status}");
    }
}

// ---------------------------------------------------------------------------------------
// Downstream: budget fallback

#[test]
fn a_budget_fallback_is_published_and_a_switch_is_followed_on_the_response() {
    let mut rig = Rig::new(DOC);
    let view = FakeView::request(
        "/v1/chat/completions",
        &[("x-llm-groups", "*")],
        &chat("smart"),
    );
    rig.send(&view, 1);
    let alt = Alternative::from_json(&view.properties.borrow()["llm_route_budget_fallback"])
        .expect("an alternative");
    assert_eq!(
        (alt.group(), alt.deployments.clone()),
        ("cheap", vec!["mini".to_string()])
    );
    // token-ratelimit switched
    view.set_prop("llm_budget_fallback", b"cheap");
    view.set_prop("llm_route_plan", b"mini");
    view.respond("200", &[]);
    let commands = rig.response(&view, 1);
    assert!(counted(&commands, "budget_fallbacks"));
    assert_eq!(
        view.response_header_text("x-llm-budget-fallback")
            .as_deref(),
        Some("cheap")
    );
    assert_eq!(
        view.response_header_text("x-llm-model-group").as_deref(),
        Some("cheap")
    );
    assert_eq!(
        view.response_header_text("x-llm-deployment").as_deref(),
        Some("mini")
    );
    assert_eq!(view.route().deployment, "mini");
    // a switch to things the router does not know is not followed
    let view = FakeView::request(
        "/v1/chat/completions",
        &[("x-llm-groups", "*")],
        &chat("smart"),
    );
    rig.send(&view, 2);
    view.set_prop("llm_budget_fallback", b"cheap");
    view.set_prop("llm_route_plan", b"ghost");
    view.respond("200", &[]);
    let commands = rig.response(&view, 2);
    assert!(logged(
        &commands,
        Level::Warn,
        "reporting the original plan"
    ));
    assert_eq!(
        view.response_header_text("x-llm-deployment").as_deref(),
        Some("b")
    );
    assert_eq!(view.response_header_text("x-llm-budget-fallback"), None);
}

#[test]
fn planning_a_budget_fallback_never_claims_a_probe() {
    let mut rig = Rig::new(DOC);
    let due = State {
        phase: Phase::Open { until_ms: 100 },
        ..State::default()
    };
    rig.store.set(&key("mini"), &due.encode(), 0).unwrap();
    let view = FakeView::request(
        "/v1/chat/completions",
        &[("x-llm-groups", "*")],
        &chat("smart"),
    );
    view.set_ms(200);
    rig.send(&view, 1);
    assert_eq!(rig.store.breaker("mini"), due, "still open, not half-open");
    assert_eq!(
        view.prop("llm_route_budget_fallback"),
        None,
        "mini skipped: no alternative"
    );
    // a group without one publishes none
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    rig.send(&view, 2);
    assert_eq!(view.prop("llm_route_budget_fallback"), None);
}

#[test]
fn a_failed_budget_fallback_publication_is_logged_and_the_request_goes_on() {
    let mut rig = Rig::new(DOC);
    let view = FakeView::request(
        "/v1/chat/completions",
        &[("x-llm-groups", "*")],
        &chat("smart"),
    );
    rig.run(
        &view,
        1,
        Input::RequestHeaders {
            end_of_stream: false,
        },
    );
    let (flow, commands) = rig.run_failing(
        &view,
        1,
        Input::RequestBody {
            size: chat("smart").len(),
            end_of_stream: true,
        },
        |c| matches!(c, Effect::SetProperty { name, .. } if name == "llm_route_budget_fallback"),
    );
    assert_eq!(flow, Next::Continue);
    assert!(logged(
        &commands,
        Level::Error,
        "cannot publish the budget fallback"
    ));
    assert!(commands.contains(&Effect::ClearRouteCache));
}

// ---------------------------------------------------------------------------------------
// Downstream: the redirect fallback (Envoy 1.36, Higress)

pub(super) fn redirect_doc() -> String {
    DOC.replace(
        "\"version\": \"v1\",",
        "\"version\": \"v1\", \"fallback\": \"redirect\",",
    )
    .replace(", \"budget_fallback\": \"cheap\"", "")
}

#[test]
fn the_first_redirect_pass_publishes_its_continuation_and_frames_the_body() {
    let mut rig = Rig::new(&redirect_doc());
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    rig.send(&view, 1);
    let next = view.prop("llm_route_next").expect("a continuation");
    let id = view.header("x-llm-request-id").unwrap();
    // the client's API (Chat, no stream) travels with it
    assert_eq!(next, format!("2|fast|{id}|a,b|chat"));
    // no retries: the credential and the length are set here
    assert_eq!(view.header("authorization").as_deref(), Some("Bearer ka"));
    assert_eq!(
        view.header("content-length"),
        Some(view.request_body.borrow().len().to_string())
    );
    assert_eq!(view.prop("llm_route_plan"), None);
    assert_eq!(view.header("x-envoy-max-retries"), None);
    // a single deployment: nothing to continue to
    let view = FakeView::request(
        "/v1/chat/completions",
        &[("x-llm-groups", "*")],
        &chat("solo"),
    );
    rig.send(&view, 2);
    assert_eq!(view.prop("llm_route_next"), None);
}

#[test]
fn a_reentering_pass_continues_the_plan_and_its_breaker_learns_at_on_log() {
    let mut rig = Rig::new(&redirect_doc());
    let view = FakeView::request(
        "/v1/chat/completions",
        &[
            ("x-llm-groups", "*"),
            ("x-llm-reentry", "ticket"),
            ("x-llm-route-next", "2|fast|rid-1|a,b"),
        ],
        CHAT,
    );
    let (flow, commands) = rig.send(&view, 1);
    assert_eq!(flow, Next::Continue);
    assert_eq!(body_model(&view), "gpt-b");
    assert_eq!(view.header("authorization").as_deref(), Some("Bearer kb"));
    assert_eq!(view.header("x-llm-request-id").as_deref(), Some("rid-1"));
    assert_eq!(view.header("x-llm-route-next"), None);
    assert_eq!(view.prop("llm_route_next"), None, "b is the last");
    let info = view.route();
    assert_eq!(
        (info.attempts, info.tried.clone()),
        (2, vec!["a".into(), "b".into()])
    );
    assert!(counted(&commands, "fallbacks"));
    view.respond("200", &[]);
    let commands = rig.response(&view, 1);
    assert!(counted(&commands, "fallbacks.answered"));
    assert_eq!(
        view.response_header_text("x-llm-attempts").as_deref(),
        Some("2")
    );
    assert_eq!(
        rig.store.writes.get(),
        4,
        "only the seeds (one per deployment) so far: on_log decides"
    );
    view.set_prop("response.code_details", b"via_upstream");
    rig.run(&view, 1, Input::Log);
    let b = rig.store.breaker("b");
    assert_eq!((b.consecutive, b.window_len), (0, 1), "a success recorded");
    // a pass the redirect superseded failed
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    rig.send(&view, 2);
    view.respond("503", &[]);
    rig.response(&view, 2);
    view.set_prop("response.code_details", b"internal_redirect");
    rig.run(&view, 2, Input::Log);
    assert_eq!(rig.store.breaker("a").consecutive, 1);
}

#[test]
fn a_continuation_is_trusted_only_with_a_reentry_ticket_and_naming_known_deployments() {
    let mut rig = Rig::new(&redirect_doc());
    // without key-auth's ticket the header is ignored: a first pass
    let view = FakeView::request(
        "/v1/chat/completions",
        &[
            ("x-llm-groups", "*"),
            ("x-llm-route-next", "2|fast|rid-1|a,b"),
        ],
        CHAT,
    );
    rig.send(&view, 1);
    assert_eq!(view.header("x-llm-deployment").as_deref(), Some("a"));
    // a plan the config no longer has
    let view = FakeView::request(
        "/v1/chat/completions",
        &[
            ("x-llm-groups", "*"),
            ("x-llm-reentry", "ticket"),
            ("x-llm-route-next", "2|fast|rid-1|a,gone"),
        ],
        CHAT,
    );
    let (flow, commands) = rig.send(&view, 2);
    assert_eq!(flow, Next::Pause);
    let reject = refusal(&commands).unwrap();
    assert_eq!(
        (reject.status, reject.code.as_ref()),
        (503, "fallback_unavailable")
    );
}

// ---------------------------------------------------------------------------------------
// Upstream role

pub(super) const UPSTREAM: &str = r#"{"role": "upstream"}"#;

/// An upstream core whose VM's listener role has DOC.
pub(super) fn upstream() -> Rig {
    let rig = Rig::new(UPSTREAM);
    *rig.listener.borrow_mut() = Some(Rc::new(parse_document(DOC.as_bytes()).unwrap()));
    rig
}

fn attempt(number: &str, plan: &str) -> FakeView {
    let view = FakeView::request(
        "/v1/chat/completions",
        &[
            ("x-envoy-attempt-count", number),
            ("x-envoy-expected-rq-timeout-ms", "1000"),
            ("authorization", "Bearer ka"),
            ("content-length", "60"),
        ],
        r#"{"model":"gpt-a","messages":[]}"#,
    );
    view.set_prop("llm_route_plan", plan.as_bytes());
    view
}

#[test]
fn an_attempt_gets_its_deployments_model_credential_and_length() {
    let mut rig = upstream();
    assert_eq!(rig.core.role(), crate::config::Role::Upstream);
    let view = attempt("2", "a,b");
    let (flow, commands) = rig.run(
        &view,
        1,
        Input::RequestHeaders {
            end_of_stream: false,
        },
    );
    assert_eq!(flow, Next::Pause);
    assert_eq!(view.prop("llm_attempt").as_deref(), Some("2"));
    assert_eq!(view.header("authorization").as_deref(), Some("Bearer kb"));
    assert_eq!(view.header("x-envoy-attempt-count"), None);
    assert_eq!(view.header("x-envoy-expected-rq-timeout-ms"), None);
    assert!(refusal(&commands).is_none());
    let size = view.request_body.borrow().len();
    let (flow, _) = rig.run(
        &view,
        1,
        Input::RequestBody {
            size: 5,
            end_of_stream: false,
        },
    );
    assert_eq!(flow, Next::Pause);
    let (flow, _) = rig.run(
        &view,
        1,
        Input::RequestBody {
            size,
            end_of_stream: true,
        },
    );
    assert_eq!(flow, Next::Continue);
    assert_eq!(body_model(&view), "gpt-b");
    assert_eq!(
        view.header("content-length"),
        Some(view.request_body.borrow().len().to_string())
    );
}

/// Attempt 1 of plan `a` (model `gpt-a`, the body's already) with `headers` besides the
/// attempt count: the commands of its headers and of its whole body.
fn unchanged_attempt(headers: &[(&str, &str)]) -> Vec<Effect> {
    let mut rig = upstream();
    let mut all = vec![("x-envoy-attempt-count", "1")];
    all.extend_from_slice(headers);
    let view = FakeView::request(
        "/v1/chat/completions",
        &all,
        r#"{"model":"gpt-a","messages":[]}"#,
    );
    view.set_prop("llm_route_plan", b"a");
    let (_, mut commands) = rig.run(
        &view,
        1,
        Input::RequestHeaders {
            end_of_stream: false,
        },
    );
    let size = view.request_body.borrow().len();
    let (flow, more) = rig.run(
        &view,
        1,
        Input::RequestBody {
            size,
            end_of_stream: true,
        },
    );
    assert_eq!(flow, Next::Continue);
    assert_eq!(view.header("authorization").as_deref(), Some("Bearer ka"));
    assert_eq!(view.header("content-length").as_deref(), Some("31"));
    assert_eq!(view.header("transfer-encoding"), None);
    assert_eq!(view.header("x-api-key"), None);
    commands.extend(more);
    commands
}

#[test]
fn an_attempt_writes_no_framing_and_removes_no_header_the_request_has_right_already() {
    let removed = |commands: &[Effect], name: &str| {
        commands.iter().any(|c| match c {
            Effect::RemoveHeader(Map::Request, n) => *n == name,
            _ => false,
        })
    };
    let framing = |commands: &[Effect]| {
        commands
            .iter()
            .any(|c| matches!(c, Effect::Own(Own::SetRequestLength(_))))
    };
    // the body is unchanged and its content-length right; no x-api-key to remove
    let commands = unchanged_attempt(&[("content-length", "31")]);
    assert!(!framing(&commands), "{commands:?}");
    assert!(!removed(&commands, "x-api-key"), "{commands:?}");
    assert!(removed(&commands, "x-envoy-attempt-count"), "{commands:?}");
    // a client's x-api-key is removed
    let commands = unchanged_attempt(&[("content-length", "31"), ("x-api-key", "client")]);
    assert!(removed(&commands, "x-api-key"), "{commands:?}");
    // a wrong, padded or missing length, or a chunked body: framed
    for headers in [
        &[("content-length", "30")][..],
        &[("content-length", "031")],
        &[],
        &[("content-length", "31"), ("transfer-encoding", "chunked")],
    ] {
        let commands = unchanged_attempt(headers);
        assert!(
            commands.contains(&Effect::Own(Own::SetRequestLength(31))),
            "{headers:?}: {commands:?}"
        );
    }
}

#[test]
fn an_attempt_whose_rewrite_fails_frames_the_clients_body() {
    let mut rig = upstream();
    let view = attempt("1", "b");
    rig.run(
        &view,
        1,
        Input::RequestHeaders {
            end_of_stream: false,
        },
    );
    let size = view.request_body.borrow().len();
    let (flow, commands) = rig.run_failing(
        &view,
        1,
        Input::RequestBody {
            size,
            end_of_stream: true,
        },
        |c| matches!(c, Effect::ReplaceRequestBody { .. }),
    );
    assert_eq!(flow, Next::Continue);
    assert!(logged(
        &commands,
        Level::Error,
        "cannot rewrite the model: refused"
    ));
    assert!(commands.contains(&Effect::Own(Own::SetRequestLength(size))));
    assert_eq!(body_model(&view), "gpt-a");
}

#[test]
fn a_deployment_may_keep_the_envoy_headers() {
    let doc = DOC.replace(
        r#""credential": "kb"}"#,
        r#""credential": "kb", "forward_envoy_headers": true}"#,
    );
    let mut rig = Rig::new(UPSTREAM);
    *rig.listener.borrow_mut() = Some(Rc::new(parse_document(doc.as_bytes()).unwrap()));
    let view = attempt("2", "a,b");
    rig.run(
        &view,
        1,
        Input::RequestHeaders {
            end_of_stream: true,
        },
    );
    assert_eq!(
        view.header("x-envoy-expected-rq-timeout-ms").as_deref(),
        Some("1000")
    );
}

#[test]
fn an_attempt_the_role_cannot_resolve_is_refused_never_forwarded() {
    let mut rig = upstream();
    let view = attempt("3", "a,b");
    let (flow, commands) = rig.run(
        &view,
        1,
        Input::RequestHeaders {
            end_of_stream: false,
        },
    );
    assert_eq!(flow, Next::Pause);
    assert_eq!(refusal(&commands).map(|r| r.status), Some(500));
    assert!(logged(
        &commands,
        Level::Error,
        "attempt 3: deployment `` is not configured here"
    ));
    // without the listener's rules nothing resolves
    let mut rig = Rig::new(UPSTREAM);
    let (flow, _) = rig.run(
        &attempt("1", "a"),
        1,
        Input::RequestHeaders {
            end_of_stream: false,
        },
    );
    assert_eq!(flow, Next::Pause);
    // its own document's deployments come first (the older form)
    let own = DOC.replace("\"version\": \"v1\",", "\"role\": \"upstream\",");
    let mut rig = Rig::new(&own);
    let view = attempt("1", "a");
    let (flow, _) = rig.run(
        &view,
        1,
        Input::RequestHeaders {
            end_of_stream: true,
        },
    );
    assert_eq!(flow, Next::Continue);
    assert_eq!(view.header("authorization").as_deref(), Some("Bearer ka"));
}

#[test]
fn an_unrouted_request_only_loses_its_envoy_headers() {
    let mut rig = upstream();
    let view = attempt("1", "a");
    view.properties.borrow_mut().clear();
    let (flow, commands) = rig.run(
        &view,
        1,
        Input::RequestHeaders {
            end_of_stream: false,
        },
    );
    assert_eq!(flow, Next::Continue);
    assert_eq!(view.header("x-envoy-attempt-count"), None);
    assert_eq!(view.header("authorization").as_deref(), Some("Bearer ka"));
    assert!(commands
        .iter()
        .all(|c| matches!(c, Effect::RemoveHeader(..))));
    assert_eq!(rig.core.requests(), 0);
}

/// The upstream role's attempt `number` of plan `a,b` answering `status`, after the listener
/// role published its first choice's route info (attempt 1 listed as tried, as it does); the
/// view and the commands of the response callback.
fn answer_after_the_listener(number: &str, status: &str) -> (FakeView, Vec<Effect>) {
    let config = parse_document(DOC.as_bytes()).unwrap();
    let config = config.global().unwrap();
    let first = crate::plan::route_info(
        config,
        "fast",
        &[0, 1],
        &config.deployments[0],
        "r",
        1,
        vec!["a".into()],
    );
    let mut rig = upstream();
    let view = attempt(number, "a,b");
    view.set_prop("llm_route", &first.to_json());
    rig.run(
        &view,
        1,
        Input::RequestHeaders {
            end_of_stream: true,
        },
    );
    view.respond(status, &[]);
    let (_, commands) = rig.run(
        &view,
        1,
        Input::ResponseHeaders {
            end_of_stream: false,
        },
    );
    (view, commands)
}

#[test]
fn the_answering_attempt_publishes_itself() {
    let (view, _) = answer_after_the_listener("2", "200");
    let info = view.route();
    assert_eq!(
        (info.deployment.as_str(), info.model.as_str()),
        ("b", "gpt-b")
    );
    assert_eq!(
        (info.attempts, info.tried.clone()),
        (2, vec!["a".into(), "b".into()])
    );
    assert_eq!(info.request_id, "r");
}

/// Attempt 1's success is what the listener role published for the plan's first deployment:
/// the upstream role leaves the route info alone (the listener publishes the final one); its
/// error is published (a listener filter holding the response reads the answering attempt).
#[test]
fn the_first_attempt_publishes_only_an_error() {
    for (status, published) in [("200", false), ("204", false), ("429", true), ("500", true)] {
        let (view, commands) = answer_after_the_listener("1", status);
        let wrote = commands
            .iter()
            .any(|c| matches!(c, Effect::SetProperty { name, .. } if name.as_ref() == "llm_route"));
        assert_eq!(wrote, published, "{status}");
        let info = view.route();
        assert_eq!(info.deployment, "a", "{status}");
        assert_eq!(
            (info.attempts, info.tried),
            (1, vec!["a".into()]),
            "{status}"
        );
    }
}

#[test]
fn a_context_length_400_is_marked_for_a_retry_when_a_deployment_is_left() {
    let error = r#"{"error":{"message":"This model's maximum context length is 8192 tokens","code":"context_length_exceeded"}}"#;
    for (plan, body, marked) in [
        ("a,b", error, true),
        ("a", error, false),
        ("a,b", r#"{"error":{"message":"bad temperature"}}"#, false),
    ] {
        let mut rig = upstream();
        let view = attempt("1", plan);
        rig.run(
            &view,
            1,
            Input::RequestHeaders {
                end_of_stream: true,
            },
        );
        view.respond("400", &[]);
        let (flow, _) = rig.run(
            &view,
            1,
            Input::ResponseHeaders {
                end_of_stream: false,
            },
        );
        assert_eq!(flow == Next::Pause, plan == "a,b", "{plan}");
        if plan == "a" {
            // the last deployment's 400 goes to the client as it is: no body to look at
            assert_eq!(flow, Next::ContinueSkipResponseBody);
        }
        *view.response_body.borrow_mut() = body.as_bytes().to_vec();
        let (flow, _) = rig.run(
            &view,
            1,
            Input::ResponseBody {
                size: body.len(),
                end_of_stream: false,
            },
        );
        if plan == "a,b" {
            assert_eq!(flow, Next::Pause, "held until the body is complete");
        }
        let (flow, commands) = rig.run(
            &view,
            1,
            Input::ResponseBody {
                size: body.len(),
                end_of_stream: true,
            },
        );
        assert_eq!(flow, Next::ContinueSkipResponseBody);
        assert_eq!(
            view.response_header_text("x-llm-fallback").as_deref(),
            marked.then_some("context_length_exceeded"),
            "{plan} {body}"
        );
        assert_eq!(counted(&commands, "context_length_fallbacks"), marked);
    }
}

// ---------------------------------------------------------------------------------------
// Provider signals: cooldowns and per-group retry statuses

/// DOC with a group `strict` (a, b) that moves on only on 429 and 500.
fn signals_doc() -> String {
    DOC.replace(
        r#"{"name": "solo", "#,
        r#"{"name": "strict", "deployments": [{"deployment": "a"}, {"deployment": "b"}], "retry_on": [429, 500]},
        {"name": "solo", "#,
    )
}

/// The stored cooldown deadline (0: none).
fn cooldown_until(store: &FakeStore, deployment: &str) -> u64 {
    let data = store.data.borrow();
    let value = data.get(&key(deployment)).map(|(v, _)| v.as_slice());
    super::breakers::Entry::decode(value).cooldown_until_ms
}

/// An upstream core whose listener has `doc`.
pub(super) fn upstream_with(doc: &str) -> Rig {
    let rig = Rig::new(UPSTREAM);
    *rig.listener.borrow_mut() = Some(Rc::new(parse_document(doc.as_bytes()).unwrap()));
    rig
}

/// Attempt `number` of `plan` in `group` answers `status` with `headers` at `ms`; the
/// commands of the response callback.
fn attempt_answers(
    rig: &mut Rig,
    group: &str,
    (number, plan): (&str, &str),
    status: &str,
    headers: &[(&str, &str)],
    ms: u64,
) -> (FakeView, Vec<Effect>) {
    let view = attempt(number, plan);
    view.set_ms(ms);
    let parsed = parse_document(DOC.as_bytes()).unwrap();
    let config = parsed.global().unwrap();
    let info = crate::plan::route_info(
        config,
        group,
        &[0, 1],
        &config.deployments[0],
        "r",
        1,
        vec![],
    );
    view.set_prop("llm_route", &info.to_json());
    rig.run(
        &view,
        1,
        Input::RequestHeaders {
            end_of_stream: true,
        },
    );
    view.respond(status, headers);
    let (_, commands) = rig.run(
        &view,
        1,
        Input::ResponseHeaders {
            end_of_stream: false,
        },
    );
    (view, commands)
}

#[test]
fn a_429_with_retry_after_cools_its_deployment_down_and_moves_on() {
    let mut rig = upstream();
    let (view, commands) = attempt_answers(
        &mut rig,
        "fast",
        ("1", "a,b"),
        "429",
        &[("retry-after", "2")],
        10_000,
    );
    assert_eq!(cooldown_until(&rig.store, "a"), 12_000);
    assert!(counted(&commands, "cooldown.a"));
    assert!(logged(
        &commands,
        Level::Info,
        "deployment a cooling down for 2000 ms"
    ));
    assert_eq!(
        view.response_header_text("x-llm-fallback").as_deref(),
        Some("status_429")
    );
    assert!(counted(&commands, "status_fallbacks.429"));
    // the b it moved to is untouched
    assert_eq!(cooldown_until(&rig.store, "b"), 0);
}

#[test]
fn cooldowns_only_grow_are_capped_and_ignore_junk_and_other_statuses() {
    let mut rig = upstream();
    // OpenAI's reset header, as a 503
    attempt_answers(
        &mut rig,
        "fast",
        ("1", "a,b"),
        "503",
        &[("x-ratelimit-reset-requests", "5s")],
        0,
    );
    assert_eq!(cooldown_until(&rig.store, "a"), 5_000);
    // a shorter signal later does not shorten it
    let (_, commands) = attempt_answers(
        &mut rig,
        "fast",
        ("1", "a,b"),
        "429",
        &[("retry-after", "1")],
        1_000,
    );
    assert_eq!(cooldown_until(&rig.store, "a"), 5_000);
    assert!(!counted(&commands, "cooldown.a"));
    // an hour is capped at max_cooldown_ms (60 s by default)
    attempt_answers(
        &mut rig,
        "fast",
        ("1", "a,b"),
        "429",
        &[("retry-after", "3600")],
        2_000,
    );
    assert_eq!(cooldown_until(&rig.store, "a"), 62_000);
    // junk, no signal, and a signal on a status that is not 429/503: nothing
    for (status, headers) in [
        ("429", vec![("retry-after", "soon")]),
        ("429", vec![]),
        ("500", vec![("retry-after", "30")]),
        ("200", vec![("x-ratelimit-reset-tokens", "9s")]),
    ] {
        let (_, commands) = attempt_answers(&mut rig, "fast", ("1", "a,b"), status, &headers, 0);
        assert!(!counted(&commands, "cooldown.b"), "{status} {headers:?}");
        let mut rig = upstream();
        attempt_answers(&mut rig, "fast", ("1", "a,b"), status, &headers, 0);
        assert_eq!(cooldown_until(&rig.store, "a"), 0, "{status} {headers:?}");
    }
    // max_cooldown_ms 0: provider signals ignored
    let mut rig = upstream_with(&DOC.replace(
        "\"version\": \"v1\",",
        "\"version\": \"v1\", \"max_cooldown_ms\": 0,",
    ));
    attempt_answers(
        &mut rig,
        "fast",
        ("1", "a,b"),
        "429",
        &[("retry-after", "2")],
        0,
    );
    assert_eq!(cooldown_until(&rig.store, "a"), 0);
}

#[test]
fn a_groups_retry_on_decides_which_statuses_move_on() {
    for (group, status, plan, marked) in [
        ("fast", "500", "a,b", true),
        ("fast", "502", "a,b", true),
        ("fast", "429", "a,b", true),
        ("fast", "404", "a,b", false),
        ("strict", "500", "a,b", true),
        ("strict", "429", "a,b", true),
        ("strict", "503", "a,b", false),
        ("strict", "502", "a,b", false),
        // the last deployment's error goes to the client as it is
        ("fast", "500", "a", false),
    ] {
        let mut rig = upstream_with(&signals_doc());
        let (view, commands) = attempt_answers(&mut rig, group, ("1", plan), status, &[], 0);
        assert_eq!(
            view.response_header_text("x-llm-fallback"),
            marked.then(|| format!("status_{status}")),
            "{group} {status} {plan}"
        );
        assert_eq!(
            counted(&commands, &format!("status_fallbacks.{status}")),
            marked
        );
    }
}

#[test]
fn admission_skips_a_cooling_deployment_until_its_deadline() {
    let mut rig = Rig::new(DOC);
    // the breaker's state and the deadline in one value
    rig.store.set(&key("a"), b"c 0 0 0 0 2000", 0).unwrap();
    let first = |rig: &mut Rig, ms: u64, context: u32, group: &str| {
        let view = FakeView::request(
            "/v1/chat/completions",
            &[("x-llm-groups", "*")],
            &chat(group),
        );
        view.set_ms(ms);
        let (_, commands) = rig.send(&view, context);
        (view.header("x-llm-deployment"), commands)
    };
    assert_eq!(first(&mut rig, 1_000, 1, "fast").0.as_deref(), Some("b"));
    assert_eq!(first(&mut rig, 1_999, 2, "fast").0.as_deref(), Some("b"));
    // every deployment cooling: 503 with the remaining time as retry-after
    let (_, commands) = first(&mut rig, 500, 3, "solo");
    let reject = refusal(&commands).expect("refused");
    assert_eq!(reject.status, 503);
    assert!(
        reject
            .headers
            .iter()
            .any(|(n, v)| *n == "retry-after" && v == "2"),
        "{:?}",
        reject.headers
    );
    // over: a again, and its breaker was never touched
    assert_eq!(first(&mut rig, 2_000, 4, "fast").0.as_deref(), Some("a"));
    assert_eq!(rig.store.breaker("a"), State::default());
    assert_eq!(cooldown_until(&rig.store, "a"), 2000);
    // a deadline that is no number is no cooldown
    rig.store.set(&key("a"), b"c 0 0 0 0 soon", 0).unwrap();
    assert_eq!(first(&mut rig, 0, 5, "fast").0.as_deref(), Some("a"));
}

#[test]
fn the_breaker_and_the_cooldown_share_one_value_and_leave_each_other_alone() {
    use super::breakers::Entry;
    let open = State {
        phase: Phase::Open { until_ms: 9 },
        ..State::default()
    };
    for entry in [
        Entry::default(),
        Entry {
            state: open,
            cooldown_until_ms: 0,
        },
        Entry {
            state: open,
            cooldown_until_ms: 5_000,
        },
    ] {
        assert_eq!(Entry::decode(Some(&entry.encode())), entry);
    }
    assert_eq!(Entry::decode(None), Entry::default());
    assert_eq!(Entry::decode(Some(b"junk")), Entry::default());
    // a value without the deadline (as seeded) has no cooldown
    assert_eq!(Entry::decode(Some(&open.encode())).cooldown_until_ms, 0);

    let mut rig = Rig::new(DOC);
    let rules = parse_document(DOC.as_bytes()).unwrap();
    let config = rules.configs().next().unwrap();
    rig.core.record(config, "a", true, 1_000, &rig.store);
    let failed = rig.store.breaker("a");
    assert_ne!(failed, State::default());
    // a cooldown keeps the failures counted, and an outcome recorded keeps the cooldown
    assert_eq!(
        rig.core.cool_down(60_000, "a", 2_000, 1_000, &rig.store),
        Some(3_000)
    );
    assert_eq!(rig.store.breaker("a"), failed);
    assert_eq!(cooldown_until(&rig.store, "a"), 3_000);
    rig.core.record(config, "a", false, 1_500, &rig.store);
    assert_ne!(rig.store.breaker("a"), failed);
    assert_eq!(cooldown_until(&rig.store, "a"), 3_000);
    // one key per deployment (the seeds and a's): no cooldown of its own
    let keys: Vec<String> = rig.store.data.borrow().keys().cloned().collect();
    assert!(keys.contains(&key("a")), "{keys:?}");
    assert!(
        keys.iter().all(|k| k.starts_with("llm_router:breaker:")),
        "{keys:?}"
    );
}

#[test]
fn a_redirect_pass_that_answers_429_cools_its_deployment_down() {
    let mut rig = Rig::new(&redirect_doc());
    let view = FakeView::request(
        "/v1/chat/completions",
        &[("x-llm-groups", "*")],
        &chat("solo"),
    );
    view.set_ms(1_000);
    rig.send(&view, 1);
    view.respond("429", &[("retry-after", "3")]);
    let commands = rig.response(&view, 1);
    assert!(counted(&commands, "cooldown.a"));
    assert_eq!(cooldown_until(&rig.store, "a"), 4_000);
}

#[test]
fn forget_drops_a_requests_state() {
    let mut rig = Rig::new(DOC);
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], CHAT);
    rig.send(&view, 9);
    assert_eq!(rig.core.requests(), 1);
    rig.core.forget(9);
    assert_eq!(rig.core.requests(), 0);
    view.respond("200", &[]);
    assert!(rig.response(&view, 9).is_empty());
}

// ---------------------------------------------------------------------------------------
// Whatever the client, the provider or another filter sends

mod arbitrary {
    use super::*;
    use proptest::prelude::*;

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            Just("*".to_string()),
            Just("2|fast|rid|a,b".to_string()),
            "[ -~]{0,40}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Every event of both roles with junk in every header, property and body: no panic,
        /// a refusal always pauses, and a request's state goes with its context.
        #[test]
        fn the_core_never_panics_and_a_refusal_always_pauses(
            path in prop_oneof![
                Just("/v1/chat/completions"), Just("/v1/messages"), Just("/v1/models"),
                Just("/v1/models/fast"), Just("/v1/messages/count_tokens"), Just("/x"),
            ],
            get in any::<bool>(),
            upstream_role in any::<bool>(),
            redirect in any::<bool>(),
            groups in text(),
            route_next in text(),
            attempt in text(),
            plan in text(),
            body in prop_oneof![
                Just(CHAT.as_bytes().to_vec()),
                Just(chat("smart").into_bytes()),
                proptest::collection::vec(any::<u8>(), 0..120),
            ],
            status in text(),
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..60), 0..4),
            details in text(),
        ) {
            let doc = if redirect { redirect_doc() } else { DOC.to_string() };
            let mut rig = if upstream_role { upstream() } else { Rig::new(&doc) };
            let view = FakeView::request(path, &[
                ("x-llm-groups", &groups),
                ("x-llm-reentry", "t"),
                ("x-llm-route-next", &route_next),
                ("x-envoy-attempt-count", &attempt),
            ], "");
            *view.request_body.borrow_mut() = body.clone();
            if get {
                put(&mut view.request.borrow_mut(), ":method", b"GET");
            }
            view.set_prop("llm_route_plan", plan.as_bytes());
            view.set_prop("llm_budget_fallback", b"cheap");
            view.set_prop("response.code_details", details.as_bytes());
            let mut events = vec![
                Input::RequestHeaders { end_of_stream: false },
                Input::RequestBody { size: body.len(), end_of_stream: true },
            ];
            view.respond(&status, &[SSE]);
            events.push(Input::ResponseHeaders { end_of_stream: false });
            for (n, chunk) in chunks.iter().enumerate() {
                events.push(Input::ResponseBody { size: chunk.len(), end_of_stream: n + 1 == chunks.len() });
            }
            events.push(Input::Log);
            let mut chunk = chunks.iter();
            for input in events {
                if let Input::ResponseBody { .. } = input {
                    *view.response_body.borrow_mut() = chunk.next().cloned().unwrap_or_default();
                }
                let (flow, commands) = rig.run(&view, 1, input);
                if commands.iter().any(|c| matches!(c, Effect::Refuse(_) | Effect::Own(Own::Reply { .. }))) {
                    prop_assert_eq!(flow, Next::Pause);
                }
            }
            rig.core.forget(1);
            prop_assert_eq!(rig.core.requests(), 0);
        }
    }
}

#[test]
fn breaker_metric_names_keep_a_deployment_in_one_label_segment() {
    use super::breakers::metric_segment;
    assert_eq!(metric_segment("openai-4o_mini"), "openai-4o_mini");
    // names may hold `.:@/` (shared::config::validate_name); `.` would split the label
    assert_eq!(metric_segment("us.east:gpt@4/o"), "us_east_gpt_4_o");
}
