//! Reading and editing the top level of a JSON request body without parsing all of it.
//!
//! An LLM request is a small object whose bulk is nested (`messages`, `input`, `tools`). The
//! plugins need a few top-level members (`model`, `stream`, `max_tokens`) and sometimes change
//! one. [`scan_object`] validates the whole document in one linear pass — so a malformed body is
//! refused exactly like a full parser would refuse it — but keeps only the positions of the
//! top-level members; nothing nested is allocated. [`Edits`] then splices new values into the
//! original bytes, so the nested content reaches the provider byte for byte as the client sent
//! it.
//!
//! [`walk`] is the same pass for filters that rewrite strings deep inside a body (PII redaction):
//! it reports every scalar with its path and byte span, and [`splice`] puts replacements in.
//!
//! Grammar: RFC 8259, UTF-8 only, nesting bounded by [`Limits::max_depth`] (recursion is
//! bounded, so hostile nesting is an error rather than a stack overflow). Duplicate keys: like
//! `serde_json`, the last one wins for reading; [`Edits::set`] and [`Edits::remove`] act on every
//! duplicate, so no copy the gateway did not check can reach a provider whose parser prefers
//! the first.

use std::fmt;
use std::ops::Range;

/// Bounds on what [`scan_object`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Deepest nesting of objects and arrays; the top-level object is depth 1.
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_depth: 64 }
    }
}

/// The type of a JSON value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    String,
    Number,
    Bool,
    Null,
    Object,
    Array,
}

/// Why a document was refused, and where. Never quotes the document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonError {
    /// Byte offset of the problem.
    pub at: usize,
    /// What is wrong there.
    pub reason: &'static str,
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid JSON at byte {}: {}", self.at, self.reason)
    }
}

impl std::error::Error for JsonError {}

/// One top-level member of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The key, unescaped.
    pub key: String,
    /// The key's bytes, quotes included.
    pub key_span: Range<usize>,
    /// The value's bytes.
    pub value: Range<usize>,
    /// The value's type.
    pub kind: Kind,
}

/// The top level of a JSON object: its members in document order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    members: Vec<Member>,
    /// Offset of the closing `}`.
    close: usize,
}

/// One element of a JSON array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    /// The element's bytes.
    pub value: Range<usize>,
    /// The element's type.
    pub kind: Kind,
}

/// Validates `body` as one JSON object (whitespace around it allowed) and returns its
/// top-level members.
pub fn scan_object(body: &[u8], limits: &Limits) -> Result<Object, JsonError> {
    scan_object_text(utf8(body)?, limits)
}

/// [`scan_object`] of a body already known to be UTF-8 (it is not validated again): for a
/// caller that also reads the body as text, so that it is validated once.
pub fn scan_object_text(body: &str, limits: &Limits) -> Result<Object, JsonError> {
    let body = body.as_bytes();
    let mut s = Scanner::new(body, limits.max_depth);
    s.skip_ws();
    if s.peek() != Some(b'{') {
        return Err(s.error("expected an object"));
    }
    let object = s.object(1, true)?;
    s.end()?;
    Ok(object)
}

/// Validates `body` as one JSON array and returns its elements.
pub fn scan_array(body: &[u8], limits: &Limits) -> Result<Vec<Element>, JsonError> {
    check_utf8(body)?;
    let mut s = Scanner::new(body, limits.max_depth);
    s.skip_ws();
    if s.peek() != Some(b'[') {
        return Err(s.error("expected an array"));
    }
    let elements = s.array(1, true)?;
    s.end()?;
    Ok(elements)
}

/// Validates `body` as one JSON value of any type and returns its type.
pub fn scan_value(body: &[u8], limits: &Limits) -> Result<Kind, JsonError> {
    check_utf8(body)?;
    let mut s = Scanner::new(body, limits.max_depth);
    s.skip_ws();
    let kind = s.value(1)?;
    s.end()?;
    Ok(kind)
}

/// One step of a [`walk`] path: an object member or an array element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    /// Member name (decoded, lossily: see [`decode_lossy`]).
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

/// What [`walk`] reports.
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

/// The callback of [`walk`]: path, kind and byte span of one scalar (or container opening).
pub type Visit<'v> = dyn FnMut(&[Seg], Scalar, Range<usize>) + 'v;

/// Validates `body` as one JSON value, like [`scan_value`], and calls `visit(path, kind,
/// span)` for every scalar and container opening, in document order.
pub fn walk(body: &[u8], limits: &Limits, visit: &mut Visit<'_>) -> Result<(), JsonError> {
    check_utf8(body)?;
    let mut s = Scanner::new(body, limits.max_depth);
    s.visit = Some(visit);
    s.skip_ws();
    s.value(1)?;
    s.end()
}

/// One step of a [`walk_raw`] path: an object member's name as it stands in the body (quotes
/// and escapes included, not decoded), or an array position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawSeg<'b> {
    /// Member name, the raw string literal (quotes included).
    Key(&'b [u8]),
    /// Array position.
    Index(usize),
}

impl RawSeg<'_> {
    /// True if this step is a member whose decoded name (as [`Seg::Key`] holds it) is `name`;
    /// decodes only a name with an escape.
    pub fn key_is(&self, name: &str) -> bool {
        let RawSeg::Key(raw) = self else {
            return false;
        };
        let inner = raw.get(1..raw.len().saturating_sub(1)).unwrap_or_default();
        if inner.contains(&b'\\') {
            decode_lossy(raw).unwrap_or_default() == name
        } else {
            inner == name.as_bytes()
        }
    }
}

/// The callback of [`walk_raw`]: raw path, kind and byte span of one scalar (or opening).
pub type RawVisit<'v> = dyn for<'p> FnMut(&[RawSeg<'p>], Scalar, Range<usize>) + 'v;

/// Like [`walk`] (same validation, same calls in the same order), but the path holds member
/// names as raw slices of `body` instead of decoded copies: no allocation per member.
pub fn walk_raw(body: &[u8], limits: &Limits, visit: &mut RawVisit<'_>) -> Result<(), JsonError> {
    check_utf8(body)?;
    let mut s = Scanner::new(body, limits.max_depth);
    s.raw_visit = Some(visit);
    s.skip_ws();
    s.value(1)?;
    s.end()
}

/// Replaces the given spans of `body` (sorted by start, not overlapping; an overlapping one is
/// skipped) with new bytes.
pub fn splice(body: &[u8], edits: &[(Range<usize>, Vec<u8>)]) -> Vec<u8> {
    let extra: usize = edits.iter().map(|(_, v)| v.len()).sum();
    let mut out = Vec::with_capacity(body.len() + extra);
    let mut at = 0;
    for (span, bytes) in edits {
        if span.start < at {
            continue;
        }
        out.extend_from_slice(body.get(at..span.start).unwrap_or_default());
        out.extend_from_slice(bytes);
        at = span.end;
    }
    out.extend_from_slice(body.get(at..).unwrap_or_default());
    out
}

impl Object {
    /// The member named `key` (the last one when the key is repeated).
    pub fn get(&self, key: &str) -> Option<&Member> {
        self.members.iter().rev().find(|m| m.key == key)
    }

    /// All members in document order, duplicates included.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The raw bytes of member `key`'s value.
    pub fn raw<'b>(&self, body: &'b [u8], key: &str) -> Option<&'b [u8]> {
        self.get(key).and_then(|m| body.get(m.value.clone()))
    }

    /// The string value of `key`, unescaped; `Err` when the member is not a string.
    pub fn str(&self, body: &[u8], key: &str) -> Result<Option<String>, JsonError> {
        let Some(member) = self.get(key) else {
            return Ok(None);
        };
        if member.kind != Kind::String {
            return Err(JsonError {
                at: member.value.start,
                reason: "expected a string",
            });
        }
        let raw = body.get(member.value.clone()).ok_or(JsonError {
            at: member.value.start,
            reason: "span outside the document",
        })?;
        unescape(raw, member.value.start).map(Some)
    }

    /// The value of `key` as a non-negative integer; `Err` for any other number or type.
    pub fn u64(&self, body: &[u8], key: &str) -> Result<Option<u64>, JsonError> {
        let Some(member) = self.get(key) else {
            return Ok(None);
        };
        let not_u64 = JsonError {
            at: member.value.start,
            reason: "expected a non-negative integer",
        };
        if member.kind != Kind::Number {
            return Err(not_u64);
        }
        let raw = body.get(member.value.clone()).ok_or(not_u64)?;
        let text = std::str::from_utf8(raw).map_err(|_| not_u64)?;
        text.parse::<u64>().map(Some).map_err(|_| not_u64)
    }

    /// The value of `key` as a boolean; `Err` for any other type.
    pub fn bool(&self, body: &[u8], key: &str) -> Result<Option<bool>, JsonError> {
        let Some(member) = self.get(key) else {
            return Ok(None);
        };
        match body.get(member.value.clone()) {
            Some(b"true") => Ok(Some(true)),
            Some(b"false") => Ok(Some(false)),
            _ => Err(JsonError {
                at: member.value.start,
                reason: "expected a boolean",
            }),
        }
    }
}

