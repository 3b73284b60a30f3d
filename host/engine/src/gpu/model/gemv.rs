//! The decode step's GEMVs: row-per-warp kernels (`dec_norm_gemv`,
//! `dec_gemv`, `dec_gemv_rows`) and, where the GPU has bulk copies, the
//! bulk-copy ring kernels (`kernels/gemv_bulk.cu`), with the RMSNorm as a
//! prologue (from the previous kernel's sums of squares) or the residual add
//! as an epilogue.

use super::pass::Decode;
use super::weights::{DevMat, MatWeights};
use super::{B, Device, F, GpuModel};
use crate::gpu::kernels::{self, Kernel, Launch};
use crate::gpu::options::{BULK_MAX_STAGES, GemvPath, GpuOptions};
use crate::gpu::{dptr, i};
use anyhow::Result;

/// Columns one decode GEMV warp loads at once (`CH * WARP * 8` in kernels/decode_stream.h).
const GEMV_CHUNK: usize = 2048;

/// The bulk-copy decode GEMVs' launch shape: ring slots of 32 KB per block
/// (`QWASI_BULK_STAGES`, default 4) and blocks per SM (`QWASI_BULK_BLOCKS`,
/// default 1). On the H200 (8K decode, tok/s): 2 slots 269.8, 3: 282.3,
/// 4: 294.9, 5: 293.0, 6: 285.4, 7: 276.8; 2 blocks of 3 slots 291.9.
#[derive(Clone, Copy, Debug)]
pub(super) struct BulkGemv {
    stages: usize,
    blocks_per_sm: usize,
}

/// One `dec_gemv_bulk*` launch.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct BulkPlan {
    pub kernel: Kernel,
    pub grid: usize,
    pub smem: usize,
    pub stages: usize,
}
impl BulkGemv {
    /// The bulk GEMVs where the device has bulk copies and `QWASI_GEMV` keeps them.
    pub(super) fn new(dev: &Device, opts: &GpuOptions) -> Option<Self> {
        if !dev.bulk_copies() || opts.gemv != GemvPath::Bulk {
            return None;
        }
        Some(BulkGemv {
            stages: opts.bulk_stages,
            blocks_per_sm: opts.bulk_blocks,
        })
    }

    /// The launch for a `rows` x `cols` matrix `w`, or `None` where the
    /// kernels do not apply (columns not a multiple of 8 or over 4,096,
    /// weights not 16-byte aligned, FP8 rows or columns not whole 128
    /// blocks, not one slot of shared memory). A residual GEMV writes a
    /// partial sum of squares per block into `out_blocks` entries, so it has
    /// at most that many blocks. FP8 slots hold half the bytes of bf16
    /// ones, so they get twice as many (at most 8): the same bytes in flight.
    pub(super) fn plan(
        &self,
        w: MatWeights,
        rows: usize,
        cols: usize,
        max_smem: usize,
        sms: u32,
        out_blocks: Option<usize>,
    ) -> Option<BulkPlan> {
        let fp8 = matches!(w, MatWeights::Fp8 { .. });
        if !cols.is_multiple_of(8)
            || cols > 2 * GEMV_CHUNK
            || !w.ptr().is_multiple_of(16)
            || rows == 0
            || (fp8 && !(rows.is_multiple_of(128) && cols.is_multiple_of(128)))
        {
            return None;
        }
        let (kernel, slot_rows) = match (cols <= GEMV_CHUNK, fp8) {
            (true, false) => (Kernel::dec_gemv_bulk1, 8),
            (false, false) => (Kernel::dec_gemv_bulk2, 4),
            (true, true) => (Kernel::dec_gemv_bulk1_fp8, 8),
            (false, true) => (Kernel::dec_gemv_bulk2_fp8, 4),
        };
        let (slot, max_stages) = if fp8 {
            (slot_rows * cols, (2 * self.stages).min(BULK_MAX_STAGES))
        } else {
            (slot_rows * cols * B, self.stages)
        };
        let stages = max_stages.min(max_smem / slot);
        if stages == 0 {
            return None;
        }
        let grid = rows
            .div_ceil(slot_rows)
            .min(sms as usize * self.blocks_per_sm)
            .min(out_blocks.unwrap_or(usize::MAX));
        Some(BulkPlan {
            kernel,
            grid,
            smem: stages * slot,
            stages,
        })
    }

