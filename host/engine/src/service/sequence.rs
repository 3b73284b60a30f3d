//! One started request in the scheduler: its sequence (while it holds
//! device state), its sampler and its stream.
//!
//! A request's tokens are its `context` (prompt, then every token sampled);
//! the sequence holds the first `computed` of them. Each engine step runs
//! the next tokens of the context that the scheduler grants it (a prompt
//! chunk, one decode token, or a recompute after a preemption); the chunk
//! that reaches the context's end reads the next token's distribution back,
//! and [`Running::advance`] samples and streams it. The sampling loop is the
//! same as [`crate::generate::generate`] (same stops, limits and sampler
//! calls, so the tokens are identical), and a preempted request keeps its
//! sampler (its RNG stream) and context, so it resumes where it was.

use super::Event;
use super::metrics::Phase;
use super::queue::Job;
use super::worker::{Finish, Worker};
use crate::backend::{Backend, BatchItem, PassSnapshots, StepOut, Taken, Want};
use crate::constraint::{Constraint, Step};
use crate::generate::FinishReason;
use crate::prefix_cache::{Lease, PrefixCache, Staged, StagedSnapshot};
use crate::readout::mask::MaskSource;
use crate::readout::{DrawSlot, Next, Readout};
use crate::sampling::{Sampled, Sampler};
use crate::tokenizer::IncrementalDecoder;
use anyhow::Result;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

pub(super) struct Running<B: Backend> {
    pub job: Arc<Job>,
    /// Start order: the scheduler preempts the newest first, resumes the oldest first.
    pub order: u64,
    /// When the worker first started it (service time counts from here).
    pub started: Instant,
    /// The device state; `None` while preempted.
    pub seq: Option<B::Sequence>,
    /// Tokens of `context` the sequence holds.
    pub computed: usize,
    sampler: Sampler,
    /// Prompt plus generated tokens (what penalties look at).
    pub context: Vec<u32>,
    stops: Vec<u32>,
    decoder: Option<IncrementalDecoder>,
    want_logprobs: bool,
    /// Logits predicting the next token (empty once `next` replaces them).
    logits: Vec<f32>,
    /// What the step at the context's end reads back ([`Readout`]).
    readout: Readout,
    /// The output constraint: its mask goes with each step's readout (on
    /// the host for [`Readout::Logits`]).
    constraint: Option<Constraint>,
    /// The next token, drawn when the step read less than the logits.
    next: Option<Sampled>,
    /// The next token's distribution is here: [`Running::advance`] samples it.
    pub ready: bool,
    /// A weighted read in flight: its draw and, once planned, the plan.
    draw: DrawSlot,
    /// Prompt positions still to snapshot at (intervals, guest marks).
    cuts: BTreeSet<usize>,
    /// [`Backend::pass_snapshot_stride`]: cuts on it are taken inside a pass.
    pass_stride: Option<usize>,
    /// The prompt-end snapshot is still to be staged: after the first token
    /// is out ([`Running::stage_prompt_end`]), so its copy is not in the TTFT.
    stage_prompt: bool,
    /// Generated tokens (the stop token not included).
    generated: usize,
    /// Sampled tokens (the stop token included).
    sampled: usize,
    cached_tokens: usize,
    last_sample: Option<Instant>,
    staged: Staged,
    lease: Option<Lease>,
    /// The snapshot a resume after a preemption restored (pinned until the end).
    resume_lease: Option<Lease>,
}