/// Changes to the top level of an object, applied to the original bytes by [`Edits::finish`].
#[derive(Debug)]
pub struct Edits<'a> {
    body: &'a [u8],
    object: &'a Object,
    /// (range replaced, replacement), kept in the order given; ranges never overlap.
    splices: Vec<(Range<usize>, Vec<u8>)>,
    /// Members appended before the closing brace, as `"key":value`.
    appended: Vec<Vec<u8>>,
    /// Members already removed (indexes into `object.members`).
    removed: Vec<bool>,
}

impl<'a> Edits<'a> {
    /// Starts editing `object`, which [`scan_object`] returned for `body`.
    pub fn new(body: &'a [u8], object: &'a Object) -> Self {
        Edits {
            body,
            object,
            splices: Vec::new(),
            appended: Vec::new(),
            removed: vec![false; object.members.len()],
        }
    }

    /// Sets member `key` to `raw_value` (JSON text, not checked): replaces the last member
    /// of that name and removes earlier duplicates, or appends the member when absent.
    pub fn set(&mut self, key: &str, raw_value: Vec<u8>) -> &mut Self {
        let live = |edits: &Self, i: usize| {
            !edits.removed.get(i).copied().unwrap_or(true)
                && edits.object.members.get(i).is_some_and(|m| m.key == key)
        };
        let last = (0..self.object.members.len())
            .rev()
            .find(|i| live(self, *i));
        match last {
            Some(index) => {
                for earlier in 0..index {
                    if live(self, earlier) {
                        self.remove_index(earlier);
                    }
                }
                self.replace_value(index, raw_value);
            }
            None => match self.appended_value(key) {
                Some(pending) => *pending = member_bytes(key, &raw_value),
                None => self.appended.push(member_bytes(key, &raw_value)),
            },
        }
        self
    }

    /// Removes every member named `key`.
    pub fn remove(&mut self, key: &str) -> &mut Self {
        for index in 0..self.object.members.len() {
            if self.object.members.get(index).is_some_and(|m| m.key == key) {
                self.remove_index(index);
            }
        }
        let prefix = member_bytes(key, b"");
        self.appended.retain(|member| !member.starts_with(&prefix));
        self
    }

    /// The edited document.
    pub fn finish(mut self) -> Vec<u8> {
        let members = &self.object.members;
        let is_kept = |i: usize| !self.removed.get(i).copied().unwrap_or(false);
        let kept = (0..members.len()).filter(|i| is_kept(*i)).count();
        // Removals: a removed member takes one separating comma with it.
        for (index, member) in members.iter().enumerate() {
            if is_kept(index) {
                continue;
            }
            let next_kept = members
                .iter()
                .enumerate()
                .skip(index + 1)
                .find(|(i, _)| is_kept(*i));
            let previous_kept = members
                .iter()
                .enumerate()
                .take(index)
                .rev()
                .find(|(i, _)| is_kept(*i));
            let range = match (next_kept, previous_kept) {
                // Up to the next kept member: this member and the comma after it.
                (Some((_, next)), _) => member.key_span.start..next.key_span.start,
                // Trailing: the comma before this member, after the last kept one.
                (None, Some((_, previous))) => previous.value.end..member.value.end,
                // Nothing kept: up to the next (removed) member, or to this value's end.
                (None, None) => match members.get(index + 1) {
                    Some(next) => member.key_span.start..next.key_span.start,
                    None => member.key_span.start..member.value.end,
                },
            };
            self.splices.push((range, Vec::new()));
        }
        // Appends go before the closing brace.
        if !self.appended.is_empty() {
            let mut tail = Vec::new();
            for (i, member) in self.appended.iter().enumerate() {
                if i > 0 || kept > 0 {
                    tail.push(b',');
                }
                tail.extend_from_slice(member);
            }
            // Insert right after the last kept member's value (or after `{`), so the trailing
            // whitespace of the original stays where it was.
            let at = members
                .iter()
                .enumerate()
                .rev()
                .find(|(i, _)| is_kept(*i))
                .map(|(_, m)| m.value.end)
                .unwrap_or_else(|| open_brace_end(self.body, self.object.close));
            self.splices.push((at..at, tail));
        }
        // Splices never overlap except removals of neighbours, which are merged by sorting and
        // skipping what an earlier splice already covered.
        self.splices
            .sort_by(|a, b| a.0.start.cmp(&b.0.start).then(a.0.end.cmp(&b.0.end)));
        let extra: usize = self.splices.iter().map(|(_, r)| r.len()).sum();
        let mut out = Vec::with_capacity(self.body.len() + extra);
        let mut at = 0;
        for (range, replacement) in &self.splices {
            if range.start < at {
                // Covered by the previous splice (adjacent removals).
                let start = at.max(range.start);
                if range.end > start {
                    at = range.end;
                }
                out.extend_from_slice(replacement);
                continue;
            }
            out.extend_from_slice(self.body.get(at..range.start).unwrap_or_default());
            out.extend_from_slice(replacement);
            at = range.end;
        }
        out.extend_from_slice(self.body.get(at..).unwrap_or_default());
        out
    }

    fn remove_index(&mut self, index: usize) {
        if let Some(flag) = self.removed.get_mut(index) {
            *flag = true;
        }
        let Some(member) = self.object.members.get(index) else {
            return;
        };
        let value = member.value.clone();
        self.splices.retain(|(range, _)| *range != value);
    }

    /// Replaces member `index`'s value.
    fn replace_value(&mut self, index: usize, raw_value: Vec<u8>) {
        let Some(member) = self.object.members.get(index) else {
            return;
        };
        let value = member.value.clone();
        self.splices.retain(|(range, _)| *range != value);
        self.splices.push((value, raw_value));
    }

    fn appended_value(&mut self, key: &str) -> Option<&mut Vec<u8>> {
        let prefix = member_bytes(key, b"");
        self.appended
            .iter_mut()
            .find(|member| member.starts_with(&prefix))
    }
}

fn member_bytes(key: &str, raw_value: &[u8]) -> Vec<u8> {
    let mut member = quote(key).into_bytes();
    member.push(b':');
    member.extend_from_slice(raw_value);
    member
}

/// Offset just after the `{` that `close` closes (an empty object: `{` then whitespace).
fn open_brace_end(body: &[u8], close: usize) -> usize {
    let mut at = close;
    while at > 0 {
        at -= 1;
        if body.get(at) == Some(&b'{') {
            return at + 1;
        }
    }
    close
}

/// `s` as a JSON string literal, quotes included.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    escape_pieces(s, escape_of, &mut |piece| out.push_str(piece));
    out.push('"');
    out
}

/// Appends the JSON string literal of `s` (with quotes).
pub fn push_quoted(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    push_escaped(out, s);
    out.push(b'"');
}

/// Appends `s` escaped for the inside of a JSON string literal (no quotes).
pub fn push_escaped(out: &mut Vec<u8>, s: &str) {
    escape_pieces(s, escape_of, &mut |piece| {
        out.extend_from_slice(piece.as_bytes());
    });
}

/// `s` escaped for the inside of a JSON string literal, in pieces: runs of `s` that need no
/// escape (found eight bytes at a time by [`plain_run`]) and the escapes of the bytes between
/// them, as `escape` writes them ([`escape_of`], [`serde_escape_of`]). Every piece is a
/// `&str`: a run ends before an ASCII byte, on a character boundary.
fn escape_pieces(s: &str, escape: impl Fn(u8) -> &'static str, emit: &mut dyn FnMut(&str)) {
    let bytes = s.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        let run = plain_run(bytes.get(at..).unwrap_or_default());
        if run > 0 {
            emit(s.get(at..at + run).unwrap_or_default());
            at += run;
        }
        let Some(&byte) = bytes.get(at) else {
            break;
        };
        emit(escape(byte));
        at += 1;
    }
}

