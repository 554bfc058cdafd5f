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
use crate::counts::TextCounts;
use crate::decide;
use crate::fxhash::{FxHashMap, FxHashSet};
use crate::reentry::{self, AtLog};
use crate::scripts::{self, Script, ScriptError};
use crate::settle;
use llm_gateway_shared::pending::Pending;
use llm_gateway_shared::reentry::{Pass, Stash};
use llm_gateway_shared::reject::{ErrorType, Reject};
use llm_gateway_shared::route_info::{Alternative, RoutePrices};
use llm_gateway_shared::rules::RuleSet;
use llm_gateway_shared::stage::{self, Map, Name};
use llm_gateway_shared::usage_record::Charge;
use llm_gateway_shared::wire::HostError;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::rc::Rc;

mod admission;
mod replies;
mod settlement;
mod store;
mod sync;

pub use store::update;

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
    /// The group and prices of the router's route of request `ctx` (`PROPERTY`), if
    /// published.
    fn route_info(&self, ctx: u32) -> Option<RoutePrices>;
    /// The router's budget fallback of request `ctx`, if published.
    fn alternative(&self, ctx: u32) -> Option<Alternative>;
    /// The usage record of request `ctx`, published under `property`.
    /// (What settling needs of it: its usage and cost.)
    fn usage_record(&self, ctx: u32, property: &str) -> Option<Charge>;
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
    /// The body is framed by `content-length` (an edited body then gets its new length).
    pub framed: bool,
}

/// Why a Redis call got no reply (the shared client's failure, whichever transport).
pub use llm_gateway_shared::redis::Unanswered;

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
    /// The body [`Await::Body`] asked for.
    Body {
        ctx: u32,
        size: usize,
        body: Result<Vec<u8>, HostError>,
    },
    /// The outcome of a body replace ([`Await::Written`]; a failure comes through
    /// [`Core::failed`] and is handled as this input with an error).
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

impl Input {
    /// Whether the core reads the clock for this input (a driver may skip reading the time
    /// for one that does not, and pass 0).
    pub fn uses_clock(&self) -> bool {
        !matches!(
            self,
            Input::ResponseHeaders { .. } | Input::RequestBody { .. }
        )
    }
}

/// Log levels of the core's lines.
pub use llm_gateway_shared::level::Level as LogLevel;

/// The core's metric names (`llm_gateway.ratelimit.<name>`, counters and gauges alike).
pub type Metric = Name;

/// One effect for the driver to carry out, in order: the shared stage vocabulary
/// ([`llm_gateway_shared::stage`]) with token-ratelimit's own effects ([`Own`]). [`Core::poll`]
/// pairs each with the request it addresses ([`NO_REQUEST`] for counts, gauges and log lines).
pub type Effect = stage::Effect<Metric, Reject, Own>;

/// The context id of effects that address no request (counts, gauges, log lines).
pub const NO_REQUEST: u32 = 0;

/// What only token-ratelimit asks of the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Own {
    /// Let the request go on: `Continue` in its own callback, else resume it (a Redis reply
    /// or a tick decided for a paused request).
    Resume,
    /// Rewrite the held request body's `model` (the budget fallback); the host reads the body.
    RewriteModel(String),
}

/// What the core waits for from the driver once the effects are carried out: the answer comes
/// back as an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Await {
    /// Read request `ctx`'s buffered body (`size` bytes): [`Input::Body`].
    Body { ctx: u32, size: usize },
    /// The body replace ([`stage::Effect::ReplaceRequestBody`]) of request `ctx` went
    /// through (it did not fail): [`Input::BodyReplaced`].
    Written { ctx: u32 },
}

// ---------------------------------------------------------------------------------------
// Per-request state

