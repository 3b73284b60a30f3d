//! Tensor-core prefill attention: `attn_flash_tc_*` (kernels/attention.cu),
//! mma.sync bf16 with every f32 operand split into hi + lo bf16 terms and f32
//! accumulation, the results of `attn_flash_*` (causal GQA, online softmax,
//! sigmoid output gate). One block = 128 (query, q head) pairs of one kv head
//! (64 where the device has less shared memory per block), so each staged K/V
//! tile serves the whole GQA group. With an f32 KV cache, `attn_kv_split` first
//! writes the visible keys and values once as bf16 hi / lo planes into a scratch
//! buffer, which every block then streams straight into the mma layout; a bf16
//! cache is read as it is.
//!
//! On compute capability 9.x at head dim 256 (the model) or 32 (the test
//! fixtures), `attn_flash_wg_{f32,bf16}_d*`
//! (kernels/attention_wg.cu) computes the same on warpgroup MMA: the values
//! are transposed first (`attn_kv_split_t`, which also writes the keys' hi /
//! lo planes of an f32 cache; `attn_v_transpose_bf16`), so both products read
//! their operands K-major. With `--prefill-precision bf16` (`single_bf16`)
//! it is `attn_flash_wg_single_*` instead: one bf16 term per operand
//! (S = Qh·Kh, O += Ph·Vh) over either cache's hi planes.
//! `QWASI_ATTN=mma` keeps the mma.sync kernel there
//! (`scripts/device/attn_wg.sh` compares the two); the CPU harness runs both,
//! the warpgroup one on emulated wgmma.
//!
//! CUDA only (HIP has no mma.sync: the HIP build's kernels are empty stubs and
//! this returns `Ok(false)`); `QWASI_ATTN=cuda-cores` keeps the CUDA-core
//! `attn_flash_*` kernel.

#[cfg(feature = "cuda")]
use super::weights::fill_uniform;
#[cfg(feature = "cuda")]
use super::{B, DBuf};
use super::{F, GpuModel, Scratch};
use anyhow::Result;

/// Query and key tile of `attn_flash_*` (kernels/attention.cu, CUDA build).
#[cfg(feature = "cuda")]
const FA_BQ: usize = 64;
#[cfg(feature = "cuda")]
const FA_BK: usize = 32;
/// Query and key tile of `attn_flash_*` in the HIP build (64 KB of LDS on RDNA).
#[cfg(all(feature = "hip", not(feature = "cuda")))]
const FA_BQ: usize = 32;
#[cfg(all(feature = "hip", not(feature = "cuda")))]
const FA_BK: usize = 16;

/// One shape of [`GpuModel::attention_agreement`]: the largest |difference|
/// of each tensor-core kernel's outputs from the CUDA-core kernel's.
#[derive(serde::Serialize, Clone, Debug)]
pub struct AttnAgreement {
    pub queries: usize,
    pub cached: usize,
    pub warpgroup_max_diff: Option<f32>,
    pub mma_max_diff: Option<f32>,
}

#[cfg(feature = "cuda")]
mod tc {
    use crate::gpu::kernels::{Typed, sig, typed};

    /// A warpgroup prompt-attention kernel (`attn_flash_wg_*`).
    pub type WgKernel = Typed<sig::attn_flash_wg_f32_d256>;

    /// Keys per tile (`TC_BK`), smem row padding in bf16 (`TC_PAD`); a block of
    /// `warps` warps takes `16 * warps` (query, q head) rows.
    pub const BK: usize = 32;
    pub const PAD: usize = 8;
    /// Largest head dimension (`TC_MAXD`).
    pub const MAX_D: usize = 256;
    /// (query, q head) rows per block of the warpgroup kernels (`WG_ROWS`).
    pub const WG_ROWS: usize = 128;
    /// Header ints of `attn_wg_plan`'s plan (`WG_PLAN_HEAD`).
    pub const WG_PLAN_HEAD: usize = 4;

    /// Floats per piece of a split unit (`WG_PART_FLOATS`).
    pub fn part_floats(hd: usize) -> usize {
        (4 * (hd / 8) + 4) * 256
    }

