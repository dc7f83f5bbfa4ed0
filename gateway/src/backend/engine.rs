//! The engine backend: the in-process model. Loading happens on a blocking thread after the
//! server starts (fetching the default model first when it is missing), so `/readyz`
//! answers 503 until the model can serve. Each completion runs on a blocking thread, off
//! the async workers, one generation at a time (the scheduler with continuous batching
//! replaces the permit), and streams [`BackendEvent`]s through a bounded channel; a
//! client that goes away closes the channel and the generation stops at the next token.
//! Each sequence is owned by the request's tenant, and each token's KV owners (the
//! engine's provenance) reach the firewall in the delta's signals.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use engine::template::ChatMessage;
use engine::engine::{Engine, EngineOptions, FinishReason, GenerateRequest, KvOptions, TokenEvent};
use engine::kv::Owner;
use engine::sample::SamplingParams;
use firewall::TokenSignals;
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, Semaphore};

use super::{BackendEvent, BackendResponse, ChoiceDelta, RequestContext};
use crate::api::{ChatRequest, Usage};
use crate::config::EngineModelConfig;
use crate::error::ApiError;

/// Events buffered between the generating thread and the HTTP response.
const EVENT_BUFFER: usize = 64;

/// Where the model stands.
enum Load {
    Ready(Engine),
    Failed(String),
}

/// One engine-served model id.
pub struct EngineBackend {
    model_id: String,
    state: Arc<OnceLock<Load>>,
    /// One generation at a time until the batching scheduler lands.
    permit: Arc<Semaphore>,
}

impl EngineBackend {
    /// Starts loading in the background and returns at once.
    pub fn spawn_load(model_id: &str, config: &EngineModelConfig) -> EngineBackend {
        let state = Arc::new(OnceLock::new());
        let slot = state.clone();
        let config = config.clone();
        let id = model_id.to_owned();
        std::thread::Builder::new()
            .name(format!("load-{id}"))
            .spawn(move || {
                let outcome = match load(&config) {
                    Ok(engine) => {
                        tracing::info!(model = %id, context_tokens = engine.context_tokens(), "model loaded");
                        Load::Ready(engine)
                    }
                    Err(reason) => {
                        tracing::error!(model = %id, error = %reason, "model failed to load");
                        Load::Failed(reason)
                    }
                };
                let _ = slot.set(outcome);
            })
            .map_err(|e| tracing::error!(error = %e, "cannot start the model loading thread"))
            .ok();
        EngineBackend { model_id: model_id.to_owned(), state, permit: Arc::new(Semaphore::new(1)) }
    }

    pub fn is_ready(&self) -> bool {
        matches!(self.state.get(), Some(Load::Ready(_)))
    }

    /// The KV pool's figures, once the model is loaded.
    pub fn kv_stats(&self) -> Option<engine::kv::KvStats> {
        match self.state.get() {
            Some(Load::Ready(engine)) => Some(engine.kv_stats()),
            _ => None,
        }
    }

    pub async fn complete(&self, request: &ChatRequest, ctx: &RequestContext) -> Result<BackendResponse, ApiError> {
        let engine = match self.state.get() {
            Some(Load::Ready(engine)) => engine,
            Some(Load::Failed(reason)) => return Err(ApiError::Unavailable(format!("model `{}` failed to load: {reason}", self.model_id))),
            None => return Err(ApiError::Unavailable(format!("The model `{}` is still loading; retry shortly.", self.model_id))),
        };
        let messages = chat_messages(&request.messages)?;
        let prompt = engine.chat_prompt(&messages, request.tools.as_ref()).map_err(map_engine_error)?;
        let limit = engine.context_tokens();
        if prompt.len() >= limit {
            return Err(ApiError::ContextLengthExceeded(format!(
                "This model's maximum context length is {limit} tokens; your messages use {}.",
                prompt.len()
            )));
        }
        let room = limit - prompt.len();
        let max_tokens = request.max_tokens.map_or(room, |m| (m as usize).min(room));
        let plans: Vec<GenerateRequest> = (0..request.n)
            .map(|i| GenerateRequest {
                prompt: prompt.clone(),
                max_tokens,
                stop: request.stop.clone(),
                sampling: sampling(request, i),
                top_logprobs: if request.logprobs { request.top_logprobs as usize } else { 0 },
            })
            .collect();
        let (tx, rx) = mpsc::channel(EVENT_BUFFER);
        let permit = self.permit.clone().acquire_owned().await.map_err(|_| ApiError::Unavailable("engine shutting down".into()))?;
        let state = self.state.clone();
        let want_logprobs = request.logprobs;
        let owner = Owner::new(ctx.tenant.as_str(), &ctx.request_id);
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            if let Some(Load::Ready(engine)) = state.get() {
                run_choices(engine, &owner, &plans, want_logprobs, &tx);
            }
        });
        Ok(BackendResponse {
            system_fingerprint: None,
            events: Box::pin(futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|ev| (ev, rx)) })),
        })
    }
}

