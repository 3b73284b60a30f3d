//! Service metrics: atomics only, rendered as Prometheus text (format 0.0.4).

use super::SubmitError;
use crate::generate::FinishReason;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Buckets (seconds) for per-token latencies: 1 ms .. 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Buckets (seconds) for whole requests: 10 ms .. 10 min.
const DURATION_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// Buckets for sequences per engine step.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// Buckets for prompt tokens per engine step.
const PREFILL_BUCKETS: &[f64] = &[
    0.0, 1.0, 16.0, 64.0, 256.0, 1024.0, 2048.0, 4096.0, 8192.0, 32768.0, 131072.0,
];

/// The engine step histogram's name and its `phase` labels, in the order
/// of `Metrics::step_duration` (`qwasi bench --workload serving` reads them).
pub const STEP_DURATION: &str = "qwasi_step_duration_seconds";
pub const STEP_PHASES: [&str; 2] = ["decode", "prompt"];

/// A cumulative histogram over fixed buckets.
struct Histogram {
    bounds: &'static [f64],
    /// One per bound, then +Inf; non-cumulative (summed when rendered).
    counts: Vec<AtomicU64>,
    /// The sum of the observations in `unit`s (ns for durations, 1 for counts).
    sum: AtomicU64,
    unit: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self::with_unit(bounds, 1e-9)
    }

    fn with_unit(bounds: &'static [f64], unit: f64) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
            unit,
        }
    }

    fn observe(&self, d: Duration) {
        self.observe_units(d.as_nanos().min(u64::MAX as u128) as u64);
    }

    /// An observation of `units` (the value is `units * unit`).
    fn observe_units(&self, units: u64) {
        let v = units as f64 * self.unit;
        let i = self
            .bounds
            .iter()
            .position(|&b| v <= b)
            .unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Relaxed);
        self.sum.fetch_add(units, Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        self.render_series(out, name, "");
    }

    /// The buckets, sum and count, each with `labels` (`key="value",`, or
    /// empty) before the bucket's bound.
    fn render_series(&self, out: &mut String, name: &str, labels: &str) {
        let mut cum = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            cum += c.load(Relaxed);
            match self.bounds.get(i) {
                Some(b) => {
                    let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{b}\"}} {cum}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {cum}");
                }
            }
        }
        let sum = self.sum.load(Relaxed) as f64 * self.unit;
        let labels = labels.trim_end_matches(',');
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {sum}\n{name}_count{braces} {cum}");
    }
}

/// The steps between a request's start on the device and its first token,
/// timed per request and summed (`qwasi_first_token_phase_seconds_total`):
/// where a TTFT goes, beside the queue wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The prefix-cache lookup (the token trie and the lease).
    Lookup,
    /// Resuming the sequence from the snapshot found (the backend's restore).
    Restore,
    /// The prompt's uncached tokens, up to the logits on the host.
    Prefill,
    /// Copying the sequence state for the snapshots the request stages.
    Snapshot,
    /// Drawing the first token from the logits.
    Sample,
}

impl Phase {
    pub const ALL: [Phase; 5] = [
        Phase::Lookup,
        Phase::Restore,
        Phase::Prefill,
        Phase::Snapshot,
        Phase::Sample,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Lookup => "lookup",
            Phase::Restore => "restore",
            Phase::Prefill => "prefill",
            Phase::Snapshot => "snapshot",
            Phase::Sample => "sample",
        }
    }
}

/// HTTP statuses tracked by `record_http` (100..=599).
const STATUSES: usize = 600;

