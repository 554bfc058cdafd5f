//! A fleet: M gateway instances (each with its own shared data, queues and metrics) of N
//! worker VMs per filter, against Redis servers and HTTP clusters the test provides, under a
//! clock the test moves. Streams run on a chosen instance and worker and can be interleaved
//! freely; asynchronous work (HTTP calls, Redis calls, queue notifications) waits until the
//! test calls [`Fleet::pump`], which carries it out in the order it was asked for.

use super::chain::{Downstream, StreamCore, Upstream, Vms};
use super::cost::CallCost;
use super::filter::FilterSpec;
use super::host::{Abi, Host};
use super::redirect::InternalRedirect;
use super::redis::{RedisBridge, FAILURE_STATUS};
use super::services::{lock, Clock, InstanceServices};
use super::state::{Effect, HttpCallOutcome, HttpCallRequest, LogLine, VmLocation};
use super::stream::{
    headers_from, Direction, FilterAccess, Headers, LocalReply, Property, StreamData,
};
use super::vm::{Vm, VmEnv};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

/// Envoy's default `per_connection_buffer_limit_bytes`.
pub const DEFAULT_BUFFER_LIMIT: usize = 1 << 20;

type Handler = Box<dyn FnMut(&HttpCallRequest) -> HttpCallOutcome>;

/// Builds a [`Fleet`].
pub struct FleetBuilder {
    filters: Vec<FilterSpec>,
    instances: usize,
    workers: usize,
    buffer_limit: usize,
    log_level: u32,
    redis: Vec<(String, SocketAddr)>,
    clusters: Vec<(String, Handler)>,
    host: Host,
}

impl FleetBuilder {
    /// The gateway modelled ([`Host::Envoy`] by default): which ABI exports a module may
    /// have, what `Pause` from a headers callback means, which filters can be configured.
    pub fn host(mut self, host: Host) -> Self {
        self.host = host;
        self
    }

    /// Appends a filter to the chain.
    pub fn filter(mut self, spec: FilterSpec) -> Self {
        self.filters.push(spec);
        self
    }

    /// Gateway instances (separate shared data); default 1.
    pub fn instances(mut self, n: usize) -> Self {
        self.instances = n.max(1);
        self
    }

    /// Worker VMs per filter per instance; default 1.
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.max(1);
        self
    }

    /// Envoy's buffer limit (413 on requests, 500 on responses); default 1 MiB.
    pub fn buffer_limit(mut self, bytes: usize) -> Self {
        self.buffer_limit = bytes;
        self
    }

    /// What `proxy_get_log_level` reports (0 trace .. 5 critical); default 2 (info).
    pub fn log_level(mut self, level: u32) -> Self {
        self.log_level = level;
        self
    }

    /// Maps a Redis service name (as the plugin passes it) to a server.
    pub fn redis(mut self, service: &str, addr: SocketAddr) -> Self {
        self.redis.push((service.to_string(), addr));
        self
    }

    /// A cluster `dispatch_http_call` may address, answered by `handler` when pumped.
    pub fn http_cluster(
        mut self,
        cluster: &str,
        handler: impl FnMut(&HttpCallRequest) -> HttpCallOutcome + 'static,
    ) -> Self {
        self.clusters.push((cluster.to_string(), Box::new(handler)));
        self
    }

    /// Starts every VM (instances × workers × filters); a VM that refuses its configuration
    /// is an error with its log, and so is a filter or module the host refuses.
    pub fn build(self) -> crate::Result<Fleet> {
        for spec in &self.filters {
            self.host.check(spec)?;
        }
        let clock = Clock::default();
        let redis = Arc::new(RedisBridge::default());
        for (service, addr) in &self.redis {
            redis.map(service, *addr);
        }
        let http_clusters = Arc::new(Mutex::new(
            self.clusters
                .iter()
                .map(|(c, _)| c.clone())
                .collect::<HashSet<_>>(),
        ));
        let specs: Vec<Arc<FilterSpec>> = self.filters.into_iter().map(Arc::new).collect();
        let mut instances = Vec::new();
        for i in 0..self.instances {
            let env = VmEnv {
                services: Arc::new(InstanceServices::default()),
                clock: clock.clone(),
                redis: redis.clone(),
                http_clusters: http_clusters.clone(),
                log_level: self.log_level,
                host: self.host,
            };
            let mut workers = Vec::new();
            for w in 0..self.workers {
                let mut vms = Vec::new();
                for (f, spec) in specs.iter().enumerate() {
                    let location = VmLocation {
                        instance: i,
                        worker: w,
                        filter: f,
                    };
                    vms.push(RefCell::new(Vm::start(spec.clone(), location, &env)?));
                }
                workers.push(vms);
            }
            instances.push(InstanceRt {
                services: env.services.clone(),
                workers,
            });
        }
        // what a headers Pause means, per filter (the same module in every VM of a filter)
        let headers_stop_iteration = match instances.first().and_then(|i| i.workers.first()) {
            Some(vms) => vms
                .iter()
                .zip(&specs)
                .map(|(vm, spec)| {
                    self.host
                        .headers_pause_is_stop_iteration(spec, vm.borrow().abi())
                })
                .collect(),
            None => Vec::new(),
        };
        Ok(Fleet(Rc::new(FleetInner {
            host: self.host,
            headers_stop_iteration,
            specs,
            instances,
            clock,
            redis,
            http_clusters,
            handlers: RefCell::new(self.clusters.into_iter().collect()),
            buffer_limit: self.buffer_limit,
            deferred: RefCell::default(),
            pending: RefCell::default(),
            streams: RefCell::default(),
            contexts: RefCell::default(),
            next_stream: Cell::new(1),
        })))
    }
}

