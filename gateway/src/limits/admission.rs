//! What one admitted request holds ([`Admission`]), what it asks for ([`Ask`]), and the
//! per-model caps checked before it asks ([`check_caps`]).

use std::sync::Arc;

use axum::http::HeaderMap;
use futures::StreamExt;

use super::headers::RateHeaders;
use super::TenantLimiter;
use crate::api::ChatRequest;
use crate::backend::{BackendEvent, EventStream};
use crate::config::ModelCaps;
use crate::error::ApiError;

/// Text bytes per token in estimates (OpenAI's rule of thumb for English).
const BYTES_PER_TOKEN: u64 = 4;

/// The tokens a request is expected to cost, reserved at admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    /// Estimated from the prompt's text.
    pub prompt_tokens: u64,
    /// `max_tokens` × `n`, or 0 when the client set no `max_tokens`.
    pub completion_tokens: u64,
}

impl Ask {
    /// The estimate for `request` (see the module docs of [`crate::limits`]).
    pub fn of(request: &ChatRequest) -> Ask {
        Ask {
            prompt_tokens: (request.prompt_bytes() as u64).div_ceil(BYTES_PER_TOKEN),
            completion_tokens: request.max_tokens.map_or(0, |m| u64::from(m) * u64::from(request.n)),
        }
    }

    pub fn total(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }
}

/// An admitted request's hold on its tenant's limits: one concurrency slot and a token
/// reservation, both settled when it is dropped.
pub struct Admission {
    tenant: Arc<TenantLimiter>,
    ask: Ask,
    headers: RateHeaders,
    /// `usage.total_tokens` as the backend reported it.
    reported: Option<u64>,
    /// Completion text bytes seen, for when no usage is reported.
    completion_bytes: u64,
}

impl Admission {
    pub(super) fn new(tenant: Arc<TenantLimiter>, ask: Ask, headers: RateHeaders) -> Admission {
        Admission { tenant, ask, headers, reported: None, completion_bytes: 0 }
    }

    /// The tenant's budgets right after admission, as `x-ratelimit-*` headers.
    pub fn write_headers(&self, out: &mut HeaderMap) {
        self.headers.write(out);
    }

    /// `events`, watched for usage; the admission is settled when the stream is dropped.
    pub fn meter(mut self, events: EventStream) -> EventStream {
        Box::pin(events.map(move |event| {
            if let Ok(event) = &event {
                self.observe(event);
            }
            event
        }))
    }

    fn observe(&mut self, event: &BackendEvent) {
        match event {
            BackendEvent::Usage(u) => {
                self.reported = Some(u.total_tokens.max(u.prompt_tokens.saturating_add(u.completion_tokens)));
            }
            BackendEvent::Delta(d) => {
                let text = d.content.as_ref().map_or(0, String::len)
                    + d.refusal.as_ref().map_or(0, String::len)
                    + d.tool_calls.iter().filter_map(|c| c.function.arguments.as_ref().map(String::len)).sum::<usize>();
                self.completion_bytes += text as u64;
            }
            BackendEvent::Finish { .. } => {}
        }
    }

    /// What the request cost: reported usage, else the prompt estimate plus what streamed.
    fn used(&self) -> u64 {
        self.reported.unwrap_or_else(|| self.ask.prompt_tokens + self.completion_bytes.div_ceil(BYTES_PER_TOKEN))
    }
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission").field("tenant", &self.tenant.id).field("ask", &self.ask).finish_non_exhaustive()
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.tenant.release(self.ask.total(), self.used());
    }
}

/// Refuses (400, naming the parameter) a request asking for more choices or tokens than
/// `caps` allow for `model`.
pub fn check_caps(caps: &ModelCaps, request: &ChatRequest) -> Result<(), ApiError> {
    if request.n > caps.max_n {
        return Err(ApiError::param(
            "n",
            format!("n must be at most {} for model `{}`, got {}", caps.max_n, request.model, request.n),
        ));
    }
    if let (Some(cap), Some(asked)) = (caps.max_tokens_cap, request.max_tokens) {
        if asked > cap {
            // Name the field the client used: `max_completion_tokens` wins when both are set.
            let param = if request.raw.get("max_completion_tokens").is_some_and(|v| !v.is_null()) {
                "max_completion_tokens"
            } else {
                "max_tokens"
            };
            return Err(ApiError::param(
                param,
                format!("{param} must be at most {cap} for model `{}`, got {asked}", request.model),
            ));
        }
    }
    Ok(())
}
