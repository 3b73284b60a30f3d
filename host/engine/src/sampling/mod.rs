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
//!
//! Modules: `params` (the request's knobs), `sampler` (the draw over a row),
//! `row_draw` (the draw over a row weighted on the device), `draw` and `keys`
//! (cut-offs and the walk, on the `(logit, id)` key order), `simd` and `exp`
//! (the row passes and the exponential), `logprobs`, `rng`. What a backend
//! hands back lives in [`crate::readout::protocol`].

mod draw;
mod exp;
mod keys;
mod logprobs;
mod params;
mod rng;
mod row_draw;
mod sampler;
mod simd;
#[cfg(test)]
pub(crate) mod test_util;

pub use draw::BlockPick;
pub use logprobs::{argmax, greedy, log_softmax, top_logprobs};
pub use params::{MAX_LOGPROBS, SamplingParams};
pub use row_draw::{RowDraw, RowPlan};
pub use sampler::Sampler;

// The device-readout protocol lives with the readout now
// (`crate::readout::protocol`); these keep the `crate::sampling` paths.
pub use crate::readout::protocol::{
    RowPlanner, RowRead, RowSums, Sampled, TOP_CANDIDATES, TopLogits, WEIGHT_BLOCK, WeightedRow,
    Weighting, heavy_count, key_parts, read_weighted, row_read, top_logits, weight_blocks,
};

// What the readout protocol's host references compute with.
pub(crate) use draw::heavy_floor;
pub(crate) use exp::temp_weight;
pub(crate) use keys::{key, key_id, key_logit};
pub(crate) use logprobs::log_sum_exp;
pub(crate) use simd::{block_sum, copy_sanitized_max};

/// Weights are summed and walked in blocks of this many tokens.
pub(crate) const BLOCK: usize = 64;
