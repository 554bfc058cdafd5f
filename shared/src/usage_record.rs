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
//!  "deployment":"east","model":"gpt-4o-mini","api":"chat.completions","stream":true,
//!  "status":200,"complete":true,"attempts":[{"deployment":"east","status":200}],
//!  "usage_source":"upstream","usage":{"prompt_tokens":1000,"completion_tokens":100,
//!  "cached_prompt_tokens":600,"cache_write_tokens":0,"reasoning_tokens":0,"total_tokens":1100},
//!  "cost_nano":243600,"currency":"USD","price_version":"2026-11","ttft_ms":180,"duration_ms":950}
//! ```
//! `usage_source` is `upstream` (the provider's numbers) or `estimated` (counted by the gateway:
//! stream cut, provider without usage, client gone). `cost_nano` is in nano-units (10⁻⁹) of
//! `currency`; it and `price_version` are null when no price is configured for the request.
//! `key_id` is key-auth's `x-llm-key-id` (the key's `id`, which rotation keeps, else its digest
//! prefix) and `tier` its `x-llm-tier`. Every member is always present (absent values are
//! `null`), in the order above; a record written before `key_id` and `tier` existed reads with
//! them `null`.

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
    /// `chat.completions`, `responses`, `messages`, `embeddings`.
    pub api: String,
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

impl Record {
    /// The record as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
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
    pub fn from_json(bytes: &[u8]) -> Option<Charge> {
        let view: RecordView<'_> = serde_json::from_slice(bytes).ok()?;
        Some(Charge {
            usage: view.usage,
            cost_nano: view.cost_nano,
            currency: view.currency.map(|c| c.0.into_owned()),
        })
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
            r#"{"request_id":"r","ts_ms":1,"consumer":"team-a","tenant":null,"key_id":"team-a-prod","tier":null,"project":null,"agent":null,"run_id":null,"model_group":"fast","deployment":"east","model":null,"api":"chat.completions","stream":true,"status":200,"complete":true,"attempts":[{"deployment":"east","status":200}],"usage_source":"upstream","usage":{"prompt_tokens":10,"completion_tokens":2,"cached_prompt_tokens":0,"cache_write_tokens":0,"reasoning_tokens":0,"total_tokens":12},"cost_nano":243600,"currency":"USD","price_version":null,"ttft_ms":null,"duration_ms":5}"#
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
    fn a_record_with_escapes_round_trips_as_one_json_line() {
        let record = Record {
            project: Some("p\"x".into()),
            usage_source: UsageSource::Estimated,
            price_version: Some("v1".into()),
            ..record()
        };
        let line = record.to_json();
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
}
