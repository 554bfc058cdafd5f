//! A soft limit's bucket as one gateway instance keeps it in Envoy shared data.
//!
//! Amounts are kept in milli-units (a thousandth of a request or a token) so that slow refill
//! rates (60 per hour) lose nothing to rounding. Three modes, chosen per request by the shell:
//!
//! * [`Mode::Local`] — no Redis (plain Envoy): a token bucket of `amount` per window, full at
//!   first, refilled by the gateway clock. Per instance.
//! * [`Mode::Leased`] — Redis: the bucket holds only what it leased from the central bucket
//!   (Lua `LEASE`). Taking from it costs no Redis call; when a take leaves it below the low
//!   watermark it asks the instance's sync worker to top it up ([`Take::Admit::wants_lease`]);
//!   when it cannot cover a request the request waits for one synchronous lease
//!   ([`Take::Lease`]); when Redis said the central bucket is dry, the request is refused
//!   without asking again until the time Redis gave ([`Local::dry_until_ms`]).
//! * [`Mode::Emergency`] — Redis unreachable: what was leased is spent first, then a separate
//!   allowance of `emergency_percent` of the limit (capacity and refill rate), per instance.
//!
//! Settling gives unused reserved tokens back; using more than reserved makes `avail`
//! negative (debt), paid by later leases or refill.

/// Bytes of an encoded [`Local`].
pub const ENCODED_LEN: usize = 1 + 8 * 8;
const VERSION: u8 = 2;
const MILLI: i64 = 1000;

/// How the instance runs a bucket right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Per instance, refilled by the gateway clock (no Redis).
    Local,
    /// Leased from the central bucket in Redis.
    Leased,
    /// Redis unreachable: leased tokens, then the emergency share.
    Emergency,
}

/// A limit's numbers, as the bucket needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    /// Capacity and refill per window.
    pub amount: u64,
    /// The window.
    pub window_ms: u64,
    /// Tokens a sync lease asks for.
    pub batch: u64,
    /// Below this (whole units), ask the sync worker for a lease.
    pub low: u64,
    /// Emergency share, percent of `amount`.
    pub emergency_percent: u8,
    /// A lease asked for and not answered after this long is asked again.
    pub lease_timeout_ms: u64,
}

impl Spec {
    /// The spec of a limit under a lease configuration.
    pub fn new(amount: u64, window_ms: u64, batch_percent: u8, low_percent: u8) -> Spec {
        let batch = (amount.saturating_mul(u64::from(batch_percent)) / 100).max(1);
        Spec {
            amount,
            window_ms: window_ms.max(1),
            batch,
            low: batch.saturating_mul(u64::from(low_percent)) / 100,
            emergency_percent: 0,
            lease_timeout_ms: 1_000,
        }
    }

    fn capacity_milli(&self) -> i64 {
        milli(self.amount)
    }

    fn emergency_capacity_milli(&self) -> i64 {
        milli(
            self.amount
                .saturating_mul(u64::from(self.emergency_percent))
                / 100,
        )
    }
}

fn milli(units: u64) -> i64 {
    i64::try_from(units)
        .unwrap_or(i64::MAX)
        .saturating_mul(MILLI)
}

/// Milliseconds until `missing` milli-units refill at `per_window` units per `window_ms`
/// (rounded up); `None` if nothing refills.
fn refill_time(missing: i64, per_window: u64, window_ms: u64) -> Option<u64> {
    if missing <= 0 {
        return Some(0);
    }
    let rate = u128::from(per_window).saturating_mul(1000);
    if rate == 0 {
        return None;
    }
    let missing = u128::try_from(missing).unwrap_or(0);
    let ms = (missing.saturating_mul(u128::from(window_ms))).div_ceil(rate);
    Some(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// What taking `cost` from the bucket decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// Taken.
    Admit {
        /// The bucket fell below its low watermark: queue it for the sync worker.
        wants_lease: bool,
        /// Some of it came from the emergency share (Redis unreachable).
        emergency: bool,
    },
    /// Not enough here: lease at least `want_min` (at most `want_max`) from Redis and retry.
    Lease {
        /// The deficit.
        want_min: u64,
        /// The deficit plus a batch.
        want_max: u64,
    },
    /// Refused.
    Reject {
        /// When a retry may succeed.
        retry_after_ms: u64,
        /// The request alone is larger than the limit: no wait helps.
        never: bool,
    },
}

/// One bucket's state in this instance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Local {
    /// Available milli-units (leased or refilled); negative: debt.
    pub avail: i64,
    /// Last local refill (mode `Local`).
    pub ts_ms: u64,
    /// Emergency allowance, milli-units.
    pub emergency: i64,
    /// Last emergency refill.
    pub emergency_ts_ms: u64,
    /// A lease is in flight until then (no second one is queued).
    pub leasing_until_ms: u64,
    /// Redis said the central bucket is dry until then.
    pub dry_until_ms: u64,
    /// Whose bucket this is (a digest of the identity; 0: nobody's yet). Buckets of
    /// client-chosen identities (addresses, user ids) live in a bounded set of slots, so two
    /// identities may meet in one.
    pub owner: u64,
    /// Last admission.
    pub touched_ms: u64,
}

