//! Gated DeltaNet (linear attention) on the CPU: the causal conv, the gating,
//! and the delta-rule recurrence in both forms — token-serial (the default
//! for every pass) and the chunked WY form (chunk 64, the GPU prompt
//! kernels' form, kept as their reference) — which must agree.

use super::ops::{dot, l2_norm, linear, rms_norm, sigmoid, silu, softplus};
use crate::config::ModelConfig;
use crate::weights::GdnWeights;
use rayon::prelude::*;

/// Chunk length of the chunked (WY) prefill form.
pub const CHUNK: usize = 64;

/// How a multi-token pass runs the recurrence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GdnPrefill {
    /// WY/UT-transform form over chunks of 64 tokens (the GPU prompt kernels'
    /// form; rounds differently when a prompt is split inside a chunk).
    Chunked,
    /// One token at a time (the definition and the CPU default): a prompt
    /// split anywhere gives bit-identical states, so a prefix-cache hit at any
    /// position reproduces the cold run exactly. On the CPU it costs no more
    /// than the chunked form (the recurrence is ~1% of a token's FLOPs).
    Serial,
}

/// Per-layer recurrent state: the conv window and one `[dk, dv]` matrix per value head.
#[derive(Clone)]
pub struct GdnState {
    /// `[conv_dim][kernel - 1]`: the previous raw qkv inputs, oldest first.
    pub conv: Vec<f32>,
    /// `[value_heads][dk][dv]`, f32.
    pub s: Vec<f32>,
}

impl GdnState {
    pub fn new(cfg: &ModelConfig) -> Self {
        GdnState {
            conv: vec![0.0; cfg.linear_conv_dim() * (cfg.linear_conv_kernel - 1)],
            s: vec![
                0.0;
                cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim
            ],
        }
    }
}

/// One GDN mixer pass over `x` (`[Σ T, hidden]`, already normed): the rows
/// of several sequences stacked, `lens[i]` rows continuing `states[i]`;
/// returns `[Σ T, hidden]`. The projections run once over all rows, the
/// conv and the recurrence per sequence over its own state.
pub fn forward(
    cfg: &ModelConfig,
    w: &GdnWeights,
    states: &mut [&mut GdnState],
    lens: &[usize],
    x: &[f32],
    mode: GdnPrefill,
) -> Vec<f32> {
    let (nv, dv) = (cfg.linear_num_value_heads, cfg.linear_value_head_dim);
    let conv_dim = cfg.linear_conv_dim();
    let mut qkv = linear(x, &w.in_proj_qkv);
    let z = linear(x, &w.in_proj_z);
    let a = linear(x, &w.in_proj_a);
    let b = linear(x, &w.in_proj_b);
    let mut o = vec![0f32; z.len()];
    // Each sequence's rows of every buffer.
    let (mut qkv_r, mut o_r) = (qkv.as_mut_slice(), o.as_mut_slice());
    let (mut a_r, mut b_r) = (a.as_slice(), b.as_slice());
    let mut jobs = Vec::with_capacity(states.len());
    for (st, &t) in states.iter_mut().zip(lens) {
        let (q1, q2) = std::mem::take(&mut qkv_r).split_at_mut(t * conv_dim);
        let (o1, o2) = std::mem::take(&mut o_r).split_at_mut(t * nv * dv);
        let (a1, a2) = a_r.split_at(t * nv);
        let (b1, b2) = b_r.split_at(t * nv);
        (qkv_r, o_r, a_r, b_r) = (q2, o2, a2, b2);
        jobs.push((&mut **st, q1, a1, b1, o1));
    }
    if jobs.len() == 1 {
        let (st, q, a, b, o) = jobs.pop().expect("one job");
        mix(cfg, w, st, q, a, b, o, mode);
    } else {
        jobs.into_par_iter()
            .for_each(|(st, q, a, b, o)| mix(cfg, w, st, q, a, b, o, mode));
    }
    // Gated RMSNorm per head (plain weight), times silu(z); then out_proj.
    rms_norm(&mut o, &w.norm, cfg.rms_norm_eps);
    for (oi, zi) in o.iter_mut().zip(&z) {
        *oi *= silu(*zi);
    }
    linear(&o, &w.out_proj)
}

