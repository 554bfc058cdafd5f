//! Higress's AI-route fallback as the host does it: Envoy's `custom_response` filter (inserted
//! first in the chain, so it sees the response headers after every wasm filter) with a
//! redirect policy that re-enters the whole chain as a **new stream** when the upstream's
//! status matches (higress-console's `envoyfilter-route-fallback.yaml`:
//! `use_original_request_body`, `max_internal_redirects: 10`, `request_headers_to_add`
//! `x-higress-fallback-from: <route>`). What the new stream gets, as read in
//! `higress-group/envoy` (`conn_manager_impl.cc`, `recreateStream`; `redirect_policy.cc`):
//!
//! - the request headers **as the filters of the first pass left them** (the same header
//!   map is decoded again), plus the policy's headers (`append: false`: replacing), without
//!   `content-length` (upstream's `RedirectPolicy` removes it; Higress's variant unverified);
//! - the **original** request body (`use_original_request_body`);
//! - new context ids and empty filter state: what `set_property` wrote in the first pass is
//!   gone (a policy header may copy one value over, as `%FILTER_STATE(key:PLAIN)%` does);
//! - the first stream ends (`proxy_on_log`, `proxy_on_done`, `proxy_on_delete`) before the
//!   new one starts, with `response.code_details` = `internal_redirect` (as on Envoy 1.36.4);
//!   its response body never reaches the client.
//!
//! Higress's `use_original_request_uri` ([`InternalRedirect::with_original_request_uri`]):
//! the new stream's path and host are `x-envoy-original-path` / `x-envoy-original-host` of
//! that map when set, else the map's own `:path` / `:authority` — as the filters left them
//! (`redirect_policy.cc`, `encodeHeaders`, under `#if defined(HIGRESS)`; Higress's own ai-proxy
//! writes `x-envoy-original-path` before it changes `:path`, `util.OverwriteRequestPath`).
//!
//! Not modelled: a redirect of a local reply (`only_redirect_upstream_code: false` would also
//! redirect those), route matching (the test sets the next pass's properties, e.g. the
//! fallback route's `route_name`).

use super::stream::{Headers, Property};

/// A value of a header the redirect adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedirectValue {
    /// A fixed string.
    Text(String),
    /// `%FILTER_STATE(<key>:PLAIN)%` of the first pass (e.g. `wasm.llm_usage`); a key not
    /// set gives an empty value, and Envoy then adds no header (`keep_empty_value: false`).
    FilterState(String),
}

/// The redirect policy of a route.
#[derive(Debug, Clone)]
pub struct InternalRedirect {
    /// Upstream response statuses that trigger it.
    pub statuses: Vec<u16>,
    /// Request headers added to the new stream (replacing any of the same name).
    pub headers: Vec<(String, RedirectValue)>,
    /// Properties of the new stream (the fallback route's `route_name`, …), over the
    /// first request's.
    pub properties: Vec<(String, Property)>,
    /// How many times a request may be redirected (Higress's console writes 10).
    pub max_internal_redirects: u32,
    /// A first-pass filter state key that must be set (non-empty) for the redirect to fire:
    /// the matcher's `FilterStateInput` predicate ANDed with the status (the model router's
    /// `wasm.llm_route_next`, set only while a later deployment exists).
    pub when_filter_state: Option<String>,
    /// Higress's `use_original_request_uri`: `:path` and `:authority` from
    /// `x-envoy-original-path` / `x-envoy-original-host` when the first pass's map has them.
    pub use_original_request_uri: bool,
}

impl InternalRedirect {
    /// A policy for these upstream statuses, adding no header, at most 10 redirects.
    pub fn on_statuses(statuses: &[u16]) -> InternalRedirect {
        InternalRedirect {
            statuses: statuses.to_vec(),
            headers: Vec::new(),
            properties: Vec::new(),
            max_internal_redirects: 10,
            when_filter_state: None,
            use_original_request_uri: false,
        }
    }

    /// The llm-gateway's policy (`envoy-config/gateway-1.36.yaml`, `higress/route-envoyfilter.yaml`):
    /// 429 and 5xx, only while the router's continuation is set, handing key-auth's ticket and
    /// the router's continuation to the next pass.
    pub fn llm_gateway(max_internal_redirects: u32) -> InternalRedirect {
        let mut statuses: Vec<u16> = (500..600).collect();
        statuses.push(429);
        let mut policy = InternalRedirect::on_statuses(&statuses)
            .header_from_filter_state("x-llm-reentry", "wasm.llm_reentry")
            .header_from_filter_state("x-llm-route-next", "wasm.llm_route_next");
        policy.max_internal_redirects = max_internal_redirects;
        policy.when_filter_state = Some("wasm.llm_route_next".into());
        policy
    }

    /// Higress's console policy for a route: 4xx and 5xx, adding
    /// `x-higress-fallback-from: <route>`.
    pub fn higress_fallback(route: &str) -> InternalRedirect {
        let statuses: Vec<u16> = (400..600).collect();
        InternalRedirect::on_statuses(&statuses).header("x-higress-fallback-from", route)
    }

