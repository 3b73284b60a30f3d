// The decode step's RMSNorm without a norm kernel: every kernel that updates
// the hidden state writes per-block sums of squares of the rows it produced,
// and the next GEMV turns them into 1 / rms in its prologue.
#pragma once
#include "compat.h"

// 1 / rms of the hidden state from the residual kernels' per-block sums of
// squares (ssq[0 .. nssq)), by one warp (every lane gets it).
__device__ __forceinline__ float inv_rms(const float* __restrict__ ssq, int nssq, int dim, float eps) {
    float ss = 0.f;
    for (int i = threadIdx.x % WARP; i < nssq; i += WARP) ss += ssq[i];
    return rsqrtf(warp_sum(ss) / dim + eps);
}

// The residual kernels' epilogue: block b writes the sum of squares of the
// rows it produced (one value per warp in `mine`, lane 0) to ssq_out[b].
__device__ __forceinline__ void write_ssq(float mine, float* __restrict__ ssq_out) {
    __shared__ float part[32];
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    if (lane == 0) part[w] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        for (int i = 0; i < (int)(blockDim.x / WARP); i++) t += part[i];
        ssq_out[blockIdx.x] = t;
    }
}
