//! The gateway's refusals, mapped to HTTP responses in one place for every plugin.
//!
//! Clients of the gateway are OpenAI (and Anthropic) SDKs; they read the status and the error
//! body of their API: OpenAI's `{"error":{"message","type","code"}}` (every refusal of every
//! plugin) or, for a Messages client whose request the router translated, Anthropic's
//! `{"type":"error","error":{"type","message"}}` ([`ErrorShape`]). A plugin that refuses a
//! request builds a [`Reject`] from plain values and the shell sends it as a local reply
//! (`host::refuse`); the status, the body, the `content-type` and any extra headers
//! (`WWW-Authenticate`, `Retry-After`) come from here so that every plugin answers the same way.

use serde::Serialize;
use std::borrow::Cow;

/// The `error.type` field. OpenAI's and Anthropic's names, one per kind of refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    /// 400, 404, 413: the request itself is wrong.
    InvalidRequest,
    /// 401: no usable credential.
    Authentication,
    /// 403: the caller is known but not allowed.
    Permission,
    /// 404 for an unknown model or route.
    NotFound,
    /// 429: a rate limit.
    RateLimit,
    /// 402: a hard budget is used up.
    InsufficientQuota,
    /// 5xx caused by the gateway or a provider.
    Api,
}

impl ErrorType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::InvalidRequest => "invalid_request_error",
            ErrorType::Authentication => "authentication_error",
            ErrorType::Permission => "permission_error",
            ErrorType::NotFound => "not_found_error",
            ErrorType::RateLimit => "rate_limit_error",
            ErrorType::InsufficientQuota => "insufficient_quota",
            ErrorType::Api => "api_error",
        }
    }
}

/// A refusal: status, OpenAI error JSON and extra response headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// HTTP status of the local reply.
    pub status: u16,
    /// `error.type`.
    pub error_type: ErrorType,
    /// `error.code`, machine-readable (`invalid_api_key`, `model_not_found`, ...).
    pub code: Cow<'static, str>,
    /// `error.message`, for humans. Never contains a key, a prompt or a PII value.
    pub message: Cow<'static, str>,
    /// Extra response headers (lowercase names).
    pub headers: Vec<(&'static str, String)>,
}

/// Which API's error body a refusal is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorShape {
    /// `{"error":{"message","type","code"}}`: OpenAI's, the gateway's own.
    OpenAi,
    /// `{"type":"error","error":{"type","message"}}`: Anthropic Messages'.
    Anthropic,
}

#[derive(Serialize)]
struct Body<'a> {
    error: ErrorBody<'a>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    error_type: &'a str,
    code: &'a str,
}

impl Reject {
    /// A refusal with the given status, type, code and message.
    pub fn new(
        status: u16,
        error_type: ErrorType,
        code: impl Into<Cow<'static, str>>,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        Reject {
            status,
            error_type,
            code: code.into(),
            message: message.into(),
            headers: Vec::new(),
        }
    }

    /// 400 `invalid_request_error`.
    pub fn bad_request(
        code: impl Into<Cow<'static, str>>,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        Reject::new(400, ErrorType::InvalidRequest, code, message)
    }

    /// 401 `authentication_error` with a `WWW-Authenticate` challenge (RFC 6750): a missing
    /// credential gets the bare challenge, a refused one adds `error="invalid_token"`.
    pub fn unauthorized(
        code: impl Into<Cow<'static, str>>,
        message: impl Into<Cow<'static, str>>,
        credential_present: bool,
    ) -> Self {
        let challenge = if credential_present {
            "Bearer realm=\"llm-gateway\", error=\"invalid_token\""
        } else {
            "Bearer realm=\"llm-gateway\""
        };
        Reject::new(401, ErrorType::Authentication, code, message)
            .with_header("www-authenticate", challenge)
    }

    /// 403 `permission_error`.
    pub fn forbidden(
        code: impl Into<Cow<'static, str>>,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        Reject::new(403, ErrorType::Permission, code, message)
    }

    /// 404 `not_found_error`.
    pub fn not_found(
        code: impl Into<Cow<'static, str>>,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        Reject::new(404, ErrorType::NotFound, code, message)
    }

    /// 429 `rate_limit_error` with `Retry-After` in whole seconds (at least 1).
    pub fn too_many_requests(
        code: impl Into<Cow<'static, str>>,
        message: impl Into<Cow<'static, str>>,
        retry_after_secs: u64,
    ) -> Self {
        Reject::new(429, ErrorType::RateLimit, code, message)
            .with_header("retry-after", retry_after_secs.max(1).to_string())
    }

    /// 500 `api_error`: the gateway itself failed (a host call, a bad internal state).
    pub fn internal(message: impl Into<Cow<'static, str>>) -> Self {
        Reject::new(500, ErrorType::Api, "gateway_internal_error", message)
    }

    /// Adds a response header.
    #[must_use]
    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// The JSON body: `{"error":{"message":..,"type":..,"code":..}}`.
    pub fn body(&self) -> Vec<u8> {
        let body = Body {
            error: ErrorBody {
                message: &self.message,
                error_type: self.error_type.as_str(),
                code: &self.code,
            },
        };
        // Serializing three strings cannot fail; fall back to a fixed body rather than panic.
        serde_json::to_vec(&body).unwrap_or_else(|_| {
            br#"{"error":{"message":"internal error","type":"api_error","code":"gateway_internal_error"}}"#
                .to_vec()
        })
    }

    /// The error body in `shape`: [`Reject::body`] for OpenAI's; Anthropic's has no `code`.
    pub fn body_in(&self, shape: ErrorShape) -> Vec<u8> {
        match shape {
            ErrorShape::OpenAi => self.body(),
            ErrorShape::Anthropic => anthropic_error_body(self.error_type.as_str(), &self.message),
        }
    }

    /// Every response header of the local reply, `content-type` first.
    pub fn response_headers(&self) -> Vec<(&str, &str)> {
        let mut headers = Vec::with_capacity(1 + self.headers.len());
        headers.push(("content-type", "application/json"));
        headers.extend(self.headers.iter().map(|(n, v)| (*n, v.as_str())));
        headers
    }

    /// Envoy's response code details for the access log (`%RESPONSE_CODE_DETAILS%`): the
    /// plugin name and the code, no spaces.
    pub fn details(&self, plugin: &str) -> String {
        format!("{plugin}.{}", self.code)
    }
}

