//! The Redis side of token-ratelimit: six Lua scripts (and a read-only `PEEK`), the commands
//! that run them and the decoding of their replies.
//!
//! Every script is atomic in Redis, touches only the keys it is given in `KEYS` (all sharing
//! one `{tag}`, so one Cluster slot), sets a TTL on every key it writes in the same call, and
//! speaks integers only: arguments are decimal integers in `0..=MAX_SAFE` (Lua numbers are
//! doubles), replies are arrays of integers. The last argument of every script is the clock
//! `now_ms`: `0` means "Redis `TIME`", any other value is used as is.
//!
//! | script | KEYS | ARGV | reply |
//! |---|---|---|---|
//! | [`LEASE`] | bucket | capacity, window_ms, want_min, want_max, now_ms | `[granted, remaining, wait_ms]` |
//! | [`GIVE_BACK`] | bucket | capacity, window_ms, amount, now_ms | `[remaining]` |
//! | [`RESERVE`] | reservation, level_1..n | ttl_ms, n, (amount_i, limit_i, expire_at_ms_i)×n, now_ms | `[1, rem_1..n]` reserved, `[2, rem_1..n]` replay, `[0, i, rem_i]` refused |
//! | [`RECONCILE`] | reservation, level_1..n | n, actual_1..n, now_ms | `[1, refund_1..n]`, `[0]` already done |
//! | [`CHARGE`] | marker, level_1..n | ttl_ms, n, amount_1..n, expire_at_ms_1..n, now_ms | `[1]` charged, `[0]` already |
//! | [`CANCEL`] | reservation, level_1..n | ttl_ms, n, now_ms | `[1, refund_1..n]` given back, `[0]` nothing to give back |
//! | [`PEEK`] | level_1..n | now_ms | `[spent_1..n]` |
//!
//! A bad argument is an error reply `ERR token-ratelimit: bad <what>` and changes nothing.
//! Commands are sent as `EVALSHA` ([`Script::sha1`]); on [`ScriptError::NoScript`] the caller
//! sends the same command again with `with_source` (`EVAL`), which also caches the script.
//! Pure: no host calls; the decoders take the raw reply (Higress's buffer type 9) and never
//! panic, whatever the bytes.

use llm_gateway_shared::resp::{self, Limits, Reply, RespError};
use std::borrow::Cow;
use std::sync::OnceLock;

/// The largest integer the scripts accept or produce (2^53 − 1: exact in a Lua double).
pub const MAX_SAFE: u64 = (1 << 53) - 1;
/// The most budget levels one RESERVE / RECONCILE / CHARGE / CANCEL / PEEK call takes.
pub const MAX_LEVELS: usize = 32;
/// The longest bucket window and reservation / marker TTL the scripts accept (2^44 ms, about
/// 557 years: a bound that keeps every expiry far from overflowing).
pub const MAX_DURATION_MS: u64 = 1 << 44;

/// Helpers every script starts with: argument checks, integer formatting (never `tostring`,
/// whose `%.14g` loses digits), and the clock.
macro_rules! prelude {
    () => {
        r#"
local MAX = 9007199254740991
local MAX_DURATION = 17592186044416
local MAX_LEVELS = 32
local function int(v, lo, hi)
  local x = tonumber(v)
  if x == nil or x ~= math.floor(x) or x < lo or x > hi then return nil end
  return x
end
local function bad(what)
  return redis.error_reply('ERR token-ratelimit: bad ' .. what)
end
local function str(x)
  return string.format('%d', x)
end
local function clock(v)
  local now = int(v, 0, MAX)
  if now == 0 then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now
end
local function distinct_keys()
  local seen = {}
  for i = 1, #KEYS do
    if seen[KEYS[i]] then return false end
    seen[KEYS[i]] = true
  end
  return true
end
"#
    };
}

/// The token bucket both bucket scripts share: state `{tokens, ts}` (tokens may be
/// fractional), starts full, refills `capacity / window` per ms up to `capacity`. A clock that
/// goes back refills nothing and keeps `ts` (no double refill when clocks disagree).
macro_rules! bucket {
    () => {
        r#"
local function refill(key, capacity, window, now)
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens = tonumber(state[1])
  local ts = tonumber(state[2])
  if tokens == nil or ts == nil or tokens ~= tokens or ts ~= ts or ts < 0 or ts > MAX then
    return capacity, now
  end
  if tokens > capacity then tokens = capacity end
  if tokens < 0 then tokens = 0 end
  if ts < now then
    local elapsed = now - ts
    if elapsed >= window then
      tokens = capacity
    else
      tokens = math.min(capacity, tokens + elapsed * capacity / window)
    end
    ts = now
  end
  return tokens, ts
end
local function store(key, tokens, ts, window)
  redis.call('HSET', key, 'tokens', string.format('%.17g', tokens), 'ts', str(ts))
  redis.call('PEXPIRE', key, str(2 * window))
end
local function bucket_args()
  local capacity = int(ARGV[1], 1, MAX)
  if not capacity then return nil, 'capacity' end
  local window = int(ARGV[2], 1, MAX_DURATION)
  if not window then return nil, 'window_ms' end
  return capacity, window
end
"#
    };
}

/// `LEASE` — KEYS[1] bucket; ARGV capacity, window_ms, want_min, want_max, now_ms.
/// Refills, then grants `min(floor(tokens), want_max)` if at least `want_min` tokens are
/// there, else nothing. `PEXPIRE` 2 × window (an expired bucket is a full one anyway).
/// Reply `[granted, floor(remaining), wait_ms]`; `wait_ms` is 0 when granted, else the ms
/// (ceil, ≥ 1) until `want_min` tokens will be there. `want_min` must be in `1..=capacity`.
pub const LEASE: &str = concat!(
    prelude!(),
    bucket!(),
    r#"
if #KEYS ~= 1 or #ARGV ~= 5 then return bad('arity') end
local capacity, window = bucket_args()
if not capacity then return bad(window) end
local want_min = int(ARGV[3], 1, capacity)
if not want_min then return bad('want_min') end
local want_max = int(ARGV[4], want_min, MAX)
if not want_max then return bad('want_max') end
local now = clock(ARGV[5])
if not now then return bad('now_ms') end
local tokens, ts = refill(KEYS[1], capacity, window, now)
local granted, wait = 0, 0
if tokens >= want_min then
  granted = math.min(math.floor(tokens), want_max)
  tokens = tokens - granted
else
  wait = math.ceil((want_min - tokens) * window / capacity)
  if wait < 1 then wait = 1 end
  if wait > window then wait = window end
end
store(KEYS[1], tokens, ts, window)
return {granted, math.floor(tokens), wait}
"#
);

