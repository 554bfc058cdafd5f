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
use mock_upstream::MockUpstream;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

async fn start() -> MockUpstream {
    MockUpstream::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("mock starts")
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
        json!({"error": {"message": "mock status 429", "type": "mock_error", "code": "mock_429"}})
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
