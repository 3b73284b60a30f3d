//! Token sampling on the CPU over one logits vector.
//!
//! [`Sampler`] turns the model's raw logits for the next position into one
//! token, following the usual OpenAI/vLLM knobs (temperature, top-k, top-p,
//! min-p, repetition/presence/frequency penalties, logit bias, a seed).
//!
//! Choosing the token goes: logit bias → repetition penalty (prompt and
//! generated tokens) → presence/frequency penalties (generated tokens) →
//! greedy argmax when `temperature == 0` → temperature → top-k → top-p → min-p
//! → renormalise → one draw from a seeded xoshiro256** stream.
//!
//! Reported log-probabilities (the chosen token's and the top alternatives)
//! are the log-softmax of the **raw** logits, i.e. the model's own
//! distribution before any of the processing above (vLLM's default).
//!
//! Determinism: the exponential is our own polynomial in plain IEEE f32
//! operations (no libm; the AVX2 and portable builds give the same bits),
//! every sum runs in a fixed order, truncation cut-offs are defined by a total
//! order on `(logit, id)` and found with integer-quantised weights (so they
//! don't depend on the order a select algorithm leaves things in), and the
//! draw walks the survivors in id order. So a seed and a logits vector give the
//! same tokens on every platform and toolchain. The RNG is xoshiro256**
//! seeded through splitmix64, implemented here.
//!
//! Cost on a 248,320 vocabulary: a few passes over the logits (copy, weights,
//! log-sum-exp) plus, for top-k / top-p, a bounded heap, a small candidate
//! list or a 65,536-bucket histogram; no full sort. Buffers are reused
//! between calls.

use anyhow::{Result, bail};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Most alternatives [`SamplingParams::logprobs`] may ask for.
pub const MAX_LOGPROBS: usize = 20;

/// Per-request sampling parameters. Missing fields deserialize to their
/// [`Default`] (greedy, everything off).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 => greedy (argmax; ties -> lowest id).
    pub temperature: f32,
    /// Nucleus sampling mass in (0, 1]; 1.0 = off.
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens; 0 = off.
    pub top_k: usize,
    /// Drop tokens with `p < min_p * p_max`; in [0, 1], 0 = off.
    pub min_p: f32,
    /// Same seed + same logits => same tokens; `None` => seeded from OS entropy and time.
    pub seed: Option<u64>,
    /// Must be > 0; 1.0 = off. vLLM/HF semantics over prompt + generated
    /// tokens: a positive logit is divided by it, a negative one multiplied.
    pub repetition_penalty: f32,
    /// In [-2, 2]. OpenAI semantics over generated tokens: `logit -= presence` if the token occurred.
    pub presence_penalty: f32,
    /// In [-2, 2]. OpenAI semantics over generated tokens: `logit -= frequency * count`.
    pub frequency_penalty: f32,
    /// `(token, bias)` pairs, bias in [-100, 100], added to the logit (repeated ids add up).
    pub logit_bias: Vec<(u32, f32)>,
    /// `Some(k)`: report the top-`k` alternatives (k <= 20) besides the chosen token's logprob.
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            logprobs: None,
        }
    }
}

impl SamplingParams {
    /// Checks every parameter's range; `vocab_size` bounds the logit-bias ids.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            bail!(
                "temperature must be a finite number >= 0, got {}",
                self.temperature
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            bail!("top_p must be in (0, 1], got {}", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            bail!("min_p must be in [0, 1], got {}", self.min_p);
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            bail!(
                "repetition_penalty must be a finite number > 0, got {}",
                self.repetition_penalty
            );
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            bail!(
                "presence_penalty must be in [-2, 2], got {}",
                self.presence_penalty
            );
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            bail!(
                "frequency_penalty must be in [-2, 2], got {}",
                self.frequency_penalty
            );
        }
        for &(token, bias) in &self.logit_bias {
            if token as usize >= vocab_size {
                bail!(
                    "logit_bias token id must be < the vocabulary size {vocab_size}, got {token}"
                );
            }
            if !(-100.0..=100.0).contains(&bias) {
                bail!("logit_bias value for token {token} must be in [-100, 100], got {bias}");
            }
        }
        if let Some(k) = self.logprobs
            && k > MAX_LOGPROBS
        {
            bail!("logprobs must be in [0, {MAX_LOGPROBS}], got {k}");
        }
        Ok(())
    }

    /// True when `temperature` makes [`Sampler::sample`] take the argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature <= 0.0
    }

    /// Greedy with nothing else needed from the distribution (no logit bias,
    /// no penalties, no top alternatives): [`greedy`] of the raw logits is
    /// what [`Sampler::sample`] returns, so a backend may pick the token
    /// itself ([`crate::backend::Backend::forward_greedy`]).
    pub fn argmax_only(&self) -> bool {
        self.is_greedy() && self.raw_logits() && self.logprobs.unwrap_or(0) == 0
    }

    /// No logit bias or penalty changes a logit: sampling sees the raw logits.
    fn raw_logits(&self) -> bool {
        let rep = self.repetition_penalty;
        self.logit_bias
            .iter()
            .all(|&(_, b)| !b.is_finite() || b == 0.0)
            && !(rep.is_finite() && rep > 0.0 && rep != 1.0)
            && finite_or_zero(self.presence_penalty) == 0.0
            && finite_or_zero(self.frequency_penalty) == 0.0
    }

    /// True when [`Sampler::sample_top`] over the `k` highest logits gives
    /// what [`Sampler::sample`] gives over all `vocab_size`: no logit bias or
    /// penalties, at most `k` alternatives, and either greedy or a top-k of at
    /// most `k` (top-p and min-p then only look inside it). A backend may
    /// then hand over just those logits ([`crate::backend::Backend::forward_top`]).
    pub fn samples_from_top(&self, k: usize, vocab_size: usize) -> bool {
        self.raw_logits()
            && self.logprobs.unwrap_or(0) <= k
            && (self.is_greedy() || (self.top_k >= 1 && self.top_k <= k && self.top_k < vocab_size))
    }

    /// True when [`Sampler::sample`] draws from the whole row with
    /// temperature, top-p and min-p only (no top-k, bias or penalties, at
    /// most `k` alternatives): a backend may then weight the row where it
    /// lies and hand over block sums ([`crate::backend::Backend::forward_weighted`]).
    pub fn samples_from_weights(&self, k: usize, vocab_size: usize) -> bool {
        self.raw_logits()
            && !self.is_greedy()
            && (self.top_k == 0 || self.top_k >= vocab_size)
            && self.logprobs.unwrap_or(0) <= k
    }
}

/// Candidates a backend hands over for [`Sampler::sample_top`].
pub const TOP_CANDIDATES: usize = 64;

/// The head of one logits row: what sampling needs when
/// [`SamplingParams::samples_from_top`] holds.
#[derive(Clone, Debug, PartialEq)]
pub struct TopLogits {
    /// `(id, logit)` of the largest logits, larger first, ties by lower id
    /// (NaN counts as -inf, -0.0 as 0.0): the host sampler's key order.
    pub top: Vec<(u32, f32)>,
    /// `ln Σ e^(z - max)` over the whole row (NaN when the max is not finite).
    pub lse: f64,
}

impl TopLogits {
    /// The row's largest logit (-inf for an empty head).
    pub fn max(&self) -> f32 {
        self.top.first().map_or(f32::NEG_INFINITY, |p| p.1)
    }

    /// `token` drawn, with its log-probability (its logit from the head
    /// unless given) and the first `alternatives` of the head's.
    fn sampled(&self, token: u32, logit: Option<f32>, alternatives: usize) -> Sampled {
        let max = self.max() as f64;
        let lp = |x: f32| ((x as f64 - max) - self.lse) as f32;
        let logit = logit.unwrap_or_else(|| {
            self.top
                .iter()
                .find(|p| p.0 == token)
                .map_or(f32::NAN, |p| p.1)
        });
        let k = alternatives.min(self.top.len());
        Sampled {
            token,
            logprob: lp(logit),
            top: self.top[..k].iter().map(|&(i, z)| (i, lp(z))).collect(),
        }
    }
}

/// Tokens per block of [`weight_blocks`].
pub const WEIGHT_BLOCK: usize = BLOCK;

/// What a draw over a row weighted where it lies needs back besides the
/// head and the block sums ([`crate::backend::Backend::forward_weighted`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowRead {
    /// Nothing more: the draw was decided among the head.
    Head,
    /// The logits of one block of [`WEIGHT_BLOCK`] tokens.
    Block(usize),
    /// The whole row: the nucleus reaches past the head.
    Whole,
}

/// A row weighted where it lies, as read back.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightedRow {
    /// The row's head, as [`top_logits`].
    pub head: TopLogits,
    /// What was read besides, and its logits (empty for [`RowRead::Head`]).
    pub read: RowRead,
    pub logits: Vec<f32>,
}

/// The weights [`Sampler::sample`] draws from without top-k or top-p:
/// `e^((z - max) / t)`, 0 under `min_p` and for NaN.
fn row_weights(logits: &[f32], max: f32, t: f32, min_p: f32, w: &mut [f32]) {
    for (w, &z) in w.iter_mut().zip(logits) {
        let z = if z.is_nan() { f32::NEG_INFINITY } else { z };
        let x = temp_weight(z, max, t);
        *w = if x < min_p { 0.0 } else { x };
    }
}

/// The sums of [`row_weights`] per [`WEIGHT_BLOCK`] tokens, as the sampler
/// forms them: the reference a backend's own must equal bit for bit.
pub fn weight_blocks(logits: &[f32], max: f32, t: f32, min_p: f32) -> Vec<f64> {
    let mut w = [0f32; BLOCK];
    logits
        .chunks(BLOCK)
        .map(|c| {
            row_weights(c, max, t, min_p, &mut w[..c.len()]);
            block_sum(&w[..c.len()])
        })
        .collect()
}

/// How a backend weights a row for [`crate::backend::Backend::forward_weighted`]:
/// `e^((z - max) / temperature)`, 0 under `min_p`, and the `head` largest
/// logits besides.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Weighting {
    pub head: usize,
    pub temperature: f32,
    pub min_p: f32,
}

/// What a backend sums over a weighted row besides its head.
#[derive(Clone, Copy, Debug)]
pub struct RowSums<'a> {
    /// [`weight_blocks`].
    pub blocks: &'a [f64],
    /// [`heavy_count`].
    pub heavy: usize,
}

/// Decides from the head and the row's sums what else a weighted read needs.
pub type RowPlanner<'a> = dyn FnMut(&TopLogits, RowSums) -> RowRead + 'a;

/// The logits a [`RowRead`] asks for out of the whole row.
pub fn row_read(logits: &[f32], read: RowRead) -> Vec<f32> {
    match read {
        RowRead::Head => Vec::new(),
        RowRead::Block(b) => {
            let start = (b * BLOCK).min(logits.len());
            logits[start..(start + BLOCK).min(logits.len())].to_vec()
        }
        RowRead::Whole => logits.to_vec(),
    }
}

