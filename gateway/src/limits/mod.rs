//! Per-tenant limits on chat completions: requests in flight, requests per minute, tokens
//! per minute; and the per-model caps on `n` and `max_tokens` ([`check_caps`]).
//!
//! A request is admitted or refused whole, before the backend is asked: admission holds
//! one concurrency slot and takes one request and its token estimate from the tenant's
//! per-minute buckets ([`bucket`]); the returned [`Admission`] gives the slot back and
//! reconciles the tokens when it is dropped, which happens when the backend's event stream
//! ends or is dropped (a finished stream, a client that went away, a backend failure).
//!
//! How tokens are counted (OpenAI's way, roughly): at admission the estimate is the
//! prompt's text bytes / 4 (every message's text, tool-call arguments and tool results;
//! tool definitions are not counted) plus `max_tokens` × `n` when the client set a
//! `max_tokens`. At the end the tenant is charged what was used instead: the backend's
//! reported `usage.total_tokens`, or, when it reported none, the prompt estimate plus the
//! streamed completion's bytes / 4. An answer that used less than reserved gives the rest
//! back; one that used more leaves the tenant in debt (at most one minute's budget), which
//! later requests wait out.
//!
//! Refusals are [`RateLimited`] errors (HTTP 429 with `Retry-After` and OpenAI's
//! `x-ratelimit-*` headers), counted per tenant and limit for `/metrics`.

pub mod bucket;
pub mod headers;

mod admission;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use axum::http::HeaderMap;

pub use admission::{check_caps, Admission, Ask};
use bucket::{Bucket, Wait};
use headers::{Quota, RateHeaders};

use crate::config::{LimitSettings, LimitsConfig};
use crate::metrics::{Exposition, Kind};

/// Milliseconds from a fixed origin; injected so tests control time.
pub trait Clock: Send + Sync {
    fn now_ms(&self) -> u64;
}

/// The process's monotonic clock, counted from when it was made.
#[derive(Debug)]
pub struct MonotonicClock(Instant);

impl MonotonicClock {
    pub fn new() -> Self {
        MonotonicClock(Instant::now())
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        self.0.elapsed().as_millis() as u64
    }
}

/// Which limit refused a request (the `limit` label of `crossguard_rate_limited_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LimitKind {
    ConcurrentRequests,
    RequestsPerMinute,
    TokensPerMinute,
}

impl LimitKind {
    pub fn label(self) -> &'static str {
        match self {
            LimitKind::ConcurrentRequests => "concurrent_requests",
            LimitKind::RequestsPerMinute => "requests_per_minute",
            LimitKind::TokensPerMinute => "tokens_per_minute",
        }
    }
}

/// A request refused by a limit: what the client is told, and when to come back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RateLimited {
    pub limit: LimitKind,
    message: String,
    /// `None`: waiting does not help (the request is larger than a minute's budget).
    pub retry_after_ms: Option<u64>,
    /// The tenant's budgets when it was refused.
    pub headers: RateHeaders,
}

impl RateLimited {
    /// OpenAI's error `type` for rate limits: the budget that ran out.
    pub fn openai_type(&self) -> &'static str {
        match self.limit {
            LimitKind::ConcurrentRequests | LimitKind::RequestsPerMinute => "requests",
            LimitKind::TokensPerMinute => "tokens",
        }
    }

    /// `Retry-After` and the `x-ratelimit-*` headers.
    pub fn write_headers(&self, out: &mut HeaderMap) {
        self.headers.write(out);
        if let Some(ms) = self.retry_after_ms {
            headers::write_retry_after(out, ms);
        }
    }
}

impl From<RateLimited> for crate::error::ApiError {
    fn from(refused: RateLimited) -> Self {
        crate::error::ApiError::RateLimited(Box::new(refused))
    }
}

/// Every tenant's limits and counters.
pub struct Limiter {
    config: LimitsConfig,
    clock: Arc<dyn Clock>,
    /// Tenant id -> its state, made at its first request (ids come from config).
    tenants: Mutex<HashMap<String, Arc<TenantLimiter>>>,
    /// (tenant, limit) -> refusals, for `/metrics`.
    refused: Mutex<BTreeMap<(String, LimitKind), u64>>,
}

/// One tenant's settings and counters.
struct TenantLimiter {
    id: String,
    settings: LimitSettings,
    clock: Arc<dyn Clock>,
    state: Mutex<TenantState>,
}

