//! Cost per request of the compiled plugins in the wasmtime harness: wasm fuel, host calls
//! and bytes across the boundary, per callback (a deterministic complement to `scripts/bench`,
//! which measures time in a real Envoy).
//!
//! Usage: `harness-cost [--requests N]` (after `scripts/build`). Prints a markdown table for
//! key-auth with the e2e config: allowed requests, then refused ones.

use llm_gateway_tests::harness::{cost, FilterSpec, Fleet, Request, Response};
use llm_gateway_tests::workspace;

fn main() -> Result<(), String> {
    let mut requests = 200u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--requests" => {
                requests = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .ok_or("--requests needs a number")?
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(workspace::envoy_config("e2e-key-auth.json"))
            .map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let body = serde_json::json!({"model": "fast", "messages": [{"role": "user", "content": "x".repeat(2000)}]});
    for (label, key) in [
        ("allowed (x-api-key of team-a)", "sk-e2e-team-a-4f1c9a7e2b"),
        ("refused (unknown key)", "sk-e2e-nobody-0000000000"),
    ] {
        let fleet = Fleet::single(FilterSpec::plugin("key-auth", &config)?)?;
        let request = Request::post("/v1/chat/completions")
            .property("xds.route_name", "default")
            .property("xds.cluster_name", "mock")
            .header("x-api-key", key)
            .json(&body);
        // one warm-up request (first-request property probing), not counted
        fleet.exchange(0, 0, &request, |_| Response::status(200))?;
        let mut costs = Vec::new();
        for _ in 0..requests {
            let ex = fleet.exchange(0, 0, &request, |_| {
                Response::json(&serde_json::json!({"object": "chat.completion"}))
            })?;
            costs.extend(ex.cost);
        }
        println!("## key-auth, {label}, {requests} requests (units: per request)\n");
        println!("{}", cost::table(&costs, requests));
    }
    Ok(())
}
