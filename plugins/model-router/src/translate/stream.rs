//! SSE streams: Chat ⇄ Messages, by the rules of the [module docs](super).
//!
//! The provider's bytes are framed by [`Framer`] (events cut the same way whatever the network
//! chunks, at most [`MAX_EVENT_BYTES`] held), and each complete event is translated on its
//! own, so the output depends only on the bytes, never on where they were cut.
//!
//! Nearly every event of a stream is a text delta, so those take a fast path that builds no
//! JSON tree: [`walk_raw`] validates the event and finds the delta's string, whose bytes —
//! already escaped JSON — are copied between a prefix and a suffix built once per stream (the
//! chunk's id, `created` and model; the open block's index). A delta that repeats the last
//! one's bytes around another string is not walked at all ([`Template`]): only its string is
//! checked. Anything else (the first and last events, tool calls, errors, an escaped `type`)
//! is parsed with `serde_json`. Tests check that both paths give the same events.

use super::error::{anthropic_stream_error, openai_stream_error};
use super::{finish_reason, push_value, stop_reason, Asked, ResponseParams, Usage, Wire};
use crate::stream::interrupted_event;
use llm_gateway_shared::json::{plain_run, push_quoted, walk_raw, Limits, RawSeg, Scalar};
use llm_gateway_shared::sse::{EventRef, Framer, RawItem};
use serde_json::Value;
use std::ops::Range;

/// Largest event translated; a larger one is dropped (and counted in
/// [`StreamTranslator::skipped`]).
pub const MAX_EVENT_BYTES: usize = 1024 * 1024;

/// Translates a provider's event stream into the client API's, chunk by chunk.
#[derive(Debug)]
pub struct StreamTranslator {
    framer: Framer,
    oversized: Oversized,
    mode: Mode,
    /// The client's terminator went out.
    finished: bool,
    /// An error event went out (the provider's, or the interruption's).
    failed: bool,
    /// [`StreamTranslator::finish`] was called.
    closed: bool,
    skipped: u64,
    max_event_bytes: usize,
}

#[derive(Debug)]
enum Mode {
    /// The provider speaks the client's API: events pass as they are.
    Same(Wire),
    ToChat(Box<ToChat>),
    ToMessages(Box<ToMessages>),
}

/// What an event did to the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Translated (or nothing to send for it).
    Done,
    /// Not JSON, or not the shape its type needs: dropped.
    Skipped,
    /// The client's terminator went out.
    Finished,
    /// An error event went out.
    Failed,
}

impl StreamTranslator {
    /// A translator of a stream of API `from` into one of API `to`.
    pub fn new(from: Wire, to: Wire, asked: Asked, params: ResponseParams) -> Self {
        StreamTranslator::with_options(from, to, asked, params, MAX_EVENT_BYTES, true)
    }

    /// [`StreamTranslator::new`] with another bound on an event's size, and the fast paths on
    /// or off (tests check that they change nothing).
    pub(super) fn with_options(
        from: Wire,
        to: Wire,
        asked: Asked,
        params: ResponseParams,
        max_event_bytes: usize,
        fast: bool,
    ) -> Self {
        let mode = match (from, to) {
            (Wire::Messages, Wire::Chat) => {
                Mode::ToChat(Box::new(ToChat::new(asked, params, fast)))
            }
            (Wire::Chat, Wire::Messages) => Mode::ToMessages(Box::new(ToMessages {
                fast,
                ..ToMessages::default()
            })),
            (Wire::Chat, Wire::Chat) | (Wire::Messages, Wire::Messages) => Mode::Same(to),
        };
        StreamTranslator {
            framer: Framer::new(max_event_bytes),
            oversized: Oversized::default(),
            mode,
            finished: false,
            failed: false,
            closed: false,
            skipped: 0,
            max_event_bytes,
        }
    }

