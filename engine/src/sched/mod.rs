//! Continuous batching: many requests share each forward step.
//!
//! Owns the queue of waiting requests, the running batch, and the choice of what each
//! step computes. Every step: admit waiting requests (fair across tenants: the tenant
//! with the fewest running sequences goes first), give each running sequence its tokens
//! within the step's token budget (decode tokens first, then prefill chunks), run them as
//! one batch (`Engine::forward_batch`: the CPU model's or the GPU's), then sample, emit events and retire finished
//! requests. Requests join and leave the batch at any step.
//!
//! When the KV pool runs out, the oldest sequence that could not grow keeps its place
//! and retries; the younger ones that could not grow are preempted: their blocks are
//! released (zero-filled) and they wait at the head of the queue to be recomputed
//! (prompt plus the tokens generated so far), sampling state kept, so their output is
//! unchanged. Nobody is admitted until a step fits again, so the oldest always
//! progresses. A sequence alone in the batch that still does not fit fails.
//!
//! While sequences are decoding, a step's prefill is also held to what fits the
//! inter-token latency target (`itl_target`), by an online model of step cost
//! ([`cost::StepCost`]): a long prompt joining the batch is chunked over several steps
//! instead of stalling every decoding stream for one long step. At least
//! [`MIN_PREFILL_TOKENS`] prefill tokens run per step, so waiting prompts always progress.
//!
//! A request can be paused ([`Scheduler::set_paused`]: its consumer is not keeping up):
//! its sequence keeps its place and its KV blocks but gets no tokens in any step, and it
//! does not count against `max_running`, so it costs the others nothing but memory. When
//! resumed it continues exactly where it stopped. [`Scheduler::cancel`] ends a request at
//! once, wherever it is, releasing (zero-filling) its blocks before it returns.
//!
//! Invariants: `submit` refuses a request while `max_queued` wait (preempted requests
//! re-queue regardless: they were admitted once); a step processes
//! at most `step_tokens` tokens (at least one unpaused sequence always progresses); one
//! event per generated token, exactly as `Engine::generate_for` would produce it, paused
//! or not; a paused request emits nothing.

pub mod cost;
pub(crate) mod decoding;

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use crate::engine::{Engine, FinishReason, GenerateRequest, Generation, TokenEvent};
use crate::error::{Error, Result};
use crate::kv::{Owner, SequenceKv};
use crate::model::{Scratch, Segment};
use crate::sample::{GreedyRow, RowNeed};
use cost::StepCost;
use decoding::Decoding;

/// Prefill tokens a step runs even when decoding alone fills the latency target.
pub const MIN_PREFILL_TOKENS: usize = 16;

/// Receives a request's events; `Break` cancels the request.
pub type Sink<'s> = Box<dyn FnMut(&TokenEvent) -> ControlFlow<()> + 's>;

/// Identifies a submitted request.
pub type JobId = u64;

/// Limits of the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Tokens one step may process, decode and prefill together.
    pub step_tokens: usize,
    /// Sequences in the running batch at once.
    pub max_running: usize,
    /// Requests waiting to start; `submit` refuses more.
    pub max_queued: usize,
    /// While sequences are decoding, chunk prefill so that a step (one token for each of
    /// them) takes about this long; `None` runs prefill up to `step_tokens` regardless.
    pub itl_target: Option<Duration>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            step_tokens: 512,
            max_running: 16,
            max_queued: 64,
            itl_target: Some(Duration::from_millis(80)),
        }
    }
}

/// What one step computed and how long it took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepStats {
    /// Sequences that each fed one token (their last sampled one).
    pub decode_tokens: usize,
    /// Prompt (or recompute) tokens fed.
    pub prefill_tokens: usize,
    /// Wall time of the batched forward pass and sampling.
    pub elapsed: Duration,
}

/// A request and where its events go.
struct Job<'s> {
    id: JobId,
    owner: Owner,
    request: GenerateRequest,
    sink: Sink<'s>,
    /// Skipped by every step until resumed (see [`Scheduler::set_paused`]).
    paused: bool,
}

