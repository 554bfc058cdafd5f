#!/usr/bin/env python3
"""The user's journey through the gateway, driven by the official `openai` Python SDK.

    journey.py --gateway http://127.0.0.1:PORT --key DEMO_KEY --fast-only-key FAST_ONLY_KEY

Run by tests/e2e/openai_client.rs against the demo gateway (envoy-config/gateway.yaml with the
mock providers); stdlib and `openai` only (installed into .venv by scripts/setup). It checks what
a client of the SDK sees, exits non-zero with a message naming the failed check, and prints one
JSON object of observations on stdout (and nothing else there), which the Rust side cross-checks
against what the providers received and the access log:

- `chat.completions.create` without streaming: a typed `ChatCompletion`, the e-mail address the
  provider only saw as a placeholder restored in the answer, usage, the `x-llm-*` and
  `x-ratelimit-*` response headers (through `with_raw_response`);
- streaming, without and with `stream_options.include_usage`: the content reassembled, no usage
  chunk the client did not ask for, the usage chunk last when it did;
- `models.list()` and `models.retrieve()`: the model groups of each key (the fast-only key sees
  `fast` alone, and a 404 `NotFoundError` for `smart`), answered by the gateway itself;
- the SDK's typed errors: 401 `AuthenticationError`, 403 `PermissionDeniedError`, 429
  `RateLimitError` with `retry-after`, and 402, which the SDK has no class of its own for
  (`APIStatusError`).

Every HTTP exchange (request headers, response status, headers and the body bytes the client
read) is recorded by a wrapping transport and reported under `exchanges`.

Each request names its step in `x-run-id` (the usage record's `run_id`); the steps use their own
`x-user-id`, so the `user-rpm` limit (10 requests a minute) and the `user-day` token budget
(20 000) of gateway.yaml are met only where a step means to meet them.
"""

import argparse
import json
import sys
import time

import openai

import os

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk"))
from recording import Failure, RecordingTransport, check, httpx  # noqa: E402 (tests/sdk/recording.py)

EMAIL = "jane.doe@example.com"
MESSAGE = f"Please write to {EMAIL} about the invoice."
USER_RPM = 10  # gateway.yaml: limit `user-rpm`, requests per minute per x-user-id
USER_DAY_TOKENS = 20_000  # gateway.yaml: budget `user-day`, tokens per x-user-id per day


def client(args, transport, key):
    return openai.OpenAI(
        base_url=f"{args.gateway}/v1",
        api_key=key,
        max_retries=0,
        timeout=20.0,
        http_client=openai.DefaultHttpxClient(transport=transport),
    )


def headers(user, step, **extra):
    return {"x-user-id": user, "x-run-id": step, **extra}


def messages():
    return [{"role": "user", "content": MESSAGE}]


def usage_of(usage):
    return None if usage is None else usage.model_dump()


def non_streaming(api):
    # the plain call: a typed ChatCompletion
    completion = api.chat.completions.create(
        model="fast",
        messages=messages(),
        extra_headers=headers("journey", "non-stream", **{"x-mock-echo": "1"}),
    )
    check(
        isinstance(completion, openai.types.chat.ChatCompletion),
        "create() returns a ChatCompletion",
        type(completion),
    )
    content = completion.choices[0].message.content
    check(content == MESSAGE, "the answer is the echoed message, e-mail restored", content)
    check("[EMAIL_" not in content, "no placeholder reaches the client", content)
    usage = completion.usage
    check(usage is not None and usage.total_tokens > 0, "usage.total_tokens > 0", usage)
    check(
        usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
        "total = prompt + completion",
        usage,
    )
    check(completion.model == "gpt-4o-mini", "model is what the provider answered", completion.model)
    check(completion.choices[0].finish_reason == "stop", "finish_reason", completion.choices[0].finish_reason)

    # the same through with_raw_response: the gateway's response headers
    raw = api.chat.completions.with_raw_response.create(
        model="fast",
        messages=messages(),
        extra_headers=headers("journey", "non-stream-raw", **{"x-mock-echo": "1"}),
    )
    check(raw.status_code == 200, "raw status", raw.status_code)
    h = raw.headers
    check(h.get("x-llm-model-group") == "fast", "x-llm-model-group", h.get("x-llm-model-group"))
    check(h.get("x-llm-deployment") == "openai-mini", "x-llm-deployment", h.get("x-llm-deployment"))
    remaining = h.get("x-ratelimit-remaining-tokens")
    check(remaining is not None and remaining.isdigit(), "x-ratelimit-remaining-tokens", remaining)
    parsed = raw.parse()
    check(parsed.choices[0].message.content == MESSAGE, "raw.parse() content", parsed.choices[0].message.content)
    return {
        "id": completion.id,
        "model": completion.model,
        "content": content,
        "finish_reason": completion.choices[0].finish_reason,
        "usage": usage_of(usage),
        "raw_usage": usage_of(parsed.usage),
        "raw_headers": {k: h.get(k) for k in sorted(set(h.keys()))},
    }


