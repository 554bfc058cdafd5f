//! Properties of the plugins' cost in the harness that must hold whatever the machine: fuel
//! and bytes across the boundary (deterministic up to a plugin's `HashMap` order), never time.
//! The figures themselves come from `harness-cost` (see each plugin's README).

use llm_gateway_tests::harness::{cost::Totals, CallCost, Fleet};
use llm_gateway_tests::workloads as w;

fn of<'a>(costs: &'a [CallCost], plugin: &'a str) -> impl Iterator<Item = &'a CallCost> + 'a {
    costs.iter().filter(move |c| c.plugin == plugin)
}

fn callback<'a>(
    costs: &'a [CallCost],
    name: &'static str,
) -> impl Iterator<Item = &'a CallCost> + 'a {
    costs.iter().filter(move |c| c.callback == name)
}

/// key-auth decides on headers alone: key-auth.wasm does not even export the body callback
/// (only its Higress build holds the body while a key is read from Redis), so a 256 KiB body
/// costs it what a 2 KiB one does.
#[test]
fn key_auth_never_reads_the_body() {
    let fleet = Fleet::single(w::key_auth().unwrap()).unwrap();
    let mut fuel = Vec::new();
    for size in [2 * 1024, 256 * 1024] {
        let body = w::chat_body(size);
        let ex = fleet
            .exchange(0, 0, &w::router_request(&body), |_| w::chat_completion())
            .unwrap();
        assert_eq!(ex.status(), 200, "{}", ex.text());
        assert_eq!(callback(&ex.cost, "proxy_on_request_body").count(), 0);
        let headers = Totals::of(callback(&ex.cost, "proxy_on_request_headers"));
        fuel.push(headers.fuel);
    }
    // the headers' work does not depend on the body (only content-length's digits differ)
    let (small, large) = (fuel[0] as f64, fuel[1] as f64);
    assert!(
        (large - small).abs() < small * 0.05,
        "headers fuel {small} vs {large}"
    );
}

/// The router (both roles) reads the body once, at its end, in one linear pass: the fuel each
/// added byte costs does not grow with the body (a re-scan per chunk would double it with
/// each doubling), and the body crosses into the VM once.
#[test]
fn model_router_fuel_is_linear_in_the_body() {
    for role in ["downstream", "upstream"] {
        let mut fuel = Vec::new();
        let sizes = [64 * 1024, 128 * 1024, 256 * 1024];
        for size in sizes {
            let body = w::chat_body(size);
            let (fleet, request) = if role == "downstream" {
                let fleet = Fleet::builder()
                    .filter(w::key_auth().unwrap())
                    .filter(w::router_downstream().unwrap())
                    .build()
                    .unwrap();
                (fleet, w::router_request(&body))
            } else {
                let fleet = Fleet::single(w::router_upstream().unwrap()).unwrap();
                (fleet, w::router_attempt_request(&body))
            };
            let mut sent = Vec::new();
            let ex = fleet
                .exchange(0, 0, &request, |up| {
                    sent = up.body.clone();
                    w::chat_completion()
                })
                .unwrap();
            assert_eq!(ex.status(), 200, "{role}: {}", ex.text());
            let body_sent: serde_json::Value = serde_json::from_slice(&sent).unwrap();
            assert_eq!(body_sent["model"], "model-a", "{role}: not rewritten");
            let router = Totals::of(of(&ex.cost, "model-router"));
            assert!(
                router.bytes_in < body.len() as u64 + 4096,
                "{role}: {} bytes copied in for a {} byte body",
                router.bytes_in,
                body.len()
            );
            fuel.push(router.fuel as f64);
        }
        let per_byte_low = (fuel[1] - fuel[0]) / (sizes[1] - sizes[0]) as f64;
        let per_byte_high = (fuel[2] - fuel[1]) / (sizes[2] - sizes[1]) as f64;
        assert!(
            per_byte_high < per_byte_low * 1.3,
            "{role}: {per_byte_low:.1} fuel per byte from 64 to 128 KiB, {per_byte_high:.1} from 128 to 256 KiB"
        );
    }
}

