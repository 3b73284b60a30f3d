//! Every switch of the GPU backend, read once from the environment when a
//! model loads ([`GpuOptions::from_env`]). The table of variables, values and
//! defaults is in docs/GPU.md ("Options"); nothing else under
//! `host/engine/src` reads a `QWASI_*` variable at run time.
//!
//! Defaults are the measured fastest paths that pass the fixtures; the other
//! values keep reference or portable paths (for checking, for devices that
//! lack a feature) and A/B comparisons. An unknown value is an error that
//! names the variable and what it takes, not a silent default.

use anyhow::{Result, bail};
use std::sync::OnceLock;

/// How multi-token projections run (`QWASI_GEMM`).
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

/// The precision of prompt passes (`QWASI_PREFILL_PRECISION`, or the
/// commands' `--prefill-precision`; docs/GPU.md "Numerics"). Decode keeps
/// f32 activations either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillPrecision {
    /// Activations split into bf16 hi + lo terms, two products per GEMM and
    /// per attention product (~f32 accuracy: passes the fixtures; the default).
    Split,
    /// Activations rounded to one bf16 term, one product: multi-token cuBLAS
    /// projections, the grouped expert GEMM tiles and the warpgroup prompt
    /// attention (the inference precision of peers that run bf16).
    Bf16,
    /// As `Bf16`, and the multi-token projections (cuBLASLt) and routed
    /// experts (`moe_gemm_wg_q8`) of block-FP8 weights kept on the device
    /// take FP8 activations (a scale per row and 128 columns) on FP8 tensor
    /// cores, as FP8 serving engines run such checkpoints (sm_90; elsewhere,
    /// and for bf16 weights, as `Bf16`).
    Fp8,
}

impl PrefillPrecision {
    /// The values `--prefill-precision` and `QWASI_PREFILL_PRECISION` take
    /// (the default first).
    pub const VALUES: [&'static str; 3] = ["split", "bf16", "fp8"];

    pub fn name(self) -> &'static str {
        match self {
            PrefillPrecision::Split => "split",
            PrefillPrecision::Bf16 => "bf16",
            PrefillPrecision::Fp8 => "fp8",
        }
    }

    /// `what` (the flag or variable) = `v`, or an error naming what it takes.
    pub fn parse(what: &str, v: &str) -> Result<Self> {
        match v {
            "split" => Ok(PrefillPrecision::Split),
            "bf16" => Ok(PrefillPrecision::Bf16),
            "fp8" => Ok(PrefillPrecision::Fp8),
            _ => bail!(
                "{what}={v} is not a known value; {what} takes {}",
                Self::VALUES.join(", ")
            ),
        }
    }
}

/// The command line's `--prefill-precision`, set once before a model loads;
/// it wins over `QWASI_PREFILL_PRECISION` ([`GpuOptions::from_env`]).
static PREFILL_PRECISION_FLAG: OnceLock<PrefillPrecision> = OnceLock::new();

/// Records the command line's `--prefill-precision` for every model this
/// process loads. A second, different value is an error.
pub fn set_prefill_precision(p: PrefillPrecision) -> Result<()> {
    let set = *PREFILL_PRECISION_FLAG.get_or_init(|| p);
    if set != p {
        bail!(
            "--prefill-precision is {} already; one process runs one prompt precision",
            set.name()
        );
    }
    Ok(())
}

/// Decode attention's kernel family (`QWASI_DEC_ATTN`; the plan is
/// `model::attn_decode::dec_attn_plan`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecAttnPath {
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

/// Ring slots per warp of the default decode attention (`dec_attn_*_tc_ring`).
/// H200, 8K / 32K / 131K decode (tok/s): registers 326.3 / 287.4 / 201.2,
/// 2 slots 331.1 / 305.9 / 232.8, 3: 328.4 / 303.0 / 233.8, 4: 322.2 /
/// 286.1 / 198.4 (`benchmarks/history/dec-attn-tc-feeds-h200-13987e6.json`); the logits
/// are bit-identical.
pub const TC_RING: usize = 2;