impl<B: Backend> Running<B> {
    /// Prefix lookup and the plan of the prefill. `Err(finish)` when the
    /// request ends before any token (max_tokens 0, or cancelled while queued).
    pub fn start(
        w: &Worker<B>,
        job: Arc<Job>,
        order: u64,
    ) -> std::result::Result<Self, (Arc<Job>, Box<Finish>)> {
        let req = &job.req;
        let early = |reason| {
            Box::new(Finish {
                reason,
                stop_token: None,
                completion_tokens: 0,
                cached_tokens: 0,
                trailing_text: String::new(),
                staged: Staged::default(),
                lease: None,
            })
        };
        if req.max_tokens == 0 {
            return Err((job, early(FinishReason::Length)));
        }
        if job.is_cancelled() {
            return Err((job, early(FinishReason::Cancelled)));
        }
        let salt = job.opts.cache_salt.as_deref();
        let found = w.lookup_prefix(&req.prompt, salt, true);
        let cached_tokens = found.cached_tokens;
        job.cached_tokens
            .store(cached_tokens as u32, Ordering::Release);
        let p = req.prompt.len();
        let mut staged = Staged::default();
        // Resumed from a host copy: the restored state, staged as it is, moves
        // the entry back to the device when the request commits.
        if let (Some(cache), Some(l)) = (&w.cache, &found.lease)
            && l.in_host_memory()
            && let Some(snap) = w.timed(Phase::Snapshot, || w.backend.snapshot(&found.seq))
        {
            let s = StagedSnapshot {
                tokens: req.prompt[..cached_tokens].to_vec(),
                snap,
                logits: found.logits.clone(),
            };
            staged.push_bounded(s, cache.staging_budget());
        }
        // With a cache the prefill stops at the snapshot points (every
        // `snapshot_interval` tokens and the guest's marks) to stage one.
        let mut cuts = BTreeSet::new();
        if let Some(cache) = &w.cache {
            cuts.extend(
                job.opts
                    .snapshot_points
                    .iter()
                    .copied()
                    .filter(|&q| q > cached_tokens && q < p),
            );
            if w.snapshot_interval > 0 {
                cuts.extend(
                    (w.snapshot_interval..p)
                        .step_by(w.snapshot_interval)
                        .filter(|&q| q > cached_tokens),
                );
            }
            // A backend that stages snapshots inside a pass takes them on
            // its stride from the first uncomputed token: each point moves
            // down onto it (at most stride - 1 tokens), and the prompt runs
            // as one pass.
            if let Some(g) = w.backend.pass_snapshot_stride() {
                cuts = cuts
                    .into_iter()
                    .map(|q| cached_tokens + (q - cached_tokens) / g * g)
                    .filter(|&q| q > cached_tokens)
                    .collect();
            }
            // Skip cuts already cached: nothing to stage there.
            cuts.retain(|&q| !cache.contains(salt, &req.prompt[..q]));
        }
        let mut stops = req.stop_token_ids.clone();
        if !req.ignore_eos {
            stops.extend(&w.backend.config().eos_token_ids);
        }
        let decoder = match (&w.tokenizer, job.opts.detokenize) {
            (Some(t), true) => Some(IncrementalDecoder::new(t.clone(), true)),
            _ => None,
        };
        w.metrics.add_prompt_tokens(p);
        // On a full hit the stored logits give the first token: nothing to run.
        let ready = found.logits.is_some();
        Ok(Running {
            order,
            started: Instant::now(),
            seq: Some(found.seq),
            computed: cached_tokens,
            sampler: Sampler::new(req.sampling.clone()),
            context: req.prompt.clone(),
            stops,
            decoder,
            want_logprobs: req.sampling.logprobs.is_some(),
            logits: found.logits.unwrap_or_default(),
            readout: Readout::choose(&req.sampling, &w.backend),
            constraint: job.opts.constraint.as_ref().map(|c| c.start()),
            next: None,
            ready,
            draw: None,
            cuts,
            pass_stride: w.backend.pass_snapshot_stride(),
            stage_prompt: w.cache.is_some() && cached_tokens < p,
            generated: 0,
            sampled: 0,
            cached_tokens,
            last_sample: None,
            staged,
            lease: found.lease,
            resume_lease: None,
            job,
        })
    }

    /// It generates: its next tokens are one sampled token each.
    pub fn decodes(&self) -> bool {
        self.sampled > 0 && self.computed + 1 == self.context.len()
    }

    /// No token sampled yet (its steps count as its first token's prefill).
    pub fn before_first_token(&self) -> bool {
        self.sampled == 0
    }

    /// Tokens the next step may run for it: up to the context's end or the
    /// next snapshot point its pass cannot stage inside, whichever is first
    /// (0 when it is ready to sample).
    pub fn wants(&self) -> usize {
        let end = self.context.len();
        let stop = self
            .cuts
            .range(self.computed + 1..)
            .find(|&&q| !self.in_pass(q))
            .map_or(end, |&q| q.min(end));
        stop - self.computed
    }

    /// Whether a pass starting at `computed` stages the snapshot at `q` itself.
    fn in_pass(&self, q: usize) -> bool {
        self.pass_stride
            .is_some_and(|g| (q - self.computed).is_multiple_of(g))
    }

    /// Tokens it runs this step with `budget` tokens left in the step:
    /// what it wants, or a run within the budget ([`Running::within`]).
    pub fn grant(&self, budget: usize) -> usize {
        let want = self.wants();
        if want <= budget {
            want
        } else {
            self.within(budget)
        }
    }

    /// The longest run of at most `n` tokens (`n` < [`Running::wants`]) that
    /// keeps its next pass on the stride of the snapshots still ahead, so
    /// that a prompt chunked by the step budget still stages them in its
    /// passes; `n` itself where there are none or `n` is below the stride.
    fn within(&self, n: usize) -> usize {
        match self.pass_stride {
            Some(g) if n >= g && self.cuts.range(self.computed + n..).next().is_some() => n / g * g,
            _ => n,
        }
    }

