//! Prometheus metrics in the text exposition format, kept in process without a metrics
//! crate: counters keyed by a few bounded labels (route template, status, model, tenant
//! from config — never request text) and one latency histogram per route.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the latency histogram buckets, in seconds.
const BUCKETS_S: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// A latency histogram over fixed buckets from 0.5 ms to 60 s.
#[derive(Debug, Default)]
pub struct Histogram {
    counts: Vec<u64>,
    sum_s: f64,
    count: u64,
}

impl Histogram {
    /// Writes the `_bucket`, `_sum` and `_count` lines of series `name` with `labels`
    /// (already escaped, `key="value"` pairs joined by commas).
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        for (bound, c) in BUCKETS_S.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum_s);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }

    pub fn observe(&mut self, seconds: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS_S.len()];
        }
        for (bound, c) in BUCKETS_S.iter().zip(self.counts.iter_mut()) {
            if seconds <= *bound {
                *c += 1;
            }
        }
        self.sum_s += seconds;
        self.count += 1;
    }
}

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

    /// The firewall found `rule_id` in a response to `tenant` and took `action`.
    pub fn observe_finding(&self, tenant: &str, rule_id: &str, action: &'static str) {
        self.with(|m| *m.findings.entry((tenant.to_owned(), rule_id.to_owned(), action)).or_default() += 1);
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

    /// The text exposition of every metric, with `extra` appended (other subsystems').
    pub fn render(&self, extra: &str) -> String {
        let mut out = String::with_capacity(4096);
        self.with(|m| {
            describe(&mut out, "crossguard_http_requests_total", "counter", "HTTP requests by route and status.");
            for ((route, status), n) in &m.requests {
                let _ = writeln!(
                    out,
                    "crossguard_http_requests_total{{route=\"{}\",status=\"{status}\"}} {n}",
                    escape(route)
                );
            }
            describe(
                &mut out,
                "crossguard_http_request_duration_seconds",
                "histogram",
                "Time to response headers by route.",
            );
            for (route, h) in &m.latency {
                h.render(&mut out, "crossguard_http_request_duration_seconds", &format!("route=\"{}\"", escape(route)));
            }
            describe(
                &mut out,
                "crossguard_completions_total",
                "counter",
                "Chat completions by model, tenant and outcome.",
            );
            for ((model, tenant, outcome), n) in &m.completions {
                let _ = writeln!(
                    out,
                    "crossguard_completions_total{{model=\"{}\",tenant=\"{}\",outcome=\"{outcome}\"}} {n}",
                    escape(model),
                    escape(tenant)
                );
            }
            describe(&mut out, "crossguard_backend_errors_total", "counter", "Backend failures by model and kind.");
            for ((model, kind), n) in &m.backend_errors {
                let _ =
                    writeln!(out, "crossguard_backend_errors_total{{model=\"{}\",kind=\"{kind}\"}} {n}", escape(model));
            }
            describe(
                &mut out,
                "crossguard_firewall_findings_total",
                "counter",
                "Firewall findings by tenant, rule and action.",
            );
            for ((tenant, rule, action), n) in &m.findings {
                let _ = writeln!(
                    out,
                    "crossguard_firewall_findings_total{{tenant=\"{}\",rule=\"{}\",action=\"{action}\"}} {n}",
                    escape(tenant),
                    escape(rule)
                );
            }
            describe(
                &mut out,
                "crossguard_protection_events_total",
                "counter",
                "Firewall or store failures on the response path, by outcome.",
            );
            for ((tenant, event), n) in &m.protection_events {
                let _ = writeln!(
                    out,
                    "crossguard_protection_events_total{{tenant=\"{}\",event=\"{event}\"}} {n}",
                    escape(tenant)
                );
            }
            // A rejected reload leaves the old rules running and is easy to miss: alert on
            // this counter's `rejected` series.
            describe(
                &mut out,
                "crossguard_rule_reloads_total",
                "counter",
                "Rule reloads by who asked (rule folder watch, admin API, dashboard) and result.",
            );
            for ((via, result), n) in &m.rule_reloads {
                let _ =
                    writeln!(out, "crossguard_rule_reloads_total{{via=\"{}\",result=\"{result}\"}} {n}", escape(via));
            }
        });
        out.push_str(extra);
        out
    }
}

/// `/metrics` lines for the running rules' generation (read from the rules themselves).
pub fn render_rules_generation(generation: u64) -> String {
    let mut out = String::new();
    describe(
        &mut out,
        "crossguard_rules_generation",
        "gauge",
        "The running rules' generation (one more per reload that loaded).",
    );
    let _ = writeln!(out, "crossguard_rules_generation {generation}");
    out
}

