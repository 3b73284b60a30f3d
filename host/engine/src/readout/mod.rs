//! What a decode step hands back for the next token: the whole logits row
//! for the host sampler, or, where the backend keeps the logits on the device
//! ([`Backend::logits_on_device`]) and the request allows it, only the greedy
//! pick ([`Backend::forward_greedy`]) or the row's head
//! ([`Backend::forward_top`], sampled by [`Sampler::sample_top`]), or the
//! block sums of the row's weights and one block ([`Backend::forward_weighted`],
//! drawn by [`Sampler::start_row_draw`]). Either way the request gets the same
//! tokens and RNG stream.
//!
//! A constrained request keeps its readout: its allowed-token mask
//! ([`mask::TokenMask`]) goes with the step ([`Readout::step_masked`]) and the
//! backend's readout counts only those tokens (on the device for a GPU).

pub mod mask;
pub mod protocol;

use crate::backend::{Backend, BatchItem, StepOut, Want};
use crate::sampling::{RowDraw, RowPlan, Sampler, SamplingParams};
use anyhow::{Result, anyhow};
use mask::MaskSource;
use protocol::{RowSums, Sampled, TOP_CANDIDATES, TopLogits};

/// A weighted read in flight: its draw and, once the backend planned, the plan.
pub type DrawSlot = Option<(RowDraw, Option<RowPlan>)>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readout {
    /// The logits row, sampled on the host.
    Logits,
    /// The argmax and its logprob ([`SamplingParams::argmax_only`]).
    Greedy,
    /// The top [`TOP_CANDIDATES`] logits and the log-sum-exp
    /// ([`SamplingParams::samples_from_top`]).
    Top,
    /// The head and the row's block sums of weights, then one block's
    /// logits, nothing more, or (top-p reaching past the head) the row
    /// ([`SamplingParams::samples_from_weights`]).
    Weighted,
}

/// A step's result: the token already drawn, or the logits to draw it from.
pub enum Next {
    Sampled(Sampled),
    Logits(Vec<f32>),
}

impl Next {
    /// (the logits, empty when the token was drawn; the drawn token).
    pub fn into_parts(self) -> (Vec<f32>, Option<Sampled>) {
        match self {
            Next::Sampled(s) => (Vec::new(), Some(s)),
            Next::Logits(l) => (l, None),
        }
    }
}

impl Readout {
    pub fn choose<B: Backend>(params: &SamplingParams, backend: &B) -> Self {
        if !backend.logits_on_device() {
            Readout::Logits
        } else if params.argmax_only() {
            Readout::Greedy
        } else if params.samples_from_top(TOP_CANDIDATES, backend.config().vocab_size) {
            Readout::Top
        } else if params.samples_from_weights(TOP_CANDIDATES, backend.config().vocab_size) {
            Readout::Weighted
        } else {
            Readout::Logits
        }
    }

    /// Appends `tokens` to `seq` and reads the next token's distribution;
    /// every path but [`Readout::Logits`] draws the token with `sampler`
    /// right away (the same RNG call `sample` would make next).
    pub fn step<B: Backend>(
        self,
        backend: &B,
        seq: &mut B::Sequence,
        tokens: &[u32],
        sampler: &mut Sampler,
    ) -> Result<Next> {
        Ok(match self {
            Readout::Logits => Next::Logits(backend.forward(seq, tokens)?),
            Readout::Greedy => Next::Sampled(backend.forward_greedy(seq, tokens)?),
            Readout::Top => {
                let top = backend.forward_top(seq, tokens, TOP_CANDIDATES)?;
                Next::Sampled(sampler.sample_top(&top))
            }
            Readout::Weighted => {
                let draw = sampler.start_row_draw();
                let mut planned = None;
                let row = backend.forward_weighted(
                    seq,
                    tokens,
                    draw.weighting(),
                    &mut |head, blocks| {
                        let p = draw.plan(head, blocks);
                        planned = Some(p);
                        p.read()
                    },
                )?;
                let plan = planned.ok_or_else(|| anyhow::anyhow!("the backend planned no draw"))?;
                Next::Sampled(sampler.finish_row(&draw, &plan, &row))
            }
        })
    }

    /// [`Readout::step`] for a constrained request: the same readout over
    /// the tokens `mask` allows, as a one-row [`Backend::step`].
    pub fn step_masked<B: Backend>(
        self,
        backend: &B,
        seq: &mut B::Sequence,
        tokens: &[u32],
        sampler: &mut Sampler,
        mask: Box<MaskSource<'_>>,
    ) -> Result<Next> {
        let mut draw = None;
        let out = {
            let want = self.want(sampler, &mut draw);
            let mut row = [BatchItem {
                seq,
                tokens,
                want,
                mask: Some(mask),
                snapshots: Default::default(),
            }];
            let mut outs = backend.step(&mut row);
            outs.pop()
                .ok_or_else(|| anyhow!("the backend returned no row"))??
        };
        Self::next(out, sampler, &mut draw)?.ok_or_else(|| anyhow!("the step read nothing back"))
    }

    /// What a batch row reads back for this readout; a weighted read draws
    /// its RNG output now (as [`Readout::step`] does) into `draw`, where the
    /// backend's plan lands too.
    pub fn want<'a>(self, sampler: &mut Sampler, draw: &'a mut DrawSlot) -> Want<'a> {
        match self {
            Readout::Logits => Want::Logits,
            Readout::Greedy => Want::Greedy,
            Readout::Top => Want::Top(TOP_CANDIDATES),
            Readout::Weighted => {
                let d = sampler.start_row_draw();
                let weighting = d.weighting();
                let slot = draw.insert((d, None));
                Want::Weighted(
                    weighting,
                    Box::new(move |head: &TopLogits, blocks: RowSums<'_>| {
                        let p = slot.0.plan(head, blocks);
                        slot.1 = Some(p);
                        p.read()
                    }),
                )
            }
        }
    }

    /// A batch row's result as the next token's distribution: the token
    /// drawn (finishing a weighted read's `draw`), or the logits; `None`
    /// for a row that read nothing.
    pub fn next(out: StepOut, sampler: &mut Sampler, draw: &mut DrawSlot) -> Result<Option<Next>> {
        Ok(Some(match out {
            StepOut::Extended => return Ok(None),
            StepOut::Logits(l) => Next::Logits(l),
            StepOut::Greedy(s) => Next::Sampled(s),
            StepOut::Top(top) => Next::Sampled(sampler.sample_top(&top)),
            StepOut::Weighted(row) => {
                let (d, plan) = draw
                    .take()
                    .ok_or_else(|| anyhow!("a weighted read without its draw"))?;
                let plan = plan.ok_or_else(|| anyhow!("the backend planned no draw"))?;
                Next::Sampled(sampler.finish_row(&d, &plan, &row))
            }
        }))
    }
}
