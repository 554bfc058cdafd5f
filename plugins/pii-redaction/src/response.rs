//! The response side: placeholders back to originals, in whole JSON bodies and in SSE
//! streams.
//!
//! A whole body is restored in one pass over its bytes: a placeholder is plain ASCII inside a
//! JSON string, so replacing it with the JSON-escaped original keeps the document valid.
//!
//! A stream is restored event by event ([`StreamRestorer::event`] takes events that an SSE
//! framer already cut, so network chunk boundaries never matter). The text deltas of each
//! logical stream — a Chat Completions choice's `content` or one of its tool calls'
//! `arguments`, a Responses API output's `output_text` or `function_call_arguments`, an
//! Anthropic content block's `text_delta` or `input_json_delta` — go through a
//! [`TextRestorer`], which holds back only a tail that could still become a placeholder. Held
//! text is released with the next delta of the same stream, or, when that stream ends (a
//! `finish_reason`, `content_block_stop`, `response.*.done`, `[DONE]`, end of body), in an
//! extra delta event cloned from that stream's last one, sent just before the event that ended
//! it. Every other event has its strings restored whole.

use crate::mask::{OutputHold, PlaceholderMap, Redactor, TextRestorer};
use crate::scan::{byte_flags, find_any3, find_byte};
use llm_gateway_shared::json::{self, RawSeg, Scalar, Seg};
use llm_gateway_shared::sse::{Event, Framer, RawItem};
use std::collections::BTreeMap;
use std::ops::Range;

/// Restores a whole (non-streaming) body; `None` if nothing changed or it is not UTF-8.
pub fn restore_body(map: &PlaceholderMap, body: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(body).ok()?;
    if !text.contains('[') {
        return None;
    }
    let restored = map.restore_json(text);
    (restored.as_bytes() != body).then(|| restored.into_bytes())
}

/// Output rules over a whole JSON body: every string but the protocol's own fields (`id`,
/// `object`, `model`, `type`, `role`, `finish_reason`, …) is redacted. `None` if nothing
/// changed or the body is not JSON.
pub fn redact_output_body(
    output: &Redactor,
    map: &mut PlaceholderMap,
    body: &[u8],
) -> Option<Vec<u8>> {
    let mut edits: Vec<(Range<usize>, Vec<u8>)> = Vec::new();
    json::walk(body, &json::Limits::default(), &mut |path, kind, span| {
        if kind != Scalar::String || path.last().and_then(Seg::key).is_some_and(is_protocol_key) {
            return;
        }
        let Some(text) = body.get(span.clone()).and_then(json::decode_lossy) else {
            return;
        };
        if let Some(new) = output.redact_output(&text, map) {
            edits.push((span, json::quote(&new).into_bytes()));
        }
    })
    .ok()?;
    (!edits.is_empty()).then(|| json::splice(body, &edits))
}

fn is_protocol_key(key: &str) -> bool {
    matches!(
        key,
        "id" | "object"
            | "model"
            | "type"
            | "role"
            | "finish_reason"
            | "stop_reason"
            | "status"
            | "system_fingerprint"
            | "service_tier"
            | "item_id"
            | "call_id"
            | "name"
            | "event"
    )
}

/// Which logical text stream a delta belongs to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum StreamKey {
    /// Chat Completions: choice index, and `None` for content or the tool call index.
    Chat(u64, Option<u64>),
    /// Responses API: output index, content index (`None`: function call arguments).
    Responses(u64, Option<u64>),
    /// Anthropic: content block index.
    Anthropic(u64),
}

/// A stream's held text and the event to clone when releasing it.
#[derive(Debug, Default)]
struct Held {
    restorer: TextRestorer,
    output: OutputHold,
    /// The last delta event: its name, its data, and the span of the delta string in it.
    template: Option<(Option<String>, String, Range<usize>)>,
}

/// Restores an SSE stream, one framed event at a time.
#[derive(Debug, Default)]
pub struct StreamRestorer {
    streams: BTreeMap<StreamKey, Held>,
    /// Output rules, applied to the model's text before placeholders are restored.
    output: Option<Redactor>,
    /// The data of the last event read whose [`Reading`] was one delta and nothing else, and
    /// that delta: see [`StreamRestorer::read`].
    single: Option<(String, Delta)>,
}

/// A delta string found in an event.
#[derive(Debug, Clone, PartialEq)]
struct Delta {
    key: StreamKey,
    span: Range<usize>,
    /// The delta is JSON text (Anthropic `partial_json`).
    json_text: bool,
}

/// What one event says about the streams.
#[derive(Debug, Default, PartialEq)]
struct Reading {
    deltas: Vec<Delta>,
    /// Streams this event ends (released before it).
    ends: Vec<Ends>,
    /// Other strings containing `[`, restored whole.
    strings: Vec<Range<usize>>,
}

#[derive(Debug, PartialEq)]
enum Ends {
    All,
    Chat(u64),
    Responses(u64),
    Anthropic(u64),
}

impl StreamRestorer {
    /// A restorer that also applies `output` rules to the model's text.
    pub fn with_output(output: Option<Redactor>) -> Self {
        StreamRestorer {
            streams: BTreeMap::new(),
            output,
            single: None,
        }
    }

    /// The bytes to send for `event` (usually the event itself, restored).
    pub fn event(&mut self, map: &mut PlaceholderMap, event: &Event, out: &mut Vec<u8>) {
        let Some(data) = event.data.as_deref() else {
            out.extend_from_slice(&event.raw);
            return;
        };
        if data.trim() == "[DONE]" {
            self.release(map, |_| true, out);
            out.extend_from_slice(&event.raw);
            return;
        }
        if self.passes_unchanged(data) {
            out.extend_from_slice(&event.raw);
            return;
        }
        let reading = self.read(data);
        for end in &reading.ends {
            self.release(
                map,
                |key| match (end, key) {
                    (Ends::All, _) => true,
                    (Ends::Chat(c), StreamKey::Chat(k, _)) => c == k,
                    (Ends::Responses(o), StreamKey::Responses(k, _)) => o == k,
                    (Ends::Anthropic(i), StreamKey::Anthropic(k)) => i == k,
                    _ => false,
                },
                out,
            );
        }
        if reading.deltas.is_empty() && reading.strings.is_empty() {
            out.extend_from_slice(&event.raw);
            return;
        }
        let mut edits: Vec<(Range<usize>, Vec<u8>)> = Vec::new();
        for delta in reading.deltas {
            let text = data
                .as_bytes()
                .get(delta.span.clone())
                .and_then(json::decode_lossy)
                .unwrap_or_default();
            let held = self.streams.entry(delta.key).or_insert_with(|| Held {
                restorer: if delta.json_text {
                    TextRestorer::for_json_text()
                } else {
                    TextRestorer::default()
                },
                ..Held::default()
            });
            let emit = match &self.output {
                Some(output) => {
                    let ready = held.output.push(&text);
                    let ready = output.redact_output(&ready, map).unwrap_or(ready);
                    held.restorer.push(map, &ready)
                }
                None => held.restorer.push(map, &text),
            };
            held.template = Some((event.event.clone(), data.to_owned(), delta.span.clone()));
            if emit != text {
                edits.push((delta.span, json::quote(&emit).into_bytes()));
            }
        }
        for span in reading.strings {
            let Some(text) = data
                .as_bytes()
                .get(span.clone())
                .and_then(json::decode_lossy)
            else {
                continue;
            };
            let redacted = self
                .output
                .as_ref()
                .and_then(|o| o.redact_output(&text, map));
            let restored = map.restore(redacted.as_deref().unwrap_or(&text));
            if restored != text {
                edits.push((span, json::quote(&restored).into_bytes()));
            }
        }
        if edits.is_empty() {
            out.extend_from_slice(&event.raw);
            return;
        }
        edits.sort_by_key(|(span, _)| span.start);
        let new_data = json::splice(data.as_bytes(), &edits);
        write_event(out, event.event.as_deref(), event.id.as_deref(), &new_data);
    }

    /// [`read`], without walking an event that repeats the last one read but for its delta
    /// string. A stream's events differ in little else (the same `id`, `created`, `model`,
    /// `choices[0].index`), and while the restorer holds text back (a placeholder cut between
    /// events) every event is read. When the last reading was one delta and nothing else (no
    /// end, no other string with a `[`), an event whose bytes are the last one's before and
    /// after that delta, with one JSON string between, reads the same: the same members and
    /// scalars at the same paths, and a delta string counts whatever it holds. Its reading is
    /// that delta at the new span.
    fn read(&mut self, data: &str) -> Reading {
        if let Some((last, delta)) = &self.single {
            if let Some(span) = same_but_string(last, &delta.span, data) {
                return Reading {
                    deltas: vec![Delta {
                        span,
                        ..delta.clone()
                    }],
                    ..Reading::default()
                };
            }
        }
        let reading = read(data);
        self.single = match reading.deltas.as_slice() {
            [delta] if reading.ends.is_empty() && reading.strings.is_empty() => {
                Some((data.to_owned(), delta.clone()))
            }
            _ => None,
        };
        reading
    }

    /// True if `data` can change nothing: no string in it holds a `[` (raw or
    /// `\u005b`-escaped), so no placeholder can be in it or complete one; nothing is held back;
    /// and no output rule reads the text. Such an event (most of a stream) goes out as it came,
    /// without its JSON being walked.
    fn passes_unchanged(&self, data: &str) -> bool {
        self.is_quiet() && !bracket_in_a_string(data.as_bytes())
    }

    /// True if no output rule reads the text and no stream holds text back: an event whose
    /// data has no `[` in a string then changes nothing, `[DONE]` included (it has nothing to
    /// release).
    fn is_quiet(&self) -> bool {
        self.output.is_none() && !self.streams.values().any(|held| held.restorer.is_holding())
    }

    /// At the end of the body: releases whatever is still held.
    pub fn finish(&mut self, map: &mut PlaceholderMap, out: &mut Vec<u8>) {
        self.release(map, |_| true, out);
    }

    fn release(
        &mut self,
        map: &mut PlaceholderMap,
        which: impl Fn(&StreamKey) -> bool,
        out: &mut Vec<u8>,
    ) {
        for (key, held) in self.streams.iter_mut() {
            if !which(key) || !(held.restorer.is_holding() || held.output.is_holding()) {
                continue;
            }
            let mut text = String::new();
            if let Some(output) = &self.output {
                let rest = held.output.finish();
                let rest = output.redact_output(&rest, map).unwrap_or(rest);
                text.push_str(&held.restorer.push(map, &rest));
            }
            text.push_str(&held.restorer.finish(map));
            if let Some((name, data, span)) = &held.template {
                let new_data = json::splice(
                    data.as_bytes(),
                    &[(span.clone(), json::quote(&text).into_bytes())],
                );
                write_event(out, name.as_deref(), None, &new_data);
            }
        }
    }
}

