//! Byte scans the detectors share, written for wasm32 without SIMD, where every byte a loop
//! touches costs several instructions: a word-at-a-time search for one byte (eight bytes per
//! step) and plain index loops over runs of a byte class (no iterator adapters, which the
//! size-optimised build leaves as calls). Also the byte reads every detector is written with:
//! [`at`] and [`before`] (a byte past either end reads as 0, so no scanner indexes out of
//! range), the byte classes, and [`Step`], what a try at a position found.

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The position of the first `needle` in `b` at or after `from`.
pub(crate) fn find_byte(b: &[u8], from: usize, needle: u8) -> Option<usize> {
    let rest = b.get(from..)?;
    let pattern = ONES.wrapping_mul(u64::from(needle));
    let mut chunks = rest.chunks_exact(8);
    let mut base = from;
    for chunk in &mut chunks {
        if let Ok(word) = <[u8; 8]>::try_from(chunk) {
            // a byte of `x` is zero where the text has `needle`; the lowest flagged byte is
            // always a true one (a borrow only flags bytes above a zero byte)
            let x = u64::from_le_bytes(word) ^ pattern;
            let zero = x.wrapping_sub(ONES) & !x & HIGHS;
            if zero != 0 {
                return Some(base + (zero.trailing_zeros() / 8) as usize);
            }
        }
        base += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&c| c == needle)
        .map(|p| base + p)
}

/// The position of the first occurrence of `needle` (not empty) in `b` at or after `from`:
/// [`find_byte`] to each of its first byte, then a comparison of the rest.
pub(crate) fn find_bytes(b: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let mut k = from;
    while let Some(p) = find_byte(b, k, first) {
        let after = p + 1;
        if b.get(after..after + rest.len()) == Some(rest) {
            return Some(p);
        }
        k = after;
    }
    None
}

/// The high bit of each byte of `word` that equals `needle` (exact: no borrow between
/// bytes).
#[inline(always)]
pub(crate) fn byte_flags(word: u64, needle: u8) -> u64 {
    let x = word ^ ONES.wrapping_mul(u64::from(needle));
    !((x & !HIGHS).wrapping_add(!HIGHS) | x) & HIGHS
}

/// The position of the first of `needles` in `b` at or after `from`.
pub(crate) fn find_any3(b: &[u8], from: usize, needles: [u8; 3]) -> Option<usize> {
    let rest = b.get(from..)?;
    let mut chunks = rest.chunks_exact(8);
    let mut base = from;
    for chunk in &mut chunks {
        if let Ok(word) = <[u8; 8]>::try_from(chunk) {
            let w = u64::from_le_bytes(word);
            let zero = needles
                .iter()
                .fold(0, |flags, &needle| flags | byte_flags(w, needle));
            if zero != 0 {
                return Some(base + (zero.trailing_zeros() / 8) as usize);
            }
        }
        base += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|c| needles.contains(c))
        .map(|p| base + p)
}

/// The first position at or after `from` whose byte is an ASCII capital or not ASCII
/// (`b.len()` if none): what the name scan stops at, eight bytes per step.
pub(crate) fn next_upper_or_non_ascii(b: &[u8], from: usize) -> usize {
    let Some(rest) = b.get(from..) else {
        return b.len();
    };
    let mut chunks = rest.chunks_exact(8);
    let mut base = from;
    for chunk in &mut chunks {
        if let Ok(word) = <[u8; 8]>::try_from(chunk) {
            let x = u64::from_le_bytes(word);
            // per byte, without carries between bytes: the low seven bits plus a constant
            // set the high bit from a threshold on
            let low = x & !HIGHS;
            let from_a = low.wrapping_add(ONES.wrapping_mul(0x80 - u64::from(b'A')));
            let past_z = low.wrapping_add(ONES.wrapping_mul(0x7F - u64::from(b'Z')));
            let hit = ((from_a & !past_z) | x) & HIGHS;
            if hit != 0 {
                return base + (hit.trailing_zeros() / 8) as usize;
            }
        }
        base += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&c| c.is_ascii_uppercase() || !c.is_ascii())
        .map_or(b.len(), |p| base + p)
}

