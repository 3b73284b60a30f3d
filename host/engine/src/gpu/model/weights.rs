//! Putting a model's weights on the device: uploaded from a checkpoint
//! ([`GpuModel::new`]: fused per-layer projections, contiguous experts) or
//! generated there from a seed ([`GpuModel::synthetic`]). Each layer kind
//! lays out its own weights (`upload`, `synthetic` in its module); this file
//! holds the helpers they share and refuses geometries the kernels cannot run.

use super::attention::AttnLayer;
use super::embed::EmbedHead;
use super::gdn::GdnLayer;
use super::mlp::DenseLayer;
use super::moe::MoeLayer;
use super::{B, DBuf, DLayer, Device, F, GpuModel, LayerMixer, LayerMlp, mlp_dims};
use crate::config::{LayerKind, MlpConfig, ModelConfig};
use crate::fp8;
use crate::gpu::dptr;
use crate::gpu::kernels::{self, Launch};
use crate::gpu::options::GpuOptions;
use crate::weights::{Mixer, Mlp, Weights};
use anyhow::{Result, bail};

/// A matrix on the device, row-major `[rows, cols]`: bf16, or block-FP8
/// (E4M3 bytes and f32 scales `[rows / 128, ceil(cols / 128)]`, kernels/fp8.h)
/// where an FP8 checkpoint's matrix is kept quantized.
pub(super) struct DevMat {
    /// The bf16 elements, or the E4M3 bytes when `scales` is set.
    pub buf: DBuf,
    pub rows: usize,
    pub cols: usize,
    pub scales: Option<DBuf>,
}

/// A matrix's weights as kernels read them: bf16 elements, or block-FP8
/// E4M3 bytes and their scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MatWeights {
    Bf16(u64),
    Fp8 { q: u64, s: u64 },
}

impl MatWeights {
    /// The address of the elements (bf16 values or E4M3 bytes).
    pub fn ptr(self) -> u64 {
        match self {
            MatWeights::Bf16(w) => w,
            MatWeights::Fp8 { q, .. } => q,
        }
    }
}

impl DevMat {
    pub fn weights(&self) -> MatWeights {
        match self.fp8() {
            Some((q, s)) => MatWeights::Fp8 { q, s },
            None => MatWeights::Bf16(self.buf.ptr()),
        }
    }

    /// (bytes, scales) of a block-FP8 matrix.
    pub fn fp8(&self) -> Option<(u64, u64)> {
        self.scales.as_ref().map(|s| (self.buf.ptr(), s.ptr()))
    }

    /// The bf16 elements' address; a block-FP8 matrix has none (kernels read
    /// it natively or through [`GpuModel::bf16_weights`]).
    pub fn bf16(&self) -> u64 {
        assert!(self.scales.is_none(), "a block-FP8 matrix read as bf16");
        self.buf.ptr()
    }

    /// Device bytes (weights and scales).
    pub fn device_bytes(&self) -> usize {
        self.buf.bytes() + self.scales.as_ref().map_or(0, DBuf::bytes)
    }
}

/// Uploads host tensors.
pub(super) struct Upload<'a> {
    pub dev: &'a Device,
    /// Keep block-FP8 matrices quantized (`QWASI_FP8=resident`).
    pub fp8: bool,
}

