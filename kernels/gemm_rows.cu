// Projections of a few rows (a batched decode step's B <= 64 sequences, or a
// short prompt): Y[b][n] = sum_k X[b][k] W[n][k] (+ Y[b][n] with accumulate)
// for f32 activations X [B][K] and bf16 weights W [N][K], reading each weight
// once. The activations are split into two bf16 terms (hi = bf16(x), lo =
// bf16(x - hi): ~16 mantissa bits, as the cuBLAS split path) and both go
// through the tensor cores against the same weight fragment, f32 accumulation.
//
// Transposed product on mma m16n8k16: A = 16 weight rows, B = 8 activation
// rows (NT tiles of 8 cover B). Each thread loads 8 consecutive k of its
// weight rows g and g + 8 (16 bytes each) and the same 8 k of activation row
// g of each tile, and feeds them as two k16 steps: the fragments' k index is
// permuted the same way in A and B, so the products are the sums over k.
// Warp w of the grid takes MT m-tiles (16 MT weight rows) and one of S
// slices of K (KS = K / S, a multiple of 32). With S = 1 the warp writes Y;
// otherwise part[s][b][n] and gemm_rows_reduce adds the slices in order
// (deterministic, no atomics).
#include "bulk_copy.h"
#include "fp8.h"

#define GR_MT 2  // m-tiles (16 weight rows each) per warp
#define GR_WARPS 4

