//! A redis-server of the test's own, on a port of its own, that a test may stop and
//! restart (the shared Redis on 6379 must never be stopped: other tests use it).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A redis-server with an append-only file (fsync always), so a restart keeps its data.
pub struct OwnRedis {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl OwnRedis {
    /// Starts redis-server on `port` with its data in `dir`; returns once it answers.
    pub fn start(port: u16, dir: tempfile::TempDir) -> OwnRedis {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("redis-server must be installed: {e}"));
        let mut own = OwnRedis { port, dir, child: Some(child) };
        own.wait_until(true);
        own
    }

    fn ping(&self) -> bool {
        Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "ping"])
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"PONG"))
    }

    fn wait_until(&mut self, up: bool) {
        for _ in 0..500 {
            if self.ping() == up {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis on port {} did not come {}", self.port, if up { "up" } else { "down" });
    }

    /// Shuts the server down; returns its data directory, for a restart.
    pub fn stop(mut self) -> tempfile::TempDir {
        let _ = Command::new("redis-cli").args(["-p", &self.port.to_string(), "shutdown", "nosave"]).output();
        if let Some(mut c) = self.child.take() {
            let _ = c.wait();
        }
        self.wait_until(false);
        std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temporary dir"))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A TCP port free right now on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}
