//! One stream through a chain of filters, with Envoy's filter-manager semantics:
//!
//! - request callbacks in chain order, response callbacks in reverse;
//! - `Pause` from a headers callback holds the headers; it is `StopAllIterationAndWatermark`
//!   (no body callbacks until the filter resumes; then it gets the whole buffered body) or,
//!   where the host says so ([`super::host::Host::headers_pause_is_stop_iteration`]: Envoy
//!   with `allow_on_headers_stop_iteration`, Higress for ABI `0_2_100` modules), a plain
//!   `StopIteration` (body callbacks still arrive; `Continue` from one releases the headers
//!   and the buffered body);
//! - `Pause` from a body callback buffers (`StopIterationAndBuffer`): the next callback sees
//!   the cumulative body; over the buffer limit the request gets 413 and the response 500 (or
//!   a reset once its headers went downstream). Body held behind paused headers
//!   (`StopAllIterationAndWatermark`) meets backpressure instead, which is not modelled: it
//!   just buffers;
//! - a filter may change a header map only while it holds it (inside its headers callback,
//!   or while paused there);
//! - a local reply aborts the request path; its response passes the response callbacks of
//!   every filter whose context exists (those that saw the request headers), last first.
//!   A local reply asked for while the response is already being encoded goes downstream
//!   directly.

use super::services::lock;
use super::state::VmLocation;
use super::stream::{Direction, Headers, LocalReply, StreamData};
use std::sync::{Arc, Mutex};

/// What a stream asks of the fleet that runs it ([`super::fleet`]): its filters' VMs. The
/// stream needs nothing else of the fleet, and the fleet drives the stream.
pub(crate) trait Vms {
    /// Calls export `name` of the VM at `loc`; its return value (its effects wait in the
    /// fleet's deferred queue).
    fn call(
        &self,
        loc: VmLocation,
        name: &'static str,
        args: &[u32],
        stream: Option<u64>,
    ) -> crate::Result<Option<u32>>;

    /// Creates the HTTP context of filter `filter` of stream `stream` in the VM at `loc`.
    fn create_context(
        &self,
        loc: VmLocation,
        data: Arc<Mutex<StreamData>>,
        filter: usize,
        stream: u64,
    ) -> crate::Result<u32>;

    /// Queues the local reply of stream `stream`: sent once the current callback returns.
    fn defer_local_reply(&self, stream: u64);
}

/// Where the headers of one direction are at one filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    NotReached,
    /// Stopped in the headers callback; `all`: StopAllIteration (no body callbacks).
    Stopped {
        all: bool,
    },
    Continued,
}

#[derive(Debug, Clone)]
struct Dir {
    held: Vec<Held>,
    headers_eos: Vec<bool>,
    /// The buffered body at this filter includes the end of stream.
    eos_buffered: Vec<bool>,
    started: bool,
}

impl Dir {
    fn new(n: usize) -> Dir {
        Dir {
            held: vec![Held::NotReached; n],
            headers_eos: vec![false; n],
            eos_buffered: vec![false; n],
            started: false,
        }
    }
}

/// What reached the upstream (after the last filter).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Upstream {
    /// Request headers as they left the chain.
    pub headers: Option<Headers>,
    /// Request body bytes that left the chain.
    pub body: Vec<u8>,
    /// The request ended.
    pub end: bool,
    /// The upstream request was reset (a local reply after the headers had gone).
    pub reset: bool,
}

/// What reached the client (after the first filter).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Downstream {
    /// Response headers as they left the chain.
    pub headers: Option<Headers>,
    /// Response body bytes that left the chain.
    pub body: Vec<u8>,
    /// The response ended.
    pub end: bool,
    /// The stream was reset instead.
    pub reset: bool,
}

/// The chain state of one stream.
#[derive(Debug)]
pub struct StreamCore {
    pub(crate) id: u64,
    pub(crate) instance: usize,
    pub(crate) worker: usize,
    pub(crate) data: Arc<Mutex<StreamData>>,
    pub(crate) contexts: Vec<Option<u32>>,
    /// Per filter: `Pause` from a headers callback is `StopIteration` (else StopAll).
    allow_stop: Vec<bool>,
    req: Dir,
    resp: Dir,
    pub(crate) upstream: Upstream,
    pub(crate) downstream: Downstream,
    pub(crate) local_reply: Option<LocalReply>,
    pub(crate) finished: bool,
    buffer_limit: usize,
}

fn callback(dir: Direction, headers: bool) -> &'static str {
    match (dir, headers) {
        (Direction::Request, true) => "proxy_on_request_headers",
        (Direction::Request, false) => "proxy_on_request_body",
        (Direction::Response, true) => "proxy_on_response_headers",
        (Direction::Response, false) => "proxy_on_response_body",
    }
}

