//! Helpers for the tests that run the `crossguard` binary: config files, and a served
//! gateway whose JSON log lines are collected.

#![allow(dead_code)] // each test file uses its own part of these helpers

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_crossguard");

pub fn write_config(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().expect("temp file");
    std::io::Write::write_all(&mut f, text.as_bytes()).expect("write config");
    f
}

/// `crossguard serve` with JSON logs at debug level, in a clean environment plus `env`;
/// killed when dropped.
pub struct Served {
    child: Child,
    pub addr: SocketAddr,
    lines: Arc<Mutex<Vec<String>>>,
    _config: tempfile::NamedTempFile,
}

impl Served {
    pub fn start(config: &str, env: &[(&str, &str)]) -> Served {
        let file = write_config(config);
        let mut child = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(file.path())
            .env_clear()
            .env("CROSSGUARD_LOG_FORMAT", "json")
            .env("CROSSGUARD_LOG", "debug")
            .envs(env.iter().copied())
            .stderr(Stdio::piped())
            .spawn()
            .expect("binary starts");
        let stderr = child.stderr.take().expect("stderr piped");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().expect("log lines").push(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr = loop {
            let found = lines.lock().expect("log lines").iter().find_map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).ok()?;
                (v["fields"]["message"] == "listening")
                    .then(|| v["fields"]["addr"].as_str()?.parse::<SocketAddr>().ok())?
            });
            if let Some(addr) = found {
                break addr;
            }
            let exited = child.try_wait().expect("wait");
            assert!(exited.is_none(), "the gateway exited with {exited:?}: {:?}", lines.lock().expect("log lines"));
            assert!(Instant::now() < deadline, "the gateway did not log its address");
            std::thread::sleep(Duration::from_millis(20));
        };
        Served { child, addr, lines, _config: file }
    }

    /// `http://127.0.0.1:PORT{path}` (a wildcard listen address is reached on loopback).
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.addr.port())
    }

    /// Stops the gateway and returns every line it logged.
    pub fn stop(mut self) -> Vec<String> {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().expect("wait").is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // The reader thread ends with the pipe; give it a moment to take the last lines.
        std::thread::sleep(Duration::from_millis(200));
        self.lines.lock().expect("log lines").clone()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
