// Reading one logits row for sampling on the host without copying it.
// The head (Backend::forward_top): the TOP_K largest (logit, id) pairs in the
// host sampler's key order (larger logit first, then lower id; NaN as -inf,
// -0.0 as 0.0) and the row's log-sum-exp; 64 keys and two floats come back
// instead of the row. logits_top_part sorts slices of the row in shared
// memory, keeping each slice's TOP_K; logits_top_merge does the same over
// those heads. The weights (Backend::forward_weighted): logits_weights sums
// the row's temperature weights per 64 tokens bit for bit as the host
// sampler does, so the host draws the block and then the token in it.
// Constrained rows (`masks`, token_mask.h) read a token left out as -inf.
// Rows of a batched step: a launch's row y (blockIdx.y) reads the logits row
// `rows[y]` of x (and its mask-table entry), or row y where `rows` is null,
// and writes its results at y, so the rows a readout selects come back
// packed in one buffer (host/engine/src/gpu/model/weighted_rows.rs).
#include "token_mask.h"

#define TOP_SORT 4096  // keys per bitonic sort
#define TOP_K 64       // kept per slice, and returned
#define TOP_THREADS 1024

typedef unsigned long long top_key_t;

// host/engine/src/sampling/keys.rs `key`: sortable(z) << 32 | !id, so that unsigned
// order is (logit, then lower id) order; 0 is below every real key.
__device__ __forceinline__ top_key_t top_key(float z, unsigned id) {
    if (z != z) z = -INFINITY;
    unsigned b = __float_as_uint(__fadd_rn(z, 0.f));  // -0.0 + 0.0 = 0.0
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((top_key_t)b << 32) | (top_key_t)(~id);
}

// Sorts s[0, TOP_SORT) descending (bitonic; every thread of the block).
__device__ void top_sort_desc(top_key_t* s) {
    for (int k = 2; k <= TOP_SORT; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int t = threadIdx.x; t < TOP_SORT / 2; t += blockDim.x) {
                const int i = 2 * t - (t & (j - 1)), l = i + j;  // i has bit j clear
                const top_key_t a = s[i], b = s[l];
                if ((i & k) == 0 ? a < b : a > b) {
                    s[i] = b;
                    s[l] = a;
                }
            }
            __syncthreads();
        }
}

// The TOP_K largest of key(0..n) into s[0, TOP_K): rounds of TOP_SORT - TOP_K
// new keys sorted together with the best so far.
template <typename Key>
__device__ void top_rounds(top_key_t* s, int n, Key key) {
    for (int i = threadIdx.x; i < TOP_K; i += blockDim.x) s[i] = 0;
    for (int base = 0; base < n; base += TOP_SORT - TOP_K) {
        for (int i = threadIdx.x; i < TOP_SORT - TOP_K; i += blockDim.x)
            s[TOP_K + i] = base + i < n ? key(base + i) : 0;
        __syncthreads();
        top_sort_desc(s);
    }
    __syncthreads();
}

