//! The fused filter (plugins/bundle): the same core, the last stage of its chain.

use super::*;

/// This plugin configured from its section of the fused filter's configuration. Limits and
/// budgets are kept per instance in shared data; the Redis transports (Higress's calls,
/// webdis) are not run by the fused filter: a `redis` section is refused, and the separate
/// filters serve a fleet (`gateway-fleet.yaml`).
pub struct Fused(Rc<State>);

impl Fused {
    /// Parses the section; `None` (logged) if it is invalid or asks for Redis.
    pub fn configure(document: &[u8]) -> Option<Fused> {
        let rules = host::parse_config("token-ratelimit", document, parse_document)?;
        if rules.configs().any(|c| c.redis.is_some()) {
            log(
                LogLevel::Error,
                "the fused filter keeps limits and budgets per instance: `redis` is for the separate filters (gateway-fleet.yaml)",
            );
            return None;
        }
        let nonce = {
            use std::hash::BuildHasher;
            std::collections::hash_map::RandomState::new().hash_one(host::time_nanos())
        };
        Some(Fused(Rc::new(State {
            core: RefCell::new(Core::new(rules, nonce, false)),
            redis: None,
            metrics: RefCell::default(),
            effective: Cell::new(None),
        })))
    }

    /// The stage of request `context` (the fused filter's context id).
    pub fn stage(&self, context: u32) -> FusedStage {
        FusedStage {
            state: Rc::clone(&self.0),
            id: context,
        }
    }
}

/// One request's token-ratelimit stage in the fused filter.
pub struct FusedStage {
    state: Rc<State>,
    id: u32,
}

impl Drop for FusedStage {
    fn drop(&mut self) {
        // the context goes: an admission never settled is settled now (on_done)
        let unsettled = self.state.core.borrow().unsettled(self.id);
        if unsettled {
            let mut x = chain::Exchange::default();
            self.run(&mut x, Input::Done { ctx: self.id });
        }
    }
}

impl FusedStage {
    /// Feeds `input` and carries the commands out against the exchange; the step's answer:
    /// `Continue` once the core let the request go on, `Stop` after a refusal, `Wait`
    /// otherwise (the core holds the request).
    fn run(&self, x: &mut chain::Exchange, input: Input) -> Step {
        let mut step = Step::Wait;
        let mut now = None;
        let mut feed = |input: Input, x: &chain::Exchange| {
            let uses_clock = self.state.core.borrow().uses_clock(&input);
            let now = match uses_clock {
                true => *now.get_or_insert_with(|| host::clock(x) / 1_000_000),
                false => 0,
            };
            let env = FusedEnv {
                state: self.state.as_ref(),
                id: self.id,
                x,
            };
            self.state.core.borrow_mut().handle(now, input, &env);
        };
        feed(input, x);
        loop {
            let command = self.state.core.borrow_mut().poll();
            let Some(command) = command else { break };
            if let Some(answer) = self.execute(x, command, &mut step) {
                feed(answer, x);
            }
        }
        step
    }

    fn execute(&self, x: &mut chain::Exchange, command: Command, step: &mut Step) -> Option<Input> {
        let own = |ctx: u32| {
            if ctx != self.id {
                // without Redis the core answers every request in its own callbacks
                log(
                    LogLevel::Error,
                    &format!(
                        "fused: a command for request {ctx} from request {}",
                        self.id
                    ),
                );
            }
            ctx == self.id
        };
        match command {
            Command::Proceed { ctx } if own(ctx) => *step = Step::Continue,
            Command::Refuse { ctx, reject } if own(ctx) => {
                host::refuse(PLUGIN, &reject);
                *step = Step::Stop;
            }
            Command::ReadBody { ctx, size } => {
                let body = if own(ctx) {
                    Ok(x.data.get(..size).unwrap_or(&x.data).to_vec())
                } else {
                    Err(HostError::NotFound)
                };
                return Some(Input::Body { ctx, size, body });
            }
            Command::ReplaceBody { ctx, body, .. } => {
                let result = if own(ctx) {
                    x.replace_data(body);
                    Ok(())
                } else {
                    Err(HostError::NotFound)
                };
                return Some(Input::BodyReplaced { ctx, result });
            }
            Command::SetRequestHeader { ctx, name, value } if own(ctx) => {
                x.request.set(name, value.as_bytes());
            }
            Command::RemoveRequestHeader { ctx, name } if own(ctx) => x.request.remove(name),
            Command::RewriteModel { ctx, model } if own(ctx) => {
                if let Some(rewritten) = with_model(&x.data, &model) {
                    x.replace_data(rewritten);
                }
            }
            Command::ClearRouteCache { ctx } if own(ctx) => x.clear_route_cache = true,
            Command::SetResponseHeader { ctx, name, value } if own(ctx) => {
                x.response.set(name, value.as_bytes());
            }
            Command::SetProperty { name, value, .. } => {
                match host::set_property(&[name.as_str()], &value) {
                    Ok(()) => x.publish(&name, &value),
                    Err(err) => log(LogLevel::Debug, &format!("cannot set {name}: {err}")),
                }
            }
            other @ (Command::Count { .. } | Command::Gauge { .. } | Command::Log { .. }) => {
                let mut ignored = Action::Continue;
                return self.state.execute(None, other, &mut ignored);
            }
            // a header or body command for another request: logged by `own`
            _ => {}
        }
        None
    }
}

