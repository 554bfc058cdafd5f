//! Redis commands carried over HTTP to [webdis] (the second Redis transport, for hosts without
//! Higress's Redis ABI: plain Envoy, Istio, Envoy Gateway): the request a command becomes, and
//! what its answer means. Pure: the plugin sends the request with `dispatch_http_call` and hands
//! the answer's `:status` and body to [`reply`], which gives back the reply as RESP bytes, so
//! the plugin decodes it with [`crate::resp`] exactly as a Higress Redis reply.
//!
//! What webdis 0.1.9 (Debian 12's `webdis`) does, as checked against a real one (see
//! `docs/host-notes.md`):
//! - `POST /` with the body `COMMAND/arg1/…/argN.json` runs the command and answers 200 with
//!   `{"COMMAND": reply}`: an integer is a JSON number, a bulk string a string, nil `null`, an
//!   array an array, a status `[true, "OK"]` and an error `[false, "NOSCRIPT …"]` (Redis
//!   arrays never hold booleans, so that pair is unambiguous). [`reply`] turns it back into
//!   RESP.
//! - The `.raw` output (RESP as is) cannot be used: inside an array it writes integers as bulk
//!   strings whose length is wrong from 11 digits on (`$10` before `99999999999`: a money budget
//!   in nano-USD has 12), and drops nested arrays and nils.
//! - Every argument is percent-decoded; `/` separates arguments, the last `.` starts the
//!   output format, `+` decodes to a space and `?` starts a query. Those bytes, `%`, control
//!   bytes other than newline and tab, and bytes above 0x7f are sent as `%XX`; the rest
//!   (spaces, newlines, quotes, braces: a Lua source reads as itself) travels as is.
//! - A request must arrive in **one read of at most 4096 bytes**, head included: a longer or
//!   split one is never answered (the connection hangs until a timeout). So a body is at most
//!   [`MAX_REQUEST_BODY`] bytes, which leaves room for Envoy's request head; the largest
//!   script `EVAL` (RESERVE on 8 budget levels) stays well under it.
//! - Redis unreachable: `503` with an empty body. A command the ACL refuses (or a wrong or
//!   missing `Authorization`): `403` with an empty body.
//!
//! [webdis]: https://github.com/nicolasff/webdis

/// The `:path` of every command (the command travels in the body).
pub const PATH: &str = "/";

/// The longest request body sent (webdis 0.1.9 answers only requests that fit, head
/// included, in one 4096-byte read; 512 bytes are left for the head Envoy writes).
pub const MAX_REQUEST_BODY: usize = 3584;

/// A command too long for one webdis request (its body length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLarge(pub usize);

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "webdis: a {}-byte request (at most {MAX_REQUEST_BODY})",
            self.0
        )
    }
}

/// The request body that runs `args` (command first) and asks for a JSON reply.
pub fn request_body<A: AsRef<[u8]>>(args: &[A]) -> Result<Vec<u8>, TooLarge> {
    let size = 8 + args.iter().map(|a| a.as_ref().len() + 1).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    let last = args.len().saturating_sub(1);
    for (i, arg) in args.iter().enumerate() {
        if i > 0 {
            out.push(b'/');
        }
        // a `.` in the last argument would be read as the output format
        percent_encode(arg.as_ref(), i == last, &mut out);
    }
    out.extend_from_slice(b".json");
    if out.len() > MAX_REQUEST_BODY {
        return Err(TooLarge(out.len()));
    }
    Ok(out)
}

fn percent_encode(bytes: &[u8], last: bool, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in bytes {
        let special = matches!(b, b'%' | b'/' | b'+' | b'?')
            || (b == b'.' && last)
            || (b.is_ascii_control() && b != b'\n' && b != b'\t')
            || !b.is_ascii();
        if !special {
            out.push(b);
        } else {
            out.push(b'%');
            let hex = |n: u8| HEX.get(usize::from(n)).copied().unwrap_or(b'0');
            out.push(hex(b >> 4));
            out.push(hex(b & 0x0f));
        }
    }
}

