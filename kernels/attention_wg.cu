// Prefill attention on warpgroup MMA (sm_90a): `attn_flash_wg_{f32,bf16}_d{256,32}`
// compute what `attn_flash_tc_*` (kernels/attention.cu) compute, causal GQA
// attention over the KV cache with the sigmoid output gate, in the same split
// precision (every f32 operand as bf16 hi + lo, f32 accumulation):
//   S = Q K^T ~ Qh [Kh | Kl] + Ql Kh,  O += P V ~ Ph Vh + Pl Vh + Ph Vl.
// Qh [Kh | Kl] is one m64n64k16 product over the 32 keys' hi and lo rows side
// by side (its two 32-column halves are summed after), so each k16 step reads
// Qh from shared memory once for both terms. A bf16 cache is exact in its hi
// plane (Kl = Vl = 0): `_bf16` skips those terms (LO = false).
// `attn_flash_wg_single_*` (`--prefill-precision bf16`; QL = false, LO = false)
// takes one bf16 term of each operand: S = Qh Kh, O += Ph Vh, over the hi
// planes of either cache (no Q lo plane in shared memory).
//
// Rows as in attn_flash_tc: a block takes 128 consecutive (query, q head) pairs
// p = t * G + hg of one kv head; warpgroup h (threads 128h..) owns rows
// 64h..64h+63 and keeps its 64 x HD f32 output in registers (HD / 2 per
// thread). Keys in tiles of 32. S comes out in the m64n64 accumulator layout,
// which per warp is the mma.sync C layout, so (FlashAttention-2 style) two
// adjacent n8 tiles of P are the register A fragment of one k16 step of P V.
//
// Shared memory (bytes; every tile K-major in the 64-byte swizzle, `wg_desc_sw64`):
//   Q  [hi, lo][HD / 32 slabs][128 rows][64 B]   HD * 512 (single: hi, HD * 256)
//   K  [HD / 32 slabs][Kh keys 0..31, (LO) Kl keys 0..31][64 B]   HD * 128 (LO) or 64
//   Vt 2 x [hi, (LO) lo][HD rows (d)][64 B: 32 keys]   HD * 256 (LO) or 128
// (HD 256: 229,376 bytes, bf16 cache 180,224, single 114,688). P V needs V with the keys along
// k: `attn_kv_split_t` writes the f32 cache's values transposed, [nkv][HD][ldp]
// hi and lo planes (zeros from the last key to ldp), with the keys' hi / lo
// planes [pos][nkv][HD]; for a bf16 cache `attn_v_transpose_bf16` writes the
// values' plane and the keys are read from the cache. Per tile j the tensor
// cores take S of tile j + 1 and P V of tile j back to back, and the softmax of
// tile j + 1 runs while P V does (O is rescaled after it): one K buffer (tile
// j + 2 is copied once both warpgroups' S of j + 1 is done) and two V buffers
// (tile j + 1 is copied during tile j). Both warpgroups take every tile of
// the block (one past the last key of warpgroup 0's rows at most).
// grid (ceil(T * G / 128), nkv), the pair tiles with the most keys first;
// block 256. HD is compiled in (the model's 256; 32 for the test fixtures).
// The CPU harness runs this code on mma.h's emulated wgmma
// (tests/kernels_cpu/attn_tc_check.cpp).
#include "attn_tile.h"
#include "mma.h"

#define WG_BK 32     // keys per tile
#define WG_ROWS 128  // (query, q head) rows per block
#define WG_PLAN_HEAD 4  // attn_wg_plan's header: blocks, merges, segments, pieces
// Floats per piece of a split unit in `part` (attn_wg_segment's layout:
// [4 DT + 4][256 threads], O's fragments then m, l).
#define WG_PART_FLOATS(HD) ((4 * ((HD) / 8) + 4) * 256)

#if defined(QW_WGMMA) || defined(QW_CPU)

