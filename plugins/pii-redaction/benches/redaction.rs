//! Throughput of the redaction core, native: `cargo bench -p pii-redaction`.
//!
//! * request scan: a Chat Completions body of 8 KB and of 256 KB (prose with an e-mail, a
//!   phone, an ID, a card and an IP address every ~1 KB), every built-in detector on, through
//!   `redact_body` (JSON walk, decode, detect, mask, re-encode, splice);
//! * the 8 KB body without the `person_name` and `street_address` detectors (what they
//!   cost), and with a name and an address in each PII group (what masking them costs);
//! * the same prose without any personal data (the common case: nothing to replace);
//! * stream restore: a 2 000-event chat SSE stream whose 3-character deltas split
//!   placeholders, fed in 1 KB network chunks through `SseRestorer`.
//!
//! Reports the median of timed runs (std::time::Instant; no wall-clock assertions) in MB/s.

use llm_gateway_shared::request::Api;
use pii_redaction::bench_data::prose;
use pii_redaction::config::parse_document;
use pii_redaction::mask::PlaceholderMap;
use pii_redaction::request::{redact_body, Redaction};
use pii_redaction::response::SseRestorer;
use std::hint::black_box;
use std::time::{Duration, Instant};

fn chat_body(text: &str) -> Vec<u8> {
    serde_json::json!({"model": "fast", "messages": [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": text}
    ]})
    .to_string()
    .into_bytes()
}

/// Median and fastest seconds per call over runs lasting about `budget` in total (the
/// machine may be shared: the fastest run shows what the code can do, the median what it did).
fn median(budget: Duration, mut f: impl FnMut()) -> (f64, f64) {
    f(); // warm up
    let start = Instant::now();
    let mut samples = Vec::new();
    while start.elapsed() < budget || samples.len() < 5 {
        let t = Instant::now();
        f();
        samples.push(t.elapsed().as_secs_f64());
    }
    samples.sort_by(f64::total_cmp);
    (samples[samples.len() / 2], samples[0])
}

fn report(label: &str, bytes: usize, (median, best): (f64, f64), extra: &str) {
    println!(
        "{label:<40} {:>7.1} KB  median {:>8.1} µs {:>7.1} MB/s  best {:>7.1} MB/s{extra}",
        bytes as f64 / 1024.0,
        median * 1e6,
        bytes as f64 / median / 1e6,
        bytes as f64 / best / 1e6
    );
}

fn main() {
    let budget = Duration::from_millis(
        std::env::var("BENCH_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1500),
    );
    let rules = parse_document(b"{}").expect("default config");
    let config = rules.global().expect("global config").clone();

    for (size, label) in [(8 * 1024, "8 KB"), (256 * 1024, "256 KB")] {
        for with_pii in [true, false] {
            let body = chat_body(&prose(size, with_pii));
            let mut matches = 0;
            let seconds = median(budget, || {
                let mut map = PlaceholderMap::default();
                let out = redact_body(
                    &config,
                    Some(Api::ChatCompletions),
                    black_box(&body),
                    &mut map,
                );
                matches = map.total();
                if with_pii {
                    assert!(matches!(out, Redaction::Rewritten(_)));
                }
                black_box(out);
            });
            let kind = if with_pii { "with PII" } else { "no PII" };
            report(
                &format!("request scan {label} {kind}"),
                body.len(),
                seconds,
                &format!("  ({matches} matches)"),
            );
        }
    }

    // the cost of the name and address detectors: the same 8 KB body without them, and a
    // body whose PII groups also hold a name and an address
    let without: Vec<String> = pii_redaction::detect::Builtin::ALL
        .into_iter()
        .filter(|b| !matches!(b.id(), "person_name" | "street_address"))
        .map(|b| format!(r#"{{"detector": "{}"}}"#, b.id()))
        .collect();
    let document = format!(r#"{{"rules": [{}]}}"#, without.join(","));
    let rules_without = parse_document(document.as_bytes()).expect("config");
    let config_without = rules_without.global().expect("global config").clone();
    let names_text = prose(8 * 1024, true).replace(
        "Contact user",
        "Ask John Underwood at 42 Kathleen Highway, or mail user",
    );
    for (label, cfg, text) in [
        (
            "request scan 8 KB with PII, no name/addr",
            &config_without,
            prose(8 * 1024, true),
        ),
        (
            "request scan 8 KB with PII + names/addrs",
            &config,
            names_text,
        ),
    ] {
        let body = chat_body(&text);
        let mut matches = 0;
        let seconds = median(budget, || {
            let mut map = PlaceholderMap::default();
            let out = redact_body(cfg, Some(Api::ChatCompletions), black_box(&body), &mut map);
            matches = map.total();
            black_box(out);
        });
        report(
            label,
            body.len(),
            seconds,
            &format!("  ({matches} matches)"),
        );
    }

    // the stream: the restored text is a masked prompt echoed back in 3-character deltas
    let mut map = PlaceholderMap::default();
    let prompt = prose(8 * 1024, true);
    let masked = match redact_body(
        &config,
        Some(Api::ChatCompletions),
        &chat_body(&prompt),
        &mut map,
    ) {
        Redaction::Rewritten(body) => {
            let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
            v["messages"][1]["content"]
                .as_str()
                .expect("text")
                .to_owned()
        }
        other => panic!("not rewritten: {other:?}"),
    };
    let chars: Vec<char> = masked.chars().collect();
    let mut stream = Vec::new();
    for (i, piece) in chars.chunks(3).cycle().take(2000).enumerate() {
        let piece: String = piece.iter().collect();
        let data = serde_json::json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
            "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"content": piece},
            "logprobs": null, "finish_reason": null}]});
        stream.extend(llm_gateway_shared::sse::encode(None, &data.to_string()));
        if i == 1999 {
            stream.extend_from_slice(b"data: [DONE]\n\n");
        }
    }
    let mut out_len = 0;
    let seconds = median(budget, || {
        let mut restorer = SseRestorer::default();
        let mut out = Vec::with_capacity(stream.len() + 4096);
        for chunk in stream.chunks(1024) {
            out.extend(restorer.push(&mut map, black_box(chunk)));
        }
        out.extend(restorer.finish(&mut map));
        out_len = out.len();
        black_box(out);
    });
    report(
        "stream restore 2000 events, 1 KB chunks",
        stream.len(),
        seconds,
        &format!(
            "  ({:.2} µs/event median, {} -> {} bytes)",
            seconds.0 * 1e6 / 2000.0,
            stream.len(),
            out_len
        ),
    );
}
