#!/usr/bin/env python3
"""Engine serving under concurrent load: crossguard's engine (continuous batching) against
llama.cpp's server (llama-cpp-python `llama_cpp.server`), same GGUF, same threads, same
prompts, same greedy settings, back to back in one run.

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install llama-cpp-python==0.3.36 fastapi uvicorn sse-starlette \
        starlette-context pydantic-settings
    cargo build --release -p crossguard
    /tmp/refvenv/bin/python scripts/bench/engine_serving.py --threads 2 --concurrency 1 4 16

For each server and concurrency C, C workers each send REQUESTS streamed chat completions
(temperature 0, max_tokens MAX_TOKENS) from a fixed list of prompts. Every content chunk of
the stream counts as one generated token (both servers send one token per chunk).
Reported per run: aggregate generated tokens/s over the wall time, time to first token and
inter-token latency (p50, p99, over every request and every gap). Only the standard library
is used on the client side, so the client costs the same against both servers.
"""

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

PROMPTS = [
    "Name three colours and say one thing about each.",
    "What is the capital of France? Answer in two sentences.",
    "Write a short poem about rain on a tin roof.",
    "Explain what a hash table is to a child.",
    "List five fruits that are red.",
    "Describe a lighthouse at night.",
    "Give two tips for learning to cook.",
    "Why is the sky blue? Keep it short.",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, path, deadline_s=300):
    end = time.time() + deadline_s
    while time.time() < end:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"server on port {port} not ready after {deadline_s} s")


def one_request(port, model, key, prompt, max_tokens):
    """Streams one completion; returns (ttft_s, [gaps_s], tokens)."""
    body = json.dumps({"model": model, "stream": True, "temperature": 0, "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": prompt}]})
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, headers)
    resp = c.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"status {resp.status}: {resp.read()[:200]!r}")
    times = []
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices", []):
            if choice.get("delta", {}).get("content"):
                times.append(time.perf_counter())
    c.close()
    if not times:
        return None, [], 0
    gaps = [b - a for a, b in zip(times, times[1:])]
    return times[0] - start, gaps, len(times)


def pct(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def run_level(port, model, key, concurrency, requests, max_tokens):
    ttfts, gaps, tokens, errors = [], [], [0], [0]
    lock = threading.Lock()

    def worker(w):
        for i in range(requests):
            prompt = PROMPTS[(w * requests + i) % len(PROMPTS)]
            try:
                ttft, g, n = one_request(port, model, key, prompt, max_tokens)
            except Exception as e:  # counted, reported
                with lock:
                    errors[0] += 1
                print(f"  error: {e}", file=sys.stderr)
                continue
            with lock:
                if ttft is not None:
                    ttfts.append(ttft)
                gaps.extend(g)
                tokens[0] += n

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {
        "concurrency": concurrency, "requests": concurrency * requests, "tokens": tokens[0], "wall_s": round(wall, 2),
        "tok_per_s": round(tokens[0] / wall, 1),
        "ttft_p50_ms": round(pct(ttfts, 50) * 1000, 1), "ttft_p99_ms": round(pct(ttfts, 99) * 1000, 1),
        "itl_p50_ms": round(pct(gaps, 50) * 1000, 1), "itl_p99_ms": round(pct(gaps, 99) * 1000, 1),
        "errors": errors[0], "loadavg": os.getloadavg()[0],
    }


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(root, "target"))
    cache = os.environ.get("CROSSGUARD_CACHE_DIR", os.path.expanduser("~/.cache/crossguard"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(cache, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--crossguard", default=os.path.join(target, "release", "crossguard"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests", type=int, default=2, help="requests per worker")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--only", choices=["crossguard", "llamacpp"])
    ap.add_argument("--step-tokens", type=int, default=512, help="crossguard's [[models]] step_tokens")
    args = ap.parse_args()
    if not os.path.exists(args.model):
        models = os.path.join(cache, "models")
        found = [f for f in os.listdir(models) if f.endswith(".gguf")] if os.path.isdir(models) else []
        if not found:
            raise SystemExit(f"no model at {args.model}: run the gateway once (it fetches it)")
        args.model = os.path.join(models, found[0])

    results = []
    work = tempfile.mkdtemp()
    servers = []
    if args.only != "llamacpp":
        port = free_port()
        cfg = os.path.join(work, "crossguard.toml")
        with open(cfg, "w") as f:
            f.write(f'listen = "127.0.0.1:{port}"\ndata_dir = "{work}/data"\n[[tenants]]\nid = "bench"\napi_keys = ["sk-bench-1"]\n'
                    f'[[models]]\nid = "m"\nbackend = "engine"\npath = "{args.model}"\nthreads = {args.threads}\n'
                    f'context_tokens = 2048\nmax_batch = 64\nmax_queued = 256\nstep_tokens = {args.step_tokens}\n')
        servers.append(("crossguard", [args.crossguard, "serve", "--config", cfg], port, "/readyz", "m", "sk-bench-1",
                        dict(os.environ, CROSSGUARD_LOG="warn")))
    if args.only != "crossguard":
        port = free_port()
        servers.append(("llama.cpp", [sys.executable, "-m", "llama_cpp.server", "--model", args.model, "--n_threads", str(args.threads),
                                      "--n_ctx", "2048", "--port", str(port), "--host", "127.0.0.1",
                                      # its default cancels the running request when a new one arrives
                                      "--interrupt_requests", "False"],
                        port, "/v1/models", "m", "unused", dict(os.environ)))
    for name, cmd, port, ready, model, key, env in servers:
        log = open(os.path.join(work, f"{name}.log"), "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_ready(port, ready)
            one_request(port, model, key, PROMPTS[0], 8)  # warm-up
            for c in args.concurrency:
                r = run_level(port, model, key, c, args.requests, args.max_tokens)
                r["server"] = name
                print(json.dumps(r), flush=True)
                results.append(r)
        finally:
            proc.terminate()
            proc.wait(timeout=30)

    print("\n| server | concurrency | requests | tokens | aggregate tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | errors | load |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in results:
        print(f"| {r['server']} | {r['concurrency']} | {r['requests']} | {r['tokens']} | {r['tok_per_s']} | {r['ttft_p50_ms']} | "
              f"{r['ttft_p99_ms']} | {r['itl_p50_ms']} | {r['itl_p99_ms']} | {r['errors']} | {r['loadavg']:.1f} |")
    by = {(r["server"], r["concurrency"]): r["tok_per_s"] for r in results}
    for c in args.concurrency:
        if ("crossguard", c) in by and ("llama.cpp", c) in by and by[("llama.cpp", c)] > 0:
            print(f"concurrency {c}: crossguard / llama.cpp aggregate = {by[('crossguard', c)] / by[('llama.cpp', c)]:.2f}x")


if __name__ == "__main__":
    main()
