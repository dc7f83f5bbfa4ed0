//! Typed launches of every kernel of the `kernels` crate: the only place the engine calls
//! into device code.
//!
//! Each wrapper checks that the buffers it is given hold at least what the kernel's
//! launch comment (in its `.cu` file) says it reads and writes, converts sizes to the
//! kernel's 32-bit types, then launches on the engine's one stream. The `unsafe` launch
//! is sound when (a) the argument list matches the kernel's C signature in order and
//! type, and (b) every index the kernel computes stays inside the buffers: (a) is written
//! once here next to the signature, (b) is what the checks establish.
#![allow(unsafe_code)]

use cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};

use super::device::{cuda_error, Cuda};
use crate::backend::cpu::Format;
use crate::error::{Error, Result};

/// Bytes of one q8_1 activation block on the device (`struct Q8_1` in common.cuh).
pub(crate) const Q8_1_BYTES: usize = 40;

/// Threads per block of most kernels.
const THREADS: u32 = 256;

/// Weight rows per CTA of the matmul kernels (one warp each).
const MATMUL_ROWS_PER_CTA: usize = 8;

/// Tokens per warp of `matmul_*` (`MATMUL_TILE` in matmul.cu).
const MATMUL_TILE: usize = 16;

/// Dynamic shared memory a CTA may take without raising the function's limit.
const SHARED_BYTES: usize = 48 * 1024;

fn u32_of(what: &'static str, v: usize) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| Error::Cuda { op: what, reason: format!("{v} does not fit the kernel's 32-bit index") })
}

fn need<T>(what: &'static str, len: usize, at_least: usize) -> Result<()> {
    if len < at_least {
        return Err(Error::Cuda {
            op: what,
            reason: format!(
                "buffer of {len} {} holds less than the {at_least} the launch needs",
                std::any::type_name::<T>()
            ),
        });
    }
    Ok(())
}

