//! A prompt's routed experts on FP8 tensor cores (`--prefill-precision fp8`
//! with block-FP8 experts, sm_90): the plan's rows gathered and quantized per
//! 128 columns (`fp8_quant_rows` through the plan's row index), gate/up by
//! `moe_gemm_wg_q8` (kernels/moe_gemm.cu) over the plan's tiles, SiLU·up in
//! f32 (`silu_mul`), quantized again, down by `moe_gemm_wg_q8`: no bf16
//! copy of anything, one FP8 product per tile. The tile table and the
//! combine are `moe_grouped_device`'s.

use super::ops::FP8_ROWS;
use super::weights::DevMat;
use super::{F, GpuModel, Scratch};
use crate::gpu::kernels::{self, Launch};
use crate::gpu::options::PrefillPrecision;
use crate::gpu::{dptr, i};
use anyhow::Result;

/// Stages and stage bytes of `moe_gemm_wg_q8` (MQ_STAGES, 256 rows of MQ_BK).
const MQ_STAGES: usize = 8;
const MQ_BK: usize = 64;

/// Activations quantized per row and 128 columns (`q8_rows`): E4M3 bytes
/// [stride, cols] and f32 scales [cols / 128, stride].
pub(super) struct Q8Rows {
    pub bytes: u64,
    pub scales: u64,
    /// The rows padded to `FP8_ROWS` (the scales' column stride).
    pub stride: usize,
}

impl GpuModel {
    /// Whether this pass's experts take the FP8 path: the fp8 prompt mode
    /// where `single_bf16` applies, a warpgroup-MMA device with the FP8
    /// GEMMs, block-FP8 gate/up and down in whole scale blocks, and plan
    /// tiles of at most 128 rows (the kernel's two warpgroups of 64).
    pub(super) fn moe_q8(
        &self,
        sc: &Scratch,
        bm: usize,
        gate_up: &DevMat,
        down: &DevMat,
        e: usize,
    ) -> bool {
        let whole = |m: &DevMat| {
            m.fp8().is_some() && (m.rows / e).is_multiple_of(128) && m.cols.is_multiple_of(128)
        };
        self.opts.prefill == PrefillPrecision::Fp8
            && self.single_bf16(sc)
            && self.dev.wgmma()
            && self.dev.fp8_gemm()
            && (bm == 64 || bm == 128)
            && whole(gate_up)
            && whole(down)
    }

    /// `ye` (f32, rows in plan order) = down(SiLU(gate) · up) of the rows of
    /// `n` the plan lists (`pr`: plan row -> token row), over the plan's tile
    /// table `tiles` (its grid height `most`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn moe_experts_q8(
        &self,
        sc: &mut Scratch,
        (n, pr, nn): (u64, u64, usize),
        (tiles, most): (u64, u32),
        (gate_up, down, e): (&DevMat, &DevMat, usize),
        inter: usize,
        ye: u64,
    ) -> Result<()> {
        let d = &self.dev;
        let h = self.cfg.hidden_size;
        let x = self.q8_rows(sc, "moe_q8_x", n, h, pr, nn, h)?;
        let gu = sc.get(d, "gu", nn * 2 * inter * F)?;
        self.q8_gemm(&x, gate_up, e, (tiles, most), gu)?;
        let act = sc.get(d, "moe_act_f32", nn * inter * F)?;
        // silu_mul's rows are its grid's y: at most 65,535 a launch.
        for r0 in (0..nn).step_by(65_535) {
            let rows = (nn - r0).min(65_535);
            kernels::silu_mul(
                d,
                Launch::pdl(
                    ((inter as u32).div_ceil(256), rows as u32, 1),
                    (256, 1, 1),
                    0,
                ),
                dptr(gu + (r0 * 2 * inter * F) as u64),
                i(2 * inter),
                i(0),
                i(inter),
                dptr(act + (r0 * inter * F) as u64),
                i(inter),
                i(rows),
            )?;
        }
        let a = self.q8_rows(sc, "moe_q8_a", act, inter, 0, nn, inter)?;
        self.q8_gemm(&a, down, e, (tiles, most), ye)
    }

    /// `rows` rows of `cols` f32 at `src` (stride `stride`; through the row
    /// index `idx` unless 0) quantized into the work buffer `name`
    /// (`fp8_quant_rows`; padding rows are zeros).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn q8_rows(
        &self,
        sc: &mut Scratch,
        name: &'static str,
        src: u64,
        stride: usize,
        idx: u64,
        rows: usize,
        cols: usize,
    ) -> Result<Q8Rows> {
        let d = &self.dev;
        let tp = rows.next_multiple_of(FP8_ROWS);
        let groups = tp * (cols / 128);
        let bytes = sc.get(d, name, tp * cols + groups * F)?;
        let scales = bytes + (tp * cols) as u64;
        kernels::fp8_quant_rows(
            d,
            Launch::pdl(((groups as u32).div_ceil(8), 1, 1), (256, 1, 1), 0),
            dptr(src),
            i(stride),
            dptr(idx),
            i(rows),
            i(tp),
            i(cols),
            dptr(bytes),
            dptr(scales),
        )?;
        Ok(Q8Rows {
            bytes,
            scales,
            stride: tp,
        })
    }

    /// One `moe_gemm_wg_q8` launch of the `e` experts stacked in `w` over
    /// the tile table.
    fn q8_gemm(&self, a: &Q8Rows, w: &DevMat, e: usize, tiles: (u64, u32), y: u64) -> Result<()> {
        let (q, s) = w.fp8().expect("moe_q8 checked the experts are block-FP8");
        self.q8_launch(a, (q, s, w.rows / e, w.cols), tiles, y)
    }

    /// `moe_gemm_wg_q8` over experts of `rows` x `cols` E4M3 at `q` (scales
    /// `s`) and the tile table `tiles` (its grid height `most`).
    pub(super) fn q8_launch(
        &self,
        a: &Q8Rows,
        (q, s, rows, cols): (u64, u64, usize, usize),
        (tiles, most): (u64, u32),
        y: u64,
    ) -> Result<()> {
        kernels::moe_gemm_wg_q8(
            &self.dev,
            Launch::new(
                (rows.div_ceil(128) as u32, most, 1),
                (256, 1, 1),
                (MQ_STAGES * 256 * MQ_BK) as u32,
            ),
            dptr(a.bytes),
            dptr(a.scales),
            i(a.stride),
            dptr(q),
            dptr(s),
            dptr(tiles),
            dptr(y),
            i(rows),
            i(cols),
        )
    }
}
