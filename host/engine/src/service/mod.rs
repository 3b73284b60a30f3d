//! The engine service: one device worker thread that owns the backend and runs
//! requests from a bounded FIFO queue, and the async API the HTTP layer calls.
//!
//! ```text
//! tokio task ── submit() ──► validate ──► Queue (bounded FIFO) ──► device worker thread
//!      ▲                                                              │ owns the Backend
//!      └── GenerationHandle ◄── per-request event stream ◄────────────┘ runs one request
//! ```
//!
//! * [`EngineService::submit`] validates a request, enqueues it and resolves
//!   once the worker has *started* it, so queue errors (full, timeout,
//!   shutting down) are known before a response is sent. Dropping the future
//!   before then takes the request out of the queue.
//! * The worker streams [`Event`]s into the request's [`GenerationHandle`] as
//!   tokens are sampled. Dropping the handle cancels: the worker stops within
//!   one decode step and takes the next request.
//! * A panic inside the backend fails that one request ([`Event::Failed`]);
//!   the worker keeps serving.
//!
//! The worker runs the [`scheduler`]: up to `max_num_seqs` requests at
//! once, every engine step one batched [`Backend::step`] over all of them
//! (decode tokens and prompt chunks under `max_num_batched_tokens`),
//! admission and preemption by the backend's memory (docs/SCHEDULER.md).
//! The queue holds the requests not yet started.
//!
//! The engine owns no async runtime: the worker is a std thread and the
//! async side uses tokio's runtime-agnostic `sync` primitives plus
//! `tokio::time::timeout` (the caller's runtime must have its time driver on).

mod budget;
mod handle;
mod metrics;
mod queue;
mod scheduler;
mod sequence;
mod worker;

pub use handle::GenerationHandle;
pub use metrics::{Phase, STEP_DURATION, STEP_PHASES};

use crate::backend::Backend;
use crate::config::ModelConfig;
use crate::generate::{FinishReason, GenerateRequest};
use crate::prefix_cache::{CacheStats, PrefixCache};
use crate::sampling::Sampled;
use crate::tokenizer::Tokenizer;
use metrics::Metrics;
use queue::{Job, Queue};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Operator settings for the service.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// Requests that may wait (not counting the running ones); beyond it
    /// submits fail with [`SubmitError::QueueFull`].
    pub max_queue: usize,
    /// A request that waited longer than this fails with
    /// [`SubmitError::QueueTimeout`]. `Duration::ZERO` waits forever.
    pub queue_timeout: Duration,
    /// Prompt + `max_tokens` must fit; the effective limit is the minimum of
    /// this and the model's context length. 0 = the model's context length.
    pub max_model_len: usize,
    /// Longest prompt accepted, in tokens; 0 = no cap.
    pub max_prompt_tokens: usize,
    /// Largest `max_tokens` accepted; 0 = no cap.
    pub max_completion_tokens: usize,
    /// Prefix-cache budget in bytes (in device memory on a GPU backend); 0
    /// turns the prefix cache off.
    pub prefix_cache_bytes: usize,
    /// Host-memory tier of the prefix cache for backends with device memory:
    /// snapshots the device budget pushes out are copied here (and restored
    /// from here) instead of being dropped. 0 = no host tier.
    pub prefix_cache_host_bytes: usize,
    /// Snapshot every this many prompt tokens during a prefill (0 = only at
    /// prompt ends, guest marks and generation ends). See docs/PREFIX_CACHE.md
    /// for how the default was chosen.
    pub snapshot_interval: usize,
    /// Requests running at once (each engine step decodes all of them);
    /// 0 = the backend's default ([`Backend::default_max_num_seqs`]).
    pub max_num_seqs: usize,
    /// Tokens one engine step may run over all its sequences: every decode
    /// token, then prompt chunks up to it (at least `max_num_seqs`); 0 =
    /// [`DEFAULT_MAX_NUM_BATCHED_TOKENS`].
    pub max_num_batched_tokens: usize,
    /// Prompt tokens one engine step may read while running requests
    /// decode, so a long prompt's chunks do not stall their streams for
    /// long; 0 = up to `max_num_batched_tokens`. A request running alone
    /// still reads its whole prompt in one pass.
    pub prefill_while_decoding: usize,
    /// Prompt tokens one engine step may read of a request whose context is
    /// longer than `max_num_batched_tokens` (a prompt read in several steps
    /// anyway) while other requests decode, so such a prompt does not stall
    /// their streams for a whole budget's pass at each of its chunks; shorter
    /// prompts are not cut. 0 (the default) = no limit: docs/SCHEDULER.md
    /// says what it costs and why it is off.
    pub long_prompt_chunk: usize,
    /// Bytes the running sequences' states may hold together (0 = the
    /// backend's [`Backend::kv_capacity`]): it replaces the backend's
    /// budget, smaller or larger (`--kv-cache-mib`; larger than the
    /// backend's is said at startup, since the passes' work buffers may
    /// then not fit).
    pub kv_cache_bytes: usize,
}

