//! The engine service over the real CPU model (a tiny seeded one): streaming,
//! queueing, cancellation, drain, failure isolation, metrics and validation.

mod common;

use anyhow::{Result, bail};
use qwasi_engine::backend::{Backend, SeqSnapshot};
use qwasi_engine::config::ModelConfig;
use qwasi_engine::cpu::{CpuModel, CpuSequence};
use qwasi_engine::demo::RandomWeights;
use qwasi_engine::generate::{FinishReason, GenerateRequest, generate};
use qwasi_engine::readout::Readout;
use qwasi_engine::sampling::{
    RowPlanner, Sampled, SamplingParams, TopLogits, WeightedRow, Weighting, greedy, read_weighted,
    top_logits,
};
use qwasi_engine::service::{
    EngineService, Event, GenerationHandle, ServiceConfig, SubmitError, SubmitOptions,
};
use qwasi_engine::tokenizer::Tokenizer;
use qwasi_engine::weights::Weights;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const EOS: u32 = 299;
/// A prompt containing this token makes [`TestBackend`] panic.
const PANIC_TOKEN: u32 = 42;
/// A prompt containing this token makes [`TestBackend`] return an error.
const ERROR_TOKEN: u32 = 43;

/// A tiny MoE model: vocab 300, hidden 32, 4 layers (3 GDN + 1 attention).
fn model() -> Arc<CpuModel> {
    let cfg = ModelConfig::from_json(&common::tiny_moe_config(EOS)).unwrap();
    let weights = Weights::load(&cfg, &RandomWeights { seed: 7 }).unwrap();
    Arc::new(CpuModel::new(cfg, weights))
}

/// The CPU model, optionally slowed down per forward, panicking or failing
/// on magic prompt tokens. With `greedy`, it poses as a backend that keeps
/// the logits on the device (as the GPU does): it counts the calls that pick
/// greedy tokens in `greedy`, those that read the logits' head in `tops` and
/// those that weight the row in `weighted` (each with the host's reference).
struct TestBackend {
    model: Arc<CpuModel>,
    delay: Duration,
    /// Counts forward calls.
    forwards: Arc<AtomicUsize>,
    greedy: Option<Arc<AtomicUsize>>,
    tops: Arc<AtomicUsize>,
    weighted: Arc<AtomicUsize>,
    /// The logits the last device-reading call left "on the device", with
    /// the position they follow ([`Backend::last_logits`]).
    last: std::sync::Mutex<Option<(usize, Vec<f32>)>>,
}

impl TestBackend {
    fn new(
        model: Arc<CpuModel>,
        delay: Duration,
        forwards: Arc<AtomicUsize>,
        greedy: Option<Arc<AtomicUsize>>,
    ) -> Self {
        TestBackend {
            model,
            delay,
            forwards,
            greedy,
            tops: Arc::default(),
            weighted: Arc::default(),
            last: Default::default(),
        }
    }
}

impl TestBackend {
    /// A forward whose logits stay "on the device" (kept for `last_logits`).
    fn device_forward(&self, seq: &mut CpuSequence, tokens: &[u32]) -> Result<Vec<f32>> {
        let l = self.model.forward(seq, tokens)?;
        *self.last.lock().unwrap() = Some((self.model.position(seq), l.clone()));
        Ok(l)
    }
}

impl Backend for TestBackend {
    type Sequence = CpuSequence;
    fn name(&self) -> &'static str {
        "test"
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
        self.forwards.fetch_add(1, Ordering::SeqCst);
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        // Magic tokens act in the prompt only (sampled ones are harmless).
        let prefill = self.model.position(seq) == 0;
        if prefill && tokens.contains(&PANIC_TOKEN) {
            panic!("magic token {PANIC_TOKEN}");
        }
        if prefill && tokens.contains(&ERROR_TOKEN) {
            bail!("magic token {ERROR_TOKEN}");
        }
        self.model.forward(seq, tokens)
    }
    fn forward_greedy(&self, seq: &mut CpuSequence, tokens: &[u32]) -> Result<Sampled> {
        if let Some(n) = &self.greedy {
            n.fetch_add(1, Ordering::SeqCst);
        }
        Ok(greedy(&self.device_forward(seq, tokens)?))
    }
    fn forward_top(&self, seq: &mut CpuSequence, tokens: &[u32], k: usize) -> Result<TopLogits> {
        self.tops.fetch_add(1, Ordering::SeqCst);
        Ok(top_logits(&self.device_forward(seq, tokens)?, k))
    }
    fn forward_weighted(
        &self,
        seq: &mut CpuSequence,
        tokens: &[u32],
        w: Weighting,
        plan: &mut RowPlanner,
    ) -> Result<WeightedRow> {
        self.weighted.fetch_add(1, Ordering::SeqCst);
        Ok(read_weighted(&self.device_forward(seq, tokens)?, w, plan))
    }
    fn logits_on_device(&self) -> bool {
        self.greedy.is_some()
    }
    fn last_logits(&self, seq: &CpuSequence) -> Option<Vec<f32>> {
        let last = self.last.lock().unwrap();
        let (pos, l) = last.as_ref()?;
        (*pos == self.model.position(seq)).then(|| l.clone())
    }
    fn snapshot(&self, seq: &CpuSequence) -> Option<Box<dyn SeqSnapshot>> {
        self.model.snapshot(seq)
    }
    fn restore(&self, snap: &dyn SeqSnapshot) -> Option<CpuSequence> {
        self.model.restore(snap)
    }
}

