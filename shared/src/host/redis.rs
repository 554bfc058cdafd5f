//! Higress's Redis extension of the proxy-wasm ABI: `proxy_redis_init` and
//! `proxy_redis_call`, whose reply arrives at the **root** context in the export
//! `proxy_on_redis_call_response(context_id, token, status, size)` as raw RESP in buffer
//! type 9 ([`super::Buffer::RedisCallResponse`]; decode it with [`crate::resp`]).
//!
//! Behind the cargo feature `redis`: a plain Envoy refuses to load a module that imports
//! these functions, so only the Higress build of a plugin enables it.
#![allow(unsafe_code)]

use super::{check, HostResult};

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_redis_init(
        service_data: *const u8,
        service_size: usize,
        username_data: *const u8,
        username_size: usize,
        password_data: *const u8,
        password_size: usize,
        timeout_ms: u32,
    ) -> u32;
    fn proxy_redis_call(
        service_data: *const u8,
        service_size: usize,
        query_data: *const u8,
        query_size: usize,
        return_token: *mut u32,
    ) -> u32;
}

/// Connects the host to a Redis service (`outbound|6379||redis.static`, say; Higress may
/// append `?db=N`). Call once per configuration, in `on_configure`, not per request.
/// Never log the password.
pub fn redis_init(
    service: &str,
    username: &str,
    password: &str,
    timeout_ms: u32,
) -> HostResult<()> {
    // SAFETY: pointers and lengths of live `&str`s.
    check(unsafe {
        proxy_redis_init(
            service.as_ptr(),
            service.len(),
            username.as_ptr(),
            username.len(),
            password.as_ptr(),
            password.len(),
            timeout_ms,
        )
    })
}

/// Sends one RESP query (see [`crate::resp::encode_command`]); the reply arrives at the root
/// context with the returned token. Remember the token with [`crate::pending::Pending`] to
/// resume the paused request.
pub fn redis_call(service: &str, query: &[u8]) -> HostResult<u32> {
    let mut token = 0u32;
    // SAFETY: pointers and lengths of live slices; out-pointer to a live local.
    check(unsafe {
        proxy_redis_call(
            service.as_ptr(),
            service.len(),
            query.as_ptr(),
            query.len(),
            &mut token,
        )
    })?;
    Ok(token)
}

/// The raw RESP reply inside `proxy_on_redis_call_response` (`size` as given there).
pub fn redis_reply(size: usize) -> HostResult<Vec<u8>> {
    super::buffer(super::Buffer::RedisCallResponse, 0, size)
}

/// A Redis reply as the host delivered it to the root context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisResponse {
    /// The root context id the host called.
    pub root_context_id: u32,
    /// The token [`redis_call`] returned.
    pub token: u32,
    /// 0 if Redis answered; anything else is a failed call (connect failure, timeout).
    pub status: u32,
    /// Size of the reply in buffer type 9.
    pub size: usize,
}

impl RedisResponse {
    /// True if Redis answered (the reply may still be a RESP error).
    pub fn answered(&self) -> bool {
        self.status == 0
    }

    /// The raw RESP reply (inside the handler), or why there is none: a failed call (its
    /// status) or a reply the host would not hand over.
    pub fn reply(&self) -> Result<Vec<u8>, String> {
        if !self.answered() {
            return Err(format!("call failed (status {})", self.status));
        }
        redis_reply(self.size).map_err(|err| format!("reply not read: {err}"))
    }
}

/// [`redis_init`] with a configuration's optional credentials; the error names the service
/// (never the password), ready for a log line.
pub fn connect(
    service: &str,
    username: Option<&str>,
    password: Option<&str>,
    timeout_ms: u32,
) -> Result<(), String> {
    redis_init(
        service,
        username.unwrap_or_default(),
        password.unwrap_or_default(),
        timeout_ms,
    )
    .map_err(|err| format!("cannot connect Redis service {service}: {err}"))
}

type Handler = Box<dyn FnMut(RedisResponse)>;

thread_local! {
    static HANDLER: std::cell::RefCell<Option<Handler>> = const { std::cell::RefCell::new(None) };
}

/// Registers what runs when a Redis reply arrives (call in `proxy_wasm::main!` or
/// `on_configure`; a later registration replaces the earlier one). The handler runs with the
/// root context effective: look the token up, `set_effective_context`, then resume.
pub fn on_redis_call_response(handler: impl FnMut(RedisResponse) + 'static) {
    HANDLER.with(|h| *h.borrow_mut() = Some(Box::new(handler)));
}

/// The export Higress calls. Without a registered handler the reply is dropped.
#[no_mangle]
pub extern "C" fn proxy_on_redis_call_response(
    root_context_id: u32,
    token: u32,
    status: u32,
    size: usize,
) {
    let response = RedisResponse {
        root_context_id,
        token,
        status,
        size,
    };
    // Take the handler out while it runs, so a handler that registers another does not
    // re-borrow the cell.
    let handler = HANDLER.with(|h| h.borrow_mut().take());
    if let Some(mut handler) = handler {
        handler(response);
        HANDLER.with(|h| {
            let mut slot = h.borrow_mut();
            if slot.is_none() {
                *slot = Some(handler);
            }
        });
    }
}
