//! `qwasi verify --backend cuda|hip`: checks a GPU backend against the reference
//! fixtures (transformers' greedy tokens and logprobs, and the CPU reference on
//! the same weights), and/or runs a synthetic-weights smoke test at full geometry.
//! Exits non-zero on any FAIL.

use anyhow::{Result, bail};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Backend to check (cuda, or hip in a `--features hip` build).
    #[arg(long, default_value = super::GPU_BACKEND)]
    backend: String,
    /// One fixture directory (with expected.json) instead of all under --fixtures.
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Directory of fixtures (each a model dir with expected.json).
    #[arg(long, value_name = "DIR", default_value = "tests/fixtures/models")]
    fixtures: PathBuf,
    /// Skip the fixtures (only run the synthetic smoke test).
    #[arg(long)]
    no_fixtures: bool,
    /// Also run a smoke test with seeded random weights of this geometry (e.g. qwen3.6-35b-a3b;
    /// qwen3.6-35b-a3b-fp8: block-FP8 weights kept quantized).
    #[arg(long, value_name = "PRESET")]
    synthetic: Option<String>,
    /// Keep only the first N layers of the synthetic model.
    #[arg(long)]
    layers: Option<usize>,
    /// Prompt length of the smoke test.
    #[arg(long, default_value_t = 300)]
    prompt_len: usize,
    /// Tokens decoded by the smoke test.
    #[arg(long, default_value_t = 16)]
    gen_tokens: usize,
    /// Compare against the transformers references written by
    /// scripts/device/compare_transformers.py into DIR (model/, ref.json,
    /// logits_<len>.f32 from float32, logits_bf16_<len>.f32 from bfloat16).
    #[arg(long, value_name = "DIR")]
    compare: Option<PathBuf>,
    /// Write all results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    #[command(flatten)]
    precision: super::PrecisionArgs,
}

pub fn run(a: Args) -> Result<()> {
    match a.backend.as_str() {
        "cuda" if !cfg!(feature = "cuda") => {
            bail!("this qwasi was built without the cuda backend; rebuild with `--features cuda`")
        }
        "hip" if !cfg!(all(feature = "hip", not(feature = "cuda"))) => bail!(
            "this qwasi was built without the hip backend; rebuild with `--features hip` (without cuda)"
        ),
        "cuda" | "hip" => {
            a.precision.apply(&a.backend)?;
            imp(a)
        }
        other => bail!("verify supports --backend cuda or hip (got {other:?})"),
    }
}

#[cfg(not(any(feature = "cuda", feature = "hip")))]
fn imp(_a: Args) -> Result<()> {
    unreachable!("run() refuses every backend in a build without GPU features")
}

#[cfg(any(feature = "cuda", feature = "hip"))]
fn imp(a: Args) -> Result<()> {
    use qwasi_engine::gpu::verify::fixture_dirs;
    if let Some(dir) = &a.compare {
        if !gpu::compare(dir, a.json.as_deref())? {
            bail!("verify --compare: FAIL");
        }
        return Ok(());
    }
    let fixtures = if a.no_fixtures {
        Vec::new()
    } else {
        let dirs = match &a.model {
            Some(d) => vec![d.clone()],
            None => fixture_dirs(&a.fixtures)?,
        };
        if dirs.is_empty() {
            bail!(
                "no fixtures (dirs with expected.json) under {}",
                a.fixtures.display()
            );
        }
        dirs
    };
    if !gpu::verify(&a, &fixtures)? {
        bail!("verify: FAIL");
    }
    Ok(())
}

/// The checks of `qwasi_engine::gpu::verify`, one line per result as each
/// finishes.
#[cfg(any(feature = "cuda", feature = "hip"))]
mod gpu {
    use super::Args;
    use anyhow::Result;
    use qwasi_engine::gpu::verify::{
        ATTN_TOL, BATCH_LOGPROB_TOL, BatchReport, Comparison, ConstrainedReport, DRAW_LOGPROB_TOL,
        FP8_GEMM_TOL, FP8_LOGIT_TOL, LSE_TOL, MARGIN_TOL, MASK_LOGPROB_TOL, SmokeReport,
        Tolerances, WeightedReport, attention_check, batch_check, batch_check_every,
        constrained_check, fp8_resident_check, pass_snapshots_check, smoke, synthetic_model,
        verify_fixture, verify_fixture_batch, verify_fixture_constrained, verify_fixture_weighted,
        weighted_check,
    };
    use std::path::{Path, PathBuf};

