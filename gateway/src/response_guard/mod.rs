//! The response guard: the one place that decides what of a response may reach its client.
//!
//! One [`ResponseGuard`] per response, built from the current rules snapshot, the
//! detectors, the tenant's [`ScanContext`], its fail mode and the configured holdback
//! limit ([`GuardSettings`]). Every field of every choice passes through it, streamed or
//! not, from the engine or an upstream; what it returns is all the relay writes. When the
//! response ends, [`finish`] turns its outcome (findings, a firewall failure, a backend
//! error, the released text) into metrics, one log line each and the audit record.
//!
//! Files: `channel.rs` (a streamed channel: content, refusal, tool-call arguments, and the
//! one place their scanners are built), `logprobs.rs` (which logprob entries leave, rebuilt),
//! `fields.rs` (one-shot scans of short fields: tool-call ids, types and names, metadata),
//! `finish.rs` (the outcome: metrics, logging, audit).
//!
//! Invariants:
//! - a delta carries only released text; held text waits for a later event or the end;
//! - every string in a delta was judged: streamed text by its channel's scanner, short
//!   fields one-shot, logprob entries rebuilt from their typed fields (see `logprobs.rs`);
//!   `role` is always `assistant` and a `finish_reason` is one of OpenAI's;
//! - a block ends its choice with `finish_reason: "content_filter"`; nothing of that
//!   choice follows, and once every choice is done the backend can be dropped (stopped);
//! - the tenant's fail mode is consulted in [`ResponseGuard::fail`] only: a scanner that
//!   fails (panics), or an audit record that is lost, blocks (closed) or lets the channel
//!   pass unscanned from then on, held text included (open).

mod channel;
mod fields;
mod finish;
mod logprobs;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use firewall::detect::Observations;
use firewall::{Action, Detectors, Finding, Ruleset, ScanContext, Step, StreamScanner, TokenSignals};

use crate::api::response::{FunctionChunk, ToolCallChunk};
use crate::backend::{BackendEvent, ChoiceDelta, TokenLogprob};
use crate::config::FailMode;
use crate::error::ApiError;
use channel::{Channel, ChannelScan};
use fields::CallHeader;

pub use finish::{Delivery, Finisher};

/// The `finish_reason` of a blocked choice.
pub const CONTENT_FILTER: &str = "content_filter";

/// The only role a choice speaks with.
const ASSISTANT: &str = "assistant";

/// What a response's guard is built from.
#[derive(Clone)]
pub struct GuardSettings {
    pub rules: Arc<Ruleset>,
    pub detectors: Arc<Detectors>,
    pub ctx: ScanContext,
    pub fail_mode: FailMode,
    /// `[firewall] max_holdback_bytes`: given to every scanner.
    pub max_holdback_bytes: usize,
    /// Number of choices the request asked for.
    pub choices: u32,
}

impl GuardSettings {
    /// Settings with the defaults a test or a tool wants: fail closed, the firewall's
    /// default holdback, one choice.
    pub fn new(rules: Arc<Ruleset>, ctx: ScanContext, detectors: Arc<Detectors>) -> GuardSettings {
        GuardSettings { rules, detectors, ctx, fail_mode: FailMode::Closed, max_holdback_bytes: firewall::MAX_HOLDBACK_BYTES, choices: 1 }
    }
}

/// A finding with the choice it was made in.
#[derive(Debug, Clone)]
pub struct ChoiceFinding {
    pub choice: u32,
    pub finding: Finding,
}

/// The firewall failed on this response, and how the tenant's fail mode took it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: String,
    pub mode: FailMode,
}

/// The firewall state of one response.
pub struct ResponseGuard {
    settings: GuardSettings,
    channels: BTreeMap<(u32, Channel), ChannelScan>,
    /// (choice, tool call index) -> its header.
    calls: BTreeMap<(u32, u32), CallHeader>,
    /// Choices the firewall stopped.
    blocked: BTreeSet<u32>,
    /// Choices that ended (by the backend or by a block).
    finished: BTreeSet<u32>,
    findings: Vec<ChoiceFinding>,
    released_bytes: usize,
    failure: Option<Failure>,
    /// The error that ended the backend's events, if one did.
    backend_error: Option<ApiError>,
}

