//! The interleaved layout the matrix kernels read quantized weights in.
//!
//! Owns: packing ggml rows into it (once, at load), reading rows back out of it
//! (embedding lookups), and the portable kernel over it, which the SIMD kernels are
//! tested against and which runs on CPUs without AVX2.
//!
//! Why interleave: a ggml row keeps each block's 32 weights together, so a SIMD kernel
//! computes one row at a time and ends every block with a horizontal sum. Here rows go
//! [`GROUP`] at a time and one 32-bit lane of a vector is one row: a single integer
//! multiply-add (`vpdpbusd`) multiplies 4 weights of each of 16 rows with the same 4
//! activation bytes broadcast to every lane, and no horizontal sum is ever needed.
//!
//! Layout of one group, block column after block column, each a contiguous *record*:
//! ```text
//! levels  nibble formats (Q4_0, Q4_1): [4 steps][16 rows][4 bytes]; byte j of a row in
//!         step s holds element 8s+j in its low nibble and 8s+4+j in its high nibble.
//!         byte formats (Q5_0, Q5_1, Q8_0): [8 steps][16 rows][4 bytes], elements 4s..4s+4.
//! d       [16] f16 scales
//! m       [16] f16 minimums (Q4_1, Q5_1 only)
//! ```
//! Levels are unsigned: weight = d * (level - zero) + m, with zero 8 (Q4_0), 16 (Q5_0),
//! 128 (Q8_0, stored as w + 128) or 0. The nibble formats take exactly the bytes of the
//! ggml file; Q5 formats spend a byte per level (+45 %), a price paid by no default model.
//!
//! Invariants: `data` holds `groups * blocks` records; rows past `rows` in the last
//! group are zero (d = 0, m = 0), so they contribute 0 to every product.

use half::f16;

use super::quant::{Format, Q8Block, QK};
use super::weight_arena::Region;

/// Rows per interleaved group: one per 32-bit lane of a 512-bit vector.
pub const GROUP: usize = 16;

/// How a format's levels are stored and turned back into values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scheme {
    /// Two levels per byte (4-bit formats) or one.
    pub nibbles: bool,
    /// Subtracted from every level.
    pub zero: i32,
    /// Whether records carry per-row minimums.
    pub min: bool,
}

impl Scheme {
    /// The scheme of a quantized format; `None` for the float formats.
    pub fn of(format: Format) -> Option<Scheme> {
        let s = |nibbles, zero, min| Some(Scheme { nibbles, zero, min });
        match format {
            Format::Q4_0 => s(true, 8, false),
            Format::Q4_1 => s(true, 0, true),
            Format::Q5_0 => s(false, 16, false),
            Format::Q5_1 => s(false, 0, true),
            Format::Q8_0 => s(false, 128, false),
            Format::F32 | Format::F16 => None,
        }
    }

    /// Bytes of the levels of one record.
    pub const fn levels_bytes(self) -> usize {
        if self.nibbles {
            GROUP * QK / 2
        } else {
            GROUP * QK
        }
    }

    /// Bytes of one record: levels, scales, and minimums if any.
    pub const fn record_bytes(self) -> usize {
        self.levels_bytes() + GROUP * 2 * if self.min { 2 } else { 1 }
    }
}

/// A quantized matrix in the interleaved layout.
#[derive(Debug, Clone)]
pub struct Packed {
    pub scheme: Scheme,
    pub rows: usize,
    /// Blocks per row (`cols / 32`).
    pub blocks: usize,
    /// `[groups, blocks, record_bytes]`
    data: Records,
}

/// Where a packed matrix's records live.
#[derive(Debug, Clone)]
enum Records {
    /// A buffer of its own (a matrix packed by itself).
    Owned(Vec<u8>),
    /// Its part of a model's one weight mapping (see `weight_arena`).
    Shared(Region),
}

impl Records {
    fn bytes(&self) -> &[u8] {
        match self {
            Records::Owned(v) => v,
            Records::Shared(r) => r.bytes(),
        }
    }
}

