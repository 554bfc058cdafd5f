//! `shared::tokens::count_tokens` with the BPE counter (`tokenizer` feature): tiktoken's split
//! patterns written by hand, the embedded ranks and their index, the counting merge loops.
//!
//! Input: `encoding selector, text bytes` (invalid UTF-8 is replaced, as a gateway decoding a
//! body lossily would). Checked:
//! - no panic and no unbounded memory on any text (tiktoken-rs itself panics on long runs of
//!   whitespace; ours must not);
//! - empty text is 0 tokens, any other between 1 and its length in bytes (every token is at
//!   least one byte);
//! - on texts up to 256 bytes, the count equals tiktoken-rs's `encode_ordinary(..).len()`, the
//!   reference the counter replaced (longer texts are left out: the reference's regex has a
//!   backtrack limit it panics on).
#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_gateway_fuzz::Input;
use llm_gateway_shared::tokens::{count_tokens, Encoding};
use std::sync::OnceLock;
use tiktoken_rs::CoreBPE;

/// Longest text compared with the reference.
const REFERENCE_MAX: usize = 256;

fn reference(encoding: Encoding) -> &'static CoreBPE {
    static O200K: OnceLock<CoreBPE> = OnceLock::new();
    static CL100K: OnceLock<CoreBPE> = OnceLock::new();
    match encoding {
        Encoding::O200k => O200K.get_or_init(|| tiktoken_rs::o200k_base().unwrap()),
        _ => CL100K.get_or_init(|| tiktoken_rs::cl100k_base().unwrap()),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let encoding = if input.byte() & 1 == 0 {
        Encoding::O200k
    } else {
        Encoding::Cl100k
    };
    let text = String::from_utf8_lossy(input.rest());
    let n = count_tokens(encoding, &text);
    if text.is_empty() {
        assert_eq!(n, 0);
    } else {
        assert!(
            (1..=text.len() as u64).contains(&n),
            "{n} tokens for {} bytes",
            text.len()
        );
    }
    if text.len() <= REFERENCE_MAX {
        let expected = reference(encoding).encode_ordinary(&text).len() as u64;
        assert_eq!(n, expected, "{encoding:?} count of {text:?}");
    }
});
