//! Continuous batching on the CPU: the batched step is bit-exact with each
//! sequence alone, and the scheduler (mixed batches, chunked prompts,
//! arrivals mid-stream, cancellation, preemption) gives every request the
//! tokens it gets alone and leaves nothing behind.

mod common;

use anyhow::Result;
use qwasi_engine::backend::{Backend, BatchItem, SeqSnapshot, StepOut, Want};
use qwasi_engine::config::ModelConfig;
use qwasi_engine::cpu::{CpuModel, CpuSequence};
use qwasi_engine::demo::RandomWeights;
use qwasi_engine::generate::{FinishReason, GenerateRequest, generate};
use qwasi_engine::sampling::{SamplingParams, greedy, top_logits};
use qwasi_engine::service::{
    EngineService, Event, GenerationHandle, ServiceConfig, SubmitError, SubmitOptions,
};
use qwasi_engine::weights::Weights;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const EOS: u32 = 299;

fn cpu(kv_budget: Option<usize>) -> CpuModel {
    let cfg = ModelConfig::from_json(&common::tiny_moe_config(EOS)).unwrap();
    let weights = Weights::load(&cfg, &RandomWeights { seed: 7 }).unwrap();
    CpuModel::new(cfg, weights).with_kv_budget(kv_budget)
}

fn bits(l: &[f32]) -> Vec<u32> {
    l.iter().map(|v| v.to_bits()).collect()
}

/// A prompt of `n` tokens (ids from `seed`).
fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + seed * 11 + 1) % 290)
        .collect()
}

/// Runs `prompt` alone, then `n` greedy tokens: the logits after the
/// prompt and after each token.
fn alone(m: &CpuModel, prompt: &[u32], n: usize) -> Vec<Vec<f32>> {
    let mut seq = m.new_sequence();
    let mut out = vec![m.forward(&mut seq, prompt).unwrap()];
    for _ in 0..n {
        let t = greedy(out.last().unwrap()).token;
        out.push(m.forward(&mut seq, &[t]).unwrap());
    }
    out
}

#[test]
fn a_batched_step_is_bit_exact_with_each_sequence_alone() {
    let m = cpu(None);
    // Prompt lengths across a KV page (64) and chunk sizes per sequence.
    let cases: [(usize, usize); 5] = [(1, 1), (5, 5), (70, 16), (130, 64), (9, 4)];
    let prompts: Vec<Vec<u32>> = cases
        .iter()
        .enumerate()
        .map(|(i, &(n, _))| prompt(n, i as u32))
        .collect();
    const DECODE: usize = 6;
    let want: Vec<Vec<Vec<f32>>> = prompts.iter().map(|p| alone(&m, p, DECODE)).collect();
    let mut seqs: Vec<CpuSequence> = prompts.iter().map(|_| m.new_sequence()).collect();
    // Per sequence: its context, how much is computed, the readouts it got.
    let mut ctx = prompts.clone();
    let mut done = vec![0usize; prompts.len()];
    let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); prompts.len()];
    let mut step = 0;
    while got.iter().any(|g| g.len() <= DECODE) {
        step += 1;
        // Sequences join one step apart (arrivals mid-stream); each row's
        // readout rotates through the kinds.
        let mut rows = Vec::new();
        let mut items: Vec<BatchItem<'_, CpuSequence>> = Vec::new();
        for (i, seq) in seqs.iter_mut().enumerate() {
            if i >= step || got[i].len() > DECODE {
                continue;
            }
            let chunk = cases[i].1.min(ctx[i].len() - done[i]);
            let end = done[i] + chunk == ctx[i].len();
            let want = match (end, (step + i) % 3) {
                (false, _) => Want::Nothing,
                (true, 0) => Want::Logits,
                (true, 1) => Want::Greedy,
                (true, _) => Want::Top(8),
            };
            rows.push((i, chunk));
            items.push(BatchItem {
                seq,
                tokens: &ctx[i][done[i]..done[i] + chunk],
                want,
                mask: None,
                snapshots: Default::default(),
            });
        }
        let outs = m.step(&mut items);
        drop(items);
        assert_eq!(outs.len(), rows.len());
        for ((i, chunk), out) in rows.into_iter().zip(outs) {
            done[i] += chunk;
            let reference = &want[i][got[i].len()];
            let next = match out.unwrap() {
                StepOut::Extended => continue,
                StepOut::Logits(l) => {
                    assert_eq!(bits(&l), bits(reference), "seq {i} step {step}");
                    greedy(&l).token
                }
                StepOut::Greedy(s) => {
                    assert_eq!(s, greedy(reference), "seq {i} step {step}");
                    s.token
                }
                StepOut::Top(t) => {
                    assert_eq!(t, top_logits(reference, 8), "seq {i} step {step}");
                    t.top[0].0
                }
                StepOut::Weighted(_) => unreachable!(),
            };
            got[i].push(reference.clone());
            ctx[i].push(next);
        }
    }
    // A bad row fails alone; its batch-mates run.
    let (mut a, mut b) = (m.new_sequence(), m.new_sequence());
    let outs = m.step(&mut [
        BatchItem {
            seq: &mut a,
            tokens: &[1, 300],
            want: Want::Logits,
            mask: None,
            snapshots: Default::default(),
        },
        BatchItem {
            seq: &mut b,
            tokens: &prompts[1],
            want: Want::Logits,
            mask: None,
            snapshots: Default::default(),
        },
    ]);
    assert!(format!("{:#}", outs[0].as_ref().unwrap_err()).contains("out of range"));
    match &outs[1] {
        Ok(StepOut::Logits(l)) => assert_eq!(bits(l), bits(&want[1][0])),
        o => panic!("{o:?}"),
    }
    assert_eq!((m.position(&a), m.position(&b)), (0, 5));
    // A step where no row reads anything back (prompt chunks only).
    let outs = m.step(&mut [
        BatchItem {
            seq: &mut a,
            tokens: &[1, 2],
            want: Want::Nothing,
            mask: None,
            snapshots: Default::default(),
        },
        BatchItem {
            seq: &mut b,
            tokens: &[3],
            want: Want::Nothing,
            mask: None,
            snapshots: Default::default(),
        },
    ]);
    assert!(outs.iter().all(|o| matches!(o, Ok(StepOut::Extended))));
    assert_eq!((m.position(&a), m.position(&b)), (2, 6));
}

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

