//! The request's sampling parameters: their ranges, and which readout a
//! backend may use for them.

#[cfg(doc)]
use super::{Sampler, greedy};
use anyhow::{Result, bail};

/// Most alternatives [`SamplingParams::logprobs`] may ask for.
pub const MAX_LOGPROBS: usize = 20;

/// Per-request sampling parameters. Missing fields deserialize to their
/// [`Default`] (greedy, everything off).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// 0 => greedy (argmax; ties -> lowest id).
    pub temperature: f32,
    /// Nucleus sampling mass in (0, 1]; 1.0 = off.
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens; 0 = off.
    pub top_k: usize,
    /// Drop tokens with `p < min_p * p_max`; in [0, 1], 0 = off.
    pub min_p: f32,
    /// Same seed + same logits => same tokens; `None` => seeded from OS entropy and time.
    pub seed: Option<u64>,
    /// Must be > 0; 1.0 = off. vLLM/HF semantics over prompt + generated
    /// tokens: a positive logit is divided by it, a negative one multiplied.
    pub repetition_penalty: f32,
    /// In [-2, 2]. OpenAI semantics over generated tokens: `logit -= presence` if the token occurred.
    pub presence_penalty: f32,
    /// In [-2, 2]. OpenAI semantics over generated tokens: `logit -= frequency * count`.
    pub frequency_penalty: f32,
    /// `(token, bias)` pairs, bias in [-100, 100], added to the logit (repeated ids add up).
    pub logit_bias: Vec<(u32, f32)>,
    /// `Some(k)`: report the top-`k` alternatives (k <= 20) besides the chosen token's logprob.
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            logprobs: None,
        }
    }
}

impl SamplingParams {
    /// Checks every parameter's range; `vocab_size` bounds the logit-bias ids.
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            bail!(
                "temperature must be a finite number >= 0, got {}",
                self.temperature
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            bail!("top_p must be in (0, 1], got {}", self.top_p);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            bail!("min_p must be in [0, 1], got {}", self.min_p);
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            bail!(
                "repetition_penalty must be a finite number > 0, got {}",
                self.repetition_penalty
            );
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            bail!(
                "presence_penalty must be in [-2, 2], got {}",
                self.presence_penalty
            );
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            bail!(
                "frequency_penalty must be in [-2, 2], got {}",
                self.frequency_penalty
            );
        }
        for &(token, bias) in &self.logit_bias {
            if token as usize >= vocab_size {
                bail!(
                    "logit_bias token id must be < the vocabulary size {vocab_size}, got {token}"
                );
            }
            if !(-100.0..=100.0).contains(&bias) {
                bail!("logit_bias value for token {token} must be in [-100, 100], got {bias}");
            }
        }
        if let Some(k) = self.logprobs
            && k > MAX_LOGPROBS
        {
            bail!("logprobs must be in [0, {MAX_LOGPROBS}], got {k}");
        }
        Ok(())
    }

    /// True when `temperature` makes [`Sampler::sample`] take the argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature <= 0.0
    }

    /// Greedy with nothing else needed from the distribution (no logit bias,
    /// no penalties, no top alternatives): [`greedy`] of the raw logits is
    /// what [`Sampler::sample`] returns, so a backend may pick the token
    /// itself ([`crate::backend::Backend::forward_greedy`]).
    pub fn argmax_only(&self) -> bool {
        self.is_greedy() && self.raw_logits() && self.logprobs.unwrap_or(0) == 0
    }

    /// No logit bias or penalty changes a logit: sampling sees the raw logits.
    fn raw_logits(&self) -> bool {
        let rep = self.repetition_penalty;
        self.logit_bias
            .iter()
            .all(|&(_, b)| !b.is_finite() || b == 0.0)
            && !(rep.is_finite() && rep > 0.0 && rep != 1.0)
            && finite_or_zero(self.presence_penalty) == 0.0
            && finite_or_zero(self.frequency_penalty) == 0.0
    }

    /// True when [`Sampler::sample_top`] over the `k` highest logits gives
    /// what [`Sampler::sample`] gives over all `vocab_size`: no logit bias or
    /// penalties, at most `k` alternatives, and either greedy or a top-k of at
    /// most `k` (top-p and min-p then only look inside it). A backend may
    /// then hand over just those logits ([`crate::backend::Backend::forward_top`]).
    pub fn samples_from_top(&self, k: usize, vocab_size: usize) -> bool {
        self.raw_logits()
            && self.logprobs.unwrap_or(0) <= k
            && (self.is_greedy() || (self.top_k >= 1 && self.top_k <= k && self.top_k < vocab_size))
    }

    /// True when [`Sampler::sample`] draws from the whole row with
    /// temperature, top-p and min-p only (no top-k, bias or penalties, at
    /// most `k` alternatives): a backend may then weight the row where it
    /// lies and hand over block sums ([`crate::backend::Backend::forward_weighted`]).
    pub fn samples_from_weights(&self, k: usize, vocab_size: usize) -> bool {
        self.raw_logits()
            && !self.is_greedy()
            && (self.top_k == 0 || self.top_k >= vocab_size)
            && self.logprobs.unwrap_or(0) <= k
    }
}

