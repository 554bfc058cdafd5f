//! The stage core: what pii-redaction does with one request, without a host (sans-I/O, in
//! quinn-proto's shape).
//!
//! It speaks the one stage protocol ([`llm_gateway_shared::stage`]): the driver copies what
//! the host says into an [`Input`] and hands it to [`Exchange::handle`], which answers whether
//! the callback continues or pauses; then the one driver (`host::stage::carry`, the same for
//! the plugin's own filter and its stage of the fused filter) carries out the [`Command`]s
//! [`Exchange`] yields, in order. A command whose failure changes the outcome (removing a
//! header before the body is rewritten, replacing the body) comes back through
//! [`stage::Core::failed`]: the request is then refused, never forwarded unredacted.
//!
//! The per-worker state ([`Worker`]: the maps of superseded passes waiting for their
//! re-entering pass) is passed in; the clock is an argument.

use crate::config::{BodyScope, Oversize, PiiConfig};
use crate::mask::{Action, PlaceholderMap};
use crate::request::{redact_pass, Carried, Redaction};
use crate::response::{redact_output_body, restore_body, SseRestorer};
use llm_gateway_shared::reentry::{Pass, Stash};
use llm_gateway_shared::reject::{ErrorType, Reject};
use llm_gateway_shared::request::{Api, RequestHead};
#[cfg(test)]
use llm_gateway_shared::stage::ResponseHead;
use llm_gateway_shared::stage::{self, Effect, Env, Map, Read};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

/// What one worker keeps across requests.
#[derive(Default)]
pub struct Worker {
    /// Maps of superseded passes, waiting for their re-entering pass (never logged).
    stash: Stash<Carried>,
}

pub use llm_gateway_shared::stage::Flow;

/// One event of the request, with the host's data copied in: the one vocabulary
/// ([`stage::Input`]), with this plugin's configuration as its route selects it.
pub type Input<'a> = stage::Input<'a, Rc<PiiConfig>>;

/// Whether [`Exchange::handle`] reads its `now_ms` for `input` (the request headers of a
/// scanned route and the log, which adopt and stash a carried map): the driver reads the
/// host's clock only then.
pub fn reads_clock(input: &Input<'_>) -> bool {
    matches!(
        input,
        Input::RequestHeaders {
            config: Some(_),
            ..
        } | Input::Log { .. }
    )
}

/// A counter of `wasmcustom.llm_gateway.pii.*`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Request-side matches of a rule (by rule name).
    Matches(String),
    /// Matches of an output rule (by rule name).
    OutputMatches(String),
    /// Requests a `block` rule refused (by rule name).
    Blocked(String),
    /// Request bodies rewritten.
    Redacted,
    /// Bodies above `max_body_bytes` forwarded unscanned.
    OversizePassed,
    /// Bodies above `max_body_bytes` refused.
    OversizeRejected,
    /// `messages` scope bodies that were not JSON.
    InvalidJson,
    /// Responses restored.
    Restored,
    /// Responses not restored because they were compressed.
    RestoreSkipped,
}

/// Every counter `configs` can count and its stat name (without Envoy's `wasmcustom.`):
/// matches and blocks per rule name, matches per output rule, and the outcomes of the size
/// policy and of restoring. A rule name appears once however many configs have it.
pub fn counters<'a>(configs: impl IntoIterator<Item = &'a PiiConfig>) -> Vec<(Counter, String)> {
    let mut all: Vec<(Counter, String)> = Vec::new();
    let mut add = |counter: Counter, name: String| {
        if !all.iter().any(|(c, _)| *c == counter) {
            all.push((counter, name));
        }
    };
    for config in configs {
        for rule in config.output.iter().flat_map(|o| o.rules()) {
            let metric = rule.name.to_ascii_lowercase();
            add(
                Counter::OutputMatches(rule.name.clone()),
                format!("llm_gateway.pii.output_matches.{metric}"),
            );
        }
        for rule in config.redactor.rules() {
            let metric = rule.name.to_ascii_lowercase();
            if rule.action == Action::Block {
                add(
                    Counter::Blocked(rule.name.clone()),
                    format!("llm_gateway.pii.blocked.{metric}"),
                );
            } else {
                add(
                    Counter::Matches(rule.name.clone()),
                    format!("llm_gateway.pii.matches.{metric}"),
                );
            }
        }
    }
    for (counter, name) in [
        (Counter::Redacted, "requests_redacted"),
        (Counter::OversizePassed, "oversize_passed"),
        (Counter::OversizeRejected, "oversize_rejected"),
        (Counter::InvalidJson, "invalid_json"),
        (Counter::Restored, "responses_restored"),
        (Counter::RestoreSkipped, "restore_skipped_encoded"),
    ] {
        add(counter, format!("llm_gateway.pii.{name}"));
    }
    all
}

pub use llm_gateway_shared::level::Level;

/// Why a request is refused; its [`stage::Refusal::reject`] is the one mapping to the OpenAI error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The plugin has no valid configuration.
    NotConfigured,
    /// A header could not be removed before the body was rewritten.
    CannotPrepare,
    /// The request body could not be read.
    CannotRead,
    /// The redacted body could not replace the original.
    CannotRedact,
    /// A `block` rule matched.
    Blocked {
        /// The rule's name.
        rule: String,
    },
    /// `messages` scope and the body is not JSON (the parser's reason).
    InvalidJson(String),
    /// The body is above `max_body_bytes` and the policy is `reject`.
    TooLarge {
        /// The configured maximum.
        max_body_bytes: usize,
    },
}