fn start<B: Backend + 'static>(b: B, cfg: ServiceConfig) -> EngineService {
    EngineService::start(b, None, "tiny".into(), cfg)
}

fn req(prompt: &[u32], max_tokens: usize, sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        stop_token_ids: vec![],
        ignore_eos: false,
        sampling,
    }
}

fn seeded(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        seed: Some(seed),
        frequency_penalty: 0.3,
        logprobs: Some(2),
        ..Default::default()
    }
}

/// The request's tokens and logprobs run alone.
fn expected(m: &CpuModel, r: &GenerateRequest) -> Vec<(u32, Option<f32>)> {
    let g = generate(m, r, |_, _| ControlFlow::Continue(())).unwrap();
    g.tokens
        .iter()
        .zip(&g.steps)
        .map(|(&t, s)| (t, r.sampling.logprobs.map(|_| s.logprob)))
        .collect()
}

async fn collect(h: &mut GenerationHandle) -> Vec<Event> {
    let all = async {
        let mut all = Vec::new();
        loop {
            h.wait().await;
            let evs = h.try_next();
            let done = evs.iter().any(Event::is_terminal);
            all.extend(evs);
            if done {
                return all;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("request did not finish")
}

fn got(events: &[Event]) -> Vec<(u32, Option<f32>)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Token { id, logprob, .. } => Some((*id, logprob.as_ref().map(|s| s.logprob))),
            _ => None,
        })
        .collect()
}

fn reason(events: &[Event]) -> FinishReason {
    match events.last() {
        Some(Event::Finished { reason, .. }) => *reason,
        e => panic!("not finished: {e:?}"),
    }
}

/// Value of an unlabelled sample.
fn metric(svc: &EngineService, name: &str) -> f64 {
    let text = svc.metrics_text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {name} in\n{text}"))
        .parse()
        .unwrap()
}

