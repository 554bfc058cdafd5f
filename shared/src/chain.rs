//! The engine of the fused filter: several stages run inside one HTTP context in the order,
//! and with the pauses, that Envoy's filter manager gives separate filters.
//!
//! Why the order matters: a stage reads what the stages before it wrote, and some write late.
//! The model router sets the route's headers only once it read the body's `model`, so it holds
//! the request headers until the body is complete; usage-accounting, after it, reads those
//! headers in its own header step. Run side by side, usage-accounting would account the
//! request to no deployment. So, as Envoy does when a filter returns `StopIteration` on
//! headers and `StopIterationAndBuffer` on data, a stage that holds runs its data step on the
//! whole body first, and only then do the stages after it take their header steps. The
//! response runs the stages in reverse order the same way, and `on_log` runs in chain order.
//!
//! The contract with a stage: **a stage that needs the whole body says so at its header
//! step** ([`Step::Buffer`]). Then:
//! * the stages before it have continued their headers; the host buffers the body; at its end
//!   the holding stage takes its data step on all of it, and each later stage takes its header
//!   step, then its data step on that whole body, in turn;
//! * if no stage holds, each chunk passes every stage's data step as it comes (a stream).
//!
//! A stage may also answer [`Step::Wait`] (it sent a Redis script: nothing runs until
//! [`Engine::resume`]) or [`Step::Stop`] (it sent a local reply: no stage takes another step
//! of that direction; the local reply itself comes back as the response, which every stage
//! sees, as every filter does in Envoy; `log` still runs).
//!
//! The engine is pure: the driver holds the request (headers read once, the body read once,
//! the current data) and the stages; the engine only decides which stage takes which step
//! next and what the host callback returns ([`Outcome`]).

use crate::request::Pairs;
use std::rc::Rc;

/// A stage's answer to one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Go on: the next stage takes the step.
    Continue,
    /// (A header step's answer.) Hold: this stage takes its data step on the whole body.
    Buffer,
    /// An asynchronous call is out: hold until [`Engine::resume`].
    Wait,
    /// A local reply was sent: the request goes no further.
    Stop,
}

/// What the host callback returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Let the headers or data go on (after the driver wrote what the stages changed).
    Continue,
    /// Hold (keep the headers, buffer the body, or wait for a reply).
    Pause,
    /// A local reply was sent.
    Stop,
}

/// The request or the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Downstream to upstream: chain order.
    Request,
    /// Upstream to downstream: reverse order.
    Response,
}

/// A stage of the chain, as the engine drives it. `X` is the driver's exchange (headers,
/// body, the current data); every step reads and edits it.
pub trait Stage<X> {
    /// The headers of `direction` (`end_of_stream`: no body follows).
    fn headers(&mut self, x: &mut X, direction: Direction, end_of_stream: bool) -> Step;
    /// Data of `direction`: the current chunk while the direction streams, or the whole body
    /// once a stage held (`end_of_stream` is then true).
    fn data(&mut self, x: &mut X, direction: Direction, end_of_stream: bool) -> Step;
    /// The request is over (every stage, in chain order, whatever happened).
    fn log(&mut self, x: &mut X);
}

/// How far a direction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Regime {
    /// Header steps run as the headers arrive.
    Headers,
    /// The stage at `pos` held: the body is being buffered.
    Hold,
    /// The body is complete: from `pos` on, each stage takes its data step on the whole body
    /// (after its header step, for the stages after the one that held).
    Whole,
    /// Every stage continued its headers: each chunk passes every stage.
    Stream,
    /// Nothing more to run for this direction.
    Done,
}

/// Which step of the stage at `pos` is next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sub {
    Headers,
    Data,
}

/// Where one direction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cursor {
    regime: Regime,
    /// A position in the direction's order.
    pos: usize,
    sub: Sub,
    /// The stage at `pos` waits for a reply to its step.
    waiting: bool,
    /// The headers did not end the stream.
    has_body: bool,
    /// The whole body is here (or there is none).
    ended: bool,
    /// A stage stopped this direction (a local reply went out).
    stopped: bool,
    /// The position of the stage that held: the stages up to it took their header steps
    /// already, so in [`Regime::Whole`] they take only their data step.
    held_at: usize,
}

impl Cursor {
    fn start(end_of_stream: bool) -> Cursor {
        Cursor {
            regime: Regime::Headers,
            pos: 0,
            sub: Sub::Headers,
            waiting: false,
            has_body: !end_of_stream,
            ended: end_of_stream,
            stopped: false,
            held_at: 0,
        }
    }
}

/// The sequencing state of one HTTP context.
#[derive(Debug, Clone)]
pub struct Engine {
    stages: usize,
    request: Cursor,
    response: Cursor,
}

impl Engine {
    /// An engine for `stages` stages.
    pub fn new(stages: usize) -> Engine {
        Engine {
            stages,
            request: Cursor::start(false),
            response: Cursor::start(false),
        }
    }

    /// True once a stage stopped the request (sent a local reply while it was decoded).
    pub fn stopped(&self) -> bool {
        self.request.stopped
    }

    /// True while a stage of `direction` waits for a reply.
    pub fn waiting(&self, direction: Direction) -> bool {
        self.cursor(direction).waiting
    }

    /// True if the next data of `direction` (`end_of_stream`: the last) is looked at: the
    /// driver reads it from the host only then (a chunk while the direction streams, the whole
    /// body at the end of a hold).
    pub fn wants_data(&self, direction: Direction, end_of_stream: bool) -> bool {
        let cursor = self.cursor(direction);
        !cursor.stopped
            && !cursor.waiting
            && match cursor.regime {
                Regime::Stream => true,
                Regime::Hold => end_of_stream,
                Regime::Headers | Regime::Whole | Regime::Done => false,
            }
    }

