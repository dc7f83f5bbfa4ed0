//! Per-tenant statistics: running count, mean and variance (Welford) of character
//! entropy, per-token surprisal and predictive entropy, the baselines the firewall's
//! entropy detector judges a response against.
//!
//! Owns the in-memory view the firewall reads through [`Baselines`] (a read lock, no I/O)
//! and its synchronisation with the store: observations accumulate locally as `pending`,
//! [`Statistics::sync`] merges them into the store (atomically, so replicas add up) and
//! reloads everyone's totals. A tenant with fewer than `min_samples` observations of a
//! metric is judged against the global baseline (all tenants together).
//!
//! Invariant: `combined` = `base` ⊕ `inflight` ⊕ `pending` for every tenant and metric at
//! all times, and `global` is the merge of all of `combined`; so baselines never jump
//! backwards while a sync is under way or after one fails.

use std::collections::HashMap;
use std::sync::RwLock;

use firewall::Observations;
use firewall::{Baseline, Baselines, Metric};
use serde::Serialize;

use crate::audit::metric_name;
use crate::metrics::{Exposition, Kind};
use crate::store::{StatEntry, Store, StoreError, Welford};

/// Tunables.
#[derive(Debug, Clone, Copy)]
pub struct StatsSettings {
    /// A tenant needs this many observations of a metric for its own baseline.
    pub min_samples: u64,
}

impl Default for StatsSettings {
    fn default() -> Self {
        StatsSettings { min_samples: 200 }
    }
}

const METRICS: [Metric; 3] = [Metric::CharEntropy, Metric::Surprisal, Metric::PredictiveEntropy];

fn slot(m: Metric) -> usize {
    match m {
        Metric::CharEntropy => 0,
        Metric::Surprisal => 1,
        Metric::PredictiveEntropy => 2,
    }
}

/// One accumulator per metric, indexed by [`slot`].
type PerMetric = [Welford; 3];

fn merge_into(map: &mut HashMap<String, PerMetric>, tenant: &str, delta: &PerMetric) {
    let entry = match map.get_mut(tenant) {
        Some(e) => e,
        None => map.entry(tenant.to_owned()).or_default(),
    };
    entry.iter_mut().zip(delta).for_each(|(a, b)| a.merge(b));
}

#[derive(Debug, Default)]
struct Inner {
    // what the store held at the last load (all replicas)
    base: HashMap<String, PerMetric>,
    // taken by a sync, not yet acknowledged by the store
    inflight: HashMap<String, PerMetric>,
    // observed here since the last sync
    pending: HashMap<String, PerMetric>,
    combined: HashMap<String, PerMetric>,
    global: PerMetric,
}

impl Inner {
    fn recompute(&mut self) {
        let mut combined = self.base.clone();
        for (t, d) in self.inflight.iter().chain(&self.pending) {
            merge_into(&mut combined, t, d);
        }
        let mut global = PerMetric::default();
        combined.values().for_each(|per| global.iter_mut().zip(per).for_each(|(g, w)| g.merge(w)));
        (self.combined, self.global) = (combined, global);
    }
}

/// One row of the admin API's statistics listing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatRow {
    /// `None` for the global baseline.
    pub tenant: Option<String>,
    pub metric: &'static str,
    pub count: u64,
    pub mean: f64,
    pub stddev: f64,
}

/// The statistics. Share as `Arc<Statistics>`; it is also the firewall's `Baselines`.
#[derive(Debug)]
pub struct Statistics {
    settings: StatsSettings,
    inner: RwLock<Inner>,
    sync_lock: tokio::sync::Mutex<()>,
}

impl Statistics {
    pub fn new(settings: StatsSettings) -> Statistics {
        Statistics { settings, inner: RwLock::new(Inner::default()), sync_lock: tokio::sync::Mutex::new(()) }
    }

    /// Folds in what one response's scanner observed (`StreamScanner`'s observations).
    pub fn observe(&self, tenant: &str, obs: &Observations) {
        let mut delta = PerMetric::default();
        delta[slot(Metric::CharEntropy)] = Welford::from_observed(&obs.char_entropy);
        delta[slot(Metric::Surprisal)] = Welford::from_observed(&obs.surprisal);
        delta[slot(Metric::PredictiveEntropy)] = Welford::from_observed(&obs.predictive_entropy);
        self.observe_delta(tenant, &delta);
    }

    /// Folds in one value.
    pub fn observe_value(&self, tenant: &str, metric: Metric, x: f64) {
        let mut delta = PerMetric::default();
        delta[slot(metric)].add(x);
        self.observe_delta(tenant, &delta);
    }

    fn observe_delta(&self, tenant: &str, delta: &PerMetric) {
        if delta.iter().all(|w| w.count == 0) {
            return;
        }
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        merge_into(&mut inner.pending, tenant, delta);
        merge_into(&mut inner.combined, tenant, delta);
        inner.global.iter_mut().zip(delta).for_each(|(g, d)| g.merge(d));
    }

    /// Merges local observations into the store, then reloads every tenant's totals.
    /// On failure nothing observed is lost: it is merged again at the next sync.
    pub async fn sync(&self, store: &Store) -> Result<(), StoreError> {
        let _one_at_a_time = self.sync_lock.lock().await;
        let deltas: Vec<StatEntry> = {
            let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
            inner.inflight = std::mem::take(&mut inner.pending);
            entries(&inner.inflight)
        };
        let merged = store.merge_stats(&deltas).await;
        {
            let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
            let inflight = std::mem::take(&mut inner.inflight);
            let target = if merged.is_ok() { &mut inner.base } else { &mut inner.pending };
            inflight.iter().for_each(|(t, d)| merge_into(target, t, d));
        }
        merged?;
        let loaded = store.load_stats().await?;
        let mut base: HashMap<String, PerMetric> = HashMap::new();
        for e in loaded {
            base.entry(e.tenant).or_default()[slot(e.metric)] = e.value;
        }
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        inner.base = base;
        inner.recompute();
        Ok(())
    }

