//! The weighted rows of a batched step read out together (issue 23:
//! [`GpuModel::weighted_readout`], `gpu/model/weighted_rows.rs`) against
//! the host's reading of the same logits.
//!
//! First the readout alone: seeded logits rows (ties, a NaN, an infinity)
//! uploaded and read together as a batched step reads its weighted rows
//! (a subset of the rows, out of order, different temperatures and min-p,
//! two rows constrained by a mask, plans asking for the head only, one
//! block (the last row's short last block among them: the gather's edge)
//! and the whole row), and each row alone through the batch-1 readout:
//! both must equal the host's `read_weighted` of the row (masked on the
//! host): the head, the block sums and heavy count the plan was handed, and
//! the logits read, bit for bit (the log-sum-exp within [`LSE_TOL`]).
//!
//! Then the draws: rows with different sampling settings (temperature and
//! min-p drawn from block sums, top-p settings that decide in the head or
//! need the whole row, a constrained row, a greedy and a top-k neighbour)
//! decode in batched steps, arriving in turn (prompts ride beside decode
//! rows), each drawing through its device readout; the same schedule again
//! with every row's logits read back and drawn by the host sampler (masked
//! on the host). Both read the same logits, so every row's tokens must be
//! equal and its log-probabilities within [`DRAW_LOGPROB_TOL`].

use super::model::{GpuModel, GpuSequence, ReadoutCase};
use super::verify_constrained::max_dlogprob;
use crate::backend::{Backend, BatchItem, StepOut};
use crate::readout::mask::{MaskSource, TokenMask};
use crate::readout::{Next, Readout};
use crate::sampling::{
    RowRead, Sampled, Sampler, SamplingParams, TOP_CANDIDATES, WEIGHT_BLOCK, Weighting,
    read_weighted,
};
use anyhow::{Result, anyhow, bail};
use serde::Serialize;

/// Largest difference of a head's log-sum-exp from the host's (the
/// device sums in another order; as the smoke test's head readout).
pub const LSE_TOL: f64 = 1e-4;
/// Largest |log-probability difference| of a device draw from the host's
/// over the same logits (the log-sum-exp's difference, and rounding).
pub const DRAW_LOGPROB_TOL: f32 = 1e-3;

#[derive(Serialize, Clone, Debug)]
pub struct WeightedReport {
    /// Rows of the readout check, and those equal to the host's read
    /// together and read alone.
    pub readout_rows: usize,
    pub readout_together_equal: usize,
    pub readout_alone_equal: usize,
    pub max_lse_diff: f64,
    /// Rows and tokens per row of the draw check; rows whose tokens equal
    /// the host sampler's.
    pub rows: usize,
    pub tokens: usize,
    pub rows_equal: usize,
    pub max_dlogprob: f32,
    /// The most weighted rows one step read out together, and the plans
    /// the device draws made: head only, one block, the whole row.
    pub widest_weighted_step: usize,
    pub reads: [usize; 3],
    /// The first mismatch, if any.
    pub first_mismatch: Option<String>,
    pub pass: bool,
}

/// Seeded logits: `rows` rows of `vocab`, in steps of 1/8 (ties), with a
/// NaN, a -inf and the row's first logit repeated at its end.
fn seeded_rows(vocab: usize, rows: usize) -> Vec<f32> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut out: Vec<f32> = (0..vocab * rows)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            ((u - 0.5) * 96.0).round() / 8.0
        })
        .collect();
    for r in 0..rows {
        let row = &mut out[r * vocab..(r + 1) * vocab];
        if vocab > 16 {
            row[3] = f32::NAN;
            row[5] = f32::NEG_INFINITY;
            row[vocab - 1] = row[0];
        }
    }
    out
}