    /// True once every stage continued `direction`'s headers: the driver writes the header
    /// edits to the host before the callback continues (after that they cannot change).
    pub fn headers_done(&self, direction: Direction) -> bool {
        matches!(self.cursor(direction).regime, Regime::Stream | Regime::Done)
    }

    fn cursor(&self, direction: Direction) -> &Cursor {
        match direction {
            Direction::Request => &self.request,
            Direction::Response => &self.response,
        }
    }

    fn cursor_mut(&mut self, direction: Direction) -> &mut Cursor {
        match direction {
            Direction::Request => &mut self.request,
            Direction::Response => &mut self.response,
        }
    }

    /// The headers of `direction` arrived.
    pub fn headers<X>(
        &mut self,
        stages: &mut [Box<dyn Stage<X>>],
        x: &mut X,
        direction: Direction,
        end_of_stream: bool,
    ) -> Outcome {
        *self.cursor_mut(direction) = Cursor::start(end_of_stream);
        self.run(stages, x, direction)
    }

    /// Data of `direction` arrived; `end_of_stream`: the body is complete. The driver's
    /// current data is this chunk while the direction streams, and the whole buffered body
    /// once a stage held.
    pub fn data<X>(
        &mut self,
        stages: &mut [Box<dyn Stage<X>>],
        x: &mut X,
        direction: Direction,
        end_of_stream: bool,
    ) -> Outcome {
        let cursor = self.cursor_mut(direction);
        if cursor.stopped {
            return Outcome::Stop;
        }
        cursor.ended |= end_of_stream;
        if cursor.waiting {
            return Outcome::Pause; // the host buffers; the waiting stage goes on later
        }
        match cursor.regime {
            Regime::Hold if cursor.ended => self.run(stages, x, direction),
            Regime::Headers | Regime::Hold | Regime::Whole => Outcome::Pause,
            Regime::Stream => {
                cursor.pos = 0;
                self.run(stages, x, direction)
            }
            Regime::Done => Outcome::Continue,
        }
    }

    /// The reply a waiting stage of `direction` waited for was taken; `step` is that stage's
    /// answer to the step it was taking. `Outcome::Continue`: the driver resumes the host's
    /// stream.
    pub fn resume<X>(
        &mut self,
        stages: &mut [Box<dyn Stage<X>>],
        x: &mut X,
        direction: Direction,
        step: Step,
    ) -> Outcome {
        let cursor = self.cursor_mut(direction);
        if cursor.stopped {
            return Outcome::Stop;
        }
        if !cursor.waiting {
            return Outcome::Pause; // nothing waits
        }
        cursor.waiting = false;
        match self.answer(direction, step) {
            Some(outcome) => outcome,
            None => self.run(stages, x, direction),
        }
    }

    /// `on_log`: every stage in chain order.
    pub fn log<X>(&mut self, stages: &mut [Box<dyn Stage<X>>], x: &mut X) {
        for stage in stages.iter_mut() {
            stage.log(x);
        }
    }

    /// Moves past the current step, answered with `step`; `Some` if the callback must return
    /// now.
    fn answer(&mut self, direction: Direction, step: Step) -> Option<Outcome> {
        let cursor = self.cursor_mut(direction);
        match step {
            Step::Stop => {
                cursor.stopped = true;
                return Some(Outcome::Stop);
            }
            Step::Wait => {
                cursor.waiting = true;
                return Some(Outcome::Pause);
            }
            Step::Continue | Step::Buffer => {}
        }
        match (cursor.regime, cursor.sub) {
            (Regime::Headers, _) => {
                if step == Step::Buffer && cursor.has_body {
                    cursor.regime = Regime::Hold;
                    cursor.held_at = cursor.pos;
                    cursor.sub = Sub::Data;
                    if !cursor.ended {
                        return Some(Outcome::Pause);
                    }
                } else {
                    cursor.pos += 1;
                }
            }
            (Regime::Whole, Sub::Headers) => cursor.sub = Sub::Data,
            (Regime::Whole, Sub::Data) => {
                cursor.pos += 1;
                cursor.sub = if cursor.pos <= cursor.held_at {
                    Sub::Data
                } else {
                    Sub::Headers
                };
            }
            (Regime::Stream, _) => cursor.pos += 1,
            (Regime::Hold | Regime::Done, _) => {}
        }
        None
    }

    /// Runs steps until a stage holds or waits, or every stage went on.
    fn run<X>(
        &mut self,
        stages: &mut [Box<dyn Stage<X>>],
        x: &mut X,
        direction: Direction,
    ) -> Outcome {
        let count = self.stages.min(stages.len());
        loop {
            let cursor = *self.cursor(direction);
            if cursor.stopped {
                return Outcome::Stop;
            }
            if cursor.waiting {
                return Outcome::Pause;
            }
            if cursor.regime == Regime::Hold {
                if !cursor.ended {
                    return Outcome::Pause;
                }
                // the whole body passes the stages before the one that held as one chunk
                let c = self.cursor_mut(direction);
                c.regime = Regime::Whole;
                c.pos = 0;
                c.sub = Sub::Data;
                continue;
            }
            if cursor.pos >= count {
                let c = self.cursor_mut(direction);
                c.regime = match c.regime {
                    Regime::Headers if c.has_body && !c.ended => Regime::Stream,
                    Regime::Stream if !c.ended => Regime::Stream,
                    _ => Regime::Done,
                };
                c.pos = 0;
                return Outcome::Continue;
            }
            let index = match direction {
                Direction::Request => cursor.pos,
                Direction::Response => count - 1 - cursor.pos,
            };
            let Some(stage) = stages.get_mut(index) else {
                return Outcome::Continue;
            };
            let step = match (cursor.regime, cursor.sub) {
                (Regime::Headers, _) => stage.headers(x, direction, !cursor.has_body),
                (Regime::Whole, Sub::Headers) => stage.headers(x, direction, false),
                (Regime::Whole, Sub::Data) => stage.data(x, direction, true),
                (Regime::Stream, _) => stage.data(x, direction, cursor.ended),
                (Regime::Hold | Regime::Done, _) => return Outcome::Continue,
            };
            if let Some(outcome) = self.answer(direction, step) {
                return outcome;
            }
        }
    }
}

