//! Metric names and samples for a record. Envoy stats have no labels: the labels are spelled
//! into the name and Envoy's `stats_tags` regexes ([`STATS_TAGS`]) turn them back into
//! Prometheus labels.
//!
//! Names (Envoy adds the `wasmcustom.` prefix, which `/stats/prometheus` drops with the
//! `envoy_` one: `gen_ai.client.token.usage` is exported as `gen_ai_client_token_usage`):
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `gen_ai.client.token.usage` | histogram | GenAI | tokens per request, `gen_ai_token_type` `input` / `output` (OpenTelemetry GenAI) |
//! | `gen_ai.client.operation.duration_milliseconds` | histogram | GenAI | request to end of response, ms |
//! | `gen_ai.server.time_to_first_token_milliseconds` | histogram | GenAI | request to first output, ms |
//! | `gen_ai.server.time_per_output_token_microseconds` | histogram | GenAI | after the first token, per further output token, µs |
//! | `llm_gateway.usage.tokens` | counter | route, `token_type` | tokens, summed (`input`, `output`, `cached_input`, `cache_write`, `reasoning`) |
//! | `llm_gateway.usage.cost_nano` | counter | route | cost, nano-units of the configured currency |
//! | `llm_gateway.usage.requests` | counter | route | records |
//! | `llm_gateway.usage.estimated` | counter | route | records whose usage was counted by the gateway |
//! | `gen_ai.client.operation.duration_ms` | histogram | route | request to end of response, ms (the older form of the one above) |
//! | `gen_ai.server.time_to_first_token_ms` | histogram | route | request to first output, ms (the older form) |
//! | `llm_gateway.usage.translated.<client_api>.<provider_api>` | counter | — | records whose client's API is not the deployment's ([`translated_name`]) |
//!
//! *Route* labels follow the base name as `.tenant.<t>.model_group.<g>.deployment.<d>` and,
//! only when `consumer_label` is on, `.consumer.<c>`. *GenAI* labels are the route labels
//! followed by OpenTelemetry's attributes `.gen_ai_operation_name.<o>.gen_ai_provider_name.<p>
//! .gen_ai_request_model.<r>.gen_ai_response_model.<m>` ([`Labels`]).
//!
//! Envoy histograms hold integers (a wasm module defines them without a unit, and Envoy
//! exports the recorded numbers and the configured bucket bounds as they are): a duration in
//! seconds would lose everything below a second. The GenAI durations are therefore recorded in
//! milliseconds (µs per output token) and named with that unit, as an OpenTelemetry Prometheus
//! exporter names an instrument whose unit is `ms` (`…_milliseconds`); divide by 1 000
//! (1 000 000) for OpenTelemetry's seconds.
//!
//! Label values keep `[A-Za-z0-9_-]` (anything else becomes `_`, at most 64 characters, `none`
//! when absent), so a value never contains the `.` the regexes split on; the response model,
//! last in the name, also keeps `.` (`gpt-4.1-mini`). Cardinality is bounded by the configured
//! tenants, groups and deployments (set by trusted filters, never by the client) and the
//! models their providers answer with, and per VM by [`MAX_LABEL_SETS`]: past it new
//! combinations are counted under `_other`.

use crate::record::{Record, UsageSource};

/// Most distinct label sets one VM defines metrics for (each has [`SERIES`]`.len()` names).
pub const MAX_LABEL_SETS: usize = 512;

/// Most distinct [`translated_name`]s one VM defines: every pair of two different APIs of
/// the four (a record names only those); past it a translation is not counted.
pub const MAX_TRANSLATIONS: usize = 12;

/// The base name of the counter of translated records ([`translated_name`]).
pub const TRANSLATED: &str = "llm_gateway.usage.translated";