/// One request at a time, so the queue tests have requests that wait
/// (batching has its own tests, tests/batching.rs).
fn base_cfg() -> ServiceConfig {
    ServiceConfig {
        max_num_seqs: 1,
        max_queue: 8,
        queue_timeout: Duration::from_secs(30),
        max_model_len: 0,
        max_prompt_tokens: 0,
        max_completion_tokens: 0,
        ..ServiceConfig::default()
    }
}

fn service(delay_ms: u64, cfg: ServiceConfig) -> (EngineService, Arc<CpuModel>) {
    let m = model();
    let backend = TestBackend::new(
        m.clone(),
        Duration::from_millis(delay_ms),
        Arc::default(),
        None,
    );
    (EngineService::start(backend, None, "tiny".into(), cfg), m)
}

fn req(prompt: &[u32], max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        stop_token_ids: vec![],
        ignore_eos: true,
        sampling: SamplingParams::default(),
    }
}

/// Drains a handle to its terminal event (with a safety timeout).
async fn collect(h: &mut GenerationHandle) -> Vec<Event> {
    let all = async {
        let mut all = Vec::new();
        loop {
            h.wait().await;
            let evs = h.try_next();
            assert!(!evs.is_empty(), "wait() resolved with nothing to take");
            let done = evs.iter().any(Event::is_terminal);
            all.extend(evs);
            if done {
                return all;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("request did not finish")
}

fn tokens(events: &[Event]) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Token { id, .. } => Some(*id),
            _ => None,
        })
        .collect()
}

/// Polls `cond` every few ms until true (or panics after 10 s).
async fn until(mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "condition not reached"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn tokens_match_a_direct_generate_call() {
    let (svc, m) = service(0, base_cfg());
    let cases = [
        // Greedy, stopping on EOS or the limit.
        GenerateRequest {
            ignore_eos: false,
            ..req(&[1, 2, 3, 4, 5], 24)
        },
        // Seeded sampling with logprobs and penalties.
        GenerateRequest {
            sampling: SamplingParams {
                temperature: 0.9,
                top_p: 0.95,
                seed: Some(1234),
                logprobs: Some(3),
                presence_penalty: 0.5,
                ..Default::default()
            },
            ..req(&[10, 20, 30], 16)
        },
        // A stop token that greedy decoding hits.
        GenerateRequest {
            stop_token_ids: vec![],
            ..req(&[7, 8, 9], 12)
        },
    ];
    for (i, mut r) in cases.into_iter().enumerate() {
        if i == 2 {
            // Stop on the 4th greedy token.
            let direct = generate(&*m, &r, |_, _| ControlFlow::Continue(())).unwrap();
            r.stop_token_ids = vec![direct.tokens[3]];
            r.max_tokens = 12;
        }
        let direct = generate(&*m, &r, |_, _| ControlFlow::Continue(())).unwrap();
        let mut h = svc
            .submit(r.clone(), SubmitOptions::default())
            .await
            .unwrap();
        let events = collect(&mut h).await;
        assert!(h.is_done());
        assert!(h.try_next().is_empty());
        assert_eq!(tokens(&events), direct.tokens, "case {i}");
        let logprobs: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::Token { logprob, .. } => Some(logprob.clone()),
                _ => None,
            })
            .collect();
        for (lp, step) in logprobs.iter().zip(&direct.steps) {
            if r.sampling.logprobs.is_some() {
                assert_eq!(lp.as_ref(), Some(step));
            } else {
                assert!(lp.is_none());
            }
        }
        match events.last().unwrap() {
            Event::Finished {
                reason,
                usage,
                stop_token,
                trailing_text,
            } => {
                assert_eq!(*reason, direct.finish_reason, "case {i}");
                assert_eq!(*stop_token, direct.stop_token);
                assert_eq!(usage.prompt_tokens as usize, r.prompt.len());
                assert_eq!(usage.completion_tokens as usize, direct.steps.len());
                assert_eq!(usage.cached_tokens, 0);
                assert!(trailing_text.is_empty());
            }
            e => panic!("expected Finished, got {e:?}"),
        }
        if i == 2 {
            assert_eq!(direct.finish_reason, FinishReason::Stop);
        }
    }
}

