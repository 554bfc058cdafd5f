//! The core driven natively: a fake clock (plain `now` values), a fake shared-data store with
//! CAS (and injected CAS mismatches), a scripted Redis (every command recorded, replies fed
//! back as RESP bytes, send failures and timeouts on demand) and fake properties.

use super::*;
use crate::config::parse_document;
use llm_gateway_shared::route_info::RouteInfo;
use llm_gateway_shared::usage_record::Record;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

const CHAT: &str = "/v1/chat/completions";
const BODY: &[u8] = br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#;
const T0: u64 = 1_800_000_000_000;

// ---------------------------------------------------------------------------------------
// The fake host

#[derive(Debug, Clone)]
struct SentCall {
    token: u32,
    service: String,
    args: Vec<Vec<u8>>,
}

impl SentCall {
    fn verb(&self) -> &str {
        std::str::from_utf8(&self.args[0]).unwrap()
    }

    /// The script's name (EVALSHA: by its SHA1, EVAL: by its source).
    fn script(&self) -> &'static str {
        let all = [
            scripts::lease(),
            scripts::reserve(),
            scripts::reconcile(),
            scripts::charge(),
            scripts::cancel(),
        ];
        let id = &self.args[1];
        all.iter()
            .find(|s| s.sha1.as_bytes() == id.as_slice() || s.source.as_bytes() == id.as_slice())
            .map(|s| s.name)
            .expect("a known script")
    }

    /// KEYS of the call.
    fn keys(&self) -> Vec<String> {
        let n: usize = std::str::from_utf8(&self.args[2]).unwrap().parse().unwrap();
        self.args[3..3 + n]
            .iter()
            .map(|k| String::from_utf8(k.clone()).unwrap())
            .collect()
    }

    /// ARGV of the call.
    fn argv(&self) -> Vec<i64> {
        let n: usize = std::str::from_utf8(&self.args[2]).unwrap().parse().unwrap();
        self.args[3 + n..]
            .iter()
            .map(|a| std::str::from_utf8(a).unwrap().parse().unwrap())
            .collect()
    }
}

#[derive(Default)]
struct Fake {
    data: RefCell<HashMap<String, (Vec<u8>, u32)>>,
    /// The next this many conditional writes lose to "another VM".
    cas_losses: Cell<usize>,
    /// Shared data is unavailable.
    broken: Cell<bool>,
    sent: RefCell<Vec<SentCall>>,
    next_token: Cell<u32>,
    /// The next sends fail with this.
    send_error: RefCell<Option<HostError>>,
    route: RefCell<Option<RouteInfo>>,
    alternative: RefCell<Option<Alternative>>,
    record: RefCell<Option<Record>>,
}

impl Env for Fake {
    fn shared_get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), HostError> {
        if self.broken.get() {
            return Err(HostError::InternalFailure);
        }
        Ok(match self.data.borrow().get(key) {
            Some((v, cas)) => (Some(v.clone()), *cas),
            None => (None, 0),
        })
    }

    fn shared_set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), HostError> {
        if self.broken.get() {
            return Err(HostError::InternalFailure);
        }
        let mut data = self.data.borrow_mut();
        let entry = data.entry(key.to_string()).or_insert((Vec::new(), 0));
        if cas != 0 && self.cas_losses.get() > 0 {
            self.cas_losses.set(self.cas_losses.get() - 1);
            entry.1 += 1; // someone else wrote
            return Err(HostError::CasMismatch);
        }
        if cas != 0 && cas != entry.1 {
            return Err(HostError::CasMismatch);
        }
        *entry = (value.to_vec(), entry.1 + 1);
        Ok(())
    }

    fn send_redis(&self, service: &str, args: &[Cow<'_, [u8]>]) -> Result<u32, HostError> {
        if let Some(err) = *self.send_error.borrow() {
            return Err(err);
        }
        let token = self.next_token.get() + 1;
        self.next_token.set(token);
        self.sent.borrow_mut().push(SentCall {
            token,
            service: service.to_string(),
            args: args.iter().map(|a| a.to_vec()).collect(),
        });
        Ok(token)
    }

    fn route_info(&self, _ctx: u32) -> Option<RoutePrices> {
        self.route.borrow().clone().map(RoutePrices::from)
    }

    fn alternative(&self, _ctx: u32) -> Option<Alternative> {
        self.alternative.borrow().clone()
    }

    fn usage_record(&self, _ctx: u32, _property: &str) -> Option<Charge> {
        self.record.borrow().as_ref().map(Charge::from)
    }
}

impl Fake {
    fn take_sent(&self) -> Vec<SentCall> {
        std::mem::take(&mut *self.sent.borrow_mut())
    }

    fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.data.borrow().get(key).map(|(v, _)| v.clone())
    }

    fn journal(&self) -> Journal {
        self.get(JOURNAL_KEY)
            .map(|v| Journal::decode(&v))
            .unwrap_or_default()
    }

    fn local_spent(&self, level_key: &str) -> u64 {
        self.get(&format!("{LOCAL_BUDGET_PREFIX}{level_key}"))
            .map_or(0, |v| decode_u64(&v))
    }
}

// ---------------------------------------------------------------------------------------
// Driving

fn new_core(config: &str, http: bool) -> Core {
    let rules = parse_document(config.as_bytes()).expect("a valid config");
    Core::new(rules, 7, http)
}

fn head(key: &str) -> Head {
    Head {
        identity: Identity {
            key: Some(key.to_string()),
            tenant: Some("acme".to_string()),
            ..Identity::default()
        },
        logical_id: None,
        stream_id: Some(format!("req-{key}")),
        path: CHAT.to_string(),
        reentry: false,
        framed: true,
    }
}

/// An effect and the request it addresses.
type Out = (u32, Effect);

/// Feeds an input, answers body reads and writes as a host would, returns the rest.
fn drive(core: &mut Core, env: &Fake, now: u64, input: Input) -> Vec<Out> {
    drive_with(core, env, now, input, BODY, Ok(()))
}

fn drive_with(
    core: &mut Core,
    env: &Fake,
    now: u64,
    input: Input,
    body: &[u8],
    replaced: Result<(), HostError>,
) -> Vec<Out> {
    let mut out = Vec::new();
    let mut next = Some(input);
    while let Some(input) = next.take() {
        core.handle(now, input, env);
        while let Some((ctx, effect)) = core.poll() {
            match (effect, replaced) {
                (effect @ Effect::ReplaceRequestBody { .. }, Err(err)) => {
                    core.failed(ctx, effect, err.to_string())
                }
                (Effect::ReplaceRequestBody { .. }, Ok(())) => {}
                (other, _) => out.push((ctx, other)),
            }
        }
        next = match core.take_await() {
            Some(Await::Body { ctx, size }) => {
                assert_eq!(size, body.len());
                let body = Ok(body.to_vec());
                Some(Input::Body { ctx, size, body })
            }
            Some(Await::Written { ctx }) => Some(Input::BodyReplaced {
                ctx,
                result: Ok(()),
            }),
            None => None,
        };
    }
    out
}

/// A request's headers and whole body; the commands.
fn request(core: &mut Core, env: &Fake, now: u64, ctx: u32, head: Head) -> Vec<Out> {
    let mut out = drive(
        core,
        env,
        now,
        Input::RequestHeaders {
            ctx,
            config: Some(0),
            head,
            end_of_stream: false,
        },
    );
    out.extend(drive(
        core,
        env,
        now,
        Input::RequestBody {
            ctx,
            size: BODY.len(),
            end_of_stream: true,
        },
    ));
    out
}

fn reply(core: &mut Core, env: &Fake, now: u64, token: u32, resp: &[u8]) -> Vec<Out> {
    drive(
        core,
        env,
        now,
        Input::Reply {
            token,
            reply: Ok(resp.to_vec()),
        },
    )
}

fn timeout(core: &mut Core, env: &Fake, now: u64, token: u32) -> Vec<Out> {
    drive(
        core,
        env,
        now,
        Input::Reply {
            token,
            reply: Err(Unanswered {
                why: "timeout".into(),
                forbidden: false,
            }),
        },
    )
}

fn ints(values: &[i64]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", values.len()).into_bytes();
    for v in values {
        out.extend_from_slice(format!(":{v}\r\n").as_bytes());
    }
    out
}

fn proceeded(commands: &[Out], ctx: u32) -> bool {
    commands.contains(&(ctx, Effect::Own(Own::Resume)))
}

fn refusal(commands: &[Out]) -> Option<&Reject> {
    commands.iter().find_map(|c| match c {
        (_, Effect::Refuse(reject)) => Some(reject),
        _ => None,
    })
}

fn counted(commands: &[Out], name: &str) -> u64 {
    commands
        .iter()
        .filter_map(|c| match c {
            (_, Effect::Count(n, delta)) if n == name => Some(*delta),
            _ => None,
        })
        .sum()
}

