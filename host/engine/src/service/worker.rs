//! The device worker: one thread that owns the backend and runs requests
//! from the queue, one at a time, streaming events as tokens are sampled.
//!
//! Each request goes through [`Running`]: `start` (prefix-cache lookup, then
//! prefill) and `step` (sample one token, then decode it). The sampling loop
//! is the same as [`crate::generate::generate`] (same stops, limits and
//! sampler calls, so the tokens are identical) but split into steps so that
//! continuous batching can later keep several `Running`s and step them
//! together, and so the prefix cache can hand `start` a resumed sequence.

use super::metrics::{Metrics, Phase};
use super::queue::{Job, Queue};
use super::{Event, Usage};
use crate::backend::{Backend, SeqSnapshot};
use crate::constraint::{Constraint, Step};
use crate::generate::FinishReason;
use crate::prefix_cache::{Lease, PrefixCache, Staged, StagedSnapshot};
use crate::readout::{Next, Readout};
use crate::sampling::{Sampled, Sampler};
use crate::tokenizer::{IncrementalDecoder, Tokenizer};
use anyhow::Result;
use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

pub(super) fn spawn<B: Backend + 'static>(
    backend: B,
    tokenizer: Option<Tokenizer>,
    context_limit: usize,
    queue: Arc<Queue>,
    metrics: Arc<Metrics>,
    cache: Option<Arc<PrefixCache>>,
    snapshot_interval: usize,
) {
    std::thread::Builder::new()
        .name("qwasi-device-worker".into())
        .spawn(move || {
            let _exit = ExitGuard(queue.clone());
            let worker = Worker {
                backend,
                tokenizer,
                context_limit,
                metrics,
                cache,
                snapshot_interval,
            };
            while let Some(job) = queue.next() {
                let terminal = worker.run(&job);
                // Free the slot and publish the terminal event atomically, so
                // whoever sees `Finished` also sees the slot free in `stats()`.
                queue.finish(|| job.stream.push(terminal));
            }
        })
        .expect("cannot spawn the device worker thread");
}

/// However the worker thread ends, the queue learns of it, so submitters and
/// `drained()` never wait on a worker that is gone.
struct ExitGuard(Arc<Queue>);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        self.0.worker_gone();
    }
}

struct Worker<B: Backend> {
    backend: B,
    tokenizer: Option<Tokenizer>,
    context_limit: usize,
    metrics: Arc<Metrics>,
    /// The prefix cache (`None` when `prefix_cache_bytes` is 0).
    cache: Option<Arc<PrefixCache>>,
    /// Snapshot every this many prompt tokens during a prefill (0 = never).
    snapshot_interval: usize,
}

/// How a request ended, when it did not fail.
struct Finish {
    reason: FinishReason,
    stop_token: Option<u32>,
    completion_tokens: usize,
    cached_tokens: usize,
    trailing_text: String,
    /// Snapshots to commit if the request succeeded (stop or length).
    staged: Staged,
    /// The snapshot it resumed from (pinned until the request ends).
    lease: Option<Lease>,
}

