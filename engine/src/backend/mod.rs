//! Compute backends. Only the CPU backend exists today; a CUDA twin will share its tests.
//!
//! A backend owns the numeric kernels (quantized matrix products, attention arithmetic)
//! and the threads that run them. It knows nothing of GGUF files, tokenizers or requests:
//! the model hands it byte slices in ggml block layouts and f32 activations.

pub mod cpu;
