#!/usr/bin/env python3
"""Writes two JSON Schemas that are hard for constrained decoding, for
`engine/examples/bench_grammar` (its fifth argument):

- alternatives.json: a list whose items are any of 60 object shapes, each with four
  string properties under a regex pattern;
- big_enum.json: a list of objects holding one of 20,000 random words (a 230 KB schema)
  and a string under an ambiguous pattern.

Usage: python3 scripts/bench/hard_schemas.py OUT_DIR
"""
import json
import os
import random
import sys


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    pattern = "^([a-z]{2,5}-[0-9]{1,3}|[A-Z]{3}_[a-f0-9]{4,8})+$"
    shapes = [
        {
            "type": "object",
            "properties": {f"k{i}_{j}": {"type": "string", "pattern": pattern} for j in range(4)},
            "required": [f"k{i}_0"],
            "additionalProperties": False,
        }
        for i in range(60)
    ]
    alternatives = {
        "type": "object",
        "properties": {"items": {"type": "array", "minItems": 200, "items": {"anyOf": shapes}}},
        "required": ["items"],
        "additionalProperties": False,
    }
    rng = random.Random(1)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 12))) for _ in range(20000)]
    item = {
        "type": "object",
        "properties": {"w": {"enum": words}, "p": {"type": "string", "pattern": "^(a|b|ab|ba|aab|bba)*(c|cc)?[0-9]{2,4}$"}},
        "required": ["w", "p"],
        "additionalProperties": False,
    }
    big_enum = {
        "type": "object",
        "properties": {"items": {"type": "array", "minItems": 200, "items": item}},
        "required": ["items"],
        "additionalProperties": False,
    }
    for name, schema in [("alternatives.json", alternatives), ("big_enum.json", big_enum)]:
        with open(os.path.join(out, name), "w") as f:
            json.dump(schema, f)
        print(os.path.join(out, name))


if __name__ == "__main__":
    main()
