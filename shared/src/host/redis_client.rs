//! The one Redis client of the plugins — key-auth's key store, token-ratelimit's leases and
//! budgets, usage-accounting's ledger — over the transport a [`RedisConfig`] names: Higress's
//! Redis calls ([`super::redis`], linked only with this crate's `redis` feature, which a
//! plugin's Higress build turns on) or HTTP calls to webdis ([`crate::webdis`], every build).
//! [`connect`] once per configuration, [`send`] an argument list, and every answer comes back as
//! an [`Answer`]: the reply as RESP bytes for [`crate::resp`], or an [`Unanswered`] that says
//! whether webdis refused the command.
//!
//! Where an answer arrives depends on the transport, and the plugin's contexts receive it:
//! - Higress's at the **root** context, in the handler [`connect`] registers (one per VM);
//! - webdis's in `on_http_call_response` of the context that was current when the call was
//!   sent: read it there with [`http_reply`]. The host makes the call on the plugin's root
//!   context (proxy-wasm-cpp-host's `http_call`), so it outlives the stream that sent it; the
//!   SDK's dispatcher, though, hands the answer to the context that was current when it was
//!   sent, and drops it if that context is gone. Whatever must see its answer after the stream
//!   ends is sent from a root-context callback (`on_tick`, `on_queue_ready`).

use super::{buffer, header, Buffer, HeaderMap, HostError, HostResult};
use crate::redis::{Answer, RedisConfig, RedisTransport, Unanswered};
use crate::{resp, webdis};

/// Connects the host to every Redis of `configs` that Higress's calls reach (`redis_init`
/// once per service: the first config of a service gives its credentials and timeout) and
/// hands their replies, `(token, answer)`, to `on_reply` at the root context; a later
/// `connect` replaces the handler. Over HTTP there is nothing to connect. `Err` is a log line
/// that names the service, never the password; a build without Higress's calls refuses a
/// Higress config here as its parser did.
pub fn connect<'a>(
    configs: impl IntoIterator<Item = &'a RedisConfig>,
    on_reply: impl FnMut(u32, Answer) + 'static,
) -> Result<(), String> {
    let mut services: Vec<&RedisConfig> = Vec::new();
    for config in configs {
        let higress = config.transport == RedisTransport::Higress;
        if higress && !services.iter().any(|c| c.service == config.service) {
            services.push(config);
        }
    }
    if services.is_empty() {
        return Ok(());
    }
    connect_higress(&services, on_reply)
}

/// Sends one command (command name first) to the Redis of `to`; its answer comes back with the
/// returned token (see the module's doc for where). A command longer than webdis takes
/// ([`webdis::MAX_REQUEST_BODY`]) is not sent: [`HostError::BadArgument`]; a Higress config in
/// a build without Higress's calls: [`HostError::Unimplemented`].
pub fn send<A: AsRef<[u8]>>(to: &RedisConfig, args: &[A]) -> HostResult<u32> {
    match &to.transport {
        RedisTransport::Higress => call_higress(&to.service, &resp::encode_command(args)),
        RedisTransport::Http { authorization } => {
            let body = webdis::request_body(args).map_err(|_| HostError::BadArgument)?;
            let mut headers: Vec<(&str, &str)> = vec![
                (":method", "POST"),
                (":path", webdis::PATH),
                (":authority", to.service.as_str()),
                ("content-type", "text/plain"),
            ];
            if let Some(auth) = authorization {
                headers.push(("authorization", auth.as_str()));
            }
            super::dispatch_http_call(&to.service, &headers, &body, to.timeout_ms)
        }
    }
}

/// The answer to a command sent over HTTP, inside `on_http_call_response` (with its
/// `body_size`). A call that failed (no headers) is webdis's "no answer".
pub fn http_reply(body_size: usize) -> Answer {
    let status = header(HeaderMap::HttpCallResponseHeaders, ":status")
        .ok()
        .flatten()
        .and_then(|s| String::from_utf8(s).ok());
    let body = if body_size == 0 {
        Vec::new()
    } else {
        buffer(Buffer::HttpCallResponseBody, 0, body_size).unwrap_or_default()
    };
    webdis::reply(status.as_deref(), body).map_err(Unanswered::from)
}

#[cfg(feature = "redis")]
fn connect_higress(
    services: &[&RedisConfig],
    mut on_reply: impl FnMut(u32, Answer) + 'static,
) -> Result<(), String> {
    use super::redis::{connect, on_redis_call_response};
    for config in services {
        connect(
            &config.service,
            config.username.as_deref(),
            config.password.as_deref(),
            config.timeout_ms,
        )?;
    }
    on_redis_call_response(move |response| {
        let answer = response.reply().map_err(|why| Unanswered {
            why,
            forbidden: false,
        });
        on_reply(response.token, answer);
    });
    Ok(())
}

#[cfg(not(feature = "redis"))]
fn connect_higress(
    _services: &[&RedisConfig],
    _on_reply: impl FnMut(u32, Answer) + 'static,
) -> Result<(), String> {
    Err("this build has no Higress Redis calls: use the plugin's Higress build".into())
}

#[cfg(feature = "redis")]
fn call_higress(service: &str, query: &[u8]) -> HostResult<u32> {
    super::redis::redis_call(service, query)
}

#[cfg(not(feature = "redis"))]
fn call_higress(_service: &str, _query: &[u8]) -> HostResult<u32> {
    Err(HostError::Unimplemented)
}
