// Fused batch-1 decode kernels. One decode step reads ~6 GB of weights for a
// few microseconds of arithmetic, so these kernels are about streaming weights
// at full bandwidth and about launching few kernels: norms run as GEMV
// prologues, the MoE router is recomputed inside the expert kernel, the
// residual add is every output GEMV's epilogue, and the position comes from
// device memory so a whole step can be replayed as one CUDA graph.
#include "compat.h"

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

// One warp: W row (bf16, `cols` long) . xs (f32, shared memory). Four 16-byte
// loads per lane in flight before their first use; a scalar path when rows are
// not 16-byte aligned (cols % 8 != 0).
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

// y[r] (+)= W[r, :] . x. x is staged in shared memory (cols floats); rows are
// spread over the grid with a grid-stride loop so the grid can be capped.
QW_KERNEL void QW_BOUNDS(256) dec_gemv(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                      float* __restrict__ y, int rows, int cols, int accumulate) {
    extern __shared__ float xs[];
    for (int i = threadIdx.x; i < cols; i += blockDim.x) xs[i] = x[i];
    __syncthreads();
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    for (int r = blockIdx.x * DEC_WARPS + w; r < rows; r += gridDim.x * DEC_WARPS) {
        float v = row_dot(W + (size_t)r * cols, xs, cols, lane);
        if (lane == 0) y[r] = accumulate ? y[r] + v : v;
    }
}

// y[r] = W[r, :] . rmsnorm(x) with the (1+w) weight `nw` already folded in:
// the norm is the prologue (same arithmetic as the `rmsnorm` kernel). Block 0
// also writes the normed vector to n_out (when not null) for later kernels.
QW_KERNEL void QW_BOUNDS(256) dec_norm_gemv(const bf16_t* __restrict__ W, const float* __restrict__ x,
                                           const float* __restrict__ nw, float eps, float* __restrict__ y,
                                           float* __restrict__ n_out, int rows, int cols) {
    extern __shared__ float xs[];
    __shared__ float scratch[32];
    float ss = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = x[i];
        xs[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    float inv = rsqrtf(ss / cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = xs[i] * inv * nw[i];
        xs[i] = v;
        if (blockIdx.x == 0 && n_out) n_out[i] = v;
    }
    __syncthreads();
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    for (int r = blockIdx.x * DEC_WARPS + w; r < rows; r += gridDim.x * DEC_WARPS) {
        float v = row_dot(W + (size_t)r * cols, xs, cols, lane);
        if (lane == 0) y[r] = v;
    }
}

// GDN output: y[r] += W[r, :] . (rmsnorm_head(o) * nw * silu(z)), the gated
// norm (same arithmetic as `gated_rmsnorm`) as the prologue, the residual add
// as the epilogue. o is [nv * dv]; z sits in the projection row.
QW_KERNEL void QW_BOUNDS(256) dec_gdn_out_gemv(const bf16_t* __restrict__ W, const float* __restrict__ o,
                                              const float* __restrict__ z, const float* __restrict__ nw,
                                              float eps, float* __restrict__ y, int rows, int nv, int dv) {
    extern __shared__ float xs[];
    int cols = nv * dv;
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    for (int h = w; h < nv; h += DEC_WARPS) {
        const float* p = o + (size_t)h * dv;
        float ss = 0.f;
        for (int i = lane; i < dv; i += WARP) ss += p[i] * p[i];
        ss = warp_sum(ss);
        float inv = rsqrtf(ss / dv + eps);
        for (int i = lane; i < dv; i += WARP) xs[h * dv + i] = p[i] * inv * nw[i] * silu_f(z[h * dv + i]);
    }
    __syncthreads();
    for (int r = blockIdx.x * DEC_WARPS + w; r < rows; r += gridDim.x * DEC_WARPS) {
        float v = row_dot(W + (size_t)r * cols, xs, cols, lane);
        if (lane == 0) y[r] += v;
    }
}

// GDN step preparation, in place on the projection row: causal conv (state
// [C][K-1], same arithmetic as `conv_silu` at T = 1) + SiLU on every channel,
// L2 norm of each q head (times 1/sqrt(dk)) and k head, and the gates
// (beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)).
// Block size DK_THREADS; blocks [0, 2 nk) are the q then k heads (one head each),
// the rest cover the value channels DK_THREADS at a time. Block 0 also does the gates.
#define PREP_THREADS 128
QW_KERNEL void QW_BOUNDS(PREP_THREADS) dec_gdn_prep(float* __restrict__ proj, float* __restrict__ state,
                                                   const float* __restrict__ conv_w, int K,
                                                   const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                                   float* __restrict__ g, float* __restrict__ beta,
                                                   int nk, int nv, int dk, int dv, int a_off, float q_scale) {
    __shared__ float scratch[32];
    int C = 2 * nk * dk + nv * dv;
    int H = K - 1;
    bool head = blockIdx.x < 2 * nk;
    int c0 = head ? blockIdx.x * dk : 2 * nk * dk + (blockIdx.x - 2 * nk) * PREP_THREADS;
    int cn = head ? dk : min(PREP_THREADS, C - c0);
    float ss = 0.f;
    float outv[4];  // dk <= 4 * PREP_THREADS
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int i = threadIdx.x + j * PREP_THREADS;
        outv[j] = 0.f;
        if (i < cn) {
            int ch = c0 + i;
            const float* wk = conv_w + (size_t)ch * K;
            float* hist = state + (size_t)ch * H;
            float cur = proj[ch];
            float acc = wk[H] * cur;
            for (int q = 0; q < H; q++) acc += wk[q] * hist[q];
            for (int q = 0; q + 1 < H; q++) hist[q] = hist[q + 1];
            if (H > 0) hist[H - 1] = cur;
            float v = silu_f(acc);
            outv[j] = v;
            ss += v * v;
        }
    }
    if (head) {
        ss = block_sum(ss, scratch);
        float inv = rsqrtf(ss + 1e-6f) * (blockIdx.x < nk ? q_scale : 1.f);
#pragma unroll
        for (int j = 0; j < 4; j++) outv[j] *= inv;
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int i = threadIdx.x + j * PREP_THREADS;
        if (i < cn) proj[c0 + i] = outv[j];
    }
    if (blockIdx.x == 0)
        for (int h = threadIdx.x; h < nv; h += PREP_THREADS) {
            beta[h] = sigmoid_f(proj[a_off + nv + h]);
            g[h] = -expf(a_log[h]) * softplus_f(proj[a_off + h] + dt_bias[h]);
        }
}

