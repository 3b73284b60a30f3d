//! The mixture-of-experts layer with a gated shared expert: its device
//! weights and its prefill and decode launch sequences. The grouped expert
//! GEMMs of a prompt are in [`super::moe_grouped`].
//!
//! Prefill: (1+w) RMSNorm -> one GEMM for the router logits, the shared
//! expert's gate and its gate/up projections -> SiLU * up -> shared down ->
//! sigmoid-gated residual add -> router softmax/top-k on the device (for
//! few tokens on the grouped path, in one kernel with the expert plan) ->
//! the routed experts (GEMVs over the k chosen at T = 1, grouped GEMMs over
//! tokens sorted by expert otherwise) adding into the residual. Decode: the
//! norm inside the input GEMV, routed gate/up with the router's top-k
//! recomputed per block, then routed + shared down with the residual add in
//! one kernel.

use super::fp8::Slot;
use super::moe_grouped::MoeIo;
use super::pass::{Decode, Norms, Prefill};
use super::weights::{DevMat, Synth, Upload};
use super::{DBuf, F, GemmPath, GpuModel, mlp_dims};
use crate::config::ModelConfig;
use crate::gpu::kernels::{self, Launch};
use crate::gpu::{dptr, i};
use crate::weights::DenseMlp;
use anyhow::Result;

/// 16-byte loads per lane of `dec_moe_down_rows` (`DOWN_SPAN`).
const DOWN_SPAN: usize = 9;

/// One MoE layer's weights on the device.
pub(super) struct MoeLayer {
    /// `[E + 1 + 2 * Is, hidden]`: router | shared gate | shared gate_proj | shared up_proj.
    pub input: DevMat,
    /// `[E * 2I, hidden]` (gate rows then up rows per expert).
    pub gate_up: DevMat,
    /// `[E * hidden, I]`.
    pub down: DevMat,
    pub shared_down: DevMat,
}

impl MoeLayer {
    pub fn upload(
        up: &Upload,
        router: &crate::tensor::Mat,
        experts: &[DenseMlp],
        shared: &DenseMlp,
        shared_gate: &crate::tensor::Mat,
    ) -> Result<Self> {
        // The routed experts stay block-FP8 only together with the shared
        // expert's down projection (dec_moe_down_fp8 reads both).
        let gu: Vec<_> = experts.iter().flat_map(|x| [&x.gate, &x.up]).collect();
        let dn: Vec<_> = experts.iter().map(|x| &x.down).collect();
        let all: Vec<_> = gu
            .iter()
            .chain(&dn)
            .copied()
            .chain([&shared.down])
            .collect();
        let up = Upload {
            dev: up.dev,
            fp8: up.keeps_fp8(&all),
        };
        Ok(MoeLayer {
            input: up.cat(&[router, shared_gate, &shared.gate, &shared.up])?,
            gate_up: up.cat(&gu)?,
            down: up.cat(&dn)?,
            shared_down: up.mat(&shared.down)?,
        })
    }

    /// Seeded random weights (`GpuModel::synthetic`).
    pub fn synthetic(s: &mut Synth, cfg: &ModelConfig) -> Result<Self> {
        let h = cfg.hidden_size;
        let (e, _, inter, sh) = mlp_dims(cfg);
        // As `upload`: the experts FP8 only with the shared down projection;
        // the input stack (router, shared gate: BF16 in a checkpoint) bf16.
        let q = Some(s.fp8_fits(&[(e * 2 * inter, h), (e * h, inter), (h, sh)]));
        Ok(MoeLayer {
            input: s.dmat(e + 1 + 2 * sh, h)?,
            gate_up: s.qmat(e * 2 * inter, h, q)?,
            down: s.qmat(e * h, inter, q)?,
            shared_down: s.qmat(h, sh, q)?,
        })
    }

