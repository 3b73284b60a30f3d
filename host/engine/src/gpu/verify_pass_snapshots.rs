//! `qwasi verify --synthetic`'s check of prefix-cache snapshots taken inside
//! a prompt pass (`model/pass_snapshots.rs`): a prompt runs as one pass
//! asking for snapshots on the chunk grid, alone and as a chunk beside a
//! decode row of another sequence; each snapshot is restored and runs the
//! rest of the prompt, and its next-token distribution and greedy
//! continuation must match the sequence that ran the whole prompt. They
//! can differ only by the projections' rounding at another row count (the
//! state at the snapshot is the one the pass carried on with), so the check
//! asks for the same greedy tokens and the prefix cache's GPU tolerance on
//! logprobs. It also times the prompt with and without the snapshots.

use super::model::{GpuModel, GpuSequence};
use crate::backend::{Backend, BatchItem, PassSnapshots, SeqSnapshot, StepOut, Want};
use crate::sampling::log_softmax;
use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::time::Instant;

/// Largest |Δ logprob| between a resumed and an uninterrupted sequence (as
/// the prefix cache's GPU check: docs/PREFIX_CACHE.md "Exactness on the GPU").
pub const PASS_SNAPSHOT_TOL: f32 = 0.05;

#[derive(Debug, Serialize)]
pub struct PassSnapshotReport {
    pub prompt_len: usize,
    /// Positions asked for; those the pass alone and the batched chunk took.
    pub asked: Vec<usize>,
    pub taken_alone: Vec<usize>,
    pub taken_batched: Vec<usize>,
    /// Over every restored snapshot: the largest |Δ logprob| of the next
    /// token's distribution from the uninterrupted sequence's, and whether
    /// its greedy continuation was the same.
    pub max_dlogprob: f32,
    pub same_greedy: bool,
    /// Per point of the pass alone: the snapshot against one taken after a
    /// pass ending there (what the prefix cache did before).
    pub points: Vec<PointReport>,
    /// The prompt's pass alone without snapshots, with them, and as passes
    /// ending at each point with a snapshot after each (ms, best of 2).
    pub prompt_ms: f64,
    pub prompt_with_snapshots_ms: f64,
    pub prompt_split_ms: f64,
    pub pass: bool,
}

/// An in-pass snapshot at `at` against one taken at the end of a pass of
/// the prompt's first `at` tokens: the largest |difference| of the GDN conv
/// windows and recurrent states (relative to the largest magnitude), and of
/// the logprobs of the next token from each.
#[derive(Debug, Serialize)]
pub struct PointReport {
    pub at: usize,
    pub conv_rel_diff: f32,
    pub state_rel_diff: f32,
    pub next_dlogprob: f32,
    /// Restored, the rest of the prompt, against the uninterrupted sequence.
    pub resumed_dlogprob: f32,
}

fn max_rel(a: &[(Vec<f32>, Vec<f32>)], b: &[(Vec<f32>, Vec<f32>)]) -> (f32, f32) {
    let rel = |x: &[f32], y: &[f32], d: &mut f32, m: &mut f32| {
        for (p, q) in x.iter().zip(y) {
            *d = d.max((p - q).abs());
            *m = m.max(q.abs());
        }
    };
    let (mut dc, mut mc, mut ds, mut ms) = (0f32, 0f32, 0f32, 0f32);
    for ((c1, s1), (c2, s2)) in a.iter().zip(b) {
        rel(c1, c2, &mut dc, &mut mc);
        rel(s1, s2, &mut ds, &mut ms);
    }
    (
        dc / mc.max(f32::MIN_POSITIVE),
        ds / ms.max(f32::MIN_POSITIVE),
    )
}