impl StreamCore {
    pub(crate) fn new(
        id: u64,
        instance: usize,
        worker: usize,
        data: Arc<Mutex<StreamData>>,
        allow_stop: Vec<bool>,
        buffer_limit: usize,
    ) -> StreamCore {
        let n = allow_stop.len();
        StreamCore {
            id,
            instance,
            worker,
            data,
            contexts: vec![None; n],
            allow_stop,
            req: Dir::new(n),
            resp: Dir::new(n),
            upstream: Upstream::default(),
            downstream: Downstream::default(),
            local_reply: None,
            finished: false,
            buffer_limit,
        }
    }

    fn n(&self) -> usize {
        self.contexts.len()
    }

    fn loc(&self, filter: usize) -> VmLocation {
        VmLocation {
            instance: self.instance,
            worker: self.worker,
            filter,
        }
    }

    /// The filters a direction passes, in order.
    fn order(&self, dir: Direction) -> Vec<usize> {
        match dir {
            Direction::Request => (0..self.n()).collect(),
            // Envoy 1.36+: a wasm filter whose context was never created (it did not see
            // the request headers) lets response callbacks pass without calling the VM.
            Direction::Response => (0..self.n())
                .rev()
                .filter(|f| self.contexts[*f].is_some())
                .collect(),
        }
    }

    fn dir(&mut self, dir: Direction) -> &mut Dir {
        match dir {
            Direction::Request => &mut self.req,
            Direction::Response => &mut self.resp,
        }
    }

    /// True when iteration must stop: a local reply is waiting, or the stream was reset.
    fn interrupted(&self) -> bool {
        let data = lock(&self.data);
        data.pending_local_reply.is_some() || data.reset
    }

    fn set_writable(&self, dir: Direction, filter: usize, writable: bool) {
        let mut data = lock(&self.data);
        if let Some(a) = data.access.get_mut(filter) {
            match dir {
                Direction::Request => a.request_headers_writable = writable,
                Direction::Response => a.response_headers_writable = writable,
            }
        }
    }

    fn body(&self, dir: Direction, filter: usize) -> Option<Vec<u8>> {
        let data = lock(&self.data);
        let a = data.access.get(filter)?;
        match dir {
            Direction::Request => a.request_body.clone(),
            Direction::Response => a.response_body.clone(),
        }
    }

    fn set_body(&self, dir: Direction, filter: usize, body: Option<Vec<u8>>) {
        let mut data = lock(&self.data);
        if let Some(a) = data.access.get_mut(filter) {
            match dir {
                Direction::Request => a.request_body = body,
                Direction::Response => a.response_body = body,
            }
        }
    }

    fn header_count(&self, dir: Direction) -> u32 {
        let data = lock(&self.data);
        let map = match dir {
            Direction::Request => &data.request_headers,
            Direction::Response => &data.response_headers,
        };
        map.as_ref().map_or(0, |h| h.len() as u32)
    }

    /// Creates the filter's HTTP context in its VM if it has none yet.
    fn ensure_context(&mut self, fleet: &dyn Vms, filter: usize) -> crate::Result<u32> {
        if let Some(ctx) = self.contexts[filter] {
            return Ok(ctx);
        }
        let ctx = fleet.create_context(self.loc(filter), self.data.clone(), filter, self.id)?;
        self.contexts[filter] = Some(ctx);
        Ok(ctx)
    }

    /// Headers arrive at position `pos` of `dir`'s order.
    pub(crate) fn headers_from(
        &mut self,
        fleet: &dyn Vms,
        dir: Direction,
        pos: usize,
        eos: bool,
    ) -> crate::Result<()> {
        self.dir(dir).started = true;
        let order = self.order(dir);
        for &f in order.iter().skip(pos) {
            let ctx = self.ensure_context(fleet, f)?;
            self.set_writable(dir, f, true);
            self.dir(dir).headers_eos[f] = eos;
            let count = self.header_count(dir);
            let action = fleet.call(
                self.loc(f),
                callback(dir, true),
                &[ctx, count, u32::from(eos)],
                Some(self.id),
            )?;
            if action == Some(0) {
                self.dir(dir).held[f] = Held::Continued;
                self.set_writable(dir, f, false);
            } else {
                let all = !self.allow_stop[f];
                self.dir(dir).held[f] = Held::Stopped { all };
                return Ok(());
            }
            if self.interrupted() {
                return Ok(());
            }
        }
        match dir {
            Direction::Request => {
                self.upstream.headers = lock(&self.data).request_headers.clone();
                self.upstream.end = eos;
            }
            Direction::Response => {
                self.downstream.headers = lock(&self.data).response_headers.clone();
                self.downstream.end = eos;
                lock(&self.data).response_started = true;
            }
        }
        Ok(())
    }

