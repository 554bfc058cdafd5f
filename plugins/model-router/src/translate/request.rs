//! Request bodies: Chat ⇄ Messages, by the tables of the [module docs](super).
//!
//! A request is read once, whole, into a [`Doc`] (strings borrowed from the body, members in
//! document order for [`TranslatedRequest::dropped`]) and the other API's body is built as a
//! `Doc` pointing into it, then written once. Where a field is ([`Path`]) is kept as the body
//! is walked and formatted only for a refusal. A request of the deployment's own API is not
//! parsed: only its `model` is spliced.

use super::doc::Doc;
use super::{Asked, RequestParams, TranslatedRequest, Wire};
use llm_gateway_shared::json::{push_quoted, quote, scan_object, Edits, Limits};
use llm_gateway_shared::reject::Reject;
use std::borrow::Cow;
use std::fmt;

/// `body` (a request of API `from`) as a request of API `to` for the deployment `params`
/// describes. 400 naming the field for what cannot be translated.
pub fn request(
    from: Wire,
    to: Wire,
    body: &[u8],
    params: &RequestParams<'_>,
) -> Result<TranslatedRequest, Reject> {
    match (from, to) {
        (Wire::Chat, Wire::Messages) => chat_to_messages(body, params),
        (Wire::Messages, Wire::Chat) => messages_to_chat(body, params),
        (Wire::Chat, Wire::Chat) | (Wire::Messages, Wire::Messages) => same_api(from, body, params),
    }
}

/// The body with `model` replaced, every other byte as it was.
fn same_api(
    api: Wire,
    body: &[u8],
    params: &RequestParams<'_>,
) -> Result<TranslatedRequest, Reject> {
    let limits = Limits::default();
    let object = scan_object(body, &limits).map_err(|e| {
        Reject::bad_request(
            "invalid_request_body",
            format!("the body is not valid: {e}"),
        )
    })?;
    let stream = object.bool(body, "stream").ok().flatten().unwrap_or(false);
    let include_usage = match api {
        // a Messages stream always carries usage
        Wire::Messages => true,
        Wire::Chat => object
            .raw(body, "stream_options")
            .and_then(|raw| {
                let options = scan_object(raw, &limits).ok()?;
                options.bool(raw, "include_usage").ok().flatten()
            })
            .unwrap_or(false),
    };
    let mut edits = Edits::new(body, &object);
    edits.set("model", quote(params.model).into_bytes());
    Ok(TranslatedRequest {
        body: edits.finish(),
        asked: Asked {
            stream,
            include_usage,
        },
        dropped: Vec::new(),
    })
}

/// The body as a document; 400 if it is not a JSON object. The message gives the position,
/// never the body's text.
fn parse_body(body: &[u8]) -> Result<Doc<'_>, Reject> {
    let doc = Doc::parse(body).map_err(|e| {
        Reject::bad_request(
            "invalid_request_body",
            format!(
                "the body is not valid JSON (line {}, column {})",
                e.line(),
                e.column()
            ),
        )
    })?;
    if !doc.is_object() {
        return Err(Reject::bad_request(
            "invalid_request_body",
            "the body must be a JSON object",
        ));
    }
    Ok(doc)
}

/// Where a field is: `messages[2].content[0].type`. Built for free as the body is walked;
/// formatted only for a refusal.
#[derive(Debug, Clone, Copy)]
enum Path<'p> {
    Top(&'p str),
    Member(&'p Path<'p>, &'static str),
    Element(&'p Path<'p>, usize),
}

impl<'p> Path<'p> {
    fn key(&'p self, key: &'static str) -> Path<'p> {
        Path::Member(self, key)
    }

    fn at(&'p self, index: usize) -> Path<'p> {
        Path::Element(self, index)
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Top(name) => f.write_str(name),
            Path::Member(parent, key) => write!(f, "{parent}.{key}"),
            Path::Element(parent, index) => write!(f, "{parent}[{index}]"),
        }
    }
}

/// What one translation collects besides the body: the dropped fields, and the API it writes.
struct Ctx {
    to: Wire,
    dropped: Vec<String>,
}

impl Ctx {
    fn new(to: Wire) -> Self {
        Ctx {
            to,
            dropped: Vec::new(),
        }
    }

    /// Notes a dropped field (once).
    fn drop_field(&mut self, name: &str) {
        if !self.dropped.iter().any(|d| d == name) {
            self.dropped.push(name.to_string());
        }
    }

    /// 400 `unsupported_field`: "`path` <what> cannot be sent to <deployment>".
    fn refuse(&self, path: &Path<'_>, what: &str) -> Reject {
        Reject::bad_request(
            "unsupported_field",
            format!("`{path}`{what} cannot be sent to {}", self.to.deployment()),
        )
    }

    /// [`Ctx::refuse`] for a field whose (type) value is the problem: the value is named when
    /// it is a short identifier (never a piece of a prompt).
    fn refuse_value(&self, path: &Path<'_>, value: &str) -> Reject {
        self.refuse(path, &shown(value))
    }
}

