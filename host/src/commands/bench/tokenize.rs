//! `qwasi bench --workload tokenize`: the time to encode a long prompt,
//! `tokenizers` on the whole text against the engine's encoder (long texts
//! in parallel pieces, issue 27), and a check that both give the same ids;
//! then the ways of encoding the pieces against each other (the shared
//! tokenizer, each worker's own pre-tokenizer, its own word cache too) at
//! several piece sizes, the first encode (workers making their state) and
//! an empty parallel loop (the pool's own cost).
//! The text is `--text FILE`, or a built-in mix of prose, code, JSON and
//! chat markup grown to `--tokenize-tokens` tokens; the tokenizer is the
//! `--model` directory's, or the embedded Qwen3.6 one.

use super::{command, commit, machine, median, ms};
use anyhow::{Context, Result, bail};
use qwasi_engine::tokenizer::{PieceMode, Tokenizer};
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
    let threads = rayon::current_num_threads();
    // The first encode on a fresh tokenizer: every worker makes its own
    // pre-tokenizer (compiles the regex) and starts its word cache.
    let fresh = Tokenizer::from_hf(tok.hf().clone());
    let t0 = Instant::now();
    let first = fresh.encode(&text)?;
    let first_ms = ms(t0.elapsed());
    drop(fresh);
    // Warm every path (the word caches, the thread pool).
    let reference = tok.encode_whole(&text)?;
    if first != reference || tok.encode(&text)? != reference {
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
    let parallel = tok.splits() && threads > 1;
    let pieces = time(&|| tok.encode(&text))?;
    eprintln!(
        "[bench] {} tokens, {} bytes: tokenizers whole {whole:.2} ms, engine encoder {pieces:.2} ms ({:.1}x, {threads} threads, parallel pieces {}), first encode {first_ms:.2} ms, ids equal",
        reference.len(),
        text.len(),
        whole / pieces,
        if parallel { "on" } else { "off" },
    );
    // The ways of encoding the pieces against each other: the shared
    // tokenizer, each worker's own pre-tokenizer, and its own word cache
    // too; at several piece sizes, in parallel and one after the other.
    let mut variants = Vec::new();
    if tok.splits() {
        let modes = [
            ("shared", PieceMode::Shared),
            ("own-pre-tokenizer", PieceMode::OwnPreTokenizer),
            ("own-words", PieceMode::OwnWords),
        ];
        let cases = [(2048, true), (1024, true), (512, true), (2048, false)];
        for (piece, par) in cases {
            for (name, mode) in modes {
                let run = || -> Result<Vec<u32>> {
                    tok.encode_pieces(&text, piece, mode, par)
                        .context("no splitter")?
                };
                if run()? != reference {
                    bail!("{name} at {piece} bytes: ids differ from tokenizers' on this text");
                }
                let t = time(&run)?;
                eprintln!(
                    "[bench]   {name:>18} {piece:>5} B {}: {t:.2} ms",
                    if par { "parallel" } else { "serial  " }
                );
                variants.push(
                    json!({"mode": name, "piece_bytes": piece, "parallel": par, "ms_median": t}),
                );
            }
        }
    }
    // The pool's own cost: one empty task per core.
    let pool = time(&|| {
        use rayon::prelude::*;
        (0..threads).into_par_iter().for_each(|i| {
            std::hint::black_box(i);
        });
        Ok(Vec::new())
    })?;
    eprintln!("[bench] empty parallel loop over {threads} items: {pool:.3} ms");
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
        "first_encode_ms": first_ms,
        "rayon_threads": threads,
        "parallel_pieces": parallel,
        "variants": variants,
        "empty_parallel_loop_ms_median": pool,
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
