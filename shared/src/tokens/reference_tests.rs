//! The counter against the reference it replaces (native only): the split against
//! tiktoken-rs's regexes run by fancy-regex, the count against tiktoken-rs's
//! `encode_ordinary(..).len()`, on arbitrary text and on real samples, for both encodings.

use super::split::{pieces, Pattern};
use super::tests::{KNOWN_COUNTS, MULTILINGUAL};
use super::{count_tokens, Encoding};
use proptest::prelude::*;
use std::sync::OnceLock;
use tiktoken_rs::CoreBPE;

/// cl100k_base's split pattern, as `tiktoken_rs::cl100k_base()` builds it.
const CL100K_PATTERN: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s";

fn regex(pattern: Pattern) -> &'static fancy_regex::Regex {
    static O200K: OnceLock<fancy_regex::Regex> = OnceLock::new();
    static CL100K: OnceLock<fancy_regex::Regex> = OnceLock::new();
    match pattern {
        Pattern::O200k => {
            O200K.get_or_init(|| fancy_regex::Regex::new(tiktoken_rs::O200K_BASE_PAT_STR).unwrap())
        }
        Pattern::Cl100k => CL100K.get_or_init(|| fancy_regex::Regex::new(CL100K_PATTERN).unwrap()),
    }
}

fn reference(encoding: Encoding) -> &'static CoreBPE {
    match encoding {
        Encoding::O200k => tiktoken_rs::o200k_base_singleton(),
        _ => tiktoken_rs::cl100k_base_singleton(),
    }
}

fn pattern(encoding: Encoding) -> Pattern {
    match encoding {
        Encoding::O200k => Pattern::O200k,
        _ => Pattern::Cl100k,
    }
}

const ENCODINGS: [Encoding; 2] = [Encoding::O200k, Encoding::Cl100k];

/// Asserts the split and the count of `text` equal the reference's, for both encodings.
fn assert_same(text: &str) -> Result<(), TestCaseError> {
    for encoding in ENCODINGS {
        let ours: Vec<&str> = pieces(pattern(encoding), text).collect();
        let theirs: Vec<&str> = regex(pattern(encoding))
            .find_iter(text)
            .map(|m| m.unwrap().as_str())
            .collect();
        prop_assert_eq!(&ours, &theirs, "{:?} split of {:?}", encoding, text);
        let expected = reference(encoding).encode_ordinary(text).len() as u64;
        prop_assert_eq!(
            count_tokens(encoding, text),
            expected,
            "{:?} count of {:?}",
            encoding,
            text
        );
    }
    Ok(())
}

/// Characters and fragments where the patterns' alternatives meet: both cases, digits, every
/// ASCII space, apostrophes and contractions, punctuation, `/`.
fn ascii_fragment() -> impl Strategy<Value = String> {
    static FRAGMENTS: &[&str] = &[
        "a",
        "b",
        "e",
        "s",
        "t",
        "z",
        "A",
        "B",
        "E",
        "S",
        "T",
        "Z",
        "hello",
        "World",
        "HTTP",
        "Server",
        "camelCase",
        "x1",
        "0",
        "7",
        "42",
        "12345",
        " ",
        "  ",
        "    ",
        "\t",
        "\r",
        "\n",
        "\r\n",
        "\n\n",
        " \n",
        "\n ",
        "\x0b",
        "\x0c",
        "'",
        "'s",
        "'S",
        "'t",
        "'re",
        "'RE",
        "'ve",
        "'m",
        "'ll",
        "'Ll",
        "'d",
        "'x",
        "don't",
        "I'M",
        ".",
        ",",
        "!",
        "?",
        "-",
        "_",
        "(",
        ")",
        "{",
        "}",
        "[",
        "]",
        "\"",
        ":",
        ";",
        "#",
        "*",
        "=",
        "<",
        ">",
        "/",
        "//",
        "\\",
        "@",
        "$",
        "%",
        "^",
        "&",
        "|",
        "~",
        "`",
        "+",
        "\x00",
        "\x1f",
        "\x7f",
    ];
    prop::sample::select(FRAGMENTS).prop_map(String::from)
}

