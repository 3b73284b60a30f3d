//! The prefix cache tests' harness: the tiny CPU model, a backend over it
//! that fails, panics, slows down and counts on demand, the engine service
//! around it, and the request helpers the tests share.

use anyhow::{Result, bail};
use qwasi_engine::backend::{Backend, BatchItem, SeqSnapshot, StepOut, step_split_snapshots};
use qwasi_engine::config::ModelConfig;
use qwasi_engine::cpu::{CpuModel, CpuSequence};
use qwasi_engine::demo::RandomWeights;
use qwasi_engine::generate::{FinishReason, GenerateRequest, generate};
use qwasi_engine::prefix_cache::{DumpEntry, PrefixCache};
use qwasi_engine::sampling::{Sampled, SamplingParams};
use qwasi_engine::service::{
    EngineService, Event, GenerationHandle, ServiceConfig, SubmitOptions, Usage,
};
use qwasi_engine::weights::Weights;
use serde_json::json;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const VOCAB: u32 = 300;
/// Cached vs cold on the CPU: bit-identical (the GDN recurrence runs token by
/// token, so where a prompt is split changes no sum; the issue asks for 1e-5).
pub const LOGPROB_TOL: f32 = 0.0;

/// A tiny MoE model: vocab 300, hidden 32, 4 layers (3 GDN + 1 attention).
pub fn model() -> Arc<CpuModel> {
    let cfg = ModelConfig::from_json(&json!({
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": {
            "model_type": "qwen3_5_moe_text",
            "vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 4,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
            "linear_num_key_heads": 1, "linear_num_value_heads": 2,
            "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
            "num_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
            "eos_token_id": 299
        }
    }))
    .unwrap();
    let weights = Weights::load(&cfg, &RandomWeights { seed: 11 }).unwrap();
    Arc::new(CpuModel::new(cfg, weights))
}

/// The CPU model with snapshot support, failing on demand: when a forward
/// would move the sequence past `fail_pos` it errors (or panics with
/// `panic`); `delay` slows each forward (for cancellation tests). Counts
/// forward/extend calls and the tokens they ran. With `copies`, snapshots
/// own all their bytes (see [`Copied`]).
pub struct Faulty {
    pub model: Arc<CpuModel>,
    pub fail_pos: Arc<AtomicUsize>,
    pub panic: Arc<AtomicBool>,
    pub delay: Duration,
    pub forwards: Arc<AtomicUsize>,
    pub forward_tokens: Arc<AtomicUsize>,
    pub copies: Option<Arc<CopyStats>>,
    /// With a host tier: `demote` makes [`Copied`] snapshots counted here.
    pub host: Option<Arc<CopyStats>>,
    /// What `resumed_in_place` says of every restored sequence.
    pub in_place: Arc<AtomicBool>,
    /// [`Backend::pass_snapshot_stride`]: with one, `step` stages the rows'
    /// in-pass snapshots (by splitting the row, exact on the CPU) and
    /// records every row's token count in `rows`.
    pub stride: Option<usize>,
    pub rows: Arc<Mutex<Vec<usize>>>,
}

impl Faulty {
    pub fn check(&self, seq: &CpuSequence, tokens: &[u32]) -> Result<()> {
        self.forwards.fetch_add(1, Ordering::SeqCst);
        self.forward_tokens
            .fetch_add(tokens.len(), Ordering::SeqCst);
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        if seq.position() + tokens.len() > self.fail_pos.load(Ordering::SeqCst) {
            if self.panic.load(Ordering::SeqCst) {
                panic!("injected panic");
            }
            bail!("injected failure");
        }
        Ok(())
    }
}