// Keys [k0, k0 + 32) of kv head kvh (zeros from kend) from the hi (and, LO,
// lo) planes [pos][nkv][HD] into the K tile, one commit group.
template <int HD, bool LO>
__device__ __forceinline__ void wg_load_k(unsigned char* Ks, const bf16_t* __restrict__ kh,
                                          const bf16_t* __restrict__ kl, int k0, int kend, int nkv, int kvh) {
    // A thread copies one 16-byte chunk column ch of every (256 / CPR)-th row:
    // its addresses are a base plus constant steps (few registers: the loads
    // are issued while every accumulator is in flight).
    constexpr int CPR = HD / 8, ROWS = (LO ? 2 : 1) * WG_BK;  // 16-byte chunks per key; rows per slab
    const int ch = threadIdx.x % CPR;
    unsigned char* dst = Ks + (ch >> 2) * (ROWS * 64);
#pragma unroll
    for (int n = threadIdx.x / CPR; n < ROWS; n += 256 / CPR) {  // n < 32: Kh, else Kl
        const int key = k0 + (n & (WG_BK - 1));
        const bool ok = key < kend;
        const bf16_t* src = (n < WG_BK ? kh : kl) + ((size_t)(ok ? key : 0) * nkv + kvh) * HD + 8 * ch;
        cp_async16(dst + sw64_off(n, ch & 3), src, ok);
    }
    cp_async_commit();
}

// Keys [k0, k0 + 32) of the transposed value planes [nkv][HD][ldp] into the Vt
// tile (the planes are zero past the last key up to ldp), one commit group.
template <int HD, bool LO>
__device__ __forceinline__ void wg_load_v(unsigned char* Vs, const bf16_t* __restrict__ vth,
                                          const bf16_t* __restrict__ vtl, int k0, int ldp, int kvh) {
    const int c = threadIdx.x & 3;  // chunk c of rows d = threadIdx.x / 4 + 64i
#pragma unroll
    for (int hl = 0; hl < (LO ? 2 : 1); hl++) {
        const bf16_t* src = (hl ? vtl : vth) + (size_t)kvh * HD * ldp + k0 + 8 * c;
#pragma unroll
        for (int d = threadIdx.x >> 2; d < HD; d += 64)
            cp_async16(Vs + hl * HD * 64 + sw64_off(d, c), src + (size_t)d * ldp, true);
    }
    cp_async_commit();
}

// S of one tile for this warpgroup's 64 rows, issued (one commit group, not
// waited for): sa = Qh [Kh | Kl] (64 columns; without LO Qh Kh, 32), sb = Ql Kh
// (QL; zero without).
template <int HD, bool LO, bool QL>
__device__ __forceinline__ void wg_issue_scores(float (&sa)[32], float (&sb)[16], const unsigned char* Qs,
                                                const unsigned char* Ks, int h) {
    constexpr int SLABS = HD / 32, QSLAB = WG_ROWS * 64, QPLANE = SLABS * QSLAB, KSLAB = (LO ? 2 : 1) * WG_BK * 64;
    (void)QPLANE;
#pragma unroll
    for (int i = 0; i < 32; i++) sa[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++) sb[i] = 0.f;
    wgmma_fence();
    wgmma_fence_operands(sa, 32);
    wgmma_fence_operands(sb, 16);
#pragma unroll
    for (int sl8 = 0; sl8 < SLABS; sl8++)
#pragma unroll
        for (int kc = 0; kc < 2; kc++) {  // k16 steps start 32 bytes into the 64-byte rows
            const unsigned qo = sl8 * QSLAB + 64 * 64 * h + 32 * kc;
            const unsigned long long dk = wg_desc_sw64(Ks + sl8 * KSLAB + 32 * kc, 512);
            if constexpr (LO) wgmma_m64n64k16(sa, wg_desc_sw64(Qs + qo, 512), dk);
            else wgmma_m64n32k16(sa, wg_desc_sw64(Qs + qo, 512), dk);
            if constexpr (QL) wgmma_m64n32k16(sb, wg_desc_sw64(Qs + QPLANE + qo, 512), dk);
        }
    wgmma_commit();
}

// O += P V of one tile, issued (one commit group, not waited for): k16 step kk
// takes the S tiles 2kk, 2kk + 1 as its A fragment (ph, pl: P's hi / lo; pl
// unused without QL).
template <int HD, bool LO, bool QL>
__device__ __forceinline__ void wg_issue_pv(float* o, unsigned (&ph)[2][4], unsigned (&pl)[2][4],
                                            const unsigned char* Vs) {
    wgmma_fence();
    wgmma_fence_operands(o, HD / 2);
#pragma unroll
    for (int kk = 0; kk < 2; kk++) {
        const unsigned long long dvh = wg_desc_sw64(Vs + 32 * kk, 512);
        const unsigned long long dvl = wg_desc_sw64(Vs + HD * 64 + 32 * kk, 512);
        if constexpr (HD == 256) {
            wgmma_m64n256k16_rs(o, ph[kk], dvh);
            if constexpr (QL) wgmma_m64n256k16_rs(o, pl[kk], dvh);
            if constexpr (LO) wgmma_m64n256k16_rs(o, ph[kk], dvl);
        } else {
            wgmma_m64n32k16_rs(o, ph[kk], dvh);
            if constexpr (QL) wgmma_m64n32k16_rs(o, pl[kk], dvh);
            if constexpr (LO) wgmma_m64n32k16_rs(o, ph[kk], dvl);
        }
    }
    wgmma_commit();
}