/// The Envoy `stats_config.stats_tags` that turn the name parts into labels (tag name, regex),
/// for the bootstrap. The first capture group is cut from the name, the second is the value.
/// The GenAI ones find the first marker after `wasmcustom.gen_ai.` (`.*?`): only the response
/// model, last, may hold a `.`, so no value before it can look like a marker.
pub const STATS_TAGS: [(&str, &str); 10] = [
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
    (
        "gen_ai_token_type",
        r"^wasmcustom\.gen_ai\.client\.token\.usage(\.gen_ai_token_type\.([a-z_]+))\.tenant\.",
    ),
    (
        "gen_ai_operation_name",
        r"^wasmcustom\.gen_ai\..*?(\.gen_ai_operation_name\.([^.]+))\.gen_ai_provider_name\.",
    ),
    (
        "gen_ai_provider_name",
        r"^wasmcustom\.gen_ai\..*?(\.gen_ai_provider_name\.([^.]+))\.gen_ai_request_model\.",
    ),
    (
        "gen_ai_request_model",
        r"^wasmcustom\.gen_ai\..*?(\.gen_ai_request_model\.([^.]+))\.gen_ai_response_model\.",
    ),
    (
        "gen_ai_response_model",
        r"^wasmcustom\.gen_ai\..*?\.gen_ai_request_model\.[^.]+(\.gen_ai_response_model\.(.+))$",
    ),
];

/// The bootstrap's `stats_config.histogram_bucket_settings` for the GenAI histograms (name
/// prefix before tag extraction, bucket bounds): OpenTelemetry GenAI's advised bounds, its
/// seconds converted to each series' unit (ms, µs).
pub const HISTOGRAM_BUCKETS: [(&str, &[u64]); 4] = [
    (
        "wasmcustom.gen_ai.client.token.usage.gen_ai_token_type.",
        &[
            1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216,
            67108864,
        ],
    ),
    (
        "wasmcustom.gen_ai.client.operation.duration_milliseconds.",
        &[
            10, 20, 40, 80, 160, 320, 640, 1280, 2560, 5120, 10240, 20480, 40960, 81920,
        ],
    ),
    (
        "wasmcustom.gen_ai.server.time_to_first_token_milliseconds.",
        &[
            1, 5, 10, 20, 40, 60, 80, 100, 250, 500, 750, 1000, 2500, 5000, 7500, 10000,
        ],
    ),
    (
        "wasmcustom.gen_ai.server.time_per_output_token_microseconds.",
        &[
            10000, 25000, 50000, 75000, 100000, 150000, 200000, 300000, 400000, 500000, 750000,
            1000000, 2500000,
        ],
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

/// Which labels a series carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Tenant, model group, deployment (and consumer).
    Route,
    /// The route labels and OpenTelemetry's GenAI attributes.
    GenAi,
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
    let mut out = String::new();
    push_label_value(&mut out, value);
    out
}

/// [`label_value`], appended to `out`.
fn push_label_value(out: &mut String, value: Option<&str>) {
    push_sanitized(out, value, keeps);
}

/// What a label value keeps.
fn keeps(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '_'
}

/// What the last label value of a name (the response model) keeps: `.` too.
fn keeps_dotted(c: char) -> bool {
    keeps(c) || c == '.'
}

/// `value` (`none` when absent or empty), its first 64 characters, each one `keep` refuses
/// replaced by `_`, appended to `out`.
fn push_sanitized(out: &mut String, value: Option<&str>, keep: fn(char) -> bool) {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        out.push_str("none");
        return;
    };
    for c in value.chars().take(64) {
        out.push(if keep(c) { c } else { '_' });
    }
}

/// The label suffix of a record's series.
pub fn label_suffix(record: &Record, consumer_label: bool) -> String {
    let mut suffix = String::with_capacity(96);
    push_label_suffix(&mut suffix, record, consumer_label);
    suffix
}

/// [`label_suffix`], appended to `out`.
fn push_label_suffix(out: &mut String, record: &Record, consumer_label: bool) {
    out.push_str(".tenant.");
    push_label_value(out, record.tenant.as_deref());
    out.push_str(".model_group.");
    push_label_value(out, record.model_group.as_deref());
    out.push_str(".deployment.");
    push_label_value(out, record.deployment.as_deref());
    if consumer_label {
        out.push_str(".consumer.");
        push_label_value(out, record.consumer.as_deref());
    }
}

