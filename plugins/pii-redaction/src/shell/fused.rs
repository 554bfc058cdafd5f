//! The fused filter (plugins/bundle): the same state and core, one stage of its chain.

use super::*;

/// This plugin configured from its section of the fused filter's configuration (the same
/// document its own filter takes).
pub struct Fused(Rc<State>);

impl Fused {
    /// Parses the section; `None` (logged) if it is invalid.
    pub fn configure(document: &[u8]) -> Option<Fused> {
        let rules = host::parse_config("pii-redaction", document, parse_document)?;
        let metrics = Metrics::define(&rules);
        Some(Fused(Rc::new(State {
            rules,
            metrics,
            worker: RefCell::default(),
        })))
    }

    /// The stage of one request.
    pub fn stage(&self) -> FusedStage {
        FusedStage {
            state: Rc::clone(&self.0),
            exchange: Exchange::default(),
        }
    }
}

/// One request's pii-redaction stage in the fused filter.
pub struct FusedStage {
    state: Rc<State>,
    exchange: Exchange,
}

impl FusedStage {
    fn drive(&mut self, x: &mut chain::Exchange, input: Input<'_>) -> Flow {
        drive(
            Some(&self.state),
            &mut self.exchange,
            input,
            &mut Sink::Fused(x),
        )
    }
}

impl chain::Stage<chain::Exchange> for FusedStage {
    fn headers(&mut self, x: &mut chain::Exchange, direction: Direction, end: bool) -> Step {
        let flow = match direction {
            Direction::Request => {
                let head = RequestHead::shared(x.request.shared());
                let Some(config) =
                    host::select_config(&self.state.rules, Some(&head.authority)).cloned()
                else {
                    return Step::Continue;
                };
                let input = Input::RequestHeaders {
                    configured: true,
                    config: Some(config),
                    head: &head,
                    end_of_stream: end,
                };
                let flow = self.drive(x, input);
                // the body is scanned whole: the stage holds it
                if flow != Flow::Refused && self.exchange.scans_request_body() {
                    return Step::Buffer;
                }
                flow
            }
            Direction::Response => {
                if end || !self.exchange.may_restore() {
                    return Step::Continue;
                }
                let encoding = x.response.text("content-encoding").map(str::to_owned);
                let content_type = x.response.text("content-type").map(str::to_owned);
                let input = Input::ResponseHeaders {
                    content_encoding: encoding.as_deref(),
                    content_type: content_type.as_deref(),
                    end_of_stream: end,
                };
                let flow = self.drive(x, input);
                // a JSON answer is restored whole
                if flow != Flow::Refused
                    && self.exchange.wants_response_body(true)
                    && !self.exchange.wants_response_body(false)
                {
                    return Step::Buffer;
                }
                flow
            }
        };
        step(flow)
    }

    fn data(&mut self, x: &mut chain::Exchange, direction: Direction, end: bool) -> Step {
        let flow = match direction {
            Direction::Request => {
                if !self.exchange.wants_request_body(x.data.len(), end) {
                    let input = Input::RequestBody {
                        size: x.data.len(),
                        end_of_stream: end,
                        body: None,
                    };
                    self.drive(x, input)
                } else {
                    x.with_data(|body, x| {
                        let input = Input::RequestBody {
                            size: body.len(),
                            end_of_stream: end,
                            body: Some(body),
                        };
                        self.drive(x, input)
                    })
                }
            }
            Direction::Response => {
                if !self.exchange.wants_response_body(end) {
                    Flow::Continue
                } else {
                    x.with_data(|chunk, x| {
                        let input = Input::ResponseBody {
                            end_of_stream: end,
                            chunk: Some(chunk),
                        };
                        self.drive(x, input)
                    })
                }
            }
        };
        step(flow)
    }

    fn log(&mut self, x: &mut chain::Exchange) {
        if !self.exchange.stashes_when_superseded() {
            return;
        }
        let superseded = is_superseded(x.code_details(host::code_details));
        self.drive(x, Input::Log { superseded });
    }
}

/// A step's answer from the core's flow (a data step that pauses holds for the whole body).
fn step(flow: Flow) -> Step {
    match flow {
        Flow::Continue => Step::Continue,
        Flow::Pause => Step::Buffer,
        Flow::Refused => Step::Stop,
    }
}