/// A request waiting to (re)start; `resume` is the state of a preempted one.
struct Waiting<'e, 's> {
    job: Job<'s>,
    budget: usize,
    resume: Option<(Decoding<'e>, Vec<u32>)>,
}

/// A request in the running batch.
struct Running<'e, 's> {
    job: Job<'s>,
    budget: usize,
    kv: SequenceKv<'e>,
    decoding: Decoding<'e>,
    /// Tokens not yet in the cache: the prompt's rest, or the last sampled token.
    feed: Vec<u32>,
    /// Tokens generated so far (recomputed after a preemption).
    generated: Vec<u32>,
}

/// A continuous-batching scheduler over one engine. Single-threaded: one caller drives
/// [`Scheduler::step`]; the engine's thread pool parallelises each step.
pub struct Scheduler<'e, 's> {
    engine: &'e Engine,
    config: SchedulerConfig,
    queue: VecDeque<Waiting<'e, 's>>,
    running: Vec<Running<'e, 's>>,
    scratch: Scratch,
    next_id: JobId,
    done: Vec<(JobId, Result<Generation>)>,
    preemptions: u64,
    /// The last step ran out of KV blocks: admit nobody until a step fits.
    starved: bool,
    cost: StepCost,
    last_step: StepStats,
    steps: u64,
}

impl std::fmt::Debug for Scheduler<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("config", &self.config)
            .field("queued", &self.queue.len())
            .field("running", &self.running.len())
            .finish()
    }
}

impl<'e, 's> Scheduler<'e, 's> {
    pub fn new(engine: &'e Engine, config: SchedulerConfig) -> Scheduler<'e, 's> {
        let config = SchedulerConfig {
            step_tokens: config.step_tokens.max(1),
            max_running: config.max_running.max(1),
            ..config
        };
        Scheduler {
            engine,
            config,
            queue: VecDeque::new(),
            running: Vec::new(),
            scratch: Scratch::default(),
            next_id: 0,
            done: Vec::new(),
            preemptions: 0,
            starved: false,
            cost: StepCost::default(),
            last_step: StepStats::default(),
            steps: 0,
        }
    }

    /// Queues `request` for `owner`; refused with [`Error::QueueFull`] when the queue is
    /// full, with the request's own error when it is invalid.
    pub fn submit(&mut self, owner: Owner, request: GenerateRequest, sink: Sink<'s>) -> Result<JobId> {
        if self.queue.len() >= self.config.max_queued {
            return Err(Error::QueueFull { limit: self.config.max_queued });
        }
        let budget = self.engine.check(&request)?;
        let id = self.next_id;
        self.next_id += 1;
        let job = Job { id, owner, request, sink, paused: false };
        if budget == 0 {
            let prompt_tokens = job.request.prompt.len();
            self.done.push((id, Ok(Generation { prompt_tokens, completion_tokens: 0, finish: FinishReason::Length })));
        } else {
            self.queue.push_back(Waiting { job, budget, resume: None });
        }
        Ok(id)
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Sequences in the running batch, paused ones included.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Requests paused, running or waiting.
    pub fn paused(&self) -> usize {
        self.running.iter().map(|r| &r.job).chain(self.queue.iter().map(|w| &w.job)).filter(|j| j.paused).count()
    }

    /// Whether a step would do anything: some request that is not paused, or finished
    /// requests to report. A caller whose requests are all paused waits for something
    /// to change instead of stepping.
    pub fn has_work(&self) -> bool {
        !self.done.is_empty() || self.running.iter().any(|r| !r.job.paused) || self.queue.iter().any(|w| !w.job.paused)
    }

    /// Pauses (`true`) or resumes request `id`; `false` when no such request is waiting
    /// or running. A paused request keeps its place and its KV blocks, gets no tokens and
    /// emits nothing; resumed, it continues as if it had never stopped.
    pub fn set_paused(&mut self, id: JobId, paused: bool) -> bool {
        match self.job_mut(id) {
            Some(job) => {
                job.paused = paused;
                true
            }
            None => false,
        }
    }

    /// Ends request `id` now, waiting or running: its blocks are released (zero-filled)
    /// before this returns, and the next [`Scheduler::step`] reports it finished with
    /// [`FinishReason::Cancelled`]. `false` when no such request is waiting or running.
    pub fn cancel(&mut self, id: JobId) -> bool {
        let generation = if let Some(at) = self.running.iter().position(|r| r.job.id == id) {
            // Dropping the sequence's KV releases its blocks.
            let r = self.running.remove(at);
            r.decoding.done
        } else if let Some(at) = self.queue.iter().position(|w| w.job.id == id) {
            match self.queue.remove(at) {
                Some(Waiting { resume: Some((decoding, _)), .. }) => decoding.done,
                Some(Waiting { job, .. }) => Generation {
                    prompt_tokens: job.request.prompt.len(),
                    completion_tokens: 0,
                    finish: FinishReason::Length,
                },
                None => return false,
            }
        } else {
            return false;
        };
        // The blocks the oldest starved sequence waited for may just have come free.
        self.starved = false;
        self.done.push((id, Ok(Generation { finish: FinishReason::Cancelled, ..generation })));
        true
    }

    fn job_mut(&mut self, id: JobId) -> Option<&mut Job<'s>> {
        let running = self.running.iter_mut().map(|r| &mut r.job);
        running.chain(self.queue.iter_mut().map(|w| &mut w.job)).find(|j| j.id == id)
    }