/// `GIVE_BACK` — KEYS[1] bucket; ARGV capacity, window_ms, amount, now_ms. Refills, then
/// `tokens = min(capacity, tokens + amount)`; `PEXPIRE` 2 × window. Reply `[floor(tokens)]`.
pub const GIVE_BACK: &str = concat!(
    prelude!(),
    bucket!(),
    r#"
if #KEYS ~= 1 or #ARGV ~= 4 then return bad('arity') end
local capacity, window = bucket_args()
if not capacity then return bad(window) end
local amount = int(ARGV[3], 0, MAX)
if not amount then return bad('amount') end
local now = clock(ARGV[4])
if not now then return bad('now_ms') end
local tokens, ts = refill(KEYS[1], capacity, window, now)
tokens = math.min(capacity, tokens + amount)
store(KEYS[1], tokens, ts, window)
return {math.floor(tokens)}
"#
);

/// `RESERVE` — KEYS[1] reservation, KEYS[2..n+1] budget levels (strings: spent so far);
/// ARGV ttl_ms, n, then per level amount, limit, expire_at_ms (absolute), then now_ms (checked,
/// unused). All or nothing:
/// - the reservation exists → `[2, rem_1..rem_n]` (a replay; nothing deducted);
/// - some level has `spent + amount > limit` → `[0, i, limit_i − spent_i]` (i 1-based, the
///   first such level; nothing deducted anywhere);
/// - else `INCRBY` + `PEXPIREAT` every level, `HSET` the reservation `n, a1..an` with
///   `PEXPIRE ttl_ms`, reply `[1, rem_1..rem_n]` with `rem_i = limit_i − spent_after_i`.
pub const RESERVE: &str = concat!(
    prelude!(),
    r#"
local n = int(ARGV[2], 1, MAX_LEVELS)
if not n then return bad('n') end
if #KEYS ~= n + 1 or #ARGV ~= 3 * n + 3 then return bad('arity') end
if not distinct_keys() then return bad('keys (not distinct)') end
local ttl = int(ARGV[1], 1, MAX_DURATION)
if not ttl then return bad('ttl_ms') end
if not int(ARGV[3 * n + 3], 0, MAX) then return bad('now_ms') end
local amount, limit, expire_at = {}, {}, {}
for i = 1, n do
  amount[i] = int(ARGV[3 * i], 0, MAX)
  if not amount[i] then return bad('amount') end
  limit[i] = int(ARGV[3 * i + 1], 0, MAX)
  if not limit[i] then return bad('limit') end
  expire_at[i] = int(ARGV[3 * i + 2], 1, MAX)
  if not expire_at[i] then return bad('expire_at_ms') end
end
local spent = {}
for i = 1, n do
  spent[i] = tonumber(redis.call('GET', KEYS[i + 1])) or 0
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  local out = {2}
  for i = 1, n do out[i + 1] = limit[i] - spent[i] end
  return out
end
for i = 1, n do
  if spent[i] + amount[i] > limit[i] then
    return {0, i, limit[i] - spent[i]}
  end
end
local out = {1}
local fields = {'n', str(n)}
for i = 1, n do
  local after = redis.call('INCRBY', KEYS[i + 1], str(amount[i]))
  redis.call('PEXPIREAT', KEYS[i + 1], str(expire_at[i]))
  out[i + 1] = limit[i] - after
  fields[#fields + 1] = 'a' .. i
  fields[#fields + 1] = str(amount[i])
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('PEXPIRE', KEYS[1], str(ttl))
return out
"#
);

/// `RECONCILE` — KEYS[1] reservation, KEYS[2..n+1] the levels it reserved on; ARGV n,
/// actual_1..n, now_ms (checked, unused).
/// - the reservation is gone (reconciled already, or expired) or is a [`CANCEL`] tombstone
///   → `[0]`, nothing changes;
/// - else each level still there gets `INCRBY actual_i − a_i`, clamped so it never goes below
///   0; a level whose key expired (its period ended) is left alone (re-creating it would leave
///   a key without TTL). The reservation is deleted. Reply `[1, refund_1..n]`: what was given
///   back to each level (`a_i − actual_i` unless clamped or expired; negative = over-use
///   charged).
pub const RECONCILE: &str = concat!(
    prelude!(),
    r#"
local n = int(ARGV[1], 1, MAX_LEVELS)
if not n then return bad('n') end
if #KEYS ~= n + 1 or #ARGV ~= n + 2 then return bad('arity') end
if not distinct_keys() then return bad('keys (not distinct)') end
local actual = {}
for i = 1, n do
  actual[i] = int(ARGV[i + 1], 0, MAX)
  if not actual[i] then return bad('actual') end
end
if not int(ARGV[n + 2], 0, MAX) then return bad('now_ms') end
local fields = {'n'}
for i = 1, n do fields[i + 1] = 'a' .. i end
local stored = redis.call('HMGET', KEYS[1], unpack(fields))
if not stored[1] or tonumber(stored[1]) == 0 then return {0} end
if tonumber(stored[1]) ~= n then return bad('n (not the reserved levels)') end
local reserved = {}
for i = 1, n do
  reserved[i] = int(stored[i + 1], 0, MAX)
  if not reserved[i] then return bad('reservation') end
end
local out = {1}
for i = 1, n do
  local refund = 0
  local current = redis.call('GET', KEYS[i + 1])
  if current then
    local spent = tonumber(current) or 0
    local delta = actual[i] - reserved[i]
    if spent + delta < 0 then delta = -spent end
    if delta ~= 0 then redis.call('INCRBY', KEYS[i + 1], str(delta)) end
    refund = -delta
  end
  out[i + 1] = refund
end
redis.call('DEL', KEYS[1])
return out
"#
);

/// `CANCEL` — KEYS[1] reservation, KEYS[2..n+1] the levels its `RESERVE` named; ARGV ttl_ms,
/// n, now_ms (checked, unused). Settles a `RESERVE` whose reply never came: the call failed
/// after it was sent (a timeout), so it may have run, or may still run later (a slow Redis
/// executes what it was sent).
/// - the reservation is there (it ran) → each level still there gets its amount back, never
///   below 0 (what a `RECONCILE` to 0 does) → `[1, refund_1..n]`;
/// - else → `[0]`;
/// - in both cases the reservation key becomes a tombstone (hash `n` = 0, `PEXPIRE ttl_ms`):
///   a `RESERVE` that arrives later finds it and deducts nothing (a replay), a `RECONCILE` or
///   another `CANCEL` of it changes nothing.
pub const CANCEL: &str = concat!(
    prelude!(),
    r#"
local n = int(ARGV[2], 1, MAX_LEVELS)
if not n then return bad('n') end
if #KEYS ~= n + 1 or #ARGV ~= 3 then return bad('arity') end
if not distinct_keys() then return bad('keys (not distinct)') end
local ttl = int(ARGV[1], 1, MAX_DURATION)
if not ttl then return bad('ttl_ms') end
if not int(ARGV[3], 0, MAX) then return bad('now_ms') end
local fields = {'n'}
for i = 1, n do fields[i + 1] = 'a' .. i end
local stored = redis.call('HMGET', KEYS[1], unpack(fields))
local out = {0}
if stored[1] and tonumber(stored[1]) ~= 0 then
  if tonumber(stored[1]) ~= n then return bad('n (not the reserved levels)') end
  local reserved = {}
  for i = 1, n do
    reserved[i] = int(stored[i + 1], 0, MAX)
    if not reserved[i] then return bad('reservation') end
  end
  out = {1}
  for i = 1, n do
    local refund = 0
    local current = redis.call('GET', KEYS[i + 1])
    if current then
      local spent = tonumber(current) or 0
      local delta = -reserved[i]
      if spent + delta < 0 then delta = -spent end
      if delta ~= 0 then redis.call('INCRBY', KEYS[i + 1], str(delta)) end
      refund = -delta
    end
    out[i + 1] = refund
  end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'n', '0')
redis.call('PEXPIRE', KEYS[1], str(ttl))
return out
"#
);

/// `CHARGE` — KEYS[1] replay marker, KEYS[2..n+1] levels; ARGV ttl_ms, n, amount_1..n,
/// expire_at_ms_1..n, now_ms (checked, unused). `SET marker 1 NX PX ttl_ms`: already set →
/// `[0]`; else `INCRBY` + `PEXPIREAT` every level → `[1]`. No limit check: it records what
/// was already served.
pub const CHARGE: &str = concat!(
    prelude!(),
    r#"
local n = int(ARGV[2], 1, MAX_LEVELS)
if not n then return bad('n') end
if #KEYS ~= n + 1 or #ARGV ~= 2 * n + 3 then return bad('arity') end
if not distinct_keys() then return bad('keys (not distinct)') end
local ttl = int(ARGV[1], 1, MAX_DURATION)
if not ttl then return bad('ttl_ms') end
if not int(ARGV[2 * n + 3], 0, MAX) then return bad('now_ms') end
local amount, expire_at = {}, {}
for i = 1, n do
  amount[i] = int(ARGV[2 + i], 0, MAX)
  if not amount[i] then return bad('amount') end
  expire_at[i] = int(ARGV[2 + n + i], 1, MAX)
  if not expire_at[i] then return bad('expire_at_ms') end
end
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', str(ttl)) then return {0} end
for i = 1, n do
  redis.call('INCRBY', KEYS[i + 1], str(amount[i]))
  redis.call('PEXPIREAT', KEYS[i + 1], str(expire_at[i]))
end
return {1}
"#
);

/// `PEEK` — KEYS level_1..n; ARGV now_ms (checked, unused). Read-only: reply
/// `[spent_1..n]` (0 for a missing level).
pub const PEEK: &str = concat!(
    prelude!(),
    r#"
if #KEYS < 1 or #KEYS > MAX_LEVELS or #ARGV ~= 1 then return bad('arity') end
if not int(ARGV[1], 0, MAX) then return bad('now_ms') end
local out = {}
for i = 1, #KEYS do
  out[i] = tonumber(redis.call('GET', KEYS[i])) or 0
end
return out
"#
);

/// A script and its digest (what `EVALSHA` names it by: lowercase hex SHA-1 of the source).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    pub name: &'static str,
    pub source: &'static str,
    pub sha1: String,
}

