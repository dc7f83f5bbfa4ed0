//! The firewall on the response path: sits between a backend's event stream and the relay,
//! and lets through only text the firewall released.
//!
//! One [`StreamScanner`] per channel of each choice (content, refusal, each tool call's
//! arguments). Invariants:
//! - a delta carries only released text; held text waits for a later event or the end;
//! - a `logprobs` entry leaves only once the text of its token has been released, and an
//!   entry whose token was redacted is stripped of its token text, so the token-level
//!   channel cannot leak what the text channel held back;
//! - a block ends its choice with `finish_reason: "content_filter"`; nothing of that
//!   choice follows, and once every choice is done the backend is dropped (stopped);
//! - a scanner that fails (panics) fails closed — its choice is blocked — unless the
//!   tenant's `fail_mode` is `open`, in which case the channel passes unscanned from then
//!   on, text held at the failure included (recorded in [`Guard::failure`] either way).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use firewall::detect::Observations;
use firewall::{Action, Detectors, Finding, Ruleset, ScanContext, Step, StreamScanner, TokenSignals};
use serde_json::Value;

use crate::api::response::{FunctionChunk, ToolCallChunk};
use crate::backend::{BackendEvent, ChoiceDelta};
use crate::config::FailMode;

/// The `finish_reason` of a blocked choice.
pub const CONTENT_FILTER: &str = "content_filter";

/// Most released text kept for fingerprinting the response (the rest is not recorded).
const MAX_RECORDED_BYTES: usize = 1 << 20;

/// Which text of a choice a scanner watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Channel {
    Content,
    Refusal,
    ToolArguments(u32),
}

/// One scanned channel and the logprob entries waiting for its text to be released.
struct Scanned {
    scanner: StreamScanner,
    /// Raw bytes pushed so far.
    pushed: usize,
    /// (raw end offset of the token, entry) in order; content channel only.
    pending_logprobs: VecDeque<(usize, Value)>,
    /// Raw spans redacted so far.
    redacted: Vec<(usize, usize)>,
    /// Raw text pushed but not yet released (what a fail-open channel still owes).
    held: String,
    /// The scanner failed and the tenant fails open: text passes unscanned.
    bypass: bool,
    /// What was released, for the provenance index (capped).
    released: String,
}

/// A finding with the choice it was made in.
#[derive(Debug, Clone)]
pub struct ChoiceFinding {
    pub choice: u32,
    pub finding: Finding,
}

/// The firewall state of one response.
pub struct Guard {
    rules: Arc<Ruleset>,
    ctx: ScanContext,
    detectors: Arc<Detectors>,
    channels: BTreeMap<(u32, Channel), Scanned>,
    /// Choices the firewall stopped.
    blocked: BTreeSet<u32>,
    /// Choices that ended (by the backend or by a block).
    finished: BTreeSet<u32>,
    /// Number of choices the request asked for.
    choices: u32,
    findings: Vec<ChoiceFinding>,
    released_bytes: usize,
    fail_mode: FailMode,
    /// Why a scanner failed, if one did.
    failure: Option<String>,
}

impl Guard {
    pub fn new(rules: Arc<Ruleset>, ctx: ScanContext, detectors: Arc<Detectors>, choices: u32) -> Guard {
        Guard::with_fail_mode(rules, ctx, detectors, choices, FailMode::Closed)
    }

    pub fn with_fail_mode(rules: Arc<Ruleset>, ctx: ScanContext, detectors: Arc<Detectors>, choices: u32, fail_mode: FailMode) -> Guard {
        Guard {
            rules,
            ctx,
            detectors,
            channels: BTreeMap::new(),
            blocked: BTreeSet::new(),
            finished: BTreeSet::new(),
            choices: choices.max(1),
            findings: Vec::new(),
            released_bytes: 0,
            fail_mode,
            failure: None,
        }
    }

    /// The rules this response is scanned with.
    pub fn rules(&self) -> &Ruleset {
        &self.rules
    }

