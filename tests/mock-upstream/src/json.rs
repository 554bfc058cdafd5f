//! Tiny helpers to write JSON and SSE straight into a `String` (no JSON tree for answers).

use bytes::Bytes;

/// `write!` into a `String`; formatting into a `String` cannot fail.
macro_rules! w {
    ($buf:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = write!($buf, $($arg)*);
    }};
}
pub(crate) use w;

/// Appends `s` as a JSON string literal (with the quotes).
pub(crate) fn push_str_lit(buf: &mut String, s: &str) {
    buf.reserve(s.len() + 2);
    buf.push('"');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape: Option<&str> = match b {
            b'"' => Some("\\\""),
            b'\\' => Some("\\\\"),
            b'\n' => Some("\\n"),
            b'\r' => Some("\\r"),
            b'\t' => Some("\\t"),
            0..=0x1f => None,
            _ => continue,
        };
        // `i` is the index of an ASCII byte, so both slices are on char boundaries.
        buf.push_str(&s[start..i]);
        match escape {
            Some(e) => buf.push_str(e),
            None => w!(buf, "\\u{:04x}", b),
        }
        start = i + 1;
    }
    buf.push_str(&s[start..]);
    buf.push('"');
}

/// Returns `s` as a JSON string literal.
pub(crate) fn str_lit(s: &str) -> String {
    let mut buf = String::new();
    push_str_lit(&mut buf, s);
    buf
}

/// The text of token `i`: `tok{i} `.
pub(crate) fn push_token(buf: &mut String, i: u64) {
    w!(buf, "tok{i} ");
}

/// The whole completion text: `tok0 tok1 … tok{n-1} `.
pub(crate) fn push_tokens(buf: &mut String, n: u64) {
    buf.reserve(usize::try_from(n).unwrap_or(0).saturating_mul(8));
    for i in 0..n {
        push_token(buf, i);
    }
}

/// Characters per piece of an echoed completion (small, so that a word spans several deltas).
pub(crate) const ECHO_PIECE_CHARS: usize = 3;

/// The completion text: `tok{i} ` tokens, or (`x-mock-echo`) the last user message cut into
/// pieces of [`ECHO_PIECE_CHARS`] characters, one piece per delta.
pub(crate) enum Completion {
    Tokens,
    Echo(Vec<String>),
}

impl Completion {
    pub(crate) fn new(echo: bool, text: &str) -> Completion {
        if !echo {
            return Completion::Tokens;
        }
        let chars: Vec<char> = text.chars().collect();
        Completion::Echo(
            chars
                .chunks(ECHO_PIECE_CHARS)
                .map(|c| c.iter().collect())
                .collect(),
        )
    }

    /// Number of pieces under the request's cap, and whether the cap cut them short.
    pub(crate) fn count(&self, knobs: &crate::knobs::Knobs, cap: Option<u64>) -> (u64, bool) {
        match self {
            Completion::Tokens => knobs.completion(cap),
            Completion::Echo(pieces) => {
                let len = pieces.len() as u64;
                match cap {
                    Some(cap) if cap < len => (cap, true),
                    _ => (len, false),
                }
            }
        }
    }

    /// Appends piece `i`, escaped for the inside of a JSON string.
    pub(crate) fn push(&self, buf: &mut String, i: u64) {
        match self {
            Completion::Tokens => push_token(buf, i),
            Completion::Echo(pieces) => {
                let piece = usize::try_from(i)
                    .ok()
                    .and_then(|i| pieces.get(i))
                    .map_or("", String::as_str);
                let lit = str_lit(piece);
                buf.push_str(&lit[1..lit.len() - 1]);
            }
        }
    }

    /// Appends pieces `0..n`.
    pub(crate) fn push_all(&self, buf: &mut String, n: u64) {
        match self {
            Completion::Tokens => push_tokens(buf, n),
            Completion::Echo(_) => (0..n).for_each(|i| self.push(buf, i)),
        }
    }
}

/// A server-sent-events stream being built in one buffer, remembering where each event ends.
pub(crate) struct Sse {
    buf: String,
    ends: Vec<usize>,
}

impl Sse {
    pub(crate) fn new(events_hint: u64) -> Sse {
        let events = usize::try_from(events_hint).unwrap_or(0);
        Sse {
            buf: String::with_capacity(events.saturating_mul(160)),
            ends: Vec::with_capacity(events),
        }
    }

    /// Appends `event: NAME\n` (when `name` is given), `data: `, whatever `data` writes, and
    /// the blank line ending the event.
    pub(crate) fn event(&mut self, name: Option<&str>, data: impl FnOnce(&mut String)) {
        if let Some(name) = name {
            self.buf.push_str("event: ");
            self.buf.push_str(name);
            self.buf.push('\n');
        }
        self.buf.push_str("data: ");
        data(&mut self.buf);
        self.buf.push_str("\n\n");
        self.ends.push(self.buf.len());
    }

    /// The stream, and the end offset of each event.
    pub(crate) fn finish(self) -> (Bytes, Vec<usize>) {
        (Bytes::from(self.buf), self.ends)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_literals_round_trip() {
        for s in [
            "",
            "plain",
            "quote \" backslash \\ newline \n tab \t cr \r",
            "ctl \u{1} \u{1f} del \u{7f}",
            "unicode é 漢字 🚀",
        ] {
            let lit = str_lit(s);
            let back: String = serde_json::from_str(&lit).expect("valid JSON string");
            assert_eq!(back, s);
        }
    }

    #[test]
    fn echo_pieces() {
        let c = Completion::new(true, "ab\"c漢字x");
        let mut b = String::new();
        c.push_all(&mut b, 3);
        assert_eq!(b, "ab\\\"c漢字x");
        let mut first = String::new();
        c.push(&mut first, 0);
        assert_eq!(first, "ab\\\"");
        assert_eq!(c.count(&crate::knobs::Knobs::default(), None), (3, false));
        assert_eq!(c.count(&crate::knobs::Knobs::default(), Some(1)), (1, true));
    }

    #[test]
    fn tokens() {
        let mut s = String::new();
        push_tokens(&mut s, 3);
        assert_eq!(s, "tok0 tok1 tok2 ");
    }

    #[test]
    fn sse_offsets() {
        let mut sse = Sse::new(2);
        sse.event(Some("a"), |b| b.push_str("{}"));
        sse.event(None, |b| b.push_str("[DONE]"));
        let (bytes, ends) = sse.finish();
        assert_eq!(&bytes[..], b"event: a\ndata: {}\n\ndata: [DONE]\n\n");
        assert_eq!(ends, vec![19, 33]);
    }
}
