//! The batch-1 decode step: fused kernels (`kernels/decode.cu`) over buffers
//! of fixed addresses, with the token id and position read from device memory,
//! so after one eager step the whole step is captured once as a CUDA graph and
//! replayed: one launch per token instead of ~300.
//!
//! Per layer: GDN = norm+in_proj GEMV with the conv of its rows at the end
//! (or a separate conv kernel), L2 norms+gates+recurrence+gated norm (one
//! block per head), out_proj GEMV+residual (3 or 4 kernels); attention =
//! norm+proj GEMV, q/k norm+RoPE+KV append, split-K attention, combine+gate,
//! o_proj GEMV+residual (5); MoE = norm+router/shared GEMV, routed gate/up
//! (router top-k recomputed per block), routed+shared down+residual (3). Then
//! norm+lm_head GEMV and a two-stage argmax/log-sum-exp. Every kernel that
//! updates the hidden state also writes per-block sums of squares, so the next
//! RMSNorm is a scale inside the following GEMV rather than a kernel.

#[cfg(feature = "cuda")]
use super::super::cuda::{DBuf, Device, Graph};
#[cfg(all(feature = "hip", not(feature = "cuda")))]
use super::super::hip::{DBuf, Device, Graph};
use super::{B, DMixer, DMlp, F, GpuModel, GpuSequence, SeqLayer, mlp_dims};
use crate::gpu::{Arg, f, i};
use anyhow::{Result, bail};

/// Blocks of `argmax_partial`.
const ARGMAX_BLOCKS: usize = 512;
/// Most key-length splits of decode attention.
const MAX_SPLIT: usize = 128;
/// Columns one decode GEMV warp loads at once (`CH * WARP * 8` in kernels/decode.cu).
const GEMV_CHUNK: usize = 2048;
/// 16-byte loads per lane of `dec_moe_down_rows` (`DOWN_SPAN`).
const DOWN_SPAN: usize = 9;
/// Keys per shared-memory tile and most tiles in the ring of `dec_attn_*`
/// (`DA_TILE`, `DA_STAGES` in kernels/decode.cu).
const DA_TILE: usize = 16;
const DA_STAGES: usize = 3;
/// Keys per split from which decode attention copies K/V through shared
/// memory once per block instead of once per query head (H200, 131K: 3.23
/// instead of 5.15 ms per step); direct reads stay faster for short splits
/// (512 context: 286 vs 277 tok/s with the ring forced).
const RING_MIN_KEYS: usize = 256;
/// Keys per split (f32 KV) from which `Auto` takes the key-parallel kernel
/// with one query head per warp (`keys1`): on the H200 at 131K context
/// (1,024+ keys per split) 157.9 against 151.2 tok/s through the ring, at
/// 32K (256-512) 230.8 against 235.4 (7ec1de9,
/// `benchmarks/dec-attn-keys-h200-7ec1de9.json`).
const KEYS1_MIN_KEYS: usize = 1024;
/// Most warps per block, query heads per KV head and k16 steps per warp of
/// `dec_attn_*_tc` (`DT_WARPS`, `DT_HEADS`, `DT_MAXKK` in
/// kernels/decode_attn_tc.cu): each warp takes a slice of 16 to 64 dims.
const DT_WARPS: usize = 4;
const DT_HEADS: usize = 8;
const DT_MAXKK: usize = 4;
const DT_KEYS: usize = 16;
/// Ring slots per warp of the default decode attention (`dec_attn_*_tc_ring`).
/// H200, 8K / 32K / 131K decode (tok/s): registers 326.3 / 287.4 / 201.2,
/// 2 slots 331.1 / 305.9 / 232.8, 3: 328.4 / 303.0 / 233.8, 4: 322.2 /
/// 286.1 / 198.4 (`benchmarks/dec-attn-tc-feeds-h200-13987e6.json`); the logits
/// are bit-identical.
const TC_RING: usize = 2;
/// Keys per tile and most query heads per warp of `dec_attn_*_keys`
/// (`DK_TILE`, `DK_MAXH` in kernels/decode_attn_keys.cu); head_dim at most 256.
const DK_TILE: usize = 32;
const DK_MAXH: usize = 2;

/// Most ring slots of `dec_gemv_bulk*` (`BULK_MAX_STAGES` in kernels/gemv_bulk.cu).
const BULK_MAX_STAGES: usize = 8;

/// The bulk-copy decode GEMVs' launch shape: ring slots of 32 KB per block
/// (`QWASI_BULK_STAGES`, default 4) and blocks per SM (`QWASI_BULK_BLOCKS`,
/// default 1). On the H200 (8K decode, tok/s): 2 slots 269.8, 3: 282.3,
/// 4: 294.9, 5: 293.0, 6: 285.4, 7: 276.8; 2 blocks of 3 slots 291.9.
#[derive(Clone, Copy, Debug)]
pub(super) struct BulkGemv {
    stages: usize,
    blocks_per_sm: usize,
}

/// One `dec_gemv_bulk*` launch.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct BulkPlan {
    pub kernel: &'static str,
    pub grid: usize,
    pub smem: usize,
    pub stages: usize,
}

impl BulkGemv {
    pub(super) fn from_env(dev: &Device) -> Option<Self> {
        if !dev.bulk_copies()
            || matches!(
                std::env::var("QWASI_GEMV").as_deref(),
                Ok("rows" | "stream")
            )
        {
            return None;
        }
        let num = |k: &str, d: usize| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        Some(BulkGemv {
            stages: num("QWASI_BULK_STAGES", 4).clamp(1, BULK_MAX_STAGES),
            blocks_per_sm: num("QWASI_BULK_BLOCKS", 1).max(1),
        })
    }

    /// The launch for a `rows` x `cols` matrix at address `w`, or `None`
    /// where the kernels do not apply (columns not a multiple of 8 or over
    /// 4,096, weights not 16-byte aligned, not one slot of shared memory).
    /// A residual GEMV writes a partial sum of squares per block into
    /// `out_blocks` entries, so it has at most that many blocks.
    pub(super) fn plan(
        &self,
        w: u64,
        rows: usize,
        cols: usize,
        max_smem: usize,
        sms: u32,
        out_blocks: Option<usize>,
    ) -> Option<BulkPlan> {
        if !cols.is_multiple_of(8) || cols > 2 * GEMV_CHUNK || !w.is_multiple_of(16) || rows == 0 {
            return None;
        }
        let (kernel, slot_rows) = if cols <= GEMV_CHUNK {
            ("dec_gemv_bulk1", 8)
        } else {
            ("dec_gemv_bulk2", 4)
        };
        let slot = slot_rows * cols * B;
        let stages = self.stages.min(max_smem / slot);
        if stages == 0 {
            return None;
        }
        let grid = rows
            .div_ceil(slot_rows)
            .min(sms as usize * self.blocks_per_sm)
            .min(out_blocks.unwrap_or(usize::MAX));
        Some(BulkPlan {
            kernel,
            grid,
            smem: stages * slot,
            stages,
        })
    }