    /// Translates the next chunk of the provider's stream, appending the client's bytes to
    /// `out`.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        if self.closed {
            return;
        }
        self.framer.push(chunk);
        self.drain(out);
    }

    /// The provider's stream ended; a stream that ended without its terminator gets the
    /// client API's error event (never a terminator). An unterminated last event (no blank
    /// line after it) is translated like a complete one (passed through with a blank line
    /// added, for the same API). Later calls do nothing.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if self.closed {
            return;
        }
        self.framer.close();
        self.drain(out);
        if let Some(mut tail) = self.framer.finish() {
            if let Mode::Same(_) = self.mode {
                // passed with the blank line it lacks, so that what follows is an event of
                // its own
                if !tail.ends_with(b"\n") && !tail.ends_with(b"\r") {
                    tail.push(b'\n');
                }
                tail.push(b'\n');
                out.extend_from_slice(&tail);
            }
            let event = EventRef::parse(&tail);
            if let Some(data) = event.data.as_deref() {
                self.event(data, out);
            }
        }
        self.closed = true;
        if !self.finished && !self.failed {
            out.extend_from_slice(&interrupted_event(self.client() == Wire::Messages));
            self.failed = true;
        }
    }

    /// True once the client's terminator went out.
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// True once an error event went out to the client: the provider's own, or the one
    /// [`StreamTranslator::finish`] adds to a cut stream. Nothing is translated after it.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// Events dropped because they were not JSON (or not the shape their type needs) or
    /// larger than [`MAX_EVENT_BYTES`] (raw bytes, blank line included). A passed-through
    /// stream (the same API) drops nothing.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The client's API.
    fn client(&self) -> Wire {
        match &self.mode {
            Mode::Same(api) => *api,
            Mode::ToChat(_) => Wire::Chat,
            Mode::ToMessages(_) => Wire::Messages,
        }
    }

    fn drain(&mut self, out: &mut Vec<u8>) {
        while let Some(item) = self.framer.next_raw() {
            let same = matches!(self.mode, Mode::Same(_));
            match item {
                RawItem::Event(raw) => {
                    self.oversized.event(raw);
                    if same {
                        out.extend_from_slice(raw);
                    }
                    // The framer bounds only what it holds: an event that came whole in one
                    // chunk can be larger. Whether an event is too large must not depend on
                    // the chunks, so the bound is applied here too.
                    if raw.len() > self.max_event_bytes {
                        if !same {
                            self.skipped = self.skipped.saturating_add(1);
                        }
                        continue;
                    }
                    let event = EventRef::parse(raw);
                    if let Some(data) = event.data.as_deref() {
                        feed(
                            &mut self.mode,
                            (&mut self.finished, &mut self.failed, &mut self.skipped),
                            data,
                            out,
                        );
                    }
                }
                RawItem::Overflow(raw) => {
                    let starts = self.oversized.overflow(raw);
                    if same {
                        out.extend_from_slice(raw);
                    } else if starts {
                        self.skipped = self.skipped.saturating_add(1);
                    }
                }
            }
        }
    }

    /// One event's data, outside the framing loop (the unterminated tail).
    fn event(&mut self, data: &str, out: &mut Vec<u8>) {
        feed(
            &mut self.mode,
            (&mut self.finished, &mut self.failed, &mut self.skipped),
            data,
            out,
        );
    }
}

/// One event's data through `mode`, and what it did to the stream's state (finished, failed,
/// skipped): a free function, so the framing loop can call it while the framer lends the event.
fn feed(
    mode: &mut Mode,
    (finished, failed, skipped): (&mut bool, &mut bool, &mut u64),
    data: &str,
    out: &mut Vec<u8>,
) {
    let outcome = match mode {
        Mode::Same(api) => same_api(*api, data),
        _ if *finished || *failed => Outcome::Done,
        Mode::ToChat(state) => state.event(data, out),
        Mode::ToMessages(state) => state.event(data, out),
    };
    match outcome {
        Outcome::Done => {}
        Outcome::Skipped => *skipped = skipped.saturating_add(1),
        Outcome::Finished => *finished = true,
        Outcome::Failed => *failed = true,
    }
}

/// A passed-through event: only whether it ends the stream. Only an event that spells one of
/// the words an ending event holds (or has an escape, which could spell one) is parsed.
fn same_api(api: Wire, data: &str) -> Outcome {
    if api == Wire::Chat && data.trim() == "[DONE]" {
        return Outcome::Finished;
    }
    let could_end = data.contains("error")
        || (api == Wire::Messages && data.contains("message_stop"))
        || data.contains('\\');
    if !could_end {
        return Outcome::Done;
    }
    let Ok(value) = serde_json::from_str::<Value>(data) else {
        return Outcome::Done;
    };
    match api {
        Wire::Chat if value.get("error").is_some() => Outcome::Failed,
        Wire::Messages => match value.get("type").and_then(Value::as_str) {
            Some("message_stop") => Outcome::Finished,
            Some("error") => Outcome::Failed,
            _ => Outcome::Done,
        },
        Wire::Chat => Outcome::Done,
    }
}

