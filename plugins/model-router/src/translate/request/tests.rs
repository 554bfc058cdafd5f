use super::*;
use serde_json::{json, Value};

const PARAMS: RequestParams<'static> = RequestParams {
    model: "deployed-model",
    default_max_tokens: 4096,
    max_completion_tokens: true,
};

fn translate(from: Wire, to: Wire, body: &Value) -> Result<(Value, Asked, Vec<String>), Reject> {
    let raw = serde_json::to_vec(body).unwrap();
    let out = request(from, to, &raw, &PARAMS)?;
    Ok((
        serde_json::from_slice(&out.body).unwrap(),
        out.asked,
        out.dropped,
    ))
}

fn to_messages(body: Value) -> Value {
    translate(Wire::Chat, Wire::Messages, &body).unwrap().0
}

fn to_chat(body: Value) -> Value {
    translate(Wire::Messages, Wire::Chat, &body).unwrap().0
}

fn refusal(from: Wire, to: Wire, body: Value) -> (String, String) {
    let err = translate(from, to, &body).unwrap_err();
    assert_eq!(err.status, 400);
    (err.code.to_string(), err.message.to_string())
}

fn chat(messages: Value) -> Value {
    json!({"model": "fast", "messages": messages})
}

fn anthropic(messages: Value) -> Value {
    json!({"model": "fast", "max_tokens": 100, "messages": messages})
}

// ---- the same API ---------------------------------------------------------------------------

#[test]
fn the_same_api_only_gets_its_model_replaced() {
    let raw = br#"{"model":"fast","messages":[{"role":"user","content":"hi \u00e9"}],"stream":true,"stream_options":{"include_usage":true},"n":3}"#;
    let out = request(Wire::Chat, Wire::Chat, raw, &PARAMS).unwrap();
    assert_eq!(
        out.body,
        br#"{"model":"deployed-model","messages":[{"role":"user","content":"hi \u00e9"}],"stream":true,"stream_options":{"include_usage":true},"n":3}"#
    );
    assert_eq!(
        out.asked,
        Asked {
            stream: true,
            include_usage: true
        }
    );
    assert!(out.dropped.is_empty());

    let raw = br#"{"messages":[],"max_tokens":5}"#;
    let out = request(Wire::Messages, Wire::Messages, raw, &PARAMS).unwrap();
    assert_eq!(
        out.body,
        br#"{"messages":[],"max_tokens":5,"model":"deployed-model"}"#
    );
    assert_eq!(
        out.asked,
        Asked {
            stream: false,
            include_usage: true
        }
    );

    let out = request(
        Wire::Chat,
        Wire::Chat,
        br#"{"model":"x","stream":true}"#,
        &PARAMS,
    )
    .unwrap();
    assert!(!out.asked.include_usage);
    for api in [Wire::Chat, Wire::Messages] {
        let err = request(api, api, b"{\"model\":", &PARAMS).unwrap_err();
        assert_eq!(
            (err.status, err.code.as_ref()),
            (400, "invalid_request_body")
        );
    }
}

// ---- Chat → Messages ------------------------------------------------------------------------

#[test]
fn chat_system_and_developer_messages_are_hoisted() {
    for (messages, system) in [
        (
            json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]),
            json!("Be brief."),
        ),
        (
            json!([
                {"role": "system", "content": "One."},
                {"role": "user", "content": "hi"},
                {"role": "developer", "content": [{"type": "text", "text": "Two."}, {"type": "text", "text": "Three."}]}
            ]),
            json!([{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}, {"type": "text", "text": "Three."}]),
        ),
        (
            json!([{"role": "developer", "content": [{"type": "text", "text": "Only part."}]}, {"role": "user", "content": "hi"}]),
            json!([{"type": "text", "text": "Only part."}]),
        ),
    ] {
        let out = to_messages(chat(messages.clone()));
        assert_eq!(out["system"], system, "{messages}");
        assert_eq!(out["messages"], json!([{"role": "user", "content": "hi"}]));
    }
    let out = to_messages(chat(json!([{"role": "user", "content": "hi"}])));
    assert!(out.get("system").is_none());
}

