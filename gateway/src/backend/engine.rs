//! The engine backend: the in-process model. Loading happens on its own thread after the
//! server starts (fetching the default model first when it is missing), so `/readyz`
//! answers 503 until the model can serve; the same thread then runs the serving loop
//! ([`engine::serve()`], each request's events through [`super::engine_client`]): continuous
//! batching across every request, off the async workers. A full queue is a 429 with `Retry-After`; each request's events flow through a
//! bounded channel, so a client that stops reading pauses its sequences and one that goes
//! away has them cancelled (see the loop's invariants). Each sequence is owned by the
//! request's tenant, and each token's KV owners (the engine's provenance) reach the
//! firewall in the delta's signals. Long prompts are rendered and tokenised on tokio's
//! blocking pool, never on an async worker.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use engine::{
    ChatMessage, CompiledGrammar, Engine, EngineOptions, GenerateRequest, Grammar, KvOptions, Owner, Refusal,
    SamplingParams, Submission, TokenEvent,
};
use serde_json::{Map, Value};
use tokio::sync::oneshot;

use super::engine_client::{EngineClient, LoopGauges, StreamLimits};
use super::tool_calls::ToolPlan;
use super::{BackendResponse, RequestContext, TokenLogprob, TopLogprob};
use crate::api::{ChatRequest, ResponseFormat, ToolChoice};
use crate::config::EngineModelConfig;
use crate::error::ApiError;

/// Where the model stands.
enum Load {
    // Boxed: an engine is kilobytes of state beside the failure's one string.
    Ready(Box<Engine>),
    Failed(String),
}

/// One engine-served model id.
pub struct EngineBackend {
    model_id: String,
    state: Arc<OnceLock<Load>>,
    /// To the serving loop.
    submit: std::sync::mpsc::Sender<Submission<EngineClient>>,
    gauges: Arc<LoopGauges>,
    streams: StreamLimits,
}

impl EngineBackend {
    /// Starts loading in the background and returns at once.
    pub fn spawn_load(model_id: &str, config: &EngineModelConfig) -> EngineBackend {
        let state = Arc::new(OnceLock::new());
        let slot = state.clone();
        let streams = config.streams;
        let config = config.clone();
        let id = model_id.to_owned();
        let (submit, submissions) = std::sync::mpsc::channel::<Submission<EngineClient>>();
        let gauges = Arc::new(LoopGauges::default());
        let loop_gauges = gauges.clone();
        std::thread::Builder::new()
            .name(format!("engine-{id}"))
            .spawn(move || {
                let outcome = match load(&config) {
                    Ok(engine) => {
                        tracing::info!(model = %id, context_tokens = engine.context_tokens(), "model loaded");
                        Load::Ready(Box::new(engine))
                    }
                    Err(reason) => {
                        tracing::error!(model = %id, error = %reason, "model failed to load");
                        Load::Failed(reason)
                    }
                };
                let _ = slot.set(outcome);
                if let Some(Load::Ready(engine)) = slot.get() {
                    // Until the backend (every sender) is dropped.
                    let on_step = |step| loop_gauges.observe_step(step);
                    engine::serve(
                        engine,
                        config.batching,
                        config.streams.stall,
                        &submissions,
                        &loop_gauges.serve,
                        &on_step,
                    );
                }
            })
            .map_err(|e| tracing::error!(error = %e, "cannot start the model loading thread"))
            .ok();
        EngineBackend { model_id: model_id.to_owned(), state, submit, gauges, streams }
    }

    /// The serving loop's queue depth, batch size and counters.
    pub fn gauges(&self) -> &LoopGauges {
        &self.gauges
    }

    pub fn is_ready(&self) -> bool {
        matches!(self.state.get(), Some(Load::Ready(_)))
    }

    /// The KV pool's figures, once the model is loaded.
    pub fn kv_stats(&self) -> Option<engine::KvStats> {
        match self.state.get() {
            Some(Load::Ready(engine)) => Some(engine.kv_stats()),
            _ => None,
        }
    }

    /// The loaded engine, or why there is none.
    fn engine(&self) -> Result<&Engine, ApiError> {
        engine_of(&self.state, &self.model_id)
    }

