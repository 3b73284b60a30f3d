//! Decode attention's kernel choice: which `dec_attn_*` kernel a step
//! launches for the model's head geometry, the keys per split and the
//! device's shared memory (tensor cores where they apply, else key-parallel,
//! ring or direct reads), and its launch shape.

use super::F;
use crate::gpu::kernels::{Typed, sig, typed};
use crate::gpu::options::{DecAttnPath, TC_RING};

/// Keys per shared-memory tile and most tiles in the ring of `dec_attn_*`
/// (`DA_TILE`, `DA_STAGES` in kernels/decode_attn.cu).
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
/// `benchmarks/history/dec-attn-keys-h200-7ec1de9.json`).
const KEYS1_MIN_KEYS: usize = 1024;
/// Most warps per block, query heads per KV head and k16 steps per warp of
/// `dec_attn_*_tc` (`DT_WARPS`, `DT_HEADS`, `DT_MAXKK` in
/// kernels/decode_attn_tc.cu): each warp takes a slice of 16 to 64 dims.
const DT_WARPS: usize = 4;
const DT_HEADS: usize = 8;
const DT_MAXKK: usize = 4;
const DT_KEYS: usize = 16;
/// Keys per tile and most query heads per warp of `dec_attn_*_keys`
/// (`DK_TILE`, `DK_MAXH` in kernels/decode_attn_keys.cu); head_dim at most 256.
const DK_TILE: usize = 32;
const DK_MAXH: usize = 2;

/// One decode-attention launch: kernel, threads per block, dynamic shared
/// memory and ring stages.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct DecAttnPlan {
    pub kernel: Typed<sig::dec_attn_f32>,
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
                (true, false) => typed::dec_attn_f32_tc,
                (false, false) => typed::dec_attn_bf16_tc,
                (true, true) => typed::dec_attn_f32_tc_ring,
                (false, true) => typed::dec_attn_bf16_tc_ring,
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
                    (true, 1) => typed::dec_attn_f32_keys1,
                    (true, _) => typed::dec_attn_f32_keys,
                    (false, _) => typed::dec_attn_bf16_keys, // two heads per warp only
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
            (true, false) => typed::dec_attn_f32,
            (true, true) => typed::dec_attn_f32_ring,
            (false, false) => typed::dec_attn_bf16,
            (false, true) => typed::dec_attn_bf16_ring,
        },
        threads: 32 * group,
        smem: stages * tile,
        stages,
    }
}

#[cfg(test)]
mod tests {
    use super::super::B;
    use super::*;

    /// The H200's opt-in shared memory per block.
    const H200_SMEM: usize = 232_448;

