//! Hostile input against the whole chain: `envoy-config/gateway.yaml` as shipped (key-auth,
//! model-router, pii-redaction, usage-accounting, token-ratelimit) in a real Envoy 1.40 with
//! `--concurrency 2` and the demo's mock providers (`tests/src/demo.rs`).
//!
//! Each case checks its documented outcome (status and OpenAI error `code`, and which part of
//! the gateway answered: the access log's `details`), then a good request that must succeed,
//! so a case that trapped a wasm VM or wedged a worker fails at once. Each test ends by reading
//! every log the gateway wrote (Envoy's log and stderr, the access log; the in-process mock
//! providers write none — what they *received* is checked case by case): no virtual key, no
//! provider credential, no prompt and no personal data may appear, and no wasm panic or trap.
//!
//! Inputs a normal client refuses to send (bare CR or LF in a header, NUL, non-UTF-8 header
//! bytes, header names in odd case, a request trickled byte by byte, a client that hangs up
//! half way) go through a raw `std::net::TcpStream`.
//!
//! `docs/security.md` has the table of outcomes these tests pin down.

use llm_gateway_tests::demo::{
    Demo, ANTHROPIC_CREDENTIAL, AZURE_CREDENTIAL, DEMO_KEY, FAST_ONLY_KEY, OPENAI_CREDENTIAL,
};
use llm_gateway_tests::http::{self, Response};
use llm_gateway_tests::workspace::sha256_hex;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// In every prompt the suite sends: it must never show up in a log.
const MARKER: &str = "hostile-prompt-marker-5d1f0c";
/// Personal data in the prompts (pii-redaction masks them for the provider).
const EMAIL: &str = "mallory.hostile@example.org";
const PHONE: &str = "+14155550123";
const CARD: &str = "4111 1111 1111 1111";

const CHAT: &str = "/v1/chat/completions";

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

/// A prompt with the marker and personal data.
fn prompt() -> String {
    format!("{MARKER}: write to {EMAIL}, call {PHONE}, charge {CARD}")
}

fn hello() -> Value {
    json!({"model": "fast", "messages": [{"role": "user", "content": prompt()}]})
}

/// A good request after a hostile one: the worker still serves, the chain is intact.
async fn serves(demo: &Demo, after: &str) {
    let response = http::post(format!("{}{CHAT}", demo.url()))
        .header("authorization", &bearer(DEMO_KEY))
        .json(&hello())
        .send()
        .await
        .unwrap_or_else(|e| panic!("after {after}: {e}"));
    assert_eq!(response.status, 200, "after {after}: {}", response.text());
    assert_eq!(response.header("x-llm-deployment"), Some("openai-mini"));
    let body = response.json().unwrap();
    assert!(
        body["choices"][0]["message"]["content"].is_string(),
        "after {after}: {body}"
    );
}

/// What a test expects of one request, checked against the access log at the end (one wait
/// for Envoy's flush instead of one per case).
struct Logged {
    case: String,
    request_id: String,
    status: u16,
    details: &'static str,
}

fn logged(case: &str, response: &Response, details: &'static str) -> Logged {
    Logged {
        case: case.to_owned(),
        request_id: response
            .header("x-request-id")
            .unwrap_or_else(|| panic!("{case}: no x-request-id: {:?}", response.headers))
            .to_owned(),
        status: response.status,
        details,
    }
}

