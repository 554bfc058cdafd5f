//! A fast path for the Chat Completions chunk that makes up almost every event of a stream:
//! `{"id":…,"model":…,"choices":[{"delta":{"content":"…"}}],"usage":null}`.
//!
//! [`StreamUsage::on_event`](llm_gateway_shared::usage::StreamUsage::on_event) parses every
//! event with serde (a typed parse, a `Vec` per event, a `String` for its text). Most events
//! carry no usage, and all the filter needs from them is their text (counted only if no usage
//! comes) and, once, the model. [`scan`] reads exactly that in one pass without allocating —
//! the text goes into a buffer the caller reuses — and answers `None` ("ask serde") for
//! anything it is not certain to read exactly as the typed parse does:
//!
//! - a `usage` (or top-level `delta`, `message`, `response`) that is not `null`: the event may
//!   carry usage, which serde reads;
//! - a known member twice, a key with escapes, a member of another type than the typed parse
//!   expects (a numeric `content`: serde then drops the event's text), a lone surrogate in a
//!   string that is read, nesting deeper than [`MAX_DEPTH`];
//! - anything that is not JSON.
//!
//! The scanner is stricter than serde (it accepts a subset of what serde accepts), so an
//! answer `Some` is always what serde would give: the same text, in the same order (per
//! choice: `content`, `reasoning_content`, `refusal`, then each tool call's `arguments`), the
//! same model, and no usage.

/// Deeper nesting is left to serde (real chunks nest 5 levels).
pub const MAX_DEPTH: usize = 32;

/// What a chunk without usage says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Chunk<'a> {
    /// The top-level `model`, when it is a string without escapes.
    pub model: Option<&'a str>,
    /// The inside of the chunk's `content` string (`start..end`, quotes excluded) when it is
    /// the only string that gave text: the chunk can serve as a [`Template`].
    pub content: Option<(usize, usize)>,
}

/// Reads one Chat Completions event's data; appends its text to `text`. `None`: not
/// certain, `text` may hold part of the text — clear it and use the full parse.
///
/// `data` is bytes, not yet checked as UTF-8: the strings that are read are checked (an
/// invalid one gives `None`), the others are skipped (the full parse would see them with
/// U+FFFD in place of the invalid bytes, which changes nothing read). Whitespace is a space
/// or a tab only, so `data` is known to be one line (see [`single_data_line`]).
pub fn scan<'a>(data: &'a [u8], text: &mut String) -> Option<Chunk<'a>> {
    let mut s = Scanner {
        s: data,
        i: 0,
        decoded: 0,
        content: None,
    };
    let mut chunk = s.top(text)?;
    s.ws();
    if s.i != data.len() {
        return None;
    }
    if s.decoded == 1 {
        chunk.content = s.content.map(|span| (span.start, span.end));
    }
    Some(chunk)
}

/// The chunk read last by [`scan`] whose text was its one `content` string: the bytes before
/// that string (`head`, its opening quote included) and after it (`tail`, from its closing
/// quote). A stream repeats them chunk after chunk (id, created, model, index, finish_reason,
/// usage null): only the content changes.
///
/// A chunk that is `head`, a valid string inside, `tail` is read by [`scan`] exactly as the
/// template was — the same members, types and nesting, the same model, no usage — with that
/// string as all its text: the scan would take the same steps on the same bytes, with
/// another string at the same place. So [`Template::apply`] only compares the bytes around
/// and reads the string.
#[derive(Debug, Default)]
pub struct Template {
    bytes: Vec<u8>,
    start: usize,
    end: usize,
}

impl Template {
    /// Keeps `data`, a chunk [`scan`] read, whose [`Chunk::content`] is `content`.
    pub fn set(&mut self, data: &[u8], content: (usize, usize)) {
        self.bytes.clear();
        self.bytes.extend_from_slice(data);
        (self.start, self.end) = content;
    }

