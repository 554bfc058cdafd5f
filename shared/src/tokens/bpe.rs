//! Counting tiktoken BPE tokens: the rank data embedded in the module, an index over it built
//! once per VM, and tiktoken's merge loop reduced to counting.
//!
//! Rank data: `data/<encoding>.ranks`, generated from tiktoken-rs's ranks (OpenAI's
//! `o200k_base` / `cl100k_base`, MIT) and checked against them by `tests/token_data.rs`.
//! Format: for rank 0, 1, 2, … in order, one byte `n` (1..=255, the token's length) followed by
//! the token's `n` bytes; nothing else (o200k_base: 199 998 ranks, 1.6 MB; cl100k_base:
//! 100 256 ranks, 0.8 MB).
//!
//! Index: an open-addressing hash table (linear probing, at most half full) of `u64` slots,
//! each holding a token's offset in the data, its rank, its length and 12 bits of its hash, so
//! a probe touches the data only when length and hash bits agree. Built on first use from the
//! embedded data (4 MiB for o200k_base, 2 MiB for cl100k_base); lookups allocate nothing.
//!
//! Counting a piece of the split text: one lookup of the whole piece (most pieces of prose are
//! one token); otherwise tiktoken's byte-pair merge — repeatedly merge the adjacent pair of
//! parts whose concatenation has the lowest rank, the leftmost of equal ones — until no pair
//! is a token, and count the parts. Pieces up to [`SMALL_PIECE`] bytes merge in a stack array
//! (tiktoken's linear scan); longer ones with a heap (tiktoken's `_byte_pair_merge_large`),
//! and pieces over [`MAX_PIECE`] bytes, which text never has but a hostile body may, are
//! counted in [`MAX_PIECE`]-byte parts so that the scratch memory stays bounded. The counts
//! of stack-array merges are kept in a per-thread (per-VM) [`Memo`], so a word seen before is
//! not merged again.

use super::encoding::Encoding;
use super::split::{piece_ranges, Pattern};
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::OnceLock;

static O200K_DATA: &[u8] = include_bytes!("../../data/o200k_base.ranks");
static CL100K_DATA: &[u8] = include_bytes!("../../data/cl100k_base.ranks");

/// Pieces up to this many bytes merge in a stack array.
const SMALL_PIECE: usize = 32;
/// Longest piece merged as one (longer ones: in parts of this size); bounds the scratch memory.
const MAX_PIECE: usize = 16 * 1024;
/// No rank (not a token).
const NONE: u32 = u32::MAX;

const OFFSET_BITS: u32 = 24;
const RANK_BITS: u32 = 20;
const LEN_SHIFT: u32 = OFFSET_BITS + RANK_BITS;
const TAG_SHIFT: u32 = LEN_SHIFT + 8;
const TAG_MASK: u64 = 0xFFF;
/// The bits of a slot that a probe compares first: tag and length.
const KEY_MASK: u64 = !0 << LEN_SHIFT;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;

/// The ranks of one encoding: the embedded data and its index.
pub(super) struct Ranks {
    data: &'static [u8],
    /// `0` = empty, else `tag << 52 | len << 44 | (rank + 1) << 24 | offset`.
    slots: Vec<u64>,
    /// `64 - log2(slots.len())`: the hash's top bits pick the first slot.
    shift: u32,
}

impl std::fmt::Debug for Ranks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ranks")
            .field("data_bytes", &self.data.len())
            .field("slots", &self.slots.len())
            .finish()
    }
}

const K: u64 = 0x9E37_79B9_7F4A_7C15;

/// The first 8 bytes of `bytes`, little-endian (`bytes` has at least 8).
#[inline(always)]
fn word(bytes: &[u8]) -> u64 {
    bytes
        .first_chunk::<8>()
        .map_or(0, |word| u64::from_le_bytes(*word))
}