// One segment of a block's work: the 128 rows from pair p0 of kv head kvh over
// key tiles [ja, jb) (every key of tile ja visible to every row: ja = 0, or
// below the block's first query). part == nullptr: [ja, jb) is all of the
// rows' keys and the gated output is stored; else the unnormalised O and this
// thread's m, l go to `part` (attn_wg_merge combines the pieces).
template <int HD, bool LO, bool QL>
__device__ __forceinline__ void attn_wg_segment(const float* __restrict__ q, const bf16_t* __restrict__ kh,
                                                const bf16_t* __restrict__ kl, const bf16_t* __restrict__ vth,
                                                const bf16_t* __restrict__ vtl, int ldp,
                                                const float* __restrict__ proj, int stride,
                                                float* __restrict__ out, int T, int nh, int nkv, int pos0,
                                                float scale, int kvh, int p0, int ja, int jb,
                                                float* __restrict__ part) {
    constexpr int SLABS = HD / 32, QSLAB = WG_ROWS * 64, QPLANE = SLABS * QSLAB, KSLAB = (LO ? 2 : 1) * WG_BK * 64;
    constexpr int VTILE = (LO ? 2 : 1) * HD * 64;
    constexpr int DT = HD / 8;  // n8 tiles of O
    __align__(1024) QW_DYN_SMEM(unsigned char, wg_attn_smem);
    unsigned char* Qs = wg_attn_smem;          // [hi, lo][slab][row][64 B]
    unsigned char* Ks = Qs + (QL ? 2 : 1) * QPLANE;  // [slab][Kh, Kl rows][64 B]
    unsigned char* Vs = Ks + SLABS * KSLAB;    // 2 x [hi, lo][d][64 B]: tile jt in Vs + (jt & 1) * VTILE

    const int G = nh / nkv, npairs = T * G;
    const int plast = min(npairs, p0 + WG_ROWS) - 1;
    const int kend = pos0 + plast / G + 1;  // keys [0, kend) cover every row of the block
    const int ntiles = jb;                  // tiles [ja, jb) of this segment

    wg_load_k<HD, LO>(Ks, kh, kl, ja * WG_BK, kend, nkv, kvh);

    // Q rows of the block, split into hi / lo (rows past the last pair are
    // zero; without QL the lo plane is not stored).
    for (int e = threadIdx.x; e < WG_ROWS * (HD / 8); e += 256) {
        const int r = e / (HD / 8), ch = e - r * (HD / 8);
        const int p = p0 + r;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
        if (p < npairs) {
            const int t = p / G, head = kvh * G + (p - t * G);
            const float* src = q + ((size_t)t * nh + head) * HD + 8 * ch;
            a = *(const float4*)src;
            b = *(const float4*)(src + 4);
        }
        uint4 hi, lo;
        split_bf16x2(a.x, a.y, hi.x, lo.x);
        split_bf16x2(a.z, a.w, hi.y, lo.y);
        split_bf16x2(b.x, b.y, hi.z, lo.z);
        split_bf16x2(b.z, b.w, hi.w, lo.w);
        const unsigned off = (ch >> 2) * QSLAB + sw64_off(r, ch & 3);
        *(uint4*)(Qs + off) = hi;
        if constexpr (QL) *(uint4*)(Qs + QPLANE + off) = lo;
    }
    wg_load_v<HD, LO>(Vs + (ja & 1) * VTILE, vth, vtl, ja * WG_BK, ldp, kvh);

    const int h = threadIdx.x / 128, w = threadIdx.x % 128 / WARP, lane = threadIdx.x % WARP;
    const int g = lane >> 2, c = lane & 3;
    // This thread's two rows (g, g + 8 of its warp's 16): the last key each may
    // see (and not past the segment: its "next tile" at jb is masked too).
    const int pa = p0 + 64 * h + 16 * w + g, pb = pa + 8;
    const int kseg = jb * WG_BK - 1;
    const int last_a = min(pos0 + min(pa, npairs - 1) / G, kseg);
    const int last_b = min(pos0 + min(pb, npairs - 1) / G, kseg);
    // Pairs are in query order: a warp's first row sees the fewest keys.
    const int warp_last = min(pos0 + min(p0 + 64 * h + 16 * w, npairs - 1) / G, kseg);

    float o[DT][4];  // the m64nHD accumulator: o[j][e] = O[16w + g + 8(e / 2)][8j + 2c + e % 2]
#pragma unroll
    for (int j = 0; j < DT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[j][e] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const float sl = scale * 1.4426950408889634f;  // scores in log2 units
    float sa[32], sb[16];
    unsigned ph[2][4], pl[2][4];  // P of the tile whose P V is next, hi / lo

    // The finished S of the tile at k0 (sa, sb) as softmax weights: the
    // running maxima and sums move on, corr is what O must be scaled by, and
    // the weights are left in s.
    auto weights = [&](float (&s)[4][4], int k0, float (&corr)[2]) {
        const bool diag = k0 + WG_BK - 1 > warp_last;  // some key of the tile is masked for some row
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = (sa[4 * j + e] + ((QL ? sb[4 * j + e] : 0.f) + (LO ? sa[16 + 4 * j + e] : 0.f))) * sl;
                if (diag && k0 + 8 * j + 2 * c + (e & 1) > (e < 2 ? last_a : last_b)) v = -INFINITY;
                s[j][e] = v;
            }
        attn_softmax_weights(s, m, l, corr);
    };
    // P (the weights s) as the A fragments of P V: k16 step kk is the S tiles
    // 2kk, 2kk + 1 (without QL rounded to bf16, no lo terms).
    auto split_p = [&](const float (&s)[4][4]) {
        if constexpr (!QL) {
#pragma unroll
            for (int kk = 0; kk < 2; kk++) {
                ph[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
                ph[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
                ph[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                ph[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            }
            return;
        }
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            split_bf16x2(s[2 * kk][0], s[2 * kk][1], ph[kk][0], pl[kk][0]);          // row g,     keys 16kk + 2c
            split_bf16x2(s[2 * kk][2], s[2 * kk][3], ph[kk][1], pl[kk][1]);          // row g + 8
            split_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1], ph[kk][2], pl[kk][2]);  // row g,     keys 16kk + 8 + 2c
            split_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3], ph[kk][3], pl[kk][3]);  // row g + 8
        }
    };

    // Tile ja's S and softmax (O is still zero: nothing to rescale). Every
    // warpgroup takes tile ja: its keys are visible to every row.
    cp_async_wait<1>();
    fence_proxy_async();  // this thread's K copies and Q stores visible to the tensor cores ...
    __syncthreads();      // ... everyone's
    {
        wg_issue_scores<HD, LO, QL>(sa, sb, Qs, Ks, h);
        wgmma_wait0();
        wgmma_fence_operands(sa, 32);
        wgmma_fence_operands(sb, 16);
        float s[4][4], corr[2];
        weights(s, ja * WG_BK, corr);
        split_p(s);
    }
    __syncthreads();  // every warpgroup is done with K tile ja
    if (ja + 1 < ntiles) wg_load_k<HD, LO>(Ks, kh, kl, (ja + 1) * WG_BK, kend, nkv, kvh);

    // Tile jt: S of tile jt + 1 and P V of tile jt go to the tensor cores
    // together; the softmax of tile jt + 1 runs while P V does, and O is
    // rescaled once P V is done. V is double-buffered (tile jt + 1 is copied
    // during tile jt), K single: tile jt + 2 is copied from when both
    // warpgroups' S of tile jt + 1 is done.
    for (int jt = ja; jt < ntiles; jt++) {
        const int k1 = (jt + 1) * WG_BK;
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();  // V tile jt and K tile jt + 1 landed; every warpgroup is done with V tile jt - 1
        // Every product and softmax step is unconditional (ptxas serializes
        // wgmma whose issue and wait sit in separate branches). Where a tile
        // is past all of a warpgroup's rows, and on the last tile's "next"
        // (the K buffer still holds tile jt, but the scores are masked by
        // tile jt + 1's positions, all past kend), every score is masked:
        // the weights are 0 and corr 1, so m, l and O stay exactly as they are.
        wg_issue_scores<HD, LO, QL>(sa, sb, Qs, Ks, h);
        wg_issue_pv<HD, LO, QL>(&o[0][0], ph, pl, Vs + (jt & 1) * VTILE);
        // V tile jt + 1 into the other buffer (P V of tile jt - 1 is done with it).
        if (jt + 1 < ntiles) wg_load_v<HD, LO>(Vs + ((jt + 1) & 1) * VTILE, vth, vtl, k1, ldp, kvh);
        wgmma_wait1();  // S (the older group) done, P V may still run
        wgmma_fence_operands(sa, 32);
        wgmma_fence_operands(sb, 16);
        __syncthreads();  // every warpgroup is done with K tile jt + 1
        if (jt + 2 < ntiles) wg_load_k<HD, LO>(Ks, kh, kl, k1 + WG_BK, kend, nkv, kvh);
        float s[4][4], corr[2];
        weights(s, k1, corr);
        wgmma_wait0();
        wgmma_fence_operands(&o[0][0], HD / 2);
        // The A fragments had to stay in their registers until the products were done.
        wgmma_fence_operands(&ph[0][0], 8);
        if constexpr (QL) wgmma_fence_operands(&pl[0][0], 8);
        attn_rescale<DT>(o, corr, HD);
        split_p(s);
    }

    if (!part) {
        attn_store_gated<DT>(o, l, pa, pb, npairs, G, kvh, nh, HD, proj, stride, out, c);
        return;
    }
