//! The engine's public face: load a model, turn chats into prompts, generate tokens.
//!
//! Owns the generation loop of one request: batched prefill of the prompt, then one
//! decode step per token — sample, detokenize incrementally, hold back text that may
//! become a stop sequence, hand a [`TokenEvent`] to the caller — until an end-of-
//! generation token, a stop sequence, the token budget, or the caller says stop.
//!
//! Invariants: every request gets its own sequence in the shared KV pool, owned by its
//! tenant (it reads no other tenant's blocks; only the tenant's own cached prefixes are
//! shared) and its own sampler; each event names the tenants whose KV the step read;
//! text a stop sequence covers is never handed out; each generated token yields exactly
//! one event, so `completion_tokens` equals the events delivered. `generate` blocks:
//! callers on an async runtime run it on a blocking thread.

use std::ops::ControlFlow;
use std::path::Path;

use crate::backend::cpu::Cpu;
use crate::backend::cuda::{Cuda, GpuModel};
use crate::backend::Device;
use crate::error::{Error, Result};
use crate::fault::FaultConfig;
use crate::gguf::GgufFile;
use crate::grammar::{CompiledGrammar, Grammar, Grammars};
use crate::kv::{BlockShape, KvPool, KvStats, Owner, SequenceKv, Tenant, DEFAULT_BLOCK_TOKENS};
use crate::model::{self, Llama, LlamaConfig, Scratch, Segment};
use crate::sample::{GreedyRow, RowNeed, MAX_TOP_LOGPROBS};
use crate::sched::decoding::Decoding;
use crate::template::{ChatMessage, ChatTemplate};
use crate::tokenizer::Tokenizer;

pub use crate::sample::SamplingParams;

/// Prompt tokens per prefill batch: bounds scratch memory on long prompts.
const PREFILL_BATCH_TOKENS: usize = 512;

/// Context window when neither the options nor the model say otherwise.
const DEFAULT_CONTEXT_TOKENS: usize = 8192;

/// Default KV pool size, in full context windows.
const DEFAULT_POOL_CONTEXTS: usize = 4;

/// How to load and run the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineOptions {
    /// Threads for the matrix products (at least 1).
    pub threads: usize,
    /// Context window in tokens; 0 means the model's trained context length.
    pub ctx_tokens: usize,
    /// Where the forward pass runs (the CPU unless asked).
    pub device: Device,
    /// On a GPU, replay repeated decode steps from CUDA graphs (on unless switched off,
    /// e.g. to measure what they bring).
    pub cuda_graphs: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            ctx_tokens: 0,
            device: Device::Cpu,
            cuda_graphs: true,
        }
    }
}

/// How the KV cache is laid out and which isolation defences are (exceptionally) off.
#[derive(Debug, Clone, PartialEq)]
pub struct KvOptions {
    /// Positions per KV block (a power of two).
    pub block_tokens: usize,
    /// Positions the whole pool holds; 0 means four context windows. Memory is touched
    /// only as blocks are used.
    pub pool_tokens: usize,
    pub fault: FaultConfig,
}

impl Default for KvOptions {
    fn default() -> Self {
        KvOptions { block_tokens: DEFAULT_BLOCK_TOKENS, pool_tokens: 0, fault: FaultConfig::default() }
    }
}

/// One generation request (already tokenized).
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub sampling: SamplingParams,
    /// Alternatives to report per token (0..=20).
    pub top_logprobs: usize,
    /// What the output must follow (see [`Engine::compile_grammar`]); `None`: free text.
    pub grammar: Option<CompiledGrammar>,
}

/// One alternative token at a step.
#[derive(Debug, Clone, PartialEq)]
pub struct TopLogprob {
    pub id: u32,
    pub text: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// One generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    pub id: u32,
    /// Text released with this token; text covered by a stop sequence is never released,
    /// and text that might still become one is released with a later token.
    pub text: String,
    /// log p(id) under the model's distribution.
    pub logprob: f32,
    /// Predictive entropy of the model's distribution at this step, in nats.
    pub entropy: f32,
    pub top_logprobs: Vec<TopLogprob>,
    /// Tenants whose KV blocks attention read to produce this token: normally exactly the
    /// request's own tenant (sorted, no repeats).
    pub owners: Vec<Tenant>,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop sequence.
    Stop,
    /// `max_tokens` or the context window.
    Length,
    /// The caller returned `ControlFlow::Break`.
    Cancelled,
}

