//! token-ratelimit's Lua scripts (`token_ratelimit::scripts`) against a real `redis-server`:
//! the commands the plugin sends, over a plain TCP connection, and the replies decoded by the
//! plugin's own decoders. Refill math on an explicit clock and on Redis `TIME`, partial grants
//! and waits, all-or-nothing and idempotent reservations, exactly-once reconcile, idempotent
//! charges, EVALSHA → NOSCRIPT → EVAL, a TTL on every key ever written, exact integers up to
//! 2^53, concurrent callers never overshooting, and the same scripts on a Redis Cluster node
//! (one slot per call, cross-slot refused).

use llm_gateway_shared::resp::{self, Limits, Reply, RespError};
use llm_gateway_tests::harness::traffic::redis_query;
use llm_gateway_tests::redis::{free_port, Redis};
use llm_gateway_tests::workspace::TempDir;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use token_ratelimit::scripts::{
    self, ChargeLevel, Lease, LeaseArgs, Reconcile, ReconcileLevel, Reserve, ReserveLevel,
    ScriptError, MAX_SAFE,
};

/// One connection, one command at a time; replies returned as the raw bytes Redis sent
/// (exactly what Higress hands the plugin).
struct Client {
    stream: TcpStream,
    pending: Vec<u8>,
}

impl Client {
    fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Client {
            stream,
            pending: Vec::new(),
        }
    }

    fn raw(&mut self, command: &[u8]) -> Vec<u8> {
        self.stream.write_all(command).unwrap();
        loop {
            match resp::decode_prefix(&self.pending, &Limits::default()) {
                Ok((_, used)) => return self.pending.drain(..used).collect(),
                Err(RespError::Incomplete) => {
                    let mut buf = [0u8; 4096];
                    let n = self.stream.read(&mut buf).unwrap();
                    assert!(n > 0, "redis closed the connection");
                    self.pending.extend_from_slice(&buf[..n]);
                }
                Err(e) => panic!("bad reply from redis: {e}"),
            }
        }
    }

    fn cmd(&mut self, args: &[&str]) -> Reply {
        let reply = self.raw(&resp::encode_command(args));
        resp::decode(&reply, &Limits::default()).unwrap()
    }

    fn int(&mut self, args: &[&str]) -> i64 {
        let reply = self.cmd(args);
        reply
            .integer()
            .unwrap_or_else(|| panic!("{args:?}: {reply:?}"))
    }

    /// A level's spent value (0 when missing).
    fn spent(&mut self, key: &str) -> i64 {
        match self.cmd(&["GET", key]) {
            Reply::Bulk(None) => 0,
            reply => reply.integer().unwrap(),
        }
    }

    fn exists(&mut self, key: &str) -> bool {
        self.int(&["EXISTS", key]) == 1
    }

    fn pttl(&mut self, key: &str) -> i64 {
        self.int(&["PTTL", key])
    }

    /// What the plugin does: EVALSHA, and EVAL when Redis answers NOSCRIPT.
    fn run(&mut self, build: impl Fn(bool) -> Vec<u8>) -> Vec<u8> {
        let reply = self.raw(&build(false));
        match resp::decode(&reply, &Limits::default()) {
            Ok(Reply::Error(e)) if e.starts_with("NOSCRIPT") => self.raw(&build(true)),
            _ => reply,
        }
    }

    fn lease(&mut self, bucket: &str, args: LeaseArgs) -> Lease {
        let reply = self.run(|src| scripts::lease_command(bucket, &args, src));
        scripts::decode_lease(&reply).unwrap()
    }

    fn give_back(&mut self, bucket: &str, capacity: u64, window_ms: u64, amount: u64) -> u64 {
        let reply = self
            .run(|src| scripts::give_back_command(bucket, capacity, window_ms, amount, NOW, src));
        scripts::decode_give_back(&reply).unwrap()
    }

    fn reserve(&mut self, reservation: &str, levels: &[ReserveLevel<'_>]) -> Reserve {
        let reply = self.run(|src| scripts::reserve_command(reservation, TTL, levels, NOW, src));
        scripts::decode_reserve(&reply, levels.len()).unwrap()
    }

    fn reconcile(&mut self, reservation: &str, levels: &[ReconcileLevel<'_>]) -> Reconcile {
        let reply = self.run(|src| scripts::reconcile_command(reservation, levels, NOW, src));
        scripts::decode_reconcile(&reply, levels.len()).unwrap()
    }

    fn charge(&mut self, marker: &str, levels: &[ChargeLevel<'_>]) -> bool {
        let reply = self.run(|src| scripts::charge_command(marker, TTL, levels, NOW, src));
        scripts::decode_charge(&reply).unwrap()
    }

    /// Redis's clock in ms (what `now_ms = 0` means).
    fn time_ms(&mut self) -> u64 {
        let Reply::Array(Some(parts)) = self.cmd(&["TIME"]) else {
            panic!("TIME");
        };
        let secs = parts[0].integer().unwrap() as u64;
        let micros = parts[1].integer().unwrap() as u64;
        secs * 1000 + micros / 1000
    }

    /// The property every test ends on: no key without a TTL.
    fn assert_every_key_has_a_ttl(&mut self) {
        let Reply::Array(Some(keys)) = self.cmd(&["KEYS", "*"]) else {
            panic!("KEYS");
        };
        for key in keys {
            let key = String::from_utf8(key.bytes().unwrap().to_vec()).unwrap();
            let pttl = self.pttl(&key);
            assert!(pttl > 0, "{key} has PTTL {pttl}");
        }
    }
}

/// The explicit clock of the tests that need no Redis time (ms; any positive value).
const NOW: u64 = 1_700_000_000_000;
/// Reservation / marker TTL.
const TTL: u64 = 60_000;
/// Level expiry: an hour after NOW by the test clock, but levels are checked against Redis's
/// clock, so far enough in the future for any machine clock.
const EXPIRE_AT: u64 = 4_000_000_000_000;

fn key(kind: &str, rest: &str) -> String {
    format!("llm:{{t:acme}}:{kind}:{rest}")
}

fn level(key: &str, amount: u64, limit: u64) -> ReserveLevel<'_> {
    ReserveLevel {
        key,
        amount,
        limit,
        expire_at_ms: EXPIRE_AT,
    }
}

fn actual(key: &str, actual: u64) -> ReconcileLevel<'_> {
    ReconcileLevel { key, actual }
}

