//! crossguard's in-process inference engine.
//!
//! It loads a GGUF of the Llama family (`model::Arch`: Llama 1-3, Qwen 2/2.5/3, Gemma 3) in
//! float, legacy or K-quant formats (`backend::cpu::quant`, `kquant`), tokenizes (byte-level
//! BPE or SentencePiece) and renders chats with the model's own vocabulary and template,
//! and generates tokens on the CPU or, through the CUDA backend
//! (`backend::cuda`, kernels compiled at run time), on a GPU,
//! reporting for every token its log-probability, the predictive entropy and whose KV
//! memory it attended to (the paged, owner-checked cache in `kv`). Output can be held to a
//! grammar (a JSON Schema, any JSON object, a Lark grammar: `grammar`), and chat templates
//! are probed so any OpenAI conversation renders (`template`). It knows nothing of
//! HTTP, tenants' API keys, storage or the firewall.
#![deny(unsafe_code)]

pub mod backend;
pub mod engine;
pub mod error;
pub mod fault;
pub mod fetch;
pub mod gguf;
pub mod grammar;
pub mod kv;
pub mod model;
pub mod sample;
pub mod sched;
pub mod serve;
pub mod stop;
pub mod template;
pub mod tokenizer;

pub use error::{Error, Result};

// What a server built on the engine needs, by name at the root: the engine and its
// requests, the scheduler that batches them, tenants' KV ownership, grammars, the
// configuration types and the default model. The modules stay public for the rest.
pub use backend::Device;
pub use engine::{Engine, EngineOptions, FinishReason, GenerateRequest, Generation, KvOptions, TokenEvent};
pub use fault::FaultConfig;
pub use fetch::{default_cache_dir, ensure_default_model};
pub use grammar::{with_layout as json_schema_with_layout, CompiledGrammar, Grammar};
pub use kv::{KvStats, Owner, Tenant};
pub use sample::SamplingParams;
pub use sched::{JobId, Scheduler, SchedulerConfig, StepStats};
pub use serve::{serve, Client as ServeClient, Failure as ServeFailure, Refusal, ServeGauges, Submission};
pub use template::ChatMessage;
