//! The canaries the gateway injects: one honeytoken per tenant with `canary = true`,
//! derived from the deployment key (so every replica injects and recognises the same one,
//! across restarts, and nobody without the key can guess it), written into the tenant's
//! system prompt and loaded with the rules as a canary the tenant owns: a response that
//! carries it to anyone else is blocked.

use std::collections::HashMap;

use sha2::{Digest, Sha256};

use crate::api::ChatRequest;
use crate::config::{CanaryPlacement, Config};

/// Every tenant's canary and how it is written into prompts.
pub(super) struct Canaries {
    /// Tenant id -> its honeytoken, for tenants with `canary = true`.
    tokens: HashMap<String, String>,
    /// The line written into the prompt, `{canary}` standing for the token.
    text: String,
    placement: CanaryPlacement,
}

impl Canaries {
    pub(super) fn new(config: &Config, key: &[u8; 16]) -> Canaries {
        let tokens =
            config.tenants.iter().filter(|t| t.canary).map(|t| (t.id.clone(), honeytoken(key, &t.id))).collect();
        Canaries { tokens, text: config.canary.text.clone(), placement: config.canary.placement }
    }

    /// Writes `tenant`'s canary line into `request`'s system prompt, if it has a canary.
    pub(super) fn inject(&self, tenant: &str, request: &mut ChatRequest) {
        if let Some(token) = self.tokens.get(tenant) {
            let line = self.text.replace("{canary}", token);
            request.add_system_line(&line, self.placement == CanaryPlacement::SystemStart);
        }
    }

    /// The canaries as rule-file canaries, one per tenant that has one (sorted by tenant),
    /// to load with the rules.
    pub(super) fn as_rule_canaries(&self) -> Vec<firewall::RawCanary> {
        let mut tenants: Vec<(&String, &String)> = self.tokens.iter().collect();
        tenants.sort();
        tenants
            .into_iter()
            .enumerate()
            .map(|(i, (tenant, token))| firewall::RawCanary {
                id: format!("injected-canary-{}", i + 1),
                owner: tenant.clone(),
                strings: vec![token.clone()],
                description: Some(format!("the canary injected into {tenant}'s system prompts")),
            })
            .collect()
    }
}

/// The tenant's honeytoken: derived from the deployment key, so stable across restarts
/// and replicas, and unguessable without the key.
fn honeytoken(key: &[u8; 16], tenant: &str) -> String {
    let digest =
        Sha256::new().chain_update(b"crossguard canary\0").chain_update(key).chain_update(tenant.as_bytes()).finalize();
    format!("cg-{}", hex::encode(&digest[..12]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn honeytokens_are_per_tenant_and_per_key() {
        let a = honeytoken(&[1; 16], "acme");
        assert_eq!(a, honeytoken(&[1; 16], "acme"));
        assert_ne!(a, honeytoken(&[1; 16], "globex"));
        assert_ne!(a, honeytoken(&[2; 16], "acme"));
        assert_eq!(a.len(), 27);
    }
}
