//! Block-FP8 matrices on the device (docs/FP8.md). The decode GEMVs, the
//! few-row kernels of batched steps and short prompts, and the grouped expert
//! GEMMs of longer prompts read them as stored (`*_fp8` in kernels/decode.cu,
//! kernels/decode_moe.cu, kernels/gemv_bulk.cu, kernels/gemm_rows.cu,
//! kernels/moe_gemm.cu); every other path (the other prompt projections, the
//! routed experts of one-token passes, the per-expert fallbacks)
//! dequantizes what it reads into a bf16 work buffer right before its usual
//! kernel (`fp8_dequant`, kernels/fp8.cu), so its numbers are those of the
//! same matrix uploaded in bf16.
//!
//! The work buffers are allocated once, when the model loads (nothing is
//! allocated inside a pass, so captured graphs stay valid): one for the
//! largest FP8 projection, and one each for a layer's routed experts'
//! gate/up and down slabs: the `top_k` experts a one-token pass routes to,
//! packed, or the whole tensors where a prompt pass may dequantize them
//! ([`ExpertWork::Whole`]). All launches go to the model's one stream, so a
//! buffer is rewritten only after the kernel that read it.

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

/// How much of a layer's FP8 experts a pass may dequantize at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum ExpertWork {
    /// The whole tensors (prompt passes without the grouped kernels).
    #[default]
    Whole,
    /// Only the `top_k` slabs a one-token pass routes to, of `experts`.
    Routed { experts: usize, top_k: usize },
}

impl ExpertWork {
    /// Whether a layer's FP8 experts need dequantizing whole: unless every
    /// prompt pass of more than one token takes the grouped kernels
    /// (`grouped_prompts`), which read them as stored where the dimensions
    /// are whole 128-wide scale blocks.
    pub fn pick(
        grouped_prompts: bool,
        hidden: usize,
        inter: usize,
        experts: usize,
        top_k: usize,
    ) -> Self {
        match grouped_prompts
            && hidden.is_multiple_of(128)
            && inter.is_multiple_of(128)
            && experts > 0
        {
            true => ExpertWork::Routed { experts, top_k },
            false => ExpertWork::Whole,
        }
    }

    /// Rows of a `rows`-row FP8 matrix of `slot` its work buffer holds.
    fn rows(self, slot: Slot, rows: usize) -> usize {
        match (slot, self) {
            (Slot::Mat, _) | (_, ExpertWork::Whole) => rows,
            (_, ExpertWork::Routed { experts, top_k }) => rows / experts * top_k,
        }
    }
}

/// The bf16 work buffers (`None` for a slot no FP8 matrix uses), what the
/// expert ones hold, and the indices 0..top_k that read packed expert slabs.
#[derive(Default)]
pub(super) struct Fp8Work {
    experts: ExpertWork,
    mat: Option<DBuf>,
    gate_up: Option<DBuf>,
    down: Option<DBuf>,
    places: Option<DBuf>,
}

