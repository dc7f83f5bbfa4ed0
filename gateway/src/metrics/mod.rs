//! Prometheus metrics in the text exposition format, kept in process without a metrics
//! crate: counters keyed by a few bounded labels (route template, status, model, tenant
//! from config — never request text) and one latency histogram per route. Every part of
//! the gateway with metrics writes them through one [`Exposition`] (`GET /metrics` in
//! `router.rs` lists the parts in order).

mod exposition;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use std::time::Duration;

pub use exposition::{Exposition, Family, Histogram, Kind};

use crate::backend::engine_client::LoopGauges;

#[derive(Debug, Default)]
struct Inner {
    /// (route, status) -> requests
    requests: BTreeMap<(String, u16), u64>,
    /// route -> latency
    latency: BTreeMap<String, Histogram>,
    /// (model, tenant, outcome) -> completions
    completions: BTreeMap<(String, String, &'static str), u64>,
    /// (model, kind) -> upstream/backend errors
    backend_errors: BTreeMap<(String, &'static str), u64>,
    /// (tenant, rule id, action) -> firewall findings
    findings: BTreeMap<(String, String, &'static str), u64>,
    /// (tenant, event) -> pipeline failures and their outcome
    protection_events: BTreeMap<(String, &'static str), u64>,
    /// (who asked, loaded or rejected) -> rule reloads
    rule_reloads: BTreeMap<(&'static str, &'static str), u64>,
}

/// One firewall findings counter, as [`Metrics::finding_counts`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FindingCount {
    pub tenant: String,
    pub rule_id: String,
    pub action: &'static str,
    pub count: u64,
}

/// The gateway's metrics registry.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

impl Metrics {
    pub fn new() -> Self {
        Metrics::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        // A poisoned lock only means another thread panicked mid-update; counters stay usable.
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// One HTTP request finished (for streams: when its headers were sent).
    pub fn observe_request(&self, route: &str, status: u16, elapsed: Duration) {
        self.with(|m| {
            *m.requests.entry((route.to_owned(), status)).or_default() += 1;
            m.latency.entry(route.to_owned()).or_default().observe(elapsed.as_secs_f64());
        });
    }

    /// One completion was started for `tenant` on `model`; `outcome` is `ok` or an error kind.
    pub fn observe_completion(&self, model: &str, tenant: &str, outcome: &'static str) {
        self.with(|m| *m.completions.entry((model.to_owned(), tenant.to_owned(), outcome)).or_default() += 1);
    }

    /// A backend failed (`kind` from [`crate::error::ApiError::kind`]).
    pub fn observe_backend_error(&self, model: &str, kind: &'static str) {
        self.with(|m| *m.backend_errors.entry((model.to_owned(), kind)).or_default() += 1);
    }

    /// The firewall found `rule_id` `count` times in a response to `tenant` and took `action`.
    pub fn observe_findings(&self, tenant: &str, rule_id: &str, action: &'static str, count: u64) {
        self.with(|m| *m.findings.entry((tenant.to_owned(), rule_id.to_owned(), action)).or_default() += count);
    }

    /// Something went wrong on a response's protection path for `tenant`: `event` is
    /// `failed_closed`, `failed_open` or `audit_write_failed`.
    pub fn observe_protection_event(&self, tenant: &str, event: &'static str) {
        self.with(|m| *m.protection_events.entry((tenant.to_owned(), event)).or_default() += 1);
    }

    /// A rule reload asked for by `via` loaded or was rejected.
    pub fn observe_rule_reload(&self, via: &'static str, loaded: bool) {
        self.with(|m| *m.rule_reloads.entry((via, if loaded { "loaded" } else { "rejected" })).or_default() += 1);
    }

    /// Completions started per tenant since start-up, every model and outcome summed
    /// (the dashboard's request counts).
    pub fn completions_by_tenant(&self) -> BTreeMap<String, u64> {
        self.with(|m| {
            let mut out = BTreeMap::new();
            for ((_, tenant, _), n) in &m.completions {
                *out.entry(tenant.clone()).or_default() += n;
            }
            out
        })
    }

    /// Every (tenant, rule id, action) finding counter since start-up (the dashboard's
    /// rule hit counts).
    pub fn finding_counts(&self) -> Vec<FindingCount> {
        self.with(|m| {
            m.findings
                .iter()
                .map(|((tenant, rule_id, action), n)| FindingCount {
                    tenant: tenant.clone(),
                    rule_id: rule_id.clone(),
                    action,
                    count: *n,
                })
                .collect()
        })
    }

    /// The request, completion, finding and reload counters.
    pub fn write_metrics(&self, out: &mut Exposition) {
        self.with(|m| {
            let mut f =
                out.family("crossguard_http_requests_total", Kind::Counter, "HTTP requests by route and status.");
            for ((route, status), n) in &m.requests {
                f.sample(&[("route", route), ("status", &status.to_string())], n);
            }
            let mut f = out.family(
                "crossguard_http_request_duration_seconds",
                Kind::Histogram,
                "Time to response headers by route.",
            );
            for (route, h) in &m.latency {
                f.histogram(&[("route", route)], h);
            }
            let mut f = out.family(
                "crossguard_completions_total",
                Kind::Counter,
                "Chat completions by model, tenant and outcome.",
            );
            for ((model, tenant, outcome), n) in &m.completions {
                f.sample(&[("model", model), ("tenant", tenant), ("outcome", outcome)], n);
            }
            let mut f =
                out.family("crossguard_backend_errors_total", Kind::Counter, "Backend failures by model and kind.");
            for ((model, kind), n) in &m.backend_errors {
                f.sample(&[("model", model), ("kind", kind)], n);
            }
            let mut f = out.family(
                "crossguard_firewall_findings_total",
                Kind::Counter,
                "Firewall findings by tenant, rule and action.",
            );
            for ((tenant, rule, action), n) in &m.findings {
                f.sample(&[("tenant", tenant), ("rule", rule), ("action", action)], n);
            }
            let mut f = out.family(
                "crossguard_protection_events_total",
                Kind::Counter,
                "Firewall or store failures on the response path, by outcome.",
            );
            for ((tenant, event), n) in &m.protection_events {
                f.sample(&[("tenant", tenant), ("event", event)], n);
            }
            // A rejected reload leaves the old rules running and is easy to miss: alert on
            // this counter's `rejected` series.
            let mut f = out.family(
                "crossguard_rule_reloads_total",
                Kind::Counter,
                "Rule reloads by who asked (rule folder watch, admin API, dashboard) and result.",
            );
            for ((via, result), n) in &m.rule_reloads {
                f.sample(&[("via", via), ("result", result)], n);
            }
        });
    }
}

/// The running rules' generation (read from the rules themselves).
pub fn write_rules_generation(out: &mut Exposition, generation: u64) {
    out.family(
        "crossguard_rules_generation",
        Kind::Gauge,
        "The running rules' generation (one more per reload that loaded).",
    )
    .sample(&[], generation);
}

/// The engine KV pools, one label set per engine-served model.
pub fn write_kv_pools<'a>(out: &mut Exposition, pools: impl Iterator<Item = (&'a str, engine::KvStats)>) {
    let pools: Vec<(&str, engine::KvStats)> = pools.collect();
    if pools.is_empty() {
        return;
    }
    type KvSeries = (&'static str, Kind, &'static str, fn(&engine::KvStats) -> u64);
    let series: [KvSeries; 8] = [
        ("crossguard_engine_kv_blocks_total", Kind::Gauge, "KV blocks in the pool.", |k| k.blocks_total as u64),
        ("crossguard_engine_kv_blocks_used", Kind::Gauge, "KV blocks held by sequences or the prefix cache.", |k| {
            k.blocks_used as u64
        }),
        ("crossguard_engine_kv_blocks_free", Kind::Gauge, "KV blocks on the free list (zeroed).", |k| {
            k.blocks_free as u64
        }),
        ("crossguard_engine_kv_blocks_cached", Kind::Gauge, "Used KV blocks held by the prefix cache.", |k| {
            k.blocks_cached as u64
        }),
        ("crossguard_engine_kv_zero_fills_total", Kind::Counter, "KV blocks zero-filled on release.", |k| k.zero_fills),
        (
            "crossguard_engine_kv_isolation_violations_total",
            Kind::Counter,
            "KV reads refused by the owner or bounds check.",
            |k| k.isolation_violations,
        ),
        (
            "crossguard_engine_kv_prefix_hits_total",
            Kind::Counter,
            "Prompt blocks served from the tenant's prefix cache.",
            |k| k.prefix_hits,
        ),
        (
            "crossguard_engine_kv_stale_handouts_total",
            Kind::Counter,
            "Blocks handed out with another tenant's contents (fault injection only).",
            |k| k.stale_handouts,
        ),
    ];
    for (name, kind, help, get) in series {
        let mut f = out.family(name, kind, help);
        for (model, k) in &pools {
            f.sample(&[("model", model)], get(k));
        }
    }
}

/// The engines' serving loops (continuous batching), one label set per engine-served model.
pub fn write_engine_loops<'a>(out: &mut Exposition, loops: impl Iterator<Item = (&'a str, &'a LoopGauges)>) {
    let loops: Vec<_> = loops.collect();
    if loops.is_empty() {
        return;
    }
    type Get = fn(&LoopGauges) -> u64;
    let series: [(&str, Kind, &str, Get); 9] = [
        ("crossguard_engine_queue_depth", Kind::Gauge, "Requests waiting for the engine's batch.", |g| {
            g.serve.queued.load(Relaxed) as u64
        }),
        (
            "crossguard_engine_batch_size",
            Kind::Gauge,
            "Sequences in the engine's running batch (paused ones included).",
            |g| g.serve.running.load(Relaxed) as u64,
        ),
        (
            "crossguard_engine_preemptions_total",
            Kind::Counter,
            "Sequences preempted (freed, recomputed later) when KV blocks ran out.",
            |g| g.serve.preemptions.load(Relaxed),
        ),
        ("crossguard_engine_steps_total", Kind::Counter, "Batched forward steps run.", |g| g.serve.steps.load(Relaxed)),
        (
            "crossguard_engine_generated_tokens_total",
            Kind::Counter,
            "Tokens generated by finished requests (cancelled ones included).",
            |g| g.serve.tokens.load(Relaxed),
        ),
        (
            "crossguard_engine_paused_requests",
            Kind::Gauge,
            "Requests paused because their streaming client is not reading.",
            |g| g.serve.paused.load(Relaxed) as u64,
        ),
        (
            "crossguard_engine_stream_stalls_total",
            Kind::Counter,
            "Times a request was paused because its event buffer was full.",
            |g| g.serve.stalls.load(Relaxed),
        ),
        (
            "crossguard_engine_stream_stall_cancels_total",
            Kind::Counter,
            "Requests cancelled after staying paused longer than stream_stall_ms.",
            |g| g.serve.stall_cancels.load(Relaxed),
        ),
        (
            "crossguard_engine_disconnect_cancels_total",
            Kind::Counter,
            "Requests cancelled because their client went away before they finished.",
            |g| g.serve.disconnects.load(Relaxed),
        ),
    ];
    for (name, kind, help, get) in series {
        let mut f = out.family(name, kind, help);
        for (model, g) in &loops {
            f.sample(&[("model", model)], get(g));
        }
    }
    let mut f = out.family(
        "crossguard_engine_step_duration_seconds",
        Kind::Histogram,
        "Batched forward steps by kind: `decode` steps advanced streaming sequences (each is an inter-token gap), \
         `prefill` steps only ran prompts.",
    );
    for (model, g) in &loops {
        let steps = g.step_durations.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        f.histogram(&[("model", model), ("kind", "decode")], &steps.decode);
        f.histogram(&[("model", model), ("kind", "prefill")], &steps.prefill);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_histograms() {
        let m = Metrics::new();
        m.observe_request("/v1/chat/completions", 200, Duration::from_millis(3));
        m.observe_request("/v1/chat/completions", 200, Duration::from_millis(30));
        m.observe_completion("mock", "acme", "ok");
        m.observe_backend_error("mock", "upstream_error");
        let text = Exposition::text_of(|out| m.write_metrics(out));
        assert!(text.contains("crossguard_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2"));
        assert!(text.contains("le=\"0.005\"} 1"));
        assert!(text.contains("le=\"+Inf\"} 2"));
        assert!(text.contains("crossguard_completions_total{model=\"mock\",tenant=\"acme\",outcome=\"ok\"} 1"));
        assert!(text.contains("crossguard_backend_errors_total{model=\"mock\",kind=\"upstream_error\"} 1"));
    }

    #[test]
    fn rule_reloads_count_by_who_asked_and_result() {
        let m = Metrics::new();
        let mut generation = Exposition::new();
        write_rules_generation(&mut generation, 1);
        assert!(generation.into_text().contains("crossguard_rules_generation 1\n"));
        m.observe_rule_reload("rule folder watch", true);
        m.observe_rule_reload("rule folder watch", false);
        m.observe_rule_reload("rule folder watch", false);
        m.observe_rule_reload("admin API", true);
        let mut out = Exposition::new();
        m.write_metrics(&mut out);
        write_rules_generation(&mut out, 3);
        let text = out.into_text();
        assert!(
            text.contains("crossguard_rule_reloads_total{via=\"rule folder watch\",result=\"rejected\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("crossguard_rule_reloads_total{via=\"rule folder watch\",result=\"loaded\"} 1"),
            "{text}"
        );
        assert!(text.contains("crossguard_rule_reloads_total{via=\"admin API\",result=\"loaded\"} 1"), "{text}");
        assert!(text.contains("crossguard_rules_generation 3\n"), "{text}");
    }

    #[test]
    fn accessors_sum_what_render_shows() {
        let m = Metrics::new();
        m.observe_completion("a", "acme", "ok");
        m.observe_completion("b", "acme", "upstream_error");
        m.observe_completion("a", "globex", "ok");
        m.observe_findings("acme", "aws-access-key", "block", 1);
        m.observe_findings("acme", "aws-access-key", "block", 1);
        assert_eq!(
            m.completions_by_tenant().into_iter().collect::<Vec<_>>(),
            [("acme".to_owned(), 2), ("globex".to_owned(), 1)]
        );
        let hits = m.finding_counts();
        assert_eq!(
            hits,
            [FindingCount { tenant: "acme".into(), rule_id: "aws-access-key".into(), action: "block", count: 2 }]
        );
    }
}
