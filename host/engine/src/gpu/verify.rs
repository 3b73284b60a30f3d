//! Correctness checks of the GPU backend: every reference fixture (transformers'
//! greedy tokens and logprobs, and the CPU reference on the same weights), and a
//! self-consistency smoke test at any geometry with synthetic weights. Each
//! check returns its results; `qwasi verify` prints them.

use super::model::{AttnAgreement, GpuModel, GpuSequence};
pub use super::verify_batch::{
    BATCH_LOGPROB_TOL, BatchReport, MARGIN_TOL, batch_check, batch_check_every,
};
pub use super::verify_compare::{
    BF16_KL_FACTOR, CompareReport, Comparison, SPLIT_KL_TOL, load_logits,
};
pub use super::verify_constrained::{
    ConstrainedReport, MASK_LOGPROB_TOL, constrained_check, verify_fixture_constrained,
};
pub use super::verify_fp8::{FP8_LOGIT_TOL, Fp8Report, fp8_resident_check};
pub use super::verify_fp8_gemm::{FP8_GEMM_TOL, Fp8GemmReport};
pub use super::verify_pass_snapshots::{PassSnapshotReport, pass_snapshots_check};
pub use super::verify_weighted::{DRAW_LOGPROB_TOL, LSE_TOL, WeightedReport, weighted_check};
use crate::backend::Backend;
use crate::cpu::CpuModel;
use crate::generate::{GenerateRequest, generate};
use crate::model::LoadedModel;
use crate::sampling::{
    RowRead, SamplingParams, TOP_CANDIDATES, TopLogits, WEIGHT_BLOCK, Weighting, argmax,
    heavy_count, log_softmax, top_logits, weight_blocks,
};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Deserialize)]
struct Expected {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    prompt_tokens: Vec<u32>,
    generated: Vec<u32>,
    steps: Vec<Step>,
}

#[derive(Deserialize)]
struct Step {
    token: u32,
    #[allow(dead_code)]
    logprob: f32,
    top: Vec<(u32, f32)>,
    margin: f32,
}

/// Thresholds of a PASS.
pub struct Tolerances {
    /// Steps whose reference top-1 margin (logits) exceeds this must agree.
    pub margin: f32,
    /// Max |logprob difference| of the first token's top-8 vs transformers.
    pub first_logprob: f32,
    /// Max KL(cpu || gpu) over the teacher-forced steps.
    pub kl: f64,
}

impl Default for Tolerances {
    fn default() -> Self {
        Tolerances {
            margin: 0.1,
            first_logprob: 0.05,
            kl: 5e-3,
        }
    }
}

#[derive(Serialize, Clone, Debug)]
pub struct CaseReport {
    pub fixture: String,
    pub case: String,
    pub prompt_len: usize,
    /// Teacher-forced steps (reference tokens fed back) with margin > tol.margin.
    pub decisive_steps: usize,
    pub decisive_agree: usize,
    /// First token: max |gpu - transformers| over transformers' top-8 logprobs.
    pub first_max_dlogprob_hf: f32,
    /// First token: max |gpu - cpu| logprob over the whole vocabulary.
    pub first_max_dlogprob_cpu: f32,
    pub first_kl_cpu_gpu: f64,
    pub max_kl_cpu_gpu: f64,
    /// Free-running greedy generation: tokens identical to transformers' before the first difference.
    pub greedy_same_prefix: usize,
    pub greedy_len: usize,
    /// Reference margin at the first greedy difference, if any.
    pub greedy_diverged_margin: Option<f32>,
    pub pass: bool,
}

pub(super) fn kl(p_log: &[f32], q_log: &[f32]) -> f64 {
    p_log
        .iter()
        .zip(q_log)
        .map(|(&p, &q)| {
            let pe = (p as f64).exp();
            if pe > 0.0 {
                pe * (p as f64 - q as f64)
            } else {
                0.0
            }
        })
        .sum::<f64>()
        .max(0.0)
}

/// Fixture directories (those holding an `expected.json`) under `root`, sorted.
pub fn fixture_dirs(root: &Path) -> Result<Vec<PathBuf>> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .with_context(|| format!("cannot read fixtures in {}", root.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("expected.json").exists())
        .collect();
    dirs.sort();
    Ok(dirs)
}

