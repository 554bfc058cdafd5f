//! The sync worker: elected with a lease in shared data; on its tick it flushes the outbox,
//! tops up leased buckets and replays the journal.

use super::settlement::entry_command;
use super::store::lease_failed;
use super::*;

impl Core {
    pub(super) fn elected(&self, env: &dyn Env, now: u64, period_ms: u64) -> bool {
        let nonce = self.nonce;
        update(env, SYNC_KEY, &[0u8; 16], |v| {
            let owner = v.get(..8).map_or(0, decode_u64);
            let until = v.get(8..16).map_or(0, decode_u64);
            if owner == nonce || until <= now {
                let mut next = nonce.to_le_bytes().to_vec();
                next.extend_from_slice(
                    &now.saturating_add(period_ms.saturating_mul(3))
                        .to_le_bytes(),
                );
                (Some(next), true)
            } else {
                (None, false)
            }
        })
        .unwrap_or(false)
    }

    pub(super) fn on_tick(&mut self, env: &dyn Env, now: u64) {
        let rules = Rc::clone(&self.rules);
        let Some(config) = rules.configs().find(|c| c.redis.is_some()) else {
            return;
        };
        // the outbox (HTTP transport): sent from here, whose root context outlives requests
        for entry in std::mem::take(&mut self.outbox) {
            self.settle_entry_now(env, now, entry);
        }
        if !self.elected(env, now, u64::from(config.lease.sync_ms)) {
            return;
        }
        let down = self.redis_down(env, now);
        // top-ups
        let wanted: Vec<String> = update(env, WANT_KEY, &[], |v| {
            if v.is_empty() {
                (None, Vec::new())
            } else {
                let keys = String::from_utf8_lossy(v)
                    .lines()
                    .map(str::to_owned)
                    .collect::<Vec<_>>();
                (Some(Vec::new()), keys)
            }
        })
        .unwrap_or_default();
        for line in wanted {
            let mut fields = line.split('\t');
            let (Some(local), Some(redis), Some(owner)) = (
                fields.next(),
                fields.next(),
                fields.next().and_then(|o| o.parse::<u64>().ok()),
            ) else {
                continue;
            };
            // the amount of the tier the bucket was taken at (absent: a line written before
            // tiers existed)
            let amount = fields.next().and_then(|a| a.parse::<u64>().ok());
            let keys = BucketKeys {
                local: local.to_string(),
                redis: redis.to_string(),
                owner,
            };
            let Some((config, index)) = budget::limit_of_local_key(&keys.local).and_then(|name| {
                rules.configs().find_map(|c| {
                    c.limits
                        .iter()
                        .position(|l| l.name == name)
                        .filter(|_| c.redis.is_some())
                        .map(|i| (c, i))
                })
            }) else {
                continue;
            };
            let Some(limit) = config.limits.get(index) else {
                continue;
            };
            // only an amount the limit has: shared data is another VM's word
            let amount = amount
                .filter(|a| limit.has_amount(*a))
                .unwrap_or(limit.amount);
            let spec = spec_of(config, index, amount);
            if down {
                lease_failed(env, &keys.local);
                continue;
            }
            if let Some(call) =
                Self::lease_call(config, None, &keys, spec, (spec.batch, spec.batch), now)
            {
                if self.send(env, now, call, 0).is_err() {
                    break;
                }
            }
        }
        // journal replay
        let journal = env
            .shared_get(JOURNAL_KEY)
            .ok()
            .and_then(|(v, _)| v)
            .map(|v| Journal::decode(&v))
            .unwrap_or_default();
        let depth = journal.entries.len() as u64;
        self.push(NO_REQUEST, Effect::Gauge("journal_depth".into(), depth));
        if down || self.redis_down(env, now) {
            return;
        }
        let Some(redis) = config.redis.as_ref() else {
            return;
        };
        let clock = clock_arg(config, now);
        for (seq, entry) in journal.entries.into_iter().take(REPLAY_BATCH) {
            if !self.replaying.insert(seq) {
                continue;
            }
            let (script, keys, args) = entry_command(&entry, clock);
            let call = Call {
                kind: CallKind::Replay { seq },
                script,
                keys,
                args,
                service: redis.service.clone(),
                resent: false,
            };
            if self.send(env, now, call, 0).is_err() {
                self.replaying.remove(&seq);
                break;
            }
        }
    }
}
