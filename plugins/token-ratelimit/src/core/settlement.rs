//! Settlement: exactly once per logical request, at `on_log` (or `on_done`); the outbox
//! and the journal.

use super::store::{settle_bucket, settle_locally};
use super::*;

impl Core {
    /// `on_log` of a request: settles it, or — superseded by an internal redirect — stashes
    /// its admission for the pass that re-enters ([`crate::reentry`]).
    pub(super) fn log_request(&mut self, env: &dyn Env, now: u64, id: u32, superseded: bool) {
        let choice = self.flows.get(&id).map(|flow| {
            let in_flight = flow.waiting || matches!(flow.reservation, Reservation::Pending);
            reentry::at_log(superseded && flow.logical, flow.admitted, in_flight)
        });
        if choice != Some(AtLog::Carry) {
            self.settle(env, now, id);
            return;
        }
        let Some(flow) = self.flows.remove(&id) else {
            return;
        };
        let request_id = flow.request_id.clone();
        let dropped = self.stash.put(&request_id, flow, now);
        self.count("reentry_carried", 1);
        self.settle_dropped(env, now, id, dropped);
    }

    /// Settles admissions that left the stash untaken (expired, evicted): their usage is
    /// unknown, so the reservation stands — the safe direction, never a leak. `ctx` is the
    /// request whose callback this is (its route is read for the price).
    pub(super) fn settle_dropped(&mut self, env: &dyn Env, now: u64, ctx: u32, dropped: Vec<Flow>) {
        let rules = Rc::clone(&self.rules);
        for mut flow in dropped {
            self.count("reentry_expired", 1);
            let Some(config) = rules.configs().nth(flow.config) else {
                continue;
            };
            if let Some(entry) = self.settle_flow(env, now, ctx, &mut flow, config, None) {
                self.settle_entry(env, now, entry);
            }
        }
    }

    pub(super) fn settle(&mut self, env: &dyn Env, now: u64, id: u32) {
        let Some(mut flow) = self.flows.remove(&id) else {
            return;
        };
        let rules = Rc::clone(&self.rules);
        let Some(config) = rules.configs().nth(flow.config) else {
            return;
        };
        let waiting = flow.waiting || matches!(flow.reservation, Reservation::Pending);
        let model_call = flow.cost.as_ref().is_some_and(Cost::is_model_call);
        let record = if flow.admitted && model_call {
            env.usage_record(id, &config.usage_filter_state)
        } else {
            None
        };
        let entry = self.settle_flow(env, now, id, &mut flow, config, record.as_ref());
        if waiting {
            flow.abandoned = true;
            self.flows.insert(id, flow);
        }
        if let Some(entry) = entry {
            self.settle_entry(env, now, entry);
        }
        if waiting && self.http {
            self.abandon_calls(env, now, id);
        }
    }

    /// Over HTTP, the answers to a finished request's calls never reach the plugin (the SDK
    /// drops them with the context): fail them now, as calls Redis never answered (a
    /// `RESERVE` is cancelled), and forget the request.
    pub(super) fn abandon_calls(&mut self, env: &dyn Env, now: u64, id: u32) {
        let calls = self.calls.take_context(id);
        for (_, call) in calls {
            self.count("calls_abandoned", 1);
            self.call_failed(env, now, call, Sent::Unanswered);
        }
        self.flows.remove(&id);
    }

    /// Gives back the buckets' unused units and settles a local reservation; returns the
    /// Redis settlement to send, if any.
    pub(super) fn settle_flow(
        &mut self,
        env: &dyn Env,
        now: u64,
        ctx: u32,
        flow: &mut Flow,
        config: &Config,
        record: Option<&Charge>,
    ) -> Option<JournalEntry> {
        let model_call = flow.cost.as_ref().is_some_and(Cost::is_model_call);
        if flow.admitted && model_call && record.is_none() {
            self.count("settled_without_usage", 1);
        }
        let actual = settle::actual(flow.admitted, model_call, record);

        // soft limits
        let mode = self.mode(env, config, now);
        for taken in flow.taken.drain(..) {
            let Some(limit) = config.limits.get(taken.limit) else {
                continue;
            };
            let refund =
                settle::bucket_refund(limit.unit, taken.units, flow.admitted, actual.as_ref());
            if refund != 0 {
                let spec = spec_of(config, taken.limit, taken.amount);
                if settle_bucket(env, &taken.local_key, mode, &spec, refund, now).is_err() {
                    self.count("bucket_refund_lost", 1);
                }
            }
        }

        // budgets: the price only when a reservation is settled and a level needs it (a money
        // budget the record has no cost for): the route is read then — the answering
        // deployment's, which the router's upstream role published after admission
        let reservation = std::mem::take(&mut flow.reservation);
        let model = flow.cost.as_ref().and_then(|c| c.model.as_deref());
        let group = flow.identity.model_group.as_deref();
        let actual_of = |levels: &[Level], amounts: &[u64]| -> Vec<u64> {
            let price = match settle::needs_price(&config.budgets, levels, actual.as_ref()) {
                true => config.price_for(
                    env.route_info(ctx).and_then(|r| r.price).as_ref(),
                    group,
                    model,
                ),
                false => None,
            };
            settle::level_charges(
                &config.budgets,
                levels,
                amounts,
                actual.as_ref(),
                price.as_ref(),
            )
        };
        match reservation {
            Reservation::None => None,
            Reservation::Pending => {
                flow.reservation = Reservation::Pending;
                None
            }
            Reservation::Redis {
                key,
                levels,
                amounts,
            } => Some(JournalEntry::Reconcile {
                reservation: key,
                keys: levels.iter().map(|l| l.key.clone()).collect(),
                actual: actual_of(&levels, &amounts),
            }),
            Reservation::Journaled {
                marker,
                levels,
                amounts,
            } => Some(JournalEntry::Charge {
                marker,
                keys: levels.iter().map(|l| l.key.clone()).collect(),
                amounts: actual_of(&levels, &amounts),
                expire_at_ms: levels.iter().map(|l| l.expire_at_ms).collect(),
            }),
            Reservation::Local { levels, amounts } => {
                let actual = actual_of(&levels, &amounts);
                let lost = settle_locally(env, &levels, &amounts, &actual);
                if lost > 0 {
                    self.count("local_budget_lost", u64::try_from(lost).unwrap_or(0));
                    self.log(
                        LogLevel::Warn,
                        "a per-instance budget settlement could not be written".into(),
                    );
                }
                None
            }
        }
    }

