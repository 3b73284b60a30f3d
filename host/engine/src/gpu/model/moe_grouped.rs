//! A prompt's routed experts: every expert's rows grouped and run as GEMMs.
//! With the split GEMM path, the routing plan is built on the device
//! (`moe_plan_*`; for the few-row tiles one `moe_route_plan` with the
//! router) and each matrix (gate/up, down) is one grouped tensor-core
//! launch over the plan's row tiles (`kernels/moe_gemm.cu`, or
//! `kernels/gemm_rows.cu`'s `moe_rows8` for up to 64 tokens); otherwise
//! per-expert GEMMs over rows gathered on a plan copied back to the host.

use super::fp8::Slot;
use super::weights::DevMat;
use super::{B, F, GpuModel, Scratch};
use crate::gpu::kernels::{self, Launch, Typed, sig, typed};
use crate::gpu::options::{MOE_ROUTE_AUTO_MAXT, MoePlanPath};
use crate::gpu::{dptr, i};
use anyhow::{Result, bail};

/// Column tile, k step and pipeline stages of `moe_gemm_split*`
/// (kernels/moe_gemm.cu); its row tile is 64 (`moe_gemm_split`, 128 threads)
/// or 128 (`moe_gemm_split128`, 256 threads). On the H200 at 8K tokens,
/// 128-row tiles were 4% faster than 64, and 3 stages slower than 2 (148
/// against 108 ms of kernel time per prefill, at ecea6ea).
const MG_BN: usize = 128;
const MG_BK: usize = 32;
const MG_STAGES: usize = 2;
/// Stages of `moe_gemm_split128_wg*` (A hi and A lo of 128 rows, B of 128 or
/// 256 rows, MG_BK bf16 each), and without the A lo rows (`--prefill-precision
/// bf16`: `MG_WG_STAGES1`, in kernels/moe_gemm.cu).
const MG_WG_STAGES: usize = 4;
const MG_WG_STAGES1: usize = 8;

/// A grouped expert GEMM kernel (kernels/moe_gemm.cu): on bf16 experts, or
/// on block-FP8 experts as stored (`*_fp8`: the same grid and block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ExpertGemm {
    Bf16(Typed<sig::moe_gemm_split>),
    Fp8(Typed<sig::moe_gemm_split_fp8>),
}

impl ExpertGemm {
    fn name(&self) -> &'static str {
        match self {
            ExpertGemm::Bf16(k) => k.name(),
            ExpertGemm::Fp8(k) => k.name(),
        }
    }
}

/// The grouped expert GEMM kernel for `bm`-row tiles over `k` columns: the
/// kernel, its dynamic shared memory (bytes) and columns per block. The
/// warpgroup-MMA kernels (`wg_cols` 128 or 256, where the device has `wgmma`)
/// take 128-row tiles only, their stages laid out for split or (`single`)
/// hi-only activations; 64-row tiles take k steps of 64
/// (`moe_gemm_split_k64`) where `k64` and `k` allows, else 32. `fp8`: the
/// same kernel on block-FP8 experts, whose stages hold the weights' bytes
/// and which convert each step's tile into one (mma.sync) or one of two
/// (warpgroup) bf16 tiles after them.
fn moe_gemm_kernel(
    bm: usize,
    wgmma: bool,
    wg_cols: usize,
    k64: bool,
    k: usize,
    single: bool,
    fp8: bool,
) -> (ExpertGemm, usize, usize) {
    use ExpertGemm::{Bf16, Fp8};
    // Warpgroup kernels: stages of A rows (hi, lo unless single) and B rows.
    let (stages, a_rows) = if single {
        (MG_WG_STAGES1, 128)
    } else {
        (MG_WG_STAGES, 256)
    };
    let wg_smem = |cols: usize| match fp8 {
        false => stages * (a_rows + cols) * MG_BK * B,
        true => stages * (a_rows * B + cols) * MG_BK + 2 * cols * MG_BK * B,
    };
    // mma.sync kernels: k steps of `bk`, shared rows padded by 8 bf16.
    let mma_smem = |bk: usize| match fp8 {
        false => MG_STAGES * (2 * bm + MG_BN) * (bk + 8) * B,
        true => MG_STAGES * (2 * bm * (bk + 8) * B + MG_BN * bk) + MG_BN * (bk + 8) * B,
    };
    let pick = |bf16, fp8_kernel| if fp8 { Fp8(fp8_kernel) } else { Bf16(bf16) };
    match (bm, if wgmma { wg_cols } else { 0 }) {
        (64, _) if k64 && k.is_multiple_of(64) => (
            pick(typed::moe_gemm_split_k64, typed::moe_gemm_split_k64_fp8),
            mma_smem(64),
            MG_BN,
        ),
        (128, 128) => (
            pick(typed::moe_gemm_split128_wg, typed::moe_gemm_split128_wg_fp8),
            wg_smem(128),
            128,
        ),
        (128, 256) => (
            pick(
                typed::moe_gemm_split128_wg256,
                typed::moe_gemm_split128_wg256_fp8,
            ),
            wg_smem(256),
            256,
        ),
        (128, _) => (
            pick(typed::moe_gemm_split128, typed::moe_gemm_split128_fp8),
            mma_smem(MG_BK),
            MG_BN,
        ),
        _ => (
            pick(typed::moe_gemm_split, typed::moe_gemm_split_fp8),
            mma_smem(MG_BK),
            MG_BN,
        ),
    }
}

