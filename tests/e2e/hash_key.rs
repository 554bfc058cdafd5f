//! `scripts/hash-key` prints a config line that key-auth accepts and whose digest is the
//! SHA-256 of the key; `--new` makes a fresh key each time.

use key_auth::config::parse_document;
use llm_gateway_tests::workspace::sha256_hex;
use std::io::Write;
use std::process::{Command, Stdio};

fn hash_key(args: &[&str], stdin: &str) -> (String, String) {
    let script = llm_gateway_tests::workspace::root().join("scripts/hash-key");
    let mut child = Command::new(script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn accepted_digest(line: &str) -> String {
    let rules = parse_document(format!("{{\"keys\":[{line}]}}").as_bytes()).unwrap();
    let entry: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(rules.global().unwrap().keys.len(), 1);
    entry["key_sha256"].as_str().unwrap().to_string()
}

#[test]
fn digest_line_from_stdin_is_accepted_by_key_auth() {
    let key = "sk-some-team-key-1234";
    let (stdout, _) = hash_key(
        &[
            "--consumer",
            "team-a",
            "--tenant",
            "acme",
            "--groups",
            "fast,smart",
        ],
        &format!("{key}\n"),
    );
    let line = stdout.trim();
    let want = sha256_hex(key.as_bytes());
    assert_eq!(accepted_digest(line), want);
    let entry: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(entry["consumer"], "team-a");
    assert_eq!(entry["groups"], serde_json::json!(["fast", "smart"]));
    assert!(!line.contains(key), "the line repeats the key");
}

#[test]
fn new_keys_are_random_and_shown_once() {
    let (out1, err1) = hash_key(&["--new", "--consumer", "c"], "");
    let (out2, _) = hash_key(&["--new", "--consumer", "c"], "");
    assert_ne!(accepted_digest(out1.trim()), accepted_digest(out2.trim()));
    let key = err1.trim().rsplit(' ').next().unwrap();
    assert!(key.starts_with("sk-llmgw-") && key.len() > 30, "{err1}");
    let want = sha256_hex(key.as_bytes());
    assert_eq!(accepted_digest(out1.trim()), want);
}
