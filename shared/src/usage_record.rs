//! The usage record: the contract between usage-accounting, which publishes one per logical
//! request, and its readers (token-ratelimit settles budgets with it, reports aggregate it).
//!
//! usage-accounting publishes it in its `on_log` as Envoy filter state: property [`PROPERTY`]
//! (`llm_usage`, filter state `wasm.llm_usage`; the plugin's `filter_state` setting may rename
//! it), as a JSON log line, and (Higress builds) in the Redis stream ledger. A filter placed
//! after usage-accounting in the chain reads it in its own `on_log` with
//! `get_property(["llm_usage"])` and [`Record::from_json`].
//!
//! ```json
//! {"request_id":"…","ts_ms":1764480000000,"consumer":"team-a","tenant":"acme",
//!  "key_id":"team-a-prod","tier":"pro","project":"search","agent":"planner","run_id":"r-1","model_group":"fast",
//!  "deployment":"east","model":"gpt-4o-mini","api":"chat.completions",
//!  "provider_api":"chat.completions","stream":true,
//!  "status":200,"complete":true,"attempts":[{"deployment":"east","status":200}],
//!  "usage_source":"upstream","usage":{"prompt_tokens":1000,"completion_tokens":100,
//!  "cached_prompt_tokens":600,"cache_write_tokens":0,"reasoning_tokens":0,"total_tokens":1100},
//!  "cost_nano":243600,"currency":"USD","price_version":"2026-11","ttft_ms":180,"duration_ms":950}
//! ```
//! `api` is the API the client called and `provider_api` the one the answering deployment
//! speaks (`chat.completions`, `responses`, `messages`, `embeddings`); they differ when the model
//! router translated the request (a Chat Completions client served by an Anthropic deployment:
//! `chat.completions` and `messages`).
//! `usage_source` is `upstream` (the provider's numbers) or `estimated` (counted by the gateway:
//! stream cut, provider without usage, client gone). `cost_nano` is in nano-units (10⁻⁹) of
//! `currency`; it and `price_version` are null when no price is configured for the request.
//! `key_id` is key-auth's `x-llm-key-id` (the key's `id`, which rotation keeps, else its digest
//! prefix) and `tier` its `x-llm-tier`. Every member is always present (absent values are
//! `null`), in the order above; a record written before `key_id`, `tier` or `provider_api`
//! existed reads with them `null`.

use crate::json::{Cursor, ObjectWriter};
use crate::usage::Usage;
use serde::{Deserialize, Serialize};

/// The property name usage-accounting publishes the record under by default (filter state
/// `wasm.llm_usage`).
pub const PROPERTY: &str = "llm_usage";

/// Where the token counts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageSource {
    /// The upstream's own usage object.
    Upstream,
    /// Counted by the gateway.
    Estimated,
}

/// One upstream attempt of the request (several with fallback).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// The deployment tried.
    pub deployment: Option<String>,
    /// Its HTTP status (0: no response).
    pub status: u16,
}

/// Token counts as published.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageFields {
    /// All input tokens.
    pub prompt_tokens: u64,
    /// All output tokens.
    pub completion_tokens: u64,
    /// Input read from the prompt cache.
    pub cached_prompt_tokens: u64,
    /// Input written to the prompt cache.
    pub cache_write_tokens: u64,
    /// Reasoning output.
    pub reasoning_tokens: u64,
    /// prompt + completion.
    pub total_tokens: u64,
}

impl From<Usage> for UsageFields {
    fn from(u: Usage) -> Self {
        UsageFields {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            cached_prompt_tokens: u.cached_prompt_tokens,
            cache_write_tokens: u.cache_write_tokens,
            reasoning_tokens: u.reasoning_tokens,
            total_tokens: u.total_tokens(),
        }
    }
}

