//! Counting tokens when the upstream does not: a stream cut before its usage, a provider that
//! omits it, a client that went away.
//!
//! With the cargo feature `tokenizer`, OpenAI model families are counted exactly as tiktoken
//! counts them (`encode_ordinary`: `o200k_base` for GPT-4o / 4.1 / 5 and the o-series,
//! `cl100k_base` for GPT-4 / 3.5 and the embedding models), by a counter of our own built for
//! a VM that counts often and must stay small: the ranks are compact data embedded in the
//! module and indexed the first time an encoding is needed, then kept for the life of the VM
//! (4 MiB for o200k_base, 2 MiB for cl100k_base; never per request) ([`bpe`]); tiktoken's
//! split patterns are written out by hand, with the regex engine's Unicode classes, so there
//! is no regex and no backtrack limit ([`split`], [`classes`]); tiktoken's byte-pair merge is
//! reduced to counting, and the counts of merged pieces are memoized per VM (136 KiB per
//! encoding, exact: a hit compares the piece's bytes). The tests check the counts against
//! tiktoken-rs on arbitrary text in every script.
//!
//! A request body is read for its prompt without a parse tree
//! ([`estimate_body_tokens_sampled`], `body.rs`): the texts `serde_json` would give, in the
//! same order.
//!
//! Every other model (Anthropic, Gemini, Llama, …), and every model when the feature is off,
//! gets the cheap estimate `ceil(chars / 4)` (Unicode scalar values), OpenAI's rule of thumb
//! for English text; it is within ±20 % for English prose and worse for code and CJK text.
//! Records counted either way say `usage_source: "estimated"`.
//!
//! A prompt is estimated as `Σ over messages (tokens(text) + 4)`: the per-message overhead
//! of the chat format (role, separators). Embeddings count their inputs without overhead.

use crate::request::Api;
use serde_json::Value;

mod body;
#[cfg(feature = "tokenizer")]
mod bpe;
#[cfg(feature = "tokenizer")]
mod classes;
mod encoding;
#[cfg(all(test, feature = "tokenizer", not(target_arch = "wasm32")))]
mod reference_tests;
#[cfg(feature = "tokenizer")]
mod split;

pub use encoding::{Encoding, MESSAGE_OVERHEAD};

/// Tokens of `text` under `encoding` (0 for empty text).
pub fn count_tokens(encoding: Encoding, text: &str) -> u64 {
    if text.is_empty() {
        return 0;
    }
    match encoding {
        #[cfg(feature = "tokenizer")]
        Encoding::O200k | Encoding::Cl100k => {
            bpe::count(encoding, text).unwrap_or_else(|| count_chars(text))
        }
        _ => count_chars(text),
    }
}

/// `ceil(chars / 4)`.
pub fn count_chars(text: &str) -> u64 {
    let chars = text.chars().count() as u64;
    chars.div_ceil(4)
}

/// Estimates the prompt tokens of a request body (already parsed).
pub fn estimate_prompt_tokens(api: Api, body: &Value, encoding: Encoding) -> u64 {
    estimate_with(api, body, &|text: &str| count_tokens(encoding, text))
}

/// Like [`estimate_prompt_tokens`], but runs the tokenizer over at most `sample_bytes` of the
/// prompt's text and counts the rest at the rate (tokens per byte) measured on that sample.
///
/// The BPE costs about 40 µs per KiB in wasm, so counting every byte of a 256 KiB prompt
/// would add ~10 ms to a request; a request-path estimate (a rate-limit reservation, settled
/// later from the provider's count) needs the rate, not every token. Text is sampled in
/// order, so prompts up to `sample_bytes` are counted exactly. Encodings without BPE ranks
/// (chars/4) are cheap and counted in full.
pub fn estimate_prompt_tokens_sampled(
    api: Api,
    body: &Value,
    encoding: Encoding,
    sample_bytes: usize,
) -> u64 {
    let tokenize = |text: &str| count_tokens(encoding, text);
    with_sampled_counter(encoding, sample_bytes, &tokenize, |count| {
        estimate_with(api, body, count)
    })
}

