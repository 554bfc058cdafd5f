//! tiktoken's pre-tokenizer, by hand: the text is cut into pieces exactly where tiktoken-rs's
//! split regex cuts it (leftmost-first alternation, backtracking quantifiers), without a regex
//! engine, a backtrack limit or an allocation. Each piece is then encoded on its own.
//!
//! The two patterns, alternatives in order (`L` = `\p{L}`, `N` = `\p{N}`, `U` = o200k's
//! `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`, `W` = its `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`, `'c` = a
//! case-insensitive `'s 't 're 've 'm 'll 'd`):
//!
//! | o200k_base | cl100k_base |
//! |---|---|
//! | `[^\r\n L N]? U* W+ 'c?` | `'(?i:[sdmt]\|ll\|ve\|re)` |
//! | `[^\r\n L N]? U+ W* 'c?` | `[^\r\n L N]?+ L++` |
//! | `N{1,3}` | `N{1,3}+` |
//! | ` ?[^\s L N]+[\r\n/]*` | ` ?[^\s L N]++[\r\n]*+` |
//! | `\s*[\r\n]+` | `\s++$` |
//! | `\s+(?!\S)` | `\s*[\r\n]` |
//! | `\s+` | `\s+(?!\S)` |
//! | | `\s` |
//!
//! Every character starts a match of some alternative (letters the first two, numbers the
//! third, other non-space the fourth, space the rest), so the pieces tile the text. The
//! backtracking that decides where a piece ends:
//! - `U* W+`: `U*` takes the whole run of `U`; if the next character is no `W`, the engine gives
//!   back characters until the one given back is a `W` (`U` and `W` share `Lm`, `Lo` and marks),
//!   and `W+` then ends right after it. With neither, `U+ W*` takes the run.
//! - An optional prefix is tried taken first, then not taken (it matters for marks, which are
//!   both a prefix and in `U`/`W`).
//! - `\s*[\r\n]+` (and `\s*[\r\n]`) ends after the last CR/LF of the whitespace run.
//! - `\s+(?!\S)` leaves the run's last character when a non-space follows (the next piece is
//!   then that space joined to the word after it), and fails on a single space.
//!
//! Character classes are the regex engine's own ([`super::classes`]), so this holds for every
//! script; the tests check it against the regexes on arbitrary text.

use super::classes::{
    ascii_flags, flags, BLANK, LETTER, LOWER, NEWLINE, NUMBER, SLASH, SPACE, UPPER,
};

/// Which split pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pattern {
    O200k,
    Cl100k,
}

/// The pieces of `text`, in order; concatenated they are `text`.
#[cfg(test)]
pub(super) fn pieces(pattern: Pattern, text: &str) -> impl Iterator<Item = &str> {
    piece_ranges(pattern, text).filter_map(|(start, end)| text.get(start..end))
}

/// The byte ranges `(start, end)` of the pieces of `text`, in order, none empty; together
/// they cover `text`.
pub(super) fn piece_ranges(
    pattern: Pattern,
    text: &str,
) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= text.len() {
            return None;
        }
        let end = match pattern {
            Pattern::O200k => o200k_end(text, start),
            Pattern::Cl100k => cl100k_end(text, start),
        };
        let piece = (start, end.max(start + 1));
        start = piece.1;
        Some(piece)
    })
}

/// `[^\s\p{L}\p{N}]`: punctuation, symbols, marks, controls.
#[inline(always)]
fn is_symbol(flags: u8) -> bool {
    flags & (SPACE | LETTER | NUMBER) == 0
}

/// `[^\r\n\p{L}\p{N}]`.
#[inline(always)]
fn is_prefix(flags: u8) -> bool {
    flags & (NEWLINE | LETTER | NUMBER) == 0
}

/// The flags of the character at byte `pos` and the position after it.
#[inline(always)]
fn at(text: &str, pos: usize) -> Option<(u8, usize)> {
    let byte = *text.as_bytes().get(pos)?;
    if byte < 0x80 {
        return Some((ascii_flags(byte), pos + 1));
    }
    at_non_ascii(text, pos)
}

fn at_non_ascii(text: &str, pos: usize) -> Option<(u8, usize)> {
    let c = text.get(pos..)?.chars().next()?;
    Some((flags(c), pos + c.len_utf8()))
}

