//! Helpers both providers' checks read a body with.

use serde_json::{Map, Value};

/// The field `key` of `obj`, `None` when absent or `null` (both providers take an optional
/// field's `null` as its absence).
pub(super) fn field<'v>(obj: &'v Map<String, Value>, key: &str) -> Option<&'v Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// `^[a-zA-Z0-9_-]{1,max}$`
pub(super) fn is_tool_name(name: &str, max: usize) -> bool {
    (1..=max).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}
