//! RESP2, the Redis protocol: commands encoded as arrays of bulk strings, replies decoded
//! with bounds (depth, element count, bulk size) and without trusting the bytes.
//!
//! Higress hands a plugin the raw reply of `proxy_redis_call` (buffer type 9); this module
//! turns it into a [`Reply`]. Decoding never panics and never allocates more than the input
//! can justify: a count the input cannot hold is an error, not an allocation. Pure, so it is
//! tested natively and on wasm.

/// A command: an array of bulk strings, `*<n>\r\n` then `$<len>\r\n<arg>\r\n` per argument.
pub fn encode_command<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let size = 16 + args.iter().map(|a| a.as_ref().len() + 16).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.push(b'*');
    out.extend_from_slice(args.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    for arg in args {
        let arg = arg.as_ref();
        out.push(b'$');
        out.extend_from_slice(arg.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// A decoded reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Simple(String),
    /// `-ERR ...` (the message, without the `-`).
    Error(String),
    /// `:42`
    Integer(i64),
    /// `$3\r\nabc` or the null bulk `$-1`.
    Bulk(Option<Vec<u8>>),
    /// `*2\r\n...` or the null array `*-1`.
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The integer of an integer reply, or of a bulk/simple string holding one (what `GET`
    /// returns for a counter).
    pub fn integer(&self) -> Option<i64> {
        match self {
            Reply::Integer(i) => Some(*i),
            Reply::Bulk(Some(b)) => std::str::from_utf8(b).ok()?.parse().ok(),
            Reply::Simple(s) => s.parse().ok(),
            _ => None,
        }
    }

    /// The bytes of a bulk or simple string.
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(Some(b)) => Some(b),
            Reply::Simple(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// True for a null bulk or null array (a missing key).
    pub fn is_null(&self) -> bool {
        matches!(self, Reply::Bulk(None) | Reply::Array(None))
    }

    /// The message of an error reply.
    pub fn error(&self) -> Option<&str> {
        match self {
            Reply::Error(e) => Some(e),
            _ => None,
        }
    }
}

/// Bounds on what a reply may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Nesting of arrays (the top level is depth 1).
    pub max_depth: usize,
    /// Elements of one array.
    pub max_elements: usize,
    /// Bytes of one bulk string.
    pub max_bulk: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_depth: 8,
            max_elements: 4096,
            max_bulk: 1 << 20,
        }
    }
}

/// Why a reply could not be decoded. Never carries the reply's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RespError {
    /// The input ended inside a reply.
    Incomplete,
    /// A type byte that is not one of `+ - : $ *`, at this offset.
    UnknownType(usize),
    /// A length or integer that is not a number, or out of range, at this offset.
    BadNumber(usize),
    /// A line or bulk not terminated by CRLF, at this offset.
    MissingCrlf(usize),
    /// Deeper than `max_depth`.
    TooDeep,
    /// More elements than `max_elements` (or than the input could hold).
    TooManyElements,
    /// A bulk longer than `max_bulk`.
    BulkTooLarge,
    /// Bytes after the reply, at this offset.
    TrailingBytes(usize),
}

impl std::fmt::Display for RespError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RespError::Incomplete => write!(f, "RESP reply is incomplete"),
            RespError::UnknownType(at) => write!(f, "unknown RESP type byte at {at}"),
            RespError::BadNumber(at) => write!(f, "bad RESP number at {at}"),
            RespError::MissingCrlf(at) => write!(f, "missing CRLF at {at}"),
            RespError::TooDeep => write!(f, "RESP reply nested too deep"),
            RespError::TooManyElements => write!(f, "RESP array has too many elements"),
            RespError::BulkTooLarge => write!(f, "RESP bulk string too large"),
            RespError::TrailingBytes(at) => write!(f, "bytes after the RESP reply at {at}"),
        }
    }
}

impl std::error::Error for RespError {}