/// ` "value"` for a short identifier-like value, else nothing.
fn shown(value: &str) -> String {
    let identifier = !value.is_empty()
        && value.len() <= 40
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    if identifier {
        format!(" \"{value}\"")
    } else {
        String::new()
    }
}

/// 400 `invalid_request_body`: "`path` must be <expected>".
fn invalid(path: &Path<'_>, expected: &str) -> Reject {
    Reject::bad_request(
        "invalid_request_body",
        format!("`{path}` must be {expected}"),
    )
}

fn string<'d>(value: &'d Doc<'_>, path: &Path<'_>) -> Result<&'d str, Reject> {
    value.as_str().ok_or_else(|| invalid(path, "a string"))
}

/// Member `key` of `parent` (at `path`) as a string; absent: `None`.
fn opt_str<'d>(
    parent: &'d Doc<'_>,
    key: &'static str,
    path: &Path<'_>,
) -> Result<Option<&'d str>, Reject> {
    parent
        .field(key)
        .map(|value| string(value, &path.key(key)))
        .transpose()
}

/// Member `key` of `parent` (at `path`), a string that must be there.
fn req_str<'d>(parent: &'d Doc<'_>, key: &'static str, path: &Path<'_>) -> Result<&'d str, Reject> {
    opt_str(parent, key, path)?.ok_or_else(|| invalid(&path.key(key), "a string"))
}

fn number<'d>(value: &'d Doc<'d>, path: &Path<'_>) -> Result<Doc<'d>, Reject> {
    if value.is_number() {
        Ok(Doc::Ref(value))
    } else {
        Err(invalid(path, "a number"))
    }
}

fn count(value: &Doc<'_>, path: &Path<'_>) -> Result<u64, Reject> {
    value
        .as_u64()
        .ok_or_else(|| invalid(path, "a non-negative integer"))
}

fn boolean(value: &Doc<'_>, path: &Path<'_>) -> Result<bool, Reject> {
    value.as_bool().ok_or_else(|| invalid(path, "a boolean"))
}

fn array<'d>(value: &'d Doc<'d>, path: &Path<'_>) -> Result<&'d [Doc<'d>], Reject> {
    value.as_array().ok_or_else(|| invalid(path, "an array"))
}

/// Writes a JSON object member by member, in the order given.
struct ObjectOut {
    buf: Vec<u8>,
}

impl ObjectOut {
    fn with_capacity(capacity: usize) -> Self {
        let mut buf = Vec::with_capacity(capacity);
        buf.push(b'{');
        ObjectOut { buf }
    }

    fn member(&mut self, key: &str, value: &Doc<'_>) {
        if self.buf.len() > 1 {
            self.buf.push(b',');
        }
        push_quoted(&mut self.buf, key);
        self.buf.push(b':');
        value.write(&mut self.buf);
    }

    fn finish(mut self) -> Vec<u8> {
        self.buf.push(b'}');
        self.buf
    }
}

fn text_block(text: &str) -> Doc<'_> {
    Doc::text(text)
}

// ---- Chat → Messages ---------------------------------------------------------------------

/// One Messages turn being built: role and content (a string or an array of blocks).
struct Turn<'d> {
    role: &'static str,
    content: Doc<'d>,
}

/// Appends a turn; a turn of the same role as the last one is merged into it, blocks
/// concatenated (Messages requires user and assistant to alternate).
fn push_turn<'d>(turns: &mut Vec<Turn<'d>>, role: &'static str, content: Doc<'d>) {
    if let Some(last) = turns.last_mut() {
        if last.role == role {
            let mut blocks = into_blocks(std::mem::replace(&mut last.content, Doc::Null));
            blocks.extend(into_blocks(content));
            last.content = Doc::Array(blocks);
            return;
        }
    }
    turns.push(Turn { role, content });
}

