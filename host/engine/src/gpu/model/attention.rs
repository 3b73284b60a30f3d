//! The gated attention layer: its device weights and its prefill and decode
//! launch sequences. The tensor-core prompt kernels are in
//! [`super::attn_prefill`], decode attention's kernel choice in
//! [`super::attn_decode`].
//!
//! Prefill: (1+w) RMSNorm -> fused projection (q | gate per head, k, v) ->
//! q/k norms + partial RoPE + KV append -> causal GQA attention with the
//! sigmoid gate (tiled kernels on the prefill path, split-K partials and a
//! combine otherwise) -> o projection -> residual add. Decode: the norm
//! inside the projection's GEMV, the same prep kernel, split-K attention over
//! the KV capacity, combine + gate, o projection with the residual add in its
//! epilogue.

use super::attn_decode::dec_attn_plan;
use super::batch::Batch;
use super::pass::{Decode, Norms, Prefill};
use super::seq_state::Span;
use super::weights::{DevMat, Synth, Upload};
use super::{B, DBuf, F, GpuModel, SeqLayer};
use crate::config::ModelConfig;
use crate::gpu::kernels::{self, Launch};
use crate::gpu::{dptr, i};
use anyhow::{Result, bail};

/// One attention layer's weights on the device.
pub(super) struct AttnLayer {
    /// `[2 * nh * hd + 2 * nkv * hd, hidden]`: q|gate per head, k, v.
    pub proj: DevMat,
    pub q_norm: DBuf,
    pub k_norm: DBuf,
    pub o_proj: DevMat,
}

impl AttnLayer {
    pub fn upload(up: &Upload, a: &crate::weights::AttentionWeights) -> Result<Self> {
        Ok(AttnLayer {
            proj: up.cat(&[&a.q_proj, &a.k_proj, &a.v_proj])?,
            q_norm: up.f32s(&a.q_norm)?,
            k_norm: up.f32s(&a.k_norm)?,
            o_proj: up.mat(&a.o_proj)?,
        })
    }

    /// Seeded random weights (`GpuModel::synthetic`).
    pub fn synthetic(s: &mut Synth, cfg: &ModelConfig) -> Result<Self> {
        let (nh, nkv, hd) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        Ok(AttnLayer {
            proj: s.qmat(2 * nh * hd + 2 * nkv * hd, cfg.hidden_size, None)?,
            q_norm: s.f32s(hd, 0.1, 1.0)?,
            k_norm: s.f32s(hd, 0.1, 1.0)?,
            o_proj: s.qmat(cfg.hidden_size, nh * hd, None)?,
        })
    }

    /// Reads the residual `pf.x` (`[t, hidden]`), appends the pass's keys and
    /// values to the sequence's cache, adds the layer's output to `pf.x`.
    pub fn prefill(&self, m: &GpuModel, pf: &mut Prefill, norms: Norms, li: usize) -> Result<()> {
        let AttnLayer {
            proj: pw, o_proj, ..
        } = self;
        let (k, v) = pf.kv(li)?;
        let (c, d) = (&m.cfg, &m.dev);
        let (t, x, n, mixed, fast) = (pf.t, pf.x, pf.n, pf.mixed, pf.fast);
        let pos0 = pf.pos0;
        let sc = &mut *pf.sc;
        m.block_input(x, n, t, norms)?;
        let p = pw.rows;
        let proj = sc.get(d, "proj", t * p * F)?;
        m.linear(sc, n, t, pw, proj, false)?;
        let ao = sc.get(d, "att_o", t * c.num_attention_heads * c.head_dim * F)?;
        self.mix_prompt(m, sc, (proj, p, t, pos0), (k, v), ao, fast)?;
        m.linear(sc, ao, t, o_proj, mixed, false)?;
        m.block_output(x, mixed, n, t, norms)
    }

