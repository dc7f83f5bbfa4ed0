//! A Llama-family model (see [`Arch`]): its weights, and the forward pass over a
//! sequence's paged KV cache (`crate::kv`).
//!
//! Owns the tensors of the model, copied out of the GGUF file into owned buffers at load
//! (so the model outlives the file mapping and can be shared across threads), and their
//! shape checks. The arithmetic lives in `forward.rs`; the kernels in `backend::cpu`.
//!
//! Invariants: every matrix has the shape the config implies (checked at load), so the
//! forward pass indexes without further checks on weights.

pub mod config;
mod forward;

pub use config::{Arch, Gate, LlamaConfig, RopePairs};
pub use forward::{Path, Scratch, Segment};

use crate::backend::cpu::{Format, Matrix, MatrixSource};
use crate::error::{Error, Result};
use crate::gguf::{GgmlType, GgufFile, Tensor};

/// One transformer block's weights.
#[derive(Debug)]
pub(crate) struct Layer {
    /// `[n_embd]`
    pub attn_norm: Vec<f32>,
    /// `[q_dim, n_embd]`, `[kv_dim, n_embd]`, `[kv_dim, n_embd]`
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    /// `[n_embd, q_dim]`
    pub wo: Matrix,
    /// Projection biases where the model has them (Qwen 2; some Llama variants):
    /// `[q_dim]`, `[kv_dim]`, `[kv_dim]`, `[n_embd]`.
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub bo: Option<Vec<f32>>,
    /// RMSNorm weights over each query and key head before RoPE (Qwen 3, Gemma 3):
    /// `[head_dim]`.
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// RMSNorm weights of the attention's and the feed-forward's outputs before their
    /// residual adds (Gemma 3): `[n_embd]`.
    pub post_attn_norm: Option<Vec<f32>>,
    pub post_ffn_norm: Option<Vec<f32>>,
    /// `[n_embd]`
    pub ffn_norm: Vec<f32>,
    /// `[n_ff, n_embd]` each
    pub gate: Matrix,
    pub up: Matrix,
    /// `[n_embd, n_ff]`
    pub down: Matrix,
}

/// A loaded model.
#[derive(Debug)]
pub struct Llama {
    pub config: LlamaConfig,
    /// `[vocab, n_embd]`
    pub(crate) embed: Matrix,
    pub(crate) layers: Vec<Layer>,
    /// `[n_embd]`
    pub(crate) norm: Vec<f32>,
    /// `[vocab, n_embd]`; `None` when the head is tied to `embed`.
    pub(crate) output: Option<Matrix>,
    /// `[rope_dims / 2]` divisors of the rotation frequencies (Llama 3's `rope_freqs`).
    pub(crate) rope_freqs: Option<Vec<f32>>,
}

