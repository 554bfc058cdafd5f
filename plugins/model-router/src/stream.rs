//! After the first byte: a streamed response that ends without its terminator gets an
//! in-band error event, so a client never mistakes a cut stream for a complete one.
//!
//! The watcher frames the SSE body with [`llm_gateway_shared::sse::Framer`] (so a terminator
//! split across chunks is found, and the text `data: [DONE]` inside a JSON string is not taken
//! for one) and remembers only whether a terminating event went by: `data: [DONE]` for OpenAI
//! APIs, `message_stop` for Anthropic Messages, `response.completed` / `response.failed` /
//! `response.incomplete` for the Responses API, or an `error` event the provider sent itself.

use llm_gateway_shared::sse::{Event, Framer};

/// Largest event the watcher frames; a larger one passes through without being looked at.
const MAX_EVENT_BYTES: usize = 1024 * 1024;

const TERMINAL_TYPES: [&str; 5] = [
    "message_stop",
    "response.completed",
    "response.failed",
    "response.incomplete",
    "error",
];

/// Watches one SSE response body.
#[derive(Debug)]
pub struct StreamWatcher {
    framer: Framer,
    finished: bool,
}

impl Default for StreamWatcher {
    fn default() -> Self {
        StreamWatcher {
            framer: Framer::new(MAX_EVENT_BYTES),
            finished: false,
        }
    }
}

fn is_terminal(event: &Event) -> bool {
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
    /// Feeds the next chunk of the body.
    pub fn push(&mut self, chunk: &[u8]) {
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
