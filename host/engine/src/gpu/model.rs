//! The whole Qwen3.5/3.6 forward on one GPU: bf16 weights, f32 activations and
//! accumulation, f32 GDN state, bf16 KV cache. Batch 1.
//!
//! Per layer: (1+w) RMSNorm -> one fused input projection (GEMV at T = 1,
//! cuBLAS GEMM otherwise) -> GDN (conv + SiLU, L2 norm, gates, delta rule,
//! gated norm) or attention (norms + partial RoPE + KV append, split-K causal
//! attention, sigmoid gate) -> output projection -> residual; then the MoE
//! (router softmax/top-k on the device, gated shared expert, routed experts:
//! GEMVs over the k chosen experts at T = 1, per-expert GEMMs over grouped tokens
//! otherwise) or dense SwiGLU MLP.

mod attn_prefill;
pub use attn_prefill::AttnAgreement;
mod decode;
mod gdn_prefill;
mod seq_state;

#[cfg(feature = "cuda")]
use super::cuda::{DBuf, Device};
#[cfg(all(feature = "hip", not(feature = "cuda")))]
use super::hip::{DBuf, Device};
use super::{Arg, HostBuf, f, i};
use crate::backend::{Backend, SeqSnapshot};
use crate::config::{LayerKind, MlpConfig, ModelConfig};
use crate::sampling::{
    RowPlanner, RowRead, RowSums, Sampled, TOP_CANDIDATES, TopLogits, WEIGHT_BLOCK, WeightedRow,
    Weighting, key_parts,
};
use crate::weights::{Mixer, Mlp, Weights};
use anyhow::{Context, Result, bail};
use half::bf16;
use seq_state::{GdnLayout, KvSlab, KvWriter, Span};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How multi-token projections run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmPath {
    /// cuBLAS bf16 x bf16 -> f32 with activations rounded to bf16 (fastest; ~bf16 inference accuracy).
    Cublas,
    /// Activations split into bf16 hi + lo terms, two cuBLAS GEMMs accumulated in
    /// f32: ~f32 activation accuracy at tensor-core speed (the default).
    CublasSplit,
    /// The portable tiled kernel, f32 activations (exactly the CPU's precision).
    Tiled,
}

struct DevMat {
    buf: DBuf,
    rows: usize,
    cols: usize,
}

enum DMixer {
    Gdn {
        /// `[conv_dim + value_dim + 2 * nv, hidden]`: qkv | z | a | b.
        in_proj: DevMat,
        conv: DBuf,
        a_log: DBuf,
        dt_bias: DBuf,
        norm: DBuf,
        out_proj: DevMat,
    },
    Attn {
        /// `[2 * nh * hd + 2 * nkv * hd, hidden]`: q|gate per head, k, v.
        proj: DevMat,
        q_norm: DBuf,
        k_norm: DBuf,
        o_proj: DevMat,
    },
}

enum DMlp {
    Moe {
        /// `[E + 1 + 2 * Is, hidden]`: router | shared gate | shared gate_proj | shared up_proj.
        input: DevMat,
        /// `[E, 2I, hidden]` (gate rows then up rows per expert).
        gate_up: DBuf,
        /// `[E, hidden, I]`.
        down: DBuf,
        shared_down: DevMat,
    },
    Dense {
        gate_up: DevMat,
        down: DevMat,
    },
}

struct DLayer {
    input_norm: DBuf,
    post_norm: DBuf,
    mixer: DMixer,
    mlp: DMlp,
}

pub struct GpuModel {
    dev: Device,
    cfg: ModelConfig,
    embed: DevMat,
    /// `None`: tied to the embedding.
    lm_head: Option<DevMat>,
    norm: DBuf,
    layers: Vec<DLayer>,
    scratch: Mutex<Scratch>,
    /// Buffers and graph of the fused decode step (`decode.rs`); `None` until the first step.
    decode: Mutex<Option<decode::DecodeState>>,
    /// `false` with `QWASI_DECODE=unfused`: single tokens take the prefill kernels.
    fused_decode: bool,
    /// `false` with `QWASI_PREFILL=reference`: prompts take the first (per-op) kernels.
    fast_prefill: bool,
    /// `false` with `QWASI_GDN=serial`: prompts run the token-serial delta rule.
    chunked_gdn: bool,
    /// `false` with `QWASI_MOE=cublas` (and in HIP builds): prompt experts run as
    /// per-expert cuBLAS calls instead of one grouped tensor-core kernel per matrix.
    grouped_moe: bool,
    /// Columns per block of the warpgroup-MMA expert GEMM for 128-row tiles
    /// (`moe_gemm_split128_wg` 128, `_wg256` 256), on compute capability 9.x;
    /// 0 keeps `mma.sync` (`moe_gemm_split128`). `QWASI_MOE_GEMM=mma|wg128|wg256`.
    moe_wg_cols: usize,
    /// k steps of 64 for the 64-row expert tiles (`moe_gemm_split_k64`; few
    /// rows per expert: short prompts, new tokens after a cached prefix);
    /// `false` with `QWASI_MOE_BK64=32` (`moe_gemm_split`, k steps of 32).
    moe_k64: bool,
    /// `false` with `QWASI_ATTN=cuda-cores` (and in HIP builds): prompt
    /// attention without tensor cores (`attn_flash_*`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    tc_attention: bool,
    /// Prompt attention on warpgroup MMA (`attn_flash_wg_*`) where it applies
    /// (compute capability 9.x); `false` with `QWASI_ATTN=mma`, which keeps the
    /// `mma.sync` kernel (`attn_flash_tc_*`).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    wg_attention: bool,
    /// Stream-K over all multiprocessors for the warpgroup attention when
    /// few row blocks would leave some idle (`QWASI_ATTN_SPLIT=0`: one block
    /// per row block always).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    wg_split: bool,
    /// KV capacity limit per sequence (tokens).
    pub max_len: usize,
    pub gemm: GemmPath,
    /// KV cache in f32 (the default: matches the f32 references at every
    /// length) or bf16 (`QWASI_KV=bf16`: half the memory and bandwidth; measured
    /// KL 1.2e-2 vs transformers f32 on a one-token prompt at full width).
    pub kv_f32: bool,
    /// `QWASI_DEC_ATTN=tc|ring|direct|keys|keys1`: force decode attention's
    /// kernel (default: tensor cores where they apply, see `dec_attn_plan`).
    dec_attn: decode::DecAttnPath,
    /// `false` with `QWASI_GEMV=stream`: residual GEMVs with short rows keep
    /// one warp per row (`dec_gemv`, `dec_moe_down`) instead of splitting
    /// rows between warps (`dec_gemv_rows`, `dec_moe_down_rows`).
    split_gemv: bool,
    /// Decode GEMVs fed by bulk copies (`kernels/gemv_bulk.cu`), where the
    /// GPU has them, unless `QWASI_GEMV=rows|stream`.
    bulk_gemv: Option<decode::BulkGemv>,
    /// The GDN decode conv in the in projection's epilogue
    /// (`dec_gemv_bulk_conv`) where the bulk GEMV applies; `false` with
    /// `QWASI_GDN_CONV=kernel` (its own kernel, `dec_gdn_conv`).
    conv_gdn: bool,
    /// Prefix-cache host copies in page-locked memory (`false` with
    /// `QWASI_HOST_TIER=pageable`).
    pinned_host_tier: bool,
}

/// Work buffers, grown on demand and reused across passes.
#[derive(Default)]
struct Scratch {
    bufs: HashMap<&'static str, DBuf>,
    /// Where `logits_device` left the last logits: (sequence id, the
    /// position they follow, device pointer), for `last_logits`.
    last_logits: Option<(u64, usize, u64)>,
    /// The stream-K plan of the warpgroup prompt attention on the device:
    /// (tokens, first position, blocks, buffer) it was made for.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    attn_plan: Option<(usize, usize, usize, u64)>,
}

impl Scratch {
    fn get(&mut self, dev: &Device, name: &'static str, bytes: usize) -> Result<u64> {
        let need = bytes.max(256);
        if let Some(b) = self.bufs.get(name)
            && b.bytes() >= need
        {
            return Ok(b.ptr());
        }
        self.bufs.remove(name);
        let b = dev.alloc(need.next_power_of_two())?;
        let p = b.ptr();
        self.bufs.insert(name, b);
        Ok(p)
    }
}

/// A sequence's device state: the GDN layers' conv windows and f32 states in
/// one allocation, the attention layers' KV caches in one slab grown on demand
/// (doubling) up to `max_len` and shared with the sequence's snapshots
/// ([`seq_state`]).
pub struct GpuSequence {
    /// Unique per sequence: a captured decode graph is valid for one sequence's buffers.
    id: u64,
    pos: usize,
    /// Per layer, where its state is (empty before the first pass).
    layers: Vec<SeqLayer>,
    gdn: Option<DBuf>,
    kv: Option<KvWriter>,
    /// Resumed from a snapshot by adopting its KV slab (no copy).
    adopted_kv: bool,
}

impl GpuSequence {
    /// KV rows per layer: the slab's capacity (0 before the first pass).
    fn cap(&self) -> usize {
        self.kv.as_ref().map_or(0, |kv| kv.slab().cap())
    }
}

/// One layer's state: spans of the sequence's (or snapshot's) GDN allocation
/// and KV slab.
#[derive(Clone, Copy)]
enum SeqLayer {
    Gdn {
        conv: Span,
        s: Span,
    },
    /// Rows `[0, pos)` of a KV slab are never written again once a snapshot
    /// holds them (the cache only appends).
    Attn {
        k: Span,
        v: Span,
    },
}

/// Longest token run one pass handles (longer prompts are split).
const PREFILL_CHUNK: usize = 16_384;

const F: usize = 4; // bytes per f32
/// kernels/sampling.cu: keys per head (TOP_K, the sampler's candidates),
/// logits per slice of the first pass (one sort round), and the head's size
/// in 8-byte words (keys, then the max and the log-sum-exp as two f32).
const TOP_KEYS: usize = TOP_CANDIDATES;
const TOP_PER_PART: usize = 4096 - TOP_KEYS;
const HEAD_WORDS: usize = TOP_KEYS + 1;

/// Fails (before any work) when more than the device's head is asked for.
fn check_head(k: usize) -> Result<()> {
    if k > TOP_KEYS {
        bail!("the device reads at most {TOP_KEYS} top logits, {k} asked for");
    }
    Ok(())
}

/// The first `k` (at most `TOP_KEYS`) entries of a head read back from the device.
fn head_of(words: &[u64], k: usize) -> TopLogits {
    TopLogits {
        top: words[..k].iter().map(|&w| key_parts(w)).collect(),
        lse: f32::from_bits((words[TOP_KEYS] >> 32) as u32) as f64,
    }
}

