// Gated full attention: q/k (1+w) RMSNorm + partial rotate-half RoPE + KV-cache
// append, then causal GQA attention split over the key length with an online
// softmax per warp, and a combine step that applies the sigmoid output gate.
#include "compat.h"

__device__ __forceinline__ float kv_load(const bf16_t* p) { return bf2f(*p); }
__device__ __forceinline__ float kv_load(const float* p) { return *p; }
__device__ __forceinline__ void kv_store(bf16_t* p, float v) { *p = f2bf(v); }
__device__ __forceinline__ void kv_store(float* p, float v) { *p = v; }

// proj rows [T, stride]: per q head [query hd | gate hd] (nh heads), then k (nkv*hd),
// then v (nkv*hd). grid (T, nh + nkv), block 256 (hd <= 256).
template <typename KV>
__device__ __forceinline__ void attn_prep_impl(const float* __restrict__ proj, int stride,
                                        const float* __restrict__ qnorm, const float* __restrict__ knorm,
                                        float* __restrict__ q_out, KV* __restrict__ kc, KV* __restrict__ vc,
                                        int nh, int nkv, int hd, int rot, int pos0, const int* pos_dev,
                                        float theta, float eps) {
    __shared__ float buf[256];
    if (pos_dev) pos0 = *pos_dev;
    __shared__ float scratch[32];
    int t = blockIdx.x, head = blockIdx.y;
    int i = threadIdx.x;
    const float* row = proj + (size_t)t * stride;
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
    int pos = pos0 + t;
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
            q_out[((size_t)t * nh + head) * hd + i] = y;
        } else {
            size_t at = ((size_t)(pos0 + t) * nkv + kvh) * hd + i;
            kv_store(kc + at, y);
            kv_store(vc + at, row[(size_t)2 * nh * hd + (size_t)nkv * hd + (size_t)kvh * hd + i]);
        }
    }
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
#define FA_BOUNDS __launch_bounds__(256, 2)
#else
// LDS is 64 KB on RDNA: 32 x 16 tiles need 52,480 bytes at hd 256 (a HIP host must size smem with these).
#define FA_BQ 32
#define FA_BK 16
#define FA_BOUNDS __launch_bounds__(256)
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
    extern __shared__ float4 fa_smem[];
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
