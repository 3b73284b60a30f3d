// Pieces both tensor-core prompt attentions share (attention.cu's mma.sync
// kernel, attention_wg.cu's warpgroup-MMA one): the online softmax of one
// 32-key tile and the gated store, for a thread's two rows g, g + 8 of a
// 16-row tile in the mma C-fragment layout (lane: g = (lane % 32) >> 2,
// c = lane & 3; s[j][e] is row g + 8 (e >> 1), key 8j + 2c + (e & 1);
// o[j][e] row g + 8 (e >> 1), dim 8j + 2c + (e & 1)).
#pragma once
#include "compat.h"

// The scores s of one tile (log2 units, -inf where masked) become their
// softmax weights: the running maxima m move to the tile's, this lane's
// partial sums l are rescaled to them and gain the weights of this lane's
// columns (the quad is summed at the end); corr is the factor the output rows
// accumulated so far must take (attn_rescale), which the warpgroup kernel
// applies only once its products of the previous tile are done.
__device__ __forceinline__ void attn_softmax_weights(float (&s)[4][4], float (&m)[2], float (&l)[2],
                                                     float (&corr)[2]) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
    float mref[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        mx[i] = fmaxf(mx[i], SHFL_XOR(mx[i], 1));
        mx[i] = fmaxf(mx[i], SHFL_XOR(mx[i], 2));  // max over the quad = the row's 32 keys
        const float mn = fmaxf(m[i], mx[i]);
        // Tile 0 holds key 0, visible to every row, so mn is finite; guarded anyway.
        mref[i] = mn == -INFINITY ? 0.f : mn;
        corr[i] = exp2f(m[i] - mref[i]);  // 0 on the first tile (m = -inf)
        m[i] = mn;
        l[i] *= corr[i];
    }
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float p = exp2f(s[j][e] - mref[e >> 1]);
            s[j][e] = p;
            l[e >> 1] += p;
        }
}

// The output rows o (n8 tiles below hd) times corr (row g: corr[0], g + 8: corr[1]).
template <int DT>
__device__ __forceinline__ void attn_rescale(float (&o)[DT][4], const float (&corr)[2], int hd) {
#pragma unroll
    for (int dt = 0; dt < DT; dt++) {
        if (dt * 8 < hd) {
#pragma unroll
            for (int e = 0; e < 4; e++) o[dt][e] *= corr[e >> 1];
        }
    }
}

// Both: the tile's weights and the output rows rescaled to its maxima.
template <int DT>
__device__ __forceinline__ void attn_softmax_tile(float (&s)[4][4], float (&m)[2], float (&l)[2], float (&o)[DT][4],
                                                  int hd) {
    float corr[2];
    attn_softmax_weights(s, m, l, corr);
    attn_rescale<DT>(o, corr, hd);
}

// out[t][head][d] = O / l * sigmoid(gate) for the thread's rows: pair pa (row
// g) and pb (row g + 8), p = t * G + hg of kv head kvh (rows past npairs are
// skipped); the gate at proj[t * stride + head * 2hd + hd + d].
template <int DT>
__device__ __forceinline__ void attn_store_gated(const float (&o)[DT][4], float (&l)[2], int pa, int pb, int npairs,
                                                 int G, int kvh, int nh, int hd, const float* __restrict__ proj,
                                                 int stride, float* __restrict__ out, int c) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += SHFL_XOR(l[i], 1);
        l[i] += SHFL_XOR(l[i], 2);
        const int p = i == 0 ? pa : pb;
        if (p >= npairs) continue;
        const int t = p / G, head = kvh * G + (p - t * G);
        const float* gate = proj + (size_t)t * stride + (size_t)head * 2 * hd + hd;
        float* op = out + ((size_t)t * nh + head) * hd;
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
            if (dt * 8 < hd) {
                const int d = 8 * dt + 2 * c;
                float2 r;
                r.x = o[dt][2 * i] / l[i] * sigmoid_f(gate[d]);
                r.y = o[dt][2 * i + 1] / l[i] * sigmoid_f(gate[d + 1]);
                *(float2*)(op + d) = r;
            }
        }
    }
}
