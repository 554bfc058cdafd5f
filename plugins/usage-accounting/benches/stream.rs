//! `cargo bench -p usage-accounting --bench stream`: cost per SSE event of framing + usage
//! extraction (+ hiding, + counting the streamed text) on a 2 000-event Chat Completions
//! stream cut into network-sized chunks, and the tokenizer's one-time cost per VM (time and
//! heap bytes of building each BPE). Reports medians of repeated runs; asserts nothing about
//! time.

use llm_gateway_shared::request::Api;
use llm_gateway_shared::tokens::{count_tokens, Encoding};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use usage_accounting::stream::{Forward, ResponseStream};

/// Counts live heap bytes, to measure what the tokenizer keeps.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const EVENTS: usize = 2_000;

fn chat_stream() -> Vec<u8> {
    let mut s = String::new();
    for i in 0..EVENTS - 2 {
        s.push_str(&format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i} \"}},\"finish_reason\":null}}],\"usage\":null}}\n\n"
        ));
    }
    s.push_str("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":1998,\"total_tokens\":2010}}\n\n");
    s.push_str("data: [DONE]\n\n");
    s.into_bytes()
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(0.0)
}

fn run(body: &[u8], hide: bool, encoding: Encoding) -> usize {
    let mut stream = ResponseStream::new(Api::ChatCompletions, hide, encoding, 1 << 20);
    let mut out = 0;
    for chunk in body.chunks(1_400) {
        out += match stream.push(chunk).forward {
            Forward::Unchanged => chunk.len(),
            Forward::Replace(bytes) => bytes.len(),
        };
    }
    assert!(stream.usage().is_some());
    out
}

fn main() {
    let body = chat_stream();
    println!(
        "stream: {EVENTS} events, {} bytes, 1400-byte chunks",
        body.len()
    );
    // one-time build of each BPE (per VM in the plugin), measured before anything else
    for encoding in [Encoding::O200k, Encoding::Cl100k] {
        let before = LIVE.load(Ordering::Relaxed);
        let start = Instant::now();
        let n = count_tokens(encoding, "hello world");
        let elapsed = start.elapsed();
        let kept = LIVE.load(Ordering::Relaxed).saturating_sub(before);
        println!(
            "{:12} first use: build {:5.0} ms, heap kept {:5.1} MiB (64-bit native; n={n})",
            encoding.name(),
            elapsed.as_secs_f64() * 1e3,
            kept as f64 / (1024.0 * 1024.0)
        );
    }
    // The variants run interleaved, round after round, so a noisy neighbour hits them alike;
    // the minimum is the least disturbed run, the median the typical one.
    let variants: [(&str, Option<(bool, Encoding)>); 4] = [
        ("framing only (shared::sse)", None),
        (
            "observe (client asked for usage)",
            Some((false, Encoding::Chars)),
        ),
        ("hide the usage-only chunk", Some((true, Encoding::Chars))),
        ("hide, text kept for o200k", Some((true, Encoding::O200k))),
    ];
    let mut samples = vec![Vec::new(); variants.len()];
    for _ in 0..41 {
        for (i, (_, variant)) in variants.iter().enumerate() {
            let start = Instant::now();
            match variant {
                None => {
                    let mut framer = llm_gateway_shared::sse::Framer::new(1 << 20);
                    let mut n = 0usize;
                    for chunk in body.chunks(1_400) {
                        framer.push(chunk);
                        while let Some(event) = framer.next_event() {
                            n += event.map_or(0, |e| e.raw.len());
                        }
                    }
                    std::hint::black_box(n);
                }
                Some((hide, encoding)) => {
                    std::hint::black_box(run(&body, *hide, *encoding));
                }
            }
            if let Some(list) = samples.get_mut(i) {
                list.push(start.elapsed().as_secs_f64() * 1e9 / EVENTS as f64);
            }
        }
    }
    for ((label, _), list) in variants.iter().zip(samples) {
        let min = list.iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "{label:36} min {min:6.0} ns/event   median {:6.0} ns/event",
            median(list)
        );
    }

    // One whole non-streaming exchange (2 KB prompt): request inspection and injection check,
    // usage from the JSON answer, cost, the record as JSON — what a request costs besides
    // the host calls.
    let config = usage_accounting::config::parse_document(
        br#"{"price_version":"v","prices":{"east":{"input":"0.30","cached_input":"0.006","output":"1.20"}}}"#,
    )
    .ok()
    .and_then(|rules| rules.global().cloned());
    let Some(config) = config else { return };
    let prompt = "lorem ipsum dolor sit amet ".repeat(75);
    let request = format!(
        r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"{prompt}"}}],"max_tokens":100}}"#
    );
    let answer = br#"{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"tok0 tok1 tok2 tok3"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1000,"completion_tokens":100,"prompt_tokens_details":{"cached_tokens":600}}}"#;
    let headers: [(&[u8], &[u8]); 3] = [
        (b"x-llm-tenant", b"acme"),
        (b"x-llm-deployment", b"east"),
        (b"x-request-id", b"abc"),
    ];
    let mut samples = Vec::new();
    for _ in 0..41 {
        let start = Instant::now();
        for _ in 0..100 {
            let attribution =
                usage_accounting::exchange::Attribution::from_headers(headers, || None);
            let Some(mut ex) =
                usage_accounting::exchange::Exchange::start("/v1/chat/completions", attribution, 0)
            else {
                return;
            };
            ex.on_request_body(&config, request.as_bytes());
            ex.on_response_headers(&config, 200, "application/json", Some(answer.len() as u64));
            ex.on_response_data(answer);
            ex.on_response_end(&config, None, true);
            let record = ex.finish(&config, None, true, 1);
            std::hint::black_box(record.map(|r| r.to_json()));
        }
        samples.push(start.elapsed().as_secs_f64() * 1e9 / 100.0);
    }
    let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "{:36} min {min:6.0} ns/request median {:6.0} ns/request",
        "non-streaming exchange, 2 KB prompt",
        median(samples)
    );
}
