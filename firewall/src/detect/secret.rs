//! Ownership of secret values: whose secret did a rule just find?
//!
//! The gateway records, per tenant, [`secret_fingerprints`] of what the tenant sends (keyed
//! hashes of every value a secret rule matches there, and of its long prefixes); the
//! firewall looks each secret finding's value up through [`NgramOwners`] and rewrites the
//! finding: the responding tenant's own secret gets `ScanContext::own_secrets` and
//! [`Detail::Own`]; a secret only other tenants own blocks, critical, whatever its rule says;
//! an unknown secret keeps its rule's verdict.
//!
//! A value is hashed in its rules-view form (see `canon`), so a disguised echo of a secret
//! hashes as the secret. Prefixes down to [`PREFIX_SHARE`] of the value's characters are
//! recorded too, so a truncated echo is attributed. A value nobody owns is looked up again
//! undoing each rewriting (see `rewrite`): a finding attributed so names that rewriting.
//! Hashes are SipHash-1-3 under the n-gram key, domain-separated from n-gram and lead hashes
//! by their first input byte.

use std::hash::Hasher;
use std::sync::Arc;

use siphasher::sip::SipHasher13;

use crate::canon;
use crate::detect::{NgramKey, NgramOwners, OwnerSet, Rewrite, ScanContext};
use crate::rules::ruleset::Ruleset;
use crate::verdict::{Action, Detail, DetectorKind, Finding, Severity};

/// Shortest recorded prefix, as a share of the value's characters (rounded up).
pub const PREFIX_SHARE: f64 = 0.6;

/// First byte hashed for a secret value (0xfd never occurs in UTF-8; n-grams start with a
/// word, leads with 0xfe).
const SECRET_DOMAIN: u8 = 0xfd;

/// Where the owners of secret values are looked up.
#[derive(Clone)]
pub struct SecretOwnership {
    pub key: NgramKey,
    pub owners: Arc<dyn NgramOwners>,
}

fn hash_value(key: &NgramKey, value: &str) -> u64 {
    let mut h = SipHasher13::new_with_key(&key.0);
    h.write_u8(SECRET_DOMAIN);
    h.write(value.as_bytes());
    h.finish()
}

