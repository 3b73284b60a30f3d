//! `qwasi bench --workload speed --backend cuda|hip --synthetic qwen3.6-35b-a3b`:
//! batch-1 time to first token and greedy decode rate at several prompt
//! lengths on the GPU, each against the bandwidth floor of a decode step, with
//! the correctness check of the same build (the reference fixtures) in the
//! same report.
//!
//! Per prompt length L (prompt token i = 1 + (i * 1000003 + L * 7919) mod
//! (vocab - 1), the formula `scripts/device/hf_bench.py` uses too): warm-ups
//! and timed runs of a cold prefill (TTFT = prompt in, first greedy token out;
//! prompts longer than `--ttft-max` are timed once), then the prompt's end is
//! snapshotted and each run restores it and decodes `--decode-tokens` greedy
//! tokens; every run must produce the same tokens, and the first 16 must equal
//! the argmax of the full logits copied to the host.

use anyhow::{Result, bail};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct SpeedArgs {
    /// Backend: speed defaults to the GPU of the build (cuda, or hip in a
    /// `--features hip` build); prefix-cache to cpu (also cuda or hip).
    #[arg(long)]
    pub backend: Option<String>,
    /// Seeded random weights of this geometry, generated on the GPU
    /// (`qwen3.6-35b-a3b`, or `qwen3.6-35b-a3b-fp8`: block-FP8 like the -FP8 checkpoint).
    #[arg(long, value_name = "PRESET", default_value = "qwen3.6-35b-a3b")]
    pub synthetic: String,
    /// Keep only the first N layers.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Prompt lengths.
    #[arg(long, value_delimiter = ',', default_value = "512,8192")]
    pub lens: Vec<usize>,
    /// Greedy tokens decoded per run.
    #[arg(long, default_value_t = 128)]
    pub decode_tokens: usize,
    /// Untimed runs before the timed ones.
    #[arg(long, default_value_t = 2)]
    warmups: usize,
    /// Prompts longer than this get one timed prefill (no warm-up).
    #[arg(long, default_value_t = 16_384)]
    ttft_max: usize,
    /// Reference fixtures checked first (skipped when the directory is missing).
    #[arg(long, default_value = "tests/fixtures/models")]
    pub fixtures: PathBuf,
    /// Write each prompt's last-token logits (f32 LE) as DIR/qwasi_logits_<L>.f32.
    #[arg(long, value_name = "DIR")]
    dump_logits: Option<PathBuf>,
    /// Also time a plain streaming read and the decode GEMV of one
    /// (out_proj-sized) matrix per launch: the per-kernel floor.
    #[arg(long)]
    probe: bool,
    /// Also decode held to a grammar (the regex of scripts/bench_structured.py,
    /// #24's bound): the mask on the device (greedy, top-k 20) and on the host.
    #[arg(long)]
    constrained: bool,
}

/// Prompt token `i` of a length-`len` benchmark prompt.
#[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]
pub fn prompt(len: usize, vocab: usize) -> Vec<u32> {
    (0..len)
        .map(|i| (1 + (i * 1_000_003 + len * 7919) % (vocab - 1)) as u32)
        .collect()
}

/// Decode with `params` sampling, each step read back as `serve` reads it
/// ([`Readout::choose`], [`Readout::step`]): the rate, and per token the
/// host sampler's share where the whole row comes to the host.
#[cfg(any(feature = "cuda", feature = "hip"))]
fn sampled_decode<B: qwasi_engine::backend::Backend>(
    model: &B,
    snap: &dyn qwasi_engine::backend::SeqSnapshot,
    first: u32,
    tokens: usize,
    runs: usize,
    what: &str,
    params: qwasi_engine::sampling::SamplingParams,
) -> Result<Value> {
    use qwasi_engine::readout::{Next, Readout};
    use qwasi_engine::sampling::Sampler;
    use std::time::Instant;
    let readout = Readout::choose(&params, model);
    let (mut rates, mut sampler_ms) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let mut seq = model
            .restore(snap)
            .ok_or_else(|| anyhow::anyhow!("restore failed"))?;
        let mut sampler = Sampler::new(params.clone());
        let mut tok = first;
        let mut host = 0.0;
        let t = Instant::now();
        for _ in 0..tokens {
            tok = match readout.step(model, &mut seq, &[tok], &mut sampler)? {
                Next::Sampled(s) => s.token,
                Next::Logits(l) => {
                    let t1 = Instant::now();
                    let s = sampler.sample(&l, &[], 0);
                    host += t1.elapsed().as_secs_f64();
                    s.token
                }
            };
        }
        rates.push(tokens as f64 / t.elapsed().as_secs_f64());
        sampler_ms.push(1e3 * host / tokens as f64);
    }
    Ok(json!({
        "sampling": what,
        "readout": format!("{readout:?}"),
        "tok_per_s": stats(&rates),
        "host_sampler_ms_per_token": stats(&sampler_ms),
    }))
}