/// [`crate::backend::Backend::forward_weighted`]'s read of `logits` on the
/// host: the reference a backend's own must equal.
pub fn read_weighted(logits: &[f32], w: Weighting, plan: &mut RowPlanner) -> WeightedRow {
    let head = top_logits(logits, w.head);
    let max = head.max();
    let blocks = weight_blocks(logits, max, w.temperature, w.min_p);
    let heavy = heavy_count(logits, max, w.temperature);
    let read = plan(
        &head,
        RowSums {
            blocks: &blocks,
            heavy,
        },
    );
    WeightedRow {
        head,
        read,
        logits: row_read(logits, read),
    }
}

/// How many tokens the sampler's top-p looks at first ("heavy": logit at
/// least `max + t ln 2^-12` and a weight above 0), as a backend counts them.
pub fn heavy_count(logits: &[f32], max: f32, t: f32) -> usize {
    let floor = heavy_floor(max, t);
    logits
        .iter()
        .filter(|&&z| z >= floor && temp_weight(z, max, t) > 0.0)
        .count()
}

/// One draw of [`Sampler::sample`] over a row weighted where it lies: the
/// RNG output it consumes and the settings the weights need.
#[derive(Clone, Copy, Debug)]
pub struct RowDraw {
    u: u64,
    temperature: f32,
    top_p: f32,
    min_p: f32,
}

/// Where a [`RowDraw`] stands once the block sums are known.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowPlan {
    /// Decided among the head (top-p with the whole nucleus in it).
    Token(u32),
    /// The token lies in this block.
    Block(BlockPick),
    /// Only the whole row can decide (top-p reaching past the head).
    Whole,
}

impl RowPlan {
    pub fn read(&self) -> RowRead {
        match self {
            RowPlan::Token(_) => RowRead::Head,
            RowPlan::Block(p) => RowRead::Block(p.block),
            RowPlan::Whole => RowRead::Whole,
        }
    }
}

impl RowDraw {
    /// How the backend weights the row: with top-p the sampler sums the
    /// weights unmasked (min-p then applies to the nucleus), as
    /// [`Sampler::sample`] does.
    pub fn weighting(&self) -> Weighting {
        Weighting {
            head: TOP_CANDIDATES,
            temperature: self.temperature,
            min_p: if self.top_p < 1.0 { 0.0 } else { self.min_p },
        }
    }

    /// What decides the draw, from the head and the row's sums (of
    /// [`weight_blocks`] as [`RowDraw::weighting`] asks, and [`heavy_count`]).
    pub fn plan(&self, head: &TopLogits, sums: RowSums) -> RowPlan {
        let Some(&(first, z_max)) = head.top.first() else {
            return RowPlan::Token(0);
        };
        if z_max.is_infinite() {
            return RowPlan::Token(first); // as `draw`
        }
        if self.top_p >= 1.0 {
            return RowPlan::Block(pick_block(sums.blocks, self.u));
        }
        // `draw`'s top-p without top-k: the nucleus among the heavy tokens
        // (a key-order prefix of the row) when they are at most LIST_MAX and
        // reach the target, else a histogram over the whole row. Decided here
        // when that nucleus lies in the head.
        if sums.heavy > LIST_MAX {
            return RowPlan::Whole;
        }
        let t = self.temperature;
        let floor = heavy_floor(z_max, t);
        let weight = |z: f32| temp_weight(z, z_max, t);
        let mut heavy: Vec<(u32, f32)> = head
            .top
            .iter()
            .copied()
            .filter(|&(_, z)| z >= floor && weight(z) > 0.0)
            .collect();
        let all_heavy = heavy.len() == sums.heavy;
        heavy.sort_unstable_by_key(|&(i, _)| i);
        let mass: f64 = heavy.iter().map(|&(_, z)| weight(z) as f64).sum();
        let target = self.top_p as f64 * sums.blocks.iter().sum::<f64>();
        // With heavy tokens past the head, the sampler's sum over all of them
        // (in id order, rounding included) reaches the target for sure only
        // when the head's alone clears it by a margin.
        let needed = if all_heavy {
            target
        } else {
            target * (1.0 + 1e-9)
        };
        if mass < needed {
            return RowPlan::Whole;
        }
        let mut keys: Vec<u64> = heavy.iter().map(|&(i, z)| key(z, i)).collect();
        let target = ((target * Q_SCALE as f64).ceil() as u64).max(1);
        let qweight = |k: u64| qz(weight(key_logit(k)));
        if !all_heavy && keys.iter().map(|&k| qweight(k)).sum::<u64>() < target {
            return RowPlan::Whole; // the nucleus reaches past the head
        }
        let n = nucleus_len(&mut keys, qweight, target);
        keys.truncate(n);
        let mut pairs: Vec<(u32, f32)> = keys
            .iter()
            .map(|&k| (key_id(k), weight(key_logit(k))))
            .collect();
        RowPlan::Token(draw_among(&mut pairs, &mut Vec::new(), self.min_p, self.u))
    }
}

/// `(id, logit)` of a key in the sampler's order (`sortable(z) << 32 | !id`),
/// as a backend that sorts on the device hands it over.
pub fn key_parts(k: u64) -> (u32, f32) {
    (key_id(k), key_logit(k))
}

/// [`TopLogits`] of `logits` on the host: the reference for a backend's own.
pub fn top_logits(logits: &[f32], k: usize) -> TopLogits {
    let mut work = vec![0f32; logits.len()];
    let max = copy_sanitized_max(logits, &mut work);
    let mut keys: Vec<u64> = work
        .iter()
        .enumerate()
        .map(|(i, &z)| key(z, i as u32))
        .collect();
    let k = k.min(keys.len());
    if k > 0 && k < keys.len() {
        keys.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
    }
    keys.truncate(k);
    keys.sort_unstable_by(|a, b| b.cmp(a));
    TopLogits {
        top: keys.iter().map(|&k| key_parts(k)).collect(),
        lse: log_sum_exp(&work, max),
    }
}

/// One sampled token.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// Log-probability of `token` under the raw logits.
    pub logprob: f32,
    /// Top alternatives `(token, logprob)` under the raw logits, sorted by
    /// logprob descending then id ascending; empty unless `logprobs` was asked for.
    pub top: Vec<(u32, f32)>,
}

/// Quantised token weights (`w · 2^44`, the most likely token exactly
/// `2^44`) used wherever a truncation cut-off is searched for by reordering
/// candidates: integer sums don't depend on the order, so the cut doesn't
/// depend on the standard library's select algorithm.
const Q_SCALE: f32 = (1u64 << 44) as f32;

/// When top-p runs without top-k, first look for the nucleus among the tokens
/// with weight at least `2^-12` of the maximum (usually a handful): those
/// with `(z - z_max) / T >= ln 2^-12`.
const PREFILTER_LOG_W: f32 = -8.317_766;

/// Candidate sets up to this size are kept as explicit lists (heap top-k,
/// sorted survivors); larger cut-offs are found with a histogram over the
/// top 16 bits of the keys and applied by masking the weights.
const LIST_MAX: usize = 4096;

/// Above this, top-k followed by top-p searches the nucleus with a histogram
/// rather than among the top-k keys.
const BIG_LIST_MAX: usize = 1 << 16;

/// Weights are summed and walked in blocks of this many tokens.
const BLOCK: usize = 64;

const BUCKETS: usize = 1 << 16;

/// Defines `fn $name` that runs an AVX2 build of the body where the CPU has
/// it (x86-64's baseline is SSE2), else the portable one. Same IEEE
/// operations either way (Rust never fuses multiply-adds), so same bits.
macro_rules! multiversion {
    ($(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $body:block) => {
        $(#[$m])*
        fn $name($($arg: $ty),*) -> $ret {
            #[inline(always)]
            fn portable($($arg: $ty),*) -> $ret $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) -> $ret {
                    portable($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2.
                    return unsafe { avx2($($arg),*) };
                }
            }
            portable($($arg),*)
        }
    };
}

/// Samples tokens for one request; keeps its RNG stream and scratch buffers
/// between calls.
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: Xoshiro256StarStar,
    /// Processed logits (bias, penalties), NaN replaced by -inf.
    work: Vec<f32>,
    /// Weights `exp((z - z_max) / T)`, 0 for dropped tokens.
    w: Vec<f32>,
    /// Sums of `w` per [`BLOCK`].
    blocks: Vec<f64>,
    /// Candidate keys, see [`key`].
    keys: Vec<u64>,
    heap: BinaryHeap<Reverse<u64>>,
    /// Survivor ids, ascending (list mode).
    ids: Vec<u32>,
    /// `(id, weight)` of the listed candidates.
    pairs: Vec<(u32, f32)>,
    /// Per-bucket counts or masses for the histogram cut-offs.
    counts: Vec<u32>,
    masses: Vec<f64>,
    /// Occurrences among generated tokens, per token (penalties only).
    gen_counts: Vec<u32>,
    /// Token occurs in the context (penalties only).
    in_ctx: Vec<bool>,
    touched: Vec<u32>,
    /// The last draw's survivors are `ids` (else: the tokens with `w > 0`).
    listed: bool,
}

