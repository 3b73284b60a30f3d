//! The scheduler on the CPU: the prompt budget beside decoding streams,
//! cancellation, preemption and resume (with and without the prefix cache),
//! the context each sequence is planned for, and a stress run that leaves
//! nothing behind; every request gets the tokens it gets alone.

mod batching_support;

use anyhow::Result;
use batching_support::*;
use qwasi_engine::backend::{Backend, BatchItem, SeqSnapshot, StepOut};
use qwasi_engine::config::ModelConfig;
use qwasi_engine::cpu::{CpuModel, CpuSequence};
use qwasi_engine::generate::{FinishReason, GenerateRequest};
use qwasi_engine::sampling::SamplingParams;
use qwasi_engine::service::{EngineService, Event, ServiceConfig, SubmitError, SubmitOptions};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The CPU model slowed down per engine step (to observe steps from
/// outside), recording what the scheduler plans each sequence for.
struct Slow {
    model: Arc<CpuModel>,
    delay: Duration,
    plans: Arc<Mutex<Vec<usize>>>,
}

impl Slow {
    fn new(model: Arc<CpuModel>, delay: Duration) -> Slow {
        Slow {
            model,
            delay,
            plans: Arc::default(),
        }
    }
}

impl Backend for Slow {
    type Sequence = CpuSequence;
    fn name(&self) -> &'static str {
        "slow"
    }
    fn config(&self) -> &ModelConfig {
        self.model.config()
    }
    fn new_sequence(&self) -> CpuSequence {
        self.model.new_sequence()
    }
    fn position(&self, seq: &CpuSequence) -> usize {
        self.model.position(seq)
    }
    fn forward(&self, seq: &mut CpuSequence, tokens: &[u32]) -> Result<Vec<f32>> {
        self.model.forward(seq, tokens)
    }
    fn step(&self, batch: &mut [BatchItem<'_, CpuSequence>]) -> Vec<Result<StepOut>> {
        std::thread::sleep(self.delay);
        self.model.step(batch)
    }
    fn sequence_bytes(&self, tokens: usize) -> usize {
        self.model.sequence_bytes(tokens)
    }
    fn kv_capacity(&self) -> Option<usize> {
        self.model.kv_capacity()
    }
    fn snapshot(&self, seq: &CpuSequence) -> Option<Box<dyn SeqSnapshot>> {
        self.model.snapshot(seq)
    }
    fn restore(&self, snap: &dyn SeqSnapshot) -> Option<CpuSequence> {
        self.model.restore(snap)
    }
    fn plan(&self, _seq: &mut CpuSequence, tokens: usize) {
        self.plans.lock().unwrap().push(tokens);
    }
}

fn reason(events: &[Event]) -> FinishReason {
    match events.last() {
        Some(Event::Finished { reason, .. }) => *reason,
        e => panic!("not finished: {e:?}"),
    }
}

async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(30), "{what}: not reached");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Prompts of `lens` tokens read one after another while a request streams
/// (its own 40-token prompt read alone first), on a service with a 64-token
/// step budget and `caps`' limits; each gets the tokens it gets alone.
/// Returns, once idle: steps, steps of at most 16 prompt tokens, prompt tokens.
async fn beside_a_stream(caps: ServiceConfig, lens: &[usize]) -> (f64, f64, f64) {
    let m = cpu(None);
    let slow = Slow::new(Arc::new(cpu(None)), Duration::from_millis(2));
    let cfg = ServiceConfig {
        max_num_seqs: 4,
        max_num_batched_tokens: 64,
        ..caps
    };
    let svc = start(slow, cfg);
    let a = svc
        .submit(
            req(&prompt(40, 1), 3000, SamplingParams::default()),
            SubmitOptions::default(),
        )
        .await
        .unwrap();
    a.wait().await;
    for (i, &len) in lens.iter().enumerate() {
        let r = GenerateRequest {
            ignore_eos: true,
            ..req(&prompt(len, 2 + i as u32), 5, seeded(3 + i as u64))
        };
        let mut h = svc
            .submit(r.clone(), SubmitOptions::default())
            .await
            .unwrap();
        assert_eq!(got(&collect(&mut h).await), expected(&m, &r), "{len}");
    }
    drop(a);
    until("idle", || svc.stats().running == 0).await;
    (
        metric(&svc, "qwasi_step_prefill_tokens_count"),
        metric(&svc, "qwasi_step_prefill_tokens_bucket{le=\"16\"}"),
        metric(&svc, "qwasi_step_prefill_tokens_sum"),
    )
}

