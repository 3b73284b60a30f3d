//! The scheduler: continuous batching in the spirit of vLLM v1. Every
//! engine step runs one [`Backend::step`] over all running requests — a
//! decode token for each request that is generating, a chunk of the prompt
//! for those still reading it — and then samples and streams every request
//! whose step reached the end of its context.
//!
//! Per step, in order:
//! 1. **Cancellation**: requests whose handle was dropped or cancelled end
//!    now and free their slot and memory.
//! 2. **Budget** (`max_num_batched_tokens`): every running request that
//!    decodes gets its one token first; the rest of the budget goes to prompt
//!    chunks (at most `prefill_while_decoding` tokens while any request
//!    decodes, and at most `long_prompt_chunk` of one request whose context
//!    is longer than the budget), oldest request first (a chunk also ends
//!    at a prefix-cache snapshot point its pass cannot stage inside, and one
//!    the budget cuts stays on [`Backend::pass_snapshot_stride`] while
//!    points lie beyond it). A request running alone gets its whole prompt
//!    at once (nothing else waits on its chunks: its TTFT is as before
//!    batching).
//! 3. **Memory** (where the backend reports a [`Backend::kv_capacity`]):
//!    each running request reserves [`Backend::sequence_bytes`] of its whole
//!    context (prompt and tokens so far). While the reservations exceed the
//!    capacity, the newest running request is preempted: its sequence is
//!    dropped, it keeps its context and sampler, and it waits (ahead of new
//!    requests) to be recomputed from its tokens — through the prefix cache
//!    where a snapshot covers them — and resumes with the same tokens it
//!    would have produced. A request that fits alone always fits
//!    ([`super::EngineService::validate`] refuses the others), so the oldest
//!    always runs: no out-of-memory error, no request failed for its batch-mates.
//! 4. **Admission** (only in a step that preempted nothing): preempted
//!    requests first, then the queue, first come first served, while there
//!    are fewer than `max_num_seqs`, budget is left and the request's whole
//!    context fits beside the reservations.

use super::metrics::Phase;
use super::sequence::Running;
use super::worker::Worker;
use crate::backend::{Backend, StepOut, Taken};
use crate::generate::FinishReason;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

/// The scheduler's limits, resolved from the service config and the backend.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// Prompt tokens a step may read while running requests decode (at
    /// most `max_num_batched_tokens`).
    pub prefill_while_decoding: usize,
    /// Prompt tokens a step may read of one request whose context is longer
    /// than `max_num_batched_tokens` while running requests decode
    /// (`usize::MAX`: no limit).
    pub long_prompt_chunk: usize,
    /// [`Backend::kv_capacity`].
    pub kv_capacity: Option<usize>,
}

pub(super) struct Scheduler<B: Backend> {
    limits: Limits,
    /// Requests holding a sequence, oldest first.
    running: Vec<Running<B>>,
    /// Requests preempted, oldest first: they resume before new ones start.
    preempted: VecDeque<Running<B>>,
    next_order: u64,
}

/// A panic's message.
fn panic_text(panic: Box<dyn std::any::Any + Send>) -> String {
    let msg = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    format!("the engine panicked: {msg}")
}

/// Ends a request that failed: its state (sequence, staged snapshots) is
/// dropped before its terminal event is published, so whoever sees the
/// failure sees the memory back.
fn fail<B: Backend>(w: &Worker<B>, r: Running<B>, msg: String) {
    let (job, started) = (r.job.clone(), r.started);
    drop(r);
    w.end(&job, started, Err(msg));
}

impl<B: Backend> Scheduler<B> {
    pub fn new(limits: Limits) -> Self {
        Scheduler {
            limits,
            running: Vec::new(),
            preempted: VecDeque::new(),
            next_order: 0,
        }
    }

    /// Engine steps until the service is gone and nothing is left.
    pub fn run(mut self, w: &Worker<B>) {
        loop {
            if self.running.is_empty() && self.preempted.is_empty() && !w.queue.wait_for_work() {
                return;
            }
            self.reap_cancelled(w);
            let grants = self.schedule(w);
            self.execute(w, &grants);
            self.advance(w);
            w.metrics.set_scheduler(
                self.running.len(),
                self.preempted.len(),
                self.held_bytes(w),
                self.limits.kv_capacity,
            );
        }
    }

