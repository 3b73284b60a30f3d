// Mixture of experts: router softmax + top-k + renormalisation on the device,
// and the batch-1 routed-expert GEMVs over the k selected experts.
#include "compat.h"

// Per token (one block): p = softmax(logits[t]); the top-k experts by p (ties to the
// lower index); weights p_e / sum_chosen p. E <= 1024, k <= 32.
QW_KERNEL void QW_BOUNDS(256) router_topk(const float* __restrict__ logits, int stride, int E, int k,
                                          int* __restrict__ idx, float* __restrict__ wout) {
    __shared__ float p[1024];
    __shared__ float scratch[32];
    int t = blockIdx.x;
    const float* l = logits + (size_t)t * stride;
    float mx = -INFINITY;
    for (int e = threadIdx.x; e < E; e += blockDim.x) mx = fmaxf(mx, l[e]);
    mx = block_max(mx, scratch);
    float s = 0.f;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float v = expf(l[e] - mx);
        p[e] = v;
        s += v;
    }
    s = block_sum(s, scratch);
    __syncthreads();
    if (threadIdx.x == 0) {
        int chosen[32];
        float total = 0.f;
        for (int j = 0; j < k; j++) {
            int best = -1;
            float bv = -1.f;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int q = 0; q < j; q++) taken |= chosen[q] == e;
                if (!taken && p[e] > bv) { bv = p[e]; best = e; }
            }
            chosen[j] = best;
            total += bv / s;
        }
        for (int j = 0; j < k; j++) {
            idx[t * k + j] = chosen[j];
            wout[t * k + j] = p[chosen[j]] / s / total;
        }
    }
}

// out[j, r] = Wgu[idx[j]][r, :] . x  for the k selected experts; Wgu is [E, R, H]
// (R = 2I: gate rows then up rows). grid (ceil(R / rows_per_block), k).
QW_KERNEL void QW_BOUNDS(256) moe_gemv_gate_up(const bf16_t* __restrict__ Wgu, const float* __restrict__ x,
                                               const int* __restrict__ idx, float* __restrict__ out, int R, int H) {
    int r = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    int j = blockIdx.y;
    if (r >= R) return;
    const bf16_t* w = Wgu + ((size_t)idx[j] * R + r) * H;
    int lane = threadIdx.x % WARP;
    float acc = 0.f;
    if ((H & 7) == 0) {
        const uint4* w4 = (const uint4*)w;
        const float4* x4 = (const float4*)x;
        for (int c = lane; c < (H >> 3); c += WARP) {
            uint4 wv = w4[c];
            float4 a = x4[2 * c], b = x4[2 * c + 1];
            acc += bf_lo(wv.x) * a.x + bf_hi(wv.x) * a.y + bf_lo(wv.y) * a.z + bf_hi(wv.y) * a.w;
            acc += bf_lo(wv.z) * b.x + bf_hi(wv.z) * b.y + bf_lo(wv.w) * b.z + bf_hi(wv.w) * b.w;
        }
    } else {
        for (int c = lane; c < H; c += WARP) acc += bf2f(w[c]) * x[c];
    }
    acc = warp_sum(acc);
    if (lane == 0) out[(size_t)j * R + r] = acc;
}

// y[r] += sum_j wts[j] * Wd[idx[j]][r, :] . act[j, :]; Wd is [E, H, I]. One warp per row.
QW_KERNEL void QW_BOUNDS(256) moe_gemv_down(const bf16_t* __restrict__ Wd, const float* __restrict__ act,
                                            const int* __restrict__ idx, const float* __restrict__ wts,
                                            float* __restrict__ y, int k, int H, int I) {
    int r = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (r >= H) return;
    int lane = threadIdx.x % WARP;
    float total = 0.f;
    for (int j = 0; j < k; j++) {
        const bf16_t* w = Wd + ((size_t)idx[j] * H + r) * I;
        const float* a = act + (size_t)j * I;
        float acc = 0.f;
        if ((I & 7) == 0) {
            const uint4* w4 = (const uint4*)w;
            const float4* a4 = (const float4*)a;
            for (int c = lane; c < (I >> 3); c += WARP) {
                uint4 wv = w4[c];
                float4 p = a4[2 * c], q = a4[2 * c + 1];
                acc += bf_lo(wv.x) * p.x + bf_hi(wv.x) * p.y + bf_lo(wv.y) * p.z + bf_hi(wv.y) * p.w;
                acc += bf_lo(wv.z) * q.x + bf_hi(wv.z) * q.y + bf_lo(wv.w) * q.z + bf_hi(wv.w) * q.w;
            }
        } else {
            for (int c = lane; c < I; c += WARP) acc += bf2f(w[c]) * a[c];
        }
        total += wts[j] * warp_sum(acc);
    }
    if (lane == 0) y[r] += total;
}