/// While a request decodes, another's prompt is read at most
/// `prefill_while_decoding` tokens a step (the first one's prompt, read
/// alone, is not cut).
#[tokio::test]
async fn prompts_read_beside_decoding_streams_keep_to_their_cap() {
    let caps = ServiceConfig {
        prefill_while_decoding: 16,
        ..ServiceConfig::default()
    };
    let (steps, small, tokens) = beside_a_stream(caps, &[200]).await;
    assert_eq!(small, steps - 1.0, "steps past the cap besides the first");
    assert!(tokens >= 240.0);
}

/// While a request decodes, a prompt longer than the step budget is read at
/// most `long_prompt_chunk` tokens a step, a shorter one whole.
#[tokio::test]
async fn only_prompts_longer_than_the_budget_are_cut_beside_decoding_streams() {
    let caps = ServiceConfig {
        long_prompt_chunk: 16,
        ..ServiceConfig::default()
    };
    let (steps, small, tokens) = beside_a_stream(caps, &[200, 40]).await;
    // The first prompt (alone) and the short one: one step each past 16.
    assert_eq!(small, steps - 2.0, "steps past the cap");
    assert!(tokens >= 280.0);
}

/// A cancelled request's slot goes to a waiting one at the next step.
#[tokio::test]
async fn a_cancelled_request_frees_its_slot_at_the_next_step() {
    let slow = Slow::new(Arc::new(cpu(None)), Duration::from_millis(25));
    let svc = start(
        slow,
        ServiceConfig {
            max_num_seqs: 2,
            ..ServiceConfig::default()
        },
    );
    let long = |p: u32| req(&prompt(4, p), 3000, SamplingParams::default());
    let a = svc.submit(long(1), SubmitOptions::default()).await.unwrap();
    let mut b = svc.submit(long(2), SubmitOptions::default()).await.unwrap();
    a.wait().await;
    let s2 = svc.clone();
    let c = tokio::spawn(async move { s2.submit(long(3), SubmitOptions::default()).await });
    until("C waits", || svc.stats().queued == 1).await;
    assert_eq!(metric(&svc, "qwasi_sequences_waiting"), 1.0);
    let before = metric(&svc, "qwasi_batch_size_count");
    drop(a);
    let mut c = c.await.unwrap().unwrap();
    let after = metric(&svc, "qwasi_batch_size_count");
    assert!(
        after - before <= 2.0,
        "C started {} steps after the cancel",
        after - before
    );
    c.wait().await;
    assert!(!got(&c.try_next()).is_empty());
    b.cancel();
    assert_eq!(reason(&collect(&mut b).await), FinishReason::Cancelled);
    drop(c);
    until("idle", || svc.stats().running == 0).await;
    assert_eq!(svc.stats().cancelled, 3);
}

/// A request preempted for memory resumes (recomputed from its tokens) with
/// the tokens it gets alone; one that cannot fit alone is refused up front.
#[tokio::test]
async fn preempted_requests_resume_with_the_tokens_they_get_alone() {
    let m = cpu(None);
    // Room for two sequences of up to 128 tokens, not three.
    let budget = m.sequence_bytes(128) * 2 + m.sequence_bytes(0);
    let cfg = ServiceConfig {
        max_num_seqs: 4,
        ..ServiceConfig::default()
    };
    preemption_case(&m, budget, start(cpu(Some(budget)), cfg.clone())).await;
    // The same budget set by the operator (`--kv-cache-mib`) on a backend
    // without one.
    let operator = ServiceConfig {
        kv_cache_bytes: budget,
        ..cfg
    };
    preemption_case(&m, budget, start(cpu(None), operator)).await;
}