/// Which of the bytes that some detectors cannot match without occur in a text, found in one
/// pass (eight bytes per step) instead of one search per detector: a detector whose byte is
/// absent is not run (most prose has none of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Present(u8);

impl Present {
    /// `@` (an e-mail address).
    pub(crate) const AT: u8 = 1;
    /// `:` (an IPv6 address).
    pub(crate) const COLON: u8 = 2;
    /// `-` (a PEM block's `-----BEGIN `).
    pub(crate) const DASH: u8 = 4;
    /// `[` (a literal placeholder).
    pub(crate) const BRACKET: u8 = 8;
    /// An ASCII digit (every Latin street address).
    pub(crate) const DIGIT: u8 = 16;
    /// `J` (a JSON Web Token's `eyJ`).
    pub(crate) const J: u8 = 32;
    /// Every byte above, for text not looked at.
    pub(crate) const ALL: Present = Present(u8::MAX);

    /// The bytes of `b` among those above.
    pub(crate) fn of(b: &[u8]) -> Present {
        // per needle, the flags of all words or-ed: the test for a zero byte may also flag
        // a byte above a true one (a borrow), never a word without one, which is all that
        // matters for "any"
        let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
        let [mut at, mut colon, mut dash, mut bracket, mut digit, mut j] = [0u64; 6];
        let mut chunks = b.chunks_exact(8);
        for chunk in &mut chunks {
            if let Ok(word) = <[u8; 8]>::try_from(chunk) {
                let x = u64::from_le_bytes(word);
                at |= zero(x ^ ONES.wrapping_mul(u64::from(b'@')));
                colon |= zero(x ^ ONES.wrapping_mul(u64::from(b':')));
                dash |= zero(x ^ ONES.wrapping_mul(u64::from(b'-')));
                bracket |= zero(x ^ ONES.wrapping_mul(u64::from(b'[')));
                digit |= digit_flags(x);
                j |= zero(x ^ ONES.wrapping_mul(u64::from(b'J')));
            }
        }
        let flag = |hit: u64, bit: u8| if hit != 0 { bit } else { 0 };
        let mut bits = flag(at, Self::AT)
            | flag(colon, Self::COLON)
            | flag(dash, Self::DASH)
            | flag(bracket, Self::BRACKET)
            | flag(digit, Self::DIGIT)
            | flag(j, Self::J);
        for &c in chunks.remainder() {
            bits |= match c {
                b'@' => Self::AT,
                b':' => Self::COLON,
                b'-' => Self::DASH,
                b'[' => Self::BRACKET,
                b'0'..=b'9' => Self::DIGIT,
                b'J' => Self::J,
                _ => 0,
            };
        }
        Present(bits)
    }

    /// Whether the byte (class) `bit` occurs.
    pub(crate) fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }
}

/// The high bit of each byte of `x` that is an ASCII digit (exact: per byte, without
/// carries between bytes).
#[inline(always)]
fn digit_flags(x: u64) -> u64 {
    // the low seven bits plus a constant set the high bit from a threshold on; bytes of 0x80
    // and above are out
    let low = x & !HIGHS;
    let from_0 = low.wrapping_add(ONES.wrapping_mul(0x80 - u64::from(b'0')));
    let past_9 = low.wrapping_add(ONES.wrapping_mul(0x7F - u64::from(b'9')));
    from_0 & !past_9 & !x & HIGHS
}

/// Whether `b` holds an ASCII digit, eight bytes per step.
pub(crate) fn has_ascii_digit(b: &[u8]) -> bool {
    find_ascii_digit(b, 0).is_some()
}

