//! `pii-bench [--corpus FILE] [--config FILE] [--out FILE] [--passes N] [--examples N]`: scores the corpus
//! that tools/pii-bench/generate.py wrote, writes the report and prints it (see lib.rs).
//!   --corpus  the JSONL corpus (target/bench/pii-corpus.jsonl)
//!   --config  a gateway YAML (its pii-redaction filter) or a JSON config
//!             (envoy-config/gateway.yaml); e.g. tools/pii-bench/all-detectors.json
//!   --out     the report (target/bench/pii.md)
//!   --passes  timed passes over the corpus for the throughput (30)
//!   --examples  missed values and wrong masks listed per type and name (5)

use llm_gateway_shared::request::Api;
use pii_bench::config::load;
use pii_bench::report::{render, Context};
use pii_bench::score::{Outcome, Record, Tally};
use pii_redaction::mask::PlaceholderMap;
use pii_redaction::request::{redact_body, Redaction};
use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;

struct Args {
    corpus: String,
    config: String,
    out: String,
    passes: usize,
    examples: usize,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        corpus: "target/bench/pii-corpus.jsonl".into(),
        config: "envoy-config/gateway.yaml".into(),
        out: "target/bench/pii.md".into(),
        passes: 30,
        examples: pii_bench::score::EXAMPLES,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--corpus" => a.corpus = value,
            "--config" => a.config = value,
            "--out" => a.out = value,
            "--passes" => a.passes = value.parse().map_err(|_| "--passes: a number")?,
            "--examples" => a.examples = value.parse().map_err(|_| "--examples: a number")?,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(a)
}

fn chat_body(text: &str) -> Vec<u8> {
    serde_json::json!({"model": "bench", "messages": [{"role": "user", "content": text}]})
        .to_string()
        .into_bytes()
}

/// The user message the provider would get.
fn outcome(record: &Record, redaction: Redaction) -> Result<Outcome, String> {
    match redaction {
        Redaction::Unchanged => Ok(Outcome::Forwarded(record.text.clone())),
        Redaction::Blocked(_) => Ok(Outcome::Blocked),
        Redaction::Rewritten(body) => {
            let v: serde_json::Value =
                serde_json::from_slice(&body).map_err(|e| format!("{}: {e}", record.id))?;
            v["messages"]
                .as_array()
                .and_then(|m| m.last())
                .and_then(|m| m["content"].as_str())
                .map(|t| Outcome::Forwarded(t.to_owned()))
                .ok_or_else(|| format!("{}: no user message in the rewritten body", record.id))
        }
        Redaction::Invalid(e) => Err(format!("{}: body refused as invalid: {e:?}", record.id)),
    }
}

fn run() -> Result<(), String> {
    let a = args()?;
    let loaded = load(&a.config)?;
    let text = std::fs::read_to_string(&a.corpus).map_err(|e| format!("{}: {e}", a.corpus))?;
    let records = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| serde_json::from_str::<Record>(l).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect::<Result<Vec<_>, _>>()?;
    let bodies: Vec<Vec<u8>> = records.iter().map(|r| chat_body(&r.text)).collect();

    let mut tally = Tally {
        examples: Some(a.examples),
        ..Tally::default()
    };
    for (record, body) in records.iter().zip(&bodies) {
        let mut map = PlaceholderMap::default();
        let redaction = redact_body(&loaded.config, Some(Api::ChatCompletions), body, &mut map);
        tally.add(record, &outcome(record, redaction)?, &map);
    }

    let bytes: usize = bodies.iter().map(Vec::len).sum();
    let mut passes = Vec::new();
    for _ in 0..a.passes.max(1) {
        let start = Instant::now();
        for body in &bodies {
            let mut map = PlaceholderMap::default();
            black_box(redact_body(
                &loaded.config,
                Some(Api::ChatCompletions),
                black_box(body),
                &mut map,
            ));
        }
        passes.push(bytes as f64 / start.elapsed().as_secs_f64() / 1e6);
    }

    let positive = records.iter().filter(|r| r.corpus != "negative").count() as u64;
    let cx = Context {
        config: a.config.clone(),
        detectors: loaded.detectors,
        missing: loaded.missing,
        corpus: a.corpus.clone(),
        records: (positive, records.len() as u64 - positive),
        bytes,
        passes,
    };
    let md = render(&tally, &cx);
    if let Some(dir) = std::path::Path::new(&a.out).parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(&a.out, &md).map_err(|e| format!("{}: {e}", a.out))?;
    print!("{md}");
    println!("\n(written to {})", a.out);
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pii-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
