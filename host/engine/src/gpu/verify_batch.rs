//! The batched decode step against each sequence alone (issue 23): a
//! sequence's greedy tokens do not depend on what else is in the batch.
//!
//! Every prompt runs alone first (its prompt pass, then greedy tokens through
//! the batch-1 decode step). Then all of them run together through
//! [`Backend::step`], twice each, the copies arriving in turn mid-stream (a
//! step holds decode rows and new prompts at once), half the rows reading
//! the greedy token and half the head of the logits: each row's tokens must
//! equal its alone run (or first differ where the alone run's top two logits
//! lay within the fixtures' margin, a near tie) and its log-probabilities up
//! to there lie within the fixture tolerance, or within twice what the prompt kernels already differ from
//! the decode step on the same tokens (the batched rows take the prompt
//! kernels' projections and experts, which sum in another order;
//! docs/SCHEDULER.md), whichever is larger.

use super::model::{GpuModel, GpuSequence};
use crate::backend::{Backend, BatchItem, StepOut, Want};
use crate::sampling::log_softmax;
use anyhow::{Result, bail};
use serde::Serialize;

/// Largest |log-probability difference| a batched row may show from its
/// alone run (the fixtures' first-token tolerance against transformers).
pub const BATCH_LOGPROB_TOL: f32 = 0.05;
/// A batched row may pick another token than alone only where the alone
/// run's top two logits lie this close (the fixtures' margin), or within
/// twice what its prompt's own prompt kernels and decode step differ by in
/// log-probability, where that is more: on a random-weight model some
/// prompts sit where a rounding difference already moves a logprob by
/// tenths (a router near-tie taking another expert), batched or not.
pub const MARGIN_TOL: f32 = 0.1;

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
    /// The largest top-1 margin (logits) of the alone run where a row's
    /// tokens first differ (a PASS needs it within the row's near-tie margin,
    /// `MARGIN_TOL` or twice its prompt's prompt-vs-decode difference: a near
    /// tie the summation order may break either way).
    pub diverged_margin: Option<f32>,
    pub max_dlogprob: f32,
    /// The same tokens' log-probabilities through prompt passes (each
    /// prefix run as one prompt) against the decode step: the difference
    /// the kernels show without batching.
    pub prompt_vs_decode_dlogprob: f32,
    /// After every step, each row's `last_logits` (what the prefix cache's
    /// prompt-end snapshot stores) is its step's row: its argmax the row's
    /// token, and for greedy rows its log-softmax there the token's
    /// logprob (within 1e-4).
    pub last_logits_match: bool,
    /// Each row whose tokens differ from its alone run: where, at what
    /// margin, and the margin it is allowed (says which row a FAIL comes from).
    pub diverged: Vec<Divergence>,
    pub pass: bool,
}

/// A batched row's first token that differs from its alone run.
#[derive(Serialize, Clone, Debug)]
pub struct Divergence {
    pub row: usize,
    pub prompt_len: usize,
    /// Index of the first differing token.
    pub at: usize,
    /// The alone run's top-1 margin (logits) there.
    pub margin: f32,
    /// The near-tie margin the row is allowed (`MARGIN_TOL` or twice its
    /// prompt's prompt-vs-decode difference).
    pub allowed: f32,
}

/// A sequence alone: its greedy tokens, their log-probabilities and each
/// step's top-1 margin (logits).
struct Alone {
    toks: Vec<u32>,
    lps: Vec<f32>,
    margins: Vec<f32>,
}

/// `prompt` alone: a prompt pass, then greedy tokens through the batch-1
/// decode step, each read as the head of two logits.
fn alone(m: &GpuModel, prompt: &[u32], n: usize) -> Result<Alone> {
    let mut seq = m.new_sequence();
    let mut a = Alone {
        toks: Vec::new(),
        lps: Vec::new(),
        margins: Vec::new(),
    };
    let mut head = m.forward_top(&mut seq, prompt, 2)?;
    for i in 0..n {
        let (t, top) = head.top[0];
        a.toks.push(t);
        a.lps.push(-head.lse as f32);
        a.margins
            .push(head.top.get(1).map_or(f32::INFINITY, |s| top - s.1));
        if i + 1 < n {
            head = m.forward_top(&mut seq, &[t], 2)?;
        }
    }
    Ok(a)
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
    batch_check_every(m, prompts, n, 2)
}

