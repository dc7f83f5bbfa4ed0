#!/usr/bin/env python3
"""Token ids of crossguard's tokenizer against llama.cpp's on the same GGUF and texts.

The texts are files nobody here wrote: by default CPython's CJK codec test texts
(Chinese, Japanese, Korean, in UTF-8) and Debian's GPL-3 licence, each cut into
paragraphs. Both tokenizers encode every paragraph without BOS and with special-token
text as text; the script prints how many paragraphs and tokens agree and the first
mismatches.

    cargo build --release -p crossguard-engine --example tokenize
    LLAMA_CPP_LIB_PATH=... /tmp/refvenv/bin/python scripts/bench/tokenizer_vs_llamacpp.py --model M.gguf
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import sysconfig

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
OURS = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"), "release", "examples", "tokenize")


def default_texts() -> list[str]:
    cjk = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "test", "cjkencodings", "*-utf8.txt")))
    return cjk + ["/usr/share/common-licenses/GPL-3"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ours", default=OURS)
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    import llama_cpp

    paragraphs = []
    for path in args.files or default_texts():
        with open(path, encoding="utf-8", errors="replace") as f:
            paragraphs += [p for p in f.read().split("\n\n") if p.strip()]
    llm = llama_cpp.Llama(model_path=args.model, vocab_only=True, verbose=False)
    want = [llm.tokenize(p.encode(), add_bos=False, special=False) for p in paragraphs]
    run = subprocess.run([args.ours, args.model], input="".join(json.dumps(p) + "\n" for p in paragraphs).encode(),
                         capture_output=True, check=False)
    if run.returncode != 0:
        sys.exit(f"{args.ours} failed: {run.stderr.decode(errors='replace')[-2000:]}")
    got = [json.loads(line) for line in run.stdout.decode().splitlines()]
    same = sum(g == w for g, w in zip(got, want))
    tokens = sum(len(w) for w in want)
    print(json.dumps({"model": os.path.basename(args.model), "paragraphs": len(paragraphs), "identical": same,
                      "tokens": tokens, "characters": sum(len(p) for p in paragraphs)}))
    for p, g, w in [(p, g, w) for p, g, w in zip(paragraphs, got, want) if g != w][:5]:
        at = next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
        print(f"mismatch at token {at}: ours {g[at:at + 6]} llama.cpp {w[at:at + 6]} in {p[:80]!r}")


if __name__ == "__main__":
    main()
