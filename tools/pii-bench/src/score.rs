//! Scoring: what one record's redaction caught, missed and masked by mistake.
//!
//! A value is caught when the text the provider gets no longer contains it (a partial mask
//! that breaks it up counts). A mask is a placeholder in that text that the request's map
//! restores; where it sits in the original text follows from the text around it (restoring
//! every mask gives the original back). It is right when its placeholder name's type
//! (EMAIL → email, IP → ipv4 or ipv6, ID → national_id, …) is the type of a labelled value
//! it overlaps, and wrong otherwise: on another value's type, on unlabelled text, and on
//! every negative record.

use pii_redaction::mask::PlaceholderMap;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::ops::Range;

/// One line of the corpus (tools/pii-bench/generate.py).
#[derive(Debug, Clone, Deserialize)]
pub struct Record {
    pub id: String,
    /// `positive` or `negative`.
    pub corpus: String,
    pub locale: String,
    pub category: String,
    pub text: String,
    #[serde(default)]
    pub values: Vec<Labelled>,
}

/// A labelled value in a record's text.
#[derive(Debug, Clone, Deserialize)]
pub struct Labelled {
    /// email, phone, card, iban, national_id, ipv4, ipv6, name, address.
    #[serde(rename = "type")]
    pub kind: String,
    pub value: String,
}

/// What the provider got for a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// This text (the user message, rewritten or not).
    Forwarded(String),
    /// A `block` rule refused the request: nothing reached the provider.
    Blocked,
}

/// A placeholder in the forwarded text and the span of the original it replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mask {
    /// The placeholder's name (`EMAIL` of `[EMAIL_2]`).
    pub name: String,
    /// Byte range in the original text.
    pub span: Range<usize>,
}

/// The value types a placeholder name stands for (none: a secret or a user rule).
pub fn types_of(name: &str) -> &'static [&'static str] {
    match name {
        "EMAIL" => &["email"],
        "PHONE" => &["phone"],
        "CARD" => &["card"],
        "IBAN" => &["iban"],
        "ID" => &["national_id"],
        "IP" => &["ipv4", "ipv6"],
        "NAME" => &["name"],
        "ADDRESS" => &["address"],
        _ => &[],
    }
}

/// The masks of `forwarded`, placed in `original`; `None` if restoring them does not give
/// `original` back (the forwarded text is not a masking of it).
pub fn masks(original: &str, forwarded: &str, map: &PlaceholderMap) -> Option<Vec<Mask>> {
    let mut found = Vec::new();
    let mut at = 0; // in original
    let mut copied = 0; // in forwarded
    let mut rest = forwarded;
    let mut offset = 0; // of rest in forwarded
    while let Some(open) = rest.find('[') {
        let start = offset + open;
        let Some(close) = forwarded.get(start..).and_then(|t| t.find(']')) else {
            break;
        };
        let token = forwarded.get(start..=start + close)?;
        let inner = &token[1..token.len() - 1];
        let name = inner.rsplit_once('_').map(|(name, _)| name);
        let restored = map.restore(token);
        match name {
            Some(name) if restored != token => {
                let literal = forwarded.get(copied..start)?;
                if original.get(at..at + literal.len())? != literal {
                    return None;
                }
                at += literal.len();
                if original.get(at..at + restored.len())? != restored {
                    return None;
                }
                found.push(Mask {
                    name: name.to_owned(),
                    span: at..at + restored.len(),
                });
                at += restored.len();
                copied = start + token.len();
                offset = copied;
            }
            _ => offset = start + 1,
        }
        rest = forwarded.get(offset..)?;
    }
    (original.get(at..)? == forwarded.get(copied..)?).then_some(found)
}

/// Counts over the corpus.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// (type, locale) -> (caught, total).
    pub recall: BTreeMap<(String, String), (u64, u64)>,
    /// placeholder name -> masks on a value of its type, elsewhere in positive records, in
    /// negative records.
    pub masks: BTreeMap<String, MaskCount>,
    /// negative category -> (untouched, total).
    pub negatives: BTreeMap<String, (u64, u64)>,
    /// Records refused by a block rule, positive and negative.
    pub blocked: (u64, u64),
    /// Records whose forwarded text could not be lined up with the original.
    pub unaligned: u64,
    /// Record ids of missed values and misplaced masks, for the report's examples (the
    /// first few per type and name).
    pub missed: BTreeMap<String, Vec<String>>,
    pub wrong: BTreeMap<String, Vec<String>>,
    /// How many examples to keep per type and name (`None`: [`EXAMPLES`]).
    pub examples: Option<usize>,
}