    /// The launch of `dec_gemv_bulk_conv` or `dec_gemv_bulk_conv_fp8` (the
    /// GDN in projection with the conv of its first rows, `k` taps): the
    /// plain plan's ring (8 rows per slot only, at most 2,048 columns) plus, after it, the most rows a
    /// block takes with their `k` weights, `k - 1` history and projected
    /// value; `None` where that does not fit.
    pub(super) fn plan_conv(
        &self,
        w: MatWeights,
        rows: usize,
        cols: usize,
        max_smem: usize,
        sms: u32,
        k: usize,
    ) -> Option<BulkPlan> {
        let plan = self.plan(w, rows, cols, max_smem, sms, None)?;
        let kernel = match plan.kernel {
            Kernel::dec_gemv_bulk1 => Kernel::dec_gemv_bulk_conv,
            Kernel::dec_gemv_bulk1_fp8 => Kernel::dec_gemv_bulk_conv_fp8,
            _ => return None,
        };
        if k == 0 {
            return None;
        }
        // Block b takes slots [S b / G, S (b + 1) / G): at most ceil(S / G).
        let block_rows = 8 * rows.div_ceil(8).div_ceil(plan.grid);
        let smem = plan.smem + block_rows * 2 * k * F;
        (smem <= max_smem).then_some(BulkPlan {
            kernel,
            smem,
            ..plan
        })
    }
}

impl GpuModel {
    /// Grid of a row-per-warp GEMV: one row per warp, capped at the blocks
    /// that are resident at once (warps then stream several rows each, the
    /// next row's weights in flight while the current one is reduced).
    pub(super) fn gemv_grid(&self, kernel: Kernel, rows: usize, smem: usize) -> u32 {
        let resident = self.dev.occupancy(kernel, 256, smem as u32) * self.dev.sm_count;
        (rows.div_ceil(8) as u32).min(resident).max(1)
    }

    /// `y = W . rmsnorm(x)` for the step's residual row (`rows` outputs, the
    /// norm from the sums of squares the last residual kernel wrote).
    pub(super) fn dec_norm_gemv(
        &self,
        dc: &Decode,
        w: u64,
        rows: usize,
        norm: u64,
        y: u64,
    ) -> Result<()> {
        let (d, ds, h, eps) = (
            &self.dev,
            dc.ds,
            self.cfg.hidden_size,
            self.cfg.rms_norm_eps,
        );
        let (x, ssq, nssq) = (ds.x.ptr(), ds.ssq.ptr(), ds.nssq);
        if self.bulk_gemv(
            MatWeights::Bf16(w),
            x,
            y,
            rows,
            h,
            Some(norm),
            ssq,
            nssq,
            None,
            None,
        )? {
            return Ok(());
        }
        kernels::dec_norm_gemv(
            d,
            Launch::pdl(
                (self.gemv_grid(Kernel::dec_norm_gemv, rows, 0), 1, 1),
                (256, 1, 1),
                0,
            ),
            dptr(w),
            dptr(x),
            dptr(ssq),
            i(nssq),
            dptr(norm),
            eps,
            dptr(y),
            i(rows),
            i(h),
        )
    }

