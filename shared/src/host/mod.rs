//! A safe layer over the proxy-wasm host calls: every non-OK status is an error value.
//!
//! proxy-wasm 0.2.5's `hostcalls` `panic!` on any status they did not expect, its trait
//! getters `unwrap()` those results, and its header getters `unwrap()` UTF-8 decoding of
//! values a client controls. With `panic = "abort"` each of those is a trap that kills the VM
//! for every request on the worker. Plugins call these functions instead; the SDK is used
//! only for its dispatcher (the `proxy_on_*` exports and the context traits).
//!
//! Compiled for `wasm32` only: the imports exist only inside a proxy-wasm host.
#![allow(unsafe_code)]

mod abi;
pub mod filter;
#[cfg(feature = "redis")]
pub mod redis;
pub mod redis_client;
pub mod stage;

use crate::config::ConfigError;
use crate::reject::Reject;
use crate::rules::{MatchInput, RuleSet};
use crate::wire;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use crate::wire::HostError;

/// The result of a host call.
pub type HostResult<T> = Result<T, HostError>;

fn check(status: u32) -> HostResult<()> {
    HostError::check(status)
}

/// Takes ownership of a buffer the host allocated through `proxy_on_memory_allocate`.
///
/// # Safety
/// `data` must be null or the pointer the host wrote after a successful call, to `size`
/// bytes it allocated with the SDK's allocator (a boxed slice of exactly `size` bytes).
unsafe fn take_buffer(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() || size == 0 {
        return Vec::new();
    }
    // SAFETY: per the contract above, `data` came from `Box<[u8]>` of length `size`, which has
    // the layout of a `Vec<u8>` with capacity `size`.
    unsafe { Vec::from_raw_parts(data, size, size) }
}

// ---------------------------------------------------------------------------------------
// Logging and time

/// Log levels: [`crate::level::Level`], the one every core speaks.
pub use crate::level::Level as LogLevel;

/// Writes a log line. A failure to log is ignored: logging never fails a request.
/// Never pass a key, a prompt or a PII value.
pub fn log(level: LogLevel, message: &str) {
    // SAFETY: pointer and length of a live `&str`.
    let _ = unsafe { abi::proxy_log(level as u32, message.as_ptr(), message.len()) };
}

/// True if the host would print a line at `level` (check before formatting a costly one).
pub fn log_enabled(level: LogLevel) -> bool {
    let mut current = 0u32;
    // SAFETY: `current` is a live u32 the host writes to.
    match unsafe { abi::proxy_get_log_level(&mut current) } {
        0 => current <= level as u32,
        _ => true,
    }
}

/// This VM's last good clock reading ([`time_nanos`]).
static LAST_GOOD: crate::clock::LastGood = crate::clock::LastGood::new();

/// Wall-clock time in nanoseconds since the Unix epoch, under the gateway's rule for a failed
/// read ([`crate::clock`]): the last good reading of this VM. What every plugin reads, but for a
/// decision the time grants, which reads [`now_nanos`] and fails closed.
pub fn time_nanos() -> u64 {
    LAST_GOOD.hold(now_nanos())
}

/// The host's clock as it answered (nanoseconds since the Unix epoch): key-auth's expiry,
/// which fails closed without it; everything else reads [`time_nanos`].
pub fn now_nanos() -> HostResult<u64> {
    let mut nanos = 0u64;
    // SAFETY: `nanos` is a live u64 the host writes to.
    check(unsafe { abi::proxy_get_current_time_nanoseconds(&mut nanos) })?;
    Ok(nanos)
}

/// [`time_nanos`] for a stage of the fused filter: read once per callback for every stage
/// ([`crate::chain::Exchange::clock`]).
pub fn clock(x: &crate::chain::Exchange) -> u64 {
    x.clock(time_nanos)
}

/// Sets this root context's tick period (0 stops ticks).
pub fn set_tick_period_ms(period_ms: u32) -> HostResult<()> {
    // SAFETY: plain integer argument.
    check(unsafe { abi::proxy_set_tick_period_milliseconds(period_ms) })
}

// ---------------------------------------------------------------------------------------
// Headers