fn load(config: &EngineModelConfig) -> Result<Engine, String> {
    let path: PathBuf = match &config.path {
        Some(p) => p.clone(),
        None => engine::fetch::ensure_default_model(&engine::fetch::default_cache_dir()).map_err(|e| e.to_string())?,
    };
    let mut options = EngineOptions::default();
    if let Some(t) = config.threads {
        options.threads = t;
    }
    if let Some(c) = config.context_tokens {
        options.ctx_tokens = c;
    }
    let mut kv = KvOptions { fault: config.fault.clone(), ..KvOptions::default() };
    if let Some(b) = config.kv_block_tokens {
        kv.block_tokens = b;
    }
    let weakened = kv.fault.active();
    if !weakened.is_empty() {
        tracing::warn!(
            faults = ?weakened,
            stale_kv = kv.fault.stale_kv,
            "KV FAULT INJECTION IS ON: engine isolation defences are switched off on purpose; never run this outside tests"
        );
    }
    Engine::load_with(&path, options, kv).map_err(|e| e.to_string())
}

/// Generates every choice in turn, sending events until done or until the client is gone.
fn run_choices(engine: &Engine, owner: &Owner, plans: &[GenerateRequest], want_logprobs: bool, tx: &mpsc::Sender<Result<BackendEvent, ApiError>>) {
    let mut usage = Usage::default();
    for (index, plan) in plans.iter().enumerate() {
        let index = index as u32;
        let mut owners = PendingOwners::default();
        let mut on_token = |ev: &TokenEvent| {
            owners.add(ev);
            if ev.text.is_empty() && !want_logprobs {
                // Nothing to send yet (part of a UTF-8 sequence): the owners wait for the
                // next delta, so a foreign owner is never dropped.
                return ControlFlow::Continue(());
            }
            let delta = ChoiceDelta {
                index,
                content: Some(ev.text.clone()),
                logprobs: if want_logprobs { vec![logprob_entry(ev)] } else { Vec::new() },
                signals: Some(TokenSignals {
                    logprob: Some(f64::from(ev.logprob)),
                    entropy: Some(f64::from(ev.entropy)),
                    owners: owners.take(),
                }),
                ..ChoiceDelta::default()
            };
            match tx.blocking_send(Ok(BackendEvent::Delta(delta))) {
                Ok(()) => ControlFlow::Continue(()),
                Err(_) => ControlFlow::Break(()),
            }
        };
        let generation = match engine.generate_for(owner, plan, &mut on_token) {
            Ok(g) => g,
            Err(e) => {
                let _ = tx.blocking_send(Err(map_engine_error(e)));
                return;
            }
        };
        usage.prompt_tokens = generation.prompt_tokens as u64;
        usage.completion_tokens += generation.completion_tokens as u64;
        let reason = match generation.finish {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => return,
        };
        if tx.blocking_send(Ok(BackendEvent::Finish { index, reason: reason.to_owned() })).is_err() {
            return;
        }
    }
    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
    let _ = tx.blocking_send(Ok(BackendEvent::Usage(usage)));
}

/// KV owners of tokens not yet sent: the union since the last delta, sorted.
#[derive(Debug, Default)]
struct PendingOwners(Vec<String>);

impl PendingOwners {
    fn add(&mut self, ev: &TokenEvent) {
        for tenant in &ev.owners {
            if let Err(at) = self.0.binary_search_by(|o| o.as_str().cmp(tenant.as_str())) {
                self.0.insert(at, tenant.as_str().to_owned());
            }
        }
    }

    fn take(&mut self) -> Vec<String> {
        std::mem::take(&mut self.0)
    }
}

