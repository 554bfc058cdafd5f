//! Accept loop, per-connection HTTP/1.1 serving, routing and the knob pipeline.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::body::MockBody;
use crate::error::{ApiError, Dialect};
use crate::flavor::{Flavor, Route};
use crate::handlers::{self, Ctx, Reply};
use crate::knobs::{Garbage, Knobs};
use crate::record::{RecordedRequest, Recorder, MAX_BODY_BYTES};
use crate::validate;

pub(crate) struct State {
    recorder: Recorder,
    record: bool,
    log: bool,
    flavor: Flavor,
    next_id: AtomicU64,
    /// Anthropic's `request-id`s.
    next_request_id: AtomicU64,
    /// Knob headers applied to requests that do not carry them (see
    /// `MockUpstream::set_default_knobs`).
    default_knobs: std::sync::Mutex<hyper::header::HeaderMap>,
}

impl State {
    pub(crate) fn new(record: bool, log: bool, flavor: Flavor) -> State {
        State {
            recorder: Recorder::new(),
            record,
            log,
            flavor,
            next_id: AtomicU64::new(1),
            next_request_id: AtomicU64::new(1),
            default_knobs: std::sync::Mutex::new(hyper::header::HeaderMap::new()),
        }
    }

    /// Replaces the default knob headers.
    pub(crate) fn set_default_knobs(&self, knobs: hyper::header::HeaderMap) {
        *self
            .default_knobs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = knobs;
    }

    /// `headers` plus every default knob they do not carry themselves.
    fn with_default_knobs(&self, headers: &hyper::header::HeaderMap) -> hyper::header::HeaderMap {
        let defaults = self
            .default_knobs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut merged = headers.clone();
        for (name, value) in defaults.iter() {
            if !merged.contains_key(name) {
                merged.insert(name.clone(), value.clone());
            }
        }
        merged
    }

    /// The recorded requests (always empty when recording is off).
    pub(crate) fn recorded(&self) -> MutexGuard<'_, VecDeque<RecordedRequest>> {
        self.recorder.lock()
    }
}

/// Accepts connections forever. The shutdown sender lives in this future: when the task is
/// aborted (or the future dropped) every connection task sees the channel close and drops its
/// connection.
pub(crate) async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    let (_shutdown_tx, shutdown_rx) = watch::channel(());
    loop {
        let (stream, _peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                if state.log {
                    eprintln!("mock-upstream: accept error: {e}");
                }
                match e.kind() {
                    io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::Interrupted => {}
                    // Out of file descriptors and the like: back off a little.
                    _ => tokio::time::sleep(Duration::from_millis(10)).await,
                }
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let state = Arc::clone(&state);
        let mut shutdown = shutdown_rx.clone();
        let reset = Arc::new(AtomicBool::new(false));
        let stream = ResetOnDrop {
            stream,
            reset: Arc::clone(&reset),
        };
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let state = Arc::clone(&state);
                let reset = Arc::clone(&reset);
                async move { Ok::<_, Infallible>(handle(&state, &reset, req).await) }
            });
            let conn = http1::Builder::new()
                .keep_alive(true)
                .pipeline_flush(true)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                // Errors here are client disconnects or our own deliberate cuts.
                _ = conn => {}
                _ = shutdown.changed() => {}
            }
        });
    }
}

/// A connection's socket; once `reset` is set, closing it sends a TCP RST instead of a FIN
/// (`SO_LINGER` 0): `x-mock-cut-rst`.
struct ResetOnDrop {
    stream: TcpStream,
    reset: Arc<AtomicBool>,
}

impl Drop for ResetOnDrop {
    fn drop(&mut self) {
        if self.reset.load(Ordering::Relaxed) {
            let _ = self.stream.set_zero_linger();
        }
    }
}