    /// If `data` is the template with another content string: appends that string's value
    /// to `text` and returns true. False (and `text` untouched): read it with [`scan`].
    pub fn apply(&self, data: &[u8], text: &mut String) -> bool {
        let (Some(head), Some(tail)) = (self.bytes.get(..self.start), self.bytes.get(self.end..))
        else {
            return false;
        };
        if head.is_empty()
            || data.len() < head.len() + tail.len()
            || !same(data.get(..head.len()), head)
            || !same(data.get(data.len() - tail.len()..), tail)
        {
            return false;
        }
        let mut s = Scanner {
            s: data,
            i: head.len() - 1,
            decoded: 0,
            content: None,
        };
        let Some(span) = s.string() else {
            return false;
        };
        if span.end != data.len() - tail.len() {
            return false;
        }
        let before = text.len();
        if s.decode(span, text).is_none() {
            text.truncate(before);
            return false;
        }
        true
    }
}

impl Template {
    /// [`Template::apply`] on the event `bytes` starts with, before it is framed: if `bytes`
    /// starts with `data:`, an optional space, the template with another content string, and
    /// `\n\n`, appends that string's value to `text` and returns the event's length. That
    /// event is one line without CR or LF (the template's bytes hold none, nor does a string
    /// [`Scanner::string`] accepts), so the framer would hand out exactly these bytes, and
    /// [`single_data_line`] then [`Template::apply`] would read the same text from them.
    /// `None` (and `text` untouched): frame the event and read it the usual way.
    pub fn apply_event(&self, bytes: &[u8], text: &mut String) -> Option<usize> {
        let (head, tail) = (self.bytes.get(..self.start)?, self.bytes.get(self.end..)?);
        let value = bytes.strip_prefix(b"data:")?;
        let value = value.strip_prefix(b" ").unwrap_or(value);
        let prefix = bytes.len() - value.len();
        if head.is_empty() || !same(value.get(..head.len()), head) {
            return None;
        }
        let mut s = Scanner {
            s: value,
            i: head.len() - 1,
            decoded: 0,
            content: None,
        };
        let span = s.string()?;
        let data_end = span.end.checked_add(tail.len())?;
        if !same(value.get(span.end..data_end), tail)
            || value.get(data_end..data_end + 2) != Some(b"\n\n")
        {
            return None;
        }
        let before = text.len();
        if s.decode(span, text).is_none() {
            text.truncate(before);
            return None;
        }
        Some(prefix + data_end + 2)
    }
}

/// `a == Some(b)`, 32 bytes a step. Every event of a stream compares some 200 bytes with the
/// template: a byte-wise `==` (wasm's `memcmp` is a byte loop) or an 8-byte step with a slice
/// split and a length check each cost several times more wasm instructions per byte than
/// four fixed-offset word loads per block.
fn same(a: Option<&[u8]>, b: &[u8]) -> bool {
    let Some(a) = a else {
        return false;
    };
    if a.len() != b.len() {
        return false;
    }
    let (x, x_rest) = a.as_chunks::<32>();
    let (y, y_rest) = b.as_chunks::<32>();
    for (p, q) in x.iter().zip(y) {
        if block_diff(p, q) != 0 {
            return false;
        }
    }
    let (x, x_rest) = x_rest.as_chunks::<8>();
    let (y, y_rest) = y_rest.as_chunks::<8>();
    for (p, q) in x.iter().zip(y) {
        if u64::from_ne_bytes(*p) != u64::from_ne_bytes(*q) {
            return false;
        }
    }
    if x_rest.is_empty() {
        return true;
    }
    // the last bytes: the last eight (overlapping words already compared), not `==`, which
    // is a call to wasm's byte-wise `memcmp`
    match (a.last_chunk::<8>(), b.last_chunk::<8>()) {
        (Some(p), Some(q)) => u64::from_ne_bytes(*p) == u64::from_ne_bytes(*q),
        _ => x_rest == y_rest,
    }
}

/// Nonzero if two 32-byte blocks differ.
#[inline(always)]
fn block_diff(p: &[u8; 32], q: &[u8; 32]) -> u64 {
    let (p, _) = p.as_chunks::<8>();
    let (q, _) = q.as_chunks::<8>();
    p.iter().zip(q).fold(0, |diff, (a, b)| {
        diff | (u64::from_ne_bytes(*a) ^ u64::from_ne_bytes(*b))
    })
}