/// The core's host in the fused filter: the records the stages before this one published in
/// this request (the budget fallback, the usage record) are read from the exchange
/// ([`chain::Exchange::published`]), not asked of the host again. The route info is always
/// read from the host: the clusters' filter rewrites it.
struct FusedEnv<'a> {
    state: &'a State,
    id: u32,
    x: &'a chain::Exchange,
}

impl FusedEnv<'_> {
    /// What a stage of this filter published as `name` for this request, if any.
    fn published(&self, ctx: u32, name: &str) -> Option<&[u8]> {
        (ctx == self.id).then(|| self.x.published(name)).flatten()
    }
}

impl Env for FusedEnv<'_> {
    fn shared_get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), HostError> {
        self.state.shared_get(key)
    }

    fn shared_set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), HostError> {
        self.state.shared_set(key, value, cas)
    }

    fn send_redis(&self, service: &str, args: &[Cow<'_, [u8]>]) -> Result<u32, HostError> {
        self.state.send_redis(service, args)
    }

    fn route_info(&self, ctx: u32) -> Option<RoutePrices> {
        self.state.route_info(ctx)
    }

    fn alternative(&self, ctx: u32) -> Option<Alternative> {
        match self.published(ctx, BUDGET_FALLBACK_PROPERTY) {
            Some(bytes) => Alternative::from_json(bytes),
            None => self.state.alternative(ctx),
        }
    }

    fn usage_record(&self, ctx: u32, property: &str) -> Option<Charge> {
        match self.published(ctx, property) {
            Some(bytes) => Charge::from_json(bytes),
            None => self.state.usage_record(ctx, property),
        }
    }
}

impl chain::Stage<chain::Exchange> for FusedStage {
    fn headers(&mut self, x: &mut chain::Exchange, direction: Direction, end: bool) -> Step {
        match direction {
            Direction::Request => {
                let (config, counts_ip) = {
                    let core = self.state.core.borrow();
                    let authority = x.request.text(":authority");
                    let selected = host::select_config(core.rules(), authority);
                    (
                        selected.and_then(|c| core.config_index(c)),
                        selected.is_some_and(Config::counts_ip),
                    )
                };
                let head = match config {
                    Some(_) => read_head(counts_ip, |name| {
                        x.request
                            .text(name)
                            .filter(|v| !v.is_empty())
                            .map(str::to_owned)
                    }),
                    None => Head::default(),
                };
                let ctx = self.id;
                let step = self.run(
                    x,
                    Input::RequestHeaders {
                        ctx,
                        config,
                        head,
                        end_of_stream: end,
                    },
                );
                // held until the end of the body (a request with a body)
                match step {
                    Step::Wait if !end => Step::Buffer,
                    other => other,
                }
            }
            Direction::Response => {
                let ctx = self.id;
                self.run(x, Input::ResponseHeaders { ctx });
                Step::Continue
            }
        }
    }

    fn data(&mut self, x: &mut chain::Exchange, direction: Direction, end: bool) -> Step {
        match direction {
            Direction::Request => {
                let ctx = self.id;
                let size = x.data.len();
                self.run(
                    x,
                    Input::RequestBody {
                        ctx,
                        size,
                        end_of_stream: end,
                    },
                )
            }
            Direction::Response => Step::Continue,
        }
    }

    fn log(&mut self, x: &mut chain::Exchange) {
        let ctx = self.id;
        let watches = self
            .state
            .core
            .try_borrow()
            .map_or(true, |c| c.watches_supersession(ctx));
        let superseded = watches && is_superseded(x.code_details(host::code_details));
        self.run(x, Input::Log { ctx, superseded });
    }
}
