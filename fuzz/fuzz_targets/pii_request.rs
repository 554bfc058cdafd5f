//! pii-redaction's request side: the detectors, `redact_body` in both scopes (preamble
//! included), output rules over a whole body, and `restore_body`.
//!
//! Input: `config selector, path selector, body`. Checked:
//! - restore(mask(x)) = x: with mask-and-restore rules, restoring a redacted raw body gives
//!   the body back, and restoring each redacted message string gives the original string
//!   (every other string is untouched);
//! - a rewritten JSON body (preamble inserted or not) is valid JSON; so are the bodies the
//!   output rules and the restorer produce from valid JSON;
//! - a block rule's refusal names the rule, never the value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_gateway_fuzz::Input;
use llm_gateway_shared::json::{self, Limits, Scalar, Seg};
use llm_gateway_shared::request::Api;
use pii_redaction::config::{parse_document, BodyScope, PiiConfig};
use pii_redaction::mask::PlaceholderMap;
use pii_redaction::request::{is_message_text, redact_body, Redaction};
use pii_redaction::response::{redact_output_body, restore_body};
use std::rc::Rc;

const CONFIGS: [&str; 4] = [
    // every built-in detector, mask and restore (the default)
    "{}",
    r#"{"scope": "raw_body"}"#,
    r#"{"rules": [
        {"detector": "email"},
        {"detector": "card", "action": "hash"},
        {"detector": "private_key", "action": "block"},
        {"detector": "phone_cn", "restore": false},
        {"name": "EMPLOYEE", "pattern": "E-[0-9]{6}"},
        {"name": "CODENAME", "words": ["Project Falcon"], "action": "block"}
     ],
     "hash_salt": "fuzz-salt",
     "preamble": "Keep tokens like [EMAIL_1] exactly as written."}"#,
    r#"{"output_rules": [{"detector": "ipv4"}, {"detector": "email", "action": "hash"}],
        "hash_salt": "fuzz-salt",
        "preamble": "Keep [EMAIL_1] as is."}"#,
];
const PATHS: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/messages",
    "/v1/responses",
    "/v1/embeddings",
];

thread_local! {
    static PARSED: Vec<Rc<PiiConfig>> = CONFIGS
        .iter()
        .map(|doc| parse_document(doc.as_bytes()).unwrap().global().cloned().unwrap())
        .collect();
}

/// (path, decoded text) of every string of a valid JSON document, in order.
fn strings(body: &[u8]) -> Vec<(Vec<Seg>, String)> {
    let mut found = Vec::new();
    json::walk(body, &Limits::default(), &mut |path, kind, span| {
        if kind == Scalar::String {
            let text = body.get(span).and_then(json::decode_lossy).unwrap();
            found.push((path.to_vec(), text));
        }
    })
    .unwrap();
    found
}

fn valid(bytes: &[u8]) -> bool {
    json::scan_value(bytes, &Limits::default()).is_ok()
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let which = usize::from(input.byte()) % CONFIGS.len();
    let path = PATHS[usize::from(input.byte()) % PATHS.len()];
    let body = input.rest();
    let config = PARSED.with(|all| all[which].clone());
    let api = Api::from_path(path);

    let mut map = PlaceholderMap::default();
    let redaction = redact_body(&config, api, body, &mut map);
    let restores_all = which <= 1;
    match &redaction {
        Redaction::Rewritten(new) if config.scope == BodyScope::RawBody => {
            let text = std::str::from_utf8(body).unwrap();
            let new = std::str::from_utf8(new).unwrap();
            assert_eq!(map.restore(new), text, "restore(mask(x)) != x");
        }
        Redaction::Rewritten(new) => {
            assert!(
                valid(new),
                "redaction made invalid JSON: {:?}",
                String::from_utf8_lossy(new)
            );
            if restores_all {
                let before = strings(body);
                let after = strings(new);
                assert_eq!(before.len(), after.len());
                for ((path, old), (new_path, new)) in before.iter().zip(&after) {
                    assert_eq!(path, new_path);
                    if is_message_text(path) {
                        assert_eq!(&map.restore(new), old, "restore(mask(x)) != x");
                    } else {
                        assert_eq!(new, old, "a string that is not message text changed");
                    }
                }
            }
        }
        Redaction::Blocked(blocked) => {
            assert!(blocked.rule == "CODENAME" || blocked.rule == "PRIVATE_KEY");
        }
        Redaction::Unchanged | Redaction::Invalid(_) => {}
    }
    let _ = (map.total(), map.counts().count(), map.has_restorable());

    // the response side over the same bytes, with this request's map
    let is_json = valid(body);
    if let Some(output) = &config.output {
        let mut response_map = map.clone();
        if let Some(new) = redact_output_body(output, &mut response_map, body) {
            assert!(is_json && valid(&new), "output rules made invalid JSON");
        }
    }
    if let Some(restored) = restore_body(&map, body) {
        assert!(!is_json || valid(&restored), "restoring made invalid JSON");
    }
});
