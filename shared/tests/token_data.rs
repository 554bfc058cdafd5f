//! The token counter's data under `shared/data/` is exactly what it is generated from, so it
//! cannot drift: the BPE ranks from tiktoken-rs (OpenAI's `o200k_base` / `cl100k_base`), the
//! Unicode classes from regex-syntax (the tables of the regex engine tiktoken-rs splits text
//! with). `shared/data/README.md`, `src/tokens/bpe.rs` and `src/tokens/classes.rs` document the formats.
//!
//! `REGENERATE=1 cargo test -p llm-gateway-shared --test token_data` rewrites the files (after a
//! tiktoken-rs or regex-syntax upgrade); without it the tests compare and fail on a difference.
#![cfg(not(target_arch = "wasm32"))]

use regex_syntax::hir::{Class, HirKind};
use std::path::PathBuf;
use tiktoken_rs::CoreBPE;

fn data_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(name)
}

/// Writes `generated` under `REGENERATE=1`, else asserts the committed file equals it.
fn check_or_write(name: &str, generated: &[u8]) {
    let path = data_path(name);
    if std::env::var_os("REGENERATE").is_some() {
        std::fs::write(&path, generated).unwrap();
        eprintln!("wrote {} ({} bytes)", path.display(), generated.len());
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} differs from what it is generated from ({} vs {} bytes): \
         REGENERATE=1 cargo test -p llm-gateway-shared --test token_data",
        path.display(),
        committed.len(),
        generated.len()
    );
}

/// The ordinary tokens of `bpe` in rank order: ranks 0, 1, 2, … up to the first rank that is
/// not an ordinary token (the special tokens sit after a gap).
fn ordinary_tokens(bpe: &CoreBPE) -> Vec<Vec<u8>> {
    let specials: Vec<String> = bpe.special_tokens().into_iter().map(String::from).collect();
    let is_special = |bytes: &[u8]| specials.iter().any(|s| s.as_bytes() == bytes);
    let mut tokens = Vec::new();
    for rank in 0u32.. {
        match bpe.decode_bytes(&[rank]) {
            Ok(bytes) if !is_special(&bytes) => tokens.push(bytes),
            _ => break,
        }
    }
    // nothing ordinary after the gap: every decodable rank further up is a special token
    let n = tokens.len() as u32;
    for rank in n..n + 4096 {
        if let Ok(bytes) = bpe.decode_bytes(&[rank]) {
            assert!(is_special(&bytes), "ordinary rank {rank} after the gap");
        }
    }
    tokens
}

/// `[u8 length, bytes]` per rank, in rank order.
fn ranks_file(bpe: &CoreBPE) -> Vec<u8> {
    let mut out = Vec::new();
    let tokens = ordinary_tokens(bpe);
    for token in &tokens {
        let len = u8::try_from(token.len()).expect("a token longer than 255 bytes");
        assert!(len > 0);
        out.push(len);
        out.extend_from_slice(token);
    }
    // every single byte is a token (byte-level BPE: any text can be encoded)
    for byte in 0..=255u8 {
        assert!(
            tokens.iter().any(|t| t == &[byte]),
            "byte {byte} is no token"
        );
    }
    let longest = tokens.iter().map(Vec::len).max().unwrap_or(0);
    eprintln!(
        "{} ranks, longest {longest} bytes, file {} bytes",
        tokens.len(),
        out.len()
    );
    out
}

#[test]
fn o200k_base_ranks_are_tiktoken_rs_ranks() {
    check_or_write(
        "o200k_base.ranks",
        &ranks_file(&tiktoken_rs::o200k_base().unwrap()),
    );
}

#[test]
fn cl100k_base_ranks_are_tiktoken_rs_ranks() {
    check_or_write(
        "cl100k_base.ranks",
        &ranks_file(&tiktoken_rs::cl100k_base().unwrap()),
    );
}

fn class_ranges(pattern: &str) -> Vec<(u32, u32)> {
    let hir = regex_syntax::Parser::new().parse(pattern).unwrap();
    match hir.kind() {
        HirKind::Class(Class::Unicode(class)) => class
            .ranges()
            .iter()
            .map(|r| (u32::from(r.start()), u32::from(r.end())))
            .collect(),
        other => panic!("{pattern} is no Unicode class: {other:?}"),
    }
}

/// The class codes of `shared/src/tokens/data.rs` (`Class`), by the regex classes each means.
const CLASSES: [(u8, &str); 6] = [
    (1, r"[\p{Lu}\p{Lt}]"),
    (2, r"\p{Ll}"),
    (3, r"[\p{Lm}\p{Lo}]"),
    (4, r"\p{M}"),
    (5, r"\p{N}"),
    (6, r"\s"),
];

/// `u32` little-endian per range, `first code point << 8 | class`, ranges in order, each
/// running to the next one's start (the last to U+10FFFF).
fn classes_file() -> Vec<u8> {
    let mut class = vec![0u8; 0x11_0000];
    for (code, pattern) in CLASSES {
        for (start, end) in class_ranges(pattern) {
            for c in start..=end {
                let slot = &mut class[c as usize];
                assert_eq!(*slot, 0, "U+{c:04X} in two classes");
                *slot = code;
            }
        }
    }
    let mut out = Vec::new();
    let mut ranges = 0;
    for (c, &code) in class.iter().enumerate() {
        if c == 0 || class[c - 1] != code {
            out.extend_from_slice(&((c as u32) << 8 | u32::from(code)).to_le_bytes());
            ranges += 1;
        }
    }
    eprintln!("{ranges} class ranges, file {} bytes", out.len());
    out
}

#[test]
fn unicode_classes_are_regex_syntax_classes() {
    check_or_write("unicode_classes.bin", &classes_file());
}

/// The contractions' case-insensitive letters fold as the counter assumes (only `s` has a
/// non-ASCII fold, U+017F LATIN SMALL LETTER LONG S).
#[test]
fn contraction_letters_fold_as_the_counter_assumes() {
    for letter in ['s', 't', 'd', 'm', 'l', 'v', 'r', 'e'] {
        let ranges = class_ranges(&format!("(?i:{letter})"));
        let upper = u32::from(letter.to_ascii_uppercase());
        let lower = u32::from(letter);
        let mut expected = vec![(upper, upper), (lower, lower)];
        if letter == 's' {
            expected.push((0x17F, 0x17F));
        }
        assert_eq!(ranges, expected, "(?i:{letter})");
    }
}