/// One ggml block decoded: levels, and the raw f16 bits of d and m.
struct Block {
    levels: [u8; QK],
    d: u16,
    m: u16,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Decodes one ggml block (`b` is exactly one block of `format`).
fn decode(format: Format, b: &[u8]) -> Block {
    let mut levels = [0u8; QK];
    let nibble = |qs: &[u8], j: usize| if j < 16 { qs[j] & 0x0f } else { qs[j - 16] >> 4 };
    let qh = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let fifth = |h: u32, j: usize| (((h >> j) & 1) as u8) << 4;
    for (j, l) in levels.iter_mut().enumerate() {
        *l = match format {
            Format::Q4_0 => nibble(&b[2..], j),
            Format::Q4_1 => nibble(&b[4..], j),
            Format::Q5_0 => nibble(&b[6..], j) | fifth(qh(2), j),
            Format::Q5_1 => nibble(&b[8..], j) | fifth(qh(4), j),
            // w + 128 as an unsigned byte: flip the sign bit.
            _ => b[2 + j] ^ 0x80,
        };
    }
    let m = if matches!(format, Format::Q4_1 | Format::Q5_1) { u16_at(b, 2) } else { 0 };
    Block { levels, d: u16_at(b, 0), m }
}

impl Packed {
    /// Bytes of `rows x cols` of `format` packed; `None` for the float formats.
    pub fn packed_bytes(format: Format, rows: usize, cols: usize) -> Option<usize> {
        Some(rows.div_ceil(GROUP) * (cols / QK) * Scheme::of(format)?.record_bytes())
    }

    /// Packs `rows` ggml rows of `format` (`ggml` is `[rows, row_bytes]`, checked by the
    /// caller) into a buffer of its own; `None` for the float formats.
    pub fn pack(format: Format, rows: usize, cols: usize, ggml: &[u8]) -> Option<Packed> {
        let mut data = vec![0u8; Self::packed_bytes(format, rows, cols)?];
        Self::pack_into(format, rows, cols, ggml, &mut data)?;
        Some(Packed { scheme: Scheme::of(format)?, rows, blocks: cols / QK, data: Records::Owned(data) })
    }

    /// Writes what [`pack`](Self::pack) would hold into `out`: zeroed, and exactly
    /// [`packed_bytes`](Self::packed_bytes) long (`None` if it is not, or for floats).
    pub(crate) fn pack_into(format: Format, rows: usize, cols: usize, ggml: &[u8], out: &mut [u8]) -> Option<()> {
        let scheme = Scheme::of(format)?;
        if Some(out.len()) != Self::packed_bytes(format, rows, cols) {
            return None;
        }
        let blocks = cols / QK;
        let (bb, rec) = (format.block_bytes(), scheme.record_bytes());
        for (r, row) in ggml.chunks_exact(blocks * bb).enumerate().take(rows) {
            let (g, lane) = (r / GROUP, r % GROUP);
            for (i, block) in row.chunks_exact(bb).enumerate() {
                let b = decode(format, block);
                let at = (g * blocks + i) * rec;
                let record = &mut out[at..at + rec];
                write_levels(scheme, lane, &b.levels, record);
                let lb = scheme.levels_bytes();
                record[lb + 2 * lane..lb + 2 * lane + 2].copy_from_slice(&b.d.to_le_bytes());
                if scheme.min {
                    let mb = lb + 2 * GROUP;
                    record[mb + 2 * lane..mb + 2 * lane + 2].copy_from_slice(&b.m.to_le_bytes());
                }
            }
        }
        Some(())
    }

    /// The matrix whose records [`pack_into`](Self::pack_into) wrote into `region`
    /// (`None` if the region's length does not fit the shape, or for floats).
    pub(crate) fn in_region(format: Format, rows: usize, cols: usize, region: Region) -> Option<Packed> {
        if Some(region.bytes().len()) != Self::packed_bytes(format, rows, cols) {
            return None;
        }
        Some(Packed { scheme: Scheme::of(format)?, rows, blocks: cols / QK, data: Records::Shared(region) })
    }

    /// Bytes of the mapping holding these records that are in huge pages, for a matrix
    /// in a weight mapping (see `weight_arena`).
    pub(crate) fn mapping_huge_page_bytes(&self) -> Option<usize> {
        match &self.data {
            Records::Shared(r) => r.mapping_huge_page_bytes(),
            Records::Owned(_) => None,
        }
    }

