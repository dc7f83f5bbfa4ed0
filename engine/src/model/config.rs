//! Hyper-parameters of a Llama-family model, read from GGUF metadata.
//!
//! Owns the mapping from `general.architecture` to an [`Arch`] and from `{arch}.*` keys to
//! [`LlamaConfig`], and the checks that the numbers fit together (KV heads divide heads,
//! RoPE fits a head), so the forward pass can index without re-checking.

use crate::error::{Error, Result};
use crate::gguf::Metadata;

/// The architectures the forward pass implements, by llama.cpp's `general.architecture`
/// names. They share the Llama block (RMSNorm, grouped-query attention with RoPE, SwiGLU);
/// what differs is listed on each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 1-3 and Mistral-style models: RoPE on adjacent pairs (the converter permutes
    /// Q/K rows for it), optional `rope_freqs` (Llama 3's long-context factors) and
    /// optional projection biases.
    Llama,
    /// Qwen 2 and 2.5: Q/K/V biases, RoPE on the two halves of a head (NeoX style).
    Qwen2,
    /// Qwen 3: no biases, an RMSNorm over each Q and K head before RoPE (NeoX style).
    Qwen3,
    /// Gemma 3: embeddings scaled by sqrt(n_embd), per-head Q/K RMSNorm, RMSNorm after
    /// attention and after the feed-forward too, a GELU-gated feed-forward, NeoX RoPE, and
    /// sliding-window layers (all but every sixth) with their own RoPE base.
    Gemma3,
}

impl Arch {
    /// Every supported architecture, as GGUF names them.
    pub const SUPPORTED: [(&'static str, Arch); 4] =
        [("llama", Arch::Llama), ("qwen2", Arch::Qwen2), ("qwen3", Arch::Qwen3), ("gemma3", Arch::Gemma3)];

    /// The architecture GGUF calls `name`.
    pub fn from_name(name: &str) -> Option<Arch> {
        Self::SUPPORTED.iter().find(|(n, _)| *n == name).map(|(_, a)| *a)
    }

    /// The GGUF name.
    pub fn name(self) -> &'static str {
        Self::SUPPORTED.iter().find(|(_, a)| *a == self).map_or("llama", |(n, _)| n)
    }

    /// How RoPE pairs a head's dimensions.
    pub fn rope_pairs(self) -> RopePairs {
        match self {
            Arch::Llama => RopePairs::Adjacent,
            Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3 => RopePairs::Halves,
        }
    }

    /// The feed-forward's gate activation.
    pub fn gate(self) -> Gate {
        match self {
            Arch::Gemma3 => Gate::GeluTanh,
            Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => Gate::Silu,
        }
    }

    /// Whether Q and K heads are RMS-normalised before RoPE.
    pub fn norms_heads(self) -> bool {
        matches!(self, Arch::Qwen3 | Arch::Gemma3)
    }
}

/// The activation of the feed-forward's gate (`act(gate) * up`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// SwiGLU.
    Silu,
    /// GeGLU with the tanh approximation of GELU.
    GeluTanh,
}

/// Which dimensions of a head RoPE rotates together (llama.cpp's rope types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopePairs {
    /// `(2i, 2i + 1)`: LLAMA_ROPE_TYPE_NORM.
    Adjacent,
    /// `(i, i + dims / 2)`: LLAMA_ROPE_TYPE_NEOX.
    Halves,
}

/// Shape and numeric constants of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub arch: Arch,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub vocab: usize,
    /// Context the model was trained for (the default upper bound of the KV cache).
    pub context_length: usize,
    pub rope_base: f32,
    /// Leading dimensions of each head that RoPE rotates.
    pub rope_dims: usize,
    /// Positions are multiplied by this before rotation (`rope.scaling.type = "linear"`:
    /// `1 / rope.scaling.factor`; 1 otherwise). Sliding-window layers take neither.
    pub rope_freq_scale: f32,
    /// Sliding-window attention: how many positions (the query's own included) its layers
    /// see, and which layers they are (`[n_layer]`); `None` when every layer sees all.
    pub window: Option<(usize, Vec<bool>)>,
    /// The RoPE base of sliding-window layers (`rope.freq_base_swa`, else 10,000).
    pub rope_base_local: f32,
    /// `logits = cap * tanh(logits / cap)` when set (`final_logit_softcapping`).
    pub logit_softcap: Option<f32>,
    pub rms_eps: f32,
}

