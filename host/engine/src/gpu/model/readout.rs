//! What the `Backend` readouts copy back from the device (`readout.rs`'s
//! protocol): the logits row, the greedy token and its log-probability
//! (argmax + log-sum-exp on the device, 12 bytes), the head of the row (the
//! 64 largest logits, `kernels/sampling.cu`), or the row's weights summed
//! per block of 64 and then what the host sampler asks for
//! ([`super::weighted_rows`], which reads many rows at once).

use super::weighted_rows::WeightedReq;
use super::{F, GpuModel, GpuSequence, Scratch};
use crate::gpu::kernels::{self, Launch};
use crate::gpu::{dptr, i};
use crate::readout::mask::TokenMask;
use crate::sampling::{
    RowPlanner, Sampled, TOP_CANDIDATES, TopLogits, WeightedRow, Weighting, key_parts,
};
use anyhow::{Result, bail};

/// kernels/sampling.cu: keys per head (TOP_K, the sampler's candidates),
/// logits per slice of the first pass (one sort round), and the head's size
/// in 8-byte words (keys, then the max and the log-sum-exp as two f32).
pub(super) const TOP_KEYS: usize = TOP_CANDIDATES;
pub(super) const TOP_PER_PART: usize = 4096 - TOP_KEYS;
pub(super) const HEAD_WORDS: usize = TOP_KEYS + 1;

/// Fails (before any work) when more than the device's head is asked for.
pub(super) fn check_head(k: usize) -> Result<()> {
    if k > TOP_KEYS {
        bail!("the device reads at most {TOP_KEYS} top logits, {k} asked for");
    }
    Ok(())
}

/// The first `k` (at most `TOP_KEYS`) entries of a head read back from the device.
pub(super) fn head_of(words: &[u64], k: usize) -> TopLogits {
    TopLogits {
        top: words[..k].iter().map(|&w| key_parts(w)).collect(),
        lse: f32::from_bits((words[TOP_KEYS] >> 32) as u32) as f64,
    }
}

impl GpuModel {
    /// The logits after `tokens` (checked): the fused decode step for one
    /// token, prompt passes and the lm_head otherwise.
    pub(super) fn logits_device(
        &self,
        seq: &mut GpuSequence,
        tokens: &[u32],
        sc: &mut Scratch,
    ) -> Result<u64> {
        self.check_tokens(seq, tokens)?;
        sc.last_logits = None;
        let logits = if tokens.len() == 1 && self.opts.fused_decode {
            self.decode_step(seq, tokens[0])?.0
        } else {
            let nf = self.run_passes(seq, tokens, sc)?;
            self.head.logits(self, sc, nf)?
        };
        sc.last_logits = Some((seq.id, seq.pos, logits));
        Ok(logits)
    }

    /// Launches the head of `logits` (kernels/sampling.cu) under the mask
    /// table `masks` (0: none; [`super::masks`]): `HEAD_WORDS` words at the
    /// returned buffer, followed by `extra` bytes for the caller.
    fn read_head(&self, sc: &mut Scratch, logits: u64, extra: usize, masks: u64) -> Result<u64> {
        let n = self.cfg.vocab_size;
        let parts = n.div_ceil(TOP_PER_PART);
        let keys = sc.get(&self.dev, "top_parts", parts * TOP_KEYS * 8)?;
        let ms = sc.get(&self.dev, "top_ms", parts * 2 * F)?;
        let out = sc.get(&self.dev, "top_out", HEAD_WORDS * 8 + extra)?;
        kernels::logits_top_part(
            &self.dev,
            Launch::new((parts as u32, 1, 1), (1024, 1, 1), 0),
            dptr(logits),
            i(n),
            i(TOP_PER_PART),
            dptr(0),
            dptr(masks),
            dptr(keys),
            dptr(ms),
        )?;
        kernels::logits_top_merge(
            &self.dev,
            Launch::new((1, 1, 1), (1024, 1, 1), 0),
            dptr(keys),
            dptr(ms),
            i(parts),
            dptr(out),
        )?;
        Ok(out)
    }

