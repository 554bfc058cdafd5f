//! `scripts/run`: starts the demo gateway (the whole chain in Envoy, mock providers), prints the
//! walkthrough, then one line per request a provider receives; Ctrl-C (or SIGTERM) stops it all.
//!
//! Usage: `demo-gateway [--port N] [--fleet]` (default 10000, or `LLM_GATEWAY_PORT`). With
//! `--fleet`: two gateways (`envoy-config/gateway-fleet.yaml`) sharing one Redis through webdis.

use llm_gateway_tests::demo::{Demo, FleetDemo};
use std::process::ExitCode;
use std::time::Duration;
use tokio::signal::unix::{signal, Signal, SignalKind};

const USAGE: &str = "usage: demo-gateway [--port N] [--fleet]";

/// The port and whether to start the fleet.
fn args() -> Result<(u16, bool), String> {
    let mut args = std::env::args().skip(1);
    let mut port = std::env::var("LLM_GATEWAY_PORT").ok();
    let mut fleet = false;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port" => port = Some(args.next().ok_or("--port needs a value")?),
            "--fleet" => fleet = true,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}; {USAGE}")),
        }
    }
    match port {
        None => Ok((10_000, fleet)),
        Some(p) => p
            .parse()
            .map(|p| (p, fleet))
            .map_err(|_| format!("not a port: {p:?}")),
    }
}

/// Ctrl-C and SIGTERM, which stop the demo; `None` (said on stderr) if they cannot be caught.
fn stop_signals() -> Option<(Signal, Signal)> {
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(interrupt), Ok(terminate)) => Some((interrupt, terminate)),
        _ => {
            eprintln!("cannot install signal handlers");
            None
        }
    }
}

/// `--fleet`: runs until Ctrl-C or SIGTERM.
async fn run_fleet(port: u16) -> ExitCode {
    let mut fleet = match FleetDemo::start(port).await {
        Ok(fleet) => fleet,
        Err(err) => {
            eprintln!("fleet demo failed to start: {err}");
            return ExitCode::FAILURE;
        }
    };
    println!("{}", fleet.banner());
    let Some((mut interrupt, mut terminate)) = stop_signals() else {
        return ExitCode::FAILURE;
    };
    let mut watch = tokio::time::interval(Duration::from_millis(300));
    loop {
        tokio::select! {
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            _ = watch.tick() => {
                for gateway in &mut fleet.gateways {
                    if !gateway.is_running() {
                        eprintln!("envoy exited unexpectedly; logs in {}", gateway.dir().display());
                        return ExitCode::FAILURE;
                    }
                }
            }
        }
    }
    println!("\nstopping");
    drop(fleet);
    ExitCode::SUCCESS
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let (port, fleet) = match args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    if fleet {
        return run_fleet(port).await;
    }
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

    let Some((mut interrupt, mut terminate)) = stop_signals() else {
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