struct InstanceRt {
    services: Arc<InstanceServices>,
    workers: Vec<Vec<RefCell<Vm>>>,
}

enum Deferred {
    Effect(VmLocation, Effect),
    LocalReply(u64),
}

/// Asynchronous work waiting for [`Fleet::pump`].
#[derive(Debug, Clone)]
struct Work {
    loc: VmLocation,
    effect: Effect,
}

/// The fleet's state, shared by its [`Stream`]s.
pub struct FleetInner {
    host: Host,
    /// Per filter: `Pause` from a headers callback is `StopIteration` (else StopAll).
    headers_stop_iteration: Vec<bool>,
    specs: Vec<Arc<FilterSpec>>,
    instances: Vec<InstanceRt>,
    clock: Clock,
    redis: Arc<RedisBridge>,
    http_clusters: Arc<Mutex<HashSet<String>>>,
    handlers: RefCell<HashMap<String, Handler>>,
    buffer_limit: usize,
    deferred: RefCell<VecDeque<Deferred>>,
    pending: RefCell<VecDeque<Work>>,
    streams: RefCell<HashMap<u64, Rc<RefCell<StreamCore>>>>,
    contexts: RefCell<HashMap<(VmLocation, u32), u64>>,
    next_stream: Cell<u64>,
}

impl FleetInner {
    fn vm(&self, loc: VmLocation) -> crate::Result<&RefCell<Vm>> {
        self.instances
            .get(loc.instance)
            .and_then(|i| i.workers.get(loc.worker))
            .and_then(|w| w.get(loc.filter))
            .ok_or_else(|| format!("no VM at {loc:?}"))
    }

    fn stream_of(&self, loc: VmLocation, ctx: u32) -> Option<(Rc<RefCell<StreamCore>>, usize)> {
        let id = *self.contexts.borrow().get(&(loc, ctx))?;
        let core = self.streams.borrow().get(&id)?.clone();
        Some((core, loc.filter))
    }

    /// Carries out deferred effects until none is left (asynchronous work goes to pending).
    fn settle(&self) -> crate::Result<()> {
        loop {
            let next = self.deferred.borrow_mut().pop_front();
            let Some(next) = next else { return Ok(()) };
            match next {
                Deferred::LocalReply(id) => {
                    let core = self.streams.borrow().get(&id).cloned();
                    if let Some(core) = core {
                        core.borrow_mut().local_reply(self)?;
                    }
                }
                Deferred::Effect(loc, effect) => match effect {
                    Effect::Continue { context, direction } => {
                        if let Some((core, filter)) = self.stream_of(loc, context) {
                            core.borrow_mut().resume(self, direction, filter)?;
                        }
                    }
                    Effect::LocalReply { context } => {
                        if let Some((core, _)) = self.stream_of(loc, context) {
                            core.borrow_mut().local_reply(self)?;
                        }
                    }
                    Effect::Close { context } => {
                        if let Some((core, _)) = self.stream_of(loc, context) {
                            let mut core = core.borrow_mut();
                            lock(&core.data).reset = true;
                            core.downstream.reset = true;
                            if !core.upstream.end {
                                core.upstream.reset = true;
                            }
                        }
                    }
                    other => self
                        .pending
                        .borrow_mut()
                        .push_back(Work { loc, effect: other }),
                },
            }
        }
    }

