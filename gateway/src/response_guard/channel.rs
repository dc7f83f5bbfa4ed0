//! One streamed channel of one choice (its content, its refusal, or one tool call's
//! `arguments`): the [`StreamScanner`] that judges it, what was pushed but not yet
//! released, and the content's logprob entries waiting for their text.
//!
//! Every scanner the gateway streams text through is built here, by [`text_scanner`] or
//! [`arguments_scanner`], with the configured holdback limit. This module contains a
//! scanner's failure (a panic) and reports it; what a failure means for the response (fail
//! closed or open) is decided by the guard, not here.
//!
//! Invariant: `held` is exactly the raw text pushed and not yet released, so a channel that
//! fails open can release what it owed, and nothing twice.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};

use firewall::{Action, Step, StreamScanner};

use super::logprobs::PendingEntry;
use super::GuardSettings;

/// Most released text kept for fingerprinting the response (the rest is not recorded).
const MAX_RECORDED_BYTES: usize = 1 << 20;

/// Which text of a choice a scanner watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Channel {
    Content,
    Refusal,
    ToolArguments(u32),
}

/// The scanner for a choice's content or refusal.
fn text_scanner(settings: &GuardSettings) -> StreamScanner {
    StreamScanner::new(settings.rules.clone(), settings.ctx.clone(), settings.detectors.clone())
        .with_max_holdback(settings.max_holdback_bytes)
}

/// The scanner for one tool call's `arguments` (JSON text): judged as the JSON strings the
/// tool will read (`\u0067hp_...` spelled out), while the raw JSON is what is released.
fn arguments_scanner(settings: &GuardSettings) -> StreamScanner {
    text_scanner(settings).decode_json_strings()
}

/// One scanned channel.
pub(super) struct ChannelScan {
    scanner: StreamScanner,
    /// Raw bytes pushed so far.
    pub(super) pushed: usize,
    /// Content only: logprob entries in order, each waiting for its text to be released.
    pub(super) pending_logprobs: VecDeque<PendingEntry>,
    /// Raw spans redacted so far.
    pub(super) redacted: Vec<(usize, usize)>,
    /// Raw text pushed but not yet released (what a fail-open channel still owes).
    held: String,
    /// The scanner failed and the tenant fails open: text passes unscanned.
    bypass: bool,
    /// What was released, for the provenance index (capped).
    pub(super) released: String,
}

impl ChannelScan {
    pub(super) fn new(settings: &GuardSettings, channel: Channel) -> ChannelScan {
        let scanner = match channel {
            Channel::Content | Channel::Refusal => text_scanner(settings),
            Channel::ToolArguments(_) => arguments_scanner(settings),
        };
        ChannelScan {
            scanner,
            pushed: 0,
            pending_logprobs: VecDeque::new(),
            redacted: Vec::new(),
            held: String::new(),
            bypass: false,
            released: String::new(),
        }
    }

    /// Raw offset up to which text has been released.
    pub(super) fn released_to(&self) -> usize {
        self.pushed - self.scanner.held_bytes()
    }

    pub(super) fn observations(&self) -> firewall::Observations {
        self.scanner.observations()
    }

    /// Runs one scanner call on `text` (already counted in `pushed`). `Err` carries the
    /// reason when the scanner failed; the text it held is kept for [`Self::bypass`].
    pub(super) fn scan(&mut self, text: &str, call: impl FnOnce(&mut StreamScanner) -> Step) -> Result<Step, String> {
        if self.bypass {
            return Ok(Step { release: text.to_owned(), findings: Vec::new(), action: Action::Log });
        }
        self.held.push_str(text);
        match catch_unwind(AssertUnwindSafe(|| call(&mut self.scanner))) {
            Ok(step) => {
                let held = self.scanner.held_bytes().min(self.held.len());
                let cut = self.held.len() - held;
                // `held_bytes` counts raw bytes at the end: always a char boundary of the
                // pushed text; if it is not, keep everything (never a broken string).
                if self.held.is_char_boundary(cut) {
                    self.held.drain(..cut);
                }
                Ok(step)
            }
            Err(panic) => Err(panic_reason(panic.as_ref())),
        }
    }

    /// From now on text passes unscanned; returns what the channel held at the failure.
    pub(super) fn bypass(&mut self) -> String {
        self.bypass = true;
        std::mem::take(&mut self.held)
    }

    /// Keeps `text` for the provenance index, up to the cap.
    pub(super) fn record(&mut self, text: &str) {
        if self.released.len() + text.len() <= MAX_RECORDED_BYTES {
            self.released.push_str(text);
        }
    }
}

/// A panic's message, for the log.
pub(super) fn panic_reason(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|m| (*m).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}
