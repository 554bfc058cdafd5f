//! The attribution record: one per logical request, published as Envoy filter state, as a
//! JSON log line, and (Higress builds) appended to the Redis stream ledger. The record's types
//! live in the shared crate ([`llm_gateway_shared::usage_record`]), where token-ratelimit reads
//! them too; this module re-exports them and keeps what only this plugin does with them.

pub use llm_gateway_shared::usage_record::*;

/// A client-supplied attribution value as it may be recorded: at most 128 bytes, no control
/// characters (a log line stays one line; JSON escaping does the rest).
pub fn clean_attribution(value: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(value);
    let mut out: String = text.chars().filter(|c| !c.is_control()).collect();
    if out.len() > 128 {
        let mut cut = 128;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribution_values_are_bounded() {
        assert_eq!(clean_attribution(b""), None);
        assert_eq!(clean_attribution(b"a\r\nb"), Some("ab".into()));
        assert_eq!(clean_attribution(&[b'x'; 500]).unwrap().len(), 128);
        assert_eq!(
            clean_attribution("é".repeat(100).as_bytes()).unwrap().len(),
            128
        );
    }
}
