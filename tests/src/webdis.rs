//! A real `webdis` (Debian's package, 0.1.9) on a free loopback port, in front of a Redis, with
//! the configuration operators ship (`envoy-config/webdis.json`: only `EVALSHA`, `EVAL` and
//! `XADD`, behind HTTP basic auth).

use crate::redis::free_port;
use crate::workspace::{envoy_config, render, TempDir};
use crate::Result;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The credentials the fixture configures (`user:password`).
pub const AUTH: &str = "gateway:webdis-test";

/// A running webdis; stopped on drop.
#[derive(Debug)]
pub struct Webdis {
    child: Child,
    running: bool,
    addr: SocketAddr,
    dir: TempDir,
}

impl Webdis {
    /// Starts webdis on 127.0.0.1 in front of `redis`, and waits until it answers an
    /// authorized `EVAL` (Redis must be up).
    pub fn start(redis: SocketAddr) -> Result<Webdis> {
        let dir = TempDir::new("webdis")?;
        let port = free_port()?;
        let config = render(
            &std::fs::read_to_string(envoy_config("webdis.json")).map_err(|e| e.to_string())?,
            &[
                ("REDIS_HOST", redis.ip().to_string()),
                ("REDIS_PORT", redis.port().to_string()),
                ("HTTP_HOST", "127.0.0.1".to_string()),
                ("HTTP_PORT", port.to_string()),
                ("AUTH", AUTH.to_string()),
                (
                    "LOGFILE",
                    dir.path().join("webdis.log").display().to_string(),
                ),
            ],
        )?;
        let path = dir.path().join("webdis.json");
        std::fs::write(&path, config).map_err(|e| e.to_string())?;
        let child = spawn(&path)?;
        let mut webdis = Webdis {
            child,
            running: true,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            dir,
        };
        webdis.wait_ready()?;
        Ok(webdis)
    }

    /// Stops it (the port goes dark).
    pub fn stop(&mut self) {
        if self.running {
            crate::envoy::stop(&mut self.child);
            self.running = false;
        }
    }

    /// Starts it again on the same port and waits until it answers.
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        self.child = spawn(&self.dir.path().join("webdis.json"))?;
        self.running = true;
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok((200, body)) = self.post("EVAL/return%201/0.raw", Some(AUTH)) {
                if body == b":1\r\n" {
                    return Ok(());
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("webdis exited: {status}"));
            }
            if Instant::now() > deadline {
                return Err("webdis did not answer".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `POST /` with `body` (a webdis command path), with `auth` (`user:password`) if given:
    /// the status and the body of the answer.
    pub fn post(&self, body: &str, auth: Option<&str>) -> Result<(u16, Vec<u8>)> {
        let mut stream = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1))
            .map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        let auth = auth
            .map(|a| {
                format!(
                    "authorization: {}\r\n",
                    llm_gateway_shared::webdis::basic_auth(a)
                )
            })
            .unwrap_or_default();
        let request = format!(
            "POST / HTTP/1.1\r\nhost: webdis\r\nconnection: close\r\n{auth}content-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream
            .write_all(request.as_bytes())
            .map_err(|e| e.to_string())?;
        let mut raw = Vec::new();
        let _ = stream.read_to_end(&mut raw);
        let end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or("no HTTP answer")?;
        let head = String::from_utf8_lossy(&raw[..end]).into_owned();
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or("no status")?;
        Ok((status, raw[end + 4..].to_vec()))
    }
}

impl Drop for Webdis {
    fn drop(&mut self) {
        self.stop();
    }
}

fn spawn(config: &std::path::Path) -> Result<Child> {
    Command::new("webdis")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start webdis: {e} (run scripts/setup)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::Redis;

    /// What the plugins rely on, against the real webdis: raw RESP, percent-decoding,
    /// NOSCRIPT as a reply, 403 outside the ACL, 503 without Redis.
    #[test]
    fn webdis_behaves_as_the_transport_expects() {
        let mut redis = Redis::start().unwrap();
        let webdis = Webdis::start(redis.addr()).unwrap();
        use llm_gateway_shared::webdis::{reply, request_body};
        // what a command's answer becomes, through the transport's own encoding and decoding
        let run = |args: &[&str]| -> Vec<u8> {
            let body = String::from_utf8(request_body(args).unwrap()).unwrap();
            let (status, answer) = webdis.post(&body, Some(AUTH)).unwrap();
            reply(Some(&status.to_string()), answer).unwrap()
        };
        assert_eq!(
            run(&[
                "EVAL",
                "return {KEYS[1], ARGV[1]}",
                "1",
                "{t:a}/b.c+%?",
                "x y\n\t.5"
            ]),
            b"*2\r\n$12\r\n{t:a}/b.c+%?\r\n$7\r\nx y\n\t.5\r\n"
        );
        // 11+ digit integers in an array (wrong in webdis's .raw output), nil, negative
        assert_eq!(
            run(&["EVAL", "return {1, 99999999999, -9007199254740991}", "0"]),
            b"*3\r\n:1\r\n:99999999999\r\n:-9007199254740991\r\n"
        );
        let noscript = run(&["EVALSHA", &"0".repeat(40), "0"]);
        assert!(noscript.starts_with(b"-NOSCRIPT"), "{noscript:?}");
        assert!(run(&["XADD", "s", "*", "record", "{\"a\":1.5}"]).starts_with(b"$"));
        // a request longer than one 4096-byte read is never answered: the transport's cap
        let long = format!("EVAL/return 1 --{}/0.raw", "x".repeat(4096));
        assert!(webdis.post(&long, Some(AUTH)).is_err());
        let fits = format!(
            "EVAL/return 1 --{}/0.raw",
            "x".repeat(llm_gateway_shared::webdis::MAX_REQUEST_BODY - 24)
        );
        assert_eq!(
            webdis.post(&fits, Some(AUTH)).unwrap(),
            (200, b":1\r\n".to_vec())
        );
        // outside the ACL, or without the credentials
        assert_eq!(webdis.post("GET/x.raw", Some(AUTH)).unwrap().0, 403);
        assert_eq!(webdis.post("FLUSHALL.raw", Some(AUTH)).unwrap().0, 403);
        assert_eq!(webdis.post("EVAL/return%201/0.raw", None).unwrap().0, 403);
        assert_eq!(
            webdis
                .post("EVAL/return%201/0.raw", Some("gateway:wrong"))
                .unwrap()
                .0,
            403
        );
        redis.stop();
        assert_eq!(
            webdis.post("EVAL/return%201/0.raw", Some(AUTH)).unwrap(),
            (503, Vec::new())
        );
    }
}