/// Up to 8 bytes, little-endian, zero-extended; in at most three loads.
#[inline(always)]
fn short_word(bytes: &[u8]) -> u64 {
    if bytes.len() >= 8 {
        return word(bytes);
    }
    let mut value = 0u64;
    let mut rest = bytes;
    let mut shift = 0;
    if let Some((four, tail)) = rest.split_first_chunk::<4>() {
        value = u64::from(u32::from_le_bytes(*four));
        (rest, shift) = (tail, 32);
    }
    if let Some((two, tail)) = rest.split_first_chunk::<2>() {
        value |= u64::from(u16::from_le_bytes(*two)) << shift;
        (rest, shift) = (tail, shift + 16);
    }
    if let Some(&one) = rest.first() {
        value |= u64::from(one) << shift;
    }
    value
}

/// The `len` bytes of `bytes` from `start`, up to 8 of them, as a little-endian word,
/// zero-extended. Reads a whole word where there is one (one load, masked).
#[inline(always)]
fn first_word(bytes: &[u8], start: usize, len: usize) -> u64 {
    match bytes.get(start..start.wrapping_add(8)) {
        Some(word) if len < 8 => self::word(word) & ((1u64 << (len * 8)) - 1),
        Some(word) => self::word(word),
        None => first_word_near_end(bytes, start, len),
    }
}

/// [`first_word`] within the last 8 bytes of `bytes`.
#[cold]
#[inline(never)]
fn first_word_near_end(bytes: &[u8], start: usize, len: usize) -> u64 {
    short_word(bytes.get(start..start + len.min(8)).unwrap_or_default())
}

/// murmur3's `fmix64`, shortened.
#[inline(always)]
fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h ^ (h >> 33)
}

/// The hash of a key of up to 8 bytes, from its [`first_word`].
#[inline(always)]
fn hash_short(word: u64, len: usize) -> u64 {
    mix(word.wrapping_add(len as u64).wrapping_mul(K))
}

/// The hash of a key of 9 to 16 bytes, from the [`first_word`]s of its two halves.
#[inline(always)]
fn hash_medium(first: u64, second: u64, len: usize) -> u64 {
    mix((first
        .wrapping_add(len as u64)
        .wrapping_mul(K)
        .rotate_left(26)
        ^ second)
        .wrapping_mul(K))
}

/// The hash of a key of more than 16 bytes (FxHash-style over its words).
fn hash_long(bytes: &[u8]) -> u64 {
    let mut h = (bytes.len() as u64).wrapping_mul(K);
    let mut rest = bytes;
    while let Some((head, tail)) = rest.split_first_chunk::<8>() {
        if tail.is_empty() {
            break;
        }
        h = (h ^ u64::from_le_bytes(*head))
            .wrapping_mul(K)
            .rotate_left(26);
        rest = tail;
    }
    mix((h ^ short_word(rest)).wrapping_mul(K))
}

/// The hash of a key.
fn hash(bytes: &[u8]) -> u64 {
    let len = bytes.len();
    match len {
        0..=8 => hash_short(short_word(bytes), len),
        9..=16 => hash_medium(first_word(bytes, 0, 8), first_word(bytes, 8, len - 8), len),
        _ => hash_long(bytes),
    }
}

/// `a == b` for slices of equal length, a word at a time.
fn same_bytes(mut a: &[u8], mut b: &[u8]) -> bool {
    while let (Some((x, a_tail)), Some((y, b_tail))) =
        (a.split_first_chunk::<8>(), b.split_first_chunk::<8>())
    {
        if x != y {
            return false;
        }
        (a, b) = (a_tail, b_tail);
    }
    a == b
}

