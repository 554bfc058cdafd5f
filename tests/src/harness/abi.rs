//! The host functions: proxy-wasm ABI 0.2.1 as Envoy implements it, plus Higress's Redis
//! calls. One [`Linker`] for the process; a module importing anything not defined here fails
//! to instantiate with the import's name. gRPC is linked (the Rust SDK always imports it) but
//! calling it traps with the function's name: no plugin here speaks gRPC.

use super::services::{lock, status, MetricKind, QueueOwner};
use super::state::{ContextKind, Effect, HostState, HttpCallRequest, LogLine};
use super::stream::{Direction, Headers, LocalReply};
use std::sync::OnceLock;
use wasmtime::{bail, format_err};
use wasmtime::{Caller, Extern, Linker, Memory};

type Cx<'a> = Caller<'a, HostState>;
type R = wasmtime::Result<u32>;

/// The process-wide linker: WASI preview 1 and every host function below.
pub fn linker() -> &'static Linker<HostState> {
    static LINKER: OnceLock<Linker<HostState>> = OnceLock::new();
    LINKER.get_or_init(|| {
        let mut linker = Linker::new(super::engine::engine());
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |s: &mut HostState| &mut s.wasi)
            .unwrap_or_else(|e| panic!("cannot link WASI: {e}"));
        define(&mut linker).unwrap_or_else(|e| panic!("cannot define host functions: {e}"));
        linker
    })
}

// ---------------------------------------------------------------------------------------
// Guest memory

fn memory(cx: &mut Cx<'_>) -> wasmtime::Result<Memory> {
    match cx.get_export("memory") {
        Some(Extern::Memory(m)) => Ok(m),
        _ => bail!("the module exports no memory"),
    }
}

/// Bytes of guest memory; `Err(status)` if out of bounds.
fn read(cx: &mut Cx<'_>, ptr: u32, len: u32) -> wasmtime::Result<Result<Vec<u8>, u32>> {
    let mem = memory(cx)?;
    let data = mem.data(&*cx);
    let start = ptr as usize;
    let Some(bytes) = start
        .checked_add(len as usize)
        .and_then(|end| data.get(start..end))
    else {
        return Ok(Err(status::INVALID_MEMORY_ACCESS));
    };
    let bytes = bytes.to_vec();
    cx.data_mut().counters.bytes_out += u64::from(len);
    Ok(Ok(bytes))
}

fn read_str(cx: &mut Cx<'_>, ptr: u32, len: u32) -> wasmtime::Result<Result<String, u32>> {
    Ok(read(cx, ptr, len)?.map(|b| String::from_utf8_lossy(&b).into_owned()))
}

fn write(cx: &mut Cx<'_>, ptr: u32, bytes: &[u8]) -> wasmtime::Result<Result<(), u32>> {
    let mem = memory(cx)?;
    let start = ptr as usize;
    let data = mem.data_mut(&mut *cx);
    let Some(slot) = start
        .checked_add(bytes.len())
        .and_then(|end| data.get_mut(start..end))
    else {
        return Ok(Err(status::INVALID_MEMORY_ACCESS));
    };
    slot.copy_from_slice(bytes);
    Ok(Ok(()))
}

/// Copies `bytes` into memory the guest allocates (`proxy_on_memory_allocate`) and writes
/// the pointer and size to the out-parameters.
fn give(cx: &mut Cx<'_>, bytes: &[u8], ptr_out: u32, size_out: u32) -> R {
    let ptr = if bytes.is_empty() {
        0
    } else {
        let alloc = match cx.get_export("proxy_on_memory_allocate") {
            Some(Extern::Func(f)) => f,
            _ => match cx.get_export("malloc") {
                Some(Extern::Func(f)) => f,
                _ => bail!("the module exports neither proxy_on_memory_allocate nor malloc"),
            },
        };
        let len =
            u32::try_from(bytes.len()).map_err(|_| format_err!("value too large for wasm32"))?;
        let ptr = alloc.typed::<u32, u32>(&*cx)?.call(&mut *cx, len)?;
        if ptr == 0 {
            bail!("proxy_on_memory_allocate({len}) returned null");
        }
        if let Err(s) = write(cx, ptr, bytes)? {
            return Ok(s);
        }
        cx.data_mut().counters.bytes_in += u64::from(len);
        ptr
    };
    if let Err(s) = write(cx, ptr_out, &ptr.to_le_bytes())? {
        return Ok(s);
    }
    if let Err(s) = write(cx, size_out, &(bytes.len() as u32).to_le_bytes())? {
        return Ok(s);
    }
    Ok(status::OK)
}