/// The first reply of `input` and the bytes it took; `Err(Incomplete)` if more bytes are
/// needed (a stream reader reads on and tries again).
pub fn decode_prefix(input: &[u8], limits: &Limits) -> Result<(Reply, usize), RespError> {
    let mut pos = 0;
    let reply = value(input, &mut pos, limits, 1)?;
    Ok((reply, pos))
}

/// Exactly one reply: what Higress puts in buffer type 9.
pub fn decode(input: &[u8], limits: &Limits) -> Result<Reply, RespError> {
    let (reply, used) = decode_prefix(input, limits)?;
    if used != input.len() {
        return Err(RespError::TrailingBytes(used));
    }
    Ok(reply)
}

/// The line from `*pos` up to CRLF (exclusive); moves `*pos` past the CRLF.
fn line<'a>(input: &'a [u8], pos: &mut usize) -> Result<&'a [u8], RespError> {
    let rest = input.get(*pos..).ok_or(RespError::Incomplete)?;
    let Some(cr) = rest.iter().position(|b| *b == b'\r') else {
        return Err(RespError::Incomplete);
    };
    match rest.get(cr + 1) {
        None => return Err(RespError::Incomplete),
        Some(b'\n') => {}
        Some(_) => return Err(RespError::MissingCrlf(*pos + cr)),
    }
    let text = rest.get(..cr).ok_or(RespError::Incomplete)?;
    *pos += cr + 2;
    Ok(text)
}

fn number(text: &[u8], at: usize) -> Result<i64, RespError> {
    let s = std::str::from_utf8(text).map_err(|_| RespError::BadNumber(at))?;
    if s.is_empty() || s.starts_with('+') {
        return Err(RespError::BadNumber(at));
    }
    s.parse::<i64>().map_err(|_| RespError::BadNumber(at))
}