/// Default [`ServiceConfig::max_num_batched_tokens`]: a prompt chunk of
/// this size keeps the running streams' inter-token latency within a few
/// decode steps while long prompts still run in large passes.
pub const DEFAULT_MAX_NUM_BATCHED_TOKENS: usize = 2048;

/// Default [`ServiceConfig::snapshot_interval`], chosen by measurement on
/// the demo model (docs/PREFIX_CACHE.md).
pub const DEFAULT_SNAPSHOT_INTERVAL: usize = 1024;

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            max_queue: 64,
            queue_timeout: Duration::from_secs(60),
            max_model_len: 0,
            max_prompt_tokens: 0,
            max_completion_tokens: 0,
            prefix_cache_bytes: 0,
            prefix_cache_host_bytes: 0,
            snapshot_interval: DEFAULT_SNAPSHOT_INTERVAL,
            max_num_seqs: 0,
            max_num_batched_tokens: 0,
            prefill_while_decoding: 0,
            long_prompt_chunk: 0,
            kv_cache_bytes: 0,
        }
    }
}

/// Per-request options besides the generation request itself.
#[derive(Default, Clone, Debug)]
pub struct SubmitOptions {
    /// Isolates prefix-cache entries between tenants: a request only reuses
    /// snapshots made under the same salt.
    pub cache_salt: Option<String>,
    /// Prompt positions worth snapshotting (message boundaries); positions
    /// outside `1..prompt_len` are ignored.
    pub snapshot_points: Vec<usize>,
    /// Fill [`Event::Token::text`] with UTF-8-complete text deltas
    /// (special tokens skipped). Without a tokenizer the text stays empty.
    pub detokenize: bool,
    /// Hold the output to this constraint ([`crate::constraint`]).
    pub constraint: Option<crate::constraint::Compiled>,
}

/// Why a request was not started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The queue is full; retry after about this many seconds (>= 1).
    QueueFull {
        retry_after_s: u32,
    },
    /// The request waited in the queue past `queue_timeout`.
    QueueTimeout,
    /// The service is draining (or stopped) and accepts no new requests.
    ShuttingDown,
    /// Prompt + completion do not fit the context, or the prompt is over the
    /// operator's cap.
    ContextLengthExceeded(String),
    InvalidRequest(String),
    Internal(String),
}

impl SubmitError {
    /// The OpenAI-style error code.
    pub fn code(&self) -> &'static str {
        match self {
            SubmitError::QueueFull { .. } => "queue_full",
            SubmitError::QueueTimeout => "queue_timeout",
            SubmitError::ShuttingDown => "service_shutting_down",
            SubmitError::ContextLengthExceeded(_) => "context_length_exceeded",
            SubmitError::InvalidRequest(_) => "invalid_request_error",
            SubmitError::Internal(_) => "internal_error",
        }
    }

    pub fn http_status(&self) -> u16 {
        match self {
            SubmitError::QueueFull { .. } => 429,
            SubmitError::QueueTimeout | SubmitError::ShuttingDown => 503,
            SubmitError::ContextLengthExceeded(_) | SubmitError::InvalidRequest(_) => 400,
            SubmitError::Internal(_) => 500,
        }
    }

    /// Seconds for a `Retry-After` header, where one applies.
    pub fn retry_after_s(&self) -> Option<u32> {
        match self {
            SubmitError::QueueFull { retry_after_s } => Some(*retry_after_s),
            _ => None,
        }
    }
}