macro_rules! tri {
    ($e:expr) => {
        match $e? {
            Ok(v) => v,
            Err(status) => return Ok(status),
        }
    };
}

/// Counts a host call; with `LLM_GATEWAY_HOST_CALL_LOG` set, also prints the filter's
/// `root_id` and the call's name to stderr (`… 2>&1 | grep '^host call' | sort | uniq -c` shows
/// which calls each filter makes on a workload; the `callback` lines after them say in which
/// callback).
fn count(cx: &mut Cx<'_>, name: &str) {
    cx.data_mut().counters.host_calls += 1;
    if host_call_log() {
        // the fuel left tells how much the callback burnt before this call
        let left = cx.get_fuel().unwrap_or(0);
        eprintln!("host call {} {name} (fuel left {left})", cx.data().root_id);
    }
}

/// `LLM_GATEWAY_HOST_CALL_LOG` is set: every host call and, when it returns, every callback
/// (filter, export, fuel, host calls) is printed to stderr.
pub(crate) fn host_call_log() -> bool {
    static LOG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOG.get_or_init(|| std::env::var_os("LLM_GATEWAY_HOST_CALL_LOG").is_some())
}

// ---------------------------------------------------------------------------------------
// Wire formats (the harness side of shared::wire)

/// Envoy's header-map serialization.
pub fn encode_headers(headers: &Headers) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(headers.len() as u32).to_le_bytes());
    for (n, v) in headers {
        out.extend_from_slice(&(n.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (n, v) in headers {
        out.extend_from_slice(n.as_bytes());
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    out
}

/// Decodes a header map a plugin sent; `None` if malformed.
pub fn decode_headers(bytes: &[u8]) -> Option<Headers> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let u32_at = |at: usize| -> Option<usize> {
        Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize)
    };
    let count = u32_at(0)?;
    let mut pos = 4usize.checked_add(count.checked_mul(8)?)?;
    let mut out = Vec::with_capacity(count.min(1024));
    for i in 0..count {
        let (nl, vl) = (u32_at(4 + i * 8)?, u32_at(8 + i * 8)?);
        let name = bytes.get(pos..pos.checked_add(nl)?)?;
        pos += nl + 1;
        let value = bytes.get(pos..pos.checked_add(vl)?)?;
        pos += vl + 1;
        out.push((
            String::from_utf8_lossy(name).to_ascii_lowercase(),
            value.to_vec(),
        ));
    }
    Some(out)
}

/// A property path (segments separated by NUL) as a dotted string.
fn property_path(raw: &[u8]) -> String {
    raw.split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect::<Vec<_>>()
        .join(".")
}

// ---------------------------------------------------------------------------------------
// The functions

fn define(l: &mut Linker<HostState>) -> wasmtime::Result<()> {
    const ENV: &str = "env";

    l.func_wrap(
        ENV,
        "proxy_log",
        |mut cx: Cx<'_>, level: u32, ptr: u32, len: u32| -> R {
            count(&mut cx, "proxy_log");
            let message = tri!(read_str(&mut cx, ptr, len));
            cx.data_mut().logs.push(LogLine { level, message });
            Ok(status::OK)
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_get_log_level",
        |mut cx: Cx<'_>, out: u32| -> R {
            count(&mut cx, "proxy_get_log_level");
            let level = cx.data().log_level;
            tri!(write(&mut cx, out, &level.to_le_bytes()));
            Ok(status::OK)
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_get_current_time_nanoseconds",
        |mut cx: Cx<'_>, out: u32| -> R {
            count(&mut cx, "proxy_get_current_time_nanoseconds");
            let now = cx.data().clock.now_nanos();
            tri!(write(&mut cx, out, &now.to_le_bytes()));
            Ok(status::OK)
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_set_tick_period_milliseconds",
        |mut cx: Cx<'_>, period: u32| -> R {
            count(&mut cx, "proxy_set_tick_period_milliseconds");
            cx.data_mut().tick_period_ms = period;
            Ok(status::OK)
        },
    )?;

    // Buffers
    l.func_wrap(
        ENV,
        "proxy_get_buffer_bytes",
        |mut cx: Cx<'_>, kind: u32, start: u32, max: u32, ptr_out: u32, size_out: u32| -> R {
            count(&mut cx, "proxy_get_buffer_bytes");
            let whole: Option<Vec<u8>> = {
                let s = cx.data();
                match kind {
                    0 | 1 => s.http_context().and_then(|(data, filter)| {
                        lock(&data).body_mut(kind, filter).map(|b| b.clone())
                    }),
                    4 => s.http_call_response.as_ref().map(|(_, b, _)| b.clone()),
                    6 => Some(s.vm_config.clone()),
                    7 => Some(s.plugin_config.clone()),
                    9 => s.redis_response.clone(),
                    _ => None,
                }
            };
            let Some(whole) = whole else {
                return Ok(status::NOT_FOUND);
            };
            let start = start as usize;
            if start > whole.len() {
                return Ok(status::BAD_ARGUMENT);
            }
            let end = start.saturating_add(max as usize).min(whole.len());
            if end == start {
                return Ok(status::OK);
            }
            give(&mut cx, &whole[start..end], ptr_out, size_out)
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_set_buffer_bytes",
        |mut cx: Cx<'_>, kind: u32, start: u32, size: u32, ptr: u32, len: u32| -> R {
            count(&mut cx, "proxy_set_buffer_bytes");
            let bytes = tri!(read(&mut cx, ptr, len));
            let Some((data, filter)) = cx.data().http_context() else {
                return Ok(status::NOT_FOUND);
            };
            let mut data = lock(&data);
            let Some(body) = data.body_mut(kind, filter) else {
                return Ok(status::NOT_FOUND);
            };
            // Envoy: start 0 drains `size` bytes and prepends; start at (or past) the end
            // appends; anything else is refused.
            if start == 0 {
                let drain = (size as usize).min(body.len());
                body.drain(..drain);
                body.splice(0..0, bytes);
            } else if start as usize >= body.len() {
                body.extend_from_slice(&bytes);
            } else {
                return Ok(status::BAD_ARGUMENT);
            }
            Ok(status::OK)
        },
    )?;

    // Header maps
    l.func_wrap(
        ENV,
        "proxy_get_header_map_pairs",
        |mut cx: Cx<'_>, map: u32, ptr_out: u32, size_out: u32| -> R {
            count(&mut cx, "proxy_get_header_map_pairs");
            let Some(headers) = map_of(cx.data(), map) else {
                return Ok(status::NOT_FOUND);
            };
            give(&mut cx, &encode_headers(&headers), ptr_out, size_out)
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_get_header_map_value",
        |mut cx: Cx<'_>, map: u32, kp: u32, kl: u32, ptr_out: u32, size_out: u32| -> R {
            count(&mut cx, "proxy_get_header_map_value");
            let key = tri!(read_str(&mut cx, kp, kl)).to_ascii_lowercase();
            let Some(headers) = map_of(cx.data(), map) else {
                return Ok(status::NOT_FOUND);
            };
            match headers.iter().find(|(n, _)| *n == key) {
                Some((_, v)) => give(&mut cx, v, ptr_out, size_out),
                None => Ok(status::NOT_FOUND),
            }
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_set_header_map_pairs",
        |mut cx: Cx<'_>, map: u32, ptr: u32, len: u32| -> R {
            count(&mut cx, "proxy_set_header_map_pairs");
            let raw = tri!(read(&mut cx, ptr, len));
            let Some(pairs) = decode_headers(&raw) else {
                return Ok(status::BAD_ARGUMENT);
            };
            with_map(cx.data(), map, |h| *h = pairs)
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_replace_header_map_value",
        |mut cx: Cx<'_>, map: u32, kp: u32, kl: u32, vp: u32, vl: u32| -> R {
            count(&mut cx, "proxy_replace_header_map_value");
            let key = tri!(read_str(&mut cx, kp, kl)).to_ascii_lowercase();
            let value = tri!(read(&mut cx, vp, vl));
            with_map(cx.data(), map, |h| {
                match h.iter().position(|(n, _)| *n == key) {
                    Some(first) => {
                        h[first].1 = value;
                        let mut i = 0;
                        h.retain(|(n, _)| {
                            i += 1;
                            i - 1 == first || *n != key
                        });
                    }
                    None => h.push((key, value)),
                }
            })
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_add_header_map_value",
        |mut cx: Cx<'_>, map: u32, kp: u32, kl: u32, vp: u32, vl: u32| -> R {
            count(&mut cx, "proxy_add_header_map_value");
            let key = tri!(read_str(&mut cx, kp, kl)).to_ascii_lowercase();
            let value = tri!(read(&mut cx, vp, vl));
            with_map(cx.data(), map, |h| h.push((key, value)))
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_remove_header_map_value",
        |mut cx: Cx<'_>, map: u32, kp: u32, kl: u32| -> R {
            count(&mut cx, "proxy_remove_header_map_value");
            let key = tri!(read_str(&mut cx, kp, kl)).to_ascii_lowercase();
            with_map(cx.data(), map, |h| h.retain(|(n, _)| *n != key))
        },
    )?;

    // Properties
    l.func_wrap(
        ENV,
        "proxy_get_property",
        |mut cx: Cx<'_>, pp: u32, pl: u32, ptr_out: u32, size_out: u32| -> R {
            count(&mut cx, "proxy_get_property");
            let path = property_path(&tri!(read(&mut cx, pp, pl)));
            let value = {
                let s = cx.data();
                match s.http_context() {
                    Some((data, filter)) => lock(&data).property(&path, filter),
                    None => match path.as_str() {
                        "plugin_name" => Some(s.plugin.as_bytes().to_vec()),
                        "plugin_vm_id" => Some(s.vm_id.as_bytes().to_vec()),
                        // Envoy answers it in the root context's proxy_on_context_create
                        // already (e2e bundle::)
                        "plugin_root_id" => Some(s.root_id.as_bytes().to_vec()),
                        _ => None,
                    },
                }
            };
            match value {
                Some(v) => give(&mut cx, &v, ptr_out, size_out),
                None => Ok(status::NOT_FOUND),
            }
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_set_property",
        |mut cx: Cx<'_>, pp: u32, pl: u32, vp: u32, vl: u32| -> R {
            count(&mut cx, "proxy_set_property");
            let path = property_path(&tri!(read(&mut cx, pp, pl)));
            let value = tri!(read(&mut cx, vp, vl));
            let Some((data, _)) = cx.data().http_context() else {
                return Ok(status::BAD_ARGUMENT);
            };
            lock(&data)
                .filter_state
                .insert(format!("wasm.{path}"), value);
            Ok(status::OK)
        },
    )?;

    // Shared data and queues
    l.func_wrap(
        ENV,
        "proxy_get_shared_data",
        |mut cx: Cx<'_>, kp: u32, kl: u32, ptr_out: u32, size_out: u32, cas_out: u32| -> R {
            count(&mut cx, "proxy_get_shared_data");
            let key = tri!(read_str(&mut cx, kp, kl));
            let found = {
                let s = cx.data();
                s.services.shared_data.get(&s.vm_id, &key)
            };
            let Some((value, cas)) = found else {
                return Ok(status::NOT_FOUND);
            };
            tri!(write(&mut cx, cas_out, &cas.to_le_bytes()));
            give(&mut cx, &value, ptr_out, size_out)
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_set_shared_data",
        |mut cx: Cx<'_>, kp: u32, kl: u32, vp: u32, vl: u32, cas: u32| -> R {
            count(&mut cx, "proxy_set_shared_data");
            let key = tri!(read_str(&mut cx, kp, kl));
            let value = tri!(read(&mut cx, vp, vl));
            let s = cx.data();
            Ok(s.services.shared_data.set(&s.vm_id, &key, &value, cas))
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_register_shared_queue",
        |mut cx: Cx<'_>, np: u32, nl: u32, id_out: u32| -> R {
            count(&mut cx, "proxy_register_shared_queue");
            let name = tri!(read_str(&mut cx, np, nl));
            let id = {
                let s = cx.data();
                let owner = QueueOwner {
                    worker: s.location.worker,
                    filter: s.location.filter,
                    root_context: s.root_context,
                };
                s.services.queues.register(&s.vm_id, &name, owner)
            };
            tri!(write(&mut cx, id_out, &id.to_le_bytes()));
            Ok(status::OK)
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_resolve_shared_queue",
        |mut cx: Cx<'_>, vp: u32, vl: u32, np: u32, nl: u32, id_out: u32| -> R {
            count(&mut cx, "proxy_resolve_shared_queue");
            let vm_id = tri!(read_str(&mut cx, vp, vl));
            let name = tri!(read_str(&mut cx, np, nl));
            let Some(id) = cx.data().services.queues.resolve(&vm_id, &name) else {
                return Ok(status::NOT_FOUND);
            };
            tri!(write(&mut cx, id_out, &id.to_le_bytes()));
            Ok(status::OK)
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_enqueue_shared_queue",
        |mut cx: Cx<'_>, id: u32, vp: u32, vl: u32| -> R {
            count(&mut cx, "proxy_enqueue_shared_queue");
            let value = tri!(read(&mut cx, vp, vl));
            let Some(owner) = cx.data().services.queues.enqueue(id, &value) else {
                return Ok(status::NOT_FOUND);
            };
            cx.data_mut()
                .effects
                .push(Effect::QueueReady { owner, queue: id });
            Ok(status::OK)
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_dequeue_shared_queue",
        |mut cx: Cx<'_>, id: u32, ptr_out: u32, size_out: u32| -> R {
            count(&mut cx, "proxy_dequeue_shared_queue");
            match cx.data().services.queues.dequeue(id) {
                Err(s) => Ok(s),
                Ok(None) => Ok(status::EMPTY),
                Ok(Some(v)) => give(&mut cx, &v, ptr_out, size_out),
            }
        },
    )?;

    // Stream control
    l.func_wrap(
        ENV,
        "proxy_continue_stream",
        |mut cx: Cx<'_>, kind: u32| -> R {
            count(&mut cx, "proxy_continue_stream");
            let direction = match kind {
                0 => Direction::Request,
                1 => Direction::Response,
                _ => return Ok(status::BAD_ARGUMENT),
            };
            let s = cx.data_mut();
            if s.http_context().is_none() {
                return Ok(status::BAD_ARGUMENT);
            }
            let context = s.effective;
            s.effects.push(Effect::Continue { context, direction });
            Ok(status::OK)
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_close_stream",
        |mut cx: Cx<'_>, _kind: u32| -> R {
            count(&mut cx, "proxy_close_stream");
            let s = cx.data_mut();
            if s.http_context().is_none() {
                return Ok(status::BAD_ARGUMENT);
            }
            let context = s.effective;
            s.effects.push(Effect::Close { context });
            Ok(status::OK)
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_send_local_response",
        |mut cx: Cx<'_>,
         code: u32,
         dp: u32,
         dl: u32,
         bp: u32,
         bl: u32,
         hp: u32,
         hl: u32,
         _grpc: i32|
         -> R {
            count(&mut cx, "proxy_send_local_response");
            let details = tri!(read_str(&mut cx, dp, dl));
            let body = tri!(read(&mut cx, bp, bl));
            let raw = tri!(read(&mut cx, hp, hl));
            let Some(headers) = decode_headers(&raw) else {
                return Ok(status::BAD_ARGUMENT);
            };
            let Some((data, filter)) = cx.data().http_context() else {
                return Ok(status::BAD_ARGUMENT);
            };
            {
                let mut data = lock(&data);
                // Envoy: only before response headers went downstream.
                if data.response_started || data.reset {
                    return Ok(status::BAD_ARGUMENT);
                }
                data.pending_local_reply = Some(LocalReply {
                    filter: Some(filter),
                    status: u16::try_from(code).unwrap_or(500),
                    details,
                    headers,
                    body,
                });
            }
            let s = cx.data_mut();
            let context = s.effective;
            s.effects.push(Effect::LocalReply { context });
            Ok(status::OK)
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_set_effective_context",
        |mut cx: Cx<'_>, context: u32| -> R {
            count(&mut cx, "proxy_set_effective_context");
            let s = cx.data_mut();
            if !s.contexts.contains_key(&context) {
                return Ok(status::BAD_ARGUMENT);
            }
            s.effective = context;
            Ok(status::OK)
        },
    )?;
    l.func_wrap(ENV, "proxy_done", |mut cx: Cx<'_>| -> R {
        count(&mut cx, "proxy_done");
        Ok(status::OK)
    })?;

    // Calls out
    l.func_wrap(
        ENV,
        "proxy_http_call",
        |mut cx: Cx<'_>,
         up: u32,
         ul: u32,
         hp: u32,
         hl: u32,
         bp: u32,
         bl: u32,
         tp: u32,
         tl: u32,
         timeout_ms: u32,
         token_out: u32|
         -> R {
            count(&mut cx, "proxy_http_call");
            let cluster = tri!(read_str(&mut cx, up, ul));
            let raw_headers = tri!(read(&mut cx, hp, hl));
            let body = tri!(read(&mut cx, bp, bl));
            let raw_trailers = tri!(read(&mut cx, tp, tl));
            let (Some(headers), Some(trailers)) =
                (decode_headers(&raw_headers), decode_headers(&raw_trailers))
            else {
                return Ok(status::BAD_ARGUMENT);
            };
            // Envoy refuses an unknown cluster and a request without the pseudo-headers.
            let known = lock(&cx.data().http_clusters).contains(&cluster);
            let has = |n: &str| headers.iter().any(|(k, _)| k == n);
            if !known || !has(":method") || !has(":path") || !has(":authority") {
                return Ok(status::BAD_ARGUMENT);
            }
            let s = cx.data_mut();
            let token = s.token();
            let context = s.effective;
            s.effects.push(Effect::HttpCall {
                context,
                token,
                request: HttpCallRequest {
                    cluster,
                    headers,
                    body,
                    trailers,
                    timeout_ms,
                },
            });
            tri!(write(&mut cx, token_out, &token.to_le_bytes()));
            Ok(status::OK)
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_call_foreign_function",
        |mut cx: Cx<'_>, np: u32, nl: u32, _ap: u32, _al: u32, _rp: u32, rs: u32| -> R {
            count(&mut cx, "proxy_call_foreign_function");
            let name = tri!(read_str(&mut cx, np, nl));
            if name != "clear_route_cache" {
                return Ok(status::NOT_FOUND);
            }
            let Some((data, filter)) = cx.data().http_context() else {
                return Ok(status::BAD_ARGUMENT);
            };
            if let Some(n) = lock(&data).route_cache_cleared.get_mut(filter) {
                *n += 1;
            }
            tri!(write(&mut cx, rs, &0u32.to_le_bytes()));
            Ok(status::OK)
        },
    )?;

    // Metrics
    l.func_wrap(
        ENV,
        "proxy_define_metric",
        |mut cx: Cx<'_>, kind: u32, np: u32, nl: u32, id_out: u32| -> R {
            count(&mut cx, "proxy_define_metric");
            let name = tri!(read_str(&mut cx, np, nl));
            let kind = match kind {
                0 => MetricKind::Counter,
                1 => MetricKind::Gauge,
                2 => MetricKind::Histogram,
                _ => return Ok(status::BAD_ARGUMENT),
            };
            let id = match cx.data().services.metrics.define(kind, &name) {
                Ok(id) => id,
                Err(s) => return Ok(s),
            };
            tri!(write(&mut cx, id_out, &id.to_le_bytes()));
            Ok(status::OK)
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_increment_metric",
        |mut cx: Cx<'_>, id: u32, delta: i64| -> R {
            count(&mut cx, "proxy_increment_metric");
            Ok(cx.data().services.metrics.increment(id, delta))
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_record_metric",
        |mut cx: Cx<'_>, id: u32, value: u64| -> R {
            count(&mut cx, "proxy_record_metric");
            Ok(cx.data().services.metrics.record(id, value))
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_get_metric",
        |mut cx: Cx<'_>, id: u32, out: u32| -> R {
            count(&mut cx, "proxy_get_metric");
            match cx.data().services.metrics.get(id) {
                Ok(v) => {
                    tri!(write(&mut cx, out, &v.to_le_bytes()));
                    Ok(status::OK)
                }
                Err(s) => Ok(s),
            }
        },
    )?;

    // Higress's Redis extension
    l.func_wrap(
        ENV,
        "proxy_redis_init",
        |mut cx: Cx<'_>,
         sp: u32,
         sl: u32,
         up: u32,
         ul: u32,
         pp: u32,
         pl: u32,
         timeout_ms: u32|
         -> R {
            count(&mut cx, "proxy_redis_init");
            let service = tri!(read_str(&mut cx, sp, sl));
            let _user = tri!(read(&mut cx, up, ul));
            let _password = tri!(read(&mut cx, pp, pl));
            if !cx.data().redis.knows(&service) {
                return Ok(status::BAD_ARGUMENT);
            }
            cx.data_mut().redis_services.insert(service, timeout_ms);
            Ok(status::OK)
        },
    )?;
    l.func_wrap(
        ENV,
        "proxy_redis_call",
        |mut cx: Cx<'_>, sp: u32, sl: u32, qp: u32, ql: u32, token_out: u32| -> R {
            count(&mut cx, "proxy_redis_call");
            let service = tri!(read_str(&mut cx, sp, sl));
            let query = tri!(read(&mut cx, qp, ql));
            let Some(&timeout_ms) = cx.data().redis_services.get(&service) else {
                return Ok(status::BAD_ARGUMENT);
            };
            let s = cx.data_mut();
            let token = s.token();
            s.effects.push(Effect::RedisCall {
                token,
                service,
                query,
                timeout_ms,
            });
            tri!(write(&mut cx, token_out, &token.to_le_bytes()));
            Ok(status::OK)
        },
    )?;

    // gRPC: linked because the SDK imports it; calling it fails the test.
    for name in [
        "proxy_grpc_call",
        "proxy_grpc_stream",
        "proxy_grpc_send",
        "proxy_grpc_cancel",
        "proxy_grpc_close",
        "proxy_get_status",
    ] {
        let ty = grpc_type(name);
        l.func_new(ENV, name, ty, move |_cx, _params, _results| {
            bail!("{name} is not implemented by the harness (no plugin here uses gRPC)")
        })?;
    }
    Ok(())
}

