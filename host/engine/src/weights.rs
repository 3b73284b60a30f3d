//! The model's weights, organised by layer, loaded from any [`WeightSource`]
//! (a checkpoint on disk or generated weights). Backends compute over these.

use crate::checkpoint::WeightSource;
use crate::config::{LayerKind, MlpConfig, ModelConfig};
use crate::tensor::Mat;
use anyhow::{Context, Result};
use rayon::prelude::*;

pub struct GdnWeights {
    /// `[2 * key_dim + value_dim, hidden]`: q, k, v streams.
    pub in_proj_qkv: Mat,
    pub in_proj_z: Mat,
    pub in_proj_a: Mat,
    pub in_proj_b: Mat,
    /// Depthwise causal conv, `[conv_dim][kernel]` row-major.
    pub conv: Vec<f32>,
    pub a_log: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// Gated RMSNorm weight (plain `w`, not `1 + w`).
    pub norm: Vec<f32>,
    pub out_proj: Mat,
}

pub struct AttentionWeights {
    /// `[heads * head_dim * 2, hidden]`: per head `[query | gate]`.
    pub q_proj: Mat,
    pub k_proj: Mat,
    pub v_proj: Mat,
    pub o_proj: Mat,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
}

pub enum Mixer {
    Gdn(GdnWeights),
    Attention(AttentionWeights),
}

/// A SwiGLU feed-forward: `down(silu(gate x) * up x)`. Routed experts,
/// shared experts and dense MLPs all have this shape.
pub struct DenseMlp {
    pub gate: Mat,
    pub up: Mat,
    pub down: Mat,
}

pub enum Mlp {
    Moe {
        router: Mat,
        experts: Vec<DenseMlp>,
        shared: DenseMlp,
        shared_gate: Mat,
    },
    Dense(DenseMlp),
}

pub struct Layer {
    /// `(1 + w)` RMSNorm weights, stored as `1 + w`.
    pub input_norm: Vec<f32>,
    pub post_norm: Vec<f32>,
    pub mixer: Mixer,
    pub mlp: Mlp,
}

pub struct Weights {
    pub embed: Mat,
    pub layers: Vec<Layer>,
    /// Final norm, stored as `1 + w`.
    pub norm: Vec<f32>,
    /// `None` when tied to the embedding.
    pub lm_head: Option<Mat>,
}