/// The decode step's dense GEMVs (`QWASI_GEMV`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemvPath {
    /// `dec_gemv_bulk*` (a bulk-copy ring) where the device has bulk copies,
    /// else as `Rows`.
    Bulk,
    /// Residual GEMVs with short rows split between warps (`dec_gemv_rows`,
    /// `dec_moe_down_rows`).
    Rows,
    /// One warp per row (`dec_gemv`, `dec_moe_down`).
    Stream,
}

/// Few-row projections (`QWASI_GEMM_ROWS`): how many rows go through the
/// bulk-copy ring, and whether the few-row kernels run at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowsPath {
    /// As `Bulk`, and 17-32 rows through `gemm_rows_bulk32` (K slices)
    /// instead of cuBLAS: not measured on the H200 yet, so not the default.
    Bulk32,
    /// 2-8 rows through `gemm_rows_bulk`, 9-16 through `gemm_rows_bulk16`
    /// (up to 2,048 columns; `gemm_rows16` past that).
    Bulk,
    /// 2-8 rows through the ring, 9-16 on `gemm_rows16` (register loads).
    Bulk8,
    /// No ring: `gemm_rows8` / `gemm_rows16`.
    Rows,
    /// No few-row kernels: the `QWASI_GEMM` path.
    Cublas,
}

impl RowsPath {
    /// Whether projections of 2..=64 rows take the few-row kernels.
    pub fn few_row_kernels(self) -> bool {
        self != RowsPath::Cublas
    }

    /// The most rows that go through the bulk-copy ring (0: none).
    pub fn bulk_max(self) -> usize {
        match self {
            RowsPath::Bulk32 => 32,
            RowsPath::Bulk => 16,
            RowsPath::Bulk8 => 8,
            RowsPath::Rows | RowsPath::Cublas => 0,
        }
    }
}

/// Which batched steps route and plan their experts in one kernel
/// (`QWASI_MOE_PLAN`). H200, 40-layer synthetic model, against the four
/// kernels: +1.2% at 8 rows, +0.1% at 16, -0.8% at 32, -2.3% at 64
/// (`benchmarks/batch-combine-h200-9382271.json`): one block routes every
/// token, so it pays only while the launches it saves dominate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoePlanPath {
    /// One kernel for up to `MOE_ROUTE_AUTO_MAXT` tokens, four past that.
    Auto,
    /// Always the router and three plan kernels.
    Kernels,
    /// One kernel wherever it applies (up to 64 tokens).
    Fused,
}

/// The most tokens `MoePlanPath::Auto` routes and plans in one kernel.
pub const MOE_ROUTE_AUTO_MAXT: usize = 8;

/// Where a split projection of 17-64 rows runs as one cuBLAS GEMM over the
/// stacked hi and lo rows instead of two GEMMs (`QWASI_GEMM_STACK`). On the
/// H200 the stacked GEMM reads the weights once (batched steps of 32 / 64
/// rows: +7.5% / +5%, 12ea486), but cuBLAS then takes split-K kernels that
/// sum in another order; prompt passes of 17-64 tokens keep two GEMMs, so a
/// prompt's pass rounds alike whatever its length in that range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmStack {
    /// Batched decode steps without prompt chunks (the default).
    Decode,
    Off,
    /// Prompt passes too.
    On,
}

/// Most ring slots of the bulk-copy kernels (`BULK_MAX_STAGES` in kernels/bulk_copy.h).
pub const BULK_MAX_STAGES: usize = 8;

/// Switches of the device layer itself (`QWASI_PDL`, `QWASI_GPU_DEBUG`,
/// `QWASI_GPU_PROFILE`).
pub use super::device::DeviceOptions;

