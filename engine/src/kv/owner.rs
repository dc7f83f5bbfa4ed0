//! Who a KV block's contents belong to.
//!
//! Owns the engine's words for a tenant and for the owner of a sequence. The gateway has
//! its own `TenantId`; the engine sees only an opaque name, compared for equality.
//!
//! Invariants: a [`Tenant`] is cheap to clone (shared string), and two tenants are the
//! same exactly when their names are equal.

use std::fmt;
use std::sync::Arc;

/// A tenant, by the name the caller gave it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(Arc<str>);

impl Tenant {
    pub fn new(name: &str) -> Tenant {
        Tenant(Arc::from(name))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Tenant {
    fn from(name: &str) -> Tenant {
        Tenant::new(name)
    }
}

/// The owner of a sequence and of the KV blocks it writes: a tenant and one of its
/// requests. Isolation is between tenants; the request is kept for diagnostics.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner {
    pub tenant: Tenant,
    pub request: Arc<str>,
}

impl Owner {
    pub fn new(tenant: &str, request: &str) -> Owner {
        Owner { tenant: Tenant::new(tenant), request: Arc::from(request) }
    }

    /// The owner of in-process, single-tenant use (tests, benchmarks, embedding without
    /// tenants): every such sequence belongs to the one tenant `local`.
    pub fn local() -> Owner {
        Owner::new("local", "local")
    }
}
