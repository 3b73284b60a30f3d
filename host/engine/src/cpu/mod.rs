//! The CPU reference backend: the whole forward in f32 over bf16 weights,
//! multi-threaded with rayon, written to be read.

pub mod attention;
pub mod gdn;
pub mod mlp;
pub mod ops;

use crate::backend::Backend;
use crate::config::{MlpConfig, ModelConfig};
use crate::weights::{Mixer, Weights};
use anyhow::{Result, bail};
use attention::{KvCache, Rope};
use gdn::{GdnPrefill, GdnState};

pub struct CpuModel {
    cfg: ModelConfig,
    weights: Weights,
    rope: Rope,
    /// How multi-token passes run the GDN recurrence (chunked unless a test asks).
    pub gdn_prefill: GdnPrefill,
}

/// One sequence's caches: GDN states for linear layers, KV for attention layers.
#[derive(Clone)]
pub struct CpuSequence {
    pos: usize,
    layers: Vec<LayerCache>,
}

#[derive(Clone)]
enum LayerCache {
    Gdn(GdnState),
    Attention(KvCache),
}

impl CpuSequence {
    pub fn position(&self) -> usize {
        self.pos
    }
}

impl CpuModel {
    pub fn new(cfg: ModelConfig, weights: Weights) -> Self {
        CpuModel {
            rope: Rope::new(&cfg),
            cfg,
            weights,
            gdn_prefill: GdnPrefill::Chunked,
        }
    }

    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// Runs `tokens` after the sequence's current position; returns the hidden
    /// states after the final norm, `[T, hidden]`.
    fn hidden(&self, seq: &mut CpuSequence, tokens: &[u32]) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let h = cfg.hidden_size;
        for &t in tokens {
            if t as usize >= cfg.vocab_size {
                bail!(
                    "token id {t} is out of range (vocabulary size {})",
                    cfg.vocab_size
                );
            }
        }
        if seq.pos + tokens.len() > cfg.max_position_embeddings {
            bail!(
                "sequence of {} tokens exceeds the model's context length {}",
                seq.pos + tokens.len(),
                cfg.max_position_embeddings
            );
        }
        let top_k = match cfg.mlp {
            MlpConfig::Moe { top_k, .. } => top_k,
            MlpConfig::Dense { .. } => 0,
        };
        let mut x: Vec<f32> = tokens
            .iter()
            .flat_map(|&t| {
                self.weights
                    .embed
                    .row(t as usize)
                    .iter()
                    .map(|v| v.to_f32())
            })
            .collect();
        for (layer, cache) in self.weights.layers.iter().zip(&mut seq.layers) {
            let mut n = x.clone();
            ops::rms_norm(&mut n, &layer.input_norm, cfg.rms_norm_eps);
            let mixed = match (&layer.mixer, cache) {
                (Mixer::Gdn(w), LayerCache::Gdn(st)) => {
                    gdn::forward(cfg, w, st, &n, self.gdn_prefill)
                }
                (Mixer::Attention(w), LayerCache::Attention(kv)) => {
                    attention::forward(cfg, w, &self.rope, kv, &n)
                }
                _ => unreachable!("layer caches are built from the same layer kinds"),
            };
            ops::add_assign(&mut x, &mixed);
            let mut n = x.clone();
            ops::rms_norm(&mut n, &layer.post_norm, cfg.rms_norm_eps);
            let m = mlp::forward(&layer.mlp, top_k, &n, h);
            ops::add_assign(&mut x, &m);
        }
        ops::rms_norm(&mut x, &self.weights.norm, cfg.rms_norm_eps);
        seq.pos += tokens.len();
        Ok(x)
    }

    /// Logits for every position of `tokens`, `[T, vocab]` (tests and scoring).
    pub fn forward_all(&self, seq: &mut CpuSequence, tokens: &[u32]) -> Result<Vec<f32>> {
        let x = self.hidden(seq, tokens)?;
        Ok(ops::linear(&x, self.weights.lm_head()))
    }
}

impl Backend for CpuModel {
    type Sequence = CpuSequence;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn new_sequence(&self) -> CpuSequence {
        let layers = self
            .weights
            .layers
            .iter()
            .map(|l| match l.mixer {
                Mixer::Gdn(_) => LayerCache::Gdn(GdnState::new(&self.cfg)),
                Mixer::Attention(_) => LayerCache::Attention(KvCache::default()),
            })
            .collect();
        CpuSequence { pos: 0, layers }
    }

    fn position(&self, seq: &CpuSequence) -> usize {
        seq.pos
    }

    fn forward(&self, seq: &mut CpuSequence, tokens: &[u32]) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            bail!("forward needs at least one token");
        }
        let x = self.hidden(seq, tokens)?;
        let h = self.cfg.hidden_size;
        Ok(ops::linear(&x[x.len() - h..], self.weights.lm_head()))
    }
}
