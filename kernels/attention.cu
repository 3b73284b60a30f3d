// Gated full attention: q/k (1+w) RMSNorm + partial rotate-half RoPE + KV-cache
// append, then causal GQA attention split over the key length with an online
// softmax per warp, and a combine step that applies the sigmoid output gate.
#include "attn_tile.h"
#include "mma.h"

__device__ __forceinline__ float kv_load(const bf16_t* p) { return bf2f(*p); }
__device__ __forceinline__ float kv_load(const float* p) { return *p; }
__device__ __forceinline__ void kv_store(bf16_t* p, float v) { *p = f2bf(v); }
__device__ __forceinline__ void kv_store(float* p, float v) { *p = v; }

// proj rows [T, stride]: per q head [query hd | gate hd] (nh heads), then k (nkv*hd),
// then v (nkv*hd). grid (T, nh + nkv), block 256 (hd <= 256).
// One token's head blockIdx.y: its projection row `row`, its position `pos`,
// its q heads written to q_row ([nh][hd]).
template <typename KV>
__device__ __forceinline__ void attn_prep_row(const float* __restrict__ row, const float* __restrict__ qnorm,
                                              const float* __restrict__ knorm, float* __restrict__ q_row,
                                              KV* __restrict__ kc, KV* __restrict__ vc, int nh, int nkv, int hd,
                                              int rot, int pos, float theta, float eps) {
    __shared__ float buf[256];
    __shared__ float scratch[32];
    int head = blockIdx.y;
    int i = threadIdx.x;
    bool is_q = head < nh;
    int kvh = head - nh;
    const float* src = is_q ? row + (size_t)head * 2 * hd : row + (size_t)2 * nh * hd + (size_t)kvh * hd;
    const float* w = is_q ? qnorm : knorm;
    float x = i < hd ? src[i] : 0.f;
    float ss = block_sum(x * x, scratch);
    float inv = rsqrtf(ss / hd + eps);
    if (i < hd) buf[i] = x * inv * w[i];
    __syncthreads();
    int half = rot / 2;
    float y = i < hd ? buf[i] : 0.f;
    if (i < rot) {
        int f = i < half ? i : i - half;
        float e = (float)(2 * f) / (float)rot;
        float inv_freq = 1.0f / powf(theta, e);
        float angle = (float)pos * inv_freq;
        double sn, cs;
        sincos((double)angle, &sn, &cs);
        float s = (float)sn, c = (float)cs;
        if (i < half) y = buf[i] * c - buf[i + half] * s;
        else y = buf[i] * c + buf[i - half] * s;
    }
    if (i < hd) {
        if (is_q) {
            q_row[(size_t)head * hd + i] = y;
        } else {
            size_t at = ((size_t)pos * nkv + kvh) * hd + i;
            kv_store(kc + at, y);
            kv_store(vc + at, row[(size_t)2 * nh * hd + (size_t)nkv * hd + (size_t)kvh * hd + i]);
        }
    }
}

template <typename KV>
__device__ __forceinline__ void attn_prep_impl(const float* __restrict__ proj, int stride,
                                        const float* __restrict__ qnorm, const float* __restrict__ knorm,
                                        float* __restrict__ q_out, KV* __restrict__ kc, KV* __restrict__ vc,
                                        int nh, int nkv, int hd, int rot, int pos0, const int* pos_dev,
                                        float theta, float eps) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    if (pos_dev) pos0 = *pos_dev;
    const int t = blockIdx.x;
    attn_prep_row<KV>(proj + (size_t)t * stride, qnorm, knorm, q_out + (size_t)t * nh * hd, kc, vc, nh, nkv, hd,
                      rot, pos0 + t, theta, eps);
}

#define ATTN_PREP(NAME, KV)                                                                                  \
    QW_KERNEL void QW_BOUNDS(256) NAME(const float* __restrict__ proj, int stride, const float* __restrict__ qnorm, \
                                       const float* __restrict__ knorm, float* __restrict__ q_out, KV* __restrict__ kc, \
                                       KV* __restrict__ vc, int nh, int nkv, int hd, int rot, int pos0,           \
                                       const int* pos_dev, float theta, float eps) {                         \
        attn_prep_impl<KV>(proj, stride, qnorm, knorm, q_out, kc, vc, nh, nkv, hd, rot, pos0, pos_dev, theta, eps); \
    }


#define ATT_WARPS 4
#define ATT_MAXD 8  // head_dim <= 256

