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
