//! Shared pieces of the end-to-end tests: a scripted upstream ([`mock_upstream`]) and a
//! gateway served in-process on a real socket ([`TestGateway`]).

pub mod mock_upstream;
pub mod own_redis;

use std::net::SocketAddr;

use gateway::config::Config;
use gateway::state::AppState;

/// Ordinary words: random runs of them are distinctive 8-grams, yet read like prose.
pub const VOCAB: &str = "the quarterly report shows revenue growth in northern region while costs of shipping \
    rose sharply after new contract with supplier was signed last spring our team plans to review \
    budget before board meeting next month please send updated forecast and include notes about \
    hiring freeze marketing campaign customer churn product launch delays server migration backup \
    schedule security audit findings vendor invoice payment terms legal review partner agreement \
    office move parking permits travel policy expense claims training sessions onboarding checklist \
    release notes bug triage incident report database upgrade latency spikes weekend maintenance \
    window support tickets escalation path pricing tiers discount approval warehouse inventory \
    count supply chain risk weather delays river port customs paperwork pallet labels driver \
    shortage fuel surcharge regional manager asked for summary of open issues and owners by friday";

/// A tiny deterministic generator (xorshift), so every run sends the same text.
pub struct Words {
    vocab: Vec<&'static str>,
    state: u64,
}

impl Words {
    pub fn new(seed: u64) -> Words {
        Words { vocab: VOCAB.split_whitespace().collect(), state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1 }
    }

    pub fn word(&mut self) -> &'static str {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.vocab[(self.state % self.vocab.len() as u64) as usize]
    }

    pub fn sentence(&mut self, n: usize) -> String {
        (0..n).map(|_| self.word()).collect::<Vec<_>>().join(" ")
    }
}

/// A gateway serving on 127.0.0.1:0 until dropped.
pub struct TestGateway {
    pub addr: SocketAddr,
    shutdown: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<()>,
    /// The data directory when the config names none (audit log, fingerprint key).
    _data_dir: Option<tempfile::TempDir>,
}

impl TestGateway {
    /// Starts a gateway from config text (no environment overlay; `env` resolves `*_env` keys).
    /// Without `data_dir` in the config, a fresh temporary one is used.
    pub async fn start(config_toml: &str, env: &[(&str, &str)]) -> TestGateway {
        let owned: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let lookup = move |name: &str| owned.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let mut config = Config::from_parts(config_toml, "test.toml", &[], &lookup).expect("test config is valid");
        let data_dir = (!config_toml.contains("data_dir")).then(|| tempfile::tempdir().expect("temporary data dir"));
        if let Some(dir) = &data_dir {
            config.data_dir = dir.path().to_path_buf();
        }
        let state = AppState::build(config).await.expect("gateway state builds");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind gateway");
        let addr = listener.local_addr().expect("gateway address");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            let _ = gateway::server::serve(state, listener, async {
                let _ = rx.await;
            })
            .await;
        });
        TestGateway { addr, shutdown: tx, served, _data_dir: data_dir }
    }

    /// Shuts the gateway down gracefully and waits until it has stopped (its state, and
    /// with it the embedded store's last snapshot, written).
    pub async fn stop(self) {
        let _ = self.shutdown.send(());
        let _ = self.served.await;
    }

    /// Waits until `/readyz` answers 200 (every model loaded), panicking after `limit`.
    pub async fn wait_ready(&self, limit: std::time::Duration) {
        let deadline = std::time::Instant::now() + limit;
        while reqwest::get(self.url("/readyz")).await.map(|r| r.status().as_u16()).unwrap_or(0) != 200 {
            assert!(std::time::Instant::now() < deadline, "the gateway's models did not become ready in {limit:?}");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

/// The config used by most tests: two tenants and one upstream model `mock`.
pub fn upstream_config(base_url: &str, extra_model_keys: &str) -> String {
    format!(
        r#"
[[tenants]]
id = "acme"
api_keys = ["sk-acme-1"]
own_secrets = "block"
[[tenants]]
id = "globex"
api_keys = ["sk-globex-1"]
own_secrets = "block"
[[models]]
id = "mock"
backend = "upstream"
base_url = "{base_url}"
upstream_model = "mock-upstream"
api_key_env = "UPSTREAM_KEY"
{extra_model_keys}
"#
    )
}

/// Splits an SSE body into its `data:` payloads.
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n").filter_map(|frame| frame.strip_prefix("data: ").map(str::to_owned)).collect()
}

/// The Python interpreter with the `openai` SDK: `CROSSGUARD_PYTHON`, else the `.venv`
/// the test command creates.
pub fn python() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("CROSSGUARD_PYTHON") {
        return std::path::PathBuf::from(p);
    }
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python")
}

/// Runs `tests/python/<script>` with `args`; panics with its output unless it exits 0.
/// Returns its stdout.
pub async fn run_python(script: &str, args: &[&str]) -> String {
    let python = python();
    assert!(
        python.exists(),
        "{} not found: run scripts/test.sh (it creates .venv with the openai SDK) or set CROSSGUARD_PYTHON",
        python.display()
    );
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python").join(script);
    let out = tokio::process::Command::new(&python).arg(&path).args(args).output().await.expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script} failed:\n{stdout}\n{stderr}");
    stdout
}

/// A configuration with one tenant (`acme`, key `sk-acme-1`) and no `[[models]]`: the
/// default model on the engine.
pub const DEFAULT_ENGINE_CONFIG: &str = r#"
[[tenants]]
id = "acme"
api_keys = ["sk-acme-1"]
"#;