fn record(prompt: u64, completion: u64) -> Record {
    let json = format!(
        r#"{{"request_id":"r","ts_ms":0,"consumer":null,"tenant":"acme","project":null,
        "agent":null,"run_id":null,"model_group":null,"deployment":null,"model":"gpt-4o-mini",
        "api":"chat","stream":false,"status":200,"complete":true,"attempts":[],
        "usage_source":"upstream","usage":{{"prompt_tokens":{prompt},"completion_tokens":{completion},
        "cached_prompt_tokens":0,"cache_write_tokens":0,"reasoning_tokens":0,
        "total_tokens":{}}},"cost_nano":null,"currency":null,"price_version":null,
        "ttft_ms":null,"duration_ms":0}}"#,
        prompt + completion
    );
    Record::from_json(json.as_bytes()).expect("a valid record")
}

const LOCAL_RPM: &str = r#"{"default_max_tokens":100,
    "limits":[{"name":"key-rpm","by":["key"],"requests":2,"per":"minute"}]}"#;

const LOCAL_BUDGET: &str = r#"{"default_max_tokens":100,
    "budgets":[{"name":"tenant-day","by":"tenant","period":"day","tokens":1000}]}"#;

const REDIS_TPM: &str = r#"{"default_max_tokens":100,
    "limits":[{"name":"key-tpm","by":["key"],"tokens":100000,"per":"minute"}],
    "redis":{"transport":"http","cluster":"webdis"}}"#;

const REDIS_BUDGET: &str = r#"{"default_max_tokens":100,
    "budgets":[{"name":"tenant-day","by":"tenant","period":"day","tokens":100000}],
    "redis":{"transport":"http","cluster":"webdis"}}"#;

const REDIS_BUDGET_ALLOW: &str = r#"{"default_max_tokens":100,
    "budgets":[{"name":"tenant-day","by":"tenant","period":"day","tokens":100000,
                "on_redis_failure":"allow"}],
    "redis":{"transport":"http","cluster":"webdis"}}"#;

// ---------------------------------------------------------------------------------------
// Admission: local buckets

