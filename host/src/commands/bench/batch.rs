//! `qwasi bench --workload batch --backend cuda|hip --synthetic PRESET`: the
//! engine alone decoding B sequences together (issue 23), no HTTP. Per batch
//! size B (`--batches`): B different prompts of each `--lens` length are
//! prefilled one by one, then `--decode-tokens` steps of `Backend::step`
//! decode one token of every sequence (after two untimed steps): greedy, or
//! with `--temperature T` drawn from the whole distribution (each row
//! seeded; the readout the server picks for such a request).
//! Reports the aggregate rate and
//! the step time's median and p99 (every token's inter-token latency), with
//! the fixture check and the batched-against-alone check of the same build.

use super::speed::SpeedArgs;
use anyhow::{Result, bail};
use std::path::Path;

#[derive(clap::Args)]
pub struct BatchArgs {
    /// Batch sizes (sequences decoding together).
    #[arg(long, value_delimiter = ',', default_value = "1,8,16,32,64")]
    batches: Vec<usize>,
    /// Sample every row at this temperature (no top-k or top-p: each row's
    /// weights read on the device) instead of greedy; 0: greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
}

pub fn run(a: &SpeedArgs, b: &BatchArgs, out: &Path) -> Result<()> {
    a.check_gpu_backend("batch")?;
    if b.batches.is_empty() || b.batches.contains(&0) {
        bail!("--batches takes sizes of at least 1");
    }
    if !(b.temperature.is_finite() && b.temperature >= 0.0) {
        bail!("--temperature takes a finite value of at least 0");
    }
    imp(a, b, out)
}

#[cfg(not(any(feature = "cuda", feature = "hip")))]
fn imp(_a: &SpeedArgs, _b: &BatchArgs, _out: &Path) -> Result<()> {
    unreachable!("run() refuses every backend in a build without GPU features")
}

/// The `p` quantile (0..=1) of `v` (sorted in place).
#[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(dead_code))]
fn quantile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[cfg(any(feature = "cuda", feature = "hip"))]
fn imp(a: &SpeedArgs, b: &BatchArgs, out: &Path) -> Result<()> {
    use qwasi_engine::backend::{Backend, BatchItem};
    use qwasi_engine::readout::{DrawSlot, Next, Readout};
    use qwasi_engine::sampling::{Sampler, SamplingParams};
    use serde_json::{Value, json};
    use std::time::Instant;

    let correctness = super::speed::fixture_check(&a.fixtures)?;
    let t0 = Instant::now();
    let model = super::speed::synthetic_model(a)?;
    let vocab = model.config().vocab_size;
    eprintln!(
        "[bench] {}: model in {:.1} s",
        model.device_name(),
        t0.elapsed().as_secs_f64()
    );
    let batched_vs_alone = {
        let prompts: Vec<Vec<u32>> = [300, 37, 5, 1]
            .iter()
            .enumerate()
            .map(|(k, &len)| super::speed::prompt(len + k, vocab))
            .collect();
        let r = qwasi_engine::gpu::verify::batch_check(&model, &prompts, 16)?;
        eprintln!(
            "[bench] batched vs alone: {}/{} rows equal (others first differ at alone margin {:?}), max |dlogprob| {:.2e} (prompt kernels vs decode {:.2e}): {}",
            r.rows_equal,
            r.rows,
            r.diverged_margin,
            r.max_dlogprob,
            r.prompt_vs_decode_dlogprob,
            if r.pass { "PASS" } else { "FAIL" }
        );
        serde_json::to_value(r)?
    };
    let mut results = Vec::new();
    for &len in &a.lens {
        for &bs in &b.batches {
            // Distinct prompts: the rows route to different experts, as users' do.
            let mut seqs = Vec::with_capacity(bs);
            let mut next = Vec::with_capacity(bs);
            let mut samplers = Vec::with_capacity(bs);
            for k in 0..bs {
                let p = super::speed::prompt(len + k, vocab);
                let mut s = model.new_sequence();
                next.push(model.forward_greedy(&mut s, &p[..len])?.token);
                seqs.push(s);
                samplers.push(Sampler::new(SamplingParams {
                    temperature: b.temperature,
                    seed: Some(k as u64),
                    ..Default::default()
                }));
            }
            let readout = Readout::choose(samplers[0].params(), &model);
            let mut steps_ms = Vec::with_capacity(a.decode_tokens);
            let mut t = Instant::now();
            // Two untimed steps first: the eager one that sizes the buffers
            // and the one that captures the graph.
            for k in 0..a.decode_tokens + 2 {
                if k == 2 {
                    // `ncu --profile-from-start off` sees the timed steps only.
                    model.profiler_range(true);
                    let _ = model.take_profile();
                    steps_ms.clear();
                    t = Instant::now();
                }
                let toks: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
                let mut slots: Vec<DrawSlot> = (0..bs).map(|_| None).collect();
                let s0 = Instant::now();
                let outs = {
                    let mut items: Vec<_> = seqs
                        .iter_mut()
                        .zip(&toks)
                        .zip(samplers.iter_mut().zip(&mut slots))
                        .map(|((seq, tok), (sampler, slot))| BatchItem {
                            seq,
                            tokens: tok,
                            want: readout.want(sampler, slot),
                            mask: None,
                            snapshots: Default::default(),
                        })
                        .collect();
                    model.step(&mut items)
                };
                for ((n, o), (sampler, slot)) in next
                    .iter_mut()
                    .zip(outs)
                    .zip(samplers.iter_mut().zip(&mut slots))
                {
                    *n = match Readout::next(o?, sampler, slot)? {
                        Some(Next::Sampled(s)) => s.token,
                        Some(Next::Logits(l)) => sampler.sample(&l, &[], 0).token,
                        None => bail!("a decode row read nothing"),
                    };
                }
                steps_ms.push(s0.elapsed().as_secs_f64() * 1e3);
            }
            let secs = t.elapsed().as_secs_f64();
            model.profiler_range(false);
            // QWASI_GPU_PROFILE=1: GPU time per kernel and step (launches serialise).
            let profile: Vec<Value> = model
                .take_profile()
                .into_iter()
                .take(25)
                .map(|(k, n, ms)| json!({"kernel": k, "launches_per_step": n as f64 / a.decode_tokens as f64, "ms_per_step": ms / a.decode_tokens as f64}))
                .collect();
            for p in profile.iter().take(12) {
                eprintln!("[bench]   {p}");
            }
            let rate = (bs * a.decode_tokens) as f64 / secs;
            let p50 = quantile(&mut steps_ms, 0.5);
            let p99 = quantile(&mut steps_ms, 0.99);
            eprintln!(
                "[bench] {len} prompt, batch {bs:>3}: {rate:>8.1} tok/s aggregate, step p50 {p50:.2} ms p99 {p99:.2} ms"
            );
            results.push(json!({
                "prompt_len": len, "batch": bs, "decode_tokens": a.decode_tokens,
                "temperature": b.temperature, "readout": format!("{readout:?}"),
                "aggregate_tok_per_s": rate, "step_ms_p50": p50, "step_ms_p99": p99,
                "profile": profile,
            }));
        }
    }
    let report: Value = json!({
        "workload": "batch",
        "device": model.device_name(),
        "synthetic": a.synthetic,
        "layers": model.config().layer_kinds.len(),
        "commit": super::commit(),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "correctness": correctness,
        "batched_vs_alone": batched_vs_alone,
        "results": results,
    });
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, serde_json::to_string_pretty(&report)?)?;
    eprintln!("[bench] wrote {}", out.display());
    Ok(())
}
