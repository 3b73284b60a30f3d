//! The device worker: one thread that owns the backend and runs the
//! scheduler's engine steps ([`super::scheduler`]) until the service is
//! gone; what every request needs from it besides (the prefix lookup, the
//! end of a request: commit, metrics, terminal event).

use super::Event;
use super::Usage;
use super::metrics::{Metrics, Phase};
use super::queue::{Job, Queue};
use super::scheduler::{Limits, Scheduler};
use crate::backend::{Backend, SeqSnapshot};
use crate::generate::FinishReason;
use crate::prefix_cache::{Lease, PrefixCache, Staged};
use crate::tokenizer::Tokenizer;
use std::sync::Arc;
use std::time::Instant;

#[allow(clippy::too_many_arguments)]
pub(super) fn spawn<B: Backend + 'static>(
    backend: B,
    tokenizer: Option<Tokenizer>,
    context_limit: usize,
    queue: Arc<Queue>,
    metrics: Arc<Metrics>,
    cache: Option<Arc<PrefixCache>>,
    snapshot_interval: usize,
    limits: Limits,
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
                queue,
            };
            Scheduler::new(limits).run(&worker);
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

pub(super) struct Worker<B: Backend> {
    pub backend: B,
    pub tokenizer: Option<Tokenizer>,
    pub context_limit: usize,
    pub metrics: Arc<Metrics>,
    /// The prefix cache (`None` when `prefix_cache_bytes` is 0).
    pub cache: Option<Arc<PrefixCache>>,
    /// Snapshot every this many prompt tokens during a prefill (0 = never).
    pub snapshot_interval: usize,
    pub queue: Arc<Queue>,
}

/// How a request ended, when it did not fail.
pub(super) struct Finish {
    pub reason: FinishReason,
    pub stop_token: Option<u32>,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
    pub trailing_text: String,
    /// Snapshots to commit if the request succeeded (stop or length).
    pub staged: Staged,
    /// The snapshot it resumed from (pinned until the request ends).
    pub lease: Option<Lease>,
}

impl<B: Backend> Worker<B> {
    /// A started job ended: commits its snapshots on success, records it,
    /// frees its slot and publishes its terminal event. `started`: when
    /// the worker first started it.
    pub fn end(&self, job: &Job, started: Instant, outcome: Result<Finish, String>) {
        let (reason, terminal) = match outcome {
            Ok(mut f) => {
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
            Err(msg) => (None, Event::Failed(msg)),
        };
        self.metrics
            .record_end(reason, job.submitted.elapsed(), started.elapsed());
        // Free the slot and publish the terminal event atomically, so
        // whoever sees `Finished` also sees the slot free in `stats()`.
        self.queue.finish(|| job.stream.push(terminal));
    }

    /// `f`, its time added to `phase` (what `qwasi_first_token_phase_seconds_total` sums).
    pub fn timed<T>(&self, phase: Phase, f: impl FnOnce() -> T) -> T {
        let t0 = Instant::now();
        let r = f();
        self.metrics.add_phase(phase, t0.elapsed());
        r
    }

    /// The deepest cached snapshot matching `prompt` under `salt`, as a
    /// sequence resumed at that position plus the number of prompt tokens
    /// it covers: the whole prompt on a full hit (a snapshot at the prompt's
    /// end that stored the logits after it, returned with them), otherwise
    /// fewer than the prompt, so the prefill yields fresh logits. Without a
    /// cache, or on a miss: a fresh sequence. `count`: recorded in the
    /// metrics (a request's first lookup; not its resumes after preemption).
    /// The sequence is planned for the whole prompt ([`Backend::plan`]).
    pub fn lookup_prefix(
        &self,
        prompt: &[u32],
        salt: Option<&str>,
        count: bool,
    ) -> PrefixMatch<B::Sequence> {
        let mut found = self.find_prefix(prompt, salt, count);
        self.backend.plan(&mut found.seq, prompt.len());
        found
    }

    fn find_prefix(
        &self,
        prompt: &[u32],
        salt: Option<&str>,
        count: bool,
    ) -> PrefixMatch<B::Sequence> {
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
        if !count {
            return match found {
                Some((seq, lease)) if lease.position() > 0 && lease.position() < prompt.len() => {
                    PrefixMatch {
                        seq,
                        cached_tokens: lease.position(),
                        logits: None,
                        lease: Some(lease),
                    }
                }
                _ => fresh(),
            };
        }
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

pub(super) struct PrefixMatch<S> {
    pub seq: S,
    pub cached_tokens: usize,
    /// On a full hit: the stored logits after the whole prompt.
    pub logits: Option<Vec<f32>>,
    pub lease: Option<Lease>,
}
