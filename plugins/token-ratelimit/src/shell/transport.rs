//! The Redis transports on the host: Higress's Redis calls (the `higress` build) or HTTP to a
//! webdis cluster (every build). Replies come back as the core's [`Input::Reply`], which the
//! shell feeds it.

use crate::config::{RedisConfig, RedisTransport};
use crate::core::{Input, Unanswered};
use llm_gateway_shared::host::webdis::HttpRedis;
use llm_gateway_shared::host::{self, HostError};
use llm_gateway_shared::resp;
use llm_gateway_shared::webdis::WebdisError;
use std::borrow::Cow;

/// Sends one command: to webdis when `http` names its cluster, else by Higress's Redis call
/// to `service`.
pub(super) fn send(
    http: Option<&HttpRedis>,
    service: &str,
    args: &[Cow<'_, [u8]>],
) -> Result<u32, HostError> {
    match http {
        Some(http) => host::webdis::send(http, args),
        None => redis_call(service, &resp::encode_command(args)),
    }
}

#[cfg(feature = "higress")]
fn redis_call(service: &str, query: &[u8]) -> Result<u32, HostError> {
    host::redis::redis_call(service, query)
}

#[cfg(not(feature = "higress"))]
fn redis_call(_service: &str, _query: &[u8]) -> Result<u32, HostError> {
    Err(HostError::Unimplemented)
}

/// A webdis answer to call `token` (HTTP transport), as the core's input.
pub(super) fn http_reply(token: u32, body_size: usize) -> Input {
    let reply = host::webdis::reply(body_size).map_err(|err| Unanswered {
        forbidden: err == WebdisError::Forbidden,
        why: err.to_string(),
    });
    Input::Reply { token, reply }
}

/// The webdis cluster of an HTTP transport.
pub(super) fn http_redis(redis: Option<&RedisConfig>) -> Option<HttpRedis> {
    let redis = redis?;
    match &redis.transport {
        RedisTransport::Http { authorization } => Some(HttpRedis {
            cluster: redis.service.clone(),
            authorization: authorization.clone(),
            timeout_ms: redis.timeout_ms,
        }),
        RedisTransport::Higress => None,
    }
}

/// Connects the Redis transport: nothing to do over HTTP (each call is a request to the
/// webdis cluster); Higress's Redis calls need a connection, and their replies go to
/// `on_reply` as [`Input::Reply`].
pub(super) fn connect(redis: &RedisConfig, on_reply: impl FnMut(Input) + 'static) -> bool {
    let _ = &on_reply; // used by the Higress build only
    match redis.transport {
        RedisTransport::Http { .. } => true,
        #[cfg(feature = "higress")]
        RedisTransport::Higress => connect_higress(redis, on_reply),
        #[cfg(not(feature = "higress"))]
        RedisTransport::Higress => false, // refused by the config parser already
    }
}

#[cfg(feature = "higress")]
fn connect_higress(redis: &RedisConfig, mut on_reply: impl FnMut(Input) + 'static) -> bool {
    use llm_gateway_shared::host::redis::{connect, on_redis_call_response};
    use llm_gateway_shared::host::LogLevel;
    let connected = connect(
        &redis.service,
        redis.username.as_deref(),
        redis.password.as_deref(),
        redis.timeout_ms,
    );
    if let Err(why) = connected {
        host::log(LogLevel::Error, &format!("token-ratelimit: {why}"));
        return false;
    }
    on_redis_call_response(move |response| {
        let reply = response.reply();
        let reply = reply.map_err(|why| Unanswered {
            why,
            forbidden: false,
        });
        let token = response.token;
        on_reply(Input::Reply { token, reply });
    });
    true
}
