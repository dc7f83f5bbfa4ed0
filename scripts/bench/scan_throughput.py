#!/usr/bin/env python3
"""Whole-process `crossguard scan` throughput, in MB per CPU-second, for rule folders side
by side.

    python3 scripts/bench/scan_throughput.py --crossguard target/release/crossguard \\
        --rules base=/tmp/rules-base --rules head=rules [--simd avx2] [--rounds 5] \\
        (--text FILE | --jsonl FILE)...

`--crossguard` may be given several times as NAME=BINARY (two builds side by side); every
binary runs with every rule folder, labelled BINARY-NAME/RULES-NAME. `--rules NAME=builtin`
runs the binary's built-in rules (as a user does: no samples checked at load, each regex
compiled when a text first calls for its rule).

Each round runs every rule folder once on every input, in turn, so a noisy host's drift
falls on all of them alike; printed per rules and input: every run's CPU seconds (user +
system of the child, start-up and rule loading included), the median, and MB per CPU-s at
the median. `--simd avx2` sets CROSSGUARD_FIREWALL_SIMD so a host with AVX-512 runs the
keyword loops an AVX2-only host runs. Inputs are read as files: `--text` with `scan FILE`,
`--jsonl` with `scan --input-jsonl FILE` (records `{"id", "text"}`; its MB are those of the
texts, not of the JSON around them).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess


# A `--rules` folder that means the binary's built-in rules (no `--rules` flag).
BUILTIN = "builtin"


def cpu_seconds(cmd, env):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    if p.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.decode(errors='replace')[-500:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def text_mb(path):
    """MB of the records' texts (UTF-8), not of the JSON around them."""
    with open(path, encoding="utf-8") as f:
        return sum(len(json.loads(line)["text"].encode()) for line in f if line.strip()) / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--crossguard", action="append", required=True, help="BINARY or NAME=BINARY; repeatable")
    ap.add_argument("--rules", action="append", required=True,
                    help=f"NAME=FOLDER, or NAME={BUILTIN} for the rules built into the binary; repeatable")
    ap.add_argument("--text", action="append", default=[], help="a text file to scan whole; repeatable")
    ap.add_argument("--jsonl", action="append", default=[], help="a JSONL corpus; repeatable")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--simd", choices=["avx2", "portable"])
    a = ap.parse_args()
    env = dict(os.environ)
    if a.simd:
        env["CROSSGUARD_FIREWALL_SIMD"] = a.simd
    rules = [r.split("=", 1) for r in a.rules]
    binaries = [b.split("=", 1) if "=" in b else ["", b] for b in a.crossguard]
    configs = [(f"{bn}/{rn}" if bn else rn, binary, folder) for bn, binary in binaries for rn, folder in rules]
    inputs = [(f, [f]) for f in a.text] + [(f, ["--input-jsonl", f]) for f in a.jsonl]
    if not inputs:
        raise SystemExit("give at least one --text or --jsonl input")
    runs = {(name, f): [] for name, _, _ in configs for f, _ in inputs}
    for _ in range(a.rounds):
        for f, args in inputs:
            for name, binary, folder in configs:
                rules = [] if folder == BUILTIN else ["--rules", folder]
                runs[(name, f)].append(cpu_seconds([binary, "scan", *rules, *args], env))
    for f, args in inputs:
        mb = text_mb(f) if args[0] == "--input-jsonl" else os.path.getsize(f) / 1e6
        for name, _, _ in configs:
            xs = runs[(name, f)]
            med = statistics.median(xs)
            print(f"{name:>10} {os.path.basename(f)} ({mb:.1f} MB): CPU-s {', '.join(f'{x:.2f}' for x in xs)}; "
                  f"median {med:.2f}, {mb / med:.1f} MB per CPU-s")


if __name__ == "__main__":
    main()