impl Ranks {
    /// Indexes rank data in the format above; `None` if it is malformed or too large for the
    /// slot layout.
    pub(super) fn new(data: &'static [u8]) -> Option<Ranks> {
        if data.len() >= 1 << OFFSET_BITS {
            return None;
        }
        // first pass: count, and check the framing
        let mut count = 0usize;
        let mut pos = 0usize;
        while pos < data.len() {
            let len = usize::from(*data.get(pos)?);
            if len == 0 || pos + 1 + len > data.len() {
                return None;
            }
            pos += 1 + len;
            count += 1;
        }
        if count == 0 || count >= (1 << RANK_BITS) - 1 {
            return None;
        }
        let size = (2 * count).next_power_of_two();
        let mut ranks = Ranks {
            data,
            slots: vec![0; size],
            shift: 64 - size.trailing_zeros(),
        };
        let mask = size - 1;
        let mut pos = 0usize;
        for rank in 0..count as u64 {
            let len = *data.get(pos)?;
            let offset = pos + 1;
            let token = data.get(offset..offset + usize::from(len))?;
            let h = hash(token);
            let slot = (h & TAG_MASK) << TAG_SHIFT
                | u64::from(len) << LEN_SHIFT
                | (rank + 1) << OFFSET_BITS
                | offset as u64;
            let mut i = (h >> ranks.shift) as usize;
            loop {
                let entry = ranks.slots.get_mut(i)?;
                if *entry == 0 {
                    *entry = slot;
                    break;
                }
                i = (i + 1) & mask;
            }
            pos = offset + usize::from(len);
        }
        Some(ranks)
    }

    /// The rank of the token `bytes`, if it is one.
    #[cfg(test)]
    fn rank(&self, bytes: &[u8]) -> Option<u32> {
        Some(self.rank_in(bytes, 0, bytes.len())).filter(|&rank| rank != NONE)
    }

    /// The rank of `text[start..end]`, [`NONE`] if those bytes are no token. (Ranks are
    /// returned as `u32`, not `Option`, on this hot path: wasm returns an `Option` through
    /// memory.)
    #[inline(always)]
    fn rank_in(&self, text: &[u8], start: usize, end: usize) -> u32 {
        let len = end.saturating_sub(start);
        match len {
            0..=8 => self.rank_short(first_word(text, start, len), len),
            9..=16 => self.rank_medium(
                first_word(text, start, 8),
                first_word(text, start + 8, len - 8),
                len,
            ),
            _ => text
                .get(start..end)
                .map_or(NONE, |bytes| self.rank_long(bytes)),
        }
    }

    /// The slot of the first probe of hash `h`, and the bits a matching slot has (tag, length).
    #[inline(always)]
    fn probe_start(&self, h: u64, len: usize) -> (usize, u64) {
        let key = (h & TAG_MASK) << TAG_SHIFT | (len as u64 & 0xFF) << LEN_SHIFT;
        ((h >> self.shift) as usize, key)
    }

    /// The rank a slot holds.
    #[inline(always)]
    fn slot_rank(slot: u64) -> u32 {
        // rank + 1 < 2^20: never NONE
        (((slot >> OFFSET_BITS) & ((1 << RANK_BITS) - 1)) as u32).wrapping_sub(1)
    }

    /// The rank of the token of hash `h` and length `len` whose bytes at a slot's data offset
    /// `is_token` accepts, [`NONE`] if no slot holds one: linear probing from the hash's slot,
    /// the data compared only where tag and length agree.
    #[inline(always)]
    fn probe(&self, h: u64, len: usize, is_token: impl Fn(usize) -> bool) -> u32 {
        let (mut i, key) = self.probe_start(h, len);
        let mask = self.slots.len() - 1;
        loop {
            let slot = self.slots.get(i).copied().unwrap_or(0);
            if slot == 0 {
                return NONE;
            }
            if slot & KEY_MASK == key && is_token((slot & OFFSET_MASK) as usize) {
                return Self::slot_rank(slot);
            }
            i = (i + 1) & mask;
        }
    }

    /// The rank of a token of up to 8 bytes, given as its [`first_word`].
    fn rank_short(&self, word: u64, len: usize) -> u32 {
        self.probe(hash_short(word, len), len, |offset| {
            first_word(self.data, offset, len) == word
        })
    }

