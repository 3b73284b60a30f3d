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
//
// The *_fp8 kernels take block-FP8 experts as stored (docs/FP8.md): E4M3
// bytes Q_e = Q + e N K with one f32 scale per 128 x 128 block, S_e = S + e
// (N / 128) (K / 128) (N and K multiples of 128; the host checks). The stages
// hold the E4M3 bytes (half the bf16 tile's copies), and each k step converts
// its tile into a bf16 one (kernels/fp8.h: the values fp8_dequant writes)
// before the same products, so their outputs are bit-identical to the bf16
// kernels' on the dequantized experts, without a dequantized copy of the
// layer's experts in memory (1.6 GB written and read again per layer before).
// A block's 128 (or 256) columns and a k step (32 or 64 <= 128) lie in one
// scale block (two for 256 columns).
#include "fp8.h"
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
// F8: W is E4M3 bytes with scales Sc (w_stride unused); the stages hold
// [MG_BN][BK] bytes of them, and each k step converts its stage into one
// bf16 tile [MG_BN][LD] after the A tiles' NS stages and the byte stages.
template <int WM, int NS, int BK = MG_BK, bool LO = true, bool F8 = false>
__device__ __forceinline__ void moe_gemm_impl(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                              const void* __restrict__ W, const float* __restrict__ Sc,
                                              long long w_stride, const int* __restrict__ tiles,
                                              float* __restrict__ Y, int N, int K) {
    constexpr int MG_BM = 32 * WM, NT = 64 * WM, LD = BK + 8;  // LD: conflict-free ldmatrix rows
    __align__(16) QW_DYN_SMEM(bf16_t, mg_smem);
    typedef bf16_t ATile[2][MG_BM * LD];
    typedef bf16_t BTile[MG_BN * LD];
    ATile* As = (ATile*)mg_smem;                      // [stage][hi, lo]
    BTile* Bs = (BTile*)(mg_smem + NS * 2 * MG_BM * LD);  // [stage]
    unsigned char* Bq = (unsigned char*)Bs;               // F8: [stage][MG_BN * BK] E4M3 bytes
    bf16_t* Bc = (bf16_t*)(Bq + NS * MG_BN * BK);         // F8: the converted tile
    if ((int)blockIdx.y >= tiles[0]) return;  // past the plan's tiles (the grid is their upper bound)
    const int e = tiles[1 + 3 * blockIdx.y], r0 = tiles[2 + 3 * blockIdx.y], rows = tiles[3 + 3 * blockIdx.y];
    const int n0 = blockIdx.x * MG_BN;
    const bf16_t* Wb = (const bf16_t*)W + (size_t)e * w_stride;
    const unsigned char* Qb = (const unsigned char*)W + (size_t)e * N * K;
    // F8: this block's scales along k (its columns lie in one 128-row block).
    const float* Sb = Sc + ((size_t)e * (N >> 7) + (n0 >> 7)) * (K >> 7);
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
        if constexpr (F8) {
            for (int i = tid; i < MG_BN * (BK / 16); i += NT) {
                const int r = i / (BK / 16), ch = i % (BK / 16);
                const bool v = n0 + r < N;
                cp_async16(Bq + stage * MG_BN * BK + r * BK + ch * 16, Qb + (size_t)(v ? n0 + r : 0) * K + k0 + ch * 16,
                           v);
            }
        } else {
            for (int i = tid; i < MG_BN * (BK / 8); i += NT) {
                const int r = i / (BK / 8), ch = i % (BK / 8);
                const bool v = n0 + r < N;
                cp_async16(&Bs[stage][r * LD + ch * 8], Wb + (size_t)(v ? n0 + r : 0) * K + k0 + ch * 8, v);
            }
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
    [[maybe_unused]] float sc_next = F8 ? Sb[0] : 0.f;
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
        if constexpr (F8) {
            // Every thread converts (the inactive warps too); the barrier
            // above also means the products of step kt - 1 read Bc already.
            // The next step's scale is loaded now, under this step's products.
            const float sc = sc_next;
            if (kt + 1 < nk) sc_next = Sb[((kt + 1) * BK) >> 7];
            const unsigned char* q = Bq + s * MG_BN * BK;
            for (int i = tid; i < MG_BN * (BK / 8); i += NT) {
                const int r = i / (BK / 8), ch = i % (BK / 8);
                *(uint4*)&Bc[r * LD + ch * 8] = fp8x8_bf16(*(const uint2*)(q + r * BK + ch * 8), sc);
            }
            __syncthreads();
        }
        const bf16_t* Bt = F8 ? Bc : Bs[s];
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
                ldmatrix_x4(b, &Bt[n * LD + kk + ((lane >> 3) & 1) * 8]);
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
    if (alo) moe_gemm_impl<WM, NS, BK, true>(ahi, alo, W, nullptr, w_stride, tiles, Y, N, K);
    else moe_gemm_impl<WM, NS, BK, false>(ahi, alo, W, nullptr, w_stride, tiles, Y, N, K);
}
// The same on block-FP8 experts.
template <int WM, int NS, int BK = MG_BK>
__device__ __forceinline__ void moe_gemm_mma_fp8(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                                 const unsigned char* __restrict__ Q, const float* __restrict__ Sc,
                                                 const int* __restrict__ tiles, float* __restrict__ Y, int N, int K) {
    if (alo) moe_gemm_impl<WM, NS, BK, true, true>(ahi, alo, Q, Sc, 0, tiles, Y, N, K);
    else moe_gemm_impl<WM, NS, BK, false, true>(ahi, alo, Q, Sc, 0, tiles, Y, N, K);
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
// moe_gemm_split, _k64 and 128 on block-FP8 experts (MG_STAGES (2 BM LD bf16
// + MG_BN BK bytes) + MG_BN LD bf16 of shared memory).
#define MG_FP8(NAME, THREADS, WM, NS, BK)                                                                      \
    QW_KERNEL void QW_BOUNDS(THREADS)                                                                          \
        NAME(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo, const unsigned char* __restrict__ Q, \
             const float* __restrict__ Sc, const int* __restrict__ tiles, float* __restrict__ Y, int N, int K) {    \
        moe_gemm_mma_fp8<WM, NS, BK>(ahi, alo, Q, Sc, tiles, Y, N, K);                                         \
    }
MG_FP8(moe_gemm_split_fp8, 128, 2, 2, 32)
MG_FP8(moe_gemm_split_k64_fp8, 128, 2, 2, 64)
MG_FP8(moe_gemm_split128_fp8, 256, 4, 2, 32)
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
//
// F8 (the *_fp8 kernels): W is E4M3 bytes with scales Sc (w_stride unused).
// A stage holds B as BNW rows of MG_BK bytes (unswizzled, two copies a row),
// and each k step converts its stage into one of two bf16 B tiles after the
// stages, in the layout above: the products of step kt read tile kt % 2,
// which the conversion of step kt + 2 rewrites only after the barrier that
// follows every warpgroup's wait for the products of step kt.
template <int BNW, bool LO, bool F8 = false>
__device__ __forceinline__ void moe_gemm_wg_impl(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                                 const void* __restrict__ W, const float* __restrict__ Sc,
                                                 long long w_stride, const int* __restrict__ tiles,
                                                 float* __restrict__ Y, int N, int K) {
    constexpr int AR = LO ? 256 : 128;  // A rows of a stage: hi (and lo)
    constexpr int NS = LO ? MG_WG_STAGES : MG_WG_STAGES1;
    constexpr int STAGE = (AR + (F8 ? BNW / 2 : BNW)) * MG_BK;  // bf16: a multiple of 1 KB
    __align__(1024) QW_DYN_SMEM(bf16_t, wg_smem);  // [stage][hi 128, (LO) lo 128, B BNW][MG_BK]
    bf16_t* Bc = wg_smem + NS * STAGE;             // F8: [2][BNW][MG_BK], converted
    if ((int)blockIdx.y >= tiles[0]) return;  // past the plan's tiles (the grid is their upper bound)
    const int e = tiles[1 + 3 * blockIdx.y], r0 = tiles[2 + 3 * blockIdx.y], rows = tiles[3 + 3 * blockIdx.y];
    const int n0 = blockIdx.x * BNW;
    const bf16_t* Wb = (const bf16_t*)W + (size_t)e * w_stride;
    const unsigned char* Qb = (const unsigned char*)W + (size_t)e * N * K;
    // F8: the scales of the block's (first and second) 128 columns along k; a
    // second block past N reads the first's (its columns are zeros, never stored).
    const float* Sb0 = Sc + ((size_t)e * (N >> 7) + (n0 >> 7)) * (K >> 7);
    const float* Sb1 = n0 + 128 < N ? Sb0 + (K >> 7) : Sb0;
    const int tid = threadIdx.x, h = tid / 128;
    const bool active = 64 * h < rows;  // warpgroup-uniform

    // Four lanes copy a row's four 16-byte chunks, to their swizzled places.
    auto load = [&](int stage, int k0) {
        if constexpr (F8) {
            for (int i = tid; i < AR * 4 + BNW * 2; i += 256) {
                if (i < AR * 4) {
                    const int r = i / 4, c = i % 4, ra = r % 128;
                    const bool v = ra < rows;
                    cp_async16(wg_smem + stage * STAGE + r * MG_BK + ((c ^ ((r >> 1) & 3)) * 8),
                               (r < 128 ? ahi : alo) + (size_t)(r0 + (v ? ra : 0)) * K + k0 + 8 * c, v);
                } else {  // two lanes a B row's 32 bytes, in order
                    const int j = i - AR * 4, r = j / 2, c = j % 2, n = n0 + r;
                    const bool v = n < N;
                    cp_async16((unsigned char*)(wg_smem + stage * STAGE + AR * MG_BK) + r * MG_BK + 16 * c,
                               Qb + (size_t)(v ? n : 0) * K + k0 + 16 * c, v);
                }
            }
        } else {
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
    [[maybe_unused]] float s0_next = F8 ? Sb0[0] : 0.f, s1_next = F8 ? Sb1[0] : 0.f;
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
        [[maybe_unused]] const bf16_t* bt = nullptr;  // F8: the converted B tile
        if constexpr (F8) {
            // Every thread converts (the inactive warpgroup too): 8 bytes to
            // the 16 of their bf16 values, at their swizzled place.
            bt = Bc + (kt & 1) * BNW * MG_BK;
            // The next step's scales are loaded now, under this step's products.
            const float s0 = s0_next, s1 = s1_next;
            if (kt + 1 < nk) {
                s0_next = Sb0[((kt + 1) * MG_BK) >> 7];
                s1_next = Sb1[((kt + 1) * MG_BK) >> 7];
            }
            const unsigned char* q = (const unsigned char*)(wg_smem + s * STAGE + AR * MG_BK);
#pragma unroll
            for (int j = 0; j < BNW / 64; j++) {
                const int i = tid + 256 * j, r = i / 4, c = i % 4;
                *(uint4*)(Bc + (kt & 1) * BNW * MG_BK + r * MG_BK + ((c ^ ((r >> 1) & 3)) * 8)) =
                    fp8x8_bf16(*(const uint2*)(q + r * MG_BK + 8 * c), r < 128 ? s0 : s1);
            }
            fence_proxy_async();  // the generic stores visible to the tensor cores' reads
            __syncthreads();
        }
        if (!active) continue;
        const bf16_t* st = wg_smem + s * STAGE;
        if constexpr (!F8) bt = st + AR * MG_BK;
        wgmma_fence();
        wgmma_fence_operands(acc, BNW / 2);
#pragma unroll
        for (int kc = 0; kc < MG_BK / 16; kc++) {  // 8-row groups 512 bytes apart
            const unsigned long long db = wg_desc_sw64(bt + 16 * kc, 512);
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
    if (alo) moe_gemm_wg_impl<128, true>(ahi, alo, W, nullptr, w_stride, tiles, Y, N, K);
    else moe_gemm_wg_impl<128, false>(ahi, alo, W, nullptr, w_stride, tiles, Y, N, K);
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
    if (alo) moe_gemm_wg_impl<256, true>(ahi, alo, W, nullptr, w_stride, tiles, Y, N, K);
    else moe_gemm_wg_impl<256, false>(ahi, alo, W, nullptr, w_stride, tiles, Y, N, K);
#else
    __trap();
#endif
}
// The two on block-FP8 experts (their stages: A rows of MG_BK bf16 and B
// rows of MG_BK bytes; then two converted B tiles, BNW rows of MG_BK bf16).
QW_KERNEL void QW_BOUNDS(256) moe_gemm_split128_wg_fp8(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                                       const unsigned char* __restrict__ Q,
                                                       const float* __restrict__ Sc, const int* __restrict__ tiles,
                                                       float* __restrict__ Y, int N, int K) {
#if defined(QW_WGMMA) || defined(QW_CPU)
    if (alo) moe_gemm_wg_impl<128, true, true>(ahi, alo, Q, Sc, 0, tiles, Y, N, K);
    else moe_gemm_wg_impl<128, false, true>(ahi, alo, Q, Sc, 0, tiles, Y, N, K);
#else
    moe_gemm_mma_fp8<4, 2>(ahi, alo, Q, Sc, tiles, Y, N, K);
#endif
}
QW_KERNEL void QW_BOUNDS(256) moe_gemm_split128_wg256_fp8(const bf16_t* __restrict__ ahi,
                                                          const bf16_t* __restrict__ alo,
                                                          const unsigned char* __restrict__ Q,
                                                          const float* __restrict__ Sc, const int* __restrict__ tiles,
                                                          float* __restrict__ Y, int N, int K) {
#if defined(QW_WGMMA) || defined(QW_CPU)
    if (alo) moe_gemm_wg_impl<256, true, true>(ahi, alo, Q, Sc, 0, tiles, Y, N, K);
    else moe_gemm_wg_impl<256, false, true>(ahi, alo, Q, Sc, 0, tiles, Y, N, K);
#else
    __trap();
#endif
}

// FP8 activations on FP8 tensor cores (`--prefill-precision fp8`, sm_90a): the
// 128-row tiles of the warpgroup kernels, 128 columns a block, on E4M3 rows
// quantized per 128 columns (aq [rows][K] bytes, their scales ascale[kb * as_stride
// + row], kernels/fp8.cu fp8_quant_rows) and block-FP8 experts as stored (Q,
// Sc as the *_fp8 kernels take them). A stage holds 128 A rows and 128 B rows
// of MQ_BK = 64 bytes in the 64-byte swizzle (byte for byte the bf16
// kernels' stage rows), two k32 wgmma a stage. The products of each 128-deep
// scale block accumulate on their own (tmp) and are then added to acc times
// the row's and the column block's scales: the FP8 tensor cores keep fewer
// than f32's bits within a block, and each block has its own scales. Y[r][n]
// = sum_kb ascale[kb][r] Sc[n / 128][kb] sum_{k in kb} aq[r][k] Q[n][k].
#define MQ_BK 64
#define MQ_STAGES 8
#if defined(QW_WGMMA) || defined(QW_CPU)
__device__ __forceinline__ void moe_gemm_wg_q8_impl(const unsigned char* __restrict__ aq, const float* __restrict__ ascale,
                                                    int as_stride, const unsigned char* __restrict__ Q,
                                                    const float* __restrict__ Sc, const int* __restrict__ tiles,
                                                    float* __restrict__ Y, int N, int K) {
    constexpr int NS = MQ_STAGES, STAGE = 256 * MQ_BK;  // bytes: A 128 rows, then B 128 rows
    __align__(1024) QW_DYN_SMEM(unsigned char, q8_smem);
    if ((int)blockIdx.y >= tiles[0]) return;  // past the plan's tiles (the grid is their upper bound)
    const int e = tiles[1 + 3 * blockIdx.y], r0 = tiles[2 + 3 * blockIdx.y], rows = tiles[3 + 3 * blockIdx.y];
    const int n0 = blockIdx.x * 128;
    const unsigned char* Qb = Q + (size_t)e * N * K;
    const float* Sb = Sc + ((size_t)e * (N >> 7) + (n0 >> 7)) * (K >> 7);
    const int tid = threadIdx.x, h = tid / 128;
    // This thread's two accumulator rows (a row past the tile reads row 0's scale).
    const int t = tid % 128, w = t / 32, g = (t % 32) / 4, c = t % 4;
    const int ra = 64 * h + 16 * w + g, rb = ra + 8;
    const float* as0 = ascale + r0 + (ra < rows ? ra : 0);
    const float* as1 = ascale + r0 + (rb < rows ? rb : 0);

    auto load = [&](int stage, int k0) {
        for (int i = tid; i < 256 * 4; i += 256) {
            const int r = i / 4, ch = i % 4;
            unsigned char* dst = q8_smem + stage * STAGE + r * MQ_BK + ((ch ^ ((r >> 1) & 3)) * 16);
            if (r < 128) {
                const bool v = r < rows;
                cp_async16(dst, aq + (size_t)(r0 + (v ? r : 0)) * K + k0 + 16 * ch, v);
            } else {
                const int n = n0 + r - 128;
                const bool v = n < N;
                cp_async16(dst, Qb + (size_t)(v ? n : 0) * K + k0 + 16 * ch, v);
            }
        }
        cp_async_commit();
    };

    float acc[64], tmp[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.f;
    const int nk = K / MQ_BK;  // even: K is a multiple of 128
#pragma unroll
    for (int st = 0; st < NS - 2; st++) {
        if (st < nk) load(st, st * MQ_BK);
        else cp_async_commit();
    }
    // Step kt's tile landed and visible to the tensor cores, the copy of
    // step kt + NS - 2 issued (into the stage the products of step kt - 2
    // read: done, each block ends waiting for its products).
    auto next = [&](int kt) {
        cp_async_wait<NS - 3>();
        fence_proxy_async();
        __syncthreads();
        if (kt + NS - 2 < nk) load((kt + NS - 2) % NS, (kt + NS - 2) * MQ_BK);
        else cp_async_commit();
    };
    auto products = [&](int kt) {
        const unsigned char* st = q8_smem + (kt % NS) * STAGE;
        wgmma_fence();
        wgmma_fence_operands(tmp, 64);
#pragma unroll
        for (int kc = 0; kc < MQ_BK / 32; kc++) {  // 8-row groups 512 bytes apart
            const unsigned long long da = wg_desc_sw64(st + 64 * h * MQ_BK + 32 * kc, 512);
            const unsigned long long db = wg_desc_sw64(st + 128 * MQ_BK + 32 * kc, 512);
            wgmma_m64n128k32_e4m3(tmp, da, db);
        }
        wgmma_commit();
    };
    // One scale block (two stages) an iteration, in straight-line code: a
    // wgmma on a branch of its own makes ptxas serialise them all, so a
    // warpgroup whose rows lie past the tile multiplies its zero rows too
    // (never stored).
    for (int kb = 0; kb < nk / 2; kb++) {
        next(2 * kb);
        // The block's scales, read under its products.
        const float f0 = as0[(size_t)kb * as_stride] * Sb[kb], f1 = as1[(size_t)kb * as_stride] * Sb[kb];
#pragma unroll
        for (int i = 0; i < 64; i++) tmp[i] = 0.f;
        products(2 * kb);
        next(2 * kb + 1);
        products(2 * kb + 1);
        wgmma_wait0();
        wgmma_fence_operands(tmp, 64);
#pragma unroll
        for (int i = 0; i < 64; i++) acc[i] += tmp[i] * ((i & 2) ? f1 : f0);
    }
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int col = n0 + 8 * j + 2 * c;
        if (col >= N) continue;  // N is a multiple of 128
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int row = 64 * h + 16 * w + g + 8 * hh;
            if (row < rows)
                *(float2*)(Y + (size_t)(r0 + row) * N + col) = make_float2(acc[4 * j + 2 * hh], acc[4 * j + 2 * hh + 1]);
        }
    }
}
#endif
QW_KERNEL void QW_BOUNDS(256) moe_gemm_wg_q8(const unsigned char* __restrict__ aq, const float* __restrict__ ascale,
                                             int as_stride, const unsigned char* __restrict__ Q,
                                             const float* __restrict__ Sc, const int* __restrict__ tiles,
                                             float* __restrict__ Y, int N, int K) {
#if defined(QW_WGMMA) || defined(QW_CPU)
    moe_gemm_wg_q8_impl(aq, ascale, as_stride, Q, Sc, tiles, Y, N, K);
#else
    __trap();  // the host launches it on 9.x only
#endif
}
#else
// No mma.sync on HIP: the same contract in plain FMAs (the HIP host keeps the
// per-expert hipBLAS path; this keeps the module's kernel list identical).
// Q != nullptr: block-FP8 experts (Q, Sc as the *_fp8 kernels take them).
__device__ __forceinline__ void moe_gemm_fma(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo,
                                             const bf16_t* __restrict__ W, long long w_stride,
                                             const int* __restrict__ tiles, float* __restrict__ Y, int N, int K,
                                             const unsigned char* __restrict__ Q = nullptr,
                                             const float* __restrict__ Sc = nullptr) {
    if ((int)blockIdx.y >= tiles[0]) return;  // past the plan's tiles (the grid is their upper bound)
    const int e = tiles[1 + 3 * blockIdx.y], r0 = tiles[2 + 3 * blockIdx.y], rows = tiles[3 + 3 * blockIdx.y];
    const bf16_t* Wb = W + (size_t)e * w_stride;
    const unsigned char* Qb = Q + (size_t)e * N * K;
    const float* Se = Sc + (size_t)e * (N >> 7) * (K >> 7);
    for (int i = threadIdx.x; i < rows * MG_BN; i += blockDim.x) {
        const int r = i / MG_BN, n = blockIdx.x * MG_BN + i % MG_BN;
        if (n >= N) continue;
        const size_t a = (size_t)(r0 + r) * K;
        float acc = 0.f;
        for (int k = 0; k < K; k++) {
            const bf16_t w =
                Q ? fp8_bf16(Qb[(size_t)n * K + k], Se[(n >> 7) * (K >> 7) + (k >> 7)]) : Wb[(size_t)n * K + k];
            acc = fmaf(bf2f(ahi[a + k]) + (alo ? bf2f(alo[a + k]) : 0.f), bf2f(w), acc);
        }
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
#define MG_FP8(NAME, THREADS, WM, NS, BK)                                                                      \
    QW_KERNEL void QW_BOUNDS(THREADS)                                                                          \
        NAME(const bf16_t* __restrict__ ahi, const bf16_t* __restrict__ alo, const unsigned char* __restrict__ Q, \
             const float* __restrict__ Sc, const int* __restrict__ tiles, float* __restrict__ Y, int N, int K) {    \
        moe_gemm_fma(ahi, alo, nullptr, 0, tiles, Y, N, K, Q, Sc);                                             \
    }
MG_FP8(moe_gemm_split_fp8, 128, 2, 2, 32)
MG_FP8(moe_gemm_split_k64_fp8, 128, 2, 2, 64)
MG_FP8(moe_gemm_split128_fp8, 256, 4, 2, 32)
MG_FP8(moe_gemm_split128_wg_fp8, 256, 4, 2, 32)
MG_FP8(moe_gemm_split128_wg256_fp8, 256, 4, 2, 32)
QW_KERNEL void QW_BOUNDS(256) moe_gemm_wg_q8(const unsigned char* __restrict__ aq, const float* __restrict__ ascale,
                                             int as_stride, const unsigned char* __restrict__ Q,
                                             const float* __restrict__ Sc, const int* __restrict__ tiles,
                                             float* __restrict__ Y, int N, int K) {
    __builtin_trap();  // no FP8 tensor cores here; the host never launches it
}
#endif
