//! End-to-end tests of the mock over real sockets (hyper client and raw TCP).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::HeaderMap;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mock_upstream::{Flavor, MockUpstream};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

async fn start() -> MockUpstream {
    MockUpstream::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("mock starts")
}

async fn start_flavor(flavor: Flavor) -> MockUpstream {
    MockUpstream::start_flavor(SocketAddr::from(([127, 0, 0, 1], 0)), flavor)
        .await
        .expect("mock starts")
}

/// What each provider needs to let a request in.
const OPENAI_AUTH: &[(&str, &str)] = &[("authorization", "Bearer sk-test")];
const ANTHROPIC_AUTH: &[(&str, &str)] = &[
    ("x-api-key", "sk-ant-test"),
    ("anthropic-version", "2023-06-01"),
];
const AZURE_AUTH: &[(&str, &str)] = &[("api-key", "azure-test")];
const AZURE_CHAT: &str = "/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21";

/// `auth` then `knobs`.
fn with<'a>(auth: &[(&'a str, &'a str)], knobs: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    auth.iter().chain(knobs).copied().collect()
}

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends a request and returns the response with its body still unread.
async fn request(
    client: &HttpClient,
    mock: &MockUpstream,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Response<Incoming> {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("{}{path}", mock.url()))
        .header("content-type", "application/json");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req
        .body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
        .expect("request");
    client.request(req).await.expect("response head")
}

/// Sends a request and reads the whole response.
async fn call(
    mock: &MockUpstream,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, HeaderMap, Bytes) {
    let resp = request(&client(), mock, method, path, headers, body).await;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.expect("full body").to_bytes();
    (parts.status, parts.headers, body)
}

async fn post(
    mock: &MockUpstream,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (StatusCode, HeaderMap, Bytes) {
    call(mock, "POST", path, headers, &body.to_string()).await
}

fn json_of(body: &Bytes) -> Value {
    serde_json::from_slice(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body:?}"))
}

/// The SSE events of a body: (event name, data) in order. Checks the framing.
fn sse(body: &Bytes) -> Vec<(Option<String>, String)> {
    let text = std::str::from_utf8(body).expect("utf-8 stream");
    assert!(
        text.ends_with("\n\n"),
        "stream ends with a blank line: {text:?}"
    );
    text.split_terminator("\n\n")
        .map(|event| {
            let mut name = None;
            let mut data = None;
            for line in event.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_owned());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    assert!(data.is_none(), "one data line per event: {event:?}");
                    data = Some(d.to_owned());
                } else {
                    panic!("unexpected SSE line {line:?}");
                }
            }
            (name, data.expect("data line"))
        })
        .collect()
}

/// The data of an OpenAI chat stream: the JSON chunks, after checking that `[DONE]` is last
/// (and only last).
fn chat_chunks(body: &Bytes) -> Vec<Value> {
    let events = sse(body);
    let (last, chunks) = events.split_last().expect("events");
    assert_eq!(last, &(None, "[DONE]".to_owned()));
    chunks
        .iter()
        .map(|(name, data)| {
            assert!(name.is_none());
            serde_json::from_str(data).expect("JSON chunk")
        })
        .collect()
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn tokens(n: u64) -> String {
    (0..n).map(|i| format!("tok{i} ")).collect()
}

/// "Hello world!" (12 chars: 3 + 4) and "abc" (1 + 4): 12 prompt tokens.
fn chat_body(extra: Value) -> Value {
    let mut body = json!({
        "model": "gpt-mock",
        "messages": [
            {"role": "system", "content": "abc"},
            {"role": "user", "content": [{"type": "text", "text": "Hello world!"}, {"type": "image_url", "image_url": {"url": "x"}}]}
        ]
    });
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    body
}

#[tokio::test]
async fn health_and_not_found() {
    let mock = start().await;
    let (status, _, body) = call(&mock, "GET", "/health", &[], "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&body[..], b"ok");

    for (method, path) in [
        ("GET", "/v1/chat/completions"),
        ("POST", "/v2/whatever"),
        ("GET", "/"),
    ] {
        let (status, headers, body) = call(&mock, method, path, &[], "{}").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}");
        assert_eq!(content_type(&headers), "application/json");
        let v = json_of(&body);
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "not_found");
        assert!(v["error"]["message"].is_string());
    }
}

#[tokio::test]
async fn chat_non_streaming() {
    let mock = start().await;
    let (status, headers, body) =
        post(&mock, "/v1/chat/completions", &[], &chat_body(json!({}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type(&headers), "application/json");
    let v = json_of(&body);
    assert!(v["id"].as_str().expect("id").starts_with("chatcmpl-mock-"));
    assert_eq!(v["object"], "chat.completion");
    assert!(v["created"].as_u64().expect("created") > 1_600_000_000);
    assert_eq!(v["model"], "gpt-mock");
    let choice = &v["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], tokens(8));
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20})
    );

    // Knobs: token count, prompt override, cached tokens.
    let (_, _, body) = post(
        &mock,
        "/v1/chat/completions",
        &[
            ("x-mock-chunks", "3"),
            ("x-mock-prompt-tokens", "100"),
            ("x-mock-cache-read-tokens", "40"),
        ],
        &chat_body(json!({})),
    )
    .await;
    let v = json_of(&body);
    assert_eq!(v["choices"][0]["message"]["content"], "tok0 tok1 tok2 ");
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 100, "completion_tokens": 3, "total_tokens": 103, "prompt_tokens_details": {"cached_tokens": 40}})
    );

    // Zero tokens.
    let (_, _, body) = post(
        &mock,
        "/v1/chat/completions",
        &[("x-mock-chunks", "0")],
        &chat_body(json!({})),
    )
    .await;
    let v = json_of(&body);
    assert_eq!(v["choices"][0]["message"]["content"], "");
    assert_eq!(v["usage"]["completion_tokens"], 0);
    assert_eq!(v["usage"]["total_tokens"], 12);
}

#[tokio::test]
async fn chat_ids_are_distinct() {
    let mock = start().await;
    let (_, _, a) = post(&mock, "/v1/chat/completions", &[], &chat_body(json!({}))).await;
    let (_, _, b) = post(&mock, "/v1/chat/completions", &[], &chat_body(json!({}))).await;
    assert_ne!(json_of(&a)["id"], json_of(&b)["id"]);
}

