//! The cache of Redis-held keys in shared data: what each worker read from Redis, so that a
//! key is asked for once per TTL by the whole gateway process (shared data is process-wide in
//! Envoy, across workers) and a disable in Redis reaches every worker within the TTL.
//!
//! The cache is bounded: a digest lives in one of `buckets` shared-data values
//! (`llm_keys/<n>`, `n` from the digest's first four bytes), each holding at most
//! [`BUCKET_WAYS`] slots. Inserting into a full bucket drops its expired slots first, then the
//! oldest one. So a flood of made-up keys takes at most `buckets × BUCKET_WAYS` slots (shared
//! data has no delete: a bucket is rewritten, never removed), and a wrong key is remembered
//! as unknown like a right one is remembered as its entry.
//!
//! A bucket is text, one slot a line: `<digest hex>\t<fetched ms>\t-` for "no such key", or
//! `<digest hex>\t<fetched ms>\t+\t<consumer>\t<tenant>\t<groups>\t<expires_at>\t<disabled>\t
//! <key id>\t<tier>` (names are validated: no tab or newline in them). A line that does not
//! parse is dropped. Pure: the shell reads and writes the bucket, `now` comes in.

use crate::auth::{digest_prefix, Found};
use crate::config::{entry_from_hash, KeyEntry};
use llm_gateway_shared::json::push_hex;
use llm_gateway_shared::resp::{self, Reply};

/// Slots per bucket.
pub const BUCKET_WAYS: usize = 4;

/// The shared-data key prefix of the buckets.
pub const KEY_PREFIX: &str = "llm_keys/";

/// What the cache says about a digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cached {
    /// The key's entry, as Redis had it.
    Entry(KeyEntry),
    /// Redis has no (valid) key with this digest.
    Unknown,
}

/// One cached digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// The key's SHA-256.
    pub digest: [u8; 32],
    /// When it was read from Redis (Unix ms).
    pub fetched_ms: u64,
    /// What was read.
    pub value: Cached,
}

/// How long each kind of slot is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ttl {
    /// A key's entry.
    pub entry_ms: u64,
    /// "No such key".
    pub unknown_ms: u64,
}

impl Slot {
    fn fresh(&self, now_ms: u64, ttl: Ttl) -> bool {
        let ttl = match self.value {
            Cached::Entry(_) => ttl.entry_ms,
            Cached::Unknown => ttl.unknown_ms,
        };
        now_ms >= self.fetched_ms && now_ms - self.fetched_ms < ttl
    }
}

/// Number of buckets for a cache of `entries` slots.
pub fn bucket_count(entries: u32) -> u32 {
    (entries / BUCKET_WAYS as u32).max(1)
}

/// The shared-data key of the bucket that holds `digest`.
pub fn bucket_key(digest: &[u8; 32], buckets: u32) -> String {
    let mut first = [0u8; 4];
    first.copy_from_slice(digest.get(..4).unwrap_or(&[0; 4]));
    let n = u32::from_be_bytes(first) % buckets.max(1);
    format!("{KEY_PREFIX}{n}")
}

/// The fresh slot of `digest` in `bucket`, if any.
pub fn find(bucket: &[u8], digest: &[u8; 32], now_ms: u64, ttl: Ttl) -> Option<Cached> {
    decode(bucket)
        .into_iter()
        .find(|slot| slot.digest == *digest)
        .filter(|slot| slot.fresh(now_ms, ttl))
        .map(|slot| slot.value)
}

/// `bucket` with `slot` in it: replaces the digest's old slot, else takes a free one, else
/// drops expired slots, else the oldest.
pub fn insert(bucket: &[u8], slot: Slot, now_ms: u64, ttl: Ttl) -> Vec<u8> {
    let mut slots = decode(bucket);
    slots.retain(|s| s.digest != slot.digest);
    if slots.len() >= BUCKET_WAYS {
        slots.retain(|s| s.fresh(now_ms, ttl));
    }
    while slots.len() >= BUCKET_WAYS {
        let oldest = slots
            .iter()
            .enumerate()
            .min_by_key(|(_, s)| s.fetched_ms)
            .map_or(0, |(i, _)| i);
        slots.remove(oldest);
    }
    slots.push(slot);
    encode(&slots)
}