fn config(grid: (usize, usize), threads: u32) -> Result<LaunchConfig> {
    Ok(LaunchConfig {
        grid_dim: (u32_of("grid", grid.0.max(1))?, u32_of("grid", grid.1.max(1))?, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// A quantized weight matrix on the device: ggml rows back to back.
#[derive(Debug)]
pub(crate) struct DeviceMatrix {
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    /// `[rows, cols / 32 * block_bytes]`
    pub data: CudaSlice<u8>,
}

/// Where a product's rows go: `out[t, col_offset + r]` of an `[tokens, ld]` buffer, added
/// to what is there when `accumulate`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Output {
    pub ld: usize,
    pub col_offset: usize,
    pub accumulate: bool,
}

/// `out (+)= w · a` for `tokens` rows of q8_1 activations `a` (`[tokens, w.cols / 32]`).
pub(crate) fn matmul(
    cuda: &Cuda,
    w: &DeviceMatrix,
    a: &CudaSlice<u8>,
    tokens: usize,
    out: &mut CudaSlice<f32>,
    into: Output,
) -> Result<()> {
    need::<u8>("matmul activations", a.len(), tokens * w.cols / 32 * Q8_1_BYTES)?;
    need::<u8>("matmul weights", w.data.len(), w.rows * w.cols / 32 * w.format.block_bytes())?;
    if into.col_offset + w.rows > into.ld {
        return Err(Error::Cuda {
            op: "matmul",
            reason: format!("columns {}..{} outside a row of {}", into.col_offset, into.col_offset + w.rows, into.ld),
        });
    }
    need::<f32>("matmul output", out.len(), tokens * into.ld)?;
    let tile = if tokens == 1 { 1 } else { MATMUL_TILE };
    let entry = match (w.format, tile) {
        (Format::Q4_1, 1) => "matvec_q4_1",
        (Format::Q4_1, _) => "matmul_q4_1",
        (Format::Q8_0, 1) => "matvec_q8_0",
        (Format::Q8_0, _) => "matmul_q8_0",
        (other, _) => return Err(Error::CudaFormat { tensor: "matmul".into(), format: format!("{other:?}") }),
    };
    let f = cuda.function(&kernels::MATMUL, entry)?;
    let (rows, cols, t) = (u32_of("rows", w.rows)?, u32_of("cols", w.cols)?, u32_of("tokens", tokens)?);
    let (ld, off, acc) = (u32_of("ld", into.ld)?, u32_of("col_offset", into.col_offset)?, u32::from(into.accumulate));
    // Stage the token tile's activations in shared memory when there is a tile and it fits.
    let tile_bytes = tile * w.cols / 32 * Q8_1_BYTES;
    let staged = tile > 1 && tile_bytes <= SHARED_BYTES;
    let mut cfg = config((w.rows.div_ceil(MATMUL_ROWS_PER_CTA), tokens.div_ceil(tile)), THREADS)?;
    if staged {
        cfg.shared_mem_bytes = u32_of("shared memory", tile_bytes)?;
    }
    let stage = u32::from(staged);
    let mut b = cuda.stream().launch_builder(&f);
    b.arg(&w.data).arg(&rows).arg(&cols).arg(a).arg(&t).arg(out).arg(&ld).arg(&off).arg(&acc).arg(&stage);
    // SAFETY: matmul_*(const u8* w, u32 rows, u32 cols, const Q8_1* a, u32 tokens, float* out,
    // u32 ld_out, u32 col_offset, u32 accumulate, u32 staged); w holds rows whole ggml rows,
    // a tokens rows of blocks, out tokens rows of ld with col_offset + rows <= ld (checked
    // above); when staged, the CTA copies at most tile rows of blocks into the dynamic
    // shared memory sized for exactly that.
    unsafe { b.launch(cfg) }.map_err(cuda_error("matmul"))?;
    Ok(())
}

/// `out[t] = dequantized row ids[t]` of the embedding `w`; `out` `[tokens, w.cols]`.
pub(crate) fn embed(cuda: &Cuda, w: &DeviceMatrix, ids: &CudaView<'_, u32>, out: &mut CudaSlice<f32>) -> Result<()> {
    let tokens = ids.len();
    need::<f32>("embed", out.len(), tokens * w.cols)?;
    let entry = match w.format {
        Format::Q4_1 => "embed_q4_1",
        Format::Q8_0 => "embed_q8_0",
        other => return Err(Error::CudaFormat { tensor: "token_embd.weight".into(), format: format!("{other:?}") }),
    };
    let f = cuda.function(&kernels::EMBED, entry)?;
    let (vocab, cols) = (u32_of("vocab", w.rows)?, u32_of("cols", w.cols)?);
    let cfg = config((tokens, 1), THREADS)?;
    let mut b = cuda.stream().launch_builder(&f);
    b.arg(&w.data).arg(ids).arg(&vocab).arg(&cols).arg(out);
    // SAFETY: embed_*(const u8* w, const u32* ids, u32 vocab, u32 cols, float* out); one CTA
    // per id; ids >= vocab give zero rows in the kernel; out holds tokens rows (checked).
    unsafe { b.launch(cfg) }.map_err(cuda_error("embed"))?;
    Ok(())
}

/// Which rows of `x` RMSNorm reads.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Rows<'a, 'b> {
    /// The first `n` rows.
    All(usize),
    /// The listed rows (each sequence's last one, before the output head).
    Listed(&'a CudaView<'b, u32>),
}

/// RMSNorm of `rows` of `x`, quantized into consecutive q8_1 rows of `out`; `x` `[_, cols]`,
/// `out` `[_, cols / 32]` blocks.
pub(crate) fn rms_norm_q8_1(
    cuda: &Cuda,
    x: &CudaSlice<f32>,
    rows: Rows<'_, '_>,
    weight: &CudaSlice<f32>,
    eps: f32,
    cols: usize,
    out: &mut CudaSlice<u8>,
) -> Result<()> {
    need::<f32>("rms_norm weight", weight.len(), cols)?;
    if !cols.is_multiple_of(32) {
        return Err(Error::Cuda { op: "rms_norm", reason: format!("{cols} columns, not whole q8_1 blocks") });
    }
    let c = u32_of("cols", cols)?;
    let n = match rows {
        Rows::All(n) => n,
        Rows::Listed(ids) => ids.len(),
    };
    need::<u8>("rms_norm output", out.len(), n * cols / 32 * Q8_1_BYTES)?;
    let cfg = config((n, 1), THREADS)?;
    match rows {
        Rows::All(n) => {
            need::<f32>("rms_norm input", x.len(), n * cols)?;
            let f = cuda.function(&kernels::RMS_NORM, "rms_norm_q8_1_rows")?;
            let mut b = cuda.stream().launch_builder(&f);
            b.arg(x).arg(weight).arg(&eps).arg(&c).arg(out);
            // SAFETY: rms_norm_q8_1_rows(const float* x, const float* weight, float eps,
            // u32 cols, Q8_1* y); one CTA per row; x holds n rows, out n rows of blocks,
            // weight cols (checked).
            unsafe { b.launch(cfg) }.map_err(cuda_error("rms_norm_q8_1_rows"))?;
        }
        Rows::Listed(ids) => {
            let f = cuda.function(&kernels::RMS_NORM, "rms_norm_q8_1_gather")?;
            let mut b = cuda.stream().launch_builder(&f);
            b.arg(x).arg(ids).arg(weight).arg(&eps).arg(&c).arg(out);
            // SAFETY: rms_norm_q8_1_gather(const float* x, const u32* row_ids, const float*
            // weight, float eps, u32 cols, Q8_1* y); the caller passes row ids of rows x
            // holds (the last row of each live sequence), out holds one row per id (checked).
            unsafe { b.launch(cfg) }.map_err(cuda_error("rms_norm_q8_1_gather"))?;
        }
    }
    Ok(())
}

/// The shape of the query/key/value rows RoPE and the KV kernels read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heads {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

impl Heads {
    /// Floats of one `[queries, keys, values]` row.
    pub fn row(&self) -> usize {
        (self.n_head + 2 * self.n_head_kv) * self.head_dim
    }
}

/// RoPE of the query and key heads of `rows` rows of `qkv` in place, at positions `pos`,
/// with the `[max_pos, pairs, 2]` angle table.
pub(crate) fn rope(
    cuda: &Cuda,
    qkv: &mut CudaSlice<f32>,
    table: &CudaSlice<f32>,
    pos: &CudaView<'_, u32>,
    heads: Heads,
    pairs: usize,
) -> Result<()> {
    let rows = pos.len();
    need::<f32>("rope", qkv.len(), rows * heads.row())?;
    if 2 * pairs > heads.head_dim || !table.len().is_multiple_of(2 * pairs.max(1)) {
        return Err(Error::Cuda { op: "rope", reason: format!("{pairs} pairs for head size {}", heads.head_dim) });
    }
    let max_pos = u32_of("max_pos", table.len() / (2 * pairs.max(1)))?;
    let f = cuda.function(&kernels::ROPE, "rope_qk")?;
    let (stride, nq, nkv, hd, p) = (
        u32_of("row", heads.row())?,
        u32_of("heads", heads.n_head)?,
        u32_of("kv heads", heads.n_head_kv)?,
        u32_of("head_dim", heads.head_dim)?,
        u32_of("pairs", pairs)?,
    );
    let cfg = config((rows, 1), THREADS)?;
    let mut b = cuda.stream().launch_builder(&f);
    b.arg(qkv).arg(table).arg(pos).arg(&max_pos).arg(&stride).arg(&nq).arg(&nkv).arg(&hd).arg(&p);
    // SAFETY: rope_qk(float* qkv, const float* table, const u32* pos, u32 max_pos, u32 row_stride,
    // u32 n_q_heads, u32 n_kv_heads, u32 head_dim, u32 pairs); qkv holds rows rows; the
    // kernel skips positions >= max_pos, so table reads stay inside it.
    unsafe { b.launch(cfg) }.map_err(cuda_error("rope_qk"))?;
    Ok(())
}

/// `h = silu(gate) * up` for `rows` rows, quantized; `gu` `[rows, 2 n_ff]`, `out` `[rows,
/// n_ff / 32]` q8_1 blocks.
pub(crate) fn swiglu_q8_1(
    cuda: &Cuda,
    gu: &CudaSlice<f32>,
    out: &mut CudaSlice<u8>,
    rows: usize,
    n_ff: usize,
) -> Result<()> {
    if !n_ff.is_multiple_of(32) {
        return Err(Error::Cuda { op: "swiglu", reason: format!("{n_ff} columns, not whole q8_1 blocks") });
    }
    need::<f32>("swiglu input", gu.len(), rows * 2 * n_ff)?;
    need::<u8>("swiglu output", out.len(), rows * n_ff / 32 * Q8_1_BYTES)?;
    let f = cuda.function(&kernels::SWIGLU, "swiglu_q8_1")?;
    let n = u32_of("n_ff", n_ff)?;
    let cfg = config(((n_ff / 32).div_ceil(8), rows), THREADS)?;
    let mut b = cuda.stream().launch_builder(&f);
    b.arg(gu).arg(out).arg(&n);
    // SAFETY: swiglu_q8_1(const float* gu, Q8_1* y, u32 n_ff); grid covers rows x n_ff / 32
    // blocks, the kernel drops warps past them; both buffers hold rows rows (checked).
    unsafe { b.launch(cfg) }.map_err(cuda_error("swiglu_q8_1"))?;
    Ok(())
}

/// The batch's view of the paged KV cache, uploaded once per step (see `forward.rs`).
#[derive(Debug)]
pub(crate) struct KvStep<'a> {
    /// `[Σ table_len]` block ids
    pub tables: CudaView<'a, u32>,
    /// `[n_seqs, SEQ_FIELDS]`
    pub seqs: CudaView<'a, u32>,
    /// `[rows]` sequence of each row, `[rows]` position of each row
    pub row_seq: CudaView<'a, u32>,
    pub row_pos: CudaView<'a, u32>,
    /// `[total_blocks]` owner tag of each block
    pub tags: CudaView<'a, u32>,
    pub n_seqs: usize,
}

/// The pool's geometry as the KV kernels index it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KvGeometry {
    pub layers: usize,
    pub block_tokens: usize,
    pub kv_dim: usize,
    pub total_blocks: usize,
}

