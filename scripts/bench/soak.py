#!/usr/bin/env python3
"""Soak and faults: the gateway under steady mixed load for a long time, with the Redis
store and the firewall on, while Redis is restarted and the gateway is killed.

    scripts/bench/soak.py                      # 30 min at 500 req/s (build first)
    scripts/bench/soak.py --minutes 5 --skip-build

What runs (all on loopback, in a scratch folder):
- a private `redis-server` on its own port, with an append-only file (`appendfsync
  always`), so a restart keeps what it acknowledged;
- the fast mock upstream (`tests/examples/mock_upstream.rs`), every `--leak-every`th answer
  quoting a fresh GitHub token that the gateway's rules block;
- the gateway (release build), `[store] kind = "redis"`, the default rules;
- per window of `--window-s` seconds, two open-loop load generators at `--rate`/2 each,
  one streaming and one not; each appends the audit id of every blocked answer it saw
  (`x-crossguard-audit-id` + `content_filter` in the body) to a file.

Faults: at a third of the run Redis is stopped (SIGTERM) for `--redis-down-s` seconds and
started again on the same files; at two thirds the gateway is killed with SIGKILL and
started again on the same data folder (its audit and fingerprint spools).

Then, once the gateway says nothing waits for Redis (`/admin/api/health`), every audit
record is listed through the admin API and compared with the ids clients saw:
- lost: a blocked answer a client saw whose record is not in the store;
- duplicated: an id listed more than once;
- extra: records no client saw (an answer blocked while its client was cut off by the kill).
Gateway RSS is sampled every 5 s. One JSON summary goes to stdout, a Markdown table to
stderr and to `$OUT_DIR/soak.md`.

The soak passes (exit 0) when no record is lost or duplicated, nothing waits in a spool at
the end, and every window without a fault had no errors.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "soak-admin-token-0123456789"
API_KEY = "sk-soak-1"
FINGERPRINT_KEY = "00112233445566778899aabbccddeeff"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url: str, token: str | None = None, timeout: float = 10.0):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_until(what: str, probe, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if probe():
                return
        except (OSError, urllib.error.URLError, ValueError):
            pass
        time.sleep(0.1)
    raise SystemExit(f"soak: {what} did not happen within {timeout_s:.0f} s")


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path):
        self.args = args
        self.work = work
        self.bin = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"
        self.redis_port, self.mock_port, self.gw_port = free_port(), free_port(), free_port()
        self.procs: list[subprocess.Popen] = []
        self.redis: subprocess.Popen | None = None
        self.gateway: subprocess.Popen | None = None
        self.events: list[str] = []
        self.lock = threading.Lock()

    # ------------------------------------------------------------ processes

    def spawn(self, argv: list[str], log: str, env: dict | None = None) -> subprocess.Popen:
        out = open(self.work / log, "ab")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.procs.append(p)
        return p

    def start_redis(self) -> None:
        (self.work / "redis").mkdir(exist_ok=True)
        self.redis = self.spawn(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(self.redis_port), "--dir", str(self.work / "redis"),
             "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
            "redis.log",
        )
        wait_until("redis start", lambda: subprocess.run(
            ["redis-cli", "-p", str(self.redis_port), "ping"], capture_output=True, text=True).stdout.strip() == "PONG", 20)

    def stop_redis(self) -> None:
        assert self.redis is not None
        self.redis.send_signal(signal.SIGTERM)
        self.redis.wait(timeout=30)

    def write_config(self) -> Path:
        path = self.work / "crossguard.toml"
        path.write_text(f"""listen = "127.0.0.1:{self.gw_port}"
data_dir = "{self.work / 'data'}"
admin_token = "{ADMIN_TOKEN}"

[[tenants]]
id = "soak"
api_keys = ["{API_KEY}"]

[[models]]
id = "mock"
backend = "upstream"
base_url = "http://127.0.0.1:{self.mock_port}/v1"

[store]
kind = "redis"
url = "redis://127.0.0.1:{self.redis_port}"
key_prefix = "soak:"
replica_id = "soak-1"
audit_max_len = 2000000

# A soak measures the gateway, not its limits: a latency spike (the Redis restart) must
# not turn into 429s.
[limits]
max_concurrent_requests = 100000

