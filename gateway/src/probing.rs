//! Probe watch: the firewall's own verdicts as an oracle, and who is asking it.
//!
//! A response blocked for another tenant's data (a foreign n-gram, canary, secret or KV
//! provenance) tells the asker that somebody sent that text. A tenant that trips such
//! blocks again and again is either being leaked to or is probing — guessing sentences
//! and secrets and watching which ones get blocked. This module counts foreign-data
//! blocks per asking tenant over a sliding window; at `alert_blocks` within the window the
//! tenant is flagged (a metric, the dashboard's tenants page) and, where its config says
//! so, quarantined: its requests are refused until the window no longer holds that many.
//!
//! Invariants: counts are per replica (each replica sees the blocks it served); memory is
//! bounded by `alert_blocks` timestamps per tenant that ever tripped a block.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use firewall::{Action, Detail, Finding};

use crate::metrics::{Exposition, Kind};

/// When a tenant counts as probing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeSettings {
    /// Foreign-data blocks within the window that raise the flag.
    pub alert_blocks: u32,
    pub window_ms: u64,
}

/// One tenant's recent foreign-data blocks.
#[derive(Debug, Default)]
struct Window {
    /// Times (Unix ms) of the newest blocks, oldest first, at most `alert_blocks`.
    blocks: VecDeque<u64>,
    /// Times the tenant went from unflagged to flagged.
    alerts: u64,
    /// Foreign-data blocks since start-up.
    total: u64,
}

impl Window {
    fn flagged(&self, settings: ProbeSettings, now_ms: u64) -> bool {
        self.blocks.len() >= settings.alert_blocks as usize
            && self.blocks.front().is_some_and(|t| now_ms.saturating_sub(*t) < settings.window_ms)
    }
}

/// What the tenants page and `/metrics` show per tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeRow {
    pub tenant: String,
    pub flagged: bool,
    pub alerts: u64,
    pub foreign_blocks: u64,
}

/// Per-tenant foreign-block counts of this replica.
#[derive(Debug)]
pub struct ProbeWatch {
    settings: ProbeSettings,
    tenants: Mutex<HashMap<String, Window>>,
}

/// Whether a finding blocked a response because the text belongs to another tenant.
pub fn is_foreign_block(f: &Finding) -> bool {
    f.action == Action::Block && matches!(f.detail, Detail::Foreign { .. })
}

impl ProbeWatch {
    pub fn new(settings: ProbeSettings) -> ProbeWatch {
        ProbeWatch { settings, tenants: Mutex::default() }
    }

    /// Counts one response of `tenant` that was blocked for foreign data; true when this
    /// block raised the flag (it was not flagged before).
    pub fn observe_foreign_block(&self, tenant: &str, now_ms: u64) -> bool {
        let mut tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        let w = tenants.entry(tenant.to_owned()).or_default();
        let before = w.flagged(self.settings, now_ms);
        w.blocks.push_back(now_ms);
        while w.blocks.len() > self.settings.alert_blocks as usize {
            w.blocks.pop_front();
        }
        w.total += 1;
        let raised = !before && w.flagged(self.settings, now_ms);
        if raised {
            w.alerts += 1;
        }
        raised
    }

    /// Whether `tenant` is flagged now.
    pub fn is_flagged(&self, tenant: &str, now_ms: u64) -> bool {
        let tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        tenants.get(tenant).is_some_and(|w| w.flagged(self.settings, now_ms))
    }

    /// Every tenant that tripped a foreign-data block, by id.
    pub fn rows(&self, now_ms: u64) -> Vec<ProbeRow> {
        let tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
        let mut rows: Vec<ProbeRow> = tenants
            .iter()
            .map(|(t, w)| ProbeRow {
                tenant: t.clone(),
                flagged: w.flagged(self.settings, now_ms),
                alerts: w.alerts,
                foreign_blocks: w.total,
            })
            .collect();
        rows.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        rows
    }

    /// `/metrics` families: foreign-data blocks, alerts and the current flag, per tenant.
    pub fn write_metrics(&self, out: &mut Exposition, now_ms: u64) {
        let rows = self.rows(now_ms);
        let mut f = out.family(
            "crossguard_foreign_blocks_total",
            Kind::Counter,
            "Responses blocked for another tenant's data, by asking tenant.",
        );
        for r in &rows {
            f.sample(&[("tenant", &r.tenant)], r.foreign_blocks);
        }
        let mut f = out.family(
            "crossguard_probing_alerts_total",
            Kind::Counter,
            "Times a tenant was flagged for probing (too many foreign-data blocks in the window).",
        );
        for r in &rows {
            f.sample(&[("tenant", &r.tenant)], r.alerts);
        }
        let mut f = out.family("crossguard_tenant_probing", Kind::Gauge, "1 while a tenant is flagged for probing.");
        for r in &rows {
            f.sample(&[("tenant", &r.tenant)], u8::from(r.flagged));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use firewall::{DetectorKind, Severity};

    fn watch() -> ProbeWatch {
        ProbeWatch::new(ProbeSettings { alert_blocks: 3, window_ms: 1000 })
    }

    #[test]
    fn the_flag_rises_at_the_threshold_within_the_window_and_falls_after_it() {
        let w = watch();
        assert!(!w.observe_foreign_block("acme", 0));
        assert!(!w.observe_foreign_block("acme", 100));
        assert!(!w.is_flagged("acme", 150));
        assert!(w.observe_foreign_block("acme", 200), "third block in the window raises the flag");
        assert!(!w.observe_foreign_block("acme", 300), "already flagged: not raised again");
        assert!(w.is_flagged("acme", 1099));
        assert!(!w.is_flagged("acme", 1100 + 200), "the window moved past the oldest kept block");
        assert!(!w.is_flagged("globex", 200));
        let rows = w.rows(300);
        assert_eq!(rows, [ProbeRow { tenant: "acme".into(), flagged: true, alerts: 1, foreign_blocks: 4 }]);
        assert!(Exposition::text_of(|out| w.write_metrics(out, 300))
            .contains("crossguard_tenant_probing{tenant=\"acme\"} 1"));
    }

    #[test]
    fn blocks_spread_wider_than_the_window_never_flag() {
        let w = watch();
        for i in 0..10 {
            assert!(!w.observe_foreign_block("acme", i * 600));
        }
        assert_eq!(w.rows(6000)[0].alerts, 0);
    }

    #[test]
    fn only_blocks_for_foreign_data_count() {
        let finding = |action, detail| Finding {
            rule_id: "r".into(),
            start: 0,
            end: 1,
            match_start: 0,
            match_end: 1,
            severity: Severity::High,
            action,
            excerpt: String::new(),
            kind: DetectorKind::Ngram,
            detail,
            encoding: None,
        };
        let foreign = || Detail::Foreign { owners: vec!["globex".into()], shared_by: 1 };
        assert!(is_foreign_block(&finding(Action::Block, foreign())));
        assert!(!is_foreign_block(&finding(Action::Log, foreign())));
        assert!(!is_foreign_block(&finding(Action::Block, Detail::None)));
    }
}