impl Upload<'_> {
    pub fn mat(&self, m: &crate::tensor::Mat) -> Result<DevMat> {
        self.cat(&[m])
    }

    /// Whether matrices stacked in this order stay block-FP8 on the device:
    /// all FP8 in whole 128-row blocks (so their scale rows stack too), with
    /// 16-byte rows (the native kernels' loads).
    pub fn keeps_fp8(&self, ms: &[&crate::tensor::Mat]) -> bool {
        self.fp8
            && ms
                .iter()
                .all(|m| m.cols.is_multiple_of(fp8::BLOCK) && m.fp8_blocks().is_some())
    }

    /// Matrices of the same width stacked into one (one GEMV / GEMM for all):
    /// block-FP8 where [`Upload::keeps_fp8`], bf16 otherwise (a stack that
    /// mixes FP8 and BF16 matrices, such as the GDN's in projection, is bf16).
    pub fn cat(&self, ms: &[&crate::tensor::Mat]) -> Result<DevMat> {
        let cols = ms[0].cols;
        let rows: usize = ms.iter().map(|m| m.rows).sum();
        assert!(ms.iter().all(|m| m.cols == cols));
        if self.keeps_fp8(ms) {
            let cb = cols.div_ceil(fp8::BLOCK);
            let buf = self.dev.alloc(rows * cols)?;
            let scales = self.dev.alloc(rows / fp8::BLOCK * cb * F)?;
            let (mut off, mut soff) = (0, 0);
            for m in ms {
                let (q, s) = m.fp8_blocks().expect("checked by keeps_fp8");
                self.dev.htod(buf.at(off), q)?;
                self.dev.htod(scales.at(soff), s)?;
                (off, soff) = (off + q.len(), soff + s.len() * F);
            }
            return Ok(DevMat {
                buf,
                rows,
                cols,
                scales: Some(scales),
            });
        }
        let buf = self.dev.alloc(rows * cols * B)?;
        let mut off = 0;
        for m in ms {
            self.dev.htod(buf.at(off), &m.host_bf16())?;
            off += m.rows * cols * B;
        }
        Ok(DevMat {
            buf,
            rows,
            cols,
            scales: None,
        })
    }

    pub fn f32s(&self, v: &[f32]) -> Result<DBuf> {
        self.dev.upload(v)
    }
}

/// Seeded random weights generated on the device, one seed per tensor in
/// the order they are drawn.
pub(super) struct Synth<'a> {
    dev: &'a Device,
    seed: u64,
    counter: u64,
    /// Generate the matrices a block-FP8 checkpoint quantizes in FP8
    /// (a preset with `quantization`, `QWASI_FP8=resident`).
    fp8: bool,
}

