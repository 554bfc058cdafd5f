//! A cheap hasher for maps whose keys come from configuration (the host layer's metric ids by
//! name): SipHash's resistance to chosen keys buys nothing there and costs most of a lookup.

use std::hash::{BuildHasherDefault, Hasher};

/// A multiply-rotate hasher over 8-byte words (the shape of rustc's FxHash). Not for keys a
/// client chooses.
#[derive(Debug, Default, Clone, Copy)]
pub struct WordHasher(u64);

/// An odd 64-bit constant with well-spread bits (2^64 / φ).
const K: u64 = 0x9e37_79b9_7f4a_7c15;

impl WordHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
    }
}

impl Hasher for WordHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            let mut buf = [0u8; 8];
            buf.copy_from_slice(word);
            self.add(u64::from_le_bytes(buf));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut buf = [0u8; 8];
            for (slot, byte) in buf.iter_mut().zip(rest) {
                *slot = *byte;
            }
            // the length tells "ab" from "ab\0"
            self.add(u64::from_le_bytes(buf) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        // fold the well-mixed high half into the low bits the table indexes by
        self.0 ^ (self.0 >> 32)
    }
}

/// A `HashMap` with [`WordHasher`].
pub type WordMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<WordHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn hash(text: &str) -> u64 {
        BuildHasherDefault::<WordHasher>::default().hash_one(text)
    }

    #[test]
    fn equal_keys_hash_alike_and_near_keys_apart() {
        assert_eq!(
            hash("llm_gateway.usage.requests"),
            hash("llm_gateway.usage.requests")
        );
        let names = [
            "",
            "a",
            "b",
            "ab",
            "ab\0",
            "llm_gateway.key_auth.allowed",
            "llm_gateway.key_auth.denied.missing_api_key",
            "llm_gateway.key_auth.denied.invalid_api_key",
            "llm_gateway.usage.tokens.tenant.a.model_group.fast",
            "llm_gateway.usage.tokens.tenant.b.model_group.fast",
        ];
        let hashes: std::collections::HashSet<u64> = names.iter().map(|n| hash(n)).collect();
        assert_eq!(hashes.len(), names.len());
        let mut hasher = WordHasher::default();
        7u32.hash(&mut hasher);
        assert_ne!(hasher.finish(), WordHasher::default().finish());
    }

    #[test]
    fn a_map_finds_what_it_holds() {
        let mut map: WordMap<String, u32> = WordMap::default();
        for i in 0..1000u32 {
            map.insert(format!("llm_gateway.metric.{i}"), i);
        }
        for i in 0..1000u32 {
            assert_eq!(map.get(&format!("llm_gateway.metric.{i}")), Some(&i));
        }
        assert_eq!(map.get("llm_gateway.metric.1000"), None);
    }
}
