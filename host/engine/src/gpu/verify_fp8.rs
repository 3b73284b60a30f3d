//! Block-FP8 weights kept quantized on the device (the default) against the
//! same checkpoint dequantized at upload (`QWASI_FP8=dequantize`): both must
//! give the same greedy tokens, with logits within [`FP8_LOGIT_TOL`], through
//! every path that reads the weights: prompt passes (matrices dequantized
//! into work buffers before the usual GEMMs), the fused decode step (the
//! native FP8 GEMVs), single tokens through the prompt kernels
//! (`QWASI_DECODE=unfused`: only the routed experts dequantized) and batched
//! decode steps (the few-row kernels). Both models' device bytes of weights
//! are reported, and where the device has them the FP8-activation
//! projections of `--prefill-precision fp8` are checked on their own
//! (`verify_fp8_gemm.rs`).

use super::model::{GpuModel, GpuSequence};
use super::options::GpuOptions;
use super::verify_fp8_gemm::{Fp8GemmReport, fp8_gemm_check};
use crate::backend::{Backend, BatchItem, StepOut, Want};
use crate::model::LoadedModel;
use crate::sampling::argmax;
use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::path::Path;

/// Largest |logit difference| allowed between the two uploads. The weights
/// the kernels use are bit-identical (kernels/fp8.h); what differs is which
/// decode GEMV sums them (the FP8 GEMV streams a row per warp where the bf16
/// path may take the bulk-copy or split-row kernels), so only f32 summation
/// order separates them. That order moves f32 logits by ~1e-5 (1.47e-5 on
/// the H200 at 4bd4da1, 104 of 192 steps bit-identical); a wrong weight
/// moves them by far more than the 1e-4 allowed.
pub const FP8_LOGIT_TOL: f32 = 1e-4;

#[derive(Serialize, Clone, Debug)]
pub struct Fp8Report {
    pub fixture: String,
    /// Device bytes of the weights kept block-FP8, and of its bf16 work buffers.
    pub resident_bytes: usize,
    pub work_bytes: usize,
    /// Device bytes of the weights dequantized at upload.
    pub dequantized_bytes: usize,
    /// Logit vectors compared (prompt passes and decode steps, both decode paths).
    pub steps: usize,
    /// Of those, bit-identical.
    pub identical_steps: usize,
    pub max_dlogit: f32,
    /// Greedy tokens identical everywhere (alone and batched).
    pub tokens_equal: bool,
    /// Batched decode: max |logprob difference| of the greedy tokens.
    pub batched_max_dlogprob: f32,
    /// The FP8-activation projection against its f64 reference (`None`: the
    /// device has no block-scaled FP8 GEMMs).
    pub gemm: Option<Fp8GemmReport>,
    pub pass: bool,
}