    /// Carries out one piece of asynchronous work.
    fn execute(&self, work: Work) -> crate::Result<()> {
        let loc = work.loc;
        match work.effect {
            Effect::HttpCall {
                context,
                token,
                request,
            } => {
                // Envoy makes the call on the root context (proxy-wasm-cpp-host's `http_call`
                // takes `root_context()`), so it runs even if the stream that sent it is gone;
                // the answer goes to the VM, whose SDK hands it to the sending context or, that
                // context being gone, drops it.
                let vm = self.vm(loc)?;
                let alive = vm.borrow_mut().has_context(context);
                let stream = if alive {
                    self.contexts.borrow().get(&(loc, context)).copied()
                } else {
                    None
                };
                let outcome = {
                    let mut handlers = self.handlers.borrow_mut();
                    match handlers.get_mut(&request.cluster) {
                        Some(handler) => handler(&request),
                        None => HttpCallOutcome::Failure,
                    }
                };
                let (args, response) = match outcome {
                    HttpCallOutcome::Response {
                        headers,
                        body,
                        trailers,
                    } => (
                        [
                            context,
                            token,
                            headers.len() as u32,
                            body.len() as u32,
                            trailers.len() as u32,
                        ],
                        Some((headers, body, trailers)),
                    ),
                    HttpCallOutcome::Failure => ([context, token, 0, 0, 0], None),
                };
                vm.borrow_mut().set_http_call_response(response);
                let result = self.call(loc, "proxy_on_http_call_response", &args, stream);
                vm.borrow_mut().set_http_call_response(None);
                result.map(|_| ())
            }
            Effect::RedisCall {
                token,
                service,
                query,
                timeout_ms,
            } => {
                let (status, reply) = match self.redis.call(&service, &query, timeout_ms) {
                    Ok(reply) => (0, reply),
                    Err(_) => (FAILURE_STATUS, Vec::new()),
                };
                let vm = self.vm(loc)?;
                if !vm.borrow_mut().has_export("proxy_on_redis_call_response") {
                    return Err(format!(
                        "{}: called proxy_redis_call but exports no proxy_on_redis_call_response",
                        vm.borrow().spec().name
                    ));
                }
                let root = vm.borrow().root_context();
                let size = reply.len() as u32;
                vm.borrow_mut().set_redis_response(Some(reply));
                let result = self.call(
                    loc,
                    "proxy_on_redis_call_response",
                    &[root, token, status, size],
                    None,
                );
                vm.borrow_mut().set_redis_response(None);
                result.map(|_| ())
            }
            Effect::QueueReady { owner, queue } => {
                let owner_loc = VmLocation {
                    instance: loc.instance,
                    worker: owner.worker,
                    filter: owner.filter,
                };
                self.call(
                    owner_loc,
                    "proxy_on_queue_ready",
                    &[owner.root_context, queue],
                    None,
                )
                .map(|_| ())
            }
            Effect::Continue { .. } | Effect::Close { .. } | Effect::LocalReply { .. } => Ok(()),
        }
    }
}

impl Vms for FleetInner {
    fn call(
        &self,
        loc: VmLocation,
        name: &'static str,
        args: &[u32],
        stream: Option<u64>,
    ) -> crate::Result<Option<u32>> {
        let called = self.vm(loc)?.borrow_mut().call(name, args, stream)?;
        let mut deferred = self.deferred.borrow_mut();
        deferred.extend(called.effects.into_iter().map(|e| Deferred::Effect(loc, e)));
        Ok(called.value)
    }

    fn create_context(
        &self,
        loc: VmLocation,
        data: Arc<Mutex<StreamData>>,
        filter: usize,
        stream: u64,
    ) -> crate::Result<u32> {
        let (ctx, effects) = self
            .vm(loc)?
            .borrow_mut()
            .create_http_context(data, filter, stream)?;
        self.contexts.borrow_mut().insert((loc, ctx), stream);
        self.deferred
            .borrow_mut()
            .extend(effects.into_iter().map(|e| Deferred::Effect(loc, e)));
        Ok(ctx)
    }

    fn defer_local_reply(&self, stream: u64) {
        self.deferred
            .borrow_mut()
            .push_back(Deferred::LocalReply(stream));
    }
}

/// A fleet of plugin VMs. Cheap to clone (shared).
#[derive(Clone)]
pub struct Fleet(Rc<FleetInner>);

impl Fleet {
    /// A builder with one instance, one worker, no filters.
    pub fn builder() -> FleetBuilder {
        FleetBuilder {
            filters: Vec::new(),
            instances: 1,
            workers: 1,
            buffer_limit: DEFAULT_BUFFER_LIMIT,
            log_level: 2,
            redis: Vec::new(),
            clusters: Vec::new(),
            host: Host::Envoy,
        }
    }

    /// The gateway modelled.
    pub fn host(&self) -> Host {
        self.0.host
    }

    /// The ABI the host read from filter `filter`'s module (`None`: no such filter).
    pub fn abi(&self, filter: usize) -> Option<Abi> {
        let vms = self.0.instances.first()?.workers.first()?;
        Some(vms.get(filter)?.borrow().abi())
    }

    /// A fleet of one instance, one worker, one filter.
    pub fn single(spec: FilterSpec) -> crate::Result<Fleet> {
        Fleet::builder().filter(spec).build()
    }

    /// The clock.
    pub fn clock(&self) -> &Clock {
        &self.0.clock
    }

    /// The Redis services (remap one to simulate a move).
    pub fn redis(&self) -> &RedisBridge {
        &self.0.redis
    }