/// Query and key tile of `attn_flash_*` (kernels/attention.cu, CUDA build).
#[cfg(feature = "cuda")]
const FA_BQ: usize = 64;
#[cfg(feature = "cuda")]
const FA_BK: usize = 32;
/// Query and key tile of `attn_flash_*` in the HIP build (64 KB of LDS on RDNA).
#[cfg(all(feature = "hip", not(feature = "cuda")))]
const FA_BQ: usize = 32;
#[cfg(all(feature = "hip", not(feature = "cuda")))]
const FA_BK: usize = 16;
const B: usize = 2; // bytes per bf16
/// Column tile, k step and pipeline stages of `moe_gemm_split*`
/// (kernels/moe_gemm.cu); its row tile is 64 (`moe_gemm_split`, 128 threads)
/// or 128 (`moe_gemm_split128`, 256 threads). On the H200 at 8K tokens,
/// 128-row tiles were 4% faster than 64, and 3 stages slower than 2 (148
/// against 108 ms of kernel time per prefill, at ecea6ea).
const MG_BN: usize = 128;
const MG_BK: usize = 32;
const MG_STAGES: usize = 2;
/// Stages of `moe_gemm_split128_wg*` (A hi and A lo of 128 rows, B of 128 or
/// 256 rows, MG_BK bf16 each).
const MG_WG_STAGES: usize = 4;

/// The grouped expert GEMM kernel for `bm`-row tiles over `k` columns: its
/// name, dynamic shared memory (bytes) and columns per block. The
/// warpgroup-MMA kernels (`wg_cols` 128 or 256, where the device has `wgmma`)
/// take 128-row tiles only; 64-row tiles take k steps of 64
/// (`moe_gemm_split_k64`) where `k64` and `k` allows, else 32.
fn moe_gemm_kernel(
    bm: usize,
    wgmma: bool,
    wg_cols: usize,
    k64: bool,
    k: usize,
) -> (&'static str, usize, usize) {
    // mma.sync kernels: k steps of `bk`, shared rows padded by 8 bf16.
    let mma_smem = |bk: usize| MG_STAGES * (2 * bm + MG_BN) * (bk + 8) * B;
    match (bm, if wgmma { wg_cols } else { 0 }) {
        (64, _) if k64 && k.is_multiple_of(64) => ("moe_gemm_split_k64", mma_smem(64), MG_BN),
        (128, 128) => (
            "moe_gemm_split128_wg",
            MG_WG_STAGES * (256 + 128) * MG_BK * B,
            128,
        ),
        (128, 256) => (
            "moe_gemm_split128_wg256",
            MG_WG_STAGES * (256 + 256) * MG_BK * B,
            256,
        ),
        (128, _) => ("moe_gemm_split128", mma_smem(MG_BK), MG_BN),
        _ => ("moe_gemm_split", mma_smem(MG_BK), MG_BN),
    }
}

/// `n` seeded uniform values `offset + scale * u`, u in [-1, 1), at `ptr`:
/// bf16 (`fill_uniform_bf16`) or f32 (`fill_uniform_f32`).
fn fill_uniform(
    dev: &Device,
    ptr: u64,
    n: usize,
    seed: u64,
    scale: f32,
    offset: f32,
    bf16: bool,
) -> Result<()> {
    dev.launch(
        if bf16 {
            "fill_uniform_bf16"
        } else {
            "fill_uniform_f32"
        },
        (n.div_ceil(256).min(65_535 * 16) as u32, 1, 1),
        (256, 1, 1),
        0,
        &[
            Arg::Ptr(ptr),
            Arg::I64(n as i64),
            Arg::U64(seed),
            f(scale),
            f(offset),
        ],
    )
}

/// The most block rows the grouped expert GEMM can need for `nn` rows over
/// `e` experts in tiles of `bm`: every full tile, plus a partial one per
/// expert that has rows (at most `min(e, nn)` of them). Its grid is this tall;
/// `moe_plan_tiles` writes how many there are and the rest return at once.
fn moe_max_tiles(nn: usize, e: usize, bm: usize) -> usize {
    nn / bm + e.min(nn)
}

/// A router that picked `n` indices outside the `e` experts.
fn router_out_of_range(n: i32, e: usize) -> anyhow::Error {
    anyhow::anyhow!("router produced {n} expert indices outside 0..{e}: non-finite activations?")
}

/// Where `moe_grouped_device` reads and writes: the normed input rows `n`,
/// the residual `x`, the router's indices and weights, and this layer's
/// out-of-range count `bad`.
struct MoeIo {
    n: u64,
    x: u64,
    idx: u64,
    wts: u64,
    bad: u64,
}

/// The prefill experts' row tiles: on the device (`moe_plan_tiles`' table,
/// `most` block rows launched), or the per-expert counts on the host for the
/// per-expert cuBLAS path.
enum MoePlan {
    Tiles { buf: u64, most: u32, bm: usize },
    Counts(Vec<i32>),
}

/// KV rows to allocate for `need` tokens when `cur` are allocated: room for
/// what usually follows (the next prompt pass, the reply; also more key
/// splits for decode attention, whose count follows the capacity), at least
/// doubling, at most `max_len` (unless `need` is more: the caller refuses it).
fn kv_capacity(need: usize, cur: usize, max_len: usize) -> usize {
    (need + 4096.max(need / 8))
        .max(cur * 2)
        .min(max_len.max(need))
}

/// Largest expert count and top-k of the MoE kernels (`MOE_MAXE`, `MOE_MAXK` in kernels/compat.h).
const MOE_MAXE: usize = 1024;
const MOE_MAXK: usize = 32;

/// Tokens per thread and longest conv kernel of `conv_silu_tokens`
/// (`CONV_TPT`, `CONV_MAXK` in kernels/gdn.cu).
const CONV_TPT: usize = 16;
const CONV_MAXK: usize = 8;

/// Refuses geometries the kernels do not handle, before anything is allocated.
fn check_supported(cfg: &ModelConfig) -> Result<()> {
    if !(1..=CONV_MAXK).contains(&cfg.linear_conv_kernel) {
        bail!(
            "the GPU backend handles GDN conv kernels of 1 to {CONV_MAXK} taps; \
             this model has {} (use --backend cpu)",
            cfg.linear_conv_kernel
        );
    }
    // The decode step's delta rule (kernels/decode.cu: dec_gdn_step) keeps a
    // key head's state rows in 4 x 32 threads and a value head's columns in
    // one block.
    let (dk, dv) = (cfg.linear_key_head_dim, cfg.linear_value_head_dim);
    let heads_ok = cfg.linear_num_key_heads > 0
        && cfg
            .linear_num_value_heads
            .is_multiple_of(cfg.linear_num_key_heads);
    if cfg.layer_kinds.contains(&LayerKind::Linear) && (dk > 128 || dv > 256 || !heads_ok) {
        bail!(
            "the GPU backend handles GDN key heads of up to 128 and value heads of up to 256, \
             a whole number of value heads per key head; this model has {dk} and {dv}, \
             {} value heads for {} key heads (use --backend cpu)",
            cfg.linear_num_value_heads,
            cfg.linear_num_key_heads
        );
    }
    let (e, k, _, _) = mlp_dims(cfg);
    if e > MOE_MAXE || k > MOE_MAXK {
        bail!(
            "the GPU backend handles up to {MOE_MAXE} experts and top-{MOE_MAXK} routing; \
             this model has {e} experts, top-{k} (use --backend cpu)"
        );
    }
    Ok(())
}

fn mlp_dims(cfg: &ModelConfig) -> (usize, usize, usize, usize) {
    match cfg.mlp {
        MlpConfig::Moe {
            num_experts,
            top_k,
            intermediate,
            shared_intermediate,
        } => (num_experts, top_k, intermediate, shared_intermediate),
        MlpConfig::Dense { intermediate } => (0, 0, intermediate, 0),
    }
}

