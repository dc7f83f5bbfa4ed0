//! The CUDA backend: the same model and the same KV isolation as the CPU backend, with the
//! arithmetic in the `kernels` crate's CUDA C, compiled at run time by NVRTC.
//!
//! - `device.rs`: finding the driver and NVRTC (their absence is a typed error, never a
//!   panic), the context, the one stream, kernels compiled on first use and cached;
//! - `compile.rs`: NVRTC options, PTX and SASS, and the process-wide cache;
//! - `launch.rs`: one checked, typed wrapper per kernel — the only `unsafe` launches;
//! - `weights.rs`: the model's weights uploaded in their GGUF block layouts;
//! - `kv.rs`: the KV blocks and owner tags in device memory, zero-filled on the stream
//!   when the host pool releases a block;
//! - `forward.rs`: the forward pass, mirroring `model/forward.rs`, with greedy picks made
//!   on the device (only picks, or rows that are asked for, are copied back);
//! - `plan.rs`: a step as the host describes it to the kernels (rows, block tables, owner
//!   tags, greedy adjustments), built without a GPU;
//! - `workspace.rs`: the device buffers a step reuses, grown to the largest step seen;
//! - `graphs.rs`: decode steps captured as CUDA graphs and replayed as one launch;
//! - `stats.rs`: what sampling reports (log Z, entropy, argmax, top-k), on the GPU.
//!
//! Only Q4_1 and Q8_0 weights of plain Llama models are supported (the default model's);
//! other formats are a load error naming the tensor, other architectures (and biases,
//! scaled RoPE) one naming what is missing (`Llama::beyond_plain_llama`). What is deliberately simple is listed in `forward.rs`.

mod compile;
mod device;
mod forward;
mod graphs;
mod kv;
mod launch;
mod plan;
mod stats;
mod weights;
mod workspace;

pub use compile::{compile_family, Compiled, DEFAULT_ARCH};
pub use device::{driver_present, nvrtc_present, Cuda};
pub(crate) use forward::GpuModel;
pub use stats::RowStats;
pub use weights::lacks;
