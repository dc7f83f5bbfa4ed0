//! A request's way from the engine's serving loop ([`engine::serve()`]) to its client: each
//! choice's tokens become [`BackendEvent`]s on the request's own bounded channel
//! ([`StreamLimits::channel`]), with tool calls read out of the text, logprobs and the
//! firewall's token signals attached, then a finish per choice and the request's usage.
//!
//! Invariants: what the channel cannot take waits in the `Outbox`, at most one event per
//! choice plus its finish (and the text a tool-call reader held back) and the request's
//! usage, because the loop pauses the request as soon as anything waits; the loop resumes it
//! once the client has read enough. A channel slot is kept free for the error that ends a
//! stream (stalled, engine failure), so that it always fits, even into a channel the client
//! stopped reading. A closed channel is a client gone: the loop cancels the request.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::Mutex;
use std::time::Duration;

use engine::{FinishReason, Generation, ServeClient, ServeFailure, ServeGauges, StepStats, TokenEvent};
use firewall::TokenSignals;
use tokio::sync::mpsc;

use super::engine::{logprob_entry, map_engine_error, PendingOwners};
use super::tool_calls::CallStream;
use super::{BackendEvent, ChoiceDelta};
use crate::api::Usage;
use crate::error::ApiError;
use crate::metrics::Histogram;

/// One event for a request's client.
pub type Event = Result<BackendEvent, ApiError>;

/// Where a request's events go.
pub type EventSender = mpsc::Sender<Event>;

/// Where a request's client reads its events.
pub type EventReceiver = mpsc::Receiver<Event>;

/// Channel slots kept free for the error that ends a stream (stalled, engine failure), so
/// that it always fits, even into a channel the client stopped reading.
const ERROR_SLOTS: usize = 1;

/// How far a request's events may run ahead of its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Events a request's channel holds before its sequences pause.
    pub buffer_events: usize,
    /// How long a request may stay paused before it is cancelled.
    pub stall: Duration,
}

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits { buffer_events: 256, stall: Duration::from_secs(30) }
    }
}

impl StreamLimits {
    /// A new request's event channel.
    pub fn channel(&self) -> (EventSender, EventReceiver) {
        mpsc::channel(self.buffer_events.max(1) + ERROR_SLOTS)
    }
}

/// What the serving loop of one model reports, for `/metrics`.
#[derive(Debug, Default)]
pub struct LoopGauges {
    pub serve: ServeGauges,
    pub step_durations: Mutex<StepDurations>,
}

/// Durations of the batched steps, by whether any sequence decoded in them.
#[derive(Debug, Default)]
pub struct StepDurations {
    pub decode: Histogram,
    pub prefill: Histogram,
}

impl LoopGauges {
    pub fn observe_step(&self, step: StepStats) {
        let mut d = self.step_durations.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let h = if step.decode_tokens > 0 { &mut d.decode } else { &mut d.prefill };
        h.observe(step.elapsed.as_secs_f64());
    }
}

/// The client's channel has closed: nobody reads this request any more.
#[derive(Debug)]
struct Gone;

/// A request's way to its client: the bounded channel, and the events that did not fit.
struct Outbox {
    tx: EventSender,
    /// Events made while the channel was full, oldest first. Small: the loop pauses the
    /// request as soon as this is not empty.
    backlog: VecDeque<Event>,
}

impl Outbox {
    fn new(tx: EventSender) -> Outbox {
        Outbox { tx, backlog: VecDeque::new() }
    }

    /// Sends `event` after any held back, or holds it back while the channel is full.
    fn send(&mut self, event: Event) -> Result<(), Gone> {
        if self.tx.is_closed() {
            return Err(Gone);
        }
        self.backlog.push_back(event);
        self.flush();
        Ok(())
    }

    /// Moves held-back events into the channel while it has room (short of the error
    /// slots); `true` when nothing is held back any more.
    fn flush(&mut self) -> bool {
        while self.tx.capacity() > ERROR_SLOTS {
            let Some(event) = self.backlog.pop_front() else { break };
            match self.tx.try_send(event) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(event)) => {
                    self.backlog.push_front(event);
                    break;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => self.backlog.clear(),
            }
        }
        self.backlog.is_empty()
    }

    /// Ends the stream with `error`, in the slot kept for it; what was held back is
    /// dropped (the stream ends at the error anyway).
    fn fail(&mut self, error: ApiError) {
        self.backlog.clear();
        let _ = self.tx.try_send(Err(error));
    }
}

/// One request's client, as the serving loop sees it.
pub struct EngineClient {
    outbox: Outbox,
    usage: Usage,
    want_logprobs: bool,
    /// Per choice: when the output is read for tool calls, and the owners of tokens not
    /// yet sent (they wait for the next delta, so a foreign owner is never dropped).
    choices: Vec<Choice>,
}

struct Choice {
    calls: Option<CallStream>,
    owners: PendingOwners,
}

impl EngineClient {
    /// A client of `choices` choices sending to `events`; `read_calls` reads each choice's
    /// output for tool calls ([`CallStream`]).
    pub fn new(events: EventSender, choices: usize, want_logprobs: bool, read_calls: bool) -> EngineClient {
        let choices = (0..choices)
            .map(|_| Choice { calls: read_calls.then(CallStream::new), owners: PendingOwners::default() })
            .collect();
        EngineClient { outbox: Outbox::new(events), usage: Usage::default(), want_logprobs, choices }
    }
}

