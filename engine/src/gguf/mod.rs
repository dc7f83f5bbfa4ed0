//! GGUF model files: header, metadata, tensor infos and memory-mapped tensor data.
//!
//! [`GgufFile::open`] maps the file read-only and validates the whole layout up front —
//! every count, string and array length, tensor offset, alignment and dims product is
//! checked before use (see `parse.rs`) — so that afterwards [`GgufFile::tensor`] can hand
//! out slices that are exactly the tensor's bytes and never out of bounds. A corrupt or
//! truncated file is an [`Error::Gguf`] saying what is wrong and where, never a panic.
//!
//! Dequantization and the meaning of each tensor belong to the model code; this module
//! only knows layouts. Tensor data is at a multiple of the file's alignment from the start
//! of the mapping (page-aligned), so mapped tensors are aligned in memory too; data of a
//! file built with [`GgufFile::from_bytes`] has no alignment guarantee.

mod metadata;
mod parse;
mod types;

use std::collections::HashMap;
use std::path::Path;

pub use metadata::{MetaValue, Metadata};
pub use types::GgmlType;

use crate::{Error, Result};

/// Where a tensor lives and how it is laid out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// GGUF order: `dims[0]` is the contiguous (row) length.
    pub dims: Vec<u64>,
    /// Product of `dims`.
    pub n_elements: u64,
    /// Absolute offset of the data in the file (validated: aligned, within the file).
    pub offset: u64,
    /// Exact size of the data in bytes.
    pub size: u64,
}

/// One tensor's layout and bytes, borrowed from the file.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'a> {
    pub name: &'a str,
    pub ty: GgmlType,
    /// GGUF order: `dims[0]` is the contiguous (row) length.
    pub dims: &'a [u64],
    /// Exactly the tensor's bytes.
    pub data: &'a [u8],
}

/// The bytes behind a file: a read-only mapping, or an owned buffer (tests, fuzzing).
enum Storage {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mapped(map) => map,
            Storage::Owned(bytes) => bytes,
        }
    }
}

/// A validated GGUF file.
pub struct GgufFile {
    storage: Storage,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    index: HashMap<String, usize>,
    alignment: u64,
    data_start: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("bytes", &self.storage.bytes().len())
            .field("metadata_entries", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish_non_exhaustive()
    }
}

/// Maps `file` read-only.
#[allow(unsafe_code)]
fn map_file(file: &std::fs::File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the mapping is read-only and private to this process. Mutation of the file
    // by another process while mapped would be visible (or fault); model files are never
    // written in place — the fetcher only ever renames complete, verified files into place
    // — and that is the documented contract for any model path given to the engine.
    unsafe { memmap2::Mmap::map(file) }
}

impl GgufFile {
    /// Lets the kernel take back this process's pages of `bytes` (a part of this file's
    /// mapping, such as a tensor's data once it has been packed elsewhere): they stay in the
    /// page cache and come back on the next read, so only the resident set changes. Loading
    /// a model then never holds the whole file and its packed copy at once. Does nothing
    /// for an owned buffer or for bytes outside the mapping.
    pub fn release(&self, bytes: &[u8]) {
        let Storage::Mapped(map) = &self.storage else { return };
        let Some(offset) = (bytes.as_ptr() as usize).checked_sub(map.as_ptr() as usize) else { return };
        if bytes.is_empty() || offset.checked_add(bytes.len()).is_none_or(|end| end > map.len()) {
            return;
        }
        #[allow(unsafe_code)]
        // SAFETY: the mapping is a private, read-only mapping of a file that is never written
        // in place (see `map_file`), so dropping its pages changes no byte a later read sees:
        // that read faults the same file contents back in. (memmap2 widens the range to whole
        // pages; a neighbour's page is then read back in the same way.)
        let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, bytes.len()) };
    }

    /// Opens and validates the GGUF file at `path`, mapping it into memory.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let io_err = |source| Error::Io { path: path.to_path_buf(), source };
        let file = std::fs::File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        // Mapping an empty file fails on some systems; an empty buffer gives the same
        // "truncated" error as any other short file.
        let storage =
            if len == 0 { Storage::Owned(Vec::new()) } else { Storage::Mapped(map_file(&file).map_err(io_err)?) };
        Self::build(storage, &path.display().to_string())
    }

    /// Validates a GGUF image held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::build(Storage::Owned(bytes), "<memory>")
    }

    fn build(storage: Storage, origin: &str) -> Result<GgufFile> {
        let layout =
            parse::parse(storage.bytes()).map_err(|reason| Error::Gguf { origin: origin.to_owned(), reason })?;
        Ok(GgufFile {
            storage,
            version: layout.version,
            metadata: layout.metadata,
            tensors: layout.tensors,
            index: layout.index,
            alignment: layout.alignment,
            data_start: layout.data_start,
        })
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The file's metadata.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Every tensor's layout, in file order.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Alignment of tensor data (from `general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset where the tensor data section starts.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Result<Tensor<'_>> {
        let info = self
            .index
            .get(name)
            .and_then(|&i| self.tensors.get(i))
            .ok_or_else(|| Error::MissingTensor { name: name.to_owned() })?;
        // Validated at open; re-checked here so a logic error can never read out of bounds.
        let data = usize::try_from(info.offset)
            .ok()
            .zip(usize::try_from(info.size).ok())
            .and_then(|(start, len)| self.storage.bytes().get(start..start.checked_add(len)?))
            .ok_or_else(|| Error::Gguf {
                origin: "<mapped file>".into(),
                reason: format!("tensor {name}: data outside the file"),
            })?;
        Ok(Tensor { name: &info.name, ty: info.ty, dims: &info.dims, data })
    }
}

#[cfg(test)]
mod tests;