fn lease_args(capacity: u64, window_ms: u64, want: (u64, u64), now_ms: u64) -> LeaseArgs {
    LeaseArgs {
        capacity,
        window_ms,
        want_min: want.0,
        want_max: want.1,
        now_ms,
    }
}

fn granted(granted: u64, remaining: u64, wait_ms: u64) -> Lease {
    Lease {
        granted,
        remaining,
        wait_ms,
    }
}

fn hget(client: &mut Client, key: &str, field: &str) -> String {
    let reply = client.cmd(&["HGET", key, field]);
    String::from_utf8(reply.bytes().unwrap().to_vec()).unwrap()
}

#[test]
fn lease_refills_by_the_explicit_clock() {
    let redis = Redis::start().unwrap();
    let mut c = Client::connect(redis.addr());
    let bucket = key("rl", "tpm:alice");
    // 100 tokens per 1000 ms: 0.1 token per ms; a new bucket is full
    let at = |ms: u64, want: (u64, u64)| lease_args(100, 1000, want, NOW + ms);
    assert_eq!(c.lease(&bucket, at(0, (1, 60))), granted(60, 40, 0));
    // 40 < 50: nothing, and 10 tokens are 100 ms away
    assert_eq!(c.lease(&bucket, at(0, (50, 50))), granted(0, 40, 100));
    assert_eq!(c.lease(&bucket, at(90, (50, 50))), granted(0, 49, 10));
    assert_eq!(c.lease(&bucket, at(100, (50, 50))), granted(50, 0, 0));
    // a long pause refills to capacity, not beyond
    assert_eq!(c.lease(&bucket, at(5100, (1, 1000))), granted(100, 0, 0));
    assert_eq!(hget(&mut c, &bucket, "ts"), (NOW + 5100).to_string());
    // a clock that goes back refills nothing and keeps the newest ts
    assert_eq!(c.lease(&bucket, at(0, (1, 1))), granted(0, 0, 10));
    assert_eq!(hget(&mut c, &bucket, "ts"), (NOW + 5100).to_string());
    assert_eq!(c.lease(&bucket, at(5110, (1, 1))), granted(1, 0, 0));
    // the bucket lives 2 windows after its last write
    let pttl = c.pttl(&bucket);
    assert!(pttl > 0 && pttl <= 2000, "{pttl}");
    c.assert_every_key_has_a_ttl();
}

#[test]
fn lease_grants_partially_between_want_min_and_want_max() {
    let redis = Redis::start().unwrap();
    let mut c = Client::connect(redis.addr());
    let bucket = key("rl", "tpm:bob");
    let args = |want: (u64, u64)| lease_args(50, 1000, want, NOW);
    assert_eq!(c.lease(&bucket, args((1, 30))), granted(30, 20, 0));
    // 20 left: at least 10 wanted, up to 30: all 20 granted
    assert_eq!(c.lease(&bucket, args((10, 30))), granted(20, 0, 0));
    // empty: 10 tokens at 0.05/ms are 200 ms away
    assert_eq!(c.lease(&bucket, args((10, 30))), granted(0, 0, 200));
    // fractional tokens: 0.05 × 30 ms = 1.5 → one whole token granted, half kept
    let later = lease_args(50, 1000, (1, 5), NOW + 30);
    assert_eq!(c.lease(&bucket, later), granted(1, 0, 0));
    assert_eq!(hget(&mut c, &bucket, "tokens"), "0.5");
    c.assert_every_key_has_a_ttl();
}