    /// Sends a reconcile or charge, or journals it while Redis is unreachable. Over HTTP it
    /// waits in the outbox for the next tick, whose root context outlives the request
    /// (journaled if the outbox is full).
    pub(super) fn settle_entry(&mut self, env: &dyn Env, now: u64, entry: JournalEntry) {
        if self.http {
            if self.outbox.len() < MAX_CALLS {
                self.outbox.push(entry);
                return;
            }
            self.journal(env, entry);
            return;
        }
        self.settle_entry_now(env, now, entry);
    }

    pub(super) fn settle_entry_now(&mut self, env: &dyn Env, now: u64, entry: JournalEntry) {
        let rules = Rc::clone(&self.rules);
        let Some(redis) = rules.configs().find_map(|c| c.redis.as_ref()) else {
            return;
        };
        if self.redis_down(env, now) {
            self.journal(env, entry);
            return;
        }
        let clock = rules.configs().next().map_or(0, |c| clock_arg(c, now));
        let (script, keys, args) = entry_command(&entry, clock);
        let call = Call {
            kind: CallKind::Settle {
                entry: entry.clone(),
            },
            script,
            keys,
            args,
            service: redis.service.clone(),
            resent: false,
        };
        if self.send(env, now, call, 0).is_err() {
            self.journal(env, entry);
        }
    }

    pub(super) fn journal(&mut self, env: &dyn Env, entry: JournalEntry) {
        let capacity = self
            .rules
            .configs()
            .map(|c| c.journal_capacity)
            .max()
            .unwrap_or(1024);
        let stored = update(env, JOURNAL_KEY, &Journal::default().encode(), |v| {
            let mut journal = Journal::decode(v);
            if journal.push(entry.clone(), capacity) {
                (Some(journal.encode()), true)
            } else {
                (None, false)
            }
        })
        .unwrap_or(false);
        if stored {
            self.count("journal_appended", 1);
        } else {
            self.count("journal_overflow", 1);
            self.log(
                LogLevel::Error,
                "budget journal full: a settlement is lost (raise journal_capacity)".into(),
            );
        }
    }
}

/// The script, keys and arguments of a journal entry.
pub(super) fn entry_command(
    entry: &JournalEntry,
    clock: u64,
) -> (&'static Script, Vec<String>, Vec<i64>) {
    match entry {
        JournalEntry::Reconcile {
            reservation,
            keys,
            actual,
        } => {
            let mut all = vec![reservation.clone()];
            all.extend(keys.iter().cloned());
            let mut args = vec![wire(actual.len() as u64)];
            args.extend(actual.iter().map(|a| wire(*a)));
            args.push(wire(clock));
            (scripts::reconcile(), all, args)
        }
        JournalEntry::Charge {
            marker,
            keys,
            amounts,
            expire_at_ms,
        } => {
            let mut all = vec![marker.clone()];
            all.extend(keys.iter().cloned());
            let mut args = vec![
                wire(budget::EXPIRY_GRACE_MS * 7),
                wire(amounts.len() as u64),
            ];
            args.extend(amounts.iter().map(|a| wire(*a)));
            args.extend(expire_at_ms.iter().map(|a| wire(*a)));
            args.push(wire(clock));
            (scripts::charge(), all, args)
        }
        JournalEntry::Cancel {
            reservation,
            keys,
            ttl_ms,
        } => {
            let mut all = vec![reservation.clone()];
            all.extend(keys.iter().cloned());
            let args = vec![wire(*ttl_ms), wire(keys.len() as u64), wire(clock)];
            (scripts::cancel(), all, args)
        }
    }
}
