use super::*;
use crate::auth::tests::with_store;
use crate::auth::NoStore;
use crate::config::{parse_document, KeyEntry};
use llm_gateway_shared::headers;
use llm_gateway_shared::rules::RuleSet;
use llm_gateway_shared::stage::{Core as _, Refusal as _};
use sha2::{Digest, Sha256};

const KEY: &str = "sk-test-team-a-0123456789";
const NOW: i64 = 1_796_005_345;

fn sha(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn rules(extra: &str) -> RuleSet<KeyAuthConfig> {
    let doc = format!(
        r#"{{"keys":[{{"key_sha256":"{}","consumer":"team-a","tenant":"acme","groups":["fast"]}}]{extra}}}"#,
        sha(KEY)
    );
    parse_document(doc.as_bytes()).unwrap()
}

fn req(pairs: &[(&str, &str)]) -> Headers {
    pairs
        .iter()
        .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
        .collect()
}

fn secret() -> Secret {
    Secret::new([7; 32])
}

/// The driver's loop (`host::stage::carry`) against a host that refuses the commands `fails`
/// picks: the flow and the commands carried out.
fn carry(
    exchange: &mut Exchange,
    mut flow: Flow,
    fails: impl Fn(&Command) -> bool,
) -> (Flow, Vec<Command>) {
    let mut done = Vec::new();
    while let Some(command) = exchange.poll() {
        if fails(&command) {
            let after = stage::Core::failed(exchange, command, "refused".into());
            if after != Flow::Continue {
                flow = after;
            }
        } else {
            done.push(command);
        }
    }
    (flow, done)
}

fn run(
    config: Option<&KeyAuthConfig>,
    pairs: &[(&str, &str)],
    fails: impl Fn(&Command) -> bool,
) -> (Flow, Vec<Command>) {
    let headers = req(pairs);
    let secret = secret();
    let request = Request {
        config,
        headers: &headers,
        now: NOW,
        secret: &secret,
    };
    let mut exchange = Exchange::default();
    let flow = exchange.authenticate(&request, &mut NoStore);
    carry(&mut exchange, flow, fails)
}

fn never(_: &Command) -> bool {
    false
}

fn set(name: &str) -> impl Fn(&Command) -> bool + '_ {
    move |c| matches!(c, Effect::SetHeader(_, n, _) if n == name)
}

fn refusal(commands: &[Command]) -> Option<&Refusal> {
    commands.iter().find_map(|c| match c {
        Effect::Refuse(r) => Some(r),
        _ => None,
    })
}

#[test]
fn every_counter_is_named() {
    let all = counters();
    assert_eq!(all.len(), 1 + DenyReason::ALL.len());
    assert!(all.contains(&(Metric::Allowed, "llm_gateway.key_auth.allowed".into())));
    assert!(all.contains(&(
        Metric::Denied(DenyReason::StoreUnavailable),
        "llm_gateway.key_auth.denied.key_store_unavailable".into()
    )));
}