#if defined(QW_CUDA) || defined(QW_CPU)
// The 8 floats at p as hi and lo bf16 pairs: hi[j], lo[j] hold elements 2j, 2j + 1.
__device__ __forceinline__ void gr_split8(const float* p, bool valid, unsigned (&hi)[4], unsigned (&lo)[4]) {
    float v[8];
    if (valid) {
        const float4 a = ((const float4*)p)[0], b = ((const float4*)p)[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const bf16_t h0 = f2bf(v[2 * j]), h1 = f2bf(v[2 * j + 1]);
        hi[j] = h0 | ((unsigned)h1 << 16);
        lo[j] = f2bf(v[2 * j] - bf2f(h0)) | ((unsigned)f2bf(v[2 * j + 1] - bf2f(h1)) << 16);
    }
}

// The weight formats gr_core reads. A lane loads PACK runs of 8 consecutive
// weights of a row at once (`Raw`, kept in registers until used) and feeds
// run j as the 16 bytes of their bf16 values (`bf16(raw, j)`). Block-FP8
// (kernels/fp8.h): 16 E4M3 bytes (two runs) and their 128x128 block's
// scale, converted to the same bf16 values the dequantize-at-upload path
// would hold; 16 bytes a load, as for bf16, so a warp reads a row in runs as
// long (8-byte loads, 128-byte runs per row: 2.3 TB/s on the H200).
struct GrBf16 {
    static constexpr int PACK = 1;
    const bf16_t* __restrict__ W;
    using Raw = uint4;
    __device__ __forceinline__ Raw load(size_t row, int K, int k, bool valid) const {
        return valid ? *(const uint4*)(W + row * K + k) : make_uint4(0u, 0u, 0u, 0u);
    }
    __device__ __forceinline__ uint4 bf16(const Raw& r, int) const { return r; }
};
struct GrFp8 {
    static constexpr int PACK = 2;
    const unsigned char* __restrict__ Q;
    const float* __restrict__ S;  // [rows / 128][K / 128]
    struct Raw {
        uint4 q;
        float s;
    };
    __device__ __forceinline__ Raw load(size_t row, int K, int k, bool valid) const {
        if (!valid) return {make_uint4(0u, 0u, 0u, 0u), 0.f};
        return {*(const uint4*)(Q + row * K + k), S[(row >> 7) * (size_t)(K >> 7) + (k >> 7)]};
    }
    __device__ __forceinline__ uint4 bf16(const Raw& r, int j) const {
        return fp8x8_bf16(j ? make_uint2(r.q.z, r.q.w) : make_uint2(r.q.x, r.q.y), r.s);
    }
};

// The products of warp-owned weight rows n0 .. n0 + 16 MT over k in [k0,
// kend) into acc, with xload(t, k, hi, lo) giving activation row t * 8 + g's
// hi and lo pairs at k .. k + 8. PF k32 blocks of weights are loaded before
// any is used (PF x MT x 32 bytes of bf16 per lane in flight: the weights
// stream at bandwidth only with enough bytes in flight per multiprocessor).
// Lane c's 8 k of block p within a step: 8c (PACK 1), or of pack p / 2's 64
// k, 16c + 8 (p % 2) (PACK 2); the fragments' k order is permuted the same
// way in A and B, so the products are the sums over k. kend - k0 must be a
// multiple of 32 PACK. Asking L2 for the next blocks ahead of use
// (prefetch.global.L2) was slower on the H200: 17% at batch 8 two steps
// ahead, nothing gained for the first steps before the PDL wait.
template <int MT, int NT, int PF, typename WF, typename XL>
__device__ __forceinline__ void gr_core(const WF& wf, int N, int K, int n0, int k0, int kend, XL xload,
                                        float (&acc)[MT][NT][4]) {
    constexpr int P = WF::PACK;
    static_assert(PF % P == 0, "whole packs per step");
    const int lane = threadIdx.x % WARP, g = lane >> 2, c = lane & 3;
    auto koff = [&](int p) { return 32 * p + (P == 1 ? 8 * c : 16 * c - 24 * (p & 1)); };
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[m][t][j] = 0.f;
    for (int kb = k0; kb < kend; kb += 32 * PF) {
        typename WF::Raw w[PF / P][MT][2];
#pragma unroll
        for (int p = 0; p < PF; p += P)
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int row = n0 + m * 16 + g + 8 * h;
                    w[p / P][m][h] = wf.load((size_t)row, K, kb + koff(p), row < N && kb + 32 * p < kend);
                }
#pragma unroll
        for (int p = 0; p < PF; p++) {
            if (kb + 32 * p >= kend) break;
            const int k = kb + koff(p);
            uint4 wb[MT][2];
#pragma unroll
            for (int m = 0; m < MT; m++)
                wb[m][0] = wf.bf16(w[p / P][m][0], p % P), wb[m][1] = wf.bf16(w[p / P][m][1], p % P);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                unsigned hi[4], lo[4];
                xload(t, k, hi, lo);
#pragma unroll
                for (int st = 0; st < 2; st++) {
#pragma unroll
                    for (int m = 0; m < MT; m++) {
                        const unsigned* w0 = (const unsigned*)&wb[m][0];
                        const unsigned* w1 = (const unsigned*)&wb[m][1];
                        const unsigned a[4] = {w0[2 * st], w1[2 * st], w0[2 * st + 1], w1[2 * st + 1]};
                        mma_16816(acc[m][t], a, hi[2 * st], hi[2 * st + 1]);
                        mma_16816(acc[m][t], a, lo[2 * st], lo[2 * st + 1]);
                    }
                }
            }
        }
    }
}

