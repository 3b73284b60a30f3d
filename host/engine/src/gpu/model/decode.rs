//! The decode step: fused kernels (`kernels/decode*.cu`) over buffers of
//! fixed addresses, with the token id and position read from device memory,
//! so after one eager step the whole step is captured once as a CUDA graph and
//! replayed: one launch per token instead of ~300.
//!
//! The step is the embedding row, the shared layer walk ([`GpuModel::walk`],
//! each layer's `decode`, see [`super::pass`]) and the head: GDN = norm +
//! in_proj GEMV with the conv of its rows at the end (or a separate conv
//! kernel), L2 norms + gates + recurrence + gated norm (one block per head),
//! out_proj GEMV + residual (3 or 4 kernels); attention = norm + proj GEMV,
//! q/k norm + RoPE + KV append, split-K attention, combine + gate, o_proj
//! GEMV + residual (5); MoE = norm + router/shared GEMV, routed gate/up
//! (router top-k recomputed per block), routed + shared down + residual (3).
//! Then norm + lm_head GEMV and a two-stage argmax/log-sum-exp. Every kernel
//! that updates the hidden state also writes per-block sums of squares, so
//! the next RMSNorm is a scale inside the following GEMV rather than a kernel.

use super::embed::ARGMAX_BLOCKS;
use super::pass::{Decode, Pass};
use super::{DBuf, F, GpuModel, GpuSequence, Graph, LayerMixer, LayerMlp, mlp_dims};
use anyhow::{Result, bail};

/// Most key-length splits of decode attention.
pub(super) const MAX_SPLIT: usize = 128;

/// Captured decode graphs kept at once: one per running sequence (as many
/// as the scheduler's largest default `--max-num-seqs`), so a scheduler that
/// interleaves sequences step by step replays instead of capturing again (a
/// capture costs several steps' time; least recently used go first).
const GRAPH_CACHE: usize = 256;

/// Device buffers of the decode step (fixed addresses, so graphs stay valid)
/// and the captured graphs of the sequences that ran last.
pub(super) struct DecodeState {
    /// `[token u32, position i32]`, written by the host before each step.
    pub step: DBuf,
    pub x: DBuf,
    /// Per-block sums of squares of `x` written by the kernel that last
    /// updated it (`nssq` of them): the next RMSNorm's input.
    pub ssq: DBuf,
    pub nssq: usize,
    pub proj: DBuf,
    pub q: DBuf,
    pub att_po: DBuf,
    pub att_pml: DBuf,
    pub att_o: DBuf,
    pub gdn_o: DBuf,
    pub act: DBuf,
    pub logits: DBuf,
    pub part: DBuf,
    /// `[token (int bits), max, log-sum-exp]` of the last step's logits.
    pub stats: DBuf,
    /// `(sequence id, KV capacity)` -> its graph, least recently used first.
    graphs: Vec<((u64, usize), Graph)>,
    graphs_ok: bool,
    /// Gate/up row pairs per warp of `dec_moe_gate_up` (`GpuOptions::moe_pairs`).
    pub moe_pairs: usize,
}

