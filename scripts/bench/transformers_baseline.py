#!/usr/bin/env python3
"""The PyTorch baseline of scripts/gpu-check.sh: the same GGUF, loaded and dequantized by
transformers (which needs the `gguf` package), run on the same GPU in float16 with
`generate` (greedy, fixed lengths). Prints JSON lines shaped like bench_gpu's:
single_stream (ttft_ms, decode_tok_s) and aggregate tok/s per batch size, prefill
included as in ours. It measures; the report compares.

Without the `gguf` package (the GPU image may lack it and have no internet), it builds
the same architecture from the GGUF's own metadata (read here) with random weights: the
speed of `generate` at fixed lengths does not depend on the weights' values, and the
output says `weights: random` so the figures are read as speed only.

usage: transformers_baseline.py MODEL.gguf [--prompt-tokens 128] [--decode-tokens 128]
                                [--batches 1,16,64,256]
"""
import argparse
import json
import os
import statistics
import struct
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
        import transformers  # noqa: F401
    except ImportError as e:
        emit(kind="error", reason=f"baseline unavailable: {e}")
        return 2
    if not torch.cuda.is_available():
        emit(kind="error", reason="baseline unavailable: torch sees no GPU")
        return 2
    model, prompt, pad, weights = load(args.model, args.prompt_tokens, torch)

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
         torch=torch.__version__, dtype="float16", weights=weights)
    # Warm-up at full length: the first long generate pays for allocator and kernel set-up.
    run(1, args.decode_tokens + 1)
    ttft = statistics.median(run(1, 1) for _ in range(3))
    total = statistics.median(run(1, args.decode_tokens + 1) for _ in range(3))
    emit(kind="single_stream", prompt_tokens=len(prompt), decode_tokens=args.decode_tokens,
         ttft_ms=round(ttft * 1e3, 2), decode_tok_s=round(args.decode_tokens / max(total - ttft, 1e-9), 1))
    for batch in [int(b) for b in args.batches.split(",") if b.strip()]:
        wall = run(batch, args.decode_tokens)
        emit(kind="aggregate", variant="transformers", batch=batch, prompt_tokens=len(prompt),
             decode_tokens=args.decode_tokens, generated=batch * args.decode_tokens, wall_s=round(wall, 3),
             tok_s=round(batch * args.decode_tokens / wall, 1))
    return 0


def load(path, prompt_tokens, torch):
    """(model on the GPU, prompt ids, pad id, where the weights came from)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    folder, name = os.path.split(os.path.abspath(path))
    try:
        import gguf  # noqa: F401  (transformers' GGUF loader needs it)
    except ImportError:
        meta, tensors = read_gguf_header(path)
        arch = meta["general.architecture"]
        get = lambda k, d=None: meta.get(f"{arch}.{k}", d)
        heads = get("attention.head_count")
        config = LlamaConfig(
            hidden_size=get("embedding_length"), intermediate_size=get("feed_forward_length"),
            num_hidden_layers=get("block_count"), num_attention_heads=heads,
            num_key_value_heads=get("attention.head_count_kv", heads),
            vocab_size=len(meta["tokenizer.ggml.tokens"]), rope_theta=get("rope.freq_base", 10000.0),
            rms_norm_eps=get("attention.layer_norm_rms_epsilon", 1e-5),
            max_position_embeddings=get("context_length", 2048),
            tie_word_embeddings="output.weight" not in tensors)
        model = LlamaForCausalLM(config).to(dtype=torch.float16, device="cuda").eval()
        ids = [(i * 7919) % config.vocab_size for i in range(prompt_tokens)]
        return model, ids, 0, "random (no gguf package): speed only"
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float16).to("cuda").eval()
    text = "The quick brown fox jumps over the lazy dog while the engine counts tokens. " * (prompt_tokens // 8 + 2)
    ids = tok(text, add_special_tokens=False)["input_ids"][:prompt_tokens]
    return model, ids, tok.eos_token_id if tok.eos_token_id is not None else 0, "the GGUF, dequantized"


def read_gguf_header(path):
    """GGUF metadata (key -> value) and tensor names, read with the standard library."""
    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    with open(path, "rb") as f:
        def read(fmt):
            return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

        def string():
            return f.read(read("<Q")).decode("utf-8", "replace")

        def value(t):
            if t == 8:
                return string()
            if t == 9:
                et, n = read("<I"), read("<Q")
                return [value(et) for _ in range(n)]
            return read(scalar[t])

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        read("<I")
        n_tensors, n_kv = read("<Q"), read("<Q")
        meta = {}
        for _ in range(n_kv):
            key = string()
            meta[key] = value(read("<I"))
        tensors = set()
        for _ in range(n_tensors):
            tensors.add(string())
            dims = read("<I")
            f.read(8 * dims + 4 + 8)
        return meta, tensors


if __name__ == "__main__":
    sys.exit(main())
