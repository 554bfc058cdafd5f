//! What a request will cost: estimated prompt tokens plus its output cap.
//!
//! The cap is what the client asked for (`max_completion_tokens` or `max_tokens` for Chat
//! Completions, `max_output_tokens` for the Responses API, `max_tokens` for Anthropic
//! Messages). A client that sent none gets the configured default written into the body, so
//! the provider enforces the cap the reservation assumed; a completion can then never cost
//! more than was reserved. Embeddings have no output. Other paths (`/v1/messages/count_tokens`,
//! which generates nothing) are no model call: they cost one request, no tokens and no budget.
//!
//! Prompt tokens are counted with [`llm_gateway_shared::tokens`]: tiktoken for OpenAI model
//! families (feature `tokenizer`), `ceil(chars / 4)` for the others, plus 4 per message. The
//! tokenizer runs over at most `sample_bytes` of text and the rest is counted at the rate it
//! measured (exact for prompts up to that size; the BPE costs ~40 µs per KiB in wasm). For
//! reservations the estimate is raised by `margin_percent` and a few tokens, so that a
//! provider counting a little more than the gateway does not push a budget past its amount.

use crate::counts::TextCounts;
use llm_gateway_shared::json::{self, Kind, Limits};
use llm_gateway_shared::reject::Reject;
use llm_gateway_shared::request::Api;
use llm_gateway_shared::tokens::{
    count_tokens, estimate_prompt_tokens_sampled, estimate_text_tokens_sampled_with, Encoding,
};
use std::cell::RefCell;

/// Tokens added to every reservation's prompt estimate (chat priming and separators the
/// per-message overhead does not cover).
pub const PROMPT_SLACK: u64 = 8;

/// A request's cost and the body to forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cost {
    /// The API, if the path is one of the LLM APIs.
    pub api: Option<Api>,
    /// The model named in the body.
    pub model: Option<String>,
    /// Estimated prompt tokens (with margin and slack).
    pub prompt: u64,
    /// The output cap.
    pub output_cap: u64,
    /// The body with the injected cap; `None` if unchanged.
    pub body: Option<Vec<u8>>,
}

impl Cost {
    /// Prompt plus cap: what a reservation takes.
    pub fn tokens(&self) -> u64 {
        self.prompt.saturating_add(self.output_cap)
    }

    /// True for a call of an LLM API (one `Api::from_path` knows): only those take tokens,
    /// reserve budgets and expect a usage record. Anything else counts as a request only.
    pub fn is_model_call(&self) -> bool {
        self.api.is_some()
    }
}

/// The field that caps output in `api`, for reading (in order of precedence) and for
/// injecting (the first).
fn cap_fields(api: Api) -> &'static [&'static str] {
    match api {
        Api::ChatCompletions => &["max_completion_tokens", "max_tokens"],
        Api::Responses => &["max_output_tokens"],
        Api::AnthropicMessages => &["max_tokens"],
        Api::Embeddings => &[],
    }
}

/// Reads a request body and computes its cost.
///
/// Errors are OpenAI-shaped 400s that name the field (never echoing content): a body that is
/// not a JSON object, a cap that is not a non-negative integer.
pub fn inspect(
    path: &str,
    body: &[u8],
    default_max_tokens: u64,
    margin_percent: u8,
    sample_bytes: usize,
) -> Result<Cost, Reject> {
    inspect_by(
        path,
        body,
        default_max_tokens,
        margin_percent,
        sample_bytes,
        &count_tokens,
    )
}

/// [`inspect`] with the tokenizer's counts of texts counted before taken from `counts` (the
/// VM's cache, [`crate::counts`]): the same cost.
pub fn inspect_cached(
    path: &str,
    body: &[u8],
    default_max_tokens: u64,
    margin_percent: u8,
    sample_bytes: usize,
    counts: &mut TextCounts,
) -> Result<Cost, Reject> {
    let counts = RefCell::new(counts);
    inspect_by(
        path,
        body,
        default_max_tokens,
        margin_percent,
        sample_bytes,
        &|encoding, text| counts.borrow_mut().count(encoding, text),
    )
}

