//! What every compute backend (cpu, cuda, hip) provides to the generation loop.

use crate::config::ModelConfig;
use crate::readout::mask::{MaskSource, TokenMask};
use crate::sampling::{RowPlanner, Sampled, TopLogits, WeightedRow, Weighting};
use anyhow::Result;
use std::any::Any;

/// What one row of a batched [`Backend::step`] reads back after its tokens.
pub enum Want<'a> {
    /// Nothing: a prompt chunk that does not end the prompt ([`Backend::extend`]).
    Nothing,
    /// The logits row ([`Backend::forward`]).
    Logits,
    /// The greedy token ([`Backend::forward_greedy`]).
    Greedy,
    /// The row's head of `k` logits ([`Backend::forward_top`]).
    Top(usize),
    /// The row weighted where it lies ([`Backend::forward_weighted`]); the
    /// planner is called once, with this row's head and block sums.
    Weighted(Weighting, Box<RowPlanner<'a>>),
}

/// One running sequence in a batched step: the tokens it appends this step
/// (one decode token, or a chunk of its prompt, or the tokens it recomputes
/// after a preemption) and what it reads back.
pub struct BatchItem<'a, S> {
    pub seq: &'a mut S,
    /// At least one token.
    pub tokens: &'a [u32],
    pub want: Want<'a>,
    /// Constrained decoding: the readout counts only the tokens of this
    /// mask (the rest as `-inf`: the head, the greedy pick, the block sums,
    /// the logits and the log-sum-exp behind every logprob). Asked for once,
    /// when the readout needs it (not for [`Want::Nothing`]).
    pub mask: Option<Box<MaskSource<'a>>>,
    /// Prefix-cache snapshots to stage inside this row's pass
    /// ([`Backend::pass_snapshot_stride`]); empty for most rows.
    pub snapshots: PassSnapshots,
}

/// Snapshots a multi-token row stages during its pass, so that the prompt
/// runs as one pass instead of one pass per snapshot point.
#[derive(Default)]
pub struct PassSnapshots {
    /// Positions strictly inside the row's tokens (after the sequence's
    /// position, before its position plus the row's tokens), ascending, on
    /// the backend's stride from the row's first position.
    pub at: Vec<usize>,
    /// What the backend staged, by position; a position it could not stage
    /// (no memory for the copy) is missing.
    pub taken: Taken,
}

/// Snapshots by position ([`PassSnapshots::taken`]).
pub type Taken = Vec<(usize, Box<dyn SeqSnapshot>)>;

/// A row's result, as its [`Want`] asked.
#[derive(Debug)]
pub enum StepOut {
    Extended,
    Logits(Vec<f32>),
    Greedy(Sampled),
    Top(TopLogits),
    Weighted(WeightedRow),
}

/// Tokens per sequence the default [`Backend::default_max_num_seqs`] sizes
/// the batch for.
pub const SIZING_TOKENS: usize = 4096;

/// A row of a batch run through the per-sequence methods (what the default
/// [`Backend::step`] does for every row). A masked row reads the logits and
/// masks them on the host: the reference a backend's masked readouts equal.
pub fn step_one<B: Backend + ?Sized>(
    b: &B,
    item: &mut BatchItem<'_, B::Sequence>,
) -> Result<StepOut> {
    let (seq, tokens) = (&mut *item.seq, item.tokens);
    if let Some(source) = &mut item.mask
        && !matches!(item.want, Want::Nothing)
    {
        let logits = b.forward(seq, tokens)?;
        return Ok(read_masked(&logits, &source()?, &mut item.want));
    }
    Ok(match &mut item.want {
        Want::Nothing => {
            b.extend(seq, tokens)?;
            StepOut::Extended
        }
        Want::Logits => StepOut::Logits(b.forward(seq, tokens)?),
        Want::Greedy => StepOut::Greedy(b.forward_greedy(seq, tokens)?),
        Want::Top(k) => StepOut::Top(b.forward_top(seq, tokens, *k)?),
        Want::Weighted(w, plan) => {
            StepOut::Weighted(b.forward_weighted(seq, tokens, *w, &mut **plan)?)
        }
    })
}