#[test]
fn chat_user_content_and_images() {
    let out = translate(
        Wire::Chat,
        Wire::Messages,
        &chat(json!([{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "high"}},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
            {"type": "image_url", "image_url": "HTTP://example.com/dog.jpg"}
        ]}])),
    )
    .unwrap();
    assert_eq!(
        out.0["messages"],
        json!([{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
            {"type": "image", "source": {"type": "url", "url": "HTTP://example.com/dog.jpg"}}
        ]}])
    );
    assert_eq!(out.2, ["messages[].content[].image_url.detail"]);
}

#[test]
fn chat_content_the_model_would_not_see_is_refused() {
    for (part, path) in [
        (
            json!({"type": "input_audio", "input_audio": {"data": "AAA", "format": "wav"}}),
            "`messages[1].content[1].type` \"input_audio\"",
        ),
        (
            json!({"type": "file", "file": {"file_id": "file-1"}}),
            "`messages[1].content[1].type` \"file\"",
        ),
        (
            json!({"type": "image_url", "image_url": {"url": "ftp://example.com/a.png"}}),
            "`messages[1].content[1].image_url.url`",
        ),
        (
            json!({"type": "image_url", "image_url": {"url": "data:image/png,rawbytes"}}),
            "`messages[1].content[1].image_url.url`",
        ),
    ] {
        let body = chat(json!([
            {"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "x"}, part]}
        ]));
        let (code, message) = refusal(Wire::Chat, Wire::Messages, body);
        assert_eq!(code, "unsupported_field");
        assert!(message.starts_with(path), "{message}");
        assert!(
            message.ends_with("cannot be sent to an Anthropic deployment"),
            "{message}"
        );
    }
}

#[test]
fn chat_tool_calls_and_results_become_blocks() {
    let out = to_messages(chat(json!([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
            {"id": "call_2", "type": "function", "function": {"name": "time", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "noon"}]},
        {"role": "user", "content": "thanks"},
        {"role": "user", "content": [{"type": "text", "text": "and tomorrow?"}]},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_3", "type": "function", "function": {"name": "weather", "arguments": "{\"day\":2}"}}
        ]},
        {"role": "tool", "tool_call_id": "call_3", "content": "rain"}
    ])));
    assert_eq!(
        out["messages"],
        json!([
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "call_2", "name": "time", "input": {}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"},
                {"type": "tool_result", "tool_use_id": "call_2", "content": [{"type": "text", "text": "noon"}]},
                {"type": "text", "text": "thanks"},
                {"type": "text", "text": "and tomorrow?"}
            ]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_3", "name": "weather", "input": {"day": 2}}
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_3", "content": "rain"}]}
        ])
    );
}

#[test]
fn chat_assistant_content_forms() {
    for (message, content) in [
        (
            json!({"role": "assistant", "content": "plain"}),
            json!("plain"),
        ),
        (json!({"role": "assistant", "content": ""}), json!("")),
        (json!({"role": "assistant", "content": null}), json!([])),
        (
            json!({"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "no"}]}),
            json!([{"type": "text", "text": "a"}, {"type": "text", "text": "no"}]),
        ),
        (
            json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}),
            json!([{"type": "tool_use", "id": "c", "name": "f", "input": {}}]),
        ),
    ] {
        let out = to_messages(chat(
            json!([{"role": "user", "content": "q"}, message.clone()]),
        ));
        assert_eq!(out["messages"][1]["content"], content, "{message}");
    }
}

#[test]
fn chat_arguments_that_are_not_an_object_are_refused() {
    for arguments in ["[1,2]", "not json", "", "\"s\""] {
        let body = chat(json!([
            {"role": "user", "content": "q"},
            {"role": "assistant", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "f", "arguments": arguments}}
            ]}
        ]));
        let (code, message) = refusal(Wire::Chat, Wire::Messages, body);
        assert_eq!(code, "unsupported_field");
        assert_eq!(
            message,
            "`messages[1].tool_calls[1].function.arguments` that is not a JSON object cannot be sent to an Anthropic deployment"
        );
    }
}

