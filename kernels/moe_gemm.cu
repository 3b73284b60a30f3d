// Grouped expert GEMM for prompts: every expert's rows in one launch instead of
// one cuBLAS call per expert and operand half (1,024 calls per layer before).
//
// Rows are sorted by expert (moe_plan_*); `tiles` (moe_plan_tiles) holds their
// count, then (expert, first row, row count <= MG_BM) per block row: grid
// (ceil(N / columns per block), at least the count; rows past it return). The
// column blocks of a row tile are neighbours in launch order, so its activation
// rows are read from DRAM once and then from L2 (with the tiles in x, each pass
// over the tiles re-read every activation row from DRAM).
// Y[r][n] = sum_k (ahi[r][k] + alo[r][k]) * W_e[n][k] with W_e = W + e * w_stride
// a [N][K] bf16 matrix and the activation split into two bf16 terms (~16
// mantissa bits, as the cuBLAS split path), f32 accumulation. alo == nullptr
// (`--prefill-precision bf16`): Y = ahi W_e^T, one product per k16 step and
// no lo copies (the entry points dispatch to a single-term instantiation).
// Needs K % MG_BK == 0 and 16-byte aligned rows (K % 8 == 0); the host checks.
#include "mma.h"

#define MG_BN 128
#define MG_BK 32
#define MG_LD (MG_BK + 8)  // bf16 per shared row: 80 bytes, conflict-free ldmatrix

#if defined(QW_CUDA) || defined(QW_CPU)
// (QW_CPU: the CPU harness runs this mma.sync path, tests/kernels_cpu/moe_gemm_check.cpp.)
// WM x 2 warps, each a 32 x 64 sub-tile (2 x 8 mma tiles) of a BM = 32 WM row
// tile; k steps of BK; NS-stage cp.async ring in dynamic shared memory: A hi,
// A lo [BM][LD] per stage, then B [MG_BN][LD] per stage (NS (2 BM + MG_BN) LD
// bf16 in all, LD = BK + 8).
template <int WM, int NS, int BK = MG_BK, bool LO = true>
__device__ __forceinline__ void moe_gemm_impl(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                              const bf16_t* __restrict__ W, long long w_stride,
                                              const int* __restrict__ tiles, float* __restrict__ Y, int N, int K) {
    constexpr int MG_BM = 32 * WM, NT = 64 * WM, LD = BK + 8;  // LD: conflict-free ldmatrix rows
    __align__(16) QW_DYN_SMEM(bf16_t, mg_smem);
    typedef bf16_t ATile[2][MG_BM * LD];
    typedef bf16_t BTile[MG_BN * LD];
    ATile* As = (ATile*)mg_smem;                      // [stage][hi, lo]
    BTile* Bs = (BTile*)(mg_smem + NS * 2 * MG_BM * LD);  // [stage]
    if ((int)blockIdx.y >= tiles[0]) return;  // past the plan's tiles (the grid is their upper bound)
    const int e = tiles[1 + 3 * blockIdx.y], r0 = tiles[2 + 3 * blockIdx.y], rows = tiles[3 + 3 * blockIdx.y];
    const int n0 = blockIdx.x * MG_BN;
    const bf16_t* Wb = W + (size_t)e * w_stride;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 1, wn = warp & 1;
    // Warps whose 32 rows all lie past the tile's last row only help load (an
    // expert's last tile is usually partial; no measurable gain on the H200).
    const bool active = wm * 32 < rows;

    auto load = [&](int stage, int k0) {
        for (int i = tid; i < MG_BM * (BK / 8); i += NT) {
            const int r = i / (BK / 8), ch = i % (BK / 8);
            const bool v = r < rows;
            const size_t off = (size_t)(r0 + (v ? r : 0)) * K + k0 + ch * 8;
            cp_async16(&As[stage][0][r * LD + ch * 8], ahi + off, v);
            if constexpr (LO) cp_async16(&As[stage][1][r * LD + ch * 8], alo + off, v);
        }
        for (int i = tid; i < MG_BN * (BK / 8); i += NT) {
            const int r = i / (BK / 8), ch = i % (BK / 8);
            const bool v = n0 + r < N;
            cp_async16(&Bs[stage][r * LD + ch * 8], Wb + (size_t)(v ? n0 + r : 0) * K + k0 + ch * 8, v);
        }
        cp_async_commit();
    };

    float acc[2][8][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 8; ni++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[mi][ni][j] = 0.f;

    const int nk = K / BK;
#pragma unroll
    for (int st = 0; st < NS - 1; st++) {
        if (st < nk) load(st, st * BK);
        else cp_async_commit();  // empty group: the wait counts stay uniform
    }
    for (int kt = 0; kt < nk; kt++) {
        const int s = kt % NS;
        cp_async_wait<NS - 2>();  // tile kt landed (this thread's copies) ...
        __syncthreads();          // ... and everyone's; stage (kt - 1) % NS is free
        if (kt + NS - 1 < nk) load((kt + NS - 1) % NS, (kt + NS - 1) * BK);
        else cp_async_commit();
        if (!active) continue;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned ah[2][4], al[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                const int row = wm * 32 + mi * 16 + (lane & 15), col = kk + (lane >> 4) * 8;
                ldmatrix_x4(ah[mi], &As[s][0][row * LD + col]);
                if constexpr (LO) ldmatrix_x4(al[mi], &As[s][1][row * LD + col]);
            }
#pragma unroll
            for (int np = 0; np < 4; np++) {  // n-tile pairs (2 np, 2 np + 1)
                unsigned b[4];
                const int n = wn * 64 + np * 16 + (lane & 7) + ((lane >> 4) << 3);
                ldmatrix_x4(b, &Bs[s][n * LD + kk + ((lane >> 3) & 1) * 8]);
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    mma_16816(acc[mi][2 * np], ah[mi], b[0], b[1]);
                    if constexpr (LO) mma_16816(acc[mi][2 * np], al[mi], b[0], b[1]);
                    mma_16816(acc[mi][2 * np + 1], ah[mi], b[2], b[3]);
                    if constexpr (LO) mma_16816(acc[mi][2 * np + 1], al[mi], b[2], b[3]);
                }
            }
        }
    }

    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 8; ni++) {
            const int col = n0 + wn * 64 + ni * 8 + 2 * c;
            if (col >= N) continue;  // N is even: col + 1 < N too
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = wm * 32 + mi * 16 + g + 8 * h;
                if (row < rows)
                    *(float2*)(Y + (size_t)(r0 + row) * N + col) =
                        make_float2(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
            }
        }
}