#[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]
pub(super) fn stats(v: &[f64]) -> Value {
    json!({
        "median": super::median(v),
        "min": v.iter().copied().reduce(f64::min),
        "max": v.iter().copied().reduce(f64::max),
        "runs": v,
    })
}

impl SpeedArgs {
    /// `--backend`, or the GPU of this build.
    pub fn gpu_backend(&self) -> &str {
        self.backend
            .as_deref()
            .unwrap_or(crate::commands::GPU_BACKEND)
    }
}

impl SpeedArgs {
    /// Fails unless the backend is a GPU this build has.
    pub fn check_gpu_backend(&self, workload: &str) -> Result<()> {
        match self.gpu_backend() {
            "cuda" if !cfg!(feature = "cuda") => {
                bail!(
                    "this qwasi was built without the cuda backend; rebuild with `--features cuda`"
                )
            }
            "hip" if !cfg!(all(feature = "hip", not(feature = "cuda"))) => bail!(
                "this qwasi was built without the hip backend; rebuild with `--features hip` (without cuda)"
            ),
            "cuda" | "hip" => Ok(()),
            other => bail!("--workload {workload} supports --backend cuda or hip (got {other:?})"),
        }
    }
}

pub fn run(a: &SpeedArgs, runs: usize, out: PathBuf) -> Result<()> {
    a.check_gpu_backend("speed")?;
    if runs == 0 || a.lens.is_empty() {
        bail!("--runs and --lens must be non-empty");
    }
    imp(a, runs, &out)
}

#[cfg(not(any(feature = "cuda", feature = "hip")))]
fn imp(_a: &SpeedArgs, _runs: usize, _out: &Path) -> Result<()> {
    unreachable!("run() refuses every backend in a build without GPU features")
}

/// Seed of the synthetic weights (the same model in every GPU benchmark).
#[cfg(any(feature = "cuda", feature = "hip"))]
pub const SEED: u64 = 0x5157_4153_4931;

/// Correctness of this build: every reference fixture under `dir` (`pass`
/// absent when the directory is missing: skipped). Their tolerances are the
/// split prompt precision's: with `--prefill-precision bf16` or `fp8` the result is
/// recorded as `pass_split_tolerances` and does not gate the run (that mode
/// is held to `verify --compare`, docs/GPU.md "Prompt precision").
#[cfg(any(feature = "cuda", feature = "hip"))]
pub fn fixture_check(dir: &Path) -> Result<Value> {
    use qwasi_engine::gpu::options::{GpuOptions, PrefillPrecision};
    use qwasi_engine::gpu::verify::{Tolerances, fixture_dirs, verify_fixture};
    if !dir.is_dir() {
        return Ok(json!({"fixtures": "skipped: directory not found"}));
    }
    let prefill = GpuOptions::from_env()?.prefill;
    let single = prefill != PrefillPrecision::Split;
    let tol = Tolerances::default();
    let mut pass = true;
    let mut max_kl = 0f64;
    let mut cases = 0;
    for dir in fixture_dirs(dir)? {
        for r in verify_fixture(&dir, &tol)? {
            pass &= r.pass;
            max_kl = max_kl.max(r.max_kl_cpu_gpu);
            cases += 1;
        }
    }
    let verdict = if pass { "PASS" } else { "FAIL" };
    if single {
        eprintln!(
            "[bench] fixtures: {cases} cases, {verdict} by the split mode's tolerances (not a gate \
             under --prefill-precision {}), max KL(cpu||gpu) {max_kl:.2e}",
            prefill.name()
        );
        return Ok(json!({
            "fixtures": dir,
            "cases": cases,
            "pass_split_tolerances": pass,
            "max_kl_cpu_gpu": max_kl,
            "prefill_precision": format!("{}: the fixtures' tolerances are the split mode's; this mode's check is verify --compare", prefill.name()),
        }));
    }
    eprintln!("[bench] fixtures: {cases} cases, {verdict}, max KL(cpu||gpu) {max_kl:.2e}");
    Ok(json!({"fixtures": dir, "cases": cases, "pass": pass, "max_kl_cpu_gpu": max_kl}))
}