impl KvGeometry {
    /// f16 values of one block: `[2, layers, block_tokens, kv_dim]`.
    pub fn block_halves(&self) -> usize {
        2 * self.layers * self.block_tokens * self.kv_dim
    }

    fn args(&self) -> Result<[u32; 4]> {
        Ok([
            u32_of("layers", self.layers)?,
            u32_of("block_tokens", self.block_tokens)?,
            u32_of("kv_dim", self.kv_dim)?,
            u32_of("blocks", self.total_blocks)?,
        ])
    }

    fn check(&self, what: &'static str, kv: &CudaSlice<u16>, step: &KvStep<'_>, status: &CudaSlice<u32>) -> Result<()> {
        need::<u16>(what, kv.len(), self.total_blocks * self.block_halves())?;
        need::<u32>(what, step.tags.len(), self.total_blocks)?;
        need::<u32>(what, step.seqs.len(), step.n_seqs * SEQ_FIELDS)?;
        need::<u32>(what, status.len(), step.n_seqs * 3)?;
        need::<u32>(what, step.row_seq.len(), step.row_pos.len())
    }
}

/// u32 fields per sequence in `KvStep::seqs` (`SEQ_FIELDS` in common.cuh).
pub(crate) const SEQ_FIELDS: usize = 5;

#[allow(clippy::too_many_arguments)] // one per kernel operand group; a struct would only rename them
/// Writes this step's (rotated) keys and values of `layer` into the paged cache, each
/// write checked in the kernel; refusals land in `status` (`[n_seqs, 3]`).
pub(crate) fn kv_append(
    cuda: &Cuda,
    qkv: &CudaSlice<f32>,
    heads: Heads,
    kv: &mut CudaSlice<u16>,
    geo: KvGeometry,
    step: &KvStep<'_>,
    status: &mut CudaSlice<u32>,
    layer: usize,
) -> Result<()> {
    let rows = step.row_pos.len();
    need::<f32>("kv_append", qkv.len(), rows * heads.row())?;
    geo.check("kv_append", kv, step, status)?;
    let f = cuda.function(&kernels::KV_APPEND, "kv_append")?;
    let (stride, k_off, l) =
        (u32_of("row", heads.row())?, u32_of("k_offset", heads.n_head * heads.head_dim)?, u32_of("layer", layer)?);
    let [layers, bt, kv_dim, total] = geo.args()?;
    let cfg = config((rows, 1), THREADS)?;
    let mut b = cuda.stream().launch_builder(&f);
    b.arg(qkv)
        .arg(&stride)
        .arg(&k_off)
        .arg(kv)
        .arg(&step.tags)
        .arg(&step.tables)
        .arg(&step.seqs)
        .arg(&step.row_seq)
        .arg(&step.row_pos);
    b.arg(status).arg(&l).arg(&layers).arg(&bt).arg(&kv_dim).arg(&total);
    // SAFETY: kv_append(const float* qkv, u32 row_stride, u32 k_offset, u16* kv, const u32* tags,
    // const u32* tables, const u32* seqs, const u32* row_seq, const u32* row_pos, u32* status,
    // u32 layer, u32 layers, u32 block_tokens, u32 kv_dim, u32 total_blocks). The kernel
    // writes only into blocks < total_blocks (kv holds them all, checked) found through
    // the tables at offsets the host built from the same upload; rows index seqs/status
    // through row_seq values < n_seqs (built by the host).
    unsafe { b.launch(cfg) }.map_err(cuda_error("kv_append"))?;
    Ok(())
}

