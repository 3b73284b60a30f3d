//! The Gated DeltaNet (linear attention) layer: its device weights and its
//! prefill and decode launch sequences. The delta rule over a prompt is in
//! [`super::gdn_prefill`].
//!
//! Prefill: (1+w) RMSNorm -> fused in projection (qkv | z | a | b) -> causal
//! conv + SiLU (token-parallel on the prefill path, with the conv window
//! updated after) -> q/k L2 norms -> gates -> delta rule -> gated RMSNorm ->
//! out projection -> residual add. Decode: the norm inside the in
//! projection's GEMV (the conv in its epilogue where the bulk GEMV can take
//! it, else `dec_gdn_conv`), one fused step kernel (norms, gates, delta rule,
//! gated norm), the out projection with the residual add in its epilogue.

use super::batch::Batch;
use super::pass::{Decode, Norms, Prefill};
use super::pass_snapshots::Capture;
use super::seq_state::Span;
use super::weights::{DevMat, Synth, Upload};
use super::{CONV_TPT, DBuf, F, GpuModel, SeqLayer};
use crate::config::ModelConfig;
use crate::gpu::kernels::{self, Launch};
use crate::gpu::{dptr, i};
use anyhow::{Result, bail};

/// The GDN decode step's block for value heads of `dv`
/// (kernels/decode_gdn.cu): 32 ceil(dv / 32) columns of 4 row groups.
fn step_block(dv: usize) -> (u32, u32, u32) {
    ((32 * dv.div_ceil(32)) as u32, 4, 1)
}

/// One GDN layer's weights on the device.
pub(super) struct GdnLayer {
    /// `[conv_dim + value_dim + 2 * nv, hidden]`: qkv | z | a | b; of a
    /// block-FP8 checkpoint, whose stack mixes FP8 (qkv, z) and BF16 (a, b)
    /// matrices, qkv | z alone, as stored.
    pub in_proj: DevMat,
    /// The bf16 a | b rows where `in_proj` holds the FP8 qkv | z alone. The
    /// decode step reads them as the tail of `in_proj`'s bulk GEMV
    /// (`dec_gemv_bulk_conv_fp8`), into the same row; prompts and batched
    /// steps project them into rows of their own ([`GdnProj`]).
    pub in_proj_ab: Option<DevMat>,
    pub conv: DBuf,
    pub a_log: DBuf,
    pub dt_bias: DBuf,
    pub norm: DBuf,
    pub out_proj: DevMat,
}

/// Where a pass's in projection rows are: `t` rows of `stride` floats at
/// `main` (qkv | z, then a | b unless they are apart), and each row's a | b
/// at `ab`, `ab_stride` floats apart.
#[derive(Clone, Copy)]
pub(super) struct GdnProj {
    pub main: u64,
    pub stride: usize,
    pub ab: u64,
    pub ab_stride: usize,
}

impl GdnProj {
    /// The rows from row `off` on.
    fn from(self, off: usize) -> Self {
        GdnProj {
            main: self.main + (off * self.stride * F) as u64,
            ab: self.ab + (off * self.ab_stride * F) as u64,
            ..self
        }
    }
}

impl GdnLayer {
    pub fn upload(up: &Upload, g: &crate::weights::GdnWeights) -> Result<Self> {
        let stack = [&g.in_proj_qkv, &g.in_proj_z, &g.in_proj_a, &g.in_proj_b];
        // A stack mixing FP8 and BF16 matrices: the FP8 rows as stored, the
        // BF16 ones apart (one bf16 copy of the whole stack was 1.5 GB on
        // the 35B model).
        let (in_proj, in_proj_ab) = if up.keeps_fp8(&stack[..2]) && !up.keeps_fp8(&stack) {
            (up.cat(&stack[..2])?, Some(up.cat(&stack[2..])?))
        } else {
            (up.cat(&stack)?, None)
        };
        Ok(GdnLayer {
            in_proj,
            in_proj_ab,
            conv: up.f32s(&g.conv)?,
            a_log: up.f32s(&g.a_log)?,
            dt_bias: up.f32s(&g.dt_bias)?,
            norm: up.f32s(&g.norm)?,
            out_proj: up.mat(&g.out_proj)?,
        })
    }

    /// Seeded random weights (`GpuModel::synthetic`), drawn in the order the
    /// generator always drew them.
    pub fn synthetic(s: &mut Synth, cfg: &ModelConfig) -> Result<Self> {
        let h = cfg.hidden_size;
        let nv = cfg.linear_num_value_heads;
        let fp8_rows = cfg.linear_conv_dim() + cfg.linear_value_dim();
        let (in_proj, in_proj_ab) = s.mixed_stack(fp8_rows, fp8_rows + 2 * nv, h)?;
        let a_log = s.alog(nv)?;
        Ok(GdnLayer {
            in_proj,
            in_proj_ab,
            conv: s.f32s(cfg.linear_conv_dim() * cfg.linear_conv_kernel, 0.5, 0.0)?,
            a_log,
            dt_bias: s.f32s(nv, 0.5, 0.0)?,
            norm: s.f32s(cfg.linear_value_head_dim, 0.1, 1.0)?,
            out_proj: s.qmat(h, cfg.linear_value_dim(), None)?,
        })
    }

