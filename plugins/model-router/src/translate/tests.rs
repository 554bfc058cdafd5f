//! Properties of the translation as a whole: request and response round trips, streams that
//! do not depend on their chunks and say what the JSON response says, and no input that
//! panics. The per-rule tables are beside each part (`request/tests.rs`, `stream/tests.rs`,
//! and the `tests` modules of `response.rs` and `error.rs`).
#![cfg(not(target_arch = "wasm32"))]

use super::*;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

const PARAMS: RequestParams<'static> = RequestParams {
    model: "deployed",
    default_max_tokens: 777,
    max_completion_tokens: true,
};

const CREATED: ResponseParams = ResponseParams {
    created: 1_750_000_000,
};

// ---- generators ----------------------------------------------------------------------------

/// Text with what needs escaping: quotes, backslashes, newlines, non-ASCII.
fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 .,!?é\"\\\\\n😀]{1,10}"
}

fn name() -> impl Strategy<Value = String> {
    "[a-z_]{1,8}"
}

/// A tool call's input: a small JSON object.
fn args() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(
        "[a-d]{1,3}",
        prop_oneof![
            any::<u8>().prop_map(|n| json!(n)),
            text().prop_map(Value::String),
            any::<bool>().prop_map(Value::Bool),
            prop::collection::vec(any::<u8>(), 0..3).prop_map(|v| json!(v)),
        ],
        0..3,
    )
    .prop_map(|map| Value::Object(map.into_iter().collect()))
}

fn schema() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(name(), Just(json!({"type": "string"})), 0..3)
        .prop_map(|props| json!({"type": "object", "properties": props}))
}

/// A fraction in tenths, exact through JSON.
fn tenths() -> impl Strategy<Value = f64> {
    (0u8..=10).prop_map(|t| f64::from(t) / 10.0)
}

#[derive(Debug, Clone)]
enum Part {
    Text(String),
    Data(String, String),
    Url(String),
}

fn part() -> impl Strategy<Value = Part> {
    prop_oneof![
        3 => text().prop_map(Part::Text),
        1 => (prop::sample::select(vec!["image/png", "image/jpeg"]), "[A-Za-z0-9+/]{1,12}=?")
            .prop_map(|(media, data)| Part::Data(media.to_string(), data)),
        1 => "[a-z]{1,8}".prop_map(|p| Part::Url(format!("https://example.com/{p}.png"))),
    ]
}

fn chat_part(part: &Part) -> Value {
    match part {
        Part::Text(t) => json!({"type": "text", "text": t}),
        Part::Data(media, data) => {
            json!({"type": "image_url", "image_url": {"url": format!("data:{media};base64,{data}")}})
        }
        Part::Url(url) => json!({"type": "image_url", "image_url": {"url": url}}),
    }
}

fn messages_part(part: &Part) -> Value {
    match part {
        Part::Text(t) => json!({"type": "text", "text": t}),
        Part::Data(media, data) => {
            json!({"type": "image", "source": {"type": "base64", "media_type": media, "data": data}})
        }
        Part::Url(url) => json!({"type": "image", "source": {"type": "url", "url": url}}),
    }
}

/// A piece of a Chat conversation.
#[derive(Debug, Clone)]
enum Seg {
    System {
        text: String,
        parts: bool,
        developer: bool,
    },
    User {
        parts: Vec<Part>,
        as_string: bool,
    },
    /// An assistant message, and the tool messages answering its calls.
    Assistant {
        text: Option<String>,
        text_as_parts: bool,
        calls: Vec<(String, Value)>,
        results: Vec<(String, bool)>,
    },
}

fn seg() -> impl Strategy<Value = Seg> {
    prop_oneof![
        1 => (text(), any::<bool>(), any::<bool>())
            .prop_map(|(text, parts, developer)| Seg::System { text, parts, developer }),
        3 => (prop::collection::vec(part(), 1..4), any::<bool>())
            .prop_map(|(parts, as_string)| Seg::User { parts, as_string }),
        3 => (
            prop::option::of(text()),
            any::<bool>(),
            prop::collection::vec((name(), args()), 0..3),
            prop::collection::vec((text(), any::<bool>()), 3),
        )
            .prop_map(|(text, text_as_parts, calls, results)| Seg::Assistant {
                text,
                text_as_parts,
                calls,
                results,
            }),
    ]
}

fn chat_messages(segs: &[Seg]) -> Vec<Value> {
    let mut messages = Vec::new();
    let mut next_id = 0;
    for seg in segs {
        match seg {
            Seg::System {
                text,
                parts,
                developer,
            } => {
                let role = if *developer { "developer" } else { "system" };
                let content = if *parts {
                    json!([{"type": "text", "text": text}])
                } else {
                    json!(text)
                };
                messages.push(json!({"role": role, "content": content}));
            }
            Seg::User { parts, as_string } => {
                let content = match (parts.as_slice(), as_string) {
                    ([Part::Text(t)], true) => json!(t),
                    _ => Value::Array(parts.iter().map(chat_part).collect()),
                };
                messages.push(json!({"role": "user", "content": content}));
            }
            Seg::Assistant {
                text,
                text_as_parts,
                calls,
                results,
            } => {
                let mut message = json!({"role": "assistant", "content": match (text, text_as_parts) {
                    (None, _) => Value::Null,
                    (Some(t), false) => json!(t),
                    (Some(t), true) => json!([{"type": "text", "text": t}]),
                }});
                let mut ids = Vec::new();
                if !calls.is_empty() {
                    let calls: Vec<Value> = calls
                        .iter()
                        .map(|(name, args)| {
                            next_id += 1;
                            ids.push(format!("call_{next_id}"));
                            json!({"id": format!("call_{next_id}"), "type": "function",
                                   "function": {"name": name, "arguments": args.to_string()}})
                        })
                        .collect();
                    message["tool_calls"] = Value::Array(calls);
                }
                messages.push(message);
                for (id, (result, as_parts)) in ids.iter().zip(results) {
                    let content = if *as_parts {
                        json!([{"type": "text", "text": result}])
                    } else {
                        json!(result)
                    };
                    messages.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
                }
            }
        }
    }
    messages
}

