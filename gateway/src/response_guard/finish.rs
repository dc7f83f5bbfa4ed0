//! The end of one response, streamed or whole: the one place its outcome becomes metrics,
//! log lines and an audit record.
//!
//! What the outcome holds is the guard's: findings, a firewall failure (with how the fail
//! mode took it), the error that ended the backend's events, the released text. Each is
//! logged once: a firewall failure and a block here; a backend error here when it ended a
//! stream (the client got it as an SSE event), and by the router's middleware otherwise
//! (the client got it as the HTTP response); an upstream's own words only masked. Then the
//! protection pipeline learns from what was released, and a response with a block, a
//! redaction or a closed failure gets its audit record: written in the background for a
//! stream that already ended, before anything is sent for a whole one.

use std::sync::Arc;

use firewall::Action;

use super::{ResponseGuard, CONTENT_FILTER};
use crate::api::response::ChatCompletion;
use crate::audit::{AuditContext, AuditRecord};
use crate::config::FailMode;
use crate::error::ApiError;
use crate::protection::ResponseRecord;
use crate::state::AppState;

/// How the response reached its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Server-sent events: an error after the start went out as an event.
    Stream,
    /// One JSON object, or an HTTP error.
    Whole,
}

/// Reports one response's outcome.
pub struct Finisher {
    state: Arc<AppState>,
    record: ResponseRecord,
}

impl Finisher {
    pub fn new(state: Arc<AppState>, record: ResponseRecord) -> Finisher {
        Finisher { state, record }
    }

    /// The response's identity (its audit id is announced before the first byte).
    pub fn record(&self) -> &ResponseRecord {
        &self.record
    }

    /// The backend started the completion.
    pub fn started(&self) {
        self.state.metrics.observe_completion(&self.record.model, &self.record.tenant, "ok");
    }

    /// The backend could not start the completion; the error is the HTTP response (and
    /// logged as such).
    pub fn not_started(&self, error: &ApiError) {
        self.state.metrics.observe_backend_error(&self.record.model, error.kind());
        self.state.metrics.observe_completion(&self.record.model, &self.record.tenant, "error");
    }

    /// A stream ended (or its client left): the audit record, if any, is written later.
    pub fn streamed(&self, guard: &ResponseGuard) {
        if let Some(audit) = self.conclude(guard, Delivery::Stream) {
            self.state.protection.audit_later(audit);
        }
    }

    /// A whole response is ready (or failed): its audit record is written before it is
    /// sent, and when that fails and the tenant fails closed, every choice is withheld.
    /// Returns the completion and whether an audit record names it.
    pub async fn whole(
        &self,
        guard: &mut ResponseGuard,
        completion: Result<ChatCompletion, ApiError>,
    ) -> Result<(ChatCompletion, bool), ApiError> {
        let audit = self.conclude(guard, Delivery::Whole);
        let mut completion = match completion {
            Ok(c) => c,
            Err(e) => {
                if let Some(audit) = audit {
                    self.state.protection.audit_later(audit);
                }
                return Err(e);
            }
        };
        let Some(audit) = audit else { return Ok((completion, false)) };
        if let Err(e) = self.state.protection.audit(&audit).await {
            let tenant = &self.record.tenant;
            tracing::error!(error = %e, audit_id = audit.id(), tenant, "audit record could not be written");
            self.state.metrics.observe_protection_event(tenant, "audit_write_failed");
            // Nothing is sent yet: a response whose audit record is lost is withheld.
            if guard.fail(format!("audit record not written: {e}")) == FailMode::Closed {
                withhold(&mut completion);
                self.state.metrics.observe_protection_event(tenant, "failed_closed");
            }
        }
        Ok((completion, true))
    }

    /// Metrics and log lines for the outcome, what the pipeline learns from it, and the
    /// audit record it needs, if any.
    fn conclude(&self, guard: &ResponseGuard, delivery: Delivery) -> Option<AuditRecord> {
        let ResponseRecord { tenant, model, request_id, .. } = &self.record;
        // The id may be the client's: logged only when it is a plain identifier.
        let request_id = crate::redact::identifier(request_id);
        let request_id = request_id.as_str();
        let metrics = &self.state.metrics;
        for (rule, action, count) in guard.finding_counts() {
            metrics.observe_findings(tenant, rule, action.as_str(), count);
        }
        if let Some(failure) = guard.failure() {
            let event = match failure.mode {
                FailMode::Closed => "failed_closed",
                FailMode::Open => "failed_open",
            };
            metrics.observe_protection_event(tenant, event);
            tracing::error!(request_id, tenant, event, reason = failure.reason, "the firewall failed on a response");
        }
        if let Some(e) = guard.backend_error() {
            metrics.observe_backend_error(model, e.kind());
            if delivery == Delivery::Stream {
                let status = e.status().as_u16();
                tracing::warn!(request_id, tenant, model, status, kind = e.kind(), error = %e.log_message(), detail = e.log_detail(), "the backend failed mid-stream");
            }
        }
        if guard.blocked() {
            let rules: Vec<&str> = guard.findings().iter().map(|f| f.finding.rule_id.as_str()).collect();
            tracing::warn!(
                request_id,
                tenant,
                ?rules,
                unlisted_findings = guard.unlisted_findings(),
                released_bytes = guard.released_bytes(),
                "response blocked by the firewall"
            );
        }
        self.state.protection.on_response(tenant, guard);
        audit_record(&self.record, guard)
    }
}

/// The audit record a response needs: one with a block or a redaction, or whose firewall
/// failed closed.
fn audit_record(response: &ResponseRecord, guard: &ResponseGuard) -> Option<AuditRecord> {
    let findings: Vec<firewall::Finding> = guard.findings().iter().map(|f| f.finding.clone()).collect();
    let action = findings.iter().map(|f| f.action).filter(|a| *a > Action::Log).max();
    let failed_closed = guard.failure().filter(|f| f.mode == FailMode::Closed);
    if action.is_none() && failed_closed.is_none() {
        return None;
    }
    let ctx = AuditContext {
        tenant: response.tenant.clone(),
        model: response.model.clone(),
        request_id: response.request_id.clone(),
    };
    let record = AuditRecord::with_id(
        response.audit_id,
        ctx,
        action.unwrap_or(Action::Block),
        &findings,
        guard.released_bytes() as u64,
    )
    .with_unlisted_findings(guard.unlisted_findings());
    Some(match failed_closed {
        Some(f) => record.failed_closed(format!("firewall failed: {}", f.reason)),
        None => record,
    })
}

/// Empties every choice of a completion that must not be delivered.
fn withhold(completion: &mut ChatCompletion) {
    for choice in &mut completion.choices {
        choice.message.content = None;
        choice.message.refusal = None;
        choice.message.tool_calls.clear();
        choice.logprobs = None;
        choice.finish_reason = Some(CONTENT_FILTER.to_owned());
    }
}
