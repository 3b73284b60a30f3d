//! What a decode step hands back for the next token: the whole logits row
//! for the host sampler, or, where the backend keeps the logits on the device
//! ([`Backend::logits_on_device`]) and the request allows it, only the greedy
//! pick ([`Backend::forward_greedy`]) or the row's head
//! ([`Backend::forward_top`], sampled by [`Sampler::sample_top`]), or the
//! block sums of the row's weights and one block ([`Backend::forward_weighted`],
//! drawn by [`Sampler::start_row_draw`]). Either way the request gets the same
//! tokens and RNG stream.

pub mod protocol;

use crate::backend::Backend;
use crate::sampling::{Sampler, SamplingParams};
use anyhow::Result;
use protocol::{Sampled, TOP_CANDIDATES};

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
}