impl GpuModel {
    /// Uploads `weights` to GPU 0 (fused per-layer projections, contiguous experts).
    pub fn new(cfg: ModelConfig, w: &Weights) -> Result<Self> {
        check_supported(&cfg)?;
        let dev = Device::new()?;
        let h = cfg.hidden_size;
        let total = w.bytes_total();
        eprintln!(
            "[cuda] {}: uploading {:.2} GB of weights",
            dev.name,
            total as f64 / 1e9
        );
        let t0 = std::time::Instant::now();
        let mat = |m: &crate::tensor::Mat| -> Result<DevMat> {
            Ok(DevMat {
                buf: dev.upload(m.data())?,
                rows: m.rows,
                cols: m.cols,
            })
        };
        let cat = |ms: &[&crate::tensor::Mat]| -> Result<DevMat> {
            let cols = ms[0].cols;
            let rows: usize = ms.iter().map(|m| m.rows).sum();
            let buf = dev.alloc(rows * cols * B)?;
            let mut off = 0;
            for m in ms {
                assert_eq!(m.cols, cols);
                dev.htod(buf.at(off), m.data())?;
                off += m.rows * cols * B;
            }
            Ok(DevMat { buf, rows, cols })
        };
        let f32s = |v: &[f32]| dev.upload(v);
        let mut layers = Vec::with_capacity(w.layers.len());
        for (li, l) in w.layers.iter().enumerate() {
            let mixer = match &l.mixer {
                Mixer::Gdn(g) => DMixer::Gdn {
                    in_proj: cat(&[&g.in_proj_qkv, &g.in_proj_z, &g.in_proj_a, &g.in_proj_b])?,
                    conv: f32s(&g.conv)?,
                    a_log: f32s(&g.a_log)?,
                    dt_bias: f32s(&g.dt_bias)?,
                    norm: f32s(&g.norm)?,
                    out_proj: mat(&g.out_proj)?,
                },
                Mixer::Attention(a) => DMixer::Attn {
                    proj: cat(&[&a.q_proj, &a.k_proj, &a.v_proj])?,
                    q_norm: f32s(&a.q_norm)?,
                    k_norm: f32s(&a.k_norm)?,
                    o_proj: mat(&a.o_proj)?,
                },
            };
            let mlp = match &l.mlp {
                Mlp::Moe {
                    router,
                    experts,
                    shared,
                    shared_gate,
                } => {
                    let (e, _, inter, _) = mlp_dims(&cfg);
                    let gate_up = dev.alloc(e * 2 * inter * h * B)?;
                    let down = dev.alloc(e * h * inter * B)?;
                    for (k, x) in experts.iter().enumerate() {
                        let base = k * 2 * inter * h * B;
                        dev.htod(gate_up.at(base), x.gate.data())?;
                        dev.htod(gate_up.at(base + inter * h * B), x.up.data())?;
                        dev.htod(down.at(k * h * inter * B), x.down.data())?;
                    }
                    DMlp::Moe {
                        input: cat(&[router, shared_gate, &shared.gate, &shared.up])?,
                        gate_up,
                        down,
                        shared_down: mat(&shared.down)?,
                    }
                }
                Mlp::Dense(d) => DMlp::Dense {
                    gate_up: cat(&[&d.gate, &d.up])?,
                    down: mat(&d.down)?,
                },
            };
            layers.push(DLayer {
                input_norm: f32s(&l.input_norm)?,
                post_norm: f32s(&l.post_norm)?,
                mixer,
                mlp,
            });
            if (li + 1) % 10 == 0 {
                eprintln!("[cuda] uploaded {} / {} layers", li + 1, w.layers.len());
            }
        }
        let embed = mat(&w.embed)?;
        let lm_head = match &w.lm_head {
            Some(m) => Some(mat(m)?),
            None => None,
        };
        let norm = f32s(&w.norm)?;
        dev.sync()?;
        eprintln!(
            "[cuda] weights on the GPU in {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        Ok(Self::assemble(dev, cfg, embed, lm_head, norm, layers))
    }

    fn assemble(
        dev: Device,
        cfg: ModelConfig,
        embed: DevMat,
        lm_head: Option<DevMat>,
        norm: DBuf,
        layers: Vec<DLayer>,
    ) -> Self {
        let gemm = match std::env::var("QWASI_GEMM").as_deref() {
            Ok("tiled") => GemmPath::Tiled,
            Ok("bf16") => GemmPath::Cublas,
            _ => GemmPath::CublasSplit,
        };
        // HIP: without hipBLAS, multi-token projections take the tiled kernel.
        #[cfg(all(feature = "hip", not(feature = "cuda")))]
        let gemm = match dev.blas_error() {
            Some(e) if gemm != GemmPath::Tiled => {
                eprintln!("[hip] {e}: prompts use the tiled GEMM kernel (QWASI_GEMM=tiled)");
                GemmPath::Tiled
            }
            _ => gemm,
        };
        let bulk_gemv = decode::BulkGemv::from_env(&dev);
        GpuModel {
            max_len: cfg.max_position_embeddings,
            dev,
            cfg,
            embed,
            lm_head,
            norm,
            layers,
            scratch: Mutex::new(Scratch::default()),
            decode: Mutex::new(None),
            fused_decode: std::env::var("QWASI_DECODE").as_deref() != Ok("unfused"),
            fast_prefill: std::env::var("QWASI_PREFILL").as_deref() != Ok("reference"),
            chunked_gdn: std::env::var("QWASI_GDN").as_deref() != Ok("serial"),
            grouped_moe: cfg!(feature = "cuda")
                && std::env::var("QWASI_MOE").as_deref() != Ok("cublas"),
            moe_k64: std::env::var("QWASI_MOE_BK64").as_deref() != Ok("32"),
            moe_wg_cols: match std::env::var("QWASI_MOE_GEMM").as_deref() {
                Ok("mma") => 0,
                Ok("wg128") => 128,
                _ => 256,
            },
            tc_attention: cfg!(feature = "cuda")
                && std::env::var("QWASI_ATTN").as_deref() != Ok("cuda-cores"),
            wg_attention: std::env::var("QWASI_ATTN").as_deref() != Ok("mma"),
            wg_split: std::env::var("QWASI_ATTN_SPLIT").as_deref() != Ok("0"),
            gemm,
            kv_f32: std::env::var("QWASI_KV").as_deref() != Ok("bf16"),
            dec_attn: decode::DecAttnPath::from_env(),
            split_gemv: std::env::var("QWASI_GEMV").as_deref() != Ok("stream"),
            bulk_gemv,
            conv_gdn: std::env::var("QWASI_GDN_CONV").as_deref() != Ok("kernel"),
            pinned_host_tier: std::env::var("QWASI_HOST_TIER").as_deref() != Ok("pageable"),
        }
    }

    /// A model of `cfg`'s geometry with seeded random bf16 weights generated on
    /// the GPU (no host copy): for speed and long-context runs without a checkpoint.
    pub fn synthetic(cfg: ModelConfig, seed: u64) -> Result<Self> {
        check_supported(&cfg)?;
        let dev = Device::new()?;
        let h = cfg.hidden_size;
        let mut counter = 0u64;
        let mut next_seed = || {
            counter += 1;
            seed ^ counter.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        };
        let t0 = std::time::Instant::now();
        let fill_bf16 = |n: usize, scale: f32, s: u64| -> Result<DBuf> {
            let b = dev.alloc(n * B)?;
            fill_uniform(&dev, b.ptr(), n, s, scale, 0.0, true)?;
            Ok(b)
        };
        let fill_f32 = |n: usize, scale: f32, offset: f32, s: u64| -> Result<DBuf> {
            let b = dev.alloc(n * F)?;
            fill_uniform(&dev, b.ptr(), n, s, scale, offset, false)?;
            Ok(b)
        };
        // Uniform with standard deviation 1/sqrt(cols).
        let unif = |cols: usize| (3.0f32).sqrt() / (cols as f32).sqrt();
        let dmat = |rows: usize, cols: usize, s: u64| -> Result<DevMat> {
            Ok(DevMat {
                buf: fill_bf16(rows * cols, unif(cols), s)?,
                rows,
                cols,
            })
        };
        let (e, _, inter, sh) = mlp_dims(&cfg);
        let mut layers = Vec::new();
        for kind in cfg.layer_kinds.clone() {
            let mixer = match kind {
                LayerKind::Linear => {
                    let nv = cfg.linear_num_value_heads;
                    let rows = cfg.linear_conv_dim() + cfg.linear_value_dim() + 2 * nv;
                    let a_log = dev.alloc(nv * F)?;
                    dev.launch(
                        "fill_alog_f32",
                        ((nv as u32).div_ceil(256), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Arg::Ptr(a_log.ptr()),
                            Arg::I64(nv as i64),
                            Arg::U64(next_seed()),
                        ],
                    )?;
                    DMixer::Gdn {
                        in_proj: dmat(rows, h, next_seed())?,
                        conv: fill_f32(
                            cfg.linear_conv_dim() * cfg.linear_conv_kernel,
                            0.5,
                            0.0,
                            next_seed(),
                        )?,
                        a_log,
                        dt_bias: fill_f32(nv, 0.5, 0.0, next_seed())?,
                        norm: fill_f32(cfg.linear_value_head_dim, 0.1, 1.0, next_seed())?,
                        out_proj: dmat(h, cfg.linear_value_dim(), next_seed())?,
                    }
                }
                LayerKind::Full => {
                    let (nh, nkv, hd) = (
                        cfg.num_attention_heads,
                        cfg.num_key_value_heads,
                        cfg.head_dim,
                    );
                    DMixer::Attn {
                        proj: dmat(2 * nh * hd + 2 * nkv * hd, h, next_seed())?,
                        q_norm: fill_f32(hd, 0.1, 1.0, next_seed())?,
                        k_norm: fill_f32(hd, 0.1, 1.0, next_seed())?,
                        o_proj: dmat(h, nh * hd, next_seed())?,
                    }
                }
            };
            let mlp = match cfg.mlp {
                MlpConfig::Moe { .. } => DMlp::Moe {
                    input: dmat(e + 1 + 2 * sh, h, next_seed())?,
                    gate_up: fill_bf16(e * 2 * inter * h, unif(h), next_seed())?,
                    down: fill_bf16(e * h * inter, unif(inter), next_seed())?,
                    shared_down: dmat(h, sh, next_seed())?,
                },
                MlpConfig::Dense { intermediate } => DMlp::Dense {
                    gate_up: dmat(2 * intermediate, h, next_seed())?,
                    down: dmat(h, intermediate, next_seed())?,
                },
            };
            layers.push(DLayer {
                input_norm: fill_f32(h, 0.1, 1.0, next_seed())?,
                post_norm: fill_f32(h, 0.1, 1.0, next_seed())?,
                mixer,
                mlp,
            });
        }
        let embed = DevMat {
            buf: fill_bf16(cfg.vocab_size * h, 0.5 * 3f32.sqrt(), next_seed())?,
            rows: cfg.vocab_size,
            cols: h,
        };
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(dmat(cfg.vocab_size, h, next_seed())?)
        };
        let norm = fill_f32(h, 0.1, 1.0, next_seed())?;
        dev.sync()?;
        let (free, total) = dev.mem_info();
        eprintln!(
            "[cuda] {}: synthetic {}-layer model generated in {:.1} s; {:.1} GB of {:.1} GB free",
            dev.name,
            cfg.num_layers(),
            t0.elapsed().as_secs_f64(),
            free as f64 / 1e9,
            total as f64 / 1e9
        );
        Ok(Self::assemble(dev, cfg, embed, lm_head, norm, layers))
    }

    pub fn device_name(&self) -> &str {
        &self.dev.name
    }