/// The end of the run of characters with any of `any` from `pos`.
#[inline(always)]
fn run(text: &str, mut pos: usize, any: u8) -> usize {
    while let Some((flags, next)) = at(text, pos) {
        if flags & any == 0 {
            break;
        }
        pos = next;
    }
    pos
}

/// The end of the run of symbols (`[^\s\p{L}\p{N}]`) from `pos`.
#[inline(always)]
fn symbol_run(text: &str, mut pos: usize) -> usize {
    while let Some((flags, next)) = at(text, pos) {
        if !is_symbol(flags) {
            break;
        }
        pos = next;
    }
    pos
}

/// The end of a case-insensitive `'s 't 're 've 'm 'll 'd` at `pos`, if there is one there.
/// U+017F LATIN SMALL LETTER LONG S folds to `s` (the only non-ASCII fold of these letters).
#[inline(always)]
fn contraction_end(text: &str, pos: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    if bytes.get(pos) != Some(&b'\'') {
        return None;
    }
    let first = bytes.get(pos + 1)?.to_ascii_lowercase();
    let second = bytes.get(pos + 2).map(u8::to_ascii_lowercase);
    match (first, second) {
        (b's' | b't' | b'm' | b'd', _) => Some(pos + 2),
        (b'l', Some(b'l')) | (b'r' | b'v', Some(b'e')) => Some(pos + 3),
        (0xC5, Some(0xBF)) => Some(pos + 3), // ſ
        _ => None,
    }
}

/// Whitespace run from `pos`: its end, the start of its last character, the position of its
/// last CR/LF and whether it holds more than one character.
struct SpaceRun {
    end: usize,
    last_start: usize,
    last_newline: Option<usize>,
    several: bool,
}

#[inline(always)]
fn space_run(text: &str, pos: usize) -> SpaceRun {
    let mut run = SpaceRun {
        end: pos,
        last_start: pos,
        last_newline: None,
        several: false,
    };
    while let Some((flags, next)) = at(text, run.end) {
        if flags & SPACE == 0 {
            break;
        }
        run.several = run.end > pos;
        run.last_start = run.end;
        if flags & NEWLINE != 0 {
            run.last_newline = Some(run.end);
        }
        run.end = next;
    }
    run
}

/// ` ?[^\s\p{L}\p{N}]+` from a character with `flags` that ends at `next`: the end of the
/// symbol run, if the alternative matches.
#[inline(always)]
fn symbols_end(text: &str, flags: u8, next: usize) -> Option<usize> {
    if is_symbol(flags) {
        return Some(symbol_run(text, next));
    }
    if flags & BLANK != 0 {
        if let Some((after, after_next)) = at(text, next) {
            if is_symbol(after) {
                return Some(symbol_run(text, after_next));
            }
        }
    }
    None
}

/// o200k's `U* W+` from `pos`, the end of its match (before the contraction).
#[inline(always)]
fn o200k_lower_word_end(text: &str, pos: usize) -> Option<usize> {
    // `U*` greedy, remembering where the run's last `W` ends (where `W+` ends on backtracking)
    let mut end = pos;
    let mut last_lower_end = None;
    while let Some((flags, next)) = at(text, end) {
        if flags & UPPER == 0 {
            if flags & LOWER != 0 {
                return Some(run(text, next, LOWER));
            }
            break;
        }
        if flags & LOWER != 0 {
            last_lower_end = Some(next);
        }
        end = next;
    }
    last_lower_end
}

/// o200k's `U+ W*` from `pos`, the end of its match (before the contraction).
#[inline(always)]
fn o200k_upper_word_end(text: &str, pos: usize) -> Option<usize> {
    let end = run(text, pos, UPPER);
    (end > pos).then(|| run(text, end, LOWER))
}

/// `\p{N}{1,3}` after a first number ending at `pos`.
#[inline(always)]
fn numbers_end(text: &str, mut pos: usize) -> usize {
    for _ in 0..2 {
        match at(text, pos) {
            Some((flags, next)) if flags & NUMBER != 0 => pos = next,
            _ => break,
        }
    }
    pos
}