/// Follows the events larger than the framing bound, which the framer hands out in pieces,
/// to count each once: it tracks lines over the pieces as the framer does, so it knows
/// which piece ends the event (a blank line) and which starts the next one.
#[derive(Debug, Default)]
struct Oversized {
    /// Inside an oversized event.
    inside: bool,
    /// The current line has at least one byte.
    line: bool,
    /// The last byte was a CR: an LF right after it belongs to it.
    after_cr: bool,
    /// The last byte handed out (by any item) was a CR.
    last_cr: bool,
}

impl Oversized {
    fn event(&mut self, raw: &[u8]) {
        self.inside = false;
        self.last_cr = raw.last() == Some(&b'\r');
    }

    /// A piece of an oversized event; true if it starts one.
    fn overflow(&mut self, raw: &[u8]) -> bool {
        let starts = !self.inside;
        if starts {
            self.inside = true;
            self.line = false;
            self.after_cr = self.last_cr;
        }
        for &byte in raw {
            if std::mem::take(&mut self.after_cr) && byte == b'\n' {
                continue;
            }
            if byte == b'\n' || byte == b'\r' {
                if !std::mem::take(&mut self.line) {
                    // a blank line: the event ends (the framer ends the piece here too)
                    self.inside = false;
                }
                self.after_cr = byte == b'\r';
            } else {
                self.line = true;
            }
        }
        self.last_cr = raw.last() == Some(&b'\r');
        starts
    }
}

/// The spans of the members of an event's JSON that the fast paths read (the last one when
/// a key repeats, as serde_json reads it).
#[derive(Debug, Default)]
struct Spans {
    kind: Option<Range<usize>>,
    index: Option<Range<usize>>,
    delta_type: Option<Range<usize>>,
    /// `delta.text` (Messages), or `choices[0].delta.content` (Chat)
    text: Option<(Scalar, Range<usize>)>,
    partial_json: Option<Range<usize>>,
    /// Chat: something the fast path does not handle (tool calls, a finish reason, usage,
    /// an error, a refusal, a second choice, a choice of another index).
    other: bool,
}

fn slice<'d>(data: &'d [u8], span: &Option<Range<usize>>) -> Option<&'d [u8]> {
    span.clone().and_then(|s| data.get(s))
}

/// The last event that took a fast path as a text delta, as its bytes before and after the
/// text's string literal. An event that is those bytes around another valid string literal is
/// the same delta with another text: replacing one JSON string by another leaves a valid
/// document of the same structure, so every test that sent the first event down the fast path
/// holds for it too. Only the literal is checked, not the whole event again — in a stream,
/// where each delta repeats the id, model and the rest, that skips nearly all of the work.
#[derive(Debug, Default)]
struct Template {
    prefix: Vec<u8>,
    suffix: Vec<u8>,
}

impl Template {
    fn set(&mut self, data: &[u8], text: Range<usize>) {
        self.prefix.clear();
        self.suffix.clear();
        if let (Some(prefix), Some(suffix)) = (data.get(..text.start), data.get(text.end..)) {
            self.prefix.extend_from_slice(prefix);
            self.suffix.extend_from_slice(suffix);
        }
    }

    /// The text literal of `data`, if it is the template around another string literal.
    fn text<'d>(&self, data: &'d [u8]) -> Option<&'d [u8]> {
        if self.prefix.is_empty() {
            return None;
        }
        let text = data
            .strip_prefix(self.prefix.as_slice())?
            .strip_suffix(self.suffix.as_slice())?;
        is_string_literal(text).then_some(text)
    }
}

/// The code unit of a `\uXXXX` escape whose `XXXX` starts `hex`.
fn escaped_unit(hex: &[u8]) -> Option<u16> {
    let hex = hex.get(..4)?;
    let text = std::str::from_utf8(hex).ok()?;
    if !hex.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u16::from_str_radix(text, 16).ok()
}

