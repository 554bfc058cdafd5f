//! What the host and the other filters hand a plugin: request headers (Envoy's header-map
//! encoding, or text lines), key-auth's decision on them, the attribution usage-accounting
//! reads from them, and the values plugins read back from filter state and shared data
//! (route info, usage records, breaker states, bucket leases, the budget journal, integer
//! properties, ledger lines).
//!
//! Input: `mode, clock byte, payload`. Checked:
//! - every client-supplied internal header (`x-llm-*`, `x-mse-consumer`) is removed, and so
//!   is every key-carrying header and query parameter when the request is let through;
//! - attribution values carry no control characters and are bounded;
//! - whatever decodes, encoded again, decodes to the same value;
//! - a provider's reset headers (`retry-after` & co., model-router's signals) never name a
//!   delay over a day.
#![no_main]

use key_auth::auth::{authenticate, Outcome};
use key_auth::config::KeyAuthConfig;
use libfuzzer_sys::fuzz_target;
use llm_gateway_fuzz::Input;
use llm_gateway_shared::headers;
use llm_gateway_shared::route_info::{Alternative, RouteInfo};
use llm_gateway_shared::usage_record::Record;
use llm_gateway_shared::wire;
use std::rc::Rc;

thread_local! {
    // keys: "sk-fuzz-team-a-0001" (team-a), "sk-fuzz-team-b-0002" (disabled), query param `key`
    static KEY_AUTH: Rc<KeyAuthConfig> = {
        let doc = r#"{"keys": [
            {"key_sha256": "KEY_A", "consumer": "team-a", "tenant": "acme", "groups": ["fast", "smart"], "expires_at": "2027-01-01T00:00:00Z"},
            {"key_sha256": "KEY_B", "consumer": "team-b", "groups": ["fast"], "disabled": true}
          ],
          "key_sources": ["authorization", "x-api-key", "api-key"],
          "query_param": "key"}"#
            .replace("KEY_A", &sha256_hex(b"sk-fuzz-team-a-0001"))
            .replace("KEY_B", &sha256_hex(b"sk-fuzz-team-b-0002"));
        Rc::new(key_auth::config::parse_document(doc.as_bytes()).unwrap().global().unwrap().clone())
    };
}