#[test]
fn without_reentry_a_pass_is_never_asked_whether_it_was_superseded() {
    let env = Fake::default();
    let without = LOCAL_RPM.replacen('{', r#"{"reentry": false, "#, 1);
    for (config, watches) in [(LOCAL_RPM.to_string(), true), (without, false)] {
        let mut core = new_core(&config, false);
        core.handle(
            T0,
            Input::RequestHeaders {
                ctx: 1,
                config: Some(0),
                head: head("k1"),
                end_of_stream: false,
            },
            &env,
        );
        assert_eq!(core.watches_supersession(1), watches, "{config}");
    }
}

#[test]
fn a_chunked_request_body_is_capped_without_a_length() {
    let env = Fake::default();
    let mut core = new_core(LOCAL_RPM, false);
    let head = Head {
        framed: false,
        ..head("k1")
    };
    core.handle(
        T0,
        Input::RequestHeaders {
            ctx: 1,
            config: Some(0),
            head,
            end_of_stream: false,
        },
        &env,
    );
    for input in [
        Input::RequestBody {
            ctx: 1,
            size: BODY.len(),
            end_of_stream: true,
        },
        Input::Body {
            ctx: 1,
            size: BODY.len(),
            body: Ok(BODY.to_vec()),
        },
    ] {
        core.handle(T0, input, &env);
    }
    let replaced = std::iter::from_fn(|| core.poll()).find_map(|c| match c {
        (_, Effect::ReplaceRequestBody { frame, .. }) => Some(frame),
        _ => None,
    });
    assert_eq!(replaced, Some(false), "chunked: no content-length is added");
}

#[test]
fn a_request_within_its_limit_goes_on_with_the_capped_body_and_rate_headers() {
    let env = Fake::default();
    let mut core = new_core(LOCAL_RPM, false);
    let mut out = Vec::new();
    core.handle(
        T0,
        Input::RequestHeaders {
            ctx: 1,
            config: Some(0),
            head: head("k1"),
            end_of_stream: false,
        },
        &env,
    );
    assert_eq!(core.poll(), None, "headers held until the body");
    core.handle(
        T0,
        Input::RequestBody {
            ctx: 1,
            size: BODY.len(),
            end_of_stream: true,
        },
        &env,
    );
    assert_eq!(core.poll(), None);
    assert_eq!(
        core.take_await(),
        Some(Await::Body {
            ctx: 1,
            size: BODY.len()
        })
    );
    core.handle(
        T0,
        Input::Body {
            ctx: 1,
            size: BODY.len(),
            body: Ok(BODY.to_vec()),
        },
        &env,
    );
    let Some((1, Effect::ReplaceRequestBody { body, frame, .. })) = core.poll() else {
        panic!("the output cap is injected");
    };
    let framed = frame;
    assert!(
        framed,
        "sent with content-length: the new body gets its length"
    );
    let body = String::from_utf8(body).unwrap();
    assert!(body.ends_with(r#","max_completion_tokens":100}"#), "{body}");
    assert_eq!(core.poll(), None, "waits for the body write");
    assert_eq!(core.take_await(), Some(Await::Written { ctx: 1 }));
    core.handle(
        T0,
        Input::BodyReplaced {
            ctx: 1,
            result: Ok(()),
        },
        &env,
    );
    while let Some(c) = core.poll() {
        out.push(c);
    }
    assert!(proceeded(&out, 1));
    assert_eq!(counted(&out, "admitted"), 1);

    let headers = drive(&mut core, &env, T0, Input::ResponseHeaders { ctx: 1 });
    assert!(headers.contains(&(
        1,
        Effect::SetHeader(
            Map::Response,
            "x-ratelimit-remaining-requests".into(),
            "1".into()
        )
    )));
}

#[test]
fn the_third_request_in_a_minute_is_refused_with_429_and_its_state_dropped_at_log() {
    let env = Fake::default();
    let mut core = new_core(LOCAL_RPM, false);
    for ctx in 1..=2 {
        assert!(proceeded(
            &request(&mut core, &env, T0, ctx, head("k1")),
            ctx
        ));
    }
    let out = request(&mut core, &env, T0 + 10, 3, head("k1"));
    assert!(!proceeded(&out, 3));
    assert_eq!(refusal(&out).map(|r| r.status), Some(429));
    assert_eq!(counted(&out, "rate_limited.key-rpm"), 1);
    // another key has its own bucket
    assert!(proceeded(
        &request(&mut core, &env, T0 + 10, 4, head("k2")),
        4
    ));
    for ctx in 1..=4 {
        drive(
            &mut core,
            &env,
            T0 + 20,
            Input::Log {
                ctx,
                superseded: false,
            },
        );
    }
    assert_eq!(core.requests(), 0, "every request settled and forgotten");
}

#[test]
fn a_request_refused_by_a_later_limit_gives_back_what_earlier_limits_took() {
    let env = Fake::default();
    let mut core = new_core(
        r#"{"default_max_tokens":100,"limits":[
            {"name":"key-rpm","by":["key"],"requests":2,"per":"minute"},
            {"name":"key-tpm","by":["key"],"tokens":150,"per":"minute"}]}"#,
        false,
    );
    assert!(proceeded(&request(&mut core, &env, T0, 1, head("k")), 1));
    // the request limit admits the second, the token limit refuses it
    let out = request(&mut core, &env, T0, 2, head("k"));
    assert_eq!(counted(&out, "rate_limited.key-tpm"), 1);
    // its request unit went back: a request that costs no tokens still gets in, once
    let mut models = head("k");
    models.path = "/v1/models".into();
    assert!(proceeded(
        &request(&mut core, &env, T0, 3, models.clone()),
        3
    ));
    let out = request(&mut core, &env, T0, 4, models);
    assert_eq!(counted(&out, "rate_limited.key-rpm"), 1);
}

#[test]
fn a_body_that_is_not_json_is_refused_before_any_bucket_is_touched() {
    let env = Fake::default();
    let mut core = new_core(LOCAL_RPM, false);
    let out = drive(
        &mut core,
        &env,
        T0,
        Input::RequestHeaders {
            ctx: 1,
            config: Some(0),
            head: head("k1"),
            end_of_stream: false,
        },
    );
    assert!(out.is_empty());
    let out = drive_with(
        &mut core,
        &env,
        T0,
        Input::RequestBody {
            ctx: 1,
            size: 5,
            end_of_stream: true,
        },
        b"{bad ",
        Ok(()),
    );
    assert_eq!(refusal(&out).map(|r| r.status), Some(400));
    drive(
        &mut core,
        &env,
        T0,
        Input::Log {
            ctx: 1,
            superseded: false,
        },
    );
    assert!(env.data.borrow().is_empty(), "no bucket created");
    // both units still there
    for ctx in 2..=3 {
        assert!(proceeded(
            &request(&mut core, &env, T0, ctx, head("k1")),
            ctx
        ));
    }
}

#[test]
fn a_body_over_the_limit_is_refused_with_413_before_it_is_read() {
    let env = Fake::default();
    let mut core = new_core(
        r#"{"max_body_bytes":10,"limits":[{"name":"r","by":["key"],"requests":2,"per":"minute"}]}"#,
        false,
    );
    drive(
        &mut core,
        &env,
        T0,
        Input::RequestHeaders {
            ctx: 1,
            config: Some(0),
            head: head("k"),
            end_of_stream: false,
        },
    );
    core.handle(
        T0,
        Input::RequestBody {
            ctx: 1,
            size: 11,
            end_of_stream: false,
        },
        &env,
    );
    let Some((1, Effect::Refuse(reject))) = core.poll() else {
        panic!("refused");
    };
    assert_eq!(reject.status, 413);
    assert_eq!(core.poll(), None, "the body is never read");
}

#[test]
fn a_body_that_cannot_be_read_or_written_refuses_the_request() {
    let env = Fake::default();
    let mut core = new_core(LOCAL_RPM, false);
    drive(
        &mut core,
        &env,
        T0,
        Input::RequestHeaders {
            ctx: 1,
            config: Some(0),
            head: head("k"),
            end_of_stream: false,
        },
    );
    core.handle(
        T0,
        Input::Body {
            ctx: 1,
            size: 3,
            body: Err(HostError::NotFound),
        },
        &env,
    );
    let Some((1, Effect::Refuse(reject))) = core.poll() else {
        panic!("refused");
    };
    assert_eq!(reject.status, 500);

    drive(
        &mut core,
        &env,
        T0,
        Input::RequestHeaders {
            ctx: 2,
            config: Some(0),
            head: head("k"),
            end_of_stream: false,
        },
    );
    let out = drive_with(
        &mut core,
        &env,
        T0,
        Input::RequestBody {
            ctx: 2,
            size: BODY.len(),
            end_of_stream: true,
        },
        BODY,
        Err(HostError::BadArgument),
    );
    assert_eq!(refusal(&out).map(|r| r.status), Some(500));
    assert!(
        !proceeded(&out, 2),
        "never admitted with the cap not written"
    );
}

/// Any other effect the host refuses is logged, in the words and at the level the shell used,
/// and changes nothing for the request.
#[test]
fn a_failed_effect_other_than_the_body_write_is_logged_and_changes_nothing() {
    let mut core = new_core(LOCAL_RPM, false);
    let failures = [
        (Effect::Own(Own::Resume), LogLevel::Warn, "resume a request"),
        (
            Effect::Own(Own::RewriteModel("m".into())),
            LogLevel::Warn,
            "rewrite the model (budget fallback)",
        ),
        (
            Effect::Refuse(Reject::internal("x")),
            LogLevel::Error,
            "send the local reply",
        ),
        (
            Effect::SetHeader(Map::Request, "x-llm-model-group".into(), "g".into()),
            LogLevel::Debug,
            "x-llm-model-group",
        ),
        (
            Effect::ClearRouteCache,
            LogLevel::Debug,
            "clear the route cache",
        ),
    ];
    for (effect, level, what) in failures {
        core.failed(7, effect, "not found".into());
        let line = format!("token-ratelimit: cannot {what}: not found");
        assert_eq!(core.poll(), Some((NO_REQUEST, Effect::Log(level, line))));
        assert_eq!(core.poll(), None);
        assert_eq!(core.take_await(), None);
    }
}

#[test]
fn no_config_or_an_empty_one_lets_the_request_go_on_untouched() {
    let env = Fake::default();
    let mut core = new_core(r#"{}"#, false);
    let out = drive(
        &mut core,
        &env,
        T0,
        Input::RequestHeaders {
            ctx: 1,
            config: Some(0),
            head: head("k"),
            end_of_stream: false,
        },
    );
    assert_eq!(out, vec![(1, Effect::Own(Own::Resume))]);
    let out = drive(
        &mut core,
        &env,
        T0,
        Input::RequestHeaders {
            ctx: 2,
            config: None,
            head: head("k"),
            end_of_stream: false,
        },
    );
    assert_eq!(out, vec![(2, Effect::Own(Own::Resume))]);
    assert_eq!(core.requests(), 0);
}

#[test]
fn buckets_take_under_cas_when_other_vms_write_first() {
    let env = Fake::default();
    let mut core = new_core(LOCAL_RPM, false);
    env.cas_losses.set(5);
    assert!(proceeded(&request(&mut core, &env, T0, 1, head("k")), 1));
    env.cas_losses.set(5);
    assert!(proceeded(&request(&mut core, &env, T0, 2, head("k")), 2));
    // both takes landed despite the lost rounds: the third is refused
    let out = request(&mut core, &env, T0, 3, head("k"));
    assert_eq!(refusal(&out).map(|r| r.status), Some(429));
}

#[test]
fn a_bucket_that_stays_contended_or_no_shared_data_fails_open_and_says_so() {
    let env = Fake::default();
    let mut core = new_core(LOCAL_RPM, false);
    env.broken.set(true);
    let out = request(&mut core, &env, T0, 1, head("k"));
    assert!(proceeded(&out, 1));
    assert!(out
        .iter()
        .any(|c| matches!(c, (_, Effect::Log(LogLevel::Warn, message))
        if message.starts_with("token-ratelimit: bucket key-rpm unavailable"))));
    env.broken.set(false);
    // seed the bucket, then lose every CAS round
    assert!(proceeded(&request(&mut core, &env, T0, 2, head("k")), 2));
    env.cas_losses.set(CAS_ROUNDS);
    let out = request(&mut core, &env, T0, 3, head("k"));
    assert!(proceeded(&out, 3), "fails open");
}

// ---------------------------------------------------------------------------------------
// Budgets without Redis (per instance, plain Envoy)

#[test]
fn a_local_budget_reserves_the_worst_case_and_settles_to_the_usage_record() {
    let env = Fake::default();
    let mut core = new_core(LOCAL_BUDGET, false);
    let out = request(&mut core, &env, T0, 1, head("k"));
    assert!(proceeded(&out, 1));
    let level = budget::levels(
        &core.rules().global().unwrap().budgets,
        &head("k").identity,
        T0,
    );
    let key = &level[0].key;
    let reserved = env.local_spent(key);
    assert!(reserved > 100, "prompt plus the cap of 100: {reserved}");
    *env.record.borrow_mut() = Some(record(12, 30));
    drive(
        &mut core,
        &env,
        T0,
        Input::Log {
            ctx: 1,
            superseded: false,
        },
    );
    assert_eq!(env.local_spent(key), 42, "settled to what was used");
    assert_eq!(core.requests(), 0);
}

#[test]
fn settlements_that_shared_data_refuses_are_counted_not_dropped() {
    let env = Fake::default();
    let mut core = new_core(
        r#"{"default_max_tokens":100,
        "limits":[{"name":"key-tpm","by":["key"],"tokens":100000,"per":"minute"}],
        "budgets":[{"name":"tenant-day","by":"tenant","period":"day","tokens":1000}]}"#,
        false,
    );
    assert!(proceeded(&request(&mut core, &env, T0, 1, head("k")), 1));
    *env.record.borrow_mut() = Some(record(1, 1));
    env.broken.set(true);
    let out = drive(
        &mut core,
        &env,
        T0,
        Input::Log {
            ctx: 1,
            superseded: false,
        },
    );
    assert_eq!(counted(&out, "bucket_refund_lost"), 1);
    assert_eq!(counted(&out, "local_budget_lost"), 1);
    assert_eq!(core.requests(), 0);
}

#[test]
fn a_local_budget_that_cannot_cover_the_request_refuses_with_402() {
    let env = Fake::default();
    let mut core = new_core(
        r#"{"default_max_tokens":600,
        "budgets":[{"name":"tenant-day","by":"tenant","period":"day","tokens":1000}]}"#,
        false,
    );
    assert!(proceeded(&request(&mut core, &env, T0, 1, head("k")), 1));
    let out = request(&mut core, &env, T0, 2, head("k"));
    assert_eq!(refusal(&out).map(|r| r.status), Some(402));
    assert_eq!(counted(&out, "budget_exceeded.tenant-day"), 1);
}

fn alternative(group: &str, price_input: u64) -> Alternative {
    let json = format!(
        r#"{{"route":{{"request_id":"r","model_group":"{group}","deployment":"d-cheap",
        "model":"cheap-model","provider":"openai","route_version":"v1","attempts":1,
        "price_ceiling":{{"currency":"USD","input":{price_input},"output":{price_input}}}}},
        "deployments":["d-cheap"],"clusters":["c-cheap"]}}"#
    );
    serde_json::from_str(&json).expect("an alternative")
}

