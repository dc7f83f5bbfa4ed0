//! Engine models of every architecture and K-quant format, served by the gateway and
//! driven with the official `openai` SDK (`tests/python/engine_models.py`): greedy
//! completions, the same streamed, usage. The models are the tiny random-weight GGUFs
//! of `engine/tests/fixtures/arch/` (their logits are checked against llama.cpp's there):
//! a Gemma 3 with a SentencePiece vocabulary and no chat template (the gateway falls back
//! to Gemma's turns), a Qwen 3, and a Llama in Q4_K_M and Q6_K.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crossguard_e2e::{run_python, TestGateway};

const MODELS: [(&str, &str); 4] = [
    ("tiny-gemma3", "gemma3"),
    ("tiny-qwen3", "qwen3"),
    ("tiny-llama-q4km", "llama-q4_k_m"),
    ("tiny-llama-q6k", "llama-q6_k"),
];

fn config() -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/arch");
    let mut toml = String::from("[[tenants]]\nid = \"acme\"\napi_keys = [\"sk-acme-1\"]\n");
    for (id, file) in MODELS {
        let path = dir.join(format!("{file}.gguf"));
        toml += &format!(
            "\n[[models]]\nid = \"{id}\"\nbackend = \"engine\"\npath = {:?}\nthreads = 1\ncontext_tokens = 64\n",
            path.display().to_string()
        );
    }
    toml
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_architecture_and_k_quant_answers_through_the_openai_sdk() {
    let gw = TestGateway::start(&config(), &[]).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while reqwest::get(gw.url("/readyz")).await.map(|r| r.status().as_u16()).unwrap_or(0) != 200 {
        assert!(Instant::now() < deadline, "the models did not become ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ids: Vec<&str> = MODELS.iter().map(|(id, _)| *id).collect();
    let mut args = vec![gw.url("/v1"), "sk-acme-1".to_owned()];
    args.extend(ids.iter().map(|id| (*id).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let stdout = run_python("engine_models.py", &args).await;
    assert_eq!(stdout.lines().filter(|l| l.starts_with("ok")).count(), 5 * MODELS.len(), "{stdout}");
}
