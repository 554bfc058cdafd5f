//! The model router's translation between OpenAI Chat Completions and Anthropic Messages,
//! proven with the unmodified official SDKs: `tests/sdk/translation.py` runs the `openai` and
//! `anthropic` Python SDKs (the versions `scripts/setup` pins into `.venv`) against the demo
//! gateway (`envoy-config/gateway.yaml`, or the form `demo::config()` picks, with its three
//! flavored mock providers, each of which serves and validates only its own provider's API):
//!
//! * the `openai` SDK at group `claude` (an Anthropic deployment): completions, streams with and
//!   without the usage chunk, tool calls and their results, an image, PII, typed errors;
//! * the `anthropic` SDK at group `fast` (an OpenAI deployment first): messages, streams, tool
//!   use and results, token counting the gateway answers itself, typed errors;
//! * with Anthropic failing, both SDKs at the mixed group `code` = [claude, openai-4o]; with
//!   OpenAI failing, both SDKs at `code` ordered [openai-4o, claude] (a variant of the config)
//!   and the `anthropic` SDK at `fast`, which falls back to Azure OpenAI's deployment path. Each
//!   such request has one usage record naming both attempts and charging the answering
//!   deployment's price.
//!
//! The script checks what each SDK gives its caller; each test checks that the script passed,
//! then holds its observations against what the providers received (path, credential header,
//! model, body shape) and, for the fallbacks, the access log.

use llm_gateway_tests::demo::{
    Demo, ANTHROPIC_CREDENTIAL, AZURE_CREDENTIAL, DEMO_KEY, FAST_ONLY_KEY, OPENAI_CREDENTIAL,
};
use llm_gateway_tests::workspace;
use mock_upstream::{MockUpstream, RecordedRequest};
use serde_json::{json, Value};

const EMAIL: &str = "jane.doe@example.com";
/// What translation.py sends (its constants of the same names).
const SYSTEM: &str = "You are terse.";
const PII_MESSAGE: &str = "Please write to jane.doe@example.com about the invoice.";
const TOOL_RESULT: &str = "Sunny, 21 degrees";
const IMAGE_DATA: &str = "iVBORw0KGgo=";
/// Prices of gateway.yaml, nano-USD per token (micro-USD per 1M tokens ÷ 1000): input,
/// cached input, output.
const OPENAI_4O_NANO: (u64, u64, u64) = (2_500, 1_250, 10_000);
const CLAUDE_NANO: (u64, u64, u64) = (3_000, 300, 15_000);
/// Where each provider serves its API (Azure OpenAI: azure-mini's deployment and api_version).
const ANTHROPIC_PATH: &str = "/v1/messages";
const CHAT_PATH: &str = "/v1/chat/completions";
const AZURE_MINI_PATH: &str =
    "/openai/deployments/gpt-4o-mini/chat/completions?api-version=2024-10-21";

/// The SDK versions `scripts/setup` pins (`openai_version=`, `anthropic_version=`).
fn pinned(name: &str) -> String {
    let setup = std::fs::read_to_string(workspace::root().join("scripts/setup")).unwrap();
    let prefix = format!("{name}_version=");
    setup
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("scripts/setup pins {prefix}"))
        .trim()
        .to_string()
}

/// Runs translation.py with `args` against `demo`; its observations.
async fn run_sdks(demo: &Demo, args: &[&str]) -> Value {
    let root = workspace::root();
    let python = root.join(".venv/bin/python");
    let script = root.join("tests/sdk/translation.py");
    let mut command = std::process::Command::new(&python);
    command
        .arg(&script)
        .args(["--gateway", &demo.url(), "--key", DEMO_KEY])
        .args(args)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    let out = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/setup)", python.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "translation.py {args:?} failed ({}):\n--- stderr\n{stderr}\n--- stdout\n{stdout}\n--- envoy\n{}",
        out.status,
        demo.envoy.logs()
    );
    let obs: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("translation.py printed no JSON ({e}):\n{stdout}\n{stderr}"));
    assert_eq!(obs["sdk_versions"]["openai"], pinned("openai").as_str());
    assert_eq!(
        obs["sdk_versions"]["anthropic"],
        pinned("anthropic").as_str()
    );
    assert_nothing_leaked(&obs);
    obs
}

