//! A provider that breaks, in the real Envoy 1.40 with the shipped chain
//! (`envoy-config/gateway.yaml`: key-auth, model-router, pii-redaction, usage-accounting,
//! token-ratelimit — the plain builds) and the demo's mock providers steered by `x-mock-*`:
//!
//! * the provider's connection dies mid-stream (a FIN, and a TCP reset);
//! * it stalls between two events past the route's idle timeout (a variant of gateway.yaml
//!   with 5 s instead of 120 s);
//! * it ends the stream cleanly but early (no usage, no `[DONE]`), or completes it without
//!   usage;
//! * it sends garbage: a line that is not SSE, an event whose JSON is cut off, bytes that are
//!   not UTF-8, a `data:` line that never ends.
//!
//! For each: what the client gets; the usage record in the access log (`complete`, where the
//! tokens come from, the tokens themselves by the documented rule: the provider's usage when
//! it sent it, else the prompt estimated from the request and the completion counted from the
//! events that were streamed whole); and the budget afterwards, exactly: each case runs as its
//! own end user, whose `user-day` budget (20 000 tokens) a later request overshoots on
//! purpose — its 402 says what is left, which must be the budget minus exactly the tokens of
//! that user's records. Every worker still answers, and no plugin trapped.

use llm_gateway_shared::request::Api;
use llm_gateway_shared::tokens::{count_tokens, estimate_prompt_tokens, Encoding};
use llm_gateway_tests::demo::{Demo, DEMO_KEY};
use llm_gateway_tests::http::{self, sse_events};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `user-day` in gateway.yaml: tokens per `x-user-id` per day.
const USER_DAY_TOKENS: u64 = 20_000;

/// What a raw HTTP/1.1 client saw of one exchange.
#[derive(Debug)]
struct Seen {
    status: u16,
    head: String,
    /// The body, de-chunked as far as it came.
    body: Vec<u8>,
    /// The terminating chunk arrived (a clean end).
    clean_end: bool,
    /// How the connection ended: `None` clean EOF, `Some(kind)` an error (a reset).
    error: Option<std::io::ErrorKind>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one chat request on a fresh connection (`connection: close`) and reads the answer
/// until the connection ends.
async fn exchange(demo: &Demo, user: &str, knobs: &[(&str, &str)], body: &Value) -> Seen {
    let body = body.to_string();
    let mut raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {DEMO_KEY}\r\n\
         x-user-id: {user}\r\ncontent-type: application/json\r\nconnection: close\r\n"
    );
    for (name, value) in knobs {
        raw.push_str(&format!("{name}: {value}\r\n"));
    }
    raw.push_str(&format!("content-length: {}\r\n\r\n{body}", body.len()));
    let address = demo.url().trim_start_matches("http://").to_string();
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    socket.write_all(raw.as_bytes()).await.unwrap();
    let mut received = Vec::new();
    let mut error = None;
    let mut buf = vec![0u8; 64 * 1024];
    let read = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match socket.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => received.extend_from_slice(&buf[..n]),
                Err(e) => {
                    error = Some(e.kind());
                    break;
                }
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no end within 30 s");
    drop(socket);
    let split = received
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8_lossy(&received[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let rest = &received[split + 4..];
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let (body, clean_end) = if chunked {
        dechunk(rest)
    } else {
        (rest.to_vec(), true)
    };
    Seen {
        status,
        head,
        body,
        clean_end,
        error,
    }
}

/// The data of a chunked body as far as it goes, and whether its last chunk came.
fn dechunk(mut rest: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            return (out, false);
        };
        let Ok(size) = usize::from_str_radix(String::from_utf8_lossy(&rest[..eol]).trim(), 16)
        else {
            return (out, false);
        };
        rest = &rest[eol + 2..];
        if size == 0 {
            return (out, rest.starts_with(b"\r\n"));
        }
        let take = size.min(rest.len());
        out.extend_from_slice(&rest[..take]);
        if take < size || rest.len() < size + 2 {
            return (out, false);
        }
        rest = &rest[size + 2..];
    }
}

