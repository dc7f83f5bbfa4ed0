//! The per-request half of a decode step: sample from the logits, detokenize, hold back
//! text that may become a stop sequence, and decide whether the request is finished.
//!
//! Shared by the one-request loop (`Engine::generate_for`) and the batching scheduler,
//! so both produce exactly the same events for the same logits.
//!
//! Invariants: one [`TokenEvent`] per sampled token; text a stop sequence covers is
//! never released; after the last token nothing more is released; a request with a
//! grammar only ever samples a token the grammar allows, and ends when its output is
//! complete.

use crate::engine::{FinishReason, GenerateRequest, Generation, TokenEvent, TopLogprob};
use crate::error::Result;
use crate::grammar::Constraint;
use crate::kv::Tenant;
use crate::sample::{GreedyRow, RowNeed, Sampled, Sampler};
use crate::stop::StopMatcher;
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// The sampling and text state of one request.
pub(crate) struct Decoding<'t> {
    tokenizer: &'t Tokenizer,
    sampler: Sampler,
    decoder: StreamDecoder<'t>,
    stops: StopMatcher,
    /// The output's grammar, when the request has one.
    constraint: Option<Constraint>,
    top_logprobs: usize,
    budget: usize,
    pub(crate) done: Generation,
}

impl<'t> Decoding<'t> {
    /// `budget`: tokens the request may still generate (checked by the caller).
    pub(crate) fn new(tokenizer: &'t Tokenizer, request: &GenerateRequest, budget: usize) -> Decoding<'t> {
        Decoding {
            tokenizer,
            sampler: Sampler::new(&request.sampling),
            decoder: tokenizer.stream_decoder(),
            stops: StopMatcher::new(&request.stop),
            constraint: request.grammar.as_ref().map(|g| g.start()),
            top_logprobs: request.top_logprobs,
            budget,
            done: Generation {
                prompt_tokens: request.prompt.len(),
                completion_tokens: 0,
                finish: FinishReason::Length,
            },
        }
    }

    /// What the next step needs of its last row of logits (see [`RowNeed`]).
    pub(crate) fn need(&self) -> RowNeed {
        if self.constraint.is_some() {
            // The grammar's mask is applied to the whole row here.
            return RowNeed::Logits;
        }
        self.sampler.need(self.top_logprobs)
    }

    /// Samples the next token, from the backend's greedy pick when it made one, else from
    /// `logits` (`[vocab]`); returns its event and whether it is the request's last. An
    /// error (the grammar cannot go on) ends the request.
    pub(crate) fn step(
        &mut self,
        logits: &[f32],
        picked: Option<&GreedyRow>,
        owners: &[Tenant],
    ) -> Result<(TokenEvent, bool)> {
        let sampled = match (&mut self.constraint, picked) {
            (Some(constraint), _) => {
                let allowed = constraint.allowed()?;
                let sampled = self.sampler.sample_allowed(logits, self.top_logprobs, |id| {
                    (id as usize) < allowed.len() && allowed.is_allowed(id)
                });
                if !self.tokenizer.is_eos(sampled.id) {
                    constraint.accept(sampled.id)?;
                }
                sampled
            }
            (None, Some(row)) => self.sampler.accept(row, self.top_logprobs),
            (None, None) => self.sampler.sample(logits, self.top_logprobs),
        };
        self.done.completion_tokens += 1;
        // A complete output ends the request now, not one forward step later with the
        // only token the grammar still allows.
        let complete = self.constraint.as_ref().is_some_and(Constraint::is_finished);
        let eos = self.tokenizer.is_eos(sampled.id) || complete;
        let delta = if self.tokenizer.is_eos(sampled.id) { String::new() } else { self.decoder.push(sampled.id) };
        let step = self.stops.push(&delta);
        let mut text = step.release;
        if step.stopped || eos {
            self.done.finish = FinishReason::Stop;
        }
        let last = step.stopped || eos || self.done.completion_tokens >= self.budget;
        if last && !step.stopped {
            let tail = self.stops.push(&self.decoder.finish());
            text.push_str(&tail.release);
            if tail.stopped {
                self.done.finish = FinishReason::Stop;
            } else {
                text.push_str(&self.stops.finish());
            }
        }
        Ok((self.event(&sampled, text, owners), last))
    }

    fn event(&self, s: &Sampled, text: String, owners: &[Tenant]) -> TokenEvent {
        let top_logprobs = s
            .top
            .iter()
            .map(|&(id, logprob)| TopLogprob {
                id,
                text: self.tokenizer.decode(&[id]).unwrap_or_default(),
                bytes: self.tokenizer.token_bytes(id),
                logprob,
            })
            .collect();
        TokenEvent { id: s.id, text, logprob: s.logprob, entropy: s.entropy, top_logprobs, owners: owners.to_vec() }
    }
}
