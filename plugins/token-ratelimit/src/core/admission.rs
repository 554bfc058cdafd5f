//! Admission: Redis health, sending calls, buckets and leases, budget reservations and the
//! budget fallback.

use super::store::{reserve_locally, settle_bucket, take, want};
use super::*;

impl Core {
    pub(super) fn redis_down(&self, env: &dyn Env, now: u64) -> bool {
        match env.shared_get(REDIS_KEY) {
            Ok((Some(v), _)) => decode_u64(&v) > now,
            _ => false,
        }
    }

    pub(super) fn mark_down(&mut self, env: &dyn Env, now: u64, why: &str) {
        let rules = Rc::clone(&self.rules);
        let Some(redis) = rules.configs().find_map(|c| c.redis.as_ref()) else {
            return;
        };
        let until = now.saturating_add(u64::from(
            rules
                .configs()
                .map(|c| c.lease.retry_ms)
                .max()
                .unwrap_or(1000),
        ));
        let was_up = update(env, REDIS_KEY, &0u64.to_le_bytes(), |v| {
            let previous = decode_u64(v);
            (Some(until.to_le_bytes().to_vec()), previous <= now)
        })
        .unwrap_or(false);
        self.count("redis_failures", 1);
        if was_up {
            self.count("redis_down", 1);
            self.log(
                LogLevel::Warn,
                format!(
                    "Redis service {} unreachable ({why}): serving from local buckets, then the emergency share; budgets follow on_redis_failure",
                    redis.service
                ),
            );
        }
    }

    pub(super) fn mark_up(&mut self, env: &dyn Env) {
        let was_down = update(env, REDIS_KEY, &0u64.to_le_bytes(), |v| {
            if decode_u64(v) == 0 {
                (None, false)
            } else {
                (Some(0u64.to_le_bytes().to_vec()), true)
            }
        })
        .unwrap_or(false);
        if was_down {
            self.count("redis_recovered", 1);
            self.log(
                LogLevel::Info,
                "Redis reachable again: leasing and replaying the journal".into(),
            );
        }
    }

    pub(super) fn mode(&self, env: &dyn Env, config: &Config, now: u64) -> Mode {
        if config.redis.is_none() {
            Mode::Local
        } else if self.redis_down(env, now) {
            Mode::Emergency
        } else {
            Mode::Leased
        }
    }

    // -----------------------------------------------------------------------------------
    // Sending

    /// Sends a call; gives it back if it could not be sent (Redis is then marked down,
    /// unless too many calls were in flight or the call is too long for webdis).
    pub(super) fn send(
        &mut self,
        env: &dyn Env,
        now: u64,
        call: Call,
        ctx: u32,
    ) -> Result<(), Box<Call>> {
        if self.calls.len() >= MAX_CALLS {
            // never send what could not be tracked: its reply would find no one to resume
            self.count("calls_saturated", 1);
            return Err(Box::new(call));
        }
        let with_source = call.resent || !self.loaded.contains(call.script.name);
        let sent = {
            let keys: Vec<&str> = call.keys.iter().map(String::as_str).collect();
            let args = scripts::command_args(call.script, &keys, &call.args, with_source);
            env.send_redis(&call.service, &args)
        };
        match sent {
            Ok(token) => {
                self.count(
                    format!("redis_calls.{}", call.script.name.to_ascii_lowercase()),
                    1,
                );
                // a table that is full (checked above) or a reused token: the reply finds no
                // one; counted, never silent
                if self.calls.insert(token, ctx, call).is_err() {
                    self.count("calls_saturated", 1);
                }
                Ok(())
            }
            Err(HostError::BadArgument) if self.http => {
                // longer than one webdis request (keys of very long identities): this call
                // only fails, as an error reply would; Redis is not marked down for it
                self.count("webdis_too_large", 1);
                self.log(
                    LogLevel::Warn,
                    format!(
                        "{} not sent: longer than one webdis request",
                        call.script.name
                    ),
                );
                Err(Box::new(call))
            }
            Err(err) => {
                self.mark_down(env, now, &format!("call not sent: {err}"));
                Err(Box::new(call))
            }
        }
    }

    /// A `LEASE` of `want = (min, max)` tokens for one bucket.
    pub(super) fn lease_call(
        config: &Config,
        flow: Option<u32>,
        keys: &BucketKeys,
        spec: Spec,
        want: (u64, u64),
        now: u64,
    ) -> Option<Call> {
        let redis = config.redis.as_ref()?;
        let (want_min, want_max) = want;
        let want_min = want_min.clamp(1, spec.amount.max(1));
        Some(Call {
            kind: CallKind::Lease {
                flow,
                local_key: keys.local.clone(),
                owner: keys.owner,
                spec,
                want_min,
            },
            script: scripts::lease(),
            keys: vec![keys.redis.clone()],
            args: vec![
                wire(spec.amount),
                wire(spec.window_ms),
                wire(want_min),
                wire(want_max.clamp(want_min, spec.amount.max(want_min))),
                wire(clock_arg(config, now)),
            ],
            service: redis.service.clone(),
            resent: false,
        })
    }