impl Script {
    fn new(name: &'static str, source: &'static str) -> Script {
        Script {
            name,
            source,
            sha1: sha1_smol::Sha1::from(source).digest().to_string(),
        }
    }
}

macro_rules! script {
    ($fn:ident, $name:literal, $source:ident) => {
        #[doc = concat!("The `", $name, "` script (digest computed once).")]
        pub fn $fn() -> &'static Script {
            static SCRIPT: OnceLock<Script> = OnceLock::new();
            SCRIPT.get_or_init(|| Script::new($name, $source))
        }
    };
}

script!(lease, "LEASE", LEASE);
script!(give_back, "GIVE_BACK", GIVE_BACK);
script!(reserve, "RESERVE", RESERVE);
script!(reconcile, "RECONCILE", RECONCILE);
script!(charge, "CHARGE", CHARGE);
script!(cancel, "CANCEL", CANCEL);
script!(peek, "PEEK", PEEK);

/// Every script (to preload with `SCRIPT LOAD`, or to list).
pub fn all() -> [&'static Script; 7] {
    [
        lease(),
        give_back(),
        reserve(),
        reconcile(),
        charge(),
        cancel(),
        peek(),
    ]
}

/// The command that runs `script`: `EVALSHA <sha1> <numkeys> keys.. args..`, or
/// `EVAL <source> ...` when `with_source` (first call, or after `NOSCRIPT`). RESP bytes ready
/// for `proxy_redis_call`.
pub fn command(script: &Script, keys: &[&str], args: &[i64], with_source: bool) -> Vec<u8> {
    resp::encode_command(&command_args(script, keys, args, with_source))
}

/// The arguments of [`command`] (command name first), for a transport that frames them its
/// own way (webdis over HTTP: `shared::webdis`).
pub fn command_args<'a>(
    script: &'a Script,
    keys: &[&'a str],
    args: &[i64],
    with_source: bool,
) -> Vec<Cow<'a, [u8]>> {
    let mut parts: Vec<Cow<'_, [u8]>> = Vec::with_capacity(3 + keys.len() + args.len());
    if with_source {
        parts.push(Cow::Borrowed(b"EVAL"));
        parts.push(Cow::Borrowed(script.source.as_bytes()));
    } else {
        parts.push(Cow::Borrowed(b"EVALSHA"));
        parts.push(Cow::Borrowed(script.sha1.as_bytes()));
    }
    parts.push(Cow::Owned(keys.len().to_string().into_bytes()));
    parts.extend(keys.iter().map(|k| Cow::Borrowed(k.as_bytes())));
    parts.extend(args.iter().map(|a| Cow::Owned(a.to_string().into_bytes())));
    parts
}