// grid (T * nh, nsplit), block ATT_WARPS * WARP. Query (t, head) attends to keys
// [split * chunk, min(pos0 + t + 1, (split + 1) * chunk)). Writes the partial
// (unnormalised o, running max m, sum l) for the combine step.
template <typename KV>
__device__ __forceinline__ void attn_partial_impl(const float* __restrict__ q, const KV* __restrict__ kc,
                                           const KV* __restrict__ vc, float* __restrict__ part_o,
                                           float* __restrict__ part_ml, int nh, int nkv, int hd,
                                           int pos0, const int* pos_dev, int chunk, int nsplit, float scale) {
    __shared__ float wm[ATT_WARPS], wl[ATT_WARPS];
    if (pos_dev) pos0 = *pos_dev;
    // chunk <= 0: split the longest query's keys evenly (the position is only known on the device).
    if (chunk <= 0) chunk = (pos0 + (int)gridDim.x / nh + nsplit - 1) / nsplit;
    __shared__ float wacc[ATT_WARPS][256];
    int qi = blockIdx.x, split = blockIdx.y;
    int t = qi / nh, head = qi % nh;
    int kvh = head / (nh / nkv);
    int L = pos0 + t + 1;
    int s0 = split * chunk, s1 = min(L, s0 + chunk);
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    size_t pidx = (size_t)qi * nsplit + split;
    if (s0 >= L) {
        for (int d = threadIdx.x; d < hd; d += blockDim.x) part_o[pidx * hd + d] = 0.f;
        if (threadIdx.x == 0) { part_ml[pidx * 2] = -INFINITY; part_ml[pidx * 2 + 1] = 0.f; }
        return;
    }
    float qv[ATT_MAXD], acc[ATT_MAXD];
    const float* qp = q + (size_t)qi * hd;
#pragma unroll
    for (int j = 0; j < ATT_MAXD; j++) {
        int d = lane + j * WARP;
        qv[j] = d < hd ? qp[d] : 0.f;
        acc[j] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int s = s0 + w; s < s1; s += ATT_WARPS) {
        const KV* kp = kc + ((size_t)s * nkv + kvh) * hd;
        float dot = 0.f;
#pragma unroll
        for (int j = 0; j < ATT_MAXD; j++) {
            int d = lane + j * WARP;
            if (d < hd) dot += qv[j] * kv_load(kp + d);
        }
        dot = warp_sum(dot) * scale;
        float mn = fmaxf(m, dot);
        float corr = expf(m - mn);
        float p = expf(dot - mn);
        l = l * corr + p;
        const KV* vp = vc + ((size_t)s * nkv + kvh) * hd;
#pragma unroll
        for (int j = 0; j < ATT_MAXD; j++) {
            int d = lane + j * WARP;
            if (d < hd) acc[j] = acc[j] * corr + p * kv_load(vp + d);
        }
        m = mn;
    }
    if (lane == 0) { wm[w] = m; wl[w] = l; }
#pragma unroll
    for (int j = 0; j < ATT_MAXD; j++) {
        int d = lane + j * WARP;
        if (d < hd) wacc[w][d] = acc[j];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int i = 0; i < ATT_WARPS; i++) M = fmaxf(M, wm[i]);
    float Lsum = 0.f;
    for (int i = 0; i < ATT_WARPS; i++) Lsum += wm[i] == -INFINITY ? 0.f : wl[i] * expf(wm[i] - M);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.f;
        for (int i = 0; i < ATT_WARPS; i++)
            if (wm[i] != -INFINITY) o += wacc[i][d] * expf(wm[i] - M);
        part_o[pidx * hd + d] = o;
    }
    if (threadIdx.x == 0) { part_ml[pidx * 2] = M; part_ml[pidx * 2 + 1] = Lsum; }
}

#define ATTN_PARTIAL(NAME, KV)                                                                               \
    QW_KERNEL void QW_BOUNDS(128) NAME(const float* __restrict__ q, const KV* __restrict__ kc, const KV* __restrict__ vc, \
                                       float* __restrict__ part_o, float* __restrict__ part_ml, int nh, int nkv, int hd, \
                                       int pos0, const int* pos_dev, int chunk, int nsplit, float scale) {   \
        attn_partial_impl<KV>(q, kc, vc, part_o, part_ml, nh, nkv, hd, pos0, pos_dev, chunk, nsplit, scale); \
    }

// KV cache storage: f32 (default, exact vs the f32 references) or bf16 (half the bytes).
ATTN_PREP(attn_prep_bf16, bf16_t)
ATTN_PREP(attn_prep_f32, float)

// Batched decode (issue 23): sequence b = blockIdx.x, one token at pos[b],
// its projection row b of [B, stride], its K and V caches at tab[2 b] and
// tab[2 b + 1]. grid (B, nh + nkv), block 256.
#define BAT_ATTN_PREP(NAME, KV)                                                                              \
    QW_KERNEL void QW_BOUNDS(256) NAME(const float* __restrict__ proj, int stride, const float* __restrict__ qnorm, \
                                       const float* __restrict__ knorm, float* __restrict__ q_out,            \
                                       const unsigned long long* __restrict__ tab, const int* __restrict__ pos, \
                                       int nh, int nkv, int hd, int rot, float theta, float eps) {           \
        QW_GRID_WAIT();                                                                                       \
        QW_GRID_LAUNCH();                                                                                     \
        const int b = blockIdx.x;                                                                             \
        attn_prep_row<KV>(proj + (size_t)b * stride, qnorm, knorm, q_out + (size_t)b * nh * hd, (KV*)tab[2 * b], \
                          (KV*)tab[2 * b + 1], nh, nkv, hd, rot, pos[b], theta, eps);                         \
    }