fn route(group: &str, price_input: u64) -> RouteInfo {
    let json = format!(
        r#"{{"request_id":"r","model_group":"{group}","deployment":"d","model":"m",
        "provider":"openai","route_version":"v1","attempts":1,"price":{{"currency":"USD","input":{price_input},"output":{price_input}}}}}"#
    );
    serde_json::from_str(&json).expect("a route")
}

#[test]
fn a_refused_money_budget_switches_to_the_cheaper_alternative_once() {
    let env = Fake::default();
    let mut core = new_core(
        r#"{"default_max_tokens":1000,
        "budgets":[{"name":"tenant-day","by":"tenant","period":"day","money":"0.01",
                    "currency":"USD"}]}"#,
        false,
    );
    *env.route.borrow_mut() = Some(route("smart", 100_000_000)); // $100 per 1M tokens
    *env.alternative.borrow_mut() = Some(alternative("fast", 1_000_000)); // $1 per 1M
    let out = request(&mut core, &env, T0, 1, head("k"));
    assert!(proceeded(&out, 1), "{out:?}");
    assert_eq!(counted(&out, "budget_fallback"), 1);
    assert!(out.contains(&(1, Effect::Own(Own::RewriteModel("cheap-model".into())))));
    assert!(out.contains(&(1, Effect::ClearRouteCache)));
    assert!(out.iter().any(
        |c| matches!(c, (1, Effect::SetHeader(Map::Request, name, value))
            if name == "x-llm-model-group" && value == "fast")
    ));
}

#[test]
fn without_an_alternative_a_refused_money_budget_is_402() {
    let env = Fake::default();
    let mut core = new_core(
        r#"{"default_max_tokens":1000,
        "budgets":[{"name":"tenant-day","by":"tenant","period":"day","money":"0.01",
                    "currency":"USD"}]}"#,
        false,
    );
    *env.route.borrow_mut() = Some(route("smart", 100_000_000));
    let out = request(&mut core, &env, T0, 1, head("k"));
    assert_eq!(refusal(&out).map(|r| r.status), Some(402));
}

#[test]
fn an_unpriced_model_is_refused_by_a_money_budget() {
    let env = Fake::default();
    let mut core = new_core(
        r#"{"budgets":[{"name":"tenant-day","by":"tenant","period":"day","money":"1",
                    "currency":"USD"}]}"#,
        false,
    );
    let out = request(&mut core, &env, T0, 1, head("k"));
    assert!(!proceeded(&out, 1));
    assert!(refusal(&out).is_some());
}

#[test]
fn a_request_that_is_no_model_call_reserves_no_budget() {
    let env = Fake::default();
    let mut core = new_core(LOCAL_BUDGET, false);
    let mut h = head("k");
    h.path = "/v1/models".into();
    let out = request(&mut core, &env, T0, 1, h);
    assert!(proceeded(&out, 1));
    assert!(env
        .data
        .borrow()
        .keys()
        .all(|k| !k.starts_with(LOCAL_BUDGET_PREFIX)));
}

// ---------------------------------------------------------------------------------------
// Leases (Redis)

#[test]
fn a_leased_bucket_without_tokens_waits_for_its_lease_then_goes_on() {
    let env = Fake::default();
    let mut core = new_core(REDIS_TPM, false);
    let out = request(&mut core, &env, T0, 1, head("k"));
    assert!(!proceeded(&out, 1), "waits");
    let sent = env.take_sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].script(), "LEASE");
    assert_eq!(sent[0].verb(), "EVAL", "first call carries the source");
    assert_eq!(sent[0].service, "webdis");
    assert_eq!(core.calls_in_flight(), 1);
    let out = reply(
        &mut core,
        &env,
        T0 + 5,
        sent[0].token,
        &ints(&[5000, 95000, 0]),
    );
    assert!(proceeded(&out, 1));
    assert_eq!(counted(&out, "leased_tokens"), 5000);
    // the next request takes from what was leased: no call, and EVALSHA next time
    let out = request(&mut core, &env, T0 + 6, 2, head("k"));
    assert!(proceeded(&out, 2));
    assert!(env.take_sent().is_empty());
}

#[test]
fn a_lease_that_cannot_be_sent_marks_redis_down_and_admits_in_emergency_mode() {
    let env = Fake::default();
    let mut core = new_core(REDIS_TPM, false);
    *env.send_error.borrow_mut() = Some(HostError::InternalFailure);
    let out = request(&mut core, &env, T0, 1, head("k"));
    assert!(proceeded(&out, 1), "{out:?}");
    assert_eq!(counted(&out, "redis_down"), 1);
    assert_eq!(counted(&out, "emergency_admits.key-tpm"), 1);
    let until = decode_u64(&env.get(REDIS_KEY).unwrap());
    assert!(until > T0);
}

#[test]
fn a_lease_error_reply_resumes_the_request_in_emergency_mode_without_a_second_lease() {
    let env = Fake::default();
    let mut core = new_core(REDIS_TPM, false);
    request(&mut core, &env, T0, 1, head("k"));
    let sent = env.take_sent();
    let out = reply(&mut core, &env, T0, sent[0].token, b"-ERR boom\r\n");
    assert!(proceeded(&out, 1));
    assert_eq!(counted(&out, "redis_errors"), 1);
    assert!(env.take_sent().is_empty(), "no second lease");
}

#[test]
fn leased_tokens_that_cannot_be_stored_are_counted_and_the_request_leases_again() {
    let env = Fake::default();
    let mut core = new_core(REDIS_TPM, false);
    request(&mut core, &env, T0, 1, head("k"));
    let lease = env.take_sent();
    env.cas_losses.set(CAS_ROUNDS);
    let out = reply(&mut core, &env, T0, lease[0].token, &ints(&[5000, 0, 0]));
    assert_eq!(counted(&out, "lease_lost"), 1);
    assert!(
        !proceeded(&out, 1),
        "nothing to take: waits for another lease"
    );
    let again = env.take_sent();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].script(), "LEASE");
    let out = reply(&mut core, &env, T0, again[0].token, &ints(&[5000, 0, 0]));
    assert!(proceeded(&out, 1));
}

#[test]
fn the_clock_is_not_needed_for_a_body_chunk_nor_for_response_headers() {
    assert!(!Input::ResponseHeaders { ctx: 1 }.uses_clock());
    assert!(!Input::RequestBody {
        ctx: 1,
        size: 1,
        end_of_stream: true
    }
    .uses_clock());
    // a body chunk fed with the clock at 0 asks for the body all the same
    let env = Fake::default();
    let mut core = new_core(LOCAL_RPM, false);
    drive(
        &mut core,
        &env,
        T0,
        Input::RequestHeaders {
            ctx: 1,
            config: Some(0),
            head: head("k"),
            end_of_stream: false,
        },
    );
    core.handle(
        0,
        Input::RequestBody {
            ctx: 1,
            size: 3,
            end_of_stream: true,
        },
        &env,
    );
    assert_eq!(core.poll(), None);
    assert_eq!(core.take_await(), Some(Await::Body { ctx: 1, size: 3 }));
    assert!(Input::Tick.uses_clock());
}

#[test]
fn held_headers_need_the_clock_only_to_expire_or_adopt_a_stashed_admission() {
    let env = Fake::default();
    let mut core = new_core(LOCAL_RPM, false);
    let headers = |head: Head, end_of_stream: bool| Input::RequestHeaders {
        ctx: 9,
        config: Some(0),
        head,
        end_of_stream,
    };
    // nothing stashed: headers held for the body do not use the time ...
    assert!(!core.uses_clock(&headers(head("k"), false)));
    // ... headers that admit at once, or a pass that re-enters, do
    assert!(core.uses_clock(&headers(head("k"), true)));
    let mut again = head("k");
    again.reentry = true;
    assert!(core.uses_clock(&headers(again, false)));
    // the rest as `Input::uses_clock`
    assert!(core.uses_clock(&Input::Tick));
    assert!(!core.uses_clock(&Input::ResponseHeaders { ctx: 9 }));

    // a superseded pass stashes its admission: now held headers expire the stash by the clock
    let mut first = head("k");
    first.logical_id = Some("logical-1".into());
    assert!(proceeded(&request(&mut core, &env, T0, 1, first), 1));
    drive(
        &mut core,
        &env,
        T0 + 1,
        Input::Log {
            ctx: 1,
            superseded: true,
        },
    );
    assert_eq!(core.stash.len(), 1);
    assert!(core.uses_clock(&headers(head("other"), false)));
}

