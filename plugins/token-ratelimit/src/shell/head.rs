//! The request headers the core reads ([`Head`]).

use crate::budget::{self, Identity};
use crate::core::Head;
use llm_gateway_shared::headers;
use llm_gateway_shared::host::{self, HeaderMap};

/// The request headers the core reads, from one read of the whole map (about ten names,
/// most of them present); one read per name if that fails. `counts_ip`: some limit counts
/// per client address (else `source.address` is not read).
pub(super) fn read_request_head(counts_ip: bool) -> Head {
    let text = |v: &str| Some(v.to_string()).filter(|v| !v.is_empty());
    match host::header_view(HeaderMap::RequestHeaders) {
        Ok(headers) => read_head(counts_ip, |name| headers.text(name).and_then(text)),
        Err(_) => read_head(counts_ip, |name| {
            let value = host::header(HeaderMap::RequestHeaders, name).ok().flatten();
            value
                .and_then(|v| String::from_utf8(v).ok())
                .and_then(|v| text(&v))
        }),
    }
}

/// The request headers the core reads; the client address only if `counts_ip` (only a limit
/// by `ip` keys on it).
pub(super) fn read_head(counts_ip: bool, header: impl Fn(&str) -> Option<String>) -> Head {
    let ip = counts_ip
        .then(|| host::property_string(&["source", "address"]).ok().flatten())
        .flatten()
        .map(|a| budget::strip_port(&a).to_string());
    let identity = Identity {
        key: header(headers::KEY_ID),
        consumer: header(headers::CONSUMER),
        tenant: header(headers::TENANT),
        model_group: header(headers::MODEL_GROUP),
        ip,
        user: header("x-user-id"),
        tier: header(headers::TIER),
    };
    let logical_id = header(headers::REQUEST_ID);
    let stream_id = match logical_id {
        Some(_) => None,
        None => host::property_string(&["request", "id"]).ok().flatten(),
    };
    Head {
        identity,
        logical_id,
        stream_id,
        path: header(":path").unwrap_or_default(),
        reentry: header(headers::REENTRY).is_some(),
        framed: header("content-length").is_some(),
    }
}
