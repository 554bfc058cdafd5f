//! `mock-upstream`: a small, fast, deterministic mock of the OpenAI, Anthropic and Azure OpenAI
//! HTTP APIs.
//!
//! It is a test fixture for the gateway: the end-to-end suites start it in-process
//! ([`MockUpstream::start`], [`MockUpstream::start_flavor`]), the demo launcher and the
//! benchmarks run the `mock-upstream` binary (`mock-upstream [--listen 127.0.0.1:8080]
//! [--threads N] [--flavor any|openai|anthropic|azure] [--log]`, which prints
//! `mock-upstream listening on http://ADDR` once bound).
//!
//! # Flavors
//!
//! A mock plays one [`Flavor`]:
//!
//! * `Any` (the default: [`MockUpstream::start`], `--flavor any`): every route below but
//!   Azure's, no authentication, no validation beyond what the answer needs, OpenAI-shaped
//!   errors on every route (see [Errors](#errors-any-flavor)).
//! * `Openai`, `Anthropic`, `Azure`: that provider's routes only, its authentication, its body
//!   validation and its error shape, so that a request sent in another provider's shape fails
//!   in a test as it would in production. Keys are checked for presence only: any non-empty
//!   key is accepted.
//!
//! A request goes through, in order: the body is read (`413` beyond 64 MiB) and recorded; the
//! route (the flavor's `404`); authentication; the knobs (`400` for a bad value);
//! `x-mock-delay-ms`; `x-mock-status`; the body must be a JSON object; the flavor's validation;
//! the answer (whose own checks, e.g. `x-mock-tool-call`'s, come last).
//!
//! # Routes
//!
//! | Route | Any | Openai | Anthropic | Azure | Answer |
//! |---|---|---|---|---|---|
//! | `GET /health` | ✓ | ✓ | ✓ | ✓ | `200 ok` (text/plain) |
//! | `POST /v1/chat/completions` | ✓ | ✓ | | | OpenAI Chat Completions, JSON or SSE (`stream: true`, `stream_options.include_usage`) |
//! | `POST /v1/responses` | ✓ | ✓ | | | OpenAI Responses, JSON or SSE (`response.created`, `response.output_text.delta`…, `response.completed`) |
//! | `POST /v1/embeddings` | ✓ | ✓ | | | OpenAI embeddings, 8 small deterministic floats per input |
//! | `POST /v1/messages` | ✓ | | ✓ | | Anthropic Messages, JSON or SSE (`message_start` … `message_stop`) |
//! | `POST /v1/messages/count_tokens` | ✓ | | ✓ | | Anthropic token counting: `{"input_tokens": N}`, N by the prompt-token formula |
//! | `POST /openai/deployments/{deployment}/chat/completions?api-version=V` | | | | ✓ | Chat Completions (see [Azure](#azure-flavor)) |
//! | `POST /openai/deployments/{deployment}/embeddings?api-version=V` | | | | ✓ | embeddings (see [Azure](#azure-flavor)) |
//!
//! Any other method or path — on Azure also a missing or empty `api-version` query parameter —
//! gets the flavor's `404`:
//!
//! * Any, Openai: `{"error":{"message":"no route for METHOD PATH","type":"invalid_request_error","param":null,"code":"not_found"}}`
//! * Anthropic: `{"type":"error","error":{"type":"not_found_error","message":"Not Found"},"request_id":..}`
//! * Azure: `{"error":{"code":"404","message":"Resource not found"}}`
//!
//! The completion is always `N` "tokens" `tok0 tok1 … tok{N-1} ` (each token is the word
//! `tok{i}` followed by one space), where `N` is the `x-mock-chunks` knob (default 8) capped by
//! the request's `max_tokens` / `max_completion_tokens` (chat), `max_tokens` (Anthropic) or
//! `max_output_tokens` (Responses). When the cap cuts the completion short the finish reason is
//! `length` / `max_tokens` (and the Responses API reports `status: "incomplete"` with
//! `incomplete_details.reason = "max_output_tokens"`, streaming a final `response.incomplete`
//! event instead of `response.completed`, as OpenAI does), otherwise `stop` / `end_turn` /
//! `completed`. The completion token count is exactly `N`. In a stream every token is one
//! delta event. (`x-mock-echo` and `x-mock-tool-call` change the completion, below.)
//!
//! Every request (including refusals, 404s and health checks) is recorded, path with its query,
//! headers and body as received — see [`MockUpstream::requests`] (the last 10 000 are kept).
//! That is also how a test sees what reached the provider, images included (the answers
//! ignore them).
//!
//! # Authentication
//!
//! | Flavor | Needs | Without it |
//! |---|---|---|
//! | Any | nothing (keys are recorded, never checked) | |
//! | Openai | `authorization: Bearer <non-empty>` (`x-api-key` or `api-key` alone is refused) | `401` `{"error":{"message":"You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), …","type":"invalid_request_error","param":null,"code":null}}` |
//! | Anthropic | `x-api-key: <non-empty>` (an `authorization: Bearer` alone is refused), then `anthropic-version` (any value) | `401 authentication_error` "x-api-key header is required"; `400 invalid_request_error` "anthropic-version: header is required" |
//! | Azure | `api-key: <non-empty>` (an `authorization: Bearer` alone is refused) | `401` `{"error":{"code":"401","message":"Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource."}}` |
//!
//! # Anthropic flavor
//!
//! Every error is Anthropic's `{"type":"error","error":{"type":T,"message":M},"request_id":"req_mock_N"}`
//! (the knobs' and `x-mock-status`'s too), `T` given by the status: 400
//! `invalid_request_error`, 401 `authentication_error`, 402 `billing_error`, 403
//! `permission_error`, 404 `not_found_error`, 413 `request_too_large`, 429 `rate_limit_error`,
//! 500 `api_error`, 504 `timeout_error`, 529 `overloaded_error`, other 5xx `api_error`, other 4xx
//! `invalid_request_error` (`x-mock-error-code` is ignored: Anthropic's errors have no code).
//! Every answer, error or not, carries a `request-id: req_mock_N` header.
//!
//! A body is refused with `400 invalid_request_error` and the message `"<path>: <what>"`, the
//! path as Anthropic writes it (`messages.1.content.0.tool_use.input`: a block's path names its
//! type). `null` stands for an absent optional field.
//!
//! * Top-level fields: `model`, `messages`, `max_tokens`, `system`, `tools`, `tool_choice`,
//!   `stop_sequences`, `temperature`, `top_p`, `top_k`, `metadata`, `stream`, `thinking`,
//!   `service_tier`; on count_tokens only `model`, `messages`, `system`, `tools`,
//!   `tool_choice`, `thinking`. Any other → "`FIELD: Extra inputs are not permitted`" (OpenAI's
//!   `stream_options`, `n`, `max_completion_tokens`, `response_format`, `tool_calls`,
//!   `frequency_penalty`, `user`, `seed`…; `max_tokens` on count_tokens).
//! * `model`: a string ("model: Field required", "model: Input should be a valid string").
//! * `max_tokens` (Messages): required ("max_tokens: Field required"), an integer ("max_tokens:
//!   Input should be a valid integer") ≥ 1 ("max_tokens: Input should be greater than or equal
//!   to 1").
//! * `messages`: a non-empty list ("messages: at least one message is required"); each an object
//!   with only `role` and `content` ("messages.N.name: Extra inputs are not permitted");
//!   `role` `user` or `assistant` ("messages.N.role: Input should be 'user' or 'assistant'"
//!   for `system`, `developer`, `tool`, `function`…); `content` required ("messages.N.content:
//!   Field required"), a string or a list of blocks, not empty but in a final assistant message
//!   ("messages.N: all messages must have non-empty content except for the optional final
//!   assistant message").
//! * Content blocks: `type` required ("messages.N.content.M.type: Field required"), one of
//!   `text` {`text`, not blank: "messages.N.content.M: text content blocks must be
//!   non-empty"}, `image` {`source`: `base64` {`media_type` image/jpeg, image/png, image/gif or
//!   image/webp, `data`} | `url` {`url`} | `file` {`file_id`}}, `document` {`source` {`type`,
//!   …}, `title`?, `context`?}, `tool_use` {`id`, `name`, `input`: an object}, `tool_result`
//!   {`tool_use_id`, `content`?: a string or a list of text / image / document blocks,
//!   `is_error`?: a boolean}, `thinking` {`thinking`, `signature`}, `redacted_thinking`
//!   {`data`}; `cache_control` is allowed on all but the thinking blocks, `citations` on text
//!   and document. An unknown type → "messages.N.content.M: Input tag 'image_url' found using
//!   'type' does not match any of the expected tags: 'text', 'image', 'document', 'tool_use',
//!   'tool_result', 'thinking', 'redacted_thinking'"; a missing field →
//!   "messages.N.content.M.tool_use.name: Field required"; another field →
//!   "messages.N.content.M.text.FIELD: Extra inputs are not permitted".
//! * Tool turns: each `tool_result` answers a `tool_use` of the assistant message just before
//!   it ("messages.N.content.M: unexpected `tool_use_id` found in `tool_result` blocks: ID.
//!   Each `tool_result` block must have a corresponding `tool_use` block in the previous
//!   message."), and the message after an assistant message, when there is one, answers all
//!   its `tool_use`s ("messages.N: `tool_use` ids were found without `tool_result` blocks
//!   immediately after: IDS. Each `tool_use` block must have a corresponding `tool_result`
//!   block in the next message.").
//! * `system`: a string or a list of text blocks.
//! * `tools`: custom tools {`name` matching `^[a-zA-Z0-9_-]{1,128}$`, `input_schema`: an
//!   object, `description`?, `cache_control`?, `type`?: `custom`} ("tools.K.custom.input_schema:
//!   Field required"), or server tools, whose `type` is a name and an 8-digit date
//!   (`web_search_20250305`; their other fields are not checked). OpenAI's
//!   `{"type":"function",…}` → "tools.K: Input tag 'function' found using 'type' does not match
//!   any of the expected tags: …".
//! * `tool_choice`: an object {`type`: `auto` | `any` | `none` | `tool` (+ `name`),
//!   `disable_parallel_tool_use`? (not with `none`)}; OpenAI's string `"auto"` → "tool_choice:
//!   Input should be a valid dictionary or object", `{"type":"required"}` → "tool_choice: Input
//!   tag 'required' found using 'type' does not match any of the expected tags: 'auto', 'any',
//!   'tool', 'none'".
//! * `stop_sequences`: a list of strings; `temperature` and `top_p`: numbers in 0..=1
//!   ("temperature: Input should be less than or equal to 1"); `top_k`: an integer ≥ 0;
//!   `metadata`: an object with only `user_id` ("metadata.KEY: Extra inputs are not
//!   permitted"); `stream`: a boolean; `thinking`: an object; `service_tier`: `auto` or
//!   `standard_only`.
//!
//! # OpenAI flavor
//!
//! Errors are OpenAI's `{"error":{"message":..,"type":"invalid_request_error","param":..,"code":..}}`.
//! A Chat Completions body is refused with `400` and OpenAI's message (`[param, code]` below):
//!
//! * Top-level fields: `model`, `messages`, `tools`, `tool_choice`, `parallel_tool_calls`,
//!   `functions`, `function_call`, `stream`, `stream_options`, `stop`, `temperature`, `top_p`,
//!   `n`, `max_tokens`, `max_completion_tokens`, `frequency_penalty`, `presence_penalty`,
//!   `logit_bias`, `logprobs`, `top_logprobs`, `seed`, `user`, `metadata`, `response_format`,
//!   `service_tier`, `store`, `reasoning_effort`, `prompt_cache_key`, `safety_identifier`,
//!   `verbosity`, `modalities`, `audio`, `prediction`, `web_search_options`. Any other —
//!   Anthropic's `system`, `stop_sequences`, `top_k`, `thinking`, `anthropic_version` among
//!   them — → "Unrecognized request argument supplied: FIELD" `[FIELD, null]`. `null` stands
//!   for an absent optional field.
//! * `model`: required ("you must provide a model parameter" `[null, null]`), a string.
//! * `messages`: required ("Missing required parameter: 'messages'." `[messages,
//!   missing_required_parameter]`), not empty ("Invalid 'messages': empty array. Expected an
//!   array with minimum length 1, but got an empty array instead." `[messages, empty_array]`).
//!   Each message: `role` one of system, developer, user, assistant, tool, function ("Invalid
//!   value: 'human'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool',
//!   and 'developer'." `[messages[N].role, invalid_value]`); `content` a string or a list of
//!   parts — user: `text` {`text`}, `image_url` {`image_url`: {`url`}}, `input_audio`
//!   {`input_audio`: {`data`, `format`}}, `file` {`file`}; assistant: `text`, `refusal`;
//!   system, developer, tool: `text` — any other part type (Anthropic's `image`, `tool_use`,
//!   `tool_result`) → "Invalid value: 'tool_use'. Supported values are: 'text' and
//!   'refusal'." `[messages[N].content[M].type, invalid_value]`; `content` may be null or
//!   absent only in an assistant message with `tool_calls` or `function_call` ("Invalid type for
//!   'messages\[N\].content': expected one of a string or array of objects, but got null
//!   instead." `[…, invalid_type]`); assistant `tool_calls`: [{`id`, `type`: `function`,
//!   `function`: {`name`, `arguments`: a string}}] ("Invalid type for
//!   'messages\[N\].tool_calls\[K\].function.arguments': expected a string, but got an object
//!   instead." `[…, invalid_type]`); a `tool` message needs `tool_call_id` ("Missing required
//!   parameter: 'messages\[N\].tool_call_id'." `[…, missing_required_parameter]`) naming a call of
//!   the assistant message that opens its run of tool messages ("Invalid parameter: messages
//!   with role 'tool' must be a response to a preceeding message with 'tool_calls'."
//!   `[messages.[N].role, null]`, "Invalid parameter: 'tool_call_id' of 'ID' not found in
//!   'tool_calls' of previous message." `[messages.[N].tool_call_id, null]`), and every call
//!   is answered before the next other message ("An assistant message with 'tool_calls' must
//!   be followed by tool messages responding to each 'tool_call_id'. The following
//!   tool_call_ids did not have response messages: IDS" `[messages.[N].role, null]`). Other
//!   fields of a message are ignored, as OpenAI's current models do.
//! * `tools`: [{`type`: `function`, `function`: {`name` matching `^[a-zA-Z0-9_-]{1,64}$`,
//!   `description`?, `parameters`?: an object, `strict`?: a boolean}}] (a `custom` tool is not
//!   checked further); Anthropic's {`name`, `input_schema`} → "Missing required parameter:
//!   'tools\[0\].type'." `[tools[0].type, missing_required_parameter]`.
//! * `tool_choice`: `"none"` | `"auto"` | `"required"` ("Invalid value: 'any'. Supported
//!   values are: 'none', 'auto', and 'required'." `[tool_choice, invalid_value]`) or
//!   {`type`: `function`, `function`: {`name`}} (types `allowed_tools` and `custom` are taken
//!   as they are); Anthropic's {`type`: `any` | `tool` | `auto`} → "Invalid value: 'tool'.
//!   Supported values are: 'function', 'allowed_tools', and 'custom'." `[tool_choice.type,
//!   invalid_value]`. Only with `tools` ("Invalid value for 'tool_choice': 'tool_choice' is
//!   only allowed when 'tools' are specified." `[tool_choice, null]`), as is
//!   `parallel_tool_calls`.
//! * `stream_options`: {`include_usage`?, `include_obfuscation`?}, only with `stream: true`
//!   ("The 'stream_options' parameter is only allowed when 'stream' is enabled."
//!   `[stream_options, null]`).
//! * `stop`: a string or a list of at most 4 strings ("Invalid 'stop': array too long. Expected
//!   an array with maximum length 4, but got an array with length 5 instead." `[stop,
//!   array_above_max_length]`).
//! * Numbers: `temperature` 0..=2, `top_p` 0..=1, `frequency_penalty` and `presence_penalty`
//!   -2..=2 ("Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got
//!   2.5 instead." `[temperature, decimal_above_max_value]`, `decimal_below_min_value`);
//!   integers `n` 1..=128, `max_tokens` and `max_completion_tokens` ≥ 1, `top_logprobs`
//!   0..=20, `seed` (`integer_above_max_value`, `integer_below_min_value`).
//! * Types: `stream`, `logprobs`, `parallel_tool_calls`, `store` booleans; `user`,
//!   `service_tier`, `reasoning_effort`, `prompt_cache_key`, `safety_identifier`, `verbosity`
//!   strings; `metadata`, `logit_bias`, `audio`, `prediction`, `web_search_options` objects;
//!   `modalities`, `functions` lists; `function_call` a string or an object;
//!   `response_format` {`type`: `text` | `json_object` | `json_schema`}. A wrong type →
//!   "Invalid type for 'FIELD': expected a decimal, but got a string instead." `[FIELD,
//!   invalid_type]`.
//!
//! An embeddings body takes only `model` (required), `input`, `encoding_format`, `dimensions`
//! (an integer ≥ 1) and `user` ("Unrecognized request argument supplied: FIELD"). A Responses
//! body is answered as on `Any` (not validated).
//!
//! # Azure flavor
//!
//! The chat completions and embeddings of the deployment the path names, with an
//! `api-version` query parameter (any non-empty value). The body is checked as the OpenAI
//! flavor's, except that `model` may be absent, and refused with OpenAI's errors (Azure passes
//! the model's own refusals through); Azure's own refusals (`404` path or `api-version`,
//! `401` key) are `{"error":{"code":"NNN","message":..}}`. The answer is OpenAI's; its `model`
//! is the body's `model` when given, else the deployment's name (Azure answers the underlying
//! model's name, e.g. `gpt-4o-2024-08-06`, which the mock cannot know). No
//! `prompt_filter_results` / `content_filter_results`; `x-mock-status` answers OpenAI's shape.
//!
//! # Prompt-token formula
//!
//! The prompt (input) token count is deterministic:
//!
//! ```text
//! prompt_tokens = max(1, Σ over messages of (ceil(text_chars(message) / 4) + 4))
//! ```
//!
//! where `text_chars` is the number of Unicode scalar values (`str::chars`) of all the text
//! content of the message: the `content` string, or the sum of the `text` fields of the text
//! parts of a `content` array (parts of type `text`; for the Responses API also `input_text`
//! and `output_text`). Non-text parts (images, tool calls, …) count nothing, a message without
//! text still counts 4.
//!
//! * Chat Completions: the messages are `messages` (a `tool` message counts its `content`).
//! * Anthropic Messages: `messages`, plus `system` (string or text blocks) counted as one more
//!   message when present — so the same conversation counts the same in both APIs. The text of
//!   a `tool_result` block's `content` (a string or text blocks) counts as its message's text,
//!   as the OpenAI `tool` message it translates does.
//! * Responses: `input` as a string is one message; as an array each item is one message
//!   (its `content` string or parts); `instructions`, when present, is one more message.
//! * Embeddings: `Σ ceil(chars / 4)` over the input strings (a pre-tokenized input counts its
//!   length), minimum 1; there is no per-message overhead.
//!
//! The `x-mock-prompt-tokens: N` knob replaces the computed count.
//!
//! # Knobs (request headers, all optional, all flavors)
//!
//! An invalid value gives a `400` whose error message names the knob (and `error.param` is
//! the header name; on the Anthropic flavor in Anthropic's shape, without `param`).
//!
//! * `x-mock-status: NNN` (200..=599) — answer that status with the body
//!   `{"error":{"message":"mock status NNN","type":"mock_error","param":null,"code":"mock_NNN"}}`
//!   (on the Anthropic flavor `{"type":"error","error":{"type":T,"message":"mock status
//!   NNN"},"request_id":..}`, `T` the status's type, see [Anthropic](#anthropic-flavor)).
//!   Applied after authentication and `x-mock-delay-ms`, before the body is validated.
//! * `x-mock-retry-after: VALUE` — with `x-mock-status`: the error carries `retry-after: VALUE`
//!   (none without this knob: a provider's signal cools its deployment down in the router).
//! * `x-mock-error-code: CODE` — with `x-mock-status`: `CODE` instead of `mock_NNN` in
//!   `error.code` (e.g. `context_length_exceeded`; not on the Anthropic flavor).
//! * `x-mock-status-model: MODEL` — with `x-mock-status`: the status only for a request whose
//!   `model` is `MODEL`; other models are answered as usual (one provider, one model failing).
//! * `x-mock-delay-ms: N` — wait N ms (at most 3 600 000) before sending the response head.
//! * `x-mock-chunk-delay-ms: N` — streaming: wait N ms between SSE events; each event is then
//!   its own body frame (network write).
//! * `x-mock-chunks: N` (0..=100 000) — number of completion tokens (default 8).
//! * `x-mock-cut-after: N` — streaming: send only the first N SSE events, then abort the
//!   connection (no terminating chunk, so the client sees an incomplete body; if N is at least
//!   the number of events every event is sent and the connection is still aborted).
//!   Non-streaming: the head announces the full `content-length`, the first half of the body is
//!   sent, then the connection is aborted (N is ignored).
//! * `x-mock-end-after: N` — streaming: send only the first N SSE events, then end the body
//!   cleanly (terminating chunk): a stream that looks complete to the transport but lacks its
//!   terminator (`[DONE]`, `message_stop`). `x-mock-cut-after` wins when both are set.
//! * `x-mock-cut-rst: 1` — with `x-mock-cut-after`: the connection is aborted with a TCP
//!   reset (`SO_LINGER` 0) instead of a FIN.
//! * `x-mock-garbage: KIND` — streaming: after the first SSE event, `text` puts a line that
//!   is not SSE (an HTML error page's first line), `json` a `data:` event with JSON cut off,
//!   `utf8` a `data:` event whose string holds bytes that are not UTF-8; the rest of the stream
//!   follows. `endless` puts a `data:` line that never ends instead: `x` bytes, 64 KiB per
//!   frame, until the client goes away (nothing after it is sent).
//! * `x-mock-no-usage: 1` — never send a usage object (streaming or not, all APIs; the
//!   Responses API sends `"usage": null`).
//! * `x-mock-usage-in-final-chunk: 1` — chat streaming: put `usage` into the chunk carrying
//!   `finish_reason` and send no separate usage chunk (whatever `include_usage` says).
//! * `x-mock-prompt-tokens: N` — use N as the prompt/input token count.
//! * `x-mock-cache-read-tokens: N` — Anthropic: `cache_read_input_tokens` (`input_tokens` stays
//!   the prompt count, as Anthropic reports uncached input separately); Responses:
//!   `input_tokens_details.cached_tokens`; chat: adds `prompt_tokens_details.cached_tokens`.
//! * `x-mock-usage-style: openai|deepseek` — chat (not a route of the Anthropic flavor):
//!   `deepseek` reports cached prompt tokens as DeepSeek does, `prompt_cache_hit_tokens` (the
//!   `x-mock-cache-read-tokens` knob, 0 without) and `prompt_cache_miss_tokens` (`prompt_tokens`
//!   minus the hits), instead of `prompt_tokens_details`. Default `openai`.
//! * `x-mock-echo: 1` — the completion is the text of the last `user` message (chat and
//!   Anthropic: `messages`; Responses: `input` as a string, or its last `user` item) instead of
//!   the `tok{i}` tokens, cut into pieces of 3 characters: one piece per "token" (delta event in
//!   a stream), so a word spans several events. The completion token count is the number of
//!   pieces; the caps apply to it as to tokens. When the last message is a tool's result (chat:
//!   a `tool` message; Anthropic: a `user` turn holding `tool_result` blocks) the echoed text
//!   is that result's content (the text of all its `tool_result` blocks), so a test sees the
//!   result make the round trip.
//! * `x-mock-tool-call: NAME` — chat and Anthropic Messages: answer with one call of the
//!   request's tool `NAME` (see [Tool calls](#tool-calls)); `400` (`param`
//!   `x-mock-tool-call`) when the request's `tools` has no tool of that name. Ignored when the
//!   last message is a tool's result (the mock then answers text, as a model does), and on the
//!   Responses and embeddings routes.
//!
//! Boolean knobs accept `1`/`true`/`yes`/`on` and `0`/`false`/`no`/`off`.
//! [`MockUpstream::set_default_knobs`] applies knobs to every request of one instance.
//!
//! # Tool calls
//!
//! With `x-mock-tool-call: NAME` the answer calls `NAME` once with the arguments
//! `{"query":"<the last user message's text, or \"tok0\" when it has none>"}` (compact JSON).
//! The completion token count is the number of 5-character pieces of that arguments text; the
//! request's caps do not apply.
//!
//! * Chat JSON: `message` is `{"role":"assistant","content":null,"tool_calls":[{"id":"call_mock_<n>","type":"function","function":{"name":NAME,"arguments":"<the JSON as a string>"}}]}`,
//!   `finish_reason` `tool_calls`. Chat tools are found by `tools[].function.name`.
//! * Chat stream: the first chunk's delta is `{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_mock_<n>","type":"function","function":{"name":NAME,"arguments":""}}]}`,
//!   then one chunk per piece, `{"tool_calls":[{"index":0,"function":{"arguments":PIECE}}]}`,
//!   then the `finish_reason: "tool_calls"` chunk, usage and `[DONE]` as usual.
//! * Anthropic JSON: `content` is `[{"type":"tool_use","id":"toolu_mock_<n>","name":NAME,"input":{"query":..}}]`,
//!   `stop_reason` `tool_use`. Anthropic tools are found by `tools[].name`.
//! * Anthropic stream: `content_block_start` with `{"type":"tool_use","id":"toolu_mock_<n>","name":NAME,"input":{}}`,
//!   `ping`, one `content_block_delta` `{"type":"input_json_delta","partial_json":PIECE}` per
//!   piece, `content_block_stop`, `message_delta` (`stop_reason: "tool_use"`, `output_tokens`
//!   the number of pieces), `message_stop`.
//!
//! # Errors (Any flavor)
//!
//! A body that is not a JSON object, a missing or non-string `model`, a missing `messages`
//! array (chat, Anthropic) or `input` (Responses, embeddings), or a field of the wrong type
//! (`stream`, `max_tokens`, …) gives `400` with
//! `{"error":{"message":..,"type":"invalid_request_error","param":..,"code":"invalid_request"}}`.
//! Bodies are read fully, up to 64 MiB; a larger one gets `413` (`code: "request_too_large"`).
//! All of the `Any` flavor's error bodies are OpenAI-shaped, on every route (the flavored mocks
//! answer in their provider's shape, above). Nothing in the server panics on input.
//!
//! # What it does not do
//!
//! No TLS, no HTTP/2, no check of a key's value (any non-empty key is accepted), no real
//! tokenizer or model, no parallel tool calls (one call per answer), no `n > 1`, no logprobs,
//! no base64 embeddings, no validation of Responses bodies, no rate limiting of its own, no
//! Azure content-filter results. Streams are built in full before the first byte is sent (the
//! knobs only pace and cut them).
//!
//! # Performance
//!
//! Responses are written straight into one buffer (no JSON tree for the answers); without
//! `x-mock-chunk-delay-ms` / `x-mock-cut-after` a whole stream goes out as a single body frame
//! and no task is spawned per request. Recording is a mutex-protected ring buffer push.

