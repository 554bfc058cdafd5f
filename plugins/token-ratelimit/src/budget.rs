//! Who a request belongs to, where its buckets and budgets live, and what it is charged.
//!
//! Redis keys share one hash tag per request (`{t:<tenant>}`, else `{c:<consumer>}`, else
//! `{_}`), so one Lua call over every budget level and the reservation touches one Redis
//! Cluster slot. A soft bucket's key is tagged with itself: each lease touches one bucket.
//! Identities are percent-encoded in keys (`:`, `{`, `}`, `%`, `|`, spaces, control and
//! non-ASCII bytes), and long ones are replaced by a digest, so a client-chosen value (an IP,
//! a user id) can neither break the key grammar nor grow keys without bound.

use crate::config::{Budget, BudgetUnit, Dimension, Limit, Period};
use llm_gateway_shared::price::{NanoPerMillion, Price};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Longest identity kept verbatim in a key.
const MAX_IDENTITY: usize = 96;

/// The request's identity, as earlier filters and Envoy give it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// `x-llm-key-id`.
    pub key: Option<String>,
    /// `x-llm-consumer`.
    pub consumer: Option<String>,
    /// `x-llm-tenant`.
    pub tenant: Option<String>,
    /// `x-llm-model-group`.
    pub model_group: Option<String>,
    /// `source.address` without the port.
    pub ip: Option<String>,
    /// `x-user-id`.
    pub user: Option<String>,
    /// `x-llm-tier` (set by key-auth): picks each limit's and budget's amount; never part of
    /// a key, so a key that changes tier keeps what it spent.
    pub tier: Option<String>,
}

impl Identity {
    /// The request's tier (an empty value counts as absent).
    pub fn tier(&self) -> Option<&str> {
        self.tier.as_deref().filter(|v| !v.is_empty())
    }

    /// The value of one dimension (empty values count as absent).
    pub fn get(&self, dimension: Dimension) -> Option<&str> {
        let value = match dimension {
            Dimension::Key => &self.key,
            Dimension::Consumer => &self.consumer,
            Dimension::Tenant => &self.tenant,
            Dimension::ModelGroup => &self.model_group,
            Dimension::Ip => &self.ip,
            Dimension::User => &self.user,
        };
        value.as_deref().filter(|v| !v.is_empty())
    }

    /// The hash tag of every budget key of this request.
    pub fn tag(&self) -> String {
        let mut out = String::new();
        self.push_tag(&mut out);
        out
    }

    /// Appends [`Identity::tag`] to `out`.
    fn push_tag(&self, out: &mut String) {
        if let Some(t) = self.get(Dimension::Tenant) {
            out.push_str("{t:");
            push_component(out, t);
            out.push('}');
        } else if let Some(c) = self.get(Dimension::Consumer) {
            out.push_str("{c:");
            push_component(out, c);
            out.push('}');
        } else {
            out.push_str("{_}");
        }
    }
}

/// `source.address` (`1.2.3.4:5678`, `[::1]:80`) without the port.
pub fn strip_port(address: &str) -> &str {
    if let Some(rest) = address.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match address.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            host
        }
        _ => address,
    }
}

/// A value made safe for a key.
pub fn component(value: &str) -> String {
    let mut out = String::with_capacity(value.len().min(MAX_IDENTITY));
    push_component(&mut out, value);
    out
}

const HEX_LOWER: &[u8; 16] = b"0123456789abcdef";
const HEX_UPPER: &[u8; 16] = b"0123456789ABCDEF";

/// Appends `byte` as two hex digits from `digits`.
fn push_hex(out: &mut String, byte: u8, digits: &[u8; 16]) {
    for nibble in [byte >> 4, byte & 0x0f] {
        if let Some(d) = digits.get(usize::from(nibble)) {
            out.push(char::from(*d));
        }
    }
}