/// What [`Sampler::prepare`] found.
struct Prepared {
    raw_max: f32,
    work_max: f32,
    /// Bias or penalties changed some logit.
    modified: bool,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(entropy_seed);
        Self {
            params,
            seed,
            rng: Xoshiro256StarStar::seed_from_u64(seed),
            work: Vec::new(),
            w: Vec::new(),
            blocks: Vec::new(),
            keys: Vec::new(),
            heap: BinaryHeap::new(),
            ids: Vec::new(),
            pairs: Vec::new(),
            counts: Vec::new(),
            masses: Vec::new(),
            gen_counts: Vec::new(),
            in_ctx: Vec::new(),
            touched: Vec::new(),
            listed: false,
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed of the RNG stream: `params.seed`, or the one drawn from entropy.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Applies logit bias, repetition and presence/frequency penalties to
    /// `logits` and returns the result (NaN logits become -inf): the logits
    /// [`Sampler::sample`] chooses from, before temperature and truncation.
    pub fn process_logits(&mut self, logits: &[f32], context: &[u32], prompt_len: usize) -> &[f32] {
        self.prepare(logits, context, prompt_len);
        &self.work
    }

    fn prepare(&mut self, logits: &[f32], context: &[u32], prompt_len: usize) -> Prepared {
        let vocab = logits.len();
        self.work.resize(vocab, 0.0);
        let raw_max = copy_sanitized_max(logits, &mut self.work);
        let mut modified = false;
        for &(token, bias) in &self.params.logit_bias {
            if let Some(z) = self.work.get_mut(token as usize)
                && bias.is_finite()
                && bias != 0.0
            {
                *z += bias;
                modified = true;
            }
        }
        let rep = self.params.repetition_penalty;
        let use_rep = rep.is_finite() && rep > 0.0 && rep != 1.0;
        let presence = finite_or_zero(self.params.presence_penalty);
        let frequency = finite_or_zero(self.params.frequency_penalty);
        let use_pf = presence != 0.0 || frequency != 0.0;
        if use_rep || use_pf {
            if self.gen_counts.len() != vocab {
                self.gen_counts = vec![0; vocab];
                self.in_ctx = vec![false; vocab];
            }
            let prompt_len = prompt_len.min(context.len());
            // Presence/frequency only look at generated tokens: skip the
            // prompt unless the repetition penalty needs it.
            let start = if use_rep { 0 } else { prompt_len };
            for (pos, &t) in context.iter().enumerate().skip(start) {
                let t = t as usize;
                if t >= vocab {
                    continue;
                }
                if !self.in_ctx[t] {
                    self.in_ctx[t] = true;
                    self.touched.push(t as u32);
                }
                if pos >= prompt_len {
                    self.gen_counts[t] += 1;
                }
            }
            modified |= !self.touched.is_empty();
            for &t in &self.touched {
                let t = t as usize;
                let z = &mut self.work[t];
                if use_rep {
                    *z = if *z > 0.0 { *z / rep } else { *z * rep };
                }
                let count = self.gen_counts[t];
                if count > 0 && use_pf {
                    *z -= frequency * count as f32 + presence;
                }
                self.gen_counts[t] = 0;
                self.in_ctx[t] = false;
            }
            self.touched.clear();
        }
        let work_max = if modified {
            max_f32(&self.work)
        } else {
            raw_max
        };
        Prepared {
            raw_max,
            work_max,
            modified,
        }
    }

    /// Chooses the next token. `logits`: raw model logits (len = vocab).
    /// `context`: prompt tokens followed by generated tokens; `prompt_len`
    /// splits them. Never panics; an empty `logits` gives token 0.
    pub fn sample(&mut self, logits: &[f32], context: &[u32], prompt_len: usize) -> Sampled {
        self.sample_with(logits, context, prompt_len, None)
    }

    /// [`Sampler::sample`], with the draw's RNG output taken already (`u`)
    /// or taken here.
    fn sample_with(
        &mut self,
        logits: &[f32],
        context: &[u32],
        prompt_len: usize,
        u: Option<u64>,
    ) -> Sampled {
        if logits.is_empty() {
            return Sampled {
                token: 0,
                logprob: f32::NAN,
                top: Vec::new(),
            };
        }
        let prep = self.prepare(logits, context, prompt_len);
        let (token, raw_sum) = if self.params.is_greedy() {
            (first_index_of(&self.work, prep.work_max), None)
        } else {
            let t = self.params.temperature;
            let (token, total) = self.draw(prep.work_max, u);
            // Untouched logits at T = 1: the weights' total is the raw Σ e^(x - max).
            let reuse = !prep.modified && t == 1.0 && total.is_some();
            (token, total.filter(|_| reuse))
        };
        let lse = match raw_sum {
            Some(s) => s.ln(),
            None => log_sum_exp(logits, prep.raw_max),
        };
        let lp = |x: f32| ((x as f64 - prep.raw_max as f64) - lse) as f32;
        let k = self.params.logprobs.unwrap_or(0);
        let top = top_indices(logits, k)
            .into_iter()
            .map(|i| (i, lp(logits[i as usize])))
            .collect();
        Sampled {
            token,
            logprob: lp(logits[token as usize]),
            top,
        }
    }

    /// [`Sampler::sample`] from the head of the logits alone; the same token,
    /// RNG stream and log-probabilities (up to `top.lse`'s rounding) where
    /// [`SamplingParams::samples_from_top`] holds for `top.top.len()`.
    pub fn sample_top(&mut self, top: &TopLogits) -> Sampled {
        let Some(&(first, z_max)) = top.top.first() else {
            return Sampled {
                token: 0,
                logprob: f32::NAN,
                top: Vec::new(),
            };
        };
        let token = if self.params.is_greedy() {
            first
        } else {
            // As `draw`: one draw per call, an infinite max picks the first.
            let u = self.rng.next_u64();
            if z_max.is_infinite() {
                first
            } else {
                let t = self.params.temperature;
                let weight = |k: u64| temp_weight(key_logit(k), z_max, t);
                self.keys.clear();
                let n = self.params.top_k.min(top.top.len());
                self.keys
                    .extend(top.top[..n].iter().map(|&(i, z)| key(z, i)));
                if self.params.top_p < 1.0 {
                    nucleus_among(&mut self.keys, |k| qz(weight(k)), self.params.top_p);
                }
                self.pairs.clear();
                self.pairs
                    .extend(self.keys.iter().map(|&k| (key_id(k), weight(k))));
                draw_among(
                    &mut self.pairs,
                    &mut self.ids,
                    self.params.min_p.min(1.0),
                    u,
                )
            }
        };
        top.sampled(token, None, self.params.logprobs.unwrap_or(0))
    }

    /// Starts [`Sampler::sample`]'s draw over a row weighted where it lies
    /// (valid where [`SamplingParams::samples_from_weights`] holds): takes
    /// the RNG output a call of `sample` takes.
    pub fn start_row_draw(&mut self) -> RowDraw {
        RowDraw {
            u: self.rng.next_u64(),
            temperature: self.params.temperature,
            top_p: self.params.top_p,
            min_p: self.params.min_p.min(1.0),
        }
    }

    /// The token `draw` planned, with its logprob and the head's
    /// alternatives; [`RowPlan::Whole`] samples `row.logits`, the whole row,
    /// with the draw's RNG output.
    pub fn finish_row(&mut self, draw: &RowDraw, plan: &RowPlan, row: &WeightedRow) -> Sampled {
        let token = match *plan {
            RowPlan::Whole => {
                return self.sample_with(&row.logits, &[], 0, Some(draw.u));
            }
            RowPlan::Token(t) => t,
            RowPlan::Block(pick) => {
                let n = row.logits.len().min(BLOCK);
                let mut w = [0f32; BLOCK];
                row_weights(
                    &row.logits[..n],
                    row.head.max(),
                    draw.temperature,
                    draw.min_p,
                    &mut w[..n],
                );
                walk_block(&w[..n], &pick)
            }
        };
        let in_block = match row.read {
            RowRead::Block(b) => (token as usize)
                .checked_sub(b * BLOCK)
                .and_then(|j| row.logits.get(j).copied()),
            _ => None,
        };
        row.head
            .sampled(token, in_block, self.params.logprobs.unwrap_or(0))
    }

    /// Temperature, truncation and the draw over `self.work` (with the RNG
    /// output `u` when the caller took it). Also returns the sum of the
    /// weights over the whole vocabulary when it was computed.
    fn draw(&mut self, z_max: f32, u: Option<u64>) -> (u32, Option<f64>) {
        // One draw per non-greedy call, whatever happens below, so the stream
        // position only depends on the number of calls.
        let u = u.unwrap_or_else(|| self.rng.next_u64());
        self.listed = false;
        if z_max.is_infinite() {
            return (first_index_of(&self.work, z_max), None);
        }
        let vocab = self.work.len();
        let t = self.params.temperature;
        let top_k = self.params.top_k;
        let use_k = top_k > 0 && top_k < vocab;
        let top_p = self.params.top_p;
        let use_p = top_p < 1.0; // NaN or <= 0 count as off (validate() rejects them)
        let min_p = self.params.min_p.min(1.0);
        let use_min_p = min_p > 0.0;
        self.w.resize(vocab, 0.0);
        self.keys.clear();

        // Survivors: either the keys in `self.keys` (`listed`), or every
        // token with key >= `cut` (and weight >= min_p).
        let mut cut = 0u64;
        let mut full_total = None;
        if use_k && top_k <= LIST_MAX {
            self.heap_top_k(top_k);
            for &k in &self.keys {
                let i = key_id(k) as usize;
                self.w[i] = temp_weight(self.work[i], z_max, t);
            }
            self.listed = true;
        } else {
            full_total = Some(self.weights_and_blocks(z_max, t));
            if use_k {
                cut = self.histogram_top_k(top_k);
            }
        }

        if use_p {
            let w = &self.w;
            let weight = |k: u64| qz(w[key_id(k) as usize]);
            if self.listed {
                nucleus_among(&mut self.keys, weight, top_p);
            } else if cut > 0 && top_k <= BIG_LIST_MAX {
                // Large top-k: the nucleus among its k keys.
                self.keys.clear();
                collect_at_least(&self.work, key_logit(cut), key_id(cut), &mut self.keys);
                let mass: u64 = self.keys.iter().map(|&k| weight(k)).sum();
                let target = ((top_p as f64 * mass as f64).ceil() as u64).max(1);
                let n = nucleus_len(&mut self.keys, weight, target);
                cut = self.keys[..n].iter().copied().min().unwrap_or(cut);
                self.keys.clear();
            } else {
                if cut > 0 {
                    self.mask(cut, 0.0); // outside the top-k
                }
                let target = top_p as f64 * self.blocks.iter().sum::<f64>();
                // Usually the nucleus lies among the heavy tokens: those with
                // w >= ~2^-12, selected by logit so they are a prefix in key order.
                let floor = heavy_floor(z_max, t);
                let mut heavy = 0.0f64;
                for (i, (&z, &w)) in self.work.iter().zip(&self.w).enumerate() {
                    if z >= floor && w > 0.0 {
                        heavy += w as f64;
                        self.keys.push(key(z, i as u32));
                        if self.keys.len() > LIST_MAX {
                            break; // a flat distribution: use the histogram
                        }
                    }
                }
                if heavy >= target && self.keys.len() <= LIST_MAX {
                    let w = &self.w;
                    let weight = |k: u64| qz(w[key_id(k) as usize]);
                    let target = ((target * Q_SCALE as f64).ceil() as u64).max(1);
                    let n = nucleus_len(&mut self.keys, weight, target);
                    self.keys.truncate(n);
                    self.listed = true;
                } else {
                    cut = self.histogram_top_p(target);
                }
            }
        }

        if self.listed {
            let w = &self.w;
            self.pairs.clear();
            self.pairs.extend(self.keys.iter().map(|&k| {
                let i = key_id(k);
                (i, w[i as usize])
            }));
            return (
                draw_among(&mut self.pairs, &mut self.ids, min_p, u),
                full_total,
            );
        }
        if cut > 0 || use_min_p {
            self.mask(cut, min_p);
        }
        (blocked_walk(&self.w, &self.blocks, u), full_total)
    }

    /// `w = exp((z - z_max) / t)` over the vocabulary, the block sums, and
    /// their total.
    fn weights_and_blocks(&mut self, z_max: f32, t: f32) -> f64 {
        weights(&self.work, &mut self.w, &mut self.blocks, z_max, t)
    }

    /// Zeroes the weights of tokens below `cut` or under `min_p` (relative to
    /// the maximum weight, exactly 1) and recomputes the block sums.
    fn mask(&mut self, cut: u64, min_p: f32) {
        // key(z, i) < cut  <=>  z < cut_z || (z == cut_z && i > cut_id)
        let (cut_z, cut_id) = if cut == 0 {
            (f32::NEG_INFINITY, u32::MAX)
        } else {
            (key_logit(cut), key_id(cut))
        };
        mask_weights(
            &self.work,
            &mut self.w,
            &mut self.blocks,
            cut_z,
            cut_id,
            min_p,
        );
    }

    /// The `k` largest keys of `work` into `self.keys`, with a bounded heap.
    fn heap_top_k(&mut self, k: usize) {
        self.heap.clear();
        // Logit of the heap's smallest key once full: anything below can't enter.
        let mut floor = f32::NEG_INFINITY;
        for (i, &z) in self.work.iter().enumerate() {
            if z < floor {
                continue;
            }
            let kz = key(z, i as u32);
            if self.heap.len() < k {
                self.heap.push(Reverse(kz));
                if self.heap.len() == k
                    && let Some(min) = self.heap.peek()
                {
                    floor = key_logit(min.0);
                }
            } else if self.heap.peek().is_some_and(|min| kz > min.0) {
                if let Some(mut min) = self.heap.peek_mut() {
                    *min = Reverse(kz);
                }
                if let Some(min) = self.heap.peek() {
                    floor = key_logit(min.0);
                }
            }
        }
        self.keys.extend(self.heap.drain().map(|Reverse(k)| k));
    }

    /// The `k`-th largest key of `work` (a histogram of the top 16 key bits,
    /// then a select within the boundary bucket).
    fn histogram_top_k(&mut self, k: usize) -> u64 {
        self.counts.clear();
        self.counts.resize(BUCKETS, 0);
        bucket_counts(&self.work, &mut self.counts);
        let mut above = 0usize;
        let mut b = BUCKETS;
        while b > 0 {
            b -= 1;
            let c = self.counts[b] as usize;
            if above + c >= k {
                break;
            }
            above += c;
        }
        self.keys.clear();
        collect_bucket(&self.work, &self.w, b, false, &mut self.keys);
        let nth = (k - above - 1).min(self.keys.len() - 1);
        let (_, kth, _) = self.keys.select_nth_unstable_by(nth, |a, b| b.cmp(a));
        let kth = *kth;
        self.keys.clear();
        kth
    }

    /// The nucleus cut-off among the tokens with `w > 0`: the smallest key
    /// of the shortest prefix (by key) whose weight reaches `target`.
    fn histogram_top_p(&mut self, target: f64) -> u64 {
        self.masses.clear();
        self.masses.resize(BUCKETS, 0.0);
        bucket_masses(&self.work, &self.w, &mut self.masses);
        let mut above = 0.0f64;
        let mut b = BUCKETS;
        while b > 0 {
            b -= 1;
            let m = self.masses[b];
            if m > 0.0 && above + m >= target {
                break;
            }
            above += m;
        }
        self.keys.clear();
        collect_bucket(&self.work, &self.w, b, true, &mut self.keys);
        let w = &self.w;
        let weight = |k: u64| qz(w[key_id(k) as usize]);
        let rest = (((target - above) * Q_SCALE as f64).ceil() as u64).max(1);
        let n = nucleus_len(&mut self.keys, weight, rest);
        let new_cut = self.keys[..n].iter().copied().min().unwrap_or(0);
        self.keys.clear();
        new_cut
    }

    /// The survivors of the last non-greedy draw, ascending (tests).
    #[cfg(test)]
    fn survivors(&self) -> Vec<u32> {
        if self.listed {
            self.ids.clone()
        } else {
            (0..self.w.len() as u32)
                .filter(|&i| self.w[i as usize] > 0.0)
                .collect()
        }
    }
}

/// Weight quantised for exact, order-independent sums.
#[inline]
fn qz(w: f32) -> u64 {
    (w * Q_SCALE) as u64
}

/// `u`'s top 53 bits as a float in [0, 1).
fn unit_f64(u: u64) -> f64 {
    (u >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Sum of up to [`BLOCK`] weights: 8 f32 lanes, then f64.
#[inline]
fn block_sum(w: &[f32]) -> f64 {
    let mut lanes = [0f32; 8];
    let chunks = w.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &x) in lanes.iter_mut().zip(c) {
            *a += x;
        }
    }
    let mut s = 0.0f64;
    for a in lanes {
        s += a as f64;
    }
    for &x in rest {
        s += x as f64;
    }
    s
}

/// Draws a token with probability proportional to `w`, using the block sums
/// to skip ahead. Never returns a token of weight 0 (unless all are 0).
fn blocked_walk(w: &[f32], blocks: &[f64], u: u64) -> u32 {
    let pick = pick_block(blocks, u);
    let start = pick.block * BLOCK;
    walk_block(&w[start..(start + BLOCK).min(w.len())], &pick)
}

/// Where [`blocked_walk`]'s draw lands among the blocks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockPick {
    /// The block to walk.
    pub block: usize,
    /// The draw, `unit(u) * total`, and the weight before the block; `None`:
    /// the draw passed every block (rounding), take the block's last token.
    walk: Option<(f64, f64)>,
}