pub(super) struct Metrics {
    http: Vec<AtomicU64>,
    rejected_full: AtomicU64,
    rejected_timeout: AtomicU64,
    rejected_shutdown: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    finished_stop: AtomicU64,
    finished_length: AtomicU64,
    finished_cancelled: AtomicU64,
    failed: AtomicU64,
    prefix_hits: AtomicU64,
    prefix_misses: AtomicU64,
    prefix_full_hits: AtomicU64,
    prefix_tokens_saved: AtomicU64,
    prefix_in_place: AtomicU64,
    ttft: Histogram,
    itl: Histogram,
    queue_wait: Histogram,
    duration: Histogram,
    /// Nanoseconds per [`Phase`], summed over requests.
    phase_ns: [AtomicU64; Phase::ALL.len()],
    /// Exponential moving average of how long the worker spends on one
    /// request, in microseconds (0 = no data yet); drives Retry-After.
    avg_service_us: AtomicU64,
    /// The scheduler after its last step: sequences running and preempted,
    /// the bytes the running ones hold and the capacity (0 = not limited).
    seqs_running: AtomicU64,
    seqs_preempted: AtomicU64,
    kv_used_bytes: AtomicU64,
    kv_capacity_bytes: AtomicU64,
    preemptions: AtomicU64,
    batch_size: Histogram,
    step_prefill_tokens: Histogram,
    /// Engine steps' wall time: [0] steps of decode rows only, [1] steps
    /// carrying prompt tokens.
    step_duration: [Histogram; 2],
}

impl Metrics {
    pub fn new() -> Self {
        Metrics {
            http: (0..STATUSES).map(|_| AtomicU64::new(0)).collect(),
            rejected_full: AtomicU64::new(0),
            rejected_timeout: AtomicU64::new(0),
            rejected_shutdown: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            finished_stop: AtomicU64::new(0),
            finished_length: AtomicU64::new(0),
            finished_cancelled: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            prefix_misses: AtomicU64::new(0),
            prefix_full_hits: AtomicU64::new(0),
            prefix_tokens_saved: AtomicU64::new(0),
            prefix_in_place: AtomicU64::new(0),
            ttft: Histogram::new(LATENCY_BUCKETS),
            itl: Histogram::new(LATENCY_BUCKETS),
            queue_wait: Histogram::new(DURATION_BUCKETS),
            duration: Histogram::new(DURATION_BUCKETS),
            phase_ns: Default::default(),
            avg_service_us: AtomicU64::new(0),
            seqs_running: AtomicU64::new(0),
            seqs_preempted: AtomicU64::new(0),
            kv_used_bytes: AtomicU64::new(0),
            kv_capacity_bytes: AtomicU64::new(0),
            preemptions: AtomicU64::new(0),
            batch_size: Histogram::with_unit(BATCH_BUCKETS, 1.0),
            step_prefill_tokens: Histogram::with_unit(PREFILL_BUCKETS, 1.0),
            step_duration: [
                Histogram::new(LATENCY_BUCKETS),
                Histogram::new(LATENCY_BUCKETS),
            ],
        }
    }

    /// The scheduler's state after a step.
    pub fn set_scheduler(
        &self,
        running: usize,
        preempted: usize,
        kv_used: usize,
        kv_capacity: Option<usize>,
    ) {
        self.seqs_running.store(running as u64, Relaxed);
        self.seqs_preempted.store(preempted as u64, Relaxed);
        self.kv_used_bytes.store(kv_used as u64, Relaxed);
        self.kv_capacity_bytes
            .store(kv_capacity.unwrap_or(0) as u64, Relaxed);
    }

    /// One engine step: the sequences it ran, its prompt tokens (prompt
    /// chunks and recomputes after preemption; not decode tokens) and how
    /// long the backend took.
    pub fn record_step(&self, sequences: usize, prefill_tokens: usize, took: Duration) {
        self.batch_size.observe_units(sequences as u64);
        self.step_prefill_tokens
            .observe_units(prefill_tokens as u64);
        self.step_duration[usize::from(prefill_tokens > 0)].observe(took);
    }

    pub fn record_preemption(&self) {
        self.preemptions.fetch_add(1, Relaxed);
    }

    pub fn record_http(&self, status: u16) {
        if let Some(c) = self.http.get(status as usize) {
            c.fetch_add(1, Relaxed);
        }
    }

