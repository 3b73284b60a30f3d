//! Feed-forward blocks on the CPU: the routed MoE (softmax router, top-k,
//! renormalised weights, SwiGLU experts, gated shared expert) and the dense SwiGLU MLP.

use super::ops::{linear, sigmoid, silu};
use crate::weights::{DenseMlp, Mlp};
use rayon::prelude::*;

/// `x` is `[T, hidden]` (normed); returns `[T, hidden]`.
pub fn forward(mlp: &Mlp, top_k: usize, x: &[f32], hidden: usize) -> Vec<f32> {
    match mlp {
        Mlp::Dense(d) => swiglu(d, x),
        Mlp::Moe {
            router,
            experts,
            shared,
            shared_gate,
        } => {
            let t_len = x.len() / hidden;
            let mut out = swiglu(shared, x);
            let sg = linear(x, shared_gate);
            for t in 0..t_len {
                let g = sigmoid(sg[t]);
                out[t * hidden..(t + 1) * hidden]
                    .iter_mut()
                    .for_each(|v| *v *= g);
            }
            let logits = linear(x, router);
            let routes = route(&logits, experts.len(), top_k);
            // Group tokens by expert so each expert's weights are read once per pass.
            let mut by_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); experts.len()];
            for (t, r) in routes.iter().enumerate() {
                for &(e, w) in r {
                    by_expert[e].push((t, w));
                }
            }
            let partial: Vec<(usize, Vec<f32>)> = by_expert
                .par_iter()
                .enumerate()
                .filter(|(_, toks)| !toks.is_empty())
                .map(|(e, toks)| {
                    let xs: Vec<f32> = toks
                        .iter()
                        .flat_map(|&(t, _)| x[t * hidden..(t + 1) * hidden].iter().copied())
                        .collect();
                    (e, swiglu(&experts[e], &xs))
                })
                .collect();
            for (e, ys) in partial {
                for (i, &(t, w)) in by_expert[e].iter().enumerate() {
                    for (o, y) in out[t * hidden..(t + 1) * hidden]
                        .iter_mut()
                        .zip(&ys[i * hidden..(i + 1) * hidden])
                    {
                        *o += w * y;
                    }
                }
            }
            out
        }
    }
}

/// Per token: softmax over all experts, the top-k (ties to the lower index),
/// weights renormalised over the chosen k.
pub fn route(logits: &[f32], num_experts: usize, top_k: usize) -> Vec<Vec<(usize, f32)>> {
    logits
        .chunks(num_experts)
        .map(|l| {
            let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let p: Vec<f32> = l.iter().map(|v| (v - max).exp()).collect();
            let sum: f32 = p.iter().sum();
            let mut idx: Vec<usize> = (0..num_experts).collect();
            idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            idx.truncate(top_k);
            let chosen: f32 = idx.iter().map(|&e| p[e] / sum).sum();
            idx.into_iter().map(|e| (e, p[e] / sum / chosen)).collect()
        })
        .collect()
}

fn swiglu(d: &DenseMlp, x: &[f32]) -> Vec<f32> {
    let g = linear(x, &d.gate);
    let u = linear(x, &d.up);
    let act: Vec<f32> = g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect();
    linear(&act, &d.down)
}
