// The decode step's Gated DeltaNet (batch 1 and batched, issue 23): the
// causal conv + SiLU of the projection row and the delta-rule step with the
// head's gated RMSNorm (kernels/decode.cu describes the fused decode step).
#include "compat.h"

// The delta-rule step (T = 1) of value head hv with the state in registers
// (thread (c, ty) holds S[ty + RG j][c]), then the head's gated RMSNorm:
// out[hv, c] = rmsnorm(o)[c] * nw[c] * silu(z[hv, c]) -- the input of the out
// projection. sr: this thread's state rows (gdn_load_state); qs, ks: the
// head's q and k after the conv and SiLU in shared memory, ready (a block
// barrier before the call), with qinv, kinv their L2 norms' inverses (q's
// times 1/sqrt(dk)): the products are taken with the raw vectors and
// scaled once; v: this thread's value (column c); decay = exp(g), b = beta.
// block (32 * ceil(dv / 32), RG = 4), dk <= 4 * 32.
#define GS_RG 4
#define GS_ROWS 32

// The state rows of thread (c, ty) of value head hv. The state is this
// layer's own, last written by this kernel one token earlier, so it is read
// before the grid dependency wait, while the in projection still streams.
__device__ __forceinline__ void gdn_load_state(const float* __restrict__ S, int hv, int dk, int dv,
                                               float (&sr)[GS_ROWS]) {
    const int c = threadIdx.x, ty = threadIdx.y;
    const float* Sh = S + (size_t)hv * dk * dv;
#pragma unroll
    for (int j = 0; j < GS_ROWS; j++) {
        int i = ty + GS_RG * j;
        sr[j] = (c < dv && i < dk) ? Sh[(size_t)i * dv + c] : 0.f;
    }
}

// Thread (c, ty)'s part of k . S[:, c] over its rows.
__device__ __forceinline__ float gdn_rows_dot(const float (&sr)[GS_ROWS], const float* ks, int ty, int dk) {
    float p = 0.f;
#pragma unroll
    for (int j = 0; j < GS_ROWS; j++) {
        int i = ty + GS_RG * j;
        if (i < dk) p += ks[i] * sr[j];
    }
    return p;
}

// The delta-rule update of thread (c, ty)'s rows, S = decay S + k kd^T,
// returning its part of q . S[:, c] after it.
__device__ __forceinline__ float gdn_rows_update(float (&sr)[GS_ROWS], const float* qs, const float* ks, float decay,
                                                 float kd, int ty, int dk) {
    float o = 0.f;
#pragma unroll
    for (int j = 0; j < GS_ROWS; j++) {
        int i = ty + GS_RG * j;
        if (i < dk) {
            float sv = sr[j] * decay + ks[i] * kd;
            sr[j] = sv;
            o += qs[i] * sv;
        }
    }
    return o;
}

// Thread (c, ty)'s rows back into the head's state Sh.
__device__ __forceinline__ void gdn_rows_store(const float (&sr)[GS_ROWS], float* __restrict__ Sh, int c, int ty,
                                               int dk, int dv) {
#pragma unroll
    for (int j = 0; j < GS_ROWS; j++) {
        int i = ty + GS_RG * j;
        if (c < dv && i < dk) Sh[(size_t)i * dv + c] = sr[j];
    }
}

