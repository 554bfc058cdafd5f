//! The response side of a stream: frames SSE across chunk splits, reads usage event by event,
//! counts the streamed text for when no usage comes, and hides the usage-only chunk from a
//! client that did not ask for it.
//!
//! When nothing is to be hidden, chunks go on unchanged (the framer only watches). When the
//! gateway injected `include_usage`, each chunk is replaced by the complete events in it, minus
//! the usage-only one; the bytes of an unfinished event wait for the rest of it (never more
//! than `max_event_bytes`; a longer event passes through as it comes, uninspected). A chunk
//! that also carries `choices` is never removed.

use crate::chunk::{self, Template};
use llm_gateway_shared::request::Api;
use llm_gateway_shared::sse::{EventRef, Framer, RawItem};
use llm_gateway_shared::tokens::{count_tokens, Encoding};
use llm_gateway_shared::usage::{StreamUsage, Usage};

/// At most this much streamed text is kept for counting; past it only its length is
/// tracked, and the count is extrapolated from the kept sample.
pub const TEXT_SAMPLE: usize = 64 * 1024;

/// What to do with a chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forward {
    /// Pass it on as it is.
    Unchanged,
    /// Replace it with these bytes (possibly empty).
    Replace(Vec<u8>),
}

/// The outcome of one chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    /// What reaches the client.
    pub forward: Forward,
    /// The first generated output arrived in this chunk (time to first token).
    pub first_output: bool,
}

/// One streamed response.
#[derive(Debug)]
pub struct ResponseStream {
    framer: Framer,
    reader: Reader,
    /// What replaces a chunk, reused from chunk to chunk (hiding only).
    out: Vec<u8>,
    hide_usage_only: bool,
    encoding: Encoding,
    /// The first [`TEXT_SAMPLE`] bytes of streamed text, counted only if no usage comes, so
    /// a stream whose usage arrives never costs tokenizer work, however long it is.
    text: String,
    /// Characters of the streamed text that did not fit in the sample (those in it are
    /// counted from it when needed, not event by event).
    chars_beyond: u64,
    seen_output: bool,
    events: u64,
    hidden: u64,
}

impl ResponseStream {
    /// A stream of `api`; `hide_usage_only` when the gateway injected `include_usage`;
    /// `encoding` counts the text if no usage comes.
    pub fn new(
        api: Api,
        hide_usage_only: bool,
        encoding: Encoding,
        max_event_bytes: usize,
    ) -> Self {
        ResponseStream {
            framer: Framer::new(max_event_bytes),
            reader: Reader {
                api,
                usage: StreamUsage::new(api),
                model: None,
                event_text: String::new(),
                template: Template::default(),
                complete: false,
            },
            out: Vec::new(),
            hide_usage_only,
            encoding,
            text: String::new(),
            chars_beyond: 0,
            seen_output: false,
            events: 0,
            hidden: 0,
        }
    }

    /// Takes the next chunk.
    pub fn push(&mut self, chunk: &[u8]) -> Pushed {
        // A chunk that is one usual event (a stream one event per callback) is read in place
        // when nothing is held: the framer would take it whole (see `Framer::is_idle`) and
        // `drain` read it the same way, so it need not be copied into the framer first.
        if self.framer.is_idle() && self.reader.template_event(chunk) == Some(chunk.len()) {
            return Pushed {
                forward: Forward::Unchanged,
                first_output: self.on_text_event(),
            };
        }
        let held_before = self.framer.pending();
        self.framer.push(chunk);
        self.drain(held_before)
    }

    /// Counts an event read by the template (its text in `reader.event_text`, no usage):
    /// keeps its text; true if it is the first output.
    fn on_text_event(&mut self) -> bool {
        self.events += 1;
        let event_text = self.reader.event_text.as_str();
        if event_text.is_empty() {
            return false;
        }
        if !self.reader.complete {
            keep_text(&mut self.text, &mut self.chars_beyond, event_text);
        }
        !std::mem::replace(&mut self.seen_output, true)
    }

    /// End of the stream: the remaining events and the unterminated tail, if any.
    pub fn finish(&mut self) -> Pushed {
        let held_before = self.framer.pending();
        self.framer.close();
        let mut pushed = self.drain(held_before);
        if let Some(tail) = self.framer.finish() {
            if let Forward::Replace(out) = &mut pushed.forward {
                out.extend_from_slice(&tail);
            }
        }
        pushed
    }