/// One sequence's part of [`forward`]: the conv over its projected `qkv`
/// rows (continuing `st.conv`), the gates from its `a`, `b` rows and the
/// recurrence over `st.s`; writes the heads' outputs `[T, nv * dv]` to `o`.
#[allow(clippy::too_many_arguments)]
fn mix(
    cfg: &ModelConfig,
    w: &GdnWeights,
    st: &mut GdnState,
    qkv: &mut [f32],
    a: &[f32],
    b: &[f32],
    o: &mut [f32],
    mode: GdnPrefill,
) {
    let (nk, nv) = (cfg.linear_num_key_heads, cfg.linear_num_value_heads);
    let (dk, dv) = (cfg.linear_key_head_dim, cfg.linear_value_head_dim);
    let conv_dim = cfg.linear_conv_dim();
    let key_dim = nk * dk;
    let t_len = qkv.len() / conv_dim;
    causal_conv_silu(qkv, &mut st.conv, &w.conv, conv_dim, cfg.linear_conv_kernel);

    // Split and normalise: q, k per key head; v per value head.
    let scale = 1.0 / (dk as f32).sqrt();
    let mut q = vec![0f32; t_len * key_dim];
    let mut k = vec![0f32; t_len * key_dim];
    let mut v = vec![0f32; t_len * nv * dv];
    for t in 0..t_len {
        let row = &qkv[t * conv_dim..(t + 1) * conv_dim];
        q[t * key_dim..(t + 1) * key_dim].copy_from_slice(&row[..key_dim]);
        k[t * key_dim..(t + 1) * key_dim].copy_from_slice(&row[key_dim..2 * key_dim]);
        v[t * nv * dv..(t + 1) * nv * dv].copy_from_slice(&row[2 * key_dim..]);
    }
    for head in q.chunks_mut(dk) {
        l2_norm(head, 1e-6);
        head.iter_mut().for_each(|x| *x *= scale);
    }
    for head in k.chunks_mut(dk) {
        l2_norm(head, 1e-6);
    }
    // Gates per (token, value head), in f32.
    let mut g = vec![0f32; t_len * nv];
    let mut beta = vec![0f32; t_len * nv];
    for t in 0..t_len {
        for hv in 0..nv {
            let i = t * nv + hv;
            beta[i] = sigmoid(b[i]);
            g[i] = -w.a_log[hv].exp() * softplus(a[i] + w.dt_bias[hv]);
        }
    }

    // The recurrence, one task per value head (each owns its state matrix).
    let group = nv / nk;
    let per_head: Vec<Vec<f32>> =
        st.s.par_chunks_mut(dk * dv)
            .enumerate()
            .map(|(hv, s)| {
                let hk = hv / group;
                let head = HeadInputs {
                    q: gather(&q, t_len, key_dim, hk * dk, dk),
                    k: gather(&k, t_len, key_dim, hk * dk, dk),
                    v: gather(&v, t_len, nv * dv, hv * dv, dv),
                    g: (0..t_len).map(|t| g[t * nv + hv]).collect(),
                    beta: (0..t_len).map(|t| beta[t * nv + hv]).collect(),
                    dk,
                    dv,
                };
                if mode == GdnPrefill::Serial || t_len == 1 {
                    recurrent(&head, s)
                } else {
                    chunked(&head, s)
                }
            })
            .collect();
    for (hv, out) in per_head.iter().enumerate() {
        for t in 0..t_len {
            o[t * nv * dv + hv * dv..t * nv * dv + (hv + 1) * dv]
                .copy_from_slice(&out[t * dv..(t + 1) * dv]);
        }
    }
}

/// Depthwise causal conv (kernel K) over `[T, C]` in place, continuing from
/// `state` (the previous K-1 inputs per channel), followed by SiLU.
fn causal_conv_silu(x: &mut [f32], state: &mut [f32], w: &[f32], c: usize, k: usize) {
    let t_len = x.len() / c;
    let hist = k - 1;
    for ch in 0..c {
        let mut seq: Vec<f32> = state[ch * hist..(ch + 1) * hist].to_vec();
        seq.extend((0..t_len).map(|t| x[t * c + ch]));
        let wk = &w[ch * k..(ch + 1) * k];
        for t in 0..t_len {
            let acc: f32 = (0..k).map(|j| wk[j] * seq[t + j]).sum();
            x[t * c + ch] = silu(acc);
        }
        state[ch * hist..(ch + 1) * hist].copy_from_slice(&seq[seq.len() - hist..]);
    }
}

fn gather(src: &[f32], t_len: usize, stride: usize, off: usize, width: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(t_len * width);
    for t in 0..t_len {
        out.extend_from_slice(&src[t * stride + off..t * stride + off + width]);
    }
    out
}