/// The slots of a bucket; lines that do not parse are left out.
pub fn decode(bucket: &[u8]) -> Vec<Slot> {
    bucket
        .split(|b| *b == b'\n')
        .filter_map(|line| std::str::from_utf8(line).ok())
        .filter_map(decode_slot)
        .take(BUCKET_WAYS)
        .collect()
}

fn decode_slot(line: &str) -> Option<Slot> {
    let mut fields = line.split('\t');
    let digest = parse_hex32(fields.next()?)?;
    let fetched_ms = fields.next()?.parse().ok()?;
    let value = match fields.next()? {
        "-" => Cached::Unknown,
        "+" => {
            let mut next = || fields.next();
            let consumer = next()?.to_string();
            let tenant = next()?.to_string();
            let groups = next()?.to_string();
            let expires_at = match next()? {
                "" => None,
                at => Some(at.parse().ok()?),
            };
            let disabled = match next()? {
                "1" => true,
                "0" => false,
                _ => return None,
            };
            let key_id = next()?.to_string();
            let tier = match next()? {
                "" => None,
                tier => Some(tier.to_string()),
            };
            if consumer.is_empty() || key_id.is_empty() {
                return None;
            }
            Cached::Entry(KeyEntry {
                consumer,
                tenant,
                groups,
                expires_at,
                disabled,
                key_id,
                tier,
            })
        }
        _ => return None,
    };
    Some(Slot {
        digest,
        fetched_ms,
        value,
    })
}

/// A bucket's bytes.
pub fn encode(slots: &[Slot]) -> Vec<u8> {
    let mut out = String::new();
    for slot in slots {
        push_hex(&mut out, &slot.digest);
        out.push('\t');
        out.push_str(&slot.fetched_ms.to_string());
        match &slot.value {
            Cached::Unknown => out.push_str("\t-"),
            Cached::Entry(e) => {
                let expires = e.expires_at.map(|at| at.to_string()).unwrap_or_default();
                for field in [
                    "+",
                    &e.consumer,
                    &e.tenant,
                    &e.groups,
                    &expires,
                    if e.disabled { "1" } else { "0" },
                    &e.key_id,
                    e.tier.as_deref().unwrap_or_default(),
                ] {
                    out.push('\t');
                    out.push_str(field);
                }
            }
        }
        out.push('\n');
    }
    out.into_bytes()
}

/// What Redis's reply to `HGETALL <prefix><digest hex>` says, and a line to log about it
/// (never the key, never the whole digest). `Err` is a call that failed (no reply). A hash whose
/// fields fail validation is an unknown key (cached as such); a reply that is not a hash
/// (a RESP error, another type) is [`Found::Unavailable`], not cached.
pub fn found_from_reply(digest: &[u8; 32], reply: Result<&[u8], &str>) -> (Found, Option<String>) {
    let id = digest_prefix(digest);
    let reply = match reply {
        Ok(bytes) => bytes,
        Err(why) => {
            return (
                Found::Unavailable,
                Some(format!("Redis lookup of key_id={id} failed: {why}")),
            )
        }
    };
    let items = match resp::decode(reply, &resp::Limits::default()) {
        Ok(Reply::Array(Some(items))) => items,
        Ok(Reply::Array(None)) => return (Found::Unknown, None),
        Ok(Reply::Error(message)) => {
            let message: String = message.chars().take(120).collect();
            return (
                Found::Unavailable,
                Some(format!(
                    "Redis refused the lookup of key_id={id}: {message}"
                )),
            );
        }
        Ok(_) => {
            return (
                Found::Unavailable,
                Some(format!("Redis lookup of key_id={id}: not a hash reply")),
            )
        }
        Err(err) => {
            return (
                Found::Unavailable,
                Some(format!("Redis lookup of key_id={id}: bad reply: {err}")),
            )
        }
    };
    let mut fields = Vec::with_capacity(items.len() / 2);
    let mut items = items.into_iter();
    while let Some(name) = items.next() {
        let (Some(name), Some(value)) = (name.bytes().map(<[u8]>::to_vec), items.next()) else {
            return (
                Found::Unavailable,
                Some(format!("Redis lookup of key_id={id}: not a hash reply")),
            );
        };
        let Some(value) = value.bytes() else {
            return (
                Found::Unavailable,
                Some(format!("Redis lookup of key_id={id}: not a hash reply")),
            );
        };
        fields.push((name, value.to_vec()));
    }
    match entry_from_hash(digest, &fields) {
        Ok(Some(entry)) => (Found::Entry(entry), None),
        Ok(None) => (Found::Unknown, None),
        Err(err) => (
            Found::Unknown,
            Some(format!(
                "Redis key of key_id={id} is refused: field `{}`: {}",
                err.field(),
                err.reason()
            )),
        ),
    }
}