/// A `u64` on the wire: above `i64::MAX` it saturates (the script refuses anything above
/// [`MAX_SAFE`] with an error reply, so an out-of-range value is never silently wrapped).
fn wire(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The arguments of a `LEASE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseArgs {
    pub capacity: u64,
    pub window_ms: u64,
    /// At least 1 and at most `capacity`.
    pub want_min: u64,
    /// At least `want_min`.
    pub want_max: u64,
    /// 0 = Redis `TIME`.
    pub now_ms: u64,
}

/// `LEASE` on one bucket key.
pub fn lease_command(bucket_key: &str, args: &LeaseArgs, with_source: bool) -> Vec<u8> {
    command(
        lease(),
        &[bucket_key],
        &[
            wire(args.capacity),
            wire(args.window_ms),
            wire(args.want_min),
            wire(args.want_max),
            wire(args.now_ms),
        ],
        with_source,
    )
}

/// `GIVE_BACK` of `amount` tokens to one bucket key.
pub fn give_back_command(
    bucket_key: &str,
    capacity: u64,
    window_ms: u64,
    amount: u64,
    now_ms: u64,
    with_source: bool,
) -> Vec<u8> {
    command(
        give_back(),
        &[bucket_key],
        &[wire(capacity), wire(window_ms), wire(amount), wire(now_ms)],
        with_source,
    )
}

/// One budget level of a `RESERVE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReserveLevel<'a> {
    pub key: &'a str,
    pub amount: u64,
    pub limit: u64,
    /// When the level's key expires (absolute ms, `PEXPIREAT`).
    pub expire_at_ms: u64,
}

/// `RESERVE` on `levels` (1..=[`MAX_LEVELS`], distinct keys, one `{tag}` with the
/// reservation key).
pub fn reserve_command(
    reservation_key: &str,
    ttl_ms: u64,
    levels: &[ReserveLevel<'_>],
    now_ms: u64,
    with_source: bool,
) -> Vec<u8> {
    let mut keys = Vec::with_capacity(levels.len() + 1);
    keys.push(reservation_key);
    keys.extend(levels.iter().map(|l| l.key));
    let mut args = Vec::with_capacity(3 * levels.len() + 3);
    args.push(wire(ttl_ms));
    args.push(wire(levels.len() as u64));
    for level in levels {
        args.extend([
            wire(level.amount),
            wire(level.limit),
            wire(level.expire_at_ms),
        ]);
    }
    args.push(wire(now_ms));
    command(reserve(), &keys, &args, with_source)
}

/// One level of a `RECONCILE`: the same key as in the `RESERVE`, in the same order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconcileLevel<'a> {
    pub key: &'a str,
    pub actual: u64,
}

/// `RECONCILE` of a reservation with the actual amounts.
pub fn reconcile_command(
    reservation_key: &str,
    levels: &[ReconcileLevel<'_>],
    now_ms: u64,
    with_source: bool,
) -> Vec<u8> {
    let mut keys = Vec::with_capacity(levels.len() + 1);
    keys.push(reservation_key);
    keys.extend(levels.iter().map(|l| l.key));
    let mut args = Vec::with_capacity(levels.len() + 2);
    args.push(wire(levels.len() as u64));
    args.extend(levels.iter().map(|l| wire(l.actual)));
    args.push(wire(now_ms));
    command(reconcile(), &keys, &args, with_source)
}

/// One level of a `CHARGE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChargeLevel<'a> {
    pub key: &'a str,
    pub amount: u64,
    pub expire_at_ms: u64,
}

/// `CHARGE` once per `marker_key` (the marker lives `ttl_ms`).
pub fn charge_command(
    marker_key: &str,
    ttl_ms: u64,
    levels: &[ChargeLevel<'_>],
    now_ms: u64,
    with_source: bool,
) -> Vec<u8> {
    let mut keys = Vec::with_capacity(levels.len() + 1);
    keys.push(marker_key);
    keys.extend(levels.iter().map(|l| l.key));
    let mut args = Vec::with_capacity(2 * levels.len() + 3);
    args.push(wire(ttl_ms));
    args.push(wire(levels.len() as u64));
    args.extend(levels.iter().map(|l| wire(l.amount)));
    args.extend(levels.iter().map(|l| wire(l.expire_at_ms)));
    args.push(wire(now_ms));
    command(charge(), &keys, &args, with_source)
}

/// `CANCEL` of a reservation whose `RESERVE` went unanswered, on the levels that `RESERVE`
/// named (same keys, same order); the tombstone lives `ttl_ms`.
pub fn cancel_command(
    reservation_key: &str,
    level_keys: &[&str],
    ttl_ms: u64,
    now_ms: u64,
    with_source: bool,
) -> Vec<u8> {
    let mut keys = Vec::with_capacity(level_keys.len() + 1);
    keys.push(reservation_key);
    keys.extend_from_slice(level_keys);
    let args = [wire(ttl_ms), wire(level_keys.len() as u64), wire(now_ms)];
    command(cancel(), &keys, &args, with_source)
}

/// `PEEK` at level keys.
pub fn peek_command(level_keys: &[&str], now_ms: u64, with_source: bool) -> Vec<u8> {
    command(peek(), level_keys, &[wire(now_ms)], with_source)
}

/// A `LEASE` reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub granted: u64,
    /// Whole tokens left in the central bucket.
    pub remaining: u64,
    /// 0 when granted; else the ms until `want_min` tokens will be there.
    pub wait_ms: u64,
}

/// A `RESERVE` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserve {
    /// Deducted on every level; what is left of each (negative if over-used before).
    Reserved { remaining: Vec<i64> },
    /// The reservation existed already: nothing deducted; what is left of each level now.
    Replayed { remaining: Vec<i64> },
    /// Nothing deducted: `level` (0-based) has only `remaining` left (may be negative).
    Refused { level: usize, remaining: i64 },
}