// router_topk for one token by one warp, the same selection as router_topk.
// Lane l holds experts l + 32 r of p (E floats of shared memory, this warp's
// own); each of the k rounds is a warp argmax over the untaken experts (larger
// p wins, equal p goes to the lower index, like router_topk's ascending strict
// '>' scan), and the winner's owner lane marks it taken. p_e = expf(l_e - max)
// exactly as in router_topk (the max is exact); the sum is a warp sum (order
// differs in the last bits). Lane j < k gets entry j: *ex the expert (-1 when
// nothing is selectable: non-finite logits, and in lanes >= k), *w its weight.
// E <= 1024, k <= 32.
// Shared by router_topk_warp and moe_route_plan, so both route bit-identically.
__device__ __forceinline__ void router_topk_token(const float* __restrict__ lg, int E, int k, float* p, int* ex,
                                                  float* w) {
    const int lane = threadIdx.x % WARP;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += WARP) mx = fmaxf(mx, lg[e]);
    mx = warp_max(mx);
    float s = 0.f;
    for (int e = lane; e < E; e += WARP) {
        float v = expf(lg[e] - mx);
        p[e] = v;
        s += v;
    }
    s = warp_sum(s);
    int my_i = -1;
    float my_p = 0.f, total = 0.f;
    for (int j = 0; j < k; j++) {
        float bv = -1.f;
        int bi = 0x7fffffff;
        for (int e = lane; e < E; e += WARP) {
            float v = p[e];  // taken: -INFINITY; NaN never wins (as in router_topk)
            if (v > bv) { bv = v; bi = e; }
        }
#pragma unroll
        for (int m = WARP / 2; m > 0; m >>= 1) {
            float ov = SHFL_XOR(bv, m);
            int oi = SHFL_XOR(bi, m);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if (bi == 0x7fffffff) bi = -1;  // nothing selectable (non-finite logits)
        if (bi >= 0 && (bi % WARP) == lane) p[bi] = -INFINITY;
        if (lane == j) { my_i = bi; my_p = bv; }
        total += bv / s;
    }
    *ex = my_i;
    *w = my_p / s / total;
}

// router_topk for many tokens: one warp per token (8 per 256-thread block),
// router_topk_token each. grid ceil(T / 8).
QW_KERNEL void QW_BOUNDS(256) router_topk_warp(const float* __restrict__ logits, int stride, int E, int k,
                                               int T, int* __restrict__ idx, float* __restrict__ wout) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    __shared__ float ps[8][1024];
    int w = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int t = blockIdx.x * 8 + w;
    if (t >= T) return;  // whole warps leave together
    int ex;
    float wt;
    router_topk_token(logits + (size_t)t * stride, E, k, ps[w], &ex, &wt);
    if (lane < k) {
        idx[(size_t)t * k + lane] = ex;
        wout[(size_t)t * k + lane] = wt;
    }
}

// ---------------------------------------------------------------------------
// Prefill experts without the host round trip of the routing: a device-side plan
// (entries n = t * k + j sorted by expert, tokens ascending within an expert),
// one gather + bf16 hi/lo split of all n rows, per-expert GEMMs on row slices
// (the host reads only the E counts), one SiLU*up + split, and a per-token combine
// adding the k expert outputs in ascending expert order (as the per-expert
// scatter_add_rows sequence does).