prop_compose! {
    fn chat_request()(
        segs in prop::collection::vec(seg(), 0..7),
        tools in prop::collection::vec((name(), prop::option::of(text()), prop::option::of(schema()), any::<bool>()), 0..3),
        choice in 0u8..6,
        parallel in prop::option::of(any::<bool>()),
        stop in prop::option::of(prop_oneof![text().prop_map(|s| json!(s)), prop::collection::vec(text(), 1..=4).prop_map(|v| json!(v))]),
        temperature in prop::option::of(tenths()),
        top_p in prop::option::of(tenths()),
        caps in (prop::option::of(1u32..100_000), prop::option::of(1u32..100_000)),
        user in prop::option::of(("[a-z0-9-]{1,10}", any::<bool>())),
        stream in prop::option::of(any::<bool>()),
        include_usage in prop::option::of(any::<bool>()),
    ) -> Value {
        let mut body = json!({"model": "fast", "messages": chat_messages(&segs)});
        if !tools.is_empty() {
            body["tools"] = tools.iter().map(|(name, description, parameters, strict)| {
                let mut function = json!({"name": name});
                if let Some(d) = description { function["description"] = json!(d); }
                if let Some(p) = parameters { function["parameters"] = p.clone(); }
                if *strict { function["strict"] = json!(true); }
                json!({"type": "function", "function": function})
            }).collect();
            let first = &tools[0].0;
            match choice {
                1 => body["tool_choice"] = json!("auto"),
                2 => body["tool_choice"] = json!("none"),
                3 => body["tool_choice"] = json!("required"),
                4 => body["tool_choice"] = json!({"type": "function", "function": {"name": first}}),
                _ => {}
            }
            if let Some(parallel) = parallel { body["parallel_tool_calls"] = json!(parallel); }
        }
        if let Some(stop) = stop { body["stop"] = stop; }
        if let Some(t) = temperature { body["temperature"] = json!(t); }
        if let Some(p) = top_p { body["top_p"] = json!(p); }
        if let Some(c) = caps.0 { body["max_completion_tokens"] = json!(c); }
        if let Some(c) = caps.1 { body["max_tokens"] = json!(c); }
        if let Some((id, safety)) = user {
            body[if safety { "safety_identifier" } else { "user" }] = json!(id);
        }
        if let Some(stream) = stream { body["stream"] = json!(stream); }
        if let Some(include) = include_usage { body["stream_options"] = json!({"include_usage": include}); }
        body
    }
}

#[derive(Debug, Clone)]
struct Exchange {
    user_parts: Vec<Part>,
    user_as_string: bool,
    results: Vec<(String, bool)>,
    assistant_text: Option<String>,
    assistant_as_string: bool,
    calls: Vec<(String, Value)>,
}

fn exchange() -> impl Strategy<Value = Exchange> {
    (
        prop::collection::vec(part(), 0..3),
        any::<bool>(),
        prop::collection::vec((text(), any::<bool>()), 3),
        prop::option::of(text()),
        any::<bool>(),
        prop::collection::vec((name(), args()), 0..3),
    )
        .prop_map(
            |(user_parts, user_as_string, results, assistant_text, assistant_as_string, calls)| {
                Exchange {
                    user_parts,
                    user_as_string,
                    results,
                    assistant_text,
                    assistant_as_string,
                    calls,
                }
            },
        )
}

fn anthropic_messages(exchanges: &[Exchange]) -> Vec<Value> {
    let mut messages = Vec::new();
    let mut open_calls: Vec<String> = Vec::new();
    let mut next_id = 0;
    for ex in exchanges {
        let mut blocks: Vec<Value> = open_calls
            .iter()
            .zip(&ex.results)
            .map(|(id, (result, as_blocks))| {
                let content = if *as_blocks {
                    json!([{"type": "text", "text": result}, {"type": "text", "text": "more"}])
                } else {
                    json!(result)
                };
                json!({"type": "tool_result", "tool_use_id": id, "content": content})
            })
            .collect();
        blocks.extend(ex.user_parts.iter().map(messages_part));
        let content = match (blocks.as_slice(), ex.user_parts.as_slice()) {
            ([], _) => json!("hello"),
            ([_], [Part::Text(t)]) if ex.user_as_string => json!(t),
            _ => Value::Array(blocks),
        };
        messages.push(json!({"role": "user", "content": content}));
        open_calls.clear();
        let mut blocks = Vec::new();
        if let Some(t) = &ex.assistant_text {
            blocks.push(json!({"type": "text", "text": t}));
        }
        for (name, input) in &ex.calls {
            next_id += 1;
            let id = format!("toolu_{next_id}");
            open_calls.push(id.clone());
            blocks.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
        }
        let content = match (&ex.assistant_text, ex.calls.is_empty()) {
            (Some(t), true) if ex.assistant_as_string => json!(t),
            _ => Value::Array(blocks),
        };
        messages.push(json!({"role": "assistant", "content": content}));
    }
    messages
}