    /// The heads of `rows` logits rows at `logits` (under the mask table
    /// `masks`, one entry per row, or 0) in one launch pair and one copy:
    /// `HEAD_WORDS` words per row.
    pub(super) fn heads_at(
        &self,
        sc: &mut Scratch,
        logits: u64,
        rows: usize,
        masks: u64,
    ) -> Result<Vec<u64>> {
        let n = self.cfg.vocab_size;
        let parts = n.div_ceil(TOP_PER_PART);
        let keys = sc.get(&self.dev, "bat_top_parts", rows * parts * TOP_KEYS * 8)?;
        let ms = sc.get(&self.dev, "bat_top_ms", rows * parts * 2 * F)?;
        let out = sc.get(&self.dev, "bat_top_out", rows * HEAD_WORDS * 8)?;
        kernels::logits_top_part(
            &self.dev,
            Launch::new((parts as u32, rows as u32, 1), (1024, 1, 1), 0),
            dptr(logits),
            i(n),
            i(TOP_PER_PART),
            dptr(0),
            dptr(masks),
            dptr(keys),
            dptr(ms),
        )?;
        kernels::logits_top_merge(
            &self.dev,
            Launch::new((rows as u32, 1, 1), (1024, 1, 1), 0),
            dptr(keys),
            dptr(ms),
            i(parts),
            dptr(out),
        )?;
        let mut words = vec![0u64; rows * HEAD_WORDS];
        self.dev.dtoh(&mut words, out)?;
        Ok(words)
    }

    /// Row `j`'s head of `k` (checked) among [`GpuModel::heads_at`]'s words.
    pub(super) fn head_in(&self, words: &[u64], j: usize, k: usize) -> Result<TopLogits> {
        check_head(k)?;
        let row = &words[j * HEAD_WORDS..(j + 1) * HEAD_WORDS];
        Ok(head_of(row, k.min(self.cfg.vocab_size)))
    }

    pub(super) fn read_logits(&self, seq: &mut GpuSequence, tokens: &[u32]) -> Result<Vec<f32>> {
        let mut sc = self.scratch.lock().unwrap();
        self.dev.bind()?;
        let logits = self.logits_device(seq, tokens, &mut sc)?;
        self.logits_at(logits)
    }