/// OpenAI's `logprobs.content[]` entry for one token.
fn logprob_entry(ev: &TokenEvent) -> Value {
    let top: Vec<Value> = ev
        .top_logprobs
        .iter()
        .map(|t| json!({"token": t.text, "logprob": t.logprob, "bytes": t.bytes}))
        .collect();
    let bytes: Vec<u8> = ev.top_logprobs.iter().find(|t| t.id == ev.id).map(|t| t.bytes.clone()).unwrap_or_else(|| ev.text.as_bytes().to_vec());
    json!({"token": ev.text, "logprob": ev.logprob, "bytes": bytes, "top_logprobs": top})
}

/// The sampling settings of choice `i` (`seed + i`, so choices differ yet reproduce).
fn sampling(request: &ChatRequest, i: u32) -> SamplingParams {
    SamplingParams {
        temperature: request.temperature.unwrap_or(1.0),
        top_p: request.top_p.unwrap_or(1.0),
        top_k: 0,
        seed: request.seed.map(|s| (s as u64).wrapping_add(u64::from(i))),
        presence_penalty: request.presence_penalty,
        frequency_penalty: request.frequency_penalty,
        logit_bias: request.logit_bias.clone(),
    }
}

/// OpenAI messages -> the template's messages; text parts are joined, other parts refused.
fn chat_messages(messages: &[Map<String, Value>]) -> Result<Vec<ChatMessage>, ApiError> {
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let text = |k: &str| m.get(k).and_then(Value::as_str).map(str::to_owned);
            let content = match m.get("content") {
                Some(Value::String(s)) => Some(s.clone()),
                Some(Value::Array(parts)) => Some(text_parts(i, parts)?),
                _ => None,
            };
            Ok(ChatMessage {
                role: text("role").unwrap_or_default(),
                content,
                name: text("name"),
                tool_calls: m.get("tool_calls").filter(|v| !v.is_null()).cloned(),
                tool_call_id: text("tool_call_id"),
            })
        })
        .collect()
}

fn text_parts(i: usize, parts: &[Value]) -> Result<String, ApiError> {
    let mut out = String::new();
    for (j, part) in parts.iter().enumerate() {
        match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
            (Some("text"), Some(t)) => out.push_str(t),
            (kind, _) => {
                return Err(ApiError::param(
                    format!("messages[{i}].content[{j}]"),
                    format!("this model accepts text content only, got a part of type {:?}", kind.unwrap_or("?")),
                ))
            }
        }
    }
    Ok(out)
}

fn map_engine_error(e: engine::Error) -> ApiError {
    match e {
        engine::Error::Template { reason } => ApiError::param("messages", format!("the model's chat template cannot render these messages: {reason}")),
        engine::Error::ContextOverflow { prompt_tokens, limit } => ApiError::ContextLengthExceeded(format!(
            "This model's maximum context length is {limit} tokens; your messages use {prompt_tokens}."
        )),
        engine::Error::InvalidRequest { reason } => ApiError::param("messages", reason),
        engine::Error::KvExhausted { .. } => ApiError::Unavailable("The engine's KV cache is full; retry shortly.".into()),
        other => ApiError::Internal(format!("engine: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(text: &str, owners: &[&str]) -> TokenEvent {
        TokenEvent {
            id: 0,
            text: text.into(),
            logprob: 0.0,
            entropy: 0.0,
            top_logprobs: Vec::new(),
            owners: owners.iter().map(|o| engine::kv::Tenant::new(o)).collect(),
        }
    }

    #[test]
    fn owners_of_unsent_tokens_carry_to_the_next_delta() {
        let mut pending = PendingOwners::default();
        pending.add(&token("", &["acme", "globex"]));
        pending.add(&token("é", &["acme"]));
        assert_eq!(pending.take(), ["acme", "globex"]);
        assert!(pending.take().is_empty());
    }

    #[test]
    fn text_parts_are_joined_and_images_refused() {
        let msgs: Vec<Map<String, Value>> = vec![
            serde_json::from_value(json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})).unwrap(),
        ];
        assert_eq!(chat_messages(&msgs).unwrap()[0].content.as_deref(), Some("ab"));
        let img: Vec<Map<String, Value>> = vec![
            serde_json::from_value(json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]})).unwrap(),
        ];
        match chat_messages(&img) {
            Err(ApiError::InvalidParam { param, .. }) => assert_eq!(param, "messages[0].content[0]"),
            other => panic!("{other:?}"),
        }
    }
}