/// [`batch_check`] with row `r` arriving at step `every * r` (1: up to
/// twice the prompts' count decoding together).
pub fn batch_check_every(
    m: &GpuModel,
    prompts: &[Vec<u32>],
    n: usize,
    every: usize,
) -> Result<BatchReport> {
    let refs = prompts
        .iter()
        .map(|p| alone(m, p, n))
        .collect::<Result<Vec<_>>>()?;
    // Each prompt twice; row r arrives at step every * r.
    let mut rows: Vec<Row> = (0..2 * prompts.len())
        .map(|r| Row {
            prompt: prompts[r % prompts.len()].clone(),
            start: every * r,
            top: r % 2 == 1,
            seq: m.new_sequence(),
            toks: Vec::new(),
            lps: Vec::new(),
        })
        .collect();
    let (mut batched_steps, mut widest) = (0, 0);
    let mut last_match = true;
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
                mask: None,
                snapshots: Default::default(),
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
            let top = rows[r].top;
            last_match &= m.last_logits(&rows[r].seq).is_some_and(|l| {
                let g = crate::sampling::greedy(&l);
                g.token == tok && (top || (log_softmax(&l)[tok as usize] - lp).abs() <= 1e-4)
            });
        }
    }
    // Each alone token's log-probability again, from a prompt pass over
    // the prompt and the tokens before it.
    let mut pvd = vec![0f32; prompts.len()];
    for ((p, a), d) in prompts.iter().zip(&refs).zip(&mut pvd) {
        for i in 0..n {
            let mut seq = m.new_sequence();
            let input: Vec<u32> = p.iter().chain(&a.toks[..i]).copied().collect();
            let s = m.forward_greedy(&mut seq, &input)?;
            *d = d.max((s.logprob - a.lps[i]).abs());
        }
    }
    let prompt_vs_decode = pvd.iter().fold(0f32, |a, &b| a.max(b));
    // Per row: the tokens up to the first difference (log-probabilities
    // compared there, the contexts being the same); a difference counts
    // only where the alone run's top two logits lay within its near-tie
    // margin (MARGIN_TOL, or twice its prompt's prompt-vs-decode difference).
    let mut max_dlogprob = 0f32;
    let mut diverged = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        let a = &refs[r % prompts.len()];
        let same = row
            .toks
            .iter()
            .zip(&a.toks)
            .take_while(|(x, y)| x == y)
            .count();
        for i in 0..(same + 1).min(n) {
            max_dlogprob = max_dlogprob.max((row.lps[i] - a.lps[i]).abs());
        }
        if same < n {
            diverged.push(Divergence {
                row: r,
                prompt_len: row.prompt.len(),
                at: same,
                margin: a.margins[same],
                allowed: MARGIN_TOL.max(2.0 * pvd[r % prompts.len()]),
            });
        }
    }
    let rows_equal = rows.len() - diverged.len();
    let near_ties = diverged.iter().filter(|d| d.margin <= d.allowed).count();
    let diverged_margin = diverged.iter().map(|d| d.margin).reduce(f32::max);
    Ok(BatchReport {
        rows: rows.len(),
        tokens: n,
        batched_steps,
        widest_step: widest,
        rows_equal,
        diverged_margin,
        max_dlogprob,
        prompt_vs_decode_dlogprob: prompt_vs_decode,
        last_logits_match: last_match,
        diverged,
        pass: last_match
            && rows_equal + near_ties == rows.len()
            && max_dlogprob <= BATCH_LOGPROB_TOL.max(2.0 * prompt_vs_decode)
            && widest >= 2,
    })
}