    /// The launch of `dec_gemv_bulk_conv` (the GDN in projection with the
    /// conv of its first rows, `k` taps): the plain plan's ring (8 rows per
    /// slot only, at most 2,048 columns) plus, after it, the most rows a
    /// block takes with their `k` weights, `k - 1` history and projected
    /// value; `None` where that does not fit.
    pub(super) fn plan_conv(
        &self,
        w: u64,
        rows: usize,
        cols: usize,
        max_smem: usize,
        sms: u32,
        k: usize,
    ) -> Option<BulkPlan> {
        let plan = self.plan(w, rows, cols, max_smem, sms, None)?;
        if plan.kernel != "dec_gemv_bulk1" || k == 0 {
            return None;
        }
        // Block b takes slots [S b / G, S (b + 1) / G): at most ceil(S / G).
        let block_rows = 8 * rows.div_ceil(8).div_ceil(plan.grid);
        let smem = plan.smem + block_rows * 2 * k * F;
        (smem <= max_smem).then_some(BulkPlan {
            kernel: "dec_gemv_bulk_conv",
            smem,
            ..plan
        })
    }
}

/// Decode attention's kernel family (`QWASI_DEC_ATTN`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DecAttnPath {
    /// `dec_attn_*_tc_ring` with `TC_RING` slots where it applies (CUDA;
    /// on the H200 the register-fed `dec_attn_*_tc` gave 345.7 / 327.2 /
    /// 286.7 / 201.5 tok/s at 512 / 8K / 32K / 131K context against 342.8 /
    /// 307.5 / 264.4 / 172.5 for the kernels below, and the ring more
    /// at long context, see `TC_RING`). Otherwise
    /// `dec_attn_f32_keys1` when a split of f32 keys may span
    /// `KEYS1_MIN_KEYS` keys, else `dec_attn_*_ring` when it may span
    /// `RING_MIN_KEYS`, else `dec_attn_*` (direct reads).
    Auto,
    Direct,
    Ring,
    /// `dec_attn_*_keys`: lanes own keys in the QK pass, each warp serves
    /// `heads_per_warp` query heads (`keys`: 2, `keys1`: 1).
    Keys {
        heads_per_warp: usize,
    },
    /// `dec_attn_*_tc`: the query heads of a KV head as one side of a
    /// tensor-core product with 16-key tiles (CUDA only); with `ring` slots
    /// (2..=4) `dec_attn_*_tc_ring`, the tiles copied through a
    /// shared-memory ring per warp instead of read into registers.
    Tensor {
        ring: usize,
    },
}

impl DecAttnPath {
    pub(super) fn from_env() -> Self {
        match std::env::var("QWASI_DEC_ATTN").as_deref() {
            Ok("ring") => DecAttnPath::Ring,
            Ok("direct") => DecAttnPath::Direct,
            Ok("keys") => DecAttnPath::Keys { heads_per_warp: 2 },
            Ok("keys1") => DecAttnPath::Keys { heads_per_warp: 1 },
            Ok("tc") => DecAttnPath::Tensor { ring: 0 },
            Ok(v) if v.starts_with("tc-ring") => DecAttnPath::Tensor {
                ring: v["tc-ring".len()..].parse().unwrap_or(TC_RING).clamp(2, 4),
            },
            _ => DecAttnPath::Auto,
        }
    }
}

/// One decode-attention launch: kernel, threads per block, dynamic shared
/// memory and ring stages.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct DecAttnPlan {
    pub kernel: &'static str,
    pub threads: usize,
    pub smem: usize,
    pub stages: usize,
}