/// One bucket a request took from.
#[derive(Debug, Clone)]
struct Taken {
    local_key: String,
    limit: usize,
    /// The limit's amount for the request's tier (its bucket's spec).
    amount: u64,
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
    /// [`Head::framed`].
    framed: bool,
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
    flows: FxHashMap<u32, Flow>,
    calls: Pending<Call>,
    /// Scripts this VM knows Redis has cached (else `EVAL` with the source).
    loaded: FxHashSet<&'static str>,
    /// Owner digests of the bucket ids seen (one SHA-256 per identity, not per request).
    owners: budget::Owners,
    replaying: FxHashSet<u64>,
    /// Admissions of superseded passes, waiting for their re-entering pass.
    stash: Stash<Flow>,
    /// Settlements waiting for the next tick (HTTP transport).
    outbox: Vec<JournalEntry>,
    /// The tokenizer's counts of prompt texts this VM counted before.
    counts: TextCounts,
    effects: VecDeque<(u32, Effect)>,
    /// What the driver answers once it carried the effects out.
    awaiting: Option<Await>,
}

impl Core {
    /// A core over validated rules; `nonce` identifies this VM (random per VM); `http`:
    /// Redis is reached through webdis.
    pub fn new(rules: RuleSet<Config>, nonce: u64, http: bool) -> Core {
        Core {
            rules: Rc::new(rules),
            nonce,
            http,
            flows: FxHashMap::default(),
            calls: Pending::new(MAX_CALLS + 1),
            loaded: FxHashSet::default(),
            owners: budget::Owners::default(),
            replaying: FxHashSet::default(),
            stash: Stash::default(),
            outbox: Vec::new(),
            counts: TextCounts::default(),
            effects: VecDeque::new(),
            awaiting: None,
        }
    }

    /// The rules (the driver selects a config with them).
    pub fn rules(&self) -> &RuleSet<Config> {
        &self.rules
    }

    /// The index the core knows a selected config by; `None` when it has nothing to enforce
    /// (the request goes on untouched).
    pub fn config_index(&self, selected: &Config) -> Option<usize> {
        if selected.is_empty() {
            return None;
        }
        Some(
            self.rules
                .configs()
                .position(|c| std::ptr::eq(c, selected))
                .unwrap_or(0),
        )
    }

    /// Requests with state in this core (for tests and leak checks).
    pub fn requests(&self) -> usize {
        self.flows.len()
    }

    /// Request `ctx` has state here that its `on_log` has not settled ([`Input::Done`] would
    /// settle it).
    pub fn unsettled(&self, ctx: u32) -> bool {
        self.flows.get(&ctx).is_some_and(|f| !f.abandoned)
    }

    /// True if [`Input::Log`] for request `ctx` needs to know whether its pass was superseded
    /// (its config watches for re-entry, `reentry`); otherwise every pass is final and the host
    /// need not be asked. A request this core does not know is asked about, as before.
    pub fn watches_supersession(&self, ctx: u32) -> bool {
        self.flows
            .get(&ctx)
            .and_then(|f| self.rules.configs().nth(f.config))
            .is_none_or(|c| c.reentry)
    }

    /// Redis calls awaiting a reply.
    pub fn calls_in_flight(&self) -> usize {
        self.calls.len()
    }

    /// Settlements waiting for the next tick.
    pub fn outbox_len(&self) -> usize {
        self.outbox.len()
    }

    /// Whether the core reads the clock for `input` as things stand ([`Input::uses_clock`],
    /// narrowed): the headers of a request that hold it for its body need the time only to
    /// expire or adopt a stashed admission, so a driver reads the clock for them only when
    /// the request re-enters or the stash holds something.
    pub fn uses_clock(&self, input: &Input) -> bool {
        match input {
            Input::RequestHeaders {
                head,
                end_of_stream,
                ..
            } => *end_of_stream || head.reentry || !self.stash.is_empty(),
            other => other.uses_clock(),
        }
    }

    /// The next effect to carry out and the request it addresses.
    pub fn poll(&mut self) -> Option<(u32, Effect)> {
        self.effects.pop_front()
    }

    /// What the driver must answer (with an input) once every effect is carried out.
    pub fn take_await(&mut self) -> Option<Await> {
        self.awaiting.take()
    }

