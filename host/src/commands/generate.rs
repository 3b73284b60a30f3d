//! `qwasi generate`: one completion on the CPU reference backend, or on the GPU
//! (`--backend cuda`, also with `--synthetic PRESET` random weights and `--layers N`).

use super::ModelArgs;
use anyhow::{Result, bail};
use qwasi_engine::backend::Backend;
use qwasi_engine::cpu::CpuModel;
use qwasi_engine::generate::{GenerateRequest, generate};
use qwasi_engine::model::LoadedModel;
use qwasi_engine::sampling::SamplingParams;
use qwasi_engine::tokenizer::{IncrementalDecoder, Tokenizer};
use serde_json::json;
use std::io::Write;
use std::ops::ControlFlow;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt text (encoded with the model's tokenizer; no chat template applied).
    #[arg(
        long,
        conflicts_with = "prompt_tokens",
        required_unless_present = "prompt_tokens"
    )]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids, e.g. 1,2,3.
    #[arg(long, value_delimiter = ',')]
    prompt_tokens: Option<Vec<u32>>,
    /// Maximum number of tokens to generate.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    /// Seed for sampling (same seed, same output).
    #[arg(long)]
    seed: Option<u64>,
    /// Additional token ids that stop generation.
    #[arg(long, value_delimiter = ',')]
    stop_token_ids: Vec<u32>,
    /// Don't stop at the model's end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Report each token's logprob and the top K alternatives (K ≤ 20).
    #[arg(long, value_name = "K")]
    logprobs: Option<usize>,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Compute backend: cpu, or cuda (builds with `--features cuda`) or hip
    /// (builds with `--features hip`).
    #[arg(long, default_value = "cpu")]
    backend: String,
    #[command(flatten)]
    precision: super::PrecisionArgs,
    /// Seeded random weights of a built-in geometry generated on the GPU (e.g.
    /// qwen3.6-35b-a3b), instead of --model; needs --backend cuda (or hip).
    #[arg(long, value_name = "PRESET", conflicts_with = "model")]
    synthetic: Option<String>,
    /// Run only the first N layers (reduced depth).
    #[arg(long)]
    layers: Option<usize>,
}

pub fn run(a: Args) -> Result<()> {
    a.precision.apply(&a.backend)?;
    let t_load = Instant::now();
    if let Some(preset) = a.synthetic.clone() {
        return run_synthetic(&a, &preset, t_load);
    }
    let mut model = LoadedModel::load(a.model.model.as_deref())?;
    if model.is_demo && !a.json {
        eprintln!("note: using the embedded demo model (random weights: its text is meaningless)");
    }
    if let Some(n) = a.layers {
        model.config = qwasi_engine::presets::with_layers(model.config, n)?;
        model.weights.layers.truncate(n);
    }
    let prompt = prompt_ids(&a, model.tokenizer.as_ref())?;
    let tokenizer = model.tokenizer.clone();
    let LoadedModel {
        config, weights, ..
    } = model;
    match a.backend.as_str() {
        "cpu" => {
            let load_s = t_load.elapsed().as_secs_f64();
            drive(
                &CpuModel::new(config, weights),
                &a,
                tokenizer,
                prompt,
                load_s,
            )
        }
        b @ ("cuda" | "hip") => run_gpu(&a, b, config, weights, tokenizer, prompt, t_load),
        other => bail!("unknown backend {other:?} (available: cpu, cuda, hip)"),
    }
}

fn prompt_ids(a: &Args, tokenizer: Option<&Tokenizer>) -> Result<Vec<u32>> {
    Ok(match (&a.prompt, &a.prompt_tokens) {
        (Some(text), _) => match tokenizer {
            Some(t) => t.encode(text)?,
            None => bail!("this model has no tokenizer.json; pass --prompt-tokens"),
        },
        (None, Some(ids)) => ids.clone(),
        (None, None) => bail!("pass --prompt TEXT or --prompt-tokens IDS"),
    })
}

/// The model on the build's GPU backend, or why this build has no `backend`.
#[cfg_attr(not(any(feature = "cuda", feature = "hip")), allow(unused_variables))]
fn run_gpu(
    a: &Args,
    backend: &str,
    config: qwasi_engine::config::ModelConfig,
    weights: qwasi_engine::weights::Weights,
    tokenizer: Option<Tokenizer>,
    prompt: Vec<u32>,
    t_load: Instant,
) -> Result<()> {
    #[cfg(any(feature = "cuda", feature = "hip"))]
    if backend == super::GPU_BACKEND {
        let gpu = qwasi_engine::gpu::model::GpuModel::new(config, &weights)?;
        drop(weights);
        let load_s = t_load.elapsed().as_secs_f64();
        return drive(&gpu, a, tokenizer, prompt, load_s);
    }
    match backend {
        "cuda" => bail!(
            "backend \"cuda\" is not available in this build (rebuild with `--features cuda`)"
        ),
        _ => bail!(
            "backend \"hip\" is not available in this build (rebuild with `--features hip`, without cuda)"
        ),
    }
}