/// The outcome of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub finish: FinishReason,
}

/// A loaded model ready to serve. `Send + Sync`: requests may run from several threads
/// (their matrix products take turns on the shared thread pool).
#[derive(Debug)]
pub struct Engine {
    model: Llama,
    tokenizer: Tokenizer,
    template: ChatTemplate,
    cpu: Cpu,
    ctx: usize,
    pool: KvPool,
    /// The model on the GPU, when the forward pass runs there.
    gpu: Option<Box<GpuModel>>,
    grammars: Grammars,
}

impl Engine {
    /// Loads the GGUF at `path`: weights, tokenizer and chat template, with the default
    /// KV cache (every isolation defence on).
    pub fn load(path: &Path, options: EngineOptions) -> Result<Engine> {
        Engine::load_with(path, options, KvOptions::default())
    }

    /// [`Engine::load`] with a KV cache laid out (and, for tests, weakened) as `kv` says.
    pub fn load_with(path: &Path, options: EngineOptions, kv: KvOptions) -> Result<Engine> {
        let file = GgufFile::open(path)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        let template = ChatTemplate::from_gguf(&file)?;
        let config = LlamaConfig::from_metadata(file.metadata(), tokenizer.vocab_size())?;
        let model = Llama::from_gguf(&file, config)?;
        let trained =
            if model.config.context_length == 0 { DEFAULT_CONTEXT_TOKENS } else { model.config.context_length };
        let ctx = if options.ctx_tokens == 0 { trained } else { options.ctx_tokens.min(trained) };
        let shape = BlockShape {
            layers: model.config.n_layer,
            block_tokens: kv.block_tokens,
            kv_dim: model.config.kv_dim(),
            kv_heads: model.config.n_head_kv,
        };
        let pool_tokens = if kv.pool_tokens == 0 { DEFAULT_POOL_CONTEXTS * ctx } else { kv.pool_tokens.max(ctx) };
        let pool = KvPool::new(shape, pool_tokens.div_ceil(kv.block_tokens.max(1)), kv.fault)?;
        let mut cpu = Cpu::new(options.threads.max(1));
        cpu.fit_weights(model.bytes_per_token());
        let gpu = gpu_model(&options, &file, &model, &pool, ctx + shape.block_tokens)?;
        let device = gpu.as_ref().map_or("cpu", |g| g.device_name());
        tracing::info!(path = %path.display(), layers = model.config.n_layer, ctx, device, threads = cpu.pool.threads(), kernels = cpu.kernels(), streamed_weights = cpu.streams_weights(), kv_prefetch = cpu.prefetches_kv(), weights_in_huge_pages_mib = model.weights_in_huge_pages().map(|b| b >> 20), kv_blocks = pool.total_blocks(), kv_block_tokens = shape.block_tokens, "model loaded");
        Ok(Engine { model, tokenizer, template, cpu, ctx, pool, gpu, grammars: Grammars::new() })
    }

    /// The GPU's name when the forward pass runs on one, `None` on the CPU.
    pub fn gpu(&self) -> Option<&str> {
        self.gpu.as_ref().map(|g| g.device_name())
    }

    /// One batched forward step on the engine's device (see `Llama::forward_batch`).
    pub(crate) fn forward_batch(&self, segments: &mut [Segment<'_, '_>], scratch: &mut Scratch) -> Result<()> {
        match &self.gpu {
            Some(gpu) => gpu.forward_batch(&self.model, &self.pool, segments, &mut scratch.logits),
            None => self.model.forward_batch(self.fast_path(), segments, scratch),
        }
    }

    /// One sequence's forward step on the engine's device; its isolation error, if any,
    /// stops it. Returns the backend's greedy pick when `need` asked for one and it made
    /// it; otherwise the last row's logits are in `scratch.logits` when `need` wants them.
    fn forward(
        &self,
        tokens: &[u32],
        kv: &mut SequenceKv<'_>,
        scratch: &mut Scratch,
        need: RowNeed,
    ) -> Result<Option<GreedyRow>> {
        let mut segments = [Segment::new(tokens, kv).needing(need)];
        self.forward_batch(&mut segments, scratch)?;
        let [segment] = segments;
        segment.error.map_or(Ok(segment.picked), Err)
    }

    /// The KV pool's counters (blocks, zero-fills, isolation violations, prefix hits).
    pub fn kv_stats(&self) -> KvStats {
        self.pool.stats()
    }