impl<B: Backend> Worker<B> {
    /// Runs one started job, streaming its tokens, and returns its terminal
    /// event. Never panics: a panic in the backend (or anywhere in the
    /// request) becomes `Event::Failed`.
    fn run(&self, job: &Arc<Job>) -> Event {
        let started = Instant::now();
        self.metrics.observe_queue_wait(started - job.submitted);
        let outcome = catch_unwind(AssertUnwindSafe(|| self.generate(job)));
        let (reason, terminal) = match outcome {
            Ok(Ok(mut f)) => {
                // Prefix cache: commit the request's new snapshots only on
                // success; failure and cancellation (including a deadline,
                // which cancels) drop them and leave the cache as it was.
                let staged = std::mem::take(&mut f.staged);
                if matches!(f.reason, FinishReason::Stop | FinishReason::Length)
                    && let Some(cache) = &self.cache
                {
                    let demote = |s: &dyn SeqSnapshot| self.backend.demote(s);
                    cache.commit(
                        job.opts.cache_salt.as_deref(),
                        f.lease.as_ref(),
                        staged,
                        Some(&demote),
                    );
                }
                drop(f.lease.take());
                let usage = Usage {
                    prompt_tokens: job.req.prompt.len() as u32,
                    completion_tokens: f.completion_tokens as u32,
                    cached_tokens: f.cached_tokens as u32,
                };
                let ev = Event::Finished {
                    reason: f.reason,
                    usage,
                    stop_token: f.stop_token,
                    trailing_text: f.trailing_text,
                };
                (Some(f.reason), ev)
            }
            Ok(Err(e)) => (None, Event::Failed(format!("generation failed: {e:#}"))),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                (None, Event::Failed(format!("the engine panicked: {msg}")))
            }
        };
        self.metrics
            .record_end(reason, job.submitted.elapsed(), started.elapsed());
        terminal
    }

    /// `f`, its time added to `phase` (what `qwasi_first_token_phase_seconds_total` sums).
    fn timed<T>(&self, phase: Phase, f: impl FnOnce() -> T) -> T {
        let t0 = Instant::now();
        let r = f();
        self.metrics.add_phase(phase, t0.elapsed());
        r
    }

    fn generate(&self, job: &Arc<Job>) -> Result<Finish> {
        let mut running = match Running::start(self, job)? {
            Ok(r) => r,
            Err(finish) => return Ok(finish),
        };
        loop {
            if let Some(finish) = running.step(self)? {
                return Ok(finish);
            }
        }
    }

    /// The deepest cached snapshot matching `prompt` under `salt`, as a
    /// sequence resumed at that position plus the number of prompt tokens
    /// it covers: the whole prompt on a full hit (a snapshot at the prompt's
    /// end that stored the logits after it, returned with them), otherwise
    /// fewer than the prompt, so the prefill yields fresh logits. Without a
    /// cache, or on a miss: a fresh sequence.
    fn lookup_prefix(&self, prompt: &[u32], salt: Option<&str>) -> PrefixMatch<B::Sequence> {
        let fresh = || PrefixMatch {
            seq: self.backend.new_sequence(),
            cached_tokens: 0,
            logits: None,
            lease: None,
        };
        let Some(cache) = &self.cache else {
            return fresh();
        };
        let found = self.timed(Phase::Lookup, || cache.lookup(salt, prompt));
        let found = found.and_then(|lease| {
            let seq = self.timed(Phase::Restore, || self.backend.restore(lease.snapshot()))?;
            Some((seq, lease))
        });
        let vocab = self.backend.config().vocab_size;
        // What every hit counts (a full hit also counts itself).
        let record_hit = |seq: &B::Sequence, lease: &Lease| {
            self.metrics.record_prefix_lookup(true);
            if self.backend.resumed_in_place(seq) {
                self.metrics.record_prefix_in_place();
            }
            self.metrics.add_prefix_tokens_saved(lease.position());
        };
        match found {
            Some((seq, lease))
                if lease.position() == prompt.len()
                    && lease.logits().is_some_and(|l| l.len() == vocab) =>
            {
                record_hit(&seq, &lease);
                self.metrics.record_prefix_full_hit();
                PrefixMatch {
                    seq,
                    cached_tokens: lease.position(),
                    logits: lease.logits().map(<[f32]>::to_vec),
                    lease: Some(lease),
                }
            }
            Some((seq, lease)) if lease.position() > 0 && lease.position() < prompt.len() => {
                record_hit(&seq, &lease);
                PrefixMatch {
                    seq,
                    cached_tokens: lease.position(),
                    logits: None,
                    lease: Some(lease),
                }
            }
            _ => {
                self.metrics.record_prefix_lookup(false);
                fresh()
            }
        }
    }
}

struct PrefixMatch<S> {
    seq: S,
    cached_tokens: usize,
    /// On a full hit: the stored logits after the whole prompt.
    logits: Option<Vec<f32>>,
    lease: Option<Lease>,
}

/// One request on the device: its sequence, sampler and stream state.
struct Running<'j, B: Backend> {
    job: &'j Job,
    seq: B::Sequence,
    sampler: Sampler,
    /// Prompt plus generated tokens (what penalties look at).
    context: Vec<u32>,
    stops: Vec<u32>,
    decoder: Option<IncrementalDecoder>,
    want_logprobs: bool,
    /// Logits predicting the next token (empty once `next` replaces them).
    logits: Vec<f32>,
    /// What each decode step reads back ([`Readout`]).
    readout: Readout,
    /// The next token, drawn when the step read less than the logits.
    next: Option<Sampled>,
    /// The output constraint (such requests read the whole logits row).
    constraint: Option<Constraint>,
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
}

