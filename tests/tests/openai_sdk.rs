//! The official `openai` Python SDK against the gateway, unchanged: create, streaming,
//! models, and the SDK's exception types for 400/401/404. The test command creates the
//! virtualenv (`.venv`, or `CROSSGUARD_PYTHON` names the interpreter).

use std::path::PathBuf;

use crossguard_e2e::mock_upstream::MockUpstream;
use crossguard_e2e::{upstream_config, TestGateway};

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("CROSSGUARD_PYTHON") {
        return PathBuf::from(p);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_python_sdk_works_unchanged() {
    let python = python();
    assert!(
        python.exists(),
        "{} not found: run scripts/test.sh (it creates .venv with the openai SDK) or set CROSSGUARD_PYTHON",
        python.display()
    );
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&upstream_config(&mock.base_url(), ""), &[("UPSTREAM_KEY", "k")]).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/sdk_compat.py");
    let out = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(gw.url("/v1"))
        .arg("sk-acme-1")
        .arg("mock")
        .output()
        .await
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "SDK checks failed:\n{stdout}\n{stderr}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("ok")).count(), 10, "{stdout}");
}
