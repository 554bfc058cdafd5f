//! The plugin's sans-I/O core: admission, reservation, settlement, the journal and the sync
//! worker, with no host call (quinn-proto's shape).
//!
//! A driver (the proxy-wasm shell, or a fused chain) feeds events in with
//! [`Core::handle`] — the host data already copied in, the clock an argument — and drains
//! the effects with [`Core::poll`]: let a request go on, refuse it, read or replace its body,
//! write the budget fallback's switch, set response headers, count a metric, log a line.
//! Reads and writes of the instance's shared data (CAS), the Redis transport, and the
//! properties read only on some paths (the router's route and budget fallback, the usage
//! record) go through the [`Env`] the driver passes in; their results come back into the
//! core, so no failure that changes the outcome is dropped.
//!
//! Per-request state is keyed by the request's context id: one core serves every request of
//! a worker VM.
//!
//! Request path (headers held until the end of the body):
//! 1. read the body, compute its cost, inject the output cap ([`crate::cost`]);
//! 2. take the cost from every applicable soft limit's bucket in shared data; a leased bucket
//!    that cannot cover it waits for one `LEASE`;
//! 3. reserve every applicable budget level at once (`RESERVE`, or CAS in shared data in
//!    the plain-Envoy build); refused: the group's budget fallback if the router published one,
//!    else 402.
//!
//! [`Input::Log`] settles, exactly once per logical request: unused tokens go back to the
//! buckets, the reservation is reconciled (`RECONCILE`) with the usage record. A reconcile that
//! cannot reach Redis is journaled in shared data and replayed by the instance's sync worker,
//! elected with a lease in shared data, which also tops up leased buckets on its tick.
//!
//! After an internal redirect ([`crate::reentry`]): a superseded pass stashes its [`Flow`]
//! instead of settling; the re-entering pass adopts it and settles it.
//!
//! Over HTTP (webdis) an answer reaches only the context that sent the call, so settlements
//! wait in the outbox and leave from the next tick, and a request that goes away while it
//! waits fails its calls at once (a `RESERVE` is cancelled, as when Redis never answers).

use crate::bucket::{Local, Mode, Spec, Take};
use crate::budget::{self, BucketKeys, Identity, Journal, JournalEntry, Level};
use crate::config::{Clock, Config, OnRedisFailure, Unit};
use crate::cost::{self, Cost};
use crate::decide;
use crate::reentry::{self, AtLog};
use crate::scripts::{self, Script, ScriptError};
use crate::settle;
use llm_gateway_shared::pending::Pending;
use llm_gateway_shared::reentry::{Pass, Stash};
use llm_gateway_shared::reject::{ErrorType, Reject};
use llm_gateway_shared::route_info::{Alternative, RouteInfo};
use llm_gateway_shared::rules::RuleSet;
use llm_gateway_shared::usage_record::Record;
use llm_gateway_shared::wire::HostError;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet, VecDeque};
use std::rc::Rc;

/// Shared data: the sync worker's lease (owner nonce, until).
pub const SYNC_KEY: &str = "trl:sync";
/// Shared data: buckets waiting for a top-up, one key per line.
pub const WANT_KEY: &str = "trl:want";
/// Shared data: Redis marked unreachable until (ms).
pub const REDIS_KEY: &str = "trl:redis";
/// Shared data: the budget journal ([`Journal`]).
pub const JOURNAL_KEY: &str = "trl:journal";
/// Shared data prefix of per-instance budget levels (plain-Envoy build).
pub const LOCAL_BUDGET_PREFIX: &str = "trl:bud:";
const MAX_WANT: usize = 4096;
/// Redis calls one VM keeps in flight (more: handled as if Redis were unreachable).
pub const MAX_CALLS: usize = 4096;
const REPLAY_BATCH: usize = 32;
/// Rounds of a shared-data read-modify-write before it gives up on a contended key.
const CAS_ROUNDS: usize = 16;

// ---------------------------------------------------------------------------------------
// The driver's side