/// A `RECONCILE` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reconcile {
    /// Settled: what went back to each level (negative = over-use charged).
    Done { refunds: Vec<i64> },
    /// No reservation (reconciled before, or expired): nothing changed.
    Already,
}

/// Why a script reply is not usable. Never carries reply data other than Redis's own
/// error text (bounded; the scripts' errors name an argument, never a key or a value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptError {
    /// `NOSCRIPT`: Redis has not cached the script; send it again with `EVAL`.
    NoScript,
    /// Any other error reply (e.g. `ERR token-ratelimit: bad want_min`, `WRONGTYPE ...`,
    /// `BUSY ...`, `OOM ...`), at most [`ERROR_TEXT_MAX`] printable ASCII characters.
    Redis(String),
    /// Not a RESP reply.
    Resp(RespError),
    /// A RESP reply of another shape than the script's; names the script.
    Unexpected(&'static str),
}

/// The longest error text a [`ScriptError::Redis`] keeps.
pub const ERROR_TEXT_MAX: usize = 160;

impl std::fmt::Display for ScriptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScriptError::NoScript => write!(f, "redis: NOSCRIPT"),
            ScriptError::Redis(message) => write!(f, "redis error: {message}"),
            ScriptError::Resp(e) => write!(f, "redis reply: {e}"),
            ScriptError::Unexpected(script) => write!(f, "unexpected {script} reply"),
        }
    }
}

impl std::error::Error for ScriptError {}

/// Replies are small: at most 1 + [`MAX_LEVELS`] integers, or one error line.
const REPLY_LIMITS: Limits = Limits {
    max_depth: 2,
    max_elements: MAX_LEVELS + 1,
    max_bulk: 1024,
};

fn error_reply(message: &str) -> ScriptError {
    let code = message.split(' ').next().unwrap_or_default();
    if code == "NOSCRIPT" {
        return ScriptError::NoScript;
    }
    ScriptError::Redis(
        message
            .chars()
            .map(|c| if c.is_ascii_graphic() { c } else { ' ' })
            .take(ERROR_TEXT_MAX)
            .collect(),
    )
}

/// The integers of an array-of-integers reply.
fn integers(reply: &[u8], script: &'static str) -> Result<Vec<i64>, ScriptError> {
    match resp::decode(reply, &REPLY_LIMITS).map_err(ScriptError::Resp)? {
        Reply::Error(message) => Err(error_reply(&message)),
        Reply::Array(Some(items)) => items
            .iter()
            .map(|item| match item {
                Reply::Integer(i) => Ok(*i),
                _ => Err(ScriptError::Unexpected(script)),
            })
            .collect(),
        _ => Err(ScriptError::Unexpected(script)),
    }
}

fn unsigned(value: i64, script: &'static str) -> Result<u64, ScriptError> {
    u64::try_from(value).map_err(|_| ScriptError::Unexpected(script))
}

/// Decodes a `LEASE` reply.
pub fn decode_lease(reply: &[u8]) -> Result<Lease, ScriptError> {
    const S: &str = "LEASE";
    match integers(reply, S)?.as_slice() {
        [granted, remaining, wait_ms] => Ok(Lease {
            granted: unsigned(*granted, S)?,
            remaining: unsigned(*remaining, S)?,
            wait_ms: unsigned(*wait_ms, S)?,
        }),
        _ => Err(ScriptError::Unexpected(S)),
    }
}

/// Decodes a `GIVE_BACK` reply: the whole tokens now in the bucket.
pub fn decode_give_back(reply: &[u8]) -> Result<u64, ScriptError> {
    const S: &str = "GIVE_BACK";
    match integers(reply, S)?.as_slice() {
        [tokens] => unsigned(*tokens, S),
        _ => Err(ScriptError::Unexpected(S)),
    }
}

/// Decodes a `RESERVE` reply of a call on `levels` levels.
pub fn decode_reserve(reply: &[u8], levels: usize) -> Result<Reserve, ScriptError> {
    const S: &str = "RESERVE";
    match integers(reply, S)?.split_first() {
        Some((1, rest)) if rest.len() == levels => Ok(Reserve::Reserved {
            remaining: rest.to_vec(),
        }),
        Some((2, rest)) if rest.len() == levels => Ok(Reserve::Replayed {
            remaining: rest.to_vec(),
        }),
        Some((0, [level, remaining])) => match usize::try_from(*level) {
            Ok(level) if (1..=levels).contains(&level) => Ok(Reserve::Refused {
                level: level - 1,
                remaining: *remaining,
            }),
            _ => Err(ScriptError::Unexpected(S)),
        },
        _ => Err(ScriptError::Unexpected(S)),
    }
}

/// Decodes a `RECONCILE` reply of a call on `levels` levels.
pub fn decode_reconcile(reply: &[u8], levels: usize) -> Result<Reconcile, ScriptError> {
    const S: &str = "RECONCILE";
    match integers(reply, S)?.split_first() {
        Some((0, [])) => Ok(Reconcile::Already),
        Some((1, rest)) if rest.len() == levels => Ok(Reconcile::Done {
            refunds: rest.to_vec(),
        }),
        _ => Err(ScriptError::Unexpected(S)),
    }
}

/// Decodes a `CANCEL` reply of a call on `levels` levels: [`Reconcile::Done`] with what went
/// back when the reservation had landed, [`Reconcile::Already`] when there was nothing there.
pub fn decode_cancel(reply: &[u8], levels: usize) -> Result<Reconcile, ScriptError> {
    const S: &str = "CANCEL";
    match integers(reply, S)?.split_first() {
        Some((0, [])) => Ok(Reconcile::Already),
        Some((1, rest)) if rest.len() == levels => Ok(Reconcile::Done {
            refunds: rest.to_vec(),
        }),
        _ => Err(ScriptError::Unexpected(S)),
    }
}

/// Decodes a `CHARGE` reply: `true` when charged now, `false` when charged before.
pub fn decode_charge(reply: &[u8]) -> Result<bool, ScriptError> {
    const S: &str = "CHARGE";
    match integers(reply, S)?.as_slice() {
        [1] => Ok(true),
        [0] => Ok(false),
        _ => Err(ScriptError::Unexpected(S)),
    }
}