#[test]
fn give_back_refills_up_to_capacity() {
    let redis = Redis::start().unwrap();
    let mut c = Client::connect(redis.addr());
    let bucket = key("rl", "tpm:carol");
    assert_eq!(
        c.lease(&bucket, lease_args(100, 60_000, (1, 100), NOW)),
        granted(100, 0, 0)
    );
    assert_eq!(c.give_back(&bucket, 100, 60_000, 30), 30);
    assert_eq!(
        c.lease(&bucket, lease_args(100, 60_000, (1, 10), NOW)),
        granted(10, 20, 0)
    );
    assert_eq!(c.give_back(&bucket, 100, 60_000, 500), 100);
    // a bucket that does not exist is full: giving back keeps it full, with a TTL
    let other = key("rl", "tpm:dave");
    assert_eq!(c.give_back(&other, 100, 60_000, 5), 100);
    let pttl = c.pttl(&other);
    assert!(pttl > 0 && pttl <= 120_000, "{pttl}");
    c.assert_every_key_has_a_ttl();
}

#[test]
fn now_ms_zero_uses_the_redis_clock() {
    let redis = Redis::start().unwrap();
    let mut c = Client::connect(redis.addr());
    let bucket = key("rl", "tpd:erin");
    let hour = 3_600_000;
    let before = c.time_ms();
    assert_eq!(
        c.lease(&bucket, lease_args(1_000_000, hour, (1, 1_000_000), 0)),
        granted(1_000_000, 0, 0)
    );
    let after = c.time_ms();
    let ts: u64 = hget(&mut c, &bucket, "ts").parse().unwrap();
    assert!(before <= ts && ts <= after, "{before} <= {ts} <= {after}");
    // drained: a full bucket is (at most) an hour away by Redis's clock
    let again = c.lease(
        &bucket,
        lease_args(1_000_000, hour, (1_000_000, 1_000_000), 0),
    );
    assert_eq!(again.granted, 0);
    assert!(again.wait_ms > 0 && again.wait_ms <= hour, "{again:?}");
    // and exactly a window after ts by an explicit clock
    assert_eq!(
        c.lease(
            &bucket,
            lease_args(1_000_000, hour, (1, 1_000_000), ts + hour)
        ),
        granted(1_000_000, 0, 0)
    );
    c.assert_every_key_has_a_ttl();
}

#[test]
fn a_refused_reservation_deducts_nothing() {
    let redis = Redis::start().unwrap();
    let mut c = Client::connect(redis.addr());
    let (tenant, consumer) = (key("bud", "month:acme:2025-01"), key("bud", "day:frank:1"));
    let first = key("res", "req-1");
    assert_eq!(
        c.reserve(
            &first,
            &[level(&tenant, 80, 1000), level(&consumer, 80, 100)]
        ),
        Reserve::Reserved {
            remaining: vec![920, 20]
        }
    );
    // the second level has 20 left: refused there, the first level untouched
    let second = key("res", "req-2");
    assert_eq!(
        c.reserve(
            &second,
            &[level(&tenant, 30, 1000), level(&consumer, 30, 100)]
        ),
        Reserve::Refused {
            level: 1,
            remaining: 20
        }
    );
    // the first level refuses: the second is not touched either
    assert_eq!(
        c.reserve(
            &second,
            &[level(&tenant, 950, 1000), level(&consumer, 5, 100)]
        ),
        Reserve::Refused {
            level: 0,
            remaining: 920
        }
    );
    assert_eq!((c.spent(&tenant), c.spent(&consumer)), (80, 80));
    assert!(!c.exists(&second));
    // exactly up to the limit is allowed; spent above a (lowered) limit reports a negative rest
    assert_eq!(
        c.reserve(
            &second,
            &[level(&tenant, 20, 1000), level(&consumer, 20, 100)]
        ),
        Reserve::Reserved {
            remaining: vec![900, 0]
        }
    );
    assert_eq!(
        c.reserve(&key("res", "req-3"), &[level(&consumer, 0, 60)]),
        Reserve::Refused {
            level: 0,
            remaining: -40
        }
    );
    // TTLs: levels expire at their period's end, the reservation after its ttl
    let expire_at = c.int(&["PEXPIRETIME", &tenant]);
    assert_eq!(expire_at, EXPIRE_AT as i64);
    let pttl = c.pttl(&first);
    assert!(pttl > 0 && pttl <= TTL as i64, "{pttl}");
    assert_eq!(hget(&mut c, &first, "n"), "2");
    assert_eq!(hget(&mut c, &first, "a1"), "80");
    c.assert_every_key_has_a_ttl();
}

#[test]
fn a_replayed_reservation_deducts_once() {
    let redis = Redis::start().unwrap();
    let mut c = Client::connect(redis.addr());
    let budget = key("bud", "month:acme:2025-01");
    let reservation = key("res", "req-1");
    let levels = [level(&budget, 70, 100)];
    assert_eq!(
        c.reserve(&reservation, &levels),
        Reserve::Reserved {
            remaining: vec![30]
        }
    );
    // the same request again (a retry): nothing deducted, even though 70 > 30 would refuse
    for _ in 0..2 {
        assert_eq!(
            c.reserve(&reservation, &levels),
            Reserve::Replayed {
                remaining: vec![30]
            }
        );
    }
    assert_eq!(c.spent(&budget), 70);
    c.assert_every_key_has_a_ttl();
}