/// The `Authorization` value for webdis's `http_basic_auth` (`user:password`, as written in
/// its ACL). Never log it.
pub fn basic_auth(user_password: &str) -> String {
    format!("Basic {}", base64(user_password.as_bytes()))
}

fn base64(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let sextet = |v: u32, shift: u32| {
        char::from(
            ALPHABET
                .get(((v >> shift) & 63) as usize)
                .copied()
                .unwrap_or(b'A'),
        )
    };
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = |i: usize| chunk.get(i).copied().map_or(0, u32::from);
        let v = (b(0) << 16) | (b(1) << 8) | b(2);
        out.push(sextet(v, 18));
        out.push(sextet(v, 12));
        out.push(if chunk.len() > 1 { sextet(v, 6) } else { '=' });
        out.push(if chunk.len() > 2 { sextet(v, 0) } else { '=' });
    }
    out
}

/// Why a command carried over webdis has no Redis reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebdisError {
    /// No HTTP answer: connect failure, reset or timeout (the command may have run).
    NoAnswer,
    /// `503`: webdis cannot reach Redis.
    RedisUnreachable,
    /// `403`: webdis's ACL refused the command or the credentials.
    Forbidden,
    /// Any other status (Envoy's own `503`/`504` included).
    Status(u16),
    /// A 200 whose body is not a webdis JSON reply.
    Malformed,
}

impl std::fmt::Display for WebdisError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WebdisError::NoAnswer => write!(f, "webdis: no answer"),
            WebdisError::RedisUnreachable => write!(f, "webdis: Redis unreachable (503)"),
            WebdisError::Forbidden => {
                write!(f, "webdis: forbidden (403): check `auth` and webdis's ACL")
            }
            WebdisError::Status(s) => write!(f, "webdis: HTTP status {s}"),
            WebdisError::Malformed => write!(f, "webdis: not a JSON reply"),
        }
    }
}

/// The reply inside an answer, as RESP bytes (`status` from `:status`, none if the call
/// failed). A Redis error reply (`-NOSCRIPT …`) is a reply: the caller decodes it as from Redis.
pub fn reply(status: Option<&str>, body: Vec<u8>) -> Result<Vec<u8>, WebdisError> {
    let Some(status) = status else {
        return Err(WebdisError::NoAnswer);
    };
    match status.trim().parse::<u16>() {
        Ok(200) => json_to_resp(&body).ok_or(WebdisError::Malformed),
        Ok(403) => Err(WebdisError::Forbidden),
        Ok(503) if body.is_empty() => Err(WebdisError::RedisUnreachable),
        Ok(code) => Err(WebdisError::Status(code)),
        Err(_) => Err(WebdisError::NoAnswer),
    }
}

/// `{"COMMAND": reply}` as RESP.
fn json_to_resp(body: &[u8]) -> Option<Vec<u8>> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let object = value.as_object()?;
    if object.len() != 1 {
        return None;
    }
    let reply = object.values().next()?;
    let mut out = Vec::new();
    encode(reply, &mut out, 0)?;
    Some(out)
}

