//! The sampler's side of a draw over a row weighted where it lies: from the
//! head and the block sums a backend reads back, what else to read, and the
//! token [`Sampler::sample`] would draw.

use super::draw::{
    BlockPick, LIST_MAX, Q_SCALE, draw_among, heavy_floor, nucleus_len, pick_block, qz,
};
use super::exp::temp_weight;
use super::keys::{key, key_id, key_logit};
use super::{RowRead, RowSums, TOP_CANDIDATES, TopLogits, Weighting};
#[cfg(doc)]
use super::{Sampler, heavy_count, weight_blocks};

/// One draw of [`Sampler::sample`] over a row weighted where it lies: the
/// RNG output it consumes and the settings the weights need.
#[derive(Clone, Copy, Debug)]
pub struct RowDraw {
    pub(super) u: u64,
    pub(super) temperature: f32,
    pub(super) top_p: f32,
    pub(super) min_p: f32,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::test_util::{logits, params};
    use crate::sampling::{Sampled, Sampler, SamplingParams, heavy_count, read_weighted};

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
}