fn value(input: &[u8], pos: &mut usize, limits: &Limits, depth: usize) -> Result<Reply, RespError> {
    if depth > limits.max_depth {
        return Err(RespError::TooDeep);
    }
    let start = *pos;
    let kind = *input.get(start).ok_or(RespError::Incomplete)?;
    *pos += 1;
    match kind {
        b'+' => Ok(Reply::Simple(
            String::from_utf8_lossy(line(input, pos)?).into_owned(),
        )),
        b'-' => Ok(Reply::Error(
            String::from_utf8_lossy(line(input, pos)?).into_owned(),
        )),
        b':' => Ok(Reply::Integer(number(line(input, pos)?, start + 1)?)),
        b'$' => {
            let len = number(line(input, pos)?, start + 1)?;
            if len == -1 {
                return Ok(Reply::Bulk(None));
            }
            // compare before converting: on wasm32 a huge length does not fit a usize, and
            // that is "too large", not "not a number"
            let len = u64::try_from(len).map_err(|_| RespError::BadNumber(start + 1))?;
            if len > limits.max_bulk as u64 {
                return Err(RespError::BulkTooLarge);
            }
            let len = len as usize;
            let end = pos.checked_add(len).ok_or(RespError::BulkTooLarge)?;
            let body = input.get(*pos..end).ok_or(RespError::Incomplete)?.to_vec();
            match input.get(end..end + 2) {
                Some(b"\r\n") => {}
                Some(_) => return Err(RespError::MissingCrlf(end)),
                None => return Err(RespError::Incomplete),
            }
            *pos = end + 2;
            Ok(Reply::Bulk(Some(body)))
        }
        b'*' => {
            let count = number(line(input, pos)?, start + 1)?;
            if count == -1 {
                return Ok(Reply::Array(None));
            }
            let count = u64::try_from(count).map_err(|_| RespError::BadNumber(start + 1))?;
            if count > limits.max_elements as u64 {
                return Err(RespError::TooManyElements);
            }
            let count = count as usize;
            // every element takes at least 3 bytes (`+\r\n`): reserve only what the input
            // can hold, so a lying count costs no memory
            let room = input.len().saturating_sub(*pos) / 3;
            let mut items = Vec::with_capacity(count.min(room));
            for _ in 0..count {
                items.push(value(input, pos, limits, depth + 1)?);
            }
            Ok(Reply::Array(Some(items)))
        }
        _ => Err(RespError::UnknownType(start)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn parse(input: &[u8]) -> Result<Reply, RespError> {
        decode(input, &Limits::default())
    }

    #[test]
    fn encodes_commands_as_bulk_arrays() {
        assert_eq!(
            encode_command(&["SET", "k", "v"]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"
        );
        assert_eq!(encode_command::<&str>(&[]), b"*0\r\n");
        let binary: [&[u8]; 2] = [b"GET", b"a\r\nb"];
        assert_eq!(
            encode_command(&binary),
            b"*2\r\n$3\r\nGET\r\n$4\r\na\r\nb\r\n"
        );
    }

    #[test]
    fn decodes_every_type() {
        let cases: [(&[u8], Reply); 9] = [
            (b"+OK\r\n", Reply::Simple("OK".into())),
            (b"-ERR wrong\r\n", Reply::Error("ERR wrong".into())),
            (b":42\r\n", Reply::Integer(42)),
            (b":-7\r\n", Reply::Integer(-7)),
            (b"$3\r\nabc\r\n", Reply::Bulk(Some(b"abc".to_vec()))),
            (b"$0\r\n\r\n", Reply::Bulk(Some(Vec::new()))),
            (b"$-1\r\n", Reply::Bulk(None)),
            (b"*-1\r\n", Reply::Array(None)),
            (
                b"*2\r\n:1\r\n*1\r\n$1\r\nx\r\n",
                Reply::Array(Some(vec![
                    Reply::Integer(1),
                    Reply::Array(Some(vec![Reply::Bulk(Some(b"x".to_vec()))])),
                ])),
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(
                parse(input),
                Ok(expected),
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn helpers_read_counters_and_nulls() {
        assert_eq!(parse(b":5\r\n").unwrap().integer(), Some(5));
        assert_eq!(parse(b"$2\r\n12\r\n").unwrap().integer(), Some(12));
        assert_eq!(parse(b"$2\r\nab\r\n").unwrap().integer(), None);
        assert!(parse(b"$-1\r\n").unwrap().is_null());
        assert_eq!(
            parse(b"-NOSCRIPT x\r\n").unwrap().error(),
            Some("NOSCRIPT x")
        );
        assert_eq!(parse(b"+PONG\r\n").unwrap().bytes(), Some(&b"PONG"[..]));
    }

    #[test]
    fn incomplete_input_asks_for_more() {
        for input in [
            &b""[..],
            b"+OK",
            b"+OK\r",
            b":1",
            b"$3\r\nab",
            b"$3\r\nabc",
            b"$3\r\nabc\r",
            b"*2\r\n:1\r\n",
        ] {
            assert_eq!(parse(input), Err(RespError::Incomplete), "{input:?}");
        }
        let (reply, used) = decode_prefix(b":1\r\n:2\r\n", &Limits::default()).unwrap();
        assert_eq!((reply, used), (Reply::Integer(1), 4));
    }

    #[test]
    fn malformed_input_is_an_error() {
        assert_eq!(parse(b"?x\r\n"), Err(RespError::UnknownType(0)));
        assert_eq!(parse(b":abc\r\n"), Err(RespError::BadNumber(1)));
        assert_eq!(parse(b":\r\n"), Err(RespError::BadNumber(1)));
        assert_eq!(parse(b":+1\r\n"), Err(RespError::BadNumber(1)));
        assert_eq!(parse(b"$-2\r\n"), Err(RespError::BadNumber(1)));
        assert_eq!(parse(b"$1\r\nabc\r\n"), Err(RespError::MissingCrlf(5)));
        assert_eq!(parse(b"+OK\rx\n"), Err(RespError::MissingCrlf(3)));
        assert_eq!(parse(b":1\r\n:2\r\n"), Err(RespError::TrailingBytes(4)));
        assert_eq!(
            parse(b":99999999999999999999\r\n"),
            Err(RespError::BadNumber(1))
        );
    }

    #[test]
    fn limits_bound_depth_count_and_size() {
        let tight = Limits {
            max_depth: 2,
            max_elements: 2,
            max_bulk: 4,
        };
        assert_eq!(
            decode(b"*1\r\n*1\r\n*1\r\n:1\r\n", &tight),
            Err(RespError::TooDeep)
        );
        assert_eq!(
            decode(b"*3\r\n:1\r\n:2\r\n:3\r\n", &tight),
            Err(RespError::TooManyElements)
        );
        assert_eq!(
            decode(b"$5\r\nabcde\r\n", &tight),
            Err(RespError::BulkTooLarge)
        );
        // a huge claimed count with little input: no allocation of that size, just Incomplete
        assert_eq!(
            decode(b"*4000\r\n:1\r\n", &Limits::default()),
            Err(RespError::Incomplete)
        );
        assert_eq!(
            decode(b"$9223372036854775807\r\n", &Limits::default()),
            Err(RespError::BulkTooLarge)
        );
        assert_eq!(
            decode(b"*9223372036854775807\r\n", &Limits::default()),
            Err(RespError::TooManyElements)
        );
    }

    #[test]
    fn errors_never_echo_content() {
        let err = parse(b"$3\r\nsecretXX").unwrap_err();
        assert!(!err.to_string().contains("secret"));
    }

    #[cfg(not(target_arch = "wasm32"))]
    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        fn reply() -> impl Strategy<Value = Reply> {
            let leaf = prop_oneof![
                "[a-zA-Z0-9 ]{0,12}".prop_map(Reply::Simple),
                "[a-zA-Z0-9 ]{0,12}".prop_map(Reply::Error),
                any::<i64>().prop_map(Reply::Integer),
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..24))
                    .prop_map(Reply::Bulk),
            ];
            leaf.prop_recursive(4, 32, 6, |inner| {
                proptest::option::of(proptest::collection::vec(inner, 0..6)).prop_map(Reply::Array)
            })
        }

        fn encode(reply: &Reply, out: &mut Vec<u8>) {
            match reply {
                Reply::Simple(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
                Reply::Error(s) => out.extend_from_slice(format!("-{s}\r\n").as_bytes()),
                Reply::Integer(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
                Reply::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
                Reply::Bulk(Some(b)) => {
                    out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                    out.extend_from_slice(b);
                    out.extend_from_slice(b"\r\n");
                }
                Reply::Array(None) => out.extend_from_slice(b"*-1\r\n"),
                Reply::Array(Some(items)) => {
                    out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                    for item in items {
                        encode(item, out);
                    }
                }
            }
        }

        proptest! {
            #[test]
            fn decode_inverts_encode(reply in reply()) {
                let mut bytes = Vec::new();
                encode(&reply, &mut bytes);
                prop_assert_eq!(decode(&bytes, &Limits::default()), Ok(reply));
                // every strict prefix is incomplete, never a wrong reply or a panic
                for cut in 0..bytes.len() {
                    prop_assert_eq!(
                        decode_prefix(&bytes[..cut], &Limits::default()).map(|(r, _)| r),
                        Err(RespError::Incomplete)
                    );
                }
            }

            #[test]
            fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
                let _ = decode(&bytes, &Limits::default());
            }

            #[test]
            fn commands_decode_as_bulk_arrays(args in proptest::collection::vec(
                proptest::collection::vec(any::<u8>(), 0..20), 0..6)) {
                let bytes = encode_command(&args);
                let expected = Reply::Array(Some(args.into_iter().map(|a| Reply::Bulk(Some(a))).collect()));
                prop_assert_eq!(decode(&bytes, &Limits::default()), Ok(expected));
            }
        }
    }
}