#[test]
fn noscript_resends_the_call_with_its_source() {
    let env = Fake::default();
    let mut core = new_core(REDIS_TPM, false);
    request(&mut core, &env, T0, 1, head("k"));
    let first = env.take_sent();
    // the script got cached by the answer to another call...
    reply(&mut core, &env, T0, first[0].token, &ints(&[0, 0, 10]));
    request(&mut core, &env, T0 + 1, 2, head("k2"));
    let second = env.take_sent();
    assert_eq!(second[0].verb(), "EVALSHA");
    // ...and flushed since
    let out = reply(
        &mut core,
        &env,
        T0 + 2,
        second[0].token,
        b"-NOSCRIPT No matching script\r\n",
    );
    assert!(!proceeded(&out, 2), "still waiting for the resent call");
    let resent = env.take_sent();
    assert_eq!(resent.len(), 1);
    assert_eq!(resent[0].verb(), "EVAL");
    assert_eq!(resent[0].keys(), second[0].keys());
    let out = reply(
        &mut core,
        &env,
        T0 + 3,
        resent[0].token,
        b"-NOSCRIPT again\r\n",
    );
    assert!(
        proceeded(&out, 2),
        "a second NOSCRIPT fails the call: emergency mode"
    );
}

#[test]
fn a_reply_with_an_unknown_token_is_ignored() {
    let env = Fake::default();
    let mut core = new_core(REDIS_TPM, false);
    let out = reply(&mut core, &env, T0, 99, &ints(&[1, 1, 0]));
    assert!(out.is_empty());
}

#[test]
fn the_sync_worker_tops_up_wanted_buckets_and_only_one_vm_is_elected() {
    let env = Fake::default();
    let config = r#"{"default_max_tokens":100,"lease":{"low_percent":100},
        "limits":[{"name":"key-tpm","by":["key"],"tokens":100000,"per":"minute"}],
        "redis":{"transport":"http","cluster":"webdis"}}"#;
    let mut a = new_core(config, false);
    let mut b = Core::new(parse_document(config.as_bytes()).unwrap(), 8, false);
    request(&mut a, &env, T0, 1, head("k"));
    let lease = env.take_sent();
    // a batch, then the take leaves the bucket below its low mark: it asks for a top-up
    let out = reply(&mut a, &env, T0, lease[0].token, &ints(&[5000, 0, 0]));
    assert!(proceeded(&out, 1));
    assert!(env.take_sent().is_empty(), "a top-up is the sync worker's");
    let wanted = env.get(WANT_KEY).unwrap_or_default();
    assert!(!wanted.is_empty(), "a top-up was asked for");
    drive(&mut a, &env, T0 + 2, Input::Tick);
    let topups = env.take_sent();
    assert_eq!(topups.len(), 1);
    assert_eq!(topups[0].script(), "LEASE");
    assert_eq!(env.get(WANT_KEY).unwrap(), Vec::<u8>::new(), "taken");
    // b is not elected while a's lease runs
    env.data.borrow_mut().insert(
        WANT_KEY.into(),
        (String::from_utf8(wanted).unwrap().into_bytes(), 1),
    );
    drive(&mut b, &env, T0 + 3, Input::Tick);
    assert!(env.take_sent().is_empty(), "not elected");
    // after three periods without a's tick, b takes over
    drive(&mut b, &env, T0 + 2 + 301, Input::Tick);
    assert_eq!(env.take_sent().len(), 1);
    // a top-up's reply resumes no one
    let out = reply(&mut a, &env, T0 + 10, topups[0].token, &ints(&[5000, 0, 0]));
    assert!(!out
        .iter()
        .any(|c| matches!(c, (_, Effect::Own(Own::Resume)))));
}

// ---------------------------------------------------------------------------------------
// Budgets in Redis

#[test]
fn a_reservation_in_redis_is_reconciled_once_at_log_with_the_usage() {
    let env = Fake::default();
    let mut core = new_core(REDIS_BUDGET, false);
    let out = request(&mut core, &env, T0, 1, head("k"));
    assert!(!proceeded(&out, 1));
    let sent = env.take_sent();
    assert_eq!(sent[0].script(), "RESERVE");
    let reserved = sent[0].argv()[2];
    assert!(reserved > 100);
    let out = reply(&mut core, &env, T0, sent[0].token, &ints(&[1, 99_000]));
    assert!(proceeded(&out, 1));
    *env.record.borrow_mut() = Some(record(10, 20));
    drive(
        &mut core,
        &env,
        T0 + 1,
        Input::Log {
            ctx: 1,
            superseded: false,
        },
    );
    let settle = env.take_sent();
    assert_eq!(settle.len(), 1);
    assert_eq!(settle[0].script(), "RECONCILE");
    assert_eq!(
        settle[0].keys()[0],
        sent[0].keys()[0],
        "the same reservation"
    );
    assert_eq!(settle[0].argv()[..2], [1, 30], "one level, 30 used");
    let out = reply(
        &mut core,
        &env,
        T0 + 2,
        settle[0].token,
        &ints(&[1, reserved - 30]),
    );
    assert_eq!(counted(&out, "reconciled"), 1);
    assert_eq!(core.requests(), 0);
    assert_eq!(core.calls_in_flight(), 0);
}

#[test]
fn a_refused_reservation_in_redis_is_402() {
    let env = Fake::default();
    let mut core = new_core(REDIS_BUDGET, false);
    request(&mut core, &env, T0, 1, head("k"));
    let sent = env.take_sent();
    let out = reply(&mut core, &env, T0, sent[0].token, &ints(&[0, 1, 12]));
    assert_eq!(refusal(&out).map(|r| r.status), Some(402));
}

#[test]
fn an_unanswered_reservation_is_cancelled_and_the_request_follows_on_redis_failure() {
    // reject: 503
    let env = Fake::default();
    let mut core = new_core(REDIS_BUDGET, false);
    request(&mut core, &env, T0, 1, head("k"));
    let sent = env.take_sent();
    let out = timeout(&mut core, &env, T0 + 50, sent[0].token);
    assert_eq!(refusal(&out).map(|r| r.status), Some(503));
    assert_eq!(counted(&out, "reserve_unanswered"), 1);
    // Redis is now marked down: the CANCEL is journaled, not sent
    assert!(env.take_sent().is_empty());
    let journal = env.journal();
    assert_eq!(journal.entries.len(), 1);
    assert!(matches!(journal.entries[0].1, JournalEntry::Cancel { .. }));

    // allow: goes on, journaled charge at log
    let env = Fake::default();
    let mut core = new_core(REDIS_BUDGET_ALLOW, false);
    request(&mut core, &env, T0, 1, head("k"));
    let sent = env.take_sent();
    let out = timeout(&mut core, &env, T0 + 50, sent[0].token);
    assert!(proceeded(&out, 1));
    assert_eq!(counted(&out, "budget_fail_open"), 1);
    *env.record.borrow_mut() = Some(record(1, 2));
    drive(
        &mut core,
        &env,
        T0 + 60,
        Input::Log {
            ctx: 1,
            superseded: false,
        },
    );
    let journal = env.journal();
    assert_eq!(journal.entries.len(), 2, "the cancel and the charge");
    assert!(
        matches!(&journal.entries[1].1, JournalEntry::Charge { amounts, .. } if amounts == &vec![3])
    );
}

#[test]
fn a_full_journal_refuses_a_request_it_could_not_charge_later() {
    let env = Fake::default();
    let mut core = new_core(
        r#"{"default_max_tokens":100,"journal_capacity":1,
        "budgets":[{"name":"tenant-day","by":"tenant","period":"day","tokens":100000,
                    "on_redis_failure":"allow"}],
        "redis":{"transport":"http","cluster":"webdis"}}"#,
        false,
    );
    let mut journal = Journal::default();
    journal.push(
        JournalEntry::Cancel {
            reservation: "x".into(),
            keys: vec![],
            ttl_ms: 1,
        },
        10,
    );
    env.data
        .borrow_mut()
        .insert(JOURNAL_KEY.into(), (journal.encode(), 1));
    env.data
        .borrow_mut()
        .insert(REDIS_KEY.into(), ((T0 + 10_000).to_le_bytes().to_vec(), 1));
    let out = request(&mut core, &env, T0, 1, head("k"));
    assert_eq!(counted(&out, "journal_overflow"), 1);
    assert!(refusal(&out).is_some());
    assert!(env.take_sent().is_empty());
}

