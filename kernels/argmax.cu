// The greedy readout: argmax, max and log-sum-exp of logits rows over many
// blocks (the decode graphs' last kernels, and batched decode's rows).
#include "compat.h"
#include "token_mask.h"

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