#[test]
fn chat_legacy_and_unknown_roles_are_refused() {
    for (message, start) in [
        (
            json!({"role": "function", "name": "f", "content": "x"}),
            "`messages[1].role` \"function\"",
        ),
        (
            json!({"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}}),
            "`messages[1].function_call`",
        ),
        (
            json!({"role": "critic", "content": "x"}),
            "`messages[1].role` \"critic\"",
        ),
        (
            json!({"role": "assistant", "tool_calls": [{"id": "c", "type": "custom", "custom": {}}]}),
            "`messages[1].tool_calls[0].type` \"custom\"",
        ),
    ] {
        let body = chat(json!([{"role": "user", "content": "q"}, message]));
        let (code, text) = refusal(Wire::Chat, Wire::Messages, body);
        assert_eq!(code, "unsupported_field");
        assert!(text.starts_with(start), "{text}");
    }
    for (key, value) in [
        ("functions", json!([{"name": "f"}])),
        ("function_call", json!("auto")),
    ] {
        let mut body = chat(json!([{"role": "user", "content": "q"}]));
        body[key] = value;
        let (_, text) = refusal(Wire::Chat, Wire::Messages, body);
        assert_eq!(
            text,
            format!("`{key}` cannot be sent to an Anthropic deployment")
        );
    }
}

#[test]
fn chat_message_names_refusals_and_audio_are_dropped() {
    let (out, _, dropped) = translate(
        Wire::Chat,
        Wire::Messages,
        &chat(json!([
            {"role": "user", "name": "ann", "content": "q"},
            {"role": "assistant", "name": "bot", "content": "a", "refusal": null},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "b", "refusal": "no", "audio": {"id": "audio_1"}}
        ])),
    )
    .unwrap();
    assert_eq!(
        dropped,
        ["messages[].name", "messages[].refusal", "messages[].audio"]
    );
    assert_eq!(out["messages"][0], json!({"role": "user", "content": "q"}));
}

#[test]
fn chat_tools_become_messages_tools() {
    let (out, _, dropped) = translate(
        Wire::Chat,
        Wire::Messages,
        &json!({"model": "m", "messages": [], "tools": [
            {"type": "function", "function": {"name": "weather", "description": "Get weather",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
             "strict": true}},
            {"type": "function", "function": {"name": "noop"}}
        ]}),
    )
    .unwrap();
    assert_eq!(
        out["tools"],
        json!([
            {"name": "weather", "description": "Get weather",
             "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
            {"name": "noop", "input_schema": {"type": "object", "properties": {}}}
        ])
    );
    assert_eq!(dropped, ["tools[].function.strict"]);
    let (code, message) = refusal(
        Wire::Chat,
        Wire::Messages,
        json!({"model": "m", "messages": [], "tools": [{"type": "custom", "custom": {"name": "x"}}]}),
    );
    assert_eq!(code, "unsupported_field");
    assert_eq!(
        message,
        "`tools[0].type` \"custom\" cannot be sent to an Anthropic deployment"
    );
}

#[test]
fn chat_tool_choice_and_parallel_tool_calls() {
    let tools = json!([{"type": "function", "function": {"name": "f"}}]);
    for (choice, parallel, expected) in [
        (json!("auto"), None, json!({"type": "auto"})),
        (json!("none"), None, json!({"type": "none"})),
        (json!("required"), None, json!({"type": "any"})),
        (
            json!({"type": "function", "function": {"name": "f"}}),
            None,
            json!({"type": "tool", "name": "f"}),
        ),
        (
            Value::Null,
            Some(false),
            json!({"type": "auto", "disable_parallel_tool_use": true}),
        ),
        (
            json!("required"),
            Some(false),
            json!({"type": "any", "disable_parallel_tool_use": true}),
        ),
        (json!("none"), Some(false), json!({"type": "none"})),
        (json!("auto"), Some(true), json!({"type": "auto"})),
        (Value::Null, Some(true), Value::Null),
    ] {
        let mut body = json!({"model": "m", "messages": [], "tools": tools, "tool_choice": choice});
        if let Some(parallel) = parallel {
            body["parallel_tool_calls"] = json!(parallel);
        }
        let (out, _, dropped) = translate(Wire::Chat, Wire::Messages, &body).unwrap();
        assert_eq!(
            out.get("tool_choice").cloned().unwrap_or(Value::Null),
            expected,
            "{body}"
        );
        assert!(dropped.is_empty(), "{body}");
    }
    // without tools, parallel_tool_calls has nothing to apply to
    let (out, _, dropped) = translate(
        Wire::Chat,
        Wire::Messages,
        &json!({"model": "m", "messages": [], "parallel_tool_calls": false}),
    )
    .unwrap();
    assert!(out.get("tool_choice").is_none());
    assert_eq!(dropped, ["parallel_tool_calls"]);
    for (choice, start) in [
        (
            json!({"type": "allowed_tools", "allowed_tools": {}}),
            "`tool_choice.type` \"allowed_tools\" cannot be sent",
        ),
        (json!("sometimes"), "`tool_choice` must be"),
    ] {
        let body = json!({"model": "m", "messages": [], "tools": tools, "tool_choice": choice});
        let (_, message) = refusal(Wire::Chat, Wire::Messages, body);
        assert!(message.starts_with(start), "{message}");
    }
}

#[test]
fn chat_sampling_caps_user_and_stream() {
    for (extra, expected) in [
        (json!({"stop": "END"}), json!({"stop_sequences": ["END"]})),
        (
            json!({"stop": ["a", "b"]}),
            json!({"stop_sequences": ["a", "b"]}),
        ),
        (json!({"temperature": 0.7}), json!({"temperature": 0.7})),
        (json!({"temperature": 1.5}), json!({"temperature": 1})),
        (json!({"temperature": 2}), json!({"temperature": 1})),
        (json!({"temperature": 0}), json!({"temperature": 0})),
        (json!({"top_p": 0.9}), json!({"top_p": 0.9})),
        (json!({"max_tokens": 10}), json!({"max_tokens": 10})),
        (
            json!({"max_tokens": 10, "max_completion_tokens": 20}),
            json!({"max_tokens": 20}),
        ),
        (json!({}), json!({"max_tokens": 4096})),
        (
            json!({"user": "u1"}),
            json!({"metadata": {"user_id": "u1"}}),
        ),
        (
            json!({"safety_identifier": "s1"}),
            json!({"metadata": {"user_id": "s1"}}),
        ),
        (json!({"stream": true}), json!({"stream": true})),
        (json!({"stream": false}), json!({"stream": false})),
    ] {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "q"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let out = to_messages(body);
        for (k, v) in expected.as_object().unwrap() {
            assert_eq!(&out[k], v, "{extra}");
        }
        assert_eq!(out["model"], "deployed-model");
    }
}

#[test]
fn chat_user_and_safety_identifier_together() {
    let (out, _, dropped) = translate(
        Wire::Chat,
        Wire::Messages,
        &json!({"model": "m", "messages": [], "safety_identifier": "s", "user": "u"}),
    )
    .unwrap();
    assert_eq!(out["metadata"], json!({"user_id": "u"}));
    assert_eq!(dropped, ["safety_identifier"]);
}

#[test]
fn chat_stream_options_go_into_asked() {
    for (extra, asked, dropped) in [
        (json!({}), Asked::default(), vec![]),
        (
            json!({"stream": true}),
            Asked {
                stream: true,
                include_usage: false,
            },
            vec![],
        ),
        (
            json!({"stream": true, "stream_options": {"include_usage": true, "include_obfuscation": false}}),
            Asked {
                stream: true,
                include_usage: true,
            },
            vec!["stream_options.include_obfuscation"],
        ),
    ] {
        let mut body = json!({"model": "m", "messages": []});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (out, got, got_dropped) = translate(Wire::Chat, Wire::Messages, &body).unwrap();
        assert_eq!(got, asked, "{extra}");
        assert_eq!(got_dropped, dropped, "{extra}");
        assert!(out.get("stream_options").is_none());
    }
}

#[test]
fn chat_fields_without_counterpart_are_refused_naming_them() {
    for (field, value, message) in [
        (
            "n",
            json!(2),
            "`n` > 1 cannot be sent to an Anthropic deployment",
        ),
        (
            "logprobs",
            json!(true),
            "`logprobs` cannot be sent to an Anthropic deployment",
        ),
        (
            "top_logprobs",
            json!(3),
            "`top_logprobs` cannot be sent to an Anthropic deployment",
        ),
        (
            "response_format",
            json!({"type": "json_object"}),
            "`response_format.type` \"json_object\" cannot be sent to an Anthropic deployment",
        ),
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
            "`response_format.type` \"json_schema\" cannot be sent to an Anthropic deployment",
        ),
        (
            "audio",
            json!({"voice": "alloy", "format": "mp3"}),
            "`audio` cannot be sent to an Anthropic deployment",
        ),
        (
            "modalities",
            json!(["text", "audio"]),
            "`modalities` with \"audio\" cannot be sent to an Anthropic deployment",
        ),
        (
            "prediction",
            json!({"type": "content", "content": "x"}),
            "`prediction` cannot be sent to an Anthropic deployment",
        ),
    ] {
        let body = json!({"model": "m", "messages": [], field: value});
        let (code, text) = refusal(Wire::Chat, Wire::Messages, body);
        assert_eq!(
            (code.as_str(), text.as_str()),
            ("unsupported_field", message)
        );
    }
    // the harmless values of the same fields
    for (field, value) in [
        ("n", json!(1)),
        ("logprobs", json!(false)),
        ("top_logprobs", json!(null)),
    ] {
        let body = json!({"model": "m", "messages": [], field: value});
        let (_, _, dropped) = translate(Wire::Chat, Wire::Messages, &body).unwrap();
        assert!(dropped.is_empty(), "{field}");
    }
}

#[test]
fn chat_fields_without_counterpart_are_dropped_in_body_order() {
    let raw = br#"{"model":"m","seed":1,"messages":[{"role":"user","name":"x","content":"q"}],
        "frequency_penalty":0.1,"presence_penalty":0.2,"logit_bias":{"1":2},"service_tier":"auto",
        "store":true,"metadata":{"a":"b"},"prompt_cache_key":"k","reasoning_effort":"low",
        "verbosity":"low","web_search_options":{},"response_format":{"type":"text"},
        "modalities":["text"],"brand_new_field":1,"temperature":null}"#;
    let out = request(Wire::Chat, Wire::Messages, raw, &PARAMS).unwrap();
    assert_eq!(
        out.dropped,
        [
            "seed",
            "messages[].name",
            "frequency_penalty",
            "presence_penalty",
            "logit_bias",
            "service_tier",
            "store",
            "metadata",
            "prompt_cache_key",
            "reasoning_effort",
            "verbosity",
            "web_search_options",
            "response_format",
            "modalities",
            "brand_new_field"
        ]
    );
    let body: Value = serde_json::from_slice(&out.body).unwrap();
    assert_eq!(
        body,
        json!({"model": "deployed-model", "max_tokens": 4096,
               "messages": [{"role": "user", "content": "q"}]})
    );
}