    pub fn groups(&self) -> usize {
        self.rows.div_ceil(GROUP)
    }

    /// The records of group `g` (`[blocks, record_bytes]`; empty if out of range).
    pub fn group(&self, g: usize) -> &[u8] {
        let size = self.blocks * self.scheme.record_bytes();
        self.data.bytes().get(g * size..(g + 1) * size).unwrap_or(&[])
    }

    pub fn bytes(&self) -> usize {
        self.data.bytes().len()
    }

    /// Row `r` as f32 values (`out.len() == blocks * 32`); leaves `out` alone if `r` is
    /// out of range.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        if r >= self.rows {
            return;
        }
        let (s, rec) = (self.scheme, self.scheme.record_bytes());
        let group = self.group(r / GROUP);
        let lane = r % GROUP;
        for (record, o) in group.chunks_exact(rec).zip(out.chunks_exact_mut(QK)) {
            let (d, m) = scales(s, record, lane);
            for (j, v) in o.iter_mut().enumerate() {
                *v = d * (i32::from(level(s, record, lane, j)) - s.zero) as f32 + m;
            }
        }
    }
}

/// Writes the 32 levels of row `lane` into a record.
fn write_levels(s: Scheme, lane: usize, levels: &[u8; QK], record: &mut [u8]) {
    if s.nibbles {
        for step in 0..4 {
            for j in 0..4 {
                let e = 8 * step + j;
                record[step * 64 + lane * 4 + j] = levels[e] | (levels[e + 4] << 4);
            }
        }
    } else {
        for step in 0..8 {
            record[step * 64 + lane * 4..step * 64 + lane * 4 + 4].copy_from_slice(&levels[4 * step..4 * step + 4]);
        }
    }
}

/// Level of element `j` of row `lane` in a record.
fn level(s: Scheme, record: &[u8], lane: usize, j: usize) -> u8 {
    if s.nibbles {
        let (step, k) = (j / 8, j % 8);
        let byte = record[step * 64 + lane * 4 + k % 4];
        if k < 4 {
            byte & 0x0f
        } else {
            byte >> 4
        }
    } else {
        record[(j / 4) * 64 + lane * 4 + j % 4]
    }
}

/// (d, m) of row `lane` in a record, as f32.
fn scales(s: Scheme, record: &[u8], lane: usize) -> (f32, f32) {
    let lb = s.levels_bytes();
    let d = f16::from_bits(u16_at(record, lb + 2 * lane)).to_f32();
    let m = if s.min { f16::from_bits(u16_at(record, lb + 2 * GROUP + 2 * lane)).to_f32() } else { 0.0 };
    (d, m)
}

/// Most activation rows a SIMD kernel call takes.
pub const MAX_TILE: usize = 4;

/// A SIMD kernel's unchecked body: (scheme, group, blocks, activation rows, how many
/// of them are used, output rows). Its contract is what [`SimdKernel::call`] checks.
pub type RawKernel = unsafe fn(Scheme, *const u8, usize, [*const Q8Block; MAX_TILE], usize, *mut [f32; GROUP]);

/// A SIMD kernel this CPU runs: holding one is the proof that its features were found.
#[derive(Clone, Copy)]
pub struct SimdKernel(RawKernel);

impl std::fmt::Debug for SimdKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimdKernel")
    }
}

impl SimdKernel {
    /// # Safety
    /// The CPU must have every feature `raw` is compiled for.
    #[allow(unsafe_code)]
    pub unsafe fn new(raw: RawKernel) -> SimdKernel {
        SimdKernel(raw)
    }

    /// `out[n][lane] = row lane of the group · acts[n]`, if the lengths agree: `group`
    /// whole records, 1..=[`MAX_TILE`] activation rows of at least as many blocks, an
    /// output row for each. Returns `false`, leaving `out` alone, otherwise.
    pub fn call(self, s: Scheme, group: &[u8], acts: &[&[Q8Block]], out: &mut [[f32; GROUP]]) -> bool {
        ActRows::new(acts).is_some_and(|rows| self.call_rows(s, group, &rows, out))
    }

