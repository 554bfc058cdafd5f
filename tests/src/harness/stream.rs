//! The data of one HTTP stream that the filters' host calls read and write: header maps,
//! the body buffered at each filter, properties and filter state, the local reply asked for.
//! The chain driver ([`super::chain`]) decides *when* each part may be touched; the rules it
//! sets here (which filter may change which header map now) are Envoy's.

use std::collections::HashMap;

/// A header map: lowercase names, byte values, in order (pseudo-headers first).
pub type Headers = Vec<(String, Vec<u8>)>;

/// Headers from string pairs; names are lowercased like Envoy's `LowerCaseString`.
pub fn headers_from(pairs: &[(&str, &str)]) -> Headers {
    let mut out: Headers = pairs
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.as_bytes().to_vec()))
        .collect();
    // Envoy keeps pseudo-headers in front
    out.sort_by_key(|(n, _)| !n.starts_with(':'));
    out
}

/// The first value of `name` as text.
pub fn header_value<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    let name = name.to_ascii_lowercase();
    headers
        .iter()
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| std::str::from_utf8(v).ok())
}

/// Every value of `name` as text.
pub fn header_values<'a>(headers: &'a Headers, name: &str) -> Vec<&'a str> {
    let name = name.to_ascii_lowercase();
    headers
        .iter()
        .filter(|(n, _)| *n == name)
        .filter_map(|(_, v)| std::str::from_utf8(v).ok())
        .collect()
}

/// A property value, encoded as Envoy encodes it on read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Property {
    /// Raw bytes (strings).
    Bytes(Vec<u8>),
    /// An integer: 8 bytes little-endian.
    Int(i64),
}

impl Property {
    /// The bytes a plugin reads.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Property::Bytes(b) => b.clone(),
            Property::Int(i) => i.to_le_bytes().to_vec(),
        }
    }
}

impl From<&str> for Property {
    fn from(s: &str) -> Self {
        Property::Bytes(s.as_bytes().to_vec())
    }
}

impl From<String> for Property {
    fn from(s: String) -> Self {
        Property::Bytes(s.into_bytes())
    }
}

impl From<i64> for Property {
    fn from(i: i64) -> Self {
        Property::Int(i)
    }
}

/// Which direction of the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Request: decoder filters, in chain order.
    Request,
    /// Response: encoder filters, in reverse chain order.
    Response,
}

/// A local reply a filter asked for (`proxy_send_local_response`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalReply {
    /// The filter (chain index) that sent it; `None` for one the harness made (413, 500).
    pub filter: Option<usize>,
    /// Status code.
    pub status: u16,
    /// `%RESPONSE_CODE_DETAILS%`.
    pub details: String,
    /// Extra headers.
    pub headers: Headers,
    /// Body.
    pub body: Vec<u8>,
}

/// What one filter may do to the stream right now.
#[derive(Debug, Clone, Default)]
pub struct FilterAccess {
    /// It may change the request headers (inside its headers callback, or while it holds them).
    pub request_headers_writable: bool,
    /// It may change the response headers.
    pub response_headers_writable: bool,
    /// The request body buffered at this filter (cumulative while it pauses).
    pub request_body: Option<Vec<u8>>,
    /// The response body buffered at this filter.
    pub response_body: Option<Vec<u8>>,
}