/// The launch of `path` for `group` query heads per KV head of `hd` dims,
/// a split of up to `split_keys` keys, `kv_bytes` per KV value and
/// `max_smem` bytes of shared memory per block. `Auto` takes `keys1` for
/// splits of `KEYS1_MIN_KEYS` f32 keys and more. `Keys` falls back to `Auto`
/// where the kernel does not apply (head_dim not a multiple of 32 16-byte
/// lanes or over 256, heads not divisible per warp, too little shared memory),
/// and so does `Tensor` (no `tensor_cores`, more than 8 heads per KV head,
/// head_dim not split into 1, 2 or 4 slices of 16 to 64 dims in multiples
/// of 16). `Auto` takes `Tensor` where it applies.
pub(super) fn dec_attn_plan(
    path: DecAttnPath,
    group: usize,
    hd: usize,
    split_keys: usize,
    kv_bytes: usize,
    max_smem: usize,
    tensor_cores: bool,
) -> DecAttnPlan {
    let f32_kv = kv_bytes == F;
    let tensor = match path {
        DecAttnPath::Auto => Some(TC_RING),
        DecAttnPath::Tensor { ring } => Some(ring),
        _ => None,
    };
    // The most warps whose head-dim slices are whole k16 steps, at most DT_MAXKK.
    let warps = [DT_WARPS, 2, 1]
        .into_iter()
        .find(|&w| hd.is_multiple_of(16 * w) && hd / w <= 16 * DT_MAXKK);
    if let Some(ring) = tensor
        && tensor_cores
        && group <= DT_HEADS
        && let Some(warps) = warps
    {
        // Ring slot per warp: K [16][dw + 8] and V [16][dw + 16 / kv_bytes].
        let dw = hd / warps;
        let slot = DT_KEYS * (2 * dw + 8 + 16 / kv_bytes) * kv_bytes;
        let fit = ring.min(max_smem / (warps * slot));
        let ring = (fit >= 2).then_some(fit);
        return DecAttnPlan {
            kernel: match (f32_kv, ring.is_some()) {
                (true, false) => "dec_attn_f32_tc",
                (false, false) => "dec_attn_bf16_tc",
                (true, true) => "dec_attn_f32_tc_ring",
                (false, true) => "dec_attn_bf16_tc_ring",
            },
            threads: 32 * warps,
            smem: ring.map_or(0, |r| warps * r * slot),
            stages: ring.unwrap_or(0),
        };
    }
    let path = if tensor.is_some() {
        DecAttnPath::Auto
    } else {
        path
    };
    let path = match path {
        DecAttnPath::Auto if f32_kv && split_keys >= KEYS1_MIN_KEYS => {
            DecAttnPath::Keys { heads_per_warp: 1 }
        }
        p => p,
    };
    if let DecAttnPath::Keys { heads_per_warp } = path {
        let vn = 16 / kv_bytes;
        let fixed = (group * hd + group * DK_TILE) * F;
        let tile = DK_TILE * (2 * hd + vn) * kv_bytes;
        let stages = max_smem.saturating_sub(fixed) / tile;
        if hd.is_multiple_of(32 * vn)
            && hd <= 256
            && heads_per_warp <= DK_MAXH
            && (f32_kv || heads_per_warp == 2)
            && group.is_multiple_of(heads_per_warp)
            && group * 32 / heads_per_warp <= 512
            && stages >= 1
        {
            let stages = stages.min(DA_STAGES);
            return DecAttnPlan {
                kernel: match (f32_kv, heads_per_warp) {
                    (true, 1) => "dec_attn_f32_keys1",
                    (true, _) => "dec_attn_f32_keys",
                    (false, _) => "dec_attn_bf16_keys", // two heads per warp only
                },
                threads: group * 32 / heads_per_warp,
                smem: fixed + stages * tile,
                stages,
            };
        }
    }
    let tile = 2 * DA_TILE * hd * kv_bytes;
    let ring = match path {
        DecAttnPath::Ring => true,
        DecAttnPath::Direct => false,
        _ => split_keys >= RING_MIN_KEYS,
    };
    let stages = if ring {
        (max_smem / tile).clamp(1, DA_STAGES)
    } else {
        0
    };
    DecAttnPlan {
        kernel: match (f32_kv, ring) {
            (true, false) => "dec_attn_f32",
            (true, true) => "dec_attn_f32_ring",
            (false, false) => "dec_attn_bf16",
            (false, true) => "dec_attn_bf16_ring",
        },
        threads: 32 * group,
        smem: stages * tile,
        stages,
    }
}