impl Backend for Faulty {
    type Sequence = CpuSequence;
    fn name(&self) -> &'static str {
        "faulty"
    }
    fn config(&self) -> &ModelConfig {
        self.model.config()
    }
    fn new_sequence(&self) -> CpuSequence {
        self.model.new_sequence()
    }
    fn position(&self, seq: &CpuSequence) -> usize {
        seq.position()
    }
    fn forward(&self, seq: &mut CpuSequence, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check(seq, tokens)?;
        self.model.forward(seq, tokens)
    }
    fn extend(&self, seq: &mut CpuSequence, tokens: &[u32]) -> Result<()> {
        self.check(seq, tokens)?;
        self.model.extend(seq, tokens)
    }
    fn snapshot(&self, seq: &CpuSequence) -> Option<Box<dyn SeqSnapshot>> {
        let inner = self.model.snapshot(seq)?;
        match &self.copies {
            Some(stats) => Some(Box::new(Copied::new(inner, stats.clone()))),
            None => Some(inner),
        }
    }
    fn restore(&self, snap: &dyn SeqSnapshot) -> Option<CpuSequence> {
        match snap.as_any().downcast_ref::<Copied>() {
            Some(c) => self.model.restore(&*c.inner),
            None => self.model.restore(snap),
        }
    }
    fn resumed_in_place(&self, _seq: &CpuSequence) -> bool {
        self.in_place.load(Ordering::SeqCst)
    }
    fn pass_snapshot_stride(&self) -> Option<usize> {
        self.stride
    }
    fn step(&self, batch: &mut [BatchItem<'_, CpuSequence>]) -> Vec<Result<StepOut>> {
        let lens = batch.iter().map(|it| it.tokens.len());
        self.rows.lock().unwrap().extend(lens);
        // Strided rows are checked on the stride, then split there.
        for it in batch.iter() {
            let start = it.seq.position();
            let g = self.stride.unwrap_or(usize::MAX);
            assert!(
                it.snapshots
                    .at
                    .iter()
                    .all(|&q| (q - start).is_multiple_of(g))
            );
        }
        batch
            .iter_mut()
            .map(|it| step_split_snapshots(self, it))
            .collect()
    }
    /// A "host copy": a fresh snapshot of the same state that owns all its bytes.
    fn demote(&self, snap: &dyn SeqSnapshot) -> Option<Box<dyn SeqSnapshot>> {
        let stats = self.host.as_ref()?;
        let seq = self.restore(snap)?;
        Some(Box::new(Copied::new(
            self.model.snapshot(&seq)?,
            stats.clone(),
        )))
    }
}

pub struct Harness {
    pub svc: EngineService,
    pub model: Arc<CpuModel>,
    pub fail_pos: Arc<AtomicUsize>,
    pub panic: Arc<AtomicBool>,
    pub forwards: Arc<AtomicUsize>,
    pub forward_tokens: Arc<AtomicUsize>,
    pub in_place: Arc<AtomicBool>,
    /// Token counts of the rows the backend's steps ran (with a stride).
    pub rows: Arc<Mutex<Vec<usize>>>,
}

/// What a harness is built with; `Setup::default()` is a plain backend
/// with no prefix cache.
#[derive(Default)]
pub struct Setup {
    pub cache_bytes: usize,
    pub host_bytes: usize,
    pub interval: usize,
    pub delay_ms: u64,
    /// Count the device snapshots' full copies (as the GPU backend's).
    pub copies: Option<Arc<CopyStats>>,
    /// Count the host tier's copies.
    pub host: Option<Arc<CopyStats>>,
    /// Stage snapshots inside passes every this many tokens.
    pub stride: Option<usize>,
    pub config: ServiceConfig,
}

impl Harness {
    pub fn new(cache_bytes: usize, interval: usize, delay_ms: u64) -> Self {
        Self::build(Setup {
            cache_bytes,
            interval,
            delay_ms,
            ..Setup::default()
        })
    }

    /// Snapshots own all their bytes, as the GPU backend's full copies would.
    pub fn with_full_copies(cache_bytes: usize, interval: usize) -> (Self, Arc<CopyStats>) {
        let stats = Arc::new(CopyStats::default());
        let h = Self::build(Setup {
            cache_bytes,
            interval,
            copies: Some(stats.clone()),
            ..Setup::default()
        });
        (h, stats)
    }

