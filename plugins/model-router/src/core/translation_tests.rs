//! Both roles on translated traffic: an OpenAI client at an Anthropic deployment and back,
//! mixed plans, Azure, the redirect passes. The fakes are `tests.rs`'s.

use super::tests::{counted, refusal, FakeView, Rig, UPSTREAM};
use super::*;
use crate::config::parse_document;
use serde_json::{json, Value};

/// Every provider, and groups that mix them.
const MIXED: &str = r#"{
    "version": "v1",
    "deployments": [
        {"name": "gpt", "cluster": "c-openai", "model": "gpt-4o", "provider": "openai", "credential": "ko"},
        {"name": "claude", "cluster": "c-anthropic", "model": "claude-x", "provider": "anthropic",
         "credential": "kc", "max_tokens": 1000},
        {"name": "az", "cluster": "c-azure", "model": "gpt-4o-mini", "provider": "azure",
         "api_version": "2024-10-21", "credential": "kz"}
    ],
    "groups": [
        {"name": "claude", "deployments": [{"deployment": "claude"}]},
        {"name": "gpt", "deployments": [{"deployment": "gpt"}]},
        {"name": "azure", "deployments": [{"deployment": "az"}]},
        {"name": "mixed", "deployments": [{"deployment": "claude"}, {"deployment": "gpt"}]},
        {"name": "mixed-openai-first", "deployments": [{"deployment": "gpt"}, {"deployment": "claude"}]}
    ]
}"#;

fn json_body(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("a JSON body")
}

fn request_json(view: &FakeView) -> Value {
    json_body(&view.request_body.borrow())
}

fn response_text(view: &FakeView) -> String {
    String::from_utf8(view.response_body.borrow().clone()).expect("UTF-8")
}

const CHAT_TO_CLAUDE: &str = r#"{"model":"claude","messages":[
    {"role":"system","content":"Be brief."},
    {"role":"user","content":"hi"}],"user":"u-1","seed":7}"#;

const MESSAGES_TO_GPT: &str = r#"{"model":"gpt","max_tokens":300,"stream":true,
    "system":"Be brief.","messages":[{"role":"user","content":"hi"}]}"#;

/// Runs the response headers and then the whole body in one chunk; the flows.
fn answer(rig: &mut Rig, view: &FakeView, context: u32, body: &str) -> (Next, Next, Vec<Effect>) {
    *view.response_body.borrow_mut() = body.as_bytes().to_vec();
    let (head, mut commands) = rig.run(
        view,
        context,
        Input::ResponseHeaders {
            end_of_stream: false,
        },
    );
    let (tail, more) = rig.run(
        view,
        context,
        Input::ResponseBody {
            size: body.len(),
            end_of_stream: true,
        },
    );
    commands.extend(more);
    (head, tail, commands)
}