// Sum of one int per thread over a 256-thread block, returned to every thread
// (XOR-shuffle warp sums, the 8 warp sums through shared memory, one __syncthreads;
// sh must not be rewritten until every thread has returned).
__device__ __forceinline__ int block_isum256(int v, int* sh /* [256 / WARP] */) {
#pragma unroll
    for (int m = WARP / 2; m > 0; m >>= 1) v += SHFL_XOR(v, m);
    if (threadIdx.x % WARP == 0) sh[threadIdx.x / WARP] = v;
    __syncthreads();
    int t = 0;
#pragma unroll
    for (int i = 0; i < 256 / WARP; i++) t += sh[i];
    return t;
}

// counts[e] = #{n < N : idx[n] == e} for e < E (block e); block E counts the
// entries outside [0, E) into counts[E]. grid E + 1, block 256.
QW_KERNEL void QW_BOUNDS(256) moe_plan_count(const int* __restrict__ idx, int N, int E, int* __restrict__ counts) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    __shared__ int sh[256 / WARP];
    int e = blockIdx.x, c = 0;
    for (int n = threadIdx.x; n < N; n += 256) {
        int x = idx[n];
        c += e < E ? x == e : (x < 0 || x >= E);
    }
    const int total = block_isum256(c, sh);
    if (threadIdx.x == 0) counts[e] = total;
}

// Exclusive prefix sum of v over this thread's group of WARP lanes with XOR
// shuffles only (the one shuffle compat.h has on CUDA, HIP and the CPU);
// *total = the group's sum. Before the step for m, v is the sum of the aligned
// m lanes holding this one and pre the part below this lane; the partner
// (lane ^ m) holds the sibling m lanes, which lie below when lane & m.
__device__ __forceinline__ unsigned long long warp_excl_scan_u64(unsigned long long v,
                                                                  unsigned long long* total) {
    const int lane = threadIdx.x % WARP;
    unsigned long long pre = 0;
#pragma unroll
    for (int m = 1; m < WARP; m <<= 1) {
        const unsigned long long o = SHFL_XOR(v, m);
        if (lane & m) pre += o;
        v += o;
    }
    *total = v;
    return pre;
}

// Exclusive prefix sum of v over a block of NT threads, in thread order: warp
// scans, the NT / WARP warp totals through ws, one __syncthreads (ws must not
// be rewritten until every thread has read it); *total = the block's sum.
template <int NT = 256>
__device__ __forceinline__ unsigned long long block_excl_scan_u64(unsigned long long v, unsigned long long* ws,
                                                                  unsigned long long* total) {
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    unsigned long long wt, pre = warp_excl_scan_u64(v, &wt);
    if (lane == 0) ws[w] = wt;
    __syncthreads();
    unsigned long long tot = 0;
    for (int i = 0; i < NT / WARP; i++) {
        const unsigned long long x = ws[i];
        if (i < w) pre += x;
        tot += x;
    }
    *total = tot;
    return pre;
}

// Quads (4 consecutive entries) per thread per moe_plan_place tile: a tile is
// 256 * 4 * MOE_PLAN_QUADS entries; the counts of a thread's quads travel as
// 16-bit fields of one 64-bit word (at most 1024 per field and tile).
#define MOE_PLAN_QUADS 4
#define MOE_PLAN_TILE (256 * 4 * MOE_PLAN_QUADS)