    /// The rank of a token of 9 to 16 bytes, given as the [`first_word`]s of its halves.
    fn rank_medium(&self, first: u64, second: u64, len: usize) -> u32 {
        self.probe(hash_medium(first, second, len), len, |offset| {
            first_word(self.data, offset, 8) == first
                && first_word(self.data, offset + 8, len - 8) == second
        })
    }

    /// The rank of a token of more than 16 bytes.
    fn rank_long(&self, bytes: &[u8]) -> u32 {
        let len = bytes.len();
        if len > usize::from(u8::MAX) {
            return NONE;
        }
        self.probe(hash_long(bytes), len, |offset| {
            let token = self.data.get(offset..offset + len).unwrap_or_default();
            token.len() == len && same_bytes(token, bytes)
        })
    }

    /// Tokens of the piece `text[start..end]` of split text. The lookups read `text` past the
    /// piece's end (a whole word at a time, masked), never the merges.
    fn count_piece(
        &self,
        text: &[u8],
        (start, end): (usize, usize),
        scratch: &mut Scratch,
        memo: &mut Memo,
    ) -> u64 {
        let len = end.saturating_sub(start);
        if len <= 1 || self.rank_in(text, start, end) != NONE {
            return len.min(1) as u64;
        }
        if len <= SMALL_PIECE {
            let Some(piece) = text.get(start..end) else {
                return self.merge_small(text, start, end);
            };
            if let Some(count) = memo.get(piece) {
                return count;
            }
            let count = self.merge_small(text, start, end);
            memo.put(piece, count);
            return count;
        }
        (start..end)
            .step_by(MAX_PIECE)
            .map(|part| {
                let part_end = end.min(part + MAX_PIECE);
                match part_end - part {
                    0 | 1 => (part_end - part) as u64,
                    len if len <= SMALL_PIECE => self.merge_small(text, part, part_end),
                    _ => self.merge_large(text, part, part_end, scratch),
                }
            })
            .fold(0u64, u64::saturating_add)
    }

    /// The rank of the bytes `a..b` of the piece `text[start..end]`, [`NONE`] if they are no
    /// token or not inside the piece.
    #[inline(always)]
    fn rank_of(&self, text: &[u8], start: usize, end: usize, a: usize, b: usize) -> u32 {
        if a < b && start + b <= end {
            self.rank_in(text, start + a, start + b)
        } else {
            NONE
        }
    }

    /// tiktoken's `_byte_pair_merge`: parts as `(start, rank of merging with the next part)`,
    /// a linear scan for the lowest rank per merge. The piece `text[start..end]` has 2 to
    /// [`SMALL_PIECE`] bytes.
    fn merge_small(&self, text: &[u8], start: usize, end: usize) -> u64 {
        let n = end - start;
        let rank = |a: usize, b: usize| self.rank_of(text, start, end, a, b);
        // part i: its start, and the rank of merging it with part i + 1
        let mut starts = [0u8; SMALL_PIECE + 1];
        let mut ranks = [NONE; SMALL_PIECE + 1];
        let mut len = n + 1;
        // the last two (start n - 1 and the end, n) have no pair: rank says NONE
        for (i, (start, merged)) in starts
            .iter_mut()
            .zip(ranks.iter_mut())
            .enumerate()
            .take(len)
        {
            *start = i as u8; // SMALL_PIECE < 256
            *merged = rank(i, i + 2);
        }
        loop {
            let mut lowest = (NONE, 0usize);
            for (i, &merged) in ranks.iter().enumerate().take(len - 1) {
                if merged < lowest.0 {
                    lowest = (merged, i);
                }
            }
            if lowest.0 == NONE {
                break;
            }
            let i = lowest.1;
            let at = |starts: &[u8], j: usize| starts.get(j).map_or(n, |&s| usize::from(s));
            // part i + 1 is still there: the merged part i ends at at(i + 2)
            if i > 0 {
                let merged = if i + 2 < len {
                    rank(at(&starts, i - 1), at(&starts, i + 2))
                } else {
                    NONE
                };
                if let Some(r) = ranks.get_mut(i - 1) {
                    *r = merged;
                }
            }
            let merged = if i + 3 < len {
                rank(at(&starts, i), at(&starts, i + 3))
            } else {
                NONE
            };
            if let Some(r) = ranks.get_mut(i) {
                *r = merged;
            }
            // remove part i + 1 (i + 2 <= len <= SMALL_PIECE + 1: in range)
            if i + 2 <= len && len <= starts.len() {
                starts.copy_within(i + 2..len, i + 1);
                ranks.copy_within(i + 2..len, i + 1);
            }
            len -= 1;
        }
        (len - 1) as u64
    }