#[test]
fn the_clock_is_read_only_when_needed_and_fails_closed() {
    let plain = rules(r#","reentry":false"#);
    let plain = plain.global().unwrap();
    let read = || -> Option<u64> { panic!("the clock was read") };
    assert_eq!(seconds(None, read), 0);
    assert_eq!(seconds(Some(plain), read), 0); // reentry off, nothing expires
    let ticketed = rules(r#","reentry":true"#);
    let ticketed = ticketed.global().unwrap();
    assert!(ticketed.needs_clock());
    assert_eq!(seconds(Some(ticketed), || Some(1_500_000_000_123)), 1_500);
    assert_eq!(seconds(Some(ticketed), || None), i64::MAX);
    assert_eq!(
        seconds(Some(ticketed), || Some(u64::MAX)),
        (u64::MAX / 1_000_000_000) as i64
    );
}

#[test]
fn an_allowed_request_loses_its_key_and_spoofs_then_gets_its_identity() {
    let rules = rules("");
    let auth = format!("Bearer {KEY}");
    let (flow, done) = run(
        rules.global(),
        &[
            (":method", "POST"),
            (":authority", "gw.example"),
            ("authorization", &auth),
            ("x-llm-consumer", "admin"),
        ],
        never,
    );
    assert_eq!(flow, Flow::Continue);
    let id = sha(KEY)[..16].to_string();
    let mut want = vec![
        Effect::Count(Metric::Allowed, 1),
        Effect::RemoveHeader(Map::Request, "x-llm-consumer".into()),
        Effect::RemoveHeader(Map::Request, "authorization".into()),
    ];
    for (name, value) in [
        (headers::CONSUMER, "team-a"),
        (headers::HIGRESS_CONSUMER, "team-a"),
        (headers::TENANT, "acme"),
        (headers::GROUPS, "fast"),
        (headers::KEY_ID, id.as_str()),
    ] {
        want.push(Effect::SetHeader(Map::Request, name.into(), value.into()));
    }
    assert_eq!(done[..want.len()], want[..]);
    // the ticket for a redirect, in filter state only
    match done.get(want.len()) {
        Some(Effect::SetProperty { name, shared, .. }) => {
            assert_eq!(name, reentry::PROPERTY);
            assert!(!shared);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(done.len(), want.len() + 1);
}

#[test]
fn a_refused_key_is_counted_logged_without_the_key_and_refused() {
    let rules = rules("");
    let (flow, done) = run(rules.global(), &[("x-api-key", "sk-nope-nope-nope")], never);
    assert_eq!(flow, Flow::Refused);
    assert_eq!(
        done[0],
        Effect::Count(Metric::Denied(DenyReason::Unknown), 1)
    );
    assert_eq!(
        done[1],
        Effect::RemoveHeader(Map::Request, "x-api-key".into())
    );
    let Effect::Log(Level::Info, line) = &done[2] else {
        panic!("{done:?}")
    };
    assert!(
        line.starts_with("key-auth: denied invalid_api_key key_id="),
        "{line}"
    );
    assert!(!line.contains("sk-nope"), "{line}");
    let reject = refusal(&done).unwrap().reject();
    assert_eq!(reject.status, 401);
    // no key at all: no key id
    let (_, done) = run(rules.global(), &[], never);
    assert!(done.contains(&Effect::Log(
        Level::Info,
        "key-auth: denied missing_api_key key_id=-".into()
    )));
}

#[test]
fn a_request_no_config_covers_is_skipped_but_spoofs_still_go() {
    let (flow, done) = run(None, &[("x-llm-tenant", "x")], never);
    assert_eq!(flow, Flow::Continue);
    assert_eq!(
        done,
        vec![Effect::RemoveHeader(Map::Request, "x-llm-tenant".into())]
    );
}

#[test]
fn a_header_that_cannot_be_removed_stops_the_request_before_the_provider() {
    let rules = rules("");
    let auth = format!("Bearer {KEY}");
    let (flow, done) = run(rules.global(), &[("authorization", &auth)], |c| {
        matches!(c, Effect::RemoveHeader(..))
    });
    assert_eq!(flow, Flow::Refused);
    // counted before, nothing set after: a log line and the 500
    assert_eq!(done[0], Effect::Count(Metric::Allowed, 1));
    assert_eq!(
        done[1],
        Effect::Log(
            Level::Error,
            "key-auth: cannot remove header authorization: refused".into()
        )
    );
    assert_eq!(done[2], Effect::Refuse(Refusal::CannotSanitize));
    assert_eq!(done.len(), 3);
    assert_eq!(
        Refusal::CannotSanitize.reject(),
        Reject::internal("cannot sanitize the request")
    );
    // a denied request whose key cannot be removed: the same 500, no denial line
    let (flow, done) = run(rules.global(), &[("x-api-key", "sk-nope")], |c| {
        matches!(c, Effect::RemoveHeader(..))
    });
    assert_eq!(flow, Flow::Refused);
    assert_eq!(refusal(&done), Some(&Refusal::CannotSanitize));
    assert!(!done
        .iter()
        .any(|c| matches!(c, Effect::Log(Level::Info, _))));
}

#[test]
fn a_path_or_identity_that_cannot_be_written_refuses() {
    let rules = rules(r#","query_param":"key""#);
    let path = format!("/v1/models?key={KEY}");
    let (flow, done) = run(rules.global(), &[(":path", &path)], set(":path"));
    assert_eq!(flow, Flow::Refused);
    assert_eq!(refusal(&done), Some(&Refusal::CannotSanitize));
    assert!(done.contains(&Effect::Log(
        Level::Error,
        "key-auth: cannot strip the key from the path: refused".into()
    )));
    assert!(!done.iter().any(|c| matches!(c, Effect::SetHeader(..))));
    let (flow, done) = run(rules.global(), &[(":path", &path)], set(headers::TENANT));
    assert_eq!(flow, Flow::Refused);
    assert_eq!(refusal(&done), Some(&Refusal::CannotSetIdentity));
    assert!(done.contains(&Effect::Log(
        Level::Error,
        "key-auth: cannot set x-llm-tenant: refused".into()
    )));
    assert!(!done
        .iter()
        .any(|c| matches!(c, Effect::SetHeader(_, n, _) if n == headers::GROUPS)));
}

#[test]
fn a_ticket_that_cannot_be_published_is_logged_and_the_request_goes_on() {
    let rules = rules("");
    let pairs = [
        (":method", "POST"),
        (":authority", "gw"),
        ("x-api-key", KEY),
    ];
    let (flow, done) = run(rules.global(), &pairs, |c| {
        matches!(c, Effect::SetProperty { .. })
    });
    assert_eq!(flow, Flow::Continue);
    assert_eq!(
        done.last(),
        Some(&Effect::Log(
            Level::Warn,
            "key-auth: cannot publish the re-entry ticket: refused".into()
        ))
    );
    assert_eq!(refusal(&done), None);
}

#[test]
fn a_local_reply_the_host_cannot_send_is_logged() {
    let rules = rules("");
    let (flow, done) = run(rules.global(), &[], |c| matches!(c, Effect::Refuse(_)));
    assert_eq!(flow, Flow::Refused);
    assert_eq!(
        done.last(),
        Some(&Effect::Log(
            Level::Error,
            "key_auth: cannot send the local reply: refused".into()
        ))
    );
}

/// A first pass, then its redirect, as the redirect delivers it; `fails` picks what the
/// host refuses on the second.
fn reentered(fails: impl Fn(&Command) -> bool) -> (Flow, Vec<Command>) {
    let rules = rules("");
    let secret = secret();
    let first = req(&[
        (":method", "POST"),
        (":authority", "gw.example"),
        ("x-api-key", KEY),
        ("x-request-id", "rid"),
    ]);
    let request = Request {
        config: rules.global(),
        headers: &first,
        now: NOW,
        secret: &secret,
    };
    let mut exchange = Exchange::default();
    let flow = exchange.authenticate(&request, &mut NoStore);
    let (_, done) = carry(&mut exchange, flow, never);
    let ticket = done
        .iter()
        .find_map(|c| match c {
            Effect::SetProperty { value, .. } => Some(String::from_utf8(value.clone()).unwrap()),
            _ => None,
        })
        .unwrap();
    let second = req(&[
        (":method", "GET"),
        (":authority", "llm-gateway"),
        ("x-request-id", "rid"),
        (reentry::HEADER, &ticket),
    ]);
    let request = Request {
        headers: &second,
        ..request
    };
    let mut exchange = Exchange::default();
    let flow = exchange.authenticate(&request, &mut NoStore);
    carry(&mut exchange, flow, fails)
}

#[test]
fn a_re_entered_request_gets_its_first_pass_back_or_a_500() {
    let (flow, done) = reentered(never);
    assert_eq!(flow, Flow::Continue);
    for (name, value) in [
        (":method", "POST"),
        (":authority", "gw.example"),
        (headers::REENTRY, "1"),
    ] {
        assert!(
            done.contains(&Effect::SetHeader(Map::Request, name.into(), value.into())),
            "{name}: {done:?}"
        );
    }
    let (flow, done) = reentered(set(":authority"));
    assert_eq!(flow, Flow::Refused);
    assert_eq!(refusal(&done), Some(&Refusal::CannotResume));
    assert!(done.contains(&Effect::Log(
        Level::Error,
        "key-auth: cannot restore :authority of a re-entered request: refused".into()
    )));
    // the ticket header set to "1" is a restore too, not an identity
    let (_, done) = reentered(set(headers::REENTRY));
    assert_eq!(refusal(&done), Some(&Refusal::CannotResume));
}

/// A store whose cache does not know the key.
struct Miss;

impl KeyLookup for Miss {
    fn find(&mut self, _digest: &[u8; 32]) -> Found {
        Found::Fetch
    }
}

#[test]
fn a_key_only_redis_knows_pauses_on_a_lookup_then_resumes_on_the_answer() {
    let cfg = with_store(&rules(""));
    let secret = secret();
    let headers = req(&[("x-api-key", "sk-only-in-redis"), ("x-llm-tier", "spoof")]);
    let digest: [u8; 32] = Sha256::digest(b"sk-only-in-redis").into();
    let request = Request {
        config: Some(&cfg),
        headers: &headers,
        now: NOW,
        secret: &secret,
    };
    let mut exchange = Exchange::default();
    assert_eq!(exchange.authenticate(&request, &mut Miss), Flow::Pause);
    let (flow, done) = carry(&mut exchange, Flow::Pause, never);
    assert_eq!(flow, Flow::Pause);
    // nothing edited nor counted before the answer
    assert_eq!(
        done,
        vec![Effect::Own(Lookup {
            digest,
            headers: headers.clone()
        })]
    );
    // the answer: decided like a config key
    let entry = KeyEntry {
        consumer: "team-r".into(),
        tenant: "acme".into(),
        groups: "fast".into(),
        expires_at: None,
        disabled: false,
        key_id: "team-r-1".into(),
        tier: None,
    };
    let mut resumed = Exchange::default();
    let flow = resumed.resume(&request, digest, Found::Entry(entry));
    let (flow, done) = carry(&mut resumed, flow, never);
    assert_eq!(flow, Flow::Continue);
    assert_eq!(done[0], Effect::Count(Metric::Allowed, 1));
    assert!(done.contains(&Effect::RemoveHeader(Map::Request, "x-llm-tier".into())));
    assert!(done.contains(&Effect::SetHeader(
        Map::Request,
        headers::CONSUMER.into(),
        "team-r".into()
    )));
    // Redis down: 503
    let mut down = Exchange::default();
    let flow = down.resume(&request, digest, Found::Unavailable);
    let (flow, done) = carry(&mut down, flow, never);
    assert_eq!(flow, Flow::Refused);
    assert_eq!(
        done[0],
        Effect::Count(Metric::Denied(DenyReason::StoreUnavailable), 1)
    );
    assert_eq!(refusal(&done).unwrap().reject().status, 503);
    // an answer about another digest: not looked up again, a 500, nothing counted
    let mut other = Exchange::default();
    let flow = other.resume(&request, [0; 32], Found::Unknown);
    let (flow, done) = carry(&mut other, flow, never);
    assert_eq!(flow, Flow::Refused);
    assert_eq!(refusal(&done), Some(&Refusal::NotLookedUp));
    assert!(!done.iter().any(|c| matches!(c, Effect::Count(..))));
    assert!(done.contains(&Effect::RemoveHeader(Map::Request, "x-api-key".into())));
}

#[test]
fn a_lookup_that_cannot_be_sent_refuses_as_the_store_down() {
    let cfg = with_store(&rules(""));
    let secret = secret();
    let headers = req(&[("authorization", "Bearer sk-only-in-redis")]);
    let request = Request {
        config: Some(&cfg),
        headers: &headers,
        now: NOW,
        secret: &secret,
    };
    let mut exchange = Exchange::default();
    let flow = exchange.authenticate(&request, &mut Miss);
    let (flow, done) = carry(&mut exchange, flow, |c| matches!(c, Effect::Own(_)));
    assert_eq!(flow, Flow::Refused);
    assert_eq!(
        done[0],
        Effect::Count(Metric::Denied(DenyReason::StoreUnavailable), 1)
    );
    assert_eq!(
        done[1],
        Effect::RemoveHeader(Map::Request, "authorization".into())
    );
    let reject = refusal(&done).unwrap().reject();
    assert_eq!(reject.status, 503);
    assert!(reject.headers.iter().any(|(n, _)| *n == "retry-after"));
}

#[test]
fn unreadable_or_unconfigured_requests_are_refused() {
    let mut exchange = Exchange::default();
    let flow = exchange.unreadable("BadArgument");
    let (flow, done) = carry(&mut exchange, flow, never);
    assert_eq!(flow, Flow::Refused);
    assert_eq!(
        done,
        vec![
            Effect::Log(
                Level::Error,
                "key-auth: cannot read request headers: BadArgument".into()
            ),
            Effect::Refuse(Refusal::CannotRead)
        ]
    );
    assert_eq!(
        Refusal::CannotRead.reject(),
        Reject::internal("cannot read the request")
    );
    assert_eq!(
        Refusal::NotConfigured.reject(),
        Reject::internal("key-auth is not configured")
    );
}

#[test]
fn header_reads_the_first_exact_utf8_value() {
    let mut headers = req(&[("a", "1"), ("a", "2")]);
    headers.push(("b".into(), vec![0xff]));
    assert_eq!(header(&headers, "a"), "1");
    assert_eq!(header(&headers, "b"), "");
    assert_eq!(header(&headers, "A"), "");
}