impl fmt::Display for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubmitError::QueueFull { retry_after_s } => write!(
                f,
                "the server is at capacity (request queue full); retry after {retry_after_s} s"
            ),
            SubmitError::QueueTimeout => {
                write!(
                    f,
                    "the request waited too long in the queue; try again later"
                )
            }
            SubmitError::ShuttingDown => {
                write!(f, "the server is shutting down and accepts no new requests")
            }
            SubmitError::ContextLengthExceeded(m)
            | SubmitError::InvalidRequest(m)
            | SubmitError::Internal(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for SubmitError {}

/// What a running request reports, in order: any number of `Token`s, then
/// exactly one terminal event (`Finished` or `Failed`).
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// One generated token (never the stop token that ended generation).
    Token {
        id: u32,
        /// The text this token completed (with [`SubmitOptions::detokenize`]);
        /// may be empty while a multi-byte character is incomplete.
        text: String,
        /// With `sampling.logprobs` set: the token's logprob and alternatives.
        logprob: Option<Sampled>,
    },
    Finished {
        reason: FinishReason,
        usage: Usage,
        /// The stop/EOS token that ended generation (`reason == Stop`).
        stop_token: Option<u32>,
        /// Text the decoder held back (an incomplete character, as U+FFFD).
        trailing_text: String,
    },
    /// The engine failed while running the request (backend error or panic).
    Failed(String),
}

impl Event {
    pub fn is_terminal(&self) -> bool {
        !matches!(self, Event::Token { .. })
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    /// Every token the model sampled for the request, the stop token included
    /// (as vLLM counts).
    pub completion_tokens: u32,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
}

/// A snapshot of the queue and the totals served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Requests waiting to start.
    pub queued: usize,
    /// Requests started and not ended (running, or preempted to resume).
    pub running: usize,
    /// `max_queue`.
    pub capacity: usize,
    pub draining: bool,
    /// Requests that ended with `Finished` (any reason but cancelled).
    pub completed: u64,
    /// Requests that ended cancelled.
    pub cancelled: u64,
    /// Requests that ended with `Failed`.
    pub failed: u64,
    /// Submits refused for queue reasons (full, timeout, shutting down).
    pub rejected: u64,
}

/// The engine service. Cheap to clone; every clone talks to the same worker.
/// The worker thread exits once every clone is dropped and the queue is empty.
#[derive(Clone)]
pub struct EngineService {
    inner: Arc<Inner>,
}

struct Inner {
    queue: Arc<Queue>,
    metrics: Arc<Metrics>,
    cache: Option<Arc<PrefixCache>>,
    model_id: String,
    model_config: ModelConfig,
    cfg: ServiceConfig,
    tokenizer: Option<Tokenizer>,
    /// `min(cfg.max_model_len, model context)`.
    context_limit: usize,
    /// The longest context one sequence may reach within the backend's
    /// memory ([`Backend::kv_capacity`]); `usize::MAX` when not limited.
    memory_limit: usize,
    limits: scheduler::Limits,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.queue.close();
    }
}

