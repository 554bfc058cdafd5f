//! One plugin VM: a wasmtime instance of a compiled plugin with its root context, started
//! the way Envoy starts a VM (`_initialize`, `proxy_on_context_create(root, 0)`,
//! `proxy_on_vm_start`, `proxy_on_configure`). Every callback is metered (fuel, host calls,
//! bytes); a trap fails with the plugin's log lines, and leaves the VM failed like Envoy does.

use super::abi;
use super::cost::{CallCost, Counters};
use super::filter::FilterSpec;
use super::host::{Abi, Host};
use super::redis::RedisBridge;
use super::services::{Clock, InstanceServices};
use super::state::{ContextKind, Effect, HostState, LogLine, VmLocation};
use super::stream::StreamData;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use wasmtime::{Store, Val};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::WasiCtxBuilder;

/// Fuel one callback may burn before it counts as a runaway (a trap).
pub const FUEL_PER_CALLBACK: u64 = 20_000_000_000;

/// What a VM needs from its fleet.
#[derive(Clone)]
pub struct VmEnv {
    /// The instance's services.
    pub services: Arc<InstanceServices>,
    /// The fleet's clock.
    pub clock: Clock,
    /// The fleet's Redis services.
    pub redis: Arc<RedisBridge>,
    /// The fleet's HTTP clusters.
    pub http_clusters: Arc<Mutex<HashSet<String>>>,
    /// Level reported by `proxy_get_log_level`.
    pub log_level: u32,
    /// The gateway modelled.
    pub host: Host,
}

/// A running plugin VM.
pub struct Vm {
    store: Store<HostState>,
    instance: wasmtime::Instance,
    spec: Arc<FilterSpec>,
    stderr: MemoryOutputPipe,
    next_context: u32,
    failed: Option<String>,
    abi: Abi,
    /// Cost of every callback, in order.
    pub costs: Vec<CallCost>,
}

/// The result of a callback: its return value (if it has one) and the effects it asked for.
#[derive(Debug)]
pub struct Called {
    /// The return value.
    pub value: Option<u32>,
    /// Effects to carry out.
    pub effects: Vec<Effect>,
}

/// What the host answers for a stream callback the module does not export, without entering
/// the VM: `Continue` (0) for a headers, body or trailers callback, `true` (1) for
/// `proxy_on_done`, nothing for `proxy_on_log`; `None` for any other export (its absence is an
/// error).
fn skipped_callback(name: &str) -> Option<Option<u32>> {
    match name {
        "proxy_on_request_headers"
        | "proxy_on_request_body"
        | "proxy_on_request_trailers"
        | "proxy_on_response_headers"
        | "proxy_on_response_body"
        | "proxy_on_response_trailers" => Some(Some(0)),
        "proxy_on_done" => Some(Some(1)),
        "proxy_on_log" => Some(None),
        _ => None,
    }
}