template <int MT, int NT, int PF, typename WF>
__device__ __forceinline__ void gemm_rows_impl(const float* __restrict__ X, const WF& wf, float* __restrict__ Y,
                                               float* __restrict__ part, int B, int N, int K, int S,
                                               int accumulate) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    const int lane = threadIdx.x % WARP, g = lane >> 2, c = lane & 3;
    const int warp = blockIdx.x * GR_WARPS + threadIdx.x / WARP;
    const int groups = (N + 16 * MT - 1) / (16 * MT);
    if (warp >= groups * S) return;
    const int mg = warp % groups, s = warp / groups, KS = K / S;
    const int n0 = mg * 16 * MT, k0 = s * KS;
    float acc[MT][NT][4];
    gr_core<MT, NT, PF>(wf, N, K, n0, k0, k0 + KS,
                    [&](int t, int k, unsigned (&hi)[4], unsigned (&lo)[4]) {
                        const int b = t * 8 + g;
                        gr_split8(X + (size_t)b * K + k, b < B, hi, lo);
                    },
                    acc);
    // c0, c1: weight row g, activation rows 2c, 2c + 1; c2, c3: weight row g + 8.
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int n = n0 + m * 16 + g + 8 * (j >> 1), b = t * 8 + 2 * c + (j & 1);
                if (n >= N || b >= B) continue;
                const size_t at = (size_t)b * N + n;
                if (S == 1) Y[at] = accumulate ? Y[at] + acc[m][t][j] : acc[m][t][j];
                else part[(size_t)s * B * N + at] = acc[m][t][j];
            }
}
#define GR_BODY(MT, NT, PF) gemm_rows_impl<MT, NT, PF>(X, GrBf16{W}, Y, part, B, N, K, S, accumulate)
#define GRF_BODY(MT, NT, PF) gemm_rows_impl<MT, NT, PF>(X, GrFp8{Q, Sc}, Y, part, B, N, K, S, accumulate)
#else
// Without tensor cores (HIP): the same sums on CUDA cores, one output per thread.
__device__ __forceinline__ void gemm_rows_fma(const float* __restrict__ X, const bf16_t* __restrict__ W,
                                              float* __restrict__ Y, float* __restrict__ part, int B, int N, int K,
                                              int S, int accumulate) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    const long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= (long long)B * N) return;
    const int b = (int)(o / N), n = (int)(o % N);
    float acc = 0.f;
    for (int k = 0; k < K; k++) acc = fmaf(X[(size_t)b * K + k], bf2f(W[(size_t)n * K + k]), acc);
    Y[o] = accumulate ? Y[o] + acc : acc;
}
#define GR_BODY(MT, NT, PF) gemm_rows_fma(X, W, Y, part, B, N, K, S, accumulate)
// Not launched without tensor cores (ops.rs takes the few-row kernels on CUDA only).
#define GRF_BODY(MT, NT, PF)
#endif

// NT = 1, 2, 4, 8: up to 8, 16, 32, 64 activation rows; MT m-tiles (16
// weight rows each) per warp, PF k32 blocks per step. Grid: ceil(ceil(N /
// (16 MT)) S / GR_WARPS) blocks of GR_WARPS warps (HIP: ceil(B N / 256) of
// 256). Other shapes were slower on the H200 (batch 8 / 16 / 64, tok/s): 16
// rows x 8 blocks 747 / 912 / 1,973 and 32 x 8 763 / 928 / 1,971, against
// 864 / 1,094 / 2,231 for 32 x 4 (with moe_rows8 in the same shape). For
// 9-16 rows, 64 weight rows a warp (MT 4, PF 2: half the activation reads
// per weight byte) was 3.5% slower at batch 12 and 16 (f274210+): the
// kernel waits on latency, not on L2.
#define GEMM_ROWS(NAME, MT, NT, PF)                                                                          \
    QW_KERNEL void QW_BOUNDS(128) NAME(const float* __restrict__ X, const bf16_t* __restrict__ W,           \
                                       float* __restrict__ Y, float* __restrict__ part, int B, int N, int K, \
                                       int S, int accumulate) {                                              \
        GR_BODY(MT, NT, PF);                                                                                 \
    }
GEMM_ROWS(gemm_rows8, GR_MT, 1, 4)
GEMM_ROWS(gemm_rows16, GR_MT, 2, 4)
GEMM_ROWS(gemm_rows32, GR_MT, 4, 2)
GEMM_ROWS(gemm_rows64, GR_MT, 8, 2)

