//! The readouts of a batched step once its kernels ran ([`super::batch`]):
//! every row's next-token distribution read as its [`Want`] asks, each kind
//! for all its rows at once. Greedy rows read the step's statistics in one
//! copy (constrained ones one argmax launch pair under their masks), rows
//! reading a head one launch pair and one copy, rows drawing from the whole
//! distribution one weighted readout ([`super::weighted_rows`]); only rows
//! that want their logits, and weighted rows whose plan asks for the whole
//! row, copy a row each.

use super::readout::{check_head, greedy_sampled};
use super::weighted_rows::WeightedReq;
use super::{F, GpuModel, GpuSequence, Scratch};
use crate::backend::{BatchItem, StepOut, Want};
use crate::readout::mask::TokenMask;
use crate::sampling::WeightedRow;
use anyhow::{Result, anyhow};

impl GpuModel {
    /// The readouts of `rows` (decode rows, head rows `0..rows.len()`),
    /// then of `chunks` (the head rows after them, those that read), over
    /// the step's `heads` logits rows in `bat_logits` and its greedy
    /// statistics in `bat_stats`; `masks`: each of those rows' mask, if
    /// constrained (computed while the step ran).
    pub(super) fn batch_readout(
        &self,
        sc: &mut Scratch,
        batch: &mut [BatchItem<'_, GpuSequence>],
        rows: &[usize],
        chunks: &[usize],
        heads: usize,
        mut masks: Vec<Option<Result<TokenMask>>>,
    ) -> Result<Vec<Result<StepOut>>> {
        let d = &self.dev;
        let b = rows.len();
        let vocab = self.cfg.vocab_size;
        let logits = sc.get(d, "bat_logits", heads * vocab * F)?;
        // The greedy rows' statistics in one copy.
        let mut stats = Vec::new();
        let all = rows.iter().chain(chunks);
        if all.clone().any(|&r| matches!(batch[r].want, Want::Greedy)) {
            stats = vec![[0f32; 4]; heads];
            d.dtoh(&mut stats, sc.get(d, "bat_stats", heads * 4 * F)?)?;
        }
        // Head row of each: decode row k is row k; the chunks that want a
        // readout follow in order.
        let mut next = b;
        let js: Vec<usize> = all
            .clone()
            .enumerate()
            .map(|(k, &r)| match (&batch[r].want, k < b) {
                (Want::Nothing, _) => usize::MAX,
                (_, true) => k,
                (_, false) => {
                    next += 1;
                    next - 1
                }
            })
            .collect();
        // Each reading row's logits row, for `last_logits`.
        sc.batch_logits = all
            .clone()
            .zip(&js)
            .filter(|&(_, &j)| j < heads)
            .map(|(&r, &j)| {
                let s = &*batch[r].seq;
                (s.id, s.pos, logits + (j * vocab * F) as u64)
            })
            .collect();
        let mut head_masks = vec![None; heads];
        for (m, &j) in masks.iter().zip(&js) {
            if let Some(Ok(m)) = m {
                head_masks[j] = Some(m);
            }
        }
        let table = self.upload_masks(sc, &head_masks)?;
        // Constrained greedy rows: every head row's pick under its mask in
        // one launch pair, in place of the step's own.
        let greedy = |k: usize, r: usize| matches!(batch[r].want, Want::Greedy) && js[k] < heads;
        if all
            .clone()
            .enumerate()
            .any(|(k, &r)| greedy(k, r) && matches!(masks[k], Some(Ok(_))))
        {
            let picks = self.greedy_rows(sc, logits, heads, table)?;
            for (k, &j) in js.iter().enumerate() {
                if matches!(masks[k], Some(Ok(_))) && j < heads {
                    stats[j] = picks[j];
                }
            }
        }
        // Every head's top logits in one copy where rows read them.
        let mut tops = Vec::new();
        if all.clone().any(|&r| matches!(batch[r].want, Want::Top(_))) {
            tops = self.heads_at(sc, logits, heads, table)?;
        }
        let ks: Vec<usize> = all.clone().copied().collect();
        let mut weighted = self.weighted_batch(sc, batch, &ks, &js, &masks, logits, heads, table);
        Ok(all
            .enumerate()
            .map(|(k, &r)| {
                let want = &mut batch[r].want;
                let j = js[k];
                if matches!(want, Want::Nothing) {
                    return Ok(StepOut::Extended);
                }
                if let Some(w) = weighted[k].take() {
                    return w.map(StepOut::Weighted);
                }
                let row = logits + (j * vocab * F) as u64;
                match masks[k].take() {
                    Some(Err(e)) => return Err(e),
                    Some(Ok(m)) if !matches!(want, Want::Top(_) | Want::Greedy) => {
                        return self.read_masked(sc, row, table + (j * 8) as u64, &m, want);
                    }
                    _ => {}
                }
                Ok(match want {
                    Want::Nothing => StepOut::Extended,
                    Want::Greedy => {
                        let [t, m, l, _] = stats[j];
                        StepOut::Greedy(greedy_sampled([t, m, l], vocab)?)
                    }
                    Want::Top(k) => StepOut::Top(self.head_in(&tops, j, *k)?),
                    Want::Logits => StepOut::Logits(self.logits_at(row)?),
                    Want::Weighted(..) => {
                        return Err(anyhow!("the batched readout left a weighted row unread"));
                    }
                })
            })
            .collect())
    }

    /// Every weighted row of the step (`order[k]`: row `k`'s index in
    /// `batch`, `js[k]` its head row; constrained by its mask among `masks`)
    /// read in one [`GpuModel::weighted_rows`]: its result at `k` (`None`
    /// for the other rows and for rows whose mask failed, which report
    /// that; an error for a row asking for a head too long). A failed
    /// readout fails every weighted row.
    #[allow(clippy::too_many_arguments)]
    fn weighted_batch(
        &self,
        sc: &mut Scratch,
        batch: &mut [BatchItem<'_, GpuSequence>],
        order: &[usize],
        js: &[usize],
        masks: &[Option<Result<TokenMask>>],
        logits: u64,
        heads: usize,
        table: u64,
    ) -> Vec<Option<Result<WeightedRow>>> {
        let mut out: Vec<Option<Result<WeightedRow>>> = order.iter().map(|_| None).collect();
        let mut k_of = vec![usize::MAX; batch.len()];
        for (k, &r) in order.iter().enumerate() {
            k_of[r] = k;
        }
        let (mut ks, mut reqs) = (Vec::new(), Vec::new());
        for (it, &k) in batch.iter_mut().zip(&k_of) {
            // Rows outside the pass (run alone) have no `k`.
            let (Want::Weighted(w, plan), Some(mask)) = (&mut it.want, masks.get(k)) else {
                continue;
            };
            let mask = match mask {
                Some(Err(_)) => continue,
                Some(Ok(m)) => Some(m),
                None => None,
            };
            if let Err(e) = check_head(w.head) {
                out[k] = Some(Err(e));
                continue;
            }
            ks.push(k);
            reqs.push(WeightedReq {
                row: js[k],
                w: *w,
                plan: &mut **plan,
                mask,
            });
        }
        match self.weighted_rows(sc, logits, heads, table, &mut reqs) {
            Ok(got) => {
                for (&k, row) in ks.iter().zip(got) {
                    out[k] = Some(Ok(row));
                }
            }
            Err(e) => {
                let msg = format!("{e:#}");
                for &k in &ks {
                    out[k] = Some(Err(anyhow!("{msg}")));
                }
            }
        }
        out
    }
}