// Block e writes its entries at [off_e, off_e + counts[e]) in increasing n (so in
// increasing token): rows[p] = n / k, slot[n] = p; off_e = counts[0] + .. + counts[e - 1].
// Every block has to look at all N entries, so the block walks idx in coalesced
// tiles: quad q of a tile is its entries 4 (256 q + i) .. +3 for thread i, one
// 16-byte load where idx is 16-byte aligned (scalar loads at the ragged end), the
// MOE_PLAN_QUADS loads of a thread in flight together. One block-wide exclusive
// scan per tile (XOR-shuffle warp scans of the packed per-quad match counts, the
// 8 warp totals in shared memory, one __syncthreads) gives each match its place
// in (quad, thread, entry) = increasing-n order. off_e is a block reduction of
// counts[0..e); an empty expert returns at once and the walk stops once all
// counts[e] entries are placed (counts must be moe_plan_count's for this idx,
// which the offsets always needed). grid E, block 256.
QW_KERNEL void QW_BOUNDS(256) moe_plan_place(const int* __restrict__ idx, int N, int k, int E,
                                             const int* __restrict__ counts, int* __restrict__ rows,
                                             int* __restrict__ slot) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    __shared__ int osum[256 / WARP];
    // Warp totals of the tiles, double-buffered: a tile's writes go to the half
    // that the tile before last read, and the last tile's __syncthreads separates them.
    __shared__ unsigned long long wsum[2][256 / WARP];
    const int e = blockIdx.x, tid = threadIdx.x;
    const int cnt = counts[e];
    if (cnt == 0) return;  // the whole block
    int s = 0;
    for (int j = tid; j < e; j += 256) s += counts[j];
    int base = block_isum256(s, osum);  // off_e
    const int end = base + cnt;
    const bool vec = ((size_t)idx & 15) == 0;
    for (int t0 = 0, it = 0; t0 < N; t0 += MOE_PLAN_TILE, it++) {
        int v[MOE_PLAN_QUADS][4];
#pragma unroll
        for (int q = 0; q < MOE_PLAN_QUADS; q++) {
            const int n0 = t0 + 4 * (256 * q + tid);
            if (vec && n0 + 4 <= N) {
                const uint4 u = *(const uint4*)(idx + n0);
                v[q][0] = (int)u.x;
                v[q][1] = (int)u.y;
                v[q][2] = (int)u.z;
                v[q][3] = (int)u.w;
            } else {
#pragma unroll
                for (int i = 0; i < 4; i++) v[q][i] = n0 + i < N ? idx[n0 + i] : -1;
            }
        }
        unsigned long long c = 0;  // 16-bit field q: matches in quad q
#pragma unroll
        for (int q = 0; q < MOE_PLAN_QUADS; q++)
            c |= (unsigned long long)((v[q][0] == e) + (v[q][1] == e) + (v[q][2] == e) + (v[q][3] == e))
                 << (16 * q);
        unsigned long long tot, pre = block_excl_scan_u64(c, wsum[it & 1], &tot);
#pragma unroll
        for (int q = 0; q < MOE_PLAN_QUADS; q++) {
            // Places before quad q of this thread: all matches of quads < q, then
            // those of quad q in the threads below.
            int p = base + (int)((pre >> (16 * q)) & 0xffff);
            if ((c >> (16 * q)) & 0xffff) {
                const int n0 = t0 + 4 * (256 * q + tid);
#pragma unroll
                for (int i = 0; i < 4; i++)
                    if (v[q][i] == e) {
                        rows[p] = (n0 + i) / k;
                        slot[n0 + i] = p;
                        p++;
                    }
            }
            base += (int)((tot >> (16 * q)) & 0xffff);
        }
        if (base >= end) break;  // the same for every thread
    }
}

// The grouped expert GEMM's tile list from moe_plan_count's counts, built on the
// device so nothing comes back to the host between the router and the experts:
// tiles[0] = the tile count, then per expert in ascending order its
// ceil(counts[e] / bm) tiles (e, first row, rows <= bm) over the rows
// moe_plan_place gave it (the layout moe_gemm_* read). Entries outside [0, E)
// (a router fed non-finite activations) are not placed: rows[p] = 0 for p in
// [placed, N) so the gather of all N rows reads real ones, and *bad =
// counts[E] (the layer's word, which the host checks once per pass).
// E <= MOE_MAXE (4 experts per thread). grid 1, block 256.
QW_KERNEL void QW_BOUNDS(256) moe_plan_tiles(const int* __restrict__ counts, int E, int bm, int N,
                                             int* __restrict__ tiles, int* __restrict__ rows, int* __restrict__ bad) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    __shared__ unsigned long long wsum[256 / WARP];
    const int tid = threadIdx.x;
    int c[4];
    unsigned long long mine = 0;  // this thread's tiles << 32 | rows
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int e = 4 * tid + j;
        c[j] = e < E ? counts[e] : 0;
        mine += ((unsigned long long)((c[j] + bm - 1) / bm) << 32) + (unsigned)c[j];
    }
    unsigned long long tot, pre = block_excl_scan_u64(mine, wsum, &tot);
    int t = (int)(pre >> 32), r = (int)(pre & 0xffffffffu);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        for (int r0 = 0; r0 < c[j]; r0 += bm) {
            int* o = tiles + 1 + 3 * t++;
            o[0] = 4 * tid + j;
            o[1] = r + r0;
            o[2] = min(bm, c[j] - r0);
        }
        r += c[j];
    }
    if (tid == 0) {
        tiles[0] = (int)(tot >> 32);
        *bad = counts[E];
    }
    for (int p = (int)(tot & 0xffffffffu) + tid; p < N; p += 256) rows[p] = 0;
}