    /// A body chunk arrives at position `pos` of `dir`'s order.
    pub(crate) fn data_from(
        &mut self,
        fleet: &dyn Vms,
        dir: Direction,
        pos: usize,
        chunk: Vec<u8>,
        eos: bool,
    ) -> crate::Result<()> {
        let order = self.order(dir);
        let mut chunk = chunk;
        for (q, &f) in order.iter().enumerate().skip(pos) {
            let held = self.dir(dir).held[f];
            let mut body = self.body(dir, f).unwrap_or_default();
            body.extend_from_slice(&chunk);
            match held {
                Held::NotReached => {
                    return Err(format!(
                        "stream {}: body before headers at filter {f}",
                        self.id
                    ))
                }
                Held::Stopped { all: true } => {
                    // StopAllIterationAndWatermark: over the limit Envoy applies backpressure
                    // to the client (no 413); the harness just keeps buffering
                    self.set_body(dir, f, Some(body));
                    self.dir(dir).eos_buffered[f] |= eos;
                    return Ok(());
                }
                Held::Stopped { all: false } | Held::Continued => {
                    if body.is_empty() && !eos {
                        return Ok(());
                    }
                    let size = body.len() as u32;
                    self.set_body(dir, f, Some(body));
                    let ctx = self.contexts[f].unwrap_or(0);
                    let action = fleet.call(
                        self.loc(f),
                        callback(dir, false),
                        &[ctx, size, u32::from(eos)],
                        Some(self.id),
                    )?;
                    if self.interrupted() {
                        return Ok(());
                    }
                    if action != Some(0) {
                        self.dir(dir).eos_buffered[f] = eos;
                        return self.check_limit(fleet, dir, f);
                    }
                    chunk = self.body(dir, f).unwrap_or_default();
                    self.set_body(dir, f, None);
                    self.dir(dir).eos_buffered[f] = false;
                    if held != Held::Continued {
                        // Continue from the body releases the held headers first.
                        self.dir(dir).held[f] = Held::Continued;
                        self.set_writable(dir, f, false);
                        let headers_eos = self.dir(dir).headers_eos[f];
                        self.headers_from(fleet, dir, q + 1, headers_eos)?;
                        if self.interrupted() {
                            return Ok(());
                        }
                        return self.data_from(fleet, dir, q + 1, chunk, eos);
                    }
                }
            }
        }
        match dir {
            Direction::Request => {
                self.upstream.body.extend_from_slice(&chunk);
                self.upstream.end |= eos;
            }
            Direction::Response => {
                self.downstream.body.extend_from_slice(&chunk);
                self.downstream.end |= eos;
            }
        }
        Ok(())
    }

    fn check_limit(&mut self, fleet: &dyn Vms, dir: Direction, filter: usize) -> crate::Result<()> {
        let size = self.body(dir, filter).map_or(0, |b| b.len());
        if size <= self.buffer_limit {
            return Ok(());
        }
        let mut data = lock(&self.data);
        match dir {
            Direction::Request => {
                data.pending_local_reply = Some(LocalReply {
                    filter: None,
                    status: 413,
                    details: "request_payload_too_large".into(),
                    headers: Vec::new(),
                    body: b"Payload Too Large".to_vec(),
                });
            }
            Direction::Response if data.response_started => {
                data.reset = true;
                self.downstream.reset = true;
                return Ok(());
            }
            Direction::Response => {
                data.pending_local_reply = Some(LocalReply {
                    filter: None,
                    status: 500,
                    details: "response_payload_too_large".into(),
                    headers: Vec::new(),
                    body: b"Internal Server Error".to_vec(),
                });
            }
        }
        drop(data);
        fleet.defer_local_reply(self.id);
        Ok(())
    }

    /// `proxy_continue_stream` by `filter`.
    pub(crate) fn resume(
        &mut self,
        fleet: &dyn Vms,
        dir: Direction,
        filter: usize,
    ) -> crate::Result<()> {
        if self.interrupted() || (dir == Direction::Request && self.local_reply.is_some()) {
            return Ok(());
        }
        let order = self.order(dir);
        let Some(pos) = order.iter().position(|f| *f == filter) else {
            return Ok(());
        };
        let held = self.dir(dir).held[filter];
        let buffered = self.body(dir, filter);
        let eos = self.dir(dir).eos_buffered[filter];
        match held {
            Held::NotReached => Ok(()),
            Held::Stopped { all } => {
                self.dir(dir).held[filter] = Held::Continued;
                self.set_writable(dir, filter, false);
                let headers_eos = self.dir(dir).headers_eos[filter];
                self.headers_from(fleet, dir, pos + 1, headers_eos)?;
                if self.interrupted() || (buffered.is_none() && !eos) {
                    return Ok(());
                }
                self.set_body(dir, filter, None);
                self.dir(dir).eos_buffered[filter] = false;
                let chunk = buffered.unwrap_or_default();
                // StopAll: the filter itself has not seen the body yet.
                let from = if all { pos } else { pos + 1 };
                self.data_from(fleet, dir, from, chunk, eos)
            }
            Held::Continued => {
                if buffered.is_none() && !eos {
                    return Ok(());
                }
                self.set_body(dir, filter, None);
                self.dir(dir).eos_buffered[filter] = false;
                self.data_from(fleet, dir, pos + 1, buffered.unwrap_or_default(), eos)
            }
        }
    }