mod body;
mod error;
mod flavor;
mod handlers;
mod json;
mod knobs;
mod record;
mod server;
mod validate;

pub use flavor::Flavor;
pub use record::{RecordedRequest, MAX_BODY_BYTES, MAX_RECORDED_REQUESTS};

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A running mock server on the current tokio runtime.
///
/// Dropping it stops the server: the listener is closed and the connections that are still
/// open are dropped (a response in flight is cut).
pub struct MockUpstream {
    addr: SocketAddr,
    flavor: Flavor,
    state: Arc<server::State>,
    accept: JoinHandle<()>,
}

impl MockUpstream {
    /// Binds `addr` (use `127.0.0.1:0` for an ephemeral port) and serves every route, leniently
    /// ([`Flavor::Any`]) on the current tokio runtime (`tokio::spawn`). Returns once listening.
    pub async fn start(addr: SocketAddr) -> std::io::Result<MockUpstream> {
        MockUpstream::start_flavor(addr, Flavor::Any).await
    }

    /// [`MockUpstream::start`] playing one provider: its routes only, its authentication, its
    /// validation and its error shape (see the crate docs).
    pub async fn start_flavor(addr: SocketAddr, flavor: Flavor) -> std::io::Result<MockUpstream> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(server::State::new(true, false, flavor));
        let accept = tokio::spawn(server::accept_loop(listener, Arc::clone(&state)));
        Ok(MockUpstream {
            addr,
            flavor,
            state,
            accept,
        })
    }

    /// The provider this mock plays.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// The bound address (with the real port when started on port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far, in arrival order (at most the last
    /// [`MAX_RECORDED_REQUESTS`]). A request is recorded once its body has been read, before
    /// the response is produced.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.recorded().iter().cloned().collect()
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        self.state.recorded().clear();
    }

    /// Knob headers (`x-mock-*`, see the crate docs) this instance applies to every request
    /// that does not carry the same knob itself, replacing earlier defaults; `&[]` clears
    /// them. Gives one instance its own behaviour — "this provider answers 429" — when several
    /// mocks sit behind one gateway. Recorded requests keep the headers as received.
    ///
    /// # Panics
    /// On a name or value that is not a valid header (a test bug).
    pub fn set_default_knobs(&self, knobs: &[(&str, &str)]) {
        let mut map = hyper::header::HeaderMap::new();
        for (name, value) in knobs {
            let name = hyper::header::HeaderName::from_bytes(name.as_bytes())
                .unwrap_or_else(|_| panic!("invalid header name {name:?}"));
            let value = hyper::header::HeaderValue::from_str(value)
                .unwrap_or_else(|_| panic!("invalid header value {value:?}"));
            map.insert(name, value);
        }
        self.state.set_default_knobs(map);
    }
}