    /// The residual add `y += W x` for one token (x read through L1), 8 rows
    /// per block; each block also writes its rows' sum of squares to `ssq`.
    /// Rows of up to 4 chunks of 2,048 columns go to `dec_gemv_rows` (a warp
    /// per chunk, the whole matrix loaded before the grid wait), longer or
    /// unaligned ones to `dec_gemv` (a warp per row, streaming).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dec_gemv(
        &self,
        w: u64,
        x: u64,
        y: u64,
        rows: usize,
        cols: usize,
        ssq: u64,
        nssq: usize,
    ) -> Result<()> {
        if self.bulk_gemv(
            MatWeights::Bf16(w),
            x,
            y,
            rows,
            cols,
            None,
            ssq,
            nssq,
            None,
            None,
        )? {
            return Ok(());
        }
        let chunks = cols.div_ceil(GEMV_CHUNK);
        let split = cols.is_multiple_of(8) && chunks <= 4 && self.opts.split_gemv();
        (if split {
            kernels::dec_gemv_rows
        } else {
            kernels::dec_gemv
        })(
            &self.dev,
            Launch::pdl(
                (rows.div_ceil(8) as u32, 1, 1),
                (if split { 256 * chunks as u32 } else { 256 }, 1, 1),
                0,
            ),
            dptr(w),
            dptr(x),
            dptr(y),
            i(rows),
            i(cols),
            i(1),
            dptr(ssq),
        )
    }

    /// [`GpuModel::dec_norm_gemv`] of a device matrix: block-FP8 matrices
    /// take `dec_gemv_bulk*_fp8` where the bulk GEMVs apply, else
    /// `dec_norm_gemv_fp8` (E4M3 bytes read, kernels/decode.cu).
    pub(super) fn dec_norm_gemv_mat(
        &self,
        dc: &Decode,
        w: &DevMat,
        norm: u64,
        y: u64,
    ) -> Result<()> {
        let Some((q, s)) = w.fp8() else {
            return self.dec_norm_gemv(dc, w.buf.ptr(), w.rows, norm, y);
        };
        let (ds, h, eps) = (dc.ds, self.cfg.hidden_size, self.cfg.rms_norm_eps);
        assert_eq!(w.cols, h);
        let (x, ssq, nssq) = (ds.x.ptr(), ds.ssq.ptr(), ds.nssq);
        if self.bulk_gemv(
            w.weights(),
            x,
            y,
            w.rows,
            h,
            Some(norm),
            ssq,
            nssq,
            None,
            None,
        )? {
            return Ok(());
        }
        kernels::dec_norm_gemv_fp8(
            &self.dev,
            Launch::pdl(
                (self.gemv_grid(Kernel::dec_norm_gemv_fp8, w.rows, 0), 1, 1),
                (256, 1, 1),
                0,
            ),
            dptr(q),
            dptr(s),
            dptr(ds.x.ptr()),
            dptr(ds.ssq.ptr()),
            i(ds.nssq),
            dptr(norm),
            eps,
            dptr(y),
            i(w.rows),
            i(h),
        )
    }

    /// [`GpuModel::dec_gemv`] of a device matrix (`y += W x`): block-FP8
    /// matrices take `dec_gemv_bulk*_fp8` where the bulk GEMVs apply, else
    /// `dec_gemv_fp8`.
    pub(super) fn dec_gemv_mat(
        &self,
        w: &DevMat,
        x: u64,
        y: u64,
        ssq: u64,
        nssq: usize,
    ) -> Result<()> {
        let Some((q, s)) = w.fp8() else {
            return self.dec_gemv(w.buf.ptr(), x, y, w.rows, w.cols, ssq, nssq);
        };
        if self.bulk_gemv(
            w.weights(),
            x,
            y,
            w.rows,
            w.cols,
            None,
            ssq,
            nssq,
            None,
            None,
        )? {
            return Ok(());
        }
        kernels::dec_gemv_fp8(
            &self.dev,
            Launch::pdl((w.rows.div_ceil(8) as u32, 1, 1), (256, 1, 1), 0),
            dptr(q),
            dptr(s),
            dptr(x),
            dptr(y),
            i(w.rows),
            i(w.cols),
            i(1),
            dptr(ssq),
        )
    }

    /// `W . x` by `dec_gemv_bulk*` (weights through a bulk-copy ring) where
    /// the GPU has bulk copies and the matrix fits the kernel (16-byte aligned,
    /// columns a multiple of 8 and at most 4,096); `Ok(false)` otherwise.
    /// With `norm` (the RMSNorm weight): `y = W . rmsnorm(x)` from the `nssq`
    /// partial sums of squares at `ssq`. Without: `y += W . x`, and the new
    /// partial sums of `y` to `ssq` (`nssq` entries, zeros past the grid).
    /// With `conv` (the GDN in projection, norm mode: the conv's weights,
    /// history, taps and channels): `dec_gemv_bulk_conv`, the first
    /// `conv_dim` rows then convolved and SiLU'd as `dec_gdn_conv` does
    /// (`Ok(false)` also where its staging does not fit, see `plan_conv`).
    /// With `tail` (norm mode, block-FP8 `w` of at most 2,048 columns: the
    /// address and count of bf16 rows of the same columns), `y` also gets
    /// the tail rows' products after the matrix's `rows`, in the same launch
    /// (`Ok(false)` for other weights or widths).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn bulk_gemv(
        &self,
        w: MatWeights,
        x: u64,
        y: u64,
        rows: usize,
        cols: usize,
        norm: Option<u64>,
        ssq: u64,
        nssq: usize,
        conv: Option<(u64, u64, usize, usize)>,
        tail: Option<(u64, usize)>,
    ) -> Result<bool> {
        let Some(b) = self.bulk_gemv else {
            return Ok(false);
        };
        let d = &self.dev;
        let smem = d.max_shared_per_block();
        let plan = match conv {
            Some((_, _, k, _)) => {
                debug_assert!(norm.is_some(), "the conv fold is the norm mode's");
                b.plan_conv(w, rows, cols, smem, d.sm_count, k)
            }
            None => {
                let out_blocks = if norm.is_some() { None } else { Some(nssq) };
                b.plan(w, rows, cols, smem, d.sm_count, out_blocks)
            }
        };
        let Some(plan) = plan else {
            return Ok(false);
        };
        let tail_kernels = [Kernel::dec_gemv_bulk1_fp8, Kernel::dec_gemv_bulk_conv_fp8];
        if tail.is_some() && (norm.is_none() || !tail_kernels.contains(&plan.kernel)) {
            return Ok(false);
        }
        let (tail_w, tail_rows) = tail.unwrap_or((0, 0));
        let (tail_w, tail_rows) = (dptr(tail_w), i(tail_rows));
        let (in_ssq, nw, accumulate, ssq_out) = match norm {
            Some(nw) => (ssq, nw, 0, 0),
            None => (0, 0, 1, ssq),
        };
        let l = Launch::pdl((plan.grid as u32, 1, 1), (256, 1, 1), plan.smem as u32);
        let (x, in_ssq, nw, y, ssq_out) = (dptr(x), dptr(in_ssq), dptr(nw), dptr(y), dptr(ssq_out));
        let eps = self.cfg.rms_norm_eps;
        let (nssq, rows, cols, acc, st) =
            (i(nssq), i(rows), i(cols), i(accumulate), i(plan.stages));
        match (conv, w) {
            (Some((conv_w, hist, k, conv_dim)), MatWeights::Bf16(w))
                if plan.kernel == Kernel::dec_gemv_bulk_conv =>
            {
                kernels::dec_gemv_bulk_conv(
                    d,
                    l,
                    dptr(w),
                    x,
                    in_ssq,
                    nssq,
                    nw,
                    eps,
                    y,
                    rows,
                    cols,
                    acc,
                    ssq_out,
                    st,
                    dptr(conv_w),
                    dptr(hist),
                    i(k),
                    i(conv_dim),
                )?;
            }
            (None, MatWeights::Bf16(w)) => {
                let kernel = if plan.kernel == Kernel::dec_gemv_bulk2 {
                    kernels::dec_gemv_bulk2
                } else {
                    kernels::dec_gemv_bulk1
                };
                let w = dptr(w);
                kernel(
                    d, l, w, x, in_ssq, nssq, nw, eps, y, rows, cols, acc, ssq_out, st,
                )?;
            }
            (Some((conv_w, hist, k, conv_dim)), MatWeights::Fp8 { q, s })
                if plan.kernel == Kernel::dec_gemv_bulk_conv_fp8 =>
            {
                kernels::dec_gemv_bulk_conv_fp8(
                    d,
                    l,
                    dptr(q),
                    dptr(s),
                    x,
                    in_ssq,
                    nssq,
                    nw,
                    eps,
                    y,
                    rows,
                    cols,
                    acc,
                    ssq_out,
                    st,
                    dptr(conv_w),
                    dptr(hist),
                    i(k),
                    i(conv_dim),
                    tail_w,
                    tail_rows,
                )?;
            }
            (None, MatWeights::Fp8 { q, s }) => {
                let (q, s) = (dptr(q), dptr(s));
                if plan.kernel == Kernel::dec_gemv_bulk2_fp8 {
                    kernels::dec_gemv_bulk2_fp8(
                        d, l, q, s, x, in_ssq, nssq, nw, eps, y, rows, cols, acc, ssq_out, st,
                    )?;
                } else {
                    kernels::dec_gemv_bulk1_fp8(
                        d, l, q, s, x, in_ssq, nssq, nw, eps, y, rows, cols, acc, ssq_out, st,
                        tail_w, tail_rows,
                    )?;
                }
            }
            _ => unreachable!("plan_conv plans the conv kernel exactly when there is a conv"),
        }
        Ok(true)
    }
}