#[tokio::test]
async fn events_stream_before_the_request_finishes() {
    let (svc, _) = service(20, base_cfg());
    let mut h = svc
        .submit(req(&[1, 2, 3], 10), SubmitOptions::default())
        .await
        .unwrap();
    h.wait().await;
    let first = h.try_next();
    assert!(matches!(first[0], Event::Token { .. }), "{first:?}");
    assert!(
        !first.iter().any(Event::is_terminal),
        "the whole request arrived at once"
    );
    assert!(!h.is_done());
    let mut batches = 1;
    let mut all = first;
    while !h.is_done() {
        h.wait().await;
        all.extend(h.try_next());
        batches += 1;
    }
    assert!(batches > 3, "events came in only {batches} batches");
    assert_eq!(all.len(), 11);
    assert!(all[..10].iter().all(|e| matches!(e, Event::Token { .. })));
    assert!(matches!(
        all[10],
        Event::Finished {
            reason: FinishReason::Length,
            ..
        }
    ));
    // After the terminal event: wait resolves at once, nothing more comes.
    tokio::time::timeout(Duration::from_secs(1), h.wait())
        .await
        .unwrap();
    assert!(h.try_next().is_empty());
}

#[tokio::test]
async fn full_queue_answers_429_with_retry_after() {
    let (svc, _) = service(
        20,
        ServiceConfig {
            max_queue: 1,
            ..base_cfg()
        },
    );
    let a = svc
        .submit(req(&[1, 2, 3], 1000), SubmitOptions::default())
        .await
        .unwrap();
    let s2 = svc.clone();
    let b = tokio::spawn(async move { s2.submit(req(&[4, 5], 2), SubmitOptions::default()).await });
    until(|| svc.stats().queued == 1).await;
    let stats = svc.stats();
    assert_eq!((stats.running, stats.capacity), (1, 1));
    let err = svc
        .submit(req(&[6], 2), SubmitOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, SubmitError::QueueFull { retry_after_s } if retry_after_s >= 1),
        "{err:?}"
    );
    assert_eq!((err.code(), err.http_status()), ("queue_full", 429));
    assert!(err.retry_after_s().unwrap() >= 1);
    assert!(!err.to_string().is_empty());
    drop(a);
    let mut b = b.await.unwrap().unwrap();
    collect(&mut b).await;
    assert_eq!(svc.stats().rejected, 1);
    assert!(
        svc.metrics_text()
            .contains("qwasi_requests_rejected_total{reason=\"queue_full\"} 1")
    );
}

#[tokio::test]
async fn waiting_past_the_timeout_answers_503() {
    let cfg = ServiceConfig {
        queue_timeout: Duration::from_millis(150),
        ..base_cfg()
    };
    let (svc, _) = service(20, cfg);
    let a = svc
        .submit(req(&[1, 2, 3], 1000), SubmitOptions::default())
        .await
        .unwrap();
    let t = Instant::now();
    let err = svc
        .submit(req(&[4], 2), SubmitOptions::default())
        .await
        .unwrap_err();
    let waited = t.elapsed();
    assert_eq!(err, SubmitError::QueueTimeout);
    assert_eq!((err.code(), err.http_status()), ("queue_timeout", 503));
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    assert_eq!(
        svc.stats().queued,
        0,
        "the timed-out request is still queued"
    );
    drop(a);
    // The worker skips the abandoned request and serves the next one.
    let mut c = svc
        .submit(req(&[5], 2), SubmitOptions::default())
        .await
        .unwrap();
    assert_eq!(tokens(&collect(&mut c).await).len(), 2);
    let stats = svc.stats();
    assert_eq!(
        (stats.completed, stats.cancelled, stats.rejected),
        (1, 1, 1)
    );
    assert!(
        svc.metrics_text()
            .contains("qwasi_requests_rejected_total{reason=\"queue_timeout\"} 1")
    );
}