/// What [`Local::claim`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The bucket was this identity's (or nobody's).
    Own,
    /// Another identity's bucket, idle for a whole window: now this identity's, afresh.
    TookOver,
    /// Another identity's bucket, in use: shared (both are limited by it, never more).
    Shared,
}

impl Local {
    /// A bucket seen for the first time.
    pub fn new(mode: Mode, spec: &Spec, now_ms: u64) -> Local {
        Local {
            avail: if mode == Mode::Local {
                spec.capacity_milli()
            } else {
                0
            },
            ts_ms: now_ms,
            emergency: spec.emergency_capacity_milli(),
            emergency_ts_ms: now_ms,
            leasing_until_ms: 0,
            dry_until_ms: 0,
            owner: 0,
            touched_ms: now_ms,
        }
    }

    /// Makes the bucket `owner`'s if it is free or has been idle for a window; else it is
    /// shared with its current owner (never reset under an active owner: a reset would
    /// hand out a fresh bucket every time two identities alternate).
    pub fn claim(&mut self, owner: u64, mode: Mode, spec: &Spec, now_ms: u64) -> Claim {
        if self.owner == owner {
            return Claim::Own;
        }
        if self.owner == 0 {
            self.owner = owner;
            return Claim::Own;
        }
        if now_ms.saturating_sub(self.touched_ms) >= spec.window_ms {
            *self = Local::new(mode, spec, now_ms);
            self.owner = owner;
            return Claim::TookOver;
        }
        Claim::Shared
    }