    /// The request's prompt tokens and compiled output grammar. A long prompt, and any
    /// grammar, is prepared on tokio's blocking pool; a short plain prompt right here,
    /// where the hop to another thread would cost more than the work.
    async fn prepare(&self, request: &ChatRequest) -> Result<Prepared, ApiError> {
        if let ResponseFormat::Other(kind) = &request.response_format {
            return Err(ApiError::param(
                "response_format.type",
                format!("response_format type '{kind}' is not supported by the engine; it supports 'text', 'json_object' and 'json_schema'"),
            ));
        }
        if let ToolChoice::Other(kind) = &request.tool_choice {
            return Err(ApiError::param(
                "tool_choice",
                format!("tool_choice type '{kind}' is not supported by the engine; it supports 'function'"),
            ));
        }
        if request.text_prompt {
            // Legacy completions: the messages' text as it is (the prompt, after any line
            // the gateway's protection added), no template, no grammar.
            let text: Vec<String> = chat_messages(&request.messages)?.into_iter().filter_map(|m| m.content).collect();
            let (state, model_id) = (self.state.clone(), self.model_id.clone());
            let prompt = tokio::task::spawn_blocking(move || {
                engine_of(&state, &model_id)?.text_prompt(&text.join("\n")).map_err(|e| map_engine_error(&e))
            })
            .await
            .map_err(|e| ApiError::Internal(format!("prompt tokenising task failed: {e}")))??;
            return Ok(Prepared { prompt, grammar: None, read_calls: false });
        }
        let mut messages = chat_messages(&request.messages)?;
        let tools = request.tools.clone();
        let answer_schema = match &request.response_format {
            ResponseFormat::Text | ResponseFormat::Other(_) => None,
            ResponseFormat::JsonObject => Some(serde_json::json!({"type": "object"})),
            ResponseFormat::JsonSchema { schema, .. } => {
                Some(schema.clone().unwrap_or_else(|| Value::Object(Map::new())))
            }
        };
        let has_results = messages.iter().any(|m| m.role == "tool");
        let plan = tools.as_ref().and_then(|t| {
            ToolPlan::new(t, &request.tool_choice, request.parallel_tool_calls, answer_schema.as_ref(), has_results)
        });
        let grammar = match &plan {
            Some(plan) => {
                add_instruction(&mut messages, &plan.instruction);
                Some((Grammar::Lark(plan.grammar.clone()), "tools"))
            }
            None => output_grammar(&request.response_format),
        };
        let read_calls = plan.is_some();
        if grammar.is_none() && prompt_bytes(&messages, tools.as_ref()) <= INLINE_PROMPT_BYTES {
            let prompt = self.engine()?.chat_prompt(&messages, tools.as_ref()).map_err(|e| map_engine_error(&e))?;
            return Ok(Prepared { prompt, grammar: None, read_calls });
        }
        let (state, model_id) = (self.state.clone(), self.model_id.clone());
        tokio::task::spawn_blocking(move || {
            let engine = engine_of(&state, &model_id)?;
            let prompt = engine.chat_prompt(&messages, tools.as_ref()).map_err(|e| map_engine_error(&e))?;
            let compiled = grammar
                .map(|(grammar, param)| engine.compile_grammar(&grammar).map_err(|e| grammar_error(e, param)))
                .transpose()?;
            Ok(Prepared { prompt, grammar: compiled, read_calls })
        })
        .await
        .map_err(|e| ApiError::Internal(format!("prompt preparing task failed: {e}")))?
    }

    pub async fn complete(&self, request: &ChatRequest, ctx: &RequestContext) -> Result<BackendResponse, ApiError> {
        let Prepared { prompt, grammar, read_calls } = self.prepare(request).await?;
        let engine = self.engine()?;
        let vocab = engine.config().vocab;
        if let Some((id, _)) = request.logit_bias.iter().find(|(id, _)| *id as usize >= vocab) {
            return Err(ApiError::param(
                "logit_bias",
                format!("logit_bias key {id} is not a token id of this model (ids are below {vocab})"),
            ));
        }
        let limit = engine.context_tokens();
        if prompt.len() >= limit {
            return Err(ApiError::context_length(format!(
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
                grammar: grammar.clone(),
            })
            .collect();
        let (events, rx) = self.streams.channel();
        let (accepted, answer) = oneshot::channel();
        let submission = Submission {
            owner: Owner::new(ctx.tenant.as_str(), &ctx.request_id),
            client: EngineClient::new(events, plans.len(), request.logprobs, read_calls),
            plans,
            accepted: Box::new(move |queued: Result<(), Refusal>| {
                let _ = accepted.send(queued.map_err(|refusal| match refusal {
                    Refusal::Busy { queued } => ApiError::EngineBusy { queued, retry_after_s: 1 },
                    Refusal::Engine(e) => map_engine_error(&e),
                }));
            }),
        };
        let stopped = || ApiError::Unavailable(format!("The engine serving `{}` has stopped.", self.model_id));
        self.submit.send(submission).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())??;
        Ok(BackendResponse {
            system_fingerprint: None,
            events: Box::pin(futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|ev| (ev, rx)) })),
        })
    }
}

/// A request made ready for the engine.
struct Prepared {
    prompt: Vec<u32>,
    grammar: Option<CompiledGrammar>,
    /// The output may hold tool calls, to be read out of it.
    read_calls: bool,
}

/// Puts the tool instruction first in the system turn (a new one when there is none).
fn add_instruction(messages: &mut Vec<ChatMessage>, instruction: &str) {
    match messages.first_mut().filter(|m| m.role == "system" || m.role == "developer") {
        Some(first) => {
            let before = first.content.take().unwrap_or_default();
            first.content =
                Some(if before.is_empty() { instruction.to_owned() } else { format!("{instruction}\n\n{before}") });
        }
        None => messages.insert(0, ChatMessage::new("system", instruction)),
    }
}

