use super::*;

const PARAMS: ResponseParams = ResponseParams {
    created: 1_700_000_000,
};

const WITH_USAGE: Asked = Asked {
    stream: true,
    include_usage: true,
};

/// The client's bytes for `input` cut at `cuts`, then `finish`.
fn run(
    from: Wire,
    to: Wire,
    asked: Asked,
    input: &[u8],
    cuts: &[usize],
) -> (String, StreamTranslator) {
    run_bounded(from, to, asked, input, cuts, MAX_EVENT_BYTES)
}

fn run_bounded(
    from: Wire,
    to: Wire,
    asked: Asked,
    input: &[u8],
    cuts: &[usize],
    max: usize,
) -> (String, StreamTranslator) {
    let mut translator = StreamTranslator::with_options(from, to, asked, PARAMS, max, true);
    let mut out = Vec::new();
    let mut at = 0;
    for &cut in cuts {
        let cut = cut.clamp(at, input.len());
        translator.push(&input[at..cut], &mut out);
        at = cut;
    }
    translator.push(&input[at..], &mut out);
    translator.finish(&mut out);
    (String::from_utf8(out).unwrap(), translator)
}

/// Every cut into two pieces, and byte by byte, gives the output of one push.
fn assert_split_invariant(from: Wire, to: Wire, asked: Asked, input: &[u8]) -> String {
    let (whole, translator) = run(from, to, asked, input, &[]);
    for cut in 0..=input.len() {
        let (split, other) = run(from, to, asked, input, &[cut]);
        assert_eq!(split, whole, "cut at {cut}");
        assert_eq!(other.skipped(), translator.skipped(), "cut at {cut}");
    }
    let bytewise: Vec<usize> = (1..input.len()).collect();
    assert_eq!(
        run(from, to, asked, input, &bytewise).0,
        whole,
        "byte by byte"
    );
    whole
}

fn sse(events: &[(&str, &str)]) -> String {
    events
        .iter()
        .map(|(name, data)| {
            if name.is_empty() {
                format!("data: {data}\n\n")
            } else {
                format!("event: {name}\ndata: {data}\n\n")
            }
        })
        .collect()
}

const ANTHROPIC_STREAM: &[(&str, &str)] = &[
    (
        "message_start",
        r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":3,"cache_read_input_tokens":100,"output_tokens":1}}}"#,
    ),
    (
        "content_block_start",
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
    ),
    ("ping", r#"{"type": "ping"}"#),
    (
        "content_block_delta",
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#,
    ),
    (
        "content_block_delta",
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" \"w\u00f6rld\"\n"}}"#,
    ),
    (
        "content_block_stop",
        r#"{"type":"content_block_stop","index":0}"#,
    ),
    (
        "content_block_start",
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"thinking","thinking":""}}"#,
    ),
    (
        "content_block_delta",
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"thinking_delta","thinking":"hmm"}}"#,
    ),
    (
        "content_block_delta",
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"signature_delta","signature":"sig"}}"#,
    ),
    (
        "content_block_stop",
        r#"{"type":"content_block_stop","index":1}"#,
    ),
    (
        "content_block_start",
        r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{}}}"#,
    ),
    (
        "content_block_delta",
        r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"city\": \"Par"}}"#,
    ),
    (
        "content_block_delta",
        r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"is\"}"}}"#,
    ),
    (
        "content_block_stop",
        r#"{"type":"content_block_stop","index":2}"#,
    ),
    (
        "content_block_start",
        r#"{"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"toolu_2","name":"now","input":{}}}"#,
    ),
    (
        "content_block_stop",
        r#"{"type":"content_block_stop","index":3}"#,
    ),
    (
        "message_delta",
        r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":15}}"#,
    ),
    ("message_stop", r#"{"type":"message_stop"}"#),
];

const HEAD: &str = r#"data: {"id":"msg_1","object":"chat.completion.chunk","created":1700000000,"model":"claude-sonnet-4-5","choices":[{"index":0,"delta":"#;
const END: &str = ",\"logprobs\":null,\"finish_reason\":null}]}\n\n";