BAT_ATTN_PREP(bat_attn_prep_bf16, bf16_t)
BAT_ATTN_PREP(bat_attn_prep_f32, float)
ATTN_PARTIAL(attn_partial_bf16, bf16_t)
ATTN_PARTIAL(attn_partial_f32, float)

// out[t, head, :] = (sum_s o_s e^{m_s - M}) / (sum_s l_s e^{m_s - M}) * sigmoid(gate).
// grid T * nh, block 256.
QW_KERNEL void QW_BOUNDS(256) attn_combine(const float* __restrict__ part_o, const float* __restrict__ part_ml,
                                           const float* __restrict__ proj, int stride, float* __restrict__ out,
                                           int nh, int hd, int nsplit) {
    int qi = blockIdx.x;
    int t = qi / nh, head = qi % nh;
    const float* ml = part_ml + (size_t)qi * nsplit * 2;
    float M = -INFINITY;
    for (int s = 0; s < nsplit; s++) M = fmaxf(M, ml[2 * s]);
    float L = 0.f;
    for (int s = 0; s < nsplit; s++)
        if (ml[2 * s] != -INFINITY) L += ml[2 * s + 1] * expf(ml[2 * s] - M);
    const float* gate = proj + (size_t)t * stride + (size_t)head * 2 * hd + hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.f;
        for (int s = 0; s < nsplit; s++)
            if (ml[2 * s] != -INFINITY) o += part_o[((size_t)qi * nsplit + s) * hd + d] * expf(ml[2 * s] - M);
        out[(size_t)qi * hd + d] = o / L * sigmoid_f(gate[d]);
    }
}

// ---------------------------------------------------------------------------
// Prefill attention (many queries): a flash-attention-style tiled kernel, f32 math.
// One block = FA_BQ consecutive queries of one head; it walks the causal key range
// [0, pos0 + last query] in tiles of FA_BK keys staged in shared memory (K, then V
// in the same buffer), each tile reused by all FA_BQ queries. Online softmax in
// f32 (expf), output / l * sigmoid(gate) as in attn_combine.
//
// Threads (256) form a 16 x 16 grid: tq = tid / 16 owns queries tq + 16 i
// (i < FA_QPT), tk = tid % 16 owns keys tk + 16 j (j < FA_KPT) of the score tile
// and the float4 column groups tk + 16 jj (jj < 4) of the output, so one query's
// row lives in one half-warp (softmax reductions are 16-lane shuffles).
// Shared memory (floats): Q [FA_BQ][hd + 4] + K/V [FA_BK][hd + 4] + P [FA_BQ][FA_BK + 4]
// (CUDA, hd 256: 109,056 bytes). Needs hd % 4 == 0, hd <= 256, nh % nkv == 0.
// grid (nh, ceil(T / FA_BQ)): the last query tiles (the most keys) are scheduled first.
#if defined(QW_CUDA)
#define FA_BQ 64
#define FA_BK 32
#define FA_BOUNDS QW_BOUNDS_MIN(256, 2)
#else
// LDS is 64 KB on RDNA: 32 x 16 tiles need 52,480 bytes at hd 256 (a HIP host must size smem with these).
#define FA_BQ 32
#define FA_BK 16
#define FA_BOUNDS QW_BOUNDS(256)
#endif
#define FA_QPT (FA_BQ / 16)
#define FA_KPT (FA_BK / 16)
#define FA_DJ 4  // float4 column groups per thread: 16 * 4 * 4 = 256 dims

__device__ __forceinline__ float4 kv_load4(const float* p) { return *(const float4*)p; }
__device__ __forceinline__ float4 kv_load4(const bf16_t* p) {
    uint2 w = *(const uint2*)p;
    return make_float4(bf_lo(w.x), bf_hi(w.x), bf_lo(w.y), bf_hi(w.y));
}

// Rows [0, FA_ROWS) of a [rows][hd] tile (global row r at base + r * row_stride
// elements) into dst[r * ld4 + c] as float4; rows >= nvalid are zero.
template <typename T>
__device__ __forceinline__ void fa_stage(float4* __restrict__ dst, const T* __restrict__ base,
                                         size_t row_stride, int rows, int nvalid, int hd4, int ld4) {
    for (int e = threadIdx.x; e < rows * hd4; e += 256) {
        int r = e / hd4, c = e - r * hd4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < nvalid) v = kv_load4(base + (size_t)r * row_stride + 4 * c);
        dst[r * ld4 + c] = v;
    }
}

__device__ __forceinline__ float half_max(float v) {
#pragma unroll
    for (int m = 8; m > 0; m >>= 1) v = fmaxf(v, SHFL_XOR(v, m));
    return v;
}

__device__ __forceinline__ float half_sum(float v) {
#pragma unroll
    for (int m = 8; m > 0; m >>= 1) v += SHFL_XOR(v, m);
    return v;
}