    /// tiktoken's `_byte_pair_merge_large`: a linked list of parts and a heap of candidate
    /// merges `(rank, start)`, stale entries skipped. The piece `text[start..end]` has 2 to
    /// [`MAX_PIECE`] bytes.
    fn merge_large(&self, text: &[u8], start: usize, end: usize, scratch: &mut Scratch) -> u64 {
        let n = end - start;
        let rank = |a: u32, b: u32| self.rank_of(text, start, end, a as usize, b as usize);
        let Scratch {
            end: ends,
            prev,
            next_rank,
            heap,
        } = scratch;
        ends.clear();
        prev.clear();
        next_rank.clear();
        heap.clear();
        for i in 0..n as u32 {
            ends.push(i + 1);
            prev.push(i.wrapping_sub(1));
            let merged = rank(i, i + 2);
            next_rank.push(merged);
            if merged != NONE {
                heap.push(Reverse((merged, i)));
            }
        }
        let at = |v: &Vec<u32>, i: u32| v.get(i as usize).copied().unwrap_or(n as u32);
        let mut count = n as u64;
        while let Some(Reverse((merged, left))) = heap.pop() {
            if at(next_rank, left) != merged {
                continue; // superseded
            }
            let right = at(ends, left);
            let right_end = at(ends, right);
            if let Some(e) = ends.get_mut(left as usize) {
                *e = right_end;
            }
            if let Some(r) = next_rank.get_mut(right as usize) {
                *r = NONE; // no longer the start of a part
            }
            count -= 1;
            // the merged part with the one after it
            let merged = if (right_end as usize) < n {
                rank(left, at(ends, right_end))
            } else {
                NONE
            };
            if let Some(r) = next_rank.get_mut(left as usize) {
                *r = merged;
            }
            if merged != NONE {
                heap.push(Reverse((merged, left)));
            }
            if let Some(p) = prev.get_mut(right_end as usize) {
                *p = left;
            }
            // the part before it with the merged part
            if left > 0 {
                let before = at(prev, left);
                let merged = rank(before, right_end);
                if let Some(r) = next_rank.get_mut(before as usize) {
                    *r = merged;
                }
                if merged != NONE {
                    heap.push(Reverse((merged, before)));
                }
            }
        }
        count
    }
}

/// Buffers of [`Ranks::merge_large`], reused across the pieces of one count.
#[derive(Default)]
struct Scratch {
    end: Vec<u32>,
    prev: Vec<u32>,
    next_rank: Vec<u32>,
    heap: BinaryHeap<Reverse<(u32, u32)>>,
}

/// Slots of a [`Memo`] (a power of two).
const MEMO_SLOTS: usize = 4096;

/// The counts of pieces the stack-array merge counted, by their bytes. Text repeats its words
/// (within a prompt, and from one request to the next): a hit costs a hash and a compare where
/// the merge costs a lookup per byte and more per merge. Direct-mapped (a piece replaces the
/// one in its slot), bounded (`MEMO_SLOTS` × 34 bytes, allocated on first use), and exact: a
/// hit compares all the piece's bytes.
#[derive(Default)]
struct Memo {
    slots: Vec<MemoSlot>,
}