#pragma unroll
    for (int j = 0; j < DT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) part[(4 * j + e) * 256 + threadIdx.x] = o[j][e];
    part[(4 * DT) * 256 + threadIdx.x] = m[0];
    part[(4 * DT + 1) * 256 + threadIdx.x] = m[1];
    part[(4 * DT + 2) * 256 + threadIdx.x] = l[0];
    part[(4 * DT + 3) * 256 + threadIdx.x] = l[1];
}

// Without a plan: block (x, y) is the 128 rows of kv head y, the pair tiles
// with the most keys first, all their keys. With a plan (attn_wg_plan): block
// x runs its segments (its slice of all units' key tiles, stream-K: every
// multiprocessor busy however many row blocks there are).
template <int HD, bool LO, bool QL>
__device__ __forceinline__ void attn_flash_wg_impl(const float* __restrict__ q, const bf16_t* __restrict__ kh,
                                                   const bf16_t* __restrict__ kl, const bf16_t* __restrict__ vth,
                                                   const bf16_t* __restrict__ vtl, int ldp,
                                                   const float* __restrict__ proj, int stride,
                                                   float* __restrict__ out, int T, int nh, int nkv, int pos0,
                                                   float scale, const int* __restrict__ plan,
                                                   float* __restrict__ part) {
    const int G = nh / nkv;
    if (!plan) {
        const int p0 = ((int)gridDim.x - 1 - (int)blockIdx.x) * WG_ROWS;  // most keys first
        const int kend = pos0 + (min(T * G, p0 + WG_ROWS) - 1) / G + 1;
        attn_wg_segment<HD, LO, QL>(q, kh, kl, vth, vtl, ldp, proj, stride, out, T, nh, nkv, pos0, scale,
                                    (int)blockIdx.y, p0, 0, (kend + WG_BK - 1) / WG_BK, nullptr);
        return;
    }
    const int nb = (T * G + WG_ROWS - 1) / WG_ROWS, ctas = plan[0];
    const int* seg = plan + WG_PLAN_HEAD + ctas + 1;
    // Last segment first: a block's range is the tail of one unit, then the
    // head of the next (or whole units), so this way every block starts at
    // key 0 and all walk the keys nearly in step: the K / V tiles come from
    // L2 for the blocks of one kv head (in range order they would be spread
    // over the keys, each streaming its own from DRAM: #6 took 226.5 ms, not 201).
    for (int i = plan[WG_PLAN_HEAD + blockIdx.x + 1] - 1; i >= plan[WG_PLAN_HEAD + blockIdx.x]; i--) {
        const int u = seg[4 * i], slot = seg[4 * i + 3];
        __syncthreads();  // the previous segment is done with the shared memory
        attn_wg_segment<HD, LO, QL>(q, kh, kl, vth, vtl, ldp, proj, stride, out, T, nh, nkv, pos0, scale, u / nb,
                                    (u % nb) * WG_ROWS, seg[4 * i + 1], seg[4 * i + 2],
                                    slot < 0 ? nullptr : part + (size_t)slot * WG_PART_FLOATS(HD));
    }
}
#endif

