//! The few-row expert kernels' launch (`kernels/gemm_rows.cu`: `moe_rows8`
//! and its folded forms, bf16 or block-FP8 weights) for a batched step's or
//! a short prompt's routed experts over the plan's 8-row tiles.

use crate::gpu::kernels::{self, Launch};
use crate::gpu::{Device, dptr, i};
use anyhow::Result;

/// What an expert projection reads as its activations (device addresses):
/// rows already split into bf16 hi and lo in plan order (lo 0: hi alone),
/// or, on the few-row kernel only (`QWASI_MOE_FOLD`), the f32 token rows
/// `src` with each plan row's token in `rows` (`moe_rows8_gather`), or the
/// gate/up output whose SiLU it takes (`moe_rows8_silu`).
pub(super) enum ExpertAct {
    Split(u64, u64),
    Gather { src: u64, rows: u64 },
    Silu(u64),
}

/// A layer's experts as the few-row kernels read them: block-FP8 bytes and
/// scales as stored, or bf16 with `stride` elements between experts.
pub(super) enum RowsWeights {
    Fp8 { q: u64, s: u64 },
    Bf16 { w: u64, stride: i64 },
}

/// Y (f32, `n` columns, rows in plan order) = the activations times each
/// tile's expert (`n` x `k`), over `most` tiles of the table at `tiles`.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch(
    d: &Device,
    act: ExpertAct,
    w: RowsWeights,
    tiles: u64,
    most: u32,
    y: u64,
    n: usize,
    k: usize,
) -> Result<()> {
    let l = Launch::pdl((n.div_ceil(32).div_ceil(4) as u32, most, 1), (128, 1, 1), 0);
    let (t, y, n, k) = (dptr(tiles), dptr(y), i(n), i(k));
    match (act, w) {
        (ExpertAct::Split(hi, lo), RowsWeights::Fp8 { q, s }) => {
            kernels::moe_rows8_fp8(d, l, dptr(hi), dptr(lo), dptr(q), dptr(s), t, y, n, k)
        }
        (ExpertAct::Split(hi, lo), RowsWeights::Bf16 { w, stride }) => {
            kernels::moe_rows8(d, l, dptr(hi), dptr(lo), dptr(w), stride, t, y, n, k)
        }
        (ExpertAct::Gather { src, rows }, RowsWeights::Fp8 { q, s }) => {
            kernels::moe_rows8_gather_fp8(d, l, dptr(src), dptr(rows), dptr(q), dptr(s), t, y, n, k)
        }
        (ExpertAct::Gather { src, rows }, RowsWeights::Bf16 { w, stride }) => {
            kernels::moe_rows8_gather(d, l, dptr(src), dptr(rows), dptr(w), stride, t, y, n, k)
        }
        (ExpertAct::Silu(gu), RowsWeights::Fp8 { q, s }) => {
            kernels::moe_rows8_silu_fp8(d, l, dptr(gu), dptr(q), dptr(s), t, y, n, k)
        }
        (ExpertAct::Silu(gu), RowsWeights::Bf16 { w, stride }) => {
            kernels::moe_rows8_silu(d, l, dptr(gu), dptr(w), stride, t, y, n, k)
        }
    }
}
