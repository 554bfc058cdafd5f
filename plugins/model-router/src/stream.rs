//! After the first byte: a streamed response that ends without its terminator gets an
//! in-band error event, so a client never mistakes a cut stream for a complete one.
//!
//! The watcher frames the SSE body exactly as [`llm_gateway_shared::sse::Framer`] does (so a
//! terminator split across chunks is found, and the text `data: [DONE]` inside a JSON string
//! is not taken for one) and remembers only whether a terminating event went by: `data: [DONE]`
//! for OpenAI APIs, `message_stop` for Anthropic Messages, `response.completed` /
//! `response.failed` / `response.incomplete` for the Responses API, or an `error` event the
//! provider sent itself.
//!
//! It runs on every event of every stream, so it does the least it can: one pass over each new
//! byte, which skips ordinary bytes eight at a time (SWAR) and stops only at line ends and at
//! the last byte of one of the [`MARKERS`] — four-byte windows of the words a terminating event
//! must contain — or at a `\` (a `\u00XX` escape could spell such a word inside JSON). Only an
//! event holding one of them is parsed and judged ([`is_terminal`]); the rest — almost every
//! event of a chat stream — is neither copied nor parsed nor allocated for, unless it straddles
//! two chunks (then its first part is kept until it ends).

use llm_gateway_shared::sse::Event;

/// Largest event the watcher frames; a larger one passes through without being looked at.
const MAX_EVENT_BYTES: usize = 1024 * 1024;

const TERMINAL_TYPES: [&str; 5] = [
    "message_stop",
    "response.completed",
    "response.failed",
    "response.incomplete",
    "error",
];

const fn window(bytes: &[u8; 4]) -> u32 {
    u32::from_be_bytes(*bytes)
}

/// Four consecutive bytes of each word a terminating event must spell: `[DONE]`, `error`
/// (the `error` event, type or top-level member), `message_stop`, `response.` (every Responses
/// API terminal type), each chosen to end with a byte that is rare in chat events. An event
/// without any of them, and without a `\u00` escape, is not terminal: every test of
/// [`is_terminal`] compares with one of these words, literally or as a JSON string (where only
/// a `\u00XX` escape can spell an ASCII letter, `_` or `.` differently).
pub const MARKERS: [u32; 4] = [
    window(b"[DON"),
    window(b"rror"),
    window(b"age_"),
    window(b"nse."),
];

/// What [`StreamWatcher::push`] does with a byte.
const PLAIN: u8 = 0;
const LF: u8 = 1;
const CR: u8 = 2;
/// The last byte of a marker.
const MARKER_END: u8 = 3;
const BACKSLASH: u8 = 4;

// Evaluated at compile time: an index out of range would fail the build, never panic.
#[allow(clippy::indexing_slicing)]
const CLASSES: [u8; 256] = {
    let mut classes = [PLAIN; 256];
    classes[b'\n' as usize] = LF;
    classes[b'\r' as usize] = CR;
    classes[b'\\' as usize] = BACKSLASH;
    let mut i = 0;
    while i < MARKERS.len() {
        classes[(MARKERS[i] & 0xff) as usize] = MARKER_END;
        i += 1;
    }
    classes
};

fn class(byte: u8) -> u8 {
    CLASSES.get(usize::from(byte)).copied().unwrap_or(PLAIN)
}

/// The four bytes ending at `chunk[end]`, the ones before the chunk taken from `before` (the
/// last four bytes of the stream before it).
fn window_at(chunk: &[u8], end: usize, before: u32) -> u32 {
    if let Some(&[a, b, c, d]) = end.checked_sub(3).and_then(|start| chunk.get(start..=end)) {
        return u32::from_be_bytes([a, b, c, d]);
    }
    chunk
        .get(..=end)
        .unwrap_or_default()
        .iter()
        .fold(before, |w, &b| w << 8 | u32::from(b))
}

