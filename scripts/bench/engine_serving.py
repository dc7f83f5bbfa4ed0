#!/usr/bin/env python3
"""Engine serving under concurrent load: crossguard's engine (continuous batching) against
llama.cpp's server (llama-cpp-python `llama_cpp.server`), same GGUF, same threads, same
prompts, same greedy settings, back to back in one run.

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install llama-cpp-python==0.3.36 fastapi uvicorn sse-starlette \
        starlette-context pydantic-settings
    cargo build --release -p crossguard
    /tmp/refvenv/bin/python scripts/bench/engine_serving.py --threads 2 --concurrency 1 4 16 64 \
        --rounds 3 --defences-off-too --prefix-tokens 600

For each server and concurrency C, C workers each send REQUESTS streamed chat completions
(temperature 0, max_tokens MAX_TOKENS) from a fixed list of prompts. Every content chunk of
the stream counts as one generated token (both servers send one token per chunk).
Reported per run: aggregate generated tokens/s over the wall time, time to first token and
inter-token latency (p50, p99, over every request and every gap between content chunks, as
a client sees it: crossguard's firewall holds a word in progress back until it is complete,
so a held token arrives with the next one, one step later), and for crossguard the engine's
own decode-step durations (from the step histogram on /metrics, interpolated within its
buckets). Tokens are the usage counts where the server reports them. Only the standard library
is used on the client side, so the client costs the same against both servers.

All servers start first and stay up; each round runs every level on every server in turn,
so a burst of load on this shared machine hits them alike; the summary gives each figure's
median over the rounds. `--defences-off-too` adds a crossguard server with the KV cache's
zero-fill, owner check and bounds check switched off (`[models.fault]`), to price them.
`--prefix-tokens N` adds the prefix-cache run: TENANTS tenants each send PREFIX_REQUESTS
requests, one at a time, that share a ~N-token system prompt of their own and differ in the
question; the first request of each tenant is cold, the rest can reuse its cached prefix.
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


def wait_ready(port, path, proc, log_path, deadline_s=300):
    end = time.time() + deadline_s
    while time.time() < end:
        if proc.poll() is not None:
            with open(log_path) as f:
                raise SystemExit(f"server on port {port} exited with {proc.returncode}:\n{f.read()[-2000:]}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"server on port {port} not ready after {deadline_s} s")


def one_request(port, model, key, prompt, max_tokens, system=None):
    """Streams one completion; returns (ttft_s, [gaps_s], tokens)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    body = json.dumps({"model": model, "stream": True, "temperature": 0, "max_tokens": max_tokens, "messages": messages,
                       "stream_options": {"include_usage": True}})
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, headers)
    resp = c.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"status {resp.status}: {resp.read()[:200]!r}")
    times, usage_tokens = [], None
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices", []):
            if choice.get("delta", {}).get("content"):
                times.append(time.perf_counter())
        if chunk.get("usage"):
            usage_tokens = chunk["usage"].get("completion_tokens")
    c.close()
    if not times:
        return None, [], 0
    gaps = [b - a for a, b in zip(times, times[1:])]
    # A chunk may carry several tokens (crossguard's firewall releases a held-back word
    # with the next token), so the usage count is the token count where a server gives it.
    return times[0] - start, gaps, usage_tokens or len(times)


def step_histogram(port):
    """crossguard's own decode-step durations (`le` bound -> cumulative count) from /metrics."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    buckets = {}
    for line in text.splitlines():
        if line.startswith("crossguard_engine_step_duration_seconds_bucket{") and 'kind="decode"' in line:
            le = line.split('le="')[1].split('"')[0]
            buckets[float("inf") if le == "+Inf" else float(le)] = int(line.rsplit(" ", 1)[1])
    return buckets


def step_quantile(before, after, q):
    """The q-th percentile of the decode steps between two scrapes, interpolated in its bucket."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0) for b in bounds]
    if not counts or counts[-1] == 0:
        return float("nan")
    rank, lower, below = q / 100 * counts[-1], 0.0, 0
    for bound, cum in zip(bounds, counts):
        if cum >= rank:
            if bound == float("inf"):
                return float("inf")
            return lower + (bound - lower) * (rank - below) / max(cum - below, 1)
        lower, below = bound, cum
    return float("inf")


