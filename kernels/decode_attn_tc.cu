// Decode attention on tensor cores: the G <= 8 query heads of a KV head are the
// n8 side of mma.sync m16n8k16 and 16 keys its m16 side, so one pass over each
// key serves every head of the group and no (head, key) dot is reduced across
// lanes. Split over the key length like dec_attn_* (kernels/decode_attn.cu), with
// the same partials (unnormalised o, running max, sum; natural-log units, q
// scaled) for dec_attn_combine.
//
//   S^T[key][head] = K Q^T,   O^T[dim][head] += V^T P^T
//
// f32 KV is split into bf16 terms as in the prompt attention (x = hi + lo):
// S ~ Kh Qh + Kl Qh + Kh Ql, O ~ Vh Ph + Vl Ph + Vh Pl; a bf16 cache is exact
// in one term, so its lo products are skipped.
//
// grid (nkv, nsplit), block nw <= DT_WARPS warps (4 for head_dim 128 and 256;
// fewer for small heads), which split the head dimension: warp w owns dims
// [w dw, (w + 1) dw), dw = hd / nw (a multiple of 16, at most 16 DT_MAXKK),
// its slice of every K row for partial scores and of every V row for its
// slice of O. The partial scores meet in shared memory, summed in warp order,
// so every warp holds the same scores, maxima and sums and no warp states
// need merging at the end. Each warp reads its fragments straight from global
// memory (every 32-byte sector it touches is used whole), the next tile's in
// flight while the current one is multiplied; the `_ring` variants instead
// copy each warp's slices into its own shared-memory ring of `stages` tiles
// (cp.async, stages - 1 tiles in flight, no registers held by them) and read
// the fragments from there. Dynamic shared memory (ring only): nw *
// stages tiles of K [16][dw + 8] and V [16][dw + 16 / sizeof(KV)] (KV
// elements; the pads make the fragment reads conflict-free).
//
// Tiles that lie wholly before the newest key are requested before the grid
// dependency wait: those rows were written by earlier steps, and the
// position comes from the step buffer the host wrote before the launch.
#include "mma.h"

#define DT_WARPS 4  // most warps per block (head-dim slices)
#define DT_KEYS 16  // keys per tile (the m16 side of the QK product)
#define DT_MAXKK 4  // most k16 steps per warp slice: hd <= 16 * DT_MAXKK * DT_WARPS = 256
#define DT_HEADS 8  // query heads per KV head at most (the n8 side)

#if defined(QW_CUDA) || defined(QW_CPU)

// One element of the cache as raw bits (zero where !ok: rows past the split
// may be unwritten, and 0 * NaN would reach the output).
__device__ __forceinline__ float dt_ld(const float* p, bool ok) { return ok ? *p : 0.f; }
__device__ __forceinline__ unsigned dt_ld(const bf16_t* p, bool ok) { return ok ? (unsigned)*p : 0u; }

// One tile's fragments of this lane (g = lane / 4, c = lane % 4), for the
// warp's dims 16 kk + ... (the caller offsets the pointers by its slice):
//   k[kk][i]: A of S (rows = keys, cols = dims): key g + 8 (i & 1), dims 2c + 8 (i >> 1) and +1;
//   v[kk][i]: A of O^T (rows = dims, cols = keys): dim g + 8 (i & 1), keys 2c + 8 (i >> 1) and +1.
// i = (row half) + 2 (k half) is mma_16816's register order for A.
// f32: both values; bf16: the packed pair (the mma operand itself).
template <typename KV>
struct DtFrag;
template <>
struct DtFrag<float> {
    float k[DT_MAXKK][4][2], v[DT_MAXKK][4][2];
};
template <>
struct DtFrag<bf16_t> {
    unsigned k[DT_MAXKK][4], v[DT_MAXKK][4];
};

__device__ __forceinline__ void dt_put(float (&d)[2], float a, float b) {
    d[0] = a;
    d[1] = b;
}
__device__ __forceinline__ void dt_put(unsigned& d, unsigned a, unsigned b) { d = a | (b << 16); }

// One tile's fragments: key r's K row slice at kp + r * krs and V row slice
// at vp + r * vrs (r < 16), keys r >= nvalid read as zeros.
template <typename KV>
__device__ __forceinline__ void dt_load(DtFrag<KV>& f, const KV* __restrict__ kp, const KV* __restrict__ vp,
                                        size_t krs, size_t vrs, int nvalid, int nkk, int g, int c) {
#pragma unroll
    for (int kk = 0; kk < DT_MAXKK; kk++) {
        if (kk >= nkk) break;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = g + 8 * (i & 1);
            const KV* p = kp + (size_t)r * krs + 16 * kk + 2 * c + 8 * (i >> 1);
            const bool ok = r < nvalid;
            dt_put(f.k[kk][i], dt_ld(p, ok), dt_ld(p + 1, ok));
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = 2 * c + 8 * (i >> 1);
            const KV* p = vp + (size_t)r * vrs + 16 * kk + g + 8 * (i & 1);
            dt_put(f.v[kk][i], dt_ld(p, r < nvalid), dt_ld(p + vrs, r + 1 < nvalid));
        }
    }
}