#[tokio::test]
async fn chat_streaming_with_usage() {
    let mock = start().await;
    let body = chat_body(json!({"stream": true, "stream_options": {"include_usage": true}}));
    let (status, headers, body) = post(
        &mock,
        "/v1/chat/completions",
        &[("x-mock-chunks", "5")],
        &body,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type(&headers), "text/event-stream");
    let chunks = chat_chunks(&body);
    // role chunk, 5 tokens, finish chunk, usage chunk.
    assert_eq!(chunks.len(), 1 + 5 + 1 + 1, "{chunks:#?}");
    let id = chunks[0]["id"].clone();
    for chunk in &chunks {
        assert_eq!(chunk["id"], id);
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], "gpt-mock");
        assert!(chunk["created"].is_u64());
        assert!(
            chunk.get("usage").is_some(),
            "every chunk has a usage field: {chunk}"
        );
    }
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let mut text = String::new();
    for chunk in &chunks[1..6] {
        assert_eq!(chunk["choices"][0]["finish_reason"], Value::Null);
        assert_eq!(chunk["usage"], Value::Null);
        text.push_str(
            chunk["choices"][0]["delta"]["content"]
                .as_str()
                .expect("content"),
        );
    }
    assert_eq!(text, tokens(5));
    assert_eq!(chunks[6]["choices"][0]["delta"], json!({}));
    assert_eq!(chunks[6]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[6]["usage"], Value::Null);
    assert_eq!(chunks[7]["choices"], json!([]));
    assert_eq!(
        chunks[7]["usage"],
        json!({"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17})
    );
}

#[tokio::test]
async fn chat_streaming_without_usage_request() {
    let mock = start().await;
    for extra in [
        json!({"stream": true}),
        json!({"stream": true, "stream_options": {"include_usage": false}}),
    ] {
        let (_, _, body) = post(&mock, "/v1/chat/completions", &[], &chat_body(extra)).await;
        let chunks = chat_chunks(&body);
        assert_eq!(chunks.len(), 1 + 8 + 1);
        for chunk in &chunks {
            assert!(chunk.get("usage").is_none(), "no usage field: {chunk}");
            assert_eq!(chunk["choices"].as_array().map(Vec::len), Some(1));
        }
        assert_eq!(chunks[9]["choices"][0]["finish_reason"], "stop");
    }
}

#[tokio::test]
async fn chat_usage_in_final_chunk() {
    let mock = start().await;
    for include_usage in [true, false] {
        let body =
            chat_body(json!({"stream": true, "stream_options": {"include_usage": include_usage}}));
        let (_, _, body) = post(
            &mock,
            "/v1/chat/completions",
            &[("x-mock-usage-in-final-chunk", "1"), ("x-mock-chunks", "2")],
            &body,
        )
        .await;
        let chunks = chat_chunks(&body);
        assert_eq!(
            chunks.len(),
            1 + 2 + 1,
            "no separate usage chunk: {chunks:#?}"
        );
        let last = &chunks[3];
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
        assert_eq!(
            last["usage"],
            json!({"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14})
        );
        assert!(chunks.iter().all(|c| c["choices"] != json!([])));
    }
}

#[tokio::test]
async fn chat_no_usage_knob() {
    let mock = start().await;
    let (_, _, body) = post(
        &mock,
        "/v1/chat/completions",
        &[("x-mock-no-usage", "1")],
        &chat_body(json!({})),
    )
    .await;
    let v = json_of(&body);
    assert!(v.get("usage").is_none(), "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], tokens(8));

    let body = chat_body(json!({"stream": true, "stream_options": {"include_usage": true}}));
    let (_, _, body) = post(
        &mock,
        "/v1/chat/completions",
        &[
            ("x-mock-no-usage", "true"),
            ("x-mock-usage-in-final-chunk", "1"),
        ],
        &body,
    )
    .await;
    let chunks = chat_chunks(&body);
    assert_eq!(chunks.len(), 1 + 8 + 1);
    assert!(chunks
        .iter()
        .all(|c| c.get("usage").is_none_or(Value::is_null)));
}

#[tokio::test]
async fn chat_max_tokens_caps() {
    let mock = start().await;
    // max_tokens below the knob: capped, finish_reason length.
    let (_, _, body) = post(
        &mock,
        "/v1/chat/completions",
        &[],
        &chat_body(json!({"max_tokens": 3})),
    )
    .await;
    let v = json_of(&body);
    assert_eq!(v["choices"][0]["message"]["content"], tokens(3));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(v["usage"]["total_tokens"], 15);

    // max_completion_tokens wins over max_tokens.
    let (_, _, body) = post(
        &mock,
        "/v1/chat/completions",
        &[],
        &chat_body(json!({"max_tokens": 3, "max_completion_tokens": 5})),
    )
    .await;
    let v = json_of(&body);
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["choices"][0]["finish_reason"], "length");

    // Cap equal to the count: not cut.
    let (_, _, body) = post(
        &mock,
        "/v1/chat/completions",
        &[],
        &chat_body(json!({"max_tokens": 8})),
    )
    .await;
    assert_eq!(json_of(&body)["choices"][0]["finish_reason"], "stop");

    // Streaming.
    let body = chat_body(
        json!({"stream": true, "max_tokens": 2, "stream_options": {"include_usage": true}}),
    );
    let (_, _, body) = post(&mock, "/v1/chat/completions", &[], &body).await;
    let chunks = chat_chunks(&body);
    assert_eq!(chunks.len(), 1 + 2 + 1 + 1);
    assert_eq!(chunks[3]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[4]["usage"]["completion_tokens"], 2);
}

#[tokio::test]
async fn anthropic_messages() {
    let mock = start().await;
    // system "be helpful" (10 chars: 3 + 4) + "hello" (2 + 4) + blocks "abcdefgh" (2 + 4) = 19.
    let request = json!({
        "model": "claude-mock",
        "max_tokens": 1024,
        "system": [{"type": "text", "text": "be helpful"}],
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "user", "content": [{"type": "text", "text": "abcdefgh"}, {"type": "image", "source": {}}]}
        ]
    });
    let (status, headers, body) =
        post(&mock, "/v1/messages", &[("x-mock-chunks", "4")], &request).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type(&headers), "application/json");
    let v = json_of(&body);
    assert!(v["id"].as_str().expect("id").starts_with("msg_mock_"));
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], "claude-mock");
    assert_eq!(v["content"], json!([{"type": "text", "text": tokens(4)}]));
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["stop_sequence"], Value::Null);
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 19, "output_tokens": 4, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0})
    );

    // Capped by max_tokens.
    let mut capped = request.clone();
    capped["max_tokens"] = json!(2);
    let (_, _, body) = post(&mock, "/v1/messages", &[], &capped).await;
    let v = json_of(&body);
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["usage"]["output_tokens"], 2);
}

#[tokio::test]
async fn anthropic_count_tokens() {
    let mock = start().await;
    // the same conversation as anthropic_messages: 19, without generating anything
    let request = json!({
        "model": "claude-mock",
        "system": [{"type": "text", "text": "be helpful"}],
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "user", "content": [{"type": "text", "text": "abcdefgh"}]}
        ]
    });
    let path = "/v1/messages/count_tokens";
    let (status, headers, body) = post(&mock, path, &[], &request).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type(&headers), "application/json");
    assert_eq!(json_of(&body), json!({"input_tokens": 19}));
    let (_, _, body) = post(&mock, path, &[("x-mock-prompt-tokens", "7")], &request).await;
    assert_eq!(json_of(&body), json!({"input_tokens": 7}));
    let (status, _, _) = post(&mock, path, &[], &json!({"model": "m"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn anthropic_stream() {
    let mock = start().await;
    let request = json!({
        "model": "claude-mock",
        "max_tokens": 1024,
        "stream": true,
        "system": "be helpful",
        "messages": [{"role": "user", "content": "hello"}]
    });
    let (status, headers, body) = post(
        &mock,
        "/v1/messages",
        &[("x-mock-chunks", "3"), ("x-mock-cache-read-tokens", "50")],
        &request,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type(&headers), "text/event-stream");
    let events = sse(&body);
    let names: Vec<&str> = events
        .iter()
        .map(|(n, _)| n.as_deref().expect("event name"))
        .collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let data: Vec<Value> = events
        .iter()
        .map(|(_, d)| serde_json::from_str(d).expect("JSON"))
        .collect();
    for ((name, _), d) in events.iter().zip(&data) {
        assert_eq!(Some(d["type"].as_str().expect("type")), name.as_deref());
    }
    let message = &data[0]["message"];
    assert_eq!(message["model"], "claude-mock");
    assert_eq!(message["content"], json!([]));
    assert_eq!(
        message["usage"],
        // "be helpful" (3 + 4) + "hello" (2 + 4).
        json!({"input_tokens": 13, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 50})
    );
    assert_eq!(data[1]["index"], 0);
    assert_eq!(
        data[1]["content_block"],
        json!({"type": "text", "text": ""})
    );
    let text: String = data[3..6]
        .iter()
        .map(|d| {
            assert_eq!(d["delta"]["type"], "text_delta");
            d["delta"]["text"].as_str().expect("text").to_owned()
        })
        .collect();
    assert_eq!(text, tokens(3));
    assert_eq!(
        data[7],
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 3}})
    );
}

#[tokio::test]
async fn responses_api() {
    let mock = start().await;
    // "hi there" (8 chars: 2 + 4) + parts "abcde" (2 + 4) + instructions "x" (1 + 4) = 17.
    let request = json!({
        "model": "gpt-resp",
        "instructions": "x",
        "input": [
            {"role": "user", "content": "hi there"},
            {"role": "user", "content": [{"type": "input_text", "text": "abcde"}, {"type": "input_image", "image_url": "x"}]}
        ]
    });
    let (status, _, body) = post(&mock, "/v1/responses", &[("x-mock-chunks", "4")], &request).await;
    assert_eq!(status, StatusCode::OK);
    let v = json_of(&body);
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["model"], "gpt-resp");
    assert_eq!(v["output"][0]["type"], "message");
    assert_eq!(v["output"][0]["role"], "assistant");
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(v["output"][0]["content"][0]["text"], tokens(4));
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 17, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 4,
               "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 21})
    );

    // String input, streaming.
    let request = json!({"model": "gpt-resp", "input": "hello", "stream": true});
    let (_, headers, body) =
        post(&mock, "/v1/responses", &[("x-mock-chunks", "2")], &request).await;
    assert_eq!(content_type(&headers), "text/event-stream");
    let events = sse(&body);
    let names: Vec<&str> = events
        .iter()
        .map(|(n, _)| n.as_deref().expect("name"))
        .collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.completed"
        ]
    );
    let data: Vec<Value> = events
        .iter()
        .map(|(_, d)| serde_json::from_str(d).expect("JSON"))
        .collect();
    assert_eq!(data[0]["response"]["status"], "in_progress");
    assert_eq!(data[1]["type"], "response.output_text.delta");
    assert_eq!(data[1]["delta"], "tok0 ");
    assert_eq!(data[2]["delta"], "tok1 ");
    let done = &data[3]["response"];
    assert_eq!(data[3]["type"], "response.completed");
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["content"][0]["text"], tokens(2));
    assert_eq!(done["usage"]["input_tokens"], 6);
    assert_eq!(done["usage"]["output_tokens"], 2);
    assert_eq!(done["usage"]["total_tokens"], 8);
    assert!(!String::from_utf8_lossy(&body).contains("[DONE]"));

    // Capped: incomplete.
    let request = json!({"model": "gpt-resp", "input": "hello", "max_output_tokens": 1});
    let (_, _, body) = post(&mock, "/v1/responses", &[], &request).await;
    let v = json_of(&body);
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(v["usage"]["output_tokens"], 1);
}

