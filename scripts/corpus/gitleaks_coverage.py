#!/usr/bin/env python3
"""Check that rules/README.md maps every gitleaks default rule to crossguard rules or a reason.

    python3 scripts/corpus/gitleaks_coverage.py --check [--rules rules]

The gitleaks rule ids are data (scripts/corpus/peers/gitleaks-rule-ids.txt, taken from
gitleaks' config/gitleaks.toml at the commit its header names). The mapping is the table
between the `gitleaks-mapping` markers in rules/README.md: one row per gitleaks id, naming
crossguard rule ids in backticks, or none (`—`) and a reason. Exit 1, listing every
problem, when an id has no row, a row names a crossguard id that no rule file defines, a
row without rules gives no reason, or a row names a gitleaks id that is not in the list.
Without --check the table's totals are printed.
"""
import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
IDS = ROOT / "scripts" / "corpus" / "peers" / "gitleaks-rule-ids.txt"
BEGIN, END = "<!-- gitleaks-mapping: begin -->", "<!-- gitleaks-mapping: end -->"


def gitleaks_ids():
    lines = IDS.read_text(encoding="utf-8").splitlines()
    return [x.strip() for x in lines if x.strip() and not x.startswith("#")]


def crossguard_ids(rules_dir):
    ids = set()
    for f in sorted(pathlib.Path(rules_dir).glob("*.toml")):
        ids.update(re.findall(r"""^id\s*=\s*["']([a-z0-9-]+)["']""", f.read_text(encoding="utf-8"), re.M))
    return ids


def mapping(readme):
    """{gitleaks id: (crossguard ids, reason)} from the README's table."""
    text = readme.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme}: no table between {BEGIN} and {END}")
    rows = {}
    for line in text.split(BEGIN, 1)[1].split(END, 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue  # header, separator, blank
        gl = cells[0].strip("`")
        rows.setdefault(gl, []).append((re.findall(r"`([a-z0-9-]+)`", cells[1]), cells[2]))
    return rows


def problems(ids, rows, known):
    out = []
    for gl in ids:
        if gl not in rows:
            out.append(f"gitleaks rule `{gl}`: no row in the mapping table")
    for gl, entries in rows.items():
        if gl not in ids:
            out.append(f"row `{gl}`: not a rule of the gitleaks list ({IDS.name})")
        if len(entries) > 1:
            out.append(f"row `{gl}`: {len(entries)} rows for one rule")
        for cg, reason in entries:
            if not cg and not reason:
                out.append(f"row `{gl}`: names no crossguard rule and gives no reason")
            for x in cg:
                if x not in known:
                    out.append(f"row `{gl}`: crossguard rule `{x}` is not defined in the rules folder")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the mapping is incomplete")
    ap.add_argument("--rules", default=str(ROOT / "rules"))
    a = ap.parse_args()
    ids, rows = gitleaks_ids(), mapping(pathlib.Path(a.rules) / "README.md")
    found = problems(ids, rows, crossguard_ids(a.rules))
    for p in found:
        print(p)
    covered = sum(1 for gl in ids if any(cg for cg, _ in rows.get(gl, [])))
    print(f"{len(ids)} gitleaks rules: {covered} mapped to crossguard rules, "
          f"{len(ids) - covered} with a reason; {len(found)} problems")
    if a.check and found:
        sys.exit(1)


if __name__ == "__main__":
    main()