/// What the attention kernel needs besides the cache.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttentionArgs {
    pub layer: usize,
    pub heads: Heads,
    pub scale: f32,
    /// Longest row visible this step (`scores` holds `[rows, n_head, max_visible]`).
    pub max_visible: usize,
    pub check_owner: bool,
    pub check_bounds: bool,
}

/// Checked paged attention of `rows` query rows of `qkv` into q8_1 blocks `out`
/// (`[rows, q_dim / 32]`, what the output projection reads).
#[allow(clippy::too_many_arguments)] // as kv_append
pub(crate) fn attention(
    cuda: &Cuda,
    qkv: &CudaSlice<f32>,
    out: &mut CudaSlice<u8>,
    scores: &mut CudaSlice<f32>,
    kv: &CudaSlice<u16>,
    geo: KvGeometry,
    step: &KvStep<'_>,
    status: &mut CudaSlice<u32>,
    a: AttentionArgs,
) -> Result<()> {
    let rows = step.row_pos.len();
    let h = a.heads;
    let shape_ok = h.head_dim <= THREADS as usize && h.head_dim.is_multiple_of(32) && geo.kv_dim.is_multiple_of(8);
    if !shape_ok || h.n_head_kv == 0 || !h.n_head.is_multiple_of(h.n_head_kv) {
        let reason = format!("head size {} (a multiple of 32, at most {THREADS}), KV row {} (a multiple of 8), {} heads over {} KV heads", h.head_dim, geo.kv_dim, h.n_head, h.n_head_kv);
        return Err(Error::Cuda { op: "attention", reason });
    }
    need::<f32>("attention input", qkv.len(), rows * h.row())?;
    need::<u8>("attention output", out.len(), rows * h.n_head * h.head_dim / 32 * Q8_1_BYTES)?;
    need::<f32>("attention scores", scores.len(), rows * h.n_head * a.max_visible)?;
    geo.check("attention", kv, step, status)?;
    let f = cuda.function(&kernels::ATTENTION, "paged_attention")?;
    let (stride, mv, l) = (u32_of("row", h.row())?, u32_of("max_visible", a.max_visible)?, u32_of("layer", a.layer)?);
    let [layers, bt, kv_dim, total] = geo.args()?;
    let (nh, nkv, hd) = (u32_of("heads", h.n_head)?, u32_of("kv heads", h.n_head_kv)?, u32_of("head_dim", h.head_dim)?);
    let (owner, bounds) = (u32::from(a.check_owner), u32::from(a.check_bounds));
    let cfg = config((h.n_head, rows), THREADS)?;
    let mut b = cuda.stream().launch_builder(&f);
    b.arg(qkv).arg(&stride).arg(out).arg(scores).arg(&mv).arg(kv).arg(&step.tags).arg(&step.tables).arg(&step.seqs);
    b.arg(&step.row_seq).arg(&step.row_pos).arg(status).arg(&l).arg(&layers).arg(&bt).arg(&kv_dim).arg(&total);
    b.arg(&nh).arg(&nkv).arg(&hd).arg(&a.scale).arg(&owner).arg(&bounds);
    // SAFETY: paged_attention(const float* qkv, u32 row_stride, Q8_1* out, float* scores,
    // u32 max_visible, const u16* kv, const u32* tags, const u32* tables, const u32* seqs,
    // const u32* row_seq, const u32* row_pos, u32* status, u32 layer, u32 layers,
    // u32 block_tokens, u32 kv_dim, u32 total_blocks, u32 n_head, u32 n_head_kv,
    // u32 head_dim, float scale, u32 check_owner, u32 check_bounds). Reads of kv happen
    // only after the kernel found every block id in the table and < total_blocks, 16 bytes
    // at a time at 16-byte aligned rows (kv_dim and head_dim multiples of 8, checked); score
    // writes stay below max_visible per row and head (rows past it are refused).
    unsafe { b.launch(cfg) }.map_err(cuda_error("paged_attention"))?;
    Ok(())
}

