//! Usage extraction: usage-accounting's `ResponseStream` (SSE framing, `shared::usage`'s
//! `StreamUsage` event by event, hiding the usage-only chunk) and the whole-body readers
//! `usage::from_response_body` / `from_body_tail`.
//!
//! Input: `api, flags, split plan, response bytes`. Checked:
//! - without hiding, what reaches the client is the upstream's bytes exactly;
//! - with a bound no event reaches, the bytes forwarded, the usage, the model, the completion
//!   flag, the event counts and the streamed-token count do not depend on where the stream
//!   was cut, and time-to-first-token is marked once at most;
//! - nothing hidden means nothing changed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_gateway_fuzz::Input;
use llm_gateway_shared::price::{NanoPerMillion, Price};
use llm_gateway_shared::request::Api;
use llm_gateway_shared::tokens::Encoding;
use llm_gateway_shared::usage::{self, Usage};
use usage_accounting::stream::{Forward, ResponseStream};

#[derive(Debug, PartialEq)]
struct Outcome {
    forwarded: Vec<u8>,
    first_outputs: usize,
    usage: Option<Usage>,
    complete: bool,
    model: Option<String>,
    counts: (u64, u64),
    streamed_tokens: u64,
}

fn run(api: Api, hide: bool, max: usize, chunks: &[&[u8]]) -> Outcome {
    let mut stream = ResponseStream::new(api, hide, Encoding::Chars, max);
    let mut forwarded = Vec::new();
    let mut first_outputs = 0;
    for chunk in chunks {
        let pushed = stream.push(chunk);
        first_outputs += usize::from(pushed.first_output);
        match pushed.forward {
            Forward::Unchanged => forwarded.extend_from_slice(chunk),
            Forward::Replace(bytes) => forwarded.extend_from_slice(&bytes),
        }
    }
    let end = stream.finish();
    first_outputs += usize::from(end.first_output);
    if let Forward::Replace(bytes) = end.forward {
        forwarded.extend_from_slice(&bytes);
    }
    Outcome {
        forwarded,
        first_outputs,
        usage: stream.usage(),
        complete: stream.usage_is_complete(),
        model: stream.model().map(str::to_owned),
        counts: stream.counts(),
        streamed_tokens: stream.streamed_tokens(),
    }
}

fn price(nano_per_million: NanoPerMillion) -> Price {
    Price {
        currency: "USD".into(),
        input: nano_per_million,
        output: nano_per_million,
        cached_input: Some(nano_per_million / 10),
        cache_write: None,
        reasoning: None,
    }
}

/// An upstream may report any count: the cost grows with the price and saturates, it never
/// wraps (the wasm build has no overflow checks: a wrapped sum would be a tiny charge).
fn check_cost(usage: &Usage) {
    let _ = (usage.total_tokens(), usage.uncached_prompt_tokens());
    // $2.50 per million tokens, the dearest price usage-accounting's config accepts, and the
    // dearest the router's can publish
    let realistic = price(2_500_000_000).cost(usage);
    let dearest = price(u128::from(u64::MAX)).cost(usage);
    let routers = price(u128::from(u64::MAX) * 1_000).cost(usage);
    assert!(routers >= dearest, "{routers} < {dearest} for {usage:?}");
    assert!(
        dearest >= realistic,
        "{dearest} < {realistic} for {usage:?}"
    );
    if usage.total_tokens() >= 1_000_000 {
        assert!(dearest >= realistic.max(1), "{usage:?} costs nothing");
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let api = match input.byte() % 4 {
        0 => Api::ChatCompletions,
        1 => Api::Responses,
        2 => Api::AnthropicMessages,
        _ => Api::Embeddings,
    };
    let flags = input.byte();
    let hide = flags & 1 != 0;
    let max = if flags & 2 != 0 { 32 } else { 1 << 20 };
    let plan = input.plan();
    let body = input.rest();
    let chunks = plan.split(body);

    let cut = run(api, hide, max, &chunks);
    assert!(
        cut.first_outputs <= 1,
        "first output marked {} times",
        cut.first_outputs
    );
    if !hide || cut.counts.1 == 0 {
        assert_eq!(
            cut.forwarded, body,
            "bytes changed though nothing was hidden"
        );
    }
    if let Some(usage) = cut.usage {
        check_cost(&usage);
    }
    if max == 1 << 20 && body.len() < 1 << 20 {
        let whole = run(api, hide, max, &[body]);
        assert_eq!(cut, whole, "the outcome depends on the cuts");
    }

    // the same bytes as a whole JSON body, and as the tail of a large one
    if let Some((usage, _model)) = usage::from_response_body(api, body) {
        check_cost(&usage);
    }
    if let Some(usage) = usage::from_body_tail(api, body) {
        check_cost(&usage);
    }
});