impl AsyncRead for ResetOnDrop {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ResetOnDrop {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

async fn handle(state: &State, reset: &AtomicBool, req: Request<Incoming>) -> Response<MockBody> {
    let (parts, body) = req.into_parts();
    let log_line = state.log.then(|| {
        format!(
            "{} {}",
            parts.method,
            parts.uri.path_and_query().map_or("/", |pq| pq.as_str())
        )
    });

    let response = handle_inner(state, reset, parts, body).await;
    if let Some(line) = log_line {
        eprintln!("{line} -> {}", response.status().as_u16());
    }
    response
}

async fn handle_inner(
    state: &State,
    reset: &AtomicBool,
    parts: hyper::http::request::Parts,
    body: Incoming,
) -> Response<MockBody> {
    // Anthropic answers every request with a `request-id` (its error bodies carry it too)
    let request_id = (state.flavor == Flavor::Anthropic).then(|| {
        format!(
            "req_mock_{}",
            state.next_request_id.fetch_add(1, Ordering::Relaxed)
        )
    });
    let mut response = answer(
        state,
        reset,
        parts,
        body,
        request_id.as_deref().unwrap_or(""),
    )
    .await;
    if let Some(value) = request_id.and_then(|id| HeaderValue::from_str(&id).ok()) {
        response.headers_mut().insert("request-id", value);
    }
    response
}

/// Reads, records and answers one request.
async fn answer(
    state: &State,
    reset: &AtomicBool,
    parts: hyper::http::request::Parts,
    body: Incoming,
    request_id: &str,
) -> Response<MockBody> {
    let dialect = state.flavor.dialect();
    let refuse = |e: &ApiError| error_response(e, dialect, request_id);
    // Refuse an announced oversized body without reading it.
    let announced = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let body = if announced.is_some_and(|len| len > MAX_BODY_BYTES as u64) {
        Err(too_large())
    } else {
        match Limited::new(body, MAX_BODY_BYTES).collect().await {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
            Err(_) => Err(ApiError::invalid("could not read the request body", None)),
        }
    };

    if state.record {
        state.recorder.push(RecordedRequest {
            method: parts.method.as_str().to_owned(),
            path: parts
                .uri
                .path_and_query()
                .map_or_else(|| parts.uri.to_string(), |pq| pq.as_str().to_owned()),
            headers: parts
                .headers
                .iter()
                .map(|(name, value)| {
                    (
                        name.as_str().to_owned(),
                        String::from_utf8_lossy(value.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body: body.as_ref().cloned().unwrap_or_default(),
        });
    }

    let body = match body {
        Ok(body) => body,
        Err(e) => return refuse(&e),
    };

    let route = match state
        .flavor
        .route(&parts.method, parts.uri.path(), parts.uri.query())
    {
        Ok(Route::Health) => {
            return response(
                StatusCode::OK,
                "text/plain",
                MockBody::full(Bytes::from_static(b"ok"), true),
            )
        }
        Ok(route) => route,
        Err(e) => return refuse(&e),
    };
    if let Err(e) = state.flavor.authenticate(&parts.headers) {
        return refuse(&e);
    }

    let knobs = match Knobs::from_headers(&state.with_default_knobs(&parts.headers)) {
        Ok(knobs) => knobs,
        Err(e) => return refuse(&e.into()),
    };
    if knobs.cut_rst && knobs.cut_after.is_some() {
        // the cut drops the connection: with a reset, not a FIN
        reset.store(true, Ordering::Relaxed);
    }

    if let Some(delay) = knobs.delay {
        tokio::time::sleep(delay).await;
    }

    // `x-mock-status-model`: the status only for a request naming that model
    let status = knobs.status.filter(|_| {
        knobs.status_model.as_deref().is_none_or(|model| {
            serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .is_some_and(|v| v["model"] == model)
        })
    });
    if let Some(status) = status {
        let code = status.as_u16();
        let mut resp = refuse(&ApiError {
            code: Some(
                knobs
                    .error_code
                    .clone()
                    .unwrap_or_else(|| format!("mock_{code}")),
            ),
            ..ApiError::new(status, format!("mock status {code}"), "mock_error")
        });
        if let Some(value) = knobs
            .retry_after
            .as_deref()
            .and_then(|v| HeaderValue::from_str(v).ok())
        {
            resp.headers_mut().insert(RETRY_AFTER, value);
        }
        return resp;
    }

    let request: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        Ok(_) => {
            return refuse(&ApiError::invalid(
                "the request body must be a JSON object",
                None,
            ))
        }
        Err(e) => {
            return refuse(&ApiError::invalid(
                &format!("the request body is not valid JSON: {e}"),
                None,
            ))
        }
    };
    if let Err(e) = validate::check(state.flavor, &route, &request) {
        return refuse(&e);
    }

    let deployment = match &route {
        Route::AzureChat(deployment) | Route::AzureEmbeddings(deployment) => {
            Some(deployment.as_str())
        }
        _ => None,
    };
    let ctx = Ctx {
        knobs: &knobs,
        id: state.next_id.fetch_add(1, Ordering::Relaxed),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        deployment,
    };
    let reply = match route {
        Route::Chat | Route::AzureChat(_) => handlers::chat(&request, &ctx),
        Route::Messages => handlers::messages(&request, &ctx),
        Route::CountTokens => handlers::count_tokens(&request, &ctx),
        Route::Responses => handlers::responses(&request, &ctx),
        Route::Embeddings | Route::AzureEmbeddings(_) => handlers::embeddings(&request, &ctx),
        Route::Health => Err(ApiError::invalid("no body for a health check", None)),
    };
    match reply {
        Ok(reply) => reply_response(reply, &knobs),
        Err(e) => refuse(&e),
    }
}

fn too_large() -> ApiError {
    ApiError {
        code: Some("request_too_large".to_owned()),
        ..ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {MAX_BODY_BYTES} bytes"),
            "invalid_request_error",
        )
    }
}

fn response(status: StatusCode, content_type: &'static str, body: MockBody) -> Response<MockBody> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn error_response(e: &ApiError, dialect: Dialect, request_id: &str) -> Response<MockBody> {
    response(
        e.status,
        "application/json",
        MockBody::full(Bytes::from(e.to_json(dialect, request_id)), true),
    )
}

/// Turns a successful answer into a response, applying the pacing / cutting knobs.
fn reply_response(reply: Reply, knobs: &Knobs) -> Response<MockBody> {
    match reply {
        Reply::Json(json) => {
            let bytes = Bytes::from(json);
            let body = match knobs.cut_after {
                None => MockBody::full(bytes, true),
                Some(_) => {
                    let len = bytes.len() as u64;
                    let half = bytes.slice(..bytes.len() / 2);
                    MockBody::scripted(vec![half], Duration::ZERO, true, Some(len))
                }
            };
            response(StatusCode::OK, "application/json", body)
        }
        Reply::Sse(sse) => {
            let (bytes, ends) = sse.finish();
            if let Some(garbage) = knobs.garbage {
                return sse_response(garbage_body(garbage, &bytes, &ends, knobs));
            }
            // `x-mock-end-after` stops early like `x-mock-cut-after` but ends the body cleanly
            let limit = knobs.cut_after.or(knobs.end_after);
            let body = if limit.is_none() && knobs.chunk_delay.is_none() {
                MockBody::full(bytes, false)
            } else {
                let count = limit.map_or(ends.len(), |n| {
                    ends.len().min(usize::try_from(n).unwrap_or(usize::MAX))
                });
                let frames = match knobs.chunk_delay {
                    Some(_) => {
                        let mut start = 0;
                        ends[..count]
                            .iter()
                            .map(|&end| {
                                let frame = bytes.slice(start..end);
                                start = end;
                                frame
                            })
                            .collect()
                    }
                    None => match count.checked_sub(1).map(|last| ends[last]) {
                        Some(end) => vec![bytes.slice(..end)],
                        None => Vec::new(),
                    },
                };
                MockBody::scripted(
                    frames,
                    knobs.chunk_delay.unwrap_or(Duration::ZERO),
                    knobs.cut_after.is_some(),
                    None,
                )
            };
            sse_response(body)
        }
    }
}

fn sse_response(body: MockBody) -> Response<MockBody> {
    let mut resp = response(StatusCode::OK, "text/event-stream", body);
    resp.headers_mut()
        .insert("cache-control", HeaderValue::from_static("no-cache"));
    resp
}

/// Bytes of an `x-mock-garbage` event (all but `endless`).
fn garbage_bytes(garbage: Garbage) -> &'static [u8] {
    match garbage {
        Garbage::Text => b"<html><body><h1>502 Bad Gateway</h1></body></html>\n\n",
        Garbage::Json => b"data: {\"id\":\"chatcmpl-garbage\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"cut off\n\n",
        Garbage::Utf8 => {
            b"data: {\"id\":\"chatcmpl-garbage\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\xff\xfe\xc3\x28\"}}]}\n\n"
        }
        Garbage::Endless => b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"",
    }
}

/// The stream with `garbage` after its first event: the rest of it after the garbage, or, for
/// a line that never ends, nothing after it.
fn garbage_body(garbage: Garbage, bytes: &Bytes, ends: &[usize], knobs: &Knobs) -> MockBody {
    let first = ends.first().copied().unwrap_or(0);
    let head = bytes.slice(..first);
    match garbage {
        Garbage::Endless => {
            let mut start = head.to_vec();
            start.extend_from_slice(garbage_bytes(garbage));
            MockBody::endless(Bytes::from(start), Bytes::from(vec![b'x'; 64 * 1024]))
        }
        other => MockBody::scripted(
            vec![
                head,
                Bytes::from_static(garbage_bytes(other)),
                bytes.slice(first..),
            ],
            knobs.chunk_delay.unwrap_or(Duration::ZERO),
            false,
            None,
        ),
    }
}