/// Which header map a call addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderMap {
    /// The downstream request's headers.
    RequestHeaders = 0,
    /// The downstream request's trailers.
    RequestTrailers = 1,
    /// The upstream response's headers.
    ResponseHeaders = 2,
    /// The upstream response's trailers.
    ResponseTrailers = 3,
    /// Headers of a `dispatch_http_call` response.
    HttpCallResponseHeaders = 6,
}

/// The request headers read once (one host call), as the view every filter shares.
pub fn request_head() -> HostResult<crate::request::RequestHead> {
    // indexed in place: no allocation per header (a String and a Vec each, as `headers`
    // makes, cost about as much as the rest of a plugin's request-headers callback)
    header_view(HeaderMap::RequestHeaders).map(crate::request::RequestHead::encoded)
}

/// Every header of `map`, names as the host gives them (Envoy: lowercase), values as bytes.
pub fn headers(map: HeaderMap) -> HostResult<Vec<(String, Vec<u8>)>> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: out-pointers to live locals.
    let status = unsafe { abi::proxy_get_header_map_pairs(map as u32, &mut data, &mut size) };
    check(status)?;
    // SAFETY: OK status: the host allocated `size` bytes at `data` (or null).
    let bytes = unsafe { take_buffer(data, size) };
    wire::decode_header_map(&bytes).ok_or(HostError::Malformed("header map"))
}

/// Every header of `map` in one call, looked up in place ([`wire::EncodedHeaders`]): for a
/// callback that reads several headers (each present one read alone costs the host an
/// allocation in the VM).
pub fn header_view(map: HeaderMap) -> HostResult<wire::EncodedHeaders> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: out-pointers to live locals.
    let status = unsafe { abi::proxy_get_header_map_pairs(map as u32, &mut data, &mut size) };
    check(status)?;
    // SAFETY: OK status: the host allocated `size` bytes at `data` (or null).
    let bytes = unsafe { take_buffer(data, size) };
    wire::EncodedHeaders::new(bytes).ok_or(HostError::Malformed("header map"))
}

/// One header's value (the first, if repeated); `None` if absent.
pub fn header(map: HeaderMap, name: &str) -> HostResult<Option<Vec<u8>>> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: `name` is live; out-pointers to live locals.
    let status = unsafe {
        abi::proxy_get_header_map_value(map as u32, name.as_ptr(), name.len(), &mut data, &mut size)
    };
    match status {
        0 => {
            // SAFETY: OK status: the host allocated `size` bytes at `data` (or null).
            Ok(Some(unsafe { take_buffer(data, size) }))
        }
        1 => Ok(None),
        other => Err(HostError::from_status(other)),
    }
}

