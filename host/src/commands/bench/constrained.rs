//! `qwasi bench --workload speed --constrained`: batch-1 greedy decode held
//! to a grammar (issue 24: at most 10% slower than unconstrained). The
//! regex of `scripts/bench_structured.py` (letters, spaces, commas and
//! periods, longer than the run, so the grammar never ends it) on the
//! Qwen3.6 vocabulary, decoded from the prompt's snapshot three ways: the
//! mask on the device with the greedy readout kept (what `serve` does),
//! the same with the head readout (top-k 20), and the logits copied to the
//! host and masked there (the path before the device masks, for scale).

use anyhow::{Result, anyhow, bail};
use qwasi_engine::backend::{Backend, SeqSnapshot};
use qwasi_engine::constraint::{Compiled, Compiler, ConstraintSpec, Grammar, Step};
use qwasi_engine::readout::{Next, Readout};
use qwasi_engine::sampling::{Sampler, SamplingParams};
use qwasi_engine::tokenizer::Tokenizer;
use serde_json::{Value, json};
use std::time::Instant;

/// The three runs' rates (`tok_per_s` medians besides the runs) over
/// `tokens` tokens each, `runs` times.
pub fn constrained_decode<B: Backend>(
    model: &B,
    snap: &dyn SeqSnapshot,
    tokens: usize,
    runs: usize,
) -> Result<Vec<Value>> {
    let cfg = model.config();
    let tok = Tokenizer::qwen36()?;
    let compiler = Compiler::new(&tok, cfg.vocab_size, &cfg.eos_token_ids)?;
    let spec = ConstraintSpec {
        grammar: Grammar::Regex(format!("[A-Za-z ,.]{{{},}}", 8 * tokens)),
        start_after: None,
    };
    let c = compiler
        .compile(&spec)
        .map_err(|e| anyhow!("the benchmark's regex: {e}"))?;
    let greedy = SamplingParams::default();
    let top_k = SamplingParams {
        temperature: 0.7,
        top_k: 20,
        seed: Some(1),
        ..Default::default()
    };
    let mut out = Vec::new();
    for (what, params, host) in [
        ("greedy, mask on the device", greedy.clone(), false),
        ("top-k 20, mask on the device", top_k, false),
        ("greedy, logits masked on the host", greedy, true),
    ] {
        let mut rates = Vec::new();
        let mut readout = Readout::Logits;
        for _ in 0..runs {
            let (rate, r) = run(model, snap, &c, &params, host, tokens)?;
            rates.push(rate);
            readout = r;
        }
        out.push(json!({
            "constrained": what,
            "readout": format!("{readout:?}"),
            "tok_per_s": super::speed::stats(&rates),
        }));
    }
    Ok(out)
}

/// One run: the grammar's first allowed token appended to the prompt, then
/// `tokens` tokens decoded under the grammar; the rate and the readout.
fn run<B: Backend>(
    model: &B,
    snap: &dyn SeqSnapshot,
    c: &Compiled,
    params: &SamplingParams,
    host: bool,
    tokens: usize,
) -> Result<(f64, Readout)> {
    let readout = if host {
        Readout::Logits
    } else {
        Readout::choose(params, model)
    };
    let mut seq = model
        .restore(snap)
        .ok_or_else(|| anyhow!("restore failed"))?;
    let mut sampler = Sampler::new(params.clone());
    let mut constraint = c.start();
    let mut tok = constraint
        .token_mask()?
        .words()
        .iter()
        .enumerate()
        .find(|(_, w)| **w != 0)
        .map(|(i, w)| 32 * i as u32 + w.trailing_zeros())
        .ok_or_else(|| anyhow!("the grammar allows no token"))?;
    constraint.advance(tok)?;
    let t = Instant::now();
    for _ in 0..tokens {
        let next = if host {
            readout.step(model, &mut seq, &[tok], &mut sampler)?
        } else {
            let mask = Box::new(|| constraint.token_mask());
            readout.step_masked(model, &mut seq, &[tok], &mut sampler, mask)?
        };
        tok = match next {
            Next::Sampled(s) => s.token,
            Next::Logits(l) => sampler.sample(constraint.masked(&l)?, &[], 0).token,
        };
        if constraint.advance(tok)? == Step::Done {
            bail!("the benchmark's grammar ended after {tok}");
        }
    }
    Ok((tokens as f64 / t.elapsed().as_secs_f64(), readout))
}