/// Content as blocks: a string is one text block (none for an empty string).
fn into_blocks(content: Doc<'_>) -> Vec<Doc<'_>> {
    match content {
        Doc::String(s) if s.is_empty() => Vec::new(),
        Doc::String(s) => vec![Doc::object([
            ("type", Doc::str("text")),
            ("text", Doc::String(s)),
        ])],
        Doc::Ref(Doc::String(s)) if s.is_empty() => Vec::new(),
        Doc::Ref(Doc::String(s)) => vec![text_block(s)],
        Doc::Array(blocks) => blocks,
        _ => Vec::new(),
    }
}

/// A system / developer message's content.
enum SystemSource<'d> {
    Text(&'d str),
    Parts(Vec<&'d str>),
}

fn chat_to_messages(body: &[u8], params: &RequestParams<'_>) -> Result<TranslatedRequest, Reject> {
    let doc = parse_body(body)?;
    let mut ctx = Ctx::new(Wire::Messages);
    let mut system = Vec::new();
    let mut turns: Option<Vec<Turn<'_>>> = None;
    let mut tools: Option<Vec<Doc<'_>>> = None;
    let mut tool_choice: Option<Vec<(&'static str, Doc<'_>)>> = None;
    let mut parallel: Option<bool> = None;
    let mut stop: Option<Doc<'_>> = None;
    let (mut temperature, mut top_p) = (None, None);
    let (mut max_completion, mut max_tokens) = (None, None);
    let (mut user, mut safety_identifier) = (None, None);
    let mut stream = None;
    let mut include_usage = false;

    for (key, value) in doc.members() {
        if value.is_null() {
            continue;
        }
        let path = Path::Top(key);
        match key {
            "model" => {}
            "messages" => turns = Some(chat_messages(value, &mut system, &mut ctx)?),
            "tools" => tools = Some(chat_tools(value, &mut ctx)?),
            "tool_choice" => tool_choice = Some(chat_tool_choice(value, &ctx)?),
            "parallel_tool_calls" => parallel = Some(boolean(value, &path)?),
            "stop" => {
                stop = Some(match value {
                    Doc::String(_) => Doc::Array(vec![Doc::Ref(value)]),
                    Doc::Array(items) if items.iter().all(|i| i.as_str().is_some()) => {
                        Doc::Ref(value)
                    }
                    _ => return Err(invalid(&path, "a string or an array of strings")),
                })
            }
            "temperature" => {
                let t = number(value, &path)?;
                // Anthropic's range is 0–1
                temperature = Some(if t.as_f64().is_some_and(|t| t > 1.0) {
                    Doc::Number(1.into())
                } else {
                    t
                });
            }
            "top_p" => top_p = Some(number(value, &path)?),
            "max_completion_tokens" => max_completion = Some(count(value, &path)?),
            "max_tokens" => max_tokens = Some(count(value, &path)?),
            "user" => user = Some(string(value, &path)?),
            "safety_identifier" => safety_identifier = Some(string(value, &path)?),
            "stream" => stream = Some(boolean(value, &path)?),
            "stream_options" => {
                if !value.is_object() {
                    return Err(invalid(&path, "an object"));
                }
                for (name, option) in value.members() {
                    if option.is_null() {
                        continue;
                    }
                    if name == "include_usage" {
                        include_usage = boolean(option, &path.key("include_usage"))?;
                    } else {
                        ctx.drop_field(&format!("stream_options.{name}"));
                    }
                }
            }
            "n" => {
                if count(value, &path)? > 1 {
                    return Err(ctx.refuse(&path, " > 1"));
                }
            }
            "logprobs" => {
                if boolean(value, &path)? {
                    return Err(ctx.refuse(&path, ""));
                }
            }
            "top_logprobs" | "audio" | "prediction" | "functions" | "function_call" => {
                return Err(ctx.refuse(&path, ""))
            }
            "response_format" => {
                let kind = req_str(value, "type", &path)?;
                if kind == "text" {
                    ctx.drop_field(key);
                } else {
                    return Err(ctx.refuse_value(&path.key("type"), kind));
                }
            }
            "modalities" => {
                let modalities = array(value, &path)?;
                if modalities.iter().any(|m| m.as_str() == Some("audio")) {
                    return Err(ctx.refuse(&path, " with \"audio\""));
                }
                ctx.drop_field(key);
            }
            // frequency_penalty, presence_penalty, seed, logit_bias, service_tier, store,
            // metadata, prompt_cache_key, reasoning_effort, verbosity, web_search_options, and
            // whatever else
            _ => ctx.drop_field(key),
        }
    }

    let Some(turns) = turns else {
        return Err(invalid(&Path::Top("messages"), "an array of messages"));
    };
    if parallel == Some(false) {
        match (&tools, &mut tool_choice) {
            (None, _) => ctx.drop_field("parallel_tool_calls"),
            (Some(_), Some(choice)) => {
                let none = choice
                    .iter()
                    .any(|(k, v)| *k == "type" && v.as_str() == Some("none"));
                if !none {
                    choice.push(("disable_parallel_tool_use", Doc::Bool(true)));
                }
            }
            (Some(_), None) => {
                tool_choice = Some(vec![
                    ("type", Doc::str("auto")),
                    ("disable_parallel_tool_use", Doc::Bool(true)),
                ]);
            }
        }
    }
    if user.is_some() && safety_identifier.is_some() {
        ctx.drop_field("safety_identifier");
    }

    let mut out = ObjectOut::with_capacity(body.len() + 64);
    out.member("model", &Doc::str(params.model));
    let cap = max_completion
        .or(max_tokens)
        .unwrap_or(params.default_max_tokens);
    out.member("max_tokens", &Doc::Number(cap.into()));
    match system.as_slice() {
        [] => {}
        [SystemSource::Text(text)] => out.member("system", &Doc::str(text)),
        sources => {
            let blocks: Vec<Doc<'_>> = sources
                .iter()
                .flat_map(|source| match source {
                    SystemSource::Text(text) => vec![text_block(text)],
                    SystemSource::Parts(parts) => parts.iter().map(|t| text_block(t)).collect(),
                })
                .collect();
            out.member("system", &Doc::Array(blocks));
        }
    }
    let messages: Vec<Doc<'_>> = turns
        .into_iter()
        .map(|turn| Doc::object([("role", Doc::str(turn.role)), ("content", turn.content)]))
        .collect();
    out.member("messages", &Doc::Array(messages));
    if let Some(tools) = tools {
        out.member("tools", &Doc::Array(tools));
    }
    if let Some(choice) = tool_choice {
        let members = choice
            .into_iter()
            .map(|(k, v)| (Cow::Borrowed(k), v))
            .collect();
        out.member("tool_choice", &Doc::Object(members));
    }
    if let Some(stop) = stop {
        out.member("stop_sequences", &stop);
    }
    if let Some(t) = temperature {
        out.member("temperature", &t);
    }
    if let Some(p) = top_p {
        out.member("top_p", &p);
    }
    if let Some(id) = user.or(safety_identifier) {
        out.member("metadata", &Doc::object([("user_id", Doc::str(id))]));
    }
    if let Some(stream) = stream {
        out.member("stream", &Doc::Bool(stream));
    }
    Ok(TranslatedRequest {
        body: out.finish(),
        asked: Asked {
            stream: stream.unwrap_or(false),
            include_usage,
        },
        dropped: ctx.dropped,
    })
}

/// Chat `messages` as Messages turns; system and developer messages go to `system`.
fn chat_messages<'d>(
    value: &'d Doc<'d>,
    system: &mut Vec<SystemSource<'d>>,
    ctx: &mut Ctx,
) -> Result<Vec<Turn<'d>>, Reject> {
    let messages_path = Path::Top("messages");
    let messages = array(value, &messages_path)?;
    let mut turns = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        let path = messages_path.at(i);
        if !message.is_object() {
            return Err(invalid(&path, "an object"));
        }
        let role = req_str(message, "role", &path)?;
        if message.field("name").is_some() {
            ctx.drop_field("messages[].name");
        }
        if message.field("function_call").is_some() {
            return Err(ctx.refuse(&path.key("function_call"), ""));
        }
        let content_path = path.key("content");
        match role {
            "system" | "developer" => system.push(match message.field("content") {
                Some(Doc::String(s)) => SystemSource::Text(s),
                Some(Doc::Array(parts)) => {
                    SystemSource::Parts(chat_text_parts(&content_path, parts, ctx)?)
                }
                _ => return Err(invalid(&content_path, "a string or an array of text parts")),
            }),
            "user" => {
                let content = match message.field("content") {
                    Some(text @ Doc::String(_)) => Doc::Ref(text),
                    Some(Doc::Array(parts)) => Doc::Array(
                        parts
                            .iter()
                            .enumerate()
                            .map(|(j, part)| chat_user_part(&content_path.at(j), part, ctx))
                            .collect::<Result<_, _>>()?,
                    ),
                    _ => {
                        return Err(invalid(
                            &content_path,
                            "a string or an array of content parts",
                        ))
                    }
                };
                push_turn(&mut turns, "user", content);
            }
            "assistant" => {
                let content = chat_assistant(&path, message, ctx)?;
                push_turn(&mut turns, "assistant", content);
            }
            "tool" => {
                let id = req_str(message, "tool_call_id", &path)?;
                let content = match message.field("content") {
                    None => Doc::str(""),
                    Some(text @ Doc::String(_)) => Doc::Ref(text),
                    Some(Doc::Array(parts)) => Doc::Array(
                        chat_text_parts(&content_path, parts, ctx)?
                            .into_iter()
                            .map(text_block)
                            .collect(),
                    ),
                    Some(_) => {
                        return Err(invalid(&content_path, "a string or an array of text parts"))
                    }
                };
                let block = Doc::object([
                    ("type", Doc::str("tool_result")),
                    ("tool_use_id", Doc::str(id)),
                    ("content", content),
                ]);
                push_turn(&mut turns, "user", Doc::Array(vec![block]));
            }
            other => return Err(ctx.refuse_value(&path.key("role"), other)),
        }
    }
    Ok(turns)
}