/// The GPU backend's options (docs/GPU.md, "Options").
#[derive(Clone, Debug)]
pub struct GpuOptions {
    /// `QWASI_GEMM=split|bf16|tiled`.
    pub gemm: GemmPath,
    /// `QWASI_PREFILL_PRECISION=split|bf16` (or `--prefill-precision`):
    /// prompt passes on split or single bf16 activations where `gemm` is
    /// `split` (`GemmPath::Cublas` and `Tiled` are their own precisions).
    pub prefill: PrefillPrecision,
    /// `false` with `QWASI_DECODE=unfused`: single tokens take the prefill kernels.
    pub fused_decode: bool,
    /// `false` with `QWASI_PREFILL=reference`: prompts take the first (per-op) kernels.
    pub fast_prefill: bool,
    /// `false` with `QWASI_GDN=serial`: prompts run the token-serial delta rule.
    pub chunked_gdn: bool,
    /// `false` with `QWASI_MOE=cublas` (and in HIP builds): prompt experts run as
    /// per-expert cuBLAS calls instead of one grouped tensor-core kernel per matrix.
    pub grouped_moe: bool,
    /// Columns per block of the warpgroup-MMA expert GEMM for 128-row tiles
    /// (`moe_gemm_split128_wg` 128, `_wg256` 256), on compute capability 9.x;
    /// 0 keeps `mma.sync` (`moe_gemm_split128`). `QWASI_MOE_GEMM=wg256|wg128|mma`.
    pub moe_wg_cols: usize,
    /// k steps of 64 for the 64-row expert tiles (`moe_gemm_split_k64`; few
    /// rows per expert: short prompts, new tokens after a cached prefix);
    /// `false` with `QWASI_MOE_BK64=32` (`moe_gemm_split`, k steps of 32).
    pub moe_k64: bool,
    /// Where a batched step's router and expert plan run in one kernel
    /// (`moe_route_plan`, `model::moe_grouped::moe_route_fused`) instead of
    /// the router and `moe_plan_count`, `_place`, `_tiles` (`QWASI_MOE_PLAN`).
    pub moe_plan: MoePlanPath,
    /// `false` with `QWASI_ATTN=cuda-cores` (and in HIP builds): prompt
    /// attention without tensor cores (`attn_flash_*`).
    pub tc_attention: bool,
    /// Prompt attention on warpgroup MMA (`attn_flash_wg_*`) where it applies
    /// (compute capability 9.x); `false` with `QWASI_ATTN=mma`, which keeps the
    /// `mma.sync` kernel (`attn_flash_tc_*`).
    pub wg_attention: bool,
    /// Stream-K over all multiprocessors for the warpgroup attention when
    /// few row blocks would leave some idle (`QWASI_ATTN_SPLIT=0`: one block
    /// per row block always).
    pub wg_split: bool,
    /// KV cache in f32 (the default: matches the f32 references at every
    /// length) or bf16 (`QWASI_KV=bf16`: half the memory and bandwidth; measured
    /// KL 1.2e-2 vs transformers f32 on a one-token prompt at full width).
    pub kv_f32: bool,
    /// KV caches in pages mapped as they fill where the driver can (the
    /// default, `gpu/model/kv_space.rs`), or (`QWASI_KV_PAGES=0`, and where
    /// the driver cannot map pages) one slab per sequence with room for what
    /// follows, grown by copying.
    pub kv_pages: bool,
    /// Block-FP8 checkpoints keep their quantized matrices on the device as
    /// E4M3 bytes + block scales (the default, half the weight memory) or
    /// upload them dequantized to bf16 (`QWASI_FP8=dequantize`, phase 1's
    /// path, for comparison; docs/FP8.md).
    pub fp8_resident: bool,
    /// `QWASI_DEC_ATTN`: force decode attention's kernel (default: tensor
    /// cores where they apply, see `dec_attn_plan`).
    pub dec_attn: DecAttnPath,
    /// `QWASI_GEMV=bulk|rows|stream`.
    pub gemv: GemvPath,
    /// Ring slots of 32 KB per block of the bulk GEMVs (`QWASI_BULK_STAGES`,
    /// 1..=8, default 4) and blocks per SM (`QWASI_BULK_BLOCKS`, default 1).
    /// On the H200 (8K decode, tok/s): 2 slots 269.8, 3: 282.3, 4: 294.9,
    /// 5: 293.0, 6: 285.4, 7: 276.8; 2 blocks of 3 slots 291.9.
    pub bulk_stages: usize,
    pub bulk_blocks: usize,
    /// The GDN decode conv in the in projection's epilogue
    /// (`dec_gemv_bulk_conv`) where the bulk GEMV applies; `false` with
    /// `QWASI_GDN_CONV=kernel` (its own kernel, `dec_gdn_conv`).
    pub conv_gdn: bool,
    /// Prefix-cache host copies in page-locked memory (`false` with
    /// `QWASI_HOST_TIER=pageable`).
    pub pinned_host_tier: bool,
    /// Decode steps captured and replayed as graphs (`QWASI_GRAPHS=0`: eager).
    pub graphs: bool,
    /// A step's single-token rows of two or more sequences run as one
    /// batched pass (`model/batch.rs`); `QWASI_BATCH=serial` runs each row
    /// through the batch-1 decode step instead.
    pub batch_decode: bool,
    /// Projections of 2..=64 rows (batched decode steps, short prompts) on
    /// the few-row tensor-core kernels (kernels/gemm_rows.cu), up to 16 of
    /// them through a bulk-copy ring where the GPU has bulk copies
    /// (`QWASI_GEMM_ROWS`; [`RowsPath`]).
    pub rows: RowsPath,
    /// Where split projections of 17-64 rows run as one cuBLAS GEMM over
    /// the stacked hi and lo rows, reading the weights once
    /// (`QWASI_GEMM_STACK=decode|off|on`; [`GemmStack`]).
    pub gemm_stack: GemmStack,
    /// Gate/up row pairs per warp of `dec_moe_gate_up` (`QWASI_MOE_PAIRS`,
    /// default 2: on the H200 512/8K decode 333.0/302.5 tok/s against
    /// 320.5/289.4 with 1 and 320.0/289.9 with 4).
    pub moe_pairs: usize,
    /// `QWASI_DEC_SKIP=stage,...`, measurement only (builds with the
    /// `experiments` feature): the decode step leaves these stages out (wrong
    /// tokens), so a benchmark shows what each costs inside the graph:
    /// in_proj (with the conv where it is folded in), gdn_prep (the conv
    /// kernel otherwise), gdn_step, out_proj, attn_proj, attn_prep, attn,
    /// attn_combine, o_proj, moe_input, moe_gate_up, moe_down, lm_head.
    #[cfg(feature = "experiments")]
    pub dec_skip: Vec<String>,
    pub device: DeviceOptions,
}