impl LlamaConfig {
    /// Reads the configuration; `vocab_fallback` is used when `{arch}.vocab_size` is absent
    /// (older files: the length of `tokenizer.ggml.tokens`).
    pub fn from_metadata(meta: &Metadata, vocab_fallback: usize) -> Result<LlamaConfig> {
        let name = meta.architecture()?;
        let Some(arch) = Arch::from_name(name) else {
            let supported: Vec<&str> = Arch::SUPPORTED.iter().map(|(n, _)| *n).collect();
            return Err(Error::Metadata {
                key: "general.architecture".into(),
                reason: format!("{name:?} is not supported (supported: {})", supported.join(", ")),
            });
        };
        let u = |k: &str| meta.u32(&format!("{name}.{k}")).map(|v| v as usize);
        let n_embd = u("embedding_length")?;
        let n_head = u("attention.head_count")?;
        let n_head_kv = u("attention.head_count_kv").unwrap_or(n_head);
        let bad = |key: &str, reason: String| Error::Metadata { key: format!("{name}.{key}"), reason };
        if n_head == 0 {
            return Err(bad("attention.head_count", "no heads".into()));
        }
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(bad("attention.head_count_kv", format!("{n_head_kv} KV heads do not divide {n_head} heads")));
        }
        // Heads may be wider than n_embd / n_head (Qwen 3): then the file says how wide.
        let head_dim = match u("attention.key_length") {
            Ok(d) => d,
            Err(_) if n_embd % n_head == 0 => n_embd / n_head,
            Err(_) => return Err(bad("attention.head_count", format!("{n_head} heads do not divide {n_embd}"))),
        };
        if head_dim == 0 || u("attention.value_length").is_ok_and(|v| v != head_dim) {
            return Err(bad("attention.value_length", format!("values must be as wide as keys ({head_dim})")));
        }
        let rope_dims = u("rope.dimension_count").unwrap_or(head_dim);
        if rope_dims > head_dim || rope_dims % 2 != 0 {
            return Err(bad("rope.dimension_count", format!("{rope_dims} for head size {head_dim}")));
        }
        let rope_freq_scale = match meta
            .get(&format!("{name}.rope.scaling.type"))
            .map(|_| meta.str(&format!("{name}.rope.scaling.type")))
            .transpose()?
        {
            None | Some("none") => 1.0,
            Some("linear") => match meta.f32(&format!("{name}.rope.scaling.factor")) {
                Ok(f) if f > 0.0 => 1.0 / f,
                _ => return Err(bad("rope.scaling.factor", "linear scaling needs a positive factor".into())),
            },
            Some(other) => return Err(bad("rope.scaling.type", format!("{other:?} is not supported (none, linear)"))),
        };
        let n_layer = u("block_count")?;
        // Gemma 3's layers alternate: every `pattern`-th sees the whole context.
        let window = match (arch, u("attention.sliding_window")) {
            (Arch::Gemma3, Ok(w)) if w > 0 => {
                let pattern = u("attention.sliding_window_pattern").unwrap_or(6).max(1);
                Some((w, (0..n_layer).map(|il| il % pattern < pattern - 1).collect()))
            }
            _ => None,
        };
        Ok(LlamaConfig {
            arch,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: u("feed_forward_length")?,
            vocab: u("vocab_size").unwrap_or(vocab_fallback),
            context_length: u("context_length")?,
            rope_base: meta.f32(&format!("{name}.rope.freq_base")).unwrap_or(10_000.0),
            rope_dims,
            rope_freq_scale,
            window,
            rope_base_local: meta.f32(&format!("{name}.rope.freq_base_swa")).unwrap_or(10_000.0),
            logit_softcap: meta.f32(&format!("{name}.final_logit_softcapping")).ok().filter(|c| *c > 0.0),
            rms_eps: meta.f32(&format!("{name}.attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
        })
    }

    /// Whether layer `il` attends through the sliding window.
    pub fn is_local(&self, il: usize) -> bool {
        self.window.as_ref().is_some_and(|(_, local)| local.get(il).copied().unwrap_or(false))
    }

    /// RoPE base and position scale of layer `il`.
    pub fn rope_of(&self, il: usize) -> (f32, f32) {
        if self.is_local(il) {
            (self.rope_base_local, 1.0)
        } else {
            (self.rope_base, self.rope_freq_scale)
        }
    }

    /// How many positions back layer `il` sees (the query's own included); `None`: all.
    pub fn window_of(&self, il: usize) -> Option<usize> {
        self.window.as_ref().filter(|_| self.is_local(il)).map(|(w, _)| *w)
    }

    /// Width of one token's keys (or values): `n_head_kv * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Width of one token's queries: `n_head * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
}