template <typename KV>
__device__ __forceinline__ void attn_flash_impl(const float* __restrict__ q, const KV* __restrict__ kc,
                                                const KV* __restrict__ vc, const float* __restrict__ proj,
                                                int stride, float* __restrict__ out, int T, int nh, int nkv,
                                                int hd, int pos0, float scale) {
    QW_DYN_SMEM(float4, fa_smem);
    const int hd4 = hd >> 2, ld4 = hd4 + 1;  // row stride in float4 (+1: conflict-free LDS.128)
    const int PLD = FA_BK + 4;
    float4* Qs = fa_smem;                      // [FA_BQ][ld4]
    float4* Ks = Qs + FA_BQ * ld4;             // [FA_BK][ld4]: K, then V
    float* Ps = (float*)(Ks + FA_BK * ld4);    // [FA_BQ][PLD]
    const int head = blockIdx.x;
    const int q0 = ((int)gridDim.y - 1 - (int)blockIdx.y) * FA_BQ;
    const int kvh = head / (nh / nkv);
    const int tid = threadIdx.x, tq = tid >> 4, tk = tid & 15;
    const int qend = min(T, q0 + FA_BQ);  // queries [q0, qend)
    const int kend = pos0 + qend;         // keys [0, kend)

    fa_stage<float>(Qs, q + ((size_t)q0 * nh + head) * hd, (size_t)nh * hd, FA_BQ, qend - q0, hd4, ld4);

    float acc[FA_QPT][FA_DJ][4];
    float m[FA_QPT], l[FA_QPT];
#pragma unroll
    for (int i = 0; i < FA_QPT; i++) {
        m[i] = -INFINITY;
        l[i] = 0.f;
#pragma unroll
        for (int jj = 0; jj < FA_DJ; jj++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][jj][e] = 0.f;
    }

    const size_t kv_stride = (size_t)nkv * hd;
    for (int k0 = 0; k0 < kend; k0 += FA_BK) {
        const int nvalid = min(FA_BK, kend - k0);
        const size_t tile = ((size_t)k0 * nkv + kvh) * hd;
        fa_stage<KV>(Ks, kc + tile, kv_stride, FA_BK, nvalid, hd4, ld4);
        __syncthreads();  // Q (first pass) and K staged

        float s[FA_QPT][FA_KPT];
#pragma unroll
        for (int i = 0; i < FA_QPT; i++)
#pragma unroll
            for (int j = 0; j < FA_KPT; j++) s[i][j] = 0.f;
        for (int c = 0; c < hd4; c++) {
            float4 qv[FA_QPT], kv[FA_KPT];
#pragma unroll
            for (int i = 0; i < FA_QPT; i++) qv[i] = Qs[(tq + 16 * i) * ld4 + c];
#pragma unroll
            for (int j = 0; j < FA_KPT; j++) kv[j] = Ks[(tk + 16 * j) * ld4 + c];
#pragma unroll
            for (int i = 0; i < FA_QPT; i++)
#pragma unroll
                for (int j = 0; j < FA_KPT; j++) {
                    float a = s[i][j];
                    a = fmaf(qv[i].x, kv[j].x, a);
                    a = fmaf(qv[i].y, kv[j].y, a);
                    a = fmaf(qv[i].z, kv[j].z, a);
                    a = fmaf(qv[i].w, kv[j].w, a);
                    s[i][j] = a;
                }
        }

        // Online softmax per query row (its 16 threads are one half-warp).
#pragma unroll
        for (int i = 0; i < FA_QPT; i++) {
            const int r = tq + 16 * i;
            const int last = pos0 + q0 + r;  // last visible key of this query
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < FA_KPT; j++) {
                const int key = k0 + tk + 16 * j;
                float v = key <= last && key < kend ? s[i][j] * scale : -INFINITY;
                s[i][j] = v;
                mx = fmaxf(mx, v);
            }
            mx = half_max(mx);
            // The first tile holds key 0, visible to every query: mn is finite from then on.
            const float mn = fmaxf(m[i], mx);
            const float corr = expf(m[i] - mn);
            float rs = 0.f;
#pragma unroll
            for (int j = 0; j < FA_KPT; j++) {
                float p = expf(s[i][j] - mn);
                Ps[r * PLD + tk + 16 * j] = p;
                rs += p;
            }
            rs = half_sum(rs);
            l[i] = l[i] * corr + rs;
            m[i] = mn;
#pragma unroll
            for (int jj = 0; jj < FA_DJ; jj++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[i][jj][e] *= corr;
        }
        __syncthreads();  // K reads done, P visible
        fa_stage<KV>(Ks, vc + tile, kv_stride, FA_BK, nvalid, hd4, ld4);
        __syncthreads();  // V staged

        for (int kk = 0; kk < FA_BK; kk += 4) {
            float4 pv[FA_QPT];
#pragma unroll
            for (int i = 0; i < FA_QPT; i++) pv[i] = *(const float4*)(Ps + (tq + 16 * i) * PLD + kk);
#pragma unroll
            for (int u = 0; u < 4; u++) {
#pragma unroll
                for (int jj = 0; jj < FA_DJ; jj++) {
                    const int c = tk + 16 * jj;
                    if (c < hd4) {
                        const float4 v = Ks[(kk + u) * ld4 + c];
#pragma unroll
                        for (int i = 0; i < FA_QPT; i++) {
                            const float p = u == 0 ? pv[i].x : u == 1 ? pv[i].y : u == 2 ? pv[i].z : pv[i].w;
                            acc[i][jj][0] = fmaf(p, v.x, acc[i][jj][0]);
                            acc[i][jj][1] = fmaf(p, v.y, acc[i][jj][1]);
                            acc[i][jj][2] = fmaf(p, v.z, acc[i][jj][2]);
                            acc[i][jj][3] = fmaf(p, v.w, acc[i][jj][3]);
                        }
                    }
                }
            }
        }
        __syncthreads();  // V and P reads done before the next tile overwrites them
    }

#pragma unroll
    for (int i = 0; i < FA_QPT; i++) {
        const int t = q0 + tq + 16 * i;
        if (t >= T) continue;
        const float* gate = proj + (size_t)t * stride + (size_t)head * 2 * hd + hd;
        float* o = out + ((size_t)t * nh + head) * hd;
#pragma unroll
        for (int jj = 0; jj < FA_DJ; jj++) {
            const int c = tk + 16 * jj;
            if (c < hd4) {
#pragma unroll
                for (int e = 0; e < 4; e++) o[4 * c + e] = acc[i][jj][e] / l[i] * sigmoid_f(gate[4 * c + e]);
            }
        }
    }
}