    fn lm_head(&self) -> &DevMat {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// `y[t, :] = W x[t, :]` for T rows of x (f32) into y (f32).
    fn linear(
        &self,
        sc: &mut Scratch,
        x: u64,
        t: usize,
        w: &DevMat,
        y: u64,
        accumulate: bool,
    ) -> Result<()> {
        self.linear_raw(sc, x, t, w.buf.ptr(), w.rows, w.cols, y, accumulate)
    }

    #[allow(clippy::too_many_arguments)]
    fn linear_raw(
        &self,
        sc: &mut Scratch,
        x: u64,
        t: usize,
        w: u64,
        rows: usize,
        cols: usize,
        y: u64,
        accumulate: bool,
    ) -> Result<()> {
        let d = &self.dev;
        if t == 1 {
            return d.launch(
                "gemv_bf16",
                ((rows as u32).div_ceil(8), t as u32, 1),
                (256, 1, 1),
                0,
                &[
                    Arg::Ptr(w),
                    Arg::Ptr(x),
                    Arg::Ptr(y),
                    i(rows),
                    i(cols),
                    i(t),
                    i(accumulate as usize),
                ],
            );
        }
        match self.gemm {
            GemmPath::Tiled => d.launch(
                "gemm_tiled",
                ((rows as u32).div_ceil(64), (t as u32).div_ceil(64), 1),
                (256, 1, 1),
                0,
                &[
                    Arg::Ptr(x),
                    Arg::Ptr(w),
                    Arg::Ptr(y),
                    i(t),
                    i(rows),
                    i(cols),
                    i(accumulate as usize),
                ],
            ),
            GemmPath::Cublas => {
                let n = t * cols;
                let xb = sc.get(d, "x_bf16", n * B)?;
                d.launch(
                    "f32_to_bf16",
                    ((n as u32).div_ceil(256), 1, 1),
                    (256, 1, 1),
                    0,
                    &[Arg::Ptr(x), Arg::Ptr(xb), Arg::I64(n as i64)],
                )?;
                d.gemm_bf16(xb, w, y, t, rows, cols, accumulate)
            }
            GemmPath::CublasSplit => {
                let n = t * cols;
                let hi = sc.get(d, "x_bf16", 2 * n * B)?;
                let lo = hi + (n * B) as u64;
                d.launch(
                    "f32_to_bf16_split",
                    ((n as u32).div_ceil(4 * 256), 1, 1),
                    (256, 1, 1),
                    0,
                    &[Arg::Ptr(x), Arg::Ptr(hi), Arg::Ptr(lo), Arg::I64(n as i64)],
                )?;
                d.gemm_bf16(hi, w, y, t, rows, cols, accumulate)?;
                d.gemm_bf16(lo, w, y, t, rows, cols, true)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn rmsnorm(
        &self,
        x: u64,
        x_stride: usize,
        w: &DBuf,
        out: u64,
        out_stride: usize,
        rows: usize,
        dim: usize,
    ) -> Result<()> {
        self.dev.launch(
            "rmsnorm",
            (rows as u32, 1, 1),
            (256, 1, 1),
            0,
            &[
                Arg::Ptr(x),
                i(x_stride),
                Arg::Ptr(w.ptr()),
                Arg::Ptr(out),
                i(out_stride),
                i(rows),
                i(dim),
                f(self.cfg.rms_norm_eps),
            ],
        )
    }

    fn init_sequence(&self, seq: &mut GpuSequence) -> Result<()> {
        if !seq.layers.is_empty() {
            return Ok(());
        }
        let gdn = self.dev.alloc_zeroed(self.gdn_layout().bytes())?;
        seq.layers = self.seq_layers(gdn.ptr(), None);
        seq.gdn = Some(gdn);
        seq.kv = None;
        Ok(())
    }

    /// Where the GDN states sit in a sequence's (or snapshot's) state allocation.
    fn gdn_layout(&self) -> GdnLayout {
        let c = &self.cfg;
        GdnLayout {
            conv_bytes: c.linear_conv_dim() * (c.linear_conv_kernel - 1) * F,
            state_bytes: c.linear_num_value_heads
                * c.linear_key_head_dim
                * c.linear_value_head_dim
                * F,
            layers: self.count_layers(LayerKind::Linear),
        }
    }

    fn count_layers(&self, kind: LayerKind) -> usize {
        self.cfg.layer_kinds.iter().filter(|&&k| k == kind).count()
    }

    /// Every layer's spans in a GDN state allocation at `gdn` and a KV slab
    /// (null spans without one: a sequence before its first [`Self::reserve`]).
    fn seq_layers(&self, gdn: u64, kv: Option<&KvSlab>) -> Vec<SeqLayer> {
        let layout = self.gdn_layout();
        let (mut li, mut ai) = (0, 0);
        let null = Span::default();
        self.cfg
            .layer_kinds
            .iter()
            .map(|kind| match kind {
                LayerKind::Linear => {
                    let (conv, s) = layout.spans(gdn, li);
                    li += 1;
                    SeqLayer::Gdn { conv, s }
                }
                LayerKind::Full => {
                    let (k, v) = kv.map_or((null, null), |kv| kv.spans(ai));
                    ai += 1;
                    SeqLayer::Attn { k, v }
                }
            })
            .collect()
    }

    fn kv_row_bytes(&self) -> usize {
        self.cfg.num_key_value_heads * self.cfg.head_dim * if self.kv_f32 { F } else { B }
    }

    /// A KV slab of `cap` rows per attention layer, written by its allocator.
    fn alloc_kv(&self, cap: usize) -> Result<KvSlab> {
        let row = self.kv_row_bytes();
        let bytes = KvSlab::bytes_for(self.count_layers(LayerKind::Full), cap, row);
        Ok(KvSlab::new(self.dev.alloc(bytes)?, cap, row))
    }

    /// Points the sequence at `kv` (its attention layers' spans).
    fn set_kv(&self, seq: &mut GpuSequence, kv: KvWriter) {
        let gdn = seq.gdn.as_ref().map_or(0, DBuf::ptr);
        seq.layers = self.seq_layers(gdn, Some(kv.slab()));
        seq.kv = Some(kv);
    }

    /// Copies rows `[0, rows)` of every attention layer's K and V from the
    /// spans of `from` to those of `to` (both in layer order).
    fn copy_kv_rows(&self, to: &[SeqLayer], from: &[SeqLayer], rows: usize) -> Result<()> {
        let bytes = rows * self.kv_row_bytes();
        for (t, f) in to.iter().zip(from) {
            if let (SeqLayer::Attn { k, v }, SeqLayer::Attn { k: fk, v: fv }) = (t, f) {
                self.dev.dtod(k.ptr(), fk.ptr(), bytes)?;
                self.dev.dtod(v.ptr(), fv.ptr(), bytes)?;
            }
        }
        Ok(())
    }

    /// Grows the sequence's KV slab to hold `need` tokens (a new slab, the
    /// rows so far copied; snapshots keep the old one).
    fn reserve(&self, seq: &mut GpuSequence, need: usize) -> Result<()> {
        if need <= seq.cap() {
            return Ok(());
        }
        let cap = kv_capacity(need, seq.cap(), self.max_len);
        let slab = self.alloc_kv(cap).context("growing the KV cache")?;
        let (old, old_kv) = (seq.layers.clone(), seq.kv.take());
        self.set_kv(seq, KvWriter::fresh(slab));
        if seq.pos > 0 {
            self.copy_kv_rows(&seq.layers, &old, seq.pos)?;
        }
        // The old slab (freed here unless a snapshot holds it) after the copies.
        drop(old_kv);
        Ok(())
    }

    /// Runs `tokens` and returns the final-normed hidden state of the last one (device f32 [H]).
    fn run(&self, seq: &mut GpuSequence, tokens: &[u32], sc: &mut Scratch) -> Result<u64> {
        let c = &self.cfg;
        let d = &self.dev;
        let t = tokens.len();
        let h = c.hidden_size;
        let pos0 = seq.pos;
        // Multi-token prompts take the prefill kernels (tiled attention, parallel
        // conv, warp-per-token router); `QWASI_PREFILL=reference` keeps the
        // original kernels for comparison.
        let fast = t > 1 && self.fast_prefill;
        self.init_sequence(seq)?;
        self.reserve(seq, pos0 + t)?;

        let tok = sc.get(d, "tokens", t * 4)?;
        d.htod(tok, tokens)?;
        let x = sc.get(d, "x", t * h * F)?;
        let n = sc.get(d, "n", t * h * F)?;
        let mixed = sc.get(d, "mixed", t * h * F)?;
        d.launch(
            "embed_gather",
            (t as u32, 1, 1),
            (256, 1, 1),
            0,
            &[
                Arg::Ptr(self.embed.buf.ptr()),
                Arg::Ptr(tok),
                Arg::Ptr(x),
                i(t),
                i(h),
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
        let key_dim = c.linear_key_dim();
        let vdim = c.linear_value_dim();

        // Per MoE layer planned on the device, its count of router indices
        // outside the experts (moe_plan_tiles), checked once at the end.
        let bad_words = sc.get(d, "moe_bad", self.layers.len() * 4)?;
        let (mut planned, mut experts) = (0, 0);
        for (layer, st) in self.layers.iter().zip(&mut seq.layers) {
            self.rmsnorm(x, h, &layer.input_norm, n, h, t, h)?;
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
                    let proj = sc.get(d, "proj", t * p * F)?;
                    self.linear(sc, n, t, in_proj, proj, false)?;
                    // The conv output (q | k | v per token): in place in `proj` on the
                    // reference path, a separate [t, conv_dim] buffer on the prefill path
                    // (tokens in parallel cannot run in place).
                    let (qkv, qkv_stride) = if fast {
                        let co = sc.get(d, "conv_o", t * conv_dim * F)?;
                        d.launch(
                            "conv_silu_tokens",
                            (
                                (conv_dim as u32).div_ceil(256),
                                t.div_ceil(CONV_TPT) as u32,
                                1,
                            ),
                            (256, 1, 1),
                            0,
                            &[
                                Arg::Ptr(proj),
                                i(p),
                                Arg::Ptr(cst.ptr()),
                                Arg::Ptr(conv.ptr()),
                                Arg::Ptr(co),
                                i(t),
                                i(conv_dim),
                                i(c.linear_conv_kernel),
                            ],
                        )?;
                        d.launch(
                            "conv_state_update",
                            ((conv_dim as u32).div_ceil(256), 1, 1),
                            (256, 1, 1),
                            0,
                            &[
                                Arg::Ptr(proj),
                                i(p),
                                Arg::Ptr(cst.ptr()),
                                i(t),
                                i(conv_dim),
                                i(c.linear_conv_kernel),
                            ],
                        )?;
                        (co, conv_dim)
                    } else {
                        d.launch(
                            "conv_silu",
                            ((conv_dim as u32).div_ceil(128), 1, 1),
                            (128, 1, 1),
                            0,
                            &[
                                Arg::Ptr(proj),
                                i(p),
                                Arg::Ptr(cst.ptr()),
                                Arg::Ptr(conv.ptr()),
                                i(t),
                                i(conv_dim),
                                i(c.linear_conv_kernel),
                            ],
                        )?;
                        (proj, p)
                    };
                    let rows_q = (t * nk) as u32;
                    d.launch(
                        "l2norm_heads",
                        (rows_q.div_ceil(8), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Arg::Ptr(qkv),
                            i(t),
                            i(nk),
                            i(dk),
                            i(qkv_stride),
                            f(1.0 / (dk as f32).sqrt()),
                            f(1e-6),
                        ],
                    )?;
                    d.launch(
                        "l2norm_heads",
                        (rows_q.div_ceil(8), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Arg::Ptr(qkv + (key_dim * F) as u64),
                            i(t),
                            i(nk),
                            i(dk),
                            i(qkv_stride),
                            f(1.0),
                            f(1e-6),
                        ],
                    )?;
                    let g = sc.get(d, "g", t * nv * F)?;
                    let beta = sc.get(d, "beta", t * nv * F)?;
                    let a_off = conv_dim + vdim;
                    d.launch(
                        "gdn_gates",
                        (((t * nv) as u32).div_ceil(256), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Arg::Ptr(proj),
                            i(p),
                            i(a_off),
                            i(a_off + nv),
                            Arg::Ptr(a_log.ptr()),
                            Arg::Ptr(dt_bias.ptr()),
                            Arg::Ptr(g),
                            Arg::Ptr(beta),
                            i(t),
                            i(nv),
                        ],
                    )?;
                    let o = sc.get(d, "gdn_o", t * vdim * F)?;
                    self.gdn_recurrence(sc, qkv, qkv_stride, g, beta, s.ptr(), o, t)?;
                    let o2 = sc.get(d, "gdn_o2", t * vdim * F)?;
                    d.launch(
                        "gated_rmsnorm",
                        (((t * nv) as u32).div_ceil(8), 1, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Arg::Ptr(o),
                            Arg::Ptr(proj + (conv_dim * F) as u64),
                            i(p),
                            Arg::Ptr(norm.ptr()),
                            Arg::Ptr(o2),
                            i(t),
                            i(nv),
                            i(dv),
                            f(c.rms_norm_eps),
                        ],
                    )?;
                    self.linear(sc, o2, t, out_proj, mixed, false)?;
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
                    let proj = sc.get(d, "proj", t * p * F)?;
                    self.linear(sc, n, t, pw, proj, false)?;
                    let q = sc.get(d, "q", t * nh * hd * F)?;
                    d.launch(
                        if self.kv_f32 {
                            "attn_prep_f32"
                        } else {
                            "attn_prep_bf16"
                        },
                        (t as u32, (nh + nkv) as u32, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Arg::Ptr(proj),
                            i(p),
                            Arg::Ptr(q_norm.ptr()),
                            Arg::Ptr(k_norm.ptr()),
                            Arg::Ptr(q),
                            Arg::Ptr(k.ptr()),
                            Arg::Ptr(v.ptr()),
                            i(nh),
                            i(nkv),
                            i(hd),
                            i(c.rotary_dim),
                            i(pos0),
                            Arg::Ptr(0),
                            f(c.rope_theta as f32),
                            f(c.rms_norm_eps),
                        ],
                    )?;
                    let queries = t * nh;
                    if fast && t >= 32 && hd % 4 == 0 && hd <= 256 && nh % nkv == 0 {
                        let ao = sc.get(d, "att_o", queries * hd * F)?;
                        // Tensor cores where the kernel supports the shape, else CUDA cores.
                        let tc =
                            self.attn_prefill_tc(sc, q, k.ptr(), v.ptr(), proj, p, ao, t, pos0)?;
                        if !tc {
                            self.attn_prefill_cuda_cores(
                                q,
                                k.ptr(),
                                v.ptr(),
                                proj,
                                p,
                                ao,
                                t,
                                pos0,
                            )?;
                        }
                        self.linear(sc, ao, t, o_proj, mixed, false)?;
                    } else {
                        let lmax = pos0 + t;
                        let nsplit = if queries >= 128 {
                            1
                        } else {
                            (264usize.div_ceil(queries)).min(lmax.div_ceil(256)).max(1)
                        };
                        let chunk = lmax.div_ceil(nsplit);
                        let po = sc.get(d, "att_po", queries * nsplit * hd * F)?;
                        let pml = sc.get(d, "att_pml", queries * nsplit * 2 * F)?;
                        d.launch(
                            if self.kv_f32 {
                                "attn_partial_f32"
                            } else {
                                "attn_partial_bf16"
                            },
                            (queries as u32, nsplit as u32, 1),
                            (128, 1, 1),
                            0,
                            &[
                                Arg::Ptr(q),
                                Arg::Ptr(k.ptr()),
                                Arg::Ptr(v.ptr()),
                                Arg::Ptr(po),
                                Arg::Ptr(pml),
                                i(nh),
                                i(nkv),
                                i(hd),
                                i(pos0),
                                Arg::Ptr(0),
                                i(chunk),
                                i(nsplit),
                                f(1.0 / (hd as f32).sqrt()),
                            ],
                        )?;
                        let ao = sc.get(d, "att_o", queries * hd * F)?;
                        d.launch(
                            "attn_combine",
                            (queries as u32, 1, 1),
                            (256, 1, 1),
                            0,
                            &[
                                Arg::Ptr(po),
                                Arg::Ptr(pml),
                                Arg::Ptr(proj),
                                i(p),
                                Arg::Ptr(ao),
                                i(nh),
                                i(hd),
                                i(nsplit),
                            ],
                        )?;
                        self.linear(sc, ao, t, o_proj, mixed, false)?;
                    }
                }
                _ => bail!("layer state does not match the layer kind"),
            }
            let nel = t * h;
            d.launch(
                "add_inplace",
                ((nel as u32).div_ceil(256), 1, 1),
                (256, 1, 1),
                0,
                &[Arg::Ptr(x), Arg::Ptr(mixed), Arg::I64(nel as i64)],
            )?;
            self.rmsnorm(x, h, &layer.post_norm, n, h, t, h)?;
            match &layer.mlp {
                DMlp::Dense { gate_up, down } => {
                    let inter = down.cols;
                    let gu = sc.get(d, "gu", t * 2 * inter * F)?;
                    self.linear(sc, n, t, gate_up, gu, false)?;
                    let act = sc.get(d, "act", t * inter * F)?;
                    d.launch(
                        "silu_mul",
                        ((inter as u32).div_ceil(256), t as u32, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Arg::Ptr(gu),
                            i(2 * inter),
                            i(0),
                            i(inter),
                            Arg::Ptr(act),
                            i(inter),
                            i(t),
                        ],
                    )?;
                    self.linear(sc, act, t, down, x, true)?;
                }
                DMlp::Moe {
                    input,
                    gate_up,
                    down,
                    shared_down,
                } => {
                    let (e, k, inter, sh) = mlp_dims(c);
                    let p = input.rows;
                    let inp = sc.get(d, "moe_in", t * p * F)?;
                    self.linear(sc, n, t, input, inp, false)?;
                    // Shared expert, gated.
                    let act_s = sc.get(d, "act_s", t * sh * F)?;
                    d.launch(
                        "silu_mul",
                        ((sh as u32).div_ceil(256), t as u32, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Arg::Ptr(inp),
                            i(p),
                            i(e + 1),
                            i(e + 1 + sh),
                            Arg::Ptr(act_s),
                            i(sh),
                            i(t),
                        ],
                    )?;
                    self.linear(sc, act_s, t, shared_down, mixed, false)?;
                    d.launch(
                        "add_sigmoid_scaled",
                        ((h as u32).div_ceil(256), t as u32, 1),
                        (256, 1, 1),
                        0,
                        &[
                            Arg::Ptr(x),
                            Arg::Ptr(mixed),
                            Arg::Ptr(inp + (e * F) as u64),
                            i(p),
                            i(t),
                            i(h),
                        ],
                    )?;
                    // Router.
                    let idx = sc.get(d, "moe_idx", t * k * 4)?;
                    let wts = sc.get(d, "moe_w", t * k * F)?;
                    if fast {
                        d.launch(
                            "router_topk_warp",
                            ((t as u32).div_ceil(8), 1, 1),
                            (256, 1, 1),
                            0,
                            &[
                                Arg::Ptr(inp),
                                i(p),
                                i(e),
                                i(k),
                                i(t),
                                Arg::Ptr(idx),
                                Arg::Ptr(wts),
                            ],
                        )?;
                    } else {
                        d.launch(
                            "router_topk",
                            (t as u32, 1, 1),
                            (256, 1, 1),
                            0,
                            &[
                                Arg::Ptr(inp),
                                i(p),
                                i(e),
                                i(k),
                                Arg::Ptr(idx),
                                Arg::Ptr(wts),
                            ],
                        )?;
                    }
                    if t == 1 {
                        let gu = sc.get(d, "gu", k * 2 * inter * F)?;
                        d.launch(
                            "moe_gemv_gate_up",
                            (((2 * inter) as u32).div_ceil(8), k as u32, 1),
                            (256, 1, 1),
                            0,
                            &[
                                Arg::Ptr(gate_up.ptr()),
                                Arg::Ptr(n),
                                Arg::Ptr(idx),
                                Arg::Ptr(gu),
                                i(2 * inter),
                                i(h),
                            ],
                        )?;
                        let act = sc.get(d, "act", k * inter * F)?;
                        d.launch(
                            "silu_mul",
                            ((inter as u32).div_ceil(256), k as u32, 1),
                            (256, 1, 1),
                            0,
                            &[
                                Arg::Ptr(gu),
                                i(2 * inter),
                                i(0),
                                i(inter),
                                Arg::Ptr(act),
                                i(inter),
                                i(k),
                            ],
                        )?;
                        d.launch(
                            "moe_gemv_down",
                            ((h as u32).div_ceil(8), 1, 1),
                            (256, 1, 1),
                            0,
                            &[
                                Arg::Ptr(down.ptr()),
                                Arg::Ptr(act),
                                Arg::Ptr(idx),
                                Arg::Ptr(wts),
                                Arg::Ptr(x),
                                i(k),
                                i(h),
                                i(inter),
                            ],
                        )?;
                    } else if fast && self.gemm == GemmPath::CublasSplit {
                        let io = MoeIo {
                            n,
                            x,
                            idx,
                            wts,
                            bad: bad_words + 4 * planned as u64,
                        };
                        if self.moe_grouped_device(sc, t, e, k, inter, io, gate_up, down)? {
                            (planned, experts) = (planned + 1, e);
                        }
                    } else {
                        self.moe_grouped(sc, t, e, k, inter, n, x, idx, wts, gate_up, down)?;
                    }
                }
            }
        }
        // Final norm of the last token only.
        let last = x + ((t - 1) * h * F) as u64;
        let nf = sc.get(d, "final", h * F)?;
        self.rmsnorm(last, h, &self.norm, nf, h, 1, h)?;
        if planned > 0 {
            let mut bad = vec![0i32; planned];
            d.dtoh(&mut bad, bad_words)?;
            if let Some(&b) = bad.iter().find(|&&b| b != 0) {
                return Err(router_out_of_range(b, experts));
            }
        }
        seq.pos += t;
        Ok(nf)
    }

    /// Prefill experts with the plan built on the device (`moe_plan_*`: entries
    /// sorted by expert, tokens ascending within one): one gather + hi/lo split of
    /// all `t * k` rows, the grouped split GEMMs over `moe_plan_tiles`' tile
    /// table (nothing comes back to the host: the grid is the most tiles the
    /// plan can need, and the out-of-range count lands in `io.bad`), one
    /// SiLU*up + split, and `moe_combine` adding each token's `k` outputs in
    /// ascending expert order (as `moe_grouped`'s per-expert scatter-adds do).
    /// Where the grouped kernels do not fit the shapes, per-expert cuBLAS
    /// calls on the counts copied back. Needs `GemmPath::CublasSplit`.
    /// `Ok(true)` when the plan stayed on the device (`io.bad` written).
    #[allow(clippy::too_many_arguments)]
    fn moe_grouped_device(
        &self,
        sc: &mut Scratch,
        t: usize,
        e: usize,
        k: usize,
        inter: usize,
        io: MoeIo,
        gate_up: &DBuf,
        down: &DBuf,
    ) -> Result<bool> {
        let d = &self.dev;
        let h = self.cfg.hidden_size;
        let MoeIo {
            n,
            x,
            idx,
            wts,
            bad,
        } = io;
        let nn = t * k;
        let counts = sc.get(d, "plan_counts", (e + 1) * 4)?;
        d.launch(
            "moe_plan_count",
            ((e + 1) as u32, 1, 1),
            (256, 1, 1),
            0,
            &[Arg::Ptr(idx), i(nn), i(e), Arg::Ptr(counts)],
        )?;
        let pr = sc.get(d, "plan_rows", nn * 4)?;
        let slot = sc.get(d, "plan_slot", nn * 4)?;
        d.launch(
            "moe_plan_place",
            (e as u32, 1, 1),
            (256, 1, 1),
            0,
            &[
                Arg::Ptr(idx),
                i(nn),
                i(k),
                i(e),
                Arg::Ptr(counts),
                Arg::Ptr(pr),
                Arg::Ptr(slot),
            ],
        )?;
        let plan = if self.grouped_moe && h.is_multiple_of(MG_BK) && inter.is_multiple_of(MG_BK) {
            // 128-row tiles once experts average that many rows, were every
            // expert busy (the counts stay on the device).
            let bm = if nn / e.min(nn) >= 128 { 128 } else { 64 };
            let most = moe_max_tiles(nn, e, bm);
            if most > 65_535 {
                bail!("{most} expert row tiles exceed the grid's 65,535");
            }
            let tiles = sc.get(d, "moe_tiles", (1 + 3 * most) * 4)?;
            d.launch(
                "moe_plan_tiles",
                (1, 1, 1),
                (256, 1, 1),
                0,
                &[
                    Arg::Ptr(counts),
                    i(e),
                    i(bm),
                    i(nn),
                    Arg::Ptr(tiles),
                    Arg::Ptr(pr),
                    Arg::Ptr(bad),
                ],
            )?;
            MoePlan::Tiles {
                buf: tiles,
                most: most as u32,
                bm,
            }
        } else {
            let mut hc = vec![0i32; e + 1];
            d.dtoh(&mut hc, counts)?;
            if hc[e] != 0 {
                return Err(router_out_of_range(hc[e], e));
            }
            hc.truncate(e);
            MoePlan::Counts(hc)
        };
        // hi | lo bf16 halves of the gathered rows; reused for the f32 expert outputs.
        let xs = sc.get(d, "moe_xs", nn * h * F)?;
        let (hi, lo) = (xs, xs + (nn * h * B) as u64);
        d.launch(
            "gather_split_bf16",
            (nn as u32, 1, 1),
            (256, 1, 1),
            0,
            &[
                Arg::Ptr(n),
                i(h),
                Arg::Ptr(pr),
                Arg::I64(nn as i64),
                i(h),
                Arg::Ptr(hi),
                Arg::Ptr(lo),
            ],
        )?;
        // y (f32, rows in plan order) = a (hi + lo) W_e^T per expert.
        let experts = |a_hi: u64, a_lo: u64, w: &DBuf, y: u64, rows: usize, cols: usize| match &plan
        {
            MoePlan::Tiles { buf, most, bm } => {
                let (name, smem, bn) =
                    moe_gemm_kernel(*bm, d.wgmma(), self.moe_wg_cols, self.moe_k64, cols);
                d.launch(
                    name,
                    (rows.div_ceil(bn) as u32, *most, 1),
                    (2 * *bm as u32, 1, 1),
                    smem as u32,
                    &[
                        Arg::Ptr(a_hi),
                        Arg::Ptr(a_lo),
                        Arg::Ptr(w.ptr()),
                        Arg::I64((rows * cols) as i64),
                        Arg::Ptr(*buf),
                        Arg::Ptr(y),
                        i(rows),
                        i(cols),
                    ],
                )
            }
            MoePlan::Counts(hc) => {
                let mut start = 0;
                for (ex, &cnt) in hc.iter().enumerate() {
                    let cnt = cnt as usize;
                    if cnt == 0 {
                        continue;
                    }
                    let w = w.at(ex * rows * cols * B);
                    let y = y + (start * rows * F) as u64;
                    d.gemm_bf16(
                        a_hi + (start * cols * B) as u64,
                        w,
                        y,
                        cnt,
                        rows,
                        cols,
                        false,
                    )?;
                    d.gemm_bf16(
                        a_lo + (start * cols * B) as u64,
                        w,
                        y,
                        cnt,
                        rows,
                        cols,
                        true,
                    )?;
                    start += cnt;
                }
                Ok(())
            }
        };
        let gu = sc.get(d, "gu", nn * 2 * inter * F)?;
        experts(hi, lo, gate_up, gu, 2 * inter, h)?;
        let ah = sc.get(d, "moe_act", nn * inter * 2 * B)?;
        let al = ah + (nn * inter * B) as u64;
        d.launch(
            "silu_mul_split",
            (nn as u32, 1, 1),
            (256, 1, 1),
            0,
            &[
                Arg::Ptr(gu),
                Arg::I64(nn as i64),
                i(inter),
                Arg::Ptr(ah),
                Arg::Ptr(al),
            ],
        )?;
        let ye = xs;
        experts(ah, al, down, ye, h, inter)?;
        d.launch(
            "moe_combine",
            (t as u32, 1, 1),
            (256, 1, 1),
            0,
            &[
                Arg::Ptr(ye),
                Arg::Ptr(idx),
                Arg::Ptr(wts),
                Arg::Ptr(slot),
                i(t),
                i(k),
                i(e),
                i(h),
                Arg::Ptr(x),
            ],
        )?;
        Ok(matches!(plan, MoePlan::Tiles { .. }))
    }

    /// Prefill experts: route on the device, copy the plan back, then per expert
    /// gather its tokens, two GEMMs, and a weighted scatter-add into the residual.
    #[allow(clippy::too_many_arguments)]
    fn moe_grouped(
        &self,
        sc: &mut Scratch,
        t: usize,
        e: usize,
        k: usize,
        inter: usize,
        n: u64,
        x: u64,
        idx: u64,
        wts: u64,
        gate_up: &DBuf,
        down: &DBuf,
    ) -> Result<()> {
        let d = &self.dev;
        let h = self.cfg.hidden_size;
        let mut hidx = vec![0i32; t * k];
        let mut hw = vec![0f32; t * k];
        d.dtoh(&mut hidx, idx)?;
        d.dtoh(&mut hw, wts)?;
        let mut rows: Vec<Vec<(i32, f32)>> = vec![Vec::new(); e];
        for (j, (&ex, &w)) in hidx.iter().zip(&hw).enumerate() {
            if ex < 0 || ex as usize >= e {
                bail!("router produced expert {ex} (of {e}): non-finite activations?");
            }
            rows[ex as usize].push(((j / k) as i32, w));
        }
        let mut plan_rows = Vec::with_capacity(t * k);
        let mut plan_w = Vec::with_capacity(t * k);
        let mut spans = Vec::new();
        for (ex, r) in rows.iter().enumerate() {
            if r.is_empty() {
                continue;
            }
            spans.push((ex, plan_rows.len(), r.len()));
            plan_rows.extend(r.iter().map(|p| p.0));
            plan_w.extend(r.iter().map(|p| p.1));
        }
        let pr = sc.get(d, "plan_rows", plan_rows.len() * 4)?;
        let pw = sc.get(d, "plan_w", plan_w.len() * F)?;
        d.htod(pr, &plan_rows)?;
        d.htod(pw, &plan_w)?;
        let maxn = spans.iter().map(|s| s.2).max().unwrap_or(0);
        let xe = sc.get(d, "xe", maxn * h * F)?;
        let gu = sc.get(d, "gu", maxn * 2 * inter * F)?;
        let act = sc.get(d, "act", maxn * inter * F)?;
        let ye = sc.get(d, "ye", maxn * h * F)?;
        for (ex, start, cnt) in spans {
            let r = pr + (start * 4) as u64;
            let w = pw + (start * F) as u64;
            d.launch(
                "gather_rows",
                ((h as u32).div_ceil(256), cnt as u32, 1),
                (256, 1, 1),
                0,
                &[Arg::Ptr(n), i(h), Arg::Ptr(r), i(cnt), i(h), Arg::Ptr(xe)],
            )?;
            self.linear_raw(
                sc,
                xe,
                cnt,
                gate_up.at(ex * 2 * inter * h * B),
                2 * inter,
                h,
                gu,
                false,
            )?;
            d.launch(
                "silu_mul",
                ((inter as u32).div_ceil(256), cnt as u32, 1),
                (256, 1, 1),
                0,
                &[
                    Arg::Ptr(gu),
                    i(2 * inter),
                    i(0),
                    i(inter),
                    Arg::Ptr(act),
                    i(inter),
                    i(cnt),
                ],
            )?;
            self.linear_raw(
                sc,
                act,
                cnt,
                down.at(ex * h * inter * B),
                h,
                inter,
                ye,
                false,
            )?;
            d.launch(
                "scatter_add_rows",
                ((h as u32).div_ceil(256), cnt as u32, 1),
                (256, 1, 1),
                0,
                &[
                    Arg::Ptr(ye),
                    Arg::Ptr(r),
                    Arg::Ptr(w),
                    i(cnt),
                    i(h),
                    Arg::Ptr(x),
                ],
            )?;
        }
        Ok(())
    }

    fn logits_device(
        &self,
        seq: &mut GpuSequence,
        tokens: &[u32],
        sc: &mut Scratch,
    ) -> Result<u64> {
        self.check_tokens(seq, tokens)?;
        sc.last_logits = None;
        let logits = if tokens.len() == 1 && self.fused_decode {
            self.decode_step(seq, tokens[0])?.0
        } else {
            let nf = self.run_passes(seq, tokens, sc)?;
            let logits = sc.get(&self.dev, "logits", self.cfg.vocab_size * F)?;
            self.linear(sc, nf, 1, self.lm_head(), logits, false)?;
            logits
        };
        sc.last_logits = Some((seq.id, seq.pos, logits));
        Ok(logits)
    }

    /// Runs `tokens` (checked) in passes of at most [`PREFILL_CHUNK`]: bounded
    /// work buffers, and every grid's y dimension (tokens) stays under the
    /// 65,535 launch limit. The KV slab is grown for all of them first: one
    /// allocation instead of a doubling per pass, each of which copies the
    /// rows so far and holds the old slab and the new one at once.
    fn run_passes(&self, seq: &mut GpuSequence, tokens: &[u32], sc: &mut Scratch) -> Result<u64> {
        self.init_sequence(seq)?;
        self.reserve(seq, seq.pos + tokens.len())?;
        let mut nf = 0;
        for chunk in tokens.chunks(PREFILL_CHUNK) {
            nf = self.run(seq, chunk, sc)?;
        }
        Ok(nf)
    }

    /// Launches the head of `logits` (kernels/sampling.cu): `HEAD_WORDS`
    /// words at the returned buffer, followed by `extra` bytes for the caller.
    fn read_head(&self, sc: &mut Scratch, logits: u64, extra: usize) -> Result<u64> {
        let n = self.cfg.vocab_size;
        let parts = n.div_ceil(TOP_PER_PART);
        let keys = sc.get(&self.dev, "top_parts", parts * TOP_KEYS * 8)?;
        let ms = sc.get(&self.dev, "top_ms", parts * 2 * F)?;
        let out = sc.get(&self.dev, "top_out", HEAD_WORDS * 8 + extra)?;
        self.dev.launch(
            "logits_top_part",
            (parts as u32, 1, 1),
            (1024, 1, 1),
            0,
            &[
                Arg::Ptr(logits),
                i(n),
                i(TOP_PER_PART),
                Arg::Ptr(keys),
                Arg::Ptr(ms),
            ],
        )?;
        self.dev.launch(
            "logits_top_merge",
            (1, 1, 1),
            (1024, 1, 1),
            0,
            &[Arg::Ptr(keys), Arg::Ptr(ms), i(parts), Arg::Ptr(out)],
        )?;
        Ok(out)
    }

    fn check_tokens(&self, seq: &GpuSequence, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            bail!("forward needs at least one token");
        }
        let c = &self.cfg;
        for &t in tokens {
            if t as usize >= c.vocab_size {
                bail!(
                    "token id {t} is out of range (vocabulary size {})",
                    c.vocab_size
                );
            }
        }
        if seq.pos + tokens.len() > c.max_position_embeddings.min(self.max_len) {
            bail!(
                "sequence of {} tokens exceeds the context limit {}",
                seq.pos + tokens.len(),
                c.max_position_embeddings.min(self.max_len)
            );
        }
        Ok(())
    }
}

impl Backend for GpuModel {
    type Sequence = GpuSequence;

    #[cfg(feature = "cuda")]
    fn name(&self) -> &'static str {
        "cuda"
    }

    #[cfg(all(feature = "hip", not(feature = "cuda")))]
    fn name(&self) -> &'static str {
        "hip"
    }

    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    fn new_sequence(&self) -> GpuSequence {
        GpuSequence {
            id: next_sequence_id(),
            pos: 0,
            layers: Vec::new(),
            gdn: None,
            kv: None,
            adopted_kv: false,
        }
    }

    fn position(&self, seq: &GpuSequence) -> usize {
        seq.pos
    }

    fn forward(&self, seq: &mut GpuSequence, tokens: &[u32]) -> Result<Vec<f32>> {
        let mut sc = self.scratch.lock().unwrap();
        self.dev.bind()?;
        let logits = self.logits_device(seq, tokens, &mut sc)?;
        let mut out = vec![0f32; self.cfg.vocab_size];
        self.dev.dtoh(&mut out, logits)?;
        Ok(out)
    }

    /// The greedy token and its log-probability computed on the device
    /// (argmax and log-sum-exp of the logits buffer): 12 bytes come back, not
    /// the logits.
    fn forward_greedy(&self, seq: &mut GpuSequence, tokens: &[u32]) -> Result<Sampled> {
        let mut sc = self.scratch.lock().unwrap();
        self.dev.bind()?;
        if tokens.len() == 1 && self.fused_decode {
            self.check_tokens(seq, tokens)?;
            let (logits, st) = self.decode_step(seq, tokens[0])?;
            sc.last_logits = Some((seq.id, seq.pos, logits));
            let mut out = [0f32; 3];
            self.dev.dtoh(&mut out, st)?;
            return greedy_sampled(out, self.cfg.vocab_size);
        }
        let logits = self.logits_device(seq, tokens, &mut sc)?;
        let st = sc.get(&self.dev, "stats", 16)?;
        self.dev.launch(
            "logits_stats",
            (1, 1, 1),
            (1024, 1, 1),
            0,
            &[Arg::Ptr(logits), i(self.cfg.vocab_size), Arg::Ptr(st)],
        )?;
        let mut out = [0f32; 3];
        self.dev.dtoh(&mut out, st)?;
        greedy_sampled(out, self.cfg.vocab_size)
    }

    /// The head of the logits read on the device (kernels/sampling.cu): 64
    /// keys and two floats come back instead of the row.
    fn forward_top(&self, seq: &mut GpuSequence, tokens: &[u32], k: usize) -> Result<TopLogits> {
        check_head(k)?;
        let mut sc = self.scratch.lock().unwrap();
        self.dev.bind()?;
        let logits = self.logits_device(seq, tokens, &mut sc)?;
        let out = self.read_head(&mut sc, logits, 0)?;
        let mut head = [0u64; HEAD_WORDS];
        self.dev.dtoh(&mut head, out)?;
        Ok(head_of(&head, k.min(self.cfg.vocab_size)))
    }

    /// The row weighted on the device (kernels/sampling.cu `logits_weights`,
    /// the host sampler's block sums bit for bit): the head and the block
    /// sums come back in one copy, then what `plan` asks for (one block's 64
    /// logits, or nothing, or the row).
    fn forward_weighted(
        &self,
        seq: &mut GpuSequence,
        tokens: &[u32],
        w: Weighting,
        plan: &mut RowPlanner,
    ) -> Result<WeightedRow> {
        check_head(w.head)?;
        let mut sc = self.scratch.lock().unwrap();
        self.dev.bind()?;
        let logits = self.logits_device(seq, tokens, &mut sc)?;
        let n = self.cfg.vocab_size;
        let nb = n.div_ceil(WEIGHT_BLOCK);
        // One thread per block of 64 logits, 256 per launch block; then a
        // heavy-token count per warp (two to an 8-byte word).
        let grid = nb.div_ceil(256);
        let warps = grid * 256 / 32;
        let out = self.read_head(&mut sc, logits, nb * 8 + warps * 4)?;
        let blocks = out + (HEAD_WORDS * 8) as u64;
        let heavy = blocks + (nb * 8) as u64;
        self.dev.launch(
            "logits_weights",
            (grid as u32, 1, 1),
            (256, 1, 1),
            0,
            &[
                Arg::Ptr(logits),
                i(n),
                Arg::Ptr(out),
                f(w.temperature),
                f(w.min_p),
                Arg::Ptr(blocks),
                Arg::Ptr(heavy),
            ],
        )?;
        let mut all = vec![0u64; HEAD_WORDS + nb + warps.div_ceil(2)];
        self.dev.dtoh(&mut all, out)?;
        let head = head_of(&all[..HEAD_WORDS], w.head.min(n));
        let sums: Vec<f64> = all[HEAD_WORDS..HEAD_WORDS + nb]
            .iter()
            .map(|&b| f64::from_bits(b))
            .collect();
        let heavy_words = &all[HEAD_WORDS + nb..];
        let heavy: usize = (0..warps)
            .map(|k| (heavy_words[k / 2] >> (32 * (k % 2))) as u32 as usize)
            .sum();
        let read = plan(
            &head,
            RowSums {
                blocks: &sums,
                heavy,
            },
        );
        let (start, len) = match read {
            RowRead::Head => (0, 0),
            RowRead::Block(b) => {
                let start = (b * WEIGHT_BLOCK).min(n);
                (start, WEIGHT_BLOCK.min(n - start))
            }
            RowRead::Whole => (0, n),
        };
        let mut row = vec![0f32; len];
        self.dev.dtoh(&mut row, logits + (start * F) as u64)?;
        Ok(WeightedRow {
            head,
            read,
            logits: row,
        })
    }

    fn logits_on_device(&self) -> bool {
        true
    }

    /// The logits buffer of the last `forward*` when it ran on `seq` and
    /// nothing ran on `seq` since (its position unchanged).
    fn last_logits(&self, seq: &GpuSequence) -> Option<Vec<f32>> {
        let sc = self.scratch.lock().unwrap();
        let (id, pos, ptr) = sc.last_logits?;
        if id != seq.id || pos != seq.pos {
            return None;
        }
        self.dev.bind().ok()?;
        let mut out = vec![0f32; self.cfg.vocab_size];
        self.dev.dtoh(&mut out, ptr).ok()?;
        Some(out)
    }

    fn extend(&self, seq: &mut GpuSequence, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            bail!("extend needs at least one token");
        }
        self.check_tokens(seq, tokens)?;
        let mut sc = self.scratch.lock().unwrap();
        self.dev.bind()?;
        self.run_passes(seq, tokens, &mut sc).map(|_| ())
    }

