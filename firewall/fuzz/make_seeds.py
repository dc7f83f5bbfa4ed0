#!/usr/bin/env python3
"""Writes the seed corpora of the firewall's fuzz targets from the shipped rule files.

    python3 firewall/fuzz/make_seeds.py rules firewall/fuzz/corpus

load_rules/: each `[[rule]]` of rules/*.toml as a file of its own (whole files exceed the
target's -max_len), plus a gitleaks-format file. stream_scan/: every `must_match` sample,
alone and inside a sentence; the first byte of each seed is the target's chunking seed.
scripts/fuzz.sh with FUZZ_MERGE=1 minimises both.
"""
import pathlib
import re
import sys
import tomllib

GITLEAKS = """title = "seed"
[[rules]]
id = "generic-token"
description = "token"
regex = '''(?i)token[=:]\\s*([a-z0-9]{16,})'''
secretGroup = 1
keywords = ["token"]
entropy = 3.0
[rules.allowlist]
regexes = ['''example''']
"""


def main(rules_dir, out):
    rules_dir, out = pathlib.Path(rules_dir), pathlib.Path(out)
    (out / "load_rules").mkdir(parents=True, exist_ok=True)
    (out / "stream_scan").mkdir(parents=True, exist_ok=True)
    (out / "load_rules" / "seed-gitleaks.toml").write_text(GITLEAKS)
    n = 0
    for path in sorted(rules_dir.glob("*.toml")):
        text = path.read_text()
        for block in re.split(r"(?m)^(?=\[\[rule\]\])", text)[1:]:
            (out / "load_rules" / f"seed-{path.stem}-{n}.toml").write_bytes(block.encode()[:4096])
            n += 1
        for rule in tomllib.loads(text).get("rule", []):
            for sample in rule.get("must_match", []):
                for text_ in (sample, f"Sure, here is the config you asked for: {sample} -- keep it safe."):
                    (out / "stream_scan" / f"seed-{n}").write_bytes(bytes([n % 256]) + text_.encode())
                    n += 1


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