    fn bytes(w: &Worker<B>, tokens: usize) -> usize {
        w.backend.sequence_bytes(tokens)
    }

    /// What the running sequences hold now.
    fn held_bytes(&self, w: &Worker<B>) -> usize {
        self.running
            .iter()
            .map(|r| Self::bytes(w, r.computed))
            .sum()
    }

    /// Ends the requests (running or preempted) whose caller went away.
    fn reap_cancelled(&mut self, w: &Worker<B>) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].job.is_cancelled() {
                let mut r = self.running.remove(i);
                let f = r.finish(FinishReason::Cancelled, None);
                w.end(&r.job, r.started, Ok(f));
            } else {
                i += 1;
            }
        }
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.preempted)
            .into_iter()
            .partition(|r| r.job.is_cancelled());
        self.preempted = kept.into();
        for mut r in gone {
            let f = r.finish(FinishReason::Cancelled, None);
            w.end(&r.job, r.started, Ok(f));
        }
    }

    /// Tokens per running request this step (0: none), after preempting
    /// what memory cannot hold and admitting what it can.
    fn schedule(&mut self, w: &Worker<B>) -> Vec<usize> {
        let l = self.limits;
        // Decode tokens first, so running streams keep flowing.
        let mut grants: Vec<usize> = self
            .running
            .iter()
            .map(|r| usize::from(r.wants() == 1))
            .collect();
        let decoding: usize = grants.iter().sum();
        let budget = l.max_num_batched_tokens.saturating_sub(decoding);
        // The rest for prompts: fewer while streams decode (a step's time
        // is theirs to wait for).
        let mut prompt_left = if decoding > 0 {
            budget.min(l.prefill_while_decoding)
        } else {
            budget
        };
        // A prompt longer than a step's budget is read in steps anyway:
        // beside decoding streams, in small ones.
        let room = |r: &Running<B>, left: usize| {
            if decoding > 0 && r.context.len() > l.max_num_batched_tokens {
                left.min(l.long_prompt_chunk)
            } else {
                left
            }
        };
        for (r, g) in self.running.iter().zip(grants.iter_mut()) {
            if *g == 0 {
                *g = r.grant(room(r, prompt_left));
                prompt_left -= *g;
            }
        }
        // Memory: preempt the newest while the reservations exceed it.
        let reserve = |r: &Running<B>| Self::bytes(w, r.context.len());
        let mut reserved: usize = self.running.iter().map(reserve).sum();
        let mut preempted_now = false;
        if let Some(cap) = l.kv_capacity {
            while reserved > cap && self.running.len() > 1 {
                let mut r = self.running.pop().expect("more than one");
                grants.pop().expect("one grant per request");
                reserved -= reserve(&r);
                r.preempt();
                w.metrics.record_preemption();
                preempted_now = true;
                let at = self.preempted.partition_point(|p| p.order < r.order);
                self.preempted.insert(at, r);
            }
        }
        // Admission: the preempted first, then the queue (FIFO).
        while !preempted_now && self.running.len() < l.max_num_seqs && prompt_left > 0 {
            let fits = |tokens: usize| {
                l.kv_capacity
                    .is_none_or(|cap| reserved + Self::bytes(w, tokens) <= cap)
            };
            let r = if let Some(front) = self.preempted.front() {
                if !fits(front.context.len()) {
                    break;
                }
                let mut r = self.preempted.pop_front().expect("a front request");
                // A panic in the backend (restore) fails this request only.
                if let Err(panic) = catch_unwind(AssertUnwindSafe(|| r.resume(w))) {
                    fail(w, r, panic_text(panic));
                    continue;
                }
                r
            } else {
                let Some(job) = w.queue.admit(|j| fits(j.req.prompt.len())) else {
                    break;
                };
                w.metrics.observe_queue_wait(job.submitted.elapsed());
                self.next_order += 1;
                let order = self.next_order;
                let started =
                    catch_unwind(AssertUnwindSafe(|| Running::start(w, job.clone(), order)));
                match started {
                    Ok(Ok(r)) => r,
                    Ok(Err((job, f))) => {
                        w.end(&job, Instant::now(), Ok(*f));
                        continue;
                    }
                    Err(panic) => {
                        w.end(&job, Instant::now(), Err(panic_text(panic)));
                        continue;
                    }
                }
            };
            reserved += reserve(&r);
            let g = r.grant(room(&r, prompt_left));
            prompt_left -= g;
            grants.push(g);
            self.running.push(r);
        }
        // Alone: the whole prompt in one pass (up to a snapshot point it
        // cannot stage inside).
        if let [r] = &self.running[..] {
            grants[0] = r.wants();
        }
        grants
    }

    /// One backend step over the granted rows; each row's result goes to
    /// its request (a failed row fails its request only; a panic in the
    /// step fails the step's rows).
    fn execute(&mut self, w: &Worker<B>, grants: &[usize]) {
        let rows = grants.iter().filter(|&&g| g > 0).count();
        if rows == 0 {
            return;
        }
        let t0 = Instant::now();
        let mut prefill = 0;
        let (outs, mut taken) = {
            let mut items = Vec::with_capacity(rows);
            for (r, &g) in self.running.iter_mut().zip(grants) {
                if g > 0 {
                    if !r.decodes() {
                        prefill += g;
                    }
                    items.push(r.item(g));
                }
            }
            let outs = catch_unwind(AssertUnwindSafe(|| w.backend.step(&mut items)));
            let taken: Vec<Taken> = items
                .iter_mut()
                .map(|it| std::mem::take(&mut it.snapshots.taken))
                .collect();
            (outs, taken)
        };
        taken.reverse();
        let took = t0.elapsed();
        w.metrics.record_step(rows, prefill, took);
        let total: usize = grants.iter().sum();
        let mut outs: Vec<Result<StepOut, String>> = match outs {
            Ok(v) if v.len() == rows => v
                .into_iter()
                .map(|o| o.map_err(|e| format!("generation failed: {e:#}")))
                .collect(),
            Ok(v) => {
                let msg = format!("the backend returned {} results for {rows} rows", v.len());
                (0..rows).map(|_| Err(msg.clone())).collect()
            }
            Err(panic) => {
                let msg = panic_text(panic);
                (0..rows).map(|_| Err(msg.clone())).collect()
            }
        };
        outs.reverse();
        let mut failed = Vec::new();
        for (i, (r, &g)) in self.running.iter_mut().zip(grants).enumerate() {
            if g == 0 {
                continue;
            }
            if r.before_first_token() {
                // The step's time, shared by its tokens.
                w.metrics
                    .add_phase(Phase::Prefill, took.mul_f64(g as f64 / total as f64));
            }
            let out = outs.pop().expect("one result per row");
            let snaps = taken.pop().expect("one item per row");
            let res =
                out.and_then(
                    |o| match catch_unwind(AssertUnwindSafe(|| r.took(w, g, o, snaps))) {
                        Ok(res) => res.map_err(|e| format!("{e:#}")),
                        Err(panic) => Err(panic_text(panic)),
                    },
                );
            if let Err(msg) = res {
                failed.push((i, msg));
            }
        }
        for (i, msg) in failed.into_iter().rev() {
            fail(w, self.running.remove(i), msg);
        }
    }

    /// Samples and streams every request whose step reached its context's
    /// end; ends those that are done.
    fn advance(&mut self, w: &Worker<B>) {
        let mut i = 0;
        while i < self.running.len() {
            let r = &mut self.running[i];
            if !r.ready {
                i += 1;
                continue;
            }
            match catch_unwind(AssertUnwindSafe(|| r.advance(w))) {
                Ok(None) => i += 1,
                Ok(Some(f)) => {
                    let r = self.running.remove(i);
                    w.end(&r.job, r.started, Ok(f));
                }
                Err(panic) => fail(w, self.running.remove(i), panic_text(panic)),
            }
        }
    }
}