/// The texts of an array of text parts at `path` (another part type is refused).
fn chat_text_parts<'d>(
    path: &Path<'_>,
    parts: &'d [Doc<'d>],
    ctx: &Ctx,
) -> Result<Vec<&'d str>, Reject> {
    parts
        .iter()
        .enumerate()
        .map(|(j, part)| {
            let path = path.at(j);
            match req_str(part, "type", &path)? {
                "text" => req_str(part, "text", &path),
                other => Err(ctx.refuse_value(&path.key("type"), other)),
            }
        })
        .collect()
}

fn chat_user_part<'d>(
    path: &Path<'_>,
    part: &'d Doc<'d>,
    ctx: &mut Ctx,
) -> Result<Doc<'d>, Reject> {
    match req_str(part, "type", path)? {
        "text" => Ok(text_block(req_str(part, "text", path)?)),
        "image_url" => {
            let image_path = path.key("image_url");
            let url = match part.field("image_url") {
                Some(Doc::String(url)) => url.as_ref(),
                Some(image @ Doc::Object(_)) => {
                    if image.field("detail").is_some() {
                        ctx.drop_field("messages[].content[].image_url.detail");
                    }
                    req_str(image, "url", &image_path)?
                }
                _ => return Err(invalid(&image_path, "an object with a `url`")),
            };
            image_block(url).ok_or_else(|| {
                ctx.refuse(
                    &image_path.key("url"),
                    " (neither an http(s) URL nor a base64 data URL)",
                )
            })
        }
        other => Err(ctx.refuse_value(&path.key("type"), other)),
    }
}

