//! `cargo bench -p llm-gateway-shared --bench tokens`: time to count the tokens of a few texts
//! with this crate's counter and with tiktoken-rs's `CoreBPE::encode_ordinary` (what it
//! replaced), and the one-time cost of building each. Medians of repeated runs; asserts that
//! both count the same, nothing about time.

use llm_gateway_shared::tokens::{count_tokens, Encoding};
use std::hint::black_box;
use std::time::{Duration, Instant};

const PARAGRAPH: &str = "The quarterly review covers onboarding, billing disputes and the \
    migration plan for the reporting service. Please keep the tone neutral, summarise the open \
    questions, and list the owners for each follow-up item so the team can plan next week. ";

fn median(f: &mut dyn FnMut(), runs: usize) -> Duration {
    let mut samples: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let prose = PARAGRAPH.repeat(18); // ~4.5 KB of English prose
    let readme = include_str!("../../README.md");
    let code = include_str!("../src/json.rs");
    let cjk =
        "日本語のテキストを数えます。東京タワーは333メートルです。中文：今天天气很好。".repeat(40);
    let word = "abcdefghij".repeat(100_000);
    let spaces = " ".repeat(100_000);
    let texts: [(&str, &str); 6] = [
        ("4.5 KB English prose", &prose),
        ("README.md (Markdown)", readme),
        ("shared/src/json.rs (Rust)", code),
        ("CJK text", &cjk),
        ("a 1 MB word", &word),
        ("100 000 spaces", &spaces),
    ];
    println!("| encoding | text | bytes | tokens | this crate | tiktoken-rs | speed-up |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for encoding in [Encoding::O200k, Encoding::Cl100k] {
        let start = Instant::now();
        count_tokens(encoding, "hello world");
        let ours_build = start.elapsed();
        let start = Instant::now();
        let reference = match encoding {
            Encoding::O200k => tiktoken_rs::o200k_base(),
            _ => tiktoken_rs::cl100k_base(),
        }
        .unwrap();
        let theirs_build = start.elapsed();
        println!(
            "| {} | (first use: build) | | | {:.1} ms | {:.1} ms | |",
            encoding.name(),
            ours_build.as_secs_f64() * 1e3,
            theirs_build.as_secs_f64() * 1e3
        );
        for (name, text) in texts {
            let big = text.len() > 100_000;
            let runs = if big { 3 } else { 51 };
            let ours = count_tokens(encoding, text);
            let ours_time = median(
                &mut || {
                    black_box(count_tokens(encoding, black_box(text)));
                },
                runs,
            );
            // tiktoken-rs panics on its regex's backtrack limit on long whitespace runs
            let theirs = if name.contains("spaces") {
                None
            } else {
                let n = reference.encode_ordinary(text).len() as u64;
                let time = median(
                    &mut || {
                        black_box(reference.encode_ordinary(black_box(text)));
                    },
                    runs,
                );
                Some((n, time))
            };
            if let Some((n, _)) = theirs {
                if !big {
                    assert_eq!(ours, n, "{name}");
                }
            }
            let us = |d: Duration| format!("{:.1} µs", d.as_secs_f64() * 1e6);
            println!(
                "| {} | {name} | {} | {ours} | {} | {} | {} |",
                encoding.name(),
                text.len(),
                us(ours_time),
                theirs.map_or("panics".into(), |(_, t)| us(t)),
                theirs.map_or(String::new(), |(_, t)| format!(
                    "{:.1}×",
                    t.as_secs_f64() / ours_time.as_secs_f64()
                )),
            );
        }
    }
}