/// The synthetic model of `--synthetic` (first `--layers` layers), seeded with [`SEED`].
#[cfg(any(feature = "cuda", feature = "hip"))]
pub fn synthetic_model(a: &SpeedArgs) -> Result<qwasi_engine::gpu::model::GpuModel> {
    let mut cfg = qwasi_engine::presets::by_name(&a.synthetic)?;
    if let Some(n) = a.layers {
        cfg = qwasi_engine::presets::with_layers(cfg, n)?;
    }
    qwasi_engine::gpu::model::GpuModel::synthetic(cfg, SEED)
}

#[cfg(any(feature = "cuda", feature = "hip"))]
fn imp(a: &SpeedArgs, runs: usize, out: &Path) -> Result<()> {
    use qwasi_engine::backend::Backend;
    use qwasi_engine::sampling::SamplingParams;
    use std::time::Instant;

    // 1. Correctness of this build: every reference fixture.
    let correctness = fixture_check(&a.fixtures)?;

    // 2. The synthetic model.
    let t0 = Instant::now();
    let model = synthetic_model(a)?;
    let vocab = model.config().vocab_size;
    let load_s = t0.elapsed().as_secs_f64();
    let bw = model.copy_bandwidth(2 << 30)?;
    eprintln!(
        "[bench] {}: model in {load_s:.1} s; copy bandwidth {:.2} TB/s",
        model.device_name(),
        bw / 1e12
    );

    let probe = if a.probe {
        let (bytes, read_us, gemv_us) = model.probe_gemv()?;
        eprintln!(
            "[bench] probe: {:.1} MB matrix per launch: plain streaming read {read_us:.1} us ({:.2} TB/s), decode GEMV {gemv_us:.1} us ({:.2} TB/s)",
            bytes as f64 / 1e6,
            bytes as f64 / read_us / 1e6,
            bytes as f64 / gemv_us / 1e6
        );
        json!({"matrix_bytes": bytes, "plain_read_us": read_us, "decode_gemv_us": gemv_us})
    } else {
        Value::Null
    };
    let mut all_consistent = true;
    // Device memory in use, its peak per length sampled while the length runs.
    let used = || model.memory_used().0;
    let results = super::with_peak_gauge(&used, |gauge| -> Result<Vec<Value>> {
        let mut results = Vec::new();
        for &len in &a.lens {
            gauge.take();
            let p = prompt(len, vocab);
            // TTFT.
            let (warm, timed) = if len > a.ttft_max {
                (0, 1)
            } else {
                (a.warmups, runs)
            };
            let mut ttft = Vec::new();
            let mut first = None;
            for r in 0..warm + timed {
                let mut seq = model.new_sequence();
                let t = Instant::now();
                let tok = model.forward_greedy(&mut seq, &p)?.token;
                let dt = t.elapsed().as_secs_f64();
                if r >= warm {
                    ttft.push(dt * 1e3);
                }
                if first.is_some_and(|f| f != tok) {
                    all_consistent = false;
                }
                first = Some(tok);
            }
            let first = first.unwrap();
            // One prefill, snapshotted; decode runs restore it (and profiled with
            // QWASI_GPU_PROFILE=1).
            let _ = model.take_profile();
            let mut base = model.new_sequence();
            let logits = model.forward(&mut base, &p)?;
            let prefill_profile = model.take_profile();
            print_profile("prefill", &prefill_profile, 1);
            let dump = |name: String, logits: &[f32]| -> Result<()> {
                if let Some(dir) = &a.dump_logits {
                    std::fs::create_dir_all(dir)?;
                    let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
                    std::fs::write(dir.join(name), bytes)?;
                }
                Ok(())
            };
            dump(format!("qwasi_logits_{len}.f32"), &logits)?;
            let snap = model
                .snapshot(&base)
                .ok_or_else(|| anyhow::anyhow!("snapshot failed (device memory?)"))?;
            drop(base);
            // Greedy through the host: the first 16 tokens from the full logits.
            let mut host_tokens = vec![qwasi_engine::sampling::argmax(&logits)];
            // Every full logits vector the host sees must be finite (long contexts).
            let mut finite = logits.iter().all(|v| v.is_finite());
            {
                let mut seq = model.restore(snap.as_ref()).unwrap();
                let steps = 15.min(a.decode_tokens);
                for step in 0..steps {
                    let l = model.forward(&mut seq, &[*host_tokens.last().unwrap()])?;
                    finite &= l.iter().all(|v| v.is_finite());
                    host_tokens.push(qwasi_engine::sampling::argmax(&l));
                    if step + 1 == steps {
                        // After `steps` decode steps: compares decode paths bit for bit.
                        dump(format!("qwasi_decode_logits_{len}.f32"), &l)?;
                    }
                }
            }
            all_consistent &= finite;
            // The profile below covers the decode steps only.
            let _ = model.take_profile();
            let mut rates = Vec::new();
            let mut tokens: Option<Vec<u32>> = None;
            for r in 0..a.warmups + runs {
                let mut seq = model
                    .restore(snap.as_ref())
                    .ok_or_else(|| anyhow::anyhow!("restore failed"))?;
                let mut tok = first;
                let mut got = vec![tok];
                let t = Instant::now();
                for _ in 0..a.decode_tokens {
                    tok = model.forward_greedy(&mut seq, &[tok])?.token;
                    got.push(tok);
                }
                let dt = t.elapsed().as_secs_f64();
                if r >= a.warmups {
                    rates.push(a.decode_tokens as f64 / dt);
                }
                match &tokens {
                    Some(prev) if *prev != got => all_consistent = false,
                    None => tokens = Some(got),
                    _ => {}
                }
            }
            let tokens = tokens.unwrap();
            let host_agree = tokens.iter().zip(&host_tokens).all(|(a, b)| a == b);
            all_consistent &= host_agree;
            let profile = model.take_profile();
            // Requests that sample, read back as `serve` reads them: Qwen's
            // recommended top-k 20 (the logits' head), temperature alone (the
            // row weighted on the device) and top-p alone (the same, or the
            // row on the host when the nucleus reaches past the head).
            let qwen = SamplingParams {
                temperature: 0.7,
                top_k: 20,
                top_p: 0.95,
                seed: Some(1),
                ..Default::default()
            };
            let nucleus = SamplingParams {
                top_k: 0,
                ..qwen.clone()
            };
            let plain = SamplingParams {
                top_p: 1.0,
                ..nucleus.clone()
            };
            let mut sampled = Vec::new();
            for (what, params) in [
                (
                    "temperature 0.7, top_k 20, top_p 0.95: the logits' 64 largest read on the device, drawn on the host",
                    qwen,
                ),
                (
                    "temperature 0.7: the row's weights summed per 64 tokens on the device, the block and token drawn on the host",
                    plain,
                ),
                (
                    "temperature 0.7, top_p 0.95: weighted on the device; decided among the 64 largest when the nucleus lies there, else the row is copied to the host and sampled there",
                    nucleus,
                ),
            ] {
                sampled.push(sampled_decode(
                    &model,
                    snap.as_ref(),
                    first,
                    a.decode_tokens,
                    runs.min(3),
                    what,
                    params,
                )?);
            }
            let sampled_rate = |i: usize| {
                sampled[i]["tok_per_s"]["median"]
                    .as_f64()
                    .unwrap_or(f64::NAN)
            };
            let constrained = if a.constrained {
                let c = super::constrained::constrained_decode(
                    &model,
                    snap.as_ref(),
                    a.decode_tokens,
                    runs.min(3),
                )?;
                let rate = |i: usize| c[i]["tok_per_s"]["median"].as_f64().unwrap_or(f64::NAN);
                let free = super::median(&rates);
                eprintln!(
                    "[bench] L {len:>6}: constrained greedy {:.1} tok/s ({:.3}x of {free:.1} unconstrained), top-k 20 {:.1}, host mask {:.1}",
                    rate(0),
                    rate(0) / free,
                    rate(1),
                    rate(2)
                );
                json!({"runs": c, "greedy_over_unconstrained": rate(0) / free})
            } else {
                Value::Null
            };
            let ctx = len + a.decode_tokens / 2;
            let bytes = model.step_bytes(ctx);
            let floor_s = bytes.total() as f64 / bw;
            let med_rate = super::median(&rates);
            let (used, total) = model.memory_used();
            let peak = gauge.take();
            eprintln!(
                "[bench] L {len:>6}: TTFT {:>9.1} ms, decode {:>7.1} tok/s ({:.0}% of the {:.0} tok/s floor; sampled: top-k {:.1}, temperature {:.1}, top-p {:.1}), tokens consistent: {}, logits finite: {finite}, device memory {:.1} GB (peak {:.1} GB)",
                super::median(&ttft),
                med_rate,
                100.0 * med_rate * floor_s,
                1.0 / floor_s,
                sampled_rate(0),
                sampled_rate(1),
                sampled_rate(2),
                host_agree,
                used as f64 / 1e9,
                peak as f64 / 1e9
            );
            print_profile(
                "decode step",
                &profile,
                (a.warmups + runs) * a.decode_tokens,
            );
            results.push(json!({
                "prompt_len": len,
                "ttft_ms": stats(&ttft),
                "decode_tokens": a.decode_tokens,
                "decode_tok_per_s": stats(&rates),
                "decode_step_bytes_at_mid_context": bytes,
                "bandwidth_floor_tok_per_s": 1.0 / floor_s,
                "fraction_of_bandwidth_bound": med_rate * floor_s,
                "first_tokens": &tokens[..tokens.len().min(16)],
                "greedy_equals_host_argmax_16": host_agree,
                "sampled_decode": sampled,
                "constrained_decode": constrained,
                "host_logits_finite": finite,
                "device_memory_used_bytes": used,
                "device_memory_peak_bytes": peak,
                "device_memory_total_bytes": total,
                "profile_ms": profile_json(&profile),
                "prefill_profile_ms": profile_json(&prefill_profile),
            }));
        }
        Ok(results)
    })?;
    let report = json!({
        "what": "batch-1 TTFT and greedy decode on synthetic weights (qwasi bench --workload speed)",
        "commit": super::commit(),
        "gpu": model.device_name(),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "preset": a.synthetic,
        "layers": model.config().num_layers(),
        "kv_cache": if model.kv_f32 { "f32" } else { "bf16" },
        "prefill_precision": model.prefill_precision().name(),
        "device_memory": "the whole device as cudaMemGetInfo sees it: used after each length's runs, peak sampled every 20 ms while they ran",
        "seed": "0x515741534931",
        "load_s": load_s,
        "copy_bandwidth_bytes_per_s": bw,
        "warmups": a.warmups,
        "runs": runs,
        "correctness": correctness,
        "greedy_consistent": all_consistent,
        "probe": probe,
        "results": results,
    });
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, serde_json::to_string_pretty(&report)? + "\n")?;
    eprintln!("wrote {}", out.display());
    let ok = report["correctness"]["pass"].as_bool() != Some(false) && all_consistent;
    if !ok {
        bail!("bench speed: correctness FAILED (see {})", out.display());
    }
    Ok(())
}

/// Per-kernel GPU times (`QWASI_GPU_PROFILE=1`) of `steps` passes, per pass.
#[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]
pub(super) fn print_profile(what: &str, profile: &[(&str, usize, f64)], steps: usize) {
    if profile.is_empty() || steps == 0 {
        return;
    }
    eprintln!(
        "[bench] per-kernel GPU time per {what} (mean of {steps}; event pairs add ~4 us per launch):"
    );
    let total: f64 = profile.iter().map(|p| p.2).sum();
    for (name, n, ms) in profile.iter().take(25) {
        eprintln!(
            "    {name:<24} {:>8.1} launches {:>9.4} ms ({:>4.1}%)",
            *n as f64 / steps as f64,
            ms / steps as f64,
            100.0 * ms / total
        );
    }
    eprintln!(
        "    total kernel time {:.4} ms per {what}",
        total / steps as f64
    );
}

#[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]
pub(super) fn profile_json(profile: &[(&str, usize, f64)]) -> Vec<serde_json::Value> {
    profile
        .iter()
        .map(|(n, c, ms)| json!({"kernel": n, "launches": c, "ms": ms}))
        .collect()
}