/// OpenTelemetry's `gen_ai.operation.name` for an API: `chat` for the chat-like ones
/// (`chat.completions`, `messages`, `responses`), `embeddings`.
pub fn operation_name(api: &str) -> String {
    let mut out = String::new();
    push_operation_name(&mut out, api);
    out
}

/// [`operation_name`], appended to `out`.
fn push_operation_name(out: &mut String, api: &str) {
    match api {
        "chat.completions" | "messages" | "responses" => out.push_str("chat"),
        "embeddings" => out.push_str("embeddings"),
        other => push_label_value(out, Some(other)),
    }
}

/// OpenTelemetry's `gen_ai.provider.name`: the router's provider of the deployment that
/// answered (`openai`, `anthropic`, `openai-compatible`, `azure`), else the owner of the API
/// the client called (`messages`: `anthropic`; the others: `openai`).
pub fn provider_name(provider: Option<&str>, api: &str) -> String {
    let mut out = String::new();
    push_provider_name(&mut out, provider, api);
    out
}

/// [`provider_name`], appended to `out`.
fn push_provider_name(out: &mut String, provider: Option<&str>, api: &str) {
    match provider.filter(|p| !p.is_empty()) {
        Some(provider) => push_label_value(out, Some(provider)),
        None if api == "messages" => out.push_str("anthropic"),
        None => out.push_str("openai"),
    }
}

/// The labels of a record's series.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Labels {
    /// [`label_suffix`].
    pub route: String,
    /// What the GenAI series add after the route labels.
    pub gen_ai: String,
}

impl Labels {
    /// The labels of `record`, answered by a deployment of `provider` (the router's).
    pub fn of(record: &Record, provider: Option<&str>, consumer_label: bool) -> Labels {
        // built in place (one buffer each, no `format!`): once per request
        let mut route = String::with_capacity(96);
        push_label_suffix(&mut route, record, consumer_label);
        let mut gen_ai = String::with_capacity(160);
        gen_ai.push_str(".gen_ai_operation_name.");
        push_operation_name(&mut gen_ai, &record.api);
        gen_ai.push_str(".gen_ai_provider_name.");
        push_provider_name(&mut gen_ai, provider, &record.api);
        // the model the client asked for: the router validated it as a group name
        gen_ai.push_str(".gen_ai_request_model.");
        push_label_value(&mut gen_ai, record.model_group.as_deref());
        gen_ai.push_str(".gen_ai_response_model.");
        push_sanitized(&mut gen_ai, record.model.as_deref(), keeps_dotted);
        Labels { route, gen_ai }
    }

    /// Where label sets past [`MAX_LABEL_SETS`] are counted.
    pub fn other(consumer_label: bool) -> Labels {
        let mut route = ".tenant._other.model_group._other.deployment._other".to_string();
        if consumer_label {
            route.push_str(".consumer._other");
        }
        Labels {
            route,
            gen_ai: ".gen_ai_operation_name._other.gen_ai_provider_name._other.gen_ai_request_model._other.gen_ai_response_model._other".into(),
        }
    }

    /// The full name of series `base` of `scope`.
    pub fn name(&self, base: &str, scope: Scope) -> String {
        match scope {
            Scope::Route => format!("{base}{}", self.route),
            Scope::GenAi => format!("{base}{}{}", self.route, self.gen_ai),
        }
    }
}

