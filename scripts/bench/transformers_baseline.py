#!/usr/bin/env python3
"""The PyTorch baseline of scripts/gpu-check.sh: the same GGUF, loaded and dequantized by
transformers (which needs the `gguf` package), run on the same GPU in float16 with
`generate` (greedy, fixed lengths). Prints JSON lines shaped like bench_gpu's:
single_stream (ttft_ms, decode_tok_s) and aggregate tok/s per batch size, prefill
included as in ours. It measures; the report compares.

usage: transformers_baseline.py MODEL.gguf [--prompt-tokens 128] [--decode-tokens 128]
                                [--batches 1,16,64,256]
"""
import argparse
import json
import os
import sys
import time


def emit(**fields):
    print(json.dumps(fields), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--batches", default="1,16,64,256")
    args = ap.parse_args()
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        import gguf  # noqa: F401  (transformers' GGUF loader needs it)
    except ImportError as e:
        emit(kind="error", reason=f"baseline unavailable: {e}")
        return 2
    if not torch.cuda.is_available():
        emit(kind="error", reason="baseline unavailable: torch sees no GPU")
        return 2
    folder, name = os.path.split(os.path.abspath(args.model))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float16).to("cuda").eval()
    text = "The quick brown fox jumps over the lazy dog while the engine counts tokens. " * (args.prompt_tokens // 8 + 2)
    prompt = tok(text, add_special_tokens=False)["input_ids"][: args.prompt_tokens]
    pad = tok.eos_token_id if tok.eos_token_id is not None else 0

    def run(batch, new_tokens):
        ids = torch.tensor([prompt] * batch, device="cuda")
        mask = torch.ones_like(ids)
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           do_sample=False, pad_token_id=pad)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    emit(kind="device", device="transformers", gpu=torch.cuda.get_device_name(0),
         torch=torch.__version__, dtype="float16")
    run(1, 4)  # warm-up
    ttft = run(1, 1)
    total = run(1, args.decode_tokens + 1)
    emit(kind="single_stream", prompt_tokens=len(prompt), decode_tokens=args.decode_tokens,
         ttft_ms=round(ttft * 1e3, 2), decode_tok_s=round(args.decode_tokens / max(total - ttft, 1e-9), 1))
    for batch in [int(b) for b in args.batches.split(",") if b.strip()]:
        wall = run(batch, args.decode_tokens)
        emit(kind="aggregate", variant="transformers", batch=batch, prompt_tokens=len(prompt),
             decode_tokens=args.decode_tokens, generated=batch * args.decode_tokens, wall_s=round(wall, 3),
             tok_s=round(batch * args.decode_tokens / wall, 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
