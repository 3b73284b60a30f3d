// Fused batch-1 decode kernels. One decode step reads ~6 GB of weights for a
// few microseconds of arithmetic, so these kernels are about streaming weights
// at full bandwidth and about launching few kernels: norms run as GEMV
// prologues, the MoE router is recomputed inside the expert kernel, the
// residual add is every output GEMV's epilogue, and the position comes from
// device memory so a whole step can be replayed as one CUDA graph. This file:
// the dense GEMVs (bf16 and block-FP8), the embedding and the bandwidth probe;
// the GDN step in decode_gdn.cu, attention in decode_attn.cu (and
// decode_attn_keys.cu, decode_attn_tc.cu), the experts in decode_moe.cu, the
// greedy readout in argmax.cu; the shared weight streaming in decode_stream.h.
#include "decode_stream.h"
#include "norm_partials.h"

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

// ---- Block-FP8 weights (decode_stream.h): dec_gemv and dec_norm_gemv reading
// E4M3 bytes and block scales. Each weight is widened to the exact bf16 value
// the dequantize-at-upload path would hold and then used in the same f32
// arithmetic, in the same order, as the bf16 kernel: the results equal that
// kernel's on the dequantized matrices.

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