/// Each sequence is planned for its whole context before its first chunk
/// (the prompt when admitted; prompt and tokens so far when it resumes
/// after a preemption), so a backend can size its state once.
#[tokio::test]
async fn sequences_are_planned_for_their_whole_context() {
    let m = cpu(None);
    let budget = m.sequence_bytes(128) * 2 + m.sequence_bytes(0);
    let backend = Slow::new(Arc::new(cpu(Some(budget))), Duration::ZERO);
    let plans = backend.plans.clone();
    let cfg = ServiceConfig {
        max_num_seqs: 4,
        max_num_batched_tokens: 16,
        ..ServiceConfig::default()
    };
    preemption_case(&m, budget, start(backend, cfg)).await;
    let plans = plans.lock().unwrap().clone();
    for p in 50..54 {
        assert!(
            plans.contains(&p),
            "no plan for a {p}-token prompt: {plans:?}"
        );
    }
    // Resumed after a preemption: its prompt and the tokens it had.
    assert!(
        plans.iter().any(|&p| p > 53 && p < 53 + 70),
        "no resume planned: {plans:?}"
    );
}

/// A KV budget that holds no sequence (the 35B model in bf16 on an 80 GB
/// card) refuses every request up front, naming the operator's setting, not
/// the request's length.
#[tokio::test]
async fn a_budget_that_holds_no_sequence_refuses_every_request() {
    let m = cpu(None);
    let backend = cpu(Some(m.sequence_bytes(0) - 1));
    let svc = start(backend, ServiceConfig::default());
    let err = svc
        .submit(
            req(&prompt(3, 1), 1, SamplingParams::default()),
            SubmitOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, SubmitError::ContextLengthExceeded(m) if m.contains("holds no sequence") && m.contains("--kv-cache-mib")),
        "{err:?}"
    );
    // The operator's budget replaces the backend's, larger too (an 80 GB
    // card whose measured budget is 0): the same request is served.
    let cfg = ServiceConfig {
        kv_cache_bytes: m.sequence_bytes(64),
        ..ServiceConfig::default()
    };
    let svc = start(cpu(Some(m.sequence_bytes(0) - 1)), cfg);
    let r = req(&prompt(3, 1), 4, SamplingParams::default());
    let mut h = svc
        .submit(r.clone(), SubmitOptions::default())
        .await
        .unwrap();
    assert_eq!(got(&collect(&mut h).await), expected(&m, &r));
}

async fn preemption_case(m: &CpuModel, budget: usize, svc: EngineService) {
    let reqs: Vec<GenerateRequest> = (0..4)
        .map(|i| {
            let mut r = req(&prompt(50 + i, i as u32), 70, seeded(7 + i as u64));
            if i == 1 {
                r.sampling = SamplingParams::default();
            }
            r.ignore_eos = true;
            r
        })
        .collect();
    let mut handles = Vec::new();
    for r in &reqs {
        handles.push(
            svc.submit(r.clone(), SubmitOptions::default())
                .await
                .unwrap(),
        );
    }
    for (i, (r, mut h)) in reqs.iter().zip(handles).enumerate() {
        let events = collect(&mut h).await;
        assert_eq!(got(&events), expected(m, r), "request {i}");
    }
    assert!(metric(&svc, "qwasi_preemptions_total") >= 1.0);
    // Alone it needs more than the budget: refused, not failed later.
    let too_big = m.sequence_bytes(4096);
    assert!(too_big > budget);
    let err = svc
        .submit(
            req(&prompt(100, 9), 3000, SamplingParams::default()),
            SubmitOptions::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, SubmitError::ContextLengthExceeded(m) if m.contains("KV memory")),
        "{err:?}"
    );
}