fn chunk(delta: &str) -> String {
    format!("{HEAD}{delta}{END}")
}

#[test]
fn a_messages_stream_becomes_chat_chunks() {
    let input = sse(ANTHROPIC_STREAM);
    let out = assert_split_invariant(Wire::Messages, Wire::Chat, WITH_USAGE, input.as_bytes());
    let expected = [
        chunk(r#"{"role":"assistant","content":""}"#),
        chunk(r#"{"content":"Hello"}"#),
        chunk(r#"{"content":" \"w\u00f6rld\"\n"}"#),
        chunk(r#"{"tool_calls":[{"index":0,"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":""}}]}"#),
        chunk(r#"{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": \"Par"}}]}"#),
        chunk(r#"{"tool_calls":[{"index":0,"function":{"arguments":"is\"}"}}]}"#),
        chunk(r#"{"tool_calls":[{"index":1,"id":"toolu_2","type":"function","function":{"name":"now","arguments":""}}]}"#),
        format!("{HEAD}{{}},\"logprobs\":null,\"finish_reason\":\"tool_calls\"}}]}}\n\n"),
        r#"data: {"id":"msg_1","object":"chat.completion.chunk","created":1700000000,"model":"claude-sonnet-4-5","choices":[],"usage":{"prompt_tokens":128,"completion_tokens":15,"total_tokens":143,"prompt_tokens_details":{"cached_tokens":100,"cache_creation_tokens":3}}}"#.to_string() + "\n\n",
        "data: [DONE]\n\n".to_string(),
    ]
    .concat();
    assert_eq!(out, expected);
    let (_, translator) = run(
        Wire::Messages,
        Wire::Chat,
        WITH_USAGE,
        input.as_bytes(),
        &[],
    );
    assert!(translator.finished());
    assert!(!translator.failed());
    assert_eq!(translator.skipped(), 0);
}

#[test]
fn no_usage_chunk_unless_asked() {
    let input = sse(ANTHROPIC_STREAM);
    let asked = Asked {
        stream: true,
        include_usage: false,
    };
    let (out, _) = run(Wire::Messages, Wire::Chat, asked, input.as_bytes(), &[]);
    assert!(!out.contains("\"usage\""));
    assert!(out.ends_with("\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n"));
}

#[test]
fn message_delta_usage_replaces_message_start_usage() {
    let input = sse(&[
        (
            "message_start",
            r#"{"type":"message_start","message":{"id":"m","model":"c","usage":{"input_tokens":10,"output_tokens":1}}}"#,
        ),
        (
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":12,"output_tokens":7,"cache_read_input_tokens":4}}"#,
        ),
        ("message_stop", r#"{"type":"message_stop"}"#),
    ]);
    let (out, _) = run(
        Wire::Messages,
        Wire::Chat,
        WITH_USAGE,
        input.as_bytes(),
        &[],
    );
    assert!(out.contains(r#""finish_reason":"length""#), "{out}");
    assert!(
        out.contains(r#""usage":{"prompt_tokens":16,"completion_tokens":7,"total_tokens":23,"prompt_tokens_details":{"cached_tokens":4}}"#),
        "{out}"
    );
}

#[test]
fn an_anthropic_error_event_becomes_an_openai_error_chunk() {
    let input = sse(&[
        ANTHROPIC_STREAM[0],
        (
            "error",
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        ),
        ANTHROPIC_STREAM[3],
    ]);
    let out = assert_split_invariant(Wire::Messages, Wire::Chat, WITH_USAGE, input.as_bytes());
    assert_eq!(
        out,
        chunk(r#"{"role":"assistant","content":""}"#)
            + "data: {\"error\":{\"message\":\"Overloaded\",\"type\":\"server_error\",\"code\":\"overloaded\"}}\n\n"
    );
    let (_, translator) = run(
        Wire::Messages,
        Wire::Chat,
        WITH_USAGE,
        input.as_bytes(),
        &[],
    );
    assert!(translator.failed());
    assert!(!translator.finished());
}

#[test]
fn a_cut_stream_ends_with_the_client_apis_error_event() {
    let input = sse(&ANTHROPIC_STREAM[..5]);
    let (out, translator) = run(
        Wire::Messages,
        Wire::Chat,
        WITH_USAGE,
        input.as_bytes(),
        &[],
    );
    assert!(out.ends_with(
        "data: {\"error\":{\"message\":\"the upstream stream ended before the response was complete\",\"type\":\"api_error\",\"code\":\"upstream_stream_interrupted\"}}\n\n"
    ));
    assert!(!out.contains("[DONE]"));
    assert!((translator.failed(), translator.finished()) == (true, false));

    let input = sse(&CHAT_STREAM[..3]);
    let (out, translator) = run(
        Wire::Chat,
        Wire::Messages,
        WITH_USAGE,
        input.as_bytes(),
        &[],
    );
    assert!(out.ends_with("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"the upstream stream ended before the response was complete\"}}\n\n"));
    assert!(!out.contains("message_stop"));
    assert!((translator.failed(), translator.finished()) == (true, false));

    // nothing at all
    for (from, to) in [(Wire::Messages, Wire::Chat), (Wire::Chat, Wire::Messages)] {
        let (out, _) = run(from, to, WITH_USAGE, b"", &[]);
        assert_eq!(out.as_bytes(), interrupted_event(to == Wire::Messages));
    }
}

#[test]
fn finish_is_idempotent_and_push_after_it_does_nothing() {
    let mut translator = StreamTranslator::new(Wire::Chat, Wire::Messages, WITH_USAGE, PARAMS);
    let mut out = Vec::new();
    translator.finish(&mut out);
    let once = out.clone();
    translator.finish(&mut out);
    translator.push(sse(CHAT_STREAM).as_bytes(), &mut out);
    assert_eq!(out, once);
}

#[test]
fn unparseable_events_are_dropped_and_counted() {
    let mut events = ANTHROPIC_STREAM.to_vec();
    events.insert(
        3,
        (
            "content_block_delta",
            "{\"type\":\"content_block_delta\",\"index\":0,",
        ),
    );
    events.insert(4, ("", "not json"));
    events.insert(5, ("message_start", "{\"no_type\":1}"));
    let input = sse(&events);
    let (with_junk, translator) = run(
        Wire::Messages,
        Wire::Chat,
        WITH_USAGE,
        input.as_bytes(),
        &[],
    );
    assert_eq!(translator.skipped(), 3);
    assert_eq!(
        with_junk,
        run(
            Wire::Messages,
            Wire::Chat,
            WITH_USAGE,
            sse(ANTHROPIC_STREAM).as_bytes(),
            &[]
        )
        .0
    );
    // comments and events without data are no events to count
    let input = format!(": keep-alive\n\nevent: ping\n\n{}", sse(ANTHROPIC_STREAM));
    let (_, translator) = run(
        Wire::Messages,
        Wire::Chat,
        WITH_USAGE,
        input.as_bytes(),
        &[],
    );
    assert_eq!(translator.skipped(), 0);

    let mut events = CHAT_STREAM.to_vec();
    events.insert(
        2,
        (
            "",
            "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}",
        ),
    );
    events.insert(3, ("", "[1,2]"));
    let (with_junk, translator) = run(
        Wire::Chat,
        Wire::Messages,
        WITH_USAGE,
        sse(&events).as_bytes(),
        &[],
    );
    assert_eq!(translator.skipped(), 2);
    assert_eq!(
        with_junk,
        run(
            Wire::Chat,
            Wire::Messages,
            WITH_USAGE,
            sse(CHAT_STREAM).as_bytes(),
            &[]
        )
        .0
    );
}

#[test]
fn oversized_events_are_dropped_and_counted_once_each() {
    let big = format!(
        "{{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{}\"}}}}",
        "x".repeat(500)
    );
    let mut events = ANTHROPIC_STREAM.to_vec();
    // two oversized events in a row, one of them with CRLF line ends
    events.insert(3, ("content_block_delta", &big));
    events.insert(4, ("content_block_delta", &big));
    let input = sse(&events).replacen(
        &format!("data: {big}\n\n"),
        &format!("data: {big}\r\n\r\n"),
        1,
    );
    assert!(sse(ANTHROPIC_STREAM)
        .split_terminator("\n\n")
        .all(|e| e.len() + 2 <= 400));
    let reference = run(
        Wire::Messages,
        Wire::Chat,
        WITH_USAGE,
        sse(ANTHROPIC_STREAM).as_bytes(),
        &[],
    )
    .0;
    for cuts in [
        vec![],
        vec![100, 101, 900, 950],
        (1..input.len()).step_by(7).collect(),
    ] {
        let (out, translator) = run_bounded(
            Wire::Messages,
            Wire::Chat,
            WITH_USAGE,
            input.as_bytes(),
            &cuts,
            400,
        );
        assert_eq!(translator.skipped(), 2, "{cuts:?}");
        assert_eq!(out, reference, "{cuts:?}");
    }
    // the real bound: 1 MiB
    let huge = format!(
        "{{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{}\"}}}}",
        "y".repeat(MAX_EVENT_BYTES)
    );
    let mut events = ANTHROPIC_STREAM.to_vec();
    events.insert(3, ("content_block_delta", &huge));
    let input = sse(&events);
    let (out, translator) = run(
        Wire::Messages,
        Wire::Chat,
        WITH_USAGE,
        input.as_bytes(),
        &[1000, 600_000],
    );
    assert_eq!(translator.skipped(), 1);
    assert_eq!(out, reference);
}

#[test]
fn an_unterminated_last_event_is_translated() {
    let input = sse(ANTHROPIC_STREAM);
    let cut = input.strip_suffix("\n\n").unwrap();
    let (out, translator) = run(Wire::Messages, Wire::Chat, WITH_USAGE, cut.as_bytes(), &[]);
    assert!(translator.finished());
    assert!(out.ends_with("data: [DONE]\n\n"));
    // an event ended by a lone CR at the very end is complete once the stream ends
    let input = sse(CHAT_STREAM).replace('\n', "\r");
    let whole = run(
        Wire::Chat,
        Wire::Messages,
        WITH_USAGE,
        sse(CHAT_STREAM).as_bytes(),
        &[],
    )
    .0;
    let (out, translator) = run(
        Wire::Chat,
        Wire::Messages,
        WITH_USAGE,
        input.as_bytes(),
        &[],
    );
    assert!(translator.finished());
    assert_eq!(out, whole);
}

#[test]
fn deltas_before_message_start_still_follow_a_first_chunk() {
    let input = sse(&[
        ANTHROPIC_STREAM[3],
        ANTHROPIC_STREAM[16],
        ANTHROPIC_STREAM[17],
    ]);
    let (out, _) = run(
        Wire::Messages,
        Wire::Chat,
        Asked::default(),
        input.as_bytes(),
        &[],
    );
    let head = r#"data: {"id":"","object":"chat.completion.chunk","created":1700000000,"model":"","choices":[{"index":0,"delta":"#;
    assert_eq!(
        out,
        format!(
            "{head}{{\"role\":\"assistant\",\"content\":\"\"}}{END}{head}{{\"content\":\"Hello\"}}{END}{head}{{}},\"logprobs\":null,\"finish_reason\":\"tool_calls\"}}]}}\n\ndata: [DONE]\n\n"
        )
    );
}

#[test]
fn escaped_fields_take_the_slow_path_to_the_same_meaning() {
    // `type` spelled with an escape, keys in another order, text with escapes
    let fast = r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a\u00e9\"b"}}"#;
    let slow = r#"{"delta":{"text":"a\u00e9\"b","type":"text_\u0064elta"},"index":0,"type":"content_block_d\u0065lta"}"#;
    let run_one = |data: &str| {
        let input = sse(&[ANTHROPIC_STREAM[0], ("content_block_delta", data)]);
        run(
            Wire::Messages,
            Wire::Chat,
            WITH_USAGE,
            input.as_bytes(),
            &[],
        )
        .0
    };
    let content = |out: &str| -> Vec<String> {
        out.split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter_map(|v| {
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(String::from)
            })
            .collect()
    };
    assert_eq!(content(&run_one(fast)), ["", "aé\"b"]);
    assert_eq!(content(&run_one(slow)), ["", "aé\"b"]);
}

const CHAT_STREAM: &[(&str, &str)] = &[
    (
        "",
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","system_fingerprint":"fp","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}"#,
    ),
    (
        "",
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","system_fingerprint":"fp","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}],"usage":null}"#,
    ),
    (
        "",
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","system_fingerprint":"fp","choices":[{"index":0,"delta":{"content":" \"th\u00e9re\""},"logprobs":null,"finish_reason":null}],"usage":null}"#,
    ),
    (
        "",
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]},"logprobs":null,"finish_reason":null}]}"#,
    ),
    (
        "",
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\":"}}]},"logprobs":null,"finish_reason":null}]}"#,
    ),
    (
        "",
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]},"logprobs":null,"finish_reason":null}]}"#,
    ),
    (
        "",
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_2","type":"function","function":{"name":"g","arguments":"{}"}}]},"logprobs":null,"finish_reason":null}]}"#,
    ),
    (
        "",
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}],"usage":null}"#,
    ),
    (
        "",
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":9,"total_tokens":129,"prompt_tokens_details":{"cached_tokens":100}}}"#,
    ),
    ("", "[DONE]"),
];

