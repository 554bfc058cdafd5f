//! The proxy-wasm adapter. Every host call goes through `llm_gateway_shared::host`; the
//! decisions are [`crate::bucket`], [`crate::budget`], [`crate::cost`] and [`crate::decide`].
//!
//! Request path (headers held until the end of the body: the Envoy filter needs
//! `allow_on_headers_stop_iteration: true`):
//! 1. read the body, compute its cost, inject the output cap ([`crate::cost`]);
//! 2. take the cost from every applicable soft limit's bucket in shared data; a leased bucket
//!    that cannot cover it waits for one synchronous `LEASE`;
//! 3. reserve every applicable budget level at once (`RESERVE`, or CAS in shared data in
//!    the plain-Envoy build); refused: the group's budget fallback if the router published one,
//!    else 402.
//!
//! `on_log` settles, exactly once per logical request: unused tokens go back to the buckets, the
//! reservation is reconciled (`RECONCILE`) with the usage record usage-accounting published
//! (it runs before this filter's `on_log`, being earlier in the chain). A reconcile that
//! cannot reach Redis is journaled in shared data and replayed by the instance's sync worker,
//! elected with a lease in shared data, which also tops up leased buckets on its tick.
//!
//! After an internal redirect ([`crate::reentry`]): a superseded pass stashes its [`Flow`]
//! in the VM's stash instead of settling; the re-entering pass adopts it and settles it.
//!
//! Redis commands travel by Higress's Redis calls or over HTTP to webdis
//! ([`RedisTransport`]); only [`State::transmit`] and the two reply entry points know which.
//! Over HTTP, the SDK hands an answer to the context that sent the call and drops it once that
//! context is gone, so settlements (sent from `on_log`) wait in the VM's outbox and leave from
//! the root context's next tick, and a request that goes away while it waits fails its calls
//! at once (a `RESERVE` is cancelled, as when Redis never answers).

use crate::bucket::{Local, Mode, Spec, Take};
use crate::budget::{self, BucketKeys, Identity, Journal, JournalEntry, Level};
use crate::config::{
    parse_document, Clock, Config, OnRedisFailure, RedisConfig, RedisTransport, Unit,
};
use crate::cost::{self, Cost};
use crate::decide;
use crate::reentry::{self, AtLog};
use crate::scripts::{self, Script, ScriptError};
use crate::settle;
use llm_gateway_shared::headers;
use llm_gateway_shared::host::webdis::HttpRedis;
use llm_gateway_shared::host::{self, Buffer, HeaderMap, HostError, LogLevel, Metric};
use llm_gateway_shared::pending::Pending;
use llm_gateway_shared::reentry::{is_superseded, Pass, Stash};
use llm_gateway_shared::reject::Reject;
use llm_gateway_shared::resp;
use llm_gateway_shared::route_info::{
    Alternative, RouteInfo, BUDGET_FALLBACK_PROPERTY, PROPERTY as ROUTE_PROPERTY,
};
use llm_gateway_shared::rules::RuleSet;
use llm_gateway_shared::usage_record::Record;
use llm_gateway_shared::webdis::WebdisError;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

const PLUGIN: &str = "token_ratelimit";
/// Shared data: the sync worker's lease (owner nonce, until).
const SYNC_KEY: &str = "trl:sync";
/// Shared data: buckets waiting for a top-up, one key per line.
const WANT_KEY: &str = "trl:want";
/// Shared data: Redis marked unreachable until (ms).
const REDIS_KEY: &str = "trl:redis";
/// Shared data: the budget journal ([`Journal`]).
const JOURNAL_KEY: &str = "trl:journal";
/// Shared data prefix of per-instance budget levels (plain-Envoy build).
const LOCAL_BUDGET_PREFIX: &str = "trl:bud:";
const MAX_WANT: usize = 4096;
/// Redis calls one VM keeps in flight (more: handled as if Redis were unreachable).
const MAX_CALLS: usize = 4096;
const REPLAY_BATCH: usize = 32;
const METRIC_PREFIX: &str = "llm_gateway.ratelimit.";

// The standalone module's entry point; a module holding several plugins (`plugins/bundle`)
// turns the `standalone` feature off and creates this plugin's root context with
// [`root_context`].
#[cfg(feature = "standalone")]
proxy_wasm::main! {{
    proxy_wasm::set_root_context(root_context);
}}

/// A root context of this plugin (what the standalone module creates for every `root_id`).
pub fn root_context(_context_id: u32) -> Box<dyn RootContext> {
    Box::new(Root::default())
}

fn log(level: LogLevel, message: &str) {
    host::log(level, &format!("token-ratelimit: {message}"));
}

fn now_ms() -> u64 {
    host::now_nanos().unwrap_or_default() / 1_000_000
}

// ---------------------------------------------------------------------------------------
// State shared by the root context and the HTTP contexts of one VM

/// One bucket a request took from.
#[derive(Debug, Clone)]
struct Taken {
    local_key: String,
    limit: usize,
    units: u64,
}

/// Where a request's budget reservation stands.
#[derive(Debug, Clone, Default)]
enum Reservation {
    /// No budget applies (or not yet looked at).
    #[default]
    None,
    /// A `RESERVE` is in flight.
    Pending,
    /// Reserved in Redis.
    Redis {
        key: String,
        levels: Vec<Level>,
        amounts: Vec<u64>,
    },
    /// Served while Redis was unreachable (`on_redis_failure: allow`): charged once it is back.
    Journaled {
        marker: String,
        levels: Vec<Level>,
        amounts: Vec<u64>,
    },
    /// Reserved in this instance's shared data (plain-Envoy build).
    Local {
        levels: Vec<Level>,
        amounts: Vec<u64>,
    },
}

/// A request's progress.
#[derive(Debug, Default)]
struct Flow {
    config: usize,
    identity: Identity,
    request_id: String,
    path: String,
    cost: Option<Cost>,
    /// Limits already looked at (admission resumes from here after a lease).
    next_limit: usize,
    taken: Vec<Taken>,
    /// (unit, amount, remaining) of every bucket taken, for the response headers.
    rate: Vec<(Unit, u64, u64)>,
    reservation: Reservation,
    /// The budget fallback was tried.
    alternative_tried: bool,
    /// The group the budget fallback switched to.
    switched_to: Option<String>,
    /// The budget fallback applied (a re-entering pass writes it again).
    switched: Option<Box<Alternative>>,
    /// Adopted from a superseded pass: admitted there, its body still awaits the same edits.
    reentered: bool,
    /// `request_id` is the logical id (`x-llm-request-id`), so a re-entering pass can find
    /// this admission in the stash.
    logical: bool,
    warnings: Vec<String>,
    /// The request went on upstream.
    admitted: bool,
    /// A lease for this request is in flight.
    waiting: bool,
    /// A lease could not be sent for this request: its buckets run in emergency mode.
    emergency: bool,
    /// `on_log` ran while a call was in flight: the reply only cleans up.
    abandoned: bool,
}

