//! The request body: read the top-level `model`, rewrite it, estimate the request's size.
//!
//! Only the top level is looked at: [`llm_gateway_shared::json::scan_object`] validates the
//! whole body in one pass without building the nested messages, and the rewrite splices the
//! new model name into the original bytes, so the messages reach the provider byte for byte.

use crate::translate::Asked;
use llm_gateway_shared::json::{self, quote, scan_object, Edits, Limits, Object};
use llm_gateway_shared::reject::Reject;
use llm_gateway_shared::request::Endpoint;
use std::ops::Range;

/// True if the router plans `path` (with or without a query): every endpoint of
/// [`Endpoint::from_path`], the prefixed forms (`/openai/v1/chat/completions`) included, so
/// that what the other filters count and redact is also routed.
pub fn is_routed_path(path: &str) -> bool {
    Endpoint::from_path(path).is_some()
}

/// True if `path` (with or without a query) is Anthropic's token counting
/// (`/v1/messages/count_tokens`): routed to the group's Anthropic deployment only
/// (`plan::Request::endpoint`); it generates nothing, so later filters count it as a
/// request and charge it no tokens (it is no API of `shared::request::Api`).
pub fn is_count_tokens(path: &str) -> bool {
    Endpoint::from_path(path) == Some(Endpoint::CountTokens)
}

/// A parsed request body.
#[derive(Debug)]
pub struct Body<'a> {
    bytes: &'a [u8],
    object: Object,
    /// The top-level `model`.
    pub model: String,
}