    /// Adds or replaces an HTTP cluster's handler.
    pub fn set_http_cluster(
        &self,
        cluster: &str,
        handler: impl FnMut(&HttpCallRequest) -> HttpCallOutcome + 'static,
    ) {
        lock(&self.0.http_clusters).insert(cluster.to_string());
        self.0
            .handlers
            .borrow_mut()
            .insert(cluster.to_string(), Box::new(handler));
    }

    /// The services (shared data, metrics, queues) of an instance.
    pub fn services(&self, instance: usize) -> &InstanceServices {
        &self.0.instances[instance].services
    }

    /// A counter's or gauge's value in an instance (`None`: never defined there).
    pub fn metric(&self, instance: usize, name: &str) -> Option<u64> {
        self.services(instance).metrics.value(name)
    }

    /// A counter's sum over every instance (0 if undefined everywhere).
    pub fn metric_sum(&self, name: &str) -> u64 {
        (0..self.0.instances.len())
            .filter_map(|i| self.metric(i, name))
            .sum()
    }

    /// Number of instances.
    pub fn instances(&self) -> usize {
        self.0.instances.len()
    }

    /// Number of workers per instance.
    pub fn workers(&self) -> usize {
        self.0.instances.first().map_or(0, |i| i.workers.len())
    }

    /// The log lines of one VM.
    pub fn logs(&self, instance: usize, worker: usize, filter: usize) -> Vec<LogLine> {
        let loc = VmLocation {
            instance,
            worker,
            filter,
        };
        self.0
            .vm(loc)
            .map(|vm| vm.borrow().logs().to_vec())
            .unwrap_or_default()
    }

    /// Every VM's log as text, each line prefixed with its plugin and location.
    pub fn log_text(&self) -> String {
        let mut out = String::new();
        for (i, inst) in self.0.instances.iter().enumerate() {
            for (w, vms) in inst.workers.iter().enumerate() {
                for vm in vms {
                    let vm = vm.borrow();
                    for line in vm.logs() {
                        out.push_str(&format!(
                            "{} i{i}w{w} [{}] {}\n",
                            vm.spec().name,
                            super::state::level_name(line.level),
                            line.message
                        ));
                    }
                }
            }
        }
        out
    }

    /// The cost of every callback so far, in the order they ran.
    pub fn costs(&self) -> Vec<CallCost> {
        let mut out = Vec::new();
        for inst in &self.0.instances {
            for vms in &inst.workers {
                for vm in vms {
                    out.extend(vm.borrow().costs.iter().cloned());
                }
            }
        }
        out.sort_by_key(|c| c.seq);
        out
    }

    /// The linear memory of the VM of `filter` on an instance's worker, in bytes.
    pub fn memory_bytes(
        &self,
        instance: usize,
        worker: usize,
        filter: usize,
    ) -> crate::Result<u64> {
        let loc = VmLocation {
            instance,
            worker,
            filter,
        };
        Ok(self.0.vm(loc)?.borrow_mut().memory_bytes())
    }

    /// Opens a stream on an instance's worker.
    pub fn stream(&self, instance: usize, worker: usize) -> crate::Result<Stream> {
        let inst = self
            .0
            .instances
            .get(instance)
            .ok_or_else(|| format!("no instance {instance}"))?;
        if worker >= inst.workers.len() {
            return Err(format!("no worker {worker} in instance {instance}"));
        }
        let id = self.0.next_stream.get();
        self.0.next_stream.set(id + 1);
        let n = self.0.specs.len();
        let data = StreamData {
            access: vec![FilterAccess::default(); n],
            route_cache_cleared: vec![0; n],
            plugin_names: self
                .0
                .specs
                .iter()
                .map(|s| (s.name.clone(), s.root_id.clone()))
                .collect(),
            properties: HashMap::from([
                (
                    "source.address".to_string(),
                    Property::from("10.0.0.1:40000"),
                ),
                ("source.port".to_string(), Property::Int(40000)),
                (
                    "destination.address".to_string(),
                    Property::from("10.0.0.2:8080"),
                ),
                ("destination.port".to_string(), Property::Int(8080)),
                ("connection.id".to_string(), Property::Int(id as i64)),
            ]),
            ..StreamData::default()
        };
        let core = StreamCore::new(
            id,
            instance,
            worker,
            Arc::new(Mutex::new(data)),
            self.0.headers_stop_iteration.clone(),
            self.0.buffer_limit,
        );
        let core = Rc::new(RefCell::new(core));
        self.0.streams.borrow_mut().insert(id, core.clone());
        Ok(Stream {
            fleet: self.clone(),
            core,
        })
    }

