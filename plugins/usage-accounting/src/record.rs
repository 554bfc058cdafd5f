//! The attribution record: one per logical request, published as Envoy filter state, as a
//! JSON log line, and (Higress builds) appended to the Redis stream ledger.
//!
//! ```json
//! {"request_id":"…","ts_ms":1764480000000,"consumer":"team-a","tenant":"acme",
//!  "project":"search","agent":"planner","run_id":"r-1","model_group":"fast",
//!  "deployment":"east","model":"gpt-4o-mini","api":"chat.completions","stream":true,
//!  "status":200,"complete":true,"attempts":[{"deployment":"east","status":200}],
//!  "usage_source":"upstream","usage":{"prompt_tokens":1000,"completion_tokens":100,
//!  "cached_prompt_tokens":600,"cache_write_tokens":0,"reasoning_tokens":0,"total_tokens":1100},
//!  "cost_nano":243600,"currency":"USD","price_version":"2026-11","ttft_ms":180,"duration_ms":950}
//! ```
//! `usage_source` is `upstream` (the provider's numbers) or `estimated` (counted by the gateway:
//! stream cut, provider without usage, client gone). `cost_nano` is in nano-units (10⁻⁹) of
//! `currency`; it and `price_version` are null when no price is configured for the request.

use llm_gateway_shared::usage::Usage;
use serde::{Deserialize, Serialize};

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
}

/// A client-supplied attribution value as it may be recorded: at most 128 bytes, no control
/// characters (a log line stays one line; JSON escaping does the rest).
pub fn clean_attribution(value: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(value);
    let mut out: String = text.chars().filter(|c| !c.is_control()).collect();
    if out.len() > 128 {
        let mut cut = 128;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_as_one_json_line() {
        let record = Record {
            request_id: "r".into(),
            ts_ms: 1,
            consumer: Some("team-a".into()),
            tenant: None,
            project: Some("p\"x".into()),
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
            usage_source: UsageSource::Estimated,
            usage: UsageFields::default(),
            cost_nano: Some(243_600),
            currency: Some("USD".into()),
            price_version: Some("v1".into()),
            ttft_ms: None,
            duration_ms: 5,
        };
        let line = record.to_json();
        assert!(!line.contains('\n'));
        assert!(line.contains(r#""usage_source":"estimated""#), "{line}");
        let back: Record = serde_json::from_str(&line).unwrap();
        assert_eq!(back, record);
    }

    #[test]
    fn attribution_values_are_bounded() {
        assert_eq!(clean_attribution(b""), None);
        assert_eq!(clean_attribution(b"a\r\nb"), Some("ab".into()));
        assert_eq!(clean_attribution(&[b'x'; 500]).unwrap().len(), 128);
        assert_eq!(
            clean_attribution("é".repeat(100).as_bytes()).unwrap().len(),
            128
        );
    }
}