impl stage::Refusal for Refusal {
    fn reject(&self) -> Reject {
        match self {
            Refusal::NotConfigured => Reject::internal("pii-redaction is not configured"),
            Refusal::CannotPrepare => Reject::internal("cannot prepare the request"),
            Refusal::CannotRead => Reject::internal("cannot read the request"),
            Refusal::CannotRedact => Reject::internal("cannot redact the request"),
            Refusal::Blocked { rule } => Reject::bad_request(
                format!("pii_blocked_{}", rule.to_ascii_lowercase()),
                format!("the request contains data that rule {rule} does not allow to be sent"),
            ),
            Refusal::InvalidJson(err) => Reject::bad_request(
                "invalid_json",
                format!("the request body is not valid JSON: {err}"),
            ),
            Refusal::TooLarge { max_body_bytes } => Reject::new(
                413,
                ErrorType::InvalidRequest,
                "request_too_large",
                format!(
                    "the request body is larger than {max_body_bytes} bytes, the most the gateway scans for personal data"
                ),
            ),
        }
    }
}

/// What the core asks of the host: the one stage protocol's effects
/// ([`llm_gateway_shared::stage`]) with this plugin's counters and refusals. A failed header
/// removal before the body is rewritten, or a failed body replacement, refuses the request; a
/// failed response edit turns restoring off.
pub type Command = Effect<Counter, Refusal>;

/// How the response is restored.
enum Response {
    /// Nothing to restore (or cannot: encoded body).
    Pass,
    /// A JSON body, restored whole at its end.
    Json,
    /// An SSE stream, restored chunk by chunk.
    Sse(Box<SseRestorer>),
}

/// One request's stage state.
pub struct Exchange {
    /// The plugin has no valid configuration at all: it refuses every request, never lets
    /// one pass unscanned ([`Exchange::unconfigured`]).
    unconfigured: bool,
    config: Option<Rc<PiiConfig>>,
    /// The request's API (where a preamble goes); `None` for any other path.
    api: Option<Api>,
    /// The request headers carry a `content-length`.
    framed: bool,
    /// The request body is to be read and redacted.
    scan: bool,
    map: PlaceholderMap,
    /// Matches per rule name counted on the request side (the rest are output matches).
    counted: HashMap<String, u64>,
    response: Response,
    /// `x-llm-request-id`: where the map is stashed if the pass is superseded.
    logical_id: Option<String>,
    /// The fingerprint the superseded pass forwarded (this pass re-entered).
    carried: Option<u64>,
    /// The fingerprint of what this pass forwards.
    forwarded: Option<u64>,
    commands: VecDeque<Command>,
}

impl Default for Exchange {
    fn default() -> Self {
        Exchange {
            unconfigured: false,
            config: None,
            api: None,
            framed: false,
            scan: false,
            map: PlaceholderMap::default(),
            counted: HashMap::new(),
            response: Response::Pass,
            logical_id: None,
            carried: None,
            forwarded: None,
            commands: VecDeque::new(),
        }
    }
}

impl stage::Core for Exchange {
    type Metric = Counter;
    type Refusal = Refusal;
    type Own = std::convert::Infallible;

    fn poll(&mut self) -> Option<Command> {
        Exchange::poll(self)
    }

    fn failed(&mut self, command: Command, error: String) -> Flow {
        Exchange::failed(self, command, error)
    }
}

impl stage::Stage for Exchange {
    type Config = Rc<PiiConfig>;
    type Worker = Worker;

    /// [`Exchange::handle`] with the clock read only when it is used; a body scanned or a JSON
    /// answer restored is taken whole by the fused filter ([`Flow::Whole`]).
    fn handle(&mut self, worker: &mut Worker, env: &mut dyn Env, input: Input<'_>) -> Flow {
        let now = if reads_clock(&input) { env.now_ms() } else { 0 };
        let request_headers = matches!(input, Input::RequestHeaders { .. });
        let response_headers = matches!(input, Input::ResponseHeaders { .. });
        match Exchange::handle(self, worker, now, input) {
            Flow::Continue if request_headers && self.scan => Flow::Whole,
            Flow::Continue if response_headers && self.restores_whole_response() => Flow::Whole,
            flow => flow,
        }
    }

    fn wants(&self, read: Read) -> bool {
        match read {
            Read::RequestBody {
                size,
                end_of_stream,
            } => self.wants_request_body(size, end_of_stream),
            Read::ResponseHeaders { end_of_stream } => !end_of_stream && self.may_restore(),
            Read::ResponseBody { end_of_stream } => self.wants_response_body(end_of_stream),
            Read::BodyAtTrailers => false,
            Read::Log => self.stashes_when_superseded(),
            Read::Supersession => true,
        }
    }
}

impl Exchange {
    /// The exchange of a plugin without a valid configuration: it refuses the request.
    pub fn unconfigured() -> Exchange {
        Exchange {
            unconfigured: true,
            ..Exchange::default()
        }
    }