impl Fp8Work {
    /// Buffers for the largest FP8 matrix of each slot in `layers`, the
    /// experts' sized by `experts`; `top_k` routed experts per token.
    pub fn new(dev: &Device, layers: &[DLayer], experts: ExpertWork, top_k: usize) -> Result<Self> {
        let mut most = [0usize; 3];
        let mut see = |m: &DevMat, slot: Slot| {
            if m.fp8().is_some() {
                let n = &mut most[slot as usize];
                *n = (*n).max(experts.rows(slot, m.rows) * m.cols * B);
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
        let places = match most[Slot::GateUp as usize] + most[Slot::Down as usize] {
            0 => None,
            _ => {
                let buf = dev.alloc(top_k * 4)?;
                dev.htod(buf.ptr(), &(0..top_k as i32).collect::<Vec<_>>())?;
                Some(buf)
            }
        };
        Ok(Fp8Work {
            experts,
            mat: alloc(most[Slot::Mat as usize])?,
            gate_up: alloc(most[Slot::GateUp as usize])?,
            down: alloc(most[Slot::Down as usize])?,
            places,
        })
    }

    /// Device bytes of the work buffers.
    pub fn bytes(&self) -> usize {
        [&self.mat, &self.gate_up, &self.down, &self.places]
            .iter()
            .map(|b| b.as_ref().map_or(0, DBuf::bytes))
            .sum()
    }

    fn slot(&self, slot: Slot) -> u64 {
        match slot {
            Slot::Mat => &self.mat,
            Slot::GateUp => &self.gate_up,
            Slot::Down => &self.down,
        }
        .as_ref()
        .expect("a work buffer for every FP8 slot (Fp8Work::new)")
        .ptr()
    }
}

impl GpuModel {
    /// How much of a layer's FP8 experts a pass may need dequantized (asked
    /// once, when the work buffers are sized): only
    /// the routed slabs of one-token passes where every longer pass takes
    /// the grouped kernels, which read FP8 as stored (`moe_grouped_device`:
    /// split cuBLAS prompt GEMMs, the fast prompt path and grouped experts,
    /// dimensions in whole 128-wide scale blocks).
    pub(super) fn fp8_expert_work(&self) -> ExpertWork {
        let (experts, top_k, inter, _) = super::mlp_dims(&self.cfg);
        let grouped = self.opts.fast_prefill
            && self.gemm == crate::gpu::options::GemmPath::CublasSplit
            && self.opts.grouped_moe;
        ExpertWork::pick(grouped, self.cfg.hidden_size, inter, experts, top_k)
    }

    /// The address of `w`'s bf16 elements: its own, or for a block-FP8
    /// matrix a copy dequantized into `slot`'s work buffer.
    pub(super) fn bf16_weights(&self, w: &DevMat, slot: Slot) -> Result<u64> {
        if let (ExpertWork::Routed { .. }, Slot::GateUp | Slot::Down) =
            (self.fp8_work.experts, slot)
            && w.fp8().is_some()
        {
            anyhow::bail!(
                "FP8 experts dequantized whole, but their work buffers hold routed slabs only"
            );
        }
        self.dequantize(w, slot, None)
    }

    /// The routed experts `idx[0..k]` (device i32s) of an expert tensor of
    /// `slab_rows` rows per expert, as bf16: the tensor and `idx` as they are,
    /// or for block-FP8 experts their `k` slabs dequantized packed into
    /// `slot`'s work buffer and the indices 0..k that read them.
    pub(super) fn bf16_expert_slabs(
        &self,
        w: &DevMat,
        slot: Slot,
        idx: u64,
        k: usize,
        slab_rows: usize,
    ) -> Result<(u64, u64)> {
        if w.fp8().is_none() {
            return Ok((w.buf.ptr(), idx));
        }
        let places = self
            .fp8_work
            .places
            .as_ref()
            .expect("expert places with FP8 experts");
        Ok((
            self.dequantize(w, slot, Some((idx, k, slab_rows)))?,
            places.ptr(),
        ))
    }

    /// `fp8_dequant` of `w` into `slot`'s buffer (`w`'s own address for a
    /// bf16 matrix): whole, or slabs `idx[0..n]` of `slab_rows` rows packed.
    fn dequantize(
        &self,
        w: &DevMat,
        slot: Slot,
        slabs: Option<(u64, usize, usize)>,
    ) -> Result<u64> {
        let Some((q, s)) = w.fp8() else {
            return Ok(w.buf.ptr());
        };
        let out = self.fp8_work.slot(slot);
        let (idx, n, rows) = slabs.unwrap_or((0, 1, w.rows));
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
            Launch::pdl((blocks, n as u32, 1), (256, 1, 1), 0),
            dptr(q),
            dptr(s),
            dptr(idx),
            i(rows),
            i(w.cols),
            i(slabs.is_some() as usize),
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
                        + g.in_proj_ab.as_ref().map_or(0, DevMat::device_bytes)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expert_work_buffers_hold_what_the_paths_dequantize() {
        // Qwen3.6-35B-A3B: hidden 2048, 256 experts of 512, top 8.
        let routed = ExpertWork::pick(true, 2048, 512, 256, 8);
        assert_eq!(
            routed,
            ExpertWork::Routed {
                experts: 256,
                top_k: 8
            }
        );
        // gate/up: 8 slabs of 1,024 rows (33.6 MB at 2,048 columns) instead
        // of 262,144 rows (1.07 GB); projections keep their whole size.
        assert_eq!(routed.rows(Slot::GateUp, 256 * 1024), 8 * 1024);
        assert_eq!(routed.rows(Slot::Down, 256 * 2048), 8 * 2048);
        assert_eq!(routed.rows(Slot::Mat, 8192), 8192);
        // Whole tensors without the grouped kernels, off the scale grid, or
        // for a dense model.
        for w in [
            ExpertWork::pick(false, 2048, 512, 256, 8),
            ExpertWork::pick(true, 2000, 512, 256, 8),
            ExpertWork::pick(true, 2048, 520, 256, 8),
            ExpertWork::pick(true, 2048, 512, 0, 0),
        ] {
            assert_eq!(w, ExpertWork::Whole);
            assert_eq!(w.rows(Slot::GateUp, 256 * 1024), 256 * 1024);
        }
    }
}