/// A Messages image block for an image URL: a base64 `data:` URL, or an `http(s)` URL.
fn image_block(url: &str) -> Option<Doc<'_>> {
    if let Some(rest) = strip_prefix_ignore_case(url, "data:") {
        let (media_type, data) = rest.split_once(";base64,")?;
        let source = Doc::object([
            ("type", Doc::str("base64")),
            ("media_type", Doc::str(media_type)),
            ("data", Doc::str(data)),
        ]);
        return Some(Doc::object([
            ("type", Doc::str("image")),
            ("source", source),
        ]));
    }
    let web = strip_prefix_ignore_case(url, "https://").is_some()
        || strip_prefix_ignore_case(url, "http://").is_some();
    web.then(|| {
        let source = Doc::object([("type", Doc::str("url")), ("url", Doc::str(url))]);
        Doc::object([("type", Doc::str("image")), ("source", source)])
    })
}

fn strip_prefix_ignore_case<'s>(s: &'s str, prefix: &str) -> Option<&'s str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| s.get(prefix.len()..))
        .flatten()
}

/// An assistant message's content: a string when it has no tool calls and string content,
/// else text blocks then `tool_use` blocks.
fn chat_assistant<'d>(
    path: &Path<'_>,
    message: &'d Doc<'d>,
    ctx: &mut Ctx,
) -> Result<Doc<'d>, Reject> {
    if message.field("refusal").is_some() {
        ctx.drop_field("messages[].refusal");
    }
    if message.field("audio").is_some() {
        ctx.drop_field("messages[].audio");
    }
    let content_path = path.key("content");
    let mut blocks = Vec::new();
    let mut text = None;
    match message.field("content") {
        None => {}
        Some(Doc::String(s)) => text = Some(s.as_ref()),
        Some(Doc::Array(parts)) => {
            for (j, part) in parts.iter().enumerate() {
                let part_path = content_path.at(j);
                let piece = match req_str(part, "type", &part_path)? {
                    "text" => req_str(part, "text", &part_path)?,
                    "refusal" => req_str(part, "refusal", &part_path)?,
                    other => return Err(ctx.refuse_value(&part_path.key("type"), other)),
                };
                if !piece.is_empty() {
                    blocks.push(text_block(piece));
                }
            }
        }
        Some(_) => {
            return Err(invalid(
                &content_path,
                "a string, null or an array of content parts",
            ))
        }
    }
    let calls_path = path.key("tool_calls");
    let calls = match message.field("tool_calls") {
        None => &[][..],
        Some(calls) => array(calls, &calls_path)?,
    };
    if calls.is_empty() {
        if let Some(text) = text {
            return Ok(Doc::str(text));
        }
        return Ok(Doc::Array(blocks));
    }
    if let Some(text) = text.filter(|t| !t.is_empty()) {
        blocks.push(text_block(text));
    }
    for (j, call) in calls.iter().enumerate() {
        let call_path = calls_path.at(j);
        if let Some(kind) = opt_str(call, "type", &call_path)? {
            if kind != "function" {
                return Err(ctx.refuse_value(&call_path.key("type"), kind));
            }
        }
        let id = req_str(call, "id", &call_path)?;
        let function_path = call_path.key("function");
        let function = call
            .field("function")
            .filter(|f| f.is_object())
            .ok_or_else(|| invalid(&function_path, "an object"))?;
        let name = req_str(function, "name", &function_path)?;
        let arguments = req_str(function, "arguments", &function_path)?;
        let input = match Doc::parse(arguments.as_bytes()) {
            Ok(input @ Doc::Object(_)) => input,
            _ => {
                return Err(ctx.refuse(
                    &function_path.key("arguments"),
                    " that is not a JSON object",
                ))
            }
        };
        blocks.push(Doc::object([
            ("type", Doc::str("tool_use")),
            ("id", Doc::str(id)),
            ("name", Doc::str(name)),
            ("input", input),
        ]));
    }
    Ok(Doc::Array(blocks))
}

fn chat_tools<'d>(value: &'d Doc<'d>, ctx: &mut Ctx) -> Result<Vec<Doc<'d>>, Reject> {
    let tools_path = Path::Top("tools");
    let tools = array(value, &tools_path)?;
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let path = tools_path.at(i);
        let kind = req_str(tool, "type", &path)?;
        if kind != "function" {
            return Err(ctx.refuse_value(&path.key("type"), kind));
        }
        let function_path = path.key("function");
        let function = tool
            .field("function")
            .filter(|f| f.is_object())
            .ok_or_else(|| invalid(&function_path, "an object"))?;
        let mut converted = vec![(
            Cow::Borrowed("name"),
            Doc::str(req_str(function, "name", &function_path)?),
        )];
        if let Some(description) = opt_str(function, "description", &function_path)? {
            converted.push((Cow::Borrowed("description"), Doc::str(description)));
        }
        let schema = match function.field("parameters") {
            None => Doc::object([
                ("type", Doc::str("object")),
                ("properties", Doc::Object(Vec::new())),
            ]),
            Some(schema @ Doc::Object(_)) => Doc::Ref(schema),
            Some(_) => {
                return Err(invalid(
                    &function_path.key("parameters"),
                    "a JSON schema object",
                ))
            }
        };
        converted.push((Cow::Borrowed("input_schema"), schema));
        if function.field("strict").is_some() {
            ctx.drop_field("tools[].function.strict");
        }
        out.push(Doc::Object(converted));
    }
    Ok(out)
}