/// Appends [`component`] of `value` to `out` (no intermediate string).
fn push_component(out: &mut String, value: &str) {
    if value.len() > MAX_IDENTITY {
        let digest = Sha256::digest(value.as_bytes());
        out.push_str("sha256.");
        for byte in digest.iter().take(16) {
            push_hex(out, *byte, HEX_LOWER);
        }
        return;
    }
    let bytes = value.as_bytes();
    if bytes.iter().all(|b| safe_byte(*b)) {
        out.push_str(value);
        return;
    }
    for byte in bytes {
        if safe_byte(*byte) {
            out.push(char::from(*byte));
        } else {
            out.push('%');
            push_hex(out, *byte, HEX_UPPER);
        }
    }
}

fn safe_byte(byte: u8) -> bool {
    byte.is_ascii_graphic() && !matches!(byte, b':' | b'{' | b'}' | b'%' | b'|')
}

/// Appends `value` in decimal, zero-padded to `width` digits (`format!("{value:0width$}")`).
fn push_padded(out: &mut String, value: u64, width: usize) {
    let mut digits = [0u8; 20];
    let mut n = value;
    let mut len = 0;
    loop {
        if let Some(slot) = digits.get_mut(len) {
            *slot = b'0' + (n % 10) as u8;
        }
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for _ in len..width {
        out.push('0');
    }
    for d in digits.iter().take(len).rev() {
        out.push(char::from(*d));
    }
}

/// The owner digests of bucket ids already seen (the first 8 bytes of the id's SHA-256): the
/// same identity comes back on every request, so its digest is computed once. Bounded: a
/// full cache starts over.
#[derive(Debug, Default)]
pub struct Owners {
    known: crate::fxhash::FxHashMap<String, u64>,
}

/// Bucket ids an [`Owners`] keeps at most.
const MAX_OWNERS: usize = 4096;

impl Owners {
    /// The owner digest of bucket id `id` (never 0).
    fn of(&mut self, id: &str) -> u64 {
        if let Some(owner) = self.known.get(id) {
            return *owner;
        }
        let owner = owner_digest(id);
        if self.known.len() >= MAX_OWNERS {
            self.known.clear();
        }
        self.known.insert(id.to_string(), owner);
        owner
    }
}

fn owner_digest(id: &str) -> u64 {
    let digest = Sha256::digest(id.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(digest.get(..8).unwrap_or(&[1; 8]));
    u64::from_le_bytes(first).max(1)
}

/// Shared-data slots per limit for buckets of client-chosen identities (`ip`, `user`).
/// Envoy's shared data cannot forget a key, so one key per client address would grow with
/// every address ever seen; slots bound it (about 100 bytes each) at the price of two
/// active identities sharing one slot now and then ([`crate::bucket::Claim::Shared`]).
pub const CLIENT_SLOTS: u64 = 65_536;

/// Where one soft bucket lives: `None` if the request lacks one of the limit's dimensions
/// (the limit does not apply to it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketKeys {
    /// Shared-data key of the instance's bucket.
    pub local: String,
    /// Redis key of the central bucket (always the identity's own).
    pub redis: String,
    /// The identity's digest (never 0): the owner of the local bucket.
    pub owner: u64,
}

/// The keys of `limit`'s bucket for `identity`.
pub fn bucket_keys(limit: &Limit, identity: &Identity) -> Option<BucketKeys> {
    bucket_keys_with(limit, identity, &mut Owners::default())
}

/// [`bucket_keys`], the owner digest taken from (and kept in) `owners`.
pub fn bucket_keys_with(
    limit: &Limit,
    identity: &Identity,
    owners: &mut Owners,
) -> Option<BucketKeys> {
    // `trl:b:` + id, where id = `<limit>:<component>:<component>…`
    const LOCAL_PREFIX: &str = "trl:b:";
    let mut local = String::with_capacity(64);
    local.push_str(LOCAL_PREFIX);
    local.push_str(&limit.name);
    for dimension in &limit.by {
        local.push(':');
        push_component(&mut local, identity.get(*dimension)?);
    }
    if limit.by.is_empty() {
        local.push(':');
    }
    let id = local.get(LOCAL_PREFIX.len()..).unwrap_or_default();
    let owner = owners.of(id);
    let mut redis = String::with_capacity(id.len() + 8);
    redis.push_str("llm:{rl:");
    redis.push_str(id);
    redis.push('}');
    let client_chosen = limit
        .by
        .iter()
        .any(|d| matches!(d, Dimension::Ip | Dimension::User));
    if client_chosen {
        local.truncate(LOCAL_PREFIX.len());
        local.push_str(&limit.name);
        local.push_str(":#");
        push_padded(&mut local, owner % CLIENT_SLOTS, 1);
    }
    Some(BucketKeys {
        local,
        redis,
        owner,
    })
}

/// The limit name of a bucket's shared-data key (for the sync worker).
pub fn limit_of_local_key(local: &str) -> Option<&str> {
    local.strip_prefix("trl:b:")?.split(':').next()
}

/// A period's id (in keys) and its end, Unix milliseconds.
pub fn period(period: Period, now_ms: u64) -> (String, u64) {
    let mut id = String::with_capacity(13);
    let end = push_period(&mut id, period, now_ms);
    (id, end)
}

/// Appends [`period`]'s id to `out`; the period's end.
fn push_period(out: &mut String, period: Period, now_ms: u64) -> u64 {
    const DAY: u64 = 86_400_000;
    let days = now_ms / DAY;
    let (y, m, d) = civil_from_days(days);
    let date = |out: &mut String, with_day: bool| {
        push_padded(out, y, 4);
        out.push('-');
        push_padded(out, m, 2);
        if with_day {
            out.push('-');
            push_padded(out, d, 2);
        }
    };
    match period {
        Period::Hour => {
            let hour = (now_ms % DAY) / 3_600_000;
            date(out, true);
            out.push('T');
            push_padded(out, hour, 2);
            (now_ms / 3_600_000 + 1) * 3_600_000
        }
        Period::Day => {
            date(out, true);
            (days + 1) * DAY
        }
        Period::Month => {
            let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            date(out, false);
            days_from_civil(ny, nm, 1) * DAY
        }
        Period::Total => {
            out.push_str("total");
            0
        }
    }
}

/// Howard Hinnant's `civil_from_days` for days since 1970-01-01 (non-negative).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: u64, m: u64, d: u64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A budget level a request is checked against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Level {
    /// Index of the budget in the configuration.
    pub budget: usize,
    /// Redis key (the local store uses it too).
    pub key: String,
    /// The budget's amount for the request's tier.
    pub limit: u64,
    /// When the key may go: the period's end plus a day (0: never, `total` budgets keep
    /// theirs for a year after the last write).
    pub expire_at_ms: u64,
}