// Arguments: q, Kh, Kl ([pos][nkv][HD]), Vth, Vtl ([nkv][HD][ldp]; Kl, Vtl
// unused without LO), ldp, proj, stride, out, T, nh, nkv, pos0, scale, plan
// (attn_wg_plan's, or null: grid (row blocks, nkv)), part (the split blocks'
// pieces, with a plan). Only sm_90a runs them (the sm_80 and HIP images hold
// stubs so every module lists the same kernels).
#define ATTN_FLASH_WG(NAME, HD, LO, QL)                                                                            \
    QW_KERNEL void QW_BOUNDS_MIN(256, 1)                                                                       \
        NAME(const float* __restrict__ q, const bf16_t* __restrict__ kh, const bf16_t* __restrict__ kl,         \
             const bf16_t* __restrict__ vth, const bf16_t* __restrict__ vtl, int ldp,                           \
             const float* __restrict__ proj, int stride, float* __restrict__ out, int T, int nh, int nkv,       \
             int pos0, float scale, const int* __restrict__ plan, float* __restrict__ part) {                   \
        ATTN_FLASH_WG_BODY(HD, LO, QL)                                                                          \
    }
#if defined(QW_WGMMA) || defined(QW_CPU)
#define ATTN_FLASH_WG_BODY(HD, LO, QL) \
    attn_flash_wg_impl<HD, LO, QL>(q, kh, kl, vth, vtl, ldp, proj, stride, out, T, nh, nkv, pos0, scale, plan, part);
