//! Weight matrices: checked against their shape, quantized formats packed into the
//! interleaved layout at load (a model's all in one mapping, see `weight_arena`), float
//! formats kept as rows.

use super::packed::{Packed, Scheme, GROUP};
use super::weight_arena;
use super::{kquant, packed, quant, Format, QK};
use crate::error::{Error, Result};

/// A weight matrix `[rows, cols]` (one output per row) in a ggml format.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub name: String,
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    pub(super) storage: Storage,
}

#[derive(Debug, Clone)]
pub(super) enum Storage {
    /// Float formats: `[rows, row_bytes]` as in the file.
    Rows { row_bytes: usize, data: Vec<u8> },
    /// Quantized formats, interleaved for the kernels.
    Packed(Packed),
}

/// A matrix as the model file holds it: `rows` ggml rows of `cols` elements of `format`.
#[derive(Debug)]
pub struct MatrixSource<'a> {
    pub name: String,
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    pub ggml: &'a [u8],
}

impl Matrix {
    /// Checks that `data` (ggml rows, as in the GGUF file) holds exactly `rows x cols`
    /// elements of `format`, and keeps it in the layout the kernels read.
    pub fn new(name: &str, format: Format, rows: usize, cols: usize, data: Vec<u8>) -> Result<Matrix> {
        let row_bytes = checked_row_bytes(name, format, rows, cols, data.len())?;
        check_scales(name, format, &data)?;
        let storage = match Packed::pack(format, rows, cols, &data) {
            Some(p) => Storage::Packed(p),
            None => Storage::Rows { row_bytes, data },
        };
        Ok(Matrix { name: name.to_owned(), format, rows, cols, storage })
    }

    /// The matrices of `sources`, checked as [`new`](Self::new) checks them, the quantized
    /// ones packed side by side in one mapping in huge pages (see `weight_arena`), in the
    /// order given: the order the forward pass reads them keeps its reads sequential.
    /// `release` is told of each source's bytes once they have been read, checked or packed
    /// (`GgufFile::release`), so that a model's file and its packed copy are not resident
    /// together.
    pub fn load_all(sources: &[MatrixSource<'_>], release: impl Fn(&[u8])) -> Result<Vec<Matrix>> {
        let row_bytes = sources
            .iter()
            .map(|s| checked_row_bytes(&s.name, s.format, s.rows, s.cols, s.ggml.len()))
            .collect::<Result<Vec<_>>>()?;
        for s in sources {
            check_scales(&s.name, s.format, s.ggml)?;
            if kquant::is_k(s.format) {
                release(s.ggml);
            }
        }
        let sizes: Vec<usize> =
            sources.iter().map(|s| Packed::packed_bytes(s.format, s.rows, s.cols).unwrap_or(0)).collect();
        let regions = weight_arena::lay_out(&sizes, |i, out| {
            // Floats have no part (and are kept as rows below).
            if let Some(s) = sources.get(i) {
                pack_in_bands(s, out, &release);
            }
        })
        .map_err(|source| Error::Memory { what: "the model's weights", bytes: sizes.iter().sum(), source })?;
        sources
            .iter()
            .zip(row_bytes)
            .zip(regions)
            .map(|((s, row_bytes), region)| {
                let storage = match Scheme::of(s.format) {
                    Some(_) => {
                        Storage::Packed(Packed::in_region(s.format, s.rows, s.cols, region).ok_or_else(|| {
                            Error::Shape { tensor: s.name.clone(), reason: "packed size mismatch".into() }
                        })?)
                    }
                    None => Storage::Rows { row_bytes, data: s.ggml.to_vec() },
                };
                Ok(Matrix { name: s.name.clone(), format: s.format, rows: s.rows, cols: s.cols, storage })
            })
            .collect()
    }

    /// Bytes of this matrix's weight mapping in huge pages now, for a matrix made by
    /// [`load_all`](Self::load_all) (`None` otherwise, or where that cannot be read).
    pub fn mapping_huge_page_bytes(&self) -> Option<usize> {
        match &self.storage {
            Storage::Packed(p) => p.mapping_huge_page_bytes(),
            Storage::Rows { .. } => None,
        }
    }

    /// Row `r` as f32 values (`out.len() == cols`); leaves `out` alone if out of range.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        match &self.storage {
            Storage::Packed(p) => p.dequantize_row(r, out),
            Storage::Rows { .. } => quant::dequantize_row(self.format, self.float_row(r), out),
        }
    }

    /// Whether products read this matrix with quantized activations only (no f32 copy).
    pub fn takes_quantized(&self) -> bool {
        matches!(self.storage, Storage::Packed(_))
    }

    /// Bytes of weight data (what one full pass over the matrix reads).
    pub fn bytes(&self) -> usize {
        match &self.storage {
            Storage::Packed(p) => p.bytes(),
            Storage::Rows { data, .. } => data.len(),
        }
    }

    /// Groups of [`GROUP`] rows: the unit of work of a product.
    pub(super) fn groups(&self) -> usize {
        self.rows.div_ceil(GROUP)
    }

    /// The bytes of row `r` of a float matrix (empty if out of range or quantized).
    pub(super) fn float_row(&self, r: usize) -> &[u8] {
        match &self.storage {
            Storage::Rows { row_bytes, data } => data.get(r * row_bytes..(r + 1) * row_bytes).unwrap_or(&[]),
            Storage::Packed(_) => &[],
        }
    }
}

