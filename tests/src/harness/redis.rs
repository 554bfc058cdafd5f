//! Higress's Redis calls against real Redis servers: service names (what a plugin passes to
//! `proxy_redis_init`) map to addresses, and each call is one blocking round trip made when
//! the test pumps the fleet, so replies arrive in a deterministic order. A [`FaultProxy`]
//! between the harness and Redis makes Redis slow, silent or unreachable on demand.

use super::services::lock;
use llm_gateway_shared::resp::{self, RespError};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Why a Redis call failed (Higress calls back with a non-zero status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisFailure {
    /// Connection refused or reset.
    Connect(String),
    /// No complete reply within the service's timeout.
    Timeout,
    /// The service is not mapped (the harness refuses it at `proxy_redis_init` already).
    UnknownService,
}

/// The status `proxy_on_redis_call_response` gets for a failure. Higress passes a non-zero
/// status without saying more; the harness uses 1 for every failure.
pub const FAILURE_STATUS: u32 = 1;

/// Service name -> Redis address, shared by every instance of a fleet (they share Redis).
#[derive(Debug, Default)]
pub struct RedisBridge {
    services: Mutex<HashMap<String, SocketAddr>>,
    connections: Mutex<HashMap<String, TcpStream>>,
    calls: std::sync::atomic::AtomicU64,
}

impl RedisBridge {
    /// Maps a service name to an address (replacing an earlier mapping).
    pub fn map(&self, service: &str, addr: SocketAddr) {
        lock(&self.services).insert(service.to_string(), addr);
        lock(&self.connections).remove(service);
    }

    /// True if the service is mapped.
    pub fn knows(&self, service: &str) -> bool {
        lock(&self.services).contains_key(service)
    }

    /// Calls made so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// One round trip: the raw RESP reply. Reuses a connection; a reused connection that
    /// fails is replaced once (Redis restarted), a fresh one that fails is the answer.
    pub fn call(
        &self,
        service: &str,
        query: &[u8],
        timeout_ms: u32,
    ) -> Result<Vec<u8>, RedisFailure> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let addr = *lock(&self.services)
            .get(service)
            .ok_or(RedisFailure::UnknownService)?;
        let timeout = Duration::from_millis(u64::from(timeout_ms.max(1)));
        let cached = lock(&self.connections).remove(service);
        if let Some(stream) = cached {
            if let Ok(reply) = round_trip(stream, query, timeout).map(|(reply, stream)| {
                lock(&self.connections).insert(service.to_string(), stream);
                reply
            }) {
                return Ok(reply);
            }
        }
        let stream = TcpStream::connect_timeout(&addr, timeout)
            .map_err(|e| RedisFailure::Connect(e.kind().to_string()))?;
        let (reply, stream) = round_trip(stream, query, timeout)?;
        lock(&self.connections).insert(service.to_string(), stream);
        Ok(reply)
    }
}

fn round_trip(
    mut stream: TcpStream,
    query: &[u8],
    timeout: Duration,
) -> Result<(Vec<u8>, TcpStream), RedisFailure> {
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => RedisFailure::Timeout,
        kind => RedisFailure::Connect(kind.to_string()),
    };
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let _ = stream.set_nodelay(true);
    stream.write_all(query).map_err(io)?;
    let deadline = std::time::Instant::now() + timeout;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match resp::decode_prefix(&reply, &resp::Limits::default()) {
            Ok((_, used)) => {
                reply.truncate(used);
                return Ok((reply, stream));
            }
            Err(RespError::Incomplete) => {}
            Err(e) => return Err(RedisFailure::Connect(format!("bad reply: {e}"))),
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(RedisFailure::Timeout);
        }
        stream.set_read_timeout(Some(left)).map_err(io)?;
        match stream.read(&mut buf) {
            Ok(0) => return Err(RedisFailure::Connect("connection closed".into())),
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(e) => return Err(io(e)),
        }
    }
}

/// What a [`FaultProxy`] does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward both ways.
    Pass,
    /// Forward, holding each client -> server chunk this long first.
    Delay(Duration),
    /// Accept and read, never answer (a black hole: the client times out).
    Blackhole,
    /// Close every connection at once, existing ones included (Redis "down").
    Refuse,
}

/// A loopback TCP proxy in front of a server whose behaviour the test switches.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    fault: Arc<Mutex<Fault>>,
    stop: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl FaultProxy {
    /// Starts a proxy to `target` on an ephemeral loopback port.
    pub fn start(target: SocketAddr) -> crate::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let fault = Arc::new(Mutex::new(Fault::Pass));
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (f, s, o) = (fault.clone(), stop.clone(), open.clone());
        std::thread::spawn(move || accept_loop(listener, target, f, s, o));
        Ok(FaultProxy {
            addr,
            fault,
            stop,
            open,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches the behaviour; `Refuse` and `Blackhole` also cut open connections.
    pub fn set(&self, fault: Fault) {
        *lock(&self.fault) = fault;
        if matches!(fault, Fault::Refuse | Fault::Blackhole) {
            for stream in lock(&self.open).drain(..) {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for stream in lock(&self.open).drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    fault: Arc<Mutex<Fault>>,
    stop: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
) {
    while !stop.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(_) => return,
        };
        let _ = client.set_nonblocking(false);
        match *lock(&fault) {
            Fault::Refuse => {
                let _ = client.shutdown(Shutdown::Both);
                continue;
            }
            Fault::Blackhole => {
                // keep it open, say nothing
                if let Ok(c) = client.try_clone() {
                    lock(&open).push(c);
                }
                std::thread::spawn(move || {
                    let mut client = client;
                    let mut buf = [0u8; 1024];
                    while matches!(client.read(&mut buf), Ok(n) if n > 0) {}
                });
                continue;
            }
            Fault::Pass | Fault::Delay(_) => {}
        }
        let Ok(server) = TcpStream::connect(target) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        for s in [&client, &server] {
            if let Ok(c) = s.try_clone() {
                lock(&open).push(c);
            }
        }
        let (c2, s2) = match (client.try_clone(), server.try_clone()) {
            (Ok(c), Ok(s)) => (c, s),
            _ => continue,
        };
        let f = fault.clone();
        std::thread::spawn(move || pipe(client, server, Some(f)));
        std::thread::spawn(move || pipe(s2, c2, None));
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream, fault: Option<Arc<Mutex<Fault>>>) {
    let mut buf = [0u8; 8192];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(fault) = &fault {
            match *lock(fault) {
                Fault::Delay(d) => std::thread::sleep(d),
                Fault::Pass => {}
                Fault::Blackhole | Fault::Refuse => break,
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