// Block b: the slice [b * per_part, (b + 1) * per_part) of x[0, n): its
// TOP_K keys to keys[b * TOP_K, ...), its max and Σ e^(z - max) to ms[2b, 2b+1].
// Rows of a batch: row blockIdx.y (the logits row rows[blockIdx.y] of x
// ([..][n]), or blockIdx.y where rows is null) into its gridDim.x parts;
// logits_top_merge's block r merges row r's into out + r (TOP_K + 1) words.
QW_KERNEL void QW_BOUNDS(TOP_THREADS) logits_top_part(const float* __restrict__ x, int n, int per_part,
                                                      const int* __restrict__ rows,
                                                      const unsigned long long* __restrict__ masks,
                                                      top_key_t* __restrict__ keys, float* __restrict__ ms) {
    __shared__ top_key_t s[TOP_SORT];
    __shared__ float scratch[32];
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    const int r = rows ? rows[blockIdx.y] : (int)blockIdx.y;
    const unsigned* mask = row_mask(masks, r);
    x += (size_t)r * n;
    keys += (size_t)blockIdx.y * gridDim.x * TOP_K;
    ms += (size_t)blockIdx.y * gridDim.x * 2;
    const int lo = blockIdx.x * per_part, hi = min(n, lo + per_part);
    float m = -INFINITY;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) m = fmaxf(m, mask_logit(mask, i, x[i]));  // skips NaN
    m = block_max(m, scratch);
    float e = 0.f;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float z = mask_logit(mask, i, x[i]);
        if (z == m) e += 1.f;  // also an infinite max
        else if (z == z) e += expf(z - m);
    }
    e = block_sum(e, scratch);
    top_rounds(s, hi - lo, [&](int i) { return top_key(mask_logit(mask, lo + i, x[lo + i]), (unsigned)(lo + i)); });
    for (int i = threadIdx.x; i < TOP_K; i += blockDim.x) keys[(size_t)blockIdx.x * TOP_K + i] = s[i];
    if (threadIdx.x == 0) {
        ms[2 * blockIdx.x] = m;
        ms[2 * blockIdx.x + 1] = e;
    }
}

// One block: the best TOP_K of the parts' keys to out[0, TOP_K) (as keys),
// then the row's max and ln Σ e^(z - max) as two floats after them.
QW_KERNEL void QW_BOUNDS(TOP_THREADS) logits_top_merge(const top_key_t* __restrict__ keys,
                                                       const float* __restrict__ ms, int parts,
                                                       top_key_t* __restrict__ out) {
    __shared__ top_key_t s[TOP_SORT];
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    keys += (size_t)blockIdx.x * parts * TOP_K;
    ms += (size_t)blockIdx.x * parts * 2;
    out += (size_t)blockIdx.x * (TOP_K + 1);
    top_rounds(s, parts * TOP_K, [&](int i) { return keys[i]; });
    for (int i = threadIdx.x; i < TOP_K; i += blockDim.x) out[i] = s[i];
    if (threadIdx.x == 0) {
        float m = -INFINITY;
        for (int p = 0; p < parts; p++) m = fmaxf(m, ms[2 * p]);
        double e = 0.0;
        for (int p = 0; p < parts; p++) {
            const float mp = ms[2 * p], ep = ms[2 * p + 1];
            if (ep > 0.f) e += (double)ep * (mp == m ? 1.0 : exp((double)mp - (double)m));
        }
        float* stats = (float*)(out + TOP_K);
        stats[0] = m;
        stats[1] = m == INFINITY || m == -INFINITY ? NAN : (float)log(e);
    }
}

// e^x for x <= 0 as host/engine/src/sampling/exp.rs `exp_nonpos` computes it
// (Cephes' expf polynomial), each operation rounded on its own as Rust does
// (no contraction into FMAs), so the bits equal the host's.
__device__ __forceinline__ float exp_nonpos_host(float x) {
    const float MAGIC = 12582912.0f;  // 1.5 * 2^23
    const bool in_range = x >= -87.0f;
    x = in_range ? x : -87.0f;
    x = x < 0.0f ? x : 0.0f;
    const float t = __fadd_rn(__fmul_rn(x, 1.44269504088896340736f), MAGIC);
    const float n = __fsub_rn(t, MAGIC);
    const int ni = (int)__float_as_uint(t) - (int)__float_as_uint(MAGIC);
    const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(n, 0.6933594f)), __fmul_rn(n, -2.1219444e-4f));
    float p = __fadd_rn(__fmul_rn(1.9875691e-4f, r), 1.3982e-3f);
    p = __fadd_rn(__fmul_rn(p, r), 8.333452e-3f);
    p = __fadd_rn(__fmul_rn(p, r), 4.1665796e-2f);
    p = __fadd_rn(__fmul_rn(p, r), 1.6666665e-1f);
    p = __fadd_rn(__fmul_rn(p, r), 0.5f);
    p = __fadd_rn(__fadd_rn(__fmul_rn(p, __fmul_rn(r, r)), r), 1.0f);
    const float e = __fmul_rn(p, __uint_as_float((unsigned)(ni + 127) << 23));
    return in_range ? e : 0.0f;
}

