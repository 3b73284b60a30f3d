// Fused batch-1 decode kernels. One decode step reads ~6 GB of weights for a
// few microseconds of arithmetic, so these kernels are about streaming weights
// at full bandwidth and about launching few kernels: norms run as GEMV
// prologues, the MoE router is recomputed inside the expert kernel, the
// residual add is every output GEMV's epilogue, and the position comes from
// device memory so a whole step can be replayed as one CUDA graph.
#include "mma.h"
#include "norm_partials.h"
#include "token_mask.h"
#include "fp8.h"

// 16-byte weight load that bypasses L1 (weights are read once per token).
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
#if defined(QW_CUDA)
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
#else
    return *p;
#endif
}

// 8 bf16 weights . 8 f32 activations (xs 16-byte aligned).
__device__ __forceinline__ float dot8(uint4 w, const float* xs) {
    float4 a = *(const float4*)xs, b = *(const float4*)(xs + 4);
    return bf_lo(w.x) * a.x + bf_hi(w.x) * a.y + bf_lo(w.y) * a.z + bf_hi(w.y) * a.w +
           bf_lo(w.z) * b.x + bf_hi(w.z) * b.y + bf_lo(w.w) * b.z + bf_hi(w.w) * b.w;
}

// One warp: W row (bf16, `cols` long) . xs (f32, shared memory); used where
// rows are short and few (the shared expert's tail of a scalar path).
__device__ __forceinline__ float row_dot(const bf16_t* __restrict__ w, const float* xs, int cols, int lane) {
    float acc = 0.f;
    if ((cols & 7) == 0) {
        const uint4* w4 = (const uint4*)w;
        int n8 = cols >> 3;
        for (int base = lane; base < n8; base += 4 * WARP) {
            uint4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int c = base + u * WARP;
                v[u] = c < n8 ? ld_stream(w4 + c) : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                int c = base + u * WARP;
                if (c < n8) acc += dot8(v[u], xs + 8 * c);
            }
        }
    } else {
        for (int c = lane; c < cols; c += WARP) acc += bf2f(w[c]) * xs[c];
    }
    return warp_sum(acc);
}

#define DEC_WARPS 8  // warps per block; each warp owns whole rows
#define CH 8         // 16-byte loads per lane per chunk (a chunk = 2048 columns)

// Chunk `base` (in 16-byte units, lane offset added here) of row r, or zeros
// past the matrix.
__device__ __forceinline__ void load_chunk(const bf16_t* __restrict__ W, int r, int rows, int cols, int base,
                                           int lane, uint4 (&v)[CH]) {
    const uint4* w4 = (const uint4*)(W + (size_t)r * cols);
    int n8 = cols >> 3;
#pragma unroll
    for (int u = 0; u < CH; u++) {
        int c = base + lane + u * WARP;
        v[u] = (r < rows && c < n8) ? ld_stream(w4 + c) : make_uint4(0u, 0u, 0u, 0u);
    }
}

// 8 bf16 weights . 8 activations read through L1 (x, and nw when set: x * nw).
__device__ __forceinline__ float dot8g(uint4 w, const float* __restrict__ x, const float* __restrict__ nw) {
    float4 a = __ldg((const float4*)x), b = __ldg((const float4*)(x + 4));
    if (nw) {
        float4 p = __ldg((const float4*)nw), q = __ldg((const float4*)(nw + 4));
        a.x *= p.x; a.y *= p.y; a.z *= p.z; a.w *= p.w;
        b.x *= q.x; b.y *= q.y; b.z *= q.z; b.w *= q.w;
    }
    return bf_lo(w.x) * a.x + bf_hi(w.x) * a.y + bf_lo(w.y) * a.z + bf_hi(w.y) * a.w +
           bf_lo(w.z) * b.x + bf_hi(w.z) * b.y + bf_lo(w.w) * b.z + bf_hi(w.w) * b.w;
}

// A warp streams rows first, first + stride, ... (cols % 8 == 0) of W . (x * nw):
// while one chunk is multiplied the next one (same row or the next row's
// first) is already in flight. `v` holds the first chunk, loaded by the caller
// before QW_GRID_WAIT(). The activations come straight from global memory
// (L1-resident after the first warp): no shared-memory prologue, no block
// barrier before the weights stream. `emit(r, dot)` runs on lane 0.
template <typename Emit>
__device__ __forceinline__ void stream_rows(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                            const float* __restrict__ nw, int rows, int cols, int first,
                                            int stride, int lane, uint4 (&v)[CH], Emit emit) {
    int n8 = cols >> 3;
    for (int r = first; r < rows; r += stride) {
        float acc = 0.f;
        for (int base = 0; base < n8; base += CH * WARP) {
            uint4 nv[CH];
            int nb = base + CH * WARP, nr = r;
            if (nb >= n8) {
                nb = 0;
                nr = r + stride;
            }
            load_chunk(W, nr, rows, cols, nb, lane, nv);
#pragma unroll
            for (int u = 0; u < CH; u++) {
                int c = base + lane + u * WARP;
                if (c < n8) acc += dot8g(v[u], x + 8 * c, nw ? nw + 8 * c : nullptr);
            }
#pragma unroll
            for (int u = 0; u < CH; u++) v[u] = nv[u];
        }
        acc = warp_sum(acc);
        if (lane == 0) emit(r, acc);
    }
}

