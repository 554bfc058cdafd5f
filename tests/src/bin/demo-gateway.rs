//! `scripts/run`: starts the demo gateway (the whole chain in Envoy, mock providers), prints the
//! walkthrough, then one line per request a provider receives; Ctrl-C (or SIGTERM) stops it all.
//!
//! Usage: `demo-gateway [--port N]` (default 10000, or `LLM_GATEWAY_PORT`).

use llm_gateway_tests::demo::Demo;
use std::process::ExitCode;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};

fn port_from_args() -> Result<u16, String> {
    let mut args = std::env::args().skip(1);
    let mut port = std::env::var("LLM_GATEWAY_PORT").ok();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port" => port = Some(args.next().ok_or("--port needs a value")?),
            "-h" | "--help" => return Err("usage: demo-gateway [--port N]".into()),
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: demo-gateway [--port N]"
                ))
            }
        }
    }
    match port {
        None => Ok(10_000),
        Some(p) => p.parse().map_err(|_| format!("not a port: {p:?}")),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let port = match port_from_args() {
        Ok(port) => port,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let mut demo = match Demo::start(port).await {
        Ok(demo) => demo,
        Err(err) => {
            eprintln!("demo gateway failed to start: {err}");
            if port != 0 {
                eprintln!("(is port {port} in use? try scripts/run --port 0)");
            }
            return ExitCode::FAILURE;
        }
    };
    println!("{}", demo.banner());

    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        eprintln!("cannot install signal handlers");
        return ExitCode::FAILURE;
    };
    let mut watch = tokio::time::interval(Duration::from_millis(300));
    loop {
        tokio::select! {
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            _ = watch.tick() => {
                for line in demo.drain_provider_lines() {
                    println!("{line}");
                }
                if !demo.envoy.is_running() {
                    eprintln!("envoy exited unexpectedly; logs in {}", demo.envoy.dir().display());
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    println!("\nstopping");
    drop(demo);
    ExitCode::SUCCESS
}
