//! The generation loop over any backend: prefill the prompt, then sample one
//! token at a time until a stop token, the token limit or the context limit.

use crate::backend::Backend;
use crate::constraint::{Constraint, Step};
use crate::readout::{Next, Readout};
use crate::sampling::{Sampled, Sampler, SamplingParams};
use anyhow::{Result, bail};
use serde::Serialize;
use std::ops::ControlFlow;

#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    /// Extra ids that end generation (besides the model's EOS ids).
    pub stop_token_ids: Vec<u32>,
    /// Keep generating through the model's EOS ids.
    pub ignore_eos: bool,
    pub sampling: SamplingParams,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop or EOS token was sampled.
    Stop,
    /// `max_tokens` or the context length was reached.
    Length,
    /// The caller asked to stop.
    Cancelled,
}

#[derive(Clone, Debug)]
pub struct GenerateResult {
    /// Generated tokens, without the stop token that ended generation.
    pub tokens: Vec<u32>,
    /// One entry per sampled token (the stop token included, last).
    pub steps: Vec<Sampled>,
    pub finish_reason: FinishReason,
    /// The stop/EOS token that ended generation, if any.
    pub stop_token: Option<u32>,
}

/// Runs one request. `on_token` sees every sampled token (a stop token too,
/// with `is_stop` true) and may cancel by returning `Break`.
pub fn generate<B: Backend>(
    backend: &B,
    req: &GenerateRequest,
    on_token: impl FnMut(&Sampled, bool) -> ControlFlow<()>,
) -> Result<GenerateResult> {
    generate_with(backend, req, None, on_token)
}

/// [`generate`], the output held to `constraint` (see [`crate::constraint`]).
pub fn generate_with<B: Backend>(
    backend: &B,
    req: &GenerateRequest,
    mut constraint: Option<Constraint>,
    mut on_token: impl FnMut(&Sampled, bool) -> ControlFlow<()>,
) -> Result<GenerateResult> {
    let cfg = backend.config();
    if req.prompt.is_empty() {
        bail!("the prompt must contain at least one token");
    }
    if req.prompt.len() >= cfg.max_position_embeddings {
        bail!(
            "the prompt has {} tokens but the model's context length is {}",
            req.prompt.len(),
            cfg.max_position_embeddings
        );
    }
    req.sampling.validate(cfg.vocab_size)?;
    let mut stops = req.stop_token_ids.clone();
    if !req.ignore_eos {
        stops.extend(&cfg.eos_token_ids);
    }
    let mut sampler = Sampler::new(req.sampling.clone());
    let mut seq = backend.new_sequence();
    let mut context = req.prompt.clone();
    let mut result = GenerateResult {
        tokens: Vec::new(),
        steps: Vec::new(),
        finish_reason: FinishReason::Length,
        stop_token: None,
    };
    if req.max_tokens == 0 {
        return Ok(result);
    }
    // Requests that allow it read less than the logits from the device; a
    // constrained one's mask goes with the step, or (the logits readout)
    // is applied to the row on the host.
    let readout = Readout::choose(&req.sampling, backend);
    let step = |seq: &mut B::Sequence,
                tokens: &[u32],
                sampler: &mut Sampler,
                constraint: &mut Option<Constraint>| match constraint {
        Some(c) if readout != Readout::Logits => {
            readout.step_masked(backend, seq, tokens, sampler, Box::new(|| c.token_mask()))
        }
        _ => readout.step(backend, seq, tokens, sampler),
    };
    // The prompt is read out as every step is (on the device where it can be).
    let (mut logits, mut next) =
        step(&mut seq, &req.prompt, &mut sampler, &mut constraint)?.into_parts();
    loop {
        let s = match (next.take(), &mut constraint) {
            (Some(s), _) => s,
            (None, Some(c)) => sampler.sample(c.masked(&logits)?, &context, req.prompt.len()),
            (None, None) => sampler.sample(&logits, &context, req.prompt.len()),
        };
        let is_stop = stops.contains(&s.token);
        // A token that completes a constrained output ends it after itself.
        let complete = match &mut constraint {
            Some(c) if !is_stop => c.advance(s.token)? == Step::Done,
            _ => false,
        };
        let flow = on_token(&s, is_stop);
        result.steps.push(s.clone());
        if is_stop {
            result.finish_reason = FinishReason::Stop;
            result.stop_token = Some(s.token);
            break;
        }
        result.tokens.push(s.token);
        context.push(s.token);
        if flow.is_break() {
            result.finish_reason = FinishReason::Cancelled;
            break;
        }
        if complete {
            result.finish_reason = FinishReason::Stop;
            break;
        }
        if result.tokens.len() >= req.max_tokens || context.len() >= cfg.max_position_embeddings {
            break;
        }
        match step(&mut seq, &[s.token], &mut sampler, &mut constraint)? {
            Next::Sampled(s) => next = Some(s),
            Next::Logits(l) => logits = l,
        }
    }
    Ok(result)
}