#[test]
fn chat_bodies_of_the_wrong_shape_are_invalid() {
    for (raw, message) in [
        (&b"not json"[..], "the body is not valid JSON (line 1, column 2)"),
        (b"", "the body is not valid JSON (line 1, column 0)"),
        (b"[1]", "the body must be a JSON object"),
        (b"{\"model\":\"m\"}", "`messages` must be an array of messages"),
        (b"{\"messages\":{}}", "`messages` must be an array"),
        (b"{\"messages\":[1]}", "`messages[0]` must be an object"),
        (b"{\"messages\":[{\"content\":\"x\"}]}", "`messages[0].role` must be a string"),
        (
            b"{\"messages\":[{\"role\":\"user\",\"content\":5}]}",
            "`messages[0].content` must be a string or an array of content parts",
        ),
        (
            b"{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}",
            "`messages[0].tool_call_id` must be a string",
        ),
        (b"{\"messages\":[],\"temperature\":\"hot\"}", "`temperature` must be a number"),
        (b"{\"messages\":[],\"max_tokens\":-1}", "`max_tokens` must be a non-negative integer"),
        (b"{\"messages\":[],\"stream\":\"yes\"}", "`stream` must be a boolean"),
        (b"{\"messages\":[],\"stop\":[1]}", "`stop` must be a string or an array of strings"),
        (
            b"{\"messages\":[],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]}",
            "`tools[0].function.parameters` must be a JSON schema object",
        ),
    ] {
        let err = request(Wire::Chat, Wire::Messages, raw, &PARAMS).unwrap_err();
        assert_eq!(
            (err.status, err.code.as_ref(), err.message.as_ref()),
            (400, "invalid_request_body", message),
            "{raw:?}"
        );
    }
}