async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(30), "{what}: not reached");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Requests in one batch (greedy and seeded sampling, prompts chunked into
/// decode steps, some arriving while others stream) get the tokens and
/// logprobs each gets alone.
#[tokio::test]
async fn batched_requests_get_the_tokens_they_get_alone() {
    let m = cpu(None);
    let svc = start(
        cpu(None),
        ServiceConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 12,
            ..ServiceConfig::default()
        },
    );
    assert_eq!((svc.max_num_seqs(), svc.max_num_batched_tokens()), (8, 12));
    let reqs: Vec<GenerateRequest> = (0..7)
        .map(|i| {
            let sampling = if i % 2 == 0 {
                SamplingParams::default()
            } else {
                seeded(100 + i as u64)
            };
            GenerateRequest {
                ignore_eos: true,
                ..req(
                    &prompt([3, 40, 1, 75, 9, 130, 20][i], i as u32),
                    24,
                    sampling,
                )
            }
        })
        .collect();
    let mut handles = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        let h = svc
            .submit(r.clone(), SubmitOptions::default())
            .await
            .unwrap();
        if i == 2 {
            // The rest arrive while the first ones stream.
            h.wait().await;
        }
        handles.push(h);
    }
    for (i, (r, mut h)) in reqs.iter().zip(handles).enumerate() {
        let events = collect(&mut h).await;
        assert_eq!(got(&events), expected(&m, r), "request {i}");
    }
    let steps = metric(&svc, "qwasi_batch_size_count");
    let rows = metric(&svc, "qwasi_batch_size_sum");
    assert!(
        rows > steps * 1.5,
        "{rows} rows in {steps} steps: little batching"
    );
    assert_eq!(metric(&svc, "qwasi_batch_size_bucket{le=\"8\"}"), steps);
    // Prompts were chunked under the step budget (130 tokens at most 12 a step).
    assert_eq!(
        metric(&svc, "qwasi_step_prefill_tokens_bucket{le=\"16\"}"),
        steps
    );
    assert!(metric(&svc, "qwasi_step_prefill_tokens_sum") >= 278.0);
}

/// The CPU model posing as a backend that keeps the logits where they are
/// (as the GPU does): requests read back the greedy token, the row's head
/// or its weights, in batches.
struct OnDevice(Arc<CpuModel>);

impl Backend for OnDevice {
    type Sequence = CpuSequence;
    fn name(&self) -> &'static str {
        "on-device"
    }
    fn config(&self) -> &ModelConfig {
        self.0.config()
    }
    fn new_sequence(&self) -> CpuSequence {
        self.0.new_sequence()
    }
    fn position(&self, seq: &CpuSequence) -> usize {
        self.0.position(seq)
    }
    fn forward(&self, seq: &mut CpuSequence, tokens: &[u32]) -> Result<Vec<f32>> {
        self.0.forward(seq, tokens)
    }
    fn step(&self, batch: &mut [BatchItem<'_, CpuSequence>]) -> Vec<Result<StepOut>> {
        self.0.step(batch)
    }
    fn logits_on_device(&self) -> bool {
        true
    }
}

/// Batched rows that read back less than the logits (greedy, the head,
/// the weighted row: each request's RNG stream drawn in its own row) give
/// the tokens the host sampler gives alone.
#[tokio::test]
async fn batched_device_readouts_give_the_tokens_alone() {
    let m = Arc::new(cpu(None));
    let svc = start(
        OnDevice(m.clone()),
        ServiceConfig {
            max_num_seqs: 6,
            max_num_batched_tokens: 16,
            ..ServiceConfig::default()
        },
    );
    let samplings = [
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.7,
            top_k: 20,
            seed: Some(3),
            ..Default::default()
        },
        SamplingParams {
            temperature: 0.9,
            top_p: 0.8,
            seed: Some(4),
            logprobs: Some(1),
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.2,
            min_p: 0.05,
            seed: Some(5),
            ..Default::default()
        },
    ];
    let reqs: Vec<GenerateRequest> = samplings
        .iter()
        .enumerate()
        .map(|(i, s)| GenerateRequest {
            ignore_eos: true,
            ..req(&prompt(7 + 23 * i, i as u32), 20, s.clone())
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
        assert_eq!(got(&events), expected(&m, r), "request {i}");
    }
    assert!(metric(&svc, "qwasi_batch_size_sum") > metric(&svc, "qwasi_batch_size_count"));
}