    /// The token mixing of a prompt's `t` tokens from position `pos0`, their
    /// projections the rows of `proj` (stride `p`): q/k norms, RoPE and the
    /// append of their keys and values to the sequence's cache (`k`, `v`),
    /// causal attention with the output gate into `ao` (`[t, nh * hd]`).
    pub fn mix_prompt(
        &self,
        m: &GpuModel,
        sc: &mut super::Scratch,
        (proj, p, t, pos0): (u64, usize, usize, usize),
        (k, v): (Span, Span),
        ao: u64,
        fast: bool,
    ) -> Result<()> {
        let (c, d) = (&m.cfg, &m.dev);
        let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let q = sc.get(d, "q", t * nh * hd * F)?;
        (if m.kv_f32 {
            kernels::attn_prep_f32
        } else {
            kernels::attn_prep_bf16
        })(
            d,
            Launch::new((t as u32, (nh + nkv) as u32, 1), (256, 1, 1), 0),
            dptr(proj),
            i(p),
            dptr(self.q_norm.ptr()),
            dptr(self.k_norm.ptr()),
            dptr(q),
            dptr(k.ptr()),
            dptr(v.ptr()),
            i(nh),
            i(nkv),
            i(hd),
            i(c.rotary_dim),
            i(pos0),
            dptr(0),
            c.rope_theta as f32,
            c.rms_norm_eps,
        )?;
        let queries = t * nh;
        if fast && t >= 32 && hd % 4 == 0 && hd <= 256 && nh % nkv == 0 {
            // Tensor cores where the kernel supports the shape, else CUDA cores.
            let tc = m.attn_prefill_tc(sc, q, k.ptr(), v.ptr(), proj, p, ao, t, pos0)?;
            if !tc {
                m.attn_prefill_cuda_cores(q, k.ptr(), v.ptr(), proj, p, ao, t, pos0)?;
            }
            return Ok(());
        }
        let lmax = pos0 + t;
        let nsplit = if queries >= 128 {
            1
        } else {
            (264usize.div_ceil(queries)).min(lmax.div_ceil(256)).max(1)
        };
        let chunk = lmax.div_ceil(nsplit);
        let po = sc.get(d, "att_po", queries * nsplit * hd * F)?;
        let pml = sc.get(d, "att_pml", queries * nsplit * 2 * F)?;
        (if m.kv_f32 {
            kernels::attn_partial_f32
        } else {
            kernels::attn_partial_bf16
        })(
            d,
            Launch::new((queries as u32, nsplit as u32, 1), (128, 1, 1), 0),
            dptr(q),
            dptr(k.ptr()),
            dptr(v.ptr()),
            dptr(po),
            dptr(pml),
            i(nh),
            i(nkv),
            i(hd),
            i(pos0),
            dptr(0),
            i(chunk),
            i(nsplit),
            1.0 / (hd as f32).sqrt(),
        )?;
        kernels::attn_combine(
            d,
            Launch::new((queries as u32, 1, 1), (256, 1, 1), 0),
            dptr(po),
            dptr(pml),
            dptr(proj),
            i(p),
            dptr(ao),
            i(nh),
            i(hd),
            i(nsplit),
        )
    }

    /// Reads the batch's residual rows `bt.pf.x`: appends each decode row's
    /// key and value to its own cache at its position and attends over that
    /// cache, runs each prompt chunk's rows over its sequence's cache as a
    /// prompt pass would, adds the layer's output.
    pub fn batch(&self, m: &GpuModel, bt: &mut Batch, norms: Norms, li: usize) -> Result<()> {
        let (tab, pos, nsplit, b, chunks) = (bt.layer_tab(li), bt.pos, bt.nsplit, bt.b, bt.chunks);
        let attn = bt.attn;
        let pf = &mut bt.pf;
        let (c, d) = (&m.cfg, &m.dev);
        let (t, x, n, mixed, fast) = (pf.t, pf.x, pf.n, pf.mixed, pf.fast);
        let sc = &mut *pf.sc;
        let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        m.block_input(x, n, t, norms)?;
        let p = self.proj.rows;
        let proj = sc.get(d, "proj", t * p * F)?;
        m.linear(sc, n, t, &self.proj, proj, false)?;
        // Every row's attention output (the "q", "att_*" buffers are the
        // prompt mixing's own).
        let ao = sc.get(d, "bat_att_o", t * nh * hd * F)?;
        if b > 0 {
            let q = sc.get(d, "bat_q", b * nh * hd * F)?;
            (if m.kv_f32 {
                kernels::bat_attn_prep_f32
            } else {
                kernels::bat_attn_prep_bf16
            })(
                d,
                Launch::pdl((b as u32, (nh + nkv) as u32, 1), (256, 1, 1), 0),
                dptr(proj),
                i(p),
                dptr(self.q_norm.ptr()),
                dptr(self.k_norm.ptr()),
                dptr(q),
                dptr(tab),
                dptr(pos),
                i(nh),
                i(nkv),
                i(hd),
                i(c.rotary_dim),
                c.rope_theta as f32,
                c.rms_norm_eps,
            )?;
            let po = sc.get(d, "bat_att_po", b * nh * nsplit * hd * F)?;
            let pml = sc.get(d, "bat_att_pml", b * nh * nsplit * 2 * F)?;
            (attn.kernel.launch)(
                d,
                Launch::pdl(
                    (nkv as u32, nsplit as u32, b as u32),
                    (attn.threads as u32, 1, 1),
                    attn.smem as u32,
                ),
                dptr(q),
                dptr(tab),
                dptr(pos),
                dptr(po),
                dptr(pml),
                i(nh),
                i(nkv),
                i(hd),
                i(nsplit),
                1.0 / (hd as f32).sqrt(),
                i(attn.stages),
            )?;
            kernels::bat_attn_combine(
                d,
                Launch::pdl(
                    (nh as u32, hd.div_ceil(32) as u32, b as u32),
                    (256, 1, 1),
                    0,
                ),
                dptr(po),
                dptr(pml),
                dptr(proj),
                i(p),
                dptr(ao),
                i(nh),
                i(hd),
                i(nsplit),
            )?;
        }
        for ch in chunks {
            let SeqLayer::Attn { k, v } = ch.layers[li] else {
                bail!("layer state does not match the layer kind");
            };
            let rows = (proj + (ch.off * p * F) as u64, p, ch.t, ch.pos0);
            let out = ao + (ch.off * nh * hd * F) as u64;
            self.mix_prompt(m, sc, rows, (k, v), out, fast)?;
        }
        m.linear(sc, ao, t, &self.o_proj, mixed, false)?;
        m.block_output(x, mixed, n, t, norms)
    }