/// Zero-fills block `id` of the device pool and clears its tag.
pub(crate) fn zero_fill(
    cuda: &Cuda,
    kv: &mut CudaSlice<u16>,
    tags: &mut CudaSlice<u32>,
    geo: KvGeometry,
    id: usize,
) -> Result<()> {
    need::<u16>("zero_fill", kv.len(), geo.total_blocks * geo.block_halves())?;
    need::<u32>("zero_fill", tags.len(), geo.total_blocks)?;
    let f = cuda.function(&kernels::ZERO_FILL, "zero_fill_block")?;
    let (id, words, total) =
        (u32_of("block", id)?, (geo.block_halves() / 2) as u64, u32_of("blocks", geo.total_blocks)?);
    let cfg = config((64, 1), THREADS)?;
    let mut b = cuda.stream().launch_builder(&f);
    b.arg(kv).arg(tags).arg(&id).arg(&words).arg(&total);
    // SAFETY: zero_fill_block(u32* kv, u32* tags, u32 id, u64 block_words, u32 total_blocks);
    // the kernel returns for id >= total_blocks; kv holds total_blocks blocks of
    // block_words words (block_halves is even: a factor 2 for keys and values).
    unsafe { b.launch(cfg) }.map_err(cuda_error("zero_fill_block"))?;
    Ok(())
}