#define ATTN_FLASH(NAME, KV)                                                                                 \
    QW_KERNEL void FA_BOUNDS NAME(const float* __restrict__ q, const KV* __restrict__ kc,                    \
                                  const KV* __restrict__ vc, const float* __restrict__ proj, int stride,     \
                                  float* __restrict__ out, int T, int nh, int nkv, int hd, int pos0,         \
                                  float scale) {                                                             \
        attn_flash_impl<KV>(q, kc, vc, proj, stride, out, T, nh, nkv, hd, pos0, scale);                      \
    }

ATTN_FLASH(attn_flash_f32, float)
ATTN_FLASH(attn_flash_bf16, bf16_t)

// ---------------------------------------------------------------------------
// Prefill attention on tensor cores (CUDA, sm_80+): `attn_flash_tc_*`, the results
// of `attn_flash_*` above, mma.sync m16n8k16 bf16 with f32 accumulation and every
// f32 operand split into two bf16 terms, x = hi + lo with hi = bf16(x),
// lo = bf16(x - hi) (~16 mantissa bits; plain bf16 fails the fixtures):
//   S = Q K^T ~ Qh Kh + (Ql Kh + Qh Kl),  O += P V ~ Ph Vh + Pl Vh + Ph Vl.
// K and V come as bf16 planes [pos][nkv][hd] (the cache's layout): with an f32
// cache `attn_kv_split` writes Kh, Kl, Vh, Vl once per prefill pass (every block
// then streams ready-made tiles, no per-block split); a bf16 cache is its own hi
// plane and exact in one term (Kl = Vl = 0): those products are skipped (LO = 0).
//
// Rows: a block takes ROWS = 16 NW consecutive (query, q-head) pairs of ONE kv head,
// pair p = t * G + hg (G = nh / nkv, q head = kvh * G + hg), so every K/V tile staged
// in shared memory serves all G heads of the group (at G = 8 and NW = 8: 16 queries
// x 8 heads, and the causal diagonal costs almost nothing). Warp w owns rows
// 16w..16w+15 (one m16 tile); its O accumulator (16 x hd f32) lives in registers
// (hd / 2 per lane), FlashAttention-2 style: the S C-fragments of two adjacent n8
// tiles are the A fragment of P for one k16 step of P V, so P never touches shared
// memory. Online softmax in f32 with exp2 (scores pre-scaled by scale * log2 e),
// running max / sum per row, l kept per lane and reduced over the quad at the end.
// A warp skips a tile none of its rows may see (exact: such a tile adds nothing).
//
// Keys in tiles of TC_BK = 32. Shared memory (bf16, row stride ld = hd + 8, which
// makes every ldmatrix phase conflict-free):
//   Qh, Ql [ROWS][ld] | Kh, Vh [32][ld] | (LO) Kl, Vl [32][ld]
// One K and one V buffer, FlashAttention-2 order: K tile j + 1 loads (cp.async,
// 16-byte chunks straight into the ldmatrix layout, zero-filled past the last key)
// while P V of tile j runs, V tile j while S of tile j runs.
// hd 256, NW 8: 202,752 bytes (LO), 168,960 (bf16 cache); NW 4: 135,168 / 101,376.
// grid (ceil(T * G / ROWS), nkv): the pair tiles with the most keys first, kv head 0's
// tiles first (concurrent blocks scan the same K/V: L2 reuse); block 32 NW threads.
// Needs hd % 16 == 0, 16 <= hd <= 256, nh % nkv == 0 (the host checks). HDC > 0
// compiles the head dim in (the model's 256); HDC == 0 reads it from the argument.
// The CPU harness (QW_CPU) runs this code on mma.h's emulated mma, ldmatrix and cp.async
// (tests/kernels_cpu/attn_tc_check.cpp).
//
// Fragment layouts (lane = threadIdx % 32, g = lane >> 2, c = lane & 3):
//   A 16x16: a0 = A[g][2c,2c+1], a1 = A[g+8][2c..], a2 = A[g][2c+8..], a3 = A[g+8][2c+8..]
//   B 16x8 (k x n): b0 = B[2c,2c+1][g], b1 = B[2c+8..][g];   C 16x8: c0,c1 = C[g][2c..], c2,c3 = C[g+8][2c..]
// ldmatrix.x4: lanes 8i..8i+7 address the 8 rows of matrix i (16 contiguous bytes each);
// register i of lane (g, c) gets M_i[g][2c, 2c+1] (.trans: M_i[2c, 2c+1][g]).
#define TC_BK 32
#define TC_PAD 8
#define TC_MAXD 256