/// The prefix cache under batching and preemption: concurrent requests
/// sharing a prefix snapshot at their intervals and prompt ends, preempted
/// ones resume from the cache, and every request gets its tokens alone; a
/// second round finds the snapshots.
#[tokio::test]
async fn the_prefix_cache_works_under_batching_and_preemption() {
    let m = cpu(None);
    let budget = m.sequence_bytes(160) * 2 + m.sequence_bytes(0);
    let svc = start(
        cpu(Some(budget)),
        ServiceConfig {
            max_num_seqs: 4,
            max_num_batched_tokens: 24,
            prefix_cache_bytes: 64 << 20,
            snapshot_interval: 32,
            ..ServiceConfig::default()
        },
    );
    let shared = prompt(70, 1);
    let reqs: Vec<GenerateRequest> = (0..4)
        .map(|i| {
            let mut p = shared.clone();
            p.extend(prompt(5 + i, 20 + i as u32));
            GenerateRequest {
                ignore_eos: true,
                ..req(&p, 60, seeded(i as u64))
            }
        })
        .collect();
    for round in 0..2 {
        let mut handles = Vec::new();
        for r in &reqs {
            handles.push(
                svc.submit(r.clone(), SubmitOptions::default())
                    .await
                    .unwrap(),
            );
        }
        for (i, (r, mut h)) in reqs.iter().zip(handles).enumerate() {
            let events = collect(&mut h).await;
            assert_eq!(got(&events), expected(&m, r), "round {round} request {i}");
            let cached = match events.last() {
                Some(Event::Finished { usage, .. }) => usage.cached_tokens,
                e => panic!("{e:?}"),
            };
            if round == 1 {
                assert!(cached >= 64, "round 1 request {i}: {cached} cached");
            }
        }
    }
    assert!(metric(&svc, "qwasi_preemptions_total") >= 1.0);
    assert!(metric(&svc, "qwasi_prefix_cache_hits_total") >= 4.0);
}

/// Random arrivals, cancellations and preemptions: every request completes
/// with its tokens alone or ends cancelled by its client, and the
/// scheduler's gauges and the KV pages return to zero.
#[tokio::test]
async fn a_stress_run_leaves_nothing_behind() {
    let m = Arc::new(cpu(None));
    let budget = m.sequence_bytes(192) * 3;
    let model = Arc::new(cpu(Some(budget)));
    let slow = Slow::new(model.clone(), Duration::from_millis(2));
    let svc = start(
        slow,
        ServiceConfig {
            max_num_seqs: 5,
            max_num_batched_tokens: 40,
            max_queue: 64,
            ..ServiceConfig::default()
        },
    );
    // A deterministic pseudo-random schedule.
    let mut seed = 0x2545_f491u64;
    let mut rnd = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut tasks = Vec::new();
    for i in 0..24u32 {
        let sampling = if rnd(2) == 0 {
            SamplingParams::default()
        } else {
            seeded(rnd(1000))
        };
        let r = req(
            &prompt(1 + rnd(120) as usize, i),
            1 + rnd(60) as usize,
            sampling,
        );
        // Cancel after this many tokens (or never).
        let cancel_at = (rnd(3) == 0).then(|| rnd(10) as usize);
        let svc = svc.clone();
        let m = m.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = svc
                .submit(r.clone(), SubmitOptions::default())
                .await
                .unwrap();
            let mut events = Vec::new();
            loop {
                h.wait().await;
                let evs = h.try_next();
                let done = evs.iter().any(Event::is_terminal);
                events.extend(evs);
                if done {
                    break;
                }
                if cancel_at.is_some_and(|n| got(&events).len() >= n) {
                    drop(h);
                    return None;
                }
            }
            let want = tokio::task::spawn_blocking(move || expected(&m, &r))
                .await
                .unwrap();
            assert_ne!(reason(&events), FinishReason::Cancelled);
            assert_eq!(got(&events), want);
            Some(())
        }));
        tokio::time::sleep(Duration::from_millis(rnd(15))).await;
    }
    let mut completed = 0;
    for t in tasks {
        completed += t.await.unwrap().is_some() as u64;
    }
    until("idle", || {
        let s = svc.stats();
        s.running == 0 && s.queued == 0
    })
    .await;
    let s = svc.stats();
    assert_eq!(s.completed + s.cancelled, 24, "{s:?}");
    assert!(s.completed >= completed && s.failed == 0, "{s:?}");
    for g in [
        "qwasi_sequences_running",
        "qwasi_sequences_waiting",
        "qwasi_sequences_preempted",
        "qwasi_kv_cache_used_bytes",
        "qwasi_kv_cache_usage",
        "qwasi_requests_running",
        "qwasi_queue_depth",
    ] {
        assert_eq!(metric(&svc, g), 0.0, "{g}");
    }
    assert_eq!(metric(&svc, "qwasi_kv_cache_capacity_bytes"), budget as f64);
    assert!(metric(&svc, "qwasi_preemptions_total") >= 1.0);
    // No prefix cache: no page outlives its sequence.
    assert_eq!(model.page_stats().live_pages(), 0);
}
