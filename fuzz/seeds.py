#!/usr/bin/env python3
"""Writes the committed seed corpora, fuzz/corpus/<target>/seed-*.

A seed is `parameter bytes ++ payload` (see fuzz/src/lib.rs): a few bytes that pick the mode,
the API, the bound or the chunk cuts, then a real payload. The payloads are the shapes the
gateway sees: provider SSE streams (OpenAI Chat Completions with include_usage, the Responses
API, Anthropic Messages), request and response bodies, every plugin configuration in
envoy-config/*.yaml and higress/*.yaml (the latter in the `_rules_` form Higress delivers),
Redis replies of token-ratelimit's scripts, request headers, filter-state values.

Run it after changing the configs it reads (needs PyYAML: `python3 -m pip install pyyaml`, or
Debian's python3-yaml); it rewrites only files named seed-*. Fuzzing adds other files to a
corpus directory: see fuzz/README.md before committing any.
"""
import json
import pathlib
import re
import struct

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
written = {}


def seed(target, name, params, payload):
    if isinstance(payload, str):
        payload = payload.encode()
    data = bytes(params) + payload
    path = CORPUS / target / f"seed-{name}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    written[target] = written.get(target, 0) + 1


def sse(events, eol="\n"):
    """events: (event name or None, data string) pairs."""
    out = ""
    for name, data in events:
        if name:
            out += f"event: {name}{eol}"
        for line in data.split("\n"):
            out += f"data: {line}{eol}"
        out += eol
    return out


def j(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# ---- provider streams --------------------------------------------------------------------

def chat_stream(include_usage=True, text=("Hello", "! Mail ", "ann@example.com", ".")):
    base = {"id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG", "object": "chat.completion.chunk",
            "created": 1741570283, "model": "gpt-4o-2024-08-06", "service_tier": "default",
            "system_fingerprint": "fp_eb9dce56a8"}
    events = []
    first = dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": "", "refusal": None},
                                 "logprobs": None, "finish_reason": None}])
    if include_usage:
        first["usage"] = None
    events.append((None, j(first)))
    for piece in text:
        chunk = dict(base, choices=[{"index": 0, "delta": {"content": piece}, "logprobs": None, "finish_reason": None}])
        if include_usage:
            chunk["usage"] = None
        events.append((None, j(chunk)))
    last = dict(base, choices=[{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}])
    if include_usage:
        last["usage"] = None
    events.append((None, j(last)))
    if include_usage:
        events.append((None, j(dict(base, choices=[], usage={
            "prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                          "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}))))
    events.append((None, "[DONE]"))
    return sse(events)


