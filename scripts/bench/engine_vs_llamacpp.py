#!/usr/bin/env python3
"""crossguard's engine next to llama.cpp (llama-cpp-python) on the same GGUF and threads.

For each round and thread count, runs both engines back to back in separate processes
(so peak RSS is each engine's own), REPEATS measurements each, and at the end prints the
medians over all rounds and the ratios (decode also as the median and range of the
rounds' own ratios): prompt processing tok/s (512-token prompt), decode
tok/s (128 tokens, greedy, end tokens suppressed), time to first token on that prompt, peak
RSS; decode also per CPU-second of the process (what time-slicing by other load does not
halve). Rounds interleave the two engines so that a burst of load on a shared machine hits
both alike; the load average is printed with every round.

    cargo build --release -p crossguard-engine --example bench_engine
    /tmp/refvenv/bin/python scripts/bench/engine_vs_llamacpp.py [--threads 1 2] [--rounds 3] [--repeats 2]

The engine's binary is looked up under $CARGO_TARGET_DIR (else `target/`); `--ours PATH`
names another. `--busy-core` runs a CPU-bound process (one busy loop) through every
measurement, to see how each engine's threads cope with a core that is not theirs alone.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.expanduser("~/.cache/crossguard/models/SmolLM2-135M-Instruct.Q4_1.gguf")
OURS = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"), "release", "examples", "bench_engine")
TEXT = "The quick brown fox jumps over the lazy dog while the engine counts tokens. "


def last_logits(llm):
    """The logits of the last evaluated token (llama-cpp-python keeps `scores` only
    with logits_all, so read the context's output row directly)."""
    import numpy as np
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).astype(np.float64)


def llama_child(model: str, threads: int, prompt_tokens: int, decode_tokens: int, repeats: int) -> None:
    """Runs inside a child process: measures llama.cpp and prints JSON lines."""
    import resource

    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(model_path=model, n_ctx=2048, n_batch=512, n_ubatch=512, n_threads=threads,
                          n_threads_batch=threads, logits_all=False, verbose=False)
    prompt = llm.tokenize((TEXT * (prompt_tokens // 8 + 1)).encode(), add_bos=False, special=False)[:prompt_tokens]
    eos = llm.token_eos()
    for _ in range(repeats):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        logits = last_logits(llm)
        logits[eos] = -1e9
        tok = int(np.argmax(logits))
        ttft = time.perf_counter() - t0
        t1, c1 = time.perf_counter(), time.process_time()
        for _ in range(decode_tokens):
            llm.eval([tok])
            logits = last_logits(llm)
            logits[eos] = -1e9
            tok = int(np.argmax(logits))
        decode, decode_cpu = time.perf_counter() - t1, time.process_time() - c1
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        print(json.dumps({"engine": "llama.cpp", "threads": threads, "prompt_tokens": len(prompt),
                          "prefill_tok_s": len(prompt) / ttft, "decode_tok_s": decode_tokens / decode,
                          "decode_cpu_tok_s": decode_tokens / decode_cpu,
                          "ttft_ms": ttft * 1000.0, "peak_rss_mib": rss}), flush=True)


def run(cmd) -> list:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--ours", default=OURS, help="the bench_engine binary")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--busy-core", action="store_true", help="a busy loop competes for one core throughout")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        llama_child(a.model, a.threads[0], a.prompt_tokens, a.decode_tokens, a.repeats)
        return
    results = {(t, n): [] for t in a.threads for n in ("crossguard", "llama.cpp")}
    results["rounds"] = []
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if a.busy_core else None
    try:
        measure(a, results)
    finally:
        if busy:
            busy.kill()
    report(a, results)


def measure(a, results) -> None:
    """Alternates the two engines, round after round, at each thread count."""
    for r in range(a.rounds):
        for threads in a.threads:
            load = os.getloadavg()[0]
            ours = run([a.ours, a.model, str(threads), str(a.prompt_tokens), str(a.decode_tokens), str(a.repeats)])
            theirs = run([sys.executable, __file__, "--child", "--model", a.model, "--threads", str(threads),
                          "--repeats", str(a.repeats), "--prompt-tokens", str(a.prompt_tokens),
                          "--decode-tokens", str(a.decode_tokens)])
            results[(threads, "crossguard")] += ours
            results[(threads, "llama.cpp")] += theirs
            decode = lambda res: statistics.median(x["decode_tok_s"] for x in res)
            results["rounds"].append((threads, decode(ours) / decode(theirs)))
            brief = lambda res: " ".join(f"{x['prefill_tok_s']:.0f}/{x['decode_tok_s']:.1f}" for x in res)
            print(f"round {r + 1} threads={threads} load={load:.2f}: prefill/decode tok/s "
                  f"crossguard {brief(ours)} | llama.cpp {brief(theirs)}", flush=True)


def report(a, results) -> None:
    """Medians per engine and thread count as a markdown table, then the ratios."""
    rows = []
    rounds = results.pop("rounds")
    for (threads, name), res in results.items():
        med = {k: statistics.median(x[k] for x in res) for k in ("prefill_tok_s", "decode_tok_s", "decode_cpu_tok_s", "ttft_ms")}
        med["peak_rss_mib"] = max(x["peak_rss_mib"] for x in res)
        rows.append((threads, name, med))
    print(f"| threads | engine | prefill tok/s ({a.prompt_tokens}) | decode tok/s ({a.decode_tokens}) | decode tok per CPU-s | TTFT ms | peak RSS MiB |")
    print("|---|---|--:|--:|--:|--:|--:|")
    for threads, name, m in rows:
        print(f"| {threads} | {name} | {m['prefill_tok_s']:.0f} | {m['decode_tok_s']:.1f} | {m['decode_cpu_tok_s']:.1f} | {m['ttft_ms']:.0f} | {m['peak_rss_mib']:.0f} |")
    for threads in a.threads:
        ours = next(m for t, n, m in rows if t == threads and n == "crossguard")
        theirs = next(m for t, n, m in rows if t == threads and n == "llama.cpp")
        print(f"threads={threads}: decode x{ours['decode_tok_s'] / theirs['decode_tok_s']:.2f} "
              f"(per CPU-second x{ours['decode_cpu_tok_s'] / theirs['decode_cpu_tok_s']:.2f}), "
              f"prefill x{ours['prefill_tok_s'] / theirs['prefill_tok_s']:.2f}, "
              f"TTFT x{theirs['ttft_ms'] / ours['ttft_ms']:.2f} faster")
        # Both engines of a round ran seconds apart, so a round's ratio is less exposed to
        # the host's drift than the ratio of medians taken over all rounds.
        per_round = sorted(r for t, r in rounds if t == threads)
        print(f"threads={threads}: decode ratio per round: median x{statistics.median(per_round):.2f}, "
              f"range x{per_round[0]:.2f}-x{per_round[-1]:.2f} over {len(per_round)} rounds")


if __name__ == "__main__":
    main()
