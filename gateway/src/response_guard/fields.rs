//! Short fields: the strings a client receives besides the streamed text — each tool
//! call's `id`, `type` and `function.name`, logprob tokens (see [`super::logprobs`]), and
//! the response's metadata.
//!
//! Fields a client's code reads as identifiers are scanned one-shot
//! ([`firewall::Ruleset::scan_with`]) as whole strings: a block finding blocks the choice,
//! a redaction redacts. A tool call's header (`id`, `type`, `name`) is held until its
//! first `arguments` fragment or the end of the choice, so a name sent in fragments is
//! judged whole; a fragment after that is judged with all that came before it.
//! Metadata passes only in a strict known format (and scanned): `system_fingerprint`
//! as `fp_` and 1 to 40 ASCII letters or digits; `role` is always `assistant`; a
//! `finish_reason` outside OpenAI's set becomes `stop`. Anything else is dropped.

use std::panic::{catch_unwind, AssertUnwindSafe};

use firewall::{Action, Finding};

use super::channel::panic_reason;
use super::{ChoiceFinding, ResponseGuard};
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

/// One header field of a tool call, as received so far.
#[derive(Debug, Default)]
struct FieldText {
    text: String,
    /// Bytes of `text` already judged (and sent, unless blocked).
    sent: usize,
}

/// A tool call's `id`, `type` and `function.name`, held until announced.
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
}

impl ResponseGuard {
    /// Scans `text` one-shot and judges the part from byte `from` on (what came before was
    /// judged earlier). Findings that reach into that part are recorded for choice `index`.
    pub(super) fn check_field(&mut self, index: u32, text: &str, from: usize) -> FieldVerdict {
        let fresh = text.get(from..).unwrap_or_default();
        let s = &self.settings;
        let scanned = catch_unwind(AssertUnwindSafe(|| s.rules.scan_with(text, &s.ctx, &s.detectors)));
        let findings: Vec<Finding> = match scanned {
            Ok(findings) => findings.into_iter().filter(|f| f.end > from || f.match_end > from).collect(),
            Err(panic) => {
                return match self.fail(panic_reason(panic.as_ref())) {
                    FailMode::Closed => FieldVerdict::Block,
                    FailMode::Open => FieldVerdict::Pass(fresh.to_owned()),
                }
            }
        };
        let action = findings.iter().map(|f| f.action).max().unwrap_or(Action::Allow);
        let spans: Vec<(usize, usize, String)> = findings
            .iter()
            .filter(|f| f.action == Action::Redact)
            .map(|f| (f.start.max(from), f.end, f.rule_id.clone()))
            .collect();
        self.findings.extend(findings.into_iter().map(|finding| ChoiceFinding { choice: index, finding }));
        match action {
            Action::Block => FieldVerdict::Block,
            Action::Redact => FieldVerdict::Redacted(redact(text, from, &spans)),
            Action::Allow | Action::Log => FieldVerdict::Pass(fresh.to_owned()),
        }
    }

    /// The header fields of tool call `call` of choice `index` that may go out now (all
    /// of them once `announce` is set or the call was announced before); `None` when one
    /// of them blocked the choice.
    pub(super) fn release_header(&mut self, index: u32, call: u32, announce: bool) -> Option<ToolCallChunk> {
        let mut header = self.calls.remove(&(index, call)).unwrap_or_default();
        header.announced |= announce;
        let mut out = ToolCallChunk { index: call, id: None, kind: None, function: FunctionChunk::default() };
        if header.announced {
            for (field, slot) in [
                (&mut header.id, &mut out.id),
                (&mut header.kind, &mut out.kind),
                (&mut header.name, &mut out.function.name),
            ] {
                if field.text.len() == field.sent {
                    continue;
                }
                match self.check_field(index, &field.text, field.sent) {
                    FieldVerdict::Pass(text) | FieldVerdict::Redacted(text) => *slot = Some(text),
                    FieldVerdict::Block => return None,
                }
                field.sent = field.text.len();
            }
        }
        self.calls.insert((index, call), header);
        Some(out)
    }

    /// The `system_fingerprint` a client may see: only a strictly formatted one that no
    /// rule objects to.
    pub fn release_fingerprint(&mut self, fingerprint: Option<String>) -> Option<String> {
        let fingerprint = fingerprint.filter(|f| is_fingerprint(f))?;
        match self.check_field(0, &fingerprint, 0) {
            FieldVerdict::Pass(f) => Some(f),
            FieldVerdict::Redacted(_) | FieldVerdict::Block => None,
        }
    }

    /// Whether choice `index` has tool calls whose header was never announced.
    pub(super) fn unannounced_calls(&self, index: u32) -> Vec<u32> {
        self.calls.iter().filter(|((c, _), h)| *c == index && !h.announced).map(|((_, call), _)| *call).collect()
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
    use super::*;

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