#[tokio::test]
async fn embeddings() {
    let mock = start().await;
    let (status, _, body) = post(
        &mock,
        "/v1/embeddings",
        &[],
        &json!({"model": "emb", "input": ["hello", "abcdefghi"]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let v = json_of(&body);
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], "emb");
    let data = v["data"].as_array().expect("data");
    assert_eq!(data.len(), 2);
    for (i, item) in data.iter().enumerate() {
        assert_eq!(item["object"], "embedding");
        assert_eq!(item["index"], i);
        let emb = item["embedding"].as_array().expect("embedding");
        assert_eq!(emb.len(), 8);
        assert!(emb
            .iter()
            .all(|x| x.as_f64().is_some_and(|x| x.abs() <= 1.0)));
    }
    assert_ne!(data[0]["embedding"], data[1]["embedding"]);
    // 2 + 3
    assert_eq!(v["usage"], json!({"prompt_tokens": 5, "total_tokens": 5}));

    let (_, _, body) = post(
        &mock,
        "/v1/embeddings",
        &[],
        &json!({"model": "emb", "input": "hey"}),
    )
    .await;
    let v = json_of(&body);
    assert_eq!(v["data"].as_array().map(Vec::len), Some(1));
    assert_eq!(v["usage"]["prompt_tokens"], 1);

    for bad in [
        json!({"model": "emb"}),
        json!({"model": "emb", "input": []}),
        json!({"model": "emb", "input": [{}]}),
    ] {
        let (status, _, _) = post(&mock, "/v1/embeddings", &[], &bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
}

#[tokio::test]
async fn status_knob() {
    let mock = start().await;
    let (status, headers, body) = post(
        &mock,
        "/v1/chat/completions",
        &[("x-mock-status", "429")],
        &chat_body(json!({})),
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(headers.get("retry-after").is_none(), "only on request");
    assert_eq!(content_type(&headers), "application/json");
    assert_eq!(
        json_of(&body),
        json!({"error": {"message": "mock status 429", "type": "mock_error", "param": null, "code": "mock_429"}})
    );

    // Any route, before body validation; x-mock-retry-after names the provider's signal
    let (status, headers, body) = call(
        &mock,
        "POST",
        "/v1/messages",
        &[("x-mock-status", "503"), ("x-mock-retry-after", "2")],
        "not json",
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("2")
    );
    assert_eq!(json_of(&body)["error"]["code"], "mock_503");
}

#[tokio::test]
async fn delay_knob() {
    let mock = start().await;
    let client = client();
    let started = Instant::now();
    let resp = request(
        &client,
        &mock,
        "POST",
        "/v1/chat/completions",
        &[("x-mock-delay-ms", "150")],
        &chat_body(json!({})).to_string(),
    )
    .await;
    let elapsed = started.elapsed();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        elapsed >= Duration::from_millis(150),
        "first byte after {elapsed:?}"
    );

    // The delay comes before x-mock-status.
    let started = Instant::now();
    let resp = request(
        &client,
        &mock,
        "POST",
        "/v1/chat/completions",
        &[("x-mock-delay-ms", "100"), ("x-mock-status", "500")],
        "{}",
    )
    .await;
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(started.elapsed() >= Duration::from_millis(100));
}

#[tokio::test]
async fn chunk_delay_knob() {
    let mock = start().await;
    let client = client();
    let started = Instant::now();
    let resp = request(
        &client,
        &mock,
        "POST",
        "/v1/chat/completions",
        &[("x-mock-chunk-delay-ms", "40"), ("x-mock-chunks", "2")],
        &chat_body(json!({"stream": true})).to_string(),
    )
    .await;
    let mut body = resp.into_body();
    let mut frames = 0;
    let mut all = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("frame").into_data() {
            frames += 1;
            all.extend_from_slice(&data);
        }
    }
    let elapsed = started.elapsed();
    // role, 2 tokens, finish, [DONE]: 5 events, 4 pauses.
    let chunks = chat_chunks(&Bytes::from(all));
    assert_eq!(chunks.len(), 4);
    assert!(
        elapsed >= Duration::from_millis(160),
        "stream took {elapsed:?}"
    );
    assert!(
        frames >= 2,
        "events arrive separately, got {frames} frame(s)"
    );
}

/// Reads everything the server sends on a raw connection until it closes it.
async fn raw(addr: SocketAddr, request: &str) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 8192];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server closed the connection");
    out
}

fn raw_post(path: &str, headers: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: mock\r\ncontent-type: application/json\r\n{headers}content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn cut_after_streaming() {
    let mock = start().await;
    let body = chat_body(json!({"stream": true})).to_string();

    // Raw: the head and exactly 3 events arrive, then the connection closes without the
    // terminating chunk and without [DONE].
    let out = raw(
        mock.addr(),
        &raw_post("/v1/chat/completions", "x-mock-cut-after: 3\r\n", &body),
    )
    .await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked"));
    assert!(!text.contains("[DONE]"));
    assert!(!text.ends_with("0\r\n\r\n"), "no clean end: {text}");
    assert_eq!(text.matches("data: ").count(), 3, "{text}");

    // Paced and cut.
    let out = raw(
        mock.addr(),
        &raw_post(
            "/v1/chat/completions",
            "x-mock-cut-after: 2\r\nx-mock-chunk-delay-ms: 10\r\n",
            &body,
        ),
    )
    .await;
    let text = String::from_utf8_lossy(&out);
    assert_eq!(text.matches("data: ").count(), 2, "{text}");
    assert!(!text.ends_with("0\r\n\r\n"));

    // Cut after more events than there are: everything but the clean end.
    let out = raw(
        mock.addr(),
        &raw_post("/v1/chat/completions", "x-mock-cut-after: 1000\r\n", &body),
    )
    .await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.contains("data: [DONE]\n\n"));
    assert!(!text.ends_with("0\r\n\r\n"));

    // hyper client: the body fails.
    let client = client();
    for stream_headers in [
        &[("x-mock-cut-after", "2")][..],
        &[("x-mock-cut-after", "0")],
    ] {
        let resp = request(
            &client,
            &mock,
            "POST",
            "/v1/messages",
            stream_headers,
            &json!({"model": "m", "messages": [], "stream": true}).to_string(),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(
            resp.into_body().collect().await.is_err(),
            "{stream_headers:?}"
        );
    }
}

#[tokio::test]
async fn cut_after_non_streaming() {
    let mock = start().await;
    let body = chat_body(json!({})).to_string();
    let full = post(&mock, "/v1/chat/completions", &[], &chat_body(json!({})))
        .await
        .2;

    let out = raw(
        mock.addr(),
        &raw_post("/v1/chat/completions", "x-mock-cut-after: 1\r\n", &body),
    )
    .await;
    let text = String::from_utf8_lossy(&out);
    let (head, received) = text.split_once("\r\n\r\n").expect("a head");
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_owned)
        })
        .expect("content-length")
        .trim()
        .parse()
        .expect("number");
    // The ids differ by one digit at most; the announced length is the full body's.
    assert!(
        length.abs_diff(full.len()) <= 2,
        "{length} vs {}",
        full.len()
    );
    assert!(
        !received.is_empty() && received.len() < length,
        "{} of {length}",
        received.len()
    );
    assert_eq!(received.len(), length / 2);

    let resp = request(
        &client(),
        &mock,
        "POST",
        "/v1/embeddings",
        &[("x-mock-cut-after", "0")],
        r#"{"model":"e","input":"x"}"#,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.into_body().collect().await.is_err());
}

