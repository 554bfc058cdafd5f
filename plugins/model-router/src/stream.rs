//! After the first byte: a streamed response that ends without its terminator gets an
//! in-band error event, so a client never mistakes a cut stream for a complete one.
//!
//! The watcher sees the SSE body chunk by chunk and remembers only whether the terminator
//! went by: `data: [DONE]` for OpenAI APIs, `event: message_stop` for Anthropic Messages, and
//! `response.completed` / `response.failed` / `response.incomplete` for the Responses API.
//! A terminator split across chunks is found too: the watcher keeps the tail of the previous
//! chunk.

/// Watches one SSE response body.
#[derive(Debug, Default)]
pub struct StreamWatcher {
    tail: Vec<u8>,
    finished: bool,
}

const TERMINATORS: [&[u8]; 5] = [
    b"data: [DONE]",
    b"event: message_stop",
    b"\"type\":\"response.completed\"",
    b"\"type\":\"response.failed\"",
    b"\"type\":\"response.incomplete\"",
];
const KEEP: usize = 32;

impl StreamWatcher {
    /// Feeds the next chunk of the body.
    pub fn push(&mut self, chunk: &[u8]) {
        if self.finished {
            return;
        }
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(chunk);
        self.finished = TERMINATORS
            .iter()
            .any(|t| window.windows(t.len()).any(|w| w == *t));
        let keep_from = window.len().saturating_sub(KEEP);
        self.tail = window.split_off(keep_from);
    }

    /// True once a terminator went by.
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
        w.push(b"data: {\"choices\":[]}\n\n");
        assert!(!w.finished());
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