/// Non-ASCII fragments: CJK, kana, Cyrillic, Arabic, Devanagari, Thai, Hangul, accents
/// composed and decomposed (NFD), title case, long s, letter numbers, other digits, Unicode
/// spaces and line separators, emoji with joiners and modifiers, lone marks.
fn unicode_fragment() -> impl Strategy<Value = String> {
    static FRAGMENTS: &[&str] = &[
        "日本語",
        "の",
        "テキスト",
        "ｶﾀｶﾅ",
        "ー",
        "中文字符",
        "Привет",
        "мир",
        "ПРИВЕТ",
        "مرحبا",
        "العالم",
        "क्षत्रिय",
        "हिन्दी",
        "ภาษาไทย",
        "한국어",
        "é",
        "É",
        "e\u{301}",
        "E\u{301}",
        "\u{301}",
        "\u{301}\u{308}",
        "\u{93F}",
        "ǅ",
        "ǈa",
        "ſ",
        "'ſ",
        "Ⅻ",
        "ⅻ",
        "٣",
        "१२३",
        "²",
        "½",
        "\u{a0}",
        "\u{3000}",
        "\u{2009}",
        "\u{2028}",
        "\u{2029}",
        "\u{85}",
        "\u{200b}",
        "\u{feff}",
        "😀",
        "👩\u{200d}👩\u{200d}👧",
        "👍🏽",
        "🇫🇷",
        "Ⓐ",
        "€",
        "ß",
        "ẞ",
        "ﬁ",
        "İ",
        "ı",
        "Ω",
        "ω",
        "µ",
        "\u{1d400}",
        "\u{10ffff}",
    ];
    prop_oneof![
        prop::sample::select(FRAGMENTS).prop_map(String::from),
        any::<char>().prop_map(String::from),
    ]
}

fn text_of(fragment: impl Strategy<Value = String>, max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(fragment, 0..max).prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn ascii_text_is_split_and_counted_exactly(text in text_of(ascii_fragment(), 60)) {
        assert_same(&text)?;
    }

    #[test]
    fn ascii_characters_are_split_and_counted_exactly(
        text in "[a-zA-Z0-9 \t\r\n'./,!?_(){}\\[\\]\"-]{0,200}"
    ) {
        assert_same(&text)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn unicode_text_is_split_and_counted_exactly(
        text in text_of(prop_oneof![ascii_fragment(), unicode_fragment()], 40)
    ) {
        assert_same(&text)?;
    }

    /// Long single pieces: the merge loops (ours switch at 32 bytes, tiktoken's at 100).
    #[test]
    fn long_pieces_are_merged_exactly(
        word in "[a-z]{90,400}|[A-Za-z]{90,400}|[ \t]{90,400}|[.=*-]{90,400}|[a-zé日]{40,150}"
    ) {
        assert_same(&word)?;
        assert_same(&format!(" {word}x"))?;
    }
}

/// The counts the tests of `tokens` (which also run in wasm) take as known are tiktoken's.
#[test]
fn known_counts_are_tiktoken_counts() {
    for &(text, o200k, cl100k) in KNOWN_COUNTS {
        for (encoding, known) in [(Encoding::O200k, o200k), (Encoding::Cl100k, cl100k)] {
            let expected = reference(encoding).encode_ordinary(text).len() as u64;
            assert_eq!(known, expected, "{encoding:?} {text:?}");
        }
    }
}

/// Prose, code, JSON and Markdown of this repository, and a multilingual sample: counted
/// exactly (the split uses the regex engine's own Unicode classes, so no tolerance is needed).
#[test]
fn samples_are_counted_exactly() {
    let samples = [
        include_str!("../../../README.md"),
        include_str!("../../../docs/operator-guide.md"),
        include_str!("../../../docs/architecture.md"),
        include_str!("../json.rs"),
        include_str!("split.rs"),
        include_str!("../../../Cargo.toml"),
        include_str!("../../../envoy-config/gateway.yaml"),
        MULTILINGUAL,
    ];
    let json = serde_json::json!({
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": MULTILINGUAL}, {"role": "assistant", "content": samples[0]}],
        "temperature": 0.2, "n": 1, "stream": true, "tools": [{"type": "function"}],
    });
    let pretty = serde_json::to_string_pretty(&json).unwrap();
    let compact = json.to_string();
    for text in samples
        .into_iter()
        .chain([pretty.as_str(), compact.as_str()])
    {
        assert_same(text).unwrap();
    }
}