// The same for rows that are not 16-byte aligned (cols % 8 != 0; small models).
template <typename Emit>
__device__ __forceinline__ void scalar_rows(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                            const float* __restrict__ nw, int rows, int cols, int first,
                                            int stride, int lane, Emit emit) {
    for (int r = first; r < rows; r += stride) {
        float acc = 0.f;
        for (int c = lane; c < cols; c += WARP) acc += bf2f(W[(size_t)r * cols + c]) * (nw ? x[c] * nw[c] : x[c]);
        acc = warp_sum(acc);
        if (lane == 0) emit(r, acc);
    }
}

template <typename Emit>
__device__ __forceinline__ void gemv_rows(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                          const float* __restrict__ nw, int rows, int cols, uint4 (&v)[CH],
                                          Emit emit) {
    int lane = threadIdx.x % WARP;
    int first = blockIdx.x * DEC_WARPS + threadIdx.x / WARP, stride = gridDim.x * DEC_WARPS;
    if ((cols & 7) == 0) stream_rows(W, x, nw, rows, cols, first, stride, lane, v, emit);
    else scalar_rows(W, x, nw, rows, cols, first, stride, lane, emit);
}

// Before QW_GRID_WAIT(): the warp's first chunk of weights (independent of
// the previous kernel).
__device__ __forceinline__ void prefetch_first(const bf16_t* __restrict__ W, int rows, int cols, uint4 (&v)[CH]) {
    if ((cols & 7) == 0)
        load_chunk(W, blockIdx.x * DEC_WARPS + threadIdx.x / WARP, rows, cols, 0, threadIdx.x % WARP, v);
}

// y[r] (+)= W[r, :] . x. With ssq_out (the residual add into the hidden
// state), block b also writes the sum of squares of its new rows to
// ssq_out[b] for the next norm (grid = ceil(rows / 8): one row per warp).
QW_KERNEL void QW_BOUNDS(256) dec_gemv(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                      float* __restrict__ y, int rows, int cols, int accumulate,
                                      float* __restrict__ ssq_out) {
    uint4 v[CH];
    prefetch_first(W, rows, cols, v);
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    float mine = 0.f;
    gemv_rows(W, x, nullptr, rows, cols, v, [&](int r, float d) {
        float o = accumulate ? y[r] + d : d;
        y[r] = o;
        mine += o * o;
    });
    if (ssq_out) write_ssq(mine, ssq_out);
}

// Epilogue of the split-row kernels: each warp's lane-partial dot of its
// slice (slice w % P of row r) is reduced, the row's P slices meet in shared
// memory, and the row's first warp adds the total into y[r] (or stores it).
// Returns y[r]^2 on that lane, 0 elsewhere (for write_ssq). Whole block.
__device__ __forceinline__ float rows_epilogue(float acc, int r, int rows, int P, bool accumulate,
                                               float* __restrict__ y) {
    __shared__ float dots[32];
    const int w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    acc = warp_sum(acc);
    if (lane == 0) dots[w] = acc;
    __syncthreads();
    if (w % P != 0 || lane != 0 || r >= rows) return 0.f;
    float d = 0.f;
    for (int q = 0; q < P; q++) d += dots[w + q];
    const float o = accumulate ? y[r] + d : d;
    y[r] = o;
    return o * o;
}

// The same for rows of at most 4 chunks (cols % 8 == 0, cols <= 4 * 2048):
// P = blockDim.x / 256 warps share each row, one chunk each, all loaded
// before QW_GRID_WAIT(): the whole matrix is requested while the predecessor
// finishes (a 16.8 MB out projection is in flight at once), and after the
// wait only the dots remain. Block = 8 rows, as dec_gemv (same ssq_out
// partials); the P partial dots of a row meet in shared memory.
QW_KERNEL void QW_BOUNDS(1024) dec_gemv_rows(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                            float* __restrict__ y, int rows, int cols, int accumulate,
                                            float* __restrict__ ssq_out) {
    const int P = blockDim.x / (DEC_WARPS * WARP);
    const int w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int r = blockIdx.x * DEC_WARPS + w / P, p = w % P;
    uint4 v[CH];
    load_chunk(W, r, rows, cols, p * CH * WARP, lane, v);
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    const int n8 = cols >> 3;
    float acc = 0.f;
#pragma unroll
    for (int u = 0; u < CH; u++) {
        int c = p * CH * WARP + lane + u * WARP;
        if (c < n8) acc += dot8g(v[u], x + 8 * c, nullptr);
    }
    float mine = rows_epilogue(acc, r, rows, P, accumulate, y);
    if (ssq_out) write_ssq(mine, ssq_out);
}

// y[r] = W[r, :] . rmsnorm(x): the (1+w) weight nw multiplies x on the fly and
// 1/rms (from the residual kernels' partial sums of squares) scales the dot.
QW_KERNEL void QW_BOUNDS(256) dec_norm_gemv(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                           const float* __restrict__ ssq, int nssq, const float* __restrict__ nw,
                                           float eps, float* __restrict__ y, int rows, int cols) {
    uint4 v[CH];
    prefetch_first(W, rows, cols, v);
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    float inv = inv_rms(ssq, nssq, cols, eps);
    gemv_rows(W, x, nw, rows, cols, v, [&](int r, float d) { y[r] = d * inv; });
}

