// Decode attention with one pass per key for all the query heads of a KV head
// (GQA), split over the key length like dec_attn_* (kernels/decode_attn.cu) and
// writing the same partials for dec_attn_combine.
//
// dec_attn_*_ring has one warp per query head, each reading every K/V row of
// the shared-memory tile and reducing each (head, key) dot across its 32
// lanes: at 131K it is bound by instruction issue and latency, not by DRAM.
// Here the lanes of a warp own keys in the QK pass (lane = key of a 32-key
// tile: a whole dot per lane, no cross-lane reduction; K rows padded so the
// lanes' reads hit distinct banks) and own dimensions in the PV pass (the
// softmax weights broadcast from shared memory), and each warp serves HPW
// query heads, so every K/V value read from shared memory feeds HPW heads.
//
// grid (nkv, nsplit), block 32 * G / HPW threads (G = nh / nkv query heads per
// KV head, G % HPW == 0); needs hd % (32 * VN) == 0 and hd <= 32 * DK_MAXV
// (VN = KV values per 16 bytes), which the host checks. Dynamic shared
// memory (floats unless noted): q [G][hd] (scaled), p [G][32], then `stages`
// tiles of K [32][hd + VN] and V [32][hd] (KV elements).
//
// A split that ends before the newest key copies its first tiles before the
// grid dependency wait: those rows were written by earlier steps, and the
// position comes from the step buffer the host wrote before the launch; the
// predecessor (attn_prep) writes only q and the newest row.
#include "mma.h"

#define DK_TILE 32  // keys per tile (lane = key in the QK pass)
#define DK_MAXV 8   // dims per lane in the PV pass (hd <= 256)
#define DK_MAXH 2   // most query heads per warp

__device__ __forceinline__ void dk_unpack(const float* p, float (&o)[4]) {
    float4 v = *(const float4*)p;
    o[0] = v.x;
    o[1] = v.y;
    o[2] = v.z;
    o[3] = v.w;
}
__device__ __forceinline__ void dk_unpack(const bf16_t* p, float (&o)[8]) {
    uint4 v = *(const uint4*)p;
    o[0] = bf_lo(v.x);
    o[1] = bf_hi(v.x);
    o[2] = bf_lo(v.y);
    o[3] = bf_hi(v.y);
    o[4] = bf_lo(v.z);
    o[5] = bf_hi(v.z);
    o[6] = bf_lo(v.w);
    o[7] = bf_hi(v.w);
}