/// The data of an event that is exactly one `data:` line (the usual chunk), without looking
/// at the bytes in between: [`scan`] refuses a line break inside it. `None` for any other
/// event (named, several lines, a comment), which takes the full parse.
pub fn single_data_line(raw: &[u8]) -> Option<&[u8]> {
    let value = raw.strip_prefix(b"data:")?;
    let value = value.strip_prefix(b" ").unwrap_or(value);
    let end = value
        .iter()
        .rposition(|&b| b != b'\n' && b != b'\r')
        .map_or(0, |last| last + 1);
    value.get(..end)
}

/// A string value's inner bytes `start..end` (quotes excluded); `escaped` if it holds a `\`.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: usize,
    end: usize,
    escaped: bool,
}

struct Scanner<'a> {
    s: &'a [u8],
    i: usize,
    /// Strings whose value went into the text.
    decoded: u32,
    /// The last `content` string whose value went into the text.
    content: Option<Span>,
}

/// Marks a known member as seen; a second one (which the typed parse refuses) gives `None`.
fn once(seen: &mut bool) -> Option<()> {
    (!std::mem::replace(seen, true)).then_some(())
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek() == Some(byte)).then(|| self.i += 1)
    }

    /// `null` (consumed: true) or nothing consumed (false).
    fn null(&mut self) -> Option<bool> {
        if self.peek() != Some(b'n') {
            return Some(false);
        }
        self.literal(b"null")?;
        Some(true)
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i + word.len();
        (self.s.get(self.i..end) == Some(word)).then(|| self.i = end)
    }

    /// A string at the cursor; validates its escapes (hex digits only: surrogates are
    /// checked when a string is decoded).
    fn string(&mut self) -> Option<Span> {
        self.eat(b'"')?;
        let bytes = self.s;
        let start = self.i;
        let mut escaped = false;
        loop {
            // the plain run up to the next byte that matters, in one search
            let rest = bytes.get(self.i..)?;
            self.i += llm_gateway_shared::json::plain_run(rest);
            let byte = *bytes.get(self.i)?;
            self.i += 1;
            match byte {
                b'"' => {
                    return Some(Span {
                        start,
                        end: self.i - 1,
                        escaped,
                    })
                }
                b'\\' => {
                    escaped = true;
                    match *bytes.get(self.i)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 1,
                        b'u' => {
                            let hex = bytes.get(self.i + 1..self.i + 5)?;
                            if !hex.iter().all(u8::is_ascii_hexdigit) {
                                return None;
                            }
                            self.i += 5;
                        }
                        _ => return None,
                    }
                }
                0..=0x1f => return None,
                _ => {}
            }
        }
    }

    /// A key and its colon; `None` for a key with escapes (its meaning would need decoding).
    fn key(&mut self) -> Option<&'a [u8]> {
        let span = self.string()?;
        if span.escaped {
            return None;
        }
        self.ws();
        self.eat(b':')?;
        self.ws();
        self.s.get(span.start..span.end)
    }

    /// After a member: `,` (true, another member follows) or the closing byte (false).
    fn next(&mut self, close: u8) -> Option<bool> {
        self.ws();
        match self.peek()? {
            b',' => {
                self.i += 1;
                self.ws();
                Some(true)
            }
            byte if byte == close => {
                self.i += 1;
                Some(false)
            }
            _ => None,
        }
    }

    /// Opens an object or array; true if it is empty (and then already closed).
    fn open(&mut self, open: u8, close: u8) -> Option<bool> {
        self.eat(open)?;
        self.ws();
        Some(self.eat(close).is_some())
    }

    fn number(&mut self) -> Option<()> {
        let _ = self.eat(b'-');
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.eat(b'.').is_some() {
            self.peek().filter(u8::is_ascii_digit)?;
            self.digits();
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            self.peek().filter(u8::is_ascii_digit)?;
            self.digits();
        }
        Some(())
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.i += 1;
        }
    }

    /// Any value, validated and skipped.
    fn skip(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => self.string().map(drop),
            b'{' => {
                let depth = depth.checked_sub(1)?;
                if self.open(b'{', b'}')? {
                    return Some(());
                }
                loop {
                    self.string()?;
                    self.ws();
                    self.eat(b':')?;
                    self.ws();
                    self.skip(depth)?;
                    if !self.next(b'}')? {
                        return Some(());
                    }
                }
            }
            b'[' => {
                let depth = depth.checked_sub(1)?;
                if self.open(b'[', b']')? {
                    return Some(());
                }
                loop {
                    self.skip(depth)?;
                    if !self.next(b']')? {
                        return Some(());
                    }
                }
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number(),
        }
    }

    /// `null` or a string: its span.
    fn optional_string(&mut self) -> Option<Option<Span>> {
        if self.null()? {
            return Some(None);
        }
        self.string().map(Some)
    }

    /// The top-level object.
    fn top(&mut self, text: &mut String) -> Option<Chunk<'a>> {
        self.ws();
        let mut chunk = Chunk::default();
        if self.open(b'{', b'}')? {
            return Some(chunk);
        }
        let depth = MAX_DEPTH - 1;
        let (mut kind, mut model, mut choices) = (false, false, false);
        let (mut usage, mut delta, mut message, mut response) = (false, false, false, false);
        loop {
            match self.key()? {
                b"type" => {
                    once(&mut kind)?;
                    if self.optional_string()?.is_some_and(|s| s.escaped) {
                        return None;
                    }
                }
                b"model" => {
                    once(&mut model)?;
                    chunk.model = match self.optional_string()? {
                        Some(span) if span.escaped => return None,
                        Some(span) => Some(self.text(span)?),
                        None => None,
                    };
                }
                b"choices" => {
                    once(&mut choices)?;
                    if !self.null()? {
                        self.choices(depth, text)?;
                    }
                }
                key => {
                    let seen = match key {
                        b"usage" => &mut usage,
                        b"delta" => &mut delta,
                        b"message" => &mut message,
                        b"response" => &mut response,
                        _ => {
                            self.skip(depth)?;
                            if self.next(b'}')? {
                                continue;
                            }
                            return Some(chunk);
                        }
                    };
                    once(seen)?;
                    // anything but null may carry usage (or the model): serde reads it
                    if !self.null()? {
                        return None;
                    }
                }
            }
            if !self.next(b'}')? {
                return Some(chunk);
            }
        }
    }

    fn choices(&mut self, depth: usize, text: &mut String) -> Option<()> {
        let depth = depth.checked_sub(1)?;
        if self.open(b'[', b']')? {
            return Some(());
        }
        loop {
            self.choice(depth, text)?;
            if !self.next(b']')? {
                return Some(());
            }
        }
    }

    fn choice(&mut self, depth: usize, text: &mut String) -> Option<()> {
        let depth = depth.checked_sub(1)?;
        if self.open(b'{', b'}')? {
            return Some(());
        }
        let mut delta = false;
        loop {
            if self.key()? == b"delta" {
                once(&mut delta)?;
                if !self.null()? {
                    self.delta(depth, text)?;
                }
            } else {
                self.skip(depth)?;
            }
            if !self.next(b'}')? {
                return Some(());
            }
        }
    }

    fn delta(&mut self, depth: usize, text: &mut String) -> Option<()> {
        let depth = depth.checked_sub(1)?;
        let mut fields: [Option<Span>; 3] = [None; 3];
        let mut seen = [false; 4];
        let mut tool_calls = None;
        if !self.open(b'{', b'}')? {
            loop {
                let slot = match self.key()? {
                    b"content" => 0,
                    b"reasoning_content" => 1,
                    b"refusal" => 2,
                    b"tool_calls" => 3,
                    _ => {
                        self.skip(depth)?;
                        if self.next(b'}')? {
                            continue;
                        }
                        break;
                    }
                };
                once(seen.get_mut(slot)?)?;
                match fields.get_mut(slot) {
                    Some(field) => *field = self.optional_string()?,
                    None => {
                        if !self.null()? {
                            tool_calls = Some(self.i);
                            self.tool_calls(depth, None)?;
                        }
                    }
                }
                if !self.next(b'}')? {
                    break;
                }
            }
        }
        // the typed parse's order, whatever the members' order
        for (slot, span) in fields.into_iter().enumerate() {
            let Some(span) = span else {
                continue;
            };
            self.decode(span, text)?;
            self.decoded += 1;
            if slot == 0 {
                self.content = Some(span);
            }
        }
        if let Some(at) = tool_calls {
            let end = std::mem::replace(&mut self.i, at);
            self.tool_calls(depth, Some(text))?;
            self.i = end;
        }
        Some(())
    }

    /// `tool_calls`: validated, and with `text` its `arguments` appended.
    fn tool_calls(&mut self, depth: usize, mut text: Option<&mut String>) -> Option<()> {
        let depth = depth.checked_sub(1)?;
        if self.open(b'[', b']')? {
            return Some(());
        }
        loop {
            // one call: {"function": {"arguments": "…"}, …}
            let call_depth = depth.checked_sub(1)?;
            if !self.open(b'{', b'}')? {
                let mut function = false;
                loop {
                    if self.key()? == b"function" {
                        once(&mut function)?;
                        if !self.null()? {
                            self.function(call_depth, text.as_deref_mut())?;
                        }
                    } else {
                        self.skip(call_depth)?;
                    }
                    if !self.next(b'}')? {
                        break;
                    }
                }
            }
            if !self.next(b']')? {
                return Some(());
            }
        }
    }

    fn function(&mut self, depth: usize, text: Option<&mut String>) -> Option<()> {
        let depth = depth.checked_sub(1)?;
        let mut arguments = None;
        let mut seen = false;
        if !self.open(b'{', b'}')? {
            loop {
                if self.key()? == b"arguments" {
                    once(&mut seen)?;
                    arguments = self.optional_string()?;
                } else {
                    self.skip(depth)?;
                }
                if !self.next(b'}')? {
                    break;
                }
            }
        }
        if let (Some(text), Some(span)) = (text, arguments) {
            self.decode(span, text)?;
            self.decoded += 1;
        }
        Some(())
    }

    /// A string's raw inside, if it is UTF-8.
    fn text(&self, span: Span) -> Option<&'a str> {
        std::str::from_utf8(self.s.get(span.start..span.end)?).ok()
    }

    /// Appends a string's value; `None` for invalid UTF-8 or a lone surrogate (which serde
    /// refuses).
    fn decode(&self, span: Span, out: &mut String) -> Option<()> {
        let raw = self.text(span)?;
        if !span.escaped {
            out.push_str(raw);
            return Some(());
        }
        unescape(raw, out)
    }
}