impl<'a> Body<'a> {
    /// Scans `bytes`; 400 if it is not a JSON object with a string `model`.
    pub fn parse(bytes: &'a [u8]) -> Result<Body<'a>, Reject> {
        if bytes.is_empty() {
            return Err(Reject::bad_request(
                "invalid_request_body",
                "the request needs a JSON body with a `model`",
            ));
        }
        let object = scan_object(bytes, &Limits::default()).map_err(|e| {
            Reject::bad_request(
                "invalid_request_body",
                format!("the body is not valid: {e}"),
            )
        })?;
        let model = match object.str(bytes, "model") {
            Ok(Some(model)) if !model.is_empty() => model,
            Ok(_) => {
                return Err(Reject::bad_request(
                    "missing_model",
                    "the body needs a `model` naming a model group",
                ))
            }
            Err(_) => {
                return Err(Reject::bad_request(
                    "invalid_model",
                    "`model` must be a string naming a model group",
                ))
            }
        };
        Ok(Body {
            bytes,
            object,
            model,
        })
    }

    /// The body's bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// What the client asked for that shapes the answer: `stream`, and (Chat) a usage chunk
    /// at the stream's end (`stream_options.include_usage`).
    pub fn asked(&self) -> Asked {
        let stream = self.object.bool(self.bytes, "stream").ok().flatten() == Some(true);
        let include_usage = self
            .object
            .raw(self.bytes, "stream_options")
            .and_then(|raw| {
                let options = scan_object(raw, &Limits::default()).ok()?;
                options.bool(raw, "include_usage").ok().flatten()
            })
            == Some(true);
        Asked {
            stream,
            include_usage,
        }
    }

    /// The body with `model` set to `model`; nothing else changes.
    pub fn with_model(&self, model: &str) -> Vec<u8> {
        let mut edits = Edits::new(self.bytes, &self.object);
        edits.set("model", quote(model).into_bytes());
        edits.finish()
    }

    /// A rough size of the request in tokens: a quarter of the body's bytes plus the output
    /// cap the client asked for. Only used to skip deployments whose context window is
    /// clearly too small; the exact count belongs to token-ratelimit.
    pub fn estimated_tokens(&self) -> u64 {
        let prompt = (self.bytes.len() / 4) as u64;
        let cap = ["max_tokens", "max_completion_tokens", "max_output_tokens"]
            .iter()
            .filter_map(|key| self.object.u64(self.bytes, key).ok().flatten())
            .max()
            .unwrap_or(0);
        prompt.saturating_add(cap)
    }
}

/// A Chat body whose `stream_options` says `include_usage` as `include`: a body translated
/// back into a Chat client's API asks for the usage chunk only if that client did. Unchanged
/// when it already does, or when it is not a JSON object.
pub fn with_include_usage(bytes: &[u8], include: bool) -> Vec<u8> {
    let Ok(object) = scan_object(bytes, &Limits::default()) else {
        return bytes.to_vec();
    };
    let has = object
        .raw(bytes, "stream_options")
        .and_then(|raw| {
            let options = scan_object(raw, &Limits::default()).ok()?;
            options.bool(raw, "include_usage").ok().flatten()
        })
        .unwrap_or(false);
    if has == include {
        return bytes.to_vec();
    }
    let mut edits = Edits::new(bytes, &object);
    if include {
        edits.set("stream_options", br#"{"include_usage":true}"#.to_vec());
    } else {
        edits.remove("stream_options");
    }
    edits.finish()
}

/// Rewrites only `model` of an already-routed body (the upstream filter, per attempt).
/// `None` if `model` is already right (no copy), or if the body is not a JSON object (then it
/// goes upstream unchanged).
///
/// The downstream role validated the body and left it exactly one top-level `model`, so the
/// attempt does not validate it again: [`find_model`] skips over the values (strings eight
/// bytes at a time) to the top-level `model` and only that value is spliced. A body it cannot
/// settle that way — no `model` or several, an escaped key or `model` value, a document that
/// does not hold together — takes the validating path ([`scan_object`] and [`Edits`]); for a
/// valid document both give the same bytes.
pub fn rewrite_model(bytes: &[u8], model: &str) -> Option<Vec<u8>> {
    let Some(value) = find_model(bytes) else {
        return rewrite_model_validating(bytes, model);
    };
    let current = bytes.get(value.clone()).unwrap_or_default();
    if current.contains(&b'\\') {
        return rewrite_model_validating(bytes, model);
    }
    if current
        .strip_prefix(b"\"")
        .and_then(|c| c.strip_suffix(b"\""))
        == Some(model.as_bytes())
    {
        return None; // already right: no copy
    }
    let replacement = quote(model);
    let mut out = Vec::with_capacity(bytes.len() - current.len() + replacement.len());
    out.extend_from_slice(bytes.get(..value.start).unwrap_or_default());
    out.extend_from_slice(replacement.as_bytes());
    out.extend_from_slice(bytes.get(value.end..).unwrap_or_default());
    Some(out)
}

fn rewrite_model_validating(bytes: &[u8], model: &str) -> Option<Vec<u8>> {
    let object = scan_object(bytes, &Limits::default()).ok()?;
    if object.str(bytes, "model").ok().flatten().as_deref() == Some(model) {
        return None; // already right: no copy
    }
    let mut edits = Edits::new(bytes, &object);
    edits.set("model", quote(model).into_bytes());
    Some(edits.finish())
}

/// The span of the value of the only top-level `model` of a JSON object, without validating
/// the values it skips. `None` when it cannot tell: no `model` or more than one, a top-level
/// key with an escape (it might spell `model`), or a document that does not hold together.
pub fn find_model(bytes: &[u8]) -> Option<Range<usize>> {
    let mut at = skip_ws(bytes, 0);
    if bytes.get(at) != Some(&b'{') {
        return None;
    }
    at = skip_ws(bytes, at + 1);
    let mut found = None;
    if bytes.get(at) == Some(&b'}') {
        return None; // no members
    }
    loop {
        if bytes.get(at) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(bytes, at + 1)? + 1;
        let key = bytes.get(at..key_end)?;
        at = skip_ws(bytes, key_end);
        if bytes.get(at) != Some(&b':') {
            return None;
        }
        let value_start = skip_ws(bytes, at + 1);
        let value_end = value_end(bytes, value_start)?;
        if key == b"\"model\"" {
            if found.is_some() {
                return None;
            }
            found = Some(value_start..value_end);
        } else if key.contains(&b'\\') {
            return None;
        }
        at = skip_ws(bytes, value_end);
        match bytes.get(at) {
            Some(b',') => at = skip_ws(bytes, at + 1),
            Some(b'}') => break,
            _ => return None,
        }
    }
    (skip_ws(bytes, at + 1) == bytes.len()).then_some(found?)
}

fn skip_ws(bytes: &[u8], mut at: usize) -> usize {
    while matches!(bytes.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// The offset of the `"` that closes the string whose content starts at `at`.
fn string_end(bytes: &[u8], mut at: usize) -> Option<usize> {
    loop {
        at += json::plain_run(bytes.get(at..)?);
        match bytes.get(at)? {
            b'"' => return Some(at),
            b'\\' => at += 2, // a backslash and the byte it escapes
            _ => at += 1,     // a control character: content here (the body was validated)
        }
    }
}

/// The end of the value starting at `at`: a string, an object or array (brackets counted,
/// strings skipped), or a number or literal (up to the next delimiter).
fn value_end(bytes: &[u8], mut at: usize) -> Option<usize> {
    match bytes.get(at)? {
        b'"' => string_end(bytes, at + 1).map(|end| end + 1),
        b'{' | b'[' => {
            let mut depth = 0usize;
            loop {
                match bytes.get(at)? {
                    b'"' => at = string_end(bytes, at + 1)?,
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(at + 1);
                        }
                    }
                    _ => {}
                }
                at += 1;
            }
        }
        _ => {
            let start = at;
            while !matches!(
                bytes.get(at),
                None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            ) {
                at += 1;
            }
            (at > start).then_some(at)
        }
    }
}

/// True if a provider's error body says the request is longer than the model's context:
/// OpenAI and Azure `context_length_exceeded`, OpenAI's older "maximum context length"
/// message, Anthropic's "prompt is too long". Such a 400 moves to the next deployment.
pub fn is_context_length_error(body: &[u8]) -> bool {
    const MARKERS: [&[u8]; 3] = [
        b"context_length_exceeded",
        b"maximum context length",
        b"prompt is too long",
    ];
    MARKERS
        .iter()
        .any(|m| body.windows(m.len()).any(|w| w.eq_ignore_ascii_case(m)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_rewrites_only_the_top_level_model() {
        let raw = br#"{"model":"fast","messages":[{"role":"user","content":"a \"model\": \u00e9"}],"model_extra":1}"#;
        let body = Body::parse(raw).unwrap();
        assert_eq!(body.model, "fast");
        let out = body.with_model("gpt-4o-mini");
        assert_eq!(
            out,
            br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"a \"model\": \u00e9"}],"model_extra":1}"#
        );
        assert_eq!(rewrite_model(&out, "gpt-4o-mini"), None);
        assert_eq!(
            rewrite_model(&out, "claude").unwrap(),
            br#"{"model":"claude","messages":[{"role":"user","content":"a \"model\": \u00e9"}],"model_extra":1}"#
        );
    }

    #[test]
    fn refuses_missing_and_bad_bodies_with_400() {
        for (raw, code) in [
            (&b""[..], "invalid_request_body"),
            (b"not json", "invalid_request_body"),
            (b"[1]", "invalid_request_body"),
            (b"{\"model\":1}", "invalid_model"),
            (b"{\"messages\":[]}", "missing_model"),
            (b"{\"model\":\"\"}", "missing_model"),
            (b"{\"model\":\"fast\"", "invalid_request_body"),
        ] {
            let err = Body::parse(raw).unwrap_err();
            assert_eq!((err.status, err.code.as_ref()), (400, code), "{raw:?}");
        }
    }

    #[test]
    fn duplicate_models_all_go() {
        let raw = br#"{"model":"x","model":"fast"}"#;
        let body = Body::parse(raw).unwrap();
        assert_eq!(body.model, "fast");
        assert_eq!(body.with_model("m"), br#"{"model":"m"}"#);
    }

    #[test]
    fn estimates_size_from_bytes_and_the_output_cap() {
        let raw = br#"{"model":"fast","max_tokens":1000,"messages":[]}"#;
        let body = Body::parse(raw).unwrap();
        assert_eq!(body.estimated_tokens(), (raw.len() / 4) as u64 + 1000);
    }

    #[test]
    fn rewrites_the_attempt_model_like_the_validating_path() {
        for (raw, model) in [
            (
                &br#"{"model":"gpt-4o-mini","messages":[{"content":"a \"model\": [}"}]}"#[..],
                "claude",
            ),
            (
                br#" { "messages" : [ {"x":{"model":"y"}} ] , "model" : "a" } "#,
                "b",
            ),
            (br#"{"model":"a"}"#, "a"),
            (br#"{"model":1,"stream":true,"n":-1.5e3,"z":null}"#, "m"),
            (br#"{"model":"\u0061"}"#, "a"),
            (br#"{"mod\u0065l":"x","messages":[]}"#, "y"),
            (br#"{"model":"x","model":"y"}"#, "z"),
            (br#"{"messages":[]}"#, "m"),
            (br#"{}"#, "m"),
            (br#"{"model":"a""#, "b"),
            (br#"{"model":"a"} x"#, "b"),
            (br#"{"model":"a","messages":[1,2}"#, "b"),
            (b"[1]", "m"),
        ] {
            assert_eq!(
                rewrite_model(raw, model),
                rewrite_model_validating(raw, model),
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
        let raw = br#"{"messages":[{"role":"user","content":"hi \\ \" there"}],"model":"gpt-4o"}"#;
        let value = find_model(raw).unwrap();
        assert_eq!(&raw[value], br#""gpt-4o""#);
        // an escaped quote or backslash at every offset of the eight-byte steps
        for escape in [r#"\""#, r#"\\"#, r#"\u0022"#] {
            for pad in 0..17 {
                let raw = format!(
                    r#"{{"messages":[{{"content":"{}{escape}}}],\"model\":\"no\"","n":1}}],"model":"gpt-4o"}}"#,
                    "x".repeat(pad)
                );
                let value = find_model(raw.as_bytes()).unwrap();
                assert_eq!(&raw.as_bytes()[value], br#""gpt-4o""#, "{raw}");
                assert_eq!(
                    rewrite_model(raw.as_bytes(), "m"),
                    rewrite_model_validating(raw.as_bytes(), "m")
                );
            }
        }
        assert_eq!(find_model(br#"{"mod\u0065l":"x"}"#), None);
        assert_eq!(find_model(br#"{"model":"x","model":"y"}"#), None);
    }

    #[test]
    fn routed_paths() {
        assert!(is_routed_path("/v1/chat/completions"));
        assert!(is_routed_path("/v1/messages?beta=true"));
        assert!(is_routed_path("/v1/messages/count_tokens?beta=true"));
        assert!(is_count_tokens("/v1/messages/count_tokens?beta=true"));
        assert!(!is_count_tokens("/v1/messages"));
        assert!(!is_routed_path("/v1/messages/batches"));
        assert!(!is_routed_path("/v1/models"));
        assert!(!is_routed_path("/v1/chat/completions/x"));
        // the prefixed forms other filters count and redact are routed too
        assert!(is_routed_path("/openai/v1/chat/completions"));
        assert!(is_count_tokens("/anthropic/v1/messages/count_tokens"));
        assert!(!is_routed_path("/v1/threads/t1/messages"));
    }

    #[test]
    fn recognises_context_length_errors() {
        for body in [
            &br#"{"error":{"message":"This model's maximum context length is 8192 tokens","type":"invalid_request_error","code":"context_length_exceeded"}}"#[..],
            br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
            br#"{"error":{"message":"This model's Maximum Context Length is 4097 tokens"}}"#,
        ] {
            assert!(is_context_length_error(body), "{}", String::from_utf8_lossy(body));
        }
        for body in [
            &br#"{"error":{"code":"invalid_api_key"}}"#[..],
            b"",
            b"context",
        ] {
            assert!(!is_context_length_error(body));
        }
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;
        use serde_json::{Map, Value};

        fn leaf() -> impl Strategy<Value = Value> {
            prop_oneof![
                any::<String>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                any::<bool>().prop_map(Value::from),
                Just(Value::Null),
            ]
        }

        fn value() -> impl Strategy<Value = Value> {
            leaf().prop_recursive(4, 32, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                    prop::collection::btree_map("[a-z_]{1,6}", inner, 0..4)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        proptest! {
            /// The rewrite sets `model` and leaves every other member as the client sent it.
            #[test]
            fn rewrite_changes_only_model(
                members in prop::collection::btree_map("[a-z_]{1,8}", value(), 0..6),
                group in "\\PC{1,20}",
                model in "\\PC{1,40}",
            ) {
                let mut object: Map<String, Value> = members.into_iter().collect();
                object.insert("model".into(), Value::from(group.clone()));
                let raw = serde_json::to_vec(&Value::Object(object.clone())).unwrap();
                let body = Body::parse(&raw).unwrap();
                prop_assert_eq!(&body.model, &group);
                let out: Value = serde_json::from_slice(&body.with_model(&model)).unwrap();
                object.insert("model".into(), Value::from(model.clone()));
                prop_assert_eq!(&out, &Value::Object(object.clone()));
                let again: Value = serde_json::from_slice(
                    &rewrite_model(&raw, &model).unwrap_or_else(|| raw.clone()),
                ).unwrap();
                prop_assert_eq!(again, Value::Object(object));
            }

            /// The attempt's rewrite that skips values gives the validating path's bytes on
            /// any object, compact or spread out, whatever model it is asked for.
            #[test]
            fn attempt_rewrite_matches_the_validating_path(
                members in prop::collection::btree_map("[a-z_]{1,8}", value(), 0..6),
                current in prop::option::of("\\PC{0,12}"),
                model in "\\PC{1,12}",
                pretty in any::<bool>(),
            ) {
                let mut object: Map<String, Value> = members.into_iter().collect();
                if let Some(current) = &current {
                    object.insert("model".into(), Value::from(current.clone()));
                }
                let value = Value::Object(object);
                let raw = if pretty {
                    serde_json::to_vec_pretty(&value).unwrap()
                } else {
                    serde_json::to_vec(&value).unwrap()
                };
                prop_assert_eq!(rewrite_model(&raw, &model), rewrite_model_validating(&raw, &model));
                if let Some(current) = current {
                    prop_assert_eq!(rewrite_model(&raw, &current), None);
                }
            }

            /// Arbitrary bytes never panic the parser; they parse or give a 400.
            #[test]
            fn any_bytes_parse_or_400(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
                match Body::parse(&bytes) {
                    Ok(body) => prop_assert!(!body.model.is_empty()),
                    Err(reject) => prop_assert_eq!(reject.status, 400),
                }
                let _ = rewrite_model(&bytes, "m");
            }
        }
    }
}