    /// Carries out waiting asynchronous work (HTTP calls, Redis calls, queue notifications)
    /// in the order it was asked for, and whatever that work causes, until none is left.
    /// Returns how many pieces of work ran.
    pub fn pump(&self) -> crate::Result<usize> {
        let mut done = 0;
        loop {
            self.0.settle()?;
            let next = self.0.pending.borrow_mut().pop_front();
            let Some(work) = next else { return Ok(done) };
            self.0.execute(work)?;
            done += 1;
            if done > 100_000 {
                return Err("pump: more than 100000 pieces of work; a plugin loops".into());
            }
        }
    }

    /// Carries out only the oldest piece of waiting work (and what it causes right away).
    pub fn pump_one(&self) -> crate::Result<bool> {
        self.0.settle()?;
        let next = self.0.pending.borrow_mut().pop_front();
        let Some(work) = next else { return Ok(false) };
        self.0.execute(work)?;
        self.0.settle()?;
        Ok(true)
    }

    /// Pieces of asynchronous work waiting.
    pub fn pending(&self) -> usize {
        self.0.pending.borrow().len()
    }

    /// Fires `proxy_on_tick` once on every VM that set a tick period (Envoy fires it per
    /// VM, so N workers tick N times).
    pub fn tick(&self) -> crate::Result<usize> {
        let mut fired = 0;
        for (i, inst) in self.0.instances.iter().enumerate() {
            for (w, vms) in inst.workers.iter().enumerate() {
                for (f, vm) in vms.iter().enumerate() {
                    let (period, root) = {
                        let vm = vm.borrow();
                        (vm.tick_period_ms(), vm.root_context())
                    };
                    if period > 0 {
                        let loc = VmLocation {
                            instance: i,
                            worker: w,
                            filter: f,
                        };
                        self.0.call(loc, "proxy_on_tick", &[root], None)?;
                        fired += 1;
                    }
                }
            }
        }
        self.0.settle()?;
        Ok(fired)
    }

    /// Runs one whole exchange on an instance's worker: the request (body in its chunks),
    /// waiting work pumped after each step, the `upstream` answering once the whole request
    /// reached it, the response fed back in its chunks, then the stream finished.
    pub fn exchange(
        &self,
        instance: usize,
        worker: usize,
        request: &Request,
        upstream: impl FnOnce(&Upstream) -> Response,
    ) -> crate::Result<Exchange> {
        let mut once = Some(upstream);
        let mut answer = |seen: &Upstream| match once.take() {
            Some(f) => f(seen),
            None => Response::status(500),
        };
        let (exchange, _) = self.pass(instance, worker, request, &mut answer, None)?;
        Ok(exchange)
    }

    /// Like [`Fleet::exchange`], with a route's `custom_response` redirect policy as Higress
    /// uses it for its AI-route fallback ([`InternalRedirect`]): when the upstream's status
    /// matches, the first stream ends and the whole chain runs again as a new stream on the
    /// headers as the filters left them, the original body and the policy's headers; up to
    /// `max_internal_redirects` times. `upstream` answers every pass; one [`Exchange`] per
    /// pass, the last one the client's.
    pub fn exchange_with_redirect(
        &self,
        instance: usize,
        worker: usize,
        request: &Request,
        policy: &InternalRedirect,
        mut upstream: impl FnMut(&Upstream) -> Response,
    ) -> crate::Result<Vec<Exchange>> {
        let mut passes = Vec::new();
        let mut request = request.clone();
        let original_properties = request.properties.clone();
        loop {
            let redirect =
                (passes.len() < policy.max_internal_redirects as usize).then_some(policy);
            let (exchange, next) =
                self.pass(instance, worker, &request, &mut upstream, redirect)?;
            passes.push(exchange);
            let Some(headers) = next else {
                return Ok(passes);
            };
            let mut properties = original_properties.clone();
            properties.extend(policy.properties.iter().cloned());
            request = Request {
                headers,
                chunks: request.chunks.clone(),
                properties,
            };
        }
    }

