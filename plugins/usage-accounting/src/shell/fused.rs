//! The fused filter (plugins/bundle): the same state and core, one stage of its chain.

use super::*;

/// This plugin configured from its section of the fused filter's configuration (the same
/// document its own filter takes; a ledger only over HTTP to webdis: the fused filter is for
/// plain Envoy).
pub struct Fused(Rc<State>);

impl Fused {
    /// Parses the section; `None` (logged) if it is invalid.
    pub fn configure(document: &[u8]) -> Option<Fused> {
        let rules = host::parse_config("usage-accounting", document, parse_shared)?;
        let ledger_errors = Metric::counter("llm_gateway.usage.ledger_errors").ok();
        if !ledger::init(&rules, ledger_errors) {
            return None;
        }
        Some(Fused(Rc::new(State {
            rules,
            series: RefCell::new(HashMap::default()),
            translations: RefCell::default(),
            ledger_errors,
            // the fused filter's requests send their appends themselves
            ledger_queue: None,
            worker: RefCell::default(),
        })))
    }

    /// The stage of one request.
    pub fn stage(&self) -> FusedStage {
        FusedStage {
            state: Rc::clone(&self.0),
            stage: Stage::default(),
        }
    }

    /// A webdis answer to a ledger append sent by one of this plugin's stages.
    pub fn ledger_reply(&self, body_size: usize) {
        ledger::http_reply(body_size, self.0.ledger_errors);
    }
}

/// One request's usage-accounting stage in the fused filter.
pub struct FusedStage {
    state: Rc<State>,
    stage: Stage,
}

impl FusedStage {
    fn drive(&mut self, x: &mut chain::Exchange, input: Input<'_>) -> Flow {
        drive(&self.state, &mut self.stage, input, &mut Sink::Fused(x))
    }
}

impl chain::Stage<chain::Exchange> for FusedStage {
    fn headers(&mut self, x: &mut chain::Exchange, direction: Direction, end: bool) -> Step {
        match direction {
            Direction::Request => {
                let head = RequestHead::shared(x.request.shared());
                let config = host::select_config(&self.state.rules, Some(&head.authority)).cloned();
                let input = Input::RequestHeaders {
                    config,
                    head: &head,
                    end_of_stream: end,
                };
                let flow = self.drive(x, input);
                // a body that may get `include_usage` is read whole
                if flow == Flow::Pause || self.stage.holds_request_body() {
                    Step::Buffer
                } else {
                    Step::Continue
                }
            }
            Direction::Response => {
                if !self.stage.is_active() {
                    return Step::Continue;
                }
                let status = x
                    .response
                    .text(":status")
                    .and_then(|v| v.parse::<u16>().ok());
                let content_type = x
                    .response
                    .text("content-type")
                    .unwrap_or_default()
                    .to_owned();
                let content_length = x
                    .response
                    .text("content-length")
                    .and_then(|v| v.trim().parse().ok());
                let encoded = x
                    .response
                    .get("content-encoding")
                    .is_some_and(|v| !v.is_empty() && !v.eq_ignore_ascii_case(b"identity"));
                let input = Input::ResponseHeaders {
                    status: status.unwrap_or(0),
                    content_type: &content_type,
                    content_length,
                    encoded,
                    end_of_stream: end,
                };
                match self.drive(x, input) {
                    Flow::Continue => Step::Continue,
                    Flow::Pause => Step::Buffer,
                    Flow::Refused => Step::Stop,
                }
            }
        }
    }

    fn data(&mut self, x: &mut chain::Exchange, direction: Direction, end: bool) -> Step {
        if !self.stage.is_active() {
            return Step::Continue;
        }
        let wants = match direction {
            Direction::Request => self.stage.wants_request_body(end),
            Direction::Response => self.stage.wants_response_body(end),
        };
        let flow = x.with_data(|data, x| {
            let body = wants.then_some(data);
            let input = match direction {
                Direction::Request => Input::RequestBody {
                    size: data.len(),
                    end_of_stream: end,
                    body,
                },
                Direction::Response => Input::ResponseBody {
                    size: data.len(),
                    end_of_stream: end,
                    body,
                },
            };
            self.drive(x, input)
        });
        match flow {
            Flow::Continue => Step::Continue,
            Flow::Pause => Step::Buffer,
            Flow::Refused => Step::Stop,
        }
    }

    fn log(&mut self, x: &mut chain::Exchange) {
        if !self.stage.is_active() {
            return;
        }
        let superseded =
            self.stage.watches_supersession() && is_superseded(x.code_details(host::code_details));
        self.drive(x, Input::Log { superseded });
    }
}
