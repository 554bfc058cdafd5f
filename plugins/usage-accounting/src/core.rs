//! The stage core: what usage-accounting does with one request, without a host (sans-I/O, in
//! quinn-proto's shape).
//!
//! It speaks the one stage protocol ([`llm_gateway_shared::stage`]): the driver copies what
//! the host says into an [`Input`] and hands it to [`Stage::handle`], which answers whether the
//! callback continues or pauses; then the one driver (`host::stage::carry`) carries out the
//! [`Command`]s [`Stage::poll`] yields, in order, and reports a failure back through
//! [`stage::Core::failed`] (logged; the record stands). Values that cost a host call and are needed only sometimes (the clock
//! on a stream's later chunks, the router's filter state, the host's request id) are read
//! through [`Lookup`] when the core asks for them.
//!
//! It ties [`crate::exchange::Exchange`] (the request's accounting) to the chain: which
//! headers go, when the body is read, when the record is published — at the response's end,
//! or, for a 429/5xx that an internal redirect may supersede, at `on_log` — and what a
//! superseded pass hands to the pass that re-enters ([`Worker`]'s stash).

use crate::config::UsageConfig;
use crate::exchange::{may_be_superseded, present, Attribution, Carried, Exchange, ResponseMode};
use crate::record::Record;
use crate::stream::Forward;
use llm_gateway_shared::reentry::{Pass, Stash};
use llm_gateway_shared::reject::Reject;
use llm_gateway_shared::request::RequestHead;
use llm_gateway_shared::route_info::{self, RouteInfo};
use llm_gateway_shared::stage::{self, Effect, Env, Map, Read};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::rc::Rc;

/// What one worker keeps across requests.
#[derive(Default)]
pub struct Worker {
    /// What superseded passes left for their re-entering pass, by logical request id.
    stash: Stash<Carried>,
}

/// Host values read only when needed.
pub trait Lookup {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&mut self) -> u64;
    /// What the router published about the request (its filter state `wasm.llm_route`);
    /// `None` without the router.
    fn route(&mut self) -> Option<RouteInfo>;
    /// The host's own request id (asked only when neither request-id header is there).
    fn host_request_id(&mut self) -> Option<String>;
}

/// Whether the host callback goes on (usage-accounting never refuses: never `Refused`).
pub use llm_gateway_shared::stage::Flow;

/// One event of the request, with the host's data copied in: the one vocabulary
/// ([`stage::Input`]), with this plugin's configuration as its route selects it (`None`: the
/// plugin leaves the request alone).
pub type Input<'a> = stage::Input<'a, Rc<UsageConfig>>;

pub use llm_gateway_shared::level::Level;

/// What the host is asked to do: the one stage protocol's effects
/// ([`llm_gateway_shared::stage`]) and this plugin's own, [`Publish`]. usage-accounting refuses
/// nothing and counts through the record's metrics.
pub type Command = Effect<Infallible, Reject, Publish>;

/// Publish the record: filter state `name` = `json` (the access log's and token-ratelimit's),
/// then the log line if configured, the metrics and the ledger.
#[derive(Debug, Clone)]
pub struct Publish {
    /// The record.
    pub record: Box<Record>,
    /// Its JSON.
    pub json: String,
    /// The configuration it was built with.
    pub config: Rc<UsageConfig>,
    /// The provider of the deployment that answered (the router's), for the metrics.
    pub provider: Option<String>,
}

struct Active {
    exchange: Exchange,
    config: Rc<UsageConfig>,
    mode: ResponseMode,
    /// The router's state, read once the response is known (the router writes it again at
    /// response headers, after this filter on the response path); `Some(None)`: read, and
    /// there is none.
    route: Option<Option<RouteInfo>>,
    /// `x-llm-request-id`: the key of this request's stash entry after a redirect.
    logical_id: Option<String>,
}

/// The router's state in `slot`, asked of `lookup` the first time (borrowed afterwards: no
/// copy per use).
fn cached_route<'r>(
    slot: &'r mut Option<Option<RouteInfo>>,
    lookup: &mut dyn Lookup,
) -> Option<&'r RouteInfo> {
    slot.get_or_insert_with(|| lookup.route()).as_ref()
}

/// One request's stage state.
#[derive(Default)]
pub struct Stage {
    active: Option<Active>,
    /// The response reached its end, but its record waits for `on_log` (a 429/5xx: the pass
    /// may be superseded).
    ended: bool,
    commands: VecDeque<Command>,
}

impl stage::Core for Stage {
    type Metric = Infallible;
    type Refusal = Reject;
    type Own = Publish;

    fn poll(&mut self) -> Option<Command> {
        Stage::poll(self)
    }

    /// A failed command is logged; the record stands.
    fn failed(&mut self, command: Command, error: String) -> Flow {
        Stage::failed(self, command, error);
        Flow::Continue
    }
}

impl stage::Stage for Stage {
    type Config = Rc<UsageConfig>;
    type Worker = Worker;

    /// [`Stage::handle`] for the one driver: an inactive request (no config, not a POST,
    /// not an LLM endpoint) is not handed any later event; a body that may get
    /// `include_usage` is taken whole by the fused filter ([`Flow::Whole`]).
    fn handle(&mut self, worker: &mut Worker, env: &mut dyn Env, input: Input<'_>) -> Flow {
        let request_headers = matches!(input, Input::RequestHeaders { .. });
        if !request_headers && !self.is_active() {
            return Flow::Continue;
        }
        match Stage::handle(self, worker, &mut Properties(env), input) {
            Flow::Continue if request_headers && self.holds_request_body() => Flow::Whole,
            flow => flow,
        }
    }

