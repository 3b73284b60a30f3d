//! Inputs the sampling tests share.

use super::SamplingParams;
use super::rng::Xoshiro256StarStar;

/// A deterministic pseudo-random logits vector (N(0, scale)-ish).
pub(crate) fn logits(vocab: usize, seed: u64, scale: f32) -> Vec<f32> {
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

pub(crate) fn params(temperature: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        seed: Some(seed),
        ..Default::default()
    }
}
