// The decode step's Gated DeltaNet (batch 1 and batched, issue 23): the
// causal conv + SiLU of the projection row and the delta-rule step with the
// head's gated RMSNorm (kernels/decode.cu describes the fused decode step).
#include "bulk_copy.h"

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
    float p = 0.f;
#pragma unroll
    for (int j = 0; j < GS_ROWS; j++) {
        int i = ty + GS_RG * j;
        if (i < dk) p += ks[i] * sr[j];
    }
    red[ty][c] = p;
    __syncthreads();
    float kv = 0.f;
    for (int r = 0; r < GS_RG; r++) kv += red[r][c];
    kv *= kinv * decay;
    const float kd = b * (v - kv) * kinv;  // the update along the normalised k
    __syncthreads();
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
    red[ty][c] = o;
#pragma unroll
    for (int j = 0; j < GS_ROWS; j++) {
        int i = ty + GS_RG * j;
        if (valid && i < dk) Sh[(size_t)i * dv + c] = sr[j];
    }
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

// Value head hv's step once its state rows are in sr and the grid
// dependency wait has passed: q and k of its key head from the projection
// row after the conv (q, k, v after conv and SiLU: dec_gdn_conv, or
// dec_gemv_bulk_conv's epilogue) into the shared qs and ks, the head's q/k
// L2 norms (each warp sums the squares itself, so no block barrier is
// added) and gates (beta = sigmoid(b), g = -exp(al) softplus(a + db); a at
// proj[a_off + hv], b at proj[a_off + nv + hv]), then gdn_head_step. Its
// first block barrier is after every thread's last read of sr's source.
__device__ __forceinline__ void gdn_step_head(float (&sr)[GS_ROWS], float* qs, float* ks,
                                              const float* __restrict__ proj, int nk, int nv, int dk, int dv,
                                              float al, float db, int a_off, float q_scale, int hv,
                                              float* __restrict__ S, const float* __restrict__ z,
                                              const float* __restrict__ nw, float eps, float* __restrict__ out) {
    int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
    int hk = hv / (nv / nk), key_dim = nk * dk;
    for (int i = tid; i < dk; i += nt) {
        qs[i] = proj[hk * dk + i];
        ks[i] = proj[key_dim + hk * dk + i];
    }
    float v = threadIdx.x < dv ? proj[2 * key_dim + hv * dv + threadIdx.x] : 0.f;
    const float b = sigmoid_f(proj[a_off + nv + hv]);
    const float decay = expf(-expf(al) * softplus_f(proj[a_off + hv] + db));
    __syncthreads();
    const int lane = tid % WARP;
    float sq = 0.f, sk = 0.f;
    for (int i = lane; i < dk; i += WARP) {
        sq += qs[i] * qs[i];
        sk += ks[i] * ks[i];
    }
    const float qinv = rsqrtf(warp_sum(sq) + 1e-6f) * q_scale, kinv = rsqrtf(warp_sum(sk) + 1e-6f);
    gdn_head_step(sr, qs, ks, qinv, kinv, v, decay, b, hv, dk, dv, S, z, nw, eps, out);
}

// One value head per block: gdn_step_head with the state read before the
// grid dependency wait.
__device__ __forceinline__ void dec_gdn_step_impl(const float* __restrict__ proj, int nk, int nv, int dk, int dv,
                                                  const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                                  int a_off, float q_scale, float* __restrict__ S,
                                                  const float* __restrict__ z, const float* __restrict__ nw, float eps,
                                                  float* __restrict__ out) {
    __shared__ float qs[GS_RG * GS_ROWS], ks[GS_RG * GS_ROWS];
    int hv = blockIdx.x;
    float sr[GS_ROWS];
    gdn_load_state(S, hv, dk, dv, sr);
    const float al = a_log[hv], db = dt_bias[hv];
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    gdn_step_head(sr, qs, ks, proj, nk, nv, dk, dv, al, db, a_off, q_scale, hv, S, z, nw, eps, out);
}
QW_KERNEL void QW_BOUNDS(512) dec_gdn_step(const float* __restrict__ proj, int nk, int nv, int dk, int dv,
                                          const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                          int a_off, float q_scale, float* __restrict__ S,
                                          const float* __restrict__ z, const float* __restrict__ nw, float eps,
                                          float* __restrict__ out) {
    dec_gdn_step_impl(proj, nk, nv, dk, dv, a_log, dt_bias, a_off, q_scale, S, z, nw, eps, out);
}