    /// One stream; with `redirect`, the next pass's request headers when the policy
    /// redirected it (the stream then ends at the response headers).
    fn pass(
        &self,
        instance: usize,
        worker: usize,
        request: &Request,
        upstream: &mut dyn FnMut(&Upstream) -> Response,
        redirect: Option<&InternalRedirect>,
    ) -> crate::Result<(Exchange, Option<Headers>)> {
        let stream = self.stream(instance, worker)?;
        for (path, value) in &request.properties {
            stream.set_property(path, value.clone());
        }
        let no_body = request.chunks.is_empty();
        stream.send_request_headers_raw(request.headers.clone(), no_body)?;
        self.pump()?;
        let last = request.chunks.len().saturating_sub(1);
        for (i, chunk) in request.chunks.iter().enumerate() {
            stream.send_request_body(chunk, i == last)?;
            self.pump()?;
        }
        let seen = stream.upstream();
        let mut next = None;
        if stream.local_reply().is_none() && !stream.downstream().reset {
            if !seen.end {
                return Err(format!(
                    "the request never reached the upstream completely; paused at {:?}\n{}",
                    stream.paused(),
                    self.log_text()
                ));
            }
            let response = upstream(&seen);
            let no_body = response.chunks.is_empty();
            stream.send_response_headers_raw(response.headers.clone(), no_body)?;
            self.pump()?;
            // custom_response sits first in the chain: it sees the response headers once
            // every wasm filter let them through
            let status = stream
                .downstream()
                .headers
                .as_ref()
                .and_then(|h| super::stream::header_value(h, ":status"))
                .and_then(|s| s.parse::<u16>().ok());
            if let (Some(policy), Some(status)) = (redirect, status) {
                let state = stream.filter_state_all();
                if policy.fires(status, |key| state.get(key).cloned()) {
                    let headers = stream.request_headers().unwrap_or_default();
                    next = Some(policy.next_headers(&headers, |key| state.get(key).cloned()));
                    // what the replaced stream's filters read at on_log
                    lock(&stream.data()).response_code_details = Some("internal_redirect".into());
                }
            }
            if next.is_none() {
                let last = response.chunks.len().saturating_sub(1);
                for (i, chunk) in response.chunks.iter().enumerate() {
                    stream.send_response_body(chunk, i == last)?;
                    self.pump()?;
                }
            }
        }
        let down = stream.downstream();
        if next.is_none() && !down.end && !down.reset {
            return Err(format!(
                "the response never reached the client completely; paused at {:?}\n{}",
                stream.paused(),
                self.log_text()
            ));
        }
        let local_reply = stream.local_reply();
        let filter_state = stream.filter_state_all();
        let route_cache_cleared = lock(&stream.data()).route_cache_cleared.clone();
        stream.finish()?;
        let cost = stream.costs();
        let exchange = Exchange {
            request_headers: request.headers.clone(),
            request_body: request.chunks.concat(),
            upstream: if seen.headers.is_some() {
                Some(seen)
            } else {
                None
            },
            downstream: down,
            local_reply,
            filter_state,
            route_cache_cleared,
            cost,
        };
        Ok((exchange, next))
    }
}

/// One stream (request + response) on a worker.
pub struct Stream {
    fleet: Fleet,
    core: Rc<RefCell<StreamCore>>,
}

impl Stream {
    /// The fleet-wide stream id.
    pub fn id(&self) -> u64 {
        self.core.borrow().id
    }

    fn data(&self) -> Arc<Mutex<StreamData>> {
        self.core.borrow().data.clone()
    }

    /// Sets a property the filters can read (dotted path: `xds.route_name`).
    pub fn set_property(&self, path: &str, value: impl Into<Property>) {
        lock(&self.data())
            .properties
            .insert(path.to_string(), value.into());
    }

    /// Filter state written by `proxy_set_property` (`wasm.<path>`).
    pub fn filter_state(&self, key: &str) -> Option<Vec<u8>> {
        lock(&self.data()).filter_state.get(key).cloned()
    }

    fn filter_state_all(&self) -> HashMap<String, Vec<u8>> {
        lock(&self.data()).filter_state.clone()
    }

    /// How many times filter `filter` called `clear_route_cache`.
    pub fn route_cache_cleared(&self, filter: usize) -> u32 {
        lock(&self.data())
            .route_cache_cleared
            .get(filter)
            .copied()
            .unwrap_or(0)
    }

    fn step(
        &self,
        f: impl FnOnce(&mut StreamCore, &FleetInner) -> crate::Result<()>,
    ) -> crate::Result<()> {
        {
            let mut core = self.core.borrow_mut();
            if core.finished {
                return Err(format!("stream {} is finished", core.id));
            }
            f(&mut core, &self.fleet.0)?;
        }
        self.fleet.0.settle()
    }

    /// The client sends the request headers.
    pub fn send_request_headers(
        &self,
        headers: &[(&str, &str)],
        end_stream: bool,
    ) -> crate::Result<()> {
        self.send_request_headers_raw(headers_from(headers), end_stream)
    }

    /// The client sends the request headers (as a [`Request`] holds them).
    pub fn send_request_headers_raw(
        &self,
        headers: Headers,
        end_stream: bool,
    ) -> crate::Result<()> {
        self.step(|core, fleet| {
            lock(&core.data).request_headers = Some(headers);
            core.headers_from(fleet, Direction::Request, 0, end_stream)
        })
    }

    /// The client sends a request body chunk.
    pub fn send_request_body(&self, chunk: &[u8], end_stream: bool) -> crate::Result<()> {
        self.step(|core, fleet| core.request_body(fleet, chunk.to_vec(), end_stream))
    }

    /// The upstream answers with headers.
    pub fn send_response_headers(
        &self,
        headers: &[(&str, &str)],
        end_stream: bool,
    ) -> crate::Result<()> {
        self.send_response_headers_raw(headers_from(headers), end_stream)
    }