#[tokio::test]
async fn dropping_the_handle_cancels_within_a_step() {
    const STEP: u64 = 100;
    let forwards = Arc::new(AtomicUsize::new(0));
    let backend = TestBackend::new(model(), Duration::from_millis(STEP), forwards.clone(), None);
    let svc = EngineService::start(backend, None, "tiny".into(), base_cfg());
    let a = svc
        .submit(req(&[1, 2, 3], 1000), SubmitOptions::default())
        .await
        .unwrap();
    a.wait().await; // decoding has begun
    let s2 = svc.clone();
    let b = tokio::spawn(async move {
        let h = s2.submit(req(&[4, 5], 3), SubmitOptions::default()).await;
        (h, Instant::now())
    });
    until(|| svc.stats().queued == 1).await;
    let t = Instant::now();
    let at_cancel = forwards.load(Ordering::SeqCst);
    drop(a);
    let (h, started_at) = b.await.unwrap();
    let mut h = h.unwrap();
    let latency = started_at - t;
    // A ran at most the decode step in flight after the cancel (B's prefill
    // may have begun too) ...
    let after = forwards.load(Ordering::SeqCst) - at_cancel;
    assert!(
        after <= 1,
        "{after} forward passes between the cancel and B's start"
    );
    // ... so B started within about one step (plus scheduling slack on a
    // busy machine), not after A's 1000 tokens.
    assert!(
        latency < Duration::from_millis(STEP * 3),
        "the next request started {latency:?} after the cancel"
    );
    assert_eq!(tokens(&collect(&mut h).await).len(), 3);
    let stats = svc.stats();
    assert_eq!((stats.cancelled, stats.completed), (1, 1));
}

#[tokio::test]
async fn cancel_reports_cancelled_after_at_most_one_more_token() {
    let (svc, _) = service(30, base_cfg());
    let mut h = svc
        .submit(req(&[1, 2, 3], 1000), SubmitOptions::default())
        .await
        .unwrap();
    h.wait().await;
    let before = tokens(&h.try_next()).len();
    h.cancel();
    let rest = collect(&mut h).await;
    assert!(
        tokens(&rest).len() <= 1,
        "{} tokens after cancel",
        tokens(&rest).len()
    );
    match rest.last().unwrap() {
        Event::Finished { reason, usage, .. } => {
            assert_eq!(*reason, FinishReason::Cancelled);
            assert_eq!(
                usage.completion_tokens as usize,
                before + tokens(&rest).len()
            );
        }
        e => panic!("{e:?}"),
    }
}

#[tokio::test]
async fn dropping_submit_before_start_leaves_the_queue() {
    let (svc, _) = service(20, base_cfg());
    let a = svc
        .submit(req(&[1, 2, 3], 1000), SubmitOptions::default())
        .await
        .unwrap();
    let gone = tokio::time::timeout(
        Duration::from_millis(60),
        svc.submit(req(&[4], 5), SubmitOptions::default()),
    )
    .await;
    assert!(gone.is_err());
    assert_eq!(svc.stats().queued, 0);
    drop(a);
    let mut c = svc
        .submit(req(&[5], 2), SubmitOptions::default())
        .await
        .unwrap();
    collect(&mut c).await;
    let stats = svc.stats();
    // Only A (cancelled) and C ran; the dropped request never started.
    assert_eq!(
        (stats.cancelled, stats.completed, stats.rejected),
        (1, 1, 0)
    );
}

#[tokio::test]
async fn drain_refuses_new_requests_and_finishes_queued_ones() {
    let (svc, _) = service(20, base_cfg());
    let mut a = svc
        .submit(req(&[1, 2, 3], 8), SubmitOptions::default())
        .await
        .unwrap();
    let s2 = svc.clone();
    let b = tokio::spawn(async move {
        let mut h = s2
            .submit(req(&[4, 5], 4), SubmitOptions::default())
            .await
            .unwrap();
        collect(&mut h).await
    });
    until(|| svc.stats().queued == 1).await;
    svc.begin_drain();
    assert!(svc.stats().draining);
    let err = svc
        .submit(req(&[6], 2), SubmitOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err, SubmitError::ShuttingDown);
    assert_eq!(
        (err.code(), err.http_status()),
        ("service_shutting_down", 503)
    );
    // Not drained while work remains.
    assert!(
        tokio::time::timeout(Duration::from_millis(30), svc.drained())
            .await
            .is_err()
    );
    let a_events = collect(&mut a).await;
    assert_eq!(tokens(&a_events).len(), 8);
    tokio::time::timeout(Duration::from_secs(10), svc.drained())
        .await
        .expect("drained() did not resolve");
    let b_events = b.await.unwrap();
    assert_eq!(tokens(&b_events).len(), 4);
    let stats = svc.stats();
    assert_eq!((stats.queued, stats.running, stats.completed), (0, 0, 2));
    assert!(
        svc.metrics_text()
            .contains("qwasi_requests_rejected_total{reason=\"shutting_down\"} 1")
    );
}