fn grpc_type(name: &str) -> wasmtime::FuncType {
    use wasmtime::ValType::I32;
    let params = match name {
        "proxy_grpc_call" => vec![I32; 12],
        "proxy_grpc_stream" => vec![I32; 9],
        "proxy_grpc_send" => vec![I32; 4],
        "proxy_get_status" => vec![I32; 3],
        _ => vec![I32; 1],
    };
    wasmtime::FuncType::new(super::engine::engine(), params, [I32])
}

/// A header map of the effective HTTP context, or of the HTTP call response (6, 7).
fn map_of(s: &HostState, map: u32) -> Option<Headers> {
    match map {
        6 => s.http_call_response.as_ref().map(|(h, _, _)| h.clone()),
        7 => s.http_call_response.as_ref().map(|(_, _, t)| t.clone()),
        _ => {
            let (data, _) = s.http_context()?;
            let data = lock(&data);
            data.map(map).cloned()
        }
    }
}

/// Changes a header map of the effective HTTP context if its filter may now (Envoy: only
/// while the filter holds those headers), else `BadArgument`.
fn with_map(s: &HostState, map: u32, f: impl FnOnce(&mut Headers)) -> R {
    let Some((data, filter)) = s.http_context() else {
        return Ok(status::BAD_ARGUMENT);
    };
    let mut data = lock(&data);
    match data.map_mut(map, filter) {
        Some(headers) => {
            f(headers);
            Ok(status::OK)
        }
        None => Ok(status::BAD_ARGUMENT),
    }
}

/// Is `context` an HTTP context of this VM?
pub fn is_http(s: &HostState, context: u32) -> bool {
    matches!(s.contexts.get(&context), Some(ContextKind::Http { .. }))
}