/// Prompts with more text than this (message contents, bytes) are tokenised on the
/// blocking pool.
const INLINE_PROMPT_BYTES: usize = 16 * 1024;

/// About how much text the template will render: the messages' contents, tool calls and
/// tool definitions.
fn prompt_bytes(messages: &[ChatMessage], tools: Option<&Value>) -> usize {
    let json_len = |v: &Value| serde_json::to_string(v).map_or(0, |s| s.len());
    let of_message =
        |m: &ChatMessage| m.content.as_ref().map_or(0, String::len) + m.tool_calls.as_ref().map_or(0, json_len);
    messages.iter().map(of_message).sum::<usize>() + tools.map_or(0, json_len)
}

/// The grammar `format` asks the engine to enforce, and the parameter that asked for it.
fn output_grammar(format: &ResponseFormat) -> Option<(Grammar, &'static str)> {
    match format {
        ResponseFormat::Text | ResponseFormat::Other(_) => None,
        ResponseFormat::JsonObject => Some((Grammar::JsonObject, "response_format")),
        ResponseFormat::JsonSchema { schema, .. } => {
            let schema = schema.clone().unwrap_or_else(|| Value::Object(Map::new()));
            Some((Grammar::JsonSchema(schema), "response_format.json_schema.schema"))
        }
    }
}

fn grammar_error(e: engine::Error, param: &str) -> ApiError {
    match e {
        engine::Error::Grammar { reason } => ApiError::param(param, format!("{param} cannot be enforced: {reason}")),
        other => map_engine_error(&other),
    }
}

fn engine_of<'a>(state: &'a OnceLock<Load>, model_id: &str) -> Result<&'a Engine, ApiError> {
    match state.get() {
        Some(Load::Ready(engine)) => Ok(engine),
        Some(Load::Failed(reason)) => {
            Err(ApiError::Unavailable(format!("model `{model_id}` failed to load: {reason}")))
        }
        None => Err(ApiError::Unavailable(format!("The model `{model_id}` is still loading; retry shortly."))),
    }
}

fn load(config: &EngineModelConfig) -> Result<Engine, String> {
    let path: PathBuf = match &config.path {
        Some(p) => p.clone(),
        None => engine::ensure_default_model(&engine::default_cache_dir()).map_err(|e| e.to_string())?,
    };
    let mut options = EngineOptions { device: config.device, ..EngineOptions::default() };
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

/// KV owners of tokens not yet sent: the union since the last delta, sorted.
#[derive(Debug, Default)]
pub(super) struct PendingOwners(Vec<String>);

impl PendingOwners {
    pub(super) fn add(&mut self, ev: &TokenEvent) {
        for tenant in &ev.owners {
            if let Err(at) = self.0.binary_search_by(|o| o.as_str().cmp(tenant.as_str())) {
                self.0.insert(at, tenant.as_str().to_owned());
            }
        }
    }

    pub(super) fn take(&mut self) -> Vec<String> {
        std::mem::take(&mut self.0)
    }
}

/// OpenAI's `logprobs.content[]` entry for one token (its `bytes` are written from the
/// token's text when the entry is sent).
pub(super) fn logprob_entry(ev: &TokenEvent) -> TokenLogprob {
    let top_logprobs =
        ev.top_logprobs.iter().map(|t| TopLogprob { token: t.text.clone(), logprob: f64::from(t.logprob) }).collect();
    TokenLogprob { token: ev.text.clone(), logprob: f64::from(ev.logprob), top_logprobs }
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

pub(super) fn map_engine_error(e: &engine::Error) -> ApiError {
    match e {
        engine::Error::Template { reason } => {
            ApiError::param("messages", format!("the model's chat template cannot render these messages: {reason}"))
        }
        engine::Error::ContextOverflow { prompt_tokens, limit } => ApiError::context_length(format!(
            "This model's maximum context length is {limit} tokens; your messages use {prompt_tokens}."
        )),
        engine::Error::InvalidRequest { reason } => ApiError::param("messages", reason.clone()),
        engine::Error::KvExhausted { .. } => {
            ApiError::Unavailable("The engine's KV cache is full; retry shortly.".into())
        }
        engine::Error::Grammar { reason } => ApiError::param("response_format", reason.clone()),
        other => ApiError::Internal(format!("engine: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn token(text: &str, owners: &[&str]) -> TokenEvent {
        TokenEvent {
            id: 0,
            text: text.into(),
            logprob: 0.0,
            entropy: 0.0,
            top_logprobs: Vec::new(),
            owners: owners.iter().map(|o| engine::Tenant::new(o)).collect(),
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
        let msgs: Vec<Map<String, Value>> = vec![serde_json::from_value(
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
        )
        .unwrap()];
        assert_eq!(chat_messages(&msgs).unwrap()[0].content.as_deref(), Some("ab"));
        let img: Vec<Map<String, Value>> = vec![serde_json::from_value(
            json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}),
        )
        .unwrap()];
        match chat_messages(&img) {
            Err(ApiError::InvalidParam { param, .. }) => assert_eq!(param, "messages[0].content[0]"),
            other => panic!("{other:?}"),
        }
    }
}