/// The position of the first ASCII digit in `b` at or after `from`, eight bytes per step.
pub(crate) fn find_ascii_digit(b: &[u8], from: usize) -> Option<usize> {
    let rest = b.get(from..)?;
    let mut chunks = rest.chunks_exact(8);
    let mut base = from;
    for chunk in &mut chunks {
        if let Ok(word) = <[u8; 8]>::try_from(chunk) {
            let digits = digit_flags(u64::from_le_bytes(word));
            if digits != 0 {
                return Some(base + (digits.trailing_zeros() / 8) as usize);
            }
        }
        base += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(u8::is_ascii_digit)
        .map(|p| base + p)
}

/// The first position at or after `from` whose byte is neither an ASCII lower-case letter
/// nor a space (`b.len()` if none), eight bytes per step: the run of prose before it
/// starts no anchored scanner's match (see `detect::Sweep`).
pub(crate) fn next_not_lower_or_space(b: &[u8], from: usize) -> usize {
    let Some(rest) = b.get(from..) else {
        return b.len();
    };
    let mut chunks = rest.chunks_exact(8);
    let mut base = from;
    for chunk in &mut chunks {
        if let Ok(word) = <[u8; 8]>::try_from(chunk) {
            let other = not_lower_or_space_flags(u64::from_le_bytes(word));
            if other != 0 {
                return base + (other.trailing_zeros() / 8) as usize;
            }
        }
        base += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&c| !(c.is_ascii_lowercase() || c == b' '))
        .map_or(b.len(), |p| base + p)
}

/// The high bit of each byte of `x` that is neither an ASCII lower-case letter nor a space
/// (exact: per byte, without carries between bytes).
#[inline(always)]
pub(crate) fn not_lower_or_space_flags(x: u64) -> u64 {
    // the low seven bits plus a constant set the high bit from a threshold on
    let low = x & !HIGHS;
    let from_a = low.wrapping_add(ONES.wrapping_mul(0x80 - u64::from(b'a')));
    let past_z = low.wrapping_add(ONES.wrapping_mul(0x7F - u64::from(b'z')));
    let lower = from_a & !past_z & !x;
    let s = x ^ ONES.wrapping_mul(u64::from(b' '));
    let space = !((s & !HIGHS).wrapping_add(!HIGHS) | s);
    !(lower | space) & HIGHS
}

/// The first position `j` at or after `from` with `b[j..j + 2] == pair`.
pub(crate) fn find_pair(b: &[u8], from: usize, pair: [u8; 2]) -> Option<usize> {
    let [first, second] = pair;
    let mut k = from.checked_add(1)?;
    while let Some(q) = find_byte(b, k, second) {
        if q.checked_sub(1).and_then(|j| b.get(j)) == Some(&first) {
            return Some(q - 1);
        }
        k = q + 1;
    }
    None
}

/// Whether `c` is an ASCII letter or digit, by a table (one load instead of three range
/// tests).
#[inline(always)]
pub(crate) fn is_alnum(c: u8) -> bool {
    ALNUM.get(usize::from(c)).copied().unwrap_or(false)
}

// evaluated at compile time: an index out of range would fail the build, not panic
#[allow(clippy::indexing_slicing)]
static ALNUM: [bool; 256] = {
    let mut table = [false; 256];
    let mut c = 0;
    while c < 256 {
        table[c] = (c as u8).is_ascii_alphanumeric();
        c += 1;
    }
    table
};

/// The end of the run of bytes from `i` that pass `class`.
#[inline(always)]
pub(crate) fn run_end(b: &[u8], mut i: usize, class: impl Fn(u8) -> bool) -> usize {
    while let Some(&c) = b.get(i) {
        if !class(c) {
            break;
        }
        i += 1;
    }
    i
}

/// The byte at `i`, 0 past the end (a missing byte reads as 0: the scanners never index out
/// of range).
pub(crate) fn at(b: &[u8], i: usize) -> u8 {
    b.get(i).copied().unwrap_or(0)
}

/// The byte before `i`, 0 at the start.
pub(crate) fn before(b: &[u8], i: usize) -> u8 {
    i.checked_sub(1).map_or(0, |j| at(b, j))
}

pub(crate) fn is_digit(c: u8) -> bool {
    c.is_ascii_digit()
}

pub(crate) fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Reads up to `max` digits from `i`; returns the end.
pub(crate) fn digits_from(b: &[u8], i: usize, max: usize) -> usize {
    let mut e = i;
    while e - i < max && is_digit(at(b, e)) {
        e += 1;
    }
    e
}

/// What a detector's try at a position found.
pub(crate) enum Step {
    /// A match from the position to this end.
    Match(usize),
    /// No match starts before this position.
    Skip(usize),
    /// No match here.
    No,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn finds_the_first_byte_in_every_lane() {
        for len in 0..40 {
            for at in 0..len {
                let mut text = vec![b'x'; len];
                text[at] = b'@';
                if at + 3 < len {
                    text[at + 3] = b'@';
                }
                for from in 0..=len {
                    let want = text.iter().skip(from).position(|&c| c == b'@');
                    assert_eq!(find_byte(&text, from, b'@'), want.map(|p| p + from));
                }
            }
        }
        assert_eq!(find_byte(b"abc", 4, b'a'), None);
        // a byte one above the needle next to it (the borrow case) is not a match
        assert_eq!(find_byte(b"AAAAAAA@A@", 0, b'@'), Some(7));
        assert_eq!(
            find_byte(b"\x01\x00\x01\x01\x01\x01\x01\x01", 0, 1),
            Some(0)
        );
        assert_eq!(find_byte(b"\x00\x01", 0, 1), Some(1));
    }

    #[test]
    fn run_end_stops_at_the_first_byte_outside_the_class() {
        assert_eq!(run_end(b"abc1", 0, |c| c.is_ascii_lowercase()), 3);
        assert_eq!(run_end(b"abc", 1, |c| c.is_ascii_lowercase()), 3);
        assert_eq!(run_end(b"abc", 5, |c| c.is_ascii_lowercase()), 5);
    }

    #[test]
    fn next_upper_or_non_ascii_in_every_lane() {
        for len in 0..30 {
            for at in 0..len {
                for stop in [b'A', b'Z', b'M', 0x80, 0xC3, 0xFF] {
                    let mut text = vec![b'a'; len];
                    text[at] = stop;
                    for from in 0..=len {
                        let want = if from <= at { at } else { len };
                        assert_eq!(next_upper_or_non_ascii(&text, from), want);
                    }
                }
            }
        }
        // the bytes around the capitals are not capitals
        let near = b"@[`{0 9az\x7f";
        assert_eq!(next_upper_or_non_ascii(near, 0), near.len());
    }

    #[test]
    fn alnum_table_is_is_ascii_alphanumeric() {
        for c in 0..=255u8 {
            assert_eq!(is_alnum(c), c.is_ascii_alphanumeric());
        }
    }

    proptest! {
        #[test]
        fn next_not_lower_or_space_is_position(text in proptest::collection::vec(
                                                   prop_oneof![Just(b' '), Just(b'a'), Just(b'z'),
                                                               Just(b'{'), Just(b'`'), Just(0xE1), Just(0xA0),
                                                               any::<u8>()], 0..80),
                                               from in 0usize..90) {
            let want = text.get(from..).and_then(|r| {
                r.iter().position(|&c| !(c.is_ascii_lowercase() || c == b' '))
            });
            prop_assert_eq!(next_not_lower_or_space(&text, from), want.map_or(text.len(), |p| p + from));
        }

        #[test]
        fn find_pair_is_a_window_search(text in proptest::collection::vec(
                                            prop_oneof![Just(b's'), Just(b'k'), any::<u8>()], 0..80),
                                        from in 0usize..90) {
            let want = text.windows(2).enumerate().skip(from).find(|(_, w)| w == b"sk").map(|(j, _)| j);
            prop_assert_eq!(find_pair(&text, from, *b"sk"), want);
        }

        #[test]
        fn present_is_what_occurs(text in proptest::collection::vec(
                                      prop_oneof![Just(b'@'), Just(b':'), Just(b'-'), Just(b'['),
                                                  Just(b'0'), Just(b'9'), Just(b'/'), Just(0xC0),
                                                  Just(0xBA), Just(b'a'), Just(b'J')], 0..40)) {
            let present = Present::of(&text);
            for (bit, test) in [
                (Present::AT, (|c| c == b'@') as fn(u8) -> bool),
                (Present::COLON, |c| c == b':'),
                (Present::DASH, |c| c == b'-'),
                (Present::BRACKET, |c| c == b'['),
                (Present::DIGIT, |c| c.is_ascii_digit()),
                (Present::J, |c| c == b'J'),
            ] {
                prop_assert_eq!(present.has(bit), text.iter().any(|&c| test(c)), "{}", bit);
            }
        }

        #[test]
        fn has_ascii_digit_is_any(text in proptest::collection::vec(
                                      prop_oneof![Just(b'0'), Just(b'9'), Just(b'/'), Just(b':'),
                                                  Just(0xB0), Just(0xB9), any::<u8>()], 0..40)) {
            prop_assert_eq!(has_ascii_digit(&text), text.iter().any(u8::is_ascii_digit));
        }

        #[test]
        fn find_ascii_digit_is_the_first(text in proptest::collection::vec(
                                      prop_oneof![Just(b'0'), Just(b'9'), Just(b'/'), Just(b':'),
                                                  Just(0xB0), Just(0xB9), any::<u8>()], 0..40),
                                  from in 0usize..45) {
            let expected = text.get(from..).and_then(|r| r.iter().position(u8::is_ascii_digit));
            prop_assert_eq!(find_ascii_digit(&text, from), expected.map(|p| p + from));
        }

        #[test]
        fn find_bytes_is_a_window_search(text in proptest::collection::vec(
                                             prop_oneof![Just(b'-'), Just(b'B'), any::<u8>()], 0..80),
                                         needle in proptest::collection::vec(
                                             prop_oneof![Just(b'-'), Just(b'B')], 1..4),
                                         from in 0usize..90) {
            let want = text.windows(needle.len()).enumerate().skip(from)
                .find(|(_, w)| *w == needle.as_slice()).map(|(j, _)| j);
            prop_assert_eq!(find_bytes(&text, from, &needle), want);
        }

        #[test]
        fn find_any3_is_position(text in proptest::collection::vec(
                                     prop_oneof![Just(b'"'), Just(b'['), Just(b'\\'), any::<u8>()], 0..80),
                                 from in 0usize..90) {
            let needles = [b'"', b'\\', b'['];
            let want = text.get(from..).and_then(|r| r.iter().position(|c| needles.contains(c)));
            prop_assert_eq!(find_any3(&text, from, needles), want.map(|p| p + from));
        }

        #[test]
        fn next_upper_or_non_ascii_is_position(text in proptest::collection::vec(any::<u8>(), 0..80),
                                               from in 0usize..90) {
            let want = text.get(from..).and_then(|r| {
                r.iter().position(|&c| c.is_ascii_uppercase() || !c.is_ascii())
            });
            prop_assert_eq!(next_upper_or_non_ascii(&text, from), want.map_or(text.len(), |p| p + from));
        }


        #[test]
        fn find_byte_is_position(text in proptest::collection::vec(any::<u8>(), 0..80),
                                 from in 0usize..90, needle in any::<u8>()) {
            let want = text.get(from..).and_then(|r| r.iter().position(|&c| c == needle));
            prop_assert_eq!(find_byte(&text, from, needle), want.map(|p| p + from));
        }
    }
}
