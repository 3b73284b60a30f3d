//! `gpu_verify`: the GPU correctness checks of `qwasi verify --backend cuda`
//! without the server's dependencies (quick to build for a device run):
//!
//!     cargo build --release -p qwasi-engine --features cuda --example gpu_verify
//!     gpu_verify [--fixtures DIR | --model DIR | --no-fixtures] [--synthetic PRESET]
//!                [--layers N] [--prompt-len N] [--gen-tokens N] [--json FILE]

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!(
        "gpu_verify: built without the cuda feature; skipping (no GPU backend in this build)"
    );
}

#[cfg(feature = "cuda")]
fn main() -> anyhow::Result<()> {
    use anyhow::{Context, bail};
    use qwasi_engine::gpu::verify::{VerifyOptions, fixture_dirs, run_cli};
    use std::path::PathBuf;
    let mut fixtures = PathBuf::from("tests/fixtures/models");
    let mut model: Option<PathBuf> = None;
    let mut no_fixtures = false;
    let mut o = VerifyOptions {
        fixtures: vec![],
        synthetic: None,
        layers: None,
        prompt_len: 300,
        gen_tokens: 16,
        json: None,
    };
    let mut compare: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--fixtures" => fixtures = val()?.into(),
            "--model" => model = Some(val()?.into()),
            "--no-fixtures" => no_fixtures = true,
            "--compare" => compare = Some(val()?.into()),
            "--synthetic" => o.synthetic = Some(val()?),
            "--layers" => o.layers = Some(val()?.parse()?),
            "--prompt-len" => o.prompt_len = val()?.parse()?,
            "--gen-tokens" => o.gen_tokens = val()?.parse()?,
            "--json" => o.json = Some(val()?.into()),
            "--backend" => {
                let b = val()?;
                if b != "cuda" {
                    bail!("only --backend cuda");
                }
            }
            other => bail!("unknown argument {other}"),
        }
    }
    if let Some(dir) = compare {
        let ok = qwasi_engine::gpu::verify::compare_transformers(&dir, o.json.as_deref())?;
        std::process::exit(if ok { 0 } else { 1 });
    }
    if !no_fixtures {
        o.fixtures = match model {
            Some(d) => vec![d],
            None => fixture_dirs(&fixtures)?,
        };
    }
    if !run_cli(&o)? {
        std::process::exit(1);
    }
    Ok(())
}
