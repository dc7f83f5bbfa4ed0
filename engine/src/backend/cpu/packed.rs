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
//! levels  nibble formats (Q4_0, Q4_1, Q2_K, Q3_K, Q4_K): [4 steps][16 rows][4 bytes];
//!         byte j of a row in step s holds element 8s+j in its low nibble and 8s+4+j in
//!         its high nibble.
//!         5- and 6-bit formats (Q5_0, Q5_1, Q5_K; Q6_K): the same nibbles, then one or two
//!         planes of [16 rows][4 bytes]: bit e of a row's word in plane p is bit 4 + p of
//!         element e's level.
//!         byte format (Q8_0): [8 steps][16 rows][4 bytes], elements 4s..4s+4.
//! d       [sets][16] f16 scales
//! m       [sets][16] f16 minimums (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K only)
//! ```
//! Levels are unsigned: weight = d * (level - zero) + m, with zero 8 (Q4_0), 16 (Q5_0),
//! 128 (Q8_0, stored as w + 128), 4 (Q3_K), 32 (Q6_K) or 0. A record has one set of scales
//! for its 32 elements, or two (`halves`: elements 0..16, 16..32) for the K-quants whose
//! sub-blocks are 16 long (Q2_K, Q3_K, Q6_K). The 4-, 5- and 6-bit formats take the bytes
//! of the ggml file (Q4_K, Q5_K and Q6_K 11 %, 9 % and 7 % more: f16 scale products);
//! Q2_K and Q3_K spend a nibble per level.
//!
//! K-quant scales are stored as their products with the superblock's scale (`d * sc`,
//! `dmin * m`) rounded to f16: the kernels then treat every format alike, at a relative
//! error of at most 2^-11 per sub-block scale (a load refuses scales past the f16 range).
//! Their minimums multiply the exact integer sum of the activations (`exact_min`), as
//! llama.cpp's q8_K products do, where Q4_1 and Q5_1 take q8_1's f16 sum.
//!
//! Invariants: `data` holds `groups * blocks` records; rows past `rows` in the last
//! group are zero (d = 0, m = 0), so they contribute 0 to every product.

use half::f16;

use super::kquant::{self, QK_K};
use super::quant::{Format, Q8Block, QK};
use super::weight_arena::Region;

/// Rows per interleaved group: one per 32-bit lane of a 512-bit vector.
pub const GROUP: usize = 16;

/// How a format's levels are stored and turned back into values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scheme {
    /// Two levels per byte (4-bit formats) or one.
    pub nibbles: bool,
    /// Planes of fifth (and sixth) bits after the nibbles: 1 for the 5-bit formats, 2 for
    /// Q6_K, 0 otherwise (with `nibbles` only).
    pub planes: usize,
    /// Subtracted from every level.
    pub zero: i32,
    /// Whether records carry per-row minimums.
    pub min: bool,
    /// Whether records carry two sets of scales (and minimums), for elements 0..16 and 16..32.
    pub halves: bool,
    /// Whether minimums multiply `d * Σ q` exactly (the K-quants) rather than q8_1's `s`.
    pub exact_min: bool,
}

impl Scheme {
    /// The scheme of a quantized format; `None` for the float formats.
    pub fn of(format: Format) -> Option<Scheme> {
        let plain = Scheme { nibbles: true, planes: 0, zero: 0, min: false, halves: false, exact_min: false };
        let (nibbles, bytes, five) = (plain, Scheme { nibbles: false, ..plain }, Scheme { planes: 1, ..plain });
        let k = Scheme { exact_min: true, ..plain };
        Some(match format {
            Format::Q4_0 => Scheme { zero: 8, ..nibbles },
            Format::Q4_1 => Scheme { min: true, ..nibbles },
            Format::Q5_0 => Scheme { zero: 16, ..five },
            Format::Q5_1 => Scheme { min: true, ..five },
            Format::Q8_0 => Scheme { zero: 128, ..bytes },
            Format::Q2_K => Scheme { min: true, halves: true, ..k },
            Format::Q3_K => Scheme { zero: 4, halves: true, ..k },
            Format::Q4_K => Scheme { min: true, ..k },
            Format::Q5_K => Scheme { min: true, planes: 1, ..k },
            Format::Q6_K => Scheme { planes: 2, zero: 32, halves: true, ..k },
            Format::F32 | Format::F16 | Format::BF16 => return None,
        })
    }

