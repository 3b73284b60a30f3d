//! The service tests' backend (the CPU model, slowed, failing or posing as
//! a device on request) and their request helpers.

use super::*;

pub const EOS: u32 = 299;
/// A prompt containing this token makes [`TestBackend`] panic.
pub const PANIC_TOKEN: u32 = 42;
/// A prompt containing this token makes [`TestBackend`] return an error.
pub const ERROR_TOKEN: u32 = 43;

/// A tiny MoE model: vocab 300, hidden 32, 4 layers (3 GDN + 1 attention).
pub fn model() -> Arc<CpuModel> {
    let cfg = ModelConfig::from_json(&common::tiny_moe_config(EOS)).unwrap();
    let weights = Weights::load(&cfg, &RandomWeights { seed: 7 }).unwrap();
    Arc::new(CpuModel::new(cfg, weights))
}

/// The CPU model, optionally slowed down per forward, panicking or failing
/// on magic prompt tokens. With `greedy`, it poses as a backend that keeps
/// the logits on the device (as the GPU does): it counts the calls that pick
/// greedy tokens in `greedy`, those that read the logits' head in `tops` and
/// those that weight the row in `weighted` (each with the host's reference).
pub struct TestBackend {
    pub model: Arc<CpuModel>,
    pub delay: Duration,
    /// Counts forward calls.
    pub forwards: Arc<AtomicUsize>,
    pub greedy: Option<Arc<AtomicUsize>>,
    pub tops: Arc<AtomicUsize>,
    pub weighted: Arc<AtomicUsize>,
    /// The logits the last device-reading call left "on the device", with
    /// the position they follow ([`Backend::last_logits`]).
    pub last: std::sync::Mutex<Option<(usize, Vec<f32>)>>,
}

impl TestBackend {
    pub fn new(
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
    pub fn device_forward(&self, seq: &mut CpuSequence, tokens: &[u32]) -> Result<Vec<f32>> {
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
pub fn base_cfg() -> ServiceConfig {
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

pub fn service(delay_ms: u64, cfg: ServiceConfig) -> (EngineService, Arc<CpuModel>) {
    let m = model();
    let backend = TestBackend::new(
        m.clone(),
        Duration::from_millis(delay_ms),
        Arc::default(),
        None,
    );
    (EngineService::start(backend, None, "tiny".into(), cfg), m)
}

pub fn req(prompt: &[u32], max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        stop_token_ids: vec![],
        ignore_eos: true,
        sampling: SamplingParams::default(),
    }
}

#[path = "../common/drain.rs"]
mod drain;

/// Drains a handle to its terminal event (60 s at most).
pub async fn collect(h: &mut GenerationHandle) -> Vec<Event> {
    drain::drain(h, Duration::from_secs(60)).await
}

pub fn tokens(events: &[Event]) -> Vec<u32> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Token { id, .. } => Some(*id),
            _ => None,
        })
        .collect()
}

/// Polls `cond` every few ms until true (or panics after 10 s).
pub async fn until(mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "condition not reached"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Value of an unlabelled sample or one with exactly this label set.
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {series} in\n{text}"))
        .parse()
        .unwrap()
}