    /// The next command to carry out, in order.
    pub fn poll(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// True if the next [`Input::RequestBody`] (of `end_of_stream`) needs the whole buffered
    /// body: only the last one of a body that is scanned.
    pub fn wants_request_body(&self, size: usize, end_of_stream: bool) -> bool {
        self.scan
            && end_of_stream
            && self
                .config
                .as_ref()
                .is_some_and(|c| size <= c.max_body_bytes)
    }

    /// True while the request body is to be scanned: it is read whole at its end.
    pub fn scans_request_body(&self) -> bool {
        self.scan
    }

    /// True if the response may be restored or redacted (placeholders to put back, or output
    /// rules): otherwise its headers need not be read.
    pub fn may_restore(&self) -> bool {
        self.map.has_restorable() || self.config.as_ref().is_some_and(|c| c.output.is_some())
    }

    /// True if [`Input::Log`] may stash the map (the request has a logical id and its config
    /// watches for re-entry, `reentry`): otherwise whether the pass was superseded need not be
    /// asked.
    pub fn stashes_when_superseded(&self) -> bool {
        self.logical_id.is_some() && self.config.as_ref().is_some_and(|c| c.reentry)
    }

    /// True if the response is a JSON answer, restored whole at its end.
    pub fn restores_whole_response(&self) -> bool {
        matches!(self.response, Response::Json)
    }

    /// True if the next [`Input::ResponseBody`] needs its data.
    pub fn wants_response_body(&self, end_of_stream: bool) -> bool {
        match self.response {
            Response::Pass => false,
            Response::Json => end_of_stream,
            Response::Sse(_) => true,
        }
    }

    /// Takes one event; the commands it produced wait in [`Exchange::poll`]. `now_ms` is
    /// read only for [`Input::reads_clock`] inputs.
    pub fn handle(&mut self, worker: &mut Worker, now_ms: u64, input: Input<'_>) -> Flow {
        match input {
            Input::RequestHeaders {
                config,
                head,
                end_of_stream,
            } => self.request_headers(worker, now_ms, config, head, end_of_stream),
            Input::RequestBody {
                size,
                end_of_stream,
                body,
            } => self.request_body(size, end_of_stream, body),
            Input::RequestBodyUnreadable { .. } => {
                self.scan = false;
                self.refuse(Refusal::CannotRead)
            }
            Input::ResponseHeaders {
                head,
                end_of_stream,
            } => self.response_headers(
                head.content_encoding.as_deref(),
                head.content_type.as_deref(),
                end_of_stream,
            ),
            Input::ResponseBody {
                end_of_stream,
                body,
                ..
            } => self.response_body(end_of_stream, body),
            // the body is restored at its end or chunk by chunk, never at the trailers
            Input::ResponseTrailers { .. } => Flow::Continue,
            Input::Log { superseded } => {
                self.log(worker, now_ms, superseded);
                Flow::Continue
            }
        }
    }

    fn push(&mut self, command: Command) {
        self.commands.push_back(command);
    }

    fn count(&mut self, counter: Counter, delta: u64) {
        if delta > 0 {
            self.push(Command::Count(counter, delta));
        }
    }

    fn refuse(&mut self, refusal: Refusal) -> Flow {
        self.push(Command::Refuse(refusal));
        Flow::Refused
    }

    fn request_headers(
        &mut self,
        worker: &mut Worker,
        now_ms: u64,
        config: Option<Rc<PiiConfig>>,
        head: &RequestHead,
        end_of_stream: bool,
    ) -> Flow {
        if self.unconfigured {
            return self.refuse(Refusal::NotConfigured);
        }
        let Some(config) = config else {
            return Flow::Continue;
        };
        self.config = Some(Rc::clone(&config));
        self.adopt(worker, now_ms, &config, head);
        if end_of_stream {
            return Flow::Continue; // no body
        }
        self.api = head.api();
        self.framed = head.content_length.is_some();
        if config.scope == BodyScope::Messages {
            // multipart uploads and other non-JSON bodies carry no chat messages
            let content_type = head.text("content-type").unwrap_or_default();
            if !content_type.is_empty() && !content_type.to_ascii_lowercase().contains("json") {
                return Flow::Continue;
            }
        }
        if head
            .content_length
            .is_some_and(|len| len > config.max_body_bytes as u64)
        {
            return self.oversize(&config);
        }
        // A compressed answer could not be restored.
        let restores = config.output.is_some()
            || config
                .redactor
                .rules()
                .iter()
                .any(|r| r.action == Action::Mask { restore: true });
        if restores && head.has("accept-encoding") {
            self.push(Command::RemoveHeader(
                Map::Request,
                "accept-encoding".into(),
            ));
        }
        // The body may be rewritten. Held headers get the new length later; headers that go
        // on now must not announce the old one.
        if !config.hold_headers {
            self.push(Command::RemoveHeader(Map::Request, "content-length".into()));
        }
        self.scan = true;
        if config.hold_headers {
            Flow::Pause
        } else {
            Flow::Continue
        }
    }

    /// Where this pass starts: afresh, or — re-entering after an internal redirect — from
    /// the map the superseded pass stashed.
    fn adopt(&mut self, worker: &mut Worker, now_ms: u64, config: &PiiConfig, head: &RequestHead) {
        let id = head.request_id.clone();
        let adopted = worker
            .stash
            .adopt(head.reentry, id.as_deref().unwrap_or_default(), now_ms);
        self.logical_id = id;
        match adopted {
            Pass::Reentry(carried) => {
                self.map = match config.scope {
                    BodyScope::RawBody => carried.map.carried_over(),
                    BodyScope::Messages => carried.map,
                };
                self.carried = carried.forwarded;
            }
            Pass::Lost => self.push(Command::Log(
                Level::Warn,
                "pii-redaction: re-entered request without a stashed map: masked afresh".into(),
            )),
            Pass::First => {}
        }
    }

    fn request_body(&mut self, size: usize, end_of_stream: bool, body: Option<&[u8]>) -> Flow {
        if !self.scan {
            return Flow::Continue;
        }
        let Some(config) = self.config.clone() else {
            return Flow::Continue;
        };
        if size > config.max_body_bytes {
            self.scan = false;
            return self.oversize(&config);
        }
        if !end_of_stream {
            return Flow::Pause; // buffer until the whole body is here
        }
        self.scan = false;
        let Some(body) = body else {
            // the driver did not hand the body over: never forward what was not scanned
            return self.refuse(Refusal::CannotRead);
        };
        // a re-entering pass's map already counted the first pass's matches
        let before: HashMap<String, u64> = self
            .map
            .counts()
            .map(|(name, count)| (name.to_owned(), count))
            .collect();
        let (outcome, forwarded) =
            redact_pass(&config, self.api, body, &mut self.map, self.carried);
        self.forwarded = forwarded;
        let counts: Vec<(String, u64)> = self
            .map
            .counts()
            .map(|(name, count)| (name.to_owned(), count))
            .collect();
        for (name, count) in counts {
            let new = count.saturating_sub(before.get(&name).copied().unwrap_or(0));
            self.count(Counter::Matches(name.clone()), new);
            self.counted.insert(name, count);
        }
        match outcome {
            Redaction::Unchanged => Flow::Continue,
            Redaction::Rewritten(new_body) => {
                self.count(Counter::Redacted, 1);
                self.push(Command::ReplaceRequestBody {
                    size,
                    body: new_body,
                    frame: config.hold_headers && self.framed,
                });
                Flow::Continue
            }
            Redaction::Blocked(blocked) => {
                self.count(Counter::Blocked(blocked.rule.clone()), 1);
                self.push(Command::Log(
                    Level::Info,
                    format!("pii-redaction: blocked by rule {}", blocked.rule),
                ));
                self.refuse(Refusal::Blocked { rule: blocked.rule })
            }
            Redaction::Invalid(err) => {
                self.count(Counter::InvalidJson, 1);
                self.refuse(Refusal::InvalidJson(err.to_string()))
            }
        }
    }

    /// The size policy for a body above `max_body_bytes`.
    fn oversize(&mut self, config: &PiiConfig) -> Flow {
        match config.oversize {
            Oversize::Reject => {
                self.count(Counter::OversizeRejected, 1);
                self.refuse(Refusal::TooLarge {
                    max_body_bytes: config.max_body_bytes,
                })
            }
            Oversize::Pass => {
                self.count(Counter::OversizePassed, 1);
                self.push(Command::Log(
                    Level::Warn,
                    "pii-redaction: body above max_body_bytes forwarded unscanned (oversize: pass)"
                        .into(),
                ));
                Flow::Continue
            }
        }
    }

    fn response_headers(
        &mut self,
        content_encoding: Option<&str>,
        content_type: Option<&str>,
        end_of_stream: bool,
    ) -> Flow {
        let output = self.config.as_ref().and_then(|c| c.output.clone());
        if end_of_stream || !(self.map.has_restorable() || output.is_some()) {
            return Flow::Continue;
        }
        if content_encoding.is_some_and(|e| !e.trim().eq_ignore_ascii_case("identity")) {
            self.count(Counter::RestoreSkipped, 1);
            return Flow::Continue;
        }
        let content_type = content_type.unwrap_or_default().to_ascii_lowercase();
        self.response = if content_type.contains("text/event-stream") {
            Response::Sse(Box::new(SseRestorer::with_output(output)))
        } else if content_type.contains("json") {
            Response::Json
        } else {
            return Flow::Continue;
        };
        self.push(Command::RemoveHeader(
            Map::Response,
            "content-length".into(),
        ));
        Flow::Continue
    }

    fn response_body(&mut self, end_of_stream: bool, chunk: Option<&[u8]>) -> Flow {
        match &mut self.response {
            Response::Pass => Flow::Continue,
            Response::Json => {
                if !end_of_stream {
                    return Flow::Pause;
                }
                let Some(body) = chunk else {
                    return Flow::Continue;
                };
                let output = self.config.as_ref().and_then(|c| c.output.as_ref());
                let redacted =
                    output.and_then(|output| redact_output_body(output, &mut self.map, body));
                let restored = match restore_body(&self.map, redacted.as_deref().unwrap_or(body)) {
                    Some(restored) => Some(restored),
                    None => redacted,
                };
                if let Some(restored) = restored {
                    self.push(Command::ReplaceResponseBody {
                        size: body.len(),
                        body: restored,
                    });
                    self.count(Counter::Restored, 1);
                }
                self.count_output();
                Flow::Continue
            }
            Response::Sse(restorer) => {
                let chunk = chunk.unwrap_or_default();
                // `None`: the chunk goes out as it came (most chunks of a stream)
                let mut out = restorer.restore(&mut self.map, chunk);
                let ended = end_of_stream;
                if ended {
                    let tail = restorer.finish(&mut self.map);
                    if !tail.is_empty() {
                        let mut all = out.unwrap_or_else(|| chunk.to_vec());
                        all.extend(tail);
                        out = Some(all);
                    }
                }
                if let Some(out) = out.filter(|out| out.as_slice() != chunk) {
                    self.push(Command::ReplaceResponseBody {
                        size: chunk.len(),
                        body: out,
                    });
                }
                if ended {
                    self.count(Counter::Restored, 1);
                    self.count_output();
                }
                Flow::Continue
            }
        }
    }

    /// Counts the matches of output rules (those not counted on the request side).
    fn count_output(&mut self) {
        let counts: Vec<(String, u64)> = self
            .map
            .counts()
            .map(|(name, count)| {
                let before = self.counted.get(name).copied().unwrap_or(0);
                (name.to_owned(), count.saturating_sub(before))
            })
            .collect();
        for (name, delta) in counts {
            self.count(Counter::OutputMatches(name), delta);
        }
    }

    fn log(&mut self, worker: &mut Worker, now_ms: u64, superseded: bool) {
        if !superseded {
            return;
        }
        let Some(id) = self.logical_id.clone() else {
            return;
        };
        let carried = Carried {
            map: std::mem::take(&mut self.map),
            forwarded: self.forwarded,
        };
        // a map the stash evicts or that expires belonged to a pass nobody re-enters: dropped
        let _evicted = worker.stash.put(&id, carried, now_ms);
    }

    fn failed(&mut self, command: Command, error: String) -> Flow {
        match command {
            Command::RemoveHeader(Map::Request, name) => {
                self.scan = false;
                self.commands.clear();
                self.push(Command::Log(
                    Level::Error,
                    format!("pii-redaction: cannot remove {name}: {error}"),
                ));
                self.refuse(Refusal::CannotPrepare)
            }
            Command::ReplaceRequestBody { .. } => {
                // never forward what could not be redacted
                self.commands.clear();
                self.push(Command::Log(
                    Level::Error,
                    format!("pii-redaction: cannot replace the request body: {error}"),
                ));
                self.refuse(Refusal::CannotRedact)
            }
            Command::RemoveHeader(Map::Response, name) => {
                self.push(Command::Log(
                    Level::Warn,
                    format!("pii-redaction: cannot remove {name}, not restoring: {error}"),
                ));
                self.response = Response::Pass;
                Flow::Continue
            }
            Command::ReplaceResponseBody { .. } => {
                // the restored count of this response does not stand
                self.commands
                    .retain(|c| *c != Command::Count(Counter::Restored, 1));
                self.push(Command::Log(
                    Level::Warn,
                    format!("pii-redaction: cannot rewrite the response: {error}"),
                ));
                Flow::Continue
            }
            Command::Refuse(_) => {
                self.push(Command::Log(
                    Level::Error,
                    format!("pii-redaction: cannot send the local reply: {error}"),
                ));
                Flow::Refused
            }
            // pii-redaction sets no header nor property, keeps the route and sets no gauge
            Command::SetHeader(..)
            | Command::SetProperty { .. }
            | Command::ClearRouteCache
            | Command::Count(..)
            | Command::Gauge(..)
            | Command::Log(..) => Flow::Continue,
            Command::Own(never) => match never {},
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_document;
    use llm_gateway_shared::stage::Refusal as _;

    const EMAIL_RULES: &str = r#"{"rules":[{"detector":"email"},{"name":"CODE","words":["falcon"],"action":"block"}],"preamble":"keep"}"#;

    fn config(doc: &str) -> Rc<PiiConfig> {
        parse_document(doc.as_bytes())
            .unwrap()
            .global()
            .cloned()
            .unwrap()
    }

    fn head(list: &[(&str, &str)]) -> RequestHead {
        RequestHead::new(
            list.iter()
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                .collect(),
        )
    }

    fn chat_head() -> RequestHead {
        head(&[
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("content-type", "application/json"),
            ("x-llm-request-id", "req-1"),
        ])
    }

    fn drain(exchange: &mut Exchange) -> Vec<Command> {
        std::iter::from_fn(|| exchange.poll()).collect()
    }

    const BODY: &[u8] =
        br#"{"model":"fast","messages":[{"role":"user","content":"write to ann@example.com"}]}"#;

    /// Headers then the whole body; the commands of both.
    fn request(
        worker: &mut Worker,
        exchange: &mut Exchange,
        doc: &str,
        head: &RequestHead,
        body: &[u8],
    ) -> (Flow, Vec<Command>) {
        let flow = exchange.handle(
            worker,
            0,
            Input::RequestHeaders {
                config: Some(config(doc)),
                head,
                end_of_stream: false,
            },
        );
        let mut commands = drain(exchange);
        if flow == Flow::Refused {
            return (flow, commands);
        }
        assert!(exchange.wants_request_body(body.len(), true));
        let flow = exchange.handle(
            worker,
            0,
            Input::RequestBody {
                size: body.len(),
                end_of_stream: true,
                body: Some(body),
            },
        );
        commands.extend(drain(exchange));
        (flow, commands)
    }

    fn replaced_body(commands: &[Command]) -> Option<(Vec<u8>, bool)> {
        commands.iter().find_map(|c| match c {
            Command::ReplaceRequestBody { body, frame, .. } => Some((body.clone(), *frame)),
            _ => None,
        })
    }

    fn refusal(commands: &[Command]) -> Option<Refusal> {
        commands.iter().find_map(|c| match c {
            Command::Refuse(r) => Some(r.clone()),
            _ => None,
        })
    }

    #[test]
    fn a_body_with_an_email_is_rewritten_and_counted() {
        let (mut worker, mut exchange) = (Worker::default(), Exchange::default());
        let mut pairs: Vec<(String, Vec<u8>)> = chat_head()
            .headers()
            .map(|(n, v)| (String::from_utf8_lossy(n).into_owned(), v.to_vec()))
            .collect();
        pairs.push(("accept-encoding".into(), b"gzip".to_vec()));
        let gzip = RequestHead::new(pairs);
        let (flow, commands) = request(&mut worker, &mut exchange, EMAIL_RULES, &gzip, BODY);
        assert_eq!(flow, Flow::Continue);
        assert!(!exchange.scans_request_body(), "scanned once");
        // restoring needs an uncompressed answer; the body's length changes
        assert_eq!(
            commands[0],
            Command::RemoveHeader(Map::Request, "accept-encoding".into())
        );
        assert_eq!(
            commands[1],
            Command::RemoveHeader(Map::Request, "content-length".into())
        );
        // a request that asks for no encoding has none to remove
        let (mut worker, mut exchange) = (Worker::default(), Exchange::default());
        let (_, commands) = request(&mut worker, &mut exchange, EMAIL_RULES, &chat_head(), BODY);
        assert_eq!(
            commands[0],
            Command::RemoveHeader(Map::Request, "content-length".into())
        );
        assert!(!commands.contains(&Command::RemoveHeader(
            Map::Request,
            "accept-encoding".into()
        )));
        assert!(commands.contains(&Command::Count(Counter::Matches("EMAIL".into()), 1)));
        assert!(commands.contains(&Command::Count(Counter::Redacted, 1)));
        let (body, frame) = replaced_body(&commands).unwrap();
        assert!(!frame);
        let text = String::from_utf8(body).unwrap();
        assert!(
            text.contains("[EMAIL_1]") && !text.contains("ann@example.com"),
            "{text}"
        );
    }

    #[test]
    fn held_headers_pause_and_the_new_body_is_framed() {
        let doc = r#"{"rules":[{"detector":"email"}],"hold_headers":true}"#;
        let (mut worker, mut exchange) = (Worker::default(), Exchange::default());
        let length = BODY.len().to_string();
        let framed_head = head(&[
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            ("content-type", "application/json"),
            ("content-length", length.as_str()),
        ]);
        let flow = exchange.handle(
            &mut worker,
            0,
            Input::RequestHeaders {
                config: Some(config(doc)),
                head: &framed_head,
                end_of_stream: false,
            },
        );
        assert_eq!(flow, Flow::Pause);
        assert!(exchange.scans_request_body());
        let commands = drain(&mut exchange);
        assert!(!commands.contains(&Command::RemoveHeader(
            Map::Request,
            "content-length".into()
        )));
        // a partial body is buffered, not read
        assert!(!exchange.wants_request_body(10, false));
        let partial = Input::RequestBody {
            size: 10,
            end_of_stream: false,
            body: None,
        };
        assert_eq!(exchange.handle(&mut worker, 0, partial), Flow::Pause);
        let last = Input::RequestBody {
            size: BODY.len(),
            end_of_stream: true,
            body: Some(BODY),
        };
        assert_eq!(exchange.handle(&mut worker, 0, last), Flow::Continue);
        let (_, frame) = replaced_body(&drain(&mut exchange)).unwrap();
        assert!(frame);
        // held, but chunked: there is no length to fix
        let mut exchange = Exchange::default();
        let headers = Input::RequestHeaders {
            config: Some(config(doc)),
            head: &chat_head(),
            end_of_stream: false,
        };
        assert_eq!(exchange.handle(&mut worker, 0, headers), Flow::Pause);
        let whole = Input::RequestBody {
            size: BODY.len(),
            end_of_stream: true,
            body: Some(BODY),
        };
        assert_eq!(exchange.handle(&mut worker, 0, whole), Flow::Continue);
        let (_, frame) = replaced_body(&drain(&mut exchange)).unwrap();
        assert!(!frame);
    }

    #[test]
    fn what_is_not_scanned_passes_without_commands() {
        let mut worker = Worker::default();
        // no config for the route
        let mut exchange = Exchange::default();
        let none = Input::RequestHeaders {
            config: None,
            head: &chat_head(),
            end_of_stream: false,
        };
        assert_eq!(exchange.handle(&mut worker, 0, none), Flow::Continue);
        assert!(drain(&mut exchange).is_empty());
        assert!(!exchange.wants_request_body(BODY.len(), true));
        // a multipart upload in messages scope
        let mut exchange = Exchange::default();
        let upload = head(&[
            (":path", "/v1/files"),
            ("content-type", "multipart/form-data"),
        ]);
        let input = Input::RequestHeaders {
            config: Some(config(EMAIL_RULES)),
            head: &upload,
            end_of_stream: false,
        };
        assert_eq!(exchange.handle(&mut worker, 0, input), Flow::Continue);
        assert!(drain(&mut exchange).is_empty());
        assert!(!exchange.wants_request_body(BODY.len(), true));
        // a body without the detector's data is left alone
        let mut exchange = Exchange::default();
        let clean = br#"{"model":"fast","messages":[{"role":"user","content":"hello"}]}"#;
        let (flow, commands) =
            request(&mut worker, &mut exchange, EMAIL_RULES, &chat_head(), clean);
        assert_eq!(flow, Flow::Continue);
        assert_eq!(replaced_body(&commands), None);
        assert!(!exchange.may_restore());
    }

    #[test]
    fn refusals_map_to_their_errors() {
        let mut worker = Worker::default();
        // not configured at all: 500, never an unscanned request
        let mut exchange = Exchange::unconfigured();
        let input = Input::RequestHeaders {
            config: None,
            head: &chat_head(),
            end_of_stream: false,
        };
        assert_eq!(exchange.handle(&mut worker, 0, input), Flow::Refused);
        assert_eq!(refusal(&drain(&mut exchange)).unwrap().reject().status, 500);
        // a block rule: 400 naming the rule, counted
        let mut exchange = Exchange::default();
        let blocked = br#"{"messages":[{"role":"user","content":"Project Falcon"}]}"#;
        let (flow, commands) = request(
            &mut worker,
            &mut exchange,
            EMAIL_RULES,
            &chat_head(),
            blocked,
        );
        assert_eq!(flow, Flow::Refused);
        let reject = refusal(&commands).unwrap().reject();
        assert_eq!(
            (reject.status, reject.code.as_ref()),
            (400, "pii_blocked_code")
        );
        assert!(commands.contains(&Command::Count(Counter::Blocked("CODE".into()), 1)));
        assert_eq!(replaced_body(&commands), None);
        // not JSON in messages scope
        let mut exchange = Exchange::default();
        let (flow, commands) = request(
            &mut worker,
            &mut exchange,
            EMAIL_RULES,
            &chat_head(),
            b"{\"messages\":[",
        );
        assert_eq!(flow, Flow::Refused);
        assert_eq!(refusal(&commands).unwrap().reject().code, "invalid_json");
        assert!(commands.contains(&Command::Count(Counter::InvalidJson, 1)));
        // the body was not handed over: never forwarded unscanned
        let mut exchange = Exchange::default();
        let headers = Input::RequestHeaders {
            config: Some(config(EMAIL_RULES)),
            head: &chat_head(),
            end_of_stream: false,
        };
        exchange.handle(&mut worker, 0, headers);
        let missing = Input::RequestBody {
            size: 5,
            end_of_stream: true,
            body: None,
        };
        assert_eq!(exchange.handle(&mut worker, 0, missing), Flow::Refused);
        assert_eq!(refusal(&drain(&mut exchange)), Some(Refusal::CannotRead));
    }

    #[test]
    fn oversize_bodies_follow_the_policy() {
        let mut worker = Worker::default();
        let big = head(&[(":path", "/v1/chat/completions"), ("content-length", "100")]);
        for (policy, flow) in [("reject", Flow::Refused), ("pass", Flow::Continue)] {
            let doc = format!(
                r#"{{"rules":[{{"detector":"email"}}],"max_body_bytes":10,"oversize":"{policy}"}}"#
            );
            // announced by content-length
            let mut exchange = Exchange::default();
            let input = Input::RequestHeaders {
                config: Some(config(&doc)),
                head: &big,
                end_of_stream: false,
            };
            assert_eq!(exchange.handle(&mut worker, 0, input), flow, "{policy}");
            let commands = drain(&mut exchange);
            if policy == "reject" {
                let reject = refusal(&commands).unwrap().reject();
                assert_eq!(
                    (reject.status, reject.code.as_ref()),
                    (413, "request_too_large")
                );
                assert!(commands.contains(&Command::Count(Counter::OversizeRejected, 1)));
            } else {
                assert!(commands.contains(&Command::Count(Counter::OversizePassed, 1)));
                assert_eq!(refusal(&commands), None);
            }
            // found while buffering (no content-length)
            let mut exchange = Exchange::default();
            let input = Input::RequestHeaders {
                config: Some(config(&doc)),
                head: &chat_head(),
                end_of_stream: false,
            };
            exchange.handle(&mut worker, 0, input);
            drain(&mut exchange);
            assert!(!exchange.wants_request_body(11, true));
            let body = Input::RequestBody {
                size: 11,
                end_of_stream: false,
                body: None,
            };
            assert_eq!(exchange.handle(&mut worker, 0, body), flow, "{policy}");
        }
    }

    #[test]
    fn a_failed_header_removal_or_body_replace_refuses() {
        let mut worker = Worker::default();
        let mut exchange = Exchange::default();
        let input = Input::RequestHeaders {
            config: Some(config(EMAIL_RULES)),
            head: &chat_head(),
            end_of_stream: false,
        };
        exchange.handle(&mut worker, 0, input);
        let first = exchange.poll().unwrap();
        assert_eq!(
            stage::Core::failed(&mut exchange, first, "bad argument".into()),
            Flow::Refused
        );
        let commands = drain(&mut exchange);
        // the rest of the queue is dropped: nothing else happens to this request
        assert!(!commands.contains(&Command::RemoveHeader(
            Map::Request,
            "content-length".into()
        )));
        assert_eq!(refusal(&commands), Some(Refusal::CannotPrepare));
        assert!(!exchange.wants_request_body(BODY.len(), true));

        let mut exchange = Exchange::default();
        let (_, commands) = request(&mut worker, &mut exchange, EMAIL_RULES, &chat_head(), BODY);
        let replace = commands
            .into_iter()
            .find(|c| matches!(c, Command::ReplaceRequestBody { .. }))
            .unwrap();
        assert_eq!(
            stage::Core::failed(&mut exchange, replace, "bad argument".into()),
            Flow::Refused
        );
        let reject = refusal(&drain(&mut exchange)).unwrap().reject();
        assert_eq!(reject.status, 500);
    }

    fn response_headers(exchange: &mut Exchange, worker: &mut Worker, ty: &str, enc: Option<&str>) {
        let head = ResponseHead {
            content_encoding: enc.map(str::to_owned),
            content_type: Some(ty.to_owned()),
            ..ResponseHead::default()
        };
        let input = Input::ResponseHeaders {
            head: &head,
            end_of_stream: false,
        };
        assert_eq!(exchange.handle(worker, 0, input), Flow::Continue);
    }

    fn replaced_response(commands: &[Command]) -> Vec<u8> {
        commands
            .iter()
            .filter_map(|c| match c {
                Command::ReplaceResponseBody { body, .. } => Some(body.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    #[test]
    fn a_json_answer_gets_its_originals_back() {
        let (mut worker, mut exchange) = (Worker::default(), Exchange::default());
        request(&mut worker, &mut exchange, EMAIL_RULES, &chat_head(), BODY);
        assert!(exchange.may_restore());
        response_headers(&mut exchange, &mut worker, "application/json", None);
        assert_eq!(
            drain(&mut exchange),
            vec![Command::RemoveHeader(
                Map::Response,
                "content-length".into()
            )]
        );
        assert!(!exchange.wants_response_body(false));
        assert!(exchange.restores_whole_response());
        let part = Input::ResponseBody {
            end_of_stream: false,
            size: 0,
            body: None,
        };
        assert_eq!(exchange.handle(&mut worker, 0, part), Flow::Pause);
        assert!(exchange.wants_response_body(true));
        let answer = br#"{"choices":[{"message":{"content":"sent to [EMAIL_1]"}}]}"#;
        let last = Input::ResponseBody {
            end_of_stream: true,
            size: 0,
            body: Some(answer),
        };
        assert_eq!(exchange.handle(&mut worker, 0, last), Flow::Continue);
        let commands = drain(&mut exchange);
        let restored = String::from_utf8(replaced_response(&commands)).unwrap();
        assert!(restored.contains("sent to ann@example.com"), "{restored}");
        assert!(commands.contains(&Command::Count(Counter::Restored, 1)));
    }

    #[test]
    fn a_stream_is_restored_across_chunks_and_a_failed_rewrite_is_not_counted() {
        let (mut worker, mut exchange) = (Worker::default(), Exchange::default());
        request(&mut worker, &mut exchange, EMAIL_RULES, &chat_head(), BODY);
        response_headers(&mut exchange, &mut worker, "text/event-stream", None);
        drain(&mut exchange);
        assert!(!exchange.restores_whole_response());
        let stream: &[u8] = b"data: {\"choices\":[{\"delta\":{\"content\":\"to [EMAIL_1] ok\"}}]}\n\ndata: [DONE]\n\n";
        let (a, b) = stream.split_at(44); // inside the placeholder
        let mut out = Vec::new();
        for (chunk, end) in [(a, false), (b, true)] {
            assert!(exchange.wants_response_body(end));
            let input = Input::ResponseBody {
                end_of_stream: end,
                size: 0,
                body: Some(chunk),
            };
            assert_eq!(exchange.handle(&mut worker, 0, input), Flow::Continue);
            let commands = drain(&mut exchange);
            out.extend(replaced_response(&commands));
            if end {
                assert!(commands.contains(&Command::Count(Counter::Restored, 1)));
            }
        }
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("to ann@example.com ok") && text.ends_with("data: [DONE]\n\n"),
            "{text}"
        );

        // a JSON answer whose rewrite fails is not counted as restored
        let (mut worker, mut exchange) = (Worker::default(), Exchange::default());
        request(&mut worker, &mut exchange, EMAIL_RULES, &chat_head(), BODY);
        response_headers(&mut exchange, &mut worker, "application/json", None);
        drain(&mut exchange);
        let last = Input::ResponseBody {
            end_of_stream: true,
            size: 0,
            body: Some(br#"{"x":"[EMAIL_1]"}"#),
        };
        exchange.handle(&mut worker, 0, last);
        let replace = exchange.poll().unwrap();
        assert!(matches!(replace, Command::ReplaceResponseBody { .. }));
        assert_eq!(
            stage::Core::failed(&mut exchange, replace, "bad argument".into()),
            Flow::Continue
        );
        assert!(!drain(&mut exchange).contains(&Command::Count(Counter::Restored, 1)));
    }

    #[test]
    fn compressed_or_unheadered_answers_are_not_restored() {
        let (mut worker, mut exchange) = (Worker::default(), Exchange::default());
        request(&mut worker, &mut exchange, EMAIL_RULES, &chat_head(), BODY);
        response_headers(&mut exchange, &mut worker, "application/json", Some("gzip"));
        assert_eq!(
            drain(&mut exchange),
            vec![Command::Count(Counter::RestoreSkipped, 1)]
        );
        assert!(!exchange.wants_response_body(true));
        // `identity` is no encoding
        let (mut worker, mut exchange) = (Worker::default(), Exchange::default());
        request(&mut worker, &mut exchange, EMAIL_RULES, &chat_head(), BODY);
        response_headers(
            &mut exchange,
            &mut worker,
            "text/event-stream",
            Some(" Identity "),
        );
        assert!(exchange.wants_response_body(false));
        // content-length that cannot be removed: not restored
        let (mut worker, mut exchange) = (Worker::default(), Exchange::default());
        request(&mut worker, &mut exchange, EMAIL_RULES, &chat_head(), BODY);
        response_headers(&mut exchange, &mut worker, "application/json", None);
        let remove = exchange.poll().unwrap();
        assert_eq!(
            stage::Core::failed(&mut exchange, remove, "bad argument".into()),
            Flow::Continue
        );
        assert!(!exchange.wants_response_body(true));
    }

    #[test]
    fn without_reentry_a_pass_is_never_asked_whether_it_was_superseded() {
        let mut worker = Worker::default();
        let mut exchange = Exchange::default();
        let rules = r#"{"rules":[{"detector":"email"}],"reentry":false}"#;
        request(&mut worker, &mut exchange, rules, &chat_head(), BODY);
        assert!(!exchange.stashes_when_superseded());
        // the same request with the default does
        let mut exchange = Exchange::default();
        request(&mut worker, &mut exchange, EMAIL_RULES, &chat_head(), BODY);
        assert!(exchange.stashes_when_superseded());
    }

    #[test]
    fn a_superseded_pass_hands_its_map_to_the_re_entering_one() {
        let mut worker = Worker::default();
        let mut first = Exchange::default();
        let (_, commands) = request(&mut worker, &mut first, EMAIL_RULES, &chat_head(), BODY);
        let (forwarded, _) = replaced_body(&commands).unwrap();
        assert!(first.stashes_when_superseded());
        first.handle(&mut worker, 5, Input::Log { superseded: true });
        // the re-entering pass sends the original body again: the same placeholders
        let reentry = head(&[
            (":path", "/v1/chat/completions"),
            ("content-type", "application/json"),
            ("x-llm-request-id", "req-1"),
            ("x-llm-reentry", "1"),
        ]);
        let mut second = Exchange::default();
        let (_, commands) = request(&mut worker, &mut second, EMAIL_RULES, &reentry, BODY);
        assert!(
            !commands.iter().any(|c| matches!(c, Command::Log(..))),
            "{commands:?}"
        );
        let (again, _) = replaced_body(&commands).unwrap();
        assert_eq!(again, forwarded);
        // a re-entry nothing was stashed for is masked afresh, with a warning
        let lost = head(&[
            (":path", "/v1/chat/completions"),
            ("x-llm-request-id", "req-2"),
            ("x-llm-reentry", "1"),
        ]);
        let mut third = Exchange::default();
        let (_, commands) = request(&mut worker, &mut third, EMAIL_RULES, &lost, BODY);
        assert!(commands
            .iter()
            .any(|c| matches!(c, Command::Log(Level::Warn, _))));
        assert!(replaced_body(&commands).is_some());
        // a pass that was not superseded stashes nothing
        let mut fourth = Exchange::default();
        request(&mut worker, &mut fourth, EMAIL_RULES, &chat_head(), BODY);
        fourth.handle(&mut worker, 6, Input::Log { superseded: false });
        let mut fifth = Exchange::default();
        let (_, commands) = request(&mut worker, &mut fifth, EMAIL_RULES, &reentry, BODY);
        assert!(commands
            .iter()
            .any(|c| matches!(c, Command::Log(Level::Warn, _))));
    }

    #[test]
    fn every_counter_has_one_stat_name() {
        let configs = [
            config(EMAIL_RULES),
            config(r#"{"rules":[{"detector":"email"}],"output_rules":[{"detector":"ipv4"}]}"#),
        ];
        let all = counters(configs.iter().map(|c| c.as_ref()));
        let names: Vec<&str> = all.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "llm_gateway.pii.matches.email",
                "llm_gateway.pii.blocked.code",
                "llm_gateway.pii.output_matches.ip",
                "llm_gateway.pii.requests_redacted",
                "llm_gateway.pii.oversize_passed",
                "llm_gateway.pii.oversize_rejected",
                "llm_gateway.pii.invalid_json",
                "llm_gateway.pii.responses_restored",
                "llm_gateway.pii.restore_skipped_encoded",
            ]
        );
    }
}