/// One header write (borrowed from [`Edits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edit<'a> {
    /// Replace every value of the header with this one (add it if absent).
    Set(&'a str, &'a [u8]),
    /// Add a value.
    Add(&'a str, &'a [u8]),
    /// Remove every value.
    Remove(&'a str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EditKind {
    Set,
    Add,
    Remove,
}

/// The header writes of one direction: their names and values kept in two buffers (a few
/// allocations per direction, not two per write).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Edits {
    /// Each write's kind and where its name ends in `names` and its value in `values` (each
    /// starts where the previous one ended).
    ops: Vec<(EditKind, usize, usize)>,
    names: String,
    values: Vec<u8>,
}

impl Edits {
    fn push(&mut self, kind: EditKind, name: &str, value: &[u8]) {
        if self.ops.is_empty() {
            // what the chain's stages write to one request: no reallocation on the way
            self.ops.reserve(16);
            self.names.reserve(256);
            self.values.reserve(512);
        }
        self.names.push_str(name);
        self.values.extend_from_slice(value);
        self.ops.push((kind, self.names.len(), self.values.len()));
    }

    /// True if there is no write.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// How many writes (host calls, written one by one).
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// The writes, in order.
    pub fn iter(&self) -> impl Iterator<Item = Edit<'_>> {
        let mut name_start = 0;
        let mut value_start = 0;
        self.ops.iter().map(move |&(kind, name_end, value_end)| {
            let name = self.names.get(name_start..name_end).unwrap_or_default();
            let value = self.values.get(value_start..value_end).unwrap_or_default();
            name_start = name_end;
            value_start = value_end;
            match kind {
                EditKind::Set => Edit::Set(name, value),
                EditKind::Add => Edit::Add(name, value),
                EditKind::Remove => Edit::Remove(name),
            }
        })
    }

    /// True if one call that replaces the whole map (`proxy_set_header_map_pairs`, with the
    /// `headers` it then holds) costs the host less than these writes one by one.
    ///
    /// Measured in Envoy 1.40 (V8, CPU per request, `docs/operator-guide.md` § 7): a write
    /// of a header the request did not have, or of a new value, costs about 1.4 µs (each call
    /// crosses V8's host-call boundary); replacing the whole map about 2 µs plus 0.4 µs per
    /// header it holds (Envoy removes every header, then adds each pair). So the one call
    /// wins from about eight writes on a request's usual twenty headers.
    pub fn cheaper_as_one_map(&self, headers: usize) -> bool {
        // in tenths of µs
        self.len().saturating_mul(14) > headers.saturating_mul(4).saturating_add(20)
    }
}

/// The values of `name` in `pairs`, in order.
#[cfg(test)]
fn values<'a>(pairs: &'a [(String, Vec<u8>)], name: &'a str) -> impl Iterator<Item = &'a [u8]> {
    pairs
        .iter()
        .filter(move |(n, _)| n == name)
        .map(|(_, v)| v.as_slice())
}

/// What the edits of one name after a point in the log do, walking it backwards.
struct Later<'a> {
    name: &'a str,
    /// A later `Set` or `Remove`: what comes before it does not matter.
    reset: bool,
    /// The first `Add` after the last reset (or of all, without one).
    first_add: Option<usize>,
}

/// Headers as the stages of one context see them: read from the host once, edited in memory
/// (each stage sees what the stages before it changed), and written to the host once, each
/// header written once whatever the stages did to it on the way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    /// Shared with the [`RequestHead`](crate::request::RequestHead)s of the stages
    /// ([`Headers::shared`]): an edit copies the list only while such a view still holds it.
    pairs: Rc<Pairs>,
    /// The edits since the last write, in order.
    edits: Edits,
}

impl Headers {
    /// The headers as the host listed them.
    pub fn new(pairs: Pairs) -> Headers {
        Headers {
            pairs: Rc::new(pairs),
            edits: Edits::default(),
        }
    }

    /// Every header now, in order.
    pub fn pairs(&self) -> &[(String, Vec<u8>)] {
        &self.pairs
    }

    /// Every header now, in order, as a list a stage may keep (for a
    /// [`RequestHead`](crate::request::RequestHead)) without copying it: it does not change
    /// when the headers are edited later.
    pub fn shared(&self) -> Rc<Pairs> {
        Rc::clone(&self.pairs)
    }

    /// The first value of `name` (lowercase).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// The first value of `name` when it is UTF-8.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.get(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Replaces every value of `name` with `value` (nothing to write if that is its only
    /// value already).
    pub fn set(&mut self, name: &str, value: &[u8]) {
        let Some(first) = self.pairs.iter().position(|(n, _)| n == name) else {
            Rc::make_mut(&mut self.pairs).push((name.to_string(), value.to_vec()));
            self.edits.push(EditKind::Set, name, value);
            return;
        };
        let repeated = self.pairs.iter().skip(first + 1).any(|(n, _)| n == name);
        let same = self.pairs.get(first).is_some_and(|(_, v)| v == value);
        if same && !repeated {
            return;
        }
        let pairs = Rc::make_mut(&mut self.pairs);
        if let Some(pair) = pairs.get_mut(first) {
            pair.1.clear();
            pair.1.extend_from_slice(value);
        }
        if repeated {
            let mut index = 0;
            pairs.retain(|(n, _)| {
                let keep = index <= first || n != name;
                index += 1;
                keep
            });
        }
        self.edits.push(EditKind::Set, name, value);
    }

