//! Throttling of admin-token guesses (`[admin_throttle]`): wrong tokens are counted per
//! client address and over all clients within a sliding window; past either limit, every
//! admin login from the client (or from everyone) is refused with 429 for the cooldown,
//! a right token included, so that guessing cannot go on and a lucky guess is not told.
//!
//! The client is the TCP peer address ([`ClientIp`]); `X-Forwarded-For` is not trusted
//! (a guesser would send a fresh one with every try). IPv6 peers count per /64, the block
//! one host usually holds. The global limit covers guessers with many addresses. At most
//! [`MAX_CLIENTS`] addresses are tracked; past that, new ones count only globally.
//!
//! Invariants: a refused attempt never compares the token; the tables are bounded.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;

use crate::config::AdminThrottleConfig;
use crate::metrics::{Exposition, Kind};

/// Most client addresses with failures tracked at once.
pub const MAX_CLIENTS: usize = 4096;

/// The TCP peer's address, when the server was started with connect info (tests that
/// drive the router without a socket have none: they share one bucket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientIp(pub Option<IpAddr>);

impl<S: Send + Sync> FromRequestParts<S> for ClientIp {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<ClientIp, Infallible> {
        Ok(ClientIp(parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip())))
    }
}

/// Attempts are refused for `retry_after_s` more seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled {
    pub retry_after_s: u64,
    /// Whether everyone is locked out, not only this client.
    pub global: bool,
}

/// Recent failures of one client (or of all) and the lock they caused.
#[derive(Debug, Default)]
struct Window {
    /// Times of failures within the window, oldest first; never longer than the limit.
    failures: VecDeque<Instant>,
    locked_until: Option<Instant>,
}

impl Window {
    /// Seconds left of a lock in force at `now`.
    fn locked(&self, now: Instant) -> Option<u64> {
        let left = self.locked_until?.checked_duration_since(now).filter(|d| !d.is_zero())?;
        Some(left.as_secs() + u64::from(left.subsec_nanos() > 0))
    }

    fn fail(&mut self, now: Instant, limit: u32, window: Duration, cooldown: Duration) {
        while self.failures.front().is_some_and(|t| now.duration_since(*t) >= window) {
            self.failures.pop_front();
        }
        self.failures.push_back(now);
        if self.failures.len() >= limit as usize {
            self.failures.clear();
            self.locked_until = Some(now + cooldown);
        }
    }

    /// Nothing worth keeping: no lock in force, no failure in the window.
    fn idle(&self, now: Instant, window: Duration) -> bool {
        self.locked(now).is_none() && self.failures.back().is_none_or(|t| now.duration_since(*t) >= window)
    }
}

#[derive(Debug, Default)]
struct Windows {
    clients: HashMap<Option<IpAddr>, Window>,
    global: Window,
}

/// The admin login throttle; one per gateway.
#[derive(Debug)]
pub struct LoginThrottle {
    config: AdminThrottleConfig,
    windows: Mutex<Windows>,
    failures: AtomicU64,
    throttled_client: AtomicU64,
    throttled_global: AtomicU64,
}

impl LoginThrottle {
    pub fn new(config: AdminThrottleConfig) -> Self {
        LoginThrottle {
            config,
            windows: Mutex::default(),
            failures: AtomicU64::new(0),
            throttled_client: AtomicU64::new(0),
            throttled_global: AtomicU64::new(0),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Windows) -> R) -> R {
        // A poisoned lock only means a panic elsewhere mid-update; the counts stay usable.
        let mut guard = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// Refuses an attempt from `client` while it (or everyone) is locked out; counted.
    pub fn check(&self, client: ClientIp, now: Instant) -> Result<(), Throttled> {
        let key = bucket(client);
        let refusal = self.with(|w| {
            if let Some(s) = w.global.locked(now) {
                return Some(Throttled { retry_after_s: s, global: true });
            }
            w.clients.get(&key).and_then(|c| c.locked(now)).map(|s| Throttled { retry_after_s: s, global: false })
        });
        match refusal {
            None => Ok(()),
            Some(t) => {
                let counter = if t.global { &self.throttled_global } else { &self.throttled_client };
                counter.fetch_add(1, Ordering::Relaxed);
                Err(t)
            }
        }
    }

    /// A wrong token from `client`.
    pub fn record_failure(&self, client: ClientIp, now: Instant) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        let c = self.config;
        let (window, cooldown) = (Duration::from_secs(c.window_secs), Duration::from_secs(c.cooldown_secs));
        let key = bucket(client);
        self.with(|w| {
            w.global.fail(now, c.global_failures, window, cooldown);
            if !w.clients.contains_key(&key) && w.clients.len() >= MAX_CLIENTS {
                w.clients.retain(|_, e| !e.idle(now, window));
            }
            if w.clients.contains_key(&key) || w.clients.len() < MAX_CLIENTS {
                w.clients.entry(key).or_default().fail(now, c.client_failures, window, cooldown);
            }
        });
    }