    fn refill_local(&mut self, spec: &Spec, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.ts_ms);
        if elapsed > 0 {
            let add = refill_amount(elapsed, spec.amount, spec.window_ms);
            self.avail = self
                .avail
                .saturating_add(add)
                .min(spec.capacity_milli().max(self.avail));
            self.ts_ms = now_ms;
        }
    }

    fn refill_emergency(&mut self, spec: &Spec, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.emergency_ts_ms);
        if elapsed > 0 {
            let per_window = spec
                .amount
                .saturating_mul(u64::from(spec.emergency_percent))
                / 100;
            let add = refill_amount(elapsed, per_window, spec.window_ms);
            self.emergency = self
                .emergency
                .saturating_add(add)
                .min(spec.emergency_capacity_milli().max(self.emergency));
            self.emergency_ts_ms = now_ms;
        }
    }

    /// Takes `cost` units, or says what is needed first.
    pub fn take(&mut self, mode: Mode, spec: &Spec, cost: u64, now_ms: u64) -> Take {
        let take = self.take_inner(mode, spec, cost, now_ms);
        if let Take::Admit { .. } = take {
            self.touched_ms = self.touched_ms.max(now_ms);
        }
        take
    }

    fn take_inner(&mut self, mode: Mode, spec: &Spec, cost: u64, now_ms: u64) -> Take {
        let need = milli(cost);
        if cost > spec.amount {
            return Take::Reject {
                retry_after_ms: spec.window_ms,
                never: true,
            };
        }
        match mode {
            Mode::Local => {
                self.refill_local(spec, now_ms);
                if self.avail >= need {
                    self.avail -= need;
                    return Take::Admit {
                        wants_lease: false,
                        emergency: false,
                    };
                }
                let wait = refill_time(need - self.avail, spec.amount, spec.window_ms);
                Take::Reject {
                    retry_after_ms: wait.unwrap_or(spec.window_ms),
                    never: false,
                }
            }
            Mode::Leased => {
                if self.avail >= need {
                    self.avail -= need;
                    let wants_lease = self.avail < milli(spec.low.max(1))
                        && self.leasing_until_ms <= now_ms
                        && self.dry_until_ms <= now_ms;
                    if wants_lease {
                        self.leasing_until_ms = now_ms.saturating_add(spec.lease_timeout_ms);
                    }
                    return Take::Admit {
                        wants_lease,
                        emergency: false,
                    };
                }
                if self.dry_until_ms > now_ms {
                    return Take::Reject {
                        retry_after_ms: self.dry_until_ms - now_ms,
                        never: false,
                    };
                }
                let missing = need - self.avail;
                let deficit = u64::try_from(missing.div_euclid(MILLI))
                    .unwrap_or(0)
                    .saturating_add(u64::from(missing.rem_euclid(MILLI) != 0));
                // A lease is worth a Redis call only if it brings at least a batch: while the
                // central bucket holds less (a limit offered more than its rate drains it),
                // Redis answers "dry until a batch is there" and this bucket refuses locally
                // until then, instead of fetching the crumbs refilled since the last call on
                // every request (one Redis call per admitted request, measured).
                Take::Lease {
                    want_min: deficit.max(spec.batch).min(spec.amount.max(deficit)),
                    want_max: deficit.saturating_add(spec.batch),
                }
            }
            Mode::Emergency => {
                if self.avail >= need {
                    self.avail -= need;
                    return Take::Admit {
                        wants_lease: false,
                        emergency: false,
                    };
                }
                self.refill_emergency(spec, now_ms);
                let from_avail = self.avail.max(0);
                if from_avail + self.emergency >= need {
                    self.avail -= from_avail;
                    self.emergency -= need - from_avail;
                    return Take::Admit {
                        wants_lease: false,
                        emergency: true,
                    };
                }
                let per_window = spec
                    .amount
                    .saturating_mul(u64::from(spec.emergency_percent))
                    / 100;
                let wait = refill_time(
                    need - from_avail - self.emergency,
                    per_window,
                    spec.window_ms,
                );
                Take::Reject {
                    retry_after_ms: wait.unwrap_or(spec.window_ms),
                    never: false,
                }
            }
        }
    }

    /// Adds a lease's grant. `granted < want_min` means the central bucket is dry for
    /// `wait_ms`.
    pub fn add_lease(&mut self, granted: u64, want_min: u64, wait_ms: u64, now_ms: u64) {
        self.avail = self.avail.saturating_add(milli(granted));
        self.leasing_until_ms = 0;
        if granted < want_min.max(1) {
            self.dry_until_ms = now_ms.saturating_add(wait_ms.max(1));
        } else {
            self.dry_until_ms = 0;
        }
    }

    /// A lease that failed (Redis unreachable): another may be queued.
    pub fn lease_failed(&mut self) {
        self.leasing_until_ms = 0;
    }

    /// Gives back `units` (unused reservation; negative: over-use becomes debt).
    pub fn settle(&mut self, mode: Mode, spec: &Spec, units: i64, now_ms: u64) {
        if mode == Mode::Local {
            self.refill_local(spec, now_ms);
        }
        self.avail = self.avail.saturating_add(units.saturating_mul(MILLI));
        if mode == Mode::Local {
            self.avail = self.avail.min(spec.capacity_milli());
        }
    }

    /// Whole units available now (for `x-ratelimit-remaining-*`).
    pub fn remaining(&self) -> u64 {
        u64::try_from(self.avail.max(0) / MILLI).unwrap_or(0)
    }

    /// The shared-data value.
    pub fn encode(&self) -> [u8; ENCODED_LEN] {
        let mut out = [0u8; ENCODED_LEN];
        out[0] = VERSION;
        let fields = [
            self.avail as u64,
            self.ts_ms,
            self.emergency as u64,
            self.emergency_ts_ms,
            self.leasing_until_ms,
            self.dry_until_ms,
            self.owner,
            self.touched_ms,
        ];
        for (chunk, value) in out[1..].chunks_exact_mut(8).zip(fields) {
            chunk.copy_from_slice(&value.to_le_bytes());
        }
        out
    }

    /// Reads a shared-data value; `None` if it is not one of ours (then start afresh).
    pub fn decode(bytes: &[u8]) -> Option<Local> {
        let (&version, rest) = bytes.split_first()?;
        if version != VERSION || rest.len() != ENCODED_LEN - 1 {
            return None;
        }
        let mut fields = rest
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])));
        let mut next = || fields.next().unwrap_or(0);
        Some(Local {
            avail: next() as i64,
            ts_ms: next(),
            emergency: next() as i64,
            emergency_ts_ms: next(),
            leasing_until_ms: next(),
            dry_until_ms: next(),
            owner: next(),
            touched_ms: next(),
        })
    }
}