impl ServeClient for EngineClient {
    fn token(&mut self, index: u32, ev: &TokenEvent) -> ControlFlow<()> {
        let Some(choice) = self.choices.get_mut(index as usize) else { return ControlFlow::Break(()) };
        choice.owners.add(ev);
        let (content, tool_calls) = match choice.calls.as_mut() {
            Some(calls) => {
                let out = calls.push(&ev.text);
                (out.content, out.tool_calls)
            }
            None => (Some(ev.text.clone()), Vec::new()),
        };
        if content.as_deref().is_none_or(str::is_empty) && tool_calls.is_empty() && !self.want_logprobs {
            // Nothing to send yet (part of a UTF-8 sequence, or text that may start a tool
            // call): the owners wait for the next delta, so a foreign owner is never dropped.
            return if self.outbox.tx.is_closed() { ControlFlow::Break(()) } else { ControlFlow::Continue(()) };
        }
        let delta = ChoiceDelta {
            index,
            content,
            tool_calls,
            logprobs: if self.want_logprobs { vec![logprob_entry(ev)] } else { Vec::new() },
            signals: Some(TokenSignals {
                logprob: Some(f64::from(ev.logprob)),
                entropy: Some(f64::from(ev.entropy)),
                owners: choice.owners.take(),
            }),
            ..ChoiceDelta::default()
        };
        match self.outbox.send(Ok(BackendEvent::Delta(delta))) {
            Ok(()) => ControlFlow::Continue(()),
            Err(Gone) => ControlFlow::Break(()),
        }
    }

    fn finished(&mut self, index: u32, generation: &Generation, last: bool) {
        self.usage.prompt_tokens = generation.prompt_tokens as u64;
        self.usage.completion_tokens += generation.completion_tokens as u64;
        // The loop reports no cancelled choice as finished: it is stopped or at its length.
        let mut reason = if generation.finish == FinishReason::Length { "length" } else { "stop" };
        if let Some(calls) = self.choices.get_mut(index as usize).and_then(|c| c.calls.as_mut()) {
            let rest = calls.finish();
            if calls.called() && reason == "stop" {
                reason = "tool_calls";
            }
            if rest.content.is_some() || !rest.tool_calls.is_empty() {
                let delta =
                    ChoiceDelta { index, content: rest.content, tool_calls: rest.tool_calls, ..ChoiceDelta::default() };
                let _ = self.outbox.send(Ok(BackendEvent::Delta(delta)));
            }
        }
        // A client that left is noticed by the loop; nothing to do here.
        let _ = self.outbox.send(Ok(BackendEvent::Finish { index, reason: reason.to_owned() }));
        if last {
            let mut usage = self.usage;
            usage.total_tokens = usage.prompt_tokens + usage.completion_tokens;
            let _ = self.outbox.send(Ok(BackendEvent::Usage(usage)));
        }
    }

    fn fail(&mut self, failure: ServeFailure<'_>) {
        self.outbox.fail(match failure {
            ServeFailure::Engine(e) => map_engine_error(e),
            ServeFailure::Stalled { stall_ms } => ApiError::StreamStalled { stall_ms },
        });
    }

    fn flush(&mut self) -> bool {
        self.outbox.flush()
    }

    fn is_gone(&self) -> bool {
        self.outbox.tx.is_closed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delta(i: u32) -> Event {
        Ok(BackendEvent::Finish { index: i, reason: "stop".into() })
    }

    fn outbox(buffer_events: usize) -> (Outbox, EventReceiver) {
        let (tx, rx) = StreamLimits { buffer_events, stall: Duration::from_secs(1) }.channel();
        (Outbox::new(tx), rx)
    }

    #[test]
    fn a_full_channel_holds_back_and_reading_passes_on_in_order() {
        let (mut o, mut rx) = outbox(2);
        for i in 0..3 {
            o.send(delta(i)).unwrap();
        }
        assert_eq!(o.backlog.len(), 1, "the third event waits beyond the bound");
        assert!(!o.flush(), "still full: held back");
        assert_eq!(rx.try_recv().unwrap().unwrap(), delta(0).unwrap());
        assert!(o.flush());
        let rest: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok()).map(Result::unwrap).collect();
        assert_eq!(rest, [delta(1).unwrap(), delta(2).unwrap()], "nothing lost, nothing reordered");
    }

    #[test]
    fn the_error_that_ends_a_stalled_stream_still_fits() {
        let (mut o, mut rx) = outbox(1);
        o.send(delta(0)).unwrap();
        o.send(delta(1)).unwrap();
        assert!(!o.flush());
        o.fail(ApiError::StreamStalled { stall_ms: 50 });
        assert!(rx.try_recv().unwrap().is_ok());
        assert!(
            matches!(rx.try_recv(), Ok(Err(ApiError::StreamStalled { stall_ms: 50 }))),
            "the error used the kept slot"
        );
    }

    #[test]
    fn a_closed_channel_is_a_client_gone() {
        let (tx, rx) = StreamLimits::default().channel();
        let mut client = EngineClient::new(tx, 1, false, false);
        assert!(!client.is_gone());
        drop(rx);
        assert!(client.is_gone());
        assert!(client.outbox.send(delta(2)).is_err());
    }
}