/// [`estimate_prompt_tokens_sampled`] read straight from the bytes of a body that
/// [`crate::json::scan_object`] accepted, without parsing it into a `Value`: the same count.
/// `None` for a body `serde_json` might refuse or read otherwise (a surrogate escape that is
/// no pair, a number with an exponent or hundreds of digits): parse it with `serde_json` and
/// call [`estimate_prompt_tokens_sampled`] then.
pub fn estimate_body_tokens_sampled(
    api: Api,
    body: &[u8],
    encoding: Encoding,
    sample_bytes: usize,
) -> Option<u64> {
    with_sampled_counter(
        encoding,
        sample_bytes,
        &|text: &str| count_tokens(encoding, text),
        |count| body::estimate(api, body, count),
    )
}

/// [`estimate_body_tokens_sampled`] of a body already read as text (a caller that validated
/// its UTF-8 once, for [`crate::json::scan_object_text`] too), with the tokenizer's counts
/// supplied by the caller: `tokenize(text)` must answer `count_tokens(encoding, text)` (a
/// cache of it, say: a conversation resends its earlier messages with every turn). It is
/// asked only for the texts of the sample, and only when `encoding` counts with BPE ranks.
pub fn estimate_text_tokens_sampled_with(
    api: Api,
    body: &str,
    encoding: Encoding,
    sample_bytes: usize,
    tokenize: &dyn Fn(&str) -> u64,
) -> Option<u64> {
    with_sampled_counter(encoding, sample_bytes, tokenize, |count| {
        body::estimate_text(api, body, count)
    })
}

/// Runs `f` with the counter of [`estimate_prompt_tokens_sampled`], which counts the sample's
/// texts with `tokenize` (`count_tokens` of `encoding`).
fn with_sampled_counter<R>(
    encoding: Encoding,
    sample_bytes: usize,
    tokenize: &dyn Fn(&str) -> u64,
    f: impl FnOnce(&dyn Fn(&str) -> u64) -> R,
) -> R {
    if !encoding.is_exact() {
        return f(&|text: &str| count_tokens(encoding, text));
    }
    // (bytes counted with the tokenizer, their tokens)
    let sample = std::cell::Cell::new((0usize, 0u64));
    let count = |text: &str| -> u64 {
        let (bytes, tokens) = sample.get();
        let room = sample_bytes.saturating_sub(bytes);
        if text.len() <= room {
            let n = tokenize(text);
            sample.set((bytes + text.len(), tokens.saturating_add(n)));
            return n;
        }
        let mut cut = room;
        while cut > 0 && !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let (head, tail) = text.split_at_checked(cut).unwrap_or(("", text));
        let head_tokens = tokenize(head);
        let (bytes, tokens) = (bytes + head.len(), tokens.saturating_add(head_tokens));
        sample.set((bytes, tokens));
        let tail_tokens = if bytes == 0 || tokens == 0 {
            count_chars(tail)
        } else {
            let n = (tail.len() as u128 * u128::from(tokens)).div_ceil(bytes as u128);
            u64::try_from(n).unwrap_or(u64::MAX)
        };
        head_tokens.saturating_add(tail_tokens)
    };
    f(&count)
}

fn estimate_with(api: Api, body: &Value, count: &dyn Fn(&str) -> u64) -> u64 {
    let message = |content: Option<&Value>| -> u64 {
        count_content(content, count).saturating_add(MESSAGE_OVERHEAD)
    };
    let total = match api {
        Api::ChatCompletions => each(body.get("messages"))
            .map(|m| message(m.get("content")))
            .fold(0u64, u64::saturating_add),
        Api::AnthropicMessages => {
            let system = body.get("system").map_or(0, |s| message(Some(s)));
            each(body.get("messages"))
                .map(|m| message(m.get("content")))
                .fold(system, u64::saturating_add)
        }
        Api::Responses => {
            let instructions = body.get("instructions").map_or(0, |s| message(Some(s)));
            let input = match body.get("input") {
                Some(Value::String(text)) => message(Some(&Value::String(text.clone()))),
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|item| match item {
                        Value::String(_) => message(Some(item)),
                        _ => message(item.get("content")),
                    })
                    .fold(0u64, u64::saturating_add),
                _ => 0,
            };
            input.saturating_add(instructions)
        }
        Api::Embeddings => match body.get("input") {
            Some(Value::String(text)) => count(text),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| match item {
                    Value::String(text) => count(text),
                    Value::Array(ids) => ids.len() as u64, // pre-tokenized
                    Value::Number(_) => 1,
                    _ => 0,
                })
                .fold(0u64, u64::saturating_add),
            _ => 0,
        },
    };
    total.max(1)
}