/// The keyed hashes of every value a secret rule matches in `text` (on the raw text and on
/// its rules view), each in its rules-view form, with those of its prefixes of every
/// character length from `ceil(PREFIX_SHARE * len)` to `len - 1`. Matches that only the
/// words around them turned down (candidates) are included: how the owner happened to word
/// its secret must not decide whether it is protected, any more than how a response words
/// it decides whether it leaks. Canaries and the other detectors' findings are not secrets
/// of a tenant and are left out.
pub fn secret_fingerprints(rules: &Ruleset, text: &str, key: &NgramKey) -> Vec<u64> {
    let mut out = Vec::new();
    for f in rules.matches(text, &ScanContext::anonymous()).iter().filter(|f| f.kind == DetectorKind::Secret) {
        let value = canon::rules_string(text.get(f.start..f.end).unwrap_or(""), false);
        let ends: Vec<usize> =
            value.char_indices().map(|(i, _)| i).skip(1).chain(std::iter::once(value.len())).collect();
        let len = ends.len();
        let shortest = ((len as f64) * PREFIX_SHARE).ceil() as usize;
        for chars in shortest.max(1)..=len {
            if let Some(&end) = ends.get(chars - 1) {
                out.push(hash_value(key, &value[..end]));
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Rewrites the secret findings among `findings` by who owns their value (`cfg`, when the
/// scan has an ownership index); `value` gives a finding's value in rules-view form. A
/// candidate ([`Finding::is_candidate`]) whose value another tenant owns blocks like any
/// foreign secret; every other candidate is dropped.
pub(crate) fn settle(
    cfg: Option<&SecretOwnership>,
    ctx: &ScanContext,
    findings: &mut Vec<Finding>,
    value: impl Fn(&Finding) -> String,
) {
    if let Some(cfg) = cfg {
        // A finding from an encoded layer was settled there, on its decoded value.
        for f in findings.iter_mut().filter(|f| f.kind == DetectorKind::Secret && f.encoding.is_none()) {
            let found = value(f);
            let known = |o: &OwnerSet| !o.tenants.is_empty() || o.model_native;
            let mut owners = cfg.owners.owners(hash_value(&cfg.key, &found));
            // Rewritten (backwards, in ROT13, ...), a value is still its owner's.
            for r in Rewrite::ALL {
                if known(&owners) {
                    break;
                }
                owners = cfg.owners.owners(hash_value(&cfg.key, &r.undo(&found)));
                if known(&owners) {
                    f.encoding = Some(r.encoding());
                }
            }
            if owners.model_native {
                continue;
            }
            if owners.tenants.iter().any(|t| !ctx.is_foreign(t)) {
                if !f.is_candidate() {
                    f.action = if ctx.own_secrets == Action::Allow { Action::Log } else { ctx.own_secrets };
                    f.detail = Detail::Own;
                }
            } else if !owners.tenants.is_empty() {
                f.action = Action::Block;
                f.severity = Severity::Critical;
                f.detail = Detail::Foreign { owners: owners.tenants, shared_by: owners.shared_by };
            }
        }
    }
    findings.retain(|f| !f.is_candidate());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::ngram::tests::{MapOwners, KEY};
    use crate::detect::OwnerSet;
    use crate::rules::ruleset::LoadOptions;

    const RULES: &str = r#"
[[rule]]
id = "demo-key"
description = "demo"
severity = "medium"
action = "redact"
regex = '''\b(dmo_[a-z0-9]{12})\b'''
secret_group = 1
keywords = ["dmo_"]

[[canary]]
id = "acme-canary"
owner = "acme"
strings = ["ACME-CANARY-7f3a9c"]
"#;

    fn rules() -> Ruleset {
        let loaded = Ruleset::load_sources(&[crate::RuleSource::new("t.toml", RULES)], LoadOptions::default());
        assert!(loaded.is_ok(), "{loaded:?}");
        loaded.unwrap_or_else(|_| Ruleset::empty())
    }

    #[test]
    fn fingerprints_cover_the_value_and_its_long_prefixes_only() {
        let rules = rules();
        let got = secret_fingerprints(&rules, "key dmo_abcdef123456 and ACME-CANARY-7f3a9c", &KEY);
        // 16 characters: prefixes of 10..=15 characters and the whole value.
        assert_eq!(got.len(), 7);
        assert!(got.contains(&hash_value(&KEY, "dmo_abcdef123456")));
        assert!(got.contains(&hash_value(&KEY, "dmo_abcdef")));
        assert!(!got.contains(&hash_value(&KEY, "dmo_abcde")));
        // A disguised copy hashes the same.
        assert_eq!(secret_fingerprints(&rules, "key ｄｍｏ_ａbcdef12\u{200B}3456", &KEY), got);
    }

    #[test]
    fn own_foreign_and_unknown_secrets() {
        let rules = rules();
        let mut map = MapOwners::default();
        for h in secret_fingerprints(&rules, "dmo_abcdef123456", &KEY) {
            map.0.insert(h, OwnerSet { tenants: vec!["acme".into()], shared_by: 1, model_native: false });
        }
        let cfg = SecretOwnership { key: KEY, owners: Arc::new(map) };
        let text = "x dmo_abcdef123456 y dmo_zzzzzzzzzzzz";
        let mut found = rules.scan(text);
        let value = |f: &Finding| canon::rules_string(&text[f.start..f.end], false);
        let mut mine = found.clone();
        settle(Some(&cfg), &ScanContext::new("acme"), &mut mine, value);
        assert_eq!((mine[0].action, &mine[0].detail), (Action::Log, &Detail::Own));
        assert_eq!((mine[1].action, &mine[1].detail), (Action::Redact, &Detail::None), "unknown: as its rule says");
        let allow = ScanContext { own_secrets: Action::Allow, ..ScanContext::new("acme") };
        let mut again = rules.scan(text);
        settle(Some(&cfg), &allow, &mut again, value);
        assert_eq!(again[0].action, Action::Log);
        settle(Some(&cfg), &ScanContext::new("globex"), &mut found, value);
        assert_eq!((found[0].action, found[0].severity), (Action::Block, Severity::Critical));
        assert!(matches!(&found[0].detail, Detail::Foreign { owners, .. } if owners == &["acme"]));
    }
}
