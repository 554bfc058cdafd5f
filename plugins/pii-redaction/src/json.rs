//! A linear, validating JSON walk that reports every scalar with its path and byte span, and
//! splices replacements into the original bytes.
//!
//! The plugin rewrites a few string values deep inside request bodies and SSE events; a tree
//! round trip through `serde_json::Value` would reorder keys and reformat numbers. Here the
//! bytes outside the edited strings stay exactly as they were. Depth is bounded, every byte is
//! looked at a constant number of times, and nothing panics on input.

use std::fmt;
use std::ops::Range;

/// Nesting allowed before the walk gives up (the stack stays small inside wasm).
pub const MAX_DEPTH: usize = 64;

/// One step of a path: an object member or an array element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    /// Member name (decoded).
    Key(String),
    /// Array position.
    Index(usize),
}

impl Seg {
    /// The member name, if this step is one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Seg::Key(k) => Some(k),
            Seg::Index(_) => None,
        }
    }
}

/// What a scalar is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar {
    /// A string; its span includes the quotes.
    String,
    /// A number.
    Number,
    /// `true` or `false`.
    Bool,
    /// `null`.
    Null,
    /// The opening `{` or `[` of a container (span: that one byte), before its contents.
    Open,
}

/// Why a document is not JSON. Names a position and a reason, never content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    /// Byte offset.
    pub at: usize,
    /// What was expected.
    pub reason: &'static str,
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid JSON at byte {}: {}", self.at, self.reason)
    }
}

impl std::error::Error for JsonError {}

/// The callback of [`walk`]: path, kind and byte span of one scalar (or container opening).
pub type Visit<'v> = dyn FnMut(&[Seg], Scalar, Range<usize>) + 'v;

/// Walks the one JSON value that `body` must be (whitespace around it allowed) and calls
/// `visit(path, kind, span)` for every scalar, in document order.
pub fn walk(body: &[u8], visit: &mut Visit<'_>) -> Result<(), JsonError> {
    let mut walker = Walker {
        b: body,
        i: 0,
        path: Vec::new(),
        visit,
    };
    walker.ws();
    walker.value(0)?;
    walker.ws();
    if walker.i != body.len() {
        return Err(walker.err("end of document"));
    }
    Ok(())
}

struct Walker<'a, 'v> {
    b: &'a [u8],
    i: usize,
    path: Vec<Seg>,
    visit: &'v mut Visit<'v>,
}