/// Runs every case of one fixture on the GPU and the CPU reference.
pub fn verify_fixture(dir: &Path, tol: &Tolerances) -> Result<Vec<CaseReport>> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let m = LoadedModel::from_dir(dir)?;
    let expected: Expected =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json"))?)
            .with_context(|| format!("{}/expected.json", dir.display()))?;
    let gpu = GpuModel::new(m.config.clone(), &m.weights)?;
    let cpu = CpuModel::new(m.config, m.weights);
    let mut out = Vec::new();
    for case in &expected.cases {
        let mut gs = gpu.new_sequence();
        let mut cs = cpu.new_sequence();
        let mut g = gpu.forward(&mut gs, &case.prompt_tokens)?;
        let mut c = cpu.forward(&mut cs, &case.prompt_tokens)?;
        let mut r = CaseReport {
            fixture: name.clone(),
            case: case.name.clone(),
            prompt_len: case.prompt_tokens.len(),
            decisive_steps: 0,
            decisive_agree: 0,
            first_max_dlogprob_hf: 0.0,
            first_max_dlogprob_cpu: 0.0,
            first_kl_cpu_gpu: 0.0,
            max_kl_cpu_gpu: 0.0,
            greedy_same_prefix: 0,
            greedy_len: case.generated.len(),
            greedy_diverged_margin: None,
            pass: false,
        };
        for (i, step) in case.steps.iter().enumerate() {
            if g.iter().any(|v| !v.is_finite()) {
                anyhow::bail!("{name}/{}: non-finite GPU logits at step {i}", case.name);
            }
            let lg = log_softmax(&g);
            let lc = log_softmax(&c);
            let k = kl(&lc, &lg);
            r.max_kl_cpu_gpu = r.max_kl_cpu_gpu.max(k);
            if i == 0 {
                r.first_kl_cpu_gpu = k;
                r.first_max_dlogprob_hf = step
                    .top
                    .iter()
                    .map(|&(id, want)| (lg[id as usize] - want).abs())
                    .fold(0.0, f32::max);
                r.first_max_dlogprob_cpu = lg
                    .iter()
                    .zip(&lc)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
            }
            if step.margin > tol.margin {
                r.decisive_steps += 1;
                if argmax(&g) == step.token {
                    r.decisive_agree += 1;
                }
            }
            if i + 1 < case.steps.len() {
                g = gpu.forward(&mut gs, &[step.token])?;
                c = cpu.forward(&mut cs, &[step.token])?;
            }
        }
        let req = GenerateRequest {
            prompt: case.prompt_tokens.clone(),
            max_tokens: case.generated.len(),
            stop_token_ids: vec![],
            ignore_eos: true,
            sampling: SamplingParams::default(),
        };
        let res = generate(&gpu, &req, |_, _| ControlFlow::Continue(()))?;
        for (i, (a, b)) in res.tokens.iter().zip(&case.generated).enumerate() {
            if a != b {
                r.greedy_diverged_margin = Some(case.steps[i].margin);
                break;
            }
            r.greedy_same_prefix += 1;
        }
        r.pass = r.decisive_agree == r.decisive_steps
            && r.first_max_dlogprob_hf <= tol.first_logprob
            && r.max_kl_cpu_gpu <= tol.kl
            && r.greedy_diverged_margin.is_none_or(|m| m <= tol.margin);
        out.push(r);
    }
    Ok(out)
}

/// Every case's prompt of one fixture decoded batched against alone
/// ([`super::verify_batch`]), as many tokens as the fixture's greedy runs.
pub fn verify_fixture_batch(dir: &Path) -> Result<BatchReport> {
    let (gpu, prompts, n) = fixture_prompts(dir)?;
    batch_check(&gpu, &prompts, n)
}

/// The weighted rows of batched steps over one fixture's prompts
/// ([`super::verify_weighted`]), as many tokens as its greedy runs.
pub fn verify_fixture_weighted(dir: &Path) -> Result<WeightedReport> {
    let (gpu, prompts, n) = fixture_prompts(dir)?;
    weighted_check(&gpu, &prompts, n)
}