impl Llama {
    /// Loads the weights named as llama.cpp names them (`blk.N.attn_q.weight`, ...).
    pub fn from_gguf(file: &GgufFile, config: LlamaConfig) -> Result<Llama> {
        let c = &config;
        let tied = match file.tensor("output.weight") {
            Ok(_) => false,
            Err(Error::MissingTensor { .. }) => true,
            Err(e) => return Err(e),
        };
        // Every matrix, in the order a forward pass reads them (see `Matrix::load_all`).
        let per_layer = [
            ("attn_q", c.q_dim(), c.n_embd),
            ("attn_k", c.kv_dim(), c.n_embd),
            ("attn_v", c.kv_dim(), c.n_embd),
            ("attn_output", c.n_embd, c.q_dim()),
            ("ffn_gate", c.n_ff, c.n_embd),
            ("ffn_up", c.n_ff, c.n_embd),
            ("ffn_down", c.n_embd, c.n_ff),
        ];
        let mut names: Vec<(String, usize, usize)> = (0..c.n_layer)
            .flat_map(|i| per_layer.map(|(name, rows, cols)| (format!("blk.{i}.{name}.weight"), rows, cols)))
            .collect();
        if !tied {
            names.push(("output.weight".into(), c.vocab, c.n_embd));
        }
        names.push(("token_embd.weight".into(), c.vocab, c.n_embd));
        let sources =
            names.iter().map(|(name, rows, cols)| source(file, name, *rows, *cols)).collect::<Result<Vec<_>>>()?;
        let mut matrices = Matrix::load_all(&sources, |bytes| file.release(bytes))?.into_iter();
        let mut take = || {
            matrices.next().ok_or_else(|| Error::Shape {
                tensor: "model".into(),
                reason: "fewer matrices loaded than named".into(),
            })
        };
        let layers = (0..c.n_layer)
            .map(|i| {
                let optional = |name: &str, len: usize| optional_vector(file, &format!("blk.{i}.{name}"), len);
                let head_norm = |name: &str| match c.arch.norms_heads() {
                    true => vector(file, &format!("blk.{i}.{name}"), c.head_dim).map(Some),
                    false => Ok(None),
                };
                let post_norm = |name: &str| match c.arch {
                    Arch::Gemma3 => vector(file, &format!("blk.{i}.{name}"), c.n_embd).map(Some),
                    Arch::Llama | Arch::Qwen2 | Arch::Qwen3 => Ok(None),
                };
                Ok(Layer {
                    attn_norm: vector(file, &format!("blk.{i}.attn_norm.weight"), c.n_embd)?,
                    wq: take()?,
                    wk: take()?,
                    wv: take()?,
                    wo: take()?,
                    bq: optional("attn_q.bias", c.q_dim())?,
                    bk: optional("attn_k.bias", c.kv_dim())?,
                    bv: optional("attn_v.bias", c.kv_dim())?,
                    bo: optional("attn_output.bias", c.n_embd)?,
                    q_norm: head_norm("attn_q_norm.weight")?,
                    k_norm: head_norm("attn_k_norm.weight")?,
                    post_attn_norm: post_norm("post_attention_norm.weight")?,
                    post_ffn_norm: post_norm("post_ffw_norm.weight")?,
                    ffn_norm: vector(file, &format!("blk.{i}.ffn_norm.weight"), c.n_embd)?,
                    gate: take()?,
                    up: take()?,
                    down: take()?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let output = if tied { None } else { Some(take()?) };
        let rope_freqs = optional_vector(file, "rope_freqs.weight", c.rope_dims / 2)?;
        Ok(Llama {
            embed: take()?,
            norm: vector(file, "output_norm.weight", c.n_embd)?,
            layers,
            output,
            rope_freqs,
            config,
        })
    }

    /// What this model needs beyond the plain Llama block (another architecture, biases,
    /// frequency factors, scaled positions), if anything: for backends that lack it.
    pub fn beyond_plain_llama(&self) -> Option<String> {
        let c = &self.config;
        let l = self.layers.first();
        let biased = l.is_some_and(|l| l.bq.is_some() || l.bk.is_some() || l.bv.is_some() || l.bo.is_some());
        if c.arch != Arch::Llama {
            Some(format!("the {} architecture", c.arch.name()))
        } else if biased {
            Some("projection biases".into())
        } else if self.rope_freqs.is_some() || c.rope_freq_scale != 1.0 || c.logit_softcap.is_some() {
            Some("scaled RoPE frequencies".into())
        } else {
            None
        }
    }

    /// Bytes of the weight mapping the kernels back with huge pages (see
    /// `Matrix::load_all`); `None` where that cannot be read.
    pub fn weights_in_huge_pages(&self) -> Option<usize> {
        self.head().mapping_huge_page_bytes()
    }

    /// Bytes of weights one decode step reads (every matrix once, the embedding row aside).
    pub fn bytes_per_token(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down].iter().map(|m| m.bytes()).sum::<usize>())
            .sum();
        layers + self.head().bytes()
    }

    /// The output projection (the embedding when tied).
    pub(crate) fn head(&self) -> &Matrix {
        self.output.as_ref().unwrap_or(&self.embed)
    }
}

/// The CPU format of a GGUF tensor type, if the kernels support it.
fn format_of(t: &Tensor<'_>) -> Result<Format> {
    Ok(match t.ty {
        GgmlType::F32 => Format::F32,
        GgmlType::F16 => Format::F16,
        GgmlType::Q4_0 => Format::Q4_0,
        GgmlType::Q4_1 => Format::Q4_1,
        GgmlType::Q5_0 => Format::Q5_0,
        GgmlType::Q5_1 => Format::Q5_1,
        GgmlType::Q8_0 => Format::Q8_0,
        GgmlType::BF16 => Format::BF16,
        GgmlType::Q2_K => Format::Q2_K,
        GgmlType::Q3_K => Format::Q3_K,
        GgmlType::Q4_K => Format::Q4_K,
        GgmlType::Q5_K => Format::Q5_K,
        GgmlType::Q6_K => Format::Q6_K,
        other => return Err(Error::UnsupportedTensorType { tensor: t.name.to_owned(), ty: other.to_string() }),
    })
}

/// A 2-D tensor of `rows` rows of `cols` elements, as the file holds it.
fn source<'f>(file: &'f GgufFile, name: &str, rows: usize, cols: usize) -> Result<MatrixSource<'f>> {
    let t = file.tensor(name)?;
    let dims: Vec<usize> = t.dims.iter().map(|d| *d as usize).collect();
    let shape_ok = dims.first() == Some(&cols)
        && dims.get(1).copied().unwrap_or(1) == rows
        && dims.iter().skip(2).all(|d| *d == 1);
    if !shape_ok {
        return Err(Error::Shape {
            tensor: name.to_owned(),
            reason: format!("dims {dims:?}, expected [{cols}, {rows}]"),
        });
    }
    Ok(MatrixSource { name: name.to_owned(), format: format_of(&t)?, rows, cols, ggml: t.data })
}

/// [`vector`], or `None` when the file has no tensor `name`.
fn optional_vector(file: &GgufFile, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
    match file.tensor(name) {
        Ok(_) => vector(file, name, len).map(Some),
        Err(Error::MissingTensor { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A 1-D tensor of `len` values as f32 (norm weights).
fn vector(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let s = source(file, name, 1, len)?;
    let m = Matrix::new(name, s.format, 1, len, s.ggml.to_vec())?;
    let mut out = vec![0.0; len];
    m.dequantize_row(0, &mut out);
    Ok(out)
}
