//! NVRTC: CUDA C kernel families (the `kernels` crate) to PTX, once per process.
//!
//! Owns the compile options (the same for every family, so the numerics are one policy)
//! and the process-wide cache of PTX text keyed by family and target architecture. Loading
//! PTX into a context, and launching, is `device.rs`'s and `launch.rs`'s job.
//!
//! Invariants: NVRTC is called only after its library was found (cudarc panics
//! otherwise); a family is compiled at most once per architecture per process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::nvrtc::{CompileError, CompileOptions};
use kernels::KernelSource;

use super::device::nvrtc_present;
use crate::error::{Error, Result};

/// The architecture CI compiles for when no device says otherwise: the H200's (Hopper).
pub const DEFAULT_ARCH: &str = "sm_90";

/// Options for every family. `--fmad=false` keeps `a * b + c` as two roundings, as on the
/// CPU, so the backends differ only in summation order; precise division and square root
/// are NVRTC's defaults and stay on.
fn options(family: &KernelSource, arch: &str) -> CompileOptions {
    CompileOptions {
        fmad: Some(false),
        ftz: Some(false),
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".to_owned()],
        name: Some(format!("{}.cu", family.id)),
        ..CompileOptions::default()
    }
}

/// Compiles `family` for `arch` (e.g. `sm_90`) and returns its PTX text. Errors: NVRTC
/// missing ([`Error::CudaUnavailable`]) or the compiler's log ([`Error::KernelCompile`]).
pub fn compile_family(family: &KernelSource, arch: &str) -> Result<String> {
    if !nvrtc_present() {
        return Err(Error::CudaUnavailable { reason: "the NVRTC library (libnvrtc.so.12) was not found on the library path".into() });
    }
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(family.source, options(family, arch)).map_err(|e| compile_error(family, e))?;
    Ok(ptx.to_src())
}

/// PTX text by (family id, architecture).
type PtxCache = Mutex<HashMap<(&'static str, String), Arc<str>>>;

/// [`compile_family`] through the process-wide cache.
pub(crate) fn cached_ptx(family: &KernelSource, arch: &str) -> Result<Arc<str>> {
    static CACHE: OnceLock<PtxCache> = OnceLock::new();
    let cache = CACHE.get_or_init(Mutex::default);
    let key = (family.id, arch.to_owned());
    if let Some(ptx) = cache.lock().unwrap_or_else(PoisonError::into_inner).get(&key) {
        return Ok(ptx.clone());
    }
    // Compiled outside the lock: two first users may both compile; the results are equal.
    let ptx: Arc<str> = compile_family(family, arch)?.into();
    cache.lock().unwrap_or_else(PoisonError::into_inner).insert(key, ptx.clone());
    Ok(ptx)
}

fn compile_error(family: &KernelSource, e: CompileError) -> Error {
    let log = match e {
        CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
        other => format!("{other:?}"),
    };
    Error::KernelCompile { family: family.id, log }
}
