//! The response guard: the one place that decides what of a response may reach its client.
//!
//! One [`ResponseGuard`] per response, built from the current rules snapshot, the
//! detectors, the tenant's [`ScanContext`], its fail mode and the configured holdback
//! limit ([`GuardSettings`]). Every field of every choice passes through it, streamed or
//! not, from the engine or an upstream; what it returns is all the relay writes. When the
//! response ends, the [`Finisher`] turns its outcome (findings, a firewall failure, a backend
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
//! - within a response, the tenant's fail mode is consulted in [`ResponseGuard::fail`] only:
//!   a scanner that fails (panics), or an audit record that is lost, blocks (closed) or lets
//!   the channel pass unscanned from then on, held text included (open). (Before a request
//!   starts, `Protection::refusal_when_stale` reads it too.)

mod channel;
mod fields;
mod finish;
mod logprobs;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use firewall::Observations;
use firewall::{Action, Detectors, Finding, Ruleset, ScanContext, Step, StreamScanner, TokenSignals};

use crate::api::response::{FunctionChunk, ToolCallChunk};
use crate::backend::{BackendEvent, ChoiceDelta, TokenLogprob};
use crate::config::FailMode;
use crate::error::ApiError;
use channel::{Channel, ChannelScan};
use fields::{CallHeader, HeaderAt};

pub use finish::{Delivery, Finisher};

/// The `finish_reason` of a blocked choice.
pub const CONTENT_FILTER: &str = "content_filter";

/// The only role a choice speaks with.
const ASSISTANT: &str = "assistant";

/// Most tool calls one choice may make (OpenAI allows 128 tools a request; a model calls
/// a handful at once): each holds its header and its arguments' scanner until the choice
/// ends, so an upstream making millions would hold them all. Past it the choice is blocked,
/// whatever the tenant's fail mode.
pub const MAX_TOOL_CALLS: usize = 1_024;

/// Most findings a response keeps to list (in its audit record and its log line), blocks
/// aside: a response that matches a redact or log rule a million times is still counted in
/// full, by rule and action, but its record stays readable and its memory bounded.
pub const MAX_LISTED_FINDINGS: usize = 1_000;

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
        GuardSettings {
            rules,
            detectors,
            ctx,
            fail_mode: FailMode::Closed,
            max_holdback_bytes: firewall::MAX_HOLDBACK_BYTES,
            choices: 1,
        }
    }
}

/// The actions a finding may have, in the order [`ActionCounts`] counts them.
const ACTIONS: [Action; 4] = [Action::Allow, Action::Log, Action::Redact, Action::Block];

/// Findings of one rule, by action (in [`ACTIONS`]' order).
type ActionCounts = [u64; ACTIONS.len()];

