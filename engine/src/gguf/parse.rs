//! The GGUF byte-level parser: header, metadata and tensor infos.
//!
//! Works on a byte slice and never indexes it directly: every read goes through
//! [`Cursor::take`], which checks the length first. Every count read from the file is
//! checked against the bytes left *before* anything is allocated for it (a hostile count
//! cannot make us allocate more than the file could describe), and every tensor's extent
//! is checked with overflow-checked arithmetic against the file size. Errors are plain
//! strings naming what is wrong and where; the caller adds the file's name.

use std::collections::HashMap;

use super::metadata::{MetaValue, Metadata};
use super::types::GgmlType;
use super::TensorInfo;

type Parse<T> = std::result::Result<T, String>;

const MAGIC: &[u8; 4] = b"GGUF";
/// ggml's GGML_MAX_DIMS.
const MAX_DIMS: u32 = 4;
/// Arrays of arrays are legal; deeper nesting than this is only ever an attack on the stack.
const MAX_ARRAY_DEPTH: u32 = 2;
const DEFAULT_ALIGNMENT: u64 = 32;

/// What the header and the tables in front of the tensor data describe.
pub(super) struct Layout {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub index: HashMap<String, usize>,
    pub alignment: u64,
    /// Absolute file offset where tensor data starts.
    pub data_start: u64,
}

/// A bounds-checked reader over the file's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.bytes.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize, what: &str) -> Parse<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&end| end <= self.bytes.len());
        match end.and_then(|end| self.bytes.get(self.pos..end).map(|s| (s, end))) {
            Some((slice, end)) => {
                self.pos = end;
                Ok(slice)
            }
            None => Err(format!(
                "truncated: {what} at offset {} needs {n} bytes, only {} left (file size {})",
                self.pos,
                self.remaining(),
                self.bytes.len()
            )),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Parse<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Parse<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Parse<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A count of items each at least `min_item_bytes` long; rejected if the rest of the
    /// file could not hold that many.
    fn count(&mut self, min_item_bytes: usize, what: &str) -> Parse<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let fits =
            usize::try_from(n).ok().filter(|&n| n.checked_mul(min_item_bytes).is_some_and(|b| b <= self.remaining()));
        fits.ok_or_else(|| format!("{what} {n} at offset {at} cannot fit in the {} bytes left", self.remaining()))
    }

    fn string(&mut self, what: &str) -> Parse<String> {
        let len = self.count(1, &format!("{what} length"))?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| format!("{what} is not UTF-8: {e}"))
    }
}

/// Parses everything in front of the tensor data and validates every tensor's extent.
pub(super) fn parse(bytes: &[u8]) -> Parse<Layout> {
    let mut c = Cursor { bytes, pos: 0 };
    let magic = c.array::<4>("magic")?;
    if &magic != MAGIC {
        return Err(format!("not a GGUF file (magic {magic:02x?})"));
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => {}
        1 => return Err("GGUF version 1 is not supported (convert the file to v3)".into()),
        v if v.swap_bytes() <= 3 => return Err("big-endian GGUF is not supported".into()),
        v => return Err(format!("unsupported GGUF version {v}")),
    }
    // Smallest tensor info: name length (8), n_dims (4), one dim (8), type (4), offset (8).
    let n_tensors_at = c.pos;
    let n_tensors = c.u64("tensor count")?;
    // Smallest entry: key length (8), value type (4), a one-byte value.
    let n_kv = c.count(8 + 4 + 1, "metadata count")?;

    let metadata = read_metadata(&mut c, n_kv)?;

    let n_tensors = usize::try_from(n_tensors)
        .ok()
        .filter(|&n| n.checked_mul(32).is_some_and(|b| b <= c.remaining()))
        .ok_or_else(|| {
            format!(
                "tensor count {n_tensors} at offset {n_tensors_at} cannot fit in the {} bytes \
                 left after the metadata",
                c.remaining()
            )
        })?;
    let mut tensors = Vec::with_capacity(n_tensors);
    let mut index = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let info = read_tensor_info(&mut c, i)?;
        if index.insert(info.name.clone(), i).is_some() {
            return Err(format!("tensor {} appears twice", info.name));
        }
        tensors.push(info);
    }

    let alignment = alignment(&metadata)?;
    let data_start = align_up(c.pos as u64, alignment).ok_or_else(|| "tensor data start overflows".to_string())?;
    place_tensors(&mut tensors, data_start, alignment, bytes.len() as u64)?;
    Ok(Layout { version, metadata, tensors, index, alignment, data_start })
}

fn read_metadata(c: &mut Cursor<'_>, n_kv: usize) -> Parse<Metadata> {
    let mut metadata = Metadata::default();
    for i in 0..n_kv {
        let key = c.string(&format!("metadata key #{i}"))?;
        let ty = c.u32(&format!("metadata {key} type"))?;
        let value = read_value(c, ty, 0, &key)?;
        metadata.insert(key, value)?;
    }
    Ok(metadata)
}

/// Fixed size of a scalar value type, or the minimum size of a variable one.
fn min_value_bytes(ty: u32) -> Option<usize> {
    Some(match ty {
        0 | 1 | 7 => 1, // u8, i8, bool
        2 | 3 => 2,     // u16, i16
        4..=6 => 4,     // u32, i32, f32
        8 => 8,         // string: its length
        9 => 4 + 8,     // array: element type and length
        10..=12 => 8,   // u64, i64, f64
        _ => return None,
    })
}

