//! The instance's shared data: CAS updates of buckets, the want list and per-instance
//! budget levels.

use super::*;

/// Read-modify-write of one shared-data value under CAS, retried on a mismatch. `f` gets
/// the current value (`seed` stored first if the key does not exist) and returns the value
/// to store (`None`: leave it) and a result.
pub fn update<R>(
    env: &dyn Env,
    key: &str,
    seed: &[u8],
    mut f: impl FnMut(&[u8]) -> (Option<Vec<u8>>, R),
) -> Result<R, HostError> {
    for _ in 0..CAS_ROUNDS {
        let (value, cas) = env.shared_get(key)?;
        let Some(value) = value else {
            env.shared_set(key, seed, 0)?;
            continue;
        };
        let (next, result) = f(&value);
        let Some(next) = next else {
            return Ok(result);
        };
        match env.shared_set(key, &next, cas) {
            Ok(()) => return Ok(result),
            Err(HostError::CasMismatch) => continue,
            Err(err) => return Err(err),
        }
    }
    Err(HostError::CasMismatch)
}

/// Lets the sync worker queue another top-up of a bucket whose lease failed.
pub(super) fn lease_failed(env: &dyn Env, local_key: &str) {
    // best effort: a bucket whose flag stays set is retried when its lease times out
    let _ = update(env, local_key, &[], |v| match Local::decode(v) {
        Some(mut local) => {
            local.lease_failed();
            (Some(local.encode().to_vec()), ())
        }
        None => (None, ()),
    });
}

/// Takes `units` from a bucket under CAS (claiming its slot for the identity first); also
/// says what is left.
pub(super) fn take(
    env: &dyn Env,
    keys: &BucketKeys,
    mode: Mode,
    spec: &Spec,
    units: u64,
    now: u64,
) -> Result<(Take, u64), HostError> {
    let seed = Local::new(mode, spec, now).encode();
    update(env, &keys.local, &seed, |v| {
        let mut local = Local::decode(v).unwrap_or_else(|| Local::new(mode, spec, now));
        local.claim(keys.owner, mode, spec, now);
        let take = local.take(mode, spec, units, now);
        (Some(local.encode().to_vec()), (take, local.remaining()))
    })
}

pub(super) fn settle_bucket(
    env: &dyn Env,
    key: &str,
    mode: Mode,
    spec: &Spec,
    units: i64,
    now: u64,
) -> Result<(), HostError> {
    let seed = Local::new(mode, spec, now).encode();
    update(env, key, &seed, |v| {
        let mut local = Local::decode(v).unwrap_or_else(|| Local::new(mode, spec, now));
        local.settle(mode, spec, units, now);
        (Some(local.encode().to_vec()), ())
    })
}

pub(super) fn want(env: &dyn Env, keys: &BucketKeys, amount: u64) {
    let line = format!("{}\t{}\t{}\t{amount}", keys.local, keys.redis, keys.owner);
    // best effort: the bucket asks again on its next take while it is low
    let _ = update(env, WANT_KEY, &[], |v| {
        let text = String::from_utf8_lossy(v);
        if text.lines().any(|l| l == line) || text.lines().count() >= MAX_WANT {
            return (None, ());
        }
        let mut next = v.to_vec();
        next.extend_from_slice(line.as_bytes());
        next.push(b'\n');
        (Some(next), ())
    });
}

/// Reserves every level in shared data (plain-Envoy build): all or nothing. Returns what is
/// spent per level afterwards, or the refusing level and what it had left.
pub(super) fn reserve_locally(
    env: &dyn Env,
    levels: &[Level],
    amounts: &[u64],
) -> Result<Vec<u64>, (usize, i64)> {
    let mut done: Vec<(usize, u64)> = Vec::new();
    let mut spent_after = Vec::with_capacity(levels.len());
    for (index, (level, amount)) in levels.iter().zip(amounts).enumerate() {
        let key = [LOCAL_BUDGET_PREFIX, level.key.as_str()].concat();
        let outcome = update(env, &key, &0u64.to_le_bytes(), |v| {
            let spent = decode_u64(v);
            if spent.saturating_add(*amount) > level.limit {
                (
                    None,
                    Err(i64::try_from(level.limit).unwrap_or(i64::MAX)
                        - i64::try_from(spent).unwrap_or(i64::MAX)),
                )
            } else {
                let next = spent.saturating_add(*amount);
                (Some(next.to_le_bytes().to_vec()), Ok(next))
            }
        });
        match outcome {
            Ok(Ok(spent)) => {
                done.push((index, *amount));
                spent_after.push(spent);
            }
            Ok(Err(remaining)) => {
                for (i, amount) in done {
                    if let Some(level) = levels.get(i) {
                        // a rollback lost to shared data leaves the level over-counted: the
                        // safe direction (never oversold)
                        let _ = add_local(env, level, -i128::from(amount));
                    }
                }
                return Err((index, remaining));
            }
            Err(_) => {
                // no shared data: fail open (logged by the host)
                spent_after.push(0);
            }
        }
    }
    Ok(spent_after)
}

pub(super) fn add_local(env: &dyn Env, level: &Level, delta: i128) -> Result<(), HostError> {
    let key = [LOCAL_BUDGET_PREFIX, level.key.as_str()].concat();
    update(env, &key, &0u64.to_le_bytes(), |v| {
        let spent = i128::from(decode_u64(v)) + delta;
        let spent = u64::try_from(spent.max(0)).unwrap_or(u64::MAX);
        (Some(spent.to_le_bytes().to_vec()), ())
    })
}

/// Settles a per-instance reservation to what was used; how many levels could not be
/// written (shared data contended or unavailable).
pub(super) fn settle_locally(
    env: &dyn Env,
    levels: &[Level],
    reserved: &[u64],
    actual: &[u64],
) -> i64 {
    let mut lost = 0;
    for ((level, reserved), actual) in levels.iter().zip(reserved).zip(actual) {
        let delta = i128::from(*actual) - i128::from(*reserved);
        if delta != 0 && add_local(env, level, delta).is_err() {
            lost += 1;
        }
    }
    lost
}