// The kernel for both precisions: split (alo) or hi alone (alo == nullptr).
template <int WM, int NS, int BK = MG_BK>
__device__ __forceinline__ void moe_gemm_mma(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                             const bf16_t* __restrict__ W, long long w_stride,
                                             const int* __restrict__ tiles, float* __restrict__ Y, int N, int K) {
    if (alo) moe_gemm_impl<WM, NS, BK, true>(ahi, alo, W, w_stride, tiles, Y, N, K);
    else moe_gemm_impl<WM, NS, BK, false>(ahi, alo, W, w_stride, tiles, Y, N, K);
}

QW_KERNEL void QW_BOUNDS(128) moe_gemm_split(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                             const bf16_t* __restrict__ W, long long w_stride,
                                             const int* __restrict__ tiles, float* __restrict__ Y, int N, int K) {
    moe_gemm_mma<2, 2>(ahi, alo, W, w_stride, tiles, Y, N, K);
}
// The 64-row tiles with k steps of 64 (K % 64 == 0; the default): with few
// rows per expert the GEMM streams the weights, and reading 128 bytes of each
// weight row per copy instead of 64 took the H200 from 29.1 to 21.2 ms per
// 512-token prompt (k steps of 128, one block per SM: 31.4).
QW_KERNEL void QW_BOUNDS(128) moe_gemm_split_k64(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                                 const bf16_t* __restrict__ W, long long w_stride,
                                                 const int* __restrict__ tiles, float* __restrict__ Y, int N, int K) {
    moe_gemm_mma<2, 2, 64>(ahi, alo, W, w_stride, tiles, Y, N, K);
}
// 128-row tiles for experts with many rows (long prompts): each weight tile
// staged once serves twice the rows.
QW_KERNEL void QW_BOUNDS(256) moe_gemm_split128(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                                const bf16_t* __restrict__ W, long long w_stride,
                                                const int* __restrict__ tiles, float* __restrict__ Y, int N, int K) {
    moe_gemm_mma<4, 2>(ahi, alo, W, w_stride, tiles, Y, N, K);
}
// The 128-row tiles on sm_90a's warpgroup MMA (moe_gemm_split128's contract):
// warpgroup h of the 256 threads multiplies rows 64h..64h+63 by the block's
// 128 or 256 columns, each k16 step as two wgmma (A hi, then A lo, same B), reading the
// operands from shared memory. A stage holds A hi, A lo and B as 128 rows of
// MG_BK = 32 bf16 (64 bytes) in the 64-byte swizzle (wg_desc_sw64): a copy's
// 8 lanes fill two whole rows (coalesced reads, no bank conflicts) and the
// tensor cores read them without conflicts. Elsewhere (the sm_80 PTX a newer
// GPU would compile) the mma.sync kernel runs instead; the host picks this
// kernel on compute capability 9.x only.
//
// Without LO (alo == nullptr, `--prefill-precision bf16`) a stage holds A hi
// and B only, each k16 step is one wgmma, and MG_WG_STAGES1 stages copy
// further ahead in about the same shared memory (a step's products take half
// as long, so the copies need more steps to land).
#define MG_WG_STAGES 4
#define MG_WG_STAGES1 8
#if defined(QW_WGMMA) || defined(QW_CPU)
// BNW columns per block (128 or 256: the accumulators are BNW / 2 per thread).
template <int BNW, bool LO>
__device__ __forceinline__ void moe_gemm_wg_impl(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                                 const bf16_t* __restrict__ W, long long w_stride,
                                                 const int* __restrict__ tiles, float* __restrict__ Y, int N, int K) {
    constexpr int AR = LO ? 256 : 128;                               // A rows of a stage: hi (and lo)
    constexpr int NS = LO ? MG_WG_STAGES : MG_WG_STAGES1, STAGE = (AR + BNW) * MG_BK;  // bf16
    __align__(1024) QW_DYN_SMEM(bf16_t, wg_smem);  // [stage][hi 128, (LO) lo 128, B BNW][MG_BK]
    if ((int)blockIdx.y >= tiles[0]) return;  // past the plan's tiles (the grid is their upper bound)
    const int e = tiles[1 + 3 * blockIdx.y], r0 = tiles[2 + 3 * blockIdx.y], rows = tiles[3 + 3 * blockIdx.y];
    const int n0 = blockIdx.x * BNW;
    const bf16_t* Wb = W + (size_t)e * w_stride;
    const int tid = threadIdx.x, h = tid / 128;
    const bool active = 64 * h < rows;  // warpgroup-uniform

    // Four lanes copy a row's four 16-byte chunks, to their swizzled places.
    auto load = [&](int stage, int k0) {
        for (int i = tid; i < (AR + BNW) * 4; i += 256) {
            const int r = i / 4, c = i % 4;  // row of the stage: A hi, (LO) A lo, then B
            bf16_t* dst = wg_smem + stage * STAGE + r * MG_BK + ((c ^ ((r >> 1) & 3)) * 8);
            if (r < AR) {
                const int ra = r % 128;
                const bool v = ra < rows;
                cp_async16(dst, (r < 128 ? ahi : alo) + (size_t)(r0 + (v ? ra : 0)) * K + k0 + 8 * c, v);
            } else {
                const int n = n0 + r - AR;
                const bool v = n < N;
                cp_async16(dst, Wb + (size_t)(v ? n : 0) * K + k0 + 8 * c, v);
            }
        }
        cp_async_commit();
    };

    float acc[BNW / 2];
#pragma unroll
    for (int i = 0; i < BNW / 2; i++) acc[i] = 0.f;
    // Tiles are copied NS - 2 steps ahead and one step's products stay in
    // flight while the next step waits, copies and issues: the stage a copy
    // overwrites was read by the products of two steps back, finished by then.
    const int nk = K / MG_BK;
#pragma unroll
    for (int st = 0; st < NS - 2; st++) {
        if (st < nk) load(st, st * MG_BK);
        else cp_async_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        const int s = kt % NS;
        cp_async_wait<NS - 3>();  // this thread's copies of tile kt landed ...
        fence_proxy_async();      // ... visible to the tensor cores' reads ...
        __syncthreads();          // ... and everyone's; every warpgroup's products of step kt - 2 are done
        if (kt + NS - 2 < nk) load((kt + NS - 2) % NS, (kt + NS - 2) * MG_BK);
        else cp_async_commit();
        if (!active) continue;
        const bf16_t* st = wg_smem + s * STAGE;
        wgmma_fence();
        wgmma_fence_operands(acc, BNW / 2);
#pragma unroll
        for (int kc = 0; kc < MG_BK / 16; kc++) {  // 8-row groups 512 bytes apart
            const unsigned long long db = wg_desc_sw64(st + AR * MG_BK + 16 * kc, 512);
            const unsigned long long dh = wg_desc_sw64(st + 64 * h * MG_BK + 16 * kc, 512);
            [[maybe_unused]] const unsigned long long dl = wg_desc_sw64(st + (128 + 64 * h) * MG_BK + 16 * kc, 512);
            if constexpr (BNW == 128) {
                wgmma_m64n128k16(acc, dh, db);
                if constexpr (LO) wgmma_m64n128k16(acc, dl, db);
            } else {
                wgmma_m64n256k16(acc, dh, db);
                if constexpr (LO) wgmma_m64n256k16(acc, dl, db);
            }
        }
        wgmma_commit();
        wgmma_wait1();
    }
    wgmma_wait0();
    wgmma_fence_operands(acc, BNW / 2);

    const int t = tid % 128, w = t / 32, g = (t % 32) / 4, c = t % 4;
#pragma unroll
    for (int j = 0; j < BNW / 8; j++) {
        const int col = n0 + 8 * j + 2 * c;
        if (col >= N) continue;  // N is even: col + 1 < N too
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int row = 64 * h + 16 * w + g + 8 * hh;
            if (row < rows)
                *(float2*)(Y + (size_t)(r0 + row) * N + col) = make_float2(acc[4 * j + 2 * hh], acc[4 * j + 2 * hh + 1]);
        }
    }
}
#endif