#[cfg(any(feature = "cuda", feature = "hip"))]
fn run_synthetic(a: &Args, preset: &str, t_load: Instant) -> Result<()> {
    use super::GPU_BACKEND;
    if a.backend != GPU_BACKEND {
        bail!("--synthetic needs --backend {GPU_BACKEND}");
    }
    let mut cfg = qwasi_engine::presets::by_name(preset)?;
    if let Some(n) = a.layers {
        cfg = qwasi_engine::presets::with_layers(cfg, n)?;
    }
    if !a.json {
        eprintln!("note: synthetic {preset} with random weights (its text is meaningless)");
    }
    let tokenizer = Tokenizer::qwen36().ok();
    let prompt = prompt_ids(a, tokenizer.as_ref())?;
    let gpu = qwasi_engine::gpu::model::GpuModel::synthetic(cfg, 0x5157_4153_4931)?;
    let load_s = t_load.elapsed().as_secs_f64();
    drive(&gpu, a, tokenizer, prompt, load_s)
}

#[cfg(not(any(feature = "cuda", feature = "hip")))]
fn run_synthetic(_a: &Args, _preset: &str, _t_load: Instant) -> Result<()> {
    bail!("--synthetic needs a GPU backend (rebuild with `--features cuda` or `--features hip`)")
}

fn drive<B: Backend>(
    backend: &B,
    a: &Args,
    tokenizer: Option<Tokenizer>,
    prompt: Vec<u32>,
    load_s: f64,
) -> Result<()> {
    let req = GenerateRequest {
        prompt: prompt.clone(),
        max_tokens: a.max_tokens,
        stop_token_ids: a.stop_token_ids.clone(),
        ignore_eos: a.ignore_eos,
        sampling: SamplingParams {
            temperature: a.temperature,
            top_p: a.top_p,
            top_k: a.top_k,
            min_p: a.min_p,
            seed: a.seed,
            repetition_penalty: a.repetition_penalty,
            presence_penalty: a.presence_penalty,
            frequency_penalty: a.frequency_penalty,
            logit_bias: Vec::new(),
            logprobs: a.logprobs,
        },
    };
    let mut decoder = tokenizer.clone().map(|t| IncrementalDecoder::new(t, true));
    let mut text = String::new();
    let stream = !a.json;
    let start = Instant::now();
    let mut first_token_s = None;
    let out = generate(backend, &req, |s, is_stop| {
        first_token_s.get_or_insert(start.elapsed().as_secs_f64());
        if !is_stop && let Some(d) = decoder.as_mut() {
            let piece = d.push(s.token);
            if stream {
                print!("{piece}");
                let _ = std::io::stdout().flush();
            }
            text.push_str(&piece);
        }
        ControlFlow::Continue(())
    })?;
    if let Some(d) = decoder.as_mut() {
        let rest = d.finish();
        if stream {
            print!("{rest}");
        }
        text.push_str(&rest);
    }
    let total_s = start.elapsed().as_secs_f64();
    let ttft = first_token_s.unwrap_or(total_s);
    let decode_tps = if out.steps.len() > 1 {
        (out.steps.len() - 1) as f64 / (total_s - ttft).max(1e-9)
    } else {
        0.0
    };
    if a.json {
        let mut obj = json!({
            "prompt_tokens": prompt,
            "tokens": out.tokens,
            "text": if tokenizer.is_some() { json!(text) } else { json!(null) },
            "finish_reason": out.finish_reason,
            "stop_token": out.stop_token,
            "timings": {
                "load_s": load_s,
                "ttft_s": ttft,
                "decode_tokens_per_s": decode_tps,
            },
        });
        if a.logprobs.is_some() {
            obj["logprobs"] = out
                .steps
                .iter()
                .map(|s| json!({"token": s.token, "logprob": s.logprob, "top": s.top}))
                .collect();
        }
        println!("{obj}");
    } else {
        println!();
        eprintln!(
            "[{} prompt tokens, {} generated, finish: {:?}; prefill+first token {:.1} ms, decode {:.1} tok/s]",
            prompt.len(),
            out.tokens.len(),
            out.finish_reason,
            ttft * 1e3,
            decode_tps
        );
    }
    Ok(())
}