/// The `# HELP` and `# TYPE` lines that open a metric.
fn describe(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// `/metrics` lines for the engine KV pools, one label set per engine-served model.
pub fn render_kv_pools<'a>(pools: impl Iterator<Item = (&'a str, engine::KvStats)>) -> String {
    let pools: Vec<(&str, engine::KvStats)> = pools.collect();
    if pools.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    // (series, kind, help, value)
    type KvSeries = (&'static str, &'static str, &'static str, fn(&engine::KvStats) -> u64);
    let gauges: [KvSeries; 8] = [
        ("crossguard_engine_kv_blocks_total", "gauge", "KV blocks in the pool.", |k| k.blocks_total as u64),
        ("crossguard_engine_kv_blocks_used", "gauge", "KV blocks held by sequences or the prefix cache.", |k| {
            k.blocks_used as u64
        }),
        ("crossguard_engine_kv_blocks_free", "gauge", "KV blocks on the free list (zeroed).", |k| k.blocks_free as u64),
        ("crossguard_engine_kv_blocks_cached", "gauge", "Used KV blocks held by the prefix cache.", |k| {
            k.blocks_cached as u64
        }),
        ("crossguard_engine_kv_zero_fills_total", "counter", "KV blocks zero-filled on release.", |k| k.zero_fills),
        (
            "crossguard_engine_kv_isolation_violations_total",
            "counter",
            "KV reads refused by the owner or bounds check.",
            |k| k.isolation_violations,
        ),
        (
            "crossguard_engine_kv_prefix_hits_total",
            "counter",
            "Prompt blocks served from the tenant's prefix cache.",
            |k| k.prefix_hits,
        ),
        (
            "crossguard_engine_kv_stale_handouts_total",
            "counter",
            "Blocks handed out with another tenant's contents (fault injection only).",
            |k| k.stale_handouts,
        ),
    ];
    for (name, kind, help, get) in gauges {
        describe(&mut out, name, kind, help);
        for (model, k) in &pools {
            let _ = writeln!(out, "{name}{{model=\"{}\"}} {}", escape(model), get(k));
        }
    }
    out
}

/// `/metrics` lines for the engines' serving loops (continuous batching).
pub fn render_engine_loops<'a>(
    loops: impl Iterator<Item = (&'a str, &'a crate::backend::engine_loop::LoopGauges)>,
) -> String {
    use std::sync::atomic::Ordering::Relaxed;
    let loops: Vec<_> = loops.collect();
    if loops.is_empty() {
        return String::new();
    }
    type Get = fn(&crate::backend::engine_loop::LoopGauges) -> u64;
    let series: [(&str, &str, &str, Get); 9] = [
        ("crossguard_engine_queue_depth", "gauge", "Requests waiting for the engine's batch.", |g| {
            g.queued.load(Relaxed) as u64
        }),
        (
            "crossguard_engine_batch_size",
            "gauge",
            "Sequences in the engine's running batch (paused ones included).",
            |g| g.running.load(Relaxed) as u64,
        ),
        (
            "crossguard_engine_preemptions_total",
            "counter",
            "Sequences preempted (freed, recomputed later) when KV blocks ran out.",
            |g| g.preemptions.load(Relaxed),
        ),
        ("crossguard_engine_steps_total", "counter", "Batched forward steps run.", |g| g.steps.load(Relaxed)),
        (
            "crossguard_engine_generated_tokens_total",
            "counter",
            "Tokens generated by finished requests (cancelled ones included).",
            |g| g.tokens.load(Relaxed),
        ),
        (
            "crossguard_engine_paused_requests",
            "gauge",
            "Requests paused because their streaming client is not reading.",
            |g| g.paused.load(Relaxed) as u64,
        ),
        (
            "crossguard_engine_stream_stalls_total",
            "counter",
            "Times a request was paused because its event buffer was full.",
            |g| g.stalls.load(Relaxed),
        ),
        (
            "crossguard_engine_stream_stall_cancels_total",
            "counter",
            "Requests cancelled after staying paused longer than stream_stall_ms.",
            |g| g.stall_cancels.load(Relaxed),
        ),
        (
            "crossguard_engine_disconnect_cancels_total",
            "counter",
            "Requests cancelled because their client went away before they finished.",
            |g| g.disconnects.load(Relaxed),
        ),
    ];
    let mut out = String::new();
    for (name, kind, help, get) in series {
        describe(&mut out, name, kind, help);
        for (model, g) in &loops {
            let _ = writeln!(out, "{name}{{model=\"{}\"}} {}", escape(model), get(g));
        }
    }
    let name = "crossguard_engine_step_duration_seconds";
    let _ = writeln!(out, "# HELP {name} Batched forward steps by kind: `decode` steps advanced streaming sequences (each is an inter-token gap), `prefill` steps only ran prompts.\n# TYPE {name} histogram");
    for (model, g) in &loops {
        let model = escape(model);
        let steps = g.step_durations.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        steps.decode.render(&mut out, name, &format!("model=\"{model}\",kind=\"decode\""));
        steps.prefill.render(&mut out, name, &format!("model=\"{model}\",kind=\"prefill\""));
    }
    out
}

/// Label values escaped per the exposition format.
pub(crate) fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
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
        let text = m.render("");
        assert!(text.contains("crossguard_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2"));
        assert!(text.contains("le=\"0.005\"} 1"));
        assert!(text.contains("le=\"+Inf\"} 2"));
        assert!(text.contains("crossguard_completions_total{model=\"mock\",tenant=\"acme\",outcome=\"ok\"} 1"));
        assert!(text.contains("crossguard_backend_errors_total{model=\"mock\",kind=\"upstream_error\"} 1"));
    }

    #[test]
    fn rule_reloads_count_by_who_asked_and_result() {
        let m = Metrics::new();
        assert!(render_rules_generation(1).contains("crossguard_rules_generation 1\n"));
        m.observe_rule_reload("rule folder watch", true);
        m.observe_rule_reload("rule folder watch", false);
        m.observe_rule_reload("rule folder watch", false);
        m.observe_rule_reload("admin API", true);
        let text = m.render(&render_rules_generation(3));
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
        m.observe_finding("acme", "aws-access-key", "block");
        m.observe_finding("acme", "aws-access-key", "block");
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

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\n"), "a\\\"b\\\\c\\n");
    }
}