#[test]
fn reconcile_settles_exactly_once_and_charges_over_use() {
    let redis = Redis::start().unwrap();
    let mut c = Client::connect(redis.addr());
    let (a, b) = (key("bud", "a:x:1"), key("bud", "b:x:1"));
    let reservation = key("res", "req-1");
    c.reserve(&reservation, &[level(&a, 100, 1000), level(&b, 100, 500)]);
    // a used less than reserved (refund 60), b more (30 charged on top)
    let settle = [actual(&a, 40), actual(&b, 130)];
    assert_eq!(
        c.reconcile(&reservation, &settle),
        Reconcile::Done {
            refunds: vec![60, -30]
        }
    );
    assert_eq!((c.spent(&a), c.spent(&b)), (40, 130));
    assert!(!c.exists(&reservation));
    // again: nothing changes
    assert_eq!(c.reconcile(&reservation, &settle), Reconcile::Already);
    assert_eq!((c.spent(&a), c.spent(&b)), (40, 130));
    // the level TTL set by RESERVE is kept
    assert_eq!(c.int(&["PEXPIRETIME", &a]), EXPIRE_AT as i64);
    // a reconcile naming other levels than reserved is refused and keeps the reservation
    let other = key("res", "req-2");
    c.reserve(&other, &[level(&a, 10, 1000), level(&b, 10, 500)]);
    let reply = c.raw(&scripts::reconcile_command(
        &other,
        &[actual(&a, 0)],
        NOW,
        true,
    ));
    let Err(ScriptError::Redis(text)) = scripts::decode_reconcile(&reply, 1) else {
        panic!("{}", String::from_utf8_lossy(&reply));
    };
    assert!(text.contains("bad n"), "{text}");
    assert!(c.exists(&other));
    assert_eq!((c.spent(&a), c.spent(&b)), (50, 140));
    c.assert_every_key_has_a_ttl();
}

#[test]
fn reconcile_never_goes_below_zero_nor_recreates_an_expired_level() {
    let redis = Redis::start().unwrap();
    let mut c = Client::connect(redis.addr());
    let (a, b) = (key("bud", "a:x:1"), key("bud", "b:x:1"));
    let reservation = key("res", "req-1");
    c.reserve(&reservation, &[level(&a, 50, 1000), level(&b, 50, 1000)]);
    // a was reset meanwhile (10 left); b's period ended (key gone)
    assert_eq!(
        c.cmd(&["SET", &a, "10", "KEEPTTL"]),
        Reply::Simple("OK".into())
    );
    c.cmd(&["DEL", &b]);
    assert_eq!(
        c.reconcile(&reservation, &[actual(&a, 0), actual(&b, 70)]),
        Reconcile::Done {
            refunds: vec![10, 0]
        }
    );
    assert_eq!(c.spent(&a), 0);
    assert!(!c.exists(&b), "an expired level came back (without TTL)");
    c.assert_every_key_has_a_ttl();
}

#[test]
fn charge_counts_once_per_marker() {
    let redis = Redis::start().unwrap();
    let mut c = Client::connect(redis.addr());
    let (a, b) = (key("bud", "a:x:1"), key("bud", "b:x:1"));
    let levels = [
        ChargeLevel {
            key: &a,
            amount: 25,
            expire_at_ms: EXPIRE_AT,
        },
        ChargeLevel {
            key: &b,
            amount: 7,
            expire_at_ms: EXPIRE_AT + 1,
        },
    ];
    let marker = key("done", "req-1");
    assert!(c.charge(&marker, &levels));
    assert!(!c.charge(&marker, &levels));
    assert_eq!((c.spent(&a), c.spent(&b)), (25, 7));
    assert!(c.charge(&key("done", "req-2"), &levels));
    assert_eq!((c.spent(&a), c.spent(&b)), (50, 14));
    assert_eq!(c.int(&["PEXPIRETIME", &b]), EXPIRE_AT as i64 + 1);
    let pttl = c.pttl(&marker);
    assert!(pttl > 0 && pttl <= TTL as i64, "{pttl}");
    // no limit check: a charge records what was served
    let over = [ChargeLevel {
        key: &a,
        amount: MAX_SAFE - 50,
        expire_at_ms: EXPIRE_AT,
    }];
    assert!(c.charge(&key("done", "req-3"), &over));
    assert_eq!(c.spent(&a), MAX_SAFE as i64);
    // PEEK reads without writing
    let reply = c.run(|src| scripts::peek_command(&[&a, &b, &key("bud", "none")], 0, src));
    assert_eq!(
        scripts::decode_peek(&reply, 3),
        Ok(vec![MAX_SAFE as i64, 14, 0])
    );
    assert!(!c.exists(&key("bud", "none")));
    c.assert_every_key_has_a_ttl();
}