    // -----------------------------------------------------------------------------------
    // Admission

    /// Carries a request's admission as far as it can go without waiting.
    pub(super) fn advance(&mut self, env: &dyn Env, now: u64, id: u32) -> Step {
        let Some(mut flow) = self.flows.remove(&id) else {
            return Step::Continue;
        };
        let step = self.advance_flow(env, now, id, &mut flow);
        match step {
            // a lease could not be sent: the same limit again, in emergency mode
            Err(()) => {
                self.flows.insert(id, flow);
                self.advance(env, now, id)
            }
            Ok(step) => {
                self.flows.insert(id, flow);
                step
            }
        }
    }

    /// One pass of [`Core::advance`]; `Err` when a lease could not be sent.
    pub(super) fn advance_flow(
        &mut self,
        env: &dyn Env,
        now: u64,
        id: u32,
        flow: &mut Flow,
    ) -> Result<Step, ()> {
        let rules = Rc::clone(&self.rules);
        let Some(config) = rules.configs().nth(flow.config) else {
            return Ok(Step::Continue);
        };
        let tokens = flow.cost.as_ref().map_or(0, Cost::tokens);
        let group = flow.identity.model_group.clone();

        // Soft limits. The mode is read once per pass (Redis health is one shared-data read);
        // a lease that cannot be sent starts a new pass in emergency mode.
        let mode = if flow.emergency && config.redis.is_some() {
            Mode::Emergency
        } else {
            self.mode(env, config, now)
        };
        while let Some(limit) = config.limits.get(flow.next_limit) {
            let index = flow.next_limit;
            if !limit.applies_to(group.as_deref()) {
                flow.next_limit += 1;
                continue;
            }
            let Some(keys) = budget::bucket_keys_with(limit, &flow.identity, &mut self.owners)
            else {
                flow.next_limit += 1;
                continue;
            };
            let units = match limit.unit {
                Unit::Requests => 1,
                Unit::Tokens => tokens,
            };
            let amount = limit.amount_for(flow.identity.tier());
            let spec = spec_of(config, index, amount);
            match take(env, &keys, mode, &spec, units, now) {
                Ok((
                    Take::Admit {
                        wants_lease,
                        emergency,
                    },
                    remaining,
                )) => {
                    if wants_lease {
                        want(env, &keys, amount);
                    }
                    if emergency {
                        self.count(format!("emergency_admits.{}", limit.name), 1);
                    }
                    flow.taken.push(Taken {
                        local_key: keys.local,
                        limit: index,
                        amount,
                        units,
                    });
                    flow.rate.push((limit.unit, amount, remaining));
                    flow.next_limit += 1;
                }
                Ok((
                    Take::Reject {
                        retry_after_ms,
                        never,
                    },
                    _,
                )) => {
                    self.count(format!("rate_limited.{}", limit.name), 1);
                    let reject = decide::rate_limited(limit, amount, units, retry_after_ms, never);
                    self.give_back_all(env, flow, config, now);
                    return Ok(Step::Refuse(reject));
                }
                Ok((Take::Lease { want_min, want_max }, _)) => {
                    let Some(call) =
                        Self::lease_call(config, Some(id), &keys, spec, (want_min, want_max), now)
                    else {
                        flow.next_limit += 1;
                        continue;
                    };
                    let sent = self.send(env, now, call, id).is_ok();
                    flow.waiting = sent;
                    flow.emergency = !sent;
                    if sent {
                        return Ok(Step::Wait);
                    }
                    // not sent (Redis marked down, or too many calls in flight)
                    return Err(());
                }
                Err(err) => {
                    // no shared data: fail open for this limit, say so
                    self.log(
                        LogLevel::Warn,
                        format!("bucket {} unavailable: {err}", limit.name),
                    );
                    flow.next_limit += 1;
                }
            }
        }

        // Hard budgets: model calls only (a request that generates nothing costs nothing).
        let model_call = flow.cost.as_ref().is_some_and(Cost::is_model_call);
        if model_call && matches!(flow.reservation, Reservation::None) && !flow.admitted {
            let levels = budget::levels(&config.budgets, &flow.identity, now);
            if !levels.is_empty() {
                let route = env.route_info(id);
                let router_price = route
                    .as_ref()
                    .and_then(|r| r.price_ceiling.clone().or_else(|| r.price.clone()));
                let model = flow.cost.as_ref().and_then(|c| c.model.clone());
                let ceiling =
                    config.price_for(router_price.as_ref(), group.as_deref(), model.as_deref());
                let (prompt, cap) = flow
                    .cost
                    .as_ref()
                    .map_or((0, 0), |c| (c.prompt, c.output_cap));
                let mut amounts = Vec::with_capacity(levels.len());
                for level in &levels {
                    let Some(b) = config.budgets.get(level.budget) else {
                        continue;
                    };
                    match budget::reserve_amount(b, prompt, cap, ceiling.as_ref()) {
                        Ok(amount) => amounts.push(amount),
                        Err(budget::Unpriced) => {
                            self.give_back_all(env, flow, config, now);
                            return Ok(Step::Refuse(decide::unpriced(b)));
                        }
                    }
                }
                if let Some(step) = self.reserve(env, now, id, flow, config, levels, amounts, None)
                {
                    return Ok(step);
                }
            }
        }
        flow.admitted = true;
        self.count("admitted", 1);
        Ok(Step::Continue)
    }