/// `None` when the fixture has no block-FP8 weights.
pub fn fp8_resident_check(dir: &Path) -> Result<Option<Fp8Report>> {
    let m = LoadedModel::from_dir(dir)?;
    if !m.weights.mats().iter().any(|x| x.fp8().is_some()) {
        return Ok(None);
    }
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json"))?)
            .with_context(|| format!("{}/expected.json", dir.display()))?;
    let cases: Vec<(Vec<u32>, usize)> = expected["cases"]
        .as_array()
        .context("expected.json: no cases")?
        .iter()
        .map(|c| {
            let prompt = serde_json::from_value(c["prompt_tokens"].clone())?;
            let n = c["generated"].as_array().map_or(0, Vec::len);
            Ok((prompt, n))
        })
        .collect::<Result<_>>()?;
    let base = GpuOptions::from_env()?;
    let mut r = Fp8Report {
        fixture: dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        resident_bytes: 0,
        work_bytes: 0,
        dequantized_bytes: 0,
        steps: 0,
        identical_steps: 0,
        max_dlogit: 0.0,
        tokens_equal: true,
        batched_max_dlogprob: 0.0,
        gemm: None,
        pass: false,
    };
    for fused in [true, false] {
        let load = |resident| {
            let opts = GpuOptions {
                fp8_resident: resident,
                fused_decode: fused,
                ..base.clone()
            };
            GpuModel::with_options(m.config.clone(), &m.weights, opts)
        };
        let (a, b) = (load(true)?, load(false)?);
        (r.resident_bytes, r.work_bytes) = a.weight_bytes();
        r.dequantized_bytes = b.weight_bytes().0;
        if r.work_bytes == 0 {
            bail!("{}: no matrix stayed block-FP8 on the device", r.fixture);
        }
        for (prompt, n) in &cases {
            let (mut sa, mut sb) = (a.new_sequence(), b.new_sequence());
            let (mut la, mut lb) = (a.forward(&mut sa, prompt)?, b.forward(&mut sb, prompt)?);
            for i in 0..*n {
                compare(&mut r, &la, &lb);
                let (ta, tb) = (argmax(&la), argmax(&lb));
                if ta != tb {
                    r.tokens_equal = false;
                    break;
                }
                if i + 1 < *n {
                    (la, lb) = (a.forward(&mut sa, &[ta])?, b.forward(&mut sb, &[tb])?);
                }
            }
        }
        if fused {
            batched(&mut r, &a, &b, &cases)?;
            r.gemm = fp8_gemm_check(&a)?;
        }
    }
    r.pass = r.tokens_equal
        && r.max_dlogit <= FP8_LOGIT_TOL
        && r.batched_max_dlogprob <= FP8_LOGIT_TOL
        && r.gemm.as_ref().is_none_or(|g| g.pass);
    Ok(Some(r))
}

fn compare(r: &mut Fp8Report, a: &[f32], b: &[f32]) {
    let d = a
        .iter()
        .zip(b)
        .map(|(x, y)| {
            if x.is_finite() && y.is_finite() {
                (x - y).abs()
            } else {
                f32::INFINITY
            }
        })
        .fold(0.0, f32::max);
    r.steps += 1;
    r.identical_steps += a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()) as usize;
    r.max_dlogit = r.max_dlogit.max(d);
}

/// Every case's prompt, then its greedy tokens, as the rows of batched
/// steps on both models.
fn batched(
    r: &mut Fp8Report,
    a: &GpuModel,
    b: &GpuModel,
    cases: &[(Vec<u32>, usize)],
) -> Result<()> {
    let n = cases.iter().map(|c| c.1).min().unwrap_or(0).min(8);
    let mut sa: Vec<_> = cases.iter().map(|_| a.new_sequence()).collect();
    let mut sb: Vec<_> = cases.iter().map(|_| b.new_sequence()).collect();
    let mut last: Vec<Option<u32>> = vec![None; cases.len()];
    for _ in 0..n {
        let inputs: Vec<Vec<u32>> = cases
            .iter()
            .zip(&last)
            .map(|((p, _), t)| t.map_or_else(|| p.clone(), |t| vec![t]))
            .collect();
        let oa = greedy_step(a, &mut sa, &inputs)?;
        let ob = greedy_step(b, &mut sb, &inputs)?;
        for (i, ((ta, la), (tb, lb))) in oa.into_iter().zip(ob).enumerate() {
            r.tokens_equal &= ta == tb;
            r.batched_max_dlogprob = r.batched_max_dlogprob.max((la - lb).abs());
            last[i] = Some(ta);
        }
    }
    Ok(())
}

/// One batched step of these rows: each row's greedy token and its logprob.
fn greedy_step(
    m: &GpuModel,
    seqs: &mut [GpuSequence],
    inputs: &[Vec<u32>],
) -> Result<Vec<(u32, f32)>> {
    let mut items: Vec<BatchItem<'_, GpuSequence>> = seqs
        .iter_mut()
        .zip(inputs)
        .map(|(seq, tokens)| BatchItem {
            seq,
            tokens,
            want: Want::Greedy,
            mask: None,
            snapshots: Default::default(),
        })
        .collect();
    m.step(&mut items)
        .into_iter()
        .map(|o| match o? {
            StepOut::Greedy(s) => Ok((s.token, s.logprob)),
            other => bail!("a batched row returned {other:?}"),
        })
        .collect()
}