/// The JSON escape of a byte [`plain_run`] stops at: `"`, a backslash or a control character.
fn escape_of(byte: u8) -> &'static str {
    /// `\u00xx` of every control character (`\n`, `\r` and `\t` have short forms instead).
    const CONTROLS: [&str; 32] = [
        "\\u0000", "\\u0001", "\\u0002", "\\u0003", "\\u0004", "\\u0005", "\\u0006", "\\u0007",
        "\\u0008", "\\u0009", "\\u000a", "\\u000b", "\\u000c", "\\u000d", "\\u000e", "\\u000f",
        "\\u0010", "\\u0011", "\\u0012", "\\u0013", "\\u0014", "\\u0015", "\\u0016", "\\u0017",
        "\\u0018", "\\u0019", "\\u001a", "\\u001b", "\\u001c", "\\u001d", "\\u001e", "\\u001f",
    ];
    match byte {
        b'"' => "\\\"",
        b'\\' => "\\\\",
        b'\n' => "\\n",
        b'\r' => "\\r",
        b'\t' => "\\t",
        _ => CONTROLS.get(usize::from(byte)).copied().unwrap_or_default(),
    }
}

/// The escape `serde_json` writes for a byte [`plain_run`] stops at: [`escape_of`]'s, but
/// backspace and form feed in their short forms `\b` and `\f` (rather than `\u0008` and
/// `\u000c`).
fn serde_escape_of(byte: u8) -> &'static str {
    match byte {
        0x08 => "\\b",
        0x0c => "\\f",
        _ => escape_of(byte),
    }
}

/// Appends the JSON string literal of `s` (with quotes) byte for byte as `serde_json` writes
/// it: for records whose serde-written form readers already parse ([`ObjectWriter`]).
pub(crate) fn push_serde_quoted(out: &mut String, s: &str) {
    out.push('"');
    escape_pieces(s, serde_escape_of, &mut |piece| out.push_str(piece));
    out.push('"');
}

/// Appends the lowercase hex of `bytes` (two digits each, as `format!("{b:02x}")` writes them),
/// without the formatting machinery.
pub fn push_hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        for nibble in [b >> 4, b & 0xf] {
            out.push(char::from(
                DIGITS.get(usize::from(nibble)).copied().unwrap_or(b'0'),
            ));
        }
    }
}

/// Appends `n` in decimal, as `serde_json` (and `format!`) write it, without the formatting
/// machinery.
pub fn push_u64(out: &mut String, n: u64) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    let mut rest = n;
    loop {
        start -= 1;
        if let Some(slot) = digits.get_mut(start) {
            // `rest % 10` is below 10: the cast cannot truncate
            *slot = b'0' + (rest % 10) as u8;
        }
        rest /= 10;
        if rest == 0 || start == 0 {
            break;
        }
    }
    for &digit in digits.get(start..).unwrap_or_default() {
        out.push(char::from(digit));
    }
}

/// Writes one JSON object member by member in `serde_json`'s compact form (`{"a":1,"b":"x"}`,
/// no whitespace): the hand-written writers of the records other filters and the access log
/// parse ([`crate::route_info`], [`crate::usage_record`]), whose bytes must stay those the
/// serde derive wrote.
pub(crate) struct ObjectWriter<'o> {
    out: &'o mut String,
    empty: bool,
}

impl<'o> ObjectWriter<'o> {
    /// Writes the `{`.
    pub(crate) fn open(out: &'o mut String) -> Self {
        out.push('{');
        ObjectWriter { out, empty: true }
    }

    /// Writes the separator and `"name":`, and returns the output for the member's value.
    /// `name` is written as it is: a Rust field name, which needs no escape.
    pub(crate) fn member(&mut self, name: &str) -> &mut String {
        if !self.empty {
            self.out.push(',');
        }
        self.empty = false;
        self.out.push('"');
        self.out.push_str(name);
        self.out.push_str("\":");
        self.out
    }

    /// A string member.
    pub(crate) fn string(&mut self, name: &str, value: &str) {
        push_serde_quoted(self.member(name), value);
    }

    /// An optional string member: `null` when absent (serde's `Option` without
    /// `skip_serializing_if`).
    pub(crate) fn string_or_null(&mut self, name: &str, value: Option<&str>) {
        let out = self.member(name);
        match value {
            Some(value) => push_serde_quoted(out, value),
            None => out.push_str("null"),
        }
    }

    /// An unsigned integer member.
    pub(crate) fn u64(&mut self, name: &str, value: u64) {
        push_u64(self.member(name), value);
    }

    /// An optional unsigned integer member: `null` when absent.
    pub(crate) fn u64_or_null(&mut self, name: &str, value: Option<u64>) {
        let out = self.member(name);
        match value {
            Some(value) => push_u64(out, value),
            None => out.push_str("null"),
        }
    }

    /// A boolean member.
    pub(crate) fn bool(&mut self, name: &str, value: bool) {
        self.member(name)
            .push_str(if value { "true" } else { "false" });
    }

    /// An array of strings member.
    pub(crate) fn strings(&mut self, name: &str, values: &[String]) {
        let out = self.member(name);
        out.push('[');
        for (i, value) in values.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_serde_quoted(out, value);
        }
        out.push(']');
    }

    /// Writes the `}`.
    pub(crate) fn close(self) {
        self.out.push('}');
    }
}

/// Decodes a string literal (quotes included) that the scanner accepted, leniently: a lone
/// surrogate escape becomes U+FFFD (as browsers do), so a string can always be inspected.
/// `None` if `raw` is not a valid literal.
pub fn decode_lossy(raw: &[u8]) -> Option<String> {
    decode(raw, 0, true).ok()
}

/// The content of the JSON string literal `raw` (quotes included), unescaped. `offset` is
/// where `raw` starts in the document, for error positions.
pub fn unescape(raw: &[u8], offset: usize) -> Result<String, JsonError> {
    decode(raw, offset, false)
}

fn decode(raw: &[u8], offset: usize, lossy: bool) -> Result<String, JsonError> {
    let err = |at: usize, reason| JsonError {
        at: offset + at,
        reason,
    };
    let inner = match raw {
        [b'"', inner @ .., b'"'] => inner,
        _ => return Err(err(0, "expected a string")),
    };
    let text = std::str::from_utf8(inner).map_err(|e| err(1 + e.valid_up_to(), "invalid UTF-8"))?;
    if !text.contains('\\') {
        return Ok(text.to_owned());
    }
    let mut out = String::with_capacity(text.len());
    let bytes = inner;
    let mut i = 0;
    let mut plain_start = 0;
    while i < bytes.len() {
        if bytes.get(i) != Some(&b'\\') {
            i += 1;
            continue;
        }
        out.push_str(text.get(plain_start..i).unwrap_or_default());
        let escape = bytes.get(i + 1).copied();
        i += 2;
        match escape {
            Some(b'"') => out.push('"'),
            Some(b'\\') => out.push('\\'),
            Some(b'/') => out.push('/'),
            Some(b'b') => out.push('\u{8}'),
            Some(b'f') => out.push('\u{c}'),
            Some(b'n') => out.push('\n'),
            Some(b'r') => out.push('\r'),
            Some(b't') => out.push('\t'),
            Some(b'u') => {
                let high = hex4(bytes, i).ok_or_else(|| err(1 + i, "bad \\u escape"))?;
                i += 4;
                let low = match (bytes.get(i), bytes.get(i + 1)) {
                    (Some(b'\\'), Some(b'u')) => hex4(bytes, i + 2),
                    _ => None,
                }
                .filter(|low| (0xDC00..0xE000).contains(low));
                let code = match low {
                    Some(low) if (0xD800..0xDC00).contains(&high) => {
                        i += 6;
                        Some(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))
                    }
                    _ => char::from_u32(high).map(u32::from),
                };
                match code.and_then(char::from_u32) {
                    Some(c) => out.push(c),
                    None if lossy => out.push('\u{FFFD}'),
                    None => return Err(err(1 + i, "unpaired surrogate")),
                }
            }
            _ => return Err(err(i - 1, "bad escape")),
        }
        plain_start = i;
    }
    out.push_str(text.get(plain_start..).unwrap_or_default());
    Ok(out)
}