#if defined(QW_CUDA) || defined(QW_CPU)

// Keys [k0, k0 + TC_BK) of kv head kvh from the planes gh (and gl when LO),
// [pos][nkv][hd] bf16, into the tiles sh, sl [TC_BK][ld] (16-byte cp.async chunks;
// rows >= kend are zero-filled, no bytes read), one commit group.
template <bool LO, int NW>
__device__ __forceinline__ void tc_load(bf16_t* sh, bf16_t* sl, const bf16_t* __restrict__ gh,
                                        const bf16_t* __restrict__ gl, int k0, int kend, int nkv, int kvh, int hd,
                                        int ld) {
    const int cpr = hd >> 3;  // chunks per row
    const unsigned ssh = smem_addr(sh), ssl = smem_addr(sl);
    for (int e = threadIdx.x; e < TC_BK * cpr; e += NW * WARP) {
        const int r = e / cpr, ch = e - r * cpr;
        const int key = k0 + r;
        const bool ok = key < kend;
        const size_t gofs = ((size_t)(ok ? key : 0) * nkv + kvh) * hd + 8 * ch;
        const unsigned so = (unsigned)(r * ld + 8 * ch) * 2;
        cp_async16(ssh + so, gh + gofs, ok);
        if (LO) cp_async16(ssl + so, gl + gofs, ok);
    }
    cp_async_commit();
}

