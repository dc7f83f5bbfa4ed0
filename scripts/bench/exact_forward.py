"""A float64 forward pass of a GGUF model, for fidelity.py's `--exact`.

Every weight is dequantized by the `gguf` package and every product is taken in float64,
with no quantization of activations: the logits the file's weights define, up to float64
rounding. Both crossguard and llama.cpp round activations to 8 bits before each matrix
product; measuring each against this pass says which one follows the model more closely,
which the two measured against each other cannot say.

Two architectures are written out, as llama.cpp defines them: `llama` without RoPE
scaling (SmolLM2 and other Llama 2-style files; RoPE on adjacent pairs) and `gemma3`
(embeddings scaled by sqrt(width), per-head Q/K RMSNorm, RMSNorm after attention and after
the GELU-gated FFN, RoPE on halves, every sixth layer global and the others in a sliding
window with RoPE base 10,000).
"""

import numpy as np

SUPPORTED = ("llama", "gemma3")


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise SystemExit(f"--exact: the file has no {key}")
        return default
    value = f.parts[f.data[0]]
    return value.tobytes().decode() if value.dtype == np.uint8 else value[0]


class ExactModel:
    def __init__(self, path: str):
        import gguf

        reader = gguf.GGUFReader(path)
        self.arch = arch = _field(reader, "general.architecture")
        if arch not in SUPPORTED:
            raise SystemExit(f"--exact handles {', '.join(SUPPORTED)}, not {arch}")
        if f"{arch}.rope.scaling.type" in reader.fields and _field(reader, f"{arch}.rope.scaling.type") != "none":
            raise SystemExit("--exact does not handle RoPE scaling")
        self.layers = int(_field(reader, f"{arch}.block_count"))
        self.heads = int(_field(reader, f"{arch}.attention.head_count"))
        self.kv_heads = int(_field(reader, f"{arch}.attention.head_count_kv"))
        self.eps = float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon"))
        self.base = float(_field(reader, f"{arch}.rope.freq_base", 10000.0))
        self.w = {}
        for t in reader.tensors:
            rows = gguf.dequantize(t.data, t.tensor_type)
            self.w[t.name] = np.asarray(rows, dtype=np.float64).reshape(
                [int(n) for n in reversed(t.shape)] if len(t.shape) > 1 else [int(t.shape[0])])
        self.width = self.w["token_embd.weight"].shape[1]
        self.head_dim = int(_field(reader, f"{arch}.attention.key_length", self.width // self.heads))
        self.output = self.w.get("output.weight", self.w["token_embd.weight"])
        self.window = int(_field(reader, f"{arch}.attention.sliding_window", 0)) if arch == "gemma3" else 0
        self.pattern = int(_field(reader, f"{arch}.attention.sliding_window_pattern", 6))
        self.base_local = float(_field(reader, f"{arch}.rope.freq_base_swa", 10000.0))

    def _norm(self, x, weight):
        return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + self.eps) * weight

    def _rope(self, x, positions, base):
        d = self.head_dim
        freqs = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        angle = positions[:, None] * freqs[None, :]
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        if self.arch == "gemma3":  # pairs (i, i + d/2)
            a, b = x[..., : d // 2], x[..., d // 2:]
            return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
        even, odd = x[..., 0::2], x[..., 1::2]  # adjacent pairs (2i, 2i+1)
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def logits(self, tokens: list[int]) -> np.ndarray:
        """Logits at every position of one sequence, as float32."""
        n, hd, gemma = len(tokens), self.head_dim, self.arch == "gemma3"
        pos = np.arange(n, dtype=np.float64)
        causal = np.triu(np.full((n, n), -np.inf), 1)
        local_mask = causal + np.where(pos[:, None] - pos[None, :] >= max(self.window, 1), -np.inf, 0.0)
        x = self.w["token_embd.weight"][tokens]
        if gemma:
            x = x * np.sqrt(self.width)
        group = self.heads // self.kv_heads
        for i in range(self.layers):
            def w(name, i=i):
                return self.w[f"blk.{i}.{name}.weight"]

            local = gemma and self.window > 0 and i % self.pattern < self.pattern - 1
            base = self.base_local if local else self.base
            mask = local_mask if local else causal
            h = self._norm(x, w("attn_norm"))
            q = (h @ w("attn_q").T).reshape(n, self.heads, hd)
            k = (h @ w("attn_k").T).reshape(n, self.kv_heads, hd)
            v = (h @ w("attn_v").T).reshape(n, self.kv_heads, -1)
            if gemma:
                q, k = self._norm(q, w("attn_q_norm")), self._norm(k, w("attn_k_norm"))
            q, k = self._rope(q, pos, base), self._rope(k, pos, base)
            out = np.empty((n, self.heads, v.shape[2]))
            for head in range(self.heads):
                kv = head // group
                s = q[:, head, :] @ k[:, kv, :].T / np.sqrt(hd) + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                out[:, head, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kv, :]
            attn = out.reshape(n, -1) @ w("attn_output").T
            x = x + (self._norm(attn, w("post_attention_norm")) if gemma else attn)
            h = self._norm(x, w("ffn_norm"))
            gate, up = h @ w("ffn_gate").T, h @ w("ffn_up").T
            if gemma:  # GELU, tanh form
                act = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3)))
            else:  # SiLU
                act = gate / (1 + np.exp(-gate))
            ffn = (act * up) @ w("ffn_down").T
            x = x + (self._norm(ffn, w("post_ffw_norm")) if gemma else ffn)
        return (self._norm(x, self.w["output_norm.weight"]) @ self.output.T).astype(np.float32)