const _: () = assert!(B == 2);

#[cfg(test)]
mod tests {
    use super::*;

    const BF16: MatWeights = MatWeights::Bf16(0);
    const FP8: MatWeights = MatWeights::Fp8 { q: 0, s: 0 };

    /// The H200's opt-in shared memory per block.
    const H200_SMEM: usize = 232_448;

    #[test]
    fn bulk_gemv_launches() {
        let b = BulkGemv {
            stages: 4,
            blocks_per_sm: 1,
        };
        // GDN in_proj of the 35B model: 12,352 rows of 2,048 columns, 132 SMs.
        assert_eq!(
            b.plan(BF16, 12_352, 2048, H200_SMEM, 132, None),
            Some(BulkPlan {
                kernel: Kernel::dec_gemv_bulk1,
                grid: 132,
                smem: 4 * 32768,
                stages: 4
            })
        );
        // The out projection (4,096 columns): 4-row slots, one block per
        // partial sum of squares at most.
        let out = b.plan(BF16, 2048, 4096, H200_SMEM, 132, Some(256)).unwrap();
        assert_eq!(
            (out.kernel.name(), out.grid, out.smem),
            ("dec_gemv_bulk2", 132, 4 * 32768)
        );
        assert_eq!(
            b.plan(BF16, 2048, 4096, H200_SMEM, 132, Some(8))
                .unwrap()
                .grid,
            8
        );
        // A small model: fewer slots than SMs; slots shrink with the row.
        let small = b.plan(BF16, 100, 64, H200_SMEM, 132, None).unwrap();
        assert_eq!((small.grid, small.smem), (13, 4 * 8 * 64 * 2));
        // Less shared memory: fewer slots; none fits: the other kernels.
        assert_eq!(b.plan(BF16, 64, 2048, 70_000, 132, None).unwrap().stages, 2);
        assert_eq!(b.plan(BF16, 64, 2048, 30_000, 132, None), None);
        // Unaligned rows or weights, or rows too long.
        assert_eq!(b.plan(BF16, 64, 100, H200_SMEM, 132, None), None);
        assert_eq!(
            b.plan(MatWeights::Bf16(8), 64, 2048, H200_SMEM, 132, None),
            None
        );
        assert_eq!(b.plan(BF16, 64, 4104, H200_SMEM, 132, None), None);
    }

