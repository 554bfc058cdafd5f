//! usage-accounting end to end: the compiled plugin in a real Envoy 1.40 (`--concurrency 2`),
//! in front of the mock upstream, driven by a real HTTP client. The access log prints the
//! record from filter state (`%FILTER_STATE(wasm.llm_usage:PLAIN)%`); metrics are read from
//! `/stats/prometheus` with the labels the `stats_tags` of `envoy-config/e2e-usage.yaml` make.

use llm_gateway_shared::request::Api;
use llm_gateway_shared::tokens::{count_tokens, estimate_prompt_tokens, Encoding};
use llm_gateway_tests::envoy::Envoy;
use llm_gateway_tests::http::{self, Response};
use llm_gateway_tests::workloads;
use llm_gateway_tests::workspace::EnvoyVersion;
use mock_upstream::MockUpstream;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

struct Gateway {
    upstream: MockUpstream,
    envoy: Envoy,
}

fn usage_config() -> Value {
    workloads::usage_config()
}

impl Gateway {
    async fn start() -> Gateway {
        Gateway::start_with(usage_config()).await
    }

    async fn start_with(config: Value) -> Gateway {
        let upstream = MockUpstream::start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let vars = vec![
            ("MOCK_PORT", upstream.addr().port().to_string()),
            ("USAGE_CONFIG", config.to_string().replace('\'', "''")),
        ];
        let envoy = tokio::task::spawn_blocking(move || Envoy::start("e2e-usage.yaml", &vars))
            .await
            .unwrap()
            .unwrap();
        Gateway { upstream, envoy }
    }

    async fn post(
        &self,
        path: &str,
        id: &str,
        deployment: &str,
        body: &Value,
        extra: &[(&str, &str)],
    ) -> Result<Response, String> {
        let mut request = http::post(format!("{}{path}", self.envoy.url()))
            .json(body)
            .header("x-llm-request-id", id)
            .header("x-llm-tenant", "acme")
            .header("x-llm-consumer", "team-a")
            .header("x-llm-model-group", "fast")
            .header("x-llm-deployment", deployment)
            .header("x-project", "search")
            .header("x-agent", "planner")
            .header("x-run-id", "run-1");
        for (name, value) in extra {
            request = request.header(name, value);
        }
        request.send().await
    }

    /// The access-log line of request `id` (waits for the periodic flush).
    async fn access_log(&self, id: &str) -> Value {
        self.envoy
            .access_log_line("access.log", id, |l| (l["request_id"] == id).then_some(l))
            .await
    }

    /// The record of request `id`, as the access log printed it from filter state.
    async fn record(&self, id: &str) -> Value {
        let line = self.access_log(id).await;
        let usage = line["usage"].as_str().unwrap_or_default();
        serde_json::from_str(usage)
            .unwrap_or_else(|e| panic!("access log usage of {id} is not a record ({e}): {line}"))
    }