/// Where one placeholder name's masks fell.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MaskCount {
    pub right: u64,
    pub wrong_positive: u64,
    pub wrong_negative: u64,
}

impl MaskCount {
    /// right / all, `None` without a mask.
    pub fn precision(&self) -> Option<f64> {
        let all = self.right + self.wrong_positive + self.wrong_negative;
        (all > 0).then(|| self.right as f64 / all as f64)
    }
}

pub const EXAMPLES: usize = 5;

fn example(list: &mut BTreeMap<String, Vec<String>>, limit: usize, key: &str, what: String) {
    let entry = list.entry(key.to_owned()).or_default();
    if entry.len() < limit {
        entry.push(what);
    }
}

/// Every byte range where `value` occurs in `text`.
fn occurrences(text: &str, value: &str) -> Vec<Range<usize>> {
    if value.is_empty() {
        return Vec::new();
    }
    text.match_indices(value)
        .map(|(at, v)| at..at + v.len())
        .collect()
}

impl Tally {
    /// Adds one record's outcome (`map`: the request's placeholders).
    pub fn add(&mut self, record: &Record, outcome: &Outcome, map: &PlaceholderMap) {
        let negative = record.corpus == "negative";
        let forwarded = match outcome {
            Outcome::Blocked => {
                if negative {
                    self.blocked.1 += 1;
                    let n = self.negatives.entry(record.category.clone()).or_default();
                    n.1 += 1;
                } else {
                    self.blocked.0 += 1;
                    for v in &record.values {
                        let r = self
                            .recall
                            .entry((v.kind.clone(), record.locale.clone()))
                            .or_default();
                        r.0 += 1;
                        r.1 += 1;
                    }
                }
                return;
            }
            Outcome::Forwarded(text) => text,
        };
        for v in &record.values {
            let caught = !forwarded.contains(&v.value);
            let r = self
                .recall
                .entry((v.kind.clone(), record.locale.clone()))
                .or_default();
            r.0 += u64::from(caught);
            r.1 += 1;
            if !caught {
                example(
                    &mut self.missed,
                    self.examples.unwrap_or(EXAMPLES),
                    &v.kind,
                    format!("{} `{}`", record.id, v.value),
                );
            }
        }
        if negative {
            let n = self.negatives.entry(record.category.clone()).or_default();
            n.0 += u64::from(*forwarded == record.text);
            n.1 += 1;
        }
        let Some(masks) = masks(&record.text, forwarded, map) else {
            self.unaligned += 1;
            return;
        };
        for mask in masks {
            let types = types_of(&mask.name);
            let right = record.values.iter().any(|v| {
                types.contains(&v.kind.as_str())
                    && occurrences(&record.text, &v.value)
                        .iter()
                        .any(|r| r.start < mask.span.end && mask.span.start < r.end)
            });
            let count = self.masks.entry(mask.name.clone()).or_default();
            if right {
                count.right += 1;
            } else {
                if negative {
                    count.wrong_negative += 1;
                } else {
                    count.wrong_positive += 1;
                }
                let masked = record.text.get(mask.span.clone()).unwrap_or_default();
                example(
                    &mut self.wrong,
                    self.examples.unwrap_or(EXAMPLES),
                    &mask.name,
                    format!("{} `{masked}`", record.id),
                );
            }
        }
    }