/// The span of the string in `data` that stands where `span` stands in `last`, if `data` is
/// `last` with that string replaced by one JSON string (quotes included) and nothing else
/// changed.
fn same_but_string(last: &str, span: &Range<usize>, data: &str) -> Option<Range<usize>> {
    let (last, bytes) = (last.as_bytes(), data.as_bytes());
    let before = last.get(..span.start)?;
    let after = last.get(span.end..)?;
    let end = bytes.len().checked_sub(after.len())?;
    if end < before.len() || !bytes.starts_with(before) || !bytes.ends_with(after) {
        return None;
    }
    let string = bytes.get(before.len()..end)?;
    let quoted = string.len() >= 2 && string.first() == Some(&b'"') && string.last() == Some(&b'"');
    let one_string = matches!(
        json::scan_value(string, &json::Limits::default()),
        Ok(json::Kind::String)
    );
    (quoted && one_string).then_some(before.len()..end)
}

/// True if a JSON string in `data` holds a `[`, raw or escaped as `\u005b` (one pass, no
/// allocation; what is not JSON counts as having one, to be looked at properly).
fn bracket_in_a_string(data: &[u8]) -> bool {
    // without a backslash (most events), a byte is inside a string exactly when an odd number
    // of quotes precede it: quotes and brackets are flagged eight bytes per step
    match brackets_by_quote_parity(data) {
        Some(found) => found,
        None => bracket_in_a_string_escaped(data),
    }
}

/// [`bracket_in_a_string`] for `data` without a backslash; `None` if it has one.
fn brackets_by_quote_parity(data: &[u8]) -> Option<bool> {
    let mut odd = false; // inside a string where the word begins
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        let Ok(word) = <[u8; 8]>::try_from(chunk) else {
            return None;
        };
        let w = u64::from_le_bytes(word);
        if byte_flags(w, b'\\') != 0 {
            return None;
        }
        let quotes = byte_flags(w, b'"');
        let mut brackets = byte_flags(w, b'[');
        while brackets != 0 {
            let lane = brackets & brackets.wrapping_neg();
            if odd ^ ((quotes & (lane - 1)).count_ones() % 2 == 1) {
                return Some(true);
            }
            brackets &= brackets - 1;
        }
        odd ^= quotes.count_ones() % 2 == 1;
    }
    for &c in chunks.remainder() {
        match c {
            b'\\' => return None,
            b'"' => odd = !odd,
            b'[' if odd => return Some(true),
            _ => {}
        }
    }
    // an unterminated string: the next event may complete anything
    Some(odd)
}

/// [`bracket_in_a_string`] for data with escapes: from quote to quote, eight bytes per
/// step; outside strings only `"` counts, inside `"`, `\` and `[`.
fn bracket_in_a_string_escaped(data: &[u8]) -> bool {
    let mut i = 0;
    loop {
        let Some(open) = find_byte(data, i, b'"') else {
            return false;
        };
        i = open + 1;
        loop {
            let Some(k) = find_any3(data, i, [b'"', b'\\', b'[']) else {
                return true; // an unterminated string
            };
            match data.get(k) {
                Some(b'"') => {
                    i = k + 1;
                    break;
                }
                Some(b'\\') => {
                    // the escaped byte: `\u005b` is a `[`
                    let Some(&escaped) = data.get(k + 1) else {
                        return true;
                    };
                    let hex = data.get(k + 2..k + 6);
                    if escaped == b'u' && hex.is_some_and(|h| h.eq_ignore_ascii_case(b"005b")) {
                        return true;
                    }
                    i = k + 2;
                }
                _ => return true, // `[`
            }
        }
    }
}

/// [`bracket_in_a_string`] byte by byte (what the tests compare it with).
#[cfg(test)]
fn bracket_in_a_string_bytewise(data: &[u8]) -> bool {
    let mut in_string = false;
    let mut escaped = false;
    for (i, &byte) in data.iter().enumerate() {
        if escaped {
            escaped = false;
            let hex = data.get(i + 1..i + 5);
            if byte == b'u' && hex.is_some_and(|h| h.eq_ignore_ascii_case(b"005b")) {
                return true;
            }
            continue;
        }
        match (in_string, byte) {
            (true, b'\\') => escaped = true,
            (true, b'"') => in_string = false,
            (true, b'[') => return true,
            (false, b'"') => in_string = true,
            _ => {}
        }
    }
    in_string || escaped
}

/// Largest SSE event framed (a bigger one passes through unrestored).
pub const MAX_EVENT_BYTES: usize = 1 << 20;

/// Restores an SSE body fed in network chunks of any size: frames events, restores them,
/// and returns the bytes to send in place of each chunk.
#[derive(Debug)]
pub struct SseRestorer {
    framer: Framer,
    stream: StreamRestorer,
}

impl Default for SseRestorer {
    fn default() -> Self {
        SseRestorer::with_output(None)
    }
}

impl SseRestorer {
    /// A restorer that also applies `output` rules to the model's text.
    pub fn with_output(output: Option<Redactor>) -> Self {
        SseRestorer {
            framer: Framer::new(MAX_EVENT_BYTES),
            stream: StreamRestorer::with_output(output),
        }
    }

    /// The bytes to send for `chunk` (complete events only; the rest waits).
    pub fn push(&mut self, map: &mut PlaceholderMap, chunk: &[u8]) -> Vec<u8> {
        self.restore(map, chunk).unwrap_or_else(|| chunk.to_vec())
    }

    /// [`SseRestorer::push`] without a copy in the common case: `None` when the bytes to send
    /// are exactly `chunk`.
    ///
    /// While the framer holds nothing and the stream is quiet (no held text, no output
    /// rules), a plain event — one `data:` line without a `[` in a JSON string (see
    /// [`plain_data_event`]) — is cut here, in one pass over its bytes, and passed as it is,
    /// without being copied into the framer or parsed. Any other event goes to the framer
    /// and [`StreamRestorer::event`] as before, in a piece of the chunk that ends where the
    /// event must end at the latest (see [`event_end_bound`]), so that the framer is usually
    /// idle again after it and the plain events behind it are cut here too. The framer cuts
    /// the same events wherever its input is split, so this changes no byte.
    pub fn restore(&mut self, map: &mut PlaceholderMap, chunk: &[u8]) -> Option<Vec<u8>> {
        let mut out: Option<Vec<u8>> = None;
        let mut at = 0;
        let mut fast = self.framer.is_idle() && self.stream.is_quiet();
        while let Some(rest) = chunk.get(at..).filter(|rest| !rest.is_empty()) {
            if fast {
                if let Some(len) = plain_data_event(rest) {
                    if let Some(out) = &mut out {
                        out.extend_from_slice(rest.get(..len).unwrap_or_default());
                    }
                    at += len;
                    continue;
                }
            }
            let piece = rest.get(..event_end_bound(rest)).unwrap_or(rest);
            let out = out.get_or_insert_with(|| {
                let mut out = Vec::with_capacity(chunk.len() + 64);
                out.extend_from_slice(chunk.get(..at).unwrap_or_default());
                out
            });
            self.framer.push(piece);
            self.drain(map, out);
            at += piece.len();
            fast = self.framer.is_idle() && self.stream.is_quiet();
        }
        out
    }

    /// End of the body: the remaining events, held text, and an unterminated tail as is.
    pub fn finish(&mut self, map: &mut PlaceholderMap) -> Vec<u8> {
        let mut out = Vec::new();
        self.framer.close();
        self.drain(map, &mut out);
        self.stream.finish(map, &mut out);
        if let Some(tail) = self.framer.finish() {
            out.extend_from_slice(&tail);
        }
        out
    }

    fn drain(&mut self, map: &mut PlaceholderMap, out: &mut Vec<u8>) {
        let mut quiet = self.stream.is_quiet();
        while let Some(item) = self.framer.next_raw() {
            match item {
                RawItem::Event(raw) => {
                    // a plain event while quiet changes nothing (no copy into an `Event`)
                    if quiet && plain_data_event(raw) == Some(raw.len()) {
                        out.extend_from_slice(raw);
                        continue;
                    }
                    self.stream.event(map, &Event::parse(raw.to_vec()), out);
                    quiet = self.stream.is_quiet();
                }
                RawItem::Overflow(raw) => out.extend_from_slice(raw),
            }
        }
    }
}

/// Where the event at the start of `bytes` ends at the latest: after the first `\n\n` or
/// `\n\r\n` (whatever came before, the framer ends an event by there), else the end.
fn event_end_bound(bytes: &[u8]) -> usize {
    let mut from = 0;
    while let Some(lf) = find_byte(bytes, from, b'\n') {
        match bytes.get(lf + 1) {
            Some(b'\n') => return lf + 2,
            Some(b'\r') if bytes.get(lf + 2) == Some(&b'\n') => return lf + 3,
            _ => from = lf + 1,
        }
    }
    bytes.len()
}

/// The length of the event at the start of `bytes` if it is plain: exactly one `data:` line
/// and the blank line that ends it, both ended by LF or both by CRLF, whose value holds no `[`
/// inside a JSON string (as [`bracket_in_a_string`] reads it). While the stream is quiet
/// ([`StreamRestorer::is_quiet`]) such an event goes out as it came, which is what
/// [`StreamRestorer::event`] would send for it. `None` for anything else (another field, a
/// comment, several lines, an unfinished event, a bracket), which takes the full path.
fn plain_data_event(bytes: &[u8]) -> Option<usize> {
    let value = bytes.strip_prefix(b"data:")?;
    let start = 5 + usize::from(value.first() == Some(&b' '));
    let end = start + plain_line(bytes.get(start..)?)?;
    let blank = match bytes.get(end..end + 2)? {
        b"\n\n" => 2,
        b"\r\n" if bytes.get(end + 2..end + 4)? == b"\r\n" => 4,
        _ => return None,
    };
    Some(end + blank)
}

