// Mixture of experts: router softmax + top-k + renormalisation on the device,
// and the batch-1 routed-expert GEMVs over the k selected experts.
#include "compat.h"

// Per token (one block): p = softmax(logits[t]); the top-k experts by p (ties to the
// lower index); weights p_e / sum_chosen p. E <= 1024, k <= 32.
QW_KERNEL void QW_BOUNDS(256) router_topk(const float* __restrict__ logits, int stride, int E, int k,
                                          int* __restrict__ idx, float* __restrict__ wout) {
    __shared__ float p[1024];
    __shared__ float scratch[32];
    int t = blockIdx.x;
    const float* l = logits + (size_t)t * stride;
    float mx = -INFINITY;
    for (int e = threadIdx.x; e < E; e += blockDim.x) mx = fmaxf(mx, l[e]);
    mx = block_max(mx, scratch);
    float s = 0.f;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float v = expf(l[e] - mx);
        p[e] = v;
        s += v;
    }
    s = block_sum(s, scratch);
    __syncthreads();
    if (threadIdx.x == 0) {
        int chosen[32];
        float total = 0.f;
        for (int j = 0; j < k; j++) {
            int best = -1;
            float bv = -1.f;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int q = 0; q < j; q++) taken |= chosen[q] == e;
                if (!taken && p[e] > bv) { bv = p[e]; best = e; }
            }
            chosen[j] = best;
            total += bv / s;
        }
        for (int j = 0; j < k; j++) {
            idx[t * k + j] = chosen[j];
            wout[t * k + j] = p[chosen[j]] / s / total;
        }
    }
}

// out[j, r] = Wgu[idx[j]][r, :] . x  for the k selected experts; Wgu is [E, R, H]
// (R = 2I: gate rows then up rows). grid (ceil(R / rows_per_block), k).
QW_KERNEL void QW_BOUNDS(256) moe_gemv_gate_up(const bf16_t* __restrict__ Wgu, const float* __restrict__ x,
                                               const int* __restrict__ idx, float* __restrict__ out, int R, int H) {
    int r = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    int j = blockIdx.y;
    if (r >= R) return;
    const bf16_t* w = Wgu + ((size_t)idx[j] * R + r) * H;
    int lane = threadIdx.x % WARP;
    float acc = 0.f;
    if ((H & 7) == 0) {
        const uint4* w4 = (const uint4*)w;
        const float4* x4 = (const float4*)x;
        for (int c = lane; c < (H >> 3); c += WARP) {
            uint4 wv = w4[c];
            float4 a = x4[2 * c], b = x4[2 * c + 1];
            acc += bf_lo(wv.x) * a.x + bf_hi(wv.x) * a.y + bf_lo(wv.y) * a.z + bf_hi(wv.y) * a.w;
            acc += bf_lo(wv.z) * b.x + bf_hi(wv.z) * b.y + bf_lo(wv.w) * b.z + bf_hi(wv.w) * b.w;
        }
    } else {
        for (int c = lane; c < H; c += WARP) acc += bf2f(w[c]) * x[c];
    }
    acc = warp_sum(acc);
    if (lane == 0) out[(size_t)j * R + r] = acc;
}

// y[r] += sum_j wts[j] * Wd[idx[j]][r, :] . act[j, :]; Wd is [E, H, I]. One warp per row.
QW_KERNEL void QW_BOUNDS(256) moe_gemv_down(const bf16_t* __restrict__ Wd, const float* __restrict__ act,
                                            const int* __restrict__ idx, const float* __restrict__ wts,
                                            float* __restrict__ y, int k, int H, int I) {
    int r = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (r >= H) return;
    int lane = threadIdx.x % WARP;
    float total = 0.f;
    for (int j = 0; j < k; j++) {
        const bf16_t* w = Wd + ((size_t)idx[j] * H + r) * I;
        const float* a = act + (size_t)j * I;
        float acc = 0.f;
        if ((I & 7) == 0) {
            const uint4* w4 = (const uint4*)w;
            const float4* a4 = (const float4*)a;
            for (int c = lane; c < (I >> 3); c += WARP) {
                uint4 wv = w4[c];
                float4 p = a4[2 * c], q = a4[2 * c + 1];
                acc += bf_lo(wv.x) * p.x + bf_hi(wv.x) * p.y + bf_lo(wv.y) * p.z + bf_hi(wv.y) * p.w;
                acc += bf_lo(wv.z) * q.x + bf_hi(wv.z) * q.y + bf_lo(wv.w) * q.z + bf_hi(wv.w) * q.w;
            }
        } else {
            for (int c = lane; c < I; c += WARP) acc += bf2f(w[c]) * a[c];
        }
        total += wts[j] * warp_sum(acc);
    }
    if (lane == 0) y[r] += total;
}