#[test]
fn an_openai_client_reaches_an_anthropic_deployment() {
    let mut rig = Rig::new(MIXED);
    let view = FakeView::request(
        "/v1/chat/completions",
        &[
            ("x-llm-groups", "*"),
            ("authorization", "Bearer client"),
            ("content-length", "1"),
        ],
        CHAT_TO_CLAUDE,
    );
    let (flow, commands) = rig.send(&view, 1);
    assert_eq!(flow, Next::Continue);
    assert!(refusal(&commands).is_none());
    // what Anthropic gets: its path, its credential headers, its shape
    assert_eq!(view.header(":path").as_deref(), Some("/v1/messages"));
    assert_eq!(view.header("x-api-key").as_deref(), Some("kc"));
    assert_eq!(view.header("authorization"), None);
    assert_eq!(
        view.header("anthropic-version").as_deref(),
        Some("2023-06-01")
    );
    let body = request_json(&view);
    assert_eq!(body["model"], "claude-x");
    assert_eq!(body["system"], "Be brief.");
    assert_eq!(body["messages"], json!([{"role": "user", "content": "hi"}]));
    // the deployment's cap, Anthropic requires one
    assert_eq!(body["max_tokens"], 1000);
    assert_eq!(body["metadata"]["user_id"], "u-1");
    assert!(body.get("seed").is_none() && body.get("user").is_none());
    assert_eq!(
        view.header("content-length"),
        Some(view.request_body.borrow().len().to_string())
    );
    assert!(counted(&commands, "translated.chat.completions.messages"));
    // the filters after the router learn the client's API
    assert_eq!(view.route().client_api.as_deref(), Some("chat.completions"));

    // the answer comes back in the client's API, its length framed
    view.respond(
        "200",
        &[
            ("content-type", "application/json"),
            ("content-length", "999"),
        ],
    );
    view.set_prop("response.code_details", b"via_upstream");
    let anthropic = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-x",
        "content":[{"type":"text","text":"Hello!"}],"stop_reason":"end_turn","stop_sequence":null,
        "usage":{"input_tokens":10,"output_tokens":3,"cache_read_input_tokens":4,"cache_creation_input_tokens":0}}"#;
    let (head, tail, _) = answer(&mut rig, &view, 1, anthropic);
    assert_eq!(head, Next::Pause, "the body is held whole");
    assert_eq!(tail, Next::Continue);
    let chat = json_body(&view.response_body.borrow());
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(chat["choices"][0]["message"]["content"], "Hello!");
    assert_eq!(chat["choices"][0]["finish_reason"], "stop");
    assert_eq!(chat["usage"]["prompt_tokens"], 14);
    assert_eq!(chat["usage"]["completion_tokens"], 3);
    assert_eq!(chat["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
    assert_eq!(
        view.response_header_text("content-length"),
        Some(view.response_body.borrow().len().to_string())
    );
    // the fields with no counterpart are named
    assert_eq!(
        view.response_header_text("x-llm-translation-dropped")
            .as_deref(),
        Some("seed")
    );
}

#[test]
fn a_field_the_deployment_cannot_take_is_refused_naming_it() {
    let mut rig = Rig::new(MIXED);
    let body = r#"{"model":"claude","n":2,"messages":[{"role":"user","content":"hi"}]}"#;
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], body);
    let (flow, commands) = rig.send(&view, 1);
    assert_eq!(flow, Next::Pause);
    let reject = refusal(&commands).expect("refused");
    assert_eq!(reject.status, 400);
    assert!(reject.message.contains("`n`"), "{}", reject.message);
    assert_eq!(
        view.header(":path").as_deref(),
        Some("/v1/chat/completions")
    );
}

#[test]
fn an_anthropic_client_streams_from_an_openai_deployment() {
    let mut rig = Rig::new(MIXED);
    let view = FakeView::request(
        "/v1/messages",
        &[
            ("x-llm-groups", "*"),
            ("x-api-key", "client"),
            ("anthropic-version", "2023-06-01"),
            ("anthropic-beta", "tools-2024-04-04"),
        ],
        MESSAGES_TO_GPT,
    );
    let (flow, _) = rig.send(&view, 1);
    assert_eq!(flow, Next::Continue);
    assert_eq!(
        view.header(":path").as_deref(),
        Some("/v1/chat/completions")
    );
    assert_eq!(view.header("authorization").as_deref(), Some("Bearer ko"));
    for gone in ["x-api-key", "anthropic-version", "anthropic-beta"] {
        assert_eq!(view.header(gone), None, "{gone}");
    }
    let body = request_json(&view);
    assert_eq!(body["model"], "gpt-4o");
    assert_eq!(body["max_completion_tokens"], 300);
    assert_eq!(body["stream_options"]["include_usage"], true);
    assert_eq!(
        body["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );

    view.respond("200", &[("content-type", "text/event-stream")]);
    view.set_prop("response.code_details", b"via_upstream");
    let (head, commands) = rig.run(
        &view,
        1,
        Input::ResponseHeaders {
            end_of_stream: false,
        },
    );
    assert_eq!(head, Next::Continue);
    assert!(commands.iter().any(|c| matches!(
        c,
        Effect::RemoveHeader(Map::Response, name) if *name == "content-length"
    )));
    let chunks = [
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\ndata: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\ndata: [DONE]\n\n",
    ];
    let mut client = String::new();
    for (i, chunk) in chunks.iter().enumerate() {
        *view.response_body.borrow_mut() = chunk.as_bytes().to_vec();
        let (flow, _) = rig.run(
            &view,
            1,
            Input::ResponseBody {
                size: chunk.len(),
                end_of_stream: i + 1 == chunks.len(),
            },
        );
        assert_ne!(flow, Next::Pause, "a stream is never held");
        client.push_str(&response_text(&view));
    }
    let events: Vec<&str> = client
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("event: ")))
        .collect();
    assert_eq!(events.first(), Some(&"message_start"), "{client}");
    assert_eq!(events.last(), Some(&"message_stop"), "{client}");
    assert!(events.contains(&"content_block_delta"), "{client}");
    assert!(client.contains("\"text\":\"Hel\"") && client.contains("\"text\":\"lo\""));
    assert!(client.contains("\"stop_reason\":\"end_turn\""), "{client}");
    assert!(client.contains("\"output_tokens\":2"), "{client}");
    assert!(!client.contains("[DONE]") && !client.contains("chat.completion.chunk"));
}