impl GpuModel {
    fn decode_state(&self) -> Result<DecodeState> {
        let c = &self.cfg;
        let d = &self.dev;
        let h = c.hidden_size;
        let (_, k, inter, _) = mlp_dims(c);
        let (nh, hd) = (c.num_attention_heads, c.head_dim);
        let proj_rows = self
            .layers
            .iter()
            .map(|l| match &l.mixer {
                LayerMixer::Gdn(g) => g.proj_width(),
                LayerMixer::Attn(a) => a.proj.rows,
            })
            .chain(self.layers.iter().map(|l| match &l.mlp {
                LayerMlp::Moe(m) => m.input.rows,
                LayerMlp::Dense(m) => m.gate_up.rows,
            }))
            .max()
            .unwrap_or(0);
        if c.linear_key_head_dim > 128 || c.linear_value_head_dim > 128 {
            bail!(
                "the GDN decode step supports key/value head dims <= 128 (got {} / {})",
                c.linear_key_head_dim,
                c.linear_value_head_dim
            );
        }
        if c.num_key_value_heads == 0
            || nh % c.num_key_value_heads != 0
            || nh / c.num_key_value_heads > 16
            || hd > 256
        {
            bail!(
                "decode attention needs 1..=16 query heads per KV head and head_dim <= 256 (got {nh} / {} heads, head_dim {hd})",
                c.num_key_value_heads
            );
        }
        let act = (k.max(1) * inter).max(inter);
        Ok(DecodeState {
            step: d.alloc_zeroed(16)?,
            x: d.alloc(h * F)?,
            ssq: d.alloc(h.div_ceil(8) * F)?,
            nssq: h.div_ceil(8),
            proj: d.alloc(proj_rows * F)?,
            q: d.alloc(nh * hd * F)?,
            att_po: d.alloc(nh * MAX_SPLIT * hd * F)?,
            att_pml: d.alloc(nh * MAX_SPLIT * 2 * F)?,
            att_o: d.alloc(nh * hd * F)?,
            gdn_o: d.alloc(c.linear_value_dim().max(1) * F)?,
            act: d.alloc(act * F)?,
            logits: d.alloc(c.vocab_size * F)?,
            part: d.alloc(ARGMAX_BLOCKS * 3 * F)?,
            stats: d.alloc(16)?,
            graphs: Vec::new(),
            graphs_ok: self.opts.graphs && !d.debug && !d.profiling(),
            moe_pairs: self.opts.moe_pairs,
        })
    }

    /// Key-length splits of decode attention for a KV capacity (fixed per
    /// graph; the kernel divides the current length among them). On the H200
    /// 128 splits beat 96 at 8K and 288-512 at 32K-131K.
    pub(super) fn decode_splits(cap: usize) -> usize {
        (cap / 64).clamp(1, MAX_SPLIT)
    }

    /// Appends `token`; returns the device addresses of its logits and of its
    /// greedy statistics (`[token, max, log-sum-exp]`).
    pub(super) fn decode_step(&self, seq: &mut GpuSequence, token: u32) -> Result<(u64, u64)> {
        self.init_sequence(seq)?;
        self.reserve(seq, seq.pos + 1)?;
        let mut guard = self.decode.lock().unwrap();
        if guard.is_none() {
            *guard = Some(self.decode_state()?);
        }
        let ds = guard.as_mut().unwrap();
        // HIP runtimes without stream capture run every step eagerly.
        #[cfg(all(feature = "hip", not(feature = "cuda")))]
        {
            ds.graphs_ok &= self.dev.graphs_supported();
        }
        let step = [token, seq.pos as u32];
        self.dev.htod(ds.step.ptr(), &step)?;
        let key = (seq.id, seq.cap());
        match ds.graphs.iter().position(|(k, _)| *k == key) {
            Some(i) => {
                let hit = ds.graphs.remove(i);
                self.dev.launch_graph(&hit.1)?;
                ds.graphs.push(hit);
            }
            None => {
                // A new capacity plan (more key splits; a slab moved) makes the
                // sequence's older graph stale.
                ds.graphs.retain(|(k, _)| k.0 != seq.id);
                self.decode_kernels(seq, ds)?;
                if ds.graphs_ok {
                    // Record the same launches (nothing runs during capture).
                    self.dev.begin_capture()?;
                    let recorded = self.decode_kernels(seq, ds);
                    let graph = self.dev.end_capture();
                    match (recorded, graph) {
                        (Ok(()), Ok(g)) => {
                            if ds.graphs.len() >= GRAPH_CACHE {
                                ds.graphs.remove(0);
                            }
                            ds.graphs.push((key, g));
                        }
                        (r, g) => {
                            eprintln!(
                                "[cuda] decode graphs disabled: {:#}",
                                r.err().or(g.err()).unwrap()
                            );
                            ds.graphs_ok = false;
                        }
                    }
                }
            }
        }
        seq.pos += 1;
        Ok((ds.logits.ptr(), ds.stats.ptr()))
    }

    /// Launches one decode step's kernels (eagerly or into a capture): the
    /// embedding row, the layers, the head.
    fn decode_kernels(&self, seq: &GpuSequence, ds: &DecodeState) -> Result<()> {
        let dc = Decode { ds, seq };
        self.head.decode_embed(self, &dc)?;
        self.walk(&mut Pass::Decode(&dc))?;
        self.head.decode(self, &dc)
    }
}