pub(super) fn finite_or_zero(x: f32) -> f32 {
    if x.is_finite() { x } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::test_util::params;

    #[test]
    fn argmax_only_excludes_whatever_needs_the_distribution() {
        let greedy = SamplingParams::default();
        assert!(greedy.argmax_only());
        let not = [
            params(0.7, 1),
            SamplingParams {
                logprobs: Some(2),
                ..Default::default()
            },
            SamplingParams {
                repetition_penalty: 1.1,
                ..Default::default()
            },
            SamplingParams {
                presence_penalty: -0.5,
                ..Default::default()
            },
            SamplingParams {
                frequency_penalty: 0.1,
                ..Default::default()
            },
            SamplingParams {
                logit_bias: vec![(3, -1.0)],
                ..Default::default()
            },
        ];
        for p in not {
            assert!(!p.argmax_only(), "{p:?}");
        }
        // Settings that change nothing keep it.
        let same = SamplingParams {
            top_k: 5,
            top_p: 0.5,
            min_p: 0.2,
            logit_bias: vec![(3, 0.0)],
            ..Default::default()
        };
        assert!(same.argmax_only());
    }

    #[test]
    fn the_top_and_row_paths_take_only_what_they_can_draw_exactly() {
        let vocab = 1000;
        let ok = SamplingParams {
            temperature: 0.7,
            top_k: 20,
            top_p: 0.95,
            ..Default::default()
        };
        assert!(ok.samples_from_top(64, vocab));
        assert!(SamplingParams::default().samples_from_top(64, vocab));
        let not = [
            params(0.7, 1), // no top-k: the whole row
            SamplingParams {
                top_k: 65,
                ..ok.clone()
            },
            SamplingParams {
                top_k: 1000,
                ..ok.clone()
            },
            SamplingParams {
                repetition_penalty: 1.1,
                ..ok.clone()
            },
            SamplingParams {
                presence_penalty: 0.5,
                ..ok.clone()
            },
            SamplingParams {
                logit_bias: vec![(3, 2.0)],
                ..ok.clone()
            },
        ];
        for p in not {
            assert!(!p.samples_from_top(64, vocab), "{p:?}");
        }
        // The whole-row path: temperature, top-p and min-p only.
        let row = SamplingParams {
            top_k: 0,
            top_p: 0.9,
            min_p: 0.1,
            ..ok.clone()
        };
        assert!(row.samples_from_weights(64, vocab) && !row.samples_from_top(64, vocab));
        for p in [
            SamplingParams {
                top_k: 5,
                ..row.clone()
            },
            SamplingParams {
                temperature: 0.0,
                ..row.clone()
            },
            SamplingParams {
                repetition_penalty: 1.2,
                ..row.clone()
            },
        ] {
            assert!(!p.samples_from_weights(64, vocab), "{p:?}");
        }
        // More alternatives than candidates.
        let many = SamplingParams {
            logprobs: Some(20),
            ..ok
        };
        assert!(many.samples_from_top(20, vocab) && !many.samples_from_top(16, vocab));
    }

    #[test]
    fn validate_messages() {
        let ok = SamplingParams::default();
        ok.validate(10).unwrap();
        let err = |p: SamplingParams| p.validate(10).unwrap_err().to_string();
        let with = |f: &dyn Fn(&mut SamplingParams)| {
            let mut p = SamplingParams::default();
            f(&mut p);
            err(p)
        };
        assert_eq!(with(&|p| p.top_p = 1.5), "top_p must be in (0, 1], got 1.5");
        assert_eq!(with(&|p| p.top_p = 0.0), "top_p must be in (0, 1], got 0");
        assert_eq!(
            with(&|p| p.temperature = -0.1),
            "temperature must be a finite number >= 0, got -0.1"
        );
        assert!(with(&|p| p.temperature = f32::INFINITY).starts_with("temperature"));
        assert_eq!(with(&|p| p.min_p = 1.1), "min_p must be in [0, 1], got 1.1");
        assert_eq!(
            with(&|p| p.repetition_penalty = 0.0),
            "repetition_penalty must be a finite number > 0, got 0"
        );
        assert_eq!(
            with(&|p| p.presence_penalty = 2.5),
            "presence_penalty must be in [-2, 2], got 2.5"
        );
        assert_eq!(
            with(&|p| p.frequency_penalty = -3.0),
            "frequency_penalty must be in [-2, 2], got -3"
        );
        assert_eq!(
            with(&|p| p.logit_bias = vec![(10, 1.0)]),
            "logit_bias token id must be < the vocabulary size 10, got 10"
        );
        assert_eq!(
            with(&|p| p.logit_bias = vec![(3, 101.0)]),
            "logit_bias value for token 3 must be in [-100, 100], got 101"
        );
        assert_eq!(
            with(&|p| p.logprobs = Some(21)),
            "logprobs must be in [0, 20], got 21"
        );
        assert!(with(&|p| p.min_p = f32::NAN).starts_with("min_p"));
        let mut p = SamplingParams {
            temperature: 2.0,
            top_p: 0.1,
            top_k: 1_000_000,
            min_p: 1.0,
            seed: Some(3),
            repetition_penalty: 0.5,
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            logit_bias: vec![(9, -100.0), (0, 100.0)],
            logprobs: Some(20),
        };
        p.validate(10).unwrap();
        p.logprobs = Some(0);
        p.validate(10).unwrap();
    }

    #[test]
    fn serde_defaults() {
        let p: SamplingParams = serde_json::from_str(r#"{"temperature": 0.7}"#).unwrap();
        assert_eq!(
            p,
            SamplingParams {
                temperature: 0.7,
                ..Default::default()
            }
        );
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<SamplingParams>(&json).unwrap(), p);
    }
}