    /// A host tier of `host_bytes` behind `cache_bytes`; the returned stats
    /// count the host copies alive.
    pub fn with_host_tier(cache_bytes: usize, host_bytes: usize) -> (Self, Arc<CopyStats>) {
        let stats = Arc::new(CopyStats::default());
        let h = Self::build(Setup {
            cache_bytes,
            host_bytes,
            host: Some(stats.clone()),
            ..Setup::default()
        });
        (h, stats)
    }

    /// A backend that stages snapshots inside its passes every `stride`
    /// tokens; `config` for the scheduler's limits.
    pub fn with_stride(interval: usize, stride: usize, config: ServiceConfig) -> Self {
        Self::build(Setup {
            cache_bytes: 64 * MIB,
            interval,
            stride: Some(stride),
            config,
            ..Setup::default()
        })
    }

    pub fn build(s: Setup) -> Self {
        let model = model();
        let fail_pos = Arc::new(AtomicUsize::new(usize::MAX));
        let panic = Arc::new(AtomicBool::new(false));
        let forwards = Arc::new(AtomicUsize::new(0));
        let forward_tokens = Arc::new(AtomicUsize::new(0));
        let in_place = Arc::new(AtomicBool::new(false));
        let rows = Arc::new(Mutex::new(Vec::new()));
        let backend = Faulty {
            model: model.clone(),
            fail_pos: fail_pos.clone(),
            panic: panic.clone(),
            delay: Duration::from_millis(s.delay_ms),
            forwards: forwards.clone(),
            forward_tokens: forward_tokens.clone(),
            copies: s.copies,
            host: s.host,
            in_place: in_place.clone(),
            stride: s.stride,
            rows: rows.clone(),
        };
        let cfg = ServiceConfig {
            prefix_cache_bytes: s.cache_bytes,
            prefix_cache_host_bytes: s.host_bytes,
            snapshot_interval: s.interval,
            ..s.config
        };
        Harness {
            svc: EngineService::start(backend, None, "tiny".into(), cfg),
            model,
            fail_pos,
            panic,
            forwards,
            forward_tokens,
            in_place,
            rows,
        }
    }

    /// Token counts of the rows run since the last call.
    pub fn take_rows(&self) -> Vec<usize> {
        std::mem::take(&mut *self.rows.lock().unwrap())
    }

    /// (forward/extend calls, tokens run) so far.
    pub fn work(&self) -> (usize, usize) {
        (
            self.forwards.load(Ordering::SeqCst),
            self.forward_tokens.load(Ordering::SeqCst),
        )
    }

    pub fn cache(&self) -> &PrefixCache {
        self.svc.prefix_cache().expect("cache on")
    }

    pub fn dump(&self) -> Vec<DumpEntry> {
        self.cache().dump()
    }

    pub async fn run(&self, r: &GenerateRequest, opts: SubmitOptions) -> Outcome {
        let mut h = self.svc.submit(r.clone(), opts).await.unwrap();
        collect(&mut h).await
    }
}

/// Pseudo-random prompt tokens (no EOS), distinct per seed.
pub fn prompt(len: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15).wrapping_add(1);
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % (VOCAB as u64 - 1)) as u32
        })
        .collect()
}

pub fn req(prompt: &[u32], max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        stop_token_ids: vec![],
        ignore_eos: true,
        sampling: SamplingParams {
            logprobs: Some(4),
            ..Default::default()
        },
    }
}

pub fn salted(s: &str) -> SubmitOptions {
    SubmitOptions {
        cache_salt: Some(s.into()),
        ..Default::default()
    }
}

#[derive(Debug)]
pub struct Outcome {
    pub tokens: Vec<u32>,
    pub steps: Vec<Sampled>,
    pub end: Event,
}