/// No client received a provider credential or a PII placeholder, in any header or body.
fn assert_nothing_leaked(obs: &Value) {
    for exchange in obs["exchanges"].as_array().unwrap() {
        let received = format!("{} {}", exchange["headers"], exchange["body"]);
        for secret in [OPENAI_CREDENTIAL, AZURE_CREDENTIAL, ANTHROPIC_CREDENTIAL] {
            assert!(
                !received.contains(secret),
                "a provider credential reached the client: {exchange}"
            );
        }
        assert!(
            !received.contains("[EMAIL_"),
            "a placeholder reached the client: {exchange}"
        );
    }
}

/// A step's observations (`steps.<name>`).
fn step<'a>(obs: &'a Value, name: &str) -> &'a Value {
    let step = &obs["steps"][name];
    assert!(step.is_object(), "no step {name}: {}", obs["steps"]);
    step
}

/// The requests `mock` received for the step `name` (its `x-run-id`).
fn at(mock: &MockUpstream, name: &str) -> Vec<RecordedRequest> {
    mock.requests()
        .into_iter()
        .filter(|r| r.header("x-run-id") == Some(name))
        .collect()
}

/// The one request of step `name` at `mock`.
fn one_at(mock: &MockUpstream, name: &str) -> RecordedRequest {
    let seen = at(mock, name);
    assert_eq!(seen.len(), 1, "{name}: {seen:?}");
    seen.into_iter().next().unwrap()
}

/// What no provider may receive: a virtual key, a gateway-internal header, the end user's id,
/// the client's address; and a body framed by its length.
fn assert_private(seen: &RecordedRequest) {
    for (name, value) in &seen.headers {
        assert!(
            !value.contains(DEMO_KEY) && !value.contains(FAST_ONLY_KEY),
            "a virtual key reached the provider in {name}: {seen:?}"
        );
        assert!(
            !name.starts_with("x-llm-")
                && !name.starts_with("x-envoy-")
                && !name.starts_with("x-forwarded-")
                && name != "x-user-id",
            "{name} reached the provider: {seen:?}"
        );
    }
    assert_eq!(
        seen.header("content-length"),
        Some(seen.body.len().to_string().as_str()),
        "{seen:?}"
    );
    assert!(
        !String::from_utf8_lossy(&seen.body).contains(EMAIL),
        "the provider saw the address: {seen:?}"
    );
}

/// An Anthropic deployment's view: `POST /v1/messages`, its credential in `x-api-key`,
/// `anthropic-version`, no `authorization`, the deployment's model, `max_tokens`, only user and
/// assistant turns, no OpenAI-only fields. The body.
fn anthropic_request(seen: &RecordedRequest) -> Value {
    let shown = format!("{seen:?}");
    assert_private(seen);
    assert_eq!(seen.method, "POST", "{shown}");
    assert_eq!(seen.path, ANTHROPIC_PATH, "{shown}");
    assert_eq!(
        seen.header("x-api-key"),
        Some(ANTHROPIC_CREDENTIAL),
        "{shown}"
    );
    assert!(seen.header("anthropic-version").is_some(), "{shown}");
    assert_eq!(seen.header("authorization"), None, "{shown}");
    assert_eq!(seen.header("api-key"), None, "{shown}");
    let body = seen.json().unwrap_or_else(|| panic!("{shown}"));
    assert_eq!(body["model"], "claude-sonnet-4-5", "{body}");
    assert!(body["max_tokens"].as_u64().is_some_and(|m| m > 0), "{body}");
    for message in body["messages"].as_array().unwrap() {
        let role = message["role"].as_str().unwrap();
        assert!(role == "user" || role == "assistant", "{body}");
    }
    for field in ["stream_options", "max_completion_tokens", "n", "tool_calls"] {
        assert!(body.get(field).is_none(), "{field}: {body}");
    }
    body
}

/// An OpenAI deployment's view (`credential` `(header, value)`, `path`): no Anthropic header,
/// the model, a chat body (no top-level `system`). The body.
fn chat_request(
    seen: &RecordedRequest,
    path: &str,
    credential: (&str, &str),
    model: &str,
) -> Value {
    let shown = format!("{seen:?}");
    assert_private(seen);
    assert_eq!(seen.method, "POST", "{shown}");
    assert_eq!(seen.path, path, "{shown}");
    assert_eq!(seen.header(credential.0), Some(credential.1), "{shown}");
    for absent in ["x-api-key", "anthropic-version", "anthropic-beta"] {
        assert_eq!(seen.header(absent), None, "{absent}: {shown}");
    }
    if credential.0 != "authorization" {
        assert_eq!(seen.header("authorization"), None, "{shown}");
    }
    let body = seen.json().unwrap_or_else(|| panic!("{shown}"));
    // Azure OpenAI names the model in the path; a `model` in the body must agree
    if path == CHAT_PATH || body.get("model").is_some() {
        assert_eq!(body["model"], model, "{body}");
    }
    for field in ["system", "stop_sequences", "top_k", "anthropic_version"] {
        assert!(body.get(field).is_none(), "{field}: {body}");
    }
    body
}

