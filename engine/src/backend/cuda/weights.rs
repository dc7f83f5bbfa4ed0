//! The model's weights in device memory, uploaded once at load.
//!
//! Owns the upload: quantized matrices go up in their GGUF (ggml) block layouts, byte for
//! byte, read from the file by the names the CPU model loaded them under (so shapes were
//! already checked there); norm weights go up as the CPU model's f32 vectors; the RoPE
//! angle table is built with the CPU's own `ops::rope_table`, so both backends rotate by
//! identical angles.

use std::sync::Arc;

use cudarc::driver::CudaSlice;

use super::device::{cuda_error, Cuda};
use super::launch::DeviceMatrix;
use crate::backend::cpu::{ops, Format, Matrix};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::model::Llama;

/// One transformer block on the device (shapes as in `model::Layer`).
#[derive(Debug)]
pub(crate) struct DeviceLayer {
    /// `[n_embd]`
    pub attn_norm: CudaSlice<f32>,
    /// Wq, Wk, Wv with their rows stacked (one product for all three), or the three apart
    /// when their formats differ.
    pub qkv: Vec<DeviceMatrix>,
    pub wo: DeviceMatrix,
    /// `[n_embd]`
    pub ffn_norm: CudaSlice<f32>,
    /// W_gate then W_up, stacked the same way.
    pub gate_up: Vec<DeviceMatrix>,
    pub down: DeviceMatrix,
}

/// Every weight of the model, on the device.
#[derive(Debug)]
pub(crate) struct DeviceWeights {
    /// `[vocab, n_embd]`
    pub embed: DeviceMatrix,
    pub layers: Vec<DeviceLayer>,
    /// `[n_embd]`
    pub norm: CudaSlice<f32>,
    /// `[vocab, n_embd]`; `None` when tied to `embed`.
    pub output: Option<DeviceMatrix>,
    /// `[max_pos, rope_dims / 2, 2]` (cos, sin)
    pub rope: CudaSlice<f32>,
}

/// What of `model` the CUDA backend cannot run, if anything: a part of the forward pass
/// it lacks (see `Llama::beyond_plain_llama`), or a weight format other than the two its
/// kernels multiply.
pub fn lacks(model: &Llama) -> Option<String> {
    if let Some(what) = model.beyond_plain_llama() {
        return Some(what);
    }
    let layers = model.layers.iter().flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down]);
    let mut matrices = layers.chain([&model.embed]).chain(model.output.as_ref());
    matrices
        .find(|m| !matches!(m.format, Format::Q4_1 | Format::Q8_0))
        .map(|m| format!("{:?} weights ({})", m.format, m.name))
}

impl DeviceWeights {
    /// Uploads `model` (loaded from `file`) with RoPE angles for positions `0..max_pos`.
    pub fn upload(cuda: &Arc<Cuda>, file: &GgufFile, model: &Llama, max_pos: usize) -> Result<DeviceWeights> {
        let c = &model.config;
        if let Some(what) = model.beyond_plain_llama() {
            return Err(Error::CudaArchitecture { what });
        }
        let m = |w: &Matrix| matrix(cuda, file, w);
        let stacked = |ws: &[&Matrix]| stack(cuda, file, ws);
        let v = |x: &[f32]| cuda.stream().clone_htod(x).map_err(cuda_error("weight upload"));
        let layers = model
            .layers
            .iter()
            .map(|l| {
                Ok(DeviceLayer {
                    attn_norm: v(&l.attn_norm)?,
                    qkv: stacked(&[&l.wq, &l.wk, &l.wv])?,
                    wo: m(&l.wo)?,
                    ffn_norm: v(&l.ffn_norm)?,
                    gate_up: stacked(&[&l.gate, &l.up])?,
                    down: m(&l.down)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut table = Vec::with_capacity(max_pos * c.rope_dims);
        let mut angles = Vec::new();
        for pos in 0..max_pos {
            ops::rope_table(pos, c.rope_dims, c.rope_base, 1.0, None, &mut angles);
            table.extend(angles.iter().flat_map(|(cos, sin)| [*cos, *sin]));
        }
        Ok(DeviceWeights {
            embed: m(&model.embed)?,
            layers,
            norm: v(&model.norm)?,
            output: model.output.as_ref().map(m).transpose()?,
            rope: v(&table)?,
        })
    }

    /// The output projection (the embedding when tied).
    pub fn head(&self) -> &DeviceMatrix {
        self.output.as_ref().unwrap_or(&self.embed)
    }
}

/// The ggml bytes of `w` (as stored in `file`) on the device.
fn matrix(cuda: &Cuda, file: &GgufFile, w: &Matrix) -> Result<DeviceMatrix> {
    let data = cuda.stream().clone_htod(bytes(file, w)?).map_err(cuda_error("weight upload"))?;
    Ok(DeviceMatrix { format: w.format, rows: w.rows, cols: w.cols, data })
}

/// Matrices that multiply the same input, as one matrix of their rows stacked in order
/// when they share format and width (ggml rows are independent, so each output row is
/// what it would be alone); else each on its own.
fn stack(cuda: &Cuda, file: &GgufFile, ws: &[&Matrix]) -> Result<Vec<DeviceMatrix>> {
    let Some(first) = ws.first() else { return Ok(Vec::new()) };
    if !ws.iter().all(|w| w.format == first.format && w.cols == first.cols) {
        return ws.iter().map(|w| matrix(cuda, file, w)).collect();
    }
    let mut all = Vec::new();
    for w in ws {
        all.extend_from_slice(bytes(file, w)?);
    }
    let data = cuda.stream().clone_htod(&all).map_err(cuda_error("weight upload"))?;
    Ok(vec![DeviceMatrix { format: first.format, rows: ws.iter().map(|w| w.rows).sum(), cols: first.cols, data }])
}

/// `w`'s bytes in `file`, checked against its shape and a format the kernels read.
fn bytes<'f>(file: &'f GgufFile, w: &Matrix) -> Result<&'f [u8]> {
    if !matches!(w.format, Format::Q4_1 | Format::Q8_0) {
        return Err(Error::CudaFormat { tensor: w.name.clone(), format: format!("{:?}", w.format) });
    }
    let t = file.tensor(&w.name)?;
    let expected = w.format.row_bytes(w.cols).map(|b| b * w.rows);
    if expected != Some(t.data.len()) {
        return Err(Error::Shape {
            tensor: w.name.clone(),
            reason: format!("{} bytes in the file, {expected:?} expected", t.data.len()),
        });
    }
    Ok(t.data)
}