// The same for block-FP8 weights: Q [N][K] E4M3, Sc [N / 128][K / 128]
// (N and K multiples of 128, K / S of 64), read as they are stored.
#define GEMM_ROWS_FP8(NAME, MT, NT, PF)                                                                     \
    QW_KERNEL void QW_BOUNDS(128)                                                                           \
        NAME(const float* __restrict__ X, const unsigned char* __restrict__ Q, const float* __restrict__ Sc, \
             float* __restrict__ Y, float* __restrict__ part, int B, int N, int K, int S, int accumulate) {  \
        GRF_BODY(MT, NT, PF);                                                                                \
    }
GEMM_ROWS_FP8(gemm_rows8_fp8, GR_MT, 1, 4)
GEMM_ROWS_FP8(gemm_rows16_fp8, GR_MT, 2, 4)

// Projections of 2-8 rows with the weights through a bulk-copy ring (sm_90,
// gemv_bulk.cu's scheme): one block per multiprocessor takes a contiguous run
// of the matrix's slots of RB_ROWS whole rows; one thread keeps `stages`
// slots in flight, the first ones requested before the grid dependency wait
// (weights do not depend on the previous kernel), so a matrix streams in
// long contiguous runs across kernel boundaries instead of the 256-byte runs
// per row and warp of gemm_rows8, with no K-slice pass after it. Warp w owns
// columns [256 w, 256 w + 256) (blockDim = K / 8), its activations split
// (hi, lo) in registers in the mma fragments' permuted k order; every warp
// multiplies its columns of every slot row on mma m16n8k16 (the 8 slot rows
// as A's rows g, rows g + 8 zero) and the warps' partials meet in shared
// memory, summed in warp order (deterministic). A slot row sits RB_PAD
// 16-byte units past the previous one so lanes of rows g and g + 1 hit other
// banks. Elsewhere (the CPU harness, sm_80) the block copies each slot
// itself. The routed experts in the same ring (blocks sharing the tiles'
// slots, no request before the wait: the tiles are the predecessor's) were
// slower than moe_rows8 on the H200 (batch 8: 764 against 866 tok/s).
#define RB_ROWS 8
#define RB_KB 8  // k32 blocks per warp (8 rows; 16 rows: RB_KB / 2)
#define RB_PAD 4
#define RB_MAX_WARPS 16  // K <= 4096 (16 rows: 2048)

#if defined(QW_CUDA) || defined(QW_CPU)
// The ring's weight formats: a slot row of K weights (`BYTES` each) sits
// PAD16 16-byte units past the previous one (so lanes of rows g and g + 1
// hit other banks); lane c's 8 weights of k32 block kb of a row become the
// 16 bytes of their bf16 values. `Lane` is what the lane needs for block kb
// in the slot of first row row0 (8 rows: one 128-row block): nothing for
// bf16; the block scale for block-FP8 (E4M3 bytes, kernels/fp8.h), whose
// bf16 values are the dequantize-at-upload path's, so the FP8 kernels'
// outputs equal the bf16 kernels' on the dequantized matrix, bit for bit.
struct RbBf16 {
    static constexpr int BYTES = 2, PAD16 = RB_PAD;
    struct Lane {};
    __device__ __forceinline__ Lane lane(int, int) const { return {}; }
    __device__ __forceinline__ uint4 w8(const uint4* row, int kb, int c, const Lane&) const { return row[kb * 4 + c]; }
};
struct RbFp8 {
    static constexpr int BYTES = 1, PAD16 = 2;
    const float* __restrict__ S;  // [N / 128][K / 128]
    int cb;                       // K / 128
    struct Lane {
        float s;
    };
    __device__ __forceinline__ Lane lane(int row0, int kb) const { return {S[(size_t)(row0 >> 7) * cb + (kb >> 2)]}; }
    __device__ __forceinline__ uint4 w8(const uint4* row, int kb, int c, const Lane& l) const {
        return fp8x8_bf16(((const uint2*)row)[kb * 4 + c], l.s);
    }
};