template <bool LO, int HDC, int NW>
__device__ __forceinline__ void attn_flash_tc_impl(const float* __restrict__ q, const bf16_t* __restrict__ kh_g,
                                                   const bf16_t* __restrict__ kl_g, const bf16_t* __restrict__ vh_g,
                                                   const bf16_t* __restrict__ vl_g, const float* __restrict__ proj,
                                                   int stride, float* __restrict__ out, int T, int nh, int nkv,
                                                   int hd_arg, int pos0, float scale) {
    constexpr int ROWS = 16 * NW;
    constexpr int NT = TC_BK / 8;  // n8 tiles of S per warp
    static_assert(NT == 4, "attn_softmax_tile takes 32-key tiles");
    constexpr int DT = TC_MAXD / 8;  // n8 tiles of O (hd / 8 used)
    const int hd = HDC > 0 ? HDC : hd_arg;
    const int ld = hd + TC_PAD;

    QW_DYN_SMEM(float4, tc_smem);
    bf16_t* Qh = (bf16_t*)tc_smem;   // [ROWS][ld]
    bf16_t* Ql = Qh + ROWS * ld;     // [ROWS][ld]
    bf16_t* Kh = Ql + ROWS * ld;     // [TC_BK][ld]
    bf16_t* Vh = Kh + TC_BK * ld;    // [TC_BK][ld]
    bf16_t* Kl = Vh + TC_BK * ld;    // [TC_BK][ld] (LO only)
    bf16_t* Vl = Kl + TC_BK * ld;    // [TC_BK][ld] (LO only)

    const int G = nh / nkv;
    const int kvh = blockIdx.y;
    const int npairs = T * G;
    const int p0 = ((int)gridDim.x - 1 - (int)blockIdx.x) * ROWS;  // most keys first
    const int plast = min(npairs, p0 + ROWS) - 1;
    const int kend = pos0 + plast / G + 1;  // keys [0, kend) cover every row of the block
    const int ntiles = (kend + TC_BK - 1) / TC_BK;

    tc_load<LO, NW>(Kh, Kl, kh_g, kl_g, 0, kend, nkv, kvh, hd, ld);

    // Q rows of the block, split into hi / lo (rows past the last pair are zero).
    {
        const int n4 = hd >> 2;
        for (int e = threadIdx.x; e < ROWS * n4; e += NW * WARP) {
            const int r = e / n4, c4 = e - r * n4;
            const int p = p0 + r;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (p < npairs) {
                const int t = p / G, head = kvh * G + (p - t * G);
                v = *(const float4*)(q + ((size_t)t * nh + head) * hd + 4 * c4);
            }
            uint2 h, l;
            split_bf16x2(v.x, v.y, h.x, l.x);
            split_bf16x2(v.z, v.w, h.y, l.y);
            *(uint2*)(Qh + r * ld + 4 * c4) = h;
            *(uint2*)(Ql + r * ld + 4 * c4) = l;
        }
    }

    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    const int g = lane >> 2, c = lane & 3;
    // This lane's two rows (g, g + 8 of the warp's m16 tile): the last key each may see.
    const int pa = p0 + 16 * w + g, pb = pa + 8;
    const int last_a = pos0 + min(pa, npairs - 1) / G;
    const int last_b = pos0 + min(pb, npairs - 1) / G;
    // Pairs are in query order: the warp's first row sees the fewest keys, its last the most.
    const int warp_last = pos0 + min(p0 + 16 * w, npairs - 1) / G;
    const int warp_end = pos0 + min(p0 + 16 * w + 15, npairs - 1) / G;

    // ldmatrix row addresses (lane l addresses row l & 7 of matrix l >> 3).
    // A (Q rows, k along d):  matrix i = (rows +8 (i & 1), cols +8 (i >> 1)) -> a0..a3.
    // B of S (K rows = keys n, k along d): matrix i = (keys +8 (i >> 1), d +8 (i & 1))
    //   -> b0, b1 of n-tile 2np, b0, b1 of n-tile 2np + 1.
    // B of PV (.trans; V rows = keys = k, cols = d = n): matrix i = (keys +8 (i & 1), d +8 (i >> 1))
    //   -> b0, b1 of n-tile 2dp, b0, b1 of n-tile 2dp + 1.
    const int r8 = lane & 7, bit3 = (lane >> 3) & 1, bit4 = lane >> 4;
    const int a_off = (16 * w + r8 + 8 * bit3) * ld + 8 * bit4;
    const int b_off = (r8 + 8 * bit4) * ld + 8 * bit3;
    const int v_off = (r8 + 8 * bit3) * ld + 8 * bit4;
    const unsigned sQh = smem_addr(Qh + a_off), sQl = smem_addr(Ql + a_off);
    const unsigned sKh = smem_addr(Kh + b_off), sKl = smem_addr(Kl + b_off);
    const unsigned sVh = smem_addr(Vh + v_off), sVl = smem_addr(Vl + v_off);

    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[dt][e] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const float sl = scale * 1.4426950408889634f;  // scores in log2 units

    for (int jt = 0; jt < ntiles; jt++) {
        const int k0 = jt * TC_BK;
        const bool active = k0 <= warp_end;  // some row of this warp sees some key of the tile
        cp_async_wait<0>();
        __syncthreads();  // K tile jt landed (and Q staged); every warp is done with V tile jt - 1
        tc_load<LO, NW>(Vh, Vl, vh_g, vl_g, k0, kend, nkv, kvh, hd, ld);

        // S = Q K^T for 16 rows x 32 keys: s (hi x hi) and sc (the cross terms) are
        // separate accumulators (more independent mma chains, small terms summed apart).
        float s[NT][4], sc[NT][4];
        if (active) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[nt][e] = sc[nt][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < TC_MAXD / 16; kk++) {
                if (kk * 16 < hd) {
                    unsigned qh[4], ql[4];
                    ldmatrix_x4(qh, sQh + kk * 32);
                    ldmatrix_x4(ql, sQl + kk * 32);
#pragma unroll
                    for (int np = 0; np < NT / 2; np++) {
                        const unsigned kofs = (unsigned)(np * 16 * ld + kk * 16) * 2;
                        unsigned kh[4];
                        ldmatrix_x4(kh, sKh + kofs);
                        mma_16816(s[2 * np], qh, kh[0], kh[1]);
                        mma_16816(s[2 * np + 1], qh, kh[2], kh[3]);
                        mma_16816(sc[2 * np], ql, kh[0], kh[1]);
                        mma_16816(sc[2 * np + 1], ql, kh[2], kh[3]);
                        if (LO) {
                            unsigned kl[4];
                            ldmatrix_x4(kl, sKl + kofs);
                            mma_16816(sc[2 * np], qh, kl[0], kl[1]);
                            mma_16816(sc[2 * np + 1], qh, kl[2], kl[3]);
                        }
                    }
                }
            }

            // Online softmax. s[nt][e]: row g (e < 2) or g + 8, key k0 + 8 nt + 2c + (e & 1).
            const bool diag = k0 + TC_BK - 1 > warp_last;  // some key of the tile is masked for some row
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float v = (s[nt][e] + sc[nt][e]) * sl;
                    if (diag && k0 + 8 * nt + 2 * c + (e & 1) > (e < 2 ? last_a : last_b)) v = -INFINITY;
                    s[nt][e] = v;
                }
            attn_softmax_tile<DT>(s, m, l, o, hd);
        }

        cp_async_wait<0>();
        __syncthreads();  // V tile jt landed; every warp is done with K tile jt
        if (jt + 1 < ntiles) tc_load<LO, NW>(Kh, Kl, kh_g, kl_g, k0 + TC_BK, kend, nkv, kvh, hd, ld);

        // O += P V: k16 step j takes the C fragments of n-tiles 2j, 2j + 1 as its A fragment.
        if (active) {
#pragma unroll
            for (int j = 0; j < TC_BK / 16; j++) {
                unsigned ph[4], pl[4];
                split_bf16x2(s[2 * j][0], s[2 * j][1], ph[0], pl[0]);          // row g,     keys 16j + 2c
                split_bf16x2(s[2 * j][2], s[2 * j][3], ph[1], pl[1]);          // row g + 8, keys 16j + 2c
                split_bf16x2(s[2 * j + 1][0], s[2 * j + 1][1], ph[2], pl[2]);  // row g,     keys 16j + 8 + 2c
                split_bf16x2(s[2 * j + 1][2], s[2 * j + 1][3], ph[3], pl[3]);  // row g + 8, keys 16j + 8 + 2c
#pragma unroll
                for (int dp = 0; dp < DT / 2; dp++) {
                    if (dp * 16 < hd) {
                        const unsigned vofs = (unsigned)(j * 16 * ld + dp * 16) * 2;
                        unsigned vh[4];
                        ldmatrix_x4_trans(vh, sVh + vofs);
                        mma_16816(o[2 * dp], ph, vh[0], vh[1]);
                        mma_16816(o[2 * dp + 1], ph, vh[2], vh[3]);
                        mma_16816(o[2 * dp], pl, vh[0], vh[1]);
                        mma_16816(o[2 * dp + 1], pl, vh[2], vh[3]);
                        if (LO) {
                            unsigned vl[4];
                            ldmatrix_x4_trans(vl, sVl + vofs);
                            mma_16816(o[2 * dp], ph, vl[0], vl[1]);
                            mma_16816(o[2 * dp + 1], ph, vl[2], vl[3]);
                        }
                    }
                }
            }
        }
    }

    attn_store_gated<DT>(o, l, pa, pb, npairs, G, kvh, nh, hd, proj, stride, out, c);
}