#[tokio::test]
async fn a_backend_panic_fails_one_request_and_the_worker_keeps_serving() {
    let (svc, _) = service(0, base_cfg());
    let mut h = svc
        .submit(req(&[1, PANIC_TOKEN, 3], 4), SubmitOptions::default())
        .await
        .unwrap();
    let events = collect(&mut h).await;
    match &events[..] {
        [Event::Failed(msg)] => assert!(msg.contains("panicked") && msg.contains("magic"), "{msg}"),
        e => panic!("{e:?}"),
    }
    let mut h = svc
        .submit(req(&[1, ERROR_TOKEN, 3], 4), SubmitOptions::default())
        .await
        .unwrap();
    match &collect(&mut h).await[..] {
        [Event::Failed(msg)] => assert!(msg.contains("magic token 43"), "{msg}"),
        e => panic!("{e:?}"),
    }
    let mut h = svc
        .submit(req(&[1, 2, 3], 4), SubmitOptions::default())
        .await
        .unwrap();
    assert_eq!(tokens(&collect(&mut h).await).len(), 4);
    let stats = svc.stats();
    assert_eq!((stats.failed, stats.completed, stats.running), (2, 1, 0));
    assert!(
        svc.metrics_text()
            .contains("qwasi_requests_finished_total{reason=\"failed\"} 2")
    );
}