/// The end of the o200k piece starting at `pos` (`pos < text.len()`).
fn o200k_end(text: &str, pos: usize) -> usize {
    let Some((flags, next)) = at(text, pos) else {
        return text.len();
    };
    // each of the two word alternatives with its optional prefix taken first, then not
    let word = if !is_prefix(flags) {
        // a letter (a number or a newline starts no word)
        o200k_lower_word_end(text, pos).or_else(|| o200k_upper_word_end(text, pos))
    } else {
        o200k_lower_word_end(text, next)
            .or_else(|| o200k_lower_word_end(text, pos))
            .or_else(|| o200k_upper_word_end(text, next))
            .or_else(|| o200k_upper_word_end(text, pos))
    };
    if let Some(end) = word {
        return contraction_end(text, end).unwrap_or(end);
    }
    if flags & NUMBER != 0 {
        return numbers_end(text, next);
    }
    if let Some(end) = symbols_end(text, flags, next) {
        return run(text, end, NEWLINE | SLASH);
    }
    let run = space_run(text, pos);
    if let Some(newline) = run.last_newline {
        // `\s*[\r\n]+`: through the last newline (a newline is one byte)
        return newline + 1;
    }
    if run.end >= text.len() || !run.several {
        // `\s+(?!\S)` at the end of the text, or `\s+` for a single space
        return run.end.max(next);
    }
    run.last_start
}

/// The end of the cl100k piece starting at `pos` (`pos < text.len()`).
fn cl100k_end(text: &str, pos: usize) -> usize {
    let Some((flags, next)) = at(text, pos) else {
        return text.len();
    };
    if flags & LETTER != 0 {
        return run(text, next, LETTER);
    }
    if let Some(end) = contraction_end(text, pos) {
        return end;
    }
    if is_prefix(flags) {
        if let Some((after, after_next)) = at(text, next) {
            if after & LETTER != 0 {
                return run(text, after_next, LETTER);
            }
        }
    }
    if flags & NUMBER != 0 {
        return numbers_end(text, next);
    }
    if let Some(end) = symbols_end(text, flags, next) {
        return run(text, end, NEWLINE);
    }
    let run = space_run(text, pos);
    if run.end >= text.len() {
        // `\s++$`
        return run.end.max(next);
    }
    if let Some(newline) = run.last_newline {
        // `\s*[\r\n]`
        return newline + 1;
    }
    if run.several {
        // `\s+(?!\S)`
        return run.last_start;
    }
    // `\s`
    next
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn split(pattern: Pattern, text: &str) -> Vec<&str> {
        pieces(pattern, text).collect()
    }

    #[test]
    fn o200k_examples() {
        let cases: &[(&str, &[&str])] = &[
            ("hello world", &["hello", " world"]),
            ("Hello  World!!\n\n", &["Hello", " ", " World", "!!\n\n"]),
            ("don't DON'T", &["don't", " DON'T"]),
            ("CamelCase HTTPServer", &["Camel", "Case", " HTTPServer"]),
            ("12345 x", &["123", "45", " x"]),
            ("a  \n\n  b", &["a", "  \n\n", " ", " b"]),
            ("a   ", &["a", "   "]),
            (" /path/to", &[" /", "path", "/to"]),
            ("x,\r\n/y", &["x", ",\r\n/", "y"]),
            ("\t\tfoo", &["\t", "\tfoo"]),
            ("'s", &["'s"]),
        ];
        for (text, expected) in cases {
            assert_eq!(split(Pattern::O200k, text), *expected, "{text:?}");
        }
    }

    #[test]
    fn cl100k_examples() {
        let cases: &[(&str, &[&str])] = &[
            ("hello world", &["hello", " world"]),
            ("don't DON'T", &["don", "'t", " DON", "'T"]),
            ("CamelCase", &["CamelCase"]),
            ("12345 x", &["123", "45", " x"]),
            ("a  \n\n  b", &["a", "  \n\n", " ", " b"]),
            ("a   ", &["a", "   "]),
            ("x,\r\n/y", &["x", ",\r\n", "/y"]),
            ("'sup 'hello", &["'s", "up", " '", "hello"]),
        ];
        for (text, expected) in cases {
            assert_eq!(split(Pattern::Cl100k, text), *expected, "{text:?}");
        }
    }

    #[test]
    fn pieces_tile_any_text() {
        let text = "日本語 é\u{301}x\u{301}\u{301} 😀😀 \u{a0}\u{a0}a \r\n\t ٣٣٣٣ ſ'ſ";
        for pattern in [Pattern::O200k, Pattern::Cl100k] {
            let pieces = split(pattern, text);
            assert!(pieces.iter().all(|p| !p.is_empty()));
            assert_eq!(pieces.concat(), text);
        }
    }
}