/// The attribution record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Logical request id (survives fallbacks and retries).
    pub request_id: String,
    /// When the request arrived, Unix milliseconds.
    pub ts_ms: u64,
    /// Consumer (key-auth).
    pub consumer: Option<String>,
    /// Tenant (key-auth).
    pub tenant: Option<String>,
    /// The key's id (key-auth's `x-llm-key-id`): the same for a key and its rotation.
    #[serde(default)]
    pub key_id: Option<String>,
    /// The key's tier (key-auth's `x-llm-tier`).
    #[serde(default)]
    pub tier: Option<String>,
    /// Client header `x-project`.
    pub project: Option<String>,
    /// Client header `x-agent`.
    pub agent: Option<String>,
    /// Client header `x-run-id`.
    pub run_id: Option<String>,
    /// Model group (router).
    pub model_group: Option<String>,
    /// Deployment of the last attempt (router).
    pub deployment: Option<String>,
    /// Model the upstream named (else the request's).
    pub model: Option<String>,
    /// The API the client called: `chat.completions`, `responses`, `messages`, `embeddings`.
    pub api: String,
    /// The API the answering deployment speaks (one of `api`'s names): another one than `api`
    /// when the router translated the request.
    #[serde(default)]
    pub provider_api: Option<String>,
    /// Streaming response.
    pub stream: bool,
    /// Final HTTP status (0: none).
    pub status: u16,
    /// The response ended normally (false: cut, aborted).
    pub complete: bool,
    /// Every upstream attempt, in order.
    pub attempts: Vec<Attempt>,
    /// `upstream` or `estimated`.
    pub usage_source: UsageSource,
    /// Token counts.
    pub usage: UsageFields,
    /// Cost in nano-units of `currency`.
    pub cost_nano: Option<u64>,
    /// Currency of `cost_nano`.
    pub currency: Option<String>,
    /// Price list version used.
    pub price_version: Option<String>,
    /// Milliseconds from the request to the first generated output.
    pub ttft_ms: Option<u64>,
    /// Milliseconds from the request to the end of the response.
    pub duration_ms: u64,
}

impl UsageSource {
    /// The name serde writes (`snake_case`).
    fn as_str(self) -> &'static str {
        match self {
            UsageSource::Upstream => "upstream",
            UsageSource::Estimated => "estimated",
        }
    }
}

impl UsageFields {
    /// Writes the counts as their serde derive does.
    fn write_json(&self, out: &mut String) {
        let mut object = ObjectWriter::open(out);
        object.u64("prompt_tokens", self.prompt_tokens);
        object.u64("completion_tokens", self.completion_tokens);
        object.u64("cached_prompt_tokens", self.cached_prompt_tokens);
        object.u64("cache_write_tokens", self.cache_write_tokens);
        object.u64("reasoning_tokens", self.reasoning_tokens);
        object.u64("total_tokens", self.total_tokens);
        object.close();
    }
}

impl Attempt {
    /// Writes the attempt as its serde derive does.
    fn write_json(&self, out: &mut String) {
        let mut object = ObjectWriter::open(out);
        object.string_or_null("deployment", self.deployment.as_deref());
        object.u64("status", u64::from(self.status));
        object.close();
    }
}

impl Record {
    /// The record as one line of JSON: byte for byte what the serde derive writes (every
    /// member, in declaration order, absent values `null`), by hand — usage-accounting writes
    /// one per request.
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(768);
        let mut object = ObjectWriter::open(&mut out);
        object.string("request_id", &self.request_id);
        object.u64("ts_ms", self.ts_ms);
        object.string_or_null("consumer", self.consumer.as_deref());
        object.string_or_null("tenant", self.tenant.as_deref());
        object.string_or_null("key_id", self.key_id.as_deref());
        object.string_or_null("tier", self.tier.as_deref());
        object.string_or_null("project", self.project.as_deref());
        object.string_or_null("agent", self.agent.as_deref());
        object.string_or_null("run_id", self.run_id.as_deref());
        object.string_or_null("model_group", self.model_group.as_deref());
        object.string_or_null("deployment", self.deployment.as_deref());
        object.string_or_null("model", self.model.as_deref());
        object.string("api", &self.api);
        object.string_or_null("provider_api", self.provider_api.as_deref());
        object.bool("stream", self.stream);
        object.u64("status", u64::from(self.status));
        object.bool("complete", self.complete);
        let attempts = object.member("attempts");
        attempts.push('[');
        for (i, attempt) in self.attempts.iter().enumerate() {
            if i > 0 {
                attempts.push(',');
            }
            attempt.write_json(attempts);
        }
        attempts.push(']');
        object.string("usage_source", self.usage_source.as_str());
        self.usage.write_json(object.member("usage"));
        object.u64_or_null("cost_nano", self.cost_nano);
        object.string_or_null("currency", self.currency.as_deref());
        object.string_or_null("price_version", self.price_version.as_deref());
        object.u64_or_null("ttft_ms", self.ttft_ms);
        object.u64("duration_ms", self.duration_ms);
        object.close();
        out
    }

    /// Reads a published record (the property's bytes, a log line); `None` if it is not one.
    pub fn from_json(bytes: &[u8]) -> Option<Record> {
        serde_json::from_slice(bytes).ok()
    }
}