    /// Every tenant's statistics and the global ones, for the admin API.
    pub fn rows(&self) -> Vec<StatRow> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let mut tenants: Vec<(&String, &PerMetric)> = inner.combined.iter().collect();
        tenants.sort_by(|a, b| a.0.cmp(b.0));
        let global = std::iter::once((None, &inner.global));
        global
            .chain(tenants.into_iter().map(|(t, p)| (Some(t.clone()), p)))
            .flat_map(|(tenant, per)| {
                METRICS.iter().filter(move |m| per[slot(**m)].count > 0).map(move |m| {
                    let w = per[slot(*m)];
                    StatRow {
                        tenant: tenant.clone(),
                        metric: metric_name(*m),
                        count: w.count,
                        mean: w.mean,
                        stddev: w.variance().sqrt(),
                    }
                })
            })
            .collect()
    }

    /// `/metrics` families: per-tenant and global count, mean and standard deviation.
    pub fn write_metrics(&self, out: &mut Exposition) {
        let rows = self.rows();
        for (name, help, pick) in [
            (
                "crossguard_baseline_samples",
                "Observations behind the baseline, by tenant (none = global) and metric.",
                (|r: &StatRow| r.count as f64) as fn(&StatRow) -> f64,
            ),
            ("crossguard_baseline_mean", "Baseline mean, by tenant (none = global) and metric.", |r: &StatRow| r.mean),
            (
                "crossguard_baseline_stddev",
                "Baseline standard deviation, by tenant (none = global) and metric.",
                |r: &StatRow| r.stddev,
            ),
        ] {
            let mut f = out.family(name, Kind::Gauge, help);
            for r in &rows {
                f.sample(&[("tenant", r.tenant.as_deref().unwrap_or_default()), ("metric", r.metric)], pick(r));
            }
        }
    }
}

fn entries(map: &HashMap<String, PerMetric>) -> Vec<StatEntry> {
    map.iter()
        .flat_map(|(t, per)| {
            METRICS.iter().map(move |m| StatEntry { tenant: t.clone(), metric: *m, value: per[slot(*m)] })
        })
        .filter(|e| e.value.count > 0)
        .collect()
}

/// A label value escaped per the exposition format.
fn as_baseline(w: &Welford) -> Baseline {
    Baseline { mean: w.mean, variance: w.variance(), count: w.count }
}

impl Baselines for Statistics {
    fn baseline(&self, tenant: &str, metric: Metric) -> Option<Baseline> {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let i = slot(metric);
        match inner.combined.get(tenant).map(|p| p[i]) {
            Some(w) if w.count >= self.settings.min_samples => Some(as_baseline(&w)),
            _ if inner.global[i].count >= self.settings.min_samples => Some(as_baseline(&inner.global[i])),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats() -> Statistics {
        Statistics::new(StatsSettings { min_samples: 10 })
    }

    fn feed(s: &Statistics, tenant: &str, metric: Metric, xs: impl IntoIterator<Item = f64>) {
        xs.into_iter().for_each(|x| s.observe_value(tenant, metric, x));
    }

    #[test]
    fn tenants_with_few_samples_get_the_global_baseline() {
        let s = stats();
        assert_eq!(s.baseline("acme", Metric::Surprisal), None);
        feed(&s, "acme", Metric::Surprisal, (0..20).map(|i| f64::from(i % 4)));
        feed(&s, "globex", Metric::Surprisal, [10.0, 12.0]);
        let acme = s.baseline("acme", Metric::Surprisal).unwrap();
        assert!(acme.count == 20 && (acme.mean - 1.5).abs() < 1e-12, "{acme:?}");
        let globex = s.baseline("globex", Metric::Surprisal).unwrap();
        assert_eq!(globex.count, 22, "global: both tenants");
        assert_eq!(s.baseline("acme", Metric::CharEntropy), None);
    }

    #[test]
    fn observations_from_the_scanner_are_folded_in() {
        let s = stats();
        let mut obs = Observations::default();
        (0..12).for_each(|i| obs.char_entropy.add(4.0 + f64::from(i % 2)));
        s.observe("acme", &obs);
        let b = s.baseline("acme", Metric::CharEntropy).unwrap();
        assert_eq!((b.count, b.mean), (12, 4.5));
        assert!((b.variance - 0.272_727).abs() < 1e-5);
        assert_eq!(s.baseline("acme", Metric::Surprisal), None);
    }

    #[tokio::test]
    async fn sync_persists_and_two_processes_add_up() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::memory(dir.path(), 10, &crate::config::ResponsesConfig::default()).unwrap();
        let (a, b) = (stats(), stats());
        feed(&a, "acme", Metric::Surprisal, [1.0, 2.0, 3.0]);
        feed(&b, "acme", Metric::Surprisal, [4.0, 5.0]);
        a.sync(&store).await.unwrap();
        b.sync(&store).await.unwrap();
        a.sync(&store).await.unwrap();
        for s in [&a, &b] {
            let row = s.rows().into_iter().find(|r| r.tenant.as_deref() == Some("acme")).unwrap();
            assert_eq!((row.count, row.mean), (5, 3.0));
        }
        let text = crate::metrics::Exposition::text_of(|out| a.write_metrics(out));
        assert!(text.contains("crossguard_baseline_samples{tenant=\"acme\",metric=\"surprisal\"} 5"), "{text}");
        assert!(text.contains("crossguard_baseline_mean{tenant=\"\",metric=\"surprisal\"} 3"), "{text}");
    }
}