prop_compose! {
    fn messages_request()(
        exchanges in prop::collection::vec(exchange(), 0..5),
        system in prop::option::of(prop_oneof![
            text().prop_map(|s| json!(s)),
            prop::collection::vec(text(), 1..3).prop_map(|v| json!(v.iter().map(|t| json!({"type": "text", "text": t})).collect::<Vec<_>>())),
        ]),
        tools in prop::collection::vec((name(), prop::option::of(text()), schema(), any::<bool>()), 0..3),
        choice in 0u8..6,
        disable_parallel in prop::option::of(any::<bool>()),
        stop in prop::option::of(prop::collection::vec(text(), 0..=4)),
        temperature in prop::option::of(tenths()),
        top_p in prop::option::of(tenths()),
        max_tokens in 1u32..100_000,
        user in prop::option::of("[a-z0-9-]{1,10}"),
        stream in prop::option::of(any::<bool>()),
    ) -> Value {
        let mut body = json!({"model": "fast", "max_tokens": max_tokens, "messages": anthropic_messages(&exchanges)});
        if let Some(system) = system { body["system"] = system; }
        if !tools.is_empty() {
            body["tools"] = tools.iter().map(|(name, description, schema, custom)| {
                let mut tool = json!({"name": name, "input_schema": schema});
                if let Some(d) = description { tool["description"] = json!(d); }
                if *custom { tool["type"] = json!("custom"); }
                tool
            }).collect();
            let mut tool_choice = match choice {
                1 => json!({"type": "auto"}),
                2 => json!({"type": "any"}),
                3 => json!({"type": "none"}),
                4 => json!({"type": "tool", "name": tools[0].0}),
                _ => Value::Null,
            };
            if let (Some(disable), Value::Object(map)) = (disable_parallel, &mut tool_choice) {
                map.insert("disable_parallel_tool_use".into(), json!(disable));
            }
            if !tool_choice.is_null() { body["tool_choice"] = tool_choice; }
        }
        if let Some(stop) = stop { body["stop_sequences"] = json!(stop); }
        if let Some(t) = temperature { body["temperature"] = json!(t); }
        if let Some(p) = top_p { body["top_p"] = json!(p); }
        if let Some(user) = user { body["metadata"] = json!({"user_id": user}); }
        if let Some(stream) = stream { body["stream"] = json!(stream); }
        body
    }
}

// ---- what a request means, in either API ---------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Item {
    Text(String),
    Image(String),
    Call(String, String, Value),
    Result(String, String),
}

/// Everything a request says that the translation maps, the same for both APIs.
#[derive(Debug, PartialEq)]
struct Meaning {
    system: Vec<String>,
    turns: Vec<(String, Vec<Item>)>,
    tools: Vec<(String, Option<String>, Value)>,
    tool_choice: Option<String>,
    disable_parallel: bool,
    stop: Vec<String>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    cap: u64,
    user: Option<String>,
    stream: bool,
}

fn s(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_string()
}

fn texts_of(value: &Value) -> Vec<String> {
    match value {
        Value::String(t) => vec![t.clone()],
        Value::Array(parts) => parts.iter().map(|p| s(&p["text"])).collect(),
        _ => vec![],
    }
}

/// Merges consecutive turns of one role; a user turn's tool results first, an assistant's
/// texts as one text before its calls.
fn normalize(turns: Vec<(String, Vec<Item>)>) -> Vec<(String, Vec<Item>)> {
    let mut merged: Vec<(String, Vec<Item>)> = Vec::new();
    for (role, items) in turns {
        match merged.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(items),
            _ => merged.push((role, items)),
        }
    }
    for (role, items) in &mut merged {
        let (mut first, rest): (Vec<Item>, Vec<Item>) = if role == "user" {
            items.drain(..).partition(|i| matches!(i, Item::Result(..)))
        } else {
            let text: String = items
                .iter()
                .filter_map(|i| match i {
                    Item::Text(t) => Some(t.as_str()),
                    _ => None,
                })
                .collect();
            let calls = items
                .drain(..)
                .filter(|i| matches!(i, Item::Call(..)))
                .collect();
            (
                (!text.is_empty())
                    .then_some(Item::Text(text))
                    .into_iter()
                    .collect(),
                calls,
            )
        };
        first.extend(rest);
        *items = first;
    }
    merged
}

fn chat_meaning(body: &Value, default_cap: u64) -> Meaning {
    let mut system = Vec::new();
    let mut turns = Vec::new();
    for message in body["messages"].as_array().unwrap() {
        let role = s(&message["role"]);
        let content = &message["content"];
        match role.as_str() {
            "system" | "developer" => system.extend(texts_of(content)),
            "user" => {
                let items = match content {
                    Value::String(t) => vec![Item::Text(t.clone())],
                    _ => content
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|p| match p["type"].as_str() {
                            Some("text") => Item::Text(s(&p["text"])),
                            _ => Item::Image(s(&p["image_url"]["url"])),
                        })
                        .collect(),
                };
                turns.push(("user".to_string(), items));
            }
            "assistant" => {
                let mut items: Vec<Item> = texts_of(content).into_iter().map(Item::Text).collect();
                for call in message["tool_calls"].as_array().into_iter().flatten() {
                    let args: Value =
                        serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
                            .unwrap();
                    items.push(Item::Call(
                        s(&call["id"]),
                        s(&call["function"]["name"]),
                        args,
                    ));
                }
                turns.push(("assistant".to_string(), items));
            }
            "tool" => turns.push((
                "user".to_string(),
                vec![Item::Result(
                    s(&message["tool_call_id"]),
                    texts_of(content).join("\n"),
                )],
            )),
            other => panic!("role {other}"),
        }
    }
    let tools: Vec<(String, Option<String>, Value)> = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            let f = &t["function"];
            (
                s(&f["name"]),
                f["description"].as_str().map(String::from),
                f.get("parameters")
                    .cloned()
                    .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            )
        })
        .collect();
    let parallel_off = body["parallel_tool_calls"] == json!(false) && !tools.is_empty();
    let mut tool_choice = match &body["tool_choice"] {
        Value::String(mode) if mode == "required" => Some("any".to_string()),
        Value::String(mode) => Some(mode.clone()),
        Value::Object(_) => Some(format!(
            "tool:{}",
            s(&body["tool_choice"]["function"]["name"])
        )),
        _ => None,
    };
    if tool_choice.is_none() && parallel_off {
        tool_choice = Some("auto".into());
    }
    let stop = match &body["stop"] {
        Value::String(t) => vec![t.clone()],
        Value::Array(items) => items.iter().map(s).collect(),
        _ => vec![],
    };
    Meaning {
        system,
        turns: normalize(turns),
        disable_parallel: parallel_off && tool_choice.as_deref() != Some("none"),
        tools,
        tool_choice,
        stop,
        temperature: body["temperature"].as_f64(),
        top_p: body["top_p"].as_f64(),
        cap: body["max_completion_tokens"]
            .as_u64()
            .or(body["max_tokens"].as_u64())
            .unwrap_or(default_cap),
        user: body["user"]
            .as_str()
            .or(body["safety_identifier"].as_str())
            .map(String::from),
        stream: body["stream"] == json!(true),
    }
}

