//! The request body: read the top-level `model`, rewrite it, estimate the request's size.
//!
//! Only the top level is looked at: [`llm_gateway_shared::json::scan_object`] validates the
//! whole body in one pass without building the nested messages, and the rewrite splices the
//! new model name into the original bytes, so the messages reach the provider byte for byte.

use llm_gateway_shared::json::{quote, scan_object, Edits, Limits, Object};
use llm_gateway_shared::reject::Reject;

/// The endpoints the router handles (path without the query).
pub const ENDPOINTS: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/messages",
    "/v1/embeddings",
];

/// True if `path` (with or without a query) is one of [`ENDPOINTS`].
pub fn is_routed_path(path: &str) -> bool {
    let path = path.split(['?', '#']).next().unwrap_or_default();
    ENDPOINTS.contains(&path)
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

/// Rewrites only `model` of an already-routed body (the upstream filter, per attempt).
/// `None` if the body is not a JSON object (then it goes upstream unchanged).
pub fn rewrite_model(bytes: &[u8], model: &str) -> Option<Vec<u8>> {
    let object = scan_object(bytes, &Limits::default()).ok()?;
    if object.str(bytes, "model").ok().flatten().as_deref() == Some(model) {
        return None; // already right: no copy
    }
    let mut edits = Edits::new(bytes, &object);
    edits.set("model", quote(model).into_bytes());
    Some(edits.finish())
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
    fn routed_paths() {
        assert!(is_routed_path("/v1/chat/completions"));
        assert!(is_routed_path("/v1/messages?beta=true"));
        assert!(!is_routed_path("/v1/models"));
        assert!(!is_routed_path("/v1/chat/completions/x"));
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