QW_KERNEL void QW_BOUNDS(256) moe_gemm_split128_wg(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                                   const bf16_t* __restrict__ W, long long w_stride,
                                                   const int* __restrict__ tiles, float* __restrict__ Y, int N,
                                                   int K) {
#if defined(QW_WGMMA) || defined(QW_CPU)
    if (alo) moe_gemm_wg_impl<128, true>(ahi, alo, W, w_stride, tiles, Y, N, K);
    else moe_gemm_wg_impl<128, false>(ahi, alo, W, w_stride, tiles, Y, N, K);
#else
    moe_gemm_mma<4, 2>(ahi, alo, W, w_stride, tiles, Y, N, K);
#endif
}
// 256 columns per block (grid ceil(N / 256)): each activation tile staged once
// serves twice the columns. Its sm_80 stand-in covers only 128 columns, so the
// host launches it on 9.x only.
QW_KERNEL void QW_BOUNDS(256) moe_gemm_split128_wg256(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                                      const bf16_t* __restrict__ W, long long w_stride,
                                                      const int* __restrict__ tiles, float* __restrict__ Y, int N,
                                                      int K) {
#if defined(QW_WGMMA) || defined(QW_CPU)
    if (alo) moe_gemm_wg_impl<256, true>(ahi, alo, W, w_stride, tiles, Y, N, K);
    else moe_gemm_wg_impl<256, false>(ahi, alo, W, w_stride, tiles, Y, N, K);
#else
    __trap();
#endif
}
#else
// No mma.sync on HIP: the same contract in plain FMAs (the HIP host keeps the
// per-expert hipBLAS path; this keeps the module's kernel list identical).
__device__ __forceinline__ void moe_gemm_fma(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                             const bf16_t* __restrict__ W, long long w_stride,
                                             const int* __restrict__ tiles, float* __restrict__ Y, int N, int K) {
    if ((int)blockIdx.y >= tiles[0]) return;  // past the plan's tiles (the grid is their upper bound)
    const int e = tiles[1 + 3 * blockIdx.y], r0 = tiles[2 + 3 * blockIdx.y], rows = tiles[3 + 3 * blockIdx.y];
    const bf16_t* Wb = W + (size_t)e * w_stride;
    for (int i = threadIdx.x; i < rows * MG_BN; i += blockDim.x) {
        const int r = i / MG_BN, n = blockIdx.x * MG_BN + i % MG_BN;
        if (n >= N) continue;
        const size_t a = (size_t)(r0 + r) * K;
        float acc = 0.f;
        for (int k = 0; k < K; k++)
            acc = fmaf(bf2f(ahi[a + k]) + (alo ? bf2f(alo[a + k]) : 0.f), bf2f(Wb[(size_t)n * K + k]), acc);
        Y[(size_t)(r0 + r) * N + n] = acc;
    }
}
QW_KERNEL void QW_BOUNDS(128) moe_gemm_split(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                             const bf16_t* __restrict__ W, long long w_stride,
                                             const int* __restrict__ tiles, float* __restrict__ Y, int N, int K) {
    moe_gemm_fma(ahi, alo, W, w_stride, tiles, Y, N, K);
}
QW_KERNEL void QW_BOUNDS(128) moe_gemm_split_k64(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                                 const bf16_t* __restrict__ W, long long w_stride,
                                                 const int* __restrict__ tiles, float* __restrict__ Y, int N, int K) {
    moe_gemm_fma(ahi, alo, W, w_stride, tiles, Y, N, K);
}
QW_KERNEL void QW_BOUNDS(256) moe_gemm_split128(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                                const bf16_t* __restrict__ W, long long w_stride,
                                                const int* __restrict__ tiles, float* __restrict__ Y, int N, int K) {
    moe_gemm_fma(ahi, alo, W, w_stride, tiles, Y, N, K);
}
QW_KERNEL void QW_BOUNDS(256) moe_gemm_split128_wg(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                                   const bf16_t* __restrict__ W, long long w_stride,
                                                   const int* __restrict__ tiles, float* __restrict__ Y, int N,
                                                   int K) {
    moe_gemm_fma(ahi, alo, W, w_stride, tiles, Y, N, K);
}
QW_KERNEL void QW_BOUNDS(256) moe_gemm_split128_wg256(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                                      const bf16_t* __restrict__ W, long long w_stride,
                                                      const int* __restrict__ tiles, float* __restrict__ Y, int N,
                                                      int K) {
    moe_gemm_fma(ahi, alo, W, w_stride, tiles, Y, N, K);
}
#endif