    /// [`call`](Self::call) with rows checked beforehand: a product checks a tile of
    /// tokens once and runs it against many groups.
    pub fn call_rows(self, s: Scheme, group: &[u8], rows: &ActRows<'_>, out: &mut [[f32; GROUP]]) -> bool {
        let rec = s.record_bytes();
        let blocks = group.len() / rec;
        if group.len() != blocks * rec || rows.blocks < blocks || out.len() < rows.n {
            return false;
        }
        // SAFETY: `new`'s contract says the CPU runs the kernel; the lengths were checked
        // here and in `ActRows::new`, which is the rest of its contract.
        #[allow(unsafe_code)]
        unsafe {
            (self.0)(s, group.as_ptr(), blocks, rows.ptrs, rows.n, out.as_mut_ptr())
        };
        true
    }
}

/// 1..=[`MAX_TILE`] activation rows as the pointers a kernel takes, with the fewest
/// blocks any of them holds.
///
/// Why not slices per call: building the pointer array next to the call made the
/// kernel's load of it wait for the stores just made (a load wider than the stores it
/// reads cannot be forwarded from them), a few percent of a prefill.
#[derive(Clone, Copy)]
pub struct ActRows<'a> {
    ptrs: [*const Q8Block; MAX_TILE],
    rows: [&'a [Q8Block]; MAX_TILE],
    n: usize,
    blocks: usize,
}