    /// Why a scanner failed on this response, if one did.
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// The text released to the client, one string per choice and channel (each capped),
    /// for the provenance index.
    pub fn released_texts(&self) -> impl Iterator<Item = &str> + '_ {
        self.channels.values().map(|s| s.released.as_str())
    }

    /// What each content channel's scanner observed (character entropy, surprisal,
    /// predictive entropy), for the tenant's statistics.
    pub fn observations(&self) -> impl Iterator<Item = Observations> + '_ {
        self.channels.iter().filter(|((_, ch), _)| *ch == Channel::Content).map(|(_, s)| s.scanner.observations())
    }

    /// Every finding so far (log, redact and block).
    pub fn findings(&self) -> &[ChoiceFinding] {
        &self.findings
    }

    /// Whether any choice was blocked.
    pub fn blocked(&self) -> bool {
        !self.blocked.is_empty()
    }

    /// Bytes of text released to the client so far.
    pub fn released_bytes(&self) -> usize {
        self.released_bytes
    }

    /// True once every requested choice has ended: the backend can be stopped.
    pub fn all_finished(&self) -> bool {
        self.finished.len() >= self.choices as usize
    }

    /// The events to relay for one backend event.
    pub fn apply(&mut self, event: BackendEvent) -> Vec<BackendEvent> {
        match event {
            BackendEvent::Usage(u) => vec![BackendEvent::Usage(u)],
            BackendEvent::Delta(d) if self.finished.contains(&d.index) => Vec::new(),
            BackendEvent::Delta(d) => self.delta(d),
            BackendEvent::Finish { index, .. } if self.finished.contains(&index) => Vec::new(),
            BackendEvent::Finish { index, reason } => {
                let mut out = self.flush_choice(index);
                if !self.finished.contains(&index) {
                    self.finished.insert(index);
                    out.push(BackendEvent::Finish { index, reason });
                }
                out
            }
        }
    }

    /// Flushes every choice the backend left open (its stream ended without a finish).
    pub fn finish_all(&mut self) -> Vec<BackendEvent> {
        let open: BTreeSet<u32> = self.channels.keys().map(|(c, _)| *c).filter(|c| !self.finished.contains(c)).collect();
        open.into_iter().flat_map(|c| self.flush_choice(c)).collect()
    }

    fn delta(&mut self, d: ChoiceDelta) -> Vec<BackendEvent> {
        let index = d.index;
        let mut out = ChoiceDelta { index, role: d.role, ..ChoiceDelta::default() };
        let mut logprobs = d.logprobs.into_iter();
        if let Some(text) = d.content {
            // Each delta from the engine is one token with its one entry; from an upstream,
            // a delta's entries cover its text, so the last one ends where the text ends.
            let entries: Vec<Value> = logprobs.by_ref().collect();
            let step = self.push(index, Channel::Content, &text, entries, d.signals.as_ref());
            if self.absorb_step(index, Channel::Content, step, &mut out) {
                return self.blocked_events(index, out);
            }
        }
        if let Some(text) = d.refusal {
            let step = self.push(index, Channel::Refusal, &text, Vec::new(), None);
            if self.absorb_step(index, Channel::Refusal, step, &mut out) {
                return self.blocked_events(index, out);
            }
        }
        for call in d.tool_calls {
            let mut fragment = ToolCallChunk { function: FunctionChunk { name: call.function.name, arguments: None }, ..call };
            if let Some(args) = call.function.arguments {
                let channel = Channel::ToolArguments(call.index);
                let step = self.push(index, channel, &args, Vec::new(), None);
                let released = step.release.clone();
                let stop = self.absorb_step(index, channel, step, &mut out);
                fragment.function.arguments = Some(released);
                out.tool_calls.push(fragment);
                if stop {
                    return self.blocked_events(index, out);
                }
            } else {
                out.tool_calls.push(fragment);
            }
        }
        if is_empty_delta(&out) {
            Vec::new()
        } else {
            vec![BackendEvent::Delta(out)]
        }
    }

    fn scanned(&mut self, index: u32, channel: Channel) -> &mut Scanned {
        let (rules, ctx, detectors) = (&self.rules, &self.ctx, &self.detectors);
        self.channels.entry((index, channel)).or_insert_with(|| Scanned {
            scanner: StreamScanner::new(rules.clone(), ctx.clone(), detectors.clone()),
            pushed: 0,
            pending_logprobs: VecDeque::new(),
            redacted: Vec::new(),
            held: String::new(),
            bypass: false,
            released: String::new(),
        })
    }

    fn push(&mut self, index: u32, channel: Channel, text: &str, entries: Vec<Value>, signals: Option<&TokenSignals>) -> Step {
        // An upstream's logprobs give per-token signals too, when its entries spell the text.
        let tokens = match signals {
            None => upstream_tokens(text, &entries),
            Some(_) => Vec::new(),
        };
        let s = self.scanned(index, channel);
        let start = s.pushed;
        s.pushed += text.len();
        let count = entries.len();
        let mut offset = start;
        for (i, entry) in entries.into_iter().enumerate() {
            let token_len = entry.get("token").and_then(Value::as_str).map_or(0, str::len);
            offset = if i + 1 == count { s.pushed } else { (offset + token_len).min(s.pushed) };
            s.pending_logprobs.push_back((offset, entry));
        }
        if !tokens.is_empty() {
            let mut step = Step { release: String::new(), findings: Vec::new(), action: Action::Allow };
            for (piece, signals) in &tokens {
                let next = self.scan(index, channel, piece, |scanner| scanner.push_token(piece, signals));
                step.release.push_str(&next.release);
                step.findings.extend(next.findings);
                step.action = step.action.max(next.action);
            }
            return step;
        }
        self.scan(index, channel, text, |scanner| match signals {
            Some(signals) => scanner.push_token(text, signals),
            None => scanner.push(text),
        })
    }

    /// Runs one scanner call, keeping `held` in step with it and containing a failure.
    fn scan(&mut self, index: u32, channel: Channel, text: &str, call: impl FnOnce(&mut StreamScanner) -> Step) -> Step {
        let fail_mode = self.fail_mode;
        let s = self.scanned(index, channel);
        if s.bypass {
            return Step { release: text.to_owned(), findings: Vec::new(), action: Action::Log };
        }
        s.held.push_str(text);
        match catch_unwind(AssertUnwindSafe(|| call(&mut s.scanner))) {
            Ok(step) => {
                let held = s.scanner.held_bytes().min(s.held.len());
                let cut = s.held.len() - held;
                // `held_bytes` counts raw bytes at the end: always a char boundary of the
                // pushed text; if it is not, keep everything (never a broken string).
                if s.held.is_char_boundary(cut) {
                    s.held.drain(..cut);
                }
                step
            }
            Err(panic) => {
                let reason = panic
                    .downcast_ref::<&str>()
                    .map(|m| (*m).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_owned());
                let owed = std::mem::take(&mut s.held);
                let step = match fail_mode {
                    FailMode::Closed => Step { release: String::new(), findings: Vec::new(), action: Action::Block },
                    FailMode::Open => {
                        s.bypass = true;
                        Step { release: owed, findings: Vec::new(), action: Action::Log }
                    }
                };
                tracing::error!(choice = index, fail_mode = ?fail_mode, %reason, "the firewall failed on a response");
                self.failure.get_or_insert_with(|| format!("firewall failed: {reason}"));
                step
            }
        }
    }

    /// Folds a step's release and findings into `out`; true when the step blocked.
    fn absorb_step(&mut self, index: u32, channel: Channel, step: Step, out: &mut ChoiceDelta) -> bool {
        self.released_bytes += step.release.len();
        let recorded = &mut self.scanned(index, channel).released;
        if recorded.len() + step.release.len() <= MAX_RECORDED_BYTES {
            recorded.push_str(&step.release);
        }
        for f in &step.findings {
            if f.action == Action::Redact {
                self.scanned(index, channel).redacted.push((f.start, f.end));
            }
        }
        self.findings.extend(step.findings.into_iter().map(|finding| ChoiceFinding { choice: index, finding }));
        let blocked = step.action == Action::Block;
        match channel {
            Channel::Content => {
                if !step.release.is_empty() {
                    out.content.get_or_insert_with(String::new).push_str(&step.release);
                }
                out.logprobs.extend(self.releasable_logprobs(index, blocked));
            }
            Channel::Refusal => {
                if !step.release.is_empty() {
                    out.refusal.get_or_insert_with(String::new).push_str(&step.release);
                }
            }
            Channel::ToolArguments(_) => {}
        }
        if blocked {
            self.blocked.insert(index);
        }
        blocked
    }

    /// Logprob entries whose token text is now fully released (none after a block).
    fn releasable_logprobs(&mut self, index: u32, blocked: bool) -> Vec<Value> {
        let s = self.scanned(index, Channel::Content);
        if blocked {
            s.pending_logprobs.clear();
            return Vec::new();
        }
        let released_to = s.pushed - s.scanner.held_bytes();
        let mut out = Vec::new();
        let mut token_start = 0;
        while let Some((end, _)) = s.pending_logprobs.front() {
            if *end > released_to {
                break;
            }
            let end = *end;
            let Some((_, mut entry)) = s.pending_logprobs.pop_front() else { break };
            let start = end.saturating_sub(entry.get("token").and_then(Value::as_str).map_or(0, str::len)).max(token_start);
            if s.redacted.iter().any(|(a, b)| start < *b && *a < end) {
                entry = redacted_entry(&entry);
            }
            token_start = end;
            out.push(entry);
        }
        out
    }

    /// Ends every channel of a choice; the released remainder (or a block) follows.
    fn flush_choice(&mut self, index: u32) -> Vec<BackendEvent> {
        let channels: Vec<Channel> = self.channels.keys().filter(|(c, _)| *c == index).map(|(_, ch)| *ch).collect();
        let mut out = ChoiceDelta { index, ..ChoiceDelta::default() };
        for channel in channels {
            let step = self.scan(index, channel, "", StreamScanner::finish);
            let released = step.release.clone();
            let stop = self.absorb_step(index, channel, step, &mut out);
            if let Channel::ToolArguments(call) = channel {
                if !released.is_empty() {
                    out.tool_calls.push(ToolCallChunk {
                        index: call,
                        id: None,
                        kind: None,
                        function: FunctionChunk { name: None, arguments: Some(released) },
                    });
                }
            }
            if stop {
                return self.blocked_events(index, out);
            }
        }
        if is_empty_delta(&out) {
            Vec::new()
        } else {
            vec![BackendEvent::Delta(out)]
        }
    }

    /// What precedes the match, then the choice's end.
    fn blocked_events(&mut self, index: u32, released: ChoiceDelta) -> Vec<BackendEvent> {
        self.finished.insert(index);
        let mut out = Vec::new();
        if !is_empty_delta(&released) {
            out.push(BackendEvent::Delta(released));
        }
        out.push(BackendEvent::Finish { index, reason: CONTENT_FILTER.to_owned() });
        out
    }
}