/// The counter a translated record adds one to,
/// `llm_gateway.usage.translated.<client_api>.<provider_api>` (API names as label values:
/// `chat.completions` is `chat_completions`); `None` — nothing to count — when the client
/// called the API the deployment speaks, or the record does not say which that is.
pub fn translated_name(record: &Record) -> Option<String> {
    let provider_api = record.provider_api.as_deref()?;
    if provider_api == record.api {
        return None;
    }
    let mut name = String::with_capacity(TRANSLATED.len() + 36);
    name.push_str(TRANSLATED);
    name.push('.');
    push_label_value(&mut name, Some(&record.api));
    name.push('.');
    push_label_value(&mut name, Some(provider_api));
    Some(name)
}

/// The hasher of the map from label sets to their metrics: one multiply and rotate per eight
/// bytes, where std's SipHash takes several rounds. The keys are label sets bounded by
/// [`MAX_LABEL_SETS`] and made of values set by trusted filters and the upstream's model, not
/// chosen freely by a client, so a keyed hash buys nothing here.
#[derive(Debug, Default, Clone, Copy)]
pub struct LabelHasher(u64);

impl LabelHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl std::hash::Hasher for LabelHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in words.by_ref() {
            if let Ok(word) = <[u8; 8]>::try_from(word) {
                self.add(u64::from_le_bytes(word));
            }
        }
        for &byte in words.remainder() {
            self.add(u64::from(byte));
        }
    }
}

/// Builds [`LabelHasher`]s.
pub type LabelHash = std::hash::BuildHasherDefault<LabelHasher>;

/// Every series a label set has, by base name (the labels follow the base name).
pub const SERIES: [(&str, Kind, Scope); 15] = [
    (
        "gen_ai.client.token.usage.gen_ai_token_type.input",
        Kind::Histogram,
        Scope::GenAi,
    ),
    (
        "gen_ai.client.token.usage.gen_ai_token_type.output",
        Kind::Histogram,
        Scope::GenAi,
    ),
    (
        "llm_gateway.usage.tokens.token_type.input",
        Kind::Counter,
        Scope::Route,
    ),
    (
        "llm_gateway.usage.tokens.token_type.output",
        Kind::Counter,
        Scope::Route,
    ),
    (
        "llm_gateway.usage.tokens.token_type.cached_input",
        Kind::Counter,
        Scope::Route,
    ),
    (
        "llm_gateway.usage.tokens.token_type.cache_write",
        Kind::Counter,
        Scope::Route,
    ),
    (
        "llm_gateway.usage.tokens.token_type.reasoning",
        Kind::Counter,
        Scope::Route,
    ),
    ("llm_gateway.usage.cost_nano", Kind::Counter, Scope::Route),
    ("llm_gateway.usage.requests", Kind::Counter, Scope::Route),
    ("llm_gateway.usage.estimated", Kind::Counter, Scope::Route),
    (
        "gen_ai.client.operation.duration_ms",
        Kind::Histogram,
        Scope::Route,
    ),
    (
        "gen_ai.server.time_to_first_token_ms",
        Kind::Histogram,
        Scope::Route,
    ),
    (
        "gen_ai.client.operation.duration_milliseconds",
        Kind::Histogram,
        Scope::GenAi,
    ),
    (
        "gen_ai.server.time_to_first_token_milliseconds",
        Kind::Histogram,
        Scope::GenAi,
    ),
    (
        "gen_ai.server.time_per_output_token_microseconds",
        Kind::Histogram,
        Scope::GenAi,
    ),
];

/// OpenTelemetry's `gen_ai.server.time_per_output_token` in µs: the time after the first
/// token, per output token after the first, for a successful response with a first token and
/// at least two output tokens.
pub fn time_per_output_token_us(record: &Record) -> Option<u64> {
    let ttft = record.ttft_ms?;
    let after_first = record.usage.completion_tokens.checked_sub(1)?;
    if after_first == 0 || !(200..300).contains(&record.status) {
        return None;
    }
    let rest_us = record.duration_ms.checked_sub(ttft)?.saturating_mul(1_000);
    Some(rest_us / after_first)
}

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
        Some(record.duration_ms),
        record.ttft_ms,
        time_per_output_token_us(record),
    ]
}

