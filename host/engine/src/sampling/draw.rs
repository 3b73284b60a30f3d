//! Truncation cut-offs and the draw itself, on integer-quantised weights so
//! that no answer depends on the order a select algorithm leaves things in.

use super::BLOCK;
use super::rng::unit_f64;

/// Quantised token weights (`w · 2^44`, the most likely token exactly
/// `2^44`) used wherever a truncation cut-off is searched for by reordering
/// candidates: integer sums don't depend on the order, so the cut doesn't
/// depend on the standard library's select algorithm.
pub(super) const Q_SCALE: f32 = (1u64 << 44) as f32;

/// When top-p runs without top-k, first look for the nucleus among the tokens
/// with weight at least `2^-12` of the maximum (usually a handful): those
/// with `(z - z_max) / T >= ln 2^-12`.
const PREFILTER_LOG_W: f32 = -8.317_766;

/// Candidate sets up to this size are kept as explicit lists (heap top-k,
/// sorted survivors); larger cut-offs are found with a histogram over the
/// top 16 bits of the keys and applied by masking the weights.
pub(super) const LIST_MAX: usize = 4096;

/// Weight quantised for exact, order-independent sums.
#[inline]
pub(super) fn qz(w: f32) -> u64 {
    (w * Q_SCALE) as u64
}

/// The lowest logit of a "heavy" token, the ones top-p looks at first: a
/// weight of at least ~2^-12 of the maximum's.
#[inline]
pub(crate) fn heavy_floor(max: f32, t: f32) -> f32 {
    max + t * PREFILTER_LOG_W
}

/// Draws a token with probability proportional to `w`, using the block sums
/// to skip ahead. Never returns a token of weight 0 (unless all are 0).
pub(super) fn blocked_walk(w: &[f32], blocks: &[f64], u: u64) -> u32 {
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
pub(super) fn pick_block(blocks: &[f64], u: u64) -> BlockPick {
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
pub(super) fn walk_block(wb: &[f32], pick: &BlockPick) -> u32 {
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
pub(super) fn nucleus_len(keys: &mut [u64], weight: impl Fn(u64) -> u64, target: u64) -> usize {
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
pub(super) fn nucleus_among(keys: &mut Vec<u64>, weight: impl Fn(u64) -> u64, top_p: f32) {
    let mass: u64 = keys.iter().map(|&k| weight(k)).sum();
    let target = ((top_p as f64 * mass as f64).ceil() as u64).max(1);
    let n = nucleus_len(keys, &weight, target);
    keys.truncate(n);
}

/// The draw among listed candidates `(id, weight)`: drops those under
/// `min_p` (or of weight 0), then walks the rest in id order. The survivors'
/// ids are left in `ids`.
pub(super) fn draw_among(
    pairs: &mut Vec<(u32, f32)>,
    ids: &mut Vec<u32>,
    min_p: f32,
    u: u64,
) -> u32 {
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