/// True if `bytes` is exactly one JSON string literal (quotes included) of valid UTF-8 text:
/// no unescaped quote, backslash or control character inside, every escape one JSON has, and
/// every `\u` escape of a surrogate one half of a high-low pair (a lone surrogate is not text:
/// a client's JSON parser refuses it).
fn is_string_literal(bytes: &[u8]) -> bool {
    let [b'"', inner @ .., b'"'] = bytes else {
        return false;
    };
    if std::str::from_utf8(inner).is_err() {
        return false;
    }
    let mut at = 0;
    loop {
        at += plain_run(inner.get(at..).unwrap_or_default());
        match inner.get(at) {
            None => return true,
            Some(b'\\') => match inner.get(at + 1) {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => at += 2,
                Some(b'u') => {
                    let Some(unit) = escaped_unit(inner.get(at + 2..).unwrap_or_default()) else {
                        return false;
                    };
                    at += 6;
                    match unit {
                        0xD800..=0xDBFF => {
                            // a high surrogate: a low one must follow, escaped
                            let low =
                                inner
                                    .get(at..at + 2)
                                    .filter(|u| *u == b"\\u")
                                    .and_then(|_| {
                                        escaped_unit(inner.get(at + 2..).unwrap_or_default())
                                    });
                            if !matches!(low, Some(0xDC00..=0xDFFF)) {
                                return false;
                            }
                            at += 6;
                        }
                        0xDC00..=0xDFFF => return false,
                        _ => {}
                    }
                }
                _ => return false,
            },
            // a quote or a control character
            Some(_) => return false,
        }
    }
}

// ---- Messages → Chat -----------------------------------------------------------------------

/// State of a Messages stream being turned into Chat chunks.
#[derive(Debug)]
struct ToChat {
    /// Text and argument deltas take the fast paths.
    fast: bool,
    asked: Asked,
    params: ResponseParams,
    /// `data: {"id":…,"object":"chat.completion.chunk","created":…,"model":…,` — every
    /// chunk's start; empty until the first chunk.
    head: Vec<u8>,
    /// The last text delta.
    template: Template,
    /// Anthropic block index → OpenAI tool call index.
    tools: Vec<(u64, u64)>,
    finish_sent: bool,
    stop_reason: Option<String>,
    usage: Usage,
}

/// After `head`: the choice up to its delta.
const CHOICE_START: &[u8] = b"\"choices\":[{\"index\":0,\"delta\":";
/// After a delta of a chunk that does not finish.
const CHOICE_END: &[u8] = b",\"logprobs\":null,\"finish_reason\":null}]}\n\n";

impl ToChat {
    fn new(asked: Asked, params: ResponseParams, fast: bool) -> Self {
        ToChat {
            fast,
            asked,
            params,
            head: Vec::new(),
            template: Template::default(),
            tools: Vec::new(),
            finish_sent: false,
            stop_reason: None,
            usage: Usage::default(),
        }
    }

    fn event(&mut self, data: &str, out: &mut Vec<u8>) -> Outcome {
        if !self.fast {
            return match serde_json::from_str::<Value>(data) {
                Ok(value) => self.slow(&value, out),
                Err(_) => Outcome::Skipped,
            };
        }
        let bytes = data.as_bytes();
        if let Some(text) = self.template.text(bytes) {
            self.content(text, out);
            return Outcome::Done;
        }
        let mut spans = Spans::default();
        let walked = walk_raw(
            bytes,
            &Limits::default(),
            &mut |path, kind, span| match (path, kind) {
                ([key], Scalar::String) if key.key_is("type") => spans.kind = Some(span),
                ([key], Scalar::Number) if key.key_is("index") => spans.index = Some(span),
                ([delta, key], Scalar::String) if delta.key_is("delta") => {
                    if key.key_is("type") {
                        spans.delta_type = Some(span);
                    } else if key.key_is("text") {
                        spans.text = Some((kind, span));
                    } else if key.key_is("partial_json") {
                        spans.partial_json = Some(span);
                    }
                }
                _ => {}
            },
        );
        if walked.is_err() {
            return Outcome::Skipped;
        }
        match slice(bytes, &spans.kind) {
            Some(b"\"content_block_delta\"") => {
                match (slice(bytes, &spans.delta_type), &spans.text) {
                    // copied as they are only when they are text a client's parser reads
                    // (walk_raw keeps the grammar, which lets a lone surrogate escape by);
                    // anything else takes the serde path, which drops the event
                    (Some(b"\"text_delta\""), Some((_, span)))
                        if bytes.get(span.clone()).is_some_and(is_string_literal) =>
                    {
                        if let Some(text) = bytes.get(span.clone()) {
                            self.content(text, out);
                            self.template.set(bytes, span.clone());
                        }
                        return Outcome::Done;
                    }
                    (Some(b"\"input_json_delta\""), _)
                        if slice(bytes, &spans.partial_json).is_none_or(is_string_literal) =>
                    {
                        let index = slice(bytes, &spans.index).and_then(parse_u64);
                        if let (Some(index), Some(fragment)) =
                            (index, slice(bytes, &spans.partial_json))
                        {
                            self.arguments(index, fragment, out);
                        }
                        return Outcome::Done;
                    }
                    (Some(b"\"thinking_delta\"" | b"\"signature_delta\""), _) => {
                        return Outcome::Done
                    }
                    _ => {}
                }
            }
            Some(b"\"ping\"" | b"\"content_block_stop\"") => return Outcome::Done,
            _ => {}
        }
        match serde_json::from_str::<Value>(data) {
            Ok(value) => self.slow(&value, out),
            Err(_) => Outcome::Skipped,
        }
    }