/// Decodes the inside of a JSON string whose escapes were validated.
fn unescape(raw: &str, out: &mut String) -> Option<()> {
    let mut rest = raw;
    while let Some(at) = rest.find('\\') {
        out.push_str(rest.get(..at)?);
        let escape = rest.get(at + 1..)?;
        let (ch, used) = match escape.as_bytes().first()? {
            b'"' => ('"', 1),
            b'\\' => ('\\', 1),
            b'/' => ('/', 1),
            b'b' => ('\u{8}', 1),
            b'f' => ('\u{c}', 1),
            b'n' => ('\n', 1),
            b'r' => ('\r', 1),
            b't' => ('\t', 1),
            b'u' => {
                let unit = hex4(escape.get(1..5)?)?;
                match unit {
                    0xD800..=0xDBFF => {
                        if escape.get(5..7) != Some("\\u") {
                            return None;
                        }
                        let low = hex4(escape.get(7..11)?)?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return None;
                        }
                        let code = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                        (char::from_u32(code)?, 11)
                    }
                    0xDC00..=0xDFFF => return None,
                    _ => (char::from_u32(unit)?, 5),
                }
            }
            _ => return None,
        };
        out.push(ch);
        rest = escape.get(used..)?;
    }
    out.push_str(rest);
    Some(())
}