fn hex4(bytes: &[u8], at: usize) -> Option<u32> {
    let digits = bytes.get(at..at + 4)?;
    let text = std::str::from_utf8(digits).ok()?;
    if !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(text, 16).ok()
}

/// How many bytes at the start of `rest` are plain string content: neither `"`, a backslash
/// nor a control character (below 0x20). Eight bytes at a time: for each of the three, a
/// byte-wise "is this byte zero / below n" test on a whole word (the borrow of the subtraction
/// can flag bytes after a true match, never before one, so the lowest flag is the first
/// match). Bytes of 0x80 and above are never flagged (`!word` clears their high bit). Public
/// for code that skips the strings of a body already validated (model-router's upstream role).
#[inline]
pub fn plain_run(rest: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const QUOTES: u64 = ONES * b'"' as u64;
    const BACKSLASHES: u64 = ONES * b'\\' as u64;
    const CONTROLS: u64 = ONES * 0x20;
    let mut done = 0;
    let mut words = rest.chunks_exact(8);
    for chunk in words.by_ref() {
        let word = chunk.try_into().map_or(0, u64::from_le_bytes);
        let quote = word ^ QUOTES;
        let backslash = word ^ BACKSLASHES;
        let flags = (quote.wrapping_sub(ONES) & !quote
            | backslash.wrapping_sub(ONES) & !backslash
            | word.wrapping_sub(CONTROLS) & !word)
            & HIGH;
        if flags != 0 {
            return done + (flags.trailing_zeros() / 8) as usize;
        }
        done += 8;
    }
    let tail = words.remainder();
    done + tail
        .iter()
        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
        .unwrap_or(tail.len())
}

/// `body` as text; the error [`scan_object`] gives for a body that is not UTF-8.
pub fn utf8(body: &[u8]) -> Result<&str, JsonError> {
    std::str::from_utf8(body).map_err(|e| JsonError {
        at: e.valid_up_to(),
        reason: "invalid UTF-8",
    })
}

fn check_utf8(body: &[u8]) -> Result<(), JsonError> {
    utf8(body).map(|_| ())
}

struct Scanner<'b, 'v> {
    body: &'b [u8],
    at: usize,
    max_depth: usize,
    /// Set for [`walk`]: told of every scalar; `path` is then kept.
    visit: Option<&'v mut Visit<'v>>,
    path: Vec<Seg>,
    /// Set for [`walk_raw`]: told of every scalar; `raw_path` is then kept.
    raw_visit: Option<&'v mut RawVisit<'v>>,
    raw_path: Vec<RawSeg<'b>>,
}

impl<'b, 'v> Scanner<'b, 'v> {
    fn new(body: &'b [u8], max_depth: usize) -> Self {
        Scanner {
            body,
            at: 0,
            max_depth,
            visit: None,
            path: Vec::new(),
            raw_visit: None,
            raw_path: Vec::new(),
        }
    }

    fn report(&mut self, kind: Scalar, span: Range<usize>) {
        if let Some(visit) = self.visit.as_mut() {
            visit(&self.path, kind, span);
        } else if let Some(visit) = self.raw_visit.as_mut() {
            visit(&self.raw_path, kind, span);
        }
    }

    fn error(&self, reason: &'static str) -> JsonError {
        JsonError {
            at: self.at,
            reason,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.body.get(self.at).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8, reason: &'static str) -> Result<(), JsonError> {
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(self.error(reason))
        }
    }

    fn end(&mut self) -> Result<(), JsonError> {
        self.skip_ws();
        if self.at == self.body.len() {
            Ok(())
        } else {
            Err(self.error("unexpected data after the value"))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Kind, JsonError> {
        let start = self.at;
        let (kind, scalar) = match self.peek() {
            Some(b'{') => {
                self.report(Scalar::Open, start..start + 1);
                return self.object(depth, false).map(|_| Kind::Object);
            }
            Some(b'[') => {
                self.report(Scalar::Open, start..start + 1);
                return self.array(depth, false).map(|_| Kind::Array);
            }
            Some(b'"') => (self.string().map(|_| Kind::String)?, Scalar::String),
            Some(b't') => (self.literal(b"true").map(|_| Kind::Bool)?, Scalar::Bool),
            Some(b'f') => (self.literal(b"false").map(|_| Kind::Bool)?, Scalar::Bool),
            Some(b'n') => (self.literal(b"null").map(|_| Kind::Null)?, Scalar::Null),
            Some(b'-' | b'0'..=b'9') => (self.number().map(|_| Kind::Number)?, Scalar::Number),
            Some(_) => return Err(self.error("expected a value")),
            None => return Err(self.error("unexpected end of input")),
        };
        self.report(scalar, start..self.at);
        Ok(kind)
    }

    /// An object at `depth`; members are recorded only when `record` (the top level).
    fn object(&mut self, depth: usize, record: bool) -> Result<Object, JsonError> {
        if depth > self.max_depth {
            return Err(self.error("nested too deeply"));
        }
        self.expect(b'{', "expected '{'")?;
        let mut members = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            let close = self.at;
            self.at += 1;
            return Ok(Object { members, close });
        }
        loop {
            self.skip_ws();
            let key_start = self.at;
            if self.peek() != Some(b'"') {
                return Err(self.error("expected a key"));
            }
            let has_escape = self.string()?;
            let key_span = key_start..self.at;
            self.skip_ws();
            self.expect(b':', "expected ':'")?;
            self.skip_ws();
            let value_start = self.at;
            if self.visit.is_some() {
                let raw = self.body.get(key_span.clone()).unwrap_or_default();
                self.path
                    .push(Seg::Key(decode_lossy(raw).unwrap_or_default()));
            } else if self.raw_visit.is_some() {
                let body: &'b [u8] = self.body;
                self.raw_path
                    .push(RawSeg::Key(body.get(key_span.clone()).unwrap_or_default()));
            }
            let kind = self.value(depth + 1)?;
            if self.visit.is_some() {
                self.path.pop();
            } else if self.raw_visit.is_some() {
                self.raw_path.pop();
            }
            if record {
                let raw = self.body.get(key_span.clone()).unwrap_or_default();
                let key = if has_escape {
                    unescape(raw, key_span.start)?
                } else {
                    // Validated UTF-8, no escapes: the bytes between the quotes.
                    String::from_utf8_lossy(
                        raw.get(1..raw.len().saturating_sub(1)).unwrap_or_default(),
                    )
                    .into_owned()
                };
                members.push(Member {
                    key,
                    key_span,
                    value: value_start..self.at,
                    kind,
                });
            }
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    let close = self.at;
                    self.at += 1;
                    return Ok(Object { members, close });
                }
                Some(_) => return Err(self.error("expected ',' or '}'")),
                None => return Err(self.error("unexpected end of input")),
            }
        }
    }

    fn array(&mut self, depth: usize, record: bool) -> Result<Vec<Element>, JsonError> {
        if depth > self.max_depth {
            return Err(self.error("nested too deeply"));
        }
        self.expect(b'[', "expected '['")?;
        let mut elements = Vec::new();
        let mut index = 0;
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(elements);
        }
        loop {
            self.skip_ws();
            let start = self.at;
            if self.visit.is_some() {
                self.path.push(Seg::Index(index));
            } else if self.raw_visit.is_some() {
                self.raw_path.push(RawSeg::Index(index));
            }
            let kind = self.value(depth + 1)?;
            if self.visit.is_some() {
                self.path.pop();
            } else if self.raw_visit.is_some() {
                self.raw_path.pop();
            }
            index += 1;
            if record {
                elements.push(Element {
                    value: start..self.at,
                    kind,
                });
            }
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(elements);
                }
                Some(_) => return Err(self.error("expected ',' or ']'")),
                None => return Err(self.error("unexpected end of input")),
            }
        }
    }

    /// A string literal; returns whether it contains an escape.
    fn string(&mut self) -> Result<bool, JsonError> {
        self.expect(b'"', "expected '\"'")?;
        let mut escaped = false;
        loop {
            match self.peek() {
                Some(b'"') => {
                    self.at += 1;
                    return Ok(escaped);
                }
                Some(b'\\') => {
                    escaped = true;
                    self.at += 1;
                    match self.peek() {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                            self.at += 1
                        }
                        Some(b'u') => {
                            self.at += 1;
                            if hex4(self.body, self.at).is_none() {
                                return Err(self.error("bad \\u escape"));
                            }
                            self.at += 4;
                        }
                        _ => return Err(self.error("bad escape")),
                    }
                }
                Some(0x00..=0x1f) => return Err(self.error("control character in a string")),
                Some(_) => {
                    self.at += plain_run(self.body.get(self.at..).unwrap_or_default());
                }
                None => return Err(self.error("unterminated string")),
            }
        }
    }

    fn literal(&mut self, word: &'static [u8]) -> Result<(), JsonError> {
        if self.body.get(self.at..self.at + word.len()) == Some(word) {
            self.at += word.len();
            Ok(())
        } else {
            Err(self.error("expected a value"))
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
        self.at - start
    }

    fn number(&mut self) -> Result<(), JsonError> {
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.error("bad number")),
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if self.digits() == 0 {
                return Err(self.error("bad number"));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if self.digits() == 0 {
                return Err(self.error("bad number"));
            }
        }
        Ok(())
    }
}

