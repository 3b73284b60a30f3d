//! The embedding, the final norm and the lm_head: their device weights and
//! their prefill and decode launches. Prefill gathers the pass's token rows,
//! normalises the last one and projects it (`GpuModel::logits_device`);
//! decode reads the token id from device memory (so the step replays as a
//! graph), folds the final norm into the lm_head GEMV and ends with the
//! on-device argmax / log-sum-exp the greedy readout copies back.

use super::pass::Decode;
use super::weights::{DevMat, Synth, Upload};
use super::{DBuf, F, GpuModel, Scratch};
use crate::config::ModelConfig;
use crate::gpu::kernels::{self, Launch};
use crate::gpu::{dptr, i};
use crate::weights::Weights;
use anyhow::Result;

/// Blocks of `argmax_partial`.
pub(super) const ARGMAX_BLOCKS: usize = 512;

/// The embedding, the final norm and the lm_head (`None`: tied to the embedding).
pub(super) struct EmbedHead {
    pub embed: DevMat,
    pub lm_head: Option<DevMat>,
    pub norm: DBuf,
}

impl EmbedHead {
    pub fn upload(up: &Upload, w: &Weights) -> Result<Self> {
        // Read as bf16 by the gather and the head's kernels (an FP8 lm_head
        // is dequantized at upload).
        let up = &Upload {
            dev: up.dev,
            fp8: false,
        };
        let embed = up.mat(&w.embed)?;
        let lm_head = match &w.lm_head {
            Some(m) => Some(up.mat(m)?),
            None => None,
        };
        let norm = up.f32s(&w.norm)?;
        Ok(EmbedHead {
            embed,
            lm_head,
            norm,
        })
    }

    /// Seeded random weights (`GpuModel::synthetic`), drawn after the layers'.
    pub fn synthetic(s: &mut Synth, cfg: &ModelConfig) -> Result<Self> {
        let h = cfg.hidden_size;
        let embed = DevMat {
            buf: s.bf16(cfg.vocab_size * h, 0.5 * 3f32.sqrt())?,
            rows: cfg.vocab_size,
            cols: h,
            scales: None,
        };
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(s.dmat(cfg.vocab_size, h)?)
        };
        let norm = s.f32s(h, 0.1, 1.0)?;
        Ok(EmbedHead {
            embed,
            lm_head,
            norm,
        })
    }

    pub fn lm_head(&self) -> &DevMat {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// The rows of the token ids at `tok` (device, `t` of them) into `x` `[t, hidden]`.
    pub fn prefill(&self, m: &GpuModel, tok: u64, x: u64, t: usize) -> Result<()> {
        let h = m.cfg.hidden_size;
        kernels::embed_gather(
            &m.dev,
            Launch::pdl((t as u32, 1, 1), (256, 1, 1), 0),
            dptr(self.embed.buf.ptr()),
            dptr(tok),
            dptr(x),
            i(t),
            i(h),
        )?;
        Ok(())
    }

    /// The final norm of row `t - 1` of `x`: the hidden state the logits
    /// come from (device f32 `[hidden]`).
    pub fn last_norm(&self, m: &GpuModel, sc: &mut Scratch, x: u64, t: usize) -> Result<u64> {
        let (d, h) = (&m.dev, m.cfg.hidden_size);
        let last = x + ((t - 1) * h * F) as u64;
        let nf = sc.get(d, "final", h * F)?;
        m.rmsnorm(last, h, &self.norm, nf, h, 1, h)?;
        Ok(nf)
    }

    /// The logits of the final-normed hidden state `nf` (device f32 `[vocab]`).
    pub fn logits(&self, m: &GpuModel, sc: &mut Scratch, nf: u64) -> Result<u64> {
        let logits = sc.get(&m.dev, "logits", m.cfg.vocab_size * F)?;
        m.linear(sc, nf, 1, self.lm_head(), logits, false)?;
        Ok(logits)
    }

    /// The step's embedding row from the token id in device memory, with its
    /// sums of squares for the first layer's norm.
    pub fn decode_embed(&self, m: &GpuModel, dc: &Decode) -> Result<()> {
        let (d, ds, h) = (&m.dev, dc.ds, m.cfg.hidden_size);
        let (x, tok, ssq, nssq) = (ds.x.ptr(), ds.step.ptr(), ds.ssq.ptr(), ds.nssq);
        kernels::dec_embed(
            d,
            Launch::new((1, 1, 1), (256, 1, 1), 0),
            dptr(self.embed.buf.ptr()),
            dptr(tok),
            dptr(x),
            i(h),
            dptr(ssq),
            i(nssq),
        )?;
        Ok(())
    }

    /// The step's logits (final norm folded into the lm_head GEMV) and their
    /// argmax / log-sum-exp into `ds.stats`.
    pub fn decode(&self, m: &GpuModel, dc: &Decode) -> Result<()> {
        let (c, d, ds) = (&m.cfg, &m.dev, dc.ds);
        let head = self.lm_head();
        if m.opts.dec_stage("lm_head") {
            m.dec_norm_gemv(
                dc,
                head.buf.ptr(),
                head.rows,
                self.norm.ptr(),
                ds.logits.ptr(),
            )?;
        }
        kernels::argmax_partial(
            d,
            Launch::pdl((ARGMAX_BLOCKS as u32, 1, 1), (256, 1, 1), 0),
            dptr(ds.logits.ptr()),
            i(c.vocab_size),
            dptr(0),
            dptr(ds.part.ptr()),
        )?;
        kernels::argmax_final(
            d,
            Launch::pdl((1, 1, 1), (256, 1, 1), 0),
            dptr(ds.part.ptr()),
            i(ARGMAX_BLOCKS),
            dptr(ds.stats.ptr()),
            dptr(0),
        )
    }
}