// ---- Messages → Chat ------------------------------------------------------------------------

#[test]
fn messages_system_becomes_the_first_message() {
    for (system, content) in [
        (json!("Be brief."), json!("Be brief.")),
        (
            json!([{"type": "text", "text": "One.", "cache_control": {"type": "ephemeral"}}]),
            json!("One."),
        ),
        (
            json!([{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}]),
            json!([{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}]),
        ),
    ] {
        let mut body = anthropic(json!([{"role": "user", "content": "hi"}]));
        body["system"] = system.clone();
        let (out, _, dropped) = translate(Wire::Messages, Wire::Chat, &body).unwrap();
        assert_eq!(
            out["messages"],
            json!([{"role": "system", "content": content}, {"role": "user", "content": "hi"}]),
            "{system}"
        );
        assert!(dropped.is_empty());
    }
    let mut body = anthropic(json!([]));
    body["system"] = json!([{"type": "image", "source": {}}]);
    let (_, message) = refusal(Wire::Messages, Wire::Chat, body);
    assert_eq!(
        message,
        "`system[0].type` \"image\" cannot be sent to an OpenAI deployment"
    );
}

#[test]
fn messages_user_blocks_become_parts_and_tool_messages() {
    let (out, _, dropped) = translate(
        Wire::Messages,
        Wire::Chat,
        &anthropic(json!([
            {"role": "user", "content": [
                {"type": "text", "text": "Look", "cache_control": {"type": "ephemeral"}},
                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4A=="}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
            ]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "text", "text": "Let me "},
                {"type": "text", "text": "check."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris", "units": ["c"]}},
                {"type": "tool_use", "id": "toolu_2", "name": "time", "input": {}}
            ]},
            {"role": "user", "content": [
                {"type": "text", "text": "also this"},
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
                 "content": [{"type": "text", "text": "no"}, {"type": "text", "text": "clock"}]}
            ]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_3", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_3"}]}
        ])),
    )
    .unwrap();
    assert_eq!(
        out["messages"],
        json!([
            {"role": "user", "content": [
                {"type": "text", "text": "Look"},
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4A=="}},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
            ]},
            {"role": "assistant", "content": "Let me check.", "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\",\"units\":[\"c\"]}"}},
                {"id": "toolu_2", "type": "function", "function": {"name": "time", "arguments": "{}"}}
            ]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "toolu_2", "content": "no\nclock"},
            {"role": "user", "content": [{"type": "text", "text": "also this"}]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "toolu_3", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ]},
            {"role": "tool", "tool_call_id": "toolu_3", "content": ""}
        ])
    );
    // cache_control is dropped without a word: prompt caching is automatic at OpenAI
    assert_eq!(
        dropped,
        [
            "messages[].content[].thinking",
            "messages[].content[].is_error"
        ]
    );
}