/// A row of a batch through the per-sequence methods, its in-pass
/// snapshots ([`BatchItem::snapshots`]) staged by ending a pass at each:
/// what a backend's in-pass snapshots must be equal to (tests use it to
/// give the CPU model a [`Backend::pass_snapshot_stride`]).
pub fn step_split_snapshots<B: Backend + ?Sized>(
    b: &B,
    item: &mut BatchItem<'_, B::Sequence>,
) -> Result<StepOut> {
    let start = b.position(item.seq);
    let mut done = 0;
    for q in std::mem::take(&mut item.snapshots.at) {
        if q <= start + done || q >= start + item.tokens.len() {
            anyhow::bail!("an in-pass snapshot at {q} outside the row's tokens");
        }
        b.extend(item.seq, &item.tokens[done..q - start])?;
        done = q - start;
        if let Some(s) = b.snapshot(item.seq) {
            item.snapshots.taken.push((q, s));
        }
    }
    let mut rest = BatchItem {
        seq: &mut *item.seq,
        tokens: &item.tokens[done..],
        want: std::mem::replace(&mut item.want, Want::Nothing),
        mask: item.mask.take(),
        snapshots: PassSnapshots::default(),
    };
    step_one(b, &mut rest)
}

/// What `want` reads from the row `logits` under `mask`, on the host.
pub fn read_masked(logits: &[f32], mask: &TokenMask, want: &mut Want<'_>) -> StepOut {
    let row = mask.masked(logits);
    match want {
        Want::Nothing => StepOut::Extended,
        Want::Logits => StepOut::Logits(row),
        Want::Greedy => StepOut::Greedy(crate::sampling::greedy(&row)),
        Want::Top(k) => StepOut::Top(crate::sampling::top_logits(&row, *k)),
        Want::Weighted(w, plan) => {
            StepOut::Weighted(crate::sampling::read_weighted(&row, *w, &mut **plan))
        }
    }
}

pub trait Backend: Send + Sync {
    /// A sequence's device-side state (KV cache, GDN states, position).
    type Sequence: Send;

    fn name(&self) -> &'static str;
    fn config(&self) -> &ModelConfig;
    /// A fresh, empty sequence at position 0.
    fn new_sequence(&self) -> Self::Sequence;
    /// Number of tokens the sequence holds.
    fn position(&self, seq: &Self::Sequence) -> usize;
    /// Appends `tokens` (at least one) to the sequence and returns the logits
    /// (`vocab_size` f32) that predict the token after the last one.
    fn forward(&self, seq: &mut Self::Sequence, tokens: &[u32]) -> Result<Vec<f32>>;

    /// Appends `tokens` (at least one) and returns the greedy next token and
    /// its log-probability ([`crate::sampling::greedy`] of `forward`'s
    /// logits, the default). The service calls it instead of `forward` for
    /// requests that need nothing else ([`crate::sampling::SamplingParams::argmax_only`])
    /// where [`Backend::logits_on_device`] says it saves work.
    fn forward_greedy(&self, seq: &mut Self::Sequence, tokens: &[u32]) -> Result<Sampled> {
        Ok(crate::sampling::greedy(&self.forward(seq, tokens)?))
    }

    /// Appends `tokens` (at least one) and returns the head of the next
    /// token's logits: the `k` largest and the row's log-sum-exp
    /// ([`crate::sampling::top_logits`] of `forward`'s logits, the default).
    /// Requests that [`crate::sampling::SamplingParams::samples_from_top`]
    /// sample from it where [`Backend::logits_on_device`].
    fn forward_top(&self, seq: &mut Self::Sequence, tokens: &[u32], k: usize) -> Result<TopLogits> {
        Ok(crate::sampling::top_logits(&self.forward(seq, tokens)?, k))
    }