/// One fixture's GPU model, its cases' prompts, and the tokens its longest
/// greedy run holds (at least 8).
fn fixture_prompts(dir: &Path) -> Result<(GpuModel, Vec<Vec<u32>>, usize)> {
    let m = LoadedModel::from_dir(dir)?;
    let expected: Expected =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json"))?)
            .with_context(|| format!("{}/expected.json", dir.display()))?;
    let gpu = GpuModel::new(m.config.clone(), &m.weights)?;
    let prompts: Vec<Vec<u32>> = expected
        .cases
        .iter()
        .map(|c| c.prompt_tokens.clone())
        .collect();
    let n = expected
        .cases
        .iter()
        .map(|c| c.generated.len())
        .max()
        .unwrap_or(0)
        .max(8);
    Ok((gpu, prompts, n))
}

#[derive(Serialize, Clone, Debug)]
pub struct SmokeReport {
    pub preset: String,
    pub layers: usize,
    pub prompt_len: usize,
    pub load_s: f64,
    pub prefill_s: f64,
    pub finite: bool,
    /// KL between the last-token distribution of one prefill pass and of a prefill
    /// of all but the last token followed by one decode step (same math, other kernels).
    pub kl_prefill_vs_decode: f64,
    pub top1_prefill_vs_decode_agree: bool,
    pub generated: Vec<u32>,
    pub decode_tokens_per_s: f64,
    /// A snapshot taken after the prompt, restored, and decoded one token gives
    /// the same logits as the original sequence (max |difference|).
    pub snapshot_restore_max_diff: Option<f32>,
    /// The same through the snapshot's host-memory copy (the prefix cache's
    /// host tier: `demote`, then restore from host memory).
    pub host_restore_max_diff: Option<f32>,
    /// The same through a device snapshot of the state restored from the host
    /// copy (what the prefix cache promotes back to the device after a hit).
    pub promoted_restore_max_diff: Option<f32>,
    /// The same twice more once the original sequence is gone: each restore
    /// takes the snapshot's KV slab itself (no copy) and the first
    /// one's appends past the snapshot leave the second one's logits equal.
    pub adopted_restore_max_diff: Option<f32>,
    /// Whether both of those restores adopted the slab.
    pub adopted_kv: Option<bool>,
    /// A twin sequence read through `forward_top` (prefill, then every decode
    /// step): its 64 largest logits equal the host's `top_logits` of the same
    /// step's full logits, ids and values bit for bit.
    pub top_readout_equal: bool,
    /// ... and its log-sum-exp's largest difference from the host's.
    pub top_readout_max_lse_diff: f64,
    /// ... and after each of those steps `last_logits` hands back that
    /// step's logits bit for bit (what the prompt-end snapshot stores when
    /// the first token was drawn on the device).
    pub last_logits_equal: bool,
    /// A third twin read through `forward_weighted` (temperatures 1, 0.7,
    /// 0.3 with min-p 0.05, 1.5 in turn): its block sums equal the host's
    /// `weight_blocks` of the same step's logits bit for bit, its heavy-token
    /// count the host's `heavy_count`, and the block it hands back those
    /// logits.
    pub weighted_readout_equal: bool,
    pub pass: bool,
}

