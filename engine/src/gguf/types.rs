//! ggml tensor element types and their block layouts.
//!
//! Each quantized type stores its elements in fixed-size blocks; a row's length must be a
//! whole number of blocks. The ids are ggml's (`enum ggml_type`); ids this reader does not
//! know (the IQ family, removed ids 4 and 5) are rejected when a file is opened, so every
//! [`GgmlType`] value has a known layout.

use std::fmt;

/// A tensor element type with a known block layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)] // ggml's own names, so they match every other tool
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    I8,
    I16,
    I32,
    I64,
    F64,
    BF16,
}

/// `(ggml id, type, elements per block, bytes per block)`.
const TABLE: [(u32, GgmlType, usize, usize); 20] = [
    (0, GgmlType::F32, 1, 4),
    (1, GgmlType::F16, 1, 2),
    (2, GgmlType::Q4_0, 32, 2 + 16),         // f16 d, 32 x 4-bit
    (3, GgmlType::Q4_1, 32, 2 + 2 + 16),     // f16 d, f16 m, 32 x 4-bit
    (6, GgmlType::Q5_0, 32, 2 + 4 + 16),     // f16 d, 32 high bits, 32 x 4-bit
    (7, GgmlType::Q5_1, 32, 2 + 2 + 4 + 16), // f16 d, f16 m, high bits, 4-bit
    (8, GgmlType::Q8_0, 32, 2 + 32),         // f16 d, 32 x i8
    (9, GgmlType::Q8_1, 32, 2 + 2 + 32),     // f16 d, f16 s, 32 x i8
    (10, GgmlType::Q2_K, 256, 16 + 64 + 2 + 2),
    (11, GgmlType::Q3_K, 256, 32 + 64 + 12 + 2),
    (12, GgmlType::Q4_K, 256, 2 + 2 + 12 + 128),
    (13, GgmlType::Q5_K, 256, 2 + 2 + 12 + 32 + 128),
    (14, GgmlType::Q6_K, 256, 128 + 64 + 16 + 2),
    (15, GgmlType::Q8_K, 256, 4 + 256 + 32), // f32 d, 256 x i8, 16 x i16 sums
    (24, GgmlType::I8, 1, 1),
    (25, GgmlType::I16, 1, 2),
    (26, GgmlType::I32, 1, 4),
    (27, GgmlType::I64, 1, 8),
    (28, GgmlType::F64, 1, 8),
    (30, GgmlType::BF16, 1, 2),
];

impl GgmlType {
    /// The type with ggml id `id`, if this reader knows its layout.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|row| row.0 == id).map(|row| row.1)
    }

    /// ggml's id for this type.
    pub fn id(self) -> u32 {
        self.row().0
    }

    /// Elements per block (1 for plain types).
    pub fn block_elems(self) -> usize {
        self.row().2
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.row().3
    }

    /// Bytes for a row of `elems` elements, or `None` when `elems` is not a whole number
    /// of blocks or the size overflows.
    pub fn row_bytes(self, elems: u64) -> Option<u64> {
        let per_block = self.block_elems() as u64;
        if !elems.is_multiple_of(per_block) {
            return None;
        }
        (elems / per_block).checked_mul(self.block_bytes() as u64)
    }

    fn row(self) -> (u32, GgmlType, usize, usize) {
        // Every variant has a row; the fallback only keeps this total without a panic.
        TABLE.iter().copied().find(|row| row.1 == self).unwrap_or((0, GgmlType::F32, 1, 4))
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_layouts_match_ggml() {
        for row in TABLE {
            assert_eq!(GgmlType::from_id(row.0), Some(row.1));
            assert_eq!(row.1.id(), row.0);
        }
        assert_eq!(GgmlType::Q4_1.block_bytes(), 20);
        assert_eq!(GgmlType::Q8_0.block_bytes(), 34);
        assert_eq!(GgmlType::Q4_K.block_bytes(), 144);
        assert_eq!(GgmlType::Q6_K.block_bytes(), 210);
        assert_eq!(GgmlType::Q8_K.block_bytes(), 292);
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(16), None); // IQ2_XXS
    }

    #[test]
    fn row_bytes_requires_whole_blocks() {
        assert_eq!(GgmlType::Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(GgmlType::Q4_1.row_bytes(33), None);
        assert_eq!(GgmlType::F32.row_bytes(3), Some(12));
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None);
    }
}
