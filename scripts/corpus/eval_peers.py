#!/usr/bin/env python3
"""Recall and precision of a rules folder on peer scanners' public samples.

    python3 scripts/corpus/eval_peers.py --crossguard target/release/crossguard
        [--rules rules] [--split tuning|held-back] [--list] [--min-recall R] [--min-precision P]

The records (firewall/tests/peers/, built by scripts/corpus/peers/extract.py) are texts
other scanners' authors wrote, with the credentials they expect found. Scoring as in
eval_seeds.py: a finding is true when its span overlaps an expected secret, and an
expected secret is found when some finding overlaps it. A secret the peer gives no span
for ("this text holds a key") is found by any finding in its text, and makes every finding
in that text true. A finding that repeats an expected secret's value elsewhere in its text
is true too (peers label a value once, however often it is written). Any other finding is
a false positive.

Printed: every miss and false positive, recall per expected kind and precision per
crossguard rule (weakest first), recall and precision per source, then the totals: recall,
precision, false positives per MB and the share of clean texts flagged.

Misses of placeholder-shaped values are listed as `miss~`. Each source's line also counts its misses whose value is placeholder-shaped: a run of four
counting characters (`1234`, `abcd`, `9876`, `a1b2c3`), one character four times in a row,
or a placeholder word (example, sample, dummy, fake, your, xxxx). Peers' samples hold
many such values (`abcdef1234567890abcdef1234567890`), which the rules leave alone on
purpose: a language model writes them in honest answers all the time. The count only
says how much of the gap is that decision; the score counts them as misses all the same (a
last line gives the recall on the other secrets, for reading only). Exits 1 below the
--min-recall / --min-precision floors, so CI catches a rules change that loses ground.
The held-back split prints its totals only, unless --list is given: it is for measuring,
never for tuning.
"""
import argparse
import collections
import json
import re
import pathlib
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PEERS = ROOT / "firewall" / "tests" / "peers"
sys.path.insert(0, str(HERE))

from eval_seeds import context, overlap, scan  # noqa: E402


def load(split):
    path = PEERS / f"{split}.jsonl"
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


PLACEHOLDER_WORDS = re.compile(r"(?i)example|sample|dummy|fake|your|xxxx|([A-Za-z0-9])\1\1\1")
COUNTING = ("0123456789", "abcdefghijklmnopqrstuvwxyz")


def placeholder_shaped(value):
    """Whether a value looks made up: see the module doc."""
    if PLACEHOLDER_WORDS.search(value):
        return True
    low = value.lower()
    for run in COUNTING:
        for seq in (run, run[::-1]):
            if any(seq[i:i + 4] in low for i in range(len(seq) - 3)):
                return True
    digits_letters = re.sub(r"[^a-z0-9]", "", low)
    return bool(re.search(r"a1b2c3|1a2b3c", digits_letters))


class Score:
    """Counts for one split, with per-kind and per-rule breakdowns."""

    def __init__(self):
        self.expected = collections.Counter()   # kind -> expected secrets
        self.missed = collections.Counter()     # kind -> missed
        self.by_rule = collections.Counter()    # rule -> findings
        self.false_by_rule = collections.Counter()
        self.bytes = 0
        self.clean = 0
        self.clean_flagged = 0
        self.lines = []
        self.placeholder_misses = 0
        self.placeholder_expected = 0

    def record(self, r, findings):
        self.bytes += len(r["text"].encode())
        spanless = any("start" not in s for s in r["secrets"])
        if not r["secrets"]:
            self.clean += 1
            self.clean_flagged += bool(findings)
        for s in r["secrets"]:
            kind = f"{r['id'].split(':')[0]}:{s['kind']}"
            self.expected[kind] += 1
            hit = bool(findings) if "start" not in s else any(overlap(f, s) for f in findings)
            if not hit:
                self.missed[kind] += 1
                shaped = placeholder_shaped(s.get("value") or r["text"])
                self.placeholder_misses += shaped
                self.placeholder_expected += shaped
                where = (s["start"], s["end"]) if "start" in s else (0, min(len(r["text"].encode()), 120))
                tag = "miss~" if shaped else "miss "
                self.lines.append(f"{tag} {r['id']} [{s['kind']}]: {context(r['text'], *where)}")
            else:
                self.placeholder_expected += placeholder_shaped(s.get("value") or r["text"])
        for f in findings:
            self.by_rule[f["rule_id"]] += 1
            if not spanless and not any(is_expected(r, f, s) for s in r["secrets"]):
                self.false_by_rule[f["rule_id"]] += 1
                self.lines.append(f"false {r['id']} {f['rule_id']}: {context(r['text'], f['start'], f['end'])}")

    def totals(self):
        expected, missed = sum(self.expected.values()), sum(self.missed.values())
        findings, false = sum(self.by_rule.values()), sum(self.false_by_rule.values())
        return {
            "recall": 1 - missed / max(expected, 1),
            "precision": 1 - false / max(findings, 1),
            "fp_per_mb": false / max(self.bytes / 1e6, 1e-9),
            "clean_flagged": self.clean_flagged / max(self.clean, 1),
            "expected": expected, "missed": missed, "findings": findings, "false": false,
            "mb": self.bytes / 1e6, "clean": self.clean,
        }