#[test]
fn a_settlement_that_cannot_be_sent_is_journaled_and_replayed_by_the_sync_worker() {
    let env = Fake::default();
    let mut core = new_core(REDIS_BUDGET, false);
    request(&mut core, &env, T0, 1, head("k"));
    let sent = env.take_sent();
    reply(&mut core, &env, T0, sent[0].token, &ints(&[1, 99_000]));
    *env.send_error.borrow_mut() = Some(HostError::InternalFailure);
    *env.record.borrow_mut() = Some(record(1, 1));
    let out = drive(
        &mut core,
        &env,
        T0 + 1,
        Input::Log {
            ctx: 1,
            superseded: false,
        },
    );
    assert_eq!(counted(&out, "journal_appended"), 1);
    assert_eq!(env.journal().entries.len(), 1);
    // Redis back after the retry period: the tick replays it
    *env.send_error.borrow_mut() = None;
    let out = drive(&mut core, &env, T0 + 5_000, Input::Tick);
    assert!(out.iter().any(|c| matches!(
        c,
        (_, Effect::Gauge(name, 1)) if name == "journal_depth"
    )));
    let replay = env.take_sent();
    assert_eq!(replay.len(), 1);
    assert_eq!(replay[0].script(), "RECONCILE");
    // a second tick while it is in flight does not send it again
    drive(&mut core, &env, T0 + 5_100, Input::Tick);
    assert!(env.take_sent().is_empty());
    // an error reply keeps it journaled for the next tick
    reply(&mut core, &env, T0 + 5_150, replay[0].token, b"-BUSY\r\n");
    assert_eq!(env.journal().entries.len(), 1);
    drive(&mut core, &env, T0 + 5_200, Input::Tick);
    let again = env.take_sent();
    assert_eq!(again.len(), 1);
    let out = reply(&mut core, &env, T0 + 5_250, again[0].token, &ints(&[0]));
    assert_eq!(counted(&out, "journal_replayed"), 1);
    assert!(env.journal().entries.is_empty());
}

#[test]
fn redis_comes_back_on_the_first_answer_after_it_was_marked_down() {
    let env = Fake::default();
    let mut core = new_core(REDIS_TPM, false);
    request(&mut core, &env, T0, 1, head("k"));
    let lease = env.take_sent();
    env.data
        .borrow_mut()
        .insert(REDIS_KEY.into(), ((T0 + 500).to_le_bytes().to_vec(), 1));
    let out = reply(
        &mut core,
        &env,
        T0 + 1,
        lease[0].token,
        &ints(&[1000, 0, 0]),
    );
    assert_eq!(counted(&out, "redis_recovered"), 1);
    assert_eq!(decode_u64(&env.get(REDIS_KEY).unwrap()), 0);
}

// ---------------------------------------------------------------------------------------
// The webdis transport

#[test]
fn over_webdis_settlements_wait_in_the_outbox_for_the_tick() {
    let env = Fake::default();
    let mut core = new_core(REDIS_BUDGET, true);
    request(&mut core, &env, T0, 1, head("k"));
    let sent = env.take_sent();
    reply(&mut core, &env, T0, sent[0].token, &ints(&[1, 99_000]));
    drive(
        &mut core,
        &env,
        T0 + 1,
        Input::Log {
            ctx: 1,
            superseded: false,
        },
    );
    assert!(env.take_sent().is_empty(), "not from the request's context");
    assert_eq!(core.outbox_len(), 1);
    drive(&mut core, &env, T0 + 2, Input::Tick);
    let settle = env.take_sent();
    assert_eq!(settle.len(), 1);
    assert_eq!(settle[0].script(), "RECONCILE");
    assert_eq!(core.outbox_len(), 0);
}

#[test]
fn over_webdis_a_request_gone_while_it_reserves_cancels_its_reservation() {
    let env = Fake::default();
    let mut core = new_core(REDIS_BUDGET, true);
    request(&mut core, &env, T0, 1, head("k"));
    let reserve = env.take_sent();
    let out = drive(
        &mut core,
        &env,
        T0 + 1,
        Input::Log {
            ctx: 1,
            superseded: false,
        },
    );
    assert_eq!(counted(&out, "calls_abandoned"), 1);
    assert_eq!(core.calls_in_flight(), 0);
    assert_eq!(core.requests(), 0);
    drive(&mut core, &env, T0 + 2, Input::Tick);
    let cancel = env.take_sent();
    assert_eq!(cancel.len(), 1);
    assert_eq!(cancel[0].script(), "CANCEL");
    assert_eq!(cancel[0].keys()[0], reserve[0].keys()[0]);
    // the late answer finds no one
    let out = reply(&mut core, &env, T0 + 3, reserve[0].token, &ints(&[1, 5]));
    assert!(out.is_empty());
}

#[test]
fn over_webdis_a_forbidden_or_too_long_command_is_not_an_outage() {
    let env = Fake::default();
    let mut core = new_core(REDIS_TPM, true);
    *env.send_error.borrow_mut() = Some(HostError::BadArgument);
    let out = request(&mut core, &env, T0, 1, head("k"));
    assert_eq!(counted(&out, "webdis_too_large"), 1);
    assert_eq!(counted(&out, "redis_failures"), 0);
    assert!(proceeded(&out, 1));
    *env.send_error.borrow_mut() = None;

    request(&mut core, &env, T0, 2, head("k2"));
    let sent = env.take_sent();
    let out = drive(
        &mut core,
        &env,
        T0,
        Input::Reply {
            token: sent[0].token,
            reply: Err(Unanswered {
                why: "forbidden".into(),
                forbidden: true,
            }),
        },
    );
    assert_eq!(counted(&out, "webdis_forbidden"), 1);
    assert!(proceeded(&out, 2));
}

// ---------------------------------------------------------------------------------------
// Abandoned requests, re-entry, on_done

#[test]
fn a_request_gone_while_its_lease_is_in_flight_is_forgotten_when_the_answer_comes() {
    let env = Fake::default();
    let mut core = new_core(REDIS_TPM, false);
    request(&mut core, &env, T0, 1, head("k"));
    let lease = env.take_sent();
    drive(
        &mut core,
        &env,
        T0 + 1,
        Input::Log {
            ctx: 1,
            superseded: false,
        },
    );
    assert_eq!(core.requests(), 1, "kept for the answer");
    let out = reply(&mut core, &env, T0 + 2, lease[0].token, &ints(&[100, 0, 0]));
    assert!(!proceeded(&out, 1));
    assert_eq!(core.requests(), 0);
}

#[test]
fn a_request_gone_while_it_reserves_gives_the_reservation_back_when_it_lands() {
    let env = Fake::default();
    let mut core = new_core(REDIS_BUDGET, false);
    request(&mut core, &env, T0, 1, head("k"));
    let reserve = env.take_sent();
    drive(
        &mut core,
        &env,
        T0 + 1,
        Input::Log {
            ctx: 1,
            superseded: false,
        },
    );
    let out = reply(
        &mut core,
        &env,
        T0 + 2,
        reserve[0].token,
        &ints(&[1, 90_000]),
    );
    assert!(!proceeded(&out, 1));
    let reconcile = env.take_sent();
    assert_eq!(reconcile[0].script(), "RECONCILE");
    assert_eq!(reconcile[0].argv()[..2], [1, 0], "nothing used");
    assert_eq!(core.requests(), 0);
}

#[test]
fn a_superseded_pass_carries_its_admission_to_the_pass_that_re_enters() {
    let env = Fake::default();
    let mut core = new_core(LOCAL_RPM, false);
    let mut first = head("k");
    first.logical_id = Some("logical-1".into());
    assert!(proceeded(
        &request(&mut core, &env, T0, 1, first.clone()),
        1
    ));
    let out = drive(
        &mut core,
        &env,
        T0 + 1,
        Input::Log {
            ctx: 1,
            superseded: true,
        },
    );
    assert_eq!(counted(&out, "reentry_carried"), 1);
    let mut again = first;
    again.reentry = true;
    let out = request(&mut core, &env, T0 + 2, 2, again);
    assert_eq!(counted(&out, "reentry_adopted"), 1);
    assert!(proceeded(&out, 2));
    assert_eq!(
        counted(&out, "admitted"),
        0,
        "admitted once, in the first pass"
    );
    // the bucket holds one request only: the second unit is still there
    assert!(proceeded(
        &request(&mut core, &env, T0 + 3, 3, head("k")),
        3
    ));
    let out = request(&mut core, &env, T0 + 3, 4, head("k"));
    assert_eq!(refusal(&out).map(|r| r.status), Some(429));
}

