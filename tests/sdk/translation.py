#!/usr/bin/env python3
"""The router's API translation, driven by the unmodified official SDKs.

    translation.py --gateway http://127.0.0.1:PORT --key DEMO_KEY [--part PART ...]
                   [--fallback PREFIX GROUP DEPLOYMENT SDKS ...]

Run by tests/e2e/translation.rs against the demo gateway (envoy-config/gateway.yaml with its
mock providers); stdlib, `openai` and `anthropic` only (installed into .venv by scripts/setup).
Each part checks what a client of the SDK sees, exits non-zero with a message naming the failed
check, and the script prints one JSON object of observations on stdout (and nothing else
there), which the Rust side holds against what the providers received and the access log:

- `openai-sdk`: the `openai` SDK at group `claude` (an Anthropic deployment): a completion with
  a system message and cached prompt tokens, streams with and without
  `stream_options.include_usage`, a tool call (JSON and stream, the stream's calls accumulated
  by the SDK's `chat.completions.stream` helper and by hand) and its result sent back, an image
  part, an e-mail address masked for the provider and restored (JSON and stream), and the SDK's
  typed errors for the provider's 400, 429 and 529;
- `anthropic-sdk`: the `anthropic` SDK at group `fast` (OpenAI first, Azure OpenAI second):
  `messages.create` with `system`, `messages.stream`, a tool call (JSON and stream) and its
  `tool_result` sent back, `messages.count_tokens` (the gateway's own estimate), and the SDK's
  typed errors for the providers' 400, 429 and 503;
- `--fallback PREFIX GROUP DEPLOYMENT SDKS`: each SDK of SDKS (`openai,anthropic`), JSON and
  stream, at GROUP, answered by DEPLOYMENT after the first deployment failed (`x-llm-attempts:
  2`): Anthropic to OpenAI or the reverse in a mixed group, or OpenAI to Azure OpenAI.

Each request names its step in `x-run-id` (also its `x-user-id`, so that gateway.yaml's per-user
limits stay out of the way) and the knobs of the mock providers it needs (`x-mock-*`). Every
HTTP exchange (request headers, response status, headers and the body bytes the client read) is
recorded by a wrapping transport and reported under `exchanges`; each step reports its
response's `x-request-id` and `x-llm-*` headers.
"""

import argparse
import json
import sys

import anthropic
import openai

from recording import Failure, RecordingTransport, check, httpx  # noqa: E402 (tests/sdk/recording.py)

EMAIL = "jane.doe@example.com"
PII_MESSAGE = f"Please write to {EMAIL} about the invoice."
SYSTEM = "You are terse."
IMAGE_URL = "data:image/png;base64,iVBORw0KGgo="
TOOL_RESULT = "Sunny, 21 degrees"
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "the city"}},
    "required": ["city"],
}
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": WEATHER_SCHEMA,
        },
    }
]
ANTHROPIC_TOOLS = [
    {"name": "get_weather", "description": "Current weather of a city", "input_schema": WEATHER_SCHEMA}
]
# The mock's completion without x-mock-echo: 8 "tokens".
MOCK_TEXT = "".join(f"tok{i} " for i in range(8))


class Run:
    """The clients, the recorder and the observations of one run."""

    def __init__(self, args):
        self.args = args
        self.transport = RecordingTransport()
        self.openai = openai.OpenAI(
            base_url=f"{args.gateway}/v1",
            api_key=args.key,
            max_retries=0,
            timeout=20.0,
            http_client=openai.DefaultHttpxClient(transport=self.transport),
        )
        # the SDK's own defaults: x-api-key, anthropic-version
        self.anthropic = anthropic.Anthropic(
            base_url=args.gateway,
            api_key=args.key,
            max_retries=0,
            timeout=20.0,
            http_client=anthropic.DefaultHttpxClient(transport=self.transport),
        )
        self.steps = {}

    def observe(self, step, **observed):
        """Records a step's observations with the gateway's answer to it: status, request id
        and the `x-llm-*` headers."""
        exchange = self.transport.last(step)
        headers = {k.lower(): v for k, v in exchange["headers"]}
        check(headers.get("x-request-id"), f"{step}: x-request-id", headers)
        self.steps[step] = dict(
            observed,
            status=exchange["status"],
            request_id=headers["x-request-id"],
            headers={k: v for k, v in headers.items() if k.startswith("x-llm-") or k == "content-type"},
        )
        return self.steps[step]