/// `seen` with bit `bit` set; `None` if it already was (serde refuses a repeated member).
fn once(seen: u32, bit: u32) -> Option<u32> {
    let mask = 1u32.checked_shl(bit)?;
    (seen & mask == 0).then_some(seen | mask)
}

/// A position in a small JSON document for a hand scan that must accept only what a serde
/// parse accepts (`usage_record::Charge::scan`, `route_info::ScannedRoute::scan`). Every
/// reader skips the whitespace before its token and returns `None` for what it does not
/// accept — including some valid JSON (escapes, numbers serde reads as floats): the caller
/// then leaves the document to serde, which decides.
pub(crate) struct Cursor<'a> {
    /// The document, checked as UTF-8 once, so that a string is a slice of it.
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of `bytes`; `None` if they are not UTF-8 (serde refuses such a
    /// document: a byte outside a string that is not ASCII is not JSON, and a string must be
    /// UTF-8). One check of the whole document rather than one per string.
    pub(crate) fn new(bytes: &'a [u8]) -> Option<Self> {
        let text = std::str::from_utf8(bytes).ok()?;
        Some(Cursor { text, bytes, at: 0 })
    }

    pub(crate) fn peek(&mut self) -> Option<u8> {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.bytes.get(self.at) {
            self.at += 1;
        }
        self.bytes.get(self.at).copied()
    }

    /// Consumes `byte` if it comes next.
    #[must_use]
    pub(crate) fn eat(&mut self, byte: u8) -> bool {
        let next = self.peek() == Some(byte);
        if next {
            self.at += 1;
        }
        next
    }

    /// Consumes `byte`, which must come next.
    pub(crate) fn expect(&mut self, byte: u8) -> Option<()> {
        self.eat(byte).then_some(())
    }

    /// Consumes the literal `word` if it comes next.
    pub(crate) fn word(&mut self, word: &[u8]) -> bool {
        self.peek();
        let next = self
            .bytes
            .get(self.at..)
            .is_some_and(|rest| rest.starts_with(word));
        if next {
            self.at += word.len();
        }
        next
    }

    /// Only whitespace is left.
    pub(crate) fn end(&mut self) -> Option<()> {
        self.peek().is_none().then_some(())
    }

    /// An object with at least one member, each key without escapes: `member` reads the value
    /// after each key and names the member's bit; the set of bits seen. `None` for a repeated
    /// member (serde refuses it), a member `member` refuses, or `{}` (left to serde).
    pub(crate) fn object(
        &mut self,
        mut member: impl FnMut(&mut Self, &'a str) -> Option<u32>,
    ) -> Option<u32> {
        self.expect(b'{')?;
        let mut seen = 0;
        loop {
            let key = self.string()?;
            self.expect(b':')?;
            seen = once(seen, member(self, key)?)?;
            if !self.eat(b',') {
                self.expect(b'}')?;
                return Some(seen);
            }
        }
    }

    /// A string without escapes (and, as JSON requires, without control characters).
    pub(crate) fn string(&mut self) -> Option<&'a str> {
        if !self.eat(b'"') {
            return None;
        }
        let start = self.at;
        let len = plain_run(self.bytes.get(start..)?);
        if self.bytes.get(start + len) != Some(&b'"') {
            return None; // an escape, a control character, or the end
        }
        self.at += len + 1;
        // between two quotes, so on character boundaries: the slice is never refused
        self.text.get(start..start + len)
    }

    pub(crate) fn text_or_null(&mut self) -> Option<Option<&'a str>> {
        match self.word(b"null") {
            true => Some(None),
            false => self.string().map(Some),
        }
    }

    pub(crate) fn bool(&mut self) -> Option<bool> {
        if self.word(b"true") {
            Some(true)
        } else {
            self.word(b"false").then_some(false)
        }
    }

    /// An integer serde reads as a `u64`: digits without a leading zero, within range. (A
    /// fraction or an exponent, which serde reads as a float, fails where the caller expects
    /// the `,` or the closing bracket that follows.)
    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.peek();
        let rest = self.bytes.get(self.at..)?;
        let len = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        let digits = rest.get(..len)?;
        if len == 0 || (len > 1 && digits.first() == Some(&b'0')) {
            return None;
        }
        // a compare with `u64::MAX / 10` rather than `checked_mul`, whose overflow test is a
        // 128-bit multiplication on wasm32
        let value = digits.iter().try_fold(0u64, |n, d| {
            (n <= u64::MAX / 10)
                .then(|| n * 10)?
                .checked_add(u64::from(d - b'0'))
        })?;
        self.at += len;
        Some(value)
    }

    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.u64().and_then(|n| u16::try_from(n).ok())
    }

    pub(crate) fn u64_or_null(&mut self) -> Option<Option<u64>> {
        match self.word(b"null") {
            true => Some(None),
            false => self.u64().map(Some),
        }
    }
}

