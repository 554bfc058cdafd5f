//! The chain of row C in the wasmtime harness, on the bench's own workloads: per plugin, the
//! wasm fuel, host calls and bytes per request, and each VM's linear memory once warm. The
//! five listener filters run as one chain with gateway.yaml's configurations (limits raised
//! as in row C); the model router's upstream filter runs apart on the request as the chain
//! forwarded it, with the chain's filter state. Every upstream answer is the real mock
//! upstream's, fetched over HTTP; a stream reaches the filters one SSE event per body
//! callback (the most callbacks a stream can cost), or, with `BENCH_STREAM_FRAME=BYTES`, in
//! frames of at least that many bytes cut at event ends (as Envoy hands a fast stream to the
//! filters: in reads of up to 16 KiB), so the fuel per event is the plugins' per-event code
//! rather than their per-callback code. A translated workload ([`Workload::translated`])
//! leaves the chain already in Anthropic's shape (the router's listener role translates for
//! the first deployment), so the mock answers it at `/v1/messages`, and its upstream filter
//! runs on the `anthropic` cluster.

use super::config::WasmFilter;
use super::wrk::Workload;
use crate::harness::stream::Property;
use crate::harness::{cost, FilterSpec, Fleet, Request, Response, Totals};
use std::cell::RefCell;

/// Per-request cost of one plugin (a filter, by `root_id`) on one workload.
#[derive(Debug, Clone)]
pub struct PluginCost {
    /// The filter's `root_id`.
    pub root_id: String,
    /// Totals over all measured requests.
    pub totals: Totals,
    /// Requests measured.
    pub requests: u64,
}

impl PluginCost {
    /// Fuel per request.
    pub fn fuel(&self) -> u64 {
        self.totals.fuel / self.requests.max(1)
    }
    /// Host calls per request.
    pub fn host_calls(&self) -> f64 {
        self.totals.host_calls as f64 / self.requests.max(1) as f64
    }
    /// Callbacks per request.
    pub fn callbacks(&self) -> f64 {
        self.totals.callbacks as f64 / self.requests.max(1) as f64
    }
    /// Bytes across the boundary (in + out) per request.
    pub fn bytes(&self) -> u64 {
        (self.totals.bytes_in + self.totals.bytes_out) / self.requests.max(1)
    }
}

/// The chain's cost on one workload.
#[derive(Debug, Clone)]
pub struct WorkloadCost {
    /// The workload.
    pub workload: Workload,
    /// Per filter, in chain order (the upstream filter last).
    pub plugins: Vec<PluginCost>,
}

/// Everything measured.
#[derive(Debug, Clone)]
pub struct ChainCost {
    /// Per workload.
    pub workloads: Vec<WorkloadCost>,
    /// Per VM (`root_id`): linear memory after every workload ran (warm), bytes.
    pub memory: Vec<(String, u64)>,
}

fn spec(filter: &WasmFilter) -> crate::Result<FilterSpec> {
    let plugin = filter.file.trim_end_matches(".wasm");
    let mut spec = FilterSpec::plugin(plugin, &filter.config)?
        .root_id(&filter.root_id)
        .allow_on_headers_stop_iteration(filter.allow_on_headers_stop_iteration);
    spec.name = filter.root_id.clone();
    Ok(spec)
}

/// The `BENCH_STREAM_FRAME` frame size in bytes, if set (see the module documentation).
pub fn stream_frame() -> Option<usize> {
    std::env::var("BENCH_STREAM_FRAME")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&bytes: &usize| bytes > 0)
}

/// Offsets of the ends of each SSE event (`\n\n`) but the last.
fn event_ends(body: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut i = 0;
    while i + 1 < body.len() {
        if body[i] == b'\n' && body[i + 1] == b'\n' {
            out.push(i + 2);
            i += 2;
        } else {
            i += 1;
        }
    }
    out.retain(|&end| end < body.len());
    out
}

/// Of `ends`, the first end at least `frame` bytes after the previous kept one, and so on.
fn frames(ends: &[usize], frame: usize) -> Vec<usize> {
    let mut kept = Vec::new();
    let mut last = 0;
    for &end in ends {
        if end - last >= frame {
            kept.push(end);
            last = end;
        }
    }
    kept
}

/// Sends what reached the upstream to the mock; its answer as the harness feeds it.
fn ask_mock(
    rt: &tokio::runtime::Runtime,
    mock_url: &str,
    headers: &[(String, Vec<u8>)],
    body: &[u8],
) -> crate::Result<Response> {
    let path = headers
        .iter()
        .find(|(n, _)| n == ":path")
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        .unwrap_or_else(|| "/v1/chat/completions".into());
    let mut request = crate::http::post(format!("{mock_url}{path}")).body(body.to_vec());
    for (name, value) in headers {
        if name.starts_with(':') || name == "content-length" || name == "host" {
            continue;
        }
        request = request.header(name, &String::from_utf8_lossy(value));
    }
    let answer = rt.block_on(request.send())?;
    let mut response = Response::status(answer.status);
    for (name, value) in &answer.headers {
        if name != "transfer-encoding" && name != "date" {
            response = response.header(name, value);
        }
    }
    let streams = answer
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/event-stream"));
    let response = response.body(&answer.body);
    Ok(if streams {
        let ends = event_ends(&answer.body);
        match stream_frame() {
            Some(frame) => response.split_at(&frames(&ends, frame)),
            None => response.split_at(&ends),
        }
    } else {
        response
    })
}