    /// The record of request `id` from the plugin's JSON log line.
    async fn logged_record(&self, id: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(15);
        let needle = format!("\"request_id\":\"{id}\"");
        loop {
            let logs = self.envoy.logs();
            if let Some(line) = logs
                .lines()
                .find(|l| l.contains("usage_record: ") && l.contains(&needle))
            {
                let json = line.split_once("usage_record: ").unwrap().1;
                return serde_json::from_str(json).unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "no usage_record for {id}:\n{logs}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn chat(stream: bool) -> Value {
    json!({
        "model": "gpt-4o-mini",
        "stream": stream,
        "messages": [{"role": "user", "content": "Say hello"}]
    })
}

fn assert_usage(record: &Value, prompt: u64, completion: u64, cached: u64, write: u64) {
    let u = &record["usage"];
    assert_eq!(u["prompt_tokens"], prompt, "{record}");
    assert_eq!(u["completion_tokens"], completion, "{record}");
    assert_eq!(u["cached_prompt_tokens"], cached, "{record}");
    assert_eq!(u["cache_write_tokens"], write, "{record}");
    assert_eq!(u["total_tokens"], prompt + completion, "{record}");
}

/// Data payloads of an SSE body.
fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| {
            event
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .map(str::to_owned)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streaming_openai_has_exact_cost_headers_and_record() {
    let gw = Gateway::start().await;
    let response = gw
        .post(
            "/v1/chat/completions",
            "ns-1",
            "east",
            &chat(false),
            &[
                ("x-mock-prompt-tokens", "1000"),
                ("x-mock-cache-read-tokens", "600"),
                ("x-mock-chunks", "100"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-llm-cost"), Some("0.0002436 USD"));
    assert_eq!(response.header("x-llm-price-version"), Some("2026-11"));
    assert_eq!(response.header("x-llm-prompt-tokens"), Some("1000"));
    assert_eq!(response.header("x-llm-completion-tokens"), Some("100"));
    assert_eq!(response.header("x-llm-cached-tokens"), Some("600"));
    assert_eq!(response.header("x-llm-usage-source"), Some("upstream"));
    assert_eq!(response.json().unwrap()["usage"]["prompt_tokens"], 1000);

    let record = gw.record("ns-1").await;
    assert_usage(&record, 1000, 100, 600, 0);
    assert_eq!(record["cost_nano"], 243_600, "{record}");
    assert_eq!(record["currency"], "USD");
    assert_eq!(record["price_version"], "2026-11");
    assert_eq!(record["usage_source"], "upstream");
    assert_eq!(record["stream"], false);
    assert_eq!(record["status"], 200);
    assert_eq!(record["complete"], true);
    for (field, value) in [
        ("tenant", "acme"),
        ("consumer", "team-a"),
        ("project", "search"),
        ("agent", "planner"),
        ("run_id", "run-1"),
        ("model_group", "fast"),
        ("deployment", "east"),
        ("api", "chat.completions"),
    ] {
        assert_eq!(record[field], value, "{field}: {record}");
    }
    assert_eq!(
        record["attempts"],
        json!([{"deployment": "east", "status": 200}])
    );
    // the JSON log line carries the same record
    assert_eq!(gw.logged_record("ns-1").await, record);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_carry_usage_and_the_extra_chunk_is_hidden() {
    let gw = Gateway::start().await;

    // 1. the client did not ask for usage: the gateway asks, and hides the usage-only chunk,
    //    whether the stream comes in one frame or one frame per event
    let prompt = estimate_prompt_tokens(Api::ChatCompletions, &chat(true), Encoding::Chars);
    for (id, delay) in [("s-1", "0"), ("s-1-paced", "2")] {
        let response = gw
            .post(
                "/v1/chat/completions",
                id,
                "east",
                &chat(true),
                &[
                    ("x-mock-chunks", "5"),
                    ("x-mock-chunk-delay-ms", delay),
                    ("accept-encoding", "gzip, deflate"),
                ],
            )
            .await
            .unwrap();
        assert_eq!(response.status, 200);
        let upstream = gw.upstream.requests();
        gw.upstream.clear_requests();
        let sent_request = upstream.last().unwrap();
        assert_eq!(
            sent_request.header("accept-encoding"),
            None,
            "the provider must answer uncompressed"
        );
        let sent = sent_request.json().unwrap();
        assert_eq!(
            sent["stream_options"],
            json!({"include_usage": true}),
            "{sent}"
        );
        assert_eq!(
            sent["messages"],
            chat(true)["messages"],
            "rest of the body intact"
        );
        let data = sse_data(&response.text());
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
        for chunk in &data[..data.len() - 1] {
            let chunk: Value = serde_json::from_str(chunk).unwrap();
            assert!(
                chunk["choices"].as_array().is_some_and(|c| !c.is_empty()),
                "the client saw a chunk without choices: {chunk}"
            );
        }
        let text: String = data
            .iter()
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter_map(|c| {
                c["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect();
        assert_eq!(text, "tok0 tok1 tok2 tok3 tok4 ");
        let record = gw.record(id).await;
        assert_usage(&record, prompt, 5, 0, 0);
        assert_eq!(record["usage_source"], "upstream");
        assert_eq!(record["stream"], true);
        assert!(record["ttft_ms"].is_u64(), "{record}");
    }

    // 2. the client asked: it sees the usage chunk, untouched
    let mut asked = chat(true);
    asked["stream_options"] = json!({"include_usage": true});
    let response = gw
        .post(
            "/v1/chat/completions",
            "s-2",
            "east",
            &asked,
            &[("x-mock-chunks", "5")],
        )
        .await
        .unwrap();
    let data = sse_data(&response.text());
    let usage_chunk: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(usage_chunk["choices"], json!([]), "{usage_chunk}");
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 5);
    assert_usage(&gw.record("s-2").await, prompt, 5, 0, 0);

    // 3. usage in the final chunk that also has choices: counted, never removed
    let response = gw
        .post(
            "/v1/chat/completions",
            "s-3",
            "east",
            &chat(true),
            &[
                ("x-mock-chunks", "3"),
                ("x-mock-usage-in-final-chunk", "1"),
                ("x-mock-cache-read-tokens", "4"),
            ],
        )
        .await
        .unwrap();
    let data = sse_data(&response.text());
    let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop", "{last}");
    assert_eq!(last["usage"]["completion_tokens"], 3, "{last}");
    assert_usage(&gw.record("s-3").await, prompt, 3, 4, 0);

    // 4. the Responses API: usage from response.completed
    let responses = json!({"model": "gpt-4o-mini", "stream": true, "input": "Say hello"});
    let response = gw
        .post(
            "/v1/responses",
            "s-4",
            "east",
            &responses,
            &[("x-mock-chunks", "6"), ("x-mock-prompt-tokens", "40")],
        )
        .await
        .unwrap();
    assert!(response.text().contains("response.completed"));
    let record = gw.record("s-4").await;
    assert_usage(&record, 40, 6, 0, 0);
    assert_eq!(record["api"], "responses");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_counts_cache_tokens_once() {
    let gw = Gateway::start().await;
    let body = |stream: bool| {
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 100,
            "stream": stream,
            "messages": [{"role": "user", "content": "Say hello"}]
        })
    };
    let knobs = [
        ("x-mock-prompt-tokens", "12"),
        ("x-mock-cache-read-tokens", "1000"),
        ("x-mock-chunks", "7"),
    ];
    for (id, stream) in [("a-1", true), ("a-2", false)] {
        let response = gw
            .post("/v1/messages", id, "claude-east", &body(stream), &knobs)
            .await
            .unwrap();
        assert_eq!(response.status, 200, "{}", response.text());
        let record = gw.record(id).await;
        // input 12 uncached + 1000 cache reads, once; output from message_delta
        assert_usage(&record, 1012, 7, 1000, 0);
        assert_eq!(record["api"], "messages");
        assert_eq!(record["stream"], stream);
        // 12 × 3 + 1000 × 0.30 + 7 × 15 per million = 441 micro-units
        assert_eq!(record["cost_nano"], 441_000, "{record}");
        if !stream {
            assert_eq!(response.header("x-llm-cost"), Some("0.000441 USD"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_stream_and_missing_usage_give_estimated_records() {
    let gw = Gateway::start().await;
    // cut after the role chunk and 3 content chunks
    let cut = gw
        .post(
            "/v1/chat/completions",
            "cut-1",
            "east",
            &chat(true),
            &[("x-mock-chunks", "50"), ("x-mock-cut-after", "4")],
        )
        .await;
    if let Ok(response) = &cut {
        assert!(
            !response.text().contains("[DONE]"),
            "a cut stream looked complete"
        );
    }
    let prompt = estimate_prompt_tokens(Api::ChatCompletions, &chat(true), Encoding::O200k);
    let streamed = count_tokens(Encoding::O200k, "tok0 tok1 tok2 ");
    // on_log runs before Envoy's access loggers: even a cut stream's record is in the log
    let record = gw.record("cut-1").await;
    assert_eq!(gw.access_log("cut-1").await["flags"], "UPE");
    assert_eq!(gw.logged_record("cut-1").await, record);
    assert_eq!(record["usage_source"], "estimated", "{record}");
    assert_eq!(record["complete"], false, "{record}");
    assert_usage(&record, prompt, streamed, 0, 0);
    // 0.30 per million prompt + 1.20 per million completion, rounded once
    let exact = (u128::from(prompt) * 300_000_000 + u128::from(streamed) * 1_200_000_000 + 500_000)
        / 1_000_000;
    assert_eq!(record["cost_nano"], exact as u64, "{record}");

    // Anthropic cut after message_start, content_block_start, ping and 2 deltas: the input
    // and cache counts are the provider's, the output is counted
    let messages = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "stream": true,
        "messages": [{"role": "user", "content": "Say hello"}]
    });
    let _ = gw
        .post(
            "/v1/messages",
            "cut-a",
            "claude-east",
            &messages,
            &[
                ("x-mock-chunks", "50"),
                ("x-mock-cut-after", "5"),
                ("x-mock-prompt-tokens", "12"),
                ("x-mock-cache-read-tokens", "1000"),
            ],
        )
        .await;
    let record = gw.record("cut-a").await;
    assert_eq!(record["usage_source"], "estimated", "{record}");
    assert_eq!(record["complete"], false, "{record}");
    assert_usage(
        &record,
        1012,
        count_tokens(Encoding::Chars, "tok0 tok1 "),
        1000,
        0,
    );

    // a provider that sends no usage at all, stream complete
    let response = gw
        .post(
            "/v1/chat/completions",
            "nu-1",
            "east",
            &chat(true),
            &[("x-mock-chunks", "4"), ("x-mock-no-usage", "1")],
        )
        .await
        .unwrap();
    assert!(response.text().contains("[DONE]"));
    let record = gw.record("nu-1").await;
    assert_eq!(record["usage_source"], "estimated", "{record}");
    assert_eq!(record["complete"], true);
    assert_usage(
        &record,
        prompt,
        count_tokens(Encoding::O200k, "tok0 tok1 tok2 tok3 "),
        0,
        0,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_have_labels_at_stats_prometheus() {
    let gw = Gateway::start().await;
    for (i, deployment) in ["east", "east", "west"].iter().enumerate() {
        let response = gw
            .post(
                "/v1/chat/completions",
                &format!("m-{i}"),
                deployment,
                &chat(false),
                &[
                    ("x-mock-prompt-tokens", "1000"),
                    ("x-mock-cache-read-tokens", "600"),
                    ("x-mock-chunks", "100"),
                ],
            )
            .await
            .unwrap();
        assert_eq!(response.status, 200);
        gw.record(&format!("m-{i}")).await;
    }
    let prometheus = gw.envoy.admin_get("/stats/prometheus").unwrap();
    let lines: Vec<&str> = prometheus
        .lines()
        .filter(|l| !l.starts_with('#') && (l.contains("gen_ai") || l.contains("llm_gateway")))
        .collect();
    let find = |prefix: &str, labels: &[&str]| -> Option<String> {
        lines
            .iter()
            .find(|l| l.starts_with(prefix) && labels.iter().all(|x| l.contains(x)))
            .map(|l| l.to_string())
    };
    let value = |line: Option<String>| -> f64 {
        let line = line.unwrap_or_else(|| panic!("metric missing in:\n{}", lines.join("\n")));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let east = [
        "tenant=\"acme\"",
        "model_group=\"fast\"",
        "deployment=\"east\"",
    ];
    let with = |extra: &str| -> Vec<&str> {
        let mut v = east.to_vec();
        v.push(Box::leak(extra.to_string().into_boxed_str()));
        v
    };
    assert_eq!(
        value(find(
            "llm_gateway_usage_tokens{",
            &with("token_type=\"input\"")
        )),
        2000.0
    );
    assert_eq!(
        value(find(
            "llm_gateway_usage_tokens{",
            &with("token_type=\"cached_input\"")
        )),
        1200.0
    );
    assert_eq!(
        value(find(
            "llm_gateway_usage_tokens{",
            &with("token_type=\"output\"")
        )),
        200.0
    );
    assert_eq!(
        value(find("llm_gateway_usage_cost_nano{", &east)),
        487_200.0
    );
    assert_eq!(value(find("llm_gateway_usage_requests{", &east)), 2.0);
    assert_eq!(
        value(find(
            "llm_gateway_usage_requests{",
            &["deployment=\"west\""]
        )),
        1.0
    );
    assert!(
        find(
            "gen_ai_client_token_usage_bucket{",
            &with("gen_ai_token_type=\"output\"")
        )
        .is_some(),
        "{}",
        lines.join("\n")
    );
    assert!(find("gen_ai_client_operation_duration_ms_count{", &east).is_some());
    // no consumer label unless configured
    assert!(!prometheus.contains("consumer=\"team-a\""));
    drop(gw);

    let mut config = usage_config();
    config["consumer_label"] = json!(true);
    let gw = Gateway::start_with(config).await;
    gw.post(
        "/v1/embeddings",
        "m-e",
        "east",
        &json!({"model": "text-embedding-3-small", "input": "abcd"}),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(gw.record("m-e").await["usage"]["prompt_tokens"], 1);
    let prometheus = gw.envoy.admin_get("/stats/prometheus").unwrap();
    let line = prometheus
        .lines()
        .find(|l| l.starts_with("llm_gateway_usage_requests{"))
        .unwrap_or_else(|| panic!("{prometheus}"));
    assert!(
        line.contains("consumer=\"team-a\"") && line.contains("tenant=\"acme\""),
        "{line}"
    );
}

/// Runs `scripts/usage-report`'s binary.
fn usage_report(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_usage-report"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_report_reads_the_access_log_and_the_redis_ledger() {
    let gw = Gateway::start().await;
    let knobs = [
        ("x-mock-prompt-tokens", "1000"),
        ("x-mock-cache-read-tokens", "600"),
        ("x-mock-chunks", "100"),
    ];
    for id in ["r-1", "r-2"] {
        gw.post("/v1/chat/completions", id, "east", &chat(false), &knobs)
            .await
            .unwrap();
    }
    let streamed = gw
        .post("/v1/chat/completions", "r-3", "east", &chat(true), &knobs)
        .await
        .unwrap();
    assert_eq!(streamed.status, 200);
    let r3 = gw.record("r-3").await;
    for id in ["r-1", "r-2"] {
        gw.record(id).await;
    }
    let month = usage_accounting::report::Month::containing(r3["ts_ms"].as_u64().unwrap());
    let month = format!("{}-{:02}", month.year, month.month);
    let log = gw.envoy.dir().join("access.log");
    let log = log.to_str().unwrap();

    let csv = usage_report(&["--month", &month, "--csv", log]);
    let rows: Vec<&str> = csv.lines().collect();
    assert_eq!(rows.len(), 2, "{csv}");
    // 3 requests × (1000 prompt, 600 cached, 100 out) at 243.6 µ each
    assert_eq!(
        rows[1], "acme,search,fast,3,0,3000,1800,300,0.600,0.0007308,USD",
        "{csv}"
    );
    let text = usage_report(&["--month", &month, log]);
    assert!(
        text.contains("60.0%") && text.contains("0.0007308 USD"),
        "{text}"
    );
    // another month has nothing
    let empty = usage_report(&["--month", "2001-01", "--csv", log]);
    assert_eq!(empty.lines().count(), 1, "{empty}");

    // the Redis ledger: entries as the Higress build appends them (field `record`)
    let redis = llm_gateway_tests::redis::Redis::start().unwrap();
    let line = std::fs::read_to_string(gw.envoy.dir().join("access.log")).unwrap();
    for access in line.lines() {
        let access: Value = serde_json::from_str(access).unwrap();
        let record = access["usage"].as_str().unwrap();
        let reply = redis
            .command(&[
                "XADD",
                "llm:usage",
                "MAXLEN",
                "~",
                "1000",
                "*",
                "record",
                record,
            ])
            .unwrap();
        assert!(reply.starts_with('$'), "{reply}");
    }
    let addr = redis.addr().to_string();
    let from_redis = usage_report(&["--month", &month, "--csv", "--redis", &addr]);
    assert_eq!(from_redis, csv);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_answer_larger_than_envoys_buffer_passes_and_is_counted() {
    let gw = Gateway::start().await;
    // 12 000 embeddings: ~1.9 MB of JSON, over Envoy's 1 MiB buffer limit
    let inputs: Vec<String> = (0..12_000).map(|i| format!("w{i}")).collect();
    let body = json!({"model": "text-embedding-3-small", "input": inputs});
    let response = gw
        .post("/v1/embeddings", "big-1", "east", &body, &[])
        .await
        .unwrap();
    assert_eq!(response.status, 200, "{}", response.text());
    assert!(response.body.len() > 1 << 20, "{}", response.body.len());
    let answer = response.json().unwrap();
    let prompt = answer["usage"]["prompt_tokens"].as_u64().unwrap();
    // too large to hold the headers for: no cost headers, the record still has the cost
    assert_eq!(response.header("x-llm-cost"), None);
    let record = gw.record("big-1").await;
    assert_usage(&record, prompt, 0, 0, 0);
    assert_eq!(record["usage_source"], "upstream");
    assert_eq!(
        record["cost_nano"],
        ((u128::from(prompt) * 300_000_000 + 500_000) / 1_000_000) as u64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_validates_the_config_and_refuses_a_bad_one() {
    let vars = |config: Value| {
        vec![
            ("MOCK_PORT", "9".to_string()),
            ("USAGE_CONFIG", config.to_string().replace('\'', "''")),
        ]
    };
    let good = vars(usage_config());
    tokio::task::spawn_blocking(move || Envoy::validate("e2e-usage.yaml", &good))
        .await
        .unwrap()
        .unwrap();
    let mut bad = usage_config();
    bad["prices"]["east"]["output"] = json!("1.2e-3");
    let bad = vars(bad);
    let err = tokio::task::spawn_blocking(move || Envoy::validate("e2e-usage.yaml", &bad))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        err.contains("usage-accounting: invalid configuration: `prices.east.output`"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_mid_stream_gets_an_estimated_record() {
    let gw = Gateway::start().await;
    let body = chat(true).to_string();
    let addr = gw.envoy.url().trim_start_matches("http://").to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nx-llm-request-id: gone-1\r\nx-llm-tenant: acme\r\n\
         x-llm-deployment: east\r\nx-mock-chunks: 200\r\nx-mock-chunk-delay-ms: 20\r\n\r\n{body}",
        body.len()
    );
    llm_gateway_tests::http::hang_up_after(&addr, &request, "tok2 ").await;
    let record = gw.record("gone-1").await;
    assert_eq!(record["usage_source"], "estimated", "{record}");
    assert_eq!(record["complete"], false, "{record}");
    let completion = record["usage"]["completion_tokens"].as_u64().unwrap();
    // what was streamed before the hang-up, at most a few events more; never the 200 tokens
    assert!(
        completion >= count_tokens(Encoding::O200k, "tok0 tok1 tok2 ") && completion < 200,
        "{record}"
    );
    assert_eq!(
        record["usage"]["prompt_tokens"],
        estimate_prompt_tokens(Api::ChatCompletions, &chat(true), Encoding::O200k)
    );
}

/// What Envoy's histogram (circllhist: bins of two significant digits) adds to its `_sum`
/// for a sample `v`: the harmonic mean of the bounds of `v`'s bin, `2ab / (a + b)` (seen at
/// `/stats/prometheus` of Envoy 1.40: 3 counts as 3.04918…, 23 as 23.4894…; Envoy 1.36.4 counts
/// the bin's midpoint instead). Counts are
/// exact; the exact totals are the `llm_gateway_usage_tokens` counters.
fn binned(envoy: EnvoyVersion, v: u64) -> f64 {
    if v == 0 {
        return 0.0;
    }
    let mut width = 0.1;
    while (v as f64) >= width * 100.0 {
        width *= 10.0;
    }
    let low = (v as f64 / width).floor() * width;
    let high = low + width;
    if envoy == EnvoyVersion::V136 {
        // Envoy 1.36.4 counts the bin's midpoint (300 as 305, 3 as 3.05)
        return (low + high) / 2.0;
    }
    2.0 * low * high / (low + high)
}

/// The sum and the count of histogram `name` over every series whose labels include all of
/// `labels` (Envoy's `/stats/prometheus` text).
fn histogram_totals(prometheus: &str, name: &str, labels: &[String]) -> (f64, u64) {
    let value = |suffix: &str| -> f64 {
        prometheus
            .lines()
            .filter(|l| l.starts_with(&format!("{name}_{suffix}{{")))
            .filter(|l| labels.iter().all(|x| l.contains(x.as_str())))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    (value("sum"), value("count") as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn genai_metrics_follow_opentelemetry_and_match_the_records() {
    let gw = Gateway::start().await;
    let envoy = gw.envoy.version();
    let knobs = [("x-mock-prompt-tokens", "300"), ("x-mock-chunks", "12")];
    let streamed = [
        ("x-mock-prompt-tokens", "200"),
        ("x-mock-chunks", "9"),
        ("x-mock-chunk-delay-ms", "20"),
    ];
    let sent = [
        ("g-chat", "/v1/chat/completions", chat(false), &knobs[..]),
        (
            "g-stream",
            "/v1/chat/completions",
            chat(true),
            &streamed[..],
        ),
        (
            "g-embed",
            "/v1/embeddings",
            json!({"model": "text-embedding-3-small", "input": "abcd efgh"}),
            &[][..],
        ),
    ];
    let mut records = Vec::new();
    for (id, path, body, extra) in &sent {
        let response = gw.post(path, id, "east", body, extra).await.unwrap();
        assert_eq!(response.status, 200, "{id}: {}", response.text());
        records.push(gw.record(id).await);
    }
    let number = |r: &Value, field: &str| r[field].as_u64();
    let tokens = |r: &Value, field: &str| r["usage"][field].as_u64().unwrap();

    // every series carries OpenTelemetry's attributes and the route's labels
    let common = |operation: &str, model: &str| -> Vec<String> {
        vec![
            format!("gen_ai_operation_name=\"{operation}\""),
            "gen_ai_provider_name=\"openai\"".into(),
            "gen_ai_request_model=\"fast\"".into(),
            format!("gen_ai_response_model=\"{model}\""),
            "tenant=\"acme\"".into(),
            "model_group=\"fast\"".into(),
            "deployment=\"east\"".into(),
        ]
    };
    let model = |r: &Value| r["model"].as_str().unwrap().to_string();
    let (chat_a, chat_b, embed) = (&records[0], &records[1], &records[2]);
    assert_eq!(
        model(chat_a),
        model(chat_b),
        "one response model for both chats"
    );
    let chat_labels = common("chat", &model(chat_a));
    let embed_labels = common("embeddings", &model(embed));
    let with = |base: &[String], extra: &str| -> Vec<String> {
        let mut v = base.to_vec();
        v.push(extra.to_string());
        v
    };

    // what the records say the histograms must hold
    let chats = [chat_a, chat_b];
    let ttfts: Vec<u64> = chats.iter().filter_map(|r| number(r, "ttft_ms")).collect();
    assert!(!ttfts.is_empty(), "the stream has a first token: {chat_b}");
    let tpots: Vec<u64> = chats
        .iter()
        .filter_map(|r| {
            let ttft = number(r, "ttft_ms")?;
            let after_first = tokens(r, "completion_tokens")
                .checked_sub(1)
                .filter(|n| *n > 0)?;
            Some((number(r, "duration_ms")? - ttft) * 1_000 / after_first)
        })
        .collect();
    assert!(!tpots.is_empty(), "{chat_b}");
    let expected: Vec<(&str, Vec<String>, f64, u64)> = vec![
        (
            "gen_ai_client_token_usage",
            with(&chat_labels, "gen_ai_token_type=\"input\""),
            chats
                .iter()
                .map(|r| binned(envoy, tokens(r, "prompt_tokens")))
                .sum(),
            2,
        ),
        (
            "gen_ai_client_token_usage",
            with(&chat_labels, "gen_ai_token_type=\"output\""),
            chats
                .iter()
                .map(|r| binned(envoy, tokens(r, "completion_tokens")))
                .sum(),
            2,
        ),
        (
            "gen_ai_client_token_usage",
            with(&embed_labels, "gen_ai_token_type=\"input\""),
            binned(envoy, tokens(embed, "prompt_tokens")),
            1,
        ),
        (
            "gen_ai_client_operation_duration_milliseconds",
            chat_labels.clone(),
            chats
                .iter()
                .map(|r| binned(envoy, number(r, "duration_ms").unwrap()))
                .sum(),
            2,
        ),
        (
            "gen_ai_server_time_to_first_token_milliseconds",
            chat_labels.clone(),
            ttfts.iter().map(|v| binned(envoy, *v)).sum(),
            ttfts.len() as u64,
        ),
        (
            "gen_ai_server_time_per_output_token_microseconds",
            chat_labels.clone(),
            tpots.iter().map(|v| binned(envoy, *v)).sum(),
            tpots.len() as u64,
        ),
    ];
    // histograms reach the admin page when Envoy merges them (its stats flush): poll
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let prometheus = gw.envoy.admin_get("/stats/prometheus").unwrap();
        let seen: Vec<(f64, u64)> = expected
            .iter()
            .map(|(name, labels, ..)| histogram_totals(&prometheus, name, labels))
            .collect();
        let want: Vec<(f64, u64)> = expected.iter().map(|(.., sum, n)| (*sum, *n)).collect();
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.max(1.0);
        if seen
            .iter()
            .zip(&want)
            .all(|((s, n), (ws, wn))| n == wn && close(*s, *ws))
        {
            // the names and labels an OpenTelemetry Prometheus exporter writes
            assert!(prometheus.contains("# TYPE gen_ai_client_token_usage histogram"));
            // OpenTelemetry's advised bounds (the bootstrap's histogram_bucket_settings)
            assert!(
                prometheus
                    .lines()
                    .any(|l| l.starts_with("gen_ai_client_token_usage_bucket{")
                        && l.contains("le=\"16384\"")),
                "{prometheus}"
            );
            assert!(prometheus.lines().any(|l| l
                .starts_with("gen_ai_client_operation_duration_milliseconds_bucket{")
                && l.contains("le=\"")));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "GenAI histograms (sum, count) {seen:?}, records say {want:?}:\n{}",
            prometheus
                .lines()
                .filter(|l| l.starts_with("gen_ai_") && !l.contains("_bucket{"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