#define WEIGHT_BLOCK 64  // host/engine/src/sampling/mod.rs BLOCK
#define PREFILTER_LOG_W (-8.317766f)  // host/engine/src/sampling/draw.rs PREFILTER_LOG_W: ln 2^-12

// One thread per WEIGHT_BLOCK logits: blocks[b] = the sum of the weights
// e^((z - max) / t) (0 under min_p, NaN logits 0) of block b, formed as the
// host sampler's `block_sum` forms it: 8 f32 lanes over whole groups of 8,
// the lanes added in f64, then the rest. `head`: logits_top_merge's output
// (the row's max after its keys). heavy[warp] counts the warp's tokens with
// z >= max + t ln 2^-12 and an (unmasked) weight > 0: the tokens the host
// sampler's top-p tries first. Rows of a batch: launch row y (blockIdx.y)
// weights the logits row rows[y] of x under its mask-table entry, with the
// head at heads + y (TOP_K + 1) words, at temperature params[2y] and min_p
// params[2y + 1] (where params is null: t and min_p), into blocks + y
// ceil(n / WEIGHT_BLOCK) and heavy + y (its warps); where rows is null, row y.
QW_KERNEL void QW_BOUNDS(256) logits_weights(const float* __restrict__ x, int n, const int* __restrict__ rows,
                                             const float* __restrict__ params, float t, float min_p,
                                             const top_key_t* __restrict__ heads,
                                             const unsigned long long* __restrict__ masks,
                                             double* __restrict__ blocks, unsigned* __restrict__ heavy) {
    QW_GRID_WAIT();
    QW_GRID_LAUNCH();
    const int y = blockIdx.y, r = rows ? rows[y] : y;
    if (params) {
        t = params[2 * y];
        min_p = params[2 * y + 1];
    }
    const unsigned* mask = row_mask(masks, r);
    x += (size_t)r * n;
    const top_key_t* head = heads + (size_t)y * (TOP_K + 1);
    blocks += (size_t)y * ((n + WEIGHT_BLOCK - 1) / WEIGHT_BLOCK);
    heavy += (size_t)y * (gridDim.x * blockDim.x / WARP);
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    const float zmax = ((const float*)(head + TOP_K))[0];
    const float heavy_floor = __fadd_rn(zmax, __fmul_rn(t, PREFILTER_LOG_W));
    const float* z = x + (size_t)b * WEIGHT_BLOCK;
    const int len = max(0, min(WEIGHT_BLOCK, n - b * WEIGHT_BLOCK)), full = len & ~7;
    unsigned count = 0;
    auto weight = [&](int j) {
        float v = mask_logit(mask, b * WEIGHT_BLOCK + j, z[j]);
        if (v != v) v = -INFINITY;
        const float w = exp_nonpos_host(__fdiv_rn(__fsub_rn(v, zmax), t));
        count += v >= heavy_floor && w > 0.0f;
        return w < min_p ? 0.0f : w;
    };
    float lanes[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int j = 0; j < full; j += 8)
#pragma unroll
        for (int a = 0; a < 8; a++) lanes[a] = __fadd_rn(lanes[a], weight(j + a));
    double s = 0.0;
#pragma unroll
    for (int a = 0; a < 8; a++) s = __dadd_rn(s, (double)lanes[a]);
    for (int j = full; j < len; j++) s = __dadd_rn(s, (double)weight(j));
    if (len > 0) blocks[b] = s;
    // Every lane reaches the reduction (none returned early).
    for (int m = WARP / 2; m > 0; m >>= 1) count += SHFL_XOR(count, m);
    if (threadIdx.x % WARP == 0) heavy[b / WARP] = count;
}
