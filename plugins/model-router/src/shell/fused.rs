//! The fused filter (plugins/bundle): the same core, one stage of its chain.

use super::*;
use llm_gateway_shared::request::RequestHead;
use llm_gateway_shared::route_info::BUDGET_FALLBACK_PROPERTY;

/// This plugin configured from its section of the fused filter's configuration (the listener
/// role; the provider clusters' upstream filter stays a filter of its own, in the same VM,
/// where it finds these rules).
pub struct Fused(Rc<RefCell<Core>>);

impl Fused {
    /// Parses the section; `None` (logged) if it is invalid or not the listener role.
    pub fn configure(document: &[u8]) -> Option<Fused> {
        let rules = host::parse_config("model-router", document, parse_document)?;
        let seed = RandomState::new().hash_one(host::time_nanos());
        let core = Rc::new(RefCell::new(Core::new(seed, LISTENER.with(Rc::clone))));
        core.try_borrow_mut()
            .ok()?
            .configure(host::time_nanos(), rules, &HostStore);
        drain(&core, 0, Flow::Continue);
        let downstream = core
            .try_borrow()
            .is_ok_and(|c| c.role() == Role::Downstream);
        if !downstream {
            log(
                LogLevel::Error,
                "the fused filter takes the listener role; the upstream role is the clusters' filter",
            );
            return None;
        }
        Some(Fused(core))
    }

    /// The stage of request `context` (the fused filter's context id).
    pub fn stage(&self, context: u32) -> FusedStage {
        FusedStage {
            core: Rc::clone(&self.0),
            id: context,
            skip_response_body: false,
        }
    }
}

/// One request's model-router stage in the fused filter.
pub struct FusedStage {
    core: Rc<RefCell<Core>>,
    id: u32,
    skip_response_body: bool,
}

impl Drop for FusedStage {
    fn drop(&mut self) {
        if let Ok(mut core) = self.core.try_borrow_mut() {
            core.forget(self.id);
        }
    }
}

/// The fused exchange as the core's [`View`]: headers and bodies from memory, the rest from
/// the host.
struct FusedView<'a>(&'a chain::Exchange);

impl View for FusedView<'_> {
    fn request_header(&self, name: &str) -> Result<Option<Vec<u8>>, ReadError> {
        Ok(self.0.request.get(name).map(<[u8]>::to_vec))
    }

    fn request_headers(&self) -> Result<RequestHead, ReadError> {
        Ok(RequestHead::shared(self.0.request.shared()))
    }

    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        self.0.response.get(name).map(<[u8]>::to_vec)
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        match path {
            // read once per callback for every stage
            ["response", "code_details"] => self
                .0
                .code_details(host::code_details)
                .map(|details| details.as_bytes().to_vec()),
            _ => host::property(path).ok().flatten(),
        }
    }

    fn request_body(&self, size: usize) -> Result<Vec<u8>, ReadError> {
        Ok(self.0.data.get(..size).unwrap_or(&self.0.data).to_vec())
    }

    fn response_body(&self, size: usize) -> Option<Vec<u8>> {
        Some(self.0.data.get(..size).unwrap_or(&self.0.data).to_vec())
    }

    fn with_response_body(&self, size: usize, f: &mut dyn FnMut(&[u8])) {
        f(self.0.data.get(..size).unwrap_or(&self.0.data));
    }

    fn route_name(&self) -> String {
        host::route_name()
    }

    fn cluster_name(&self) -> String {
        host::cluster_name()
    }

    fn now_nanos(&self) -> u64 {
        host::clock(self.0)
    }
}

impl FusedStage {
    /// Feeds `input`, carries out the effects against the exchange; the flow and whether a
    /// local reply went out.
    fn run(&mut self, x: &mut chain::Exchange, input: Input) -> (Flow, bool) {
        let flow = match self.core.try_borrow_mut() {
            Ok(mut core) => core.handle(self.id, input, &FusedView(x), &HostStore),
            Err(_) => {
                log(LogLevel::Error, "re-entered while busy: request refused");
                return (Flow::Pause, true);
            }
        };
        let mut flow = flow;
        let mut replied = false;
        loop {
            let Some(Effect {
                command,
                on_failure,
            }) = self.core.try_borrow_mut().ok().and_then(|mut c| c.poll())
            else {
                return (flow, replied);
            };
            replied |= matches!(command, Command::Reply { .. } | Command::Refuse(_));
            if let Err(err) = execute_fused(command, x) {
                let changed = self
                    .core
                    .try_borrow_mut()
                    .ok()
                    .and_then(|mut c| c.failed(self.id, on_failure, &err.to_string()));
                if let Some(changed) = changed {
                    flow = changed;
                }
            }
        }
    }
}