    /// Every event that is not a plain delta.
    fn slow(&mut self, value: &Value, out: &mut Vec<u8>) -> Outcome {
        let Some(kind) = value.get("type").and_then(Value::as_str) else {
            return Outcome::Skipped;
        };
        match kind {
            "message_start" => {
                let Some(message) = value.get("message") else {
                    return Outcome::Skipped;
                };
                if self.head.is_empty() {
                    let text = |key| message.get(key).and_then(Value::as_str).unwrap_or("");
                    self.start(text("id"), text("model"), out);
                }
                if let Some(usage) = message.get("usage") {
                    self.usage.update_from_messages(usage);
                }
            }
            "content_block_start" => {
                let block = value.get("content_block").unwrap_or(&Value::Null);
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        let text = block.get("text").and_then(Value::as_str).unwrap_or("");
                        if !text.is_empty() {
                            let mut quoted = Vec::with_capacity(text.len() + 2);
                            push_quoted(&mut quoted, text);
                            self.content(&quoted, out);
                        }
                    }
                    Some("tool_use") => {
                        let Some(index) = value.get("index").and_then(Value::as_u64) else {
                            return Outcome::Skipped;
                        };
                        self.tool_start(index, block, out);
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let delta = value.get("delta").unwrap_or(&Value::Null);
                let index = value.get("index").and_then(Value::as_u64);
                let string = |key| delta.get(key).and_then(Value::as_str);
                match (delta.get("type").and_then(Value::as_str), index) {
                    (Some("text_delta"), _) => {
                        let Some(text) = string("text") else {
                            return Outcome::Skipped;
                        };
                        let mut quoted = Vec::with_capacity(text.len() + 2);
                        push_quoted(&mut quoted, text);
                        self.content(&quoted, out);
                    }
                    (Some("input_json_delta"), Some(index)) => {
                        let Some(fragment) = string("partial_json") else {
                            return Outcome::Skipped;
                        };
                        let mut quoted = Vec::with_capacity(fragment.len() + 2);
                        push_quoted(&mut quoted, fragment);
                        self.arguments(index, &quoted, out);
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = value
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.stop_reason = Some(reason.to_string());
                }
                if let Some(usage) = value.get("usage") {
                    self.usage.update_from_messages(usage);
                }
                self.finish_chunk(out);
            }
            "message_stop" => {
                self.finish_chunk(out);
                if self.asked.include_usage {
                    out.extend_from_slice(&self.head);
                    out.extend_from_slice(b"\"choices\":[],\"usage\":");
                    self.usage.write_chat(out);
                    out.extend_from_slice(b"}\n\n");
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
                return Outcome::Finished;
            }
            "error" => {
                openai_stream_error(value, out);
                return Outcome::Failed;
            }
            // ping, content_block_stop, and types added later
            _ => {}
        }
        Outcome::Done
    }

    /// The first chunk: the role, and `head` for every chunk.
    fn start(&mut self, id: &str, model: &str, out: &mut Vec<u8>) {
        let mut head = Vec::with_capacity(id.len() + model.len() + 96);
        head.extend_from_slice(b"data: {\"id\":");
        push_quoted(&mut head, id);
        head.extend_from_slice(b",\"object\":\"chat.completion.chunk\",\"created\":");
        super::push_number(&mut head, self.params.created);
        head.extend_from_slice(b",\"model\":");
        push_quoted(&mut head, model);
        head.push(b',');
        self.head = head;
        self.chunk(b"{\"role\":\"assistant\",\"content\":\"\"}", out);
    }

    /// A chunk with `delta` (JSON) that does not finish.
    fn chunk(&mut self, delta: &[u8], out: &mut Vec<u8>) {
        if self.head.is_empty() {
            // a delta before `message_start`: the first chunk still comes first
            self.start("", "", out);
        }
        out.extend_from_slice(&self.head);
        out.extend_from_slice(CHOICE_START);
        out.extend_from_slice(delta);
        out.extend_from_slice(CHOICE_END);
    }

    /// A content delta; `text` is a JSON string literal.
    fn content(&mut self, text: &[u8], out: &mut Vec<u8>) {
        if self.head.is_empty() {
            self.start("", "", out);
        }
        out.extend_from_slice(&self.head);
        out.extend_from_slice(CHOICE_START);
        out.extend_from_slice(b"{\"content\":");
        out.extend_from_slice(text);
        out.push(b'}');
        out.extend_from_slice(CHOICE_END);
    }

    fn tool_start(&mut self, block: u64, content_block: &Value, out: &mut Vec<u8>) {
        let index = self.tools.len() as u64;
        self.tools.push((block, index));
        let text = |key| content_block.get(key).and_then(Value::as_str).unwrap_or("");
        let mut delta = Vec::with_capacity(128);
        delta.extend_from_slice(b"{\"tool_calls\":[{\"index\":");
        super::push_number(&mut delta, index);
        delta.extend_from_slice(b",\"id\":");
        push_quoted(&mut delta, text("id"));
        delta.extend_from_slice(b",\"type\":\"function\",\"function\":{\"name\":");
        push_quoted(&mut delta, text("name"));
        delta.extend_from_slice(b",\"arguments\":");
        // a stream's tool block starts with `input: {}` and sends the input as deltas
        match content_block.get("input") {
            Some(input @ Value::Object(map)) if !map.is_empty() => {
                let mut arguments = Vec::new();
                push_value(&mut arguments, input);
                push_quoted(&mut delta, &String::from_utf8_lossy(&arguments));
            }
            _ => delta.extend_from_slice(b"\"\""),
        }
        delta.extend_from_slice(b"}}]}");
        self.chunk(&delta, out);
    }

    /// An arguments fragment (a JSON string literal) of the tool block `block`.
    fn arguments(&mut self, block: u64, fragment: &[u8], out: &mut Vec<u8>) {
        let Some(&(_, index)) = self.tools.iter().find(|(b, _)| *b == block) else {
            return;
        };
        let mut delta = Vec::with_capacity(fragment.len() + 64);
        delta.extend_from_slice(b"{\"tool_calls\":[{\"index\":");
        super::push_number(&mut delta, index);
        delta.extend_from_slice(b",\"function\":{\"arguments\":");
        delta.extend_from_slice(fragment);
        delta.extend_from_slice(b"}}]}");
        self.chunk(&delta, out);
    }

    /// The chunk with the finish reason, once.
    fn finish_chunk(&mut self, out: &mut Vec<u8>) {
        if std::mem::replace(&mut self.finish_sent, true) {
            return;
        }
        if self.head.is_empty() {
            self.start("", "", out);
        }
        out.extend_from_slice(&self.head);
        out.extend_from_slice(CHOICE_START);
        out.extend_from_slice(b"{},\"logprobs\":null,\"finish_reason\":");
        push_quoted(out, finish_reason(self.stop_reason.as_deref()));
        out.extend_from_slice(b"}]}\n\n");
    }
}

/// Member `key` of `value` as a string, `""` when it is not one.
fn str_at<'v>(value: &'v Value, key: &str) -> &'v str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

/// A JSON number's text as a `u64`.
fn parse_u64(raw: &[u8]) -> Option<u64> {
    std::str::from_utf8(raw).ok()?.parse().ok()
}

// ---- Chat → Messages -----------------------------------------------------------------------

/// The content block open in the Messages stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Open {
    #[default]
    None,
    Text,
    Tool,
}

