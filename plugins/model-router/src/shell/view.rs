//! What the core reads: the request through the host ([`HostView`]) or through the fused
//! filter's exchange ([`FusedView`]), and Envoy's shared data ([`HostStore`]).

use crate::core::{Input, ReadError, Store, StoreError, View};
use llm_gateway_shared::chain;
use llm_gateway_shared::host::{self, Buffer, HeaderMap, HostError};
use llm_gateway_shared::request::RequestHead;
use llm_gateway_shared::wire::EncodedHeaders;
use std::cell::OnceCell;

/// The current request through the host, for one callback. In a request callback the first
/// read of a request header takes the whole map in one host call and the callback's later
/// reads are answered from it: each value the host returns is an allocation it makes in the
/// VM, so a header read alone costs it about as much as a small map, and the router reads
/// several there (path, method, authority; the caller's groups and subject and the body's
/// framing). The core's writes are carried out after its callback returns, so within one
/// callback the map is what a read of its own would return. Response callbacks read one or
/// two headers (and a request header that is mostly absent, which costs the host little):
/// one call per read there.
pub(super) struct HostView {
    /// Request headers are read as one map.
    whole_request: bool,
    request: OnceCell<Option<EncodedHeaders>>,
}

impl HostView {
    pub(super) fn new(input: &Input) -> HostView {
        HostView {
            whole_request: matches!(
                input,
                Input::RequestHeaders { .. } | Input::RequestBody { .. }
            ),
            request: OnceCell::new(),
        }
    }
}

impl View for HostView {
    fn request_header(&self, name: &str) -> Result<Option<Vec<u8>>, ReadError> {
        if !self.whole_request {
            return host::header(HeaderMap::RequestHeaders, name).map_err(|_| ReadError);
        }
        let map = self
            .request
            .get_or_init(|| host::header_view(HeaderMap::RequestHeaders).ok())
            .as_ref()
            .ok_or(ReadError)?;
        Ok(map.get(name).map(<[u8]>::to_vec))
    }

    fn request_headers(&self) -> Result<RequestHead, ReadError> {
        match self.request.get() {
            Some(Some(map)) => Ok(RequestHead::encoded(map.clone())),
            _ => host::request_head().map_err(|_| ReadError),
        }
    }

    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        host::header(HeaderMap::ResponseHeaders, name)
            .ok()
            .flatten()
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        host::property(path).ok().flatten()
    }

    fn request_body(&self, size: usize) -> Result<Vec<u8>, ReadError> {
        host::buffer(Buffer::RequestBody, 0, size).map_err(|_| ReadError)
    }

    fn response_body(&self, size: usize) -> Option<Vec<u8>> {
        host::buffer(Buffer::ResponseBody, 0, size).ok()
    }

    fn route_name(&self) -> String {
        host::route_name()
    }

    fn cluster_name(&self) -> String {
        host::cluster_name()
    }

    fn now_nanos(&self) -> u64 {
        host::time_nanos()
    }
}

/// Envoy's shared data.
pub(super) struct HostStore;

impl Store for HostStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), StoreError> {
        host::shared_data(key).map_err(|_| StoreError::Unavailable)
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        host::set_shared_data(key, value, cas).map_err(|err| match err {
            HostError::CasMismatch => StoreError::CasMismatch,
            _ => StoreError::Unavailable,
        })
    }
}

/// The fused exchange as the core's [`View`]: headers and bodies from memory, the rest from
/// the host.
pub(super) struct FusedView<'a>(pub(super) &'a chain::Exchange);

impl View for FusedView<'_> {
    fn request_header(&self, name: &str) -> Result<Option<Vec<u8>>, ReadError> {
        Ok(self.0.request.get(name).map(<[u8]>::to_vec))
    }

    fn request_headers(&self) -> Result<RequestHead, ReadError> {
        Ok(RequestHead::shared(self.0.request.shared()))
    }

    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        self.0.response.get(name).map(<[u8]>::to_vec)
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        match path {
            // read once per callback for every stage
            ["response", "code_details"] => self
                .0
                .code_details(host::code_details)
                .map(|details| details.as_bytes().to_vec()),
            _ => host::property(path).ok().flatten(),
        }
    }

    fn request_body(&self, size: usize) -> Result<Vec<u8>, ReadError> {
        Ok(self.0.data.get(..size).unwrap_or(&self.0.data).to_vec())
    }

    fn response_body(&self, size: usize) -> Option<Vec<u8>> {
        Some(self.0.data.get(..size).unwrap_or(&self.0.data).to_vec())
    }

    fn with_response_body(&self, size: usize, f: &mut dyn FnMut(&[u8])) {
        f(self.0.data.get(..size).unwrap_or(&self.0.data));
    }

    fn route_name(&self) -> String {
        host::route_name()
    }

    fn cluster_name(&self) -> String {
        host::cluster_name()
    }

    fn now_nanos(&self) -> u64 {
        host::clock(self.0)
    }
}