fn chat_tool_choice<'d>(
    value: &'d Doc<'d>,
    ctx: &Ctx,
) -> Result<Vec<(&'static str, Doc<'d>)>, Reject> {
    let path = Path::Top("tool_choice");
    match value {
        Doc::String(mode) => {
            let kind = match mode.as_ref() {
                "auto" => "auto",
                "none" => "none",
                "required" => "any",
                _ => {
                    return Err(invalid(
                        &path,
                        "\"auto\", \"none\", \"required\" or an object",
                    ))
                }
            };
            Ok(vec![("type", Doc::str(kind))])
        }
        Doc::Object(_) => {
            let kind = req_str(value, "type", &path)?;
            if kind != "function" {
                return Err(ctx.refuse_value(&path.key("type"), kind));
            }
            let function = value.field("function").unwrap_or(&Doc::Null);
            let name = req_str(function, "name", &path.key("function"))?;
            Ok(vec![("type", Doc::str("tool")), ("name", Doc::str(name))])
        }
        _ => Err(invalid(&path, "a string or an object")),
    }
}

// ---- Messages → Chat ---------------------------------------------------------------------

fn messages_to_chat(body: &[u8], params: &RequestParams<'_>) -> Result<TranslatedRequest, Reject> {
    let doc = parse_body(body)?;
    let mut ctx = Ctx::new(Wire::Chat);
    let mut system = None;
    let mut messages = None;
    let mut tools = None;
    let mut tool_choice = None;
    let mut parallel_tool_calls = None;
    let mut stop = None;
    let (mut temperature, mut top_p) = (None, None);
    let mut max_tokens = None;
    let mut user = None;
    let mut stream = None;

    for (key, value) in doc.members() {
        if value.is_null() {
            continue;
        }
        let path = Path::Top(key);
        match key {
            "model" => {}
            "max_tokens" => max_tokens = Some(count(value, &path)?),
            "system" => system = Some(messages_system(value, &ctx)?),
            "messages" => messages = Some(messages_turns(value, &mut ctx)?),
            "tools" => tools = Some(messages_tools(value, &ctx)?),
            "tool_choice" => {
                let (choice, parallel) = messages_tool_choice(value, &ctx)?;
                tool_choice = Some(choice);
                parallel_tool_calls = parallel;
            }
            "stop_sequences" => {
                let sequences = array(value, &path)?;
                if !sequences.iter().all(|s| s.as_str().is_some()) {
                    return Err(invalid(&path, "an array of strings"));
                }
                if sequences.len() > 4 {
                    return Err(ctx.refuse(&path, " with more than 4 entries"));
                }
                stop = Some(Doc::Ref(value));
            }
            "temperature" => temperature = Some(number(value, &path)?),
            "top_p" => top_p = Some(number(value, &path)?),
            "metadata" => {
                if !value.is_object() {
                    return Err(invalid(&path, "an object"));
                }
                for (name, member) in value.members() {
                    if member.is_null() {
                        continue;
                    }
                    if name == "user_id" {
                        user = Some(string(member, &path.key("user_id"))?);
                    } else {
                        ctx.drop_field(&format!("metadata.{name}"));
                    }
                }
            }
            "stream" => stream = Some(boolean(value, &path)?),
            "mcp_servers" | "container" => return Err(ctx.refuse(&path, "")),
            // top_k, thinking, service_tier, and whatever else
            _ => ctx.drop_field(key),
        }
    }
    let Some(turns) = messages else {
        return Err(invalid(&Path::Top("messages"), "an array of messages"));
    };

    let mut chat_messages = Vec::with_capacity(turns.len() + 1);
    if let Some(system) = system {
        chat_messages.push(Doc::object([
            ("role", Doc::str("system")),
            ("content", system),
        ]));
    }
    chat_messages.extend(turns);

    let mut out = ObjectOut::with_capacity(body.len() + 64);
    out.member("model", &Doc::str(params.model));
    out.member("messages", &Doc::Array(chat_messages));
    if let Some(cap) = max_tokens {
        let name = if params.max_completion_tokens {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        out.member(name, &Doc::Number(cap.into()));
    }
    if let Some(tools) = tools {
        out.member("tools", &Doc::Array(tools));
    }
    if let Some(choice) = tool_choice {
        out.member("tool_choice", &choice);
    }
    if let Some(parallel) = parallel_tool_calls {
        out.member("parallel_tool_calls", &Doc::Bool(parallel));
    }
    if let Some(stop) = stop {
        out.member("stop", &stop);
    }
    if let Some(t) = temperature {
        out.member("temperature", &t);
    }
    if let Some(p) = top_p {
        out.member("top_p", &p);
    }
    if let Some(user) = user {
        out.member("user", &Doc::str(user));
    }
    if let Some(stream) = stream {
        out.member("stream", &Doc::Bool(stream));
        if stream {
            out.member(
                "stream_options",
                &Doc::object([("include_usage", Doc::Bool(true))]),
            );
        }
    }
    Ok(TranslatedRequest {
        body: out.finish(),
        asked: Asked {
            stream: stream.unwrap_or(false),
            include_usage: true,
        },
        dropped: ctx.dropped,
    })
}

/// The system message's content: a string, one text block as a string, several as text parts.
fn messages_system<'d>(value: &'d Doc<'d>, ctx: &Ctx) -> Result<Doc<'d>, Reject> {
    let path = Path::Top("system");
    match value {
        Doc::String(_) => Ok(Doc::Ref(value)),
        Doc::Array(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (j, block) in blocks.iter().enumerate() {
                let block_path = path.at(j);
                match req_str(block, "type", &block_path)? {
                    "text" => texts.push(req_str(block, "text", &block_path)?),
                    other => return Err(ctx.refuse_value(&block_path.key("type"), other)),
                }
            }
            Ok(match texts.as_slice() {
                [one] => Doc::str(one),
                _ => Doc::Array(texts.into_iter().map(Doc::text).collect()),
            })
        }
        _ => Err(invalid(&path, "a string or an array of text blocks")),
    }
}

/// Messages turns as Chat messages.
fn messages_turns<'d>(value: &'d Doc<'d>, ctx: &mut Ctx) -> Result<Vec<Doc<'d>>, Reject> {
    let messages_path = Path::Top("messages");
    let turns = array(value, &messages_path)?;
    let mut out = Vec::with_capacity(turns.len() + 4);
    for (i, turn) in turns.iter().enumerate() {
        let path = messages_path.at(i);
        if !turn.is_object() {
            return Err(invalid(&path, "an object"));
        }
        let role = req_str(turn, "role", &path)?;
        let content = turn.field("content").unwrap_or(&Doc::Null);
        match (role, content) {
            ("user" | "assistant", Doc::String(_)) => out.push(Doc::object([
                ("role", Doc::str(role)),
                ("content", Doc::Ref(content)),
            ])),
            ("user", Doc::Array(blocks)) => messages_user(&path, blocks, ctx, &mut out)?,
            ("assistant", Doc::Array(blocks)) => out.push(messages_assistant(&path, blocks, ctx)?),
            ("user" | "assistant", _) => {
                return Err(invalid(
                    &path.key("content"),
                    "a string or an array of content blocks",
                ))
            }
            (other, _) => return Err(ctx.refuse_value(&path.key("role"), other)),
        }
    }
    Ok(out)
}

/// A user turn of blocks: its tool results as tool messages, then the rest as a user message.
fn messages_user<'d>(
    path: &Path<'_>,
    blocks: &'d [Doc<'d>],
    ctx: &mut Ctx,
    out: &mut Vec<Doc<'d>>,
) -> Result<(), Reject> {
    let content_path = path.key("content");
    let mut parts = Vec::with_capacity(blocks.len());
    let mut results = 0;
    for (j, block) in blocks.iter().enumerate() {
        let block_path = content_path.at(j);
        match req_str(block, "type", &block_path)? {
            "text" => parts.push(Doc::text(req_str(block, "text", &block_path)?)),
            "image" => {
                let source_path = block_path.key("source");
                let source = block.field("source").unwrap_or(&Doc::Null);
                let url = match req_str(source, "type", &source_path)? {
                    "base64" => {
                        let media = req_str(source, "media_type", &source_path)?;
                        let data = req_str(source, "data", &source_path)?;
                        Doc::String(Cow::Owned(format!("data:{media};base64,{data}")))
                    }
                    "url" => Doc::str(req_str(source, "url", &source_path)?),
                    other => return Err(ctx.refuse_value(&source_path.key("type"), other)),
                };
                parts.push(Doc::object([
                    ("type", Doc::str("image_url")),
                    ("image_url", Doc::object([("url", url)])),
                ]));
            }
            "tool_result" => {
                out.push(tool_message(&block_path, block, ctx)?);
                results += 1;
            }
            other => return Err(ctx.refuse_value(&block_path.key("type"), other)),
        }
    }
    if !parts.is_empty() || results == 0 {
        out.push(Doc::object([
            ("role", Doc::str("user")),
            ("content", Doc::Array(parts)),
        ]));
    }
    Ok(())
}