    fn wants(&self, read: Read) -> bool {
        match read {
            Read::RequestBody { end_of_stream, .. } => self.wants_request_body(end_of_stream),
            Read::ResponseHeaders { .. } | Read::Log => self.is_active(),
            Read::ResponseBody { end_of_stream } => self.wants_response_body(end_of_stream),
            Read::BodyAtTrailers => self.wants_body_at_trailers(),
            Read::Supersession => self.watches_supersession(),
        }
    }
}

/// The host values the core looks up, from the driver's [`Env`].
struct Properties<'a>(&'a mut dyn Env);

impl Lookup for Properties<'_> {
    fn now_ms(&mut self) -> u64 {
        self.0.now_ms()
    }

    /// The router's view of the request: its filter state `wasm.llm_route` when it runs in
    /// the chain (deployment that answered, attempts, price); otherwise `None` (the
    /// `x-llm-deployment` / `x-llm-model-group` headers and the plugin's own price table).
    /// Always from the host: the clusters' filter rewrites it once an attempt answers.
    fn route(&mut self) -> Option<RouteInfo> {
        let bytes = self.0.property(&[route_info::PROPERTY])?;
        RouteInfo::from_json(&bytes)
    }

    fn host_request_id(&mut self) -> Option<String> {
        String::from_utf8(self.0.property(&["request", "id"])?).ok()
    }
}

