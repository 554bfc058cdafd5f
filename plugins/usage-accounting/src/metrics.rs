//! Metric names and samples for a record. Envoy stats have no labels: the labels are spelled
//! into the name and Envoy's `stats_tags` regexes ([`STATS_TAGS`]) turn them back into
//! Prometheus labels.
//!
//! Names (Envoy adds the `wasmcustom.` prefix):
//!
//! | name | kind | meaning |
//! |---|---|---|
//! | `gen_ai.client.token.usage.token_type.input\|output` | histogram | tokens per request (OpenTelemetry GenAI) |
//! | `llm_gateway.usage.tokens.token_type.input\|output\|cached_input\|cache_write\|reasoning` | counter | tokens, summed |
//! | `llm_gateway.usage.cost_nano` | counter | cost, nano-units of the configured currency |
//! | `llm_gateway.usage.requests` | counter | records |
//! | `llm_gateway.usage.estimated` | counter | records whose usage was counted by the gateway |
//! | `gen_ai.client.operation.duration_ms` | histogram | request to end of response, ms (OTel's `gen_ai.client.operation.duration`, in ms as Envoy histograms hold integers) |
//! | `gen_ai.server.time_to_first_token_ms` | histogram | request to first output, ms |
//!
//! each followed by `.tenant.<t>.model_group.<g>.deployment.<d>` and, only when
//! `consumer_label` is on, `.consumer.<c>`. Label values keep `[A-Za-z0-9_-]` (anything else
//! becomes `_`, at most 64 characters, `none` when absent), so a value never contains the
//! `.` the regexes split on. Cardinality is bounded by the configured tenants, groups and
//! deployments (set by trusted filters, never by the client), and per VM by
//! [`MAX_LABEL_SETS`]: past it new combinations are counted under `_other`.

use crate::record::{Record, UsageSource};

/// Most distinct label sets one VM defines metrics for (each has [`SERIES`]`.len()` names).
pub const MAX_LABEL_SETS: usize = 512;

/// The Envoy `stats_config.stats_tags` that turn the name parts into labels (tag name, regex),
/// for the bootstrap. The first capture group is cut from the name, the second is the value.
pub const STATS_TAGS: [(&str, &str); 5] = [
    (
        "tenant",
        r"^wasmcustom\.[a-z_.]+?(\.tenant\.([^.]+))\.model_group\.",
    ),
    (
        "model_group",
        r"^wasmcustom\.[a-z_.]+?\.tenant\.[^.]+(\.model_group\.([^.]+))\.deployment\.",
    ),
    (
        "deployment",
        r"^wasmcustom\.[a-z_.]+?\.tenant\.[^.]+\.model_group\.[^.]+(\.deployment\.([^.]+))",
    ),
    (
        "consumer",
        r"^wasmcustom\.[a-z_.]+?\.tenant\.[^.]+\.model_group\.[^.]+\.deployment\.[^.]+(\.consumer\.([^.]+))",
    ),
    (
        "token_type",
        r"^wasmcustom\.[a-z_.]+?(\.token_type\.([a-z_]+))\.tenant\.",
    ),
];

/// Kind of a host metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Monotonic counter.
    Counter,
    /// Histogram.
    Histogram,
}

/// One value to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Full name (without `wasmcustom.`).
    pub name: String,
    /// Counter or histogram.
    pub kind: Kind,
    /// Increment or sample.
    pub value: u64,
}

/// A label value safe inside a stat name.
pub fn label_value(value: Option<&str>) -> String {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return "none".into();
    };
    value
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The label suffix of a record's series.
pub fn label_suffix(record: &Record, consumer_label: bool) -> String {
    let mut suffix = format!(
        ".tenant.{}.model_group.{}.deployment.{}",
        label_value(record.tenant.as_deref()),
        label_value(record.model_group.as_deref()),
        label_value(record.deployment.as_deref())
    );
    if consumer_label {
        suffix.push_str(".consumer.");
        suffix.push_str(&label_value(record.consumer.as_deref()));
    }
    suffix
}

/// Every series a label set has, by base name (the labels follow the base name).
pub const SERIES: [(&str, Kind); 12] = [
    (
        "gen_ai.client.token.usage.token_type.input",
        Kind::Histogram,
    ),
    (
        "gen_ai.client.token.usage.token_type.output",
        Kind::Histogram,
    ),
    ("llm_gateway.usage.tokens.token_type.input", Kind::Counter),
    ("llm_gateway.usage.tokens.token_type.output", Kind::Counter),
    (
        "llm_gateway.usage.tokens.token_type.cached_input",
        Kind::Counter,
    ),
    (
        "llm_gateway.usage.tokens.token_type.cache_write",
        Kind::Counter,
    ),
    (
        "llm_gateway.usage.tokens.token_type.reasoning",
        Kind::Counter,
    ),
    ("llm_gateway.usage.cost_nano", Kind::Counter),
    ("llm_gateway.usage.requests", Kind::Counter),
    ("llm_gateway.usage.estimated", Kind::Counter),
    ("gen_ai.client.operation.duration_ms", Kind::Histogram),
    ("gen_ai.server.time_to_first_token_ms", Kind::Histogram),
];