    /// Appends `tokens` (at least one) and weights the next token's row
    /// where it lies as `w` says ([`crate::sampling::weight_blocks`]); `plan`
    /// decides from the head (as `forward_top`) and the block sums what else
    /// to read: nothing, one block's logits or the whole row. Requests that
    /// [`crate::sampling::SamplingParams::samples_from_weights`] draw through
    /// it where [`Backend::logits_on_device`].
    fn forward_weighted(
        &self,
        seq: &mut Self::Sequence,
        tokens: &[u32],
        w: Weighting,
        plan: &mut RowPlanner,
    ) -> Result<WeightedRow> {
        let logits = self.forward(seq, tokens)?;
        Ok(crate::sampling::read_weighted(&logits, w, plan))
    }

    /// True where [`Backend::forward_greedy`], [`Backend::forward_top`] and
    /// [`Backend::forward_weighted`] read the logits where they are (a GPU:
    /// 12 bytes, 520 bytes or the block sums back per token instead of the
    /// vocabulary's logits). Then requests they serve decode through them
    /// ([`crate::readout::Readout`]) and their end-of-generation snapshot
    /// stores no logits.
    fn logits_on_device(&self) -> bool {
        false
    }

    /// The logits after `seq`'s last token when the last `forward*` call ran
    /// on `seq` and left them where they can be read (a GPU's logits buffer),
    /// else `None` (the default). After a prompt drawn through a device
    /// readout, the prompt-end snapshot stores them, so an identical prompt is
    /// a full hit.
    fn last_logits(&self, _seq: &Self::Sequence) -> Option<Vec<f32>> {
        None
    }

    /// Appends `tokens` (at least one) without computing logits (prefill
    /// segments that end at a snapshot point). Same state as `forward`.
    fn extend(&self, seq: &mut Self::Sequence, tokens: &[u32]) -> Result<()> {
        self.forward(seq, tokens).map(|_| ())
    }