impl Walker<'_, '_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn err(&self, reason: &'static str) -> JsonError {
        JsonError { at: self.i, reason }
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn value(&mut self, depth: usize) -> Result<(), JsonError> {
        if depth >= MAX_DEPTH {
            return Err(self.err("nesting too deep"));
        }
        let start = self.i;
        match self.peek() {
            Some(b'{') => {
                (self.visit)(&self.path, Scalar::Open, start..start + 1);
                self.object(depth)
            }
            Some(b'[') => {
                (self.visit)(&self.path, Scalar::Open, start..start + 1);
                self.array(depth)
            }
            Some(b'"') => {
                self.string()?;
                (self.visit)(&self.path, Scalar::String, start..self.i);
                Ok(())
            }
            Some(b't') => self.literal(b"true", Scalar::Bool),
            Some(b'f') => self.literal(b"false", Scalar::Bool),
            Some(b'n') => self.literal(b"null", Scalar::Null),
            Some(b'-' | b'0'..=b'9') => {
                self.number()?;
                (self.visit)(&self.path, Scalar::Number, start..self.i);
                Ok(())
            }
            _ => Err(self.err("a value")),
        }
    }

    fn literal(&mut self, word: &'static [u8], kind: Scalar) -> Result<(), JsonError> {
        let start = self.i;
        if self.b.get(start..start + word.len()) != Some(word) {
            return Err(self.err("a literal"));
        }
        self.i += word.len();
        (self.visit)(&self.path, kind, start..self.i);
        Ok(())
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> Result<(), JsonError> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.err("a digit")),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return Err(self.err("a digit after '.'"));
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(self.err("an exponent"));
            }
        }
        Ok(())
    }

    /// Skips a string literal (validating escapes and UTF-8 as it goes).
    fn string(&mut self) -> Result<(), JsonError> {
        let start = self.i;
        self.i += 1; // the opening quote
        loop {
            // skip plain bytes in one tight loop
            let plain = self
                .b
                .get(self.i..)
                .unwrap_or_default()
                .iter()
                .position(|&c| c == b'"' || c == b'\\' || c < 0x20);
            match plain {
                Some(n) => self.i += n,
                None => self.i = self.b.len(),
            }
            match self.peek() {
                None => return Err(self.err("end of string")),
                Some(b'"') => {
                    self.i += 1;
                    break;
                }
                Some(b'\\') => {
                    self.i += 1;
                    match self.peek() {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.i += 1,
                        Some(b'u') => {
                            let hex = self.b.get(self.i + 1..self.i + 5);
                            if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                                return Err(self.err("four hex digits"));
                            }
                            self.i += 5;
                        }
                        _ => return Err(self.err("an escape")),
                    }
                }
                Some(0..=0x1f) => return Err(self.err("no control character in a string")),
                Some(_) => self.i += 1,
            }
        }
        let inner = self.b.get(start + 1..self.i - 1).unwrap_or_default();
        if std::str::from_utf8(inner).is_err() {
            return Err(JsonError {
                at: start,
                reason: "UTF-8 in a string",
            });
        }
        Ok(())
    }

    fn object(&mut self, depth: usize) -> Result<(), JsonError> {
        self.i += 1;
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            return Ok(());
        }
        loop {
            if self.peek() != Some(b'"') {
                return Err(self.err("a member name"));
            }
            let key_start = self.i;
            self.string()?;
            let raw = self.b.get(key_start..self.i).unwrap_or_default();
            let key = decode_string(raw).unwrap_or_default();
            self.ws();
            if self.peek() != Some(b':') {
                return Err(self.err("':'"));
            }
            self.i += 1;
            self.ws();
            self.path.push(Seg::Key(key));
            self.value(depth + 1)?;
            self.path.pop();
            self.ws();
            match self.peek() {
                Some(b',') => {
                    self.i += 1;
                    self.ws();
                }
                Some(b'}') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(self.err("',' or '}'")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<(), JsonError> {
        self.i += 1;
        self.ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            return Ok(());
        }
        let mut index = 0;
        loop {
            self.path.push(Seg::Index(index));
            self.value(depth + 1)?;
            self.path.pop();
            index += 1;
            self.ws();
            match self.peek() {
                Some(b',') => {
                    self.i += 1;
                    self.ws();
                }
                Some(b']') => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(self.err("',' or ']'")),
            }
        }
    }
}

/// Decodes a string literal (quotes included) that [`walk`] accepted. `None` if it is not one
/// (a lone surrogate escape decodes to U+FFFD, as browsers do).
pub fn decode_string(raw: &[u8]) -> Option<String> {
    let inner = raw.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    let text = std::str::from_utf8(inner).ok()?;
    if !text.contains('\\') {
        return Some(text.to_owned());
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next()? {
            '"' => out.push('"'),
            '\\' => out.push('\\'),
            '/' => out.push('/'),
            'b' => out.push('\u{8}'),
            'f' => out.push('\u{c}'),
            'n' => out.push('\n'),
            'r' => out.push('\r'),
            't' => out.push('\t'),
            'u' => {
                let high = hex4(&mut chars)?;
                let code = if (0xD800..0xDC00).contains(&high) {
                    // a high surrogate: a low one should follow as another \u escape
                    let rest = chars.as_str();
                    match rest.strip_prefix("\\u").and_then(|r| r.get(..4)) {
                        Some(h) => match u32::from_str_radix(h, 16) {
                            Ok(low) if (0xDC00..0xE000).contains(&low) => {
                                chars.nth(5);
                                0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
                            }
                            _ => 0xFFFD,
                        },
                        None => 0xFFFD,
                    }
                } else {
                    high
                };
                out.push(char::from_u32(code).unwrap_or('\u{FFFD}'));
            }
            _ => return None,
        }
    }
    Some(out)
}

fn hex4(chars: &mut std::str::Chars<'_>) -> Option<u32> {
    let mut v = 0u32;
    for _ in 0..4 {
        v = v * 16 + chars.next()?.to_digit(16)?;
    }
    Some(v)
}

/// Appends the JSON string literal of `s` (with quotes).
pub fn push_quoted(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    push_escaped(out, s);
    out.push(b'"');
}

/// Appends `s` escaped for the inside of a JSON string literal (no quotes).
pub fn push_escaped(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(bytes.get(start..i).unwrap_or_default());
        if esc.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX.get(usize::from(b >> 4)).copied().unwrap_or(b'0'));
            out.push(HEX.get(usize::from(b & 15)).copied().unwrap_or(b'0'));
        } else {
            out.extend_from_slice(esc);
        }
        start = i + 1;
    }
    out.extend_from_slice(bytes.get(start..).unwrap_or_default());
}

