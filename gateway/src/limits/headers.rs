//! The rate-limit headers as OpenAI sends them: `x-ratelimit-{limit,remaining,reset}-
//! {requests,tokens}`, resets written as Go durations (`1s`, `6m0s`, `20ms`, `1.5s`), and
//! `Retry-After` in whole seconds on a 429.

use axum::http::{header, HeaderMap, HeaderName, HeaderValue};

/// One per-minute budget's state as a response reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub limit: u64,
    pub remaining: u64,
    /// Milliseconds until the budget is whole again.
    pub reset_ms: u64,
}

/// The budgets a tenant has configured; absent ones produce no headers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateHeaders {
    pub requests: Option<Quota>,
    pub tokens: Option<Quota>,
}

impl RateHeaders {
    /// Adds the `x-ratelimit-*` headers of the configured budgets to `headers`.
    pub fn write(&self, headers: &mut HeaderMap) {
        for (suffix, quota) in [("requests", self.requests), ("tokens", self.tokens)] {
            let Some(q) = quota else { continue };
            for (what, value) in [
                ("limit", q.limit.to_string()),
                ("remaining", q.remaining.to_string()),
                ("reset", go_duration(q.reset_ms)),
            ] {
                let name = HeaderName::try_from(format!("x-ratelimit-{what}-{suffix}"));
                if let (Ok(name), Ok(value)) = (name, HeaderValue::try_from(value)) {
                    headers.insert(name, value);
                }
            }
        }
    }
}

/// `Retry-After: <seconds>`, rounded up so a client that waits that long is admitted.
pub fn write_retry_after(headers: &mut HeaderMap, wait_ms: u64) {
    headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs(wait_ms)));
}

/// Whole seconds covering `wait_ms`, at least 1.
pub fn retry_after_secs(wait_ms: u64) -> u64 {
    wait_ms.div_ceil(1000).max(1)
}

/// A duration as Go prints it (what OpenAI's reset headers carry): `0s`, `20ms`, `1.5s`,
/// `6m0s`, `1h2m3s`.
pub fn go_duration(ms: u64) -> String {
    if ms == 0 {
        return "0s".to_owned();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, m, s, frac) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    let seconds = if frac == 0 { s.to_string() } else { format!("{s}.{}", format!("{frac:03}").trim_end_matches('0')) };
    match (h, m) {
        (0, 0) => format!("{seconds}s"),
        (0, m) => format!("{m}m{seconds}s"),
        (h, m) => format!("{h}h{m}m{seconds}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_go() {
        let cases = [
            (0, "0s"),
            (20, "20ms"),
            (1000, "1s"),
            (1500, "1.5s"),
            (1020, "1.02s"),
            (59_999, "59.999s"),
            (360_000, "6m0s"),
            (61_000, "1m1s"),
            (3_723_000, "1h2m3s"),
        ];
        for (ms, text) in cases {
            assert_eq!(go_duration(ms), text, "{ms} ms");
        }
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(
            [retry_after_secs(0), retry_after_secs(1), retry_after_secs(1000), retry_after_secs(1001)],
            [1, 1, 1, 2]
        );
    }

    #[test]
    fn only_configured_budgets_are_written() {
        let mut h = HeaderMap::new();
        RateHeaders { requests: Some(Quota { limit: 3, remaining: 2, reset_ms: 20_000 }), tokens: None }.write(&mut h);
        assert_eq!(h["x-ratelimit-limit-requests"], "3");
        assert_eq!(h["x-ratelimit-remaining-requests"], "2");
        assert_eq!(h["x-ratelimit-reset-requests"], "20s");
        assert!(!h.contains_key("x-ratelimit-limit-tokens"));
    }
}