/// Row tile of `moe_rows8` (kernels/gemm_rows.cu), the few-row expert kernel
/// (each expert's weights read once per 8 of its rows).
const MOE_ROWS_BM: usize = 8;
/// Most tokens whose experts take `moe_rows8` (its activations are each
/// expert's few rows, so it stays ahead of the 64-row tiles up to here: H200,
/// 64 tokens, 16.1 against 18.2 ms per step).
const MOE_ROWS_MAX: usize = 64;

/// Block size, most tokens and most experts of `moe_route_plan`
/// (`MOE_ROUTE_*` in kernels/moe.cu).
const MOE_ROUTE_THREADS: u32 = 512;
const MOE_ROUTE_MAXT: usize = 64;
const MOE_ROUTE_MAXE: usize = 512;

/// The most block rows the grouped expert GEMM can need for `nn` rows over
/// `e` experts in tiles of `bm`: every full tile, plus a partial one per
/// expert that has rows (at most `min(e, nn)` of them). Its grid is this tall;
/// `moe_plan_tiles` writes how many there are and the rest return at once.
fn moe_max_tiles(nn: usize, e: usize, bm: usize) -> usize {
    nn / bm + e.min(nn)
}

/// A router that picked `n` indices outside the `e` experts.
pub(super) fn router_out_of_range(n: i32, e: usize) -> anyhow::Error {
    anyhow::anyhow!("router produced {n} expert indices outside 0..{e}: non-finite activations?")
}

/// Where `moe_grouped_device` reads and writes: the normed input rows `n`,
/// the residual `x`, the router's indices and weights, and this layer's
/// out-of-range count `bad`.
pub(super) struct MoeIo {
    pub n: u64,
    pub x: u64,
    pub idx: u64,
    pub wts: u64,
    /// The router logits and their row stride where the plan kernel routes
    /// too (`moe_route_fused`: it writes `idx` and `wts`); `None` when they
    /// are written already.
    pub router: Option<(u64, usize)>,
    pub bad: u64,
    /// The shared expert's output rows, its gate logits and their row
    /// stride, added to `x` with the routed experts.
    pub shared: (u64, u64, usize),
    /// The next block's input norm, written to `n` after the adds.
    pub next: Option<u64>,
}

/// The prefill experts' row tiles: on the device (`moe_plan_tiles`' table,
/// `most` block rows launched), or the per-expert counts on the host for the
/// per-expert cuBLAS path.
enum MoePlan {
    Tiles { buf: u64, most: u32, bm: usize },
    Counts(Vec<i32>),
}

