// Decode GEMVs whose weights arrive by bulk copy (Hopper: cp.async.bulk into a
// shared-memory ring, completion counted by an mbarrier). One thread keeps
// `stages` slots of R consecutive rows in flight per block, so the bytes in
// flight no longer depend on registers: a block per SM with a 128 KB ring
// requests 17 MB over the GPU before its grid dependency wait (a whole
// 4,096-column out projection). Each warp owns a fixed slice of the columns
// (its activations in registers), every warp reads every row of a slot, and
// the 8 warps' partial dots meet in shared memory.
//
// Elsewhere (HIP, sm_80, the CPU harness) the block copies each slot itself
// before using it: the same arithmetic, without the overlap. The host picks
// these kernels only where the bulk copy exists.
#include "bulk_copy.h"
#include "fp8.h"
#include "norm_partials.h"

#define BULK_WARPS 8  // warps per block (256 threads)

// 8 bf16 weights . 8 f32 activations held in registers.
__device__ __forceinline__ float dot8r(uint4 w, const float (&a)[8]) {
    return bf_lo(w.x) * a[0] + bf_hi(w.x) * a[1] + bf_lo(w.y) * a[2] + bf_hi(w.y) * a[3] + bf_lo(w.z) * a[4] +
           bf_hi(w.z) * a[5] + bf_lo(w.w) * a[6] + bf_hi(w.w) * a[7];
}

// Sums each of R per-lane values over the warp with log2(R) + log2(32 / R)
// shuffles per lane instead of R * 5: every halving step trades half of the
// values with the partner lane. Lane l returns the total of value l / (32 / R).
template <int R>
__device__ __forceinline__ float warp_sum_rows(float (&v)[R], int lane) {
#pragma unroll
    for (int n = R, m = WARP / 2; n > 1; n >>= 1, m >>= 1) {
        const bool up = lane & m;
#pragma unroll
        for (int j = 0; j < n / 2; j++) {
            const float send = up ? v[j] : v[j + n / 2];
            const float keep = up ? v[j + n / 2] : v[j];
            v[j] = keep + SHFL_XOR(send, m);
        }
    }
    float t = v[0];
#pragma unroll
    for (int m = WARP / (2 * R); m > 0; m >>= 1) t += SHFL_XOR(t, m);
    return t;
}

// The weight formats of the ring. A slot row is `cols * BYTES` bytes; chunk c
// of a row (8 consecutive weights) becomes the 16 bytes of their bf16 values.
// `Lane` is what a lane needs for its chunk c in the slot whose first row is
// row0, fetched once per slot: nothing for bf16; for block-FP8 (E4M3 bytes,
// kernels/fp8.h) the scale of the (row0 / 128, c / 16) block, since a slot's
// R rows lie in one 128-row block. The bf16 values are exactly the
// dequantize-at-upload path's, so an FP8 kernel's outputs equal the bf16
// kernel's on the dequantized matrix, bit for bit.
struct BulkBf16 {
    static constexpr int BYTES = 2;
    struct Lane {};
    __device__ __forceinline__ Lane lane(int, int) const { return {}; }
    __device__ __forceinline__ uint4 w8(const uint4* row, int c, const Lane&) const { return row[c]; }
};
struct BulkFp8 {
    static constexpr int BYTES = 1;
    const float* __restrict__ S;  // [rows / 128][cols / 128]
    int cb;                       // cols / 128
    struct Lane {
        float s;
    };
    __device__ __forceinline__ Lane lane(int row0, int c) const { return {S[(size_t)(row0 >> 7) * cb + (c >> 4)]}; }
    __device__ __forceinline__ uint4 w8(const uint4* row, int c, const Lane& l) const {
        return fp8x8_bf16(((const uint2*)row)[c], l.s);
    }
};