// Top-k of the router logits (ties to the lower index) and the renormalised
// softmax weights over the chosen experts, by one warp into shared memory.
// Recomputed by every block of the expert kernel instead of a separate launch.
__device__ void router_topk_warp(const float* __restrict__ logits, int E, int k, float* lg /* smem [E] */,
                                 int* sidx, float* sw) {
    int lane = threadIdx.x % WARP;
    for (int e = lane; e < E; e += WARP) lg[e] = logits[e];
    QW_SYNCWARP();
    float best0 = -INFINITY;
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int e = lane; e < E; e += WARP) {
            float v = lg[e];
            if (v > bv || (v == bv && e < bi)) { bv = v; bi = e; }
        }
        for (int m = WARP / 2; m > 0; m >>= 1) {
            float ov = SHFL_XOR(bv, m);
            int oi = SHFL_XOR(bi, m);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if (j == 0) best0 = bv;
        if (lane == 0) {
            sidx[j] = bi;
            sw[j] = bv;
            lg[bi] = -INFINITY;
        }
        QW_SYNCWARP();
    }
    if (lane == 0) {
        float total = 0.f;
        for (int j = 0; j < k; j++) {
            sw[j] = expf(sw[j] - best0);
            total += sw[j];
        }
        for (int j = 0; j < k; j++) sw[j] /= total;
    }
}

#define MOE_MAXE 1024
#define MOE_MAXK 32

