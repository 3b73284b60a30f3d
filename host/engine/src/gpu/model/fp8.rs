//! Block-FP8 matrices on the device (docs/FP8.md). The batch-1 decode GEMVs
//! read them natively (`*_fp8` in kernels/decode.cu and kernels/decode_moe.cu);
//! every other path (prompt GEMMs, grouped expert GEMMs, the batched step's
//! few-row kernels, the T = 1 expert GEMVs) dequantizes the matrix into a bf16
//! work buffer right before its usual kernel (`fp8_dequant`, kernels/fp8.cu),
//! so its numbers are those of the same matrix uploaded in bf16.
//!
//! The work buffers are allocated once, when the model loads, for the largest
//! FP8 matrix of each kind (nothing is allocated inside a pass, so captured
//! graphs stay valid): one for a layer's projections, and one each for a
//! layer's routed experts' gate/up and down tensors. All launches go to the
//! model's one stream, so a buffer is rewritten only after the kernel that
//! read it.

use super::weights::DevMat;
use super::{B, DBuf, DLayer, Device, GpuModel, LayerMixer, LayerMlp};
use crate::gpu::kernels::{self, Launch};
use crate::gpu::{dptr, i};
use anyhow::Result;

/// Which work buffer a dequantized matrix goes to (matrices a kernel reads
/// together must be in different ones).
#[derive(Clone, Copy)]
pub(super) enum Slot {
    /// A projection (attention, GDN, shared expert, dense MLP).
    Mat,
    /// A layer's routed experts' gate/up tensor.
    GateUp,
    /// A layer's routed experts' down tensor.
    Down,
}

/// The bf16 work buffers (`None` for a slot no FP8 matrix uses).
#[derive(Default)]
pub(super) struct Fp8Work {
    mat: Option<DBuf>,
    gate_up: Option<DBuf>,
    down: Option<DBuf>,
}

impl Fp8Work {
    /// Buffers for the largest FP8 matrix of each slot in `layers`.
    pub fn new(dev: &Device, layers: &[DLayer]) -> Result<Self> {
        let mut most = [0usize; 3];
        let mut see = |m: &DevMat, slot: Slot| {
            if m.fp8().is_some() {
                let n = &mut most[slot as usize];
                *n = (*n).max(m.rows * m.cols * B);
            }
        };
        for l in layers {
            let mixer = match &l.mixer {
                LayerMixer::Gdn(g) => [&g.in_proj, &g.out_proj],
                LayerMixer::Attn(a) => [&a.proj, &a.o_proj],
            };
            let mlp = match &l.mlp {
                LayerMlp::Moe(m) => {
                    see(&m.gate_up, Slot::GateUp);
                    see(&m.down, Slot::Down);
                    [&m.input, &m.shared_down]
                }
                LayerMlp::Dense(d) => [&d.gate_up, &d.down],
            };
            for m in mixer.into_iter().chain(mlp) {
                see(m, Slot::Mat);
            }
        }
        let alloc = |n: usize| (n > 0).then(|| dev.alloc(n)).transpose();
        Ok(Fp8Work {
            mat: alloc(most[Slot::Mat as usize])?,
            gate_up: alloc(most[Slot::GateUp as usize])?,
            down: alloc(most[Slot::Down as usize])?,
        })
    }

    /// Device bytes of the work buffers.
    pub fn bytes(&self) -> usize {
        [&self.mat, &self.gate_up, &self.down]
            .iter()
            .map(|b| b.as_ref().map_or(0, DBuf::bytes))
            .sum()
    }
}

impl GpuModel {
    /// The address of `w`'s bf16 elements: its own, or for a block-FP8
    /// matrix a copy dequantized into `slot`'s work buffer. `experts`
    /// (`idx`, `n`, `slab_rows`): only slabs `idx[0..n]` (device i32s) of
    /// `slab_rows` rows each are written, at their own places (the experts a
    /// pass routes to).
    pub(super) fn bf16_weights(
        &self,
        w: &DevMat,
        slot: Slot,
        experts: Option<(u64, usize, usize)>,
    ) -> Result<u64> {
        let Some((q, s)) = w.fp8() else {
            return Ok(w.buf.ptr());
        };
        let work = &self.fp8_work;
        let out = match slot {
            Slot::Mat => &work.mat,
            Slot::GateUp => &work.gate_up,
            Slot::Down => &work.down,
        }
        .as_ref()
        .expect("a work buffer for every FP8 slot (Fp8Work::new)")
        .ptr();
        let (idx, slabs, rows) = experts.unwrap_or((0, 1, w.rows));
        let units = rows * w.cols / 8;
        // fp8_dequant indexes within a slab in 32 bits.
        anyhow::ensure!(
            units < u32::MAX as usize,
            "an FP8 matrix slab of {rows} x {} is too large to dequantize",
            w.cols
        );
        let blocks = units.div_ceil(256).min(4 * 65_535) as u32;
        kernels::fp8_dequant(
            &self.dev,
            Launch::pdl((blocks, slabs as u32, 1), (256, 1, 1), 0),
            dptr(q),
            dptr(s),
            dptr(idx),
            i(rows),
            i(w.cols),
            dptr(out),
        )?;
        Ok(out)
    }

    /// Device bytes of the weights, and of the FP8 work buffers.
    pub fn weight_bytes(&self) -> (usize, usize) {
        let mut n = self.head.embed.device_bytes()
            + self.head.lm_head.as_ref().map_or(0, DevMat::device_bytes)
            + self.head.norm.bytes();
        for l in &self.layers {
            n += l.input_norm.bytes() + l.post_norm.bytes();
            n += match &l.mixer {
                LayerMixer::Gdn(g) => {
                    g.in_proj.device_bytes()
                        + g.in_proj_fp8.as_ref().map_or(0, DevMat::device_bytes)
                        + g.out_proj.device_bytes()
                        + [&g.conv, &g.a_log, &g.dt_bias, &g.norm]
                            .iter()
                            .map(|b| b.bytes())
                            .sum::<usize>()
                }
                LayerMixer::Attn(a) => {
                    a.proj.device_bytes()
                        + a.o_proj.device_bytes()
                        + a.q_norm.bytes()
                        + a.k_norm.bytes()
                }
            };
            n += match &l.mlp {
                LayerMlp::Moe(m) => [&m.input, &m.gate_up, &m.down, &m.shared_down]
                    .iter()
                    .map(|m| m.device_bytes())
                    .sum::<usize>(),
                LayerMlp::Dense(d) => d.gate_up.device_bytes() + d.down.device_bytes(),
            };
        }
        (n, self.fp8_work.bytes())
    }
}