    /// The batch row for `n` of the tokens it wants. The chunk that reaches
    /// the context's end reads back what its readout needs ([`Readout::want`]),
    /// a constrained one under the mask its constraint computes when the
    /// backend asks (while the step runs).
    pub fn item(&mut self, n: usize) -> BatchItem<'_, B::Sequence> {
        let Running {
            seq,
            context,
            computed,
            readout,
            sampler,
            draw,
            constraint,
            cuts,
            ..
        } = self;
        let tokens = &context[*computed..*computed + n];
        let snapshots = PassSnapshots {
            at: cuts.range(*computed + 1..*computed + n).copied().collect(),
            taken: Vec::new(),
        };
        let (want, mask) = if *computed + n < context.len() {
            (Want::Nothing, None)
        } else {
            let mask = match constraint {
                Some(c) if *readout != Readout::Logits => {
                    Some(Box::new(move || c.token_mask()) as Box<MaskSource<'_>>)
                }
                _ => None,
            };
            (readout.want(sampler, draw), mask)
        };
        BatchItem {
            seq: seq.as_mut().expect("a running request holds its sequence"),
            tokens,
            want,
            mask,
            snapshots,
        }
    }

    /// Takes a step's result for the `n` tokens it ran: the snapshots its
    /// pass staged (`taken`), a snapshot where the chunk ended at a snapshot
    /// point, the next token's distribution where it reached the context's end.
    pub fn took(&mut self, w: &Worker<B>, n: usize, out: StepOut, taken: Taken) -> Result<()> {
        self.computed += n;
        // Points inside the chunk are past, staged or not (no memory).
        let at_end = self.cuts.contains(&self.computed);
        self.cuts = self.cuts.split_off(&(self.computed + 1));
        if let Some(cache) = &w.cache {
            for (q, snap) in taken {
                let s = StagedSnapshot {
                    tokens: self.context[..q].to_vec(),
                    snap,
                    logits: None,
                };
                self.staged.push_bounded(s, cache.staging_budget());
            }
        }
        if at_end && let Some(cache) = &w.cache {
            let seq = self.seq.as_ref().expect("running");
            if let Some(snap) = w.timed(Phase::Snapshot, || w.backend.snapshot(seq)) {
                let s = StagedSnapshot {
                    tokens: self.context[..self.computed].to_vec(),
                    snap,
                    logits: None,
                };
                self.staged.push_bounded(s, cache.staging_budget());
            }
        }
        match Readout::next(out, &mut self.sampler, &mut self.draw)? {
            None => return Ok(()),
            Some(Next::Logits(l)) => self.logits = l,
            Some(Next::Sampled(s)) => self.next = Some(s),
        }
        if self.next.is_some() {
            self.logits.clear();
        }
        self.ready = true;
        Ok(())
    }

    /// Drops the sequence (its memory goes back); the request keeps its
    /// context and sampler and recomputes its state when it resumes.
    pub fn preempt(&mut self) {
        self.seq = None;
        self.computed = 0;
        self.draw = None;
    }

    /// Back from a preemption: the deepest cached prefix of its context (not
    /// counted as a new lookup), the rest recomputed by the next steps.
    pub fn resume(&mut self, w: &Worker<B>) {
        let salt = self.job.opts.cache_salt.as_deref();
        let found = w.lookup_prefix(&self.context, salt, false);
        self.computed = found.cached_tokens;
        self.seq = Some(found.seq);
        self.resume_lease = found.lease;
        if let Some(l) = found.logits {
            self.logits = l;
            self.ready = true;
        }
    }