/// The JSON string literal of `s`.
pub fn quote(s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len() + 2);
    push_quoted(&mut out, s);
    out
}

/// Replaces the given spans of `body` (sorted by start, not overlapping) with new bytes.
pub fn splice(body: &[u8], edits: &[(Range<usize>, Vec<u8>)]) -> Vec<u8> {
    let extra: usize = edits.iter().map(|(_, v)| v.len()).sum();
    let mut out = Vec::with_capacity(body.len() + extra);
    let mut at = 0;
    for (span, bytes) in edits {
        if span.start < at {
            continue; // overlapping edit: the caller's bug, never worth a trap
        }
        out.extend_from_slice(body.get(at..span.start).unwrap_or_default());
        out.extend_from_slice(bytes);
        at = span.end;
    }
    out.extend_from_slice(body.get(at..).unwrap_or_default());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaves(doc: &str) -> Result<Vec<(String, Scalar, String)>, JsonError> {
        let mut out = Vec::new();
        walk(doc.as_bytes(), &mut |path, kind, span| {
            let p: Vec<String> = path
                .iter()
                .map(|s| match s {
                    Seg::Key(k) => k.clone(),
                    Seg::Index(i) => i.to_string(),
                })
                .collect();
            out.push((p.join("."), kind, doc[span].to_string()));
        })?;
        Ok(out)
    }

    #[test]
    fn walks_scalars_with_paths() {
        let got = leaves(r#" {"a":[1,"x\"y",{"b":null}],"c":true, "d":-1.5e3} "#).unwrap();
        let got: Vec<_> = got.into_iter().filter(|l| l.1 != Scalar::Open).collect();
        assert_eq!(
            got,
            vec![
                ("a.0".into(), Scalar::Number, "1".into()),
                ("a.1".into(), Scalar::String, r#""x\"y""#.into()),
                ("a.2.b".into(), Scalar::Null, "null".into()),
                ("c".into(), Scalar::Bool, "true".into()),
                ("d".into(), Scalar::Number, "-1.5e3".into()),
            ]
        );
    }

    #[test]
    fn refuses_what_is_not_json() {
        for bad in [
            "",
            "{",
            "{\"a\"}",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1.",
            "\"\\x\"",
            "\"a\nb\"",
            "[] x",
            "nul",
            "\"\\u12\"",
        ] {
            assert!(leaves(bad).is_err(), "{bad:?}");
        }
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert!(leaves(&deep).is_err());
        let ok = "[".repeat(MAX_DEPTH - 1) + &"]".repeat(MAX_DEPTH - 1);
        assert!(leaves(&ok).is_ok());
        assert!(walk(b"\"\xff\"", &mut |_, _, _| {}).is_err());
    }

    #[test]
    fn strings_round_trip() {
        for s in ["", "plain", "q\"b\\s/\n\r\t\u{1}", "漢字 😀", "\u{7f}"] {
            let quoted = quote(s);
            assert_eq!(decode_string(&quoted).as_deref(), Some(s));
            let parsed: String = serde_json::from_slice(&quoted).unwrap();
            assert_eq!(parsed, s);
        }
        assert_eq!(
            decode_string(br#""\ud83d\ude00 \u00e9 \ud800x""#).as_deref(),
            Some("😀 é \u{FFFD}x")
        );
    }

    #[test]
    fn splice_replaces_spans() {
        let body = b"0123456789";
        let out = splice(body, &[(1..3, b"ab".to_vec()), (5..5, b"X".to_vec())]);
        assert_eq!(out, b"0ab34X56789");
    }
}