    #[test]
    fn fp8_bulk_gemv_launches() {
        let b = BulkGemv {
            stages: 4,
            blocks_per_sm: 1,
        };
        // The 35B GDN out projection as FP8: 4-row slots of 4,096 bytes,
        // twice the bf16 slots: the same 128 KB in flight.
        let out = b.plan(FP8, 2048, 4096, H200_SMEM, 132, Some(256)).unwrap();
        assert_eq!(
            (out.kernel.name(), out.grid, out.smem, out.stages),
            ("dec_gemv_bulk2_fp8", 132, 8 * 16384, 8)
        );
        let qkv = b.plan(FP8, 9216, 2048, H200_SMEM, 132, None).unwrap();
        assert_eq!((qkv.kernel.name(), qkv.stages), ("dec_gemv_bulk1_fp8", 8));
        // Less shared memory: fewer slots.
        assert_eq!(b.plan(FP8, 128, 2048, 70_000, 132, None).unwrap().stages, 4);
        // Not whole 128 x 128 blocks: the streaming FP8 GEMVs.
        assert_eq!(b.plan(FP8, 100, 2048, H200_SMEM, 132, None), None);
        assert_eq!(b.plan(FP8, 128, 2000, H200_SMEM, 132, None), None);
        // The FP8 in projection (qkv | z of the 35B model) with its conv:
        // the FP8 ring (8 slots of 16 KB) plus 12 slots' rows of conv staging.
        let conv = b.plan_conv(FP8, 12_288, 2048, H200_SMEM, 132, 4).unwrap();
        assert_eq!(
            (conv.kernel.name(), conv.grid, conv.smem, conv.stages),
            ("dec_gemv_bulk_conv_fp8", 132, 8 * 16384 + 96 * 8 * 4, 8)
        );
        // Wide rows: no conv kernel.
        assert_eq!(b.plan_conv(FP8, 128, 4096, H200_SMEM, 132, 4), None);
    }

