//! `mock-upstream [--listen 127.0.0.1:8080] [--threads N] [--flavor any|openai|anthropic|azure]
//! [--log]`: runs the mock OpenAI / Anthropic / Azure upstream until killed. See the library
//! documentation for the flavors, endpoints and knobs.

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;

use mock_upstream::Flavor;

const USAGE: &str = "usage: mock-upstream [--listen ADDR] [--threads N] [--flavor FLAVOR] [--log]
  --listen ADDR     address to bind (default 127.0.0.1:0, an ephemeral port)
  --threads N       tokio worker threads (default 1)
  --flavor FLAVOR   the provider to play: any (every route, lenient; the default), openai,
                    anthropic or azure (its routes, authentication and validation only)
  --log             one line per request on stderr";

struct Args {
    listen: SocketAddr,
    threads: usize,
    flavor: Flavor,
    log: bool,
}

enum Parsed {
    Run(Args),
    Help,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Parsed, String> {
    let mut parsed = Args {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        threads: 1,
        flavor: Flavor::Any,
        log: false,
    };
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_owned(), Some(value.to_owned()))
            }
            _ => (arg, None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag.as_str() {
            "--listen" => {
                let v = value("--listen")?;
                parsed.listen = v
                    .parse()
                    .map_err(|_| format!("--listen: not a socket address (IP:PORT): {v:?}"))?;
            }
            "--threads" => {
                let v = value("--threads")?;
                parsed.threads = match v.parse::<usize>() {
                    Ok(n) if (1..=1024).contains(&n) => n,
                    _ => {
                        return Err(format!(
                            "--threads: expected an integer in 1..=1024, got {v:?}"
                        ))
                    }
                };
            }
            "--flavor" => {
                parsed.flavor = value("--flavor")?
                    .parse()
                    .map_err(|e| format!("--flavor: {e}"))?;
            }
            "--log" if inline.is_none() => parsed.log = true,
            "-h" | "--help" if inline.is_none() => return Ok(Parsed::Help),
            other => return Err(format!("unknown argument: {other:?}")),
        }
    }
    Ok(Parsed::Run(parsed))
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(Parsed::Run(args)) => args,
        Ok(Parsed::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("mock-upstream: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mock-upstream: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let listener = match tokio::net::TcpListener::bind(args.listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("mock-upstream: cannot listen on {}: {e}", args.listen);
                return ExitCode::FAILURE;
            }
        };
        let addr = match listener.local_addr() {
            Ok(a) => a,
            Err(e) => {
                eprintln!("mock-upstream: {e}");
                return ExitCode::FAILURE;
            }
        };
        let mut stdout = std::io::stdout().lock();
        if writeln!(stdout, "mock-upstream listening on http://{addr}")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            // Whoever waits for the line is gone; keep serving anyway.
        }
        drop(stdout);
        match mock_upstream::serve_flavor(listener, args.log, args.flavor).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("mock-upstream: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Parsed, String> {
        parse_args(args.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn args() {
        let Ok(Parsed::Run(a)) = parse(&[]) else {
            panic!("defaults")
        };
        assert_eq!(a.listen, SocketAddr::from(([127, 0, 0, 1], 0)));
        assert_eq!(a.threads, 1);
        assert_eq!(a.flavor, Flavor::Any);
        assert!(!a.log);
        let Ok(Parsed::Run(a)) = parse(&["--listen", "0.0.0.0:8080", "--threads=4", "--log"])
        else {
            panic!("all flags")
        };
        assert_eq!(a.listen, SocketAddr::from(([0, 0, 0, 0], 8080)));
        assert_eq!(a.threads, 4);
        assert!(a.log);
        let Ok(Parsed::Run(a)) = parse(&["--flavor", "anthropic"]) else {
            panic!("--flavor")
        };
        assert_eq!(a.flavor, Flavor::Anthropic);
        let Ok(Parsed::Run(a)) = parse(&["--flavor=azure"]) else {
            panic!("--flavor=")
        };
        assert_eq!(a.flavor, Flavor::Azure);
        assert!(matches!(parse(&["--help"]), Ok(Parsed::Help)));
        for bad in [
            &["--listen"][..],
            &["--listen", "localhost"],
            &["--threads", "0"],
            &["--threads", "x"],
            &["--bogus"],
            &["--log=1"],
            &["--flavor", "gemini"],
            &["--flavor"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
