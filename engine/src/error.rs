//! The engine's one error type. Variants carry the data needed to say what broke.

use std::path::PathBuf;

/// Everything that can go wrong inside the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading a file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Memory could not be mapped.
    #[error("cannot map {bytes} bytes for {what}: {source}")]
    Memory {
        what: &'static str,
        bytes: usize,
        #[source]
        source: std::io::Error,
    },
    /// The default model could not be fetched; `command` is what to run by hand instead.
    #[error("cannot fetch the default model: {reason}\nrun this by hand instead:\n  {command}")]
    ModelFetch { reason: String, command: String },
    /// A downloaded file's digest is not the one pinned in the source.
    #[error("{path}: SHA-256 is {actual}, expected {expected}")]
    ChecksumMismatch { path: PathBuf, expected: String, actual: String },
    /// A GGUF file is malformed, truncated or uses something this reader does not support.
    #[error("{origin}: invalid GGUF: {reason}")]
    Gguf { origin: String, reason: String },
    /// A metadata key is missing or has the wrong type or value.
    #[error("GGUF metadata {key}: {reason}")]
    Metadata { key: String, reason: String },
    /// The model file has no tensor of this name.
    #[error("tensor {name} is missing from the model file")]
    MissingTensor { name: String },
    /// The tokenizer could not be built from the GGUF vocabulary or could not encode/decode.
    #[error("tokenizer: {reason}")]
    Tokenizer { reason: String },
    /// The chat template cannot be compiled or cannot render these messages.
    #[error("chat template: {reason}")]
    Template { reason: String },
    /// An output format (JSON Schema, grammar) cannot be enforced: it is malformed or uses
    /// something the compiler does not support (the reason names it).
    #[error("output format: {reason}")]
    Grammar { reason: String },
    /// Enforcing an output format failed during generation.
    #[error("constrained decoding failed: {reason}")]
    Constraint { reason: String },
    /// A tensor's shape or byte size does not fit what the model or kernel needs.
    #[error("tensor {tensor}: {reason}")]
    Shape { tensor: String, reason: String },
    /// A tensor is stored in a type the CPU kernels cannot multiply.
    #[error("tensor {tensor}: type {ty} is not supported by the CPU backend")]
    UnsupportedTensorType { tensor: String, ty: String },
    /// The prompt does not fit the context window.
    #[error("the prompt has {prompt_tokens} tokens, the context window holds {limit}")]
    ContextOverflow { prompt_tokens: usize, limit: usize },
    /// A generation request is malformed (empty prompt, token id outside the vocabulary...).
    #[error("invalid generation request: {reason}")]
    InvalidRequest { reason: String },
    /// Engine options are out of range (block size, pool size, fault switches).
    #[error("invalid engine options: {reason}")]
    InvalidOptions { reason: String },
    /// The KV cache refused a read or write that would cross isolation; the request is
    /// stopped and no data was returned.
    #[error("KV isolation violation: {violation}")]
    Isolation { violation: crate::kv::Violation },
    /// The scheduler's queue of waiting requests is full.
    #[error("the request queue is full ({limit} waiting)")]
    QueueFull { limit: usize },
    /// Every KV block is in use.
    #[error("the KV cache is full (all {blocks} blocks are in use)")]
    KvExhausted { blocks: usize },
    /// No usable GPU: the driver library is missing, there is no device, or CUDA (or
    /// NVRTC) could not start.
    #[error("CUDA is not available: {reason}")]
    CudaUnavailable { reason: String },
    /// A CUDA call failed: an allocation, a copy or a kernel launch.
    #[error("CUDA {op} failed: {reason}")]
    Cuda { op: &'static str, reason: String },
    /// NVRTC could not compile a kernel family (the log says where).
    #[error("kernel family {family}: NVRTC compilation failed: {log}")]
    KernelCompile { family: &'static str, log: String },
    /// A tensor is stored in a format the CUDA kernels do not multiply.
    #[error("tensor {tensor}: format {format} is not supported by the CUDA backend (Q4_1 and Q8_0 are)")]
    CudaFormat { tensor: String, format: String },
    /// A model needs a part of the forward pass the CUDA backend does not have.
    #[error("the CUDA backend does not run {what} (plain Llama models only); use device = \"cpu\"")]
    CudaArchitecture { what: String },
}

/// The engine's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