    pub fn record_rejected(&self, e: &SubmitError) {
        match e {
            SubmitError::QueueFull { .. } => &self.rejected_full,
            SubmitError::QueueTimeout => &self.rejected_timeout,
            SubmitError::ShuttingDown => &self.rejected_shutdown,
            _ => return,
        }
        .fetch_add(1, Relaxed);
    }

    pub fn add_prompt_tokens(&self, n: usize) {
        self.prompt_tokens.fetch_add(n as u64, Relaxed);
    }

    pub fn add_completion_token(&self) {
        self.completion_tokens.fetch_add(1, Relaxed);
    }

    /// The prefix cache's lookup result for one request (a hit reused at
    /// least one token); only counted when the cache is on.
    pub fn record_prefix_lookup(&self, hit: bool) {
        if hit {
            &self.prefix_hits
        } else {
            &self.prefix_misses
        }
        .fetch_add(1, Relaxed);
    }

    /// A hit that covered the whole prompt (stored logits, no prefill);
    /// also counted by `record_prefix_lookup(true)`.
    pub fn record_prefix_full_hit(&self) {
        self.prefix_full_hits.fetch_add(1, Relaxed);
    }

    /// A hit whose sequence resumed in the snapshot's own memory, no copy
    /// ([`crate::backend::Backend::resumed_in_place`]).
    pub fn record_prefix_in_place(&self) {
        self.prefix_in_place.fetch_add(1, Relaxed);
    }

    pub fn add_prefix_tokens_saved(&self, n: usize) {
        self.prefix_tokens_saved.fetch_add(n as u64, Relaxed);
    }

    pub fn add_phase(&self, p: Phase, d: Duration) {
        self.phase_ns[p as usize].fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
    }

    pub fn observe_ttft(&self, d: Duration) {
        self.ttft.observe(d);
    }

    pub fn observe_itl(&self, d: Duration) {
        self.itl.observe(d);
    }

    pub fn observe_queue_wait(&self, d: Duration) {
        self.queue_wait.observe(d);
    }

    /// A started request ended. `total` counts from submit, `service` from
    /// the worker starting it. `reason` is `None` for a failure.
    pub fn record_end(&self, reason: Option<FinishReason>, total: Duration, service: Duration) {
        match reason {
            Some(FinishReason::Stop) => &self.finished_stop,
            Some(FinishReason::Length) => &self.finished_length,
            Some(FinishReason::Cancelled) => &self.finished_cancelled,
            None => &self.failed,
        }
        .fetch_add(1, Relaxed);
        self.duration.observe(total);
        // Cancelled requests say little about how long requests take.
        if reason != Some(FinishReason::Cancelled) {
            let us = service.as_micros().min(u64::MAX as u128) as u64;
            let old = self.avg_service_us.load(Relaxed);
            let new = if old == 0 {
                us.max(1)
            } else {
                (old * 3 + us) / 4
            };
            self.avg_service_us.store(new.max(1), Relaxed);
        }
    }

    /// Seconds until a queue slot is likely free: about one request's
    /// service time, at least 1 s (and at most an hour).
    pub fn retry_after_s(&self) -> u32 {
        let us = self.avg_service_us.load(Relaxed);
        us.div_ceil(1_000_000).clamp(1, 3600) as u32
    }

    pub fn completed(&self) -> u64 {
        self.finished_stop.load(Relaxed) + self.finished_length.load(Relaxed)
    }

    pub fn cancelled(&self) -> u64 {
        self.finished_cancelled.load(Relaxed)
    }

    pub fn failed(&self) -> u64 {
        self.failed.load(Relaxed)
    }

    pub fn rejected(&self) -> u64 {
        self.rejected_full.load(Relaxed)
            + self.rejected_timeout.load(Relaxed)
            + self.rejected_shutdown.load(Relaxed)
    }