    /// A device copy of the GDN states (66 MB for the 35B model, one
    /// allocation) and a shared reference to the KV slab. `None` when the copy
    /// cannot be allocated.
    fn snapshot(&self, seq: &GpuSequence) -> Option<Box<dyn SeqSnapshot>> {
        let (Some(gdn), Some(kv)) = (&seq.gdn, &seq.kv) else {
            return None; // nothing run yet
        };
        let _guard = self.scratch.lock().unwrap();
        self.dev.bind().ok()?;
        let copy = self.dev.alloc(gdn.bytes()).ok()?;
        self.dev.dtod(copy.ptr(), gdn.ptr(), gdn.bytes()).ok()?;
        // From now on no one may write the slab's rows below `pos`.
        kv.slab().ownership().seal(seq.pos);
        Some(Box::new(GpuSnapshot {
            pos: seq.pos,
            kv_f32: self.kv_f32,
            layers: self.seq_layers(copy.ptr(), Some(kv.slab())),
            gdn: copy,
            kv: kv.slab().clone(),
        }))
    }

    /// From a device snapshot: a copy of its GDN states, and its KV slab
    /// itself when no one else can see what the sequence appends
    /// ([`seq_state::KvOwnership`]), otherwise a copy of its rows. From its
    /// host copy ([`Backend::demote`]): uploads. A copied KV slab has room
    /// for the turn that follows, so resuming does not begin by doubling and
    /// copying the whole KV cache.
    fn restore(&self, snap: &dyn SeqSnapshot) -> Option<GpuSequence> {
        let any = snap.as_any();
        let (device, host) = (
            any.downcast_ref::<GpuSnapshot>(),
            any.downcast_ref::<GpuHostSnapshot>(),
        );
        // Only a snapshot of this model's geometry and KV precision.
        let attn = self.count_layers(LayerKind::Full);
        let (pos, kv_f32, gdn_bytes, same_kv) = match (device, host) {
            (Some(s), _) => (
                s.pos,
                s.kv_f32,
                s.gdn.bytes(),
                s.layers.len() == self.cfg.num_layers(),
            ),
            (_, Some(h)) => {
                let rows = h.pos * self.kv_row_bytes();
                let rows_ok = h.kv.iter().all(|(k, v)| k.len() == rows && v.len() == rows);
                (h.pos, h.kv_f32, h.gdn.len(), h.kv.len() == attn && rows_ok)
            }
            _ => return None,
        };
        let layout = self.gdn_layout();
        if kv_f32 != self.kv_f32 || gdn_bytes != layout.bytes() || !same_kv {
            return None;
        }
        let _guard = self.scratch.lock().unwrap();
        self.dev.bind().ok()?;
        let d = &self.dev;
        let gdn = d.alloc(layout.bytes()).ok()?;
        // Its layers' spans come with its KV slab (set_kv below).
        let mut seq = GpuSequence {
            gdn: Some(gdn),
            pos,
            ..self.new_sequence()
        };
        let gdn = seq.gdn.as_ref()?.ptr();
        if let Some(s) = device {
            d.dtod(gdn, s.gdn.ptr(), layout.bytes()).ok()?;
            if let Some(kv) = KvWriter::adopt(&s.kv, pos) {
                self.set_kv(&mut seq, kv);
                seq.adopted_kv = true;
            } else {
                let slab = self.alloc_kv(kv_capacity(pos, 0, self.max_len)).ok()?;
                self.set_kv(&mut seq, KvWriter::fresh(slab));
                self.copy_kv_rows(&seq.layers, &s.layers, pos).ok()?;
            }
        } else if let Some(h) = host {
            d.htod(gdn, &h.gdn[..]).ok()?;
            let slab = self.alloc_kv(kv_capacity(pos, 0, self.max_len)).ok()?;
            self.set_kv(&mut seq, KvWriter::fresh(slab));
            let attn = seq.layers.iter().filter_map(|l| match l {
                SeqLayer::Attn { k, v } => Some((k, v)),
                SeqLayer::Gdn { .. } => None,
            });
            for ((k, v), (hk, hv)) in attn.zip(&h.kv) {
                d.htod(k.ptr(), &hk[..]).ok()?;
                d.htod(v.ptr(), &hv[..]).ok()?;
            }
        }
        Some(seq)
    }