    fn drain(&mut self, held_before: usize) -> Pushed {
        // the events borrow the framer's buffer while the rest of the state changes
        let ResponseStream {
            framer,
            reader,
            out,
            hide_usage_only,
            text,
            chars_beyond,
            seen_output,
            events,
            hidden,
            ..
        } = self;
        let hide_usage_only = *hide_usage_only;
        out.clear();
        let mut first_output = false;
        // What reaches the client is what the framer hands out, minus the hidden events: the
        // bytes are copied only when an event is hidden or the chunk does not go as it came.
        // `copied`: where the bytes not yet copied to `out` start.
        let mut copied = framer.position();
        let mut hidden_now = false;
        // nothing held: no event to hand out (`next_raw` would find none either)
        while framer.pending() > 0 {
            let at = framer.position();
            // the usual chunk, recognized and read before it is framed (see
            // `Template::apply_event`); anything else is framed and read by `on_event`
            let templated = framer
                .at_event_start()
                .and_then(|bytes| reader.template_event(bytes));
            let taken = templated.and_then(|len| framer.take_line_event(len));
            let (has_usage, usage_only) = match taken {
                Some(_) => (false, false),
                // (`on_event` clears the text a refused template event may have left)
                None => match framer.next_raw() {
                    Some(RawItem::Event(raw)) => reader.on_event(raw),
                    Some(RawItem::Overflow(_)) => continue,
                    None => break,
                },
            };
            *events += 1;
            let event_text = reader.event_text.as_str();
            if !event_text.is_empty() && !reader.complete {
                keep_text(text, chars_beyond, event_text);
            }
            if !*seen_output && (!event_text.is_empty() || has_usage) {
                *seen_output = true;
                first_output = true;
            }
            if hide_usage_only && usage_only {
                *hidden += 1;
                hidden_now = true;
                out.extend_from_slice(framer.handed_out(copied..at));
                copied = framer.position();
            }
        }
        // Every byte that came in goes out: nothing to replace.
        let unchanged = !hidden_now && held_before == 0 && framer.pending() == 0;
        let forward = if hide_usage_only && !unchanged {
            out.extend_from_slice(framer.handed_out(copied..framer.position()));
            Forward::Replace(std::mem::take(out))
        } else {
            Forward::Unchanged
        };
        Pushed {
            forward,
            first_output,
        }
    }

    /// The usage the upstream reported, if it did.
    pub fn usage(&self) -> Option<Usage> {
        self.reader.usage.usage()
    }

    /// The upstream's usage covers the whole response (see `StreamUsage::is_complete`).
    pub fn usage_is_complete(&self) -> bool {
        self.reader.usage.is_complete()
    }

    /// The model the upstream named.
    pub fn model(&self) -> Option<&str> {
        self.reader.model.as_deref()
    }

    /// Tokens of the streamed text: the kept sample counted with the tokenizer, scaled by
    /// all characters ÷ the sample's characters when the text outgrew the sample.
    pub fn streamed_tokens(&self) -> u64 {
        let sample_tokens = count_tokens(self.encoding, &self.text);
        let sample_chars = self.text.chars().count() as u64;
        let text_chars = sample_chars.saturating_add(self.chars_beyond);
        if sample_chars == 0 || text_chars <= sample_chars {
            return sample_tokens;
        }
        let scaled = (u128::from(sample_tokens) * u128::from(text_chars)
            + u128::from(sample_chars) / 2)
            / u128::from(sample_chars);
        u64::try_from(scaled).unwrap_or(u64::MAX)
    }

    /// Events seen and events hidden.
    pub fn counts(&self) -> (u64, u64) {
        (self.events, self.hidden)
    }

    /// Characters of all streamed text (the sample and what came after it).
    #[cfg(test)]
    fn text_chars(&self) -> u64 {
        (self.text.chars().count() as u64).saturating_add(self.chars_beyond)
    }
}

/// Reads the events' data.
#[derive(Debug)]
struct Reader {
    api: Api,
    usage: StreamUsage,
    /// The first model named by an event (read by [`chunk::scan`] or by `usage`).
    model: Option<String>,
    /// The text of the current event, reused from event to event.
    event_text: String,
    /// The last usual chunk read in full (Chat Completions).
    template: Template,
    /// `usage.is_complete()`, as of the last event.
    complete: bool,
}