impl ResponseGuard {
    pub fn new(mut settings: GuardSettings) -> ResponseGuard {
        settings.choices = settings.choices.max(1);
        ResponseGuard {
            settings,
            channels: BTreeMap::new(),
            calls: BTreeMap::new(),
            blocked: BTreeSet::new(),
            finished: BTreeSet::new(),
            findings: Vec::new(),
            released_bytes: 0,
            failure: None,
            backend_error: None,
        }
    }

    /// The firewall's failure on this response, if it had one.
    pub fn failure(&self) -> Option<&Failure> {
        self.failure.as_ref()
    }

    /// The error that ended the backend's events, if one did.
    pub fn backend_error(&self) -> Option<&ApiError> {
        self.backend_error.as_ref()
    }

    /// The text released to the client, one string per choice and channel (each capped),
    /// for the provenance index.
    pub fn released_texts(&self) -> impl Iterator<Item = &str> + '_ {
        self.channels.values().map(|s| s.released.as_str())
    }

    /// What each content channel's scanner observed (character entropy, surprisal,
    /// predictive entropy), for the tenant's statistics.
    pub fn observations(&self) -> impl Iterator<Item = Observations> + '_ {
        self.channels.iter().filter(|((_, ch), _)| *ch == Channel::Content).map(|(_, s)| s.observations())
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
        self.finished.len() >= self.settings.choices as usize
    }

    /// Records the error that ended the backend's events (reported by [`finish`]).
    pub fn backend_failed(&mut self, error: &ApiError) {
        self.backend_error.get_or_insert_with(|| error.clone());
    }

    /// The firewall failed on this response: the one place the tenant's fail mode is
    /// consulted. Returns how to take it: `Closed` blocks what was in question, `Open`
    /// lets it through unscanned.
    pub fn fail(&mut self, reason: String) -> FailMode {
        let mode = self.settings.fail_mode;
        self.failure.get_or_insert(Failure { reason, mode });
        mode
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
                    out.push(BackendEvent::Finish { index, reason: fields::finish_reason(reason) });
                }
                out
            }
        }
    }

    /// Flushes every choice the backend left open (its stream ended without a finish).
    pub fn finish_all(&mut self) -> Vec<BackendEvent> {
        let open: BTreeSet<u32> = self
            .channels
            .keys()
            .map(|(c, _)| *c)
            .chain(self.calls.keys().map(|(c, _)| *c))
            .filter(|c| !self.finished.contains(c))
            .collect();
        open.into_iter().flat_map(|c| self.flush_choice(c)).collect()
    }

    fn delta(&mut self, d: ChoiceDelta) -> Vec<BackendEvent> {
        let index = d.index;
        let mut out = ChoiceDelta { index, role: d.role.map(|_| ASSISTANT.to_owned()), ..ChoiceDelta::default() };
        if let Some(text) = d.content {
            let step = self.push(index, Channel::Content, &text, d.logprobs, d.signals.as_ref());
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
            if self.tool_call(index, call, &mut out) {
                return self.blocked_events(index, out);
            }
        }
        if is_empty_delta(&out) {
            Vec::new()
        } else {
            vec![BackendEvent::Delta(out)]
        }
    }

    /// One tool-call fragment: its header is held until the call's first `arguments`
    /// fragment, its arguments are scanned as they stream. True when it blocked.
    fn tool_call(&mut self, index: u32, call: ToolCallChunk, out: &mut ChoiceDelta) -> bool {
        self.calls.entry((index, call.index)).or_default().absorb(&call);
        let Some(mut fragment) = self.release_header(index, call.index, call.function.arguments.is_some()) else {
            return true;
        };
        let mut blocked = false;
        if let Some(args) = call.function.arguments {
            let channel = Channel::ToolArguments(call.index);
            let step = self.push(index, channel, &args, Vec::new(), None);
            let released = step.release.clone();
            blocked = self.absorb_step(index, channel, step, out);
            // An empty fragment is sent only with the header it belongs to.
            if !released.is_empty() || !is_empty_call(&fragment) {
                fragment.function.arguments = Some(released);
            }
        }
        if !is_empty_call(&fragment) {
            out.tool_calls.push(fragment);
        }
        blocked
    }

    fn channel(&mut self, index: u32, channel: Channel) -> &mut ChannelScan {
        let settings = &self.settings;
        self.channels.entry((index, channel)).or_insert_with(|| ChannelScan::new(settings, channel))
    }

    fn push(&mut self, index: u32, channel: Channel, text: &str, entries: Vec<TokenLogprob>, signals: Option<&TokenSignals>) -> Step {
        // An upstream's logprobs give per-token signals too, when its entries spell the text.
        let tokens = match signals {
            None => logprobs::upstream_tokens(text, &entries),
            Some(_) => Vec::new(),
        };
        let s = self.channel(index, channel);
        let start = s.pushed;
        s.pushed += text.len();
        s.pending_logprobs.extend(logprobs::place(text, start, entries));
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

    /// Runs one scanner call; a failure is taken as the tenant's fail mode says.
    fn scan(&mut self, index: u32, channel: Channel, text: &str, call: impl FnOnce(&mut StreamScanner) -> Step) -> Step {
        match self.channel(index, channel).scan(text, call) {
            Ok(step) => step,
            Err(reason) => match self.fail(reason) {
                FailMode::Closed => Step { release: String::new(), findings: Vec::new(), action: Action::Block },
                FailMode::Open => Step { release: self.channel(index, channel).bypass(), findings: Vec::new(), action: Action::Log },
            },
        }
    }

    /// Folds a step's release and findings into `out`; true when the step blocked.
    fn absorb_step(&mut self, index: u32, channel: Channel, step: Step, out: &mut ChoiceDelta) -> bool {
        self.released_bytes += step.release.len();
        let s = self.channel(index, channel);
        s.record(&step.release);
        s.redacted.extend(step.findings.iter().filter(|f| f.action == Action::Redact).map(|f| (f.start, f.end)));
        self.findings.extend(step.findings.into_iter().map(|finding| ChoiceFinding { choice: index, finding }));
        let mut blocked = step.action == Action::Block;
        match channel {
            Channel::Content => {
                if !step.release.is_empty() {
                    out.content.get_or_insert_with(String::new).push_str(&step.release);
                }
                let (entries, entry_blocked) = self.release_logprobs(index, blocked);
                out.logprobs.extend(entries);
                blocked |= entry_blocked;
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

    /// Ends every channel of a choice; the released remainder (or a block) follows.
    fn flush_choice(&mut self, index: u32) -> Vec<BackendEvent> {
        let mut out = ChoiceDelta { index, ..ChoiceDelta::default() };
        for call in self.unannounced_calls(index) {
            match self.release_header(index, call, true) {
                Some(header) if !is_empty_call(&header) => out.tool_calls.push(header),
                Some(_) => {}
                None => return self.blocked_events(index, out),
            }
        }
        let channels: Vec<Channel> = self.channels.keys().filter(|(c, _)| *c == index).map(|(_, ch)| *ch).collect();
        for channel in channels {
            let step = self.scan(index, channel, "", StreamScanner::finish);
            let released = step.release.clone();
            let stop = self.absorb_step(index, channel, step, &mut out);
            if let (Channel::ToolArguments(call), false) = (channel, released.is_empty()) {
                out.tool_calls.push(ToolCallChunk { index: call, id: None, kind: None, function: FunctionChunk { name: None, arguments: Some(released) } });
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
        self.blocked.insert(index);
        self.finished.insert(index);
        let mut out = Vec::new();
        if !is_empty_delta(&released) {
            out.push(BackendEvent::Delta(released));
        }
        out.push(BackendEvent::Finish { index, reason: CONTENT_FILTER.to_owned() });
        out
    }
}

fn is_empty_delta(d: &ChoiceDelta) -> bool {
    d.role.is_none() && d.content.is_none() && d.refusal.is_none() && d.tool_calls.is_empty() && d.logprobs.is_empty()
}

fn is_empty_call(c: &ToolCallChunk) -> bool {
    c.id.is_none() && c.kind.is_none() && c.function.name.is_none() && c.function.arguments.is_none()
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

    fn settings() -> GuardSettings {
        let rules = Ruleset::load_sources(&[("test.toml".into(), RULES.into())], Default::default()).expect("test rules load");
        GuardSettings::new(Arc::new(rules), ScanContext::new("acme"), Arc::new(Detectors::default()))
    }

    fn guard(choices: u32) -> ResponseGuard {
        ResponseGuard::new(GuardSettings { choices, ..settings() })
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

    fn run(g: &mut ResponseGuard, chunks: &[&str]) -> Vec<BackendEvent> {
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
        let entry = |t: &str| TokenLogprob { token: t.into(), logprob: -0.1, top_logprobs: Vec::new() };
        let mut out = Vec::new();
        for t in ["id ", "rid_", "12345678", " ok"] {
            out.extend(g.apply(BackendEvent::Delta(ChoiceDelta { index: 0, content: Some(t.into()), logprobs: vec![entry(t)], ..Default::default() })));
        }
        out.extend(g.apply(BackendEvent::Finish { index: 0, reason: "stop".into() }));
        let entries: Vec<TokenLogprob> = out
            .iter()
            .flat_map(|e| match e {
                BackendEvent::Delta(d) => d.logprobs.clone(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(entries.len(), 4);
        let tokens: Vec<&str> = entries.iter().map(|e| e.token.as_str()).collect();
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
        let mut g = ResponseGuard::new(GuardSettings::new(Arc::new(Ruleset::empty()), ScanContext::new("acme"), Arc::new(detectors)));
        let entry = |t: &str, lp: f64| TokenLogprob { token: t.into(), logprob: lp, top_logprobs: vec![crate::backend::TopLogprob { token: t.into(), logprob: lp }] };
        let delta = ChoiceDelta { index: 0, content: Some("Hello world".into()), logprobs: vec![entry("Hello", -0.5), entry(" world", -1.5)], ..Default::default() };
        let mut out = g.apply(BackendEvent::Delta(delta));
        out.extend(g.apply(BackendEvent::Finish { index: 0, reason: "stop".into() }));
        assert_eq!(released(&out), "Hello world");
        let obs: Vec<_> = g.observations().collect();
        assert_eq!(obs[0].surprisal.count, 2);
        assert!((obs[0].surprisal.mean - 1.0).abs() < 1e-9);
        assert_eq!(obs[0].predictive_entropy.count, 2);
        // Entries that do not spell the text leave it plain text.
        assert!(logprobs::upstream_tokens("Hello", &[entry("Help", -0.1)]).is_empty());
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

    fn broken_guard(mode: FailMode) -> ResponseGuard {
        let detectors = Detectors { ngram: Some(firewall::NgramConfig::new(firewall::NgramKey([0; 16]), Arc::new(Broken))), ..Detectors::default() };
        let settings = GuardSettings::new(Arc::new(Ruleset::empty()), ScanContext::new("acme"), Arc::new(detectors));
        ResponseGuard::new(GuardSettings { fail_mode: mode, ..settings })
    }

    #[test]
    fn a_failing_firewall_fails_closed() {
        let mut g = broken_guard(FailMode::Closed);
        let out = run(&mut g, &["one two three four ", "five six seven eight nine ten"]);
        assert!(!released(&out).contains("eight"), "{}", released(&out));
        assert!(matches!(out.last(), Some(BackendEvent::Finish { reason, .. }) if reason == CONTENT_FILTER));
        assert!(g.failure().is_some_and(|f| f.reason.contains("index corrupted") && f.mode == FailMode::Closed));
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