fn openai_request(seen: &RecordedRequest, model: &str) -> Value {
    let credential = format!("Bearer {OPENAI_CREDENTIAL}");
    chat_request(seen, CHAT_PATH, ("authorization", &credential), model)
}

fn azure_request(seen: &RecordedRequest) -> Value {
    chat_request(
        seen,
        AZURE_MINI_PATH,
        ("api-key", AZURE_CREDENTIAL),
        "gpt-4o-mini",
    )
}

/// The text of a message's `content`: the string, or its text blocks / parts joined.
fn text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter(|p| p["type"] == "text")
            .filter_map(|p| p["text"].as_str())
            .collect(),
        _ => String::new(),
    }
}

/// Anthropic's top-level `system` as text.
fn system_text(body: &Value) -> String {
    text(&body["system"])
}

/// The chat body's system message first, holding `SYSTEM`; the messages after it.
fn after_system(body: &Value) -> Vec<Value> {
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "system", "{body}");
    assert!(text(&messages[0]["content"]).contains(SYSTEM), "{body}");
    messages[1..].to_vec()
}

/// The output cap of a chat body: `max_completion_tokens` or `max_tokens`, never both (a
/// second cap would be one the client never asked for, and one the reservation did not assume).
fn chat_cap(body: &Value, what: &str) -> u64 {
    match (
        body["max_completion_tokens"].as_u64(),
        body["max_tokens"].as_u64(),
    ) {
        (Some(cap), None) | (None, Some(cap)) => cap,
        _ => panic!("{what}: one output cap: {body}"),
    }
}

/// The usage record of a step (by its response's `x-request-id`), after checking the access
/// log holds exactly one record for it.
async fn record_of(demo: &Demo, step: &Value) -> Value {
    let id = step["request_id"].as_str().unwrap();
    let (record, _) = demo.usage_record(id).await;
    let log = std::fs::read_to_string(demo.access_log()).unwrap();
    let records = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["request_id"] == id && l["usage"].as_str().is_some_and(|u| u != "-"))
        .count();
    assert_eq!(records, 1, "records of {id}:\n{log}");
    record
}

/// `cost_nano` of `record` at `price` (input, cached input, output; nano per token).
fn cost_at(record: &Value, price: (u64, u64, u64)) -> u64 {
    let usage = &record["usage"];
    let prompt = usage["prompt_tokens"].as_u64().unwrap();
    let cached = usage["cached_prompt_tokens"].as_u64().unwrap();
    let written = usage["cache_write_tokens"].as_u64().unwrap();
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert_eq!(written, 0, "{record}");
    (prompt - cached) * price.0 + cached * price.1 + completion * price.2
}

