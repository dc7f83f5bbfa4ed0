//! Hyper-parameters of a Llama-architecture model, read from GGUF metadata.
//!
//! Owns the mapping from `{arch}.*` keys to [`LlamaConfig`] and the checks that the
//! numbers fit together (heads divide the embedding, KV heads divide heads), so the
//! forward pass can index without re-checking.

use crate::error::{Error, Result};
use crate::gguf::Metadata;

/// Architectures whose GGUF layout and forward pass are llama.cpp's LLM_ARCH_LLAMA.
const LLAMA_LIKE: [&str; 1] = ["llama"];

/// Shape and numeric constants of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
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
    pub rms_eps: f32,
}

impl LlamaConfig {
    /// Reads the configuration; `vocab_fallback` is used when `{arch}.vocab_size` is absent
    /// (older files: the length of `tokenizer.ggml.tokens`).
    pub fn from_metadata(meta: &Metadata, vocab_fallback: usize) -> Result<LlamaConfig> {
        let arch = meta.architecture()?;
        if !LLAMA_LIKE.contains(&arch) {
            return Err(Error::Metadata { key: "general.architecture".into(), reason: format!("{arch:?} is not supported (llama only)") });
        }
        let u = |k: &str| meta.u32(&format!("{arch}.{k}")).map(|v| v as usize);
        let n_embd = u("embedding_length")?;
        let n_head = u("attention.head_count")?;
        let n_head_kv = u("attention.head_count_kv").unwrap_or(n_head);
        let bad = |key: &str, reason: String| Error::Metadata { key: format!("{arch}.{key}"), reason };
        if n_head == 0 || n_embd % n_head != 0 {
            return Err(bad("attention.head_count", format!("{n_head} heads do not divide {n_embd}")));
        }
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(bad("attention.head_count_kv", format!("{n_head_kv} KV heads do not divide {n_head} heads")));
        }
        let head_dim = n_embd / n_head;
        let rope_dims = u("rope.dimension_count").unwrap_or(head_dim);
        if rope_dims > head_dim || rope_dims % 2 != 0 {
            return Err(bad("rope.dimension_count", format!("{rope_dims} for head size {head_dim}")));
        }
        Ok(LlamaConfig {
            n_embd,
            n_layer: u("block_count")?,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: u("feed_forward_length")?,
            vocab: u("vocab_size").unwrap_or(vocab_fallback),
            context_length: u("context_length")?,
            rope_base: meta.f32(&format!("{arch}.rope.freq_base")).unwrap_or(10_000.0),
            rope_dims,
            rms_eps: meta.f32(&format!("{arch}.attention.layer_norm_rms_epsilon")).unwrap_or(1e-5),
        })
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