fn parse_hex32(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
        let text = std::str::from_utf8(pair).ok()?;
        *byte = u8::from_str_radix(text, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TTL: Ttl = Ttl {
        entry_ms: 30_000,
        unknown_ms: 10_000,
    };

    fn entry() -> KeyEntry {
        KeyEntry {
            consumer: "team-a".into(),
            tenant: "acme".into(),
            groups: "fast,smart".into(),
            expires_at: Some(1_798_761_600),
            disabled: false,
            key_id: "team-a-prod".into(),
            tier: Some("pro".into()),
        }
    }

    fn slot(n: u8, at: u64, value: Cached) -> Slot {
        Slot {
            digest: [n; 32],
            fetched_ms: at,
            value,
        }
    }

    #[test]
    fn a_slot_round_trips_and_is_found_while_fresh() {
        let e = Cached::Entry(entry());
        let bucket = insert(b"", slot(1, 1_000, e.clone()), 1_000, TTL);
        let bucket = insert(&bucket, slot(2, 1_000, Cached::Unknown), 1_000, TTL);
        assert_eq!(find(&bucket, &[1; 32], 1_000, TTL), Some(e.clone()));
        assert_eq!(find(&bucket, &[1; 32], 30_999, TTL), Some(e));
        assert_eq!(find(&bucket, &[1; 32], 31_000, TTL), None, "entry TTL over");
        assert_eq!(find(&bucket, &[2; 32], 10_999, TTL), Some(Cached::Unknown));
        assert_eq!(
            find(&bucket, &[2; 32], 11_000, TTL),
            None,
            "unknown TTL over"
        );
        assert_eq!(find(&bucket, &[3; 32], 1_000, TTL), None);
        // a slot fetched "in the future" (another clock) is not trusted
        assert_eq!(find(&bucket, &[1; 32], 999, TTL), None);
        let plain = KeyEntry {
            expires_at: None,
            tier: None,
            disabled: true,
            ..entry()
        };
        let bucket = insert(b"", slot(4, 5, Cached::Entry(plain.clone())), 5, TTL);
        assert_eq!(find(&bucket, &[4; 32], 5, TTL), Some(Cached::Entry(plain)));
    }

    #[test]
    fn a_full_bucket_drops_expired_slots_then_the_oldest() {
        let mut bucket = Vec::new();
        for n in 0..4u8 {
            bucket = insert(
                &bucket,
                slot(n, 1_000 + u64::from(n), Cached::Unknown),
                1_000,
                TTL,
            );
        }
        assert_eq!(decode(&bucket).len(), 4);
        // all fresh: the oldest (digest 0) goes
        bucket = insert(&bucket, slot(9, 1_010, Cached::Unknown), 1_010, TTL);
        let digests: Vec<u8> = decode(&bucket).iter().map(|s| s.digest[0]).collect();
        assert_eq!(digests, [1, 2, 3, 9]);
        // the same digest again replaces its slot, nothing else goes
        bucket = insert(&bucket, slot(2, 1_020, Cached::Entry(entry())), 1_020, TTL);
        let digests: Vec<u8> = decode(&bucket).iter().map(|s| s.digest[0]).collect();
        assert_eq!(digests, [1, 3, 9, 2]);
        // later, the unknown slots have expired: they all go, the entry stays
        bucket = insert(&bucket, slot(7, 20_000, Cached::Unknown), 20_000, TTL);
        let digests: Vec<u8> = decode(&bucket).iter().map(|s| s.digest[0]).collect();
        assert_eq!(digests, [2, 7]);
    }

    #[test]
    fn garbage_lines_are_dropped_and_buckets_spread_digests() {
        let good = encode(&[slot(1, 5, Cached::Unknown)]);
        let mut bucket = b"nonsense\n\xff\xfe\n".to_vec();
        bucket.extend_from_slice(&good);
        bucket.extend_from_slice(format!("{}\t5\t+\tc\n", "ab".repeat(32)).as_bytes());
        assert_eq!(decode(&bucket), vec![slot(1, 5, Cached::Unknown)]);
        assert_eq!(bucket_count(262_144), 65_536);
        assert_eq!(bucket_count(1), 1);
        let mut d = [0u8; 32];
        d[..4].copy_from_slice(&70_000u32.to_be_bytes());
        assert_eq!(bucket_key(&d, 65_536), "llm_keys/4464");
    }

    #[test]
    fn a_hgetall_reply_is_an_entry_an_unknown_key_or_unavailable() {
        let digest = [0x8e; 32];
        let hash = b"*4\r\n$8\r\nconsumer\r\n$6\r\nteam-a\r\n$6\r\ngroups\r\n$1\r\n*\r\n";
        let (found, line) = found_from_reply(&digest, Ok(hash));
        let Found::Entry(entry) = found else {
            panic!("{found:?}");
        };
        assert_eq!(
            (entry.consumer.as_str(), entry.groups.as_str()),
            ("team-a", "*")
        );
        assert_eq!(line, None);
        assert_eq!(
            found_from_reply(&digest, Ok(b"*0\r\n")),
            (Found::Unknown, None)
        );
        // a hash that fails validation: unknown, with a line naming the field and the key id
        let bad = b"*2\r\n$6\r\ntenant\r\n$1\r\nt\r\n";
        let (found, line) = found_from_reply(&digest, Ok(bad));
        assert_eq!(found, Found::Unknown);
        let line = line.unwrap();
        assert!(
            line.contains("`consumer`") && line.contains("8e8e8e8e8e8e8e8e"),
            "{line}"
        );
        assert!(
            !line.contains(&"8e".repeat(32)),
            "the whole digest in a log line"
        );
        // no answer, a RESP error, another type, a broken reply: unavailable
        for reply in [
            Err("call failed (status 1)"),
            Ok(
                b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"
                    .as_slice(),
            ),
            Ok(b"$1\r\nx\r\n".as_slice()),
            Ok(b"*1\r\n$1\r\nx\r\n".as_slice()),
            Ok(b"*2\r\n$1\r\nx\r\n:1\r\n".as_slice()),
            Ok(b"garbage".as_slice()),
        ] {
            let (found, line) = found_from_reply(&digest, reply);
            assert_eq!(found, Found::Unavailable, "{reply:?}");
            assert!(line.is_some());
        }
    }

    proptest! {
        #[test]
        fn any_bytes_decode_without_panicking_and_never_grow_a_bucket(
            bytes in proptest::collection::vec(any::<u8>(), 0..600),
            n in any::<u8>(),
            now in 0u64..100_000,
        ) {
            let slots = decode(&bytes);
            prop_assert!(slots.len() <= BUCKET_WAYS);
            let after = insert(&bytes, slot(n, now, Cached::Unknown), now, TTL);
            prop_assert!(decode(&after).len() <= BUCKET_WAYS);
            prop_assert_eq!(find(&after, &[n; 32], now, TTL), Some(Cached::Unknown));
        }
    }
}