def is_expected(record, finding, secret):
    """A finding is one of the expected secrets when it overlaps it, or when it is the same
    credential written again elsewhere in the text (peers label a repeated value once)."""
    if overlap(finding, secret):
        return True
    value = secret.get("value") or ""
    found = record["text"].encode()[finding["start"]:finding["end"]].decode(errors="replace")
    return len(found) >= 6 and len(value) >= 6 and (found in value or value in found)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--crossguard", required=True, help="path of the crossguard binary")
    ap.add_argument("--rules", default=str(ROOT / "rules"))
    ap.add_argument("--split", default="tuning", choices=["tuning", "held-back"])
    ap.add_argument("--list", action="store_true", help="list misses and false positives of the held-back split too")
    ap.add_argument("--min-recall", type=float, default=0.0)
    ap.add_argument("--min-precision", type=float, default=0.0)
    ap.add_argument("--weakest", type=int, default=15, help="how many kinds and rules to show")
    a = ap.parse_args()
    recs = load(a.split)
    with tempfile.TemporaryDirectory(prefix="cg-peers-") as tmp:
        found = scan(a.crossguard, a.rules, recs, pathlib.Path(tmp))
    score, by_source = Score(), collections.defaultdict(Score)
    for r in recs:
        score.record(r, found.get(r["id"], []))
        by_source[r["id"].split(":")[0]].record(r, found.get(r["id"], []))
    if a.split == "held-back" and not a.list:
        report_sources(by_source)  # totals only: a listing would say what to tune
        report_totals(a, score, recs)
        return
    for line in score.lines:
        print(line)
    print("recall per expected kind (weakest first):")
    kinds = sorted(score.expected, key=lambda k: (1 - score.missed[k] / score.expected[k], k))
    for k in kinds[:a.weakest]:
        print(f"  {k}: {score.expected[k] - score.missed[k]}/{score.expected[k]}")
    print("precision per crossguard rule (weakest first):")
    rules = sorted(score.by_rule, key=lambda k: (1 - score.false_by_rule[k] / score.by_rule[k], k))
    for k in rules[:a.weakest]:
        if score.false_by_rule[k]:
            print(f"  {k}: {score.by_rule[k] - score.false_by_rule[k]}/{score.by_rule[k]}")
    report_sources(by_source)
    report_totals(a, score, recs)


def report_sources(by_source):
    print("per source:")
    for name, sc in sorted(by_source.items()):
        t = sc.totals()
        print(f"  {name}: recall {t['recall']:.3f} ({t['expected'] - t['missed']}/{t['expected']}), "
              f"precision {t['precision']:.3f} ({t['findings'] - t['false']}/{t['findings']}); "
              f"{sc.placeholder_misses} of {t['missed']} misses placeholder-shaped")


def report_totals(a, score, recs):
    t = score.totals()
    print(f"{a.split}: {len(recs)} texts, {t['mb']:.3f} MB, {t['expected']} expected secrets, "
          f"{t['missed']} missed (recall {t['recall']:.4f}); {t['findings']} findings, "
          f"{t['false']} false (precision {t['precision']:.4f}, {t['fp_per_mb']:.1f} per MB); "
          f"{100 * t['clean_flagged']:.1f} % of {t['clean']} clean texts flagged")
    real = t["expected"] - score.placeholder_expected
    real_missed = t["missed"] - score.placeholder_misses
    print(f"{a.split}, placeholder-shaped secrets left out: {real} expected, {real_missed} missed "
          f"(recall {1 - real_missed / max(real, 1):.4f})")
    if t["recall"] < a.min_recall or t["precision"] < a.min_precision:
        print(f"below the floors: recall >= {a.min_recall}, precision >= {a.min_precision}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
