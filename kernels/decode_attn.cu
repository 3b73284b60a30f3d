// The decode step's attention (batch 1 and batched, issue 23) on CUDA
// cores: per-split partials over the KV cache, read directly or through a
// shared-memory ring, and their gated combine (kernels/decode.cu describes
// the fused decode step; decode_attn_keys.cu and decode_attn_tc.cu hold the
// other decode attention kernels, which share dec_attn_combine).
#include "mma.h"

// Decode attention, GQA-aware and split over the key length: grid (nkv, nsplit),
// block 32 * G threads (G = nh / nkv <= 16 query heads share one KV head; one warp
// per query head). For long splits (RING, stages >= 1) the block copies its
// split's K/V rows once into a shared-memory ring of `stages` (1..DA_STAGES)
// tiles of DA_TILE keys (cp.async, the next tiles in flight while one is
// used; the host picks the most that fit), and every warp reads them from
// there: each K/V byte crosses L2 once per block, not once per query head.
// Both paths do the same arithmetic in the same order. Each warp
// walks the keys DA_KEYS at a time with an online softmax in f32. Writes
// unnormalised partials (o, running max, sum) per (head, split) for
// dec_attn_combine. Dynamic shared memory: stages * 2 * DA_TILE * hd KVs.
#define DA_KEYS 4
#define DA_MAXD 8  // head_dim <= 256
#define DA_TILE 16 // keys per shared-memory tile (a multiple of DA_KEYS)
#define DA_STAGES 3 // most tiles in the ring
__device__ __forceinline__ float kv_val(const float* p) { return *p; }
__device__ __forceinline__ float kv_val(const bf16_t* p) { return bf2f(*p); }

// Keys [t0, t0 + DA_TILE) of KV head g (zeros past s1) into one tile of
// shared memory ([DA_TILE][hd] for K, then the same for V), by the whole block.
template <typename KV>
__device__ __forceinline__ void dec_attn_load_tile(KV* ks, const KV* __restrict__ kc, const KV* __restrict__ vc,
                                                   int t0, int s1, int nkv, int g, int hd) {
    KV* vs = ks + DA_TILE * hd;
    int nt = blockDim.x;
    if ((hd * (int)sizeof(KV)) % 16 == 0) {
        int per_row = hd * (int)sizeof(KV) / 16;
        for (int c = threadIdx.x; c < DA_TILE * per_row; c += nt) {
            int r = c / per_row, o = c % per_row;
            bool ok = t0 + r < s1;
            size_t row = ok ? ((size_t)(t0 + r) * nkv + g) * hd : 0;
            const uint4* kp = (const uint4*)(kc + row) + o;
            const uint4* vp = (const uint4*)(vc + row) + o;
            uint4* kd = (uint4*)(ks + (size_t)r * hd) + o;
            uint4* vd = (uint4*)(vs + (size_t)r * hd) + o;
#if defined(QW_CUDA)
            cp_async16(kd, kp, ok);
            cp_async16(vd, vp, ok);
#else
            *kd = ok ? *kp : make_uint4(0u, 0u, 0u, 0u);
            *vd = ok ? *vp : make_uint4(0u, 0u, 0u, 0u);
#endif
        }
    } else {
        for (int c = threadIdx.x; c < DA_TILE * hd; c += nt) {
            int r = c / hd, d = c % hd;
            bool ok = t0 + r < s1;
            size_t at = ((size_t)(t0 + r) * nkv + g) * hd + d;
            ks[c] = ok ? kc[at] : KV(0);
            vs[c] = ok ? vc[at] : KV(0);
        }
    }
}