    #[test]
    fn bulk_conv_launches() {
        let b = BulkGemv {
            stages: 4,
            blocks_per_sm: 1,
        };
        // The 35B GDN in projection with a conv of 4: 1,544 slots on 132
        // blocks, at most 12 slots (96 rows) a block, 8 floats a row.
        let p = b.plan_conv(BF16, 12_352, 2048, H200_SMEM, 132, 4).unwrap();
        assert_eq!(
            (p.kernel.name(), p.grid, p.smem, p.stages),
            ("dec_gemv_bulk_conv", 132, 4 * 32768 + 96 * 8 * 4, 4)
        );
        // Every block's rows fit the staging the kernel lays out after the ring.
        for (rows, grid_max, k) in [(12_352, 132, 4), (100, 7, 2), (1000, 3, 4), (9, 132, 3)] {
            let p = b.plan_conv(BF16, rows, 64, H200_SMEM, grid_max, k).unwrap();
            let slots = rows.div_ceil(8);
            for blk in 0..p.grid {
                let n = slots * (blk + 1) / p.grid - slots * blk / p.grid;
                assert!(
                    p.smem >= p.stages * 8 * 64 * 2 + n * 8 * 2 * k * F,
                    "{rows} {blk}"
                );
            }
        }
        // Wide rows (4-row slots), no conv, or no room: the plain GEMV and dec_gdn_conv.
        assert_eq!(b.plan_conv(BF16, 64, 4096, H200_SMEM, 132, 4), None);
        assert_eq!(b.plan_conv(BF16, 64, 2048, H200_SMEM, 132, 0), None);
        assert_eq!(
            b.plan_conv(BF16, 12_352, 2048, 4 * 32768 + 100, 132, 4),
            None
        );
    }
}