/// The decode stages `QWASI_DEC_SKIP` names (`none`: the whole step, a baseline).
#[cfg(feature = "experiments")]
const DEC_STAGES: &[&str] = &[
    "none",
    "in_proj",
    "gdn_prep",
    "gdn_step",
    "out_proj",
    "attn_proj",
    "attn_prep",
    "attn",
    "attn_combine",
    "o_proj",
    "moe_input",
    "moe_gate_up",
    "moe_down",
    "lm_head",
];

impl GpuOptions {
    /// The options from the process environment.
    /// The command line's `--prefill-precision` ([`set_prefill_precision`])
    /// stands in for `QWASI_PREFILL_PRECISION`.
    pub fn from_env() -> Result<Self> {
        let flag = PREFILL_PRECISION_FLAG.get().map(|p| p.name().to_string());
        Self::parse(|k| match k {
            "QWASI_PREFILL_PRECISION" if flag.is_some() => flag.clone(),
            _ => std::env::var(k).ok(),
        })
    }

    /// The options from `get` (a variable's value, `None` when unset; an
    /// empty value counts as unset).
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let var = |k: &str| get(k).filter(|v| !v.is_empty());
        // One of `values` (the first is the default).
        let pick = |k: &str, values: &[&'static str]| -> Result<&'static str> {
            match var(k) {
                None => Ok(values[0]),
                Some(v) => match values.iter().find(|&&x| x == v) {
                    Some(&x) => Ok(x),
                    None => bail!(
                        "{k}={v} is not a known value; {k} takes {}",
                        values.join(", ")
                    ),
                },
            }
        };
        let flag = |k: &str, default: bool| -> Result<bool> {
            let d = if default { "1" } else { "0" };
            Ok(pick(k, &[d, if default { "0" } else { "1" }])? == "1")
        };
        let count = |k: &str, default: usize, range: std::ops::RangeInclusive<usize>| {
            let Some(v) = var(k) else {
                return Ok(default);
            };
            match v.parse::<usize>() {
                Ok(n) if range.contains(&n) => Ok(n),
                _ => bail!(
                    "{k}={v} is not a whole number from {} to {}",
                    range.start(),
                    range.end()
                ),
            }
        };
        let gemm = match pick("QWASI_GEMM", &["split", "bf16", "tiled"])? {
            "bf16" => GemmPath::Cublas,
            "tiled" => GemmPath::Tiled,
            _ => GemmPath::CublasSplit,
        };
        let prefill = match var("QWASI_PREFILL_PRECISION") {
            None => PrefillPrecision::Split,
            Some(v) => PrefillPrecision::parse("QWASI_PREFILL_PRECISION", &v)?,
        };
        let attn = pick("QWASI_ATTN", &["wg", "mma", "cuda-cores"])?;
        let dec_attn = match var("QWASI_DEC_ATTN").as_deref() {
            None | Some("auto") => DecAttnPath::Auto,
            Some("ring") => DecAttnPath::Ring,
            Some("direct") => DecAttnPath::Direct,
            Some("keys") => DecAttnPath::Keys { heads_per_warp: 2 },
            Some("keys1") => DecAttnPath::Keys { heads_per_warp: 1 },
            Some("tc") => DecAttnPath::Tensor { ring: 0 },
            Some("tc-ring") => DecAttnPath::Tensor { ring: TC_RING },
            Some("tc-ring2") => DecAttnPath::Tensor { ring: 2 },
            Some("tc-ring3") => DecAttnPath::Tensor { ring: 3 },
            Some("tc-ring4") => DecAttnPath::Tensor { ring: 4 },
            Some(v) => bail!(
                "QWASI_DEC_ATTN={v} is not a known value; QWASI_DEC_ATTN takes auto, tc, \
                 tc-ring, tc-ring2, tc-ring3, tc-ring4, ring, direct, keys, keys1"
            ),
        };
        let rows = match pick(
            "QWASI_GEMM_ROWS",
            &["bulk", "bulk32", "bulk8", "rows", "cublas"],
        )? {
            "bulk32" => RowsPath::Bulk32,
            "bulk8" => RowsPath::Bulk8,
            "rows" => RowsPath::Rows,
            "cublas" => RowsPath::Cublas,
            _ => RowsPath::Bulk,
        };
        let gemv = match pick("QWASI_GEMV", &["bulk", "rows", "stream"])? {
            "rows" => GemvPath::Rows,
            "stream" => GemvPath::Stream,
            _ => GemvPath::Bulk,
        };
        #[cfg(not(feature = "experiments"))]
        if let Some(v) = var("QWASI_DEC_SKIP") {
            bail!(
                "QWASI_DEC_SKIP={v}: stage skipping (measurement only) needs a build with \
                 `--features experiments`"
            );
        }
        Ok(GpuOptions {
            gemm,
            prefill,
            fused_decode: pick("QWASI_DECODE", &["fused", "unfused"])? == "fused",
            batch_decode: pick("QWASI_BATCH", &["batched", "serial"])? == "batched",
            rows,
            gemm_stack: match pick("QWASI_GEMM_STACK", &["decode", "off", "on"])? {
                "off" => GemmStack::Off,
                "on" => GemmStack::On,
                _ => GemmStack::Decode,
            },
            fast_prefill: pick("QWASI_PREFILL", &["fast", "reference"])? == "fast",
            chunked_gdn: pick("QWASI_GDN", &["chunked", "serial"])? == "chunked",
            grouped_moe: cfg!(feature = "cuda")
                && pick("QWASI_MOE", &["grouped", "cublas"])? == "grouped",
            moe_wg_cols: match pick("QWASI_MOE_GEMM", &["wg256", "wg128", "mma"])? {
                "mma" => 0,
                "wg128" => 128,
                _ => 256,
            },
            moe_k64: pick("QWASI_MOE_BK64", &["64", "32"])? == "64",
            moe_plan: match pick("QWASI_MOE_PLAN", &["auto", "kernels", "fused"])? {
                "kernels" => MoePlanPath::Kernels,
                "fused" => MoePlanPath::Fused,
                _ => MoePlanPath::Auto,
            },
            tc_attention: cfg!(feature = "cuda") && attn != "cuda-cores",
            wg_attention: attn != "mma",
            wg_split: flag("QWASI_ATTN_SPLIT", true)?,
            kv_f32: pick("QWASI_KV", &["f32", "bf16"])? == "f32",
            kv_pages: flag("QWASI_KV_PAGES", true)?,
            fp8_resident: pick("QWASI_FP8", &["resident", "dequantize"])? == "resident",
            dec_attn,
            gemv,
            bulk_stages: count("QWASI_BULK_STAGES", 4, 1..=BULK_MAX_STAGES)?,
            bulk_blocks: count("QWASI_BULK_BLOCKS", 1, 1..=64)?,
            conv_gdn: pick("QWASI_GDN_CONV", &["fold", "kernel"])? == "fold",
            pinned_host_tier: pick("QWASI_HOST_TIER", &["pinned", "pageable"])? == "pinned",
            graphs: flag("QWASI_GRAPHS", true)?,
            moe_pairs: count("QWASI_MOE_PAIRS", 2, 1..=64)?,
            #[cfg(feature = "experiments")]
            dec_skip: match var("QWASI_DEC_SKIP") {
                None => Vec::new(),
                Some(v) => {
                    let stages: Vec<String> = v.split(',').map(|s| s.trim().to_string()).collect();
                    if let Some(s) = stages.iter().find(|s| !DEC_STAGES.contains(&s.as_str())) {
                        bail!(
                            "QWASI_DEC_SKIP: unknown stage {s:?}; stages are {}",
                            DEC_STAGES.join(", ")
                        );
                    }
                    stages
                }
            },
            device: DeviceOptions {
                pdl: flag("QWASI_PDL", true)?,
                debug: flag("QWASI_GPU_DEBUG", false)?,
                profile: flag("QWASI_GPU_PROFILE", false)?,
            },
        })
    }