/// Mutations of small JSON documents for the property tests of the hand scans that must agree
/// with serde ([`Cursor`]'s users). Native only: proptest is not built for the wasm32 run.
#[cfg(all(test, not(target_arch = "wasm32")))]
pub(crate) mod mutate {
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    pub(crate) enum Edit {
        Truncate(usize),
        Delete(usize),
        Insert(usize, u8),
        Replace(usize, u8),
        /// `snippet` at the start or the end of the `n`th value.
        AtValue(usize, &'static str),
    }

    /// Where a value starts (after `:`) or ends (before `,` `}` `]`).
    pub(crate) fn value_edges(bytes: &[u8]) -> Vec<usize> {
        (0..=bytes.len())
            .filter(|&i| {
                matches!(i.checked_sub(1).and_then(|j| bytes.get(j)), Some(b':'))
                    || matches!(bytes.get(i), Some(b',' | b'}' | b']'))
            })
            .collect()
    }

    pub(crate) fn edit() -> impl Strategy<Value = Edit> {
        let byte = prop_oneof![
            3 => prop::sample::select(
                b"{}[],:\"\\ \t\n0123456789.eE-+ntfrul\x00\x1f\x7f".to_vec()
            ),
            1 => any::<u8>(),
        ];
        prop_oneof![
            1 => any::<usize>().prop_map(Edit::Truncate),
            1 => any::<usize>().prop_map(Edit::Delete),
            1 => (any::<usize>(), byte.clone()).prop_map(|(i, b)| Edit::Insert(i, b)),
            1 => (any::<usize>(), byte).prop_map(|(i, b)| Edit::Replace(i, b)),
            2 => (any::<usize>(), prop::sample::select(SNIPPETS.to_vec())).prop_map(|(i, snippet)| Edit::AtValue(i, snippet)),
        ]
    }

    pub(crate) fn apply(mut bytes: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
        for edit in edits {
            let len = bytes.len().max(1);
            match *edit {
                Edit::Truncate(i) => bytes.truncate(i % len),
                Edit::Delete(i) if !bytes.is_empty() => {
                    bytes.remove(i % len);
                }
                Edit::Insert(i, b) => bytes.insert(i % (bytes.len() + 1), b),
                Edit::Replace(i, b) if !bytes.is_empty() => bytes[i % len] = b,
                Edit::AtValue(n, snippet) => {
                    let edges = value_edges(&bytes);
                    if let Some(&at) = edges.get(n % edges.len().max(1)) {
                        bytes.splice(at..at, snippet.bytes());
                    }
                }
                _ => {}
            }
        }
        bytes
    }

    pub(crate) const SNIPPETS: [&str; 29] = [
        "0",
        "1",
        "00",
        ".5",
        ".",
        "e1",
        "E-1",
        "-",
        "-0",
        "+",
        " ",
        "\u{c}",
        "\u{0}",
        "null",
        "true",
        "\"",
        "\\",
        "\"\\u0041\"",
        "}",
        "]",
        ",",
        ":",
        "[]",
        "{}",
        "99999999999999999999",
        "65536",
        "4294967296",
        "\u{e9}",
        "\u{ff}",
    ];
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn scan(body: &str) -> Result<Object, JsonError> {
        scan_object(body.as_bytes(), &Limits::default())
    }

    fn edit(body: &str, f: impl FnOnce(&mut Edits<'_>)) -> String {
        let object = scan(body).unwrap();
        let mut edits = Edits::new(body.as_bytes(), &object);
        f(&mut edits);
        String::from_utf8(edits.finish()).unwrap()
    }

    #[test]
    fn reads_top_level_members_only() {
        let body = r#" {"model":"fast","messages":[{"role":"user","content":"model"}],
            "stream":true,"max_tokens":128,"n":null} "#;
        let object = scan(body).unwrap();
        let keys: Vec<_> = object.members().iter().map(|m| m.key.as_str()).collect();
        assert_eq!(keys, ["model", "messages", "stream", "max_tokens", "n"]);
        assert_eq!(
            object.str(body.as_bytes(), "model").unwrap().as_deref(),
            Some("fast")
        );
        assert_eq!(object.bool(body.as_bytes(), "stream").unwrap(), Some(true));
        assert_eq!(
            object.u64(body.as_bytes(), "max_tokens").unwrap(),
            Some(128)
        );
        assert_eq!(object.get("messages").unwrap().kind, Kind::Array);
        assert_eq!(object.get("n").unwrap().kind, Kind::Null);
        assert_eq!(object.str(body.as_bytes(), "absent").unwrap(), None);
        assert!(object.str(body.as_bytes(), "stream").is_err());
        assert!(object.u64(body.as_bytes(), "model").is_err());
    }

    #[test]
    fn numbers_that_are_not_u64_are_errors() {
        for value in ["-1", "1.5", "1e3", "18446744073709551616"] {
            let body = format!(r#"{{"max_tokens":{value}}}"#);
            let object = scan(&body).unwrap();
            assert!(
                object.u64(body.as_bytes(), "max_tokens").is_err(),
                "{value}"
            );
        }
    }

    #[test]
    fn keys_and_strings_are_unescaped() {
        let body = r#"{"mo\u0064el":"a\"b\\c\nd\u00e9\ud83d\ude00"}"#;
        let object = scan(body).unwrap();
        assert_eq!(
            object.str(body.as_bytes(), "model").unwrap().as_deref(),
            Some("a\"b\\c\nd\u{e9}\u{1F600}")
        );
    }

    #[test]
    fn the_last_duplicate_is_read() {
        let body = r#"{"model":"fast","model":"smart"}"#;
        let object = scan(body).unwrap();
        assert_eq!(
            object.str(body.as_bytes(), "model").unwrap().as_deref(),
            Some("smart")
        );
    }

    #[test]
    fn malformed_documents_are_refused_with_a_position() {
        let cases = [
            ("", "expected an object"),
            ("[]", "expected an object"),
            ("{", "expected a key"),
            (r#"{"a":1,}"#, "expected a key"),
            (r#"{"a" 1}"#, "expected ':'"),
            (r#"{"a":01}"#, "expected ',' or '}'"),
            (r#"{"a":1.}"#, "bad number"),
            (r#"{"a":-}"#, "bad number"),
            (r#"{"a":tru}"#, "expected a value"),
            (r#"{"a":"x\q"}"#, "bad escape"),
            (r#"{"a":"\u12"}"#, "bad \\u escape"),
            ("{\"a\":\"\n\"}", "control character in a string"),
            (r#"{"a":"x}"#, "unterminated string"),
            (r#"{"a":[1 2]}"#, "expected ',' or ']'"),
            (r#"{} {}"#, "unexpected data after the value"),
        ];
        for (body, reason) in cases {
            let error = scan(body).unwrap_err();
            assert_eq!(error.reason, reason, "{body:?}");
            assert!(error.to_string().starts_with("invalid JSON at byte "));
        }
        let error = scan_object(b"{\"a\":\"\xff\"}", &Limits::default()).unwrap_err();
        assert_eq!((error.at, error.reason), (6, "invalid UTF-8"));
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = |n: usize| format!(r#"{{"a":{}1{}}}"#, "[".repeat(n), "]".repeat(n));
        assert!(scan(&deep(63)).is_ok());
        assert_eq!(scan(&deep(64)).unwrap_err().reason, "nested too deeply");
        let hostile = format!(r#"{{"a":{}}}"#, "[".repeat(1_000_000));
        assert_eq!(scan(&hostile).unwrap_err().reason, "nested too deeply");
    }

    #[test]
    fn set_replaces_a_value_and_leaves_the_rest_byte_for_byte() {
        let body = "{ \"model\" : \"fast\",\n  \"messages\":[ {\"content\": \"x\\u0041\"} ] }";
        let out = edit(body, |e| {
            e.set("model", quote("gpt-4o").into_bytes());
        });
        assert_eq!(
            out,
            "{ \"model\" : \"gpt-4o\",\n  \"messages\":[ {\"content\": \"x\\u0041\"} ] }"
        );
    }

    #[test]
    fn set_appends_a_missing_member() {
        assert_eq!(
            edit(r#"{"model":"m"}"#, |e| {
                e.set("max_tokens", b"256".to_vec());
            }),
            r#"{"model":"m","max_tokens":256}"#
        );
        assert_eq!(
            edit("{ }", |e| {
                e.set("a", b"1".to_vec()).set("b", b"2".to_vec());
            }),
            r#"{"a":1,"b":2 }"#
        );
        assert_eq!(
            edit("{}", |e| {
                e.set("a", b"1".to_vec()).set("a", b"3".to_vec());
            }),
            r#"{"a":3}"#
        );
    }

    #[test]
    fn remove_takes_the_comma_with_it() {
        let body = r#"{"a":1, "b":2, "c":3}"#;
        assert_eq!(
            edit(body, |e| {
                e.remove("a");
            }),
            r#"{"b":2, "c":3}"#
        );
        assert_eq!(
            edit(body, |e| {
                e.remove("b");
            }),
            r#"{"a":1, "c":3}"#
        );
        assert_eq!(
            edit(body, |e| {
                e.remove("c");
            }),
            r#"{"a":1, "b":2}"#
        );
        assert_eq!(
            edit(body, |e| {
                e.remove("a").remove("b");
            }),
            r#"{"c":3}"#
        );
        assert_eq!(
            edit(body, |e| {
                e.remove("b").remove("c");
            }),
            r#"{"a":1}"#
        );
        assert_eq!(
            edit(body, |e| {
                e.remove("a").remove("b").remove("c");
            }),
            "{}"
        );
        assert_eq!(
            edit(body, |e| {
                e.remove("zzz");
            }),
            body
        );
    }

    #[test]
    fn duplicates_are_all_rewritten() {
        let body = r#"{"model":"fast","x":1,"model":"smart"}"#;
        assert_eq!(
            edit(body, |e| {
                e.set("model", quote("real").into_bytes());
            }),
            r#"{"x":1,"model":"real"}"#
        );
        assert_eq!(
            edit(body, |e| {
                e.remove("model");
            }),
            r#"{"x":1}"#
        );
    }

    #[test]
    fn remove_then_set_re_adds() {
        assert_eq!(
            edit(r#"{"a":1,"b":2}"#, |e| {
                e.remove("a").set("a", b"9".to_vec());
            }),
            r#"{"b":2,"a":9}"#
        );
    }

    #[test]
    fn nested_objects_are_edited_by_scanning_the_member() {
        let body = r#"{"stream":true,"stream_options":{"x":1}}"#;
        let object = scan(body).unwrap();
        let inner = object.raw(body.as_bytes(), "stream_options").unwrap();
        let nested = scan_object(inner, &Limits::default()).unwrap();
        let mut e = Edits::new(inner, &nested);
        e.set("include_usage", b"true".to_vec());
        let inner = e.finish();
        let mut outer = Edits::new(body.as_bytes(), &object);
        outer.set("stream_options", inner);
        assert_eq!(
            String::from_utf8(outer.finish()).unwrap(),
            r#"{"stream":true,"stream_options":{"x":1,"include_usage":true}}"#
        );
    }

    #[test]
    fn arrays_and_values() {
        let elements = scan_array(br#"[1, "a", {"b":[]}, null]"#, &Limits::default()).unwrap();
        let kinds: Vec<_> = elements.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [Kind::Number, Kind::String, Kind::Object, Kind::Null]
        );
        assert_eq!(elements[2].value, 9..17);
        assert_eq!(
            scan_value(b" -0.5e+3 ", &Limits::default()),
            Ok(Kind::Number)
        );
        assert!(scan_value(b"1 2", &Limits::default()).is_err());
    }

    #[test]
    fn quote_escapes_what_json_requires() {
        assert_eq!(quote("a\"b\\c\n\u{1}é"), r#""a\"b\\c\n\u0001é""#);
        assert_eq!(
            unescape(quote("x\u{1f}\t\"").as_bytes(), 0).unwrap(),
            "x\u{1f}\t\""
        );
    }

    #[test]
    fn serde_quoting_and_numbers_are_serde_json_s() {
        let serde = |s: &str| serde_json::to_string(s).unwrap();
        let ours = |s: &str| {
            let mut out = String::new();
            push_serde_quoted(&mut out, s);
            out
        };
        // every ASCII character alone and inside plain text, and some multi-byte ones
        for c in (0u8..0x80)
            .map(char::from)
            .chain(['é', '漢', '😀', '\u{2028}'])
        {
            for s in [c.to_string(), format!("abcdefgh{c}ijklmnopq")] {
                assert_eq!(ours(&s), serde(&s), "{s:?}");
            }
        }
        assert_eq!(ours("\u{8}\u{c}"), r#""\b\f""#);
        for n in [
            0,
            1,
            9,
            10,
            99,
            100,
            12_345,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX,
        ] {
            let mut out = String::new();
            push_u64(&mut out, n);
            assert_eq!(out, serde_json::to_string(&n).unwrap());
        }
    }

    #[test]
    fn hex_is_two_lowercase_digits_per_byte() {
        let bytes: Vec<u8> = (0..=255).collect();
        let mut out = String::from("x");
        push_hex(&mut out, &bytes);
        let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(out, format!("x{expected}"));
    }

    fn leaves(doc: &str) -> Result<Vec<(String, Scalar, String)>, JsonError> {
        let mut out = Vec::new();
        walk(
            doc.as_bytes(),
            &Limits::default(),
            &mut |path, kind, span| {
                let p: Vec<String> = path
                    .iter()
                    .map(|s| match s {
                        Seg::Key(k) => k.clone(),
                        Seg::Index(i) => i.to_string(),
                    })
                    .collect();
                out.push((p.join("."), kind, doc[span].to_string()));
            },
        )?;
        Ok(out)
    }

    #[test]
    fn walk_reports_scalars_with_paths() {
        let got = leaves(r#" {"a":[1,"x\"y",{"b":null}],"c":true, "d":-1.5e3} "#).unwrap();
        assert_eq!(
            got,
            vec![
                ("".into(), Scalar::Open, "{".into()),
                ("a".into(), Scalar::Open, "[".into()),
                ("a.0".into(), Scalar::Number, "1".into()),
                ("a.1".into(), Scalar::String, r#""x\"y""#.into()),
                ("a.2".into(), Scalar::Open, "{".into()),
                ("a.2.b".into(), Scalar::Null, "null".into()),
                ("c".into(), Scalar::Bool, "true".into()),
                ("d".into(), Scalar::Number, "-1.5e3".into()),
            ]
        );
        assert!(leaves("[1,]").is_err());
        assert!(walk(b"\"\xff\"", &Limits::default(), &mut |_, _, _| {}).is_err());
    }

    #[test]
    fn lossy_decoding_replaces_lone_surrogates() {
        for s in ["", "plain", "q\"b\\s/\n\r\t\u{1}", "漢字 😀", "\u{7f}"] {
            let quoted = quote(s);
            assert_eq!(decode_lossy(quoted.as_bytes()).as_deref(), Some(s));
            let parsed: String = serde_json::from_str(&quoted).unwrap();
            assert_eq!(parsed, s);
        }
        let raw = br#""\ud83d\ude00 \u00e9 \ud800x \udc00""#;
        assert_eq!(
            decode_lossy(raw).as_deref(),
            Some("😀 é \u{FFFD}x \u{FFFD}")
        );
        assert_eq!(unescape(raw, 0).unwrap_err().reason, "unpaired surrogate");
        assert_eq!(decode_lossy(br#""\q""#), None);
    }

    #[test]
    fn splice_replaces_spans() {
        let out = splice(
            b"0123456789",
            &[(1..3, b"ab".to_vec()), (5..5, b"X".to_vec())],
        );
        assert_eq!(out, b"0ab34X56789");
    }

    #[cfg(not(target_arch = "wasm32"))]
    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn json_value() -> impl Strategy<Value = serde_json::Value> {
            let leaf = prop_oneof![
                Just(serde_json::Value::Null),
                any::<bool>().prop_map(serde_json::Value::Bool),
                any::<i64>().prop_map(|n| serde_json::json!(n)),
                // Eighths are exact in binary, so the float survives a text round trip.
                (-8_000_000i32..8_000_000).prop_map(|n| serde_json::json!(f64::from(n) / 8.0)),
                ".{0,8}".prop_map(serde_json::Value::String),
            ];
            leaf.prop_recursive(4, 32, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                    prop::collection::btree_map(".{0,4}", inner, 0..4)
                        .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
                ]
            })
        }

        /// Every call of [`walk`] as (path, kind, span), and whether the walk succeeded.
        type Calls = (Vec<(Vec<Seg>, Scalar, Range<usize>)>, bool);

        fn walk_calls(body: &[u8]) -> Calls {
            let mut calls = Vec::new();
            let ok = walk(body, &Limits::default(), &mut |p, k, s| {
                calls.push((p.to_vec(), k, s))
            })
            .is_ok();
            (calls, ok)
        }

        /// The same from [`walk_raw`], its raw keys decoded as [`walk`] decodes them, and each
        /// raw key checked to be `key_is` its decoded name (and not another).
        fn walk_raw_calls(body: &[u8]) -> Calls {
            let mut calls = Vec::new();
            let ok = walk_raw(body, &Limits::default(), &mut |p, k, s| {
                let path = p
                    .iter()
                    .map(|seg| match seg {
                        RawSeg::Key(raw) => {
                            let name = decode_lossy(raw).unwrap_or_default();
                            assert!(seg.key_is(&name));
                            assert!(!seg.key_is(&format!("{name}x")));
                            Seg::Key(name)
                        }
                        RawSeg::Index(i) => Seg::Index(*i),
                    })
                    .collect();
                calls.push((path, k, s))
            })
            .is_ok();
            (calls, ok)
        }

        fn escaped_key() -> impl Strategy<Value = String> {
            prop::collection::vec(
                prop::sample::select(vec![
                    "a",
                    "type",
                    "\\u0074",
                    "\\\"",
                    "\\\\",
                    "\\n",
                    "é",
                    "\\ud800",
                    "\\ud83d\\ude00",
                    "[",
                ]),
                0..4,
            )
            .prop_map(|parts| parts.concat())
        }

        /// The escape of `s` one byte at a time: the reference [`push_escaped`] and [`quote`]
        /// must give byte for byte.
        fn escaped_bytewise(s: &str) -> Vec<u8> {
            let mut out = Vec::new();
            for &b in s.as_bytes() {
                match b {
                    b'"' => out.extend_from_slice(b"\\\""),
                    b'\\' => out.extend_from_slice(b"\\\\"),
                    b'\n' => out.extend_from_slice(b"\\n"),
                    b'\r' => out.extend_from_slice(b"\\r"),
                    b'\t' => out.extend_from_slice(b"\\t"),
                    0..=0x1f => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
                    _ => out.push(b),
                }
            }
            out
        }

        /// Text that is mostly plain, with the bytes that need an escape and multi-byte
        /// characters at any place (so runs end anywhere in an eight-byte word).
        fn text_to_escape() -> impl Strategy<Value = String> {
            prop::collection::vec(
                prop_oneof![
                    4 => "[a-z ]{0,11}",
                    1 => prop::sample::select(vec!["\"", "\\", "\n", "\r", "\t", "\u{0}", "\u{1f}", "\u{8}", "\u{c}", "\u{7f}", "é", "😀", "/"]).prop_map(str::to_string),
                ],
                0..12,
            )
            .prop_map(|parts| parts.concat())
        }

        proptest! {
            /// Reading a body as text first and scanning the text is [`scan_object`], errors
            /// included (invalid UTF-8 anywhere, bad JSON, valid objects).
            #[test]
            fn scanning_the_text_is_scanning_the_bytes(
                parts in prop::collection::vec(
                    prop::sample::select(vec![
                        &b"{"[..], b"}", b"\"", b":", b",", b"a", b"\xc3\xa9", b"\xff", b"\xe6\x97",
                        b"1", b"[", b"]", b" ", b"\\", b"null",
                    ]),
                    0..30,
                ),
                wrap in any::<bool>(),
            ) {
                let mut body = parts.concat();
                if wrap {
                    body = [&b"{\"k\":\""[..], &body, b"\"}"].concat();
                }
                let limits = Limits::default();
                let via_text = utf8(&body).and_then(|text| scan_object_text(text, &limits));
                prop_assert_eq!(via_text, scan_object(&body, &limits));
            }

            /// [`push_escaped`] and [`quote`] escape exactly as a byte-by-byte escape does,
            /// and serde_json reads the literal back as the text.
            #[test]
            fn escaping_is_the_bytewise_escape(
                text in text_to_escape(),
                any_text in any::<String>(),
            ) {
                for s in [text.as_str(), any_text.as_str()] {
                    let expected = escaped_bytewise(s);
                    let mut escaped = b"x".to_vec();
                    push_escaped(&mut escaped, s);
                    prop_assert_eq!(escaped.get(1..), Some(expected.as_slice()));
                    let quoted = quote(s);
                    let inside = quoted.as_bytes().get(1..quoted.len() - 1);
                    prop_assert_eq!(inside, Some(expected.as_slice()));
                    let read: Option<String> = serde_json::from_str(&quoted).ok();
                    prop_assert_eq!(read.as_deref(), Some(s));
                }
            }

            /// [`push_serde_quoted`] writes what serde_json writes for a string, and
            /// [`push_u64`] what it writes for a number.
            #[test]
            fn serde_quoting_is_serde_json_s(
                text in text_to_escape(),
                any_text in any::<String>(),
                n in any::<u64>(),
            ) {
                for s in [text.as_str(), any_text.as_str()] {
                    let mut quoted = "x".to_string();
                    push_serde_quoted(&mut quoted, s);
                    let expected = format!("x{}", serde_json::to_string(s).unwrap_or_default());
                    prop_assert_eq!(quoted, expected);
                }
                let mut number = String::new();
                push_u64(&mut number, n);
                prop_assert_eq!(number, n.to_string());
            }

            /// [`walk_raw`] reports what [`walk`] reports, in the same order, with the same
            /// result: on generated documents (escaped keys included) and on arbitrary bytes.
            #[test]
            fn walk_raw_is_walk(
                value in json_value(),
                keys in prop::collection::vec(escaped_key(), 1..4),
                bytes in prop::collection::vec(any::<u8>(), 0..48),
            ) {
                let doc = value.to_string();
                prop_assert_eq!(walk_raw_calls(doc.as_bytes()), walk_calls(doc.as_bytes()));
                let mut with_keys = String::from("{");
                for (i, k) in keys.iter().enumerate() {
                    with_keys.push_str(&format!("\"{k}\":{{\"{k}\":[{i},\"{k}\",{doc}]}},"));
                }
                with_keys.push_str("\"end\":null}");
                let (calls, ok) = walk_raw_calls(with_keys.as_bytes());
                prop_assert!(ok);
                prop_assert_eq!((calls, ok), walk_calls(with_keys.as_bytes()));
                prop_assert_eq!(walk_raw_calls(&bytes), walk_calls(&bytes));
            }

            /// Accepts exactly what serde_json accepts (within the depth limit), never panics.
            #[test]
            fn agrees_with_serde_json(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
                let ours = scan_value(&bytes, &Limits::default()).is_ok();
                let theirs = serde_json::from_slice::<serde_json::Value>(&bytes).is_ok();
                prop_assert_eq!(ours, theirs);
            }

            /// The word-at-a-time run of plain string bytes ends exactly where a byte-wise scan
            /// does, wherever the special bytes fall in a word.
            #[test]
            fn plain_run_is_the_bytewise_scan(
                bytes in prop::collection::vec(
                    prop_oneof![
                        8 => any::<u8>(),
                        1 => prop::sample::select(vec![b'"', b'\\', 0x00, 0x1f, 0x20, 0x21, 0x5b, 0x5d, 0x7f, 0x80, 0xa2, 0xdc, 0xff]),
                    ],
                    0..40,
                )
            ) {
                let expected = bytes
                    .iter()
                    .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
                    .unwrap_or(bytes.len());
                prop_assert_eq!(plain_run(&bytes), expected);
            }

            /// Long strings with escapes, controls and multi-byte characters anywhere: accepted
            /// exactly when serde_json accepts them.
            #[test]
            fn strings_agree_with_serde_json(
                inner in prop::collection::vec(
                    prop::sample::select(vec!["a", "é", "日", "\"", "\\", "\\\\", "\\n", "\\u00e9", "\\x", "\n", "\u{1f}", " ", "\"", "\\"]),
                    0..40,
                )
            ) {
                let text = format!("\"{}\"", inner.concat());
                let ours = scan_value(text.as_bytes(), &Limits::default()).is_ok();
                let theirs = serde_json::from_str::<serde_json::Value>(&text).is_ok();
                prop_assert_eq!(ours, theirs, "{:?}", text);
            }

            /// Every generated document is accepted; members and values match serde_json's.
            #[test]
            fn reads_what_serde_json_reads(map in prop::collection::btree_map(".{0,6}", json_value(), 0..6)) {
                let doc = serde_json::Value::Object(map.into_iter().collect());
                let text = serde_json::to_string_pretty(&doc).unwrap();
                let object = scan(&text).unwrap();
                let expected = doc.as_object().unwrap();
                prop_assert_eq!(object.members().len(), expected.len());
                for member in object.members() {
                    let raw = &text.as_bytes()[member.value.clone()];
                    let value: serde_json::Value = serde_json::from_slice(raw).unwrap();
                    prop_assert_eq!(Some(&value), expected.get(&member.key));
                }
            }

            /// Any set/remove sequence yields valid JSON holding exactly the expected members.
            #[test]
            fn edits_produce_the_expected_document(
                map in prop::collection::btree_map("[a-d]", 0u32..100, 0..4),
                ops in prop::collection::vec((any::<bool>(), "[a-e]", 0u32..100), 0..6),
            ) {
                let text = serde_json::to_string(&map).unwrap();
                let object = scan(&text).unwrap();
                let mut edits = Edits::new(text.as_bytes(), &object);
                let mut expected = map.clone();
                for (set, key, value) in &ops {
                    if *set {
                        edits.set(key, value.to_string().into_bytes());
                        expected.insert(key.clone(), *value);
                    } else {
                        edits.remove(key);
                        expected.remove(key);
                    }
                }
                let out = edits.finish();
                let parsed: std::collections::BTreeMap<String, u32> =
                    serde_json::from_slice(&out).unwrap();
                prop_assert_eq!(&parsed, &expected);
                let rescanned = scan_object(&out, &Limits::default()).unwrap();
                prop_assert_eq!(rescanned.members().len(), expected.len());
            }
        }
    }
}