impl Drop for MockUpstream {
    fn drop(&mut self) {
        // The accept task owns the shutdown sender: aborting it closes the listener and tells
        // every connection task to drop its connection.
        self.accept.abort();
    }
}

impl std::fmt::Debug for MockUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockUpstream")
            .field("addr", &self.addr)
            .field("flavor", &self.flavor)
            .finish_non_exhaustive()
    }
}

/// Serves forever on an already-bound listener, on the current tokio runtime (used by the
/// binary). Requests are not recorded; with `log`, one line per request goes to stderr
/// (`METHOD PATH -> STATUS`) along with accept errors.
///
/// Accept errors (for example running out of file descriptors) are logged (with `log`) and
/// retried, so this never returns `Ok`; it returns an error at once if the listener is
/// unusable (its local address cannot be read).
pub async fn serve(listener: TcpListener, log: bool) -> std::io::Result<()> {
    serve_flavor(listener, log, Flavor::Any).await
}

/// [`serve`] playing one provider (`mock-upstream --flavor`).
pub async fn serve_flavor(listener: TcpListener, log: bool, flavor: Flavor) -> std::io::Result<()> {
    // Fail early on a listener that is not usable at all.
    listener.local_addr()?;
    let state = Arc::new(server::State::new(false, log, flavor));
    server::accept_loop(listener, state).await;
    Ok(())
}
