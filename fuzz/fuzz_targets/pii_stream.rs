//! pii-redaction's response side: placeholders restored in SSE streams cut anywhere
//! (`SseRestorer` over `StreamRestorer`, `TextRestorer`, `OutputHold`).
//!
//! Input: `mode, split plans, text or stream`.
//! - Echo modes (Chat Completions, Anthropic Messages, Responses API): the text is redacted
//!   with the default rules, the "model" streams the redacted text back in deltas cut by one
//!   plan, the SSE bytes reach the restorer in chunks cut by another. The deltas the client
//!   gets concatenate to the original text (restore ∘ mask = id across any delta and chunk
//!   cuts), and every event the restorer writes is valid JSON. The text restorer alone gives
//!   what a whole-text restore gives, holding back at most one placeholder's length; the
//!   output hold gives back its text, holding at most its bound.
//! - Raw mode: any bytes as a stream (output rules on or off): the output does not depend on
//!   the chunk cuts, and a stream without `[` or escapes passes byte for byte.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_gateway_fuzz::{Input, Plan};
use llm_gateway_shared::json;
use llm_gateway_shared::sse::Framer;
use pii_redaction::config::{parse_document, PiiConfig};
use pii_redaction::mask::{
    OutputHold, PlaceholderMap, TextRestorer, MAX_NAME_LEN, MAX_OUTPUT_HOLD,
};
use pii_redaction::response::SseRestorer;
use serde_json::Value;
use std::rc::Rc;

thread_local! {
    static DEFAULT: Rc<PiiConfig> = config("{}");
    static OUTPUT: Rc<PiiConfig> = config(
        r#"{"output_rules": [{"detector": "ipv4"}, {"detector": "email", "action": "hash"}],
            "hash_salt": "fuzz-salt"}"#,
    );
}

fn config(doc: &str) -> Rc<PiiConfig> {
    parse_document(doc.as_bytes())
        .unwrap()
        .global()
        .cloned()
        .unwrap()
}

/// The longest placeholder: `[`, name, `_`, ten digits, `]`.
const MAX_PLACEHOLDER: usize = MAX_NAME_LEN + 13;

#[derive(Clone, Copy)]
enum Shape {
    Chat,
    Anthropic,
    Responses,
}

fn event(out: &mut Vec<u8>, name: Option<&str>, data: &str) {
    out.extend_from_slice(&llm_gateway_shared::sse::encode(name, data));
}

