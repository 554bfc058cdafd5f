//! A cheap hasher (rustc's FxHash) for maps whose keys a client cannot pick to collide on
//! purpose to any harm (token-ratelimit's maps of context ids, metric names and prices), and
//! for hashing text where SipHash was a visible share of a request's cost (pii-redaction's
//! message fingerprints, see `pii_redaction::request`). Not for maps a client can flood.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// rustc's FxHash: per word, a rotate, an xor and a multiplication.
#[derive(Debug, Default, Clone, Copy)]
pub struct FxHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in chunks.by_ref() {
            self.add(chunk.try_into().map_or(0, u64::from_le_bytes));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            for (to, from) in word.iter_mut().zip(rest) {
                *to = *from;
            }
            self.add(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
}

/// The FxHash of a byte string, its length first (FxHash pads the last word with zeros, so
/// without it texts differing only in zero bytes at the end would hash alike).
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut hasher = FxHasher::default();
    hasher.write_usize(bytes.len());
    hasher.write(bytes);
    hasher.finish()
}

/// A `HashMap` with [`FxHasher`].
pub type FxHashMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;
/// A `HashSet` with [`FxHasher`].
pub type FxHashSet<K> = HashSet<K, BuildHasherDefault<FxHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn byte_strings_differing_in_trailing_zero_bytes_hash_apart() {
        assert_ne!(hash_bytes(b"a"), hash_bytes(b"a\0"));
        assert_ne!(hash_bytes(b""), hash_bytes(&[0; 8]));
        let owned = String::from("same text");
        assert_eq!(hash_bytes(b"same text"), hash_bytes(owned.as_bytes()));
    }

    #[test]
    fn distinct_keys_hash_apart_and_equal_ones_alike() {
        let build = BuildHasherDefault::<FxHasher>::default();
        let names = [
            "admitted",
            "admitted.",
            "rate_limited.key-rpm",
            "rate_limited.key-tpm",
            "",
        ];
        let hashes: Vec<u64> = names.iter().map(|n| build.hash_one(n)).collect();
        for (i, a) in hashes.iter().enumerate() {
            for b in hashes.iter().skip(i + 1) {
                assert_ne!(a, b);
            }
        }
        assert_eq!(
            build.hash_one("admitted"),
            build.hash_one(String::from("admitted"))
        );
        let mut map: FxHashMap<u32, u32> = FxHashMap::default();
        for ctx in 0..1000 {
            map.insert(ctx, ctx * 2);
        }
        assert!((0..1000).all(|ctx| map.get(&ctx) == Some(&(ctx * 2))));
    }
}