/// What a record adds to each of [`SERIES`]: `None` where there is nothing to record (a
/// counter at 0 — Envoy refuses those —, no cost, no first token).
pub fn values(record: &Record) -> [Option<u64>; SERIES.len()] {
    let u = &record.usage;
    let count = |n: u64| (n > 0).then_some(n);
    [
        Some(u.prompt_tokens),
        Some(u.completion_tokens),
        count(u.prompt_tokens),
        count(u.completion_tokens),
        count(u.cached_prompt_tokens),
        count(u.cache_write_tokens),
        count(u.reasoning_tokens),
        record.cost_nano.and_then(count),
        Some(1),
        (record.usage_source == UsageSource::Estimated).then_some(1),
        Some(record.duration_ms),
        record.ttft_ms,
    ]
}

/// Every sample of a record, with full names. `labels` is [`label_suffix`] (or `_other`
/// labels past the series bound).
pub fn samples(record: &Record, labels: &str) -> Vec<Sample> {
    SERIES
        .iter()
        .zip(values(record))
        .filter_map(|((base, kind), value)| {
            value.map(|value| Sample {
                name: format!("{base}{labels}"),
                kind: *kind,
                value,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{UsageFields, UsageSource};

    fn record() -> Record {
        Record {
            request_id: "r".into(),
            ts_ms: 0,
            consumer: Some("team.a".into()),
            tenant: Some("acme".into()),
            key_id: None,
            tier: None,
            project: None,
            agent: None,
            run_id: None,
            model_group: Some("fast".into()),
            deployment: Some("east-1".into()),
            model: None,
            api: "chat.completions".into(),
            stream: false,
            status: 200,
            complete: true,
            attempts: vec![],
            usage_source: UsageSource::Upstream,
            usage: UsageFields {
                prompt_tokens: 10,
                completion_tokens: 5,
                total_tokens: 15,
                ..UsageFields::default()
            },
            cost_nano: Some(7),
            currency: None,
            price_version: None,
            ttft_ms: Some(3),
            duration_ms: 9,
        }
    }

    #[test]
    fn labels_are_sanitized_and_consumer_optional() {
        let r = record();
        assert_eq!(
            label_suffix(&r, false),
            ".tenant.acme.model_group.fast.deployment.east-1"
        );
        assert_eq!(
            label_suffix(&r, true),
            ".tenant.acme.model_group.fast.deployment.east-1.consumer.team_a"
        );
        assert_eq!(label_value(None), "none");
        assert_eq!(label_value(Some("a.b c")), "a_b_c");
    }

    /// Envoy's tag extraction: each regex runs on the full name; its first group is cut out
    /// of the tag-extracted name, its second is the tag value.
    fn extract(name: &str) -> (String, Vec<(String, String)>) {
        let mut cut = vec![false; name.len()];
        let mut tags = Vec::new();
        for (tag, regex) in STATS_TAGS {
            let re = regex_lite::Regex::new(regex).unwrap();
            if let Some(caps) = re.captures(name) {
                let whole = caps.get(1).unwrap();
                for flag in &mut cut[whole.range()] {
                    *flag = true;
                }
                tags.push((tag.to_string(), caps.get(2).unwrap().as_str().to_string()));
            }
        }
        let kept: String = name
            .char_indices()
            .filter(|(i, _)| !cut[*i])
            .map(|(_, c)| c)
            .collect();
        (kept, tags)
    }

    #[test]
    fn stats_tags_turn_every_name_into_labels() {
        let mut r = record();
        r.usage.reasoning_tokens = 1;
        r.usage_source = UsageSource::Estimated;
        for consumer in [false, true] {
            // values chosen to look like the markers
            r.tenant = Some("tenant".into());
            r.model_group = Some("model_group".into());
            r.deployment = Some("token_type".into());
            let labels = label_suffix(&r, consumer);
            for sample in samples(&r, &labels) {
                let (name, tags) = extract(&format!("wasmcustom.{}", sample.name));
                assert!(
                    !name.contains(".tenant.") && !name.contains(".token_type."),
                    "{} -> {name}",
                    sample.name
                );
                let get = |t: &str| tags.iter().find(|(n, _)| n == t).map(|(_, v)| v.as_str());
                assert_eq!(get("tenant"), Some("tenant"), "{}", sample.name);
                assert_eq!(get("model_group"), Some("model_group"));
                assert_eq!(get("deployment"), Some("token_type"));
                assert_eq!(get("consumer"), consumer.then_some("team_a"));
                if sample.name.starts_with("gen_ai.client.token.")
                    || sample.name.starts_with("llm_gateway.usage.tokens.")
                {
                    assert!(get("token_type").is_some(), "{}", sample.name);
                }
            }
        }
        let (name, _) = extract(&format!(
            "wasmcustom.llm_gateway.usage.tokens.token_type.cached_input{}",
            label_suffix(&record(), true)
        ));
        assert_eq!(name, "wasmcustom.llm_gateway.usage.tokens");
    }

    #[test]
    fn the_e2e_bootstrap_uses_these_regexes() {
        let yaml = include_str!("../../../envoy-config/e2e-usage.yaml");
        for (tag, regex) in STATS_TAGS {
            assert!(yaml.contains(&format!("tag_name: {tag}")), "{tag}");
            assert!(
                yaml.contains(&format!("regex: '{regex}'")),
                "{tag}: {regex}"
            );
        }
    }

    #[test]
    fn samples_skip_zero_counters() {
        let r = record();
        let names: Vec<String> = samples(&r, ".x").into_iter().map(|s| s.name).collect();
        assert!(names.contains(&"llm_gateway.usage.tokens.token_type.input.x".to_string()));
        assert!(!names.iter().any(|n| n.contains("reasoning")));
        assert!(!names.iter().any(|n| n.contains("estimated")));
        assert!(names.contains(&"gen_ai.server.time_to_first_token_ms.x".to_string()));
    }
}