// Routed experts, gate/up half: act[j, i] = silu(Wg[e_j][i] . n) * (Wu[e_j][i] . n)
// for the k chosen experts e_j. grid (ceil(I / DEC_WARPS), k): warp w of block b
// owns column i = b * DEC_WARPS + w of expert slot j = blockIdx.y (its gate row
// i and up row I + i). Router logits are the first E entries of `inp`; block
// (0, 0) publishes the choice (idx, wts) for the down kernel.
QW_KERNEL void QW_BOUNDS(256) dec_moe_gate_up(const bf16_t* __restrict__ Wgu, const float* __restrict__ n,
                                             const float* __restrict__ inp, int E, int k,
                                             int* __restrict__ idx_out, float* __restrict__ w_out,
                                             float* __restrict__ act, int I, int H) {
    extern __shared__ float xs[];  // [H]
    __shared__ float lg[MOE_MAXE];
    __shared__ int sidx[MOE_MAXK];
    __shared__ float sw[MOE_MAXK];
    for (int i = threadIdx.x; i < H; i += blockDim.x) xs[i] = n[i];
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    if (w == 0) router_topk_warp(inp, E, k, lg, sidx, sw);
    __syncthreads();
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x < k) {
        idx_out[threadIdx.x] = sidx[threadIdx.x];
        w_out[threadIdx.x] = sw[threadIdx.x];
    }
    int j = blockIdx.y;
    int i = blockIdx.x * DEC_WARPS + w;
    if (i >= I) return;
    const bf16_t* base = Wgu + (size_t)sidx[j] * 2 * I * H;
    float gv = row_dot(base + (size_t)i * H, xs, H, lane);
    float uv = row_dot(base + (size_t)(I + i) * H, xs, H, lane);
    if (lane == 0) act[(size_t)j * I + i] = silu_f(gv) * uv;
}

// Routed experts, down half, plus the gated shared expert and the residual:
// y[r] += sum_j w_j Wd[e_j][r, :] . act[j, :]
//       + sigmoid(inp[E]) * Wsd[r, :] . (silu(inp[E+1 : E+1+S]) * inp[E+1+S : E+1+2S]).
// grid ceil(H / DEC_WARPS); shared memory: act (k * I) then the shared act (S).
QW_KERNEL void QW_BOUNDS(256) dec_moe_down(const bf16_t* __restrict__ Wd, const bf16_t* __restrict__ Wsd,
                                          const float* __restrict__ act, const int* __restrict__ idx,
                                          const float* __restrict__ wts, const float* __restrict__ inp,
                                          int E, int k, int I, int S, float* __restrict__ y, int H) {
    extern __shared__ float xs[];
    float* as = xs + (size_t)k * I;
    for (int i = threadIdx.x; i < k * I; i += blockDim.x) xs[i] = act[i];
    for (int i = threadIdx.x; i < S; i += blockDim.x) as[i] = silu_f(inp[E + 1 + i]) * inp[E + 1 + S + i];
    __syncthreads();
    float sg = sigmoid_f(inp[E]);
    int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    for (int r = blockIdx.x * DEC_WARPS + w; r < H; r += gridDim.x * DEC_WARPS) {
        float total = 0.f;
        for (int j = 0; j < k; j++)
            total += wts[j] * row_dot(Wd + ((size_t)idx[j] * H + r) * I, xs + (size_t)j * I, I, lane);
        if (S > 0) total += sg * row_dot(Wsd + (size_t)r * S, as, S, lane);
        if (lane == 0) y[r] += total;
    }
}

// Greedy pick over many blocks: each block reduces its slice of the logits to
// (max, argmax, sum exp(x - max)); `argmax_final` merges the partials into
// out[0] = token (int bits), out[1] = max, out[2] = log sum exp(x - max), the
// same layout as `logits_stats`.
QW_KERNEL void QW_BOUNDS(256) argmax_partial(const float* __restrict__ x, int n, float* __restrict__ part) {
    __shared__ float sv[32], ss[32];
    __shared__ int si[32];
    float best = -INFINITY;
    int bi = 0x7fffffff;
    int per = (n + gridDim.x - 1) / gridDim.x;
    int lo = blockIdx.x * per, hi = min(n, lo + per);
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float v = x[i];
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
        for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) s += expf(x[i] - best);
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

// The step counter of a graph-replayed decode: pos += 1 after the step.
QW_KERNEL void step_advance(int* __restrict__ pos) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *pos += 1;
}