/// A `tool_result` block as a Chat tool message.
fn tool_message<'d>(path: &Path<'_>, block: &'d Doc<'d>, ctx: &mut Ctx) -> Result<Doc<'d>, Reject> {
    let id = req_str(block, "tool_use_id", path)?;
    if block.field("is_error").and_then(Doc::as_bool) == Some(true) {
        ctx.drop_field("messages[].content[].is_error");
    }
    let content_path = path.key("content");
    let content = match block.field("content") {
        None => Doc::str(""),
        Some(text @ Doc::String(_)) => Doc::Ref(text),
        Some(Doc::Array(inner)) => {
            let mut texts = Vec::with_capacity(inner.len());
            for (k, item) in inner.iter().enumerate() {
                let item_path = content_path.at(k);
                match req_str(item, "type", &item_path)? {
                    "text" => texts.push(req_str(item, "text", &item_path)?),
                    other => return Err(ctx.refuse_value(&item_path.key("type"), other)),
                }
            }
            match texts.as_slice() {
                [one] => Doc::str(one),
                _ => Doc::String(Cow::Owned(texts.join("\n"))),
            }
        }
        Some(_) => {
            return Err(invalid(
                &content_path,
                "a string or an array of content blocks",
            ))
        }
    };
    Ok(Doc::object([
        ("role", Doc::str("tool")),
        ("tool_call_id", Doc::str(id)),
        ("content", content),
    ]))
}