#[test]
fn amounts_stay_exact_up_to_2_pow_53() {
    let redis = Redis::start().unwrap();
    let mut c = Client::connect(redis.addr());
    let budget = key("bud", "nano:acme:1");
    // `tostring` would print it as 1e+15: the scripts format with %d
    let quadrillion = 1_000_000_000_000_000u64;
    assert_eq!(
        c.reserve(&key("res", "r1"), &[level(&budget, quadrillion, MAX_SAFE)]),
        Reserve::Reserved {
            remaining: vec![(MAX_SAFE - quadrillion) as i64]
        }
    );
    assert_eq!(
        c.reserve(
            &key("res", "r2"),
            &[level(&budget, MAX_SAFE - quadrillion, MAX_SAFE)]
        ),
        Reserve::Reserved { remaining: vec![0] }
    );
    assert_eq!(
        c.reserve(&key("res", "r3"), &[level(&budget, 1, MAX_SAFE)]),
        Reserve::Refused {
            level: 0,
            remaining: 0
        }
    );
    assert_eq!(
        c.reconcile(&key("res", "r1"), &[actual(&budget, quadrillion - 1)]),
        Reconcile::Done { refunds: vec![1] }
    );
    assert_eq!(c.spent(&budget), MAX_SAFE as i64 - 1);
    let bucket = key("rl", "big");
    assert_eq!(
        c.lease(&bucket, lease_args(MAX_SAFE, 1000, (1, MAX_SAFE), NOW)),
        granted(MAX_SAFE, 0, 0)
    );
    // want_max above 2^53 is an argument error: the bucket is untouched, so a valid lease
    // a window later finds it full again
    let reply = c.raw(&scripts::lease_command(
        &bucket,
        &lease_args(MAX_SAFE, 1000, (1, u64::MAX), NOW + 1000),
        true,
    ));
    assert!(matches!(
        scripts::decode_lease(&reply),
        Err(ScriptError::Redis(_))
    ));
    assert_eq!(
        c.lease(
            &bucket,
            lease_args(MAX_SAFE, 1000, (1, MAX_SAFE), NOW + 1000)
        ),
        granted(MAX_SAFE, 0, 0)
    );
    c.assert_every_key_has_a_ttl();
}

#[test]
fn bad_arguments_are_error_replies_that_change_nothing() {
    let redis = Redis::start().unwrap();
    let mut c = Client::connect(redis.addr());
    let (r, l1, l2) = (key("res", "r"), key("bud", "1"), key("bud", "2"));
    let lease = scripts::lease();
    let reserve = scripts::reserve();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            scripts::lease_command(&l1, &lease_args(10, 1000, (0, 5), NOW), true),
            "bad want_min",
        ),
        (
            scripts::lease_command(&l1, &lease_args(10, 1000, (11, 20), NOW), true),
            "bad want_min",
        ),
        (
            scripts::lease_command(&l1, &lease_args(10, 1000, (5, 4), NOW), true),
            "bad want_max",
        ),
        (
            scripts::lease_command(&l1, &lease_args(0, 1000, (1, 1), NOW), true),
            "bad capacity",
        ),
        (
            scripts::lease_command(&l1, &lease_args(MAX_SAFE + 1, 1000, (1, 1), NOW), true),
            "bad capacity",
        ),
        (
            scripts::lease_command(&l1, &lease_args(10, 0, (1, 1), NOW), true),
            "bad window_ms",
        ),
        (
            scripts::lease_command(&l1, &lease_args(10, 1 << 45, (1, 1), NOW), true),
            "bad window_ms",
        ),
        (
            scripts::command(lease, &[&l1], &[10, 1000, 1, 1, -1], true),
            "bad now_ms",
        ),
        (
            scripts::command(lease, &[&l1, &l2], &[10, 1000, 1, 1, 0], true),
            "bad arity",
        ),
        (
            scripts::command(lease, &[&l1], &[10, 1000, 1, 1], true),
            "bad arity",
        ),
        (scripts::reserve_command(&r, TTL, &[], NOW, true), "bad n"),
        (
            scripts::reserve_command(&r, 0, &[level(&l1, 1, 10)], NOW, true),
            "bad ttl_ms",
        ),
        (
            scripts::reserve_command(&r, TTL, &[level(&l1, 1, 10), level(&l1, 1, 10)], NOW, true),
            "bad keys",
        ),
        (
            scripts::reserve_command(&r, TTL, &[level(&r, 1, 10)], NOW, true),
            "bad keys",
        ),
        (
            scripts::reserve_command(
                &r,
                TTL,
                &[ReserveLevel {
                    key: &l1,
                    amount: 1,
                    limit: 10,
                    expire_at_ms: 0,
                }],
                NOW,
                true,
            ),
            "bad expire_at_ms",
        ),
        (
            scripts::reserve_command(
                &r,
                TTL,
                &[level(&l1, 1, 10), level(&l2, 1, MAX_SAFE + 1)],
                NOW,
                true,
            ),
            "bad limit",
        ),
        (
            scripts::command(
                reserve,
                &[&r, &l1],
                &[TTL as i64, 2, 1, 10, 5, 1, 10, 5, 0],
                true,
            ),
            "bad arity",
        ),
        (
            scripts::command(reserve, &[&r, &l1], &[TTL as i64, 1, -1, 10, 5, 0], true),
            "bad amount",
        ),
        (scripts::reconcile_command(&r, &[], NOW, true), "bad n"),
        (scripts::charge_command(&r, TTL, &[], NOW, true), "bad n"),
        (
            scripts::command(
                scripts::charge(),
                &[&r, &l1],
                &[TTL as i64, 1, 5, 0, 0],
                true,
            ),
            "bad expire_at_ms",
        ),
        (scripts::peek_command(&[], NOW, true), "bad arity"),
    ];
    for (command, expected) in cases {
        let reply = c.raw(&command);
        // every decoder sees an error reply as Redis(..), never as a value or NoScript
        let err = scripts::decode_charge(&reply).unwrap_err();
        let ScriptError::Redis(text) = &err else {
            panic!("{expected}: {err:?}");
        };
        assert!(
            text.starts_with("ERR token-ratelimit: ") && text.contains(expected),
            "{expected}: {text}"
        );
        assert_eq!(scripts::decode_lease(&reply).unwrap_err(), err);
        assert_eq!(scripts::decode_reserve(&reply, 1).unwrap_err(), err);
        assert_eq!(scripts::decode_reconcile(&reply, 1).unwrap_err(), err);
    }
    // nothing was written
    assert_eq!(c.cmd(&["DBSIZE"]), Reply::Integer(0));
    // a key of another type is Redis's own error, also nothing written
    c.cmd(&["SET", &l1, "x", "PX", "60000"]);
    let reply = c.raw(&scripts::lease_command(
        &l1,
        &lease_args(10, 1000, (1, 1), NOW),
        true,
    ));
    assert!(matches!(
        scripts::decode_lease(&reply),
        Err(ScriptError::Redis(text)) if text.starts_with("WRONGTYPE")
    ));
    c.assert_every_key_has_a_ttl();
}

