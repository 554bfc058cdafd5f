//! The Markdown report of a run (target/bench/pii.md).

use crate::score::Tally;
use std::fmt::Write;

/// Locales in the corpus, in column order.
pub const LOCALES: [&str; 6] = ["en_US", "en_GB", "de_DE", "fr_FR", "zh_CN", "ja_JP"];

/// Value types in row order, with their recall target.
pub const RECALL_TARGETS: [(&str, f64); 9] = [
    ("email", 0.97),
    ("phone", 0.97),
    ("card", 0.97),
    ("iban", 0.97),
    ("national_id", 0.97),
    ("ipv4", 0.97),
    ("ipv6", 0.97),
    ("name", 0.85),
    ("address", 0.7),
];

/// Precision target of the personal-data placeholder names.
pub const PRECISION_TARGET: f64 = 0.95;
const PRECISION_NAMES: [&str; 8] = [
    "EMAIL", "PHONE", "CARD", "IBAN", "ID", "IP", "NAME", "ADDRESS",
];

/// What the report says besides the counts.
#[derive(Debug, Default)]
pub struct Context {
    pub config: String,
    pub detectors: Vec<String>,
    pub missing: Vec<String>,
    pub corpus: String,
    pub records: (u64, u64),
    pub bytes: usize,
    /// Megabytes per second of each timed pass over the whole corpus.
    pub passes: Vec<f64>,
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**not met**"
    }
}

fn ratio((n, d): (u64, u64)) -> String {
    if d == 0 {
        "–".into()
    } else {
        format!("{n}/{d}")
    }
}

fn rate((n, d): (u64, u64)) -> Option<f64> {
    (d > 0).then(|| n as f64 / d as f64)
}

/// The report.
pub fn render(tally: &Tally, cx: &Context) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# pii-redaction detection benchmark\n");
    let _ = writeln!(
        md,
        "Config: `{}`; detectors: {}.{}",
        cx.config,
        cx.detectors.join(", "),
        if cx.missing.is_empty() {
            String::new()
        } else {
            format!(
                " Not in this build (rules dropped): {}.",
                cx.missing.join(", ")
            )
        }
    );
    let _ = writeln!(
        md,
        "Corpus: `{}`, {} positive and {} negative records; each record goes through \
         `redact_body` as a Chat Completions body. National ids: en_US SSN, en_GB NINO, de_DE \
         Steuer-IdNr, fr_FR NIR, zh_CN resident id, ja_JP My Number.\n",
        cx.corpus, cx.records.0, cx.records.1
    );

    let _ = writeln!(
        md,
        "## Recall: the value is no longer in what the provider gets\n"
    );
    let _ = write!(md, "| type |");
    for l in LOCALES {
        let _ = write!(md, " {l} |");
    }
    let _ = writeln!(md, " all | recall | target | |");
    let _ = writeln!(md, "|---{}|---|---|---|---|", "|---".repeat(LOCALES.len()));
    for (kind, target) in RECALL_TARGETS {
        let _ = write!(md, "| {kind} |");
        for l in LOCALES {
            let r = tally
                .recall
                .get(&(kind.to_owned(), l.to_owned()))
                .copied()
                .unwrap_or_default();
            let _ = write!(md, " {} |", ratio(r));
        }
        let all = tally.recall_of(kind);
        let (shown, verdict) = match rate(all) {
            Some(r) => (format!("{r:.3}"), met(r >= target)),
            None => ("–".into(), "–"),
        };
        let _ = writeln!(md, " {} | {shown} | ≥ {target} | {verdict} |", ratio(all));
    }

    let _ = writeln!(
        md,
        "\n## Precision: masks on a labelled value of their placeholder's type\n"
    );
    let _ = writeln!(
        md,
        "| placeholder | right | wrong in positive records | wrong in the negative corpus | precision | target | |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    let mut names: Vec<&str> = PRECISION_NAMES.to_vec();
    for name in tally.masks.keys() {
        if !names.contains(&name.as_str()) {
            names.push(name);
        }
    }
    for name in names {
        let c = tally.masks.get(name).copied().unwrap_or_default();
        let targeted = PRECISION_NAMES.contains(&name);
        let (shown, verdict) = match c.precision() {
            Some(p) if targeted => (format!("{p:.3}"), met(p >= PRECISION_TARGET)),
            Some(p) => (format!("{p:.3}"), "–"),
            None => ("– (no mask)".into(), "–"),
        };
        let target = if targeted {
            format!("≥ {PRECISION_TARGET}")
        } else {
            "–".into()
        };
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {} | {shown} | {target} | {verdict} |",
            c.right, c.wrong_positive, c.wrong_negative
        );
    }

    let _ = writeln!(md, "\n## Negative corpus: left untouched\n");
    let _ = writeln!(md, "| category | untouched | rate |");
    let _ = writeln!(md, "|---|---|---|");
    let mut total = (0, 0);
    for (category, n) in &tally.negatives {
        total = (total.0 + n.0, total.1 + n.1);
        let _ = writeln!(
            md,
            "| {category} | {} | {:.3} |",
            ratio(*n),
            rate(*n).unwrap_or(0.0)
        );
    }
    let _ = writeln!(
        md,
        "| **all** | {} | {:.3} |",
        ratio(total),
        rate(total).unwrap_or(0.0)
    );
    if tally.blocked != (0, 0) || tally.unaligned > 0 {
        let _ = writeln!(
            md,
            "\nRefused by a block rule: {} positive, {} negative records (their values count as \
             caught). Forwarded texts that could not be lined up with their original: {}.",
            tally.blocked.0, tally.blocked.1, tally.unaligned
        );
    }

    let mut sorted = cx.passes.clone();
    sorted.sort_by(f64::total_cmp);
    if let (Some(median), Some(best)) = (sorted.get(sorted.len() / 2), sorted.last()) {
        let _ = writeln!(
            md,
            "\n## Throughput\n\n{:.2} MB of request bodies through `redact_body`, {} passes: \
             median {median:.1} MB/s, best {best:.1} MB/s (native, one core).",
            cx.bytes as f64 / 1e6,
            sorted.len()
        );
    }

    let _ = writeln!(md, "\n## Examples\n");
    for (kind, ids) in &tally.missed {
        let _ = writeln!(md, "- missed {kind}: {}", ids.join("; "));
    }
    for (name, ids) in &tally.wrong {
        let _ = writeln!(md, "- wrong {name}: {}", ids.join("; "));
    }
    md
}