/// [`inspect`], counting the sample's texts with `tokenize` (`count_tokens` or a cache of it).
fn inspect_by(
    path: &str,
    body: &[u8],
    default_max_tokens: u64,
    margin_percent: u8,
    sample_bytes: usize,
    tokenize: &dyn Fn(Encoding, &str) -> u64,
) -> Result<Cost, Reject> {
    let Some(api) = Api::from_path(path) else {
        return Ok(Cost {
            api: None,
            model: None,
            prompt: 0,
            output_cap: 0,
            body: None,
        });
    };
    // UTF-8 validated once, for the scan and the estimate
    let (text, object) = json::utf8(body)
        .and_then(|text| Ok((text, json::scan_object_text(text, &Limits::default())?)))
        .map_err(|e| {
            Reject::bad_request(
                "invalid_json",
                format!("the request body is not a valid JSON object ({e})"),
            )
        })?;
    let model = object.str(body, "model").ok().flatten();
    let mut cap = None;
    for field in cap_fields(api) {
        match object.get(field) {
            None => continue,
            Some(member) if member.kind == Kind::Null => continue,
            Some(_) => {}
        }
        let value = object.u64(body, field).map_err(|_| {
            Reject::bad_request(
                "invalid_value",
                format!("`{field}` must be a non-negative integer"),
            )
        })?;
        if let Some(value) = value {
            cap = Some((*field, value));
            break;
        }
    }
    let mut edited = None;
    let output_cap = match (cap, cap_fields(api).first()) {
        (Some((field, cap)), _) => {
            // The cap read is the last copy; a provider whose parser keeps the first would
            // generate up to another cap than the one reserved: leave one copy only.
            if object.members().iter().filter(|m| m.key == field).count() > 1 {
                let mut edits = json::Edits::new(body, &object);
                edits.set(field, cap.to_string().into_bytes());
                edited = Some(edits.finish());
            }
            cap
        }
        (None, None) => 0,
        (None, Some(field)) => {
            let mut edits = json::Edits::new(body, &object);
            edits.set(field, default_max_tokens.to_string().into_bytes());
            edited = Some(edits.finish());
            default_max_tokens
        }
    };
    let encoding = Encoding::for_model(model.as_deref().unwrap_or_default());
    // read from the bytes; parsed with serde_json only where it might read them otherwise
    let estimate =
        match estimate_text_tokens_sampled_with(api, text, encoding, sample_bytes, &|text| {
            tokenize(encoding, text)
        }) {
            Some(estimate) => estimate,
            None => {
                let parsed: serde_json::Value = serde_json::from_slice(body).map_err(|_| {
                    Reject::bad_request("invalid_json", "the request body is not valid JSON")
                })?;
                estimate_prompt_tokens_sampled(api, &parsed, encoding, sample_bytes)
            }
        };
    let prompt = estimate
        .saturating_add(
            estimate
                .saturating_mul(u64::from(margin_percent))
                .div_ceil(100),
        )
        .saturating_add(PROMPT_SLACK);
    Ok(Cost {
        api: Some(api),
        model,
        prompt,
        output_cap,
        body: edited,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use llm_gateway_shared::tokens::estimate_body_tokens_sampled;
    use proptest::prelude::*;

    fn chat(body: &str) -> Result<Cost, Reject> {
        inspect("/v1/chat/completions", body.as_bytes(), 100, 0, 1 << 20)
    }

    #[test]
    fn injects_the_default_cap_when_the_client_sent_none() {
        let c = chat(r#"{"model":"m","messages":[{"role":"user","content":"abcdefgh"}]}"#).unwrap();
        assert_eq!(c.output_cap, 100);
        // ceil(8/4) + 4 per message + slack
        assert_eq!(c.prompt, 2 + 4 + PROMPT_SLACK);
        let body: serde_json::Value = serde_json::from_slice(c.body.as_ref().unwrap()).unwrap();
        assert_eq!(body["max_completion_tokens"], 100);
        assert_eq!(c.tokens(), 114);
    }

    #[test]
    fn token_counting_is_no_model_call() {
        let body = br#"{"model":"claude","messages":[{"role":"user","content":"abcdefgh"}]}"#;
        let c = inspect("/v1/messages/count_tokens", body, 100, 0, 1 << 20).unwrap();
        assert!(!c.is_model_call());
        assert_eq!(
            (c.tokens(), c.body),
            (0, None),
            "no cap injected, nothing reserved"
        );
        let m = inspect("/v1/messages", body, 100, 0, 1 << 20).unwrap();
        assert!(m.is_model_call());
        assert!(m.tokens() > 100);
    }

    #[test]
    fn keeps_the_clients_cap() {
        for field in ["max_tokens", "max_completion_tokens"] {
            let c = chat(&format!(r#"{{"model":"m","messages":[],"{field}":7}}"#)).unwrap();
            assert_eq!(c.output_cap, 7);
            assert_eq!(c.body, None);
        }
        let c = chat(r#"{"model":"m","messages":[],"max_tokens":null}"#).unwrap();
        assert_eq!(c.output_cap, 100);
        let body: serde_json::Value = serde_json::from_slice(c.body.as_ref().unwrap()).unwrap();
        assert_eq!(body["max_completion_tokens"], 100);
        let a = inspect(
            "/v1/messages",
            br#"{"model":"claude","messages":[]}"#,
            50,
            0,
            1 << 20,
        )
        .unwrap();
        let body: serde_json::Value = serde_json::from_slice(a.body.as_ref().unwrap()).unwrap();
        assert_eq!(body["max_tokens"], 50);
        let r = inspect(
            "/v1/responses",
            br#"{"model":"x","input":"hi","max_output_tokens":9}"#,
            50,
            0,
            1 << 20,
        )
        .unwrap();
        assert_eq!(r.output_cap, 9);
        let e = inspect(
            "/v1/embeddings",
            br#"{"model":"x","input":"hi"}"#,
            50,
            0,
            1 << 20,
        )
        .unwrap();
        assert_eq!((e.output_cap, e.body), (0, None));
    }

    #[test]
    fn a_duplicated_cap_leaves_one_copy_the_one_reserved() {
        let c = chat(r#"{"max_tokens":100000,"model":"m","messages":[],"max_tokens":5}"#).unwrap();
        assert_eq!(c.output_cap, 5);
        let body = String::from_utf8(c.body.unwrap()).unwrap();
        assert_eq!(body, r#"{"model":"m","messages":[],"max_tokens":5}"#);
        // an earlier copy that is not a number goes too
        let c = chat(r#"{"model":"m","max_tokens":"x","messages":[],"max_tokens":7}"#).unwrap();
        assert_eq!(c.output_cap, 7);
        assert_eq!(
            String::from_utf8(c.body.unwrap()).unwrap(),
            r#"{"model":"m","messages":[],"max_tokens":7}"#
        );
        // a single copy is left as it is
        assert_eq!(chat(r#"{"model":"m","max_tokens":5}"#).unwrap().body, None);
    }

    #[test]
    fn margin_raises_the_prompt_estimate() {
        let text = "a".repeat(400); // 100 tokens + 4
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"{text}"}}],"max_tokens":1}}"#
        );
        let c = inspect("/v1/chat/completions", body.as_bytes(), 1, 10, 1 << 20).unwrap();
        assert_eq!(c.prompt, 104 + 11 + PROMPT_SLACK);
    }

    #[test]
    fn bad_caps_and_bodies_are_400s_that_name_the_field() {
        for bad in [
            r#"-1"#,
            r#"1.5"#,
            r#""10""#,
            r#"1e3"#,
            r#"99999999999999999999999"#,
        ] {
            let err = chat(&format!(
                r#"{{"model":"m","messages":[],"max_tokens":{bad}}}"#
            ))
            .unwrap_err();
            assert_eq!(err.status, 400);
            assert!(err.message.contains("max_tokens"), "{}", err.message);
        }
        for bad in ["", "[]", "{", "{\"a\":1}x", "\u{0}"] {
            assert_eq!(chat(bad).unwrap_err().status, 400, "{bad:?}");
        }
        assert_eq!(
            inspect(
                "/v1/chat/completions",
                b"{\"model\":\"\xff\"}",
                1,
                0,
                1 << 20
            )
            .unwrap_err()
            .status,
            400
        );
    }

    #[test]
    fn other_paths_cost_no_tokens() {
        let c = inspect("/healthz", b"not json", 1, 0, 1 << 20).unwrap();
        assert_eq!((c.api, c.tokens(), c.body), (None, 0, None));
    }

    proptest! {
        /// One cache across many requests whose conversations share messages: every estimate
        /// is the one counted afresh with the tokenizer (`estimate_body_tokens_sampled`, what
        /// `inspect` called before the cache), whatever the sample size.
        #[test]
        fn the_cache_changes_no_estimate(
            requests in proptest::collection::vec(
                (proptest::collection::vec(0usize..12, 0..6), 0usize..6000, 0u8..30, 0usize..3),
                1..12,
            )
        ) {
            let texts: Vec<String> = (0..12)
                .map(|i| match i % 4 {
                    0 => "The quarterly review covers onboarding and billing. ".repeat(1 + i),
                    1 => format!("short {i}"),
                    2 => "日本語のテキストを数えます。".repeat(i),
                    _ => format!("line\n\t\"quoted\" {}", "é".repeat(40 * i)),
                })
                .collect();
            let models = ["gpt-4o-mini", "gpt-4-turbo", "claude-sonnet-4-5"];
            let mut counts = TextCounts::default();
            for (picked, sample, margin, model) in requests {
                let messages: Vec<serde_json::Value> = picked
                    .iter()
                    .map(|&t| serde_json::json!({"role": "user", "content": texts[t]}))
                    .collect();
                let body = serde_json::json!({
                    "model": models[model], "max_tokens": 5, "messages": messages
                })
                .to_string();
                let cost = inspect_cached(
                    "/v1/chat/completions", body.as_bytes(), 9, margin, sample, &mut counts,
                )
                .unwrap();
                let encoding = Encoding::for_model(models[model]);
                let fresh = estimate_body_tokens_sampled(
                    Api::ChatCompletions, body.as_bytes(), encoding, sample,
                )
                .unwrap();
                let expected = fresh + (fresh * u64::from(margin)).div_ceil(100) + PROMPT_SLACK;
                prop_assert_eq!(cost.prompt, expected);
            }
        }

        #[test]
        fn never_panics(body in proptest::collection::vec(any::<u8>(), 0..300), path in "(/v1/chat/completions|/v1/messages|/v1/responses|/v1/embeddings|/x)") {
            let _ = inspect(&path, &body, 10, 5, 64);
        }

        #[test]
        fn the_cap_is_what_the_forwarded_body_says(cap in proptest::option::of(0u64..1_000_000)) {
            let body = match cap {
                Some(c) => format!(r#"{{"model":"m","messages":[],"max_tokens":{c}}}"#),
                None => r#"{"model":"m","messages":[]}"#.to_string(),
            };
            let cost = chat(&body).unwrap();
            let forwarded = cost.body.clone().unwrap_or_else(|| body.into_bytes());
            let v: serde_json::Value = serde_json::from_slice(&forwarded).unwrap();
            let sent = v.get("max_tokens").or_else(|| v.get("max_completion_tokens")).and_then(|x| x.as_u64());
            prop_assert_eq!(sent, Some(cost.output_cap));
        }
    }
}