def streaming(api, include_usage):
    step = "stream-usage" if include_usage else "stream"
    extra = {"stream_options": {"include_usage": True}} if include_usage else {}
    with api.chat.completions.with_streaming_response.create(
        model="fast",
        messages=messages(),
        stream=True,
        extra_headers=headers("journey", step, **{"x-mock-echo": "1"}),
        **extra,
    ) as response:
        check(response.status_code == 200, f"{step}: status", response.status_code)
        check(
            response.headers.get("content-type", "").startswith("text/event-stream"),
            f"{step}: content-type",
            response.headers.get("content-type"),
        )
        check(response.headers.get("x-llm-model-group") == "fast", f"{step}: x-llm-model-group", response.headers.get("x-llm-model-group"))
        check(response.headers.get("x-llm-deployment") == "openai-mini", f"{step}: x-llm-deployment", response.headers.get("x-llm-deployment"))
        stream_headers = dict(response.headers)
        chunks = list(response.parse())

    check(len(chunks) > 1, f"{step}: several chunks", len(chunks))
    for chunk in chunks:
        check(
            isinstance(chunk, openai.types.chat.ChatCompletionChunk),
            f"{step}: chunks are ChatCompletionChunk",
            type(chunk),
        )
        check(chunk.object == "chat.completion.chunk", f"{step}: chunk object", chunk.object)
    check(len({c.id for c in chunks}) == 1, f"{step}: one id across the chunks", {c.id for c in chunks})
    content_chunks = [c for c in chunks if c.choices]
    content = "".join(c.choices[0].delta.content or "" for c in content_chunks)
    check(content == MESSAGE, f"{step}: reassembled content, e-mail restored", content)
    finish = [c.choices[0].finish_reason for c in content_chunks if c.choices[0].finish_reason]
    check(finish == ["stop"], f"{step}: one finish_reason stop", finish)
    with_usage = [i for i, c in enumerate(chunks) if c.usage is not None]
    empty_choices = [i for i, c in enumerate(chunks) if not c.choices]
    if include_usage:
        last = chunks[-1]
        check(with_usage == [len(chunks) - 1], f"{step}: usage only on the last chunk", with_usage)
        check(empty_choices == [len(chunks) - 1], f"{step}: the usage chunk has no choices", empty_choices)
        check(last.usage.total_tokens > 0, f"{step}: usage.total_tokens > 0", last.usage)
        check(
            last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens,
            f"{step}: total = prompt + completion",
            last.usage,
        )
    else:
        check(with_usage == [], f"{step}: no chunk with usage the client did not ask for", with_usage)
        check(empty_choices == [], f"{step}: no chunk with empty choices", empty_choices)
    return {
        "content": content,
        "chunks": len(chunks),
        "model": chunks[0].model,
        "usage": usage_of(chunks[-1].usage),
        "chunks_with_usage": with_usage,
        "chunks_without_choices": empty_choices,
        "headers": stream_headers,
    }


def expect_error(what, call, cls, status, code):
    try:
        call()
    except openai.APIStatusError as e:
        return described_error(what, e, cls, status, code)
    raise Failure(f"{what}: no exception, expected {cls.__name__}")


def described_error(what, e, cls, status, code):
    check(type(e) is cls, f"{what}: exception class {cls.__name__}", type(e).__name__)
    check(e.status_code == status, f"{what}: status", e.status_code)
    check(e.code == code, f"{what}: .code", e.code)
    check(isinstance(e.body, dict) and e.body.get("code") == code, f"{what}: body code", e.body)
    check(isinstance(e.message, str) and e.message, f"{what}: message", e.message)
    return {
        "class": type(e).__name__,
        "status": e.status_code,
        "code": e.code,
        "type": e.type,
        "message": e.message,
        "body": e.body,
        "headers": dict(e.response.headers),
    }


def small(api, user, step, **kwargs):
    return api.chat.completions.create(
        model=kwargs.pop("model", "fast"),
        messages=[{"role": "user", "content": "Hello!"}],
        max_tokens=kwargs.pop("max_tokens", 4),
        extra_headers=headers(user, step),
        **kwargs,
    )


