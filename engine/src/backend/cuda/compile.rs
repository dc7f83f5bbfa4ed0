//! NVRTC: CUDA C kernel families (the `kernels` crate) to PTX and SASS, once per process.
//!
//! Owns the compile options (the same for every family, so the numerics are one policy)
//! and the process-wide cache keyed by family and target architecture. The engine loads
//! the SASS (a cubin for the device's own architecture): it runs on any driver of the
//! same CUDA major version, where PTX would need a driver at least as new as NVRTC.
//! The PTX stays the fallback and what CI inspects.
//!
//! Invariants: NVRTC is called only after its library was found (cudarc panics
//! otherwise); a family is compiled at most once per architecture per process; every
//! NVRTC program created here is destroyed here.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::nvrtc::{result, sys};
use kernels::KernelSource;

use super::device::nvrtc_present;
use crate::error::{Error, Result};

/// The architecture CI compiles for when no device says otherwise: the H200's (Hopper).
pub const DEFAULT_ARCH: &str = "sm_90";

/// What NVRTC made of one family for one architecture.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// PTX text.
    pub ptx: String,
    /// SASS for the architecture, as an ELF cubin.
    pub cubin: Vec<u8>,
}

/// Options for every family. `--fmad=false` keeps `a * b + c` as two roundings, as on the
/// CPU, so the backends differ only in summation order; precise division and square root
/// are NVRTC's defaults and stay on.
fn options(arch: &str) -> Vec<String> {
    vec![format!("--gpu-architecture={arch}"), "--fmad=false".into(), "--ftz=false".into(), "--std=c++17".into()]
}

/// Destroys the program when compilation is over, whatever happened.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program was created by `create_program` and is destroyed once.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

fn text(chars: Vec<c_char>) -> String {
    let bytes: Vec<u8> = chars.into_iter().map(|c| c as u8).take_while(|b| *b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Compiles `family` for `arch` (a real architecture, e.g. `sm_90`). Errors: NVRTC missing
/// ([`Error::CudaUnavailable`]) or the compiler's log ([`Error::KernelCompile`]).
pub fn compile_family(family: &KernelSource, arch: &str) -> Result<Compiled> {
    if !nvrtc_present() {
        return Err(Error::CudaUnavailable {
            reason: "the NVRTC library (libnvrtc.so.12) was not found on the library path".into(),
        });
    }
    let fail = |log: String| Error::KernelCompile { family: family.id, log };
    let src = CString::new(family.source).map_err(|_| fail("the source contains a NUL byte".into()))?;
    let name = CString::new(format!("{}.cu", family.id)).map_err(|_| fail("the id contains a NUL byte".into()))?;
    let prog = Program(result::create_program(&src, Some(&name)).map_err(|e| fail(e.to_string()))?);
    // SAFETY: `prog` is a live program (above); the options are NUL-free strings.
    if let Err(e) = unsafe { result::compile_program(prog.0, &options(arch)) } {
        // SAFETY: as above; the log exists once compilation ran.
        let log = unsafe { result::get_program_log(prog.0) }.map(text).unwrap_or_default();
        return Err(fail(if log.is_empty() { e.to_string() } else { log }));
    }
    // SAFETY: the program compiled; NVRTC owns the PTX until it is copied out here.
    let ptx = text(unsafe { result::get_ptx(prog.0) }.map_err(|e| fail(e.to_string()))?);
    let mut size = 0usize;
    // SAFETY: the program compiled for a real architecture, so it holds a cubin of `size`
    // bytes, which NVRTC copies into a buffer of exactly that size.
    let cubin = unsafe {
        sys::nvrtcGetCUBINSize(prog.0, &mut size).result().map_err(|e| fail(format!("no cubin: {e}")))?;
        let mut buf = vec![0 as c_char; size];
        sys::nvrtcGetCUBIN(prog.0, buf.as_mut_ptr()).result().map_err(|e| fail(format!("no cubin: {e}")))?;
        buf.into_iter().map(|c| c as u8).collect()
    };
    Ok(Compiled { ptx, cubin })
}

/// Compiled families by (family id, architecture).
type Cache = Mutex<HashMap<(&'static str, String), Arc<Compiled>>>;

/// [`compile_family`] through the process-wide cache.
pub(crate) fn cached(family: &KernelSource, arch: &str) -> Result<Arc<Compiled>> {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Mutex::default);
    let key = (family.id, arch.to_owned());
    if let Some(c) = cache.lock().unwrap_or_else(PoisonError::into_inner).get(&key) {
        return Ok(c.clone());
    }
    // Compiled outside the lock: two first users may both compile; the results are equal.
    let compiled = Arc::new(compile_family(family, arch)?);
    cache.lock().unwrap_or_else(PoisonError::into_inner).insert(key, compiled.clone());
    Ok(compiled)
}