/// Grace after a period's end before its key expires (late reconciles still land).
pub const EXPIRY_GRACE_MS: u64 = 86_400_000;
/// TTL of a `total` budget's key after its last write.
pub const TOTAL_TTL_MS: u64 = 366 * 86_400_000;

/// The levels of every budget that applies to `identity` (a budget whose `by` the request
/// lacks, or scoped to model groups the request's is not in, does not apply), each with the
/// amount of the request's tier. The key holds no tier: a key that changes tier keeps its
/// spend, checked against its new tier's amount.
pub fn levels(budgets: &[Budget], identity: &Identity, now_ms: u64) -> Vec<Level> {
    let mut tag = String::new();
    let group = identity.get(Dimension::ModelGroup);
    let mut levels = Vec::new();
    for (index, budget) in budgets.iter().enumerate() {
        if !budget.applies_to(group) {
            continue;
        }
        let Some(who) = identity.get(budget.by) else {
            continue;
        };
        if tag.is_empty() {
            identity.push_tag(&mut tag);
        }
        // `llm:<tag>:bud:<budget>:<by>:<who>:<period>`
        let mut key = String::with_capacity(64);
        key.push_str("llm:");
        key.push_str(&tag);
        key.push_str(":bud:");
        key.push_str(&budget.name);
        key.push(':');
        key.push_str(budget.by.as_str());
        key.push(':');
        push_component(&mut key, who);
        key.push(':');
        let end = push_period(&mut key, budget.period, now_ms);
        levels.push(Level {
            budget: index,
            key,
            limit: budget.amount_for(identity.tier()),
            expire_at_ms: if end == 0 {
                now_ms.saturating_add(TOTAL_TTL_MS)
            } else {
                end.saturating_add(EXPIRY_GRACE_MS)
            },
        });
    }
    levels
}

