//! `--prefill-precision fp8`'s projection checked where its result is
//! defined: on seeded operands, the device's E4M3 activations and scales
//! must be exactly the host's (scale = amax / 448, each byte the E4M3 value
//! nearest x / scale, found by search over the codes), and its output the
//! f64 product of the quantized operands, widened as stored, within
//! [`FP8_GEMM_TOL`]. Shapes cover padded and whole row counts, several scale
//! blocks both ways and the accumulating form. The fp8 mode's grouped expert
//! kernel (`moe_gemm_wg_q8`) is held to the same bound on seeded tile
//! tables. Runs where the device has the block-scaled FP8 GEMMs (sm_90).

use super::model::GpuModel;
use crate::demo::Rng;
use crate::fp8::e4m3_to_f32;
use anyhow::Result;
use serde::Serialize;

/// Largest |y - f64 reference| over the largest |reference|. The operands
/// are the same; what separates them is the tensor cores' accumulation of
/// FP8 products (cuBLASLt promotes to f32 per 128-deep block; within one it
/// keeps fewer bits than f32: 2e-4 measured through torch on the H100 at
/// K = 512-4096). A misplaced scale or tile is off by O(1).
pub const FP8_GEMM_TOL: f64 = 2e-3;

/// (tokens, rows, columns, accumulate): row counts that are a multiple of 16
/// (straight into y) and not (padded, through a work buffer), with and
/// without `+=`, columns of 4 to 32 scale blocks (the path takes multiples of
/// 4: `ops.rs` `fp8_activations`).
const SHAPES: [(usize, usize, usize, bool); 6] = [
    (37, 384, 512, false),
    (48, 256, 1024, false),
    (300, 384, 2048, false),
    (64, 1024, 512, true),
    (17, 256, 4096, true),
    (2, 128, 512, true),
];

#[derive(Serialize, Clone, Debug)]
pub struct Fp8GemmReport {
    /// Activation bytes and scales that differ from the host's quantization.
    pub code_mismatches: usize,
    pub scale_mismatches: usize,
    /// Largest relative output error over the shapes.
    pub max_rel_err: f64,
    pub shapes: usize,
    /// The grouped expert kernel of the fp8 mode (`moe_gemm_wg_q8`) on the
    /// same footing: largest relative error, outputs written past its tiles.
    pub expert_max_rel_err: f64,
    pub expert_stray_writes: usize,
    /// Each shape's error, projections and expert cases.
    pub per_shape: Vec<String>,
    pub pass: bool,
}

/// The E4M3 byte nearest to v (ties to the even code, past 448 to 448), by
/// search over the finite codes.
fn nearest_e4m3(v: f32) -> u8 {
    let a = v.abs() as f64;
    let mut best = 0u8;
    for c in 1..0x7fu8 {
        let (d, db) = (
            (e4m3_to_f32(c) as f64 - a).abs(),
            (e4m3_to_f32(best) as f64 - a).abs(),
        );
        if d < db || (d == db && c & 1 == 0) {
            best = c;
        }
    }
    best | if v.is_sign_negative() { 0x80 } else { 0 }
}

/// `None` where the device has no block-scaled FP8 GEMMs.
pub fn fp8_gemm_check(model: &GpuModel) -> Result<Option<Fp8GemmReport>> {
    if !model.fp8_gemm_available() {
        return Ok(None);
    }
    let mut rng = Rng(0x5157_4153_4938);
    let mut r = Fp8GemmReport {
        code_mismatches: 0,
        scale_mismatches: 0,
        max_rel_err: 0.0,
        shapes: SHAPES.len(),
        per_shape: Vec::new(),
        expert_max_rel_err: 0.0,
        expert_stray_writes: 0,
        pass: false,
    };
    for (t, rows, cols, acc) in SHAPES {
        // Magnitudes spread over groups (one all zero) so codes include
        // subnormals and the group maxima map to 448.
        let mut x: Vec<f32> = (0..t * cols)
            .map(|i| rng.uniform() * 2f32.powi((i / 128 % 9) as i32 - 4))
            .collect();
        x[..128].fill(0.0);
        // Any code but NaN.
        let wq: Vec<u8> = (0..rows * cols)
            .map(|_| rng.next() as u8)
            .map(|b| if b & 0x7f == 0x7f { b & 0xfe } else { b })
            .collect();
        let (rb, cb) = (rows / 128, cols / 128);
        let ws: Vec<f32> = (0..rb * cb).map(|_| 1e-3 * (1.5 + rng.uniform())).collect();
        let y0: Option<Vec<f32>> = acc.then(|| (0..t * rows).map(|_| rng.uniform()).collect());
        let got = model.fp8_gemm_run(&x, t, (&wq, &ws), rows, cols, y0.as_deref())?;
        // The host's quantization of x.
        let mut xq = vec![0f64; t * cols];
        for row in 0..t {
            for g in 0..cb {
                let at = row * cols + g * 128;
                let amax = x[at..at + 128].iter().fold(0f32, |m, v| m.max(v.abs()));
                let s = amax.max(1e-30) / 448.0;
                if got.xs[g * t + row] != s {
                    r.scale_mismatches += 1;
                }
                for c in at..at + 128 {
                    let q = nearest_e4m3(x[c] / s);
                    r.code_mismatches += (got.xq[c] != q) as usize;
                    xq[c] = e4m3_to_f32(q) as f64 * s as f64;
                }
            }
        }
        let w = |n: usize, c: usize| {
            e4m3_to_f32(wq[n * cols + c]) as f64 * ws[(n / 128) * cb + c / 128] as f64
        };
        let (mut err, mut big) = (0f64, 0f64);
        for row in 0..t {
            for n in 0..rows {
                let dot: f64 = (0..cols).map(|c| xq[row * cols + c] * w(n, c)).sum();
                let base = y0.as_ref().map_or(0.0, |v| v[row * rows + n] as f64);
                err = err.max((got.y[row * rows + n] as f64 - base - dot).abs());
                big = big.max(dot.abs());
            }
        }
        let rel = err / big.max(f64::MIN_POSITIVE);
        let plus = if acc { " +=" } else { "" };
        r.per_shape
            .push(format!("{t}x{rows}x{cols}{plus}: {rel:.2e}"));
        r.max_rel_err = r.max_rel_err.max(rel);
    }
    for (counts, n, k) in EXPERT_CASES {
        let (err, stray) = expert_case(model, &mut rng, counts, n, k)?;
        r.per_shape.push(format!(
            "experts {counts:?} x {n}x{k} (moe_gemm_wg_q8): {err:.2e}, {stray} writes outside the tiles"
        ));
        r.expert_max_rel_err = r.expert_max_rel_err.max(err);
        r.expert_stray_writes += stray;
    }
    r.pass = r.code_mismatches == 0
        && r.scale_mismatches == 0
        && r.max_rel_err <= FP8_GEMM_TOL
        && r.expert_max_rel_err <= FP8_GEMM_TOL
        && r.expert_stray_writes == 0;
    Ok(Some(r))
}