/// The row size of `rows x cols` elements of `format`, if `len` bytes hold exactly them.
fn checked_row_bytes(name: &str, format: Format, rows: usize, cols: usize, len: usize) -> Result<usize> {
    let row_bytes = format.row_bytes(cols).ok_or_else(|| Error::Shape {
        tensor: name.to_owned(),
        reason: format!("{cols} columns is not a whole number of {format:?} blocks"),
    })?;
    if Some(len) != row_bytes.checked_mul(rows) {
        return Err(Error::Shape {
            tensor: name.to_owned(),
            reason: format!("{len} bytes for {rows}x{cols} {format:?}, expected {}", row_bytes.saturating_mul(rows)),
        });
    }
    Ok(row_bytes)
}

/// Refuses a K-quant matrix with a superblock scale too large for the packed records'
/// f16 scales (see `packed.rs`): no real model comes near, a crafted file would compute
/// infinities.
/// Packs `s` into `out` (its whole part, see `Packed::pack_into`) a band of rows at a time,
/// telling `release` of each band's source bytes once packed, so that even one large
/// tensor (a 262k-token embedding) never has its file pages resident all at once.
fn pack_in_bands(s: &MatrixSource<'_>, out: &mut [u8], release: &impl Fn(&[u8])) {
    /// Rows per band: whole groups, about a megabyte of a wide matrix.
    const BAND_ROWS: usize = 64 * GROUP;
    let (Some(row_bytes), Some(scheme)) = (s.format.row_bytes(s.cols), Scheme::of(s.format)) else { return };
    if row_bytes == 0 {
        return;
    }
    let group_bytes = (s.cols / QK) * scheme.record_bytes();
    for (band, ggml) in s.ggml.chunks(BAND_ROWS * row_bytes).enumerate() {
        let rows = ggml.len() / row_bytes;
        let at = band * (BAND_ROWS / GROUP) * group_bytes;
        let part = out.get_mut(at..at + rows.div_ceil(GROUP) * group_bytes);
        if part.is_some_and(|part| Packed::pack_into(s.format, rows, s.cols, ggml, part).is_some()) {
            release(ggml);
        }
    }
}

fn check_scales(name: &str, format: Format, ggml: &[u8]) -> Result<()> {
    if !kquant::is_k(format) {
        return Ok(());
    }
    match ggml.chunks_exact(format.block_bytes()).position(|b| !packed::scales_fit(format, b)) {
        None => Ok(()),
        Some(i) => Err(Error::Shape {
            tensor: name.to_owned(),
            reason: format!("superblock {i} has a scale past the f16 range"),
        }),
    }
}