fn max_dlogprob(a: &[f32], b: &[f32]) -> f32 {
    let (la, lb) = (log_softmax(a), log_softmax(b));
    la.iter()
        .zip(&lb)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// One row running `prompt` from a fresh sequence with snapshots at `at`:
/// its logits and the snapshots taken.
fn run_alone(
    model: &GpuModel,
    prompt: &[u32],
    at: &[usize],
) -> Result<(Vec<f32>, Vec<(usize, Box<dyn SeqSnapshot>)>, GpuSequence)> {
    let mut seq = model.new_sequence();
    let mut items = [BatchItem {
        seq: &mut seq,
        tokens: prompt,
        want: Want::Logits,
        mask: None,
        snapshots: PassSnapshots {
            at: at.to_vec(),
            taken: Vec::new(),
        },
    }];
    let out = model.step(&mut items).pop().context("no step result")??;
    let taken = std::mem::take(&mut items[0].snapshots.taken);
    drop(items);
    let StepOut::Logits(logits) = out else {
        bail!("a logits row read back something else");
    };
    Ok((logits, taken, seq))
}

/// Greedy tokens after `logits` for `n` steps.
fn greedy_run(
    model: &GpuModel,
    seq: &mut GpuSequence,
    logits: &[f32],
    n: usize,
) -> Result<Vec<u32>> {
    let mut out = Vec::with_capacity(n);
    let mut l = logits.to_vec();
    for _ in 0..n {
        let t = crate::sampling::greedy(&l).token;
        out.push(t);
        l = model.forward(seq, &[t])?;
    }
    Ok(out)
}

pub fn pass_snapshots_check(
    model: &GpuModel,
    prompt: &[u32],
    n_gen: usize,
) -> Result<Option<PassSnapshotReport>> {
    let Some(g) = model.pass_snapshot_stride() else {
        return Ok(None);
    };
    let t = prompt.len();
    if t <= g {
        bail!("the in-pass snapshot check needs a prompt longer than {g} tokens");
    }
    // The first grid point, every 1,024 tokens (the default interval) and
    // the last grid point before the end.
    let mut asked = vec![g];
    asked.extend((1..).map(|k| k * 1024).take_while(|&q| q < t));
    asked.push((t - 1) / g * g);
    asked.sort_unstable();
    asked.dedup();
    // Timing, best of two: the prompt in one pass without and with the
    // snapshots, and in passes ending at each point (as before in-pass
    // snapshots).
    let (mut plain_ms, mut snap_ms, mut split_ms) = (f64::MAX, f64::MAX, f64::MAX);
    let ms = |t0: Instant| t0.elapsed().as_secs_f64() * 1e3;
    for _ in 0..2 {
        let t0 = Instant::now();
        run_alone(model, prompt, &[])?;
        plain_ms = plain_ms.min(ms(t0));
        let t0 = Instant::now();
        run_alone(model, prompt, &asked)?;
        snap_ms = snap_ms.min(ms(t0));
        let t0 = Instant::now();
        let mut seq = model.new_sequence();
        let mut from = 0;
        for &q in &asked {
            model.extend(&mut seq, &prompt[from..q])?;
            model.snapshot(&seq).context("a snapshot failed")?;
            from = q;
        }
        model.forward(&mut seq, &prompt[from..])?;
        split_ms = split_ms.min(ms(t0));
    }
    let (want, alone, mut seq) = run_alone(model, prompt, &asked)?;
    let want_greedy = greedy_run(model, &mut seq, &want, n_gen)?;
    drop(seq);
    // The same prompt as a chunk beside another sequence's decode row.
    let mut other = model.new_sequence();
    model.extend(&mut other, &prompt[..5.min(t)])?;
    let mut chunked = model.new_sequence();
    let mut items = [
        BatchItem {
            seq: &mut other,
            tokens: &prompt[5.min(t)..5.min(t) + 1],
            want: Want::Greedy,
            mask: None,
            snapshots: PassSnapshots::default(),
        },
        BatchItem {
            seq: &mut chunked,
            tokens: prompt,
            want: Want::Logits,
            mask: None,
            snapshots: PassSnapshots {
                at: asked.clone(),
                taken: Vec::new(),
            },
        },
    ];
    let outs = model.step(&mut items);
    let batched = std::mem::take(&mut items[1].snapshots.taken);
    for o in outs {
        o?;
    }
    let (mut max_d, mut same) = (0f32, true);
    let mut resumed = Vec::new();
    for (q, snap) in alone.iter().chain(&batched) {
        let mut r = model
            .restore(snap.as_ref())
            .context("restore of an in-pass snapshot failed")?;
        let l = model.forward(&mut r, &prompt[*q..])?;
        let d = max_dlogprob(&l, &want);
        resumed.push(d);
        max_d = max_d.max(d);
        same &= greedy_run(model, &mut r, &l, n_gen)? == want_greedy;
    }
    let mut points = Vec::new();
    for ((q, snap), &resumed_dlogprob) in alone.iter().zip(&resumed) {
        let mut split = model.new_sequence();
        model.extend(&mut split, &prompt[..*q])?;
        let reference = model.snapshot(&split).context("a snapshot failed")?;
        let (a, b) = (
            model.snapshot_gdn(snap.as_ref()),
            model.snapshot_gdn(reference.as_ref()),
        );
        let (conv_rel_diff, state_rel_diff) =
            max_rel(&a.context("download")?, &b.context("download")?);
        let mut r = model.restore(snap.as_ref()).context("restore failed")?;
        let next = model.forward(&mut r, &prompt[*q..*q + 1])?;
        let split_next = model.forward(&mut split, &prompt[*q..*q + 1])?;
        points.push(PointReport {
            at: *q,
            conv_rel_diff,
            state_rel_diff,
            next_dlogprob: max_dlogprob(&next, &split_next),
            resumed_dlogprob,
        });
    }
    let taken_alone: Vec<usize> = alone.iter().map(|s| s.0).collect();
    let taken_batched: Vec<usize> = batched.iter().map(|s| s.0).collect();
    let pass = taken_alone == asked
        && taken_batched == asked
        && same
        && max_d <= PASS_SNAPSHOT_TOL
        && max_d.is_finite();
    Ok(Some(PassSnapshotReport {
        prompt_len: t,
        asked,
        taken_alone,
        taken_batched,
        max_dlogprob: max_d,
        same_greedy: same,
        points,
        prompt_ms: plain_ms,
        prompt_with_snapshots_ms: snap_ms,
        prompt_split_ms: split_ms,
        pass,
    }))
}