fn sha256_hex(key: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(key)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `name: value` lines (names lowercased, as Envoy gives them).
fn text_headers(payload: &[u8]) -> Vec<(String, Vec<u8>)> {
    payload
        .split(|&b| b == b'\n')
        .filter_map(|line| {
            let colon = line.iter().skip(1).position(|&b| b == b':')? + 1;
            let name = String::from_utf8_lossy(&line[..colon]).to_ascii_lowercase();
            let value = line[colon + 1..].trim_ascii().to_vec();
            Some((name, value))
        })
        .collect()
}

fn check_headers(pairs: &[(String, Vec<u8>)], now: i64) {
    let config = KEY_AUTH.with(Rc::clone);
    let plan = authenticate(Some(&config), pairs, now);
    let removed = |name: &str| plan.remove.iter().any(|r| r.eq_ignore_ascii_case(name));
    for (name, _) in pairs {
        if headers::is_internal(name) {
            assert!(removed(name), "client header {name:?} survives key-auth");
        }
    }
    if let Outcome::Allow { identity, .. } = &plan.outcome {
        for (name, _) in pairs {
            if ["authorization", "x-api-key", "api-key"]
                .contains(&name.to_ascii_lowercase().as_str())
            {
                assert!(
                    removed(name),
                    "the key in {name:?} would reach the provider"
                );
            }
        }
        for (name, value) in identity {
            assert!(
                !value.bytes().any(|b| b.is_ascii_control()),
                "{name} carries a control byte"
            );
        }
    }
    if let Some(path) = &plan.path {
        let query = path.split_once('?').map_or("", |(_, q)| q);
        assert!(
            !query
                .split('&')
                .any(|pair| pair.split('=').next() == Some("key")),
            "the key stays in the path"
        );
    }

    let attribution = usage_accounting::exchange::Attribution::from_headers(
        pairs
            .iter()
            .map(|(name, value)| (name.as_bytes(), value.as_slice())),
        || None,
    );
    for value in [
        Some(attribution.request_id.as_str()).filter(|s| !s.is_empty()),
        attribution.consumer.as_deref(),
        attribution.tenant.as_deref(),
        attribution.project.as_deref(),
        attribution.agent.as_deref(),
        attribution.run_id.as_deref(),
        attribution.model_group.as_deref(),
        attribution.deployment.as_deref(),
    ]
    .into_iter()
    .flatten()
    {
        assert!(value.len() <= 128 && !value.chars().any(char::is_control));
    }
}

/// model-router's reading of a provider response's reset headers.
fn check_signals(pairs: &[(String, Vec<u8>)], now: i64) {
    let header = |name: &str| {
        pairs
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| String::from_utf8(v.clone()).ok())
    };
    let now_ms = u64::try_from(now).unwrap_or(0).saturating_mul(1000);
    if let Some(ms) = model_router::signals::reset_after_ms(&header, now_ms) {
        assert!(ms <= model_router::signals::MAX_SIGNAL_MS, "{ms}");
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let mode = input.byte();
    let clock = input.byte();
    let payload = input.rest();
    // 2026-11-30, or a day after 2027-01-01 (the expiry of team-a's key)
    let now = if clock & 1 == 0 {
        1_796_005_345
    } else {
        1_798_848_000
    };

    match mode % 3 {
        0 => {
            if let Some(pairs) = wire::decode_header_map(payload) {
                let borrowed: Vec<(&str, &[u8])> = pairs
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_slice()))
                    .collect();
                let again = wire::decode_header_map(&wire::encode_header_map(&borrowed));
                assert_eq!(again.as_ref(), Some(&pairs), "header map round trip");
                check_headers(&pairs, now);
            }
        }
        1 => {
            let pairs = text_headers(payload);
            check_headers(&pairs, now);
            check_signals(&pairs, now);
        }
        _ => {
            let _ = wire::decode_property_u64(payload);
            if let Some(info) = RouteInfo::from_json(payload) {
                // what usage-accounting derives from it
                let attempts = usage_accounting::exchange::router_attempts(&info, 200);
                assert!(attempts.len() <= 64);
                let _ = usage_accounting::exchange::client_api(&info);
                assert_eq!(RouteInfo::from_json(&info.to_json()), Some(info));
            }
            if let Some(alternative) = Alternative::from_json(payload) {
                let _ = (alternative.group(), alternative.switch_writes());
                assert_eq!(
                    Alternative::from_json(&alternative.to_json()),
                    Some(alternative)
                );
            }
            if let Some(record) = Record::from_json(payload) {
                assert_eq!(Record::from_json(record.to_json().as_bytes()), Some(record));
            }
            let state = model_router::breaker::State::decode(payload);
            assert_eq!(model_router::breaker::State::decode(&state.encode()), state);
            if let Some(local) = token_ratelimit::bucket::Local::decode(payload) {
                assert_eq!(
                    token_ratelimit::bucket::Local::decode(&local.encode()),
                    Some(local)
                );
            }
            let journal = token_ratelimit::budget::Journal::decode(payload);
            assert_eq!(
                token_ratelimit::budget::Journal::decode(&journal.encode()),
                journal
            );
            let text = String::from_utf8_lossy(payload);
            let _ = usage_accounting::report::record_from_line(&text);
            if let Ok(month) = usage_accounting::report::Month::parse(text.trim()) {
                let (start, end) = month.range_ms();
                assert!(start < end);
                assert_eq!(usage_accounting::report::Month::containing(start), month);
            }
            let _ = key_auth::rfc3339::parse_unix_seconds(text.trim());
            let _ = usage_accounting::pricing::parse_decimal_nano(text.trim());
            let _ = token_ratelimit::config::parse_money(text.trim());
        }
    }
});
