//! The CPU reference backend: the whole forward in f32 over bf16 weights,
//! multi-threaded with rayon, written to be read.

pub mod attention;
pub mod gdn;
pub mod mlp;
pub mod ops;

use crate::backend::{Backend, BatchItem, SeqSnapshot, StepOut, Want, read_masked};
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
    /// Bytes the running sequences may hold ([`Backend::kv_capacity`]);
    /// `None`: no limit.
    kv_budget: Option<usize>,
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
        weights.dequantize_fp8();
        CpuModel {
            rope: Rope::new(&cfg),
            cfg,
            weights,
            gdn_prefill: GdnPrefill::Serial,
            pages: Arc::default(),
            kv_budget: None,
        }
    }

    /// Limits the bytes the running sequences' states may hold together
    /// (counted by [`Backend::sequence_bytes`]): the scheduler admits and
    /// preempts against it. `None` (the default): no limit.
    pub fn with_kv_budget(mut self, bytes: Option<usize>) -> Self {
        self.kv_budget = bytes;
        self
    }

    /// Live KV pages (and their bytes) of this model's sequences and snapshots.
    pub fn page_stats(&self) -> &PageStats {
        &self.pages
    }

    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// Checks that `tokens` can follow `seq`.
    fn check(&self, seq: &CpuSequence, tokens: &[u32]) -> Result<()> {
        let cfg = &self.cfg;
        if tokens.is_empty() {
            bail!("a pass needs at least one token");
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            bail!(
                "token id {t} is out of range (vocabulary size {})",
                cfg.vocab_size
            );
        }
        if seq.pos + tokens.len() > cfg.max_position_embeddings {
            bail!(
                "sequence of {} tokens exceeds the model's context length {}",
                seq.pos + tokens.len(),
                cfg.max_position_embeddings
            );
        }
        Ok(())
    }

    /// Runs `tokens` after the sequence's current position; returns the hidden
    /// states after the final norm, `[T, hidden]`.
    fn hidden(&self, seq: &mut CpuSequence, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check(seq, tokens)?;
        Ok(self.hidden_batch(&mut [(seq, tokens)]))
    }

    /// One pass over several sequences (checked): their tokens' rows
    /// stacked, `[Σ T, hidden]` after the final norm. Row-wise work (norms,
    /// projections, experts, lm_head) runs once over all rows, each row's
    /// arithmetic exactly as alone (a matrix product computes every row
    /// independently, experts add up in expert order per row); the mixers
    /// run per sequence over their own state.
    fn hidden_batch(&self, parts: &mut [(&mut CpuSequence, &[u32])]) -> Vec<f32> {
        let cfg = &self.cfg;
        let h = cfg.hidden_size;
        let top_k = match cfg.mlp {
            MlpConfig::Moe { top_k, .. } => top_k,
            MlpConfig::Dense { .. } => 0,
        };
        let lens: Vec<usize> = parts.iter().map(|p| p.1.len()).collect();
        let mut x: Vec<f32> = parts
            .iter()
            .flat_map(|p| p.1.iter())
            .flat_map(|&t| {
                self.weights
                    .embed
                    .row(t as usize)
                    .iter()
                    .map(|v| v.to_f32())
            })
            .collect();
        for (li, layer) in self.weights.layers.iter().enumerate() {
            let mut n = x.clone();
            ops::rms_norm(&mut n, &layer.input_norm, cfg.rms_norm_eps);
            let mixed = match &layer.mixer {
                Mixer::Gdn(w) => {
                    let mut states: Vec<&mut GdnState> = parts
                        .iter_mut()
                        .map(|p| match &mut p.0.layers[li] {
                            LayerCache::Gdn(st) => st,
                            LayerCache::Attention(_) => unreachable!("same layer kinds"),
                        })
                        .collect();
                    gdn::forward(cfg, w, &mut states, &lens, &n, self.gdn_prefill)
                }
                Mixer::Attention(w) => {
                    let mut caches: Vec<&mut KvCache> = parts
                        .iter_mut()
                        .map(|p| match &mut p.0.layers[li] {
                            LayerCache::Attention(kv) => kv,
                            LayerCache::Gdn(_) => unreachable!("same layer kinds"),
                        })
                        .collect();
                    attention::forward(cfg, w, &self.rope, &mut caches, &lens, &n)
                }
            };
            ops::add_assign(&mut x, &mixed);
            let mut n = x.clone();
            ops::rms_norm(&mut n, &layer.post_norm, cfg.rms_norm_eps);
            let m = mlp::forward(&layer.mlp, top_k, &n, h);
            ops::add_assign(&mut x, &m);
        }
        ops::rms_norm(&mut x, &self.weights.norm, cfg.rms_norm_eps);
        for p in parts.iter_mut() {
            p.0.pos += p.1.len();
        }
        x
    }

    /// The batched step: rows that fail their checks get their error, the
    /// others run in one [`CpuModel::hidden_batch`] and the rows that want
    /// logits share one lm_head product.
    fn step_batch(&self, batch: &mut [BatchItem<'_, CpuSequence>]) -> Vec<Result<StepOut>> {
        let h = self.cfg.hidden_size;
        let mut out: Vec<Option<Result<StepOut>>> = batch
            .iter()
            .map(|it| self.check(&*it.seq, it.tokens).err().map(Err))
            .collect();
        let ok: Vec<usize> = (0..batch.len()).filter(|&i| out[i].is_none()).collect();
        if ok.is_empty() {
            return out.into_iter().map(Option::unwrap).collect();
        }
        let wants_row = |w: &Want| !matches!(w, Want::Nothing);
        // Where each running row's last hidden row lands in the stacked pass.
        let mut ends = Vec::with_capacity(ok.len());
        let mut parts = Vec::with_capacity(ok.len());
        let mut at = 0;
        for (i, it) in batch.iter_mut().enumerate() {
            if out[i].is_some() {
                continue;
            }
            at += it.tokens.len();
            ends.push((i, at - 1, wants_row(&it.want)));
            parts.push((&mut *it.seq, it.tokens));
        }
        let x = self.hidden_batch(&mut parts);
        drop(parts);
        let last: Vec<f32> = ends
            .iter()
            .filter(|e| e.2)
            .flat_map(|&(_, r, _)| x[r * h..(r + 1) * h].iter().copied())
            .collect();
        let mut logits = if last.is_empty() {
            Vec::new()
        } else {
            ops::linear(&last, self.weights.lm_head())
        };
        let vocab = self.cfg.vocab_size;
        let single = ends.iter().filter(|e| e.2).count() == 1;
        let mut j = 0;
        for &(i, _, wants) in &ends {
            let item = &mut batch[i];
            if !wants {
                out[i] = Some(Ok(StepOut::Extended));
                continue;
            }
            let l = &logits[j * vocab..(j + 1) * vocab];
            j += 1;
            // A constrained row: its readout over the masked row.
            if let Some(source) = &mut item.mask {
                out[i] = Some(source().map(|m| read_masked(l, &m, &mut item.want)));
                continue;
            }
            let r = match &mut item.want {
                Want::Nothing => StepOut::Extended,
                // One row: the product is the row (no copy).
                Want::Logits if single => StepOut::Logits(std::mem::take(&mut logits)),
                Want::Logits => StepOut::Logits(l.to_vec()),
                Want::Greedy => StepOut::Greedy(crate::sampling::greedy(l)),
                Want::Top(k) => StepOut::Top(crate::sampling::top_logits(l, *k)),
                Want::Weighted(w, plan) => {
                    StepOut::Weighted(crate::sampling::read_weighted(l, *w, &mut **plan))
                }
            };
            out[i] = Some(Ok(r));
        }
        out.into_iter().map(Option::unwrap).collect()
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

    fn step(&self, batch: &mut [BatchItem<'_, CpuSequence>]) -> Vec<Result<StepOut>> {
        self.step_batch(batch)
    }

    /// The GDN states plus the KV pages covering `tokens` in every attention layer.
    fn sequence_bytes(&self, tokens: usize) -> usize {
        let c = &self.cfg;
        let gdn = (c.linear_conv_dim() * (c.linear_conv_kernel - 1)
            + c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim)
            * 4;
        let page = 2 * attention::PAGE_TOKENS * c.num_key_value_heads * c.head_dim * 4;
        self.weights
            .layers
            .iter()
            .map(|l| match l.mixer {
                Mixer::Gdn(_) => gdn,
                Mixer::Attention(_) => tokens.div_ceil(attention::PAGE_TOKENS) * page,
            })
            .sum()
    }

    fn kv_capacity(&self) -> Option<usize> {
        self.kv_budget
    }

    /// Sixteen: the CPU computes a step's rows one matrix product at a time,
    /// so more sequences mostly lengthen every stream's steps.
    fn default_max_num_seqs(&self) -> usize {
        16
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
