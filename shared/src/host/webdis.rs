//! The HTTP Redis transport on the host: a command sent to a webdis cluster with
//! `dispatch_http_call`, and its answer read back as raw RESP ([`crate::webdis`] says what
//! the request and the answer look like). Works on every proxy-wasm host (plain Envoy, Istio,
//! Envoy Gateway), unlike [`super::redis`].
//!
//! The host makes the call on the plugin's root context (proxy-wasm-cpp-host's `http_call`),
//! so it outlives the stream that sent it; the SDK's dispatcher, though, hands the answer to
//! the context that was current when it was sent, and drops it if that context is gone.
//! Whatever must see its answer after the stream ends is sent from a root-context callback
//! (`on_tick`).

use super::{buffer, header, Buffer, HeaderMap, HostError, HostResult};
use crate::webdis::{self, WebdisError};

/// Where a plugin's webdis is and how it logs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRedis {
    /// The Envoy cluster of the webdis servers.
    pub cluster: String,
    /// `Authorization` (webdis `http_basic_auth`); never logged.
    pub authorization: Option<String>,
    /// Call timeout.
    pub timeout_ms: u32,
}

/// Sends one command (command name first); the answer arrives in `on_http_call_response`
/// with the returned token: read it with [`reply`]. A command longer than webdis takes
/// ([`webdis::MAX_REQUEST_BODY`]) is not sent: [`HostError::BadArgument`].
pub fn send<A: AsRef<[u8]>>(to: &HttpRedis, args: &[A]) -> HostResult<u32> {
    let body = webdis::request_body(args).map_err(|_| HostError::BadArgument)?;
    let mut headers: Vec<(&str, &str)> = vec![
        (":method", "POST"),
        (":path", webdis::PATH),
        (":authority", to.cluster.as_str()),
        ("content-type", "text/plain"),
    ];
    if let Some(auth) = &to.authorization {
        headers.push(("authorization", auth.as_str()));
    }
    super::dispatch_http_call(&to.cluster, &headers, &body, to.timeout_ms)
}

/// The raw RESP reply of the answer being delivered (inside `on_http_call_response`, with its
/// `body_size`). A call that failed (no headers) is [`WebdisError::NoAnswer`].
pub fn reply(body_size: usize) -> Result<Vec<u8>, WebdisError> {
    let status = header(HeaderMap::HttpCallResponseHeaders, ":status")
        .ok()
        .flatten()
        .and_then(|s| String::from_utf8(s).ok());
    let body = if body_size == 0 {
        Vec::new()
    } else {
        buffer(Buffer::HttpCallResponseBody, 0, body_size).unwrap_or_default()
    };
    webdis::reply(status.as_deref(), body)
}