#[test]
fn evalsha_falls_back_to_eval_on_noscript() {
    let redis = Redis::start().unwrap();
    let mut c = Client::connect(redis.addr());
    // Redis's digest of each source is ours
    for script in scripts::all() {
        let loaded = c.cmd(&["SCRIPT", "LOAD", script.source]);
        assert_eq!(
            loaded.bytes(),
            Some(script.sha1.as_bytes()),
            "{}",
            script.name
        );
    }
    c.cmd(&["SCRIPT", "FLUSH"]);
    let bucket = key("rl", "x");
    let args = lease_args(10, 1000, (1, 1), NOW);
    let reply = c.raw(&scripts::lease_command(&bucket, &args, false));
    assert_eq!(scripts::decode_lease(&reply), Err(ScriptError::NoScript));
    assert!(!c.exists(&bucket), "a NOSCRIPT call ran nothing");
    let reply = c.raw(&scripts::lease_command(&bucket, &args, true));
    assert_eq!(scripts::decode_lease(&reply), Ok(granted(1, 9, 0)));
    // EVAL cached it: EVALSHA works now
    let reply = c.raw(&scripts::lease_command(&bucket, &args, false));
    assert_eq!(scripts::decode_lease(&reply), Ok(granted(1, 8, 0)));
    for (name, reply) in [
        (
            "reserve",
            c.raw(&scripts::reserve_command(
                &key("res", "r"),
                TTL,
                &[level(&key("bud", "b"), 1, 1)],
                NOW,
                false,
            )),
        ),
        (
            "reconcile",
            c.raw(&scripts::reconcile_command(
                &key("res", "r"),
                &[actual(&key("bud", "b"), 1)],
                NOW,
                false,
            )),
        ),
        (
            "charge",
            c.raw(&scripts::charge_command(
                &key("done", "r"),
                TTL,
                &[],
                NOW,
                false,
            )),
        ),
    ] {
        assert_eq!(
            resp::decode(&reply, &Limits::default())
                .ok()
                .and_then(|r| r.error().map(str::to_owned))
                .map(|e| e.starts_with("NOSCRIPT")),
            Some(true),
            "{name}"
        );
    }
    c.assert_every_key_has_a_ttl();
}

#[test]
fn concurrent_reservations_never_overshoot() {
    let redis = Redis::start().unwrap();
    let addr = redis.addr();
    const THREADS: usize = 8;
    const TENANT_LIMIT: u64 = 5_000;
    const CONSUMER_LIMIT: u64 = 800;
    let tenant = key("bud", "month:acme:1");
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let tenant = tenant.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let consumer = key("bud", &format!("day:c{t}:1"));
                // (reserved, refunded, refused)
                let mut totals = (0i64, 0i64, 0u32);
                for i in 0..150u64 {
                    let amount = 1 + (i * 7 + t as u64 * 13) % 50;
                    let reservation = key("res", &format!("t{t}-{i}"));
                    let levels = [
                        level(&tenant, amount, TENANT_LIMIT),
                        level(&consumer, amount, CONSUMER_LIMIT),
                    ];
                    match c.reserve(&reservation, &levels) {
                        Reserve::Reserved { remaining } => {
                            assert!(remaining.iter().all(|r| *r >= 0), "{remaining:?}");
                            totals.0 += amount as i64;
                            // every third request used half of what it reserved
                            if i % 3 == 0 {
                                let used = amount / 2;
                                let settle = [actual(&tenant, used), actual(&consumer, used)];
                                let Reconcile::Done { refunds } =
                                    c.reconcile(&reservation, &settle)
                                else {
                                    panic!("reconcile");
                                };
                                assert_eq!(refunds, vec![(amount - used) as i64; 2]);
                                totals.1 += (amount - used) as i64;
                            }
                        }
                        Reserve::Refused { remaining, .. } => {
                            assert!(remaining < amount as i64);
                            totals.2 += 1;
                        }
                        Reserve::Replayed { .. } => panic!("fresh ids never replay"),
                    }
                }
                let spent = c.spent(&consumer);
                assert!(spent <= CONSUMER_LIMIT as i64, "consumer {t} spent {spent}");
                assert_eq!(spent, totals.0 - totals.1, "consumer {t}");
                totals
            })
        })
        .collect();
    let totals: Vec<(i64, i64, u32)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let mut c = Client::connect(addr);
    let spent = c.spent(&tenant);
    let net: i64 = totals.iter().map(|(r, f, _)| r - f).sum();
    assert!(spent <= TENANT_LIMIT as i64, "tenant spent {spent}");
    assert_eq!(spent, net, "Σ granted − Σ refunded = spent");
    // demand (8 × ~3800) far exceeds the limits: the limits were reached, not dodged
    assert!(totals.iter().map(|t| t.2).sum::<u32>() > 0);
    assert!(spent > TENANT_LIMIT as i64 - 50, "{spent}");
    c.assert_every_key_has_a_ttl();
}