def knobs(step, **extra):
    """The step's headers: its name, and the mock providers' knobs (`x_mock_echo="1"` →
    `x-mock-echo: 1`)."""
    headers = {"x-run-id": step, "x-user-id": step}
    headers.update({name.replace("_", "-"): value for name, value in extra.items()})
    return headers


def check_stream_end(run, step, api):
    """The stream the client read ends with its API's terminator (an SDK may just stop at the
    end of a body that lacks it): `data: [DONE]` (Chat), a `message_stop` event (Messages)."""
    events = [e for e in bytes(run.transport.last(step)["body"]).decode().split("\n\n") if e.strip()]
    check(events, f"{step}: events", events)
    if api == "chat":
        check(events[-1].strip() == "data: [DONE]", f"{step}: the stream ends with data: [DONE]", events[-1])
        check(all(e.startswith("data: ") for e in events), f"{step}: data events only", events)
    else:
        check(events[-1].startswith("event: message_stop\n"), f"{step}: the stream ends with message_stop", events[-1])
        check(sum(e.startswith("event: message_start\n") for e in events) == 1, f"{step}: one message_start", events)


def chat_usage(usage):
    return None if usage is None else usage.model_dump(exclude_none=True)


def check_chat_usage(step, usage):
    check(usage is not None, f"{step}: usage", usage)
    check(usage.prompt_tokens > 0 and usage.completion_tokens > 0, f"{step}: prompt and completion tokens", usage)
    check(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, f"{step}: total = prompt + completion", usage)


def check_message_usage(step, usage):
    check(usage.input_tokens > 0 and usage.output_tokens > 0, f"{step}: input and output tokens > 0", usage)


# --- the openai SDK at an Anthropic deployment ------------------------------------------------


def openai_completion(run, step, group, messages, **kwargs):
    completion = run.openai.chat.completions.create(model=group, messages=messages, **kwargs)
    check(isinstance(completion, openai.types.chat.ChatCompletion), f"{step}: a ChatCompletion", type(completion))
    check(completion.object == "chat.completion", f"{step}: object", completion.object)
    check(len(completion.choices) == 1, f"{step}: one choice", completion.choices)
    check_chat_usage(step, completion.usage)
    return completion


def openai_stream(run, step, group, messages, include_usage, **kwargs):
    """The chunks of a stream, checked for what every stream must hold."""
    extra = {"stream_options": {"include_usage": True}} if include_usage else {}
    stream = run.openai.chat.completions.create(model=group, messages=messages, stream=True, **extra, **kwargs)
    # iterating to the end: the SDK raises on an error event or a broken stream
    chunks = list(stream)
    check_stream_end(run, step, "chat")
    check(len(chunks) > 1, f"{step}: several chunks", len(chunks))
    for chunk in chunks:
        check(isinstance(chunk, openai.types.chat.ChatCompletionChunk), f"{step}: ChatCompletionChunk", type(chunk))
        check(chunk.object == "chat.completion.chunk", f"{step}: chunk object", chunk.object)
    check(len({c.id for c in chunks}) == 1, f"{step}: one id across the chunks", {c.id for c in chunks})
    with_choices = [c for c in chunks if c.choices]
    finish = [c.choices[0].finish_reason for c in with_choices if c.choices[0].finish_reason]
    check(len(finish) == 1, f"{step}: one finish_reason", finish)
    with_usage = [i for i, c in enumerate(chunks) if c.usage is not None]
    empty = [i for i, c in enumerate(chunks) if not c.choices]
    if include_usage:
        check(with_usage == [len(chunks) - 1], f"{step}: usage on the last chunk only", with_usage)
        check(empty == [len(chunks) - 1], f"{step}: the usage chunk has no choices", empty)
        check_chat_usage(step, chunks[-1].usage)
    else:
        check(with_usage == [], f"{step}: no usage chunk the client did not ask for", with_usage)
        check(empty == [], f"{step}: no chunk without choices", empty)
    content = "".join(c.choices[0].delta.content or "" for c in with_choices)
    return chunks, content, finish[0]


