//! The load: `wrk` (one thread, pinned to the load CPU) with a Lua script per workload, and
//! its output parsed into a [`Sample`].

use super::procs;
use std::path::Path;
use std::process::Command;

/// One kind of request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workload {
    /// Short label.
    pub name: &'static str,
    /// Bytes of the user message.
    pub prompt_bytes: usize,
    /// SSE events of a stream; 0: a JSON answer. Without `echo`, asked of the mock with
    /// `x-mock-chunks`.
    pub events: u32,
    /// The stream echoes a last user message with personal data ([`echo_text`]): `events` × 3
    /// characters, which the mock (`x-mock-echo`) streams back 3 characters per event, so that
    /// pii-redaction masks an e-mail address and a phone number on the way in and restores
    /// them in the stream on the way out.
    pub echo: bool,
    /// A JSON answer's user message starts with [`ECHO_PII`] (an e-mail address and a phone
    /// number), so pii-redaction masks it on the way in: the chat the issue's targets name.
    pub pii: bool,
    /// The request names [`TRANSLATION_GROUP`] instead of the row's model: an OpenAI client
    /// served by gateway.yaml's Anthropic deployment, so model-router translates the request
    /// into Anthropic Messages and the answer (JSON or SSE) back (issue 42). Otherwise the
    /// same request as its [`Workload::counterpart`].
    pub translated: bool,
}

/// The model group a translated workload asks for: gateway.yaml's `claude`, one deployment of
/// provider `anthropic` (the mock answers its `/v1/messages`).
pub const TRANSLATION_GROUP: &str = "claude";

/// The personal data of an echoed stream's message: an e-mail address and a phone number
/// exactly as long as the placeholders pii-redaction gives them (`[EMAIL_1]`, `[PHONE_1]`),
/// so the masked message the provider echoes has as many events as the original.
pub const ECHO_PII: &str = "Please write to jo@ab.com or call 017012345 about the order. ";

/// The last user message of an echoed stream: [`ECHO_PII`] then prose, `chars` ASCII characters.
pub fn echo_text(chars: usize) -> String {
    let mut text = String::from(ECHO_PII);
    while text.len() < chars {
        text.push_str(pii_redaction::bench_data::PARAGRAPH);
    }
    text.retain(|c| c.is_ascii());
    text.truncate(chars);
    text
}

/// The bench's workloads: the untranslated ones first (the main tables, perf, the ablation
/// and the leak check take those), then the translated ones (the translation phase, issue 42).
pub const WORKLOADS: [Workload; 5] = [
    Workload {
        name: "chat 2 KB",
        prompt_bytes: 2 * 1024,
        events: 0,
        echo: false,
        pii: true,
        translated: false,
    },
    Workload {
        name: "chat 32 KB",
        prompt_bytes: 32 * 1024,
        events: 0,
        echo: false,
        pii: false,
        translated: false,
    },
    Workload {
        name: "stream 200 events",
        prompt_bytes: 2 * 1024,
        events: 200,
        echo: true,
        pii: true,
        translated: false,
    },
    Workload {
        name: "chat 2 KB translated",
        prompt_bytes: 2 * 1024,
        events: 0,
        echo: false,
        pii: true,
        translated: true,
    },
    Workload {
        name: "stream 200 events translated",
        prompt_bytes: 2 * 1024,
        events: 200,
        echo: true,
        pii: true,
        translated: true,
    },
];

impl Workload {
    /// True for a streaming request.
    pub fn streams(&self) -> bool {
        self.events > 0
    }