    /// (caught, total) of a type over every locale.
    pub fn recall_of(&self, kind: &str) -> (u64, u64) {
        self.recall
            .iter()
            .filter(|((k, _), _)| k == kind)
            .fold((0, 0), |(c, t), (_, (c2, t2))| (c + c2, t + t2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llm_gateway_shared::request::Api;
    use pii_redaction::config::parse_document;
    use pii_redaction::request::{redact_body, Redaction};

    fn record(corpus: &str, text: &str, values: &[(&str, &str)]) -> Record {
        Record {
            id: "r".into(),
            corpus: corpus.into(),
            locale: "en_US".into(),
            category: "c".into(),
            text: text.into(),
            values: values
                .iter()
                .map(|(kind, value)| Labelled {
                    kind: (*kind).into(),
                    value: (*value).into(),
                })
                .collect(),
        }
    }

    /// The record through the real redaction core with `doc`, as the evaluator runs it.
    fn score(doc: &str, records: &[Record]) -> Tally {
        let config = parse_document(doc.as_bytes())
            .unwrap()
            .global()
            .cloned()
            .unwrap();
        let mut tally = Tally::default();
        for record in records {
            let body = serde_json::json!({"messages": [{"role": "user", "content": record.text}]});
            let mut map = PlaceholderMap::default();
            let out = redact_body(
                &config,
                Some(Api::ChatCompletions),
                body.to_string().as_bytes(),
                &mut map,
            );
            let outcome = match out {
                Redaction::Rewritten(b) => {
                    let v: serde_json::Value = serde_json::from_slice(&b).unwrap();
                    Outcome::Forwarded(v["messages"][0]["content"].as_str().unwrap().into())
                }
                Redaction::Unchanged => Outcome::Forwarded(record.text.clone()),
                _ => Outcome::Blocked,
            };
            tally.add(record, &outcome, &map);
        }
        tally
    }

    #[test]
    fn a_caught_value_counts_for_recall_and_precision() {
        let t = score(
            r#"{"rules":[{"detector":"email"}]}"#,
            &[record(
                "positive",
                "mail ann@x.org now",
                &[("email", "ann@x.org")],
            )],
        );
        assert_eq!(t.recall_of("email"), (1, 1));
        let email = t.masks["EMAIL"];
        assert_eq!(
            (email.right, email.wrong_positive, email.wrong_negative),
            (1, 0, 0)
        );
        assert_eq!(email.precision(), Some(1.0));
    }

    #[test]
    fn a_missed_value_counts_against_recall_only() {
        let t = score(
            r#"{"rules":[{"detector":"email"}]}"#,
            &[record(
                "positive",
                "call +1 415 555 0132",
                &[("phone", "+1 415 555 0132")],
            )],
        );
        assert_eq!(t.recall_of("phone"), (0, 1));
        assert!(t.masks.is_empty());
        assert_eq!(t.missed["phone"], vec!["r `+1 415 555 0132`".to_owned()]);
    }

    #[test]
    fn a_mask_on_negative_text_is_a_false_positive() {
        // a four-part section number is a valid dotted quad
        let t = score(
            r#"{"rules":[{"detector":"ipv4"}]}"#,
            &[record("negative", "Section 4.12.1.0 says so.", &[])],
        );
        let ip = t.masks["IP"];
        assert_eq!((ip.right, ip.wrong_positive, ip.wrong_negative), (0, 0, 1));
        assert_eq!(ip.precision(), Some(0.0));
        assert_eq!(t.negatives["c"], (0, 1));
        assert_eq!(t.wrong["IP"], vec!["r `4.12.1.0`".to_owned()]);
    }

    #[test]
    fn a_mask_on_a_value_of_another_type_is_wrong_for_its_name() {
        // an e-mail detector on a labelled name's text: the name is not caught, the mask is
        // on the e-mail, which is not labelled
        let t = score(
            r#"{"rules":[{"detector":"email"}]}"#,
            &[record(
                "positive",
                "Ann Lee ann@x.org",
                &[("name", "Ann Lee"), ("phone", "ann@x.org")],
            )],
        );
        assert_eq!(t.recall_of("name"), (0, 1));
        assert_eq!(t.recall_of("phone"), (1, 1)); // gone from the text, whoever took it
        assert_eq!(t.masks["EMAIL"].wrong_positive, 1);
    }

    #[test]
    fn untouched_negatives_and_blocked_requests() {
        let doc = r#"{"rules":[{"detector":"openai_key","action":"block"},{"detector":"email"}]}"#;
        let t = score(
            doc,
            &[
                record("negative", "Order #4411 shipped.", &[]),
                record("negative", "key sk-abcdefghijklmnopqrstuvwx", &[]),
            ],
        );
        assert_eq!(t.negatives["c"], (1, 2));
        assert_eq!(t.blocked, (0, 1));
    }

    #[test]
    fn masks_are_placed_in_the_original_text() {
        let mut map = PlaceholderMap::default();
        let config = parse_document(b"{}").unwrap().global().cloned().unwrap();
        let original = "a [NOTE_1] b@x.org and b@x.org, ip 10.0.0.1!";
        let forwarded = config.redactor.redact(original, &mut map).unwrap().unwrap();
        let found = masks(original, &forwarded, &map).unwrap();
        let spans: Vec<(&str, &str)> = found
            .iter()
            .map(|m| (m.name.as_str(), &original[m.span.clone()]))
            .collect();
        assert_eq!(
            spans,
            [
                ("EMAIL", "b@x.org"),
                ("EMAIL", "b@x.org"),
                ("IP", "10.0.0.1")
            ]
        );
        assert_eq!(masks("abc", "abd", &map), None);
    }
}