/// What a reader that settles a charge needs of a published [`Record`]: the token counts and
/// the cost. [`Charge::from_json`] accepts exactly what [`Record::from_json`] accepts (every
/// member is still checked), without copying the members it drops.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Charge {
    /// [`Record::usage`].
    pub usage: UsageFields,
    /// [`Record::cost_nano`].
    pub cost_nano: Option<u64>,
    /// [`Record::currency`].
    pub currency: Option<String>,
}

impl Charge {
    /// Reads a published record; `None` exactly when [`Record::from_json`] is.
    ///
    /// A record as usage-accounting writes it is read by [`Charge::scan`], a single pass
    /// that checks every member as serde would; anything it is not sure of (escapes, a
    /// missing, repeated or unknown member, a number serde reads as a float, a malformed
    /// document) goes to the serde parse, which decides.
    pub fn from_json(bytes: &[u8]) -> Option<Charge> {
        Charge::scan(bytes).or_else(|| Charge::from_json_serde(bytes))
    }

    /// The serde parse of [`Charge::from_json`].
    fn from_json_serde(bytes: &[u8]) -> Option<Charge> {
        let view: RecordView<'_> = serde_json::from_slice(bytes).ok()?;
        Some(Charge {
            usage: view.usage,
            cost_nano: view.cost_nano,
            currency: view.currency.map(|c| c.0.into_owned()),
        })
    }

    /// The fast path of [`Charge::from_json`]: `Some` only for a record serde accepts (then
    /// with what serde reads), `None` for anything else — including records serde accepts
    /// that this pass does not handle: one object, every member of [`Record`] exactly once
    /// and no other, in any order; strings without escapes; integers without sign, fraction
    /// or exponent; whitespace as JSON allows it.
    fn scan(bytes: &[u8]) -> Option<Charge> {
        let mut at = Cursor::new(bytes)?;
        let mut charge = Charge::default();
        let seen = at.object(|at, key| match key {
            "request_id" => at.string().map(|_| 0),
            "ts_ms" => at.u64().map(|_| 1),
            "consumer" => at.text_or_null().map(|_| 2),
            "tenant" => at.text_or_null().map(|_| 3),
            "key_id" => at.text_or_null().map(|_| 4),
            "tier" => at.text_or_null().map(|_| 5),
            "project" => at.text_or_null().map(|_| 6),
            "agent" => at.text_or_null().map(|_| 7),
            "run_id" => at.text_or_null().map(|_| 8),
            "model_group" => at.text_or_null().map(|_| 9),
            "deployment" => at.text_or_null().map(|_| 10),
            "model" => at.text_or_null().map(|_| 11),
            "api" => at.string().map(|_| 12),
            "provider_api" => at.text_or_null().map(|_| 13),
            "stream" => at.bool().map(|_| 14),
            "status" => at.u16().map(|_| 15),
            "complete" => at.bool().map(|_| 16),
            "attempts" => at.attempts().map(|()| 17),
            "usage_source" => at
                .string()
                .filter(|s| matches!(*s, "upstream" | "estimated"))
                .map(|_| 18),
            "usage" => at.usage().map(|usage| {
                charge.usage = usage;
                19
            }),
            "cost_nano" => at.u64_or_null().map(|cost| {
                charge.cost_nano = cost;
                20
            }),
            "currency" => at.text_or_null().map(|currency| {
                charge.currency = currency.map(str::to_string);
                21
            }),
            "price_version" => at.text_or_null().map(|_| 22),
            "ttft_ms" => at.u64_or_null().map(|_| 23),
            "duration_ms" => at.u64().map(|_| 24),
            _ => None,
        })?;
        at.end()?;
        (seen == (1 << 25) - 1).then_some(charge)
    }
}