/// Synthetic-weights smoke test: load, prefill `prompt_len` seeded tokens, check
/// the logits are finite and that prefill and decode paths agree, then decode `gen` tokens.
pub fn smoke(
    model: &GpuModel,
    preset: &str,
    load_s: f64,
    prompt_len: usize,
    n_gen: usize,
) -> Result<SmokeReport> {
    let vocab = model.config().vocab_size as u64;
    let mut s = 0x1234_5678u64;
    let prompt: Vec<u32> = (0..prompt_len.max(2))
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % vocab) as u32
        })
        .collect();
    let mut a = model.new_sequence();
    let t0 = Instant::now();
    let la = model.forward(&mut a, &prompt)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let mut b = model.new_sequence();
    model.forward(&mut b, &prompt[..prompt.len() - 1])?;
    let lb = model.forward(&mut b, &prompt[prompt.len() - 1..])?;
    let finite = la.iter().chain(&lb).all(|v| v.is_finite());
    let (pa, pb) = (log_softmax(&la), log_softmax(&lb));
    let k = kl(&pa, &pb);
    let agree = argmax(&la) == argmax(&lb);
    // Snapshot after the prompt, restore (from the device snapshot, from its
    // host copy, and from a device snapshot of the state restored from that
    // copy), decode the first greedy token: must equal the original.
    let first = argmax(&la);
    let mut kept = None;
    let (restored, from_host, promoted) = match model.snapshot(&a) {
        Some(snap) => {
            let mut r = model
                .restore(snap.as_ref())
                .context("restore of a fresh snapshot failed")?;
            let host = model
                .demote(snap.as_ref())
                .context("copying a snapshot to host memory failed")?;
            kept = Some(snap);
            let mut h = model
                .restore(host.as_ref())
                .context("restore from a host copy failed")?;
            let again = model
                .snapshot(&h)
                .context("snapshot of a sequence restored from host memory failed")?;
            drop(host);
            let mut p = model
                .restore(again.as_ref())
                .context("restore of the promoted snapshot failed")?;
            (
                Some(model.forward(&mut r, &[first])?),
                Some(model.forward(&mut h, &[first])?),
                Some(model.forward(&mut p, &[first])?),
            )
        }
        None => (None, None, None),
    };
    let max_diff = |x: &[f32], y: &[f32]| {
        x.iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0, f32::max)
    };
    let mut snap_diff = None;
    let mut host_diff = None;
    let mut promoted_diff = None;
    let mut first_step = None;
    // The sampling readout on a twin sequence, every step against the host's.
    let mut c = model.new_sequence();
    let (mut top_equal, mut top_lse_diff) = (true, 0.0f64);
    let mut check_top = |top: TopLogits, logits: &[f32]| {
        let want = top_logits(logits, TOP_CANDIDATES);
        let same = |(i, x): &(u32, f32), (j, y): &(u32, f32)| i == j && x.to_bits() == y.to_bits();
        top_equal &= top.top.len() == want.top.len()
            && top.top.iter().zip(&want.top).all(|(a, b)| same(a, b));
        top_lse_diff = top_lse_diff.max((top.lse - want.lse).abs());
    };
    let mut last_equal = true;
    let mut check_last = |c: &GpuSequence, logits: &[f32]| {
        last_equal &= model.last_logits(c).is_some_and(|l| {
            l.len() == logits.len()
                && l.iter()
                    .zip(logits)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
        });
    };
    check_top(model.forward_top(&mut c, &prompt, TOP_CANDIDATES)?, &la);
    check_last(&c, &la);
    let mut d = model.new_sequence();
    let mut weighted_equal = true;
    let mut check_weighted =
        |d: &mut _, tokens: &[u32], logits: &[f32], step: usize| -> Result<()> {
            let (t, min_p) = [(1.0, 0.0), (0.7, 0.0), (0.3, 0.05), (1.5, 0.0)][step % 4];
            let max = top_logits(logits, 1).max();
            let want = weight_blocks(logits, max, t, min_p);
            let want_heavy = heavy_count(logits, max, t);
            let mut same = false;
            // Open the block holding the argmax: a block with weight in it.
            let block = argmax(logits) as usize / WEIGHT_BLOCK;
            let w = Weighting {
                head: TOP_CANDIDATES,
                temperature: t,
                min_p,
            };
            let row = model.forward_weighted(d, tokens, w, &mut |_, got| {
                same = got.heavy == want_heavy
                    && got.blocks.len() == want.len()
                    && got
                        .blocks
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                RowRead::Block(block)
            })?;
            let start = block * WEIGHT_BLOCK;
            let end = (start + WEIGHT_BLOCK).min(logits.len());
            same &= row.read == RowRead::Block(block);
            weighted_equal &= same && row.logits == logits[start..end];
            Ok(())
        };
    check_weighted(&mut d, &prompt, &la, 0)?;
    let mut generated = Vec::new();
    let mut logits = la;
    let mut decode_s = 0.0;
    for i in 0..n_gen {
        let t = argmax(&logits);
        generated.push(t);
        let t1 = Instant::now();
        logits = model.forward(&mut a, &[t])?;
        decode_s += t1.elapsed().as_secs_f64();
        check_top(model.forward_top(&mut c, &[t], TOP_CANDIDATES)?, &logits);
        check_last(&c, &logits);
        check_weighted(&mut d, &[t], &logits, i + 1)?;
        if i == 0 {
            first_step = Some(logits.clone());
            snap_diff = restored.as_deref().map(|x| max_diff(x, &logits));
            host_diff = from_host.as_deref().map(|x| max_diff(x, &logits));
            promoted_diff = promoted.as_deref().map(|x| max_diff(x, &logits));
        }
    }
    let finite = finite && logits.iter().all(|v| v.is_finite());
    // The snapshot again, once `a` (which appended past it in the same KV
    // slab) is gone: a restore adopts the slab and overwrites those rows;
    // after it too is gone (having run past the snapshot), the next restore
    // adopts it again and must still see the snapshot's rows intact.
    drop(a);
    let mut adopted = (None, None);
    if let (Some(snap), Some(want)) = (&kept, &first_step) {
        let mut diff = 0f32;
        let mut all = true;
        for _ in 0..2 {
            let mut r = model
                .restore(snap.as_ref())
                .context("restore of a snapshot whose sequence is gone failed")?;
            all &= model.resumed_in_place(&r);
            diff = diff.max(max_diff(&model.forward(&mut r, &[first])?, want));
            for &t in &generated {
                model.forward(&mut r, &[t])?;
            }
        }
        adopted = (Some(diff), Some(all));
    }
    Ok(SmokeReport {
        preset: preset.into(),
        layers: model.config().num_layers(),
        prompt_len: prompt.len(),
        load_s,
        prefill_s,
        finite,
        kl_prefill_vs_decode: k,
        top1_prefill_vs_decode_agree: agree,
        generated,
        decode_tokens_per_s: n_gen as f64 / decode_s.max(1e-9),
        snapshot_restore_max_diff: snap_diff,
        host_restore_max_diff: host_diff,
        promoted_restore_max_diff: promoted_diff,
        adopted_restore_max_diff: adopted.0,
        adopted_kv: adopted.1,
        top_readout_equal: top_equal,
        top_readout_max_lse_diff: top_lse_diff,
        last_logits_equal: last_equal,
        weighted_readout_equal: weighted_equal,
        pass: finite
            && top_equal
            && last_equal
            && weighted_equal
            && top_lse_diff < 1e-4
            && k < 1e-2
            && [snap_diff, host_diff, promoted_diff, adopted.0]
                .iter()
                .all(|d| *d == Some(0.0))
            && adopted.1 == Some(true),
    })
}