fn messages_meaning(body: &Value) -> Meaning {
    let mut turns = Vec::new();
    for message in body["messages"].as_array().unwrap() {
        let role = s(&message["role"]);
        let items = match &message["content"] {
            Value::String(t) => vec![Item::Text(t.clone())],
            Value::Array(blocks) => blocks
                .iter()
                .filter_map(|b| match b["type"].as_str() {
                    Some("text") => Some(Item::Text(s(&b["text"]))),
                    Some("image") => Some(Item::Image(match b["source"]["type"].as_str() {
                        Some("base64") => format!(
                            "data:{};base64,{}",
                            s(&b["source"]["media_type"]),
                            s(&b["source"]["data"])
                        ),
                        _ => s(&b["source"]["url"]),
                    })),
                    Some("tool_use") => {
                        Some(Item::Call(s(&b["id"]), s(&b["name"]), b["input"].clone()))
                    }
                    Some("tool_result") => Some(Item::Result(
                        s(&b["tool_use_id"]),
                        texts_of(&b["content"]).join("\n"),
                    )),
                    _ => None,
                })
                .collect(),
            _ => panic!("content"),
        };
        turns.push((role, items));
    }
    let tools = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            (
                s(&t["name"]),
                t["description"].as_str().map(String::from),
                t["input_schema"].clone(),
            )
        })
        .collect();
    let tool_choice = match body["tool_choice"]["type"].as_str() {
        Some("tool") => Some(format!("tool:{}", s(&body["tool_choice"]["name"]))),
        other => other.map(String::from),
    };
    Meaning {
        system: texts_of(&body["system"]),
        turns: normalize(turns),
        tools,
        disable_parallel: body["tool_choice"]["disable_parallel_tool_use"] == json!(true)
            && tool_choice.as_deref() != Some("none"),
        tool_choice,
        stop: body["stop_sequences"]
            .as_array()
            .into_iter()
            .flatten()
            .map(s)
            .collect(),
        temperature: body["temperature"].as_f64(),
        top_p: body["top_p"].as_f64(),
        cap: body["max_tokens"].as_u64().unwrap(),
        user: body["metadata"]["user_id"].as_str().map(String::from),
        stream: body["stream"] == json!(true),
    }
}

fn translate(from: Wire, to: Wire, body: &Value, params: &RequestParams<'_>) -> TranslatedRequest {
    let raw = serde_json::to_vec(body).unwrap();
    match request(from, to, &raw, params) {
        Ok(out) => out,
        Err(e) => panic!("{}: {}\n{body}", e.code, e.message),
    }
}

fn parse(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Chat → Messages → Chat: every mapped field survives, and the Messages body in the
    /// middle says the same.
    #[test]
    fn chat_requests_round_trip(body in chat_request(), completion_cap in any::<bool>()) {
        let there = translate(Wire::Chat, Wire::Messages, &body, &PARAMS);
        let messages = parse(&there.body);
        prop_assert_eq!(&messages["model"], "deployed");
        let params = RequestParams { max_completion_tokens: completion_cap, ..PARAMS };
        let back = translate(Wire::Messages, Wire::Chat, &messages, &params);
        let chat = parse(&back.body);
        let meaning = chat_meaning(&body, PARAMS.default_max_tokens);
        prop_assert_eq!(&messages_meaning(&messages), &meaning);
        prop_assert_eq!(&chat_meaning(&chat, 0), &meaning);
        prop_assert_eq!(there.asked, Asked {
            stream: meaning.stream,
            include_usage: body["stream_options"]["include_usage"] == json!(true),
        });
        prop_assert_eq!(chat.get("stream_options").is_some(), meaning.stream);
        prop_assert_eq!(chat.get(if completion_cap { "max_tokens" } else { "max_completion_tokens" }), None);
    }

    /// Messages → Chat → Messages likewise.
    #[test]
    fn messages_requests_round_trip(body in messages_request(), completion_cap in any::<bool>()) {
        let params = RequestParams { max_completion_tokens: completion_cap, ..PARAMS };
        let there = translate(Wire::Messages, Wire::Chat, &body, &params);
        let chat = parse(&there.body);
        let back = translate(Wire::Chat, Wire::Messages, &chat, &PARAMS);
        let messages = parse(&back.body);
        let meaning = messages_meaning(&body);
        prop_assert_eq!(&chat_meaning(&chat, 0), &meaning);
        prop_assert_eq!(&messages_meaning(&messages), &meaning);
        prop_assert_eq!(there.asked, Asked { stream: meaning.stream, include_usage: true });
        prop_assert_eq!(back.asked.include_usage, meaning.stream);
        prop_assert!(there.dropped.is_empty() && back.dropped.is_empty(), "{:?} {:?}", there.dropped, back.dropped);
    }
}

// ---- responses -----------------------------------------------------------------------------

/// A model answer, as either API would report it.
#[derive(Debug, Clone)]
struct Answer {
    id: String,
    model: String,
    /// Text in the pieces a stream would send.
    text: Vec<String>,
    /// (name, input, where the input's JSON text is cut into fragments)
    calls: Vec<(String, Value, Vec<usize>)>,
    /// 0 end_turn / stop, 1 max_tokens / length, 2 tool_use / tool_calls, 3 refusal /
    /// content_filter
    stop: usize,
    input: u64,
    output: u64,
    cache_read: u64,
    cache_creation: u64,
}