__device__ __forceinline__ void gdn_head_step(float (&sr)[GS_ROWS], const float* qs, const float* ks, float qinv,
                                              float kinv, float v, float decay, float b, int hv, int dk, int dv,
                                              float* __restrict__ S,
                                              const float* __restrict__ z, const float* __restrict__ nw, float eps,
                                              float* __restrict__ out) {
    __shared__ float red[GS_RG][128];
    __shared__ float wsum[32];
    int c = threadIdx.x, ty = threadIdx.y;
    bool valid = c < dv;
    float* Sh = S + (size_t)hv * dk * dv;
    red[ty][c] = gdn_rows_dot(sr, ks, ty, dk);
    __syncthreads();
    float kv = 0.f;
    for (int r = 0; r < GS_RG; r++) kv += red[r][c];
    kv *= kinv * decay;
    const float kd = b * (v - kv) * kinv;  // the update along the normalised k
    __syncthreads();
    red[ty][c] = gdn_rows_update(sr, qs, ks, decay, kd, ty, dk);
    gdn_rows_store(sr, Sh, c, ty, dk, dv);
    __syncthreads();
    // Row ty == 0 (warps 0 .. blockDim.x / 32) finishes: o, the head's norm, the gate.
    if (ty == 0) {
        float oc = 0.f;
        for (int r = 0; r < GS_RG; r++) oc += red[r][c];
        oc *= qinv;
        float sq = warp_sum(valid ? oc * oc : 0.f);
        if (c % WARP == 0) wsum[c / WARP] = sq;
        red[0][c] = oc;
    }
    __syncthreads();
    if (ty == 0 && valid) {
        float ss = 0.f;
        for (int i = 0; i < (int)(blockDim.x / WARP); i++) ss += wsum[i];
        float inv = rsqrtf(ss / dv + eps);
        out[(size_t)hv * dv + c] = red[0][c] * inv * nw[c] * silu_f(z[(size_t)hv * dv + c]);
    }
}

// The inverses of the head's q and k L2 norms (q's times q_scale), each
// warp summing the squares of qs and ks (in shared memory, ready) itself.
__device__ __forceinline__ void gdn_qk_inv(const float* qs, const float* ks, int dk, float q_scale, float& qinv,
                                           float& kinv) {
    const int lane = (threadIdx.y * blockDim.x + threadIdx.x) % WARP;
    float sq = 0.f, sk = 0.f;
    for (int i = lane; i < dk; i += WARP) {
        sq += qs[i] * qs[i];
        sk += ks[i] * ks[i];
    }
    qinv = rsqrtf(warp_sum(sq) + 1e-6f) * q_scale, kinv = rsqrtf(warp_sum(sk) + 1e-6f);
}

// One value head per block: gdn_head_step on the projection row after the
// conv (q, k, v after conv and SiLU: dec_gdn_conv, or dec_gemv_bulk_conv's
// epilogue), with the head's q/k L2 norms (each warp sums the squares
// itself, so no block barrier is added) and gates (beta = sigmoid(b),
// g = -exp(A_log) softplus(a + dt_bias); a at ab[hv], b at ab[nv + hv])
// taken here.
__device__ __forceinline__ void dec_gdn_step_impl(const float* __restrict__ proj, int nk, int nv, int dk, int dv,
                                                  const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                                  const float* __restrict__ ab, float q_scale, float* __restrict__ S,
                                                  const float* __restrict__ z, const float* __restrict__ nw, float eps,
                                                  float* __restrict__ out) {
    __shared__ float qs[GS_RG * GS_ROWS], ks[GS_RG * GS_ROWS];
    int hv = blockIdx.x;
    float sr[GS_ROWS];
    gdn_load_state(S, hv, dk, dv, sr);
    const float al = a_log[hv], db = dt_bias[hv];
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
    int hk = hv / (nv / nk), key_dim = nk * dk;
    for (int i = tid; i < dk; i += nt) {
        qs[i] = proj[hk * dk + i];
        ks[i] = proj[key_dim + hk * dk + i];
    }
    const int c = threadIdx.x;
    float v = c < dv ? proj[2 * key_dim + hv * dv + c] : 0.f;
    const float b = sigmoid_f(ab[nv + hv]);
    const float decay = expf(-expf(al) * softplus_f(ab[hv] + db));
    __syncthreads();
    float qinv, kinv;
    gdn_qk_inv(qs, ks, dk, q_scale, qinv, kinv);
    gdn_head_step(sr, qs, ks, qinv, kinv, v, decay, b, hv, dk, dv, S, z, nw, eps, out);
}
QW_KERNEL void QW_BOUNDS(512) dec_gdn_step(const float* __restrict__ proj, int nk, int nv, int dk, int dv,
                                          const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                          int a_off, float q_scale, float* __restrict__ S,
                                          const float* __restrict__ z, const float* __restrict__ nw, float eps,
                                          float* __restrict__ out) {
    dec_gdn_step_impl(proj, nk, nv, dk, dv, a_log, dt_bias, proj + a_off, q_scale, S, z, nw, eps, out);
}

