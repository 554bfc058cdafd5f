//! The request side: which strings of a body are message text, and the rewritten body.
//!
//! In `messages` scope a JSON body is walked once; a string is scanned when it sits under a
//! top-level `messages`, `system`, `input`, `instructions` or `prompt`, has a text-bearing
//! member on its path (`content`, `text`, `arguments`, `input`, `output`, `system`,
//! `instructions`, `prompt`, `refusal`), is not itself a metadata member (`role`, `type`,
//! `id`, `name`, …), and is not inside an image, audio or file part or an opaque or signed
//! blob (`encrypted_content`, a `thinking` block, `redacted_thinking` data). Below a tool's
//! data (`tool_use.input`, `arguments` sent as an object, a Responses `prompt.variables`)
//! every string is the tool's or the user's, whatever its member is called (`name`, `id`,
//! `type`, `source`): only binary parts are left alone there. A chat message's own `name`
//! (the participant's) is scanned too; a tool's or function's `name` is not. That covers
//! Chat Completions (string content, text parts, refusals, tool call arguments and results,
//! the legacy `prompt`), the Responses API `input` (string or items: messages, function and
//! custom tool calls and their outputs, reasoning summaries) and Anthropic Messages
//! (`system` string or blocks, text and document blocks, `tool_use.input` at any depth,
//! `tool_result` content string or blocks). Only the changed strings are re-encoded, so the
//! JSON stays valid and everything else keeps its bytes.
//!
//! After an internal redirect the request re-enters the chain ([`redact_pass`]): it starts
//! from the superseded pass's [`Carried`] map, so the same values get the same placeholders.
//! The host re-sends either the body that pass forwarded (upstream Envoy: already masked,
//! preamble included) or the client's original (Higress). In `messages` scope the two are
//! told apart by a fingerprint of the message texts: the forwarded body passes unchanged,
//! the original is masked exactly as the first time (preamble included, once).

use crate::config::{BodyScope, PiiConfig};
use crate::mask::{Blocked, PlaceholderMap};
use llm_gateway_shared::fxhash;
use llm_gateway_shared::json::{self, Scalar, Seg};
use llm_gateway_shared::request::Api;
use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;
use std::ops::Range;

const TOP: &[&str] = &["messages", "system", "input", "instructions", "prompt"];
const TEXT: &[&str] = &[
    "content",
    "text",
    "arguments",
    "input",
    "output",
    "system",
    "instructions",
    "prompt",
    "refusal",
];
/// Members below which every string is data (a tool's input, a prompt template's variables):
/// scanned whatever the inner members are called.
const PAYLOAD: &[&str] = &["input", "arguments", "variables"];
const META: &[&str] = &[
    "type",
    "role",
    "id",
    "name",
    "tool_call_id",
    "tool_use_id",
    "call_id",
    "model",
    "status",
    "detail",
    "media_type",
    "format",
    "url",
    "signature",
];
/// Binary parts and opaque blobs, never scanned (a mask would corrupt them).
const BINARY: &[&str] = &[
    "image_url",
    "input_image",
    "file_data",
    "input_audio",
    "image_file",
    "encrypted_content",
];
/// Message structure that is not text, or text that must come back as it was sent: media
/// parts, `cache_control`, a signed `thinking` block, `redacted_thinking` data.
const SKIP: &[&str] = &[
    "image",
    "source",
    "file",
    "audio",
    "cache_control",
    "thinking",
    "data",
];

/// What became of a request body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redaction {
    /// Nothing to change.
    Unchanged,
    /// The body to forward instead.
    Rewritten(Vec<u8>),
    /// A `block` rule matched.
    Blocked(Blocked),
    /// `messages` scope and the body is not JSON: it cannot be scanned, so it is refused.
    Invalid(json::JsonError),
}

/// True if a string at `path` is message text (see the module doc).
pub fn is_message_text(path: &[Seg]) -> bool {
    let Some(top) = path.first().and_then(Seg::key) else {
        return false;
    };
    if !TOP.contains(&top) {
        return false;
    }
    // a chat message's participant name (a tool's or function's `name` sits deeper)
    if let [Seg::Key(messages), Seg::Index(_), Seg::Key(name)] = path {
        if messages == "messages" && name == "name" {
            return true;
        }
    }
    let mut text = false;
    let mut payload = false;
    for (depth, seg) in path.iter().enumerate() {
        if let Some(key) = seg.key() {
            if BINARY.contains(&key) || (!payload && SKIP.contains(&key)) {
                return false;
            }
            text |= TEXT.contains(&key);
            // the top-level `input` is the Responses input, not a tool's
            payload |= depth > 0 && PAYLOAD.contains(&key);
        }
    }
    if payload {
        return true;
    }
    let own = path.iter().rev().find_map(Seg::key).unwrap_or_default();
    // an array element's own key is its array's: `content: ["a", "b"]` is text
    let own_is_meta = matches!(path.last(), Some(Seg::Key(_))) && META.contains(&own);
    text && !own_is_meta
}

/// Redacts a request body under `config`, recording placeholders in `map`. `api`: the
/// request's ([`Api::from_path`]; `None` for any other path), which decides where a preamble
/// goes.
pub fn redact_body(
    config: &PiiConfig,
    api: Option<Api>,
    body: &[u8],
    map: &mut PlaceholderMap,
) -> Redaction {
    redact_pass(config, api, body, map, None).0
}

/// What a pass superseded by an internal redirect leaves for the pass that re-enters.
#[derive(Debug, Clone, Default)]
pub struct Carried {
    /// Its placeholders and their originals.
    pub map: PlaceholderMap,
    /// [`fingerprint`] of the message texts it forwarded (`messages` scope).
    pub forwarded: Option<u64>,
}