    /// The host could not carry `effect` for request `ctx` out (`error` says why): a failed
    /// body replace refuses the request; anything else is logged, the request goes on.
    pub fn failed(&mut self, ctx: u32, effect: Effect, error: String) {
        use LogLevel::{Debug, Error, Warn};
        let (level, what) = match effect {
            Effect::ReplaceRequestBody { .. } => {
                if self.awaiting == Some(Await::Written { ctx }) {
                    self.awaiting = None;
                }
                return self.refuse(ctx, Reject::internal("cannot write the request body"));
            }
            Effect::Own(Own::Resume) => (Warn, "resume a request".into()),
            Effect::Own(Own::RewriteModel(_)) => {
                (Warn, "rewrite the model (budget fallback)".into())
            }
            Effect::Refuse(_) => (Error, "send the local reply".into()),
            Effect::SetProperty { .. } => (Debug, "set".into()),
            Effect::SetHeader(_, name, _) => (Debug, name.into_owned()),
            Effect::RemoveHeader(_, name) => (Debug, name.to_string()),
            Effect::ClearRouteCache => (Debug, "clear the route cache".into()),
            Effect::ReplaceResponseBody { .. }
            | Effect::Count(..)
            | Effect::Gauge(..)
            | Effect::Log(..) => (Debug, "carry an effect out".into()),
        };
        self.log(level, format!("cannot {what}: {error}"));
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
                if self.unsettled(ctx) {
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

    fn push(&mut self, ctx: u32, effect: Effect) {
        self.effects.push_back((ctx, effect));
    }

    fn count(&mut self, name: impl Into<Cow<'static, str>>, delta: u64) {
        self.push(NO_REQUEST, Effect::Count(name.into(), delta));
    }

    /// A log line, prefixed with the plugin's name.
    fn log(&mut self, level: LogLevel, message: String) {
        let line = format!("token-ratelimit: {message}");
        self.push(NO_REQUEST, Effect::Log(level, line));
    }

    fn proceed(&mut self, ctx: u32) {
        self.push(ctx, Effect::Own(Own::Resume));
    }

    fn refuse(&mut self, ctx: u32, reject: Reject) {
        self.push(ctx, Effect::Refuse(reject));
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
                    framed: head.framed,
                    // this pass's API: the router may send each pass of a mixed group to a
                    // deployment of another API than the first pass's
                    path: head.path,
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
                    framed: head.framed,
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
            self.awaiting = Some(Await::Body { ctx, size });
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
        let (config_index, path, reentered, framed) = match self.flows.get(&ctx) {
            Some(flow) => (flow.config, flow.path.clone(), flow.reentered, flow.framed),
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
        let mut cost = match cost::inspect_cached(
            &path,
            &body,
            config.default_max_tokens,
            config.prompt_margin_percent,
            sample_bytes,
            &mut self.counts,
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
                let replace = Effect::ReplaceRequestBody {
                    size,
                    body: edited,
                    frame: framed,
                };
                self.push(ctx, replace);
                self.awaiting = Some(Await::Written { ctx });
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
        let set =
            |name: &'static str, value| (ctx, Effect::SetHeader(Map::Response, name.into(), value));
        let mut headers: Vec<(u32, Effect)> = decide::rate_headers(&flow.rate)
            .into_iter()
            .map(|(name, value)| set(name, value))
            .collect();
        if !flow.warnings.is_empty() {
            headers.push(set(decide::BUDGET_WARNING_HEADER, flow.warnings.join(", ")));
        }
        self.effects.extend(headers);
    }
}

// ---------------------------------------------------------------------------------------
// Helpers

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

/// The bucket spec of limit `index` at `amount` (the amount of the request's tier: a lease
/// batch is a percentage of it).
fn spec_of(config: &Config, index: usize, amount: u64) -> Spec {
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
            amount,
            limit.window_ms,
            config.lease.batch_percent,
            config.lease.low_percent,
        )
    }
}

#[cfg(test)]
mod tests;
