//! What the mock keeps of the requests it receives, and how large one may be.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;

/// How many requests [`MockUpstream::requests`] keeps (the oldest are dropped first).
pub const MAX_RECORDED_REQUESTS: usize = 10_000;

/// Largest request body accepted (64 MiB); larger ones get `413`.
pub const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// One request as the mock received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// `GET`, `POST`, …
    pub method: String,
    /// Path and query, as received (`/v1/chat/completions?x=1`).
    pub path: String,
    /// Header names are lowercase; values are decoded as lossy UTF-8. In received order.
    pub headers: Vec<(String, String)>,
    /// The full request body.
    pub body: Bytes,
}

impl RecordedRequest {
    /// The value of the first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body parsed as JSON, if it is JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

pub(crate) struct Recorder {
    requests: Mutex<VecDeque<RecordedRequest>>,
}

impl Recorder {
    pub(crate) fn new() -> Recorder {
        Recorder {
            requests: Mutex::new(VecDeque::new()),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, VecDeque<RecordedRequest>> {
        // A panic while holding this lock cannot leave the deque inconsistent: ignore poison.
        self.requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn push(&self, request: RecordedRequest) {
        let mut requests = self.lock();
        if requests.len() >= MAX_RECORDED_REQUESTS {
            requests.pop_front();
        }
        requests.push_back(request);
    }
}
