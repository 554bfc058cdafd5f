//! The JSON body editing of the request path: `shared::json` (validating scan of the top
//! level, `Edits`, `walk` + `splice`) and the plugins' uses of it — model-router's model
//! rewrite, token-ratelimit's output cap injection, usage-accounting's `include_usage`
//! injection.
//!
//! Input: `path selector, edit count, edits…, body`. Checked:
//! - `scan_object` agrees with `serde_json` on what is valid (modulo the documented
//!   differences: nesting past 64, lone surrogate escapes, numbers beyond f64), and its
//!   getters agree with `serde_json`'s values;
//! - every edited body is valid JSON (our scanner and `serde_json`), holds exactly the
//!   members the edits say, and leaves every other member's value as it was;
//! - replacing every string `walk` reports keeps the document valid.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_gateway_fuzz::Input;
use llm_gateway_shared::json::{self, Edits, Kind, Limits, Scalar};
use llm_gateway_shared::request::Api;
use serde_json::{Map, Value};

const KEYS: [&str; 8] = [
    "model",
    "stream",
    "max_tokens",
    "stream_options",
    "messages",
    "",
    "k\"\\\u{1}",
    "é",
];
const VALUES: [&str; 8] = [
    "\"gpt-4o-mini\"",
    "true",
    "2048",
    "{\"include_usage\":true}",
    "null",
    "[]",
    "\"a\\\"\\u00e9\"",
    "-1.5e3",
];
const PATHS: [&str; 5] = [
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/embeddings",
    "/healthz",
];

/// `\uD800` to `\uDBFF`, in either case.
fn has_high_surrogate_escape(body: &[u8]) -> bool {
    body.windows(4).any(|w| {
        w[0] == b'\\'
            && w[1] == b'u'
            && w[2].eq_ignore_ascii_case(&b'd')
            && matches!(w[3].to_ascii_lowercase(), b'8' | b'9' | b'a' | b'b')
    })
}

fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(members) => 1 + members.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// The members of an edited body, which must be valid JSON. `serde_json` reads it whenever
/// it read the original (`strict`); an original with a lone surrogate escape, which the
/// scanner passes on as it is, keeps it (then `None`).
fn object(bytes: &[u8], strict: bool) -> Option<Map<String, Value>> {
    assert!(
        json::scan_object(bytes, &Limits::default()).is_ok(),
        "an edit made invalid JSON: {:?}",
        String::from_utf8_lossy(bytes)
    );
    if !strict {
        return None;
    }
    match serde_json::from_slice(bytes) {
        Ok(Value::Object(members)) => Some(members),
        other => panic!("serde_json refuses an edited body: {other:?}"),
    }
}