/// The readout check's rows over `rows` logits rows of `vocab`: which row
/// each reads, its settings, mask and read.
fn readout_cases(logits: &[f32], vocab: usize, rows: usize) -> Vec<ReadoutCase> {
    let every_third = TokenMask::of(
        &(0..vocab as u32).filter(|t| t % 3 == 1).collect::<Vec<_>>(),
        vocab,
    );
    let row = |r: usize| &logits[r * vocab..(r + 1) * vocab];
    let argmax_block = |z: &[f32]| crate::sampling::argmax(z) as usize / WEIGHT_BLOCK;
    let last_block = vocab.div_ceil(WEIGHT_BLOCK) - 1;
    let w = |temperature, min_p| Weighting {
        head: TOP_CANDIDATES,
        temperature,
        min_p,
    };
    let masked_argmax = argmax_block(&every_third.masked(row(1)));
    let last = rows - 1;
    vec![
        ReadoutCase {
            row: last,
            w: w(0.7, 0.05),
            mask: None,
            read: RowRead::Block(last_block),
        },
        ReadoutCase {
            row: 0,
            w: w(1.0, 0.0),
            mask: None,
            read: RowRead::Block(argmax_block(row(0))),
        },
        ReadoutCase {
            row: 3.min(last),
            w: w(0.3, 0.0),
            mask: None,
            read: RowRead::Head,
        },
        ReadoutCase {
            row: 5.min(last),
            w: w(1.0, 0.0),
            mask: None,
            read: RowRead::Whole,
        },
        ReadoutCase {
            row: 1,
            w: w(1.0, 0.0),
            mask: Some(every_third.clone()),
            read: RowRead::Block(masked_argmax),
        },
        ReadoutCase {
            row: 4.min(last),
            w: w(1.5, 0.2),
            mask: Some(every_third),
            read: RowRead::Whole,
        },
    ]
}

/// The readout check; fills the report's readout fields.
fn readout_check(m: &GpuModel, r: &mut WeightedReport) -> Result<()> {
    let vocab = m.config().vocab_size;
    let rows = 7;
    let logits = seeded_rows(vocab, rows);
    let cases = readout_cases(&logits, vocab, rows);
    r.readout_rows = cases.len();
    let same_f32 = |a: &[f32], b: &[f32]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    };
    for together in [true, false] {
        let got = m.weighted_readout(&logits, &cases, together)?;
        for (k, (c, g)) in cases.iter().zip(&got).enumerate() {
            let z = &logits[c.row * vocab..(c.row + 1) * vocab];
            let z = c
                .mask
                .as_ref()
                .map_or_else(|| z.to_vec(), |mk| mk.masked(z));
            let mut sums = (Vec::new(), 0);
            let want = read_weighted(&z, c.w, &mut |_, s| {
                sums = (s.blocks.to_vec(), s.heavy);
                c.read
            });
            let head_same = g.row.head.top.len() == want.head.top.len()
                && g.row
                    .head
                    .top
                    .iter()
                    .zip(&want.head.top)
                    .all(|(a, b)| a.0 == b.0 && a.1.to_bits() == b.1.to_bits());
            let lse = (g.row.head.lse - want.head.lse).abs();
            r.max_lse_diff = r
                .max_lse_diff
                .max(if lse.is_nan() { f64::INFINITY } else { lse });
            let same = head_same
                && lse <= LSE_TOL
                && g.row.read == want.read
                && g.blocks.len() == sums.0.len()
                && g.blocks
                    .iter()
                    .zip(&sums.0)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
                && g.heavy == sums.1
                && same_f32(&g.row.logits, &want.logits);
            if same {
                match together {
                    true => r.readout_together_equal += 1,
                    false => r.readout_alone_equal += 1,
                }
            } else if r.first_mismatch.is_none() {
                let how = if together { "together" } else { "alone" };
                r.first_mismatch = Some(format!(
                    "readout case {k} (row {}, {:?}) read {how}: head equal {head_same}, \
                     lse diff {lse:e}, heavy {} vs {}",
                    c.row, c.read, g.heavy, sums.1
                ));
            }
        }
    }
    Ok(())
}

