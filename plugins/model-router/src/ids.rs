//! Logical request ids (`x-llm-request-id`).
//!
//! Budgets and usage are reconciled exactly once per logical request, keyed by this id, so a
//! client must not be able to choose it (a reused id would make a second request look like a
//! retry of the first). The router therefore never copies a client header: it draws 128 bits
//! from a per-VM generator seeded with host randomness and the clock. The id is the same on
//! every attempt because it is set once, before Envoy's retries.

use llm_gateway_shared::json::push_hex;

/// A splitmix64 stream; two ids never repeat within one VM.
#[derive(Debug, Clone)]
pub struct IdSource {
    state: u64,
}

impl IdSource {
    /// A source seeded with `seed` (host randomness) — VMs with different seeds do not collide.
    pub fn new(seed: u64) -> Self {
        IdSource { state: seed }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The next id: 32 lowercase hex digits. `now_nanos` is mixed in so a VM restarted with the
    /// same seed (no host randomness) still does not repeat ids.
    pub fn next_id(&mut self, now_nanos: u64) -> String {
        let high = self.next_u64() ^ now_nanos;
        let low = self.next_u64();
        let mut id = String::with_capacity(32);
        push_hex(&mut id, &high.to_be_bytes());
        push_hex(&mut id, &low.to_be_bytes());
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ids_are_hex_and_distinct() {
        let mut source = IdSource::new(42);
        let ids: HashSet<String> = (0..10_000).map(|_| source.next_id(7)).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids
            .iter()
            .all(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())));
        // another VM (other seed) does not produce the same stream
        let mut other = IdSource::new(43);
        assert!(!ids.contains(&other.next_id(7)));
    }

    #[test]
    fn an_id_is_the_two_words_in_zero_padded_hex() {
        let mut source = IdSource::new(5);
        let mut words = IdSource::new(5);
        for now in [0, 7, u64::MAX, 1 << 40] {
            let high = words.next_u64() ^ now;
            let low = words.next_u64();
            assert_eq!(source.next_id(now), format!("{high:016x}{low:016x}"));
        }
    }
}