def pct(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def run_level(port, model, key, concurrency, requests, max_tokens, engine_steps=False):
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

    steps_before = step_histogram(port) if engine_steps else None
    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(w,)) for w in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    steps = {}
    if engine_steps:
        after = step_histogram(port)
        steps = {"step_p50_ms": round(step_quantile(steps_before, after, 50) * 1000, 1),
                 "step_p99_ms": round(step_quantile(steps_before, after, 99) * 1000, 1)}
    return {**steps,
        "concurrency": concurrency, "requests": concurrency * requests, "tokens": tokens[0], "wall_s": round(wall, 2),
        "tok_per_s": round(tokens[0] / wall, 1),
        "ttft_p50_ms": round(pct(ttfts, 50) * 1000, 1), "ttft_p99_ms": round(pct(ttfts, 99) * 1000, 1),
        "itl_p50_ms": round(pct(gaps, 50) * 1000, 1), "itl_p99_ms": round(pct(gaps, 99) * 1000, 1),
        "errors": errors[0], "loadavg": os.getloadavg()[0],
    }


SUBJECTS = ["invoices", "shipping", "refunds", "passwords", "warranty", "accounts", "holidays", "pricing"]


def long_system_prompt(tenant, approx_tokens, edition):
    """A tenant's own policy text of about `approx_tokens` tokens (~1.3 tokens per word);
    each `edition` is new text, so no cache has seen it."""
    words, i = f"Policy edition {edition}.".split(), 0
    while len(words) * 1.3 < approx_tokens:
        subject = SUBJECTS[(tenant * 3 + i) % len(SUBJECTS)]
        words += (f"Rule {i + 1} of company {tenant}: questions about {subject} are answered politely, "
                  f"in at most {2 + i % 5} sentences, citing section {tenant}.{i}.").split()
        i += 1
    return " ".join(words)


def run_prefix(port, model, keys, prefix_tokens, per_tenant, edition):
    """TTFT of each tenant's first request (cold) against its later ones (warm prefix)."""
    cold, warm = [], []
    for t, key in enumerate(keys):
        system = long_system_prompt(t, prefix_tokens, edition)
        for i in range(per_tenant):
            ttft, _, _ = one_request(port, model, key, PROMPTS[i % len(PROMPTS)], 4, system=system)
            (cold if i == 0 else warm).append(ttft)
    return {"prefix_tokens": prefix_tokens, "tenants": len(keys), "cold_ttft_p50_ms": round(pct(cold, 50) * 1000, 1),
            "warm_ttft_p50_ms": round(pct(warm, 50) * 1000, 1), "loadavg": os.getloadavg()[0]}