#[tokio::test]
async fn invalid_requests() {
    let mock = start().await;
    for (path, body) in [
        ("/v1/chat/completions", "{not json"),
        ("/v1/chat/completions", ""),
        ("/v1/chat/completions", "[1,2]"),
        ("/v1/chat/completions", r#"{"messages": []}"#),
        ("/v1/chat/completions", r#"{"model": 3, "messages": []}"#),
        ("/v1/chat/completions", r#"{"model": "m"}"#),
        (
            "/v1/chat/completions",
            r#"{"model": "m", "messages": [], "stream": "yes"}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"model": "m", "messages": [], "max_tokens": -1}"#,
        ),
        (
            "/v1/chat/completions",
            r#"{"model": "m", "messages": [], "stream_options": 1}"#,
        ),
        ("/v1/messages", r#"{"messages": []}"#),
        (
            "/v1/messages",
            r#"{"model": "m", "messages": [], "system": 5}"#,
        ),
        ("/v1/responses", r#"{"model": "m"}"#),
        ("/v1/responses", r#"{"input": "x"}"#),
        ("/v1/embeddings", r#"{"input": "x"}"#),
        ("/v1/embeddings", "\u{0}\u{ff}"),
    ] {
        let (status, headers, resp) = call(&mock, "POST", path, &[], body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body:?}");
        assert_eq!(content_type(&headers), "application/json");
        let v = json_of(&resp);
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert_eq!(v["error"]["code"], "invalid_request", "{v}");
    }
    // Still serving.
    let (status, _, _) = post(&mock, "/v1/chat/completions", &[], &chat_body(json!({}))).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn bad_knobs() {
    let mock = start().await;
    for (knob, value) in [
        ("x-mock-status", "abc"),
        ("x-mock-status", "42"),
        ("x-mock-delay-ms", "-5"),
        ("x-mock-chunk-delay-ms", "soon"),
        ("x-mock-chunks", "100001"),
        ("x-mock-cut-after", "1.5"),
        ("x-mock-no-usage", "perhaps"),
        ("x-mock-usage-in-final-chunk", "2"),
        ("x-mock-prompt-tokens", "many"),
        ("x-mock-cache-read-tokens", "-1"),
    ] {
        let (status, _, body) = post(
            &mock,
            "/v1/chat/completions",
            &[(knob, value)],
            &chat_body(json!({})),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{knob}: {value}");
        let v = json_of(&body);
        assert!(
            v["error"]["message"]
                .as_str()
                .expect("message")
                .contains(knob),
            "{v}"
        );
        assert_eq!(v["error"]["param"], knob);
    }
}

#[tokio::test]
async fn records_requests() {
    let mock = start().await;
    assert!(mock.requests().is_empty());
    let body = chat_body(json!({}));
    post(
        &mock,
        "/v1/chat/completions?api-version=1",
        &[("Authorization", "Bearer sk-test"), ("X-Mock-Chunks", "1")],
        &body,
    )
    .await;
    call(&mock, "GET", "/health", &[], "").await;
    call(&mock, "POST", "/nowhere", &[], "raw \u{1} bytes").await;

    let requests = mock.requests();
    assert_eq!(requests.len(), 3);
    let first = &requests[0];
    assert_eq!(first.method, "POST");
    assert_eq!(first.path, "/v1/chat/completions?api-version=1");
    assert_eq!(first.header("authorization"), Some("Bearer sk-test"));
    assert_eq!(first.header("AUTHORIZATION"), Some("Bearer sk-test"));
    assert_eq!(first.header("x-mock-chunks"), Some("1"));
    assert_eq!(first.header("missing"), None);
    assert!(first
        .headers
        .iter()
        .all(|(n, _)| n.chars().all(|c| !c.is_ascii_uppercase())));
    assert_eq!(first.json(), Some(body.clone()));
    assert_eq!(&first.body[..], body.to_string().as_bytes());
    assert_eq!(
        (requests[1].method.as_str(), requests[1].path.as_str()),
        ("GET", "/health")
    );
    assert_eq!(&requests[2].body[..], "raw \u{1} bytes".as_bytes());
    assert_eq!(requests[2].json(), None);

    mock.clear_requests();
    assert!(mock.requests().is_empty());
    call(&mock, "GET", "/health", &[], "").await;
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn oversized_body_is_refused() {
    let mock = start().await;
    let out = raw(
        mock.addr(),
        "POST /v1/chat/completions HTTP/1.1\r\nhost: mock\r\ncontent-length: 67108865\r\nconnection: close\r\n\r\n{",
    )
    .await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 413 "), "{text}");
    assert!(text.contains("request_too_large"));
}

#[tokio::test]
async fn keep_alive_and_pipelining() {
    let mock = start().await;
    let one = raw_post(
        "/v1/chat/completions",
        "",
        &chat_body(json!({})).to_string(),
    );
    let last = "GET /health HTTP/1.1\r\nhost: mock\r\nconnection: close\r\n\r\n";
    let out = raw(mock.addr(), &format!("{one}{one}{last}")).await;
    let text = String::from_utf8_lossy(&out);
    assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 3, "{text}");
    assert!(text.ends_with("ok"));
}

#[tokio::test]
async fn large_and_concurrent() {
    let mock = start().await;
    let (_, _, body) = post(
        &mock,
        "/v1/chat/completions",
        &[("x-mock-chunks", "100000")],
        &chat_body(json!({"stream": true, "stream_options": {"include_usage": true}})),
    )
    .await;
    let chunks = chat_chunks(&body);
    assert_eq!(chunks.len(), 100_003);
    assert_eq!(chunks[100_002]["usage"]["completion_tokens"], 100_000);

    let client = client();
    let mut tasks = Vec::new();
    for i in 0..200u32 {
        let client = client.clone();
        let url = format!("{}/v1/messages", mock.url());
        tasks.push(tokio::spawn(async move {
            let body = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(i as usize)}]});
            let req = Request::post(url).body(Full::new(Bytes::from(body.to_string()))).expect("request");
            let resp = client.request(req).await.expect("response");
            let body = resp.into_body().collect().await.expect("body").to_bytes();
            let v: Value = serde_json::from_slice(&body).expect("json");
            assert_eq!(v["usage"]["input_tokens"], u64::from(i.div_ceil(4) + 4));
        }));
    }
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(mock.requests().len(), 201);
}

#[tokio::test]
async fn drop_stops_the_server() {
    let mock = start().await;
    let addr = mock.addr();
    let mut idle = TcpStream::connect(addr)
        .await
        .expect("connect while running");
    drop(mock);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(TcpStream::connect(addr).await.is_err(), "listener closed");
    // The open connection is dropped too.
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0) | Err(_))), "{read:?}");
}

#[tokio::test]
async fn echo_knob_answers_with_the_last_user_message_in_small_pieces() {
    let mock = start().await;
    let text = "Hello \"world\" 漢字!";
    // chat, streaming: the text split into deltas of 3 characters
    let body = json!({"model": "m", "stream": true, "messages": [
        {"role": "user", "content": "earlier"},
        {"role": "assistant", "content": "reply"},
        {"role": "user", "content": [{"type": "text", "text": "Hello \"world\" "}, {"type": "text", "text": "漢字!"}]}
    ]});
    let (status, _, resp) = post(
        &mock,
        "/v1/chat/completions",
        &[("x-mock-echo", "1")],
        &body,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let chunks = chat_chunks(&resp);
    let deltas: Vec<&str> = chunks[1..chunks.len() - 1]
        .iter()
        .map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .expect("content")
        })
        .collect();
    assert_eq!(deltas.concat(), text);
    assert_eq!(deltas[0], "Hel");
    assert_eq!(deltas.len(), text.chars().count().div_ceil(3));

    // chat, not streaming
    let body = json!({"model": "m", "messages": [{"role": "user", "content": text}]});
    let (_, _, resp) = post(
        &mock,
        "/v1/chat/completions",
        &[("x-mock-echo", "yes")],
        &body,
    )
    .await;
    let v = json_of(&resp);
    assert_eq!(v["choices"][0]["message"]["content"], text);
    assert_eq!(
        v["usage"]["completion_tokens"],
        text.chars().count().div_ceil(3)
    );

    // Anthropic and Responses
    let body =
        json!({"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": text}]});
    let (_, _, resp) = post(&mock, "/v1/messages", &[("x-mock-echo", "1")], &body).await;
    assert_eq!(json_of(&resp)["content"][0]["text"], text);
    let body = json!({"model": "m", "input": text, "stream": true});
    let (_, _, resp) = post(&mock, "/v1/responses", &[("x-mock-echo", "1")], &body).await;
    let echoed: String = sse(&resp)
        .iter()
        .filter(|(name, _)| name.as_deref() == Some("response.output_text.delta"))
        .map(|(_, data)| {
            serde_json::from_str::<Value>(data).expect("json")["delta"]
                .as_str()
                .expect("delta")
                .to_owned()
        })
        .collect();
    assert_eq!(echoed, text);

    // without the knob: tokens as before
    let (_, _, resp) = post(&mock, "/v1/chat/completions", &[], &body_of_chat(text)).await;
    assert_eq!(
        json_of(&resp)["choices"][0]["message"]["content"],
        tokens(8)
    );
}

fn body_of_chat(text: &str) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": text}]})
}