fn read_value(c: &mut Cursor<'_>, ty: u32, depth: u32, key: &str) -> Parse<MetaValue> {
    let what = key;
    Ok(match ty {
        0 => MetaValue::U8(c.array::<1>(what).map(u8::from_le_bytes)?),
        1 => MetaValue::I8(c.array::<1>(what).map(i8::from_le_bytes)?),
        2 => MetaValue::U16(c.array::<2>(what).map(u16::from_le_bytes)?),
        3 => MetaValue::I16(c.array::<2>(what).map(i16::from_le_bytes)?),
        4 => MetaValue::U32(c.u32(what)?),
        5 => MetaValue::I32(c.array::<4>(what).map(i32::from_le_bytes)?),
        6 => MetaValue::F32(c.array::<4>(what).map(f32::from_le_bytes)?),
        7 => match c.array::<1>(what)?[0] {
            0 => MetaValue::Bool(false),
            1 => MetaValue::Bool(true),
            b => return Err(format!("metadata {key}: bool byte {b} is neither 0 nor 1")),
        },
        8 => MetaValue::String(c.string(&format!("metadata {key}"))?),
        9 => read_array(c, depth, key)?,
        10 => MetaValue::U64(c.u64(what)?),
        11 => MetaValue::I64(c.array::<8>(what).map(i64::from_le_bytes)?),
        12 => MetaValue::F64(c.array::<8>(what).map(f64::from_le_bytes)?),
        t => return Err(format!("metadata {key}: unknown value type {t}")),
    })
}

fn read_array(c: &mut Cursor<'_>, depth: u32, key: &str) -> Parse<MetaValue> {
    if depth >= MAX_ARRAY_DEPTH {
        return Err(format!("metadata {key}: arrays nested deeper than {MAX_ARRAY_DEPTH}"));
    }
    let elem_ty = c.u32(&format!("metadata {key} element type"))?;
    let min =
        min_value_bytes(elem_ty).ok_or_else(|| format!("metadata {key}: unknown array element type {elem_ty}"))?;
    let len = c.count(min, &format!("metadata {key} array length"))?;
    let mut items = Vec::with_capacity(len);
    for _ in 0..len {
        items.push(read_value(c, elem_ty, depth + 1, key)?);
    }
    Ok(MetaValue::Array(items))
}

fn read_tensor_info(c: &mut Cursor<'_>, i: usize) -> Parse<TensorInfo> {
    let name = c.string(&format!("tensor #{i} name"))?;
    let n_dims = c.u32(&format!("tensor {name} dimension count"))?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(format!("tensor {name}: {n_dims} dimensions (1 to {MAX_DIMS} allowed)"));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        dims.push(c.u64(&format!("tensor {name} dimension {d}"))?);
    }
    let type_id = c.u32(&format!("tensor {name} type"))?;
    let ty = GgmlType::from_id(type_id).ok_or_else(|| format!("tensor {name}: unsupported ggml type id {type_id}"))?;
    let offset = c.u64(&format!("tensor {name} offset"))?;
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("tensor {name}: element count of dims {dims:?} overflows"))?;
    let row = dims.first().copied().unwrap_or(0);
    if ty.row_bytes(row).is_none() {
        return Err(format!(
            "tensor {name}: row length {row} is not a multiple of {ty}'s block of {}",
            ty.block_elems()
        ));
    }
    let size =
        ty.row_bytes(n_elements).ok_or_else(|| format!("tensor {name}: byte size of dims {dims:?} overflows"))?;
    Ok(TensorInfo { name, ty, dims, n_elements, offset, size })
}

fn alignment(metadata: &Metadata) -> Parse<u64> {
    const KEY: &str = "general.alignment";
    if metadata.get(KEY).is_none() {
        return Ok(DEFAULT_ALIGNMENT);
    }
    let a = metadata.u32(KEY).map_err(|e| e.to_string())?;
    if a == 0 || !a.is_power_of_two() {
        return Err(format!("{KEY} {a} is not a power of two"));
    }
    Ok(a.into())
}

fn align_up(x: u64, alignment: u64) -> Option<u64> {
    Some(x.checked_add(alignment - 1)? / alignment * alignment)
}

/// Turns relative offsets into absolute ones and checks alignment, bounds and overlap.
fn place_tensors(tensors: &mut [TensorInfo], data_start: u64, alignment: u64, file_len: u64) -> Parse<()> {
    for t in tensors.iter_mut() {
        if t.offset % alignment != 0 {
            return Err(format!(
                "tensor {}: data offset {} is not a multiple of the alignment {alignment}",
                t.name, t.offset
            ));
        }
        let start = data_start.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.size));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => t.offset = start,
            _ => {
                return Err(format!(
                    "tensor {}: data [offset {}, len {}] runs past end of file (size {file_len})",
                    t.name,
                    data_start.saturating_add(t.offset),
                    t.size
                ))
            }
        }
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        if let [a, b] = pair {
            if a.offset + a.size > b.offset {
                return Err(format!("tensor {} overlaps tensor {}", a.name, b.name));
            }
        }
    }
    Ok(())
}