/// While a request decodes, another's prompt is read at most
/// `prefill_while_decoding` tokens a step (the first one's prompt, read
/// alone, is not cut), and it still gets the tokens it gets alone.
#[tokio::test]
async fn prompts_read_beside_decoding_streams_keep_to_their_cap() {
    let m = cpu(None);
    let slow = Slow::new(Arc::new(cpu(None)), Duration::from_millis(2));
    let svc = start(
        slow,
        ServiceConfig {
            max_num_seqs: 4,
            max_num_batched_tokens: 64,
            prefill_while_decoding: 16,
            ..ServiceConfig::default()
        },
    );
    let a = svc
        .submit(
            req(&prompt(40, 1), 3000, SamplingParams::default()),
            SubmitOptions::default(),
        )
        .await
        .unwrap();
    a.wait().await;
    let r = GenerateRequest {
        ignore_eos: true,
        ..req(&prompt(200, 2), 5, seeded(3))
    };
    let mut b = svc
        .submit(r.clone(), SubmitOptions::default())
        .await
        .unwrap();
    assert_eq!(got(&collect(&mut b).await), expected(&m, &r));
    drop(a);
    until("idle", || svc.stats().running == 0).await;
    let steps = metric(&svc, "qwasi_step_prefill_tokens_count");
    let small = metric(&svc, "qwasi_step_prefill_tokens_bucket{le=\"16\"}");
    assert_eq!(small, steps - 1.0, "steps past the cap besides the first");
    assert!(metric(&svc, "qwasi_step_prefill_tokens_sum") >= 240.0);
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

/// Constrained requests keep their device readouts (greedy, the head, the
/// weighted row), the mask going with each step, in batches beside
/// unconstrained ones: every request gets the tokens and logprobs the host
/// mask gives it alone on the CPU (the logits readout, the constraint
/// applied to the row).
#[tokio::test]
async fn constrained_rows_keep_their_device_readouts() {
    use qwasi_engine::constraint::{Compiler, ConstraintSpec, Grammar};
    use qwasi_engine::generate::generate_with;
    use qwasi_engine::model::LoadedModel;
    let demo = LoadedModel::demo().unwrap();
    let tok = demo.tokenizer.clone().unwrap();
    let cfg = demo.config.clone();
    let m = Arc::new(CpuModel::new(demo.config, demo.weights));
    let compiler = Compiler::new(&tok, cfg.vocab_size, &cfg.eos_token_ids).unwrap();
    let grammars = [
        Grammar::JsonSchema {
            schema: serde_json::json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["n"], "additionalProperties": false}),
            strict: true,
        },
        Grammar::Regex("[a-z]{2,6}-[0-9]{1,3}".into()),
        Grammar::Choice(vec!["alpha".into(), "beta gamma".into()]),
    ];
    let samplings = [
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.8,
            top_k: 20,
            seed: Some(3),
            logprobs: Some(2),
            ..Default::default()
        },
        SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            seed: Some(4),
            logprobs: Some(1),
            ..Default::default()
        },
    ];
    let svc = start(
        OnDevice(m.clone()),
        ServiceConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 64,
            ..ServiceConfig::default()
        },
    );
    let chat = tok
        .encode("<|im_start|>user\nAnswer<|im_end|>\n<|im_start|>assistant\n")
        .unwrap();
    let mut runs = Vec::new();
    for (i, g) in grammars.iter().enumerate() {
        let compiled = compiler
            .compile(&ConstraintSpec {
                grammar: g.clone(),
                start_after: None,
            })
            .unwrap();
        for (k, s) in samplings.iter().enumerate() {
            let r = GenerateRequest {
                prompt: chat.clone(),
                max_tokens: 24,
                stop_token_ids: vec![],
                ignore_eos: false,
                sampling: s.clone(),
            };
            let host = generate_with(&*m, &r, Some(compiled.start()), |_, _| {
                ControlFlow::Continue(())
            })
            .unwrap();
            let want: Vec<(u32, Option<f32>)> = host
                .tokens
                .iter()
                .zip(&host.steps)
                .map(|(&t, st)| (t, s.logprobs.map(|_| st.logprob)))
                .collect();
            let opts = SubmitOptions {
                constraint: Some(compiled.clone()),
                ..Default::default()
            };
            let h = svc.submit(r.clone(), opts).await.unwrap();
            // An unconstrained neighbour in the same batches.
            let free = GenerateRequest {
                ignore_eos: true,
                ..req(&prompt(5 + i + k, k as u32), 12, s.clone())
            };
            let hf = svc
                .submit(free.clone(), SubmitOptions::default())
                .await
                .unwrap();
            runs.push((format!("grammar {i} sampling {k}"), h, want, hf, free));
        }
    }
    for (what, mut h, want, mut hf, free) in runs {
        assert_eq!(got(&collect(&mut h).await), want, "{what}");
        assert_eq!(
            got(&collect(&mut hf).await),
            expected(&m, &free),
            "{what}: its neighbour"
        );
    }
    assert!(metric(&svc, "qwasi_batch_size_sum") > metric(&svc, "qwasi_batch_size_count"));
}
