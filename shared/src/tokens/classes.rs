//! The Unicode character classes tiktoken's split patterns use, with the regex engine's own
//! tables, so that the hand-written splitter ([`super::split`]) puts its boundaries exactly
//! where tiktoken-rs's regex does, for every script.
//!
//! The table is `data/unicode_classes.bin`, generated from regex-syntax (the Unicode tables of
//! the `regex` crate that tiktoken-rs's fancy-regex delegates classes to) and checked against
//! it by `tests/token_data.rs`. Format: one little-endian `u32` per range of code points,
//! `first code point << 8 | class code` (codes of [`Class`]), in ascending order; each range
//! runs to the next one's first code point, the last to U+10FFFF. 3 191 ranges, 12.5 KB.
//!
//! A character's classes are a byte of flags ([`LETTER`], [`UPPER`], …) so that each class of
//! the patterns is one mask test. ASCII comes from a constant table; the rest of the Basic
//! Multilingual Plane from a 64 KiB table expanded from the ranges the first time a non-ASCII
//! character is seen (once per VM); the other planes by binary search over the ranges.

use std::sync::OnceLock;

/// `\p{L}`: letters.
pub(super) const LETTER: u8 = 1;
/// o200k's `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`.
pub(super) const UPPER: u8 = 2;
/// o200k's `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`.
pub(super) const LOWER: u8 = 4;
/// `\p{N}`: numbers.
pub(super) const NUMBER: u8 = 8;
/// `\s`: White_Space.
pub(super) const SPACE: u8 = 16;
/// `[\r\n]`.
pub(super) const NEWLINE: u8 = 32;
/// The literal space of ` ?` (U+0020).
pub(super) const BLANK: u8 = 64;
/// `/` (o200k's `[\r\n/]*`).
pub(super) const SLASH: u8 = 128;

/// What a code point is in the data file (every code point is in exactly one class).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// None of the others (punctuation, symbols, controls, unassigned).
    Other,
    /// `\p{Lu}` or `\p{Lt}`: upper- and title-case letters.
    Upper,
    /// `\p{Ll}`: lower-case letters.
    Lower,
    /// `\p{Lm}` or `\p{Lo}`: letters without case (CJK, kana, Arabic, Hebrew, …).
    Caseless,
    /// `\p{M}`: combining marks (not letters, but in both of o200k's letter-case sets).
    Mark,
    /// `\p{N}`: numbers.
    Number,
    /// `\s`: White_Space (CR and LF included).
    Space,
}

impl Class {
    const fn from_code(code: u8) -> Class {
        match code {
            1 => Class::Upper,
            2 => Class::Lower,
            3 => Class::Caseless,
            4 => Class::Mark,
            5 => Class::Number,
            6 => Class::Space,
            _ => Class::Other,
        }
    }

    const fn flags(self) -> u8 {
        match self {
            Class::Other => 0,
            Class::Upper => LETTER | UPPER,
            Class::Lower => LETTER | LOWER,
            Class::Caseless => LETTER | UPPER | LOWER,
            Class::Mark => UPPER | LOWER,
            Class::Number => NUMBER,
            Class::Space => SPACE,
        }
    }
}

static TABLE: &[u8] = include_bytes!("../../data/unicode_classes.bin");

/// The flags of each ASCII byte (what the data file says for U+0000..U+007F, plus the
/// characters the patterns name).
#[allow(
    clippy::indexing_slicing,
    reason = "evaluated at compile time: an index out of range fails the build, not a request"
)]
static ASCII: [u8; 128] = {
    let mut flags = [0u8; 128];
    let mut byte = 0;
    while byte < 128 {
        let class = match byte as u8 {
            b'A'..=b'Z' => Class::Upper,
            b'a'..=b'z' => Class::Lower,
            b'0'..=b'9' => Class::Number,
            b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ' => Class::Space,
            _ => Class::Other,
        };
        flags[byte] = class.flags()
            | match byte as u8 {
                b'\r' | b'\n' => NEWLINE,
                b' ' => BLANK,
                b'/' => SLASH,
                _ => 0,
            };
        byte += 1;
    }
    flags
};

/// The flags of an ASCII byte (0 for any other byte).
#[inline(always)]
pub(super) fn ascii_flags(byte: u8) -> u8 {
    ASCII.get(usize::from(byte)).copied().unwrap_or(0)
}