def accumulated_tool_calls(chunks):
    """The tool calls of a stream, the deltas concatenated by index (as a client does)."""
    calls = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                if delta.id:
                    call["id"] = delta.id
                if delta.function and delta.function.name:
                    call["name"] += delta.function.name
                if delta.function and delta.function.arguments:
                    call["arguments"] += delta.function.arguments
    return [calls[i] for i in sorted(calls)]


def check_weather_call(step, name, arguments):
    check(name == "get_weather", f"{step}: the tool called", name)
    parsed = json.loads(arguments)
    check(isinstance(parsed, dict) and parsed, f"{step}: arguments are a JSON object", arguments)
    return parsed


def openai_sdk(run):
    group = "claude"
    out = {}

    # a completion with a system message; the provider reports 3 cached prompt tokens
    step = "oa-json"
    completion = openai_completion(
        run,
        step,
        group,
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello, Claude"}],
        extra_headers=knobs(step, x_mock_cache_read_tokens="3"),
    )
    choice = completion.choices[0]
    check(choice.message.role == "assistant", f"{step}: role", choice.message.role)
    check(choice.message.content == MOCK_TEXT, f"{step}: content", choice.message.content)
    check(choice.message.tool_calls is None, f"{step}: no tool calls", choice.message.tool_calls)
    check(choice.finish_reason == "stop", f"{step}: finish_reason", choice.finish_reason)
    check(completion.model == "claude-sonnet-4-5", f"{step}: model answered", completion.model)
    check(completion.usage.completion_tokens == 8, f"{step}: completion tokens", completion.usage)
    details = completion.usage.prompt_tokens_details
    check(details is not None and details.cached_tokens == 3, f"{step}: cached_tokens", details)
    out[step] = run.observe(step, content=choice.message.content, model=completion.model, usage=chat_usage(completion.usage))

    # streams, with and without the usage chunk
    for step, include_usage in [("oa-stream-usage", True), ("oa-stream", False)]:
        chunks, content, finish = openai_stream(
            run,
            step,
            group,
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello, Claude"}],
            include_usage,
            extra_headers=knobs(step),
        )
        check(content == MOCK_TEXT, f"{step}: reassembled content", content)
        check(finish == "stop", f"{step}: finish_reason", finish)
        check(chunks[0].model == "claude-sonnet-4-5", f"{step}: model answered", chunks[0].model)
        out[step] = run.observe(
            step, content=content, chunks=len(chunks), usage=chat_usage(chunks[-1].usage), finish_reason=finish
        )

    # a tool call, JSON
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    step = "oa-tool-json"
    completion = openai_completion(
        run, step, group, ask, tools=OPENAI_TOOLS, extra_headers=knobs(step, x_mock_tool_call="get_weather")
    )
    choice = completion.choices[0]
    check(choice.finish_reason == "tool_calls", f"{step}: finish_reason", choice.finish_reason)
    calls = choice.message.tool_calls or []
    check(len(calls) == 1, f"{step}: one tool call", calls)
    call = calls[0]
    check(call.type == "function" and call.id, f"{step}: a function call with an id", call)
    arguments = check_weather_call(step, call.function.name, call.function.arguments)
    out[step] = run.observe(step, id=call.id, name=call.function.name, arguments=arguments)

    # the same, streamed: the deltas accumulated by hand and by the SDK's stream helper
    step = "oa-tool-stream"
    chunks, content, finish = openai_stream(
        run, step, group, ask, True, tools=OPENAI_TOOLS, extra_headers=knobs(step, x_mock_tool_call="get_weather")
    )
    check(finish == "tool_calls", f"{step}: finish_reason", finish)
    check(content == "", f"{step}: no text", content)
    by_hand = accumulated_tool_calls(chunks)
    check(len(by_hand) == 1 and by_hand[0]["id"], f"{step}: one call with an id", by_hand)
    check(
        check_weather_call(step, by_hand[0]["name"], by_hand[0]["arguments"]) == arguments,
        f"{step}: the streamed arguments are the JSON answer's",
        by_hand,
    )
    out[step] = run.observe(step, calls=by_hand)
    step = "oa-tool-stream-helper"
    with run.openai.chat.completions.stream(
        model=group,
        messages=ask,
        tools=OPENAI_TOOLS,
        stream_options={"include_usage": True},
        extra_headers=knobs(step, x_mock_tool_call="get_weather"),
    ) as stream:
        final = stream.get_final_completion()
    check_stream_end(run, step, "chat")
    helper_calls = final.choices[0].message.tool_calls or []
    check(len(helper_calls) == 1, f"{step}: one accumulated call", helper_calls)
    check(
        check_weather_call(step, helper_calls[0].function.name, helper_calls[0].function.arguments) == arguments,
        f"{step}: the accumulated arguments are the JSON answer's",
        helper_calls,
    )
    check(final.choices[0].finish_reason == "tool_calls", f"{step}: finish_reason", final.choices[0].finish_reason)
    check_chat_usage(step, final.usage)
    out[step] = run.observe(step, name=helper_calls[0].function.name, arguments=json.loads(helper_calls[0].function.arguments))

    # the tool's result sent back: the provider gets tool_use and tool_result blocks, the
    # mock echoes the result
    step = "oa-tool-result"
    completion = openai_completion(
        run,
        step,
        group,
        ask
        + [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
            {"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT},
        ],
        tools=OPENAI_TOOLS,
        extra_headers=knobs(step, x_mock_echo="1"),
    )
    answer = completion.choices[0].message.content
    check(answer == TOOL_RESULT, f"{step}: the answer echoes the tool result", answer)
    check(completion.choices[0].finish_reason == "stop", f"{step}: finish_reason", completion.choices[0].finish_reason)
    out[step] = run.observe(step, content=answer, tool_call_id=call.id)

    # an image part
    step = "oa-image"
    completion = openai_completion(
        run,
        step,
        group,
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in this image?"},
                    {"type": "image_url", "image_url": {"url": IMAGE_URL}},
                ],
            }
        ],
        extra_headers=knobs(step),
    )
    check(completion.choices[0].message.content == MOCK_TEXT, f"{step}: content", completion.choices[0].message.content)
    out[step] = run.observe(step, content=completion.choices[0].message.content)

    # an e-mail address: a placeholder for the provider, the address for the client
    pii = [{"role": "user", "content": PII_MESSAGE}]
    step = "oa-pii-json"
    completion = openai_completion(run, step, group, pii, extra_headers=knobs(step, x_mock_echo="1"))
    content = completion.choices[0].message.content
    check(content == PII_MESSAGE, f"{step}: the echo with the address restored", content)
    out[step] = run.observe(step, content=content)
    step = "oa-pii-stream"
    chunks, content, finish = openai_stream(run, step, group, pii, True, extra_headers=knobs(step, x_mock_echo="1"))
    check(content == PII_MESSAGE, f"{step}: the echo with the address restored", content)
    out[step] = run.observe(step, content=content, chunks=len(chunks))

    # the provider's errors as the SDK's typed errors, in OpenAI's shape
    for status, cls in [
        (400, openai.BadRequestError),
        (429, openai.RateLimitError),
        (529, openai.InternalServerError),
    ]:
        step = f"oa-error-{status}"
        try:
            run.openai.chat.completions.create(
                model=group,
                messages=[{"role": "user", "content": "Hello"}],
                extra_headers=knobs(step, x_mock_status=str(status)),
            )
        except openai.APIStatusError as e:
            check(type(e) is cls, f"{step}: exception class {cls.__name__}", type(e).__name__)
            check(e.status_code == status, f"{step}: status", e.status_code)
            # the SDK keeps the body's `error` object
            check(isinstance(e.body, dict), f"{step}: a JSON error", e.body)
            check(isinstance(e.body.get("message"), str) and e.body["message"], f"{step}: error.message", e.body)
            check(isinstance(e.body.get("type"), str) and e.body["type"], f"{step}: error.type", e.body)
            check(e.message and e.type == e.body["type"], f"{step}: message, type", (e.message, e.type))
            raw = json.loads(bytes(run.transport.last(step)["body"]))
            check(set(raw) == {"error"}, f"{step}: OpenAI's error shape", raw)
            out[step] = run.observe(step, cls=type(e).__name__, error=raw["error"])
        else:
            raise Failure(f"{step}: no exception, expected {cls.__name__}")
    return out