    /// Floats of a token's whole in projection (qkv | z | a | b).
    pub fn proj_width(&self) -> usize {
        self.in_proj.rows + self.in_proj_ab.as_ref().map_or(0, |m| m.rows)
    }

    /// The in projections of `t` normed rows at `n`: one projection, or the
    /// qkv | z rows and the a | b rows apart.
    fn project(&self, m: &GpuModel, sc: &mut super::Scratch, n: u64, t: usize) -> Result<GdnProj> {
        let d = &m.dev;
        let p = self.in_proj.rows;
        let main = sc.get(d, "proj", t * p * F)?;
        m.linear(sc, n, t, &self.in_proj, main, false)?;
        Ok(match &self.in_proj_ab {
            None => {
                let a_off = m.cfg.linear_conv_dim() + m.cfg.linear_value_dim();
                GdnProj {
                    main,
                    stride: p,
                    ab: main + (a_off * F) as u64,
                    ab_stride: p,
                }
            }
            Some(ab_w) => {
                let ab = sc.get(d, "proj_ab", t * ab_w.rows * F)?;
                m.linear(sc, n, t, ab_w, ab, false)?;
                GdnProj {
                    main,
                    stride: p,
                    ab,
                    ab_stride: ab_w.rows,
                }
            }
        })
    }

    /// Reads the residual `pf.x` (`[t, hidden]`), adds the layer's output to it.
    pub fn prefill(&self, m: &GpuModel, pf: &mut Prefill, norms: Norms, li: usize) -> Result<()> {
        let (cst, s) = pf.gdn(li)?;
        let (c, d) = (&m.cfg, &m.dev);
        let (t, x, n, mixed, fast) = (pf.t, pf.x, pf.n, pf.mixed, pf.fast);
        let sc = &mut *pf.sc;
        m.block_input(x, n, t, norms)?;
        let proj = self.project(m, sc, n, t)?;
        let o2 = sc.get(d, "gdn_o2", t * c.linear_value_dim() * F)?;
        let caps = (pf.captures, li);
        self.mix_prompt(m, sc, (proj, t), (cst, s), o2, fast, caps)?;
        m.linear(sc, o2, t, &self.out_proj, mixed, false)?;
        m.block_output(x, mixed, n, t, norms)
    }