    /// One engine step over several sequences: each row appends its tokens
    /// to its own sequence and reads back what its [`Want`] asks, as the
    /// per-sequence methods would; one result per row, in order (an error
    /// fails that row only; its sequence is then dropped). A sequence's
    /// result must not depend on its batch-mates beyond documented
    /// accumulation order. The default runs the rows one after another
    /// through the per-sequence methods (batch 1 is exactly today's path).
    fn step(&self, batch: &mut [BatchItem<'_, Self::Sequence>]) -> Vec<Result<StepOut>> {
        batch.iter_mut().map(|item| step_one(self, item)).collect()
    }

    /// Bytes a sequence holding `tokens` tokens keeps (recurrent states and
    /// KV) where the scheduler admits by memory ([`Backend::kv_capacity`]);
    /// 0 (the default) where the backend does not account for it.
    fn sequence_bytes(&self, _tokens: usize) -> usize {
        0
    }

    /// Bytes the running sequences' states may hold together, the scheduler's
    /// budget for admission and preemption (counted with
    /// [`Backend::sequence_bytes`]); `None` (the default): not limited.
    fn kv_capacity(&self) -> Option<usize> {
        None
    }

    /// How many sequences run at once when the operator does not say
    /// (`--max-num-seqs`): as many sequences of [`SIZING_TOKENS`] tokens as
    /// [`Backend::kv_capacity`] holds, within 64..=256; 64 where the
    /// capacity is not known.
    fn default_max_num_seqs(&self) -> usize {
        match self.kv_capacity() {
            Some(cap) => (cap / self.sequence_bytes(SIZING_TOKENS).max(1)).clamp(64, 256),
            None => 64,
        }
    }

    /// Prefix cache: an immutable snapshot of `seq` at its current position
    /// (recurrent states copied, KV pages shared copy-on-write), or `None`
    /// when the backend does not support snapshots (the default; the prefix
    /// cache is then simply never populated).
    fn snapshot(&self, _seq: &Self::Sequence) -> Option<Box<dyn SeqSnapshot>> {
        None
    }

    /// Where a multi-token row of [`Backend::step`] can stage snapshots
    /// inside its pass ([`BatchItem::snapshots`]): `Some(g)` at positions
    /// `g`, `2g`, ... tokens after the row's first position; `None` (the
    /// default) nowhere, so the scheduler ends a pass at each snapshot point.
    fn pass_snapshot_stride(&self) -> Option<usize> {
        None
    }

    /// A new sequence resumed from a snapshot this backend made, or `None`
    /// (not supported, or a snapshot of another backend).
    fn restore(&self, _snap: &dyn SeqSnapshot) -> Option<Self::Sequence> {
        None
    }

    /// Whether `seq`, just restored, resumed in the snapshot's memory itself
    /// (the GPU backend adopting a KV slab no one else appends to) instead
    /// of a copy of it: counted by `qwasi_prefix_cache_resumed_in_place_total`.
    fn resumed_in_place(&self, _seq: &Self::Sequence) -> bool {
        false
    }

    /// Prefix cache host tier: a copy of `snap` (one of this backend's
    /// snapshots) in host memory that [`Backend::restore`] also accepts, so
    /// the cache can keep a snapshot its device budget pushes out. `None`
    /// (the default) where snapshots already live in host memory or the copy
    /// fails; the cache then evicts it.
    fn demote(&self, _snap: &dyn SeqSnapshot) -> Option<Box<dyn SeqSnapshot>> {
        None
    }

    /// `seq` is about to read up to `tokens` of context (the prompt the
    /// scheduler admitted it with, which it already reserves whole), maybe
    /// over several steps: a backend may size its state for them at the
    /// first step instead of growing it step by step. The default ignores it.
    fn plan(&self, _seq: &mut Self::Sequence, _tokens: usize) {}
}

/// A shared backend (several services or threads over one loaded model):
/// every method, the optional ones included, is the inner backend's.
impl<B: Backend> Backend for std::sync::Arc<B> {
    type Sequence = B::Sequence;
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn config(&self) -> &ModelConfig {
        (**self).config()
    }
    fn new_sequence(&self) -> B::Sequence {
        (**self).new_sequence()
    }
    fn position(&self, seq: &B::Sequence) -> usize {
        (**self).position(seq)
    }
    fn forward(&self, seq: &mut B::Sequence, tokens: &[u32]) -> Result<Vec<f32>> {
        (**self).forward(seq, tokens)
    }
    fn forward_greedy(&self, seq: &mut B::Sequence, tokens: &[u32]) -> Result<Sampled> {
        (**self).forward_greedy(seq, tokens)
    }
    fn forward_top(&self, seq: &mut B::Sequence, tokens: &[u32], k: usize) -> Result<TopLogits> {
        (**self).forward_top(seq, tokens, k)
    }
    fn forward_weighted(
        &self,
        seq: &mut B::Sequence,
        tokens: &[u32],
        w: Weighting,
        plan: &mut RowPlanner,
    ) -> Result<WeightedRow> {
        (**self).forward_weighted(seq, tokens, w, plan)
    }
    fn logits_on_device(&self) -> bool {
        (**self).logits_on_device()
    }
    fn last_logits(&self, seq: &B::Sequence) -> Option<Vec<f32>> {
        (**self).last_logits(seq)
    }
    fn extend(&self, seq: &mut B::Sequence, tokens: &[u32]) -> Result<()> {
        (**self).extend(seq, tokens)
    }
    fn snapshot(&self, seq: &B::Sequence) -> Option<Box<dyn SeqSnapshot>> {
        (**self).snapshot(seq)
    }
    fn pass_snapshot_stride(&self) -> Option<usize> {
        (**self).pass_snapshot_stride()
    }
    fn restore(&self, snap: &dyn SeqSnapshot) -> Option<B::Sequence> {
        (**self).restore(snap)
    }
    fn resumed_in_place(&self, seq: &B::Sequence) -> bool {
        (**self).resumed_in_place(seq)
    }
    fn demote(&self, snap: &dyn SeqSnapshot) -> Option<Box<dyn SeqSnapshot>> {
        (**self).demote(snap)
    }
    fn plan(&self, seq: &mut B::Sequence, tokens: usize) {
        (**self).plan(seq, tokens)
    }
    fn step(&self, batch: &mut [BatchItem<'_, B::Sequence>]) -> Vec<Result<StepOut>> {
        (**self).step(batch)
    }
    fn sequence_bytes(&self, tokens: usize) -> usize {
        (**self).sequence_bytes(tokens)
    }
    fn kv_capacity(&self) -> Option<usize> {
        (**self).kv_capacity()
    }
    fn default_max_num_seqs(&self) -> usize {
        (**self).default_max_num_seqs()
    }
}

/// A backend's immutable snapshot of a sequence at one position. The prefix
/// cache stores these without knowing their layout; only the backend that
/// made one can restore it (by downcasting `as_any`).
pub trait SeqSnapshot: Any + Send + Sync {
    /// Tokens covered.
    fn position(&self) -> usize;
    /// Bytes owned by this snapshot alone (recurrent + conv states).
    fn private_bytes(&self) -> usize;
    /// Shared, reference-counted pages it holds: `(page id, bytes)`. The
    /// prefix cache counts a page held by several snapshots once.
    fn pages(&self) -> Vec<(u64, usize)>;
    fn as_any(&self) -> &dyn Any;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripted::Scripted;