#[tokio::test]
async fn default_knobs_apply_unless_the_request_sets_the_knob() {
    let mock = start().await;
    mock.set_default_knobs(&[("x-mock-status", "429")]);
    let (status, _, _) = post(&mock, "/v1/chat/completions", &[], &chat_body(json!({}))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let (status, _, _) = post(
        &mock,
        "/v1/chat/completions",
        &[("x-mock-status", "200")],
        &chat_body(json!({})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "the request's own knob wins");
    // recorded as received: the default knob is not in the recording
    assert!(mock.requests()[0].header("x-mock-status").is_none());
    mock.set_default_knobs(&[]);
    let (status, _, _) = post(&mock, "/v1/chat/completions", &[], &chat_body(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "cleared");
}

#[tokio::test]
async fn end_after_streaming_ends_cleanly_without_the_terminator() {
    let mock = start().await;
    let body = chat_body(json!({"stream": true})).to_string();
    let out = raw(
        mock.addr(),
        &raw_post(
            "/v1/chat/completions",
            "x-mock-end-after: 2\r\nconnection: close\r\n",
            &body,
        ),
    )
    .await;
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert_eq!(text.matches("data: ").count(), 2, "{text}");
    assert!(!text.contains("[DONE]"));
    assert!(text.ends_with("0\r\n\r\n"), "clean end: {text}");

    // the hyper client reads a complete body
    let (status, _, body) = post(
        &mock,
        "/v1/messages",
        &[("x-mock-end-after", "1")],
        &json!({"model": "m", "messages": [], "stream": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8_lossy(&body);
    assert!(!text.contains("message_stop"), "{text}");
}

#[tokio::test]
async fn error_code_knob_names_the_error() {
    let mock = start().await;
    let (status, _, body) = post(
        &mock,
        "/v1/chat/completions",
        &[
            ("x-mock-status", "400"),
            ("x-mock-error-code", "context_length_exceeded"),
        ],
        &chat_body(json!({})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json_of(&body)["error"]["code"], "context_length_exceeded");
    let (_, _, body) = post(
        &mock,
        "/v1/chat/completions",
        &[("x-mock-status", "400")],
        &chat_body(json!({})),
    )
    .await;
    assert_eq!(json_of(&body)["error"]["code"], "mock_400");
}

#[tokio::test]
async fn status_model_knob_fails_one_model_only() {
    let mock = start().await;
    let knobs = [("x-mock-status", "429"), ("x-mock-status-model", "gpt-4o")];
    let mut failing = chat_body(json!({}));
    failing["model"] = json!("gpt-4o");
    let (status, _, _) = post(&mock, "/v1/chat/completions", &knobs, &failing).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let mut other = chat_body(json!({}));
    other["model"] = json!("gpt-4o-mini");
    let (status, _, _) = post(&mock, "/v1/chat/completions", &knobs, &other).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn garbage_knob_puts_broken_events_after_the_first() {
    let mock = start().await;
    let body =
        chat_body(json!({"stream": true, "stream_options": {"include_usage": true}})).to_string();
    for (kind, garbage) in [
        (
            "text",
            &b"<html><body><h1>502 Bad Gateway</h1></body></html>\n\n"[..],
        ),
        (
            "json",
            b"data: {\"id\":\"chatcmpl-garbage\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"cut off\n\n",
        ),
        (
            "utf8",
            b"data: {\"id\":\"chatcmpl-garbage\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\xff\xfe\xc3\x28\"}}]}\n\n",
        ),
    ] {
        let out = raw(
            mock.addr(),
            &raw_post(
                "/v1/chat/completions",
                &format!("x-mock-garbage: {kind}\r\nconnection: close\r\n"),
                &body,
            ),
        )
        .await;
        let at = out
            .windows(garbage.len())
            .position(|w| w == garbage)
            .unwrap_or_else(|| panic!("{kind}: {}", String::from_utf8_lossy(&out)));
        let text = String::from_utf8_lossy(&out);
        // one whole event before it, the usage and [DONE] after it
        let before = String::from_utf8_lossy(&out[..at]);
        assert_eq!(before.matches("data: {").count(), 1, "{kind}: {text}");
        assert!(text.contains("\"usage\":{"), "{kind}: {text}");
        assert!(text.contains("data: [DONE]\n\n"), "{kind}: {text}");
        assert!(text.ends_with("0\r\n\r\n"), "{kind}: a clean end");
    }

    // endless: after the first event a data line that never ends, for as long as one reads
    let mut stream = TcpStream::connect(mock.addr()).await.expect("connect");
    stream
        .write_all(
            raw_post("/v1/chat/completions", "x-mock-garbage: endless\r\n", &body).as_bytes(),
        )
        .await
        .expect("write");
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    while out.len() < 1 << 20 {
        let n = stream.read(&mut buf).await.expect("read");
        assert!(n > 0, "the endless line ended");
        out.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&out);
    // (chunked framing aside) one data line that does not end
    let (_, line) = text
        .split_once("data: {\"choices\"")
        .expect("the endless line starts");
    assert!(!line.contains("\n\n"), "it ended");
    assert!(line.matches('x').count() > 900_000);
    assert!(!text.contains("[DONE]"));
    drop(stream);

    let (status, _, body) = post(
        &mock,
        "/v1/chat/completions",
        &[("x-mock-garbage", "xml")],
        &chat_body(json!({"stream": true})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json_of(&body)["error"]["param"], "x-mock-garbage");
}

#[tokio::test]
async fn cut_rst_resets_the_connection() {
    let mock = start().await;
    let body = chat_body(json!({"stream": true})).to_string();
    let mut stream = TcpStream::connect(mock.addr()).await.expect("connect");
    stream
        .write_all(
            raw_post(
                "/v1/chat/completions",
                "x-mock-cut-after: 2\r\nx-mock-cut-rst: 1\r\n",
                &body,
            )
            .as_bytes(),
        )
        .await
        .expect("write");
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) => return Err(e.kind()),
            }
        }
    })
    .await
    .expect("the connection ended");
    assert_eq!(end, Err(std::io::ErrorKind::ConnectionReset));
    let text = String::from_utf8_lossy(&out);
    assert_eq!(text.matches("data: ").count(), 2, "{text}");
}

// ---------------------------------------------------------------------------------------------
// Flavors

/// An Anthropic-shaped error: its type and message (after checking the shape and that the
/// body's request_id is the `request-id` header).
fn anthropic_error(status: StatusCode, headers: &HeaderMap, body: &Bytes) -> (u16, String, String) {
    assert_eq!(content_type(headers), "application/json");
    let v = json_of(body);
    assert_eq!(v["type"], "error", "{v}");
    let request_id = headers
        .get("request-id")
        .and_then(|v| v.to_str().ok())
        .expect("request-id header");
    assert!(request_id.starts_with("req_mock_"), "{request_id}");
    assert_eq!(v["request_id"], request_id);
    let error = v["error"].as_object().expect("error object");
    assert_eq!(error.len(), 2, "type and message only: {v}");
    (
        status.as_u16(),
        v["error"]["type"].as_str().expect("type").to_owned(),
        v["error"]["message"].as_str().expect("message").to_owned(),
    )
}

/// An OpenAI-shaped error: (status, message, param, code), after checking the shape.
fn openai_error(status: StatusCode, body: &Bytes) -> (u16, String, Value, Value) {
    let v = json_of(body);
    let error = v["error"].as_object().expect("error object");
    assert_eq!(error.len(), 4, "message, type, param, code: {v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    (
        status.as_u16(),
        v["error"]["message"].as_str().expect("message").to_owned(),
        v["error"]["param"].clone(),
        v["error"]["code"].clone(),
    )
}

fn claude_body(extra: Value) -> Value {
    let mut body = json!({
        "model": "claude-mock",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hello there"}]
    });
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    body
}

#[tokio::test]
async fn each_flavor_serves_only_its_routes_and_answers_others_with_its_404() {
    let openai = start_flavor(Flavor::Openai).await;
    let anthropic = start_flavor(Flavor::Anthropic).await;
    let azure = start_flavor(Flavor::Azure).await;
    assert_eq!(
        [
            openai.flavor(),
            anthropic.flavor(),
            azure.flavor(),
            start().await.flavor()
        ],
        [
            Flavor::Openai,
            Flavor::Anthropic,
            Flavor::Azure,
            Flavor::Any
        ]
    );
    for mock in [&openai, &anthropic, &azure] {
        let (status, _, body) = call(mock, "GET", "/health", &[], "").await;
        assert_eq!(
            (status, &body[..]),
            (StatusCode::OK, &b"ok"[..]),
            "{mock:?}"
        );
    }

    // OpenAI: today's 404
    for path in ["/v1/messages", "/v1/messages/count_tokens", AZURE_CHAT] {
        let (status, _, body) = post(&openai, path, OPENAI_AUTH, &claude_body(json!({}))).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        let v = json_of(&body);
        assert_eq!(v["error"]["code"], "not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }

    // Anthropic: not_found_error in its shape, with a request-id
    for path in [
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/embeddings",
        AZURE_CHAT,
    ] {
        let (status, headers, body) =
            post(&anthropic, path, ANTHROPIC_AUTH, &chat_body(json!({}))).await;
        assert_eq!(
            anthropic_error(status, &headers, &body),
            (404, "not_found_error".into(), "Not Found".into()),
            "{path}"
        );
    }

    // Azure: its own 404, also without the api-version query parameter
    for path in [
        "/v1/chat/completions",
        "/v1/messages",
        "/openai/deployments/gpt4o-prod/chat/completions",
        "/openai/deployments/gpt4o-prod/chat/completions?api-version=",
        "/openai/deployments/gpt4o-prod/completions?api-version=2024-10-21",
    ] {
        let (status, _, body) = post(&azure, path, AZURE_AUTH, &chat_body(json!({}))).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(
            json_of(&body),
            json!({"error": {"code": "404", "message": "Resource not found"}})
        );
    }
    assert!(
        anthropic.requests().len() >= 4,
        "refused requests are recorded too"
    );
}

#[tokio::test]
async fn anthropic_flavor_wants_x_api_key_and_anthropic_version() {
    let mock = start_flavor(Flavor::Anthropic).await;
    let body = claude_body(json!({}));
    let version = ("anthropic-version", "2023-06-01");
    for headers in [
        vec![version],
        vec![("x-api-key", ""), version],
        vec![("authorization", "Bearer sk-ant-test"), version],
    ] {
        let (status, h, b) = post(&mock, "/v1/messages", &headers, &body).await;
        assert_eq!(
            anthropic_error(status, &h, &b),
            (
                401,
                "authentication_error".into(),
                "x-api-key header is required".into()
            ),
            "{headers:?}"
        );
    }
    let (status, h, b) = post(&mock, "/v1/messages", &[("x-api-key", "k")], &body).await;
    assert_eq!(
        anthropic_error(status, &h, &b),
        (
            400,
            "invalid_request_error".into(),
            "anthropic-version: header is required".into()
        )
    );
    let (status, headers, body) = post(&mock, "/v1/messages", ANTHROPIC_AUTH, &body).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.get("request-id").is_some(), "every answer has one");
    assert_eq!(json_of(&body)["content"][0]["text"], tokens(8));
}

#[tokio::test]
async fn anthropic_flavor_refuses_what_anthropic_refuses() {
    let mock = start_flavor(Flavor::Anthropic).await;
    let tool_turns = |result_id: &str| {
        json!([
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": result_id, "content": "sunny"}]}
        ])
    };
    let cases = [
        (json!({"max_tokens": null}), "max_tokens: Field required"),
        (json!({"max_tokens": 0}), "max_tokens: Input should be greater than or equal to 1"),
        (json!({"messages": []}), "messages: at least one message is required"),
        (json!({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}),
         "messages.0.role: Input should be 'user' or 'assistant'"),
        (json!({"messages": [{"role": "user", "content": "hi"}, {"role": "developer", "content": "x"}]}),
         "messages.1.role: Input should be 'user' or 'assistant'"),
        (json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
         "messages.0.content.0: Input tag 'image_url' found using 'type' does not match any of the expected tags: 'text', 'image', 'document', 'tool_use', 'tool_result', 'thinking', 'redacted_thinking'"),
        (json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}]}]}),
         "messages.0.content.0.image.source.base64.media_type: Field required"),
        (json!({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": {}}]}]}),
         "messages.1.content.0.tool_use.name: Field required"),
        (json!({"messages": tool_turns("toolu_9")}),
         "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_1. Each `tool_use` block must have a corresponding `tool_result` block in the next message."),
        (json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}]}]}),
         "messages.0.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_1. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."),
        (json!({"temperature": 1.2}), "temperature: Input should be less than or equal to 1"),
        (json!({"tool_choice": {"type": "required"}}),
         "tool_choice: Input tag 'required' found using 'type' does not match any of the expected tags: 'auto', 'any', 'tool', 'none'"),
        (json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
         "tools.0: Input tag 'function' found using 'type' does not match any of the expected tags: 'custom', 'bash_20250124', 'text_editor_20250728', 'web_search_20250305', '…'"),
        (json!({"metadata": {"user_id": "u", "tenant": "t"}}), "metadata.tenant: Extra inputs are not permitted"),
        (json!({"stream": true, "stream_options": {"include_usage": true}}), "stream_options: Extra inputs are not permitted"),
        (json!({"max_completion_tokens": 5}), "max_completion_tokens: Extra inputs are not permitted"),
        (json!({"n": 1}), "n: Extra inputs are not permitted"),
        (json!({"response_format": {"type": "json_object"}}), "response_format: Extra inputs are not permitted"),
        (json!({"frequency_penalty": 0}), "frequency_penalty: Extra inputs are not permitted"),
        (json!({"user": "u"}), "user: Extra inputs are not permitted"),
        (json!({"seed": 1}), "seed: Extra inputs are not permitted"),
        (json!({"tool_calls": []}), "tool_calls: Extra inputs are not permitted"),
    ];
    for (extra, message) in cases {
        let (status, headers, body) = post(
            &mock,
            "/v1/messages",
            ANTHROPIC_AUTH,
            &claude_body(extra.clone()),
        )
        .await;
        assert_eq!(
            anthropic_error(status, &headers, &body),
            (400, "invalid_request_error".into(), message.to_owned()),
            "{extra}"
        );
    }
    // the same tool turns, answered: accepted
    let (status, _, _) = post(
        &mock,
        "/v1/messages",
        ANTHROPIC_AUTH,
        &claude_body(json!({
            "messages": tool_turns("toolu_1"),
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]
        })),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    // not JSON: Anthropic's shape too
    let (status, headers, body) = call(&mock, "POST", "/v1/messages", ANTHROPIC_AUTH, "nope").await;
    assert_eq!(
        anthropic_error(status, &headers, &body).1,
        "invalid_request_error"
    );

    // count_tokens: no max_tokens, no generation parameters
    let count =
        json!({"model": "claude-mock", "messages": [{"role": "user", "content": "hello there"}]});
    let (status, _, body) = post(&mock, "/v1/messages/count_tokens", ANTHROPIC_AUTH, &count).await;
    assert_eq!(
        (status, json_of(&body)),
        (StatusCode::OK, json!({"input_tokens": 7}))
    );
    let (status, headers, body) = post(
        &mock,
        "/v1/messages/count_tokens",
        ANTHROPIC_AUTH,
        &claude_body(json!({})),
    )
    .await;
    assert_eq!(
        anthropic_error(status, &headers, &body).2,
        "max_tokens: Extra inputs are not permitted"
    );
}