/// The members of `edited` other than `changed` are those of `original`.
fn same_except(original: &Map<String, Value>, edited: &Map<String, Value>, changed: &[&str]) {
    let rest = |m: &Map<String, Value>| {
        let mut m = m.clone();
        m.retain(|k, _| !changed.contains(&k.as_str()));
        m
    };
    assert_eq!(
        rest(original),
        rest(edited),
        "an edit changed another member"
    );
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let path = PATHS[usize::from(input.byte()) % PATHS.len()];
    let ops: Vec<u8> = (0..input.byte() % 5).map(|_| input.byte()).collect();
    let body = input.rest();
    let limits = Limits::default();

    let scanned = json::scan_object(body, &limits);
    let parsed: Result<Value, _> = serde_json::from_slice(body);
    match (&scanned, &parsed) {
        (Ok(_), Err(e)) => {
            // serde_json calls a high surrogate not followed by `\u` "unexpected end of hex
            // escape"
            let why = e.to_string();
            assert!(
                why.contains("surrogate")
                    || why.contains("number out of range")
                    || (why.contains("hex escape") && has_high_surrogate_escape(body)),
                "scan_object accepts what serde_json refuses ({why})"
            );
        }
        (Err(e), Ok(Value::Object(_))) if depth(parsed.as_ref().unwrap()) <= limits.max_depth => {
            panic!("scan_object refuses what serde_json accepts ({e})")
        }
        _ => {}
    }
    assert_eq!(json::scan_value(body, &limits).is_ok(), {
        let mut ok = true;
        json::walk(body, &limits, &mut |_, _, _| {})
            .map_err(|_| ok = false)
            .ok();
        ok
    });

    // walk + splice: every string replaced, the document stays valid
    let mut spans = Vec::new();
    if json::walk(body, &limits, &mut |_, kind, span| {
        if kind == Scalar::String {
            spans.push((span, json::quote("[EMAIL_1] \"\u{7}").into_bytes()));
        }
    })
    .is_ok()
    {
        let spliced = json::splice(body, &spans);
        assert!(
            json::scan_value(&spliced, &limits).is_ok(),
            "splice broke the document"
        );
    }

    let Ok(object_scan) = scanned else {
        return;
    };
    let original = match &parsed {
        Ok(Value::Object(members)) => Some(members.clone()),
        _ => None,
    };

    // getters agree with serde_json
    if let Some(original) = &original {
        for key in KEYS {
            if let Ok(Some(s)) = object_scan.str(body, key) {
                assert_eq!(original.get(key).and_then(Value::as_str), Some(s.as_str()));
            }
            if let Ok(Some(n)) = object_scan.u64(body, key) {
                assert_eq!(original.get(key).and_then(Value::as_u64), Some(n));
            }
            if let Ok(Some(b)) = object_scan.bool(body, key) {
                assert_eq!(original.get(key).and_then(Value::as_bool), Some(b));
            }
            if let Some(member) = object_scan.get(key) {
                let kind = match &original[key] {
                    Value::String(_) => Kind::String,
                    Value::Number(_) => Kind::Number,
                    Value::Bool(_) => Kind::Bool,
                    Value::Null => Kind::Null,
                    Value::Object(_) => Kind::Object,
                    Value::Array(_) => Kind::Array,
                };
                assert_eq!(member.kind, kind, "member {key:?}");
            }
        }
    }

    // arbitrary top-level edits
    let mut edits = Edits::new(body, &object_scan);
    let mut expected = original.clone();
    for op in &ops {
        let key = KEYS[usize::from(op & 7)];
        if op & 0x80 != 0 {
            edits.remove(key);
            if let Some(e) = &mut expected {
                e.remove(key);
            }
        } else {
            let value = VALUES[usize::from((op >> 3) & 7)];
            edits.set(key, value.as_bytes().to_vec());
            if let Some(e) = &mut expected {
                e.insert(key.to_owned(), serde_json::from_str(value).unwrap());
            }
        }
    }
    let edited = edits.finish();
    let strict = original.is_some();
    let edited_members = object(&edited, strict);
    if let Some(expected) = expected {
        assert_eq!(edited_members, Some(expected), "edits gave other members");
    }

    // model-router: parse, rewrite `model`
    if let Ok(request) = model_router::body::Body::parse(body) {
        let _ = request.estimated_tokens();
        if let Some(rewritten) = object(&request.with_model("claude-\"x\"/é"), strict) {
            assert_eq!(rewritten["model"], "claude-\"x\"/é");
            same_except(original.as_ref().unwrap(), &rewritten, &["model"]);
        }
    }
    if let Some(new) = model_router::body::rewrite_model(body, "gpt-4o") {
        if let Some(rewritten) = object(&new, strict) {
            assert_eq!(rewritten["model"], "gpt-4o");
            same_except(original.as_ref().unwrap(), &rewritten, &["model"]);
        }
    }

    // token-ratelimit: the output cap written into a request that has none, or a duplicated
    // cap left once: the body then holds the cap the reservation assumed, exactly once
    if let Ok(cost) = token_ratelimit::cost::inspect(path, body, 2048, 20, 4096) {
        let _ = cost.tokens();
        if let Some(new) = &cost.body {
            let fields: &[&str] = match cost.api {
                Some(Api::ChatCompletions) => &["max_completion_tokens", "max_tokens"],
                Some(Api::Responses) => &["max_output_tokens"],
                Some(Api::AnthropicMessages) => &["max_tokens"],
                other => panic!("a body rewritten for {other:?}"),
            };
            let scanned = json::scan_object(new, &limits).unwrap();
            assert!(
                fields.iter().any(|f| {
                    scanned.u64(new, f) == Ok(Some(cost.output_cap))
                        && scanned.members().iter().filter(|m| m.key == *f).count() == 1
                }),
                "the body does not hold the cap {} once",
                cost.output_cap
            );
            if let Some(capped) = object(new, strict) {
                same_except(original.as_ref().unwrap(), &capped, fields);
            }
        }
    }

    // usage-accounting: `stream_options.include_usage` spliced into a streaming chat request
    let api = Api::from_path(path).unwrap_or(Api::ChatCompletions);
    for inject in [false, true] {
        let (info, new) = usage_accounting::request::inspect(api, body, inject);
        let Some(new) = new else { continue };
        assert!(inject && info.injected_include_usage && info.stream);
        let Some(injected) = object(&new, strict) else {
            continue;
        };
        let original = original.as_ref().unwrap();
        assert_eq!(injected["stream_options"]["include_usage"], true);
        same_except(original, &injected, &["stream_options"]);
        if let (Some(Value::Object(before)), Some(Value::Object(after))) = (
            original.get("stream_options"),
            injected.get("stream_options"),
        ) {
            same_except(before, after, &["include_usage"]);
        }
    }
});