// Tile t's slices of this warp (rows from kw / vw + key * rs, zeros from s1
// on) into one slot of its ring: K [16][kld], then V [16][vld]; one lane per
// 16-byte chunk, round robin.
template <typename KV>
__device__ __forceinline__ void dt_copy(KV* ks, const KV* __restrict__ kw, const KV* __restrict__ vw, int t0,
                                        int s1, size_t rs, int dw, int kld, int vld, int lane) {
    constexpr int VN = 16 / sizeof(KV);
    KV* vs = ks + DT_KEYS * kld;
    const int cpr = dw / VN;  // chunks per row slice
    for (int e = lane; e < DT_KEYS * cpr; e += WARP) {
        const int r = e / cpr, o = (e - r * cpr) * VN;
        const bool ok = t0 + r < s1;
        const size_t src = (size_t)(ok ? t0 + r : 0) * rs + o;
        cp_async16(ks + r * kld + o, kw + src, ok);
        cp_async16(vs + r * vld + o, vw + src, ok);
    }
}

// The four A registers of one product: hi and lo terms (f32) or the pairs (bf16).
__device__ __forceinline__ void dt_split(const float (&x)[4][2], unsigned (&hi)[4], unsigned (&lo)[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) split_bf16x2(x[i][0], x[i][1], hi[i], lo[i]);
}
__device__ __forceinline__ void dt_split(const unsigned (&x)[4], unsigned (&hi)[4], unsigned (&lo)[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        hi[i] = x[i];
        lo[i] = 0u;
    }
}

template <typename KV, bool RING>
__device__ __forceinline__ void dt_attn_impl(const float* __restrict__ q, const KV* __restrict__ kc,
                                             const KV* __restrict__ vc, float* __restrict__ part_o,
                                             float* __restrict__ part_ml, int nh, int nkv, int hd,
                                             const int* __restrict__ pos_dev, int nsplit, float scale,
                                             int stages) {
    constexpr bool LO = sizeof(KV) == 4;
    // Partial scores [2][DT_WARPS][32 lanes][4] (double-buffered by tile
    // parity: one block barrier per tile), then per warp P [16 keys][8 heads + 1].
    __shared__ float sx[2][DT_WARPS][WARP][4];
    __shared__ float sp[DT_WARPS][DT_KEYS][DT_HEADS + 1];
    const int G = nh / nkv;
    const int kvh = blockIdx.x, split = blockIdx.y;
    const int w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int g = lane >> 2, c = lane & 3;
    const int nw = blockDim.x / WARP, dw = hd / nw, nkk = dw / 16, d0 = w * dw;
    const int L = *pos_dev + 1;
    const int chunk = (L + nsplit - 1) / nsplit;
    const int s0 = split * chunk, s1 = min(L, s0 + chunk);
    const int ntiles = s1 > s0 ? (s1 - s0 + DT_KEYS - 1) / DT_KEYS : 0;
    const size_t rs = (size_t)nkv * hd;
    const KV* kw = kc + (size_t)kvh * hd + d0;  // this warp's slice of key 0's row
    const KV* vw = vc + (size_t)kvh * hd + d0;

    // Ring: this warp's slots (K [16][kld] then V [16][vld] each).
    QW_DYN_SMEM(float4, dt_smem);
    const int kld = dw + 8, vld = dw + 16 / (int)sizeof(KV);
    const int slot = DT_KEYS * (kld + vld);
    KV* ring = (KV*)dt_smem + (size_t)w * stages * slot;
    // The first stages - 1 tiles in flight, one commit group each (empty past
    // the end, so the wait count in the loop is uniform).
    auto prologue = [&]() {
        for (int p = 0; p < stages - 1; p++) {
            if (p < ntiles) dt_copy(ring + p * slot, kw, vw, s0 + p * DT_KEYS, s1, rs, dw, kld, vld, lane);
            cp_async_commit();
        }
    };

    DtFrag<KV> cur, nxt;
    // Tiles requested before the wait must end before the newest key (L - 1).
    const int ahead = RING ? stages - 1 : 1;
    const bool early = s1 < L || s0 + ahead * DT_KEYS < L;
    if (early) {
        if (RING) prologue();
        else if (ntiles > 0) dt_load(cur, kw + s0 * rs, vw + s0 * rs, rs, rs, s1 - s0, nkk, g, c);
    }
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    if (!early) {
        if (RING) prologue();
        else if (ntiles > 0) dt_load(cur, kw + s0 * rs, vw + s0 * rs, rs, rs, s1 - s0, nkk, g, c);
    }

    // B of S (k = dims, n = heads): Q[head g][d0 + 16 kk + 2c (+1), + 8 (+1)], scaled and split.
    unsigned qh[DT_MAXKK][2], ql[DT_MAXKK][2];
    {
        const bool hv = g < G;
        const float* qr = q + ((size_t)kvh * G + (hv ? g : 0)) * hd + d0;
#pragma unroll
        for (int kk = 0; kk < DT_MAXKK; kk++) {
            if (kk >= nkk) break;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const float* p = qr + 16 * kk + 2 * c + 8 * j;
                const float x0 = hv ? p[0] * scale : 0.f, x1 = hv ? p[1] * scale : 0.f;
                split_bf16x2(x0, x1, qh[kk][j], ql[kk][j]);
            }
        }
    }

    // O^T accumulators (C layout): o[kk][e] = O[head 2c + (e & 1)][d0 + 16 kk + g + 8 (e >> 1)].
    float o[DT_MAXKK][4];
