//! `scripts/run`'s walkthrough works: every command the demo gateway prints is run here, as
//! printed, against the real chain in Envoy 1.40 (`envoy-config/gateway.yaml`) and the mock
//! providers, and its output shows what the walkthrough says it shows.

use llm_gateway_tests::demo::{self, Demo, DEMO_KEY, FAST_ONLY_KEY};
use llm_gateway_tests::envoy::Envoy;

async fn run(command: &str) -> String {
    let owned = command.to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("bash")
            .args(["-c", &owned])
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    assert!(
        out.status.success(),
        "{command}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_walkthrough_works() {
    let demo = Demo::start(0).await.unwrap();
    let banner = demo.banner();
    let steps = demo.walkthrough();
    assert_eq!(steps.len(), 8);
    for step in &steps {
        assert!(banner.contains(&step.command), "{banner}");
    }
    assert!(banner.contains(DEMO_KEY) && banner.contains(FAST_ONLY_KEY));

    // 1. a stream through the whole chain
    let out = run(&steps[0].command).await;
    assert!(out.contains("chat.completion.chunk"), "{out}");
    assert!(out.trim_end().ends_with("data: [DONE]"), "{out}");
    let lines = demo.drain_provider_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("[openai] POST /v1/chat/completions model=gpt-4o-mini"),
        "{lines:?}"
    );

    // 2. an OpenAI client's request answered by the Anthropic deployment: Anthropic's shape
    // and credential at the provider, OpenAI's shape for the client
    let out = run(&steps[1].command).await;
    let answer: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(answer["object"], "chat.completion", "{out}");
    assert_eq!(answer["model"], "claude-sonnet-4-5", "{out}");
    assert!(
        answer["choices"][0]["message"]["content"].is_string(),
        "{out}"
    );
    assert!(
        answer["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
        "{out}"
    );
    let lines = demo.drain_provider_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with(
            "[anthropic] POST /v1/messages model=claude-sonnet-4-5 credential=sk-ant-"
        ),
        "{lines:?}"
    );

    // 3. no key
    let out = run(&format!("{} -w ' %{{http_code}}'", steps[2].command)).await;
    assert!(
        out.contains("\"code\":\"missing_api_key\"") && out.ends_with(" 401"),
        "{out}"
    );

    // 4. PII: the provider sees a placeholder, the client its own address
    let out = run(&steps[3].command).await;
    assert!(
        out.contains("jane.doe@example.com") && !out.contains("[EMAIL_1]"),
        "{out}"
    );
    let lines = demo.drain_provider_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("[EMAIL_1]") && !lines[0].contains("jane.doe"),
        "{lines:?}"
    );
    assert!(!lines[0].contains(DEMO_KEY), "{lines:?}");

    // 5. group not allowed
    let out = run(&format!("{} -w ' %{{http_code}}'", steps[4].command)).await;
    assert!(
        out.contains("\"code\":\"model_not_allowed\"") && out.ends_with(" 403"),
        "{out}"
    );
    assert!(demo.drain_provider_lines().is_empty());

    // 6. the model list of the fast-only key, answered by the gateway
    let out = run(&steps[5].command).await;
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list["object"], "list", "{out}");
    let ids: Vec<_> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["id"])
        .collect();
    assert_eq!(ids, ["fast"], "{out}");
    assert!(demo.drain_provider_lines().is_empty());

    // 7. metrics: five keys allowed, three model calls admitted (the list is none)
    let out = run(&steps[6].command).await;
    assert!(
        out.contains("wasmcustom.llm_gateway.key_auth.allowed: 5"),
        "{out}"
    );
    assert!(
        out.contains("wasmcustom.llm_gateway.ratelimit.admitted: 3"),
        "{out}"
    );
    assert!(
        out.contains("wasmcustom.llm_gateway.model_router.models_answered: 1"),
        "{out}"
    );

    // 8. the usage report over the access log, once both answered requests are logged
    // (scripts/usage-report only builds and runs this binary)
    for (what, stream) in [("the stream", true), ("the PII request", false)] {
        demo.envoy
            .access_log_line("access.log", what, |line| {
                let usage = line["usage"].as_str()?;
                let record: serde_json::Value = serde_json::from_str(usage).ok()?;
                (record["stream"] == stream).then_some(())
            })
            .await;
    }
    let command = steps[7].command.replacen(
        "scripts/usage-report",
        env!("CARGO_BIN_EXE_usage-report"),
        1,
    );
    assert_ne!(command, steps[7].command);
    let out = run(&command).await;
    assert!(out.contains("demo"), "{out}");
    assert!(out.contains("fast"), "{out}");
}

/// The gateway bootstrap passes `envoy --mode validate` with every plugin loaded and
/// configured; a broken plugin config is refused, naming the field.
#[test]
fn gateway_config_validates() {
    Envoy::validate(demo::config(), &demo::vars(0, 9, 9, 9)).unwrap();
}