/// `llm:<tag>:<kind>:<component of request_id>`.
fn request_key(identity: &Identity, kind: &str, request_id: &str) -> String {
    let mut key = String::with_capacity(32 + request_id.len());
    key.push_str("llm:");
    identity.push_tag(&mut key);
    key.push(':');
    key.push_str(kind);
    key.push(':');
    push_component(&mut key, request_id);
    key
}

/// The reservation's key.
pub fn reservation_key(identity: &Identity, request_id: &str) -> String {
    request_key(identity, "res", request_id)
}

/// The key that makes a journaled charge land once.
pub fn marker_key(identity: &Identity, request_id: &str) -> String {
    request_key(identity, "done", request_id)
}

/// A money budget whose request has no usable price.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unpriced;

/// Nano-units of `tokens` at `per_million`, rounded up (a budget is never charged less than
/// the tokens cost); at most `u64::MAX`.
pub fn nano(tokens: u64, per_million: NanoPerMillion) -> u64 {
    // a product past u128::MAX is past u64::MAX once divided: saturating changes nothing
    let n = u128::from(tokens).saturating_mul(per_million);
    u64::try_from(n.div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// What `budget` reserves for a request of `prompt` + `output_cap` tokens, priced (money
/// budgets) at `ceiling`, the dearest price among the deployments the request may reach. A
/// request of no tokens (not an LLM API call: `GET /v1/models`, a path no provider serves)
/// reserves nothing and needs no price.
pub fn reserve_amount(
    budget: &Budget,
    prompt: u64,
    output_cap: u64,
    ceiling: Option<&Price>,
) -> Result<u64, Unpriced> {
    if prompt == 0 && output_cap == 0 {
        return Ok(0);
    }
    match &budget.unit {
        BudgetUnit::Tokens => Ok(prompt.saturating_add(output_cap)),
        BudgetUnit::Money { currency } => {
            let price = ceiling
                .filter(|p| &p.currency == currency)
                .ok_or(Unpriced)?;
            Ok(nano(prompt, price.input).saturating_add(nano(output_cap, price.output)))
        }
    }
}

/// What a finished request really used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actual {
    /// Prompt + completion tokens.
    pub tokens: u64,
    /// Its cost (nano-units) and currency, if usage-accounting priced it.
    pub cost: Option<(u64, String)>,
    /// Prompt and completion tokens, to price it ourselves when usage-accounting did not.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
}

/// What `budget` is charged for `actual` (`None`: no usage known; charge the reservation).
pub fn actual_amount(
    budget: &Budget,
    actual: Option<&Actual>,
    price: Option<&Price>,
) -> Option<u64> {
    let actual = actual?;
    match &budget.unit {
        BudgetUnit::Tokens => Some(actual.tokens),
        BudgetUnit::Money { currency } => match &actual.cost {
            Some((nano_cost, c)) if c == currency => Some(*nano_cost),
            _ => {
                let price = price.filter(|p| &p.currency == currency)?;
                Some(
                    nano(actual.prompt_tokens, price.input)
                        .saturating_add(nano(actual.completion_tokens, price.output)),
                )
            }
        },
    }
}

/// One budget operation kept while Redis is unreachable, replayed (idempotently) when it is
/// back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum JournalEntry {
    /// A reservation made in Redis whose reconcile could not be sent: `RECONCILE` later (a
    /// no-op if it has landed meanwhile).
    Reconcile {
        /// The reservation key.
        reservation: String,
        /// Level keys, in reservation order.
        keys: Vec<String>,
        /// Actual amounts per level.
        actual: Vec<u64>,
    },
    /// A request served without Redis (`on_redis_failure: allow`): `CHARGE` its actual use
    /// once (the marker key makes a replay land once).
    Charge {
        /// The marker key.
        marker: String,
        /// Level keys.
        keys: Vec<String>,
        /// Amounts per level.
        amounts: Vec<u64>,
        /// Expiry per level.
        expire_at_ms: Vec<u64>,
    },
    /// A `RESERVE` whose call failed once sent (it may have run, or may run later): `CANCEL`
    /// gives back whatever it reserved and leaves a tombstone that makes a late one a no-op.
    Cancel {
        /// The reservation key.
        reservation: String,
        /// Level keys, in the order the `RESERVE` named them.
        keys: Vec<String>,
        /// How long the tombstone lives (the reservation TTL).
        ttl_ms: u64,
    },
}