[server]
max_connections = 100000
{self.args.extra_config}
""")
        return path

    def start_gateway(self) -> None:
        env = dict(os.environ, CROSSGUARD_LOG="warn", CROSSGUARD_FINGERPRINT_KEY=FINGERPRINT_KEY)
        self.gateway = self.spawn([str(self.bin / "crossguard"), "serve", "--config", str(self.config)], "gateway.log", env)
        # Ready, not just alive: a replica still loading the others' fingerprints refuses
        # completions, which would count as errors.
        wait_until("gateway ready", lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{self.gw_port}/readyz", timeout=2).status == 200, 60)

    def event(self, text: str) -> None:
        with self.lock:
            self.events.append(f"{time.strftime('%H:%M:%S')} {text}")
        print(f"soak: {text}", file=sys.stderr)

    # ------------------------------------------------------------ faults

    def restart_redis(self, after_s: float) -> None:
        time.sleep(after_s)
        self.event("redis stopped (SIGTERM)")
        self.stop_redis()
        time.sleep(self.args.redis_down_s)
        self.start_redis()
        self.event("redis started again")

    def kill_gateway(self, after_s: float) -> None:
        time.sleep(after_s)
        assert self.gateway is not None
        self.gateway.send_signal(signal.SIGKILL)
        self.gateway.wait()
        self.event("gateway killed (SIGKILL)")
        self.start_gateway()
        self.event("gateway serving again")

    # ------------------------------------------------------------ load

    def window(self, index: int, fault) -> dict:
        loads = []
        for stream in (False, True):
            argv = [str(self.bin / "examples" / "loadgen"), "run",
                    "--url", f"http://127.0.0.1:{self.gw_port}/v1/chat/completions", "--key", API_KEY, "--model", "mock",
                    "--rate", str(self.args.rate / 2), "--duration-s", str(self.args.window_s), "--warmup-s", "0",
                    "--blocked-ids", str(self.work / "blocked-ids.txt"), "--label", f"window={index}"]
            if stream:
                argv.append("--stream")
            loads.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        faulter = threading.Thread(target=fault, daemon=True) if fault else None
        if faulter:
            faulter.start()
        rss = []
        while any(p.poll() is None for p in loads):
            if self.gateway is not None and (m := rss_mib(self.gateway.pid)) is not None:
                rss.append(m)
            time.sleep(min(5.0, self.args.window_s / 4))
        if faulter:
            faulter.join()
        lines = []
        for p in loads:
            out, err = p.communicate()
            if p.returncode != 0:
                raise SystemExit(f"soak: loadgen failed: {err.strip()}")
            lines.append(json.loads(out))
        return {"window": index, "fault": fault is not None, "runs": lines, "rss_mib_max": max(rss, default=None)}

    def run(self) -> dict:
        self.start_redis()
        self.spawn([str(self.bin / "examples" / "mock_upstream"), "--port", str(self.mock_port), "--threads", "1",
                    "--leak-every", str(self.args.leak_every)], "mock.log")
        self.config = self.write_config()
        self.start_gateway()
        windows = max(3, round(self.args.minutes * 60 / self.args.window_s))
        redis_at, kill_at = windows // 3, (2 * windows) // 3
        results = []
        for i in range(windows):
            fault = None
            if i == redis_at:
                fault = lambda: self.restart_redis(self.args.window_s / 4)
            elif i == kill_at:
                fault = lambda: self.kill_gateway(self.args.window_s / 3)
            results.append(self.window(i, fault))
            r = results[-1]
            print(f"soak: window {i}: " + ", ".join(
                f"{'stream' if run['stream'] else 'plain'} {run['rps']} r/s err {run['errors']} p99 {run['latency_us']['p99'] if run['latency_us'] else '-'} us"
                for run in r["runs"]) + f", rss {r['rss_mib_max']:.0f} MiB", file=sys.stderr)
        return {"windows": results, "audit": self.check_audit(), "rss": rss_phases(results, kill_at)}

    # ------------------------------------------------------------ the check

    def check_audit(self) -> dict:
        base = f"http://127.0.0.1:{self.gw_port}"

        def drained() -> bool:
            store = http_json(f"{base}/admin/api/health", ADMIN_TOKEN)["store"]
            return not store["degraded"] and store["buffered_audit"] == 0 and store["buffered_fingerprints"] == 0

        wait_until("the spools draining", drained, 120)
        stored: list[str] = []
        cursor = None
        while True:
            url = f"{base}/admin/api/audit?limit=500" + (f"&cursor={cursor}" if cursor else "")
            page = http_json(url, ADMIN_TOKEN, timeout=60)
            stored += [r["id"] for r in page["records"]]
            cursor = page.get("next_cursor")
            if not cursor:
                break
        seen = [line.strip() for line in (self.work / "blocked-ids.txt").read_text().splitlines()]
        stored_set, seen_set = set(stored), set(seen)
        fp_len = subprocess.run(["redis-cli", "-p", str(self.redis_port), "XLEN", "soak:fp"], capture_output=True, text=True).stdout.strip()
        return {
            "blocked_seen_by_clients": len(seen),
            "blocked_without_id": seen.count(""),
            "records_stored": len(stored),
            "lost": sorted(seen_set - stored_set - {""}),
            "duplicated": len(stored) - len(stored_set),
            "extra": len(stored_set - seen_set),
            "fingerprint_stream_entries": int(fp_len) if fp_len.isdigit() else fp_len,
            "events": self.events,
        }

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def rss_phases(results: list[dict], kill_at: int, warmup: int = 2) -> list[dict]:
    """Gateway RSS per process lifetime, after `warmup` windows: first and last window's
    peak, and the spread (max / min - 1) of the peaks, which should stay within 10 %."""
    phases = []
    for lo, hi in ((warmup, kill_at), (kill_at + 1 + warmup, len(results))):
        peaks = [w["rss_mib_max"] for w in results[lo:hi] if w["rss_mib_max"]]
        if len(peaks) >= 2:
            phases.append({"windows": f"{lo}-{hi - 1}", "first_mib": round(peaks[0], 1), "last_mib": round(peaks[-1], 1),
                           "spread": round(max(peaks) / min(peaks) - 1, 3)})
    return phases


def table(summary: dict) -> str:
    rows = ["| window | fault | plain r/s | plain errors | plain p50 / p99 ms | stream r/s | stream errors | stream p50 / p99 ms | blocked | gateway RSS MiB |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    ms = lambda run: "–" if not run["latency_us"] else f"{run['latency_us']['p50'] / 1000:.2f} / {run['latency_us']['p99'] / 1000:.2f}"
    for w in summary["windows"]:
        plain, stream = sorted(w["runs"], key=lambda r: r["stream"])
        rows.append(f"| {w['window']} | {'yes' if w['fault'] else ''} | {plain['rps']} | {plain['errors']} | {ms(plain)} | "
                    f"{stream['rps']} | {stream['errors']} | {ms(stream)} | {plain['blocked'] + stream['blocked']} | "
                    f"{w['rss_mib_max']:.0f} |")
    return "\n".join(rows) + "\n"


def verdict(summary: dict) -> list[str]:
    a = summary["audit"]
    problems = []
    if a["lost"]:
        problems.append(f"{len(a['lost'])} blocked answers have no audit record: {a['lost'][:5]}")
    if a["duplicated"]:
        problems.append(f"{a['duplicated']} audit records are listed twice")
    if a["blocked_without_id"]:
        problems.append(f"{a['blocked_without_id']} blocked answers came without an audit id")
    for phase in summary["rss"]:
        if phase["spread"] > 0.10:
            problems.append(f"gateway RSS spread {phase['spread']:.0%} over windows {phase['windows']}")
    for w in summary["windows"]:
        errors = sum(r["errors"] + r["skipped"] for r in w["runs"])
        if errors and not w["fault"]:
            problems.append(f"window {w['window']} (no fault): {errors} errors")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--rate", type=float, default=500, help="requests per second, half streaming")
    ap.add_argument("--window-s", type=float, default=60)
    ap.add_argument("--leak-every", type=int, default=50)
    ap.add_argument("--redis-down-s", type=float, default=5)
    ap.add_argument("--extra-config", default="", help="TOML appended to the gateway's config")
    ap.add_argument("--skip-build", action="store_true")
    ap.add_argument("--out-dir", type=Path, default=Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "bench" / "soak")
    args = ap.parse_args()
    if not args.skip_build:
        subprocess.run(["cargo", "build", "--release", "--locked", "-p", "crossguard", "-p", "crossguard-e2e",
                        "--bin", "crossguard", "--example", "mock_upstream", "--example", "loadgen"], cwd=ROOT, check=True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="crossguard-soak-") as tmp:
        soak = Soak(args, Path(tmp))
        try:
            summary = soak.run()
        finally:
            soak.stop()
            for log in ("gateway.log", "redis.log"):
                if (Path(tmp) / log).exists():
                    (args.out_dir / log).write_bytes((Path(tmp) / log).read_bytes())
    summary["problems"] = verdict(summary)
    md = table(summary)
    (args.out_dir / "soak.md").write_text(md)
    (args.out_dir / "soak.json").write_text(json.dumps(summary, indent=1))
    print(md, file=sys.stderr)
    print(json.dumps({k: v for k, v in summary["audit"].items() if k != "lost"}
                     | {"lost": len(summary["audit"]["lost"]), "rss": summary["rss"], "problems": summary["problems"]}))
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