const STOPS: [(&str, &str); 4] = [
    ("end_turn", "stop"),
    ("max_tokens", "length"),
    ("tool_use", "tool_calls"),
    ("refusal", "content_filter"),
];

prop_compose! {
    fn answer()(
        id in "[a-zA-Z0-9_]{1,12}",
        model in "[a-z0-9.-]{1,12}",
        text in prop::collection::vec(text(), 0..5),
        calls in prop::collection::vec((name(), args(), prop::collection::vec(any::<usize>(), 0..3)), 0..3),
        stop in 0usize..4,
        input in 0u64..1_000_000,
        output in 0u64..1_000_000,
        cache_read in 0u64..1_000_000,
        cache_creation in prop_oneof![Just(0u64), 0u64..1_000_000],
    ) -> Answer {
        Answer { id, model, text, calls, stop, input, output, cache_read, cache_creation }
    }
}

impl Answer {
    fn text(&self) -> String {
        self.text.concat()
    }

    fn call_id(i: usize) -> String {
        format!("call_{i}")
    }

    /// A call's input as JSON text, cut into fragments.
    fn fragments(input: &Value, cuts: &[usize]) -> Vec<String> {
        let text = input.to_string();
        let mut bounds: Vec<usize> = cuts
            .iter()
            .map(|c| {
                let mut at = c % (text.len() + 1);
                while !text.is_char_boundary(at) {
                    at -= 1;
                }
                at
            })
            .collect();
        bounds.push(0);
        bounds.push(text.len());
        bounds.sort_unstable();
        bounds.dedup();
        bounds
            .windows(2)
            .map(|w| text[w[0]..w[1]].to_string())
            .collect()
    }

    fn messages_json(&self) -> Value {
        let mut content = Vec::new();
        if !self.text().is_empty() {
            content.push(json!({"type": "text", "text": self.text()}));
        }
        for (i, (name, input, _)) in self.calls.iter().enumerate() {
            content.push(
                json!({"type": "tool_use", "id": Self::call_id(i), "name": name, "input": input}),
            );
        }
        json!({"id": self.id, "type": "message", "role": "assistant", "model": self.model,
               "content": content, "stop_reason": STOPS[self.stop].0, "stop_sequence": null,
               "usage": {"input_tokens": self.input, "output_tokens": self.output,
                         "cache_read_input_tokens": self.cache_read,
                         "cache_creation_input_tokens": self.cache_creation}})
    }

    fn chat_usage(&self) -> Value {
        let prompt = self.input + self.cache_read + self.cache_creation;
        let mut details = json!({"cached_tokens": self.cache_read});
        if self.cache_creation > 0 {
            details["cache_creation_tokens"] = json!(self.cache_creation);
        }
        json!({"prompt_tokens": prompt, "completion_tokens": self.output,
               "total_tokens": prompt + self.output, "prompt_tokens_details": details})
    }

    fn chat_json(&self) -> Value {
        let mut message = json!({"role": "assistant",
            "content": if self.text().is_empty() { Value::Null } else { json!(self.text()) }});
        if !self.calls.is_empty() {
            message["tool_calls"] = self
                .calls
                .iter()
                .enumerate()
                .map(|(i, (name, input, _))| {
                    json!({"id": Self::call_id(i), "type": "function",
                       "function": {"name": name, "arguments": input.to_string()}})
                })
                .collect();
        }
        json!({"id": self.id, "object": "chat.completion", "created": 1, "model": self.model,
               "choices": [{"index": 0, "message": message, "finish_reason": STOPS[self.stop].1}],
               "usage": self.chat_usage()})
    }