#[test]
fn messages_blocks_without_counterpart_are_refused() {
    for (content, message) in [
        (
            json!([{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"}}]),
            "`messages[0].content[0].type` \"document\" cannot be sent to an OpenAI deployment",
        ),
        (
            json!([{"type": "text", "text": "x"}, {"type": "search_result", "source": "s", "title": "t", "content": []}]),
            "`messages[0].content[1].type` \"search_result\" cannot be sent to an OpenAI deployment",
        ),
        (
            json!([{"type": "image", "source": {"type": "file", "file_id": "file_1"}}]),
            "`messages[0].content[0].source.type` \"file\" cannot be sent to an OpenAI deployment",
        ),
        (
            json!([{"type": "tool_result", "tool_use_id": "t", "content": [
                {"type": "text", "text": "see"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]),
            "`messages[0].content[0].content[1].type` \"image\" cannot be sent to an OpenAI deployment",
        ),
    ] {
        let (code, text) = refusal(
            Wire::Messages,
            Wire::Chat,
            anthropic(json!([{"role": "user", "content": content}])),
        );
        assert_eq!((code.as_str(), text.as_str()), ("unsupported_field", message));
    }
    let (_, text) = refusal(
        Wire::Messages,
        Wire::Chat,
        anthropic(
            json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "s", "name": "web_search", "input": {}}]}]),
        ),
    );
    assert_eq!(
        text,
        "`messages[1].content[0].type` \"server_tool_use\" cannot be sent to an OpenAI deployment"
    );
    let (_, text) = refusal(
        Wire::Messages,
        Wire::Chat,
        anthropic(json!([{"role": "system", "content": "q"}])),
    );
    assert_eq!(
        text,
        "`messages[0].role` \"system\" cannot be sent to an OpenAI deployment"
    );
}

#[test]
fn messages_tools_and_tool_choice() {
    let out = to_chat(
        json!({"model": "m", "max_tokens": 1, "messages": [], "tools": [
            {"name": "weather", "description": "Get weather", "input_schema": {"type": "object", "properties": {}},
             "cache_control": {"type": "ephemeral"}},
            {"type": "custom", "name": "other", "input_schema": {"type": "object"}}
        ]}),
    );
    assert_eq!(
        out["tools"],
        json!([
            {"type": "function", "function": {"name": "weather", "description": "Get weather",
             "parameters": {"type": "object", "properties": {}}}},
            {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}
        ])
    );
    for server_tool in [
        "web_search_20250305",
        "bash_20250124",
        "text_editor_20250728",
        "computer_20250124",
    ] {
        let (code, text) = refusal(
            Wire::Messages,
            Wire::Chat,
            json!({"model": "m", "messages": [], "tools": [
                {"name": "ok", "input_schema": {}}, {"type": server_tool, "name": "x"}]}),
        );
        assert_eq!(code, "unsupported_field");
        assert_eq!(
            text,
            format!("`tools[1].type` \"{server_tool}\" cannot be sent to an OpenAI deployment")
        );
    }
    for (choice, expected, parallel) in [
        (json!({"type": "auto"}), json!("auto"), None),
        (json!({"type": "any"}), json!("required"), None),
        (json!({"type": "none"}), json!("none"), None),
        (
            json!({"type": "tool", "name": "weather"}),
            json!({"type": "function", "function": {"name": "weather"}}),
            None,
        ),
        (
            json!({"type": "auto", "disable_parallel_tool_use": true}),
            json!("auto"),
            Some(false),
        ),
        (
            json!({"type": "any", "disable_parallel_tool_use": false}),
            json!("required"),
            None,
        ),
        (
            json!({"type": "none", "disable_parallel_tool_use": true}),
            json!("none"),
            None,
        ),
    ] {
        let out = to_chat(json!({"model": "m", "messages": [], "tool_choice": choice}));
        assert_eq!(out["tool_choice"], expected, "{choice}");
        assert_eq!(
            out.get("parallel_tool_calls").and_then(Value::as_bool),
            parallel,
            "{choice}"
        );
    }
}

#[test]
fn messages_sampling_caps_metadata_and_stream() {
    for (extra, cap_name, expected) in [
        (
            json!({"max_tokens": 100}),
            true,
            json!({"max_completion_tokens": 100}),
        ),
        (
            json!({"max_tokens": 100}),
            false,
            json!({"max_tokens": 100}),
        ),
        (
            json!({"stop_sequences": ["a", "b", "c", "d"]}),
            true,
            json!({"stop": ["a", "b", "c", "d"]}),
        ),
        (
            json!({"temperature": 0.3, "top_p": 0.5}),
            true,
            json!({"temperature": 0.3, "top_p": 0.5}),
        ),
        (
            json!({"metadata": {"user_id": "u-1"}}),
            true,
            json!({"user": "u-1"}),
        ),
        (
            json!({"stream": true}),
            true,
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        ),
        (json!({"stream": false}), true, json!({"stream": false})),
    ] {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "q"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let params = RequestParams {
            max_completion_tokens: cap_name,
            ..PARAMS
        };
        let raw = serde_json::to_vec(&body).unwrap();
        let out = request(Wire::Messages, Wire::Chat, &raw, &params).unwrap();
        let translated: Value = serde_json::from_slice(&out.body).unwrap();
        for (k, v) in expected.as_object().unwrap() {
            assert_eq!(&translated[k], v, "{extra}");
        }
        if translated.get("stream") != Some(&json!(true)) {
            assert!(translated.get("stream_options").is_none());
        }
        assert_eq!(translated["model"], "deployed-model");
        assert_eq!(
            out.asked,
            Asked {
                stream: extra.get("stream") == Some(&json!(true)),
                include_usage: true
            }
        );
        assert!(out.dropped.is_empty(), "{extra}");
    }
}

#[test]
fn messages_fields_without_counterpart() {
    let raw = br#"{"model":"m","max_tokens":5,"top_k":40,"messages":[],"thinking":{"type":"enabled","budget_tokens":1024},
        "service_tier":"auto","metadata":{"user_id":"u","other":1},"new_field":true}"#;
    let out = request(Wire::Messages, Wire::Chat, raw, &PARAMS).unwrap();
    assert_eq!(
        out.dropped,
        [
            "top_k",
            "thinking",
            "service_tier",
            "metadata.other",
            "new_field"
        ]
    );
    for (field, value, message) in [
        (
            "stop_sequences",
            json!(["1", "2", "3", "4", "5"]),
            "`stop_sequences` with more than 4 entries cannot be sent to an OpenAI deployment",
        ),
        (
            "mcp_servers",
            json!([{"type": "url", "url": "https://mcp.example.com", "name": "x"}]),
            "`mcp_servers` cannot be sent to an OpenAI deployment",
        ),
        (
            "container",
            json!("container_1"),
            "`container` cannot be sent to an OpenAI deployment",
        ),
    ] {
        let body = json!({"model": "m", "max_tokens": 1, "messages": [], field: value});
        let (code, text) = refusal(Wire::Messages, Wire::Chat, body);
        assert_eq!(
            (code.as_str(), text.as_str()),
            ("unsupported_field", message)
        );
    }
}