/// The grouped expert kernel's cases: rows per expert (tiles of 1 to 128
/// rows, an empty expert), rows and columns of an expert.
const EXPERT_CASES: [(&[usize], usize, usize); 2] =
    [(&[37, 0, 128, 65], 256, 512), (&[1, 64, 130], 128, 2048)];

/// One `moe_gemm_wg_q8` run on seeded E4M3 operands and its tile table
/// against the f64 sum over scale blocks of the scaled products: (largest
/// error over the largest |reference|, outputs written outside the tiles).
fn expert_case(
    model: &GpuModel,
    rng: &mut Rng,
    counts: &[usize],
    n: usize,
    k: usize,
) -> Result<(f64, usize)> {
    let (e, kb, r) = (counts.len(), k / 128, counts.iter().sum::<usize>());
    let stride = r.next_multiple_of(16);
    let mut code = || {
        let b = rng.next() as u8;
        if b & 0x7f == 0x7f { b & 0xfe } else { b }
    };
    let aq: Vec<u8> = (0..r * k).map(|_| code()).collect();
    let q: Vec<u8> = (0..e * n * k).map(|_| code()).collect();
    let ascale: Vec<f32> = (0..kb * stride)
        .map(|_| 1e-2 * (1.5 + rng.uniform()))
        .collect();
    let s: Vec<f32> = (0..e * (n / 128) * kb)
        .map(|_| 1e-3 * (1.5 + rng.uniform()))
        .collect();
    // moe_plan_tiles' table over 128-row tiles.
    let mut tiles = vec![0i32];
    let mut start = 0;
    for (ex, &c) in counts.iter().enumerate() {
        for r0 in (0..c).step_by(128) {
            tiles.extend([ex, start + r0, (c - r0).min(128)].map(|v| v as i32));
        }
        start += c;
    }
    tiles[0] = (tiles.len() as i32 - 1) / 3;
    // Three rows past the tiles' stay NaN unless the kernel strays.
    let y = model.fp8_expert_run((&aq, &ascale, stride), (&q, &s), &tiles, (r + 3, n, k))?;
    let stray = y[r * n..].iter().filter(|v| !v.is_nan()).count();
    let (mut err, mut big, mut start) = (0f64, 0f64, 0);
    for (ex, &c) in counts.iter().enumerate() {
        for row in start..start + c {
            for col in 0..n {
                let mut want = 0f64;
                for b in 0..kb {
                    let dot: f64 = (128 * b..128 * b + 128)
                        .map(|i| {
                            e4m3_to_f32(aq[row * k + i]) as f64
                                * e4m3_to_f32(q[(ex * n + col) * k + i]) as f64
                        })
                        .sum();
                    let f = ascale[b * stride + row] as f64
                        * s[(ex * (n / 128) + col / 128) * kb + b] as f64;
                    want += dot * f;
                }
                err = err.max((y[row * n + col] as f64 - want).abs());
                big = big.max(want.abs());
            }
        }
        start += c;
    }
    // Every row before them belongs to a tile, so a NaN there (a missed
    // tile) fails through the error.
    let missed = y[..r * n].iter().filter(|v| v.is_nan()).count();
    Ok((if missed > 0 { f64::INFINITY } else { err / big }, stray))
}