/// Runs `runs` requests of each workload through the chain (after one warm-up each).
pub fn measure(
    filters: &[WasmFilter],
    workloads: &[Workload],
    key: &str,
    mock_url: &str,
    runs: u64,
) -> crate::Result<ChainCost> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut chain = Fleet::builder();
    let mut listener_roots = Vec::new();
    let mut upstream_filter = None;
    for filter in filters {
        if filter.upstream {
            upstream_filter = Some(filter);
        } else {
            chain = chain.filter(spec(filter)?);
            listener_roots.push(filter.root_id.clone());
        }
    }
    let chain = chain.buffer_limit(10 << 20).build()?;
    let upstream = match upstream_filter {
        Some(f) => Some((f.root_id.clone(), Fleet::single(spec(f)?)?)),
        None => None,
    };
    let mut out = Vec::new();
    let mut n = 0u64;
    for workload in workloads {
        let body = workload.body(workload.model("fast"));
        let mut costs = Vec::new();
        for run in 0..=runs {
            n += 1;
            let mut request = Request::post("/v1/chat/completions")
                .property("xds.route_name", "llm-api")
                .property("source.address", "127.0.0.1:40000")
                .header("x-request-id", &format!("bench-{n}"));
            for (name, value) in workload.headers(key, true) {
                request = request.header(&name, &value);
            }
            let request = request
                .body(body.as_bytes())
                .split_at(&crate::workloads::offsets(
                    body.len(),
                    crate::workloads::CHUNK,
                ));
            let seen = RefCell::new(None);
            let ex = chain.exchange(0, 0, &request, |up| {
                let headers = up.headers.clone().unwrap_or_default();
                let answer = ask_mock(&rt, mock_url, &headers, &up.body)
                    .unwrap_or_else(|e| Response::status(502).body(e.as_bytes()));
                *seen.borrow_mut() = Some((headers, up.body.clone(), answer.clone()));
                answer
            })?;
            if ex.status() != 200 {
                return Err(format!(
                    "harness chain, {}: answered {}: {}",
                    workload.name,
                    ex.status(),
                    ex.text()
                ));
            }
            if run > 0 {
                costs.extend(ex.cost.iter().cloned());
            }
            let (Some((root, fleet)), Some((headers, sent, answer))) =
                (&upstream, seen.into_inner())
            else {
                continue;
            };
            // the attempt as the provider cluster's upstream filter sees it, on the cluster the
            // route's matcher picks from the first slot (`anthropic` for a translated request)
            let cluster = ex
                .filter_state
                .get("wasm.llm_try_0")
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .unwrap_or_else(|| "openai".into());
            let mut attempt = Request {
                headers,
                chunks: Vec::new(),
                properties: Vec::new(),
            }
            .header("x-envoy-attempt-count", "1")
            .property("xds.cluster_name", cluster.as_str())
            .body(&sent);
            attempt.headers.retain(|(n, _)| n != "content-length");
            attempt = attempt.header("content-length", &sent.len().to_string());
            for (key, value) in &ex.filter_state {
                if let Some(path) = key.strip_prefix("wasm.") {
                    attempt
                        .properties
                        .push((path.to_string(), Property::Bytes(value.clone())));
                }
            }
            let up = fleet.exchange(0, 0, &attempt, |_| answer.clone())?;
            if up.local_reply.is_some() {
                return Err(format!("harness, {root}: refused: {}", up.text()));
            }
            if run > 0 {
                costs.extend(up.cost.iter().cloned());
            }
        }
        let plugins = cost::by_plugin(&costs)
            .into_iter()
            .map(|(root_id, totals)| PluginCost {
                root_id,
                totals,
                requests: runs,
            })
            .collect();
        out.push(WorkloadCost {
            workload: *workload,
            plugins,
        });
    }
    let mut memory = Vec::new();
    for (i, root) in listener_roots.iter().enumerate() {
        memory.push((root.clone(), chain.memory_bytes(0, 0, i)?));
    }
    if let Some((root, fleet)) = &upstream {
        memory.push((root.clone(), fleet.memory_bytes(0, 0, 0)?));
    }
    Ok(ChainCost {
        workloads: out,
        memory,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_end_at_blank_lines() {
        let body = b"data: a\n\ndata: b\n\ndata: [DONE]\n\n";
        assert_eq!(event_ends(body), [9, 18]);
        assert!(event_ends(b"{}").is_empty());
        assert_eq!(frames(&[9, 18, 27, 36], 10), [18, 36]);
        assert_eq!(frames(&[9, 18], 1), [9, 18]);
        assert!(frames(&[9, 18], 100).is_empty());
    }
}