#else
// HIP has no mma.sync: the kernels exist (every listed name must load) but do
// nothing; the host never launches them in a HIP build.
template <bool LO, int HDC, int NW>
__device__ __forceinline__ void attn_flash_tc_impl(const float*, const bf16_t*, const bf16_t*, const bf16_t*,
                                                   const bf16_t*, const float*, int, float*, int, int, int, int, int,
                                                   float) {}
#endif

// The f32 K and V cache rows [0, n) (n4 = n * nkv * hd / 4 float4s) as bf16 hi / lo
// planes in the cache's layout for `attn_flash_tc_f32*`: hi = bf16(x), lo = bf16(x - hi).
QW_KERNEL void QW_BOUNDS(256) attn_kv_split(const float* __restrict__ kc, const float* __restrict__ vc,
                                            bf16_t* __restrict__ kh, bf16_t* __restrict__ kl,
                                            bf16_t* __restrict__ vh, bf16_t* __restrict__ vl, long long n4) {
#if defined(QW_CUDA) || defined(QW_CPU)
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n4;
         e += (long long)gridDim.x * blockDim.x) {
        const float4 k = ((const float4*)kc)[e], v = ((const float4*)vc)[e];
        uint2 h, l;
        split_bf16x2(k.x, k.y, h.x, l.x);
        split_bf16x2(k.z, k.w, h.y, l.y);
        ((uint2*)kh)[e] = h;
        ((uint2*)kl)[e] = l;
        split_bf16x2(v.x, v.y, h.x, l.x);
        split_bf16x2(v.z, v.w, h.y, l.y);
        ((uint2*)vh)[e] = h;
        ((uint2*)vl)[e] = l;
    }
#endif
}

// Arguments: q, Kh, Kl, Vh, Vl (bf16 planes; Kl, Vl unused without LO), proj, stride, out,
// T, nh, nkv, hd, pos0, scale.
#define ATTN_FLASH_TC(NAME, LO, HDC, NW)                                                                      \
    QW_KERNEL void QW_BOUNDS_MIN(NW * WARP, 1)                                                                \
        NAME(const float* __restrict__ q, const bf16_t* __restrict__ kh, const bf16_t* __restrict__ kl,        \
             const bf16_t* __restrict__ vh, const bf16_t* __restrict__ vl, const float* __restrict__ proj,     \
             int stride, float* __restrict__ out, int T, int nh, int nkv, int hd, int pos0, float scale) {     \
        attn_flash_tc_impl<LO, HDC, NW>(q, kh, kl, vh, vl, proj, stride, out, T, nh, nkv, hd, pos0, scale);   \
    }

// f32 cache (split planes, LO) / bf16 cache; `_d256`: head_dim 256 compiled in (the
// model), the others any hd % 16 == 0 <= 256; 8 warps (128 rows) per block, `_w4`:
// 4 warps (64 rows) where the device has less shared memory per block (A100).
ATTN_FLASH_TC(attn_flash_tc_f32, true, 0, 8)
ATTN_FLASH_TC(attn_flash_tc_bf16, false, 0, 8)
ATTN_FLASH_TC(attn_flash_tc_f32_d256, true, 256, 8)
ATTN_FLASH_TC(attn_flash_tc_bf16_d256, false, 256, 8)
ATTN_FLASH_TC(attn_flash_tc_f32_w4, true, 0, 4)
ATTN_FLASH_TC(attn_flash_tc_bf16_w4, false, 0, 4)