impl EngineService {
    /// Spawns the device worker thread, which owns `backend`.
    pub fn start<B: Backend + 'static>(
        backend: B,
        tokenizer: Option<Tokenizer>,
        model_id: String,
        cfg: ServiceConfig,
    ) -> Self {
        let model_config = backend.config().clone();
        let model_ctx = model_config.max_position_embeddings;
        let context_limit = if cfg.max_model_len == 0 {
            model_ctx
        } else {
            cfg.max_model_len.min(model_ctx)
        };
        let max_num_seqs = match cfg.max_num_seqs {
            0 => backend.default_max_num_seqs(),
            n => n,
        }
        .max(1);
        let max_num_batched_tokens = match cfg.max_num_batched_tokens {
            0 => DEFAULT_MAX_NUM_BATCHED_TOKENS,
            n => n,
        }
        .max(max_num_seqs);
        let measured = backend.kv_capacity();
        let kv_capacity = budget::kv_capacity(measured, cfg.kv_cache_bytes);
        let limits = scheduler::Limits {
            max_num_seqs,
            max_num_batched_tokens,
            prefill_while_decoding: match cfg.prefill_while_decoding {
                0 => max_num_batched_tokens,
                n => n.min(max_num_batched_tokens),
            },
            long_prompt_chunk: match cfg.long_prompt_chunk {
                0 => usize::MAX,
                n => n,
            },
            kv_capacity,
        };
        let memory_limit = budget::memory_limit(&backend, kv_capacity, context_limit);
        for line in budget::startup_lines(
            &backend,
            measured,
            cfg.kv_cache_bytes,
            kv_capacity,
            memory_limit,
            context_limit,
        ) {
            eprintln!("[engine] {line}");
        }
        let queue = Arc::new(Queue::new(max_num_seqs));
        let metrics = Arc::new(Metrics::new());
        let cache = (cfg.prefix_cache_bytes > 0).then(|| {
            Arc::new(PrefixCache::with_host_tier(
                cfg.prefix_cache_bytes,
                cfg.prefix_cache_host_bytes,
            ))
        });
        worker::spawn(
            backend,
            tokenizer.clone(),
            context_limit,
            queue.clone(),
            metrics.clone(),
            cache.clone(),
            cfg.snapshot_interval,
            limits,
        );
        EngineService {
            inner: Arc::new(Inner {
                queue,
                metrics,
                cache,
                model_id,
                model_config,
                cfg,
                tokenizer,
                context_limit,
                memory_limit,
                limits,
            }),
        }
    }

    /// Requests that run at once (`max_num_seqs`, resolved).
    pub fn max_num_seqs(&self) -> usize {
        self.inner.limits.max_num_seqs
    }

    /// Tokens per engine step (`max_num_batched_tokens`, resolved).
    pub fn max_num_batched_tokens(&self) -> usize {
        self.inner.limits.max_num_batched_tokens
    }

    pub fn model_id(&self) -> &str {
        &self.inner.model_id
    }

    pub fn config(&self) -> &ServiceConfig {
        &self.inner.cfg
    }

    pub fn model_config(&self) -> &ModelConfig {
        &self.inner.model_config
    }

    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.inner.tokenizer.as_ref()
    }

    /// The longest prompt + completion a request may ask for.
    pub fn max_model_len(&self) -> usize {
        self.inner.context_limit
    }

    /// Checks a request without queueing it (what [`submit`](Self::submit)
    /// checks first).
    pub fn validate(&self, req: &GenerateRequest) -> Result<(), SubmitError> {
        let vocab = self.inner.model_config.vocab_size;
        let cfg = &self.inner.cfg;
        let limit = self.inner.context_limit;
        if req.prompt.is_empty() {
            return Err(SubmitError::InvalidRequest(
                "the prompt must contain at least one token".into(),
            ));
        }
        if let Some(&t) = req.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(SubmitError::InvalidRequest(format!(
                "prompt token id {t} is out of range (the vocabulary has {vocab} tokens)"
            )));
        }
        if let Some(&t) = req.stop_token_ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(SubmitError::InvalidRequest(format!(
                "stop token id {t} is out of range (the vocabulary has {vocab} tokens)"
            )));
        }
        if let Err(e) = req.sampling.validate(vocab) {
            return Err(SubmitError::InvalidRequest(format!("{e:#}")));
        }
        if cfg.max_prompt_tokens > 0 && req.prompt.len() > cfg.max_prompt_tokens {
            return Err(SubmitError::ContextLengthExceeded(format!(
                "the prompt has {} tokens but this server accepts at most {} prompt tokens",
                req.prompt.len(),
                cfg.max_prompt_tokens
            )));
        }
        if cfg.max_completion_tokens > 0 && req.max_tokens > cfg.max_completion_tokens {
            return Err(SubmitError::InvalidRequest(format!(
                "max_tokens is {} but this server allows at most {}",
                req.max_tokens, cfg.max_completion_tokens
            )));
        }
        let total = req.prompt.len().saturating_add(req.max_tokens);
        if req.prompt.len() >= limit || total > limit {
            return Err(SubmitError::ContextLengthExceeded(format!(
                "this model's maximum context length is {limit} tokens, but {total} tokens \
                 were requested ({} in the prompt, {} for the completion); \
                 reduce the prompt or max_tokens",
                req.prompt.len(),
                req.max_tokens
            )));
        }
        if self.inner.memory_limit == 0 {
            return Err(SubmitError::ContextLengthExceeded(
                "this server's KV memory budget holds no sequence of this model, so it \
                 refuses every request; its operator can set a larger one with --kv-cache-mib"
                    .into(),
            ));
        }
        if total > self.inner.memory_limit {
            return Err(SubmitError::ContextLengthExceeded(format!(
                "{total} tokens were requested ({} in the prompt, {} for the completion) \
                 but one sequence fits at most {} tokens in this server's KV memory; \
                 reduce the prompt or max_tokens",
                req.prompt.len(),
                req.max_tokens,
                self.inner.memory_limit
            )));
        }
        Ok(())
    }

    /// Validates, enqueues, and resolves once the worker has started the
    /// request. Dropping the future before then removes it from the queue.
    pub async fn submit(
        &self,
        req: GenerateRequest,
        opts: SubmitOptions,
    ) -> Result<GenerationHandle, SubmitError> {
        self.validate(&req)?;
        let (job, started) = Job::new(req, opts);
        let metrics = &self.inner.metrics;
        if let Err(e) = self.inner.queue.push(&job, self.inner.cfg.max_queue) {
            let e = match e {
                queue::PushError::Full => SubmitError::QueueFull {
                    retry_after_s: metrics.retry_after_s(),
                },
                queue::PushError::Draining => SubmitError::ShuttingDown,
                queue::PushError::Closed => {
                    return Err(SubmitError::Internal(
                        "the engine worker has stopped".into(),
                    ));
                }
            };
            metrics.record_rejected(&e);
            return Err(e);
        }
        // From here until the worker starts it, dropping this future (or
        // timing out) takes the request back out of the queue.
        let mut guard = Abandon {
            queue: &self.inner.queue,
            job: job.clone(),
            armed: true,
        };
        let timeout = self.inner.cfg.queue_timeout;
        let outcome = if timeout.is_zero() {
            Ok(started.await)
        } else {
            tokio::time::timeout(timeout, started).await
        };
        let started = match outcome {
            Ok(r) => r,
            Err(_elapsed) => {
                if job.abandon() {
                    guard.armed = false;
                    self.inner.queue.remove(&job);
                    let e = SubmitError::QueueTimeout;
                    metrics.record_rejected(&e);
                    return Err(e);
                }
                // The worker started it just as the timeout fired: take it.
                Ok(())
            }
        };
        guard.armed = false;
        match started {
            Ok(()) => Ok(GenerationHandle::new(job)),
            // The worker dropped the job unstarted: it stopped.
            Err(_) => Err(SubmitError::Internal(
                "the engine worker has stopped".into(),
            )),
        }
    }

    pub fn stats(&self) -> QueueStats {
        let (queued, running, draining) = self.inner.queue.snapshot();
        let m = &self.inner.metrics;
        QueueStats {
            queued,
            running,
            capacity: self.inner.cfg.max_queue,
            draining,
            completed: m.completed(),
            cancelled: m.cancelled(),
            failed: m.failed(),
            rejected: m.rejected(),
        }
    }

    /// Prometheus text exposition (format 0.0.4).
    pub fn metrics_text(&self) -> String {
        let q = &self.inner.queue;
        self.inner
            .metrics
            .render(q.depth(), q.running(), self.prefix_cache_stats())
    }

    /// The prefix cache (`None` when it is off).
    pub fn prefix_cache(&self) -> Option<&Arc<PrefixCache>> {
        self.inner.cache.as_ref()
    }

    pub fn prefix_cache_stats(&self) -> Option<CacheStats> {
        self.inner.cache.as_ref().map(|c| c.stats())
    }

    /// Refuse new submits with `ShuttingDown`; queued requests still run.
    pub fn begin_drain(&self) {
        self.inner.queue.begin_drain();
    }

    /// Resolves once draining has begun and nothing is queued or running.
    pub async fn drained(&self) {
        self.inner.queue.drained().await
    }

    /// The host reports each request's final HTTP status.
    pub fn record_http(&self, status: u16) {
        self.inner.metrics.record_http(status);
    }
}

/// Takes a not-yet-started request out of the queue when `submit` is dropped.
struct Abandon<'a> {
    queue: &'a Queue,
    job: Arc<Job>,
    armed: bool,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if self.job.abandon() {
            self.queue.remove(&self.job);
        } else {
            // The worker won the race: the request already runs but nobody
            // will hold its handle, so it stops at its first token.
            self.job.cancel();
        }
    }
}