impl Vm {
    /// Instantiates and starts a VM: `_initialize`, root context, `proxy_on_vm_start`,
    /// `proxy_on_configure`. A `false` from either is an error carrying the plugin's logs.
    pub fn start(spec: Arc<FilterSpec>, location: VmLocation, env: &VmEnv) -> crate::Result<Vm> {
        let module = super::engine::module(&spec.path)?;
        let abi = env.host.abi(&spec.name, &super::engine::exports(&module))?;
        let stderr = MemoryOutputPipe::new(64 * 1024);
        let wasi = WasiCtxBuilder::new()
            .stdout(stderr.clone())
            .stderr(stderr.clone())
            .wall_clock(env.clock.clone())
            .monotonic_clock(env.clock.clone())
            .build_p1();
        let state = HostState {
            wasi,
            plugin: spec.name.clone(),
            vm_id: spec.vm_id.clone(),
            root_id: spec.root_id.clone(),
            location,
            services: env.services.clone(),
            clock: env.clock.clone(),
            redis: env.redis.clone(),
            redis_services: HashMap::new(),
            http_clusters: env.http_clusters.clone(),
            log_level: env.log_level,
            logs: Vec::new(),
            contexts: HashMap::from([(1, ContextKind::Root)]),
            root_context: 1,
            effective: 1,
            plugin_config: spec.config.clone(),
            vm_config: spec.vm_config.clone(),
            http_call_response: None,
            redis_response: None,
            tick_period_ms: 0,
            next_token: 0,
            effects: Vec::new(),
            counters: Counters::default(),
        };
        let mut store = Store::new(super::engine::engine(), state);
        if super::engine::fuel_metering() {
            store
                .set_fuel(FUEL_PER_CALLBACK)
                .map_err(|e| e.to_string())?;
        }
        let instance = abi::linker()
            .instantiate(&mut store, &module)
            .map_err(|e| format!("{}: cannot instantiate: {e:#}", spec.name))?;
        let mut vm = Vm {
            store,
            instance,
            spec,
            stderr,
            next_context: 2,
            failed: None,
            abi,
            costs: Vec::new(),
        };
        if vm.has_export("_initialize") {
            vm.call("_initialize", &[], None)?;
        } else if vm.has_export("_start") {
            vm.call("_start", &[], None)?;
        }
        vm.call("proxy_on_context_create", &[1, 0], None)?;
        let vm_config = vm.spec.vm_config.len() as u32;
        if vm.call("proxy_on_vm_start", &[1, vm_config], None)?.value == Some(0) {
            return Err(vm.failure("proxy_on_vm_start returned false"));
        }
        let config = vm.spec.config.len() as u32;
        if vm.call("proxy_on_configure", &[1, config], None)?.value == Some(0) {
            return Err(vm.failure("proxy_on_configure returned false"));
        }
        Ok(vm)
    }

    /// The filter this VM runs.
    pub fn spec(&self) -> &FilterSpec {
        &self.spec
    }

    /// The module's ABI, as the host read it.
    pub fn abi(&self) -> Abi {
        self.abi
    }

    /// True if the module exports `name`.
    pub fn has_export(&mut self, name: &str) -> bool {
        self.instance.get_func(&mut self.store, name).is_some()
    }

    /// The root context id.
    pub fn root_context(&self) -> u32 {
        self.store.data().root_context
    }

    /// The tick period the plugin asked for (0: none).
    pub fn tick_period_ms(&self) -> u32 {
        self.store.data().tick_period_ms
    }

    /// Every line the plugin logged.
    pub fn logs(&self) -> &[LogLine] {
        &self.store.data().logs
    }

    /// The log as text.
    pub fn log_text(&self) -> String {
        self.store.data().log_text()
    }

    /// Where it sits.
    pub fn location(&self) -> VmLocation {
        self.store.data().location
    }

    /// Creates an HTTP context for a stream (`proxy_on_context_create(id, root)`).
    pub fn create_http_context(
        &mut self,
        data: Arc<Mutex<StreamData>>,
        filter: usize,
        stream: u64,
    ) -> crate::Result<(u32, Vec<Effect>)> {
        let id = self.next_context;
        self.next_context += 1;
        self.store.data_mut().contexts.insert(
            id,
            ContextKind::Http {
                data,
                filter,
                stream,
            },
        );
        let root = self.root_context();
        let called = self.call("proxy_on_context_create", &[id, root], Some(stream))?;
        Ok((id, called.effects))
    }

    /// Forgets a context after `proxy_on_delete`.
    pub fn drop_context(&mut self, id: u32) {
        self.store.data_mut().contexts.remove(&id);
    }

    /// Sets the HTTP call response buffers for the next callback.
    pub fn set_http_call_response(
        &mut self,
        response: Option<(super::stream::Headers, Vec<u8>, super::stream::Headers)>,
    ) {
        self.store.data_mut().http_call_response = response;
    }

    /// Sets the Redis reply buffer (type 9) for the next callback.
    pub fn set_redis_response(&mut self, reply: Option<Vec<u8>>) {
        self.store.data_mut().redis_response = reply;
    }

