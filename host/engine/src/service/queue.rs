//! The bounded FIFO queue between submitters (async tasks) and the device
//! worker (a std thread), and the per-request job record they share.

use super::SubmitOptions;
use super::handle::Stream;
use crate::generate::GenerateRequest;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;
use tokio::sync::{Notify, oneshot};

/// Locks, ignoring poisoning: every critical section here leaves the data
/// consistent, and a panic elsewhere must not wedge the service.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

const QUEUED: u8 = 0;
const STARTED: u8 = 1;
const ABANDONED: u8 = 2;

/// One request from submit to its terminal event.
pub(super) struct Job {
    pub req: GenerateRequest,
    pub opts: SubmitOptions,
    /// When `submit` enqueued it (queue wait, TTFT and duration count from here).
    pub submitted: Instant,
    /// QUEUED -> STARTED (worker) or QUEUED -> ABANDONED (submitter gave up).
    state: AtomicU8,
    /// Set when the handle is dropped or cancelled; checked once per token.
    cancelled: AtomicBool,
    started_tx: Mutex<Option<oneshot::Sender<()>>>,
    pub stream: Stream,
    /// Tokens sampled so far, the stop token included (set by the worker).
    pub sampled: AtomicU32,
    /// Prompt tokens served from the prefix cache (set by the worker once
    /// the lookup is done, before the first token).
    pub cached_tokens: AtomicU32,
}

impl Job {
    pub fn new(req: GenerateRequest, opts: SubmitOptions) -> (Arc<Job>, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let job = Job {
            req,
            opts,
            submitted: Instant::now(),
            state: AtomicU8::new(QUEUED),
            cancelled: AtomicBool::new(false),
            started_tx: Mutex::new(Some(tx)),
            stream: Stream::default(),
            sampled: AtomicU32::new(0),
            cached_tokens: AtomicU32::new(0),
        };
        (Arc::new(job), rx)
    }

