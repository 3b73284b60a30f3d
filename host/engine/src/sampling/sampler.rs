//! [`Sampler`]: one request's RNG stream and scratch buffers, and the token
//! drawn from a logits row (or from a backend's readout of it).

use super::draw::{
    LIST_MAX, Q_SCALE, blocked_walk, draw_among, heavy_floor, nucleus_among, nucleus_len, qz,
    walk_block,
};
use super::exp::temp_weight;
use super::keys::{key, key_id, key_logit};
use super::logprobs::{first_index_of, log_sum_exp, top_indices};
use super::params::finite_or_zero;
use super::rng::{Xoshiro256StarStar, entropy_seed};
use super::simd::{
    bucket_counts, bucket_masses, collect_at_least, collect_bucket, copy_sanitized_max,
    mask_weights, max_f32, weights,
};
use super::{BLOCK, RowDraw, RowPlan, RowRead, Sampled, SamplingParams, TopLogits, WeightedRow};
use crate::readout::protocol::row_weights;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Above this, top-k followed by top-p searches the nucleus with a histogram
/// rather than among the top-k keys.
const BIG_LIST_MAX: usize = 1 << 16;

const BUCKETS: usize = 1 << 16;

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

#[cfg(test)]
mod tests;
