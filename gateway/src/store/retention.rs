//! Audit retention: which record goes when the audit log is full.
//!
//! Records fall into *classes*, one per (tenant, severity). When the log holds its cap, the
//! oldest record of the class holding the most records is evicted (on a tie, the lower
//! severity's): a max-min fair share. A tenant flooding low-severity blocks fills its own
//! class, which is then the largest and pays for every new record, so the flood can evict
//! neither its own higher-severity records nor any other tenant's; a class is only ever cut
//! down to the size of the next largest. Both stores apply this policy: the embedded one
//! with `Retention`, Redis in its append script (see `store::redis`).
//!
//! Owns the class bookkeeping and the eviction counts; the records themselves are the
//! stores'.

use std::collections::{BTreeMap, HashMap, VecDeque};

use firewall::Severity;
use serde::Serialize;

use crate::audit::{severity_name, AuditRecord};
use crate::metrics::{Exposition, Kind};

/// One retention class.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Class {
    pub tenant: String,
    pub severity: Severity,
}

impl Class {
    pub fn of(record: &AuditRecord) -> Class {
        Class { tenant: record.tenant().to_owned(), severity: record.severity() }
    }

    /// `<severity>:<tenant>`, as Redis keys and fields name it.
    pub fn key(&self) -> String {
        format!("{}:{}", severity_name(self.severity), self.tenant)
    }
}

/// Records of one class evicted to keep the log within its cap.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditEviction {
    pub tenant: String,
    #[serde(serialize_with = "serialize_severity")]
    pub severity: Severity,
    pub evicted: u64,
}

fn serialize_severity<S: serde::Serializer>(s: &Severity, ser: S) -> Result<S::Ok, S::Error> {
    ser.serialize_str(severity_name(*s))
}

/// The embedded store's classes: each class's record sequence numbers, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Retention {
    classes: HashMap<Class, VecDeque<u64>>,
    evicted: BTreeMap<Class, u64>,
}

impl Retention {
    pub(crate) fn add(&mut self, class: Class, seq: u64) {
        self.classes.entry(class).or_default().push_back(seq);
    }

    /// The sequence number of the record to evict (the oldest of the largest class), and
    /// counts it; `None` when no class holds a record.
    pub(crate) fn evict(&mut self) -> Option<u64> {
        // Most records first; on a tie, the lowest severity.
        let class = self
            .classes
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .max_by_key(|(c, q)| (q.len(), std::cmp::Reverse(c.severity)))?
            .0
            .clone();
        let queue = self.classes.get_mut(&class)?;
        let seq = queue.pop_front()?;
        if queue.is_empty() {
            self.classes.remove(&class);
        }
        *self.evicted.entry(class).or_default() += 1;
        Some(seq)
    }

    pub(crate) fn evictions(&self) -> Vec<AuditEviction> {
        self.evicted
            .iter()
            .map(|(c, n)| AuditEviction { tenant: c.tenant.clone(), severity: c.severity, evicted: *n })
            .collect()
    }
}

/// `/metrics` family of audit evictions.
pub fn write_metrics(out: &mut Exposition, evictions: &[AuditEviction]) {
    let mut f = out.family(
        "crossguard_audit_evicted_total",
        Kind::Counter,
        "Audit records evicted from the log to keep it within store.audit_max_len, by tenant and severity.",
    );
    for e in evictions {
        f.sample(&[("tenant", &e.tenant), ("severity", severity_name(e.severity))], e.evicted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(tenant: &str, severity: Severity) -> Class {
        Class { tenant: tenant.into(), severity }
    }

    #[test]
    fn the_largest_class_pays_and_ties_go_to_the_lower_severity() {
        let mut r = Retention::default();
        r.add(class("acme", Severity::High), 0);
        r.add(class("mallory", Severity::Low), 1);
        r.add(class("mallory", Severity::Low), 2);
        r.add(class("mallory", Severity::High), 3);
        assert_eq!(r.evict(), Some(1));
        // now every class holds one: the low one goes first
        assert_eq!(r.evict(), Some(2));
        let ev = r.evictions();
        assert_eq!(ev, [AuditEviction { tenant: "mallory".into(), severity: Severity::Low, evicted: 2 }]);
        assert!(Exposition::text_of(|out| write_metrics(out, &ev))
            .contains("crossguard_audit_evicted_total{tenant=\"mallory\",severity=\"low\"} 2"));
    }
}