/// An assistant turn of blocks: texts concatenated, tool uses as tool calls.
fn messages_assistant<'d>(
    path: &Path<'_>,
    blocks: &'d [Doc<'d>],
    ctx: &mut Ctx,
) -> Result<Doc<'d>, Reject> {
    let content_path = path.key("content");
    let mut texts: Vec<&str> = Vec::new();
    let mut calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let block_path = content_path.at(j);
        match req_str(block, "type", &block_path)? {
            "text" => texts.push(req_str(block, "text", &block_path)?),
            "tool_use" => {
                let id = req_str(block, "id", &block_path)?;
                let name = req_str(block, "name", &block_path)?;
                let arguments = match block.field("input") {
                    Some(input) => input.to_json(),
                    None => "{}".to_string(),
                };
                calls.push(Doc::object([
                    ("id", Doc::str(id)),
                    ("type", Doc::str("function")),
                    (
                        "function",
                        Doc::object([
                            ("name", Doc::str(name)),
                            ("arguments", Doc::String(Cow::Owned(arguments))),
                        ]),
                    ),
                ]));
            }
            "thinking" => ctx.drop_field("messages[].content[].thinking"),
            "redacted_thinking" => ctx.drop_field("messages[].content[].redacted_thinking"),
            other => return Err(ctx.refuse_value(&block_path.key("type"), other)),
        }
    }
    let content = match texts.as_slice() {
        [] if !calls.is_empty() => Doc::Null,
        [one] => Doc::str(one),
        _ => Doc::String(Cow::Owned(texts.concat())),
    };
    let mut message = vec![
        (Cow::Borrowed("role"), Doc::str("assistant")),
        (Cow::Borrowed("content"), content),
    ];
    if !calls.is_empty() {
        message.push((Cow::Borrowed("tool_calls"), Doc::Array(calls)));
    }
    Ok(Doc::Object(message))
}

fn messages_tools<'d>(value: &'d Doc<'d>, ctx: &Ctx) -> Result<Vec<Doc<'d>>, Reject> {
    let tools_path = Path::Top("tools");
    let tools = array(value, &tools_path)?;
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let path = tools_path.at(i);
        if let Some(kind) = opt_str(tool, "type", &path)? {
            if kind != "custom" {
                return Err(ctx.refuse_value(&path.key("type"), kind));
            }
        }
        let mut function = vec![(
            Cow::Borrowed("name"),
            Doc::str(req_str(tool, "name", &path)?),
        )];
        if let Some(description) = opt_str(tool, "description", &path)? {
            function.push((Cow::Borrowed("description"), Doc::str(description)));
        }
        match tool.field("input_schema") {
            None => {}
            Some(schema @ Doc::Object(_)) => {
                function.push((Cow::Borrowed("parameters"), Doc::Ref(schema)));
            }
            Some(_) => return Err(invalid(&path.key("input_schema"), "a JSON schema object")),
        }
        out.push(Doc::object([
            ("type", Doc::str("function")),
            ("function", Doc::Object(function)),
        ]));
    }
    Ok(out)
}

/// `tool_choice` and, from `disable_parallel_tool_use`, `parallel_tool_calls`.
fn messages_tool_choice<'d>(
    value: &'d Doc<'d>,
    ctx: &Ctx,
) -> Result<(Doc<'d>, Option<bool>), Reject> {
    let path = Path::Top("tool_choice");
    if !value.is_object() {
        return Err(invalid(&path, "an object"));
    }
    let kind = req_str(value, "type", &path)?;
    let choice = match kind {
        "auto" => Doc::str("auto"),
        "any" => Doc::str("required"),
        "none" => Doc::str("none"),
        "tool" => {
            let name = req_str(value, "name", &path)?;
            Doc::object([
                ("type", Doc::str("function")),
                ("function", Doc::object([("name", Doc::str(name))])),
            ])
        }
        other => return Err(ctx.refuse_value(&path.key("type"), other)),
    };
    let disable = match value.field("disable_parallel_tool_use") {
        None => false,
        Some(v) => boolean(v, &path.key("disable_parallel_tool_use"))?,
    };
    let parallel = (disable && kind != "none").then_some(false);
    Ok((choice, parallel))
}

#[cfg(test)]
mod tests;
