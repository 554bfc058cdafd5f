//! The host services one gateway instance offers all its VMs: shared data with CAS, shared
//! queues and metrics (Envoy keeps these per process, so every worker VM of an instance sees
//! the same ones), and the clock the whole fleet shares.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Statuses of the proxy-wasm ABI (Envoy's `WasmResult`).
pub mod status {
    /// 0
    pub const OK: u32 = 0;
    /// 1
    pub const NOT_FOUND: u32 = 1;
    /// 2
    pub const BAD_ARGUMENT: u32 = 2;
    /// 4
    pub const PARSE_FAILURE: u32 = 4;
    /// 6
    pub const INVALID_MEMORY_ACCESS: u32 = 6;
    /// 7
    pub const EMPTY: u32 = 7;
    /// 8
    pub const CAS_MISMATCH: u32 = 8;
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The fleet's clock: nanoseconds since the Unix epoch, moved only by the test. Starts at
/// 2026-01-01T00:00:00Z so runs are reproducible.
#[derive(Debug, Clone)]
pub struct Clock(Arc<AtomicU64>);

impl Default for Clock {
    fn default() -> Self {
        Clock(Arc::new(AtomicU64::new(1_767_225_600 * 1_000_000_000)))
    }
}

impl Clock {
    /// Now, in nanoseconds since the epoch.
    pub fn now_nanos(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// Now, in seconds since the epoch.
    pub fn now_secs(&self) -> u64 {
        self.now_nanos() / 1_000_000_000
    }

    /// Sets the time.
    pub fn set_nanos(&self, nanos: u64) {
        self.0.store(nanos, Ordering::SeqCst);
    }

    /// Moves the time forward.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.0.fetch_add(by, Ordering::SeqCst);
    }
}

impl wasmtime_wasi::HostWallClock for Clock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }
    fn now(&self) -> Duration {
        Duration::from_nanos(self.now_nanos())
    }
}

impl wasmtime_wasi::HostMonotonicClock for Clock {
    fn resolution(&self) -> u64 {
        1
    }
    fn now(&self) -> u64 {
        self.now_nanos()
    }
}

/// One `vm_id`'s shared data: key -> (value, CAS).
type DataMap = HashMap<String, (Vec<u8>, u32)>;

/// Envoy's shared data: one map per `vm_id`, values with a CAS token.
#[derive(Debug, Default)]
pub struct SharedData {
    maps: Mutex<HashMap<String, DataMap>>,
    next_cas: AtomicU64,
}

impl SharedData {
    /// The value and CAS of `key` in `vm_id`'s map.
    pub fn get(&self, vm_id: &str, key: &str) -> Option<(Vec<u8>, u32)> {
        lock(&self.maps).get(vm_id)?.get(key).cloned()
    }

    /// Envoy's `set`: a non-zero `cas` must match the current one when the key exists.
    pub fn set(&self, vm_id: &str, key: &str, value: &[u8], cas: u32) -> u32 {
        let mut maps = lock(&self.maps);
        let map = maps.entry(vm_id.to_string()).or_default();
        if let Some((_, current)) = map.get(key) {
            if cas != 0 && cas != *current {
                return status::CAS_MISMATCH;
            }
        }
        let next = loop {
            let n = (self.next_cas.fetch_add(1, Ordering::SeqCst) + 1) as u32;
            if n != 0 {
                break n;
            }
        };
        map.insert(key.to_string(), (value.to_vec(), next));
        status::OK
    }

    /// Every key of `vm_id`'s map, sorted.
    pub fn keys(&self, vm_id: &str) -> Vec<String> {
        let mut keys: Vec<String> = lock(&self.maps)
            .get(vm_id)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        keys.sort();
        keys
    }
}

/// Where `proxy_on_queue_ready` goes: the VM that registered the queue last, and its root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueOwner {
    /// Worker index in the instance.
    pub worker: usize,
    /// Filter (VM) index in the worker's chain.
    pub filter: usize,
    /// The root context that registered it.
    pub root_context: u32,
}

#[derive(Debug, Default)]
struct Queues {
    ids: HashMap<(String, String), u32>,
    items: HashMap<u32, (QueueOwner, VecDeque<Vec<u8>>)>,
}

/// Envoy's shared queues, one namespace per `vm_id`.
#[derive(Debug, Default)]
pub struct SharedQueues {
    queues: Mutex<Queues>,
}

impl SharedQueues {
    /// Registers (or takes over) a queue; returns its id.
    pub fn register(&self, vm_id: &str, name: &str, owner: QueueOwner) -> u32 {
        let mut q = lock(&self.queues);
        let next = q.ids.len() as u32 + 1;
        let id = *q
            .ids
            .entry((vm_id.to_string(), name.to_string()))
            .or_insert(next);
        q.items
            .entry(id)
            .and_modify(|(o, _)| *o = owner)
            .or_insert((owner, VecDeque::new()));
        id
    }

    /// The id of a registered queue.
    pub fn resolve(&self, vm_id: &str, name: &str) -> Option<u32> {
        lock(&self.queues)
            .ids
            .get(&(vm_id.to_string(), name.to_string()))
            .copied()
    }