#[test]
fn a_provider_error_reaches_the_client_in_its_api() {
    let mut rig = Rig::new(MIXED);
    let view = FakeView::request(
        "/v1/chat/completions",
        &[("x-llm-groups", "*")],
        CHAT_TO_CLAUDE,
    );
    rig.send(&view, 1);
    view.respond("429", &[("content-type", "application/json")]);
    view.set_prop("response.code_details", b"via_upstream");
    let error = r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#;
    let (head, tail, _) = answer(&mut rig, &view, 1, error);
    assert_eq!((head, tail), (Next::Pause, Next::Continue));
    assert_eq!(view.response_header_text(":status").as_deref(), Some("429"));
    let body = json_body(&view.response_body.borrow());
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert_eq!(body["error"]["message"], "slow down");
}

#[test]
fn the_gateways_own_replies_are_not_translated() {
    let mut rig = Rig::new(MIXED);
    let view = FakeView::request(
        "/v1/chat/completions",
        &[("x-llm-groups", "*")],
        CHAT_TO_CLAUDE,
    );
    rig.send(&view, 1);
    // token-ratelimit refused it after the router: its reply is the gateway's
    view.respond("429", &[("content-type", "application/json")]);
    view.set_prop("response.code_details", b"token_ratelimit.rate_limited");
    let (flow, _) = rig.run(
        &view,
        1,
        Input::ResponseHeaders {
            end_of_stream: false,
        },
    );
    assert_eq!(flow, Next::ContinueSkipResponseBody);
}

#[test]
fn a_provider_answer_that_cannot_be_translated_becomes_a_502_in_the_clients_api() {
    let mut rig = Rig::new(MIXED);
    let view = FakeView::request(
        "/v1/messages",
        &[("x-llm-groups", "*")],
        MESSAGES_TO_GPT.replace(",\"stream\":true", "").as_str(),
    );
    rig.send(&view, 1);
    view.respond("200", &[("content-type", "application/json")]);
    view.set_prop("response.code_details", b"via_upstream");
    let (_, tail, commands) = answer(&mut rig, &view, 1, "<html>not json</html>");
    assert_eq!(tail, Next::Continue);
    assert_eq!(view.response_header_text(":status").as_deref(), Some("502"));
    let body = json_body(&view.response_body.borrow());
    assert_eq!(body["type"], "error", "Anthropic's error shape");
    assert_eq!(body["error"]["type"], "api_error");
    assert!(counted(&commands, "translation.malformed_responses"));
}