// NT tiles of 8 activation rows (B <= 8 NT), KB k32 blocks per warp: warp w
// owns columns [32 KB w, 32 KB (w + 1)) of the block's K slice, blockDim =
// KS / KB. The activations stay in registers (2 NT KB x 4 words a lane),
// hence fewer columns a warp for more rows. NACC accumulators a tile (4: k16
// step x hi/lo; 2: hi/lo, where NT tiles already make independent chains
// and the registers are short). SLICED: K is cut into gridDim.y slices of
// KS = K / gridDim.y columns (slice blockIdx.y), each slot row a segment of
// KS; with more than one slice the block writes its sums to
// slices[slice][b][n] for gemm_rows_reduce to add in order (deterministic),
// else to Y.
template <int NT, int KB, int NACC, bool SLICED, typename WF>
__device__ __forceinline__ void rows_bulk_impl(const float* __restrict__ X, const WF& wf, const void* __restrict__ W,
                                               float* __restrict__ Y, float* __restrict__ slices, int B, int N,
                                               int K, int accumulate, int stages) {
    static_assert(NACC == 4 || NACC == 2, "accumulators a tile");
    QW_DYN_SMEM(uint4, ring);
    const int S = SLICED ? (int)gridDim.y : 1, sl = SLICED ? (int)blockIdx.y : 0;
    const int KS = SLICED ? K / S : K, k0 = sl * KS;
    const int rowK16 = (K * WF::BYTES) >> 4;  // a whole row's 16-byte units
    const int row16 = (KS * WF::BYTES) >> 4, pitch = row16 + WF::PAD16, slot16 = RB_ROWS * pitch;
    const int nslots = (N + RB_ROWS - 1) / RB_ROWS;
    const int g0 = (int)((long long)nslots * blockIdx.x / gridDim.x);
    const int n = (int)((long long)nslots * (blockIdx.x + 1) / gridDim.x) - g0;
    const uint4* W4 = (const uint4*)W;
    auto slot_rows = [&](int it) { return min(RB_ROWS, N - (g0 + it) * RB_ROWS); };
#if defined(QW_BULK)
    __shared__ unsigned long long full[BULK_MAX_STAGES];
#endif
    auto fill = [&](int it) {
        const int nr = slot_rows(it);
        const uint4* from = W4 + (size_t)(g0 + it) * RB_ROWS * rowK16 + ((k0 * WF::BYTES) >> 4);
        uint4* dst = ring + (size_t)(it % stages) * slot16;
#if defined(QW_BULK)
        mbar_expect(&full[it % stages], 16u * (unsigned)(nr * row16));
        for (int j = 0; j < nr; j++)
            bulk_copy(dst + j * pitch, from + (size_t)j * rowK16, 16u * row16, &full[it % stages]);
#else
        for (int i = threadIdx.x; i < nr * row16; i += blockDim.x)
            dst[(i / row16) * pitch + i % row16] = from[(size_t)(i / row16) * rowK16 + i % row16];
#endif
    };
#if defined(QW_BULK)
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; s++) mbar_init(&full[s], 1);
        mbar_fence_init();
        for (int it = 0; it < min(stages, n); it++) fill(it);
    }
    __syncthreads();
#endif
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP, g = lane >> 2, c = lane & 3;
    const int nw = (int)blockDim.x / WARP;
    unsigned hi[KB][NT][4], lo[KB][NT][4];