    fn resumed_in_place(&self, seq: &GpuSequence) -> bool {
        seq.adopted_kv
    }

    /// A host-memory copy of a device snapshot: the GDN states and the KV
    /// rows it covers (not the slab's spare capacity).
    fn demote(&self, snap: &dyn SeqSnapshot) -> Option<Box<dyn SeqSnapshot>> {
        let snap = snap.as_any().downcast_ref::<GpuSnapshot>()?;
        let _guard = self.scratch.lock().unwrap();
        self.dev.bind().ok()?;
        let rows = snap.pos * self.kv_row_bytes();
        let copy = |ptr: u64, bytes: usize| -> Option<HostBytes> {
            if self.pinned_host_tier
                && let Ok(b) = self.dev.download_pinned(ptr, bytes)
            {
                return Some(HostBytes::Pinned(b));
            }
            let mut v = vec![0u8; bytes];
            self.dev.dtoh(&mut v, ptr).ok()?;
            Some(HostBytes::Pageable(v))
        };
        let gdn = copy(snap.gdn.ptr(), snap.gdn.bytes())?;
        let mut kv = Vec::new();
        for l in &snap.layers {
            if let SeqLayer::Attn { k, v } = l {
                kv.push((copy(k.ptr(), rows)?, copy(v.ptr(), rows)?));
            }
        }
        let bytes = gdn.len() + kv.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        Some(Box::new(GpuHostSnapshot {
            pos: snap.pos,
            kv_f32: snap.kv_f32,
            gdn,
            kv,
            bytes,
        }))
    }
}