impl Cursor<'_> {
    /// `[{"deployment":…,"status":…},…]`, each attempt with both members once.
    fn attempts(&mut self) -> Option<()> {
        if !self.eat(b'[') {
            return None;
        }
        if self.eat(b']') {
            return Some(());
        }
        loop {
            let seen = self.object(|cursor, key| match key {
                "deployment" => cursor.text_or_null().map(|_| 0),
                "status" => cursor.u16().map(|_| 1),
                _ => None,
            })?;
            if seen != 0b11 {
                return None;
            }
            if !self.eat(b',') {
                return self.eat(b']').then_some(());
            }
        }
    }

    /// The usage object, each of its six counts once.
    fn usage(&mut self) -> Option<UsageFields> {
        let mut usage = UsageFields::default();
        let seen = self.object(|cursor, key| {
            let (field, bit) = match key {
                "prompt_tokens" => (&mut usage.prompt_tokens, 0),
                "completion_tokens" => (&mut usage.completion_tokens, 1),
                "cached_prompt_tokens" => (&mut usage.cached_prompt_tokens, 2),
                "cache_write_tokens" => (&mut usage.cache_write_tokens, 3),
                "reasoning_tokens" => (&mut usage.reasoning_tokens, 4),
                "total_tokens" => (&mut usage.total_tokens, 5),
                _ => return None,
            };
            *field = cursor.u64()?;
            Some(bit)
        })?;
        (seen == 0b11_1111).then_some(usage)
    }
}

impl From<&Record> for Charge {
    fn from(record: &Record) -> Charge {
        Charge {
            usage: record.usage,
            cost_nano: record.cost_nano,
            currency: record.currency.clone(),
        }
    }
}

use crate::route_info::Text;

/// [`Attempt`], its string borrowed.
#[derive(Deserialize)]
#[allow(dead_code)]
struct AttemptView<'a> {
    #[serde(borrow)]
    deployment: Option<Text<'a>>,
    status: u16,
}