    /// Starts a reservation. `Some(Wait)` when a call went out, `Some(Refuse)` when refused,
    /// `None` when reserved (or nothing to do) synchronously.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reserve(
        &mut self,
        env: &dyn Env,
        now: u64,
        id: u32,
        flow: &mut Flow,
        config: &Config,
        levels: Vec<Level>,
        amounts: Vec<u64>,
        alternative: Option<Box<Alternative>>,
    ) -> Option<Step> {
        let Some(redis) = config.redis.as_ref() else {
            return match reserve_locally(env, &levels, &amounts) {
                Ok(spent) => {
                    self.note_warnings(flow, config, &levels, &spent);
                    if let Some(alt) = alternative {
                        self.switch(id, flow, &alt);
                    }
                    flow.reservation = Reservation::Local { levels, amounts };
                    None
                }
                Err((index, remaining)) => self.refused(
                    env,
                    now,
                    id,
                    flow,
                    config,
                    &levels,
                    &amounts,
                    (index, remaining),
                    alternative.is_some(),
                ),
            };
        };
        if self.redis_down(env, now) {
            return self.without_redis(env, now, flow, config, levels, amounts);
        }
        let key = budget::reservation_key(&flow.identity, &flow.request_id);
        let mut args = vec![wire(config.reservation_ttl_ms), wire(levels.len() as u64)];
        for (level, amount) in levels.iter().zip(&amounts) {
            args.extend([wire(*amount), wire(level.limit), wire(level.expire_at_ms)]);
        }
        args.push(wire(clock_arg(config, now)));
        let mut keys = vec![key.clone()];
        keys.extend(levels.iter().map(|l| l.key.clone()));
        let call = Call {
            kind: CallKind::Reserve {
                flow: id,
                levels: levels.clone(),
                amounts: amounts.clone(),
                key,
                alternative,
            },
            script: scripts::reserve(),
            keys,
            args,
            service: redis.service.clone(),
            resent: false,
        };
        flow.reservation = Reservation::Pending;
        if self.send(env, now, call, id).is_ok() {
            return Some(Step::Wait);
        }
        flow.reservation = Reservation::None;
        self.without_redis(env, now, flow, config, levels, amounts)
    }

    /// Budgets while Redis is unreachable: `reject` refuses, `allow` journals.
    pub(super) fn without_redis(
        &mut self,
        env: &dyn Env,
        now: u64,
        flow: &mut Flow,
        config: &Config,
        levels: Vec<Level>,
        amounts: Vec<u64>,
    ) -> Option<Step> {
        for level in &levels {
            if let Some(b) = config.budgets.get(level.budget) {
                if b.on_redis_failure == OnRedisFailure::Reject {
                    self.count(format!("budget_unavailable.{}", b.name), 1);
                    self.give_back_all(env, flow, config, now);
                    return Some(Step::Refuse(decide::budget_unavailable(b)));
                }
            }
        }
        let depth = env
            .shared_get(JOURNAL_KEY)
            .ok()
            .and_then(|(v, _)| v)
            .map_or(0, |v| Journal::decode(&v).entries.len());
        if depth >= config.journal_capacity {
            self.count("journal_overflow", 1);
            self.give_back_all(env, flow, config, now);
            return Some(Step::Refuse(decide::journal_full()));
        }
        self.count("budget_fail_open", 1);
        flow.reservation = Reservation::Journaled {
            marker: budget::marker_key(&flow.identity, &flow.request_id),
            levels,
            amounts,
        };
        None
    }

    /// A level refused (`refusal`: its index and what it had left): try the budget fallback
    /// once, else 402.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn refused(
        &mut self,
        env: &dyn Env,
        now: u64,
        id: u32,
        flow: &mut Flow,
        config: &Config,
        levels: &[Level],
        amounts: &[u64],
        refusal: (usize, i64),
        was_alternative: bool,
    ) -> Option<Step> {
        let (index, remaining) = refusal;
        if !was_alternative && !flow.alternative_tried {
            flow.alternative_tried = true;
            if let Some(alt) = env.alternative(id) {
                let price = alt
                    .route
                    .price_ceiling
                    .clone()
                    .or_else(|| alt.route.price.clone());
                let (prompt, cap) = flow
                    .cost
                    .as_ref()
                    .map_or((0, 0), |c| (c.prompt, c.output_cap));
                // the budgets of the group switched to: one scoped to the refused group
                // only does not count a request sent elsewhere
                let switched = Identity {
                    model_group: Some(alt.group().to_string()),
                    ..flow.identity.clone()
                };
                let alt_levels = budget::levels(&config.budgets, &switched, now);
                let priced: Option<Vec<u64>> = alt_levels
                    .iter()
                    .map(|l| {
                        let b = config.budgets.get(l.budget)?;
                        budget::reserve_amount(b, prompt, cap, price.as_ref()).ok()
                    })
                    .collect();
                if let Some(alt_amounts) = priced {
                    if alt_levels.is_empty() {
                        // no budget counts the other group: switch, nothing to reserve
                        self.switch(id, flow, &alt);
                        return None;
                    }
                    if (alt_levels.as_slice(), alt_amounts.as_slice()) != (levels, amounts) {
                        return self.reserve(
                            env,
                            now,
                            id,
                            flow,
                            config,
                            alt_levels,
                            alt_amounts,
                            Some(Box::new(alt)),
                        );
                    }
                }
            }
        }
        let Some(b) = levels.get(index).and_then(|l| config.budgets.get(l.budget)) else {
            return Some(Step::Refuse(Reject::internal("budget level out of range")));
        };
        self.count(format!("budget_exceeded.{}", b.name), 1);
        let needed = amounts.get(index).copied().unwrap_or(0);
        self.give_back_all(env, flow, config, now);
        Some(Step::Refuse(decide::budget_exhausted(b, needed, remaining)))
    }

    pub(super) fn note_warnings(
        &mut self,
        flow: &mut Flow,
        config: &Config,
        levels: &[Level],
        spent: &[u64],
    ) {
        for (level, spent) in levels.iter().zip(spent) {
            let Some(b) = config.budgets.get(level.budget) else {
                continue;
            };
            if let Some(percent) = decide::warning(b, level.limit, *spent) {
                self.count(format!("budget_warning.{}.{percent}", b.name), 1);
                flow.warnings.push(format!("{}={percent}", b.name));
            }
        }
    }

    /// Applies the router's published alternative: the request now goes to the cheaper group.
    pub(super) fn switch(&mut self, ctx: u32, flow: &mut Flow, alt: &Alternative) {
        self.write_switch(ctx, alt);
        self.count("budget_fallback", 1);
        // the request is the other group's now (group-scoped budgets, prices at settlement)
        flow.identity.model_group = Some(alt.group().to_string());
        flow.switched = Some(Box::new(alt.clone()));
    }

    /// An alternative's switch: filter state, headers, the held body's `model`, and the
    /// route cache.
    pub(super) fn write_switch(&mut self, ctx: u32, alt: &Alternative) {
        let writes = alt.switch_writes();
        for (name, value) in writes.properties {
            let shared = true; // the fused filter's later stages read it from the exchange
            let (name, value) = (name.into(), value);
            self.push(
                ctx,
                Effect::SetProperty {
                    name,
                    value,
                    shared,
                },
            );
        }
        for (name, value) in writes.set_headers {
            self.push(ctx, Effect::SetHeader(Map::Request, name.into(), value));
        }
        for name in writes.remove_headers {
            self.push(ctx, Effect::RemoveHeader(Map::Request, name.into()));
        }
        self.push(ctx, Effect::Own(Own::RewriteModel(writes.model)));
        self.push(ctx, Effect::ClearRouteCache);
    }

    /// Gives every taken unit back (the request was refused or never forwarded).
    pub(super) fn give_back_all(
        &mut self,
        env: &dyn Env,
        flow: &mut Flow,
        config: &Config,
        now: u64,
    ) {
        for taken in flow.taken.drain(..) {
            let spec = spec_of(config, taken.limit, taken.amount);
            let mode = self.mode(env, config, now);
            let units = i64::try_from(taken.units).unwrap_or(0);
            if settle_bucket(env, &taken.local_key, mode, &spec, units, now).is_err() {
                // soft limits are eventually consistent: the bucket refills with its window
                self.count("bucket_refund_lost", 1);
            }
        }
        flow.rate.clear();
    }
}