/// A step's usage as the client saw it, as the record counts it: (prompt incl. cached,
/// cached, completion).
fn client_usage(step: &Value) -> (u64, u64, u64) {
    let usage = &step["usage"];
    if let Some(prompt) = usage["prompt_tokens"].as_u64() {
        let cached = usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        (prompt, cached, usage["completion_tokens"].as_u64().unwrap())
    } else {
        let cached = usage["cache_read_input_tokens"].as_u64().unwrap_or(0);
        let written = usage["cache_creation_input_tokens"].as_u64().unwrap_or(0);
        let input = usage["input_tokens"].as_u64().unwrap();
        (
            input + cached + written,
            cached,
            usage["output_tokens"].as_u64().unwrap(),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_talks_to_an_anthropic_deployment() {
    let demo = Demo::start(0).await.unwrap();
    let obs = run_sdks(&demo, &["--part", "openai-sdk"]).await;
    // group `claude` has one deployment: nothing went elsewhere
    assert!(demo.openai.requests().is_empty() && demo.azure.requests().is_empty());
    for seen in demo.anthropic.requests() {
        anthropic_request(&seen);
    }

    // a completion with a system message: `system` hoisted, `max_tokens` set, cached tokens
    // reported back in OpenAI's place
    let json_step = step(&obs, "oa-json");
    let body = anthropic_request(&one_at(&demo.anthropic, "oa-json"));
    assert_eq!(system_text(&body), SYSTEM, "{body}");
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": "Hello, Claude"}]),
        "{body}"
    );
    assert!(body.get("stream").is_none_or(|s| s == false), "{body}");
    assert_eq!(
        json_step["usage"]["prompt_tokens_details"]["cached_tokens"],
        3
    );
    assert_eq!(json_step["headers"]["x-llm-deployment"], "claude");
    assert_eq!(json_step["headers"]["x-llm-cached-tokens"], "3");
    // the record: the client's API and the provider's, at Claude's price with the cache read
    let record = record_of(&demo, json_step).await;
    assert_eq!(record["api"], "chat.completions", "{record}");
    assert_eq!(record["provider_api"], "messages", "{record}");
    assert_eq!(record["deployment"], "claude", "{record}");
    let (prompt, cached, completion) = client_usage(json_step);
    assert_eq!(record["usage"]["prompt_tokens"], prompt, "{record}");
    assert_eq!(record["usage"]["cached_prompt_tokens"], cached, "{record}");
    assert_eq!(record["usage"]["completion_tokens"], completion, "{record}");
    assert_eq!(
        record["cost_nano"],
        cost_at(&record, CLAUDE_NANO),
        "{record}"
    );

    // streams: Anthropic's stream asked for, no OpenAI stream_options; the usage chunk only
    // when the client asked for it
    for name in ["oa-stream-usage", "oa-stream"] {
        let body = anthropic_request(&one_at(&demo.anthropic, name));
        assert_eq!(body["stream"], true, "{body}");
        assert_eq!(system_text(&body), SYSTEM, "{body}");
        let observed = step(&obs, name);
        assert_eq!(observed["headers"]["content-type"], "text/event-stream");
        assert_eq!(observed["headers"]["x-llm-deployment"], "claude");
    }
    assert!(step(&obs, "oa-stream-usage")["usage"]["total_tokens"].as_u64() > Some(0));
    assert_eq!(step(&obs, "oa-stream")["usage"], Value::Null);

    // tools in Anthropic's shape; the calls come back as OpenAI's tool_calls
    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "description": "the city"}}, "required": ["city"]});
    for name in ["oa-tool-json", "oa-tool-stream", "oa-tool-stream-helper"] {
        let body = anthropic_request(&one_at(&demo.anthropic, name));
        assert_eq!(
            body["tools"],
            json!([{"name": "get_weather", "description": "Current weather of a city", "input_schema": schema}]),
            "{name}: {body}"
        );
    }
    let tool_json = step(&obs, "oa-tool-json");
    let arguments = json!({"query": "What is the weather in Paris?"});
    assert_eq!(tool_json["arguments"], arguments);
    assert_eq!(tool_json["name"], "get_weather");
    let streamed = &step(&obs, "oa-tool-stream")["calls"];
    assert_eq!(streamed.as_array().unwrap().len(), 1, "{streamed}");
    assert_eq!(streamed[0]["name"], "get_weather");
    let streamed_arguments: Value =
        serde_json::from_str(streamed[0]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(streamed_arguments, arguments);
    assert_eq!(step(&obs, "oa-tool-stream-helper")["arguments"], arguments);

    // the result sent back: a tool_use block in the assistant turn, a tool_result block in the
    // user turn after it, answering the same id
    let call_id = tool_json["id"].as_str().unwrap();
    let body = anthropic_request(&one_at(&demo.anthropic, "oa-tool-result"));
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "{body}");
    assert_eq!(messages[1]["role"], "assistant", "{body}");
    let uses: Vec<&Value> = messages[1]["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .collect();
    assert_eq!(
        uses,
        [&json!({"type": "tool_use", "id": call_id, "name": "get_weather", "input": arguments})],
        "{body}"
    );
    assert_eq!(messages[2]["role"], "user", "{body}");
    let result = &messages[2]["content"][0];
    assert_eq!(result["type"], "tool_result", "{body}");
    assert_eq!(result["tool_use_id"], call_id, "{body}");
    assert_eq!(text(&result["content"]), TOOL_RESULT, "{body}");
    assert_eq!(step(&obs, "oa-tool-result")["content"], TOOL_RESULT);

    // an image part as an Anthropic image block
    let body = anthropic_request(&one_at(&demo.anthropic, "oa-image"));
    let blocks = body["messages"][0]["content"].as_array().unwrap();
    assert!(
        blocks.contains(&json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": IMAGE_DATA}})),
        "{body}"
    );
    assert!(
        blocks.contains(&json!({"type": "text", "text": "What is in this image?"})),
        "{body}"
    );

    // PII: the provider saw the placeholder, the client got the address back
    for name in ["oa-pii-json", "oa-pii-stream"] {
        let body = anthropic_request(&one_at(&demo.anthropic, name));
        let said = text(&body["messages"].as_array().unwrap().last().unwrap()["content"]);
        assert_eq!(said, PII_MESSAGE.replace(EMAIL, "[EMAIL_1]"), "{body}");
        assert_eq!(step(&obs, name)["content"], PII_MESSAGE);
    }

    // the provider's errors: one attempt each, an OpenAI error with the provider's message,
    // typed by the translation's table (translate/error.rs)
    for (status, class, error_type, code) in [
        (400, "BadRequestError", "invalid_request_error", Value::Null),
        (
            429,
            "RateLimitError",
            "rate_limit_error",
            json!("rate_limit_exceeded"),
        ),
        (
            529,
            "InternalServerError",
            "server_error",
            json!("overloaded"),
        ),
    ] {
        let name = format!("oa-error-{status}");
        anthropic_request(&one_at(&demo.anthropic, &name));
        let observed = step(&obs, &name);
        assert_eq!(observed["status"], status, "{observed}");
        assert_eq!(observed["cls"], class, "{observed}");
        assert_eq!(
            observed["error"]["message"],
            format!("mock status {status}"),
            "{observed}"
        );
        assert_eq!(observed["error"]["type"], error_type, "{observed}");
        assert_eq!(observed["error"]["code"], code, "{observed}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_sdk_talks_to_an_openai_deployment() {
    let demo = Demo::start(0).await.unwrap();
    let obs = run_sdks(&demo, &["--part", "anthropic-sdk"]).await;
    assert!(demo.anthropic.requests().is_empty());

    // messages.create: a chat completion with a first system message, the cap in
    // max_completion_tokens (OpenAI's current name), OpenAI's credential only
    let body = openai_request(&one_at(&demo.openai, "an-json"), "gpt-4o-mini");
    assert_eq!(
        after_system(&body),
        [json!({"role": "user", "content": "Hello, GPT"})],
        "{body}"
    );
    assert_eq!(body["max_completion_tokens"], 200, "{body}");
    assert!(body.get("max_tokens").is_none(), "{body}");
    let json_step = step(&obs, "an-json");
    assert_eq!(json_step["headers"]["x-llm-deployment"], "openai-mini");
    let record = record_of(&demo, json_step).await;
    assert_eq!(record["api"], "messages", "{record}");
    assert_eq!(record["provider_api"], "chat.completions", "{record}");
    let (prompt, _, completion) = client_usage(json_step);
    assert_eq!(record["usage"]["prompt_tokens"], prompt, "{record}");
    assert_eq!(record["usage"]["completion_tokens"], completion, "{record}");

    // messages.stream: a chat stream that reports usage
    let body = openai_request(&one_at(&demo.openai, "an-stream"), "gpt-4o-mini");
    assert_eq!(body["stream"], true, "{body}");
    assert_eq!(body["stream_options"]["include_usage"], true, "{body}");
    after_system(&body);
    assert_eq!(
        step(&obs, "an-stream")["headers"]["content-type"],
        "text/event-stream"
    );

    // tools in OpenAI's shape
    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "description": "the city"}}, "required": ["city"]});
    for name in ["an-tool-json", "an-tool-stream"] {
        let body = openai_request(&one_at(&demo.openai, name), "gpt-4o-mini");
        assert_eq!(
            body["tools"],
            json!([{"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city", "parameters": schema}}]),
            "{name}: {body}"
        );
    }
    let input = json!({"query": "What is the weather in Paris?"});
    assert_eq!(step(&obs, "an-tool-json")["input"], input);
    assert_eq!(step(&obs, "an-tool-stream")["input"], input);

    // the tool_result sent back: the assistant's tool_calls, then a tool message
    let use_id = step(&obs, "an-tool-json")["id"].as_str().unwrap();
    let body = openai_request(&one_at(&demo.openai, "an-tool-result"), "gpt-4o-mini");
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "{body}");
    assert_eq!(messages[1]["role"], "assistant", "{body}");
    let calls = messages[1]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{body}");
    assert_eq!(calls[0]["id"], use_id, "{body}");
    assert_eq!(calls[0]["type"], "function", "{body}");
    assert_eq!(calls[0]["function"]["name"], "get_weather", "{body}");
    let arguments: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, input, "{body}");
    assert_eq!(
        messages[2],
        json!({"role": "tool", "tool_call_id": use_id, "content": TOOL_RESULT}),
        "{body}"
    );
    assert_eq!(step(&obs, "an-tool-result")["text"], TOOL_RESULT);

    // count_tokens: the gateway's estimate, no provider asked
    for mock in [&demo.openai, &demo.azure, &demo.anthropic] {
        assert!(at(mock, "an-count-tokens").is_empty());
    }
    let counted = step(&obs, "an-count-tokens");
    assert!(counted["input_tokens"].as_u64() > Some(0), "{counted}");
    assert_eq!(counted["status"], 200);

    // the providers' errors in Anthropic's shape: the 400 from the first deployment; a 429 or
    // 503 (the knob reaches both deployments) from Azure OpenAI after the fallback, its status
    // kept
    openai_request(&one_at(&demo.openai, "an-error-400"), "gpt-4o-mini");
    assert!(at(&demo.azure, "an-error-400").is_empty());
    for (status, class, error_type) in [
        (400, "BadRequestError", "invalid_request_error"),
        (429, "RateLimitError", "rate_limit_error"),
        (503, "ServiceUnavailableError", "api_error"),
    ] {
        let name = format!("an-error-{status}");
        let observed = step(&obs, &name);
        assert_eq!(observed["status"], status, "{observed}");
        assert_eq!(observed["cls"], class, "{observed}");
        assert_eq!(observed["error"]["type"], error_type, "{observed}");
        assert_eq!(
            observed["error"]["message"],
            format!("mock status {status}"),
            "{observed}"
        );
        if status != 400 {
            openai_request(&one_at(&demo.openai, &name), "gpt-4o-mini");
            azure_request(&one_at(&demo.azure, &name));
            assert_eq!(
                observed["headers"]["x-llm-deployment"], "azure-mini",
                "{observed}"
            );
            assert_eq!(observed["headers"]["x-llm-attempts"], "2", "{observed}");
        }
    }
}

