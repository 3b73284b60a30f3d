//! The CPU reference backend: the whole forward in f32 over bf16 weights,
//! multi-threaded with rayon, written to be read.

pub mod attention;
pub mod gdn;
pub mod mlp;
pub mod ops;

use crate::backend::{Backend, SeqSnapshot};
use crate::config::{MlpConfig, ModelConfig};
use crate::weights::{Mixer, Weights};
use anyhow::{Result, bail};
use attention::{KvCache, PageStats, Rope};
use gdn::{GdnPrefill, GdnState};
use std::any::Any;
use std::sync::Arc;

pub struct CpuModel {
    cfg: ModelConfig,
    weights: Weights,
    rope: Rope,
    /// How multi-token passes run the GDN recurrence (token-serial unless a test asks).
    pub gdn_prefill: GdnPrefill,
    /// Live KV pages of this model's sequences and snapshots.
    pages: Arc<PageStats>,
}

/// One sequence's caches: GDN states for linear layers, KV for attention layers.
/// Cloning copies the GDN states and shares the KV pages (copy-on-write).
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

    /// Bytes of the GDN recurrent + conv states (copied by a snapshot).
    fn state_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerCache::Gdn(st) => (st.conv.len() + st.s.len()) * 4,
                LayerCache::Attention(_) => 0,
            })
            .sum()
    }
}

/// A snapshot of a [`CpuSequence`]: its own copy of the GDN states and
/// references to the KV pages covering `0..pos`. Never mutated: a sequence
/// restored from it appends into copies of shared pages.
pub struct CpuSnapshot {
    seq: CpuSequence,
    state_bytes: usize,
}

impl SeqSnapshot for CpuSnapshot {
    fn position(&self) -> usize {
        self.seq.pos
    }

    fn private_bytes(&self) -> usize {
        self.state_bytes
    }

    fn pages(&self) -> Vec<(u64, usize)> {
        self.seq
            .layers
            .iter()
            .filter_map(|l| match l {
                LayerCache::Attention(kv) => Some(kv.pages()),
                LayerCache::Gdn(_) => None,
            })
            .flatten()
            .map(|p| (p.id(), p.bytes()))
            .collect()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl CpuModel {
    pub fn new(cfg: ModelConfig, weights: Weights) -> Self {
        CpuModel {
            rope: Rope::new(&cfg),
            cfg,
            weights,
            gdn_prefill: GdnPrefill::Serial,
            pages: Arc::default(),
        }
    }

    /// Live KV pages (and their bytes) of this model's sequences and snapshots.
    pub fn page_stats(&self) -> &PageStats {
        &self.pages
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
                Mixer::Attention(_) => {
                    LayerCache::Attention(KvCache::new(&self.cfg, self.pages.clone()))
                }
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

    fn extend(&self, seq: &mut CpuSequence, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            bail!("extend needs at least one token");
        }
        self.hidden(seq, tokens).map(|_| ())
    }

    fn snapshot(&self, seq: &CpuSequence) -> Option<Box<dyn SeqSnapshot>> {
        Some(Box::new(CpuSnapshot {
            state_bytes: seq.state_bytes(),
            seq: seq.clone(),
        }))
    }

    fn restore(&self, snap: &dyn SeqSnapshot) -> Option<CpuSequence> {
        let snap = snap.as_any().downcast_ref::<CpuSnapshot>()?;
        // Only a snapshot of this model's geometry (page accounting included).
        let same = snap.seq.layers.len() == self.weights.layers.len()
            && snap.seq.layers.iter().all(|l| match l {
                LayerCache::Attention(kv) => kv.shares_stats(&self.pages),
                LayerCache::Gdn(_) => true,
            });
        same.then(|| snap.seq.clone())
    }
}