#[tokio::test]
async fn anthropic_flavor_status_knob_answers_in_anthropic_shape() {
    let mock = start_flavor(Flavor::Anthropic).await;
    for (code, kind) in [
        ("400", "invalid_request_error"),
        ("401", "authentication_error"),
        ("403", "permission_error"),
        ("404", "not_found_error"),
        ("413", "request_too_large"),
        ("429", "rate_limit_error"),
        ("500", "api_error"),
        ("529", "overloaded_error"),
    ] {
        let headers = with(
            ANTHROPIC_AUTH,
            &[("x-mock-status", code), ("x-mock-retry-after", "3")],
        );
        let (status, h, b) = post(&mock, "/v1/messages", &headers, &claude_body(json!({}))).await;
        assert_eq!(
            anthropic_error(status, &h, &b),
            (
                code.parse().expect("code"),
                kind.to_owned(),
                format!("mock status {code}")
            )
        );
        assert_eq!(
            h.get("retry-after").and_then(|v| v.to_str().ok()),
            Some("3")
        );
    }
    // a bad knob: Anthropic's shape as well
    let headers = with(ANTHROPIC_AUTH, &[("x-mock-chunks", "x")]);
    let (status, h, b) = post(&mock, "/v1/messages", &headers, &claude_body(json!({}))).await;
    assert_eq!(anthropic_error(status, &h, &b).0, 400);
}