#pragma unroll
    for (int kk = 0; kk < DT_MAXKK; kk++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[kk][e] = 0.f;
    // Running max and lane-partial sum of heads 2c, 2c + 1 (the same in every warp).
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float(*pw)[DT_HEADS + 1] = sp[w];

    for (int t = 0; t < ntiles; t++) {
        const int t0 = s0 + t * DT_KEYS;
        if (RING) {
            QW_SYNCWARP();  // every lane is done with the slot refilled here (tile t - 1's)
            const int nx = t + stages - 1;
            if (nx < ntiles) dt_copy(ring + (nx % stages) * slot, kw, vw, s0 + nx * DT_KEYS, s1, rs, dw, kld, vld, lane);
            cp_async_ring_step(stages);  // this lane's copies of tile t have landed
            QW_SYNCWARP();  // and every lane's
            const KV* ks = ring + (t % stages) * slot;
            dt_load(cur, ks, ks + DT_KEYS * kld, kld, vld, DT_KEYS, nkk, g, c);
        } else if (t + 1 < ntiles) {
            const size_t at = (size_t)(t0 + DT_KEYS) * rs;
            dt_load(nxt, kw + at, vw + at, rs, rs, s1 - t0 - DT_KEYS, nkk, g, c);
        }

        // Partial S^T over this warp's dims: s[e] = S[key g + 8 (e >> 1)][head 2c + (e & 1)].
        float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int kk = 0; kk < DT_MAXKK; kk++) {
            if (kk >= nkk) break;
            unsigned kh[4], kl[4];
            dt_split(cur.k[kk], kh, kl);
            mma_16816(s, kh, qh[kk][0], qh[kk][1]);
            mma_16816(s, kh, ql[kk][0], ql[kk][1]);
            if (LO) mma_16816(s, kl, qh[kk][0], qh[kk][1]);
        }
        float* xs = sx[t & 1][w][lane];
        xs[0] = s[0];
        xs[1] = s[1];
        xs[2] = s[2];
        xs[3] = s[3];
        __syncthreads();  // every warp's partials of tile t (tile t - 2's buffer is free: all passed t - 1's barrier)
#pragma unroll
        for (int e = 0; e < 4; e++) s[e] = 0.f;
        for (int v = 0; v < nw; v++) {
            const float* ys = sx[t & 1][v][lane];
#pragma unroll
            for (int e = 0; e < 4; e++) s[e] += ys[e];
        }

        // Online softmax per head over the tile's keys below s1 (tile t starts
        // inside the split, so after tile 0 m is finite).
        float corr[2], mn[2];
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (t0 + g + 8 * (e >> 1) >= s1) s[e] = -INFINITY;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = fmaxf(s[h], s[h + 2]);
            mx = fmaxf(mx, SHFL_XOR(mx, 4));
            mx = fmaxf(mx, SHFL_XOR(mx, 8));
            mx = fmaxf(mx, SHFL_XOR(mx, 16));  // over the tile's 16 keys
            mn[h] = fmaxf(m[h], mx);
            corr[h] = expf(m[h] - mn[h]);
            m[h] = mn[h];
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float p = expf(s[e] - mn[e & 1]);
            l[e & 1] = l[e & 1] * (e < 2 ? corr[e & 1] : 1.f) + p;
            pw[g + 8 * (e >> 1)][2 * c + (e & 1)] = p;
        }