/// The position of the first `\n` or `\r` in `line`, if the bytes before it hold no `[`
/// inside a JSON string (raw or as `\u005b`, as [`bracket_in_a_string`] reads them); `None`
/// if they do or if `line` has no line end. One pass: sixteen bytes per step while they hold
/// no special byte ([`word_flags`]: a word's quotes and special bytes flagged exactly), where
/// only their quotes are counted; a `[` outside a string (`"choices":[`) is looked at in its
/// word ([`plain_word`]); from a word with a backslash or a control byte (the line end among
/// them), byte by byte. Every step counts as fuel in the wasm build: this is what each
/// streamed event of a quiet stream costs.
fn plain_line(line: &[u8]) -> Option<usize> {
    let mut odd = 0; // the quotes before the word: odd means inside a string
    let mut from = 0;
    // sixteen bytes per step while neither word has a special byte, then word by word
    let mut pairs = line.chunks_exact(16);
    let mut stopped = false;
    for pair in &mut pairs {
        let (a, b) = pair.split_at(8);
        let a = u64::from_le_bytes(<[u8; 8]>::try_from(a).ok()?);
        let b = u64::from_le_bytes(<[u8; 8]>::try_from(b).ok()?);
        let (quotes_a, special_a) = word_flags(a);
        let (quotes_b, special_b) = word_flags(b);
        if special_a | special_b == 0 {
            odd ^= quotes_a.count_ones() ^ quotes_b.count_ones();
            from += 16;
            continue;
        }
        for (w, quotes, special) in [(a, quotes_a, special_a), (b, quotes_b, special_b)] {
            if !plain_word(w, quotes, special, odd)? {
                stopped = true;
                break;
            }
            odd ^= quotes.count_ones();
            from += 8;
        }
        if stopped {
            break;
        }
    }
    if !stopped {
        if let Some(word) = line.get(from..from + 8) {
            let w = u64::from_le_bytes(<[u8; 8]>::try_from(word).ok()?);
            let (quotes, special) = word_flags(w);
            if plain_word(w, quotes, special, odd)? {
                odd ^= quotes.count_ones();
                from += 8;
            }
        }
    }
    // byte by byte, as `bracket_in_a_string_bytewise` reads them
    let mut in_string = odd & 1 == 1;
    let mut escaped = false;
    let mut i = from;
    loop {
        let &byte = line.get(i)?;
        if byte == b'\n' || byte == b'\r' {
            // an unterminated string: the next event may complete anything
            return (!in_string && !escaped).then_some(i);
        }
        if escaped {
            escaped = false;
            let hex = line.get(i + 1..i + 5);
            if byte == b'u' && hex.is_some_and(|h| h.eq_ignore_ascii_case(b"005b")) {
                return None;
            }
        } else {
            match (in_string, byte) {
                (true, b'\\') => escaped = true,
                (true, b'"') => in_string = false,
                (true, b'[') => return None,
                (false, b'"') => in_string = true,
                _ => {}
            }
        }
        i += 1;
    }
}

const LOWS: u64 = 0x7f7f_7f7f_7f7f_7f7f;
const HIGHS: u64 = 0x8080_8080_8080_8080;
const ONES: u64 = 0x0101_0101_0101_0101;

/// The quotes of `w` and its special bytes (`[`, `\`, and the control bytes below 0x0e),
/// each flagged exactly by its high bit: on the low seven bits of each byte, adding
/// `0x80 - c` sets the high bit where they are at least `c`, and no carry crosses a byte.
#[inline(always)]
fn word_flags(w: u64) -> (u64, u64) {
    let t = w & LOWS;
    let ascii = !w & HIGHS;
    let quotes = !((t ^ (ONES * u64::from(b'"'))) + LOWS) & ascii;
    let at_least_5b = t + ONES * 0x25;
    let at_least_5d = t + ONES * 0x23;
    let at_least_0e = t + ONES * 0x72;
    (
        quotes,
        ((at_least_5b & !at_least_5d) | !at_least_0e) & ascii,
    )
}

/// For [`plain_line`]: `Some(true)` if the word `w` (its `quotes` and `special` bytes from
/// [`word_flags`], `odd` the quotes before it) goes on word by word: no special byte, or only
/// `[`s outside strings; `Some(false)` if it holds a backslash or a control byte (the rest is
/// read byte by byte); `None` if a `[` is inside a string.
#[inline(always)]
fn plain_word(w: u64, quotes: u64, special: u64, odd: u32) -> Option<bool> {
    if special == 0 {
        return Some(true);
    }
    let brackets = !(((w & LOWS) ^ (ONES * u64::from(b'['))) + LOWS) & !w & HIGHS;
    if special != brackets {
        return Some(false);
    }
    let mut rest = brackets;
    while rest != 0 {
        let lane = rest & rest.wrapping_neg();
        if (odd ^ (quotes & (lane - 1)).count_ones()) & 1 == 1 {
            return None;
        }
        rest &= rest - 1;
    }
    Some(true)
}