impl Reader {
    /// Reads one event (its raw bytes): its text into `event_text`; returns (has usage,
    /// usage-only). A usual Chat Completions chunk takes [`chunk::scan`] straight from the
    /// bytes; anything else is parsed as SSE, then by [`StreamUsage::on_event`].
    fn on_event(&mut self, raw: &[u8]) -> (bool, bool) {
        self.event_text.clear();
        let chat = self.api == Api::ChatCompletions;
        let single = chat.then(|| chunk::single_data_line(raw)).flatten();
        if let Some(data) = single {
            if self.template.apply(data, &mut self.event_text) {
                return (false, false);
            }
            if self.fast(data) {
                return (false, false);
            }
        }
        let event = EventRef::parse(raw);
        let Some(data) = &event.data else {
            return (false, false);
        };
        if chat && single.is_none() {
            let trimmed = data.trim();
            if self.fast(trimmed.as_bytes()) {
                return (false, false);
            }
        }
        let info = self.usage.on_event(event.event.as_deref(), data);
        self.complete = self.usage.is_complete();
        if self.model.is_none() {
            self.model = self.usage.model().map(str::to_owned);
        }
        self.event_text = info.text;
        (info.has_usage, info.usage_only)
    }

    /// [`Template::apply_event`] on the bytes of the next event, not yet framed: the event's
    /// length if it is the template's chunk with another text (its text is in `event_text`).
    fn template_event(&mut self, bytes: &[u8]) -> Option<usize> {
        if self.api != Api::ChatCompletions {
            return None;
        }
        self.event_text.clear();
        self.template.apply_event(bytes, &mut self.event_text)
    }

    /// [`chunk::scan`]: true if it read the chunk (its text is in `event_text`).
    fn fast(&mut self, data: &[u8]) -> bool {
        match chunk::scan(data, &mut self.event_text) {
            Some(chunk) => {
                if self.model.is_none() {
                    self.model = chunk.model.map(str::to_owned);
                }
                // a template's chunk names the model the template's did: nothing to update
                if let Some(content) = chunk.content {
                    self.template.set(data, content);
                }
                true
            }
            None => {
                self.event_text.clear();
                false
            }
        }
    }
}

/// Adds an event's text to the sample while it has room; counts the characters of what does
/// not fit (the sample's own are counted once, from it, only if no usage comes).
fn keep_text(sample: &mut String, beyond: &mut u64, text: &str) {
    let room = TEXT_SAMPLE.saturating_sub(sample.len());
    if text.len() <= room {
        sample.push_str(text);
        return;
    }
    let mut cut = room;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let (kept, rest) = (
        text.get(..cut).unwrap_or_default(),
        text.get(cut..).unwrap_or_default(),
    );
    sample.push_str(kept);
    *beyond = beyond.saturating_add(rest.chars().count() as u64);
}

#[cfg(test)]
mod tests {
    use super::*;
    use llm_gateway_shared::usage::StreamUsage;
    use proptest::prelude::*;

