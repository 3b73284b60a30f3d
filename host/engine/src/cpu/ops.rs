//! Elementwise and matrix kernels of the CPU reference backend: f32 math over
//! bf16 weights, parallel over output rows with rayon.

use crate::tensor::Mat;
use half::bf16;
use rayon::prelude::*;

#[inline]
fn bf(x: bf16) -> f32 {
    x.to_f32()
}

/// Dot product of a bf16 row with an f32 vector, 8 independent accumulators so
/// the compiler vectorises it.
#[inline]
pub fn dot_bf16(w: &[bf16], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut acc = [0f32; 8];
    let wc = w.chunks_exact(8);
    let xc = x.chunks_exact(8);
    let (wr, xr) = (wc.remainder(), xc.remainder());
    for (a, b) in wc.zip(xc) {
        for i in 0..8 {
            acc[i] += bf(a[i]) * b[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (a, b) in wr.iter().zip(xr) {
        s += bf(*a) * b;
    }
    s
}

#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let ac = a.chunks_exact(8);
    let bc = b.chunks_exact(8);
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

/// `out[t, r] = sum_c x[t, c] * w[r, c]` for `t < tokens`: `x` is
/// `[tokens, w.cols]`, `out` is `[tokens, w.rows]`. Each weight row is read
/// once for all tokens.
pub fn matmul(x: &[f32], w: &Mat, out: &mut [f32]) {
    let (rows, cols) = (w.rows, w.cols);
    let tokens = x.len() / cols;
    assert_eq!(x.len(), tokens * cols);
    assert_eq!(out.len(), tokens * rows);
    // Enough rows per task to amortise scheduling, few enough to balance.
    let block = (32_768 / cols.max(1)).clamp(1, 256);
    if tokens == 1 {
        out.par_chunks_mut(block).enumerate().for_each(|(b, o)| {
            for (i, y) in o.iter_mut().enumerate() {
                *y = dot_bf16(w.row(b * block + i), x);
            }
        });
        return;
    }
    // Row-major result per weight row ([rows, tokens]), transposed at the end.
    let mut tmp = vec![0f32; rows * tokens];
    tmp.par_chunks_mut(block * tokens)
        .enumerate()
        .for_each(|(b, o)| {
            let mut row = vec![0f32; cols];
            for (i, ot) in o.chunks_mut(tokens).enumerate() {
                for (d, s) in row.iter_mut().zip(w.row(b * block + i)) {
                    *d = bf(*s);
                }
                for (t, y) in ot.iter_mut().enumerate() {
                    *y = dot(&row, &x[t * cols..(t + 1) * cols]);
                }
            }
        });
    for r in 0..rows {
        for t in 0..tokens {
            out[t * rows + r] = tmp[r * tokens + t];
        }
    }
}

/// Allocating form of [`matmul`].
pub fn linear(x: &[f32], w: &Mat) -> Vec<f32> {
    let tokens = x.len() / w.cols;
    let mut out = vec![0f32; tokens * w.rows];
    matmul(x, w, &mut out);
    out
}

/// RMSNorm of each `w.len()`-wide row of `x` in place: `x * rsqrt(mean(x²) + eps) * w`
/// (callers pass `1 + w` for the Qwen `(1 + w)` norms).
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    for row in x.chunks_mut(w.len()) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / w.len() as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for (v, g) in row.iter_mut().zip(w) {
            *v = *v * inv * g;
        }
    }
}

/// `x * rsqrt(sum(x²) + eps)` (the FLA/transformers l2norm).
pub fn l2_norm(x: &mut [f32], eps: f32) {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// torch's softplus (threshold 20: linear above it).
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// In-place softmax.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    x.iter_mut().for_each(|v| *v /= sum);
}

/// `x += y`
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}
