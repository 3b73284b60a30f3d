//! `qwasi verify --compare DIR`: the GPU backend against transformers on a
//! full-width, reduced-depth model (`scripts/device/compare_transformers.py`
//! writes DIR: model/, ref.json, logits_<len>.f32 from float32 and, with
//! `--dtype both`, logits_bf16_<len>.f32 from bfloat16 on the same weights).
//!
//! Each case reports KL(transformers f32 || gpu) and, where the bf16
//! reference exists, KL(transformers bf16 || gpu) and the yardstick
//! KL(transformers f32 || transformers bf16): what a bf16 peer loses. The
//! tolerance depends on the prompt precision the model runs
//! (docs/GPU.md "Numerics"): split must stay within [`SPLIT_KL_TOL`] of f32,
//! agree on the last prompt token's top-1 and on every teacher-forced step
//! whose reference margin exceeds 0.1; bf16 within [`BF16_KL_FACTOR`] times
//! the yardstick, its top-1 and teacher-forced agreement reported (bf16
//! logits move by up to ~0.2, so margins of 0.1-0.2 flip, as they do for
//! transformers in bf16).

use super::model::{GemmPath, GpuModel};
use super::options::PrefillPrecision;
use super::verify::kl;
use crate::backend::Backend;
use crate::model::LoadedModel;
use crate::sampling::{argmax, log_softmax};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Largest KL(transformers f32 || gpu) of the split mode (measured: 3e-8 to
/// 9e-8 at 1 to 32K tokens, benchmarks/compare-h200-32k-14a4f1a.json).
pub const SPLIT_KL_TOL: f64 = 1e-2;

/// The bf16 mode's KL(transformers f32 || gpu) may be at most this many
/// times the yardstick KL(transformers f32 || transformers bf16) of the same
/// prompt: no worse than the loss a bf16 peer accepts, up to the spread of
/// a one-prompt estimate (docs/GPU.md "Numerics" says why 2).
pub const BF16_KL_FACTOR: f64 = 2.0;

/// The fp8 mode's KL(transformers f32 || gpu), set before its first
/// measurement: FP8 activations (3 mantissa bits) move logits far more than
/// bf16 rounding does, so the mode is not held to the bf16 yardstick; its
/// exactness is checked where it is defined, each FP8 GEMM against the f64
/// product of its quantized operands (`verify`'s FP8 GEMM check), and this
/// bound only catches a wrong tile, scale or layout, which scrambles logits
/// by nats (docs/GPU.md "Numerics").
pub const FP8_KL_LIMIT: f64 = 0.5;

#[derive(Deserialize)]
struct RefFile {
    layers: usize,
    cases: Vec<RefCase>,
}

#[derive(Deserialize)]
struct RefCase {
    len: usize,
    prompt: Vec<u32>,
    generated: Vec<u32>,
    margins: Vec<f32>,
}

#[derive(Serialize, Clone, Debug)]
pub struct CompareReport {
    pub layers: usize,
    pub prompt_len: usize,
    /// The GPU model's prompt precision (`split`, `bf16` or `fp8`).
    pub prefill_precision: &'static str,
    /// KL(transformers f32 || gpu) at the last prompt token.
    pub kl_ref_gpu: f64,
    /// KL(transformers bf16 || gpu), where the bf16 reference exists.
    pub kl_bf16ref_gpu: Option<f64>,
    /// The yardstick KL(transformers f32 || transformers bf16).
    pub kl_ref_bf16ref: Option<f64>,
    /// Whether transformers bf16 picks transformers f32's top-1.
    pub bf16ref_top1_agree: Option<bool>,
    /// KL(transformers FP8 || gpu) and the fp8 mode's yardstick KL(transformers
    /// f32 || transformers FP8), where a block-FP8 reference ran the
    /// checkpoint natively (`compare_transformers.py --fp8`).
    pub kl_fp8ref_gpu: Option<f64>,
    pub kl_ref_fp8ref: Option<f64>,
    /// The KL this case had to stay within (from the mode's rule).
    pub kl_limit: Option<f64>,
    pub top1_agree: bool,
    /// Max |logprob difference| over transformers' top-8 of the last prompt token.
    pub max_dlogprob_top8: f32,
    /// Teacher-forced greedy steps with transformers margin > 0.1, and how many agree.
    pub decisive_steps: usize,
    pub decisive_agree: usize,
    /// Free-running greedy tokens identical to transformers.
    pub greedy_same_prefix: usize,
    pub greedy_len: usize,
    /// transformers' top-1 margin at the first free-running difference.
    pub greedy_diverged_margin: Option<f32>,
    pub prefill_s: f64,
    pub pass: bool,
}

/// The little-endian f32 logits file at `path`.
pub fn load_logits(path: &Path) -> Result<Vec<f32>> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

/// A transformers reference written by `scripts/device/compare_transformers.py`
/// into a directory, with the GPU model of its weights.
pub struct Comparison {
    /// Decoder layers of the reference model.
    pub layers: usize,
    /// Seconds to load the weights onto the GPU.
    pub load_s: f64,
    /// The model's prefill GEMMs, prompt precision and KV cache precision.
    pub gemm: GemmPath,
    pub prefill: PrefillPrecision,
    pub kv_f32: bool,
    gpu: GpuModel,
    dir: PathBuf,
    cases: Vec<RefCase>,
}

impl Comparison {
    pub fn load(dir: &Path) -> Result<Self> {
        let r: RefFile = serde_json::from_str(&std::fs::read_to_string(dir.join("ref.json"))?)?;
        let t0 = Instant::now();
        let m = LoadedModel::from_dir(&dir.join("model"))?;
        let gpu = GpuModel::new(m.config, &m.weights)?;
        drop(m.weights);
        Ok(Comparison {
            layers: r.layers,
            load_s: t0.elapsed().as_secs_f64(),
            gemm: gpu.gemm,
            prefill: gpu.prefill_precision(),
            kv_f32: gpu.kv_f32,
            gpu,
            dir: dir.to_path_buf(),
            cases: r.cases,
        })
    }

    /// Each reference case compared with the GPU backend, in turn.
    pub fn reports(&self) -> impl Iterator<Item = Result<CompareReport>> + '_ {
        self.cases.iter().map(|c| self.compare(c))
    }

    fn compare(&self, c: &RefCase) -> Result<CompareReport> {
        let gpu = &self.gpu;
        let reference = load_logits(&self.dir.join(format!("logits_{}.f32", c.len)))?;
        let bf16_path = self.dir.join(format!("logits_bf16_{}.f32", c.len));
        let reference_bf16 = if bf16_path.exists() {
            Some(log_softmax(&load_logits(&bf16_path)?))
        } else {
            None
        };
        let fp8_path = self.dir.join(format!("logits_fp8_{}.f32", c.len));
        let reference_fp8 = if fp8_path.exists() {
            Some(log_softmax(&load_logits(&fp8_path)?))
        } else {
            None
        };
        let bf16ref_top1_agree = reference_bf16
            .as_ref()
            .map(|lb| argmax(lb) == argmax(&reference));
        let mut seq = gpu.new_sequence();
        let t1 = Instant::now();
        let mut g = gpu.forward(&mut seq, &c.prompt)?;
        let prefill_s = t1.elapsed().as_secs_f64();
        let (lr, lg) = (log_softmax(&reference), log_softmax(&g));
        let k = kl(&lr, &lg);
        let kl_bf16ref_gpu = reference_bf16.as_ref().map(|lb| kl(lb, &lg));
        let kl_ref_bf16ref = reference_bf16.as_ref().map(|lb| kl(&lr, lb));
        let kl_fp8ref_gpu = reference_fp8.as_ref().map(|lf| kl(lf, &lg));
        let kl_ref_fp8ref = reference_fp8.as_ref().map(|lf| kl(&lr, lf));
        let mut idx: Vec<usize> = (0..lr.len()).collect();
        idx.sort_by(|&a, &b| lr[b].total_cmp(&lr[a]));
        let max_d = idx[..8]
            .iter()
            .map(|&i| (lr[i] - lg[i]).abs())
            .fold(0.0, f32::max);
        let top1 = argmax(&reference) == argmax(&g);
        let (mut steps, mut agree, mut prefix, mut diverged) = (0, 0, 0, false);
        let mut div_margin = None;
        for (i, &tok) in c.generated.iter().enumerate() {
            let same = argmax(&g) == tok;
            if c.margins[i] > 0.1 {
                steps += 1;
                agree += same as usize;
            }
            if !diverged && same {
                prefix += 1;
            } else if !diverged {
                diverged = true;
                div_margin = Some(c.margins[i]);
            }
            if i + 1 < c.generated.len() {
                g = gpu.forward(&mut seq, &[tok])?;
            }
        }
        let kl_limit = match self.prefill {
            PrefillPrecision::Split => Some(SPLIT_KL_TOL),
            PrefillPrecision::Bf16 => kl_ref_bf16ref.map(|y| BF16_KL_FACTOR * y),
            PrefillPrecision::Fp8 => Some(FP8_KL_LIMIT),
        };
        let kl_ok = kl_limit.is_some_and(|l| k <= l);
        let agree_ok = match self.prefill {
            PrefillPrecision::Split => top1 && agree == steps,
            PrefillPrecision::Bf16 | PrefillPrecision::Fp8 => true,
        };
        Ok(CompareReport {
            layers: self.layers,
            prompt_len: c.len,
            prefill_precision: self.prefill.name(),
            kl_ref_gpu: k,
            kl_bf16ref_gpu,
            kl_ref_bf16ref,
            bf16ref_top1_agree,
            kl_fp8ref_gpu,
            kl_ref_fp8ref,
            kl_limit,
            top1_agree: top1,
            max_dlogprob_top8: max_d,
            decisive_steps: steps,
            decisive_agree: agree,
            greedy_same_prefix: prefix,
            greedy_len: c.generated.len(),
            greedy_diverged_margin: div_margin,
            prefill_s,
            pass: kl_ok && agree_ok,
        })
    }
}