    /// Residual GEMVs with short rows split between warps (not `QWASI_GEMV=stream`).
    pub fn split_gemv(&self) -> bool {
        self.gemv != GemvPath::Stream
    }

    /// Whether the decode step runs `stage` (every stage unless
    /// `QWASI_DEC_SKIP` names it, `experiments` builds only).
    #[inline]
    pub fn dec_stage(&self, stage: &str) -> bool {
        #[cfg(feature = "experiments")]
        {
            !self.dec_skip.iter().any(|s| s == stage)
        }
        #[cfg(not(feature = "experiments"))]
        {
            let _ = stage;
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<GpuOptions> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        GpuOptions::parse(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn defaults_are_the_fast_paths() {
        let o = parse(&[]).unwrap();
        assert_eq!(o.gemm, GemmPath::CublasSplit);
        assert_eq!(o.prefill, PrefillPrecision::Split);
        assert!(o.fused_decode && o.fast_prefill && o.chunked_gdn && o.kv_f32);
        assert!(o.fp8_resident);
        assert!(o.moe_k64 && o.wg_attention && o.wg_split && o.conv_gdn);
        assert_eq!(o.moe_plan, MoePlanPath::Auto);
        assert!(o.pinned_host_tier && o.graphs && o.kv_pages);
        assert_eq!(o.rows, RowsPath::Bulk);
        assert_eq!(o.rows.bulk_max(), 16);
        let o8 = parse(&[("QWASI_GEMM_ROWS", "bulk8")]).unwrap();
        assert_eq!((o8.rows.few_row_kernels(), o8.rows.bulk_max()), (true, 8));
        let o32 = parse(&[("QWASI_GEMM_ROWS", "bulk32")]).unwrap();
        assert_eq!(
            (o32.rows.few_row_kernels(), o32.rows.bulk_max()),
            (true, 32)
        );
        let cublas = parse(&[("QWASI_GEMM_ROWS", "cublas")]).unwrap();
        assert_eq!(
            (cublas.rows.few_row_kernels(), cublas.rows.bulk_max()),
            (false, 0)
        );
        assert_eq!(o.gemm_stack, GemmStack::Decode);
        assert_eq!(o.grouped_moe, cfg!(feature = "cuda"));
        assert_eq!(o.tc_attention, cfg!(feature = "cuda"));
        assert_eq!((o.moe_wg_cols, o.moe_pairs), (256, 2));
        assert_eq!((o.bulk_stages, o.bulk_blocks), (4, 1));
        assert_eq!((o.dec_attn, o.gemv), (DecAttnPath::Auto, GemvPath::Bulk));
        assert!(o.device.pdl && !o.device.debug && !o.device.profile);
        // An empty value is the default too.
        assert_eq!(
            parse(&[("QWASI_GEMM", "")]).unwrap().gemm,
            GemmPath::CublasSplit
        );
    }

    #[test]
    fn each_variable_sets_its_option() {
        let o = parse(&[
            ("QWASI_GEMM", "tiled"),
            ("QWASI_PREFILL_PRECISION", "bf16"),
            ("QWASI_DECODE", "unfused"),
            ("QWASI_PREFILL", "reference"),
            ("QWASI_GDN", "serial"),
            ("QWASI_MOE", "cublas"),
            ("QWASI_MOE_GEMM", "mma"),
            ("QWASI_MOE_BK64", "32"),
            ("QWASI_MOE_PLAN", "fused"),
            ("QWASI_ATTN", "cuda-cores"),
            ("QWASI_ATTN_SPLIT", "0"),
            ("QWASI_KV", "bf16"),
            ("QWASI_KV_PAGES", "0"),
            ("QWASI_FP8", "dequantize"),
            ("QWASI_DEC_ATTN", "tc-ring3"),
            ("QWASI_GEMV", "stream"),
            ("QWASI_BULK_STAGES", "2"),
            ("QWASI_BULK_BLOCKS", "2"),
            ("QWASI_GDN_CONV", "kernel"),
            ("QWASI_HOST_TIER", "pageable"),
            ("QWASI_GRAPHS", "0"),
            ("QWASI_MOE_PAIRS", "4"),
            ("QWASI_GEMM_STACK", "off"),
            ("QWASI_PDL", "0"),
            ("QWASI_GPU_DEBUG", "1"),
            ("QWASI_GPU_PROFILE", "1"),
        ])
        .unwrap();
        assert_eq!(o.gemm, GemmPath::Tiled);
        assert_eq!(o.prefill, PrefillPrecision::Bf16);
        assert!(!o.fused_decode && !o.fast_prefill && !o.chunked_gdn && !o.grouped_moe);
        assert_eq!(
            (o.moe_wg_cols, o.moe_k64, o.moe_plan),
            (0, false, MoePlanPath::Fused)
        );
        assert!(!o.tc_attention && !o.wg_split && !o.kv_f32 && !o.fp8_resident);
        assert_eq!(o.dec_attn, DecAttnPath::Tensor { ring: 3 });
        assert_eq!(o.gemv, GemvPath::Stream);
        assert_eq!((o.bulk_stages, o.bulk_blocks, o.moe_pairs), (2, 2, 4));
        assert!(!o.conv_gdn && !o.pinned_host_tier && !o.graphs && !o.kv_pages);
        assert_eq!(o.gemm_stack, GemmStack::Off);
        assert_eq!(
            parse(&[("QWASI_GEMM_STACK", "on")]).unwrap().gemm_stack,
            GemmStack::On
        );
        assert!(!o.device.pdl && o.device.debug && o.device.profile);
        let mma = parse(&[("QWASI_ATTN", "mma")]).unwrap();
        assert_eq!(
            (mma.wg_attention, mma.tc_attention),
            (false, cfg!(feature = "cuda"))
        );
        assert_eq!(
            parse(&[("QWASI_GEMM", "bf16")]).unwrap().gemm,
            GemmPath::Cublas
        );
        assert_eq!(
            parse(&[("QWASI_MOE_GEMM", "wg128")]).unwrap().moe_wg_cols,
            128
        );
        assert_eq!(
            parse(&[("QWASI_PREFILL_PRECISION", "fp8")])
                .unwrap()
                .prefill,
            PrefillPrecision::Fp8
        );
    }

    #[test]
    fn unknown_values_are_errors_that_say_what_is_accepted() {
        for (k, v, want) in [
            ("QWASI_GEMM", "fast", "QWASI_GEMM takes split, bf16, tiled"),
            (
                "QWASI_PREFILL_PRECISION",
                "fp16",
                "QWASI_PREFILL_PRECISION takes split, bf16, fp8",
            ),
            ("QWASI_KV", "fp8", "QWASI_KV takes f32, bf16"),
            ("QWASI_DEC_ATTN", "tc-ring9", "QWASI_DEC_ATTN takes auto"),
            ("QWASI_GRAPHS", "off", "QWASI_GRAPHS takes 1, 0"),
            ("QWASI_BULK_STAGES", "9", "from 1 to 8"),
            ("QWASI_MOE_PAIRS", "two", "from 1 to 64"),
        ] {
            let err = parse(&[(k, v)]).unwrap_err().to_string();
            assert!(err.contains(want), "{k}={v}: {err}");
        }
    }

    /// The command line's flag stands in for the variable, once per process.
    /// (The only test that sets it: the lib tests load no GPU model.)
    #[test]
    fn the_flag_wins_and_is_set_once() {
        set_prefill_precision(PrefillPrecision::Bf16).unwrap();
        set_prefill_precision(PrefillPrecision::Bf16).unwrap();
        let err = set_prefill_precision(PrefillPrecision::Split).unwrap_err();
        assert!(err.to_string().contains("is bf16 already"), "{err}");
        assert_eq!(
            GpuOptions::from_env().unwrap().prefill,
            PrefillPrecision::Bf16
        );
        let err = PrefillPrecision::parse("--prefill-precision", "fp16").unwrap_err();
        assert!(err.to_string().contains("takes split, bf16"), "{err}");
    }

    #[cfg(not(feature = "experiments"))]
    #[test]
    fn stage_skipping_needs_the_experiments_build() {
        let err = parse(&[("QWASI_DEC_SKIP", "attn")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--features experiments"), "{err}");
        assert!(parse(&[]).unwrap().dec_stage("attn"));
    }

    #[cfg(feature = "experiments")]
    #[test]
    fn stage_skipping_names_known_stages() {
        let o = parse(&[("QWASI_DEC_SKIP", "attn, lm_head")]).unwrap();
        assert!(!o.dec_stage("attn") && !o.dec_stage("lm_head") && o.dec_stage("o_proj"));
        assert!(parse(&[("QWASI_DEC_SKIP", "mlp")]).is_err());
    }
}