def errors(args, transport, api):
    out = {}
    wrong = client(args, transport, "sk-llmgw-not-a-configured-key")
    out["auth"] = expect_error(
        "wrong key",
        lambda: small(wrong, "errors", "wrong-key"),
        openai.AuthenticationError,
        401,
        "invalid_api_key",
    )
    fast_only = client(args, transport, args.fast_only_key)
    out["permission"] = expect_error(
        "fast-only key asking smart",
        lambda: small(fast_only, "errors", "not-allowed", model="smart"),
        openai.PermissionDeniedError,
        403,
        "model_not_allowed",
    )
    # the fast-only key may use `fast`
    allowed = small(fast_only, "errors", "fast-only-fast")
    check(allowed.choices[0].finish_reason == "length", "fast-only key on fast: max_tokens cap", allowed.choices[0].finish_reason)

    # user-rpm: 10 requests a minute for one x-user-id; the 11th is refused. The bucket
    # refills one request every 6 s: on a slow machine a refill may land meanwhile and let
    # one more through, never more than the time passed allows.
    started = time.monotonic()
    for i in range(USER_RPM):
        small(api, "rpm", f"rpm-{i + 1}")
    passed = USER_RPM
    while True:
        try:
            small(api, "rpm", f"rpm-{passed + 1}")
        except openai.RateLimitError as e:
            limited = described_error(
                f"request {passed + 1} of one user within a minute", e, openai.RateLimitError, 429, "rate_limit_exceeded"
            )
            break
        passed += 1
        refills = int((time.monotonic() - started) // (60 / USER_RPM))
        check(passed - USER_RPM <= refills, "429: only refills pass after the first 10", passed)
    retry_after = limited["headers"].get("retry-after")
    check(retry_after is not None and retry_after.isdigit() and int(retry_after) >= 1, "429: retry-after (s)", retry_after)
    check("user-rpm" in limited["message"], "429: the message names the limit", limited["message"])
    # another user is not limited
    small(api, "rpm-other", "rpm-other")
    out["rate_limit"] = limited

    # user-day: 20 000 tokens a day; a request that may use more is refused up front
    budget = expect_error(
        f"max_tokens over the {USER_DAY_TOKENS}-token user-day budget",
        lambda: small(api, "budget", "over-budget", max_tokens=USER_DAY_TOKENS + 5_000),
        openai.APIStatusError,
        402,
        "budget_exceeded",
    )
    check(budget["headers"].get("x-llm-budget") == "user-day", "402: x-llm-budget", budget["headers"].get("x-llm-budget"))
    check(budget["type"] == "insufficient_quota", "402: type", budget["type"])
    out["budget"] = budget
    # ... and refused nothing else: a small request of the same user passes
    small(api, "budget", "within-budget")
    return out


def models(args, transport, api):
    # GET /v1/models: the gateway's own answer (no provider), the groups the key may use
    page = api.models.list(extra_headers=headers("journey", "models-list"))
    listed = list(page)
    for m in listed:
        check(isinstance(m, openai.types.Model), "models.list() yields Model", type(m))
        check(m.object == "model", "model object", m.object)
        check(m.owned_by == "llm-gateway", "owned_by", m.owned_by)
        check(isinstance(m.created, int) and m.created > 0, "created", m.created)
    ids = [m.id for m in listed]
    check(ids == ["fast", "smart", "claude", "code"], "the demo key lists its four groups", ids)

    fast_only = client(args, transport, args.fast_only_key)
    fast_only_ids = [m.id for m in fast_only.models.list(extra_headers=headers("journey", "models-list-fast-only"))]
    check(fast_only_ids == ["fast"], "the fast-only key lists only fast", fast_only_ids)
    fast = fast_only.models.retrieve("fast", extra_headers=headers("journey", "models-retrieve-fast"))
    check(isinstance(fast, openai.types.Model), "models.retrieve() returns a Model", type(fast))
    check(fast.id == "fast" and fast.owned_by == "llm-gateway", "retrieve fast", fast)
    hidden = expect_error(
        "fast-only key retrieving smart",
        lambda: fast_only.models.retrieve("smart", extra_headers=headers("journey", "models-retrieve-smart")),
        openai.NotFoundError,
        404,
        "model_not_found",
    )
    return {
        "list": ids,
        "list_fast_only": fast_only_ids,
        "retrieved": fast.model_dump(),
        "hidden": hidden,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", required=True, help="http://HOST:PORT of the gateway")
    parser.add_argument("--key", required=True, help="a virtual key with the groups fast and smart")
    parser.add_argument("--fast-only-key", required=True, help="a virtual key with group fast only")
    args = parser.parse_args()

    transport = RecordingTransport()
    api = client(args, transport, args.key)
    observations = {"sdk_version": openai.__version__, "message": MESSAGE}
    step = "start"
    try:
        step = "non-streaming"
        observations["non_stream"] = non_streaming(api)
        step = "streaming"
        observations["stream"] = streaming(api, include_usage=False)
        step = "streaming with include_usage"
        observations["stream_usage"] = streaming(api, include_usage=True)
        step = "models"
        observations["models"] = models(args, transport, api)
        step = "typed errors"
        observations["errors"] = errors(args, transport, api)
    except (Failure, openai.OpenAIError) as e:
        print(f"journey.py: {step}: {type(e).__name__}: {e}", file=sys.stderr)
        for exchange in transport.report():
            print(json.dumps(exchange), file=sys.stderr)
        return 1
    observations["exchanges"] = transport.report()
    json.dump(observations, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