/// Redacts one pass's request body. `carried`: the fingerprint the superseded pass forwarded,
/// when this pass re-enters (`map` then holds that pass's map). Returns the redaction and the
/// fingerprint of what this pass forwards (`None` outside `messages` scope, when nothing is
/// forwarded, or when the config watches for no re-entry, `reentry: false`, and nothing is
/// carried: no fingerprint is taken then).
///
/// A re-entering body whose message texts are exactly what the superseded pass forwarded
/// is that pass's own output: it passes unchanged and `map` stays as carried. Any other body
/// is redacted with the carried map, which gives the first pass's text for the client's
/// original body. In `raw_body` scope no fingerprint is kept: the carried map
/// ([`PlaceholderMap::carried_over`]) leaves its own placeholders alone instead.
pub fn redact_pass(
    config: &PiiConfig,
    api: Option<Api>,
    body: &[u8],
    map: &mut PlaceholderMap,
    carried: Option<u64>,
) -> (Redaction, Option<u64>) {
    if body.is_empty() {
        return (Redaction::Unchanged, None);
    }
    let (result, forwarded) = match config.scope {
        BodyScope::RawBody => (redact_raw(config, body, map), None),
        BodyScope::Messages => {
            let before = carried.map(|_| map.clone());
            // without re-entry (and nothing carried) no pass asks for a fingerprint
            let prints = config.reentry || carried.is_some();
            let (result, incoming, forwarded) = redact_messages(config, api, body, map, prints);
            if let (Some(carried), Some(incoming), Some(before)) = (carried, incoming, before) {
                if carried == incoming {
                    *map = before;
                    return (Redaction::Unchanged, Some(incoming));
                }
            }
            (result, forwarded)
        }
    };
    let redaction = match result {
        Ok(Some(new)) => Redaction::Rewritten(new),
        Ok(None) => Redaction::Unchanged,
        Err(outcome) => outcome,
    };
    (redaction, forwarded)
}

/// A fingerprint of a body's message texts (see [`is_message_text`]), each with its path,
/// whatever the order of members (a host may re-serialise the body); `None` if the body is
/// not JSON. Edits of other members (the model, `max_tokens`, `stream_options`, made by other
/// filters) leave it alone. The path matters: a client whose messages are placeholder-like
/// literals (`[EMAIL_2]`, `[EMAIL_1]`) has them renumbered in the forwarded body, the same
/// texts in other messages, so texts alone would take the original for the forwarded body.
pub fn fingerprint(body: &[u8]) -> Option<u64> {
    let mut sum = Fingerprint::default();
    json::walk(body, &json::Limits::default(), &mut |path, kind, span| {
        if kind == Scalar::String && is_message_text(path) {
            let text = body.get(span).and_then(json::decode_lossy);
            sum.add(path, text.as_deref());
        }
    })
    .ok()?;
    Some(sum.finish())
}

/// The hash of one (path, text) pair of a [`Fingerprint`]: `path` with its `messages`
/// position moved by `shift` (the place of a message put in front), `text` a [`text_hash`].
fn item_hash(path: &[Seg], shift: usize, text: Option<u64>) -> u64 {
    let mut hasher = DefaultHasher::new();
    let shifted = matches!(path.first(), Some(Seg::Key(k)) if k == "messages");
    for (depth, seg) in path.iter().enumerate() {
        match seg {
            Seg::Key(k) => {
                hasher.write_u8(2);
                hasher.write_usize(k.len());
                hasher.write(k.as_bytes());
            }
            Seg::Index(i) => {
                hasher.write_u8(3);
                let by = if shifted && depth == 1 { shift } else { 0 };
                hasher.write_usize(i.wrapping_add(by));
            }
        }
    }
    match text {
        Some(text) => {
            hasher.write_u8(1);
            hasher.write_u64(text);
        }
        None => hasher.write_u8(0),
    }
    hasher.finish()
}

/// A message text's own hash: hashed once, it serves the incoming body's fingerprint and the
/// forwarded body's. FxHash (eight bytes per step; SipHash over the texts was a tenth of a
/// request's redaction); [`item_hash`] mixes it with SipHash. Nothing needs it to resist a
/// chosen collision: it tells a re-entering pass's body (the one Envoy re-sends) from the one
/// the superseded pass forwarded, neither of which the client can pick apart from the other.
fn text_hash(text: &str) -> u64 {
    fxhash::hash_bytes(text.as_bytes())
}

/// The set of a body's (path, message text) pairs, hashed: each pair's SipHash (fixed keys),
/// summed, so the order the members come in does not matter.
#[derive(Debug, Default)]
struct Fingerprint {
    sum: u64,
    count: u64,
}

impl Fingerprint {
    fn add(&mut self, path: &[Seg], text: Option<&str>) {
        self.add_hashed(path, 0, text.map(text_hash));
    }

    /// Adds the pair of `path` (its `messages` position moved by `shift`, the place of a
    /// message put in front) and the text whose [`text_hash`] is `text`.
    fn add_hashed(&mut self, path: &[Seg], shift: usize, text: Option<u64>) {
        self.add_item(item_hash(path, shift, text));
    }

    /// Adds a pair hashed with [`item_hash`].
    fn add_item(&mut self, item: u64) {
        self.sum = self.sum.wrapping_add(item);
        self.count = self.count.wrapping_add(1);
    }

    /// This set with the pair hashed `old` replaced by the pair hashed `new`.
    fn replace(&mut self, old: u64, new: u64) {
        self.sum = self.sum.wrapping_sub(old).wrapping_add(new);
    }

    fn finish(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        hasher.write_u64(self.sum);
        hasher.write_u64(self.count);
        hasher.finish()
    }
}

fn redact_raw(
    config: &PiiConfig,
    body: &[u8],
    map: &mut PlaceholderMap,
) -> Result<Option<Vec<u8>>, Redaction> {
    // Not UTF-8 (a binary upload): nothing a text detector could read.
    let Ok(text) = std::str::from_utf8(body) else {
        return Ok(None);
    };
    match config.redactor.redact(text, map) {
        Ok(new) => Ok(new.map(String::into_bytes)),
        Err(blocked) => Err(Redaction::Blocked(blocked)),
    }
}

/// A body's new bytes (`None`: unchanged), or why it is not forwarded as is.
type Rewrite = Result<Option<Vec<u8>>, Redaction>;

/// The redaction of a JSON body, the [`fingerprint`] of its incoming message texts and that
/// of the body it forwards (`None` when nothing is forwarded); with `prints` false neither
/// fingerprint is taken (both `None`).
fn redact_messages(
    config: &PiiConfig,
    api: Option<Api>,
    body: &[u8],
    map: &mut PlaceholderMap,
    prints: bool,
) -> (Rewrite, Option<u64>, Option<u64>) {
    if !prints {
        return (
            redact_messages_into(config, api, body, map, None),
            None,
            None,
        );
    }
    let mut prints = Prints::default();
    let result = redact_messages_into(config, api, body, map, Some(&mut prints));
    let incoming = match &result {
        Err(Redaction::Invalid(_)) => None,
        _ => Some(prints.incoming.finish()),
    };
    let forwarded = match &result {
        Ok(Some(new)) => prints
            .forwarded(config.preamble.as_deref().unwrap_or_default())
            .or_else(|| fingerprint(new)),
        Ok(None) => incoming,
        Err(_) => None,
    };
    (result, incoming, forwarded)
}

