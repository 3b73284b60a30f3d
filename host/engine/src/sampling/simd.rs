//! The passes over a whole logits row, each built twice: for AVX2 where the
//! CPU has it and portable, with the same IEEE operations (so the same bits).

use super::BLOCK;
use super::exp::{exp_nonpos, temp_weight};
use super::keys::{key, z_bucket};

/// Defines `$vis fn $name` that runs an AVX2 build of the body where the CPU has
/// it (x86-64's baseline is SSE2), else the portable one. Same IEEE
/// operations either way (Rust never fuses multiply-adds), so same bits.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $body:block) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) -> $ret {
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

/// Sum of up to [`BLOCK`] weights: 8 f32 lanes, then f64.
#[inline]
pub(crate) fn block_sum(w: &[f32]) -> f64 {
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

multiversion! {
    /// Copies `src` into `dst` (same length) with NaN replaced by -inf; returns the max.
    pub(crate) fn copy_sanitized_max(src: &[f32], dst: &mut [f32]) -> f32 {
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
    pub(super) fn max_f32(v: &[f32]) -> f32 {
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
    pub(super) fn weights(work: &[f32], w: &mut [f32], blocks: &mut Vec<f64>, z_max: f32, t: f32) -> f64 {
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
    pub(super) fn mask_weights(
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
    pub(super) fn bucket_counts(work: &[f32], counts: &mut [u32]) -> () {
        for &z in work {
            counts[z_bucket(z)] += 1;
        }
    }
}

multiversion! {
    /// Weight per [`z_bucket`].
    pub(super) fn bucket_masses(work: &[f32], w: &[f32], masses: &mut [f64]) -> () {
        for (&z, &w) in work.iter().zip(w) {
            masses[z_bucket(z)] += w as f64;
        }
    }
}

multiversion! {
    /// Pushes the keys of the tokens in bucket `b` (with `w > 0` if
    /// `positive_only`) onto `keys`, in id order.
    pub(super) fn collect_bucket(
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
    pub(super) fn collect_at_least(work: &[f32], cut_z: f32, cut_id: u32, keys: &mut Vec<u64>) -> () {
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
    pub(super) fn sum_exp(logits: &[f32], max: f32) -> f64 {
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
