//! Runs built-in detectors over text, one JSON string per input line, and prints for each
//! line a JSON array of `[detector id, matched text]`, for quick measurements of a detector
//! on a corpus of one's own:
//! `cargo run --release -p pii-redaction --example detect_lines -- person_name street_address
//! < lines.jsonl`

use pii_redaction::detect::Builtin;
use std::io::{BufRead, Write};

fn main() {
    let detectors: Vec<Builtin> = std::env::args()
        .skip(1)
        .filter_map(|id| Builtin::from_id(&id))
        .collect();
    let stdin = std::io::stdin();
    let mut out = std::io::BufWriter::new(std::io::stdout());
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let text: String = serde_json::from_str(&line).unwrap_or_default();
        let mut hits = Vec::new();
        for b in &detectors {
            b.find(&text, &mut |r| {
                hits.push((b.id(), text.get(r).unwrap_or_default().to_owned()));
            });
        }
        let _ = writeln!(out, "{}", serde_json::to_string(&hits).unwrap_or_default());
    }
}