#[tokio::test]
async fn openai_flavor_wants_a_bearer_token() {
    let mock = start_flavor(Flavor::Openai).await;
    let body = chat_body(json!({}));
    for headers in [
        &[][..],
        &[("authorization", "Bearer ")],
        &[("x-api-key", "sk-test")],
        &[("api-key", "sk-test")],
    ] {
        let (status, _, b) = post(&mock, "/v1/chat/completions", headers, &body).await;
        let (status, message, param, code) = openai_error(status, &b);
        assert_eq!(status, 401, "{headers:?}");
        assert!(
            message.starts_with("You didn't provide an API key."),
            "{message}"
        );
        assert_eq!((param, code), (Value::Null, Value::Null));
    }
    for path in ["/v1/chat/completions", "/v1/responses", "/v1/embeddings"] {
        let (status, _, _) = post(&mock, path, &[], &json!({})).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
    }
    let (status, _, _) = post(&mock, "/v1/chat/completions", OPENAI_AUTH, &body).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = post(
        &mock,
        "/v1/embeddings",
        OPENAI_AUTH,
        &json!({"model": "e", "input": "x", "encoding_format": "float"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn openai_flavor_refuses_what_openai_refuses() {
    let mock = start_flavor(Flavor::Openai).await;
    let unrecognized = |field: &str| {
        (
            400,
            format!("Unrecognized request argument supplied: {field}"),
            json!(field),
            Value::Null,
        )
    };
    for field in [
        "system",
        "stop_sequences",
        "top_k",
        "thinking",
        "anthropic_version",
        "max_output_tokens",
    ] {
        let mut body = chat_body(json!({}));
        body[field] = json!("x");
        let (status, _, b) = post(&mock, "/v1/chat/completions", OPENAI_AUTH, &body).await;
        assert_eq!(openai_error(status, &b), unrecognized(field));
    }
    let (status, _, b) = post(
        &mock,
        "/v1/embeddings",
        OPENAI_AUTH,
        &json!({"model": "e", "input": "x", "task": "q"}),
    )
    .await;
    assert_eq!(openai_error(status, &b), unrecognized("task"));

    let get_weather = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let cases = [
        (json!({"tools": get_weather, "tool_choice": {"type": "any"}}),
         "Invalid value: 'any'. Supported values are: 'function', 'allowed_tools', and 'custom'.", json!("tool_choice.type"), json!("invalid_value")),
        (json!({"tools": get_weather, "tool_choice": {"type": "tool", "name": "get_weather"}}),
         "Invalid value: 'tool'. Supported values are: 'function', 'allowed_tools', and 'custom'.", json!("tool_choice.type"), json!("invalid_value")),
        (json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}),
         "Invalid value: 'tool_use'. Supported values are: 'text' and 'refusal'.", json!("messages[0].content[0].type"), json!("invalid_value")),
        (json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]}),
         "Invalid value: 'image'. Supported values are: 'text', 'image_url', 'input_audio', and 'file'.", json!("messages[0].content[0].type"), json!("invalid_value")),
        (json!({"stream_options": {"include_usage": true}}),
         "The 'stream_options' parameter is only allowed when 'stream' is enabled.", json!("stream_options"), Value::Null),
        (json!({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "call_1", "content": "42"}]}),
         "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.", json!("messages.[1].role"), Value::Null),
        (json!({"messages": []}),
         "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.", json!("messages"), json!("empty_array")),
        (json!({"temperature": 2.5}),
         "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 2.5 instead.", json!("temperature"), json!("decimal_above_max_value")),
        (json!({"stop": ["a", "b", "c", "d", "e"]}),
         "Invalid 'stop': array too long. Expected an array with maximum length 4, but got an array with length 5 instead.", json!("stop"), json!("array_above_max_length")),
    ];
    for (extra, message, param, code) in cases {
        let (status, _, b) = post(
            &mock,
            "/v1/chat/completions",
            OPENAI_AUTH,
            &chat_body(extra.clone()),
        )
        .await;
        assert_eq!(
            openai_error(status, &b),
            (400, message.to_owned(), param, code),
            "{extra}"
        );
    }
}

#[tokio::test]
async fn azure_flavor_takes_the_deployment_from_the_path() {
    let mock = start_flavor(Flavor::Azure).await;
    // no model in the body: the deployment names it
    let body = json!({"messages": [{"role": "user", "content": "hello"}]});
    let (status, _, b) = post(&mock, AZURE_CHAT, AZURE_AUTH, &body).await;
    assert_eq!(status, StatusCode::OK);
    let v = json_of(&b);
    assert_eq!(v["model"], "gpt4o-prod");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], tokens(8));
    // the body's model wins
    let (_, _, b) = post(&mock, AZURE_CHAT, AZURE_AUTH, &chat_body(json!({}))).await;
    assert_eq!(json_of(&b)["model"], "gpt-mock");
    let recorded = mock.requests();
    assert_eq!(recorded[0].path, AZURE_CHAT, "the path keeps its query");
    assert_eq!(recorded[0].header("api-key"), Some("azure-test"));

    // the key: api-key, not a bearer token
    for headers in [
        &[][..],
        &[("authorization", "Bearer azure-test")],
        &[("api-key", " ")],
    ] {
        let (status, _, b) = post(&mock, AZURE_CHAT, headers, &body).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{headers:?}");
        let v = json_of(&b);
        assert_eq!(v["error"]["code"], "401");
        assert!(
            v["error"]["message"]
                .as_str()
                .expect("message")
                .starts_with(
                    "Access denied due to invalid subscription key or wrong API endpoint."
                ),
            "{v}"
        );
    }

    // the body: OpenAI's rules and errors
    let anthropic_shaped = json!({"messages": [{"role": "user", "content": "hi"}], "top_k": 5});
    let (status, _, b) = post(&mock, AZURE_CHAT, AZURE_AUTH, &anthropic_shaped).await;
    assert_eq!(
        openai_error(status, &b),
        (
            400,
            "Unrecognized request argument supplied: top_k".to_owned(),
            json!("top_k"),
            Value::Null
        )
    );

    // streaming and embeddings
    let stream = json!({"messages": [{"role": "user", "content": "hi"}], "stream": true, "stream_options": {"include_usage": true}});
    let (status, _, b) = post(
        &mock,
        AZURE_CHAT,
        &with(AZURE_AUTH, &[("x-mock-chunks", "2")]),
        &stream,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let chunks = chat_chunks(&b);
    assert!(chunks.iter().all(|c| c["model"] == "gpt4o-prod"));
    assert_eq!(
        chunks.last().expect("usage chunk")["usage"]["completion_tokens"],
        2
    );
    let path = "/openai/deployments/embed-small/embeddings?api-version=2024-10-21";
    let (status, _, b) = post(&mock, path, AZURE_AUTH, &json!({"input": ["a", "b"]})).await;
    assert_eq!(status, StatusCode::OK);
    let v = json_of(&b);
    assert_eq!(v["model"], "embed-small");
    assert_eq!(v["data"].as_array().map(Vec::len), Some(2));
}

// ---------------------------------------------------------------------------------------------
// Tool calls, images, DeepSeek usage

/// The arguments `x-mock-tool-call` sends for the last user text `query`.
fn tool_arguments(query: &str) -> String {
    json!({"query": query}).to_string()
}

/// `s` in pieces of 5 characters.
fn pieces_of_5(s: &str) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    chars.chunks(5).map(|c| c.iter().collect()).collect()
}

fn weather_chat(extra: Value) -> Value {
    let mut body = json!({
        "model": "gpt-mock",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [
            {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
        ]
    });
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    body
}

fn weather_claude(extra: Value) -> Value {
    let mut body = json!({
        "model": "claude-mock",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]
    });
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    body
}

#[tokio::test]
async fn tool_call_knob_openai_json_and_stream() {
    let arguments = tool_arguments("Weather in Paris?");
    let pieces = pieces_of_5(&arguments);
    for (mock, auth) in [
        (start().await, &[][..]),
        (start_flavor(Flavor::Openai).await, OPENAI_AUTH),
    ] {
        let headers = with(auth, &[("x-mock-tool-call", "get_weather")]);
        let (status, _, body) = post(
            &mock,
            "/v1/chat/completions",
            &headers,
            &weather_chat(json!({})),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let v = json_of(&body);
        let choice = &v["choices"][0];
        let id = v["id"]
            .as_str()
            .expect("id")
            .trim_start_matches("chatcmpl-mock-")
            .to_owned();
        assert_eq!(
            choice["message"],
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": format!("call_mock_{id}"), "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
            ]})
        );
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(v["usage"]["completion_tokens"], pieces.len());

        let stream =
            weather_chat(json!({"stream": true, "stream_options": {"include_usage": true}}));
        let (status, _, body) = post(&mock, "/v1/chat/completions", &headers, &stream).await;
        assert_eq!(status, StatusCode::OK);
        let chunks = chat_chunks(&body);
        assert_eq!(chunks.len(), 1 + pieces.len() + 1 + 1);
        let first = &chunks[0]["choices"][0]["delta"];
        assert_eq!(first["role"], "assistant");
        assert_eq!(first["content"], Value::Null);
        let call = &first["tool_calls"][0];
        assert_eq!(call["index"], 0);
        assert!(call["id"].as_str().expect("id").starts_with("call_mock_"));
        assert_eq!(call["type"], "function");
        assert_eq!(
            call["function"],
            json!({"name": "get_weather", "arguments": ""})
        );
        let streamed: Vec<String> = chunks[1..=pieces.len()]
            .iter()
            .map(|c| {
                let call = &c["choices"][0]["delta"]["tool_calls"][0];
                assert_eq!(call["index"], 0);
                assert!(call.get("id").is_none());
                call["function"]["arguments"]
                    .as_str()
                    .expect("arguments")
                    .to_owned()
            })
            .collect();
        assert_eq!(streamed, pieces);
        let last = &chunks[pieces.len() + 1]["choices"][0];
        assert_eq!(last["finish_reason"], "tool_calls");
        assert_eq!(
            chunks[pieces.len() + 2]["usage"]["completion_tokens"],
            pieces.len()
        );
    }
}

