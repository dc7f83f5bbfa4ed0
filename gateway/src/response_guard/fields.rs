//! Short fields: the strings a client receives besides the streamed text — each tool
//! call's `id`, `type` and `function.name`, logprob tokens (see [`super::logprobs`]), and
//! the response's metadata.
//!
//! Fields a client's code reads as identifiers are scanned one-shot
//! ([`firewall::Ruleset::scan_with`]) as whole strings: a block finding blocks the choice,
//! a redaction redacts. A tool call's header (`id`, `type`, `name`) is held until its
//! first `arguments` fragment or the end of the choice, so a name sent in fragments is
//! judged whole. Header text that comes after that (no honest server sends any) is held
//! to the choice's end and judged with the last judged bytes before it, so a secret
//! split across such later fragments is never partly sent. What went out at the
//! announcement stays out: a secret begun there and finished after it blocks the choice,
//! but its beginning was sent (clients expect the name whole with the first arguments). Held header text is bounded as a
//! streamed channel's is: once a field holds twice the holdback limit, what lies more
//! than the limit before its end is judged and sent, and only the last
//! `max_holdback_bytes` sent are kept to judge what follows. An upstream that streams a
//! name in a million fragments costs linear work and bounded memory; honest names never
//! come near the limit (OpenAI's are at most 64 characters).
//! Metadata passes only in a strict known format (and scanned): `system_fingerprint`
//! as `fp_` and 1 to 40 ASCII letters or digits; `role` is always `assistant`; a
//! `finish_reason` outside OpenAI's set becomes `stop`. Anything else is dropped.

use std::panic::{catch_unwind, AssertUnwindSafe};

use firewall::{Action, Finding};

use super::channel::panic_reason;
use super::ResponseGuard;
use crate::api::response::{FunctionChunk, ToolCallChunk};
use crate::config::FailMode;

/// The finish reasons OpenAI defines; any other is reported as `stop`.
const FINISH_REASONS: [&str; 5] = ["stop", "length", "tool_calls", "content_filter", "function_call"];

/// Longest `system_fingerprint` body after `fp_`.
const MAX_FINGERPRINT_CHARS: usize = 40;

/// What a short field's scan decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum FieldVerdict {
    /// The field's new text, unchanged.
    Pass(String),
    /// The field's new text with its secrets replaced by `[REDACTED:<rule-id>]`.
    Redacted(String),
    /// A block finding: the choice ends.
    Block,
}

/// One header field of a tool call: its last judged bytes and what came after them.
#[derive(Debug, Default)]
struct FieldText {
    text: String,
    /// Bytes of `text` already judged (and sent, unless blocked).
    sent: usize,
    /// The findings noted that end where the sent text ends, as (rule, start in `text`):
    /// the next fragment may lengthen one, and it is the same finding, not a new one.
    noted_at_end: Vec<(String, usize)>,
}

impl FieldText {
    /// Bytes received and not yet sent.
    fn held(&self) -> usize {
        self.text.len() - self.sent
    }

    /// Marks `text` sent up to byte `cut` and drops what lies more than `keep` bytes
    /// before that (at a character boundary, keeping at most `keep`): the context the
    /// next part is judged with.
    fn sent_to(&mut self, cut: usize, keep: usize) {
        self.sent = cut;
        let mut drop = cut.saturating_sub(keep);
        while !self.text.is_char_boundary(drop) {
            drop += 1;
        }
        self.text.drain(..drop);
        self.sent -= drop;
        self.noted_at_end.retain_mut(|(_, start)| match start.checked_sub(drop) {
            Some(moved) => {
                *start = moved;
                true
            }
            None => false,
        });
    }
}

/// A tool call's `id`, `type` and `function.name`, and whether its arguments began.
#[derive(Debug, Default)]
pub(super) struct CallHeader {
    id: FieldText,
    kind: FieldText,
    name: FieldText,
    announced: bool,
}

impl CallHeader {
    /// Takes in a fragment's header fields.
    pub(super) fn absorb(&mut self, fragment: &ToolCallChunk) {
        for (field, part) in
            [(&mut self.id, &fragment.id), (&mut self.kind, &fragment.kind), (&mut self.name, &fragment.function.name)]
        {
            if let Some(part) = part {
                field.text.push_str(part);
            }
        }
    }

    fn fields(&self) -> impl Iterator<Item = &FieldText> {
        [&self.id, &self.kind, &self.name].into_iter()
    }
}

/// When a tool call's header is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HeaderAt {
    /// A fragment of the call arrived; `arguments` when it carries some.
    Fragment { arguments: bool },
    /// The choice ends.
    ChoiceEnd,
}