    /// Appends; returns the owner to notify, `None` if the queue does not exist.
    pub fn enqueue(&self, id: u32, data: &[u8]) -> Option<QueueOwner> {
        let mut q = lock(&self.queues);
        let (owner, items) = q.items.get_mut(&id)?;
        items.push_back(data.to_vec());
        Some(*owner)
    }

    /// Takes the oldest item: `Err(NOT_FOUND)` for an unknown queue, `Ok(None)` if empty.
    pub fn dequeue(&self, id: u32) -> Result<Option<Vec<u8>>, u32> {
        let mut q = lock(&self.queues);
        let (_, items) = q.items.get_mut(&id).ok_or(status::NOT_FOUND)?;
        Ok(items.pop_front())
    }
}

/// A metric's kind, as `proxy_define_metric` numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// 0
    Counter,
    /// 1
    Gauge,
    /// 2
    Histogram,
}

#[derive(Debug)]
struct Metric {
    name: String,
    kind: MetricKind,
    value: i64,
    samples: Vec<u64>,
}

/// Envoy stats `wasmcustom.<name>`: one stat per name, shared by every VM of the instance.
#[derive(Debug, Default)]
pub struct Metrics {
    metrics: Mutex<Vec<Metric>>,
}

impl Metrics {
    /// Defines (or finds) a metric; ids start at 1.
    pub fn define(&self, kind: MetricKind, name: &str) -> Result<u32, u32> {
        let mut metrics = lock(&self.metrics);
        if let Some(i) = metrics.iter().position(|m| m.name == name) {
            return if metrics[i].kind == kind {
                Ok(i as u32 + 1)
            } else {
                Err(status::BAD_ARGUMENT)
            };
        }
        metrics.push(Metric {
            name: name.to_string(),
            kind,
            value: 0,
            samples: Vec::new(),
        });
        Ok(metrics.len() as u32)
    }

    /// `proxy_increment_metric`: counters refuse a delta <= 0, histograms any increment.
    pub fn increment(&self, id: u32, delta: i64) -> u32 {
        let mut metrics = lock(&self.metrics);
        let Some(m) = metrics.get_mut(id.wrapping_sub(1) as usize) else {
            return status::NOT_FOUND;
        };
        match m.kind {
            MetricKind::Counter if delta <= 0 => status::BAD_ARGUMENT,
            MetricKind::Histogram => status::BAD_ARGUMENT,
            _ => {
                m.value = m.value.saturating_add(delta);
                if m.kind == MetricKind::Gauge && m.value < 0 {
                    m.value = 0;
                }
                status::OK
            }
        }
    }

    /// `proxy_record_metric`: sets a gauge, adds a histogram sample; counters refuse.
    pub fn record(&self, id: u32, value: u64) -> u32 {
        let mut metrics = lock(&self.metrics);
        let Some(m) = metrics.get_mut(id.wrapping_sub(1) as usize) else {
            return status::NOT_FOUND;
        };
        match m.kind {
            MetricKind::Counter => status::BAD_ARGUMENT,
            MetricKind::Gauge => {
                m.value = i64::try_from(value).unwrap_or(i64::MAX);
                status::OK
            }
            MetricKind::Histogram => {
                m.samples.push(value);
                status::OK
            }
        }
    }

    /// `proxy_get_metric` (counters and gauges).
    pub fn get(&self, id: u32) -> Result<u64, u32> {
        let metrics = lock(&self.metrics);
        let m = metrics
            .get(id.wrapping_sub(1) as usize)
            .ok_or(status::NOT_FOUND)?;
        match m.kind {
            MetricKind::Histogram => Err(status::BAD_ARGUMENT),
            _ => Ok(u64::try_from(m.value).unwrap_or(0)),
        }
    }

    /// A counter's or gauge's value by name; `None` if undefined.
    pub fn value(&self, name: &str) -> Option<u64> {
        lock(&self.metrics)
            .iter()
            .find(|m| m.name == name && m.kind != MetricKind::Histogram)
            .map(|m| u64::try_from(m.value).unwrap_or(0))
    }

    /// A histogram's samples by name; `None` if undefined.
    pub fn samples(&self, name: &str) -> Option<Vec<u64>> {
        lock(&self.metrics)
            .iter()
            .find(|m| m.name == name && m.kind == MetricKind::Histogram)
            .map(|m| m.samples.clone())
    }

    /// Every metric name with its kind, in definition order.
    pub fn names(&self) -> Vec<(String, MetricKind)> {
        lock(&self.metrics)
            .iter()
            .map(|m| (m.name.clone(), m.kind))
            .collect()
    }
}

/// The services of one gateway instance.
#[derive(Debug, Default)]
pub struct InstanceServices {
    /// Shared data, per `vm_id`.
    pub shared_data: SharedData,
    /// Shared queues, per `vm_id`.
    pub queues: SharedQueues,
    /// Metrics.
    pub metrics: Metrics,
}