/// One value head's inputs over T tokens: q, k `[T, dk]` (normalised, q
/// scaled), v `[T, dv]`, log-decay g and beta `[T]`.
struct HeadInputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    dk: usize,
    dv: usize,
}

/// `out[j] = sum_i a[i] * s[i, j]` for a `[a.len(), out.len()]` matrix `s`.
fn vec_mat(a: &[f32], s: &[f32], out: &mut [f32]) {
    let dv = out.len();
    out.fill(0.0);
    for (i, ai) in a.iter().enumerate() {
        for (o, sv) in out.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
            *o += ai * sv;
        }
    }
}

/// The definition: for each token, `S *= exp(g)`, `delta = beta (v - Sᵀk)`,
/// `S += k deltaᵀ`, `o = Sᵀq`. Returns `[T, dv]`.
fn recurrent(x: &HeadInputs, s: &mut [f32]) -> Vec<f32> {
    let (dk, dv) = (x.dk, x.dv);
    let t_len = x.g.len();
    let mut out = vec![0f32; t_len * dv];
    let mut kv = vec![0f32; dv];
    for t in 0..t_len {
        let decay = x.g[t].exp();
        s.iter_mut().for_each(|e| *e *= decay);
        let k = &x.k[t * dk..(t + 1) * dk];
        vec_mat(k, s, &mut kv);
        let v = &x.v[t * dv..(t + 1) * dv];
        for (d, vi) in kv.iter_mut().zip(v) {
            *d = (vi - *d) * x.beta[t];
        }
        for (i, ki) in k.iter().enumerate() {
            for (e, d) in s[i * dv..(i + 1) * dv].iter_mut().zip(&kv) {
                *e += ki * d;
            }
        }
        vec_mat(
            &x.q[t * dk..(t + 1) * dk],
            s,
            &mut out[t * dv..(t + 1) * dv],
        );
    }
    out
}