impl ResponseGuard {
    /// Scans a short field one-shot, whole; its findings are recorded for choice `index`.
    pub(super) fn check_field(&mut self, index: u32, text: &str) -> FieldVerdict {
        self.judge_field(index, text, (0, text.len()), &mut Vec::new()).0
    }

    /// Scans `text` one-shot and judges its part from byte `from` (what came before was
    /// judged earlier) to about byte `upto`: the part ends after every finding that starts
    /// in it, so a finding is judged, recorded and redacted whole, once. Returns the verdict
    /// on that part and where it ends. `noted_at_end` holds the findings noted before that
    /// ended at `from` (a match the new text lengthens is not noted again), and is left
    /// holding those noted now that end at the part's end.
    fn judge_field(
        &mut self,
        index: u32,
        text: &str,
        (from, upto): (usize, usize),
        noted_at_end: &mut Vec<(String, usize)>,
    ) -> (FieldVerdict, usize) {
        let s = &self.settings;
        let scanned = catch_unwind(AssertUnwindSafe(|| s.rules.scan_with(text, &s.ctx, &s.detectors)));
        let mut findings: Vec<Finding> = match scanned {
            Ok(findings) => findings.into_iter().filter(|f| span(f).1 > from).collect(),
            Err(panic) => {
                let verdict = match self.fail(panic_reason(panic.as_ref())) {
                    FailMode::Closed => FieldVerdict::Block,
                    FailMode::Open => FieldVerdict::Pass(text.get(from..upto).unwrap_or_default().to_owned()),
                };
                return (verdict, upto);
            }
        };
        // By start: a finding that starts before the cut moves it to its end, and once one
        // starts at or past the cut, every later one does too.
        let mut extents: Vec<(usize, usize)> = findings.iter().map(span).collect();
        extents.sort_unstable();
        let mut cut = upto;
        for (start, end) in extents {
            if start >= cut {
                break;
            }
            cut = cut.max(end);
        }
        findings.retain(|f| span(f).0 < cut);
        let action = findings.iter().map(|f| f.action).max().unwrap_or(Action::Allow);
        let spans: Vec<(usize, usize, String)> = findings
            .iter()
            .filter(|f| f.action == Action::Redact)
            .map(|f| (f.start.max(from), f.end, f.rule_id.clone()))
            .collect();
        let before = std::mem::take(noted_at_end);
        for finding in findings {
            let (start, end) = span(&finding);
            if end == cut {
                noted_at_end.push((finding.rule_id.clone(), start));
            }
            let lengthened = start < from && before.iter().any(|(rule, at)| *at == start && *rule == finding.rule_id);
            if !lengthened {
                self.note(index, finding);
            }
        }
        // Findings end on character boundaries; were one not to, nothing is sent.
        let Some(part) = text.get(..cut) else { return (FieldVerdict::Block, cut) };
        let verdict = match action {
            Action::Block => FieldVerdict::Block,
            Action::Redact => FieldVerdict::Redacted(redact(part, from, &spans)),
            Action::Allow | Action::Log => FieldVerdict::Pass(part.get(from..).unwrap_or_default().to_owned()),
        };
        (verdict, cut)
    }

    /// The header text of tool call `call` of choice `index` that may go out now; `None`
    /// when it blocked the choice. All of it goes at the call's first `arguments` fragment
    /// and at the choice's end; between those, a field's text is held, and only what lies
    /// more than the holdback before its end goes, once twice the holdback is held.
    pub(super) fn release_header(&mut self, index: u32, call: u32, at: HeaderAt) -> Option<ToolCallChunk> {
        let mut header = self.calls.remove(&(index, call)).unwrap_or_default();
        let holdback = self.settings.max_holdback_bytes;
        let whole = match at {
            HeaderAt::Fragment { arguments } => {
                let first = arguments && !header.announced;
                header.announced |= arguments;
                first
            }
            HeaderAt::ChoiceEnd => true,
        };
        let mut out = ToolCallChunk { index: call, id: None, kind: None, function: FunctionChunk::default() };
        for (field, slot) in [
            (&mut header.id, &mut out.id),
            (&mut header.kind, &mut out.kind),
            (&mut header.name, &mut out.function.name),
        ] {
            let upto = match field.held() {
                0 => continue,
                _ if whole => field.text.len(),
                held if held > 2 * holdback => floor_char(&field.text, field.text.len() - holdback),
                _ => continue,
            };
            match self.judge_field(index, &field.text, (field.sent, upto), &mut field.noted_at_end) {
                (FieldVerdict::Pass(text) | FieldVerdict::Redacted(text), cut) => {
                    *slot = Some(text);
                    field.sent_to(cut, holdback);
                }
                (FieldVerdict::Block, _) => return None,
            }
        }
        self.calls.insert((index, call), header);
        Some(out)
    }