// Batched decode (issue 23): one launch steps B sequences, row b of the
// step's [B, stride] projections = blockIdx.y, its recurrent state at
// tab[2 b + 1] (the layer's per-row table: conv window, state), z at
// z_off in the row; out rows [B, out_stride]. The same arithmetic per row as
// dec_gdn_step, and as there the state (and the table, the host's upload)
// is read before the grid dependency wait. Two blocks per multiprocessor
// (64 registers, a few spilled): with one (108 registers) the states of B =
// 64 rows streamed at 2.0 TB/s in and out on the H200 (ncu), each block's
// loads, arithmetic and stores one after the other.
QW_KERNEL void QW_BOUNDS_MIN(512, 2) bat_gdn_step(const float* __restrict__ proj, int stride, int nk, int nv, int dk,
                                          int dv, const float* __restrict__ a_log,
                                          const float* __restrict__ dt_bias, int a_off, float q_scale,
                                          const unsigned long long* __restrict__ tab, int z_off,
                                          const float* __restrict__ nw, float eps, float* __restrict__ out,
                                          int out_stride) {
    const int b = blockIdx.y;
    const float* row = proj + (size_t)b * stride;
    dec_gdn_step_impl(row, nk, nv, dk, dv, a_log, dt_bias, a_off, q_scale, (float*)tab[2 * b + 1], row + z_off,
                      nw, eps, out + (size_t)b * out_stride);
}

// bat_gdn_step with the states streamed through a shared-memory ring (sm_90
// bulk copies; issue 23): a persistent block per multiprocessor steps the
// items (row b, value head hv) = blockIdx.x + j gridDim.x, j = 0, 1, ...
// (item = b nv + hv, B rows), one thread keeping `stages` heads' states
// (dk dv f32 each, contiguous) in flight, the first ones requested before
// the grid dependency wait, while the block runs the step of the head
// before: the same arithmetic per head as dec_gdn_step, the new state
// written back to global memory from registers. Where bulk copies do not
// exist (the CPU harness, sm_80) the state is read straight from global
// memory. Block (32 ceil(dv / 32), GS_RG); dynamic shared memory stages dk
// dv floats (16-byte aligned states, dk dv a multiple of 4).
QW_KERNEL void QW_BOUNDS(512) bat_gdn_step_ring(const float* __restrict__ proj, int stride, int nk, int nv, int dk,
                                               int dv, const float* __restrict__ a_log,
                                               const float* __restrict__ dt_bias, int a_off, float q_scale,
                                               const unsigned long long* __restrict__ tab, int z_off,
                                               const float* __restrict__ nw, float eps, float* __restrict__ out,
                                               int out_stride, int B, int stages) {
    QW_DYN_SMEM(float, ring);
    __shared__ float qs[GS_RG * GS_ROWS], ks[GS_RG * GS_ROWS];
    const int items = B * nv, slot = dk * dv, first = blockIdx.x;
    const int n = items > first ? (items - first + (int)gridDim.x - 1) / (int)gridDim.x : 0;
    auto state = [&](int j) {
        const int item = first + j * (int)gridDim.x;
        return (float*)tab[2 * (item / nv) + 1];
    };
#if defined(QW_BULK)
    __shared__ unsigned long long full[BULK_MAX_STAGES];
    const bool producer = threadIdx.x == 0 && threadIdx.y == 0;
    auto fill = [&](int j) {
        const int s = j % stages, hv = (first + j * (int)gridDim.x) % nv;
        mbar_expect(&full[s], 4u * (unsigned)slot);
        bulk_copy(ring + (size_t)s * slot, state(j) + (size_t)hv * slot, 4u * (unsigned)slot, &full[s]);
    };
    if (producer) {
        for (int s = 0; s < stages; s++) mbar_init(&full[s], 1);
        mbar_fence_init();
        for (int j = 0; j < min(stages, n); j++) fill(j);
    }
    __syncthreads();
#else
    (void)ring;
#endif
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    for (int j = 0; j < n; j++) {
        const int item = first + j * (int)gridDim.x, b = item / nv, hv = item % nv;
        float* S = state(j);
        float sr[GS_ROWS];
#if defined(QW_BULK)
        mbar_wait(&full[j % stages], (unsigned)(j / stages) & 1u);
        gdn_load_state(ring + (size_t)(j % stages) * slot, 0, dk, dv, sr);
#else
        gdn_load_state(S, hv, dk, dv, sr);
#endif
        const float* row = proj + (size_t)b * stride;
        gdn_step_head(sr, qs, ks, row, nk, nv, dk, dv, a_log[hv], dt_bias[hv], a_off, q_scale, hv, S, row + z_off,
                      nw, eps, out + (size_t)b * out_stride);
#if defined(QW_BULK)
        // Every thread has read the slot (gdn_step_head's barriers since).
        if (producer && j + stages < n) fill(j + stages);
#endif
    }
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