/// State of a Chat stream being turned into Messages events.
#[derive(Debug, Default)]
struct ToMessages {
    /// Content deltas take the fast paths.
    fast: bool,
    started: bool,
    open: Open,
    /// The index the next content block gets.
    next_index: u64,
    /// `event: content_block_delta` … `"text":` of the open text block.
    text_prefix: Vec<u8>,
    /// The last chunk that was only content.
    template: Template,
    /// OpenAI tool call index → Messages block index.
    tools: Vec<(u64, u64)>,
    /// Set by the chunk with a finish reason.
    stop_reason: Option<&'static str>,
    usage: Option<Usage>,
}

impl ToMessages {
    fn event(&mut self, data: &str, out: &mut Vec<u8>) -> Outcome {
        if data.trim() == "[DONE]" {
            self.end(out);
            return Outcome::Finished;
        }
        if self.fast && self.started && self.open == Open::Text {
            if let Some(text) = self.template.text(data.as_bytes()) {
                self.text_delta(text, out);
                return Outcome::Done;
            }
            if let Some(outcome) = self.fast(data.as_bytes(), out) {
                return outcome;
            }
        }
        match serde_json::from_str::<Value>(data) {
            Ok(value @ Value::Object(_)) => self.slow(&value, out),
            _ => Outcome::Skipped,
        }
    }