    fn verdict(pass: bool) -> &'static str {
        if pass { "PASS" } else { "FAIL" }
    }

    /// The fixtures, then the synthetic smoke test and the attention kernels
    /// (`--synthetic`); writes `--json`. Returns whether all passed.
    pub fn verify(a: &Args, fixtures: &[PathBuf]) -> Result<bool> {
        let tol = Tolerances::default();
        let mut all_pass = true;
        let mut cases = Vec::new();
        let mut batches = Vec::new();
        let mut constrained = Vec::new();
        let mut weighted = Vec::new();
        let mut fp8 = Vec::new();
        if !fixtures.is_empty() {
            println!(
                "{:<12} {:<7} {:>5} {:>9} {:>10} {:>10} {:>10} {:>10} {:>8}  verdict",
                "fixture",
                "case",
                "len",
                "top1",
                "|dlp| hf",
                "|dlp| cpu",
                "KL first",
                "KL max",
                "greedy"
            );
            for dir in fixtures {
                for r in verify_fixture(dir, &tol)? {
                    println!(
                        "{:<12} {:<7} {:>5} {:>4}/{:<4} {:>10.2e} {:>10.2e} {:>10.2e} {:>10.2e} {:>4}/{:<3}  {}",
                        r.fixture,
                        r.case,
                        r.prompt_len,
                        r.decisive_agree,
                        r.decisive_steps,
                        r.first_max_dlogprob_hf,
                        r.first_max_dlogprob_cpu,
                        r.first_kl_cpu_gpu,
                        r.max_kl_cpu_gpu,
                        r.greedy_same_prefix,
                        r.greedy_len,
                        verdict(r.pass)
                    );
                    all_pass &= r.pass;
                    cases.push(r);
                }
            }
            for dir in fixtures {
                let r = verify_fixture_batch(dir)?;
                let name = dir
                    .file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default();
                print_batched(&format!("{name:<12} batched"), &r);
                all_pass &= r.pass;
                batches.push(r);
            }
            for dir in fixtures {
                let Some(r) = fp8_resident_check(dir)? else {
                    continue;
                };
                let gb = |b: usize| b as f64 / 1e9;
                println!(
                    "{:<12} FP8 kept quantized vs dequantized at upload: greedy tokens {} (alone, \
                     batched, fused and unfused decode), max |dlogit| {:.2e} over {} steps ({} \
                     bit-identical), batched max |dlogprob| {:.2e} (tolerance {FP8_LOGIT_TOL}); \
                     device weights {:.4} GB + {:.4} GB work buffers vs {:.4} GB  {}",
                    r.fixture,
                    if r.tokens_equal { "equal" } else { "DIFFER" },
                    r.max_dlogit,
                    r.steps,
                    r.identical_steps,
                    r.batched_max_dlogprob,
                    gb(r.resident_bytes),
                    gb(r.work_bytes),
                    gb(r.dequantized_bytes),
                    verdict(r.pass)
                );
                for line in r.gemm.iter().flat_map(|g| &g.per_shape) {
                    println!("{:<12}   FP8 activations {line}", r.fixture);
                }
                match &r.gemm {
                    Some(g) => println!(
                        "{:<12} FP8 activations (--prefill-precision fp8): {} shapes, codes {} / \
                         scales {} off the host's quantization, max rel. error {:.2e} vs the f64 \
                         product; experts {:.2e}, {} writes past their tiles (tolerance \
                         {FP8_GEMM_TOL})  {}",
                        r.fixture,
                        g.shapes,
                        g.code_mismatches,
                        g.scale_mismatches,
                        g.max_rel_err,
                        g.expert_max_rel_err,
                        g.expert_stray_writes,
                        verdict(g.pass)
                    ),
                    None => println!(
                        "{:<12} FP8 activations: not checked (no block-scaled FP8 GEMMs on this device)",
                        r.fixture
                    ),
                }
                all_pass &= r.pass;
                fp8.push(r);
            }
            for dir in fixtures {
                let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
                let name = name.unwrap_or_default();
                let w = verify_fixture_weighted(dir)?;
                print_weighted(&name, &w);
                let r = verify_fixture_constrained(dir)?;
                print_constrained(&name, &r);
                all_pass &= w.pass && r.pass;
                weighted.push(w);
                constrained.push(r);
            }
            println!(
                "(top1: teacher-forced argmax agreement on steps with reference margin > {}; |dlp|: max first-token \
                 logprob difference vs transformers top-8 / vs CPU full vocab; KL(cpu||gpu) first step and max over \
                 teacher-forced steps; greedy: free-running tokens identical to transformers)",
                tol.margin
            );
        }
        let mut smoke_report = None;
        let mut synthetic_batch = None;
        let mut synthetic_batch_wide = None;
        let mut synthetic_weighted = None;
        let mut synthetic_constrained = None;
        let mut pass_snapshots = None;
        let mut attention = None;
        if let Some(p) = &a.synthetic {
            let (model, load_s) = synthetic_model(p, a.layers)?;
            let r = smoke(&model, p, load_s, a.prompt_len, a.gen_tokens)?;
            print_smoke(p, &r);
            all_pass &= r.pass;
            smoke_report = Some(r);
            // Four prompts of different lengths, batched against alone.
            let vocab = qwasi_engine::backend::Backend::config(&model).vocab_size as u32;
            let prompts = synthetic_prompts(&[a.prompt_len, 37, 5, 1], 0, vocab);
            let b = batch_check(&model, &prompts, a.gen_tokens)?;
            print_batched(&format!("synthetic {p} batched"), &b);
            all_pass &= b.pass;
            synthetic_batch = Some(b);
            // Wider steps: ten prompts, twenty rows arriving a step apart and
            // decoding 20 tokens each, so up to 20 decode rows run together
            // (past 16 the projections take the stacked cuBLAS GEMMs). On
            // some of these prompts of the random 40-layer model the prompt
            // kernels and the decode step alone differ by 0.44 in logprob,
            // which the rows' near-tie margins scale with.
            let lens = [a.prompt_len, 37, 5, 1, 64, 17, 200, 3, 90, 11];
            let wide = synthetic_prompts(&lens, 4, vocab);
            let w = batch_check_every(&model, &wide, 20, 1)?;
            print_batched(&format!("synthetic {p} batched, wide"), &w);
            all_pass &= w.pass;
            synthetic_batch_wide = Some(w);
            // Prefix-cache snapshots taken inside the prompt's pass.
            if let Some(r) = pass_snapshots_check(&model, &prompts[0], a.gen_tokens)? {
                println!(
                    "synthetic {p} snapshots inside a {}-token pass at {:?}: taken alone {:?}, as a batched \
                     chunk {:?}; each equal to a same-length pass's with other tokens after it: {}; \
                     resumed: max |dlogprob| {:.2e}, same greedy tokens {} (other row counts: cuBLAS \
                     rounding, reported); the pass {:.1} ms, with the snapshots {:.1} ms, split at them {:.1} ms  {}",
                    r.prompt_len,
                    r.asked,
                    r.taken_alone,
                    r.taken_batched,
                    r.causal_equal,
                    r.max_dlogprob,
                    r.same_greedy,
                    r.prompt_ms,
                    r.prompt_with_snapshots_ms,
                    r.prompt_split_ms,
                    verdict(r.pass)
                );
                for q in &r.points {
                    println!(
                        "  at {}: against the other-tokens pass {:.1e}; against a pass ending there: conv \
                         windows {:.2e}, states {:.2e} (relative), next token |dlogprob| {:.2e}; resumed to \
                         the prompt's end {:.2e}",
                        q.at,
                        q.causal_max_diff,
                        q.conv_rel_diff,
                        q.state_rel_diff,
                        q.next_dlogprob,
                        q.resumed_dlogprob
                    );
                }
                all_pass &= r.pass;
                pass_snapshots = Some(r);
            }
            let w = weighted_check(&model, &prompts, a.gen_tokens)?;
            print_weighted(&format!("synthetic {p}"), &w);
            all_pass &= w.pass;
            synthetic_weighted = Some(w);
            // Constrained decoding on the Qwen3.6 vocabulary.
            let tok = qwasi_engine::tokenizer::Tokenizer::qwen36()?;
            let eos = qwasi_engine::backend::Backend::config(&model)
                .eos_token_ids
                .clone();
            let chat =
                tok.encode("<|im_start|>user\nJSON please<|im_end|>\n<|im_start|>assistant\n")?;
            let c = constrained_check(&model, &tok, &eos, &chat, a.gen_tokens)?;
            print_constrained(&format!("synthetic {p}"), &c);
            all_pass &= c.pass;
            synthetic_constrained = Some(c);
            let mut rows = Vec::new();
            for c in attention_check(&model)? {
                let r = &c.agreement;
                println!(
                    "prompt attention, {} queries after {} cached: max |diff| from the CUDA-core kernel: \
                     warpgroup MMA {:?}, mma.sync {:?} (tolerance {ATTN_TOL:e})  {}",
                    r.queries,
                    r.cached,
                    r.warpgroup_max_diff,
                    r.mma_max_diff,
                    verdict(c.pass)
                );
                all_pass &= c.pass;
                rows.push(c.agreement);
            }
            attention = Some(rows);
        }
        if let Some(path) = &a.json {
            let v = serde_json::json!({
                "cases": cases,
                "batched": batches,
                "weighted": weighted,
                "constrained": constrained,
                "fp8_resident": fp8,
                "smoke": smoke_report,
                "synthetic_batched": synthetic_batch,
                "synthetic_batched_wide": synthetic_batch_wide,
                "synthetic_weighted": synthetic_weighted,
                "synthetic_constrained": synthetic_constrained,
                "pass_snapshots": pass_snapshots,
                "attention_kernels": attention,
                "pass": all_pass
            });
            std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
        }
        println!("verify: {}", verdict(all_pass));
        Ok(all_pass)
    }

    fn print_constrained(what: &str, r: &ConstrainedReport) {
        println!(
            "{what:<12} constrained: {} runs (grammar x greedy/top-k/top-p) on the device masks vs the host mask: \
             tokens equal alone {}/{}, batched beside unconstrained rows {}/{}, neighbours unchanged {}/{}, \
             {} tokens, max |dlogprob| {:.2e} (tolerance {MASK_LOGPROB_TOL}){}  {}",
            r.runs,
            r.alone_equal,
            r.runs,
            r.batched_equal,
            r.runs,
            r.neighbours_equal,
            r.runs,
            r.tokens,
            r.max_dlogprob,
            mismatch(&r.first_mismatch),
            verdict(r.pass)
        );
    }

    /// A check's first mismatch, as its line's tail.
    fn mismatch(first: &Option<String>) -> String {
        first
            .as_ref()
            .map(|m| format!(", first mismatch: {m}"))
            .unwrap_or_default()
    }

    fn print_weighted(what: &str, r: &WeightedReport) {
        println!(
            "{what:<12} weighted rows: readout of {} rows together / alone equal to the host's {}/{}, {}/{} \
             (lse diff {:.1e}, tolerance {LSE_TOL:e}); {} rows x {} tokens drawn in batched steps (up to {} \
             weighted rows read together; plans head/block/whole {:?}): tokens equal the host sampler's {}/{}, \
             max |dlogprob| {:.2e} (tolerance {DRAW_LOGPROB_TOL:e}){}  {}",
            r.readout_rows,
            r.readout_together_equal,
            r.readout_rows,
            r.readout_alone_equal,
            r.readout_rows,
            r.max_lse_diff,
            r.rows,
            r.tokens,
            r.widest_weighted_step,
            r.reads,
            r.rows_equal,
            r.rows,
            r.max_dlogprob,
            mismatch(&r.first_mismatch),
            verdict(r.pass)
        );
    }

    /// Prompts of the given lengths for the synthetic model, prompt `k`
    /// seeded by `first + k` (token t: (t 7919 + seed 104,729) mod vocab).
    fn synthetic_prompts(lens: &[usize], first: u32, vocab: u32) -> Vec<Vec<u32>> {
        lens.iter()
            .zip(first..)
            .map(|(&len, seed)| {
                (0..len as u32)
                    .map(|t| (t * 7919 + seed * 104_729) % vocab)
                    .collect()
            })
            .collect()
    }

    /// One batched-against-alone report as a line, `what` naming the run.
    fn print_batched(what: &str, b: &BatchReport) {
        println!(
            "{what}: {} rows x {} tokens, {} steps of 2-{} decode rows together: {}/{} rows' \
             tokens equal alone (others first differ at alone margin {:?}, tolerance {MARGIN_TOL} or twice the row's \
             prompt-vs-decode), \
             max |dlogprob| {:.2e} (prompt kernels vs decode {:.2e}; tolerance {BATCH_LOGPROB_TOL} \
             or twice that), last logits match {}  {}",
            b.rows,
            b.tokens,
            b.batched_steps,
            b.widest_step,
            b.rows_equal,
            b.rows,
            b.diverged_margin,
            b.max_dlogprob,
            b.prompt_vs_decode_dlogprob,
            b.last_logits_match,
            verdict(b.pass)
        );
        for d in b.diverged.iter().filter(|d| d.margin > d.allowed) {
            println!(
                "  row {} ({}-token prompt) first differs at token {}: alone margin {:.3}, allowed {:.3}",
                d.row, d.prompt_len, d.at, d.margin, d.allowed
            );
        }
    }

    fn print_smoke(preset: &str, r: &SmokeReport) {
        println!(
            "synthetic {preset} ({} layers): load {:.1} s, prefill {} tokens {:.3} s, finite {}, \
             KL(prefill || prefill[..-1]+decode) {:.2e}, top1 agree {}, decode {:.1} tok/s \
             (correctness build: no graphs, full logits copied per token), snapshot/restore max diff {:?}, \
             from the host copy {:?}, promoted back {:?}, in the adopted KV slab {:?} (adopted {:?}), top-64 readout equal {} (lse diff {:.1e}), last logits equal {}, weighted readout equal {}, tokens {:?}  {}",
            r.layers,
            r.load_s,
            r.prompt_len,
            r.prefill_s,
            r.finite,
            r.kl_prefill_vs_decode,
            r.top1_prefill_vs_decode_agree,
            r.decode_tokens_per_s,
            r.snapshot_restore_max_diff,
            r.host_restore_max_diff,
            r.promoted_restore_max_diff,
            r.adopted_restore_max_diff,
            r.adopted_kv,
            r.top_readout_equal,
            r.top_readout_max_lse_diff,
            r.last_logits_equal,
            r.weighted_readout_equal,
            r.generated,
            verdict(r.pass)
        );
    }

    /// `--compare DIR`: the GPU backend against the transformers references
    /// (float32, and bfloat16 where written); writes `--json`. Returns whether
    /// every case passed its mode's tolerance.
    pub fn compare(dir: &Path, json: Option<&Path>) -> Result<bool> {
        let cmp = Comparison::load(dir)?;
        println!(
            "[compare] {}-layer model loaded in {:.1} s (prefill GEMMs {:?}, prompt precision {}, KV cache {})",
            cmp.layers,
            cmp.load_s,
            cmp.gemm,
            cmp.prefill.name(),
            if cmp.kv_f32 { "f32" } else { "bf16" }
        );
        let sci = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2e}"));
        let mut reports = Vec::new();
        let mut all = true;
        for r in cmp.reports() {
            let r = r?;
            println!(
                "[compare] len {:>6}: KL(hf32||gpu) {:.2e} (limit {}), KL(hf16||gpu) {}, yardstick KL(hf32||hf16) {}, \
                 top1 {} (hf16 {}), max|dlogprob| top8 {:.2e}, teacher-forced top1 {}/{} (margin > 0.1), greedy identical {}/{} \
                 (hf margin at first difference {:?})  {}",
                r.prompt_len,
                r.kl_ref_gpu,
                sci(r.kl_limit),
                sci(r.kl_bf16ref_gpu),
                sci(r.kl_ref_bf16ref),
                r.top1_agree,
                r.bf16ref_top1_agree
                    .map_or("-".to_string(), |a| a.to_string()),
                r.max_dlogprob_top8,
                r.decisive_agree,
                r.decisive_steps,
                r.greedy_same_prefix,
                r.greedy_len,
                r.greedy_diverged_margin,
                verdict(r.pass)
            );
            if r.kl_ref_fp8ref.is_some() {
                println!(
                    "[compare] len {:>6}: KL(hf-fp8||gpu) {}, FP8 yardstick KL(hf32||hf-fp8) {} \
                     (transformers running the checkpoint as FP8)",
                    r.prompt_len,
                    sci(r.kl_fp8ref_gpu),
                    sci(r.kl_ref_fp8ref)
                );
            }
            all &= r.pass;
            reports.push(r);
        }
        if let Some(p) = json {
            std::fs::write(
                p,
                serde_json::to_string_pretty(&serde_json::json!({
                    "prefill_precision": cmp.prefill.name(),
                    "compare": reports,
                    "pass": all,
                }))?,
            )?;
        }
        println!("compare: {}", verdict(all));
        Ok(all)
    }
}