    /// The model the request names on a row whose requests name `row_model`: that, or
    /// [`TRANSLATION_GROUP`] for a translated workload.
    pub fn model<'a>(&self, row_model: &'a str) -> &'a str {
        if self.translated {
            TRANSLATION_GROUP
        } else {
            row_model
        }
    }

    /// Of `workloads`, the index of the untranslated workload sending the same request as this
    /// translated one (`None` for an untranslated workload, or when there is none).
    pub fn counterpart(&self, workloads: &[Workload]) -> Option<usize> {
        if !self.translated {
            return None;
        }
        workloads.iter().position(|w| {
            !w.translated
                && w.prompt_bytes == self.prompt_bytes
                && w.events == self.events
                && w.echo == self.echo
                && w.pii == self.pii
        })
    }

    /// The request body with model `model` (see [`Workload::body_for`]).
    pub fn body(&self, model: &str) -> String {
        self.body_for(model, false)
    }

    /// The request body with model `model`, `prompt_bytes` of message text: one user message
    /// of prose, with [`ECHO_PII`] in front when `pii`; for an echoed stream, prose in a system message and
    /// the [`echo_text`] of `events` × 3 characters as the (last) user message. `stream: true`
    /// for a stream, and with `include_usage` also `stream_options.include_usage` (what
    /// usage-accounting injects: a row without it asks for it itself).
    pub fn body_for(&self, model: &str, include_usage: bool) -> String {
        let prose = |bytes: usize| {
            let mut prompt = pii_redaction::bench_data::prose(bytes, false);
            let mut end = bytes.min(prompt.len());
            while !prompt.is_char_boundary(end) {
                end -= 1;
            }
            prompt.truncate(end);
            prompt
        };
        let messages = if self.echo {
            let echoed = self.echo_message();
            serde_json::json!([
                {"role": "system", "content": prose(self.prompt_bytes.saturating_sub(echoed.len()))},
                {"role": "user", "content": echoed},
            ])
        } else if self.pii {
            let content = format!(
                "{ECHO_PII}{}",
                prose(self.prompt_bytes.saturating_sub(ECHO_PII.len()))
            );
            serde_json::json!([{"role": "user", "content": content}])
        } else {
            serde_json::json!([{"role": "user", "content": prose(self.prompt_bytes)}])
        };
        let mut body = serde_json::json!({"model": model, "messages": messages});
        if self.streams() {
            body["stream"] = serde_json::json!(true);
            if include_usage {
                body["stream_options"] = serde_json::json!({"include_usage": true});
            }
        }
        body.to_string()
    }

    /// The user message an echoed stream streams back (empty otherwise).
    pub fn echo_message(&self) -> String {
        if self.echo {
            echo_text(3 * self.events as usize)
        } else {
            String::new()
        }
    }

    /// The headers of the request: JSON, the key, and for a stream `x-mock-echo` (echoed) or
    /// `x-mock-chunks` (when `mock_knob`: a proxy that forwards client headers; LiteLLM does
    /// not, its model group sets `x-mock-chunks` instead).
    pub fn headers(&self, authorization: &str, mock_knob: bool) -> Vec<(String, String)> {
        let mut headers = vec![
            ("Content-Type".to_string(), "application/json".to_string()),
            (
                "Authorization".to_string(),
                format!("Bearer {authorization}"),
            ),
        ];
        if self.streams() && mock_knob {
            if self.echo {
                headers.push(("x-mock-echo".into(), "1".into()));
            } else {
                headers.push(("x-mock-chunks".into(), self.events.to_string()));
            }
        }
        headers
    }

    /// A wrk Lua script sending this request.
    pub fn lua(&self, model: &str, authorization: &str, mock_knob: bool) -> String {
        self.lua_for(model, authorization, mock_knob, false)
    }

    /// A wrk Lua script sending this request, its body from [`Workload::body_for`].
    pub fn lua_for(
        &self,
        model: &str,
        authorization: &str,
        mock_knob: bool,
        include_usage: bool,
    ) -> String {
        let mut lua = String::from("wrk.method = \"POST\"\nwrk.path = \"/v1/chat/completions\"\n");
        for (name, value) in self.headers(authorization, mock_knob) {
            lua.push_str(&format!("wrk.headers[\"{name}\"] = \"{value}\"\n"));
        }
        lua.push_str(&format!(
            "wrk.body = [===[{}]===]\n",
            self.body_for(model, include_usage)
        ));
        lua
    }
}

/// One measurement window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// Requests completed.
    pub requests: f64,
    /// Requests per second.
    pub rps: f64,
    /// Latency percentiles, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Non-2xx answers plus socket errors.
    pub errors: u64,
}