impl Synth<'_> {
    fn next_seed(&mut self) -> u64 {
        self.counter += 1;
        self.seed ^ self.counter.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    /// Scale of a uniform with standard deviation 1/sqrt(cols).
    pub fn unif(cols: usize) -> f32 {
        (3.0f32).sqrt() / (cols as f32).sqrt()
    }

    pub fn bf16(&mut self, n: usize, scale: f32) -> Result<DBuf> {
        let s = self.next_seed();
        let b = self.dev.alloc(n * B)?;
        fill_uniform(self.dev, b.ptr(), n, s, scale, 0.0, true)?;
        Ok(b)
    }

    pub fn f32s(&mut self, n: usize, scale: f32, offset: f32) -> Result<DBuf> {
        let s = self.next_seed();
        let b = self.dev.alloc(n * F)?;
        fill_uniform(self.dev, b.ptr(), n, s, scale, offset, false)?;
        Ok(b)
    }

    pub fn dmat(&mut self, rows: usize, cols: usize) -> Result<DevMat> {
        Ok(DevMat {
            buf: self.bf16(rows * cols, Self::unif(cols))?,
            rows,
            cols,
            scales: None,
        })
    }

    /// Whether matrices of these `(rows, cols)` are generated block-FP8
    /// (whole 128x128 blocks, an FP8 model).
    pub fn fp8_fits(&self, dims: &[(usize, usize)]) -> bool {
        self.fp8
            && dims
                .iter()
                .all(|&(r, c)| r.is_multiple_of(fp8::BLOCK) && c.is_multiple_of(fp8::BLOCK))
    }

    /// A matrix a checkpoint would quantize: block-FP8 where [`Synth::fp8_fits`]
    /// (`fp8_fits` for the whole group when `group` is given), else bf16.
    /// FP8: codes of uniform values (`fill_uniform_fp8`) times block scales
    /// within 25% of `unif(cols) / 448`, so the weights spread as `dmat`'s.
    pub fn qmat(&mut self, rows: usize, cols: usize, group: Option<bool>) -> Result<DevMat> {
        if !group.unwrap_or_else(|| self.fp8_fits(&[(rows, cols)])) {
            return self.dmat(rows, cols);
        }
        let n = rows * cols;
        let buf = self.dev.alloc(n)?;
        let seed = self.next_seed();
        kernels::fill_uniform_fp8(
            self.dev,
            Launch::new(
                (n.div_ceil(256).min(65_535 * 16) as u32, 1, 1),
                (256, 1, 1),
                0,
            ),
            dptr(buf.ptr()),
            n as i64,
            seed,
        )?;
        let scale = Self::unif(cols) / 448.0;
        let blocks = rows / fp8::BLOCK * cols / fp8::BLOCK;
        Ok(DevMat {
            buf,
            rows,
            cols,
            scales: Some(self.f32s(blocks, 0.25 * scale, scale)?),
        })
    }

    /// A stack whose first `fp8_rows` rows a block-FP8 checkpoint quantizes
    /// and whose other rows it keeps BF16 (the GDN in projection: qkv | z
    /// FP8, a | b BF16): the bf16 stack; in an FP8 model its FP8 rows as
    /// stored and its bf16 rows apart (what `GdnLayer::upload` holds). The
    /// values are drawn in the same order either way.
    pub fn mixed_stack(
        &mut self,
        fp8_rows: usize,
        rows: usize,
        cols: usize,
    ) -> Result<(DevMat, Option<DevMat>)> {
        if !self.fp8_fits(&[(fp8_rows, cols)]) {
            return Ok((self.dmat(rows, cols)?, None));
        }
        let q8 = self.qmat(fp8_rows, cols, Some(true))?;
        let tail_rows = rows - fp8_rows;
        let buf = self.dev.alloc(tail_rows * cols * B)?;
        let seed = self.next_seed();
        fill_uniform(
            self.dev,
            buf.ptr(),
            tail_rows * cols,
            seed,
            Self::unif(cols),
            0.0,
            true,
        )?;
        let tail = DevMat {
            buf,
            rows: tail_rows,
            cols,
            scales: None,
        };
        Ok((q8, Some(tail)))
    }

    /// GDN decay logs (`fill_alog_f32`).
    pub fn alog(&mut self, nv: usize) -> Result<DBuf> {
        let a_log = self.dev.alloc(nv * F)?;
        let seed = self.next_seed();
        kernels::fill_alog_f32(
            self.dev,
            Launch::new(((nv as u32).div_ceil(256), 1, 1), (256, 1, 1), 0),
            dptr(a_log.ptr()),
            nv as i64,
            seed,
        )?;
        Ok(a_log)
    }
}

/// `n` seeded uniform values `offset + scale * u`, u in [-1, 1), at `ptr`:
/// bf16 (`fill_uniform_bf16`) or f32 (`fill_uniform_f32`).
pub(super) fn fill_uniform(
    dev: &Device,
    ptr: u64,
    n: usize,
    seed: u64,
    scale: f32,
    offset: f32,
    bf16: bool,
) -> Result<()> {
    (if bf16 {
        kernels::fill_uniform_bf16
    } else {
        kernels::fill_uniform_f32
    })(
        dev,
        Launch::new(
            (n.div_ceil(256).min(65_535 * 16) as u32, 1, 1),
            (256, 1, 1),
            0,
        ),
        dptr(ptr),
        n as i64,
        seed,
        scale,
        offset,
    )
}

/// What the load message adds for a model with FP8 work buffers.
fn work_note(work: usize) -> String {
    if work == 0 {
        return String::new();
    }
    format!(
        " (block-FP8 kept quantized, + {:.2} GB of bf16 work buffers)",
        work as f64 / 1e9
    )
}

/// Largest expert count and top-k of the MoE kernels (`MOE_MAXE`, `MOE_MAXK` in kernels/compat.h).
const MOE_MAXE: usize = 1024;
const MOE_MAXK: usize = 32;

/// Tokens per thread and longest conv kernel of `conv_silu_tokens`
/// (`CONV_TPT`, `CONV_MAXK` in kernels/gdn.cu).
pub(super) const CONV_TPT: usize = 16;
const CONV_MAXK: usize = 8;