// Limits of moe_route_plan (mirrored in host/engine/src/gpu/model/moe_grouped.rs):
// its block size, and the most tokens (one bit each in a 64-bit mask per
// expert) and experts (one per thread; the warps' p rows, 32 KB, static).
#define MOE_ROUTE_THREADS 512
#define MOE_ROUTE_MAXT 64
#define MOE_ROUTE_MAXE 512

// A batched decode step's router and plan in one launch instead of four
// dependent small ones (router_topk_warp, moe_plan_count, moe_plan_place,
// moe_plan_tiles), with the same outputs bit for bit: idx, wts, counts (with
// counts[E] the entries outside [0, E)), rows, slot, the tile table for bm,
// the zeroed rows tail and *bad. Warp w routes tokens w, w + 16, ..
// (router_topk_token) and sets bit t of mask[e] for each expert e token t
// chose; a token's chosen experts are distinct (each is marked taken), so
// counts[e] = popcount(mask[e]) and entry (t, j) of expert e goes to place
// off_e + the tokens below t in mask[e] (increasing n within an expert, as
// moe_plan_place). Thread e owns expert e for the scan of counts and tiles.
// T <= MOE_ROUTE_MAXT, E <= MOE_ROUTE_MAXE, k <= MOE_MAXK; grid 1, block MOE_ROUTE_THREADS.
QW_KERNEL void QW_BOUNDS(MOE_ROUTE_THREADS)
    moe_route_plan(const float* __restrict__ logits, int stride, int E, int k, int T, int bm, int* __restrict__ idx,
                   float* __restrict__ wout, int* __restrict__ counts, int* __restrict__ rows,
                   int* __restrict__ slot, int* __restrict__ tiles, int* __restrict__ bad) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    constexpr int NW = MOE_ROUTE_THREADS / WARP, TPW = (MOE_ROUTE_MAXT + NW - 1) / NW;
    __shared__ float ps[NW][MOE_ROUTE_MAXE];
    __shared__ unsigned long long mask[MOE_ROUTE_MAXE];
    __shared__ int off[MOE_ROUTE_MAXE];
    __shared__ unsigned long long wsum[NW];
    const int tid = threadIdx.x, w = tid / WARP, lane = tid % WARP;
    if (tid < E) mask[tid] = 0;
    __syncthreads();
    int ex[TPW];  // this lane's entry of each of its warp's tokens (-1: none, and for lanes >= k)
#pragma unroll
    for (int i = 0; i < TPW; i++) ex[i] = -1;
#pragma unroll
    for (int i = 0; i < TPW; i++) {
        const int t = w + NW * i;
        if (t >= T) break;  // the same for the whole warp
        int e;
        float wt;
        router_topk_token(logits + (size_t)t * stride, E, k, ps[w], &e, &wt);
        ex[i] = e;
        if (lane < k) {
            idx[(size_t)t * k + lane] = e;
            wout[(size_t)t * k + lane] = wt;
            if (e >= 0) atomicOr(&mask[e], 1ull << t);
        }
    }
    __syncthreads();
    // Counts, offsets and tiles as moe_plan_tiles (this thread's expert in place of its four).
    const int c = tid < E ? __popcll(mask[tid]) : 0;
    unsigned long long tot, pre = block_excl_scan_u64<MOE_ROUTE_THREADS>(
        ((unsigned long long)((c + bm - 1) / bm) << 32) + (unsigned)c, wsum, &tot);
    const int r = (int)(pre & 0xffffffffu), placed = (int)(tot & 0xffffffffu);
    if (tid < E) {
        counts[tid] = c;
        off[tid] = r;
        int ti = (int)(pre >> 32);
        for (int r0 = 0; r0 < c; r0 += bm) {
            int* o = tiles + 1 + 3 * ti++;
            o[0] = tid;
            o[1] = r + r0;
            o[2] = min(bm, c - r0);
        }
    }
    if (tid == 0) {
        tiles[0] = (int)(tot >> 32);
        counts[E] = T * k - placed;  // every entry not placed is outside [0, E)
        *bad = T * k - placed;
    }
    for (int p = placed + tid; p < T * k; p += MOE_ROUTE_THREADS) rows[p] = 0;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < TPW; i++) {
        const int t = w + NW * i;
        if (ex[i] < 0) continue;
        const int p = off[ex[i]] + __popcll(mask[ex[i]] & ((1ull << t) - 1));
        rows[p] = t;
        slot[(size_t)t * k + lane] = p;
    }
}