    /// Adds a value of `name`.
    pub fn add(&mut self, name: &str, value: &[u8]) {
        Rc::make_mut(&mut self.pairs).push((name.to_string(), value.to_vec()));
        self.edits.push(EditKind::Add, name, value);
    }

    /// Removes every value of `name`.
    pub fn remove(&mut self, name: &str) {
        if !self.pairs.iter().any(|(n, _)| n == name) {
            return;
        }
        Rc::make_mut(&mut self.pairs).retain(|(n, _)| n != name);
        self.edits.push(EditKind::Remove, name, &[]);
    }

    /// The writes that bring the host's headers to these, in order (and forgets them): the
    /// edits, each header's last value winning. An edit a later `Set` or `Remove` of the same
    /// header makes moot is dropped; a `Remove` followed only by `Add`s becomes a `Set` of the
    /// first (Envoy's replace drops every value the host held).
    pub fn take_edits(&mut self) -> Edits {
        let log = std::mem::take(&mut self.edits);
        let ops: Vec<Edit<'_>> = log.iter().collect();
        // walking back: keep[i], and which adds become sets
        let mut keep = vec![true; ops.len()];
        let mut as_set = vec![false; ops.len()];
        let mut later: Vec<Later<'_>> = Vec::new();
        for (i, op) in ops.iter().enumerate().rev() {
            let (name, kind) = match *op {
                Edit::Set(n, _) => (n, EditKind::Set),
                Edit::Add(n, _) => (n, EditKind::Add),
                Edit::Remove(n) => (n, EditKind::Remove),
            };
            let position = match later.iter().position(|l| l.name == name) {
                Some(p) => p,
                None => {
                    later.push(Later {
                        name,
                        reset: false,
                        first_add: None,
                    });
                    later.len() - 1
                }
            };
            let Some(entry) = later.get_mut(position) else {
                continue;
            };
            if entry.reset {
                if let Some(k) = keep.get_mut(i) {
                    *k = false;
                }
                continue;
            }
            match kind {
                EditKind::Add => entry.first_add = Some(i),
                EditKind::Set => entry.reset = true,
                EditKind::Remove => {
                    entry.reset = true;
                    if let Some(add) = entry.first_add {
                        if let Some(k) = keep.get_mut(i) {
                            *k = false;
                        }
                        if let Some(s) = as_set.get_mut(add) {
                            *s = true;
                        }
                    }
                }
            }
        }
        if keep.iter().all(|k| *k) {
            return log;
        }
        let mut edits = Edits::default();
        for (i, op) in ops.iter().enumerate() {
            if !keep.get(i).copied().unwrap_or(true) {
                continue;
            }
            match *op {
                Edit::Add(name, value) if as_set.get(i).copied().unwrap_or(false) => {
                    edits.push(EditKind::Set, name, value)
                }
                Edit::Set(name, value) => edits.push(EditKind::Set, name, value),
                Edit::Add(name, value) => edits.push(EditKind::Add, name, value),
                Edit::Remove(name) => edits.push(EditKind::Remove, name, &[]),
            }
        }
        edits
    }

    /// True if some edit waits to be written.
    pub fn edited(&self) -> bool {
        !self.edits.is_empty()
    }
}

/// What the stages of one HTTP context share: the request and response headers, and the data
/// of the step being taken.
#[derive(Debug, Clone, Default)]
pub struct Exchange {
    /// The request headers.
    pub request: Headers,
    /// The response headers.
    pub response: Headers,
    /// The data of the current step: a chunk while a direction streams, the whole body once a
    /// stage held. A stage that changes it sets `data_changed`.
    pub data: Vec<u8>,
    /// The data differs from what the host holds: the driver writes it back.
    pub data_changed: bool,
    /// A stage changed what the route depends on: the driver clears the route cache after it
    /// wrote the header edits.
    pub clear_route_cache: bool,
    /// Filter state the stages wrote during this request, as they wrote it (name, value): a
    /// later stage reads a record another stage published here instead of asking the host
    /// again. Only records no filter outside this one writes go here (the budget fallback,
    /// the usage record); never the route info or the attempt number, which the clusters'
    /// filter (the router's upstream role) rewrites.
    published: Vec<(String, Vec<u8>)>,
    /// `response.code_details` as read in the current callback, for every stage that asks
    /// ([`Exchange::code_details`]); the driver forgets it at each callback
    /// ([`Exchange::next_callback`]).
    code_details: std::cell::OnceCell<Option<String>>,
    /// The host's clock (Unix nanoseconds) as read in the current callback, for every stage
    /// that asks ([`Exchange::clock`]); forgotten at each callback like `code_details`.
    clock: std::cell::Cell<Option<u64>>,
}

impl Exchange {
    /// A new host callback begins: what was read from the host for the last one is forgotten.
    pub fn next_callback(&mut self) {
        self.code_details = std::cell::OnceCell::new();
        self.clock.set(None);
    }

    /// The clock for this callback: `read` asks the host the first time a stage wants the
    /// time; the stages after it get the same instant, as if they ran at once.
    pub fn clock(&self, read: impl FnOnce() -> u64) -> u64 {
        if let Some(now) = self.clock.get() {
            return now;
        }
        let now = read();
        self.clock.set(Some(now));
        now
    }