/// The journal as kept in shared data: bounded, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journal {
    /// Entries not yet replayed, each with its sequence number.
    pub entries: Vec<(u64, JournalEntry)>,
    /// Next sequence number.
    pub next: u64,
}

impl Journal {
    /// Reads a shared-data value (empty or foreign: an empty journal).
    pub fn decode(bytes: &[u8]) -> Journal {
        serde_json::from_slice(bytes).unwrap_or_default()
    }

    /// The shared-data value.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Appends; false if `capacity` entries are already waiting.
    pub fn push(&mut self, entry: JournalEntry, capacity: usize) -> bool {
        if self.entries.len() >= capacity {
            return false;
        }
        self.entries.push((self.next, entry));
        self.next = self.next.wrapping_add(1);
        true
    }

    /// Removes the entry with sequence number `seq` (replayed).
    pub fn remove(&mut self, seq: u64) {
        self.entries.retain(|(s, _)| *s != seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{OnRedisFailure, Unit};
    use llm_gateway_shared::price::MicroPrice;

    fn budget(unit: BudgetUnit) -> Budget {
        Budget {
            name: "b".into(),
            by: Dimension::Tenant,
            period: Period::Day,
            unit,
            amount: 1000,
            tiers: Default::default(),
            model_groups: vec![],
            on_redis_failure: OnRedisFailure::Reject,
            warn_at: vec![],
        }
    }

    fn who() -> Identity {
        Identity {
            key: Some("k1".into()),
            consumer: Some("team a".into()),
            tenant: Some("acme:{x}".into()),
            model_group: Some("fast".into()),
            ip: Some("10.0.0.1".into()),
            user: None,
            tier: None,
        }
    }

    #[test]
    fn periods_in_utc() {
        // 2026-11-30T23:59:59.999Z
        let t = 1_796_083_199_999;
        assert_eq!(
            period(Period::Day, t),
            ("2026-11-30".into(), 1_796_083_200_000)
        );
        assert_eq!(
            period(Period::Month, t),
            ("2026-11".into(), 1_796_083_200_000)
        );
        assert_eq!(period(Period::Hour, t).0, "2026-11-30T23");
        assert_eq!(period(Period::Month, t + 1).0, "2026-12");
        // December rolls into the next year
        let (id, end) = period(Period::Month, t + 1);
        assert_eq!(id, "2026-12");
        assert_eq!(period(Period::Day, end).0, "2027-01-01");
        // leap day
        assert_eq!(period(Period::Day, 1_709_208_000_000).0, "2024-02-29");
        assert_eq!(period(Period::Total, t), ("total".into(), 0));
    }

    #[test]
    fn keys_share_one_tag_and_escape_identities() {
        let id = who();
        let budgets = vec![
            budget(BudgetUnit::Tokens),
            Budget {
                name: "u".into(),
                by: Dimension::User,
                ..budget(BudgetUnit::Tokens)
            },
        ];
        let levels = levels(&budgets, &id, 1_796_083_199_999);
        assert_eq!(levels.len(), 1, "no user: the user budget does not apply");
        assert_eq!(
            levels[0].key,
            "llm:{t:acme%3A%7Bx%7D}:bud:b:tenant:acme%3A%7Bx%7D:2026-11-30"
        );
        assert!(reservation_key(&id, "r:1").starts_with("llm:{t:acme%3A%7Bx%7D}:res:r%3A1"));
        let no_tenant = Identity {
            tenant: None,
            ..who()
        };
        assert_eq!(no_tenant.tag(), "{c:team%20a}");
        assert_eq!(Identity::default().tag(), "{_}");
        let long = component(&"x".repeat(500));
        assert!(long.starts_with("sha256.") && long.len() == 39);
    }

    #[test]
    fn a_level_takes_its_tiers_amount_under_a_key_that_holds_no_tier() {
        let tiered = Budget {
            tiers: [("free".to_string(), 50), ("pro".to_string(), 5000)].into(),
            ..budget(BudgetUnit::Tokens)
        };
        let at = |tier: Option<&str>| {
            let id = Identity {
                tier: tier.map(str::to_string),
                ..who()
            };
            levels(std::slice::from_ref(&tiered), &id, 1_796_083_199_999)
        };
        let (free, pro, none, unknown, empty) = (
            at(Some("free")),
            at(Some("pro")),
            at(None),
            at(Some("gold")),
            at(Some("")),
        );
        assert_eq!(free[0].limit, 50);
        assert_eq!(pro[0].limit, 5000);
        assert_eq!(none[0].limit, 1000, "no tier: the budget's own amount");
        assert_eq!(unknown[0].limit, 1000, "an unknown tier: the budget's own");
        assert_eq!(empty[0].limit, 1000);
        // one counter whatever the tier: changing tier keeps the spend
        assert_eq!(free[0].key, pro[0].key);
        assert_eq!(free[0].key, none[0].key);
    }

    #[test]
    fn a_budget_scoped_to_model_groups_has_no_level_for_other_groups() {
        let smart_only = Budget {
            model_groups: vec!["smart".into()],
            ..budget(BudgetUnit::Tokens)
        };
        let in_group = |group: Option<&str>| {
            let id = Identity {
                model_group: group.map(str::to_string),
                ..who()
            };
            levels(std::slice::from_ref(&smart_only), &id, 0).len()
        };
        assert_eq!(in_group(Some("smart")), 1);
        assert_eq!(in_group(Some("fast")), 0);
        assert_eq!(
            in_group(None),
            0,
            "no group: a scoped budget does not apply"
        );
    }

    #[test]
    fn bucket_keys_need_every_dimension() {
        let limit = Limit {
            name: "l".into(),
            by: vec![Dimension::Tenant, Dimension::Ip],
            unit: Unit::Tokens,
            amount: 1,
            tiers: Default::default(),
            window_ms: 1,
            model_groups: vec![],
        };
        let keys = bucket_keys(&limit, &who()).unwrap();
        // an address is client-chosen: a bounded slot locally, its own bucket in Redis
        assert!(keys.local.starts_with("trl:b:l:#"), "{}", keys.local);
        assert_eq!(keys.redis, "llm:{rl:l:acme%3A%7Bx%7D:10.0.0.1}");
        assert_eq!(limit_of_local_key(&keys.local), Some("l"));
        assert_eq!(bucket_keys(&limit, &Identity { ip: None, ..who() }), None);
        let other = bucket_keys(
            &limit,
            &Identity {
                ip: Some("10.0.0.2".into()),
                ..who()
            },
        )
        .unwrap();
        assert_ne!(other.owner, keys.owner);
        let tenant_only = Limit {
            by: vec![Dimension::Tenant],
            ..limit
        };
        let keys = bucket_keys(&tenant_only, &who()).unwrap();
        assert_eq!(keys.local, "trl:b:l:acme%3A%7Bx%7D");
    }

    /// The keys as they were written with `format!` before the keys were built in place.
    mod reference {
        use super::super::*;
        use sha2::{Digest, Sha256};

        pub fn component(value: &str) -> String {
            if value.len() > MAX_IDENTITY {
                let digest = Sha256::digest(value.as_bytes());
                let hex: Vec<String> = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
                return format!("sha256.{}", hex.concat());
            }
            value
                .bytes()
                .map(|b| {
                    if b.is_ascii_graphic() && !matches!(b, b':' | b'{' | b'}' | b'%' | b'|') {
                        char::from(b).to_string()
                    } else {
                        format!("%{b:02X}")
                    }
                })
                .collect()
        }

        pub fn bucket_keys(limit: &Limit, identity: &Identity) -> Option<BucketKeys> {
            let mut parts = Vec::new();
            for dimension in &limit.by {
                parts.push(component(identity.get(*dimension)?));
            }
            let id = format!("{}:{}", limit.name, parts.join(":"));
            let digest = Sha256::digest(id.as_bytes());
            let owner = u64::from_le_bytes(digest[..8].try_into().unwrap()).max(1);
            let client = limit
                .by
                .iter()
                .any(|d| matches!(d, Dimension::Ip | Dimension::User));
            Some(BucketKeys {
                local: if client {
                    format!("trl:b:{}:#{}", limit.name, owner % CLIENT_SLOTS)
                } else {
                    format!("trl:b:{id}")
                },
                redis: format!("llm:{{rl:{id}}}"),
                owner,
            })
        }

        pub fn tag(identity: &Identity) -> String {
            if let Some(t) = identity.get(Dimension::Tenant) {
                format!("{{t:{}}}", component(t))
            } else if let Some(c) = identity.get(Dimension::Consumer) {
                format!("{{c:{}}}", component(c))
            } else {
                "{_}".to_string()
            }
        }
    }

    #[test]
    fn keys_built_in_place_match_their_format_definitions() {
        let values = [
            "k1".to_string(),
            "acme:{x}|%".to_string(),
            "team a\u{7}é".to_string(),
            "x".repeat(MAX_IDENTITY),
            "y".repeat(MAX_IDENTITY + 1),
        ];
        let dims = [
            vec![],
            vec![Dimension::Key],
            vec![Dimension::Tenant, Dimension::Key],
            vec![Dimension::User],
            vec![Dimension::Tenant, Dimension::Ip],
        ];
        let mut owners = Owners::default();
        for value in &values {
            assert_eq!(component(value), reference::component(value));
            for other in [None, Some(value.clone())] {
                let identity = Identity {
                    key: Some(value.clone()),
                    consumer: other.clone(),
                    tenant: other.clone(),
                    ip: Some(value.clone()),
                    user: Some(value.clone()),
                    ..Identity::default()
                };
                assert_eq!(identity.tag(), reference::tag(&identity));
                for request_id in ["r-1", value.as_str()] {
                    assert_eq!(
                        reservation_key(&identity, request_id),
                        format!(
                            "llm:{}:res:{}",
                            reference::tag(&identity),
                            reference::component(request_id)
                        )
                    );
                    assert_eq!(
                        marker_key(&identity, request_id),
                        format!(
                            "llm:{}:done:{}",
                            reference::tag(&identity),
                            reference::component(request_id)
                        )
                    );
                }
                for by in &dims {
                    let limit = Limit {
                        name: "lim".into(),
                        by: by.clone(),
                        unit: Unit::Tokens,
                        amount: 1,
                        tiers: Default::default(),
                        window_ms: 1,
                        model_groups: vec![],
                    };
                    let expected = reference::bucket_keys(&limit, &identity);
                    assert_eq!(bucket_keys(&limit, &identity), expected);
                    // twice through the cache: computed, then remembered
                    assert_eq!(bucket_keys_with(&limit, &identity, &mut owners), expected);
                    assert_eq!(bucket_keys_with(&limit, &identity, &mut owners), expected);
                }
            }
        }
    }

    #[test]
    fn period_ids_match_their_format_definitions() {
        // across years (4- and 5-digit), months, days and hours
        for t in [
            0,
            1_796_083_199_999,
            1_796_083_200_000,
            4_102_444_800_000,
            253_402_300_800_000,
        ] {
            let days = t / 86_400_000;
            let (y, m, d) = civil_from_days(days);
            let hour = (t % 86_400_000) / 3_600_000;
            assert_eq!(
                period(Period::Hour, t).0,
                format!("{y:04}-{m:02}-{d:02}T{hour:02}")
            );
            assert_eq!(period(Period::Day, t).0, format!("{y:04}-{m:02}-{d:02}"));
            assert_eq!(period(Period::Month, t).0, format!("{y:04}-{m:02}"));
        }
        assert_eq!(period(Period::Total, 7), ("total".to_string(), 0));
        let mut out = String::new();
        push_padded(&mut out, 7, 4);
        push_padded(&mut out, 123_456, 2);
        push_padded(&mut out, 0, 1);
        assert_eq!(out, "00071234560");
    }

    #[test]
    fn ports_are_stripped() {
        assert_eq!(strip_port("1.2.3.4:5678"), "1.2.3.4");
        assert_eq!(strip_port("[::1]:80"), "::1");
        assert_eq!(strip_port("::1"), "::1");
        assert_eq!(strip_port("host"), "host");
    }

    #[test]
    fn money_is_priced_at_the_ceiling_and_rounded_up() {
        let money = budget(BudgetUnit::Money {
            currency: "USD".into(),
        });
        let price = Price::from(MicroPrice {
            currency: "USD".into(),
            input: 150_000,
            output: 600_000,
            cached_input: None,
        });
        // 1000 prompt tokens at $0.15/M = 150_000 nano; 100 output at $0.60/M = 60_000 nano
        assert_eq!(reserve_amount(&money, 1000, 100, Some(&price)), Ok(210_000));
        assert_eq!(nano(1, 1), 1, "rounded up");
        assert_eq!(nano(1, 1_000_000), 1);
        assert_eq!(nano(3, 1_000_001), 4);
        // the router's dearest price (u64::MAX micro-units) saturates
        assert_eq!(nano(u64::MAX, u128::from(u64::MAX) * 1_000), u64::MAX);
        assert_eq!(nano(2, u128::from(u64::MAX) * 1_000), u64::MAX / 500 + 1);
        assert_eq!(reserve_amount(&money, 1, 1, None), Err(Unpriced));
        assert_eq!(
            reserve_amount(&money, 0, 0, None),
            Ok(0),
            "nothing to price"
        );
        assert_eq!(reserve_amount(&money, 0, 1, None), Err(Unpriced));
        let eur = Price {
            currency: "EUR".into(),
            ..price.clone()
        };
        assert_eq!(reserve_amount(&money, 1, 1, Some(&eur)), Err(Unpriced));
        let tokens = budget(BudgetUnit::Tokens);
        assert_eq!(reserve_amount(&tokens, 10, 5, None), Ok(15));
        let actual = Actual {
            tokens: 50,
            cost: Some((777, "USD".into())),
            prompt_tokens: 40,
            completion_tokens: 10,
        };
        assert_eq!(
            actual_amount(&money, Some(&actual), Some(&price)),
            Some(777)
        );
        assert_eq!(actual_amount(&tokens, Some(&actual), None), Some(50));
        let unpriced = Actual {
            cost: None,
            ..actual
        };
        assert_eq!(
            actual_amount(&money, Some(&unpriced), Some(&price)),
            Some(6_000 + 6_000)
        );
        assert_eq!(actual_amount(&money, None, Some(&price)), None);
    }

    #[test]
    fn journal_is_bounded_and_survives_encoding() {
        let mut j = Journal::default();
        let entry = JournalEntry::Charge {
            marker: "m".into(),
            keys: vec!["k".into()],
            amounts: vec![1],
            expire_at_ms: vec![2],
        };
        assert!(j.push(entry.clone(), 2));
        assert!(j.push(entry.clone(), 2));
        assert!(!j.push(entry, 2));
        j.remove(0);
        assert_eq!(j.entries.len(), 1);
        let cancel = JournalEntry::Cancel {
            reservation: "r".into(),
            keys: vec!["k".into()],
            ttl_ms: 3_600_000,
        };
        assert!(j.push(cancel, 2));
        assert_eq!(Journal::decode(&j.encode()), j);
        assert_eq!(Journal::decode(b"garbage"), Journal::default());
    }
}