fn refill_amount(elapsed_ms: u64, per_window: u64, window_ms: u64) -> i64 {
    let add = u128::from(elapsed_ms)
        .saturating_mul(u128::from(per_window))
        .saturating_mul(1000)
        / u128::from(window_ms.max(1));
    i64::try_from(add).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(amount: u64, window_ms: u64) -> Spec {
        Spec {
            emergency_percent: 10,
            ..Spec::new(amount, window_ms, 10, 50)
        }
    }

    fn admitted(t: Take) -> bool {
        matches!(t, Take::Admit { .. })
    }

    #[test]
    fn local_bucket_starts_full_and_refills_at_the_rate() {
        let s = spec(60, 60_000); // one per second
        let mut b = Local::new(Mode::Local, &s, 0);
        for _ in 0..60 {
            assert!(admitted(b.take(Mode::Local, &s, 1, 0)));
        }
        assert_eq!(
            b.take(Mode::Local, &s, 1, 0),
            Take::Reject {
                retry_after_ms: 1000,
                never: false
            }
        );
        assert_eq!(
            b.take(Mode::Local, &s, 1, 400),
            Take::Reject {
                retry_after_ms: 600,
                never: false
            }
        );
        assert!(admitted(b.take(Mode::Local, &s, 1, 1000)));
        // never above capacity
        let mut b = Local::new(Mode::Local, &s, 0);
        b.settle(Mode::Local, &s, 1000, 10_000_000);
        assert_eq!(b.remaining(), 60);
    }

    #[test]
    fn a_request_larger_than_the_limit_never_fits() {
        let s = spec(100, 1000);
        let mut b = Local::new(Mode::Local, &s, 0);
        assert_eq!(
            b.take(Mode::Local, &s, 101, 0),
            Take::Reject {
                retry_after_ms: 1000,
                never: true
            }
        );
        assert_eq!(b.remaining(), 100);
    }

    #[test]
    fn leased_bucket_asks_for_the_deficit_plus_a_batch_then_for_a_top_up() {
        let s = spec(1000, 60_000); // batch 100, low 50
        let mut b = Local::new(Mode::Leased, &s, 0);
        // the deficit is 30, but a lease brings at least a batch
        assert_eq!(
            b.take(Mode::Leased, &s, 30, 0),
            Take::Lease {
                want_min: 100,
                want_max: 130
            }
        );
        assert_eq!(
            b.take(Mode::Leased, &s, 300, 0),
            Take::Lease {
                want_min: 300,
                want_max: 400
            }
        );
        b.add_lease(130, 30, 0, 0);
        assert_eq!(
            b.take(Mode::Leased, &s, 30, 0),
            Take::Admit {
                wants_lease: false,
                emergency: false
            }
        );
        // 100 left; 60 more leaves 40 < low 50: ask once
        assert_eq!(
            b.take(Mode::Leased, &s, 60, 1),
            Take::Admit {
                wants_lease: true,
                emergency: false
            }
        );
        assert_eq!(
            b.take(Mode::Leased, &s, 10, 2),
            Take::Admit {
                wants_lease: false,
                emergency: false
            }
        );
        // the lease timed out unanswered: ask again
        assert_eq!(
            b.take(Mode::Leased, &s, 10, 2 + s.lease_timeout_ms),
            Take::Admit {
                wants_lease: true,
                emergency: false
            }
        );
    }

    #[test]
    fn a_dry_central_bucket_refuses_without_asking_again() {
        let s = spec(1000, 60_000);
        let mut b = Local::new(Mode::Leased, &s, 0);
        b.add_lease(5, 20, 900, 100);
        assert_eq!(
            b.take(Mode::Leased, &s, 20, 200),
            Take::Reject {
                retry_after_ms: 800,
                never: false
            }
        );
        assert!(admitted(b.take(Mode::Leased, &s, 5, 200)));
        assert!(matches!(
            b.take(Mode::Leased, &s, 20, 1000),
            Take::Lease { want_min: 100, .. }
        ));
    }

    #[test]
    fn emergency_spends_the_lease_then_the_share() {
        let s = spec(1000, 1000); // share 100 per second
        let mut b = Local::new(Mode::Leased, &s, 0);
        b.add_lease(50, 1, 0, 0);
        assert_eq!(
            b.take(Mode::Emergency, &s, 50, 0),
            Take::Admit {
                wants_lease: false,
                emergency: false
            }
        );
        assert_eq!(
            b.take(Mode::Emergency, &s, 100, 0),
            Take::Admit {
                wants_lease: false,
                emergency: true
            }
        );
        assert_eq!(
            b.take(Mode::Emergency, &s, 10, 0),
            Take::Reject {
                retry_after_ms: 100,
                never: false
            }
        );
        assert!(admitted(b.take(Mode::Emergency, &s, 10, 100)));
    }

    #[test]
    fn settle_refunds_and_makes_debt() {
        let s = spec(1000, 60_000);
        let mut b = Local::new(Mode::Leased, &s, 0);
        b.add_lease(100, 1, 0, 0);
        assert!(admitted(b.take(Mode::Leased, &s, 100, 0)));
        b.settle(Mode::Leased, &s, 40, 0);
        assert_eq!(b.remaining(), 40);
        b.settle(Mode::Leased, &s, -70, 0);
        assert_eq!(b.avail, -30_000);
        assert_eq!(b.remaining(), 0);
        assert!(matches!(
            b.take(Mode::Leased, &s, 1, 0),
            Take::Lease {
                want_min: 100,
                want_max: 131
            }
        ));
    }

    #[test]
    fn a_slot_is_shared_while_in_use_and_taken_over_when_idle() {
        let s = spec(10, 1000);
        let mut b = Local::new(Mode::Local, &s, 0);
        assert_eq!(b.claim(7, Mode::Local, &s, 0), Claim::Own);
        for _ in 0..10 {
            assert!(admitted(b.take(Mode::Local, &s, 1, 0)));
        }
        // another identity lands in the slot while it is in use: shared, so still limited
        assert_eq!(b.claim(9, Mode::Local, &s, 500), Claim::Shared);
        assert!(!admitted(b.take(Mode::Local, &s, 6, 500)));
        // a window later the slot is free for the newcomer, afresh
        assert_eq!(b.claim(9, Mode::Local, &s, 1000), Claim::TookOver);
        assert_eq!((b.owner, b.remaining()), (9, 10));
        assert_eq!(b.claim(9, Mode::Local, &s, 1000), Claim::Own);
    }

    #[test]
    fn decode_rejects_foreign_values() {
        assert_eq!(Local::decode(b""), None);
        assert_eq!(Local::decode(&[VERSION + 1; ENCODED_LEN]), None);
        assert_eq!(
            Local::decode(&[1; ENCODED_LEN]),
            None,
            "the previous layout"
        );
        assert_eq!(Local::decode(&[1; 10]), None);
    }

    proptest! {
        #[test]
        fn encoding_round_trips(avail in any::<i64>(), a in any::<u64>(), e in any::<i64>(), b in any::<u64>(), c in any::<u64>(), d in any::<u64>(), o in any::<u64>(), t in any::<u64>()) {
            let l = Local { avail, ts_ms: a, emergency: e, emergency_ts_ms: b, leasing_until_ms: c, dry_until_ms: d, owner: o, touched_ms: t };
            prop_assert_eq!(Local::decode(&l.encode()), Some(l));
        }

        /// Over any run of takes, a local bucket admits at most its capacity plus what the
        /// clock refilled.
        #[test]
        fn local_admits_no_more_than_capacity_plus_refill(
            amount in 1u64..10_000,
            window in 1u64..100_000,
            steps in proptest::collection::vec((0u64..5_000, 1u64..500), 1..200),
        ) {
            let s = spec(amount, window);
            let mut b = Local::new(Mode::Local, &s, 0);
            let (mut now, mut admitted_units) = (0u64, 0u128);
            for (dt, cost) in steps {
                now += dt;
                if let Take::Admit { .. } = b.take(Mode::Local, &s, cost, now) {
                    admitted_units += u128::from(cost);
                }
            }
            let bound = u128::from(amount) + u128::from(now) * u128::from(amount) / u128::from(window) + 1;
            prop_assert!(admitted_units <= bound, "{admitted_units} > {bound}");
        }

        /// A leased bucket admits exactly what was leased, never more.
        #[test]
        fn leased_admits_only_what_was_leased(
            leases in proptest::collection::vec(0u64..1_000, 1..20),
            costs in proptest::collection::vec(1u64..300, 1..200),
        ) {
            let s = spec(1_000_000, 60_000);
            let mut b = Local::new(Mode::Leased, &s, 0);
            let leased: u64 = leases.iter().sum();
            for l in &leases { b.add_lease(*l, 0, 0, 0); }
            let mut taken = 0u64;
            for c in costs {
                if let Take::Admit { .. } = b.take(Mode::Leased, &s, c, 0) { taken += c; }
            }
            prop_assert!(taken <= leased);
            prop_assert_eq!(b.avail, i64::try_from(leased - taken).unwrap() * 1000);
        }
    }
}
