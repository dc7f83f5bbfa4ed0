#!/usr/bin/env python3
"""Recall and precision of a rules folder on corpora of other seeds than the test suite's.

    python3 scripts/corpus/eval_seeds.py --crossguard target/release/crossguard
                                         [--rules rules] [--seeds 1-40]

The test suite scores the rules on one generated corpus (firewall/tests/corpus, seed
20260130), the corpus the rules were tuned against. Every other seed draws new secrets,
new hard negatives and new surroundings from the same generator, so a rule that only
fits the test corpus's draws shows up here as a miss or a false positive. Each one is
printed with its seed, record, expected rule and surrounding text; then the totals.
Scoring is firewall_peers.py's: a finding is true when its span overlaps a planted
secret, and a planted secret is found when some finding overlaps it. Exits 1 when the totals miss the firewall's goals (recall and precision at least
0.99, under 10 false positives per MB), so scripts/test.sh runs it on a few seeds. Nothing
is written outside a temporary folder.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from make_corpus import build  # noqa: E402

# The goals of the firewall issue, as in firewall/tests/corpus_eval.rs.
MIN_RECALL, MIN_PRECISION, MAX_FP_PER_MB = 0.99, 0.99, 10.0


def seed_range(text):
    lo, _, hi = text.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def scan(binary, rules, recs, tmp):
    """{record id: [finding]} from one `crossguard scan --input-jsonl` process."""
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": r["id"], "text": r["text"]}) + "\n" for r in recs), encoding="utf-8")
    p = subprocess.run([binary, "scan", "--rules", str(rules), "--input-jsonl", str(corpus)], capture_output=True, text=True)
    if p.returncode not in (0, 1):
        raise SystemExit(f"crossguard scan failed ({p.returncode}): {p.stderr[-2000:]}")
    found = {}
    for line in p.stdout.splitlines():
        x = json.loads(line)
        found.setdefault(x["id"], []).append(x)
    return found


def overlap(a, b):
    return a["start"] < b["end"] and b["start"] < a["end"]


def context(text, start, end):
    b = text.encode()
    return repr(b[max(0, start - 60):end + 20].decode(errors="replace"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--crossguard", required=True, help="path of the crossguard binary")
    ap.add_argument("--rules", default=str(ROOT / "rules"))
    ap.add_argument("--seeds", default="1-40", help="an inclusive range, e.g. 1-40, or one seed")
    a = ap.parse_args()
    totals = {"planted": 0, "missed": 0, "findings": 0, "false_positives": 0, "mb": 0.0}
    with tempfile.TemporaryDirectory(prefix="cg-seeds-") as tmp:
        for seed in seed_range(a.seeds):
            recs = [r for kind in build(str(seed)).values() for r in kind]
            found = scan(a.crossguard, a.rules, recs, pathlib.Path(tmp))
            for r in recs:
                fs = found.get(r["id"], [])
                totals["planted"] += len(r["secrets"])
                totals["findings"] += len(fs)
                totals["mb"] += len(r["text"].encode()) / 1e6
                for s in r["secrets"]:
                    if not any(overlap(f, s) for f in fs):
                        totals["missed"] += 1
                        print(f"miss  seed {seed} {r['id']} {s['rule_id']}: {context(r['text'], s['start'], s['end'])}")
                for f in fs:
                    if not any(overlap(f, s) for s in r["secrets"]):
                        totals["false_positives"] += 1
                        print(f"false seed {seed} {r['id']} {f['rule_id']}: {context(r['text'], f['start'], f['end'])}")
    t = totals
    recall = 1 - t["missed"] / max(t["planted"], 1)
    precision = 1 - t["false_positives"] / max(t["findings"], 1)
    fp_per_mb = t["false_positives"] / max(t["mb"], 1e-9)
    print(f"seeds {a.seeds}: {t['mb']:.1f} MB, {t['planted']} planted secrets, {t['missed']} missed "
          f"(recall {recall:.5f}); {t['findings']} findings, {t['false_positives']} false "
          f"(precision {precision:.5f}, {fp_per_mb:.2f} per MB)")
    if recall < MIN_RECALL or precision < MIN_PRECISION or fp_per_mb >= MAX_FP_PER_MB:
        print(f"below the goals: recall >= {MIN_RECALL}, precision >= {MIN_PRECISION}, "
              f"false positives < {MAX_FP_PER_MB} per MB", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