    /// Normalises the residual `pf.x` (`[t, hidden]`) into `pf.n` (unless the
    /// block before did), adds the shared and routed experts' outputs to
    /// `pf.x`, then the next block's norm into `pf.n` where there is one.
    pub fn prefill(&self, m: &GpuModel, pf: &mut Prefill, norms: Norms) -> Result<()> {
        let MoeLayer {
            input,
            gate_up,
            down,
            shared_down,
        } = self;
        let (c, d) = (&m.cfg, &m.dev);
        let (t, h, x, n, mixed, fast) = (pf.t, c.hidden_size, pf.x, pf.n, pf.mixed, pf.fast);
        let sc = &mut *pf.sc;
        m.block_input(x, n, t, norms)?;
        let (e, k, inter, sh) = mlp_dims(c);
        // The grouped path's combine also adds the shared expert and writes
        // the next block's norm (one launch instead of three).
        let grouped = t > 1 && fast && m.gemm == GemmPath::CublasSplit;
        let p = input.rows;
        let inp = sc.get(d, "moe_in", t * p * F)?;
        m.linear(sc, n, t, input, inp, false)?;
        // Shared expert, gated.
        let act_s = sc.get(d, "act_s", t * sh * F)?;
        kernels::silu_mul(
            d,
            Launch::pdl(((sh as u32).div_ceil(256), t as u32, 1), (256, 1, 1), 0),
            dptr(inp),
            i(p),
            i(e + 1),
            i(e + 1 + sh),
            dptr(act_s),
            i(sh),
            i(t),
        )?;
        m.linear(sc, act_s, t, shared_down, mixed, false)?;
        let gate = inp + (e * F) as u64;
        if !grouped {
            kernels::add_sigmoid_scaled(
                d,
                Launch::pdl(((h as u32).div_ceil(256), t as u32, 1), (256, 1, 1), 0),
                dptr(x),
                dptr(mixed),
                dptr(gate),
                i(p),
                i(t),
                i(h),
            )?;
        }
        // Router (in the expert plan's kernel where that routes too).
        let idx = sc.get(d, "moe_idx", t * k * 4)?;
        let wts = sc.get(d, "moe_w", t * k * F)?;
        let fused = grouped && m.moe_route_fused(n, t, e, k, inter);
        if !fast {
            kernels::router_topk(
                d,
                Launch::new((t as u32, 1, 1), (256, 1, 1), 0),
                dptr(inp),
                i(p),
                i(e),
                i(k),
                dptr(idx),
                dptr(wts),
            )?;
        } else if !fused {
            kernels::router_topk_warp(
                d,
                Launch::pdl(((t as u32).div_ceil(8), 1, 1), (256, 1, 1), 0),
                dptr(inp),
                i(p),
                i(e),
                i(k),
                i(t),
                dptr(idx),
                dptr(wts),
            )?;
        }
        if t == 1 {
            // FP8: only the k chosen experts are dequantized, packed (read
            // through the indices 0..k).
            let (wgu, gu_idx) = m.bf16_expert_slabs(gate_up, Slot::GateUp, idx, k, 2 * inter)?;
            let (wd, d_idx) = m.bf16_expert_slabs(down, Slot::Down, idx, k, h)?;
            let gu = sc.get(d, "gu", k * 2 * inter * F)?;
            kernels::moe_gemv_gate_up(
                d,
                Launch::new(
                    (((2 * inter) as u32).div_ceil(8), k as u32, 1),
                    (256, 1, 1),
                    0,
                ),
                dptr(wgu),
                dptr(n),
                dptr(gu_idx),
                dptr(gu),
                i(2 * inter),
                i(h),
            )?;
            let act = sc.get(d, "act", k * inter * F)?;
            kernels::silu_mul(
                d,
                Launch::pdl(((inter as u32).div_ceil(256), k as u32, 1), (256, 1, 1), 0),
                dptr(gu),
                i(2 * inter),
                i(0),
                i(inter),
                dptr(act),
                i(inter),
                i(k),
            )?;
            kernels::moe_gemv_down(
                d,
                Launch::new(((h as u32).div_ceil(8), 1, 1), (256, 1, 1), 0),
                dptr(wd),
                dptr(act),
                dptr(d_idx),
                dptr(wts),
                dptr(x),
                i(k),
                i(h),
                i(inter),
            )?;
        } else if grouped {
            // FP8: read as stored (the few-row kernel for batched steps and
            // short prompts, the grouped GEMMs for longer ones).
            let io = MoeIo {
                n,
                x,
                idx,
                wts,
                router: fused.then_some((inp, p)),
                bad: pf.bad_words + 4 * pf.planned as u64,
                shared: (mixed, gate, p),
                next: norms.next.map(|w| w.ptr()),
            };
            if m.moe_grouped_device(sc, t, e, k, inter, io, gate_up, down)? {
                (pf.planned, pf.experts) = (pf.planned + 1, e);
            }
            return Ok(());
        } else {
            let gate_up = m.bf16_weights(gate_up, Slot::GateUp)?;
            let down = m.bf16_weights(down, Slot::Down)?;
            m.moe_grouped(sc, t, e, k, inter, n, x, idx, wts, gate_up, down)?;
        }
        match norms.next {
            Some(w) => m.rmsnorm(x, h, w, n, h, t, h),
            None => Ok(()),
        }
    }

