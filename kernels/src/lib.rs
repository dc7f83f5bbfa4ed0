//! CUDA C sources of the engine's GPU kernels, one kernel family per `.cu` file under
//! `cuda/`. This crate only owns the sources and their entry-point names; compiling them
//! (NVRTC, at run time) and launching them is the engine's `cuda` backend's job, so the
//! workspace builds on machines with no CUDA toolkit at all.
#![forbid(unsafe_code)]

/// One kernel family: a `.cu` translation unit and the `extern "C"` functions it defines.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// Stable id, used as the NVRTC program name and the module cache key.
    pub id: &'static str,
    /// The CUDA C source text.
    pub source: &'static str,
    /// Names of the `extern "C" __global__` entry points defined in `source`.
    pub entry_points: &'static [&'static str],
}

/// Zero-fills released KV blocks on the device (stream-ordered before reuse).
pub const ZERO_FILL: KernelSource = KernelSource {
    id: "zero_fill",
    source: include_str!("../cuda/zero_fill.cu"),
    entry_points: &["zero_fill_blocks_f32"],
};

/// Every kernel family, for ahead-of-time compile checks.
pub const ALL: &[KernelSource] = &[ZERO_FILL];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_is_defined_in_its_source() {
        for k in ALL {
            for ep in k.entry_points {
                let needle = format!("void {ep}(");
                assert!(k.source.contains(&needle), "{}: missing entry point {ep}", k.id);
            }
        }
    }
}