    /// A right token from `client`: its earlier failures no longer count.
    pub fn record_success(&self, client: ClientIp) {
        let key = bucket(client);
        self.with(|w| {
            if w.clients.get(&key).is_some_and(|c| c.locked_until.is_none()) {
                w.clients.remove(&key);
            }
        });
    }

    /// The throttle's counters for `/metrics`.
    pub fn write_metrics(&self, out: &mut Exposition) {
        out.family("crossguard_admin_login_failures_total", Kind::Counter, "Admin logins refused for a wrong token.")
            .sample(&[], self.failures.load(Ordering::Relaxed));
        let mut f = out.family(
            "crossguard_admin_login_throttled_total",
            Kind::Counter,
            "Admin logins refused with 429 by [admin_throttle].",
        );
        for (scope, counter) in [("client", &self.throttled_client), ("global", &self.throttled_global)] {
            f.sample(&[("scope", scope)], counter.load(Ordering::Relaxed));
        }
    }
}

/// The key a client counts under: its IPv4 address, or its IPv6 /64.
fn bucket(client: ClientIp) -> Option<IpAddr> {
    client.0.map(|ip| match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
        v4 => v4,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttle(client_failures: u32, global_failures: u32) -> LoginThrottle {
        LoginThrottle::new(AdminThrottleConfig {
            client_failures,
            global_failures,
            window_secs: 60,
            cooldown_secs: 120,
        })
    }

    fn ip(text: &str) -> ClientIp {
        ClientIp(text.parse().ok())
    }

    #[test]
    fn a_client_is_locked_after_its_failures_and_others_are_not() {
        let t = throttle(3, 100);
        let now = Instant::now();
        for _ in 0..2 {
            t.record_failure(ip("10.0.0.1"), now);
        }
        assert_eq!(t.check(ip("10.0.0.1"), now), Ok(()), "under the limit");
        t.record_failure(ip("10.0.0.1"), now);
        assert_eq!(t.check(ip("10.0.0.1"), now), Err(Throttled { retry_after_s: 120, global: false }));
        assert_eq!(t.check(ip("10.0.0.2"), now), Ok(()));
        let later = now + Duration::from_secs(119);
        assert_eq!(t.check(ip("10.0.0.1"), later).map_err(|e| e.retry_after_s), Err(1));
        assert_eq!(t.check(ip("10.0.0.1"), now + Duration::from_secs(120)), Ok(()), "the cooldown ends");
        assert!(Exposition::text_of(|out| t.write_metrics(out))
            .contains("crossguard_admin_login_throttled_total{scope=\"client\"} 2"));
    }

    #[test]
    fn failures_older_than_the_window_do_not_count() {
        let t = throttle(2, 100);
        let now = Instant::now();
        t.record_failure(ip("10.0.0.1"), now);
        t.record_failure(ip("10.0.0.1"), now + Duration::from_secs(61));
        assert_eq!(t.check(ip("10.0.0.1"), now + Duration::from_secs(61)), Ok(()));
    }

    #[test]
    fn the_global_limit_locks_everyone_out() {
        let t = throttle(3, 4);
        let now = Instant::now();
        for i in 0..4 {
            t.record_failure(ip(&format!("10.0.1.{i}")), now);
        }
        let fresh = t.check(ip("192.0.2.7"), now);
        assert_eq!(fresh, Err(Throttled { retry_after_s: 120, global: true }));
    }

    #[test]
    fn ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() {
        let t = throttle(2, 100);
        let now = Instant::now();
        t.record_failure(ip("2001:db8:1:2::1"), now);
        t.record_failure(ip("2001:db8:1:2:ffff::9"), now);
        assert!(t.check(ip("2001:db8:1:2::77"), now).is_err(), "same /64");
        assert!(t.check(ip("2001:db8:1:3::1"), now).is_ok(), "another /64");
        t.record_failure(ip("::ffff:10.9.9.9"), now);
        t.record_failure(ip("10.9.9.9"), now);
        assert!(t.check(ip("10.9.9.9"), now).is_err());
    }

    #[test]
    fn success_forgets_failures_but_not_a_lock() {
        let t = throttle(2, 100);
        let now = Instant::now();
        t.record_failure(ip("10.0.0.1"), now);
        t.record_success(ip("10.0.0.1"));
        t.record_failure(ip("10.0.0.1"), now);
        assert_eq!(t.check(ip("10.0.0.1"), now), Ok(()));
        t.record_failure(ip("10.0.0.1"), now);
        t.record_success(ip("10.0.0.1"));
        assert!(t.check(ip("10.0.0.1"), now).is_err());
    }

    #[test]
    fn the_client_table_is_bounded() {
        let t = throttle(1_000, 1_000_000);
        let now = Instant::now();
        for i in 0..(MAX_CLIENTS as u32 + 100) {
            t.record_failure(ClientIp(Some(IpAddr::V4(i.into()))), now);
        }
        assert_eq!(t.with(|w| w.clients.len()), MAX_CLIENTS);
    }
}