#pragma unroll
    for (int i = 0; i < KB; i++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const int b = t * 8 + g;
            gr_split8(X + (size_t)(b < B ? b : 0) * K + k0 + (w * KB + i) * 32 + c * 8, b < B, hi[i][t], lo[i][t]);
        }
    __shared__ float part[2][RB_MAX_WARPS * 64 * NT];
    for (int it = 0; it < n; it++) {
        const int s = it % stages, nr = slot_rows(it);
        typename WF::Lane lw[KB];  // fetched before the wait (the scales are constants)
#pragma unroll
        for (int i = 0; i < KB; i++) lw[i] = wf.lane((g0 + it) * RB_ROWS, (k0 >> 5) + w * KB + i);
#if defined(QW_BULK)
        mbar_wait(&full[s], (unsigned)(it / stages) & 1u);
#else
        fill(it);
        __syncthreads();
#endif
        const uint4* sw = ring + (size_t)s * slot16 + g * pitch;
        // Four accumulators a tile (k16 step x hi/lo) for one or two tiles: one
        // chain of 32 dependent mma per slot made the kernel latency-bound
        // (1.2-1.7 TB/s on the H200).
        float acc[NACC][NT][4] = {};
#pragma unroll
        for (int i = 0; i < KB; i++) {
            const uint4 wv = g < nr ? wf.w8(sw, w * KB + i, c, lw[i]) : make_uint4(0u, 0u, 0u, 0u);
            const unsigned* w0 = (const unsigned*)&wv;
#pragma unroll
            for (int st = 0; st < 2; st++) {
                const unsigned a[4] = {w0[2 * st], 0u, w0[2 * st + 1], 0u};
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    mma_16816(acc[NACC == 4 ? 2 * st : 0][t], a, hi[i][t][2 * st], hi[i][t][2 * st + 1]);
                    mma_16816(acc[NACC == 4 ? 2 * st + 1 : 1][t], a, lo[i][t][2 * st], lo[i][t][2 * st + 1]);
                }
            }
        }
        // c0, c1: slot row g, activation rows t 8 + 2c, + 1 (c2, c3: the zero rows).
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float* pt = part[it & 1] + (w * NT + t) * 64 + g * 8 + 2 * c;
#pragma unroll
            for (int j = 0; j < 2; j++)
                pt[j] = NACC == 4 ? (acc[0][t][j] + acc[1][t][j]) + (acc[2][t][j] + acc[3][t][j])
                                  : acc[0][t][j] + acc[1][t][j];
        }
        __syncthreads();  // the slot is read and the partials are in
#if defined(QW_BULK)
        if (threadIdx.x == 0 && it + stages < n) fill(it + stages);
#endif
        for (int o = threadIdx.x; o < 64 * NT; o += blockDim.x) {
            const int t = o >> 6, row = (o >> 3) & 7, b = t * 8 + (o & 7);
            if (row < nr && b < B) {
                float d = 0.f;
                for (int q = 0; q < nw; q++) d += part[it & 1][(q * NT + t) * 64 + (o & 63)];
                const size_t at = (size_t)b * N + (size_t)(g0 + it) * RB_ROWS + row;
                if (SLICED && S > 1)
                    slices[(size_t)sl * B * N + at] = d;
                else
                    Y[at] = accumulate ? Y[at] + d : d;
            }
        }
    }
}
#define RB_BODY(NT, KB) rows_bulk_impl<NT, KB, 4, false>(X, RbBf16{}, W, Y, nullptr, B, N, K, accumulate, stages)
#define RBF_BODY(NT, KB) \
    rows_bulk_impl<NT, KB, 4, false>(X, RbFp8{Sc, K >> 7}, Q, Y, nullptr, B, N, K, accumulate, stages)
#define RBS_BODY rows_bulk_impl<4, 2, 2, true>(X, RbBf16{}, W, Y, part, B, N, K, accumulate, stages)
#define RBSF_BODY rows_bulk_impl<4, 2, 2, true>(X, RbFp8{Sc, K >> 7}, Q, Y, part, B, N, K, accumulate, stages)
#else
// Not launched without tensor cores (ops.rs takes it on CUDA only).
#define RB_BODY(NT, KB)
#define RBF_BODY(NT, KB)
#define RBS_BODY
#define RBSF_BODY
#endif