    /// The quantized, threaded CPU forward path.
    pub(crate) fn fast_path(&self) -> model::Path<'_> {
        model::Path::fast(&self.cpu)
    }

    /// The KV pool (for isolation tests and accounting audits).
    pub fn kv_pool(&self) -> &KvPool {
        &self.pool
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.model.config
    }

    /// The context window: prompt plus completion tokens of one request.
    pub fn context_tokens(&self) -> usize {
        self.ctx
    }

    /// Bytes of weights read per generated token.
    pub fn bytes_per_token(&self) -> usize {
        self.model.bytes_per_token()
    }

    /// Compiles `grammar` for this model's vocabulary, for [`GenerateRequest::grammar`].
    /// Milliseconds for a typical schema (the first call also builds the vocabulary's
    /// index); callers on an async runtime run it on a blocking thread.
    pub fn compile_grammar(&self, grammar: &Grammar) -> Result<CompiledGrammar> {
        self.grammars.compile(&self.tokenizer, grammar)
    }

    /// Tokenizes `text` as a plain prompt (no chat template; special-token texts stay
    /// text), with BOS when the model wants one.
    pub fn text_prompt(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = self.tokenizer.encode(text, false)?;
        if let (true, Some(bos)) = (self.tokenizer.add_bos(), self.tokenizer.bos_id()) {
            ids.insert(0, bos);
        }
        Ok(ids)
    }

    /// Renders `messages` with the model's chat template (with the generation prompt)
    /// and tokenizes the result, special tokens included.
    pub fn chat_prompt(&self, messages: &[ChatMessage], tools: Option<&serde_json::Value>) -> Result<Vec<u32>> {
        let text = self.template.render(messages, tools, true)?;
        let mut ids = self.tokenizer.encode(&text, true)?;
        if let (true, Some(bos)) = (self.tokenizer.add_bos(), self.tokenizer.bos_id()) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// The logits after the whole `prompt` (`[vocab]`), fed `batch_tokens` at a time
    /// (0: the default prefill batch), on the engine's device or by the plain f32 CPU
    /// reference path. For tests and benchmarks.
    pub fn prompt_logits(&self, prompt: &[u32], batch_tokens: usize, reference: bool) -> Result<Vec<f32>> {
        if reference && self.gpu.is_some() {
            // The CPU reference reads host KV blocks, which a GPU engine leaves empty.
            return Err(Error::InvalidOptions { reason: "the f32 reference path runs on CPU engines only".into() });
        }
        // No prefix reuse either way: callers compare batchings of the same prompt.
        let mut kv = SequenceKv::uncached(&self.pool, Owner::local(), prompt.len());
        let mut scratch = Scratch::default();
        let batch = if batch_tokens == 0 { PREFILL_BATCH_TOKENS } else { batch_tokens };
        for chunk in prompt.chunks(batch) {
            if reference {
                self.model.forward(model::Path::reference(&self.cpu), chunk, &mut kv, &mut scratch)?;
            } else {
                self.forward(chunk, &mut kv, &mut scratch, RowNeed::Logits)?;
            }
        }
        Ok(scratch.logits)
    }

    /// Teacher forcing: feeds `tokens` one at a time from an empty context (the decode
    /// path) and calls `on_row` with the logits after each (`[vocab]`): what fidelity
    /// measurements compare with another engine's on the same tokens.
    pub fn teacher_forced(&self, tokens: &[u32], on_row: &mut dyn FnMut(&[f32])) -> Result<()> {
        let mut kv = SequenceKv::uncached(&self.pool, Owner::local(), tokens.len());
        let mut scratch = Scratch::default();
        for token in tokens {
            self.forward(std::slice::from_ref(token), &mut kv, &mut scratch, RowNeed::Logits)?;
            on_row(&scratch.logits);
        }
        Ok(())
    }

    /// Generates tokens for `request` as the single local tenant ([`Owner::local`]; for
    /// tests, benchmarks and embedding without tenants), calling `on_token` per token.
    pub fn generate(
        &self,
        request: &GenerateRequest,
        on_token: &mut dyn FnMut(&TokenEvent) -> ControlFlow<()>,
    ) -> Result<Generation> {
        self.generate_for(&Owner::local(), request, on_token)
    }

    /// Generates tokens for `request` in a sequence owned by `owner`, calling `on_token`
    /// once per token. A KV isolation violation stops the request with
    /// [`Error::Isolation`]; its blocks are released (and zero-filled) either way.
    pub fn generate_for(
        &self,
        owner: &Owner,
        request: &GenerateRequest,
        on_token: &mut dyn FnMut(&TokenEvent) -> ControlFlow<()>,
    ) -> Result<Generation> {
        let budget = self.check(request)?;
        let prompt = &request.prompt;
        if budget == 0 {
            return Ok(Generation { prompt_tokens: prompt.len(), completion_tokens: 0, finish: FinishReason::Length });
        }
        let mut kv = SequenceKv::for_prompt(
            &self.pool,
            owner.clone(),
            sequence_capacity(prompt.len(), budget, self.pool.shape()),
            prompt,
        );
        let mut scratch = Scratch::default();
        let mut decoding = Decoding::new(&self.tokenizer, request, budget);
        let rest = &prompt[kv.cached_prompt_tokens()..];
        let chunks = rest.len().div_ceil(PREFILL_BATCH_TOKENS);
        let mut picked = None;
        for (i, chunk) in rest.chunks(PREFILL_BATCH_TOKENS).enumerate() {
            let need = if i + 1 == chunks { decoding.need() } else { RowNeed::Nothing };
            picked = self.forward(chunk, &mut kv, &mut scratch, need)?;
        }
        loop {
            let (event, last) = decoding.step(&scratch.logits, picked.as_ref(), kv.read_owners())?;
            if on_token(&event).is_break() {
                decoding.done.finish = FinishReason::Cancelled;
                return Ok(decoding.done);
            }
            if last {
                return Ok(decoding.done);
            }
            picked = self.forward(&[event.id], &mut kv, &mut scratch, decoding.need())?;
        }
    }

    /// Validates `request`; returns how many tokens may be generated.
    pub(crate) fn check(&self, request: &GenerateRequest) -> Result<usize> {
        let vocab = self.model.config.vocab;
        if request.prompt.is_empty() {
            return Err(Error::InvalidRequest { reason: "the prompt is empty".into() });
        }
        if let Some(bad) = request.prompt.iter().find(|t| **t as usize >= vocab) {
            return Err(Error::InvalidRequest {
                reason: format!("token id {bad} is outside the vocabulary of {vocab}"),
            });
        }
        if request.top_logprobs > MAX_TOP_LOGPROBS {
            return Err(Error::InvalidRequest {
                reason: format!("top_logprobs is {}, at most {MAX_TOP_LOGPROBS}", request.top_logprobs),
            });
        }
        request.sampling.validate(vocab)?;
        if request.prompt.len() >= self.ctx {
            return Err(Error::ContextOverflow { prompt_tokens: request.prompt.len(), limit: self.ctx });
        }
        Ok(request.max_tokens.min(self.ctx - request.prompt.len()))
    }
}