impl<'a> ActRows<'a> {
    /// `None` unless there are 1..=[`MAX_TILE`] rows.
    pub fn new(acts: &[&'a [Q8Block]]) -> Option<ActRows<'a>> {
        if acts.is_empty() || acts.len() > MAX_TILE {
            return None;
        }
        let rows: [&'a [Q8Block]; MAX_TILE] = std::array::from_fn(|k| acts.get(k).copied().unwrap_or(&[]));
        let ptrs = rows.map(|r| r.as_ptr());
        let blocks = acts.iter().map(|a| a.len()).min().unwrap_or(0);
        Some(ActRows { ptrs, rows, n: acts.len(), blocks })
    }

    /// The rows.
    pub fn rows(&self) -> &[&'a [Q8Block]] {
        &self.rows[..self.n]
    }
}

/// The portable kernel: `out[r] = row r of the group · acts` for the group's 16 rows
/// (`group` is one group's records, `acts` at least `blocks` activation blocks).
pub fn dot_group_scalar(s: Scheme, group: &[u8], acts: &[Q8Block], out: &mut [f32; GROUP]) {
    *out = [0.0; GROUP];
    for (record, q) in group.chunks_exact(s.record_bytes()).zip(acts) {
        for (lane, o) in out.iter_mut().enumerate() {
            let dot: i32 = (0..QK).map(|j| i32::from(level(s, record, lane, j)) * i32::from(q.qs[j])).sum();
            let (d, m) = scales(s, record, lane);
            *o += d * q.d * (dot - s.zero * q.isum) as f32 + m * q.s;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::quant::{dequantize_row, dot_q8_scalar, quantize_q8, quantize_row, tests::wave};
    use super::*;

    pub(crate) type TestResult = Result<(), Box<dyn std::error::Error>>;

    pub(crate) const QUANTS: [Format; 5] = [Format::Q4_0, Format::Q4_1, Format::Q5_0, Format::Q5_1, Format::Q8_0];

    /// `rows` ggml rows of `format` with distinct values per row.
    pub(crate) fn ggml_rows(format: Format, rows: usize, cols: usize) -> Vec<u8> {
        (0..rows).flat_map(|r| quantize_row(format, &wave(cols, r as f32 * 0.7 - 3.0))).collect()
    }

    pub(crate) fn packed(format: Format, rows: usize, cols: usize) -> Result<Packed, String> {
        Packed::pack(format, rows, cols, &ggml_rows(format, rows, cols)).ok_or(format!("{format:?} does not pack"))
    }

    pub(crate) fn activations(cols: usize, seed: f32) -> Vec<Q8Block> {
        let mut a = vec![Q8Block::default(); cols / QK];
        quantize_q8(&wave(cols, seed), &mut a);
        a
    }

    /// Runs `kernel` on every format, group and tile width and compares each output with
    /// the portable kernel. Nothing to do on a CPU without the kernel's features (`None`).
    pub(crate) fn agrees_with_the_portable_kernel(kernel: Option<SimdKernel>) -> TestResult {
        let Some(kernel) = kernel else { return Ok(()) };
        let (rows, cols, tile) = (40, 576, MAX_TILE);
        let acts: Vec<Vec<Q8Block>> = (0..tile).map(|n| activations(cols, n as f32 * 1.9)).collect();
        for f in QUANTS {
            let p = packed(f, rows, cols)?;
            for g in 0..p.groups() {
                for width in 1..=tile {
                    let refs: Vec<&[Q8Block]> = acts[..width].iter().map(|a| a.as_slice()).collect();
                    let mut out = vec![[0.0f32; GROUP]; tile];
                    assert!(kernel.call(p.scheme, p.group(g), &refs, &mut out), "{f:?}");
                    for n in 0..width {
                        let mut want = [0.0f32; GROUP];
                        dot_group_scalar(p.scheme, p.group(g), &acts[n], &mut want);
                        for lane in 0..GROUP {
                            let (w, o) = (want[lane], out[n][lane]);
                            assert!((w - o).abs() <= 1e-4 * w.abs().max(1.0), "{f:?} g={g} n={n} lane={lane}: {w} vs {o}");
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// A kernel must decline short activations, a torn record and too wide a tile.
    pub(crate) fn refuses_mismatched_lengths(kernel: Option<SimdKernel>) -> TestResult {
        let Some(kernel) = kernel else { return Ok(()) };
        let (p, tile) = (packed(Format::Q4_1, 16, 64)?, MAX_TILE);
        let (short, full) = (vec![Q8Block::default(); 1], activations(64, 0.0));
        let mut out = vec![[0.0f32; GROUP]; tile + 1];
        assert!(!kernel.call(p.scheme, p.group(0), &[&short], &mut out));
        assert!(!kernel.call(p.scheme, &p.group(0)[1..], &[&full], &mut out));
        let too_many = vec![full.as_slice(); tile + 1];
        assert!(!kernel.call(p.scheme, p.group(0), &too_many, &mut out));
        Ok(())
    }

    #[test]
    fn record_sizes_match_the_ggml_bytes_for_nibble_and_q8_formats() {
        for f in [Format::Q4_0, Format::Q4_1, Format::Q8_0] {
            let s = Scheme::of(f).map(|s| s.record_bytes());
            assert_eq!(s, Some(GROUP * f.block_bytes()), "{f:?}");
        }
    }

    #[test]
    fn packed_rows_read_back_as_the_ggml_rows() -> TestResult {
        let (rows, cols) = (37, 96);
        for f in QUANTS {
            let ggml = ggml_rows(f, rows, cols);
            let p = packed(f, rows, cols)?;
            assert_eq!(p.groups(), 3);
            let bytes = f.row_bytes(cols).ok_or("row bytes")?;
            for r in 0..rows {
                let (mut want, mut got) = (vec![0.0; cols], vec![0.0; cols]);
                dequantize_row(f, &ggml[r * bytes..(r + 1) * bytes], &mut want);
                p.dequantize_row(r, &mut got);
                assert_eq!(want, got, "{f:?} row {r}");
            }
        }
        Ok(())
    }

    #[test]
    fn portable_kernel_matches_the_ggml_reference_and_pads_with_zeros() -> TestResult {
        let (rows, cols) = (21, 128);
        let acts = activations(cols, 0.4);
        for f in QUANTS {
            let ggml = ggml_rows(f, rows, cols);
            let p = packed(f, rows, cols)?;
            let bytes = f.row_bytes(cols).ok_or("row bytes")?;
            for g in 0..p.groups() {
                let mut out = [f32::NAN; GROUP];
                dot_group_scalar(p.scheme, p.group(g), &acts, &mut out);
                for (lane, got) in out.iter().enumerate() {
                    let r = g * GROUP + lane;
                    let want = if r < rows { dot_q8_scalar(f, &ggml[r * bytes..(r + 1) * bytes], &acts) } else { 0.0 };
                    assert!((want - got).abs() <= 1e-4 * want.abs().max(1.0), "{f:?} row {r}: {want} vs {got}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn float_formats_are_not_packed() {
        assert!(Packed::pack(Format::F32, 1, 32, &[0; 128]).is_none());
    }
}