#[test]
fn a_plan_whose_first_deployment_speaks_the_clients_api_is_not_translated_here() {
    let mut rig = Rig::new(MIXED);
    let body = r#"{"model":"mixed-openai-first","messages":[{"role":"user","content":"hi"}]}"#;
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], body);
    rig.send(&view, 1);
    assert_eq!(
        view.header(":path").as_deref(),
        Some("/v1/chat/completions")
    );
    assert_eq!(request_json(&view)["model"], "gpt-4o");
    assert_eq!(view.route().client_api, None);
    assert_eq!(view.prop("llm_route_plan").as_deref(), Some("gpt,claude"));
}

#[test]
fn an_azure_deployment_gets_its_path_and_api_key() {
    let mut rig = Rig::new(MIXED);
    let body = r#"{"model":"azure","messages":[{"role":"user","content":"hi"}]}"#;
    let view = FakeView::request(
        "/v1/chat/completions",
        &[("x-llm-groups", "*"), ("authorization", "Bearer client")],
        body,
    );
    rig.send(&view, 1);
    assert_eq!(
        view.header(":path").as_deref(),
        Some("/openai/deployments/gpt-4o-mini/chat/completions?api-version=2024-10-21")
    );
    assert_eq!(view.header("api-key").as_deref(), Some("kz"));
    assert_eq!(view.header("authorization"), None);
    assert_eq!(request_json(&view)["model"], "gpt-4o-mini");
}

// ---------------------------------------------------------------------------------------
// The upstream role: an attempt at another API than the body's

fn upstream_mixed() -> Rig {
    let rig = Rig::new(UPSTREAM);
    *rig.listener.borrow_mut() = Some(Rc::new(parse_document(MIXED.as_bytes()).unwrap()));
    rig
}

/// Attempt `number` of plan `plan` for a body of the listener's filters at `path`.
fn attempt_at(number: &str, plan: &str, path: &str, body: &str) -> FakeView {
    let view = FakeView::request(
        path,
        &[
            ("x-envoy-attempt-count", number),
            ("x-api-key", "kc"),
            ("anthropic-version", "2023-06-01"),
        ],
        body,
    );
    view.set_prop("llm_route_plan", plan.as_bytes());
    view
}

fn send_attempt(rig: &mut Rig, view: &FakeView) -> (Next, Vec<Effect>) {
    let (flow, mut commands) = rig.run(
        view,
        1,
        Input::RequestHeaders {
            end_of_stream: false,
        },
    );
    assert_eq!(flow, Next::Pause);
    let size = view.request_body.borrow().len();
    let (flow, more) = rig.run(
        view,
        1,
        Input::RequestBody {
            size,
            end_of_stream: true,
        },
    );
    commands.extend(more);
    (flow, commands)
}

/// The body the listener's filters passed on for `mixed` (claude first): Messages.
const MESSAGES_BODY: &str = r#"{"model":"claude-x","max_tokens":1000,"system":"Be brief.",
    "messages":[{"role":"user","content":"hi"}]}"#;

#[test]
fn a_fallback_to_another_api_is_translated_there_and_back() {
    let mut rig = upstream_mixed();
    let view = attempt_at("2", "claude,gpt", "/v1/messages", MESSAGES_BODY);
    let (flow, commands) = send_attempt(&mut rig, &view);
    assert_eq!(flow, Next::Continue);
    assert!(refusal(&commands).is_none());
    // the OpenAI deployment gets its own API, path and credential
    assert_eq!(
        view.header(":path").as_deref(),
        Some("/v1/chat/completions")
    );
    assert_eq!(view.header("authorization").as_deref(), Some("Bearer ko"));
    assert_eq!(view.header("x-api-key"), None);
    assert_eq!(view.header("anthropic-version"), None);
    let body = request_json(&view);
    assert_eq!(body["model"], "gpt-4o");
    assert_eq!(body["messages"][0]["role"], "system");
    assert_eq!(
        view.header("content-length"),
        Some(view.request_body.borrow().len().to_string())
    );
    // a later attempt finds the body's path although this one changed `:path`
    assert_eq!(
        view.prop("llm_route_body_path").as_deref(),
        Some("/v1/messages")
    );

    // and the answer goes back into the body's API for the listener's filters
    view.respond("200", &[("content-type", "application/json")]);
    let chat = r#"{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o",
        "choices":[{"index":0,"message":{"role":"assistant","content":"Hello!"},"finish_reason":"stop"}],
        "usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}"#;
    let (head, tail, _) = answer(&mut rig, &view, 1, chat);
    assert_eq!((head, tail), (Next::Pause, Next::Continue));
    let message = json_body(&view.response_body.borrow());
    assert_eq!(message["type"], "message");
    assert_eq!(message["content"][0]["text"], "Hello!");
    assert_eq!(message["usage"]["input_tokens"], 9);
}