/// The SSE body of a model streaming `deltas`, in `shape`.
fn stream(shape: Shape, deltas: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    for delta in deltas {
        let q = json::quote(delta);
        match shape {
            Shape::Chat => event(
                &mut out,
                None,
                &format!(
                    r#"{{"id":"c1","object":"chat.completion.chunk","choices":[{{"index":0,"delta":{{"content":{q}}},"finish_reason":null}}]}}"#
                ),
            ),
            Shape::Anthropic => event(
                &mut out,
                Some("content_block_delta"),
                &format!(
                    r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":{q}}}}}"#
                ),
            ),
            Shape::Responses => event(
                &mut out,
                Some("response.output_text.delta"),
                &format!(
                    r#"{{"type":"response.output_text.delta","item_id":"m1","output_index":0,"content_index":0,"delta":{q}}}"#
                ),
            ),
        }
    }
    match shape {
        Shape::Chat => {
            event(
                &mut out,
                None,
                r#"{"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            );
            event(&mut out, None, "[DONE]");
        }
        Shape::Anthropic => {
            event(
                &mut out,
                Some("content_block_stop"),
                r#"{"type":"content_block_stop","index":0}"#,
            );
            event(&mut out, Some("message_stop"), r#"{"type":"message_stop"}"#);
        }
        Shape::Responses => {
            event(
                &mut out,
                Some("response.output_text.done"),
                r#"{"type":"response.output_text.done","output_index":0,"content_index":0}"#,
            );
            event(
                &mut out,
                Some("response.completed"),
                r#"{"type":"response.completed"}"#,
            );
        }
    }
    out
}

/// The text of the deltas in an SSE body of `shape`; every data line but `[DONE]` must be
/// JSON.
fn delta_text(shape: Shape, body: &[u8]) -> String {
    let mut framer = Framer::new(usize::MAX);
    framer.push(body);
    framer.close();
    let mut text = String::new();
    while let Some(item) = framer.next_event() {
        let event = item.unwrap();
        let data = event.data.as_deref().unwrap_or_default();
        if data == "[DONE]" {
            continue;
        }
        let value: Value = serde_json::from_str(data)
            .unwrap_or_else(|e| panic!("the restorer wrote an event that is not JSON ({e})"));
        let delta = match shape {
            Shape::Chat => &value["choices"][0]["delta"]["content"],
            Shape::Anthropic => &value["delta"]["text"],
            Shape::Responses => &value["delta"],
        };
        text.push_str(delta.as_str().unwrap_or_default());
    }
    assert_eq!(
        framer.finish(),
        None,
        "the restorer left an unterminated event"
    );
    text
}

fn restore_stream(
    restorer: &mut SseRestorer,
    map: &mut PlaceholderMap,
    chunks: &[&[u8]],
) -> Vec<u8> {
    let mut out = Vec::new();
    for chunk in chunks {
        out.extend_from_slice(&restorer.push(map, chunk));
    }
    out.extend_from_slice(&restorer.finish(map));
    out
}

fn echo(shape: Shape, mut input: Input<'_>) {
    let delta_plan = input.plan();
    let chunk_plan = input.plan();
    let mut text = String::from_utf8_lossy(input.rest()).into_owned();
    if matches!(delta_plan, Plan::EveryByte) || matches!(chunk_plan, Plan::EveryByte) {
        // one event per byte of text, or one push per byte of a stream ~100 times the text:
        // keep such inputs short, or they take most of a run's time
        let mut cut = text.len().min(512);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    let config = DEFAULT.with(Rc::clone);
    let mut map = PlaceholderMap::default();
    let redacted = config
        .redactor
        .redact(&text, &mut map)
        .unwrap()
        .unwrap_or_else(|| text.clone());
    assert_eq!(map.restore(&redacted), text, "restore(mask(x)) != x");

    // the text restorer alone, over the model's deltas
    let deltas = delta_plan.split_str(&redacted);
    for json_text in [false, true] {
        let mut restorer = if json_text {
            TextRestorer::for_json_text()
        } else {
            TextRestorer::default()
        };
        let mut out = String::new();
        for delta in &deltas {
            out.push_str(&restorer.push(&map, delta));
            let held = restorer.clone().finish(&map);
            assert!(held.len() <= MAX_PLACEHOLDER, "holds {} bytes", held.len());
        }
        out.push_str(&restorer.finish(&map));
        let whole = if json_text {
            map.restore_json(&redacted)
        } else {
            map.restore(&redacted)
        };
        assert_eq!(
            out, whole,
            "streamed restore differs from a whole-text restore"
        );
    }
    let mut hold = OutputHold::default();
    let mut out = String::new();
    for delta in &deltas {
        out.push_str(&hold.push(delta));
        assert!(hold.clone().finish().len() <= MAX_OUTPUT_HOLD);
    }
    out.push_str(&hold.finish());
    assert_eq!(out, redacted);

    // the whole stream, cut anywhere
    let body = stream(shape, &deltas);
    let mut restorer = SseRestorer::default();
    let restored = restore_stream(&mut restorer, &mut map, &chunk_plan.split(&body));
    assert_eq!(
        delta_text(shape, &restored),
        text,
        "the client did not get the original text"
    );
}

fn raw(mut input: Input<'_>) {
    let output_rules = input.byte() & 1 != 0;
    let plan = input.plan();
    let body = input.rest();
    let config = if output_rules {
        OUTPUT.with(Rc::clone)
    } else {
        DEFAULT.with(Rc::clone)
    };
    let mut map = PlaceholderMap::default();
    let seen = "mail ann@example.com or +86 138 0013 8000 from 10.1.2.3, not [EMAIL_9]";
    let _ = DEFAULT.with(|d| d.redactor.redact(seen, &mut map));
    let fresh = || SseRestorer::with_output(config.output.clone());

    let cut = restore_stream(&mut fresh(), &mut map.clone(), &plan.split(body));
    if body.len() < 1 << 20 {
        let whole = restore_stream(&mut fresh(), &mut map.clone(), &[body]);
        assert_eq!(cut, whole, "restoring depends on the chunk cuts");
    }
    if !output_rules && !body.contains(&b'[') && !body.contains(&b'\\') {
        assert_eq!(cut, body, "a stream without placeholders changed");
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    match input.byte() % 4 {
        0 => echo(Shape::Chat, input),
        1 => echo(Shape::Anthropic, input),
        2 => echo(Shape::Responses, input),
        _ => raw(input),
    }
});
