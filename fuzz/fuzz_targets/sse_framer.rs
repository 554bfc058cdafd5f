//! `shared::sse::Framer` (and model-router's `StreamWatcher` on top of it).
//!
//! Input: `bound selector, split plan, stream bytes`. Checked:
//! - the raw bytes of every item, then the tail of `finish`, give back the stream exactly;
//! - after draining, the framer holds at most `max_event_bytes` (+1 for a CR waiting for a
//!   possible LF);
//! - each event is `Event::parse` of its own raw bytes;
//! - with a bound no event reaches, the items do not depend on where the stream was cut, and
//!   neither does the watcher's "terminated" verdict.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_gateway_fuzz::{Input, Plan};
use llm_gateway_shared::sse::{Event, Framer, SseError};
use model_router::stream::StreamWatcher;

/// Every item and the unterminated tail of `chunks` framed with `max` bytes of buffer.
fn frame(chunks: &[&[u8]], max: usize) -> (Vec<Result<Event, SseError>>, Option<Vec<u8>>) {
    let mut framer = Framer::new(max);
    let mut items = Vec::new();
    for chunk in chunks {
        framer.push(chunk);
        while let Some(item) = framer.next_event() {
            items.push(item);
        }
        assert!(
            framer.pending() <= max.max(1) + 1,
            "framer holds {} bytes over a bound of {max}",
            framer.pending()
        );
    }
    framer.close();
    while let Some(item) = framer.next_event() {
        items.push(item);
    }
    (items, framer.finish())
}

fn raw(item: &Result<Event, SseError>) -> &[u8] {
    match item {
        Ok(event) => &event.raw,
        Err(overflow) => overflow.raw(),
    }
}

fn watched(chunks: &[&[u8]]) -> bool {
    let mut watcher = StreamWatcher::default();
    for chunk in chunks {
        watcher.push(chunk);
    }
    watcher.finished()
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    // a bound small enough to overflow often, or one no input reaches
    let max = match input.byte() % 4 {
        0 => 0,
        1 => 7,
        2 => 64,
        _ => 1 << 20,
    };
    let plan = input.plan();
    let stream = input.rest();
    let chunks = plan.split(stream);

    let (items, tail) = frame(&chunks, max);
    let mut rebuilt: Vec<u8> = items.iter().flat_map(|i| raw(i).to_vec()).collect();
    rebuilt.extend_from_slice(tail.as_deref().unwrap_or_default());
    assert_eq!(rebuilt, stream, "items and tail must give back the stream");
    for event in items.iter().flatten() {
        assert_eq!(&Event::parse(event.raw.clone()), event);
        let _ = event.is_done();
    }

    if stream.len() < 1 << 20 {
        // no event can overflow the 1 MiB bound: cuts must not matter
        let whole = Plan::Sizes(Vec::new()).split(stream);
        if max == 1 << 20 {
            assert_eq!(
                frame(&whole, max),
                (items, tail),
                "framing depends on the cuts"
            );
        }
        assert_eq!(
            watched(&chunks),
            watched(&whole),
            "watcher depends on the cuts"
        );
    }
});