#[test]
fn concurrent_leases_never_overshoot() {
    let redis = Redis::start().unwrap();
    let addr = redis.addr();
    const CAPACITY: u64 = 10_000;
    let bucket = key("rl", "tpm:shared");
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let bucket = bucket.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                let mut total = 0;
                loop {
                    // a fixed clock: no refill, so the bucket drains exactly once
                    let lease = c.lease(&bucket, lease_args(CAPACITY, 3_600_000, (1, 37 + t), NOW));
                    if lease.granted == 0 {
                        assert!(lease.wait_ms > 0);
                        return total;
                    }
                    assert_eq!(lease.wait_ms, 0);
                    total += lease.granted;
                }
            })
        })
        .collect();
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(total, CAPACITY);
    let mut c = Client::connect(addr);
    assert_eq!(hget(&mut c, &bucket, "tokens"), "0");
    c.assert_every_key_has_a_ttl();
}

/// A `redis-server` in cluster mode owning every slot: Redis enforces the Cluster rules
/// (all keys of one call in one slot; scripts reach only their slot).
struct ClusterNode {
    child: Child,
    addr: SocketAddr,
    _dir: TempDir,
}

impl ClusterNode {
    /// A node on fresh ports; a start that fails (a port taken between [`free_port`] and
    /// redis-server binding it: the server may accept on one port, then exit because the other
    /// is taken) is retried on new ports.
    fn start() -> ClusterNode {
        let mut failures = Vec::new();
        for _ in 0..5 {
            match ClusterNode::try_start() {
                Ok(node) => return node,
                Err(err) => failures.push(err),
            }
        }
        panic!("redis-server (cluster) did not start: {failures:?}");
    }