/// The draw check's sampling settings, one per row (cycled over the
/// prompts), and whether the row is constrained.
fn draw_settings() -> Vec<(SamplingParams, bool)> {
    let p = |temperature, top_p, min_p, seed, logprobs| SamplingParams {
        temperature,
        top_p,
        min_p,
        seed: Some(seed),
        logprobs,
        ..Default::default()
    };
    vec![
        (p(1.0, 1.0, 0.0, 11, Some(2)), false),
        (p(0.7, 1.0, 0.05, 12, None), false),
        (p(1.0, 0.9, 0.0, 13, Some(1)), false),
        (p(0.1, 0.5, 0.0, 14, None), false),
        (p(1.2, 1.0, 0.0, 15, Some(3)), true),
        (SamplingParams::default(), false),
        (
            SamplingParams {
                temperature: 0.8,
                top_k: 20,
                seed: Some(16),
                ..Default::default()
            },
            false,
        ),
        (p(1.0, 1.0, 0.1, 17, None), false),
    ]
}

/// One row of the draw check.
struct Row {
    prompt: Vec<u32>,
    start: usize,
    readout: Readout,
    mask: Option<TokenMask>,
    sampler: Sampler,
    seq: GpuSequence,
    draws: Vec<Sampled>,
}

/// Counts of a step's weighted plans (device run), and its widest step.
#[derive(Default)]
struct Seen {
    reads: [usize; 3],
    widest: usize,
}

