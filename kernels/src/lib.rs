//! CUDA C sources of the engine's GPU kernels, one kernel family per `.cu` file under
//! `cuda/`. This crate only owns the sources and their entry-point names; compiling them
//! (NVRTC, at run time) and launching them is the engine's `cuda` backend's job, so the
//! workspace builds on machines with no CUDA toolkit at all.
//!
//! Every family's source is `cuda/common.cuh` (shared helpers: f16 conversions, warp and
//! block reductions, the q8_1 block, the KV status codes) followed by its own `.cu` file,
//! so NVRTC compiles each as one self-contained translation unit with no include paths.
//! Each `.cu` file opens with what it computes, its launch shape, and its tensors' shapes
//! and types; the engine's launch wrappers follow those comments.
#![forbid(unsafe_code)]

/// One kernel family: a CUDA C translation unit and the `extern "C"` functions it defines.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// Stable id, used as the NVRTC program name and the module cache key.
    pub id: &'static str,
    /// The CUDA C source text (the shared helpers, then the family's file).
    pub source: &'static str,
    /// Names of the `extern "C" __global__` entry points defined in `source`.
    pub entry_points: &'static [&'static str],
}

/// Declares a family: `family!(NAME, "file stem", [entry points])`.
macro_rules! family {
    ($(#[$doc:meta])* $name:ident, $file:literal, [$($entry:literal),+ $(,)?]) => {
        $(#[$doc])*
        pub const $name: KernelSource = KernelSource {
            id: $file,
            source: concat!(include_str!("../cuda/common.cuh"), "\n", include_str!(concat!("../cuda/", $file, ".cu"))),
            entry_points: &[$($entry),+],
        };
    };
}

family!(
    /// Quantized weights (Q4_1, Q8_0) times q8_1 activations: decode and batched.
    MATMUL, "matmul", ["matvec_q4_1", "matmul_q4_1", "matvec_q8_0", "matmul_q8_0"]
);
family!(
    /// Token embedding rows, dequantized.
    EMBED, "embed", ["embed_q4_1", "embed_q8_0"]
);
family!(
    /// RMSNorm of every row, or of gathered rows (before the output head), quantized to q8_1.
    RMS_NORM, "rms_norm", ["rms_norm_q8_1_rows", "rms_norm_q8_1_gather"]
);
family!(
    /// Rotary position embedding of query and key heads.
    ROPE, "rope", ["rope_qk"]
);
family!(
    /// The feed-forward block's SwiGLU, quantized to q8_1.
    SWIGLU, "swiglu", ["swiglu_q8_1"]
);
family!(
    /// Checked writes of keys and values into the paged KV blocks.
    KV_APPEND, "kv_append", ["kv_append"]
);
family!(
    /// Checked paged attention (prefill and decode).
    ATTENTION, "attention", ["paged_attention"]
);
family!(
    /// Zero-fills a released KV block and clears its owner tag.
    ZERO_FILL, "zero_fill", ["zero_fill_block"]
);
family!(
    /// Logit adjustments, softmax, log-softmax, entropy, argmax and top-k over rows of logits.
    SAMPLING, "sampling", ["pick_partial", "pick_final", "log_softmax", "softmax", "top_k"]
);

/// Every kernel family, for ahead-of-time compile checks.
pub const ALL: &[KernelSource] = &[MATMUL, EMBED, RMS_NORM, ROPE, SWIGLU, KV_APPEND, ATTENTION, ZERO_FILL, SAMPLING];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_is_defined_in_its_source() {
        for k in ALL {
            for ep in k.entry_points {
                let needle = format!(" {ep}(");
                let defined =
                    k.source.lines().any(|l| l.starts_with("extern \"C\" __global__ void") && l.contains(&needle));
                assert!(defined, "{}: missing entry point {ep}", k.id);
            }
        }
    }

    #[test]
    fn every_cu_file_is_a_registered_family_and_ids_are_unique() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter_map(|n| n.strip_suffix(".cu").map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        let mut ids: Vec<String> = ALL.iter().map(|k| k.id.to_owned()).collect();
        ids.sort();
        assert_eq!(files, ids);
    }

    #[test]
    fn every_family_opens_with_its_launch_shape_and_tensors() {
        for k in ALL {
            let own = k.source.split_once(&format!("// {}.cu", k.id)).map(|(_, rest)| rest);
            let own = own.unwrap_or_else(|| panic!("{}: the file must open with `// {}.cu`", k.id, k.id));
            assert!(
                own.contains("Launch:") && own.contains("Tensors:"),
                "{}: launch shape and tensors undocumented",
                k.id
            );
        }
    }
}
