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
    /// Also run a smoke test with seeded random weights of this geometry (e.g. qwen3.6-35b-a3b).
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
    /// Compare against a transformers float32 reference written by
    /// scripts/device/compare_transformers.py into DIR (model/, ref.json, logits_*.f32).
    #[arg(long, value_name = "DIR")]
    compare: Option<PathBuf>,
    /// Write all results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

pub fn run(a: Args) -> Result<()> {
    match a.backend.as_str() {
        "cuda" if !cfg!(feature = "cuda") => {
            bail!("this qwasi was built without the cuda backend; rebuild with `--features cuda`")
        }
        "hip" if !cfg!(all(feature = "hip", not(feature = "cuda"))) => bail!(
            "this qwasi was built without the hip backend; rebuild with `--features hip` (without cuda)"
        ),
        "cuda" | "hip" => imp(a),
        other => bail!("verify supports --backend cuda or hip (got {other:?})"),
    }
}

#[cfg(not(any(feature = "cuda", feature = "hip")))]
fn imp(_a: Args) -> Result<()> {
    unreachable!("run() refuses every backend in a build without GPU features")
}

#[cfg(any(feature = "cuda", feature = "hip"))]
fn imp(a: Args) -> Result<()> {
    use qwasi_engine::gpu::verify::{VerifyOptions, compare_transformers, fixture_dirs, run_cli};
    if let Some(dir) = &a.compare {
        if !compare_transformers(dir, a.json.as_deref())? {
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
    let ok = run_cli(&VerifyOptions {
        fixtures,
        synthetic: a.synthetic,
        layers: a.layers,
        prompt_len: a.prompt_len,
        gen_tokens: a.gen_tokens,
        json: a.json,
    })?;
    if !ok {
        bail!("verify: FAIL");
    }
    Ok(())
}