    /// `serve` wraps its backend in `Scripted`, the benchmarks share one in
    /// an `Arc`: what the wrapped backend does beyond `forward` must come
    /// through (the host tier, device greedy).
    #[test]
    fn wrappers_pass_the_optional_methods_through() {
        struct Snap;
        impl SeqSnapshot for Snap {
            fn position(&self) -> usize {
                0
            }
            fn private_bytes(&self) -> usize {
                0
            }
            fn pages(&self) -> Vec<(u64, usize)> {
                Vec::new()
            }
            fn as_any(&self) -> &dyn std::any::Any {
                self
            }
        }
        struct Probe(ModelConfig);
        impl Backend for Probe {
            type Sequence = usize;
            fn name(&self) -> &'static str {
                "probe"
            }
            fn config(&self) -> &ModelConfig {
                &self.0
            }
            fn new_sequence(&self) -> usize {
                0
            }
            fn position(&self, seq: &usize) -> usize {
                *seq
            }
            fn forward(&self, _: &mut usize, _: &[u32]) -> Result<Vec<f32>> {
                Ok(vec![0.0, 2.0, 1.0])
            }
            fn demote(&self, _: &dyn SeqSnapshot) -> Option<Box<dyn SeqSnapshot>> {
                Some(Box::new(Snap))
            }
            fn logits_on_device(&self) -> bool {
                true
            }
            fn resumed_in_place(&self, _: &usize) -> bool {
                true
            }
            fn last_logits(&self, _: &usize) -> Option<Vec<f32>> {
                Some(vec![4.0])
            }
            fn plan(&self, seq: &mut usize, tokens: usize) {
                *seq = tokens;
            }
        }
        fn check<B: Backend>(b: B) {
            assert!(b.logits_on_device());
            assert!(b.demote(&Snap).is_some());
            let mut seq = b.new_sequence();
            assert!(b.resumed_in_place(&seq));
            assert_eq!(b.last_logits(&seq), Some(vec![4.0]));
            assert_eq!(b.forward_greedy(&mut seq, &[1]).unwrap().token, 1);
            b.plan(&mut seq, 7);
            assert_eq!(b.position(&seq), 7);
        }
        check(Scripted::wrap(Probe(crate::demo::config()), None, None).unwrap());
        check(std::sync::Arc::new(Probe(crate::demo::config())));
    }
}