/// The rows decoded `n` tokens each in batched steps, row r arriving at
/// step r; `host`: every row's logits read back and drawn on the host.
fn draw_run(
    m: &GpuModel,
    prompts: &[Vec<u32>],
    n: usize,
    host: bool,
    seen: &mut Seen,
) -> Result<Vec<Vec<Sampled>>> {
    let vocab = m.config().vocab_size;
    let allowed: Vec<u32> = (0..vocab as u32).filter(|t| t % 3 == 1).collect();
    let settings = draw_settings();
    let mut rows: Vec<Row> = settings
        .iter()
        .enumerate()
        .map(|(r, (p, masked))| Row {
            prompt: prompts[r % prompts.len()].clone(),
            start: r,
            readout: if host {
                Readout::Logits
            } else {
                Readout::choose(p, m)
            },
            mask: masked.then(|| TokenMask::of(&allowed, vocab)),
            sampler: Sampler::new(p.clone()),
            seq: m.new_sequence(),
            draws: Vec::new(),
        })
        .collect();
    for step in 0.. {
        if rows.iter().all(|r| r.draws.len() == n) {
            break;
        }
        let live: Vec<usize> = (0..rows.len())
            .filter(|&r| rows[r].start <= step && rows[r].draws.len() < n)
            .collect();
        let inputs: Vec<Vec<u32>> = live
            .iter()
            .map(|&r| match rows[r].draws.last() {
                Some(s) => vec![s.token],
                None => rows[r].prompt.clone(),
            })
            .collect();
        let mut slots: Vec<crate::readout::DrawSlot> = live.iter().map(|_| None).collect();
        let outs = {
            let mut items: Vec<BatchItem<'_, GpuSequence>> = Vec::new();
            let running = rows
                .iter_mut()
                .filter(|r| r.start <= step && r.draws.len() < n);
            for ((row, toks), slot) in running.zip(&inputs).zip(&mut slots) {
                let mask = match (&row.mask, host) {
                    (Some(mk), false) => {
                        let mk = mk.clone();
                        Some(Box::new(move || Ok(mk.clone())) as Box<MaskSource<'_>>)
                    }
                    _ => None,
                };
                items.push(BatchItem {
                    seq: &mut row.seq,
                    tokens: toks,
                    want: row.readout.want(&mut row.sampler, slot),
                    mask,
                    snapshots: Default::default(),
                });
            }
            m.step(&mut items)
        };
        let weighted = outs
            .iter()
            .filter(|o| matches!(o, Ok(StepOut::Weighted(_))))
            .count();
        seen.widest = seen.widest.max(weighted);
        for ((&r, out), slot) in live.iter().zip(outs).zip(&mut slots) {
            let out = out?;
            if let StepOut::Weighted(w) = &out {
                seen.reads[match w.read {
                    RowRead::Head => 0,
                    RowRead::Block(_) => 1,
                    RowRead::Whole => 2,
                }] += 1;
            }
            let row = &mut rows[r];
            let s = match Readout::next(out, &mut row.sampler, slot)? {
                Some(Next::Sampled(s)) => s,
                Some(Next::Logits(l)) => {
                    let l = match &row.mask {
                        Some(mk) => mk.masked(&l),
                        None => l,
                    };
                    let context: Vec<u32> = row
                        .prompt
                        .iter()
                        .copied()
                        .chain(row.draws.iter().map(|d| d.token))
                        .collect();
                    row.sampler.sample(&l, &context, row.prompt.len())
                }
                None => bail!("row {r} read nothing"),
            };
            row.draws.push(s);
        }
    }
    Ok(rows.into_iter().map(|r| r.draws).collect())
}

/// Both checks over `m`, the draw check from `prompts` (`n` tokens a row).
pub fn weighted_check(m: &GpuModel, prompts: &[Vec<u32>], n: usize) -> Result<WeightedReport> {
    if prompts.is_empty() || n == 0 {
        return Err(anyhow!("the weighted check needs a prompt and a token"));
    }
    let mut r = WeightedReport {
        readout_rows: 0,
        readout_together_equal: 0,
        readout_alone_equal: 0,
        max_lse_diff: 0.0,
        rows: 0,
        tokens: n,
        rows_equal: 0,
        max_dlogprob: 0.0,
        widest_weighted_step: 0,
        reads: [0; 3],
        first_mismatch: None,
        pass: false,
    };
    readout_check(m, &mut r)?;
    let mut seen = Seen::default();
    let dev = draw_run(m, prompts, n, false, &mut seen)?;
    let host = draw_run(m, prompts, n, true, &mut Seen::default())?;
    r.rows = dev.len();
    r.widest_weighted_step = seen.widest;
    r.reads = seen.reads;
    for (k, (d, h)) in dev.iter().zip(&host).enumerate() {
        r.max_dlogprob = r.max_dlogprob.max(max_dlogprob(d, h));
        let dt: Vec<u32> = d.iter().map(|s| s.token).collect();
        let ht: Vec<u32> = h.iter().map(|s| s.token).collect();
        if dt == ht {
            r.rows_equal += 1;
        } else if r.first_mismatch.is_none() {
            r.first_mismatch = Some(format!("draw row {k}: device {dt:?}, host {ht:?}"));
        }
    }
    r.pass = r.readout_together_equal == r.readout_rows
        && r.readout_alone_equal == r.readout_rows
        && r.rows_equal == r.rows
        && r.max_dlogprob <= DRAW_LOGPROB_TOL
        && r.widest_weighted_step >= 2;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The readout cases cover what the batched readout does differently:
    /// rows out of order with one left out, every kind of read, masks, and
    /// the last row's short last block (the gather's edge).
    #[test]
    fn the_readout_cases_cover_every_read() {
        let vocab = 1000; // a short last block
        let logits = seeded_rows(vocab, 7);
        assert!(logits[3].is_nan() && logits[vocab + 5] == f32::NEG_INFINITY);
        assert_eq!(logits[vocab - 1], logits[0]);
        let cases = readout_cases(&logits, vocab, 7);
        let mut rows: Vec<usize> = cases.iter().map(|c| c.row).collect();
        assert_ne!(rows, {
            let mut s = rows.clone();
            s.sort();
            s
        });
        rows.sort();
        rows.dedup();
        assert_eq!(rows.len(), cases.len());
        assert!(!rows.contains(&2));
        assert_eq!((cases[0].row, cases[0].read), (6, RowRead::Block(15)));
        assert!(cases.iter().any(|c| c.read == RowRead::Head));
        assert!(
            cases
                .iter()
                .any(|c| c.read == RowRead::Whole && c.mask.is_some())
        );
        // The masked block case opens a block holding allowed tokens.
        let c = &cases[4];
        let RowRead::Block(b) = c.read else { panic!() };
        let mask = c.mask.as_ref().unwrap();
        assert!((b * WEIGHT_BLOCK..(b + 1) * WEIGHT_BLOCK).any(|t| mask.allows(t as u32)));
        // Every weighted setting of the draw check draws from the weights.
        let weighted = draw_settings()
            .iter()
            .filter(|(p, _)| p.samples_from_weights(TOP_CANDIDATES, 248_320))
            .count();
        assert_eq!(weighted, 6);
    }
}