#pragma unroll
        for (int kk = 0; kk < DT_MAXKK; kk++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[kk][e] *= corr[e & 1];
        QW_SYNCWARP();
        // B of O^T (k = keys, n = heads): P[key 2c (+1) | 2c + 8 (+1)][head g], split.
        unsigned ph[2], pl[2];
        split_bf16x2(pw[2 * c][g], pw[2 * c + 1][g], ph[0], pl[0]);
        split_bf16x2(pw[2 * c + 8][g], pw[2 * c + 9][g], ph[1], pl[1]);
        QW_SYNCWARP();  // pw is rewritten next tile
#pragma unroll
        for (int kk = 0; kk < DT_MAXKK; kk++) {
            if (kk >= nkk) break;
            unsigned vh[4], vl[4];
            dt_split(cur.v[kk], vh, vl);
            mma_16816(o[kk], vh, ph[0], ph[1]);
            mma_16816(o[kk], vh, pl[0], pl[1]);
            if (LO) mma_16816(o[kk], vl, ph[0], ph[1]);
        }
        if (!RING && t + 1 < ntiles) cur = nxt;
    }

    // Outputs: heads 2c, 2c + 1 (those < G); the sums over the lanes of one c.
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += SHFL_XOR(l[h], 4);
        l[h] += SHFL_XOR(l[h], 8);
        l[h] += SHFL_XOR(l[h], 16);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int head = 2 * c + h;
        if (head >= G) continue;
        const size_t pidx = (size_t)(kvh * G + head) * nsplit + split;
#pragma unroll
        for (int kk = 0; kk < DT_MAXKK; kk++) {
            if (kk >= nkk) break;
            part_o[pidx * hd + d0 + 16 * kk + g] = o[kk][h];
            part_o[pidx * hd + d0 + 16 * kk + g + 8] = o[kk][h + 2];
        }
        if (w == 0 && g == 0) {
            part_ml[pidx * 2] = m[h];
            part_ml[pidx * 2 + 1] = l[h];
        }
    }
}

#else
// HIP has no mma.sync: the kernels exist (every listed name must load) but do
// nothing; the host never launches them in a HIP build.
template <typename KV, bool RING>
__device__ __forceinline__ void dt_attn_impl(const float*, const KV*, const KV*, float*, float*, int, int, int,
                                             const int*, int, float, int) {}
#endif

// Arguments as dec_attn_* (`stages`: ring slots per warp, 2..4, `_ring` only).
// Block 32 nw threads, nw <= DT_WARPS; needs G = nh / nkv <= 8 and hd / nw a
// multiple of 16, at most 16 DT_MAXKK (the host checks).
#define DEC_ATTN_TC(NAME, KV, RING)                                                                           \
    QW_KERNEL void QW_BOUNDS(DT_WARPS * WARP) NAME(const float* __restrict__ q, const KV* __restrict__ kc,    \
                                                   const KV* __restrict__ vc, float* __restrict__ part_o,    \
                                                   float* __restrict__ part_ml, int nh, int nkv, int hd,     \
                                                   const int* __restrict__ pos_dev, int nsplit, float scale, \
                                                   int stages) {                                             \
        dt_attn_impl<KV, RING>(q, kc, vc, part_o, part_ml, nh, nkv, hd, pos_dev, nsplit, scale, stages);     \
    }
DEC_ATTN_TC(dec_attn_f32_tc, float, false)
DEC_ATTN_TC(dec_attn_bf16_tc, bf16_t, false)
DEC_ATTN_TC(dec_attn_f32_tc_ring, float, true)
DEC_ATTN_TC(dec_attn_bf16_tc_ring, bf16_t, true)

// Batched decode (issue 23): sequence b = blockIdx.z, its queries at q + b nh
// hd, K and V at tab[2 b], tab[2 b + 1] (read before the grid dependency wait
// like the position: the host's upload), its position at pos[b]; partials at
// part_o / part_ml + b nh nsplit (hd, 2), as bat_attn_* (decode_attn.cu).
#define BAT_ATTN_TC(NAME, KV, RING)                                                                          \
    QW_KERNEL void QW_BOUNDS(DT_WARPS * WARP)                                                                 \
        NAME(const float* __restrict__ q, const unsigned long long* __restrict__ tab,                         \
             const int* __restrict__ pos, float* __restrict__ part_o, float* __restrict__ part_ml, int nh,     \
             int nkv, int hd, int nsplit, float scale, int stages) {                                          \
        const size_t b = blockIdx.z, parts = (size_t)nh * nsplit;                                             \
        dt_attn_impl<KV, RING>(q + b * nh * hd, (const KV*)tab[2 * b], (const KV*)tab[2 * b + 1],             \
                               part_o + b * parts * hd, part_ml + b * parts * 2, nh, nkv, hd, pos + b, nsplit, \
                               scale, stages);                                                                \
    }
BAT_ATTN_TC(bat_attn_f32_tc, float, false)
BAT_ATTN_TC(bat_attn_bf16_tc, bf16_t, false)
BAT_ATTN_TC(bat_attn_f32_tc_ring, float, true)
BAT_ATTN_TC(bat_attn_bf16_tc_ring, bf16_t, true)
