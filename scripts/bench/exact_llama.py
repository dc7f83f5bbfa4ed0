"""A float64 forward pass of a Llama-architecture GGUF, for fidelity.py's `--exact`.

Every weight is dequantized by the `gguf` package and every product is taken in float64,
with no quantization of activations: the logits the file's weights define, up to float64
rounding. Both crossguard and llama.cpp round activations to 8 bits before each matrix
product; measuring each against this pass says which one follows the model more closely,
which the two measured against each other cannot say. Only the `llama` architecture
without RoPE scaling (SmolLM2 and other Llama 2-style files) is written out here.
"""

import numpy as np


def _field(reader, key):
    f = reader.fields[key]
    value = f.parts[f.data[0]]
    return value.tobytes().decode() if value.dtype == np.uint8 else value[0]


class ExactLlama:
    def __init__(self, path: str):
        import gguf

        reader = gguf.GGUFReader(path)
        arch = _field(reader, "general.architecture")
        if arch != "llama":
            raise SystemExit(f"--exact handles the llama architecture only, not {arch}")
        if "llama.rope.scaling.type" in reader.fields:
            raise SystemExit("--exact does not handle RoPE scaling")
        self.layers = int(_field(reader, "llama.block_count"))
        self.heads = int(_field(reader, "llama.attention.head_count"))
        self.kv_heads = int(_field(reader, "llama.attention.head_count_kv"))
        self.eps = float(_field(reader, "llama.attention.layer_norm_rms_epsilon"))
        self.base = float(_field(reader, "llama.rope.freq_base"))
        self.w = {}
        for t in reader.tensors:
            rows = gguf.dequantize(t.data, t.tensor_type)
            self.w[t.name] = np.asarray(rows, dtype=np.float64).reshape(
                [int(n) for n in reversed(t.shape)] if len(t.shape) > 1 else [int(t.shape[0])])
        self.width = self.w["token_embd.weight"].shape[1]
        self.head_dim = self.width // self.heads
        self.output = self.w.get("output.weight", self.w["token_embd.weight"])

    def _norm(self, x, weight):
        return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + self.eps) * weight

    def _rope(self, x, positions):
        # llama.cpp's "normal" RoPE: adjacent pairs (2i, 2i+1) turn by pos * base^(-2i/d).
        d = self.head_dim
        freqs = self.base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        angle = positions[:, None] * freqs[None, :]
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def logits(self, tokens: list[int]) -> np.ndarray:
        """Logits at every position of one sequence, as float32."""
        n, d, hd = len(tokens), self.width, self.head_dim
        pos = np.arange(n, dtype=np.float64)
        mask = np.triu(np.full((n, n), -np.inf), 1)
        x = self.w["token_embd.weight"][tokens]
        group = self.heads // self.kv_heads
        for i in range(self.layers):
            def w(name, i=i):
                return self.w[f"blk.{i}.{name}.weight"]
            h = self._norm(x, w("attn_norm"))
            q = self._rope((h @ w("attn_q").T).reshape(n, self.heads, hd), pos)
            k = self._rope((h @ w("attn_k").T).reshape(n, self.kv_heads, hd), pos)
            v = (h @ w("attn_v").T).reshape(n, self.kv_heads, hd)
            out = np.empty((n, self.heads, hd))
            for head in range(self.heads):
                kv = head // group
                s = q[:, head, :] @ k[:, kv, :].T / np.sqrt(hd) + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                out[:, head, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kv, :]
            x = x + out.reshape(n, d) @ w("attn_output").T
            h = self._norm(x, w("ffn_norm"))
            gate = h @ w("ffn_gate").T
            x = x + ((gate / (1 + np.exp(-gate))) * (h @ w("ffn_up").T)) @ w("ffn_down").T
        return (self._norm(x, self.w["output_norm.weight"]) @ self.output.T).astype(np.float32)