/// The block of `blocks` (sums of [`BLOCK`] weights) that the draw `u` lands in.
fn pick_block(blocks: &[f64], u: u64) -> BlockPick {
    let total: f64 = blocks.iter().sum();
    let r = unit_f64(u) * total;
    let mut cum = 0.0f64;
    let mut last_block = None;
    for (b, &s) in blocks.iter().enumerate() {
        if s > 0.0 {
            last_block = Some(b);
        }
        if cum + s > r {
            return BlockPick {
                block: b,
                walk: Some((r, cum)),
            };
        }
        cum += s;
    }
    BlockPick {
        block: last_block.unwrap_or(0),
        walk: None,
    }
}

/// The token the draw picks inside its block (`wb`: the block's weights).
fn walk_block(wb: &[f32], pick: &BlockPick) -> u32 {
    let start = (pick.block * BLOCK) as u32;
    if let Some((r, mut c)) = pick.walk {
        for (j, &x) in wb.iter().enumerate() {
            c += x as f64;
            if x > 0.0 && r < c {
                return start + j as u32;
            }
        }
    }
    // The last token of the block with a positive weight.
    start + (0..wb.len()).rev().find(|&j| wb[j] > 0.0).unwrap_or(0) as u32
}

/// The smallest number `n` of the largest keys whose weight reaches `target`;
/// reorders `keys` so that they are `keys[..n]` (in no particular order).
/// Weighted quickselect: O(len) expected. Integer weights make the answer
/// independent of the select algorithm.
fn nucleus_len(keys: &mut [u64], weight: impl Fn(u64) -> u64, target: u64) -> usize {
    let (mut lo, mut hi) = (0, keys.len());
    let mut acc = 0u64;
    loop {
        if hi - lo <= 32 {
            keys[lo..hi].sort_unstable_by(|a, b| b.cmp(a));
            for (i, &k) in keys.iter().enumerate().take(hi).skip(lo) {
                acc += weight(k);
                if acc >= target {
                    return i + 1;
                }
            }
            return hi.max(1).min(keys.len());
        }
        let mid = lo + (hi - lo) / 2;
        keys[lo..hi].select_nth_unstable_by(mid - lo, |a, b| b.cmp(a));
        let upper: u64 = keys[lo..mid].iter().map(|&k| weight(k)).sum();
        if acc + upper >= target {
            hi = mid;
            continue;
        }
        acc += upper + weight(keys[mid]);
        if acc >= target {
            return mid + 1;
        }
        lo = mid + 1;
    }
}

/// Keeps the top-`p` nucleus of a candidate list: the shortest prefix by
/// key whose quantised weight reaches `top_p` of the list's.
fn nucleus_among(keys: &mut Vec<u64>, weight: impl Fn(u64) -> u64, top_p: f32) {
    let mass: u64 = keys.iter().map(|&k| weight(k)).sum();
    let target = ((top_p as f64 * mass as f64).ceil() as u64).max(1);
    let n = nucleus_len(keys, &weight, target);
    keys.truncate(n);
}

/// The draw among listed candidates `(id, weight)`: drops those under
/// `min_p` (or of weight 0), then walks the rest in id order. The survivors'
/// ids are left in `ids`.
fn draw_among(pairs: &mut Vec<(u32, f32)>, ids: &mut Vec<u32>, min_p: f32, u: u64) -> u32 {
    pairs.retain(|&(_, w)| w >= min_p && w > 0.0);
    pairs.sort_unstable_by_key(|&(i, _)| i);
    ids.clear();
    ids.extend(pairs.iter().map(|&(i, _)| i));
    let total: f64 = pairs.iter().map(|&(_, w)| w as f64).sum();
    let r = unit_f64(u) * total;
    let mut cum = 0.0f64;
    for &(i, w) in pairs.iter() {
        cum += w as f64;
        if r < cum {
            return i;
        }
    }
    ids.last().copied().unwrap_or(0)
}