/// The model router may send each pass of a redirect to a deployment of another API (a mixed
/// group: the first pass translated to Anthropic Messages, the next one back to Chat): the
/// re-entering pass reads its body in the API of its own path, not the first pass's, so it
/// finds the cap the router wrote there and injects none of its own.
#[test]
fn a_re_entering_pass_reads_its_body_in_the_api_of_its_own_path() {
    let env = Fake::default();
    let mut core = new_core(LOCAL_RPM, false);
    let messages: &[u8] =
        br#"{"model":"claude-x","max_tokens":4096,"messages":[{"role":"user","content":"hi"}]}"#;
    let chat: &[u8] = br#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":4096}"#;
    let pass = |core: &mut Core, now, ctx, head: Head, body: &[u8]| {
        let mut out = drive_with(
            core,
            &env,
            now,
            Input::RequestHeaders {
                ctx,
                config: Some(0),
                head,
                end_of_stream: false,
            },
            body,
            Ok(()),
        );
        let mut replaced = false;
        let mut next = Some(Input::RequestBody {
            ctx,
            size: body.len(),
            end_of_stream: true,
        });
        while let Some(input) = next.take() {
            core.handle(now, input, &env);
            while let Some((ctx, effect)) = core.poll() {
                match effect {
                    Effect::ReplaceRequestBody { .. } => replaced = true,
                    other => out.push((ctx, other)),
                }
            }
            next = match core.take_await() {
                Some(Await::Body { ctx, size }) => {
                    let body = Ok(body.to_vec());
                    Some(Input::Body { ctx, size, body })
                }
                Some(Await::Written { ctx }) => Some(Input::BodyReplaced {
                    ctx,
                    result: Ok(()),
                }),
                None => None,
            };
        }
        (out, replaced)
    };
    let mut first = head("k");
    first.logical_id = Some("logical-1".into());
    first.path = "/v1/messages".into();
    let (out, replaced) = pass(&mut core, T0, 1, first.clone(), messages);
    assert!(
        proceeded(&out, 1) && !replaced,
        "the Messages body has its cap"
    );
    drive(
        &mut core,
        &env,
        T0 + 1,
        Input::Log {
            ctx: 1,
            superseded: true,
        },
    );
    let mut again = first;
    again.reentry = true;
    again.path = CHAT.into();
    let (out, replaced) = pass(&mut core, T0 + 2, 2, again, chat);
    assert_eq!(counted(&out, "reentry_adopted"), 1);
    assert!(proceeded(&out, 2));
    assert!(
        !replaced,
        "the Chat body's max_completion_tokens is its cap: no max_tokens of the first pass's API added"
    );
}

#[test]
fn a_re_entering_pass_without_a_stashed_admission_is_admitted_afresh() {
    let env = Fake::default();
    let mut core = new_core(LOCAL_RPM, false);
    let mut h = head("k");
    h.logical_id = Some("nobody".into());
    h.reentry = true;
    let out = request(&mut core, &env, T0, 1, h);
    assert_eq!(counted(&out, "reentry_lost"), 1);
    assert_eq!(counted(&out, "admitted"), 1);
}

#[test]
fn on_done_settles_a_request_whose_log_never_ran() {
    let env = Fake::default();
    let mut core = new_core(LOCAL_BUDGET, false);
    request(&mut core, &env, T0, 1, head("k"));
    assert_eq!(core.requests(), 1);
    let out = drive(&mut core, &env, T0, Input::Done { ctx: 1 });
    assert_eq!(counted(&out, "settled_without_usage"), 1);
    assert_eq!(core.requests(), 0);
    let out = drive(&mut core, &env, T0, Input::Done { ctx: 1 });
    assert!(out.is_empty(), "once");
}

#[test]
fn the_shared_data_update_retries_lost_rounds_then_gives_up() {
    let env = Fake::default();
    env.data.borrow_mut().insert("k".into(), (vec![1], 1));
    env.cas_losses.set(CAS_ROUNDS - 1);
    let got = update(&env, "k", &[], |v| (Some(vec![v[0] + 1]), v[0]));
    assert_eq!(got, Ok(1));
    assert_eq!(env.get("k"), Some(vec![2]));
    env.cas_losses.set(CAS_ROUNDS);
    let got = update(&env, "k", &[], |v| (Some(vec![v[0] + 1]), v[0]));
    assert_eq!(got, Err(HostError::CasMismatch));
    assert_eq!(env.get("k"), Some(vec![2]), "unchanged");
    // a missing key is seeded first
    let got = update(&env, "new", &[9], |v| (None, v.to_vec()));
    assert_eq!(got, Ok(vec![9]));
}

// ---------------------------------------------------------------------------------------
// Tiers, group-scoped budgets, key ids

fn tiered(key: &str, tier: Option<&str>) -> Head {
    let mut h = head(key);
    h.identity.tier = tier.map(str::to_string);
    h.stream_id = Some(format!("req-{key}-{}", tier.unwrap_or("-")));
    h
}

fn in_group(key: &str, group: &str) -> Head {
    let mut h = head(key);
    h.identity.model_group = Some(group.to_string());
    h
}

fn admitted_of(core: &mut Core, env: &Fake, ctx: &mut u32, head: &Head, n: u32) -> u32 {
    let mut admitted = 0;
    for _ in 0..n {
        *ctx += 1;
        let out = request(core, env, T0, *ctx, head.clone());
        if proceeded(&out, *ctx) {
            admitted += 1;
        }
        drive(
            core,
            env,
            T0,
            Input::Log {
                ctx: *ctx,
                superseded: false,
            },
        );
    }
    admitted
}

const TIERED_RPM: &str = r#"{"default_max_tokens":100,
    "limits":[{"name":"key-rpm","by":"key","requests":2,"per":"minute",
               "tiers":{"free":1,"pro":4}}]}"#;

#[test]
fn a_limit_takes_the_amount_of_the_requests_tier_and_its_own_for_no_or_an_unknown_tier() {
    let env = Fake::default();
    let mut core = new_core(TIERED_RPM, false);
    let mut ctx = 0;
    for (key, tier, admitted) in [
        ("f", Some("free"), 1),
        ("p", Some("pro"), 4),
        ("n", None, 2),
        ("u", Some("gold"), 2),
    ] {
        assert_eq!(
            admitted_of(&mut core, &env, &mut ctx, &tiered(key, tier), 6),
            admitted,
            "{key} ({tier:?})"
        );
    }
    // the 429 and the rate headers state the tier's amount
    ctx += 1;
    let out = request(&mut core, &env, T0, ctx, tiered("f", Some("free")));
    let reject = refusal(&out).expect("refused");
    assert!(reject
        .response_headers()
        .contains(&("x-ratelimit-limit-requests", "1")));
    assert!(
        reject.message.contains("1 requests per minute"),
        "{}",
        reject.message
    );
    ctx += 1;
    assert!(proceeded(
        &request(&mut core, &env, T0, ctx, tiered("q", Some("pro"))),
        ctx
    ));
    let headers = drive(&mut core, &env, T0, Input::ResponseHeaders { ctx });
    assert!(headers.contains(&(
        ctx,
        Effect::SetHeader(
            Map::Response,
            "x-ratelimit-limit-requests".into(),
            "4".into()
        )
    )));
}

#[test]
fn a_key_that_changes_tier_keeps_its_bucket() {
    let env = Fake::default();
    let mut core = new_core(TIERED_RPM, false);
    let mut ctx = 0;
    // pro spends its 4, then the same key comes as free: still empty, not a fresh bucket
    assert_eq!(
        admitted_of(&mut core, &env, &mut ctx, &tiered("k", Some("pro")), 4),
        4
    );
    assert_eq!(
        admitted_of(&mut core, &env, &mut ctx, &tiered("k", Some("free")), 1),
        0
    );
    assert_eq!(
        admitted_of(&mut core, &env, &mut ctx, &tiered("k", None), 1),
        0
    );
}

#[test]
fn a_budget_takes_the_amount_of_the_requests_tier_and_a_key_that_changes_tier_keeps_its_spend() {
    let env = Fake::default();
    // each request reserves about 110 tokens (a short prompt plus the cap of 100)
    let mut core = new_core(
        r#"{"default_max_tokens":100,
        "budgets":[{"name":"key-day","by":"key","period":"day","tokens":1000,
                    "tiers":{"free":150,"pro":400}}]}"#,
        false,
    );
    let mut ctx = 0;
    // nothing used at settlement: reservations are held until log, so admit without logs
    let mut admit = |core: &mut Core, head: Head| {
        ctx += 1;
        let out = request(core, &env, T0, ctx, head);
        proceeded(&out, ctx)
    };
    assert!(admit(&mut core, tiered("f", Some("free"))));
    assert!(
        !admit(&mut core, tiered("f", Some("free"))),
        "150 covers one"
    );
    for _ in 0..3 {
        assert!(admit(&mut core, tiered("p", Some("pro"))));
    }
    assert!(
        !admit(&mut core, tiered("p", Some("pro"))),
        "400 covers three"
    );
    // the pro key demoted to free: its 330 spent are over free's 150
    assert!(!admit(&mut core, tiered("p", Some("free"))));
    // the free key promoted to pro: its 110 spent leave room under 400
    assert!(admit(&mut core, tiered("f", Some("pro"))));
    for _ in 0..8 {
        assert!(admit(&mut core, tiered("n", None)), "no tier: 1000");
    }
    assert!(!admit(&mut core, tiered("n", None)));
}

#[test]
fn a_budget_warning_is_a_percentage_of_the_tiers_amount() {
    let env = Fake::default();
    let mut core = new_core(
        r#"{"default_max_tokens":100,
        "budgets":[{"name":"key-day","by":"key","period":"day","tokens":100000,
                    "tiers":{"free":200},"warn_at":[50]}]}"#,
        false,
    );
    assert!(proceeded(
        &request(&mut core, &env, T0, 1, tiered("f", Some("free"))),
        1
    ));
    let headers = drive(&mut core, &env, T0, Input::ResponseHeaders { ctx: 1 });
    assert!(headers.contains(&(
        1,
        Effect::SetHeader(
            Map::Response,
            decide::BUDGET_WARNING_HEADER.into(),
            "key-day=50".into()
        )
    )));
    let out = request(&mut core, &env, T0, 2, tiered("n", None));
    assert_eq!(counted(&out, "budget_warning.key-day.50"), 0);
}