/// Every sample of a record, with full names.
pub fn samples(record: &Record, labels: &Labels) -> Vec<Sample> {
    SERIES
        .iter()
        .zip(values(record))
        .filter_map(|((base, kind, scope), value)| {
            value.map(|value| Sample {
                name: labels.name(base, *scope),
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
            provider_api: Some("chat.completions".into()),
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
        extract_with(&STATS_TAGS, name)
    }

    /// [`extract`] with the tag rules `rules` (tag name, regex).
    fn extract_with(rules: &[(&str, &str)], name: &str) -> (String, Vec<(String, String)>) {
        let mut cut = vec![false; name.len()];
        let mut tags = Vec::new();
        for (tag, regex) in rules {
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
        r.ttft_ms = Some(3);
        r.usage.completion_tokens = 5;
        r.usage.cached_prompt_tokens = 1;
        r.usage.cache_write_tokens = 1;
        for consumer in [false, true] {
            // values chosen to look like the markers
            r.tenant = Some("tenant".into());
            r.model_group = Some("model_group".into());
            r.deployment = Some("token_type".into());
            r.model = Some("gpt-4.1.gen_ai_operation_name.x".into());
            let labels = Labels::of(&r, Some("gen_ai_provider_name"), consumer);
            let all = samples(&r, &labels);
            assert_eq!(all.len(), SERIES.len(), "every series has a value here");
            for sample in all {
                let (name, tags) = extract(&format!("wasmcustom.{}", sample.name));
                let base = SERIES
                    .iter()
                    .find(|(b, ..)| sample.name.starts_with(b))
                    .map(|(b, ..)| *b)
                    .unwrap();
                let bare = base
                    .split_once(".token_type.")
                    .or_else(|| base.split_once(".gen_ai_token_type."))
                    .map_or(base, |(b, _)| b);
                assert_eq!(name, format!("wasmcustom.{bare}"), "{}", sample.name);
                let get = |t: &str| tags.iter().find(|(n, _)| n == t).map(|(_, v)| v.as_str());
                assert_eq!(get("tenant"), Some("tenant"), "{}", sample.name);
                assert_eq!(get("model_group"), Some("model_group"));
                assert_eq!(get("deployment"), Some("token_type"));
                assert_eq!(get("consumer"), consumer.then_some("team_a"));
                let gen_ai = sample.name.starts_with("gen_ai.")
                    && !sample
                        .name
                        .starts_with("gen_ai.client.operation.duration_ms")
                    && !sample
                        .name
                        .starts_with("gen_ai.server.time_to_first_token_ms");
                if gen_ai {
                    assert_eq!(get("gen_ai_operation_name"), Some("chat"));
                    assert_eq!(get("gen_ai_provider_name"), Some("gen_ai_provider_name"));
                    assert_eq!(get("gen_ai_request_model"), Some("model_group"));
                    assert_eq!(
                        get("gen_ai_response_model"),
                        Some("gpt-4.1.gen_ai_operation_name.x")
                    );
                    assert_eq!(get("token_type"), None, "{}", sample.name);
                } else {
                    assert_eq!(get("gen_ai_operation_name"), None, "{}", sample.name);
                    assert_eq!(get("gen_ai_response_model"), None, "{}", sample.name);
                }
                if sample.name.starts_with("gen_ai.client.token.") {
                    assert!(get("gen_ai_token_type").is_some(), "{}", sample.name);
                }
                if sample.name.starts_with("llm_gateway.usage.tokens.") {
                    assert!(get("token_type").is_some(), "{}", sample.name);
                }
            }
        }
        let (name, _) = extract(&format!(
            "wasmcustom.llm_gateway.usage.tokens.token_type.cached_input{}",
            label_suffix(&record(), true)
        ));
        assert_eq!(name, "wasmcustom.llm_gateway.usage.tokens");
        // the `_other` labels extract too
        let other = Labels::other(true);
        let (name, tags) = extract(&format!(
            "wasmcustom.{}",
            other.name(
                "gen_ai.client.token.usage.gen_ai_token_type.input",
                Scope::GenAi
            )
        ));
        assert_eq!(name, "wasmcustom.gen_ai.client.token.usage");
        assert_eq!(tags.len(), 9, "{tags:?}");
        assert!(tags
            .iter()
            .all(|(t, v)| v == "_other" || t == "gen_ai_token_type"));
    }

    #[test]
    fn every_shipped_bootstrap_has_the_genai_tags_and_buckets() {
        for (file, yaml) in [
            (
                "e2e-usage",
                include_str!("../../../envoy-config/e2e-usage.yaml"),
            ),
            (
                "gateway",
                include_str!("../../../envoy-config/gateway.yaml"),
            ),
            (
                "gateway-1.36",
                include_str!("../../../envoy-config/gateway-1.36.yaml"),
            ),
            (
                "gateway-fused",
                include_str!("../../../envoy-config/gateway-fused.yaml"),
            ),
            (
                "gateway-fleet",
                include_str!("../../../envoy-config/gateway-fleet.yaml"),
            ),
            (
                "gateway-bundle",
                include_str!("../../../envoy-config/gateway-bundle.yaml"),
            ),
        ] {
            // The e2e bootstrap has exactly these rules; a gateway's may widen the route ones
            // for other plugins' names (and must keep them matching ours), never the GenAI ones.
            for (tag, regex) in STATS_TAGS
                .into_iter()
                .filter(|(tag, _)| file == "e2e-usage" || tag.starts_with("gen_ai_"))
            {
                assert!(
                    yaml.contains(&format!("- tag_name: {tag}\n    regex: '{regex}'\n")),
                    "{file}: {tag}: {regex}"
                );
            }
            for (prefix, bounds) in HISTOGRAM_BUCKETS {
                let bounds: Vec<String> = bounds.iter().map(u64::to_string).collect();
                let entry = format!(
                    "  - match: {{ prefix: {prefix} }}\n    buckets: [{}]\n",
                    bounds.join(", ")
                );
                assert!(yaml.contains(&entry), "{file}: {entry}");
            }
            // every prefix names GenAI series
            for (prefix, _) in HISTOGRAM_BUCKETS {
                let base = prefix.trim_start_matches("wasmcustom.");
                assert!(
                    SERIES.iter().any(|(b, kind, scope)| {
                        b.starts_with(base.trim_end_matches('.'))
                            && *kind == Kind::Histogram
                            && *scope == Scope::GenAi
                    }),
                    "{prefix}"
                );
            }
        }
    }

    #[test]
    fn genai_labels_name_the_operation_provider_and_models() {
        let mut r = record();
        r.model = Some("gpt-4o-mini-2024-07-18".into());
        let labels = Labels::of(&r, Some("openai"), false);
        assert_eq!(
            labels.gen_ai,
            ".gen_ai_operation_name.chat.gen_ai_provider_name.openai.gen_ai_request_model.fast.gen_ai_response_model.gpt-4o-mini-2024-07-18"
        );
        for (api, operation) in [
            ("chat.completions", "chat"),
            ("messages", "chat"),
            ("responses", "chat"),
            ("embeddings", "embeddings"),
            ("x.y", "x_y"),
        ] {
            assert_eq!(operation_name(api), operation);
        }
        // without the router: the API's owner
        assert_eq!(provider_name(None, "messages"), "anthropic");
        assert_eq!(provider_name(Some(""), "chat.completions"), "openai");
        assert_eq!(
            provider_name(Some("openai-compatible"), "messages"),
            "openai-compatible"
        );
        // a hostile response model stays one bounded label value
        r.model = Some(format!("a b/c{}", "x".repeat(100)));
        let labels = Labels::of(&r, None, false);
        let value = labels
            .gen_ai
            .rsplit(".gen_ai_response_model.")
            .next()
            .unwrap();
        assert_eq!(value.len(), 64);
        assert!(value.starts_with("a_b_c"), "{value}");
        r.model = None;
        assert!(Labels::of(&r, None, false)
            .gen_ai
            .ends_with(".gen_ai_response_model.none"));
    }

    #[test]
    fn only_a_translated_record_names_a_translation_counter() {
        let with = |api: &str, provider_api: Option<&str>| Record {
            api: api.into(),
            provider_api: provider_api.map(str::to_string),
            ..record()
        };
        for (api, provider_api, expected) in [
            (
                "chat.completions",
                Some("messages"),
                Some("llm_gateway.usage.translated.chat_completions.messages"),
            ),
            (
                "messages",
                Some("chat.completions"),
                Some("llm_gateway.usage.translated.messages.chat_completions"),
            ),
            ("chat.completions", Some("chat.completions"), None),
            ("messages", Some("messages"), None),
            ("embeddings", Some("embeddings"), None),
            // a record written before `provider_api` existed
            ("chat.completions", None, None),
        ] {
            assert_eq!(
                translated_name(&with(api, provider_api)).as_deref(),
                expected,
                "{api} {provider_api:?}"
            );
        }
        // no tag rule of the gateway's bootstrap (every plugin's) takes the name apart:
        // Prometheus gets it whole, `llm_gateway_usage_translated_chat_completions_messages`
        let yaml = include_str!("../../../envoy-config/gateway.yaml");
        let rules: Vec<(&str, &str)> = yaml
            .split("- tag_name: ")
            .skip(1)
            .filter_map(|entry| {
                let (tag, rest) = entry.split_once("\n")?;
                let regex = rest.trim_start().strip_prefix("regex: '")?;
                Some((tag, regex.split_once("'\n")?.0))
            })
            .collect();
        assert!(rules.len() > STATS_TAGS.len(), "{rules:?}");
        for (api, provider_api) in [
            ("chat.completions", "messages"),
            ("messages", "chat.completions"),
        ] {
            let name = translated_name(&with(api, Some(provider_api))).unwrap();
            let (kept, tags) = extract_with(&rules, &format!("wasmcustom.{name}"));
            assert_eq!(kept, format!("wasmcustom.{name}"));
            assert!(tags.is_empty(), "{tags:?}");
        }
    }

    #[test]
    fn time_per_output_token_counts_after_the_first_token() {
        let mut r = record();
        r.ttft_ms = Some(100);
        r.duration_ms = 1_100;
        r.usage.completion_tokens = 11;
        assert_eq!(time_per_output_token_us(&r), Some(100_000));
        r.usage.completion_tokens = 1;
        assert_eq!(
            time_per_output_token_us(&r),
            None,
            "no token after the first"
        );
        r.usage.completion_tokens = 11;
        r.ttft_ms = None;
        assert_eq!(time_per_output_token_us(&r), None, "no first token");
        r.ttft_ms = Some(2_000);
        assert_eq!(
            time_per_output_token_us(&r),
            None,
            "a first token after the end"
        );
        r.ttft_ms = Some(100);
        r.status = 500;
        assert_eq!(time_per_output_token_us(&r), None, "not a success");
    }

    #[test]
    fn samples_skip_zero_counters() {
        let r = record();
        let labels = Labels {
            route: ".x".into(),
            gen_ai: ".y".into(),
        };
        let names: Vec<String> = samples(&r, &labels).into_iter().map(|s| s.name).collect();
        assert!(names.contains(&"llm_gateway.usage.tokens.token_type.input.x".to_string()));
        assert!(!names.iter().any(|n| n.contains("reasoning")));
        assert!(!names.iter().any(|n| n.contains("estimated")));
        assert!(names.contains(&"gen_ai.server.time_to_first_token_ms.x".to_string()));
        assert!(
            names.contains(&"gen_ai.client.token.usage.gen_ai_token_type.output.x.y".to_string())
        );
        assert!(names.contains(&"gen_ai.server.time_per_output_token_microseconds.x.y".to_string()));
    }
}