#[test]
fn a_third_attempt_reads_the_bodys_api_from_filter_state() {
    let mut rig = upstream_mixed();
    // attempt 2 went to claude and left `:path` at /v1/messages; the body is Chat
    let chat = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
    let view = attempt_at("3", "gpt,claude,gpt", "/v1/messages", chat);
    view.set_prop("llm_route_body_path", b"/v1/chat/completions");
    let (flow, _) = send_attempt(&mut rig, &view);
    assert_eq!(flow, Next::Continue);
    assert_eq!(
        view.header(":path").as_deref(),
        Some("/v1/chat/completions")
    );
    let body = request_json(&view);
    assert_eq!(body["model"], "gpt-4o");
    assert_eq!(body["messages"], json!([{"role": "user", "content": "hi"}]));
}

#[test]
fn an_attempt_at_the_bodys_api_is_rewritten_as_before() {
    let mut rig = upstream_mixed();
    let view = attempt_at("1", "claude,gpt", "/v1/messages", MESSAGES_BODY);
    let (flow, commands) = send_attempt(&mut rig, &view);
    assert_eq!(flow, Next::Continue);
    assert_eq!(view.header(":path").as_deref(), Some("/v1/messages"));
    assert_eq!(view.prop("llm_route_body_path"), None);
    assert!(!commands
        .iter()
        .any(|c| matches!(c, Effect::Count(n, 1) if n.starts_with("translated."))));
    view.respond("200", &[("content-type", "application/json")]);
    let (flow, _) = rig.run(
        &view,
        1,
        Input::ResponseHeaders {
            end_of_stream: false,
        },
    );
    assert_eq!(
        flow,
        Next::ContinueSkipResponseBody,
        "nothing to translate back"
    );
}

// ---------------------------------------------------------------------------------------
// The redirect fallback: each pass translates from the body it got

fn redirect_mixed() -> String {
    MIXED.replace(
        "\"version\": \"v1\",",
        "\"version\": \"v1\", \"fallback\": \"redirect\",",
    )
}

#[test]
fn a_redirect_pass_translates_from_the_body_the_last_pass_left() {
    let mut rig = Rig::new(&redirect_mixed());
    // pass 1: an OpenAI client, claude first
    let body = r#"{"model":"mixed","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let first = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], body);
    rig.send(&first, 1);
    assert_eq!(first.header(":path").as_deref(), Some("/v1/messages"));
    // where Higress's redirect (use_original_request_uri) finds the client's path again
    assert_eq!(
        first.header("x-envoy-original-path").as_deref(),
        Some("/v1/chat/completions")
    );
    let next = first.prop("llm_route_next").expect("a continuation");
    assert!(next.ends_with("|claude,gpt|chat+stream"), "{next}");

    // pass 2: upstream Envoy re-sends the edited body to the edited path
    let second = FakeView::request(
        "/v1/messages",
        &[
            ("x-llm-groups", "*"),
            ("x-llm-reentry", "1"),
            ("x-llm-route-next", &next),
            ("x-api-key", "kc"),
            ("anthropic-version", "2023-06-01"),
        ],
        &String::from_utf8(first.request_body.borrow().clone()).unwrap(),
    );
    let (flow, commands) = rig.send(&second, 2);
    assert_eq!(flow, Next::Continue);
    assert!(refusal(&commands).is_none());
    assert_eq!(
        second.header(":path").as_deref(),
        Some("/v1/chat/completions")
    );
    assert_eq!(second.header("authorization").as_deref(), Some("Bearer ko"));
    assert_eq!(second.header("x-api-key"), None);
    let body = request_json(&second);
    assert_eq!(body["model"], "gpt-4o");
    assert_eq!(body["stream"], true);
    // back in the client's own API: no usage chunk it did not ask for
    assert!(body.get("stream_options").is_none(), "{body}");
    // the client and the deployment speak one API: the answer is not translated
    second.respond("200", &[("content-type", "text/event-stream")]);
    second.set_prop("response.code_details", b"via_upstream");
    let (flow, _) = rig.run(
        &second,
        2,
        Input::ResponseHeaders {
            end_of_stream: false,
        },
    );
    assert_eq!(flow, Next::Continue, "the stream guard, no translation");
    assert_eq!(second.route().client_api, None);
}