template <typename KV, int HPW>
__device__ __forceinline__ void dec_attn_keys_impl(const float* __restrict__ q, const KV* __restrict__ kc,
                                                   const KV* __restrict__ vc, float* __restrict__ part_o,
                                                   float* __restrict__ part_ml, int nh, int nkv, int hd,
                                                   const int* __restrict__ pos_dev, int nsplit, float scale,
                                                   int stages) {
    constexpr int VN = 16 / sizeof(KV);
    QW_DYN_SMEM(float4, dk_smem);
    const int G = nh / nkv;
    const int kld = hd + VN;  // padded K row: lane l's 16-byte reads start 4 l banks apart
    float* qs = (float*)dk_smem;
    float* ps = qs + G * hd;
    KV* ring = (KV*)(ps + G * DK_TILE);
    const int tile_elems = DK_TILE * (kld + hd);
    const int g = blockIdx.x, split = blockIdx.y;
    const int w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int h0 = w * HPW;  // first head of this warp within the group
    const int L = *pos_dev + 1;
    const int chunk = (L + nsplit - 1) / nsplit;
    const int s0 = split * chunk, s1 = min(L, s0 + chunk);
    const int ntiles = s1 > s0 ? (s1 - s0 + DK_TILE - 1) / DK_TILE : 0;

    // Keys [t0, t0 + 32) of KV head g (zeros past s1) into tile `ks`, whole block.
    auto load = [&](int t, KV* ks) {
        KV* vs = ks + DK_TILE * kld;
        const int t0 = s0 + t * DK_TILE, per_row = hd / VN;
        for (int c = threadIdx.x; c < DK_TILE * per_row; c += blockDim.x) {
            const int r = c / per_row, o = c % per_row;
            const bool ok = t0 + r < s1;
            const size_t row = ok ? ((size_t)(t0 + r) * nkv + g) * hd : 0;
#if defined(QW_CUDA)
            cp_async16(ks + r * kld + o * VN, kc + row + o * VN, ok);
            cp_async16(vs + r * hd + o * VN, vc + row + o * VN, ok);
#else
            *(uint4*)(ks + r * kld + o * VN) = ok ? *(const uint4*)(kc + row + o * VN) : make_uint4(0u, 0u, 0u, 0u);
            *(uint4*)(vs + r * hd + o * VN) = ok ? *(const uint4*)(vc + row + o * VN) : make_uint4(0u, 0u, 0u, 0u);
#endif
        }
    };
    // The first stages - 1 tiles in flight (one commit group each, empty past
    // the end, so the wait count below is uniform).
    auto prologue = [&]() {
        for (int p = 0; p < stages - 1; p++) {
            if (p < ntiles) load(p, ring + p * tile_elems);
#if defined(QW_CUDA)
            cp_async_commit();
#endif
        }
    };
    const bool early = s1 < L;
    if (early) prologue();
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    if (!early) prologue();
    for (int i = threadIdx.x; i < G * hd; i += blockDim.x) qs[i] = q[(size_t)g * G * hd + i] * scale;

    float m[HPW], l[HPW], acc[HPW][DK_MAXV];
#pragma unroll
    for (int h = 0; h < HPW; h++) {
        m[h] = -INFINITY;
        l[h] = 0.f;
#pragma unroll
        for (int j = 0; j < DK_MAXV; j++) acc[h][j] = 0.f;
    }
    const int ng = hd / (WARP * VN);  // 16-byte groups per lane in the PV pass
    for (int it = 0; it < ntiles; it++) {
        const int nx = it + stages - 1;
        if (nx < ntiles) load(nx, ring + (nx % stages) * tile_elems);
#if defined(QW_CUDA)
        cp_async_ring_step(stages);  // tile `it` has landed
#endif
        __syncthreads();
        const KV* ks = ring + (it % stages) * tile_elems;
        const KV* vs = ks + DK_TILE * kld;

        // QK: lane = key. s[h] = q[h0 + h] . k[lane] (q scaled).
        float s[HPW];
#pragma unroll
        for (int h = 0; h < HPW; h++) s[h] = 0.f;
        const KV* kr = ks + lane * kld;
#pragma unroll 4
        for (int d = 0; d < hd; d += VN) {
            float kv[VN];
            dk_unpack(kr + d, kv);
#pragma unroll
            for (int h = 0; h < HPW; h++) {
                const float* qh = qs + (h0 + h) * hd + d;
#pragma unroll
                for (int c = 0; c < VN; c += 4) {
                    const float4 qq = *(const float4*)(qh + c);
                    s[h] += qq.x * kv[c] + qq.y * kv[c + 1] + qq.z * kv[c + 2] + qq.w * kv[c + 3];
                }
            }
        }
        // Online softmax per head over the tile's valid keys (at least the
        // first: tiles start inside [s0, s1), so m is finite after tile 0).
        const bool valid = s0 + it * DK_TILE + lane < s1;
        float* pw = ps + h0 * DK_TILE;
#pragma unroll
        for (int h = 0; h < HPW; h++) {
            const float sv = valid ? s[h] : -INFINITY;
            const float mn = fmaxf(m[h], warp_max(sv));
            const float corr = expf(m[h] - mn);
            const float p = valid ? expf(sv - mn) : 0.f;
            l[h] = l[h] * corr + warp_sum(p);
            m[h] = mn;
#pragma unroll
            for (int j = 0; j < DK_MAXV; j++) acc[h][j] *= corr;
            pw[h * DK_TILE + lane] = p;
        }
        QW_SYNCWARP();
        // PV: lane owns dims grp * 32 VN + lane VN + c.
#pragma unroll 4
        for (int kk = 0; kk < DK_TILE; kk += 4) {
            float4 pk[HPW];
#pragma unroll
            for (int h = 0; h < HPW; h++) pk[h] = *(const float4*)(pw + h * DK_TILE + kk);
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const KV* vr = vs + (kk + u) * hd + lane * VN;
#pragma unroll
                for (int grp = 0; grp < DK_MAXV / VN; grp++) {
                    if (grp >= ng) break;
                    float vv[VN];
                    dk_unpack(vr + grp * WARP * VN, vv);
#pragma unroll
                    for (int h = 0; h < HPW; h++) {
                        const float pu = u == 0 ? pk[h].x : u == 1 ? pk[h].y : u == 2 ? pk[h].z : pk[h].w;
#pragma unroll
                        for (int c = 0; c < VN; c++) acc[h][grp * VN + c] += pu * vv[c];
                    }
                }
            }
        }
        // The tile is refilled stages - 1 iterations later and p next
        // iteration: every warp must be done with both.
        __syncthreads();
    }
#pragma unroll
    for (int h = 0; h < HPW; h++) {
        const size_t pidx = (size_t)(g * G + h0 + h) * nsplit + split;
#pragma unroll
        for (int grp = 0; grp < DK_MAXV / VN; grp++) {
            if (grp >= ng) break;
#pragma unroll
            for (int c = 0; c < VN; c++) part_o[pidx * hd + grp * WARP * VN + lane * VN + c] = acc[h][grp * VN + c];
        }
        if (lane == 0) {
            part_ml[pidx * 2] = m[h];
            part_ml[pidx * 2 + 1] = l[h];
        }
    }
}

// Block = 32 G / HPW threads, G <= 16; one block per SM (the ring fills shared memory), so registers are free.
#define DEC_ATTN_KEYS(NAME, KV, HPW)                                                                          \
    QW_KERNEL void QW_BOUNDS_MIN(512 / HPW, 1) NAME(const float* __restrict__ q, const KV* __restrict__ kc,                 \
                                       const KV* __restrict__ vc, float* __restrict__ part_o,                \
                                       float* __restrict__ part_ml, int nh, int nkv, int hd,                 \
                                       const int* __restrict__ pos_dev, int nsplit, float scale, int stages) { \
        dec_attn_keys_impl<KV, HPW>(q, kc, vc, part_o, part_ml, nh, nkv, hd, pos_dev, nsplit, scale, stages); \
    }
DEC_ATTN_KEYS(dec_attn_f32_keys, float, 2)
DEC_ATTN_KEYS(dec_attn_f32_keys1, float, 1)
DEC_ATTN_KEYS(dec_attn_bf16_keys, bf16_t, 2)