// hi/lo[i, :] = bf16 split of src[rows[i] * src_stride + (0..dim)], i < n (as
// gather_rows then f32_to_bf16_split; lo == nullptr: hi alone). grid n (one
// row per block), block 256.
QW_KERNEL void QW_BOUNDS(256) gather_split_bf16(const float* __restrict__ src, int src_stride,
                                                const int* __restrict__ rows, long long n, int dim,
                                                bf16_t* __restrict__ hi, bf16_t* __restrict__ lo) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    const long long i = blockIdx.x;
    if (i >= n) return;
    split_row(src + (size_t)rows[i] * src_stride, hi + i * dim, lo ? lo + i * dim : nullptr, dim);
}

// a = silu(in[r, i]) * in[r, I + i] (rows of 2I: gate then up), split into bf16
// hi/lo [r, i] (as silu_mul then f32_to_bf16_split; lo == nullptr: hi alone).
// grid rows (one per block), block 256.
QW_KERNEL void QW_BOUNDS(256) silu_mul_split(const float* __restrict__ in, long long rows, int I,
                                             bf16_t* __restrict__ hi, bf16_t* __restrict__ lo) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    const long long r = blockIdx.x;
    if (r >= rows) return;
    const float* g = in + r * 2 * I;
    const float* u = g + I;
    bf16_t* h = hi + r * I;
    bf16_t* l = lo ? lo + r * I : nullptr;
    // rounded products, as stored by silu_mul
    if ((I & 3) == 0) {
        for (int c = threadIdx.x; c < I / 4; c += blockDim.x) {
            const float4 a = ((const float4*)g)[c], b = ((const float4*)u)[c];
            split4(make_float4(__fmul_rn(silu_f(a.x), b.x), __fmul_rn(silu_f(a.y), b.y),
                               __fmul_rn(silu_f(a.z), b.z), __fmul_rn(silu_f(a.w), b.w)),
                   h + 4 * c, l ? l + 4 * c : nullptr);
        }
    } else {
        for (int c = threadIdx.x; c < I; c += blockDim.x)
            split1(__fmul_rn(silu_f(g[c]), u[c]), h + c, l ? l + c : nullptr);
    }
}

