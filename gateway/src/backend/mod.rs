//! Backends produce completions as one normalised event stream, whatever their wire:
//! [`BackendEvent`]s per choice (text and tool-call fragments, finish reasons, usage).
//! The response guard (`response_guard`) sits between this stream and the relay: every
//! field passes the firewall before the relay may write it, so streaming and
//! non-streaming clients, engine and upstream, share one path.

pub mod engine;
pub mod engine_client;
pub mod sse;
pub mod tool_calls;
pub mod upstream;
pub mod upstream_error;

use std::pin::Pin;

use futures::Stream;
use serde::Deserialize;

use crate::api::response::ToolCallChunk;
use crate::api::{ChatRequest, Usage};
use crate::error::ApiError;

pub use engine::EngineBackend;
pub use upstream::UpstreamBackend;

/// One step of a completion.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendEvent {
    /// New text and/or tool-call fragments for one choice.
    Delta(ChoiceDelta),
    /// A choice ended (`stop`, `length`, `tool_calls`, `content_filter`).
    Finish { index: u32, reason: String },
    /// Token counts for the whole request.
    Usage(Usage),
}

/// Fragments for one choice; every field may be absent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChoiceDelta {
    pub index: u32,
    pub role: Option<String>,
    pub content: Option<String>,
    pub refusal: Option<String>,
    pub tool_calls: Vec<ToolCallChunk>,
    /// OpenAI `logprobs.content` entries for the tokens of this delta.
    pub logprobs: Vec<TokenLogprob>,
    /// Engine only: this delta is exactly one token, and these are its logprob, predictive
    /// entropy and the owners of the KV it attended to (the firewall's provenance input).
    pub signals: Option<firewall::TokenSignals>,
}

/// One `logprobs.content` entry as a backend reported it: only the fields the gateway
/// understands. An upstream's other fields (its `bytes` included) are dropped when it is
/// parsed; what the client gets is rebuilt from these by the response guard.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f64,
    /// Missing or `null` (some servers write that when none were asked for): none.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub top_logprobs: Vec<TopLogprob>,
}

fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<TopLogprob>, D::Error> {
    Ok(Option::<Vec<TopLogprob>>::deserialize(d)?.unwrap_or_default())
}

/// One alternative of a [`TokenLogprob`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f64,
}

/// The events of one completion; an `Err` ends the stream.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<BackendEvent, ApiError>> + Send>>;

/// What a backend hands the relay once the completion has started.
pub struct BackendResponse {
    /// A non-streamed upstream answer's `system_fingerprint` (`None` from the engine and from
    /// streams); the response guard lets the client see it only in a strict `fp_…` format
    /// that no rule objects to (`response_guard::fields`).
    pub system_fingerprint: Option<String>,
    pub events: EventStream,
}

/// Everything the backend needs to know about the request besides its body.
#[derive(Debug, Clone)]
pub struct RequestContext {
    pub request_id: String,
    pub tenant: crate::auth::TenantId,
}

/// Where one configured model's completions come from.
pub enum Backend {
    Upstream(UpstreamBackend),
    Engine(EngineBackend),
}

impl Backend {
    /// Starts a completion. Errors before the first event map to an HTTP status.
    pub async fn complete(&self, request: &ChatRequest, ctx: &RequestContext) -> Result<BackendResponse, ApiError> {
        match self {
            Backend::Upstream(b) => b.complete(request, ctx).await,
            Backend::Engine(b) => b.complete(request, ctx).await,
        }
    }

    /// Whether the backend can take requests now.
    pub fn is_ready(&self) -> bool {
        match self {
            Backend::Upstream(_) => true,
            Backend::Engine(b) => b.is_ready(),
        }
    }

    /// The engine's KV pool figures (`None` for an upstream, or before the model loads).
    pub fn kv_stats(&self) -> Option<::engine::KvStats> {
        match self {
            Backend::Upstream(_) => None,
            Backend::Engine(b) => b.kv_stats(),
        }
    }

    /// The engine's serving loop gauges (`None` for an upstream).
    pub fn loop_gauges(&self) -> Option<&engine_client::LoopGauges> {
        match self {
            Backend::Upstream(_) => None,
            Backend::Engine(b) => Some(b.gauges()),
        }
    }

    /// A short name for health output and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Backend::Upstream(_) => "upstream",
            Backend::Engine(_) => "engine",
        }
    }
}
