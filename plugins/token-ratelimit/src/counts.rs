//! The tokenizer's counts of texts this VM counted before, kept for the VM's life.
//!
//! A chat client resends the whole conversation with every turn, and an application sends
//! the same system prompt with every request: most of a prompt's text was counted by an
//! earlier request. Counting it again with the BPE is most of a request's cost here (about 85
//! wasm instructions per byte); a hit costs a hash and a compare of the text. The cache is
//! exact — an entry holds the text it counted and answers only for the very same text — so
//! an estimate is the same with it as without it; a text chosen to collide with another only
//! evicts it.
//!
//! Direct-mapped (a text replaces the one in its slot) and bounded: texts of
//! [`MIN_TEXT`]..=[`MAX_TEXT`] bytes (shorter ones cost little to count), [`MAX_BYTES`] of text
//! in all (past that, the cache starts over empty).

use llm_gateway_shared::fxhash;
use llm_gateway_shared::tokens::{count_tokens, Encoding};

/// Slots (a power of two).
const SLOTS: usize = 256;
/// Shortest text kept.
pub const MIN_TEXT: usize = 64;
/// Longest text kept.
pub const MAX_TEXT: usize = 64 * 1024;
/// Most bytes of text kept at once.
pub const MAX_BYTES: usize = 1024 * 1024;

/// One counted text.
#[derive(Debug)]
struct Entry {
    encoding: Encoding,
    text: Box<str>,
    tokens: u64,
}

/// Counts of texts, by encoding and text.
#[derive(Debug, Default)]
pub struct TextCounts {
    /// Empty until the first text is kept; then [`SLOTS`] long.
    slots: Vec<Option<Entry>>,
    /// Bytes of text kept.
    bytes: usize,
}

impl TextCounts {
    /// `count_tokens(encoding, text)`, from the cache when this text was counted before.
    pub fn count(&mut self, encoding: Encoding, text: &str) -> u64 {
        if !(MIN_TEXT..=MAX_TEXT).contains(&text.len()) {
            return count_tokens(encoding, text);
        }
        let slot = slot_of(text);
        if let Some(Some(entry)) = self.slots.get(slot) {
            if entry.encoding == encoding && same(entry.text.as_bytes(), text.as_bytes()) {
                return entry.tokens;
            }
        }
        let tokens = count_tokens(encoding, text);
        self.keep(slot, encoding, text, tokens);
        tokens
    }

    /// Keeps `text`'s count in `slot`, starting over when the cache would grow past
    /// [`MAX_BYTES`].
    fn keep(&mut self, slot: usize, encoding: Encoding, text: &str, tokens: u64) {
        if self.slots.is_empty() || self.bytes + text.len() > MAX_BYTES {
            self.slots.clear();
            self.slots.resize_with(SLOTS, || None);
            self.bytes = 0;
        }
        let Some(place) = self.slots.get_mut(slot) else {
            return;
        };
        if let Some(old) = place.take() {
            self.bytes -= old.text.len();
        }
        self.bytes += text.len();
        *place = Some(Entry {
            encoding,
            text: text.into(),
            tokens,
        });
    }

    /// Bytes of text kept (for tests).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// `a == b`, eight bytes at a time (the slice comparison byte by byte cost more than the
/// hash in wasm).
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let word = |chunk: &[u8]| chunk.try_into().map_or(0, u64::from_le_bytes);
    let (mut left, mut right) = (a.chunks_exact(8), b.chunks_exact(8));
    left.by_ref()
        .zip(right.by_ref())
        .all(|(x, y)| word(x) == word(y))
        && left.remainder() == right.remainder()
}

/// The slot of `text`: the top bits of its [`fxhash::hash_bytes`].
fn slot_of(text: &str) -> usize {
    (fxhash::hash_bytes(text.as_bytes()) >> (64 - SLOTS.trailing_zeros())) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PROSE: &str = "The quarterly review covers onboarding, billing disputes and the \
        migration plan for the reporting service. ";

    #[test]
    fn answers_the_tokenizers_count_for_every_text_and_encoding() {
        let mut counts = TextCounts::default();
        let texts = [
            String::new(),
            "short".to_string(),
            PROSE.to_string(),
            PROSE.repeat(3),
            "日本語のテキスト".repeat(20),
            "x".repeat(MAX_TEXT + 1),
        ];
        for _ in 0..2 {
            for text in &texts {
                for encoding in [Encoding::O200k, Encoding::Cl100k, Encoding::Chars] {
                    assert_eq!(
                        counts.count(encoding, text),
                        count_tokens(encoding, text),
                        "{encoding:?} {}",
                        text.len()
                    );
                }
            }
        }
    }

    #[test]
    fn keeps_texts_in_range_only_and_stays_bounded() {
        let mut counts = TextCounts::default();
        counts.count(Encoding::O200k, "short");
        counts.count(Encoding::O200k, &"y".repeat(MAX_TEXT + 1));
        assert_eq!(counts.bytes(), 0, "too short or too long: not kept");
        counts.count(Encoding::O200k, PROSE);
        assert_eq!(counts.bytes(), PROSE.len());
        counts.count(Encoding::O200k, PROSE);
        assert_eq!(counts.bytes(), PROSE.len(), "a hit keeps nothing more");
        for i in 0..200 {
            counts.count(
                Encoding::O200k,
                &format!("{i} {}", "z".repeat(MAX_TEXT - 8)),
            );
            assert!(counts.bytes() <= MAX_BYTES, "{}", counts.bytes());
        }
    }

    #[test]
    fn a_text_in_the_same_slot_is_counted_afresh() {
        let first = PROSE.repeat(2);
        let slot = slot_of(&first);
        let second = (0..)
            .map(|i| format!("{i} {}", "word ".repeat(30)))
            .find(|t| slot_of(t) == slot)
            .unwrap();
        let mut counts = TextCounts::default();
        for text in [&first, &second, &first, &second] {
            assert_eq!(
                counts.count(Encoding::O200k, text),
                count_tokens(Encoding::O200k, text)
            );
        }
    }

    proptest! {
        /// Equal bytes are the same; one byte changed anywhere (the last few included) or a
        /// length apart is not.
        #[test]
        fn same_is_equality(a in proptest::collection::vec(any::<u8>(), 1..40), at in any::<usize>()) {
            prop_assert!(same(&a, &a.clone()));
            let mut changed = a.clone();
            changed[at % a.len()] ^= 1;
            prop_assert!(!same(&a, &changed));
            prop_assert!(!same(&a, &a[1..]));
        }

        /// Texts that share slots, prefixes and lengths, in any order, under every encoding:
        /// each answer is the tokenizer's.
        #[test]
        fn never_answers_for_another_text(
            picks in proptest::collection::vec((0usize..40, 0usize..3), 1..120)
        ) {
            let texts: Vec<String> = (0..40)
                .map(|i| format!("{}{}", PROSE.repeat(1 + i % 3), "é ".repeat(i)))
                .collect();
            let encodings = [Encoding::O200k, Encoding::Cl100k, Encoding::Chars];
            let mut counts = TextCounts::default();
            for (text, encoding) in picks {
                let (text, encoding) = (&texts[text], encodings[encoding]);
                prop_assert_eq!(counts.count(encoding, text), count_tokens(encoding, text));
            }
        }
    }
}