impl<'j, B: Backend> Running<'j, B> {
    /// Prefix lookup and prefill. `Ok(Err(finish))` when the request ends
    /// before any token (max_tokens 0, or cancelled while queued).
    fn start(w: &Worker<B>, job: &'j Job) -> Result<std::result::Result<Self, Finish>> {
        let req = &job.req;
        let early = |reason| Finish {
            reason,
            stop_token: None,
            completion_tokens: 0,
            cached_tokens: 0,
            trailing_text: String::new(),
            staged: Staged::default(),
            lease: None,
        };
        if req.max_tokens == 0 {
            return Ok(Err(early(FinishReason::Length)));
        }
        if job.is_cancelled() {
            return Ok(Err(early(FinishReason::Cancelled)));
        }
        let salt = job.opts.cache_salt.as_deref();
        let PrefixMatch {
            mut seq,
            cached_tokens,
            logits: stored_logits,
            lease,
        } = w.lookup_prefix(&req.prompt, salt);
        job.cached_tokens
            .store(cached_tokens as u32, Ordering::Release);
        // The prefill runs prompt[cached..]; with a cache it is split at the
        // snapshot points (every `snapshot_interval` tokens and the guest's
        // marks) and a snapshot is staged at each cut and at the end (that
        // one with the logits). On a full hit there is nothing to run: the
        // stored logits give the first token.
        let p = req.prompt.len();
        let mut staged = Staged::default();
        // Resumed from a host copy: the restored state, staged as it is, moves
        // the entry back to the device when the request commits.
        if let (Some(cache), Some(l)) = (&w.cache, &lease)
            && l.in_host_memory()
            && let Some(snap) = w.timed(Phase::Snapshot, || w.backend.snapshot(&seq))
        {
            let s = StagedSnapshot {
                tokens: req.prompt[..cached_tokens].to_vec(),
                snap,
                logits: stored_logits.clone(),
            };
            staged.push_bounded(s, cache.staging_budget());
        }
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
            // Skip cuts already cached: nothing to stage there.
            cuts.retain(|&q| !cache.contains(salt, &req.prompt[..q]));
        }
        let mut at = cached_tokens;
        let budget = w.cache.as_ref().map_or(0, |c| c.staging_budget());
        for q in cuts {
            if job.is_cancelled() {
                return Ok(Err(Finish {
                    cached_tokens,
                    ..early(FinishReason::Cancelled)
                }));
            }
            w.timed(Phase::Prefill, || {
                w.backend.extend(&mut seq, &req.prompt[at..q])
            })?;
            at = q;
            if let Some(snap) = w.timed(Phase::Snapshot, || w.backend.snapshot(&seq)) {
                let s = StagedSnapshot {
                    tokens: req.prompt[..q].to_vec(),
                    snap,
                    logits: None,
                };
                staged.push_bounded(s, budget);
            }
        }
        // The rest of the prompt, read out as the decode steps are: where the
        // backend keeps the logits on the device, the first token is drawn
        // there (the same token and RNG stream as the host sampler's).
        let mut sampler = Sampler::new(req.sampling.clone());
        let constraint = job.opts.constraint.as_ref().map(|c| c.start());
        let readout = match constraint {
            Some(_) => Readout::Logits,
            None => Readout::choose(&req.sampling, &w.backend),
        };
        let (logits, next) = match stored_logits {
            Some(l) => (l, None),
            None => {
                let tail = &req.prompt[at..];
                w.timed(Phase::Prefill, || {
                    readout.step(&w.backend, &mut seq, tail, &mut sampler)
                })?
                .into_parts()
            }
        };
        w.metrics.add_prompt_tokens(req.prompt.len());
        let mut stops = req.stop_token_ids.clone();
        if !req.ignore_eos {
            stops.extend(&w.backend.config().eos_token_ids);
        }
        let decoder = match (&w.tokenizer, job.opts.detokenize) {
            (Some(t), true) => Some(IncrementalDecoder::new(t.clone(), true)),
            _ => None,
        };
        Ok(Ok(Running {
            job,
            seq,
            sampler,
            context: req.prompt.clone(),
            stops,
            decoder,
            want_logprobs: req.sampling.logprobs.is_some(),
            logits,
            readout,
            next,
            constraint,
            stage_prompt: w.cache.is_some() && cached_tokens < p,
            generated: 0,
            sampled: 0,
            cached_tokens,
            last_sample: None,
            staged,
            lease,
        }))
    }

    /// Samples one token, streams it, and runs the decode for the next one.
    /// `Some(finish)` when the request is over.
    fn step(&mut self, w: &Worker<B>) -> Result<Option<Finish>> {
        let req = &self.job.req;
        let t0 = Instant::now();
        let s = match (self.next.take(), &mut self.constraint) {
            (Some(s), _) => s,
            (None, Some(c)) => {
                self.sampler
                    .sample(c.masked(&self.logits)?, &self.context, req.prompt.len())
            }
            (None, None) => self
                .sampler
                .sample(&self.logits, &self.context, req.prompt.len()),
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
            Some(c) if !self.stops.contains(&s.token) => c.advance(s.token)? == Step::Done,
            _ => false,
        };
        if self.stops.contains(&s.token) {
            self.stage_prompt_end(w);
            self.stage_end(w);
            return Ok(Some(self.finish(FinishReason::Stop, Some(s.token))));
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
        self.context.push(token);
        if self.job.is_cancelled() {
            return Ok(Some(self.finish(FinishReason::Cancelled, None)));
        }
        if complete {
            self.stage_end(w);
            return Ok(Some(self.finish(FinishReason::Stop, None)));
        }
        if self.generated >= req.max_tokens || self.context.len() >= w.context_limit {
            self.stage_end(w);
            return Ok(Some(self.finish(FinishReason::Length, None)));
        }
        match self
            .readout
            .step(&w.backend, &mut self.seq, &[token], &mut self.sampler)?
        {
            Next::Sampled(s) => {
                self.next = Some(s);
                self.logits.clear();
            }
            Next::Logits(l) => self.logits = l,
        }
        Ok(None)
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
        let prompt = &self.job.req.prompt;
        let salt = self.job.opts.cache_salt.as_deref();
        if w.backend.position(&self.seq) != prompt.len() || cache.contains_with_logits(salt, prompt)
        {
            return;
        }
        let logits = if self.logits.is_empty() {
            w.backend.last_logits(&self.seq)
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
        if let Some(snap) = w.backend.snapshot(&self.seq) {
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
        let pos = w.backend.position(&self.seq);
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

    fn finish(&mut self, reason: FinishReason, stop_token: Option<u32>) -> Finish {
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