fn each(value: Option<&Value>) -> impl Iterator<Item = &Value> {
    value.and_then(Value::as_array).into_iter().flatten()
}

/// Tokens of a `content`: a string, or the text parts of an array.
fn count_content(content: Option<&Value>, count: &dyn Fn(&str) -> u64) -> u64 {
    match content {
        Some(Value::String(text)) => count(text),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|part| {
                matches!(
                    part.get("type").and_then(Value::as_str),
                    Some("text" | "input_text" | "output_text") | None
                )
            })
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .map(count)
            .fold(0u64, u64::saturating_add),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn model_families() {
        assert_eq!(Encoding::for_model("gpt-4o-mini"), Encoding::O200k);
        assert_eq!(Encoding::for_model("openai/gpt-5"), Encoding::O200k);
        assert_eq!(Encoding::for_model("o3-mini"), Encoding::O200k);
        assert_eq!(Encoding::for_model("gpt-4-turbo"), Encoding::Cl100k);
        assert_eq!(
            Encoding::for_model("text-embedding-3-small"),
            Encoding::Cl100k
        );
        assert_eq!(Encoding::for_model("claude-sonnet-4-5"), Encoding::Chars);
    }

    #[test]
    fn sampling_counts_small_prompts_exactly_and_extrapolates_large_ones() {
        let text = "The quick brown fox jumps over the lazy dog, and then it rests. ".repeat(400);
        let body = json!({"messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": text}
        ]});
        for encoding in [Encoding::O200k, Encoding::Chars] {
            let exact = estimate_prompt_tokens(Api::ChatCompletions, &body, encoding);
            // a sample larger than the prompt: exact
            assert_eq!(
                estimate_prompt_tokens_sampled(Api::ChatCompletions, &body, encoding, 1 << 20),
                exact
            );
            // a 2 KiB sample of a ~25 KiB prompt: within 2 %
            let sampled =
                estimate_prompt_tokens_sampled(Api::ChatCompletions, &body, encoding, 2048);
            let error = (sampled as f64 - exact as f64).abs() / exact as f64;
            assert!(error < 0.02, "{encoding:?}: {sampled} vs {exact}");
        }
        // no sample at all: chars/4
        let tail_only = estimate_prompt_tokens_sampled(
            Api::ChatCompletions,
            &json!({"messages": [{"content": "abcdefgh"}]}),
            Encoding::O200k,
            0,
        );
        assert_eq!(tail_only, 2 + MESSAGE_OVERHEAD);
        // a cut never splits a character
        let cjk = json!({"messages": [{"content": "日本語のテキスト".repeat(50)}]});
        assert!(estimate_prompt_tokens_sampled(Api::ChatCompletions, &cjk, Encoding::O200k, 7) > 0);
    }

    #[test]
    fn chars_estimate() {
        assert_eq!(count_tokens(Encoding::Chars, ""), 0);
        assert_eq!(count_tokens(Encoding::Chars, "abc"), 1);
        assert_eq!(count_tokens(Encoding::Chars, "abcde"), 2);
        assert_eq!(count_tokens(Encoding::Chars, "ééééé"), 2);
    }

    #[test]
    fn prompt_estimate_matches_the_chars_formula() {
        // the mock upstream's formula: Σ (ceil(chars/4) + 4)
        let chat = json!({"messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Say hello"}, {"type": "image_url"}]}
        ]});
        assert_eq!(
            estimate_prompt_tokens(Api::ChatCompletions, &chat, Encoding::Chars),
            (3 + 4) + (3 + 4)
        );
        let anthropic =
            json!({"system": "Be brief.", "messages": [{"role": "user", "content": "Say hello"}]});
        assert_eq!(
            estimate_prompt_tokens(Api::AnthropicMessages, &anthropic, Encoding::Chars),
            14
        );
        let responses = json!({"input": "Say hello", "instructions": "Be brief."});
        assert_eq!(
            estimate_prompt_tokens(Api::Responses, &responses, Encoding::Chars),
            14
        );
        let embeddings = json!({"input": ["abcd", "abcdefgh"]});
        assert_eq!(
            estimate_prompt_tokens(Api::Embeddings, &embeddings, Encoding::Chars),
            3
        );
        assert_eq!(
            estimate_prompt_tokens(Api::ChatCompletions, &json!({}), Encoding::Chars),
            1
        );
    }

    /// `(text, o200k_base tokens, cl100k_base tokens)`, from tiktoken (`reference_tests`
    /// checks them against tiktoken-rs natively; here they check the wasm build too).
    pub(super) const KNOWN_COUNTS: &[(&str, u64, u64)] = &[
        ("hello world", 2, 2),
        ("tiktoken is great!", 6, 6),
        ("don't DON'T I'M here", 5, 7),
        ("  indented\n\n\tcode();  \n", 7, 7),
        ("日本語のテキスト", 6, 8),
        ("e\u{301}te\u{301} ſ'ſ 👩\u{200d}👩\u{200d}👧", 16, 21),
        (MULTILINGUAL, 286, 455),
    ];

    /// Chinese, Japanese, Russian, Arabic, Hindi, Thai, Korean, French, NFD accents, German,
    /// Greek, title case, long s, emoji with joiners and modifiers, Unicode spaces.
    pub(super) const MULTILINGUAL: &str = "\
日本語のテキストを数えます。東京タワーは333メートルです。カタカナ：コンピューター、ｶﾀｶﾅ。
中文：今天天气很好，我们去公园散步吧！价格是¥1,234.56。
Русский: Съешь же ещё этих мягких французских булок, да выпей чаю. МОСКВА 2024 г.
العربية: مرحبا بالعالم، كيف حالك اليوم؟ الأرقام ١٢٣٤٥٦٧٨٩٠.
हिन्दी: नमस्ते दुनिया, यह एक परीक्षण है। क्षत्रिय २०२४
ภาษาไทย: สวัสดีชาวโลก  한국어: 안녕하세요 세계
Français : « Où est l'hôtel ? » — Ça coûte 12,50 € ; naïve façade, Œuvre.
NFD: Cafe\u{301} re\u{301}sume\u{301} U\u{308}ber A\u{30a}ngstro\u{308}m
Deutsch: Straße, STRASSE, Grüße; Ελληνικά: Καλημέρα κόσμε; ǅemal ǈubljana ſ'ſ
Emoji: 😀 👍🏽 👩\u{200d}👩\u{200d}👧 🇫🇷🇯🇵 ✔️ ❤\u{fe0f} — Ⅻ ½ ² Ⓐ\u{a0}\u{a0}end\u{3000}\u{3000}x\u{2028}y
";

    #[cfg(feature = "tokenizer")]
    #[test]
    fn bpe_counts_known_strings() {
        for &(text, o200k, cl100k) in KNOWN_COUNTS {
            assert_eq!(count_tokens(Encoding::O200k, text), o200k, "{text:?}");
            assert_eq!(count_tokens(Encoding::Cl100k, text), cl100k, "{text:?}");
        }
    }

    #[cfg(feature = "tokenizer")]
    #[test]
    fn bpe_counts_long_and_hostile_text_without_panicking() {
        // whitespace runs (tiktoken-rs panicked on its regex's backtrack limit on these)
        for encoding in [Encoding::O200k, Encoding::Cl100k] {
            for space in [" ", "\n", "\t", "\r\n", " \n", "\u{3000}"] {
                let run = space.repeat(40_000);
                assert!(count_tokens(encoding, &run) > 0);
                assert!(count_tokens(encoding, &format!("a{run}b")) > 2);
            }
        }
        // a 1 MB word: counted in 16 KiB parts, each merged exactly
        let word = "abcdefghij".repeat(100_000);
        let n = count_tokens(Encoding::O200k, &word);
        assert!(n > 100_000 && n < 1_000_000, "{n}");
        let mixed = "日本語 ".repeat(5_000) + &"\n".repeat(10_000);
        assert!(count_tokens(Encoding::Cl100k, &mixed) > 0);
        // arbitrary bytes, as a gateway may receive them
        let bytes: Vec<u8> = (0..200_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let text = String::from_utf8_lossy(&bytes);
        for encoding in [Encoding::O200k, Encoding::Cl100k] {
            assert!(count_tokens(encoding, &text) > 0);
        }
    }
}
