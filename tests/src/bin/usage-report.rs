//! `scripts/usage-report`: spend per tenant / project / model group for a month, with the cache
//! hit rate, from the usage ledger.
//!
//! ```text
//! usage-report [--month YYYY-MM] [--csv | --html] (--redis HOST:PORT [--stream KEY] | FILE...)
//! ```
//! - `--html`: one self-contained HTML document on stdout (`llm_gateway_tests::usage_html`):
//!   the totals, inline SVG charts of spend per day and per model group, and the table;
//! - `--redis`: reads the Redis stream ledger (Higress builds write it; default key
//!   `llm:usage`, field `record`) with `XRANGE` over the month, 1 000 entries a call;
//! - `FILE...` (`-` for stdin): JSON lines — bare records, Envoy access-log lines whose `usage`
//!   field holds the record (`%FILTER_STATE(wasm.llm_usage:PLAIN)%`), or Envoy log lines with
//!   the plugin's `usage_record: {…}`, for plain-Envoy deployments without Redis.
//!
//! The month defaults to the current one (UTC). Aggregation is `usage_accounting::report`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use usage_accounting::record::Record;
use usage_accounting::report::{aggregate, record_from_line, render_csv, render_text, Month};

struct Args {
    month: Month,
    csv: bool,
    html: bool,
    redis: Option<String>,
    stream: String,
    files: Vec<String>,
}

fn usage() -> ! {
    eprintln!("usage: usage-report [--month YYYY-MM] [--csv | --html] (--redis HOST:PORT [--stream KEY] | FILE...)");
    std::process::exit(2)
}

fn current_month() -> Month {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Month::containing(now_ms)
}

fn parse_args() -> Args {
    let mut args = Args {
        month: current_month(),
        csv: false,
        html: false,
        redis: None,
        stream: "llm:usage".into(),
        files: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--month" => {
                let value = it.next().unwrap_or_else(|| usage());
                args.month = Month::parse(&value).unwrap_or_else(|e| {
                    eprintln!("usage-report: {e}");
                    std::process::exit(2)
                });
            }
            "--csv" => args.csv = true,
            "--html" => args.html = true,
            "--redis" => args.redis = Some(it.next().unwrap_or_else(|| usage())),
            "--stream" => args.stream = it.next().unwrap_or_else(|| usage()),
            "-h" | "--help" => usage(),
            _ if arg.starts_with("--") => usage(),
            _ => args.files.push(arg),
        }
    }
    if (args.redis.is_none() && args.files.is_empty()) || (args.csv && args.html) {
        usage();
    }
    args
}

fn main() {
    let args = parse_args();
    let (records, skipped) = match &args.redis {
        Some(addr) => match read_redis(addr, &args.stream, args.month) {
            Ok(found) => found,
            Err(e) => {
                eprintln!("usage-report: redis {addr}: {e}");
                std::process::exit(1)
            }
        },
        None => read_files(&args.files),
    };
    let out = if args.html {
        llm_gateway_tests::usage_html::render_html(records, Some(args.month))
    } else if args.csv {
        let rows = aggregate(records, Some(args.month));
        render_csv(&rows)
    } else {
        render_text(&aggregate(records, Some(args.month)))
    };
    print!("{out}");
    if skipped > 0 {
        eprintln!("usage-report: {skipped} lines without a record skipped");
    }
}

fn read_files(files: &[String]) -> (Vec<Record>, u64) {
    let mut records = Vec::new();
    let mut skipped = 0;
    for file in files {
        let reader: Box<dyn BufRead> = if file == "-" {
            Box::new(BufReader::new(std::io::stdin()))
        } else {
            match std::fs::File::open(file) {
                Ok(f) => Box::new(BufReader::new(f)),
                Err(e) => {
                    eprintln!("usage-report: {file}: {e}");
                    std::process::exit(1)
                }
            }
        };
        for line in reader.lines().map_while(Result::ok) {
            if line.trim().is_empty() {
                continue;
            }
            match record_from_line(&line) {
                Some(record) => records.push(record),
                None => skipped += 1,
            }
        }
    }
    (records, skipped)
}

/// A RESP reply, as much of it as the report needs.
enum Reply {
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
    Other,
}

fn read_reply(reader: &mut BufReader<TcpStream>) -> Result<Reply, String> {
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    let line = line.trim_end();
    let (kind, rest) = line.split_at_checked(1).ok_or("empty reply")?;
    match kind {
        "-" => Err(rest.to_string()),
        "+" | ":" => Ok(Reply::Other),
        "$" => {
            let len: i64 = rest.parse().map_err(|_| "bad bulk length")?;
            if len < 0 {
                return Ok(Reply::Bulk(None));
            }
            let mut buf = vec![0u8; len as usize + 2];
            reader.read_exact(&mut buf).map_err(|e| e.to_string())?;
            buf.truncate(len as usize);
            Ok(Reply::Bulk(Some(buf)))
        }
        "*" => {
            let len: i64 = rest.parse().map_err(|_| "bad array length")?;
            let mut items = Vec::new();
            for _ in 0..len.max(0) {
                items.push(read_reply(reader)?);
            }
            Ok(Reply::Array(items))
        }
        _ => Err(format!("unexpected reply {line:?}")),
    }
}

fn command(stream: &mut TcpStream, args: &[&str]) -> Result<(), String> {
    let mut query = format!("*{}\r\n", args.len());
    for arg in args {
        query.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream
        .write_all(query.as_bytes())
        .map_err(|e| e.to_string())
}

/// `XRANGE key start end COUNT 1000`, page after page; the `record` field of each entry.
fn read_redis(addr: &str, key: &str, month: Month) -> Result<(Vec<Record>, u64), String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
    let (start_ms, end_ms) = month.range_ms();
    // Entry ids are the Redis clock at XADD; read a day either side and filter on ts_ms.
    let mut start = start_ms.saturating_sub(86_400_000).to_string();
    let end = (end_ms + 86_400_000).to_string();
    let mut records = Vec::new();
    let mut skipped = 0;
    loop {
        command(&mut stream, &["XRANGE", key, &start, &end, "COUNT", "1000"])?;
        let Reply::Array(entries) = read_reply(&mut reader)? else {
            return Err("XRANGE did not answer an array".into());
        };
        let count = entries.len();
        for entry in entries {
            let Reply::Array(parts) = entry else { continue };
            let mut parts = parts.into_iter();
            let (Some(Reply::Bulk(Some(id))), Some(Reply::Array(fields))) =
                (parts.next(), parts.next())
            else {
                continue;
            };
            start = format!("({}", String::from_utf8_lossy(&id));
            let mut fields = fields.into_iter();
            let mut found = None;
            while let (Some(Reply::Bulk(Some(name))), Some(Reply::Bulk(Some(value)))) =
                (fields.next(), fields.next())
            {
                if name == b"record" {
                    found = record_from_line(&String::from_utf8_lossy(&value));
                }
            }
            match found {
                Some(record) => records.push(record),
                None => skipped += 1,
            }
        }
        if count < 1000 {
            break;
        }
    }
    Ok((records, skipped))
}
