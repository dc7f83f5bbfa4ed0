#!/usr/bin/env python3
"""Writes the markdown report of scripts/gpu-check.sh from what it measured: the GPU
tests' outcome, bench_gpu's JSON lines (ours) and transformers_baseline.py's (PyTorch).
Only numbers present in the inputs appear; a missing part is said to be missing.

usage: gpu_report.py DIR   (reads DIR/env.txt, DIR/tests-*.log, DIR/ours.jsonl,
                            DIR/baseline.jsonl; prints markdown)
"""
import glob
import json
import os
import re
import statistics
import sys


def lines(path):
    out = []
    if os.path.exists(path):
        for line in open(path, encoding="utf-8", errors="replace"):
            line = line.strip()
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return out


def test_summary(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    results = re.findall(r"test result: (\w+)\. (\d+) passed; (\d+) failed", text)
    failed = re.findall(r"^test (\S+) \.\.\. FAILED", text, re.M)
    passed = sum(int(p) for _, p, _ in results)
    nfailed = sum(int(f) for _, _, f in results)
    return passed, nfailed, failed, text


def main():
    d = sys.argv[1]
    out = ["# GPU check report", ""]
    if os.path.exists(f"{d}/env.txt"):
        out += ["```", open(f"{d}/env.txt").read().strip(), "```", ""]
    out += ["## Tests", "", "| binary | passed | failed |", "|---|---|---|"]
    failures = []
    for log in sorted(glob.glob(f"{d}/tests-*.log")):
        name = os.path.basename(log)[6:-4]
        passed, nfailed, failed, text = test_summary(log)
        if not re.search(r"test result:", text):
            out.append(f"| {name} | — | did not finish (see {os.path.basename(log)}) |")
            continue
        out.append(f"| {name} | {passed} | {nfailed} |")
        failures += [f"{name}: {t}" for t in failed]
    if failures:
        out += ["", "Failed: " + ", ".join(failures)]
    ours, base = lines(f"{d}/ours.jsonl"), lines(f"{d}/baseline.jsonl")
    errors = [r["reason"] for r in base + ours if r.get("kind") == "error"]
    if not ours and os.path.exists(f"{d}/ours.err"):
        tail = open(f"{d}/ours.err", encoding="utf-8", errors="replace").read().strip().splitlines()[-3:]
        errors.append("crossguard benchmark produced nothing: " + " / ".join(tail))
    out += ["", "## Speed", ""]
    if errors:
        out += [f"- {e}" for e in errors] + [""]
    base_device = next((r for r in base if r.get("kind") == "device"), None)
    if base_device:
        out += [f"Baseline: transformers {base_device.get('torch', '')} on {base_device.get('gpu', '?')}, "
                f"{base_device.get('dtype', '?')}, weights: {base_device.get('weights', '?')}.", ""]
    def median_of(rows, field, kind, variant):
        v = [r[field] for r in rows if r.get("kind") == kind and r.get("variant", variant) == variant and field in r]
        return statistics.median(v) if v else None

    out += ["| single stream | TTFT ms | decode tok/s | HBM-bound fraction |", "|---|---|---|---|"]
    for src, rows, variant in (("crossguard", ours, "defended"), ("crossguard, no CUDA graphs", ours, "no_graphs"), ("transformers", base, None)):
        ttft, tok_s = median_of(rows, "ttft_ms", "single_stream", variant), median_of(rows, "decode_tok_s", "single_stream", variant)
        frac = median_of(rows, "hbm_bound_fraction", "single_stream", variant)
        if ttft is None:
            out.append(f"| {src} | not measured | | |")
        else:
            out.append(f"| {src} | {ttft:.2f} | {tok_s:,.1f} | {'—' if frac is None else f'{frac:.3f}'} |")

    def median_tok_s(rows, variant, batch):
        v = [r["tok_s"] for r in rows if r.get("kind") == "aggregate" and r.get("variant") == variant and r.get("batch") == batch]
        return statistics.median(v) if v else None

    batches = sorted({r["batch"] for r in ours + base if r.get("kind") == "aggregate" and r.get("variant") != "warm-up"})
    out += ["", "| batch | crossguard tok/s | transformers tok/s | ratio | no zero-fill/checks tok/s | defences cost | no CUDA graphs tok/s |", "|---|---|---|---|---|---|---|"]
    fmt = lambda x: "—" if x is None else f"{x:,.0f}"
    for b in batches:
        ours_b, base_b = median_tok_s(ours, "defended", b), median_tok_s(base, "transformers", b)
        open_b = median_tok_s(ours, "no_zero_fill_no_checks", b)
        ratio = f"{ours_b / base_b:.2f}x" if ours_b and base_b else "—"
        cost = f"{(open_b / ours_b - 1) * 100:+.1f}%" if ours_b and open_b else "—"
        out.append(f"| {b} | {fmt(ours_b)} | {fmt(base_b)} | {ratio} | {fmt(open_b)} | {cost} | {fmt(median_tok_s(ours, 'no_graphs', b))} |")
    out += ["", "Aggregate tok/s = generated tokens / wall time of the whole batch, prefill included, "
            "median over the runs in ours.jsonl. \"Defences cost\" = how much faster the same batch runs "
            "with zero-fill and the in-kernel owner and bounds checks switched off. Single-stream figures are "
            "medians over the rounds; \"no CUDA graphs\" is the defended engine launching every kernel itself.", ""]
    for path in sorted(glob.glob(f"{d}/profile-b*.txt")):
        # Nsight Compute's per-kernel summary: kernel names and their duration lines.
        keep = [l.rstrip() for l in open(path, encoding="utf-8", errors="replace")
                if re.search(r"^\s*\S+\(|gpu__time_duration|invocations|^exit ", l)]
        batch = os.path.basename(path)[len("profile-b"):-len(".txt")]
        out += [f"## One decode step at batch {batch}, per kernel (Nsight Compute)", "", "```"] + keep[:200] + ["```", ""]
    print("\n".join(out))


if __name__ == "__main__":
    main()