// x = embedding row of the step's token (f32), and its sum of squares as the
// first of nssq partials (the rest zero). One block.
QW_KERNEL void QW_BOUNDS(256) dec_embed(const bf16_t* __restrict__ emb, const unsigned int* __restrict__ tok,
                                       float* __restrict__ x, int H, float* __restrict__ ssq_out, int nssq) {
    __shared__ float scratch[32];
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    const bf16_t* row = emb + (size_t)tok[0] * H;
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float v = bf2f(row[i]);
        x[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    for (int i = threadIdx.x; i < nssq; i += blockDim.x) ssq_out[i] = i == 0 ? ss : 0.f;
}

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

// One value head per block: gdn_head_step on the projection row after the
// conv (q, k, v after conv and SiLU: dec_gdn_conv, or dec_gemv_bulk_conv's
// epilogue), with the head's q/k L2 norms (each warp sums the squares
// itself, so no block barrier is added) and gates (beta = sigmoid(b),
// g = -exp(A_log) softplus(a + dt_bias); a at proj[a_off + hv], b at
// proj[a_off + nv + hv]) taken here.
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
// dec_gdn_step.
QW_KERNEL void QW_BOUNDS(512) bat_gdn_step(const float* __restrict__ proj, int stride, int nk, int nv, int dk,
                                          int dv, const float* __restrict__ a_log,
                                          const float* __restrict__ dt_bias, int a_off, float q_scale,
                                          const unsigned long long* __restrict__ tab, int z_off,
                                          const float* __restrict__ nw, float eps, float* __restrict__ out,
                                          int out_stride) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    const int b = blockIdx.y;
    const float* row = proj + (size_t)b * stride;
    dec_gdn_step_impl(row, nk, nv, dk, dv, a_log, dt_bias, a_off, q_scale, (float*)tab[2 * b + 1], row + z_off,
                      nw, eps, out + (size_t)b * out_stride);
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


// Warp-wide max (MAX) or min of an unsigned: one redux.sync on sm_80 and
// later, shuffles elsewhere.
template <bool MAX>
__device__ __forceinline__ unsigned warp_reduce_u32(unsigned v) {
#if defined(QW_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return MAX ? __reduce_max_sync(0xffffffffu, v) : __reduce_min_sync(0xffffffffu, v);
#else
    for (int m = WARP / 2; m > 0; m >>= 1) {
        const unsigned o = SHFL_XOR(v, m);
        v = MAX ? max(v, o) : min(v, o);
    }
    return v;
#endif
}

// A router logit as a key that orders like the float: 0 for what is never
// chosen (NaN, -inf), and -0 as +0 (the floats compare equal).
__device__ __forceinline__ unsigned route_key(float v) {
    if (!(v > -INFINITY)) return 0u;
    const unsigned b = __float_as_uint(v == 0.f ? 0.f : v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float route_logit(unsigned key) {
    return __uint_as_float((key & 0x80000000u) ? (key ^ 0x80000000u) : ~key);
}

// The chosen logits sw[0, k) (largest first) become their renormalised
// softmax weights, by lane 0 once the warp has written them.
__device__ __forceinline__ void route_weights(float* sw, int k) {
    QW_SYNCWARP();
    if (threadIdx.x % WARP == 0) {
        float top = sw[0], total = 0.f;
        for (int j = 0; j < k; j++) {
            sw[j] = expf(sw[j] - top);
            total += sw[j];
        }
        for (int j = 0; j < k; j++) sw[j] /= total;
    }
}

// Top-k of the router logits (ties to the lower index) and the renormalised
// softmax weights over the chosen experts (p_e / sum of the chosen p), by one
// warp, into shared memory. Recomputed by every block of both expert kernels
// instead of a separate launch. Lane l holds experts [l P, l P + P) (P = E /
// 32 rounded up) as keys in shared memory and its best one in registers; a
// round takes the warp's largest key (the lowest lane holding it: the lowest
// expert among equal logits) and only the lane it came from rescans its P
// keys. Two warp reductions a round (redux.sync on CUDA) instead of a
// 32-logit scan and five dependent shuffle exchanges (1.1% faster decode at
// 512 and 8K on the H200, benchmarks/history/experiment-h200-router-redux-206148e.json).
// The logits are read
// through L2 only (the down kernel reads them before its grid dependency
// wait; L2 is coherent, an SM's L1 may hold the last layer's).
__device__ void router_topk_warp(const float* __restrict__ logits, int E, int k, int* sidx, float* sw) {
    __shared__ unsigned keys[MOE_MAXE];
    const int lane = threadIdx.x % WARP, P = (E + WARP - 1) / WARP, e0 = lane * P;
    unsigned best = 0u;
    int be = 0;
    for (int m = 0; m < P; m++) {
        const int e = e0 + m;
        const unsigned key = e < E ? route_key(QW_LDCG(logits + e)) : 0u;
        keys[e] = key;  // only this lane reads it back
        if (key > best) {
            best = key;
            be = e;
        }
    }
    for (int j = 0; j < k; j++) {
        const unsigned top = warp_reduce_u32<true>(best);
        const unsigned from = warp_reduce_u32<false>(best == top ? (unsigned)lane : (unsigned)WARP);
        if (lane == (int)from) {
            // Nothing selectable (every remaining logit NaN or -inf: a broken
            // hidden state): expert 0 with weight 0, or NaN when all are, so
            // the expert kernels never index past the experts.
            sidx[j] = top ? be : 0;
            sw[j] = top ? route_logit(top) : -INFINITY;
            if (top) {
                keys[be] = 0u;
                best = 0u;
                for (int m = 0; m < P; m++) {
                    const unsigned key = keys[e0 + m];
                    if (key > best) {
                        best = key;
                        be = e0 + m;
                    }
                }
            }
        }
    }
    route_weights(sw, k);
}

// Routed experts, gate/up half: act[j, i] = silu(Wg[e_j][i] . n) * (Wu[e_j][i] . n),
// n = rmsnorm(x) * nw computed in the prologue from the partial sums of squares,
// for the k chosen experts e_j. grid (ceil(I / (DEC_WARPS * pairs)), k): warp
// w of block b owns columns i = (b * DEC_WARPS + w) * pairs + p, p < pairs, of
// expert slot j = blockIdx.y (gate row i and up row I + i in flight together,
// one pair after another), so that with pairs = 2 the 35B model's 256 blocks
// are resident at once (two blocks per SM at this kernel's registers) instead
// of running in two waves, each repeating the routing and the norm. Router
// logits are the first E entries of `inp`.
QW_KERNEL void QW_BOUNDS(256) dec_moe_gate_up(const bf16_t* __restrict__ Wgu, const float* __restrict__ x,
                                             const float* __restrict__ ssq, int nssq, const float* __restrict__ nw,
                                             float eps, const float* __restrict__ inp, int E, int k,
                                             float* __restrict__ act, int I, int H, int pairs) {
    QW_DYN_SMEM(float, xs);  // [H]
    __shared__ int sidx[MOE_MAXK];
    __shared__ float sw[MOE_MAXK];
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    if (w == 0) {
        router_topk_warp(inp, E, k, sidx, sw);
    } else {
        // The post-attention norm of the hidden state, into shared memory.
        float inv = inv_rms(ssq, nssq, H, eps);
        for (int i = threadIdx.x - WARP; i < H; i += blockDim.x - WARP) xs[i] = x[i] * inv * nw[i];
    }
    __syncthreads();
    int j = blockIdx.y;
    for (int p = 0; p < pairs; p++) {
        const int i = (blockIdx.x * DEC_WARPS + w) * pairs + p;
        if (i >= I) return;
        const bf16_t* gr = Wgu + ((size_t)sidx[j] * 2 * I + i) * H;
        const bf16_t* ur = gr + (size_t)I * H;
        float gv = 0.f, uv = 0.f;
        if ((H & 7) == 0) {
            int n8 = H >> 3;
            for (int base = 0; base < n8; base += CH * WARP) {
                uint4 a[CH], b[CH];
                load_chunk(gr, 0, 1, H, base, lane, a);
                load_chunk(ur, 0, 1, H, base, lane, b);
#pragma unroll
                for (int u = 0; u < CH; u++) {
                    int c = base + lane + u * WARP;
                    if (c < n8) {
                        gv += dot8(a[u], xs + 8 * c);
                        uv += dot8(b[u], xs + 8 * c);
                    }
                }
            }
            gv = warp_sum(gv);
            uv = warp_sum(uv);
        } else {
            gv = row_dot(gr, xs, H, lane);
            uv = row_dot(ur, xs, H, lane);
        }
        if (lane == 0) act[(size_t)j * I + i] = silu_f(gv) * uv;
    }
}

// Chunk `base` (16-byte units) of down row r's virtual row: the k routed
// experts' rows (I columns each) then the shared expert's (S), zeros past it.
__device__ __forceinline__ void down_chunk(const bf16_t* __restrict__ Wd, const bf16_t* __restrict__ Wsd,
                                           const int* sidx, int k, int I, int S, int H, int r, int base, int lane,
                                           uint4 (&v)[CH]) {
    int n8I = I >> 3, nR = k * n8I, nv = nR + (S >> 3);
#pragma unroll
    for (int u = 0; u < CH; u++) {
        int c = base + lane + u * WARP;
        if (r < H && c < nv) {
            const uint4* p;
            if (c < nR) {
                int j = c / n8I;
                p = (const uint4*)(Wd + ((size_t)sidx[j] * H + r) * I) + (c - j * n8I);
            } else {
                p = (const uint4*)(Wsd + (size_t)r * S) + (c - nR);
            }
            v[u] = ld_stream(p);
        } else {
            v[u] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

// Routed experts, down half, plus the gated shared expert and the residual:
// y[r] += sum_j w_j Wd[e_j][r, :] . act[j, :]
//       + sigmoid(inp[E]) * Wsd[r, :] . (silu(inp[E+1 : E+1+S]) * inp[E+1+S : E+1+2S]).
// grid ceil(H / DEC_WARPS); shared memory: act (k * I) then the shared act (S).
// Each warp streams its row's k + 1 segments as one virtual row of
// k * I + S columns (next chunk in flight while the current one is used).
// The router logits come from the kernel before the gate/up kernel, complete
// once this kernel may start (PDL): the routing and the first chunk of
// weights are fetched before the wait for `act`.
QW_KERNEL void QW_BOUNDS(256) dec_moe_down(const bf16_t* __restrict__ Wd, const bf16_t* __restrict__ Wsd,
                                          const float* __restrict__ act, const float* __restrict__ inp,
                                          int E, int k, int I, int S, float* __restrict__ y, int H,
                                          float* __restrict__ ssq_out) {
    QW_DYN_SMEM(float, xs);
    __shared__ int sidx[MOE_MAXK];
    __shared__ float sw[MOE_MAXK];
    float* as = xs + (size_t)k * I;
    if (threadIdx.x < WARP) router_topk_warp(inp, E, k, sidx, sw);
    __syncthreads();
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    int first = blockIdx.x * DEC_WARPS + w, stride = gridDim.x * DEC_WARPS;
    int n8I = I >> 3, nR = k * n8I, nv = nR + (S >> 3);
    bool vec = !((I & 7) || (S & 7));
    auto load = [&](int r, int base, uint4 (&v)[CH]) { down_chunk(Wd, Wsd, sidx, k, I, S, H, r, base, lane, v); };
    uint4 v[CH];
    if (vec) load(first, 0, v);
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
#pragma unroll 8
    for (int i = threadIdx.x; i < k * I; i += blockDim.x) xs[i] = act[i];
#pragma unroll 2
    for (int i = threadIdx.x; i < S; i += blockDim.x) as[i] = silu_f(inp[E + 1 + i]) * inp[E + 1 + S + i];
    __syncthreads();
    float sg = sigmoid_f(inp[E]);
    float mine = 0.f;
    if (!vec) {
        for (int r = first; r < H; r += stride) {
            float total = 0.f;
            for (int j = 0; j < k; j++)
                total += sw[j] * row_dot(Wd + ((size_t)sidx[j] * H + r) * I, xs + (size_t)j * I, I, lane);
            if (S > 0) total += sg * row_dot(Wsd + (size_t)r * S, as, S, lane);
            if (lane == 0) {
                float o = y[r] + total;
                y[r] = o;
                mine += o * o;
            }
        }
        write_ssq(mine, ssq_out);
        return;
    }
    for (int r = first; r < H; r += stride) {
        float acc = 0.f;
        for (int base = 0; base < nv; base += CH * WARP) {
            uint4 nx[CH];
            int nb = base + CH * WARP, nr = r;
            if (nb >= nv) {
                nb = 0;
                nr = r + stride;
            }
            load(nr, nb, nx);
#pragma unroll
            for (int u = 0; u < CH; u++) {
                int c = base + lane + u * WARP;
                if (c < nR) {
                    int j = c / n8I;
                    acc += sw[j] * dot8(v[u], xs + (size_t)j * I + 8 * (c - j * n8I));
                } else if (c < nv) {
                    acc += sg * dot8(v[u], as + 8 * (c - nR));
                }
            }
#pragma unroll
            for (int u = 0; u < CH; u++) v[u] = nx[u];
        }
        acc = warp_sum(acc);
        if (lane == 0) {
            float o = y[r] + acc;
            y[r] = o;
            mine += o * o;
        }
    }
    write_ssq(mine, ssq_out);
}

// dec_moe_down with the virtual row (I, S multiples of 8) split between
// P = blockDim.x / 256 warps, `span` 16-byte columns each (a multiple of 32,
// at most DOWN_SPAN), all loaded before the grid wait (the routing too, as
// above), so after the wait only `act` and the dots remain. Block = 8 rows
// (same ssq_out partials); a row's P partial dots meet in shared memory.
#define DOWN_SPAN 9  // 16-byte loads per lane (the 35B model: 2 x 9 x 32 = its 576)
QW_KERNEL void QW_BOUNDS_MIN(512, 2) dec_moe_down_rows(const bf16_t* __restrict__ Wd, const bf16_t* __restrict__ Wsd,
                                               const float* __restrict__ act, const float* __restrict__ inp,
                                               int E, int k, int I, int S, float* __restrict__ y, int H,
                                               float* __restrict__ ssq_out, int span) {
    QW_DYN_SMEM(float, xs);
    __shared__ int sidx[MOE_MAXK];
    __shared__ float sw[MOE_MAXK];
    float* as = xs + (size_t)k * I;
    if (threadIdx.x < WARP) router_topk_warp(inp, E, k, sidx, sw);
    __syncthreads();
    const int P = blockDim.x / (DEC_WARPS * WARP);
    const int w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const int r = blockIdx.x * DEC_WARPS + w / P, p = w % P;
    const int n8I = I >> 3, nR = k * n8I, nv = nR + (S >> 3);
    const int c0 = p * span, c1 = min(nv, c0 + span);
    uint4 v[DOWN_SPAN];
#pragma unroll
    for (int u = 0; u < DOWN_SPAN; u++) {
        int c = c0 + lane + u * WARP;
        v[u] = make_uint4(0u, 0u, 0u, 0u);
        if (r < H && c < c1) {
            int j = c / n8I;
            v[u] = ld_stream(c < nR ? (const uint4*)(Wd + ((size_t)sidx[j] * H + r) * I) + (c - j * n8I)
                                    : (const uint4*)(Wsd + (size_t)r * S) + (c - nR));
        }
    }
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    for (int i = threadIdx.x; i < k * I; i += blockDim.x) xs[i] = act[i];
    for (int i = threadIdx.x; i < S; i += blockDim.x) as[i] = silu_f(inp[E + 1 + i]) * inp[E + 1 + S + i];
    __syncthreads();
    const float sg = sigmoid_f(inp[E]);
    float acc = 0.f;
#pragma unroll
    for (int u = 0; u < DOWN_SPAN; u++) {
        int c = c0 + lane + u * WARP;
        if (c < min(nR, c1)) {
            int j = c / n8I;
            acc += sw[j] * dot8(v[u], xs + (size_t)j * I + 8 * (c - j * n8I));
        } else if (c < c1) {
            acc += sg * dot8(v[u], as + 8 * (c - nR));
        }
    }
    write_ssq(rows_epilogue(acc, r, H, P, true, y), ssq_out);
}

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

// Greedy pick over many blocks: each block reduces its slice of the logits to
// (max, argmax, sum exp(x - max)); `argmax_final` merges the partials into
// out[0] = token (int bits), out[1] = max, out[2] = log sum exp(x - max), the
// same layout as `logits_stats`. Rows of a batch: row blockIdx.y of x ([rows][n])
// into its gridDim.x partials; argmax_final's block b merges row b's into
// out[4 b ..] (and next_tok[b]). `masks` (token_mask.h; null in the decode
// graphs): constrained rows count only their allowed tokens.
QW_KERNEL void QW_BOUNDS(256) argmax_partial(const float* __restrict__ x, int n,
                                            const unsigned long long* __restrict__ masks, float* __restrict__ part) {
    __shared__ float sv[32], ss[32];
    __shared__ int si[32];
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    const unsigned* mask = row_mask(masks, blockIdx.y);
    x += (size_t)blockIdx.y * n;
    part += (size_t)blockIdx.y * gridDim.x * 3;
    float best = -INFINITY;
    int bi = 0x7fffffff;
    int per = (n + gridDim.x - 1) / gridDim.x;
    int lo = blockIdx.x * per, hi = min(n, lo + per);
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float v = mask_logit(mask, i, x[i]);
        if (v > best) { best = v; bi = i; }
    }
    for (int m = WARP / 2; m > 0; m >>= 1) {
        float ov = SHFL_XOR(best, m);
        int oi = SHFL_XOR(bi, m);
        if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = blockDim.x / WARP;
    if (lane == 0) { sv[w] = best; si[w] = bi; }
    __syncthreads();
    best = sv[0]; bi = si[0];
    for (int i = 1; i < nw; i++)
        if (sv[i] > best || (sv[i] == best && si[i] < bi)) { best = sv[i]; bi = si[i]; }
    float s = 0.f;
    if (best != -INFINITY)
        for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) s += expf(mask_logit(mask, i, x[i]) - best);
    s = warp_sum(s);
    __syncthreads();
    if (lane == 0) ss[w] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        for (int i = 0; i < nw; i++) t += ss[i];
        part[3 * blockIdx.x] = best;
        part[3 * blockIdx.x + 1] = __int_as_float(bi);
        part[3 * blockIdx.x + 2] = t;
    }
}

// One block of 256: merges `np` partials. Also stores the token into next_tok
// (when not null) so the next step can start without the host.
QW_KERNEL void QW_BOUNDS(256) argmax_final(const float* __restrict__ part, int np, float* __restrict__ out,
                                          unsigned int* __restrict__ next_tok) {
    __shared__ float sv[32];
    __shared__ int si[32];
    __shared__ float scratch[32];
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    part += (size_t)blockIdx.x * np * 3;
    out += 4 * blockIdx.x;
    if (next_tok) next_tok += blockIdx.x;
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int p = threadIdx.x; p < np; p += blockDim.x) {
        float v = part[3 * p];
        int i = __float_as_int(part[3 * p + 1]);
        if (v > best || (v == best && i < bi)) { best = v; bi = i; }
    }
    for (int m = WARP / 2; m > 0; m >>= 1) {
        float ov = SHFL_XOR(best, m);
        int oi = SHFL_XOR(bi, m);
        if (ov > best || (ov == best && oi < bi)) { best = ov; bi = oi; }
    }
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, nw = blockDim.x / WARP;
    if (lane == 0) { sv[w] = best; si[w] = bi; }
    __syncthreads();
    best = sv[0]; bi = si[0];
    for (int i = 1; i < nw; i++)
        if (sv[i] > best || (sv[i] == best && si[i] < bi)) { best = sv[i]; bi = si[i]; }
    float s = 0.f;
    for (int p = threadIdx.x; p < np; p += blockDim.x) {
        float v = part[3 * p];
        if (v != -INFINITY) s += part[3 * p + 2] * expf(v - best);
    }
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) {
        out[0] = __int_as_float(bi);
        out[1] = best;
        out[2] = logf(s);
        if (next_tok) *next_tok = (unsigned int)bi;
    }
}

// Bandwidth probe (`qwasi bench --workload speed --probe`): the simplest
// streaming read of n16 16-byte words, grid-stride, 4 loads in flight per
// thread; one value per thread is written so the loads are not removed.
QW_KERNEL void QW_BOUNDS(256) probe_read(const uint4* __restrict__ p, long long n16, unsigned int* __restrict__ out) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    unsigned int acc = 0;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 a = ld_stream(p + i), b = ld_stream(p + i + stride), c = ld_stream(p + i + 2 * stride),
              d = ld_stream(p + i + 3 * stride);
        acc ^= a.x ^ b.y ^ c.z ^ d.w;
    }
    for (; i < n16; i += stride) acc ^= ld_stream(p + i).x;
    out[(size_t)blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

// ---- Block-FP8 weights (kernels/fp8.h): the decode GEMVs above reading E4M3
// bytes and block scales instead of bf16 (half the bytes). Each weight is
// widened to the exact bf16 value the dequantize-at-upload path would hold
// and then used in the same f32 arithmetic, in the same order, as dec_gemv,
// dec_norm_gemv, dec_moe_gate_up and dec_moe_down (vectorised path): the
// results equal those kernels' on the dequantized matrices. Columns are whole
// 128-column blocks (the host keeps only such matrices in FP8).

// 8 E4M3 weights (8 bytes) that bypass L1.
__device__ __forceinline__ uint2 ld_stream8(const uint2* p) {
#if defined(QW_CUDA)
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
#else
    return *p;
#endif
}

// A chunk of a lane's 8-weight groups: E4M3 bytes and each group's block scale.
struct Fp8Chunk {
    uint2 q[CH];
    float s[CH];
};

// Group `c` (8 columns) of row r of Q (cols columns, scales S with cb columns)
// into slot u of v, or zeros where `in` is false.
__device__ __forceinline__ void fp8_group(const unsigned char* __restrict__ Q, const float* __restrict__ S,
                                          size_t r, int cols, int cb, int c, bool in, Fp8Chunk& v, int u) {
    v.q[u] = in ? ld_stream8((const uint2*)(Q + r * cols) + c) : make_uint2(0u, 0u);
    v.s[u] = in ? S[(r >> 7) * cb + (c >> 4)] : 0.f;
}

// load_chunk for block-FP8 rows.
__device__ __forceinline__ void load_chunk_fp8(const unsigned char* __restrict__ Q, const float* __restrict__ S,
                                               int r, int rows, int cols, int base, int lane, Fp8Chunk& v) {
    const int n8 = cols >> 3, cb = (cols + 127) >> 7;
#pragma unroll
    for (int u = 0; u < CH; u++) {
        int c = base + lane + u * WARP;
        fp8_group(Q, S, (size_t)(r < rows ? r : 0), cols, cb, c, r < rows && c < n8, v, u);
    }
}

// stream_rows for block-FP8 rows (same order of operations).
template <typename Emit>
__device__ __forceinline__ void stream_rows_fp8(const unsigned char* __restrict__ Q, const float* __restrict__ S,
                                                const float* __restrict__ x, const float* __restrict__ nw, int rows,
                                                int cols, int first, int stride, int lane, Fp8Chunk& v, Emit emit) {
    int n8 = cols >> 3;
    for (int r = first; r < rows; r += stride) {
        float acc = 0.f;
        for (int base = 0; base < n8; base += CH * WARP) {
            Fp8Chunk nv;
            int nb = base + CH * WARP, nr = r;
            if (nb >= n8) {
                nb = 0;
                nr = r + stride;
            }
            load_chunk_fp8(Q, S, nr, rows, cols, nb, lane, nv);
#pragma unroll
            for (int u = 0; u < CH; u++) {
                int c = base + lane + u * WARP;
                if (c < n8) acc += dot8g(fp8x8_bf16(v.q[u], v.s[u]), x + 8 * c, nw ? nw + 8 * c : nullptr);
            }
            v = nv;
        }
        acc = warp_sum(acc);
        if (lane == 0) emit(r, acc);
    }
}

// dec_gemv on block-FP8 weights Q, S.
QW_KERNEL void QW_BOUNDS(256) dec_gemv_fp8(const unsigned char* __restrict__ Q, const float* __restrict__ S,
                                          const float* __restrict__ x, float* __restrict__ y, int rows, int cols,
                                          int accumulate, float* __restrict__ ssq_out) {
    const int lane = threadIdx.x % WARP;
    const int first = blockIdx.x * DEC_WARPS + threadIdx.x / WARP, stride = gridDim.x * DEC_WARPS;
    Fp8Chunk v;
    load_chunk_fp8(Q, S, first, rows, cols, 0, lane, v);
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    float mine = 0.f;
    stream_rows_fp8(Q, S, x, nullptr, rows, cols, first, stride, lane, v, [&](int r, float d) {
        float o = accumulate ? y[r] + d : d;
        y[r] = o;
        mine += o * o;
    });
    if (ssq_out) write_ssq(mine, ssq_out);
}

// dec_norm_gemv on block-FP8 weights Q, S.
QW_KERNEL void QW_BOUNDS(256) dec_norm_gemv_fp8(const unsigned char* __restrict__ Q, const float* __restrict__ S,
                                               const float* __restrict__ x, const float* __restrict__ ssq, int nssq,
                                               const float* __restrict__ nw, float eps, float* __restrict__ y,
                                               int rows, int cols) {
    const int lane = threadIdx.x % WARP;
    const int first = blockIdx.x * DEC_WARPS + threadIdx.x / WARP, stride = gridDim.x * DEC_WARPS;
    Fp8Chunk v;
    load_chunk_fp8(Q, S, first, rows, cols, 0, lane, v);
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    float inv = inv_rms(ssq, nssq, cols, eps);
    stream_rows_fp8(Q, S, x, nw, rows, cols, first, stride, lane, v, [&](int r, float d) { y[r] = d * inv; });
}

// dec_moe_gate_up on block-FP8 experts (Q [E * 2I, H], S [E * 2I / 128, H / 128]).
QW_KERNEL void QW_BOUNDS(256) dec_moe_gate_up_fp8(const unsigned char* __restrict__ Q, const float* __restrict__ S,
                                                 const float* __restrict__ x, const float* __restrict__ ssq,
                                                 int nssq, const float* __restrict__ nw, float eps,
                                                 const float* __restrict__ inp, int E, int k,
                                                 float* __restrict__ act, int I, int H, int pairs) {
    QW_DYN_SMEM(float, xs);  // [H]
    __shared__ int sidx[MOE_MAXK];
    __shared__ float sw[MOE_MAXK];
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    if (w == 0) {
        router_topk_warp(inp, E, k, sidx, sw);
    } else {
        float inv = inv_rms(ssq, nssq, H, eps);
        for (int i = threadIdx.x - WARP; i < H; i += blockDim.x - WARP) xs[i] = x[i] * inv * nw[i];
    }
    __syncthreads();
    int j = blockIdx.y;
    const int rows = E * 2 * I, n8 = H >> 3;
    for (int p = 0; p < pairs; p++) {
        const int i = (blockIdx.x * DEC_WARPS + w) * pairs + p;
        if (i >= I) return;
        const int gr = sidx[j] * 2 * I + i, ur = gr + I;
        float gv = 0.f, uv = 0.f;
        for (int base = 0; base < n8; base += CH * WARP) {
            Fp8Chunk a, b;
            load_chunk_fp8(Q, S, gr, rows, H, base, lane, a);
            load_chunk_fp8(Q, S, ur, rows, H, base, lane, b);
#pragma unroll
            for (int u = 0; u < CH; u++) {
                int c = base + lane + u * WARP;
                if (c < n8) {
                    gv += dot8(fp8x8_bf16(a.q[u], a.s[u]), xs + 8 * c);
                    uv += dot8(fp8x8_bf16(b.q[u], b.s[u]), xs + 8 * c);
                }
            }
        }
        gv = warp_sum(gv);
        uv = warp_sum(uv);
        if (lane == 0) act[(size_t)j * I + i] = silu_f(gv) * uv;
    }
}

// down_chunk for block-FP8 routed (Q [E * H, I]) and shared (Qs [H, S]) down weights.
__device__ __forceinline__ void down_chunk_fp8(const unsigned char* __restrict__ Qd, const float* __restrict__ Sd,
                                               const unsigned char* __restrict__ Qs,
                                               const float* __restrict__ Ss, const int* sidx, int k, int I,
                                               int S, int H, int r, int base, int lane, Fp8Chunk& v) {
    int n8I = I >> 3, nR = k * n8I, nv = nR + (S >> 3);
#pragma unroll
    for (int u = 0; u < CH; u++) {
        int c = base + lane + u * WARP;
        bool in = r < H && c < nv;
        if (in && c < nR) {
            int j = c / n8I;
            fp8_group(Qd, Sd, (size_t)sidx[j] * H + r, I, (I + 127) >> 7, c - j * n8I, true, v, u);
        } else {
            fp8_group(Qs, Ss, in ? r : 0, S, (S + 127) >> 7, c - nR, in, v, u);
        }
    }
}

// dec_moe_down on block-FP8 weights (the vectorised path; I, S multiples of 128).
QW_KERNEL void QW_BOUNDS(256) dec_moe_down_fp8(const unsigned char* __restrict__ Qd, const float* __restrict__ Sd,
                                              const unsigned char* __restrict__ Qs, const float* __restrict__ Ss,
                                              const float* __restrict__ act, const float* __restrict__ inp,
                                              int E, int k, int I, int S, float* __restrict__ y, int H,
                                              float* __restrict__ ssq_out) {
    QW_DYN_SMEM(float, xs);
    __shared__ int sidx[MOE_MAXK];
    __shared__ float sw[MOE_MAXK];
    float* as = xs + (size_t)k * I;
    if (threadIdx.x < WARP) router_topk_warp(inp, E, k, sidx, sw);
    __syncthreads();
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    int first = blockIdx.x * DEC_WARPS + w, stride = gridDim.x * DEC_WARPS;
    int n8I = I >> 3, nR = k * n8I, nv = nR + (S >> 3);
    Fp8Chunk v;
    down_chunk_fp8(Qd, Sd, Qs, Ss, sidx, k, I, S, H, first, 0, lane, v);
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    for (int i = threadIdx.x; i < k * I; i += blockDim.x) xs[i] = act[i];
    for (int i = threadIdx.x; i < S; i += blockDim.x) as[i] = silu_f(inp[E + 1 + i]) * inp[E + 1 + S + i];
    __syncthreads();
    float sg = sigmoid_f(inp[E]);
    float mine = 0.f;
    for (int r = first; r < H; r += stride) {
        float acc = 0.f;
        for (int base = 0; base < nv; base += CH * WARP) {
            Fp8Chunk nx;
            int nb = base + CH * WARP, nr = r;
            if (nb >= nv) {
                nb = 0;
                nr = r + stride;
            }
            down_chunk_fp8(Qd, Sd, Qs, Ss, sidx, k, I, S, H, nr, nb, lane, nx);
#pragma unroll
            for (int u = 0; u < CH; u++) {
                int c = base + lane + u * WARP;
                if (c < nR) {
                    int j = c / n8I;
                    acc += sw[j] * dot8(fp8x8_bf16(v.q[u], v.s[u]), xs + (size_t)j * I + 8 * (c - j * n8I));
                } else if (c < nv) {
                    acc += sg * dot8(fp8x8_bf16(v.q[u], v.s[u]), as + 8 * (c - nR));
                }
            }
            v = nx;
        }
        acc = warp_sum(acc);
        if (lane == 0) {
            float o = y[r] + acc;
            y[r] = o;
            mine += o * o;
        }
    }
    write_ssq(mine, ssq_out);
}