fn is_marker(window: u32) -> bool {
    let [a, b, c, d] = MARKERS;
    window == a || window == b || window == c || window == d
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `word` equal to `byte`; exact for the lowest such byte (the
/// borrow of the subtraction starts only at a matching byte), which is all [`plain_run`] uses.
const fn equal(word: u64, byte: u8) -> u64 {
    let x = word ^ (ONES * byte as u64);
    x.wrapping_sub(ONES) & !x & HIGH
}

/// Flags every byte of `word` that is not [`PLAIN`], and the other control bytes below 0x0e
/// (rare; the caller steps over them as plain), exactly for the lowest flagged byte.
const fn stops(word: u64) -> u64 {
    let [a, b, c, d] = MARKERS;
    // below 0x0e: LF, CR (and NUL to 0x0c), one test for both
    (word.wrapping_sub(ONES * 0x0e) & !word & HIGH)
        | equal(word, b'\\')
        | equal(word, (a & 0xff) as u8)
        | equal(word, (b & 0xff) as u8)
        | equal(word, (c & 0xff) as u8)
        | equal(word, (d & 0xff) as u8)
}

/// How many bytes `bytes` starts with that [`stops`] lets pass, eight at a time (this loop
/// sees nearly every byte of a stream; a byte-at-a-time table lookup costs several times more).
fn plain_run(bytes: &[u8]) -> usize {
    let mut n = 0;
    let mut words = bytes.chunks_exact(8);
    for word in words.by_ref() {
        let flags = stops(word.try_into().map_or(0, u64::from_le_bytes));
        if flags != 0 {
            return n + (flags.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    let rest = words.remainder();
    n + rest
        .iter()
        .position(|&b| b < 0x0e || class(b) != PLAIN)
        .unwrap_or(rest.len())
}

/// Scans `chunk` from `at` to the first byte that [`plain_run`] stops at and that is no marker's
/// last byte (a line end, a backslash, another control byte below 0x0e) or to the chunk's end, and
/// returns its offset. A marker's last byte is judged where it stands (`suspect` set if the
/// window it ends is a marker) and the scan goes on, so the many such bytes of an ordinary
/// event cost no trip through the caller's loop.
// inlined in both callers: as a call (once it had two) it cost the watcher's loop ~2 % more fuel
#[inline(always)]
fn scan(chunk: &[u8], mut at: usize, before: u32, suspect: &mut bool) -> usize {
    loop {
        at += plain_run(chunk.get(at..).unwrap_or_default());
        match chunk.get(at) {
            Some(&byte) if class(byte) == MARKER_END => {
                *suspect |= is_marker(window_at(chunk, at, before));
                at += 1;
            }
            _ => return at,
        }
    }
}

/// A prefix shorter than this is scanned as usual.
const SKIP_MIN: usize = 16;

/// How far before the first differing byte the scan resumes: a `\` up to three bytes before
/// it looks at that byte (`\u00`), which it did not at the same place in the other event.
const LOOK: usize = 3;

/// How many bytes `a` and `b` start with in common, eight at a time.
///
/// When an event starts (nothing of it scanned, nothing carried) with bytes that repeat the
/// first line of an earlier event that was not suspect, those bytes hold no line end, no
/// marker and no `\u00` escape: a marker's window ending in them is the earlier event's at
/// the same place (the windows over the event's first three bytes reach back into the blank
/// line before it, which no marker holds), and a `\` more than [`LOOK`] bytes before the
/// first difference sees what it saw there. So the scan starts [`LOOK`] bytes before the
/// first difference, inside the first line, with the verdict unchanged: in a chat stream,
/// whose chunks repeat id, object, created, model and index, that skips most of each event.
// inlined in both callers, as `scan`
#[inline(always)]
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let mut n = 0;
    let (mut x, mut y) = (a.chunks_exact(8), b.chunks_exact(8));
    for (p, q) in x.by_ref().zip(y.by_ref()) {
        let p = p.try_into().map_or(0, u64::from_le_bytes);
        let q = q.try_into().map_or(0, u64::from_le_bytes);
        let diff = p ^ q;
        if diff != 0 {
            return n + (diff.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    let (a, b) = (
        a.get(n..).unwrap_or_default(),
        b.get(n..).unwrap_or_default(),
    );
    n + a.iter().zip(b).take_while(|(p, q)| p == q).count()
}

/// How many bytes `a` and `b` end with in common, eight at a time.
fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    let mut n = 0;
    let (mut x, mut y) = (a.rchunks_exact(8), b.rchunks_exact(8));
    for (p, q) in x.by_ref().zip(y.by_ref()) {
        // big-endian: a word's last byte is its lowest
        let p = p.try_into().map_or(0, u64::from_be_bytes);
        let q = q.try_into().map_or(0, u64::from_be_bytes);
        let diff = p ^ q;
        if diff != 0 {
            return n + (diff.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    let (a, b) = (
        a.get(..a.len().saturating_sub(n)).unwrap_or_default(),
        b.get(..b.len().saturating_sub(n)).unwrap_or_default(),
    );
    n + a
        .iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(p, q)| p == q)
        .count()
}

/// Largest chunk kept as [`StreamWatcher::template`].
const TEMPLATE_MAX: usize = 4096;

/// Watches one SSE response body.
#[derive(Debug)]
pub struct StreamWatcher {
    finished: bool,
    /// The current line has at least one byte.
    in_line: bool,
    /// The last terminator was a CR: an LF right after it belongs to it.
    skip_lf: bool,
    /// The current event ended with a blank line whose CR was the last byte so far: like the
    /// framer, the event counts once the next byte arrives (an LF then belongs to it).
    cr_pending: bool,
    /// The current event outgrew `max_event_bytes`: ignored until it ends.
    overflowing: bool,
    /// The bytes of the current event that came in earlier chunks.
    carry: Vec<u8>,
    /// The last four bytes of the stream so far, for a marker across chunks.
    window: u32,
    /// The current event holds a marker: judge it when it ends.
    suspect: bool,
    /// The first line (terminator excluded) of the last event that was not suspect and came
    /// whole in one chunk: see [`common_prefix`].
    previous: Vec<u8>,
    /// The last chunk that was one whole ordinary event: a single line without CR and its
    /// blank line `\n\n`, judged not suspect. A chunk that repeats it but for a middle is
    /// judged by the middle alone ([`StreamWatcher::repeats_template`]).
    template: Vec<u8>,
    max_event_bytes: usize,
}

impl Default for StreamWatcher {
    fn default() -> Self {
        StreamWatcher::with_max_event_bytes(MAX_EVENT_BYTES)
    }
}

/// True if a (complete) event ends the stream.
pub fn is_terminal(event: &Event) -> bool {
    if event.is_done() {
        return true;
    }
    if let Some(name) = &event.event {
        return TERMINAL_TYPES.contains(&name.as_str());
    }
    // no `event:` line: the JSON's top-level `type` (Responses API and Anthropic carry one)
    let Some(data) = &event.data else {
        return false;
    };
    let Ok(object) = llm_gateway_shared::json::scan_object(data.as_bytes(), &Default::default())
    else {
        return false;
    };
    if object.get("error").is_some() {
        return true;
    }
    matches!(
        object.str(data.as_bytes(), "type"),
        Ok(Some(t)) if TERMINAL_TYPES.contains(&t.as_str())
    )
}

impl StreamWatcher {
    /// A watcher that ignores events larger than `max` bytes (as the framer bounds them).
    pub fn with_max_event_bytes(max: usize) -> Self {
        StreamWatcher {
            finished: false,
            in_line: false,
            skip_lf: false,
            cr_pending: false,
            overflowing: false,
            carry: Vec::new(),
            window: 0,
            suspect: false,
            previous: Vec::new(),
            template: Vec::new(),
            max_event_bytes: max.max(1),
        }
    }

    /// Feeds the next chunk of the body.
    pub fn push(&mut self, chunk: &[u8]) {
        if self.finished || chunk.is_empty() {
            return;
        }
        let before = self.window;
        self.window = window_at(chunk, chunk.len() - 1, before);
        let clean = self.is_clean(before);
        if clean && self.repeats_template(chunk, before) {
            return;
        }
        // this chunk is one whole ordinary event, `line\n\n`: the template for the next ones
        let mut whole = false;
        // Where the current event's bytes start in `chunk`.
        let mut start = 0;
        let mut i = 0;
        if std::mem::take(&mut self.cr_pending) {
            if chunk.first() == Some(&b'\n') {
                i = 1;
            }
            let suspect = std::mem::take(&mut self.suspect);
            self.end_event(chunk.get(..i).unwrap_or_default(), suspect);
            if self.finished {
                return;
            }
            start = i;
        }
        let (mut in_line, mut skip_lf, mut suspect) = (self.in_line, self.skip_lf, self.suspect);
        // the bytes of this chunk the current event holds at the end (all but a pending CR)
        let mut end = chunk.len();
        // where the current event's first line ends, once seen
        let mut first_line_end = None;
        // how much of the current event's first line repeated `previous`
        let mut repeated = 0;
        loop {
            if i == start && !in_line && !skip_lf && self.carry.is_empty() && !self.overflowing {
                // An event starts here. Where it repeats the first line of the last ordinary
                // event, it holds nothing to stop at: the scan starts where they differ.
                let same = common_prefix(chunk.get(i..).unwrap_or_default(), &self.previous);
                if same > SKIP_MIN {
                    repeated = same;
                    i += same - LOOK;
                    in_line = true;
                }
            }
            let stop = scan(chunk, i, before, &mut suspect);
            if stop > i {
                i = stop;
                in_line = true;
                skip_lf = false;
            }
            let Some(&byte) = chunk.get(i) else {
                break;
            };
            i += 1;
            match class(byte) {
                // a control byte [`plain_run`] stopped at: part of the line
                PLAIN => {
                    in_line = true;
                    skip_lf = false;
                    continue;
                }
                BACKSLASH => {
                    // a `\u00XX` escape, or one this chunk cuts short
                    let next = chunk.get(i..).unwrap_or_default();
                    suspect |= b"u00".starts_with(next.get(..3).unwrap_or(next));
                    in_line = true;
                    skip_lf = false;
                    continue;
                }
                _ => {}
            }
            if std::mem::take(&mut skip_lf) && byte == b'\n' {
                continue;
            }
            skip_lf = byte == b'\r';
            if std::mem::take(&mut in_line) {
                if first_line_end.is_none() {
                    first_line_end = Some(i - 1);
                }
                continue;
            }
            // a blank line: the event ends here, with the LF of a CRLF
            if skip_lf {
                match chunk.get(i) {
                    Some(b'\n') => {
                        i += 1;
                        skip_lf = false;
                    }
                    None => {
                        skip_lf = false;
                        self.cr_pending = true;
                        end = i - 1;
                        break;
                    }
                    Some(_) => {}
                }
            }
            let suspect = std::mem::take(&mut suspect);
            // (from a clean start the first line end is the line's first CR or LF)
            whole = i == chunk.len()
                && clean
                && start == 0
                && !suspect
                && chunk.ends_with(b"\n\n")
                && first_line_end == i.checked_sub(2);
            if !suspect && self.carry.is_empty() && !self.overflowing {
                // kept unless it mostly repeated the one kept (then that one serves as well,
                // and the copy is spared)
                if let Some(line) = first_line_end.and_then(|e| chunk.get(start..e)) {
                    if repeated * 2 < line.len() {
                        self.previous.clear();
                        self.previous.extend_from_slice(line);
                    }
                }
            }
            first_line_end = None;
            repeated = 0;
            self.end_event(chunk.get(start..i).unwrap_or_default(), suspect);
            if self.finished {
                return;
            }
            start = i;
        }
        (self.in_line, self.skip_lf) = (in_line, skip_lf);
        // the unfinished event: kept (for a suspect one's verdict), or given up when too large
        let rest = chunk.get(start..end).unwrap_or_default();
        let held = if self.overflowing {
            rest.len()
        } else {
            self.carry.len() + rest.len()
        };
        if held > 0 && (self.overflowing || held > self.max_event_bytes) {
            self.overflowing = true;
            self.carry = Vec::new();
        } else {
            self.carry.extend_from_slice(rest);
        }
        self.suspect = suspect;
        if whole && chunk.len() <= TEMPLATE_MAX {
            self.template.clear();
            self.template.extend_from_slice(chunk);
        }
    }

    /// Between events: no line, event, carry or CR pending, and the stream's last byte (in
    /// `window`) an LF.
    fn is_clean(&self, window: u32) -> bool {
        !self.in_line
            && !self.skip_lf
            && !self.cr_pending
            && !self.overflowing
            && !self.suspect
            && self.carry.is_empty()
            && window & 0xff == u32::from(b'\n')
    }

    /// True if `chunk`, pushed between events (after an LF), is one whole ordinary event
    /// that the slow path would judge not suspect: it repeats [`Self::template`] but for a
    /// middle, and that middle holds no CR, LF or other control byte, no marker and no
    /// `\u00` escape. Then the chunk, like the template, is one line and its blank line
    /// `\n\n`. A marker window ending in the repeated front (after its first three bytes,
    /// whose windows hold the LF before the chunk) or in the repeated back (after its first
    /// three bytes) is the template's at the same place, and so is an escape there (one
    /// [`LOOK`] bytes before the middle is judged with it): the template was judged not
    /// suspect. Only the middle, widened by [`LOOK`] on both sides, is scanned.
    fn repeats_template(&mut self, chunk: &[u8], before: u32) -> bool {
        let template = self.template.as_slice();
        if template.is_empty() {
            return false;
        }
        let front = common_prefix(chunk, template);
        let room = chunk.len().min(template.len()).saturating_sub(front);
        let back = common_suffix(chunk, template).min(room);
        // the chunk ends as the template does: with its blank line
        if back < 2 {
            return false;
        }
        let from = front.saturating_sub(LOOK);
        let to = (chunk.len() - back + LOOK).min(chunk.len() - 2);
        let Some(region) = chunk.get(..to) else {
            return false;
        };
        let mut at = from;
        let mut suspect = false;
        loop {
            at = scan(region, at, before, &mut suspect);
            if suspect {
                return false;
            }
            match region.get(at) {
                None => break,
                Some(b'\\') => {
                    let next = chunk.get(at + 1..).unwrap_or_default();
                    if b"u00".starts_with(next.get(..3).unwrap_or(next)) {
                        return false;
                    }
                    at += 1;
                }
                // a line end or another control byte
                Some(_) => return false,
            }
        }
        if (front + back) * 2 < chunk.len() {
            // a poor match: this chunk, as ordinary, serves better
            self.template.clear();
            self.template.extend_from_slice(chunk);
        }
        true
    }

    /// The current event ended; `tail` is its part in the current chunk.
    fn end_event(&mut self, tail: &[u8], suspect: bool) {
        if std::mem::take(&mut self.overflowing) {
            // passed through unframed, like the framer's overflow items
        } else if suspect {
            let mut raw = std::mem::take(&mut self.carry);
            raw.extend_from_slice(tail);
            self.finished = is_terminal(&Event::parse(raw));
        }
        self.carry.clear();
    }

    /// True once a terminating event went by.
    pub fn finished(&self) -> bool {
        self.finished
    }
}

/// The event that ends a cut stream: OpenAI's error shape for OpenAI APIs, Anthropic's `error`
/// event for `/v1/messages`. Never followed by `[DONE]`.
pub fn interrupted_event(anthropic: bool) -> Vec<u8> {
    let message = "the upstream stream ended before the response was complete";
    if anthropic {
        format!(
            "event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"api_error\",\"message\":\"{message}\"}}}}\n\n"
        )
        .into_bytes()
    } else {
        format!(
            "data: {{\"error\":{{\"message\":\"{message}\",\"type\":\"api_error\",\"code\":\"upstream_stream_interrupted\"}}}}\n\n"
        )
        .into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llm_gateway_shared::sse::Framer;

    #[test]
    fn finds_the_terminator_at_every_split_point() {
        let stream = b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n";
        for split in 0..=stream.len() {
            let mut w = StreamWatcher::default();
            w.push(&stream[..split]);
            w.push(&stream[split..]);
            assert!(w.finished(), "split at {split}");
        }
        let anthropic = b"event: message_delta\ndata: {}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        for split in 0..=anthropic.len() {
            let mut w = StreamWatcher::default();
            w.push(&anthropic[..split]);
            w.push(&anthropic[split..]);
            assert!(w.finished(), "split at {split}");
        }
    }

    #[test]
    fn a_cut_stream_is_not_finished() {
        let mut w = StreamWatcher::default();
        w.push(b"data: {\"choices\":[{\"delta\":{\"content\":\"[DONE\"}}]}\n\n");
        w.push(b"data: {\"choices\":[{\"delta\":{\"content\":\"data: [DONE]\"}}]}\n\n");
        w.push(b"data: {\"choices\":[]}\n\n");
        // an unterminated last event does not count
        w.push(b"data: [DONE]");
        assert!(!w.finished());
    }

    #[test]
    fn responses_api_and_provider_errors_end_a_stream() {
        for stream in [
            &b"event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n"[..],
            b"data: {\"type\":\"response.incomplete\"}\n\n",
            b"event: error\ndata: {\"type\":\"error\"}\n\n",
            b"data: {\"error\":{\"message\":\"x\"}}\n\n",
        ] {
            let mut w = StreamWatcher::default();
            w.push(stream);
            assert!(w.finished(), "{}", String::from_utf8_lossy(stream));
        }
    }

    #[test]
    fn escaped_terminators_are_judged_too() {
        for stream in [
            &br#"data: {"type":"message\u005fstop"}"#[..],
            br#"data: {"\u0065rror":{}}"#,
            br#"data: {"type":"respons\u0065.completed"}"#,
        ] {
            let mut w = StreamWatcher::default();
            w.push(stream);
            w.push(b"\n\n");
            assert!(w.finished(), "{}", String::from_utf8_lossy(stream));
        }
    }

    #[test]
    fn a_repeated_line_is_judged_where_it_differs() {
        let ordinary =
            br#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","type":"eQror"}"#;
        for (last, terminal) in [
            (&br#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","type":"eQror"}"#[..], false),
            (br#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","type":"error"}"#, true),
            (br#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","type":"messageQu005fstop"}"#, false),
            (br#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","type":"message\u005fstop"}"#, true),
            (br#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","type":"message_stop"}"#, true),
        ] {
            let stream = [&ordinary[..], b"\n\n", ordinary, b"\n\n", last, b"\n\n"].concat();
            let mut w = StreamWatcher::default();
            w.push(&stream);
            assert_eq!(w.finished(), terminal, "{}", String::from_utf8_lossy(last));
        }
    }

    #[test]
    fn a_chunk_like_the_last_is_judged_by_its_middle() {
        for (template, chunk) in [
            (
                &b"data: {\"type\":\"ping-x\"}\n\n"[..],
                &b"data: {\"type\":\"error\"}\n\n"[..],
            ),
            (
                b"data: {\"type\":\"xxror\"}\n\n",
                b"data: {\"type\":\"error\"}\n\n",
            ),
            (
                b"data: {\"type\":\"ping-x\"}\n\n",
                br#"data: {"type":"erro\u0072"}"#,
            ),
            (
                b"data: {\"type\":\"message-stop\"}\n\n",
                b"data: {\"type\":\"message_stop\"}\n\n",
            ),
        ] {
            let chunk = if chunk.ends_with(b"\n\n") {
                chunk.to_vec()
            } else {
                [chunk, b"\n\n"].concat()
            };
            let mut w = StreamWatcher::default();
            w.push(b"\n");
            w.push(template);
            assert_eq!(w.template, template, "kept as the template");
            assert!(!w.finished());
            w.push(template);
            assert!(!w.finished());
            w.push(&chunk);
            assert!(w.finished(), "{}", String::from_utf8_lossy(&chunk));
        }
    }

    #[test]
    fn events_within_a_chunk_are_not_copied() {
        let mut w = StreamWatcher::default();
        for _ in 0..3 {
            w.push(b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n");
        }
        assert_eq!(w.carry.capacity(), 0);
        w.push(b"data: [DONE]\n\n");
        assert!(w.finished());
    }

    /// The watcher as it was: the shared framer, every event parsed and judged.
    struct Oracle {
        framer: Framer,
        finished: bool,
    }

    impl Oracle {
        fn new(max: usize) -> Self {
            Oracle {
                framer: Framer::new(max),
                finished: false,
            }
        }

        fn push(&mut self, chunk: &[u8]) {
            if self.finished {
                return;
            }
            self.framer.push(chunk);
            while let Some(item) = self.framer.next_event() {
                if let Ok(event) = item {
                    if is_terminal(&event) {
                        self.finished = true;
                        return;
                    }
                }
            }
        }
    }

    #[test]
    fn plain_run_stops_at_every_non_plain_byte() {
        let bytewise = |b: &[u8]| {
            b.iter()
                .position(|&c| c < 0x0e || class(c) != PLAIN)
                .unwrap_or(b.len())
        };
        for fill in [b'a', 0x00, 0x0f, 0x80, 0xff, b'M', b'q', b'^'] {
            for stop in [b'\n', b'\r', b'\\', b'N', b'r', b'_', b'.', 0x00, 0x0b] {
                for at in 0..=20 {
                    let mut bytes = vec![fill; 20];
                    if let Some(b) = bytes.get_mut(at) {
                        *b = stop;
                    }
                    assert_eq!(plain_run(&bytes), bytewise(&bytes), "{bytes:?}");
                }
            }
        }
        assert_eq!(plain_run(b"data: {\"id\":1}"), 14);
        assert_eq!(plain_run(b"{\"id\":\"chatcmpl\"}\n"), 17);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn plain_run_is_the_bytewise_scan(bytes in prop::collection::vec(prop_oneof![
                4 => any::<u8>(),
                1 => prop::sample::select(b"\n\r\\Nr_.\x00\x0d\x0e\x8a\xce".to_vec()),
            ], 0..60)) {
                let expected = bytes
                    .iter()
                    .position(|&c| c < 0x0e || class(c) != PLAIN)
                    .unwrap_or(bytes.len());
                prop_assert_eq!(plain_run(&bytes), expected);
            }
        }

        const FIELDS: [&str; 6] = ["data: ", "data:", "event: ", "id: ", ": ", ""];
        const VALUES: [&str; 28] = [
            // chat chunks that repeat a long first line (the watcher skips what repeats), some
            // a byte away from a marker or an escape at their front or back
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","type":"eQror"}"#,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","type":"error"}"#,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","type":"messageQu005fstop"}"#,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"delta":{"content":"ab"}}]}"#,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"delta":{"content":"[DONE]"}}]}"#,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"delta":{"content":"\u00e9"}}]}"#,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","error":{"message":"x"}}"#,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","type":"message\n"}"#,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","type":"message\u005fstop"}"#,
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","\u0065rror":1}"#,
            "[DONE]",
            " [DONE] ",
            "error",
            "message_stop",
            "response.completed",
            "response.incomplete",
            "ping",
            r#"{"type":"message_stop"}"#,
            r#"{"type":"message\u005fstop"}"#,
            r#"{"type":"response.failed"}"#,
            r#"{"type":"content_block_delta","delta":{"text":"error"}}"#,
            r#"{"error":{"message":"x"}}"#,
            r#"{"\u0065rror":1}"#,
            r#"{"choices":[{"delta":{"content":"data: [DONE]"}}]}"#,
            r#"{"choices":[{"delta":{"content":"hello \u00e9"}}]}"#,
            r#"{"choices":[]"#,
            "\u{e9}x",
            "",
        ];
        const ENDINGS: [&str; 3] = ["\n", "\r", "\r\n"];

        /// Events of 0 to 3 lines, each line and the blank line after an event ended by LF,
        /// CR or CRLF; the stream then cut anywhere (or not).
        fn stream() -> impl Strategy<Value = Vec<u8>> {
            let line = (0..FIELDS.len(), 0..VALUES.len(), 0..ENDINGS.len());
            let event = (prop::collection::vec(line, 0..3), 0..ENDINGS.len());
            (
                prop::collection::vec(event, 0..6),
                any::<prop::sample::Index>(),
            )
                .prop_map(|(events, cut)| {
                    let mut out = Vec::new();
                    for (lines, blank) in events {
                        for (field, value, ending) in lines {
                            out.extend_from_slice(FIELDS[field].as_bytes());
                            out.extend_from_slice(VALUES[value].as_bytes());
                            out.extend_from_slice(ENDINGS[ending].as_bytes());
                        }
                        out.extend_from_slice(ENDINGS[blank].as_bytes());
                    }
                    if cut.index(4) == 0 {
                        out.truncate(cut.index(out.len() + 1));
                    }
                    out
                })
        }

        /// Chat chunks one after another (the first ten [`VALUES`], which repeat a long
        /// first line), some of them terminal, as `data:` lines with any line ends.
        fn chat_stream() -> impl Strategy<Value = Vec<u8>> {
            let event = (
                0..10usize,
                0..ENDINGS.len(),
                0..ENDINGS.len(),
                any::<bool>(),
            );
            prop::collection::vec(event, 0..12).prop_map(|events| {
                let mut out = Vec::new();
                for (value, ending, blank, space) in events {
                    out.extend_from_slice(if space { b"data: " } else { b"data:" });
                    out.extend_from_slice(VALUES[value].as_bytes());
                    out.extend_from_slice(ENDINGS[ending].as_bytes());
                    out.extend_from_slice(ENDINGS[blank].as_bytes());
                }
                out
            })
        }

        /// The middles of [`event_per_chunk`]'s events: ordinary text, and text a byte away from
        /// a marker, an escape, a line end, at either end of the middle.
        const MIDDLES: [&str; 24] = [
            "w1 ",
            "hello",
            "",
            "a",
            "[DON",
            "[DONE]",
            "rror",
            "error",
            "e",
            "rro",
            "r",
            "age_",
            "message_stop",
            "nse.",
            "\\u00e9",
            "\\u0065",
            "\\n",
            "\\",
            "u00",
            r"erro\u0072",
            "erro",
            "\n",
            "\r",
            "\u{b}",
        ];
        /// The fronts and backs around them: a chat chunk's (the back's end `\n\n` or not).
        const FRONTS: [&str; 6] = [
            r#"data: {"type":""#,
            r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"delta":{"content":""#,
            r#"data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"delta":{"content":"x"#,
            r#"data: {"type":"erro"#,
            r#"data: {"type":"message_sto"#,
            "data: ",
        ];
        const BACKS: [&str; 8] = [
            "\"}\n\n",
            "\n\n",
            "\"}}]}\n\n",
            "\"},\"finish_reason\":null}]}\n\n",
            "r\"}\n\n",
            "p\"}\n\n",
            "\"}\r\n\r\n",
            "\"}\n",
        ];

        /// Chat events one per chunk (or cut anywhere), repeating a front and a back around
        /// a middle: what [`StreamWatcher::repeats_template`] judges by its middle.
        fn event_per_chunk() -> impl Strategy<Value = (Vec<Vec<u8>>, usize)> {
            let event = prop_oneof![
                3 => (0..FRONTS.len(), 0..MIDDLES.len(), 0..MIDDLES.len(), 0..BACKS.len()),
                // `data: {"type":"` and `"}\n\n` around a middle that may make it terminal
                1 => (Just(0), 0..MIDDLES.len(), 0..MIDDLES.len(), Just(0)),
            ];
            (
                prop::collection::vec((event, 0..4usize), 1..16),
                prop_oneof![1usize..64, Just(MAX_EVENT_BYTES)],
            )
                .prop_map(|(events, max)| {
                    let chunks = events
                        .into_iter()
                        .flat_map(|((front, a, b, back), cut)| {
                            let bytes =
                                [FRONTS[front], MIDDLES[a], MIDDLES[b], BACKS[back]].concat();
                            let bytes = bytes.into_bytes();
                            // one event in two chunks now and then
                            let at = if cut == 0 {
                                bytes.len() / 2
                            } else {
                                bytes.len()
                            };
                            let (x, y) = bytes.split_at(at);
                            [x.to_vec(), y.to_vec()]
                        })
                        .filter(|c| !c.is_empty())
                        .collect();
                    (chunks, max)
                })
        }

        proptest! {
            /// The template fast path gives the framer-based watcher's verdict after every
            /// chunk.
            #[test]
            fn judging_by_the_middle_agrees_with_framing((chunks, max) in event_per_chunk()) {
                let mut fast = StreamWatcher::with_max_event_bytes(max);
                let mut oracle = Oracle::new(max);
                for chunk in &chunks {
                    fast.push(chunk);
                    oracle.push(chunk);
                    prop_assert_eq!(fast.finished(), oracle.finished, "{:?}", chunks.iter().map(|c| String::from_utf8_lossy(c)).collect::<Vec<_>>());
                }
            }
        }

        proptest! {
            /// Same verdict as the framer-based watcher after every chunk, whatever the
            /// stream, its chunking and the event bound.
            #[test]
            fn agrees_with_framing_and_judging_every_event(
                stream in prop_oneof![stream(), chat_stream()],
                cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
                max in prop_oneof![1usize..64, Just(MAX_EVENT_BYTES)],
            ) {
                let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
                cuts.push(0);
                cuts.push(stream.len());
                cuts.sort_unstable();
                let mut fast = StreamWatcher::with_max_event_bytes(max);
                let mut oracle = Oracle::new(max);
                for pair in cuts.windows(2) {
                    let chunk = &stream[pair[0]..pair[1]];
                    fast.push(chunk);
                    oracle.push(chunk);
                    prop_assert_eq!(fast.finished(), oracle.finished, "{:?}", String::from_utf8_lossy(&stream));
                }
            }
        }
    }

    #[test]
    fn the_error_events_are_valid_sse_json() {
        for anthropic in [false, true] {
            let event = String::from_utf8(interrupted_event(anthropic)).unwrap();
            assert!(event.ends_with("\n\n"));
            assert!(!event.contains("[DONE]"));
            let data = event
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap();
            let value: serde_json::Value = serde_json::from_str(data).unwrap();
            assert!(value.get("error").is_some());
        }
    }
}
