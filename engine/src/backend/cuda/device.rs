//! The GPU itself: finding the driver and NVRTC libraries, the context and its one stream,
//! and the kernel functions, compiled on first use.
//!
//! Owns the only calls that load NVIDIA's shared libraries. cudarc loads them lazily and
//! panics when one is missing, so every entry point here looks for the library first and
//! turns its absence into [`Error::CudaUnavailable`]: the engine builds and runs on
//! machines without CUDA, and `device = "auto"` falls back to the CPU.
//!
//! Invariants: all work is issued on `stream`, in order; nothing else in the engine
//! creates streams, so stream order is the only synchronisation the kernels need (and
//! cudarc's per-buffer event tracking is switched off).
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;
use kernels::KernelSource;

use super::compile::cached;
use crate::error::{Error, Result};

/// Whether the CUDA driver library (`libcuda.so.1`) can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: loading the library runs its initialisers only; cudarc tries the usual
    // names and keeps nothing loaded.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether the NVRTC library (`libnvrtc.so.12`, e.g. from the PyPI package
/// `nvidia-cuda-nvrtc-cu12` with its `lib` directory on `LD_LIBRARY_PATH`) can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: as for `driver_present`.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// One GPU: its context, the stream everything runs on, and the kernels loaded so far.
pub struct Cuda {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    name: String,
    /// `sm_XY` of the device, the NVRTC target.
    arch: String,
    /// Entry point name -> function (entry point names are unique across families).
    functions: Mutex<HashMap<&'static str, CudaFunction>>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
}

impl fmt::Debug for Cuda {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cuda").field("name", &self.name).field("arch", &self.arch).finish()
    }
}

fn unavailable(reason: impl fmt::Display) -> Error {
    Error::CudaUnavailable { reason: reason.to_string() }
}

/// A failed CUDA call as the engine's error.
pub(crate) fn cuda_error(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Cuda { op, reason: e.to_string() }
}

impl Cuda {
    /// Opens GPU `ordinal`. [`Error::CudaUnavailable`] when the driver or NVRTC library is
    /// missing, there is no such device, or the driver refuses to start.
    pub fn open(ordinal: usize) -> Result<Arc<Cuda>> {
        if !driver_present() {
            return Err(unavailable(
                "the CUDA driver library (libcuda.so.1) was not found: no NVIDIA driver on this machine",
            ));
        }
        if !nvrtc_present() {
            return Err(unavailable("the NVRTC library (libnvrtc.so.12) was not found; install the PyPI package nvidia-cuda-nvrtc-cu12 and put its lib directory on LD_LIBRARY_PATH"));
        }
        let count = CudaContext::device_count().map_err(|e| unavailable(format!("the driver did not start: {e}")))?;
        if usize::try_from(count).map_or(true, |n| ordinal >= n) {
            return Err(unavailable(format!("no GPU {ordinal} ({count} found)")));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| unavailable(format!("GPU {ordinal}: {e}")))?;
        // SAFETY: the engine issues all work on the one stream below, so stream order
        // already orders every read after the writes it depends on.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability().map_err(cuda_error("compute capability"))?;
        let name = ctx.name().map_err(cuda_error("device name"))?;
        let stream = ctx.new_stream().map_err(cuda_error("stream"))?;
        Ok(Arc::new(Cuda {
            ctx,
            stream,
            name,
            arch: format!("sm_{major}{minor}"),
            functions: Mutex::default(),
            modules: Mutex::default(),
        }))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn arch(&self) -> &str {
        &self.arch
    }

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// `entry` of `family`, compiling and loading the family on first use.
    pub(crate) fn function(&self, family: &KernelSource, entry: &'static str) -> Result<CudaFunction> {
        if let Some(f) = self.functions.lock().unwrap_or_else(PoisonError::into_inner).get(entry) {
            return Ok(f.clone());
        }
        let module = self.module(family)?;
        let f = module.load_function(entry).map_err(cuda_error("load function"))?;
        self.functions.lock().unwrap_or_else(PoisonError::into_inner).insert(entry, f.clone());
        Ok(f)
    }

    fn module(&self, family: &KernelSource) -> Result<Arc<CudaModule>> {
        if let Some(m) = self.modules.lock().unwrap_or_else(PoisonError::into_inner).get(family.id) {
            return Ok(m.clone());
        }
        let compiled = cached(family, &self.arch)?;
        // SASS first (no driver JIT); PTX if the driver refuses the cubin.
        let module = match self.ctx.load_module(Ptx::from_binary(compiled.cubin.clone())) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(family = family.id, error = %e, "cubin refused by the driver; loading PTX");
                self.ctx.load_module(Ptx::from_src(compiled.ptx.clone())).map_err(cuda_error("load module"))?
            }
        };
        self.modules.lock().unwrap_or_else(PoisonError::into_inner).insert(family.id, module.clone());
        Ok(module)
    }
}
