//! The dense SwiGLU MLP layer (models without experts): its device weights
//! and its prefill and decode launch sequences. Prefill: (1+w) RMSNorm ->
//! gate/up GEMM -> SiLU * up -> down GEMM accumulated into the residual.
//! Decode: the norm inside the gate/up GEMV, SiLU * up, the down GEMV with
//! the residual add in its epilogue.

use super::pass::{Decode, Norms, Prefill};
use super::weights::{DevMat, Synth, Upload};
use super::{DBuf, F, GpuModel};
use crate::gpu::kernels::{self, Launch};
use crate::gpu::{dptr, i};
use anyhow::Result;

/// A dense MLP's weights on the device.
pub(super) struct DenseLayer {
    pub gate_up: DevMat,
    pub down: DevMat,
}

impl DenseLayer {
    pub fn upload(up: &Upload, d: &crate::weights::DenseMlp) -> Result<Self> {
        Ok(DenseLayer {
            gate_up: up.cat(&[&d.gate, &d.up])?,
            down: up.mat(&d.down)?,
        })
    }

    /// Seeded random weights (`GpuModel::synthetic`).
    pub fn synthetic(s: &mut Synth, hidden: usize, intermediate: usize) -> Result<Self> {
        Ok(DenseLayer {
            gate_up: s.qmat(2 * intermediate, hidden, None)?,
            down: s.qmat(hidden, intermediate, None)?,
        })
    }

    /// Normalises the residual `pf.x` into `pf.n`, adds the MLP's output to
    /// `pf.x` (the down projection accumulates into it), then the next
    /// block's norm into `pf.n` where there is one.
    pub fn prefill(&self, m: &GpuModel, pf: &mut Prefill, norms: Norms) -> Result<()> {
        let DenseLayer { gate_up, down } = self;
        let (c, d) = (&m.cfg, &m.dev);
        let (t, h, x, n) = (pf.t, c.hidden_size, pf.x, pf.n);
        let sc = &mut *pf.sc;
        m.block_input(x, n, t, norms)?;
        let inter = down.cols;
        let gu = sc.get(d, "gu", t * 2 * inter * F)?;
        m.linear(sc, n, t, gate_up, gu, false)?;
        let act = sc.get(d, "act", t * inter * F)?;
        kernels::silu_mul(
            d,
            Launch::pdl(((inter as u32).div_ceil(256), t as u32, 1), (256, 1, 1), 0),
            dptr(gu),
            i(2 * inter),
            i(0),
            i(inter),
            dptr(act),
            i(inter),
            i(t),
        )?;
        m.linear(sc, act, t, down, x, true)?;
        match norms.next {
            Some(w) => m.rmsnorm(x, h, w, n, h, t, h),
            None => Ok(()),
        }
    }

    /// Adds the MLP's output for the step's residual row to it.
    pub fn decode(&self, m: &GpuModel, dc: &Decode, post_norm: &DBuf) -> Result<()> {
        let DenseLayer { gate_up, down } = self;
        let (d, ds) = (&m.dev, dc.ds);
        let (x, ssq, nssq, proj) = (ds.x.ptr(), ds.ssq.ptr(), ds.nssq, ds.proj.ptr());
        let inter = down.cols;
        m.dec_norm_gemv_mat(dc, gate_up, post_norm.ptr(), proj)?;
        kernels::silu_mul(
            d,
            Launch::pdl(((inter as u32).div_ceil(256), 1, 1), (256, 1, 1), 0),
            dptr(proj),
            i(2 * inter),
            i(0),
            i(inter),
            dptr(ds.act.ptr()),
            i(inter),
            i(1),
        )?;
        m.dec_gemv_mat(down, ds.act.ptr(), x, ssq, nssq)?;
        Ok(())
    }
}