/// The (token text, signals) of an upstream delta whose logprob entries spell its text
/// exactly; empty otherwise (the text is then scanned as plain text). The predictive
/// entropy comes from `top_logprobs` (the probability left outside them counted as one
/// more outcome, so it is a lower bound).
fn upstream_tokens(text: &str, entries: &[Value]) -> Vec<(String, TokenSignals)> {
    let tokens: Vec<(&str, f64)> = entries
        .iter()
        .filter_map(|e| Some((e.get("token")?.as_str()?, e.get("logprob")?.as_f64()?)))
        .collect();
    if tokens.is_empty() || tokens.len() != entries.len() || tokens.iter().map(|(t, _)| t.len()).sum::<usize>() != text.len() {
        return Vec::new();
    }
    if tokens.iter().map(|(t, _)| *t).collect::<String>() != text {
        return Vec::new();
    }
    tokens
        .into_iter()
        .zip(entries)
        .map(|((token, logprob), entry)| {
            let top: Vec<f64> = entry
                .get("top_logprobs")
                .and_then(Value::as_array)
                .map(|t| t.iter().filter_map(|x| x.get("logprob").and_then(Value::as_f64)).map(f64::exp).collect())
                .unwrap_or_default();
            let entropy = (!top.is_empty()).then(|| {
                let rest = (1.0 - top.iter().sum::<f64>()).max(0.0);
                top.iter().chain(std::iter::once(&rest)).filter(|p| **p > 0.0).map(|p| -p * p.ln()).sum::<f64>()
            });
            (token.to_owned(), TokenSignals { logprob: Some(logprob), entropy, owners: Vec::new() })
        })
        .collect()
}