/// Sets a header, replacing every existing value.
pub fn set_header(map: HeaderMap, name: &str, value: &[u8]) -> HostResult<()> {
    // SAFETY: pointers and lengths of live slices.
    check(unsafe {
        abi::proxy_replace_header_map_value(
            map as u32,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

/// Adds a header value, keeping existing ones.
pub fn add_header(map: HeaderMap, name: &str, value: &[u8]) -> HostResult<()> {
    // SAFETY: pointers and lengths of live slices.
    check(unsafe {
        abi::proxy_add_header_map_value(
            map as u32,
            name.as_ptr(),
            name.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

/// Removes every value of a header (absent is fine).
pub fn remove_header(map: HeaderMap, name: &str) -> HostResult<()> {
    // SAFETY: pointer and length of a live `&str`.
    match unsafe { abi::proxy_remove_header_map_value(map as u32, name.as_ptr(), name.len()) } {
        0 | 1 => Ok(()),
        other => Err(HostError::from_status(other)),
    }
}

/// Replaces every header of `map` with `pairs`, in one host call (Envoy removes each header
/// it holds, then adds each pair; pseudo-headers stay first). For many writes at once:
/// [`crate::chain::Edits::cheaper_as_one_map`].
pub fn set_headers(map: HeaderMap, pairs: &[(String, Vec<u8>)]) -> HostResult<()> {
    let encoded = wire::encode_header_list(pairs);
    // SAFETY: pointer and length of a live buffer.
    check(unsafe { abi::proxy_set_header_map_pairs(map as u32, encoded.as_ptr(), encoded.len()) })
}

/// Writes the header edits of a fused context ([`crate::chain::Headers::take_edits`]) in
/// order; the first failure stops and is returned with the header's name.
pub fn write_edits(map: HeaderMap, edits: &crate::chain::Edits) -> Result<(), (String, HostError)> {
    use crate::chain::Edit;
    for edit in edits.iter() {
        let (name, written) = match edit {
            Edit::Set(name, value) => (name, set_header(map, name, value)),
            Edit::Add(name, value) => (name, add_header(map, name, value)),
            Edit::Remove(name) => (name, remove_header(map, name)),
        };
        written.map_err(|err| (name.to_string(), err))?;
    }
    Ok(())
}

/// Where a stage's header and body edits go: the host (a plugin running as its own filter), or
/// the fused filter's exchange, which its driver writes to the host once (headers when they
/// continue, the body with its `content-length` kept true).
pub enum Sink<'a> {
    /// Straight to the host.
    Host,
    /// Into the fused filter's exchange.
    Fused(&'a mut crate::chain::Exchange),
}

impl Sink<'_> {
    /// The time ([`time_nanos`]); in the fused filter, read once per callback ([`clock`]).
    pub fn now_nanos(&self) -> u64 {
        match self {
            Sink::Host => time_nanos(),
            Sink::Fused(x) => clock(x),
        }
    }

    fn headers(
        exchange: &mut crate::chain::Exchange,
        map: HeaderMap,
    ) -> &mut crate::chain::Headers {
        match map {
            HeaderMap::ResponseHeaders | HeaderMap::ResponseTrailers => &mut exchange.response,
            _ => &mut exchange.request,
        }
    }

    /// Removes every value of a header.
    pub fn remove_header(&mut self, map: HeaderMap, name: &str) -> HostResult<()> {
        match self {
            Sink::Host => remove_header(map, name),
            Sink::Fused(x) => {
                Sink::headers(x, map).remove(name);
                Ok(())
            }
        }
    }

    /// Sets a header, replacing every value.
    pub fn set_header(&mut self, map: HeaderMap, name: &str, value: &[u8]) -> HostResult<()> {
        match self {
            Sink::Host => set_header(map, name, value),
            Sink::Fused(x) => {
                Sink::headers(x, map).set(name, value);
                Ok(())
            }
        }
    }

    /// Adds a header value.
    pub fn add_header(&mut self, map: HeaderMap, name: &str, value: &[u8]) -> HostResult<()> {
        match self {
            Sink::Host => add_header(map, name, value),
            Sink::Fused(x) => {
                Sink::headers(x, map).add(name, value);
                Ok(())
            }
        }
    }

    /// Replaces the request body (`size` bytes buffered). `frame`: the headers are held and
    /// carry a `content-length`, which then follows the new body
    /// ([`replace_framed_request_body`]; the caller read the headers already, so the host is
    /// not asked again); otherwise there is none to fix (the body is chunked, or the length
    /// was removed before the headers went on). The fused filter frames the body itself.
    pub fn replace_request_body(
        &mut self,
        size: usize,
        body: &[u8],
        frame: bool,
    ) -> HostResult<()> {
        match self {
            Sink::Host => replace_framed_request_body(size, body, frame),
            Sink::Fused(x) => {
                x.replace_data(body.to_vec());
                Ok(())
            }
        }
    }

    /// Replaces this callback's response data (`size` bytes).
    pub fn replace_response_body(&mut self, size: usize, body: &[u8]) -> HostResult<()> {
        match self {
            Sink::Host => set_buffer(Buffer::ResponseBody, 0, size, body),
            Sink::Fused(x) => {
                x.replace_data(body.to_vec());
                Ok(())
            }
        }
    }

    /// Sets filter state `name`; in the fused filter, `shared` also publishes it to the later
    /// stages ([`crate::chain::Exchange::publish`]).
    pub fn set_property(&mut self, name: &str, value: &[u8], shared: bool) -> HostResult<()> {
        set_property(&[name], value)?;
        if let (Sink::Fused(x), true) = (self, shared) {
            x.publish(name, value);
        }
        Ok(())
    }

    /// Clears the route cache; the fused filter clears it once, after it wrote the stages'
    /// header edits (the route depends on them).
    pub fn clear_route_cache(&mut self) -> HostResult<()> {
        match self {
            Sink::Host => clear_route_cache(),
            Sink::Fused(x) => {
                x.clear_route_cache = true;
                Ok(())
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Buffers (bodies, configuration, call responses)

/// Which buffer a call addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Buffer {
    /// The request body seen so far (cumulative while the filter pauses).
    RequestBody = 0,
    /// The response body seen so far.
    ResponseBody = 1,
    /// The body of a `dispatch_http_call` response.
    HttpCallResponseBody = 4,
    /// The VM configuration.
    VmConfiguration = 6,
    /// The plugin configuration (in `on_configure`).
    PluginConfiguration = 7,
    /// The raw RESP reply of a Higress Redis call.
    RedisCallResponse = 9,
}

/// Up to `max` bytes of `buffer` from `start`; empty if the buffer is absent or empty.
pub fn buffer(buffer: Buffer, start: usize, max: usize) -> HostResult<Vec<u8>> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: out-pointers to live locals.
    let status =
        unsafe { abi::proxy_get_buffer_bytes(buffer as u32, start, max, &mut data, &mut size) };
    match status {
        // SAFETY: OK status: the host allocated `size` bytes at `data` (or null).
        0 => Ok(unsafe { take_buffer(data, size) }),
        1 => Ok(Vec::new()),
        other => Err(HostError::from_status(other)),
    }
}

/// Replaces `size` bytes of `buffer` at `start` with `data`. Envoy accepts only
/// `start == 0` with the whole size (replace) or `start == len` (append).
pub fn set_buffer(buffer: Buffer, start: usize, size: usize, data: &[u8]) -> HostResult<()> {
    // SAFETY: pointer and length of a live slice.
    check(unsafe {
        abi::proxy_set_buffer_bytes(buffer as u32, start, size, data.as_ptr(), data.len())
    })
}

/// The request header that frames a body whose size is known.
const CONTENT_LENGTH: &str = "content-length";

/// Replaces the whole request body (`size` bytes, the size the body callback reported) with
/// `body` and keeps the request's `content-length` true: when the request has one it becomes
/// `body.len()`. The one body replace of every plugin. Call it only while this filter still
/// holds the request headers (it paused them): headers already forwarded keep the length they
/// had, and a plugin that cannot hold them removes `content-length` before letting them go.
pub fn replace_request_body(size: usize, body: &[u8]) -> HostResult<()> {
    // the body first, then the header read (Envoy answers the read differently before)
    set_buffer(Buffer::RequestBody, 0, size, body)?;
    if header(HeaderMap::RequestHeaders, CONTENT_LENGTH)?.is_some() {
        set_request_length(body.len())?;
    }
    Ok(())
}

/// [`replace_request_body`] for a caller that knows whether the held request has a
/// `content-length` (`framed`): the fused filter, which holds the request's headers in memory,
/// does not ask the host again.
pub fn replace_framed_request_body(size: usize, body: &[u8], framed: bool) -> HostResult<()> {
    set_buffer(Buffer::RequestBody, 0, size, body)?;
    if framed {
        set_request_length(body.len())?;
    }
    Ok(())
}

/// Frames the request body as `length` bytes: sets `content-length` (adding it when absent)
/// and removes `transfer-encoding`. For a filter that holds the request headers and has the
/// whole body (the router's upstream role: a provider gets the length of what it receives,
/// not a chunked body, whatever the client sent).
pub fn set_request_length(length: usize) -> HostResult<()> {
    set_header(
        HeaderMap::RequestHeaders,
        CONTENT_LENGTH,
        length.to_string().as_bytes(),
    )?;
    remove_header(HeaderMap::RequestHeaders, "transfer-encoding")
}

// ---------------------------------------------------------------------------------------
// Properties (Envoy attributes and filter state)

/// A property as raw bytes (strings raw, integers 8 bytes little-endian); `None` if absent.
pub fn property(path: &[&str]) -> HostResult<Option<Vec<u8>>> {
    let encoded = wire::encode_property_path(path);
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: `encoded` is live; out-pointers to live locals.
    let status =
        unsafe { abi::proxy_get_property(encoded.as_ptr(), encoded.len(), &mut data, &mut size) };
    match status {
        // SAFETY: OK status: the host allocated `size` bytes at `data` (or null).
        0 => Ok(Some(unsafe { take_buffer(data, size) })),
        1 => Ok(None),
        other => Err(HostError::from_status(other)),
    }
}

/// A string property; `None` if absent or not UTF-8.
pub fn property_string(path: &[&str]) -> HostResult<Option<String>> {
    Ok(property(path)?.and_then(|bytes| String::from_utf8(bytes).ok()))
}

/// The response's `response.code_details` (how Envoy says who answered: `via_upstream`, a
/// filter's local reply, a superseded pass); `None` if absent, unreadable or not UTF-8.
pub fn code_details() -> Option<String> {
    property_string(&["response", "code_details"])
        .ok()
        .flatten()
}

/// The `root_id` of the filter whose context is current (Envoy's property `plugin_root_id`);
/// `None` if the host does not say. Envoy 1.40 answers it in a root context's
/// `proxy_on_context_create` already (before `proxy_on_vm_start` and `proxy_on_configure`), so
/// a module that holds several plugins (`plugins/bundle`) picks the root context to create by
/// it.
pub fn plugin_root_id() -> HostResult<Option<String>> {
    property_string(&["plugin_root_id"])
}

/// The name of the route the request matched: Higress's property `route_name`, else plain
/// Envoy's `xds.route_name` (Envoy 1.40 answers `NotFound` for `route_name`); empty if
/// neither is known.
pub fn route_name() -> String {
    static WORKS: AtomicUsize = AtomicUsize::new(0);
    first_string_property(&[&["route_name"], &["xds", "route_name"]], &WORKS)
}

/// The name of the upstream cluster: Higress's property `cluster_name`, else plain Envoy's
/// `xds.cluster_name`; empty if neither is known.
pub fn cluster_name() -> String {
    static WORKS: AtomicUsize = AtomicUsize::new(0);
    first_string_property(&[&["cluster_name"], &["xds", "cluster_name"]], &WORKS)
}

/// The first of `paths` the host knows. `works` remembers which one answered last time, so a
/// VM asks its host once per request instead of once per name it does not know.
fn first_string_property(paths: &[&[&str]], works: &AtomicUsize) -> String {
    let first = works.load(Ordering::Relaxed);
    let order = paths
        .iter()
        .enumerate()
        .cycle()
        .skip(first)
        .take(paths.len());
    for (i, path) in order {
        if let Ok(Some(value)) = property_string(path) {
            if !value.is_empty() {
                works.store(i, Ordering::Relaxed);
                return value;
            }
        }
    }
    String::new()
}

/// The plugin configuration, parsed by `parse` — for `on_configure`. When it cannot be read
/// or is invalid, logs `"<plugin>: <why>"` at error level (a [`ConfigError`] names the field and
/// never quotes a value) and returns `None`; the caller then returns `false` so the host
/// refuses the configuration.
pub fn load_config<T>(
    plugin: &str,
    parse: impl FnOnce(&[u8]) -> Result<T, ConfigError>,
) -> Option<T> {
    let document = match buffer(Buffer::PluginConfiguration, 0, usize::MAX) {
        Ok(document) => document,
        Err(err) => {
            log(
                LogLevel::Error,
                &format!("{plugin}: cannot read configuration: {err}"),
            );
            return None;
        }
    };
    parse_config(plugin, &document, parse)
}

/// `document` parsed by `parse`; on error logs `"<plugin>: <why>"` and returns `None` (the
/// fused filter's sections: each plugin's configuration, unchanged).
pub fn parse_config<T>(
    plugin: &str,
    document: &[u8],
    parse: impl FnOnce(&[u8]) -> Result<T, ConfigError>,
) -> Option<T> {
    match parse(document) {
        Ok(config) => Some(config),
        Err(err) => {
            log(LogLevel::Error, &format!("{plugin}: {err}"));
            None
        }
    }
}

/// The config of `rules` for the current request: reads the route and cluster names from
/// the host only if some rule matches on them, and the `:authority` only if some rule matches
/// on it and the caller did not already have it.
pub fn select_config<'a, C>(rules: &'a RuleSet<C>, authority: Option<&str>) -> Option<&'a C> {
    let needs = rules.needs();
    let route = if needs.route {
        route_name()
    } else {
        String::new()
    };
    let cluster = if needs.cluster {
        cluster_name()
    } else {
        String::new()
    };
    let fetched;
    let authority = match authority {
        Some(authority) => authority,
        None if needs.authority => {
            fetched = header(HeaderMap::RequestHeaders, ":authority")
                .ok()
                .flatten()
                .and_then(|value| String::from_utf8(value).ok())
                .unwrap_or_default();
            &fetched
        }
        None => "",
    };
    rules.select(&MatchInput {
        route: &route,
        authority,
        cluster: &cluster,
    })
}

/// Writes filter state `wasm.<path>` that later filters of the same request can read.
pub fn set_property(path: &[&str], value: &[u8]) -> HostResult<()> {
    let encoded = wire::encode_property_path(path);
    // SAFETY: pointers and lengths of live slices.
    check(unsafe {
        abi::proxy_set_property(encoded.as_ptr(), encoded.len(), value.as_ptr(), value.len())
    })
}

// ---------------------------------------------------------------------------------------
// Shared data

/// A shared-data value and its CAS token; `(None, 0)` if the key does not exist.
pub fn shared_data(key: &str) -> HostResult<(Option<Vec<u8>>, u32)> {
    let mut data = null_mut();
    let mut size = 0usize;
    let mut cas = 0u32;
    // SAFETY: `key` is live; out-pointers to live locals.
    let status = unsafe {
        abi::proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas)
    };
    match status {
        // SAFETY: OK status: the host allocated `size` bytes at `data` (or null).
        0 => Ok((Some(unsafe { take_buffer(data, size) }), cas)),
        1 => Ok((None, 0)),
        other => Err(HostError::from_status(other)),
    }
}

/// Sets a shared-data value if `cas` still matches (0: unconditionally).
/// `Err(HostError::CasMismatch)` is a normal outcome: re-read and retry.
pub fn set_shared_data(key: &str, value: &[u8], cas: u32) -> HostResult<()> {
    // SAFETY: pointers and lengths of live slices.
    check(unsafe {
        abi::proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas)
    })
}

/// Registers (or finds) this VM's shared queue `name`: the host then calls this root
/// context's `on_queue_ready` when an item is enqueued (Envoy: the root that registered last).
pub fn register_shared_queue(name: &str) -> HostResult<u32> {
    let mut id = 0u32;
    // SAFETY: `name` is live; out-pointer to a live local.
    check(unsafe { abi::proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

/// Appends an item to shared queue `id`.
pub fn enqueue_shared_queue(id: u32, value: &[u8]) -> HostResult<()> {
    // SAFETY: pointer and length of a live slice.
    check(unsafe { abi::proxy_enqueue_shared_queue(id, value.as_ptr(), value.len()) })
}

/// Takes the oldest item of shared queue `id`; `None` when it is empty.
pub fn dequeue_shared_queue(id: u32) -> HostResult<Option<Vec<u8>>> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: out-pointers to live locals.
    match unsafe { abi::proxy_dequeue_shared_queue(id, &mut data, &mut size) } {
        // SAFETY: OK status: the host allocated `size` bytes at `data` (or null).
        0 => Ok(Some(unsafe { take_buffer(data, size) })),
        7 => Ok(None),
        other => Err(HostError::from_status(other)),
    }
}

/// Rounds of [`update_shared_data`] before it gives up on a contended key.
pub const CAS_ROUNDS: usize = 16;

/// Read-modify-write of one shared-data value under CAS, retried on `CasMismatch`.
///
/// `update` gets the current value (`None`: the key does not exist) and returns the value to
/// write (`None`: write nothing) and a result. A missing key is first created with `seed`
/// unconditionally (CAS 0 cannot say "only if absent"; two workers creating the same key at
/// once may both write the seed, which is why a seed must be a valid starting state), and
/// the update then runs under CAS like any other.
pub fn update_shared_data<R>(
    key: &str,
    seed: &[u8],
    mut update: impl FnMut(&[u8]) -> (Option<Vec<u8>>, R),
) -> HostResult<R> {
    for _ in 0..CAS_ROUNDS {
        let (value, cas) = shared_data(key)?;
        let Some(value) = value else {
            set_shared_data(key, seed, 0)?;
            continue;
        };
        let (next, result) = update(&value);
        let Some(next) = next else {
            return Ok(result);
        };
        match set_shared_data(key, &next, cas) {
            Ok(()) => return Ok(result),
            Err(HostError::CasMismatch) => continue,
            Err(err) => return Err(err),
        }
    }
    Err(HostError::CasMismatch)
}

// ---------------------------------------------------------------------------------------
// Stream control and local replies

/// Resumes a request paused in a request callback.
pub fn resume_request() -> HostResult<()> {
    // SAFETY: plain integer argument.
    check(unsafe { abi::proxy_continue_stream(0) })
}

/// Resumes a response paused in a response callback.
pub fn resume_response() -> HostResult<()> {
    // SAFETY: plain integer argument.
    check(unsafe { abi::proxy_continue_stream(1) })
}

/// Sends a local reply instead of forwarding the request. Only possible before response
/// headers went downstream. `details` shows in `%RESPONSE_CODE_DETAILS%` (no spaces).
pub fn send_local_response(
    status: u16,
    details: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> HostResult<()> {
    let encoded = wire::encode_header_map(headers);
    // SAFETY: pointers and lengths of live slices.
    check(unsafe {
        abi::proxy_send_local_response(
            u32::from(status),
            details.as_ptr(),
            details.len(),
            body.as_ptr(),
            body.len(),
            encoded.as_ptr(),
            encoded.len(),
            -1,
        )
    })
}

/// Sends a [`Reject`] as the local reply: its status, OpenAI error JSON and headers.
pub fn send_reject(plugin: &str, reject: &Reject) -> HostResult<()> {
    send_local_response(
        reject.status,
        &reject.details(plugin),
        &reject.response_headers(),
        &reject.body(),
    )
}

/// Refuses the request: sends `reject` as `plugin`'s local reply ([`send_reject`]). A host that
/// cannot send it (the stream is gone, headers already went downstream) is logged, for there is
/// nobody left to answer.
pub fn refuse(plugin: &str, reject: &Reject) {
    if let Err(err) = send_reject(plugin, reject) {
        log(
            LogLevel::Error,
            &format!("{plugin}: cannot send the local reply: {err}"),
        );
    }
}

// ---------------------------------------------------------------------------------------
// Calls out

/// Dispatches an HTTP call to `cluster`; the answer arrives in `on_http_call_response` with
/// the returned token. `headers` must include `:method`, `:path` and `:authority`.
///
/// Goes through the SDK's `hostcalls::dispatch_http_call`: the SDK's dispatcher must record
/// the token (`register_callout`), or it traps with "invalid token_id" when the answer comes
/// (found by the wasmtime harness). That call panics only on statuses Envoy's `httpCall`
/// does not return (it answers Ok, BadArgument or InternalFailure).
pub fn dispatch_http_call(
    cluster: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout_ms: u32,
) -> HostResult<u32> {
    proxy_wasm::hostcalls::dispatch_http_call(
        cluster,
        headers.to_vec(),
        if body.is_empty() { None } else { Some(body) },
        Vec::new(),
        std::time::Duration::from_millis(u64::from(timeout_ms)),
    )
    .map_err(|status| HostError::from_status(status as u32))
}

/// Calls a host-registered foreign function and returns its result bytes.
pub fn call_foreign_function(name: &str, arguments: &[u8]) -> HostResult<Vec<u8>> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: pointers and lengths of live slices; out-pointers to live locals.
    check(unsafe {
        abi::proxy_call_foreign_function(
            name.as_ptr(),
            name.len(),
            arguments.as_ptr(),
            arguments.len(),
            &mut data,
            &mut size,
        )
    })?;
    // SAFETY: OK status: the host allocated `size` bytes at `data` (or null).
    Ok(unsafe { take_buffer(data, size) })
}

/// Asks Envoy to pick the route again after a header change (Envoy no longer re-routes on
/// its own). Envoy's foreign function `clear_route_cache`.
pub fn clear_route_cache() -> HostResult<()> {
    call_foreign_function("clear_route_cache", &[]).map(|_| ())
}

/// Makes `context_id` the current context, so that later host calls address its stream
/// (used when a root-context callback resumes a paused request).
pub fn set_effective_context(context_id: u32) -> HostResult<()> {
    // SAFETY: plain integer argument.
    check(unsafe { abi::proxy_set_effective_context(context_id) })
}

// ---------------------------------------------------------------------------------------
// Metrics

/// A host metric (Envoy stat `wasmcustom.<name>`, shared by every worker that defines it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric(u32);

/// Most metric ids one VM remembers per kind. Names carry labels (tenant, model group,
/// deployment, consumer), all from config, so a VM sees a bounded set; past this many a name
/// is defined again on each use instead of being remembered.
const METRIC_CACHE: usize = 4096;

thread_local! {
    /// Metric ids by kind (counter, gauge, histogram) and name. The host gives a name the same
    /// id for the life of the VM, and defining one is a host call that also resolves the name
    /// in Envoy's symbol table, under its lock: once per name per VM is enough.
    static METRIC_IDS: std::cell::RefCell<[crate::hash::WordMap<String, u32>; 3]> =
        std::cell::RefCell::new(Default::default());
}

impl Metric {
    fn define(kind: u32, name: &str) -> HostResult<Metric> {
        let slot = kind as usize;
        let known = METRIC_IDS.with(|ids| {
            ids.try_borrow()
                .ok()
                .and_then(|ids| ids.get(slot).and_then(|by_name| by_name.get(name).copied()))
        });
        if let Some(id) = known {
            return Ok(Metric(id));
        }
        let mut id = 0u32;
        // SAFETY: `name` is live; out-pointer to a live local.
        check(unsafe { abi::proxy_define_metric(kind, name.as_ptr(), name.len(), &mut id) })?;
        METRIC_IDS.with(|ids| {
            if let Ok(mut ids) = ids.try_borrow_mut() {
                if let Some(by_name) = ids.get_mut(slot) {
                    if by_name.len() < METRIC_CACHE {
                        by_name.insert(name.to_string(), id);
                    }
                }
            }
        });
        Ok(Metric(id))
    }

    /// Defines (or finds) a counter.
    pub fn counter(name: &str) -> HostResult<Metric> {
        Metric::define(0, name)
    }

    /// Defines (or finds) a gauge.
    pub fn gauge(name: &str) -> HostResult<Metric> {
        Metric::define(1, name)
    }

    /// Defines (or finds) a histogram.
    pub fn histogram(name: &str) -> HostResult<Metric> {
        Metric::define(2, name)
    }

    /// Adds `delta` (counters: Envoy refuses a delta <= 0, so those are skipped here).
    pub fn increment(self, delta: i64) -> HostResult<()> {
        if delta == 0 {
            return Ok(());
        }
        // SAFETY: plain integer arguments.
        check(unsafe { abi::proxy_increment_metric(self.0, delta) })
    }

    /// Sets a gauge or records a histogram sample.
    pub fn record(self, value: u64) -> HostResult<()> {
        // SAFETY: plain integer arguments.
        check(unsafe { abi::proxy_record_metric(self.0, value) })
    }

    /// The current value.
    pub fn value(self) -> HostResult<u64> {
        let mut value = 0u64;
        // SAFETY: out-pointer to a live local.
        check(unsafe { abi::proxy_get_metric(self.0, &mut value) })?;
        Ok(value)
    }
}
