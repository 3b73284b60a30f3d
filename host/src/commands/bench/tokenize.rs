//! `qwasi bench --workload tokenize`: the time to encode a long prompt,
//! `tokenizers` on the whole text against the engine's encoder (long texts
//! in parallel pieces, issue 27), and a check that both give the same ids.
//! The text is `--text FILE`, or a built-in mix of prose, code, JSON and
//! chat markup grown to `--tokenize-tokens` tokens; the tokenizer is the
//! `--model` directory's, or the embedded Qwen3.6 one.

use super::{command, commit, machine, median, ms};
use anyhow::{Context, Result, bail};
use qwasi_engine::tokenizer::Tokenizer;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args)]
pub struct TokenizeArgs {
    /// The prompt to encode (default: a built-in mix grown to `--tokenize-tokens`).
    #[arg(long, value_name = "FILE")]
    text: Option<PathBuf>,
    /// Tokens of the built-in prompt.
    #[arg(long, default_value_t = 8192)]
    tokenize_tokens: usize,
}

/// One block of the built-in prompt: what long prompts are made of.
const MIX: &str = r#"<|im_start|>user
Here is the module I am working on. It reads the configuration, checks every field, and hands the result to the scheduler; the tests don't cover the error paths yet, and I'd like them to.

```rust
pub fn load(path: &Path) -> Result<Config> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let cfg: Config = serde_json::from_str(&text)?;
    if cfg.workers == 0 || cfg.workers > 1024 {
        bail!("workers must be in 1..=1024, got {}", cfg.workers);
    }
    Ok(cfg)
}
```

The configuration it reads:

{"workers": 16, "queue": {"depth": 256, "timeout_ms": 30000}, "models": ["qwen3.6-35b-a3b", "demo"], "log": {"level": "info", "json": true}}

Der Planer verteilt die Aufträge gleichmäßig; 调度器会把任务平均分配给每个工作线程。 Résumé : les erreurs sont renvoyées telles quelles.<|im_end|>
"#;

pub fn run(a: &TokenizeArgs, model: Option<&Path>, runs: usize, out: &Path) -> Result<()> {
    let tok = match model {
        Some(dir) => Tokenizer::from_file(&dir.join("tokenizer.json"))?,
        None => Tokenizer::qwen36()?,
    };
    let text = match &a.text {
        Some(f) => {
            std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?
        }
        None => grow(&tok, a.tokenize_tokens)?,
    };
    // Warm both paths (the BPE word cache, the thread pool).
    let reference = tok.encode_whole(&text)?;
    if tok.encode(&text)? != reference {
        bail!("the parallel encoder's ids differ from tokenizers' on this text");
    }
    let time = |f: &dyn Fn() -> Result<Vec<u32>>| -> Result<f64> {
        let mut v = Vec::with_capacity(runs);
        for _ in 0..runs.max(1) {
            let t0 = Instant::now();
            std::hint::black_box(f()?);
            v.push(ms(t0.elapsed()));
        }
        Ok(median(&v))
    };
    let whole = time(&|| tok.encode_whole(&text))?;
    // One thread encodes whole (pieces would only add their cost).
    let parallel = tok.splits() && rayon::current_num_threads() > 1;
    let pieces = time(&|| tok.encode(&text))?;
    eprintln!(
        "[bench] {} tokens, {} bytes: tokenizers whole {whole:.2} ms, engine encoder {pieces:.2} ms ({:.1}x, {} threads, parallel pieces {}), ids equal",
        reference.len(),
        text.len(),
        whole / pieces,
        rayon::current_num_threads(),
        if parallel { "on" } else { "off" },
    );
    let report = json!({
        "workload": "tokenize",
        "command": command(),
        "commit": commit(),
        "machine": machine(),
        "text": a.text.as_ref().map_or_else(|| "built-in mix".to_string(), |p| p.display().to_string()),
        "tokens": reference.len(),
        "bytes": text.len(),
        "runs": runs,
        "whole_ms_median": whole,
        "encode_ms_median": pieces,
        "speedup": whole / pieces,
        "rayon_threads": rayon::current_num_threads(),
        "parallel_pieces": parallel,
        "ids_equal": true,
    });
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("cannot write {}", out.display()))?;
    eprintln!("[bench] wrote {}", out.display());
    Ok(())
}

/// The built-in mix repeated until it has at least `tokens` tokens.
fn grow(tok: &Tokenizer, tokens: usize) -> Result<String> {
    let per = tok.encode(MIX)?.len().max(1);
    Ok(MIX.repeat(tokens.div_ceil(per)))
}