fn tokens(record: &Value) -> u64 {
    record["usage"]["total_tokens"].as_u64().unwrap()
}

fn chat(content: &str) -> Value {
    json!({"model": "fast", "stream": true, "messages": [{"role": "user", "content": content}]})
}

/// The content of the chat events a client received whole (what usage-accounting counts).
fn streamed_text(body: &str) -> String {
    sse_events(body)
        .iter()
        .filter_map(|(_, e)| {
            e["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

/// After a case: the same user's next request succeeds (the worker is healthy), then one that
/// cannot fit is refused with 402 and says what is left of the user's budget: exactly the
/// budget minus the tokens of the user's records.
async fn check_budget_after(demo: &Demo, user: &str, charged: &[u64]) {
    let ok = http::post(format!("{}/v1/chat/completions", demo.url()))
        .header("authorization", &format!("Bearer {DEMO_KEY}"))
        .header("x-user-id", user)
        .json(&json!({"model": "fast", "messages": [{"role": "user", "content": "Still there?"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status, 200, "{}", ok.text());
    let id = ok.header("x-request-id").unwrap().to_string();
    let (record, _) = demo.usage_record(&id).await;
    let big = json!({"model": "fast", "max_tokens": 30000, "messages": [{"role": "user", "content": "Hi"}]});
    let refused = http::post(format!("{}/v1/chat/completions", demo.url()))
        .header("authorization", &format!("Bearer {DEMO_KEY}"))
        .header("x-user-id", user)
        .json(&big)
        .send()
        .await
        .unwrap();
    let error = http::assert_openai_error(&refused, 402, "budget_exceeded");
    let message = error["error"]["message"].as_str().unwrap();
    let spent: u64 = charged.iter().sum::<u64>() + tokens(&record);
    eprintln!(
        "{user}: charged {charged:?} + {} -> {message}",
        tokens(&record)
    );
    assert_eq!(
        http::tokens_left_in(message),
        USER_DAY_TOKENS - spent,
        "{user}: {message}"
    );
}

/// No plugin trapped (a trap fails the VM: every later request on that worker would fail).
fn check_no_trap(demo: &Demo) {
    let logs = demo.envoy.logs();
    for needle in [
        "panicked",
        "Uncaught",
        "RuntimeError",
        "unreachable",
        "wasm trap",
    ] {
        assert!(!logs.contains(needle), "{needle} in Envoy's log:\n{logs}");
    }
}

/// The request as the provider received it (after pii-redaction, with the deployment's model).
fn provider_body(demo: &Demo) -> Value {
    let seen = demo.openai.requests();
    seen.last()
        .expect("the provider got the request")
        .json()
        .unwrap()
}

/// What a case expects.
struct Case {
    name: &'static str,
    knobs: &'static [(&'static str, &'static str)],
    /// How the client's response ends.
    client: Client,
    /// `details` and `flags` of the access-log line.
    log: (&'static str, &'static str),
    /// The record's `complete`.
    complete: bool,
    /// The provider's own usage reached the record (else it was estimated).
    upstream_usage: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Client {
    /// The connection closed before the last chunk: the client knows the stream is cut.
    Cut,
    /// A clean end with an in-band error event (and no `[DONE]`).
    ErrorEvent,
    /// A clean end with `[DONE]`.
    Done,
}

/// Runs a case as end user `uf-<name>`; returns what the client saw and the record.
async fn run(demo: &Demo, case: &Case) -> (Seen, Value) {
    let user = format!("uf-{}", case.name);
    let seen = exchange(demo, &user, case.knobs, &chat("Tell me about the weather")).await;
    assert_eq!(seen.status, 200, "{}: {}", case.name, seen.head);
    let id = seen
        .header("x-request-id")
        .expect("x-request-id")
        .to_string();
    let (record, line) = demo.usage_record(&id).await;
    let text = seen.text();
    let what = format!("{}: {text}\n{line}", case.name);

    // the client
    let events = sse_events(&text);
    let last = events.last().map(|e| e.1.clone()).unwrap_or_default();
    match case.client {
        Client::Cut => {
            // (Envoy closes the connection, or resets it: either way no last chunk)
            assert!(!seen.clean_end, "{what} (ended by {:?})", seen.error);
            assert_ne!(last, json!("[DONE]"), "{what}");
        }
        Client::ErrorEvent => {
            assert!(seen.clean_end, "{what}");
            assert_eq!(
                last["error"]["code"], "upstream_stream_interrupted",
                "{what}"
            );
        }
        Client::Done => {
            assert!(seen.clean_end, "{what}");
            assert_eq!(last, json!("[DONE]"), "{what}");
        }
    }

    // the access log and the record
    assert_eq!(line["status"], 200, "{what}");
    assert!(
        line["details"].as_str().unwrap().starts_with(case.log.0),
        "{what}"
    );
    assert_eq!(line["flags"], case.log.1, "{what}");
    assert_eq!(record["complete"], case.complete, "{what}");
    assert_eq!(record["deployment"], "openai-mini", "{what}");
    let body = provider_body(demo);
    let (prompt, completion) = if case.upstream_usage {
        // the mock's count: ceil(chars/4) + 4 per message; one token per delta
        assert_eq!(record["usage_source"], "upstream", "{what}");
        let chunks = case
            .knobs
            .iter()
            .find(|(k, _)| *k == "x-mock-chunks")
            .map_or(8, |(_, v)| v.parse().unwrap());
        (
            estimate_prompt_tokens(Api::ChatCompletions, &body, Encoding::Chars),
            chunks,
        )
    } else {
        // estimated: the prompt from the request, the completion from the events streamed
        // whole, with the deployment model's tokenizer (gpt-4o-mini: o200k_base)
        assert_eq!(record["usage_source"], "estimated", "{what}");
        let encoding = Encoding::for_model(body["model"].as_str().unwrap());
        assert_eq!(encoding, Encoding::O200k);
        (
            estimate_prompt_tokens(Api::ChatCompletions, &body, encoding),
            count_tokens(encoding, &streamed_text(&text)),
        )
    };
    assert_eq!(record["usage"]["prompt_tokens"], prompt, "{what}");
    assert_eq!(record["usage"]["completion_tokens"], completion, "{what}");
    assert_eq!(
        record["cost_nano"],
        prompt * OPENAI_MINI_NANO.0 + completion * OPENAI_MINI_NANO.1,
        "{what}"
    );
    (seen, record)
}

/// Prices of `openai-mini` in gateway.yaml, nano-USD per token.
const OPENAI_MINI_NANO: (u64, u64) = (150, 600);

/// Several requests at once (new connections, spread over both workers): all answered.
async fn check_workers(demo: &Demo) {
    let mut all = Vec::new();
    for i in 0..8 {
        let url = format!("{}/v1/chat/completions", demo.url());
        all.push(tokio::spawn(async move {
            http::post(url)
                .header("authorization", &format!("Bearer {DEMO_KEY}"))
                .header("x-user-id", &format!("uf-after-{i}"))
                .json(&json!({"model": "fast", "messages": [{"role": "user", "content": "ok?"}]}))
                .send()
                .await
                .unwrap()
                .status
        }));
    }
    for handle in all {
        assert_eq!(handle.await.unwrap(), 200);
    }
    check_no_trap(demo);
}

/// The provider's connection dies mid-stream (FIN, then RST), goes silent past the idle
/// timeout (5 s in this variant: short, and still far above what a loaded machine keeps a
/// request waiting), ends the stream early, or completes it without usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_breaks_off() {
    let demo = Demo::start_variant(&[("idle_timeout: 120s", "idle_timeout: 5s")])
        .await
        .unwrap();
    let cut = ("upstream_reset_after_response_started", "UPE");
    let cases = [
        Case {
            name: "fin",
            knobs: &[("x-mock-chunks", "6"), ("x-mock-cut-after", "3")],
            client: Client::Cut,
            log: cut,
            complete: false,
            upstream_usage: false,
        },
        Case {
            name: "rst",
            knobs: &[
                ("x-mock-chunks", "6"),
                ("x-mock-cut-after", "3"),
                ("x-mock-cut-rst", "1"),
            ],
            client: Client::Cut,
            log: cut,
            complete: false,
            upstream_usage: false,
        },
        Case {
            name: "stall",
            knobs: &[("x-mock-chunks", "4"), ("x-mock-chunk-delay-ms", "15000")],
            client: Client::Cut,
            log: ("stream_idle_timeout", "SI"),
            complete: false,
            upstream_usage: false,
        },
        Case {
            name: "early",
            knobs: &[("x-mock-chunks", "6"), ("x-mock-end-after", "3")],
            client: Client::ErrorEvent,
            log: ("via_upstream", "-"),
            // the transport ended cleanly; what came is estimated
            complete: true,
            upstream_usage: false,
        },
        Case {
            name: "nousage",
            knobs: &[("x-mock-chunks", "6"), ("x-mock-no-usage", "1")],
            client: Client::Done,
            log: ("via_upstream", "-"),
            complete: true,
            upstream_usage: false,
        },
    ];
    for case in &cases {
        let (seen, record) = run(&demo, case).await;
        let streamed = streamed_text(&seen.text());
        match case.name {
            // the role event and two tokens went out before the cut
            "fin" | "rst" => assert_eq!(streamed, "tok0 tok1 ", "{}", case.name),
            // the first event only opened the message
            "stall" => assert_eq!(streamed, ""),
            "early" => assert_eq!(streamed, "tok0 tok1 "),
            _ => assert_eq!(streamed, "tok0 tok1 tok2 tok3 tok4 tok5 "),
        }
        check_budget_after(&demo, &format!("uf-{}", case.name), &[tokens(&record)]).await;
    }
    check_workers(&demo).await;
}

/// The provider sends garbage mid-stream: a line that is not SSE, an event whose JSON is cut
/// off, bytes that are not UTF-8 (each followed by the rest of a good stream), or a `data:`
/// line that never ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_sends_garbage() {
    let demo = Demo::start(0).await.unwrap();
    let passed = ("via_upstream", "-");
    for (name, garbage) in [
        ("text", &b"<html><body><h1>502 Bad Gateway</h1></body></html>\n\n"[..]),
        (
            "json",
            b"data: {\"id\":\"chatcmpl-garbage\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"cut off\n\n",
        ),
        (
            "utf8",
            b"{\"content\":\"\xff\xfe\xc3\x28\"}}]}\n\n",
        ),
    ] {
        let knobs: &'static [(&str, &str)] = match name {
            "text" => &[("x-mock-garbage", "text")],
            "json" => &[("x-mock-garbage", "json")],
            _ => &[("x-mock-garbage", "utf8")],
        };
        let case = Case {
            name,
            knobs,
            client: Client::Done,
            log: passed,
            complete: true,
            // the usage chunk after the garbage is read
            upstream_usage: true,
        };
        let (seen, record) = run(&demo, &case).await;
        // the garbage reaches the client as the provider sent it, between good events
        assert!(
            seen.body.windows(garbage.len()).any(|w| w == garbage),
            "{name}: {}",
            seen.text()
        );
        assert!(seen.text().contains("tok7 "), "{name}");
        check_budget_after(&demo, &format!("uf-{name}"), &[tokens(&record)]).await;
    }

    // a line that never ends: it streams through, nothing holds it (Envoy's memory stops
    // growing while it flows), until the client goes away
    let user = "uf-endless";
    let pid = demo.envoy.pid();
    let body = chat("Tell me about the weather").to_string();
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {DEMO_KEY}\r\n\
         x-user-id: {user}\r\nx-mock-garbage: endless\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    let address = demo.url().trim_start_matches("http://").to_string();
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    socket.write_all(raw.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut rss = Vec::new();
    let (mut total, mut buf) = (0usize, vec![0u8; 64 * 1024]);
    while total < ENDLESS_READ {
        let n = socket.read(&mut buf).await.unwrap();
        assert!(n > 0, "the endless stream ended");
        if head.len() < 4096 {
            head.extend_from_slice(&buf[..n.min(4096)]);
        }
        if total / (8 << 20) != (total + n) / (8 << 20) {
            rss.push(rss_kib(pid));
        }
        total += n;
    }
    drop(socket);
    let head = String::from_utf8_lossy(&head).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    eprintln!(
        "endless: {} MiB read, Envoy RSS every 8 MiB (KiB): {rss:?}",
        total >> 20
    );
    // A filter holding the line grows Envoy by at least what flowed, in every 8 MiB window
    // (appending touches new pages). Not holding it, Envoy warms up by 4-5 MiB a window over
    // the first windows (seen: three in a row at 0-24 MiB) and the allocator takes a step of
    // 15-40 MiB once or twice, at any point of the line: a window counts as growing when it
    // grows by three quarters of what flowed through it.
    let growing = rss.windows(2).filter(|w| w[1] > w[0] + 6 * 1024).count();
    assert!(
        rss.len() >= 8 && growing <= 2,
        "Envoy keeps growing with the line: {rss:?}"
    );
    let id = head
        .lines()
        .find_map(|l| l.strip_prefix("x-request-id: "))
        .unwrap()
        .trim()
        .to_string();
    let (record, line) = demo.usage_record(&id).await;
    // the client left: not complete; nothing streamed whole but the role event, so the
    // prompt only is charged
    assert_eq!(line["flags"], "DC", "{line}");
    assert_eq!(record["complete"], false, "{record}");
    assert_eq!(record["usage_source"], "estimated", "{record}");
    let body = provider_body(&demo);
    let prompt = estimate_prompt_tokens(Api::ChatCompletions, &body, Encoding::O200k);
    assert_eq!(record["usage"]["prompt_tokens"], prompt, "{record}");
    assert_eq!(record["usage"]["completion_tokens"], 0, "{record}");
    check_budget_after(&demo, user, &[tokens(&record)]).await;
    check_workers(&demo).await;
}

/// Not a provider fault: a client over its own rate limit (gateway.yaml's `user-rpm`, 10 a
/// minute) gets token-ratelimit's 429s, local replies that reach no deployment. They must
/// not count against the deployments' breakers (5 failures in a row open one): counted,
/// they opened both `fast` deployments' breakers and every other client got 503
/// `deployments_unavailable` for the cooldown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_at_its_rate_limit_is_no_provider_failure() {
    let demo = Demo::start(0).await.unwrap();
    let url = format!("{}/v1/chat/completions", demo.url());
    let hello = json!({"model": "fast", "messages": [{"role": "user", "content": "Hello"}]});
    let send = |user: &'static str| {
        http::post(&url)
            .header("authorization", &format!("Bearer {DEMO_KEY}"))
            .header("x-user-id", user)
            .json(&hello)
            .send()
    };
    let mut refused = 0;
    for _ in 0..16 {
        if send("uf-flood").await.unwrap().status == 429 {
            refused += 1;
        }
    }
    assert!(refused >= 6, "{refused} refused");
    let other = send("uf-other").await.unwrap();
    assert_eq!(other.status, 200, "{}", other.text());
    assert_eq!(other.header("x-llm-deployment"), Some("openai-mini"));
    let stats = demo
        .envoy
        .admin_get("/stats?filter=breaker.opened")
        .unwrap();
    assert!(!stats.contains("breaker.opened"), "{stats}");
    assert!(demo.azure.requests().is_empty());
}

/// How much of the endless line the client reads before it leaves: ten 8 MiB windows of RSS.
const ENDLESS_READ: usize = 80 << 20;

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}