fn encode(value: &serde_json::Value, out: &mut Vec<u8>, depth: usize) -> Option<()> {
    use serde_json::Value;
    if depth > 8 {
        return None;
    }
    match value {
        Value::Null => out.extend_from_slice(b"$-1\r\n"),
        Value::Number(n) => {
            out.push(b':');
            out.extend_from_slice(n.as_i64()?.to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Value::String(s) => {
            out.push(b'$');
            out.extend_from_slice(s.len().to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(s.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Value::Array(items) => match items.as_slice() {
            // webdis's status and error replies
            [Value::Bool(ok), Value::String(text)] => {
                out.push(if *ok { b'+' } else { b'-' });
                out.extend(
                    text.bytes()
                        .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
                );
                out.extend_from_slice(b"\r\n");
            }
            _ => {
                out.push(b'*');
                out.extend_from_slice(items.len().to_string().as_bytes());
                out.extend_from_slice(b"\r\n");
                for item in items {
                    encode(item, out, depth + 1)?;
                }
            }
        },
        Value::Bool(_) | Value::Object(_) => return None,
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn arguments_are_percent_encoded_and_json_is_asked_for() {
        let body = request_body(&[
            "EVALSHA".as_bytes(),
            b"ab12",
            b"1",
            b"{trl}:a/b.c?d",
            b"x+y %\r\n\t\"q\"",
            b"\0\xff.1",
        ])
        .unwrap();
        assert_eq!(
            String::from_utf8(body).unwrap(),
            "EVALSHA/ab12/1/{trl}:a%2Fb.c%3Fd/x%2By %25%0D\n\t\"q\"/%00%FF%2E1.json"
        );
        // an empty argument stays an (empty) argument
        assert_eq!(request_body(&["XADD", "", "x"]).unwrap(), b"XADD//x.json");
        let long = "a".repeat(MAX_REQUEST_BODY);
        assert_eq!(
            request_body(&["XADD", long.as_str()]),
            Err(TooLarge(MAX_REQUEST_BODY + 10))
        );
    }

    #[test]
    fn basic_auth_is_rfc4648_base64() {
        assert_eq!(basic_auth("gw:s3cret"), "Basic Z3c6czNjcmV0");
        for (input, out) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v")] {
            assert_eq!(base64(input.as_bytes()), out);
        }
    }

    #[test]
    fn answers_map_to_replies_or_errors() {
        let ok = |body: &str| reply(Some("200"), body.as_bytes().to_vec());
        assert_eq!(ok(r#"{"PING":[true,"PONG"]}"#), Ok(b"+PONG\r\n".to_vec()));
        // a Redis error reply is a reply
        assert_eq!(
            ok(r#"{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}"#),
            Ok(b"-NOSCRIPT No matching script. Please use EVAL.\r\n".to_vec())
        );
        // what raw RESP gets wrong: 11+ digit integers in an array
        assert_eq!(
            ok(r#"{"EVAL":[1,99999999999,-9007199254740991]}"#),
            Ok(b"*3\r\n:1\r\n:99999999999\r\n:-9007199254740991\r\n".to_vec())
        );
        assert_eq!(
            ok(r#"{"XADD":"1700000000000-0"}"#),
            Ok(b"$15\r\n1700000000000-0\r\n".to_vec())
        );
        assert_eq!(ok(r#"{"GET":null}"#), Ok(b"$-1\r\n".to_vec()));
        assert_eq!(ok(r#"{"EVAL":[]}"#), Ok(b"*0\r\n".to_vec()));
        assert_eq!(
            ok(r#"{"EVAL":[[1,"a"],null]}"#),
            Ok(b"*2\r\n*2\r\n:1\r\n$1\r\na\r\n$-1\r\n".to_vec())
        );
        for bad in [
            "",
            "{}",
            "[1]",
            r#"{"A":1,"B":2}"#,
            r#"{"A":1.5}"#,
            r#"{"A":true}"#,
        ] {
            assert_eq!(ok(bad), Err(WebdisError::Malformed), "{bad}");
        }
        assert_eq!(reply(None, Vec::new()), Err(WebdisError::NoAnswer));
        assert_eq!(
            reply(Some("503"), Vec::new()),
            Err(WebdisError::RedisUnreachable)
        );
        // Envoy's own 503 (no healthy upstream) has a body
        assert_eq!(
            reply(Some("503"), b"no healthy upstream".to_vec()),
            Err(WebdisError::Status(503))
        );
        assert_eq!(reply(Some("403"), Vec::new()), Err(WebdisError::Forbidden));
        assert_eq!(
            reply(Some("504"), Vec::new()),
            Err(WebdisError::Status(504))
        );
        assert_eq!(reply(Some("x"), Vec::new()), Err(WebdisError::NoAnswer));
    }
}