/// Device buffers of the decode step (fixed addresses, so graphs stay valid)
/// and the captured graph of the last sequence shape.
pub(super) struct DecodeState {
    /// `[token u32, position i32]`, written by the host before each step.
    step: DBuf,
    x: DBuf,
    /// Per-block sums of squares of `x` written by the kernel that last
    /// updated it (`nssq` of them): the next RMSNorm's input.
    ssq: DBuf,
    nssq: usize,
    proj: DBuf,
    q: DBuf,
    att_po: DBuf,
    att_pml: DBuf,
    att_o: DBuf,
    gdn_o: DBuf,
    act: DBuf,
    logits: DBuf,
    part: DBuf,
    /// `[token (int bits), max, log-sum-exp]` of the last step's logits.
    stats: DBuf,
    graph: Option<((u64, usize), Graph)>,
    graphs_ok: bool,
    /// `QWASI_DEC_SKIP=stage,...`, measurement only: the step leaves these
    /// stages out (wrong tokens), so a benchmark shows what each costs inside
    /// the graph: in_proj (with the conv where it is folded in), gdn_prep
    /// (the conv kernel otherwise), gdn_step, out_proj, attn_proj,
    /// attn_prep, attn, attn_combine, o_proj, moe_input, moe_gate_up,
    /// moe_down, lm_head.
    skip: Vec<String>,
    /// Gate/up row pairs per warp of `dec_moe_gate_up` (`QWASI_MOE_PAIRS`,
    /// default 2: on the H200 512/8K decode 333.0/302.5 tok/s against
    /// 320.5/289.4 with 1 and 320.0/289.9 with 4).
    moe_pairs: usize,
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
                DMixer::Gdn { in_proj, .. } => in_proj.rows,
                DMixer::Attn { proj, .. } => proj.rows,
            })
            .chain(self.layers.iter().map(|l| match &l.mlp {
                DMlp::Moe { input, .. } => input.rows,
                DMlp::Dense { gate_up, .. } => gate_up.rows,
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
            graph: None,
            graphs_ok: std::env::var("QWASI_GRAPHS").as_deref() != Ok("0")
                && !d.debug
                && !d.profiling(),
            moe_pairs: std::env::var("QWASI_MOE_PAIRS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(2usize)
                .max(1),
            skip: std::env::var("QWASI_DEC_SKIP")
                .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
                .unwrap_or_default(),
        })
    }

    /// Key-length splits of decode attention for a KV capacity (fixed per
    /// graph; the kernel divides the current length among them). On the H200
    /// 128 splits beat 96 at 8K and 288-512 at 32K-131K.
    fn decode_splits(cap: usize) -> usize {
        (cap / 64).clamp(1, MAX_SPLIT)
    }

    /// Grid of a row-per-warp GEMV: one row per warp, capped at the blocks
    /// that are resident at once (warps then stream several rows each, the
    /// next row's weights in flight while the current one is reduced).
    fn gemv_grid(&self, kernel: &str, rows: usize, smem: usize) -> u32 {
        let resident = self.dev.occupancy(kernel, 256, smem as u32) * self.dev.sm_count;
        (rows.div_ceil(8) as u32).min(resident).max(1)
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
        match &ds.graph {
            Some((k, g)) if *k == key => self.dev.launch_graph(g)?,
            _ => {
                ds.graph = None;
                self.decode_kernels(seq, ds)?;
                if ds.graphs_ok {
                    // Record the same launches (nothing runs during capture).
                    self.dev.begin_capture()?;
                    let recorded = self.decode_kernels(seq, ds);
                    let graph = self.dev.end_capture();
                    match (recorded, graph) {
                        (Ok(()), Ok(g)) => ds.graph = Some((key, g)),
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

    /// Launches one decode step's kernels (eagerly or into a capture).
    fn decode_kernels(&self, seq: &GpuSequence, ds: &DecodeState) -> Result<()> {
        let c = &self.cfg;
        let d = &self.dev;
        let h = c.hidden_size;
        let eps = c.rms_norm_eps;
        let x = ds.x.ptr();
        let tok = ds.step.ptr();
        let pos = ds.step.ptr() + 4;
        let ssq = ds.ssq.ptr();
        let nssq = ds.nssq;
        // `QWASI_DEC_SKIP` (measurement only, see DecodeState::skip).
        let on = |stage: &str| !ds.skip.iter().any(|s| s == stage);
        d.launch(
            "dec_embed",
            (1, 1, 1),
            (256, 1, 1),
            0,
            &[
                Arg::Ptr(self.embed.buf.ptr()),
                Arg::Ptr(tok),
                Arg::Ptr(x),
                i(h),
                Arg::Ptr(ssq),
                i(nssq),
            ],
        )?;
        let (nk, nv, dk, dv) = (
            c.linear_num_key_heads,
            c.linear_num_value_heads,
            c.linear_key_head_dim,
            c.linear_value_head_dim,
        );
        let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let conv_dim = c.linear_conv_dim();
        let vdim = c.linear_value_dim();
        let proj = ds.proj.ptr();
        let norm_gemv = |w: u64, rows: usize, norm: u64, y: u64| {
            if self.bulk_gemv(w, x, y, rows, h, Some(norm), ssq, nssq, None)? {
                return Ok(());
            }
            d.launch_pdl(
                "dec_norm_gemv",
                (self.gemv_grid("dec_norm_gemv", rows, 0), 1, 1),
                (256, 1, 1),
                0,
                &[
                    Arg::Ptr(w),
                    Arg::Ptr(x),
                    Arg::Ptr(ssq),
                    i(nssq),
                    Arg::Ptr(norm),
                    f(eps),
                    Arg::Ptr(y),
                    i(rows),
                    i(h),
                ],
            )
        };
        for (layer, st) in self.layers.iter().zip(&seq.layers) {
            match (&layer.mixer, st) {
                (
                    DMixer::Gdn {
                        in_proj,
                        conv,
                        a_log,
                        dt_bias,
                        norm,
                        out_proj,
                    },
                    SeqLayer::Gdn { conv: cst, s },
                ) => {
                    let p = in_proj.rows;
                    let k = c.linear_conv_kernel;
                    // The conv in the in projection's epilogue where it can
                    // take it, else its own kernel.
                    let mut folded = false;
                    if on("in_proj") {
                        let norm = layer.input_norm.ptr();
                        folded = self.conv_gdn
                            && self.bulk_gemv(
                                in_proj.buf.ptr(),
                                x,
                                proj,
                                p,
                                h,
                                Some(norm),
                                ssq,
                                nssq,
                                Some((conv.ptr(), cst.ptr(), k, conv_dim)),
                            )?;
                        if !folded {
                            norm_gemv(in_proj.buf.ptr(), p, norm, proj)?;
                        }
                    }
                    if !folded && on("gdn_prep") {
                        d.launch_pdl(
                            "dec_gdn_conv",
                            (conv_dim.div_ceil(128) as u32, 1, 1),
                            (128, 1, 1),
                            0,
                            &[
                                Arg::Ptr(proj),
                                Arg::Ptr(cst.ptr()),
                                Arg::Ptr(conv.ptr()),
                                i(k),
                                i(conv_dim),
                            ],
                        )?;
                    }
                    if on("gdn_step") {
                        d.launch_pdl(
                            "dec_gdn_step",
                            (nv as u32, 1, 1),
                            ((32 * dv.div_ceil(32)) as u32, 4, 1),
                            0,
                            &[
                                Arg::Ptr(proj),
                                i(nk),
                                i(nv),
                                i(dk),
                                i(dv),
                                Arg::Ptr(a_log.ptr()),
                                Arg::Ptr(dt_bias.ptr()),
                                i(conv_dim + vdim),
                                f(1.0 / (dk as f32).sqrt()),
                                Arg::Ptr(s.ptr()),
                                Arg::Ptr(proj + (conv_dim * F) as u64),
                                Arg::Ptr(norm.ptr()),
                                f(eps),
                                Arg::Ptr(ds.gdn_o.ptr()),
                            ],
                        )?;
                    }
                    if on("out_proj") {
                        self.dec_gemv(out_proj.buf.ptr(), ds.gdn_o.ptr(), x, h, vdim, ssq, nssq)?;
                    }
                }
                (
                    DMixer::Attn {
                        proj: pw,
                        q_norm,
                        k_norm,
                        o_proj,
                    },
                    SeqLayer::Attn { k, v },
                ) => {
                    let p = pw.rows;
                    if on("attn_proj") {
                        norm_gemv(pw.buf.ptr(), p, layer.input_norm.ptr(), proj)?;
                    }
                    if on("attn_prep") {
                        d.launch_pdl(
                            if self.kv_f32 {
                                "attn_prep_f32"
                            } else {
                                "attn_prep_bf16"
                            },
                            (1, (nh + nkv) as u32, 1),
                            (256, 1, 1),
                            0,
                            &[
                                Arg::Ptr(proj),
                                i(p),
                                Arg::Ptr(q_norm.ptr()),
                                Arg::Ptr(k_norm.ptr()),
                                Arg::Ptr(ds.q.ptr()),
                                Arg::Ptr(k.ptr()),
                                Arg::Ptr(v.ptr()),
                                i(nh),
                                i(nkv),
                                i(hd),
                                i(c.rotary_dim),
                                i(0),
                                Arg::Ptr(pos),
                                f(c.rope_theta as f32),
                                f(eps),
                            ],
                        )?;
                    }
                    let nsplit = Self::decode_splits(seq.cap());
                    let plan = dec_attn_plan(
                        self.dec_attn,
                        nh / nkv,
                        hd,
                        seq.cap().div_ceil(nsplit),
                        if self.kv_f32 { F } else { B },
                        d.max_shared_per_block(),
                        self.tc_attention,
                    );
                    if on("attn") {
                        d.launch_pdl(
                            plan.kernel,
                            (nkv as u32, nsplit as u32, 1),
                            (plan.threads as u32, 1, 1),
                            plan.smem as u32,
                            &[
                                Arg::Ptr(ds.q.ptr()),
                                Arg::Ptr(k.ptr()),
                                Arg::Ptr(v.ptr()),
                                Arg::Ptr(ds.att_po.ptr()),
                                Arg::Ptr(ds.att_pml.ptr()),
                                i(nh),
                                i(nkv),
                                i(hd),
                                Arg::Ptr(pos),
                                i(nsplit),
                                f(1.0 / (hd as f32).sqrt()),
                                i(plan.stages),
                            ],
                        )?;
                    }
                    if on("attn_combine") {
                        d.launch_pdl(
                            "dec_attn_combine",
                            (nh as u32, hd.div_ceil(32) as u32, 1),
                            (256, 1, 1),
                            0,
                            &[
                                Arg::Ptr(ds.att_po.ptr()),
                                Arg::Ptr(ds.att_pml.ptr()),
                                Arg::Ptr(proj),
                                Arg::Ptr(ds.att_o.ptr()),
                                i(nh),
                                i(hd),
                                i(nsplit),
                            ],
                        )?;
                    }
                    if on("o_proj") {
                        self.dec_gemv(o_proj.buf.ptr(), ds.att_o.ptr(), x, h, nh * hd, ssq, nssq)?;
                    }
                }
                _ => bail!("layer state does not match the layer kind"),
            }
            match &layer.mlp {
                DMlp::Moe {
                    input,
                    gate_up,
                    down,
                    shared_down,
                } => {
                    let (e, k, inter, sh) = mlp_dims(c);
                    if on("moe_input") {
                        norm_gemv(input.buf.ptr(), input.rows, layer.post_norm.ptr(), proj)?;
                    }
                    if on("moe_gate_up") {
                        d.launch_pdl(
                            "dec_moe_gate_up",
                            (inter.div_ceil(8 * ds.moe_pairs) as u32, k as u32, 1),
                            (256, 1, 1),
                            (h * F) as u32,
                            &[
                                Arg::Ptr(gate_up.ptr()),
                                Arg::Ptr(x),
                                Arg::Ptr(ssq),
                                i(nssq),
                                Arg::Ptr(layer.post_norm.ptr()),
                                f(eps),
                                Arg::Ptr(proj),
                                i(e),
                                i(k),
                                Arg::Ptr(ds.act.ptr()),
                                i(inter),
                                i(h),
                                i(ds.moe_pairs),
                            ],
                        )?;
                    }
                    // The virtual row (k routed rows + the shared one) in
                    // 16-byte columns, split between `warps` warps of `span`
                    // each where two suffice (dec_moe_down_rows).
                    let cols16 = (k * inter + sh) / 8;
                    let warps = cols16.div_ceil(DOWN_SPAN * 32);
                    let span = cols16.div_ceil(warps).div_ceil(32) * 32;
                    let split = inter.is_multiple_of(8)
                        && sh.is_multiple_of(8)
                        && warps <= 2
                        && self.split_gemv;
                    let mut args = vec![
                        Arg::Ptr(down.ptr()),
                        Arg::Ptr(shared_down.buf.ptr()),
                        Arg::Ptr(ds.act.ptr()),
                        Arg::Ptr(proj),
                        i(e),
                        i(k),
                        i(inter),
                        i(sh),
                        Arg::Ptr(x),
                        i(h),
                        Arg::Ptr(ssq),
                    ];
                    if split {
                        args.push(i(span));
                    }
                    if on("moe_down") {
                        d.launch_pdl(
                            if split {
                                "dec_moe_down_rows"
                            } else {
                                "dec_moe_down"
                            },
                            (h.div_ceil(8) as u32, 1, 1),
                            (if split { 256 * warps as u32 } else { 256 }, 1, 1),
                            ((k * inter + sh) * F) as u32,
                            &args,
                        )?;
                    }
                }
                DMlp::Dense { gate_up, down } => {
                    let inter = down.cols;
                    norm_gemv(gate_up.buf.ptr(), gate_up.rows, layer.post_norm.ptr(), proj)?;
                    d.launch(
                        "silu_mul",
                        ((inter as u32).div_ceil(256), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Arg::Ptr(proj),
                            i(2 * inter),
                            i(0),
                            i(inter),
                            Arg::Ptr(ds.act.ptr()),
                            i(inter),
                            i(1),
                        ],
                    )?;
                    self.dec_gemv(down.buf.ptr(), ds.act.ptr(), x, h, inter, ssq, nssq)?;
                }
            }
        }
        let head = self.lm_head();
        if on("lm_head") {
            norm_gemv(head.buf.ptr(), head.rows, self.norm.ptr(), ds.logits.ptr())?;
        }
        d.launch_pdl(
            "argmax_partial",
            (ARGMAX_BLOCKS as u32, 1, 1),
            (256, 1, 1),
            0,
            &[
                Arg::Ptr(ds.logits.ptr()),
                i(c.vocab_size),
                Arg::Ptr(ds.part.ptr()),
            ],
        )?;
        d.launch_pdl(
            "argmax_final",
            (1, 1, 1),
            (256, 1, 1),
            0,
            &[
                Arg::Ptr(ds.part.ptr()),
                i(ARGMAX_BLOCKS),
                Arg::Ptr(ds.stats.ptr()),
                Arg::Ptr(0),
            ],
        )
    }

    /// The residual add `y += W x` for one token (x read through L1), 8 rows
    /// per block; each block also writes its rows' sum of squares to `ssq`.
    /// Rows of up to 4 chunks of 2,048 columns go to `dec_gemv_rows` (a warp
    /// per chunk, the whole matrix loaded before the grid wait), longer or
    /// unaligned ones to `dec_gemv` (a warp per row, streaming).
    #[allow(clippy::too_many_arguments)]
    fn dec_gemv(
        &self,
        w: u64,
        x: u64,
        y: u64,
        rows: usize,
        cols: usize,
        ssq: u64,
        nssq: usize,
    ) -> Result<()> {
        if self.bulk_gemv(w, x, y, rows, cols, None, ssq, nssq, None)? {
            return Ok(());
        }
        let chunks = cols.div_ceil(GEMV_CHUNK);
        let split = cols.is_multiple_of(8) && chunks <= 4 && self.split_gemv;
        self.dev.launch_pdl(
            if split { "dec_gemv_rows" } else { "dec_gemv" },
            (rows.div_ceil(8) as u32, 1, 1),
            (if split { 256 * chunks as u32 } else { 256 }, 1, 1),
            0,
            &[
                Arg::Ptr(w),
                Arg::Ptr(x),
                Arg::Ptr(y),
                i(rows),
                i(cols),
                i(1),
                Arg::Ptr(ssq),
            ],
        )
    }
}

impl GpuModel {
    /// `W . x` by `dec_gemv_bulk*` (weights through a bulk-copy ring) where
    /// the GPU has bulk copies and the matrix fits the kernel (16-byte aligned,
    /// columns a multiple of 8 and at most 4,096); `Ok(false)` otherwise.
    /// With `norm` (the RMSNorm weight): `y = W . rmsnorm(x)` from the `nssq`
    /// partial sums of squares at `ssq`. Without: `y += W . x`, and the new
    /// partial sums of `y` to `ssq` (`nssq` entries, zeros past the grid).
    /// With `conv` (the GDN in projection, norm mode: the conv's weights,
    /// history, taps and channels): `dec_gemv_bulk_conv`, the first
    /// `conv_dim` rows then convolved and SiLU'd as `dec_gdn_conv` does
    /// (`Ok(false)` also where its staging does not fit, see `plan_conv`).
    #[allow(clippy::too_many_arguments)]
    fn bulk_gemv(
        &self,
        w: u64,
        x: u64,
        y: u64,
        rows: usize,
        cols: usize,
        norm: Option<u64>,
        ssq: u64,
        nssq: usize,
        conv: Option<(u64, u64, usize, usize)>,
    ) -> Result<bool> {
        let Some(b) = self.bulk_gemv else {
            return Ok(false);
        };
        let d = &self.dev;
        let smem = d.max_shared_per_block();
        let plan = match conv {
            Some((_, _, k, _)) => {
                debug_assert!(norm.is_some(), "the conv fold is the norm mode's");
                b.plan_conv(w, rows, cols, smem, d.sm_count, k)
            }
            None => {
                let out_blocks = if norm.is_some() { None } else { Some(nssq) };
                b.plan(w, rows, cols, smem, d.sm_count, out_blocks)
            }
        };
        let Some(plan) = plan else {
            return Ok(false);
        };
        let (in_ssq, nw, accumulate, ssq_out) = match norm {
            Some(nw) => (ssq, nw, 0, 0),
            None => (0, 0, 1, ssq),
        };
        let mut args = vec![
            Arg::Ptr(w),
            Arg::Ptr(x),
            Arg::Ptr(in_ssq),
            i(nssq),
            Arg::Ptr(nw),
            f(self.cfg.rms_norm_eps),
            Arg::Ptr(y),
            i(rows),
            i(cols),
            i(accumulate),
            Arg::Ptr(ssq_out),
            i(plan.stages),
        ];
        if let Some((conv_w, hist, k, conv_dim)) = conv {
            args.extend([Arg::Ptr(conv_w), Arg::Ptr(hist), i(k), i(conv_dim)]);
        }
        d.launch_pdl(
            plan.kernel,
            (plan.grid as u32, 1, 1),
            (256, 1, 1),
            plan.smem as u32,
            &args,
        )?;
        Ok(true)
    }
}

const _: () = assert!(B == 2);

/// Bytes one decode step must move at a context of `ctx` tokens, by part.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct StepBytes {
    /// Weights read: every dense matrix and norm, the k routed experts of each
    /// MoE layer, the lm_head and one embedding row.
    pub weights: usize,
    /// KV cache read by the attention layers.
    pub kv: usize,
    /// GDN recurrent state read and written.
    pub state: usize,
}

impl StepBytes {
    pub fn total(&self) -> usize {
        self.weights + self.kv + self.state
    }
}

impl GpuModel {
    /// The least traffic of one decode step at context `ctx` (the bandwidth floor).
    pub fn step_bytes(&self, ctx: usize) -> StepBytes {
        let c = &self.cfg;
        let h = c.hidden_size;
        let (_, k, inter, _) = mlp_dims(c);
        let mut weights = h * B + self.lm_head().rows * h * B + h * F;
        let mut kv = 0;
        let mut state = 0;
        let kv_row = c.num_key_value_heads * c.head_dim * if self.kv_f32 { F } else { B };
        for l in &self.layers {
            weights += 2 * h * F;
            weights += match &l.mixer {
                DMixer::Gdn {
                    in_proj, out_proj, ..
                } => {
                    state += 2
                        * c.linear_num_value_heads
                        * c.linear_key_head_dim
                        * c.linear_value_head_dim
                        * F;
                    (in_proj.rows * in_proj.cols + out_proj.rows * out_proj.cols) * B
                }
                DMixer::Attn { proj, o_proj, .. } => {
                    kv += 2 * ctx * kv_row;
                    (proj.rows * proj.cols + o_proj.rows * o_proj.cols) * B
                }
            };
            weights += match &l.mlp {
                DMlp::Moe {
                    input, shared_down, ..
                } => {
                    (input.rows * input.cols
                        + shared_down.rows * shared_down.cols
                        + k * 3 * inter * h)
                        * B
                }
                DMlp::Dense { gate_up, down } => {
                    (gate_up.rows * gate_up.cols + down.rows * down.cols) * B
                }
            };
        }
        StepBytes { weights, kv, state }
    }

    /// Device-to-device copy bandwidth (bytes read + written per second) over
    /// `bytes`-sized buffers: the practical ceiling of memory-bound kernels.
    pub fn copy_bandwidth(&self, bytes: usize) -> Result<f64> {
        let d = &self.dev;
        d.bind()?;
        let a = d.alloc_zeroed(bytes)?;
        let b = d.alloc(bytes)?;
        d.dtod(b.ptr(), a.ptr(), bytes)?;
        d.sync()?;
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            d.dtod(b.ptr(), a.ptr(), bytes)?;
            d.sync()?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(2.0 * bytes as f64 / best)
    }

    /// `(used, total)` device memory in bytes (the whole device, this process included).
    pub fn memory_used(&self) -> (usize, usize) {
        let _ = self.dev.bind();
        let (free, total) = self.dev.mem_info();
        (total - free, total)
    }

    /// Per-kernel GPU time since the last call when `QWASI_GPU_PROFILE=1`.
    pub fn take_profile(&self) -> Vec<(&'static str, usize, f64)> {
        let _ = self.dev.bind();
        self.dev.take_profile()
    }
}

impl GpuModel {
    /// What one decode kernel's weight read costs on this device, as a floor
    /// for the decode GEMVs: mean microseconds per launch over every GDN
    /// layer's out projection (distinct buffers, together larger than L2) for
    /// (1) the plainest streaming read of the matrix, (2) the decode GEMV
    /// (`dec_gemv`, residual + sums of squares), each as back-to-back launches
    /// timed as one batch. Returns `(bytes per matrix, read us, gemv us)`.
    pub fn probe_gemv(&self) -> Result<(usize, f64, f64)> {
        let d = &self.dev;
        d.bind()?;
        let mats: Vec<(u64, usize, usize)> = self
            .layers
            .iter()
            .filter_map(|l| match &l.mixer {
                DMixer::Gdn { out_proj, .. } => {
                    Some((out_proj.buf.ptr(), out_proj.rows, out_proj.cols))
                }
                _ => None,
            })
            .collect();
        if mats.is_empty() {
            bail!("the probe needs GDN layers");
        }
        let (rows, cols) = (mats[0].1, mats[0].2);
        let bytes = rows * cols * B;
        let sink = d.alloc(1 << 22)?;
        let x = d.alloc_zeroed(cols * F)?;
        let y = d.alloc_zeroed(rows * F)?;
        let ssq = d.alloc(rows.div_ceil(8) * F)?;
        let blocks = (d.sm_count * 8).min((1 << 22) / (256 * 4));
        let time = |f: &dyn Fn(u64) -> Result<()>| -> Result<f64> {
            for &(w, ..) in &mats {
                f(w)?;
            }
            d.sync()?;
            let reps = 5;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                for &(w, ..) in &mats {
                    f(w)?;
                }
            }
            d.sync()?;
            Ok(t.elapsed().as_secs_f64() * 1e6 / (reps * mats.len()) as f64)
        };
        let read = time(&|w| {
            d.launch(
                "probe_read",
                (blocks, 1, 1),
                (256, 1, 1),
                0,
                &[
                    Arg::Ptr(w),
                    Arg::I64((bytes / 16) as i64),
                    Arg::Ptr(sink.ptr()),
                ],
            )
        })?;
        let nssq = rows.div_ceil(8);
        let gemv = time(&|w| self.dec_gemv(w, x.ptr(), y.ptr(), rows, cols, ssq.ptr(), nssq))?;
        Ok((bytes, read, gemv))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The H200's opt-in shared memory per block.
    const H200_SMEM: usize = 232_448;

    #[test]
    fn bulk_gemv_launches() {
        let b = BulkGemv {
            stages: 4,
            blocks_per_sm: 1,
        };
        // GDN in_proj of the 35B model: 12,352 rows of 2,048 columns, 132 SMs.
        assert_eq!(
            b.plan(0, 12_352, 2048, H200_SMEM, 132, None),
            Some(BulkPlan {
                kernel: "dec_gemv_bulk1",
                grid: 132,
                smem: 4 * 32768,
                stages: 4
            })
        );
        // The out projection (4,096 columns): 4-row slots, one block per
        // partial sum of squares at most.
        let out = b.plan(0, 2048, 4096, H200_SMEM, 132, Some(256)).unwrap();
        assert_eq!(
            (out.kernel, out.grid, out.smem),
            ("dec_gemv_bulk2", 132, 4 * 32768)
        );
        assert_eq!(
            b.plan(0, 2048, 4096, H200_SMEM, 132, Some(8)).unwrap().grid,
            8
        );
        // A small model: fewer slots than SMs; slots shrink with the row.
        let small = b.plan(0, 100, 64, H200_SMEM, 132, None).unwrap();
        assert_eq!((small.grid, small.smem), (13, 4 * 8 * 64 * 2));
        // Less shared memory: fewer slots; none fits: the other kernels.
        assert_eq!(b.plan(0, 64, 2048, 70_000, 132, None).unwrap().stages, 2);
        assert_eq!(b.plan(0, 64, 2048, 30_000, 132, None), None);
        // Unaligned rows or weights, or rows too long.
        assert_eq!(b.plan(0, 64, 100, H200_SMEM, 132, None), None);
        assert_eq!(b.plan(8, 64, 2048, H200_SMEM, 132, None), None);
        assert_eq!(b.plan(0, 64, 4104, H200_SMEM, 132, None), None);
    }

    #[test]
    fn bulk_conv_launches() {
        let b = BulkGemv {
            stages: 4,
            blocks_per_sm: 1,
        };
        // The 35B GDN in projection with a conv of 4: 1,544 slots on 132
        // blocks, at most 12 slots (96 rows) a block, 8 floats a row.
        let p = b.plan_conv(0, 12_352, 2048, H200_SMEM, 132, 4).unwrap();
        assert_eq!(
            (p.kernel, p.grid, p.smem, p.stages),
            ("dec_gemv_bulk_conv", 132, 4 * 32768 + 96 * 8 * 4, 4)
        );
        // Every block's rows fit the staging the kernel lays out after the ring.
        for (rows, grid_max, k) in [(12_352, 132, 4), (100, 7, 2), (1000, 3, 4), (9, 132, 3)] {
            let p = b.plan_conv(0, rows, 64, H200_SMEM, grid_max, k).unwrap();
            let slots = rows.div_ceil(8);
            for blk in 0..p.grid {
                let n = slots * (blk + 1) / p.grid - slots * blk / p.grid;
                assert!(
                    p.smem >= p.stages * 8 * 64 * 2 + n * 8 * 2 * k * F,
                    "{rows} {blk}"
                );
            }
        }
        // Wide rows (4-row slots), no conv, or no room: the plain GEMV and dec_gdn_conv.
        assert_eq!(b.plan_conv(0, 64, 4096, H200_SMEM, 132, 4), None);
        assert_eq!(b.plan_conv(0, 64, 2048, H200_SMEM, 132, 0), None);
        assert_eq!(b.plan_conv(0, 12_352, 2048, 4 * 32768 + 100, 132, 4), None);
    }

    #[test]
    fn decode_attention_launches() {
        // Qwen3.6-35B: 8 query heads per KV head, head_dim 256, f32 KV.
        // Without tensor cores (HIP), then with them below.
        let plan = |path, keys, kv, smem| dec_attn_plan(path, 8, 256, keys, kv, smem, false);
        let auto = DecAttnPath::Auto;
        assert_eq!(plan(auto, 100, F, H200_SMEM).kernel, "dec_attn_f32");
        assert_eq!(plan(auto, 100, F, H200_SMEM).smem, 0);
        let ring = plan(auto, 1023, F, H200_SMEM);
        assert_eq!(
            (ring.kernel, ring.threads, ring.stages, ring.smem),
            ("dec_attn_f32_ring", 256, 3, 3 * 32 * 1024)
        );
        assert_eq!(
            plan(DecAttnPath::Ring, 100, B, H200_SMEM).kernel,
            "dec_attn_bf16_ring"
        );
        // Long f32 splits: the key-parallel kernel, one head per warp; bf16
        // KV keeps the ring.
        assert_eq!(plan(auto, 1024, F, H200_SMEM).kernel, "dec_attn_f32_keys1");
        assert_eq!(plan(auto, 4096, B, H200_SMEM).kernel, "dec_attn_bf16_ring");
        assert_eq!(
            plan(DecAttnPath::Ring, 4096, F, H200_SMEM).kernel,
            "dec_attn_f32_ring"
        );
        // Keys: q and p (9,216 bytes), then 32-key tiles of padded K and V.
        let keys = plan(DecAttnPath::Keys { heads_per_warp: 2 }, 100, F, H200_SMEM);
        let tile = 32 * (2 * 256 + 4) * 4;
        assert_eq!(
            (keys.kernel, keys.threads, keys.stages, keys.smem),
            ("dec_attn_f32_keys", 128, 3, 9216 + 3 * tile)
        );
        let one = plan(DecAttnPath::Keys { heads_per_warp: 1 }, 100, F, H200_SMEM);
        assert_eq!((one.kernel, one.threads), ("dec_attn_f32_keys1", 256));
        let bf = plan(DecAttnPath::Keys { heads_per_warp: 2 }, 100, B, H200_SMEM);
        assert_eq!(
            (bf.kernel, bf.smem),
            ("dec_attn_bf16_keys", 9216 + 3 * 32 * 520 * 2)
        );
        // 99 KB (sm_86/89): one stage.
        assert_eq!(
            plan(DecAttnPath::Keys { heads_per_warp: 2 }, 100, F, 101_376).stages,
            1
        );
        // Where the kernel does not apply, the default kernels run.
        let keys2 = DecAttnPath::Keys { heads_per_warp: 2 };
        assert_eq!(
            dec_attn_plan(keys2, 8, 64, 1024, F, H200_SMEM, false).kernel,
            "dec_attn_f32_ring"
        );
        assert_eq!(
            dec_attn_plan(keys2, 3, 256, 100, F, H200_SMEM, true).kernel,
            "dec_attn_f32"
        );
        assert_eq!(
            dec_attn_plan(keys2, 8, 128, 100, B, H200_SMEM, true).kernel,
            "dec_attn_bf16"
        );
        assert_eq!(plan(keys2, 100, F, 40_000).kernel, "dec_attn_f32");
        // No bf16 kernel with one head per warp.
        let keys1 = DecAttnPath::Keys { heads_per_warp: 1 };
        assert_eq!(plan(keys1, 100, B, H200_SMEM).kernel, "dec_attn_bf16");
        // Tensor cores (the default where they apply): 4 warps, no dynamic
        // shared memory, f32 or bf16 KV.
        let plan = |path, keys, kv, smem| dec_attn_plan(path, 8, 256, keys, kv, smem, true);
        let a = plan(auto, 100, F, H200_SMEM);
        assert_eq!(
            (a.kernel, a.stages, a.smem),
            ("dec_attn_f32_tc_ring", 2, 4 * 2 * 16 * 140 * 4)
        );
        assert_eq!(
            plan(auto, 4096, B, H200_SMEM).kernel,
            "dec_attn_bf16_tc_ring"
        );
        assert_eq!(
            plan(DecAttnPath::Ring, 4096, F, H200_SMEM).kernel,
            "dec_attn_f32_ring"
        );
        let tc = plan(DecAttnPath::Tensor { ring: 0 }, 4096, F, H200_SMEM);
        assert_eq!(
            (tc.kernel, tc.threads, tc.smem),
            ("dec_attn_f32_tc", 128, 0)
        );
        assert_eq!(
            plan(DecAttnPath::Tensor { ring: 0 }, 100, B, H200_SMEM).kernel,
            "dec_attn_bf16_tc"
        );
        // Where it does not apply: as Auto.
        let no_tc = |group, hd, tensor_cores| {
            dec_attn_plan(
                DecAttnPath::Tensor { ring: 0 },
                group,
                hd,
                100,
                F,
                H200_SMEM,
                tensor_cores,
            )
            .kernel
        };
        assert_eq!(no_tc(8, 256, false), "dec_attn_f32");
        assert_eq!(no_tc(16, 256, true), "dec_attn_f32");
        assert_eq!(no_tc(8, 80, true), "dec_attn_f32");
        assert_eq!(no_tc(8, 512, true), "dec_attn_f32");
        assert_eq!(no_tc(8, 128, true), "dec_attn_f32_tc");
        // Small heads: fewer warps (the test fixtures' head_dim 32: 2 of 16 dims).
        let warps =
            |hd| dec_attn_plan(DecAttnPath::Auto, 4, hd, 100, F, H200_SMEM, true).threads / 32;
        assert_eq!((warps(32), warps(64), warps(96), warps(256)), (2, 4, 2, 4));
        let small = dec_attn_plan(DecAttnPath::Auto, 4, 32, 100, F, H200_SMEM, true);
        assert_eq!(
            (small.kernel, small.smem),
            ("dec_attn_f32_tc_ring", 2 * 2 * 16 * (32 + 8 + 4) * 4)
        );
        // Ring: 4 warps x 3 slots of K [16][72] + V [16][68] f32 (bf16: V [16][72]).
        let r3 = plan(DecAttnPath::Tensor { ring: 3 }, 4096, F, H200_SMEM);
        assert_eq!(
            (r3.kernel, r3.smem, r3.stages),
            ("dec_attn_f32_tc_ring", 4 * 3 * 16 * 140 * 4, 3)
        );
        let r2 = plan(DecAttnPath::Tensor { ring: 2 }, 4096, B, H200_SMEM);
        assert_eq!(
            (r2.kernel, r2.smem),
            ("dec_attn_bf16_tc_ring", 4 * 2 * 16 * 144 * 2)
        );
        // Too little shared memory for two slots: registers.
        let small = plan(DecAttnPath::Tensor { ring: 4 }, 4096, F, 60_000);
        assert_eq!((small.kernel, small.smem), ("dec_attn_f32_tc", 0));
        let auto_16 = dec_attn_plan(auto, 16, 256, 100, F, H200_SMEM, true);
        assert_eq!(auto_16.kernel, "dec_attn_f32");
    }
}