/// The flags of a code point.
pub(super) fn flags(c: char) -> u8 {
    let code_point = u32::from(c);
    if code_point < 0x80 {
        return ascii_flags(code_point as u8);
    }
    if code_point < 0x1_0000 {
        static BMP: OnceLock<Vec<u8>> = OnceLock::new();
        let bmp = BMP.get_or_init(|| {
            let mut bmp = vec![0u8; 0x1_0000];
            let mut i = 0;
            while let Some(range) = entry(i) {
                let start = (range >> 8) as usize;
                let end = entry(i + 1).map_or(bmp.len(), |next| (next >> 8) as usize);
                if let Some(code_points) = bmp.get_mut(start..end.min(0x1_0000)) {
                    code_points.fill(class_of(Some(range)).flags());
                }
                i += 1;
            }
            bmp
        });
        if let Some(&flags) = bmp.get(code_point as usize) {
            return flags;
        }
    }
    searched(code_point).flags()
}

/// Entry `i` of the table, if there is one.
#[inline]
fn entry(i: usize) -> Option<u32> {
    TABLE
        .get(i * 4..i * 4 + 4)
        .and_then(|bytes| <[u8; 4]>::try_from(bytes).ok())
        .map(u32::from_le_bytes)
}

fn class_of(entry: Option<u32>) -> Class {
    Class::from_code(entry.map_or(0, |e| e as u8))
}

/// The class of a code point, by binary search over the ranges.
fn searched(code_point: u32) -> Class {
    // invariant: entry(low) starts at or before the code point (entry 0 starts at U+0000),
    // entry(high) after it or does not exist
    let (mut low, mut high) = (0, TABLE.len() / 4);
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if entry(mid).is_some_and(|e| e >> 8 <= code_point) {
            low = mid;
        } else {
            high = mid;
        }
    }
    class_of(entry(low))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// The flags the data file gives `c`, without the names the patterns add.
    fn from_table(c: char) -> u8 {
        searched(u32::from(c)).flags()
    }

    #[test]
    fn lookups_agree_with_the_table() {
        assert_eq!(TABLE.len() % 4, 0);
        assert_eq!(entry(0).map(|e| e >> 8), Some(0));
        let named = NEWLINE | BLANK | SLASH;
        for byte in 0..128u8 {
            assert_eq!(
                ascii_flags(byte) & !named,
                from_table(char::from(byte)),
                "{byte:#x}"
            );
        }
        assert_eq!(ascii_flags(b'\n'), SPACE | NEWLINE);
        assert_eq!(ascii_flags(b' '), SPACE | BLANK);
        assert_eq!(ascii_flags(b'/'), SLASH);
        // the expanded plane and the search agree everywhere
        for c in (0x80..0x1_0000).filter_map(char::from_u32) {
            assert_eq!(flags(c), from_table(c), "U+{:04X}", u32::from(c));
        }
    }

    #[test]
    fn classes_of_some_scripts() {
        let cases = [
            ('é', Class::Lower),
            ('É', Class::Upper),
            ('ǅ', Class::Upper), // Lt
            ('ſ', Class::Lower),
            ('日', Class::Caseless),
            ('の', Class::Caseless),
            ('ー', Class::Caseless), // Lm
            ('ب', Class::Caseless),
            ('\u{301}', Class::Mark),    // combining acute accent
            ('\u{93F}', Class::Mark),    // Devanagari vowel sign I (Mc)
            ('\u{2167}', Class::Number), // Roman numeral eight (Nl)
            ('٣', Class::Number),
            ('\u{a0}', Class::Space),
            ('\u{3000}', Class::Space),
            ('\u{2028}', Class::Space),
            ('\u{85}', Class::Space),
            ('😀', Class::Other),
            ('\u{1d400}', Class::Upper), // mathematical bold capital A
            ('\u{24B6}', Class::Other),  // circled A: So, though Alphabetic
            ('\u{10FFFF}', Class::Other),
        ];
        for (c, expected) in cases {
            assert_eq!(flags(c), expected.flags(), "U+{:04X}", u32::from(c));
            assert_eq!(searched(u32::from(c)), expected, "U+{:04X}", u32::from(c));
        }
    }
}