    pub fn render(
        &self,
        queue_depth: usize,
        running: usize,
        cache: Option<crate::prefix_cache::CacheStats>,
    ) -> String {
        let mut out = String::with_capacity(8192);
        let o = &mut out;
        gauge(
            o,
            "qwasi_queue_depth",
            "Requests waiting in the queue.",
            queue_depth as u64,
        );
        gauge(
            o,
            "qwasi_requests_running",
            "Requests started and not ended (running or preempted).",
            running as u64,
        );
        let preempted = self.seqs_preempted.load(Relaxed);
        gauge(
            o,
            "qwasi_sequences_running",
            "Sequences in the running batch (holding device state).",
            self.seqs_running.load(Relaxed),
        );
        gauge(
            o,
            "qwasi_sequences_waiting",
            "Requests not running: queued, or preempted and waiting to resume.",
            queue_depth as u64 + preempted,
        );
        gauge(
            o,
            "qwasi_sequences_preempted",
            "Preempted requests waiting to resume (part of qwasi_sequences_waiting).",
            preempted,
        );
        let (used, cap) = (
            self.kv_used_bytes.load(Relaxed),
            self.kv_capacity_bytes.load(Relaxed),
        );
        gauge(
            o,
            "qwasi_kv_cache_used_bytes",
            "Bytes of sequence state (KV and recurrent states) the running sequences hold.",
            used,
        );
        gauge(
            o,
            "qwasi_kv_cache_capacity_bytes",
            "The scheduler's memory budget for running sequences (0 = not limited).",
            cap,
        );
        let usage = if cap > 0 {
            used as f64 / cap as f64
        } else {
            0.0
        };
        let _ = writeln!(
            o,
            "# HELP qwasi_kv_cache_usage Fraction of the memory budget the running sequences hold (0 when not limited).\n\
             # TYPE qwasi_kv_cache_usage gauge\nqwasi_kv_cache_usage {usage}"
        );
        counter(
            o,
            "qwasi_preemptions_total",
            "Running requests preempted for memory (recomputed when they resume).",
            &self.preemptions,
        );
        self.batch_size
            .render(o, "qwasi_batch_size", "Sequences per engine step.");
        self.step_prefill_tokens.render(
            o,
            "qwasi_step_prefill_tokens",
            "Prompt tokens per engine step (prompt chunks and recomputes; decode tokens not counted).",
        );
        let name = STEP_DURATION;
        let _ = writeln!(
            o,
            "# HELP {name} Engine steps' wall time: steps of decode rows only (phase=\"decode\") and steps carrying prompt tokens (phase=\"prompt\").\n\
             # TYPE {name} histogram"
        );
        for (h, phase) in self.step_duration.iter().zip(STEP_PHASES) {
            h.render_series(o, name, &format!("phase=\"{phase}\","));
        }

        let _ = writeln!(
            o,
            "# HELP qwasi_requests_total Requests answered, by final HTTP status.\n\
             # TYPE qwasi_requests_total counter"
        );
        for (status, c) in self.http.iter().enumerate() {
            let v = c.load(Relaxed);
            if v > 0 {
                let _ = writeln!(o, "qwasi_requests_total{{status=\"{status}\"}} {v}");
            }
        }

        let _ = writeln!(
            o,
            "# HELP qwasi_requests_rejected_total Requests refused by the queue, by reason.\n\
             # TYPE qwasi_requests_rejected_total counter"
        );
        for (reason, c) in [
            ("queue_full", &self.rejected_full),
            ("queue_timeout", &self.rejected_timeout),
            ("shutting_down", &self.rejected_shutdown),
        ] {
            let _ = writeln!(
                o,
                "qwasi_requests_rejected_total{{reason=\"{reason}\"}} {}",
                c.load(Relaxed)
            );
        }

        let _ = writeln!(
            o,
            "# HELP qwasi_requests_finished_total Started requests that ended, by finish reason.\n\
             # TYPE qwasi_requests_finished_total counter"
        );
        for (reason, c) in [
            ("stop", &self.finished_stop),
            ("length", &self.finished_length),
            ("cancelled", &self.finished_cancelled),
            ("failed", &self.failed),
        ] {
            let _ = writeln!(
                o,
                "qwasi_requests_finished_total{{reason=\"{reason}\"}} {}",
                c.load(Relaxed)
            );
        }

        counter(
            o,
            "qwasi_prompt_tokens_total",
            "Prompt tokens processed.",
            &self.prompt_tokens,
        );
        counter(
            o,
            "qwasi_completion_tokens_total",
            "Tokens generated (stop tokens included).",
            &self.completion_tokens,
        );
        counter(
            o,
            "qwasi_prefix_cache_hits_total",
            "Requests that resumed from a prefix-cache snapshot.",
            &self.prefix_hits,
        );
        counter(
            o,
            "qwasi_prefix_cache_misses_total",
            "Requests that found no usable prefix-cache snapshot.",
            &self.prefix_misses,
        );
        counter(
            o,
            "qwasi_prefix_cache_full_hits_total",
            "Hits that covered the whole prompt: logits stored with the snapshot, no prefill.",
            &self.prefix_full_hits,
        );
        counter(
            o,
            "qwasi_prefix_cache_resumed_in_place_total",
            "Hits that resumed in the snapshot's own KV memory instead of a copy (GPU: \
             the sequence that wrote it is gone and no deeper snapshot reads it).",
            &self.prefix_in_place,
        );
        counter(
            o,
            "qwasi_prefix_cache_tokens_saved_total",
            "Prompt tokens not computed because a snapshot covered them.",
            &self.prefix_tokens_saved,
        );
        let c = cache.unwrap_or_default();
        gauge(
            o,
            "qwasi_prefix_cache_bytes",
            "Bytes held by prefix-cache snapshots (shared KV pages counted once).",
            c.bytes as u64,
        );
        gauge(
            o,
            "qwasi_prefix_cache_snapshots",
            "Snapshots in the prefix cache.",
            c.snapshots as u64,
        );
        gauge(
            o,
            "qwasi_prefix_cache_host_bytes",
            "Bytes of prefix-cache snapshots moved to host memory (the host tier).",
            c.host_bytes as u64,
        );
        let _ = writeln!(
            o,
            "# HELP qwasi_prefix_cache_evictions_total Snapshots evicted to stay under the budget.\n\
             # TYPE qwasi_prefix_cache_evictions_total counter\n\
             qwasi_prefix_cache_evictions_total {}\n\
             # HELP qwasi_prefix_cache_demotions_total Snapshots moved from device to host memory.\n\
             # TYPE qwasi_prefix_cache_demotions_total counter\n\
             qwasi_prefix_cache_demotions_total {}\n\
             # HELP qwasi_prefix_cache_promotions_total Host-tier snapshots moved back to the device after a hit.\n\
             # TYPE qwasi_prefix_cache_promotions_total counter\n\
             qwasi_prefix_cache_promotions_total {}",
            c.evictions, c.demotions, c.promotions
        );

        self.ttft.render(
            o,
            "qwasi_time_to_first_token_seconds",
            "Time from submit to the first sampled token.",
        );
        let _ = writeln!(
            o,
            "# HELP qwasi_first_token_phase_seconds_total Time spent before first tokens, by step: \
             prefix-cache lookup, restore, prefill, snapshot copies, sampling.\n\
             # TYPE qwasi_first_token_phase_seconds_total counter"
        );
        for p in Phase::ALL {
            let s = self.phase_ns[p as usize].load(Relaxed) as f64 / 1e9;
            let _ = writeln!(
                o,
                "qwasi_first_token_phase_seconds_total{{phase=\"{}\"}} {s}",
                p.name()
            );
        }
        self.itl.render(
            o,
            "qwasi_inter_token_latency_seconds",
            "Time between consecutive sampled tokens of a request.",
        );
        self.queue_wait.render(
            o,
            "qwasi_queue_wait_seconds",
            "Time started requests waited in the queue.",
        );
        self.duration.render(
            o,
            "qwasi_request_duration_seconds",
            "Time from submit to the end of started requests (any outcome).",
        );
        out
    }
}

fn gauge(out: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

fn counter(out: &mut String, name: &str, help: &str, c: &AtomicU64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
        c.load(Relaxed)
    );
}
