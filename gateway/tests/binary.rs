//! The `crossguard` binary itself: version, config errors on the terminal, and a real
//! `serve` that answers on the address it logs and stops cleanly on SIGTERM.

#![allow(clippy::expect_used)] // a test: a failed set-up step should stop it loudly

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{write_config, BIN};

#[test]
fn version_is_printed() {
    let out = Command::new(BIN).arg("--version").output().expect("binary runs");
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("crossguard {}", env!("CARGO_PKG_VERSION")));
}

#[test]
fn config_errors_name_file_and_key_and_exit_2() {
    let cfg = write_config("[[tenants]]\nid = \"acme\"\napi_keys = [\"sk-acme-1\"]\ncolour = \"blue\"\n");
    let out = Command::new(BIN).args(["serve", "--config"]).arg(cfg.path()).env_clear().output().expect("binary runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&cfg.path().display().to_string()) && err.contains("tenants[0]") && err.contains("colour"),
        "{err}"
    );

    let out = Command::new(BIN).args(["serve", "--config", "/nonexistent/crossguard.toml"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/crossguard.toml"));
}

#[test]
fn check_config_reports_a_summary() {
    let cfg = write_config("listen = \"127.0.0.1:0\"\n[[tenants]]\nid = \"acme\"\napi_keys = [\"sk-acme-1\"]\n");
    let out = Command::new(BIN).args(["check-config", "--config"]).arg(cfg.path()).output().expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 tenant(s)"));
}

#[test]
fn serve_answers_on_the_logged_address_and_stops_on_sigterm() {
    let cfg = write_config("listen = \"127.0.0.1:0\"\n[[tenants]]\nid = \"acme\"\napi_keys = [\"sk-acme-1\"]\n");
    let mut child = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(cfg.path())
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary starts");
    let stderr = child.stderr.take().expect("stderr piped");
    let mut lines = BufReader::new(stderr).lines();
    let addr = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| l.split("addr=").nth(1).map(|a| a.split_whitespace().next().unwrap_or("").to_owned()))
        .expect("the server logs its address");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let status =
        rt.block_on(async { reqwest::get(format!("http://{addr}/healthz")).await.expect("healthz answers").status() });
    assert_eq!(status, 200);
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            assert!(s.success(), "clean exit on SIGTERM, got {s:?}");
            break;
        }
        assert!(Instant::now() < deadline, "server did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `crossguard scan --input-jsonl`: one contract line per finding, byte offsets into
/// `text` (Cyrillic before the secret counts two bytes a letter), the record's `id`
/// verbatim whatever its JSON type, placeholders silent, and a bad record (here one that
/// is not UTF-8, then one of the wrong shape) reported by line without stopping the
/// records after it. Exit 2: an error outranks findings.
#[test]
fn scan_jsonl_prints_the_contract_lines_and_reports_bad_records_by_line() {
    let mut corpus = tempfile::Builder::new().suffix(".jsonl").tempfile().expect("temp file");
    let mut text = Vec::new();
    text.extend_from_slice(
        "{\"id\":1,\"text\":\"Привет, value ghp_R8vTq2LmZx9WcY4bN7kP1sD3fG6hJ0aQe5Ui and more\"}\n".as_bytes(),
    );
    text.extend_from_slice(b"{\"id\":\"two\",\"text\":\"AKIAIOSFODNN7EXAMPLE your-api-key-here\"}\n");
    text.extend_from_slice(b"\xff\xfe{\"id\":3}\n");
    text.extend_from_slice(b"{\"text\":1}\n\n");
    text.extend_from_slice(b"{\"id\":[5],\"text\":\"aws AKIAZ7Q3LMXR4TYU2WPN\"}\n");
    std::io::Write::write_all(&mut corpus, &text).expect("write corpus");

    let out = Command::new(BIN).args(["scan", "--input-jsonl"]).arg(corpus.path()).output().expect("binary runs");
    assert_eq!(out.status.code(), Some(2));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert_eq!(
        lines,
        [
            serde_json::json!({"id": 1, "rule_id": "github-pat-classic", "start": 20, "end": 60, "severity": "critical", "action": "block"}),
            serde_json::json!({"id": [5], "rule_id": "aws-access-key-id", "start": 4, "end": 24, "severity": "critical", "action": "block"}),
        ]
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let path = corpus.path().display();
    assert!(err.contains(&format!("{path}:3: not UTF-8 (first bad byte at column 1)")), "{err}");
    assert!(err.contains(&format!("{path}:4: not a {{\"id\",\"text\"}} record")), "{err}");
}

/// `crossguard scan --input-jsonl -` scans records in batches, but never waits for input
/// to fill one: a record piped in alone is answered while stdin is still open.
#[test]
fn scan_jsonl_answers_each_piped_record_before_the_next_arrives() {
    let mut child = Command::new(BIN)
        .args(["scan", "--input-jsonl", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("binary runs");
    let mut stdin = child.stdin.take().expect("stdin");
    // Lines are read on their own thread, so that an answer held back fails the test
    // after a while instead of hanging it.
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let (lines, answers) = std::sync::mpsc::channel();
    std::thread::spawn(move || stdout.lines().map_while(Result::ok).try_for_each(|l| lines.send(l)));
    for (id, key) in [(1, "ghp_R8vTq2LmZx9WcY4bN7kP1sD3fG6hJ0aQe5Ui"), (2, "ghp_Q3wTq2LmZx9WcY4bN7kP1sD3fG6hJ0aQe5Zk")]
    {
        // The key alone on its line: one finding per record (`token KEY` would also be a
        // directive-secret finding, and a second line would answer for the next record).
        let record = format!("{{\"id\":{id},\"text\":\"{key}\"}}\n");
        std::io::Write::write_all(&mut stdin, record.as_bytes()).expect("write stdin");
        let Ok(line) = answers.recv_timeout(Duration::from_secs(30)) else {
            let _ = child.kill();
            panic!("record {id} was not answered while stdin stayed open");
        };
        let finding: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        assert_eq!((finding["id"].as_i64(), finding["rule_id"].as_str()), (Some(id), Some("github-pat-classic")));
    }
    drop(stdin);
    assert_eq!(child.wait().expect("binary ends").code(), Some(1));
}

/// `crossguard scan --read-encoded`: a key written in base64 is found, its line names the
/// encoding and spans the base64; without the flag the line is not printed.
#[test]
fn scan_read_encoded_finds_a_key_written_in_base64() {
    let mut file = tempfile::Builder::new().suffix(".txt").tempfile().expect("temp file");
    // base64 of `GITHUB_TOKEN=ghp_R7dkQ2w9ZpLx4VbN8cT1sYhM3fJ6uE0aKq5W`
    let encoded = "R0lUSFVCX1RPS0VOPWdocF9SN2RrUTJ3OVpwTHg0VmJOOGNUMXNZaE0zZko2dUUwYUtxNVc=";
    std::io::Write::write_all(&mut file, format!("config: {encoded}\n").as_bytes()).expect("write");
    let plain = Command::new(BIN).arg("scan").arg(file.path()).output().expect("binary runs");
    assert_eq!((plain.status.code(), plain.stdout.len()), (Some(0), 0));
    let out = Command::new(BIN).args(["scan", "--read-encoded"]).arg(file.path()).output().expect("binary runs");
    assert_eq!(out.status.code(), Some(1));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    let github = lines.iter().find(|l| l["rule_id"] == "github-pat-classic").expect("the key is found");
    assert_eq!(github["encoding"], "base64");
    let (start, end) = (github["start"].as_u64().unwrap_or(0), github["end"].as_u64().unwrap_or(0));
    assert!(start >= 8 + 16 && end <= 8 + encoded.len() as u64, "{github}");
}

/// `crossguard scan -` reads stdin; `id` is `-`; exit 1 on findings, 0 on clean text.
#[test]
fn scan_stdin_exits_1_on_findings_and_0_on_clean_text() {
    let run = |input: &str| {
        let mut child = Command::new(BIN)
            .args(["scan", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("binary runs");
        std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), input.as_bytes()).expect("write stdin");
        child.wait_with_output().expect("binary ends")
    };
    let dirty = run("export GITHUB_TOKEN=ghp_R8vTq2LmZx9WcY4bN7kP1sD3fG6hJ0aQe5Ui\n");
    assert_eq!(dirty.status.code(), Some(1));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&dirty.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert!(
        lines.contains(&serde_json::json!({"id": "-", "rule_id": "github-pat-classic", "start": 20, "end": 60, "severity": "critical", "action": "block"})),
        "{lines:?}"
    );
    let clean = run("The deploy finished; see the runbook for the rollback steps.\n");
    assert_eq!(clean.status.code(), Some(0));
    assert!(clean.stdout.is_empty());
}