def median_of(rows, key):
    return round(statistics.median(r[key] for r in rows), 1)


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
    ap.add_argument("--itl-target-ms", type=int, help="crossguard's [[models]] itl_target_ms (default: its own)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--defences-off-too", action="store_true", help="also run crossguard with zero-fill and KV checks off")
    ap.add_argument("--prefix-tokens", type=int, default=0, help="run the prefix-cache TTFT measurement with this long a system prompt")
    ap.add_argument("--tenants", type=int, default=4)
    ap.add_argument("--prefix-requests", type=int, default=4, help="requests per tenant in the prefix run")
    args = ap.parse_args()
    if not os.path.exists(args.model):
        models = os.path.join(cache, "models")
        found = [f for f in os.listdir(models) if f.endswith(".gguf")] if os.path.isdir(models) else []
        if not found:
            raise SystemExit(f"no model at {args.model}: run the gateway once (it fetches it)")
        args.model = os.path.join(models, found[0])

    work = tempfile.mkdtemp()
    keys = [f"sk-bench-{t}" for t in range(max(1, args.tenants))]
    servers = []  # (name, cmd, port, ready path, model id, api keys, env)
    variants = [] if args.only == "llamacpp" else [("crossguard", "")]
    if args.defences_off_too and args.only != "llamacpp":
        variants.append(("crossguard, defences off", "[models.fault]\nskip_zero_fill = true\nskip_owner_check = true\nskip_bounds_check = true\n"))
    for name, fault in variants:
        port = free_port()
        cfg = os.path.join(work, f"crossguard-{port}.toml")
        tenants = "".join(f'[[tenants]]\nid = "bench{t}"\napi_keys = ["{k}"]\n' for t, k in enumerate(keys))
        itl = f"itl_target_ms = {args.itl_target_ms}\n" if args.itl_target_ms is not None else ""
        with open(cfg, "w") as f:
            # [limits]: a load test must not be throttled by the per-tenant default (64 in flight).
            f.write(f'listen = "127.0.0.1:{port}"\ndata_dir = "{work}/data-{port}"\n'
                    f'[limits]\nmax_concurrent_requests = 100000\n{tenants}'
                    f'[[models]]\nid = "m"\nbackend = "engine"\npath = "{args.model}"\nthreads = {args.threads}\n'
                    f'context_tokens = 2048\nmax_batch = 64\nmax_queued = 256\nstep_tokens = {args.step_tokens}\n{itl}{fault}')
        # [models.fault] loads only with CROSSGUARD_ENABLE_FAULTS=1 (README, "Configuration").
        env = dict(os.environ, CROSSGUARD_LOG="warn", **({"CROSSGUARD_ENABLE_FAULTS": "1"} if fault else {}))
        servers.append((name, [args.crossguard, "serve", "--config", cfg], port, "/readyz", "m", keys, env))
    if args.only != "crossguard":
        port = free_port()
        servers.append(("llama.cpp", [sys.executable, "-m", "llama_cpp.server", "--model", args.model, "--n_threads", str(args.threads),
                                      "--n_ctx", "2048", "--port", str(port), "--host", "127.0.0.1",
                                      # its default cancels the running request when a new one arrives
                                      "--interrupt_requests", "False"],
                        port, "/v1/models", "m", ["unused"], dict(os.environ)))
    procs = []
    results, prefix_results = [], []
    try:
        for name, cmd, port, ready, model, server_keys, env in servers:
            log_path = os.path.join(work, f"{port}.log")
            procs.append(subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT, env=env))
            wait_ready(port, ready, procs[-1], log_path)
            one_request(port, model, server_keys[0], PROMPTS[0], 8)  # warm-up
        for round_ in range(args.rounds):
            for c in args.concurrency:
                for name, _, port, _, model, server_keys, _ in servers:
                    r = run_level(port, model, server_keys[0], c, args.requests, args.max_tokens, engine_steps=name.startswith("crossguard"))
                    r.update(server=name, round=round_)
                    print(json.dumps(r), flush=True)
                    results.append(r)
            if args.prefix_tokens:
                for name, _, port, _, model, server_keys, _ in servers:
                    # llama.cpp has no tenants: the same key stands for each
                    tenant_keys = server_keys if len(server_keys) > 1 else server_keys * len(keys)
                    r = run_prefix(port, model, tenant_keys, args.prefix_tokens, args.prefix_requests, round_)
                    r.update(server=name, round=round_)
                    print(json.dumps(r), flush=True)
                    prefix_results.append(r)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)

    names = [s[0] for s in servers]
    print(f"\nmedians over {args.rounds} round(s)")
    print("\n| server | concurrency | requests | tokens | aggregate tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | decode step p50 / p99 ms | errors | load |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    by = {}
    for c in args.concurrency:
        for name in names:
            rows = [r for r in results if r["server"] == name and r["concurrency"] == c]
            m = {k: median_of(rows, k) for k in ["tokens", "tok_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "loadavg"]}
            by[(name, c)] = m["tok_per_s"]
            steps = f"{median_of(rows, 'step_p50_ms')} / {median_of(rows, 'step_p99_ms')}" if "step_p99_ms" in rows[0] else "—"
            print(f"| {name} | {c} | {rows[0]['requests']} | {m['tokens']:.0f} | {m['tok_per_s']} | {m['ttft_p50_ms']} | {m['ttft_p99_ms']} | "
                  f"{m['itl_p50_ms']} | {m['itl_p99_ms']} | {steps} | {sum(r['errors'] for r in rows)} | {m['loadavg']:.1f} |")
    for c in args.concurrency:
        if ("crossguard", c) in by and ("llama.cpp", c) in by and by[("llama.cpp", c)] > 0:
            print(f"concurrency {c}: crossguard / llama.cpp aggregate = {by[('crossguard', c)] / by[('llama.cpp', c)]:.2f}x")
        off = ("crossguard, defences off", c)
        if off in by and ("crossguard", c) in by and by[off] > 0:
            ratios = []
            for round_ in range(args.rounds):
                on = [r["tok_per_s"] for r in results if r["server"] == "crossguard" and r["concurrency"] == c and r["round"] == round_]
                no = [r["tok_per_s"] for r in results if r["server"] == off[0] and r["concurrency"] == c and r["round"] == round_]
                ratios.append(on[0] / no[0])
            print(f"concurrency {c}: throughput with defences / without = {statistics.median(ratios):.3f} "
                  f"(per round: {', '.join(f'{x:.3f}' for x in ratios)})")
    if prefix_results:
        print("\n| server | prefix tokens | tenants | cold TTFT p50 ms | warm TTFT p50 ms | gain | load |")
        print("|---|--:|--:|--:|--:|--:|--:|")
        for name in names:
            rows = [r for r in prefix_results if r["server"] == name]
            cold, warm = median_of(rows, "cold_ttft_p50_ms"), median_of(rows, "warm_ttft_p50_ms")
            print(f"| {name} | ~{args.prefix_tokens} | {rows[0]['tenants']} | {cold} | {warm} | {cold / warm:.1f}x | {median_of(rows, 'loadavg')} |")

if __name__ == "__main__":
    main()