    /// Samples the token its last step read back, streams it, and appends
    /// it to the context (the next step runs it). `Some(finish)` when the
    /// request is over.
    pub fn advance(&mut self, w: &Worker<B>) -> Option<Finish> {
        self.ready = false;
        let (prompt_len, max_tokens) = (self.job.req.prompt.len(), self.job.req.max_tokens);
        let t0 = Instant::now();
        // A failing constraint fails the request (the scheduler catches it).
        let s = match (self.next.take(), &mut self.constraint) {
            (Some(s), _) => s,
            (None, Some(c)) => {
                let masked = c.masked(&self.logits).unwrap_or_else(|e| panic!("{e:#}"));
                self.sampler.sample(masked, &self.context, prompt_len)
            }
            (None, None) => self.sampler.sample(&self.logits, &self.context, prompt_len),
        };
        let now = Instant::now();
        if self.last_sample.is_none() {
            w.metrics.add_phase(Phase::Sample, now - t0);
        }
        match self.last_sample {
            None => w.metrics.observe_ttft(now - self.job.submitted),
            Some(t) => w.metrics.observe_itl(now - t),
        }
        self.last_sample = Some(now);
        self.sampled += 1;
        self.job
            .sampled
            .store(self.sampled as u32, Ordering::Release);
        w.metrics.add_completion_token();

        // A token that completes a constrained output ends it after itself.
        let complete = match &mut self.constraint {
            Some(c) if !self.stops.contains(&s.token) => {
                c.advance(s.token).unwrap_or_else(|e| panic!("{e:#}")) == Step::Done
            }
            _ => false,
        };
        if self.stops.contains(&s.token) {
            self.stage_prompt_end(w);
            self.stage_end(w);
            return Some(self.finish(FinishReason::Stop, Some(s.token)));
        }
        let text = match &mut self.decoder {
            Some(d) => d.push(s.token),
            None => String::new(),
        };
        let token = s.token;
        let logprob = self.want_logprobs.then_some(s);
        self.job.stream.push(Event::Token {
            id: token,
            text,
            logprob,
        });
        self.stage_prompt_end(w);
        self.generated += 1;
        if self.job.is_cancelled() {
            self.context.push(token);
            return Some(self.finish(FinishReason::Cancelled, None));
        }
        if complete {
            self.context.push(token);
            self.stage_end(w);
            return Some(self.finish(FinishReason::Stop, None));
        }
        if self.generated >= max_tokens || self.context.len() + 1 >= w.context_limit {
            self.context.push(token);
            self.stage_end(w);
            return Some(self.finish(FinishReason::Length, None));
        }
        self.context.push(token);
        None
    }

    /// Stages the snapshot at the prompt's end, with the logits after it (the
    /// host's, or the backend's [`Backend::last_logits`] where the first token
    /// was drawn on the device) so that an identical prompt is a full hit.
    /// Once, before the sequence runs its first generated token. A snapshot
    /// already there without logits (an interval, a mark or another
    /// request's generation end) is replaced by this one on commit; one with
    /// logits in the backend's memory needs none.
    fn stage_prompt_end(&mut self, w: &Worker<B>) {
        if !std::mem::take(&mut self.stage_prompt) {
            return;
        }
        let Some(cache) = &w.cache else { return };
        let Some(seq) = &self.seq else { return };
        let prompt = &self.job.req.prompt;
        let salt = self.job.opts.cache_salt.as_deref();
        if w.backend.position(seq) != prompt.len() || cache.contains_with_logits(salt, prompt) {
            return;
        }
        let logits = if self.logits.is_empty() {
            w.backend.last_logits(seq)
        } else {
            Some(self.logits.clone())
        };
        let tokens = prompt.clone();
        self.stage(w, cache, tokens, logits);
    }

    /// Stages a snapshot of the sequence as it is, at `tokens` (with the
    /// logits after them, if any), within the cache's staging budget.
    fn stage(
        &mut self,
        w: &Worker<B>,
        cache: &PrefixCache,
        tokens: Vec<u32>,
        logits: Option<Vec<f32>>,
    ) {
        let Some(seq) = &self.seq else { return };
        if let Some(snap) = w.backend.snapshot(seq) {
            let s = StagedSnapshot {
                tokens,
                snap,
                logits,
            };
            self.staged.push_bounded(s, cache.staging_budget());
        }
    }

    /// Stages the end-of-generation snapshot (prompt + generated tokens the
    /// sequence holds), so the next turn of a conversation hits it. Called
    /// before the last sampled token is run, so `self.logits` is the
    /// distribution after exactly those tokens: stored with it, a request that
    /// resends prompt + completion is a full hit. (Decoded through
    /// `forward_greedy` or `forward_top` there are no logits: the snapshot is
    /// still a prefix for the next turn.)
    fn stage_end(&mut self, w: &Worker<B>) {
        let Some(cache) = &w.cache else { return };
        let Some(seq) = &self.seq else { return };
        let pos = w.backend.position(seq);
        let prompt = self.job.req.prompt.len();
        if pos <= prompt || pos > self.context.len() {
            return;
        }
        let key = &self.context[..pos];
        let salt = self.job.opts.cache_salt.as_deref();
        let logits = (!self.logits.is_empty()).then(|| self.logits.clone());
        let held = match logits {
            Some(_) => cache.contains_with_logits(salt, key),
            None => cache.contains(salt, key),
        };
        if held {
            return;
        }
        let tokens = key.to_vec();
        self.stage(w, cache, tokens, logits);
    }

    /// How it ended; the sequence is dropped here (its memory goes back).
    pub fn finish(&mut self, reason: FinishReason, stop_token: Option<u32>) -> Finish {
        self.seq = None;
        self.resume_lease = None;
        Finish {
            staged: std::mem::take(&mut self.staged),
            lease: self.lease.take(),
            reason,
            stop_token,
            completion_tokens: self.sampled,
            cached_tokens: self.cached_tokens,
            trailing_text: self
                .decoder
                .as_mut()
                .map(|d| d.finish())
                .unwrap_or_default(),
        }
    }
}