    /// `response.code_details` for this callback: `read` asks the host the first time a stage
    /// wants it; the stages after it get the same answer.
    pub fn code_details(&self, read: impl FnOnce() -> Option<String>) -> Option<&str> {
        self.code_details.get_or_init(read).as_deref()
    }

    /// Records filter state a stage wrote (after the host took it).
    pub fn publish(&mut self, name: &str, value: &[u8]) {
        match self.published.iter_mut().find(|(n, _)| n == name) {
            Some((_, old)) => {
                old.clear();
                old.extend_from_slice(value);
            }
            None => self.published.push((name.to_string(), value.to_vec())),
        }
    }

    /// The filter state `name` a stage of this filter wrote last in this request, if any.
    pub fn published(&self, name: &str) -> Option<&[u8]> {
        self.published
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    /// Replaces the current data.
    pub fn replace_data(&mut self, data: Vec<u8>) {
        self.data = data;
        self.data_changed = true;
    }

    /// Runs `f` with the current data lent out (so `f` may edit the exchange meanwhile): the
    /// data comes back unless `f` replaced it.
    pub fn with_data<R>(&mut self, f: impl FnOnce(&[u8], &mut Exchange) -> R) -> R {
        let data = std::mem::take(&mut self.data);
        let changed_before = std::mem::replace(&mut self.data_changed, false);
        let result = f(&data, self);
        if !self.data_changed {
            self.data = data;
        }
        self.data_changed |= changed_before;
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the stages did, in order: `"<stage> <step>"`.
    type Trace = Vec<String>;

    /// A stage that answers from a script per step kind and writes what it did.
    struct Scripted {
        name: &'static str,
        headers: Vec<Step>,
        data: Vec<Step>,
    }

    impl Scripted {
        fn new(name: &'static str) -> Scripted {
            Scripted {
                name,
                headers: Vec::new(),
                data: Vec::new(),
            }
        }
        fn headers(mut self, steps: &[Step]) -> Scripted {
            self.headers = steps.to_vec();
            self
        }
        fn data(mut self, steps: &[Step]) -> Scripted {
            self.data = steps.to_vec();
            self
        }
    }

    fn next(script: &mut Vec<Step>) -> Step {
        if script.is_empty() {
            Step::Continue
        } else {
            script.remove(0)
        }
    }

    fn arrow(direction: Direction) -> &'static str {
        match direction {
            Direction::Request => "req",
            Direction::Response => "resp",
        }
    }

    impl Stage<Trace> for Scripted {
        fn headers(&mut self, x: &mut Trace, direction: Direction, end: bool) -> Step {
            let end = if end { " end" } else { "" };
            x.push(format!("{} {} headers{end}", self.name, arrow(direction)));
            next(&mut self.headers)
        }
        fn data(&mut self, x: &mut Trace, direction: Direction, end: bool) -> Step {
            let end = if end { " end" } else { "" };
            x.push(format!("{} {} data{end}", self.name, arrow(direction)));
            next(&mut self.data)
        }
        fn log(&mut self, x: &mut Trace) {
            x.push(format!("{} log", self.name));
        }
    }

    fn run(
        stages: &mut Vec<Scripted>,
        f: impl FnOnce(&mut Engine, &mut [Box<dyn Stage<Trace>>], &mut Trace),
    ) -> Trace {
        let mut engine = Engine::new(stages.len());
        let mut refs: Vec<Box<dyn Stage<Trace>>> = std::mem::take(stages)
            .into_iter()
            .map(|s| Box::new(s) as Box<dyn Stage<Trace>>)
            .collect();
        let mut trace = Trace::new();
        f(&mut engine, &mut refs, &mut trace);
        trace
    }

    use Direction::{Request, Response};

    #[test]
    fn a_stage_that_holds_runs_on_the_whole_body_before_the_next_one_sees_headers() {
        let mut stages = vec![
            Scripted::new("auth"),
            Scripted::new("router").headers(&[Step::Buffer]),
            Scripted::new("pii").headers(&[Step::Buffer]),
            Scripted::new("usage"),
        ];
        let trace = run(&mut stages, |engine, stages, x| {
            assert_eq!(engine.headers(stages, x, Request, false), Outcome::Pause);
            assert!(!engine.headers_done(Request));
            // only the end of the held body is read
            assert!(!engine.wants_data(Request, false));
            assert!(engine.wants_data(Request, true));
            // chunks are buffered by the host: nobody looks at them yet
            assert_eq!(engine.data(stages, x, Request, false), Outcome::Pause);
            x.push("--- end of body".into());
            assert_eq!(engine.data(stages, x, Request, true), Outcome::Continue);
            assert!(engine.headers_done(Request));
            // nothing else runs for this direction
            assert_eq!(engine.data(stages, x, Request, true), Outcome::Continue);
        });
        assert_eq!(
            trace,
            [
                "auth req headers",
                "router req headers",
                "--- end of body",
                "auth req data end",
                "router req data end",
                "pii req headers",
                "pii req data end",
                "usage req headers",
                "usage req data end",
            ]
        );
    }

    #[test]
    fn without_a_hold_chunks_stream_through_every_stage() {
        let mut stages = vec![Scripted::new("a"), Scripted::new("b")];
        let trace = run(&mut stages, |engine, stages, x| {
            assert_eq!(engine.headers(stages, x, Request, false), Outcome::Continue);
            assert!(engine.headers_done(Request));
            assert!(engine.wants_data(Request, false));
            assert_eq!(engine.data(stages, x, Request, false), Outcome::Continue);
            assert_eq!(engine.data(stages, x, Request, true), Outcome::Continue);
        });
        assert_eq!(
            trace,
            [
                "a req headers",
                "b req headers",
                "a req data",
                "b req data",
                "a req data end",
                "b req data end",
            ]
        );
    }

    #[test]
    fn a_request_without_body_takes_header_steps_only_and_buffer_means_nothing() {
        let mut stages = vec![
            Scripted::new("a").headers(&[Step::Buffer]),
            Scripted::new("b"),
        ];
        let trace = run(&mut stages, |engine, stages, x| {
            assert_eq!(engine.headers(stages, x, Request, true), Outcome::Continue);
            assert!(engine.headers_done(Request));
        });
        assert_eq!(trace, ["a req headers end", "b req headers end"]);
    }

    #[test]
    fn the_response_runs_in_reverse_order_and_streams() {
        let mut stages = vec![
            Scripted::new("router"),
            Scripted::new("pii"),
            Scripted::new("usage"),
        ];
        let trace = run(&mut stages, |engine, stages, x| {
            assert_eq!(
                engine.headers(stages, x, Response, false),
                Outcome::Continue
            );
            assert_eq!(engine.data(stages, x, Response, false), Outcome::Continue);
            assert_eq!(engine.data(stages, x, Response, true), Outcome::Continue);
            engine.log(stages, x);
        });
        assert_eq!(
            trace,
            [
                "usage resp headers",
                "pii resp headers",
                "router resp headers",
                "usage resp data",
                "pii resp data",
                "router resp data",
                "usage resp data end",
                "pii resp data end",
                "router resp data end",
                "router log",
                "pii log",
                "usage log",
            ]
        );
    }

    #[test]
    fn a_held_response_reaches_later_stages_whole() {
        // usage holds the response headers to add the cost headers
        let mut stages = vec![
            Scripted::new("pii"),
            Scripted::new("usage").headers(&[Step::Buffer]),
        ];
        let trace = run(&mut stages, |engine, stages, x| {
            assert_eq!(engine.headers(stages, x, Response, false), Outcome::Pause);
            assert_eq!(engine.data(stages, x, Response, false), Outcome::Pause);
            assert_eq!(engine.data(stages, x, Response, true), Outcome::Continue);
        });
        assert_eq!(
            trace,
            [
                "usage resp headers",
                "usage resp data end",
                "pii resp headers",
                "pii resp data end",
            ]
        );
    }

    #[test]
    fn a_waiting_stage_holds_everything_until_resumed() {
        let mut stages = vec![
            Scripted::new("router").headers(&[Step::Buffer]),
            Scripted::new("ratelimit").data(&[Step::Wait]),
            Scripted::new("after"),
        ];
        let trace = run(&mut stages, |engine, stages, x| {
            engine.headers(stages, x, Request, false);
            assert_eq!(engine.data(stages, x, Request, true), Outcome::Pause);
            assert!(engine.waiting(Request));
            assert!(!engine.wants_data(Request, true));
            // more host callbacks while the reply is out change nothing
            assert_eq!(engine.data(stages, x, Request, true), Outcome::Pause);
            x.push("--- reply".into());
            assert_eq!(
                engine.resume(stages, x, Request, Step::Continue),
                Outcome::Continue
            );
            assert!(!engine.waiting(Request));
            // a second resume finds nothing waiting
            assert_eq!(
                engine.resume(stages, x, Request, Step::Continue),
                Outcome::Pause
            );
        });
        assert_eq!(
            trace,
            [
                "router req headers",
                "router req data end",
                "ratelimit req headers",
                "ratelimit req data end",
                "--- reply",
                "after req headers",
                "after req data end",
            ]
        );
    }

    #[test]
    fn a_wait_at_a_header_step_and_a_refusal_after_it() {
        let mut stages = vec![
            Scripted::new("a").headers(&[Step::Wait]),
            Scripted::new("b"),
        ];
        let trace = run(&mut stages, |engine, stages, x| {
            assert_eq!(engine.headers(stages, x, Request, true), Outcome::Pause);
            // the reply says no: a local reply went out
            assert_eq!(engine.resume(stages, x, Request, Step::Stop), Outcome::Stop);
            assert!(engine.stopped());
            assert_eq!(engine.data(stages, x, Request, true), Outcome::Stop);
            assert_eq!(
                engine.resume(stages, x, Request, Step::Continue),
                Outcome::Stop
            );
            engine.log(stages, x);
        });
        assert_eq!(trace, ["a req headers end", "a log", "b log"]);
    }

    #[test]
    fn a_stop_ends_every_later_step_but_log() {
        let mut stages = vec![
            Scripted::new("auth").headers(&[Step::Stop]),
            Scripted::new("router"),
        ];
        let trace = run(&mut stages, |engine, stages, x| {
            assert_eq!(engine.headers(stages, x, Request, false), Outcome::Stop);
            assert!(engine.stopped());
            assert!(!engine.wants_data(Request, true));
            assert_eq!(engine.data(stages, x, Request, true), Outcome::Stop);
            // the local reply is the response: every stage sees it
            assert_eq!(engine.headers(stages, x, Response, true), Outcome::Continue);
            engine.log(stages, x);
        });
        assert_eq!(
            trace,
            [
                "auth req headers",
                "router resp headers end",
                "auth resp headers end",
                "auth log",
                "router log"
            ]
        );
    }

    #[test]
    fn a_wait_on_a_streamed_chunk_resumes_with_the_next_stage() {
        let mut stages = vec![Scripted::new("a").data(&[Step::Wait]), Scripted::new("b")];
        let trace = run(&mut stages, |engine, stages, x| {
            engine.headers(stages, x, Request, false);
            assert_eq!(engine.data(stages, x, Request, false), Outcome::Pause);
            assert_eq!(
                engine.resume(stages, x, Request, Step::Continue),
                Outcome::Continue
            );
            assert_eq!(engine.data(stages, x, Request, true), Outcome::Continue);
        });
        assert_eq!(
            trace,
            [
                "a req headers",
                "b req headers",
                "a req data",
                "b req data",
                "a req data end",
                "b req data end",
            ]
        );
    }

    #[test]
    fn a_hold_after_the_body_is_whole_runs_its_data_step_at_once() {
        // the second hold comes after the first one: the body is complete by then
        let mut stages = vec![
            Scripted::new("a").headers(&[Step::Buffer]),
            Scripted::new("b").headers(&[Step::Buffer]),
        ];
        let trace = run(&mut stages, |engine, stages, x| {
            engine.headers(stages, x, Request, false);
            assert_eq!(engine.data(stages, x, Request, true), Outcome::Continue);
        });
        assert_eq!(
            trace,
            [
                "a req headers",
                "a req data end",
                "b req headers",
                "b req data end",
            ]
        );
    }

    #[test]
    fn a_shared_view_keeps_the_headers_it_was_made_from() {
        let mut headers = Headers::new(vec![
            (":path".into(), b"/v1/chat/completions".to_vec()),
            ("accept".into(), b"a".to_vec()),
        ]);
        let head = crate::request::RequestHead::shared(headers.shared());
        headers.set("accept", b"b");
        headers.add("x-llm-consumer", b"team-a");
        headers.remove(":path");
        // the view is what the stage saw; the headers are what the next stage sees
        assert_eq!(head.text("accept"), Some("a"));
        assert_eq!(head.headers().count(), 2);
        assert_eq!(head.path, "/v1/chat/completions");
        assert_eq!(
            headers.pairs(),
            [
                ("accept".to_string(), b"b".to_vec()),
                ("x-llm-consumer".to_string(), b"team-a".to_vec()),
            ]
        );
        // once no view holds them, the same list is edited in place
        drop(head);
        let before = headers.shared();
        let shared_ptr = Rc::as_ptr(&before);
        drop(before);
        headers.set("accept", b"c");
        assert_eq!(Rc::as_ptr(&headers.shared()), shared_ptr);
        assert_eq!(headers.text("accept"), Some("c"));
    }

    #[test]
    fn header_edits_are_seen_at_once_and_written_once_per_header() {
        let mut headers = Headers::new(vec![
            (":path".into(), b"/v1/chat/completions".to_vec()),
            ("x-llm-consumer".into(), b"spoofed".to_vec()),
            ("accept".into(), b"a".to_vec()),
            ("accept".into(), b"b".to_vec()),
        ]);
        headers.remove("x-llm-consumer");
        headers.add("x-llm-consumer", b"team-a");
        headers.set("accept", b"c");
        headers.set("x-llm-model-group", b"fast");
        assert_eq!(headers.text("x-llm-consumer"), Some("team-a"));
        assert_eq!(headers.get("accept"), Some(&b"c"[..]));
        assert_eq!(
            headers
                .pairs()
                .iter()
                .filter(|(n, _)| n == "accept")
                .count(),
            1
        );
        assert_eq!(headers.text("x-llm-model-group"), Some("fast"));
        assert!(headers.edited());
        let edits = headers.take_edits();
        assert_eq!(edits.len(), 3);
        // the remove and the add of one header: one replace (it drops the spoofed value)
        assert_eq!(
            edits.iter().collect::<Vec<_>>(),
            [
                Edit::Set("x-llm-consumer", b"team-a"),
                Edit::Set("accept", b"c"),
                Edit::Set("x-llm-model-group", b"fast"),
            ]
        );
        assert!(!headers.edited());
        // removing what is not there writes nothing
        headers.remove("x-absent");
        assert!(headers.take_edits().is_empty());
        let mut x = Exchange::default();
        x.replace_data(b"new".to_vec());
        assert!(x.data_changed);
        // lent data comes back unless replaced, and an earlier change is not forgotten
        let len = x.with_data(|data, x| {
            assert!(x.data.is_empty());
            data.len()
        });
        assert_eq!(
            (len, x.data.as_slice(), x.data_changed),
            (3, &b"new"[..], true)
        );
        x.data_changed = false;
        x.with_data(|data, x| x.replace_data([data, b"er"].concat()));
        assert_eq!((x.data.as_slice(), x.data_changed), (&b"newer"[..], true));
    }

    /// Applies `edits` to `host` as Envoy does (a replace drops every value, then adds one).
    fn apply(host: &mut Pairs, edits: &Edits) {
        for edit in edits.iter() {
            match edit {
                Edit::Set(name, value) => {
                    host.retain(|(n, _)| n != name);
                    host.push((name.to_string(), value.to_vec()));
                }
                Edit::Add(name, value) => host.push((name.to_string(), value.to_vec())),
                Edit::Remove(name) => host.retain(|(n, _)| n != name),
            }
        }
    }

    /// The values of each header, names sorted (the order of different names does not
    /// matter to HTTP; that of one name's values does).
    fn by_name(pairs: &[(String, Vec<u8>)]) -> Vec<(String, Vec<Vec<u8>>)> {
        let mut names: Vec<&String> = pairs.iter().map(|(n, _)| n).collect();
        names.sort();
        names.dedup();
        names
            .into_iter()
            .map(|n| (n.clone(), values(pairs, n).map(<[u8]>::to_vec).collect()))
            .collect()
    }

    #[test]
    fn each_header_is_written_once_last_value_wins() {
        let host: Pairs = vec![
            (":path".into(), b"/v1/chat/completions".to_vec()),
            ("content-length".into(), b"12".to_vec()),
            ("accept".into(), b"a".to_vec()),
            ("x-forwarded-for".into(), b"10.0.0.1".to_vec()),
        ];
        let mut headers = Headers::new(host.clone());
        // two stages set the same header: the last value is written, once
        headers.set("x-llm-deployment", b"first");
        headers.set("x-llm-deployment", b"second");
        // a value it has already: nothing to write
        headers.set("content-length", b"12");
        // added, then removed: one remove
        headers.add("x-llm-tenant", b"acme");
        headers.remove("x-llm-tenant");
        // a value added to the host's: only the add
        headers.add("x-forwarded-for", b"10.0.0.2");
        // removed after a set: the remove
        headers.set("accept", b"b");
        headers.remove("accept");
        let edits = headers.take_edits();
        assert_eq!(
            edits.iter().collect::<Vec<_>>(),
            [
                Edit::Set("x-llm-deployment", b"second"),
                Edit::Remove("x-llm-tenant"),
                Edit::Add("x-forwarded-for", b"10.0.0.2"),
                Edit::Remove("accept"),
            ]
        );
        let mut written = host;
        apply(&mut written, &edits);
        assert_eq!(by_name(&written), by_name(headers.pairs()));
        // later edits are written against what was written
        headers.set("x-llm-deployment", b"second");
        assert!(!headers.edited());
        headers.set("x-forwarded-for", b"10.0.0.3");
        assert_eq!(
            headers.take_edits().iter().collect::<Vec<_>>(),
            [Edit::Set("x-forwarded-for", b"10.0.0.3")]
        );
    }

    #[test]
    fn a_replaced_list_of_values_is_a_set_and_adds() {
        let mut headers = Headers::new(vec![
            ("via".into(), b"a".to_vec()),
            ("via".into(), b"b".to_vec()),
        ]);
        headers.set("via", b"c");
        headers.add("via", b"d");
        assert_eq!(
            headers.take_edits().iter().collect::<Vec<_>>(),
            [Edit::Set("via", b"c"), Edit::Add("via", b"d")]
        );
    }

    /// Random edit sequences: the host, given the writes, holds what the stages see
    /// (native only: proptest is not built for the wasm32 test run).
    #[cfg(not(target_arch = "wasm32"))]
    #[test]
    fn the_writes_bring_the_host_to_what_the_stages_see() {
        use proptest::prelude::*;
        let name = prop::sample::select(vec!["a", "b", "c", "content-length"]);
        let value = prop::sample::select(vec![&b"1"[..], b"2", b"3"]);
        let op = (0u8..3, name, value.clone());
        let start = prop::collection::vec((prop::sample::select(vec!["a", "b", "x"]), value), 0..5);
        proptest!(|(start in start, ops in prop::collection::vec(op, 0..12), split in 0usize..12)| {
            let host: Pairs = start.iter().map(|(n, v)| (n.to_string(), v.to_vec())).collect();
            let mut headers = Headers::new(host.clone());
            let mut written = host;
            for (i, (kind, name, value)) in ops.iter().enumerate() {
                if i == split {
                    let edits = headers.take_edits();
                    apply(&mut written, &edits);
                }
                match kind {
                    0 => headers.set(name, value),
                    1 => headers.add(name, value),
                    _ => headers.remove(name),
                }
            }
            let edits = headers.take_edits();
            apply(&mut written, &edits);
            prop_assert_eq!(by_name(&written), by_name(headers.pairs()));
            prop_assert!(!headers.edited());
        });
    }

    #[test]
    fn one_map_write_is_chosen_from_about_eight_writes_on_twenty_headers() {
        let mut edits = Edits::default();
        for _ in 0..7 {
            edits.push(EditKind::Set, "x-llm-a", b"1");
        }
        assert!(!edits.cheaper_as_one_map(20));
        edits.push(EditKind::Remove, "x-llm-c", b"");
        assert!(edits.cheaper_as_one_map(20));
        // a map of many headers costs more to replace
        assert!(!edits.cheaper_as_one_map(60));
        assert!(!Edits::default().cheaper_as_one_map(0));
    }

    #[test]
    fn code_details_are_read_once_per_callback() {
        let mut x = Exchange::default();
        let reads = std::cell::Cell::new(0);
        let read = || {
            reads.set(reads.get() + 1);
            Some(format!("via_upstream{}", reads.get()))
        };
        assert_eq!(x.code_details(read), Some("via_upstream1"));
        assert_eq!(x.code_details(read), Some("via_upstream1"));
        assert_eq!(reads.get(), 1);
        x.next_callback();
        assert_eq!(x.code_details(read), Some("via_upstream2"));
        assert_eq!(reads.get(), 2);
        x.next_callback();
        assert_eq!(x.code_details(|| None), None);
    }

    #[test]
    fn the_clock_is_read_once_per_callback() {
        let mut x = Exchange::default();
        let reads = std::cell::Cell::new(0u64);
        let read = || -> u64 {
            reads.set(reads.get() + 1);
            1_000 * reads.get()
        };
        assert_eq!(x.clock(read), 1_000);
        assert_eq!(x.clock(read), 1_000);
        assert_eq!(reads.get(), 1);
        x.next_callback();
        assert_eq!(x.clock(read), 2_000);
        assert_eq!(reads.get(), 2);
    }

    #[test]
    fn published_filter_state_is_the_last_value_written() {
        let mut x = Exchange::default();
        assert_eq!(x.published("llm_route"), None);
        x.publish("llm_route", b"{\"a\":1}");
        x.publish("llm_usage", b"u");
        x.publish("llm_route", b"{}");
        assert_eq!(x.published("llm_route"), Some(&b"{}"[..]));
        assert_eq!(x.published("llm_usage"), Some(&b"u"[..]));
        assert_eq!(x.published("llm_attempt"), None);
    }
}
