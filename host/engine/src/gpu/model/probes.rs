//! Measurements for the benchmarks: the least bytes a decode step must move
//! (the bandwidth floor), the device's copy bandwidth, one decode GEMV's
//! cost against a plain read of its weights, memory in use and the
//! per-kernel profile.

use super::attention::AttnLayer;
use super::gdn::GdnLayer;
use super::mlp::DenseLayer;
use super::moe::MoeLayer;
use super::{B, F, GpuModel, LayerMixer, LayerMlp, mlp_dims};
use crate::gpu::dptr;
use crate::gpu::kernels::{self, Launch};
use anyhow::{Result, bail};

/// Bytes one decode step must move at a context of `ctx` tokens, by part.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct StepBytes {
    /// Weights read: every dense matrix and norm, the k routed experts of each
    /// MoE layer, the lm_head and one embedding row (block-FP8 matrices as
    /// their E4M3 bytes and scales).
    pub weights: usize,
    /// KV cache read by the attention layers.
    pub kv: usize,
    /// GDN recurrent state read and written.
    pub state: usize,
}

impl StepBytes {
    pub fn total(&self) -> usize {
        self.weights + self.kv + self.state
    }
}

impl GpuModel {
    /// The least traffic of one decode step at context `ctx` (the bandwidth floor).
    pub fn step_bytes(&self, ctx: usize) -> StepBytes {
        let c = &self.cfg;
        let h = c.hidden_size;
        let (e, k, _, _) = mlp_dims(c);
        let mut weights = h * B + self.lm_head().rows * h * B + h * F;
        let mut kv = 0;
        let mut state = 0;
        let kv_row = c.num_key_value_heads * c.head_dim * if self.kv_f32 { F } else { B };
        for l in &self.layers {
            weights += 2 * h * F;
            weights += match &l.mixer {
                LayerMixer::Gdn(GdnLayer {
                    in_proj,
                    in_proj_ab,
                    out_proj,
                    ..
                }) => {
                    state += 2
                        * c.linear_num_value_heads
                        * c.linear_key_head_dim
                        * c.linear_value_head_dim
                        * F;
                    // An FP8 checkpoint's step reads qkv | z as stored and the bf16 a | b rows.
                    let ab = in_proj_ab.as_ref().map_or(0, |m| m.device_bytes());
                    in_proj.device_bytes() + ab + out_proj.device_bytes()
                }
                LayerMixer::Attn(AttnLayer { proj, o_proj, .. }) => {
                    kv += 2 * ctx * kv_row;
                    proj.device_bytes() + o_proj.device_bytes()
                }
            };
            weights += match &l.mlp {
                // The k routed experts' share of the expert tensors
                // (bf16, or E4M3 bytes + block scales).
                LayerMlp::Moe(MoeLayer {
                    input,
                    gate_up,
                    down,
                    shared_down,
                }) => {
                    input.device_bytes()
                        + shared_down.device_bytes()
                        + (gate_up.device_bytes() + down.device_bytes()) / e * k
                }
                LayerMlp::Dense(DenseLayer { gate_up, down }) => {
                    gate_up.device_bytes() + down.device_bytes()
                }
            };
        }
        StepBytes { weights, kv, state }
    }

    /// Device-to-device copy bandwidth (bytes read + written per second) over
    /// `bytes`-sized buffers: the practical ceiling of memory-bound kernels.
    pub fn copy_bandwidth(&self, bytes: usize) -> Result<f64> {
        let d = &self.dev;
        d.bind()?;
        let a = d.alloc_zeroed(bytes)?;
        let b = d.alloc(bytes)?;
        d.dtod(b.ptr(), a.ptr(), bytes)?;
        d.sync()?;
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            d.dtod(b.ptr(), a.ptr(), bytes)?;
            d.sync()?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(2.0 * bytes as f64 / best)
    }

    /// `(used, total)` device memory in bytes (the whole device, this process included).
    pub fn memory_used(&self) -> (usize, usize) {
        let _ = self.dev.bind();
        let (free, total) = self.dev.mem_info();
        (total - free, total)
    }

    /// Starts (`true`) or stops the range an attached profiler collects
    /// (`ncu --profile-from-start off`: only the launches inside it).
    pub fn profiler_range(&self, on: bool) {
        let _ = self.dev.bind();
        self.dev.profiler_range(on)
    }

    /// Per-kernel GPU time since the last call when `QWASI_GPU_PROFILE=1`.
    pub fn take_profile(&self) -> Vec<(&'static str, usize, f64)> {
        let _ = self.dev.bind();
        self.dev.take_profile()
    }
}

impl GpuModel {
    /// What one decode kernel's weight read costs on this device, as a floor
    /// for the decode GEMVs: mean microseconds per launch over every GDN
    /// layer's out projection (distinct buffers, together larger than L2) for
    /// (1) the plainest streaming read of the matrix, (2) the decode GEMV
    /// (`dec_gemv`, residual + sums of squares), each as back-to-back launches
    /// timed as one batch. Returns `(bytes per matrix, read us, gemv us)`.
    pub fn probe_gemv(&self) -> Result<(usize, f64, f64)> {
        let d = &self.dev;
        d.bind()?;
        let mats: Vec<(u64, usize, usize)> = self
            .layers
            .iter()
            .filter_map(|l| match &l.mixer {
                LayerMixer::Gdn(GdnLayer { out_proj, .. }) if out_proj.fp8().is_none() => {
                    Some((out_proj.buf.ptr(), out_proj.rows, out_proj.cols))
                }
                _ => None,
            })
            .collect();
        if mats.is_empty() {
            bail!("the probe needs GDN layers with bf16 out projections (QWASI_FP8=dequantize)");
        }
        let (rows, cols) = (mats[0].1, mats[0].2);
        let bytes = rows * cols * B;
        let sink = d.alloc(1 << 22)?;
        let x = d.alloc_zeroed(cols * F)?;
        let y = d.alloc_zeroed(rows * F)?;
        let ssq = d.alloc(rows.div_ceil(8) * F)?;
        let blocks = (d.sm_count * 8).min((1 << 22) / (256 * 4));
        let time = |f: &dyn Fn(u64) -> Result<()>| -> Result<f64> {
            for &(w, ..) in &mats {
                f(w)?;
            }
            d.sync()?;
            let reps = 5;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                for &(w, ..) in &mats {
                    f(w)?;
                }
            }
            d.sync()?;
            Ok(t.elapsed().as_secs_f64() * 1e6 / (reps * mats.len()) as f64)
        };
        let read = time(&|w| {
            kernels::probe_read(
                d,
                Launch::new((blocks, 1, 1), (256, 1, 1), 0),
                dptr(w),
                (bytes / 16) as i64,
                dptr(sink.ptr()),
            )
        })?;
        let nssq = rows.div_ceil(8);
        let gemv = time(&|w| self.dec_gemv(w, x.ptr(), y.ptr(), rows, cols, ssq.ptr(), nssq))?;
        Ok((bytes, read, gemv))
    }
}