    /// Calls an export with `u32` arguments (the first is the context, made effective).
    /// A trap is an error with the plugin's logs; the VM stays failed afterwards.
    pub fn call(
        &mut self,
        name: &'static str,
        args: &[u32],
        stream: Option<u64>,
    ) -> crate::Result<Called> {
        if let Some(failed) = &self.failed {
            return Err(format!("{}: VM failed earlier: {failed}", self.spec.name));
        }
        let Some(func) = self.instance.get_func(&mut self.store, name) else {
            // proxy-wasm-cpp-host (Envoy's and Higress's fork, `src/context.cc`) skips a stream
            // callback the module does not export and answers as the SDK's default would
            // (`scripts/unused-callbacks`: what scripts/build drops from each plugin)
            if let Some(value) = skipped_callback(name) {
                return Ok(Called {
                    value,
                    effects: Vec::new(),
                });
            }
            return Err(format!(
                "{}: the module does not export {name}",
                self.spec.name
            ));
        };
        let params: Vec<Val> = args.iter().map(|a| Val::I32(*a as i32)).collect();
        let mut results = vec![Val::I32(0); func.ty(&self.store).results().len()];
        {
            let state = self.store.data_mut();
            state.counters = Counters::default();
            if let Some(context) = args.first() {
                if state.contexts.contains_key(context) {
                    state.effective = *context;
                }
            }
        }
        let metered = super::engine::fuel_metering();
        if metered {
            self.store
                .set_fuel(FUEL_PER_CALLBACK)
                .map_err(|e| e.to_string())?;
        }
        let started = std::time::Instant::now();
        let outcome = func.call(&mut self.store, &params, &mut results);
        let wall = started.elapsed();
        let fuel = if metered {
            FUEL_PER_CALLBACK - self.store.get_fuel().unwrap_or(0)
        } else {
            0
        };
        let location = self.location();
        let counters = self.store.data().counters;
        if super::abi::host_call_log() {
            eprintln!(
                "callback {} {name}: {fuel} fuel, {} host calls",
                self.spec.name, counters.host_calls
            );
        }
        self.costs.push(CallCost {
            seq: super::cost::next_seq(),
            plugin: self.spec.name.clone(),
            instance: location.instance,
            worker: location.worker,
            filter: location.filter,
            callback: name,
            stream,
            fuel,
            counters,
            wall,
        });
        let effects = std::mem::take(&mut self.store.data_mut().effects);
        let root = self.root_context();
        self.store.data_mut().effective = root;
        if let Err(trap) = outcome {
            let message = format!("trapped in {name}{args:?}: {trap:?}");
            let err = self.failure(&message);
            self.failed = Some(message);
            return Err(err);
        }
        let value = results.first().and_then(|v| v.i32()).map(|v| v as u32);
        Ok(Called { value, effects })
    }

    fn failure(&self, what: &str) -> String {
        let stderr = self.stderr.contents();
        let mut out = format!(
            "plugin {} ({:?}): {what}\n--- plugin log ---\n{}",
            self.spec.name,
            self.location(),
            self.log_text()
        );
        if !stderr.is_empty() {
            out.push_str("--- plugin stderr ---\n");
            out.push_str(&String::from_utf8_lossy(&stderr));
        }
        out
    }

    /// True after a trap.
    pub fn failed(&self) -> bool {
        self.failed.is_some()
    }

    /// The size of the VM's linear memory (its exported `memory`) in bytes: what the VM
    /// holds, since wasm memory only grows.
    pub fn memory_bytes(&mut self) -> u64 {
        match self.instance.get_memory(&mut self.store, "memory") {
            Some(memory) => memory.data_size(&self.store) as u64,
            None => 0,
        }
    }
}

impl Vm {
    pub(crate) fn context_kind(&self, context: u32) -> Option<&ContextKind> {
        self.store.data().contexts.get(&context)
    }
}