// The online-softmax update of one warp (one query head) with keys s .. s +
// DA_KEYS - 1 (those >= s1 ignored), their K and V values in registers
// (lane l holds dims l, l + 32, ...).
__device__ __forceinline__ void dec_attn_keys(const float (&kr)[DA_KEYS][DA_MAXD], const float (&vr)[DA_KEYS][DA_MAXD],
                                              int s, int s1, const float (&qv)[DA_MAXD], float (&acc)[DA_MAXD],
                                              float& m, float& l) {
    float dot[DA_KEYS];
#pragma unroll
    for (int u = 0; u < DA_KEYS; u++) {
        float t = 0.f;
#pragma unroll
        for (int j = 0; j < DA_MAXD; j++) t += qv[j] * kr[u][j];
        dot[u] = t;
    }
#pragma unroll
    for (int u = 0; u < DA_KEYS; u++) dot[u] = warp_sum(dot[u]);
    float mn = m;
#pragma unroll
    for (int u = 0; u < DA_KEYS; u++)
        if (s + u < s1) mn = fmaxf(mn, dot[u]);
    float corr = expf(m - mn);
    float p[DA_KEYS];
    float psum = 0.f;
#pragma unroll
    for (int u = 0; u < DA_KEYS; u++) {
        p[u] = s + u < s1 ? expf(dot[u] - mn) : 0.f;
        psum += p[u];
    }
    l = l * corr + psum;
#pragma unroll
    for (int j = 0; j < DA_MAXD; j++) {
        float a = acc[j] * corr;
#pragma unroll
        for (int u = 0; u < DA_KEYS; u++) a += p[u] * vr[u][j];
        acc[j] = a;
    }
    m = mn;
}