enum Step {
    Continue,
    Wait,
    Refuse(Reject),
}

/// A Redis call in flight: enough to resend it with `EVAL` after `NOSCRIPT`.
struct Call {
    kind: CallKind,
    script: &'static Script,
    keys: Vec<String>,
    args: Vec<i64>,
    service: String,
    resent: bool,
}

enum CallKind {
    /// A bucket lease; `flow` is the waiting request (none: the sync worker's top-up).
    Lease {
        flow: Option<u32>,
        local_key: String,
        /// The identity the lease is for (its slot may have changed hands meanwhile).
        owner: u64,
        spec: Spec,
        want_min: u64,
    },
    /// A request's reservation.
    Reserve {
        flow: u32,
        levels: Vec<Level>,
        amounts: Vec<u64>,
        key: String,
        alternative: Option<Box<Alternative>>,
    },
    /// A reconcile or a charge from `on_log`: journaled if it fails.
    Settle { entry: JournalEntry },
    /// A journal entry replayed by the sync worker.
    Replay { seq: u64 },
}

struct State {
    rules: RuleSet<Config>,
    /// This VM's id in the sync election.
    nonce: u64,
    flows: RefCell<HashMap<u32, Flow>>,
    calls: RefCell<Pending<Call>>,
    /// Scripts this VM knows Redis has cached (else `EVAL` with the source).
    loaded: RefCell<HashSet<&'static str>>,
    replaying: RefCell<HashSet<u64>>,
    metrics: RefCell<HashMap<String, Option<Metric>>>,
    /// Admissions of superseded passes, waiting for their re-entering pass.
    stash: RefCell<Stash<Flow>>,
    /// The webdis cluster, when Redis is reached over HTTP.
    http: Option<HttpRedis>,
    /// Settlements waiting for the root context's tick (HTTP transport).
    outbox: RefCell<Vec<JournalEntry>>,
}

impl State {
    fn config(&self, index: usize) -> Option<&Config> {
        self.rules.configs().nth(index)
    }

    /// The Redis connection of the instance (the first scope that has one).
    fn redis(&self) -> Option<&RedisConfig> {
        self.rules.configs().find_map(|c| c.redis.as_ref())
    }

    fn count(&self, name: &str, delta: i64) {
        let mut metrics = self.metrics.borrow_mut();
        let metric = metrics
            .entry(name.to_string())
            .or_insert_with(|| Metric::counter(&format!("{METRIC_PREFIX}{name}")).ok());
        if let Some(metric) = metric {
            let _ = metric.increment(delta);
        }
    }

    fn gauge(&self, name: &str, value: u64) {
        let mut metrics = self.metrics.borrow_mut();
        let metric = metrics
            .entry(format!("gauge:{name}"))
            .or_insert_with(|| Metric::gauge(&format!("{METRIC_PREFIX}{name}")).ok());
        if let Some(metric) = metric {
            let _ = metric.record(value);
        }
    }

    // -----------------------------------------------------------------------------------
    // Redis health (per instance)

    fn redis_down(&self, now: u64) -> bool {
        match host::shared_data(REDIS_KEY) {
            Ok((Some(v), _)) => decode_u64(&v) > now,
            _ => false,
        }
    }

    fn mark_down(&self, why: &str) {
        let Some(redis) = self.redis() else { return };
        let now = now_ms();
        let until = now.saturating_add(u64::from(
            self.rules
                .configs()
                .map(|c| c.lease.retry_ms)
                .max()
                .unwrap_or(1000),
        ));
        let was_up = host::update_shared_data(REDIS_KEY, &0u64.to_le_bytes(), |v| {
            let previous = decode_u64(v);
            (Some(until.to_le_bytes().to_vec()), previous <= now)
        })
        .unwrap_or(false);
        self.count("redis_failures", 1);
        if was_up {
            self.count("redis_down", 1);
            log(
                LogLevel::Warn,
                &format!(
                    "Redis service {} unreachable ({why}): serving from local buckets, then the emergency share; budgets follow on_redis_failure",
                    redis.service
                ),
            );
        }
    }

    fn mark_up(&self) {
        let was_down = host::update_shared_data(REDIS_KEY, &0u64.to_le_bytes(), |v| {
            if decode_u64(v) == 0 {
                (None, false)
            } else {
                (Some(0u64.to_le_bytes().to_vec()), true)
            }
        })
        .unwrap_or(false);
        if was_down {
            self.count("redis_recovered", 1);
            log(
                LogLevel::Info,
                "Redis reachable again: leasing and replaying the journal",
            );
        }
    }

    fn mode(&self, config: &Config, now: u64) -> Mode {
        if config.redis.is_none() {
            Mode::Local
        } else if self.redis_down(now) {
            Mode::Emergency
        } else {
            Mode::Leased
        }
    }

    fn clock_arg(config: &Config, now: u64) -> u64 {
        match config.clock {
            Clock::Redis => 0,
            Clock::Gateway => now,
        }
    }

    // -----------------------------------------------------------------------------------
    // Sending

    /// Sends a call; gives it back if it could not be sent (Redis is then marked down,
    /// unless too many calls were in flight).
    fn send(&self, call: Call, context_id: u32) -> Result<(), Box<Call>> {
        if self.calls.borrow().len() >= MAX_CALLS {
            // never send what could not be tracked: its reply would find no one to resume
            self.count("calls_saturated", 1);
            return Err(Box::new(call));
        }
        let with_source = call.resent || !self.loaded.borrow().contains(call.script.name);
        match self.transmit(&call, with_source) {
            Ok(token) => {
                self.count(
                    &format!("redis_calls.{}", call.script.name.to_ascii_lowercase()),
                    1,
                );
                // cannot fail: checked above, and tokens are unique
                let _ = self.calls.borrow_mut().insert(token, context_id, call);
                Ok(())
            }
            Err(HostError::BadArgument) if self.http.is_some() => {
                // longer than one webdis request (keys of very long identities): this call
                // only fails, as an error reply would; Redis is not marked down for it
                self.count("webdis_too_large", 1);
                log(
                    LogLevel::Warn,
                    &format!(
                        "{} not sent: longer than one webdis request",
                        call.script.name
                    ),
                );
                Err(Box::new(call))
            }
            Err(err) => {
                self.mark_down(&format!("call not sent: {err}"));
                Err(Box::new(call))
            }
        }
    }

    /// Hands one script call to the transport; the token its reply will carry.
    fn transmit(&self, call: &Call, with_source: bool) -> Result<u32, HostError> {
        let keys: Vec<&str> = call.keys.iter().map(String::as_str).collect();
        let args = scripts::command_args(call.script, &keys, &call.args, with_source);
        match &self.http {
            Some(http) => host::webdis::send(http, &args),
            None => redis_call(&call.service, &resp::encode_command(&args)),
        }
    }