fn hex4(digits: &str) -> Option<u32> {
    if digits.len() != 4 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(digits, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use llm_gateway_shared::request::Api;
    use llm_gateway_shared::usage::StreamUsage;
    use proptest::prelude::*;

    #[test]
    fn apply_event_reads_the_template_chunk_before_it_is_framed() {
        let first = br#"{"id":"c","choices":[{"delta":{"content":"ab"}}],"usage":null}"#;
        let mut text = String::new();
        let chunk = scan(first, &mut text).unwrap();
        let mut template = Template::default();
        template.set(first, chunk.content.unwrap());
        let event = br#"data: {"id":"c","choices":[{"delta":{"content":"x\u00e9"}}],"usage":null}"#;
        for (rest, read) in [
            (&b"\n\ndata: more"[..], true),
            (b"\n\n", true),
            (b"\n", false),
            (b"\r\n\r\n", false),
            (b"\n\r\n", false),
            (b" \n\n", false),
        ] {
            let bytes = [&event[..], rest].concat();
            let mut text = String::from("kept");
            let len = template.apply_event(&bytes, &mut text);
            if read {
                assert_eq!(len, Some(event.len() + 2));
                assert_eq!(text, "keptxé");
            } else {
                assert_eq!((len, text.as_str()), (None, "kept"));
            }
        }
        // no space after `data:` is the same event; another member or key is not the template
        let mut text = String::new();
        let tight = br#"data:{"id":"c","choices":[{"delta":{"content":"y"}}],"usage":null}"#;
        let len = template.apply_event(&[&tight[..], b"\n\n"].concat(), &mut text);
        assert_eq!((len, text.as_str()), (Some(tight.len() + 2), "y"));
        for other in [
            &br#"data: {"id":"d","choices":[{"delta":{"content":"y"}}],"usage":null}"#[..],
            br#"data: {"id":"c","choices":[{"delta":{"content":"y"}}],"usage":{}}"#,
            br#"data: {"id":"c","choices":[{"delta":{"content":"y\ud800"}}],"usage":null}"#,
            br#"event: x"#,
        ] {
            let mut text = String::new();
            assert_eq!(
                template.apply_event(&[other, b"\n\n"].concat(), &mut text),
                None
            );
            assert_eq!(text, "");
        }
    }

    /// The fast path against the full parse: whenever it answers, it answers the same.
    fn agrees(data: &str) -> bool {
        let data = data.trim();
        let mut text = String::new();
        let Some(chunk) = scan(data.as_bytes(), &mut text) else {
            return false;
        };
        let mut full = StreamUsage::new(Api::ChatCompletions);
        let info = full.on_event(None, data);
        assert!(!info.has_usage && !info.usage_only, "{data}");
        assert_eq!(text, info.text, "{data}");
        assert_eq!(chunk.model, full.model(), "{data}");
        true
    }

    #[test]
    fn reads_the_usual_chunks() {
        for data in [
            r#"{"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"tok0 "},"finish_reason":null}],"usage":null}"#,
            r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"choices":[{"delta":{}, "finish_reason":"stop"}]}"#,
            r#" { "model" : "m" , "choices" : [ { "delta" : { "content" : "a\"b\u00e9\n\ud83d\ude00" } } ] } "#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{\"x\":"}}],"refusal":"r","content":"c","reasoning_content":"t"}},{"delta":{"content":"2"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":null},{"function":{"arguments":null}},{"id":"x"}]}}]}"#,
            r#"{"choices":null,"usage":null,"type":null,"model":null,"x":[1,-2.5e+3,true,false,null,{"a":[]}]}"#,
            r#"{}"#,
            r#"{"choices":[]}"#,
        ] {
            assert!(agrees(data), "fast path refused {data}");
        }
    }

    #[test]
    fn leaves_to_serde_what_it_cannot_be_sure_of() {
        for data in [
            r#"{"choices":[],"usage":{"prompt_tokens":1}}"#,
            r#"{"choices":[{"delta":{"content":5}}]}"#,
            r#"{"model":7,"choices":[{"delta":{"content":"a"}}]}"#,
            r#"{"choices":[{"delta":{"content":"a","content":"b"}}]}"#,
            r#"{"choices":[{"delta":{"content":"\ud800"}}]}"#,
            r#"{"choices":[{"delta":{"content":"a"}}],}"#,
            r#"{"ch\u006fices":[]}"#,
            r#"{"message":{"model":"m"}}"#,
            r#"{"choices":[null]}"#,
            r#"{"x":01}"#,
            r#"{"x":"a	b"}"#,
            r#"[1]"#,
            r#"{"a":1} x"#,
            "{\"choices\":[{\"delta\":{\"content\":\"a\"}}]",
        ] {
            let mut text = String::new();
            assert_eq!(scan(data.as_bytes(), &mut text), None, "{data}");
        }
        let deep = format!("{{\"x\":{}{}}}", "[".repeat(40), "]".repeat(40));
        assert_eq!(scan(deep.as_bytes(), &mut String::new()), None);
        // a line break is no whitespace here: the data must be one line
        assert_eq!(scan(b"{\n}", &mut String::new()), None);
        let invalid = b"{\"choices\":[{\"delta\":{\"content\":\"\xff\"}}]}";
        assert_eq!(scan(invalid, &mut String::new()), None);
    }

    /// Pieces of chunks, glued in any order: whatever the fast path accepts, the full parse
    /// reads the same way; and it accepts every well-formed usual chunk.
    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(r#""choices""#.to_string()),
            Just(r#""delta""#.to_string()),
            Just(r#""content""#.to_string()),
            Just(r#""reasoning_content""#.to_string()),
            Just(r#""tool_calls""#.to_string()),
            Just(r#""function""#.to_string()),
            Just(r#""arguments""#.to_string()),
            Just(r#""model""#.to_string()),
            Just(r#""usage""#.to_string()),
            Just("null".to_string()),
            Just("{".to_string()),
            Just("}".to_string()),
            Just("[".to_string()),
            Just("]".to_string()),
            Just(":".to_string()),
            Just(",".to_string()),
            Just(" ".to_string()),
            Just("1".to_string()),
            Just(r#""\ud83d\ude00""#.to_string()),
            Just(r#""\ud83d""#.to_string()),
            "\"[a-z \\\\\"é]{0,6}\"",
        ]
    }

    /// `same` before the 32-byte blocks, eight bytes a step.
    fn same_before(a: Option<&[u8]>, b: &[u8]) -> bool {
        let Some(a) = a else {
            return false;
        };
        if a.len() != b.len() {
            return false;
        }
        let (mut x, mut y) = (a.chunks_exact(8), b.chunks_exact(8));
        for (p, q) in x.by_ref().zip(y.by_ref()) {
            if u64::from_ne_bytes(p.try_into().unwrap())
                != u64::from_ne_bytes(q.try_into().unwrap())
            {
                return false;
            }
        }
        x.remainder() == y.remainder()
    }

    proptest! {
        /// `same` is slice equality (and the old 8-byte comparison), whatever the lengths and
        /// wherever the bytes differ: in a 32-byte block, in a word after the blocks, in the
        /// last bytes (which the last, overlapping word covers).
        #[test]
        fn same_is_equality(
            a in proptest::collection::vec(0u8..4, 0..120),
            flip in proptest::option::of((0usize..120, 1u8..4)),
            longer in proptest::bool::weighted(0.1),
        ) {
            let mut b = a.clone();
            if let Some((at, by)) = flip {
                if let Some(byte) = b.get_mut(at % a.len().max(1)) {
                    *byte ^= by;
                }
            }
            if longer {
                b.push(0);
            }
            let expected = a == b;
            prop_assert_eq!(same(Some(&a), &b), expected);
            prop_assert_eq!(same_before(Some(&a), &b), expected);
            prop_assert!(!same(None, &b));
        }
    }

    proptest! {
        #[test]
        fn whatever_it_accepts_the_full_parse_reads_alike(pieces in proptest::collection::vec(piece(), 0..40)) {
            let data: String = pieces.concat();
            agrees(&data);
        }

        #[test]
        fn a_chunk_with_one_byte_changed_is_read_alike_or_left_to_serde(
            at in 0usize..400,
            byte in proptest::sample::select(br#"{}[]:,"\ nu0a5eE.-+/"#.to_vec()),
            edit in 0u8..3,
        ) {
            let base = r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"a\n\u00e9","tool_calls":[{"function":{"arguments":"{\"x\":1}"}}]},"finish_reason":null}],"usage":null,"n":-1.5e3}"#;
            let mut bytes = base.as_bytes().to_vec();
            let at = at % (bytes.len() + 1);
            match edit {
                0 if at < bytes.len() => bytes[at] = byte,
                1 if at < bytes.len() => { bytes.remove(at); }
                _ => bytes.insert(at, byte),
            }
            if let Ok(data) = std::str::from_utf8(&bytes) {
                agrees(data);
            }
        }

        /// A template reads a chunk as the scan does, and only when the scan would read it so.
        #[test]
        fn a_template_reads_like_the_scan(
            first in "([a-z é😀]|\\\\[nt\"\\\\/]|\\\\u00e9){0,6}",
            content in "([a-z\"é😀\t]|\\\\[nt\"\\\\/x]|\\\\u[0-9a-fA-F]{0,4}|\\\\ud83d|\\\\ude00){0,8}",
            around in 0usize..4,
        ) {
            let (head, tail) = [
                (r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"content":""#, r#""},"finish_reason":null}],"usage":null}"#),
                (r#"{"choices":[{"delta":{"role":"assistant","content":""#, r#"","refusal":null}}]}"#),
                (r#"{"choices":[{"delta":{"content":""#, r#"","tool_calls":[{"function":{"arguments":""}}]}}]}"#),
                (r#"{"choices":[{"delta":{"reasoning_content":"r","content":""#, r#""}}]}"#),
            ][around];
            let template_data = format!("{head}{first}{tail}");
            let mut text = String::new();
            let Some(chunk) = scan(template_data.as_bytes(), &mut text) else {
                return Ok(());
            };
            let mut template = Template::default();
            match chunk.content {
                Some(content) => template.set(template_data.as_bytes(), content),
                // several strings gave text: no template
                None => {
                    prop_assert!(around >= 2);
                    return Ok(());
                }
            }
            let data = format!("{head}{content}{tail}");
            let (mut fast, mut full) = (String::new(), String::new());
            let applied = template.apply(data.as_bytes(), &mut fast);
            let scanned = scan(data.as_bytes(), &mut full);
            if applied {
                prop_assert!(scanned.is_some(), "{}", data);
                prop_assert_eq!(&fast, &full);
                prop_assert!(agrees(&data));
            } else {
                prop_assert!(fast.is_empty());
                // refused: the content is no valid string in that place
                prop_assert!(scanned.is_none(), "{}", data);
            }
        }

        #[test]
        fn usual_chunks_take_the_fast_path(
            contents in proptest::collection::vec(proptest::option::of("[a-zé\"\\\\\n😀 ]{0,12}"), 1..4),
            args in proptest::option::of("[a-z{}\":]{0,12}"),
            model in "[a-z0-9.-]{1,12}",
        ) {
            let choices: Vec<serde_json::Value> = contents.iter().enumerate().map(|(i, c)| {
                let mut delta = serde_json::json!({"role": "assistant", "content": c});
                if let Some(a) = &args {
                    delta["tool_calls"] = serde_json::json!([{"index": 0, "function": {"name": "f", "arguments": a}}]);
                }
                serde_json::json!({"index": i, "delta": delta, "finish_reason": null})
            }).collect();
            let data = serde_json::json!({"id": "x", "created": 17, "model": model, "choices": choices, "usage": null}).to_string();
            prop_assert!(agrees(&data), "refused {}", data);
        }
    }
}