// The ring of one block: `stages` slots of `slot16` 16-byte units (dynamic
// shared memory), each holding R weight rows of row16 units (n8 chunks of 8
// weights in the format WF) for one step `it` of the block's run of n steps:
// `rows(it)` rows (at most R, the first `row0(it)`) from `src(it)`. Every
// warp dots its column slice of every row with the activations in
// registers (xr, chunk c = u * 256 + w * 32 + lane), the 8 warps' partials
// meet in shared memory, and `emit(it, lane, part)` runs on lanes 0 ..
// rows(it) - 1 of warp 0 with part[q * R + row] the partial of warp q (sum
// them in q order).
//
// With bulk copies, `start` (before the grid dependency wait: weights do not
// depend on the previous kernel) issues the first slots and every slot freed
// is refilled at once; without, each slot is copied by the block when used.
template <int R, typename WF>
struct BulkRing {
    WF wf;
    uint4* ring;
    int slot16, row16, n8, stages, n;
#if defined(QW_BULK)
    unsigned long long* full;
#endif

    template <typename Src, typename Rows>
    __device__ __forceinline__ void fill(int it, Src src, Rows rows) {
        const uint4* from = src(it);
        const int n16 = rows(it) * row16;
        uint4* dst = ring + (size_t)(it % stages) * slot16;
#if defined(QW_BULK)
        mbar_expect(&full[it % stages], 16u * (unsigned)n16);
        bulk_copy(dst, from, 16u * (unsigned)n16, &full[it % stages]);
#else
        for (int i = threadIdx.x; i < n16; i += blockDim.x) dst[i] = from[i];
#endif
    }

    // Thread 0 initialises the slot barriers and issues the first slots;
    // the whole block must call it (it ends with a block barrier).
    template <typename Src, typename Rows>
    __device__ __forceinline__ void start(Src src, Rows rows) {
#if defined(QW_BULK)
        if (threadIdx.x == 0) {
            for (int s = 0; s < stages; s++) mbar_init(&full[s], 1);
            mbar_fence_init();
            for (int it = 0; it < min(stages, n); it++) fill(it, src, rows);
        }
        __syncthreads();
#endif
    }

    template <int UM, typename Src, typename Rows, typename Row0, typename Emit>
    __device__ __forceinline__ void run(const float (&xr)[UM][8], Src src, Rows rows, Row0 row0, Emit emit) {
        constexpr int G = WARP / R;  // lanes that end up with one row's total
        __shared__ float part[2][BULK_WARPS * R];
        const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
        for (int it = 0; it < n; it++) {
            const int s = it % stages, nr = rows(it);
            const uint4* sw = ring + (size_t)s * slot16;
            typename WF::Lane lw[UM] = {};  // fetched before the wait (the scales are constants)
#pragma unroll
            for (int u = 0; u < UM; u++) {
                const int c = u * BULK_WARPS * WARP + w * WARP + lane;
                if (c < n8) lw[u] = wf.lane(row0(it), c);
            }
#if defined(QW_BULK)
            mbar_wait(&full[s], (unsigned)(it / stages) & 1u);
#else
            fill(it, src, rows);
            __syncthreads();
#endif
            float acc[R];
#pragma unroll
            for (int j = 0; j < R; j++) {
                acc[j] = 0.f;
                if (j < nr) {
#pragma unroll
                    for (int u = 0; u < UM; u++) {
                        const int c = u * BULK_WARPS * WARP + w * WARP + lane;
                        if (c < n8) acc[j] += dot8r(wf.w8(sw + j * row16, c, lw[u]), xr[u]);
                    }
                }
            }
            const float t = warp_sum_rows<R>(acc, lane);
            if (lane % G == 0) part[it & 1][w * R + lane / G] = t;
            __syncthreads();  // the slot is read and the partials are in
#if defined(QW_BULK)
            if (threadIdx.x == 0 && it + stages < n) fill(it + stages, src, rows);
#endif
            if (w == 0 && lane < nr) emit(it, lane, (const float*)part[it & 1]);
        }
    }
};

// The activations of this lane's column chunks (c = u * 256 + w * 32 + lane),
// times nw where given; zeros past n8 chunks.
template <int UM>
__device__ __forceinline__ void lane_columns(const float* __restrict__ x, const float* __restrict__ nw, int n8,
                                             float (&xr)[UM][8]) {
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
#pragma unroll
    for (int u = 0; u < UM; u++) {
        const int c = u * BULK_WARPS * WARP + w * WARP + lane;
#pragma unroll
        for (int e = 0; e < 8; e++) xr[u][e] = c < n8 ? x[8 * c + e] * (nw ? nw[8 * c + e] : 1.f) : 0.f;
    }
}