/// The fingerprints one redaction walk collects. Masking replaces strings in place, so the
/// forwarded body has the same paths with the masked texts: its fingerprint is summed during
/// the walk instead of walking the forwarded body again. A chat preamble is a message put in
/// front: every message moves one place, summed beside (`behind`). Any other preamble (it
/// adds a member or changes a text) has the forwarded body walked again.
#[derive(Debug, Default)]
struct Prints {
    incoming: Fingerprint,
    /// The masked pairs: minus each incoming pair, plus its forwarded one (`sum` only).
    replaced: Fingerprint,
    behind: Fingerprint,
    /// How the forwarded body differs from the incoming one beyond its masked texts.
    reshaped: Reshaped,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Reshaped {
    #[default]
    No,
    /// A chat preamble message put in front of the messages.
    MessageInFront,
    /// Any other preamble.
    Otherwise,
}

impl Prints {
    /// Notes a message text at `path`: `text` as it came, `masked` what is forwarded instead.
    /// The forwarded set is the incoming one with the masked pairs replaced: only those are
    /// hashed again (and, with a chat preamble, every pair at its moved place).
    fn add(&mut self, path: &[Seg], text: u64, masked: Option<&str>, in_front: bool) {
        let came = item_hash(path, 0, Some(text));
        self.incoming.add_item(came);
        let out = masked.map_or(text, text_hash);
        if masked.is_some() {
            self.replaced.replace(came, item_hash(path, 0, Some(out)));
        }
        if in_front {
            self.behind.add_hashed(path, 1, Some(out));
        }
    }

    /// The forwarded body's fingerprint, if the walk could sum it.
    fn forwarded(mut self, preamble: &str) -> Option<u64> {
        match self.reshaped {
            Reshaped::No => {
                let mut outgoing = self.incoming;
                outgoing.replace(0, self.replaced.sum);
                Some(outgoing.finish())
            }
            Reshaped::MessageInFront => {
                // the texts of `{"role":"system","content":preamble}` at position 0
                for (key, text) in [("role", "system"), ("content", preamble)] {
                    let path = [
                        Seg::Key("messages".into()),
                        Seg::Index(0),
                        Seg::Key(key.into()),
                    ];
                    if is_message_text(&path) {
                        self.behind.add(&path, Some(text));
                    }
                }
                Some(self.behind.finish())
            }
            Reshaped::Otherwise => None,
        }
    }
}

fn redact_messages_into(
    config: &PiiConfig,
    api: Option<Api>,
    body: &[u8],
    map: &mut PlaceholderMap,
    mut prints: Option<&mut Prints>,
) -> Result<Option<Vec<u8>>, Redaction> {
    let mut edits: Vec<(Range<usize>, Vec<u8>)> = Vec::new();
    let mut blocked: Option<Blocked> = None;
    let mut anchors = Anchors::default();
    // fail closed: text that cannot be decoded cannot be scanned, so it is not forwarded
    let mut undecodable: Option<usize> = None;
    // a chat preamble goes in as the first message (see [`Anchors::preamble_edit`])
    let in_front = api == Some(Api::ChatCompletions) && config.preamble.is_some();
    json::walk(body, &json::Limits::default(), &mut |path, kind, span| {
        anchors.note(path, kind, &span, body);
        if kind != Scalar::String || !is_message_text(path) {
            return;
        }
        let Some(text) = body.get(span.clone()).and_then(json::decode_lossy) else {
            if let Some(prints) = prints.as_deref_mut() {
                prints.incoming.add(path, None);
            }
            undecodable = Some(span.start);
            return;
        };
        let hash = prints.is_some().then(|| text_hash(&text));
        let came = |prints: &mut Option<&mut Prints>| {
            if let (Some(prints), Some(hash)) = (prints.as_deref_mut(), hash) {
                prints.incoming.add_hashed(path, 0, Some(hash));
            }
        };
        if blocked.is_some() {
            came(&mut prints);
            return;
        }
        match config.redactor.redact(&text, map) {
            Ok(masked) => {
                if let (Some(prints), Some(hash)) = (prints.as_deref_mut(), hash) {
                    prints.add(path, hash, masked.as_deref(), in_front);
                }
                if let Some(new) = masked {
                    edits.push((span, json::quote(&new).into_bytes()));
                }
            }
            Err(b) => {
                came(&mut prints);
                blocked = Some(b);
            }
        }
    })
    .map_err(Redaction::Invalid)?;
    if let Some(at) = undecodable {
        return Err(Redaction::Invalid(json::JsonError {
            at,
            reason: "a string that cannot be decoded",
        }));
    }
    if let Some(b) = blocked {
        return Err(Redaction::Blocked(b));
    }
    if edits.is_empty() {
        return Ok(None);
    }
    if let Some(preamble) = &config.preamble {
        if let Some((span, new)) = anchors.preamble_edit(api, body, preamble) {
            if let Some(prints) = prints {
                prints.reshaped = if in_front {
                    Reshaped::MessageInFront
                } else {
                    Reshaped::Otherwise
                };
            }
            // A string the preamble goes in front of may itself be masked: one edit of both
            // (two edits of one span would drop the second, the preamble).
            match edits.iter_mut().find(|(s, _)| *s == span) {
                Some((_, masked)) => {
                    let text = json::decode_lossy(masked).unwrap_or_default();
                    *masked = json::quote(&format!("{preamble}\n\n{text}")).into_bytes();
                }
                None => {
                    edits.push((span, new));
                    edits.sort_by_key(|(span, _)| span.start);
                }
            }
        }
    }
    Ok(Some(json::splice(body, &edits)))
}

/// Where a preamble can be inserted: positions noted during the walk.
#[derive(Debug, Default)]
struct Anchors {
    /// The `{` of the document.
    root: Option<usize>,
    /// The `[` of top-level `messages`, if it is an array.
    messages: Option<usize>,
    /// Top-level `system` / `instructions`, whatever their type.
    system: Option<Slot>,
    instructions: Option<Slot>,
}

/// A top-level member a preamble may go into.
#[derive(Debug)]
enum Slot {
    /// A string: its span, quotes included.
    String(Range<usize>),
    /// An array: the offset of its `[`.
    Array(usize),
    /// Any other type (the API's own error): the preamble cannot go in, nor beside it.
    Other,
}

impl Anchors {
    fn note(&mut self, path: &[Seg], kind: Scalar, span: &Range<usize>, body: &[u8]) {
        let slot = || match kind {
            Scalar::String => Slot::String(span.clone()),
            Scalar::Open if body.get(span.start) == Some(&b'[') => Slot::Array(span.start),
            _ => Slot::Other,
        };
        match path {
            [] if kind == Scalar::Open => self.root = Some(span.start),
            // an object (or any other type) is no list to prepend a message to
            [Seg::Key(k)] if k == "messages" => {
                self.messages = match slot() {
                    Slot::Array(at) => Some(at),
                    _ => None,
                }
            }
            [Seg::Key(k)] if k == "system" => self.system = Some(slot()),
            [Seg::Key(k)] if k == "instructions" => self.instructions = Some(slot()),
            _ => {}
        }
    }

