//! The `mock-upstream` binary: listening line, one request, argument errors.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_mock-upstream");

/// Runs the binary with `args`, sends it one request (`POST path` with `headers`, a chat body)
/// and returns the listening line and the raw response.
fn one_request(args: &[&str], path: &str, headers: &str) -> (String, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn mock-upstream");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    let read = BufReader::new(stdout).read_line(&mut line);

    let outcome = (|| -> Result<String, String> {
        read.map_err(|e| e.to_string())?;
        let addr = line
            .trim_end()
            .strip_prefix("mock-upstream listening on http://")
            .ok_or_else(|| format!("unexpected line {line:?}"))?;
        let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| e.to_string())?;
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        write!(
            stream,
            "POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{headers}content-length: {}\r\n\r\n{body}",
            body.len()
        )
        .map_err(|e| e.to_string())?;
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .map_err(|e| e.to_string())?;
        Ok(response)
    })();
    let _ = child.kill();
    let _ = child.wait();

    (line, outcome.expect("a response"))
}

#[test]
fn prints_listening_line_and_serves() {
    let (line, response) = one_request(
        &["--listen", "127.0.0.1:0", "--threads", "2"],
        "/v1/chat/completions",
        "",
    );
    assert!(line.ends_with('\n'), "one full line: {line:?}");
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    assert!(response.contains(r#""completion_tokens":8"#), "{response}");
}

#[test]
fn flavor_flag_plays_one_provider() {
    let (_, response) = one_request(&["--flavor", "anthropic"], "/v1/chat/completions", "");
    assert!(
        response.starts_with("HTTP/1.1 404 Not Found\r\n"),
        "{response}"
    );
    assert!(
        response.contains(r#""type":"not_found_error""#),
        "{response}"
    );
    let (_, response) = one_request(
        &["--flavor=openai"],
        "/v1/chat/completions",
        "authorization: Bearer sk-test\r\n",
    );
    assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
    let (_, response) = one_request(&["--flavor", "openai"], "/v1/chat/completions", "");
    assert!(
        response.starts_with("HTTP/1.1 401 Unauthorized\r\n"),
        "{response}"
    );
}

#[test]
fn bad_arguments_exit_2() {
    for args in [
        &["--threads", "0"][..],
        &["--listen", "nope"],
        &["--frobnicate"],
        &["--listen"],
        &["--flavor", "gemini"],
    ] {
        let out = Command::new(BIN).args(args).output().expect("run");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty());
        assert!(!out.stderr.is_empty());
    }
}