/// Runs wrk against `url` for `secs` with `connections`; its parsed output.
pub fn run(url: &str, script: &Path, secs: u32, connections: u32) -> crate::Result<Sample> {
    let output = Command::new("taskset")
        .args([
            "-c",
            procs::LOAD_CPU,
            "wrk",
            "-t1",
            "--latency",
            "--timeout",
            "30s",
        ])
        .arg(format!("-c{connections}"))
        .arg(format!("-d{secs}s"))
        .arg("-s")
        .arg(script)
        .arg(url)
        .output()
        .map_err(|e| format!("wrk: {e} (apt-get install wrk)"))?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        return Err(format!(
            "wrk against {url} failed: {text}{}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    parse(&text).map_err(|e| format!("{e} in wrk output:\n{text}"))
}

/// Parses wrk's `--latency` output.
pub fn parse(text: &str) -> crate::Result<Sample> {
    let requests: f64 = text
        .lines()
        .find_map(|l| l.trim().split_once(" requests in "))
        .and_then(|(n, _)| n.trim().parse().ok())
        .ok_or("no request count")?;
    let rps = text
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or("no Requests/sec")?;
    let percentile = |p: &str| -> crate::Result<f64> {
        match text.lines().find_map(|l| l.trim().strip_prefix(p)) {
            Some(v) => parse_latency_us(v.trim()),
            // no request completed: wrk prints no distribution
            None if requests == 0.0 => Ok(0.0),
            None => Err(format!("no {p} latency")),
        }
    };
    let non_2xx: u64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Non-2xx or 3xx responses:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    // "Socket errors: connect 0, read 3, write 0, timeout 2"
    let socket: u64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Socket errors:"))
        .map(|v| {
            v.split(',')
                .filter_map(|part| part.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    Ok(Sample {
        requests,
        rps,
        p50_us: percentile("50%")?,
        p99_us: percentile("99%")?,
        errors: non_2xx + socket,
    })
}

/// wrk prints `812.00us`, `1.23ms`, `2.00s`, `1.50m`.
pub fn parse_latency_us(text: &str) -> crate::Result<f64> {
    let (number, scale) = if let Some(v) = text.strip_suffix("us") {
        (v, 1.0)
    } else if let Some(v) = text.strip_suffix("ms") {
        (v, 1_000.0)
    } else if let Some(v) = text.strip_suffix('s') {
        (v, 1_000_000.0)
    } else if let Some(v) = text.strip_suffix('m') {
        (v, 60_000_000.0)
    } else {
        return Err(format!("latency {text:?}"));
    };
    number
        .parse::<f64>()
        .map(|n| n * scale)
        .map_err(|e| format!("latency {text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = "Running 2s test @ http://127.0.0.1:1234
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.20ms  300.00us   5.00ms   90.00%
    Req/Sec    12.00k     1.00k   13.00k    80.00%
  Latency Distribution
     50%  812.00us
     75%    1.00ms
     90%    1.50ms
     99%    2.50ms
  24000 requests in 2.00s, 10.00MB read
  Socket errors: connect 0, read 3, write 0, timeout 2
  Non-2xx or 3xx responses: 7
Requests/sec:  12000.00
Transfer/sec:      5.00MB
";

    #[test]
    fn parses_wrk_output() {
        let s = parse(OUTPUT).unwrap();
        assert_eq!(s.requests, 24000.0);
        assert_eq!(s.rps, 12000.0);
        assert_eq!(s.p50_us, 812.0);
        assert_eq!(s.p99_us, 2500.0);
        assert_eq!(s.errors, 12);
        assert!(parse("nothing").is_err());
        assert_eq!(parse_latency_us("2.00s").unwrap(), 2_000_000.0);
        assert!(parse_latency_us("2.00x").is_err());
    }

    #[test]
    fn workloads_ask_what_they_say() {
        for w in WORKLOADS {
            let body: serde_json::Value = serde_json::from_str(&w.body("fast")).unwrap();
            let messages = body["messages"].as_array().unwrap();
            let text: usize = messages
                .iter()
                .map(|m| m["content"].as_str().unwrap().len())
                .sum();
            assert_eq!(text, w.prompt_bytes, "{}", w.name);
            assert_eq!(body["stream"].as_bool().unwrap_or(false), w.streams());
            assert!(body.get("stream_options").is_none());
            let lua = w.lua("fast", "k", true);
            assert!(!w.body("fast").contains("]===]"));
            assert_eq!(
                lua.contains("x-mock-chunks\"] = \"200\"")
                    || lua.contains("x-mock-echo\"] = \"1\""),
                w.streams()
            );
            assert!(lua.contains("Bearer k"));
            assert!(!w.lua("fast", "k", false).contains("x-mock-"));
            if w.echo {
                // the last user message is what the mock streams back, one event per 3 chars
                let last = messages.last().unwrap();
                assert_eq!(last["role"], "user");
                let echoed = last["content"].as_str().unwrap();
                assert_eq!(echoed, w.echo_message());
                assert_eq!(echoed.chars().count(), 3 * w.events as usize);
                assert!(echoed.starts_with(ECHO_PII));
                let usage: serde_json::Value =
                    serde_json::from_str(&w.body_for("gpt-4o-mini", true)).unwrap();
                assert_eq!(usage["stream_options"]["include_usage"], true);
                assert_eq!(usage["model"], "gpt-4o-mini");
            }
        }
        assert!(WORKLOADS.iter().any(|w| w.echo), "the stream carries PII");
    }

    #[test]
    fn a_translated_workload_is_its_counterpart_asking_for_claude() {
        let translated: Vec<&Workload> = WORKLOADS.iter().filter(|w| w.translated).collect();
        let names: Vec<&str> = translated.iter().map(|w| w.name).collect();
        assert_eq!(
            names,
            ["chat 2 KB translated", "stream 200 events translated"]
        );
        let first = WORKLOADS.iter().position(|w| w.translated).unwrap();
        assert!(
            WORKLOADS[first..].iter().all(|w| w.translated),
            "the untranslated workloads come first"
        );
        for w in translated {
            let u = WORKLOADS[w.counterpart(&WORKLOADS).unwrap()];
            assert!(!u.translated);
            assert_eq!(w.name, format!("{} translated", u.name));
            assert_eq!(w.model("fast"), TRANSLATION_GROUP);
            assert_eq!(u.model("fast"), "fast");
            let mut body: serde_json::Value =
                serde_json::from_str(&w.body(w.model("fast"))).unwrap();
            assert_eq!(body["model"], "claude");
            body["model"] = "fast".into();
            assert_eq!(body.to_string(), u.body("fast"));
            assert_eq!(w.headers("k", true), u.headers("k", true));
            assert!(w
                .lua(w.model("fast"), "k", true)
                .contains(r#""model":"claude""#));
        }
        assert_eq!(WORKLOADS[0].counterpart(&WORKLOADS), None);
    }
}
