//! A small HTTP/1.1 client for the tests (hyper), reading whole responses.

use crate::Result;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// A whole response.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers, lowercase names.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Bytes,
}

impl Response {
    /// First value of a header (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON.
    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_slice(&self.body)
            .map_err(|e| format!("body is not JSON ({e}): {}", self.text()))
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Panics unless `response` is an OpenAI-shaped error (`{"error":{"message","type","code"}}`,
/// JSON content type) with `status` and `code`; the parsed body.
pub fn assert_openai_error(response: &Response, status: u16, code: &str) -> serde_json::Value {
    assert_eq!(response.status, status, "{}", response.text());
    let body = response.json().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(body["error"]["type"].is_string(), "{body}");
    assert_eq!(response.header("content-type"), Some("application/json"));
    body
}

/// A request being built.
#[derive(Debug, Clone)]
pub struct Request {
    method: &'static str,
    url: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// A POST to `url`.
pub fn post(url: impl Into<String>) -> Request {
    Request {
        method: "POST",
        url: url.into(),
        headers: Vec::new(),
        body: Vec::new(),
    }
}

/// A GET of `url`.
pub fn get(url: impl Into<String>) -> Request {
    Request {
        method: "GET",
        url: url.into(),
        headers: Vec::new(),
        body: Vec::new(),
    }
}

impl Request {
    /// Adds a header.
    #[must_use]
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// Sets a JSON body and `content-type`.
    #[must_use]
    pub fn json(mut self, value: &serde_json::Value) -> Self {
        self.body = value.to_string().into_bytes();
        self.header("content-type", "application/json")
    }

    /// Sets a raw body.
    #[must_use]
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// Sends it on a fresh connection and reads the whole response.
    pub async fn send(self) -> Result<Response> {
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let mut builder = hyper::Request::builder().method(self.method).uri(&self.url);
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        let request = builder
            .body(Full::new(Bytes::from(self.body)))
            .map_err(|e| format!("bad request: {e}"))?;
        let response = client
            .request(request)
            .await
            .map_err(|e| format!("{} {}: {e}", self.method, self.url))?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading body of {}: {e}", self.url))?
            .to_bytes();
        Ok(Response {
            status,
            headers,
            body,
        })
    }
}

/// A client that goes away mid-response: sends `raw` (a whole HTTP/1.1 request) to `addr`,
/// reads until `marker` has arrived, then hangs up. What it read (head and body so far).
pub async fn hang_up_after(addr: &str, raw: &str, marker: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    socket
        .write_all(raw.as_bytes())
        .await
        .unwrap_or_else(|e| panic!("send: {e}"));
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains(marker) {
        let n = socket
            .read(&mut buf)
            .await
            .unwrap_or_else(|e| panic!("read: {e}"));
        assert!(
            n > 0,
            "the response ended before {marker:?}: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(buf.get(..n).unwrap_or_default());
    }
    drop(socket);
    String::from_utf8_lossy(&seen).into_owned()
}

/// The SSE events (name, JSON data) of a body; `[DONE]` as a string.
pub fn sse_events(body: &str) -> Vec<(Option<String>, serde_json::Value)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|event| {
            let mut name = None;
            let mut data = String::new();
            for line in event.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = Some(n.to_owned());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
            let value = serde_json::from_str(&data).unwrap_or(serde_json::Value::String(data));
            (name, value)
        })
        .collect()
}

/// The amount a budget refusal says is left: `… 1034 tokens reserved, 176 left` → 176.
/// Panics (a test helper) when the message has no such number.
pub fn tokens_left_in(message: &str) -> u64 {
    let before = message
        .rsplit_once(" left")
        .map(|(b, _)| b)
        .unwrap_or_else(|| panic!("{message}"));
    before
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{message}"))
}
