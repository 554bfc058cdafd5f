//! Redis replies: decoding, `NOSCRIPT` resends, failures, and resuming the waiting request.

use super::store::lease_failed;
use super::*;

impl Core {
    pub(super) fn on_reply(
        &mut self,
        env: &dyn Env,
        now: u64,
        ctx: u32,
        call: Call,
        reply: Result<Vec<u8>, String>,
    ) {
        let reply = match reply {
            Ok(reply) => reply,
            Err(why) => {
                self.mark_down(env, now, &why);
                // sent, then no answer: it may have run (or run later)
                self.call_failed(env, now, call, Sent::Unanswered);
                return;
            }
        };
        self.mark_up(env);
        let outcome = match &call.kind {
            CallKind::Lease { .. } => scripts::decode_lease(&reply).map(Reply::Lease),
            CallKind::Reserve { levels, .. } => {
                scripts::decode_reserve(&reply, levels.len()).map(Reply::Reserve)
            }
            CallKind::Settle { .. } | CallKind::Replay { .. } => {
                if std::ptr::eq(call.script, scripts::charge()) {
                    scripts::decode_charge(&reply).map(|_| Reply::Done)
                } else if std::ptr::eq(call.script, scripts::cancel()) {
                    scripts::decode_cancel(&reply, call.keys.len().saturating_sub(1))
                        .map(|_| Reply::Done)
                } else {
                    scripts::decode_reconcile(&reply, call.keys.len().saturating_sub(1))
                        .map(|_| Reply::Done)
                }
            }
        };
        match outcome {
            Err(ScriptError::NoScript) if !call.resent => {
                self.loaded.remove(call.script.name);
                // resent with its source; a failed send fails the call the usual way, so a
                // waiting request is never left paused
                let call = Call {
                    resent: true,
                    ..call
                };
                if let Err(call) = self.send(env, now, call, ctx) {
                    self.call_failed(env, now, *call, Sent::Not);
                }
            }
            Err(err) => {
                self.log(
                    LogLevel::Warn,
                    format!("{} failed: {err}", call.script.name),
                );
                self.count("redis_errors", 1);
                // an error reply: the script changed nothing
                self.call_failed(env, now, call, Sent::Not);
            }
            Ok(reply) => {
                self.loaded.insert(call.script.name);
                self.call_answered(env, now, call, reply);
            }
        }
    }

    pub(super) fn call_failed(&mut self, env: &dyn Env, now: u64, call: Call, sent: Sent) {
        if let (CallKind::Reserve { key, levels, .. }, Sent::Unanswered) = (&call.kind, sent) {
            self.cancel_reservation(env, now, key, levels);
        }
        match call.kind {
            CallKind::Lease {
                flow, local_key, ..
            } => {
                lease_failed(env, &local_key);
                if let Some(flow) = flow {
                    // this request goes on in emergency mode (never a second lease: a
                    // script error would repeat)
                    if let Some(f) = self.flows.get_mut(&flow) {
                        f.emergency = true;
                    }
                    self.resume(env, now, flow);
                }
            }
            CallKind::Reserve {
                flow: id,
                levels,
                amounts,
                ..
            } => {
                let Some(mut flow) = self.flows.remove(&id) else {
                    return;
                };
                flow.reservation = Reservation::None;
                if flow.abandoned {
                    return;
                }
                let rules = Rc::clone(&self.rules);
                let Some(config) = rules.configs().nth(flow.config) else {
                    self.flows.insert(id, flow);
                    return;
                };
                let step = self.without_redis(env, now, &mut flow, config, levels, amounts);
                self.flows.insert(id, flow);
                self.finish_step(env, now, id, step);
            }
            CallKind::Settle { entry } => self.journal(env, entry),
            CallKind::Replay { seq } => {
                self.replaying.remove(&seq);
            }
        }
    }

    /// A `RESERVE` went unanswered: it may have deducted its amounts (now, or later when a
    /// slow Redis gets to it). Its `CANCEL` (sent now, or journaled while Redis counts as
    /// down) gives them back and makes a late one a no-op; the request itself goes on as if
    /// Redis were unreachable.
    pub(super) fn cancel_reservation(
        &mut self,
        env: &dyn Env,
        now: u64,
        key: &str,
        levels: &[Level],
    ) {
        self.count("reserve_unanswered", 1);
        let ttl_ms = self
            .rules
            .configs()
            .map(|c| c.reservation_ttl_ms)
            .max()
            .unwrap_or(3_600_000);
        let entry = JournalEntry::Cancel {
            reservation: key.to_string(),
            keys: levels.iter().map(|l| l.key.clone()).collect(),
            ttl_ms,
        };
        self.settle_entry(env, now, entry);
    }

