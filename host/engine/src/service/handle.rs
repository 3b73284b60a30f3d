//! The per-request event stream and the caller's handle on it.

use super::queue::{Job, lock};
use super::{Event, Usage};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Events from the worker to one request's handle: an unbounded buffer the
/// worker appends to and the handle drains in batches.
#[derive(Default)]
pub(super) struct Stream {
    state: Mutex<StreamState>,
    notify: Notify,
}

#[derive(Default)]
struct StreamState {
    events: Vec<Event>,
    /// The worker pushed the terminal event (nothing is accepted after it).
    terminal_pushed: bool,
    /// `try_next` returned the terminal event.
    terminal_taken: bool,
}

impl Stream {
    /// Appends an event; anything after the terminal event is dropped.
    pub fn push(&self, ev: Event) {
        {
            let mut s = lock(&self.state);
            if s.terminal_pushed {
                return;
            }
            s.terminal_pushed = ev.is_terminal();
            s.events.push(ev);
        }
        self.notify.notify_waiters();
    }
}

/// A started request. Dropping it cancels the request: the worker stops
/// within one decode step and takes the next one.
pub struct GenerationHandle {
    job: Arc<Job>,
}

impl GenerationHandle {
    pub(super) fn new(job: Arc<Job>) -> Self {
        GenerationHandle { job }
    }

    /// Everything available now, in order; empty once the terminal event
    /// (`Finished` or `Failed`) has been returned.
    pub fn try_next(&mut self) -> Vec<Event> {
        let mut s = lock(&self.job.stream.state);
        let events = std::mem::take(&mut s.events);
        if events.last().is_some_and(Event::is_terminal) {
            s.terminal_taken = true;
        }
        events
    }

    /// Resolves when `try_next` would return something, or at once if the
    /// terminal event was already returned.
    pub async fn wait(&self) {
        let stream = &self.job.stream;
        loop {
            let notified = stream.notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            {
                let s = lock(&stream.state);
                if !s.events.is_empty() || s.terminal_taken {
                    return;
                }
            }
            notified.await;
        }
    }

    /// True once `try_next` has returned the terminal event.
    pub fn is_done(&self) -> bool {
        lock(&self.job.stream.state).terminal_taken
    }

    /// Asks the worker to stop this request (as dropping the handle does);
    /// a `Finished { reason: Cancelled, .. }` event follows.
    pub fn cancel(&self) {
        self.job.cancel();
    }

    /// Prompt length of the request.
    pub fn prompt_tokens(&self) -> usize {
        self.job.req.prompt.len()
    }

    /// The usage so far: the prompt length, the tokens sampled so far (the
    /// stop token included; possibly ahead of the events `try_next`
    /// returned) and the prompt tokens served from the prefix cache (0
    /// until the lookup is done, which precedes the first event). Once the
    /// request has ended it equals the usage of its `Finished` event.
    pub fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.job.req.prompt.len() as u32,
            completion_tokens: self.job.sampled.load(Ordering::Acquire),
            cached_tokens: self.job.cached_tokens.load(Ordering::Acquire),
        }
    }
}

impl Drop for GenerationHandle {
    fn drop(&mut self) {
        self.job.cancel();
    }
}

impl std::fmt::Debug for GenerationHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GenerationHandle")
            .field("prompt_tokens", &self.job.req.prompt.len())
            .field("done", &self.is_done())
            .finish()
    }
}
