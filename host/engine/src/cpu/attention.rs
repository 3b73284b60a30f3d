//! Gated full attention on the CPU: per-head `[query | gate]` projection,
//! (1+w) q/k norms, partial rotary embedding, causal GQA softmax attention
//! over the KV cache, sigmoid output gate.

use super::ops::{dot, linear, rms_norm, sigmoid, softmax};
use crate::config::ModelConfig;
use crate::weights::AttentionWeights;
use rayon::prelude::*;

/// KV cache of one attention layer: `[positions][kv_heads][head_dim]`, keys
/// stored after norm and rotary embedding.
#[derive(Clone, Default)]
pub struct KvCache {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// Rotary embedding tables for the first `rotary_dim` dims (rotate-half pairs `(i, i + rotary_dim/2)`).
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    pub fn new(cfg: &ModelConfig) -> Self {
        let d = cfg.rotary_dim;
        // As transformers computes it: exponent in f32, power and reciprocal in f32.
        let inv_freq = (0..d / 2)
            .map(|i| {
                let e = (2 * i) as f32 / d as f32;
                1.0 / (cfg.rope_theta as f32).powf(e)
            })
            .collect();
        Rope { inv_freq }
    }

    /// Rotates the first `2 * inv_freq.len()` dims of one head vector at `pos`.
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let half = self.inv_freq.len();
        for (i, f) in self.inv_freq.iter().enumerate() {
            let angle = pos as f32 * f;
            let (sin, cos) = (angle as f64).sin_cos();
            let (sin, cos) = (sin as f32, cos as f32);
            let (a, b) = (x[i], x[i + half]);
            x[i] = a * cos - b * sin;
            x[i + half] = b * cos + a * sin;
        }
    }
}

/// One attention pass over `x` (`[T, hidden]`, normed) at positions
/// `cache.len()..`; appends to the cache and returns `[T, hidden]`.
pub fn forward(
    cfg: &ModelConfig,
    w: &AttentionWeights,
    rope: &Rope,
    cache: &mut KvCache,
    x: &[f32],
) -> Vec<f32> {
    let h = cfg.hidden_size;
    let t_len = x.len() / h;
    let (nh, nkv, hd) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
    );
    let pos0 = cache.k.len() / (nkv * hd);

    let qg = linear(x, &w.q_proj);
    let mut k = linear(x, &w.k_proj);
    let v = linear(x, &w.v_proj);
    let mut q = vec![0f32; t_len * nh * hd];
    let mut gate = vec![0f32; t_len * nh * hd];
    for t in 0..t_len {
        for head in 0..nh {
            let src = &qg[(t * nh + head) * 2 * hd..(t * nh + head + 1) * 2 * hd];
            let dst = (t * nh + head) * hd;
            q[dst..dst + hd].copy_from_slice(&src[..hd]);
            gate[dst..dst + hd].copy_from_slice(&src[hd..]);
        }
    }
    rms_norm(&mut q, &w.q_norm, cfg.rms_norm_eps);
    rms_norm(&mut k, &w.k_norm, cfg.rms_norm_eps);
    for t in 0..t_len {
        for head in q[t * nh * hd..(t + 1) * nh * hd].chunks_mut(hd) {
            rope.apply(head, pos0 + t);
        }
        for head in k[t * nkv * hd..(t + 1) * nkv * hd].chunks_mut(hd) {
            rope.apply(head, pos0 + t);
        }
    }
    cache.k.extend_from_slice(&k);
    cache.v.extend_from_slice(&v);

    let scale = 1.0 / (hd as f32).sqrt();
    let group = nh / nkv;
    let (kc, vc) = (&cache.k, &cache.v);
    let mut o = vec![0f32; t_len * nh * hd];
    o.par_chunks_mut(hd).enumerate().for_each(|(idx, out)| {
        let (t, head) = (idx / nh, idx % nh);
        let kvh = head / group;
        let qv = &q[idx * hd..(idx + 1) * hd];
        let n = pos0 + t + 1; // causal: keys 0..=pos
        let mut scores: Vec<f32> = (0..n)
            .map(|s| dot(qv, &kc[(s * nkv + kvh) * hd..(s * nkv + kvh + 1) * hd]) * scale)
            .collect();
        softmax(&mut scores);
        out.fill(0.0);
        for (s, p) in scores.iter().enumerate() {
            for (o, vv) in out
                .iter_mut()
                .zip(&vc[(s * nkv + kvh) * hd..(s * nkv + kvh + 1) * hd])
            {
                *o += p * vv;
            }
        }
        let g = &gate[idx * hd..(idx + 1) * hd];
        for (o, gg) in out.iter_mut().zip(g) {
            *o *= sigmoid(*gg);
        }
    });
    linear(&o, &w.o_proj)
}