    /// The Messages stream of this answer; `pings` sprinkles `ping` events in.
    fn messages_stream(&self, pings: bool) -> String {
        let mut events = vec![(
            "message_start",
            json!({"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "content": [], "model": self.model,
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.input, "output_tokens": 1,
                      "cache_read_input_tokens": self.cache_read,
                      "cache_creation_input_tokens": self.cache_creation}}}),
        )];
        let mut index = 0;
        if !self.text.is_empty() {
            events.push((
                "content_block_start",
                json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
            ));
            for piece in &self.text {
                if pings {
                    events.push(("ping", json!({"type": "ping"})));
                }
                events.push((
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": piece}}),
                ));
            }
            events.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": 0}),
            ));
            index = 1;
        }
        for (i, (name, input, cuts)) in self.calls.iter().enumerate() {
            events.push(("content_block_start", json!({"type": "content_block_start", "index": index,
                "content_block": {"type": "tool_use", "id": Self::call_id(i), "name": name, "input": {}}})));
            for fragment in Self::fragments(input, cuts) {
                events.push((
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": fragment}}),
                ));
            }
            events.push((
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
            index += 1;
        }
        events.push((
            "message_delta",
            json!({"type": "message_delta",
            "delta": {"stop_reason": STOPS[self.stop].0, "stop_sequence": null},
            "usage": {"output_tokens": self.output}}),
        ));
        events.push(("message_stop", json!({"type": "message_stop"})));
        events
            .iter()
            .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
            .collect()
    }

    /// The Chat stream of this answer, with or without the usage chunk.
    fn chat_stream(&self, usage: bool) -> String {
        let chunk = |delta: Value, finish: Value| {
            json!({"id": self.id, "object": "chat.completion.chunk", "created": 1, "model": self.model,
                   "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
        };
        let mut events = vec![chunk(
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        )];
        for piece in &self.text {
            events.push(chunk(json!({"content": piece}), Value::Null));
        }
        for (i, (name, input, cuts)) in self.calls.iter().enumerate() {
            events.push(chunk(
                json!({"tool_calls": [{"index": i, "id": Self::call_id(i), "type": "function",
                "function": {"name": name, "arguments": ""}}]}),
                Value::Null,
            ));
            for fragment in Self::fragments(input, cuts) {
                events.push(chunk(
                    json!({"tool_calls": [{"index": i, "function": {"arguments": fragment}}]}),
                    Value::Null,
                ));
            }
        }
        events.push(chunk(json!({}), json!(STOPS[self.stop].1)));
        if usage {
            events.push(
                json!({"id": self.id, "object": "chat.completion.chunk", "created": 1,
                               "model": self.model, "choices": [], "usage": self.chat_usage()}),
            );
        }
        let mut out: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        out.push_str("data: [DONE]\n\n");
        out
    }
}

/// The data of every event of a translated stream.
fn datas(stream: &[u8]) -> Vec<(Option<String>, String)> {
    let text = std::str::from_utf8(stream).unwrap();
    assert!(text.ends_with("\n\n") || text.is_empty(), "{text}");
    text.split_terminator("\n\n")
        .map(|event| {
            let (name, data) = match event.strip_prefix("event: ") {
                Some(rest) => {
                    let (name, data) = rest.split_once('\n').unwrap();
                    (Some(name.to_string()), data)
                }
                None => (None, event),
            };
            (name, data.strip_prefix("data: ").unwrap().to_string())
        })
        .collect()
}

/// What a Chat SDK accumulates from a stream: a `chat.completion`-like value.
fn accumulate_chat(stream: &[u8]) -> Value {
    let mut content = String::new();
    let mut calls: Vec<(String, String, String)> = Vec::new();
    let mut finish = Value::Null;
    let mut usage = Value::Null;
    let mut ids = std::collections::BTreeSet::new();
    let events = datas(stream);
    assert_eq!(events.last().map(|e| e.1.as_str()), Some("[DONE]"));
    for (name, data) in &events[..events.len() - 1] {
        assert!(name.is_none());
        let chunk: Value = serde_json::from_str(data).unwrap();
        ids.insert((
            s(&chunk["id"]),
            chunk["created"].as_u64(),
            s(&chunk["model"]),
        ));
        assert_eq!(chunk["object"], "chat.completion.chunk");
        if let Some(u) = chunk.get("usage") {
            assert_eq!(chunk["choices"], json!([]));
            usage = u.clone();
            continue;
        }
        let choice = &chunk["choices"][0];
        let delta = &choice["delta"];
        content.push_str(delta["content"].as_str().unwrap_or(""));
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap() as usize;
            if index == calls.len() {
                calls.push((s(&call["id"]), s(&call["function"]["name"]), String::new()));
            }
            calls[index]
                .2
                .push_str(call["function"]["arguments"].as_str().unwrap());
        }
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
    }
    assert_eq!(
        ids.len(),
        1,
        "every chunk has the same id, created and model"
    );
    let (id, created, model) = ids.into_iter().next().unwrap();
    let mut message = json!({"role": "assistant",
        "content": if content.is_empty() { Value::Null } else { json!(content) }, "refusal": null});
    if !calls.is_empty() {
        message["tool_calls"] = calls.into_iter().map(|(id, name, arguments)| {
            json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
        }).collect();
    }
    let mut out = json!({"id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}]});
    if !usage.is_null() {
        out["usage"] = usage;
    }
    out
}

/// What the Anthropic SDK's accumulator builds from a stream: a `message`-like value.
fn accumulate_messages(stream: &[u8]) -> Value {
    let mut message = Value::Null;
    let mut partial: Vec<String> = Vec::new();
    let mut open: Option<usize> = None;
    let mut stopped = false;
    for (name, data) in datas(stream) {
        let event: Value = serde_json::from_str(&data).unwrap();
        assert_eq!(name.as_deref(), event["type"].as_str());
        assert!(!stopped);
        match event["type"].as_str().unwrap() {
            "message_start" => {
                assert!(message.is_null());
                message = event["message"].clone();
            }
            "content_block_start" => {
                assert_eq!(open, None);
                let index = event["index"].as_u64().unwrap() as usize;
                let blocks = message["content"].as_array_mut().unwrap();
                assert_eq!(index, blocks.len(), "indexes in order");
                blocks.push(event["content_block"].clone());
                partial.push(String::new());
                open = Some(index);
            }
            "content_block_delta" => {
                let index = event["index"].as_u64().unwrap() as usize;
                assert_eq!(open, Some(index));
                let delta = &event["delta"];
                match delta["type"].as_str().unwrap() {
                    "text_delta" => {
                        let block = &mut message["content"][index];
                        let text = format!("{}{}", s(&block["text"]), s(&delta["text"]));
                        block["text"] = json!(text);
                    }
                    "input_json_delta" => {
                        partial[index].push_str(delta["partial_json"].as_str().unwrap())
                    }
                    other => panic!("{other}"),
                }
            }
            "content_block_stop" => {
                let index = event["index"].as_u64().unwrap() as usize;
                assert_eq!(open.take(), Some(index));
                let block = &mut message["content"][index];
                if block["type"] == "tool_use" && !partial[index].is_empty() {
                    block["input"] = serde_json::from_str(&partial[index]).unwrap();
                }
            }
            "message_delta" => {
                assert_eq!(open, None);
                message["stop_reason"] = event["delta"]["stop_reason"].clone();
                message["stop_sequence"] = event["delta"]["stop_sequence"].clone();
                for (k, v) in event["usage"].as_object().unwrap() {
                    message["usage"][k] = v.clone();
                }
            }
            "message_stop" => stopped = true,
            other => panic!("{other}"),
        }
    }
    assert!(stopped);
    message
}

fn stream_through(
    from: Wire,
    to: Wire,
    asked: Asked,
    input: &[u8],
    cuts: &[usize],
) -> (Vec<u8>, StreamTranslator) {
    stream_with(from, to, asked, input, cuts, true)
}

/// The events of a translated stream, each parsed (the fast paths copy a string's escapes as
/// the provider wrote them, the slow path writes its own).
fn parsed_events(stream: &[u8]) -> Vec<(Option<String>, Value)> {
    datas(stream)
        .into_iter()
        .map(|(name, data)| {
            (
                name,
                serde_json::from_str(&data).unwrap_or(Value::String(data)),
            )
        })
        .collect()
}

fn stream_with(
    from: Wire,
    to: Wire,
    asked: Asked,
    input: &[u8],
    cuts: &[usize],
    fast: bool,
) -> (Vec<u8>, StreamTranslator) {
    let mut translator =
        StreamTranslator::with_options(from, to, asked, CREATED, stream::MAX_EVENT_BYTES, fast);
    let mut out = Vec::new();
    let mut at = 0;
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    cuts.sort_unstable();
    for cut in cuts {
        translator.push(&input[at..cut], &mut out);
        at = cut;
    }
    translator.push(&input[at..], &mut out);
    translator.finish(&mut out);
    (out, translator)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Usage, text, tool calls and the stop reason survive Messages → Chat → Messages.
    #[test]
    fn messages_responses_round_trip(answer in answer()) {
        let original = answer.messages_json();
        let chat = response(Wire::Messages, Wire::Chat, &serde_json::to_vec(&original).unwrap(), &CREATED).unwrap();
        let chat = parse(&chat);
        prop_assert_eq!(&chat["usage"], &answer.chat_usage());
        prop_assert_eq!(&chat["created"], &json!(CREATED.created));
        let back = response(Wire::Chat, Wire::Messages, &serde_json::to_vec(&chat).unwrap(), &CREATED).unwrap();
        prop_assert_eq!(parse(&back), original);
    }

    /// Usage (exactly), text, tool calls and the finish reason survive Chat → Messages → Chat.
    #[test]
    fn chat_responses_round_trip(answer in answer()) {
        let original = answer.chat_json();
        let messages = response(Wire::Chat, Wire::Messages, &serde_json::to_vec(&original).unwrap(), &CREATED).unwrap();
        let messages = parse(&messages);
        prop_assert_eq!(&messages, &answer.messages_json());
        let back = parse(&response(Wire::Messages, Wire::Chat, &serde_json::to_vec(&messages).unwrap(), &CREATED).unwrap());
        prop_assert_eq!(&back["usage"], &original["usage"]);
        prop_assert_eq!(&back["choices"][0]["message"]["content"], &original["choices"][0]["message"]["content"]);
        prop_assert_eq!(&back["choices"][0]["message"]["tool_calls"], &original["choices"][0]["message"]["tool_calls"]);
        prop_assert_eq!(&back["choices"][0]["finish_reason"], &original["choices"][0]["finish_reason"]);
    }

    /// A Messages stream: the same output for every cut; what a Chat SDK accumulates is the
    /// translated JSON response.
    #[test]
    fn messages_streams_say_what_the_response_says(
        answer in answer(),
        pings in any::<bool>(),
        crlf in any::<bool>(),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        let mut input = answer.messages_stream(pings);
        if crlf {
            input = input.replace('\n', "\r\n");
        }
        let asked = Asked { stream: true, include_usage: true };
        let (whole, translator) = stream_through(Wire::Messages, Wire::Chat, asked, input.as_bytes(), &[]);
        prop_assert!(translator.finished() && !translator.failed());
        prop_assert_eq!(translator.skipped(), 0);
        let (split, _) = stream_through(Wire::Messages, Wire::Chat, asked, input.as_bytes(), &cuts);
        prop_assert_eq!(&split, &whole);
        let (slow, _) = stream_with(Wire::Messages, Wire::Chat, asked, input.as_bytes(), &cuts, false);
        prop_assert_eq!(parsed_events(&slow), parsed_events(&whole));
        let json = response(Wire::Messages, Wire::Chat, &serde_json::to_vec(&answer.messages_json()).unwrap(), &CREATED).unwrap();
        prop_assert_eq!(accumulate_chat(&whole), parse(&json));
    }

    /// A Chat stream: the same output for every cut; what the Anthropic SDK accumulates is the
    /// translated JSON response (the usage only when the stream reported it).
    #[test]
    fn chat_streams_say_what_the_response_says(
        answer in answer(),
        usage in any::<bool>(),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        let input = answer.chat_stream(usage);
        let asked = Asked { stream: true, include_usage: true };
        let (whole, translator) = stream_through(Wire::Chat, Wire::Messages, asked, input.as_bytes(), &[]);
        prop_assert!(translator.finished() && !translator.failed());
        let (split, _) = stream_through(Wire::Chat, Wire::Messages, asked, input.as_bytes(), &cuts);
        prop_assert_eq!(&split, &whole);
        let (slow, _) = stream_with(Wire::Chat, Wire::Messages, asked, input.as_bytes(), &cuts, false);
        prop_assert_eq!(parsed_events(&slow), parsed_events(&whole));
        let mut streamed = accumulate_messages(&whole);
        let mut json = parse(&response(Wire::Chat, Wire::Messages, &serde_json::to_vec(&answer.chat_json()).unwrap(), &CREATED).unwrap());
        if !usage {
            prop_assert_eq!(&streamed["usage"], &json!({"input_tokens": 0, "output_tokens": 0}));
            streamed["usage"] = Value::Null;
            json["usage"] = Value::Null;
        }
        prop_assert_eq!(streamed, json);
    }
}

// ---- no input panics -----------------------------------------------------------------------

/// JSON built from the two APIs' member names, nested: deeper than random bytes get.
fn arb_json() -> impl Strategy<Value = Value> {
    let names = prop::sample::select(vec![
        "model",
        "messages",
        "role",
        "content",
        "type",
        "text",
        "image_url",
        "url",
        "source",
        "data",
        "media_type",
        "tool_calls",
        "tool_call_id",
        "function",
        "name",
        "arguments",
        "input",
        "id",
        "tools",
        "tool_choice",
        "parameters",
        "input_schema",
        "stop",
        "stop_sequences",
        "system",
        "max_tokens",
        "n",
        "stream",
        "stream_options",
        "include_usage",
        "usage",
        "choices",
        "delta",
        "index",
        "finish_reason",
        "stop_reason",
        "error",
        "message",
        "tool_use_id",
        "partial_json",
        "content_block",
        "prompt_tokens",
        "input_tokens",
        "metadata",
        "user_id",
        "detail",
    ]);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        prop::sample::select(vec![
            "user",
            "assistant",
            "system",
            "tool",
            "developer",
            "function",
            "text",
            "image_url",
            "image",
            "tool_use",
            "tool_result",
            "function",
            "auto",
            "any",
            "none",
            "required",
            "base64",
            "data:image/png;base64,AA",
            "https://x",
            "{}",
            "{\"a\":1}",
            "message_start",
            "content_block_start",
            "content_block_delta",
            "text_delta",
            "input_json_delta",
            "message_delta",
            "message_stop",
            "error",
            "stop",
            "tool_calls",
            "",
        ])
        .prop_map(|s| json!(s)),
        ".{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((names.clone(), inner), 0..6).prop_map(|members| Value::Object(
                members
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect::<Map<_, _>>()
            )),
        ]
    })
}