/// What the core reaches synchronously through its driver.
pub trait Env {
    /// Reads a shared-data value and its CAS (`None`: no such key).
    fn shared_get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), HostError>;
    /// Writes a shared-data value if its CAS is still `cas` (0: unconditionally);
    /// [`HostError::CasMismatch`] when another VM wrote first.
    fn shared_set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), HostError>;
    /// Sends one Redis command (command name first) to `service`; the token its reply
    /// ([`Input::Reply`]) will carry. Over webdis, [`HostError::BadArgument`]: longer than one
    /// request.
    fn send_redis(&self, service: &str, args: &[Cow<'_, [u8]>]) -> Result<u32, HostError>;
    /// The router's route of request `ctx` (`PROPERTY`), if published.
    fn route_info(&self, ctx: u32) -> Option<RouteInfo>;
    /// The router's budget fallback of request `ctx`, if published.
    fn alternative(&self, ctx: u32) -> Option<Alternative>;
    /// The usage record of request `ctx`, published under `property`.
    fn usage_record(&self, ctx: u32, property: &str) -> Option<Record>;
}

/// The request headers the core reads, copied in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Head {
    /// Who the request is for (headers set by key-auth and the router, `source.address`).
    pub identity: Identity,
    /// The logical request id (`x-llm-request-id`), if the client or the chain set one.
    pub logical_id: Option<String>,
    /// Envoy's `request.id` (read only when there is no logical id).
    pub stream_id: Option<String>,
    /// `:path`.
    pub path: String,
    /// The re-entry marker header was present (a pass after an internal redirect).
    pub reentry: bool,
}

/// Why a Redis call got no reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unanswered {
    /// What happened (logged; never holds a key).
    pub why: String,
    /// webdis refused the command (its ACL): counted apart.
    pub forbidden: bool,
}

/// One event, with the host data it needs.
// moved once into `handle`, never stored: boxing the headers would only add an allocation
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Input {
    /// A request's headers; `config` is the index of the selected rule's config.
    RequestHeaders {
        ctx: u32,
        config: Option<usize>,
        head: Head,
        end_of_stream: bool,
    },
    /// A request body chunk arrived (`size` buffered so far).
    RequestBody {
        ctx: u32,
        size: usize,
        end_of_stream: bool,
    },
    /// The body [`Command::ReadBody`] asked for.
    Body {
        ctx: u32,
        size: usize,
        body: Result<Vec<u8>, HostError>,
    },
    /// The outcome of [`Command::ReplaceBody`].
    BodyReplaced {
        ctx: u32,
        result: Result<(), HostError>,
    },
    /// The response headers (rate and warning headers go out).
    ResponseHeaders { ctx: u32 },
    /// The request's `on_log`; `superseded`: an internal redirect replaced this pass.
    Log { ctx: u32, superseded: bool },
    /// The request's context is gone (`on_done`).
    Done { ctx: u32 },
    /// A Redis reply (RESP bytes) to the call sent with `token`.
    Reply {
        token: u32,
        reply: Result<Vec<u8>, Unanswered>,
    },
    /// The root context's timer: outbox, election, top-ups, journal replay.
    Tick,
}

/// Log levels of the core's lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Info,
    Warn,
    Error,
}