// Y [B][N] (+)= X [B][K] . W [N][K]^T for B <= 8, K a multiple of 256 up to
// 4,096. Grid: at most one block per slot (ops.rs: as many as are resident);
// block K / 8 threads; dynamic shared memory stages * RB_ROWS * (K / 8 +
// RB_PAD) * 16 bytes.
QW_KERNEL void QW_BOUNDS(512) gemm_rows_bulk(const float* __restrict__ X, const bf16_t* __restrict__ W,
                                             float* __restrict__ Y, int B, int N, int K, int accumulate,
                                             int stages) {
    RB_BODY(1, RB_KB);
}

// The same for 9-16 rows: K a multiple of 128 up to 2,048, block K / 4
// threads (each warp 128 columns of both row tiles' activations).
QW_KERNEL void QW_BOUNDS(512) gemm_rows_bulk16(const float* __restrict__ X, const bf16_t* __restrict__ W,
                                               float* __restrict__ Y, int B, int N, int K, int accumulate,
                                               int stages) {
    RB_BODY(2, RB_KB / 2);
}

// gemm_rows_bulk and gemm_rows_bulk16 on block-FP8 weights: Q [N][K] E4M3
// bytes (the slots hold them as stored, rows 32 bytes apart), Sc [N / 128]
// [K / 128]; N and K multiples of 128 besides the bf16 kernels' rules.
// Dynamic shared memory stages * RB_ROWS * (K / 16 + 2) * 16 bytes.
QW_KERNEL void QW_BOUNDS(512) gemm_rows_bulk_fp8(const float* __restrict__ X, const unsigned char* __restrict__ Q,
                                                 const float* __restrict__ Sc, float* __restrict__ Y, int B, int N,
                                                 int K, int accumulate, int stages) {
    RBF_BODY(1, RB_KB);
}

QW_KERNEL void QW_BOUNDS(512) gemm_rows_bulk16_fp8(const float* __restrict__ X, const unsigned char* __restrict__ Q,
                                                   const float* __restrict__ Sc, float* __restrict__ Y, int B, int N,
                                                   int K, int accumulate, int stages) {
    RBF_BODY(2, RB_KB / 2);
}

// 17-32 rows (four row tiles) through the ring, K cut into gridDim.y slices
// of KS = K / gridDim.y columns (a multiple of 64, at most 1,024: blockDim
// KS / 2, each warp 64 columns of the four tiles' split activations; FP8: KS
// a multiple of 128), two accumulators a tile. One slice writes Y; more
// write part [S][B][N] for gemm_rows_reduce. Dynamic shared memory stages *
// RB_ROWS * (KS / 8 + 4) * 16 bytes (FP8: KS / 16 + 2).
QW_KERNEL void QW_BOUNDS(512) gemm_rows_bulk32(const float* __restrict__ X, const bf16_t* __restrict__ W,
                                               float* __restrict__ Y, float* __restrict__ part, int B, int N, int K,
                                               int accumulate, int stages) {
    RBS_BODY;
}

QW_KERNEL void QW_BOUNDS(512) gemm_rows_bulk32_fp8(const float* __restrict__ X, const unsigned char* __restrict__ Q,
                                                   const float* __restrict__ Sc, float* __restrict__ Y,
                                                   float* __restrict__ part, int B, int N, int K, int accumulate,
                                                   int stages) {
    RBSF_BODY;
}

