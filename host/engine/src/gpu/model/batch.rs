//! The batched decode step (issue 23): one token of each of B sequences in
//! one pass over the layers, so every weight is read once per step instead of
//! once per sequence.
//!
//! The rows run like a prompt pass of `t = B` tokens ([`Prefill`]: the same
//! RMSNorm kernel, split-precision projections over the rows, the MoE router
//! and grouped expert GEMMs over the batch's tokens) except where a row needs
//! its own sequence's state: the GDN conv and delta-rule step and the
//! attention prep (RoPE, KV append) and split-K attention take per-row
//! addresses from a table on the device (`bat_*` in kernels/decode_gdn.cu,
//! kernels/decode_attn.cu and kernels/attention.cu, the batch-1 decode
//! kernels' arithmetic per row).
//! Then the final norm and the lm_head over the rows, and each row's readout
//! (greedy, head, weights or the logits) from its row of the logits, each
//! kind for all its rows at once ([`super::batch_readout`]).

use super::embed::ARGMAX_BLOCKS;
use super::pass::{Pass, Prefill};
use super::pass_snapshots::Capture;
use super::{F, GpuModel, GpuSequence, Graph, Scratch, SeqLayer, mlp_dims};
use crate::backend::{BatchItem, StepOut, Want};
use crate::gpu::kernels::{self, Launch};
use crate::gpu::{dptr, i};
use crate::readout::mask::TokenMask;
use anyhow::{Result, bail};

/// Keys per split of batched decode attention from which the block copies
/// K/V through a shared-memory ring (as `attn_decode::RING_MIN_KEYS`).
const RING_MIN_KEYS: usize = 256;
/// Keys per tile and most ring stages of `dec_attn_impl` (kernels/decode_attn.cu).
const DA_TILE: usize = 16;
const DA_STAGES: usize = 3;
/// Blocks batched decode attention aims for (two waves of the H200's 132
/// multiprocessors), split over the rows' keys.
const ATTN_BLOCKS: usize = 264;
/// Fewest keys per split.
const MIN_SPLIT_KEYS: usize = 64;

/// A prompt chunk riding in a batched step: its rows `off .. off + t` of
/// the pass, its first position, its sequence's per-layer state, and the
/// snapshots it takes inside the pass.
pub(super) struct Chunk {
    pub off: usize,
    pub t: usize,
    pub pos0: usize,
    pub layers: Vec<SeqLayer>,
    pub captures: Vec<Capture>,
}

/// What a batched step runs: `b` decode rows first (token ids, positions
/// and the state table on the device), then the chunks' rows, `rows` in
/// all; the head reads `heads` rows (rows `0..heads`, or those listed at
/// `head_rows` when it is not 0).
#[derive(Clone, Copy)]
struct Shape<'c> {
    b: usize,
    rows: usize,
    tok: u64,
    tab: u64,
    pos: u64,
    nsplit: usize,
    attn: BatchAttn,
    chunks: &'c [Chunk],
    heads: usize,
    head_rows: u64,
}

/// Batched decode attention's kernel for a step (chosen once per step, from
/// the longest decode row's keys per split): the batch-1 step's choice
/// (`attn_decode::dec_attn_plan`) where it has a batched form (tensor cores,
/// direct reads, or a shared-memory ring of `stages` tiles in `smem` bytes
/// of dynamic shared memory), `threads` per block.
#[derive(Clone, Copy)]
pub(super) struct BatchAttn {
    pub kernel: kernels::Typed<kernels::sig::bat_attn_f32>,
    pub threads: usize,
    pub stages: usize,
    pub smem: usize,
}

/// What a batched step hands the layers: the rows as a prompt pass (`pf`, with
/// no sequence state of its own) and where each row's state is.
pub(super) struct Batch<'a> {
    pub pf: Prefill<'a>,
    /// Decode rows (the first `b` rows of the pass).
    pub b: usize,
    /// `[layers][b][2]` device addresses: (conv window, recurrent state) of a
    /// GDN layer, (K, V) of an attention layer, per decode row.
    pub tab: u64,
    /// `[b]` i32: each decode row's position (where its token's K/V land).
    pub pos: u64,
    /// Key splits of attention (the same for every decode row) and the
    /// attention kernel for them.
    pub nsplit: usize,
    pub attn: BatchAttn,
    /// The prompt chunks after the decode rows.
    pub chunks: &'a [Chunk],
}