    /// A chat stream as OpenAI sends it with include_usage.
    fn chat_stream(usage_in_final: bool) -> Vec<u8> {
        let mut s = String::new();
        for i in 0..5 {
            s.push_str(&format!(
                "data: {{\"model\":\"gpt-4o\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}}}}],\"usage\":null}}\n\n"
            ));
        }
        if usage_in_final {
            s.push_str("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":3}}}\n\n");
        } else {
            s.push_str("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n");
            s.push_str("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":3}}}\n\n");
        }
        s.push_str("data: [DONE]\n\n");
        s.into_bytes()
    }

    fn anthropic_stream() -> Vec<u8> {
        let events = [
            (
                "message_start",
                r#"{"type":"message_start","message":{"model":"claude","usage":{"input_tokens":11,"cache_read_input_tokens":7,"cache_creation_input_tokens":2,"output_tokens":1}}}"#,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"tok0 "}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"tok1 "}}"#,
            ),
            (
                "content_block_stop",
                r#"{"type":"content_block_stop","index":0}"#,
            ),
            (
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2}}"#,
            ),
            ("message_stop", r#"{"type":"message_stop"}"#),
        ];
        let mut s = String::new();
        for (name, data) in events {
            s.push_str(&format!("event: {name}\r\ndata: {data}\r\n\r\n"));
        }
        s.into_bytes()
    }

    fn responses_stream() -> Vec<u8> {
        let mut s = String::new();
        s.push_str("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"model\":\"gpt-5\",\"usage\":null}}\n\n");
        s.push_str(": keep-alive comment\n\n");
        s.push_str(
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\n",
        );
        s.push_str("data: \"delta\":\"tok0 \"}\n\n");
        s.push_str("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"gpt-5\",\"usage\":{\"input_tokens\":20,\"input_tokens_details\":{\"cached_tokens\":8},\"output_tokens\":4,\"output_tokens_details\":{\"reasoning_tokens\":3},\"total_tokens\":24}}}\n\n");
        s.into_bytes()
    }

    fn expected_chat() -> Usage {
        Usage {
            prompt_tokens: 11,
            completion_tokens: 5,
            cached_prompt_tokens: 3,
            ..Usage::default()
        }
    }

    /// Feeds `chunks`, returns (usage, what the client received).
    /// `body` cut at each of `cuts` (taken modulo its length + 1, in order).
    fn cut_at<'b>(body: &'b [u8], cuts: &[usize]) -> Vec<&'b [u8]> {
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        points.sort_unstable();
        let mut chunks = Vec::new();
        let mut last = 0;
        for p in points {
            chunks.push(&body[last..p]);
            last = p;
        }
        chunks.push(&body[last..]);
        chunks
    }

    fn run(api: Api, hide: bool, chunks: &[&[u8]]) -> (Option<Usage>, Vec<u8>, ResponseStream) {
        let mut stream = ResponseStream::new(api, hide, Encoding::Chars, 1 << 20);
        let mut client = Vec::new();
        for chunk in chunks {
            match stream.push(chunk).forward {
                Forward::Unchanged => client.extend_from_slice(chunk),
                Forward::Replace(bytes) => client.extend_from_slice(&bytes),
            }
        }
        if let Forward::Replace(bytes) = stream.finish().forward {
            client.extend_from_slice(&bytes);
        }
        (stream.usage(), client, stream)
    }

    #[test]
    fn hides_only_the_usage_only_chunk() {
        let body = chat_stream(false);
        let (usage, client, stream) = run(Api::ChatCompletions, true, &[&body]);
        assert_eq!(usage, Some(expected_chat()));
        let client = String::from_utf8(client).unwrap();
        assert!(!client.contains("\"choices\":[]"), "{client}");
        assert_eq!(client.matches("tok").count(), 5);
        assert!(client.ends_with("data: [DONE]\n\n"));
        assert_eq!(stream.counts(), (8, 1));
    }

    #[test]
    fn never_hides_usage_in_a_chunk_with_choices() {
        let body = chat_stream(true);
        let (usage, client, _) = run(Api::ChatCompletions, true, &[&body]);
        assert_eq!(usage, Some(expected_chat()));
        assert_eq!(client, body);
    }

    #[test]
    fn a_client_that_asked_sees_everything() {
        let body = chat_stream(false);
        let (_, client, _) = run(Api::ChatCompletions, false, &[&body]);
        assert_eq!(client, body);
    }

    #[test]
    fn streamed_text_is_counted_and_first_output_flagged() {
        let mut stream = ResponseStream::new(Api::ChatCompletions, false, Encoding::Chars, 1 << 20);
        let first = stream.push(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n");
        assert!(!first.first_output);
        let second = stream.push(b"data: {\"choices\":[{\"delta\":{\"content\":\"abcdefgh\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n");
        assert!(second.first_output);
        assert!(
            !stream
                .push(b"data: {\"choices\":[{\"delta\":{\"content\":\"y\"}}]}\n\n")
                .first_output
        );
        // the text is counted as a whole: "abcdefghxy" is 10 chars, 3 tokens
        assert_eq!(stream.streamed_tokens(), 3);
        assert_eq!(stream.usage(), None);
    }

    #[test]
    fn long_text_is_sampled_and_scaled() {
        let mut stream = ResponseStream::new(Api::ChatCompletions, false, Encoding::Chars, 1 << 20);
        // 200 000 chars of text in 1 000-char deltas: only 64 KiB is kept
        let delta = "abcd".repeat(250);
        for _ in 0..200 {
            stream.push(
                format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{delta}\"}}}}]}}\n\n")
                    .as_bytes(),
            );
        }
        assert_eq!(stream.text.len(), TEXT_SAMPLE);
        assert_eq!(stream.streamed_tokens(), 50_000);
        // multi-byte text is cut on a char boundary
        let mut stream = ResponseStream::new(Api::ChatCompletions, false, Encoding::Chars, 1 << 20);
        let delta = "é".repeat(999);
        for _ in 0..100 {
            stream.push(
                format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{delta}\"}}}}]}}\n\n")
                    .as_bytes(),
            );
        }
        assert!(stream.text.len() <= TEXT_SAMPLE);
        assert_eq!(stream.streamed_tokens(), (99_900u64).div_ceil(4));
    }

    #[test]
    fn oversized_events_pass_through() {
        let mut stream = ResponseStream::new(Api::ChatCompletions, true, Encoding::Chars, 1024);
        let big = format!("data: {{\"x\":\"{}\"}}\n\n", "a".repeat(5000));
        let body = [big.as_bytes(), &chat_stream(false)].concat();
        let mut client = Vec::new();
        for chunk in body.chunks(700) {
            match stream.push(chunk).forward {
                Forward::Unchanged => client.extend_from_slice(chunk),
                Forward::Replace(bytes) => client.extend_from_slice(&bytes),
            }
        }
        if let Forward::Replace(bytes) = stream.finish().forward {
            client.extend_from_slice(&bytes);
        }
        assert_eq!(stream.usage(), Some(expected_chat()));
        assert!(client.starts_with(big.as_bytes()));
    }

    #[test]
    fn anthropic_and_responses_fixtures() {
        let (usage, client, _) = run(Api::AnthropicMessages, false, &[&anthropic_stream()]);
        assert_eq!(
            usage,
            Some(Usage {
                prompt_tokens: 20,
                completion_tokens: 2,
                cached_prompt_tokens: 7,
                cache_write_tokens: 2,
                reasoning_tokens: 0,
            })
        );
        assert_eq!(client, anthropic_stream());
        let (usage, _, stream) = run(Api::Responses, false, &[&responses_stream()]);
        assert_eq!(
            usage,
            Some(Usage {
                prompt_tokens: 20,
                completion_tokens: 4,
                cached_prompt_tokens: 8,
                cache_write_tokens: 0,
                reasoning_tokens: 3,
            })
        );
        assert_eq!(stream.model(), Some("gpt-5"));
        assert_eq!(stream.streamed_tokens(), 2);
    }

    #[test]
    fn every_split_point_gives_the_same_usage_and_bytes() {
        let fixtures: [(Api, Vec<u8>, bool); 4] = [
            (Api::ChatCompletions, chat_stream(false), true),
            (Api::ChatCompletions, chat_stream(true), true),
            (Api::AnthropicMessages, anthropic_stream(), false),
            (Api::Responses, responses_stream(), false),
        ];
        for (api, body, hide) in fixtures {
            let (whole_usage, whole_client, whole) = run(api, hide, &[&body]);
            assert!(whole_usage.is_some());
            for cut in 0..=body.len() {
                let (a, b) = body.split_at(cut);
                let (usage, client, split) = run(api, hide, &[a, b]);
                assert_eq!(usage, whole_usage, "{api:?} cut at {cut}");
                assert_eq!(client, whole_client, "{api:?} cut at {cut}");
                assert_eq!(split.streamed_tokens(), whole.streamed_tokens());
            }
        }
    }

    /// `keep_text` as it was: every event's characters counted as it comes.
    fn keep_text_before(sample: &mut String, chars: &mut u64, text: &str) {
        *chars = chars.saturating_add(text.chars().count() as u64);
        let room = TEXT_SAMPLE.saturating_sub(sample.len());
        if room == 0 {
            return;
        }
        let mut cut = room.min(text.len());
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        sample.push_str(text.get(..cut).unwrap_or_default());
    }

    /// What the stream did before the fast path, event by event with `Framer::next_event`
    /// and `StreamUsage::on_event`: (usage, model, client bytes, text sample, text chars,
    /// first output per chunk, counts).
    #[allow(clippy::type_complexity)]
    fn reference(
        api: Api,
        hide: bool,
        chunks: &[&[u8]],
    ) -> (
        Option<Usage>,
        Option<String>,
        Vec<u8>,
        String,
        u64,
        Vec<bool>,
        (u64, u64),
    ) {
        let mut framer = Framer::new(1 << 20);
        let mut usage = StreamUsage::new(api);
        let (mut client, mut text, mut chars) = (Vec::new(), String::new(), 0u64);
        let (mut seen, mut firsts, mut events, mut hidden) = (false, Vec::new(), 0, 0);
        for (n, chunk) in chunks.iter().enumerate() {
            let last = n + 1 == chunks.len();
            framer.push(chunk);
            if last {
                framer.close();
            }
            let mut first = false;
            while let Some(item) = framer.next_event() {
                match item {
                    Ok(event) => {
                        events += 1;
                        let info = match &event.data {
                            Some(data) => usage.on_event(event.event.as_deref(), data),
                            None => Default::default(),
                        };
                        if !info.text.is_empty() && !usage.is_complete() {
                            keep_text_before(&mut text, &mut chars, &info.text);
                        }
                        if !seen && (!info.text.is_empty() || info.has_usage) {
                            seen = true;
                            first = true;
                        }
                        if hide && info.usage_only {
                            hidden += 1;
                        } else {
                            client.extend_from_slice(&event.raw);
                        }
                    }
                    Err(overflow) => client.extend_from_slice(overflow.raw()),
                }
            }
            if last {
                client.extend(framer.finish().unwrap_or_default());
            }
            firsts.push(first);
        }
        let model = usage.model().map(str::to_owned);
        (
            usage.usage(),
            model,
            client,
            text,
            chars,
            firsts,
            (events, hidden),
        )
    }

    /// A usual event arriving while part of another event is held belongs to that event: it
    /// is not read on its own (the in-place read of a one-event chunk waits for an idle
    /// framer).
    #[test]
    fn a_chunk_that_continues_a_held_event_is_not_read_alone() {
        let body = openai_stream(&["ab".into(), "cd".into(), "ef".into()], 2, true);
        let events = events_of(&body);
        for held in [&b"event: chunk\n"[..], b": note\n", b"data: {\"x\":1}\r"] {
            let mut chunks = events.clone();
            chunks.insert(3, held);
            for hide in [false, true] {
                assert_eq!(
                    fed(Api::ChatCompletions, hide, &chunks),
                    reference(Api::ChatCompletions, hide, &chunks),
                    "{held:?} hide {hide}"
                );
            }
        }
    }

    /// Events of every shape a chat stream may hold, the usual chunk most often.
    fn chat_event() -> impl Strategy<Value = Vec<u8>> {
        let content = "[a-z é\\\"\n😀]{0,8}";
        prop_oneof![
            4 => (content, proptest::option::of("[a-z-]{1,8}")).prop_map(|(c, model)| {
                let mut chunk = serde_json::json!({"id": "c", "choices": [{"index": 0, "delta": {"content": c}, "finish_reason": null}], "usage": null});
                if let Some(m) = model {
                    chunk["model"] = serde_json::json!(m);
                }
                format!("data: {chunk}\n\n").into_bytes()
            }),
            1 => content.prop_map(|a| format!("data: {}\r\n\r\n", serde_json::json!({"choices": [{"delta": {"tool_calls": [{"function": {"arguments": a}}], "reasoning_content": "r"}}]})).into_bytes()),
            1 => (0u64..100).prop_map(|n| format!("data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{n},\"completion_tokens\":2}}}}\n\n").into_bytes()),
            1 => Just(b"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n".to_vec()),
            1 => Just(b": keep-alive\n\n".to_vec()),
            1 => Just(b"event: chunk\ndata: {\"choices\":[{\"delta\":{\"content\":\"named\"}}]}\n\n".to_vec()),
            1 => Just(b"data: {\"choices\":[{\"delta\":\ndata: {\"content\":\"two lines\"}}]}\n\n".to_vec()),
            1 => Just(b"data:{\"choices\":[{\"delta\":{\"content\":\"tight\"}}]}  \n\n".to_vec()),
            1 => Just(b"data: {\"choices\":[{\"delta\":{\"content\":5}}]}\n\n".to_vec()),
            1 => Just(b"data: {\"choices\":[{\"delta\":{\"content\":\"bad \xff utf8\"}}],\"id\":\"\xfe\"}\n\n".to_vec()),
            1 => Just(b"data: {\"choices\":[{\"delta\":{\"content\":\"cut\"\n\n".to_vec()),
            1 => Just(b"data: [DONE]\n\n".to_vec()),
        ]
    }

    /// A stream as OpenAI (and the bench's mock) sends it: the role chunk, one chunk per
    /// content piece with the same id, created and model, the finish chunk, then the usage
    /// (in the finish chunk, in a usage-only chunk, none, or a usage-only chunk amid the
    /// content: the text after it is not kept), then `[DONE]` (or cut before it).
    fn openai_stream(contents: &[String], usage: u8, done: bool) -> Vec<u8> {
        let head = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1796220172,"model":"gpt-4o-mini","choices":"#;
        let tail = if usage == 0 { "}" } else { r#","usage":null}"# };
        let mut s = format!(
            "data: {head}[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]{tail}\n\n"
        );
        let u = r#"{"prompt_tokens":11,"completion_tokens":9,"total_tokens":20}"#;
        for (i, c) in contents.iter().enumerate() {
            if usage == 3 && i == contents.len() / 2 {
                // (with no content at all, nothing follows it: see the end)
                s.push_str(&format!("data: {head}[],\"usage\":{u}}}\n\n"));
            }
            let c = serde_json::to_string(c).unwrap();
            s.push_str(&format!(
                "data: {head}[{{\"index\":0,\"delta\":{{\"content\":{c}}},\"logprobs\":null,\"finish_reason\":null}}]{tail}\n\n"
            ));
        }
        let finish = r#"[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]"#;
        match usage {
            1 => s.push_str(&format!("data: {head}{finish},\"usage\":{u}}}\n\n")),
            2 => {
                s.push_str(&format!("data: {head}{finish}{tail}\n\n"));
                s.push_str(&format!("data: {head}[],\"usage\":{u}}}\n\n"));
            }
            3 if contents.is_empty() => {
                s.push_str(&format!("data: {head}[],\"usage\":{u}}}\n\n"));
                s.push_str(&format!("data: {head}{finish}{tail}\n\n"));
            }
            _ => s.push_str(&format!("data: {head}{finish}{tail}\n\n")),
        }
        if done {
            s.push_str("data: [DONE]\n\n");
        }
        s.into_bytes()
    }

    /// `body` cut after each blank line: one event per chunk.
    fn events_of(body: &[u8]) -> Vec<&[u8]> {
        let mut chunks = Vec::new();
        let mut last = 0;
        for i in 1..body.len() {
            if body[i - 1] == b'\n' && body[i] == b'\n' {
                chunks.push(&body[last..=i]);
                last = i + 1;
            }
        }
        if last < body.len() {
            chunks.push(&body[last..]);
        }
        chunks
    }

    /// Feeds `chunks` to a stream: (usage, model, client bytes, text sample, text chars,
    /// first output per chunk, counts), as `reference` gives them.
    #[allow(clippy::type_complexity)]
    fn fed(
        api: Api,
        hide: bool,
        chunks: &[&[u8]],
    ) -> (
        Option<Usage>,
        Option<String>,
        Vec<u8>,
        String,
        u64,
        Vec<bool>,
        (u64, u64),
    ) {
        let mut stream = ResponseStream::new(api, hide, Encoding::Chars, 1 << 20);
        let (mut client, mut firsts) = (Vec::new(), Vec::new());
        for (n, chunk) in chunks.iter().enumerate() {
            let mut pushed = stream.push(chunk);
            let mut forward = vec![pushed.forward.clone()];
            if n + 1 == chunks.len() {
                let end = stream.finish();
                pushed.first_output |= end.first_output;
                forward.push(end.forward);
            }
            for (i, f) in forward.into_iter().enumerate() {
                match f {
                    Forward::Unchanged if i == 0 => client.extend_from_slice(chunk),
                    Forward::Unchanged => {}
                    Forward::Replace(bytes) => client.extend_from_slice(&bytes),
                }
            }
            firsts.push(pushed.first_output);
        }
        (
            stream.usage(),
            stream.model().map(str::to_owned),
            client,
            stream.text.clone(),
            stream.text_chars(),
            firsts,
            stream.counts(),
        )
    }

    proptest! {
        /// The fast path changes nothing: whatever the events and their chunking, the usage,
        /// model, client bytes, kept text and first output are those of the full parse.
        #[test]
        fn the_fast_path_reads_like_the_full_parse(
            events in proptest::collection::vec(chat_event(), 0..24),
            cuts in proptest::collection::vec(0usize..4000, 0..10),
            hide in proptest::bool::ANY,
        ) {
            let body = events.concat();
            let chunks = cut_at(&body, &cuts);
            let mut stream = ResponseStream::new(Api::ChatCompletions, hide, Encoding::Chars, 1 << 20);
            let (mut client, mut firsts) = (Vec::new(), Vec::new());
            for (n, chunk) in chunks.iter().enumerate() {
                let mut pushed = stream.push(chunk);
                let mut forward = vec![pushed.forward.clone()];
                if n + 1 == chunks.len() {
                    let end = stream.finish();
                    pushed.first_output |= end.first_output;
                    forward.push(end.forward);
                }
                for (i, f) in forward.into_iter().enumerate() {
                    match f {
                        Forward::Unchanged if i == 0 => client.extend_from_slice(chunk),
                        Forward::Unchanged => {}
                        Forward::Replace(bytes) => client.extend_from_slice(&bytes),
                    }
                }
                firsts.push(pushed.first_output);
            }
            let (usage, model, expected_client, text, chars, expected_firsts, counts) =
                reference(Api::ChatCompletions, hide, &chunks);
            prop_assert_eq!(stream.usage(), usage);
            prop_assert_eq!(stream.model().map(str::to_owned), model);
            prop_assert_eq!(client, expected_client);
            prop_assert_eq!(&stream.text, &text);
            prop_assert_eq!(stream.text_chars(), chars);
            prop_assert_eq!(firsts, expected_firsts);
            prop_assert_eq!(stream.counts(), counts);
        }

        /// The usual stream, whole or cut at any boundaries (one event per chunk, several, or
        /// events split), with its usage in the last chunk, in a usage-only chunk or absent,
        /// ended, or cut anywhere: read as the full parse reads it (the per-event fast paths — the
        /// template, the block comparison, nothing looked at once the framer is empty — change
        /// no figure, no byte the client gets, no text kept for the estimate).
        #[test]
        fn the_usual_stream_reads_like_the_full_parse(
            contents in proptest::collection::vec("([a-z é😀]|\\\\|\"|\n){0,6}", 0..40),
            usage in 0u8..4,
            done in proptest::bool::ANY,
            cuts in proptest::collection::vec(0usize..12_000, 0..12),
            per_event in proptest::bool::ANY,
            hide in proptest::bool::ANY,
            cut_short in proptest::option::of(0usize..12_000),
        ) {
            let mut body = openai_stream(&contents, usage, done);
            // a stream cut anywhere, even inside an event
            if let Some(end) = cut_short {
                body.truncate(end % (body.len() + 1));
            }
            let chunks: Vec<&[u8]> = if per_event {
                events_of(&body)
            } else {
                cut_at(&body, &cuts)
            };
            let got = fed(Api::ChatCompletions, hide, &chunks);
            let expected = reference(Api::ChatCompletions, hide, &chunks);
            if cut_short.is_none() {
                prop_assert_eq!(got.0.is_some(), usage != 0);
            }
            prop_assert_eq!(got, expected);
        }

        #[test]
        fn any_chunking_gives_the_same_usage(cuts in proptest::collection::vec(0usize..2000, 0..12)) {
            for (api, body) in [
                (Api::ChatCompletions, chat_stream(false)),
                (Api::AnthropicMessages, anthropic_stream()),
                (Api::Responses, responses_stream()),
            ] {
                let chunks = cut_at(&body, &cuts);
                let (usage, client, _) = run(api, true, &chunks);
                let (expected, expected_client, _) = run(api, true, &[&body]);
                prop_assert_eq!(usage, expected);
                prop_assert_eq!(client, expected_client);
            }
        }
    }
}