/// Host memory of a demoted snapshot: page-locked where the driver grants
/// it, so restoring uploads at the link's speed (pageable uploads are
/// staged by the driver, about 7 GB/s on the H200 host); ordinary memory
/// otherwise, or with `QWASI_HOST_TIER=pageable`.
enum HostBytes {
    Pinned(HostBuf),
    Pageable(Vec<u8>),
}

impl std::ops::Deref for HostBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            HostBytes::Pinned(b) => b,
            HostBytes::Pageable(v) => v,
        }
    }
}

/// A snapshot moved to host memory by the prefix cache's host tier; owns
/// all its bytes: the GDN state allocation as it was on the device, and per
/// attention layer its K and V rows `[0, pos)`.
pub struct GpuHostSnapshot {
    pos: usize,
    kv_f32: bool,
    gdn: HostBytes,
    kv: Vec<(HostBytes, HostBytes)>,
    bytes: usize,
}

impl SeqSnapshot for GpuHostSnapshot {
    fn position(&self) -> usize {
        self.pos
    }
    fn private_bytes(&self) -> usize {
        self.bytes
    }
    fn pages(&self) -> Vec<(u64, usize)> {
        Vec::new()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A sequence at one position: a device copy of its GDN states and a shared
/// reference to its KV slab (whose rows `[0, pos)` no one writes again).
pub struct GpuSnapshot {
    pos: usize,
    kv_f32: bool,
    /// Spans of `gdn` and `kv`, per layer.
    layers: Vec<SeqLayer>,
    gdn: DBuf,
    kv: Arc<KvSlab>,
}

impl SeqSnapshot for GpuSnapshot {
    fn position(&self) -> usize {
        self.pos
    }
    fn private_bytes(&self) -> usize {
        self.gdn.bytes()
    }
    /// The KV slab, one page (by device address: unique while alive), so the
    /// prefix cache counts a slab shared by several snapshots once.
    fn pages(&self) -> Vec<(u64, usize)> {
        vec![self.kv.page()]
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn next_sequence_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Host-side bf16 helper for tests.
pub fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// The device argmax `[token bits, max, log-sum-exp]` as a sampled token.
/// The argmax kernels find no token when every logit is NaN or -inf (a
/// broken hidden state): an error, not a token id past the vocabulary.
fn greedy_sampled(out: [f32; 3], vocab: usize) -> Result<Sampled> {
    let token = out[0].to_bits();
    if token as usize >= vocab {
        bail!("the model produced no finite logit (all NaN or -inf); generation stopped");
    }
    Ok(Sampled {
        token,
        logprob: -out[2],
        top: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_greedy_step_without_a_finite_logit_is_an_error() {
        let ok = greedy_sampled([f32::from_bits(7), 1.5, 0.25], 100).unwrap();
        assert_eq!((ok.token, ok.logprob), (7, -0.25));
        // argmax_final's "nothing found" index.
        let err = greedy_sampled([f32::from_bits(0x7fff_ffff), f32::NEG_INFINITY, 0.0], 100);
        assert!(err.unwrap_err().to_string().contains("no finite logit"));
        assert!(greedy_sampled([f32::from_bits(100), 0.0, 0.0], 100).is_err());
    }

    #[test]
    fn geometries_the_kernels_cannot_run_are_refused_before_any_work() {
        let mut cfg = crate::presets::qwen36_35b_a3b();
        assert!(check_supported(&cfg).is_ok());
        // conv_silu / conv_silu_tokens keep at most 8 taps in registers.
        for taps in [0, 9] {
            cfg.linear_conv_kernel = taps;
            let err = check_supported(&cfg).unwrap_err().to_string();
            assert!(err.contains("conv kernels of 1 to 8 taps"), "{err}");
        }
        cfg.linear_conv_kernel = 8;
        assert!(check_supported(&cfg).is_ok());
        // dec_gdn_step: key heads up to 128, value heads up to 256, whole
        // value heads per key head.
        for (dk, dv, nv, ok) in [
            (128, 256, 32, true),
            (256, 128, 32, false),
            (128, 512, 32, false),
            (128, 128, 24, false),
        ] {
            let mut c = cfg.clone();
            (c.linear_key_head_dim, c.linear_value_head_dim) = (dk, dv);
            c.linear_num_value_heads = nv;
            let got = check_supported(&c);
            assert_eq!(got.is_ok(), ok, "{dk} {dv} {nv}: {got:?}");
            if let Err(e) = got {
                assert!(e.to_string().contains("GDN key heads of up to 128"), "{e}");
            }
        }
        cfg.mlp = MlpConfig::Moe {
            num_experts: 2048,
            top_k: 8,
            intermediate: 512,
            shared_intermediate: 512,
        };
        assert!(check_supported(&cfg).is_err());
    }

    #[test]
    fn expert_gemm_kernels_fit_and_fall_back() {
        // Shared memory within the H100/H200's 227 KB per block; without
        // wgmma, or for 64-row tiles, the mma.sync kernels, k steps of 64
        // for 64-row tiles where k allows.
        for bm in [64, 128] {
            for wgmma in [false, true] {
                for cols in [0, 128, 256] {
                    for (k64, k) in [(false, 2048), (true, 2048), (true, 96)] {
                        let (name, smem, bn) = moe_gemm_kernel(bm, wgmma, cols, k64, k);
                        assert!(smem <= 227 * 1024, "{name}: {smem} bytes");
                        let wg = bm == 128 && wgmma && cols != 0;
                        assert_eq!(
                            name.contains("_wg"),
                            wg,
                            "bm {bm} wgmma {wgmma} cols {cols}"
                        );
                        assert_eq!(bn, if wg { cols } else { MG_BN });
                        let want_k64 = bm == 64 && k64 && k % 64 == 0;
                        assert_eq!(name == "moe_gemm_split_k64", want_k64, "{name}");
                    }
                }
            }
        }
        // moe_gemm_split128_wg's sm_80 stand-in is the mma.sync kernel, so
        // its shared memory must hold that kernel's too.
        let (_, wg, _) = moe_gemm_kernel(128, true, 128, true, 2048);
        let (_, mma, _) = moe_gemm_kernel(128, false, 128, true, 2048);
        assert!(wg >= mma, "{wg} < {mma}");
    }

    #[test]
    fn the_expert_tile_grid_covers_every_plan() {
        // The tiles a plan needs (moe_plan_tiles' count) never exceed the grid.
        let need =
            |counts: &[usize], bm: usize| counts.iter().map(|c| c.div_ceil(bm)).sum::<usize>();
        let mut r = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: usize| {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            (r % m as u64) as usize
        };
        for bm in [64, 128] {
            for &(nn, e) in &[
                (1, 256),
                (8, 256),
                (8192, 256),
                (131_072, 256),
                (300, 4),
                (65, 1),
            ] {
                // Uniform, all on one expert, and one short of a tile on each.
                let mut uniform = vec![0; e];
                for _ in 0..nn {
                    uniform[next(e)] += 1;
                }
                let mut one = vec![0; e];
                one[e - 1] = nn;
                let mut ragged = vec![0; e];
                let mut left = nn;
                for c in ragged.iter_mut() {
                    *c = left.min(bm - 1);
                    left -= *c;
                }
                ragged[0] += left;
                for counts in [uniform, one, ragged] {
                    assert_eq!(counts.iter().sum::<usize>(), nn);
                    assert!(
                        need(&counts, bm) <= moe_max_tiles(nn, e, bm),
                        "{nn} {e} {bm}"
                    );
                }
            }
            // Every expert one row past a full tile: within a few rows of the bound.
            let counts = vec![bm + 1; 256];
            let most = moe_max_tiles(256 * (bm + 1), 256, bm);
            assert!(need(&counts, bm) <= most && most <= need(&counts, bm) + 4);
        }
    }

    #[test]
    fn kv_capacity_leaves_room_doubles_and_stops_at_the_limit() {
        // A fresh 512-token prompt: 4,096 rows of room.
        assert_eq!(kv_capacity(512, 0, 262_144), 4608);
        // Growing: at least double what is there.
        assert_eq!(kv_capacity(4609, 4608, 262_144), 9216);
        // Long prompts: an eighth more.
        assert_eq!(kv_capacity(131_072, 0, 262_144), 147_456);
        // Never past the limit, unless the need itself is.
        assert_eq!(kv_capacity(260_000, 160_000, 262_144), 262_144);
        assert_eq!(kv_capacity(300_000, 0, 262_144), 300_000);
    }
}
