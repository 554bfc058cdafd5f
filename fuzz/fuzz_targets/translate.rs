//! model-router's `translate`: Chat Completions ⇄ Anthropic Messages requests, JSON responses,
//! error bodies and SSE streams, both directions (and the same API).
//!
//! Input: `mode, parameters, payload`. The mode byte picks the entry point (bits 0–1: request,
//! response, error, stream), the API translated from (bit 2: Chat, Messages) and to (bit 3).
//! Parameters: a request takes one byte (`max_completion_tokens`, the default cap), an error
//! two (the status), a stream one (`stream`, `include_usage`) and a split plan. Checked:
//! - a translated request is a JSON object naming the deployment's model, and its own reverse
//!   translation never finds it malformed (`invalid_request_body`); a refusal is a 400 with
//!   `unsupported_field` or `invalid_request_body`;
//! - a translated response is a success body the reverse translation accepts;
//! - an error body is always the client API's error shape, which passes through unchanged
//!   when translated again to the same API;
//! - a stream's output does not depend on where it was cut, holds only JSON events (or
//!   `[DONE]`), and ends finished or failed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_gateway_fuzz::{Input, Plan};
use model_router::translate::{
    error, request, response, Asked, RequestParams, ResponseParams, StreamTranslator, Wire,
};
use serde_json::Value;

const MODEL: &str = "fuzz-model";
const CREATED: ResponseParams = ResponseParams {
    created: 1_750_000_000,
};

fn wire(bit: bool) -> Wire {
    if bit {
        Wire::Messages
    } else {
        Wire::Chat
    }
}

fn check_request(from: Wire, to: Wire, params: &RequestParams<'_>, body: &[u8]) {
    match request(from, to, body, params) {
        Ok(out) => {
            if from == to {
                return;
            }
            let value: Value =
                serde_json::from_slice(&out.body).expect("a translated request is JSON");
            assert_eq!(value["model"], MODEL);
            if to == Wire::Messages {
                assert!(value["max_tokens"].is_u64(), "Messages requires max_tokens");
            }
            if let Err(back) = request(to, from, &out.body, params) {
                assert_ne!(
                    back.code,
                    "invalid_request_body",
                    "our own output is malformed: {}\n{}",
                    back.message,
                    String::from_utf8_lossy(&out.body)
                );
            }
        }
        Err(reject) => {
            assert_eq!(reject.status, 400);
            assert!(
                matches!(
                    reject.code.as_ref(),
                    "unsupported_field" | "invalid_request_body"
                ),
                "{}",
                reject.code
            );
            assert!(!reject.message.is_empty());
        }
    }
}

fn check_response(from: Wire, to: Wire, body: &[u8]) {
    let Ok(out) = response(from, to, body, &CREATED) else {
        return;
    };
    if from == to {
        assert_eq!(out, body);
        return;
    }
    let value: Value = serde_json::from_slice(&out).expect("a translated response is JSON");
    assert!(value.is_object());
    response(to, from, &out, &CREATED).expect("a translated response translates back");
}

fn check_error(from: Wire, to: Wire, status: u16, body: &[u8]) {
    let out = error(from, to, status, body);
    let value: Value = serde_json::from_slice(&out).expect("an error body is JSON");
    assert!(value["error"]["message"].is_string(), "{value}");
    assert!(value["error"]["type"].is_string(), "{value}");
    if to == Wire::Messages {
        assert_eq!(value["type"], "error");
    }
    assert_eq!(
        error(to, to, status, &out),
        out,
        "a client-shaped body passes unchanged"
    );
}

fn translate_stream(
    from: Wire,
    to: Wire,
    asked: Asked,
    chunks: &[&[u8]],
) -> (Vec<u8>, bool, bool, u64) {
    let mut translator = StreamTranslator::new(from, to, asked, CREATED);
    let mut out = Vec::new();
    for chunk in chunks {
        translator.push(chunk, &mut out);
    }
    translator.finish(&mut out);
    (
        out,
        translator.finished(),
        translator.failed(),
        translator.skipped(),
    )
}

fn check_stream(from: Wire, to: Wire, asked: Asked, plan: &Plan, stream: &[u8]) {
    let cut = translate_stream(from, to, asked, &plan.split(stream));
    let whole = translate_stream(from, to, asked, &[stream]);
    assert_eq!(cut, whole, "the output depends on the cuts");
    let (out, finished, failed, _) = whole;
    assert!(finished || failed);
    if from == to {
        return;
    }
    let text = std::str::from_utf8(&out).expect("the output is UTF-8");
    for event in text.split_terminator("\n\n") {
        let data = event
            .lines()
            .find_map(|line| line.strip_prefix("data: "))
            .expect("every event has data");
        assert!(
            data == "[DONE]" || serde_json::from_str::<Value>(data).is_ok(),
            "not JSON: {data}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let mode = input.byte();
    let (from, to) = (wire(mode & 4 != 0), wire(mode & 8 != 0));
    match mode & 3 {
        0 => {
            let flags = input.byte();
            let params = RequestParams {
                model: MODEL,
                default_max_tokens: u64::from(flags >> 1) * 64,
                max_completion_tokens: flags & 1 != 0,
            };
            check_request(from, to, &params, input.rest());
        }
        1 => check_response(from, to, input.rest()),
        2 => {
            let status = u16::from_be_bytes([input.byte(), input.byte()]);
            check_error(from, to, status, input.rest());
        }
        _ => {
            let flags = input.byte();
            let asked = Asked {
                stream: flags & 1 != 0,
                include_usage: flags & 2 != 0,
            };
            let plan = input.plan();
            check_stream(from, to, asked, &plan, input.rest());
        }
    }
});