def chat_tool_stream():
    base = {"id": "chatcmpl-tool", "object": "chat.completion.chunk", "created": 1741570283, "model": "gpt-4o-mini"}
    events = [(None, j(dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": None, "tool_calls": [
        {"index": 0, "id": "call_DdmO9pD3xa9XTPNJ32zg2hcA", "type": "function",
         "function": {"name": "send_mail", "arguments": ""}}]}, "finish_reason": None}])))]
    for piece in ['{"to', '":"[EMA', 'IL_1]', '"}']:
        events.append((None, j(dict(base, choices=[{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": piece}}]}, "finish_reason": None}]))))
    events.append((None, j(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]))))
    events.append((None, "[DONE]"))
    return sse(events)


def responses_stream():
    resp = {"id": "resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654", "object": "response",
            "created_at": 1741290958, "status": "in_progress", "model": "gpt-4.1-2025-04-14", "output": []}
    events = [
        ("response.created", j({"type": "response.created", "sequence_number": 0, "response": resp})),
        ("response.output_item.added", j({"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
                                          "item": {"id": "msg_1", "type": "message", "status": "in_progress",
                                                   "role": "assistant", "content": []}})),
        ("response.content_part.added", j({"type": "response.content_part.added", "sequence_number": 2, "item_id": "msg_1",
                                           "output_index": 0, "content_index": 0,
                                           "part": {"type": "output_text", "text": "", "annotations": []}})),
    ]
    for i, piece in enumerate(["Call [PHO", "NE_1] or ", "[EMAIL_1]", "."]):
        events.append(("response.output_text.delta", j({"type": "response.output_text.delta", "sequence_number": 3 + i,
                                                         "item_id": "msg_1", "output_index": 0, "content_index": 0,
                                                         "delta": piece})))
    events.append(("response.output_text.done", j({"type": "response.output_text.done", "sequence_number": 7,
                                                    "item_id": "msg_1", "output_index": 0, "content_index": 0,
                                                    "text": "Call [PHONE_1] or [EMAIL_1]."})))
    done = dict(resp, status="completed", usage={
        "input_tokens": 37, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 11, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 48})
    events.append(("response.completed", j({"type": "response.completed", "sequence_number": 8, "response": done})))
    return sse(events)


def anthropic_stream(text=("Hello", " [EMAIL_1]", ", see you.")):
    events = [
        ("message_start", j({"type": "message_start", "message": {
            "id": "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY", "type": "message", "role": "assistant", "content": [],
            "model": "claude-sonnet-4-5-20250929", "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 25, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                      "output_tokens": 1}}})),
        ("content_block_start", j({"type": "content_block_start", "index": 0,
                                   "content_block": {"type": "text", "text": ""}})),
        ("ping", j({"type": "ping"})),
    ]
    for piece in text:
        events.append(("content_block_delta", j({"type": "content_block_delta", "index": 0,
                                                 "delta": {"type": "text_delta", "text": piece}})))
    events += [
        ("content_block_stop", j({"type": "content_block_stop", "index": 0})),
        ("content_block_start", j({"type": "content_block_start", "index": 1, "content_block": {
            "type": "tool_use", "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "name": "get_weather", "input": {}}})),
        ("content_block_delta", j({"type": "content_block_delta", "index": 1,
                                   "delta": {"type": "input_json_delta", "partial_json": "{\"city\": \"[LOC"}})),
        ("content_block_delta", j({"type": "content_block_delta", "index": 1,
                                   "delta": {"type": "input_json_delta", "partial_json": "ATION_1]\"}"}})),
        ("content_block_stop", j({"type": "content_block_stop", "index": 1})),
        ("message_delta", j({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                             "usage": {"output_tokens": 15}})),
        ("message_stop", j({"type": "message_stop"})),
    ]
    return sse(events)


def anthropic_error_stream():
    return sse([
        ("message_start", j({"type": "message_start", "message": {"id": "msg_x", "type": "message", "role": "assistant",
                                                                  "content": [], "model": "claude-haiku-4-5",
                                                                  "usage": {"input_tokens": 3, "output_tokens": 1}}})),
        ("error", j({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})),
    ])


STREAMS = {
    "chat": chat_stream(),
    "chat-no-usage": chat_stream(include_usage=False),
    "chat-tools": chat_tool_stream(),
    "responses": responses_stream(),
    "anthropic": anthropic_stream(),
    "anthropic-error": anthropic_error_stream(),
}

# odd but legal framing: CRLF and CR line ends, comments, ids, retry, multi-line data, no
# space after the colon, a field without a colon, an unterminated last event
ODD_FRAMING = [
    ("crlf", chat_stream().replace("\n", "\r\n")),
    ("cr", anthropic_stream().replace("\n", "\r")),
    ("comments", ": keep-alive\n\nid: 7\nretry: 3000\nevent: message\ndata:{\"a\":1}\ndata: [DONE]\n\n"
                 "data\n\n:\r\n\r\ndata: tail without end"),
    ("mixed", "data: a\r\n\ndata: b\n\r\ndata: c\r\rdata: d\n\n"),
]


def split_plan(sizes=None, every_byte=False):
    if every_byte:
        return [0x80]
    sizes = sizes or []
    return [len(sizes)] + list(sizes)


def sse_seeds():
    for name, body in list(STREAMS.items()) + ODD_FRAMING:
        seed("sse_framer", name, [3] + split_plan([17, 1, 250]), body)
    seed("sse_framer", "chat-bytewise", [3] + split_plan(every_byte=True), STREAMS["chat"][:400])
    seed("sse_framer", "overflow", [1] + split_plan([5, 3]), STREAMS["anthropic"])


def usage_seeds():
    apis = {"chat": 0, "chat-no-usage": 0, "chat-tools": 0, "responses": 1, "anthropic": 2, "anthropic-error": 2}
    for name, body in STREAMS.items():
        hide = 1 if name == "chat" else 0
        seed("usage_stream", name, [apis[name], hide] + split_plan([40, 0, 200, 3]), body)
    seed("usage_stream", "chat-small-bound", [0, 1 | 2] + split_plan([100]), STREAMS["chat"])
    # whole (non-streaming) responses: from_response_body / from_body_tail
    bodies = [
        ("chat-body", 0, {"id": "chatcmpl-1", "object": "chat.completion", "created": 1741569952, "model": "gpt-4.1-2025-04-14",
                          "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi [EMAIL_1]", "refusal": None,
                                                               "annotations": []}, "logprobs": None, "finish_reason": "stop"}],
                          "usage": {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29,
                                    "prompt_tokens_details": {"cached_tokens": 4, "audio_tokens": 0},
                                    "completion_tokens_details": {"reasoning_tokens": 2}}}),
        ("anthropic-body", 2, {"id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                               "content": [{"type": "text", "text": "Hi!"}], "stop_reason": "end_turn",
                               "usage": {"input_tokens": 2095, "output_tokens": 503, "cache_creation_input_tokens": 100,
                                         "cache_read_input_tokens": 1800}}),
        ("embeddings-body", 3, {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.0023, -0.0093]}],
                                "model": "text-embedding-3-small", "usage": {"prompt_tokens": 8, "total_tokens": 8}}),
        ("responses-body", 1, {"id": "resp_1", "object": "response", "status": "completed", "model": "o4-mini",
                               "output": [{"type": "reasoning", "summary": []}],
                               "usage": {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 0},
                                         "output_tokens": 300, "output_tokens_details": {"reasoning_tokens": 256},
                                         "total_tokens": 309}}),
    ]
    # counts near u64::MAX (regression: Price::cost overflowed its sum at the dearest price)
    bodies.append(("regression-huge-usage", 0, {"object": "chat.completion", "model": "m", "choices": [],
                                                "usage": {"prompt_tokens": 18446744073709551615,
                                                          "completion_tokens": 18446744073709551615}}))
    bodies.append(("huge-anthropic", 2, {"type": "message", "model": "claude", "content": [],
                                         "usage": {"input_tokens": 18446744073709551615,
                                                   "cache_read_input_tokens": 18446744073709551615,
                                                   "output_tokens": 18446744073709551615}}))
    for name, api, body in bodies:
        seed("usage_stream", name, [api, 0, 0], j(body))


# ---- request bodies ----------------------------------------------------------------------

CHAT = {"model": "fast", "stream": True, "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Email ann@example.com or call +86 138 0013 8000, card 4111 1111 1111 1111."},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "lookup", "arguments": "{\"id\":\"11010519491231002X\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "found 192.168.10.20"},
    {"role": "user", "content": [{"type": "text", "text": "My key is sk-proj-abcdefghijklmnopqrstuv0123"},
                                 {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]}
ANTHROPIC = {"model": "claude", "max_tokens": 1024, "stream": True,
             "system": [{"type": "text", "text": "Reply to bob@example.org", "cache_control": {"type": "ephemeral"}}],
             "messages": [{"role": "user", "content": "AKIAIOSFODNN7EXAMPLE and [EMAIL_1] please"},
                          {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "mail",
                                                             "input": {"to": "eve@example.net"}}]},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                        "content": "sent to eve@example.net"}]}]}
RESPONSES = {"model": "smart", "instructions": "Be brief.", "max_output_tokens": 200, "stream": True,
             "input": [{"role": "user", "content": [{"type": "input_text", "text": "Ping 2001:db8::1 and 10.0.0.1"}]},
                       {"type": "function_call_output", "call_id": "call_9", "output": "{\"phone\":\"+44 20 7946 0958\"}"}]}
EMBEDDINGS = {"model": "embed", "input": ["carol@example.com", "plain text"], "encoding_format": "float"}

REQUESTS = [
    ("chat", 0, CHAT),
    ("chat-options", 0, dict(CHAT, stream_options={"include_usage": False}, max_tokens=300)),
    ("chat-usage", 0, dict(CHAT, stream_options={"include_usage": True}, max_completion_tokens=50)),
    ("anthropic", 2, ANTHROPIC),
    ("responses", 1, RESPONSES),
    ("embeddings", 3, EMBEDDINGS),
]
RAW_REQUESTS = [
    # duplicate keys, escapes, odd whitespace, numbers: the scanner's corners
    ("duplicates", 0, '{"model":"a","stream":false,"model":"fast","stream":true,"max_tokens":null,"max_tokens":7}'),
    ("escapes", 0, '{"model":"f\\u0061st","messages":[{"role":"user","content":"\\ud83d\\ude00 \\"q\\" \\\\ \\/ \\b\\f\\n\\r\\t"}],"stream":true}'),
    ("whitespace", 0, ' \t\r\n{ "model" : "fast" , "stream" : true , "stream_options" : { } }\n'),
    ("numbers", 2, '{"model":"claude","max_tokens":1e3,"temperature":-0.0,"top_k":18446744073709551615,"messages":[]}'),
    ("nested", 0, '{"model":"fast","messages":' + '[' * 60 + ']' * 60 + '}'),
]


def json_seeds():
    for name, path, body in REQUESTS:
        seed("json_edit", name, [path, 2, 0b00000001, 0b10000010], j(body))
    for name, path, body in RAW_REQUESTS:
        seed("json_edit", name, [path, 0], body)
    seed("json_edit", "not-an-object", [0, 0], '["model","fast"]')


def pii_seeds():
    for name, path, body in REQUESTS:
        for config in (0, 2, 3):
            seed("pii_request", f"{name}-{config}", [config, path], j(body))
    seed("pii_request", "raw-text", [1, 3], "Contact ann@example.com, 13800138000, [EMAIL_1] or -----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----")
    seed("pii_request", "names-addresses", [0, 0], j({"model": "fast", "messages": [{"role": "user", "content":
         "I am John Underwood, 8353 Kathleen Highway Apt. 681. 我叫朱颖，住在朝阳区建国路88号。井上 篤司、〒123-4567 [NAME_1]"}]}))
    for name, path, body in RAW_REQUESTS[:2]:
        seed("pii_request", name, [0, path], body)
    # regression: the preamble went into an object as if it were a list
    seed("pii_request", "regression-messages-object", [2, 0], '{"model":"fast","messages":{"content":"ann@example.com"}}')
    seed("pii_request", "regression-system-object", [2, 1], '{"model":"c","system":{"t":1},"messages":[{"content":"a@b.co"}]}')
    # every text field a provider reads (request.rs): a participant name, a refusal, tool data
    # under members named like metadata; and the signed or opaque blobs left alone
    seed("pii_request", "fields-chat", [0, 0], '{"messages":[{"role":"user","name":"ann@example.com","content":"x"},{"role":"assistant","refusal":"a@b.co","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\\"to\\":\\"a@b.co\\"}"}}]}]}')
    seed("pii_request", "fields-anthropic", [2, 1], '{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"a@b.co","signature":"s"},{"type":"redacted_thinking","data":"a@b.co"},{"type":"tool_use","id":"t","name":"n","input":{"name":"a@b.co","source":{"id":"E-123456"}}}]}]}')
    seed("pii_request", "fields-responses", [0, 2], '{"prompt":{"id":"p","variables":{"name":"a@b.co"}},"input":[{"type":"reasoning","encrypted_content":"a@b.co","summary":[{"type":"summary_text","text":"a@b.co"}]},{"type":"custom_tool_call","call_id":"c","name":"n","input":"a@b.co"}]}')

    texts = [
        ("mixed", "Mail ann@example.com or bob@example.org, call +86 138 0013 8000 or +1 415 555 2671, "
                  "card 4111-1111-1111-1111, id 11010519491231002X, ip 10.0.0.1 and fe80::1, key sk-proj-0123456789abcdefghijkl, "
                  "AKIAIOSFODNN7EXAMPLE, eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"),
        ("ids", "Call +1 (415) 555-0132 x12, 01632 960 367, +49(0)3473 86352 or 080-9718-5680; IBAN "
                "DE89 3704 0044 0532 0130 00 / GB82WEST12345698765432; SSN 123-45-6789, NINO AB 12 34 56 C, "
                "NIR 2 69 05 2A 123 456 88, IdNr 86 095 742 719, 個人番号 1234 5678 9018, card 501800000009, "
                "JCB 180000000000002, ip 2001:db8::8a2e:370:7334 and 192.168.0.1. Not PII: order 4155550132, "
                "v1.2.3.4, 2024-12-01 10:30:45, 550e8400-e29b-41d4-a716-446655440000, $1,234.50."),
        ("literal", "Keep [EMAIL_1] and [PHONE_12] and [EMAIL_ as written; [NOT_A_RULE_1] too. a@b.co"),
        ("unicode", "日本語 mail: 名前@example.jp? ann@example.com — ok\n\ttabs \"quotes\" \\ backslash"),
        ("names", "Ask John Underwood and Mr Hardy; je m'appelle Françoise Gauthier. 我叫朱颖，帮欧阳娜娜写信。"
                  "担当は井上 篤司です、田中さん。Best regards,\nJürgen Müller [NAME_1]"),
        ("addresses", "Ship to 8353 Kathleen Highway Apt. 681\nLake Victoria, VI 39349 or Flat 37\nBennett Mall\nN8 8HN; "
                      "Schaafstraße 1-8\n66258 Brand; 29, rue Alphonse Michel\n83654 Sainte Marianne; "
                      "广西壮族自治区天津市江北蒋路H座 477835；福島県横浜市泉区西神田2丁目1番1号 〒123-4567 [ADDRESS_1]"),
    ]
    # the national-format detectors (phone, IBAN, national ids) in a chat request
    seed("pii_request", "ids-chat", [0, 0], j({"model": "fast", "messages": [
        {"role": "user", "content": dict(texts)["ids"]}]}))
    for mode in range(3):
        for name, text in texts:
            seed("pii_stream", f"{['chat', 'anthropic', 'responses'][mode]}-{name}", [mode] + split_plan([3, 7, 1, 9]) + split_plan([23, 5, 80]), text)
    seed("pii_stream", "chat-bytewise", [0] + split_plan([2, 2, 2]) + split_plan(every_byte=True), texts[0][1][:120])
    for name, body in STREAMS.items():
        seed("pii_stream", f"raw-{name}", [3, 0] + split_plan([31, 0, 7]), body)
        seed("pii_stream", f"raw-output-{name}", [3, 1] + split_plan([64]), body)


# ---- configurations ----------------------------------------------------------------------

PLUGINS = ["key-auth", "model-router", "pii-redaction", "token-ratelimit", "usage-accounting"]


def envoy_configs():
    """(plugin, file stem, index, JSON text) of every wasm filter configuration."""
    for path in sorted((ROOT / "envoy-config").glob("*.yaml")):
        text = path.read_text()
        doc = yaml.safe_load(re.sub(r"\$\{(\w+)\}", r"\1", text))
        found = []

        def walk(node):
            if isinstance(node, dict):
                code = node.get("vm_config", {}).get("code", {}) if isinstance(node.get("vm_config"), dict) else {}
                filename = json.dumps(code)
                cfg = node.get("configuration")
                if isinstance(cfg, dict) and "value" in cfg:
                    m = re.search(r"/([a-z-]+)\.wasm", filename)
                    # a `${VAR}` the e2e tests fill in is no configuration to seed
                    if m and m.group(1) in PLUGINS and cfg["value"].strip().startswith("{"):
                        found.append((m.group(1), cfg["value"]))
                for v in node.values():
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)

        walk(doc)
        for i, (plugin, value) in enumerate(found):
            yield plugin, path.stem, i, value


