//! How a model's text becomes tokens: its [`Encoding`] (tiktoken's BPE encodings, or
//! `ceil(chars / 4)`) and the chat formats' per-message overhead on top. Below both the
//! counting functions of [`super`] and the counters they call (`bpe.rs`, `body.rs`).

/// How to count a model's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// tiktoken `o200k_base` (GPT-4o, GPT-4.1, GPT-5, o1/o3/o4, gpt-oss).
    O200k,
    /// tiktoken `cl100k_base` (GPT-4, GPT-3.5, text-embedding-3 / ada-002).
    Cl100k,
    /// `ceil(chars / 4)`: every other model.
    Chars,
}

impl Encoding {
    /// The encoding of a model name (a provider prefix such as `openai/` or `azure/` is
    /// ignored).
    pub fn for_model(model: &str) -> Encoding {
        let name = model.rsplit('/').next().unwrap_or(model);
        let name = name.to_ascii_lowercase();
        let starts = |prefixes: &[&str]| prefixes.iter().any(|p| name.starts_with(p));
        if starts(&[
            "gpt-4o",
            "gpt-4.1",
            "gpt-4.5",
            "gpt-5",
            "chatgpt-4o",
            "gpt-oss",
            "o1",
            "o3",
            "o4",
        ]) {
            Encoding::O200k
        } else if starts(&["gpt-4", "gpt-3.5", "gpt-35", "text-embedding-"]) {
            Encoding::Cl100k
        } else {
            Encoding::Chars
        }
    }

    /// Name in records and docs.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::O200k => "o200k_base",
            Encoding::Cl100k => "cl100k_base",
            Encoding::Chars => "chars/4",
        }
    }

    /// True if this encoding counts with real BPE ranks in this build.
    pub fn is_exact(self) -> bool {
        cfg!(feature = "tokenizer") && self != Encoding::Chars
    }
}

/// Per-message overhead of the chat formats.
pub const MESSAGE_OVERHEAD: u64 = 4;