// The routed experts of a batched decode step (or a short prompt): rows
// gathered by expert in plan order, already split (ahi, alo [rows][K] bf16),
// moe_plan_tiles' table of (expert, first row, rows <= 8) tiles; expert e's
// weights at W + e w_stride ([N][K]). Y [rows][N]. Grid (ceil(ceil(N / (16
// MT)) / GR_WARPS), the most tiles); blocks past the table's count return.
#if defined(QW_CUDA) || defined(QW_CPU)
// expert(e): expert e's weights in a gr_core format.
template <int MT, int PF, typename Expert>
__device__ __forceinline__ void moe_rows_impl(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                              Expert expert, const int* __restrict__ tiles, float* __restrict__ Y,
                                              int N, int K) {
    QW_GRID_WAIT();  // the tile table is the predecessor's
    QW_GRID_LAUNCH();
    if ((int)blockIdx.y >= tiles[0]) return;
    const int e = tiles[1 + 3 * blockIdx.y], r0 = tiles[2 + 3 * blockIdx.y], rows = tiles[3 + 3 * blockIdx.y];
    const int lane = threadIdx.x % WARP, g = lane >> 2, c = lane & 3;
    const int warp = blockIdx.x * GR_WARPS + threadIdx.x / WARP;
    if (warp * 16 * MT >= N) return;
    const int n0 = warp * 16 * MT;
    float acc[MT][1][4];
    gr_core<MT, 1, PF>(expert(e), N, K, n0, 0, K,
                       [&](int, int k, unsigned (&hi)[4], unsigned (&lo)[4]) {
                           const bool v = g < rows;
                           const size_t at = (size_t)(r0 + (v ? g : 0)) * K + k;
                           const uint4 h = v ? *(const uint4*)(ahi + at) : make_uint4(0u, 0u, 0u, 0u);
                           const uint4 l = v ? *(const uint4*)(alo + at) : make_uint4(0u, 0u, 0u, 0u);
                           hi[0] = h.x, hi[1] = h.y, hi[2] = h.z, hi[3] = h.w;
                           lo[0] = l.x, lo[1] = l.y, lo[2] = l.z, lo[3] = l.w;
                       },
                       acc);
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int n = n0 + m * 16 + g + 8 * (j >> 1), b = 2 * c + (j & 1);
            if (n < N && b < rows) Y[(size_t)(r0 + b) * N + n] = acc[m][0][j];
        }
}
#define MR_BODY(MT, PF) \
    moe_rows_impl<MT, PF>(ahi, alo, [&](int e) { return GrBf16{W + (size_t)e * w_stride}; }, tiles, Y, N, K)
#define MRF_BODY(MT, PF)                                                                                           \
    moe_rows_impl<MT, PF>(                                                                                         \
        ahi, alo, [&](int e) { return GrFp8{Q + (size_t)e * N * K, Sc + (size_t)e * (N >> 7) * (K >> 7)}; }, tiles, \
        Y, N, K)
#else
// Not launched without tensor cores (ops.rs takes it on CUDA only).
#define MR_BODY(MT, PF)
#define MRF_BODY(MT, PF)
#endif
#define MOE_ROWS(NAME, MT, PF)                                                                                \
    QW_KERNEL void QW_BOUNDS(128) NAME(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,        \
                                       const bf16_t* __restrict__ W, long long w_stride,                     \
                                       const int* __restrict__ tiles, float* __restrict__ Y, int N, int K) { \
        MR_BODY(MT, PF);                                                                                      \
    }
MOE_ROWS(moe_rows8, GR_MT, 4)

// moe_rows8 for block-FP8 experts: expert e's E4M3 weights at Q + e N K,
// its scales at Sc + e (N / 128) (K / 128).
QW_KERNEL void QW_BOUNDS(128) moe_rows8_fp8(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                            const unsigned char* __restrict__ Q, const float* __restrict__ Sc,
                                            const int* __restrict__ tiles, float* __restrict__ Y, int N, int K) {
    MRF_BODY(GR_MT, 4);
}

// Y[i] = (accumulate ? Y[i] : 0) + sum over s of part[s][i], s ascending; i < n = B N.
QW_KERNEL void QW_BOUNDS(256) gemm_rows_reduce(const float* __restrict__ part, float* __restrict__ Y, long long n,
                                               int S, int accumulate) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float t = 0.f;
    for (int s = 0; s < S; s++) t += part[(size_t)s * n + i];
    Y[i] = accumulate ? Y[i] + t : t;
}