/// What a captured batched step depends on besides the scratch buffers:
/// rows, attention splits, the attention kernel and its ring stages.
type GraphKey = (usize, usize, &'static str, usize);

/// Captured batched steps, least recently used first, each with the
/// [`Scratch::generation`] it was captured at and its count of MoE layers
/// that check their router indices on the device.
#[derive(Default)]
pub(super) struct BatchGraphs {
    graphs: Vec<(GraphKey, u64, Graph, usize)>,
    /// Capture failed once (or graphs are off): every step runs eagerly.
    off: bool,
}

/// Captured batched steps kept at once (one per batch size in use).
const BATCH_GRAPHS: usize = 64;

impl Batch<'_> {
    /// Layer `li`'s rows of the state table.
    pub fn layer_tab(&self, li: usize) -> u64 {
        self.tab + (li * self.b * 2 * 8) as u64
    }
}

impl GpuModel {
    /// A step over `batch`: the rows that append one token run as one
    /// batched pass where there are two or more of them, or one beside
    /// prompt chunks, which then ride in the same pass (and `QWASI_BATCH`
    /// is not `serial`); every other row runs on its own.
    pub(super) fn step_rows(
        &self,
        batch: &mut [BatchItem<'_, GpuSequence>],
    ) -> Vec<Result<StepOut>> {
        let mut out: Vec<Option<Result<StepOut>>> = batch.iter().map(|_| None).collect();
        let ok = |it: &BatchItem<'_, GpuSequence>| self.check_tokens(it.seq, it.tokens).is_ok();
        let rows: Vec<usize> = (0..batch.len())
            .filter(|&r| batch[r].tokens.len() == 1 && ok(&batch[r]))
            .collect();
        let mut chunks: Vec<usize> = (0..batch.len())
            .filter(|&r| batch[r].tokens.len() > 1 && ok(&batch[r]))
            .collect();
        // A pass holds at most PREFILL_CHUNK rows; the rest run alone.
        let mut total = rows.len();
        chunks.retain(|&r| {
            total += batch[r].tokens.len();
            total <= super::PREFILL_CHUNK
        });
        let on = self.opts.batch_decode && self.opts.fused_decode;
        if !on || rows.is_empty() || rows.len() + chunks.len() < 2 {
            chunks.clear();
        }
        if on && (rows.len() >= 2 || !chunks.is_empty()) {
            let all: Vec<usize> = rows.iter().chain(&chunks).copied().collect();
            match self.decode_batch(batch, &rows, &chunks) {
                Ok(outs) => {
                    for (&r, o) in all.iter().zip(outs) {
                        out[r] = Some(o);
                    }
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    for &r in &all {
                        out[r] = Some(Err(anyhow::anyhow!("batched step: {msg}")));
                    }
                }
            }
        }
        batch
            .iter_mut()
            .zip(out)
            .map(|(it, o)| o.unwrap_or_else(|| self.step_alone(it)))
            .collect()
    }

    /// One token of each sequence in `rows` and the prompt chunk of each in
    /// `chunks` (all checked) in one pass; the readouts of `rows`, then of
    /// `chunks`. An error fails every row (their sequences may be part-way
    /// through it).
    fn decode_batch(
        &self,
        batch: &mut [BatchItem<'_, GpuSequence>],
        rows: &[usize],
        chunks: &[usize],
    ) -> Result<Vec<Result<StepOut>>> {
        let mut guard = self.scratch.lock().unwrap();
        let sc = &mut *guard;
        self.dev.bind()?;
        sc.last_logits = None;
        sc.batch_logits.clear();
        let (d, c) = (&self.dev, &self.cfg);
        let (b, nl) = (rows.len(), self.layers.len());
        // States first: a KV cache moved into a larger slab moves a row's addresses.
        for &r in rows.iter().chain(chunks) {
            let s = &mut *batch[r].seq;
            self.init_sequence(s)?;
            self.reserve(s, s.pos + batch[r].tokens.len())?;
            if s.layers.len() != nl {
                bail!("a sequence's state does not match the model's layers");
            }
        }
        let mut tab = vec![0u64; nl * b * 2];
        let mut pos = Vec::with_capacity(b);
        let mut toks = Vec::with_capacity(b);
        let mut longest = 0;
        for (j, &r) in rows.iter().enumerate() {
            let s = &*batch[r].seq;
            pos.push(s.pos as i32);
            toks.push(batch[r].tokens[0]);
            longest = longest.max(s.pos + 1);
            for (li, l) in s.layers.iter().enumerate() {
                let (a, z) = match *l {
                    SeqLayer::Gdn { conv, s } => (conv.ptr(), s.ptr()),
                    SeqLayer::Attn { k, v } => (k.ptr(), v.ptr()),
                };
                tab[(li * b + j) * 2] = a;
                tab[(li * b + j) * 2 + 1] = z;
            }
        }
        // The chunks' rows after the decode rows; the head reads every
        // decode row and the last row of each chunk that wants a readout.
        let mut parts = Vec::with_capacity(chunks.len());
        let mut head_rows: Vec<i32> = (0..b as i32).collect();
        for &r in chunks {
            let (s, tokens) = (&*batch[r].seq, batch[r].tokens);
            parts.push(Chunk {
                off: toks.len(),
                t: tokens.len(),
                pos0: s.pos,
                layers: s.layers.clone(),
                captures: self.captures(s.pos, tokens.len(), &batch[r].snapshots.at),
            });
            toks.extend_from_slice(tokens);
            if !matches!(batch[r].want, Want::Nothing) {
                head_rows.push(toks.len() as i32 - 1);
            }
        }
        let tab_d = sc.get(d, "bat_tab", tab.len() * 8)?;
        d.htod(tab_d, &tab)?;
        let pos_d = sc.get(d, "bat_pos", b * 4)?;
        d.htod(pos_d, &pos)?;
        let tok = sc.get(d, "bat_tokens", toks.len() * 4)?;
        d.htod(tok, &toks)?;
        let heads_d = if parts.is_empty() {
            0
        } else {
            let h = sc.get(d, "bat_head_rows", head_rows.len() * 4)?;
            d.htod(h, &head_rows)?;
            h
        };
        let nkv = c.num_key_value_heads.max(1);
        let nsplit = ATTN_BLOCKS
            .div_ceil(nkv * b.max(1))
            .min(longest.div_ceil(MIN_SPLIT_KEYS))
            .clamp(1, super::decode::MAX_SPLIT);
        // The longest row's keys per split decide the attention kernel.
        let attn = self.batch_attn_kernel(longest.div_ceil(nsplit));
        let shape = Shape {
            b,
            rows: toks.len(),
            tok,
            tab: tab_d,
            pos: pos_d,
            nsplit,
            attn,
            chunks: &parts,
            heads: head_rows.len(),
            head_rows: heads_d,
        };
        let key = (b, nsplit, attn.kernel.name(), attn.stages);
        let at = sc.batch_graphs.graphs.iter().position(|g| g.0 == key);
        let planned = match at {
            // Steps with prompt chunks vary in shape: eager.
            _ if !parts.is_empty() => self.batch_kernels(sc, shape)?,
            Some(i) if sc.batch_graphs.graphs[i].1 == sc.generation => {
                let hit = sc.batch_graphs.graphs.remove(i);
                d.launch_graph(&hit.2)?;
                let planned = hit.3;
                sc.batch_graphs.graphs.push(hit);
                planned
            }
            _ => {
                if let Some(i) = at {
                    sc.batch_graphs.graphs.remove(i);
                }
                let planned = self.batch_kernels(sc, shape)?;
                self.capture_batch(sc, key, planned, shape);
                planned
            }
        };
        // Constrained rows' masks, computed while the step runs.
        let masks: Vec<Option<Result<TokenMask>>> = rows
            .iter()
            .chain(chunks)
            .map(|&r| match (&mut batch[r].mask, &batch[r].want) {
                (Some(source), w) if !matches!(w, Want::Nothing) => Some(source()),
                _ => None,
            })
            .collect();
        let bad_words = sc.get(d, "bat_bad", nl * 4)?;
        if planned > 0 {
            let mut bad = vec![0i32; planned];
            d.dtoh(&mut bad, bad_words)?;
            if let Some(&w) = bad.iter().find(|&&w| w != 0) {
                return Err(super::moe_grouped::router_out_of_range(w, mlp_dims(c).0));
            }
        }
        for &r in rows.iter().chain(chunks) {
            batch[r].seq.pos += batch[r].tokens.len();
        }
        for (part, &r) in parts.iter_mut().zip(chunks) {
            let caps = std::mem::take(&mut part.captures);
            if let (false, Some(kv)) = (caps.is_empty(), &batch[r].seq.kv) {
                batch[r].snapshots.taken = self.captured(part.pos0, kv.space(), caps);
            }
        }
        self.batch_readout(sc, batch, rows, chunks, head_rows.len(), masks)
    }

    /// Records the batched step's launches as a graph for `key` (the eager
    /// step just ran, so every buffer is there); a failed capture turns
    /// graphs off for the batched steps.
    fn capture_batch(&self, sc: &mut Scratch, key: GraphKey, planned: usize, shape: Shape) {
        let d = &self.dev;
        #[cfg(all(feature = "hip", not(feature = "cuda")))]
        {
            sc.batch_graphs.off |= !d.graphs_supported();
        }
        // A MoE layer whose routing plan came back to the host (shapes the
        // grouped kernels do not take) copies during the step: no graph.
        let moe = self
            .layers
            .iter()
            .filter(|l| matches!(l.mlp, super::LayerMlp::Moe(_)));
        if sc.batch_graphs.off
            || !self.opts.graphs
            || d.debug
            || d.profiling()
            || planned < moe.count()
        {
            return;
        }
        let generation = sc.generation;
        let captured = d.begin_capture().and_then(|()| {
            let recorded = self.batch_kernels(sc, shape);
            let graph = d.end_capture();
            recorded.and(graph)
        });
        match captured {
            // Nothing was allocated during the capture.
            Ok(g) if sc.generation == generation => {
                let graphs = &mut sc.batch_graphs.graphs;
                if graphs.len() >= BATCH_GRAPHS {
                    graphs.remove(0);
                }
                graphs.push((key, generation, g, planned));
            }
            Ok(_) => {}
            Err(e) => {
                eprintln!("[gpu] batched decode graphs disabled: {e:#}");
                sc.batch_graphs.off = true;
            }
        }
    }

    /// Launches a batched step (`shape`): the layers over all its rows, the
    /// final norm and the lm_head over the head's rows into `bat_logits`,
    /// and each head row's greedy statistics into `bat_stats`. Returns how
    /// many MoE layers wrote an out-of-range count into `bat_bad`.
    fn batch_kernels(&self, sc: &mut Scratch, shape: Shape) -> Result<usize> {
        let (d, c) = (&self.dev, &self.cfg);
        let (h, nl) = (c.hidden_size, self.layers.len());
        let (rows, heads) = (shape.rows, shape.heads);
        let x = sc.get(d, "x", rows * h * F)?;
        let n = sc.get(d, "n", rows * h * F)?;
        let mixed = sc.get(d, "mixed", rows * h * F)?;
        self.head.prefill(self, shape.tok, x, rows)?;
        let bad_words = sc.get(d, "bat_bad", nl * 4)?;
        let mut bt = Batch {
            pf: Prefill {
                sc: &mut *sc,
                states: &[],
                captures: &[],
                t: rows,
                pos0: 0,
                fast: self.opts.fast_prefill,
                x,
                n,
                mixed,
                bad_words,
                planned: 0,
                experts: 0,
            },
            b: shape.b,
            tab: shape.tab,
            pos: shape.pos,
            nsplit: shape.nsplit,
            attn: shape.attn,
            chunks: shape.chunks,
        };
        // Decode rows alone take the stacked split GEMMs (`GemmStack::Decode`).
        bt.pf.sc.decode_rows = shape.chunks.is_empty();
        let walked = self.walk(&mut Pass::Batch(&mut bt));
        bt.pf.sc.decode_rows = false;
        walked?;
        let planned = bt.pf.planned;
        // The head's rows: the first `heads`, or those listed.
        let hx = if shape.head_rows == 0 {
            x
        } else {
            let g = sc.get(d, "bat_head_x", heads * h * F)?;
            kernels::gather_rows(
                d,
                Launch::pdl(((h as u32).div_ceil(256), heads as u32, 1), (256, 1, 1), 0),
                dptr(x),
                i(h),
                dptr(shape.head_rows),
                i(heads),
                i(h),
                dptr(g),
            )?;
            g
        };
        let nf = sc.get(d, "bat_final", heads * h * F)?;
        self.rmsnorm(hx, h, &self.head.norm, nf, h, heads, h)?;
        let logits = sc.get(d, "bat_logits", heads * c.vocab_size * F)?;
        self.linear(sc, nf, heads, self.lm_head(), logits, false)?;
        // Every head row's greedy statistics (rows that want them read them).
        let part = sc.get(d, "bat_part", heads * ARGMAX_BLOCKS * 3 * F)?;
        let stats = sc.get(d, "bat_stats", heads * 4 * F)?;
        kernels::argmax_partial(
            d,
            Launch::new((ARGMAX_BLOCKS as u32, heads as u32, 1), (256, 1, 1), 0),
            dptr(logits),
            i(c.vocab_size),
            dptr(0),
            dptr(part),
        )?;
        kernels::argmax_final(
            d,
            Launch::new((heads as u32, 1, 1), (256, 1, 1), 0),
            dptr(part),
            i(ARGMAX_BLOCKS),
            dptr(stats),
            dptr(0),
        )?;
        Ok(planned)
    }

    /// Batched decode attention's kernel for splits of `split_keys` keys:
    /// the batch-1 step's tensor-core kernels where its plan takes them
    /// (`bat_attn_*_tc*`, the same arithmetic per row), else direct reads or
    /// a shared-memory ring of as many tiles as fit (`bat_attn_*`; the
    /// key-parallel kernels have no batched form).
    fn batch_attn_kernel(&self, split_keys: usize) -> BatchAttn {
        use kernels::typed;
        let c = &self.cfg;
        let (hd, group) = (
            c.head_dim,
            c.num_attention_heads / c.num_key_value_heads.max(1),
        );
        let kv_bytes = if self.kv_f32 { F } else { super::B };
        let max_smem = self.dev.max_shared_per_block();
        let plan = super::attn_decode::dec_attn_plan(
            self.opts.dec_attn,
            group,
            hd,
            split_keys,
            kv_bytes,
            max_smem,
            self.opts.tc_attention,
        );
        let tc = match plan.kernel.name() {
            "dec_attn_f32_tc" => Some(typed::bat_attn_f32_tc),
            "dec_attn_bf16_tc" => Some(typed::bat_attn_bf16_tc),
            "dec_attn_f32_tc_ring" => Some(typed::bat_attn_f32_tc_ring),
            "dec_attn_bf16_tc_ring" => Some(typed::bat_attn_bf16_tc_ring),
            _ => None,
        };
        if let Some(kernel) = tc {
            return BatchAttn {
                kernel,
                threads: plan.threads,
                stages: plan.stages,
                smem: plan.smem,
            };
        }
        let tile = 2 * DA_TILE * hd * kv_bytes;
        let stages = if split_keys >= RING_MIN_KEYS {
            (max_smem / tile).min(DA_STAGES)
        } else {
            0
        };
        let k = match (self.kv_f32, stages > 0) {
            (true, false) => typed::bat_attn_f32,
            (true, true) => typed::bat_attn_f32_ring,
            (false, false) => typed::bat_attn_bf16,
            (false, true) => typed::bat_attn_bf16_ring,
        };
        BatchAttn {
            kernel: k,
            threads: 32 * group,
            stages,
            smem: stages * tile,
        }
    }
}