    /// The token mixing of a prompt's `t` tokens whose in projections are
    /// `pr`'s rows (the conv runs in place there on the
    /// reference path): conv, norms, gates and the delta rule over the
    /// sequence's conv window and state, the gated norm into `o2`
    /// (`[t, value_dim]`); the states at the captures' offsets into the
    /// captures (layer `li`'s spans).
    #[allow(clippy::too_many_arguments)]
    pub fn mix_prompt(
        &self,
        m: &GpuModel,
        sc: &mut super::Scratch,
        (pr, t): (GdnProj, usize),
        (cst, s): (Span, Span),
        o2: u64,
        fast: bool,
        (caps, li): (&[Capture], usize),
    ) -> Result<()> {
        let GdnLayer {
            conv,
            a_log,
            dt_bias,
            norm,
            ..
        } = self;
        let (c, d) = (&m.cfg, &m.dev);
        let (nk, nv, dk, dv) = c.linear_heads();
        let conv_dim = c.linear_conv_dim();
        let key_dim = c.linear_key_dim();
        let (proj, p) = (pr.main, pr.stride);
        // Captured conv windows: the projection rows before each offset, read
        // before the reference path's conv overwrites them.
        let mut cap_states = Vec::with_capacity(caps.len());
        for cap in caps {
            let Some((cconv, cs)) = cap.gdn(li) else {
                bail!("a capture's layer state does not match the layer kind");
            };
            kernels::conv_state_update(
                d,
                Launch::new(((conv_dim as u32).div_ceil(256), 1, 1), (256, 1, 1), 0),
                dptr(proj),
                i(p),
                dptr(cconv),
                i(cap.off),
                i(conv_dim),
                i(c.linear_conv_kernel),
            )?;
            cap_states.push((cap.off, cs));
        }
        // The conv output (q | k | v per token): in place in `proj` on the
        // reference path, a separate [t, conv_dim] buffer on the prefill path
        // (tokens in parallel cannot run in place).
        let (qkv, qkv_stride) = if fast {
            let co = sc.get(d, "conv_o", t * conv_dim * F)?;
            kernels::conv_silu_tokens(
                d,
                Launch::new(
                    (
                        (conv_dim as u32).div_ceil(256),
                        t.div_ceil(CONV_TPT) as u32,
                        1,
                    ),
                    (256, 1, 1),
                    0,
                ),
                dptr(proj),
                i(p),
                dptr(cst.ptr()),
                dptr(conv.ptr()),
                dptr(co),
                i(t),
                i(conv_dim),
                i(c.linear_conv_kernel),
            )?;
            kernels::conv_state_update(
                d,
                Launch::new(((conv_dim as u32).div_ceil(256), 1, 1), (256, 1, 1), 0),
                dptr(proj),
                i(p),
                dptr(cst.ptr()),
                i(t),
                i(conv_dim),
                i(c.linear_conv_kernel),
            )?;
            (co, conv_dim)
        } else {
            kernels::conv_silu(
                d,
                Launch::new(((conv_dim as u32).div_ceil(128), 1, 1), (128, 1, 1), 0),
                dptr(proj),
                i(p),
                dptr(cst.ptr()),
                dptr(conv.ptr()),
                i(t),
                i(conv_dim),
                i(c.linear_conv_kernel),
            )?;
            (proj, p)
        };
        let rows_q = (t * nk) as u32;
        kernels::l2norm_heads(
            d,
            Launch::new((rows_q.div_ceil(8), 1, 1), (256, 1, 1), 0),
            dptr(qkv),
            i(t),
            i(nk),
            i(dk),
            i(qkv_stride),
            1.0 / (dk as f32).sqrt(),
            1e-6,
        )?;
        kernels::l2norm_heads(
            d,
            Launch::new((rows_q.div_ceil(8), 1, 1), (256, 1, 1), 0),
            dptr(qkv + (key_dim * F) as u64),
            i(t),
            i(nk),
            i(dk),
            i(qkv_stride),
            1.0,
            1e-6,
        )?;
        let g = sc.get(d, "g", t * nv * F)?;
        let beta = sc.get(d, "beta", t * nv * F)?;
        kernels::gdn_gates(
            d,
            Launch::new((((t * nv) as u32).div_ceil(256), 1, 1), (256, 1, 1), 0),
            dptr(pr.ab),
            i(pr.ab_stride),
            0,
            i(nv),
            dptr(a_log.ptr()),
            dptr(dt_bias.ptr()),
            dptr(g),
            dptr(beta),
            i(t),
            i(nv),
        )?;
        let o = sc.get(d, "gdn_o", t * c.linear_value_dim() * F)?;
        m.gdn_recurrence(sc, qkv, qkv_stride, g, beta, s.ptr(), o, t, &cap_states)?;
        kernels::gated_rmsnorm(
            d,
            Launch::new((((t * nv) as u32).div_ceil(8), 1, 1), (256, 1, 1), 0),
            dptr(o),
            dptr(proj + (conv_dim * F) as u64),
            i(p),
            dptr(norm.ptr()),
            dptr(o2),
            i(t),
            i(nv),
            i(dv),
            c.rms_norm_eps,
        )
    }

    /// Reads the batch's residual rows `bt.pf.x`: steps each decode row's
    /// own conv window and state, runs each prompt chunk's rows over its
    /// sequence's state as a prompt pass would, adds the layer's output.
    pub fn batch(&self, m: &GpuModel, bt: &mut Batch, norms: Norms, li: usize) -> Result<()> {
        let (tab, b, chunks) = (bt.layer_tab(li), bt.b, bt.chunks);
        let pf = &mut bt.pf;
        let (c, d) = (&m.cfg, &m.dev);
        let (t, x, n, mixed, fast) = (pf.t, pf.x, pf.n, pf.mixed, pf.fast);
        let sc = &mut *pf.sc;
        let conv_dim = c.linear_conv_dim();
        let vdim = c.linear_value_dim();
        m.block_input(x, n, t, norms)?;
        let pr = self.project(m, sc, n, t)?;
        let (proj, p) = (pr.main, pr.stride);
        // Every row's gated-norm output ("gdn_o" is the prompt mixing's own).
        let o = sc.get(d, "bat_gdn_o", t * vdim * F)?;
        if b > 0 {
            kernels::bat_gdn_conv(
                d,
                Launch::pdl(
                    ((conv_dim as u32).div_ceil(128), b as u32, 1),
                    (128, 1, 1),
                    0,
                ),
                dptr(proj),
                i(p),
                dptr(tab),
                dptr(self.conv.ptr()),
                i(c.linear_conv_kernel),
                i(conv_dim),
            )?;
            self.batch_step(m, &pr, b, tab, o)?;
        }
        for ch in chunks {
            let SeqLayer::Gdn { conv, s } = ch.layers[li] else {
                bail!("layer state does not match the layer kind");
            };
            let rows = (pr.from(ch.off), ch.t);
            let out = o + (ch.off * vdim * F) as u64;
            let caps = (&ch.captures[..], li);
            self.mix_prompt(m, sc, rows, (conv, s), out, fast, caps)?;
        }
        m.linear(sc, o, t, &self.out_proj, mixed, false)?;
        m.block_output(x, mixed, n, t, norms)
    }

