//! The device worker: one thread that owns the backend and runs requests
//! from the queue, one at a time, streaming events as tokens are sampled.
//!
//! Each request goes through [`Running`]: `start` (prefix-cache lookup, then
//! prefill) and `step` (sample one token, then decode it). The sampling loop
//! is the same as [`crate::generate::generate`] (same stops, limits and
//! sampler calls, so the tokens are identical) but split into steps so that
//! continuous batching can later keep several `Running`s and step them
//! together, and so the prefix cache can hand `start` a resumed sequence.

use super::metrics::Metrics;
use super::queue::{Job, Queue};
use super::{Event, Usage};
use crate::backend::Backend;
use crate::generate::FinishReason;
use crate::sampling::Sampler;
use crate::tokenizer::{IncrementalDecoder, Tokenizer};
use anyhow::Result;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Instant;

pub(super) fn spawn<B: Backend + 'static>(
    backend: B,
    tokenizer: Option<Tokenizer>,
    context_limit: usize,
    queue: Arc<Queue>,
    metrics: Arc<Metrics>,
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
}

/// How a request ended, when it did not fail.
struct Finish {
    reason: FinishReason,
    stop_token: Option<u32>,
    completion_tokens: usize,
    cached_tokens: usize,
    trailing_text: String,
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
            Ok(Ok(f)) => {
                // Prefix cache: commit the request's new snapshots here when
                // `f.reason` is Stop or Length; failure and cancellation
                // leave the cache exactly as it was.
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

    /// Hook for the prefix cache: the deepest snapshot matching `prompt`
    /// under `salt`, as a sequence resumed at that position plus the number
    /// of prompt tokens it covers (`start` always runs at least the last
    /// prompt token, so the prefill yields fresh logits). The cache would
    /// record its hit/miss with `Metrics::record_prefix_lookup` here. Without
    /// a cache: a fresh sequence, nothing reused, nothing recorded.
    /// A request's own snapshots are to be committed in `run` only on
    /// success (see the design's prefix-cache section).
    fn lookup_prefix(&self, _prompt: &[u32], _salt: Option<&str>) -> PrefixMatch<B::Sequence> {
        PrefixMatch {
            seq: self.backend.new_sequence(),
            cached_tokens: 0,
        }
    }
}

struct PrefixMatch<S> {
    seq: S,
    cached_tokens: usize,
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
    /// Logits predicting the next token.
    logits: Vec<f32>,
    /// Generated tokens (the stop token not included).
    generated: usize,
    /// Sampled tokens (the stop token included).
    sampled: usize,
    cached_tokens: usize,
    last_sample: Option<Instant>,
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
        };
        if req.max_tokens == 0 {
            return Ok(Err(early(FinishReason::Length)));
        }
        if job.is_cancelled() {
            return Ok(Err(early(FinishReason::Cancelled)));
        }
        let PrefixMatch {
            mut seq,
            cached_tokens,
        } = w.lookup_prefix(&req.prompt, job.opts.cache_salt.as_deref());
        // A snapshot must leave at least one prompt token to run, so the
        // prefill yields the logits for the first sampled token.
        let cached_tokens = cached_tokens.min(req.prompt.len() - 1);
        let logits = w.backend.forward(&mut seq, &req.prompt[cached_tokens..])?;
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
            sampler: Sampler::new(req.sampling.clone()),
            context: req.prompt.clone(),
            stops,
            decoder,
            want_logprobs: req.sampling.logprobs.is_some(),
            logits,
            generated: 0,
            sampled: 0,
            cached_tokens,
            last_sample: None,
        }))
    }

    /// Samples one token, streams it, and runs the decode for the next one.
    /// `Some(finish)` when the request is over.
    fn step(&mut self, w: &Worker<B>) -> Result<Option<Finish>> {
        let req = &self.job.req;
        let s = self
            .sampler
            .sample(&self.logits, &self.context, req.prompt.len());
        let now = Instant::now();
        match self.last_sample {
            None => w.metrics.observe_ttft(now - self.job.submitted),
            Some(t) => w.metrics.observe_itl(now - t),
        }
        self.last_sample = Some(now);
        self.sampled += 1;
        w.metrics.add_completion_token();

        if self.stops.contains(&s.token) {
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
        self.generated += 1;
        self.context.push(token);
        if self.job.is_cancelled() {
            return Ok(Some(self.finish(FinishReason::Cancelled, None)));
        }
        if self.generated >= req.max_tokens || self.context.len() >= w.context_limit {
            return Ok(Some(self.finish(FinishReason::Length, None)));
        }
        self.logits = w.backend.forward(&mut self.seq, &[token])?;
        Ok(None)
    }

    fn finish(&mut self, reason: FinishReason, stop_token: Option<u32>) -> Finish {
        Finish {
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