fn is_empty_delta(d: &ChoiceDelta) -> bool {
    d.role.is_none() && d.content.is_none() && d.refusal.is_none() && d.tool_calls.is_empty() && d.logprobs.is_empty()
}

/// A logprob entry with its token text removed (the token was redacted).
fn redacted_entry(entry: &Value) -> Value {
    let logprob = entry.get("logprob").cloned().unwrap_or(Value::Null);
    serde_json::json!({"token": "", "logprob": logprob, "bytes": [], "top_logprobs": []})
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = r#"
[[rule]]
id = "test-token"
description = "a test token"
severity = "critical"
action = "block"
regex = '''\b(tok_[a-z0-9]{16})\b'''
secret_group = 1
keywords = ["tok_"]
tags = ["test"]
must_match = ["x tok_a1b2c3d4e5f6g7h8 y"]
must_not_match = ["tok_short"]

[[rule]]
id = "test-redact"
description = "a redacted id"
severity = "low"
action = "redact"
regex = '''\b(rid_[0-9]{8})\b'''
secret_group = 1
keywords = ["rid_"]
tags = ["test"]
must_match = ["rid_12345678"]
must_not_match = ["rid_1"]
"#;

    fn guard(choices: u32) -> Guard {
        let rules = Ruleset::load_sources(&[("test.toml".into(), RULES.into())], Default::default()).expect("test rules load");
        Guard::new(Arc::new(rules), ScanContext::new("acme"), Arc::new(Detectors::default()), choices)
    }

    fn text(index: u32, s: &str) -> BackendEvent {
        BackendEvent::Delta(ChoiceDelta { index, content: Some(s.into()), ..Default::default() })
    }

    fn released(events: &[BackendEvent]) -> String {
        events
            .iter()
            .filter_map(|e| match e {
                BackendEvent::Delta(d) => d.content.clone(),
                _ => None,
            })
            .collect()
    }

    fn run(g: &mut Guard, chunks: &[&str]) -> Vec<BackendEvent> {
        let mut out = Vec::new();
        for c in chunks {
            out.extend(g.apply(text(0, c)));
        }
        out.extend(g.apply(BackendEvent::Finish { index: 0, reason: "stop".into() }));
        out
    }

    #[test]
    fn a_secret_split_across_40_chunks_never_reaches_the_client() {
        let secret = "tok_q8w7e6r5t4y3u2i1";
        let answer = format!("Sure! The deploy token is {secret} and it expires soon.");
        let step = answer.len().div_ceil(40);
        let chunks: Vec<&str> = answer.as_bytes().chunks(step).map(|c| std::str::from_utf8(c).unwrap()).collect();
        assert!(chunks.len() >= 30);
        let mut g = guard(1);
        let out = run(&mut g, &chunks);
        let sent = released(&out);
        assert!(!sent.contains("tok_q8w7"), "{sent}");
        assert!(sent.starts_with("Sure! The deploy token is"));
        assert!(matches!(out.last(), Some(BackendEvent::Finish { reason, .. }) if reason == CONTENT_FILTER));
        assert!(g.blocked() && g.all_finished());
        assert_eq!(g.findings()[0].finding.rule_id, "test-token");
        assert!(g.apply(text(0, "more")).is_empty(), "nothing after a block");
    }

    #[test]
    fn clean_text_flows_and_redactions_rewrite() {
        let mut g = guard(1);
        let out = run(&mut g, &["Your id is rid_", "12345678", ", thanks."]);
        assert_eq!(released(&out), "Your id is [REDACTED:test-redact], thanks.");
        assert!(matches!(out.last(), Some(BackendEvent::Finish { reason, .. }) if reason == "stop"));
    }

    #[test]
    fn logprobs_wait_for_their_text_and_redacted_tokens_lose_it() {
        let mut g = guard(1);
        let entry = |t: &str| serde_json::json!({"token": t, "logprob": -0.1, "bytes": t.as_bytes(), "top_logprobs": []});
        let mut out = Vec::new();
        for t in ["id ", "rid_", "12345678", " ok"] {
            out.extend(g.apply(BackendEvent::Delta(ChoiceDelta { index: 0, content: Some(t.into()), logprobs: vec![entry(t)], ..Default::default() })));
        }
        out.extend(g.apply(BackendEvent::Finish { index: 0, reason: "stop".into() }));
        let entries: Vec<Value> = out
            .iter()
            .flat_map(|e| match e {
                BackendEvent::Delta(d) => d.logprobs.clone(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(entries.len(), 4);
        let tokens: Vec<&str> = entries.iter().map(|e| e["token"].as_str().unwrap()).collect();
        assert_eq!(tokens, ["id ", "", "", " ok"]);
    }

    #[test]
    fn upstream_logprobs_feed_the_statistics() {
        struct NoBaseline;
        impl firewall::Baselines for NoBaseline {
            fn baseline(&self, _: &str, _: firewall::Metric) -> Option<firewall::Baseline> {
                None
            }
        }
        let detectors = Detectors { entropy: Some(firewall::EntropyConfig::new(Arc::new(NoBaseline))), ..Detectors::default() };
        let mut g = Guard::new(Arc::new(Ruleset::empty()), ScanContext::new("acme"), Arc::new(detectors), 1);
        let entry = |t: &str, lp: f64| serde_json::json!({"token": t, "logprob": lp, "top_logprobs": [{"token": t, "logprob": lp}]});
        let delta = ChoiceDelta { index: 0, content: Some("Hello world".into()), logprobs: vec![entry("Hello", -0.5), entry(" world", -1.5)], ..Default::default() };
        let mut out = g.apply(BackendEvent::Delta(delta));
        out.extend(g.apply(BackendEvent::Finish { index: 0, reason: "stop".into() }));
        assert_eq!(released(&out), "Hello world");
        let obs: Vec<_> = g.observations().collect();
        assert_eq!(obs[0].surprisal.count, 2);
        assert!((obs[0].surprisal.mean - 1.0).abs() < 1e-9);
        assert_eq!(obs[0].predictive_entropy.count, 2);
        // Entries that do not spell the text leave it plain text.
        assert!(upstream_tokens("Hello", &[entry("Help", -0.1)]).is_empty());
    }

    #[test]
    fn tool_call_arguments_are_scanned() {
        let mut g = guard(1);
        let call = |args: &str| {
            BackendEvent::Delta(ChoiceDelta {
                index: 0,
                tool_calls: vec![ToolCallChunk { index: 0, id: None, kind: None, function: FunctionChunk { name: None, arguments: Some(args.into()) } }],
                ..Default::default()
            })
        };
        let mut out = Vec::new();
        for a in ["{\"key\": \"tok_a1b2", "c3d4e5f6g7h8\"}"] {
            out.extend(g.apply(call(a)));
        }
        let args: String = out
            .iter()
            .flat_map(|e| match e {
                BackendEvent::Delta(d) => d.tool_calls.iter().filter_map(|c| c.function.arguments.clone()).collect(),
                _ => Vec::new(),
            })
            .collect();
        assert!(!args.contains("tok_a1b2c3"), "{args}");
        assert!(g.blocked());
    }

    /// An owner index that fails: stands for any bug on the firewall's path.
    struct Broken;

    impl firewall::NgramOwners for Broken {
        fn owners(&self, _: u64) -> firewall::OwnerSet {
            panic!("index corrupted")
        }
    }

    fn broken_guard(mode: FailMode) -> Guard {
        let detectors = Detectors { ngram: Some(firewall::NgramConfig::new(firewall::NgramKey([0; 16]), Arc::new(Broken))), ..Detectors::default() };
        Guard::with_fail_mode(Arc::new(Ruleset::empty()), ScanContext::new("acme"), Arc::new(detectors), 1, mode)
    }

    #[test]
    fn a_failing_firewall_fails_closed() {
        let mut g = broken_guard(FailMode::Closed);
        let out = run(&mut g, &["one two three four ", "five six seven eight nine ten"]);
        assert!(!released(&out).contains("eight"), "{}", released(&out));
        assert!(matches!(out.last(), Some(BackendEvent::Finish { reason, .. }) if reason == CONTENT_FILTER));
        assert!(g.failure().is_some_and(|f| f.contains("index corrupted")));
    }

    #[test]
    fn fail_open_passes_everything_unscanned_once_it_failed() {
        let mut g = broken_guard(FailMode::Open);
        let text = ["one two three four ", "five six seven eight nine ten"];
        let out = run(&mut g, &text);
        assert_eq!(released(&out), text.concat());
        assert!(matches!(out.last(), Some(BackendEvent::Finish { reason, .. }) if reason == "stop"));
        assert!(g.failure().is_some());
    }

    #[test]
    fn a_block_in_one_choice_leaves_the_other_running() {
        let mut g = guard(2);
        assert!(g.apply(text(0, "tok_a1b2c3d4e5f6g7h8 ")).iter().any(|e| matches!(e, BackendEvent::Finish { index: 0, .. })));
        assert!(!g.all_finished());
        let out = g.apply(text(1, "fine text "));
        assert_eq!(released(&out), "fine text ");
    }
}