    /// The delta-rule step of a batched step's `b` decode rows (their
    /// projections `pr`, states at the layer's table `tab`) into `o`: a
    /// block per row and head.
    fn batch_step(&self, m: &GpuModel, pr: &GdnProj, b: usize, tab: u64, o: u64) -> Result<()> {
        let (c, d) = (&m.cfg, &m.dev);
        let (nk, nv, dk, dv) = c.linear_heads();
        kernels::bat_gdn_step(
            d,
            Launch::pdl((nv as u32, b as u32, 1), step_block(dv), 0),
            dptr(pr.main),
            i(pr.stride),
            i(nk),
            i(nv),
            i(dk),
            i(dv),
            dptr(self.a_log.ptr()),
            dptr(self.dt_bias.ptr()),
            dptr(pr.ab),
            i(pr.ab_stride),
            1.0 / (dk as f32).sqrt(),
            dptr(tab),
            i(c.linear_conv_dim()),
            dptr(self.norm.ptr()),
            c.rms_norm_eps,
            dptr(o),
            i(c.linear_value_dim()),
        )
    }

    /// Reads the step's residual row, adds the layer's output to it (and
    /// writes its sums of squares for the next norm).
    pub fn decode(&self, m: &GpuModel, dc: &Decode, input_norm: &DBuf, li: usize) -> Result<()> {
        let GdnLayer {
            in_proj,
            in_proj_ab,
            conv,
            a_log,
            dt_bias,
            norm,
            out_proj,
        } = self;
        let (cst, s) = dc.gdn(li)?;
        let (c, d, ds) = (&m.cfg, &m.dev, dc.ds);
        let (h, eps) = (c.hidden_size, c.rms_norm_eps);
        let (x, ssq, nssq, proj) = (ds.x.ptr(), ds.ssq.ptr(), ds.nssq, ds.proj.ptr());
        let (nk, nv, dk, dv) = c.linear_heads();
        let conv_dim = c.linear_conv_dim();
        let vdim = c.linear_value_dim();
        let k = c.linear_conv_kernel;
        // The conv in the in projection's epilogue where it can
        // take it, else its own kernel. An FP8 checkpoint's qkv | z rows as
        // stored, its a | b rows as the bf16 tail, where the bulk GEMV runs.
        let mut folded = false;
        if m.opts.dec_stage("in_proj") {
            let norm = input_norm.ptr();
            let fold = m
                .opts
                .conv_gdn
                .then_some((conv.ptr(), cst.ptr(), k, conv_dim));
            let tail = in_proj_ab.as_ref().map(|ab| (ab.buf.ptr(), ab.rows));
            let (w, rows) = (in_proj.weights(), in_proj.rows);
            let mut done = false;
            if fold.is_some() || tail.is_some() {
                done = m.bulk_gemv(w, x, proj, rows, h, Some(norm), ssq, nssq, fold, tail)?;
                folded = done && fold.is_some();
            }
            if !done {
                m.dec_norm_gemv_mat(dc, in_proj, norm, proj)?;
                if let Some(ab) = in_proj_ab {
                    m.dec_norm_gemv_mat(dc, ab, norm, proj + (rows * F) as u64)?;
                }
            }
        }
        if !folded && m.opts.dec_stage("gdn_prep") {
            kernels::dec_gdn_conv(
                d,
                Launch::pdl((conv_dim.div_ceil(128) as u32, 1, 1), (128, 1, 1), 0),
                dptr(proj),
                dptr(cst.ptr()),
                dptr(conv.ptr()),
                i(k),
                i(conv_dim),
            )?;
        }
        if m.opts.dec_stage("gdn_step") {
            kernels::dec_gdn_step(
                d,
                Launch::pdl((nv as u32, 1, 1), step_block(dv), 0),
                dptr(proj),
                i(nk),
                i(nv),
                i(dk),
                i(dv),
                dptr(a_log.ptr()),
                dptr(dt_bias.ptr()),
                i(conv_dim + vdim),
                1.0 / (dk as f32).sqrt(),
                dptr(s.ptr()),
                dptr(proj + (conv_dim * F) as u64),
                dptr(norm.ptr()),
                eps,
                dptr(ds.gdn_o.ptr()),
            )?;
        }
        if m.opts.dec_stage("out_proj") {
            m.dec_gemv_mat(out_proj, ds.gdn_o.ptr(), x, ssq, nssq)?;
        }
        Ok(())
    }
}