/// One effect for the driver to carry out, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Let request `ctx` go on (`Continue` in its own callback, else resume it).
    Proceed { ctx: u32 },
    /// Refuse request `ctx` with a local reply.
    Refuse { ctx: u32, reject: Reject },
    /// Read the request body (`size` bytes) and hand it back ([`Input::Body`]).
    ReadBody { ctx: u32, size: usize },
    /// Replace the request body (`size` bytes) and say how it went ([`Input::BodyReplaced`]).
    ReplaceBody {
        ctx: u32,
        size: usize,
        body: Vec<u8>,
    },
    /// Set a filter-state property of request `ctx`.
    SetProperty {
        ctx: u32,
        name: String,
        value: Vec<u8>,
    },
    /// Set a request header.
    SetRequestHeader {
        ctx: u32,
        name: &'static str,
        value: String,
    },
    /// Remove a request header.
    RemoveRequestHeader { ctx: u32, name: &'static str },
    /// Rewrite the held request body's `model`.
    RewriteModel { ctx: u32, model: String },
    /// Clear request `ctx`'s route cache (the budget fallback changed its route).
    ClearRouteCache { ctx: u32 },
    /// Set a response header.
    SetResponseHeader {
        ctx: u32,
        name: &'static str,
        value: String,
    },
    /// Add to a counter (`llm_gateway.ratelimit.<name>`).
    Count { name: Cow<'static, str>, delta: i64 },
    /// Record a gauge.
    Gauge { name: &'static str, value: u64 },
    /// Log a line.
    Log { level: LogLevel, message: String },
}

// ---------------------------------------------------------------------------------------
// Per-request state

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
pub struct Flow {
    config: usize,
    identity: Identity,
    request_id: String,
    path: String,
    cost: Option<Cost>,
    /// The body's cost while its edited body is being written.
    staged: Option<Cost>,
    /// Limits already looked at (admission resumes from here after a lease).
    next_limit: usize,
    taken: Vec<Taken>,
    /// (unit, amount, remaining) of every bucket taken, for the response headers.
    rate: Vec<(Unit, u64, u64)>,
    reservation: Reservation,
    /// The budget fallback was tried.
    alternative_tried: bool,
    /// The budget fallback applied (a re-entering pass writes it again).
    switched: Option<Box<Alternative>>,
    /// Adopted from a superseded pass: admitted there, its body still awaits the same edits.
    reentered: bool,
    /// `request_id` is the logical id, so a re-entering pass can find this admission.
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
#[derive(Debug)]
struct Call {
    kind: CallKind,
    script: &'static Script,
    keys: Vec<String>,
    args: Vec<i64>,
    service: String,
    resent: bool,
}

#[derive(Debug)]
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

// ---------------------------------------------------------------------------------------
// The core

/// The token-ratelimit stage of one worker VM.
pub struct Core {
    rules: Rc<RuleSet<Config>>,
    /// This VM's id in the sync election (and in ids of requests without one).
    nonce: u64,
    /// Redis is reached over HTTP (webdis): replies reach only the sending context.
    http: bool,
    flows: HashMap<u32, Flow>,
    calls: Pending<Call>,
    /// Scripts this VM knows Redis has cached (else `EVAL` with the source).
    loaded: HashSet<&'static str>,
    replaying: HashSet<u64>,
    /// Admissions of superseded passes, waiting for their re-entering pass.
    stash: Stash<Flow>,
    /// Settlements waiting for the next tick (HTTP transport).
    outbox: Vec<JournalEntry>,
    commands: VecDeque<Command>,
}

impl Core {
    /// A core over validated rules; `nonce` identifies this VM (random per VM); `http`:
    /// Redis is reached through webdis.
    pub fn new(rules: RuleSet<Config>, nonce: u64, http: bool) -> Core {
        Core {
            rules: Rc::new(rules),
            nonce,
            http,
            flows: HashMap::new(),
            calls: Pending::new(MAX_CALLS + 1),
            loaded: HashSet::new(),
            replaying: HashSet::new(),
            stash: Stash::default(),
            outbox: Vec::new(),
            commands: VecDeque::new(),
        }
    }

    /// The rules (the driver selects a config with them).
    pub fn rules(&self) -> &RuleSet<Config> {
        &self.rules
    }

    /// This VM's nonce.
    pub fn nonce(&self) -> u64 {
        self.nonce
    }

    /// Requests with state in this core (for tests and leak checks).
    pub fn requests(&self) -> usize {
        self.flows.len()
    }

    /// Redis calls awaiting a reply.
    pub fn calls_in_flight(&self) -> usize {
        self.calls.len()
    }

    /// Settlements waiting for the next tick.
    pub fn outbox_len(&self) -> usize {
        self.outbox.len()
    }

    /// The next effect to carry out.
    pub fn poll(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// Feeds one event in.
    pub fn handle(&mut self, now: u64, input: Input, env: &dyn Env) {
        match input {
            Input::RequestHeaders {
                ctx,
                config,
                head,
                end_of_stream,
            } => self.request_headers(env, now, ctx, config, head, end_of_stream),
            Input::RequestBody {
                ctx,
                size,
                end_of_stream,
            } => self.request_body(ctx, size, end_of_stream),
            Input::Body { ctx, size, body } => self.body(env, now, ctx, size, body),
            Input::BodyReplaced { ctx, result } => match result {
                Ok(()) => {
                    let staged = self.flows.get_mut(&ctx).and_then(|f| f.staged.take());
                    match staged {
                        Some(cost) => self.after_body(env, now, ctx, cost),
                        None => self.proceed(ctx),
                    }
                }
                Err(_) => self.refuse(ctx, Reject::internal("cannot write the request body")),
            },
            Input::ResponseHeaders { ctx } => self.response_headers(ctx),
            Input::Log { ctx, superseded } => self.log_request(env, now, ctx, superseded),
            Input::Done { ctx } => {
                let unsettled = self.flows.get(&ctx).is_some_and(|f| !f.abandoned);
                if unsettled {
                    self.settle(env, now, ctx);
                }
            }
            Input::Reply { token, reply } => {
                let Some(waiting) = self.calls.take(token) else {
                    return;
                };
                let reply = reply.map_err(|failure| {
                    if failure.forbidden {
                        self.count("webdis_forbidden", 1);
                    }
                    failure.why
                });
                self.on_reply(env, now, waiting.context_id, waiting.state, reply);
            }
            Input::Tick => self.on_tick(env, now),
        }
    }

    // -----------------------------------------------------------------------------------
    // Effects

    fn push(&mut self, command: Command) {
        self.commands.push_back(command);
    }

    fn count(&mut self, name: impl Into<Cow<'static, str>>, delta: i64) {
        self.push(Command::Count {
            name: name.into(),
            delta,
        });
    }

    fn log(&mut self, level: LogLevel, message: String) {
        self.push(Command::Log { level, message });
    }

    fn proceed(&mut self, ctx: u32) {
        self.push(Command::Proceed { ctx });
    }

    fn refuse(&mut self, ctx: u32, reject: Reject) {
        self.push(Command::Refuse { ctx, reject });
    }

    fn finish(&mut self, ctx: u32, step: Step) {
        match step {
            Step::Continue => self.proceed(ctx),
            Step::Wait => {}
            Step::Refuse(reject) => self.refuse(ctx, reject),
        }
    }

    // -----------------------------------------------------------------------------------
    // Request callbacks

    fn request_headers(
        &mut self,
        env: &dyn Env,
        now: u64,
        ctx: u32,
        config: Option<usize>,
        head: Head,
        end_of_stream: bool,
    ) {
        let rules = Rc::clone(&self.rules);
        let Some(index) = config.filter(|i| rules.configs().nth(*i).is_some_and(|c| !c.is_empty()))
        else {
            self.proceed(ctx);
            return;
        };
        let logical = head.logical_id.is_some();
        let request_id = head
            .logical_id
            .or(head.stream_id)
            .unwrap_or_else(|| format!("ctx-{}-{ctx}", self.nonce));
        let expired = self.stash.expire(now);
        self.settle_dropped(env, now, ctx, expired);
        let adopted = self.stash.adopt(head.reentry, &request_id, now);
        let flow = match adopted {
            Pass::Reentry(carried) => {
                self.count("reentry_adopted", 1);
                Flow {
                    reentered: true,
                    ..carried
                }
            }
            Pass::First | Pass::Lost => {
                if matches!(adopted, Pass::Lost) {
                    self.count("reentry_lost", 1);
                    self.log(
                        LogLevel::Warn,
                        "re-entered request without a stashed admission: admitted afresh".into(),
                    );
                }
                Flow {
                    config: index,
                    identity: head.identity,
                    request_id,
                    logical,
                    path: head.path,
                    ..Flow::default()
                }
            }
        };
        let reentered = flow.reentered;
        self.flows.insert(ctx, flow);
        if end_of_stream {
            if reentered {
                self.proceed(ctx);
                return;
            }
            let step = self.advance(env, now, ctx);
            self.finish(ctx, step);
        }
        // else: headers held until the body is read
    }

    fn request_body(&mut self, ctx: u32, size: usize, end_of_stream: bool) {
        let config_index = match self.flows.get(&ctx) {
            Some(flow) if flow.reentered || (flow.cost.is_none() && !flow.admitted) => flow.config,
            _ => {
                self.proceed(ctx);
                return;
            }
        };
        let rules = Rc::clone(&self.rules);
        let Some(config) = rules.configs().nth(config_index) else {
            self.proceed(ctx);
            return;
        };
        if size > config.max_body_bytes {
            self.refuse(
                ctx,
                Reject::new(
                    413,
                    ErrorType::InvalidRequest,
                    "request_too_large",
                    format!(
                        "request bodies over {} bytes are not accepted",
                        config.max_body_bytes
                    ),
                ),
            );
            return;
        }
        if end_of_stream {
            self.push(Command::ReadBody { ctx, size });
        }
    }

    fn body(
        &mut self,
        env: &dyn Env,
        now: u64,
        ctx: u32,
        size: usize,
        body: Result<Vec<u8>, HostError>,
    ) {
        let Ok(body) = body else {
            self.refuse(ctx, Reject::internal("cannot read the request body"));
            return;
        };
        let (config_index, path, reentered) = match self.flows.get(&ctx) {
            Some(flow) => (flow.config, flow.path.clone(), flow.reentered),
            None => {
                self.proceed(ctx);
                return;
            }
        };
        let rules = Rc::clone(&self.rules);
        let Some(config) = rules.configs().nth(config_index) else {
            self.proceed(ctx);
            return;
        };
        // A re-entering pass keeps its first pass's estimate: its body only needs the same
        // edits, so the tokenizer does not run (sample of 0 bytes).
        let sample_bytes = if reentered {
            0
        } else {
            config.tokenizer_sample_bytes
        };
        let mut cost = match cost::inspect(
            &path,
            &body,
            config.default_max_tokens,
            config.prompt_margin_percent,
            sample_bytes,
        ) {
            Ok(cost) => cost,
            Err(reject) => {
                self.refuse(ctx, reject);
                return;
            }
        };
        match cost.body.take() {
            Some(edited) => {
                // the headers are held, so the body can change length
                if let Some(flow) = self.flows.get_mut(&ctx) {
                    flow.staged = Some(cost);
                }
                self.push(Command::ReplaceBody {
                    ctx,
                    size,
                    body: edited,
                });
            }
            None => self.after_body(env, now, ctx, cost),
        }
    }

    /// The body is read (and edited): admit, or — a re-entering pass — write the first
    /// pass's budget fallback again unless the router already routes there, and go on.
    fn after_body(&mut self, env: &dyn Env, now: u64, ctx: u32, cost: Cost) {
        let Some(flow) = self.flows.get_mut(&ctx) else {
            self.proceed(ctx);
            return;
        };
        if flow.reentered {
            flow.reentered = false;
            if let Some(alt) = flow.switched.clone() {
                let routed = env.route_info(ctx).map(|r| r.model_group);
                if reentry::reapply_switch(alt.group(), routed.as_deref()) {
                    self.write_switch(ctx, &alt);
                    self.count("reentry_switch_rewritten", 1);
                }
            }
            self.proceed(ctx);
            return;
        }
        flow.cost = Some(cost);
        let step = self.advance(env, now, ctx);
        self.finish(ctx, step);
    }

    fn response_headers(&mut self, ctx: u32) {
        let Some(flow) = self.flows.get(&ctx) else {
            return;
        };
        let mut headers: Vec<Command> = decide::rate_headers(&flow.rate)
            .into_iter()
            .map(|(name, value)| Command::SetResponseHeader { ctx, name, value })
            .collect();
        if !flow.warnings.is_empty() {
            headers.push(Command::SetResponseHeader {
                ctx,
                name: decide::BUDGET_WARNING_HEADER,
                value: flow.warnings.join(", "),
            });
        }
        self.commands.extend(headers);
    }

    // -----------------------------------------------------------------------------------
    // Redis health (per instance)

    fn redis_down(&self, env: &dyn Env, now: u64) -> bool {
        match env.shared_get(REDIS_KEY) {
            Ok((Some(v), _)) => decode_u64(&v) > now,
            _ => false,
        }
    }

    fn mark_down(&mut self, env: &dyn Env, now: u64, why: &str) {
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

    fn mark_up(&mut self, env: &dyn Env) {
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

    fn mode(&self, env: &dyn Env, config: &Config, now: u64) -> Mode {
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
    fn send(&mut self, env: &dyn Env, now: u64, call: Call, ctx: u32) -> Result<(), Box<Call>> {
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
    fn lease_call(
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
    fn advance(&mut self, env: &dyn Env, now: u64, id: u32) -> Step {
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
    fn advance_flow(
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
            let Some(keys) = budget::bucket_keys(limit, &flow.identity) else {
                flow.next_limit += 1;
                continue;
            };
            let units = match limit.unit {
                Unit::Requests => 1,
                Unit::Tokens => tokens,
            };
            let spec = spec_of(config, index);
            match take(env, &keys, mode, &spec, units, now) {
                Ok((
                    Take::Admit {
                        wants_lease,
                        emergency,
                    },
                    remaining,
                )) => {
                    if wants_lease {
                        want(env, &keys);
                    }
                    if emergency {
                        self.count(format!("emergency_admits.{}", limit.name), 1);
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
                    self.count(format!("rate_limited.{}", limit.name), 1);
                    let reject = decide::rate_limited(limit, units, retry_after_ms, never);
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
    fn reserve(
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
    fn without_redis(
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
    fn refused(
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
                            env,
                            now,
                            id,
                            flow,
                            config,
                            levels.to_vec(),
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

    fn note_warnings(&mut self, flow: &mut Flow, config: &Config, levels: &[Level], spent: &[u64]) {
        for (level, spent) in levels.iter().zip(spent) {
            let Some(b) = config.budgets.get(level.budget) else {
                continue;
            };
            if let Some(percent) = decide::warning(b, *spent) {
                self.count(format!("budget_warning.{}.{percent}", b.name), 1);
                flow.warnings.push(format!("{}={percent}", b.name));
            }
        }
    }

    /// Applies the router's published alternative: the request now goes to the cheaper group.
    fn switch(&mut self, ctx: u32, flow: &mut Flow, alt: &Alternative) {
        self.write_switch(ctx, alt);
        self.count("budget_fallback", 1);
        flow.switched = Some(Box::new(alt.clone()));
    }

    /// An alternative's switch: filter state, headers, the held body's `model`, and the
    /// route cache.
    fn write_switch(&mut self, ctx: u32, alt: &Alternative) {
        let writes = alt.switch_writes();
        for (name, value) in writes.properties {
            self.push(Command::SetProperty { ctx, name, value });
        }
        for (name, value) in writes.set_headers {
            self.push(Command::SetRequestHeader { ctx, name, value });
        }
        for name in writes.remove_headers {
            self.push(Command::RemoveRequestHeader { ctx, name });
        }
        self.push(Command::RewriteModel {
            ctx,
            model: writes.model,
        });
        self.push(Command::ClearRouteCache { ctx });
    }

    /// Gives every taken unit back (the request was refused or never forwarded).
    fn give_back_all(&mut self, env: &dyn Env, flow: &mut Flow, config: &Config, now: u64) {
        for taken in flow.taken.drain(..) {
            let spec = spec_of(config, taken.limit);
            let mode = self.mode(env, config, now);
            settle_bucket(
                env,
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

    fn on_reply(
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

    fn call_failed(&mut self, env: &dyn Env, now: u64, call: Call, sent: Sent) {
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
    fn cancel_reservation(&mut self, env: &dyn Env, now: u64, key: &str, levels: &[Level]) {
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

    fn call_answered(&mut self, env: &dyn Env, now: u64, call: Call, reply: Reply) {
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
                self.count("leased_tokens", i64::try_from(lease.granted).unwrap_or(0));
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
    fn resume(&mut self, env: &dyn Env, now: u64, id: u32) {
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
    fn finish_step(&mut self, env: &dyn Env, now: u64, id: u32, step: Option<Step>) {
        let step = match step {
            None => self.advance(env, now, id),
            Some(step) => step,
        };
        self.finish(id, step);
    }

    // -----------------------------------------------------------------------------------
    // Settling

    /// `on_log` of a request: settles it, or — superseded by an internal redirect — stashes
    /// its admission for the pass that re-enters ([`crate::reentry`]).
    fn log_request(&mut self, env: &dyn Env, now: u64, id: u32, superseded: bool) {
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
    fn settle_dropped(&mut self, env: &dyn Env, now: u64, ctx: u32, dropped: Vec<Flow>) {
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

    fn settle(&mut self, env: &dyn Env, now: u64, id: u32) {
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
    fn abandon_calls(&mut self, env: &dyn Env, now: u64, id: u32) {
        let calls = self.calls.take_context(id);
        for (_, call) in calls {
            self.count("calls_abandoned", 1);
            self.call_failed(env, now, call, Sent::Unanswered);
        }
        self.flows.remove(&id);
    }

    /// Gives back the buckets' unused units and settles a local reservation; returns the
    /// Redis settlement to send, if any.
    fn settle_flow(
        &mut self,
        env: &dyn Env,
        now: u64,
        ctx: u32,
        flow: &mut Flow,
        config: &Config,
        record: Option<&Record>,
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
                let spec = spec_of(config, taken.limit);
                settle_bucket(env, &taken.local_key, mode, &spec, refund, now);
            }
        }

        // budgets
        let model = flow.cost.as_ref().and_then(|c| c.model.clone());
        let price = config.price_for(
            env.route_info(ctx).and_then(|r| r.price).as_ref(),
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
                settle_locally(env, &levels, &amounts, &actual);
                None
            }
        }
    }

    /// Sends a reconcile or charge, or journals it while Redis is unreachable. Over HTTP it
    /// waits in the outbox for the next tick, whose root context outlives the request
    /// (journaled if the outbox is full).
    fn settle_entry(&mut self, env: &dyn Env, now: u64, entry: JournalEntry) {
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

    fn settle_entry_now(&mut self, env: &dyn Env, now: u64, entry: JournalEntry) {
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

    fn journal(&mut self, env: &dyn Env, entry: JournalEntry) {
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

    // -----------------------------------------------------------------------------------
    // The sync worker

    fn elected(&self, env: &dyn Env, now: u64, period_ms: u64) -> bool {
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

    fn on_tick(&mut self, env: &dyn Env, now: u64) {
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
            let spec = spec_of(config, index);
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
        self.push(Command::Gauge {
            name: "journal_depth",
            value: journal.entries.len() as u64,
        });
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

// ---------------------------------------------------------------------------------------
// Shared data

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
fn lease_failed(env: &dyn Env, local_key: &str) {
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
fn take(
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

fn settle_bucket(env: &dyn Env, key: &str, mode: Mode, spec: &Spec, units: i64, now: u64) {
    let seed = Local::new(mode, spec, now).encode();
    // soft limits are eventually consistent: a refund lost to a contended key is tolerated
    let _ = update(env, key, &seed, |v| {
        let mut local = Local::decode(v).unwrap_or_else(|| Local::new(mode, spec, now));
        local.settle(mode, spec, units, now);
        (Some(local.encode().to_vec()), ())
    });
}

fn want(env: &dyn Env, keys: &BucketKeys) {
    let line = format!("{}\t{}\t{}", keys.local, keys.redis, keys.owner);
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
fn reserve_locally(
    env: &dyn Env,
    levels: &[Level],
    amounts: &[u64],
) -> Result<Vec<u64>, (usize, i64)> {
    let mut done: Vec<(usize, u64)> = Vec::new();
    let mut spent_after = Vec::with_capacity(levels.len());
    for (index, (level, amount)) in levels.iter().zip(amounts).enumerate() {
        let key = format!("{LOCAL_BUDGET_PREFIX}{}", level.key);
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
                        add_local(env, level, -i128::from(amount));
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

fn add_local(env: &dyn Env, level: &Level, delta: i128) {
    let key = format!("{LOCAL_BUDGET_PREFIX}{}", level.key);
    // no shared data: the per-instance budget fails open, as its reservation did
    let _ = update(env, &key, &0u64.to_le_bytes(), |v| {
        let spent = i128::from(decode_u64(v)) + delta;
        let spent = u64::try_from(spent.max(0)).unwrap_or(u64::MAX);
        (Some(spent.to_le_bytes().to_vec()), ())
    });
}

fn settle_locally(env: &dyn Env, levels: &[Level], reserved: &[u64], actual: &[u64]) {
    for ((level, reserved), actual) in levels.iter().zip(reserved).zip(actual) {
        let delta = i128::from(*actual) - i128::from(*reserved);
        if delta != 0 {
            add_local(env, level, delta);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Helpers

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

fn clock_arg(config: &Config, now: u64) -> u64 {
    match config.clock {
        Clock::Redis => 0,
        Clock::Gateway => now,
    }
}

fn wire(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// The little-endian `u64` a shared-data value starts with (0 if shorter).
pub fn decode_u64(bytes: &[u8]) -> u64 {
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

#[cfg(test)]
mod tests;
