//! A real `redis-server` on a free loopback port, without persistence.

use crate::workspace::TempDir;
use crate::Result;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running Redis; stopped on drop.
#[derive(Debug)]
pub struct Redis {
    child: Child,
    running: bool,
    addr: SocketAddr,
    _dir: TempDir,
}

impl Redis {
    /// Starts `redis-server` on 127.0.0.1 and waits until it answers PING.
    pub fn start() -> Result<Redis> {
        let dir = TempDir::new("redis")?;
        let port = free_port()?;
        let child = spawn(port, &dir)?;
        let mut redis = Redis {
            child,
            running: true,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            _dir: dir,
        };
        redis.wait_ready()?;
        Ok(redis)
    }

    /// Stops the server (the port goes dark; data is lost: no persistence).
    pub fn stop(&mut self) {
        // once only: a reaped child's pid may belong to another process by now
        if self.running {
            crate::envoy::stop(&mut self.child);
            self.running = false;
        }
    }

    /// Starts it again on the same port, empty, and waits until it answers PING.
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        self.child = spawn(self.addr.port(), &self._dir)?;
        self.running = true;
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.command(&["PING"]).as_deref() != Ok("+PONG\r\n") {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("redis-server exited: {status}"));
            }
            if Instant::now() > deadline {
                return Err("redis-server did not answer PING".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sends one command and returns the raw RESP reply (read until the first CRLF-terminated
    /// reply arrives; enough for simple replies).
    pub fn command(&self, args: &[&str]) -> Result<String> {
        let mut stream = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1))
            .map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        let mut query = format!("*{}\r\n", args.len());
        for arg in args {
            query.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        stream
            .write_all(query.as_bytes())
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; 4096];
        let n = stream.read(&mut buf).map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

fn spawn(port: u16, dir: &TempDir) -> Result<Child> {
    Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args([
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
        ])
        .arg("--dir")
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start redis-server: {e} (run scripts/setup)"))
}