#elif defined(QW_CUDA)
#define ATTN_FLASH_WG_BODY(HD, LO, QL) __trap();
#else
#define ATTN_FLASH_WG_BODY(HD, LO, QL)
#endif
ATTN_FLASH_WG(attn_flash_wg_f32_d256, 256, true, true)
ATTN_FLASH_WG(attn_flash_wg_f32_d32, 32, true, true)
ATTN_FLASH_WG(attn_flash_wg_bf16_d256, 256, false, true)
ATTN_FLASH_WG(attn_flash_wg_bf16_d32, 32, false, true)
// One bf16 term per operand (either cache's hi planes; Kl, Vtl unused).
ATTN_FLASH_WG(attn_flash_wg_single_d256, 256, false, false)
ATTN_FLASH_WG(attn_flash_wg_single_d32, 32, false, false)

// Stream-K plan of the warpgroup prompt attention for `ctas` blocks (one per
// multiprocessor: the kernel's shared memory allows one): the key tiles of
// every (row block b, kv head) unit u = kvh * nb + b, laid end to end, cut
// into `ctas` near-equal ranges; a cut inside a unit moves to the unit's end
// unless its tile has every key visible to every row of the unit (below the
// unit's first query), since a piece must start on such a tile. Layout (ints):
// [ctas, merges M, segments S, pieces] [ctas + 1 segment offsets per block]
// [U + ctas segments: unit, first tile, end tile, piece (-1: the whole unit,
// stored directly)] [U merges: unit, first piece, pieces]; a split unit's
// pieces are consecutive. One thread (a few hundred steps, once per prompt pass).
QW_KERNEL void QW_BOUNDS(32) attn_wg_plan(int T, int G, int nkv, int pos0, int ctas, int* __restrict__ plan) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const int npairs = T * G, nb = (npairs + WG_ROWS - 1) / WG_ROWS, U = nb * nkv;
    auto tiles = [&](int u) {
        const int p0 = (u % nb) * WG_ROWS;
        return (pos0 + (min(npairs, p0 + WG_ROWS) - 1) / G + 1 + WG_BK - 1) / WG_BK;
    };
    // Tiles [0, visible(u)) hold only keys every row of unit u sees.
    auto visible = [&](int u) { return (pos0 + (u % nb) * WG_ROWS / G + 1) / WG_BK; };
    long long W = 0;
    for (int u = 0; u < U; u++) W += tiles(u);
    int* off = plan + WG_PLAN_HEAD;
    int* seg = off + ctas + 1;
    int* mer = seg + 4 * (U + ctas);
    int S = 0, M = 0, pieces = 0;
    int cu = 0, su = 0, sj = 0;         // the cut's unit; the next segment's unit and tile
    long long cstart = 0, prev = 0;     // unit cu starts at tile cstart; the last cut
    for (int c = 0; c < ctas; c++) {
        off[c] = S;
        long long x = c + 1 == ctas ? W : W * (c + 1) / ctas;
        while (cu < U && cstart + tiles(cu) <= x) cstart += tiles(cu++);
        if (cu < U && x > cstart && x - cstart >= visible(cu)) x = cstart + tiles(cu);
        while (prev < x) {
            const long long rest = x - prev;
            const int nt = tiles(su), end = rest < nt - sj ? sj + (int)rest : nt;
            const bool whole = sj == 0 && end == nt;
            int* sg = seg + 4 * S++;
            sg[0] = su;
            sg[1] = sj;
            sg[2] = end;
            sg[3] = whole ? -1 : pieces;
            if (!whole) {
                if (sj == 0) {
                    mer[3 * M] = su;
                    mer[3 * M + 1] = pieces;
                    mer[3 * M + 2] = 0;
                    M++;
                }
                mer[3 * M - 1]++;
                pieces++;
            }
            prev += end - sj;
            sj = end;
            if (sj == nt) {
                su++;
                sj = 0;
            }
        }
    }
    off[ctas] = S;
    plan[0] = ctas;
    plan[1] = M;
    plan[2] = S;
    plan[3] = pieces;
}