def higress_configs():
    """(plugin, JSON text) of every WasmPlugin, converted as Higress converts it."""
    for path in sorted((ROOT / "higress").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "WasmPlugin":
                continue
            spec = doc["spec"]
            top = dict(spec.get("defaultConfig") or {})
            rules = []
            for rule in spec.get("matchRules") or []:
                entry = dict(rule.get("config") or {})
                for field, key in [("ingress", "_match_route_"), ("service", "_match_service_"), ("domain", "_match_domain_")]:
                    if rule.get(field):
                        entry[key] = rule[field]
                rules.append(entry)
            if rules:
                top["_rules_"] = rules
            plugin = re.search(r"/([a-z-]+):", spec["url"]).group(1)
            yield plugin, path.stem, j(top)


def config_seeds():
    for plugin, stem, i, text in envoy_configs():
        seed("config", f"envoy-{stem}-{i}-{plugin}", [PLUGINS.index(plugin), 0x15], text)
    for path in sorted((ROOT / "envoy-config").glob("*.json")):
        # e2e-key-auth.json: the key-auth config the e2e suite hands Envoy through ${KEY_AUTH_CONFIG}
        plugin = next((p for p in PLUGINS if p in path.stem), None)
        if plugin:
            seed("config", f"envoy-{path.stem}", [PLUGINS.index(plugin), 0x15], path.read_text())
    for plugin, stem, text in higress_configs():
        seed("config", f"higress-{stem}", [PLUGINS.index(plugin), 0x15], text)
    seed("config", "rules-only", [5, 0x06], j({"_rules_": [
        {"_match_route_": ["default/llm-batch"], "a": 1},
        {"_match_domain_": ["*.example.com", "www.*"], "b": 2},
        {"_match_service_": ["api.openai.com:443", "openai"], "c": 3},
        {"_match_route_prefix_": ["llm-"], "d": 4}]}))
    seed("config", "pii-patterns", [2, 0], j({"rules": [
        {"name": "EMPLOYEE", "pattern": "E-[0-9]{6}"}, {"name": "CODENAME", "words": ["Project Falcon", "a.b*c"], "action": "block"},
        {"detector": "card", "action": "hash"}], "hash_salt": "a-long-secret-salt-value", "output_rules": [{"detector": "ipv4"}]}))
    seed("config", "secret-in-wrong-field", [1, 0], j({"deployments": [
        {"name": "d", "provider": "openai", "model": "gpt-4o", "credential": 12345,
         "cluster": "sk-live-should-not-echo-0001"}], "groups": []}))
    seed("config", "empty", [0, 0], "")
    # regression (oracle): the fuzzer wrote an error message itself into key_sha256; the
    # message holds that text without echoing the secret
    seed("config", "regression-secret-is-the-message", [0, 0x15], j({"global_auth": False, "keys": [
        {"key_sha256": "invalid configuration: `keys[0]`: missing field `consumer`", "tenant": "demo",
         "groups": ["fast", "smart"]}], "_rules_": [{"all-ow": ["demo"], "_match_route_": ["default/llm-api"]}]}))


# ---- Redis replies -----------------------------------------------------------------------

def resp_seeds():
    replies = [
        ("ok", b"+OK\r\n"), ("noscript", b"-NOSCRIPT No matching script. Please use EVAL.\r\n"),
        ("integer", b":-42\r\n"), ("bulk", b"$5\r\nhello\r\n"), ("null-bulk", b"$-1\r\n"), ("null-array", b"*-1\r\n"),
        ("lease", b"*3\r\n:5\r\n:95\r\n:0\r\n"), ("give-back", b"*1\r\n:7\r\n"),
        ("reserve", b"*3\r\n:1\r\n:10\r\n:-3\r\n"), ("refused", b"*3\r\n:0\r\n:2\r\n:-4\r\n"),
        ("reconcile", b"*3\r\n:1\r\n:4\r\n:-2\r\n"), ("already", b"*1\r\n:0\r\n"),
        ("nested", b"*2\r\n*2\r\n$1\r\nx\r\n:1\r\n*1\r\n*1\r\n+deep\r\n"),
        ("xadd", b"$15\r\n1764460800000-0\r\n"), ("binary", b"$4\r\n\x00\r\n\xff\r\n"),
        ("huge-count", b"*4097\r\n:1\r\n"), ("huge-bulk", b"$1048577\r\nx\r\n"),
    ]
    for name, reply in replies:
        seed("resp_decode", name, [0, 2], reply)
    seed("resp_decode", "tight-limits", [1, 1], b"*4\r\n$9\r\n123456789\r\n*1\r\n*1\r\n:1\r\n:2\r\n:3\r\n")

    # webdis answers (status selector 4 = 200, 2 = 503), and command arguments split at 0xff
    for name, body in [
        ("reserve", b'{"EVALSHA":[1,99999999999,3]}'),
        ("noscript", b'{"EVALSHA":[false,"NOSCRIPT No matching script. Please use EVAL."]}'),
        ("xadd", b'{"XADD":"1700000000000-0"}'),
        ("nested", b'{"EVAL":[[1,"a"],null,[true,"OK"]]}'),
        ("args", b"EVAL\xffreturn {KEYS[1]}\xff1\xff{t:a}/b.c+%?"),
    ]:
        seed("webdis_reply", name, [4], body)
    seed("webdis_reply", "503", [2], b"")


# ---- host input --------------------------------------------------------------------------

def header_map(pairs):
    out = struct.pack("<I", len(pairs))
    for name, value in pairs:
        out += struct.pack("<II", len(name), len(value))
    for name, value in pairs:
        out += name + b"\0" + value + b"\0"
    return out


def host_seeds():
    request = [(b":authority", b"gateway.example.com"), (b":path", b"/v1/chat/completions?key=sk-fuzz-team-a-0001&x=1"),
               (b":method", b"POST"), (b"authorization", b"Bearer sk-fuzz-team-a-0001"),
               (b"x-llm-consumer", b"spoofed"), (b"X-Mse-Consumer", b"admin"), (b"x-request-id", b"req-1\r\nx-evil: 1"),
               (b"x-project", b"proj\x07ect"), (b"content-type", b"application/json")]
    seed("host_input", "header-map", [0, 0], header_map(request))
    seed("host_input", "header-map-disabled-key", [0, 1], header_map([(b"x-api-key", b"sk-fuzz-team-b-0002"), (b"x-llm-tenant", b"t")]))
    lines = [
        ("bearer", ":path: /v1/messages\nauthorization: bearer  sk-fuzz-team-a-0001 \nx-llm-groups: *\nx-agent: a\n"),
        ("query", ":path: /v1/responses?x=1&key=sk%2Dfuzz%2Dteam%2Da%2D0001&key=other\nx-forwarded-for: 1.2.3.4\n"),
        ("api-key", ":path: /v1/embeddings\napi-key: sk-fuzz-team-a-0001\nAuthorization: Basic Zm9v\nx-llm-request-id: r-9\n"),
        ("missing", ":path: /v1/chat/completions\nx-llm-consumer: team-a\n"),
    ]
    for name, text in lines:
        seed("host_input", name, [1, 0], text)
    values = [
        ("route-info", j({"request_id": "r-1", "model_group": "fast", "deployment": "openai-mini", "model": "gpt-4o-mini",
                          "provider": "openai", "price": {"input": 150000, "output": 600000, "currency": "USD"},
                          "price_version": "2026-11", "route_version": "v1", "attempts": 2, "tried": ["azure-mini"]})),
        ("alternative", j({"route": {"request_id": "r-1", "model_group": "cheap", "deployment": "d", "model": "m",
                                     "provider": "openai", "route_version": "v1", "attempts": 1},
                           "deployments": ["d", "e"], "clusters": ["c1", "c2"]})),
        ("record", j({"request_id": "r-1", "ts_ms": 1764460800000, "consumer": "team-a", "tenant": "acme", "project": None,
                      "agent": None, "run_id": None, "model_group": "fast", "deployment": "openai-mini", "model": "gpt-4o-mini",
                      "api": "chat.completions", "stream": True, "status": 200, "complete": True,
                      "attempts": [{"deployment": "openai-mini", "status": 200}], "usage_source": "upstream",
                      "usage": {"prompt_tokens": 19, "completion_tokens": 10, "cached_prompt_tokens": 0,
                                "cache_write_tokens": 0, "reasoning_tokens": 0},
                      "cost_nano": 8850, "currency": "USD", "price_version": "2026-11", "ttft_ms": 120, "duration_ms": 900})),
        ("breaker", "o 1764460800000 3 1f 12"),
        ("journal", j({"entries": [[1, {"op": "reconcile", "reservation": "llm:{acme}:res:r-1", "keys": ["llm:{acme}:b:day"],
                                        "actual": [29]}],
                                   [2, {"op": "charge", "marker": "llm:{acme}:m:r-2", "keys": ["k"], "amounts": [5],
                                        "expire_at_ms": [1764547200000]}]], "next": 3})),
        ("bucket", bytes([2]) + struct.pack("<qQqQQQQQ", 100, 1764460800000, -5, 0, 0, 0, 7, 1764460800000)),
        ("month", "2026-11"), ("rfc3339", "2027-01-01T00:00:00.5+08:00"), ("money", "5000.123456789"),
        ("property", struct.pack("<Q", 443)),
    ]
    for name, value in values:
        seed("host_input", name, [2, 0], value)


# ---- dictionaries (libFuzzer -dict=): tokens the mutator splices in -------------------------

def translate_seeds():
    """model-router's translate: mode byte = entry (0 request, 1 response, 2 error, 3 stream)
    | from (4: Messages) | to (8: Messages), then the entry's parameters and the payload."""
    chat, messages = 0, 1

    def mode(entry, frm, to):
        return entry | (frm << 2) | (to << 3)

    chat_tools = dict(CHAT, stream=False, stop=["END"], temperature=1.4, top_p=0.9, max_completion_tokens=300,
                      user="u-1", n=1, parallel_tool_calls=False, seed=7, stream_options={"include_usage": True},
                      tools=[{"type": "function", "function": {"name": "lookup", "description": "Find a record",
                                                               "parameters": {"type": "object", "properties": {
                                                                   "id": {"type": "string"}}}, "strict": True}}],
                      tool_choice={"type": "function", "function": {"name": "lookup"}})
    chat_images = {"model": "fast", "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "Describe."}]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=",
                                                                         "detail": "low"}}]},
        {"role": "user", "content": "and this?"}]}
    anthropic_full = dict(ANTHROPIC, temperature=0.5, top_k=40, stop_sequences=["\n\nHuman:"],
                          metadata={"user_id": "u-2"}, thinking={"type": "enabled", "budget_tokens": 1024},
                          tools=[{"name": "mail", "description": "Send mail", "input_schema": {"type": "object"},
                                  "cache_control": {"type": "ephemeral"}}],
                          tool_choice={"type": "any", "disable_parallel_tool_use": True})
    anthropic_images = {"model": "claude", "max_tokens": 64, "messages": [
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
            {"type": "text", "text": "compare"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "...", "signature": "s"},
                                          {"type": "text", "text": "Same."}]}]}
    for name, frm, to, body, flags in [
        ("request-chat", chat, messages, CHAT, 0),
        ("request-chat-tools", chat, messages, chat_tools, 3),
        ("request-chat-images", chat, messages, chat_images, 8),
        ("request-chat-refused", chat, messages, dict(CHAT, n=2, response_format={"type": "json_object"}), 0),
        ("request-anthropic", messages, chat, ANTHROPIC, 1),
        ("request-anthropic-full", messages, chat, anthropic_full, 0),
        ("request-anthropic-images", messages, chat, anthropic_images, 1),
        ("request-same", chat, chat, CHAT, 0),
    ]:
        seed("translate", name, [mode(0, frm, to), flags], j(body))
    chat_body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1741569952, "model": "gpt-4.1",
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi", "refusal": None,
                                                      "tool_calls": [{"id": "call_1", "type": "function", "function": {
                                                          "name": "lookup", "arguments": "{\"id\":\"7\"}"}}]},
                              "logprobs": None, "finish_reason": "tool_calls"}],
                 "usage": {"prompt_tokens": 19, "completion_tokens": 10, "total_tokens": 29,
                           "prompt_tokens_details": {"cached_tokens": 4}}}
    anthropic_body = {"id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                      "content": [{"type": "text", "text": "Hi!"},
                                  {"type": "tool_use", "id": "toolu_1", "name": "mail", "input": {"to": "x"}}],
                      "stop_reason": "tool_use", "stop_sequence": None,
                      "usage": {"input_tokens": 2095, "output_tokens": 503, "cache_creation_input_tokens": 100,
                                "cache_read_input_tokens": 1800}}
    seed("translate", "response-chat", [mode(1, chat, messages)], j(chat_body))
    seed("translate", "response-anthropic", [mode(1, messages, chat)], j(anthropic_body))
    for name, frm, to, status, body in [
        ("error-openai", chat, messages, 429, j({"error": {"message": "Rate limit reached", "type": "requests",
                                                          "param": None, "code": "rate_limit_exceeded"}})),
        ("error-quota", chat, messages, 429, j({"error": {"message": "Quota", "type": "insufficient_quota",
                                                         "param": None, "code": "insufficient_quota"}})),
        ("error-anthropic", messages, chat, 529, j({"type": "error", "error": {"type": "overloaded_error",
                                                                              "message": "Overloaded"}})),
        ("error-html", messages, chat, 502, "<html><body>Bad Gateway</body></html>"),
        ("error-empty", chat, messages, 503, ""),
    ]:
        seed("translate", name, [mode(2, frm, to), status >> 8, status & 0xff], body)
    for name, frm, to, body in [
        ("stream-anthropic", messages, chat, STREAMS["anthropic"]),
        ("stream-anthropic-error", messages, chat, STREAMS["anthropic-error"]),
        ("stream-chat", chat, messages, STREAMS["chat"]),
        ("stream-chat-tools", chat, messages, STREAMS["chat-tools"]),
        ("stream-chat-cut", chat, messages, STREAMS["chat"][:300]),
        ("stream-same", messages, messages, STREAMS["anthropic"]),
    ]:
        seed("translate", name, [mode(3, frm, to), 3] + split_plan([40, 0, 200, 3]), body)
    seed("translate", "stream-anthropic-bytewise", [mode(3, messages, chat), 3] + split_plan(every_byte=True),
         STREAMS["anthropic"])
    # regression: a text delta holding a lone surrogate escape (grammatical JSON, not text) went
    # through the fast path as it was: the client got a chunk its JSON parser refuses
    lone = "\\ud83d"
    seed("translate", "regression-lone-surrogate-anthropic", [mode(3, messages, chat), 3] + split_plan([40, 0, 200, 3]),
         STREAMS["anthropic"].replace(", see you.", ", see" + lone + " you.", 1))
    seed("translate", "regression-lone-surrogate-chat", [mode(3, chat, messages), 3] + split_plan([40, 0, 200, 3]),
         STREAMS["chat"].replace("! Mail ", "! Mail " + lone, 1))