/// Vocabulary entries one CTA of `pick_partial` covers.
pub(crate) const PICK_CHUNK: usize = 1024;

/// f64 values `pick_partial` writes per chunk (`PICK_PARTS` in sampling.cu).
pub(crate) const PICK_PARTS: usize = 5;

/// The device views of one step's logit adjustments: row `r` owns entries
/// `spans[r]..spans[r + 1]` of `ids` and `deltas`, sorted by id, equal ids in order.
pub(crate) struct Adjustments<'a> {
    pub spans: CudaView<'a, u32>,
    pub ids: CudaView<'a, u32>,
    pub deltas: CudaView<'a, f32>,
}

/// Where [`pick`] writes: `[rows]` each.
pub(crate) struct RowStatsOut<'a> {
    pub log_z: &'a mut CudaSlice<f32>,
    pub entropy: &'a mut CudaSlice<f32>,
    pub argmax: &'a mut CudaSlice<u32>,
    pub pick_logit: &'a mut CudaSlice<f32>,
}

/// Per row of `[rows, vocab]` logits: log Z and entropy of the raw row, and the argmax of
/// the row with its adjustments added, with the raw logit there. `part` is the
/// `[rows, chunks, PICK_PARTS]` workspace of the first stage.
pub(crate) fn pick(
    cuda: &Cuda,
    logits: &CudaSlice<f32>,
    rows: usize,
    vocab: usize,
    adjust: &Adjustments<'_>,
    part: &mut CudaSlice<f64>,
    out: RowStatsOut<'_>,
) -> Result<()> {
    let chunks = vocab.div_ceil(PICK_CHUNK);
    need::<f32>("pick", logits.len(), rows * vocab)?;
    need::<u32>("pick spans", adjust.spans.len(), rows + 1)?;
    need::<f64>("pick workspace", part.len(), rows * chunks * PICK_PARTS)?;
    for len in [out.log_z.len(), out.entropy.len(), out.argmax.len(), out.pick_logit.len()] {
        need::<f32>("pick output", len, rows)?;
    }
    if adjust.ids.len() != adjust.deltas.len() {
        return Err(Error::Cuda {
            op: "pick",
            reason: format!("{} ids but {} deltas", adjust.ids.len(), adjust.deltas.len()),
        });
    }
    let (v, chunk, n) = (u32_of("vocab", vocab)?, u32_of("chunk", PICK_CHUNK)?, u32_of("chunks", chunks)?);
    let f = cuda.function(&kernels::SAMPLING, "pick_partial")?;
    let mut b = cuda.stream().launch_builder(&f);
    b.arg(logits).arg(&v).arg(&chunk).arg(&adjust.spans).arg(&adjust.ids).arg(&adjust.deltas).arg(&mut *part);
    // SAFETY: pick_partial(const float* logits, u32 vocab, u32 chunk, const u32* spans, const
    // u32* ids, const float* deltas, double* part); grid (chunks, rows) covers the
    // vocabulary, each CTA writes its own PICK_PARTS values of part (checked to hold them
    // all); the spans index ids and deltas, which the host built together (Plan::build).
    unsafe { b.launch(config((chunks, rows), THREADS)?) }.map_err(cuda_error("pick_partial"))?;
    let f = cuda.function(&kernels::SAMPLING, "pick_final")?;
    let mut b = cuda.stream().launch_builder(&f);
    b.arg(&*part).arg(&n).arg(logits).arg(&v).arg(out.log_z).arg(out.entropy).arg(out.argmax).arg(out.pick_logit);
    // SAFETY: pick_final(const double* part, u32 chunks, const float* logits, u32 vocab,
    // float* log_z, float* entropy, u32* argmax, float* pick_logit); one warp per row reads
    // that row's chunks and writes its outputs, which hold rows entries (checked); the
    // logit it reads is at an id below vocab.
    unsafe { b.launch(config((rows, 1), 32)?) }.map_err(cuda_error("pick_final"))?;
    Ok(())
}