    /// Adds the experts' outputs for the step's residual row to it (the
    /// norm folded into the input GEMV).
    pub fn decode(&self, m: &GpuModel, dc: &Decode, post_norm: &DBuf) -> Result<()> {
        let MoeLayer {
            input,
            gate_up,
            down,
            shared_down,
        } = self;
        let (c, d, ds) = (&m.cfg, &m.dev, dc.ds);
        let (h, eps) = (c.hidden_size, c.rms_norm_eps);
        let (x, ssq, nssq, proj) = (ds.x.ptr(), ds.ssq.ptr(), ds.nssq, ds.proj.ptr());
        let (e, k, inter, sh) = mlp_dims(c);
        if m.opts.dec_stage("moe_input") {
            m.dec_norm_gemv_mat(dc, input, post_norm.ptr(), proj)?;
        }
        if m.opts.dec_stage("moe_gate_up") {
            let l = Launch::pdl(
                (inter.div_ceil(8 * ds.moe_pairs) as u32, k as u32, 1),
                (256, 1, 1),
                (h * F) as u32,
            );
            let (x, ssq, nw, proj, act) = (
                dptr(x),
                dptr(ssq),
                dptr(post_norm.ptr()),
                dptr(proj),
                dptr(ds.act.ptr()),
            );
            let (nssq, e, k, inter, h, pairs) =
                (i(nssq), i(e), i(k), i(inter), i(h), i(ds.moe_pairs));
            match gate_up.fp8() {
                Some((q, s)) => kernels::dec_moe_gate_up_fp8(
                    d,
                    l,
                    dptr(q),
                    dptr(s),
                    x,
                    ssq,
                    nssq,
                    nw,
                    eps,
                    proj,
                    e,
                    k,
                    act,
                    inter,
                    h,
                    pairs,
                )?,
                None => kernels::dec_moe_gate_up(
                    d,
                    l,
                    dptr(gate_up.bf16()),
                    x,
                    ssq,
                    nssq,
                    nw,
                    eps,
                    proj,
                    e,
                    k,
                    act,
                    inter,
                    h,
                    pairs,
                )?,
            }
        }
        // The virtual row (k routed rows + the shared one) in
        // 16-byte columns, split between `warps` warps of `span`
        // each where two suffice (dec_moe_down_rows).
        let cols16 = (k * inter + sh) / 8;
        let warps = cols16.div_ceil(DOWN_SPAN * 32);
        let span = cols16.div_ceil(warps).div_ceil(32) * 32;
        let split =
            inter.is_multiple_of(8) && sh.is_multiple_of(8) && warps <= 2 && m.opts.split_gemv();
        if m.opts.dec_stage("moe_down") {
            let l = Launch::pdl(
                (h.div_ceil(8) as u32, 1, 1),
                (if split { 256 * warps as u32 } else { 256 }, 1, 1),
                ((k * inter + sh) * F) as u32,
            );
            let (act, inp, y, ssq) = (dptr(ds.act.ptr()), dptr(proj), dptr(x), dptr(ssq));
            let (e, k, inter, sh, h) = (i(e), i(k), i(inter), i(sh), i(h));
            if let (Some((qd, sd)), Some((qs, ss))) = (down.fp8(), shared_down.fp8()) {
                let (qd, sd, qs, ss) = (dptr(qd), dptr(sd), dptr(qs), dptr(ss));
                if split {
                    kernels::dec_moe_down_rows_fp8(
                        d,
                        l,
                        qd,
                        sd,
                        qs,
                        ss,
                        act,
                        inp,
                        e,
                        k,
                        inter,
                        sh,
                        y,
                        h,
                        ssq,
                        i(span),
                    )?;
                } else {
                    let l = Launch {
                        block: (256, 1, 1),
                        ..l
                    };
                    kernels::dec_moe_down_fp8(
                        d, l, qd, sd, qs, ss, act, inp, e, k, inter, sh, y, h, ssq,
                    )?;
                }
                return Ok(());
            }
            let (wd, wsd) = (dptr(down.bf16()), dptr(shared_down.bf16()));
            if split {
                kernels::dec_moe_down_rows(
                    d,
                    l,
                    wd,
                    wsd,
                    act,
                    inp,
                    e,
                    k,
                    inter,
                    sh,
                    y,
                    h,
                    ssq,
                    i(span),
                )?;
            } else {
                kernels::dec_moe_down(d, l, wd, wsd, act, inp, e, k, inter, sh, y, h, ssq)?;
            }
        }
        Ok(())
    }
}