fn event(name: &str, data: &str) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

#[test]
fn a_chat_stream_becomes_messages_events() {
    let input = sse(CHAT_STREAM);
    let out = assert_split_invariant(Wire::Chat, Wire::Messages, WITH_USAGE, input.as_bytes());
    let expected = [
        event("message_start", r#"{"type":"message_start","message":{"id":"chatcmpl-1","type":"message","role":"assistant","model":"gpt-4o","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}}"#),
        event("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#),
        event("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#),
        event("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" \"th\u00e9re\""}}"#),
        event("content_block_stop", r#"{"type":"content_block_stop","index":0}"#),
        event("content_block_start", r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"call_1","name":"f","input":{}}}"#),
        event("content_block_delta", r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\":"}}"#),
        event("content_block_delta", r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"1}"}}"#),
        event("content_block_stop", r#"{"type":"content_block_stop","index":1}"#),
        event("content_block_start", r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"call_2","name":"g","input":{}}}"#),
        event("content_block_delta", r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{}"}}"#),
        event("content_block_stop", r#"{"type":"content_block_stop","index":2}"#),
        event("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"input_tokens":20,"output_tokens":9,"cache_read_input_tokens":100,"cache_creation_input_tokens":0}}"#),
        event("message_stop", r#"{"type":"message_stop"}"#),
    ]
    .concat();
    assert_eq!(out, expected);
    let (_, translator) = run(
        Wire::Chat,
        Wire::Messages,
        WITH_USAGE,
        input.as_bytes(),
        &[],
    );
    assert!(translator.finished());
    assert_eq!(translator.skipped(), 0);
}

#[test]
fn a_chat_stream_ends_at_usage_or_done() {
    let base = r#""id":"c","object":"chat.completion.chunk","created":1,"model":"m""#;
    let content = format!(
        r#"{{{base},"choices":[{{"index":0,"delta":{{"role":"assistant","content":"ok"}},"finish_reason":null}}]}}"#
    );
    let stop = |usage: &str| {
        format!(
            r#"{{{base},"choices":[{{"index":0,"delta":{{}},"finish_reason":"length"}}]{usage}}}"#
        )
    };
    let usage = r#""usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9,"prompt_cache_hit_tokens":3}"#;
    let full = r#"{"input_tokens":4,"output_tokens":2,"cache_read_input_tokens":3,"cache_creation_input_tokens":0}"#;
    for (events, tail_usage) in [
        // usage on the finish chunk (DeepSeek): ends there, [DONE] or not
        (vec![content.clone(), stop(&format!(",{usage}"))], full),
        (
            vec![content.clone(), stop(&format!(",{usage}")), "[DONE]".into()],
            full,
        ),
        // no usage: ends at [DONE], output tokens unknown
        (
            vec![content.clone(), stop(""), "[DONE]".into()],
            r#"{"output_tokens":0}"#,
        ),
        // a usage-only chunk after the finish
        (
            vec![
                content.clone(),
                stop(""),
                format!(r#"{{{base},"choices":[],{usage}}}"#),
            ],
            full,
        ),
    ] {
        let pairs: Vec<(&str, &str)> = events.iter().map(|e| ("", e.as_str())).collect();
        let (out, translator) = run(
            Wire::Chat,
            Wire::Messages,
            WITH_USAGE,
            sse(&pairs).as_bytes(),
            &[],
        );
        assert!(translator.finished(), "{events:?}");
        let expected_end = event(
            "message_delta",
            &format!(
                r#"{{"type":"message_delta","delta":{{"stop_reason":"max_tokens","stop_sequence":null}},"usage":{tail_usage}}}"#
            ),
        ) + &event("message_stop", r#"{"type":"message_stop"}"#);
        assert!(out.ends_with(&expected_end), "{out}");
        assert!(out.contains(&event(
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#
        )));
    }
    // [DONE] without a finish reason
    let pairs = [("", content.as_str()), ("", "[DONE]")];
    let (out, _) = run(
        Wire::Chat,
        Wire::Messages,
        WITH_USAGE,
        sse(&pairs).as_bytes(),
        &[],
    );
    assert!(out.contains(r#""stop_reason":"end_turn""#), "{out}");
}

#[test]
fn chat_refusals_count_as_text_and_reasoning_is_dropped() {
    let base = r#""id":"c","object":"chat.completion.chunk","created":1,"model":"m""#;
    let events = [
        format!(
            r#"{{{base},"choices":[{{"index":0,"delta":{{"role":"assistant","content":null,"reasoning_content":"think"}}}}]}}"#
        ),
        format!(r#"{{{base},"choices":[{{"index":0,"delta":{{"reasoning_content":"more"}}}}]}}"#),
        format!(r#"{{{base},"choices":[{{"index":0,"delta":{{"refusal":"I can"}}}}]}}"#),
        format!(r#"{{{base},"choices":[{{"index":0,"delta":{{"refusal":"not."}}}}]}}"#),
        format!(r#"{{{base},"choices":[{{"index":1,"delta":{{"content":"other choice"}}}}]}}"#),
        format!(
            r#"{{{base},"choices":[{{"index":0,"delta":{{}},"finish_reason":"content_filter"}}]}}"#
        ),
        "[DONE]".to_string(),
    ];
    let pairs: Vec<(&str, &str)> = events.iter().map(|e| ("", e.as_str())).collect();
    let out = assert_split_invariant(
        Wire::Chat,
        Wire::Messages,
        WITH_USAGE,
        sse(&pairs).as_bytes(),
    );
    let texts: Vec<&str> = out.matches(r#""text_delta","text":""#).collect();
    assert_eq!(texts.len(), 2, "{out}");
    assert!(out.contains(r#""text":"I can"}"#) && out.contains(r#""text":"not."}"#));
    assert!(
        !out.contains("think") && !out.contains("other choice"),
        "{out}"
    );
    assert!(out.contains(r#""stop_reason":"refusal""#));
}

#[test]
fn text_after_a_tool_call_opens_a_new_block() {
    let base = r#""id":"c","object":"chat.completion.chunk","created":1,"model":"m""#;
    let events = [
        format!(
            r#"{{{base},"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"id":"t","function":{{"name":"f","arguments":"{{}}"}}}}]}}}}]}}"#
        ),
        format!(r#"{{{base},"choices":[{{"index":0,"delta":{{"content":"after"}}}}]}}"#),
        format!(r#"{{{base},"choices":[{{"index":0,"delta":{{"content":" more"}}}}]}}"#),
        format!(r#"{{{base},"choices":[{{"index":0,"delta":{{}},"finish_reason":"stop"}}]}}"#),
        "[DONE]".to_string(),
    ];
    let pairs: Vec<(&str, &str)> = events.iter().map(|e| ("", e.as_str())).collect();
    let (out, _) = run(
        Wire::Chat,
        Wire::Messages,
        WITH_USAGE,
        sse(&pairs).as_bytes(),
        &[],
    );
    let starts: Vec<&str> = out
        .split("\n\n")
        .filter(|e| e.starts_with("event: content_block_st"))
        .collect();
    assert_eq!(
        starts,
        [
            r#"event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}"#,
            r#"event: content_block_stop
data: {"type":"content_block_stop","index":0}"#,
            r#"event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
            r#"event: content_block_stop
data: {"type":"content_block_stop","index":1}"#,
        ]
    );
    assert!(out.contains(
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":" more"}}"#
    ));
}

#[test]
fn an_openai_error_chunk_becomes_an_error_event() {
    let events = [
        CHAT_STREAM[0],
        CHAT_STREAM[1],
        (
            "",
            r#"{"error":{"message":"Rate limit reached","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}"#,
        ),
        CHAT_STREAM[2],
    ];
    let out = assert_split_invariant(
        Wire::Chat,
        Wire::Messages,
        WITH_USAGE,
        sse(&events).as_bytes(),
    );
    assert!(out.ends_with(&event(
        "error",
        r#"{"type":"error","error":{"type":"rate_limit_error","message":"Rate limit reached"}}"#
    )));
    assert!(!out.contains("th\\u00e9re"));
}

#[test]
fn the_same_api_passes_through() {
    for (api, events) in [
        (Wire::Chat, CHAT_STREAM),
        (Wire::Messages, ANTHROPIC_STREAM),
    ] {
        let input = sse(events);
        let out = assert_split_invariant(api, api, WITH_USAGE, input.as_bytes());
        assert_eq!(out, input);
        let (_, translator) = run(api, api, WITH_USAGE, input.as_bytes(), &[]);
        assert!(translator.finished());
        // cut: the partial event gets its blank line, then the error event follows
        let cut = &input[..input.len() - 20];
        let (out, translator) = run(api, api, WITH_USAGE, cut.as_bytes(), &[]);
        assert_eq!(
            out.as_bytes(),
            [
                cut.as_bytes(),
                b"\n\n",
                &interrupted_event(api == Wire::Messages)
            ]
            .concat()
        );
        assert!(translator.failed());
        // a last event without its blank line still ends the stream
        let unterminated = input.strip_suffix('\n').unwrap();
        let (out, translator) = run(api, api, WITH_USAGE, unterminated.as_bytes(), &[]);
        assert_eq!(out, input);
        assert!(translator.finished() && !translator.failed());
    }
    let error = sse(&[("", r#"{"error":{"message":"x"}}"#)]);
    let (out, translator) = run(Wire::Chat, Wire::Chat, WITH_USAGE, error.as_bytes(), &[]);
    assert_eq!(out, error);
    assert!(translator.failed());
}

proptest::proptest! {
    /// What the fast path copies as a string, a client's JSON parser reads as one.
    #[test]
    fn what_passes_for_a_string_literal_is_one_to_serde(
        parts in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::strategy::Just("\\ud83d".to_string()),
                proptest::strategy::Just("\\ude00".to_string()),
                proptest::strategy::Just("\\u00e9".to_string()),
                proptest::strategy::Just("\\n".to_string()),
                "[a-z ]{0,3}",
            ],
            0..8,
        )
    ) {
        let literal = format!("\"{}\"", parts.concat());
        if is_string_literal(literal.as_bytes()) {
            proptest::prop_assert!(
                serde_json::from_str::<String>(&literal).is_ok(),
                "{}",
                literal
            );
        }
    }
}

#[test]
fn string_literals_are_recognized_exactly() {
    for (bytes, expected) in [
        (&b"\"\""[..], true),
        (b"\"plain text\"", true),
        (
            b"\"esc \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\uD83D\\uDE00\"",
            true,
        ),
        (b"\"caf\xc3\xa9\"", true),
        (b"", false),
        (b"\"", false),
        (b"x\"\"", false),
        (b"\"a\"b\"", false),
        (b"\"a\",\"b\"", false),
        (b"\"ends in backslash\\\"", false),
        (b"\"bad \\x escape\"", false),
        (b"\"short \\u12\"", false),
        (b"\"not hex \\u12g4\"", false),
        (b"\"raw\nnewline\"", false),
        (b"\"raw \x01 control\"", false),
        (b"\"bad utf8 \xff\"", false),
        // a surrogate escape is text only as half of a high-low pair (serde and every client's
        // JSON parser refuse a lone one)
        (b"\"lone high \\ud83d\"", false),
        (b"\"lone high then text \\ud83dnput\"", false),
        (b"\"high then high \\ud83d\\ud83d\"", false),
        (b"\"lone low \\ude00\"", false),
        (b"\"low then high \\ude00\\ud83d\"", false),
        (b"\"pair \\ud83d\\ude00 then text\"", true),
    ] {
        assert_eq!(
            is_string_literal(bytes),
            expected,
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
    }
}

#[test]
fn an_event_that_only_looks_like_the_last_delta_is_read_in_full() {
    let template =
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}"#;
    // the same bytes before and after, but between them two strings and a member: not a
    // text delta of the same shape (here: a delta with a second `type` that is no text delta)
    let lookalike = r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"b","type":"thinking_delta"}}"#;
    let input = sse(&[
        ANTHROPIC_STREAM[0],
        ("content_block_delta", template),
        ("content_block_delta", lookalike),
    ]);
    let (out, translator) = run(
        Wire::Messages,
        Wire::Chat,
        WITH_USAGE,
        input.as_bytes(),
        &[],
    );
    assert!(out.contains(r#"{"content":"a"}"#));
    assert!(!out.contains(r#""b""#), "{out}");
    assert_eq!(translator.skipped(), 0);

    let chunk = |content: &str| {
        format!(
            r#"{{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{{"index":0,"delta":{{"content":{content}}},"finish_reason":null}}]}}"#
        )
    };
    let events = [chunk("\"a\""), chunk("\"b\""), chunk("\"c\",\"tool_calls\":[{\"index\":0,\"id\":\"t\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}],\"x\":\"\""), "[DONE]".to_string()];
    let pairs: Vec<(&str, &str)> = events.iter().map(|e| ("", e.as_str())).collect();
    let (out, _) = run(
        Wire::Chat,
        Wire::Messages,
        WITH_USAGE,
        sse(&pairs).as_bytes(),
        &[],
    );
    assert!(out.contains(r#""text":"b"}"#));
    assert!(out.contains(r#""text":"c"}"#));
    assert!(
        out.contains(r#""content_block":{"type":"tool_use","id":"t","name":"f","input":{}}"#),
        "{out}"
    );
}

/// A text delta holding a lone surrogate escape is grammatical JSON but not text: copied as it
/// was, the client got a chunk its JSON parser refuses (found by the `translate` fuzz target,
/// `seed-regression-lone-surrogate-*`). It is dropped and counted, both ways, and every event
/// the client gets parses.
#[test]
fn a_delta_with_a_lone_surrogate_is_dropped_not_copied() {
    let anthropic = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"c\",\"content\":[],\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\", see\\ud83dyou\"}}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    let chat = concat!(
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"g\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"g\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"g\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\", see\\ude00you\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"g\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    for (from, to, input) in [
        (Wire::Messages, Wire::Chat, anthropic),
        (Wire::Chat, Wire::Messages, chat),
    ] {
        let (client, translator) = run(from, to, WITH_USAGE, input.as_bytes(), &[]);
        for line in client.lines().filter_map(|l| l.strip_prefix("data: ")) {
            if line != "[DONE]" {
                assert!(
                    serde_json::from_str::<Value>(line).is_ok(),
                    "{from:?} → {to:?}: the client cannot read {line}"
                );
            }
        }
        assert!(client.contains("Hello"), "{client}");
        assert!(!client.contains("see"), "{client}");
        assert_eq!(translator.skipped(), 1, "{from:?} → {to:?}");
        assert!(translator.finished(), "{client}");
    }
}