/// The `k` (<= 32) largest logits of each of `rows` rows, largest first.
pub(crate) fn top_k(
    cuda: &Cuda,
    logits: &CudaSlice<f32>,
    rows: usize,
    vocab: usize,
    k: usize,
    ids: &mut CudaSlice<u32>,
    values: &mut CudaSlice<f32>,
) -> Result<()> {
    if k > 32 {
        return Err(Error::Cuda { op: "top_k", reason: format!("k = {k}, at most 32") });
    }
    need::<f32>("top_k", logits.len(), rows * vocab)?;
    need::<u32>("top_k ids", ids.len(), rows * k)?;
    need::<f32>("top_k values", values.len(), rows * k)?;
    let f = cuda.function(&kernels::SAMPLING, "top_k")?;
    let (v, kk) = (u32_of("vocab", vocab)?, u32_of("k", k)?);
    let cfg = config((rows, 1), 1024)?;
    let mut b = cuda.stream().launch_builder(&f);
    b.arg(logits).arg(&v).arg(&kk).arg(ids).arg(values);
    // SAFETY: top_k(const float* logits, u32 vocab, u32 k, u32* top_ids, float* top_values);
    // k <= 32 (the kernel's shared list), outputs hold rows * k (checked).
    unsafe { b.launch(cfg) }.map_err(cuda_error("top_k"))?;
    Ok(())
}