    /// Sets of scales per record: 2 with `halves`, else 1.
    pub const fn sets(self) -> usize {
        if self.halves {
            2
        } else {
            1
        }
    }

    /// Bytes of the levels of one record (with the plane of fifth bits, if any).
    pub const fn levels_bytes(self) -> usize {
        if self.nibbles {
            GROUP * QK / 2 + GROUP * 4 * self.planes
        } else {
            GROUP * QK
        }
    }

    /// Bytes of one record: levels, scales, and minimums if any.
    pub const fn record_bytes(self) -> usize {
        self.levels_bytes() + GROUP * 2 * self.sets() * if self.min { 2 } else { 1 }
    }

    /// Offset in a record of row `lane`'s f16 scale for set `set`.
    const fn d_at(self, set: usize, lane: usize) -> usize {
        self.levels_bytes() + 2 * (GROUP * set + lane)
    }

    /// Offset in a record of row `lane`'s f16 minimum for set `set`.
    const fn m_at(self, set: usize, lane: usize) -> usize {
        self.d_at(self.sets() + set, lane)
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

/// 32 elements of a ggml row decoded: levels, and d and m per set of scales (per 16
/// elements; the two are equal when the format has one scale per 32).
struct Block {
    levels: [u8; QK],
    d: [f32; 2],
    m: [f32; 2],
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Calls `each` with the 32-element blocks of one ggml block (`b` is exactly one block
/// of `format`): one for the legacy formats, eight for a K-quant superblock.
fn decode_each(format: Format, b: &[u8], mut each: impl FnMut(Block)) {
    if !kquant::is_k(format) {
        return each(decode(format, b));
    }
    let zero = Scheme::of(format).map_or(0, |s| s.zero);
    let sb = kquant::decode(format, b);
    for j in 0..QK_K / QK {
        let levels = std::array::from_fn(|e| (i32::from(sb.q[QK * j + e]) + zero) as u8);
        let (d, m) = ([sb.scale[2 * j], sb.scale[2 * j + 1]], [-sb.min[2 * j], -sb.min[2 * j + 1]]);
        each(Block { levels, d, m });
    }
}

/// Whether a K-quant block's scale products fit the f16 scales of a record (always for
/// the other formats): the largest 6-bit (Q6_K: 8-bit) factor times the block's scales.
pub(crate) fn scales_fit(format: Format, b: &[u8]) -> bool {
    let f16_abs = |at: usize| f16::from_bits(u16_at(b, at)).to_f32().abs();
    let (scales, largest) = match format {
        Format::Q2_K => (vec![f16_abs(80), f16_abs(82)], 15.0),
        Format::Q3_K => (vec![f16_abs(108)], 32.0),
        Format::Q4_K | Format::Q5_K => (vec![f16_abs(0), f16_abs(2)], 63.0),
        Format::Q6_K => (vec![f16_abs(208)], 128.0),
        _ => return true,
    };
    scales.iter().all(|d| d * largest <= f32::from(f16::MAX))
}

/// Decodes one legacy ggml block (`b` is exactly one block of `format`).
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
    let f16_at = |at: usize| f16::from_bits(u16_at(b, at)).to_f32();
    let m = if matches!(format, Format::Q4_1 | Format::Q5_1) { f16_at(2) } else { 0.0 };
    Block { levels, d: [f16_at(0); 2], m: [m; 2] }
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
        let row_bytes = format.row_bytes(cols)?;
        for (r, row) in ggml.chunks_exact(row_bytes).enumerate().take(rows) {
            let (g, lane) = (r / GROUP, r % GROUP);
            let mut i = 0;
            for block in row.chunks_exact(bb) {
                decode_each(format, block, |b| {
                    let at = (g * blocks + i) * rec;
                    let record = &mut out[at..at + rec];
                    write_levels(scheme, lane, &b.levels, record);
                    for set in 0..scheme.sets() {
                        let put = |record: &mut [u8], at: usize, v: f32| {
                            record[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes())
                        };
                        put(record, scheme.d_at(set, lane), b.d[set]);
                        if scheme.min {
                            put(record, scheme.m_at(set, lane), b.m[set]);
                        }
                    }
                    i += 1;
                });
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
            for (j, v) in o.iter_mut().enumerate() {
                let (d, m) = scales(s, record, lane, set_of(s, j));
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
                record[step * 64 + lane * 4 + j] = (levels[e] & 0x0f) | ((levels[e + 4] & 0x0f) << 4);
            }
        }
        for plane in 0..s.planes {
            let bits = levels.iter().enumerate().fold(0u32, |h, (e, l)| h | (u32::from((l >> (4 + plane)) & 1) << e));
            let at = plane_at(plane, lane);
            record[at..at + 4].copy_from_slice(&bits.to_le_bytes());
        }
    } else {
        for step in 0..8 {
            record[step * 64 + lane * 4..step * 64 + lane * 4 + 4].copy_from_slice(&levels[4 * step..4 * step + 4]);
        }
    }
}

/// Offset in a record of row `lane`'s word of plane `plane` (bit 4 + plane of its levels).
const fn plane_at(plane: usize, lane: usize) -> usize {
    GROUP * QK / 2 + GROUP * 4 * plane + 4 * lane
}

/// Level of element `j` of row `lane` in a record.
fn level(s: Scheme, record: &[u8], lane: usize, j: usize) -> u8 {
    if s.nibbles {
        let (step, k) = (j / 8, j % 8);
        let byte = record[step * 64 + lane * 4 + k % 4];
        let nibble = if k < 4 { byte & 0x0f } else { byte >> 4 };
        (0..s.planes).fold(nibble, |level, plane| {
            let at = plane_at(plane, lane);
            let bits = u32::from_le_bytes([record[at], record[at + 1], record[at + 2], record[at + 3]]);
            level | ((((bits >> j) & 1) as u8) << (4 + plane))
        })
    } else {
        record[(j / 4) * 64 + lane * 4 + j % 4]
    }
}

/// The set of scales element `j` of a record uses.
fn set_of(s: Scheme, j: usize) -> usize {
    if s.halves {
        j / 16
    } else {
        0
    }
}

/// (d, m) of row `lane` in a record for set `set`, as f32.
fn scales(s: Scheme, record: &[u8], lane: usize, set: usize) -> (f32, f32) {
    let d = f16::from_bits(u16_at(record, s.d_at(set, lane))).to_f32();
    let m = if s.min { f16::from_bits(u16_at(record, s.m_at(set, lane))).to_f32() } else { 0.0 };
    (d, m)
}

/// Most activation rows a SIMD kernel call takes.
pub const MAX_TILE: usize = 4;

/// A SIMD kernel's unchecked body: (scheme, group, blocks, activation rows, how many
/// of them are used, output rows). Its contract is what [`SimdKernel::call`] checks.
pub type RawKernel = unsafe fn(Scheme, *const u8, usize, [*const Q8Block; MAX_TILE], usize, *mut [f32; GROUP]);

/// A SIMD kernel this CPU runs, for every layout: holding one is the proof that its
/// features were found.
#[derive(Clone, Copy)]
pub struct SimdKernel {
    raw: RawKernel,
}

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
        SimdKernel { raw }
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
            (self.raw)(s, group.as_ptr(), blocks, rows.ptrs, rows.n, out.as_mut_ptr())
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
            for set in 0..s.sets() {
                let elems = if s.halves { 16 * set..16 * set + 16 } else { 0..QK };
                let dot: i32 = elems.clone().map(|j| i32::from(level(s, record, lane, j)) * i32::from(q.qs[j])).sum();
                let isum = q.isum_of(elems);
                let (d, m) = scales(s, record, lane, set);
                let sum = if s.exact_min { q.d * isum as f32 } else { q.s };
                *o += d * q.d * (dot - s.zero * isum) as f32 + m * sum;
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::quant::{dequantize_row, dot_q8_scalar, quantize_q8, quantize_row, tests::wave};
    use super::*;

    pub(crate) type TestResult = Result<(), Box<dyn std::error::Error>>;

    pub(crate) const QUANTS: [Format; 10] = [
        Format::Q4_0,
        Format::Q4_1,
        Format::Q5_0,
        Format::Q5_1,
        Format::Q8_0,
        Format::Q2_K,
        Format::Q3_K,
        Format::Q4_K,
        Format::Q5_K,
        Format::Q6_K,
    ];

    /// `cols` rounded up to whole blocks of `format` (superblocks for the K-quants).
    pub(crate) fn cols_for(format: Format, cols: usize) -> usize {
        cols.next_multiple_of(format.block_elems())
    }

    /// How far a packed K-quant row may be from the ggml row, element by element: its
    /// scales are rounded to f16 (half an ulp: 2^-11 of each term), the others are exact.
    pub(crate) fn scale_rounding(format: Format, terms: f32) -> f32 {
        if kquant::is_k(format) {
            terms * (1.0 / 2048.0) + 1e-6
        } else {
            0.0
        }
    }

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
        let (rows, tile) = (40, MAX_TILE);
        for f in QUANTS {
            let cols = cols_for(f, 576);
            let acts: Vec<Vec<Q8Block>> = (0..tile).map(|n| activations(cols, n as f32 * 1.9)).collect();
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
                            assert!(
                                (w - o).abs() <= 1e-4 * w.abs().max(1.0),
                                "{f:?} g={g} n={n} lane={lane}: {w} vs {o}"
                            );
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
        let rows = 37;
        for f in QUANTS {
            let cols = cols_for(f, 96);
            let ggml = ggml_rows(f, rows, cols);
            let p = packed(f, rows, cols)?;
            assert_eq!(p.groups(), 3);
            let bytes = f.row_bytes(cols).ok_or("row bytes")?;
            for r in 0..rows {
                let (mut want, mut got) = (vec![0.0; cols], vec![0.0; cols]);
                dequantize_row(f, &ggml[r * bytes..(r + 1) * bytes], &mut want);
                p.dequantize_row(r, &mut got);
                // Each value is a scaled level and a minimum, neither larger than the row's
                // largest value twice over.
                let bound = scale_rounding(f, 4.0 * want.iter().fold(0.0f32, |m, v| m.max(v.abs())));
                for (j, (w, g)) in want.iter().zip(&got).enumerate() {
                    assert!((w - g).abs() <= bound, "{f:?} row {r} element {j}: {w} vs {g}");
                }
            }
        }
        Ok(())
    }

    #[test]
    fn portable_kernel_matches_the_ggml_reference_and_pads_with_zeros() -> TestResult {
        let rows = 21;
        for f in QUANTS {
            let cols = cols_for(f, 128);
            let acts = activations(cols, 0.4);
            let ggml = ggml_rows(f, rows, cols);
            let p = packed(f, rows, cols)?;
            let bytes = f.row_bytes(cols).ok_or("row bytes")?;
            for g in 0..p.groups() {
                let mut out = [f32::NAN; GROUP];
                dot_group_scalar(p.scheme, p.group(g), &acts, &mut out);
                for (lane, got) in out.iter().enumerate() {
                    let r = g * GROUP + lane;
                    let row = ggml.get(r * bytes..(r + 1) * bytes).unwrap_or(&[]);
                    let want = if r < rows { dot_q8_scalar(f, row, &acts) } else { 0.0 };
                    let bound = 1e-4 * want.abs().max(1.0) + scale_rounding(f, magnitude(f, row, &acts));
                    assert!((want - got).abs() <= bound, "{f:?} row {r}: {want} vs {got}");
                }
            }
        }
        Ok(())
    }

    /// An upper bound of Σ (|scale * level| + |min|) |a| over a ggml row and its
    /// activations (each term at most twice the row's largest value): what rounding each
    /// scale moves a product by, once multiplied by the rounding.
    pub(crate) fn magnitude(format: Format, row: &[u8], acts: &[Q8Block]) -> f32 {
        let mut w = vec![0.0; acts.len() * QK];
        dequantize_row(format, row, &mut w);
        let largest = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let x: f32 = acts.iter().flat_map(|q| q.qs.map(|v| f32::from(v).abs() * q.d)).sum();
        3.0 * largest * x
    }

    #[test]
    fn float_formats_are_not_packed() {
        assert!(Packed::pack(Format::F32, 1, 32, &[0; 128]).is_none());
    }
}