/// `event: NAME\n`, `id: ID\n`, one `data:` line per line of `data`, blank line.
fn write_event(out: &mut Vec<u8>, event: Option<&str>, id: Option<&str>, data: &[u8]) {
    if let Some(name) = event {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.push(b'\n');
    }
    if let Some(id) = id {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(id.as_bytes());
        out.push(b'\n');
    }
    for line in data.split(|&c| c == b'\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out.push(b'\n');
}

/// Reads one event's JSON: its deltas, the streams it ends, and other strings to restore.
///
/// One walk with raw member names (nothing decoded or copied per member) keeps only what the
/// restorer needs: the `type`, the stream numbers (`index`, `output_index`, `content_index`,
/// per choice and tool call), and the spans of the delta strings and of strings with a `[`.
/// Gives what [`read`] gave when it kept every relevant leaf with its decoded path (the test
/// module keeps that one and compares the two).
fn read(data: &str) -> Reading {
    /// The first number at a path that parses as `u64` (later ones do not count).
    fn first(slot: &mut Option<u64>, raw: &[u8]) {
        if slot.is_none() {
            *slot = std::str::from_utf8(raw).ok().and_then(|n| n.parse().ok());
        }
    }
    fn first_in<K: PartialEq>(list: &mut Vec<(K, u64)>, key: K, raw: &[u8]) {
        if list.iter().any(|(k, _)| *k == key) {
            return;
        }
        if let Some(n) = std::str::from_utf8(raw).ok().and_then(|n| n.parse().ok()) {
            list.push((key, n));
        }
    }
    let bytes = data.as_bytes();
    let mut reading = Reading::default();
    let mut kind: Option<String> = None;
    let (mut index, mut output_index, mut content_index) = (None, None, None);
    // choices[c].index, choices[c].delta.tool_calls[t].index
    let mut choice_index: Vec<(usize, u64)> = Vec::new();
    let mut tool_index: Vec<((usize, usize), u64)> = Vec::new();
    // the first strings at `delta`, `delta.type`, `delta.text`, `delta.partial_json`
    let mut top_delta: Option<Range<usize>> = None;
    let mut delta_type: Option<Range<usize>> = None;
    let mut delta_text: Option<Range<usize>> = None;
    let mut delta_json: Option<Range<usize>> = None;
    // chat deltas (choice position, tool call position) and finish reasons, in order
    let mut chat: Vec<(usize, Option<usize>, Range<usize>)> = Vec::new();
    let mut finishes: Vec<usize> = Vec::new();
    // strings with a `[`, in order
    let mut bracketed: Vec<Range<usize>> = Vec::new();
    let walked = json::walk_raw(
        bytes,
        &json::Limits::default(),
        &mut |path, scalar, span| {
            let raw = bytes.get(span.clone()).unwrap_or_default();
            match scalar {
                Scalar::Number => match path {
                    [k] if k.key_is("index") => first(&mut index, raw),
                    [k] if k.key_is("output_index") => first(&mut output_index, raw),
                    [k] if k.key_is("content_index") => first(&mut content_index, raw),
                    [c, RawSeg::Index(ci), i] if c.key_is("choices") && i.key_is("index") => {
                        first_in(&mut choice_index, *ci, raw)
                    }
                    [c, RawSeg::Index(ci), d, t, RawSeg::Index(ti), i]
                        if c.key_is("choices")
                            && d.key_is("delta")
                            && t.key_is("tool_calls")
                            && i.key_is("index") =>
                    {
                        first_in(&mut tool_index, (*ci, *ti), raw)
                    }
                    _ => {}
                },
                Scalar::String => {
                    if raw.contains(&b'[') {
                        bracketed.push(span.clone());
                    }
                    match path {
                        [k] if k.key_is("type") => kind = json::decode_lossy(raw),
                        [k] if k.key_is("delta") => {
                            top_delta.get_or_insert(span);
                        }
                        [d, f] if d.key_is("delta") => {
                            let slot = if f.key_is("type") {
                                &mut delta_type
                            } else if f.key_is("text") {
                                &mut delta_text
                            } else if f.key_is("partial_json") {
                                &mut delta_json
                            } else {
                                return;
                            };
                            slot.get_or_insert(span);
                        }
                        [c, RawSeg::Index(ci), f]
                            if c.key_is("choices") && f.key_is("finish_reason") =>
                        {
                            finishes.push(*ci)
                        }
                        [c, RawSeg::Index(ci), d, rest @ ..]
                            if c.key_is("choices") && d.key_is("delta") =>
                        {
                            match rest {
                                [k] if k.key_is("content") => chat.push((*ci, None, span)),
                                [t, RawSeg::Index(ti), f, a]
                                    if t.key_is("tool_calls")
                                        && f.key_is("function")
                                        && a.key_is("arguments") =>
                                {
                                    chat.push((*ci, Some(*ti), span))
                                }
                                _ => {}
                            }
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        },
    );
    if walked.is_err() {
        return reading; // not JSON: passed through as is
    }
    let mut used: Vec<Range<usize>> = Vec::new();
    match kind.as_deref() {
        Some("response.output_text.delta") | Some("response.function_call_arguments.delta") => {
            let output = output_index.unwrap_or(0);
            let content = if kind.as_deref() == Some("response.output_text.delta") {
                Some(content_index.unwrap_or(0))
            } else {
                None
            };
            if let Some(span) = top_delta {
                used.push(span.clone());
                reading.deltas.push(Delta {
                    key: StreamKey::Responses(output, content),
                    span,
                    json_text: false,
                });
            }
        }
        Some(k) if k.starts_with("response.") && k.ends_with(".done") => {
            reading
                .ends
                .push(Ends::Responses(output_index.unwrap_or(0)));
        }
        Some("response.completed" | "response.incomplete" | "response.failed") => {
            reading.ends.push(Ends::All);
        }
        Some("content_block_delta") => {
            let index = index.unwrap_or(0);
            let field = delta_type
                .and_then(|span| bytes.get(span))
                .and_then(json::decode_lossy);
            let (span, json_text) = match field.as_deref() {
                Some("text_delta") => (delta_text, false),
                Some("input_json_delta") => (delta_json, true),
                _ => (None, false),
            };
            if let Some(span) = span {
                used.push(span.clone());
                reading.deltas.push(Delta {
                    key: StreamKey::Anthropic(index),
                    span,
                    json_text,
                });
            }
        }
        Some("content_block_stop") => reading.ends.push(Ends::Anthropic(index.unwrap_or(0))),
        Some("message_delta" | "message_stop") => reading.ends.push(Ends::All),
        _ => {}
    }
    let choice = |ci: usize| {
        choice_index
            .iter()
            .find(|(c, _)| *c == ci)
            .map_or(ci as u64, |(_, n)| *n)
    };
    // Chat Completions chunks: choices[*].delta.content / tool_calls[*].function.arguments
    for (ci, ti, span) in chat {
        let sub = ti.map(|ti| {
            tool_index
                .iter()
                .find(|(k, _)| *k == (ci, ti))
                .map_or(ti as u64, |(_, n)| *n)
        });
        used.push(span.clone());
        reading.deltas.push(Delta {
            key: StreamKey::Chat(choice(ci), sub),
            span,
            json_text: false,
        });
    }
    // a choice with a finish_reason ends that choice's streams
    for ci in finishes {
        reading.ends.push(Ends::Chat(choice(ci)));
    }
    for span in bracketed {
        if !used.contains(&span) {
            reading.strings.push(span);
        }
    }
    reading
}

#[cfg(test)]
mod tests {
    /// [`read`] as it was: every relevant leaf kept with its decoded path.
    fn read_before(data: &str) -> Reading {
        let mut reading = Reading::default();
        let mut kind: Option<String> = None;
        // (path, kind, span) of the scalars that matter, collected in one walk
        let mut leaves: Vec<(Vec<Seg>, Scalar, Range<usize>)> = Vec::new();
        let walked = json::walk(
            data.as_bytes(),
            &json::Limits::default(),
            &mut |path, scalar, span| {
                if matches!(scalar, Scalar::Open | Scalar::Null | Scalar::Bool) {
                    return;
                }
                if let ([Seg::Key(k)], Scalar::String) = (path, scalar) {
                    if k == "type" {
                        kind = data
                            .as_bytes()
                            .get(span.clone())
                            .and_then(json::decode_lossy);
                    }
                }
                let relevant = scalar == Scalar::Number
                    || data
                        .as_bytes()
                        .get(span.clone())
                        .is_some_and(|s| s.contains(&b'[') || is_delta_path(path));
                if relevant {
                    leaves.push((path.to_vec(), scalar, span));
                }
            },
        );
        if walked.is_err() {
            return reading; // not JSON: passed through as is
        }
        let number = |want: &[&str], prefix: &[Seg]| -> Option<u64> {
            leaves.iter().find_map(|(p, s, span)| {
                (*s == Scalar::Number
                    && p.len() == prefix.len() + want.len()
                    && p.starts_with(prefix)
                    && p.iter()
                        .skip(prefix.len())
                        .zip(want)
                        .all(|(a, b)| a.key() == Some(b)))
                .then(|| data.get(span.clone())?.parse().ok())
                .flatten()
            })
        };
        let text_at = |p: &[Seg]| -> Option<String> {
            leaves.iter().find_map(|(lp, s, span)| {
                (*s == Scalar::String && lp.as_slice() == p)
                    .then(|| {
                        data.as_bytes()
                            .get(span.clone())
                            .and_then(json::decode_lossy)
                    })
                    .flatten()
            })
        };
        let mut used: Vec<Range<usize>> = Vec::new();
        match kind.as_deref() {
            Some("response.output_text.delta") | Some("response.function_call_arguments.delta") => {
                let output = number(&["output_index"], &[]).unwrap_or(0);
                let content = if kind.as_deref() == Some("response.output_text.delta") {
                    Some(number(&["content_index"], &[]).unwrap_or(0))
                } else {
                    None
                };
                if let Some((_, _, span)) = leaves
                    .iter()
                    .find(|(p, s, _)| *s == Scalar::String && p.as_slice() == [key("delta")])
                {
                    used.push(span.clone());
                    reading.deltas.push(Delta {
                        key: StreamKey::Responses(output, content),
                        span: span.clone(),
                        json_text: false,
                    });
                }
            }
            Some(k) if k.starts_with("response.") && k.ends_with(".done") => {
                let output = number(&["output_index"], &[]).unwrap_or(0);
                reading.ends.push(Ends::Responses(output));
            }
            Some("response.completed" | "response.incomplete" | "response.failed") => {
                reading.ends.push(Ends::All);
            }
            Some("content_block_delta") => {
                let index = number(&["index"], &[]).unwrap_or(0);
                let field = match text_at(&[key("delta"), key("type")]).as_deref() {
                    Some("text_delta") => Some("text"),
                    Some("input_json_delta") => Some("partial_json"),
                    _ => None,
                };
                if let Some(field) = field {
                    if let Some((_, _, span)) = leaves.iter().find(|(p, s, _)| {
                        *s == Scalar::String && p.as_slice() == [key("delta"), key(field)]
                    }) {
                        used.push(span.clone());
                        reading.deltas.push(Delta {
                            key: StreamKey::Anthropic(index),
                            span: span.clone(),
                            json_text: field == "partial_json",
                        });
                    }
                }
            }
            Some("content_block_stop") => {
                reading
                    .ends
                    .push(Ends::Anthropic(number(&["index"], &[]).unwrap_or(0)));
            }
            Some("message_delta" | "message_stop") => reading.ends.push(Ends::All),
            _ => {}
        }
        // Chat Completions chunks: choices[*].delta.content / tool_calls[*].function.arguments
        for (path, scalar, span) in &leaves {
            if *scalar != Scalar::String {
                continue;
            }
            if let [Seg::Key(c), Seg::Index(ci), Seg::Key(d), rest @ ..] = path.as_slice() {
                if c != "choices" || d != "delta" {
                    continue;
                }
                let choice_prefix = [key("choices"), Seg::Index(*ci)];
                let choice = number(&["index"], &choice_prefix).unwrap_or(*ci as u64);
                let stream = match rest {
                    [Seg::Key(k)] if k == "content" => Some(None),
                    [Seg::Key(t), Seg::Index(ti), Seg::Key(f), Seg::Key(a)]
                        if t == "tool_calls" && f == "function" && a == "arguments" =>
                    {
                        let tool_prefix = [
                            key("choices"),
                            Seg::Index(*ci),
                            key("delta"),
                            key("tool_calls"),
                            Seg::Index(*ti),
                        ];
                        Some(Some(number(&["index"], &tool_prefix).unwrap_or(*ti as u64)))
                    }
                    _ => None,
                };
                if let Some(sub) = stream {
                    used.push(span.clone());
                    reading.deltas.push(Delta {
                        key: StreamKey::Chat(choice, sub),
                        span: span.clone(),
                        json_text: false,
                    });
                }
            }
        }
        // a choice with a finish_reason ends that choice's streams
        for (path, scalar, _) in &leaves {
            if let ([Seg::Key(c), Seg::Index(ci), Seg::Key(f)], Scalar::String) =
                (path.as_slice(), scalar)
            {
                if c == "choices" && f == "finish_reason" {
                    let choice_prefix = [key("choices"), Seg::Index(*ci)];
                    let choice = number(&["index"], &choice_prefix).unwrap_or(*ci as u64);
                    reading.ends.push(Ends::Chat(choice));
                }
            }
        }
        for (_, scalar, span) in &leaves {
            if *scalar == Scalar::String
                && !used.contains(span)
                && data
                    .as_bytes()
                    .get(span.clone())
                    .is_some_and(|s| s.contains(&b'['))
            {
                reading.strings.push(span.clone());
            }
        }
        reading
    }

    fn key(k: &str) -> Seg {
        Seg::Key(k.to_owned())
    }

    /// Paths whose strings are always kept (deltas, and the fields that name a stream).
    fn is_delta_path(path: &[Seg]) -> bool {
        match path {
            [Seg::Key(k)] => k == "delta" || k == "type",
            [Seg::Key(d), Seg::Key(_)] => d == "delta",
            [Seg::Key(c), Seg::Index(_), Seg::Key(d), ..] => {
                c == "choices" && (d == "delta" || d == "finish_reason")
            }
            _ => false,
        }
    }

    use super::*;

    proptest::proptest! {
        #[test]
        fn bracket_scan_is_the_bytewise_one(data in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::strategy::Just(b'"'),
                proptest::strategy::Just(b'['),
                proptest::strategy::Just(b'\\'),
                proptest::strategy::Just(b'u'),
                proptest::strategy::Just(b'0'),
                proptest::strategy::Just(b'5'),
                proptest::strategy::Just(b'b'),
                proptest::strategy::Just(b'B'),
                proptest::prelude::any::<u8>(),
            ],
            0..60,
        )) {
            proptest::prop_assert_eq!(
                bracket_in_a_string(&data),
                bracket_in_a_string_bytewise(&data)
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn bracket_scan_without_escapes_is_the_bytewise_one(data in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::strategy::Just(b'"'),
                proptest::strategy::Just(b'['),
                proptest::strategy::Just(b'a'),
                proptest::strategy::Just(b'{'),
            ],
            0..120,
        )) {
            proptest::prop_assert_eq!(brackets_by_quote_parity(&data), Some(bracket_in_a_string_bytewise(&data)));
        }
    }

    #[test]
    fn bracket_scan_on_escapes_at_the_end_and_across_words() {
        for data in [
            &br#"{"a":"x\u005b"}"#[..],
            br#"{"a":"x\u005"}"#,
            br#"{"a":"x\"#,
            br#"{"a":"\\[x"}"#,
            br#"{"a":"\"[x"}"#,
            br#"[{"a":"0123456789abcdef"},["x"]]"#,
            br#"{"a":"0123456789abcdef\u005B"}"#,
            b"",
            b"\"",
        ] {
            assert_eq!(
                bracket_in_a_string(data),
                bracket_in_a_string_bytewise(data),
                "{}",
                String::from_utf8_lossy(data)
            );
        }
        assert!(bracket_in_a_string(br#"{"a":"0123456789abcdef\u005B"}"#));
        assert!(!bracket_in_a_string(br#"[{"a":"0123456789abcdef"},["x"]]"#));
    }
    use crate::detect::Detector;
    use crate::mask::tests::redactor;
    use crate::mask::{Action, Redactor, Rule};
    use proptest::prelude::*;

    /// [EMAIL_1] = a@x.com, [QUOTE_1] = `say "hi"\` (needs escaping), [PHONE_1].
    fn map() -> PlaceholderMap {
        let mut rules = redactor().rules().to_vec();
        rules.push(Rule {
            name: "QUOTE".into(),
            detector: Detector::Regex(regex_lite::Regex::new(r#"say "hi"\\"#).unwrap()),
            action: Action::Mask { restore: true },
        });
        let mut map = PlaceholderMap::default();
        Redactor::new(rules, String::new())
            .redact("a@x.com say \"hi\"\\ 13800138000", &mut map)
            .unwrap();
        map
    }

    #[test]
    fn whole_body() {
        let map = map();
        let body = br#"{"choices":[{"message":{"content":"to [EMAIL_1] and [QUOTE_1], [PHONE_1] [EMAIL_9] [x"}}]}"#;
        let out = restore_body(&map, body).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v["choices"][0]["message"]["content"],
            "to a@x.com and say \"hi\"\\, 13800138000 [EMAIL_9] [x"
        );
        assert_eq!(restore_body(&map, b"{\"a\":\"no placeholder\"}"), None);
        assert_eq!(restore_body(&PlaceholderMap::default(), body), None);
    }

    /// Splits `data` strings into SSE events, runs them through a restorer, and returns the
    /// concatenated delta text of each event's JSON (per stream), plus the raw output.
    fn run(map: &mut PlaceholderMap, events: &[(Option<&str>, String)]) -> Vec<u8> {
        run_with(map, None, events)
    }

    fn run_with(
        map: &mut PlaceholderMap,
        output: Option<Redactor>,
        events: &[(Option<&str>, String)],
    ) -> Vec<u8> {
        let mut r = StreamRestorer::with_output(output);
        let mut out = Vec::new();
        for (name, data) in events {
            let mut raw = Vec::new();
            write_event(&mut raw, *name, None, data.as_bytes());
            r.event(map, &Event::parse(raw), &mut out);
        }
        r.finish(map, &mut out);
        out
    }

    fn datas(out: &[u8]) -> Vec<serde_json::Value> {
        String::from_utf8(out.to_vec())
            .unwrap()
            .split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .filter_map(|d| serde_json::from_str(d).ok())
            .collect()
    }

    fn chat_chunk(content: &str) -> String {
        format!(
            r#"{{"id":"c","choices":[{{"index":0,"delta":{{"content":{}}},"finish_reason":null}}]}}"#,
            json::quote(content)
        )
    }

    fn chat_text(out: &[u8]) -> String {
        datas(out)
            .iter()
            .filter_map(|v| {
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect()
    }

    #[test]
    fn chat_stream_split_placeholder() {
        let mut map = map();
        let mut events: Vec<(Option<&str>, String)> = ["Mail [EM", "AIL_1", "] or [EMA"]
            .iter()
            .map(|t| (None, chat_chunk(t)))
            .collect();
        events.push((
            None,
            r#"{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#.into(),
        ));
        events.push((None, "[DONE]".into()));
        let out = run(&mut map, &events);
        assert_eq!(chat_text(&out), "Mail a@x.com or [EMA");
        let text = String::from_utf8(out).unwrap();
        // the held "[EMA" is released before the finish chunk, [DONE] stays last
        let release = text.find(r#""content":"[EMA""#).unwrap();
        assert!(release < text.find("\"stop\"").unwrap());
        assert!(text.ends_with("data: [DONE]\n\n"));
    }

    #[test]
    fn events_that_can_change_nothing_pass_byte_for_byte_and_the_rest_still_restore() {
        let mut map = map();
        assert!(!bracket_in_a_string(br#"{"choices":[{"a":"x\"y"}]}"#));
        assert!(bracket_in_a_string(br#"{"a":"x["}"#));
        assert!(bracket_in_a_string(br#"{"a":"\u005Bx"}"#));
        assert!(!bracket_in_a_string(br#"{"a":"\\u005b"}"#));
        assert!(bracket_in_a_string(br#"{"a":"unterminated"#));
        // odd spacing would not survive a rewrite: these pass as they came
        let plain =
            r#"{"id":"c", "choices":[{"index":0,"delta":{"content":"no placeholder here"}}]}"#;
        let mut r = StreamRestorer::with_output(None);
        assert!(r.passes_unchanged(plain));
        let mut raw = Vec::new();
        write_event(&mut raw, None, None, plain.as_bytes());
        let mut out = Vec::new();
        r.event(&mut map, &Event::parse(raw.clone()), &mut out);
        assert_eq!(out, raw);
        // an escaped `[` is decoded and restored; a held tail makes the next event count
        let escaped =
            r#"{"choices":[{"index":0,"delta":{"content":"to \u005bEMAIL_1] \u005BPH"}}]}"#;
        assert!(!r.passes_unchanged(escaped));
        let events = vec![(None, escaped.to_string()), (None, chat_chunk("ONE_1] ok"))];
        assert_eq!(
            chat_text(&run(&mut map, &events)),
            "to a@x.com 13800138000 ok"
        );
        let mut held = StreamRestorer::with_output(None);
        let mut out = Vec::new();
        let mut raw = Vec::new();
        write_event(&mut raw, None, None, chat_chunk("Mail [EM").as_bytes());
        held.event(&mut map, &Event::parse(raw), &mut out);
        assert!(!held.passes_unchanged(&chat_chunk("AIL_1")));
        // output rules read every delta
        let output = StreamRestorer::with_output(Some(output_rules()));
        assert!(!output.passes_unchanged(plain));
    }

    #[test]
    fn tool_call_arguments_and_choices_are_separate_streams() {
        let mut map = map();
        let tool = |i: u64, args: &str| {
            format!(
                r#"{{"choices":[{{"index":1,"delta":{{"tool_calls":[{{"index":{i},"function":{{"arguments":{}}}}}]}}}}]}}"#,
                json::quote(args)
            )
        };
        let events = vec![
            (None, tool(0, "{\"to\":\"[QUOTE")),
            (None, tool(1, "{\"p\":\"[PHONE_")),
            (None, tool(0, "_1]\"}")),
            (None, tool(1, "1]\"}")),
        ];
        let out = run(&mut map, &events);
        let mut args = [String::new(), String::new()];
        for v in datas(&out) {
            let call = &v["choices"][0]["delta"]["tool_calls"][0];
            let i = call["index"].as_u64().unwrap() as usize;
            args[i].push_str(call["function"]["arguments"].as_str().unwrap());
        }
        assert_eq!(args[0], "{\"to\":\"say \"hi\"\\\"}");
        assert_eq!(args[1], "{\"p\":\"13800138000\"}");
    }

    #[test]
    fn anthropic_and_responses_streams() {
        let mut map = map();
        let anth = |t: &str| {
            format!(
                r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":{}}}}}"#,
                json::quote(t)
            )
        };
        let events = vec![
            (Some("content_block_delta"), anth("hi [EMAI")),
            (Some("content_block_delta"), anth("L_1] [PH")),
            (
                Some("content_block_stop"),
                r#"{"type":"content_block_stop","index":0}"#.into(),
            ),
        ];
        let out = run(&mut map, &events);
        let text: String = datas(&out)
            .iter()
            .filter_map(|v| v["delta"]["text"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(text, "hi a@x.com [PH");
        assert!(String::from_utf8(out)
            .unwrap()
            .contains("event: content_block_delta\ndata: "));

        let resp = |t: &str| {
            format!(
                r#"{{"type":"response.output_text.delta","output_index":0,"content_index":0,"delta":{}}}"#,
                json::quote(t)
            )
        };
        let events = vec![
            (Some("response.output_text.delta"), resp("[PHONE_")),
            (Some("response.output_text.delta"), resp("1]!")),
            (
                Some("response.completed"),
                r#"{"type":"response.completed","response":{"output":[{"content":[{"text":"[PHONE_1]!"}]}]}}"#.into(),
            ),
        ];
        let out = run(&mut map, &events);
        let d = datas(&out);
        let text: String = d.iter().filter_map(|v| v["delta"].as_str()).collect();
        assert_eq!(text, "13800138000!");
        assert_eq!(
            d.last().unwrap()["response"]["output"][0]["content"][0]["text"],
            "13800138000!"
        );
    }

    proptest! {
        #[test]
        fn restored_stream_text_equals_restored_whole(
            text in "([a-z \\[\\]_0-9]|EMAIL|\\[EMAIL_1\\]|\\[PHONE_1\\]|\\[EMAIL_2\\]){0,30}",
            cuts in proptest::collection::vec(0usize..200, 0..10)
        ) {
            let mut map = map();
            let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c % (text.len() + 1)).collect();
            bounds.sort_unstable();
            let mut events = Vec::new();
            let mut from = 0;
            for b in bounds.into_iter().chain([text.len()]) {
                events.push((None, chat_chunk(&text[from..b])));
                from = b;
            }
            let out = run(&mut map, &events);
            prop_assert_eq!(chat_text(&out), map.restore(&text));
        }
    }

    proptest! {
        // each case already tries every split point of its body
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn splitting_the_body_anywhere_gives_the_unsplit_output(
            text in "([a-z \\[\\]_0-9]|EMAIL|\\[EMAIL_1\\]|\\[PHONE_1\\]|\\[QUOTE_1\\]){0,24}",
            cuts in proptest::collection::vec(0usize..24, 0..6),
            anthropic in any::<bool>(),
        ) {
            let mut map = map();
            let body = stream_body(&text, &cuts, anthropic);
            let whole = restore_chunks(&mut map, &[&body]);
            // every single split point, and a few multi-way splits
            for at in 0..=body.len() {
                let split = restore_chunks(&mut map, &[&body[..at], &body[at..]]);
                prop_assert_eq!(&split, &whole, "split at {}", at);
            }
            let bytes: Vec<&[u8]> = body.chunks(3).collect();
            prop_assert_eq!(restore_chunks(&mut map, &bytes), whole.clone());
            let text_out: String = datas(&whole)
                .iter()
                .filter_map(|v| {
                    v["choices"][0]["delta"]["content"].as_str().or(v["delta"]["text"].as_str()).map(str::to_owned)
                })
                .collect();
            prop_assert_eq!(text_out, map.restore(&text));
        }
    }

    /// Names and addresses are non-ASCII values: masked from a CJK prompt, their placeholders
    /// come back in a stream whose deltas cut the text between any two characters and whose
    /// network chunks cut it at every byte (inside UTF-8 sequences too); the client gets the
    /// unsplit output and the original values.
    #[test]
    fn cjk_names_and_addresses_restore_at_every_split() {
        let prompt = "我叫朱颖，住在广西壮族自治区天津市江北蒋路H座 477835。担当は井上 篤司です。\
                      Françoise Gauthier, 29, rue Alphonse Michel";
        let mut map = PlaceholderMap::default();
        let masked = redactor().redact(prompt, &mut map).unwrap().unwrap();
        for value in ["朱颖", "井上 篤司", "Françoise Gauthier", "蒋路H座 477835"] {
            assert!(!masked.contains(value), "{value} masked: {masked}");
        }
        assert!(
            masked.contains("[NAME_1]") && masked.contains("[ADDRESS_1]"),
            "{masked}"
        );
        assert_eq!(map.restore(&masked), prompt);

        // the model echoes the masked prompt; deltas cut at every char boundary (3 at once)
        let chars: Vec<usize> = masked.char_indices().map(|(i, _)| i).collect();
        for anthropic in [false, true] {
            for at in chars.iter().step_by(3) {
                let cuts = [*at, (*at + 7).min(masked.len())];
                let cuts: Vec<usize> = cuts
                    .into_iter()
                    .map(|c| {
                        (c..=masked.len())
                            .find(|&k| masked.is_char_boundary(k))
                            .unwrap()
                    })
                    .collect();
                let body = stream_body(&masked, &cuts, anthropic);
                let whole = restore_chunks(&mut map, &[&body]);
                let text: String = datas(&whole)
                    .iter()
                    .filter_map(|v| {
                        v["choices"][0]["delta"]["content"]
                            .as_str()
                            .or(v["delta"]["text"].as_str())
                            .map(str::to_owned)
                    })
                    .collect();
                assert_eq!(text, prompt);
            }
            // network chunks split at every byte offset give the unsplit output
            let cuts: Vec<usize> = [2, 5, 9, 14].iter().map(|&c| chars[c]).collect();
            let body = stream_body(&masked, &cuts, anthropic);
            let whole = restore_chunks(&mut map, &[&body]);
            for at in 0..=body.len() {
                let split = restore_chunks(&mut map, &[&body[..at], &body[at..]]);
                assert_eq!(split, whole, "split at {at}");
            }
            let bytes: Vec<&[u8]> = body.chunks(2).collect();
            assert_eq!(restore_chunks(&mut map, &bytes), whole);
        }
    }

    /// A chat (or Anthropic) SSE body whose text is `text` cut into deltas at `cuts`.
    fn stream_body(text: &str, cuts: &[usize], anthropic: bool) -> Vec<u8> {
        let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (text.len() + 1)).collect();
        bounds.sort_unstable();
        let mut body = Vec::new();
        let mut from = 0;
        for b in bounds.into_iter().chain([text.len()]) {
            let piece = json::quote(&text[from..b]);
            if anthropic {
                let data = format!(
                    r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":{piece}}}}}"#
                );
                body.extend(llm_gateway_shared::sse::encode(
                    Some("content_block_delta"),
                    &data,
                ));
            } else {
                let data =
                    format!(r#"{{"choices":[{{"index":0,"delta":{{"content":{piece}}}}}]}}"#);
                body.extend(llm_gateway_shared::sse::encode(None, &data));
            }
            from = b;
        }
        if anthropic {
            body.extend(llm_gateway_shared::sse::encode(
                Some("content_block_stop"),
                r#"{"type":"content_block_stop","index":0}"#,
            ));
        } else {
            body.extend_from_slice(b"data: [DONE]\r\n\r\n");
        }
        body
    }

    fn restore_chunks(map: &mut PlaceholderMap, chunks: &[&[u8]]) -> Vec<u8> {
        let mut r = SseRestorer::default();
        let mut out = Vec::new();
        for c in chunks {
            out.extend(r.push(map, c));
        }
        out.extend(r.finish(map));
        out
    }

    fn output_rules() -> Redactor {
        Redactor::new(
            vec![
                Rule {
                    name: "EMAIL".into(),
                    detector: Detector::Builtin(crate::detect::Builtin::Email),
                    action: Action::Mask { restore: false },
                },
                Rule {
                    name: "PHONE".into(),
                    detector: Detector::Builtin(crate::detect::Builtin::PhoneCn),
                    action: Action::Hash,
                },
            ],
            "salt-salt".into(),
        )
    }

    #[test]
    fn output_rules_in_a_whole_body() {
        let mut map = map();
        let body = br#"{"id":"b@y.org","choices":[{"message":{"role":"assistant","content":"[EMAIL_1] and b@y.org, 139 1234 5678"}}]}"#;
        let redacted = redact_output_body(&output_rules(), &mut map, body).unwrap();
        let restored = restore_body(&map, &redacted).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&restored).unwrap();
        let content = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(
            content.starts_with("a@x.com and [EMAIL_2], <PHONE:"),
            "{content}"
        );
        assert_eq!(v["id"], "b@y.org"); // protocol fields are not text
        assert_eq!(
            redact_output_body(&output_rules(), &mut map, b"{\"a\":\"hi\"}"),
            None
        );
    }

    #[test]
    fn output_rules_in_a_stream_see_values_split_across_deltas() {
        let mut map = map();
        let events: Vec<(Option<&str>, String)> = [
            "Mail b@",
            "y.org or [EMAIL",
            "_1], call 139 ",
            "1234 5678",
            " now",
        ]
        .iter()
        .map(|t| (None, chat_chunk(t)))
        .collect();
        let out = run_with(&mut map, Some(output_rules()), &events);
        let text = chat_text(&out);
        assert!(
            text.starts_with("Mail [EMAIL_2] or a@x.com, call <PHONE:"),
            "{text}"
        );
        assert!(text.ends_with("> now"), "{text}");
        assert!(
            !text.contains("b@y.org") && !text.contains("5678"),
            "{text}"
        );
    }

    proptest! {
        // any bytes: no panic; with nothing to restore the stream passes byte for byte
        #[test]
        fn any_stream_is_handled(
            chunks in proptest::collection::vec(
                proptest::collection::vec(any::<u8>(), 0..80), 0..6),
            sse_like in "(data: |event: |\\{|\\}|\"|\\[EMAIL_1\\]|choices|delta|content|:|\n|\r|[a-z0-9 ])*",
        ) {
            let mut map = map();
            let mut empty = PlaceholderMap::default();
            let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
            restore_chunks(&mut map, &refs);
            restore_chunks(&mut map, &[sse_like.as_bytes()]);
            let whole: Vec<u8> = chunks.concat();
            prop_assert_eq!(restore_chunks(&mut empty, &refs), whole);
        }
    }

    #[test]
    fn anthropic_tool_input_json_gets_escaped_originals() {
        let mut map = map();
        let delta = |t: &str| {
            format!(
                r#"{{"type":"content_block_delta","index":1,"delta":{{"type":"input_json_delta","partial_json":{}}}}}"#,
                json::quote(t)
            )
        };
        let events = vec![
            (Some("content_block_delta"), delta("{\"q\": \"[QUO")),
            (
                Some("content_block_delta"),
                delta("TE_1]\", \"to\": \"[EMAIL_1]\"}"),
            ),
            (
                Some("content_block_stop"),
                r#"{"type":"content_block_stop","index":1}"#.into(),
            ),
        ];
        let out = run(&mut map, &events);
        let partial: String = datas(&out)
            .iter()
            .filter_map(|v| v["delta"]["partial_json"].as_str().map(str::to_owned))
            .collect();
        let input: serde_json::Value = serde_json::from_str(&partial).expect("valid JSON");
        assert_eq!(
            input,
            serde_json::json!({"q": "say \"hi\"\\", "to": "a@x.com"})
        );
    }

    #[test]
    fn untouched_stream_is_byte_exact() {
        let mut map = map();
        let body =
            b"event: x\r\ndata: {\"a\":\"[nothing]\"}\r\n\r\n: comment\n\ndata: [DONE]\n\ntail";
        assert_eq!(restore_chunks(&mut map, &[body]), body.to_vec());
    }

    /// [`SseRestorer`] as it was before plain events were cut in place: every event framed
    /// with `next_event`, parsed and handed to [`StreamRestorer::event`]. The bytes to send for
    /// each chunk, and for the end of the body.
    fn restore_the_old_way(
        output: Option<Redactor>,
        chunks: &[&[u8]],
    ) -> (Vec<Vec<u8>>, Vec<u8>, PlaceholderMap) {
        let mut map = map();
        let mut framer = Framer::new(MAX_EVENT_BYTES);
        let mut stream = StreamRestorer::with_output(output);
        let mut drain = |framer: &mut Framer, map: &mut PlaceholderMap, out: &mut Vec<u8>| {
            while let Some(item) = framer.next_event() {
                match item {
                    Ok(event) => stream.event(map, &event, out),
                    Err(overflow) => out.extend_from_slice(overflow.raw()),
                }
            }
        };
        let mut outs = Vec::new();
        for chunk in chunks {
            framer.push(chunk);
            let mut out = Vec::new();
            drain(&mut framer, &mut map, &mut out);
            outs.push(out);
        }
        let mut end = Vec::new();
        framer.close();
        drain(&mut framer, &mut map, &mut end);
        stream.finish(&mut map, &mut end);
        end.extend(framer.finish().unwrap_or_default());
        (outs, end, map)
    }

    /// One SSE event of the kinds a stream may carry, with LF, CRLF or CR line ends.
    fn any_event() -> impl Strategy<Value = Vec<u8>> {
        let text = "([a-z \\[\\]_0-9\"\\\\\n]|é|中|EMAIL|\\[EMAIL_1\\]|\\[PHONE_1\\]|\\[QUOTE_1\\]|\\[EM|AIL_1\\]|\\[PH|ONE_1\\]){0,6}";
        (0usize..12, text, 0..8, 0u64..2).prop_map(|(kind, text, ending, index)| {
            let quoted = json::quote(&text);
            let data: Vec<String> = match kind {
                0..=4 => vec![format!(
                    r#"{{"id":"c","choices":[{{"index":{index},"delta":{{"content":{quoted}}},"finish_reason":null}}]}}"#
                )],
                5 => vec![format!(
                    r#"{{"choices":[{{"index":{index},"delta":{{}},"finish_reason":"stop"}}]}}"#
                )],
                6 => vec!["[DONE]".into()],
                // an escaped `[` (restored like a raw one)
                7 => vec![format!(
                    r#"{{"choices":[{{"index":0,"delta":{{"content":"\u005b{}"}}}}]}}"#,
                    text.replace(['"', '\\', '\n'], "")
                )],
                // data over two lines
                8 => vec![
                    format!(r#"{{"choices":[{{"index":0,"#),
                    format!(r#""delta":{{"content":{quoted}}}}}]}}"#),
                ],
                // not JSON, an unterminated string
                9 => vec![format!("\"{}", text.replace(['\n', '\r'], ""))],
                10 => vec![format!(
                    r#"{{"type":"content_block_delta","index":{index},"delta":{{"type":"text_delta","text":{quoted}}}}}"#
                )],
                _ => vec![format!(r#"{{"type":"content_block_stop","index":{index}}}"#)],
            };
            let nl: &[u8] = match ending {
                0..=3 => b"\n",
                4..=6 => b"\r\n",
                _ => b"\r",
            };
            let mut raw = Vec::new();
            if kind == 10 || kind == 11 {
                raw.extend_from_slice(b"event: content_block_delta");
                raw.extend_from_slice(nl);
            }
            if kind == 9 {
                raw.extend_from_slice(b": a comment");
                raw.extend_from_slice(nl);
            }
            for line in data {
                // `data:` without the space on some lines
                raw.extend_from_slice(if index == 1 && kind == 5 { b"data:" } else { b"data: " });
                raw.extend_from_slice(line.as_bytes());
                raw.extend_from_slice(nl);
            }
            raw.extend_from_slice(nl);
            raw
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Plain events cut in place give, chunk by chunk, the bytes the old path gave (and
        /// `None` only where those bytes are the chunk), on random streams cut anywhere.
        #[test]
        fn cutting_plain_events_in_place_changes_no_byte(
            events in proptest::collection::vec(any_event(), 0..14),
            cuts in proptest::collection::vec(0usize..4000, 0..8),
            with_output in proptest::bool::weighted(0.15),
            tail in proptest::option::of("data: \\{\"a\":\"x?"),
        ) {
            let mut body: Vec<u8> = events.concat();
            body.extend(tail.unwrap_or_default().bytes());
            let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c % (body.len() + 1)).collect();
            bounds.sort_unstable();
            let mut chunks: Vec<&[u8]> = Vec::new();
            let mut from = 0;
            for b in bounds.into_iter().chain([body.len()]) {
                chunks.push(&body[from..b]);
                from = b;
            }
            let output = || with_output.then(output_rules);
            let (want, want_end, want_map) = restore_the_old_way(output(), &chunks);
            let mut map = map();
            let mut r = SseRestorer::with_output(output());
            for (chunk, want) in chunks.iter().zip(&want) {
                match r.restore(&mut map, chunk) {
                    None => prop_assert_eq!(chunk, &want.as_slice()),
                    Some(out) => prop_assert_eq!(&out, want),
                }
            }
            prop_assert_eq!(r.finish(&mut map), want_end);
            prop_assert_eq!(map.restore("[EMAIL_2] [PHONE_2]"), want_map.restore("[EMAIL_2] [PHONE_2]"));
        }

        /// An idle framer fed up to the bound hands out an event, unless the bound is the end.
        #[test]
        fn the_framer_ends_an_event_by_the_bound(bytes in proptest::collection::vec(
            proptest::prop_oneof![Just(b'\n'), Just(b'\r'), Just(b'a'), Just(b':')], 0..40,
        )) {
            let bound = event_end_bound(&bytes);
            prop_assert!(bound <= bytes.len());
            if bound < bytes.len() {
                let mut framer = Framer::new(MAX_EVENT_BYTES);
                framer.push(&bytes[..bound]);
                let first = framer.next_raw();
                prop_assert!(matches!(first, Some(RawItem::Event(_))), "{:?}", first);
            }
        }

        #[test]
        fn plain_line_is_the_line_end_and_the_bytewise_bracket_scan(line in proptest::collection::vec(
            proptest::prop_oneof![
                Just(b'"'), Just(b'['), Just(b'\\'), Just(b'u'), Just(b'0'), Just(b'5'),
                Just(b'b'), Just(b'\n'), Just(b'\r'), Just(b'a'), any::<u8>(),
            ],
            0..80,
        )) {
            let end = line.iter().position(|&c| c == b'\n' || c == b'\r');
            let want = end.filter(|&end| !bracket_in_a_string_bytewise(&line[..end]));
            prop_assert_eq!(plain_line(&line), want);
        }
    }

    /// [`plain_line`] as it was before its words were flagged exactly (what the tests compare
    /// it with): the position of the first `\n` or `\r` in `line`, if the bytes before it hold no `[`
    /// inside a JSON string (raw or as `\u005b`, as [`bracket_in_a_string`] reads them); `None`
    /// if they do or if `line` has no line end. One pass: eight bytes per step until a word holds
    /// a line end or a backslash, byte by byte from there.
    fn plain_line_before(line: &[u8]) -> Option<usize> {
        const ONES: u64 = 0x0101_0101_0101_0101;
        const HIGHS: u64 = 0x8080_8080_8080_8080;
        // nonzero if a byte of `x` is zero (only the lowest flag is sure: enough to stop on)
        let any_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
        let mut odd = 0; // the quotes before the word: odd means inside a string
        let mut from = 0;
        while let Some(word) = line.get(from..from + 8) {
            let w = u64::from_le_bytes(<[u8; 8]>::try_from(word).ok()?);
            // a byte below 0x0e (LF, CR, or a rare control byte) or a backslash: go bytewise
            let low = w.wrapping_sub(ONES * 0x0e) & !w & HIGHS;
            if low | any_zero(w ^ (ONES * u64::from(b'\\'))) != 0 {
                break;
            }
            let quotes = byte_flags(w, b'"');
            if any_zero(w ^ (ONES * u64::from(b'['))) != 0 {
                let mut brackets = byte_flags(w, b'[');
                while brackets != 0 {
                    let lane = brackets & brackets.wrapping_neg();
                    if (odd ^ (quotes & (lane - 1)).count_ones()) & 1 == 1 {
                        return None;
                    }
                    brackets &= brackets - 1;
                }
            }
            odd ^= quotes.count_ones();
            from += 8;
        }
        // byte by byte, as `bracket_in_a_string_bytewise` reads them
        let mut in_string = odd & 1 == 1;
        let mut escaped = false;
        let mut i = from;
        loop {
            let &byte = line.get(i)?;
            if byte == b'\n' || byte == b'\r' {
                // an unterminated string: the next event may complete anything
                return (!in_string && !escaped).then_some(i);
            }
            if escaped {
                escaped = false;
                let hex = line.get(i + 1..i + 5);
                if byte == b'u' && hex.is_some_and(|h| h.eq_ignore_ascii_case(b"005b")) {
                    return None;
                }
            } else {
                match (in_string, byte) {
                    (true, b'\\') => escaped = true,
                    (true, b'"') => in_string = false,
                    (true, b'[') => return None,
                    (false, b'"') => in_string = true,
                    _ => {}
                }
            }
            i += 1;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The flagged words give what the earlier word loop gave, on lines of JSON-ish bytes
        /// (every special byte, non-ASCII ones, long runs to cross the sixteen-byte steps).
        #[test]
        fn plain_line_is_what_it_was(line in proptest::collection::vec(
            proptest::prop_oneof![
                4 => proptest::prop_oneof![Just(b'a'), Just(b' '), Just(b':'), Just(b',')],
                2 => Just(b'"'),
                1 => proptest::prop_oneof![Just(b'['), Just(b']'), Just(b'\\'), Just(b'u')],
                1 => proptest::prop_oneof![Just(b'0'), Just(b'5'), Just(b'b'), Just(b'B')],
                1 => proptest::prop_oneof![Just(b'\n'), Just(b'\r'), Just(0x0d), Just(0x0e), Just(0x00)],
                1 => proptest::prop_oneof![Just(0x5b | 0x80), Just(0xa2), Just(0xdb), Just(0xdc)],
                1 => any::<u8>(),
            ],
            0..120,
        )) {
            prop_assert_eq!(plain_line(&line), plain_line_before(&line));
        }
    }

    /// A stream of the bench's shape (three characters per delta, a placeholder split across
    /// events, `[`s inside and outside strings, an escape), cut once at every byte and in
    /// one-event chunks: the bytes to send are those of the framer and
    /// [`StreamRestorer::event`] alone, byte for byte.
    #[test]
    fn a_stream_cut_at_every_byte_is_restored_as_before() {
        let text =
            "Write to [EMAIL_1] or [PHONE_1] now: a[0] \"[QUOTE_1]\" \u{e9}t\u{e9} [x] done.";
        let chars: Vec<char> = text.chars().collect();
        let mut events: Vec<Vec<u8>> = chars
            .chunks(3)
            .map(|piece| {
                let piece: String = piece.iter().collect();
                llm_gateway_shared::sse::encode(None, &chat_chunk(&piece))
            })
            .collect();
        events.push(b"data: [DONE]\n\n".to_vec());
        let body = events.concat();
        let check = |chunks: &[&[u8]]| {
            let (want, want_end, _) = restore_the_old_way(None, chunks);
            let mut map = map();
            let mut r = SseRestorer::default();
            let mut got = Vec::new();
            let mut expected = Vec::new();
            for (chunk, want) in chunks.iter().zip(&want) {
                match r.restore(&mut map, chunk) {
                    None => assert_eq!(chunk, &want.as_slice()),
                    Some(out) => got.extend(out),
                }
                expected.extend_from_slice(want);
            }
            assert_eq!(r.finish(&mut map), want_end);
            expected
        };
        let whole = check(&[&body]);
        let restored = chat_text(&whole);
        assert!(restored.starts_with("Write to a@x.com or "), "{restored}");
        assert!(!restored.contains("[EMAIL_1]") && restored.ends_with("[x] done."));
        let per_event: Vec<&[u8]> = events.iter().map(Vec::as_slice).collect();
        check(&per_event);
        for cut in 0..=body.len() {
            check(&[&body[..cut], &body[cut..]]);
        }
    }

    #[test]
    fn plain_events_are_one_data_line_without_a_bracket_in_a_string() {
        let plain = br#"data: {"choices":[{"delta":{"content":"hi"}}]}"#;
        for (ending, len) in [(&b"\n\n"[..], 2), (b"\r\n\r\n", 4)] {
            let mut raw = plain.to_vec();
            raw.extend_from_slice(ending);
            assert_eq!(plain_data_event(&raw), Some(plain.len() + len));
            raw.extend_from_slice(b"data: next\n\n");
            assert_eq!(plain_data_event(&raw), Some(plain.len() + len));
        }
        assert_eq!(plain_data_event(b"data:[DONE]\n\n"), Some(13));
        for raw in [
            &br#"data: {"a":"[EMAIL_1]"}"#[..], // a bracket in a string
            br#"data: {"a":"\u005bx"}\n\n"#,    // an escaped one
            b"data: {\"a\":\"x[\"}\n\n",
            b"data: {\"a\":\"x\"}\n",     // no blank line yet
            b"data: {\"a\":\"x\"}\r\n\r", // the last CR may take an LF
            b"data: {\"a\":\"x\"}\r\r",   // CR line ends
            b"data: {\"a\":\"x\"}\n\r\n", // mixed
            b"data: a\ndata: b\n\n",      // two data lines
            b"event: e\ndata: a\n\n",     // another field
            b": c\ndata: a\n\n",          // a comment
            b"id: 1\n\n",
            b"data: {\"a\":\"unterminated\n\n", // a string left open
            b"\n",
            b"",
        ] {
            assert_eq!(
                plain_data_event(raw),
                None,
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn a_chunk_of_plain_events_is_sent_as_it_came_without_a_copy() {
        let mut map = map();
        let mut r = SseRestorer::default();
        let plain = |t: &str| llm_gateway_shared::sse::encode(None, &chat_chunk(t));
        let chunk = [
            plain("hello"),
            plain(" world"),
            b"data: [DONE]\r\n\r\n".to_vec(),
        ]
        .concat();
        assert_eq!(r.restore(&mut map, &chunk), None);
        // a partial event waits: the bytes to send differ from the chunk
        let mut part = plain("a");
        let half = plain("b");
        part.extend_from_slice(&half[..10]);
        assert_eq!(r.restore(&mut map, &part), Some(plain("a")));
        let mut rest = half[10..].to_vec();
        rest.extend(plain("c"));
        assert_eq!(
            r.restore(&mut map, &rest),
            Some([half.clone(), plain("c")].concat())
        );
        // a placeholder split across events: held, then released restored
        let out = r
            .restore(&mut map, &[plain("to [EMA"), plain("IL_1] ok")].concat())
            .unwrap();
        assert_eq!(chat_text(&out), "to a@x.com ok");
        assert_eq!(r.restore(&mut map, &plain("more")), None);
        assert_eq!(r.finish(&mut map), b"");
    }

    /// A member name: one of the names [`read`] looks for, maybe written with escapes
    /// (`\u0074ype` is `type`), or another name.
    fn any_name() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "type",
            "\\u0074ype",
            "index",
            "ind\\u0065x",
            "output_index",
            "content_index",
            "delta",
            "d\\u0065lta",
            "text",
            "partial_json",
            "content",
            "tool_calls",
            "function",
            "arguments",
            "argum\\u0065nts",
            "choices",
            "finish_reason",
            "a\\\"b",
            "x[",
            "other",
        ])
        .prop_map(str::to_owned)
    }

    /// A number, some not a `u64`.
    fn any_number() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "0",
            "1",
            "2",
            "7",
            "-1",
            "1.5",
            "18446744073709551616",
            "3e2",
        ])
        .prop_map(str::to_owned)
    }

    /// A value: a number (some not `u64`), a string (some with a `[`, raw or escaped, or a
    /// stream's `type`), `null`, or objects and arrays of those under [`any_name`] members.
    fn any_value() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            prop::sample::select(vec![
                "0",
                "1",
                "2",
                "7",
                "-1",
                "1.5",
                "18446744073709551616",
                "3e2"
            ])
            .prop_map(str::to_owned),
            prop::sample::select(vec![
                "\"x\"",
                "\"[EMAIL_1]\"",
                "\"[EM\"",
                "\"\\u005bPHONE_1]\"",
                "\"a\\\"[b\"",
                "\"text_delta\"",
                "\"input_json_delta\"",
                "\"response.output_text.delta\"",
                "\"response.function_call_arguments.delta\"",
                "\"response.output_item.done\"",
                "\"response.completed\"",
                "\"content_block_delta\"",
                "\"content_block_stop\"",
                "\"message_stop\"",
                "\"stop\"",
            ])
            .prop_map(str::to_owned),
            Just("null".to_owned()),
        ];
        leaf.prop_recursive(5, 40, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec((any_name(), inner), 0..5).prop_map(|m| {
                    let members: Vec<String> =
                        m.into_iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                    format!("{{{}}}", members.join(" , "))
                }),
            ]
        })
    }

    /// An event's data shaped like the streams' events (Chat Completions with several choices
    /// and tool calls, Responses API, Anthropic), with members in any order, extra members,
    /// escaped names, and sometimes broken JSON.
    fn any_data() -> impl Strategy<Value = String> {
        let chat = prop::collection::vec(
            (
                (any_value(), any_number()),
                prop::collection::vec((any_name(), any_value()), 0..3),
                prop::collection::vec((any_value(), any_number(), any_number()), 0..3),
            ),
            0..3,
        )
        .prop_map(|choices| {
            let choices: Vec<String> = choices
                .into_iter()
                .map(|((index, again), extra, tools)| {
                    let tools: Vec<String> = tools
                        .into_iter()
                        .map(|(args, i, j)| {
                            format!(r#"{{"index":{i},"function":{{"arguments":{args}}},"index":{j}}}"#)
                        })
                        .collect();
                    let extra: Vec<String> =
                        extra.iter().map(|(k, v)| format!(",\"{k}\":{v}")).collect();
                    format!(
                        r#"{{"delta":{{"content":"[EM","tool_calls":[{}]}}{},"index":{index},"finish_reason":"stop","index":{again}}}"#,
                        tools.join(","),
                        extra.concat()
                    )
                })
                .collect();
            format!(r#"{{"id":"c","choices":[{}]}}"#, choices.join(","))
        });
        let members = prop::collection::vec((any_name(), any_value()), 0..7).prop_map(|m| {
            let members: Vec<String> = m.into_iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            format!("{{{}}}", members.join(","))
        });
        let shaped = (
            prop::sample::select(vec![
                "response.output_text.delta",
                "response.function_call_arguments.delta",
                "response.content_part.done",
                "response.completed",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
            ]),
            prop::sample::select(vec!["text_delta", "input_json_delta", "other"]),
            (any_value(), any_number(), any_number()),
            any_value(),
            prop::collection::vec((any_name(), any_value()), 0..3),
        )
            .prop_map(|(kind, delta_type, (index, again, content), text, extra)| {
                let extra: Vec<String> =
                    extra.iter().map(|(k, v)| format!(",\"{k}\":{v}")).collect();
                format!(
                    r#"{{"type":"{kind}","output_index":{index},"content_index":{content},"index":{index},"delta":{{"type":"{delta_type}","text":{text},"partial_json":"[PH"}}{},"delta":{text},"index":{again},"output_index":{again},"content_index":{again}}}"#,
                    extra.concat()
                )
            });
        prop_oneof![
            3 => chat,
            3 => shaped,
            2 => members,
            1 => any_value(),
        ]
        .prop_flat_map(|data| {
            let len = data.len();
            (Just(data), 0..len + 1, prop::bool::weighted(0.1))
        })
        .prop_map(|(data, cut, broken)| {
            if broken {
                data.get(..cut).unwrap_or(&data).to_owned()
            } else {
                data
            }
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The walk with raw names reads every event as the walk with decoded paths did.
        #[test]
        fn read_is_what_it_was(data in any_data()) {
            prop_assert_eq!(read(&data), read_before(&data));
        }

        /// An event read from the last one's reading reads as its own walk: the last event
        /// with its delta string replaced by any literal (valid or not), or any other event.
        #[test]
        fn a_reading_taken_from_the_last_event_is_the_walked_one(
            first in any_data(),
            other in any_data(),
            pieces in prop::collection::vec(prop::sample::select(vec![
                "a", "[", "]", "[EMAIL_1]", r#"\""#, r"\\", r"\u005b", r"\n", "é", "\"",
                "\\", "\u{1}", " ",
            ]), 0..6),
            replace in any::<bool>(),
        ) {
            let mut restorer = StreamRestorer::default();
            prop_assert_eq!(restorer.read(&first), read(&first));
            let next = match (&restorer.single, replace) {
                (Some((last, delta)), true) => {
                    let mut next = last.get(..delta.span.start).unwrap_or_default().to_owned();
                    next.push('"');
                    next.push_str(&pieces.concat());
                    next.push('"');
                    next.push_str(last.get(delta.span.end..).unwrap_or_default());
                    next
                }
                _ => other,
            };
            prop_assert_eq!(restorer.read(&next), read(&next), "{}", next);
        }
    }

    #[test]
    fn an_event_like_the_last_but_its_delta_is_read_from_it() {
        let chunk = |content: &str| {
            format!(
                r#"{{"id":"c","created":1,"choices":[{{"index":0,"delta":{{"content":{content}}},"finish_reason":null}}]}}"#
            )
        };
        let mut restorer = StreamRestorer::default();
        let first = chunk(r#""to [EM""#);
        let reading = restorer.read(&first);
        assert_eq!(reading.deltas.len(), 1);
        let (last, delta) = restorer.single.clone().expect("one delta: kept");
        assert_eq!(last, first);
        // the same event but its delta: read from the last one
        let string = r#""AIL_1] \"ok\"""#;
        let next = chunk(string);
        let span = same_but_string(&last, &delta.span, &next).expect("the same but the delta");
        assert_eq!(next.get(span), Some(string));
        assert_eq!(restorer.read(&next), read(&next));
        // anything else changed, or no single string there: walked
        for other in [
            chunk(r#""x""#).replace(r#""id":"c""#, r#""id":"d""#),
            chunk("null"),
            chunk(r#""a" "b""#),
            chunk(r#""a"#),
        ] {
            assert_eq!(same_but_string(&last, &delta.span, &other), None, "{other}");
            assert_eq!(restorer.read(&other), read(&other), "{other}");
        }
        // an event that ends a stream is not kept
        restorer.read(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#);
        assert!(restorer.single.is_none());
    }

    #[test]
    fn read_is_what_it_was_on_the_streams_events() {
        for data in [
            r#"{"id":"c","choices":[{"index":1,"delta":{"content":"[EMAIL_1]"},"finish_reason":null}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"[E"},"index":3}]},"index":2}]}"#,
            r#"{"type":"response.output_text.delta","output_index":2,"content_index":1,"delta":"[P"}"#,
            r#"{"\u0074ype":"content_block_delta","index":4,"delta":{"type":"input_json_delta","partial_json":"[Q"}}"#,
            r#"{"type":"content_block_stop","index":4}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"x":"[EMAIL_1]"}"#,
        ] {
            let reading = read(data);
            assert!(
                !reading.deltas.is_empty() || !reading.ends.is_empty(),
                "{data}"
            );
            assert_eq!(reading, read_before(data), "{data}");
        }
    }
}