/// Refuses geometries the kernels do not handle, before anything is allocated.
fn check_supported(cfg: &ModelConfig) -> Result<()> {
    if !(1..=CONV_MAXK).contains(&cfg.linear_conv_kernel) {
        bail!(
            "the GPU backend handles GDN conv kernels of 1 to {CONV_MAXK} taps; \
             this model has {} (use --backend cpu)",
            cfg.linear_conv_kernel
        );
    }
    // The decode step's delta rule (kernels/decode_gdn.cu: dec_gdn_step) keeps a
    // key head's state rows in 4 x 32 threads and a value head's columns in
    // one block of at most 512 threads: 128 columns (its `red` rows hold 128).
    let (dk, dv) = (cfg.linear_key_head_dim, cfg.linear_value_head_dim);
    let heads_ok = cfg.linear_num_key_heads > 0
        && cfg
            .linear_num_value_heads
            .is_multiple_of(cfg.linear_num_key_heads);
    if cfg.layer_kinds.contains(&LayerKind::Linear) && (dk > 128 || dv > 128 || !heads_ok) {
        bail!(
            "the GPU backend handles GDN key and value heads of up to 128, \
             a whole number of value heads per key head; this model has {dk} and {dv}, \
             {} value heads for {} key heads (use --backend cpu)",
            cfg.linear_num_value_heads,
            cfg.linear_num_key_heads
        );
    }
    let (e, k, _, _) = mlp_dims(cfg);
    if e > MOE_MAXE || k > MOE_MAXK {
        bail!(
            "the GPU backend handles up to {MOE_MAXE} experts and top-{MOE_MAXK} routing; \
             this model has {e} experts, top-{k} (use --backend cpu)"
        );
    }
    Ok(())
}

impl GpuModel {
    /// Uploads `weights` to GPU 0 (fused per-layer projections, contiguous
    /// experts), with the options of the environment ([`GpuOptions::from_env`]).
    pub fn new(cfg: ModelConfig, w: &Weights) -> Result<Self> {
        Self::with_options(cfg, w, GpuOptions::from_env()?)
    }

    /// [`GpuModel::new`] with these options.
    pub fn with_options(cfg: ModelConfig, w: &Weights, opts: GpuOptions) -> Result<Self> {
        check_supported(&cfg)?;
        let dev = Device::new(&opts.device)?;
        let total = w.bytes_total();
        eprintln!(
            "[cuda] {}: uploading {:.2} GB of weights",
            dev.name,
            total as f64 / 1e9
        );
        let t0 = std::time::Instant::now();
        let up = Upload {
            dev: &dev,
            fp8: opts.fp8_resident,
        };
        let mut layers = Vec::with_capacity(w.layers.len());
        for (li, l) in w.layers.iter().enumerate() {
            let mixer = match &l.mixer {
                Mixer::Gdn(g) => LayerMixer::Gdn(GdnLayer::upload(&up, g)?),
                Mixer::Attention(a) => LayerMixer::Attn(AttnLayer::upload(&up, a)?),
            };
            let mlp = match &l.mlp {
                Mlp::Moe {
                    router,
                    experts,
                    shared,
                    shared_gate,
                } => LayerMlp::Moe(MoeLayer::upload(&up, router, experts, shared, shared_gate)?),
                Mlp::Dense(d) => LayerMlp::Dense(DenseLayer::upload(&up, d)?),
            };
            layers.push(DLayer {
                input_norm: up.f32s(&l.input_norm)?,
                post_norm: up.f32s(&l.post_norm)?,
                mixer,
                mlp,
            });
            if (li + 1) % 10 == 0 {
                eprintln!("[cuda] uploaded {} / {} layers", li + 1, w.layers.len());
            }
        }
        let head = EmbedHead::upload(&up, w)?;
        let m = Self::assemble(dev, cfg, head, layers, opts)?;
        let (weights, work) = m.weight_bytes();
        eprintln!(
            "[cuda] weights on the GPU in {:.1} s: {:.2} GB{}",
            t0.elapsed().as_secs_f64(),
            weights as f64 / 1e9,
            work_note(work)
        );
        Ok(m)
    }