// Sum of the 8 warps' partials of `row` (in warp order).
template <int R>
__device__ __forceinline__ float row_total(const float* part, int row) {
    float d = 0.f;
#pragma unroll
    for (int q = 0; q < BULK_WARPS; q++) d += part[q * R + row];
    return d;
}

// y = W . x for W [rows][cols] in the format WF (bf16: cols % 8 == 0;
// block-FP8: rows and cols multiples of 128; cols <= UM * 2048), in one of
// two modes:
//   norm (ssq set): y[r] = (W[r] . (x * nw)) / rms(x), the rms from the
//     residual kernels' nssq partial sums of squares (dec_norm_gemv's job);
//   residual (ssq null): y[r] (+)= W[r] . x, and with ssq_out each block
//     writes the sum of squares of its new rows to ssq_out[blockIdx.x] and
//     block 0 zeroes ssq_out[gridDim.x .. nssq) (dec_gemv's job).
// Block b takes a contiguous run of the matrix's slots of R = 8 / UM rows
// (32 KB at the largest cols); dynamic shared memory: stages slots.
//
// CONV (norm mode, the GDN in projection, dec_gemv_bulk_conv): the rows
// r < conv_dim are then convolved with their history and SiLU'd as
// dec_gdn_conv does, in the same arithmetic: y[r] = silu(cw[r][K-1] y +
// sum_q cw[r][q] hist[r][q]), and hist[r] (conv_w [conv_dim][K], hist
// [conv_dim][K-1]) shifted by one with the new value appended. A block's
// rows are its own, so no other block touches their history. The block's
// weights and history are staged in shared memory after the ring (n*R rows
// of K weights, K-1 history and the projected value) before the grid wait:
// the weights are constants and the history this layer's own state, last
// written by this kernel one token earlier. The conv runs once the block's
// rows are projected, a thread per row: inside the ring's loop it would hold
// up warp 0, which every slot's barrier waits for (2-3% slower decode on the
// H200).
//
// TAIL (norm mode; tail set): `tail_rows` more rows of bf16 weights after
// the matrix's (a block-FP8 stack's BF16 rows, such as the GDN's in_proj_a/b
// beside its FP8 qkv/z), y[rows + r] = (tail[r] . (x * nw)) / rms(x). Block b
// takes rows b, b + grid, ...: its first row's weights are loaded before the
// grid wait (constants), the 8 warps' column slices summed in warp order
// once the ring is done.
template <int UM, bool CONV, typename WF>
__device__ __forceinline__ void gemv_bulk(const WF& wf, const void* __restrict__ W, const float* __restrict__ x,
                                          const float* __restrict__ ssq, int nssq, const float* __restrict__ nw,
                                          float eps, float* __restrict__ y, int rows, int cols, int accumulate,
                                          float* __restrict__ ssq_out, int stages, const float* __restrict__ conv_w,
                                          float* __restrict__ hist, int K, int conv_dim,
                                          const bf16_t* __restrict__ tail = nullptr, int tail_rows = 0) {
    constexpr int R = 8 / UM;
    QW_DYN_SMEM(uint4, ring_mem);
    const int n8 = cols >> 3, row16 = n8 * WF::BYTES / 2;
    const int nslots = (rows + R - 1) / R;
    const int g0 = (int)((long long)nslots * blockIdx.x / gridDim.x);
    const int n = (int)((long long)nslots * (blockIdx.x + 1) / gridDim.x) - g0;
    BulkRing<R, WF> ring{wf, ring_mem, R * row16, row16, n8, stages, n};
#if defined(QW_BULK)
    __shared__ unsigned long long full[BULK_MAX_STAGES];
    ring.full = full;
#endif
    const uint4* W4 = (const uint4*)W;
    auto slot_rows = [&](int it) { return min(R, rows - (g0 + it) * R); };
    auto src = [&](int it) { return W4 + (size_t)(g0 + it) * R * row16; };
    auto row0 = [&](int it) { return (g0 + it) * R; };
    ring.start(src, slot_rows);
    const int H = K - 1, r0 = g0 * R;
    const int nc = CONV ? max(0, min(n * R, conv_dim - r0)) : 0;  // this block's conv channels
    float* cw = CONV ? (float*)(ring_mem + (size_t)stages * R * row16) : nullptr;  // [n R][K]
    float* ch = CONV ? cw + (size_t)n * R * K : nullptr;                         // [n R][H]
    float* cur = CONV ? ch + (size_t)n * R * H : nullptr;                        // [n R]
    if (CONV) {
        for (int i = threadIdx.x; i < nc * K; i += blockDim.x) cw[i] = conv_w[(size_t)r0 * K + i];
        for (int i = threadIdx.x; i < nc * H; i += blockDim.x) ch[i] = hist[(size_t)r0 * H + i];
    }
    const uint4* T4 = (const uint4*)tail;
    uint4 tw[UM];  // this block's first tail row, this lane's chunks
#pragma unroll
    for (int u = 0; u < UM; u++) {
        const int c = u * BULK_WARPS * WARP + (int)threadIdx.x;
        tw[u] = tail && (int)blockIdx.x < tail_rows && c < n8 ? T4[(size_t)blockIdx.x * n8 + c]
                                                              : make_uint4(0u, 0u, 0u, 0u);
    }
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    float xr[UM][8];
    lane_columns<UM>(x, nw, n8, xr);
    const float inv = ssq ? inv_rms(ssq, nssq, cols, eps) : 1.f;
    float mine = 0.f;
    ring.template run<UM>(xr, src, slot_rows, row0, [&](int it, int lane, const float* part) {
        const int r = (g0 + it) * R + lane;
        const float d = row_total<R>(part, lane);
        if (ssq) {
            if (CONV && r < conv_dim)
                cur[r - r0] = d * inv;
            else
                y[r] = d * inv;
        } else {
            const float o = accumulate ? y[r] + d : d;
            y[r] = o;
            mine += o * o;
        }
    });
    if (CONV) {
        __syncthreads();  // every row's projected value is in `cur`
        for (int j = threadIdx.x; j < nc; j += blockDim.x) {
            const float* wk = cw + (size_t)j * K;
            const float* hs = ch + (size_t)j * H;
            const float c = cur[j];
            float acc = wk[H] * c;
            for (int q = 0; q < H; q++) acc += wk[q] * hs[q];
            float* hg = hist + (size_t)(r0 + j) * H;
            for (int q = 0; q + 1 < H; q++) hg[q] = hs[q + 1];
            if (H > 0) hg[H - 1] = c;
            y[r0 + j] = silu_f(acc);
        }
    }
    if (tail && ssq) {
        __shared__ float tpart[BULK_WARPS];
        for (int r = blockIdx.x; r < tail_rows; r += gridDim.x) {
            float d = 0.f;
#pragma unroll
            for (int u = 0; u < UM; u++) {
                const int c = u * BULK_WARPS * WARP + (int)threadIdx.x;
                if (c < n8) d += dot8r(r == (int)blockIdx.x ? tw[u] : T4[(size_t)r * n8 + c], xr[u]);
            }
            d = warp_sum(d);
            if (threadIdx.x % WARP == 0) tpart[threadIdx.x / WARP] = d;
            __syncthreads();
            if (threadIdx.x == 0) y[rows + r] = row_total<1>(tpart, 0) * inv;
            __syncthreads();  // tpart is read before the next row's partials
        }
    }
    if (ssq_out) {
        write_ssq(warp_sum(mine), ssq_out);
        if (blockIdx.x == 0)
            for (int i = (int)gridDim.x + threadIdx.x; i < nssq; i += blockDim.x) ssq_out[i] = 0.f;
    }
}