const SMART_MONEY: &str = r#"{"default_max_tokens":100,
    "budgets":[{"name":"smart-day","by":"tenant","period":"day","money":"1",
                "currency":"USD","model_groups":["smart"]}]}"#;

#[test]
fn a_budget_scoped_to_a_group_neither_reserves_nor_settles_for_another_group() {
    let env = Fake::default();
    let mut core = new_core(SMART_MONEY, false);
    *env.route.borrow_mut() = Some(route("fast", 1_000_000));
    let out = request(&mut core, &env, T0, 1, in_group("k", "fast"));
    assert!(proceeded(&out, 1));
    *env.record.borrow_mut() = Some(record(10, 20));
    drive(
        &mut core,
        &env,
        T0,
        Input::Log {
            ctx: 1,
            superseded: false,
        },
    );
    assert!(
        env.data
            .borrow()
            .keys()
            .all(|k| !k.starts_with(LOCAL_BUDGET_PREFIX)),
        "a fast request touches no level of the smart budget"
    );
    // a smart request reserves and settles against it
    *env.route.borrow_mut() = Some(route("smart", 1_000_000));
    assert!(proceeded(
        &request(&mut core, &env, T0, 2, in_group("k", "smart")),
        2
    ));
    let levels = budget::levels(
        &core.rules().global().unwrap().budgets,
        &in_group("k", "smart").identity,
        T0,
    );
    assert!(env.local_spent(&levels[0].key) > 0, "reserved");
    drive(
        &mut core,
        &env,
        T0,
        Input::Log {
            ctx: 2,
            superseded: false,
        },
    );
    // 10 prompt + 20 completion tokens at $1 per 1M tokens
    assert_eq!(
        env.local_spent(&levels[0].key),
        30_000,
        "settled to the usage"
    );
}

#[test]
fn in_redis_a_budget_scoped_to_a_group_sends_nothing_for_another_group() {
    let env = Fake::default();
    let mut core = new_core(
        r#"{"default_max_tokens":100,
        "budgets":[{"name":"smart-day","by":"tenant","period":"day","tokens":100000,
                    "model_groups":["smart"]}],
        "redis":{"transport":"http","cluster":"webdis"}}"#,
        false,
    );
    let out = request(&mut core, &env, T0, 1, in_group("k", "fast"));
    assert!(proceeded(&out, 1), "no reservation to wait for");
    *env.record.borrow_mut() = Some(record(10, 20));
    drive(
        &mut core,
        &env,
        T0,
        Input::Log {
            ctx: 1,
            superseded: false,
        },
    );
    drive(&mut core, &env, T0 + 1, Input::Tick);
    assert!(env.take_sent().is_empty(), "no RESERVE, no RECONCILE");
    let out = request(&mut core, &env, T0, 2, in_group("k", "smart"));
    assert!(!proceeded(&out, 2));
    assert_eq!(env.take_sent()[0].script(), "RESERVE");
}

#[test]
fn the_budget_fallback_leaves_a_budget_scoped_to_the_refused_group() {
    // only the smart budget: the fallback to fast reserves nothing
    let env = Fake::default();
    let mut core = new_core(
        r#"{"default_max_tokens":1000,
        "budgets":[{"name":"smart-day","by":"tenant","period":"day","money":"0.01",
                    "currency":"USD","model_groups":["smart"]}]}"#,
        false,
    );
    *env.route.borrow_mut() = Some(route("smart", 100_000_000));
    *env.alternative.borrow_mut() = Some(alternative("fast", 1_000_000));
    let out = request(&mut core, &env, T0, 1, in_group("k", "smart"));
    assert!(proceeded(&out, 1), "{out:?}");
    assert_eq!(counted(&out, "budget_fallback"), 1);
    assert!(out.contains(&(1, Effect::Own(Own::RewriteModel("cheap-model".into())))));
    *env.record.borrow_mut() = Some(record(10, 20));
    drive(
        &mut core,
        &env,
        T0,
        Input::Log {
            ctx: 1,
            superseded: false,
        },
    );
    assert!(
        env.data
            .borrow()
            .iter()
            .filter(|(k, _)| k.starts_with(LOCAL_BUDGET_PREFIX))
            .all(|(_, (v, _))| decode_u64(v) == 0),
        "nothing charged to the smart budget"
    );

    // with a tenant budget over every group as well, the fallback reserves that one only
    let env = Fake::default();
    let mut core = new_core(
        r#"{"default_max_tokens":1000,
        "budgets":[{"name":"smart-day","by":"tenant","period":"day","money":"0.01",
                    "currency":"USD","model_groups":["smart"]},
                   {"name":"all-day","by":"tenant","period":"day","money":"10",
                    "currency":"USD"}]}"#,
        false,
    );
    *env.route.borrow_mut() = Some(route("smart", 100_000_000));
    *env.alternative.borrow_mut() = Some(alternative("fast", 1_000_000));
    let out = request(&mut core, &env, T0, 1, in_group("k", "smart"));
    assert!(proceeded(&out, 1), "{out:?}");
    assert_eq!(counted(&out, "budget_fallback"), 1);
    let budgets = &core.rules().global().unwrap().budgets;
    let smart = budget::levels(budgets, &in_group("k", "smart").identity, T0);
    let fast = budget::levels(budgets, &in_group("k", "fast").identity, T0);
    assert_eq!((smart.len(), fast.len()), (2, 1));
    assert_eq!(env.local_spent(&smart[0].key), 0, "smart budget untouched");
    let all = env.local_spent(&fast[0].key);
    assert!(
        all > 0 && all < 10_000_000,
        "reserved at fast's price: {all}"
    );
}

#[test]
fn the_sync_worker_leases_at_the_amount_of_the_tier_the_bucket_was_taken_at() {
    let env = Fake::default();
    let mut core = new_core(
        r#"{"default_max_tokens":100,"lease":{"low_percent":100,"batch_percent":10},
        "limits":[{"name":"key-tpm","by":"key","tokens":100000,"per":"minute",
                   "tiers":{"free":2000}}],
        "redis":{"transport":"http","cluster":"webdis"}}"#,
        false,
    );
    request(&mut core, &env, T0, 1, tiered("k", Some("free")));
    let lease = env.take_sent();
    assert_eq!(
        lease[0].argv()[0],
        2000,
        "the request's lease: free's capacity"
    );
    let out = reply(&mut core, &env, T0, lease[0].token, &ints(&[200, 0, 0]));
    assert!(proceeded(&out, 1));
    drive(&mut core, &env, T0 + 2, Input::Tick);
    let topup = env.take_sent();
    assert_eq!(topup.len(), 1);
    assert_eq!(
        topup[0].argv()[..4],
        [2000, 60_000, 200, 200],
        "capacity and a batch of 10% of free's amount"
    );
    // an amount the limit does not have (shared data is another VM's word): the default
    let line = String::from_utf8(env.get(WANT_KEY).unwrap_or_default()).unwrap();
    assert!(line.is_empty());
    let keys = budget::bucket_keys(
        &core.rules().global().unwrap().limits[0],
        &tiered("k", None).identity,
    )
    .unwrap();
    env.data.borrow_mut().insert(
        WANT_KEY.into(),
        (
            format!("{}\t{}\t{}\t777\n", keys.local, keys.redis, keys.owner).into_bytes(),
            1,
        ),
    );
    drive(&mut core, &env, T0 + 3, Input::Tick);
    assert_eq!(env.take_sent()[0].argv()[0], 100_000);
}

#[test]
fn a_per_key_budget_counts_by_the_key_id_whatever_else_differs() {
    // key-auth gives a rotated key (a new digest) the id of the key it replaces; the old and
    // the new key arrive with the same x-llm-key-id and share the budget
    let env = Fake::default();
    let mut core = new_core(
        r#"{"default_max_tokens":100,
        "budgets":[{"name":"key-day","by":"key","period":"day","tokens":250}]}"#,
        false,
    );
    let mut old = head("team-a-prod");
    old.stream_id = Some("req-old".into());
    let mut new = head("team-a-prod");
    new.stream_id = Some("req-new".into());
    new.identity.tier = Some("pro".into());
    assert!(proceeded(&request(&mut core, &env, T0, 1, old.clone()), 1));
    assert!(proceeded(&request(&mut core, &env, T0, 2, new.clone()), 2));
    let out = request(&mut core, &env, T0, 3, new);
    assert_eq!(
        refusal(&out).map(|r| r.status),
        Some(402),
        "spend carried over"
    );
    // another id has its own
    assert!(proceeded(
        &request(&mut core, &env, T0, 4, head("team-b")),
        4
    ));
}