    /// The worker claims the job; false if the submitter abandoned it.
    fn try_start(&self) -> bool {
        if self
            .state
            .compare_exchange(QUEUED, STARTED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        if let Some(tx) = lock(&self.started_tx).take() {
            // The receiver may be gone: either `submit` timed out in the same
            // instant (it then sees `abandon` fail and returns the handle
            // anyway) or `submit` was dropped (its guard cancels the job).
            let _ = tx.send(());
        }
        true
    }

    fn is_abandoned(&self) -> bool {
        self.state.load(Ordering::Acquire) == ABANDONED
    }

    /// The submitter gives up; false if the worker already started it.
    pub fn abandon(&self) -> bool {
        self.state
            .compare_exchange(QUEUED, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }
}

pub(super) enum PushError {
    Full,
    Draining,
    Closed,
}

struct State {
    waiting: VecDeque<Arc<Job>>,
    running: usize,
    draining: bool,
    /// No more submits: the service was dropped or the worker is gone.
    closed: bool,
}

pub(super) struct Queue {
    state: Mutex<State>,
    /// Wakes the worker when work arrives or the queue closes.
    work: Condvar,
    /// Wakes `drained()` waiters when the queue may have become idle.
    idle: Notify,
    /// Requests started and not ended (running or preempted): `max_num_seqs`.
    slots: usize,
    /// Lock-free mirrors for metrics.
    depth: AtomicUsize,
    running: AtomicUsize,
}

impl Queue {
    pub fn new(slots: usize) -> Self {
        Queue {
            state: Mutex::new(State {
                waiting: VecDeque::new(),
                running: 0,
                draining: false,
                closed: false,
            }),
            work: Condvar::new(),
            idle: Notify::new(),
            slots: slots.max(1),
            depth: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
        }
    }

    fn mirror(&self, s: &State) {
        self.depth.store(s.waiting.len(), Ordering::Relaxed);
        self.running.store(s.running, Ordering::Relaxed);
    }

    fn notify_if_idle(&self, s: &State) {
        if s.waiting.is_empty() && s.running == 0 {
            self.idle.notify_waiters();
        }
    }

    /// Enqueues unless that would leave more than `max_queue` requests
    /// waiting (a request that starts on a free slot at once never waits).
    pub fn push(&self, job: &Arc<Job>, max_queue: usize) -> Result<(), PushError> {
        let mut s = lock(&self.state);
        if s.closed {
            return Err(PushError::Closed);
        }
        if s.draining {
            return Err(PushError::Draining);
        }
        let free = self.slots.saturating_sub(s.running);
        if (s.waiting.len() + 1).saturating_sub(free) > max_queue {
            return Err(PushError::Full);
        }
        s.waiting.push_back(job.clone());
        self.mirror(&s);
        drop(s);
        self.work.notify_one();
        Ok(())
    }

    /// Takes a not-yet-started job out (its submitter gave up).
    pub fn remove(&self, job: &Arc<Job>) {
        let mut s = lock(&self.state);
        s.waiting.retain(|j| !Arc::ptr_eq(j, job));
        self.mirror(&s);
        self.notify_if_idle(&s);
    }

    /// Worker side, when it has nothing running: blocks until a job waits
    /// (true) or the queue is closed and empty (false).
    pub fn wait_for_work(&self) -> bool {
        let mut s = lock(&self.state);
        loop {
            s.waiting.retain(|j| !j.is_abandoned());
            self.mirror(&s);
            if !s.waiting.is_empty() {
                return true;
            }
            if s.closed {
                return false;
            }
            s = self.work.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Worker side, never blocking: starts the first waiting job (FIFO) if a
    /// slot is free and `fits` accepts it, marking it started (waking its
    /// submitter). `None` when nothing waits, no slot is free or the first
    /// job does not fit (it keeps its place).
    pub fn admit(&self, fits: impl Fn(&Job) -> bool) -> Option<Arc<Job>> {
        let mut s = lock(&self.state);
        if s.running >= self.slots {
            return None;
        }
        while let Some(job) = s.waiting.front() {
            if job.is_abandoned() {
                s.waiting.pop_front();
                continue;
            }
            if !fits(job) {
                break;
            }
            let job = s.waiting.pop_front().expect("a front job");
            if job.try_start() {
                s.running += 1;
                self.mirror(&s);
                return Some(job);
            }
        }
        self.mirror(&s);
        None
    }

    /// Worker side: a started job ended (any way); `publish` (pushing its
    /// terminal event) runs while the slot is released, under the lock.
    pub fn finish(&self, publish: impl FnOnce()) {
        let mut s = lock(&self.state);
        s.running = s.running.saturating_sub(1);
        self.mirror(&s);
        publish();
        self.notify_if_idle(&s);
    }

    pub fn begin_drain(&self) {
        let mut s = lock(&self.state);
        s.draining = true;
        self.notify_if_idle(&s);
    }

    pub async fn drained(&self) {
        loop {
            let notified = self.idle.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            {
                let s = lock(&self.state);
                if (s.draining || s.closed) && s.waiting.is_empty() && s.running == 0 {
                    return;
                }
            }
            notified.await;
        }
    }

    /// The service is gone: the worker exits once the queue is empty.
    pub fn close(&self) {
        lock(&self.state).closed = true;
        self.work.notify_all();
    }

    /// The worker thread exited: refuse everything, drop what waits (their
    /// submitters see the started channel close), release drain waiters.
    pub fn worker_gone(&self) {
        let mut s = lock(&self.state);
        s.closed = true;
        s.running = 0;
        let dropped: Vec<_> = s.waiting.drain(..).collect();
        self.mirror(&s);
        self.idle.notify_waiters();
        drop(s);
        drop(dropped);
    }

    /// (queued, running, draining)
    pub fn snapshot(&self) -> (usize, usize, bool) {
        let s = lock(&self.state);
        (s.waiting.len(), s.running, s.draining)
    }

    pub fn depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }
}