// The split units of a plan: each one's pieces (attn_wg_segment's unnormalised
// O, m, l per thread) rescaled to their common maxima and summed, then stored
// gated like an unsplit block. grid: at least the plan's merges (U), block 256.
template <int HD>
__device__ __forceinline__ void attn_wg_merge_impl(const int* __restrict__ plan, const float* __restrict__ part,
                                                   const float* __restrict__ proj, int stride,
                                                   float* __restrict__ out, int T, int nh, int nkv) {
    constexpr int DT = HD / 8;
    const int ctas = plan[0];
    if ((int)blockIdx.x >= plan[1]) return;
    const int G = nh / nkv, npairs = T * G, nb = (npairs + WG_ROWS - 1) / WG_ROWS, U = nb * nkv;
    const int* mer = plan + WG_PLAN_HEAD + ctas + 1 + 4 * (U + ctas) + 3 * blockIdx.x;
    const int u = mer[0], first = mer[1], n = mer[2];
    const int kvh = u / nb, p0 = (u % nb) * WG_ROWS;
    const int h = threadIdx.x / 128, w = threadIdx.x % 128 / WARP, lane = threadIdx.x % WARP;
    const int g = lane >> 2, c = lane & 3;
    const int pa = p0 + 64 * h + 16 * w + g, pb = pa + 8;
    const int tid = threadIdx.x;
    float mx[2] = {-INFINITY, -INFINITY};
    for (int k = 0; k < n; k++) {
        const float* pp = part + (size_t)(first + k) * WG_PART_FLOATS(HD);
        mx[0] = fmaxf(mx[0], pp[(4 * DT) * 256 + tid]);
        mx[1] = fmaxf(mx[1], pp[(4 * DT + 1) * 256 + tid]);
    }
    float o[DT][4], l[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < DT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[j][e] = 0.f;
    for (int k = 0; k < n; k++) {
        const float* pp = part + (size_t)(first + k) * WG_PART_FLOATS(HD);
        float sc[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const float mk = pp[(4 * DT + i) * 256 + tid];
            sc[i] = mk == -INFINITY ? 0.f : exp2f(mk - mx[i]);
            l[i] += pp[(4 * DT + 2 + i) * 256 + tid] * sc[i];
        }
#pragma unroll
        for (int j = 0; j < DT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[j][e] += pp[(4 * j + e) * 256 + tid] * sc[e >> 1];
    }
    attn_store_gated<DT>(o, l, pa, pb, npairs, G, kvh, nh, HD, proj, stride, out, c);
}

#define ATTN_WG_MERGE(NAME, HD)                                                                                 \
    QW_KERNEL void QW_BOUNDS(256) NAME(const int* __restrict__ plan, const float* __restrict__ part,            \
                                       const float* __restrict__ proj, int stride, float* __restrict__ out,    \
                                       int T, int nh, int nkv) {                                              \
        ATTN_WG_MERGE_BODY(HD)                                                                                  \
    }
#if defined(QW_CUDA) || defined(QW_CPU)
#define ATTN_WG_MERGE_BODY(HD) attn_wg_merge_impl<HD>(plan, part, proj, stride, out, T, nh, nkv);
#else
#define ATTN_WG_MERGE_BODY(HD)
#endif
ATTN_WG_MERGE(attn_wg_merge_d256, 256)
ATTN_WG_MERGE(attn_wg_merge_d32, 32)

#if defined(QW_CUDA) || defined(QW_CPU)
__device__ __forceinline__ float4 kv_row4(const float* p) { return *(const float4*)p; }
__device__ __forceinline__ float4 kv_row4(const bf16_t* p) {
    const uint2 u = *(const uint2*)p;
    return make_float4(bf_lo(u.x), bf_hi(u.x), bf_lo(u.y), bf_hi(u.y));
}

// Positions [32 bx, 32 bx + 32) of kv head by (grid (ceil(n / 32), nkv), block
// 256): the values turned in shared memory into the transposed planes
// [nkv][hd][ldp] (hi; LO: also lo), zero at positions [n, 32 * gridDim.x);
// with LO the keys' hi / lo planes [pos][nkv][hd] too (as attn_kv_split).
// hd % 4 == 0, hd <= 256, ldp % 8 == 0, ldp >= 32 * gridDim.x.
template <typename KV, bool LO>
__device__ __forceinline__ void kv_split_t_impl(const KV* __restrict__ kc, const KV* __restrict__ vc,
                                                bf16_t* __restrict__ kh, bf16_t* __restrict__ kl,
                                                bf16_t* __restrict__ vth, bf16_t* __restrict__ vtl, int n, int ldp,
                                                int nkv, int hd) {
    __shared__ float vs[WG_BK][256 + 1];  // [position][d]; the odd stride spreads a column over the banks
    const int p0 = blockIdx.x * WG_BK, kvh = blockIdx.y, n4 = hd / 4;
    for (int e = threadIdx.x; e < WG_BK * n4; e += blockDim.x) {
        const int r = e / n4, c4 = e - r * n4, pos = p0 + r;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (pos < n) {
            const size_t at = ((size_t)pos * nkv + kvh) * hd + 4 * c4;
            v = kv_row4(vc + at);
            if constexpr (LO) {
                const float4 k = kv_row4(kc + at);
                uint2 hi, lo;
                split_bf16x2(k.x, k.y, hi.x, lo.x);
                split_bf16x2(k.z, k.w, hi.y, lo.y);
                *(uint2*)(kh + at) = hi;
                *(uint2*)(kl + at) = lo;
            }
        }
        vs[r][4 * c4] = v.x;
        vs[r][4 * c4 + 1] = v.y;
        vs[r][4 * c4 + 2] = v.z;
        vs[r][4 * c4 + 3] = v.w;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < hd * 4; e += blockDim.x) {
        const int d = e >> 2, c = e & 3;  // 8 positions per 16-byte chunk
        uint4 hi, lo;
        split_bf16x2(vs[8 * c][d], vs[8 * c + 1][d], hi.x, lo.x);
        split_bf16x2(vs[8 * c + 2][d], vs[8 * c + 3][d], hi.y, lo.y);
        split_bf16x2(vs[8 * c + 4][d], vs[8 * c + 5][d], hi.z, lo.z);
        split_bf16x2(vs[8 * c + 6][d], vs[8 * c + 7][d], hi.w, lo.w);
        const size_t at = ((size_t)kvh * hd + d) * ldp + p0 + 8 * c;
        *(uint4*)(vth + at) = hi;
        if constexpr (LO) *(uint4*)(vtl + at) = lo;
    }
}
#endif

// The f32 cache as the planes `attn_flash_wg_f32_*` read: the keys' hi / lo
// [pos][nkv][hd], the values' transposed hi / lo [nkv][hd][ldp].
QW_KERNEL void QW_BOUNDS(256) attn_kv_split_t(const float* __restrict__ kc, const float* __restrict__ vc,
                                              bf16_t* __restrict__ kh, bf16_t* __restrict__ kl,
                                              bf16_t* __restrict__ vth, bf16_t* __restrict__ vtl, int n, int ldp,
                                              int nkv, int hd) {
#if defined(QW_CUDA) || defined(QW_CPU)
    kv_split_t_impl<float, true>(kc, vc, kh, kl, vth, vtl, n, ldp, nkv, hd);
#endif
}

// The bf16 cache's values transposed, [nkv][hd][ldp], for `attn_flash_wg_bf16_*`
// (which read the keys from the cache).
QW_KERNEL void QW_BOUNDS(256) attn_v_transpose_bf16(const bf16_t* __restrict__ vc, bf16_t* __restrict__ vt, int n,
                                                    int ldp, int nkv, int hd) {
#if defined(QW_CUDA) || defined(QW_CPU)
    kv_split_t_impl<bf16_t, false>(nullptr, vc, nullptr, nullptr, vt, nullptr, n, ldp, nkv, hd);
#endif
}