/// Both SDKs, JSON and stream, at group `code`, whose first deployment fails: the second
/// answers, each request has one record naming both attempts at the answering deployment's
/// price. `first`/`then`: the deployments in plan order.
async fn check_mixed_fallback(demo: &Demo, obs: &Value, first: &str, then: &str) {
    let (answering_price, provider_api) = if then == "claude" {
        (CLAUDE_NANO, "messages")
    } else {
        (OPENAI_4O_NANO, "chat.completions")
    };
    for name in ["mx-oa-json", "mx-oa-stream", "mx-an-json", "mx-an-stream"] {
        let observed = step(obs, name);
        let stream = name.ends_with("stream");
        // each deployment got the request once, in its own API
        let messages_body = anthropic_request(&one_at(&demo.anthropic, name));
        assert_eq!(
            system_text(&messages_body),
            SYSTEM,
            "{name}: {messages_body}"
        );
        assert_eq!(
            messages_body["messages"],
            json!([{"role": "user", "content": "Hello over there"}]),
            "{name}: {messages_body}"
        );
        assert_eq!(
            messages_body["stream"] == true,
            stream,
            "{name}: {messages_body}"
        );
        let chat_body = openai_request(&one_at(&demo.openai, name), "gpt-4o");
        assert!(at(&demo.azure, name).is_empty(), "{name}");
        assert_eq!(
            after_system(&chat_body),
            [json!({"role": "user", "content": "Hello over there"})],
            "{name}: {chat_body}"
        );
        assert_eq!(chat_body["stream"] == true, stream, "{name}: {chat_body}");
        if stream {
            assert_eq!(
                chat_body["stream_options"]["include_usage"], true,
                "{chat_body}"
            );
        }
        // both deployments were asked for the same output cap
        assert_eq!(
            chat_cap(
                &chat_body,
                &format!("{name} (Messages body {messages_body})")
            ),
            messages_body["max_tokens"].as_u64().unwrap(),
            "{name}: {chat_body} {messages_body}"
        );
        let model = if then == "claude" {
            "claude-sonnet-4-5"
        } else {
            "gpt-4o"
        };
        assert_eq!(observed["model"], model, "{name}: {observed}");

        // one record: both attempts, the answering deployment's price
        let record = record_of(demo, observed).await;
        assert_eq!(record["model_group"], "code", "{record}");
        assert_eq!(record["deployment"], then, "{record}");
        assert_eq!(
            record["attempts"],
            json!([{"deployment": first, "status": 0}, {"deployment": then, "status": 200}]),
            "{record}"
        );
        let client_api = if name.contains("-oa-") {
            "chat.completions"
        } else {
            "messages"
        };
        assert_eq!(record["api"], client_api, "{record}");
        assert_eq!(record["provider_api"], provider_api, "{record}");
        assert_eq!(record["stream"], stream, "{record}");
        let (prompt, cached, completion) = client_usage(observed);
        assert_eq!(record["usage"]["prompt_tokens"], prompt, "{name}: {record}");
        assert_eq!(
            record["usage"]["cached_prompt_tokens"], cached,
            "{name}: {record}"
        );
        assert_eq!(
            record["usage"]["completion_tokens"], completion,
            "{name}: {record}"
        );
        let cost = cost_at(&record, answering_price);
        assert!(cost > 0, "{record}");
        assert_eq!(record["cost_nano"], cost, "{name}: {record}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_failing_a_mixed_group_falls_back_to_openai() {
    let demo = Demo::start(0).await.unwrap();
    demo.anthropic
        .set_default_knobs(&[("x-mock-status", "429")]);
    let obs = run_sdks(
        &demo,
        &["--fallback", "mx", "code", "openai-4o", "openai,anthropic"],
    )
    .await;
    check_mixed_fallback(&demo, &obs, "claude", "openai-4o").await;
    assert!(demo.azure.requests().is_empty());
}

/// OpenAI failing, with `code` ordered [openai-4o, claude] (a variant of the config): the mixed
/// group falls back to Anthropic (both SDKs), and `fast` to Azure OpenAI's deployment path (the
/// anthropic SDK: Messages translated to Chat for both attempts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_failing_requests_fall_back_to_anthropic_and_to_azure_openai() {
    let demo = Demo::start_variant(&[(
        r#"{"name": "code", "deployments": [{"deployment": "claude"}, {"deployment": "openai-4o"}]}"#,
        r#"{"name": "code", "deployments": [{"deployment": "openai-4o"}, {"deployment": "claude"}]}"#,
    )])
    .await
    .unwrap();
    demo.openai.set_default_knobs(&[("x-mock-status", "503")]);
    let obs = run_sdks(
        &demo,
        &[
            "--fallback",
            "mx",
            "code",
            "claude",
            "openai,anthropic",
            "--fallback",
            "az",
            "fast",
            "azure-mini",
            "anthropic",
        ],
    )
    .await;
    check_mixed_fallback(&demo, &obs, "openai-4o", "claude").await;

    // the anthropic SDK at `fast`: openai-mini's 503, then Azure OpenAI's deployment path with
    // its api-version and api-key, in Chat Completions
    for name in ["az-an-json", "az-an-stream"] {
        openai_request(&one_at(&demo.openai, name), "gpt-4o-mini");
        let body = azure_request(&one_at(&demo.azure, name));
        assert_eq!(
            after_system(&body),
            [json!({"role": "user", "content": "Hello over there"})],
            "{body}"
        );
        assert_eq!(chat_cap(&body, name), 200, "{body}");
        assert_eq!(body["stream"] == true, name.ends_with("stream"), "{body}");
        let observed = step(&obs, name);
        assert_eq!(observed["model"], "gpt-4o-mini", "{observed}");
        let record = record_of(&demo, observed).await;
        assert_eq!(record["deployment"], "azure-mini", "{record}");
        assert_eq!(
            record["attempts"],
            json!([{"deployment": "openai-mini", "status": 0}, {"deployment": "azure-mini", "status": 200}]),
            "{record}"
        );
        assert_eq!(record["api"], "messages", "{record}");
        assert_eq!(record["provider_api"], "chat.completions", "{record}");
    }
    assert_eq!(demo.azure.requests().len(), 2);
}