/// `z`'s bits mapped so that unsigned order is float order (-0.0 taken as
/// 0.0; `z` must not be NaN).
#[inline]
fn sortable(z: f32) -> u32 {
    let b = (z + 0.0).to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// A total order on `(logit, id)`: larger logit first, then lower id.
#[inline]
fn key(z: f32, id: u32) -> u64 {
    ((sortable(z) as u64) << 32) | (!id) as u64
}

/// The histogram bucket of a logit: the top 16 bits of [`sortable`], so the
/// same as `key(z, _) >> 48`.
#[inline]
fn z_bucket(z: f32) -> usize {
    (sortable(z) >> 16) as usize
}

#[inline]
fn key_id(k: u64) -> u32 {
    !(k as u32)
}

#[inline]
fn key_logit(k: u64) -> f32 {
    let s = (k >> 32) as u32;
    f32::from_bits(if s & 0x8000_0000 != 0 {
        s & 0x7FFF_FFFF
    } else {
        !s
    })
}

fn finite_or_zero(x: f32) -> f32 {
    if x.is_finite() { x } else { 0.0 }
}

/// A logit's weight at temperature `t`: `e^((z - max) / t)`, the one
/// formula every path (and the device, bit for bit) uses.
#[inline(always)]
fn temp_weight(z: f32, max: f32, t: f32) -> f32 {
    exp_nonpos((z - max) / t)
}

/// The lowest logit of a "heavy" token, the ones top-p looks at first: a
/// weight of at least ~2^-12 of the maximum's.
#[inline]
fn heavy_floor(max: f32, t: f32) -> f32 {
    max + t * PREFILTER_LOG_W
}

/// `e^x` for `x <= 0`: larger `x` is taken as 0, NaN and anything below -87
/// give 0. Cephes' `expf` polynomial, ~1 ulp, in plain f32 arithmetic so it
/// vectorises and gives the same bits on every platform.
#[inline(always)]
fn exp_nonpos(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let in_range = x >= -87.0;
    let x = if in_range { x } else { -87.0 };
    let x = if x < 0.0 { x } else { 0.0 };
    let t = x * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let ni = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = (((((1.987_569_1e-4 * r + 1.398_2e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5)
        * (r * r)
        + r
        + 1.0;
    let e = p * f32::from_bits(((ni + 127) as u32) << 23);
    if in_range { e } else { 0.0 }
}

multiversion! {
    /// Copies `src` into `dst` (same length) with NaN replaced by -inf; returns the max.
    fn copy_sanitized_max(src: &[f32], dst: &mut [f32]) -> f32 {
        let mut lanes = [f32::NEG_INFINITY; 8];
        let mut s = src.chunks_exact(8);
        let mut d = dst.chunks_exact_mut(8);
        for (sc, dc) in (&mut s).zip(&mut d) {
            for ((o, &x), m) in dc.iter_mut().zip(sc).zip(lanes.iter_mut()) {
                let x = if x.is_nan() { f32::NEG_INFINITY } else { x };
                *o = x;
                *m = if x > *m { x } else { *m };
            }
        }
        let mut m = lanes.into_iter().fold(f32::NEG_INFINITY, f32::max);
        for (o, &x) in d.into_remainder().iter_mut().zip(s.remainder()) {
            let x = if x.is_nan() { f32::NEG_INFINITY } else { x };
            *o = x;
            m = m.max(x);
        }
        m
    }
}

multiversion! {
    /// Largest value, NaN ignored; -inf for an empty or all-NaN slice.
    fn max_f32(v: &[f32]) -> f32 {
        let mut lanes = [f32::NEG_INFINITY; 8];
        let chunks = v.chunks_exact(8);
        let rest = chunks.remainder();
        for c in chunks {
            for (m, &x) in lanes.iter_mut().zip(c) {
                *m = if x > *m { x } else { *m };
            }
        }
        rest.iter()
            .copied()
            .chain(lanes)
            .fold(f32::NEG_INFINITY, |m, x| if x > m { x } else { m })
    }
}

multiversion! {
    /// `w = exp((z - z_max) / t)`, the per-[`BLOCK`] sums of `w` into
    /// `blocks`, and their total.
    fn weights(work: &[f32], w: &mut [f32], blocks: &mut Vec<f64>, z_max: f32, t: f32) -> f64 {
        blocks.clear();
        let mut total = 0.0f64;
        for (zb, wb) in work.chunks(BLOCK).zip(w.chunks_mut(BLOCK)) {
            for (w, &z) in wb.iter_mut().zip(zb) {
                *w = temp_weight(z, z_max, t);
            }
            let s = block_sum(wb);
            blocks.push(s);
            total += s;
        }
        total
    }
}

multiversion! {
    /// Zeroes `w` where `(z, id)` is below `(cut_z, cut_id)` in key order or
    /// `w < min_p`, and recomputes the block sums.
    fn mask_weights(
        work: &[f32],
        w: &mut [f32],
        blocks: &mut [f64],
        cut_z: f32,
        cut_id: u32,
        min_p: f32
    ) -> () {
        for (b, (zb, wb)) in work.chunks(BLOCK).zip(w.chunks_mut(BLOCK)).enumerate() {
            let base = (b * BLOCK) as u32;
            for (j, (w, &z)) in wb.iter_mut().zip(zb).enumerate() {
                let below = (z < cut_z) | ((z == cut_z) & (base + j as u32 > cut_id));
                if below | (*w < min_p) {
                    *w = 0.0;
                }
            }
            blocks[b] = block_sum(wb);
        }
    }
}

multiversion! {
    /// Tokens per [`z_bucket`].
    fn bucket_counts(work: &[f32], counts: &mut [u32]) -> () {
        for &z in work {
            counts[z_bucket(z)] += 1;
        }
    }
}

multiversion! {
    /// Weight per [`z_bucket`].
    fn bucket_masses(work: &[f32], w: &[f32], masses: &mut [f64]) -> () {
        for (&z, &w) in work.iter().zip(w) {
            masses[z_bucket(z)] += w as f64;
        }
    }
}

multiversion! {
    /// Pushes the keys of the tokens in bucket `b` (with `w > 0` if
    /// `positive_only`) onto `keys`, in id order.
    fn collect_bucket(
        work: &[f32],
        w: &[f32],
        b: usize,
        positive_only: bool,
        keys: &mut Vec<u64>
    ) -> () {
        let floor = if positive_only { 0.0 } else { -1.0 };
        for (blk, (zb, wb)) in work.chunks(BLOCK).zip(w.chunks(BLOCK)).enumerate() {
            let mut hits = 0u64;
            for (j, (&z, &x)) in zb.iter().zip(wb).enumerate() {
                hits |= (((z_bucket(z) == b) & (x > floor)) as u64) << j;
            }
            while hits != 0 {
                let j = hits.trailing_zeros() as usize;
                hits &= hits - 1;
                keys.push(key(zb[j], (blk * BLOCK + j) as u32));
            }
        }
    }
}

multiversion! {
    /// Pushes the keys `>= key(cut_z, cut_id)` onto `keys`, in id order.
    fn collect_at_least(work: &[f32], cut_z: f32, cut_id: u32, keys: &mut Vec<u64>) -> () {
        for (blk, zb) in work.chunks(BLOCK).enumerate() {
            let base = (blk * BLOCK) as u32;
            let mut hits = 0u64;
            for (j, &z) in zb.iter().enumerate() {
                let at_least = (z > cut_z) | ((z == cut_z) & (base + j as u32 <= cut_id));
                hits |= (at_least as u64) << j;
            }
            while hits != 0 {
                let j = hits.trailing_zeros() as usize;
                hits &= hits - 1;
                keys.push(key(zb[j], base + j as u32));
            }
        }
    }
}

multiversion! {
    /// `Σ e^(x - max)` over `logits` (NaN ignored), in blocks of f32 lanes summed in f64.
    fn sum_exp(logits: &[f32], max: f32) -> f64 {
        let mut total = 0.0f64;
        let mut buf = [0f32; BLOCK];
        for c in logits.chunks(BLOCK) {
            for (b, &x) in buf.iter_mut().zip(c) {
                *b = exp_nonpos(x - max);
            }
            total += block_sum(&buf[..c.len()]);
        }
        total
    }
}

/// `ln Σ e^(x - max)` over `logits` (NaN ignored).
fn log_sum_exp(logits: &[f32], max: f32) -> f64 {
    if max.is_finite() {
        sum_exp(logits, max).ln()
    } else {
        f64::NAN
    }
}

/// First index holding `x` (0 if none).
fn first_index_of(v: &[f32], x: f32) -> u32 {
    v.iter().position(|&y| y == x).unwrap_or(0) as u32
}

/// Ids of the `k` largest values (NaN skipped), descending, ties by id ascending.
fn top_indices(values: &[f32], k: usize) -> Vec<u32> {
    let k = k.min(values.len());
    if k == 0 {
        return Vec::new();
    }
    let desc = |&a: &u32, &b: &u32| {
        let (x, y) = (values[a as usize], values[b as usize]);
        y.partial_cmp(&x)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    };
    if k > 64 {
        let mut ids: Vec<u32> = (0..values.len() as u32)
            .filter(|&i| !values[i as usize].is_nan())
            .collect();
        if ids.len() > k {
            ids.select_nth_unstable_by(k - 1, desc);
            ids.truncate(k);
        }
        ids.sort_unstable_by(desc);
        return ids;
    }
    // Sorted descending; ids arrive ascending, so inserting after equals keeps ties by id.
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    for (i, &x) in values.iter().enumerate() {
        if x.is_nan() || (best.len() == k && x <= best[k - 1].0) {
            continue;
        }
        let pos = best.partition_point(|&(y, _)| y >= x);
        best.insert(pos, (x, i as u32));
        best.truncate(k);
    }
    best.into_iter().map(|(_, i)| i).collect()
}

/// `log_softmax` of `logits`, max-subtracted with an f64 sum (NaN stays NaN).
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let m = max_f32(logits) as f64;
    let sum: f64 = logits
        .iter()
        .filter(|x| !x.is_nan())
        .map(|&x| (x as f64 - m).exp())
        .sum();
    let lse = sum.ln();
    logits
        .iter()
        .map(|&x| ((x as f64 - m) - lse) as f32)
        .collect()
}

/// The `k` highest `(id, logprob)` pairs, by logprob descending then id
/// ascending; NaN entries are skipped.
pub fn top_logprobs(logprobs: &[f32], k: usize) -> Vec<(u32, f32)> {
    top_indices(logprobs, k)
        .into_iter()
        .map(|i| (i, logprobs[i as usize]))
        .collect()
}

/// The greedy pick of raw `logits`: the argmax (ties to the lowest id, NaN
/// ignored) and its log-probability, no alternatives; what [`Sampler::sample`]
/// returns when [`SamplingParams::argmax_only`] holds.
pub fn greedy(logits: &[f32]) -> Sampled {
    let params = SamplingParams {
        seed: Some(0),
        ..SamplingParams::default()
    };
    Sampler::new(params).sample(logits, &[], 0)
}

/// Index of the largest logit; ties go to the lowest id, NaN is ignored;
/// 0 for an empty or all-NaN slice.
pub fn argmax(logits: &[f32]) -> u32 {
    let m = max_f32(logits);
    if m.is_nan() || m == f32::NEG_INFINITY {
        return logits.iter().position(|x| !x.is_nan()).unwrap_or(0) as u32;
    }
    first_index_of(logits, m)
}

/// xoshiro256** (Blackman & Vigna), seeded through splitmix64. Fixed here so
/// that seeded streams never change with a dependency's version.
#[derive(Clone, Debug)]
struct Xoshiro256StarStar {
    s: [u64; 4],
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Xoshiro256StarStar {
    fn seed_from_u64(seed: u64) -> Self {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        Self { s }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }
}

/// A seed from the OS-keyed std hasher, the clock and a process counter.
fn entropy_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.write_u128(nanos);
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random logits vector (N(0, scale)-ish).
    fn logits(vocab: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut rng = Xoshiro256StarStar::seed_from_u64(seed);
        (0..vocab)
            .map(|_| {
                // sum of 4 uniforms, centred: roughly normal
                let s: f32 = (0..4)
                    .map(|_| (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
                    .sum();
                (s - 2.0) * scale * 1.7
            })
            .collect()
    }

    fn params(temperature: f32, seed: u64) -> SamplingParams {
        SamplingParams {
            temperature,
            seed: Some(seed),
            ..Default::default()
        }
    }

    #[test]
    fn greedy_is_what_an_argmax_only_sampler_picks() {
        let mut cases = vec![logits(5000, 1, 3.0), vec![1.0, 3.0, 3.0, -2.0]];
        let mut nan = logits(300, 2, 2.0);
        nan[7] = f32::NAN;
        nan[9] = 50.0;
        nan[11] = 50.0;
        cases.push(nan);
        cases.push(vec![f32::NEG_INFINITY, 0.5, f32::NEG_INFINITY]);
        for z in &cases {
            for logprobs in [None, Some(0)] {
                let p = SamplingParams {
                    logprobs,
                    ..Default::default()
                };
                assert!(p.argmax_only());
                let want = Sampler::new(p).sample(z, &[3, 4], 1);
                let got = greedy(z);
                assert_eq!(got.token, want.token);
                assert_eq!(got.logprob.to_bits(), want.logprob.to_bits());
                assert!(got.top.is_empty() && want.top.is_empty());
            }
        }
        assert_eq!(
            greedy(&[1.0, 3.0, 3.0]).token,
            1,
            "ties go to the lowest id"
        );
    }

    #[test]
    fn argmax_only_excludes_whatever_needs_the_distribution() {
        let greedy = SamplingParams::default();
        assert!(greedy.argmax_only());
        let not = [
            params(0.7, 1),
            SamplingParams {
                logprobs: Some(2),
                ..Default::default()
            },
            SamplingParams {
                repetition_penalty: 1.1,
                ..Default::default()
            },
            SamplingParams {
                presence_penalty: -0.5,
                ..Default::default()
            },
            SamplingParams {
                frequency_penalty: 0.1,
                ..Default::default()
            },
            SamplingParams {
                logit_bias: vec![(3, -1.0)],
                ..Default::default()
            },
        ];
        for p in not {
            assert!(!p.argmax_only(), "{p:?}");
        }
        // Settings that change nothing keep it.
        let same = SamplingParams {
            top_k: 5,
            top_p: 0.5,
            min_p: 0.2,
            logit_bias: vec![(3, 0.0)],
            ..Default::default()
        };
        assert!(same.argmax_only());
    }

    #[test]
    fn sampling_from_the_top_logits_is_sampling_from_all() {
        // Ties, -0.0 and NaN in the row; temperature, top-k, top-p, min-p and
        // alternatives in every combination the top path accepts.
        let vocab = 3000;
        let k = TOP_CANDIDATES;
        let mut cases = 0;
        for (row, scale) in [(1u64, 1.0f32), (2, 4.0), (3, 0.05)] {
            let mut z = logits(vocab, row, scale);
            z[17] = z[5];
            z[40] = f32::NAN;
            z[41] = -0.0;
            z[42] = 0.0;
            for (temperature, top_k, top_p, min_p, lp) in [
                (0.0, 0, 1.0, 0.0, Some(5)),
                (0.0, 3, 0.5, 0.1, Some(20)),
                (0.7, 20, 0.95, 0.0, None),
                (1.0, 64, 1.0, 0.0, Some(0)),
                (1.3, 1, 1.0, 0.0, None),
                (0.6, 20, 0.8, 0.05, Some(3)),
                (2.0, 50, 0.3, 0.0, Some(20)),
            ] {
                let p = SamplingParams {
                    temperature,
                    top_k,
                    top_p,
                    min_p,
                    logprobs: lp,
                    seed: Some(row * 31 + top_k as u64),
                    ..Default::default()
                };
                assert!(p.samples_from_top(k, vocab), "{p:?}");
                let (mut full, mut top) = (Sampler::new(p.clone()), Sampler::new(p.clone()));
                let head = top_logits(&z, k);
                for _ in 0..50 {
                    assert_eq!(full.sample(&z, &[], 0), top.sample_top(&head), "{p:?}");
                    cases += 1;
                }
            }
        }
        assert_eq!(cases, 3 * 7 * 50);
    }

    /// One draw through the weighted-row path with the host's reference
    /// functions standing in for a backend's; also what it read.
    fn row_sample(s: &mut Sampler, z: &[f32]) -> (Sampled, RowRead) {
        let draw = s.start_row_draw();
        let mut planned = None;
        let row = read_weighted(z, draw.weighting(), &mut |head, sums| {
            let p = draw.plan(head, sums);
            planned = Some(p);
            p.read()
        });
        let plan = planned.unwrap();
        (s.finish_row(&draw, &plan, &row), row.read)
    }

    #[test]
    fn drawing_from_block_sums_is_sampling_from_the_row() {
        // The same tokens, stream and logprobs as `sample`; every way the
        // draw can be decided: in a block, among the head (top-p), or from
        // the whole row (a nucleus past the head).
        let vocab = 3001; // a partial last block
        let mut reads = [0usize; 3];
        // One likely token over a tail of light ones (each under the 2^-12
        // weight that makes a token heavy) holding a quarter of the mass:
        // top-p must reach into the tail, past the head.
        let mut tail = vec![-9.0f32; vocab];
        tail[1234] = 0.0;
        for (row, scale) in [(4u64, 1.0f32), (5, 6.0), (6, 0.02), (7, 30.0), (8, 0.0)] {
            let mut z = if scale == 0.0 {
                tail.clone()
            } else {
                logits(vocab, row, scale)
            };
            z[9] = f32::NAN;
            z[10] = f32::NEG_INFINITY;
            z[64] = z[63];
            for (temperature, top_p, min_p, lp) in [
                (1.0, 1.0, 0.0, Some(5)),
                (0.7, 1.0, 0.0, None),
                (0.3, 1.0, 0.05, Some(20)),
                (1.5, 1.0, 0.2, Some(0)),
                (1.0, 1.0, 1.0, None),
                (0.7, 0.95, 0.0, Some(3)),
                (1.0, 0.5, 0.1, None),
                (1.0, 0.9, 0.0, Some(2)),
                (0.2, 0.9, 0.0, Some(20)),
            ] {
                let p = SamplingParams {
                    temperature,
                    top_p,
                    min_p,
                    logprobs: lp,
                    seed: Some(row * 7 + (temperature * 10.0) as u64),
                    ..Default::default()
                };
                assert!(p.samples_from_weights(TOP_CANDIDATES, vocab), "{p:?}");
                let (mut full, mut split) = (Sampler::new(p.clone()), Sampler::new(p.clone()));
                for _ in 0..40 {
                    let (got, read) = row_sample(&mut split, &z);
                    assert_eq!(full.sample(&z, &[], 0), got, "{p:?}");
                    reads[match read {
                        RowRead::Head => 0,
                        RowRead::Block(_) => 1,
                        RowRead::Whole => 2,
                    }] += 1;
                }
            }
        }
        assert!(reads.iter().all(|&n| n > 0), "{reads:?}");
        // More heavy tokens than the head holds (6 likely ones, 200 light
        // but heavy ones), the nucleus among the likely ones: decided in the
        // head, as `sample` decides it.
        let mut z = vec![-20.0f32; vocab];
        for i in 0..6 {
            z[100 * i + 7] = 10.0;
        }
        for i in 0..200 {
            z[10 * i + 1000] = 3.0;
        }
        assert_eq!(heavy_count(&z, 10.0, 1.0), 206);
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            logprobs: Some(1),
            seed: Some(9),
            ..Default::default()
        };
        let (mut full, mut split) = (Sampler::new(p.clone()), Sampler::new(p));
        for _ in 0..20 {
            let (got, read) = row_sample(&mut split, &z);
            assert_eq!(read, RowRead::Head);
            assert_eq!(full.sample(&z, &[], 0), got);
        }
        // An infinite logit wins, as in `sample`.
        let mut z = logits(200, 1, 1.0);
        z[150] = f32::INFINITY;
        let mut s = Sampler::new(params(0.9, 2));
        assert_eq!(row_sample(&mut s, &z).0.token, 150);
    }

    #[test]
    fn top_logits_are_the_key_order_head_of_the_row() {
        let mut z = logits(500, 9, 2.0);
        z[3] = f32::NAN;
        z[100] = z[7];
        let t = top_logits(&z, 10);
        assert_eq!(t.top.len(), 10);
        let mut ids: Vec<u32> = (0..500).filter(|&i| i != 3).collect();
        ids.sort_by(|&a, &b| z[b as usize].total_cmp(&z[a as usize]).then(a.cmp(&b)));
        let want: Vec<(u32, f32)> = ids[..10].iter().map(|&i| (i, z[i as usize])).collect();
        assert_eq!(t.top, want);
        let m = want[0].1 as f64;
        let s: f64 = z
            .iter()
            .filter(|x| !x.is_nan())
            .map(|&x| (x as f64 - m).exp())
            .sum();
        assert!((t.lse - s.ln()).abs() < 1e-6, "{} vs {}", t.lse, s.ln());
        // More than the row: all of it, NaN as -inf last.
        let all = top_logits(&z[..5], 64);
        assert_eq!(all.top.len(), 5);
        assert_eq!(all.top[4], (3, f32::NEG_INFINITY));
    }

    #[test]
    fn the_top_and_row_paths_take_only_what_they_can_draw_exactly() {
        let vocab = 1000;
        let ok = SamplingParams {
            temperature: 0.7,
            top_k: 20,
            top_p: 0.95,
            ..Default::default()
        };
        assert!(ok.samples_from_top(64, vocab));
        assert!(SamplingParams::default().samples_from_top(64, vocab));
        let not = [
            params(0.7, 1), // no top-k: the whole row
            SamplingParams {
                top_k: 65,
                ..ok.clone()
            },
            SamplingParams {
                top_k: 1000,
                ..ok.clone()
            },
            SamplingParams {
                repetition_penalty: 1.1,
                ..ok.clone()
            },
            SamplingParams {
                presence_penalty: 0.5,
                ..ok.clone()
            },
            SamplingParams {
                logit_bias: vec![(3, 2.0)],
                ..ok.clone()
            },
        ];
        for p in not {
            assert!(!p.samples_from_top(64, vocab), "{p:?}");
        }
        // The whole-row path: temperature, top-p and min-p only.
        let row = SamplingParams {
            top_k: 0,
            top_p: 0.9,
            min_p: 0.1,
            ..ok.clone()
        };
        assert!(row.samples_from_weights(64, vocab) && !row.samples_from_top(64, vocab));
        for p in [
            SamplingParams {
                top_k: 5,
                ..row.clone()
            },
            SamplingParams {
                temperature: 0.0,
                ..row.clone()
            },
            SamplingParams {
                repetition_penalty: 1.2,
                ..row.clone()
            },
        ] {
            assert!(!p.samples_from_weights(64, vocab), "{p:?}");
        }
        // More alternatives than candidates.
        let many = SamplingParams {
            logprobs: Some(20),
            ..ok
        };
        assert!(many.samples_from_top(20, vocab) && !many.samples_from_top(16, vocab));
    }

    fn softmax64(z: &[f32], t: f64) -> Vec<f64> {
        let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let e: Vec<f64> = z.iter().map(|&x| ((x as f64 - m) / t).exp()).collect();
        let s: f64 = e.iter().sum();
        e.into_iter().map(|x| x / s).collect()
    }

    fn log_softmax64(z: &[f32]) -> Vec<f64> {
        let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let s: f64 = z.iter().map(|&x| (x as f64 - m).exp()).sum();
        z.iter().map(|&x| (x as f64 - m) - s.ln()).collect()
    }

    fn histogram(p: SamplingParams, z: &[f32], n: usize) -> Vec<usize> {
        let mut s = Sampler::new(p);
        let mut h = vec![0; z.len()];
        for _ in 0..n {
            h[s.sample(z, &[], 0).token as usize] += 1;
        }
        h
    }

    /// Pearson's chi-square of counts against expected probabilities.
    fn chi_square(h: &[usize], p: &[f64]) -> f64 {
        let n: usize = h.iter().sum();
        h.iter()
            .zip(p)
            .filter(|&(_, &p)| p > 0.0)
            .map(|(&o, &p)| {
                let e = p * n as f64;
                (o as f64 - e).powi(2) / e
            })
            .sum()
    }

    #[test]
    fn rng_reference_streams() {
        // splitmix64 reference output for state 0.
        let mut sm = 0u64;
        assert_eq!(splitmix64(&mut sm), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(&mut sm), 0x6E78_9E6A_A1B9_65F4);
        // xoshiro256** reference output for state [1, 2, 3, 4].
        let mut r = Xoshiro256StarStar { s: [1, 2, 3, 4] };
        let got: Vec<u64> = (0..4).map(|_| r.next_u64()).collect();
        assert_eq!(got, [11520, 0, 1509978240, 1215971899390074240]);
    }

    #[test]
    fn exp_matches_std() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let e = (x as f64).exp();
            let rel = ((exp_nonpos(x) as f64 - e) / e).abs();
            worst = worst.max(rel);
            x += 0.001_3;
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert_eq!(exp_nonpos(0.0), 1.0);
        assert_eq!(exp_nonpos(-0.0), 1.0);
        assert!(exp_nonpos(f32::NEG_INFINITY) < 2e-38);
        assert!(exp_nonpos(f32::NAN) < 2e-38);
    }

    #[test]
    fn greedy_is_argmax() {
        for seed in 0..5 {
            let z = logits(1000, seed, 3.0);
            let mut s = Sampler::new(SamplingParams::default());
            let out = s.sample(&z, &[1, 2, 3], 3);
            let want = z
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
                .unwrap()
                .0;
            assert_eq!(out.token as usize, want);
            assert_eq!(out.token, argmax(&z));
            assert!(out.top.is_empty());
        }
        // Ties go to the lowest id; NaN never wins.
        assert_eq!(argmax(&[1.0, 3.0, f32::NAN, 3.0]), 1);
        assert_eq!(argmax(&[f32::NAN, -1.0, -1.0]), 1);
        assert_eq!(argmax(&[]), 0);
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[0.5, 2.0, 2.0, f32::NAN], &[], 0).token, 1);
    }

    #[test]
    fn seeds_are_reproducible() {
        let z = logits(5000, 7, 2.0);
        let run = |seed| {
            let mut s = Sampler::new(SamplingParams {
                temperature: 0.9,
                top_p: 0.95,
                top_k: 100,
                seed: Some(seed),
                ..Default::default()
            });
            (0..64)
                .map(|_| s.sample(&z, &[], 0).token)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(42), run(42));
        assert_ne!(run(42), run(43));
        // Unseeded samplers get different streams.
        let a = Sampler::new(params(1.0, 0));
        let mut p = params(1.0, 0);
        p.seed = None;
        let (b, c) = (Sampler::new(p.clone()), Sampler::new(p));
        assert_ne!(b.seed(), c.seed());
        assert_eq!(a.seed(), 0);
    }

    #[test]
    fn seeded_stream_is_pinned() {
        // Guards cross-version stability of seeded sampling: changing the
        // RNG, the exp or the draw changes these tokens.
        let z = logits(2000, 1, 2.0);
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            seed: Some(1234),
            ..Default::default()
        });
        let plain: Vec<u32> = (0..8).map(|_| s.sample(&z, &[], 0).token).collect();
        let mut s = Sampler::new(SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            top_k: 50,
            min_p: 0.05,
            seed: Some(1234),
            ..Default::default()
        });
        let truncated: Vec<u32> = (0..8).map(|_| s.sample(&z, &[], 0).token).collect();
        assert_eq!(plain, PINNED_PLAIN, "plain {plain:?}");
        assert_eq!(truncated, PINNED_TRUNCATED, "truncated {truncated:?}");
    }
    #[test]
    fn exp_bits_are_pinned() {
        // The weights' exact bits (and so seeded draws) must not depend on
        // the platform or the SIMD path; this checksum pins them.
        let mut sum = 0u64;
        let mut x = -90.0f32;
        while x <= 0.5 {
            sum = sum
                .wrapping_mul(31)
                .wrapping_add(exp_nonpos(x).to_bits() as u64);
            x += 0.003_7;
        }
        let mut w = vec![0f32; 3000];
        let z: Vec<f32> = (0..3000).map(|i| (i as f32 * 0.37).sin() * 20.0).collect();
        let mut blocks = Vec::new();
        let total = weights(&z, &mut w, &mut blocks, max_f32(&z), 0.7);
        for v in &w {
            sum = sum.wrapping_mul(31).wrapping_add(v.to_bits() as u64);
        }
        assert_eq!(
            (sum, total.to_bits()),
            PINNED_EXP,
            "{sum:#x} {:#x}",
            total.to_bits()
        );
    }
    const PINNED_EXP: (u64, u64) = (0x2aa1_8a0d_39b4_8f3c, 0x406c_2fbe_bc31_de9c);
    const PINNED_PLAIN: [u32; 8] = [100, 1635, 1352, 1710, 208, 1731, 846, 359];
    const PINNED_TRUNCATED: [u32; 8] = [109, 1573, 1352, 1713, 109, 1713, 804, 277];

    #[test]
    fn temperature_one_matches_softmax() {
        let z = [1.0f32, 0.5, 0.0, -0.5, 2.0, -3.0, 1.5, 0.25];
        let n = 20_000;
        let h = histogram(params(1.0, 99), &z, n);
        let chi = chi_square(&h, &softmax64(&z, 1.0));
        // 7 degrees of freedom: P(chi2 > 24.3) = 0.001.
        assert!(chi < 24.3, "chi-square {chi}, counts {h:?}");
        // And at temperature 0.5.
        let h = histogram(params(0.5, 5), &z, n);
        let chi = chi_square(&h, &softmax64(&z, 0.5));
        assert!(chi < 24.3, "chi-square {chi}, counts {h:?}");
    }

    #[test]
    fn truncated_distribution_is_renormalised() {
        let z = [1.0f32, 0.5, 0.0, -0.5, 2.0, -3.0, 1.5, 0.25];
        let n = 20_000;
        // top_k = 3 keeps tokens 4, 6, 0.
        let mut p = params(1.0, 3);
        p.top_k = 3;
        let h = histogram(p, &z, n);
        let mut keep = z.to_vec();
        for (i, x) in keep.iter_mut().enumerate() {
            if ![4, 6, 0].contains(&i) {
                *x = f32::NEG_INFINITY;
            }
        }
        let want = softmax64(&keep, 1.0);
        assert_eq!(h.iter().filter(|&&c| c > 0).count(), 3, "{h:?}");
        assert!(chi_square(&h, &want) < 13.8, "{h:?}"); // 2 dof, p = 0.001
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        for seed in 0..20 {
            let z = logits(10_000, seed, 1.0);
            let greedy = argmax(&z);
            let mut s = Sampler::new(SamplingParams {
                temperature: 1.5,
                top_k: 1,
                seed: Some(seed),
                ..Default::default()
            });
            assert_eq!(s.sample(&z, &[], 0).token, greedy);
            let mut s = Sampler::new(SamplingParams {
                temperature: 1.5,
                top_p: 1e-6,
                seed: Some(seed),
                ..Default::default()
            });
            assert_eq!(s.sample(&z, &[], 0).token, greedy);
        }
    }

    /// Brute-force survivor set: sort all tokens, cut by k, p, min-p.
    fn reference_survivors(z: &[f32], t: f32, k: usize, top_p: f32, min_p: f32) -> Vec<u32> {
        let p = softmax64(z, t as f64);
        let mut order: Vec<usize> = (0..z.len()).collect();
        order.sort_by(|&a, &b| z[b].partial_cmp(&z[a]).unwrap().then(a.cmp(&b)));
        if k > 0 {
            order.truncate(k);
        }
        let mass: f64 = order.iter().map(|&i| p[i]).sum();
        let mut cum = 0.0;
        let mut n = 0;
        for &i in &order {
            cum += p[i];
            n += 1;
            if cum >= top_p as f64 * mass {
                break;
            }
        }
        order.truncate(n);
        let pmax = p[order[0]];
        let mut out: Vec<u32> = order
            .into_iter()
            .filter(|&i| p[i] >= min_p as f64 * pmax)
            .map(|i| i as u32)
            .collect();
        out.sort();
        out
    }

    #[test]
    fn truncation_matches_brute_force() {
        // (vocab, temperature, top_k, top_p, min_p); covers the heap and
        // histogram top-k, the listed and histogram nucleus, and min-p alone.
        let cases = [
            (20_000, 1.0, 0, 0.9, 0.0),
            (20_000, 0.7, 0, 0.5, 0.0),
            (20_000, 1.0, 40, 1.0, 0.0),
            (20_000, 1.0, 40, 0.8, 0.0),
            (20_000, 1.3, 1000, 0.95, 0.0),
            (20_000, 1.0, 0, 1.0, 0.1),
            (20_000, 1.0, 0, 0.9, 0.02),
            (20_000, 2.0, 500, 0.99, 0.01),
            (20_000, 1.0, 0, 0.999, 0.0),
            (20_000, 1.0, 6000, 1.0, 0.0),
            (20_000, 1.0, 6000, 0.9, 0.0),
            (20_000, 0.8, 10_000, 0.5, 0.05),
            (100_000, 1.0, 70_000, 0.9, 0.0),
            (100_000, 1.0, 70_000, 1.0, 0.0),
        ];
        for (case, &(vocab, t, k, top_p, min_p)) in cases.iter().enumerate() {
            for scale in [0.3f32, 1.0, 4.0] {
                for ties in [false, true] {
                    let mut z = logits(vocab, case as u64, scale);
                    if ties {
                        z.iter_mut().for_each(|x| *x = (*x * 4.0).round() / 4.0);
                    }
                    let mut s = Sampler::new(SamplingParams {
                        temperature: t,
                        top_k: k,
                        top_p,
                        min_p,
                        seed: Some(1),
                        ..Default::default()
                    });
                    let prep = s.prepare(&z, &[], 0);
                    s.draw(prep.work_max, None);
                    let got = s.survivors();
                    let want = reference_survivors(&z, t, k, top_p, min_p);
                    let exact = top_p == 1.0 && min_p == 0.0;
                    // Rounding may move a p cut by a token at an exact boundary.
                    let slack = if exact { 0 } else { 1 };
                    let diff = want.len().abs_diff(got.len());
                    let common = want.iter().filter(|i| got.binary_search(i).is_ok()).count();
                    assert!(
                        diff <= slack && common + slack >= want.len(),
                        "case {case} scale {scale} ties {ties}: got {} survivors, want {}",
                        got.len(),
                        want.len()
                    );
                }
            }
        }
    }

    #[test]
    fn min_p_excludes_low_tokens() {
        // p relative to max: 1, e^-1 = .37, e^-2 = .14, e^-3 = .05, e^-5.
        let z = [3.0f32, 2.0, 1.0, 0.0, -2.0];
        let mut p = params(1.0, 11);
        p.min_p = 0.1;
        let h = histogram(p, &z, 20_000);
        assert!(h[0] > 0 && h[1] > 0 && h[2] > 0, "{h:?}");
        assert_eq!((h[3], h[4]), (0, 0), "{h:?}");
        let mut p = params(1.0, 11);
        p.min_p = 0.3;
        let h = histogram(p, &z, 5_000);
        assert_eq!(&h[2..], &[0, 0, 0], "{h:?}");
    }

    #[test]
    fn repetition_penalty() {
        let z = [2.0f32, -1.0, 1.5, -0.5, 0.0];
        let mut s = Sampler::new(SamplingParams {
            repetition_penalty: 2.0,
            ..Default::default()
        });
        // Token 0 in the prompt, token 1 generated: both penalised.
        let out = s.process_logits(&z, &[0, 1], 1).to_vec();
        assert_eq!(out, [1.0, -2.0, 1.5, -0.5, 0.0]);
        assert_eq!(s.sample(&z, &[0, 1], 1).token, 2);
        // Repeated occurrences are penalised once; the state resets between calls.
        assert_eq!(
            s.process_logits(&z, &[0, 0, 0], 3),
            &[1.0, -1.0, 1.5, -0.5, 0.0]
        );
        assert_eq!(s.process_logits(&z, &[], 0), &z);
        // Out-of-vocab context ids are ignored.
        assert_eq!(s.process_logits(&z, &[99], 0), &z);
    }

    #[test]
    fn presence_and_frequency_penalties() {
        let z = [2.0f32, 1.0, 0.5, 0.0];
        let mut s = Sampler::new(SamplingParams {
            presence_penalty: 1.5,
            ..Default::default()
        });
        // Prompt tokens don't count for presence; generated 0 (twice) and 2 do.
        let out = s.process_logits(&z, &[1, 1, 0, 2, 0], 2).to_vec();
        assert_eq!(out, [0.5, 1.0, -1.0, 0.0]);
        assert_eq!(s.sample(&z, &[1, 1, 0, 2, 0], 2).token, 1);

        let mut s = Sampler::new(SamplingParams {
            frequency_penalty: 0.5,
            ..Default::default()
        });
        let out = s.process_logits(&z, &[1, 1, 0, 2, 0, 0], 2).to_vec();
        assert_eq!(out, [0.5, 1.0, 0.0, 0.0]);
        assert_eq!(s.sample(&z, &[1, 1, 0, 2, 0, 0], 2).token, 1);

        // Both together, negative values encourage repetition.
        let mut s = Sampler::new(SamplingParams {
            presence_penalty: -1.0,
            frequency_penalty: -0.25,
            ..Default::default()
        });
        let out = s.process_logits(&z, &[3, 3], 0).to_vec();
        assert_eq!(out, [2.0, 1.0, 0.5, 1.5]);
    }

    #[test]
    fn processing_order() {
        // bias, then repetition (divides the biased positive logit), then presence.
        let z = [1.0f32, 0.0];
        let mut s = Sampler::new(SamplingParams {
            logit_bias: vec![(0, 3.0)],
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            ..Default::default()
        });
        assert_eq!(s.process_logits(&z, &[0], 0), &[1.5, 0.0]);
    }

    #[test]
    fn logit_bias_bans_and_forces() {
        let z = logits(1000, 3, 1.0);
        let best = argmax(&z);
        let mut p = params(1.0, 8);
        p.logit_bias = vec![(best, -100.0)];
        let h = histogram(p, &z, 5_000);
        assert_eq!(h[best as usize], 0);
        let mut p = params(1.0, 8);
        p.logit_bias = vec![(17, 100.0)];
        let h = histogram(p, &z, 2_000);
        assert_eq!(h[17], 2_000);
        // Greedy too; the reported logprob is still the raw one.
        let mut s = Sampler::new(SamplingParams {
            logit_bias: vec![(17, 100.0)],
            ..Default::default()
        });
        let out = s.sample(&z, &[], 0);
        assert_eq!(out.token, 17);
        assert!((out.logprob as f64 - log_softmax64(&z)[17]).abs() < 1e-5);
    }

    #[test]
    fn logprobs_match_f64_reference() {
        for (seed, scale) in [(0u64, 1.0f32), (1, 5.0), (2, 20.0)] {
            let z = logits(248_320, seed, scale);
            let want = log_softmax64(&z);
            let mut s = Sampler::new(SamplingParams {
                temperature: 0.8,
                top_p: 0.9,
                repetition_penalty: 1.3,
                logit_bias: vec![(5, 7.0)],
                logprobs: Some(20),
                seed: Some(seed),
                ..Default::default()
            });
            for _ in 0..3 {
                let out = s.sample(&z, &[5, 6, 7], 1);
                assert!(
                    (out.logprob as f64 - want[out.token as usize]).abs() < 1e-5,
                    "{} vs {}",
                    out.logprob,
                    want[out.token as usize]
                );
                assert_eq!(out.top.len(), 20);
                let mut order: Vec<usize> = (0..z.len()).collect();
                order.sort_by(|&a, &b| want[b].total_cmp(&want[a]).then(a.cmp(&b)));
                for (&(id, lp), &i) in out.top.iter().zip(&order) {
                    assert_eq!(id as usize, i);
                    assert!((lp as f64 - want[i]).abs() < 1e-5);
                }
            }
            let helper = log_softmax(&z);
            for (a, b) in helper.iter().zip(&want) {
                assert!((*a as f64 - b).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn top_logprobs_order_and_ties() {
        let lp = [-1.0f32, -0.5, -1.0, f32::NAN, -0.5, -3.0];
        assert_eq!(
            top_logprobs(&lp, 4),
            vec![(1, -0.5), (4, -0.5), (0, -1.0), (2, -1.0)]
        );
        assert_eq!(top_logprobs(&lp, 0), vec![]);
        assert_eq!(top_logprobs(&lp, 100).len(), 5);
        // Large k takes the sorting path; same order.
        let z = logits(5000, 4, 1.0);
        let big = top_logprobs(&z, 300);
        let mut order: Vec<u32> = (0..5000).collect();
        order.sort_by(|&a, &b| z[b as usize].total_cmp(&z[a as usize]).then(a.cmp(&b)));
        assert_eq!(big.iter().map(|t| t.0).collect::<Vec<_>>(), &order[..300]);
        assert_eq!(top_logprobs(&z, 64), big[..64]);
        let mut s = Sampler::new(SamplingParams {
            logprobs: Some(2),
            ..Default::default()
        });
        let out = s.sample(&[0.0, 1.0, 1.0], &[], 0);
        assert_eq!(out.token, 1);
        assert_eq!(out.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 2]);
        let mut s = Sampler::new(SamplingParams {
            logprobs: Some(0),
            ..Default::default()
        });
        assert!(s.sample(&[0.0, 1.0], &[], 0).top.is_empty());
    }

    #[test]
    fn degenerate_inputs_do_not_panic() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_p: 0.5,
            min_p: 0.5,
            top_k: 3,
            seed: Some(0),
            ..Default::default()
        });
        assert_eq!(s.sample(&[], &[], 0).token, 0);
        assert_eq!(s.sample(&[f32::NEG_INFINITY; 4], &[], 0).token, 0);
        assert_eq!(s.sample(&[f32::NAN, 1.0, f32::NAN], &[], 0).token, 1);
        assert_eq!(s.sample(&[0.0, 1.0, f32::INFINITY], &[], 0).token, 2);
        let t = s.sample(&[f32::NEG_INFINITY, 0.0, 0.0], &[], 0).token;
        assert!(t == 1 || t == 2);
        // Unvalidated nonsense is tolerated.
        let mut s = Sampler::new(SamplingParams {
            temperature: f32::NAN,
            logit_bias: vec![(1000, 5.0)],
            repetition_penalty: -1.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&[0.0, 1.0], &[7, 1], 9).token, 1);
    }

    #[test]
    fn validate_messages() {
        let ok = SamplingParams::default();
        ok.validate(10).unwrap();
        let err = |p: SamplingParams| p.validate(10).unwrap_err().to_string();
        let with = |f: &dyn Fn(&mut SamplingParams)| {
            let mut p = SamplingParams::default();
            f(&mut p);
            err(p)
        };
        assert_eq!(with(&|p| p.top_p = 1.5), "top_p must be in (0, 1], got 1.5");
        assert_eq!(with(&|p| p.top_p = 0.0), "top_p must be in (0, 1], got 0");
        assert_eq!(
            with(&|p| p.temperature = -0.1),
            "temperature must be a finite number >= 0, got -0.1"
        );
        assert!(with(&|p| p.temperature = f32::INFINITY).starts_with("temperature"));
        assert_eq!(with(&|p| p.min_p = 1.1), "min_p must be in [0, 1], got 1.1");
        assert_eq!(
            with(&|p| p.repetition_penalty = 0.0),
            "repetition_penalty must be a finite number > 0, got 0"
        );
        assert_eq!(
            with(&|p| p.presence_penalty = 2.5),
            "presence_penalty must be in [-2, 2], got 2.5"
        );
        assert_eq!(
            with(&|p| p.frequency_penalty = -3.0),
            "frequency_penalty must be in [-2, 2], got -3"
        );
        assert_eq!(
            with(&|p| p.logit_bias = vec![(10, 1.0)]),
            "logit_bias token id must be < the vocabulary size 10, got 10"
        );
        assert_eq!(
            with(&|p| p.logit_bias = vec![(3, 101.0)]),
            "logit_bias value for token 3 must be in [-100, 100], got 101"
        );
        assert_eq!(
            with(&|p| p.logprobs = Some(21)),
            "logprobs must be in [0, 20], got 21"
        );
        assert!(with(&|p| p.min_p = f32::NAN).starts_with("min_p"));
        let mut p = SamplingParams {
            temperature: 2.0,
            top_p: 0.1,
            top_k: 1_000_000,
            min_p: 1.0,
            seed: Some(3),
            repetition_penalty: 0.5,
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            logit_bias: vec![(9, -100.0), (0, 100.0)],
            logprobs: Some(20),
        };
        p.validate(10).unwrap();
        p.logprobs = Some(0);
        p.validate(10).unwrap();
    }

    #[test]
    fn serde_defaults() {
        let p: SamplingParams = serde_json::from_str(r#"{"temperature": 0.7}"#).unwrap();
        assert_eq!(
            p,
            SamplingParams {
                temperature: 0.7,
                ..Default::default()
            }
        );
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<SamplingParams>(&json).unwrap(), p);
    }

    #[test]
    #[ignore = "timing; run with --release -- --ignored --nocapture"]
    fn timing() {
        let vocab = 248_320;
        for scale in [1.0f32, 3.0, 10.0] {
            let z = logits(vocab, 5, scale);
            let context: Vec<u32> = (0..2000).map(|i| (i * 97) % vocab as u32).collect();
            let configs: [(&str, SamplingParams); 7] = [
                ("greedy", SamplingParams::default()),
                ("t=1", params(1.0, 1)),
                (
                    "t=0.7 top_p=0.9",
                    SamplingParams {
                        top_p: 0.9,
                        ..params(0.7, 1)
                    },
                ),
                (
                    "t=1 top_k=50",
                    SamplingParams {
                        top_k: 50,
                        ..params(1.0, 1)
                    },
                ),
                (
                    "t=1 top_k=5000 top_p=.95",
                    SamplingParams {
                        top_k: 5000,
                        top_p: 0.95,
                        ..params(1.0, 1)
                    },
                ),
                (
                    "t=1 min_p=0.05",
                    SamplingParams {
                        min_p: 0.05,
                        ..params(1.0, 1)
                    },
                ),
                (
                    "t=0.8 all + penalties + logprobs",
                    SamplingParams {
                        top_k: 40,
                        top_p: 0.95,
                        min_p: 0.01,
                        repetition_penalty: 1.1,
                        presence_penalty: 0.5,
                        frequency_penalty: 0.2,
                        logprobs: Some(20),
                        ..params(0.8, 1)
                    },
                ),
            ];
            for (name, p) in configs {
                let mut s = Sampler::new(p);
                s.sample(&z, &context, 1000);
                let mut times: Vec<f64> = (0..100)
                    .map(|_| {
                        let t0 = std::time::Instant::now();
                        std::hint::black_box(s.sample(&z, &context, 1000));
                        t0.elapsed().as_secs_f64() * 1e3
                    })
                    .collect();
                times.sort_by(f64::total_cmp);
                println!(
                    "scale {scale:>4}: {name:<34} min {:.3} ms, median {:.3} ms",
                    times[0], times[50]
                );
            }
        }
    }
}