/// Decodes a `PEEK` reply of a call on `levels` keys: the spent value of each.
pub fn decode_peek(reply: &[u8], levels: usize) -> Result<Vec<i64>, ScriptError> {
    let values = integers(reply, "PEEK")?;
    if values.len() != levels {
        return Err(ScriptError::Unexpected("PEEK"));
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args_of(command: &[u8]) -> Vec<String> {
        match resp::decode(command, &Limits::default()).unwrap() {
            Reply::Array(Some(items)) => items
                .into_iter()
                .map(|i| String::from_utf8(i.bytes().unwrap().to_vec()).unwrap())
                .collect(),
            other => panic!("not a command: {other:?}"),
        }
    }

    #[test]
    fn digests_are_the_sha1_of_the_sources() {
        // the library against the FIPS 180 example, then each script
        assert_eq!(
            sha1_smol::Sha1::from("abc").digest().to_string(),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        let scripts = all();
        for script in scripts {
            assert_eq!(script.sha1.len(), 40);
            assert!(script
                .sha1
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)));
            assert_eq!(
                script.sha1,
                sha1_smol::Sha1::from(script.source).digest().to_string()
            );
        }
        let mut digests: Vec<&str> = scripts.iter().map(|s| s.sha1.as_str()).collect();
        digests.sort_unstable();
        digests.dedup();
        assert_eq!(digests.len(), scripts.len());
        assert_eq!(
            scripts.map(|s| s.name),
            [
                "LEASE",
                "GIVE_BACK",
                "RESERVE",
                "RECONCILE",
                "CHARGE",
                "CANCEL",
                "PEEK"
            ]
        );
        assert!(std::ptr::eq(lease(), lease()));
    }

    #[test]
    fn sources_format_integers_exactly() {
        // tostring / `..` on numbers print %.14g (digits lost above 10^14); every number
        // that goes back to Redis goes through str() (%d) or %.17g
        for script in all() {
            assert!(!script.source.contains("tostring"), "{}", script.name);
            assert!(script.source.contains("string.format('%d', x)"));
        }
    }

    #[test]
    fn evalsha_and_eval_commands() {
        let script = charge();
        let sha = command(script, &["{t:a}k1", "{t:a}k2"], &[5, -1, 0], false);
        let expected = format!(
            "*8\r\n$7\r\nEVALSHA\r\n$40\r\n{}\r\n$1\r\n2\r\n$7\r\n{{t:a}}k1\r\n$7\r\n{{t:a}}k2\r\n\
             $1\r\n5\r\n$2\r\n-1\r\n$1\r\n0\r\n",
            script.sha1
        );
        assert_eq!(String::from_utf8(sha).unwrap(), expected);
        let eval = command(script, &[], &[i64::MAX], true);
        assert_eq!(args_of(&eval), ["EVAL", CHARGE, "0", "9223372036854775807"]);
    }

    #[test]
    fn typed_builders_lay_out_keys_and_arguments() {
        let lease_args = LeaseArgs {
            capacity: 1000,
            window_ms: 60_000,
            want_min: 1,
            want_max: 200,
            now_ms: 0,
        };
        assert_eq!(
            args_of(&lease_command("llm:{_}:rl:l:i", &lease_args, false)),
            [
                "EVALSHA",
                &lease().sha1,
                "1",
                "llm:{_}:rl:l:i",
                "1000",
                "60000",
                "1",
                "200",
                "0"
            ]
        );
        assert_eq!(
            args_of(&give_back_command("b", 10, 20, 3, 7, true)),
            ["EVAL", GIVE_BACK, "1", "b", "10", "20", "3", "7"]
        );
        let levels = [
            ReserveLevel {
                key: "l1",
                amount: 5,
                limit: 100,
                expire_at_ms: 1_000,
            },
            ReserveLevel {
                key: "l2",
                amount: 6,
                limit: 200,
                expire_at_ms: 2_000,
            },
        ];
        assert_eq!(
            args_of(&reserve_command("r", 30_000, &levels, 42, false)),
            [
                "EVALSHA",
                &reserve().sha1,
                "3",
                "r",
                "l1",
                "l2",
                "30000",
                "2",
                "5",
                "100",
                "1000",
                "6",
                "200",
                "2000",
                "42"
            ]
        );
        let actual = [
            ReconcileLevel {
                key: "l1",
                actual: 4,
            },
            ReconcileLevel {
                key: "l2",
                actual: 9,
            },
        ];
        assert_eq!(
            args_of(&reconcile_command("r", &actual, 0, false)),
            [
                "EVALSHA",
                &reconcile().sha1,
                "3",
                "r",
                "l1",
                "l2",
                "2",
                "4",
                "9",
                "0"
            ]
        );
        let charged = [
            ChargeLevel {
                key: "l1",
                amount: 4,
                expire_at_ms: 10,
            },
            ChargeLevel {
                key: "l2",
                amount: 5,
                expire_at_ms: 20,
            },
        ];
        assert_eq!(
            args_of(&charge_command("m", 500, &charged, 0, false)),
            [
                "EVALSHA",
                &charge().sha1,
                "3",
                "m",
                "l1",
                "l2",
                "500",
                "2",
                "4",
                "5",
                "10",
                "20",
                "0"
            ]
        );
        assert_eq!(
            args_of(&cancel_command("r", &["l1", "l2"], 3_600_000, 7, false)),
            [
                "EVALSHA",
                &cancel().sha1,
                "3",
                "r",
                "l1",
                "l2",
                "3600000",
                "2",
                "7"
            ]
        );
        assert_eq!(
            args_of(&peek_command(&["a", "b"], 1, false)),
            ["EVALSHA", &peek().sha1, "2", "a", "b", "1"]
        );
    }

    #[test]
    fn out_of_range_values_saturate_instead_of_wrapping() {
        let lease_args = LeaseArgs {
            capacity: u64::MAX,
            window_ms: 1 << 63,
            want_min: MAX_SAFE,
            want_max: MAX_SAFE + 1,
            now_ms: 0,
        };
        let args = args_of(&lease_command("b", &lease_args, false));
        assert_eq!(
            args[4..],
            [
                "9223372036854775807",
                "9223372036854775807",
                "9007199254740991",
                "9007199254740992",
                "0"
            ]
        );
    }

    #[test]
    fn decodes_well_formed_replies() {
        assert_eq!(
            decode_lease(b"*3\r\n:5\r\n:95\r\n:0\r\n"),
            Ok(Lease {
                granted: 5,
                remaining: 95,
                wait_ms: 0
            })
        );
        assert_eq!(decode_give_back(b"*1\r\n:7\r\n"), Ok(7));
        assert_eq!(
            decode_reserve(b"*3\r\n:1\r\n:10\r\n:-3\r\n", 2),
            Ok(Reserve::Reserved {
                remaining: vec![10, -3]
            })
        );
        assert_eq!(
            decode_reserve(b"*2\r\n:2\r\n:0\r\n", 1),
            Ok(Reserve::Replayed { remaining: vec![0] })
        );
        assert_eq!(
            decode_reserve(b"*3\r\n:0\r\n:2\r\n:-4\r\n", 3),
            Ok(Reserve::Refused {
                level: 1,
                remaining: -4
            })
        );
        assert_eq!(
            decode_reconcile(b"*3\r\n:1\r\n:4\r\n:-2\r\n", 2),
            Ok(Reconcile::Done {
                refunds: vec![4, -2]
            })
        );
        assert_eq!(decode_reconcile(b"*1\r\n:0\r\n", 2), Ok(Reconcile::Already));
        assert_eq!(
            decode_cancel(b"*3\r\n:1\r\n:223\r\n:0\r\n", 2),
            Ok(Reconcile::Done {
                refunds: vec![223, 0]
            })
        );
        assert_eq!(decode_cancel(b"*1\r\n:0\r\n", 2), Ok(Reconcile::Already));
        assert_eq!(
            decode_cancel(b"*2\r\n:1\r\n:5\r\n", 2),
            Err(ScriptError::Unexpected("CANCEL"))
        );
        assert_eq!(
            decode_cancel(b"-NOSCRIPT x\r\n", 1),
            Err(ScriptError::NoScript)
        );
        assert_eq!(decode_charge(b"*1\r\n:1\r\n"), Ok(true));
        assert_eq!(decode_charge(b"*1\r\n:0\r\n"), Ok(false));
        assert_eq!(decode_peek(b"*2\r\n:0\r\n:9\r\n", 2), Ok(vec![0, 9]));
    }

    #[test]
    fn every_eval_fits_one_webdis_request() {
        // the worst case a configuration allows: 8 budget levels (config::MAX_BUDGETS) with
        // 80-byte keys, every argument a 16-digit number
        let key = format!("llm:{{t:{}}}:bud:x", "k".repeat(64));
        let n = crate::config::MAX_BUDGETS;
        for (script, keys, args) in [
            (lease(), 1, 5),
            (give_back(), 1, 4),
            (reserve(), 1 + n, 3 + 3 * n),
            (reconcile(), 1 + n, 2 + n),
            (charge(), 1 + n, 3 + 2 * n),
            (cancel(), 1 + n, 3),
            (peek(), n, 1),
        ] {
            let keys: Vec<&str> = vec![key.as_str(); keys];
            let args = vec![MAX_SAFE as i64; args];
            let parts = command_args(script, &keys, &args, true);
            let body = llm_gateway_shared::webdis::request_body(&parts);
            assert!(body.is_ok(), "{}: {:?}", script.name, body.err());
        }
    }

    #[test]
    fn noscript_is_its_own_error() {
        let noscript = b"-NOSCRIPT No matching script. Please use EVAL.\r\n";
        assert_eq!(decode_lease(noscript), Err(ScriptError::NoScript));
        assert_eq!(decode_reserve(noscript, 1), Err(ScriptError::NoScript));
        assert_eq!(decode_reconcile(noscript, 1), Err(ScriptError::NoScript));
        assert_eq!(decode_charge(noscript), Err(ScriptError::NoScript));
        assert_eq!(
            decode_give_back(b"-NOSCRIPT\r\n"),
            Err(ScriptError::NoScript)
        );
        // only the code counts
        assert!(matches!(
            decode_charge(b"-NOSCRIPTS x\r\n"),
            Err(ScriptError::Redis(_))
        ));
        assert!(matches!(
            decode_charge(b"-ERR NOSCRIPT\r\n"),
            Err(ScriptError::Redis(_))
        ));
    }

    #[test]
    fn other_error_replies_keep_a_bounded_printable_text() {
        assert_eq!(
            decode_lease(b"-ERR token-ratelimit: bad want_min\r\n"),
            Err(ScriptError::Redis(
                "ERR token-ratelimit: bad want_min".into()
            ))
        );
        assert_eq!(
            decode_reserve(b"-WRONGTYPE Operation against a key\r\n", 1),
            Err(ScriptError::Redis(
                "WRONGTYPE Operation against a key".into()
            ))
        );
        let long = format!("-ERR {}\x07\r\n", "x".repeat(1000));
        let Err(ScriptError::Redis(text)) = decode_charge(long.as_bytes()) else {
            panic!("not a redis error");
        };
        assert_eq!(text.len(), ERROR_TEXT_MAX);
        let Err(ScriptError::Redis(text)) = decode_charge(b"-ERR a\x1bb\xff\r\n") else {
            panic!("not a redis error");
        };
        assert_eq!(text, "ERR a b ");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for reply in [
            &b""[..],
            b"*3\r\n:1\r\n",
            b"hello",
            b"?\r\n",
            b":1\r\n",
            b"+OK\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"$3\r\nabc\r\n",
            b"*1\r\n:1\r\n:2\r\n",
            b"*1\r\n$1\r\n1\r\n",
            b"*1\r\n*1\r\n:1\r\n",
            b"*1\r\n:99999999999999999999\r\n",
            b"*99999\r\n:1\r\n",
            b"*1\r\n:1\n",
        ] {
            let text = String::from_utf8_lossy(reply);
            assert!(decode_lease(reply).is_err(), "{text:?}");
            assert!(decode_give_back(reply).is_err(), "{text:?}");
            assert!(decode_reserve(reply, 1).is_err(), "{text:?}");
            assert!(decode_reserve(reply, 2).is_err(), "{text:?}");
            assert!(decode_reconcile(reply, 1).is_err(), "{text:?}");
            assert!(decode_charge(reply).is_err(), "{text:?}");
            assert!(decode_peek(reply, 3).is_err(), "{text:?}");
        }
        assert!(matches!(
            decode_lease(b"*3\r\n:1\r\n"),
            Err(ScriptError::Resp(RespError::Incomplete))
        ));
        assert!(matches!(
            decode_lease(b"*3\r\n:1\r\n:2\r\n:3\r\n+"),
            Err(ScriptError::Resp(RespError::TrailingBytes(_)))
        ));
    }

    #[test]
    fn wrong_arity_and_values_out_of_range_are_unexpected() {
        fn unexpected<T>(script: &'static str) -> Result<T, ScriptError> {
            Err(ScriptError::Unexpected(script))
        }
        // lease: three non-negative integers
        assert_eq!(decode_lease(b"*2\r\n:1\r\n:2\r\n"), unexpected("LEASE"));
        assert_eq!(
            decode_lease(b"*4\r\n:1\r\n:2\r\n:3\r\n:4\r\n"),
            unexpected("LEASE")
        );
        assert_eq!(
            decode_lease(b"*3\r\n:-1\r\n:2\r\n:3\r\n"),
            unexpected("LEASE")
        );
        assert_eq!(
            decode_lease(b"*3\r\n:9223372036854775807\r\n:0\r\n:0\r\n"),
            Ok(Lease {
                granted: i64::MAX as u64,
                remaining: 0,
                wait_ms: 0
            })
        );
        assert_eq!(
            decode_lease(b"*3\r\n:1\r\n:-9223372036854775808\r\n:3\r\n"),
            unexpected("LEASE")
        );
        assert_eq!(decode_give_back(b"*1\r\n:-1\r\n"), unexpected("GIVE_BACK"));
        assert_eq!(decode_give_back(b"*0\r\n"), unexpected("GIVE_BACK"));
        // reserve: the number of levels must match the call
        assert_eq!(
            decode_reserve(b"*2\r\n:1\r\n:5\r\n", 2),
            unexpected("RESERVE")
        );
        assert_eq!(
            decode_reserve(b"*4\r\n:2\r\n:5\r\n:5\r\n:5\r\n", 2),
            unexpected("RESERVE")
        );
        assert_eq!(decode_reserve(b"*1\r\n:1\r\n", 1), unexpected("RESERVE"));
        assert_eq!(
            decode_reserve(b"*3\r\n:3\r\n:5\r\n:5\r\n", 2),
            unexpected("RESERVE")
        );
        // refused: a 1-based level within the call
        for level in [0i64, 3, -1, i64::MAX, i64::MIN] {
            let reply = format!("*3\r\n:0\r\n:{level}\r\n:0\r\n");
            assert_eq!(
                decode_reserve(reply.as_bytes(), 2),
                unexpected("RESERVE"),
                "{level}"
            );
        }
        assert_eq!(
            decode_reserve(b"*4\r\n:0\r\n:1\r\n:0\r\n:0\r\n", 2),
            unexpected("RESERVE")
        );
        assert_eq!(
            decode_reserve(b"*3\r\n:0\r\n:2\r\n:-9223372036854775808\r\n", 2),
            Ok(Reserve::Refused {
                level: 1,
                remaining: i64::MIN
            })
        );
        // reconcile
        assert_eq!(
            decode_reconcile(b"*2\r\n:0\r\n:0\r\n", 1),
            unexpected("RECONCILE")
        );
        assert_eq!(
            decode_reconcile(b"*2\r\n:1\r\n:0\r\n", 2),
            unexpected("RECONCILE")
        );
        assert_eq!(
            decode_reconcile(b"*2\r\n:7\r\n:0\r\n", 1),
            unexpected("RECONCILE")
        );
        // charge
        assert_eq!(decode_charge(b"*1\r\n:2\r\n"), unexpected("CHARGE"));
        assert_eq!(decode_charge(b"*2\r\n:1\r\n:1\r\n"), unexpected("CHARGE"));
        assert_eq!(decode_peek(b"*1\r\n:1\r\n", 2), unexpected("PEEK"));
        // more elements than any script returns
        let mut big = format!("*{}\r\n", MAX_LEVELS + 2);
        for _ in 0..MAX_LEVELS + 2 {
            big.push_str(":1\r\n");
        }
        assert_eq!(
            decode_peek(big.as_bytes(), MAX_LEVELS + 2),
            Err(ScriptError::Resp(RespError::TooManyElements))
        );
    }

    #[test]
    fn errors_display_without_reply_data() {
        assert_eq!(ScriptError::NoScript.to_string(), "redis: NOSCRIPT");
        assert_eq!(
            ScriptError::Unexpected("LEASE").to_string(),
            "unexpected LEASE reply"
        );
        let err = decode_lease(b"*3\r\n$6\r\nsecret\r\n:1\r\n:1\r\n").unwrap_err();
        assert!(!err.to_string().contains("secret"));
    }

    #[cfg(not(target_arch = "wasm32"))]
    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        fn integer_array(values: &[i64]) -> Vec<u8> {
            let mut out = format!("*{}\r\n", values.len()).into_bytes();
            for v in values {
                out.extend_from_slice(format!(":{v}\r\n").as_bytes());
            }
            out
        }

        proptest! {
            #[test]
            fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128),
                                           levels in 0usize..40) {
                let _ = decode_lease(&bytes);
                let _ = decode_give_back(&bytes);
                let _ = decode_reserve(&bytes, levels);
                let _ = decode_reconcile(&bytes, levels);
                let _ = decode_charge(&bytes);
                let _ = decode_peek(&bytes, levels);
            }

            #[test]
            fn integer_arrays_decode_or_are_unexpected(
                values in proptest::collection::vec(
                    prop_oneof![Just(0i64), Just(1), Just(2), -3i64..40, any::<i64>()], 0..8),
                levels in 0usize..6) {
                let bytes = integer_array(&values);
                for result in [
                    decode_reserve(&bytes, levels).map(|_| ()),
                    decode_reconcile(&bytes, levels).map(|_| ()),
                    decode_lease(&bytes).map(|_| ()),
                    decode_charge(&bytes).map(|_| ()),
                ] {
                    prop_assert!(matches!(result, Ok(()) | Err(ScriptError::Unexpected(_))));
                }
                // a Reserved / Replayed / Done always has one value per level
                match decode_reserve(&bytes, levels) {
                    Ok(Reserve::Reserved { remaining } | Reserve::Replayed { remaining }) => {
                        prop_assert_eq!(remaining.len(), levels)
                    }
                    Ok(Reserve::Refused { level, .. }) => prop_assert!(level < levels),
                    Err(_) => {}
                }
                if let Ok(Reconcile::Done { refunds }) = decode_reconcile(&bytes, levels) {
                    prop_assert_eq!(refunds.len(), levels);
                }
            }
        }
    }
}
