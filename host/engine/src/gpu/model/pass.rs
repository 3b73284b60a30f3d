//! One walk over the layers, shared by prompts and decode steps
//! ([`GpuModel::walk`]), and what each kind of pass hands the layers.
//!
//! # The per-layer interface
//!
//! Every layer kind (`gdn::GdnLayer`, `attention::AttnLayer`,
//! `moe::MoeLayer`, `mlp::DenseLayer`) owns its device weights and offers
//!
//! ```text
//! fn prefill(&self, m: &GpuModel, pf: &mut Prefill, norms: Norms [, li: usize]) -> Result<()>
//! fn decode(&self, m: &GpuModel, dc: &Decode, norm: &DBuf [, li: usize]) -> Result<()>
//! ```
//!
//! with one contract for both: read the residual stream (rows of `[R,
//! hidden]` f32), normalise it with the block's norm (the layer's input norm
//! for a mixer, its post-attention norm for an MLP), and add the layer's
//! output back into the same rows. A prompt pass has `R = t` rows, the
//! tokens of one sequence, and runs the norm as part of the residual add of
//! the block before ([`Norms`]: that add also writes `n`); a decode step folds the norm
//! into its first GEMV (from the per-block sums of squares the previous
//! residual kernel wrote) and the residual add into its last.
//!
//! Mixers take their layer index `li` and reach the recurrent state or KV
//! cache through the pass (`Prefill::gdn`, `Prefill::kv`, `Decode::gdn`,
//! `Decode::kv`), never from a sequence of their own. That is where
//! continuous batching (issue 23) plugs in: a batched step is `R = B` rows,
//! one token of each of B sequences ([`Pass::Batch`]); the MLPs run it as a
//! prompt pass of B rows, and the mixers' `batch` reach each row's state
//! through a device table of per-sequence addresses ([`Batch::layer_tab`]).

use super::batch::Batch;
use super::decode::DecodeState;
use super::pass_snapshots::Capture;
use super::seq_state::Span;
use super::{DBuf, GpuSequence, Scratch, SeqLayer};
use anyhow::{Result, bail};

/// A prompt pass: `t` tokens of one sequence from position `pos0`, as the
/// rows of the `[t, hidden]` buffers `x` (residual), `n` (normed input) and
/// `mixed` (a mixer's output before the residual add).
pub(super) struct Prefill<'a> {
    pub sc: &'a mut Scratch,
    /// The sequence's per-layer state.
    pub states: &'a [SeqLayer],
    /// Snapshots the pass takes inside itself.
    pub captures: &'a [Capture],
    pub t: usize,
    pub pos0: usize,
    /// Multi-token passes take the prefill kernels (tiled attention,
    /// parallel conv, warp-per-token router); `QWASI_PREFILL=reference`
    /// keeps the original kernels for comparison.
    pub fast: bool,
    pub x: u64,
    pub n: u64,
    pub mixed: u64,
    /// Per MoE layer planned on the device, its count of router indices
    /// outside the experts (`moe_plan_tiles`), checked once at the end: the
    /// counts' buffer, how many layers wrote one, and the expert count.
    pub bad_words: u64,
    pub planned: usize,
    pub experts: usize,
}

/// The norms around one block (mixer or MLP) of a layer in a prompt or
/// batched pass, where each block's input norm is fused into the residual
/// add of the block before it (`add_rmsnorm`, `moe_combine`): one launch
/// instead of two or three per block.
#[derive(Clone, Copy)]
pub(super) struct Norms<'a> {
    /// The block's input norm: `n = norm(x)` first, unless `ready`.
    pub input: &'a DBuf,
    /// `n` already holds the normed input (the block before wrote it).
    pub ready: bool,
    /// The next block's input norm: `n = next(x)` right after this block's
    /// residual add (`None`: the last block, or a decode step).
    pub next: Option<&'a DBuf>,
}

/// A decode step: the step's buffers (token, position, `[B, hidden]`
/// activations) and the sequence each row decodes (B = 1 today).
pub(super) struct Decode<'a> {
    pub ds: &'a DecodeState,
    pub seq: &'a GpuSequence,
}

/// What a walk over the layers runs: a prompt pass, a decode step, or a
/// batched decode step ([`super::batch`]: B sequences' tokens as the rows of
/// a prompt pass, with each row's state from a table).
pub(super) enum Pass<'p, 'a> {
    Prefill(&'p mut Prefill<'a>),
    Decode(&'p Decode<'a>),
    Batch(&'p mut Batch<'a>),
}

/// Layer `li`'s state in `states`, which must be of the layer's kind.
fn state(states: &[SeqLayer], li: usize, gdn: bool) -> Result<(Span, Span)> {
    match (states.get(li), gdn) {
        (Some(&SeqLayer::Gdn { conv, s }), true) => Ok((conv, s)),
        (Some(&SeqLayer::Attn { k, v }), false) => Ok((k, v)),
        _ => bail!("layer state does not match the layer kind"),
    }
}

impl Prefill<'_> {
    /// GDN layer `li`'s (conv window, recurrent state).
    pub fn gdn(&self, li: usize) -> Result<(Span, Span)> {
        state(self.states, li, true)
    }
    /// Attention layer `li`'s (K, V) cache.
    pub fn kv(&self, li: usize) -> Result<(Span, Span)> {
        state(self.states, li, false)
    }
}

impl Decode<'_> {
    /// GDN layer `li`'s (conv window, recurrent state) of the step's sequence.
    pub fn gdn(&self, li: usize) -> Result<(Span, Span)> {
        state(&self.seq.layers, li, true)
    }
    /// Attention layer `li`'s (K, V) cache of the step's sequence.
    pub fn kv(&self, li: usize) -> Result<(Span, Span)> {
        state(&self.seq.layers, li, false)
    }
}