    /// The upstream answers with headers (as a [`Response`] holds them).
    pub fn send_response_headers_raw(
        &self,
        headers: Headers,
        end_stream: bool,
    ) -> crate::Result<()> {
        self.step(|core, fleet| core.response_headers(fleet, headers, end_stream))
    }

    /// The upstream sends a response body chunk.
    pub fn send_response_body(&self, chunk: &[u8], end_stream: bool) -> crate::Result<()> {
        self.step(|core, fleet| core.response_body(fleet, chunk.to_vec(), end_stream))
    }

    /// What reached the upstream so far.
    pub fn upstream(&self) -> Upstream {
        self.core.borrow().upstream.clone()
    }

    /// What reached the client so far.
    pub fn downstream(&self) -> Downstream {
        self.core.borrow().downstream.clone()
    }

    /// The local reply sent, if any.
    pub fn local_reply(&self) -> Option<LocalReply> {
        self.core.borrow().local_reply.clone()
    }

    /// The current request headers (as the filters changed them).
    pub fn request_headers(&self) -> Option<Headers> {
        lock(&self.data()).request_headers.clone()
    }

    /// Filters holding this stream: `(chain index, direction)`.
    pub fn paused(&self) -> Vec<(usize, Direction)> {
        self.core.borrow().paused()
    }

    /// The cost of this stream's callbacks so far.
    pub fn costs(&self) -> Vec<CallCost> {
        let id = self.id();
        self.fleet
            .costs()
            .into_iter()
            .filter(|c| c.stream == Some(id))
            .collect()
    }

    /// Ends the stream as Envoy 1.40 does: `proxy_on_log` on every filter in chain order —
    /// creating the context of a filter that never saw the request (a local reply stopped
    /// the chain before it) just for that — then `proxy_on_done` and `proxy_on_delete`
    /// filter by filter. (Seen in Envoy's `wasm:trace` log, `e2e harness_local_reply::`.)
    pub fn finish(&self) -> crate::Result<()> {
        let (instance, worker, id) = {
            let mut core = self.core.borrow_mut();
            if core.finished {
                return Ok(());
            }
            core.finished = true;
            (core.instance, core.worker, core.id)
        };
        let loc = |filter| VmLocation {
            instance,
            worker,
            filter,
        };
        let n = self.fleet.0.specs.len();
        let mut created = Vec::new();
        for f in 0..n {
            let existing = self.core.borrow().contexts.get(f).copied().flatten();
            let ctx = match existing {
                Some(ctx) => ctx,
                None => {
                    let data = self.data();
                    let ctx = self.fleet.0.create_context(loc(f), data, f, id)?;
                    if let Some(slot) = self.core.borrow_mut().contexts.get_mut(f) {
                        *slot = Some(ctx);
                    }
                    ctx
                }
            };
            self.fleet
                .0
                .call(loc(f), "proxy_on_log", &[ctx], Some(id))?;
            created.push((f, ctx));
        }
        for &(f, ctx) in &created {
            self.fleet
                .0
                .call(loc(f), "proxy_on_done", &[ctx], Some(id))?;
            self.fleet
                .0
                .call(loc(f), "proxy_on_delete", &[ctx], Some(id))?;
        }
        for &(f, ctx) in &created {
            if let Ok(vm) = self.fleet.0.vm(loc(f)) {
                vm.borrow_mut().drop_context(ctx);
            }
            self.fleet.0.contexts.borrow_mut().remove(&(loc(f), ctx));
        }
        self.fleet.0.streams.borrow_mut().remove(&id);
        self.fleet.0.settle()
    }
}

/// A request for [`Fleet::exchange`].
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// Headers (pseudo-headers included).
    pub headers: Headers,
    /// Body chunks, in order (empty: no body).
    pub chunks: Vec<Vec<u8>>,
    /// Properties to set before the headers.
    pub properties: Vec<(String, Property)>,
}

impl Request {
    /// A request with `:method`, `:path`, `:authority` and `:scheme`.
    pub fn new(method: &str, path: &str) -> Request {
        Request {
            headers: headers_from(&[
                (":method", method),
                (":path", path),
                (":authority", "gateway.test"),
                (":scheme", "http"),
            ]),
            ..Request::default()
        }
    }

    /// A POST.
    pub fn post(path: &str) -> Request {
        Request::new("POST", path)
    }

    /// A GET.
    pub fn get(path: &str) -> Request {
        Request::new("GET", path)
    }

    /// Adds a header (`:authority` replaces the default).
    pub fn header(mut self, name: &str, value: &str) -> Request {
        let name = name.to_ascii_lowercase();
        let name = if name == "host" {
            ":authority".into()
        } else {
            name
        };
        if name.starts_with(':') {
            self.headers.retain(|(n, _)| *n != name);
            self.headers.insert(0, (name, value.as_bytes().to_vec()));
        } else {
            self.headers.push((name, value.as_bytes().to_vec()));
        }
        self
    }