#[test]
fn messages_bodies_of_the_wrong_shape_are_invalid() {
    for (raw, message) in [
        (
            &b"{\"max_tokens\":1}"[..],
            "`messages` must be an array of messages",
        ),
        (
            b"{\"messages\":[{\"role\":\"user\"}]}",
            "`messages[0].content` must be a string or an array of content blocks",
        ),
        (
            b"{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}]}",
            "`messages[0].content[0].type` must be a string",
        ),
        (
            b"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
            "`messages[0].content[0].text` must be a string",
        ),
        (
            b"{\"messages\":[],\"system\":7}",
            "`system` must be a string or an array of text blocks",
        ),
        (
            b"{\"messages\":[],\"tool_choice\":\"auto\"}",
            "`tool_choice` must be an object",
        ),
        (
            b"{\"messages\":[],\"metadata\":{\"user_id\":5}}",
            "`metadata.user_id` must be a string",
        ),
        (
            b"{\"messages\":[],\"max_tokens\":1.5}",
            "`max_tokens` must be a non-negative integer",
        ),
    ] {
        let err = request(Wire::Messages, Wire::Chat, raw, &PARAMS).unwrap_err();
        assert_eq!(
            (err.status, err.code.as_ref(), err.message.as_ref()),
            (400, "invalid_request_body", message),
            "{raw:?}"
        );
    }
}

#[test]
fn a_long_or_odd_type_value_is_not_quoted_in_the_message() {
    let long = "x".repeat(41);
    for kind in [long.as_str(), "has space", "quote\"d", ""] {
        let body = chat(json!([{"role": "user", "content": [{"type": kind}]}]));
        let (_, message) = refusal(Wire::Chat, Wire::Messages, body);
        assert_eq!(
            message,
            "`messages[0].content[0].type` cannot be sent to an Anthropic deployment"
        );
    }
}
