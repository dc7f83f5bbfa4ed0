//! API key -> tenant. Keys are held only as SHA-256 digests; a presented key is hashed and
//! compared against every configured digest in constant time, without an early exit, so
//! neither the position of a match nor the length of a common prefix leaks through timing.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use axum::http::HeaderMap;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{Secret, TenantConfig};
use crate::error::ApiError;
use crate::login_throttle::{ClientIp, LoginThrottle};

/// The gateway's name for a tenant. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(Arc<str>);

impl TenantId {
    pub fn new(id: &str) -> Self {
        TenantId(Arc::from(id))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The tenant used when no tenants are configured (open mode, local trial only).
pub const ANONYMOUS_TENANT: &str = "anonymous";

/// Resolves bearer tokens to tenants.
#[derive(Debug)]
pub struct Authenticator {
    /// (digest, tenant) for every configured key; empty = open mode.
    keys: Vec<([u8; 32], TenantId)>,
    anonymous: TenantId,
}

impl Authenticator {
    pub fn new(tenants: &[TenantConfig]) -> Self {
        let keys = tenants
            .iter()
            .flat_map(|t| {
                let id = TenantId::new(&t.id);
                t.key_digests.iter().map(move |d| (*d, id.clone()))
            })
            .collect();
        Authenticator { keys, anonymous: TenantId::new(ANONYMOUS_TENANT) }
    }

    /// True when no tenant is configured and every request is the anonymous tenant.
    pub fn is_open(&self) -> bool {
        self.keys.is_empty()
    }

    /// The tenant whose key is in the `Authorization: Bearer` header.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<TenantId, ApiError> {
        if self.is_open() {
            return Ok(self.anonymous.clone());
        }
        let value = headers.get(axum::http::header::AUTHORIZATION).ok_or(ApiError::Unauthorized(
            "You didn't provide an API key. Send it as `Authorization: Bearer <key>`.",
        ))?;
        let key = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .ok_or(ApiError::Unauthorized("Malformed Authorization header: expected `Bearer <key>`."))?;
        self.lookup(key).ok_or(ApiError::Unauthorized("Incorrect API key provided."))
    }

    /// Admits a request bearing the admin token (`Authorization: Bearer <token>`); tenant
    /// keys are not admin tokens. Without a configured token the admin API is off. Every
    /// attempt goes through `throttle`: refused with 429 while `client` (or everyone) is
    /// locked out, and a wrong token counts towards the lock.
    pub fn authorize_admin(
        headers: &HeaderMap,
        token: Option<&Secret>,
        throttle: &LoginThrottle,
        client: ClientIp,
    ) -> Result<(), ApiError> {
        let token = token.ok_or(ApiError::AdminDisabled)?;
        throttle
            .check(client, Instant::now())
            .map_err(|t| ApiError::AdminThrottled { retry_after_s: t.retry_after_s })?;
        let presented = bearer(headers)
            .ok_or(ApiError::Unauthorized("The admin API needs `Authorization: Bearer <admin token>`."))?;
        if bearer_matches(presented, token) {
            throttle.record_success(client);
            Ok(())
        } else {
            throttle.record_failure(client, Instant::now());
            Err(ApiError::Unauthorized("Incorrect admin token."))
        }
    }

    /// Admits a scrape of `/metrics`: anyone when no metrics token is configured, else only
    /// `Authorization: Bearer <metrics token>`.
    pub fn authorize_metrics(headers: &HeaderMap, token: Option<&Secret>) -> Result<(), ApiError> {
        let Some(token) = token else { return Ok(()) };
        match bearer(headers) {
            Some(presented) if bearer_matches(presented, token) => Ok(()),
            _ => Err(ApiError::Unauthorized("`/metrics` needs `Authorization: Bearer <metrics token>`.")),
        }
    }

    fn lookup(&self, key: &str) -> Option<TenantId> {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let mut found: Option<&TenantId> = None;
        for (candidate, tenant) in &self.keys {
            // Every digest is compared; the branch only selects, it never stops the loop.
            if bool::from(candidate.ct_eq(&digest)) {
                found = Some(tenant);
            }
        }
        found.cloned()
    }
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
}

/// Compares digests of equal length, in constant time: neither the token's length nor a
/// common prefix shows in the timing.
fn bearer_matches(presented: &str, token: &Secret) -> bool {
    let (a, b): ([u8; 32], [u8; 32]) =
        (Sha256::digest(presented.as_bytes()).into(), Sha256::digest(token.expose().as_bytes()).into());
    bool::from(a.ct_eq(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn auth() -> Authenticator {
        Authenticator::new(&[
            TenantConfig {
                id: "acme".into(),
                key_digests: vec![Sha256::digest(b"sk-acme-1").into()],
                fail_mode: Default::default(),
                canary: false,
                own_secrets: Default::default(),
                quarantine_when_probing: false,
            },
            TenantConfig {
                id: "globex".into(),
                key_digests: vec![Sha256::digest(b"sk-globex-1").into()],
                fail_mode: Default::default(),
                canary: false,
                own_secrets: Default::default(),
                quarantine_when_probing: false,
            },
        ])
    }

    fn bearer(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn keys_map_to_their_tenant() {
        let a = auth();
        assert_eq!(a.authenticate(&bearer("Bearer sk-acme-1")).unwrap().as_str(), "acme");
        assert_eq!(a.authenticate(&bearer("Bearer sk-globex-1")).unwrap().as_str(), "globex");
    }

    #[test]
    fn wrong_missing_and_malformed_keys_are_401() {
        let a = auth();
        for h in [bearer("Bearer sk-acme-2"), bearer("sk-acme-1"), bearer("Bearer "), HeaderMap::new()] {
            assert_eq!(a.authenticate(&h).unwrap_err().status(), 401);
        }
    }

    #[test]
    fn open_mode_admits_everyone_as_anonymous() {
        let a = Authenticator::new(&[]);
        assert!(a.is_open());
        assert_eq!(a.authenticate(&HeaderMap::new()).unwrap().as_str(), ANONYMOUS_TENANT);
    }
}