def dict_entry(token):
    if isinstance(token, str):
        token = token.encode()
    out = ""
    for b in token:
        c = chr(b)
        if c in '"\\' or b < 0x20 or b > 0x7e:
            out += f"\\x{b:02x}"
        else:
            out += c
    return f'"{out}"'


def write_dict(name, tokens):
    path = ROOT / "fuzz" / "dict" / f"{name}.dict"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# written by fuzz/seeds.py: tokens for the {name} targets"]
    lines += sorted({dict_entry(t) for t in tokens})
    path.write_text("\n".join(lines) + "\n")


def json_keys(value, keys):
    if isinstance(value, dict):
        for k, v in value.items():
            keys.add(k)
            json_keys(v, keys)
    elif isinstance(value, list):
        for v in value:
            json_keys(v, keys)
    return keys


JSON_TOKENS = ["{", "}", "[", "]", ":", ",", '"', "\\", "\\u", "\\ud83d\\ude00", "\\ud800", "true", "false",
               "null", "-0", "1e400", "18446744073709551616", "0.5", " ", "\n", "\r\n"]


def dictionaries():
    api_keys = set()
    for _, _, body in REQUESTS:
        json_keys(body, api_keys)
    for stream in STREAMS.values():
        for line in stream.splitlines():
            if line.startswith("data: {"):
                json_keys(json.loads(line[6:]), api_keys)
    api_words = [f'"{k}":' for k in api_keys] + [
        '"stream_options":{"include_usage":true}', '"include_usage"', '"max_completion_tokens"',
        '"max_output_tokens"', "[EMAIL_1]", "[PHONE_1]", "[EMAIL_", "ann@example.com", "+86 138 0013 8000",
        "4111 1111 1111 1111", "11010519491231002X", "10.0.0.1", "::1", "sk-proj-0123456789abcdefghijkl",
        "AKIAIOSFODNN7EXAMPLE", "-----BEGIN PRIVATE KEY-----", "-----END PRIVATE KEY-----",
        "[IBAN_1]", "[ID_1]", "[IP_1]", "+1 (415) 555-0132", "+44(0)20 7946 0958", "01632 960 367",
        "080-9718-5680", "(0161) 4960066", "x123", " ext. ", "0049 ", "DE89 3704 0044 0532 0130 00",
        "GB82WEST12345698765432", "123-45-6789", "AB 12 34 56 C", "1 85 05 78 006 084 91", "2A", "2B",
        "86095742719", "1234 5678 9018", "個人番号", "501800000009", "180000000000002", "call ", "order "]
    write_dict("json", JSON_TOKENS + api_words)
    sse_words = ["data: ", "data:", "event: ", "id: ", "retry: ", ": ping", "\n\n", "\r\n\r\n", "\r\r", "[DONE]",
                 "message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
                 "message_stop", "text_delta", "input_json_delta", "response.output_text.delta",
                 "response.output_text.done", "response.function_call_arguments.delta", "response.completed",
                 "response.failed", "response.incomplete", '"usage":', '"choices":[]', '"finish_reason":"stop"',
                 '"prompt_tokens":', '"completion_tokens":', '"cached_tokens":', '"reasoning_tokens":',
                 '"input_tokens":', '"output_tokens":', '"cache_read_input_tokens":', '"cache_creation_input_tokens":']
    write_dict("sse", JSON_TOKENS + api_words + sse_words)
    config_keys = set()
    for _, _, _, text in envoy_configs():
        json_keys(json.loads(text), config_keys)
    for _, _, text in higress_configs():
        json_keys(json.loads(text), config_keys)
    config_words = [f'"{k}":' for k in config_keys] + [
        '"_rules_":[{', '"_match_route_":["r"]', '"_match_route_prefix_":', '"_match_domain_":["*.a.com"]',
        '"_match_service_":["s:80"]', '"_match_other_":', "minute", "second", "hour", "day", "month", "mask", "hash",
        "block", "openai", "anthropic", "openai-compatible", "reject", "pass", "raw_body", "messages", "allow",
        "email", "phone_cn", "phone_e164", "id_cn", "card", "ipv4", "ipv6", "openai_key", "aws_access_key", "jwt",
        "phone", "iban", "ssn_us", "nino_uk", "nir_fr", "tax_id_de", "my_number_jp", "person_name", "street_address",
        "private_key", "(a+)+", "[^", "\\d{99999}", "2027-01-01T00:00:00Z", "0.000001", "1e999"]
    write_dict("config", JSON_TOKENS + config_words)
    write_dict("resp", ["\r\n", "+OK", "-ERR ", "-NOSCRIPT ", ":", ":-1", "$", "$-1", "*", "*-1", "*0", "$0\r\n\r\n",
                        "9223372036854775807", "-9223372036854775808", "4097", "1048577"])
    write_dict("text", ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'RE", " ", "  ", "\n", "\r\n", "\t",
                        "\u00a0", "\u3000", "123", "4567", "/", "//", "é", "e\u0301", "日本", "ー", "ǅ", "Ⅻ",
                        "👩\u200d👧", "\u200d", "ſ", "ß", "İ", "µ", "\U0001d400", "HTTPServer", "camelCase",
                        # person_name and street_address: names, cues, street shapes
                        "John ", "Underwood", "Mr ", "Dr. ", "M. ", "Herr ", "my name is ", "je m'appelle ",
                        "ich heiße ", "Best regards,\n", " van der ", " de la ", "朱", "欧阳", "颖", "我叫", "帮",
                        "先生", "女士", "井上", " 篤司", "さん", "様", " Street", " Apt. 4", ", NY 10001", "SW1A 1AA",
                        "straße 12", "str. 5", "12345 Berlin", "29, rue ", "75001 Paris", "省", "市", "区", "路",
                        "88号", "H座", "県", "丁目", "番地", "〒123-4567"])
    write_dict("headers", [":path: ", ":authority: ", "authorization: ", "Bearer ", "bearer ", "x-api-key: ",
                           "api-key: ", "x-llm-consumer: ", "x-llm-tenant: ", "x-llm-groups: ", "X-LLM-", "x-mse-consumer: ",
                           "x-request-id: ", "x-llm-request-id: ", "x-project: ", "x-agent: ", "x-run-id: ",
                           "x-forwarded-for: ", "?key=", "&key=", "%2D", "%", "sk-fuzz-team-a-0001",
                           "sk-fuzz-team-b-0002", "\r\n", "\x00\x00\x00\x00", "\xff\xff\xff\xff"]
               + JSON_TOKENS + ['"request_id":', '"attempts":', '"tried":', '"price":', '"op":"charge"', '"entries":'])