    /// Whether stream-K (`attn_wg_plan`) beats one block per row block: few
    /// units (row blocks x kv heads) for the `ctas` blocks the device runs at
    /// once, so a last partial wave or idle multiprocessors would cost up to
    /// half the time (the cached prefix's 1K new tokens: 128 units on 132
    /// multiprocessors), and long enough keys (`tiles` of 32 at the end) that
    /// the plan, the pieces and their merge are small against the work.
    pub fn split_pays(units: usize, tiles: usize, ctas: usize) -> bool {
        units > 0 && units <= 2 * ctas && units * tiles >= 64 * ctas
    }

    /// Dynamic shared memory of `attn_flash_tc_*` with `warps` warps (see the
    /// kernel comment): Qh, Ql `[16 warps][hd + PAD]`, Kh, Vh (+ Kl, Vl for an f32
    /// cache) `[BK][hd + PAD]`, all bf16.
    pub fn smem_bytes(hd: usize, kv_f32: bool, warps: usize) -> usize {
        let ld = hd + PAD;
        let kv_tiles = if kv_f32 { 4 } else { 2 };
        (2 * 16 * warps * ld + kv_tiles * BK * ld) * 2
    }

    /// The warpgroup-MMA kernel at head dim `hd` (compiled in) for an f32 or
    /// bf16 cache, split or (`single`) one bf16 term per operand, and its
    /// dynamic shared memory: Q hi / lo `[128][hd]` (hi alone for `single`),
    /// the 32 keys' rows `[32][hd]` and two tiles of values transposed
    /// `[hd][32]`, both hi and lo for a split f32 cache, all bf16.
    pub fn wg_kernel(hd: usize, kv_f32: bool, single: bool) -> Option<(WgKernel, usize)> {
        let name = match (hd, kv_f32, single) {
            (256, _, true) => typed::attn_flash_wg_single_d256,
            (32, _, true) => typed::attn_flash_wg_single_d32,
            (256, true, false) => typed::attn_flash_wg_f32_d256,
            (32, true, false) => typed::attn_flash_wg_f32_d32,
            (256, false, false) => typed::attn_flash_wg_bf16_d256,
            (32, false, false) => typed::attn_flash_wg_bf16_d32,
            _ => return None,
        };
        let kv_planes = if kv_f32 && !single { 2 } else { 1 };
        let q_planes = if single { 1 } else { 2 };
        Some((
            name,
            (q_planes * WG_ROWS * hd + kv_planes * 3 * BK * hd) * 2,
        ))
    }
}

