//! Gated full attention on the CPU: per-head `[query | gate]` projection,
//! (1+w) q/k norms, partial rotary embedding, causal GQA softmax attention
//! over the KV cache, sigmoid output gate.

use super::ops::{dot, linear, rms_norm, sigmoid, softmax};
use crate::config::ModelConfig;
use crate::weights::AttentionWeights;
use rayon::prelude::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Tokens per KV page. 64 matches the GDN chunk, so a snapshot taken at a
/// chunk boundary shares every page it covers and a request resuming from a
/// snapshot inside a page copies at most 63 tokens' K/V of one page per layer
/// (copy-on-write); pages are small enough that this copy is cheap and large
/// enough that the per-page bookkeeping (one `Arc` per 64 tokens) is noise.
pub const PAGE_TOKENS: usize = 64;

/// Live-page accounting for one model's KV pages (tests check for leaks with it).
#[derive(Default, Debug)]
pub struct PageStats {
    live_pages: AtomicUsize,
    live_bytes: AtomicUsize,
}

impl PageStats {
    /// KV pages currently allocated (held by sequences or snapshots).
    pub fn live_pages(&self) -> usize {
        self.live_pages.load(Ordering::SeqCst)
    }
    /// Bytes of those pages.
    pub fn live_bytes(&self) -> usize {
        self.live_bytes.load(Ordering::SeqCst)
    }
}

static NEXT_PAGE_ID: AtomicU64 = AtomicU64::new(1);

/// `PAGE_TOKENS` positions of one layer's K and V, `[token][kv_heads][head_dim]`
/// each. Immutable while shared: writers go through `Arc::make_mut`, which
/// copies a page that a snapshot (or another sequence) still references.
pub struct KvPage {
    /// Process-unique id (the prefix cache counts shared pages once by it).
    id: u64,
    k: Vec<f32>,
    v: Vec<f32>,
    stats: Arc<PageStats>,
}

impl KvPage {
    fn new(floats: usize, stats: Arc<PageStats>) -> Self {
        Self::from_parts(vec![0.0; floats], vec![0.0; floats], stats)
    }

    fn from_parts(k: Vec<f32>, v: Vec<f32>, stats: Arc<PageStats>) -> Self {
        stats.live_pages.fetch_add(1, Ordering::SeqCst);
        stats
            .live_bytes
            .fetch_add((k.len() + v.len()) * 4, Ordering::SeqCst);
        KvPage {
            id: NEXT_PAGE_ID.fetch_add(1, Ordering::Relaxed),
            k,
            v,
            stats,
        }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * 4
    }
}

impl Clone for KvPage {
    /// A copy is a new page (new id, counted live).
    fn clone(&self) -> Self {
        Self::from_parts(self.k.clone(), self.v.clone(), self.stats.clone())
    }
}

impl Drop for KvPage {
    fn drop(&mut self) {
        self.stats.live_pages.fetch_sub(1, Ordering::SeqCst);
        self.stats
            .live_bytes
            .fetch_sub(self.bytes(), Ordering::SeqCst);
    }
}

/// KV cache of one attention layer: positions `0..len` in fixed-size pages of
/// `PAGE_TOKENS`, keys stored after norm and rotary embedding. Cloning shares
/// the pages (reference counts); appending copies a shared tail page first.
#[derive(Clone)]
pub struct KvCache {
    pages: Vec<Arc<KvPage>>,
    len: usize,
    /// Floats per position: `kv_heads * head_dim`.
    row: usize,
    stats: Arc<PageStats>,
}

impl KvCache {
    pub fn new(cfg: &ModelConfig, stats: Arc<PageStats>) -> Self {
        KvCache {
            pages: Vec::new(),
            len: 0,
            row: cfg.num_key_value_heads * cfg.head_dim,
            stats,
        }
    }

