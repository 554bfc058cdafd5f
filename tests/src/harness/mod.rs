//! A proxy-wasm host on wasmtime for tests: it loads the *compiled* plugins (`dist/*.wasm`),
//! implements the proxy-wasm ABI 0.2.1 with Envoy's semantics (or Higress's: [`Host`]) and Higress's Redis calls
//! against a real `redis-server`, runs chains of filters, many worker VMs per gateway
//! instance and many instances, and meters every callback. `tests/README.md` says what it
//! guarantees and what it does not.
//!
//! Layers, one file each: [`engine`] (engine and compiled-module cache), [`filter`] (a filter
//! of a chain as a test describes it), [`host`] (Envoy or Higress: the ABI a module may
//! declare and what a headers `Pause` means), [`abi`] (host functions), [`state`] (a VM's store data), [`vm`] (one VM), [`stream`] (a stream's data),
//! [`chain`] (Envoy's filter iteration), [`services`] (shared data, queues, metrics, clock),
//! [`redis`] (Redis bridge and fault proxy), [`redirect`] (Higress's fallback redirect), [`http_call`] (answers to `dispatch_http_call`),
//! [`fleet`] (instances, workers, streams, pumping), [`cost`] (accounting); [`traffic`] drives
//! mixed traffic through the whole chain and reads the books it leaves in Redis.

pub mod abi;
pub mod chain;
pub mod cost;
pub mod engine;
pub mod filter;
pub mod fleet;
pub mod host;
pub mod http_call;
pub mod redirect;
pub mod redis;
pub mod services;
pub mod state;
pub mod stream;
pub mod traffic;
pub mod vm;

pub use chain::{Downstream, Upstream};
pub use cost::{CallCost, Totals};
pub use filter::FilterSpec;
pub use fleet::{Exchange, Fleet, FleetBuilder, Request, Response, Stream};
pub use host::{Abi, Host};
pub use redirect::{InternalRedirect, RedirectValue};
pub use redis::{Fault, FaultProxy};
pub use services::Clock;
pub use state::{HttpCallOutcome, HttpCallRequest};
pub use stream::{Direction, LocalReply, Property};

/// Where the harness clock starts in the suites whose keys live in a real `redis-server`:
/// 00:53:20 UTC of the day after the real one (Unix nanoseconds).
///
/// The gateway's clock decides absolute expiries (`PEXPIREAT` of a budget's key: its period's
/// end plus a day), and Redis judges them by its own, real clock: a fixed date makes those keys
/// vanish as soon as they are written once it lies two days in the past. A start in the near
/// future keeps every such expiry ahead of Redis's clock (by an hour at least), and the fixed
/// time of day keeps the suites' timelines (hours of simulated traffic stay within one day).
pub fn redis_suite_start_nanos() -> u64 {
    const DAY_S: u64 = 86_400;
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let tomorrow = (now_s / DAY_S + 1) * DAY_S;
    (tomorrow + 53 * 60 + 20) * 1_000_000_000
}