    /// A body in one chunk (with `content-length`).
    pub fn body(mut self, body: &[u8]) -> Request {
        self.headers
            .push(("content-length".into(), body.len().to_string().into_bytes()));
        self.chunks = vec![body.to_vec()];
        self
    }

    /// A JSON body in one chunk.
    pub fn json(self, value: &serde_json::Value) -> Request {
        self.header("content-type", "application/json")
            .body(value.to_string().as_bytes())
    }

    /// Splits the body into chunks at these byte offsets.
    pub fn split_at(mut self, offsets: &[usize]) -> Request {
        let body: Vec<u8> = self.chunks.concat();
        self.chunks = split(&body, offsets);
        self
    }

    /// Ends the body with an empty end-of-stream chunk after the data, as Envoy delivers an
    /// HTTP/1 request with a `content-length` (one callback with the data, then one with no
    /// new bytes and `end_of_stream`).
    pub fn then_empty_end(mut self) -> Request {
        self.chunks.push(Vec::new());
        self
    }

    /// Sets a property before the headers.
    pub fn property(mut self, path: &str, value: impl Into<Property>) -> Request {
        self.properties.push((path.to_string(), value.into()));
        self
    }
}

fn split(body: &[u8], offsets: &[usize]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut start = 0;
    for &at in offsets {
        let at = at.clamp(start, body.len());
        out.push(body[start..at].to_vec());
        start = at;
    }
    out.push(body[start..].to_vec());
    out
}

/// The upstream's answer for [`Fleet::exchange`].
#[derive(Debug, Clone, Default)]
pub struct Response {
    /// Headers (`:status` included).
    pub headers: Headers,
    /// Body chunks.
    pub chunks: Vec<Vec<u8>>,
}

impl Response {
    /// A response with this status and no body.
    pub fn status(status: u16) -> Response {
        Response {
            headers: vec![(":status".into(), status.to_string().into_bytes())],
            chunks: Vec::new(),
        }
    }

    /// 200 with a JSON body.
    pub fn json(value: &serde_json::Value) -> Response {
        Response::status(200)
            .header("content-type", "application/json")
            .body(value.to_string().as_bytes())
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Response {
        self.headers
            .push((name.to_ascii_lowercase(), value.as_bytes().to_vec()));
        self
    }

    /// A body in one chunk.
    pub fn body(mut self, body: &[u8]) -> Response {
        self.chunks = vec![body.to_vec()];
        self
    }

    /// Ends the body with an empty end-of-stream chunk after the data (Envoy does this for
    /// chunked upstream responses).
    pub fn then_empty_end(mut self) -> Response {
        self.chunks.push(Vec::new());
        self
    }

    /// Splits the body into chunks at these byte offsets.
    pub fn split_at(mut self, offsets: &[usize]) -> Response {
        let body: Vec<u8> = self.chunks.concat();
        self.chunks = split(&body, offsets);
        self
    }
}

/// The outcome of [`Fleet::exchange`].
#[derive(Debug, Clone)]
pub struct Exchange {
    /// The request headers the stream began with (the client's, or a redirect's).
    pub request_headers: Headers,
    /// The request body the stream began with.
    pub request_body: Vec<u8>,
    /// What reached the upstream (`None`: nothing did).
    pub upstream: Option<Upstream>,
    /// What reached the client.
    pub downstream: Downstream,
    /// The local reply, if a filter (or the harness, for a limit) sent one.
    pub local_reply: Option<LocalReply>,
    /// Filter state at the end.
    pub filter_state: HashMap<String, Vec<u8>>,
    /// Per filter (chain index): how many times it called `clear_route_cache`.
    pub route_cache_cleared: Vec<u32>,
    /// Cost of this exchange's HTTP-context callbacks.
    pub cost: Vec<CallCost>,
}

impl Exchange {
    /// The response status.
    pub fn status(&self) -> u16 {
        self.header(":status")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    /// A response header.
    pub fn header(&self, name: &str) -> Option<&str> {
        super::stream::header_value(self.downstream.headers.as_ref()?, name)
    }

    /// The response body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.downstream.body).into_owned()
    }

    /// The response body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.downstream.body).unwrap_or(serde_json::Value::Null)
    }

    /// A request header as it reached the upstream.
    pub fn upstream_header(&self, name: &str) -> Option<&str> {
        super::stream::header_value(self.upstream.as_ref()?.headers.as_ref()?, name)
    }

    /// Every value of a request header as it reached the upstream.
    pub fn upstream_headers(&self, name: &str) -> Vec<&str> {
        self.upstream
            .as_ref()
            .and_then(|u| u.headers.as_ref())
            .map(|h| super::stream::header_values(h, name))
            .unwrap_or_default()
    }
}

impl Vm {
    /// True if the context exists in this VM.
    pub fn has_context(&mut self, context: u32) -> bool {
        self.context_kind(context).is_some()
    }
}
