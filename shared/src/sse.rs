//! Server-sent events, framed across arbitrary network chunk boundaries.
//!
//! The grammar (WHATWG HTML, "Parsing an event stream"): the stream is lines ended by CRLF, LF
//! or CR; a blank line ends an event; a line starting with `:` is a comment; otherwise a line
//! is `field: value` (one space after the colon is dropped; a line without a colon is a field
//! with an empty value); `data` lines are joined with `\n`.
//!
//! [`Framer`] is fed chunks as they arrive ([`Framer::push`]) and hands out complete events
//! ([`Framer::next_event`]), each with its raw bytes so a filter can pass an event through
//! untouched or replace it. Work is proportional to the new bytes: each byte is looked at
//! once, and consumed events are dropped from the buffer once per push, not once per event.
//!
//! Memory is bounded: when an unfinished event grows past `max_event_bytes`, the framer gives
//! its bytes so far as [`SseError::Overflow`] and keeps passing the rest of that event through
//! as more `Overflow` items until the event ends; then it frames normally again. Concatenating
//! the raw bytes of every item, then [`Framer::finish`], gives back the input exactly.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

/// One complete event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The event's bytes as received, the terminating blank line included.
    pub raw: Vec<u8>,
    /// The `event:` field (the last one when repeated).
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`; `None` when the event has no data line.
    pub data: Option<String>,
    /// The `id:` field.
    pub id: Option<String>,
}

impl Event {
    /// Parses one event's raw bytes (as [`Framer`] cuts them). Invalid UTF-8 in a field is
    /// replaced by U+FFFD in the parsed fields; `raw` keeps the original bytes.
    pub fn parse(raw: Vec<u8>) -> Event {
        let (event, data, id) = {
            let parsed = EventRef::parse(&raw);
            (
                parsed.event.map(Cow::into_owned),
                parsed.data.map(Cow::into_owned),
                parsed.id.map(Cow::into_owned),
            )
        };
        Event {
            raw,
            event,
            data,
            id,
        }
    }

    /// Whether this is OpenAI's end-of-stream marker, `data: [DONE]`.
    pub fn is_done(&self) -> bool {
        self.data.as_deref().map(str::trim) == Some("[DONE]")
    }
}

/// One complete event borrowed from the bytes it was cut from ([`Framer::next_raw`]): what
/// [`Event`] holds, without copying — a field is allocated only when it must be joined
/// (several `data:` lines) or repaired (invalid UTF-8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRef<'a> {
    /// The event's bytes as received, the terminating blank line included.
    pub raw: &'a [u8],
    /// The `event:` field (the last one when repeated).
    pub event: Option<Cow<'a, str>>,
    /// The `data:` lines joined with `\n`; `None` when the event has no data line.
    pub data: Option<Cow<'a, str>>,
    /// The `id:` field.
    pub id: Option<Cow<'a, str>>,
}

impl<'a> EventRef<'a> {
    /// Parses one event's raw bytes, as [`Event::parse`] does.
    pub fn parse(raw: &'a [u8]) -> EventRef<'a> {
        let mut event = None;
        let mut data: Option<Cow<'a, str>> = None;
        let mut id = None;
        for line in lines(raw) {
            if line.is_empty() || line.first() == Some(&b':') {
                continue;
            }
            let (name, value) = match line.iter().position(|&b| b == b':') {
                Some(colon) => {
                    let value = line.get(colon + 1..).unwrap_or_default();
                    let value = value.strip_prefix(b" ").unwrap_or(value);
                    (line.get(..colon).unwrap_or_default(), value)
                }
                None => (line, &[][..]),
            };
            let value = match std::str::from_utf8(value) {
                Ok(text) => Cow::Borrowed(text),
                Err(_) => String::from_utf8_lossy(value),
            };
            match name {
                b"data" => match &mut data {
                    Some(joined) => {
                        let joined = joined.to_mut();
                        joined.push('\n');
                        joined.push_str(&value);
                    }
                    None => data = Some(value),
                },
                b"event" => event = Some(value),
                b"id" => id = Some(value),
                _ => {}
            }
        }
        EventRef {
            raw,
            event,
            data,
            id,
        }
    }
}

/// The bytes of an event with the given `event:` name and `data` (split into one `data:`
/// line per `\n`), ended by a blank line, with LF line endings.
pub fn encode(event: Option<&str>, data: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 16);
    if let Some(name) = event {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
    for line in data.split('\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
    out
}

/// The index of the first `\n` or `\r` in `bytes`, or its length. The framer and the parser
/// look at nearly every byte of a stream through it, and wasm without SIMD has no faster
/// `memchr`: it skips sixteen bytes per step while none is below 0x0e (LF is 0x0a, CR 0x0d; the
/// other control bytes are rare in a stream and only end the fast part early), then finds the
/// byte itself in the last few. `w - 0x0e…0e & !w & 0x80…80` is nonzero exactly when a byte
/// of the word is below 0x0e.
fn line_end(bytes: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let low = |word: &[u8]| {
        let word = word.try_into().map_or(0, u64::from_le_bytes);
        word.wrapping_sub(ONES * 0x0e) & !word & HIGH
    };
    let mut done = 0;
    for pair in bytes.chunks_exact(16) {
        let (a, b) = pair.split_at(8);
        if low(a) | low(b) != 0 {
            break;
        }
        done += 16;
    }
    let tail = bytes.get(done..).unwrap_or_default();
    done + tail
        .iter()
        .position(|&b| b == b'\n' || b == b'\r')
        .unwrap_or(tail.len())
}

/// Splits `raw` into lines at CRLF, LF or CR, terminators dropped.
fn lines(raw: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = raw;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        match Some(line_end(rest)).filter(|&end| end < rest.len()) {
            Some(end) => {
                let line = rest.get(..end).unwrap_or_default();
                let skip = if rest.get(end..end + 2) == Some(b"\r\n") {
                    2
                } else {
                    1
                };
                rest = rest.get(end + skip..).unwrap_or_default();
                Some(line)
            }
            None => {
                let line = rest;
                rest = &[];
                Some(line)
            }
        }
    })
}

/// Why [`Framer::next_event`] handed out raw bytes instead of an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseError {
    /// An unfinished event grew past the bound. `raw` is the next part of it; the caller
    /// passes it through (or drops it) without an event's meaning.
    Overflow { raw: Vec<u8> },
}

impl SseError {
    /// The bytes this item carries.
    pub fn raw(&self) -> &[u8] {
        match self {
            SseError::Overflow { raw } => raw,
        }
    }
}

impl fmt::Display for SseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SseError::Overflow { raw } => write!(
                f,
                "server-sent event larger than the framing bound ({} bytes passed through)",
                raw.len()
            ),
        }
    }
}

impl std::error::Error for SseError {}

/// Cuts a byte stream into events. See the module documentation.
#[derive(Debug)]
pub struct Framer {
    buf: Vec<u8>,
    /// Start of the first byte not yet handed out.
    start: usize,
    /// Next byte to look at.
    scan: usize,
    /// The current line has at least one byte.
    in_line: bool,
    /// The last terminator was a CR: an LF right after it belongs to it.
    skip_lf: bool,
    /// Passing an oversized event through.
    overflowing: bool,
    /// The stream has ended: nothing more will follow the last byte.
    closed: bool,
    max_event_bytes: usize,
}

impl Framer {
    /// A framer that buffers at most about `max_event_bytes` of an unfinished event.
    pub fn new(max_event_bytes: usize) -> Self {
        Framer {
            buf: Vec::new(),
            start: 0,
            scan: 0,
            in_line: false,
            skip_lf: false,
            overflowing: false,
            closed: false,
            max_event_bytes: max_event_bytes.max(1),
        }
    }

    /// Appends the next chunk of the stream.
    pub fn push(&mut self, chunk: &[u8]) {
        if self.start > 0 {
            self.buf.drain(..self.start.min(self.buf.len()));
            self.scan = self.scan.saturating_sub(self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(chunk);
    }

    /// Bytes held for an event that has not ended yet.
    pub fn pending(&self) -> usize {
        self.buf.len().saturating_sub(self.start)
    }

    /// True when the framer holds nothing and stands at an event boundary: the next byte
    /// pushed starts a new event (nothing pending, no oversized event being passed through, no
    /// CR waiting for a possible LF, not closed). A caller may then cut complete events off the
    /// front of a chunk itself and push only the rest: the framer hands out the same items
    /// for that rest as it would after cutting those events.
    pub fn is_idle(&self) -> bool {
        self.at_boundary() && self.start == self.buf.len() && !self.closed
    }

    /// Nothing of the next event has been looked at: no partial line, no pending CR, no
    /// oversized event passing through.
    fn at_boundary(&self) -> bool {
        self.scan == self.start && !self.in_line && !self.skip_lf && !self.overflowing
    }

    /// The next complete event, or raw bytes of an oversized one; `None` when more input is
    /// needed.
    pub fn next_event(&mut self) -> Option<Result<Event, SseError>> {
        Some(match self.next_raw()? {
            RawItem::Event(raw) => Ok(Event::parse(raw.to_vec())),
            RawItem::Overflow(raw) => Err(SseError::Overflow { raw: raw.to_vec() }),
        })
    }

    /// [`Framer::next_event`] without copying: the item borrows the framer's buffer (parse an
    /// event with [`EventRef::parse`]). The same items, in the same order.
    pub fn next_raw(&mut self) -> Option<RawItem<'_>> {
        let (span, overflow) = self.next_span()?;
        let raw = self.buf.get(span).unwrap_or_default();
        Some(if overflow {
            RawItem::Overflow(raw)
        } else {
            RawItem::Event(raw)
        })
    }

    /// Where the next item starts in the framer's buffer: with [`Framer::handed_out`], the
    /// bytes of the items handed out between two positions. Valid until the next `push`.
    pub fn position(&self) -> usize {
        self.start
    }

    /// The bytes handed out in `range` (positions from [`Framer::position`] since the last
    /// `push`); empty for a range that is not that.
    pub fn handed_out(&self, range: Range<usize>) -> &[u8] {
        if range.end > self.start {
            return &[];
        }
        self.buf.get(range).unwrap_or_default()
    }

    /// The bytes not yet handed out, when the framer stands at the start of an event with
    /// nothing of it looked at (no partial line, no pending CR, no oversized event passing
    /// through); `None` otherwise. For a caller that recognizes a usual event faster than the
    /// framer: see [`Framer::take_line_event`].
    pub fn at_event_start(&self) -> Option<&[u8]> {
        self.at_boundary()
            .then(|| self.buf.get(self.start..).unwrap_or_default())
    }

    /// Hands out the first `len` bytes of [`Framer::at_event_start`] as an event, exactly as
    /// [`Framer::next_raw`] would, when the caller knows them to be one line without CR or LF
    /// followed by `\n\n` (the caller's check; this one only looks at the last two bytes).
    /// `None`, and nothing changes, if the framer is not at an event's start or the bytes do
    /// not end with `\n\n`.
    pub fn take_line_event(&mut self, len: usize) -> Option<&[u8]> {
        let end = self.start.checked_add(len)?;
        let bytes = self.at_event_start()?.get(..len)?;
        if len < 3 || !bytes.ends_with(b"\n\n") {
            return None;
        }
        let span = self.start..end;
        self.start = end;
        self.scan = end;
        self.buf.get(span)
    }

    /// The bytes of the next item and whether they are an overflow.
    fn next_span(&mut self) -> Option<(Range<usize>, bool)> {
        while let Some(&byte) = self.buf.get(self.scan) {
            if std::mem::take(&mut self.skip_lf) && byte == b'\n' {
                self.scan += 1;
                continue;
            }
            self.scan += 1;
            if byte != b'\n' && byte != b'\r' {
                self.in_line = true;
                // the rest of the line in one search
                let rest = self.buf.get(self.scan..).unwrap_or_default();
                self.scan += line_end(rest);
                continue;
            }
            self.skip_lf = byte == b'\r';
            if std::mem::take(&mut self.in_line) {
                continue;
            }
            // A blank line: the event ends here, with the LF of a CRLF. A CR that is the last
            // byte so far waits for the next byte, so an event's raw bytes never depend on
            // where the network cut the stream.
            if self.skip_lf {
                match self.buf.get(self.scan) {
                    Some(b'\n') => {
                        self.scan += 1;
                        self.skip_lf = false;
                    }
                    None if !self.closed => {
                        self.scan -= 1;
                        self.skip_lf = false;
                        break;
                    }
                    _ => {}
                }
            }
            let span = self.take_span();
            return Some((span, std::mem::take(&mut self.overflowing)));
        }
        let held = self.scan - self.start;
        if held > 0 && (self.overflowing || held > self.max_event_bytes) {
            self.overflowing = true;
            return Some((self.take_span(), true));
        }
        None
    }

    /// Marks the end of the stream: an event whose blank line is a CR at the very end is then
    /// complete (until then it waits for a possible LF). Call before draining the last
    /// events with [`Framer::next_event`] and before [`Framer::finish`].
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// End of stream: the bytes of an unterminated last event, if any (the grammar discards
    /// such an event; a filter usually passes the bytes on).
    pub fn finish(&mut self) -> Option<Vec<u8>> {
        self.scan = self.buf.len();
        let tail = self.take();
        self.buf.clear();
        self.start = 0;
        self.scan = 0;
        self.in_line = false;
        self.skip_lf = false;
        self.overflowing = false;
        self.closed = false;
        (!tail.is_empty()).then_some(tail)
    }

    fn take(&mut self) -> Vec<u8> {
        let span = self.take_span();
        self.buf.get(span).unwrap_or_default().to_vec()
    }

    /// Hands out the bytes up to the scan position.
    fn take_span(&mut self) -> Range<usize> {
        let span = self.start..self.scan;
        self.start = self.scan;
        span
    }
}

/// An item of [`Framer::next_raw`], borrowed from the framer's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawItem<'a> {
    /// A complete event's bytes.
    Event(&'a [u8]),
    /// The next part of an oversized event (see [`SseError::Overflow`]).
    Overflow(&'a [u8]),
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Every item of a whole stream fed in `chunks`, as (parsed event or overflow raw).
    fn frame(chunks: &[&[u8]], max: usize) -> (Vec<Result<Event, SseError>>, Option<Vec<u8>>) {
        let mut framer = Framer::new(max);
        let mut items = Vec::new();
        for chunk in chunks {
            framer.push(chunk);
            while let Some(item) = framer.next_event() {
                items.push(item);
            }
        }
        framer.close();
        while let Some(item) = framer.next_event() {
            items.push(item);
        }
        let tail = framer.finish();
        (items, tail)
    }

    fn data(items: &[Result<Event, SseError>]) -> Vec<Option<String>> {
        items
            .iter()
            .map(|i| i.as_ref().ok().and_then(|e| e.data.clone()))
            .collect()
    }

    #[test]
    fn a_line_event_taken_at_an_event_start_is_what_next_raw_gives() {
        let stream = b"data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: x\r\n\r\n";
        let mut slow = Framer::new(1 << 10);
        slow.push(stream);
        let mut fast = Framer::new(1 << 10);
        fast.push(stream);
        for len in [15, 15] {
            let Some(RawItem::Event(expected)) = slow.next_raw() else {
                panic!("an event")
            };
            let expected = expected.to_vec();
            let at = fast.position();
            assert_eq!(
                fast.at_event_start().map(|b| b.len()),
                Some(stream.len() - at)
            );
            assert_eq!(fast.take_line_event(len), Some(&expected[..]));
            assert_eq!(fast.handed_out(at..fast.position()), &expected[..]);
        }
        // a CRLF event is not a line event; the framer is unchanged and frames it
        assert_eq!(fast.take_line_event(11), None);
        assert_eq!(fast.next_raw(), slow.next_raw());
        assert_eq!(fast.pending(), 0);
        // mid-line, or past what is buffered: nothing is taken
        let mut framer = Framer::new(1 << 10);
        framer.push(b"data: a");
        assert_eq!(framer.next_raw(), None);
        assert_eq!(framer.at_event_start(), None);
        framer.push(b"\n\n");
        assert_eq!(framer.take_line_event(9), None);
        assert_eq!(framer.next_raw(), Some(RawItem::Event(b"data: a\n\n")));
        framer.push(b"data: b\n\n");
        assert_eq!(framer.take_line_event(10), None);
        assert_eq!(framer.take_line_event(9), Some(&b"data: b\n\n"[..]));
        assert_eq!(framer.handed_out(0..99), b"");
    }

    #[test]
    fn lf_crlf_and_cr_separators() {
        for stream in [
            &b"data: a\n\ndata: b\n\n"[..],
            b"data: a\r\n\r\ndata: b\r\n\r\n",
            b"data: a\r\rdata: b\r\r",
            b"data: a\n\r\ndata: b\r\n\n",
        ] {
            let (items, tail) = frame(&[stream], 1024);
            assert_eq!(
                data(&items),
                [Some("a".into()), Some("b".into())],
                "{stream:?}"
            );
            assert_eq!(tail, None);
            let raw: Vec<u8> = items
                .iter()
                .flat_map(|i| i.as_ref().unwrap().raw.clone())
                .collect();
            assert_eq!(raw, stream);
        }
    }

    #[test]
    fn fields_comments_and_multiline_data() {
        let stream = b": keep-alive\n\nevent: message_delta\nid: 7\ndata: {\"a\":\ndata:1}\nretry: 5\nignored\n\n";
        let (items, _) = frame(&[stream], 1024);
        assert_eq!(items.len(), 2);
        let comment = items[0].as_ref().unwrap();
        assert_eq!(
            (comment.data.as_deref(), comment.event.as_deref()),
            (None, None)
        );
        let event = items[1].as_ref().unwrap();
        assert_eq!(event.event.as_deref(), Some("message_delta"));
        assert_eq!(event.id.as_deref(), Some("7"));
        assert_eq!(event.data.as_deref(), Some("{\"a\":\n1}"));
    }

    #[test]
    fn a_single_data_line_is_borrowed() {
        let parsed = EventRef::parse(b"event: e\ndata: {\"a\":1}\n\n");
        assert!(matches!(parsed.data, Some(Cow::Borrowed("{\"a\":1}"))));
        assert!(matches!(parsed.event, Some(Cow::Borrowed("e"))));
        let joined = EventRef::parse(b"data: a\ndata: b\n\n");
        assert_eq!(joined.data.as_deref(), Some("a\nb"));
    }

    #[test]
    fn value_space_and_colonless_lines() {
        let event = Event::parse(b"data:x\ndata:  y\ndata\n\n".to_vec());
        assert_eq!(event.data.as_deref(), Some("x\n y\n"));
    }

    #[test]
    fn done_marker() {
        let (items, _) = frame(&[b"data: [DONE]\n\n"], 64);
        assert!(items[0].as_ref().unwrap().is_done());
        assert!(!Event::parse(b"data: {}\n\n".to_vec()).is_done());
    }

    #[test]
    fn an_event_split_anywhere_is_the_same_event() {
        let stream = b"event: e\r\ndata: {\"x\": 1}\r\n\r\ndata: second\n\n";
        let whole = frame(&[stream], 1024);
        for cut in 0..=stream.len() {
            let (a, b) = stream.split_at(cut);
            assert_eq!(frame(&[a, b], 1024), whole, "cut at {cut}");
        }
    }

    #[test]
    fn unterminated_tail_comes_back_from_finish() {
        let (items, tail) = frame(&[b"data: a\n\ndata: cut mid-ev"], 1024);
        assert_eq!(data(&items), [Some("a".into())]);
        assert_eq!(tail.as_deref(), Some(&b"data: cut mid-ev"[..]));
    }

    #[test]
    fn oversized_events_pass_through_in_bounded_pieces() {
        let big = format!("data: {}\n\n", "x".repeat(100));
        let stream = format!("data: a\n\n{big}data: b\n\n");
        let chunks: Vec<&[u8]> = stream.as_bytes().chunks(7).collect();
        let mut framer = Framer::new(16);
        let mut items = Vec::new();
        for chunk in &chunks {
            framer.push(chunk);
            assert!(framer.pending() <= 16 + 7);
            while let Some(item) = framer.next_event() {
                items.push(item);
            }
        }
        assert_eq!(framer.finish(), None);
        let first = items.first().unwrap().as_ref().unwrap();
        assert_eq!(first.data.as_deref(), Some("a"));
        let last = items.last().unwrap().as_ref().unwrap();
        assert_eq!(last.data.as_deref(), Some("b"));
        let middle = &items[1..items.len() - 1];
        assert!(middle.len() > 1);
        assert!(middle
            .iter()
            .all(|i| matches!(i, Err(SseError::Overflow { .. }))));
        let passed: Vec<u8> = middle
            .iter()
            .flat_map(|i| i.as_ref().unwrap_err().raw().to_vec())
            .collect();
        assert_eq!(passed, big.as_bytes());
    }

    #[test]
    fn idle_only_at_an_event_boundary() {
        let mut framer = Framer::new(16);
        assert!(framer.is_idle());
        framer.push(b"data: a\n\ndata: b");
        assert!(!framer.is_idle());
        assert!(framer.next_event().is_some());
        assert!(!framer.is_idle(), "a partial event is held");
        framer.push(b"\n\n");
        assert!(framer.next_event().is_some());
        assert!(framer.is_idle());
        // a CR blank line at the end waits for a possible LF
        framer.push(b"data: c\r\r");
        assert!(framer.next_event().is_none());
        assert!(!framer.is_idle());
        framer.push(b"\n");
        assert!(framer.next_event().is_some());
        assert!(framer.is_idle());
        // an oversized event passed through: nothing pending, but not at a boundary
        framer.push(&[b'x'; 40]);
        assert!(matches!(framer.next_event(), Some(Err(_))));
        assert_eq!(framer.pending(), 0);
        assert!(!framer.is_idle());
        framer.push(b"\n\n");
        assert!(matches!(framer.next_event(), Some(Err(_))));
        assert!(framer.is_idle());
        framer.close();
        assert!(!framer.is_idle());
    }

    #[test]
    fn encode_round_trips() {
        let raw = encode(Some("delta"), "line1\nline2");
        assert_eq!(raw, b"event: delta\ndata: line1\ndata: line2\n\n");
        let (items, _) = frame(&[&raw], 1024);
        let event = items[0].as_ref().unwrap();
        assert_eq!(event.event.as_deref(), Some("delta"));
        assert_eq!(event.data.as_deref(), Some("line1\nline2"));
    }

    #[test]
    fn line_end_finds_the_first_lf_or_cr() {
        let naive = |b: &[u8]| {
            b.iter()
                .position(|&c| c == b'\n' || c == b'\r')
                .unwrap_or(b.len())
        };
        // each terminator at each place of a run of bytes that could fool the borrow trick
        for fill in [b'a', 0x00, 0x0b, 0x0c, 0x0e, 0x80, 0x8a, 0xff] {
            for stop in [b'\n', b'\r'] {
                for at in 0..=40 {
                    let mut bytes = vec![fill; 40];
                    if let Some(b) = bytes.get_mut(at) {
                        *b = stop;
                    }
                    assert_eq!(line_end(&bytes), naive(&bytes), "{bytes:?}");
                    assert_eq!(line_end(&bytes), at.min(40));
                }
            }
        }
        assert_eq!(line_end(b"data: {\"a\":1}\r\n"), 13);
    }

    #[cfg(not(target_arch = "wasm32"))]
    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn line_end_is_the_bytewise_search(bytes in prop::collection::vec(prop_oneof![
                4 => any::<u8>(),
                1 => prop::sample::select(vec![b'\n', b'\r', 0x00, 0x0b, 0x0e, 0x8a, 0x8d]),
            ], 0..100)) {
                let expected = bytes
                    .iter()
                    .position(|&c| c == b'\n' || c == b'\r')
                    .unwrap_or(bytes.len());
                prop_assert_eq!(line_end(&bytes), expected);
            }
        }

        fn raw_of(items: &[Result<Event, SseError>]) -> Vec<u8> {
            items
                .iter()
                .flat_map(|i| match i {
                    Ok(e) => e.raw.clone(),
                    Err(e) => e.raw().to_vec(),
                })
                .collect()
        }

        proptest! {
            /// Any chunking of any byte stream: the same items as unsplit (when no event
            /// overflows), and the bytes come back exactly.
            #[test]
            fn chunking_never_changes_the_events(
                stream in prop::collection::vec(prop::sample::select(
                    b"data: {}x\r\n:ev".to_vec()), 0..120),
                cuts in prop::collection::vec(0usize..120, 0..6),
            ) {
                let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(stream.len())).collect();
                cuts.sort_unstable();
                let mut chunks = Vec::new();
                let mut at = 0;
                for cut in cuts {
                    chunks.push(&stream[at..cut]);
                    at = cut;
                }
                chunks.push(&stream[at..]);
                let (items, tail) = frame(&chunks, 1 << 20);
                let (whole, whole_tail) = frame(&[&stream], 1 << 20);
                prop_assert_eq!(&data(&items), &data(&whole));
                let mut bytes = raw_of(&items);
                bytes.extend(tail.unwrap_or_default());
                prop_assert_eq!(&bytes, &stream);
                let mut whole_bytes = raw_of(&whole);
                whole_bytes.extend(whole_tail.unwrap_or_default());
                prop_assert_eq!(&whole_bytes, &stream);
            }

            /// `next_raw` + `EventRef::parse` hand out what `next_event` does, without copying.
            #[test]
            fn borrowed_items_are_the_owned_ones(
                stream in prop::collection::vec(prop::sample::select(
                    b"data: {}x\r\n:ev\xff".to_vec()), 0..160),
                chunk in 1usize..50,
                max in 4usize..64,
            ) {
                let (mut owned, mut borrowed) = (Framer::new(max), Framer::new(max));
                for c in stream.chunks(chunk) {
                    owned.push(c);
                    borrowed.push(c);
                    loop {
                        let (a, b) = (owned.next_event(), borrowed.next_raw());
                        match (a, b) {
                            (None, None) => break,
                            (Some(Ok(event)), Some(RawItem::Event(raw))) => {
                                let parsed = EventRef::parse(raw);
                                prop_assert_eq!(&event.raw[..], raw);
                                prop_assert_eq!(event.data.as_deref(), parsed.data.as_deref());
                                prop_assert_eq!(event.event.as_deref(), parsed.event.as_deref());
                                prop_assert_eq!(event.id.as_deref(), parsed.id.as_deref());
                            }
                            (Some(Err(overflow)), Some(RawItem::Overflow(raw))) => {
                                prop_assert_eq!(overflow.raw(), raw);
                            }
                            (a, b) => prop_assert!(false, "{:?} vs {:?}", a, b),
                        }
                    }
                }
                prop_assert_eq!(owned.finish(), borrowed.finish());
            }

            /// Whenever the framer is idle, what it hands out for the rest of the stream is
            /// what a new framer hands out for that rest: a caller may cut events itself there.
            #[test]
            fn an_idle_framer_is_a_new_framer(
                stream in prop::collection::vec(prop::sample::select(
                    b"data: {}x\r\n:ev".to_vec()), 0..140),
                chunk in 1usize..30,
                max in 4usize..64,
            ) {
                let items_of = |framer: &mut Framer, rest: &[u8]| {
                    let mut items = Vec::new();
                    for c in rest.chunks(chunk) {
                        framer.push(c);
                        while let Some(item) = framer.next_event() {
                            items.push(item);
                        }
                    }
                    framer.close();
                    while let Some(item) = framer.next_event() {
                        items.push(item);
                    }
                    (items, framer.finish())
                };
                let mut framer = Framer::new(max);
                prop_assert!(framer.is_idle());
                let mut fed = 0;
                for c in stream.chunks(chunk) {
                    framer.push(c);
                    fed += c.len();
                    while framer.next_event().is_some() {}
                    if framer.is_idle() {
                        prop_assert_eq!(framer.pending(), 0);
                        let rest = &stream[fed..];
                        let mut fresh = Framer::new(max);
                        let mut cont = Framer::new(max);
                        cont.push(&stream[..fed]);
                        while cont.next_event().is_some() {}
                        prop_assert!(cont.is_idle());
                        prop_assert_eq!(items_of(&mut cont, rest), items_of(&mut fresh, rest));
                    }
                }
            }

            /// With a tiny bound, memory stays bounded and no byte is lost or duplicated.
            #[test]
            fn overflow_keeps_every_byte(
                stream in prop::collection::vec(any::<u8>(), 0..300),
                chunk in 1usize..40,
            ) {
                let chunks: Vec<&[u8]> = stream.chunks(chunk).collect();
                let mut framer = Framer::new(8);
                let mut items = Vec::new();
                for c in &chunks {
                    framer.push(c);
                    prop_assert!(framer.pending() <= 8 + chunk);
                    while let Some(item) = framer.next_event() {
                        items.push(item);
                    }
                }
                let mut bytes = raw_of(&items);
                bytes.extend(framer.finish().unwrap_or_default());
                prop_assert_eq!(bytes, stream);
            }
        }
    }
}
