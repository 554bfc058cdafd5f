//! Answers for `dispatch_http_call`: a test handler is any
//! `FnMut(&HttpCallRequest) -> HttpCallOutcome`; [`loopback`] forwards the call to a real
//! HTTP/1.1 server on loopback (the mock upstream, say) and hands its answer back.

use super::state::{HttpCallOutcome, HttpCallRequest};
use super::stream::{header_value, Headers};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A handler that forwards every call to `addr` (one connection per call, `Connection:
/// close`); a connect failure, a timeout (the call's own) or a malformed answer is a
/// [`HttpCallOutcome::Failure`], as Envoy reports them.
pub fn loopback(addr: SocketAddr) -> impl FnMut(&HttpCallRequest) -> HttpCallOutcome {
    move |request| forward(addr, request).unwrap_or(HttpCallOutcome::Failure)
}

fn forward(addr: SocketAddr, request: &HttpCallRequest) -> Option<HttpCallOutcome> {
    let timeout = Duration::from_millis(u64::from(request.timeout_ms.max(1)));
    let mut stream = TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    let method = header_value(&request.headers, ":method")?;
    let path = header_value(&request.headers, ":path")?;
    let authority = header_value(&request.headers, ":authority")?;
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\n");
    for (name, value) in &request.headers {
        if !name.starts_with(':')
            && name != "host"
            && name != "connection"
            && name != "content-length"
        {
            head.push_str(&format!("{name}: {}\r\n", String::from_utf8_lossy(value)));
        }
    }
    head.push_str(&format!("content-length: {}\r\n\r\n", request.body.len()));
    // one write, as Envoy's codec flushes a request given whole: webdis 0.1.9 answers only a
    // request that arrives in one read
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(&request.body);
    stream.write_all(&bytes).ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> Option<HttpCallOutcome> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(raw.get(..end)?).ok()?;
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.to_string();
    let mut headers: Headers = vec![(":status".into(), status.into_bytes())];
    for line in lines {
        let (name, value) = line.split_once(':')?;
        headers.push((
            name.trim().to_ascii_lowercase(),
            value.trim().as_bytes().to_vec(),
        ));
    }
    let rest = raw.get(end + 4..)?;
    let body = if header_value(&headers, "transfer-encoding") == Some("chunked") {
        headers.retain(|(n, _)| n != "transfer-encoding");
        dechunk(rest)?
    } else {
        match header_value(&headers, "content-length").and_then(|l| l.parse::<usize>().ok()) {
            Some(len) => rest.get(..len)?.to_vec(),
            None => rest.to_vec(),
        }
    };
    Some(HttpCallOutcome::Response {
        headers,
        body,
        trailers: Vec::new(),
    })
}

fn dechunk(mut rest: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(rest.get(..line_end)?).ok()?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        let start = line_end + 2;
        out.extend_from_slice(rest.get(start..start + size)?);
        rest = rest.get(start + size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_length_and_chunked_answers() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\nhi";
        let Some(HttpCallOutcome::Response { headers, body, .. }) = parse_response(plain) else {
            panic!("not parsed");
        };
        assert_eq!(header_value(&headers, ":status"), Some("200"));
        assert_eq!(header_value(&headers, "x-a"), Some("b"));
        assert_eq!(body, b"hi");
        let chunked = b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let Some(HttpCallOutcome::Response { body, .. }) = parse_response(chunked) else {
            panic!("not parsed");
        };
        assert_eq!(body, b"abcde");
        assert!(parse_response(b"garbage").is_none());
    }
}