/// Anthropic's error body, `{"type":"error","error":{"type","message"}}`: a refusal's
/// ([`Reject::body_in`]) and a provider error translated for a Messages client (the router's).
pub fn anthropic_error_body(kind: &str, message: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + message.len());
    out.extend_from_slice(b"{\"type\":\"error\",\"error\":{\"type\":");
    crate::json::push_quoted(&mut out, kind);
    out.extend_from_slice(b",\"message\":");
    crate::json::push_quoted(&mut out, message);
    out.extend_from_slice(b"}}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn parse(body: &[u8]) -> serde_json::Value {
        serde_json::from_slice(body).unwrap()
    }

    #[test]
    fn body_is_openai_shaped() {
        let r = Reject::bad_request("invalid_json", "request body is not \"JSON\"");
        let v = parse(&r.body());
        assert_eq!(r.status, 400);
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "invalid_json");
        assert_eq!(v["error"]["message"], "request body is not \"JSON\"");
        assert_eq!(v.as_object().unwrap().len(), 1);
        assert_eq!(v["error"].as_object().unwrap().len(), 3);
    }

    #[test]
    fn unauthorized_challenges() {
        let missing = Reject::unauthorized("missing_api_key", "no key", false);
        assert_eq!(missing.status, 401);
        assert_eq!(
            missing.response_headers(),
            vec![
                ("content-type", "application/json"),
                ("www-authenticate", "Bearer realm=\"llm-gateway\"")
            ]
        );
        let invalid = Reject::unauthorized("invalid_api_key", "bad key", true);
        assert!(invalid.headers[0].1.contains("error=\"invalid_token\""));
        assert_eq!(
            parse(&invalid.body())["error"]["type"],
            "authentication_error"
        );
    }

    #[test]
    fn retry_after_is_at_least_one_second() {
        let r = Reject::too_many_requests("rate_limit_exceeded", "slow down", 0);
        assert_eq!(r.headers, vec![("retry-after", "1".to_string())]);
        let r = Reject::too_many_requests("rate_limit_exceeded", "slow down", 17);
        assert_eq!(r.headers, vec![("retry-after", "17".to_string())]);
        assert_eq!(r.status, 429);
    }

    #[test]
    fn the_anthropic_shape_has_the_type_and_message() {
        let r = Reject::too_many_requests("rate_limit_exceeded", "slow \"down\"", 3);
        assert_eq!(r.body_in(ErrorShape::OpenAi), r.body());
        let v = parse(&r.body_in(ErrorShape::Anthropic));
        assert_eq!(
            v,
            serde_json::json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow \"down\""}})
        );
    }

    #[test]
    fn details_has_no_spaces() {
        let r = Reject::forbidden("consumer_not_allowed", "not on this route");
        assert_eq!(r.details("key_auth"), "key_auth.consumer_not_allowed");
        assert_eq!(parse(&r.body())["error"]["type"], "permission_error");
    }

    #[test]
    fn control_characters_in_messages_are_escaped() {
        let r = Reject::not_found("model_not_found", "model \"a\nb\" unknown");
        let body = r.body();
        assert!(!body.contains(&b'\n'));
        assert_eq!(parse(&body)["error"]["message"], "model \"a\nb\" unknown");
    }
}
