//! What a backend hands back for sampling when the logits stay on the
//! device, and the host functions that compute the same from a logits row:
//! the references a backend's readout must equal bit for bit.

use crate::sampling::{
    BLOCK, block_sum, copy_sanitized_max, heavy_floor, key, key_id, key_logit, log_sum_exp,
    temp_weight,
};
#[cfg(doc)]
use crate::sampling::{Sampler, SamplingParams};

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
    pub(crate) fn sampled(&self, token: u32, logit: Option<f32>, alternatives: usize) -> Sampled {
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
pub(crate) fn row_weights(logits: &[f32], max: f32, t: f32, min_p: f32, w: &mut [f32]) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::test_util::logits;

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
}