/// Seed of the synthetic weights `verify --synthetic` checks.
pub const SYNTHETIC_SEED: u64 = 0x5157_4153_4931;

/// The synthetic-weights model of `preset` (its first `layers` layers when
/// given), and the seconds it took to load.
pub fn synthetic_model(preset: &str, layers: Option<usize>) -> Result<(GpuModel, f64)> {
    let mut cfg = crate::presets::by_name(preset)?;
    if let Some(n) = layers {
        cfg = crate::presets::with_layers(cfg, n)?;
    }
    let t0 = Instant::now();
    let model = GpuModel::synthetic(cfg, SYNTHETIC_SEED)?;
    Ok((model, t0.elapsed().as_secs_f64()))
}

/// Largest |difference| a tensor-core prompt attention kernel may show from
/// the CUDA-core one: split precision is off by ~1e-5 on outputs of magnitude
/// up to 1 here; a dropped lo term by ~1e-3, a wrong mask or fragment by 1e-2
/// or more.
pub const ATTN_TOL: f32 = 5e-4;

/// One shape of [`attention_check`].
#[derive(Clone, Debug)]
pub struct AttnCheck {
    pub agreement: AttnAgreement,
    /// Every kernel that ran is within [`ATTN_TOL`].
    pub pass: bool,
}

/// The tensor-core prompt attention kernels of this build against the
/// CUDA-core one on the model's geometry (`GpuModel::attention_agreement`):
/// a prompt from position 0, one after an odd-length prefix, and 1,024 new
/// tokens after 8,192 cached (the prefix cache's case).
pub fn attention_check(model: &GpuModel) -> Result<Vec<AttnCheck>> {
    let rows = model.attention_agreement(&[(300, 0), (257, 1000), (1024, 8192)])?;
    let within = |d: Option<f32>| d.is_none_or(|d| d <= ATTN_TOL);
    Ok(rows
        .into_iter()
        .map(|r| AttnCheck {
            pass: within(r.warpgroup_max_diff) && within(r.mma_max_diff),
            agreement: r,
        })
        .collect())
}
