#!/usr/bin/env python3
"""How closely crossguard's engine follows llama.cpp on the same GGUF, teacher-forced.

The text (by default the GPL-3 licence Debian ships: English prose nobody here wrote) is
tokenized by llama.cpp and cut into chunks of --chunk tokens (BOS first when the model
adds one). llama.cpp evaluates each chunk in one batch with every position's logits kept
(llama-cpp-python, logits_all); our engine feeds the same tokens one at a time (its
decode path, `engine/examples/teacher_forced.rs`). Over every position of every chunk:

- top-1 agreement: the share of positions whose most likely next token is the same;
- mean KL divergence KL(llama.cpp || ours) of the next-token distributions, with its
  99th percentile and maximum;
- perplexity of the text's own next tokens under each engine.

The same figures for llama.cpp against itself, one token per step instead of a chunk,
give the floor: how far the reference moves when only its batching changes (on
SmolLM2-135M as far as ours is from it, see BENCHMARKS.md). A third row compares like with
like: ours against llama.cpp's one-token-per-step logits. With --exact, each is also
measured against a float64 forward pass of the file's weights with no quantized
activations (`exact_forward.py`: llama and gemma3 files): the model the file defines.

    cargo build --release -p crossguard-engine --example teacher_forced
    LLAMA_CPP_LIB_PATH=... /tmp/refvenv/bin/python scripts/bench/fidelity.py --model M.gguf [--chunks 4] [--exact]

The binary is looked up under $CARGO_TARGET_DIR (else `target/`); `--ours PATH` names
another. Prints one JSON object per model, then a Markdown table row.
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
OURS = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"), "release", "examples", "teacher_forced")
TEXT = "/usr/share/common-licenses/GPL-3"


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def chunks_of(llm, text: str, size: int, count: int) -> list[list[int]]:
    tokens = llm.tokenize(text.encode(), add_bos=False, special=False)
    bos = [llm.token_bos()] if llm._model.add_bos_token() else []
    step = size - len(bos)
    out = [bos + tokens[i * step:(i + 1) * step] for i in range(count)]
    if len(out[-1]) < size:
        sys.exit(f"the text holds {len(tokens)} tokens, fewer than {count} chunks of {size}")
    return out


def llama_rows(model: str, chunks: list[list[int]], threads: int, ubatch: int, flash_attn: bool) -> np.ndarray:
    """llama.cpp's logits at every position of every chunk, `ubatch` tokens per step."""
    import llama_cpp

    size = max(len(c) for c in chunks)
    llm = llama_cpp.Llama(model_path=model, n_ctx=size, n_batch=size, n_ubatch=ubatch, n_threads=threads,
                          logits_all=True, flash_attn=flash_attn, verbose=False)
    rows = []
    for chunk in chunks:
        llm.reset()
        llm.eval(chunk)
        rows.append(np.array(llm.scores[:len(chunk)], dtype=np.float32))
    return np.concatenate(rows)


def compare(ref: np.ndarray, other: np.ndarray, chunks: list[list[int]]) -> dict:
    """Top-1 agreement, KL(ref || other) and both perplexities over every position."""
    agree, kld, nll_ref, nll_other, at = 0, [], [], [], 0
    for chunk in chunks:
        r = log_softmax(ref[at:at + len(chunk)])
        o = log_softmax(other[at:at + len(chunk)])
        at += len(chunk)
        agree += int((r.argmax(axis=1) == o.argmax(axis=1)).sum())
        kld.extend((np.exp(r) * (r - o)).sum(axis=1).tolist())
        nxt = np.array(chunk[1:])
        nll_ref.extend((-r[np.arange(len(nxt)), nxt]).tolist())
        nll_other.extend((-o[np.arange(len(nxt)), nxt]).tolist())
    kld = np.array(kld)
    out = {
        "positions": at,
        "top1_agreement": agree / at,
        "mean_kld": float(kld.mean()),
        "p99_kld": float(np.percentile(kld, 99)),
        "max_kld": float(kld.max()),
        "ppl_ref": float(np.exp(np.mean(nll_ref))),
        "ppl": float(np.exp(np.mean(nll_other))),
    }
    out["ppl_ratio"] = out["ppl"] / out["ppl_ref"]
    return out


def row(model: str, who: str, m: dict) -> str:
    return (f"| {model} | {who} | {m['positions']} | {100 * m['top1_agreement']:.2f} % | {m['mean_kld']:.5f} "
            f"| {m['p99_kld']:.4f} | {m['ppl_ref']:.3f} | {m['ppl']:.3f} | {100 * (m['ppl_ratio'] - 1):+.2f} % |")


def our_logits(binary: str, model: str, chunks: list[list[int]], vocab: int, threads: int) -> np.ndarray:
    stdin = "".join(" ".join(map(str, c)) + "\n" for c in chunks)
    run = subprocess.run([binary, model, str(threads)], input=stdin.encode(), capture_output=True, check=False)
    if run.returncode != 0:
        sys.exit(f"{binary} failed: {run.stderr.decode(errors='replace')[-2000:]}")
    rows = np.frombuffer(run.stdout, dtype="<f4")
    total = sum(len(c) for c in chunks)
    if rows.size != total * vocab:
        sys.exit(f"{binary} wrote {rows.size} values, expected {total} x {vocab}")
    return rows.reshape(total, vocab)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ours", default=OURS)
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--exact", action="store_true",
                    help="also measure each engine against a float64 pass without quantized activations")
    args = ap.parse_args()

    import llama_cpp

    tokenizer = llama_cpp.Llama(model_path=args.model, n_ctx=args.chunk, vocab_only=True, verbose=False)
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    chunks = chunks_of(tokenizer, text, args.chunk, args.chunks)
    vocab = tokenizer.n_vocab()
    name = os.path.basename(args.model)
    # The reference: llama.cpp's prompt path (a whole chunk per step, no flash attention).
    ref = llama_rows(args.model, chunks, args.threads, args.chunk, False)
    our_rows = our_logits(args.ours, args.model, chunks, vocab, args.threads)
    ours = compare(ref, our_rows, chunks)
    # The floor: llama.cpp against itself, one token per step (its decode path, as ours).
    decode_path = llama_rows(args.model, chunks, args.threads, 1, False)
    floor = compare(ref, decode_path, chunks)
    # Like against like: ours against llama.cpp's decode path, both one token per step.
    ours_vs_decode = compare(decode_path, our_rows, chunks)
    print(json.dumps({"model": name, "ours": ours, "llama_cpp_decode_path": floor,
                      "ours_against_decode_path": ours_vs_decode}))
    print(row(name, "crossguard", ours))
    print(row(name, "llama.cpp, 1 token per step", floor))
    print(row(name, "crossguard against llama.cpp's 1 token per step", ours_vs_decode))
    if args.exact:
        from exact_forward import ExactModel

        exact_model = ExactModel(args.model)
        exact = np.concatenate([exact_model.logits(c) for c in chunks])
        against_exact = {"crossguard": compare(exact, our_rows, chunks),
                         "llama.cpp, a chunk per step": compare(exact, ref, chunks),
                         "llama.cpp, 1 token per step": compare(exact, decode_path, chunks)}
        print(json.dumps({"model": name, "against_float64": against_exact}))
        for who, m in against_exact.items():
            print(row(name, f"{who} against float64", m))


if __name__ == "__main__":
    main()