    pub(super) fn call_answered(&mut self, env: &dyn Env, now: u64, call: Call, reply: Reply) {
        match (call.kind, reply) {
            (
                CallKind::Lease {
                    flow,
                    local_key,
                    owner,
                    spec,
                    want_min,
                },
                Reply::Lease(lease),
            ) => {
                let seed = Local::new(Mode::Leased, &spec, now).encode();
                let stored = update(env, &local_key, &seed, |v| {
                    let mut local =
                        Local::decode(v).unwrap_or_else(|| Local::new(Mode::Leased, &spec, now));
                    if local.owner != owner && local.owner != 0 {
                        // the slot changed hands: these tokens were the previous owner's
                        return (None, ());
                    }
                    local.add_lease(lease.granted, want_min, lease.wait_ms, now);
                    (Some(local.encode().to_vec()), ())
                });
                if let Err(err) = stored {
                    // the granted tokens stay in Redis's bucket until its window refills
                    self.count("lease_lost", 1);
                    self.log(LogLevel::Warn, format!("leased tokens not stored: {err}"));
                }
                // past `i64::MAX` the host's counter cannot take it: nothing counted, as always
                let granted = Some(lease.granted).filter(|g| i64::try_from(*g).is_ok());
                self.count("leased_tokens", granted.unwrap_or(0));
                if let Some(flow) = flow {
                    self.resume(env, now, flow);
                }
            }
            (
                CallKind::Reserve {
                    flow: id,
                    levels,
                    amounts,
                    key,
                    alternative,
                },
                Reply::Reserve(result),
            ) => {
                let Some(mut flow) = self.flows.remove(&id) else {
                    return;
                };
                let rules = Rc::clone(&self.rules);
                let Some(config) = rules.configs().nth(flow.config) else {
                    self.flows.insert(id, flow);
                    return;
                };
                let step = match result {
                    scripts::Reserve::Reserved { remaining }
                    | scripts::Reserve::Replayed { remaining } => {
                        let spent = settle::spent_after(&levels, &remaining);
                        if flow.abandoned {
                            // the client went away while we reserved: give it all back
                            let entry = JournalEntry::Reconcile {
                                reservation: key,
                                keys: levels.iter().map(|l| l.key.clone()).collect(),
                                actual: vec![0; levels.len()],
                            };
                            self.settle_entry(env, now, entry);
                            return;
                        }
                        self.note_warnings(&mut flow, config, &levels, &spent);
                        if let Some(alt) = alternative {
                            self.switch(id, &mut flow, &alt);
                        }
                        flow.reservation = Reservation::Redis {
                            key,
                            levels,
                            amounts,
                        };
                        None
                    }
                    scripts::Reserve::Refused { level, remaining } => {
                        flow.reservation = Reservation::None;
                        if flow.abandoned {
                            return;
                        }
                        self.refused(
                            env,
                            now,
                            id,
                            &mut flow,
                            config,
                            &levels,
                            &amounts,
                            (level, remaining),
                            alternative.is_some(),
                        )
                    }
                };
                self.flows.insert(id, flow);
                match step {
                    None => self.resume(env, now, id),
                    Some(step) => self.finish_step(env, now, id, Some(step)),
                }
            }
            (CallKind::Replay { seq }, Reply::Done) => {
                self.replaying.remove(&seq);
                let removed = update(env, JOURNAL_KEY, &[], |v| {
                    let mut journal = Journal::decode(v);
                    journal.remove(seq);
                    (Some(journal.encode()), ())
                });
                match removed {
                    Ok(()) => self.count("journal_replayed", 1),
                    // still journaled: replayed again, which the scripts make a no-op
                    Err(err) => self.log(
                        LogLevel::Warn,
                        format!("replayed journal entry not removed: {err}"),
                    ),
                }
            }
            (CallKind::Settle { .. }, Reply::Done) => self.count("reconciled", 1),
            _ => {}
        }
    }

    /// Resumes a waiting request: continue its admission from where it stopped.
    pub(super) fn resume(&mut self, env: &dyn Env, now: u64, id: u32) {
        let abandoned = match self.flows.get_mut(&id) {
            Some(flow) => {
                flow.waiting = false;
                flow.abandoned
            }
            None => true,
        };
        if abandoned {
            self.flows.remove(&id);
            return;
        }
        let step = self.advance(env, now, id);
        self.finish_step(env, now, id, Some(step));
    }

    /// Applies the outcome of an asynchronous step to a paused request (`None`: reserved,
    /// carry on; no more waiting steps after budgets).
    pub(super) fn finish_step(&mut self, env: &dyn Env, now: u64, id: u32, step: Option<Step>) {
        let step = match step {
            None => self.advance(env, now, id),
            Some(step) => step,
        };
        self.finish(id, step);
    }
}