#[tokio::test]
async fn tool_call_knob_anthropic_json_and_stream() {
    let arguments = tool_arguments("Weather in Paris?");
    let pieces = pieces_of_5(&arguments);
    for (mock, auth) in [
        (start().await, &[][..]),
        (start_flavor(Flavor::Anthropic).await, ANTHROPIC_AUTH),
    ] {
        let headers = with(auth, &[("x-mock-tool-call", "get_weather")]);
        let (status, _, body) =
            post(&mock, "/v1/messages", &headers, &weather_claude(json!({}))).await;
        assert_eq!(status, StatusCode::OK);
        let v = json_of(&body);
        let id = v["id"]
            .as_str()
            .expect("id")
            .trim_start_matches("msg_mock_")
            .to_owned();
        assert_eq!(
            v["content"],
            json!([{"type": "tool_use", "id": format!("toolu_mock_{id}"), "name": "get_weather", "input": {"query": "Weather in Paris?"}}])
        );
        assert_eq!(v["stop_reason"], "tool_use");
        assert_eq!(v["usage"]["output_tokens"], pieces.len());

        let (status, _, body) = post(
            &mock,
            "/v1/messages",
            &headers,
            &weather_claude(json!({"stream": true})),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let events = sse(&body);
        let data: Vec<Value> = events
            .iter()
            .map(|(_, d)| serde_json::from_str(d).expect("JSON"))
            .collect();
        assert_eq!(events.len(), 3 + pieces.len() + 3);
        let block = &data[1]["content_block"];
        assert_eq!(block["type"], "tool_use");
        assert!(block["id"].as_str().expect("id").starts_with("toolu_mock_"));
        assert_eq!(block["name"], "get_weather");
        assert_eq!(block["input"], json!({}));
        let streamed: Vec<String> = data[3..3 + pieces.len()]
            .iter()
            .map(|d| {
                assert_eq!(d["type"], "content_block_delta");
                assert_eq!(d["delta"]["type"], "input_json_delta");
                d["delta"]["partial_json"]
                    .as_str()
                    .expect("partial_json")
                    .to_owned()
            })
            .collect();
        assert_eq!(streamed, pieces);
        assert_eq!(data[3 + pieces.len()]["type"], "content_block_stop");
        let delta = &data[4 + pieces.len()];
        assert_eq!(delta["delta"]["stop_reason"], "tool_use");
        assert_eq!(delta["usage"]["output_tokens"], pieces.len());
        assert_eq!(data[5 + pieces.len()]["type"], "message_stop");
    }
}

#[tokio::test]
async fn tool_call_knob_needs_the_tool_and_defaults_its_query() {
    let mock = start_flavor(Flavor::Openai).await;
    let headers = with(OPENAI_AUTH, &[("x-mock-tool-call", "get_stock")]);
    let (status, _, body) = post(
        &mock,
        "/v1/chat/completions",
        &headers,
        &weather_chat(json!({})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json_of(&body)["error"]["param"], "x-mock-tool-call");
    let anthropic = start_flavor(Flavor::Anthropic).await;
    let headers = with(ANTHROPIC_AUTH, &[("x-mock-tool-call", "get_stock")]);
    let (status, h, b) = post(
        &anthropic,
        "/v1/messages",
        &headers,
        &weather_claude(json!({})),
    )
    .await;
    assert_eq!(anthropic_error(status, &h, &b).0, 400);

    // no user text: the query is "tok0"
    let body = weather_chat(
        json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]}),
    );
    let headers = with(OPENAI_AUTH, &[("x-mock-tool-call", "get_time")]);
    let (_, _, b) = post(&mock, "/v1/chat/completions", &headers, &body).await;
    assert_eq!(
        json_of(&b)["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
        tool_arguments("tok0")
    );
}

#[tokio::test]
async fn a_tool_result_is_answered_in_text_and_echoed() {
    // OpenAI: the last message is the tool's result
    let mock = start_flavor(Flavor::Openai).await;
    let body = weather_chat(json!({"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"query\":\"Paris\"}"}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"}
    ]}));
    let headers = with(
        OPENAI_AUTH,
        &[("x-mock-tool-call", "get_weather"), ("x-mock-echo", "1")],
    );
    let (status, _, b) = post(&mock, "/v1/chat/completions", &headers, &body).await;
    assert_eq!(status, StatusCode::OK);
    let v = json_of(&b);
    assert_eq!(v["choices"][0]["message"]["content"], "sunny, 21C");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["choices"][0]["message"].get("tool_calls").is_none());

    // Anthropic: the last user turn holds tool_result blocks
    let mock = start_flavor(Flavor::Anthropic).await;
    let body = weather_claude(json!({"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"query": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny, 21C"}]}]}
    ]}));
    let headers = with(
        ANTHROPIC_AUTH,
        &[("x-mock-tool-call", "get_weather"), ("x-mock-echo", "1")],
    );
    let (status, _, b) = post(&mock, "/v1/messages", &headers, &body).await;
    assert_eq!(status, StatusCode::OK);
    let v = json_of(&b);
    assert_eq!(
        v["content"],
        json!([{"type": "text", "text": "sunny, 21C"}])
    );
    assert_eq!(v["stop_reason"], "end_turn");
    // the result's text counts like the OpenAI tool message it translates: "Weather in
    // Paris?" (17 chars: 5 + 4), the tool_use turn (4), "sunny, 21C" (10 chars: 3 + 4)
    assert_eq!(v["usage"]["input_tokens"], 9 + 4 + 7);
}

#[tokio::test]
async fn images_are_accepted_count_nothing_and_are_recorded() {
    let openai = start_flavor(Flavor::Openai).await;
    let image =
        json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}});
    let body = json!({"model": "gpt-mock", "messages": [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, image]}]});
    let (status, _, b) = post(&openai, "/v1/chat/completions", OPENAI_AUTH, &body).await;
    assert_eq!(status, StatusCode::OK);
    // "what is it?" (11 chars: 3 + 4); the image counts nothing
    assert_eq!(json_of(&b)["usage"]["prompt_tokens"], 7);
    let seen = openai.requests()[0].json().expect("json");
    assert_eq!(seen["messages"][0]["content"][1], image);

    let anthropic = start_flavor(Flavor::Anthropic).await;
    let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}});
    let body = claude_body(
        json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, image]}]}),
    );
    let (status, _, b) = post(&anthropic, "/v1/messages", ANTHROPIC_AUTH, &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json_of(&b)["usage"]["input_tokens"], 7);
    let seen = anthropic.requests()[0].json().expect("json");
    assert_eq!(seen["messages"][0]["content"][1], image);
}

#[tokio::test]
async fn deepseek_usage_style_reports_cache_hits_and_misses() {
    for (mock, auth) in [
        (start().await, &[][..]),
        (start_flavor(Flavor::Openai).await, OPENAI_AUTH),
    ] {
        let headers = with(
            auth,
            &[
                ("x-mock-usage-style", "deepseek"),
                ("x-mock-cache-read-tokens", "5"),
                ("x-mock-chunks", "2"),
            ],
        );
        let (_, _, b) = post(
            &mock,
            "/v1/chat/completions",
            &headers,
            &chat_body(json!({})),
        )
        .await;
        assert_eq!(
            json_of(&b)["usage"],
            json!({"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14,
                   "prompt_cache_hit_tokens": 5, "prompt_cache_miss_tokens": 7})
        );
        let stream = chat_body(json!({"stream": true, "stream_options": {"include_usage": true}}));
        let headers = with(
            auth,
            &[("x-mock-usage-style", "deepseek"), ("x-mock-chunks", "2")],
        );
        let (_, _, b) = post(&mock, "/v1/chat/completions", &headers, &stream).await;
        let chunks = chat_chunks(&b);
        assert_eq!(
            chunks.last().expect("usage chunk")["usage"],
            json!({"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14,
                   "prompt_cache_hit_tokens": 0, "prompt_cache_miss_tokens": 12})
        );
        let headers = with(auth, &[("x-mock-usage-style", "gemini")]);
        let (status, _, _) = post(
            &mock,
            "/v1/chat/completions",
            &headers,
            &chat_body(json!({})),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }
}