/// The data of one stream, shared between the chain driver and the VMs' host calls.
#[derive(Debug, Default)]
pub struct StreamData {
    /// Request headers (`None` before they arrived).
    pub request_headers: Option<Headers>,
    /// Request trailers.
    pub request_trailers: Option<Headers>,
    /// Response headers (`None` before they arrived).
    pub response_headers: Option<Headers>,
    /// Response trailers.
    pub response_trailers: Option<Headers>,
    /// Per filter (chain index): what it may touch now.
    pub access: Vec<FilterAccess>,
    /// Properties the test set (dotted path -> value); `request.*` headers-derived ones are
    /// computed on read.
    pub properties: HashMap<String, Property>,
    /// Filter state written by `proxy_set_property` (`wasm.<dotted path>` -> bytes).
    pub filter_state: HashMap<String, Vec<u8>>,
    /// A local reply asked for and not yet carried out.
    pub pending_local_reply: Option<LocalReply>,
    /// True once response headers went downstream (no local reply possible after).
    pub response_started: bool,
    /// True once the stream was reset (`proxy_close_stream`, or a limit after headers went).
    pub reset: bool,
    /// How many times each filter called the foreign function `clear_route_cache`.
    pub route_cache_cleared: Vec<u32>,
    /// Plugin names per filter, for properties `plugin_name` / `plugin_root_id`.
    pub plugin_names: Vec<(String, String)>,
    /// `response.code_details` (`%RESPONSE_CODE_DETAILS%`): `via_upstream` once the upstream
    /// answered, a local reply's details once one was carried out.
    pub response_code_details: Option<String>,
}

impl StreamData {
    /// The header map of ABI map type `map` (0 request headers, 1 request trailers,
    /// 2 response headers, 3 response trailers).
    pub fn map(&self, map: u32) -> Option<&Headers> {
        match map {
            0 => self.request_headers.as_ref(),
            1 => self.request_trailers.as_ref(),
            2 => self.response_headers.as_ref(),
            3 => self.response_trailers.as_ref(),
            _ => None,
        }
    }

    /// A header map `filter` may change now; `None` if it may not.
    pub fn map_mut(&mut self, map: u32, filter: usize) -> Option<&mut Headers> {
        let access = self.access.get(filter)?;
        match map {
            0 if access.request_headers_writable => self.request_headers.as_mut(),
            1 => self.request_trailers.as_mut(),
            2 if access.response_headers_writable && !self.response_started => {
                self.response_headers.as_mut()
            }
            3 => self.response_trailers.as_mut(),
            _ => None,
        }
    }

    /// The body buffer of `filter` for ABI buffer type 0 (request) or 1 (response).
    pub fn body_mut(&mut self, buffer: u32, filter: usize) -> Option<&mut Vec<u8>> {
        let access = self.access.get_mut(filter)?;
        match buffer {
            0 => access.request_body.as_mut(),
            1 => access.response_body.as_mut(),
            _ => None,
        }
    }

    /// A property as a plugin reads it: the test's properties, then values derived from the
    /// headers (`request.path`, `request.method`, `request.host`, `request.id` from
    /// `x-request-id`, `response.code`), `response.code_details`, then filter state written
    /// by `set_property`.
    pub fn property(&self, path: &str, filter: usize) -> Option<Vec<u8>> {
        if let Some(p) = self.properties.get(path) {
            return Some(p.encode());
        }
        let request = |name: &str| {
            self.request_headers
                .as_ref()
                .and_then(|h| header_value(h, name))
                .map(|v| v.as_bytes().to_vec())
        };
        let derived = match path {
            "request.path" => request(":path"),
            "request.url_path" => request(":path")
                .map(|p| p.split(|b| *b == b'?').next().unwrap_or_default().to_vec()),
            "request.method" => request(":method"),
            "request.host" => request(":authority"),
            "request.scheme" => request(":scheme"),
            "request.id" => request("x-request-id"),
            "response.code" => self
                .response_headers
                .as_ref()
                .and_then(|h| header_value(h, ":status"))
                .and_then(|s| s.parse::<i64>().ok())
                .map(|c| c.to_le_bytes().to_vec()),
            "response.code_details" => self
                .response_code_details
                .as_ref()
                .map(|d| d.as_bytes().to_vec()),
            "plugin_name" => self
                .plugin_names
                .get(filter)
                .map(|(n, _)| n.as_bytes().to_vec()),
            "plugin_root_id" => self
                .plugin_names
                .get(filter)
                .map(|(_, r)| r.as_bytes().to_vec()),
            _ => None,
        };
        derived.or_else(|| self.filter_state.get(&format!("wasm.{path}")).cloned())
    }
}