def token_seeds():
    """Text for the token counter: both encodings (parameter byte 0 / 1)."""
    texts = {
        "prose": "The quarterly review covers onboarding, billing disputes and the migration plan.",
        "contractions": "don't DON'T I'M here, they'll've 'S 's 'RE 'Ll ſ'ſ",
        "whitespace": "  indented\n\n\tcode();  \n \r\n\u00a0\u3000\u2028x" + " " * 40 + "\n",
        "code": "fn main() {\n    let x = vec![1, 22, 333, 4444];\n    println!(\"{x:?}\"); // 12345678\n}\n",
        "json": '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Hi!"}],"max_tokens":128}',
        "cjk": "日本語のテキストを数えます。東京タワーは333メートルです。中文：今天天气很好！ｶﾀｶﾅ",
        "scripts": "Русский МОСКВА مرحبا ١٢٣ हिन्दी क्षत्रिय ภาษาไทย 한국어 Ελληνικά ǅ Ⅻ ²½",
        "marks": "Cafe\u0301 re\u0301sume\u0301 U\u0308ber \u0301\u0308 \u093f",
        "emoji": "👩\u200d👩\u200d👧 👍🏽 🇫🇷 😀😀 \u200b\ufeff Ⓐ €",
        "slashes": "path/to//file ///x \\\\ http://a.b/c?d=e&f=g",
    }
    for name, text in texts.items():
        for encoding in (0, 1):
            seed("token_count", f"{name}-{encoding}", [encoding], text)


dictionaries()
sse_seeds()
usage_seeds()
json_seeds()
pii_seeds()
config_seeds()
resp_seeds()
host_seeds()
token_seeds()
translate_seeds()
for target, n in sorted(written.items()):
    print(f"{target}: {n} seeds")
