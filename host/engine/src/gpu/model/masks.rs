//! Constrained rows' readouts on the device (issue 24). A constrained row
//! keeps its device readout (greedy, head, weights): the step's forward pass
//! is launched first, the host computes the row's allowed-token mask
//! meanwhile ([`crate::readout::mask::MaskSource`]), uploads it (vocab / 32
//! words) and runs the row's readout kernels over the mask, which read a
//! token left out as `-inf` (`kernels/token_mask.h`). The decode graphs
//! never see a mask (their greedy statistics pass a null table), so
//! unconstrained rows run exactly as before; a constrained greedy row pays
//! one extra argmax launch pair, the upload and a 12-byte copy.

use super::embed::ARGMAX_BLOCKS;
use super::readout::{check_head, greedy_sampled};
use super::{F, GpuModel, GpuSequence, Scratch};
use crate::backend::{BatchItem, StepOut, Want, step_one};
use crate::gpu::kernels::{self, Launch};
use crate::gpu::{dptr, i};
use crate::readout::mask::TokenMask;
use anyhow::{Result, bail};

impl GpuModel {
    /// A row that runs on its own: through the per-sequence readouts, or
    /// (constrained) its forward pass, then its mask, then its readout over it.
    pub(super) fn step_alone(&self, item: &mut BatchItem<'_, GpuSequence>) -> Result<StepOut> {
        let at = std::mem::take(&mut item.snapshots.at);
        let id = item.seq.id;
        let (out, taken) = self.with_pass_captures(id, at, || self.step_alone_now(item));
        item.snapshots.taken = taken;
        out
    }

    /// [`GpuModel::step_alone`], its snapshots set up.
    fn step_alone_now(&self, item: &mut BatchItem<'_, GpuSequence>) -> Result<StepOut> {
        let Some(source) = item.mask.as_mut() else {
            return step_one(self, item);
        };
        if matches!(item.want, Want::Nothing) {
            return step_one(self, item);
        }
        let mut sc = self.scratch.lock().unwrap();
        self.dev.bind()?;
        let logits = self.logits_device(item.seq, item.tokens, &mut sc)?;
        // Computed on the host while the device runs the step.
        let mask = source()?;
        let table = self.upload_masks(&mut sc, &[Some(&mask)])?;
        self.read_masked(&mut sc, logits, table, &mask, &mut item.want)
    }

    /// Uploads the masks of a step's head rows (`None`: unconstrained): a
    /// table of one device address per row (0 for `None`), then the masks'
    /// words. Returns the table's address (0 when no row has a mask). The
    /// copy waits for the step's launches before it (the synchronous copies
    /// are ordered with the launch stream), so it follows the mask's
    /// computation on the host.
    pub(super) fn upload_masks(
        &self,
        sc: &mut Scratch,
        rows: &[Option<&TokenMask>],
    ) -> Result<u64> {
        if rows.iter().all(Option::is_none) {
            return Ok(0);
        }
        let words = self.cfg.vocab_size.div_ceil(32);
        let masked = rows.iter().flatten().count();
        let buf = sc.get(&self.dev, "masks", rows.len() * 8 + masked * words * 4)?;
        let mut host = vec![0u32; rows.len() * 2];
        let mut at = buf + (rows.len() * 8) as u64;
        for (j, m) in rows.iter().enumerate() {
            let Some(m) = m else { continue };
            if m.words().len() != words {
                bail!(
                    "a token mask of {} words for a vocabulary of {}",
                    m.words().len(),
                    self.cfg.vocab_size
                );
            }
            host[2 * j] = at as u32;
            host[2 * j + 1] = (at >> 32) as u32;
            host.extend_from_slice(m.words());
            at += (words * 4) as u64;
        }
        self.dev.htod(buf, &host)?;
        Ok(buf)
    }

    /// What `want` reads from the row at `logits` under `mask`, whose table
    /// entry is at `entry` (see [`GpuModel::upload_masks`]).
    pub(super) fn read_masked(
        &self,
        sc: &mut Scratch,
        logits: u64,
        entry: u64,
        mask: &TokenMask,
        want: &mut Want<'_>,
    ) -> Result<StepOut> {
        let vocab = self.cfg.vocab_size;
        Ok(match want {
            Want::Nothing => StepOut::Extended,
            Want::Greedy => {
                let [t, m, l, _] = self.greedy_rows(sc, logits, 1, entry)?[0];
                StepOut::Greedy(greedy_sampled([t, m, l], vocab)?)
            }
            Want::Top(k) => {
                check_head(*k)?;
                StepOut::Top(self.top_at(sc, logits, *k, entry)?)
            }
            Want::Weighted(w, plan) => {
                check_head(w.head)?;
                StepOut::Weighted(self.weighted_at(
                    sc,
                    logits,
                    *w,
                    &mut **plan,
                    Some((entry, mask)),
                )?)
            }
            Want::Logits => {
                let mut row = self.logits_at(logits)?;
                mask.apply(&mut row, 0);
                StepOut::Logits(row)
            }
        })
    }

    /// The greedy pick, max and log-sum-exp (`[token bits, max, lse, _]`)
    /// of `rows` logits rows at `logits` under the mask table `masks`.
    pub(super) fn greedy_rows(
        &self,
        sc: &mut Scratch,
        logits: u64,
        rows: usize,
        masks: u64,
    ) -> Result<Vec<[f32; 4]>> {
        let d = &self.dev;
        let part = sc.get(d, "mask_part", rows * ARGMAX_BLOCKS * 3 * F)?;
        let stats = sc.get(d, "mask_stats", rows * 4 * F)?;
        kernels::argmax_partial(
            d,
            Launch::new((ARGMAX_BLOCKS as u32, rows as u32, 1), (256, 1, 1), 0),
            dptr(logits),
            i(self.cfg.vocab_size),
            dptr(masks),
            dptr(part),
        )?;
        kernels::argmax_final(
            d,
            Launch::new((rows as u32, 1, 1), (256, 1, 1), 0),
            dptr(part),
            i(ARGMAX_BLOCKS),
            dptr(stats),
            dptr(0),
        )?;
        let mut out = vec![[0f32; 4]; rows];
        d.dtoh(&mut out, stats)?;
        Ok(out)
    }
}