/// Higress re-sends the client's original body (`use_original_request_body`) at the path its
/// `use_original_request_uri` takes from `x-envoy-original-path`: the client's. Each pass then
/// translates from the client's API, and nothing of the body is lost (the client's system
/// prompt in either API).
#[test]
fn a_higress_pass_gets_the_original_body_at_the_clients_path() {
    for (path, client_body, plan, answering_path) in [
        (
            "/v1/chat/completions",
            r#"{"model":"mixed","stream":true,"max_completion_tokens":300,"messages":[
                {"role":"system","content":"Be brief."},{"role":"user","content":"hi"}]}"#,
            "|claude,gpt|chat+stream",
            "/v1/chat/completions",
        ),
        (
            "/v1/messages",
            r#"{"model":"mixed-openai-first","max_tokens":300,"system":"Be brief.",
                "messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#,
            "|gpt,claude|messages+usage",
            "/v1/messages",
        ),
    ] {
        let mut rig = Rig::new(&redirect_mixed());
        let first = FakeView::request(path, &[("x-llm-groups", "*")], client_body);
        rig.send(&first, 1);
        assert_ne!(first.header(":path").as_deref(), Some(path), "translated");
        assert_eq!(first.header("x-envoy-original-path").as_deref(), Some(path));
        let next = first.prop("llm_route_next").expect("a continuation");
        assert!(next.ends_with(plan), "{next}");

        let second = FakeView::request(
            path,
            &[
                ("x-llm-groups", "*"),
                ("x-llm-reentry", "1"),
                ("x-llm-route-next", &next),
                ("x-envoy-original-path", path),
            ],
            client_body,
        );
        let (flow, commands) = rig.send(&second, 2);
        assert_eq!(flow, Next::Continue, "{:?}", refusal(&commands));
        assert_eq!(second.header(":path").as_deref(), Some(answering_path));
        // the header stays the client's path for a later pass
        assert_eq!(
            second.header("x-envoy-original-path").as_deref(),
            Some(path)
        );
        let body = request_json(&second);
        assert!(body.to_string().contains("Be brief."), "{body}");
        assert_eq!(
            second.route().client_api,
            None,
            "answered in the client's API"
        );
    }
}

#[test]
fn only_a_redirect_pass_that_moves_the_path_records_the_clients() {
    // retries: no redirect will read it
    let mut rig = Rig::new(MIXED);
    let view = FakeView::request(
        "/v1/chat/completions",
        &[("x-llm-groups", "*")],
        CHAT_TO_CLAUDE,
    );
    rig.send(&view, 1);
    assert_eq!(view.header(":path").as_deref(), Some("/v1/messages"));
    assert_eq!(view.header("x-envoy-original-path"), None);
    // redirect, the path as it is: nothing to record
    let mut rig = Rig::new(&redirect_mixed());
    let body = r#"{"model":"mixed-openai-first","messages":[{"role":"user","content":"hi"}]}"#;
    let view = FakeView::request("/v1/chat/completions", &[("x-llm-groups", "*")], body);
    rig.send(&view, 1);
    assert_eq!(
        view.header(":path").as_deref(),
        Some("/v1/chat/completions")
    );
    assert_eq!(view.header("x-envoy-original-path"), None);
}