    /// Sequences preempted (released and re-queued for recompute) so far.
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// The most recent step that ran a batch.
    pub fn last_step(&self) -> StepStats {
        self.last_step
    }

    /// Steps that ran a batch so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.running.is_empty() && self.done.is_empty()
    }

    /// Runs steps until every request has finished; returns each request's outcome.
    pub fn run(&mut self) -> Result<Vec<(JobId, Result<Generation>)>> {
        let mut finished = Vec::new();
        while !self.is_idle() {
            finished.extend(self.step()?);
        }
        Ok(finished)
    }

    /// One step: admit, batch, run, sample. Returns the requests that finished. An `Err`
    /// is an engine-wide failure (a kernel error), not one request's.
    pub fn step(&mut self) -> Result<Vec<(JobId, Result<Generation>)>> {
        self.admit();
        let takes = self.plan();
        let tokens: usize = takes.iter().sum();
        if tokens > 0 {
            let decode_tokens = self.running.iter().zip(&takes).filter(|(r, n)| **n == 1 && r.feed.len() == 1).count();
            let started = Instant::now();
            self.run_batch(&takes)?;
            let elapsed = started.elapsed();
            self.cost.observe(tokens, elapsed);
            self.last_step = StepStats { decode_tokens, prefill_tokens: tokens - decode_tokens, elapsed };
            self.steps += 1;
        } else {
            // Nothing ran (everyone paused): no step is waiting for blocks to come free.
            self.starved = false;
        }
        Ok(std::mem::take(&mut self.done))
    }

    /// Moves waiting requests into the batch, the least-served tenant first. Paused
    /// sequences hold no place in the batch: a client that stops reading must not keep
    /// anyone else waiting.
    fn admit(&mut self) {
        // Admitting while starved would pin the blocks the oldest sequence waits for.
        while !self.starved && self.running.iter().filter(|r| !r.job.paused).count() < self.config.max_running {
            let running_of = |owner: &Owner| self.running.iter().filter(|r| r.job.owner.tenant == owner.tenant).count();
            let waiting = (0..self.queue.len()).filter(|&i| !self.queue[i].job.paused);
            let pick = waiting.min_by_key(|&i| (running_of(&self.queue[i].job.owner), i));
            let Some(waiting) = pick.and_then(|i| self.queue.remove(i)) else { return };
            self.running.push(self.start(waiting));
        }
    }

    fn start(&self, w: Waiting<'e, 's>) -> Running<'e, 's> {
        let (decoding, generated) =
            w.resume.unwrap_or_else(|| (Decoding::new(self.engine.tokenizer(), &w.job.request, w.budget), Vec::new()));
        let mut tokens = w.job.request.prompt.clone();
        tokens.extend_from_slice(&generated);
        let capacity = w.job.request.prompt.len() + w.budget + self.engine.kv_pool().shape().block_tokens;
        let kv = SequenceKv::for_prompt(self.engine.kv_pool(), w.job.owner.clone(), capacity, &tokens);
        let feed = tokens.split_off(kv.cached_prompt_tokens().min(tokens.len()));
        Running { job: w.job, budget: w.budget, kv, decoding, feed, generated }
    }

    /// Tokens each running sequence processes this step: decode tokens first, then
    /// prefill chunks, within the step budget and, while anyone decodes, the latency
    /// target. Paused sequences get none.
    fn plan(&self) -> Vec<usize> {
        let mut left = self.config.step_tokens;
        let mut takes = vec![0; self.running.len()];
        let active = |i: &usize| !self.running[*i].job.paused;
        let decoding = (0..self.running.len()).filter(active).filter(|&i| self.running[i].feed.len() == 1);
        for i in decoding {
            if left == 0 {
                break;
            }
            takes[i] = 1;
            left -= 1;
        }
        let decode_tokens = self.config.step_tokens - left;
        if decode_tokens > 0 {
            if let Some(fit) = self.config.itl_target.and_then(|target| self.cost.tokens_within(target)) {
                left = left.min(fit.saturating_sub(decode_tokens).max(MIN_PREFILL_TOKENS));
            }
        }
        for i in (0..self.running.len()).filter(active).filter(|&i| self.running[i].feed.len() > 1) {
            let n = self.running[i].feed.len().min(left);
            takes[i] = n;
            left -= n;
        }
        takes
    }

    /// Runs the planned tokens as one batch, then samples for every sequence whose
    /// cache caught up with its tokens.
    fn run_batch(&mut self, takes: &[usize]) -> Result<()> {
        let mut segments: Vec<Segment<'_, 'e>> = self
            .running
            .iter_mut()
            .zip(takes)
            .filter(|(_, n)| **n > 0)
            .map(|(r, n)| {
                // Only a sequence whose feed runs out this step samples from its last row.
                let need = if *n == r.feed.len() { r.decoding.need() } else { RowNeed::Nothing };
                Segment::new(&r.feed[..*n], &mut r.kv).needing(need)
            })
            .collect();
        self.engine.forward_batch(&mut segments, &mut self.scratch)?;
        let mut outcomes: VecDeque<(Option<Error>, Option<GreedyRow>)> =
            segments.into_iter().map(|s| (s.error, s.picked)).collect();
        let vocab = self.engine.config().vocab;
        // `[segments, vocab]`, moved out so that sampling may borrow `self`.
        let all_logits = std::mem::take(&mut self.scratch.logits);
        let (mut row, mut keep) = (0, Vec::with_capacity(self.running.len()));
        let alone = self.running.len() == 1;
        // Out of blocks, the oldest starved sequence keeps its place and retries; the
        // younger ones make room (preempted), so the oldest always progresses.
        self.starved = false;
        let mut kept_starved = false;
        for (mut r, &n) in std::mem::take(&mut self.running).into_iter().zip(takes) {
            if n == 0 {
                keep.push(r);
                continue;
            }
            let logits = all_logits.get(row * vocab..(row + 1) * vocab).unwrap_or(&[]);
            row += 1;
            let (error, picked) = outcomes.pop_front().unwrap_or_default();
            match error {
                Some(Error::KvExhausted { .. }) if !alone => {
                    self.starved = true;
                    if kept_starved {
                        self.preempt(r);
                    } else {
                        kept_starved = true;
                        keep.push(r);
                    }
                }
                Some(e) => self.done.push((r.job.id, Err(e))),
                None => {
                    r.feed.drain(..n);
                    if !r.feed.is_empty() {
                        keep.push(r);
                    } else if let Some(r) = self.sample(r, logits, picked.as_ref()) {
                        keep.push(r);
                    }
                }
            }
        }
        self.running = keep;
        self.scratch.logits = all_logits;
        Ok(())
    }

    /// Samples `r`'s next token and emits it; `None` once the request has finished.
    fn sample(
        &mut self,
        mut r: Running<'e, 's>,
        logits: &[f32],
        picked: Option<&GreedyRow>,
    ) -> Option<Running<'e, 's>> {
        let (event, last) = match r.decoding.step(logits, picked, r.kv.read_owners()) {
            Ok(step) => step,
            Err(e) => {
                self.done.push((r.job.id, Err(e)));
                return None;
            }
        };
        if (r.job.sink)(&event).is_break() {
            r.decoding.done.finish = FinishReason::Cancelled;
            self.done.push((r.job.id, Ok(r.decoding.done)));
            return None;
        }
        if last {
            self.done.push((r.job.id, Ok(r.decoding.done)));
            return None;
        }
        r.feed.push(event.id);
        r.generated.push(event.id);
        Some(r)
    }

    /// Releases `r`'s blocks and queues it first, to be recomputed.
    fn preempt(&mut self, r: Running<'e, 's>) {
        tracing::debug!(job = r.job.id, generated = r.generated.len(), "KV pool full: request preempted for recompute");
        self.preemptions += 1;
        let Running { job, budget, kv, decoding, generated, .. } = r;
        drop(kv);
        self.queue.push_front(Waiting { job, budget, resume: Some((decoding, generated)) });
    }
}

#[cfg(test)]
mod tests;