/// The model on the GPU as `device` asks: none for the CPU, an error for `cuda` without a
/// usable GPU (or for a model the CUDA backend cannot run), and for `auto` the GPU when
/// there is one that runs the model, else none (said once).
fn gpu_model(
    options: &EngineOptions,
    file: &GgufFile,
    model: &Llama,
    pool: &KvPool,
    max_pos: usize,
) -> Result<Option<Box<GpuModel>>> {
    let device = options.device;
    if device == Device::Cpu {
        return Ok(None);
    }
    if let (Device::Auto, Some(what)) = (device, crate::backend::cuda::lacks(model)) {
        tracing::info!(%what, "device = auto: the CUDA backend does not run this model, running on the CPU");
        return Ok(None);
    }
    let cuda = match (device, Cuda::open(0)) {
        (_, Ok(cuda)) => cuda,
        (Device::Auto, Err(Error::CudaUnavailable { reason })) => {
            tracing::info!(%reason, "device = auto: no usable GPU, running on the CPU");
            return Ok(None);
        }
        (_, Err(e)) => return Err(e),
    };
    Ok(Some(Box::new(GpuModel::load(cuda, file, model, pool, max_pos, options.cuda_graphs)?)))
}

/// Positions a request's sequence may hold: its prompt and budget, plus one block of room
/// that only a (fault-injected) stale block at its head can take.
fn sequence_capacity(prompt: usize, budget: usize, shape: BlockShape) -> usize {
    prompt + budget + shape.block_tokens
}