/// One flag per action, in [`ACTIONS`]' order.
type ActionFlags = [bool; ACTIONS.len()];

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
    /// The findings listed: every block, the first of each action, and the first
    /// [`MAX_LISTED_FINDINGS`] others.
    findings: Vec<ChoiceFinding>,
    /// Every finding made, listed or not, by rule and action.
    tally: BTreeMap<String, ActionCounts>,
    /// Findings counted but not listed.
    unlisted: u64,
    /// Which actions (in [`ACTIONS`]' order) a listed finding has: the first finding of
    /// each action is always listed, so the record's action is the response's.
    actions_listed: ActionFlags,
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
            tally: BTreeMap::new(),
            unlisted: 0,
            actions_listed: ActionFlags::default(),
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

    /// The rules this response is scanned with.
    pub fn rules(&self) -> &Ruleset {
        &self.settings.rules
    }

    /// The findings listed so far (log, redact and block): every block, the first of each
    /// action, and the first [`MAX_LISTED_FINDINGS`] others.
    pub fn findings(&self) -> &[ChoiceFinding] {
        &self.findings
    }

    /// How many findings each rule made with each action, listed or not.
    pub fn finding_counts(&self) -> impl Iterator<Item = (&str, Action, u64)> + '_ {
        self.tally.iter().flat_map(|(rule, counts)| {
            ACTIONS.into_iter().zip(counts).filter(|(_, n)| **n > 0).map(move |(action, n)| (rule.as_str(), action, *n))
        })
    }

    /// Findings made but not listed (past [`MAX_LISTED_FINDINGS`]).
    pub fn unlisted_findings(&self) -> u64 {
        self.unlisted
    }

    /// Counts a finding and lists it if there is room (a block always).
    fn note(&mut self, choice: u32, finding: Finding) {
        let slot = ACTIONS.iter().position(|a| *a == finding.action).unwrap_or(0);
        match self.tally.get_mut(finding.rule_id.as_str()) {
            Some(counts) => counts[slot] += 1,
            None => {
                let mut counts = ActionCounts::default();
                counts[slot] = 1;
                self.tally.insert(finding.rule_id.clone(), counts);
            }
        }
        let first_of_its_action = !self.actions_listed[slot];
        if finding.action == Action::Block || first_of_its_action || self.findings.len() < MAX_LISTED_FINDINGS {
            self.actions_listed[slot] = true;
            self.findings.push(ChoiceFinding { choice, finding });
        } else {
            self.unlisted += 1;
        }
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

    /// Records the error that ended the backend's events (reported by the [`Finisher`]).
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

    /// The events to relay for one backend event. A choice the request did not ask for
    /// (an upstream's index past `n`) is dropped: its client never expects it, and its
    /// end must not count toward [`Self::all_finished`] and stop the backend early.
    pub fn apply(&mut self, event: BackendEvent) -> Vec<BackendEvent> {
        match event {
            BackendEvent::Usage(u) => vec![BackendEvent::Usage(u)],
            BackendEvent::Delta(ChoiceDelta { index, .. }) | BackendEvent::Finish { index, .. }
                if index >= self.settings.choices =>
            {
                Vec::new()
            }
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
        if !self.calls.contains_key(&(index, call.index)) && self.call_count(index) >= MAX_TOOL_CALLS {
            // Each call holds its header and a scanner of its own: past the bound the
            // firewall cannot judge it. The backend alone decides to get there, so this is
            // no failure a tenant's fail-open covers: the choice is blocked whatever it says.
            let reason = format!("the backend sent more than {MAX_TOOL_CALLS} tool calls in one choice");
            self.failure.get_or_insert(Failure { reason, mode: FailMode::Closed });
            return true;
        }
        self.calls.entry((index, call.index)).or_default().absorb(&call);
        let at = HeaderAt::Fragment { arguments: call.function.arguments.is_some() };
        let Some(mut fragment) = self.release_header(index, call.index, at) else {
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

    /// How many tool calls choice `index` has begun.
    fn call_count(&self, index: u32) -> usize {
        self.calls.range((index, 0)..=(index, u32::MAX)).count()
    }

    fn channel(&mut self, index: u32, channel: Channel) -> &mut ChannelScan {
        let settings = &self.settings;
        self.channels.entry((index, channel)).or_insert_with(|| ChannelScan::new(settings, channel))
    }

    fn push(
        &mut self,
        index: u32,
        channel: Channel,
        text: &str,
        entries: Vec<TokenLogprob>,
        signals: Option<&TokenSignals>,
    ) -> Step {
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
    fn scan(
        &mut self,
        index: u32,
        channel: Channel,
        text: &str,
        call: impl FnOnce(&mut StreamScanner) -> Step,
    ) -> Step {
        match self.channel(index, channel).scan(text, call) {
            Ok(step) => step,
            Err(reason) => match self.fail(reason) {
                FailMode::Closed => Step { release: String::new(), findings: Vec::new(), action: Action::Block },
                FailMode::Open => {
                    Step { release: self.channel(index, channel).bypass(), findings: Vec::new(), action: Action::Log }
                }
            },
        }
    }

    /// Folds a step's release and findings into `out`; true when the step blocked.
    fn absorb_step(&mut self, index: u32, channel: Channel, step: Step, out: &mut ChoiceDelta) -> bool {
        self.released_bytes += step.release.len();
        let s = self.channel(index, channel);
        s.record(&step.release);
        s.redacted.extend(step.findings.iter().filter(|f| f.action == Action::Redact).map(|f| (f.start, f.end)));
        step.findings.into_iter().for_each(|finding| self.note(index, finding));
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
        for call in self.calls_holding_text(index) {
            match self.release_header(index, call, HeaderAt::ChoiceEnd) {
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
                out.tool_calls.push(ToolCallChunk {
                    index: call,
                    id: None,
                    kind: None,
                    function: FunctionChunk { name: None, arguments: Some(released) },
                });
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

[[rule]]
id = "test-grow"
description = "a redacted id of any length"
severity = "low"
action = "redact"
regex = '''\b(grow_[0-9]{8,})'''
secret_group = 1
keywords = ["grow_"]
tags = ["test"]
must_match = ["grow_12345678"]
must_not_match = ["grow_1"]

[[rule]]
id = "test-long"
description = "a match that can grow long"
severity = "high"
action = "block"
regex = '''\b(long_[a-z]{8,})\b'''
secret_group = 1
keywords = ["long_"]
tags = ["test"]
must_match = ["long_abcdefgh"]
must_not_match = ["long_abc"]

[[rule]]
id = "test-log"
description = "a logged id"
severity = "low"
action = "log"
regex = '''\b(lid_[0-9]{8})\b'''
secret_group = 1
keywords = ["lid_"]
tags = ["test"]
must_match = ["lid_12345678"]
must_not_match = ["lid_1"]

[[canary]]
id = "globex-canary"
owner = "globex"
strings = ["GLOBEX-CANARY-5d1e2b"]
"#;

    pub(super) fn settings() -> GuardSettings {
        let rules = Ruleset::load_sources(&[firewall::RuleSource::new("test.toml", RULES)], Default::default())
            .expect("test rules load");
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
    fn a_response_lists_a_bounded_number_of_findings_and_counts_every_one() {
        let mut g = guard(1);
        let ids = "id rid_12345678, ".repeat(MAX_LISTED_FINDINGS + 2_000);
        let mut chunks: Vec<&str> = ids.as_bytes().chunks(7).map(|c| std::str::from_utf8(c).unwrap()).collect();
        chunks.push(" and tok_q8w7e6r5t4y3u2i1 ");
        let out = run(&mut g, &chunks);
        let sent = released(&out);
        assert!(sent.ends_with("id [REDACTED:test-redact],  and "), "{}", &sent[sent.len() - 80..]);
        assert!(g.blocked());
        assert_eq!(g.findings().len(), MAX_LISTED_FINDINGS + 1, "the block is listed past the limit");
        assert_eq!(g.findings().last().map(|f| f.finding.rule_id.as_str()), Some("test-token"));
        assert_eq!(g.unlisted_findings(), 2_000);
        let counts: Vec<(&str, Action, u64)> = g.finding_counts().collect();
        assert_eq!(counts, [("test-redact", Action::Redact, 3_000), ("test-token", Action::Block, 1)]);
    }

    #[test]
    fn the_first_finding_of_each_action_is_listed_past_the_limit() {
        let mut g = guard(1);
        let text = format!("{}and rid_12345678 then", "lid_12345678 ".repeat(MAX_LISTED_FINDINGS + 5));
        let out = run(&mut g, &[&text]);
        assert!(released(&out).ends_with("and [REDACTED:test-redact] then"));
        let actions: Vec<Action> = g.findings().iter().map(|f| f.finding.action).collect();
        assert!(actions.contains(&Action::Redact), "a record's action comes from its listed findings");
        assert_eq!(g.findings().len(), MAX_LISTED_FINDINGS + 1);
        assert_eq!(g.unlisted_findings(), 5);
    }

    #[test]
    fn a_choice_the_request_did_not_ask_for_is_dropped_and_ends_nothing() {
        let mut g = guard(1);
        assert!(g.apply(text(1, "an extra choice")).is_empty());
        assert!(g.apply(BackendEvent::Finish { index: 1, reason: "stop".into() }).is_empty());
        assert!(!g.all_finished(), "choice 0 is still to come");
        let out = run(&mut g, &["the answer"]);
        assert_eq!(released(&out), "the answer");
        assert!(g.all_finished());
    }

    #[test]
    fn a_choice_past_the_tool_call_bound_is_blocked_whatever_the_fail_mode() {
        for mode in [FailMode::Closed, FailMode::Open] {
            let mut g = ResponseGuard::new(GuardSettings { fail_mode: mode, ..settings() });
            let mut out = Vec::new();
            for i in 0..=MAX_TOOL_CALLS as u32 {
                let c = ToolCallChunk { index: i, ..call(&format!("call_{i}"), "function", "lookup", "{}") };
                out.extend(g.apply(BackendEvent::Delta(ChoiceDelta {
                    index: 0,
                    tool_calls: vec![c],
                    ..Default::default()
                })));
            }
            assert!(matches!(out.last(), Some(BackendEvent::Finish { reason, .. }) if reason == CONTENT_FILTER));
            assert!(
                g.blocked()
                    && g.failure().is_some_and(|f| f.reason.contains("tool calls") && f.mode == FailMode::Closed)
            );
            let sent = out.iter().filter(|e| matches!(e, BackendEvent::Delta(d) if !d.tool_calls.is_empty())).count();
            assert_eq!(sent, MAX_TOOL_CALLS, "{mode:?}: every call within the bound went out, none past it");
            assert!(g.calls.len() <= MAX_TOOL_CALLS);
        }
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
            out.extend(g.apply(BackendEvent::Delta(ChoiceDelta {
                index: 0,
                content: Some(t.into()),
                logprobs: vec![entry(t)],
                ..Default::default()
            })));
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
        let detectors =
            Detectors { entropy: Some(firewall::EntropyConfig::new(Arc::new(NoBaseline))), ..Detectors::default() };
        let mut g = ResponseGuard::new(GuardSettings::new(
            Arc::new(Ruleset::empty()),
            ScanContext::new("acme"),
            Arc::new(detectors),
        ));
        let entry = |t: &str, lp: f64| TokenLogprob {
            token: t.into(),
            logprob: lp,
            top_logprobs: vec![crate::backend::TopLogprob { token: t.into(), logprob: lp }],
        };
        let delta = ChoiceDelta {
            index: 0,
            content: Some("Hello world".into()),
            logprobs: vec![entry("Hello", -0.5), entry(" world", -1.5)],
            ..Default::default()
        };
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
                tool_calls: vec![ToolCallChunk {
                    index: 0,
                    id: None,
                    kind: None,
                    function: FunctionChunk { name: None, arguments: Some(args.into()) },
                }],
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
        let detectors = Detectors {
            ngram: Some(firewall::NgramConfig::new(firewall::NgramKey([0; 16]), Arc::new(Broken))),
            ..Detectors::default()
        };
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
        assert!(g
            .apply(text(0, "tok_a1b2c3d4e5f6g7h8 "))
            .iter()
            .any(|e| matches!(e, BackendEvent::Finish { index: 0, .. })));
        assert!(!g.all_finished());
        let out = g.apply(text(1, "fine text "));
        assert_eq!(released(&out), "fine text ");
    }

    /// Another tenant's canary (the guard answers acme) and a secret of a block rule.
    const LEAKS: [&str; 2] = ["GLOBEX-CANARY-5d1e2b", "tok_q8w7e6r5t4y3u2i1"];

    fn entry(token: &str, top: &[&str]) -> TokenLogprob {
        let top_logprobs =
            top.iter().map(|t| crate::backend::TopLogprob { token: (*t).into(), logprob: -2.0 }).collect();
        TokenLogprob { token: token.into(), logprob: -0.25, top_logprobs }
    }

    fn call(id: &str, kind: &str, name: &str, arguments: &str) -> ToolCallChunk {
        ToolCallChunk {
            index: 0,
            id: Some(id.into()),
            kind: Some(kind.into()),
            function: FunctionChunk { name: Some(name.into()), arguments: Some(arguments.into()) },
        }
    }

    fn delta(d: ChoiceDelta) -> Result<BackendEvent, ApiError> {
        Ok(BackendEvent::Delta(d))
    }

    /// A backend answer with `leak` placed in one channel: (channel, events, fingerprint).
    fn placed(channel: &str, leak: &str) -> (Vec<Result<BackendEvent, ApiError>>, Option<String>) {
        let content = |text: &str, logprobs| {
            delta(ChoiceDelta {
                index: 0,
                role: Some("assistant".into()),
                content: Some(text.into()),
                logprobs,
                ..Default::default()
            })
        };
        let tools = |c| delta(ChoiceDelta { index: 0, tool_calls: vec![c], ..Default::default() });
        let mut fingerprint = Some("fp_44709d6fcb".to_owned());
        let mut events = match channel {
            "logprob token" => vec![content("Hello world", vec![entry("Hello", &[]), entry(leak, &[])])],
            "top_logprobs token" => vec![content("Hello", vec![entry("Hello", &["Hi", leak])])],
            "tool-call name" => vec![tools(call("call_1", "function", leak, "{}"))],
            "tool-call id" => vec![tools(call(leak, "function", "lookup", "{}"))],
            "tool-call type" => vec![tools(call("call_1", leak, "lookup", "{}"))],
            "tool-call name in fragments" => {
                let (a, b) = leak.split_at(leak.len() / 2);
                let head = ToolCallChunk {
                    index: 0,
                    id: Some("call_1".into()),
                    kind: None,
                    function: FunctionChunk { name: Some(a.into()), arguments: None },
                };
                let tail = ToolCallChunk {
                    index: 0,
                    id: None,
                    kind: None,
                    function: FunctionChunk { name: Some(b.into()), arguments: Some("{}".into()) },
                };
                vec![tools(head), tools(tail)]
            }
            "refusal" => vec![delta(ChoiceDelta {
                index: 0,
                refusal: Some(format!("I cannot share {leak} here.")),
                ..Default::default()
            })],
            "system_fingerprint" => {
                fingerprint = Some(format!("fp_{leak}"));
                vec![content("Hello", Vec::new())]
            }
            other => panic!("no channel {other}"),
        };
        events.push(Ok(BackendEvent::Finish { index: 0, reason: "stop".into() }));
        (events, fingerprint)
    }

    const CHANNELS: [&str; 8] = [
        "logprob token",
        "top_logprobs token",
        "tool-call name",
        "tool-call id",
        "tool-call type",
        "tool-call name in fragments",
        "refusal",
        "system_fingerprint",
    ];

    fn backend(
        events: Vec<Result<BackendEvent, ApiError>>,
        fingerprint: Option<String>,
    ) -> crate::backend::BackendResponse {
        crate::backend::BackendResponse {
            system_fingerprint: fingerprint,
            events: Box::pin(futures::stream::iter(events)),
        }
    }

    fn meta() -> crate::relay::ResponseMeta {
        crate::relay::ResponseMeta {
            id: "chatcmpl-1".into(),
            created: 1,
            model: "m".into(),
            include_usage: false,
            shape: crate::relay::Shape::Chat,
        }
    }

    /// What a client receives, as raw bytes (the whole SSE body, or the JSON object), and
    /// what the guard saw: (blocked, findings).
    async fn delivered(
        events: Vec<Result<BackendEvent, ApiError>>,
        fingerprint: Option<String>,
        stream: bool,
    ) -> (Vec<u8>, (bool, usize)) {
        use futures::StreamExt;
        let mut g = guard(1);
        if !stream {
            let completion =
                crate::relay::collect(meta(), backend(events, fingerprint), &mut g).await.expect("collects");
            return (serde_json::to_vec(&completion).expect("serializes"), (g.blocked(), g.findings().len()));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let on_end: crate::relay::OnEnd = Box::new(move |g: &ResponseGuard| {
            let _ = tx.send((g.blocked(), g.findings().len()));
        });
        let body: Vec<_> =
            crate::relay::sse_body(crate::relay::ChunkFraming::new(meta()), backend(events, fingerprint), g, on_end)
                .collect()
                .await;
        let bytes = body.into_iter().flat_map(|b| b.map(|b| b.to_vec()).unwrap_or_default()).collect();
        (bytes, rx.recv().expect("the stream ended"))
    }

    /// Every string in a JSON document, byte arrays (`bytes`) read as text too.
    fn strings(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::String(s) => out.push(s.clone()),
            serde_json::Value::Array(items)
                if !items.is_empty() && items.iter().all(|i| i.as_u64().is_some_and(|n| n < 256)) =>
            {
                let bytes: Vec<u8> = items.iter().filter_map(|i| i.as_u64()).map(|n| n as u8).collect();
                out.push(String::from_utf8_lossy(&bytes).into_owned());
            }
            serde_json::Value::Array(items) => items.iter().for_each(|i| strings(i, out)),
            serde_json::Value::Object(map) => map.iter().for_each(|(k, v)| {
                out.push(k.clone());
                strings(v, out);
            }),
            _ => {}
        }
    }

    fn decoded_strings(raw: &[u8], stream: bool) -> Vec<String> {
        let text = String::from_utf8_lossy(raw);
        let docs: Vec<&str> = if stream {
            text.split("\n\n").filter_map(|f| f.strip_prefix("data: ")).filter(|f| *f != "[DONE]").collect()
        } else {
            vec![&text]
        };
        let mut out = Vec::new();
        for doc in docs {
            strings(&serde_json::from_str(doc).expect("every frame is JSON"), &mut out);
        }
        out
    }

    #[tokio::test]
    async fn no_channel_carries_a_leak_to_the_client() {
        for channel in CHANNELS {
            for leak in LEAKS {
                for stream in [false, true] {
                    let (events, fingerprint) = placed(channel, leak);
                    let (raw, (blocked, _)) = delivered(events, fingerprint, stream).await;
                    let what = format!("{channel}, {leak}, stream {stream}");
                    let raw_text = String::from_utf8_lossy(&raw);
                    assert!(!raw_text.contains(leak) && !raw_text.contains(&leak[..12]), "{what}: {raw_text}");
                    let decoded = decoded_strings(&raw, stream);
                    assert!(!decoded.iter().any(|s| s.contains(&leak[..12])), "{what}: {decoded:?}");
                    if channel != "system_fingerprint" {
                        assert!(blocked, "{what}: a leak blocks its choice");
                        assert!(raw_text.contains(CONTENT_FILTER), "{what}: {raw_text}");
                    }
                }
            }
        }
    }

    #[tokio::test]
    async fn a_clean_answer_is_unchanged_in_every_channel() {
        let args = r#"{"city": "Paris", "units": "metric"}"#;
        let tokens = ["The", " weather", " in", " Paris"];
        let logprobs: Vec<TokenLogprob> = tokens.iter().map(|t| entry(t, &[t, " Lyon"])).collect();
        let events = vec![
            delta(ChoiceDelta {
                index: 0,
                role: Some("assistant".into()),
                content: Some(tokens.concat()),
                logprobs,
                ..Default::default()
            }),
            delta(ChoiceDelta {
                index: 0,
                tool_calls: vec![call("call_abc123", "function", "get_weather", "")],
                ..Default::default()
            }),
            delta(ChoiceDelta {
                index: 0,
                tool_calls: vec![ToolCallChunk {
                    index: 0,
                    id: None,
                    kind: None,
                    function: FunctionChunk { name: None, arguments: Some(args.into()) },
                }],
                ..Default::default()
            }),
            Ok(BackendEvent::Finish { index: 0, reason: "tool_calls".into() }),
        ];
        for stream in [false, true] {
            let (raw, seen) = delivered(events.clone(), Some("fp_44709d6fcb".into()), stream).await;
            assert_eq!(seen, (false, 0));
            let decoded = decoded_strings(&raw, stream);
            let text = String::from_utf8_lossy(&raw);
            for expected in ["The weather in Paris", "get_weather", "call_abc123", "fp_44709d6fcb", " Lyon"] {
                assert!(
                    decoded.iter().any(|s| s == expected) || text.contains(expected),
                    "stream {stream}: {expected} in {text}"
                );
            }
            let sent_args: String = if stream {
                decoded_frames(&raw)
                    .iter()
                    .filter_map(|c| {
                        c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str().map(str::to_owned)
                    })
                    .collect()
            } else {
                let v: serde_json::Value = serde_json::from_slice(&raw).expect("JSON");
                assert_eq!(v["choices"][0]["message"]["content"], "The weather in Paris");
                let sent: Vec<&str> = v["choices"][0]["logprobs"]["content"]
                    .as_array()
                    .expect("logprobs")
                    .iter()
                    .filter_map(|e| e["token"].as_str())
                    .collect();
                assert_eq!(sent, tokens);
                assert_eq!(
                    v["choices"][0]["logprobs"]["content"][1]["bytes"],
                    serde_json::json!(" weather".as_bytes())
                );
                v["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
                    .as_str()
                    .expect("arguments")
                    .to_owned()
            };
            assert_eq!(sent_args, args, "stream {stream}");
        }
    }

    fn decoded_frames(raw: &[u8]) -> Vec<serde_json::Value> {
        let text = String::from_utf8_lossy(raw);
        text.split("\n\n")
            .filter_map(|f| f.strip_prefix("data: "))
            .filter_map(|f| serde_json::from_str(f).ok())
            .collect()
    }

    #[test]
    fn a_redact_finding_redacts_a_tool_name_and_drops_a_logprob_token() {
        let mut g = guard(1);
        let out = g.apply(BackendEvent::Delta(ChoiceDelta {
            index: 0,
            tool_calls: vec![call("call_1", "function", "lookup-rid_12345678", "{}")],
            ..Default::default()
        }));
        let BackendEvent::Delta(d) = &out[0] else { panic!("{out:?}") };
        assert_eq!(d.tool_calls[0].function.name.as_deref(), Some("lookup-[REDACTED:test-redact]"));
        let mut g = guard(1);
        let content = ChoiceDelta {
            index: 0,
            content: Some("id one".into()),
            logprobs: vec![entry("id", &["rid_12345678", "ok"]), entry("rid_87654321", &[])],
            ..Default::default()
        };
        let mut out = g.apply(BackendEvent::Delta(content));
        out.extend(g.apply(BackendEvent::Finish { index: 0, reason: "stop".into() }));
        let sent: Vec<TokenLogprob> = out
            .iter()
            .flat_map(|e| if let BackendEvent::Delta(d) = e { d.logprobs.clone() } else { Vec::new() })
            .collect();
        assert_eq!(sent.len(), 1, "the odd token's entry is dropped: {sent:?}");
        assert_eq!(sent[0].top_logprobs.iter().map(|t| t.token.as_str()).collect::<Vec<_>>(), ["ok"]);
        assert!(!g.blocked());
    }

    #[test]
    fn odd_metadata_is_normalised() {
        let mut g = guard(1);
        let out = g.apply(BackendEvent::Delta(ChoiceDelta {
            index: 0,
            role: Some("GLOBEX-CANARY".into()),
            content: Some("hi ".into()),
            ..Default::default()
        }));
        assert!(matches!(&out[0], BackendEvent::Delta(d) if d.role.as_deref() == Some("assistant")));
        let out = g.apply(BackendEvent::Finish { index: 0, reason: "tok_q8w7e6r5t4y3u2i1".into() });
        assert!(matches!(out.last(), Some(BackendEvent::Finish { reason, .. }) if reason == "stop"));
        let nan = ChoiceDelta {
            index: 0,
            content: Some("x".into()),
            logprobs: vec![TokenLogprob { token: "x".into(), logprob: f64::NAN, top_logprobs: Vec::new() }],
            ..Default::default()
        };
        let mut g = guard(1);
        let mut out = g.apply(BackendEvent::Delta(nan));
        out.extend(g.apply(BackendEvent::Finish { index: 0, reason: "stop".into() }));
        assert!(
            out.iter().all(|e| !matches!(e, BackendEvent::Delta(d) if !d.logprobs.is_empty())),
            "a NaN logprob is not sent"
        );
    }

    #[test]
    fn the_holdback_limit_is_the_configured_one() {
        // No end to the candidate: it could still grow when the pushes stop.
        let text = format!("x long_{}", "a".repeat(200));
        let stream_with = |max_holdback_bytes: usize| {
            let mut g = ResponseGuard::new(GuardSettings { max_holdback_bytes, ..settings() });
            let out: Vec<BackendEvent> = text
                .as_bytes()
                .chunks(10)
                .flat_map(|c| g.apply(text_event(std::str::from_utf8(c).unwrap_or(""))))
                .collect();
            (released(&out), g.blocked())
        };
        assert_eq!(stream_with(firewall::MAX_HOLDBACK_BYTES), ("x ".to_owned(), false), "the whole candidate waits");
        assert_eq!(stream_with(64), ("x ".to_owned(), true), "past 64 bytes the candidate is judged on what was seen");
    }

    fn text_event(s: &str) -> BackendEvent {
        text(0, s)
    }
}
