//! `cargo bench -p model-router --bench rewrite`: what reading and rewriting `model` costs on
//! a 4 KB and a 256 KB chat request, against a full `serde_json` parse + re-serialise of the
//! same body (what a naive router would do). Medians of 31 rounds; figures only, no
//! assertions. The compiled plugin's wasm cost (fuel) needs the proxy-wasm harness.

use model_router::body::{rewrite_model, Body};
use std::hint::black_box;
use std::time::{Duration, Instant};

fn chat_body(target_bytes: usize) -> Vec<u8> {
    let mut messages = Vec::new();
    let mut size = 0;
    let mut i = 0;
    while size < target_bytes {
        let content = format!(
            "Message {i}: the quick brown fox jumps over the lazy dog, \"quoted\" text, unicode \u{e9}\u{4e2d}, numbers 12345. "
        )
        .repeat(3);
        size += content.len() + 40;
        messages.push(serde_json::json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": content}));
        i += 1;
    }
    serde_json::to_vec(&serde_json::json!({
        "model": "fast",
        "messages": messages,
        "temperature": 0.2,
        "stream": true,
        "max_tokens": 512
    }))
    .unwrap_or_default()
}

fn median<F: FnMut()>(rounds: usize, iterations: usize, mut f: F) -> Duration {
    let mut samples: Vec<Duration> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iterations {
                f();
            }
            start.elapsed() / u32::try_from(iterations).unwrap_or(1)
        })
        .collect();
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    println!(
        "{:<10} {:>10} {:>16} {:>16} {:>18}",
        "body", "bytes", "parse+rewrite", "upstream rewrite", "serde_json full"
    );
    for (label, target, iterations) in [("4 KB", 4 * 1024, 2000), ("256 KB", 256 * 1024, 40)] {
        let body = chat_body(target);
        let routed = Body::parse(&body)
            .map(|b| b.with_model("gpt-4o-mini"))
            .unwrap_or_default();
        let ours = median(31, iterations, || {
            let parsed = Body::parse(black_box(&body)).ok();
            black_box(parsed.map(|b| b.with_model("gpt-4o-mini")));
        });
        let upstream = median(31, iterations, || {
            black_box(rewrite_model(black_box(&routed), "claude-sonnet-4"));
        });
        let naive = median(31, iterations, || {
            let mut value: serde_json::Value =
                serde_json::from_slice(black_box(&body)).unwrap_or_default();
            value["model"] = serde_json::Value::from("gpt-4o-mini");
            black_box(serde_json::to_vec(&value).ok());
        });
        println!(
            "{label:<10} {:>10} {:>13.1} µs {:>13.1} µs {:>15.1} µs",
            body.len(),
            ours.as_secs_f64() * 1e6,
            upstream.as_secs_f64() * 1e6,
            naive.as_secs_f64() * 1e6
        );
    }
}