    /// The `system_fingerprint` a client may see: only a strictly formatted one that no
    /// rule objects to.
    pub fn release_fingerprint(&mut self, fingerprint: Option<String>) -> Option<String> {
        let fingerprint = fingerprint.filter(|f| is_fingerprint(f))?;
        match self.check_field(0, &fingerprint) {
            FieldVerdict::Pass(f) => Some(f),
            FieldVerdict::Redacted(_) | FieldVerdict::Block => None,
        }
    }

    /// The tool calls of choice `index` whose header has text not yet sent.
    pub(super) fn calls_holding_text(&self, index: u32) -> Vec<u32> {
        self.calls
            .iter()
            .filter(|((c, _), h)| *c == index && h.fields().any(|f| f.held() > 0))
            .map(|((_, call), _)| *call)
            .collect()
    }
}

/// `^fp_[A-Za-z0-9]{1,40}$`
fn is_fingerprint(text: &str) -> bool {
    text.strip_prefix("fp_").is_some_and(|body| {
        (1..=MAX_FINGERPRINT_CHARS).contains(&body.len()) && body.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// A backend's finish reason, as the client gets it.
pub(super) fn finish_reason(reason: String) -> String {
    if FINISH_REASONS.contains(&reason.as_str()) {
        reason
    } else {
        "stop".to_owned()
    }
}

/// A finding's whole extent: its match and its secret.
fn span(f: &Finding) -> (usize, usize) {
    (f.start.min(f.match_start), f.end.max(f.match_end))
}

/// The largest character boundary of `text` at or before `at`.
fn floor_char(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// `text[from..]` with each span (absolute, sorted by start) replaced by its marker.
fn redact(text: &str, from: usize, spans: &[(usize, usize, String)]) -> String {
    let mut out = String::new();
    let mut at = from;
    for (start, end, rule) in spans {
        if *end <= at {
            continue;
        }
        out.push_str(text.get(at..(*start).max(at)).unwrap_or_default());
        out.push_str("[REDACTED:");
        out.push_str(rule);
        out.push(']');
        at = *end;
    }
    out.push_str(text.get(at..).unwrap_or_default());
    out
}

#[cfg(test)]
mod tests {
    use super::super::tests::settings;
    use super::super::{BackendEvent, GuardSettings};
    use super::*;
    use crate::backend::ChoiceDelta;

    const HOLDBACK: usize = 256;

    /// The guard's test rules (`test-token` blocks, `test-redact` and `test-grow` redact),
    /// with a small holdback.
    fn guard() -> ResponseGuard {
        ResponseGuard::new(GuardSettings { max_holdback_bytes: HOLDBACK, ..settings() })
    }

    fn fragment(name: &str, arguments: Option<&str>) -> BackendEvent {
        BackendEvent::Delta(ChoiceDelta {
            index: 0,
            tool_calls: vec![ToolCallChunk {
                index: 0,
                id: None,
                kind: None,
                function: FunctionChunk { name: Some(name.into()), arguments: arguments.map(str::to_owned) },
            }],
            ..Default::default()
        })
    }

    /// Streams `pieces` as one tool call's name (announced by an `arguments` fragment
    /// first, or never) and returns the name the client received, whether the choice was
    /// blocked, and the most header bytes the guard held at once.
    fn stream_name(pieces: &[String], announced: bool) -> (String, bool, usize) {
        let mut g = guard();
        let mut out = Vec::new();
        if announced {
            out.extend(g.apply(fragment("", Some(""))));
        }
        let mut most_held = 0;
        for piece in pieces {
            out.extend(g.apply(fragment(piece, None)));
            let held = g.calls.values().flat_map(|h| h.fields()).map(|f| f.text.len()).sum::<usize>();
            most_held = most_held.max(held);
        }
        out.extend(g.apply(BackendEvent::Finish { index: 0, reason: "tool_calls".into() }));
        let name = out
            .iter()
            .flat_map(|e| match e {
                BackendEvent::Delta(d) => d.tool_calls.iter().filter_map(|c| c.function.name.clone()).collect(),
                _ => Vec::new(),
            })
            .collect();
        (name, g.blocked(), most_held)
    }

    #[test]
    fn a_name_in_many_fragments_is_held_within_the_holdback_and_arrives_whole() {
        let pieces: Vec<String> = (0..5_000).map(|i| format!("part{:05}_", i)).collect();
        for announced in [true, false] {
            let (name, blocked, most_held) = stream_name(&pieces, announced);
            assert_eq!(name, pieces.concat(), "announced {announced}");
            assert!(!blocked);
            assert!(most_held <= 3 * (HOLDBACK + pieces[0].len()), "announced {announced}: held {most_held}");
        }
    }

    #[test]
    fn a_secret_split_across_fragments_deep_in_a_long_name_is_blocked() {
        let secret = "tok_q8w7e6r5t4y3u2i1";
        for announced in [true, false] {
            for (lead, split) in [0, 37, 85, 150].into_iter().flat_map(|lead| (1..20).map(move |split| (lead, split))) {
                let mut pieces: Vec<String> = (0..2_000 + lead).map(|i| format!("p{:04}.", i)).collect();
                pieces.push(format!("x {}", &secret[..split]));
                pieces.push(format!("{} y", &secret[split..]));
                pieces.extend((0..10).map(|i| format!("q{i}.")));
                let (name, blocked, _) = stream_name(&pieces, announced);
                assert!(blocked, "announced {announced}, lead {lead}, split {split}");
                assert!(!name.contains(&secret[..8]), "announced {announced}, lead {lead}, split {split}");
            }
        }
    }

    #[test]
    fn a_redaction_across_the_point_a_long_name_is_sent_to_is_made_once_whole() {
        let text = "ab rid_12345678 ".repeat(1_000);
        let pieces: Vec<String> = text.as_bytes().chunks(7).map(|c| String::from_utf8_lossy(c).into_owned()).collect();
        for announced in [true, false] {
            let (name, blocked, _) = stream_name(&pieces, announced);
            assert_eq!(name, "ab [REDACTED:test-redact] ".repeat(1_000), "announced {announced}");
            assert!(!blocked);
        }
    }

    #[test]
    fn a_match_the_next_fragment_lengthens_is_one_finding() {
        let mut g = guard();
        let mut out = g.apply(fragment("a grow_12345678", Some("")));
        out.extend(g.apply(fragment("9999 b", None)));
        out.extend(g.apply(BackendEvent::Finish { index: 0, reason: "tool_calls".into() }));
        let name: Vec<String> = out
            .iter()
            .flat_map(|e| match e {
                BackendEvent::Delta(d) => d.tool_calls.iter().filter_map(|c| c.function.name.clone()).collect(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(name, ["a [REDACTED:test-grow]", "[REDACTED:test-grow] b"], "no digit of it is sent");
        assert_eq!(g.findings().len(), 1, "{:?}", g.findings());
    }

    #[test]
    fn only_sent_bytes_are_dropped_and_never_inside_a_character() {
        let mut field =
            FieldText { text: "ééééé".into(), sent: 0, noted_at_end: vec![("r".into(), 6), ("r".into(), 2)] };
        field.sent_to(8, 3);
        assert_eq!((field.text.as_str(), field.sent), ("éé", 2));
        assert_eq!(field.noted_at_end, [("r".to_owned(), 0)], "starts move with the text; dropped ones go");
        field.text.push_str("ab");
        assert_eq!(field.held(), 4);
        field.sent_to(field.text.len(), 100);
        assert_eq!((field.text.as_str(), field.held()), ("ééab", 0));
    }

    #[test]
    fn fingerprints_pass_only_in_their_format() {
        assert!(is_fingerprint("fp_44709d6fcb") && is_fingerprint(&format!("fp_{}", "a".repeat(40))));
        for bad in
            ["fp_", "fp_a-b", "cg-0123456789abcdef", "fp_ghp_x", "FP_abc", &format!("fp_{}", "a".repeat(41)), "fp_é"]
        {
            assert!(!is_fingerprint(bad), "{bad}");
        }
    }

    #[test]
    fn finish_reasons_outside_the_set_are_stop() {
        assert_eq!(finish_reason("tool_calls".into()), "tool_calls");
        assert_eq!(finish_reason("cg-0123456789abcdef".into()), "stop");
    }

    #[test]
    fn redaction_replaces_only_the_new_part() {
        let spans = [(4, 8, "r".to_owned())];
        assert_eq!(redact("abc rid_ xyz", 0, &spans), "abc [REDACTED:r] xyz");
        assert_eq!(redact("abc rid_ xyz", 6, &[(6, 8, "r".to_owned())]), "[REDACTED:r] xyz");
    }
}