    fn preamble_edit(
        &self,
        api: Option<Api>,
        body: &[u8],
        preamble: &str,
    ) -> Option<(Range<usize>, Vec<u8>)> {
        let root = self.root?;
        let member = |key: &str| {
            let mut v = Vec::new();
            json::push_quoted(&mut v, key);
            v.push(b':');
            json::push_quoted(&mut v, preamble);
            v.push(b',');
            (root + 1..root + 1, v)
        };
        // an existing string: the preamble goes first, then a blank line
        let prefix = |span: &Range<usize>| {
            let old = body.get(span.clone()).and_then(json::decode_lossy)?;
            Some((
                span.clone(),
                json::quote(&format!("{preamble}\n\n{old}")).into_bytes(),
            ))
        };
        match api {
            Some(Api::ChatCompletions) => {
                let at = self.messages? + 1;
                let mut v = b"{\"role\":\"system\",\"content\":".to_vec();
                json::push_quoted(&mut v, preamble);
                v.push(b'}');
                // a comma unless the array is empty
                let empty = body
                    .get(at..)?
                    .iter()
                    .find(|c| !c.is_ascii_whitespace())
                    .is_some_and(|&c| c == b']');
                if !empty {
                    v.push(b',');
                }
                Some((at..at, v))
            }
            Some(Api::AnthropicMessages) => match &self.system {
                None => Some(member("system")),
                Some(Slot::String(span)) => prefix(span),
                Some(Slot::Array(open)) => {
                    let at = open + 1;
                    let mut v = b"{\"type\":\"text\",\"text\":".to_vec();
                    json::push_quoted(&mut v, preamble);
                    v.extend_from_slice(b"},");
                    let empty = body
                        .get(at..)?
                        .iter()
                        .find(|c| !c.is_ascii_whitespace())
                        .is_some_and(|&c| c == b']');
                    if empty {
                        v.pop();
                    }
                    Some((at..at, v))
                }
                Some(Slot::Other) => None,
            },
            Some(Api::Responses) => match &self.instructions {
                None => Some(member("instructions")),
                Some(Slot::String(span)) => prefix(span),
                Some(_) => None,
            },
            Some(Api::Embeddings) | None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_document;
    use serde_json::{json, Value};

    fn config(doc: &str) -> std::rc::Rc<PiiConfig> {
        parse_document(doc.as_bytes())
            .unwrap()
            .global()
            .cloned()
            .unwrap()
    }

    fn run(doc: &str, api: Option<Api>, body: &Value) -> (Redaction, PlaceholderMap) {
        let mut map = PlaceholderMap::default();
        let bytes = serde_json::to_vec(body).unwrap();
        (redact_body(&config(doc), api, &bytes, &mut map), map)
    }

    fn rewritten(r: Redaction) -> Value {
        match r {
            Redaction::Rewritten(b) => serde_json::from_slice(&b).expect("valid JSON"),
            other => panic!("not rewritten: {other:?}"),
        }
    }

    #[test]
    fn chat_completions_text_and_tool_arguments() {
        let body = json!({
            "model": "fast",
            "messages": [
                {"role": "system", "content": "support for a@x.com"},
                {"role": "user", "name": "a@x.com", "content": [
                    {"type": "text", "text": "call 13800138000, mail a@x.com"},
                    {"type": "image_url", "image_url": {"url": "https://h/a@x.com.png"}}
                ]},
                {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "send", "arguments": "{\"to\":\"b@y.org\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sent to b@y.org"}
            ],
            "user": "a@x.com"
        });
        let (r, map) = run("{}", Some(Api::ChatCompletions), &body);
        let out = rewritten(r);
        let m = &out["messages"];
        assert_eq!(m[0]["content"], "support for [EMAIL_1]");
        assert_eq!(m[1]["name"], "[EMAIL_1]"); // the participant's name
        assert_eq!(m[1]["content"][0]["text"], "call [PHONE_1], mail [EMAIL_1]");
        assert_eq!(m[1]["content"][1], body["messages"][1]["content"][1]);
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            "{\"to\":\"[EMAIL_2]\"}"
        );
        assert_eq!(m[3]["content"], "sent to [EMAIL_2]");
        assert_eq!(out["user"], "a@x.com"); // not message text
        assert_eq!(map.total(), 6);
    }

    #[test]
    fn responses_and_anthropic() {
        let body = json!({"model": "m", "instructions": "from a@x.com",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "a@x.com"},
                {"type": "input_image", "image_url": "data:image/png;base64,a@x.com"}]},
                {"type": "function_call_output", "call_id": "c", "output": "10.0.0.1"}]});
        let out = rewritten(run("{}", Some(Api::Responses), &body).0);
        assert_eq!(out["instructions"], "from [EMAIL_1]"); // same value, same placeholder
        assert_eq!(out["input"][0]["content"][0]["text"], "[EMAIL_1]");
        assert_eq!(
            out["input"][0]["content"][1],
            body["input"][0]["content"][1]
        );
        assert_eq!(out["input"][1]["output"], "[IP_1]");

        let body = json!({"model": "m", "input": "ip 10.0.0.1"});
        assert_eq!(
            rewritten(run("{}", Some(Api::Responses), &body).0)["input"],
            "ip [IP_1]"
        );

        let body = json!({"model": "m", "system": [{"type": "text", "text": "a@x.com",
            "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "a@x.com"}},
                {"type": "tool_use", "id": "t", "name": "lookup", "input": {"email": "b@y.org"}},
                {"type": "tool_result", "tool_use_id": "t", "content": "b@y.org ok"}]}]});
        let out = rewritten(run("{}", Some(Api::AnthropicMessages), &body).0);
        // serde_json writes keys sorted: messages come before system
        assert_eq!(out["system"][0]["text"], "[EMAIL_2]");
        let c = &out["messages"][0]["content"];
        assert_eq!(c[0], body["messages"][0]["content"][0]);
        assert_eq!(c[1]["input"]["email"], "[EMAIL_1]");
        assert_eq!(c[2]["content"], "[EMAIL_1] ok");
    }

    /// Every text field a provider reads, per API: `(JSON pointer, masked?)`. Each text holds
    /// an e-mail; a field that must stay as sent (a tool name, an id, a type, a signed or
    /// opaque blob) holds one too and must come back byte for byte.
    fn assert_fields(api: Option<Api>, body: &Value, fields: &[(&str, bool)]) {
        let out = rewritten(run("{}", api, body).0);
        let mut wrong = Vec::new();
        for (pointer, masked) in fields {
            let before = body.pointer(pointer).unwrap_or_else(|| panic!("{pointer}"));
            let after = out.pointer(pointer).unwrap_or_else(|| panic!("{pointer}"));
            let text = after
                .as_str()
                .unwrap_or_else(|| panic!("{pointer}: {after}"));
            let ok = if *masked {
                !text.contains('@') && text.contains("[EMAIL_")
            } else {
                before == after
            };
            if !ok {
                wrong.push(format!("{pointer} (masked expected: {masked}): {text}"));
            }
        }
        assert!(wrong.is_empty(), "{api:?}:\n{}", wrong.join("\n"));
    }

    #[test]
    fn chat_every_text_field_is_scanned() {
        let body = json!({"model": "m", "messages": [
            {"role": "developer", "content": "dev a@x.com"},
            {"role": "user", "name": "carol@example.net", "content": [
                {"type": "text", "text": "hi from a@x.com"}]},
            {"role": "assistant", "refusal": "not for a@x.com", "content": null,
                "tool_calls": [{"id": "call_a@x.com", "type": "function",
                    "function": {"name": "send_a@x.com", "arguments": "{\"to\":\"b@y.org\"}"}},
                    {"id": "c2", "type": "custom", "custom": {"name": "t", "input": "b@y.org"}}],
                "function_call": {"name": "f", "arguments": "{\"cc\":\"c@z.net\"}"}},
            {"role": "tool", "tool_call_id": "call_a@x.com", "content": [
                {"type": "text", "text": "sent to b@y.org"}]},
            {"role": "function", "name": "lookup", "content": "c@z.net"}]});
        assert_fields(
            Some(Api::ChatCompletions),
            &body,
            &[
                ("/messages/0/content", true),
                ("/messages/1/name", true),
                ("/messages/1/content/0/text", true),
                ("/messages/2/refusal", true),
                ("/messages/2/tool_calls/0/id", false),
                ("/messages/2/tool_calls/0/function/name", false),
                ("/messages/2/tool_calls/0/function/arguments", true),
                ("/messages/2/tool_calls/1/custom/input", true),
                ("/messages/2/function_call/arguments", true),
                ("/messages/3/tool_call_id", false),
                ("/messages/3/content/0/text", true),
                ("/messages/4/content", true),
                ("/model", false),
            ],
        );
        // the legacy completions `prompt`, a string or a list of them
        let body = json!({"model": "m", "prompt": ["a@x.com", "b@y.org"]});
        assert_fields(None, &body, &[("/prompt/0", true), ("/prompt/1", true)]);
    }

    #[test]
    fn responses_every_input_item_is_scanned() {
        let body = json!({"model": "m", "instructions": "from a@x.com",
            "prompt": {"id": "pmpt_1", "variables": {"name": "carol@example.net",
                "city": "a@x.com"}},
            "input": [
                {"type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "a@x.com"},
                    {"type": "input_file", "filename": "f", "file_data": "a@x.com"}]},
                {"type": "message", "role": "assistant", "id": "msg_a@x.com", "content": [
                    {"type": "output_text", "text": "b@y.org", "annotations": []}]},
                {"type": "function_call", "call_id": "call_a@x.com", "name": "send_a@x.com",
                    "arguments": "{\"to\":\"b@y.org\"}"},
                {"type": "function_call_output", "call_id": "call_a@x.com",
                    "output": "sent to b@y.org"},
                {"type": "function_call_output", "call_id": "c2", "output": [
                    {"type": "input_text", "text": "c@z.net"}]},
                {"type": "custom_tool_call", "call_id": "c3", "name": "t", "input": "c@z.net"},
                {"type": "reasoning", "id": "rs_1", "encrypted_content": "gAAAAa@x.com",
                    "summary": [{"type": "summary_text", "text": "user is a@x.com"}]}]});
        assert_fields(
            Some(Api::Responses),
            &body,
            &[
                ("/instructions", true),
                ("/prompt/id", false),
                ("/prompt/variables/name", true),
                ("/prompt/variables/city", true),
                ("/input/0/content/0/text", true),
                ("/input/0/content/1/file_data", false),
                ("/input/1/id", false),
                ("/input/1/content/0/text", true),
                ("/input/2/call_id", false),
                ("/input/2/name", false),
                ("/input/2/arguments", true),
                ("/input/3/output", true),
                ("/input/4/output/0/text", true),
                ("/input/5/input", true),
                ("/input/6/encrypted_content", false),
                ("/input/6/summary/0/text", true),
            ],
        );
    }

    #[test]
    fn anthropic_every_block_is_scanned() {
        let body = json!({"model": "m",
            "system": [{"type": "text", "text": "for a@x.com"}],
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "a@x.com"},
                    {"type": "document", "title": "letter to a@x.com", "context": "b@y.org",
                        "source": {"type": "base64", "media_type": "application/pdf",
                            "data": "a@x.com"}}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "a@x.com", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "EmwKAa@x.com"},
                    {"type": "tool_use", "id": "toolu_a@x.com", "name": "send_a@x.com",
                        "input": {"name": "carol@example.net", "type": "b@y.org",
                            "id": "c@z.net", "source": "e@v.io",
                            "to": {"list": [{"email": "d@w.io"}]}}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_a@x.com",
                        "content": "sent to b@y.org"},
                    {"type": "tool_result", "tool_use_id": "t2", "content": [
                        {"type": "text", "text": "c@z.net"},
                        {"type": "search_result", "source": "https://a@x.com",
                            "title": "d@w.io", "content": [{"type": "text", "text": "d@w.io"}]}]}]}]});
        assert_fields(
            Some(Api::AnthropicMessages),
            &body,
            &[
                ("/system/0/text", true),
                ("/messages/0/content/0/text", true),
                ("/messages/0/content/1/title", true),
                ("/messages/0/content/1/context", true),
                ("/messages/0/content/1/source/data", false),
                // a signed thinking block is sent back as it was received
                ("/messages/1/content/0/thinking", false),
                ("/messages/1/content/1/data", false),
                ("/messages/1/content/2/id", false),
                ("/messages/1/content/2/name", false),
                ("/messages/1/content/2/input/name", true),
                ("/messages/1/content/2/input/type", true),
                ("/messages/1/content/2/input/id", true),
                ("/messages/1/content/2/input/source", true),
                ("/messages/1/content/2/input/to/list/0/email", true),
                ("/messages/2/content/0/tool_use_id", false),
                ("/messages/2/content/0/content", true),
                ("/messages/2/content/1/content/0/text", true),
                ("/messages/2/content/1/content/1/source", false),
                ("/messages/2/content/1/content/1/title", true),
                ("/messages/2/content/1/content/1/content/0/text", true),
            ],
        );
        let body =
            json!({"system": "for a@x.com", "messages": [{"role": "user", "content": "b@y.org"}]});
        assert_fields(
            Some(Api::AnthropicMessages),
            &body,
            &[("/system", true), ("/messages/0/content", true)],
        );
    }

    #[test]
    fn unchanged_blocked_invalid_and_raw() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]});
        assert_eq!(
            run("{}", Some(Api::ChatCompletions), &body).0,
            Redaction::Unchanged
        );
        let body = json!({"messages": [{"role": "user", "content": "Project Falcon"}]});
        let doc = r#"{"rules":[{"name":"CODE","words":["project falcon"],"action":"block"}]}"#;
        assert_eq!(
            run(doc, Some(Api::ChatCompletions), &body).0,
            Redaction::Blocked(Blocked {
                rule: "CODE".into()
            })
        );
        let mut map = PlaceholderMap::default();
        assert!(matches!(
            redact_body(
                &config("{}"),
                Some(Api::ChatCompletions),
                b"{\"messages\":",
                &mut map
            ),
            Redaction::Invalid(_)
        ));
        let raw = config(r#"{"scope":"raw_body"}"#);
        assert_eq!(
            redact_body(&raw, None, b"to=a@x.com&x=1", &mut map),
            Redaction::Rewritten(b"to=[EMAIL_1]&x=1".to_vec())
        );
        assert_eq!(
            redact_body(&raw, None, b"\xff a@x.com", &mut map),
            Redaction::Unchanged
        );
    }

    #[test]
    fn preamble_per_api() {
        let doc = r#"{"preamble":"Keep [X_1] tokens."}"#;
        let chat = json!({"messages": [{"role": "user", "content": "a@x.com"}]});
        let out = rewritten(run(doc, Some(Api::ChatCompletions), &chat).0);
        assert_eq!(
            out["messages"][0],
            json!({"role": "system", "content": "Keep [X_1] tokens."})
        );
        assert_eq!(out["messages"][1]["content"], "[EMAIL_1]");

        let anth =
            json!({"system": "Be brief.", "messages": [{"role": "user", "content": "a@x.com"}]});
        let out = rewritten(run(doc, Some(Api::AnthropicMessages), &anth).0);
        assert_eq!(out["system"], "Keep [X_1] tokens.\n\nBe brief.");
        let anth = json!({"messages": [{"role": "user", "content": "a@x.com"}]});
        assert_eq!(
            rewritten(run(doc, Some(Api::AnthropicMessages), &anth).0)["system"],
            "Keep [X_1] tokens."
        );
        let anth = json!({"system": [{"type": "text", "text": "x"}], "messages": [{"role": "user", "content": "a@x.com"}]});
        let out = rewritten(run(doc, Some(Api::AnthropicMessages), &anth).0);
        assert_eq!(out["system"][0]["text"], "Keep [X_1] tokens.");
        assert_eq!(out["system"][1]["text"], "x");

        let resp = json!({"input": "a@x.com"});
        assert_eq!(
            rewritten(run(doc, Some(Api::Responses), &resp).0)["instructions"],
            "Keep [X_1] tokens."
        );
        // nothing masked: no preamble
        let plain = json!({"messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(
            run(doc, Some(Api::ChatCompletions), &plain).0,
            Redaction::Unchanged
        );
    }

    /// With `"reentry": false` no fingerprint is taken (nothing asks for one) and the body is
    /// redacted to the same bytes; a carried fingerprint still has the pass compare.
    #[test]
    fn without_reentry_no_fingerprint_is_taken_and_the_redaction_is_the_same() {
        let with = config(r#"{"preamble": "P"}"#);
        let without = config(r#"{"preamble": "P", "reentry": false}"#);
        for (api, body) in [
            (
                Some(Api::ChatCompletions),
                json!({"messages": [{"role": "user", "content": "a@x.com"}]}),
            ),
            (
                Some(Api::ChatCompletions),
                json!({"messages": [{"role": "user", "content": "hi"}]}),
            ),
            (Some(Api::Responses), json!({"input": "mail a@x.com"})),
        ] {
            let bytes = serde_json::to_vec(&body).unwrap();
            let (mut a, mut b) = (PlaceholderMap::default(), PlaceholderMap::default());
            let (r_with, print) = redact_pass(&with, api, &bytes, &mut a, None);
            let (r_without, none) = redact_pass(&without, api, &bytes, &mut b, None);
            assert_eq!(r_with, r_without, "{body}");
            assert!(print.is_some(), "{body}");
            assert_eq!(none, None, "{body}");
            assert_eq!(a.total(), b.total());
        }
        // a pass that carries the superseded pass's fingerprint still recognises its output
        let bytes =
            serde_json::to_vec(&json!({"messages": [{"role": "user", "content": "a@x.com"}]}))
                .unwrap();
        let mut first = PlaceholderMap::default();
        let (r, forwarded) =
            redact_pass(&with, Some(Api::ChatCompletions), &bytes, &mut first, None);
        let Redaction::Rewritten(out) = r else {
            panic!("{r:?}")
        };
        let mut again = first.clone();
        let (r, _) = redact_pass(
            &without,
            Some(Api::ChatCompletions),
            &out,
            &mut again,
            forwarded,
        );
        assert_eq!(r, Redaction::Unchanged);
    }

    /// The first pass of a request, then the pass that re-enters after an internal redirect
    /// with `resent` (what the host re-sends, given the first pass's output).
    fn two_passes(
        doc: &str,
        api: Option<Api>,
        original: &Value,
        resent: impl Fn(&[u8]) -> Vec<u8>,
    ) -> (Vec<u8>, Redaction, PlaceholderMap, PlaceholderMap) {
        let config = config(doc);
        let bytes = serde_json::to_vec(original).unwrap();
        let mut first = PlaceholderMap::default();
        let (r, forwarded) = redact_pass(&config, api, &bytes, &mut first, None);
        let out = match r {
            Redaction::Rewritten(b) => b,
            Redaction::Unchanged => bytes.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(forwarded, fingerprint(&out));
        let mut again = first.clone();
        let (r, _) = redact_pass(&config, api, &resent(&out), &mut again, forwarded);
        (out, r, first, again)
    }

    /// A client's placeholder-like literals are renumbered in the forwarded body: the same
    /// texts, in other messages. Higress re-sends the original: it is not the forwarded body
    /// and is masked again, to the same bytes (a multiset of texts took one for the other).
    #[test]
    fn a_resent_original_of_swapped_literals_is_masked_again() {
        let original = json!({"messages": [
            {"role": "user", "content": "[EMAIL_2]"},
            {"role": "user", "content": "[EMAIL_1]"}]});
        let (out, r, _, _) = two_passes("{}", Some(Api::ChatCompletions), &original, |_| {
            serde_json::to_vec(&original).unwrap()
        });
        assert_ne!(out, serde_json::to_vec(&original).unwrap());
        assert_eq!(r, Redaction::Rewritten(out));
    }

    /// Upstream Envoy re-sends the forwarded body, edited further by later filters (model,
    /// `max_tokens`): nothing is masked again, the preamble is not added twice, and the map
    /// restores the same values. Higress re-sends the original: it is masked to the same
    /// text, with one preamble.
    #[test]
    fn a_reentering_pass_masks_once_and_adds_the_preamble_once() {
        let doc = r#"{"preamble":"Keep tokens like [EMAIL_1] exactly as written."}"#;
        let later_filters = |out: &[u8]| {
            let mut v: Value = serde_json::from_slice(out).unwrap();
            v["model"] = json!("gpt-4o-mini");
            v["max_completion_tokens"] = json!(100);
            serde_json::to_vec(&v).unwrap()
        };
        let bodies = [
            (
                Some(Api::ChatCompletions),
                json!({"model": "fast", "messages": [
                {"role": "user", "name": "c@z.net", "content": "mail a@x.com, call 13800138000"},
                {"role": "user", "content": "what is [EMAIL_1]?"}]}),
            ),
            (
                Some(Api::AnthropicMessages),
                json!({"system": "Be brief with a@x.com.", "messages": [
                {"role": "user", "content": "b@y.org"}]}),
            ),
            (Some(Api::Responses), json!({"input": "a@x.com"})),
            (
                Some(Api::AnthropicMessages),
                json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use",
                "id": "t", "name": "send", "input": {"name": "a@x.com"}}]}]}),
            ),
        ];
        for (api, original) in bodies {
            let (out, r, first, again) = two_passes(doc, api, &original, later_filters);
            assert_eq!(r, Redaction::Unchanged, "{api:?}");
            let text = String::from_utf8(out.clone()).unwrap();
            assert_eq!(
                text.matches("Keep tokens like").count(),
                1,
                "{api:?} {text}"
            );
            assert_eq!(again.restore(&text), first.restore(&text));
            assert!(again.has_restorable());

            let (out, r, _, again) = two_passes(doc, api, &original, |_| {
                serde_json::to_vec(&original).unwrap()
            });
            assert_eq!(rewritten(r), serde_json::from_slice::<Value>(&out).unwrap());
            assert_eq!(
                again.total(),
                2 * first.total(),
                "counted again, same placeholders"
            );

            // a pass that started afresh would mask the placeholders again, preamble twice
            let config = config(doc);
            let mut fresh = PlaceholderMap::default();
            let resent = later_filters(&out);
            let fresh_out = rewritten(redact_body(&config, api, &resent, &mut fresh));
            assert_ne!(fresh_out, serde_json::from_slice::<Value>(&resent).unwrap());
        }
    }

    /// Something else than either body (a host that re-sends another text) is masked with
    /// the carried map: known values keep their placeholders, new ones get the next.
    #[test]
    fn a_reentering_pass_with_another_body_continues_the_numbering() {
        let original = json!({"messages": [{"role": "user", "content": "a@x.com"}]});
        let (_, r, _, again) = two_passes("{}", Some(Api::ChatCompletions), &original, |_| {
            serde_json::to_vec(
                &json!({"messages": [{"role": "user", "content": "a@x.com c@z.net"}]}),
            )
            .unwrap()
        });
        assert_eq!(
            rewritten(r)["messages"][0]["content"],
            "[EMAIL_1] [EMAIL_2]"
        );
        assert_eq!(again.restore("[EMAIL_2] [EMAIL_1]"), "c@z.net a@x.com");
    }

    /// Found by the `pii_request` fuzz target: a `messages`, `system` or `instructions` of
    /// another type than the API's got the preamble spliced into it as if it were a list (or
    /// a duplicate member beside it), and a body that was JSON went upstream as broken JSON.
    /// Such a body is masked as usual, without a preamble.
    #[test]
    fn preamble_never_breaks_a_body_of_unexpected_shape() {
        let doc = r#"{"preamble":"Keep [X_1] tokens."}"#;
        for (api, body) in [
            (
                Some(Api::ChatCompletions),
                json!({"messages": {"content": "a@x.com"}}),
            ),
            (
                Some(Api::AnthropicMessages),
                json!({"system": {"text": "a"}, "messages": [{"content": "a@x.com"}]}),
            ),
            (
                Some(Api::AnthropicMessages),
                json!({"system": 7, "messages": [{"content": "a@x.com"}]}),
            ),
            (
                Some(Api::Responses),
                json!({"instructions": null, "input": "a@x.com"}),
            ),
            (
                Some(Api::Responses),
                json!({"instructions": ["x"], "input": "a@x.com"}),
            ),
        ] {
            let (redaction, _) = run(doc, api, &body);
            let Redaction::Rewritten(bytes) = redaction else {
                panic!("{body}: not rewritten: {redaction:?}");
            };
            let text = String::from_utf8(bytes.clone()).unwrap();
            assert!(
                serde_json::from_slice::<Value>(&bytes).is_ok(),
                "{body}: invalid JSON: {text}"
            );
            assert!(
                text.contains("[EMAIL_1]") && !text.contains("Keep"),
                "{text}"
            );
        }
        // the same bytes the fuzz target found: `messages` an object, in a chat request
        let raw = br#"{"model":"fast","messages":{"content":"ann@example.com"}}"#;
        let mut map = PlaceholderMap::default();
        assert_eq!(
            redact_body(&config(doc), Some(Api::ChatCompletions), raw, &mut map),
            Redaction::Rewritten(
                br#"{"model":"fast","messages":{"content":"[EMAIL_1]"}}"#.to_vec()
            )
        );
    }

    proptest::proptest! {
        /// Re-entry, whichever body the host re-sends: the forwarded one passes unchanged, the
        /// original is masked to the same bytes; the map restores the same text.
        #[test]
        fn reentry_reproduces_the_first_pass(
            parts in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just("a@x.com"), proptest::strategy::Just("b@y.org"),
                    proptest::strategy::Just("[EMAIL_1]"), proptest::strategy::Just("[EMAIL_2]"),
                    proptest::strategy::Just("[PHONE_1]"), proptest::strategy::Just("13800138000"),
                    proptest::strategy::Just(" "), proptest::strategy::Just("x"),
                ],
                0..8,
            ),
            split in 0usize..8,
            preamble in proptest::bool::ANY,
        ) {
            let doc = if preamble { r#"{"preamble":"Keep [EMAIL_1] as is."}"# } else { "{}" };
            let cut = split.min(parts.len());
            let original = json!({"messages": [
                {"role": "user", "content": parts[..cut].concat()},
                {"role": "user", "content": parts[cut..].concat()}]});
            let (out, r, first, again) = two_passes(doc, Some(Api::ChatCompletions), &original, |out| out.to_vec());
            proptest::prop_assert_eq!(r, Redaction::Unchanged);
            let text = String::from_utf8(out).unwrap();
            proptest::prop_assert_eq!(again.restore(&text), first.restore(&text));
            let (out, r, _, _) = two_passes(doc, Some(Api::ChatCompletions), &original, |_| {
                serde_json::to_vec(&original).unwrap()
            });
            let expected = if out == serde_json::to_vec(&original).unwrap() {
                Redaction::Unchanged
            } else {
                Redaction::Rewritten(out)
            };
            proptest::prop_assert_eq!(r, expected);
        }
        /// The forwarded body's fingerprint, summed during the redaction walk, is the one
        /// a walk of the forwarded body gives: any texts (escapes, non-ASCII, PII or not), in
        /// string or part form, beside members that are no message text, with a preamble or
        /// without.
        #[test]
        fn the_forwarded_fingerprint_is_the_forwarded_bodys(
            texts in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just("mail a@x.com now".to_string()),
                    proptest::strategy::Just("call 13800138000".to_string()),
                    "\\PC{0,12}",
                    "[a-z\"\\\\\n\u{1}é😀 ]{0,12}",
                ],
                0..6,
            ),
            parts in proptest::bool::ANY,
            preamble in proptest::bool::ANY,
        ) {
            let doc = if preamble { r#"{"preamble":"Keep it."}"# } else { "{}" };
            let messages: Vec<Value> = texts.iter().enumerate().map(|(i, t)| {
                let content = if parts {
                    json!([{"type": "text", "text": t}, {"type": "image_url",
                        "image_url": {"url": "https://x/a@x.com"}}])
                } else {
                    json!(t)
                };
                json!({"role": if i % 2 == 0 { "user" } else { "assistant" },
                    "name": t, "content": content})
            }).collect();
            let body = serde_json::to_vec(
                &json!({"model": "a@x.com", "messages": messages, "user": "b@y.org"}),
            ).unwrap();
            let mut map = PlaceholderMap::default();
            let (r, forwarded) = redact_pass(&config(doc), Some(Api::ChatCompletions), &body, &mut map, None);
            let out = match r {
                Redaction::Rewritten(b) => b,
                Redaction::Unchanged => body.clone(),
                other => panic!("{other:?}"),
            };
            proptest::prop_assert_eq!(forwarded, fingerprint(&out));
        }
        // never a panic on any body; a rewritten JSON body is still JSON
        #[test]
        fn any_body_is_handled(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            json_like in "[{}\\[\\]\",:a-z@.0-9 \\\\]{0,200}",
        ) {
            let config = config("{}");
            for bytes in [body.as_slice(), json_like.as_bytes()] {
                let mut map = PlaceholderMap::default();
                if let Redaction::Rewritten(new) = redact_body(&config, Some(Api::ChatCompletions), bytes, &mut map) {
                    proptest::prop_assert!(serde_json::from_slice::<Value>(&new).is_ok());
                }
            }
        }

        #[test]
        fn message_text_round_trips(text in "[a-z@.0-9 \\[\\]_A-Z\"\\\\\n漢]{0,80}") {
            let body = json!({"messages": [{"role": "user", "content": text.clone()}]});
            let (r, map) = run("{}", Some(Api::ChatCompletions), &body);
            let content = match r {
                Redaction::Rewritten(b) => serde_json::from_slice::<Value>(&b).unwrap()["messages"][0]["content"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
                _ => text.clone(),
            };
            proptest::prop_assert_eq!(map.restore(&content), text);
        }
    }

    #[test]
    fn lone_surrogates_do_not_hide_text_from_the_scan() {
        let body = br#"{"messages":[{"role":"user","content":"\ud800 mail a@x.com"}]}"#;
        let mut map = PlaceholderMap::default();
        match redact_body(&config("{}"), Some(Api::ChatCompletions), body, &mut map) {
            Redaction::Rewritten(new) => {
                let v: Value = serde_json::from_slice(&new).unwrap();
                assert_eq!(v["messages"][0]["content"], "\u{FFFD} mail [EMAIL_1]");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_preamble_where_the_api_keeps_no_instructions() {
        let doc = r#"{"preamble":"Keep [X_1] tokens."}"#;
        let embeddings = json!({"input": ["mail a@x.com"]});
        for api in [Some(Api::Embeddings), None] {
            let out = rewritten(run(doc, api, &embeddings).0);
            assert_eq!(out, json!({"input": ["mail [EMAIL_1]"]}), "{api:?}");
        }
    }
}