// cols <= 2048: 8 rows per slot; cols <= 4096: 4 rows per slot. 256 threads.
QW_KERNEL void QW_BOUNDS(256) dec_gemv_bulk1(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                            const float* __restrict__ ssq, int nssq, const float* __restrict__ nw,
                                            float eps, float* __restrict__ y, int rows, int cols, int accumulate,
                                            float* __restrict__ ssq_out, int stages) {
    gemv_bulk<1, false>(BulkBf16{}, W, x, ssq, nssq, nw, eps, y, rows, cols, accumulate, ssq_out, stages, nullptr, nullptr, 0, 0);
}

QW_KERNEL void QW_BOUNDS(256) dec_gemv_bulk2(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                            const float* __restrict__ ssq, int nssq, const float* __restrict__ nw,
                                            float eps, float* __restrict__ y, int rows, int cols, int accumulate,
                                            float* __restrict__ ssq_out, int stages) {
    gemv_bulk<2, false>(BulkBf16{}, W, x, ssq, nssq, nw, eps, y, rows, cols, accumulate, ssq_out, stages, nullptr, nullptr, 0, 0);
}

// The GDN in projection with the step's causal conv folded in: gemv_bulk's
// CONV mode (norm mode, cols <= 2048, 8 rows per slot; dynamic shared
// memory: the ring, then n*8*(2K) floats). Arguments as dec_gemv_bulk1, then
// the conv's weights, history, taps and channels.
QW_KERNEL void QW_BOUNDS(256) dec_gemv_bulk_conv(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                                const float* __restrict__ ssq, int nssq, const float* __restrict__ nw,
                                                float eps, float* __restrict__ y, int rows, int cols, int accumulate,
                                                float* __restrict__ ssq_out, int stages,
                                                const float* __restrict__ conv_w, float* __restrict__ hist, int K,
                                                int conv_dim) {
    gemv_bulk<1, true>(BulkBf16{}, W, x, ssq, nssq, nw, eps, y, rows, cols, accumulate, ssq_out, stages, conv_w, hist, K,
                       conv_dim);
}