    /// True when this cache's pages are counted by `stats`.
    pub fn shares_stats(&self, stats: &Arc<PageStats>) -> bool {
        Arc::ptr_eq(&self.stats, stats)
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pages covering `0..len` (the last one possibly partial).
    pub fn pages(&self) -> &[Arc<KvPage>] {
        &self.pages
    }

    /// Appends one position's `[kv_heads * head_dim]` key and value.
    fn push(&mut self, k: &[f32], v: &[f32]) {
        let (page, off) = (self.len / PAGE_TOKENS, self.len % PAGE_TOKENS);
        if page == self.pages.len() {
            self.pages.push(Arc::new(KvPage::new(
                PAGE_TOKENS * self.row,
                self.stats.clone(),
            )));
        }
        // Copy-on-write: a page shared with a snapshot is copied before it changes.
        let p = Arc::make_mut(&mut self.pages[page]);
        p.k[off * self.row..(off + 1) * self.row].copy_from_slice(k);
        p.v[off * self.row..(off + 1) * self.row].copy_from_slice(v);
        self.len += 1;
    }

    #[inline]
    fn k_at(&self, pos: usize) -> &[f32] {
        let off = (pos % PAGE_TOKENS) * self.row;
        &self.pages[pos / PAGE_TOKENS].k[off..off + self.row]
    }

    #[inline]
    fn v_at(&self, pos: usize) -> &[f32] {
        let off = (pos % PAGE_TOKENS) * self.row;
        &self.pages[pos / PAGE_TOKENS].v[off..off + self.row]
    }
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

/// One attention pass over `x` (`[Σ T, hidden]`, normed): the rows of
/// several sequences stacked, `lens[i]` rows at positions
/// `caches[i].len()..`; appends to each cache and returns `[Σ T, hidden]`.
/// The projections run once over all rows, the attention per sequence over
/// its own keys.
pub fn forward(
    cfg: &ModelConfig,
    w: &AttentionWeights,
    rope: &Rope,
    caches: &mut [&mut KvCache],
    lens: &[usize],
    x: &[f32],
) -> Vec<f32> {
    let h = cfg.hidden_size;
    let t_all = x.len() / h;
    let (nh, nkv, hd) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
    );

    let qg = linear(x, &w.q_proj);
    let mut k = linear(x, &w.k_proj);
    let v = linear(x, &w.v_proj);
    let mut q = vec![0f32; t_all * nh * hd];
    let mut gate = vec![0f32; t_all * nh * hd];
    for t in 0..t_all {
        for head in 0..nh {
            let src = &qg[(t * nh + head) * 2 * hd..(t * nh + head + 1) * 2 * hd];
            let dst = (t * nh + head) * hd;
            q[dst..dst + hd].copy_from_slice(&src[..hd]);
            gate[dst..dst + hd].copy_from_slice(&src[hd..]);
        }
    }
    rms_norm(&mut q, &w.q_norm, cfg.rms_norm_eps);
    rms_norm(&mut k, &w.k_norm, cfg.rms_norm_eps);
    let mut o = vec![0f32; t_all * nh * hd];
    let row = nkv * hd;
    let mut t0 = 0;
    for (cache, &t_len) in caches.iter_mut().zip(lens) {
        let rows = t0..t0 + t_len;
        attend(
            rope,
            cache,
            &mut q[rows.start * nh * hd..rows.end * nh * hd],
            &mut k[rows.start * row..rows.end * row],
            &v[rows.start * row..rows.end * row],
            &gate[rows.start * nh * hd..rows.end * nh * hd],
            &mut o[rows.start * nh * hd..rows.end * nh * hd],
            (nh, nkv, hd),
        );
        t0 = rows.end;
    }
    linear(&o, &w.o_proj)
}

/// One sequence's part of [`forward`]: rotary embedding at its positions,
/// its keys and values appended, causal GQA attention over its cache and
/// the output gate; writes `[T, nh * hd]` to `o`.
#[allow(clippy::too_many_arguments)]
fn attend(
    rope: &Rope,
    cache: &mut KvCache,
    q: &mut [f32],
    k: &mut [f32],
    v: &[f32],
    gate: &[f32],
    o: &mut [f32],
    (nh, nkv, hd): (usize, usize, usize),
) {
    let t_len = q.len() / (nh * hd);
    let pos0 = cache.len();
    for t in 0..t_len {
        for head in q[t * nh * hd..(t + 1) * nh * hd].chunks_mut(hd) {
            rope.apply(head, pos0 + t);
        }
        for head in k[t * nkv * hd..(t + 1) * nkv * hd].chunks_mut(hd) {
            rope.apply(head, pos0 + t);
        }
    }
    let row = nkv * hd;
    for t in 0..t_len {
        cache.push(&k[t * row..(t + 1) * row], &v[t * row..(t + 1) * row]);
    }

    let scale = 1.0 / (hd as f32).sqrt();
    let group = nh / nkv;
    let kc: &KvCache = cache;
    let q: &[f32] = q;
    o.par_chunks_mut(hd).enumerate().for_each(|(idx, out)| {
        let (t, head) = (idx / nh, idx % nh);
        let kvh = head / group;
        let qv = &q[idx * hd..(idx + 1) * hd];
        let n = pos0 + t + 1; // causal: keys 0..=pos
        let mut scores: Vec<f32> = (0..n)
            .map(|s| dot(qv, &kc.k_at(s)[kvh * hd..(kvh + 1) * hd]) * scale)
            .collect();
        softmax(&mut scores);
        out.fill(0.0);
        for (s, p) in scores.iter().enumerate() {
            for (o, vv) in out.iter_mut().zip(&kc.v_at(s)[kvh * hd..(kvh + 1) * hd]) {
                *o += p * vv;
            }
        }
        let g = &gate[idx * hd..(idx + 1) * hd];
        for (o, gg) in out.iter_mut().zip(g) {
            *o *= sigmoid(*gg);
        }
    });
}