#[derive(Clone, Copy)]
struct MemoSlot {
    /// The piece's bytes (its first `len`).
    bytes: [u8; SMALL_PIECE],
    /// The piece's length; 0: empty (a merged piece has at least 2 bytes).
    len: u8,
    /// Its tokens (at most its length).
    count: u8,
}

impl Memo {
    fn slot(piece: &[u8]) -> usize {
        (hash(piece) >> (64 - MEMO_SLOTS.trailing_zeros())) as usize
    }

    /// The count memoized for `piece` (2 to [`SMALL_PIECE`] bytes).
    fn get(&self, piece: &[u8]) -> Option<u64> {
        let slot = self.slots.get(Self::slot(piece))?;
        let bytes = slot.bytes.get(..usize::from(slot.len))?;
        (bytes == piece).then_some(u64::from(slot.count))
    }

    fn put(&mut self, piece: &[u8], count: u64) {
        let (Ok(len), Ok(count)) = (u8::try_from(piece.len()), u8::try_from(count)) else {
            return;
        };
        if self.slots.is_empty() {
            let empty = MemoSlot {
                bytes: [0; SMALL_PIECE],
                len: 0,
                count: 0,
            };
            self.slots = vec![empty; MEMO_SLOTS];
        }
        let mut bytes = [0u8; SMALL_PIECE];
        let Some(to) = bytes.get_mut(..piece.len()) else {
            return;
        };
        to.copy_from_slice(piece);
        if let Some(slot) = self.slots.get_mut(Self::slot(piece)) {
            *slot = MemoSlot { bytes, len, count };
        }
    }
}

static O200K: OnceLock<Option<Ranks>> = OnceLock::new();
static CL100K: OnceLock<Option<Ranks>> = OnceLock::new();

/// The ranks of `encoding` (indexed on first use) and its split pattern.
pub(super) fn ranks(encoding: Encoding) -> Option<(&'static Ranks, Pattern)> {
    let (cell, data, pattern) = match encoding {
        Encoding::O200k => (&O200K, O200K_DATA, Pattern::O200k),
        Encoding::Cl100k => (&CL100K, CL100K_DATA, Pattern::Cl100k),
        Encoding::Chars => return None,
    };
    cell.get_or_init(|| Ranks::new(data))
        .as_ref()
        .map(|ranks| (ranks, pattern))
}

thread_local! {
    /// Each encoding's [`Memo`], kept for the thread's (the VM's) life.
    static MEMOS: [RefCell<Memo>; 2] = Default::default();
}