/// The chunked form: within a chunk of n ≤ 64 tokens, the UT transform
/// `T = (I + A)⁻¹` (A strictly lower: `A[i][j] = beta_i kᵢ·kⱼ e^{Gᵢ-Gⱼ}`, G the
/// cumulative log-decay) turns the n sequential updates into matrix products;
/// the state is carried between chunks. Returns `[T, dv]`.
fn chunked(x: &HeadInputs, s: &mut [f32]) -> Vec<f32> {
    let (dk, dv) = (x.dk, x.dv);
    let t_len = x.g.len();
    let mut out = vec![0f32; t_len * dv];
    for c0 in (0..t_len).step_by(CHUNK) {
        let n = CHUNK.min(t_len - c0);
        let k = &x.k[c0 * dk..(c0 + n) * dk];
        let q = &x.q[c0 * dk..(c0 + n) * dk];
        let v = &x.v[c0 * dv..(c0 + n) * dv];
        let beta = &x.beta[c0..c0 + n];
        let gc: Vec<f32> = x.g[c0..c0 + n]
            .iter()
            .scan(0.0, |acc, g| {
                *acc += g;
                Some(*acc)
            })
            .collect();
        let ki = |i: usize| &k[i * dk..(i + 1) * dk];

        // A (strictly lower), then the forward substitution that makes
        // T = I + A the inverse of (I + beta K Kᵀ ∘ decay) restricted below the diagonal.
        let mut a = vec![0f32; n * n];
        for i in 0..n {
            for j in 0..i {
                a[i * n + j] = -beta[i] * dot(ki(i), ki(j)) * (gc[i] - gc[j]).exp();
            }
        }
        for i in 1..n {
            let row: Vec<f32> = a[i * n..i * n + i].to_vec();
            for j in 0..i {
                let mut sum = row[j];
                for m in j + 1..i {
                    sum += row[m] * a[m * n + j];
                }
                a[i * n + j] = sum;
            }
        }
        for i in 0..n {
            a[i * n + i] = 1.0;
        }
        // U = T (beta v), W = T (beta k e^G).
        let mut u = vec![0f32; n * dv];
        let mut wk = vec![0f32; n * dk];
        for i in 0..n {
            for j in 0..=i {
                let tij = a[i * n + j];
                if tij == 0.0 {
                    continue;
                }
                let cv = tij * beta[j];
                for (o, vv) in u[i * dv..(i + 1) * dv]
                    .iter_mut()
                    .zip(&v[j * dv..(j + 1) * dv])
                {
                    *o += cv * vv;
                }
                let ck = cv * gc[j].exp();
                for (o, kk) in wk[i * dk..(i + 1) * dk].iter_mut().zip(ki(j)) {
                    *o += ck * kk;
                }
            }
        }
        // v_new = U - W S ; out = (q e^G) S + (q kᵀ ∘ decay, lower incl. diag) v_new.
        let mut v_new = vec![0f32; n * dv];
        let mut tmp = vec![0f32; dv];
        for i in 0..n {
            vec_mat(&wk[i * dk..(i + 1) * dk], s, &mut tmp);
            for ((o, uu), tt) in v_new[i * dv..(i + 1) * dv]
                .iter_mut()
                .zip(&u[i * dv..(i + 1) * dv])
                .zip(&tmp)
            {
                *o = uu - tt;
            }
        }
        for i in 0..n {
            let qi = &q[i * dk..(i + 1) * dk];
            let o = &mut out[(c0 + i) * dv..(c0 + i + 1) * dv];
            vec_mat(qi, s, o);
            let e = gc[i].exp();
            o.iter_mut().for_each(|x| *x *= e);
            for j in 0..=i {
                let c = dot(qi, ki(j)) * (gc[i] - gc[j]).exp();
                for (oo, vn) in o.iter_mut().zip(&v_new[j * dv..(j + 1) * dv]) {
                    *oo += c * vn;
                }
            }
        }
        // S = S e^{G_last} + sum_i (k_i e^{G_last - G_i}) v_newᵢᵀ
        let last = gc[n - 1];
        let el = last.exp();
        s.iter_mut().for_each(|e| *e *= el);
        for i in 0..n {
            let c = (last - gc[i]).exp();
            for (r, kr) in ki(i).iter().enumerate() {
                let f = kr * c;
                for (e, vn) in s[r * dv..(r + 1) * dv]
                    .iter_mut()
                    .zip(&v_new[i * dv..(i + 1) * dv])
                {
                    *e += f * vn;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn inputs(t_len: usize, dk: usize, dv: usize, seed: u64) -> HeadInputs {
        let mut s = seed;
        let mut unit = |n: usize| {
            let mut v: Vec<f32> = (0..n).map(|_| lcg(&mut s)).collect();
            for h in v.chunks_mut(dk.min(n)) {
                l2_norm(h, 1e-6);
            }
            v
        };
        let q = unit(t_len * dk);
        let k = unit(t_len * dk);
        let mut s2 = seed ^ 0x9e37;
        HeadInputs {
            q,
            k,
            v: (0..t_len * dv).map(|_| lcg(&mut s2)).collect(),
            g: (0..t_len).map(|_| -0.5 * (lcg(&mut s2) + 1.0)).collect(),
            beta: (0..t_len).map(|_| 0.5 * (lcg(&mut s2) + 1.0)).collect(),
            dk,
            dv,
        }
    }

    #[test]
    fn chunked_equals_recurrent_across_chunk_boundaries() {
        let (dk, dv) = (16, 8);
        for t_len in [1, 2, 63, 64, 65, 130, 200] {
            let x = inputs(t_len, dk, dv, t_len as u64);
            let mut s0: Vec<f32> = {
                let mut seed = 7;
                (0..dk * dv).map(|_| 0.1 * lcg(&mut seed)).collect()
            };
            let mut s1 = s0.clone();
            let a = recurrent(&x, &mut s0);
            let b = chunked(&x, &mut s1);
            let err = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            let serr = s0
                .iter()
                .zip(&s1)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(err < 1e-4, "T={t_len}: output differs by {err}");
            assert!(serr < 1e-4, "T={t_len}: state differs by {serr}");
        }
    }

    #[test]
    fn split_prefill_continues_the_state() {
        // 100 tokens in one chunked pass == 37 chunked + 63 chunked.
        let (dk, dv) = (16, 8);
        let x = inputs(100, dk, dv, 3);
        let part = |r: std::ops::Range<usize>| HeadInputs {
            q: x.q[r.start * dk..r.end * dk].to_vec(),
            k: x.k[r.start * dk..r.end * dk].to_vec(),
            v: x.v[r.start * dv..r.end * dv].to_vec(),
            g: x.g[r.clone()].to_vec(),
            beta: x.beta[r].to_vec(),
            dk,
            dv,
        };
        let mut s_full = vec![0f32; dk * dv];
        let full = chunked(&x, &mut s_full);
        let mut s = vec![0f32; dk * dv];
        let mut split = chunked(&part(0..37), &mut s);
        split.extend(chunked(&part(37..100), &mut s));
        let err = full
            .iter()
            .zip(&split)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(err < 1e-4, "split differs by {err}");
    }
}