impl Stage {
    /// The next command to carry out, in order.
    pub fn poll(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// True if the request is accounted (otherwise no later input does anything).
    pub fn is_active(&self) -> bool {
        self.active.is_some()
    }

    /// True if [`Input::Log`] needs to know whether the pass was superseded (its config
    /// watches for re-entry, `reentry`); otherwise every pass is final and the host need not
    /// be asked.
    pub fn watches_supersession(&self) -> bool {
        self.active.as_ref().is_some_and(|a| a.config.reentry)
    }

    /// True if the request body is read whole at its end (it may get `include_usage`).
    pub fn holds_request_body(&self) -> bool {
        self.active
            .as_ref()
            .is_some_and(|a| a.exchange.may_rewrite_body(&a.config))
    }

    /// True if the next [`Input::RequestBody`] needs its data.
    pub fn wants_request_body(&self, end_of_stream: bool) -> bool {
        self.active.as_ref().is_some_and(|a| {
            // a body passing through is kept chunk by chunk; one to rewrite is read whole
            !a.exchange.may_rewrite_body(&a.config) || end_of_stream
        })
    }

    /// True if the next [`Input::ResponseBody`] needs its data.
    pub fn wants_response_body(&self, end_of_stream: bool) -> bool {
        self.active.as_ref().is_some_and(|a| match a.mode {
            ResponseMode::PassThrough => false,
            ResponseMode::Stream => true,
            ResponseMode::Buffer { hold_headers: true } => end_of_stream,
            ResponseMode::Buffer {
                hold_headers: false,
            } => true,
        })
    }

    /// True if [`Input::ResponseTrailers`] needs the buffered body (a held JSON answer).
    pub fn wants_body_at_trailers(&self) -> bool {
        self.active.as_ref().is_some_and(|a| {
            a.mode == ResponseMode::Buffer { hold_headers: true } && !a.exchange.is_finished()
        })
    }

    /// Takes one event; the commands it produced wait in [`Stage::poll`].
    pub fn handle(
        &mut self,
        worker: &mut Worker,
        lookup: &mut dyn Lookup,
        input: Input<'_>,
    ) -> Flow {
        match input {
            Input::RequestHeaders {
                config,
                head,
                end_of_stream,
            } => self.request_headers(worker, lookup, config, head, end_of_stream),
            Input::RequestBody {
                size,
                end_of_stream,
                body,
            } => self.request_body(size, end_of_stream, body),
            // a body that cannot be read is counted as what passes through: by its size
            Input::RequestBodyUnreadable {
                size,
                end_of_stream,
            } => self.request_body(size, end_of_stream, None),
            Input::ResponseHeaders {
                head,
                end_of_stream,
            } => self.response_headers(
                head.status,
                head.content_type.as_deref().unwrap_or_default(),
                head.content_length,
                head.encoded(),
                end_of_stream,
            ),
            Input::ResponseBody {
                size,
                end_of_stream,
                body,
            } => self.response_body(lookup, size, end_of_stream, body),
            Input::ResponseTrailers { body } => self.response_trailers(lookup, body),
            Input::Log { superseded } => {
                if superseded {
                    self.hand_over(worker, lookup);
                } else {
                    // A response that never reached its end (cut stream, client gone) is
                    // recorded now, and so is a failure that waited to see whether it was
                    // superseded.
                    self.publish(lookup, self.ended);
                }
                Flow::Continue
            }
        }
    }

    fn push(&mut self, command: Command) {
        self.commands.push_back(command);
    }

    fn request_headers(
        &mut self,
        worker: &mut Worker,
        lookup: &mut dyn Lookup,
        config: Option<Rc<UsageConfig>>,
        head: &RequestHead,
        end_of_stream: bool,
    ) -> Flow {
        let Some(config) = config else {
            return Flow::Continue;
        };
        if head.method != "POST" {
            return Flow::Continue; // listing or fetching stored objects generates nothing
        }
        let attribution = Attribution::from_headers(head.headers(), || lookup.host_request_id());
        let now = lookup.now_ms();
        let Some(mut exchange) = Exchange::start(&head.path, attribution, now) else {
            return Flow::Continue;
        };
        let logical_id = head.request_id.clone();
        let adopted =
            worker
                .stash
                .adopt(head.reentry, logical_id.as_deref().unwrap_or_default(), now);
        match adopted {
            Pass::Reentry(carried) => exchange.adopt(carried),
            Pass::Lost => self.push(Command::Log(
                Level::Warn,
                "usage-accounting: re-entered request without stashed state: accounted as a new one"
                    .into(),
            )),
            Pass::First => {}
        }
        exchange.set_request_length(head.content_length);
        // The usage is read from the response: ask the provider for it uncompressed (Envoy's
        // compressor filter may compress it again for the client).
        if head.has("accept-encoding") {
            self.push(Command::RemoveHeader(
                Map::Request,
                "accept-encoding".into(),
            ));
        }
        let mut hold = false;
        if exchange.may_rewrite_body(&config) && !end_of_stream {
            // The body may grow by `stream_options`: held headers get its new length when it
            // is known; headers that go on now must not announce the old one.
            if config.hold_headers {
                hold = true;
            } else {
                self.push(Command::RemoveHeader(Map::Request, "content-length".into()));
            }
        }
        self.active = Some(Active {
            exchange,
            config,
            mode: ResponseMode::PassThrough,
            route: None,
            logical_id,
        });
        if hold {
            Flow::Pause
        } else {
            Flow::Continue
        }
    }

    fn request_body(&mut self, size: usize, end_of_stream: bool, body: Option<&[u8]>) -> Flow {
        let Some(active) = &mut self.active else {
            return Flow::Continue;
        };
        if !active.exchange.may_rewrite_body(&active.config) {
            // nothing to change: the body passes as it comes, the plugin keeps a bounded copy
            if let Some(chunk) = body {
                active.exchange.on_request_data(chunk);
            }
            if end_of_stream {
                active.exchange.on_request_end();
            }
            return Flow::Continue;
        }
        if !end_of_stream {
            return Flow::Pause; // the host buffers; the whole body is read once, at the end
        }
        let Some(body) = body else {
            return Flow::Continue;
        };
        if let Some(new_body) = active.exchange.on_request_body(&active.config, body) {
            // held headers get the new length (without `hold_headers` there is none to fix)
            let frame = active.config.hold_headers && active.exchange.framed();
            self.push(Command::ReplaceRequestBody {
                size,
                body: new_body,
                frame,
            });
        }
        Flow::Continue
    }

    fn response_headers(
        &mut self,
        status: u16,
        content_type: &str,
        content_length: Option<u64>,
        encoded: bool,
        end_of_stream: bool,
    ) -> Flow {
        let Some(active) = &mut self.active else {
            return Flow::Continue;
        };
        // a compressed answer cannot be read: it passes through and the record is estimated
        let content_type = if encoded { "" } else { content_type };
        let mode = active.exchange.on_response_headers(
            &active.config,
            status,
            content_type,
            content_length,
        );
        active.mode = mode;
        match mode {
            ResponseMode::Stream if active.exchange.injected_include_usage() => {
                // chunks may shrink (the hidden usage chunk)
                self.push(Command::RemoveHeader(
                    Map::Response,
                    "content-length".into(),
                ));
                Flow::Continue
            }
            ResponseMode::Buffer { hold_headers: true } if !end_of_stream => Flow::Pause,
            _ => Flow::Continue,
        }
    }

    fn response_body(
        &mut self,
        lookup: &mut dyn Lookup,
        size: usize,
        end_of_stream: bool,
        body: Option<&[u8]>,
    ) -> Flow {
        let Some(active) = &mut self.active else {
            return Flow::Continue;
        };
        match active.mode {
            ResponseMode::PassThrough => {}
            ResponseMode::Stream => {
                let Some(chunk) = body else {
                    return Flow::Continue;
                };
                // the clock only matters for the first output (time to first token)
                let now = if active.exchange.awaits_first_output() {
                    lookup.now_ms()
                } else {
                    0
                };
                if let Forward::Replace(bytes) =
                    active.exchange.on_response_chunk(chunk, end_of_stream, now)
                {
                    self.commands
                        .push_back(Command::ReplaceResponseBody { size, body: bytes });
                }
            }
            ResponseMode::Buffer { hold_headers: true } => {
                if !end_of_stream {
                    return Flow::Pause; // the host buffers; the headers wait for the cost
                }
                let route = cached_route(&mut active.route, lookup);
                let added = active.exchange.on_response_body(
                    &active.config,
                    route,
                    body.unwrap_or_default(),
                    true,
                );
                for (name, value) in added {
                    self.commands
                        .push_back(Command::SetHeader(Map::Response, name.into(), value));
                }
            }
            ResponseMode::Buffer {
                hold_headers: false,
            } => {
                // passes on as it comes; the plugin keeps a bounded copy to read the usage
                if let Some(chunk) = body {
                    active.exchange.on_response_data(chunk);
                }
                if end_of_stream {
                    let route = cached_route(&mut active.route, lookup);
                    active.exchange.on_response_end(&active.config, route, true);
                }
            }
        }
        if end_of_stream {
            self.response_ended(lookup);
        }
        Flow::Continue
    }

    fn response_trailers(&mut self, lookup: &mut dyn Lookup, body: Option<&[u8]>) -> Flow {
        // With trailers the last body callback did not say end_of_stream: end here.
        let Some(active) = &mut self.active else {
            return Flow::Continue;
        };
        match active.mode {
            ResponseMode::Stream => {
                // a well-formed stream ends with a blank line, so nothing is held back here
                let now = lookup.now_ms();
                let _unchanged = active.exchange.on_response_chunk(&[], true, now);
            }
            ResponseMode::Buffer { hold_headers: true } if !active.exchange.is_finished() => {
                let route = cached_route(&mut active.route, lookup);
                let added = active.exchange.on_response_body(
                    &active.config,
                    route,
                    body.unwrap_or_default(),
                    true,
                );
                for (name, value) in added {
                    self.commands
                        .push_back(Command::SetHeader(Map::Response, name.into(), value));
                }
            }
            ResponseMode::Buffer {
                hold_headers: false,
            } => {
                let route = cached_route(&mut active.route, lookup);
                active.exchange.on_response_end(&active.config, route, true);
            }
            _ => {}
        }
        self.response_ended(lookup);
        Flow::Continue
    }

    /// The response reached its end: publish, unless its status may yet be superseded by an
    /// internal redirect (then `on_log` decides).
    fn response_ended(&mut self, lookup: &mut dyn Lookup) {
        let wait = self
            .active
            .as_ref()
            .is_some_and(|a| may_be_superseded(a.exchange.status()));
        if wait {
            self.ended = true;
        } else {
            self.publish(lookup, true);
        }
    }

    /// A superseded pass: no record, no metrics; the next pass gets what it needs.
    fn hand_over(&mut self, worker: &mut Worker, lookup: &mut dyn Lookup) {
        let Some(active) = self.active.as_ref() else {
            return;
        };
        let Some(id) = active.logical_id.as_deref() else {
            return; // no logical id: nothing could find it
        };
        // an entry the stash evicts or that expires belonged to a pass nobody re-enters
        let _evicted = worker
            .stash
            .put(id, active.exchange.carried(), lookup.now_ms());
    }

    /// Builds the record once and asks for it to be published.
    fn publish(&mut self, lookup: &mut dyn Lookup, complete: bool) {
        let Some(active) = self.active.as_mut() else {
            return;
        };
        let route = cached_route(&mut active.route, lookup);
        let now = lookup.now_ms();
        let Some(record) = active.exchange.finish(&active.config, route, complete, now) else {
            return;
        };
        let json = record.to_json();
        let config = Rc::clone(&active.config);
        let provider = route.and_then(|r| present(&r.provider)).map(str::to_string);
        self.push(Command::Own(Publish {
            record: Box::new(record),
            json,
            config,
            provider,
        }));
    }

    fn failed(&mut self, command: Command, error: String) {
        let line = match command {
            Command::RemoveHeader(Map::Request, name) if name == "accept-encoding" => {
                // a compressed answer is estimated, not read
                format!("usage-accounting: cannot remove accept-encoding: {error}")
            }
            Command::RemoveHeader(Map::Request, name) => {
                format!("usage-accounting: cannot remove {name}: {error}")
            }
            Command::ReplaceRequestBody { .. } => {
                format!("usage-accounting: cannot inject include_usage: {error}")
            }
            Command::RemoveHeader(Map::Response, name) => {
                format!("usage-accounting: cannot remove the response's {name}: {error}")
            }
            Command::SetHeader(_, name, _) => {
                format!("usage-accounting: cannot set the response header {name}: {error}")
            }
            Command::ReplaceResponseBody { .. } => {
                format!("usage-accounting: cannot rewrite a stream chunk: {error}")
            }
            Command::Own(Publish { .. }) => {
                format!("usage-accounting: cannot set filter state: {error}")
            }
            // the core sets no other property and never changes the route
            Command::Log(..)
            | Command::Refuse(_)
            | Command::SetProperty { .. }
            | Command::ClearRouteCache => return,
            Command::Count(never, _) | Command::Gauge(never, _) => match never {},
        };
        self.push(Command::Log(Level::Warn, line));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llm_gateway_shared::stage::ResponseHead;

    fn response_head(status: u16, ty: &str, length: Option<u64>, encoded: bool) -> ResponseHead {
        ResponseHead {
            status,
            content_type: Some(ty.to_owned()),
            content_encoding: encoded.then(|| "gzip".to_owned()),
            content_length: length,
        }
    }
    use crate::config::parse_shared;
    use crate::record::UsageSource;
    use llm_gateway_shared::stage::Name;
    use serde_json::json;

    /// A fake host: a clock that moves when told, the router's state, and how often each was
    /// asked.
    #[derive(Default)]
    struct Fake {
        now: u64,
        clock_reads: usize,
        route: Option<RouteInfo>,
        route_reads: usize,
        id_reads: usize,
    }

    impl Lookup for Fake {
        fn now_ms(&mut self) -> u64 {
            self.clock_reads += 1;
            self.now
        }
        fn route(&mut self) -> Option<RouteInfo> {
            self.route_reads += 1;
            self.route.clone()
        }
        fn host_request_id(&mut self) -> Option<String> {
            self.id_reads += 1;
            Some("host-id".into())
        }
    }

    fn config(extra: serde_json::Value) -> Rc<UsageConfig> {
        let mut doc = json!({
            "price_version": "2026-11",
            "prices": {"east": {"input": "0.30", "cached_input": "0.006", "output": "1.20"}}
        });
        if let (Some(d), Some(e)) = (doc.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                d.insert(k.clone(), v.clone());
            }
        }
        parse_shared(doc.to_string().as_bytes())
            .unwrap()
            .global()
            .cloned()
            .unwrap()
    }

    fn head(path: &str, extra: &[(&str, &str)]) -> RequestHead {
        let mut pairs = vec![
            (":method".to_string(), b"POST".to_vec()),
            (":path".to_string(), path.as_bytes().to_vec()),
            ("x-llm-deployment".to_string(), b"east".to_vec()),
            ("x-llm-request-id".to_string(), b"req-1".to_vec()),
        ];
        pairs.extend(
            extra
                .iter()
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())),
        );
        RequestHead::new(pairs)
    }

    fn drain(stage: &mut Stage) -> Vec<Command> {
        std::iter::from_fn(|| stage.poll()).collect()
    }

    fn published(commands: &[Command]) -> Vec<Record> {
        commands
            .iter()
            .filter_map(|c| match c {
                Command::Own(Publish { record, .. }) => Some((**record).clone()),
                _ => None,
            })
            .collect()
    }

    const STREAM_BODY: &[u8] =
        br#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

    fn start(
        stage: &mut Stage,
        worker: &mut Worker,
        fake: &mut Fake,
        doc: serde_json::Value,
        head: &RequestHead,
    ) -> Flow {
        stage.handle(
            worker,
            fake,
            Input::RequestHeaders {
                config: Some(config(doc)),
                head,
                end_of_stream: false,
            },
        )
    }

    fn body(stage: &mut Stage, worker: &mut Worker, fake: &mut Fake, body: &[u8]) -> Flow {
        assert!(stage.wants_request_body(true));
        stage.handle(
            worker,
            fake,
            Input::RequestBody {
                size: body.len(),
                end_of_stream: true,
                body: Some(body),
            },
        )
    }

    fn response(
        stage: &mut Stage,
        worker: &mut Worker,
        fake: &mut Fake,
        status: u16,
        ty: &str,
    ) -> Flow {
        stage.handle(
            worker,
            fake,
            Input::ResponseHeaders {
                head: &response_head(status, ty, None, false),
                end_of_stream: false,
            },
        )
    }

    fn chunk(
        stage: &mut Stage,
        worker: &mut Worker,
        fake: &mut Fake,
        data: &[u8],
        end: bool,
    ) -> Vec<Command> {
        assert!(stage.wants_response_body(end));
        stage.handle(
            worker,
            fake,
            Input::ResponseBody {
                size: data.len(),
                end_of_stream: end,
                body: Some(data),
            },
        );
        drain(stage)
    }

    #[test]
    fn without_reentry_a_pass_is_never_asked_whether_it_was_superseded() {
        for (doc, watches) in [(json!({}), true), (json!({"reentry": false}), false)] {
            let (mut stage, mut worker, mut fake) =
                (Stage::default(), Worker::default(), Fake::default());
            let head = head("/v1/chat/completions", &[]);
            start(&mut stage, &mut worker, &mut fake, doc.clone(), &head);
            assert!(stage.is_active());
            assert_eq!(stage.watches_supersession(), watches, "{doc}");
        }
    }

    #[test]
    fn held_headers_frame_the_injected_body_only_when_it_has_a_length() {
        for (extra, framed) in [
            (("content-length", "85"), true),
            (("transfer-encoding", "chunked"), false),
        ] {
            let (mut stage, mut worker, mut fake) =
                (Stage::default(), Worker::default(), Fake::default());
            let doc = json!({"hold_headers": true});
            let head = head("/v1/chat/completions", &[extra]);
            assert_eq!(
                start(&mut stage, &mut worker, &mut fake, doc, &head),
                Flow::Pause
            );
            assert!(drain(&mut stage).is_empty(), "the length stays: {extra:?}");
            assert_eq!(
                body(&mut stage, &mut worker, &mut fake, STREAM_BODY),
                Flow::Continue
            );
            let Some(Command::ReplaceRequestBody { frame, .. }) = stage.poll() else {
                panic!("the body gets include_usage");
            };
            assert_eq!(frame, framed, "{extra:?}");
        }
    }

    #[test]
    fn a_stream_gets_usage_injected_hidden_and_recorded_once() {
        let (mut stage, mut worker, mut fake) =
            (Stage::default(), Worker::default(), Fake::default());
        fake.now = 1_000;
        let flow = start(
            &mut stage,
            &mut worker,
            &mut fake,
            json!({}),
            &head("/v1/chat/completions", &[("accept-encoding", "gzip")]),
        );
        assert_eq!(flow, Flow::Continue);
        let commands = drain(&mut stage);
        assert!(
            matches!(
                commands[..],
                [
                    Command::RemoveHeader(Map::Request, Name::Borrowed("accept-encoding")),
                    Command::RemoveHeader(Map::Request, Name::Borrowed("content-length"))
                ]
            ),
            "{commands:?}"
        );
        // a partial body is buffered, not read
        assert!(stage.holds_request_body());
        assert!(!stage.wants_request_body(false));
        let partial = Input::RequestBody {
            size: 10,
            end_of_stream: false,
            body: None,
        };
        assert_eq!(stage.handle(&mut worker, &mut fake, partial), Flow::Pause);
        assert_eq!(
            body(&mut stage, &mut worker, &mut fake, STREAM_BODY),
            Flow::Continue
        );
        let Some(Command::ReplaceRequestBody {
            body: new_body,
            frame: false,
            ..
        }) = stage.poll()
        else {
            panic!("the body gets include_usage (headers gone on: nothing to frame)");
        };
        assert!(String::from_utf8(new_body)
            .unwrap()
            .contains(r#""include_usage":true"#));
        response(
            &mut stage,
            &mut worker,
            &mut fake,
            200,
            "text/event-stream; charset=utf-8",
        );
        assert!(matches!(
            drain(&mut stage)[..],
            [Command::RemoveHeader(
                Map::Response,
                Name::Borrowed("content-length")
            )]
        ));
        fake.now = 1_250;
        let first = b"data: {\"model\":\"gpt-4o-mini\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n";
        assert!(chunk(&mut stage, &mut worker, &mut fake, first, false).is_empty());
        let clock_reads = fake.clock_reads;
        fake.now = 9_000;
        let usage = b"data: {\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":100}}\n\ndata: [DONE]\n\n";
        let commands = chunk(&mut stage, &mut worker, &mut fake, usage, true);
        // after the first output the clock is read only to close the record
        assert_eq!(fake.clock_reads, clock_reads + 1);
        // the usage-only chunk the client did not ask for is hidden
        let Command::ReplaceResponseBody {
            body: forwarded, ..
        } = &commands[0]
        else {
            panic!("{commands:?}");
        };
        assert_eq!(forwarded.as_slice(), b"data: [DONE]\n\n");
        let records = published(&commands);
        assert_eq!(records.len(), 1);
        let record = &records[0];
        assert_eq!(
            (record.usage.prompt_tokens, record.usage.completion_tokens),
            (1000, 100)
        );
        assert_eq!(record.usage_source, UsageSource::Upstream);
        assert_eq!(record.ttft_ms, Some(250));
        assert_eq!(record.duration_ms, 8_000);
        assert_eq!(record.request_id, "req-1");
        assert_eq!(record.cost_nano, Some(420_000));
        assert_eq!(fake.route_reads, 1);
        // on_log publishes nothing more
        stage.handle(&mut worker, &mut fake, Input::Log { superseded: false });
        assert!(published(&drain(&mut stage)).is_empty());
        assert_eq!(fake.id_reads, 0);
    }

    #[test]
    fn what_is_not_accounted_is_left_alone() {
        let (mut worker, mut fake) = (Worker::default(), Fake::default());
        for head in [
            RequestHead::new(vec![
                (":method".into(), b"GET".to_vec()),
                (":path".into(), b"/v1/chat/completions".to_vec()),
            ]),
            head("/v1/models", &[]),
            head("/v1/messages/count_tokens", &[]),
        ] {
            let mut stage = Stage::default();
            assert_eq!(
                start(&mut stage, &mut worker, &mut fake, json!({}), &head),
                Flow::Continue
            );
            assert!(!stage.is_active());
            assert!(drain(&mut stage).is_empty());
            assert!(!stage.wants_request_body(true));
        }
        // no configuration for the route
        let mut stage = Stage::default();
        let input = Input::RequestHeaders {
            config: None,
            head: &head("/v1/chat/completions", &[]),
            end_of_stream: false,
        };
        stage.handle(&mut worker, &mut fake, input);
        assert!(!stage.is_active());
    }

    #[test]
    fn held_headers_wait_for_the_cost() {
        let (mut stage, mut worker, mut fake) =
            (Stage::default(), Worker::default(), Fake::default());
        let doc = json!({"hold_headers": true, "cost_headers": true});
        let flow = start(
            &mut stage,
            &mut worker,
            &mut fake,
            doc,
            &head("/v1/chat/completions", &[("content-length", "80")]),
        );
        assert_eq!(flow, Flow::Pause);
        // no accept-encoding: nothing to remove
        assert!(drain(&mut stage).is_empty());
        body(
            &mut stage,
            &mut worker,
            &mut fake,
            br#"{"model":"gpt-4o","messages":[]}"#,
        );
        assert!(
            drain(&mut stage).is_empty(),
            "no stream: the body is not changed"
        );
        let input = Input::ResponseHeaders {
            head: &response_head(200, "application/json", Some(200), false),
            end_of_stream: false,
        };
        assert_eq!(stage.handle(&mut worker, &mut fake, input), Flow::Pause);
        assert!(!stage.wants_response_body(false));
        let part = Input::ResponseBody {
            size: 10,
            end_of_stream: false,
            body: None,
        };
        assert_eq!(stage.handle(&mut worker, &mut fake, part), Flow::Pause);
        let answer = br#"{"model":"gpt-4o","choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":100,"prompt_tokens_details":{"cached_tokens":600}}}"#;
        let commands = chunk(&mut stage, &mut worker, &mut fake, answer, true);
        assert!(commands.iter().any(|c| matches!(c, Command::SetHeader(Map::Response, n, v) if n == "x-llm-cost" && v == "0.0002436 USD")), "{commands:?}");
        assert_eq!(published(&commands).len(), 1);
    }

    #[test]
    fn a_compressed_answer_is_estimated() {
        let (mut stage, mut worker, mut fake) =
            (Stage::default(), Worker::default(), Fake::default());
        start(
            &mut stage,
            &mut worker,
            &mut fake,
            json!({}),
            &head("/v1/chat/completions", &[]),
        );
        body(
            &mut stage,
            &mut worker,
            &mut fake,
            br#"{"model":"gpt-4o","messages":[{"role":"user","content":"hello there"}]}"#,
        );
        drain(&mut stage);
        let input = Input::ResponseHeaders {
            head: &response_head(200, "application/json", None, true),
            end_of_stream: false,
        };
        stage.handle(&mut worker, &mut fake, input);
        assert!(!stage.wants_response_body(true));
        let last = Input::ResponseBody {
            size: 40,
            end_of_stream: true,
            body: None,
        };
        stage.handle(&mut worker, &mut fake, last);
        let records = published(&drain(&mut stage));
        assert_eq!(records[0].usage_source, UsageSource::Estimated);
        assert!(records[0].usage.prompt_tokens > 0);
    }

    #[test]
    fn a_failure_that_may_be_superseded_waits_for_on_log() {
        let (mut worker, mut fake) = (Worker::default(), Fake::default());
        fake.now = 100;
        let mut first = Stage::default();
        start(
            &mut first,
            &mut worker,
            &mut fake,
            json!({}),
            &head("/v1/chat/completions", &[]),
        );
        body(&mut first, &mut worker, &mut fake, STREAM_BODY);
        drain(&mut first);
        response(&mut first, &mut worker, &mut fake, 429, "application/json");
        let commands = chunk(&mut first, &mut worker, &mut fake, br#"{"error":{}}"#, true);
        assert!(published(&commands).is_empty(), "a 429 may be superseded");
        // superseded: no record; the re-entering pass continues the logical request
        first.handle(&mut worker, &mut fake, Input::Log { superseded: true });
        assert!(published(&drain(&mut first)).is_empty());
        fake.now = 700;
        let mut second = Stage::default();
        start(
            &mut second,
            &mut worker,
            &mut fake,
            json!({}),
            &head("/v1/chat/completions", &[("x-llm-reentry", "1")]),
        );
        // upstream Envoy re-sends the first pass's edited body: include_usage stays hidden
        body(&mut second, &mut worker, &mut fake, br#"{"model":"gpt-4o-mini","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#);
        drain(&mut second);
        response(
            &mut second,
            &mut worker,
            &mut fake,
            200,
            "text/event-stream",
        );
        drain(&mut second);
        let usage = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n";
        let commands = chunk(&mut second, &mut worker, &mut fake, usage, true);
        let records = published(&commands);
        assert_eq!(records.len(), 1);
        assert_eq!(
            records[0].ts_ms, 100,
            "the logical request started with the first pass"
        );
        assert_eq!(records[0].duration_ms, 600);
        assert!(commands.iter().any(|c| matches!(c, Command::ReplaceResponseBody { body, .. } if body.as_slice() == b"data: [DONE]\n\n")));
        // not superseded after all: on_log publishes the failure
        let mut third = Stage::default();
        start(
            &mut third,
            &mut worker,
            &mut fake,
            json!({}),
            &head("/v1/embeddings", &[]),
        );
        response(&mut third, &mut worker, &mut fake, 503, "application/json");
        chunk(&mut third, &mut worker, &mut fake, b"{}", true);
        third.handle(&mut worker, &mut fake, Input::Log { superseded: false });
        let records = published(&drain(&mut third));
        assert_eq!(
            (records.len(), records[0].status, records[0].complete),
            (1, 503, true)
        );
    }

    #[test]
    fn a_cut_stream_is_recorded_at_on_log_as_incomplete() {
        let (mut stage, mut worker, mut fake) =
            (Stage::default(), Worker::default(), Fake::default());
        start(
            &mut stage,
            &mut worker,
            &mut fake,
            json!({}),
            &head("/v1/chat/completions", &[]),
        );
        body(&mut stage, &mut worker, &mut fake, STREAM_BODY);
        response(&mut stage, &mut worker, &mut fake, 200, "text/event-stream");
        drain(&mut stage);
        chunk(
            &mut stage,
            &mut worker,
            &mut fake,
            b"data: {\"choices\":[{\"delta\":{\"content\":\"Hello world\"}}]}\n\n",
            false,
        );
        stage.handle(&mut worker, &mut fake, Input::Log { superseded: false });
        let records = published(&drain(&mut stage));
        assert_eq!(records.len(), 1);
        assert!(!records[0].complete);
        assert!(
            records[0].usage.completion_tokens > 0,
            "the streamed text is counted"
        );
    }

    #[test]
    fn trailers_end_the_response() {
        let (mut stage, mut worker, mut fake) =
            (Stage::default(), Worker::default(), Fake::default());
        let doc = json!({"hold_headers": true, "cost_headers": true});
        start(
            &mut stage,
            &mut worker,
            &mut fake,
            doc,
            &head("/v1/embeddings", &[]),
        );
        let input = Input::ResponseHeaders {
            head: &response_head(200, "application/json", Some(90), false),
            end_of_stream: false,
        };
        stage.handle(&mut worker, &mut fake, input);
        drain(&mut stage);
        assert!(stage.wants_body_at_trailers());
        let answer = br#"{"model":"e","data":[],"usage":{"prompt_tokens":7,"total_tokens":7}}"#;
        stage.handle(
            &mut worker,
            &mut fake,
            Input::ResponseTrailers { body: Some(answer) },
        );
        let records = published(&drain(&mut stage));
        assert_eq!(records[0].usage.prompt_tokens, 7);
        assert!(!stage.wants_body_at_trailers());
    }

    #[test]
    fn failed_commands_are_logged_and_the_record_stands() {
        let (mut stage, mut worker, mut fake) =
            (Stage::default(), Worker::default(), Fake::default());
        start(
            &mut stage,
            &mut worker,
            &mut fake,
            json!({}),
            &head("/v1/embeddings", &[]),
        );
        response(&mut stage, &mut worker, &mut fake, 200, "application/json");
        let commands = chunk(
            &mut stage,
            &mut worker,
            &mut fake,
            br#"{"usage":{"prompt_tokens":3}}"#,
            true,
        );
        let publish = commands
            .into_iter()
            .find(|c| matches!(c, Command::Own(Publish { .. })))
            .unwrap();
        assert_eq!(
            stage::Core::failed(&mut stage, publish, "bad argument".into()),
            Flow::Continue
        );
        let commands = drain(&mut stage);
        assert!(
            matches!(&commands[..], [Command::Log(Level::Warn, line)] if line.contains("cannot set filter state")),
            "{commands:?}"
        );
        // nothing is published twice
        stage.handle(&mut worker, &mut fake, Input::Log { superseded: false });
        assert!(published(&drain(&mut stage)).is_empty());
    }

    #[test]
    fn the_host_request_id_is_asked_only_without_request_id_headers() {
        let (mut stage, mut worker, mut fake) =
            (Stage::default(), Worker::default(), Fake::default());
        let bare = RequestHead::new(vec![
            (":method".into(), b"POST".to_vec()),
            (":path".into(), b"/v1/embeddings".to_vec()),
        ]);
        start(&mut stage, &mut worker, &mut fake, json!({}), &bare);
        assert_eq!(fake.id_reads, 1);
        response(&mut stage, &mut worker, &mut fake, 200, "application/json");
        let records = published(&chunk(&mut stage, &mut worker, &mut fake, b"{}", true));
        assert_eq!(records[0].request_id, "host-id");
    }

    /// The record names the client's API and the answering deployment's; the usage is read
    /// in the API of the body this filter saw (the router translates the answer after it).
    #[test]
    fn a_translated_request_records_both_apis_and_counts_the_translation() {
        const CHAT_BODY: &[u8] = br#"{"model":"fast","messages":[{"role":"user","content":"hi"}]}"#;
        const MESSAGES_BODY: &[u8] =
            br#"{"model":"fast","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#;
        const CHAT_ANSWER: &[u8] =
            br#"{"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2}}"#;
        const MESSAGES_ANSWER: &[u8] =
            br#"{"model":"claude-x","content":[],"usage":{"input_tokens":10,"output_tokens":2}}"#;
        // the router's state: `provider`, and `client_api` only when it translated
        let route = |provider: &str, client_api: Option<&str>| {
            let client_api = client_api
                .map(|api| format!(r#","client_api":"{api}""#))
                .unwrap_or_default();
            let json = format!(
                r#"{{"request_id":"req-1","model_group":"fast","deployment":"d","model":"m","provider":"{provider}","route_version":"v","attempts":1{client_api}}}"#
            );
            RouteInfo::from_json(json.as_bytes())
        };
        for (what, path, request, answer, route, api, provider_api, counter) in [
            (
                "a Chat Completions client served by an Anthropic deployment",
                "/v1/messages",
                MESSAGES_BODY,
                MESSAGES_ANSWER,
                route("anthropic", Some("chat.completions")),
                "chat.completions",
                "messages",
                Some("llm_gateway.usage.translated.chat_completions.messages"),
            ),
            (
                "a Messages client served by an OpenAI deployment",
                "/v1/chat/completions",
                CHAT_BODY,
                CHAT_ANSWER,
                route("openai", Some("messages")),
                "messages",
                "chat.completions",
                Some("llm_gateway.usage.translated.messages.chat_completions"),
            ),
            (
                "untranslated chat",
                "/v1/chat/completions",
                CHAT_BODY,
                CHAT_ANSWER,
                route("openai", None),
                "chat.completions",
                "chat.completions",
                None,
            ),
            (
                "untranslated Messages",
                "/v1/messages",
                MESSAGES_BODY,
                MESSAGES_ANSWER,
                route("anthropic", None),
                "messages",
                "messages",
                None,
            ),
            (
                // Envoy 1.40, a plan mixing providers: the first attempt's (Anthropic) API in
                // the body, a later attempt's Azure deployment translated by its upstream filter
                "a Messages client answered by a later attempt's Azure deployment",
                "/v1/messages",
                MESSAGES_BODY,
                MESSAGES_ANSWER,
                route("azure", None),
                "messages",
                "chat.completions",
                Some("llm_gateway.usage.translated.messages.chat_completions"),
            ),
            (
                "the same for an OpenAI deployment",
                "/v1/messages",
                MESSAGES_BODY,
                MESSAGES_ANSWER,
                route("openai", None),
                "messages",
                "chat.completions",
                Some("llm_gateway.usage.translated.messages.chat_completions"),
            ),
            (
                // translated for the first attempt, answered natively by a later one
                "a Chat Completions client answered by a later attempt's OpenAI deployment",
                "/v1/messages",
                MESSAGES_BODY,
                MESSAGES_ANSWER,
                route("openai", Some("chat.completions")),
                "chat.completions",
                "chat.completions",
                None,
            ),
            (
                "no router",
                "/v1/messages",
                MESSAGES_BODY,
                MESSAGES_ANSWER,
                None,
                "messages",
                "messages",
                None,
            ),
        ] {
            let (mut stage, mut worker) = (Stage::default(), Worker::default());
            let mut fake = Fake {
                route,
                ..Fake::default()
            };
            start(
                &mut stage,
                &mut worker,
                &mut fake,
                json!({}),
                &head(path, &[]),
            );
            body(&mut stage, &mut worker, &mut fake, request);
            response(&mut stage, &mut worker, &mut fake, 200, "application/json");
            let records = published(&chunk(&mut stage, &mut worker, &mut fake, answer, true));
            let [record] = records.as_slice() else {
                panic!("{what}: {records:?}");
            };
            assert_eq!(record.api, api, "{what}");
            assert_eq!(record.provider_api.as_deref(), Some(provider_api), "{what}");
            assert_eq!(
                (record.usage.prompt_tokens, record.usage.completion_tokens),
                (10, 2),
                "{what}: the usage of the body's API"
            );
            assert_eq!(record.usage_source, UsageSource::Upstream, "{what}");
            assert_eq!(
                crate::metrics::translated_name(record).as_deref(),
                counter,
                "{what}"
            );
        }
    }
}