    /// With Higress's `use_original_request_uri: true` (`higress/route-envoyfilter.yaml`,
    /// Higress's console): the new stream's `:path` is the first pass's
    /// `x-envoy-original-path` and its `:authority` its `x-envoy-original-host`, each only
    /// when set and non-empty; otherwise they stay as the filters left them.
    pub fn with_original_request_uri(mut self) -> Self {
        self.use_original_request_uri = true;
        self
    }

    /// Adds a header with a fixed value.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((
            name.to_ascii_lowercase(),
            RedirectValue::Text(value.to_string()),
        ));
        self
    }

    /// Adds a header whose value is the first pass's filter state `key`
    /// (`%FILTER_STATE(key:PLAIN)%`).
    pub fn header_from_filter_state(mut self, name: &str, key: &str) -> Self {
        self.headers.push((
            name.to_ascii_lowercase(),
            RedirectValue::FilterState(key.to_string()),
        ));
        self
    }

    /// Sets a property of the redirected stream.
    pub fn property(mut self, path: &str, value: impl Into<Property>) -> Self {
        self.properties.push((path.to_string(), value.into()));
        self
    }

    /// True when a response with this status is redirected.
    pub fn matches(&self, status: u16) -> bool {
        self.statuses.contains(&status)
    }

    /// True when a response with this status, after a first pass with this filter state, is
    /// redirected.
    pub fn fires(&self, status: u16, filter_state: impl Fn(&str) -> Option<Vec<u8>>) -> bool {
        self.matches(status)
            && self
                .when_filter_state
                .as_deref()
                .is_none_or(|key| filter_state(key).is_some_and(|v| !v.is_empty()))
    }

    /// The new stream's request headers: `headers` as the first pass left them, without
    /// `content-length`, with the policy's headers set; `filter_state` reads the first pass's.
    pub fn next_headers(
        &self,
        headers: &Headers,
        filter_state: impl Fn(&str) -> Option<Vec<u8>>,
    ) -> Headers {
        let mut out: Headers = headers
            .iter()
            .filter(|(n, _)| n != "content-length")
            .cloned()
            .collect();
        if self.use_original_request_uri {
            for (original, pseudo) in [
                ("x-envoy-original-path", ":path"),
                ("x-envoy-original-host", ":authority"),
            ] {
                let value = super::stream::header_value(headers, original)
                    .filter(|v| !v.is_empty())
                    .map(|v| v.as_bytes().to_vec());
                if let Some(value) = value {
                    for (name, current) in out.iter_mut() {
                        if name == pseudo {
                            *current = value.clone();
                        }
                    }
                }
            }
        }
        for (name, value) in &self.headers {
            let value = match value {
                RedirectValue::Text(text) => text.clone().into_bytes(),
                RedirectValue::FilterState(key) => filter_state(key).unwrap_or_default(),
            };
            out.retain(|(n, _)| n != name);
            if !value.is_empty() {
                out.push((name.clone(), value));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_headers_keep_the_mutated_map_and_set_the_policys() {
        let policy = InternalRedirect::higress_fallback("ai-route-a.internal")
            .header_from_filter_state("x-prev", "wasm.llm_route")
            .header_from_filter_state("x-missing", "wasm.nothing");
        let headers: Headers = vec![
            (":path".into(), b"/v1/chat/completions".to_vec()),
            ("content-length".into(), b"12".to_vec()),
            ("x-higress-fallback-from".into(), b"old".to_vec()),
            ("authorization".into(), b"Bearer provider".to_vec()),
        ];
        let next = policy.next_headers(&headers, |key| {
            (key == "wasm.llm_route").then(|| b"openai-mini".to_vec())
        });
        assert_eq!(
            next,
            vec![
                (":path".to_string(), b"/v1/chat/completions".to_vec()),
                ("authorization".to_string(), b"Bearer provider".to_vec()),
                (
                    "x-higress-fallback-from".to_string(),
                    b"ai-route-a.internal".to_vec()
                ),
                ("x-prev".to_string(), b"openai-mini".to_vec()),
            ]
        );
        assert!(policy.matches(503) && policy.matches(429) && !policy.matches(200));
    }

    #[test]
    fn the_original_uri_is_the_envoy_original_path_when_a_filter_wrote_one() {
        let edited: Headers = vec![
            (":path".into(), b"/v1/messages".to_vec()),
            (":authority".into(), b"gateway.test".to_vec()),
        ];
        let policy = InternalRedirect::on_statuses(&[429]).with_original_request_uri();
        // nothing wrote x-envoy-original-path: the path as the filters left it
        assert_eq!(policy.next_headers(&edited, |_| None), edited);
        let mut noted = edited.clone();
        noted.push((
            "x-envoy-original-path".into(),
            b"/v1/chat/completions".to_vec(),
        ));
        let next = policy.next_headers(&noted, |_| None);
        assert_eq!(
            super::super::stream::header_value(&next, ":path"),
            Some("/v1/chat/completions")
        );
        assert_eq!(
            super::super::stream::header_value(&next, ":authority"),
            Some("gateway.test")
        );
        // without the option the edited path stays
        let plain = InternalRedirect::on_statuses(&[429]);
        assert_eq!(
            super::super::stream::header_value(&plain.next_headers(&noted, |_| None), ":path"),
            Some("/v1/messages")
        );
    }
}