impl GpuModel {
    /// Causal GQA attention of `t` queries (q `[t][nh][hd]` f32, normed and
    /// roped; query `j` at absolute position `pos0 + j`) over the KV cache `k`,
    /// `v` (`[pos][nkv][hd]`, f32 or bf16 per `self.kv_f32`, keys `0..pos0 + t`
    /// written), gated by `sigmoid(proj[j * stride + head * 2hd + hd + d])`, into
    /// `out` `[t][nh][hd]` f32 — on tensor cores. `Ok(false)` (nothing launched)
    /// where the shape, the device or `QWASI_ATTN=cuda-cores` rules it out: the
    /// caller then runs `attn_flash_*`.
    #[cfg(feature = "cuda")]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attn_prefill_tc(
        &self,
        sc: &mut Scratch,
        q: u64,
        k: u64,
        v: u64,
        proj: u64,
        stride: usize,
        out: u64,
        t: usize,
        pos0: usize,
    ) -> Result<bool> {
        let wg = self.opts.wg_attention;
        self.attn_prefill_tc_with(sc, wg, q, k, v, proj, stride, out, t, pos0)
    }

    /// `attn_prefill_tc`, taking the warpgroup kernel where it applies only if `wg`.
    #[cfg(feature = "cuda")]
    #[allow(clippy::too_many_arguments)]
    fn attn_prefill_tc_with(
        &self,
        sc: &mut Scratch,
        wg: bool,
        q: u64,
        k: u64,
        v: u64,
        proj: u64,
        stride: usize,
        out: u64,
        t: usize,
        pos0: usize,
    ) -> Result<bool> {
        use crate::gpu::kernels::{self, Launch};
        use crate::gpu::{dptr, i};
        let c = &self.cfg;
        let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        if !self.opts.tc_attention
            || t == 0
            || nkv == 0
            || nh % nkv != 0
            || hd % 16 != 0
            || hd == 0
            || hd > tc::MAX_D
        {
            return Ok(false);
        }
        let limit = self.dev.max_shared_per_block();
        if wg && let Some((name, smem)) = self.wg_fit(self.single_bf16(sc)) {
            self.attn_prefill_wg(sc, name, smem, q, k, v, proj, stride, out, t, pos0)?;
            return Ok(true);
        }
        // 8 warps (128 rows) per block where the shared memory allows, else 4.
        let warps = if tc::smem_bytes(hd, self.kv_f32, 8) <= limit {
            8
        } else if tc::smem_bytes(hd, self.kv_f32, 4) <= limit {
            4
        } else {
            return Ok(false);
        };
        let smem = tc::smem_bytes(hd, self.kv_f32, warps);
        let launch: kernels::sig::attn_flash_tc_f32 = match (self.kv_f32, warps, hd == 256) {
            (true, 8, true) => kernels::attn_flash_tc_f32_d256,
            (true, 8, false) => kernels::attn_flash_tc_f32,
            (false, 8, true) => kernels::attn_flash_tc_bf16_d256,
            (false, 8, false) => kernels::attn_flash_tc_bf16,
            (true, _, _) => kernels::attn_flash_tc_f32_w4,
            (false, _, _) => kernels::attn_flash_tc_bf16_w4,
        };
        let d = &self.dev;
        // K, V planes [pos][nkv][hd] bf16: the f32 cache split once into hi / lo
        // (keys 0..pos0 + t), or the bf16 cache itself (no lo planes).
        let (kh, kl, vh, vl) = if self.kv_f32 {
            let elems = (pos0 + t) * nkv * hd;
            let plane = elems * 2;
            let buf = sc.get(d, "attn_kv_split", 4 * plane)?;
            let planes = (
                buf,
                buf + plane as u64,
                buf + 2 * plane as u64,
                buf + 3 * plane as u64,
            );
            let n4 = elems / 4;
            kernels::attn_kv_split(
                d,
                Launch::new((n4.div_ceil(256).min(8192) as u32, 1, 1), (256, 1, 1), 0),
                dptr(k),
                dptr(v),
                dptr(planes.0),
                dptr(planes.1),
                dptr(planes.2),
                dptr(planes.3),
                n4 as i64,
            )?;
            planes
        } else {
            (k, 0, v, 0)
        };
        let group = nh / nkv;
        launch(
            d,
            Launch::new(
                ((t * group).div_ceil(16 * warps) as u32, nkv as u32, 1),
                (32 * warps as u32, 1, 1),
                smem as u32,
            ),
            dptr(q),
            dptr(kh),
            dptr(kl),
            dptr(vh),
            dptr(vl),
            dptr(proj),
            i(stride),
            dptr(out),
            i(t),
            i(nh),
            i(nkv),
            i(hd),
            i(pos0),
            1.0 / (hd as f32).sqrt(),
        )?;
        Ok(true)
    }

    /// `attn_prefill_tc`'s contract on CUDA cores (`attn_flash_*`: 64-query x
    /// 32-key tiles, f32 math), for any shape the model allows.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attn_prefill_cuda_cores(
        &self,
        q: u64,
        k: u64,
        v: u64,
        proj: u64,
        stride: usize,
        out: u64,
        t: usize,
        pos0: usize,
    ) -> Result<()> {
        use crate::gpu::kernels::{self, Launch};
        use crate::gpu::{dptr, i};
        let c = &self.cfg;
        let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let smem = ((FA_BQ + FA_BK) * (hd + 4) + FA_BQ * (FA_BK + 4)) * F;
        (if self.kv_f32 {
            kernels::attn_flash_f32
        } else {
            kernels::attn_flash_bf16
        })(
            &self.dev,
            Launch::new(
                (nh as u32, t.div_ceil(FA_BQ) as u32, 1),
                (256, 1, 1),
                smem as u32,
            ),
            dptr(q),
            dptr(k),
            dptr(v),
            dptr(proj),
            i(stride),
            dptr(out),
            i(t),
            i(nh),
            i(nkv),
            i(hd),
            i(pos0),
            1.0 / (hd as f32).sqrt(),
        )
    }

    /// The warpgroup kernel and its shared memory, where this device and the
    /// model's head dim and cache have one: split, or one bf16 term per
    /// operand where `single` ([`GpuModel::single_bf16`]).
    #[cfg(feature = "cuda")]
    fn wg_fit(&self, single: bool) -> Option<(tc::WgKernel, usize)> {
        let limit = self.dev.max_shared_per_block();
        (self.dev.wgmma() && self.opts.tc_attention)
            .then(|| tc::wg_kernel(self.cfg.head_dim, self.kv_f32, single))
            .flatten()
            .filter(|&(_, s)| s <= limit)
    }

    /// The tensor-core prompt attention kernels against the CUDA-core
    /// `attn_flash_*` on seeded random queries, gates and cache rows of this
    /// model's geometry and cache type, `t` queries after `pos0` cached
    /// positions per shape (`t >= 1`): the largest |difference| of the
    /// warpgroup kernel's outputs and of the `mma.sync` kernel's (`None` where
    /// one does not apply here). Whatever `QWASI_ATTN` says: `qwasi verify
    /// --synthetic` reports both.
    #[cfg(feature = "cuda")]
    pub fn attention_agreement(&self, shapes: &[(usize, usize)]) -> Result<Vec<AttnAgreement>> {
        let c = &self.cfg;
        let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let mut sc = self.scratch.lock().unwrap();
        self.dev.bind()?;
        let d = &self.dev;
        let kv_bytes = if self.kv_f32 { F } else { B };
        let fill = |buf: u64, n: usize, seed: u64, scale: f32, bf16: bool| {
            fill_uniform(d, buf, n, seed, scale, 0.0, bf16)
        };
        let mut report = Vec::new();
        for (s, &(t, pos0)) in shapes.iter().enumerate() {
            let (n, stride, rows) = (pos0 + t, 2 * nh * hd, t * nh * hd);
            let q = d.alloc(rows * F)?;
            let proj = d.alloc(t * stride * F)?;
            let k = d.alloc(n * nkv * hd * kv_bytes)?;
            let v = d.alloc(n * nkv * hd * kv_bytes)?;
            let seed = 0xa77e_0000 + 4 * s as u64;
            fill(q.ptr(), rows, seed, 2.0, false)?;
            fill(proj.ptr(), t * stride, seed + 1, 2.0, false)?;
            fill(k.ptr(), n * nkv * hd, seed + 2, 1.0, !self.kv_f32)?;
            fill(v.ptr(), n * nkv * hd, seed + 3, 1.0, !self.kv_f32)?;
            let outs = [d.alloc(rows * F)?, d.alloc(rows * F)?, d.alloc(rows * F)?];
            let (qp, kp, vp, pp) = (q.ptr(), k.ptr(), v.ptr(), proj.ptr());
            self.attn_prefill_cuda_cores(qp, kp, vp, pp, stride, outs[0].ptr(), t, pos0)?;
            let wg = match self.wg_fit(false) {
                Some((name, smem)) => {
                    let o = outs[1].ptr();
                    self.attn_prefill_wg(&mut sc, name, smem, qp, kp, vp, pp, stride, o, t, pos0)?;
                    true
                }
                None => false,
            };
            let o = outs[2].ptr();
            let mma =
                self.attn_prefill_tc_with(&mut sc, false, qp, kp, vp, pp, stride, o, t, pos0)?;
            let host = |b: &DBuf| -> Result<Vec<f32>> {
                let mut h = vec![0f32; rows];
                d.dtoh(&mut h, b.ptr())?;
                Ok(h)
            };
            let want = host(&outs[0])?;
            let diff = |b: &DBuf| -> Result<f32> {
                Ok(host(b)?
                    .iter()
                    .zip(&want)
                    .map(|(x, y)| {
                        if x.is_finite() {
                            (x - y).abs()
                        } else {
                            f32::INFINITY
                        }
                    })
                    .fold(0.0, f32::max))
            };
            report.push(AttnAgreement {
                queries: t,
                cached: pos0,
                warpgroup_max_diff: if wg { Some(diff(&outs[1])?) } else { None },
                mma_max_diff: if mma { Some(diff(&outs[2])?) } else { None },
            });
        }
        Ok(report)
    }

    /// HIP build: no tensor-core prompt attention to compare.
    #[cfg(not(feature = "cuda"))]
    pub fn attention_agreement(&self, _shapes: &[(usize, usize)]) -> Result<Vec<AttnAgreement>> {
        Ok(Vec::new())
    }

    /// `attn_prefill_tc` on warpgroup MMA: the values transposed into
    /// `[nkv][hd][ldp]` planes (zero from the last key to the 32-key tile's
    /// end; hi and lo for an f32 cache, whose keys are split into hi / lo
    /// planes `[pos][nkv][hd]` too; a bf16 cache's keys are read as they are),
    /// then `name` over them.
    #[cfg(feature = "cuda")]
    #[allow(clippy::too_many_arguments)]
    fn attn_prefill_wg(
        &self,
        sc: &mut Scratch,
        name: tc::WgKernel,
        smem: usize,
        q: u64,
        k: u64,
        v: u64,
        proj: u64,
        stride: usize,
        out: u64,
        t: usize,
        pos0: usize,
    ) -> Result<()> {
        use crate::gpu::kernels::{self, Launch};
        use crate::gpu::{dptr, i};
        let c = &self.cfg;
        let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let d = &self.dev;
        let n = pos0 + t;
        let tiles = n.div_ceil(tc::BK);
        let ldp = tiles * tc::BK;
        let (kplane, vplane) = ((n * nkv * hd * 2) as u64, (nkv * hd * ldp * 2) as u64);
        let grid = (tiles as u32, nkv as u32, 1);
        let (kh, kl, vth, vtl) = if self.kv_f32 {
            let buf = sc.get(d, "attn_kv_split", (2 * kplane + 2 * vplane) as usize)?;
            let planes = (
                buf,
                buf + kplane,
                buf + 2 * kplane,
                buf + 2 * kplane + vplane,
            );
            kernels::attn_kv_split_t(
                d,
                Launch::new(grid, (256, 1, 1), 0),
                dptr(k),
                dptr(v),
                dptr(planes.0),
                dptr(planes.1),
                dptr(planes.2),
                dptr(planes.3),
                i(n),
                i(ldp),
                i(nkv),
                i(hd),
            )?;
            planes
        } else {
            let vt = sc.get(d, "attn_kv_split", vplane as usize)?;
            let l = Launch::new(grid, (256, 1, 1), 0);
            kernels::attn_v_transpose_bf16(d, l, dptr(v), dptr(vt), i(n), i(ldp), i(nkv), i(hd))?;
            (k, 0, vt, 0)
        };
        let blocks = (t * (nh / nkv)).div_ceil(tc::WG_ROWS);
        let ctas = (self.dev.occupancy(name.kernel, 256, smem as u32) * self.dev.sm_count) as usize;
        let split = self.opts.wg_split && tc::split_pays(blocks * nkv, tiles, ctas);
        let (plan, part) = if split {
            self.wg_plan(sc, t, pos0, blocks * nkv, ctas)?
        } else {
            (0, 0)
        };
        let grid = if split {
            (ctas as u32, 1, 1)
        } else {
            (blocks as u32, nkv as u32, 1)
        };
        let (proj, out) = (dptr(proj), dptr(out));
        (name.launch)(
            d,
            Launch::new(grid, (256, 1, 1), smem as u32),
            dptr(q),
            dptr(kh),
            dptr(kl),
            dptr(vth),
            dptr(vtl),
            i(ldp),
            proj,
            i(stride),
            out,
            i(t),
            i(nh),
            i(nkv),
            i(pos0),
            1.0 / (hd as f32).sqrt(),
            dptr(plan),
            dptr(part),
        )?;
        if split {
            let merge = if hd == 256 {
                kernels::attn_wg_merge_d256
            } else {
                kernels::attn_wg_merge_d32
            };
            let l = Launch::new(((blocks * nkv) as u32, 1, 1), (256, 1, 1), 0);
            let (t, nh, nkv) = (i(t), i(nh), i(nkv));
            merge(
                d,
                l,
                dptr(plan),
                dptr(part),
                proj,
                i(stride),
                out,
                t,
                nh,
                nkv,
            )?;
        }
        Ok(())
    }

    /// The stream-K plan of this pass's warpgroup attention (`attn_wg_plan`,
    /// on the device: the same for every attention layer of the pass, so made
    /// once per `(t, pos0)`) and the buffer for its pieces.
    #[cfg(feature = "cuda")]
    fn wg_plan(
        &self,
        sc: &mut Scratch,
        t: usize,
        pos0: usize,
        units: usize,
        ctas: usize,
    ) -> Result<(u64, u64)> {
        use crate::gpu::kernels::{self, Launch};
        use crate::gpu::{dptr, i};
        let d = &self.dev;
        let hd = self.cfg.head_dim;
        let ints = tc::WG_PLAN_HEAD + ctas + 1 + 4 * (units + ctas) + 3 * units;
        let plan = sc.get(d, "attn_wg_plan", ints * 4)?;
        let part = sc.get(d, "attn_wg_part", (units + ctas) * tc::part_floats(hd) * F)?;
        if sc.attn_plan != Some((t, pos0, ctas, plan)) {
            let g = self.cfg.num_attention_heads / self.cfg.num_key_value_heads;
            let nkv = self.cfg.num_key_value_heads;
            let l = Launch::new((1, 1, 1), (32, 1, 1), 0);
            kernels::attn_wg_plan(d, l, i(t), i(g), i(nkv), i(pos0), i(ctas), dptr(plan))?;
            sc.attn_plan = Some((t, pos0, ctas, plan));
        }
        Ok((plan, part))
    }

    /// HIP build: no mma.sync, always the CUDA-core kernel.
    #[cfg(not(feature = "cuda"))]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attn_prefill_tc(
        &self,
        _sc: &mut Scratch,
        _q: u64,
        _k: u64,
        _v: u64,
        _proj: u64,
        _stride: usize,
        _out: u64,
        _t: usize,
        _pos0: usize,
    ) -> Result<bool> {
        Ok(false)
    }
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use super::tc;

    /// The warpgroup kernels exist for the model's head dim and the fixtures',
    /// their shared memory is the kernel's layout (HD * 896 bytes with an f32
    /// cache, HD * 704 with bf16, HD * 448 with one term per operand for
    /// either cache), and the model's fits the 227 KB a block may have on
    /// compute capability 9.x.
    #[test]
    fn wg_kernels_fit() {
        let (name, smem) = tc::wg_kernel(256, true, false).unwrap();
        assert_eq!((name.name(), smem), ("attn_flash_wg_f32_d256", 229_376));
        assert!(smem <= 227 * 1024);
        let (name, smem) = tc::wg_kernel(256, false, false).unwrap();
        assert_eq!((name.name(), smem), ("attn_flash_wg_bf16_d256", 180_224));
        for kv_f32 in [true, false] {
            let (name, smem) = tc::wg_kernel(256, kv_f32, true).unwrap();
            assert_eq!((name.name(), smem), ("attn_flash_wg_single_d256", 114_688));
            assert_eq!(tc::wg_kernel(32, kv_f32, true).unwrap().1, 14_336);
        }
        assert_eq!(tc::wg_kernel(32, true, false).unwrap().1, 28_672);
        assert_eq!(tc::wg_kernel(32, false, false).unwrap().1, 22_528);
        assert!(tc::wg_kernel(128, true, false).is_none());
        assert!(tc::wg_kernel(128, true, true).is_none());
    }

    /// Stream-K where blocks would sit idle on long keys: the cached 131K
    /// prefix's 1K new tokens (128 units, 4,128 tiles on 132 blocks), not a
    /// 16K prompt pass (2,048 units), a short prompt (little work) or a 1K
    /// prompt from position 0.
    #[test]
    fn stream_k_where_blocks_would_idle() {
        assert!(tc::split_pays(128, 4128, 132));
        assert!(tc::split_pays(138, 4128, 132));
        assert!(!tc::split_pays(2048, 4096, 132));
        assert!(!tc::split_pays(64, 16, 132));
        assert!(!tc::split_pays(128, 32, 132));
        assert!(!tc::split_pays(0, 100, 132));
        assert_eq!(tc::part_floats(256), 132 * 256);
    }
}