    #[test]
    fn decode_attention_launches() {
        // Qwen3.6-35B: 8 query heads per KV head, head_dim 256, f32 KV.
        // Without tensor cores (HIP), then with them below.
        let plan = |path, keys, kv, smem| dec_attn_plan(path, 8, 256, keys, kv, smem, false);
        let auto = DecAttnPath::Auto;
        assert_eq!(plan(auto, 100, F, H200_SMEM).kernel.name(), "dec_attn_f32");
        assert_eq!(plan(auto, 100, F, H200_SMEM).smem, 0);
        let ring = plan(auto, 1023, F, H200_SMEM);
        assert_eq!(
            (ring.kernel.name(), ring.threads, ring.stages, ring.smem),
            ("dec_attn_f32_ring", 256, 3, 3 * 32 * 1024)
        );
        assert_eq!(
            plan(DecAttnPath::Ring, 100, B, H200_SMEM).kernel.name(),
            "dec_attn_bf16_ring"
        );
        // Long f32 splits: the key-parallel kernel, one head per warp; bf16
        // KV keeps the ring.
        assert_eq!(
            plan(auto, 1024, F, H200_SMEM).kernel.name(),
            "dec_attn_f32_keys1"
        );
        assert_eq!(
            plan(auto, 4096, B, H200_SMEM).kernel.name(),
            "dec_attn_bf16_ring"
        );
        assert_eq!(
            plan(DecAttnPath::Ring, 4096, F, H200_SMEM).kernel.name(),
            "dec_attn_f32_ring"
        );
        // Keys: q and p (9,216 bytes), then 32-key tiles of padded K and V.
        let keys = plan(DecAttnPath::Keys { heads_per_warp: 2 }, 100, F, H200_SMEM);
        let tile = 32 * (2 * 256 + 4) * 4;
        assert_eq!(
            (keys.kernel.name(), keys.threads, keys.stages, keys.smem),
            ("dec_attn_f32_keys", 128, 3, 9216 + 3 * tile)
        );
        let one = plan(DecAttnPath::Keys { heads_per_warp: 1 }, 100, F, H200_SMEM);
        assert_eq!(
            (one.kernel.name(), one.threads),
            ("dec_attn_f32_keys1", 256)
        );
        let bf = plan(DecAttnPath::Keys { heads_per_warp: 2 }, 100, B, H200_SMEM);
        assert_eq!(
            (bf.kernel.name(), bf.smem),
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
            dec_attn_plan(keys2, 8, 64, 1024, F, H200_SMEM, false)
                .kernel
                .name(),
            "dec_attn_f32_ring"
        );
        assert_eq!(
            dec_attn_plan(keys2, 3, 256, 100, F, H200_SMEM, true)
                .kernel
                .name(),
            "dec_attn_f32"
        );
        assert_eq!(
            dec_attn_plan(keys2, 8, 128, 100, B, H200_SMEM, true)
                .kernel
                .name(),
            "dec_attn_bf16"
        );
        assert_eq!(plan(keys2, 100, F, 40_000).kernel.name(), "dec_attn_f32");
        // No bf16 kernel with one head per warp.
        let keys1 = DecAttnPath::Keys { heads_per_warp: 1 };
        assert_eq!(
            plan(keys1, 100, B, H200_SMEM).kernel.name(),
            "dec_attn_bf16"
        );
        // Tensor cores (the default where they apply): 4 warps, no dynamic
        // shared memory, f32 or bf16 KV.
        let plan = |path, keys, kv, smem| dec_attn_plan(path, 8, 256, keys, kv, smem, true);
        let a = plan(auto, 100, F, H200_SMEM);
        assert_eq!(
            (a.kernel.name(), a.stages, a.smem),
            ("dec_attn_f32_tc_ring", 2, 4 * 2 * 16 * 140 * 4)
        );
        assert_eq!(
            plan(auto, 4096, B, H200_SMEM).kernel.name(),
            "dec_attn_bf16_tc_ring"
        );
        assert_eq!(
            plan(DecAttnPath::Ring, 4096, F, H200_SMEM).kernel.name(),
            "dec_attn_f32_ring"
        );
        let tc = plan(DecAttnPath::Tensor { ring: 0 }, 4096, F, H200_SMEM);
        assert_eq!(
            (tc.kernel.name(), tc.threads, tc.smem),
            ("dec_attn_f32_tc", 128, 0)
        );
        assert_eq!(
            plan(DecAttnPath::Tensor { ring: 0 }, 100, B, H200_SMEM)
                .kernel
                .name(),
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
            .name()
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
            (small.kernel.name(), small.smem),
            ("dec_attn_f32_tc_ring", 2 * 2 * 16 * (32 + 8 + 4) * 4)
        );
        // Ring: 4 warps x 3 slots of K [16][72] + V [16][68] f32 (bf16: V [16][72]).
        let r3 = plan(DecAttnPath::Tensor { ring: 3 }, 4096, F, H200_SMEM);
        assert_eq!(
            (r3.kernel.name(), r3.smem, r3.stages),
            ("dec_attn_f32_tc_ring", 4 * 3 * 16 * 140 * 4, 3)
        );
        let r2 = plan(DecAttnPath::Tensor { ring: 2 }, 4096, B, H200_SMEM);
        assert_eq!(
            (r2.kernel.name(), r2.smem),
            ("dec_attn_bf16_tc_ring", 4 * 2 * 16 * 144 * 2)
        );
        // Too little shared memory for two slots: registers.
        let small = plan(DecAttnPath::Tensor { ring: 4 }, 4096, F, 60_000);
        assert_eq!((small.kernel.name(), small.smem), ("dec_attn_f32_tc", 0));
        let auto_16 = dec_attn_plan(auto, 16, 256, 100, F, H200_SMEM, true);
        assert_eq!(auto_16.kernel.name(), "dec_attn_f32");
    }
}