struct TenantState {
    in_flight: u32,
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means another thread panicked mid-update; counters stay usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Limiter {
    pub fn new(config: LimitsConfig) -> Limiter {
        Limiter::with_clock(config, Arc::new(MonotonicClock::new()))
    }

    pub fn with_clock(config: LimitsConfig, clock: Arc<dyn Clock>) -> Limiter {
        Limiter { config, clock, tenants: Mutex::new(HashMap::new()), refused: Mutex::new(BTreeMap::new()) }
    }

    /// Admits a request of `tenant` costing `ask`, or says which limit refuses it.
    pub fn admit(&self, tenant: &str, ask: Ask) -> Result<Admission, RateLimited> {
        let limiter = self.tenant(tenant);
        match limiter.admit(ask) {
            Ok(headers) => Ok(Admission::new(limiter, ask, headers)),
            Err(refused) => {
                *lock(&self.refused).entry((tenant.to_owned(), refused.limit)).or_default() += 1;
                Err(refused)
            }
        }
    }

    fn tenant(&self, tenant: &str) -> Arc<TenantLimiter> {
        let mut tenants = lock(&self.tenants);
        if let Some(t) = tenants.get(tenant) {
            return Arc::clone(t);
        }
        let settings = self.config.for_tenant(tenant);
        let now = self.clock.now_ms();
        let state = TenantState {
            in_flight: 0,
            requests: settings.requests_per_minute.map(|n| Bucket::full(n, now)),
            tokens: settings.tokens_per_minute.map(|n| Bucket::full(n, now)),
        };
        let limiter = Arc::new(TenantLimiter {
            id: tenant.to_owned(),
            settings,
            clock: Arc::clone(&self.clock),
            state: Mutex::new(state),
        });
        tenants.insert(tenant.to_owned(), Arc::clone(&limiter));
        limiter
    }

    /// `tenant`'s requests in flight now.
    pub fn in_flight(&self, tenant: &str) -> u32 {
        lock(&self.tenant(tenant).state).in_flight
    }

    /// The `crossguard_rate_limited_total` family for `/metrics`.
    pub fn write_metrics(&self, out: &mut Exposition) {
        let mut f = out.family(
            "crossguard_rate_limited_total",
            Kind::Counter,
            "Requests refused with 429 by a tenant limit, by tenant and limit.",
        );
        for ((tenant, limit), n) in lock(&self.refused).iter() {
            f.sample(&[("tenant", tenant), ("limit", limit.label())], n);
        }
    }
}

impl TenantLimiter {
    /// Takes a slot, a request and the estimate, all or nothing.
    fn admit(&self, ask: Ask) -> Result<RateHeaders, RateLimited> {
        let now = self.clock.now_ms();
        let mut st = lock(&self.state);
        let max = self.settings.max_concurrent_requests;
        if st.in_flight >= max {
            let message = format!(
                "Too many concurrent requests for tenant `{}`: limit {max} in flight. Retry when one of them has finished.",
                self.id
            );
            return Err(RateLimited {
                limit: LimitKind::ConcurrentRequests,
                message,
                retry_after_ms: Some(1000),
                headers: st.headers(),
            });
        }
        let tokens = ask.total();
        let waits = [
            (LimitKind::RequestsPerMinute, 1, st.requests.as_mut().map(|b| b.wait(1, now))),
            (LimitKind::TokensPerMinute, tokens, st.tokens.as_mut().map(|b| b.wait(tokens, now))),
        ];
        for (kind, asked, wait) in waits {
            match wait {
                None | Some(Wait::None) => {}
                Some(wait) => return Err(self.refusal(&st, kind, asked, wait)),
            }
        }
        if let Some(b) = &mut st.requests {
            b.take(1);
        }
        if let Some(b) = &mut st.tokens {
            b.take(tokens);
        }
        st.in_flight += 1;
        Ok(st.headers())
    }

    fn refusal(&self, st: &TenantState, limit: LimitKind, asked: u64, wait: Wait) -> RateLimited {
        let (what, bucket) = match limit {
            LimitKind::TokensPerMinute => ("tokens per min (TPM)", &st.tokens),
            _ => ("requests per min (RPM)", &st.requests),
        };
        let (cap, left) = bucket.as_ref().map_or((0, 0), |b| (b.limit(), b.remaining()));
        let (message, retry_after_ms) = match wait {
            Wait::Ms(ms) => (
                format!(
                    "Rate limit reached for tenant `{}` on {what}: Limit {cap}, Used {}, Requested {asked}. Please try again in {}.",
                    self.id,
                    cap - left,
                    headers::go_duration(ms)
                ),
                Some(ms),
            ),
            _ => (
                format!("Request too large for tenant `{}` on {what}: Limit {cap}, Requested {asked}. Lower max_tokens or shorten the messages.", self.id),
                None,
            ),
        };
        RateLimited { limit, message, retry_after_ms, headers: st.headers() }
    }

    /// Gives back a slot and charges `used` tokens instead of the `reserved` ones.
    fn release(&self, reserved: u64, used: u64) {
        let now = self.clock.now_ms();
        let mut st = lock(&self.state);
        st.in_flight = st.in_flight.saturating_sub(1);
        if let Some(b) = &mut st.tokens {
            b.refill(now);
            b.adjust(reserved as i64 - used.min(i64::MAX as u64) as i64);
        }
    }
}

impl TenantState {
    fn headers(&self) -> RateHeaders {
        let quota = |b: &Bucket| Quota { limit: b.limit(), remaining: b.remaining(), reset_ms: b.reset_ms() };
        RateHeaders { requests: self.requests.as_ref().map(quota), tokens: self.tokens.as_ref().map(quota) }
    }
}

#[cfg(test)]
mod tests;
