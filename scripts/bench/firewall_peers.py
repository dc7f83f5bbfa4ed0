#!/usr/bin/env python3
"""Peers of the crossguard firewall on the labelled corpus, side by side in one run.

    python3 scripts/bench/firewall_peers.py [--corpus firewall/tests/corpus] [--rules rules]
                                            [--venv /tmp/crossguard-peers-venv]
                                            [--crossguard target/release/crossguard] [--json out.json]
                                            [--skip-detect-secrets] [--repeat N]

* detect-secrets (PyPI, default plugins and filters): recall, precision, false positives per
  MB, and MB per CPU-second (process CPU time of the scanning loop only).
* Hyperscan (PyPI `hyperscan`) compiling the default rules' regexes, where it accepts them:
  MB/s and MB per CPU-second (per-record block scans, start-of-match on; a second run
  without start-of-match for scale). Hyperscan has no
  secret groups, entropy gates or allowlists, so its "findings" are raw regex matches; their
  precision is printed for information only.
* crossguard itself, when `--crossguard BIN` points at the binary: the whole corpus through
  one `crossguard scan --rules DIR --input-jsonl FILE` process (best of three), CPU time
  from rusage; start-up alone (an empty input) is reported too, and scanning without it.

Scoring is the one of firewall/tests/corpus_eval.rs: a finding is true when its byte span
overlaps a planted secret. detect-secrets reports a line and a value; its span is the value's
position in that line, or the whole line when the value is not found verbatim.

The script re-executes itself inside a virtual environment (created on first use under
/tmp, packages installed with pip) so that nothing is installed into the system Python.
"""
import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ["detect-secrets==1.5.0", "hyperscan==0.9.1"]


def ensure_venv(venv):
    py = pathlib.Path(venv) / "bin" / "python"
    if pathlib.Path(sys.prefix) == pathlib.Path(venv).resolve():
        return
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *PACKAGES], check=True)
    os.execv(str(py), [str(py), __file__, *sys.argv[1:]])


def load_corpus(d):
    recs = []
    for f in sorted(pathlib.Path(d).glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                recs.append(json.loads(line))
    return recs


def score(recs, findings):
    """findings: {record id: [(start, end)]} in byte offsets."""
    planted = found = true = false = 0
    nbytes = sum(len(r["text"].encode()) for r in recs)
    for r in recs:
        fs = findings.get(r["id"], [])
        spans = [(s["start"], s["end"]) for s in r["secrets"]]
        for a, b in fs:
            if any(a < e and s < b for s, e in spans):
                true += 1
            else:
                false += 1
        for s, e in spans:
            planted += 1
            found += any(a < e and s < b for a, b in fs)
    return {"planted": planted, "recall": found / max(planted, 1), "precision": true / max(true + false, 1),
            "findings": true + false, "false_positives": false, "fp_per_mb": false / (nbytes / 1e6), "mb": nbytes / 1e6}


def run_detect_secrets(recs):
    from detect_secrets import SecretsCollection
    from detect_secrets.settings import default_settings

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="cg-ds-"))
    paths = {}
    for r in recs:
        p = tmp / f"{r['id']}.txt"
        p.write_text(r["text"], encoding="utf-8")
        paths[str(p)] = r
    findings = {}
    t0, c0 = time.perf_counter(), time.process_time()
    with default_settings():
        coll = SecretsCollection()
        for p in paths:
            coll.scan_file(p)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    for filename, secret in coll:
        r = paths[filename]
        text = r["text"]
        lines = text.split("\n")
        line_start = len("\n".join(lines[:secret.line_number - 1]).encode()) + (1 if secret.line_number > 1 else 0)
        line = lines[secret.line_number - 1]
        value = secret.secret_value or ""
        i = line.find(value) if value else -1
        if i >= 0:
            a = line_start + len(line[:i].encode())
            span = (a, a + len(value.encode()))
        else:
            span = (line_start, line_start + len(line.encode()))
        findings.setdefault(r["id"], []).append(span)
    out = score(recs, findings)
    out.update(cpu_s=cpu, wall_s=wall, mb_per_cpu_s=out["mb"] / cpu)
    return out


def hs_patterns(rules_dir):
    pats = []
    for f in sorted(pathlib.Path(rules_dir).glob("*.toml")):
        for rule in tomllib.loads(f.read_text()).get("rule", []):
            pats.append((rule["id"], rule["regex"]))
    return pats