/// Header and body edits go to the exchange (the driver writes them once, and clears the route
/// cache after the headers are written); the rest to the host.
fn execute_fused(command: Command, x: &mut chain::Exchange) -> Result<(), HostError> {
    match command {
        Command::SetHeader { map, name, value } => {
            match map {
                Map::Request => x.request.set(&name, &value),
                Map::Response => x.response.set(&name, &value),
            }
            Ok(())
        }
        Command::RemoveHeader { map, name } => {
            match map {
                Map::Request => x.request.remove(&name),
                Map::Response => x.response.remove(&name),
            }
            Ok(())
        }
        Command::SetRequestBody { body, .. } => {
            x.replace_data(body);
            Ok(())
        }
        Command::SetRequestLength(length) => {
            // A body framed by content-length gets its final length when the fused filter
            // frames it after every stage's edits (bundle `fused::frame`); only a request
            // without one (a redirect pass: Envoy removed it) is framed here.
            if x.request.get("content-length").is_none() {
                x.request
                    .set("content-length", length.to_string().as_bytes());
                x.request.remove("transfer-encoding");
            }
            Ok(())
        }
        Command::ClearRouteCache => {
            x.clear_route_cache = true;
            Ok(())
        }
        Command::SetProperty { name, value } => {
            let name: &str = &name;
            host::set_property(&[name], &value)?;
            // token-ratelimit's stage reads the budget fallback from here (not the route info
            // nor the attempt number: the clusters' filter rewrites both)
            if name == BUDGET_FALLBACK_PROPERTY {
                x.publish(name, &value);
            }
            Ok(())
        }
        Command::ReplaceResponseBody { body, .. } => {
            x.replace_data(body);
            Ok(())
        }
        Command::AppendResponseBody { bytes, .. } => {
            let mut data = std::mem::take(&mut x.data);
            data.extend_from_slice(&bytes);
            x.replace_data(data);
            Ok(())
        }
        other => execute(other),
    }
}

impl chain::Stage<chain::Exchange> for FusedStage {
    fn headers(&mut self, x: &mut chain::Exchange, direction: Direction, end: bool) -> Step {
        let input = match direction {
            Direction::Request => Input::RequestHeaders { end_of_stream: end },
            Direction::Response => Input::ResponseHeaders { end_of_stream: end },
        };
        match self.run(x, input) {
            (_, true) => Step::Stop,
            // the router reads the body's `model` before the headers may go on
            (Flow::Pause, false) if !end => Step::Buffer,
            (Flow::Pause, false) => Step::Stop,
            (Flow::ContinueSkipResponseBody, _) => {
                self.skip_response_body = true;
                Step::Continue
            }
            (Flow::Continue, _) => Step::Continue,
        }
    }

    fn data(&mut self, x: &mut chain::Exchange, direction: Direction, end: bool) -> Step {
        if direction == Direction::Response && self.skip_response_body {
            return Step::Continue;
        }
        let size = x.data.len();
        let input = match direction {
            Direction::Request => Input::RequestBody {
                size,
                end_of_stream: end,
            },
            Direction::Response => Input::ResponseBody {
                size,
                end_of_stream: end,
            },
        };
        match self.run(x, input) {
            (_, true) => Step::Stop,
            (Flow::Pause, false) if !end => Step::Buffer,
            (Flow::Pause, false) => Step::Stop,
            (Flow::ContinueSkipResponseBody, _) => {
                self.skip_response_body = true;
                Step::Continue
            }
            (Flow::Continue, _) => Step::Continue,
        }
    }

    fn log(&mut self, x: &mut chain::Exchange) {
        let _flow = self.run(x, Input::Log); // on_log returns nothing
    }
}