    /// A model of `cfg`'s geometry with seeded random bf16 weights generated on
    /// the GPU (no host copy): for speed and long-context runs without a checkpoint.
    pub fn synthetic(cfg: ModelConfig, seed: u64) -> Result<Self> {
        check_supported(&cfg)?;
        let opts = GpuOptions::from_env()?;
        let dev = Device::new(&opts.device)?;
        let h = cfg.hidden_size;
        let t0 = std::time::Instant::now();
        let mut s = Synth {
            dev: &dev,
            seed,
            counter: 0,
            fp8: cfg.quantization.is_some() && opts.fp8_resident,
        };
        let mut layers = Vec::new();
        for kind in cfg.layer_kinds.clone() {
            let mixer = match kind {
                LayerKind::Linear => LayerMixer::Gdn(GdnLayer::synthetic(&mut s, &cfg)?),
                LayerKind::Full => LayerMixer::Attn(AttnLayer::synthetic(&mut s, &cfg)?),
            };
            let mlp = match cfg.mlp {
                MlpConfig::Moe { .. } => LayerMlp::Moe(MoeLayer::synthetic(&mut s, &cfg)?),
                MlpConfig::Dense { intermediate } => {
                    LayerMlp::Dense(DenseLayer::synthetic(&mut s, h, intermediate)?)
                }
            };
            layers.push(DLayer {
                input_norm: s.f32s(h, 0.1, 1.0)?,
                post_norm: s.f32s(h, 0.1, 1.0)?,
                mixer,
                mlp,
            });
        }
        let head = EmbedHead::synthetic(&mut s, &cfg)?;
        dev.sync()?;
        let (free, total) = dev.mem_info();
        eprintln!(
            "[cuda] {}: synthetic {}-layer model generated in {:.1} s; {:.1} GB of {:.1} GB free",
            dev.name,
            cfg.num_layers(),
            t0.elapsed().as_secs_f64(),
            free as f64 / 1e9,
            total as f64 / 1e9
        );
        let m = Self::assemble(dev, cfg, head, layers, opts)?;
        let (weights, work) = m.weight_bytes();
        eprintln!(
            "[cuda] {:.2} GB of weights{}",
            weights as f64 / 1e9,
            work_note(work)
        );
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometries_the_kernels_cannot_run_are_refused_before_any_work() {
        let mut cfg = crate::presets::qwen36_35b_a3b();
        assert!(check_supported(&cfg).is_ok());
        // conv_silu / conv_silu_tokens keep at most 8 taps in registers.
        for taps in [0, 9] {
            cfg.linear_conv_kernel = taps;
            let err = check_supported(&cfg).unwrap_err().to_string();
            assert!(err.contains("conv kernels of 1 to 8 taps"), "{err}");
        }
        cfg.linear_conv_kernel = 8;
        assert!(check_supported(&cfg).is_ok());
        // dec_gdn_step: key and value heads up to 128, whole value heads
        // per key head.
        for (dk, dv, nv, ok) in [
            (128, 128, 32, true),
            (64, 96, 32, true),
            (128, 256, 32, false),
            (256, 128, 32, false),
            (128, 512, 32, false),
            (128, 128, 24, false),
        ] {
            let mut c = cfg.clone();
            (c.linear_key_head_dim, c.linear_value_head_dim) = (dk, dv);
            c.linear_num_value_heads = nv;
            let got = check_supported(&c);
            assert_eq!(got.is_ok(), ok, "{dk} {dv} {nv}: {got:?}");
            if let Err(e) = got {
                assert!(
                    e.to_string()
                        .contains("GDN key and value heads of up to 128"),
                    "{e}"
                );
            }
        }
        cfg.mlp = MlpConfig::Moe {
            num_experts: 2048,
            top_k: 8,
            intermediate: 512,
            shared_intermediate: 512,
        };
        assert!(check_supported(&cfg).is_err());
    }
}
