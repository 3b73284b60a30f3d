//! The batched decode step against each sequence alone (issue 23): a
//! sequence's greedy tokens do not depend on what else is in the batch.
//!
//! Every prompt runs alone first (its prompt pass, then greedy tokens through
//! the batch-1 decode step). Then all of them run together through
//! [`Backend::step`], twice each, the copies arriving in turn mid-stream (a
//! step holds decode rows and new prompts at once), half the rows reading
//! the greedy token and half the head of the logits: each row's tokens must
//! equal its alone run and its log-probabilities lie within the fixture
//! tolerance, or within twice what the prompt kernels already differ from
//! the decode step on the same tokens (the batched rows take the prompt
//! kernels' projections and experts, which sum in another order;
//! docs/SCHEDULER.md), whichever is larger.

use super::model::{GpuModel, GpuSequence};
use crate::backend::{Backend, BatchItem, StepOut, Want};
use anyhow::{Result, bail};
use serde::Serialize;

/// Largest |log-probability difference| a batched row may show from its
/// alone run (the fixtures' first-token tolerance against transformers).
pub const BATCH_LOGPROB_TOL: f32 = 0.05;

#[derive(Serialize, Clone, Debug)]
pub struct BatchReport {
    pub rows: usize,
    /// Tokens decoded per row.
    pub tokens: usize,
    /// Steps that ran two or more decode rows together, and the most rows
    /// one step held.
    pub batched_steps: usize,
    pub widest_step: usize,
    /// Rows whose tokens all equal their alone run.
    pub rows_equal: usize,
    pub max_dlogprob: f32,
    /// The same tokens' log-probabilities through prompt passes (each
    /// prefix run as one prompt) against the decode step: the difference
    /// the kernels show without batching.
    pub prompt_vs_decode_dlogprob: f32,
    pub pass: bool,
}

/// Greedy tokens and their log-probabilities of `prompt` alone.
fn alone(m: &GpuModel, prompt: &[u32], n: usize) -> Result<(Vec<u32>, Vec<f32>)> {
    let mut seq = m.new_sequence();
    let mut s = m.forward_greedy(&mut seq, prompt)?;
    let (mut toks, mut lps) = (Vec::new(), Vec::new());
    for i in 0..n {
        toks.push(s.token);
        lps.push(s.logprob);
        if i + 1 < n {
            s = m.forward_greedy(&mut seq, &[s.token])?;
        }
    }
    Ok((toks, lps))
}

/// One row of the batched run.
struct Row {
    prompt: Vec<u32>,
    start: usize,
    top: bool,
    seq: GpuSequence,
    toks: Vec<u32>,
    lps: Vec<f32>,
}

/// Runs `prompts` alone and batched (`n` tokens each) and compares them.
pub fn batch_check(m: &GpuModel, prompts: &[Vec<u32>], n: usize) -> Result<BatchReport> {
    let refs = prompts
        .iter()
        .map(|p| alone(m, p, n))
        .collect::<Result<Vec<_>>>()?;
    // Each prompt twice; row r arrives at step 2 r.
    let mut rows: Vec<Row> = (0..2 * prompts.len())
        .map(|r| Row {
            prompt: prompts[r % prompts.len()].clone(),
            start: 2 * r,
            top: r % 2 == 1,
            seq: m.new_sequence(),
            toks: Vec::new(),
            lps: Vec::new(),
        })
        .collect();
    let (mut batched_steps, mut widest) = (0, 0);
    for step in 0.. {
        if rows.iter().all(|r| r.toks.len() == n) {
            break;
        }
        let live: Vec<usize> = (0..rows.len())
            .filter(|&r| rows[r].start <= step && rows[r].toks.len() < n)
            .collect();
        let decoding = live.iter().filter(|&&r| !rows[r].toks.is_empty()).count();
        if decoding >= 2 {
            batched_steps += 1;
            widest = widest.max(decoding);
        }
        let inputs: Vec<Vec<u32>> = live
            .iter()
            .map(|&r| match rows[r].toks.last() {
                Some(&t) => vec![t],
                None => rows[r].prompt.clone(),
            })
            .collect();
        let mut items: Vec<BatchItem<'_, GpuSequence>> = Vec::new();
        let running = rows
            .iter_mut()
            .filter(|r| r.start <= step && r.toks.len() < n);
        for (row, toks) in running.zip(&inputs) {
            items.push(BatchItem {
                seq: &mut row.seq,
                tokens: toks,
                want: if row.top { Want::Top(8) } else { Want::Greedy },
            });
        }
        let outs = m.step(&mut items);
        drop(items);
        for (&r, out) in live.iter().zip(outs) {
            let (tok, lp) = match out? {
                StepOut::Greedy(s) => (s.token, s.logprob),
                StepOut::Top(t) => (t.top[0].0, -t.lse as f32),
                other => bail!("a batched row returned {other:?}"),
            };
            rows[r].toks.push(tok);
            rows[r].lps.push(lp);
        }
    }
    // Each alone token's log-probability again, from a prompt pass over
    // the prompt and the tokens before it.
    let mut prompt_vs_decode = 0f32;
    for (p, (toks, lps)) in prompts.iter().zip(&refs) {
        for i in 0..n {
            let mut seq = m.new_sequence();
            let input: Vec<u32> = p.iter().chain(&toks[..i]).copied().collect();
            let s = m.forward_greedy(&mut seq, &input)?;
            prompt_vs_decode = prompt_vs_decode.max((s.logprob - lps[i]).abs());
        }
    }
    let mut rows_equal = 0;
    let mut max_dlogprob = 0f32;
    for (r, row) in rows.iter().enumerate() {
        let (toks, lps) = &refs[r % prompts.len()];
        if row.toks == *toks {
            rows_equal += 1;
        }
        for (a, b) in row.lps.iter().zip(lps) {
            max_dlogprob = max_dlogprob.max((a - b).abs());
        }
    }
    Ok(BatchReport {
        rows: rows.len(),
        tokens: n,
        batched_steps,
        widest_step: widest,
        rows_equal,
        max_dlogprob,
        prompt_vs_decode_dlogprob: prompt_vs_decode,
        pass: rows_equal == rows.len()
            && max_dlogprob <= BATCH_LOGPROB_TOL.max(2.0 * prompt_vs_decode)
            && widest >= 2,
    })
}