    /// The logits row at `logits`, copied back.
    pub(super) fn logits_at(&self, logits: u64) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.cfg.vocab_size];
        self.dev.dtoh(&mut out, logits)?;
        Ok(out)
    }

    /// The greedy token and its log-probability computed on the device
    /// (argmax and log-sum-exp of the logits buffer): 12 bytes come back, not
    /// the logits.
    pub(super) fn read_greedy(&self, seq: &mut GpuSequence, tokens: &[u32]) -> Result<Sampled> {
        let mut sc = self.scratch.lock().unwrap();
        self.dev.bind()?;
        if tokens.len() == 1 && self.opts.fused_decode {
            self.check_tokens(seq, tokens)?;
            let (logits, st) = self.decode_step(seq, tokens[0])?;
            sc.last_logits = Some((seq.id, seq.pos, logits));
            let mut out = [0f32; 3];
            self.dev.dtoh(&mut out, st)?;
            return greedy_sampled(out, self.cfg.vocab_size);
        }
        let logits = self.logits_device(seq, tokens, &mut sc)?;
        self.greedy_at(&mut sc, logits)
    }

    /// The greedy token and its log-probability of the logits row at `logits`.
    pub(super) fn greedy_at(&self, sc: &mut Scratch, logits: u64) -> Result<Sampled> {
        let st = sc.get(&self.dev, "stats", 16)?;
        kernels::logits_stats(
            &self.dev,
            Launch::new((1, 1, 1), (1024, 1, 1), 0),
            dptr(logits),
            i(self.cfg.vocab_size),
            dptr(st),
        )?;
        let mut out = [0f32; 3];
        self.dev.dtoh(&mut out, st)?;
        greedy_sampled(out, self.cfg.vocab_size)
    }

    /// The head of the logits read on the device (kernels/sampling.cu): 64
    /// keys and two floats come back instead of the row.
    pub(super) fn read_top(
        &self,
        seq: &mut GpuSequence,
        tokens: &[u32],
        k: usize,
    ) -> Result<TopLogits> {
        check_head(k)?;
        let mut sc = self.scratch.lock().unwrap();
        self.dev.bind()?;
        let logits = self.logits_device(seq, tokens, &mut sc)?;
        self.top_at(&mut sc, logits, k, 0)
    }

    /// The head of `k` of the logits row at `logits` under `masks` (or 0).
    pub(super) fn top_at(
        &self,
        sc: &mut Scratch,
        logits: u64,
        k: usize,
        masks: u64,
    ) -> Result<TopLogits> {
        let out = self.read_head(sc, logits, 0, masks)?;
        let mut head = [0u64; HEAD_WORDS];
        self.dev.dtoh(&mut head, out)?;
        Ok(head_of(&head, k.min(self.cfg.vocab_size)))
    }

    /// The row weighted on the device (kernels/sampling.cu `logits_weights`,
    /// the host sampler's block sums bit for bit): the head and the block
    /// sums come back in one copy, then what `plan` asks for (one block's 64
    /// logits, or nothing, or the row).
    pub(super) fn read_weighted(
        &self,
        seq: &mut GpuSequence,
        tokens: &[u32],
        w: Weighting,
        plan: &mut RowPlanner,
    ) -> Result<WeightedRow> {
        check_head(w.head)?;
        let mut sc = self.scratch.lock().unwrap();
        self.dev.bind()?;
        let logits = self.logits_device(seq, tokens, &mut sc)?;
        self.weighted_at(&mut sc, logits, w, plan, None)
    }

    /// The logits row at `logits` weighted as `w` says (`w.head` checked),
    /// constrained by `mask` (its table entry on the device and its bits,
    /// with which the logits read back are masked on the host): the batch-1
    /// case of [`GpuModel::weighted_rows`].
    pub(super) fn weighted_at(
        &self,
        sc: &mut Scratch,
        logits: u64,
        w: Weighting,
        plan: &mut RowPlanner,
        mask: Option<(u64, &TokenMask)>,
    ) -> Result<WeightedRow> {
        let (entry, mask) = mask.map_or((0, None), |(e, m)| (e, Some(m)));
        let mut req = [WeightedReq {
            row: 0,
            w,
            plan,
            mask,
        }];
        let mut out = self.weighted_rows(sc, logits, 1, entry, &mut req)?;
        out.pop()
            .ok_or_else(|| anyhow::anyhow!("the weighted readout returned no row"))
    }

    /// The logits buffer of the last `forward*` or batched step when it ran
    /// on `seq` and nothing ran on `seq` since (its position unchanged).
    pub(super) fn read_last_logits(&self, seq: &GpuSequence) -> Option<Vec<f32>> {
        let sc = self.scratch.lock().unwrap();
        let here = |&(id, pos, _): &(u64, usize, u64)| id == seq.id && pos == seq.pos;
        let (_, _, ptr) = sc
            .last_logits
            .filter(here)
            .or_else(|| sc.batch_logits.iter().copied().find(here))?;
        self.dev.bind().ok()?;
        let mut out = vec![0f32; self.cfg.vocab_size];
        self.dev.dtoh(&mut out, ptr).ok()?;
        Some(out)
    }
}

/// The device argmax `[token bits, max, log-sum-exp]` as a sampled token.
/// The argmax kernels find no token when every logit is NaN or -inf (a
/// broken hidden state): an error, not a token id past the vocabulary.
pub(super) fn greedy_sampled(out: [f32; 3], vocab: usize) -> Result<Sampled> {
    let token = out[0].to_bits();
    if token as usize >= vocab {
        bail!("the model produced no finite logit (all NaN or -inf); generation stopped");
    }
    Ok(Sampled {
        token,
        logprob: -out[2],
        top: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_greedy_step_without_a_finite_logit_is_an_error() {
        let ok = greedy_sampled([f32::from_bits(7), 1.5, 0.25], 100).unwrap();
        assert_eq!((ok.token, ok.logprob), (7, -0.25));
        // argmax_final's "nothing found" index.
        let err = greedy_sampled([f32::from_bits(0x7fff_ffff), f32::NEG_INFINITY, 0.0], 100);
        assert!(err.unwrap_err().to_string().contains("no finite logit"));
        assert!(greedy_sampled([f32::from_bits(100), 0.0, 0.0], 100).is_err());
    }
}