    /// Reads the step's residual row, appends its key and value at the
    /// step's position, adds the layer's output to the row.
    pub fn decode(&self, m: &GpuModel, dc: &Decode, input_norm: &DBuf, li: usize) -> Result<()> {
        let AttnLayer {
            proj: pw,
            q_norm,
            k_norm,
            o_proj,
        } = self;
        let (k, v) = dc.kv(li)?;
        let (c, d, ds, seq) = (&m.cfg, &m.dev, dc.ds, dc.seq);
        let eps = c.rms_norm_eps;
        let (x, ssq, nssq, proj) = (ds.x.ptr(), ds.ssq.ptr(), ds.nssq, ds.proj.ptr());
        let pos = ds.step.ptr() + 4;
        let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let p = pw.rows;
        if m.opts.dec_stage("attn_proj") {
            m.dec_norm_gemv_mat(dc, pw, input_norm.ptr(), proj)?;
        }
        if m.opts.dec_stage("attn_prep") {
            (if m.kv_f32 {
                kernels::attn_prep_f32
            } else {
                kernels::attn_prep_bf16
            })(
                d,
                Launch::pdl((1, (nh + nkv) as u32, 1), (256, 1, 1), 0),
                dptr(proj),
                i(p),
                dptr(q_norm.ptr()),
                dptr(k_norm.ptr()),
                dptr(ds.q.ptr()),
                dptr(k.ptr()),
                dptr(v.ptr()),
                i(nh),
                i(nkv),
                i(hd),
                i(c.rotary_dim),
                i(0),
                dptr(pos),
                c.rope_theta as f32,
                eps,
            )?;
        }
        let nsplit = GpuModel::decode_splits(seq.cap());
        let plan = dec_attn_plan(
            m.opts.dec_attn,
            nh / nkv,
            hd,
            seq.cap().div_ceil(nsplit),
            if m.kv_f32 { F } else { B },
            d.max_shared_per_block(),
            m.opts.tc_attention,
        );
        if m.opts.dec_stage("attn") {
            (plan.kernel.launch)(
                d,
                Launch::pdl(
                    (nkv as u32, nsplit as u32, 1),
                    (plan.threads as u32, 1, 1),
                    plan.smem as u32,
                ),
                dptr(ds.q.ptr()),
                dptr(k.ptr()),
                dptr(v.ptr()),
                dptr(ds.att_po.ptr()),
                dptr(ds.att_pml.ptr()),
                i(nh),
                i(nkv),
                i(hd),
                dptr(pos),
                i(nsplit),
                1.0 / (hd as f32).sqrt(),
                i(plan.stages),
            )?;
        }
        if m.opts.dec_stage("attn_combine") {
            kernels::dec_attn_combine(
                d,
                Launch::pdl((nh as u32, hd.div_ceil(32) as u32, 1), (256, 1, 1), 0),
                dptr(ds.att_po.ptr()),
                dptr(ds.att_pml.ptr()),
                dptr(proj),
                dptr(ds.att_o.ptr()),
                i(nh),
                i(hd),
                i(nsplit),
            )?;
        }
        if m.opts.dec_stage("o_proj") {
            m.dec_gemv_mat(o_proj, ds.att_o.ptr(), x, ssq, nssq)?;
        }
        Ok(())
    }
}
