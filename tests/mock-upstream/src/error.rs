//! Refusals: one error type for every route and flavor, serialized in the provider's shape in
//! one place ([`ApiError::to_json`]).

use hyper::StatusCode;

use crate::json::push_str_lit;
use crate::knobs::KnobError;

/// How an error body is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// `{"error":{"message":..,"type":..,"param":..,"code":..}}` (`param` and `code` may be
    /// `null`): OpenAI, and every error of the `Any` flavor.
    Openai,
    /// `{"type":"error","error":{"type":..,"message":..},"request_id":..}`, the type given by
    /// the status ([`anthropic_type`]).
    Anthropic,
}

/// An error answer.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    /// OpenAI's `error.type` (Anthropic's comes from the status).
    pub(crate) kind: &'static str,
    pub(crate) code: Option<String>,
    pub(crate) param: Option<String>,
    /// Azure's own refusals (wrong path, missing `api-version`, missing `api-key`) are
    /// `{"error":{"code":"<status>","message":..}}` rather than OpenAI's shape.
    pub(crate) azure_gateway: bool,
}

impl ApiError {
    /// A `400 invalid_request_error` with `code: "invalid_request"` (the `Any` flavor's own
    /// refusals, and the knobs').
    pub(crate) fn invalid(message: &str, param: Option<&str>) -> ApiError {
        ApiError::bad_request(message.to_owned(), param, Some("invalid_request"))
    }

    /// A `400 invalid_request_error` with the given `param` and `code`.
    pub(crate) fn bad_request(
        message: String,
        param: Option<&str>,
        code: Option<&str>,
    ) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message,
            kind: "invalid_request_error",
            code: code.map(str::to_owned),
            param: param.map(str::to_owned),
            azure_gateway: false,
        }
    }

    /// An error of `status` with OpenAI's `type` and `code`.
    pub(crate) fn new(status: StatusCode, message: String, kind: &'static str) -> ApiError {
        ApiError {
            status,
            message,
            kind,
            code: None,
            param: None,
            azure_gateway: false,
        }
    }

    /// Azure's own `{"error":{"code":"<status>","message":..}}`.
    pub(crate) fn azure(status: StatusCode, message: &str) -> ApiError {
        ApiError {
            azure_gateway: true,
            ..ApiError::new(status, message.to_owned(), "invalid_request_error")
        }
    }

    /// The body in `dialect`; `request_id` goes into Anthropic's.
    pub(crate) fn to_json(&self, dialect: Dialect, request_id: &str) -> String {
        let mut b = String::with_capacity(128 + self.message.len());
        if self.azure_gateway && dialect == Dialect::Openai {
            b.push_str(r#"{"error":{"code":""#);
            b.push_str(self.status.as_str());
            b.push_str(r#"","message":"#);
            push_str_lit(&mut b, &self.message);
            b.push_str("}}");
            return b;
        }
        match dialect {
            Dialect::Openai => {
                b.push_str(r#"{"error":{"message":"#);
                push_str_lit(&mut b, &self.message);
                b.push_str(r#","type":"#);
                push_str_lit(&mut b, self.kind);
                b.push_str(r#","param":"#);
                push_opt_lit(&mut b, self.param.as_deref());
                b.push_str(r#","code":"#);
                push_opt_lit(&mut b, self.code.as_deref());
                b.push_str("}}");
            }
            Dialect::Anthropic => {
                b.push_str(r#"{"type":"error","error":{"type":"#);
                push_str_lit(&mut b, anthropic_type(self.status));
                b.push_str(r#","message":"#);
                push_str_lit(&mut b, &self.message);
                b.push_str(r#"},"request_id":"#);
                push_str_lit(&mut b, request_id);
                b.push('}');
            }
        }
        b
    }
}

fn push_opt_lit(b: &mut String, s: Option<&str>) {
    match s {
        Some(s) => push_str_lit(b, s),
        None => b.push_str("null"),
    }
}

/// Anthropic's `error.type` for a status, as its API documents them.
pub(crate) fn anthropic_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

impl From<KnobError> for ApiError {
    fn from(e: KnobError) -> ApiError {
        ApiError::invalid(
            &format!("invalid {} header: expected {}", e.knob, e.expected),
            Some(e.knob),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn parse(s: &str) -> Value {
        serde_json::from_str(s).expect("json")
    }

    #[test]
    fn openai_shape() {
        let e = ApiError::invalid("bad \"x\"", Some("x"));
        assert_eq!(
            parse(&e.to_json(Dialect::Openai, "")),
            json!({"error": {"message": "bad \"x\"", "type": "invalid_request_error", "param": "x", "code": "invalid_request"}})
        );
        let e = ApiError::bad_request("no".into(), None, None);
        assert_eq!(
            parse(&e.to_json(Dialect::Openai, "")),
            json!({"error": {"message": "no", "type": "invalid_request_error", "param": null, "code": null}})
        );
    }

    #[test]
    fn anthropic_shape_takes_its_type_from_the_status() {
        for (status, kind) in [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (413, "request_too_large"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (529, "overloaded_error"),
        ] {
            let status = StatusCode::from_u16(status).expect("status");
            let e = ApiError::new(status, "m".into(), "mock_error");
            assert_eq!(
                parse(&e.to_json(Dialect::Anthropic, "req_1")),
                json!({"type": "error", "error": {"type": kind, "message": "m"}, "request_id": "req_1"})
            );
        }
    }

    #[test]
    fn azure_gateway_shape() {
        let e = ApiError::azure(StatusCode::NOT_FOUND, "Resource not found");
        assert_eq!(
            parse(&e.to_json(Dialect::Openai, "")),
            json!({"error": {"code": "404", "message": "Resource not found"}})
        );
    }
}
