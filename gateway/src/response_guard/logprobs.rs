//! The logprobs channel: which `logprobs.content` entries a client may get, and in what
//! form.
//!
//! An entry is placed at the content text its token covers and leaves only once that text
//! was released. What leaves is rebuilt from the typed fields, never passed through: the
//! token, a finite logprob, the alternatives that pass (the wire `bytes` are written from
//! the token, see [`crate::api::response::LogprobContent`]). A token that spells the text
//! at its position was judged by the content's scanner; one that does not is suspicious
//! (it is a second copy of some text the client would otherwise never see) and is scanned
//! on its own: a block finding blocks the choice, any other redaction drops the entry.
//! Every `top_logprobs` token is scanned the same way (a redacted alternative is dropped).
//! An entry whose text was redacted keeps only its logprob.

use firewall::TokenSignals;

use super::fields::FieldVerdict;
use super::{Channel, ResponseGuard};
use crate::backend::{TokenLogprob, TopLogprob};

/// One entry waiting for its text to be released.
#[derive(Debug)]
pub(super) struct PendingEntry {
    /// Raw end offset, in the content channel, of the text the token covers.
    end: usize,
    entry: TokenLogprob,
    /// The token is exactly the content text at its position.
    spelled: bool,
}

/// A released entry and what the content scanner knows of its text.
enum Judged {
    /// The text it covers was redacted.
    Redacted(TokenLogprob),
    /// Released as it was; `spelled` as in [`PendingEntry`].
    Clear { entry: TokenLogprob, spelled: bool },
}

/// Places a delta's entries on its text, pushed at raw offset `start`. Each delta from the
/// engine is one token with its one entry; from an upstream, a delta's entries cover its
/// text, so the last one ends where the text ends.
pub(super) fn place(text: &str, start: usize, entries: Vec<TokenLogprob>) -> Vec<PendingEntry> {
    let count = entries.len();
    let mut offset = 0;
    entries
        .into_iter()
        .enumerate()
        .map(|(i, entry)| {
            let span = offset..offset + entry.token.len();
            let spelled = text.get(span.clone()) == Some(entry.token.as_str());
            offset = span.end.min(text.len());
            let end = if i + 1 == count { start + text.len() } else { start + offset };
            PendingEntry { end, entry, spelled }
        })
        .collect()
}

impl ResponseGuard {
    /// Entries of choice `index` whose text is now released, rebuilt for the client (none
    /// once the choice is blocked). The flag is true when one of them blocked the choice;
    /// the entries before it are still returned.
    pub(super) fn release_logprobs(&mut self, index: u32, blocked: bool) -> (Vec<TokenLogprob>, bool) {
        let mut out = Vec::new();
        for judged in self.released_entries(index, blocked) {
            let rebuilt = match judged {
                Judged::Redacted(entry) => {
                    Some(TokenLogprob { token: String::new(), logprob: entry.logprob, top_logprobs: Vec::new() })
                }
                Judged::Clear { entry, spelled } => match self.rebuild(index, entry, spelled) {
                    Ok(rebuilt) => rebuilt,
                    Err(Blocked) => return (out, true),
                },
            };
            out.extend(rebuilt.filter(|e| e.logprob.is_finite()));
        }
        (out, false)
    }

    /// Takes the pending entries whose text is released, judged against the redactions.
    fn released_entries(&mut self, index: u32, blocked: bool) -> Vec<Judged> {
        let s = self.channel(index, Channel::Content);
        if blocked {
            s.pending_logprobs.clear();
            return Vec::new();
        }
        let released_to = s.released_to();
        let mut out = Vec::new();
        let mut token_start = 0;
        while s.pending_logprobs.front().is_some_and(|p| p.end <= released_to) {
            let Some(p) = s.pending_logprobs.pop_front() else { break };
            let start = p.end.saturating_sub(p.entry.token.len()).max(token_start);
            token_start = p.end;
            if s.redacted.iter().any(|(a, b)| start < *b && *a < p.end) {
                out.push(Judged::Redacted(p.entry));
            } else {
                out.push(Judged::Clear { entry: p.entry, spelled: p.spelled });
            }
        }
        out
    }

    /// The entry as the client gets it, `None` to drop it, `Err` when it blocks the choice.
    fn rebuild(&mut self, index: u32, entry: TokenLogprob, spelled: bool) -> Result<Option<TokenLogprob>, Blocked> {
        if !spelled {
            match self.check_field(index, &entry.token) {
                FieldVerdict::Pass(_) => {}
                FieldVerdict::Redacted(_) => return Ok(None),
                FieldVerdict::Block => return Err(Blocked),
            }
        }
        let mut top_logprobs = Vec::with_capacity(entry.top_logprobs.len());
        for top in entry.top_logprobs.into_iter().filter(|t| t.logprob.is_finite()) {
            match self.check_field(index, &top.token) {
                FieldVerdict::Pass(_) => top_logprobs.push(TopLogprob { token: top.token, logprob: top.logprob }),
                FieldVerdict::Redacted(_) => {}
                FieldVerdict::Block => return Err(Blocked),
            }
        }
        Ok(Some(TokenLogprob { token: entry.token, logprob: entry.logprob, top_logprobs }))
    }
}

/// A field's scan blocked its choice.
struct Blocked;

/// The (token text, signals) of an upstream delta whose logprob entries spell its text
/// exactly; empty otherwise (the text is then scanned as plain text). The predictive
/// entropy comes from `top_logprobs` (the probability left outside them counted as one
/// more outcome, so it is a lower bound).
pub(super) fn upstream_tokens(text: &str, entries: &[TokenLogprob]) -> Vec<(String, TokenSignals)> {
    if entries.is_empty() || entries.iter().map(|e| e.token.len()).sum::<usize>() != text.len() {
        return Vec::new();
    }
    if entries.iter().map(|e| e.token.as_str()).collect::<String>() != text {
        return Vec::new();
    }
    entries
        .iter()
        .map(|entry| {
            let top: Vec<f64> = entry.top_logprobs.iter().map(|t| t.logprob.exp()).collect();
            let entropy = (!top.is_empty()).then(|| {
                let rest = (1.0 - top.iter().sum::<f64>()).max(0.0);
                top.iter().chain(std::iter::once(&rest)).filter(|p| **p > 0.0).map(|p| -p * p.ln()).sum::<f64>()
            });
            (entry.token.clone(), TokenSignals { logprob: Some(entry.logprob), entropy, owners: Vec::new() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lp(token: &str) -> TokenLogprob {
        TokenLogprob { token: token.into(), logprob: -0.1, top_logprobs: Vec::new() }
    }

    #[test]
    fn entries_are_placed_on_the_text_they_spell() {
        let placed = place("Hello world", 10, vec![lp("Hello"), lp(" wor"), lp("ld")]);
        let ends: Vec<(usize, bool)> = placed.iter().map(|p| (p.end, p.spelled)).collect();
        assert_eq!(ends, [(15, true), (19, true), (21, true)]);
        let odd = place("Hello", 0, vec![lp("Help"), lp("cg-0123456789")]);
        assert_eq!(odd.iter().map(|p| (p.end, p.spelled)).collect::<Vec<_>>(), [(4, false), (5, false)]);
    }
}