def run_hyperscan(recs, rules_dir, som=True):
    import hyperscan as hs

    base = hs.HS_FLAG_UTF8
    accepted, flags, rejected = [], [], {}
    for rid, rx in hs_patterns(rules_dir):
        f = base | hs.HS_FLAG_SOM_LEFTMOST
        if rx.startswith("(?m)"):
            rx, f = rx[4:], f | hs.HS_FLAG_MULTILINE
        if not som:
            f &= ~hs.HS_FLAG_SOM_LEFTMOST
        for attempt in (f, f & ~hs.HS_FLAG_SOM_LEFTMOST):
            try:
                hs.Database().compile(expressions=[rx.encode()], ids=[0], elements=1, flags=[attempt])
                accepted.append((rid, rx.encode()))
                flags.append(attempt)
                rejected.pop(rid, None)
                break
            except hs.error as e:
                rejected[rid] = str(e)
    db = hs.Database()
    db.compile(expressions=[p for _, p in accepted], ids=list(range(len(accepted))), elements=len(accepted), flags=flags)
    texts = [(r["id"], r["text"].encode()) for r in recs]
    findings, hits = {}, []

    def on_match(i, start, end, _flags, _ctx):
        hits.append((i, start, end))

    best = None
    for _ in range(3):
        findings.clear()
        t0, c0 = time.perf_counter(), time.process_time()
        for rid, b in texts:
            hits.clear()
            db.scan(b, match_event_handler=on_match)
            findings[rid] = [(s, e) for _, s, e in hits]
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        best = min(best or (cpu, wall), (cpu, wall))
    out = score(recs, findings)
    no_som = sum(1 for f in flags if not f & hs.HS_FLAG_SOM_LEFTMOST)
    out.update(cpu_s=best[0], wall_s=best[1], mb_per_s=out["mb"] / best[1], mb_per_cpu_s=out["mb"] / best[0],
               patterns_accepted=len(accepted), patterns_without_start_offsets=no_som, patterns_rejected=rejected)
    return out


def crossguard_cpu(binary, rules_dir, jsonl):
    """CPU seconds (user + sys) and stdout of one `crossguard scan --input-jsonl` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([binary, "scan", "--rules", str(rules_dir), "--input-jsonl", str(jsonl)], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode not in (0, 1):
        raise SystemExit(f"crossguard scan failed ({p.returncode}): {p.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), p.stdout


def run_crossguard(recs, binary, rules_dir):
    """The whole corpus through one `crossguard scan` process (Hyperscan too compiles its
    database once), best of three; start-up alone is the same command on an empty file."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="cg-scan-"))
    corpus, empty = tmp / "corpus.jsonl", tmp / "empty.jsonl"
    corpus.write_text("".join(json.dumps({"id": r["id"], "text": r["text"]}) + "\n" for r in recs), encoding="utf-8")
    empty.write_text("")
    runs = [crossguard_cpu(binary, rules_dir, corpus) for _ in range(3)]
    cpu, stdout = min(runs, key=lambda r: r[0])
    startup = min(crossguard_cpu(binary, rules_dir, empty)[0] for _ in range(3))
    findings = {}
    for line in stdout.splitlines():
        if line.strip():
            x = json.loads(line)
            findings.setdefault(x["id"], []).append((x["start"], x["end"]))
    out = score(recs, findings)
    scan_cpu = max(cpu - startup, 1e-9)
    out.update(cpu_s=cpu, startup_cpu_s=startup, mb_per_cpu_s=out["mb"] / max(cpu, 1e-9), mb_per_scan_cpu_s=out["mb"] / scan_cpu)
    return out


def show(name, r):
    extra = f"  {r['mb_per_s']:.1f} MB/s wall" if "mb_per_s" in r else ""
    print(f"{name:15} recall {r['recall']:.3f}  precision {r['precision']:.3f}  FP/MB {r['fp_per_mb']:7.2f}  "
          f"{r['mb_per_cpu_s']:9.2f} MB per CPU-s ({r['cpu_s']:.2f} CPU-s){extra}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(ROOT / "firewall" / "tests" / "corpus"))
    ap.add_argument("--rules", default=str(ROOT / "rules"))
    ap.add_argument("--venv", default="/tmp/crossguard-peers-venv")
    ap.add_argument("--crossguard", help="path of the crossguard binary (optional)")
    ap.add_argument("--json", help="write the figures here as JSON")
    ap.add_argument("--skip-detect-secrets", action="store_true")
    ap.add_argument("--repeat", type=int, default=1,
                    help="scan every record N times (ids suffixed #k): at 1.77 MB the corpus is too small "
                         "to time crossguard's scanning apart from its start-up, or Hyperscan's fast mode")
    a = ap.parse_args()
    ensure_venv(a.venv)
    recs = [dict(r, id=f"{r['id']}#{k}" if a.repeat > 1 else r["id"]) for k in range(a.repeat) for r in load_corpus(a.corpus)]
    print(f"corpus: {len(recs)} records, {sum(len(r['text'].encode()) for r in recs) / 1e6:.2f} MB, "
          f"{sum(len(r['secrets']) for r in recs)} planted secrets; one CPU core")
    results = {}
    if not a.skip_detect_secrets:
        results["detect-secrets"] = run_detect_secrets(recs)
        show("detect-secrets", results["detect-secrets"])
    results["hyperscan"] = run_hyperscan(recs, a.rules)
    show("hyperscan", results["hyperscan"])
    h = results["hyperscan"]
    print(f"{'':15} {h['patterns_accepted']} patterns compiled ({h['patterns_without_start_offsets']} without start offsets), "
          f"{len(h['patterns_rejected'])} rejected: {', '.join(sorted(h['patterns_rejected'])) or '-'}")
    # Without start-of-match tracking Hyperscan only reports match ends: faster, but it
    # cannot tell what to redact. Shown for scale.
    results["hyperscan-no-som"] = run_hyperscan(recs, a.rules, som=False)
    show("hyperscan no-SOM", results["hyperscan-no-som"])
    if a.crossguard:
        results["crossguard"] = run_crossguard(recs, a.crossguard, a.rules)
        c = results["crossguard"]
        show("crossguard", c)
        print(f"{'':15} start-up {c['startup_cpu_s']:.2f} CPU-s; scanning alone {c['mb_per_scan_cpu_s']:.2f} MB per CPU-s")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