impl GpuModel {
    /// The row tile of the grouped expert kernels for `t` tokens' `t * k`
    /// rows, `None` where they do not fit the shapes (per-expert cuBLAS
    /// calls): 8 rows for the few-row kernel (batched decode, short
    /// prompts); else 128-row tiles once experts average that many rows,
    /// were every expert busy (the counts stay on the device), else 64.
    fn moe_tile_rows(&self, n: u64, t: usize, e: usize, k: usize, inter: usize) -> Option<usize> {
        let (h, nn) = (self.cfg.hidden_size, t * k);
        if !(self.opts.grouped_moe && h.is_multiple_of(MG_BK) && inter.is_multiple_of(MG_BK)) {
            return None;
        }
        Some(if self.rows_kernel_fits(n, t, h, MOE_ROWS_MAX) {
            MOE_ROWS_BM
        } else if nn / e.min(nn) >= 128 {
            128
        } else {
            64
        })
    }

    /// Whether `moe_grouped_device` routes too, in one kernel with the plan
    /// (`moe_route_plan`, for the few-row tiles within its limits); the
    /// caller then leaves the router out and passes `MoeIo::router`.
    pub(super) fn moe_route_fused(
        &self,
        n: u64,
        t: usize,
        e: usize,
        k: usize,
        inter: usize,
    ) -> bool {
        let wanted = match self.opts.moe_plan {
            MoePlanPath::Kernels => false,
            MoePlanPath::Fused => true,
            MoePlanPath::Auto => t <= MOE_ROUTE_AUTO_MAXT,
        };
        wanted
            && t <= MOE_ROUTE_MAXT
            && e <= MOE_ROUTE_MAXE
            && self.moe_tile_rows(n, t, e, k, inter) == Some(MOE_ROWS_BM)
    }