    /// Carries out the pending local reply.
    pub(crate) fn local_reply(&mut self, fleet: &dyn Vms) -> crate::Result<()> {
        let Some(reply) = lock(&self.data).pending_local_reply.take() else {
            return Ok(());
        };
        if lock(&self.data).response_started {
            return Ok(());
        }
        let mut headers: Headers = vec![(":status".into(), reply.status.to_string().into_bytes())];
        headers.extend(reply.headers.iter().cloned());
        if !reply.body.is_empty() {
            if !headers.iter().any(|(n, _)| n == "content-type") {
                headers.push(("content-type".into(), b"text/plain".to_vec()));
            }
            headers.push((
                "content-length".into(),
                reply.body.len().to_string().into_bytes(),
            ));
        }
        self.local_reply = Some(reply.clone());
        lock(&self.data).response_code_details = Some(reply.details.clone());
        if self.upstream.headers.is_some() && !self.upstream.end {
            self.upstream.reset = true;
        }
        if self.resp.started {
            // asked for while encoding the response: straight downstream
            lock(&self.data).response_headers = Some(headers.clone());
            lock(&self.data).response_started = true;
            self.downstream = Downstream {
                headers: Some(headers),
                body: reply.body,
                end: true,
                reset: false,
            };
            return Ok(());
        }
        lock(&self.data).response_headers = Some(headers);
        let n = self.n();
        self.resp = Dir::new(n);
        let eos = reply.body.is_empty();
        self.headers_from(fleet, Direction::Response, 0, eos)?;
        if !eos && !self.interrupted() {
            self.data_from(fleet, Direction::Response, 0, reply.body, true)?;
        }
        Ok(())
    }

    /// The upstream's response headers arrive.
    pub(crate) fn response_headers(
        &mut self,
        fleet: &dyn Vms,
        headers: Headers,
        eos: bool,
    ) -> crate::Result<()> {
        if self.local_reply.is_some() || self.resp.started {
            return Err(format!(
                "stream {}: response headers after a local reply or a second time",
                self.id
            ));
        }
        if self.upstream.headers.is_none() {
            return Err(format!(
                "stream {}: the upstream has not received the request headers",
                self.id
            ));
        }
        {
            let mut data = lock(&self.data);
            data.response_headers = Some(headers);
            data.response_code_details = Some("via_upstream".into());
        }
        self.headers_from(fleet, Direction::Response, 0, eos)
    }

    /// A response body chunk arrives from the upstream.
    pub(crate) fn response_body(
        &mut self,
        fleet: &dyn Vms,
        chunk: Vec<u8>,
        eos: bool,
    ) -> crate::Result<()> {
        if self.local_reply.is_some() || lock(&self.data).reset {
            return Ok(()); // Envoy drops upstream data after a local reply or a reset
        }
        if !self.resp.started {
            return Err(format!("stream {}: response body before headers", self.id));
        }
        self.data_from(fleet, Direction::Response, 0, chunk, eos)
    }

    /// A request body chunk arrives from the client.
    pub(crate) fn request_body(
        &mut self,
        fleet: &dyn Vms,
        chunk: Vec<u8>,
        eos: bool,
    ) -> crate::Result<()> {
        if self.local_reply.is_some() || lock(&self.data).reset {
            return Ok(());
        }
        if !self.req.started {
            return Err(format!("stream {}: request body before headers", self.id));
        }
        self.data_from(fleet, Direction::Request, 0, chunk, eos)
    }

    /// Where each direction is held: `(filter, direction)` of filters that paused and hold
    /// headers or buffered body.
    pub(crate) fn paused(&self) -> Vec<(usize, Direction)> {
        let mut out = Vec::new();
        for (dir, d) in [
            (Direction::Request, &self.req),
            (Direction::Response, &self.resp),
        ] {
            for f in 0..self.n() {
                let body = self.body(dir, f).is_some() || d.eos_buffered[f];
                if matches!(d.held[f], Held::Stopped { .. }) || body {
                    out.push((f, dir));
                }
            }
        }
        out
    }
}