    /// A chunk that only carries content for the open text block; `None` for any other.
    fn fast(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Option<Outcome> {
        let mut spans = Spans::default();
        let walked = walk_raw(bytes, &Limits::default(), &mut |path, kind, span| {
            match path {
                // `usage: null` is fine; an object (or anything else) is not
                [top] if top.key_is("usage") && kind != Scalar::Null => spans.other = true,
                [top, ..] if top.key_is("error") => spans.other = true,
                [top, RawSeg::Index(i), rest @ ..] if top.key_is("choices") => {
                    if *i != 0 {
                        spans.other = true;
                        return;
                    }
                    match rest {
                        [key] if key.key_is("index") => spans.index = Some(span),
                        [key] if key.key_is("finish_reason") && kind != Scalar::Null => {
                            spans.other = true;
                        }
                        [delta, key] if delta.key_is("delta") => {
                            if key.key_is("content") {
                                spans.text = Some((kind, span));
                            } else if kind != Scalar::Null && !key.key_is("role") {
                                // tool calls, a refusal, reasoning content: the slow path
                                spans.other = true;
                            }
                        }
                        [delta, _, ..] if delta.key_is("delta") => spans.other = true,
                        _ => {}
                    }
                }
                _ => {}
            }
        });
        if walked.is_err() {
            return Some(Outcome::Skipped);
        }
        if spans.other || slice(bytes, &spans.index) != Some(b"0") {
            return None;
        }
        match spans.text {
            Some((Scalar::String, span)) => {
                // copied as it is only when it is text a client's parser reads (a lone
                // surrogate escape is not): else the serde path, which drops the event
                let text = bytes.get(span.clone()).filter(|t| is_string_literal(t))?;
                self.text_delta(text, out);
                self.template.set(bytes, span);
                Some(Outcome::Done)
            }
            // no content, or `content: null`: nothing to send
            None | Some((Scalar::Null, _)) => Some(Outcome::Done),
            Some(_) => None,
        }
    }

    /// A `text_delta` of the open text block; `text` is a JSON string literal.
    fn text_delta(&mut self, text: &[u8], out: &mut Vec<u8>) {
        if text != b"\"\"" {
            out.extend_from_slice(&self.text_prefix);
            out.extend_from_slice(text);
            out.extend_from_slice(b"}}\n\n");
        }
    }

    fn slow(&mut self, value: &Value, out: &mut Vec<u8>) -> Outcome {
        if value.get("error").is_some_and(|e| !e.is_null()) {
            anthropic_stream_error(value, out);
            return Outcome::Failed;
        }
        if !self.started {
            let text = |key| value.get(key).and_then(Value::as_str).unwrap_or("");
            self.start(text("id"), text("model"), out);
        }
        let choice = match value.get("choices") {
            Some(Value::Array(choices)) => choices
                .iter()
                .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0),
            _ => None,
        };
        if let Some(choice) = choice {
            let delta = choice.get("delta").unwrap_or(&Value::Null);
            for key in ["content", "refusal"] {
                if let Some(text) = delta.get(key).and_then(Value::as_str) {
                    self.text(text, out);
                }
            }
            if let Some(Value::Array(calls)) = delta.get("tool_calls") {
                for (position, call) in calls.iter().enumerate() {
                    let index = call
                        .get("index")
                        .and_then(Value::as_u64)
                        .unwrap_or(position as u64);
                    self.tool_call(index, call, out);
                }
            }
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.close_block(out);
                self.stop_reason = Some(stop_reason(Some(reason)));
            }
        }
        if let Some(usage @ Value::Object(_)) = value.get("usage") {
            self.usage = Some(Usage::from_chat(usage));
        }
        if self.stop_reason.is_some() && self.usage.is_some() {
            self.end(out);
            return Outcome::Finished;
        }
        Outcome::Done
    }

    fn start(&mut self, id: &str, model: &str, out: &mut Vec<u8>) {
        self.started = true;
        out.extend_from_slice(
            b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":",
        );
        push_quoted(out, id);
        out.extend_from_slice(b",\"type\":\"message\",\"role\":\"assistant\",\"model\":");
        push_quoted(out, model);
        out.extend_from_slice(
            b",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":0,\"output_tokens\":0}}}\n\n",
        );
    }

    /// Opens a block at the next index, closing the open one; returns its index.
    fn open_block(&mut self, kind: Open, block: &[u8], out: &mut Vec<u8>) -> u64 {
        self.close_block(out);
        let index = self.next_index;
        self.next_index = index.saturating_add(1);
        out.extend_from_slice(
            b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":",
        );
        super::push_number(out, index);
        out.extend_from_slice(b",\"content_block\":");
        out.extend_from_slice(block);
        out.extend_from_slice(b"}\n\n");
        self.open = kind;
        index
    }

    fn close_block(&mut self, out: &mut Vec<u8>) {
        if self.open == Open::None {
            return;
        }
        self.open = Open::None;
        let index = self.next_index.saturating_sub(1);
        out.extend_from_slice(
            b"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":",
        );
        super::push_number(out, index);
        out.extend_from_slice(b"}\n\n");
    }

    fn text(&mut self, text: &str, out: &mut Vec<u8>) {
        if text.is_empty() {
            return;
        }
        if self.open != Open::Text {
            let index = self.open_block(Open::Text, b"{\"type\":\"text\",\"text\":\"\"}", out);
            let mut prefix = Vec::with_capacity(112);
            prefix.extend_from_slice(
                b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":",
            );
            super::push_number(&mut prefix, index);
            prefix.extend_from_slice(b",\"delta\":{\"type\":\"text_delta\",\"text\":");
            self.text_prefix = prefix;
        }
        out.extend_from_slice(&self.text_prefix);
        push_quoted(out, text);
        out.extend_from_slice(b"}}\n\n");
    }

    fn tool_call(&mut self, index: u64, call: &Value, out: &mut Vec<u8>) {
        let function = call.get("function").unwrap_or(&Value::Null);
        let block = match self.tools.iter().find(|(i, _)| *i == index) {
            Some(&(_, block)) => block,
            None => {
                let mut start = Vec::with_capacity(96);
                start.extend_from_slice(b"{\"type\":\"tool_use\",\"id\":");
                push_quoted(&mut start, str_at(call, "id"));
                start.extend_from_slice(b",\"name\":");
                push_quoted(&mut start, str_at(function, "name"));
                start.extend_from_slice(b",\"input\":{}}");
                let block = self.open_block(Open::Tool, &start, out);
                self.tools.push((index, block));
                block
            }
        };
        let fragment = function
            .get("arguments")
            .and_then(Value::as_str)
            .unwrap_or("");
        if fragment.is_empty() {
            return;
        }
        out.extend_from_slice(
            b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":",
        );
        super::push_number(out, block);
        out.extend_from_slice(b",\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":");
        push_quoted(out, fragment);
        out.extend_from_slice(b"}}\n\n");
    }

    /// `message_delta` and `message_stop`.
    fn end(&mut self, out: &mut Vec<u8>) {
        if !self.started {
            self.start("", "", out);
        }
        self.close_block(out);
        out.extend_from_slice(
            b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":",
        );
        push_quoted(out, self.stop_reason.unwrap_or("end_turn"));
        out.extend_from_slice(b",\"stop_sequence\":null},\"usage\":");
        match &self.usage {
            Some(usage) => usage.write_messages(out),
            None => out.extend_from_slice(b"{\"output_tokens\":0}"),
        }
        out.extend_from_slice(b"}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    }
}

#[cfg(test)]
mod tests;