/// The access log's lines, parsed.
fn access_lines(demo: &Demo) -> Vec<Value> {
    std::fs::read_to_string(demo.access_log())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Waits until every expected request has its access-log line, then checks status and details.
async fn check_access_log(demo: &Demo, expected: &[Logged]) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let lines = access_lines(demo);
        let missing: Vec<&Logged> = expected
            .iter()
            .filter(|e| {
                !lines
                    .iter()
                    .any(|l| l["request_id"] == e.request_id.as_str())
            })
            .collect();
        if missing.is_empty() {
            for e in expected {
                let line = lines
                    .iter()
                    .find(|l| l["request_id"] == e.request_id.as_str())
                    .unwrap();
                assert_eq!(line["status"], e.status, "{}: {line}", e.case);
                assert_eq!(line["details"], e.details, "{}: {line}", e.case);
            }
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no access-log line for {:?}",
            missing.iter().map(|m| &m.case).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The usage record of the access-log line that `pick` selects, waiting for Envoy's flush.
async fn record_where(demo: &Demo, what: &str, pick: impl Fn(&Value) -> bool) -> (Value, Value) {
    demo.envoy
        .access_log_line("access.log", what, |line| {
            if !pick(&line) {
                return None;
            }
            let record = line["usage"]
                .as_str()
                .and_then(|u| serde_json::from_str(u).ok())
                .unwrap_or(Value::Null);
            Some((line, record))
        })
        .await
}

/// The end of every test: no secret, prompt or personal data in any log the gateway wrote; no
/// wasm panic, trap or failed VM; Envoy still running.
fn assert_logs_are_clean(demo: &mut Demo) {
    assert!(demo.envoy.is_running(), "Envoy exited");
    let logs = demo.envoy.logs();
    assert!(
        logs.contains("access.log") && logs.contains("envoy.log"),
        "the logs were not read: {logs}"
    );
    let card_digits: String = CARD.chars().filter(char::is_ascii_digit).collect();
    let secrets = [
        DEMO_KEY.to_owned(),
        FAST_ONLY_KEY.to_owned(),
        sha256_hex(DEMO_KEY.as_bytes()),
        sha256_hex(FAST_ONLY_KEY.as_bytes()),
        OPENAI_CREDENTIAL.to_owned(),
        AZURE_CREDENTIAL.to_owned(),
        ANTHROPIC_CREDENTIAL.to_owned(),
        MARKER.to_owned(),
        EMAIL.to_owned(),
        PHONE.to_owned(),
        CARD.to_owned(),
        card_digits,
        "example.net".to_owned(), // the 10 000 distinct addresses of the bulk case
    ];
    for secret in &secrets {
        assert!(
            !logs.contains(secret.as_str()),
            "{secret:?} is in a log:\n{}",
            logs.lines()
                .filter(|l| l.contains(secret.as_str()))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    for failure in [
        "panicked",
        "RuntimeError",
        "wasm trap",
        "Wasm VM failed",
        "Plugin configured to fail closed",
        "][critical][",
        "][error][",
    ] {
        assert!(
            !logs.contains(failure),
            "{failure:?} in the logs:\n{}",
            logs.lines()
                .filter(|l| l.contains(failure))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

// --- raw HTTP/1.1 over a std TcpStream ---------------------------------------------------------

/// `POST path` with `connection: close`, the given header lines (sent byte for byte) and a
/// `content-length` body.
fn raw_request(path: &str, headers: &[&str], body: &[u8]) -> Vec<u8> {
    let mut head = format!("POST {path} HTTP/1.1\r\nhost: gateway\r\nconnection: close\r\n");
    for line in headers {
        head.push_str(line);
        head.push_str("\r\n");
    }
    head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

/// `raw_request` with one byte of a header line replaced (a byte no `&str` literal can hold).
fn with_byte(mut request: Vec<u8>, marker: &[u8], byte: u8) -> Vec<u8> {
    let at = request
        .windows(marker.len())
        .position(|w| w == marker)
        .expect("marker in the request");
    request[at] = byte;
    request
}

/// Parses a whole HTTP/1.1 response (the connection closed after it).
fn parse_response(raw: &[u8]) -> Response {
    let text = String::from_utf8_lossy(raw);
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no complete response head: {text:?}"));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {head}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        let mut out = String::new();
        let mut rest = rest;
        while let Some((size, after)) = rest.split_once("\r\n") {
            let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if size == 0 {
                break;
            }
            out.push_str(after.get(..size).unwrap_or(after));
            rest = after.get(size + 2..).unwrap_or_default();
        }
        out
    } else {
        rest.to_owned()
    };
    Response {
        status,
        headers,
        body: body.into_bytes().into(),
    }
}

/// True once `raw` holds a whole response (by `content-length`, or a chunked body's end).
fn is_complete(raw: &[u8]) -> bool {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let body = &raw[end + 4..];
    if let Some(length) = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        return body.len() >= length;
    }
    head.contains("transfer-encoding: chunked") && body.ends_with(b"0\r\n\r\n")
}

/// Sends `bytes` on a fresh connection and reads one whole response (not waiting for Envoy's
/// delayed close after a protocol error).
async fn send_raw(demo: &Demo, bytes: Vec<u8>) -> Response {
    let addr = demo.url().trim_start_matches("http://").to_owned();
    tokio::task::spawn_blocking(move || {
        let mut socket = TcpStream::connect(&addr).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        // Envoy may answer and close before it read everything (a 413, a 431)
        let _ = socket.write_all(&bytes);
        let mut out = Vec::new();
        let mut buf = [0u8; 16 << 10];
        while !is_complete(&out) {
            match socket.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
        parse_response(&out)
    })
    .await
    .unwrap()
}

// --- bodies --------------------------------------------------------------------------------

fn nested(levels: usize) -> String {
    format!(
        r#"{{"model":"fast","messages":[{{"role":"user","content":{}"{MARKER}"{}}}]}}"#,
        "[".repeat(levels),
        "]".repeat(levels)
    )
}

fn with_field(field: &str) -> String {
    format!(r#"{{"model":"fast","messages":[{{"role":"user","content":"{MARKER}"}}],{field}}}"#)
}

/// A chat body of exactly `size` bytes.
fn body_of_size(size: usize) -> Vec<u8> {
    let prefix = format!(r#"{{"model":"fast","messages":[{{"role":"user","content":"{MARKER} "#);
    let suffix = r#""}]}"#;
    let mut body = prefix.into_bytes();
    body.resize(size - suffix.len(), b'a');
    body.extend_from_slice(suffix.as_bytes());
    assert_eq!(body.len(), size);
    body
}

/// A hostile body and what the gateway answers.
struct BodyCase {
    name: &'static str,
    path: &'static str,
    body: Vec<u8>,
    status: u16,
    /// The error `code`; `None` for a success.
    code: Option<&'static str>,
    /// The access log's `details`: `<plugin>.<code>`, `via_upstream`, or Envoy's own.
    details: &'static str,
}

fn case(
    name: &'static str,
    body: impl Into<Vec<u8>>,
    status: u16,
    code: Option<&'static str>,
    details: &'static str,
) -> BodyCase {
    BodyCase {
        name,
        path: CHAT,
        body: body.into(),
        status,
        code,
        details,
    }
}

fn body_cases() -> Vec<BodyCase> {
    let bad = "model_router.invalid_request_body";
    let truncated = format!(r#"{{"model":"fast","messages":[{{"role":"user","content":"{MARKER}"#);
    let mut cases = vec![
        // malformed and truncated JSON: model-router, first to read the body, refuses it
        case(
            "truncated JSON",
            truncated.clone(),
            400,
            Some("invalid_request_body"),
            bad,
        ),
        case(
            "unquoted keys",
            "{model: fast}",
            400,
            Some("invalid_request_body"),
            bad,
        ),
        case("empty body", "", 400, Some("invalid_request_body"), bad),
        case("a JSON array", "[]", 400, Some("invalid_request_body"), bad),
        case(
            "a JSON string",
            r#""fast""#,
            400,
            Some("invalid_request_body"),
            bad,
        ),
        case("null", "null", 400, Some("invalid_request_body"), bad),
        case(
            "trailing garbage",
            format!("{} x", hello()),
            400,
            Some("invalid_request_body"),
            bad,
        ),
        case(
            "two documents",
            format!("{}{}", hello(), hello()),
            400,
            Some("invalid_request_body"),
            bad,
        ),
        case(
            "a trailing comma",
            r#"{"model":"fast","messages":[],}"#,
            400,
            Some("invalid_request_body"),
            bad,
        ),
        case(
            "no model",
            r#"{"messages":[]}"#,
            400,
            Some("missing_model"),
            "model_router.missing_model",
        ),
        case(
            "a numeric model",
            r#"{"model":5,"messages":[]}"#,
            400,
            Some("invalid_model"),
            "model_router.invalid_model",
        ),
        // non-UTF-8
        case(
            "binary bytes",
            &b"\xff\xfe\x00\x01garbage"[..],
            400,
            Some("invalid_request_body"),
            bad,
        ),
        case(
            "non-UTF-8 in a JSON string",
            &b"{\"model\":\"fast\",\"messages\":[{\"role\":\"user\",\"content\":\"a\xffb\"}]}"[..],
            400,
            Some("invalid_request_body"),
            bad,
        ),
        case(
            "non-UTF-8 in model",
            &b"{\"model\":\"fa\xffst\",\"messages\":[]}"[..],
            400,
            Some("invalid_request_body"),
            bad,
        ),
        case(
            "overlong UTF-8",
            &b"{\"model\":\"fast\",\"messages\":[{\"role\":\"user\",\"content\":\"\xc0\xaf\"}]}"[..],
            400,
            Some("invalid_request_body"),
            bad,
        ),
        case(
            "a UTF-8 byte order mark",
            [&b"\xef\xbb\xbf"[..], hello().to_string().as_bytes()].concat(),
            400,
            Some("invalid_request_body"),
            bad,
        ),
        // a lone surrogate is well-formed JSON text that no string can hold: the router's
        // scanner lets it pass, token-ratelimit's parser refuses it
        case(
            "a lone surrogate escape",
            with_field(r#""user":"\ud800""#),
            400,
            Some("invalid_json"),
            "token_ratelimit.invalid_json",
        ),
        // a key pasted into a prompt: gateway.yaml's `openai_key` rule blocks the request
        case(
            "a virtual key in the prompt",
            json!({"model": "fast", "messages": [{"role": "user", "content": format!("{MARKER} my key is {DEMO_KEY}")}]})
                .to_string(),
            400,
            Some("pii_blocked_api_key"),
            "pii_redaction.pii_blocked_api_key",
        ),
        // deeply nested: the scanner's depth bound (64), not a stack overflow
        case(
            "10 000 nested arrays",
            nested(10_000),
            400,
            Some("invalid_request_body"),
            bad,
        ),
        case(
            "10 000 nested objects in an extra field",
            with_field(&format!(
                r#""x":{}1{}"#,
                r#"{"a":"#.repeat(10_000),
                "}".repeat(10_000)
            )),
            400,
            Some("invalid_request_body"),
            bad,
        ),
        // the body's depth: the object, `messages`, a message, then the arrays
        case(
            "depth 65",
            nested(62),
            400,
            Some("invalid_request_body"),
            bad,
        ),
        // within the bound: forwarded, and the provider refuses an array where a content part
        // (an object) belongs, as OpenAI does
        case(
            "depth 64, the limit",
            nested(61),
            400,
            Some("invalid_type"),
            "via_upstream",
        ),
    ];
    for (name, path) in [
        ("truncated Anthropic Messages", "/v1/messages"),
        ("truncated Responses", "/v1/responses"),
        ("truncated embeddings", "/v1/embeddings"),
    ] {
        cases.push(BodyCase {
            name,
            path,
            body: truncated.clone().into_bytes(),
            status: 400,
            code: Some("invalid_request_body"),
            details: bad,
        });
    }
    cases
}

fn number_cases() -> Vec<BodyCase> {
    let invalid = |name, field: &str| {
        case(
            name,
            with_field(field),
            400,
            Some("invalid_value"),
            "token_ratelimit.invalid_value",
        )
    };
    let forwarded = |name, field: &str| case(name, with_field(field), 200, None, "via_upstream");
    // forwarded, and refused by the provider with its own code, as OpenAI refuses it
    let refused_upstream =
        |name, field: &str, code| case(name, with_field(field), 400, Some(code), "via_upstream");
    let mut cases = vec![
        // u64::MAX fits the cap's type: the router's size estimate (prompt + cap) exceeds every
        // deployment's context window
        case(
            "max_tokens = u64::MAX",
            with_field(r#""max_tokens":18446744073709551615"#),
            400,
            Some("context_length_exceeded"),
            "model_router.context_length_exceeded",
        ),
        invalid(
            "max_tokens = u64::MAX + 1",
            r#""max_tokens":18446744073709551616"#,
        ),
        invalid("max_tokens = 1e30", r#""max_tokens":1e30"#),
        invalid("max_tokens = -1", r#""max_tokens":-1"#),
        invalid("max_tokens = 1.5", r#""max_tokens":1.5"#),
        invalid("max_tokens = 1e3", r#""max_tokens":1e3"#),
        invalid("max_tokens = \"100\"", r#""max_tokens":"100""#),
        invalid("max_tokens = true", r#""max_tokens":true"#),
        invalid(
            "max_completion_tokens = -5",
            r#""max_completion_tokens":-5"#,
        ),
        // fields the gateway does not read reach the provider as sent: it decides
        refused_upstream(
            "temperature = -1",
            r#""temperature":-1"#,
            "decimal_below_min_value",
        ),
        refused_upstream(
            "temperature = \"hot\"",
            r#""temperature":"hot""#,
            "invalid_type",
        ),
        refused_upstream("n = -1", r#""n":-1"#, "integer_below_min_value"),
        refused_upstream("n = 1.5", r#""n":1.5"#, "invalid_type"),
        refused_upstream("n = \"2\"", r#""n":"2""#, "invalid_type"),
        forwarded("stream = null", r#""stream":null"#),
        // a number no f64 holds: grammatical JSON that token-ratelimit's parser refuses
        case(
            "temperature = 1e400",
            with_field(r#""temperature":1e400"#),
            400,
            Some("invalid_json"),
            "token_ratelimit.invalid_json",
        ),
        // `stream` of the wrong type: forwarded, the provider's own 400 comes back
        refused_upstream("stream = \"true\"", r#""stream":"true""#, "invalid_type"),
        refused_upstream("stream = 1", r#""stream":1"#, "invalid_type"),
    ];
    cases.push(BodyCase {
        name: "max_output_tokens = -1 (Responses)",
        path: "/v1/responses",
        body: format!(r#"{{"model":"fast","input":"{MARKER}","max_output_tokens":-1}}"#)
            .into_bytes(),
        status: 400,
        code: Some("invalid_value"),
        details: "token_ratelimit.invalid_value",
    });
    cases.push(BodyCase {
        name: "max_tokens = \"x\" (Anthropic Messages)",
        path: "/v1/messages",
        body: format!(
            r#"{{"model":"claude","max_tokens":"x","messages":[{{"role":"user","content":"{MARKER}"}}]}}"#
        )
        .into_bytes(),
        status: 400,
        code: Some("invalid_value"),
        details: "token_ratelimit.invalid_value",
    });
    cases
}

fn size_cases() -> Vec<BodyCase> {
    vec![
        // Envoy's buffer (10 MiB) holds it; the router's estimate (a token per 4 bytes) is
        // over every context window long before pii-redaction's 8 MiB limit is reached
        case(
            "8 MiB body",
            body_of_size(8 << 20),
            400,
            Some("context_length_exceeded"),
            "model_router.context_length_exceeded",
        ),
        case(
            "8 MiB + 1 body",
            body_of_size((8 << 20) + 1),
            400,
            Some("context_length_exceeded"),
            "model_router.context_length_exceeded",
        ),
        case(
            "10 MiB body",
            body_of_size(10 << 20),
            400,
            Some("context_length_exceeded"),
            "model_router.context_length_exceeded",
        ),
        // one byte over the listener's buffer: Envoy's own 413, OpenAI-shaped by
        // gateway.yaml's local_reply_config
        case(
            "10 MiB + 1 body",
            body_of_size((10 << 20) + 1),
            413,
            Some("request_too_large"),
            "request_payload_too_large",
        ),
        // just under the router's estimate of gpt-4o-mini's 128 000-token window
        case(
            "480 KiB body",
            body_of_size(480 << 10),
            200,
            None,
            "via_upstream",
        ),
    ]
}

async fn run_body_cases(demo: &Demo, cases: Vec<BodyCase>, expected: &mut Vec<Logged>) {
    for c in cases {
        let response = http::post(format!("{}{}", demo.url(), c.path))
            .header("authorization", &bearer(DEMO_KEY))
            .header("content-type", "application/json")
            .body(c.body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", c.name));
        match c.code {
            Some(code) => {
                http::assert_openai_error(&response, c.status, code);
            }
            None => assert_eq!(response.status, c.status, "{}: {}", c.name, response.text()),
        }
        expected.push(logged(c.name, &response, c.details));
        serves(demo, c.name).await;
    }
}

/// Malformed, non-UTF-8, deeply nested, huge and numerically absurd bodies: each gets its
/// documented 400 or 413 from the part of the gateway that reads it first (or reaches the
/// provider unchanged when no part of the gateway reads that field), and the next request is
/// served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_bodies_get_their_documented_errors_and_the_workers_serve_on() {
    let mut demo = Demo::start(0).await.unwrap();
    let mut expected = Vec::new();

    run_body_cases(&demo, body_cases(), &mut expected).await;
    run_body_cases(&demo, number_cases(), &mut expected).await;
    run_body_cases(&demo, size_cases(), &mut expected).await;

    // the fields no part of the gateway reads reached the provider byte for byte
    let seen: Vec<String> = demo
        .openai
        .requests()
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    for field in [
        r#""temperature":"hot""#,
        r#""n":1.5"#,
        r#""n":"2""#,
        r#""stream":"true""#,
    ] {
        assert!(
            seen.iter().any(|b| b.contains(field)),
            "{field} did not reach the provider"
        );
    }
    demo.openai.clear_requests();

    // 10 000 messages, each with its own address (short ones: the router's size estimate of
    // the body stays under the context window): served; the provider gets every message and
    // not one address
    let mut messages: Vec<Value> = (0..10_000)
        .map(|i| json!({"role": "user", "content": format!("u{i}@example.net")}))
        .collect();
    messages.push(json!({"role": "user", "content": MARKER}));
    let response = http::post(format!("{}{CHAT}", demo.url()))
        .header("authorization", &bearer(DEMO_KEY))
        .json(&json!({"model": "fast", "messages": messages}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
    expected.push(logged("10 000 messages", &response, "via_upstream"));
    let seen = demo.openai.requests();
    assert_eq!(seen.len(), 1);
    let sent = seen[0].json().unwrap();
    let sent_messages = sent["messages"].as_array().unwrap();
    assert!(sent_messages.len() >= 10_000, "{}", sent_messages.len());
    let text = String::from_utf8_lossy(&seen[0].body);
    assert!(
        !text.contains("@example.net"),
        "an address reached the provider"
    );
    assert!(
        text.contains("[EMAIL_10000]"),
        "placeholders: {}",
        &text[..300]
    );
    demo.openai.clear_requests();
    serves(&demo, "10 000 messages").await;

    // duplicate keys: the last one wins, for the gateway as for the provider's parser, and
    // the router rewrites every copy of `model`, so no unchecked copy reaches a provider
    let intern = bearer(FAST_ONLY_KEY);
    let smart_last = format!(
        r#"{{"model":"fast","messages":[{{"role":"user","content":"{MARKER}"}}],"model":"smart"}}"#
    );
    let response = http::post(format!("{}{CHAT}", demo.url()))
        .header("authorization", &intern)
        .header("content-type", "application/json")
        .body(smart_last)
        .send()
        .await
        .unwrap();
    http::assert_openai_error(&response, 403, "model_not_allowed");
    expected.push(logged(
        "duplicate model, smart last",
        &response,
        "model_router.model_not_allowed",
    ));
    let fast_last = format!(
        r#"{{"model":"smart","messages":[{{"role":"user","content":"{MARKER}"}}],"model":"fast"}}"#
    );
    let response = http::post(format!("{}{CHAT}", demo.url()))
        .header("authorization", &intern)
        .header("content-type", "application/json")
        .body(fast_last)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
    expected.push(logged(
        "duplicate model, fast last",
        &response,
        "via_upstream",
    ));
    let seen = demo.openai.requests();
    let text = String::from_utf8_lossy(&seen[0].body);
    assert_eq!(text.matches("\"model\"").count(), 1, "{text}");
    assert!(text.contains(r#""model":"gpt-4o-mini""#), "{text}");
    demo.openai.clear_requests();
    // a duplicated cap: the reservation is for the last copy, and only that copy goes on
    let two_caps = format!(
        r#"{{"max_tokens":100000,"model":"fast","messages":[{{"role":"user","content":"{MARKER}"}}],"max_tokens":5}}"#
    );
    let response = http::post(format!("{}{CHAT}", demo.url()))
        .header("authorization", &bearer(DEMO_KEY))
        .header("content-type", "application/json")
        .body(two_caps)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
    let seen = demo.openai.requests();
    let text = String::from_utf8_lossy(&seen[0].body);
    assert_eq!(text.matches("max_tokens").count(), 1, "{text}");
    assert!(text.contains(r#""max_tokens":5"#), "{text}");
    demo.openai.clear_requests();
    // personal data in a duplicate `messages`: masked in every copy
    let two_messages = format!(
        r#"{{"model":"fast","messages":[{{"role":"user","content":"{EMAIL}"}}],"messages":[{{"role":"user","content":"{MARKER}"}}]}}"#
    );
    let response = http::post(format!("{}{CHAT}", demo.url()))
        .header("authorization", &bearer(DEMO_KEY))
        .header("content-type", "application/json")
        .body(two_messages)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
    let seen = demo.openai.requests();
    let text = String::from_utf8_lossy(&seen[0].body);
    assert!(!text.contains(EMAIL), "{text}");
    demo.openai.clear_requests();
    serves(&demo, "duplicate keys").await;

    check_access_log(&demo, &expected).await;
    assert!(demo.azure.requests().is_empty(), "nothing fell back");
    assert_logs_are_clean(&mut demo);
}

// --- headers -------------------------------------------------------------------------------

/// A hostile request sent on a raw socket and what the gateway answers.
struct RawCase {
    name: &'static str,
    request: Vec<u8>,
    status: u16,
    /// The error `code`; `None` for a success.
    code: Option<&'static str>,
}

fn raw_case(
    name: &'static str,
    request: Vec<u8>,
    status: u16,
    code: Option<&'static str>,
) -> RawCase {
    RawCase {
        name,
        request,
        status,
        code,
    }
}

/// The slow-loris client: the request's head trickled one byte every 250 ms, so it takes far
/// longer than `request_headers_timeout` (10 s in gateway.yaml). What it read back, and when.
fn slow_loris(addr: String) -> (String, Duration) {
    let body = hello().to_string();
    let request = raw_request(
        CHAT,
        &[
            &format!("authorization: {}", bearer(DEMO_KEY)),
            "x-project: loris",
        ],
        body.as_bytes(),
    );
    let started = Instant::now();
    let mut socket = TcpStream::connect(addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    for byte in &request {
        if socket.write_all(&[*byte]).is_err() || started.elapsed() > Duration::from_secs(25) {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let mut out = Vec::new();
    let _ = socket.read_to_end(&mut out);
    (
        String::from_utf8_lossy(&out).into_owned(),
        started.elapsed(),
    )
}

/// Header injection (bare CR, bare LF, obs-fold, NUL), non-UTF-8 header bytes, oversized and
/// too many headers, request smuggling shapes, spoofed internal, Envoy and forwarding headers,
/// keys in query strings, odd letter case in header names, and a slow-loris client: each gets
/// its documented outcome, identity and route stay what the key says, nothing spoofed reaches
/// a provider, and the workers serve on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_headers_never_change_identity_route_or_reach_a_provider() {
    let mut demo = Demo::start(0).await.unwrap();
    let addr = demo.url().trim_start_matches("http://").to_owned();
    let loris = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || slow_loris(addr)
    });

    let key = format!("authorization: {}", bearer(DEMO_KEY));
    let intern = format!("authorization: {}", bearer(FAST_ONLY_KEY));
    let body = hello().to_string().into_bytes();
    let smart = json!({"model": "smart", "messages": [{"role": "user", "content": MARKER}]})
        .to_string()
        .into_bytes();

    // Envoy's HTTP/1.1 codec refuses these before any filter runs (400, 431, 426), as JSON
    // (gateway.yaml's local_reply_config)
    let huge = format!("x-project: {}", "x".repeat(70 << 10));
    let many: Vec<String> = (0..150).map(|i| format!("x-h{i}: v")).collect();
    let mut many_lines: Vec<&str> = vec![&key];
    many_lines.extend(many.iter().map(String::as_str));
    let mut smuggled_te = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: gateway\r\n{key}\r\ncontent-length: 4\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n",
        body.len()
    )
    .into_bytes();
    smuggled_te.extend_from_slice(&body);
    smuggled_te.extend_from_slice(b"\r\n0\r\n\r\n");
    let mut two_lengths = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: gateway\r\n{key}\r\ncontent-length: {}\r\ncontent-length: 4\r\n\r\n",
        body.len()
    )
    .into_bytes();
    two_lengths.extend_from_slice(&body);
    let refused = [
        raw_case(
            "NUL in a header value",
            raw_request(CHAT, &[&key, "x-project: a\0b"], &body),
            400,
            Some("invalid_request"),
        ),
        raw_case(
            "an underscore header name (x_llm_consumer)",
            raw_request(CHAT, &[&key, "x_llm_consumer: admin"], &body),
            400,
            Some("invalid_request"),
        ),
        raw_case(
            "a 70 KiB header",
            raw_request(CHAT, &[&key, &huge], &body),
            431,
            Some("invalid_request"),
        ),
        raw_case(
            "150 headers",
            raw_request(CHAT, &many_lines, &body),
            431,
            Some("invalid_request"),
        ),
        raw_case(
            "content-length and chunked",
            smuggled_te,
            400,
            Some("invalid_request"),
        ),
        raw_case(
            "two content-lengths",
            two_lengths,
            400,
            Some("invalid_request"),
        ),
        raw_case(
            "HTTP/1.0",
            format!("POST {CHAT} HTTP/1.0\r\n{key}\r\ncontent-length: 0\r\n\r\n").into_bytes(),
            426,
            Some("invalid_request"),
        ),
    ];
    // what reaches the filters: a bare CR is dropped, a bare LF ends the header line, an
    // obs-fold joins the lines; the internal header a client smuggles in this way is removed
    // by key-auth like any other
    let injected = [
        raw_case(
            "bare CR in header values",
            raw_request(
                CHAT,
                &[&key, "x-project: a\rb", "x-agent: c\rx-llm-tenant: evil"],
                &body,
            ),
            200,
            None,
        ),
        raw_case(
            "bare LF in a header value",
            raw_request(CHAT, &[&key, "x-project: lf\nx-llm-consumer: admin"], &body),
            200,
            None,
        ),
        raw_case(
            "obs-fold",
            raw_request(
                CHAT,
                &[&key, "x-project: fold\r\n x-llm-tenant: evil"],
                &body,
            ),
            200,
            None,
        ),
        raw_case(
            "non-UTF-8 bytes in x-project",
            with_byte(
                raw_request(CHAT, &[&key, "x-project: np#"], &body),
                b"#\r",
                0xff,
            ),
            200,
            None,
        ),
        raw_case(
            "non-UTF-8 bytes in x-user-id",
            with_byte(
                raw_request(CHAT, &[&key, "x-user-id: u#"], &body),
                b"#\r",
                0xc3,
            ),
            200,
            None,
        ),
        raw_case(
            "non-UTF-8 bytes in the key",
            with_byte(
                raw_request(
                    CHAT,
                    &[&format!("authorization: Bearer {DEMO_KEY}#")],
                    &body,
                ),
                b"#\r",
                0xfe,
            ),
            401,
            Some("invalid_api_key"),
        ),
    ];
    // letter case: header names are case-insensitive (Envoy lowercases them), so is the
    // Bearer scheme; spoofed internal headers in any case are removed
    let cases = [
        raw_case(
            "AUTHORIZATION",
            raw_request(CHAT, &[&format!("AUTHORIZATION: Bearer {DEMO_KEY}")], &body),
            200,
            None,
        ),
        raw_case(
            "scheme bEaReR",
            raw_request(CHAT, &[&format!("Authorization: bEaReR {DEMO_KEY}")], &body),
            200,
            None,
        ),
        raw_case(
            "X-Api-Key",
            raw_request(CHAT, &[&format!("X-Api-Key: {DEMO_KEY}")], &body),
            200,
            None,
        ),
        raw_case(
            "API-KEY",
            raw_request(CHAT, &[&format!("API-KEY: {DEMO_KEY}")], &body),
            200,
            None,
        ),
        raw_case(
            "spaces around the key",
            raw_request(
                CHAT,
                &[&format!("Authorization:   Bearer   {DEMO_KEY}   ")],
                &body,
            ),
            200,
            None,
        ),
        raw_case(
            "X-LLM-Groups / X-LLM-Consumer / X-Mse-Consumer on an intern key",
            raw_request(
                CHAT,
                &[
                    &intern,
                    "X-LLM-Groups: *",
                    "X-LLM-Consumer: demo",
                    "X-Mse-Consumer: demo",
                ],
                &smart,
            ),
            403,
            Some("model_not_allowed"),
        ),
        raw_case(
            "a wrong key before the right one",
            raw_request(CHAT, &["authorization: Bearer sk-wrong", &key], &body),
            401,
            Some("invalid_api_key"),
        ),
        raw_case(
            "Basic scheme",
            raw_request(CHAT, &["Authorization: Basic ZGVtbzpkZW1v"], &body),
            401,
            Some("missing_api_key"),
        ),
        raw_case(
            "an empty Bearer",
            raw_request(CHAT, &["Authorization: Bearer"], &body),
            401,
            Some("missing_api_key"),
        ),
        raw_case(
            "a 2 000-byte key",
            raw_request(CHAT, &[&format!("x-api-key: {}", "k".repeat(2000))], &body),
            401,
            Some("invalid_api_key"),
        ),
        // keys in the query string: gateway.yaml's key-auth reads headers only (no
        // `query_param`), so the key is not seen
        raw_case(
            "?key=",
            raw_request(&format!("{CHAT}?key={DEMO_KEY}"), &[], &body),
            401,
            Some("missing_api_key"),
        ),
        raw_case(
            "?api-key=",
            raw_request(&format!("{CHAT}?api-key={DEMO_KEY}"), &[], &body),
            401,
            Some("missing_api_key"),
        ),
        raw_case(
            "?api_key= beside a header key",
            raw_request(
                &format!("{CHAT}?api_key={FAST_ONLY_KEY}&x=1"),
                &[&key],
                &body,
            ),
            200,
            None,
        ),
    ];
    demo.openai.clear_requests();
    for c in refused.into_iter().chain(injected).chain(cases) {
        let response = send_raw(&demo, c.request).await;
        match c.code {
            Some(code) => {
                http::assert_openai_error(&response, c.status, code);
            }
            None => assert_eq!(response.status, c.status, "{}: {}", c.name, response.text()),
        }
        serves(&demo, c.name).await;
    }
    // what the injection attempts became: a bare CR vanished, a bare LF made a header of its
    // own (stripped by key-auth), an obs-fold joined the value; identity is the key's
    for (project, agent) in [
        ("ab", Some("cx-llm-tenant: evil")),
        ("lf", None),
        ("fold x-llm-tenant: evil", None),
    ] {
        let quoted = format!("\"project\":{}", json!(project));
        let (_, record) = record_where(&demo, project, |l| {
            l["usage"].as_str().is_some_and(|u| u.contains(&quoted))
        })
        .await;
        assert_eq!(
            (&record["consumer"], &record["tenant"]),
            (&json!("demo"), &json!("demo")),
            "{record}"
        );
        if let Some(agent) = agent {
            assert_eq!(record["agent"], agent, "{record}");
        }
    }
    let injected_seen = demo
        .openai
        .requests()
        .into_iter()
        .find(|r| r.header("x-project") == Some("ab"))
        .expect("the bare-CR request reached the provider");
    assert_eq!(injected_seen.header("x-agent"), Some("cx-llm-tenant: evil"));
    assert!(injected_seen
        .headers
        .iter()
        .all(|(n, _)| !n.starts_with("x-llm-")));
    // the key in the query string beside a header key never reached the provider; the other
    // query parameters did
    let paths: Vec<String> = demo
        .openai
        .requests()
        .iter()
        .map(|r| r.path.clone())
        .collect();
    assert!(
        paths.iter().any(|p| p == &format!("{CHAT}?x=1")),
        "{paths:?}"
    );
    assert!(paths.iter().all(|p| !p.contains("key")), "{paths:?}");

    // spoofed identity, route and Envoy headers on a good request of the intern key: the key
    // decides who calls and what is allowed, the router decides where it goes, Envoy drops
    // the x-envoy-* a client sends, and no spoofed value reaches the provider
    demo.openai.clear_requests();
    let spoofed = [
        "x-llm-consumer: demo",
        "x-mse-consumer: demo",
        "x-llm-tenant: other-tenant",
        "x-llm-groups: *",
        "x-llm-key-id: 4ab4d281142e669c",
        "x-llm-tier: enterprise",
        "x-llm-model-group: smart",
        "x-llm-deployment: azure-mini",
        "x-llm-cluster: azure",
        "x-llm-request-id: spoofed-llm-request-id",
        "x-envoy-attempt-count: 1",
        "x-envoy-upstream-rq-timeout-ms: 1",
        "x-envoy-max-retries: 9",
        "x-envoy-retry-on: 4xx",
        "x-envoy-internal: true",
        "x-envoy-original-path: /admin",
        "x-envoy-force-trace: 1",
        "x-request-id: spoofed-request-id",
        "x-forwarded-for: 203.0.113.7",
        "x-forwarded-proto: https",
        "x-forwarded-host: evil.example",
    ];
    let mut lines = vec![intern.as_str(), "x-project: spoof"];
    lines.extend(spoofed);
    let response = send_raw(&demo, raw_request(CHAT, &lines, &body)).await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-llm-deployment"), Some("openai-mini"));
    assert_eq!(response.header("x-llm-model-group"), Some("fast"));
    assert_ne!(response.header("x-request-id"), Some("spoofed-request-id"));
    let seen = demo.openai.requests();
    assert_eq!(seen.len(), 1, "one attempt, at the plan's first deployment");
    assert!(demo.azure.requests().is_empty());
    let provider = &seen[0];
    for (name, value) in &provider.headers {
        assert!(!name.starts_with("x-llm-"), "{name} reached the provider");
        assert_ne!(name, "x-mse-consumer");
        assert!(
            !value.contains("spoofed") && !value.contains("other-tenant"),
            "{name}: {value}"
        );
        // neither Envoy's internals nor the client's address (issue 18): no x-envoy-*, no
        // x-forwarded-for / -proto (the access log keeps the peer address)
        assert!(
            !name.starts_with("x-envoy-")
                && name != "x-forwarded-for"
                && name != "x-forwarded-proto",
            "{name}: {value} reached the provider"
        );
    }
    // ordinary client headers go on as sent (docs/security.md § 5)
    assert_eq!(provider.header("x-forwarded-host"), Some("evil.example"));
    assert_eq!(provider.header("x-project"), Some("spoof"));
    assert_eq!(
        provider.header("authorization"),
        Some(bearer(OPENAI_CREDENTIAL).as_str())
    );
    let (_, record) = record_where(&demo, "the spoofed request", |l| {
        l["usage"]
            .as_str()
            .is_some_and(|u| u.contains("\"project\":\"spoof\""))
    })
    .await;
    for (field, value) in [
        ("consumer", "intern"),
        ("tenant", "demo"),
        ("model_group", "fast"),
        ("deployment", "openai-mini"),
    ] {
        assert_eq!(record[field], value, "{field}: {record}");
    }
    assert_ne!(record["request_id"], "spoofed-llm-request-id");
    demo.openai.clear_requests();
    serves(&demo, "spoofed headers").await;

    // the slow-loris client was cut by request_headers_timeout with a 408
    let (answer, took) = loris.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(took >= Duration::from_secs(10), "{took:?}");
    let (line, _) = record_where(&demo, "the slow-loris client", |l| {
        l["details"] == "request_header_timeout"
    })
    .await;
    assert_eq!(line["status"], 408, "{line}");
    serves(&demo, "slow loris").await;

    // the admin API (loopback only in gateway.yaml) prints every filter's configuration: the
    // virtual keys only as digests, the provider credentials in clear (the known gap of
    // docs/security.md; an admin listener must stay private)
    assert!(demo.envoy.admin().ip().is_loopback());
    let dump = demo.envoy.admin_get("/config_dump").unwrap();
    assert!(!dump.contains(DEMO_KEY) && !dump.contains(FAST_ONLY_KEY));
    assert!(dump.contains(&sha256_hex(DEMO_KEY.as_bytes())));
    assert!(dump.contains(OPENAI_CREDENTIAL) && dump.contains(ANTHROPIC_CREDENTIAL));

    // no key in the access log's path, nor anywhere else; Envoy's codec refusals are logged
    // with their reason
    let lines = access_lines(&demo);
    for details in [
        "http1.invalid_characters",
        "http1.unexpected_underscore",
        "http1.headers_too_large",
        "http1.too_many_headers",
        "http1.content_length_and_chunked_not_allowed",
        "http1.codec_error",
        "low_version",
    ] {
        assert!(
            lines.iter().any(|l| l["details"] == details),
            "no access-log line with {details}"
        );
    }
    assert_logs_are_clean(&mut demo);
}

// --- slow and vanishing clients --------------------------------------------------------------

/// Writes `first`, then the rest of `request` one byte every `gap`, then reads the answer.
fn trickle(addr: &str, request: &[u8], first: usize, gap: Duration) -> Response {
    let mut socket = TcpStream::connect(addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    socket.write_all(&request[..first]).unwrap();
    for byte in &request[first..] {
        std::thread::sleep(gap);
        socket.write_all(&[*byte]).unwrap();
    }
    let mut out = Vec::new();
    let _ = socket.read_to_end(&mut out);
    parse_response(&out)
}

/// Connects, writes `bytes`, waits `linger`, hangs up.
fn hang_up(addr: &str, bytes: &[u8], linger: Duration) {
    let mut socket = TcpStream::connect(addr).unwrap();
    socket.write_all(bytes).unwrap();
    std::thread::sleep(linger);
    drop(socket);
}

/// A body sent slowly but steadily is served; a body that stalls is cut by the route's
/// `idle_timeout` (3 s in this variant of gateway.yaml, 120 s as shipped) with a 408 and
/// reaches no provider; a client that hangs up mid-headers, mid-body, after its request
/// and mid-stream leaves the access log and usage record the docs describe (nothing for a
/// request that never reached a provider; `complete: false`, estimated, for one that did),
/// and the next request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_vanishing_clients_are_cut_recorded_and_forgotten() {
    // the LLM route's `idle_timeout` (it overrides the listener's `stream_idle_timeout` there)
    // cut from 120 s to 3 s, so a stalled body is cut within the test's time
    let mut demo = Demo::start_variant(&[("idle_timeout: 120s", "idle_timeout: 3s")])
        .await
        .unwrap();
    let addr = demo.url().trim_start_matches("http://").to_owned();
    let key = format!("authorization: {}", bearer(DEMO_KEY));
    let body = hello().to_string().into_bytes();

    // slow body: the last 40 bytes one every 100 ms (4 s in all, longer than the idle
    // timeout, but never silent for that long); no timeout bounds the whole request
    // (`request_timeout: 0s`)
    let request = raw_request(CHAT, &[&key, "x-project: slow-body"], &body);
    let response = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || {
            trickle(
                &addr,
                &request,
                request.len() - 40,
                Duration::from_millis(100),
            )
        }
    })
    .await
    .unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
    serves(&demo, "a slow body").await;

    // stalled body: half of it, then silence; Envoy's 408 after the route's idle timeout
    // (the listener's stream_idle_timeout does not apply on a route that sets its own)
    demo.openai.clear_requests();
    let request = raw_request(CHAT, &[&key, "x-project: stalled"], &body);
    let half = request.len() - body.len() / 2;
    let response = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || {
            let mut socket = TcpStream::connect(&addr).unwrap();
            socket
                .set_read_timeout(Some(Duration::from_secs(30)))
                .unwrap();
            socket.write_all(&request[..half]).unwrap();
            let mut out = Vec::new();
            let _ = socket.read_to_end(&mut out);
            parse_response(&out)
        }
    })
    .await
    .unwrap();
    http::assert_openai_error(&response, 408, "invalid_request");
    let (line, record) = record_where(&demo, "the stalled body", |l| {
        l["details"] == "stream_idle_timeout"
    })
    .await;
    assert_eq!(line["status"], 408, "{line}");
    assert_eq!(
        record,
        Value::Null,
        "nothing was sent, nothing is charged: {line}"
    );
    assert!(
        demo.openai.requests().is_empty(),
        "a stalled body reached the provider"
    );
    serves(&demo, "a stalled body").await;

    // gone mid-headers: Envoy logs the attempt (no method, no path), no filter ran
    tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || {
            hang_up(
                &addr,
                format!("POST {CHAT} HTTP/1.1\r\nhost: gateway\r\nx-project: gone\r\nauthori")
                    .as_bytes(),
                Duration::from_millis(200),
            )
        }
    })
    .await
    .unwrap();
    let (line, _) = record_where(&demo, "the client gone mid-headers", |l| {
        l["details"] == "downstream_remote_disconnect" && l["method"].is_null()
    })
    .await;
    assert_eq!(
        (line["status"].as_u64(), line["flags"].as_str()),
        (Some(0), Some("DC")),
        "{line}"
    );
    serves(&demo, "a client gone mid-headers").await;

    // gone mid-body: the router still held the headers, so no later filter saw the request;
    // no provider call, no reservation, no usage record
    demo.openai.clear_requests();
    let request = raw_request(CHAT, &[&key, "x-project: gone-mid-body"], &body);
    let cut = request.len() - body.len() / 2;
    tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || hang_up(&addr, &request[..cut], Duration::from_millis(200))
    })
    .await
    .unwrap();
    let (line, record) = record_where(&demo, "the client gone mid-body", |l| {
        l["details"] == "downstream_remote_disconnect"
            && l["method"] == "POST"
            && l["usage"].is_null()
    })
    .await;
    assert_eq!(
        (line["status"].as_u64(), line["flags"].as_str()),
        (Some(0), Some("DC")),
        "{line}"
    );
    assert_eq!(record, Value::Null);
    assert!(
        demo.openai.requests().is_empty(),
        "a half body reached the provider"
    );
    serves(&demo, "a client gone mid-body").await;

    // gone after sending the request, before the (1.5 s late) answer: the provider had it,
    // so the record is there, incomplete and estimated, charged the prompt
    demo.openai.clear_requests();
    let request = raw_request(
        CHAT,
        &[
            &key,
            "x-project: gone-before-answer",
            "x-mock-delay-ms: 1500",
        ],
        &body,
    );
    tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || hang_up(&addr, &request, Duration::from_millis(500))
    })
    .await
    .unwrap();
    let (line, record) = record_where(&demo, "the client gone before the answer", |l| {
        l["usage"]
            .as_str()
            .is_some_and(|u| u.contains("\"project\":\"gone-before-answer\""))
    })
    .await;
    assert_eq!(
        (line["status"].as_u64(), line["flags"].as_str()),
        (Some(0), Some("DC")),
        "{line}"
    );
    assert_eq!(record["complete"], false, "{record}");
    assert_eq!(record["usage_source"], "estimated", "{record}");
    assert_eq!(record["usage"]["completion_tokens"], 0, "{record}");
    assert!(
        record["usage"]["prompt_tokens"].as_u64() > Some(0),
        "{record}"
    );
    assert_eq!(demo.openai.requests().len(), 1);
    serves(&demo, "a client gone before the answer").await;

    // gone mid-stream, after the first event of 40 (one every 50 ms)
    let stream = json!({"model": "fast", "stream": true, "messages": [{"role": "user", "content": prompt()}]})
        .to_string();
    let request = String::from_utf8(raw_request(
        CHAT,
        &[
            &key,
            "x-project: gone-mid-stream",
            "x-mock-chunks: 40",
            "x-mock-chunk-delay-ms: 50",
        ],
        stream.as_bytes(),
    ))
    .unwrap();
    let seen = http::hang_up_after(&addr, &request, "data: ").await;
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    let (line, record) = record_where(&demo, "the client gone mid-stream", |l| {
        l["usage"]
            .as_str()
            .is_some_and(|u| u.contains("\"project\":\"gone-mid-stream\""))
    })
    .await;
    assert_eq!(
        (line["status"].as_u64(), line["flags"].as_str()),
        (Some(200), Some("DC")),
        "{line}"
    );
    assert_eq!(record["complete"], false, "{record}");
    assert_eq!(record["stream"], true, "{record}");
    assert_eq!(record["usage_source"], "estimated", "{record}");
    assert!(
        record["usage"]["completion_tokens"].as_u64() < Some(40),
        "{record}"
    );
    serves(&demo, "a client gone mid-stream").await;

    assert_logs_are_clean(&mut demo);
}