/// Split `calls` into quarters and give the fuel of the first and of the last.
fn first_and_last_quarter(calls: &[&CallCost]) -> (u64, u64) {
    let q = calls.len() / 4;
    let first = calls.iter().take(q).map(|c| c.fuel).sum();
    let last = calls.iter().skip(calls.len() - q).map(|c| c.fuel).sum();
    (first, last)
}

/// Restoring a long stream costs the same per event at its end as at its start (nothing is
/// re-scanned or accumulated per event), and each network chunk crosses into the VM once.
/// The stream echoes the text four times over, once per quarter, so that the quarters hold
/// the same placeholders (an event that holds or restores one costs many plain ones): what
/// differs between them is the position alone.
#[test]
fn pii_restore_cost_per_event_does_not_grow_along_the_stream() {
    let fleet = Fleet::single(w::pii().unwrap()).unwrap();
    let request = w::pii_request(&w::prose(1024, true), true);
    let mut stream_len = 0;
    let ex = fleet
        .exchange(0, 0, &request, |up| {
            let text = w::sent_user_text(&up.body).unwrap();
            assert!(text.contains("[EMAIL_1]"), "not masked");
            let per_echo = text.chars().count().div_ceil(3);
            let r = w::echo_stream(&text, 4 * per_echo, 1024);
            stream_len = r.chunks.iter().map(Vec::len).sum::<usize>();
            r
        })
        .unwrap();
    assert!(ex.text().contains("user0@example.com"), "not restored");
    let calls: Vec<_> = callback(&ex.cost, "proxy_on_response_body").collect();
    assert_eq!(calls.len(), stream_len.div_ceil(1024));
    let copied_in: u64 = calls.iter().map(|c| c.counters.bytes_in).sum();
    assert_eq!(copied_in, stream_len as u64, "each chunk read once");
    let (first, last) = first_and_last_quarter(&calls);
    assert!(
        (last as f64) < first as f64 * 1.25,
        "fuel of the first quarter of the stream {first}, of the last {last}"
    );
}

/// usage-accounting: the per-event cost is flat along a 2 000-event stream, and the
/// tokenizer is built only when a request needs an estimate (linear memory stays put while
/// streams carry usage, and grows by the BPE's size at the first estimate).
#[test]
fn usage_cost_per_event_is_flat_and_the_tokenizer_is_built_only_for_an_estimate() {
    let fleet = Fleet::single(w::usage().unwrap()).unwrap();
    let configured = fleet.memory_bytes(0, 0, 0).unwrap();
    let ex = fleet
        .exchange(0, 0, &w::usage_request("flat"), |_| {
            w::usage_stream(2000, true, 0)
        })
        .unwrap();
    let calls: Vec<_> = callback(&ex.cost, "proxy_on_response_body").collect();
    assert_eq!(calls.len(), 2000);
    // the last event ([DONE]) publishes the record: compare the deltas only
    let deltas = &calls[..1996];
    let (first, last) = first_and_last_quarter(deltas);
    assert!(
        (last as f64) < first as f64 * 1.25,
        "fuel of the first quarter of the stream {first}, of the last {last}"
    );
    let with_usage = fleet.memory_bytes(0, 0, 0).unwrap();
    assert!(
        with_usage - configured < 2 << 20,
        "memory grew from {configured} to {with_usage} without an estimate"
    );
    let ex = fleet
        .exchange(0, 0, &w::usage_request("estimate"), |_| {
            w::usage_stream(100, false, 1024)
        })
        .unwrap();
    let record: serde_json::Value =
        serde_json::from_slice(ex.filter_state.get("wasm.llm_usage").unwrap()).unwrap();
    assert_eq!(record["usage_source"], "estimated", "{record}");
    let estimated = fleet.memory_bytes(0, 0, 0).unwrap();
    // the o200k_base index: 2^19 slots of 8 bytes (shared::tokens::bpe), 4 MiB
    assert!(
        estimated - with_usage > 3 << 20,
        "memory grew from {with_usage} to {estimated} only: no tokenizer built?"
    );
    // built once: a second estimate does not grow it again
    fleet
        .exchange(0, 0, &w::usage_request("estimate-2"), |_| {
            w::usage_stream(100, false, 1024)
        })
        .unwrap();
    let again = fleet.memory_bytes(0, 0, 0).unwrap();
    assert!(
        again - estimated < 1 << 20,
        "a second estimate grew memory from {estimated} to {again}"
    );
}
