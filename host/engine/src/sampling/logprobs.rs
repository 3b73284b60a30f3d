//! Log-probabilities of the raw logits (what responses report) and the
//! greedy pick.

use super::simd::{max_f32, sum_exp};
use super::{Sampled, Sampler, SamplingParams};

/// `ln Σ e^(x - max)` over `logits` (NaN ignored).
pub(crate) fn log_sum_exp(logits: &[f32], max: f32) -> f64 {
    if max.is_finite() {
        sum_exp(logits, max).ln()
    } else {
        f64::NAN
    }
}

/// First index holding `x` (0 if none).
pub(super) fn first_index_of(v: &[f32], x: f32) -> u32 {
    v.iter().position(|&y| y == x).unwrap_or(0) as u32
}

/// Ids of the `k` largest values (NaN skipped), descending, ties by id ascending.
pub(super) fn top_indices(values: &[f32], k: usize) -> Vec<u32> {
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
