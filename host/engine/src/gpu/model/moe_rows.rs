//! The few-row expert kernel's launch (`kernels/gemm_rows.cu`: `moe_rows8`,
//! bf16 or block-FP8 weights) for a batched step's or a short prompt's
//! routed experts over the plan's 8-row tiles.

use crate::gpu::kernels::{self, Launch};
use crate::gpu::{Device, dptr, i};
use anyhow::Result;

/// A layer's experts as the few-row kernels read them: block-FP8 bytes and
/// scales as stored, or bf16 with `stride` elements between experts.
pub(super) enum RowsWeights {
    Fp8 { q: u64, s: u64 },
    Bf16 { w: u64, stride: i64 },
}

/// Y (f32, `n` columns, rows in plan order) = the activations `(hi, lo)`
/// (bf16 halves in plan order) times each tile's expert (`n` x `k`), over
/// `most` tiles of the table at `tiles`.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch(
    d: &Device,
    (hi, lo): (u64, u64),
    w: RowsWeights,
    tiles: u64,
    most: u32,
    y: u64,
    n: usize,
    k: usize,
) -> Result<()> {
    let l = Launch::pdl((n.div_ceil(32).div_ceil(4) as u32, most, 1), (128, 1, 1), 0);
    let (t, y, n, k) = (dptr(tiles), dptr(y), i(n), i(k));
    let (hi, lo) = (dptr(hi), dptr(lo));
    match w {
        RowsWeights::Fp8 { q, s } => {
            kernels::moe_rows8_fp8(d, l, hi, lo, dptr(q), dptr(s), t, y, n, k)
        }
        RowsWeights::Bf16 { w, stride } => {
            kernels::moe_rows8(d, l, hi, lo, dptr(w), stride, t, y, n, k)
        }
    }
}