/// [`Record`]'s members and types, strings borrowed: what [`Charge::from_json`] checks.
/// Members it does not keep are read only to be checked.
#[derive(Deserialize)]
#[allow(dead_code)]
struct RecordView<'a> {
    #[serde(borrow)]
    request_id: Text<'a>,
    ts_ms: u64,
    #[serde(borrow)]
    consumer: Option<Text<'a>>,
    #[serde(borrow)]
    tenant: Option<Text<'a>>,
    #[serde(default, borrow)]
    key_id: Option<Text<'a>>,
    #[serde(default, borrow)]
    tier: Option<Text<'a>>,
    #[serde(borrow)]
    project: Option<Text<'a>>,
    #[serde(borrow)]
    agent: Option<Text<'a>>,
    #[serde(borrow)]
    run_id: Option<Text<'a>>,
    #[serde(borrow)]
    model_group: Option<Text<'a>>,
    #[serde(borrow)]
    deployment: Option<Text<'a>>,
    #[serde(borrow)]
    model: Option<Text<'a>>,
    #[serde(borrow)]
    api: Text<'a>,
    #[serde(default, borrow)]
    provider_api: Option<Text<'a>>,
    stream: bool,
    status: u16,
    complete: bool,
    #[serde(borrow)]
    attempts: Vec<AttemptView<'a>>,
    usage_source: UsageSource,
    usage: UsageFields,
    cost_nano: Option<u64>,
    #[serde(borrow)]
    currency: Option<Text<'a>>,
    #[serde(borrow)]
    price_version: Option<Text<'a>>,
    ttft_ms: Option<u64>,
    duration_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn record() -> Record {
        Record {
            request_id: "r".into(),
            ts_ms: 1,
            consumer: Some("team-a".into()),
            tenant: None,
            key_id: Some("team-a-prod".into()),
            tier: None,
            project: None,
            agent: None,
            run_id: None,
            model_group: Some("fast".into()),
            deployment: Some("east".into()),
            model: None,
            api: "chat.completions".into(),
            provider_api: Some("messages".into()),
            stream: true,
            status: 200,
            complete: true,
            attempts: vec![Attempt {
                deployment: Some("east".into()),
                status: 200,
            }],
            usage_source: UsageSource::Upstream,
            usage: UsageFields::from(Usage {
                prompt_tokens: 10,
                completion_tokens: 2,
                ..Usage::default()
            }),
            cost_nano: Some(243_600),
            currency: Some("USD".into()),
            price_version: None,
            ttft_ms: None,
            duration_ms: 5,
        }
    }

    #[test]
    fn serialization_is_pinned() {
        // The exact bytes readers (token-ratelimit, reports, log pipelines) parse.
        let line = record().to_json();
        assert_eq!(
            line,
            r#"{"request_id":"r","ts_ms":1,"consumer":"team-a","tenant":null,"key_id":"team-a-prod","tier":null,"project":null,"agent":null,"run_id":null,"model_group":"fast","deployment":"east","model":null,"api":"chat.completions","provider_api":"messages","stream":true,"status":200,"complete":true,"attempts":[{"deployment":"east","status":200}],"usage_source":"upstream","usage":{"prompt_tokens":10,"completion_tokens":2,"cached_prompt_tokens":0,"cache_write_tokens":0,"reasoning_tokens":0,"total_tokens":12},"cost_nano":243600,"currency":"USD","price_version":null,"ttft_ms":null,"duration_ms":5}"#
        );
        assert_eq!(Record::from_json(line.as_bytes()), Some(record()));
    }

    #[test]
    fn a_record_from_before_key_id_and_tier_reads_with_them_null() {
        let old = record()
            .to_json()
            .replace(r#""key_id":"team-a-prod","tier":null,"#, "");
        assert!(!old.contains("key_id"), "{old}");
        let read = Record::from_json(old.as_bytes()).expect("an older record");
        assert_eq!((read.key_id, read.tier), (None, None));
        assert_eq!(read.consumer.as_deref(), Some("team-a"));
    }

    #[test]
    fn a_record_from_before_provider_api_reads_with_it_null() {
        let old = record()
            .to_json()
            .replace(r#""provider_api":"messages","#, "");
        assert!(!old.contains("provider_api"), "{old}");
        let read = Record::from_json(old.as_bytes()).expect("an older record");
        assert_eq!(read.provider_api, None);
        assert_eq!(read.api, "chat.completions");
        assert_eq!(
            Charge::from_json(old.as_bytes()),
            Some(Charge::from(&record()))
        );
        // and one without it written now
        let unknown = Record {
            provider_api: None,
            ..record()
        };
        assert!(unknown.to_json().contains(r#""provider_api":null,"#));
    }

    #[test]
    fn a_record_with_escapes_round_trips_as_one_json_line() {
        let record = Record {
            project: Some("p\"x".into()),
            agent: Some("\u{8}\u{c}\n\u{1f}\u{7f}\\é😀".into()),
            usage_source: UsageSource::Estimated,
            price_version: Some("v1".into()),
            ttft_ms: Some(u64::MAX),
            ..record()
        };
        let line = record.to_json();
        assert_eq!(line, serde_json::to_string(&record).unwrap());
        assert!(!line.contains('\n'));
        assert!(line.contains(r#""usage_source":"estimated""#), "{line}");
        assert_eq!(Record::from_json(line.as_bytes()), Some(record));
    }

    #[test]
    fn a_charge_accepts_exactly_what_a_record_accepts() {
        let line = record().to_json();
        let escaped = Record {
            currency: Some("E\"UR".into()),
            project: Some("p\\x".into()),
            ..record()
        }
        .to_json();
        let mut cases = vec![
            line.clone(),
            escaped,
            line.replace(r#""key_id":"team-a-prod","tier":null,"#, ""),
            line.replace(r#""consumer":"team-a","#, ""),
            line.replace(r#""cost_nano":243600,"#, ""),
            line.replace(r#""api":"chat.completions","#, ""),
            line.replace(r#""provider_api":"messages","#, ""),
            line.replace(r#""provider_api":"messages""#, r#""provider_api":null"#),
            line.replace(r#""provider_api":"messages""#, r#""provider_api":2"#),
            line.replace(r#""api":"chat.completions""#, r#""api":1"#),
            line.replace(r#""tenant":null"#, r#""tenant":"t","tenant":"u""#),
            line.replace(
                r#""deployment":"east","status""#,
                r#""deployment":3,"status""#,
            ),
            line.replace(r#""status":200}]"#, r#""status":70000}]"#),
            line.replace(r#""reasoning_tokens":0,"#, ""),
            line.replace(r#""duration_ms":5"#, r#""duration_ms":5,"extra":{"a":[1]}"#),
            line.replace("upstream", "guess"),
            format!("{line} x"),
            String::new(),
            "{}".into(),
        ];
        cases.push(line.replace(r#""currency":"USD""#, r#""currency":null"#));
        for case in &cases {
            let record = Record::from_json(case.as_bytes());
            assert_eq!(
                Charge::from_json(case.as_bytes()),
                record.as_ref().map(Charge::from),
                "{case}"
            );
        }
        let charge = Charge::from_json(line.as_bytes()).unwrap();
        assert_eq!(charge.usage.total_tokens, 12);
        assert_eq!(charge.cost_nano, Some(243_600));
        assert_eq!(charge.currency.as_deref(), Some("USD"));
    }

    #[test]
    fn from_json_rejects_what_is_not_a_record() {
        let line = record().to_json();
        for bad in [
            &b""[..],
            b"null",
            b"{}",
            b"[1,2]",
            b"\xff\xfe",
            &line.as_bytes()[..line.len() - 1],
            line.replace("\"status\":200,\"complete\"", "\"status\":-1,\"complete\"")
                .as_bytes(),
            line.replace("upstream", "guess").as_bytes(),
        ] {
            assert_eq!(
                Record::from_json(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// The hand scan against serde on generated records, their variants (members removed,
    /// repeated, reordered, whitespace) and byte mutations of them (native only: proptest is
    /// not built for the wasm32 test run).
    #[cfg(not(target_arch = "wasm32"))]
    mod scan_agrees_with_serde {
        use super::*;
        use proptest::prelude::*;

        /// Names, mostly plain; some with what JSON escapes (quotes, backslashes, every
        /// control character) and multi-byte characters; some arbitrary.
        fn text() -> impl Strategy<Value = String> {
            prop_oneof![
                8 => "[a-z0-9._-]{0,10}",
                2 => "[a-z\"\\\\/\\x00-\\x1f\\x7f\u{e9}\u{1F600} ]{0,8}",
                1 => any::<String>(),
            ]
        }

        fn count() -> impl Strategy<Value = u64> {
            prop_oneof![0u64..2000, any::<u64>(), Just(0), Just(u64::MAX)]
        }

        prop_compose! {
            fn record()(
                names in prop::collection::vec(prop::option::of(text()), 13),
                ids in (text(), prop_oneof!["[a-z.]{1,12}", text()]),
                flags in (any::<bool>(), any::<bool>(), prop_oneof![any::<u16>(), Just(u16::MAX)], any::<bool>()),
                attempts in prop::collection::vec((prop::option::of(text()), any::<u16>()), 0..3),
                counts in prop::collection::vec(count(), 6),
                times in (count(), prop::option::of(count()), count(), prop::option::of(count())),
            ) -> Record {
                let name = |i: usize| names.get(i).cloned().flatten();
                let at = |i: usize| counts.get(i).copied().unwrap_or(0);
                Record {
                    request_id: ids.0,
                    ts_ms: times.0,
                    consumer: name(0),
                    tenant: name(1),
                    key_id: name(2),
                    tier: name(3),
                    project: name(4),
                    agent: name(5),
                    run_id: name(6),
                    model_group: name(7),
                    deployment: name(8),
                    model: name(9),
                    api: ids.1,
                    provider_api: name(12),
                    stream: flags.0,
                    status: flags.2,
                    complete: flags.1,
                    attempts: attempts
                        .into_iter()
                        .map(|(deployment, status)| Attempt { deployment, status })
                        .collect(),
                    usage_source: if flags.3 { UsageSource::Upstream } else { UsageSource::Estimated },
                    usage: UsageFields {
                        prompt_tokens: at(0),
                        completion_tokens: at(1),
                        cached_prompt_tokens: at(2),
                        cache_write_tokens: at(3),
                        reasoning_tokens: at(4),
                        total_tokens: at(5),
                    },
                    cost_nano: times.1,
                    currency: name(10),
                    price_version: name(11),
                    ttft_ms: times.3,
                    duration_ms: times.2,
                }
            }
        }

        /// One record's JSON in one of the shapes a reader may meet.
        fn shaped(record: &Record, shape: u8, pick: usize) -> String {
            let line = record.to_json();
            let value = serde_json::to_value(record).unwrap_or_default();
            let members: Vec<(String, serde_json::Value)> = value
                .as_object()
                .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default();
            let member = |(k, v): &(String, serde_json::Value)| format!("{}:{v}", json!(k));
            let join = |members: &[(String, serde_json::Value)]| {
                let parts: Vec<String> = members.iter().map(member).collect();
                format!("{{{}}}", parts.join(","))
            };
            let i = pick % members.len().max(1);
            match shape % 6 {
                0 => line,
                // keys sorted (serde_json's map order)
                1 => value.to_string(),
                2 => serde_json::to_string_pretty(record).unwrap_or_default(),
                // a member missing
                3 => {
                    let mut m = members.clone();
                    if i < m.len() {
                        m.remove(i);
                    }
                    join(&m)
                }
                // a member twice
                4 => {
                    let mut m = members.clone();
                    if let Some(extra) = m.get(i).cloned() {
                        m.push(extra);
                    }
                    join(&m)
                }
                // an unknown member
                _ => line.replacen('{', "{\"extra\":[1,{\"a\":null}],", 1),
            }
        }

        use crate::json::mutate::{apply, edit, value_edges, SNIPPETS};
        use serde_json::json;

        /// Every snippet at every value edge of a few records, one at a time.
        #[test]
        fn on_every_snippet_at_every_value_edge() {
            let records = [
                super::record(),
                Record {
                    attempts: Vec::new(),
                    cost_nano: None,
                    currency: None,
                    ttft_ms: Some(0),
                    ..super::record()
                },
            ];
            for record in &records {
                for line in [
                    record.to_json(),
                    serde_json::to_string_pretty(record).unwrap(),
                ] {
                    let bytes = line.into_bytes();
                    for at in value_edges(&bytes) {
                        for snippet in SNIPPETS {
                            let mut case = bytes.clone();
                            case.splice(at..at, snippet.bytes());
                            let reference = serde(&case);
                            let text = String::from_utf8_lossy(&case);
                            if let Some(scanned) = Charge::scan(&case) {
                                assert_eq!(Some(scanned), reference, "{text}");
                            }
                            assert_eq!(Charge::from_json(&case), reference, "{text}");
                        }
                    }
                }
            }
        }

        /// The reference: the whole record through serde.
        fn serde(bytes: &[u8]) -> Option<Charge> {
            Record::from_json(bytes).as_ref().map(Charge::from)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            /// What the scan accepts, serde accepts, with the same charge; `from_json` is
            /// serde's answer on every input.
            #[test]
            fn on_records_and_their_mutations(
                record in record(),
                shape in any::<u8>(),
                pick in any::<usize>(),
                edits in prop::collection::vec(edit(), 0..4),
            ) {
                let bytes = apply(shaped(&record, shape, pick).into_bytes(), &edits);
                let reference = serde(&bytes);
                if let Some(scanned) = Charge::scan(&bytes) {
                    prop_assert_eq!(Some(scanned), reference.clone(), "{}", String::from_utf8_lossy(&bytes));
                }
                prop_assert_eq!(Charge::from_json(&bytes), reference);
            }

            /// The hand-written writer writes byte for byte what the serde derive writes.
            #[test]
            fn the_writer_writes_what_serde_writes(record in record()) {
                let expected = serde_json::to_string(&record).unwrap_or_default();
                prop_assert_eq!(record.to_json(), expected);
            }

            /// A record as usage-accounting writes it takes the fast path unless a string has an
            /// escape (so the property above is about the scan, not only about the fallback).
            #[test]
            fn a_plain_record_is_scanned(record in record()) {
                let line = record.to_json();
                // escapes are left to serde
                let expected = (!line.contains('\\')).then(|| Charge::from(&record));
                prop_assert_eq!(Charge::scan(line.as_bytes()), expected);
            }
        }
    }
}