const WIRES: [Wire; 2] = [Wire::Chat, Wire::Messages];

/// Every entry point, every direction, on `bytes`: it must not panic, and what it gives must
/// hold together.
fn feed_everything(bytes: &[u8], cuts: &[usize], status: u16) {
    for from in WIRES {
        for to in WIRES {
            if let Ok(out) = request(from, to, bytes, &PARAMS) {
                if from != to {
                    parse(&out.body);
                    // our own output is never malformed input for the way back
                    if let Err(back) = request(to, from, &out.body, &PARAMS) {
                        assert_ne!(back.code, "invalid_request_body", "{}", back.message);
                    }
                }
            }
            if let Ok(out) = response(from, to, bytes, &CREATED) {
                if from != to {
                    parse(&out);
                    response(to, from, &out, &CREATED).unwrap();
                }
            }
            let out = error(from, to, status, bytes);
            let value = parse(&out);
            // both shapes hold `error.message` and `error.type`
            assert!(value["error"]["message"].is_string(), "{value}");
            assert!(value["error"]["type"].is_string(), "{value}");
            assert_eq!(error(to, to, status, &out), out);
            let (whole, translator) = stream_through(
                from,
                to,
                Asked {
                    stream: true,
                    include_usage: true,
                },
                bytes,
                &[],
            );
            let (split, other) = stream_through(
                from,
                to,
                Asked {
                    stream: true,
                    include_usage: true,
                },
                bytes,
                cuts,
            );
            assert_eq!(split, whole);
            assert_eq!(other.skipped(), translator.skipped());
            assert!(translator.finished() || translator.failed());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn no_bytes_panic(bytes in prop::collection::vec(any::<u8>(), 0..300), cuts in prop::collection::vec(any::<usize>(), 0..5), status in any::<u16>()) {
        feed_everything(&bytes, &cuts, status);
    }

    #[test]
    fn no_json_panics(value in arb_json(), cuts in prop::collection::vec(any::<usize>(), 0..5), status in 100u16..600) {
        let bytes = serde_json::to_vec(&value).unwrap();
        feed_everything(&bytes, &cuts, status);
        // the same JSON as stream events, under both APIs' framing
        let as_events = format!("data: {value}\n\nevent: x\ndata: {value}\n\n");
        feed_everything(as_events.as_bytes(), &cuts, status);
    }

    /// Generated streams with events dropped, repeated or corrupted: no panic, output
    /// independent of the cuts, and valid events out.
    #[test]
    fn mangled_streams_do_not_panic(
        answer in answer(),
        chat in any::<bool>(),
        edits in prop::collection::vec((any::<usize>(), 0u8..4), 0..6),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        let input = if chat { answer.chat_stream(true) } else { answer.messages_stream(false) };
        let mut events: Vec<String> = input.split_terminator("\n\n").map(|e| format!("{e}\n\n")).collect();
        for (at, edit) in edits {
            if events.is_empty() { break; }
            let at = at % events.len();
            match edit {
                0 => { events.remove(at); }
                1 => { let e = events[at].clone(); events.insert(at, e); }
                2 => { let mut cut = events[at].len() / 2; while !events[at].is_char_boundary(cut) { cut -= 1; } events[at].replace_range(cut.., "\n\n"); }
                _ => { let len = events.len(); events.swap(at, (at + 1) % len); }
            }
        }
        let input = events.concat();
        let (from, to) = if chat { (Wire::Chat, Wire::Messages) } else { (Wire::Messages, Wire::Chat) };
        let asked = Asked { stream: true, include_usage: true };
        let (whole, translator) = stream_through(from, to, asked, input.as_bytes(), &[]);
        let (split, _) = stream_through(from, to, asked, input.as_bytes(), &cuts);
        prop_assert_eq!(&split, &whole);
        // the fast paths (walk, template) mean what the slow path (serde_json) means
        let (slow, slow_translator) = stream_with(from, to, asked, input.as_bytes(), &[], false);
        prop_assert_eq!(parsed_events(&slow), parsed_events(&whole));
        prop_assert_eq!(slow_translator.skipped(), translator.skipped());
        prop_assert!(translator.finished() || translator.failed());
        for (_, data) in datas(&whole) {
            prop_assert!(data == "[DONE]" || serde_json::from_str::<Value>(&data).is_ok(), "{}", data);
        }
    }
}