    /// Prefill experts with the plan built on the device (`moe_plan_*`: entries
    /// sorted by expert, tokens ascending within one): one gather + hi/lo split of
    /// all `t * k` rows (only hi is read where [`GpuModel::single_bf16`] and
    /// the tiles are not the few-row kernel's: one product per tile or expert),
    /// the grouped split GEMMs over `moe_plan_tiles`' tile
    /// table (nothing comes back to the host: the grid is the most tiles the
    /// plan can need, and the out-of-range count lands in `io.bad`), one
    /// SiLU*up + split, and `moe_combine` adding each token's `k` outputs in
    /// ascending expert order (as `moe_grouped`'s per-expert scatter-adds do);
    /// with FP8 activations and experts (`moe_q8`), `moe_experts_q8` instead.
    /// Where the grouped kernels do not fit the shapes, per-expert cuBLAS
    /// calls on the counts copied back. With `io.router` (`moe_route_fused`),
    /// one `moe_route_plan` routes and plans instead of the four launches.
    /// Needs `GemmPath::CublasSplit`. `Ok(true)` when the plan stayed on the
    /// device (`io.bad` written).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn moe_grouped_device(
        &self,
        sc: &mut Scratch,
        t: usize,
        e: usize,
        k: usize,
        inter: usize,
        io: MoeIo,
        gate_up: &DevMat,
        down: &DevMat,
    ) -> Result<bool> {
        let d = &self.dev;
        let h = self.cfg.hidden_size;
        let MoeIo {
            n,
            x,
            idx,
            wts,
            router,
            bad,
            shared,
            next,
        } = io;
        let nn = t * k;
        let counts = sc.get(d, "plan_counts", (e + 1) * 4)?;
        let pr = sc.get(d, "plan_rows", nn * 4)?;
        let slot = sc.get(d, "plan_slot", nn * 4)?;
        let tiles = match self.moe_tile_rows(n, t, e, k, inter) {
            Some(bm) => {
                let most = moe_max_tiles(nn, e, bm);
                if most > 65_535 {
                    bail!("{most} expert row tiles exceed the grid's 65,535");
                }
                let buf = sc.get(d, "moe_tiles", (1 + 3 * most) * 4)?;
                Some((buf, most, bm))
            }
            None => None,
        };
        match (router, tiles) {
            (Some((logits, stride)), Some((buf, _, bm))) => kernels::moe_route_plan(
                d,
                Launch::pdl((1, 1, 1), (MOE_ROUTE_THREADS, 1, 1), 0),
                dptr(logits),
                i(stride),
                i(e),
                i(k),
                i(t),
                i(bm),
                dptr(idx),
                dptr(wts),
                dptr(counts),
                dptr(pr),
                dptr(slot),
                dptr(buf),
                dptr(bad),
            )?,
            (Some(_), None) => bail!("the fused router and plan need the grouped expert kernels"),
            (None, _) => {
                kernels::moe_plan_count(
                    d,
                    Launch::pdl(((e + 1) as u32, 1, 1), (256, 1, 1), 0),
                    dptr(idx),
                    i(nn),
                    i(e),
                    dptr(counts),
                )?;
                kernels::moe_plan_place(
                    d,
                    Launch::pdl((e as u32, 1, 1), (256, 1, 1), 0),
                    dptr(idx),
                    i(nn),
                    i(k),
                    i(e),
                    dptr(counts),
                    dptr(pr),
                    dptr(slot),
                )?;
                if let Some((buf, _, bm)) = tiles {
                    kernels::moe_plan_tiles(
                        d,
                        Launch::pdl((1, 1, 1), (256, 1, 1), 0),
                        dptr(counts),
                        i(e),
                        i(bm),
                        i(nn),
                        dptr(buf),
                        dptr(pr),
                        dptr(bad),
                    )?;
                }
            }
        }
        let plan = match tiles {
            Some((buf, most, bm)) => MoePlan::Tiles {
                buf,
                most: most as u32,
                bm,
            },
            None => {
                let mut hc = vec![0i32; e + 1];
                d.dtoh(&mut hc, counts)?;
                if hc[e] != 0 {
                    return Err(router_out_of_range(hc[e], e));
                }
                hc.truncate(e);
                MoePlan::Counts(hc)
            }
        };
        // `--prefill-precision bf16`: the hi terms alone (one product per tile
        // or expert), except on the few-row kernel, which stays split.
        let few = matches!(plan, MoePlan::Tiles { bm, .. } if bm == MOE_ROWS_BM);
        let single = self.single_bf16(sc) && !few;
        let lo_term = |lo: u64| if single { 0 } else { lo };
        // hi | lo bf16 halves of the gathered rows (single: hi alone); reused
        // for the f32 expert outputs.
        let xs = sc.get(d, "moe_xs", nn * h * F)?;
        // Each token's k outputs `ye` (rows in plan order) added in ascending
        // expert order (as `moe_grouped`'s per-expert scatter-adds do), with
        // the shared expert, into the residual and the next norm.
        let combine = |ye: u64| {
            kernels::moe_combine(
                d,
                Launch::pdl((t as u32, 1, 1), (256, 1, 1), 0),
                dptr(ye),
                dptr(idx),
                dptr(wts),
                dptr(slot),
                i(t),
                i(k),
                i(e),
                i(h),
                dptr(x),
                dptr(shared.0),
                dptr(shared.1),
                i(shared.2),
                dptr(next.unwrap_or(0)),
                dptr(n),
                self.cfg.rms_norm_eps,
            )
        };
        if let MoePlan::Tiles { buf, most, bm } = &plan
            && !few
            && self.moe_q8(sc, *bm, gate_up, down, e)
        {
            let rows = (n, pr, nn);
            self.moe_experts_q8(sc, rows, (*buf, *most), (gate_up, down, e), inter, xs)?;
            combine(xs)?;
            return Ok(true);
        }
        let (hi, lo) = (xs, xs + (nn * h * B) as u64);
        kernels::gather_split_bf16(
            d,
            Launch::pdl((nn as u32, 1, 1), (256, 1, 1), 0),
            dptr(n),
            i(h),
            dptr(pr),
            nn as i64,
            i(h),
            dptr(hi),
            dptr(lo_term(lo)),
        )?;
        // y (f32, rows in plan order) = a (hi [+ lo]) W_e^T per expert. Block-FP8
        // experts in whole scale blocks: read as stored by the few-row kernel
        // and the grouped GEMMs, else the whole tensor dequantized into
        // `slot`'s work buffer first.
        let experts = |a_hi: u64, a_lo: u64, wm: &DevMat, slot: Slot, y: u64| {
            let (rows, cols) = (wm.rows / e, wm.cols);
            let fp8 = wm
                .fp8()
                .filter(|_| rows.is_multiple_of(128) && cols.is_multiple_of(128));
            // The few-row kernel (`moe_rows8`) over the plan's 8-row tiles.
            if few && let MoePlan::Tiles { buf, most, .. } = &plan {
                let l = Launch::pdl(
                    (rows.div_ceil(32).div_ceil(4) as u32, *most, 1),
                    (128, 1, 1),
                    0,
                );
                let (a_hi, a_lo, buf, y) = (dptr(a_hi), dptr(a_lo), dptr(*buf), dptr(y));
                let (n, k) = (i(rows), i(cols));
                return match fp8 {
                    Some((q, s)) => {
                        kernels::moe_rows8_fp8(d, l, a_hi, a_lo, dptr(q), dptr(s), buf, y, n, k)
                    }
                    None => {
                        let w = dptr(self.bf16_weights(wm, slot)?);
                        let stride = (rows * cols) as i64;
                        kernels::moe_rows8(d, l, a_hi, a_lo, w, stride, buf, y, n, k)
                    }
                };
            }
            match &plan {
                MoePlan::Tiles { buf, most, bm } => {
                    let (kernel, smem, bn) = moe_gemm_kernel(
                        *bm,
                        d.wgmma(),
                        self.opts.moe_wg_cols,
                        self.opts.moe_k64,
                        cols,
                        a_lo == 0,
                        fp8.is_some(),
                    );
                    let l = Launch::new(
                        (rows.div_ceil(bn) as u32, *most, 1),
                        (2 * *bm as u32, 1, 1),
                        smem as u32,
                    );
                    let (a_hi, a_lo, buf, y) = (dptr(a_hi), dptr(a_lo), dptr(*buf), dptr(y));
                    match (kernel, fp8) {
                        (ExpertGemm::Fp8(k), Some((q, s))) => {
                            (k.launch)(d, l, a_hi, a_lo, dptr(q), dptr(s), buf, y, i(rows), i(cols))
                        }
                        (ExpertGemm::Bf16(k), None) => {
                            let w = dptr(self.bf16_weights(wm, slot)?);
                            let stride = (rows * cols) as i64;
                            (k.launch)(d, l, a_hi, a_lo, w, stride, buf, y, i(rows), i(cols))
                        }
                        (k, _) => unreachable!(
                            "{}: moe_gemm_kernel picks by the weights' format",
                            k.name()
                        ),
                    }
                }
                MoePlan::Counts(hc) => {
                    let w = self.bf16_weights(wm, slot)?;
                    let mut start = 0;
                    for (ex, &cnt) in hc.iter().enumerate() {
                        let cnt = cnt as usize;
                        if cnt == 0 {
                            continue;
                        }
                        let w = w + (ex * rows * cols * B) as u64;
                        let y = y + (start * rows * F) as u64;
                        d.gemm_bf16(
                            a_hi + (start * cols * B) as u64,
                            w,
                            y,
                            cnt,
                            rows,
                            cols,
                            false,
                        )?;
                        if a_lo != 0 {
                            d.gemm_bf16(
                                a_lo + (start * cols * B) as u64,
                                w,
                                y,
                                cnt,
                                rows,
                                cols,
                                true,
                            )?;
                        }
                        start += cnt;
                    }
                    Ok(())
                }
            }
        };
        let gu = sc.get(d, "gu", nn * 2 * inter * F)?;
        // A null lo operand: one product per tile or expert.
        experts(hi, lo_term(lo), gate_up, Slot::GateUp, gu)?;
        let ah = sc.get(d, "moe_act", nn * inter * 2 * B)?;
        let al = ah + (nn * inter * B) as u64;
        kernels::silu_mul_split(
            d,
            Launch::pdl((nn as u32, 1, 1), (256, 1, 1), 0),
            dptr(gu),
            nn as i64,
            i(inter),
            dptr(ah),
            dptr(lo_term(al)),
        )?;
        let ye = xs;
        experts(ah, lo_term(al), down, Slot::Down, ye)?;
        combine(ye)?;
        Ok(matches!(plan, MoePlan::Tiles { .. }))
    }

    /// Prefill experts: route on the device, copy the plan back, then per expert
    /// gather its tokens, two GEMMs, and a weighted scatter-add into the residual.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn moe_grouped(
        &self,
        sc: &mut Scratch,
        t: usize,
        e: usize,
        k: usize,
        inter: usize,
        n: u64,
        x: u64,
        idx: u64,
        wts: u64,
        gate_up: u64,
        down: u64,
    ) -> Result<()> {
        let d = &self.dev;
        let h = self.cfg.hidden_size;
        let mut hidx = vec![0i32; t * k];
        let mut hw = vec![0f32; t * k];
        d.dtoh(&mut hidx, idx)?;
        d.dtoh(&mut hw, wts)?;
        let mut rows: Vec<Vec<(i32, f32)>> = vec![Vec::new(); e];
        for (j, (&ex, &w)) in hidx.iter().zip(&hw).enumerate() {
            if ex < 0 || ex as usize >= e {
                bail!("router produced expert {ex} (of {e}): non-finite activations?");
            }
            rows[ex as usize].push(((j / k) as i32, w));
        }
        let mut plan_rows = Vec::with_capacity(t * k);
        let mut plan_w = Vec::with_capacity(t * k);
        let mut spans = Vec::new();
        for (ex, r) in rows.iter().enumerate() {
            if r.is_empty() {
                continue;
            }
            spans.push((ex, plan_rows.len(), r.len()));
            plan_rows.extend(r.iter().map(|p| p.0));
            plan_w.extend(r.iter().map(|p| p.1));
        }
        let pr = sc.get(d, "plan_rows", plan_rows.len() * 4)?;
        let pw = sc.get(d, "plan_w", plan_w.len() * F)?;
        d.htod(pr, &plan_rows)?;
        d.htod(pw, &plan_w)?;
        let maxn = spans.iter().map(|s| s.2).max().unwrap_or(0);
        let xe = sc.get(d, "xe", maxn * h * F)?;
        let gu = sc.get(d, "gu", maxn * 2 * inter * F)?;
        let act = sc.get(d, "act", maxn * inter * F)?;
        let ye = sc.get(d, "ye", maxn * h * F)?;
        for (ex, start, cnt) in spans {
            let r = pr + (start * 4) as u64;
            let w = pw + (start * F) as u64;
            kernels::gather_rows(
                d,
                Launch::pdl(((h as u32).div_ceil(256), cnt as u32, 1), (256, 1, 1), 0),
                dptr(n),
                i(h),
                dptr(r),
                i(cnt),
                i(h),
                dptr(xe),
            )?;
            self.linear_raw(
                sc,
                xe,
                cnt,
                gate_up + (ex * 2 * inter * h * B) as u64,
                2 * inter,
                h,
                gu,
                false,
            )?;
            kernels::silu_mul(
                d,
                Launch::pdl(
                    ((inter as u32).div_ceil(256), cnt as u32, 1),
                    (256, 1, 1),
                    0,
                ),
                dptr(gu),
                i(2 * inter),
                i(0),
                i(inter),
                dptr(act),
                i(inter),
                i(cnt),
            )?;
            self.linear_raw(
                sc,
                act,
                cnt,
                down + (ex * h * inter * B) as u64,
                h,
                inter,
                ye,
                false,
            )?;
            kernels::scatter_add_rows(
                d,
                Launch::new(((h as u32).div_ceil(256), cnt as u32, 1), (256, 1, 1), 0),
                dptr(ye),
                dptr(r),
                dptr(w),
                i(cnt),
                i(h),
                dptr(x),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_gemm_kernels_fit_and_fall_back() {
        // Shared memory within the H100/H200's 227 KB per block; without
        // wgmma, or for 64-row tiles, the mma.sync kernels, k steps of 64
        // for 64-row tiles where k allows.
        for bm in [64, 128] {
            for wgmma in [false, true] {
                for cols in [0, 128, 256] {
                    for (k64, k, single) in [
                        (false, 2048, false),
                        (true, 2048, false),
                        (true, 96, false),
                        (true, 2048, true),
                    ] {
                        for fp8 in [false, true] {
                            let (kernel, smem, bn) =
                                moe_gemm_kernel(bm, wgmma, cols, k64, k, single, fp8);
                            let name = kernel.name();
                            assert!(smem <= 227 * 1024, "{name}: {smem} bytes");
                            assert_eq!(name.ends_with("_fp8"), fp8, "{name}");
                            assert_eq!(matches!(kernel, ExpertGemm::Fp8(_)), fp8, "{name}");
                            let name = name.trim_end_matches("_fp8");
                            let wg = bm == 128 && wgmma && cols != 0;
                            assert_eq!(
                                name.contains("_wg"),
                                wg,
                                "bm {bm} wgmma {wgmma} cols {cols}"
                            );
                            assert_eq!(bn, if wg { cols } else { MG_BN });
                            let want_k64 = bm == 64 && k64 && k % 64 == 0;
                            assert_eq!(name == "moe_gemm_split_k64", want_k64, "{name}");
                        }
                    }
                }
            }
        }
        // moe_gemm_split128_wg's sm_80 stand-in is the mma.sync kernel, so
        // its shared memory must hold that kernel's too.
        for fp8 in [false, true] {
            for single in [false, true] {
                let (_, wg, _) = moe_gemm_kernel(128, true, 128, true, 2048, single, fp8);
                let (_, mma, _) = moe_gemm_kernel(128, false, 128, true, 2048, single, fp8);
                assert!(wg >= mma, "{wg} < {mma}");
            }
        }
        // Without the lo rows: 8 stages of 128 + 256 rows, 192 KB; FP8: the
        // B rows in bytes, then two bf16 B tiles (160 KB).
        let (_, single, _) = moe_gemm_kernel(128, true, 256, true, 2048, true, false);
        assert_eq!(single, 8 * (128 + 256) * MG_BK * B);
        let (_, single, _) = moe_gemm_kernel(128, true, 256, true, 2048, true, true);
        assert_eq!(single, 8 * (128 * B + 256) * MG_BK + 2 * 256 * MG_BK * B);
        // The shared memory the CPU harness gives the FP8 kernels is this
        // (tests/kernels_cpu/moe_gemm_check.cpp: smem8).
        let (_, split, _) = moe_gemm_kernel(64, false, 0, false, 2048, false, true);
        assert_eq!(split, 2 * (2 * 64 * 40 * 2 + 128 * 32) + 128 * 40 * 2);
    }

    #[test]
    fn route_plan_limits_match_the_kernel() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels/moe.cu");
        let src = std::fs::read_to_string(path).unwrap();
        let define = |name: &str| -> usize {
            let line = src
                .lines()
                .find_map(|l| l.strip_prefix(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{name} not in kernels/moe.cu"));
            line.trim().parse().unwrap()
        };
        assert_eq!(define("MOE_ROUTE_THREADS"), MOE_ROUTE_THREADS as usize);
        assert_eq!(define("MOE_ROUTE_MAXT"), MOE_ROUTE_MAXT);
        assert_eq!(define("MOE_ROUTE_MAXE"), MOE_ROUTE_MAXE);
        // The fused plan serves every token count of the few-row kernel.
        const { assert!(MOE_ROWS_MAX <= MOE_ROUTE_MAXT) };
    }

    #[test]
    fn the_expert_tile_grid_covers_every_plan() {
        // The tiles a plan needs (moe_plan_tiles' count) never exceed the grid.
        let need =
            |counts: &[usize], bm: usize| counts.iter().map(|c| c.div_ceil(bm)).sum::<usize>();
        let mut r = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: usize| {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            (r % m as u64) as usize
        };
        for bm in [64, 128] {
            for &(nn, e) in &[
                (1, 256),
                (8, 256),
                (8192, 256),
                (131_072, 256),
                (300, 4),
                (65, 1),
            ] {
                // Uniform, all on one expert, and one short of a tile on each.
                let mut uniform = vec![0; e];
                for _ in 0..nn {
                    uniform[next(e)] += 1;
                }
                let mut one = vec![0; e];
                one[e - 1] = nn;
                let mut ragged = vec![0; e];
                let mut left = nn;
                for c in ragged.iter_mut() {
                    *c = left.min(bm - 1);
                    left -= *c;
                }
                ragged[0] += left;
                for counts in [uniform, one, ragged] {
                    assert_eq!(counts.iter().sum::<usize>(), nn);
                    assert!(
                        need(&counts, bm) <= moe_max_tiles(nn, e, bm),
                        "{nn} {e} {bm}"
                    );
                }
            }
            // Every expert one row past a full tile: within a few rows of the bound.
            let counts = vec![bm + 1; 256];
            let most = moe_max_tiles(256 * (bm + 1), 256, bm);
            assert!(need(&counts, bm) <= most && most <= need(&counts, bm) + 4);
        }
    }
}