impl Weights {
    pub fn lm_head(&self) -> &Mat {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    pub fn load(cfg: &ModelConfig, src: &dyn WeightSource) -> Result<Self> {
        let h = cfg.hidden_size;
        let embed = src.mat("embed_tokens.weight", cfg.vocab_size, h)?;
        let lm_head = if cfg.tie_word_embeddings && !src.has("lm_head.weight") {
            None
        } else {
            Some(src.mat("lm_head.weight", cfg.vocab_size, h)?)
        };
        let layers = (0..cfg.num_layers())
            .map(|i| load_layer(cfg, src, i).with_context(|| format!("loading layer {i}")))
            .collect::<Result<Vec<_>>>()?;
        Ok(Weights {
            embed,
            layers,
            norm: one_plus(src.vector("norm.weight", &[h])?),
            lm_head,
        })
    }

    /// Every matrix, each once.
    pub fn mats(&self) -> Vec<&Mat> {
        let mut v: Vec<&Mat> = vec![&self.embed];
        v.extend(&self.lm_head);
        for l in &self.layers {
            match &l.mixer {
                Mixer::Gdn(g) => v.extend([
                    &g.in_proj_qkv,
                    &g.in_proj_z,
                    &g.in_proj_a,
                    &g.in_proj_b,
                    &g.out_proj,
                ]),
                Mixer::Attention(a) => v.extend([&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj]),
            }
            match &l.mlp {
                Mlp::Moe {
                    router,
                    experts,
                    shared,
                    shared_gate,
                } => {
                    v.extend([router, shared_gate]);
                    for d in experts.iter().chain([shared]) {
                        v.extend([&d.gate, &d.up, &d.down]);
                    }
                }
                Mlp::Dense(d) => v.extend([&d.gate, &d.up, &d.down]),
            }
        }
        v
    }

    /// Bytes of all matrices (what a backend must hold).
    pub fn bytes_total(&self) -> usize {
        self.mats().iter().map(|m| m.bytes()).sum()
    }

    /// Dequantizes every FP8 matrix to its kept bf16 copy, tensors in parallel
    /// (the CPU backend computes on them; doing it ahead keeps it out of the
    /// first request and out of the backend's own parallel loops).
    pub fn dequantize_fp8(&self) {
        self.mats().par_iter().for_each(|m| {
            if m.fp8().is_some() {
                m.data();
            }
        });
    }
}

fn one_plus(mut w: Vec<f32>) -> Vec<f32> {
    w.iter_mut().for_each(|x| *x += 1.0);
    w
}

fn dense(src: &dyn WeightSource, prefix: &str, h: usize, inter: usize) -> Result<DenseMlp> {
    Ok(DenseMlp {
        gate: src.mat(&format!("{prefix}.gate_proj.weight"), inter, h)?,
        up: src.mat(&format!("{prefix}.up_proj.weight"), inter, h)?,
        down: src.mat(&format!("{prefix}.down_proj.weight"), h, inter)?,
    })
}

/// Routed experts: fused `experts.gate_up_proj` `[E, 2I, H]` (gate rows, then
/// up rows) and `experts.down_proj` `[E, H, I]` as published, or one tensor
/// set per expert (`experts.N.gate_proj.weight`, ...) as transformers'
/// `save_pretrained` writes them.
fn experts(
    src: &dyn WeightSource,
    m: &str,
    n: usize,
    h: usize,
    inter: usize,
) -> Result<Vec<DenseMlp>> {
    let fused = format!("{m}.experts.gate_up_proj");
    if !src.has(&fused) && src.has(&format!("{m}.experts.0.gate_proj.weight")) {
        return (0..n)
            .map(|e| dense(src, &format!("{m}.experts.{e}"), h, inter))
            .collect();
    }
    let gate_up = src.mats(&fused, n, 2 * inter, h)?;
    let down = src.mats(&format!("{m}.experts.down_proj"), n, h, inter)?;
    Ok(gate_up
        .into_iter()
        .zip(down)
        .map(|(gu, down)| DenseMlp {
            gate: gu.rows_slice(0, inter),
            up: gu.rows_slice(inter, inter),
            down,
        })
        .collect())
}

fn load_layer(cfg: &ModelConfig, src: &dyn WeightSource, i: usize) -> Result<Layer> {
    let h = cfg.hidden_size;
    let p = format!("layers.{i}");
    let mixer = match cfg.layer_kinds[i] {
        LayerKind::Linear => {
            let a = format!("{p}.linear_attn");
            let conv_dim = cfg.linear_conv_dim();
            let nv = cfg.linear_num_value_heads;
            Mixer::Gdn(GdnWeights {
                in_proj_qkv: src.mat(&format!("{a}.in_proj_qkv.weight"), conv_dim, h)?,
                in_proj_z: src.mat(&format!("{a}.in_proj_z.weight"), cfg.linear_value_dim(), h)?,
                in_proj_a: src.mat(&format!("{a}.in_proj_a.weight"), nv, h)?,
                in_proj_b: src.mat(&format!("{a}.in_proj_b.weight"), nv, h)?,
                conv: src.vector(
                    &format!("{a}.conv1d.weight"),
                    &[conv_dim, 1, cfg.linear_conv_kernel],
                )?,
                a_log: src.vector(&format!("{a}.A_log"), &[nv])?,
                dt_bias: src.vector(&format!("{a}.dt_bias"), &[nv])?,
                norm: src.vector(&format!("{a}.norm.weight"), &[cfg.linear_value_head_dim])?,
                out_proj: src.mat(&format!("{a}.out_proj.weight"), h, cfg.linear_value_dim())?,
            })
        }
        LayerKind::Full => {
            let a = format!("{p}.self_attn");
            let hd = cfg.head_dim;
            let q_rows = cfg.num_attention_heads * hd;
            let kv_rows = cfg.num_key_value_heads * hd;
            Mixer::Attention(AttentionWeights {
                q_proj: src.mat(&format!("{a}.q_proj.weight"), 2 * q_rows, h)?,
                k_proj: src.mat(&format!("{a}.k_proj.weight"), kv_rows, h)?,
                v_proj: src.mat(&format!("{a}.v_proj.weight"), kv_rows, h)?,
                o_proj: src.mat(&format!("{a}.o_proj.weight"), h, q_rows)?,
                q_norm: one_plus(src.vector(&format!("{a}.q_norm.weight"), &[hd])?),
                k_norm: one_plus(src.vector(&format!("{a}.k_norm.weight"), &[hd])?),
            })
        }
    };
    let m = format!("{p}.mlp");
    let mlp = match cfg.mlp {
        MlpConfig::Moe {
            num_experts,
            intermediate,
            shared_intermediate,
            ..
        } => Mlp::Moe {
            router: src.mat(&format!("{m}.gate.weight"), num_experts, h)?,
            experts: experts(src, &m, num_experts, h, intermediate)?,
            shared: dense(src, &format!("{m}.shared_expert"), h, shared_intermediate)?,
            shared_gate: src.mat(&format!("{m}.shared_expert_gate.weight"), 1, h)?,
        },
        MlpConfig::Dense { intermediate } => Mlp::Dense(dense(src, &m, h, intermediate)?),
    };
    Ok(Layer {
        input_norm: one_plus(src.vector(&format!("{p}.input_layernorm.weight"), &[h])?),
        post_norm: one_plus(src.vector(&format!("{p}.post_attention_layernorm.weight"), &[h])?),
        mixer,
        mlp,
    })
}