# --- the anthropic SDK at an OpenAI deployment ------------------------------------------------


def anthropic_message(run, step, group, **kwargs):
    message = run.anthropic.messages.create(model=group, max_tokens=kwargs.pop("max_tokens", 200), **kwargs)
    check(isinstance(message, anthropic.types.Message), f"{step}: a Message", type(message))
    check(message.type == "message" and message.role == "assistant", f"{step}: type, role", message)
    check_message_usage(step, message.usage)
    return message


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def anthropic_sdk(run):
    group = "fast"
    out = {}

    step = "an-json"
    message = anthropic_message(
        run, step, group, system=SYSTEM, messages=[{"role": "user", "content": "Hello, GPT"}], extra_headers=knobs(step)
    )
    check([b.type for b in message.content] == ["text"], f"{step}: one text block", message.content)
    check(text_of(message) == MOCK_TEXT, f"{step}: text", text_of(message))
    check(message.stop_reason == "end_turn", f"{step}: stop_reason", message.stop_reason)
    check(message.model == "gpt-4o-mini", f"{step}: model answered", message.model)
    check(message.usage.output_tokens == 8, f"{step}: output tokens", message.usage)
    out[step] = run.observe(step, text=text_of(message), model=message.model, usage=message.usage.model_dump(exclude_none=True))

    step = "an-stream"
    with run.anthropic.messages.stream(
        model=group,
        max_tokens=200,
        system=SYSTEM,
        messages=[{"role": "user", "content": "Hello, GPT"}],
        extra_headers=knobs(step),
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    check_stream_end(run, step, "messages")
    check(text == MOCK_TEXT, f"{step}: text_stream", text)
    check(text_of(final) == MOCK_TEXT, f"{step}: the final message's text", final.content)
    check(final.stop_reason == "end_turn", f"{step}: stop_reason", final.stop_reason)
    check_message_usage(step, final.usage)
    out[step] = run.observe(step, text=text, usage=final.usage.model_dump(exclude_none=True))

    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    step = "an-tool-json"
    message = anthropic_message(
        run, step, group, messages=ask, tools=ANTHROPIC_TOOLS, extra_headers=knobs(step, x_mock_tool_call="get_weather")
    )
    check(message.stop_reason == "tool_use", f"{step}: stop_reason", message.stop_reason)
    uses = [b for b in message.content if b.type == "tool_use"]
    check(len(uses) == 1, f"{step}: one tool_use block", message.content)
    use = uses[0]
    check(use.name == "get_weather" and use.id, f"{step}: the tool and an id", use)
    check(isinstance(use.input, dict) and use.input, f"{step}: input is a dict", use.input)
    out[step] = run.observe(step, id=use.id, name=use.name, input=use.input)

    step = "an-tool-stream"
    with run.anthropic.messages.stream(
        model=group,
        max_tokens=200,
        messages=ask,
        tools=ANTHROPIC_TOOLS,
        extra_headers=knobs(step, x_mock_tool_call="get_weather"),
    ) as stream:
        final = stream.get_final_message()
    check_stream_end(run, step, "messages")
    streamed = [b for b in final.content if b.type == "tool_use"]
    check(len(streamed) == 1, f"{step}: one tool_use block", final.content)
    check(streamed[0].name == "get_weather" and streamed[0].id, f"{step}: the tool and an id", streamed[0])
    check(streamed[0].input == use.input, f"{step}: the same input as the JSON answer's", streamed[0].input)
    check(final.stop_reason == "tool_use", f"{step}: stop_reason", final.stop_reason)
    check_message_usage(step, final.usage)
    out[step] = run.observe(step, name=streamed[0].name, input=streamed[0].input)

    step = "an-tool-result"
    message = anthropic_message(
        run,
        step,
        group,
        messages=ask
        + [
            {"role": "assistant", "content": [use.model_dump(include={"type", "id", "name", "input"})]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": TOOL_RESULT}]},
        ],
        tools=ANTHROPIC_TOOLS,
        extra_headers=knobs(step, x_mock_echo="1"),
    )
    check(text_of(message) == TOOL_RESULT, f"{step}: the answer echoes the tool result", message.content)
    check(message.stop_reason == "end_turn", f"{step}: stop_reason", message.stop_reason)
    out[step] = run.observe(step, text=text_of(message), tool_use_id=use.id)

    # counting tokens: a group without an Anthropic deployment gets the gateway's estimate
    step = "an-count-tokens"
    raw = run.anthropic.messages.with_raw_response.count_tokens(
        model=group, system=SYSTEM, messages=[{"role": "user", "content": "Hello, GPT"}], extra_headers=knobs(step)
    )
    counted = raw.parse()
    check(isinstance(counted, anthropic.types.MessageTokensCount), f"{step}: MessageTokensCount", type(counted))
    check(counted.input_tokens > 0, f"{step}: input_tokens", counted)
    check(raw.headers.get("x-llm-token-count") == "estimated", f"{step}: x-llm-token-count", dict(raw.headers))
    out[step] = run.observe(step, input_tokens=counted.input_tokens)

    # the providers' errors as the SDK's typed errors, in Anthropic's shape (the knob reaches
    # both deployments of the group: a 429 or 503 fails at both)
    for status, cls in [
        (400, anthropic.BadRequestError),
        (429, anthropic.RateLimitError),
        (503, anthropic.ServiceUnavailableError),
    ]:
        step = f"an-error-{status}"
        try:
            run.anthropic.messages.create(
                model=group,
                max_tokens=20,
                messages=[{"role": "user", "content": "Hello"}],
                extra_headers=knobs(step, x_mock_status=str(status)),
            )
        except anthropic.APIStatusError as e:
            check(type(e) is cls, f"{step}: exception class {cls.__name__}", type(e).__name__)
            check(e.status_code == status, f"{step}: status", e.status_code)
            body = e.body
            check(isinstance(body, dict) and body.get("type") == "error", f"{step}: Anthropic's error shape", body)
            error = body.get("error") or {}
            check(isinstance(error.get("type"), str) and error["type"], f"{step}: error.type", body)
            check(isinstance(error.get("message"), str) and error["message"], f"{step}: error.message", body)
            out[step] = run.observe(step, cls=type(e).__name__, error=error)
        else:
            raise Failure(f"{step}: no exception, expected {cls.__name__}")
    return out


# --- fallback ---------------------------------------------------------------------------------


def check_answered_by(run, step, deployment, attempts):
    headers = run.transport.last(step)["headers"]
    headers = {k.lower(): v for k, v in headers}
    check(headers.get("x-llm-deployment") == deployment, f"{step}: x-llm-deployment", headers.get("x-llm-deployment"))
    check(headers.get("x-llm-attempts") == str(attempts), f"{step}: x-llm-attempts", headers.get("x-llm-attempts"))


def fallback(run, prefix, group, deployment, sdks):
    """Each SDK of `sdks`, JSON and stream, at `group`, whose first deployment fails: answered
    by `deployment` at the second attempt. The steps are named `<prefix>-oa-json` & co."""
    say = "Hello over there"
    out = {}
    if "openai" in sdks:
        step = f"{prefix}-oa-json"
        completion = openai_completion(
            run,
            step,
            group,
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": say}],
            extra_headers=knobs(step, x_mock_echo="1"),
        )
        check(completion.choices[0].message.content == say, f"{step}: content", completion.choices[0].message.content)
        check(completion.choices[0].finish_reason == "stop", f"{step}: finish_reason", completion.choices[0].finish_reason)
        check_answered_by(run, step, deployment, 2)
        out[step] = run.observe(step, content=say, model=completion.model, usage=chat_usage(completion.usage))

        step = f"{prefix}-oa-stream"
        chunks, content, finish = openai_stream(
            run,
            step,
            group,
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": say}],
            True,
            extra_headers=knobs(step, x_mock_echo="1"),
        )
        check(content == say and finish == "stop", f"{step}: content, finish_reason", (content, finish))
        check_answered_by(run, step, deployment, 2)
        out[step] = run.observe(step, content=content, model=chunks[0].model, usage=chat_usage(chunks[-1].usage))
    if "anthropic" in sdks:
        step = f"{prefix}-an-json"
        message = anthropic_message(
            run, step, group, system=SYSTEM, messages=[{"role": "user", "content": say}], extra_headers=knobs(step, x_mock_echo="1")
        )
        check(text_of(message) == say, f"{step}: text", message.content)
        check(message.stop_reason == "end_turn", f"{step}: stop_reason", message.stop_reason)
        check_answered_by(run, step, deployment, 2)
        out[step] = run.observe(step, text=say, model=message.model, usage=message.usage.model_dump(exclude_none=True))

        step = f"{prefix}-an-stream"
        with run.anthropic.messages.stream(
            model=group,
            max_tokens=200,
            system=SYSTEM,
            messages=[{"role": "user", "content": say}],
            extra_headers=knobs(step, x_mock_echo="1"),
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        check_stream_end(run, step, "messages")
        check(text == say, f"{step}: text_stream", text)
        check(final.stop_reason == "end_turn", f"{step}: stop_reason", final.stop_reason)
        check_message_usage(step, final.usage)
        check_answered_by(run, step, deployment, 2)
        out[step] = run.observe(step, text=text, model=final.model, usage=final.usage.model_dump(exclude_none=True))
    return out


PARTS = {"openai-sdk": openai_sdk, "anthropic-sdk": anthropic_sdk}
SDKS = {"openai", "anthropic"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", required=True, help="http://HOST:PORT of the gateway")
    parser.add_argument("--key", required=True, help="a virtual key with the groups fast, smart, claude and code")
    parser.add_argument("--part", action="append", default=[], choices=sorted(PARTS))
    parser.add_argument(
        "--fallback",
        action="append",
        default=[],
        nargs=4,
        metavar=("PREFIX", "GROUP", "DEPLOYMENT", "SDKS"),
        help="after the parts: the fallback steps (SDKS: openai,anthropic or one of them)",
    )
    args = parser.parse_args()
    for _, _, _, sdks in args.fallback:
        if not sdks or not set(sdks.split(",")) <= SDKS:
            parser.error(f"--fallback SDKS: a comma-separated subset of {sorted(SDKS)}, not {sdks!r}")

    run = Run(args)
    observations = {"sdk_versions": {"openai": openai.__version__, "anthropic": anthropic.__version__}}
    part = "start"
    try:
        for part in args.part:
            observations[part] = PARTS[part](run)
        for prefix, group, deployment, sdks in args.fallback:
            part = f"fallback {prefix}"
            observations[part] = fallback(run, prefix, group, deployment, sdks.split(","))
    except (Failure, openai.OpenAIError, anthropic.AnthropicError, json.JSONDecodeError) as e:
        print(f"translation.py: {part}: {type(e).__name__}: {e}", file=sys.stderr)
        for exchange in run.transport.report():
            print(json.dumps(exchange), file=sys.stderr)
        return 1
    observations["steps"] = run.steps
    observations["exchanges"] = run.transport.report()
    json.dump(observations, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