/// Value of an unlabelled sample or one with exactly this label set.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {series} in\n{text}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn metrics_text_has_every_family_with_sane_values() {
    let (svc, _) = service(2, base_cfg());
    for (p, n) in [(&[1u32, 2, 3][..], 5usize), (&[4, 5][..], 3)] {
        let mut h = svc
            .submit(req(p, n), SubmitOptions::default())
            .await
            .unwrap();
        collect(&mut h).await;
        svc.record_http(200);
    }
    svc.record_http(429);
    let text = svc.metrics_text();
    for (family, kind) in [
        ("qwasi_queue_depth", "gauge"),
        ("qwasi_requests_running", "gauge"),
        ("qwasi_requests_total", "counter"),
        ("qwasi_requests_rejected_total", "counter"),
        ("qwasi_prompt_tokens_total", "counter"),
        ("qwasi_completion_tokens_total", "counter"),
        ("qwasi_prefix_cache_hits_total", "counter"),
        ("qwasi_prefix_cache_misses_total", "counter"),
        ("qwasi_time_to_first_token_seconds", "histogram"),
        ("qwasi_inter_token_latency_seconds", "histogram"),
        ("qwasi_request_duration_seconds", "histogram"),
        ("qwasi_first_token_phase_seconds_total", "counter"),
    ] {
        assert!(
            text.contains(&format!("# HELP {family} ")),
            "no HELP for {family}"
        );
        assert!(
            text.contains(&format!("# TYPE {family} {kind}\n")),
            "no TYPE for {family}"
        );
    }
    assert_eq!(sample(&text, "qwasi_queue_depth"), 0.0);
    assert_eq!(sample(&text, "qwasi_requests_running"), 0.0);
    assert_eq!(sample(&text, "qwasi_requests_total{status=\"200\"}"), 2.0);
    assert_eq!(sample(&text, "qwasi_requests_total{status=\"429\"}"), 1.0);
    assert_eq!(sample(&text, "qwasi_prompt_tokens_total"), 5.0);
    assert_eq!(sample(&text, "qwasi_completion_tokens_total"), 8.0);
    assert_eq!(sample(&text, "qwasi_prefix_cache_hits_total"), 0.0);
    assert_eq!(sample(&text, "qwasi_prefix_cache_misses_total"), 0.0);
    assert_eq!(
        sample(
            &text,
            "qwasi_requests_rejected_total{reason=\"queue_full\"}"
        ),
        0.0
    );
    // Before the first tokens: two prefills of a forward that sleeps 2 ms
    // each, within the TTFTs; no prefix cache, so no lookup, restore or snapshot.
    let phase = |p: &str| {
        sample(
            &text,
            &format!("qwasi_first_token_phase_seconds_total{{phase=\"{p}\"}}"),
        )
    };
    let prefill = phase("prefill");
    assert!(prefill >= 0.004, "{prefill}");
    assert!(prefill + phase("sample") <= sample(&text, "qwasi_time_to_first_token_seconds_sum"));
    for p in ["lookup", "restore", "snapshot"] {
        assert_eq!(phase(p), 0.0, "{p}");
    }
    // Histograms: cumulative buckets ending in +Inf == _count, sane sums.
    for (h, count) in [
        ("qwasi_time_to_first_token_seconds", 2.0),
        ("qwasi_inter_token_latency_seconds", 6.0),
        ("qwasi_request_duration_seconds", 2.0),
    ] {
        let buckets: Vec<f64> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{h}_bucket{{")))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(buckets.len() > 5);
        assert!(
            buckets.windows(2).all(|w| w[0] <= w[1]),
            "{h} buckets not cumulative"
        );
        assert_eq!(
            sample(&text, &format!("{h}_bucket{{le=\"+Inf\"}}")),
            count,
            "{h}"
        );
        assert_eq!(sample(&text, &format!("{h}_count")), count, "{h}");
        let sum = sample(&text, &format!("{h}_sum"));
        assert!(sum > 0.0 && sum < 60.0, "{h}_sum = {sum}");
    }
    // Engine steps by phase: each request's prompt in one step, then one
    // decode step per further token (the 6 inter-token gaps), each forward
    // sleeping 2 ms; the two series are rendered as one family.
    assert!(text.contains("# TYPE qwasi_step_duration_seconds histogram\n"));
    let step = |phase: &str, what: &str| {
        sample(
            &text,
            &format!("qwasi_step_duration_seconds_{what}{{phase=\"{phase}\"}}"),
        )
    };
    for (phase, steps) in [("prompt", 2.0), ("decode", 6.0)] {
        assert_eq!(step(phase, "count"), steps, "{phase}");
        let sum = step(phase, "sum");
        assert!(sum >= 0.002 * steps && sum < 60.0, "{phase}: {sum}");
        assert_eq!(
            sample(
                &text,
                &format!("qwasi_step_duration_seconds_bucket{{phase=\"{phase}\",le=\"+Inf\"}}")
            ),
            steps
        );
    }
    // Each forward sleeps 2 ms, so no inter-token latency is below 1 ms.
    assert_eq!(
        sample(
            &text,
            "qwasi_inter_token_latency_seconds_bucket{le=\"0.001\"}"
        ),
        0.0
    );
    let ttft_le_1ms = sample(
        &text,
        "qwasi_time_to_first_token_seconds_bucket{le=\"0.001\"}",
    );
    assert_eq!(ttft_le_1ms, 0.0);
}

#[tokio::test]
async fn invalid_requests_are_refused_with_the_right_error() {
    let cfg = ServiceConfig {
        max_model_len: 64,
        ..base_cfg()
    };
    let (svc, _) = service(0, cfg);
    assert_eq!(svc.max_model_len(), 64);
    assert_eq!(svc.model_id(), "tiny");
    assert_eq!(svc.model_config().vocab_size, 300);
    let check = |r: GenerateRequest, code: &str, needle: &str| {
        let e = svc.validate(&r).unwrap_err();
        assert_eq!(e.code(), code, "{e}");
        assert_eq!(e.http_status(), 400);
        assert!(e.to_string().contains(needle), "{e}");
    };
    check(req(&[1, 300], 4), "invalid_request_error", "300");
    check(req(&[], 4), "invalid_request_error", "at least one token");
    check(
        GenerateRequest {
            stop_token_ids: vec![1000],
            ..req(&[1], 4)
        },
        "invalid_request_error",
        "1000",
    );
    check(
        GenerateRequest {
            sampling: SamplingParams {
                top_p: 2.0,
                ..Default::default()
            },
            ..req(&[1], 4)
        },
        "invalid_request_error",
        "top_p",
    );
    check(req(&[1; 60], 10), "context_length_exceeded", "64");
    check(req(&[1; 64], 0), "context_length_exceeded", "64");
    // Through submit too, and nothing is queued or counted as rejected.
    let e = svc
        .submit(req(&[1; 70], 1), SubmitOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(e, SubmitError::ContextLengthExceeded(_)), "{e:?}");
    assert_eq!(
        svc.stats(),
        qwasi_engine::service::QueueStats {
            capacity: 8,
            ..Default::default()
        }
    );
    // Exactly at the limit is fine.
    let mut h = svc
        .submit(req(&[1; 60], 4), SubmitOptions::default())
        .await
        .unwrap();
    assert_eq!(tokens(&collect(&mut h).await).len(), 4);

    // Operator caps.
    let (svc, _) = service(
        0,
        ServiceConfig {
            max_prompt_tokens: 8,
            max_completion_tokens: 16,
            ..base_cfg()
        },
    );
    let e = svc.validate(&req(&[1; 9], 4)).unwrap_err();
    assert_eq!(e.code(), "context_length_exceeded", "{e}");
    let e = svc.validate(&req(&[1; 8], 17)).unwrap_err();
    assert_eq!(e.code(), "invalid_request_error", "{e}");
    svc.validate(&req(&[1; 8], 16)).unwrap();
}

#[tokio::test]
async fn max_tokens_zero_finishes_at_once() {
    let (svc, _) = service(0, base_cfg());
    let mut h = svc
        .submit(req(&[1, 2], 0), SubmitOptions::default())
        .await
        .unwrap();
    match &collect(&mut h).await[..] {
        [Event::Finished { reason, usage, .. }] => {
            assert_eq!(*reason, FinishReason::Length);
            assert_eq!((usage.prompt_tokens, usage.completion_tokens), (2, 0));
        }
        e => panic!("{e:?}"),
    }
}

#[tokio::test]
async fn detokenized_text_matches_the_tokenizer() {
    let tok = Tokenizer::qwen36().unwrap();
    let backend = TestBackend::new(model(), Duration::ZERO, Arc::default(), None);
    let svc = EngineService::start(backend, Some(tok.clone()), "tiny".into(), base_cfg());
    let r = GenerateRequest {
        sampling: SamplingParams {
            temperature: 1.0,
            seed: Some(5),
            ..Default::default()
        },
        ..req(&[200, 201, 202], 40)
    };
    let opts = SubmitOptions {
        detokenize: true,
        ..Default::default()
    };
    let mut h = svc.submit(r, opts).await.unwrap();
    let events = collect(&mut h).await;
    let mut text = String::new();
    for e in &events {
        match e {
            Event::Token { text: t, .. } => text.push_str(t),
            Event::Finished { trailing_text, .. } => text.push_str(trailing_text),
            Event::Failed(m) => panic!("{m}"),
        }
    }
    assert_eq!(text, tok.decode(&tokens(&events), true).unwrap());
    assert!(!text.is_empty());

    // Without detokenize the text stays empty.
    let mut h = svc
        .submit(req(&[1], 3), SubmitOptions::default())
        .await
        .unwrap();
    for e in collect(&mut h).await {
        if let Event::Token { text, .. } = e {
            assert!(text.is_empty());
        }
    }
}

#[tokio::test]
async fn a_request_outlives_the_service_handle() {
    let (svc, _) = service(5, base_cfg());
    let mut h = svc
        .submit(req(&[1, 2, 3], 6), SubmitOptions::default())
        .await
        .unwrap();
    drop(svc);
    assert_eq!(tokens(&collect(&mut h).await).len(), 6);
}

#[test]
fn the_api_is_send() {
    fn send<T: Send>(_: &T) {}
    fn sync<T: Send + Sync>() {}
    let (svc, _) = service(0, base_cfg());
    send(&svc.submit(req(&[1], 1), SubmitOptions::default()));
    send(&svc.drained());
    sync::<GenerationHandle>();
    sync::<EngineService>();
}

/// Calls per request of `forward`, `forward_greedy`, `forward_top` and
/// `forward_weighted` when the prefill and `steps` decode steps are read as
/// `path`.
fn expected_calls(path: Readout, steps: usize) -> [usize; 4] {
    // The prompt is read the same way as each decode step.
    let n = steps + 1;
    match path {
        Readout::Logits => [n, 0, 0, 0],
        Readout::Greedy => [0, n, 0, 0],
        Readout::Top => [0, 0, n, 0],
        Readout::Weighted => [0, 0, 0, n],
    }
}

/// A device-reading test backend and its counters in [`expected_calls`]' order.
fn counting_backend() -> (TestBackend, [Arc<AtomicUsize>; 4]) {
    let (forwards, picked) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let b = TestBackend::new(
        model(),
        Duration::ZERO,
        forwards.clone(),
        Some(picked.clone()),
    );
    let counters = [forwards, picked, b.tops.clone(), b.weighted.clone()];
    (b, counters)
}

/// The counts since the last call.
fn take_calls(counters: &[Arc<AtomicUsize>; 4]) -> [usize; 4] {
    [0, 1, 2, 3].map(|i| counters[i].swap(0, Ordering::SeqCst))
}

#[tokio::test]
async fn requests_read_as_little_of_the_logits_as_their_sampling_needs() {
    let (backend, counters) = counting_backend();
    let svc = EngineService::start(backend, None, "tiny".into(), base_cfg());
    let (host, _) = service(0, base_cfg());
    let prompt: Vec<u32> = (1..40).collect();
    let with = |f: fn(&mut SamplingParams)| {
        let mut s = SamplingParams::default();
        f(&mut s);
        s
    };
    let sampled = |f: fn(&mut SamplingParams)| {
        let mut s = SamplingParams {
            temperature: 0.8,
            seed: Some(3),
            ..Default::default()
        };
        f(&mut s);
        s
    };
    let cases = [
        (SamplingParams::default(), Readout::Greedy),
        (with(|s| s.logprobs = Some(0)), Readout::Greedy),
        (with(|s| s.logprobs = Some(3)), Readout::Top),
        (with(|s| s.repetition_penalty = 1.3), Readout::Logits),
        (with(|s| s.presence_penalty = 0.5), Readout::Logits),
        (with(|s| s.logit_bias = vec![(5, 2.0)]), Readout::Logits),
        (sampled(|_| {}), Readout::Weighted),
        (
            sampled(|s| {
                s.min_p = 0.1;
                s.logprobs = Some(4);
            }),
            Readout::Weighted,
        ),
        (sampled(|s| s.top_p = 0.9), Readout::Weighted),
        (
            sampled(|s| {
                s.top_p = 0.5;
                s.repetition_penalty = 1.1;
            }),
            Readout::Logits,
        ),
        (sampled(|s| s.top_k = 20), Readout::Top),
        (
            sampled(|s| {
                s.top_k = 40;
                s.top_p = 0.9;
                s.min_p = 0.05;
                s.logprobs = Some(5);
            }),
            Readout::Top,
        ),
        (sampled(|s| s.top_k = 65), Readout::Logits),
        (
            sampled(|s| {
                s.top_k = 20;
                s.frequency_penalty = 0.3;
            }),
            Readout::Logits,
        ),
    ];
    for (sampling, path) in cases {
        let mut r = req(&prompt, 6);
        r.sampling = sampling.clone();
        take_calls(&counters);
        let mut h = svc
            .submit(r.clone(), SubmitOptions::default())
            .await
            .unwrap();
        let got = collect(&mut h).await;
        let mut h = host.submit(r, SubmitOptions::default()).await.unwrap();
        let want = collect(&mut h).await;
        // Same tokens, logprobs and ending as sampling from the full logits.
        assert_eq!(got, want, "{sampling:?}");
        assert_eq!(tokens(&got).len(), 6);
        assert_eq!(
            take_calls(&counters),
            expected_calls(path, 5),
            "{sampling:?}"
        );
    }
}

#[test]
fn generate_reads_as_little_of_the_logits_as_its_sampling_needs() {
    let (backend, counters) = counting_backend();
    let m = model();
    for (temperature, top_k, logprobs, path) in [
        (0.0, 0, None, Readout::Greedy),
        (0.0, 0, Some(2), Readout::Top),
        (0.7, 10, Some(2), Readout::Top),
        (0.7, 0, None, Readout::Weighted),
    ] {
        let mut r = GenerateRequest {
            ignore_eos: false,
            ..req(&[1, 2, 3, 4, 5], 10)
        };
        r.sampling.temperature = temperature;
        r.sampling.top_k = top_k;
        r.sampling.logprobs = logprobs;
        r.sampling.seed = Some(11);
        take_calls(&counters);
        let got = generate(&backend, &r, |_, _| ControlFlow::Continue(())).unwrap();
        let want = generate(&*m, &r, |_, _| ControlFlow::Continue(())).unwrap();
        assert_eq!(got.tokens, want.tokens);
        assert_eq!(got.steps, want.steps);
        assert_eq!(
            take_calls(&counters),
            expected_calls(path, got.steps.len() - 1),
            "{r:?}"
        );
    }
}

/// `prompt` submitted to `svc` for `max_tokens` tokens, every event collected.
async fn run(svc: &EngineService, prompt: &[u32], max_tokens: usize) -> Vec<Event> {
    collect(
        &mut svc
            .submit(req(prompt, max_tokens), SubmitOptions::default())
            .await
            .unwrap(),
    )
    .await
}

/// The prompt tokens a finished request took from the prefix cache.
fn cached_tokens(events: &[Event]) -> usize {
    match events.last() {
        Some(Event::Finished { usage, .. }) => usage.cached_tokens as usize,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_greedy_turn_decoded_on_the_device_still_caches_its_end() {
    let cfg = ServiceConfig {
        prefix_cache_bytes: 64 << 20,
        ..base_cfg()
    };
    let backend = TestBackend::new(
        model(),
        Duration::ZERO,
        Arc::default(),
        Some(Arc::default()),
    );
    let svc = EngineService::start(backend, None, "tiny".into(), cfg.clone());
    let (host, _) = service(0, cfg);
    let prompt: Vec<u32> = (1..40).collect();
    let first = run(&svc, &prompt, 5).await;
    // The end-of-generation snapshot (no logits: none came back) is there.
    let cache = svc.prefix_cache().unwrap();
    let mut end = prompt.clone();
    end.extend(&tokens(&first)[..4]);
    assert!(cache.contains(None, &end));
    assert!(!cache.contains_with_logits(None, &end));
    // The prompt's end, whose first token was drawn on the device too, has
    // the logits the backend kept: resending the prompt is a full hit with
    // the same tokens.
    assert!(cache.contains_with_logits(None, &prompt));
    let again = run(&svc, &prompt, 5).await;
    assert_eq!(tokens(&again), tokens(&first));
    assert_eq!(cached_tokens(&again), prompt.len());
    assert_eq!(
        sample(&svc.metrics_text(), "qwasi_prefix_cache_full_hits_total"),
        1.0
    );
    // The next turn resumes from it and matches the host path's run.
    let mut turn = end.clone();
    turn.extend([tokens(&first)[4], 7, 8, 9]);
    let got = run(&svc, &turn, 5).await;
    let want = run(&host, &turn, 5).await;
    assert_eq!(tokens(&got), tokens(&want));
    assert_eq!(cached_tokens(&got), end.len());
}