// x[t, d] += sum over token t's k experts in ascending expert order of
// wts[t, j] * ye[slot[t, j], d]; entries outside [0, E) have no slot and are
// skipped (moe_plan_tiles reports them). With sy, the shared expert first:
// x[t, d] += sigmoid(sg[t sg_stride]) sy[t, d] (as add_sigmoid_scaled). With
// nw, then nout[t] = rmsnorm(x[t]) * nw (the next layer's input norm, as
// rmsnorm: each thread sums the elements i, i + blockDim, ... of the row).
// grid T (one token per block), block 256. Rows of up to COMBINE_REG *
// blockDim elements stay in registers, a thread holding exactly the
// elements its norm sums, and the loads of up to COMBINE_BATCH experts are
// in flight together: with few tokens (one block each) the kernel is
// latency-bound, and a load after load per expert cost ~15 us at 8 tokens.
#define COMBINE_REG 8
#define COMBINE_BATCH 8
QW_KERNEL void QW_BOUNDS(256) moe_combine(const float* __restrict__ ye, const int* __restrict__ idx,
                                          const float* __restrict__ wts, const int* __restrict__ slot, int T,
                                          int k, int E, int H, float* __restrict__ x, const float* __restrict__ sy,
                                          const float* __restrict__ sg, int sg_stride,
                                          const float* __restrict__ nw, float* __restrict__ nout, float eps) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    __shared__ const float* src[MOE_MAXK];
    __shared__ float sw[MOE_MAXK];
    __shared__ int s_valid;
    __shared__ float scratch[32];
    const int t = blockIdx.x;
    if (t >= T) return;
    if (threadIdx.x == 0 && k <= 0) s_valid = 0;
    if (threadIdx.x < k) {
        // The k entries in ascending expert order: entry j's place is the
        // count of valid entries before it (k <= MOE_MAXK; one thread each,
        // no serial selection before the row's loads can start).
        const int* ti = idx + (size_t)t * k;
        const int j = threadIdx.x, ex = ti[j];
        const bool ok = ex >= 0 && ex < E;
        int place = 0, valid = 0;
        for (int i = 0; i < k; i++) {
            const int o = ti[i];
            const bool oi = o >= 0 && o < E;
            valid += oi;
            place += oi && (o < ex || (o == ex && i < j));
        }
        if (ok) {
            const size_t n = (size_t)t * k + j;
            src[place] = ye + (size_t)slot[n] * H;
            sw[place] = wts[n];
        }
        if (j == 0) s_valid = valid;
    }
    __syncthreads();
    const int nv = s_valid, nt = blockDim.x;
    float* xr = x + (size_t)t * H;
    const float* syr = sy ? sy + (size_t)t * H : nullptr;
    const float gs = sy ? sigmoid_f(sg[(size_t)t * sg_stride]) : 0.f;
    if (H > COMBINE_REG * nt) {
        for (int d = threadIdx.x; d < H; d += nt) {
            float acc = xr[d];
            if (syr) acc += gs * syr[d];
            for (int j = 0; j < nv; j++) acc += sw[j] * src[j][d];
            xr[d] = acc;
        }
        if (!nw) return;
        __syncthreads();  // the row's other elements are other threads'
        float ss = 0.f;
        for (int i = threadIdx.x; i < H; i += nt) ss += xr[i] * xr[i];
        ss = block_sum(ss, scratch);
        const float inv = rsqrtf(ss / H + eps);
        float* o = nout + (size_t)t * H;
        for (int i = threadIdx.x; i < H; i += nt) o[i] = xr[i] * inv * nw[i];
        return;
    }
    float acc[COMBINE_REG];
#pragma unroll
    for (int m = 0; m < COMBINE_REG; m++) {
        const int d = threadIdx.x + m * nt;
        acc[m] = d < H ? xr[d] : 0.f;
    }
    if (syr) {
#pragma unroll
        for (int m = 0; m < COMBINE_REG; m++) {
            const int d = threadIdx.x + m * nt;
            if (d < H) acc[m] += gs * syr[d];
        }
    }
    for (int j0 = 0; j0 < nv; j0 += COMBINE_BATCH) {
        float y[COMBINE_BATCH][COMBINE_REG];
#pragma unroll
        for (int b = 0; b < COMBINE_BATCH; b++) {
            const float* s = j0 + b < nv ? src[j0 + b] : nullptr;
#pragma unroll
            for (int m = 0; m < COMBINE_REG; m++) {
                const int d = threadIdx.x + m * nt;
                y[b][m] = s && d < H ? s[d] : 0.f;
            }
        }
#pragma unroll
        for (int b = 0; b < COMBINE_BATCH; b++) {
            if (j0 + b >= nv) break;
            const float wj = sw[j0 + b];
#pragma unroll
            for (int m = 0; m < COMBINE_REG; m++) acc[m] += wj * y[b][m];
        }
    }
    float ss = 0.f;
#pragma unroll
    for (int m = 0; m < COMBINE_REG; m++) {
        const int d = threadIdx.x + m * nt;
        if (d < H) {
            xr[d] = acc[m];
            ss += acc[m] * acc[m];
        }
    }
    if (!nw) return;
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / H + eps);
    float* o = nout + (size_t)t * H;
#pragma unroll
    for (int m = 0; m < COMBINE_REG; m++) {
        const int d = threadIdx.x + m * nt;
        if (d < H) o[d] = acc[m] * inv * nw[d];
    }
}