// dec_gemv_bulk1 / dec_gemv_bulk2 on block-FP8 weights: Q [rows][cols] E4M3
// bytes (the ring's slots hold them as stored: half the bytes of bf16),
// Sc [rows / 128][cols / 128]; rows and cols multiples of 128. Outputs
// bit-identical to the bf16 kernels on the dequantized matrix.
// dec_gemv_bulk1_fp8 also takes a BF16 tail (gemv_bulk's TAIL; null: none).
QW_KERNEL void QW_BOUNDS(256) dec_gemv_bulk1_fp8(const unsigned char* __restrict__ Q, const float* __restrict__ Sc,
                                                const float* __restrict__ x, const float* __restrict__ ssq, int nssq,
                                                const float* __restrict__ nw, float eps, float* __restrict__ y,
                                                int rows, int cols, int accumulate, float* __restrict__ ssq_out,
                                                int stages, const bf16_t* __restrict__ tail, int tail_rows) {
    gemv_bulk<1, false>(BulkFp8{Sc, cols >> 7}, Q, x, ssq, nssq, nw, eps, y, rows, cols, accumulate, ssq_out,
                        stages, nullptr, nullptr, 0, 0, tail, tail_rows);
}

QW_KERNEL void QW_BOUNDS(256) dec_gemv_bulk2_fp8(const unsigned char* __restrict__ Q, const float* __restrict__ Sc,
                                                const float* __restrict__ x, const float* __restrict__ ssq, int nssq,
                                                const float* __restrict__ nw, float eps, float* __restrict__ y,
                                                int rows, int cols, int accumulate, float* __restrict__ ssq_out,
                                                int stages) {
    gemv_bulk<2, false>(BulkFp8{Sc, cols >> 7}, Q, x, ssq, nssq, nw, eps, y, rows, cols, accumulate, ssq_out,
                        stages, nullptr, nullptr, 0, 0);
}

// dec_gemv_bulk_conv on block-FP8 weights (the GDN's in_proj_qkv / in_proj_z
// as stored) with the BF16 rows after them (in_proj_a / in_proj_b) as the
// tail: the in projection of an FP8 checkpoint in one launch. Shared memory
// as dec_gemv_bulk_conv's, with the FP8 ring.
QW_KERNEL void QW_BOUNDS(256) dec_gemv_bulk_conv_fp8(const unsigned char* __restrict__ Q,
                                                    const float* __restrict__ Sc, const float* __restrict__ x,
                                                    const float* __restrict__ ssq, int nssq,
                                                    const float* __restrict__ nw, float eps, float* __restrict__ y,
                                                    int rows, int cols, int accumulate, float* __restrict__ ssq_out,
                                                    int stages, const float* __restrict__ conv_w,
                                                    float* __restrict__ hist, int K, int conv_dim,
                                                    const bf16_t* __restrict__ tail, int tail_rows) {
    gemv_bulk<1, true>(BulkFp8{Sc, cols >> 7}, Q, x, ssq, nssq, nw, eps, y, rows, cols, accumulate, ssq_out, stages,
                       conv_w, hist, K, conv_dim, tail, tail_rows);
}