// Batched decode (issue 23): one launch steps B sequences, row b of the
// step's [B, stride] projections = blockIdx.y, its recurrent state at
// tab[2 b + 1] (the layer's per-row table: conv window, state), z at
// z_off in the row, its a | b at ab + b ab_stride (in the row, or rows of
// their own where an FP8 in projection leaves them to a bf16 GEMM of their
// own); out rows [B, out_stride]. The same arithmetic per row as
// dec_gdn_step, and as there the state (and the table, the host's upload)
// is read before the grid dependency wait. Two blocks per multiprocessor
// (64 registers, a few spilled): with one (108 registers) the states of B =
// 64 rows streamed at 2.0 TB/s in and out on the H200 (ncu), each block's
// loads, arithmetic and stores one after the other.
QW_KERNEL void QW_BOUNDS_MIN(512, 2) bat_gdn_step(const float* __restrict__ proj, int stride, int nk, int nv, int dk,
                                          int dv, const float* __restrict__ a_log,
                                          const float* __restrict__ dt_bias, const float* __restrict__ ab,
                                          int ab_stride, float q_scale, const unsigned long long* __restrict__ tab,
                                          int z_off, const float* __restrict__ nw, float eps,
                                          float* __restrict__ out, int out_stride) {
    const int b = blockIdx.y;
    const float* row = proj + (size_t)b * stride;
    dec_gdn_step_impl(row, nk, nv, dk, dv, a_log, dt_bias, ab + (size_t)b * ab_stride, q_scale,
                      (float*)tab[2 * b + 1], row + z_off, nw, eps, out + (size_t)b * out_stride);
}

// The step's causal conv (state [C][K-1], same arithmetic as `conv_silu` at
// T = 1) + SiLU on every channel, in place on the projection row, where the
// in projection cannot take it (dec_gemv_bulk_conv). One channel per thread.
#define CONV_THREADS 128
__device__ __forceinline__ void gdn_conv_channel(float* __restrict__ proj, float* __restrict__ state,
                                                 const float* __restrict__ conv_w, int K, int ch) {
    const int H = K - 1;
    const float* wk = conv_w + (size_t)ch * K;
    float* hist = state + (size_t)ch * H;
    float cur = proj[ch];
    float acc = wk[H] * cur;
    for (int q = 0; q < H; q++) acc += wk[q] * hist[q];
    for (int q = 0; q + 1 < H; q++) hist[q] = hist[q + 1];
    if (H > 0) hist[H - 1] = cur;
    proj[ch] = silu_f(acc);
}
QW_KERNEL void QW_BOUNDS(CONV_THREADS) dec_gdn_conv(float* __restrict__ proj, float* __restrict__ state,
                                                   const float* __restrict__ conv_w, int K, int C) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    const int ch = blockIdx.x * CONV_THREADS + threadIdx.x;
    if (ch < C) gdn_conv_channel(proj, state, conv_w, K, ch);
}
// Batched decode: row b = blockIdx.y of [B, stride] projections, its conv
// window at tab[2 b].
QW_KERNEL void QW_BOUNDS(CONV_THREADS) bat_gdn_conv(float* __restrict__ proj, int stride,
                                                   const unsigned long long* __restrict__ tab,
                                                   const float* __restrict__ conv_w, int K, int C) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    const int ch = blockIdx.x * CONV_THREADS + threadIdx.x, b = blockIdx.y;
    if (ch < C) gdn_conv_channel(proj + (size_t)b * stride, (float*)tab[2 * b], conv_w, K, ch);
}