impl Outcome {
    pub fn usage(&self) -> Usage {
        match &self.end {
            Event::Finished { usage, .. } => *usage,
            e => panic!("expected Finished, got {e:?}"),
        }
    }
    pub fn reason(&self) -> Option<FinishReason> {
        match &self.end {
            Event::Finished { reason, .. } => Some(*reason),
            _ => None,
        }
    }
}

pub async fn collect(h: &mut GenerationHandle) -> Outcome {
    let all = async {
        let mut out = Outcome {
            tokens: vec![],
            steps: vec![],
            end: Event::Failed("none".into()),
        };
        loop {
            h.wait().await;
            for e in h.try_next() {
                match e {
                    Event::Token { id, logprob, .. } => {
                        out.tokens.push(id);
                        out.steps.extend(logprob);
                    }
                    end => {
                        out.end = end;
                        return out;
                    }
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("request did not finish")
}

/// Same tokens; logprobs (chosen and top alternatives) within `LOGPROB_TOL`.
pub fn assert_same(label: &str, got: &Outcome, cold_tokens: &[u32], cold_steps: &[Sampled]) {
    assert_eq!(got.tokens, cold_tokens, "{label}: tokens differ");
    assert_eq!(got.steps.len(), cold_steps.len(), "{label}");
    for (i, (a, b)) in got.steps.iter().zip(cold_steps).enumerate() {
        assert_eq!(a.token, b.token, "{label}: step {i}");
        assert!(
            (a.logprob - b.logprob).abs() <= LOGPROB_TOL,
            "{label}: step {i}: logprob {} vs {}",
            a.logprob,
            b.logprob
        );
        for ((ta, la), (tb, lb)) in a.top.iter().zip(&b.top) {
            assert_eq!(ta, tb, "{label}: step {i}: top ids");
            assert!(
                (la - lb).abs() <= LOGPROB_TOL,
                "{label}: step {i}: top logprob"
            );
        }
    }
}

pub fn cold(m: &CpuModel, r: &GenerateRequest) -> (Vec<u32>, Vec<Sampled>) {
    let out = generate(m, r, |_, _| ControlFlow::Continue(())).unwrap();
    (out.tokens, out.steps)
}

pub const MIB: usize = 1 << 20;

/// Bytes of the live [`Copied`] snapshots, now and at most.
#[derive(Default)]
pub struct CopyStats {
    pub live: AtomicUsize,
    pub peak: AtomicUsize,
}

/// A snapshot that owns all its bytes (no shared pages), as a full device
/// copy would.
pub struct Copied {
    pub inner: Box<dyn SeqSnapshot>,
    pub bytes: usize,
    pub stats: Arc<CopyStats>,
}

impl Copied {
    pub fn new(inner: Box<dyn SeqSnapshot>, stats: Arc<CopyStats>) -> Self {
        let bytes = snapshot_bytes(&*inner);
        let now = stats.live.fetch_add(bytes, Ordering::SeqCst) + bytes;
        stats.peak.fetch_max(now, Ordering::SeqCst);
        Copied {
            inner,
            bytes,
            stats,
        }
    }
}

impl Drop for Copied {
    fn drop(&mut self) {
        self.stats.live.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

impl SeqSnapshot for Copied {
    fn position(&self) -> usize {
        self.inner.position()
    }
    fn private_bytes(&self) -> usize {
        self.bytes
    }
    fn pages(&self) -> Vec<(u64, usize)> {
        Vec::new()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A snapshot's states and pages, all counted.
pub fn snapshot_bytes(snap: &dyn SeqSnapshot) -> usize {
    snap.private_bytes() + snap.pages().iter().map(|p| p.1).sum::<usize>()
}

/// The bytes of a snapshot after `tokens` on the test model.
pub fn end_snapshot_bytes(tokens: &[u32]) -> usize {
    let model = model();
    let mut seq = model.new_sequence();
    model.extend(&mut seq, tokens).unwrap();
    snapshot_bytes(&*model.snapshot(&seq).unwrap())
}