    /// A webdis answer (HTTP transport), in whichever context the SDK delivers it.
    fn on_http_reply(&self, token: u32, body_size: usize) {
        let Some(waiting) = self.calls.borrow_mut().take(token) else {
            return;
        };
        let reply = host::webdis::reply(body_size).map_err(|err| {
            if err == WebdisError::Forbidden {
                self.count("webdis_forbidden", 1);
            }
            err.to_string()
        });
        self.on_reply(waiting.context_id, waiting.state, reply);
    }

    /// A `LEASE` of `want = (min, max)` tokens for one bucket.
    fn lease_call(
        &self,
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
                wire(Self::clock_arg(config, now)),
            ],
            service: redis.service.clone(),
            resent: false,
        })
    }

    fn settle_call(&self, service: &str, entry: JournalEntry, clock: u64) -> Call {
        let (script, keys, args) = entry_command(&entry, clock);
        Call {
            kind: CallKind::Settle { entry },
            script,
            keys,
            args,
            service: service.to_string(),
            resent: false,
        }
    }

    // -----------------------------------------------------------------------------------
    // Admission

    /// Carries a request's admission as far as it can go without waiting.
    fn advance(&self, id: u32) -> Step {
        let now = now_ms();
        let mut flows = self.flows.borrow_mut();
        let Some(flow) = flows.get_mut(&id) else {
            return Step::Continue;
        };
        let Some(config) = self.config(flow.config) else {
            return Step::Continue;
        };
        let tokens = flow.cost.as_ref().map_or(0, Cost::tokens);
        let group = flow.identity.model_group.clone();

        // Soft limits. The mode is read once per pass (Redis health is one shared-data read);
        // a lease that cannot be sent starts a new pass in emergency mode.
        let mode = if flow.emergency && config.redis.is_some() {
            Mode::Emergency
        } else {
            self.mode(config, now)
        };
        while let Some(limit) = config.limits.get(flow.next_limit) {
            let index = flow.next_limit;
            if !limit.applies_to(group.as_deref()) {
                flow.next_limit += 1;
                continue;
            }
            let Some(keys) = budget::bucket_keys(limit, &flow.identity) else {
                flow.next_limit += 1;
                continue;
            };
            let units = match limit.unit {
                Unit::Requests => 1,
                Unit::Tokens => tokens,
            };
            let spec = spec_of(config, index);
            let take = take(&keys, mode, &spec, units, now);
            match take {
                Ok((
                    Take::Admit {
                        wants_lease,
                        emergency,
                    },
                    remaining,
                )) => {
                    if wants_lease {
                        want(&keys);
                    }
                    if emergency {
                        self.count(&format!("emergency_admits.{}", limit.name), 1);
                    }
                    flow.taken.push(Taken {
                        local_key: keys.local,
                        limit: index,
                        units,
                    });
                    flow.rate.push((limit.unit, limit.amount, remaining));
                    flow.next_limit += 1;
                }
                Ok((
                    Take::Reject {
                        retry_after_ms,
                        never,
                    },
                    _,
                )) => {
                    self.count(&format!("rate_limited.{}", limit.name), 1);
                    let reject = decide::rate_limited(limit, units, retry_after_ms, never);
                    self.give_back_all(flow, config, now);
                    return Step::Refuse(reject);
                }
                Ok((Take::Lease { want_min, want_max }, _)) => {
                    let Some(call) =
                        self.lease_call(config, Some(id), &keys, spec, (want_min, want_max), now)
                    else {
                        flow.next_limit += 1;
                        continue;
                    };
                    drop(flows);
                    let sent = self.send(call, id).is_ok();
                    if let Some(flow) = self.flows.borrow_mut().get_mut(&id) {
                        flow.waiting = sent;
                        flow.emergency = !sent;
                    }
                    if sent {
                        return Step::Wait;
                    }
                    // not sent (Redis marked down, or too many calls in flight): the same
                    // limit again, in emergency mode
                    return self.advance(id);
                }
                Err(err) => {
                    // no shared data: fail open for this limit, say so
                    log(
                        LogLevel::Warn,
                        &format!("bucket {} unavailable: {err}", limit.name),
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
                let route = route_info();
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
                            self.give_back_all(flow, config, now);
                            return Step::Refuse(decide::unpriced(b));
                        }
                    }
                }
                if let Some(step) = self.reserve(id, flow, config, levels, amounts, None, now) {
                    return step;
                }
            }
        }
        flow.admitted = true;
        self.count("admitted", 1);
        Step::Continue
    }

    /// Starts a reservation. `Some(Wait)` when a call went out, `Some(Refuse)` when refused,
    /// `None` when reserved (or nothing to do) synchronously.
    #[allow(clippy::too_many_arguments)]
    fn reserve(
        &self,
        id: u32,
        flow: &mut Flow,
        config: &Config,
        levels: Vec<Level>,
        amounts: Vec<u64>,
        alternative: Option<Box<Alternative>>,
        now: u64,
    ) -> Option<Step> {
        let Some(redis) = config.redis.as_ref() else {
            return match reserve_locally(&levels, &amounts) {
                Ok(spent) => {
                    self.note_warnings(flow, config, &levels, &spent);
                    if let Some(alt) = alternative {
                        self.switch(flow, &alt);
                    }
                    flow.reservation = Reservation::Local { levels, amounts };
                    None
                }
                Err((index, remaining)) => self.refused(
                    id,
                    flow,
                    config,
                    &levels,
                    &amounts,
                    index,
                    remaining,
                    alternative.is_some(),
                    now,
                ),
            };
        };
        if self.redis_down(now) {
            return self.without_redis(flow, config, levels, amounts, now);
        }
        let key = budget::reservation_key(&flow.identity, &flow.request_id);
        let mut args = vec![wire(config.reservation_ttl_ms), wire(levels.len() as u64)];
        for (level, amount) in levels.iter().zip(&amounts) {
            args.extend([wire(*amount), wire(level.limit), wire(level.expire_at_ms)]);
        }
        args.push(wire(Self::clock_arg(config, now)));
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
        if self.send(call, id).is_ok() {
            return Some(Step::Wait);
        }
        flow.reservation = Reservation::None;
        self.without_redis(flow, config, levels, amounts, now)
    }

    /// Budgets while Redis is unreachable: `reject` refuses, `allow` journals.
    fn without_redis(
        &self,
        flow: &mut Flow,
        config: &Config,
        levels: Vec<Level>,
        amounts: Vec<u64>,
        now: u64,
    ) -> Option<Step> {
        for level in &levels {
            if let Some(b) = config.budgets.get(level.budget) {
                if b.on_redis_failure == OnRedisFailure::Reject {
                    self.count(&format!("budget_unavailable.{}", b.name), 1);
                    self.give_back_all(flow, config, now);
                    return Some(Step::Refuse(decide::budget_unavailable(b)));
                }
            }
        }
        let depth = host::shared_data(JOURNAL_KEY)
            .ok()
            .and_then(|(v, _)| v)
            .map_or(0, |v| Journal::decode(&v).entries.len());
        if depth >= config.journal_capacity {
            self.count("journal_overflow", 1);
            self.give_back_all(flow, config, now);
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

    /// A level refused: try the budget fallback once, else 402.
    #[allow(clippy::too_many_arguments)]
    fn refused(
        &self,
        id: u32,
        flow: &mut Flow,
        config: &Config,
        levels: &[Level],
        amounts: &[u64],
        index: usize,
        remaining: i64,
        was_alternative: bool,
        now: u64,
    ) -> Option<Step> {
        let level = levels.get(index);
        let b = level.and_then(|l| config.budgets.get(l.budget));
        if !was_alternative && !flow.alternative_tried {
            flow.alternative_tried = true;
            if let Some(alt) = alternative() {
                let price = alt
                    .route
                    .price_ceiling
                    .clone()
                    .or_else(|| alt.route.price.clone());
                let (prompt, cap) = flow
                    .cost
                    .as_ref()
                    .map_or((0, 0), |c| (c.prompt, c.output_cap));
                let priced: Option<Vec<u64>> = levels
                    .iter()
                    .map(|l| {
                        let b = config.budgets.get(l.budget)?;
                        budget::reserve_amount(b, prompt, cap, price.as_ref()).ok()
                    })
                    .collect();
                if let Some(alt_amounts) = priced {
                    if alt_amounts != amounts {
                        return self.reserve(
                            id,
                            flow,
                            config,
                            levels.to_vec(),
                            alt_amounts,
                            Some(Box::new(alt)),
                            now,
                        );
                    }
                }
            }
        }
        let Some(b) = b else {
            return Some(Step::Refuse(Reject::internal("budget level out of range")));
        };
        self.count(&format!("budget_exceeded.{}", b.name), 1);
        let needed = amounts.get(index).copied().unwrap_or(0);
        self.give_back_all(flow, config, now);
        Some(Step::Refuse(decide::budget_exhausted(b, needed, remaining)))
    }

    fn note_warnings(&self, flow: &mut Flow, config: &Config, levels: &[Level], spent: &[u64]) {
        for (level, spent) in levels.iter().zip(spent) {
            let Some(b) = config.budgets.get(level.budget) else {
                continue;
            };
            if let Some(percent) = decide::warning(b, *spent) {
                self.count(&format!("budget_warning.{}.{percent}", b.name), 1);
                flow.warnings.push(format!("{}={percent}", b.name));
            }
        }
    }

    /// Applies the router's published alternative: the request now goes to the cheaper group.
    fn switch(&self, flow: &mut Flow, alt: &Alternative) {
        write_switch(alt);
        self.count("budget_fallback", 1);
        flow.switched_to = Some(alt.route.model_group.clone());
        flow.switched = Some(Box::new(alt.clone()));
    }

    /// The body of a re-entering pass got the same cap edit as its first pass: write the
    /// first pass's budget fallback again unless the router already routes there, and go on
    /// (admitted in the first pass).
    fn reenter_body(&self, id: u32) -> Action {
        let switched = match self.flows.borrow_mut().get_mut(&id) {
            Some(flow) => {
                flow.reentered = false;
                flow.switched.clone()
            }
            None => None,
        };
        if let Some(alt) = switched {
            let routed = route_info().map(|r| r.model_group);
            if reentry::reapply_switch(alt.group(), routed.as_deref()) {
                write_switch(&alt);
                self.count("reentry_switch_rewritten", 1);
            }
        }
        Action::Continue
    }

    /// Gives every taken unit back (the request was refused or never forwarded).
    fn give_back_all(&self, flow: &mut Flow, config: &Config, now: u64) {
        for taken in flow.taken.drain(..) {
            let spec = spec_of(config, taken.limit);
            let mode = self.mode(config, now);
            settle_bucket(
                &taken.local_key,
                mode,
                &spec,
                i64::try_from(taken.units).unwrap_or(0),
                now,
            );
        }
        flow.rate.clear();
    }

    // -----------------------------------------------------------------------------------
    // Replies

    fn on_reply(&self, context_id: u32, call: Call, reply: Result<Vec<u8>, String>) {
        let reply = match reply {
            Ok(reply) => reply,
            Err(why) => {
                self.mark_down(&why);
                // sent, then no answer: it may have run (or run later)
                self.call_failed(context_id, call, Sent::Unanswered);
                return;
            }
        };
        self.mark_up();
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
                self.loaded.borrow_mut().remove(call.script.name);
                // resent with its source; a failed send fails the call the usual way, so a
                // waiting request is never left paused
                let call = Call {
                    resent: true,
                    ..call
                };
                if let Err(call) = self.send(call, context_id) {
                    self.call_failed(context_id, *call, Sent::Not);
                }
            }
            Err(err) => {
                log(
                    LogLevel::Warn,
                    &format!("{} failed: {err}", call.script.name),
                );
                self.count("redis_errors", 1);
                // an error reply: the script changed nothing
                self.call_failed(context_id, call, Sent::Not);
            }
            Ok(reply) => {
                self.loaded.borrow_mut().insert(call.script.name);
                self.call_answered(call, reply);
            }
        }
    }

    fn call_failed(&self, _context_id: u32, call: Call, sent: Sent) {
        let now = now_ms();
        if let (CallKind::Reserve { key, levels, .. }, Sent::Unanswered) = (&call.kind, sent) {
            self.cancel_reservation(key, levels, now);
        }
        match call.kind {
            CallKind::Lease {
                flow, local_key, ..
            } => {
                lease_failed(&local_key);
                if let Some(flow) = flow {
                    // this request goes on in emergency mode (never a second lease: a
                    // script error would repeat)
                    if let Some(f) = self.flows.borrow_mut().get_mut(&flow) {
                        f.emergency = true;
                    }
                    self.resume(flow);
                }
            }
            CallKind::Reserve {
                flow: id,
                levels,
                amounts,
                ..
            } => {
                let step = {
                    let mut flows = self.flows.borrow_mut();
                    let Some(flow) = flows.get_mut(&id) else {
                        return;
                    };
                    flow.reservation = Reservation::None;
                    if flow.abandoned {
                        flows.remove(&id);
                        return;
                    }
                    let Some(config) = self.config(flow.config) else {
                        return;
                    };
                    self.without_redis(flow, config, levels, amounts, now)
                };
                self.finish_step(id, step);
            }
            CallKind::Settle { entry } => self.journal(entry),
            CallKind::Replay { seq } => {
                self.replaying.borrow_mut().remove(&seq);
            }
        }
    }

    /// A `RESERVE` went unanswered: it may have deducted its amounts (now, or later when a
    /// slow Redis gets to it). Its `CANCEL` (sent now, or journaled while Redis counts as
    /// down) gives them back and makes a late one a no-op; the request itself goes on as if
    /// Redis were unreachable.
    fn cancel_reservation(&self, key: &str, levels: &[Level], now: u64) {
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
        self.settle_entry(entry, now);
    }

    fn call_answered(&self, call: Call, reply: Reply) {
        let now = now_ms();
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
                let _ = host::update_shared_data(&local_key, &seed, |v| {
                    let mut local =
                        Local::decode(v).unwrap_or_else(|| Local::new(Mode::Leased, &spec, now));
                    if local.owner != owner && local.owner != 0 {
                        // the slot changed hands: these tokens were the previous owner's
                        return (None, ());
                    }
                    local.add_lease(lease.granted, want_min, lease.wait_ms, now);
                    (Some(local.encode().to_vec()), ())
                });
                self.count("leased_tokens", i64::try_from(lease.granted).unwrap_or(0));
                if let Some(flow) = flow {
                    self.resume(flow);
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
                let step = {
                    let mut flows = self.flows.borrow_mut();
                    let Some(flow) = flows.get_mut(&id) else {
                        return;
                    };
                    let Some(config) = self.config(flow.config) else {
                        return;
                    };
                    match result {
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
                                flows.remove(&id);
                                drop(flows);
                                self.settle_entry(entry, now);
                                return;
                            }
                            self.note_warnings(flow, config, &levels, &spent);
                            if let Some(alt) = alternative {
                                self.switch(flow, &alt);
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
                                flows.remove(&id);
                                return;
                            }
                            self.refused(
                                id,
                                flow,
                                config,
                                &levels,
                                &amounts,
                                level,
                                remaining,
                                alternative.is_some(),
                                now,
                            )
                        }
                    }
                };
                match step {
                    None => self.resume(id),
                    Some(step) => self.finish_step(id, Some(step)),
                }
            }
            (CallKind::Replay { seq }, Reply::Done) => {
                self.replaying.borrow_mut().remove(&seq);
                let _ = host::update_shared_data(JOURNAL_KEY, &[], |v| {
                    let mut journal = Journal::decode(v);
                    journal.remove(seq);
                    (Some(journal.encode()), ())
                });
                self.count("journal_replayed", 1);
            }
            (CallKind::Settle { .. }, Reply::Done) => self.count("reconciled", 1),
            _ => {}
        }
    }

    /// Resumes a waiting request: continue its admission from where it stopped.
    fn resume(&self, id: u32) {
        let abandoned = match self.flows.borrow_mut().get_mut(&id) {
            Some(flow) => {
                flow.waiting = false;
                flow.abandoned
            }
            None => true,
        };
        if abandoned {
            self.flows.borrow_mut().remove(&id);
            return;
        }
        if host::set_effective_context(id).is_err() {
            return;
        }
        let step = self.advance(id);
        self.finish_step(id, Some(step));
    }

    /// Applies the outcome of an asynchronous step to a paused request.
    fn finish_step(&self, id: u32, step: Option<Step>) {
        if host::set_effective_context(id).is_err() {
            return;
        }
        match step {
            None => {
                // reserved: carry on (no more waiting steps after budgets)
                let step = self.advance(id);
                self.finish_step_final(id, step);
            }
            Some(step) => self.finish_step_final(id, step),
        }
    }

    fn finish_step_final(&self, _id: u32, step: Step) {
        match step {
            Step::Continue => {
                let _ = host::resume_request();
            }
            Step::Wait => {}
            Step::Refuse(reject) => refuse(&reject),
        }
    }

    // -----------------------------------------------------------------------------------
    // Settling

    /// `on_log` of a request: settles it, or — superseded by an internal redirect — stashes
    /// its admission for the pass that re-enters ([`crate::reentry`]).
    fn log(&self, id: u32, superseded: bool) {
        let now = now_ms();
        let choice = self.flows.borrow().get(&id).map(|flow| {
            let in_flight = flow.waiting || matches!(flow.reservation, Reservation::Pending);
            reentry::at_log(superseded && flow.logical, flow.admitted, in_flight)
        });
        if choice != Some(AtLog::Carry) {
            self.settle(id);
            return;
        }
        let Some(flow) = self.flows.borrow_mut().remove(&id) else {
            return;
        };
        let request_id = flow.request_id.clone();
        let dropped = self.stash.borrow_mut().put(&request_id, flow, now);
        self.count("reentry_carried", 1);
        self.settle_dropped(dropped, now);
    }

    /// Settles admissions that left the stash untaken (expired, evicted): their usage is
    /// unknown, so the reservation stands — the safe direction, never a leak.
    fn settle_dropped(&self, dropped: Vec<Flow>, now: u64) {
        for mut flow in dropped {
            self.count("reentry_expired", 1);
            let Some(config) = self.config(flow.config) else {
                continue;
            };
            if let Some(entry) = self.settle_flow(&mut flow, config, None, now) {
                self.settle_entry(entry, now);
            }
        }
    }

    fn settle(&self, id: u32) {
        let now = now_ms();
        let mut flows = self.flows.borrow_mut();
        let Some(flow) = flows.get_mut(&id) else {
            return;
        };
        let Some(config) = self.config(flow.config) else {
            flows.remove(&id);
            return;
        };
        let waiting = flow.waiting || matches!(flow.reservation, Reservation::Pending);
        let model_call = flow.cost.as_ref().is_some_and(Cost::is_model_call);
        let record = if flow.admitted && model_call {
            host::property(&[config.usage_filter_state.as_str()])
                .ok()
                .flatten()
                .and_then(|bytes| Record::from_json(&bytes))
        } else {
            None
        };
        let entry = self.settle_flow(flow, config, record.as_ref(), now);
        if waiting {
            flow.abandoned = true;
        } else {
            flows.remove(&id);
        }
        drop(flows);
        if let Some(entry) = entry {
            self.settle_entry(entry, now);
        }
        if waiting && self.http.is_some() {
            self.abandon_calls(id);
        }
    }

    /// Over HTTP, the answers to a finished request's calls never reach the plugin (the SDK
    /// drops them with the context): fail them now, as calls Redis never answered (a
    /// `RESERVE` is cancelled), and forget the request.
    fn abandon_calls(&self, id: u32) {
        let calls = self.calls.borrow_mut().take_context(id);
        for (_, call) in calls {
            self.count("calls_abandoned", 1);
            self.call_failed(id, call, Sent::Unanswered);
        }
        self.flows.borrow_mut().remove(&id);
    }

    /// Gives back the buckets' unused units and settles a local reservation; returns the
    /// Redis settlement to send, if any.
    fn settle_flow(
        &self,
        flow: &mut Flow,
        config: &Config,
        record: Option<&Record>,
        now: u64,
    ) -> Option<JournalEntry> {
        let model_call = flow.cost.as_ref().is_some_and(Cost::is_model_call);
        if flow.admitted && model_call && record.is_none() {
            self.count("settled_without_usage", 1);
        }
        let actual = settle::actual(flow.admitted, model_call, record);

        // soft limits
        let mode = self.mode(config, now);
        for taken in flow.taken.drain(..) {
            let Some(limit) = config.limits.get(taken.limit) else {
                continue;
            };
            let refund =
                settle::bucket_refund(limit.unit, taken.units, flow.admitted, actual.as_ref());
            if refund != 0 {
                let spec = spec_of(config, taken.limit);
                settle_bucket(&taken.local_key, mode, &spec, refund, now);
            }
        }

        // budgets
        let model = flow.cost.as_ref().and_then(|c| c.model.clone());
        let price = config.price_for(
            route_info().and_then(|r| r.price).as_ref(),
            flow.identity.model_group.as_deref(),
            model.as_deref(),
        );
        let reservation = std::mem::take(&mut flow.reservation);
        let actual_of = |levels: &[Level], amounts: &[u64]| -> Vec<u64> {
            settle::level_charges(
                &config.budgets,
                levels,
                amounts,
                actual.as_ref(),
                price.as_ref(),
            )
        };
        let entry = match reservation {
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
                settle_locally(&levels, &amounts, &actual);
                None
            }
        };
        entry
    }

    /// Sends a reconcile or charge, or journals it while Redis is unreachable. Over HTTP it
    /// waits in the outbox for the next tick, whose root context outlives the request
    /// (journaled if the outbox is full).
    fn settle_entry(&self, entry: JournalEntry, now: u64) {
        if self.http.is_some() {
            let mut outbox = self.outbox.borrow_mut();
            if outbox.len() < MAX_CALLS {
                outbox.push(entry);
                return;
            }
            drop(outbox);
            self.journal(entry);
            return;
        }
        self.settle_entry_now(entry, now);
    }

    /// Sends the settlements of the outbox (from the root context's tick).
    fn flush_outbox(&self, now: u64) {
        let entries = std::mem::take(&mut *self.outbox.borrow_mut());
        for entry in entries {
            self.settle_entry_now(entry, now);
        }
    }

    fn settle_entry_now(&self, entry: JournalEntry, now: u64) {
        let Some(redis) = self.redis().cloned() else {
            return;
        };
        if self.redis_down(now) {
            self.journal(entry);
            return;
        }
        let clock = self
            .rules
            .configs()
            .next()
            .map_or(0, |c| Self::clock_arg(c, now));
        let call = self.settle_call(&redis.service, entry.clone(), clock);
        if self.send(call, 0).is_err() {
            self.journal(entry);
        }
    }

    fn journal(&self, entry: JournalEntry) {
        let capacity = self
            .rules
            .configs()
            .map(|c| c.journal_capacity)
            .max()
            .unwrap_or(1024);
        let stored = host::update_shared_data(JOURNAL_KEY, &Journal::default().encode(), |v| {
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
            log(
                LogLevel::Error,
                "budget journal full: a settlement is lost (raise journal_capacity)",
            );
        }
    }

    // -----------------------------------------------------------------------------------
    // The sync worker

    fn elected(&self, now: u64, period_ms: u64) -> bool {
        let nonce = self.nonce;
        host::update_shared_data(SYNC_KEY, &[0u8; 16], |v| {
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

    fn on_tick(&self) {
        let Some(config) = self.rules.configs().find(|c| c.redis.is_some()) else {
            return;
        };
        let now = now_ms();
        self.flush_outbox(now);
        if !self.elected(now, u64::from(config.lease.sync_ms)) {
            return;
        }
        let down = self.redis_down(now);
        // top-ups
        let wanted: Vec<String> = host::update_shared_data(WANT_KEY, &[], |v| {
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
            let keys = BucketKeys {
                local: local.to_string(),
                redis: redis.to_string(),
                owner,
            };
            let local_key = &keys.local;
            let Some((config, index)) = budget::limit_of_local_key(local_key).and_then(|name| {
                self.rules.configs().find_map(|c| {
                    c.limits
                        .iter()
                        .position(|l| l.name == name)
                        .filter(|_| c.redis.is_some())
                        .map(|i| (c, i))
                })
            }) else {
                continue;
            };
            let spec = spec_of(config, index);
            if down {
                lease_failed(local_key);
                continue;
            }
            if let Some(call) =
                self.lease_call(config, None, &keys, spec, (spec.batch, spec.batch), now)
            {
                if self.send(call, 0).is_err() {
                    break;
                }
            }
        }
        // journal replay
        let journal = host::shared_data(JOURNAL_KEY)
            .ok()
            .and_then(|(v, _)| v)
            .map(|v| Journal::decode(&v))
            .unwrap_or_default();
        self.gauge("journal_depth", journal.entries.len() as u64);
        if down || self.redis_down(now) {
            return;
        }
        let Some(redis) = config.redis.as_ref() else {
            return;
        };
        let clock = Self::clock_arg(config, now);
        for (seq, entry) in journal.entries.into_iter().take(REPLAY_BATCH) {
            if !self.replaying.borrow_mut().insert(seq) {
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
            if self.send(call, 0).is_err() {
                self.replaying.borrow_mut().remove(&seq);
                break;
            }
        }
    }
}

/// What is known of a failed call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    /// Not sent, or answered with an error: it changed nothing.
    Not,
    /// Sent and never answered (a timeout, a connection lost): it may have run.
    Unanswered,
}

enum Reply {
    Lease(scripts::Lease),
    Reserve(scripts::Reserve),
    Done,
}

/// Lets the sync worker queue another top-up of a bucket whose lease failed.
fn lease_failed(local_key: &str) {
    let _ = host::update_shared_data(local_key, &[], |v| match Local::decode(v) {
        Some(mut local) => {
            local.lease_failed();
            (Some(local.encode().to_vec()), ())
        }
        None => (None, ()),
    });
}

/// The script, keys and arguments of a journal entry.
fn entry_command(entry: &JournalEntry, clock: u64) -> (&'static Script, Vec<String>, Vec<i64>) {
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

fn wire(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn decode_u64(bytes: &[u8]) -> u64 {
    bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn spec_of(config: &Config, index: usize) -> Spec {
    let Some(limit) = config.limits.get(index) else {
        return Spec::new(1, 1, 100, 0);
    };
    let timeout = config.redis.as_ref().map_or(1_000, |r| {
        u64::from(r.timeout_ms).saturating_mul(4).max(1_000)
    });
    Spec {
        emergency_percent: config.lease.emergency_percent,
        lease_timeout_ms: timeout,
        ..Spec::new(
            limit.amount,
            limit.window_ms,
            config.lease.batch_percent,
            config.lease.low_percent,
        )
    }
}

/// Takes `units` from a bucket under CAS (claiming its slot for the identity first); also
/// says what is left.
fn take(
    keys: &BucketKeys,
    mode: Mode,
    spec: &Spec,
    units: u64,
    now: u64,
) -> Result<(Take, u64), HostError> {
    let seed = Local::new(mode, spec, now).encode();
    host::update_shared_data(&keys.local, &seed, |v| {
        let mut local = Local::decode(v).unwrap_or_else(|| Local::new(mode, spec, now));
        local.claim(keys.owner, mode, spec, now);
        let take = local.take(mode, spec, units, now);
        (Some(local.encode().to_vec()), (take, local.remaining()))
    })
}

fn settle_bucket(key: &str, mode: Mode, spec: &Spec, units: i64, now: u64) {
    let seed = Local::new(mode, spec, now).encode();
    let _ = host::update_shared_data(key, &seed, |v| {
        let mut local = Local::decode(v).unwrap_or_else(|| Local::new(mode, spec, now));
        local.settle(mode, spec, units, now);
        (Some(local.encode().to_vec()), ())
    });
}

fn want(keys: &BucketKeys) {
    let line = format!("{}\t{}\t{}", keys.local, keys.redis, keys.owner);
    let _ = host::update_shared_data(WANT_KEY, &[], |v| {
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
fn reserve_locally(levels: &[Level], amounts: &[u64]) -> Result<Vec<u64>, (usize, i64)> {
    let mut done: Vec<(usize, u64)> = Vec::new();
    let mut spent_after = Vec::with_capacity(levels.len());
    for (index, (level, amount)) in levels.iter().zip(amounts).enumerate() {
        let key = format!("{LOCAL_BUDGET_PREFIX}{}", level.key);
        let outcome = host::update_shared_data(&key, &0u64.to_le_bytes(), |v| {
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
                        add_local(level, -i128::from(amount));
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

fn add_local(level: &Level, delta: i128) {
    let key = format!("{LOCAL_BUDGET_PREFIX}{}", level.key);
    let _ = host::update_shared_data(&key, &0u64.to_le_bytes(), |v| {
        let spent = i128::from(decode_u64(v)) + delta;
        let spent = u64::try_from(spent.max(0)).unwrap_or(u64::MAX);
        (Some(spent.to_le_bytes().to_vec()), ())
    });
}

fn settle_locally(levels: &[Level], reserved: &[u64], actual: &[u64]) {
    for ((level, reserved), actual) in levels.iter().zip(reserved).zip(actual) {
        let delta = i128::from(*actual) - i128::from(*reserved);
        if delta != 0 {
            add_local(level, delta);
        }
    }
}

/// Rewrites the held request body's `model` (the headers are still held, so
/// `content-length` can follow).
fn rewrite_model(model: &str) -> Result<(), HostError> {
    use llm_gateway_shared::json::{self, Edits, Limits};
    let body = host::buffer(Buffer::RequestBody, 0, usize::MAX)?;
    let Ok(object) = json::scan_object(&body, &Limits::default()) else {
        return Ok(()); // inspected before; nothing sensible to rewrite
    };
    let mut edits = Edits::new(&body, &object);
    edits.set("model", json::quote(model).into_bytes());
    let rewritten = edits.finish();
    host::replace_request_body(body.len(), &rewritten)
}

/// Writes an alternative's switch: filter state, headers, the held body's `model`, and clears
/// the route cache.
fn write_switch(alt: &Alternative) {
    let writes = alt.switch_writes();
    for (name, value) in &writes.properties {
        let _ = host::set_property(&[name], value);
    }
    for (name, value) in &writes.set_headers {
        let _ = host::set_header(HeaderMap::RequestHeaders, name, value.as_bytes());
    }
    for name in &writes.remove_headers {
        let _ = host::remove_header(HeaderMap::RequestHeaders, name);
    }
    if let Err(err) = rewrite_model(&writes.model) {
        log(
            LogLevel::Warn,
            &format!("budget fallback: cannot rewrite the model: {err}"),
        );
    }
    let _ = host::clear_route_cache();
}

fn route_info() -> Option<RouteInfo> {
    host::property(&[ROUTE_PROPERTY])
        .ok()
        .flatten()
        .and_then(|bytes| RouteInfo::from_json(&bytes))
}

fn alternative() -> Option<Alternative> {
    host::property(&[BUDGET_FALLBACK_PROPERTY])
        .ok()
        .flatten()
        .and_then(|bytes| Alternative::from_json(&bytes))
}

fn refuse(reject: &Reject) {
    if let Err(err) = host::send_reject(PLUGIN, reject) {
        log(
            LogLevel::Error,
            &format!("cannot send the local reply: {err}"),
        );
    }
}

fn header_text(name: &str) -> Option<String> {
    host::header(HeaderMap::RequestHeaders, name)
        .ok()
        .flatten()
        .and_then(|v| String::from_utf8(v).ok())
        .filter(|v| !v.is_empty())
}

#[cfg(feature = "higress")]
fn redis_call(service: &str, query: &[u8]) -> Result<u32, HostError> {
    host::redis::redis_call(service, query)
}

#[cfg(not(feature = "higress"))]
fn redis_call(_service: &str, _query: &[u8]) -> Result<u32, HostError> {
    Err(HostError::Unimplemented)
}

// ---------------------------------------------------------------------------------------
// Root context

#[derive(Default)]
struct Root {
    state: Option<Rc<State>>,
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        if let Some(state) = &self.state {
            state.on_http_reply(token_id, body_size);
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let Some(rules) = host::load_config("token-ratelimit", parse_document) else {
            return false;
        };
        let redis = rules.configs().find_map(|c| c.redis.clone());
        let nonce = {
            use std::hash::BuildHasher;
            std::collections::hash_map::RandomState::new()
                .hash_one(host::now_nanos().unwrap_or_default())
        };
        let state = Rc::new(State {
            rules,
            nonce,
            flows: RefCell::default(),
            calls: RefCell::new(Pending::new(MAX_CALLS + 1)),
            loaded: RefCell::default(),
            replaying: RefCell::default(),
            metrics: RefCell::default(),
            stash: RefCell::default(),
            http: http_redis(redis.as_ref()),
            outbox: RefCell::default(),
        });
        if let Some(redis) = state.redis().cloned() {
            if !init_redis(&state, &redis) {
                return false;
            }
            let period = state
                .rules
                .configs()
                .find(|c| c.redis.is_some())
                .map_or(100, |c| c.lease.sync_ms);
            let _ = host::set_tick_period_ms(period);
        }
        self.state = Some(state);
        true
    }

    fn on_tick(&mut self) {
        if let Some(state) = &self.state {
            state.on_tick();
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Limiter {
            id: context_id,
            state: self.state.clone(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// The webdis cluster of an HTTP transport.
fn http_redis(redis: Option<&RedisConfig>) -> Option<HttpRedis> {
    let redis = redis?;
    match &redis.transport {
        RedisTransport::Http { authorization } => Some(HttpRedis {
            cluster: redis.service.clone(),
            authorization: authorization.clone(),
            timeout_ms: redis.timeout_ms,
        }),
        RedisTransport::Higress => None,
    }
}

fn init_redis(state: &Rc<State>, redis: &RedisConfig) -> bool {
    match redis.transport {
        // nothing to connect: each call is an HTTP request to the cluster
        RedisTransport::Http { .. } => true,
        RedisTransport::Higress => init_higress_redis(state, redis),
    }
}

#[cfg(feature = "higress")]
fn init_higress_redis(state: &Rc<State>, redis: &RedisConfig) -> bool {
    use llm_gateway_shared::host::redis::{on_redis_call_response, redis_init, redis_reply};
    let user = redis.username.as_deref().unwrap_or_default();
    let password = redis.password.as_deref().unwrap_or_default();
    if let Err(err) = redis_init(&redis.service, user, password, redis.timeout_ms) {
        log(
            LogLevel::Error,
            &format!("cannot connect Redis service {}: {err}", redis.service),
        );
        return false;
    }
    let for_replies = Rc::clone(state);
    on_redis_call_response(move |response| {
        let Some(waiting) = for_replies.calls.borrow_mut().take(response.token) else {
            return;
        };
        let reply = if response.answered() {
            redis_reply(response.size).map_err(|err| format!("reply not read: {err}"))
        } else {
            Err(format!("call failed (status {})", response.status))
        };
        for_replies.on_reply(waiting.context_id, waiting.state, reply);
    });
    true
}

#[cfg(not(feature = "higress"))]
fn init_higress_redis(_state: &Rc<State>, _redis: &RedisConfig) -> bool {
    false // refused by the config parser already
}

// ---------------------------------------------------------------------------------------
// HTTP context

struct Limiter {
    id: u32,
    state: Option<Rc<State>>,
}

impl Context for Limiter {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        if let Some(state) = &self.state {
            state.on_http_reply(token_id, body_size);
        }
    }

    fn on_done(&mut self) -> bool {
        // Envoy runs on_log before on_done; a flow still here was never settled (a host that
        // skipped on_log): settle it now rather than leak it.
        if let Some(state) = &self.state {
            let unsettled = state
                .flows
                .borrow()
                .get(&self.id)
                .is_some_and(|f| !f.abandoned);
            if unsettled {
                state.settle(self.id);
            }
        }
        true
    }
}

impl Limiter {
    fn step_action(&self, step: Step) -> Action {
        match step {
            Step::Continue => Action::Continue,
            Step::Wait => Action::Pause,
            Step::Refuse(reject) => {
                refuse(&reject);
                Action::Pause
            }
        }
    }
}

impl HttpContext for Limiter {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let Some(state) = self.state.clone() else {
            refuse(&Reject::internal("token-ratelimit is not configured"));
            return Action::Pause;
        };
        let Some(config) = host::select_config(&state.rules, None) else {
            return Action::Continue;
        };
        if config.is_empty() {
            return Action::Continue;
        }
        let index = state
            .rules
            .configs()
            .position(|c| std::ptr::eq(c, config))
            .unwrap_or(0);
        let ip = host::property_string(&["source", "address"])
            .ok()
            .flatten()
            .map(|a| budget::strip_port(&a).to_string());
        let identity = Identity {
            key: header_text(headers::KEY_ID),
            consumer: header_text(headers::CONSUMER),
            tenant: header_text(headers::TENANT),
            model_group: header_text(headers::MODEL_GROUP),
            ip,
            user: header_text("x-user-id"),
        };
        let logical_id = header_text(headers::REQUEST_ID);
        let logical = logical_id.is_some();
        let request_id = logical_id
            .or_else(|| host::property_string(&["request", "id"]).ok().flatten())
            .unwrap_or_else(|| format!("ctx-{}-{}", state.nonce, self.id));
        let path = header_text(":path").unwrap_or_default();
        let now = now_ms();
        let reentry = header_text(headers::REENTRY).is_some();
        let expired = state.stash.borrow_mut().expire(now);
        state.settle_dropped(expired, now);
        let adopted = state.stash.borrow_mut().adopt(reentry, &request_id, now);
        let flow = match adopted {
            Pass::Reentry(carried) => {
                state.count("reentry_adopted", 1);
                Flow {
                    reentered: true,
                    ..carried
                }
            }
            Pass::First | Pass::Lost => {
                if matches!(adopted, Pass::Lost) {
                    state.count("reentry_lost", 1);
                    log(
                        LogLevel::Warn,
                        "re-entered request without a stashed admission: admitted afresh",
                    );
                }
                Flow {
                    config: index,
                    identity,
                    request_id,
                    logical,
                    path,
                    ..Flow::default()
                }
            }
        };
        let reentered = flow.reentered;
        state.flows.borrow_mut().insert(self.id, flow);
        if end_of_stream {
            if reentered {
                return Action::Continue;
            }
            return self.step_action(state.advance(self.id));
        }
        Action::Pause // headers held until the body is read
    }

    fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        let Some(state) = self.state.clone() else {
            return Action::Continue;
        };
        let (config_index, path, reentered) = match state.flows.borrow().get(&self.id) {
            Some(flow) if flow.reentered => (flow.config, flow.path.clone(), true),
            Some(flow) if flow.cost.is_none() && !flow.admitted => {
                (flow.config, flow.path.clone(), false)
            }
            _ => return Action::Continue,
        };
        let Some(config) = state.config(config_index) else {
            return Action::Continue;
        };
        if size > config.max_body_bytes {
            refuse(&Reject::new(
                413,
                llm_gateway_shared::reject::ErrorType::InvalidRequest,
                "request_too_large",
                format!(
                    "request bodies over {} bytes are not accepted",
                    config.max_body_bytes
                ),
            ));
            return Action::Pause;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        let body = match host::buffer(Buffer::RequestBody, 0, size) {
            Ok(body) => body,
            Err(_) => {
                refuse(&Reject::internal("cannot read the request body"));
                return Action::Pause;
            }
        };
        let margin = config.prompt_margin_percent;
        // A re-entering pass keeps its first pass's estimate: its body only needs the same
        // edits, so the tokenizer does not run (sample of 0 bytes).
        let sample_bytes = if reentered {
            0
        } else {
            config.tokenizer_sample_bytes
        };
        let cost = match cost::inspect(
            &path,
            &body,
            config.default_max_tokens,
            margin,
            sample_bytes,
        ) {
            Ok(cost) => cost,
            Err(reject) => {
                refuse(&reject);
                return Action::Pause;
            }
        };
        if let Some(edited) = &cost.body {
            // the headers are held (Pause in on_http_request_headers)
            if host::replace_request_body(size, edited).is_err() {
                refuse(&Reject::internal("cannot write the request body"));
                return Action::Pause;
            }
        }
        if reentered {
            return state.reenter_body(self.id);
        }
        if let Some(flow) = state.flows.borrow_mut().get_mut(&self.id) {
            flow.cost = Some(cost);
        }
        self.step_action(state.advance(self.id))
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(state) = &self.state else {
            return Action::Continue;
        };
        let flows = state.flows.borrow();
        let Some(flow) = flows.get(&self.id) else {
            return Action::Continue;
        };
        for (name, value) in decide::rate_headers(&flow.rate) {
            let _ = host::set_header(HeaderMap::ResponseHeaders, name, value.as_bytes());
        }
        if !flow.warnings.is_empty() {
            let _ = host::set_header(
                HeaderMap::ResponseHeaders,
                decide::BUDGET_WARNING_HEADER,
                flow.warnings.join(", ").as_bytes(),
            );
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        if let Some(state) = &self.state {
            let details = host::property_string(&["response", "code_details"])
                .ok()
                .flatten();
            state.log(self.id, is_superseded(details.as_deref()));
        }
    }
}