    fn try_start() -> Result<ClusterNode, String> {
        let dir = TempDir::new("redis-cluster").map_err(|e| e.to_string())?;
        let (port, bus) = (free_port()?, free_port()?);
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                &bus.to_string(),
            ])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--cluster-config-file")
            .arg(dir.path().join("nodes.conf"))
            .arg("--dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut node = ClusterNode {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = node.child.try_wait() {
                return Err(format!("redis-server exited: {status}"));
            }
            if TcpStream::connect(node.addr).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                return Err("redis-server (cluster) did not listen".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // fallible (a reset is retried by `start`), one connection per command
        let cmd = |args: &[&str]| redis_query(node.addr, args);
        let reply = cmd(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"])?;
        if reply != Reply::Simple("OK".into()) {
            return Err(format!("CLUSTER ADDSLOTSRANGE: {reply:?}"));
        }
        loop {
            let info = cmd(&["CLUSTER", "INFO"])?;
            let text = String::from_utf8_lossy(info.bytes().unwrap_or_default()).into_owned();
            if text.contains("cluster_state:ok") {
                return Ok(node);
            }
            if Instant::now() > deadline {
                return Err("cluster state never became ok".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn on_a_cluster_node_every_call_stays_in_one_slot() {
    let node = ClusterNode::start();
    let mut c = Client::connect(node.addr);
    let (res, a, b, marker, bucket) = (
        key("res", "req-1"),
        key("bud", "month:acme:2025-01"),
        key("bud", "day:frank:20250101"),
        key("done", "req-2"),
        key("rl", "tpm:frank"),
    );
    // one slot: the slot of the tag
    let slot = c.int(&["CLUSTER", "KEYSLOT", "t:acme"]);
    for k in [&res, &a, &b, &marker, &bucket] {
        assert_eq!(c.int(&["CLUSTER", "KEYSLOT", k]), slot, "{k}");
    }
    assert_eq!(
        c.lease(&bucket, lease_args(100, 1000, (1, 10), 0)),
        granted(10, 90, 0)
    );
    assert_eq!(c.give_back(&bucket, 100, 1000, 10), 100);
    assert_eq!(
        c.reserve(&res, &[level(&a, 10, 100), level(&b, 10, 20)]),
        Reserve::Reserved {
            remaining: vec![90, 10]
        }
    );
    assert_eq!(
        c.reconcile(&res, &[actual(&a, 4), actual(&b, 4)]),
        Reconcile::Done {
            refunds: vec![6, 6]
        }
    );
    let charged = [ChargeLevel {
        key: &a,
        amount: 3,
        expire_at_ms: EXPIRE_AT,
    }];
    assert!(c.charge(&marker, &charged));
    assert_eq!((c.spent(&a), c.spent(&b)), (7, 4));
    // the negative control: keys of two tags are refused by the cluster, nothing runs
    let elsewhere = "llm:{t:other}:bud:month:other:2025-01".to_string();
    let reply = c.raw(&scripts::reserve_command(
        &res,
        TTL,
        &[level(&a, 1, 100), level(&elsewhere, 1, 100)],
        NOW,
        true,
    ));
    assert!(matches!(
        scripts::decode_reserve(&reply, 2),
        Err(ScriptError::Redis(text)) if text.starts_with("CROSSSLOT")
    ));
    assert_eq!(c.spent(&a), 7);
    c.assert_every_key_has_a_ttl();
}

/// `CANCEL` settles a `RESERVE` whose reply never came (a timeout): whether that `RESERVE`
/// ran before the cancel, runs after it (a slow Redis executes what it was sent), or never
/// runs, the levels end where they started, and the tombstone makes a late `RESERVE`, a
/// `RECONCILE` and another `CANCEL` change nothing.
#[test]
fn cancel_undoes_an_unanswered_reserve_whichever_lands_first() {
    let redis = Redis::start().unwrap();
    let mut c = Client::connect(redis.addr());
    let (a, b) = (key("bud", "a:x:1"), key("bud", "b:x:1"));
    c.reserve(&key("res", "earlier"), &[level(&a, 30, 1000)]);
    let keys = [a.as_str(), b.as_str()];
    let levels = [level(&a, 100, 1000), level(&b, 40, 500)];
    let cancel = |c: &mut Client, reservation: &str, levels: usize| {
        let reply =
            c.run(|src| scripts::cancel_command(reservation, &keys[..levels], TTL, NOW, src));
        scripts::decode_cancel(&reply, levels).unwrap()
    };

    // the RESERVE ran before the cancel: its amounts go back
    let landed = key("res", "landed");
    c.reserve(&landed, &levels);
    assert_eq!((c.spent(&a), c.spent(&b)), (130, 40));
    assert_eq!(
        cancel(&mut c, &landed, 2),
        Reconcile::Done {
            refunds: vec![100, 40]
        }
    );
    assert_eq!((c.spent(&a), c.spent(&b)), (30, 0));
    assert_eq!(hget(&mut c, &landed, "n"), "0");
    // a second cancel, a reconcile, a replayed RESERVE: nothing
    assert_eq!(cancel(&mut c, &landed, 2), Reconcile::Already);
    assert_eq!(
        c.reconcile(&landed, &[actual(&a, 7), actual(&b, 7)]),
        Reconcile::Already
    );
    assert!(matches!(
        c.reserve(&landed, &levels),
        Reserve::Replayed { .. }
    ));
    assert_eq!((c.spent(&a), c.spent(&b)), (30, 0));

    // the RESERVE arrives after the cancel: it finds the tombstone and deducts nothing
    let late = key("res", "late");
    assert_eq!(cancel(&mut c, &late, 2), Reconcile::Already);
    assert!(matches!(
        c.reserve(&late, &levels),
        Reserve::Replayed { .. }
    ));
    assert_eq!((c.spent(&a), c.spent(&b)), (30, 0));

    // never below zero; an expired level is not re-created
    let reset = key("res", "reset");
    c.reserve(&reset, &levels);
    assert_eq!(
        c.cmd(&["SET", &a, "60", "KEEPTTL"]),
        Reply::Simple("OK".into())
    );
    c.cmd(&["DEL", &b]);
    assert_eq!(
        cancel(&mut c, &reset, 2),
        Reconcile::Done {
            refunds: vec![60, 0]
        }
    );
    assert_eq!(c.spent(&a), 0);
    assert!(!c.exists(&b));

    // the tombstone lives the TTL it was given; a cancel naming other levels than the
    // reservation's is refused and changes nothing
    let pttl = c.pttl(&late);
    assert!(pttl > 0 && pttl <= TTL as i64, "{pttl}");
    let other = key("res", "other");
    c.reserve(&other, &[level(&a, 5, 1000), level(&b, 5, 500)]);
    let reply = c.raw(&scripts::cancel_command(&other, &keys[..1], TTL, NOW, true));
    let Err(ScriptError::Redis(text)) = scripts::decode_cancel(&reply, 1) else {
        panic!("{}", String::from_utf8_lossy(&reply));
    };
    assert!(text.contains("bad n"), "{text}");
    assert_eq!((c.spent(&a), c.spent(&b)), (5, 5));
    assert_eq!(hget(&mut c, &other, "n"), "2");
    c.assert_every_key_has_a_ttl();
}