template <typename KV, bool RING>
__device__ __forceinline__ void dec_attn_impl(const float* __restrict__ q, const KV* __restrict__ kc,
                                              const KV* __restrict__ vc, float* __restrict__ part_o,
                                              float* __restrict__ part_ml, int nh, int nkv, int hd,
                                              const int* __restrict__ pos_dev, int nsplit, float scale,
                                              int stages) {
    QW_DYN_SMEM(float4, da_smem);
    KV* ring = (KV*)da_smem;
    const int tile_elems = 2 * DA_TILE * hd;
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    int g = blockIdx.x, split = blockIdx.y;
    int G = nh / nkv;
    int w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    bool active = w < G;
    int head = g * G + (active ? w : 0);
    int L = *pos_dev + 1;
    int chunk = (L + nsplit - 1) / nsplit;
    int s0 = split * chunk, s1 = min(L, s0 + chunk);
    size_t pidx = (size_t)head * nsplit + split;
    float qv[DA_MAXD], acc[DA_MAXD];
#pragma unroll
    for (int j = 0; j < DA_MAXD; j++) {
        int d = lane + j * WARP;
        qv[j] = d < hd ? q[(size_t)head * hd + d] * scale : 0.f;
        acc[j] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    // Direct (not RING): every warp reads its keys straight from global memory,
    // DA_KEYS rows in flight (short splits, where the ring's prologue and
    // barriers cost more than the repeated reads, which L2 serves).
    for (int s = s0; !RING && active && s < s1; s += DA_KEYS) {
        float kr[DA_KEYS][DA_MAXD], vr[DA_KEYS][DA_MAXD];
#pragma unroll
        for (int u = 0; u < DA_KEYS; u++) {
            bool ok = s + u < s1;
            const KV* kp = kc + ((size_t)(s + u) * nkv + g) * hd;
            const KV* vp = vc + ((size_t)(s + u) * nkv + g) * hd;
#pragma unroll
            for (int j = 0; j < DA_MAXD; j++) {
                int d = lane + j * WARP;
                bool in = ok && d < hd;
                kr[u][j] = in ? kv_val(kp + d) : 0.f;
                vr[u][j] = in ? kv_val(vp + d) : 0.f;
            }
        }
        dec_attn_keys(kr, vr, s, s1, qv, acc, m, l);
    }
    int ntiles = RING && s1 > s0 ? (s1 - s0 + DA_TILE - 1) / DA_TILE : 0;
    // Prologue: the first stages - 1 tiles in flight (one commit group each,
    // empty past the end, so the wait count below is uniform).
    for (int p = 0; p < stages - 1; p++) {
        if (p < ntiles) dec_attn_load_tile<KV>(ring + p * tile_elems, kc, vc, s0 + p * DA_TILE, s1, nkv, g, hd);
#if defined(QW_CUDA)
        cp_async_commit();
#endif
    }
    for (int it = 0; it < ntiles; it++) {
        int nx = it + stages - 1;
        if (nx < ntiles)
            dec_attn_load_tile<KV>(ring + (nx % stages) * tile_elems, kc, vc, s0 + nx * DA_TILE, s1, nkv, g, hd);
#if defined(QW_CUDA)
        cp_async_ring_step(stages);  // tile `it` has landed
#endif
        __syncthreads();
        const KV* ks = ring + (it % stages) * tile_elems;
        const KV* vs = ks + DA_TILE * hd;
        int t0 = s0 + it * DA_TILE;
        // Whole tiles, unrolled: keys past s1 are zeros in shared memory and
        // masked in dec_attn_keys (m is finite after the first tile, so a
        // fully masked group leaves m, l and acc exactly as they were).
#pragma unroll
        for (int tu = 0; tu < DA_TILE; tu += DA_KEYS) {
            if (!active) break;
            float kr[DA_KEYS][DA_MAXD], vr[DA_KEYS][DA_MAXD];
#pragma unroll
            for (int u = 0; u < DA_KEYS; u++) {
#pragma unroll
                for (int j = 0; j < DA_MAXD; j++) {
                    int d = lane + j * WARP;
                    bool in = d < hd;
                    kr[u][j] = in ? kv_val(ks + (tu + u) * hd + d) : 0.f;
                    vr[u][j] = in ? kv_val(vs + (tu + u) * hd + d) : 0.f;
                }
            }
            dec_attn_keys(kr, vr, t0 + tu, s1, qv, acc, m, l);
        }
        // The tile is refilled stages - 1 iterations later: all warps must be done with it.
        __syncthreads();
    }
    if (!active) return;
#pragma unroll
    for (int j = 0; j < DA_MAXD; j++) {
        int d = lane + j * WARP;
        if (d < hd) part_o[pidx * hd + d] = acc[j];
    }
    if (lane == 0) {
        part_ml[pidx * 2] = m;
        part_ml[pidx * 2 + 1] = l;
    }
}

// dec_attn_{f32,bf16} read K/V directly, the _ring variants through shared
// memory (separate kernels: each path keeps its own register allocation).
#define DEC_ATTN(NAME, KV, RING)                                                                              \
    QW_KERNEL void QW_BOUNDS(512) NAME(const float* __restrict__ q, const KV* __restrict__ kc,                 \
                                       const KV* __restrict__ vc, float* __restrict__ part_o,                \
                                       float* __restrict__ part_ml, int nh, int nkv, int hd,                 \
                                       const int* __restrict__ pos_dev, int nsplit, float scale, int stages) { \
        dec_attn_impl<KV, RING>(q, kc, vc, part_o, part_ml, nh, nkv, hd, pos_dev, nsplit, scale, stages);   \
    }
DEC_ATTN(dec_attn_f32, float, false)
DEC_ATTN(dec_attn_f32_ring, float, true)
DEC_ATTN(dec_attn_bf16, bf16_t, false)
DEC_ATTN(dec_attn_bf16_ring, bf16_t, true)

// Batched decode: sequence b = blockIdx.z, its queries at q + b nh hd, K and
// V at tab[2 b], tab[2 b + 1], its position at pos[b] (keys 0..pos[b]);
// partials at part_o/part_ml + b nh nsplit (hd, 2).
#define BAT_ATTN(NAME, KV, RING)                                                                              \
    QW_KERNEL void QW_BOUNDS(512) NAME(const float* __restrict__ q, const unsigned long long* __restrict__ tab, \
                                       const int* __restrict__ pos, float* __restrict__ part_o,               \
                                       float* __restrict__ part_ml, int nh, int nkv, int hd, int nsplit,      \
                                       float scale, int stages) {                                             \
        const size_t b = blockIdx.z, parts = (size_t)nh * nsplit;                                             \
        dec_attn_impl<KV, RING>(q + b * nh * hd, (const KV*)tab[2 * b], (const KV*)tab[2 * b + 1],            \
                                part_o + b * parts * hd, part_ml + b * parts * 2, nh, nkv, hd, pos + b, nsplit, \
                                scale, stages);                                                               \
    }
BAT_ATTN(bat_attn_f32, float, false)
BAT_ATTN(bat_attn_f32_ring, float, true)
BAT_ATTN(bat_attn_bf16, bf16_t, false)
BAT_ATTN(bat_attn_bf16_ring, bf16_t, true)

// out[head, d] = (sum_s o_s[d] e^{m_s - M}) / (sum_s l_s e^{m_s - M}) * sigmoid(gate[head, d]).
// grid (nh, ceil(hd / 32)), block 256: 32 dims x 8 groups of splits, then a
// shared-memory sum over the groups.
__device__ __forceinline__ void dec_attn_combine_impl(const float* __restrict__ part_o,
                                                      const float* __restrict__ part_ml,
                                                      const float* __restrict__ proj, float* __restrict__ out,
                                                      int nh, int hd, int nsplit) {
    __shared__ float scratch[32];
    __shared__ float red[8][32];
    int head = blockIdx.x;
    int lane = threadIdx.x % WARP, grp = threadIdx.x / WARP;
    int d = blockIdx.y * WARP + lane;
    const float* ml = part_ml + (size_t)head * nsplit * 2;
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < nsplit; s += blockDim.x) mx = fmaxf(mx, ml[2 * s]);
    float M = block_max(mx, scratch);
    float ls = 0.f;
    for (int s = threadIdx.x; s < nsplit; s += blockDim.x)
        if (ml[2 * s] != -INFINITY) ls += ml[2 * s + 1] * expf(ml[2 * s] - M);
    float Lsum = block_sum(ls, scratch);
    float o = 0.f;
    if (d < hd) {
#pragma unroll 4
        for (int s = grp; s < nsplit; s += 8) {
            float ms = ml[2 * s];
            if (ms != -INFINITY) o += part_o[((size_t)head * nsplit + s) * hd + d] * expf(ms - M);
        }
    }
    red[grp][lane] = o;
    __syncthreads();
    if (grp == 0 && d < hd) {
        float t = 0.f;
        for (int i = 0; i < 8; i++) t += red[i][lane];
        float gate = proj[(size_t)head * 2 * hd + hd + d];
        out[(size_t)head * hd + d] = t / Lsum * sigmoid_f(gate);
    }
}
QW_KERNEL void QW_BOUNDS(256) dec_attn_combine(const float* __restrict__ part_o, const float* __restrict__ part_ml,
                                               const float* __restrict__ proj, float* __restrict__ out,
                                               int nh, int hd, int nsplit) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    dec_attn_combine_impl(part_o, part_ml, proj, out, nh, hd, nsplit);
}
// Batched decode: sequence b = blockIdx.z (partials as bat_attn_*, its gates
// in row b of the [B, stride] projections, output rows of nh hd).
QW_KERNEL void QW_BOUNDS(256) bat_attn_combine(const float* __restrict__ part_o, const float* __restrict__ part_ml,
                                               const float* __restrict__ proj, int stride, float* __restrict__ out,
                                               int nh, int hd, int nsplit) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    const size_t b = blockIdx.z, parts = (size_t)nh * nsplit;
    dec_attn_combine_impl(part_o + b * parts * hd, part_ml + b * parts * 2, proj + b * stride,
                          out + b * nh * hd, nh, hd, nsplit);
}