/// Tokens of `text` under a BPE `encoding`; `None` for an encoding without ranks.
pub(super) fn count(encoding: Encoding, text: &str) -> Option<u64> {
    let (ranks, pattern) = ranks(encoding)?;
    let mut scratch = Scratch::default();
    let mut run = |memo: &mut Memo| {
        piece_ranges(pattern, text)
            .map(|piece| ranks.count_piece(text.as_bytes(), piece, &mut scratch, memo))
            .fold(0u64, u64::saturating_add)
    };
    let index = usize::from(encoding == Encoding::Cl100k);
    let kept = MEMOS.try_with(|memos| {
        memos
            .get(index)
            .and_then(|memo| memo.try_borrow_mut().ok())
            .map(|mut memo| run(&mut memo))
    });
    Some(match kept {
        Ok(Some(tokens)) => tokens,
        // no memo to use (a thread being torn down): counted without one
        _ => run(&mut Memo::default()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Every token of the data is found under its own rank, and the index rejects near misses.
    #[test]
    fn index_finds_every_token_under_its_rank() {
        for data in [O200K_DATA, CL100K_DATA] {
            let ranks = Ranks::new(data).unwrap();
            let (mut pos, mut rank) = (0, 0u32);
            while pos < data.len() {
                let len = usize::from(data[pos]);
                let token = &data[pos + 1..pos + 1 + len];
                assert_eq!(ranks.rank(token), Some(rank));
                pos += 1 + len;
                rank += 1;
            }
            assert!(ranks.rank(b"").is_none());
            assert!(ranks.rank(&[b'x'; 300]).is_none());
            assert!(ranks.rank(b"qzxqzxqzxqzx").is_none());
        }
    }

    #[test]
    fn malformed_data_is_refused() {
        assert!(Ranks::new(b"").is_none());
        assert!(Ranks::new(b"\x03ab").is_none()); // a length past the end
        assert!(Ranks::new(b"\x01a\x00").is_none()); // an empty token
        let ranks = Ranks::new(b"\x01a\x01b\x02ab").unwrap();
        assert_eq!(ranks.rank(b"ab"), Some(2));
    }

    /// The memo answers only for the very bytes it was given: not for another piece in the
    /// same slot, a prefix, or before anything was put; a later piece replaces an earlier one.
    #[test]
    fn memo_is_exact_and_bounded() {
        let mut memo = Memo::default();
        assert_eq!(memo.get(b"onboarding"), None);
        memo.put(b"onboarding", 2);
        assert_eq!(memo.get(b"onboarding"), Some(2));
        assert_eq!(memo.get(b"onboardin"), None);
        assert_eq!(memo.get(b"onboardinG"), None);
        assert_eq!(memo.slots.len(), MEMO_SLOTS);
        // two pieces of one slot: the later one is kept, the earlier one is no longer answered
        let slot = Memo::slot(b"onboarding");
        let other = (0u32..)
            .map(|i| format!("w{i}x"))
            .find(|w| Memo::slot(w.as_bytes()) == slot)
            .unwrap();
        assert_eq!(memo.get(other.as_bytes()), None);
        memo.put(other.as_bytes(), 3);
        assert_eq!(memo.get(other.as_bytes()), Some(3));
        assert_eq!(memo.get(b"onboarding"), None);
        // nothing longer than a slot holds
        memo.put(&[b'a'; SMALL_PIECE + 1], 1);
        assert_eq!(memo.get(&[b'a'; SMALL_PIECE + 1]), None);
    }

    /// Counting the same text again (its merged pieces now answered by the memo) and other
    /// text in between gives the same counts.
    #[test]
    fn memoized_counts_are_the_merged_counts() {
        let text = "The quarterly review covers onboarding, billing disputes, summarise \
            follow-up antidisestablishmentarianism Übergrößenträger naïveté 日本語のテキスト";
        for encoding in [Encoding::O200k, Encoding::Cl100k] {
            let (ranks, pattern) = ranks(encoding).unwrap();
            let mut scratch = Scratch::default();
            let fresh: u64 = piece_ranges(pattern, text)
                .map(|p| ranks.count_piece(text.as_bytes(), p, &mut scratch, &mut Memo::default()))
                .sum();
            let first = count(encoding, text).unwrap();
            count(encoding, "something else entirely, to churn the memo").unwrap();
            assert_eq!(first, fresh);
            assert_eq!(count(encoding, text), Some(fresh));
        }
    }

    /// The stack-array merge and the heap merge count alike (both are tiktoken's algorithm),
    /// on every prefix the stack array takes, alone and inside a longer text (the lookups
    /// read past the piece).
    #[test]
    fn both_merge_loops_agree() {
        let (ranks, _) = ranks(Encoding::O200k).unwrap();
        let mut scratch = Scratch::default();
        for text in [
            "antidisestablishmentarianism",
            "pneumonoultramicroscopicsilicovolcanoconiosis",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "日本語のテキストを数えます東京タワーはメートルです",
            "xyzzyplughquuxfrobnicatewibblewobble",
        ] {
            let bytes = text.as_bytes();
            for len in 2..=bytes.len().min(SMALL_PIECE) {
                let piece = &bytes[..len];
                let small = ranks.merge_small(piece, 0, len);
                assert_eq!(
                    small,
                    ranks.merge_large(piece, 0, len, &mut scratch),
                    "{piece:?}"
                );
                assert_eq!(small, ranks.merge_small(bytes, 0, len), "{piece:?}");
            }
        }
    }
}
